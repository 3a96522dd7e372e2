//! Kubernetes mode's view for LB IPAM, pure: every Service, the pools and
//! namespaces' labels ([`Inputs`]), and which Services a batch of deltas
//! may move: a Service's own change; every Service LB IPAM concerns when
//! a pool changes; a namespace's when its labels do.

use std::collections::{BTreeMap, BTreeSet};

use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::{Kind, Object};
use podnet_source::Delta;

use crate::ipam::status::concerns;
use crate::ipam::{Allocator, Holdings, Inputs, ServiceKey};

#[derive(Default)]
pub struct View {
    pub services: BTreeMap<ServiceKey, Service>,
    pub inputs: Inputs,
    /// Services without an address, with the reason last logged; decided
    /// again on every pass until they have one.
    pub pending: BTreeMap<ServiceKey, String>,
}

impl View {
    /// Files a batch; adds to `dirty` the Services it may move.
    pub fn take(&mut self, deltas: &[Delta], dirty: &mut BTreeSet<ServiceKey>) {
        for d in deltas {
            let key = d.key();
            let o = match d {
                Delta::Added(o) | Delta::Updated(o) => Some(&**o),
                Delta::Deleted(_) => None,
            };
            match key.kind {
                Kind::Service => {
                    let k = (key.namespace.clone().unwrap_or_default(), key.name.clone());
                    match o {
                        Some(Object::Service(s)) => self.services.insert(k.clone(), (**s).clone()),
                        _ => self.services.remove(&k),
                    };
                    dirty.insert(k);
                }
                Kind::IPAddressPool if self.inputs.pool(&key.name, o) => {
                    dirty.extend(self.concerned(None));
                }
                Kind::Namespace if self.inputs.namespace(&key.name, o) => {
                    dirty.extend(self.concerned(Some(&key.name)));
                }
                _ => {}
            }
        }
    }

    /// The Services LB IPAM concerns (in namespace `ns`, or all).
    pub fn concerned(&self, ns: Option<&str>) -> Vec<ServiceKey> {
        self.services
            .iter()
            .filter(|(k, s)| ns.is_none_or(|ns| k.0 == ns) && concerns(s))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// An allocator that knows what every Service's status holds.
    pub fn allocator(&self) -> Allocator<'_> {
        let mut a = Allocator::new(self.inputs.pools(), Holdings::default());
        for s in self.services.values() {
            a.seed(s);
        }
        a
    }

    /// The order to decide `keys` in: Services that hold addresses first
    /// (each keeps what is still valid before a newcomer is placed).
    pub fn order(&self, keys: impl IntoIterator<Item = ServiceKey>) -> Vec<ServiceKey> {
        let mut keys: Vec<ServiceKey> = keys.into_iter().collect();
        keys.sort_by_key(|k| {
            let holds = self
                .services
                .get(k)
                .is_some_and(|s| !crate::ipam::status_ips(s).is_empty());
            (!holds, k.clone())
        });
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podnet_source::ObjectKey;
    use serde_json::json;
    use std::sync::Arc;

    fn obj(kind: &str, v: serde_json::Value) -> Delta {
        let o = match kind {
            "Service" => Object::Service(Box::new(serde_json::from_value(v).unwrap())),
            "Namespace" => Object::Namespace(Box::new(serde_json::from_value(v).unwrap())),
            _ => Object::IPAddressPool(Box::new(serde_json::from_value(v).unwrap())),
        };
        Delta::Added(Arc::new(o))
    }

    fn lb(ns: &str, name: &str) -> Delta {
        obj(
            "Service",
            json!({"metadata": {"name": name, "namespace": ns}, "spec": {"type": "LoadBalancer"}}),
        )
    }

    /// A Service's change moves it; a pool's every LoadBalancer (not a
    /// ClusterIP Service); a namespace's labels only its own; the same
    /// pool or labels again move nothing.
    #[test]
    fn a_change_moves_what_it_may_move() {
        let mut v = View::default();
        let mut dirty = BTreeSet::new();
        let plain = obj(
            "Service",
            json!({"metadata": {"name": "c", "namespace": "a"}, "spec": {"type": "ClusterIP"}}),
        );
        v.take(&[lb("a", "x"), lb("b", "y"), plain], &mut dirty);
        assert_eq!(dirty.len(), 3);
        dirty.clear();
        let pool = obj(
            "IPAddressPool",
            json!({"metadata": {"name": "lan"}, "spec": {"addresses": ["192.0.2.0/28"]}}),
        );
        v.take(std::slice::from_ref(&pool), &mut dirty);
        let want: BTreeSet<ServiceKey> =
            [("a".into(), "x".into()), ("b".into(), "y".into())].into();
        assert_eq!(dirty, want);
        dirty.clear();
        v.take(&[pool], &mut dirty);
        assert!(dirty.is_empty(), "the same pool again");
        let ns = obj(
            "Namespace",
            json!({"metadata": {"name": "b", "labels": {"team": "t"}}}),
        );
        v.take(std::slice::from_ref(&ns), &mut dirty);
        assert_eq!(dirty, [("b".into(), "y".into())].into());
        dirty.clear();
        v.take(&[ns], &mut dirty);
        assert!(dirty.is_empty());
        let gone = Delta::Deleted(ObjectKey {
            kind: Kind::Service,
            namespace: Some("a".into()),
            name: "x".into(),
        });
        v.take(&[gone], &mut dirty);
        assert_eq!(dirty, [("a".into(), "x".into())].into());
        assert!(!v.services.contains_key(&("a".into(), "x".into())));
        assert_eq!(v.order(dirty).len(), 1);
    }
}
