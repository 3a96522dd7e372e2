//! LB IPAM: which address each LoadBalancer Service gets from the
//! IPAddressPools, decided without I/O (the standalone controller stores
//! the result and reserves each address in the store; tests call it
//! directly).
//!
//! The rules, in the order they apply:
//! - only `type: LoadBalancer` Services whose `spec.loadBalancerClass` is
//!   absent or `podnet.io/lb` are served; another class is left alone
//!   ([`Decision::OtherClass`]), and a Service of another type holds no
//!   address ([`Decision::NotLoadBalancer`]);
//! - `spec.ipFamilyPolicy` and `spec.ipFamilies` (else the ClusterIPs'
//!   families, else IPv4) say which families ([`request`]);
//! - addresses asked for (annotation `podnet.io/loadBalancerIPs`, else
//!   `spec.loadBalancerIP`) are given if a pool that serves the Service
//!   holds them and they are free, else the Service gets nothing and the
//!   reason ([`Decision::Pending`]);
//! - otherwise the Service keeps the addresses it has while they stay
//!   valid (in a pool that serves it, not held by another), so decisions
//!   are stable; an address no pool holds any more is taken back;
//! - a missing family gets the lowest free address of the pool named by
//!   the annotation `podnet.io/address-pool`, or else of the first pool by
//!   name with `autoAssign` that serves the Service (its serviceSelector
//!   and namespaceSelector match) and has one free;
//! - an address is never given to two Services, except to Services with
//!   the same `podnet.io/allow-shared-ip` key whose ports do not overlap
//!   (MetalLB's rule, [`request::Sharing`]); such a Service first joins an
//!   address already shared under its key.
//!
//! [`Allocator`] decides one Service at a time against the [`Holdings`]
//! it keeps current; [`assign_all`] decides a whole cluster (a restart).

pub mod holdings;
pub mod inputs;
pub mod pools;
pub mod request;
pub mod status;

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use podnet_api::k8s_openapi::api::core::v1::Service;

pub use holdings::{Holder, Holdings};
pub use inputs::{Inputs, NAMESPACE_NAME_LABEL};
pub use pools::{Pool, Pools};
pub use request::{
    Request, Scope, Sharing, IPS_ANNOTATION, LB_CLASS, POOL_ANNOTATION, SHARING_ANNOTATION,
};

/// A Service: (namespace, name).
pub type ServiceKey = (String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    pub fn other(self) -> Family {
        match self {
            Family::V4 => Family::V6,
            Family::V6 => Family::V4,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// What a Service should have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Not `type: LoadBalancer`: no load-balancer address.
    NotLoadBalancer,
    /// Another implementation's class: its status is not ours to touch.
    OtherClass(String),
    /// These addresses, in the Service's family order.
    Assigned(Vec<IpAddr>),
    /// No address, and why (for the controller's log).
    Pending(String),
}

pub fn key_of(svc: &Service) -> ServiceKey {
    (
        svc.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        svc.metadata.name.clone().unwrap_or_default(),
    )
}

/// The load-balancer addresses a Service's status shows.
pub fn status_ips(svc: &Service) -> Vec<IpAddr> {
    podnet_api::service::lb_ingress_ips(svc)
}

/// Decides Services one at a time against what is already held.
pub struct Allocator<'a> {
    pools: &'a Pools,
    pub holdings: Holdings,
}

impl<'a> Allocator<'a> {
    pub fn new(pools: &'a Pools, holdings: Holdings) -> Self {
        Allocator { pools, holdings }
    }

    /// Whether some pool holds `ip` (else it is no address of ours).
    pub fn pooled(&self, ip: IpAddr) -> bool {
        self.pools.iter().any(|p| p.holds(ip))
    }

    /// Records what `svc`'s status shows as held (for seeding from a
    /// cluster's current state), if the Service is ours.
    pub fn seed(&mut self, svc: &Service) {
        if scope_of(svc) != Scope::Ours {
            return;
        }
        let h = Holder {
            service: key_of(svc),
            sharing: Sharing::of(svc),
        };
        for ip in status_ips(svc) {
            self.holdings.hold(ip, h.clone());
        }
    }

    /// Decides `svc`'s addresses (in a namespace with `ns_labels`) and
    /// records them as held, releasing what it no longer holds.
    pub fn assign(&mut self, svc: &Service, ns_labels: &BTreeMap<String, String>) -> Decision {
        let key = key_of(svc);
        let d = self.decide(svc, &key, ns_labels);
        self.holdings.release(&key);
        if let Decision::Assigned(ips) = &d {
            let h = Holder {
                service: key,
                sharing: Sharing::of(svc),
            };
            for ip in ips {
                self.holdings.hold(*ip, h.clone());
            }
        }
        d
    }

    fn decide(
        &self,
        svc: &Service,
        key: &ServiceKey,
        ns_labels: &BTreeMap<String, String>,
    ) -> Decision {
        match scope_of(svc) {
            Scope::NotLoadBalancer => return Decision::NotLoadBalancer,
            Scope::OtherClass(c) => return Decision::OtherClass(c),
            Scope::Ours => {}
        }
        let req = match request::read(svc) {
            Ok(r) => r,
            Err(why) => return Decision::Pending(why),
        };
        let empty = BTreeMap::new();
        let labels = svc.metadata.labels.as_ref().unwrap_or(&empty);
        let serving = match self.serving(&req, labels, ns_labels) {
            Ok(s) => s,
            Err(why) => return Decision::Pending(why),
        };
        let r = if req.requested.is_empty() {
            self.automatic(key, &req, &serving, &status_ips(svc))
        } else {
            self.requested(key, &req, &serving)
        };
        match r {
            Ok(ips) => Decision::Assigned(ips),
            Err(why) => Decision::Pending(why),
        }
    }

    /// The pools that serve the Service: the one its annotation names (it
    /// must exist and select the Service), or every pool that selects it.
    fn serving(
        &self,
        req: &Request,
        labels: &BTreeMap<String, String>,
        ns_labels: &BTreeMap<String, String>,
    ) -> Result<Vec<&'a Pool>, String> {
        let pools: &'a Pools = self.pools;
        match &req.pool {
            Some(name) => match pools.get(name) {
                None => Err(format!(
                    "annotation {POOL_ANNOTATION}: there is no IPAddressPool {name:?}"
                )),
                Some(p) if !p.serves(labels, ns_labels) => Err(format!(
                    "annotation {POOL_ANNOTATION}: pool {name} does not serve this Service \
                     (its serviceSelector or namespaceSelector)"
                )),
                Some(p) => Ok(vec![p]),
            },
            None => Ok(pools
                .iter()
                .filter(|p| p.serves(labels, ns_labels))
                .collect()),
        }
    }

    /// Exactly the addresses asked for, or why not.
    fn requested(
        &self,
        key: &ServiceKey,
        req: &Request,
        serving: &[&Pool],
    ) -> Result<Vec<IpAddr>, String> {
        for ip in &req.requested {
            if !serving.iter().any(|p| p.holds(*ip)) {
                return Err(match self.pools.iter().find(|p| p.holds(*ip)) {
                    Some(p) => format!(
                        "{ip} is in pool {}, which does not serve this Service",
                        p.name
                    ),
                    None => format!("{ip} is in no IPAddressPool"),
                });
            }
            self.holdings
                .usable_by(*ip, key, req.sharing.as_ref())
                .map_err(|who| format!("{ip} is already in use by {who}"))?;
        }
        Ok(req.requested.clone())
    }

    /// Per family: the current address if still valid, else one shared
    /// under the Service's key, else the lowest free one of the first pool
    /// that has one.
    fn automatic(
        &self,
        key: &ServiceKey,
        req: &Request,
        serving: &[&Pool],
        current: &[IpAddr],
    ) -> Result<Vec<IpAddr>, String> {
        let sharing = req.sharing.as_ref();
        let valid = |ip: IpAddr| {
            serving.iter().any(|p| p.holds(ip)) && self.holdings.usable_by(ip, key, sharing).is_ok()
        };
        let auto: Vec<&Pool> = match req.pool {
            Some(_) => serving.to_vec(),
            None => serving.iter().copied().filter(|p| p.auto_assign).collect(),
        };
        let mut out = Vec::new();
        let mut missing = None;
        for &f in &req.families {
            let kept = current
                .iter()
                .copied()
                .find(|ip| Family::of(*ip) == f && valid(*ip));
            let joined = || {
                let k = &sharing?.key;
                let mut shared = self.holdings.shared_under(k);
                shared.find(|ip| Family::of(*ip) == f && valid(*ip))
            };
            let fresh = || {
                auto.iter()
                    .find_map(|p| p.first(f, |ip| self.holdings.free_for(ip, key)))
            };
            match kept.or_else(joined).or_else(fresh) {
                Some(ip) => out.push(ip),
                None => {
                    missing.get_or_insert_with(|| self.why_none(f, serving, &auto));
                }
            }
        }
        match missing {
            Some(why) if out.is_empty() || req.need_all => Err(why),
            _ => Ok(out),
        }
    }

    /// Why no address of family `f` could be found.
    fn why_none(&self, f: Family, serving: &[&Pool], auto: &[&Pool]) -> String {
        let names = |ps: &[&Pool]| {
            ps.iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        if self.pools.is_empty() {
            "there are no IPAddressPools".into()
        } else if serving.is_empty() {
            "no IPAddressPool serves this Service (by its serviceSelector and namespaceSelector)"
                .into()
        } else if auto.is_empty() {
            format!(
                "the pools that serve this Service ({}) have autoAssign off: name one with \
                 the annotation {POOL_ANNOTATION}, or ask for an address",
                names(serving)
            )
        } else if !auto.iter().any(|p| p.has_family(f)) {
            format!(
                "no pool that serves this Service ({}) has {f} addresses",
                names(auto)
            )
        } else {
            format!("no free {f} address in pools {}", names(auto))
        }
    }
}

fn scope_of(svc: &Service) -> Scope {
    request::scope(svc)
}

/// Decides every Service of a cluster from scratch, as after a restart:
/// what their statuses show is held first, then the Services that hold
/// something are decided (each keeps what is still valid), then the rest,
/// each group by namespace and name. `ns_labels` gives each namespace's
/// labels (a namespace missing there has none).
pub fn assign_all<'s>(
    pools: &Pools,
    services: impl IntoIterator<Item = &'s Service>,
    ns_labels: &BTreeMap<String, BTreeMap<String, String>>,
) -> BTreeMap<ServiceKey, Decision> {
    let mut svcs: Vec<&Service> = services.into_iter().collect();
    svcs.sort_by_key(|s| (status_ips(s).is_empty(), key_of(s)));
    let mut a = Allocator::new(pools, Holdings::default());
    for s in &svcs {
        a.seed(s);
    }
    let empty = BTreeMap::new();
    svcs.iter()
        .map(|s| {
            let k = key_of(s);
            let d = a.assign(s, ns_labels.get(&k.0).unwrap_or(&empty));
            (k, d)
        })
        .collect()
}

#[cfg(test)]
mod tests;
