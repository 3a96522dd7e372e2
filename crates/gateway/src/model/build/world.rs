//! The objects the gateway reads, kept by key as deltas arrive.

use std::collections::BTreeMap;

use podnet_api::gateway::{Gateway, GatewayClass, HTTPRoute, ReferenceGrant};
use podnet_api::k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use podnet_api::{Kind, Object};

/// (namespace, name); namespace "" for cluster-scoped kinds.
pub type Key = (String, String);

/// Every kind the gateway subscribes to.
pub const KINDS: &[Kind] = &[
    Kind::Namespace,
    Kind::Service,
    Kind::EndpointSlice,
    Kind::Secret,
    Kind::Ingress,
    Kind::IngressClass,
    Kind::GatewayClass,
    Kind::Gateway,
    Kind::HTTPRoute,
    Kind::ReferenceGrant,
];

#[derive(Debug, Clone, Default)]
pub struct World {
    pub namespaces: BTreeMap<String, Namespace>,
    pub services: BTreeMap<Key, Service>,
    pub slices: BTreeMap<Key, EndpointSlice>,
    pub secrets: BTreeMap<Key, Secret>,
    pub ingresses: BTreeMap<Key, Ingress>,
    pub ingress_classes: BTreeMap<String, IngressClass>,
    pub classes: BTreeMap<String, GatewayClass>,
    pub gateways: BTreeMap<Key, Gateway>,
    pub routes: BTreeMap<Key, HTTPRoute>,
    pub grants: BTreeMap<Key, ReferenceGrant>,
}

fn key(o: &Object) -> Key {
    (
        o.namespace().unwrap_or_default().to_string(),
        o.name().to_string(),
    )
}

impl World {
    /// Stores `o` (an object of one of [`KINDS`]).
    pub fn put(&mut self, o: Object) {
        let k = key(&o);
        match o {
            Object::Namespace(n) => drop(self.namespaces.insert(k.1, *n)),
            Object::Service(s) => drop(self.services.insert(k, *s)),
            Object::EndpointSlice(s) => drop(self.slices.insert(k, *s)),
            Object::Secret(s) => drop(self.secrets.insert(k, *s)),
            Object::Ingress(i) => drop(self.ingresses.insert(k, *i)),
            Object::IngressClass(c) => drop(self.ingress_classes.insert(k.1, *c)),
            Object::GatewayClass(c) => drop(self.classes.insert(k.1, *c)),
            Object::Gateway(g) => drop(self.gateways.insert(k, *g)),
            Object::HTTPRoute(r) => drop(self.routes.insert(k, *r)),
            Object::ReferenceGrant(g) => drop(self.grants.insert(k, *g)),
            _ => {}
        }
    }

    /// Forgets the object `kind` `ns`/`name`.
    pub fn remove(&mut self, kind: Kind, ns: Option<&str>, name: &str) {
        let k = (ns.unwrap_or_default().to_string(), name.to_string());
        match kind {
            Kind::Namespace => drop(self.namespaces.remove(name)),
            Kind::Service => drop(self.services.remove(&k)),
            Kind::EndpointSlice => drop(self.slices.remove(&k)),
            Kind::Secret => drop(self.secrets.remove(&k)),
            Kind::Ingress => drop(self.ingresses.remove(&k)),
            Kind::IngressClass => drop(self.ingress_classes.remove(name)),
            Kind::GatewayClass => drop(self.classes.remove(name)),
            Kind::Gateway => drop(self.gateways.remove(&k)),
            Kind::HTTPRoute => drop(self.routes.remove(&k)),
            Kind::ReferenceGrant => drop(self.grants.remove(&k)),
            _ => {}
        }
    }

    /// Whether a ReferenceGrant in `to_ns` lets `from` refer to `to`.
    pub fn granted(
        &self,
        (from_kind, from_ns): (&str, &str),
        (to_group, to_kind, to_ns, to_name): (&str, &str, &str, &str),
    ) -> bool {
        from_ns == to_ns
            || self
                .grants
                .iter()
                .filter(|((ns, _), _)| ns == to_ns)
                .any(|(_, g)| {
                    g.allows(
                        (podnet_api::gateway::GROUP, from_kind, from_ns),
                        (to_group, to_kind, to_name),
                    )
                })
    }
}
