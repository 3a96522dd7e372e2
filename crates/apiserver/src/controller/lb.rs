//! The controller's LoadBalancer duty (LB IPAM, issue 26): every
//! LoadBalancer Service podnet serves gets `status.loadBalancer.ingress`
//! from the IPAddressPools, as `podnet_lb::ipam` decides; a Service that
//! stops being one, or whose address leaves every pool, has it cleared.
//!
//! Each address is reserved ([`crate::lbips`]) in the transaction that
//! writes the status, and released in the one that clears it, so no
//! address is ever given twice, by one controller or two, before or after
//! a restart: a collision fails the transaction and the Service is
//! decided again knowing who holds the address. What is known of other
//! reservations comes from the full sync's listing (which also releases
//! reservations no Service's status shows), from collisions, and from
//! our own writes. A Service that gets nothing has its reason logged
//! once, when it changes; it is decided again on every sync until it has
//! an address, so a released address or a new pool reaches it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::{Kind, Object};
use podnet_lb::ipam::status::{concerns, with_ingress};
use podnet_lb::ipam::{self, Allocator, Decision, Holder, Holdings, Inputs, Sharing};
use podnet_source::ObjectKey;
use podnet_store::{Op, Store, StoreError};

use super::{Controller, Key, CONTROLLER_ALLOCATIONS_TOTAL};
use crate::lbips::{self, Reservation};

/// What the controller knows for LB IPAM besides Services.
#[derive(Default)]
pub struct LbState {
    /// The pools and namespaces' labels.
    pub inputs: Inputs,
    /// Reservations known, by address.
    pub reserved: BTreeMap<IpAddr, Reservation>,
    /// Services without an address, with the reason last logged.
    pub pending: BTreeMap<Key, String>,
}

/// Why a write must be decided again.
enum Again {
    /// The address is held by someone the decision did not know of.
    Taken(IpAddr, Reservation),
    /// The Service or a reservation changed since it was read.
    Stale,
    /// The Service is gone.
    Gone,
    Store(StoreError),
}

impl From<StoreError> for Again {
    fn from(e: StoreError) -> Self {
        Again::Store(e)
    }
}

fn key_str(k: &Key) -> String {
    format!("{}/{}", k.0, k.1)
}

fn parse_owner(h: &str) -> Key {
    match h.split_once('/') {
        Some((ns, n)) => (ns.to_string(), n.to_string()),
        None => (String::new(), h.to_string()),
    }
}

impl Controller {
    /// The Services the LB duty looks at this sync: those of `keys` it
    /// concerns, and every one still waiting for an address.
    pub(super) fn lb_candidates(&self, keys: &BTreeSet<Key>) -> Vec<Key> {
        let mut out: BTreeSet<Key> = keys
            .iter()
            .filter(|k| self.state.services.get(*k).is_some_and(concerns))
            .cloned()
            .collect();
        out.extend(self.lb.pending.keys().cloned());
        out.into_iter().collect()
    }

    /// Takes a pool's or a namespace's change, and marks the Services it
    /// may move: all the duty concerns for a pool, those of the namespace
    /// for its labels.
    pub(super) fn lb_watch(
        &mut self,
        key: &ObjectKey,
        o: Option<&Object>,
        dirty: &mut BTreeSet<Key>,
    ) {
        let name = key.name.as_str();
        let (changed, ns) = match key.kind {
            Kind::IPAddressPool => (self.lb.inputs.pool(name, o), None),
            _ => (self.lb.inputs.namespace(name, o), Some(name)),
        };
        if !changed {
            return;
        }
        let moved = self
            .state
            .services
            .iter()
            .filter(|(k, s)| ns.is_none_or(|ns| k.0 == ns) && concerns(s));
        dirty.extend(moved.map(|(k, _)| k.clone()));
    }

    /// What every Service's status holds, and the reservations of
    /// addresses no status shows (another controller's write not seen
    /// yet): those never share. A status is trusted over a reservation
    /// known from earlier (which may be stale): the transaction that keeps
    /// an address checks the store itself, and a collision there says who
    /// really holds it.
    fn lb_holdings(&self) -> Holdings {
        let mut a = Allocator::new(self.lb.inputs.pools(), Holdings::default());
        for s in self.state.services.values() {
            a.seed(s);
        }
        let mut h = a.holdings;
        let shown: BTreeSet<IpAddr> = self
            .state
            .services
            .values()
            .flat_map(ipam::status_ips)
            .collect();
        for (ip, r) in self
            .lb
            .reserved
            .iter()
            .filter(|(ip, _)| !shown.contains(ip))
        {
            for owner in &r.holders {
                let holder = Holder {
                    service: parse_owner(owner),
                    sharing: None,
                };
                h.hold(*ip, holder);
            }
        }
        h
    }

    /// Decides and writes the load-balancer addresses of `keys`, Services
    /// that hold addresses first (each keeps what is still valid before a
    /// newcomer is placed). Returns the writes made.
    pub(super) async fn lb_sync(&mut self, keys: Vec<Key>) -> Result<usize, StoreError> {
        if keys.is_empty() {
            return Ok(0);
        }
        let pools = self.lb.inputs.pools().clone();
        let mut a = Allocator::new(&pools, self.lb_holdings());
        let mut keys = keys;
        keys.sort_by_key(|k| {
            let holds = self
                .state
                .services
                .get(k)
                .is_some_and(|s| !ipam::status_ips(s).is_empty());
            (!holds, k.clone())
        });
        let mut writes = 0;
        for k in keys {
            writes += self.lb_settle(&mut a, &k).await?;
        }
        Ok(writes)
    }

    /// Brings one Service's status to its decision, deciding again after
    /// each collision.
    async fn lb_settle(&mut self, a: &mut Allocator<'_>, k: &Key) -> Result<usize, StoreError> {
        for _ in 0..50 {
            let Some(svc) = self.state.services.get(k).cloned() else {
                a.holdings.release(k);
                self.lb.pending.remove(k);
                return Ok(0);
            };
            if self.foreign(a, &svc) {
                // Another implementation's (or an operator's) address.
                return Ok(0);
            }
            let d = a.assign(&svc, &self.lb.inputs.labels_of(&k.0));
            self.lb_note(k, &d);
            let r = match &d {
                Decision::OtherClass(_) => self.lb_release(&svc, &[]).await,
                Decision::Assigned(ips) => self.lb_write(&svc, ips).await,
                Decision::NotLoadBalancer | Decision::Pending(_) => self.lb_write(&svc, &[]).await,
            };
            match r {
                Ok(n) => return Ok(n),
                Err(Again::Taken(ip, res)) => {
                    for owner in &res.holders {
                        let holder = Holder {
                            service: parse_owner(owner),
                            sharing: None,
                        };
                        a.holdings.hold(ip, holder);
                    }
                    self.lb.reserved.insert(ip, res);
                }
                Err(Again::Stale) => {
                    a.holdings.release(k);
                    match self.objs.get(Kind::Service, Some(&k.0), &k.1).await? {
                        Some(Object::Service(s)) => {
                            a.seed(&s);
                            self.state.services.insert(k.clone(), *s);
                        }
                        _ => {
                            self.state.services.remove(k);
                        }
                    }
                }
                Err(Again::Gone) => {
                    self.state.services.remove(k);
                }
                Err(Again::Store(e)) => return Err(e),
            }
        }
        Err(StoreError::Backend(format!(
            "load-balancer address of {} kept colliding",
            key_str(k)
        )))
    }

    /// Whether `svc`'s status holds only addresses this controller never
    /// gave: none in a pool, none reserved. Those are left alone (a load
    /// balancer outside podnet, or an operator, wrote them), so LB IPAM
    /// only ever takes back what it handed out.
    fn foreign(&self, a: &Allocator<'_>, svc: &Service) -> bool {
        let ips = ipam::status_ips(svc);
        !ips.is_empty()
            && ips
                .iter()
                .all(|ip| !a.pooled(*ip) && !self.lb.reserved.contains_key(ip))
    }

    /// Logs a Service's reason for having no address when it changes.
    fn lb_note(&mut self, k: &Key, d: &Decision) {
        match d {
            Decision::Pending(why) => {
                if self.lb.pending.get(k) != Some(why) {
                    tracing::warn!(service = %key_str(k), "no load-balancer address: {why}");
                    self.lb.pending.insert(k.clone(), why.clone());
                }
            }
            _ => {
                self.lb.pending.remove(k);
            }
        }
    }

    /// Writes `svc`'s ingress as `desired` with the reservations that
    /// takes and releases, in one transaction conditional on the Service's
    /// revision. Nothing is written when both are already so.
    async fn lb_write(&mut self, svc: &Service, desired: &[IpAddr]) -> Result<usize, Again> {
        let owner = lbips::owner(svc);
        let current = ipam::status_ips(svc);
        let mut ops = self.lb_take(svc, &owner, desired).await?;
        let gone: Vec<IpAddr> = current
            .iter()
            .copied()
            .filter(|ip| !desired.contains(ip))
            .collect();
        ops.extend(self.lb_release_ops(svc, &owner, &gone).await?);
        if ops.is_empty() && current == desired {
            return Ok(0);
        }
        let new = with_ingress(svc, desired);
        match self
            .objs
            .update(Object::Service(Box::new(new)), ops.clone())
            .await
        {
            Ok(Object::Service(s)) => {
                self.lb_learn(&ops);
                let k = ipam::key_of(&s);
                tracing::info!(service = %key_str(&k), "load-balancer addresses {desired:?}");
                self.metrics.count(&CONTROLLER_ALLOCATIONS_TOTAL, "", 1.0);
                self.state.services.insert(k, *s);
                Ok(1)
            }
            Ok(_) => Ok(1),
            Err(e) => Err(self.lb_why(svc, e).await),
        }
    }

    /// What a failed write means.
    async fn lb_why(&mut self, svc: &Service, e: StoreError) -> Again {
        let own = Object::Service(Box::new(svc.clone())).key();
        match e {
            StoreError::AlreadyExists(key) => match lbips::ip_of(&key) {
                Some(ip) => match self.objs.store.get(&key).await {
                    Ok(Some(kv)) => Again::Taken(ip, Reservation::decode(&kv.value)),
                    Ok(None) => Again::Stale,
                    Err(e) => Again::Store(e),
                },
                None => Again::Store(StoreError::AlreadyExists(key)),
            },
            StoreError::NotFound(key) if key == own => Again::Gone,
            StoreError::Conflict { .. } | StoreError::NotFound(_) => Again::Stale,
            e => Again::Store(e),
        }
    }

    /// Records the reservations a successful write made and released.
    fn lb_learn(&mut self, ops: &[Op]) {
        for op in ops {
            let Some(ip) = lbips::ip_of(op.key()) else {
                continue;
            };
            match op {
                Op::Create { value, .. } | Op::Update { value, .. } | Op::Put { value, .. } => {
                    self.lb.reserved.insert(ip, Reservation::decode(value));
                }
                Op::Delete { .. } => {
                    self.lb.reserved.remove(&ip);
                }
            }
        }
    }

    /// The ops that reserve `desired` for `svc`: a new key, or joining a
    /// shared one (all its holders sharing compatibly, by what the cache
    /// knows of them); an address already reserved for it needs none.
    async fn lb_take(
        &mut self,
        svc: &Service,
        owner: &str,
        desired: &[IpAddr],
    ) -> Result<Vec<Op>, Again> {
        let sharing = Sharing::of(svc);
        let mut ops = Vec::new();
        for ip in desired {
            if self
                .lb
                .reserved
                .get(ip)
                .is_some_and(|r| r.holders.contains(owner))
            {
                continue;
            }
            let key = lbips::key(*ip);
            let Some(kv) = self.objs.store.get(&key).await? else {
                let r =
                    Reservation::new(owner.to_string(), sharing.as_ref().map(|s| s.key.clone()));
                ops.push(Op::Create {
                    key,
                    value: r.encode(),
                    lease: 0,
                });
                continue;
            };
            let mut r = Reservation::decode(&kv.value);
            self.lb.reserved.insert(*ip, r.clone());
            if r.holders.contains(owner) {
                continue;
            }
            let joins = sharing.as_ref().is_some_and(|me| {
                r.sharing.as_deref() == Some(me.key.as_str())
                    && r.holders.iter().all(|h| self.shares_with(h, me))
            });
            if !joins {
                return Err(Again::Taken(*ip, r));
            }
            r.holders.insert(owner.to_string());
            ops.push(Op::Update {
                key,
                value: r.encode(),
                rev: kv.mod_rev,
                lease: 0,
            });
        }
        Ok(ops)
    }

    /// Whether the cached Service `holder` shares compatibly with `me`.
    fn shares_with(&self, holder: &str, me: &Sharing) -> bool {
        self.state
            .services
            .get(&parse_owner(holder))
            .and_then(Sharing::of)
            .is_some_and(|s| s.compatible(me))
    }

    /// The ops that give up `ips` for `svc`: its name leaves each
    /// reservation, which is deleted once no Service's status (by the
    /// cache) still shows the address.
    async fn lb_release_ops(
        &mut self,
        svc: &Service,
        owner: &str,
        ips: &[IpAddr],
    ) -> Result<Vec<Op>, Again> {
        let me = ipam::key_of(svc);
        let mut ops = Vec::new();
        for ip in ips {
            let key = lbips::key(*ip);
            let Some(kv) = self.objs.store.get(&key).await? else {
                self.lb.reserved.remove(ip);
                continue;
            };
            let mut r = Reservation::decode(&kv.value);
            self.lb.reserved.insert(*ip, r.clone());
            if !r.holders.remove(owner) {
                continue;
            }
            r.holders.retain(|h| {
                let k = parse_owner(h);
                k != me
                    && self
                        .state
                        .services
                        .get(&k)
                        .is_some_and(|s| ipam::status_ips(s).contains(ip))
            });
            let rev = kv.mod_rev;
            ops.push(match r.holders.is_empty() {
                true => Op::Delete {
                    key,
                    rev: Some(rev),
                },
                false => Op::Update {
                    key,
                    value: r.encode(),
                    rev,
                    lease: 0,
                },
            });
        }
        Ok(ops)
    }

    /// Releases, without touching `svc`'s status, what it holds by
    /// reservation (known ones, and `extra`): for another implementation's
    /// Service, and for a deleted one.
    async fn lb_release(&mut self, svc: &Service, extra: &[IpAddr]) -> Result<usize, Again> {
        let owner = lbips::owner(svc);
        let mut ips: Vec<IpAddr> = self
            .lb
            .reserved
            .iter()
            .filter(|(_, r)| r.holders.contains(&owner))
            .map(|(ip, _)| *ip)
            .collect();
        for ip in extra {
            if !ips.contains(ip) {
                ips.push(*ip);
            }
        }
        let ops = self.lb_release_ops(svc, &owner, &ips).await?;
        if ops.is_empty() {
            return Ok(0);
        }
        // Each op is conditional on the reservation's revision: a changed
        // one is left to the next sync.
        match self.objs.store.txn(ops.clone()).await {
            Ok(_) => {
                self.lb_learn(&ops);
                Ok(ops.len())
            }
            Err(StoreError::Conflict { .. } | StoreError::NotFound(_)) => Ok(0),
            Err(e) => Err(Again::Store(e)),
        }
    }

    /// Releases the addresses a deleted Service held.
    pub(super) async fn lb_release_gone(&mut self, s: &Service) {
        let ips = ipam::status_ips(s);
        if let Err(Again::Store(e)) = self.lb_release(s, &ips).await {
            tracing::warn!(service = %lbips::owner(s), "releasing load-balancer addresses: {e}");
        }
        self.lb.pending.remove(&ipam::key_of(s));
    }
}
