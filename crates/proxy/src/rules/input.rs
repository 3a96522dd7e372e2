//! What the planner reads, and which of it is ours: this node
//! ([`NodeInfo`]), the cluster's objects ([`ProxyInput`]), the labels that
//! hand a Service or slice to another proxy, and the ClusterIP a family
//! programs a Service under. Everything the rest of the planner does starts
//! from a Service these functions kept.

use std::net::IpAddr;

use podnet_api::k8s_openapi::api::core::v1::{Service, ServiceSpec};
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;

use super::Stack;

/// What the planner knows about the node it plans for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// The Node's name: endpoints with this `nodeName` are local.
    pub name: String,
    /// Its `topology.kubernetes.io/zone` label, for zone hints.
    pub zone: Option<String>,
    /// The node's own addresses: a loadBalancerSourceRanges entry that
    /// holds one of them also admits the LB IPs as sources (a node reaching
    /// a VIP it holds locally does so from the VIP).
    pub ips: Vec<IpAddr>,
    /// The addresses NodePorts are accepted on (kube-proxy's
    /// `--nodeport-addresses`); loopback never is. None: every local
    /// address but loopback.
    pub nodeport_ips: Option<Vec<IpAddr>>,
}

impl NodeInfo {
    pub fn named(name: &str) -> NodeInfo {
        NodeInfo {
            name: name.to_string(),
            ..NodeInfo::default()
        }
    }
}

impl From<&str> for NodeInfo {
    fn from(name: &str) -> NodeInfo {
        NodeInfo::named(name)
    }
}

impl From<String> for NodeInfo {
    fn from(name: String) -> NodeInfo {
        NodeInfo {
            name,
            ..NodeInfo::default()
        }
    }
}

/// Labels that take a Service away from this proxy (kube-proxy's watch
/// selector): `service.kubernetes.io/headless`, and
/// `service.kubernetes.io/service-proxy-name` naming another proxy.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
pub const PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// The `service-proxy-name` value that keeps a Service ours.
pub const PROXY_NAME: &str = "podnet";

/// Whether the Service's labels hand it to no proxy or to another one.
pub fn opted_out(svc: &Service) -> bool {
    labels_opt_out(svc.metadata.labels.as_ref())
}

/// The same for an EndpointSlice: kube-proxy's watch selector applies to
/// both kinds, so a slice labelled headless (or for another proxy) gives
/// its Service no endpoints, whatever the Service says (upstream's e2e
/// "Services should implement service.kubernetes.io/headless").
pub fn slice_opted_out(s: &EndpointSlice) -> bool {
    labels_opt_out(s.metadata.labels.as_ref())
}

fn labels_opt_out(l: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    let Some(l) = l else { return false };
    l.contains_key(HEADLESS_LABEL) || l.get(PROXY_NAME_LABEL).is_some_and(|v| v != PROXY_NAME)
}

/// What the planner needs to know about this node and cluster.
#[derive(Debug, Clone)]
pub struct ProxyInput<'a> {
    pub node: &'a NodeInfo,
    pub stack: Stack,
    pub services: &'a [Service],
    pub slices: &'a [EndpointSlice],
}

/// The ClusterIP this family programs `svc` under; None when this
/// family's table holds nothing of it (an ExternalName, a Service another
/// proxy owns, or one with no ClusterIP of the family: as kube-proxy, a
/// family's proxier ignores a Service without a ClusterIP of its own).
/// A full sync skips such Services without planning them.
pub fn programmed_ip(svc: &Service, stack: &Stack) -> Option<IpAddr> {
    let spec = svc.spec.as_ref()?;
    let ty = spec.type_.as_deref().unwrap_or("ClusterIP");
    if ty == "ExternalName" || opted_out(svc) {
        return None;
    }
    cluster_ip_of(spec, stack)
}

/// The Service's ClusterIP in this family: `clusterIPs` (dual-stack) or
/// `clusterIP`.
pub(super) fn cluster_ip_of(spec: &ServiceSpec, stack: &Stack) -> Option<IpAddr> {
    spec.cluster_ips
        .iter()
        .flatten()
        .chain(spec.cluster_ip.iter())
        .filter_map(|c| c.parse::<IpAddr>().ok())
        .find(|ip| stack.holds(ip))
}
