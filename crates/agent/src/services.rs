//! Services and their EndpointSlices (and the Nodes' addresses) as the
//! agent's announcers read them
//! (BGP's Service addresses, L2 announcement): a cache fed by deltas that
//! says which Services each batch touched, so the announcers recompute
//! only those. A slice is filed under its Service by the
//! `kubernetes.io/service-name` label, and a slice that moves to another
//! Service touches both.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::{Kind, Object};
use podnet_source::Delta;

/// A Service by (namespace, name).
pub type SvcKey = (String, String);

#[derive(Default)]
pub struct ServiceCache {
    services: BTreeMap<SvcKey, Arc<Object>>,
    /// Per Service, its slices by name.
    slices: BTreeMap<SvcKey, BTreeMap<String, Arc<Object>>>,
    /// Each slice's Service, by the slice's (namespace, name).
    slice_owner: BTreeMap<(String, String), SvcKey>,
}

impl ServiceCache {
    /// Takes a batch of deltas (other kinds are ignored); returns the
    /// Services they touched.
    pub fn take(&mut self, deltas: &[Delta]) -> BTreeSet<SvcKey> {
        let mut touched = BTreeSet::new();
        for d in deltas {
            let k = d.key();
            let ns = k.namespace.clone().unwrap_or_default();
            match (k.kind, d) {
                (Kind::Service, Delta::Added(o) | Delta::Updated(o)) => {
                    self.services
                        .insert((ns.clone(), k.name.clone()), o.clone());
                    touched.insert((ns, k.name));
                }
                (Kind::Service, Delta::Deleted(_)) => {
                    self.services.remove(&(ns.clone(), k.name.clone()));
                    touched.insert((ns, k.name));
                }
                (Kind::EndpointSlice, _) => touched.extend(self.slice(ns, &k.name, d)),
                _ => {}
            }
        }
        touched
    }

    pub fn service(&self, key: &SvcKey) -> Option<&Service> {
        match self.services.get(key).map(|o| o.as_ref()) {
            Some(Object::Service(s)) => Some(s),
            _ => None,
        }
    }

    /// Every Service, with its key.
    pub fn services(&self) -> impl Iterator<Item = (&SvcKey, &Service)> {
        self.services.iter().filter_map(|(k, o)| match o.as_ref() {
            Object::Service(s) => Some((k, s.as_ref())),
            _ => None,
        })
    }

    pub fn slices(&self, key: &SvcKey) -> Vec<&EndpointSlice> {
        self.slices
            .get(key)
            .into_iter()
            .flat_map(|by| by.values())
            .filter_map(|o| match o.as_ref() {
                Object::EndpointSlice(s) => Some(s.as_ref()),
                _ => None,
            })
            .collect()
    }

    fn slice(&mut self, ns: String, name: &str, d: &Delta) -> Vec<SvcKey> {
        let mut touched: Vec<SvcKey> = self.forget_slice(&ns, name).into_iter().collect();
        if let Delta::Added(o) | Delta::Updated(o) = d {
            if let Object::EndpointSlice(s) = o.as_ref() {
                if let Some(svc) = podnet_api::endpoints::service_name(s) {
                    let key = (ns, svc.to_string());
                    self.slices
                        .entry(key.clone())
                        .or_default()
                        .insert(name.to_string(), o.clone());
                    self.slice_owner
                        .insert((key.0.clone(), name.to_string()), key.clone());
                    touched.push(key);
                }
            }
        }
        touched
    }

    fn forget_slice(&mut self, ns: &str, name: &str) -> Option<SvcKey> {
        let key = self
            .slice_owner
            .remove(&(ns.to_string(), name.to_string()))?;
        if let Some(by) = self.slices.get_mut(&key) {
            by.remove(name);
            if by.is_empty() {
                self.slices.remove(&key);
            }
        }
        Some(key)
    }
}

/// A Node's InternalIP: the address other nodes and routers reach it at.
pub fn internal_ip(n: &podnet_api::k8s_openapi::api::core::v1::Node) -> Option<std::net::IpAddr> {
    n.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")?
        .address
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str) -> Delta {
        Delta::Added(Arc::new(Object::Service(Box::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default"}
            }))
            .unwrap(),
        ))))
    }

    fn slice(name: &str, svc: &str) -> Delta {
        Delta::Updated(Arc::new(Object::EndpointSlice(Box::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default",
                    "labels": {"kubernetes.io/service-name": svc}},
                "addressType": "IPv4",
                "endpoints": [],
            }))
            .unwrap(),
        ))))
    }

    fn key(n: &str) -> SvcKey {
        ("default".into(), n.into())
    }

    #[test]
    fn a_slice_that_moves_touches_both_services() {
        let mut c = ServiceCache::default();
        let t = c.take(&[svc("a"), svc("b"), slice("s1", "a")]);
        assert_eq!(t, [key("a"), key("b")].into_iter().collect());
        assert_eq!(c.slices(&key("a")).len(), 1);
        let t = c.take(&[slice("s1", "b")]);
        assert_eq!(t, [key("a"), key("b")].into_iter().collect());
        assert!(c.slices(&key("a")).is_empty());
        assert_eq!(c.slices(&key("b")).len(), 1);
        assert!(c.service(&key("b")).is_some());
    }
}
