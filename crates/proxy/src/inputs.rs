//! The proxy's one input store: every Service and EndpointSlice the proxy
//! knows, grouped by Service, for both address families at once.
//!
//! Objects are kept as the bytes they serialize to (a few hundred bytes
//! each) and decoded only to plan: at 50k Services this is tens of
//! megabytes instead of a gigabyte of decoded objects. One Service change
//! is encoded once, and decoded once per sync for every family's plan
//! ([`Inputs::decode`]); what the kernel holds is remembered as the
//! [`Inputs`] it was planned from, shared with the store while nothing
//! changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::{Kind, Object};
use podnet_source::Delta;

use crate::healthcheck;

/// An object as JSON bytes; decoded when a plan needs it.
type Raw = Arc<[u8]>;

fn encode<T: serde::Serialize>(o: &T) -> Raw {
    Arc::from(serde_json::to_vec(o).expect("objects serialize"))
}

/// The inputs one Service's fragment is planned from.
#[derive(Clone, Default)]
pub struct Inputs {
    service: Option<Raw>,
    slices: Vec<Raw>,
}

/// A Service and its slices, decoded for planning.
pub struct Decoded {
    pub service: Option<Service>,
    pub slices: Vec<EndpointSlice>,
}

impl Inputs {
    /// Whether the Service and all its slices are gone.
    pub fn is_empty(&self) -> bool {
        self.service.is_none() && self.slices.is_empty()
    }

    /// Whether both are the very same bytes (no decode needed to tell).
    pub fn same(&self, other: &Inputs) -> bool {
        let eq = |a: &Raw, b: &Raw| Arc::ptr_eq(a, b);
        match (&self.service, &other.service) {
            (Some(a), Some(b)) if !eq(a, b) => return false,
            (None, None) | (Some(_), Some(_)) => {}
            _ => return false,
        }
        self.slices.len() == other.slices.len()
            && self.slices.iter().zip(&other.slices).all(|(a, b)| eq(a, b))
    }

    /// Straight into the typed objects, with no `serde_json::Value` in
    /// between; an object that no longer decodes is left out.
    pub fn decode(&self) -> Decoded {
        Decoded {
            service: self
                .service
                .as_deref()
                .and_then(|r| serde_json::from_slice(r).ok()),
            slices: self
                .slices
                .iter()
                .filter_map(|r| serde_json::from_slice(r).ok())
                .collect(),
        }
    }
}

/// Every Service and slice, by Service.
#[derive(Default)]
pub struct InputStore {
    services: BTreeMap<String, Raw>,
    /// Slices by "namespace/name", with the Service they belong to.
    slices: BTreeMap<String, (String, Raw)>,
    by_service: BTreeMap<String, BTreeSet<String>>,
    /// Services changed since [`InputStore::take_touched`] (for health
    /// checks).
    touched: BTreeSet<String>,
    /// Services with a health-check node port ([`healthcheck::port`]):
    /// what a relist's health-check resync visits.
    with_health: BTreeSet<String>,
}

/// What a delta did to the store.
pub enum Watched<'a> {
    /// Not a Service or slice.
    Other,
    /// Service `id` changed; its object, when it still exists.
    Service(String, Option<&'a Service>),
    /// The Services whose slices changed.
    Slices(Vec<String>),
}

impl InputStore {
    /// Takes one delta (the `watch` verb).
    pub fn watch<'a>(&mut self, d: &'a Delta) -> Watched<'a> {
        let key = d.key();
        let ns = key.namespace.clone().unwrap_or_else(|| "default".into());
        match (key.kind, d.object()) {
            (Kind::Service, o) => {
                let id = format!("{ns}/{}", key.name);
                self.touched.insert(id.clone());
                self.with_health.remove(&id);
                let svc = match o {
                    Some(Object::Service(svc)) => {
                        if healthcheck::port(svc).is_some() {
                            self.with_health.insert(id.clone());
                        }
                        self.services.insert(id.clone(), encode(svc.as_ref()));
                        Some(svc.as_ref())
                    }
                    _ => {
                        self.services.remove(&id);
                        None
                    }
                };
                Watched::Service(id, svc)
            }
            (Kind::EndpointSlice, o) => {
                Watched::Slices(self.watch_slice(format!("{ns}/{}", key.name), o))
            }
            _ => Watched::Other,
        }
    }

    fn watch_slice(&mut self, skey: String, o: Option<&Object>) -> Vec<String> {
        let mut ids = Vec::new();
        if let Some((old, _)) = self.slices.remove(&skey) {
            if let Some(set) = self.by_service.get_mut(&old) {
                set.remove(&skey);
            }
            ids.push(old);
        }
        if let Some(obj @ Object::EndpointSlice(slice)) = o {
            if let Some(id) = service_id(obj) {
                self.by_service
                    .entry(id.clone())
                    .or_default()
                    .insert(skey.clone());
                self.slices
                    .insert(skey, (id.clone(), encode(slice.as_ref())));
                ids.push(id);
            }
        }
        self.touched.extend(ids.iter().cloned());
        ids
    }

    /// The current inputs of Service `id` (shared bytes, no copies).
    pub fn inputs(&self, id: &str) -> Inputs {
        Inputs {
            service: self.services.get(id).cloned(),
            slices: self
                .by_service
                .get(id)
                .into_iter()
                .flatten()
                .filter_map(|k| self.slices.get(k).map(|(_, r)| r.clone()))
                .collect(),
        }
    }

    /// Every Service known by its object or by a slice, in order.
    pub fn ids(&self) -> BTreeSet<&String> {
        self.services.keys().chain(self.by_service.keys()).collect()
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// Services changed since the last call.
    pub fn take_touched(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.touched)
    }

    /// What Service `id`'s health-check node port should report on `node`
    /// (decoded only for Services that have such a port).
    pub fn health_target(&self, id: &str, node: &str) -> Option<(u16, healthcheck::Target)> {
        if !self.with_health.contains(id) {
            return None;
        }
        let d = self.inputs(id).decode();
        let refs: Vec<&EndpointSlice> = d.slices.iter().collect();
        healthcheck::target(d.service.as_ref()?, &refs, node)
    }

    /// The health-check target of every Service that has one (after a
    /// relist; the others have none to report).
    pub fn health_targets(
        &self,
        node: &str,
    ) -> BTreeMap<String, Option<(u16, healthcheck::Target)>> {
        self.with_health
            .iter()
            .map(|id| (id.clone(), self.health_target(id, node)))
            .collect()
    }

    /// Forgets everything (before a relist).
    pub fn clear(&mut self) {
        *self = InputStore::default();
    }
}

/// "ns/name" of the Service a slice belongs to.
fn service_id(o: &Object) -> Option<String> {
    let ns = o.namespace().unwrap_or("default");
    match o {
        Object::EndpointSlice(s) => {
            podnet_api::endpoints::service_name(s).map(|n| format!("{ns}/{n}"))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, spec: serde_json::Value) -> Delta {
        let o = serde_json::json!({
            "kind": "Service", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec
        });
        Delta::Updated(Arc::new(Object::from_value(o).unwrap()))
    }

    #[test]
    fn kept_bytes_decode_straight_into_typed_objects() {
        let mut s = InputStore::default();
        let d = svc(
            "web",
            serde_json::json!({"clusterIP": "10.96.0.9", "ports": [{"port": 80}]}),
        );
        s.watch(&d);
        let Some(Object::Service(want)) = d.object() else {
            unreachable!()
        };
        let i = s.inputs("default/web");
        assert_eq!(i.decode().service.unwrap().spec, want.spec);
        assert!(i.same(&s.inputs("default/web")));
        s.watch(&d);
        assert!(
            !i.same(&s.inputs("default/web")),
            "a new version is new bytes"
        );
    }

    /// A relist's health-check resync visits the Services that have a
    /// health-check port, not all 10,000: before, it decoded every Service
    /// (about 140 ms at 10,000, holding the first change after a cold
    /// start), and a Service that loses its port still loses it.
    #[test]
    fn health_targets_are_only_the_services_with_a_health_check_port() {
        let mut s = InputStore::default();
        let lb = serde_json::json!({"type": "LoadBalancer", "clusterIP": "10.96.0.3",
            "externalTrafficPolicy": "Local", "healthCheckNodePort": 31999,
            "ports": [{"port": 80, "nodePort": 30080}]});
        for d in [
            svc(
                "plain",
                serde_json::json!({"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}),
            ),
            svc(
                "lb-cluster",
                serde_json::json!({"type": "LoadBalancer", "clusterIP": "10.96.0.2",
                "ports": [{"port": 80, "nodePort": 30081}]}),
            ),
            svc("lb-local", lb.clone()),
        ] {
            s.watch(&d);
        }
        let keys = |s: &InputStore| s.health_targets("n1").into_keys().collect::<Vec<_>>();
        assert_eq!(keys(&s), ["default/lb-local"]);
        let mut cluster = lb;
        cluster["externalTrafficPolicy"] = "Cluster".into();
        s.watch(&svc("lb-local", cluster));
        assert!(keys(&s).is_empty(), "{:?}", keys(&s));
    }
}
