//! The kinds podnet stores and the [`Object`] enum that carries any of them.
//!
//! Objects are the `k8s-openapi` types, so manifests written for kubectl
//! apply unchanged. The store keeps them as JSON under
//! `/registry/<plural>/[<namespace>/]<name>`, the API server's layout.

use std::fmt;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::netconfig::NetworkConfig;
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
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::Namespace,
        Kind::Node,
        Kind::NetworkConfig,
        Kind::Pod,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::NetworkPolicy,
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
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Kind::Namespace | Kind::Node | Kind::Pod | Kind::Service => "v1",
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            Kind::NetworkPolicy => "networking.k8s.io/v1",
            Kind::NetworkConfig => crate::netconfig::API_VERSION,
        }
    }

    pub fn namespaced(self) -> bool {
        !matches!(self, Kind::Namespace | Kind::Node | Kind::NetworkConfig)
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
            if av != kind.api_version() {
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
        })
    }

    pub fn to_value(&self) -> Value {
        let mut v = each!(self, o => serde_json::to_value(o.as_ref())).expect("objects serialize");
        // k8s-openapi writes apiVersion/kind itself; our own kind needs it too.
        if v.get("kind").is_none() {
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
}
