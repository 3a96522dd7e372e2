//! A Service port's usable endpoints on this node, in this family: the
//! slices that belong to the Service, read through the one categorization
//! (`podnet_api::endpoints`, kube-proxy's CategorizeEndpoints), for the
//! Cluster and the Local policy.

use std::net::IpAddr;

use podnet_api::k8s_openapi::api::core::v1::{Service, ServicePort};
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;

use super::input::slice_opted_out;
use super::{NodeInfo, Stack};

/// One usable endpoint of one Service port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Ep {
    pub(super) ip: IpAddr,
    pub(super) port: u16,
    pub(super) local: bool,
}

/// A Service port's usable endpoints on this node, from the one
/// categorization (`podnet_api::endpoints`, kube-proxy's
/// CategorizeEndpoints).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Usable {
    /// For the Cluster policy.
    pub(super) cluster: Vec<Ep>,
    /// For the Local policy.
    pub(super) local: Vec<Ep>,
    /// Whether any endpoint anywhere can serve: without one the Service is
    /// rejected; with one but none for a Local policy, dropped.
    pub(super) any: bool,
}

/// The endpoints of one Service port in this family, by Kubernetes rules.
pub(super) fn endpoints(
    svc: &Service,
    port: &ServicePort,
    slices: &[EndpointSlice],
    node: &NodeInfo,
    stack: &Stack,
) -> Usable {
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    let mine: Vec<&EndpointSlice> = slices
        .iter()
        .filter(|s| {
            s.metadata.namespace.as_deref().unwrap_or("default") == ns
                && podnet_api::endpoints::service_name(s) == Some(name)
                && s.address_type == stack.address_type()
                && !slice_opted_out(s)
        })
        .collect();
    let proto = port.protocol.as_deref().unwrap_or("TCP");
    let port_name = port.name.as_deref().unwrap_or("");
    let listed = podnet_api::endpoints::listed(&mine, port_name, proto, &|ip| stack.holds(ip));
    let c = podnet_api::endpoints::categorize(&listed, &node.name, node.zone.as_deref());
    let eps = |idx: &[usize]| -> Vec<Ep> {
        let mut v: Vec<Ep> = idx
            .iter()
            .map(|&i| Ep {
                ip: listed[i].ip,
                port: listed[i].port,
                local: listed[i].on(&node.name),
            })
            .collect();
        v.sort();
        v.dedup();
        v
    };
    Usable {
        cluster: eps(&c.cluster),
        local: eps(&c.local),
        any: c.any,
    }
}
