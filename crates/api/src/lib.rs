//! podnet's cluster objects: the Kubernetes types networking uses
//! (Namespace, Node, Pod, Service, EndpointSlice, NetworkPolicy, via
//! `k8s-openapi`) plus podnet's own cluster-scoped `podnet.io/v1` kinds:
//! [`netconfig::NetworkConfig`], [`pool::IPAddressPool`] (LoadBalancer
//! address pools) and [`bgp::BGPConfiguration`] / [`bgp::BGPPeer`], with
//! kubectl-style kinds, defaults, API-server-like validation, manifest
//! parsing, label selectors and CIDR math.
//!
//! Everything here is pure: no I/O, so it is unit-tested without root.

pub mod bgp;
pub mod cidr;
pub mod endpoints;
pub mod gateway;
pub mod ingress;
pub mod ipfamily;
pub mod manifest;
pub mod nad;
pub mod netconfig;
pub mod object;
pub mod pool;
pub mod selector;
pub mod service;
pub mod validate;

pub use k8s_openapi;
pub use object::{Kind, Object};

/// One invalid field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub msg: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.msg)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("unknown kind {0:?} (known: Namespace, Node, Pod, Service, EndpointSlice, NetworkPolicy, NetworkConfig, IPAddressPool, BGPConfiguration, BGPPeer, Secret, Ingress, IngressClass, GatewayClass, Gateway, HTTPRoute, ReferenceGrant, NetworkAttachmentDefinition)")]
    UnknownKind(String),
    #[error("{field}: {msg}")]
    Invalid { field: String, msg: String },
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Fields(Vec<FieldError>),
    #[error("decoding: {0}")]
    Decode(String),
}
