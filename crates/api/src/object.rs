//! The kinds podnet stores and the [`Object`] enum that carries any of them.
//!
//! Objects are the `k8s-openapi` types, so manifests written for kubectl
//! apply unchanged. The store keeps them as JSON under
//! `/registry/<plural>/[<namespace>/]<name>`, the API server's layout.

use std::fmt;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass, NetworkPolicy};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::bgp::{BGPConfiguration, BGPPeer};
use crate::gateway::{Gateway, GatewayClass, HTTPRoute, ReferenceGrant};
use crate::nad::NetworkAttachmentDefinition;
use crate::netconfig::NetworkConfig;
use crate::pool::IPAddressPool;
use crate::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Namespace,
    Node,
    Pod,
    Service,
    EndpointSlice,
    NetworkPolicy,
    NetworkConfig,
    IPAddressPool,
    BGPConfiguration,
    BGPPeer,
    Secret,
    Ingress,
    IngressClass,
    GatewayClass,
    Gateway,
    HTTPRoute,
    ReferenceGrant,
    NetworkAttachmentDefinition,
}

impl Kind {
    pub const ALL: [Kind; 18] = [
        Kind::Namespace,
        Kind::Node,
        Kind::NetworkConfig,
        Kind::Pod,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::NetworkPolicy,
        Kind::IPAddressPool,
        Kind::BGPConfiguration,
        Kind::BGPPeer,
        Kind::Secret,
        Kind::Ingress,
        Kind::IngressClass,
        Kind::GatewayClass,
        Kind::Gateway,
        Kind::HTTPRoute,
        Kind::ReferenceGrant,
        Kind::NetworkAttachmentDefinition,
    ];

    /// Parses a kind the way kubectl does: name, plural or short name,
    /// any case, optionally with a group suffix.
    pub fn parse(s: &str) -> Result<Kind, ApiError> {
        let l = s.to_ascii_lowercase();
        let base = l.split('.').next().unwrap_or(&l);
        Ok(match base {
            "namespace" | "namespaces" | "ns" => Kind::Namespace,
            "node" | "nodes" | "no" => Kind::Node,
            "pod" | "pods" | "po" => Kind::Pod,
            "service" | "services" | "svc" => Kind::Service,
            "endpointslice" | "endpointslices" | "ep" | "eps" | "endpoints" => Kind::EndpointSlice,
            "networkpolicy" | "networkpolicies" | "netpol" => Kind::NetworkPolicy,
            "networkconfig" | "networkconfigs" | "netconf" | "netcfg" => Kind::NetworkConfig,
            "ipaddresspool" | "ipaddresspools" | "ippool" | "ippools" => Kind::IPAddressPool,
            "bgpconfiguration" | "bgpconfigurations" | "bgpconfig" | "bgpconfigs" => {
                Kind::BGPConfiguration
            }
            "bgppeer" | "bgppeers" => Kind::BGPPeer,
            "secret" | "secrets" => Kind::Secret,
            "ingress" | "ingresses" | "ing" => Kind::Ingress,
            "ingressclass" | "ingressclasses" => Kind::IngressClass,
            "gatewayclass" | "gatewayclasses" | "gc" => Kind::GatewayClass,
            "gateway" | "gateways" | "gtw" => Kind::Gateway,
            "httproute" | "httproutes" => Kind::HTTPRoute,
            "referencegrant" | "referencegrants" | "refgrant" => Kind::ReferenceGrant,
            "networkattachmentdefinition"
            | "networkattachmentdefinitions"
            | "network-attachment-definitions"
            | "net-attach-def" => Kind::NetworkAttachmentDefinition,
            _ => {
                return Err(ApiError::UnknownKind(s.to_string()));
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Namespace => "Namespace",
            Kind::Node => "Node",
            Kind::Pod => "Pod",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::NetworkPolicy => "NetworkPolicy",
            Kind::NetworkConfig => "NetworkConfig",
            Kind::IPAddressPool => "IPAddressPool",
            Kind::BGPConfiguration => "BGPConfiguration",
            Kind::BGPPeer => "BGPPeer",
            Kind::Secret => "Secret",
            Kind::Ingress => "Ingress",
            Kind::IngressClass => "IngressClass",
            Kind::GatewayClass => "GatewayClass",
            Kind::Gateway => "Gateway",
            Kind::HTTPRoute => "HTTPRoute",
            Kind::ReferenceGrant => "ReferenceGrant",
            Kind::NetworkAttachmentDefinition => "NetworkAttachmentDefinition",
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            Kind::Namespace => "namespaces",
            Kind::Node => "nodes",
            Kind::Pod => "pods",
            Kind::Service => "services",
            Kind::EndpointSlice => "endpointslices",
            Kind::NetworkPolicy => "networkpolicies",
            Kind::NetworkConfig => "networkconfigs",
            Kind::IPAddressPool => "ipaddresspools",
            Kind::BGPConfiguration => "bgpconfigurations",
            Kind::BGPPeer => "bgppeers",
            Kind::Secret => "secrets",
            Kind::Ingress => "ingresses",
            Kind::IngressClass => "ingressclasses",
            Kind::GatewayClass => "gatewayclasses",
            Kind::Gateway => "gateways",
            Kind::HTTPRoute => "httproutes",
            Kind::ReferenceGrant => "referencegrants",
            Kind::NetworkAttachmentDefinition => "network-attachment-definitions",
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Kind::Namespace | Kind::Node | Kind::Pod | Kind::Service | Kind::Secret => "v1",
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            Kind::NetworkPolicy | Kind::Ingress | Kind::IngressClass => "networking.k8s.io/v1",
            Kind::GatewayClass | Kind::Gateway | Kind::HTTPRoute | Kind::ReferenceGrant => {
                crate::gateway::API_VERSION
            }
            Kind::NetworkConfig | Kind::IPAddressPool | Kind::BGPConfiguration | Kind::BGPPeer => {
                crate::netconfig::API_VERSION
            }
            Kind::NetworkAttachmentDefinition => crate::nad::API_VERSION,
        }
    }

    pub fn namespaced(self) -> bool {
        !matches!(
            self,
            Kind::Namespace
                | Kind::Node
                | Kind::NetworkConfig
                | Kind::IPAddressPool
                | Kind::BGPConfiguration
                | Kind::BGPPeer
                | Kind::IngressClass
                | Kind::GatewayClass
        )
    }

    /// Versions also accepted on input (the Gateway API serves v1beta1
    /// beside v1 for the same schema).
    fn also_accepts(self, api_version: &str) -> bool {
        matches!(
            self,
            Kind::GatewayClass | Kind::Gateway | Kind::HTTPRoute | Kind::ReferenceGrant
        ) && api_version == "gateway.networking.k8s.io/v1beta1"
    }

    /// The store key prefix for every object of this kind (and namespace).
    pub fn prefix(self, ns: Option<&str>) -> String {
        match ns {
            Some(ns) if self.namespaced() => format!("/registry/{}/{}/", self.plural(), ns),
            _ => format!("/registry/{}/", self.plural()),
        }
    }

    pub fn key(self, ns: Option<&str>, name: &str) -> String {
        let ns = if self.namespaced() {
            Some(ns.unwrap_or("default"))
        } else {
            None
        };
        format!("{}{}", self.prefix(ns), name)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Makes podnet's cluster-scoped kinds Kubernetes resources (group
/// `podnet.io`, version `v1`), so the Kubernetes API's client and watcher
/// (`kube`, through its blanket `Resource` impl) read their CRDs
/// (`deploy/parts/05-crds.yaml`) as typed objects.
macro_rules! podnet_resource {
    ($t:ty, $kind:literal, $plural:literal) => {
        impl k8s_openapi::Resource for $t {
            const API_VERSION: &'static str = "podnet.io/v1";
            const GROUP: &'static str = "podnet.io";
            const KIND: &'static str = $kind;
            const VERSION: &'static str = "v1";
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = k8s_openapi::ClusterResourceScope;
        }
        impl k8s_openapi::ListableResource for $t {
            const LIST_KIND: &'static str = concat!($kind, "List");
        }
        impl k8s_openapi::Metadata for $t {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

podnet_resource!(IPAddressPool, "IPAddressPool", "ipaddresspools");
podnet_resource!(BGPConfiguration, "BGPConfiguration", "bgpconfigurations");
podnet_resource!(BGPPeer, "BGPPeer", "bgppeers");

/// Any stored object.
#[derive(Debug, Clone, PartialEq)]
pub enum Object {
    Namespace(Box<Namespace>),
    Node(Box<Node>),
    Pod(Box<Pod>),
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
    NetworkPolicy(Box<NetworkPolicy>),
    NetworkConfig(Box<NetworkConfig>),
    IPAddressPool(Box<IPAddressPool>),
    BGPConfiguration(Box<BGPConfiguration>),
    BGPPeer(Box<BGPPeer>),
    Secret(Box<Secret>),
    Ingress(Box<Ingress>),
    IngressClass(Box<IngressClass>),
    GatewayClass(Box<GatewayClass>),
    Gateway(Box<Gateway>),
    HTTPRoute(Box<HTTPRoute>),
    ReferenceGrant(Box<ReferenceGrant>),
    NetworkAttachmentDefinition(Box<NetworkAttachmentDefinition>),
}

macro_rules! each {
    ($self:expr, $o:ident => $e:expr) => {
        match $self {
            Object::Namespace($o) => $e,
            Object::Node($o) => $e,
            Object::Pod($o) => $e,
            Object::Service($o) => $e,
            Object::EndpointSlice($o) => $e,
            Object::NetworkPolicy($o) => $e,
            Object::NetworkConfig($o) => $e,
            Object::IPAddressPool($o) => $e,
            Object::BGPConfiguration($o) => $e,
            Object::BGPPeer($o) => $e,
            Object::Secret($o) => $e,
            Object::Ingress($o) => $e,
            Object::IngressClass($o) => $e,
            Object::GatewayClass($o) => $e,
            Object::Gateway($o) => $e,
            Object::HTTPRoute($o) => $e,
            Object::ReferenceGrant($o) => $e,
            Object::NetworkAttachmentDefinition($o) => $e,
        }
    };
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Object::Namespace(_) => Kind::Namespace,
            Object::Node(_) => Kind::Node,
            Object::Pod(_) => Kind::Pod,
            Object::Service(_) => Kind::Service,
            Object::EndpointSlice(_) => Kind::EndpointSlice,
            Object::NetworkPolicy(_) => Kind::NetworkPolicy,
            Object::NetworkConfig(_) => Kind::NetworkConfig,
            Object::IPAddressPool(_) => Kind::IPAddressPool,
            Object::BGPConfiguration(_) => Kind::BGPConfiguration,
            Object::BGPPeer(_) => Kind::BGPPeer,
            Object::Secret(_) => Kind::Secret,
            Object::Ingress(_) => Kind::Ingress,
            Object::IngressClass(_) => Kind::IngressClass,
            Object::GatewayClass(_) => Kind::GatewayClass,
            Object::Gateway(_) => Kind::Gateway,
            Object::HTTPRoute(_) => Kind::HTTPRoute,
            Object::ReferenceGrant(_) => Kind::ReferenceGrant,
            Object::NetworkAttachmentDefinition(_) => Kind::NetworkAttachmentDefinition,
        }
    }

    pub fn meta(&self) -> &ObjectMeta {
        each!(self, o => &o.metadata)
    }

    pub fn meta_mut(&mut self) -> &mut ObjectMeta {
        each!(self, o => &mut o.metadata)
    }

    pub fn name(&self) -> &str {
        self.meta().name.as_deref().unwrap_or_default()
    }

    /// The namespace, defaulted to "default" for namespaced kinds.
    pub fn namespace(&self) -> Option<&str> {
        if self.kind().namespaced() {
            Some(self.meta().namespace.as_deref().unwrap_or("default"))
        } else {
            None
        }
    }

    pub fn key(&self) -> String {
        self.kind().key(self.namespace(), self.name())
    }

    /// "Service default/web" — how errors name an object.
    pub fn describe(&self) -> String {
        match self.namespace() {
            Some(ns) => format!("{} {}/{}", self.kind(), ns, self.name()),
            None => format!("{} {}", self.kind(), self.name()),
        }
    }

    pub fn resource_version(&self) -> Option<i64> {
        self.meta()
            .resource_version
            .as_deref()
            .and_then(|s| s.parse().ok())
    }

    /// Decodes any supported object from JSON, dispatching on `kind`.
    pub fn from_value(v: Value) -> Result<Object, ApiError> {
        let kind_s = v
            .get("kind")
            .and_then(|k| k.as_str())
            .ok_or_else(|| ApiError::Invalid {
                field: "kind".into(),
                msg: "missing".into(),
            })?
            .to_string();
        let kind = Kind::parse(&kind_s)?;
        if kind.name() != kind_s {
            return Err(ApiError::UnknownKind(kind_s));
        }
        if let Some(av) = v.get("apiVersion").and_then(|a| a.as_str()) {
            if av != kind.api_version() && !kind.also_accepts(av) {
                return Err(ApiError::Invalid {
                    field: "apiVersion".into(),
                    msg: format!(
                        "{av:?} is not served for kind {kind} (want {:?})",
                        kind.api_version()
                    ),
                });
            }
        }
        fn de<T: serde::de::DeserializeOwned>(v: Value) -> Result<Box<T>, ApiError> {
            serde_json::from_value(v)
                .map(Box::new)
                .map_err(|e| ApiError::Decode(e.to_string()))
        }
        Ok(match kind {
            Kind::Namespace => Object::Namespace(de(v)?),
            Kind::Node => Object::Node(de(v)?),
            Kind::Pod => Object::Pod(de(v)?),
            Kind::Service => Object::Service(de(v)?),
            Kind::EndpointSlice => Object::EndpointSlice(de(v)?),
            Kind::NetworkPolicy => Object::NetworkPolicy(de(v)?),
            Kind::NetworkConfig => Object::NetworkConfig(de(v)?),
            Kind::IPAddressPool => Object::IPAddressPool(de(v)?),
            Kind::BGPConfiguration => Object::BGPConfiguration(de(v)?),
            Kind::BGPPeer => Object::BGPPeer(de(v)?),
            Kind::Secret => Object::Secret(de(v)?),
            Kind::Ingress => Object::Ingress(de(v)?),
            Kind::IngressClass => Object::IngressClass(de(v)?),
            Kind::GatewayClass => Object::GatewayClass(de(v)?),
            Kind::Gateway => Object::Gateway(de(v)?),
            Kind::HTTPRoute => Object::HTTPRoute(de(v)?),
            Kind::ReferenceGrant => Object::ReferenceGrant(de(v)?),
            Kind::NetworkAttachmentDefinition => Object::NetworkAttachmentDefinition(de(v)?),
        })
    }

    pub fn to_value(&self) -> Value {
        let mut v = each!(self, o => serde_json::to_value(o.as_ref())).expect("objects serialize");
        // k8s-openapi writes apiVersion/kind itself; our own kinds need them
        // too (their fields are empty when built in code).
        if v.get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .is_empty()
        {
            v["kind"] = Value::from(self.kind().name());
            v["apiVersion"] = Value::from(self.kind().api_version());
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kinds_parse_like_kubectl() {
        for (s, k) in [
            ("svc", Kind::Service),
            ("Services", Kind::Service),
            ("ep", Kind::EndpointSlice),
            ("netpol", Kind::NetworkPolicy),
            ("ns", Kind::Namespace),
            ("no", Kind::Node),
            ("po", Kind::Pod),
            ("networkpolicies.networking.k8s.io", Kind::NetworkPolicy),
            ("ipaddresspool", Kind::IPAddressPool),
            ("IPAddressPools", Kind::IPAddressPool),
            ("ippool", Kind::IPAddressPool),
            ("ipaddresspools.podnet.io", Kind::IPAddressPool),
            ("bgppeer", Kind::BGPPeer),
            ("bgppeers", Kind::BGPPeer),
            ("bgpconfiguration", Kind::BGPConfiguration),
            ("bgpconfigurations", Kind::BGPConfiguration),
            ("bgpconfig", Kind::BGPConfiguration),
        ] {
            assert_eq!(Kind::parse(s).unwrap(), k, "{s}");
        }
        assert!(Kind::parse("deployment").is_err());
    }

    #[test]
    fn keys_follow_the_registry_layout() {
        assert_eq!(
            Kind::Service.key(Some("kube-system"), "dns"),
            "/registry/services/kube-system/dns"
        );
        assert_eq!(Kind::Node.key(Some("x"), "n1"), "/registry/nodes/n1");
        assert_eq!(Kind::Pod.key(None, "p"), "/registry/pods/default/p");
        assert_eq!(
            Kind::IPAddressPool.key(Some("x"), "lan"),
            "/registry/ipaddresspools/lan"
        );
        assert_eq!(Kind::BGPPeer.key(None, "tor"), "/registry/bgppeers/tor");
        assert_eq!(
            Kind::BGPConfiguration.key(None, "default"),
            "/registry/bgpconfigurations/default"
        );
    }

    #[test]
    fn objects_round_trip_through_json() {
        let v = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
                       "spec": {"ports": [{"port": 80}], "selector": {"app": "web"}}});
        let o = Object::from_value(v).unwrap();
        assert_eq!(o.describe(), "Service shop/web");
        let back = o.to_value();
        assert_eq!(back["kind"], "Service");
        assert_eq!(back["spec"]["ports"][0]["port"], 80);
        let e = Object::from_value(
            json!({"apiVersion": "v2", "kind": "Service", "metadata": {"name": "x"}}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("apiVersion"));
    }

    #[test]
    fn resource_constants_agree_with_the_kinds() {
        use k8s_openapi::Resource;
        for (k, plural, kind, av) in [
            (
                Kind::IPAddressPool,
                IPAddressPool::URL_PATH_SEGMENT,
                IPAddressPool::KIND,
                IPAddressPool::API_VERSION,
            ),
            (
                Kind::BGPPeer,
                BGPPeer::URL_PATH_SEGMENT,
                BGPPeer::KIND,
                BGPPeer::API_VERSION,
            ),
            (
                Kind::BGPConfiguration,
                BGPConfiguration::URL_PATH_SEGMENT,
                BGPConfiguration::KIND,
                BGPConfiguration::API_VERSION,
            ),
        ] {
            assert_eq!((k.plural(), k.name(), k.api_version()), (plural, kind, av));
        }
    }

    /// podnet's own kinds carry apiVersion and kind on the way out even
    /// when built in code, and are cluster-scoped.
    #[test]
    fn own_kinds_round_trip() {
        let o = Object::IPAddressPool(Box::default());
        let v = o.to_value();
        assert_eq!(
            (v["apiVersion"].as_str(), v["kind"].as_str()),
            (Some("podnet.io/v1"), Some("IPAddressPool"))
        );
        for (kind, spec) in [
            ("IPAddressPool", json!({"addresses": ["192.0.2.0/28"]})),
            ("BGPPeer", json!({"peerIP": "192.0.2.1", "asNumber": 65001})),
            ("BGPConfiguration", json!({"asNumber": 65000})),
        ] {
            let o = Object::from_value(json!({"apiVersion": "podnet.io/v1", "kind": kind,
                "metadata": {"name": "x", "namespace": "ignored"}, "spec": spec.clone()}))
            .unwrap();
            assert_eq!(o.kind().name(), kind);
            assert_eq!(o.namespace(), None);
            assert_eq!(o.describe(), format!("{kind} x"));
            assert_eq!(o.to_value()["spec"], spec);
        }
    }
}
