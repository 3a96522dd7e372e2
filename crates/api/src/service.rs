//! What the data plane's announcers read of a Service, in one place: its
//! LoadBalancer addresses (`status.loadBalancer.ingress`) and whether its
//! external traffic stays on the node that receives it
//! (`externalTrafficPolicy: Local`). BGP's Service routes, L2
//! announcement and LB IPAM read them alike.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;

/// The addresses in `status.loadBalancer.ingress` (hostnames skipped).
pub fn lb_ingress_ips(svc: &Service) -> Vec<IpAddr> {
    svc.status
        .iter()
        .flat_map(|s| s.load_balancer.iter())
        .flat_map(|l| l.ingress.iter().flatten())
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect()
}

/// `externalTrafficPolicy: Local`: only nodes with a ready endpoint may
/// take the Service's outside traffic (the client's address is kept).
pub fn external_local(svc: &Service) -> bool {
    svc.spec
        .as_ref()
        .and_then(|s| s.external_traffic_policy.as_deref())
        == Some("Local")
}
