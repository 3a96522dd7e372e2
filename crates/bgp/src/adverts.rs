//! What a node advertises for Services (Calico's rules), pure: Services
//! and their EndpointSlices in, the prefixes this node originates out.
//!
//! - Each configured block (cluster IPs, external IPs, LoadBalancer IPs)
//!   is advertised whole from every node: a router spreads the Services
//!   that send anywhere (`externalTrafficPolicy: Cluster`) over all nodes.
//! - A Service with `externalTrafficPolicy: Local` keeps the client's
//!   address, so only a node with a ready endpoint of it may take its
//!   traffic: that node also advertises each of the Service's addresses
//!   inside a configured block as a host route (/32, /128), which the
//!   router prefers to the block; the last endpoint going withdraws it.
//! - An address outside every configured block is never advertised: the
//!   blocks are the operator's gate on what the fabric learns from us.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;

/// The blocks a cluster lets its nodes advertise (BGPConfiguration's
/// `serviceClusterIPs`, `serviceExternalIPs`, `serviceLoadBalancerIPs`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceBlocks {
    pub cluster_ips: Vec<IpNet>,
    pub external_ips: Vec<IpNet>,
    pub load_balancer_ips: Vec<IpNet>,
}

impl ServiceBlocks {
    pub fn is_empty(&self) -> bool {
        self.cluster_ips.is_empty()
            && self.external_ips.is_empty()
            && self.load_balancer_ips.is_empty()
    }
}

/// The prefixes `node` originates for Services: every block, and the host
/// routes of the Local Services it has a ready endpoint of.
pub fn service_routes<'a>(
    blocks: &ServiceBlocks,
    node: &str,
    services: impl IntoIterator<Item = (&'a Service, Vec<&'a EndpointSlice>)>,
) -> BTreeSet<IpNet> {
    let mut out = block_routes(blocks);
    for (svc, slices) in services {
        out.extend(host_routes(blocks, node, svc, &slices));
    }
    out
}

/// The configured blocks, advertised whole by every node.
pub fn block_routes(blocks: &ServiceBlocks) -> BTreeSet<IpNet> {
    blocks
        .cluster_ips
        .iter()
        .chain(&blocks.external_ips)
        .chain(&blocks.load_balancer_ips)
        .map(IpNet::trunc)
        .collect()
}

/// One Service's host routes from `node`: its addresses inside the
/// blocks, when it is Local and has a ready endpoint here; else none.
pub fn host_routes(
    blocks: &ServiceBlocks,
    node: &str,
    svc: &Service,
    slices: &[&EndpointSlice],
) -> BTreeSet<IpNet> {
    if !podnet_api::service::external_local(svc)
        || podnet_api::endpoints::ready_on(slices, node) == 0
    {
        return BTreeSet::new();
    }
    addresses(svc, blocks)
        .into_iter()
        .map(IpNet::from)
        .collect()
}

/// A Service's addresses that fall inside the block configured for their
/// kind.
fn addresses(svc: &Service, blocks: &ServiceBlocks) -> Vec<IpAddr> {
    let parse = |v: &[String]| -> Vec<IpAddr> { v.iter().filter_map(|s| s.parse().ok()).collect() };
    let inside = |ips: Vec<IpAddr>, gate: &[IpNet]| -> Vec<IpAddr> {
        ips.into_iter()
            .filter(|ip| gate.iter().any(|b| b.contains(ip)))
            .collect()
    };
    let spec = svc.spec.as_ref();
    let cluster = spec
        .and_then(|s| s.cluster_ips.as_deref())
        .map(parse)
        .unwrap_or_default();
    let external = spec
        .and_then(|s| s.external_ips.as_deref())
        .map(parse)
        .unwrap_or_default();
    let lb = podnet_api::service::lb_ingress_ips(svc);
    let mut out = inside(cluster, &blocks.cluster_ips);
    out.extend(inside(external, &blocks.external_ips));
    out.extend(inside(lb, &blocks.load_balancer_ips));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(policy: &str, extra: serde_json::Value) -> Service {
        let mut v = serde_json::json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {
                "type": "LoadBalancer",
                "clusterIPs": ["10.96.0.20"],
                "externalIPs": ["192.0.2.7", "203.0.113.9"],
                "externalTrafficPolicy": policy,
            },
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.5"}, {"ip": "2001:db8:5::5"}]}},
        });
        if let (Some(o), Some(e)) = (v["spec"].as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        serde_json::from_value(v).unwrap()
    }

    fn slice(eps: &[(&str, &str, bool)]) -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": eps.iter().map(|(ip, node, ready)| serde_json::json!({
                "addresses": [ip], "nodeName": node, "conditions": {"ready": ready}
            })).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    fn blocks() -> ServiceBlocks {
        ServiceBlocks {
            cluster_ips: vec!["10.96.0.0/12".parse().unwrap()],
            external_ips: vec!["192.0.2.0/24".parse().unwrap()],
            load_balancer_ips: vec![
                "198.51.100.0/24".parse().unwrap(),
                "2001:db8:5::/64".parse().unwrap(),
            ],
        }
    }

    fn nets(v: &[&str]) -> BTreeSet<IpNet> {
        v.iter().map(|s| s.parse().unwrap()).collect()
    }

    const BLOCKS: [&str; 4] = [
        "10.96.0.0/12",
        "192.0.2.0/24",
        "198.51.100.0/24",
        "2001:db8:5::/64",
    ];

    #[test]
    fn cluster_policy_services_ride_on_the_blocks() {
        let s = svc("Cluster", serde_json::json!({}));
        let sl = slice(&[("10.244.1.5", "node1", true)]);
        let got = service_routes(&blocks(), "node1", [(&s, vec![&sl])]);
        assert_eq!(got, nets(&BLOCKS));
    }

    /// Local: host routes from the node with a ready endpoint only, each
    /// address gated by its kind's block (203.0.113.9 is in none).
    #[test]
    fn local_services_add_host_routes_where_an_endpoint_is_ready() {
        let s = svc("Local", serde_json::json!({}));
        let sl = slice(&[
            ("10.244.1.5", "node1", true),
            ("10.244.2.5", "node2", false),
        ]);
        let mut want = nets(&BLOCKS);
        want.extend(nets(&[
            "10.96.0.20/32",
            "192.0.2.7/32",
            "198.51.100.5/32",
            "2001:db8:5::5/128",
        ]));
        assert_eq!(service_routes(&blocks(), "node1", [(&s, vec![&sl])]), want);
        assert_eq!(
            service_routes(&blocks(), "node2", [(&s, vec![&sl])]),
            nets(&BLOCKS),
            "node2's endpoint is not ready"
        );
        assert_eq!(
            service_routes(&blocks(), "node1", [(&s, vec![])]),
            nets(&BLOCKS)
        );
    }

    #[test]
    fn nothing_outside_the_configured_blocks() {
        let s = svc("Local", serde_json::json!({}));
        let sl = slice(&[("10.244.1.5", "node1", true)]);
        let only_lb = ServiceBlocks {
            load_balancer_ips: vec!["198.51.100.0/24".parse().unwrap()],
            ..Default::default()
        };
        assert_eq!(
            service_routes(&only_lb, "node1", [(&s, vec![&sl])]),
            nets(&["198.51.100.0/24", "198.51.100.5/32"])
        );
        assert!(service_routes(&ServiceBlocks::default(), "node1", [(&s, vec![&sl])]).is_empty());
    }
}
