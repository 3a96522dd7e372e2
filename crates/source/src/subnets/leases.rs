//! Subnet leases, flannel's way: each node holds one subnet of the cluster
//! network as a store key with a TTL lease, renewed while the agent lives.
//!
//! - key `/podnet/subnets/10.244.1.0-24`, value the lease attributes
//!   (flannel's `PublicIP`, `BackendType`, `BackendData`, plus `Node`);
//! - a restarted node gets its previous subnet back (found by node name, or
//!   from the subnet.env it wrote);
//! - an expired lease disappears with its key, freeing the subnet;
//! - two agents can never hold one subnet: the key is created with a
//!   create-only condition.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use podnet_api::k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus,
};
use podnet_api::netconfig::Resolved;
use podnet_api::{Kind, Object};
use podnet_daemon::StoreWatch;
use podnet_store::{AnyStore, EventType, KeyValue, Objects, Op, Rev, Store, StoreError, WatchMsg};
use serde::{Deserialize, Serialize};

use super::{Change, SubnetMap};
use crate::SourceError;

pub const PREFIX: &str = "/podnet/subnets/";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attrs {
    #[serde(rename = "PublicIP")]
    pub public_ip: Ipv4Addr,
    #[serde(rename = "BackendType")]
    pub backend_type: String,
    #[serde(rename = "BackendData", default)]
    pub backend_data: serde_json::Value,
    #[serde(rename = "Node", default)]
    pub node: String,
    /// The node's IPv6 pod subnet in a dual-stack cluster, when its
    /// source says it (Node podCIDRs); standalone leases leave it out,
    /// and it follows from the IPv4 subnet (`Resolved::ipv6_subnet_of`).
    #[serde(
        rename = "IPv6Subnet",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ipv6_subnet: Option<ipnet::Ipv6Net>,
    /// The node's IPv6 address on the underlay, in a dual-stack cluster
    /// whose underlay has one (flannel's `PublicIPv6`): host-gw routes
    /// IPv6 pod subnets via it.
    #[serde(
        rename = "PublicIPv6",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub public_ipv6: Option<std::net::Ipv6Addr>,
}

impl Attrs {
    pub fn vtep_mac(&self) -> Option<[u8; 6]> {
        let s = self.backend_data.get("VtepMAC")?.as_str()?;
        let v: Vec<u8> = s
            .split(':')
            .filter_map(|p| u8::from_str_radix(p, 16).ok())
            .collect();
        v.try_into().ok()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetLease {
    pub subnet: Ipv4Net,
    pub attrs: Attrs,
    pub mod_rev: Rev,
    pub lease_id: i64,
}

pub fn key(subnet: &Ipv4Net) -> String {
    format!("{PREFIX}{}-{}", subnet.network(), subnet.prefix_len())
}

pub fn parse_key(k: &str) -> Option<Ipv4Net> {
    let (ip, len) = k.strip_prefix(PREFIX)?.split_once('-')?;
    Ipv4Net::new(ip.parse().ok()?, len.parse().ok()?).ok()
}

pub fn decode(kv: &KeyValue) -> Option<SubnetLease> {
    Some(SubnetLease {
        subnet: parse_key(&kv.key)?,
        attrs: serde_json::from_slice(&kv.value).ok()?,
        mod_rev: kv.mod_rev,
        lease_id: kv.lease,
    })
}

/// The candidate subnets in [SubnetMin, SubnetMax].
pub fn candidates(cfg: &Resolved) -> Vec<Ipv4Net> {
    cfg.network
        .subnets(cfg.subnet_len)
        .map(|it| {
            it.filter(|s| {
                s.network() >= cfg.subnet_min.network() && s.network() <= cfg.subnet_max.network()
            })
            .collect()
        })
        .unwrap_or_default()
}

/// Picks a free subnet: the node's own lease first, then the one it had
/// before (from its subnet.env), then the first free one from a start that
/// depends on the node name (so simultaneous agents rarely collide).
pub fn choose(
    cfg: &Resolved,
    taken: &[SubnetLease],
    node: &str,
    previous: Option<Ipv4Net>,
) -> Option<Ipv4Net> {
    if let Some(mine) = taken
        .iter()
        .find(|l| l.attrs.node == node && candidates_contains(cfg, &l.subnet))
    {
        return Some(mine.subnet);
    }
    if let Some(p) = previous {
        if candidates_contains(cfg, &p) && !taken.iter().any(|l| l.subnet == p) {
            return Some(p);
        }
    }
    let all = candidates(cfg);
    if all.is_empty() {
        return None;
    }
    let start = node
        .bytes()
        .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize))
        % all.len();
    (0..all.len())
        .map(|i| all[(start + i) % all.len()])
        .find(|s| !taken.iter().any(|l| l.subnet == *s))
}

fn candidates_contains(cfg: &Resolved, s: &Ipv4Net) -> bool {
    s.prefix_len() == cfg.subnet_len
        && cfg.network.contains(s)
        && s.network() >= cfg.subnet_min.network()
        && s.network() <= cfg.subnet_max.network()
}

/// Acquires (or re-acquires) this node's subnet; returns it with its lease.
pub async fn acquire(
    store: &AnyStore,
    cfg: &Resolved,
    node: &str,
    attrs: &Attrs,
    previous: Option<Ipv4Net>,
    ttl: i64,
) -> Result<SubnetLease, StoreError> {
    for _ in 0..20 {
        let (kvs, _) = store.list(PREFIX).await?;
        let taken: Vec<SubnetLease> = kvs.iter().filter_map(decode).collect();
        let subnet = choose(cfg, &taken, node, previous).ok_or_else(|| {
            StoreError::Backend(format!(
                "no free subnet left in {} (SubnetLen {})",
                cfg.network, cfg.subnet_len
            ))
        })?;
        let lease = store.grant(ttl).await?;
        let value = serde_json::to_vec(attrs).expect("json");
        let k = key(&subnet);
        let op = match taken.iter().find(|l| l.subnet == subnet) {
            // Our own old lease: take it over with a compare-and-swap.
            Some(old) => Op::Update {
                key: k,
                value,
                rev: old.mod_rev,
                lease,
            },
            None => Op::Create {
                key: k,
                value,
                lease,
            },
        };
        match store.txn(vec![op]).await {
            Ok(rev) => {
                return Ok(SubnetLease {
                    subnet,
                    attrs: attrs.clone(),
                    mod_rev: rev,
                    lease_id: lease,
                });
            }
            Err(StoreError::AlreadyExists(_))
            | Err(StoreError::Conflict { .. })
            | Err(StoreError::NotFound(_)) => {
                let _ = store.revoke(lease).await;
                continue;
            }
            Err(e) => {
                let _ = store.revoke(lease).await;
                return Err(e);
            }
        }
    }
    Err(StoreError::Backend(
        "could not acquire a subnet: too much contention".into(),
    ))
}

/// Gives back every subnet `node` holds (for `podnet agent --cleanup`):
/// revokes the leases and deletes their keys; returns the subnets.
pub async fn release(store: &AnyStore, node: &str) -> Result<Vec<Ipv4Net>, StoreError> {
    let (kvs, _) = store.list(PREFIX).await?;
    let mut gone = Vec::new();
    for l in kvs
        .iter()
        .filter_map(decode)
        .filter(|l| l.attrs.node == node)
    {
        if l.lease_id != 0 {
            store.revoke(l.lease_id).await?;
        }
        let _ = store
            .txn(vec![Op::Delete {
                key: key(&l.subnet),
                rev: None,
            }])
            .await;
        gone.push(l.subnet);
    }
    Ok(gone)
}

/// This node's lease and the watch on everyone's.
pub struct Leases {
    store: AnyStore,
    cfg: Resolved,
    node: String,
    ttl: i64,
    health: StoreWatch,
    mine: Option<SubnetLease>,
    watch: Option<podnet_store::Watch>,
    map: SubnetMap,
    _probe: podnet_daemon::Probe,
}

impl Leases {
    /// `health` reports the lease watch (a lost store fails `/readyz`).
    pub fn new(store: AnyStore, cfg: Resolved, node: &str, ttl: i64, health: StoreWatch) -> Self {
        let probe = health.probe({
            let store = store.clone();
            move || {
                let store = store.clone();
                async move { store.revision().await }
            }
        });
        Leases {
            store,
            cfg,
            node: node.to_string(),
            ttl,
            health,
            mine: None,
            watch: None,
            map: SubnetMap::new(),
            _probe: probe,
        }
    }

    pub(crate) async fn acquire(
        &mut self,
        attrs: &Attrs,
        previous: Option<Ipv4Net>,
    ) -> Result<SubnetLease, SourceError> {
        let previous = self.mine.as_ref().map(|m| m.subnet).or(previous);
        let l = acquire(
            &self.store,
            &self.cfg,
            &self.node,
            attrs,
            previous,
            self.ttl,
        )
        .await?;
        self.mine = Some(l.clone());
        self.watch = None;
        Ok(l)
    }

    pub(crate) fn renew_every(&self) -> std::time::Duration {
        std::time::Duration::from_secs((self.ttl / 3).max(1) as u64)
    }

    pub(crate) async fn renew(&mut self) -> Result<(), SourceError> {
        let Some(id) = self.mine.as_ref().map(|m| m.lease_id) else {
            return Ok(());
        };
        match self.store.keepalive(id).await {
            Err(StoreError::LeaseNotFound(_)) => {
                tracing::warn!("lease expired; re-acquiring");
                self.watch = None;
                self.mine = None;
                Ok(())
            }
            r => r.map_err(Into::into),
        }
    }

    fn mine_held(&self) -> bool {
        match &self.mine {
            Some(m) => self
                .map
                .get(&m.subnet)
                .is_some_and(|l| l.attrs.node == self.node),
            None => false,
        }
    }

    /// Lists and watches; returns once the map is known again.
    async fn relist(&mut self) {
        loop {
            let listed = match self.store.list(PREFIX).await {
                Ok(l) => l,
                Err(e) => {
                    self.health.broken(&format!("listing leases: {e}"));
                    self.health.backoff().await;
                    continue;
                }
            };
            let (kvs, rev) = listed;
            match self.store.watch(PREFIX, rev + 1).await {
                Ok(w) => self.watch = Some(w),
                Err(e) => {
                    self.health.broken(&format!("watching leases: {e}"));
                    self.health.backoff().await;
                    continue;
                }
            }
            self.map = kvs
                .iter()
                .filter_map(decode)
                .map(|l| (l.subnet, l))
                .collect();
            self.health.watching();
            return;
        }
    }

    pub(crate) async fn next(&mut self) -> Result<Change, SourceError> {
        loop {
            if self.mine.is_none() {
                return Ok(Change::LostMine);
            }
            let Some(w) = self.watch.as_mut() else {
                self.relist().await;
                if !self.mine_held() {
                    self.mine = None;
                    return Ok(Change::LostMine);
                }
                return Ok(Change::Nodes(self.map.clone()));
            };
            let m = tokio::select! {
                // The store is back after a loss: relist.
                _ = self.health.recovered() => {
                    self.watch = None;
                    continue;
                }
                m = w.next() => m,
            };
            self.health.event();
            let mut relist = false;
            let mut changed = false;
            for m in w.with_queued(m) {
                match m {
                    Some(Ok(WatchMsg::Events(_, evs))) => {
                        for ev in evs {
                            let Some(subnet) = parse_key(&ev.kv.key) else {
                                continue;
                            };
                            changed = true;
                            match ev.typ {
                                EventType::Put => {
                                    if let Some(l) = decode(&ev.kv) {
                                        self.map.insert(subnet, l);
                                    }
                                }
                                EventType::Delete => {
                                    self.map.remove(&subnet);
                                }
                            }
                        }
                    }
                    Some(Ok(WatchMsg::Compacted(_))) => relist = true,
                    Some(Err(e)) => {
                        self.health.broken(&format!("lease watch: {e}"));
                        relist = true;
                    }
                    None => {
                        self.health.broken(&"lease watch ended");
                        relist = true;
                    }
                }
            }
            if relist {
                self.watch = None;
                continue;
            }
            if !self.mine_held() {
                self.mine = None;
                return Ok(Change::LostMine);
            }
            if changed {
                return Ok(Change::Nodes(self.map.clone()));
            }
        }
    }

    /// Registers or refreshes this node's Node object, with the subnet as
    /// its podCIDR, as a kubelet and the controller manager would.
    pub(crate) async fn network_up(&self, ip: Ipv4Addr) -> Result<(), SourceError> {
        let Some(subnet) = self.mine.as_ref().map(|m| m.subnet) else {
            return Ok(());
        };
        let objs = Objects::new(self.store.clone());
        let name = self.node.as_str();
        for _ in 0..5 {
            let existing = objs.get(Kind::Node, None, name).await?;
            let mut node = match &existing {
                Some(Object::Node(n)) => (**n).clone(),
                _ => Node::default(),
            };
            node.metadata.name = Some(name.to_string());
            node.spec = Some(NodeSpec {
                pod_cidr: Some(subnet.to_string()),
                pod_cidrs: Some(vec![subnet.to_string()]),
                ..node.spec.clone().unwrap_or_default()
            });
            node.status = Some(NodeStatus {
                addresses: Some(vec![
                    NodeAddress {
                        type_: "InternalIP".into(),
                        address: ip.to_string(),
                    },
                    NodeAddress {
                        type_: "Hostname".into(),
                        address: name.to_string(),
                    },
                ]),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    reason: Some("PodnetAgentReady".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            });
            let obj = Object::Node(Box::new(node));
            let r = match existing {
                Some(_) => objs.update(obj, vec![]).await,
                None => objs.create(obj, vec![]).await,
            };
            match r {
                Ok(_) => return Ok(()),
                Err(StoreError::Conflict { .. }) | Err(StoreError::AlreadyExists(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(SourceError::Other(format!(
            "registering node {name}: too much contention"
        )))
    }

    /// Revokes every lease this node holds and deletes their keys.
    pub(crate) async fn release(&mut self) -> Result<(), SourceError> {
        release(&self.store, &self.node).await?;
        self.mine = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podnet_api::netconfig::NetworkConfig;

    fn cfg() -> Resolved {
        let c: NetworkConfig = serde_json::from_value(
            serde_json::json!({"spec": {"Network": "10.244.0.0/22", "SubnetLen": 24}}),
        )
        .unwrap();
        c.resolve().unwrap()
    }

    fn lease(s: &str, node: &str) -> SubnetLease {
        SubnetLease {
            subnet: s.parse().unwrap(),
            attrs: Attrs {
                public_ip: "1.2.3.4".parse().unwrap(),
                backend_type: "vxlan".into(),
                backend_data: serde_json::json!({"VtepMAC": "02:00:00:00:00:01"}),
                node: node.into(),
                ipv6_subnet: None,
                public_ipv6: None,
            },
            mod_rev: 1,
            lease_id: 1,
        }
    }

    #[test]
    fn keys_round_trip() {
        let s: Ipv4Net = "10.244.3.0/24".parse().unwrap();
        assert_eq!(key(&s), "/podnet/subnets/10.244.3.0-24");
        assert_eq!(parse_key(&key(&s)), Some(s));
        assert_eq!(
            lease("10.244.1.0/24", "a").attrs.vtep_mac(),
            Some([2, 0, 0, 0, 0, 1])
        );
    }

    #[test]
    fn choice_prefers_own_then_previous_then_free() {
        let c = cfg();
        // /22 with /24s: flannel skips the first, so .1, .2, .3 are candidates
        assert_eq!(candidates(&c).len(), 3);
        let taken = vec![lease("10.244.2.0/24", "a")];
        assert_eq!(
            choose(&c, &taken, "a", None),
            Some("10.244.2.0/24".parse().unwrap())
        );
        assert_eq!(
            choose(&c, &taken, "b", Some("10.244.3.0/24".parse().unwrap())),
            Some("10.244.3.0/24".parse().unwrap())
        );
        let got = choose(&c, &taken, "b", Some("10.244.2.0/24".parse().unwrap())).unwrap();
        assert_ne!(got.to_string(), "10.244.2.0/24");
        let full = vec![
            lease("10.244.1.0/24", "x"),
            lease("10.244.2.0/24", "y"),
            lease("10.244.3.0/24", "z"),
        ];
        assert_eq!(choose(&c, &full, "b", None), None);
    }
}
