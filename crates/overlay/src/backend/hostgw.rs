//! host-gw: a route per remote node's subnet via its underlay address. No
//! device, no encapsulation; every node must be on one L2 segment, and a
//! node that is not is reported instead of routed. IPv6 pods (dual-stack)
//! would need IPv6 on the underlay (Linux routes no IPv6 prefix via an
//! IPv4 next hop): not supported yet, and reported per node.

use ipnet::Ipv4Net;

use crate::plan::{Desired, Dev, NodeView, RouteSpec};

pub struct HostGw;

pub fn plan(others: &[&NodeView], underlay: Ipv4Net) -> (Desired, Vec<String>) {
    let mut want = Desired::default();
    let mut problems = Vec::new();
    for n in others {
        if underlay.contains(&n.public_ip) {
            want.routes.insert(RouteSpec {
                dst: n.subnet.into(),
                gw: Some(n.public_ip.into()),
                dev: Dev::Underlay,
                onlink: false,
            });
            if let Some(six) = n.subnet6 {
                problems.push(format!(
                    "node {}'s IPv6 pods ({six}) are not routed: host-gw carries IPv6 only over an IPv6 underlay, which podnet does not support yet (use vxlan for dual-stack)",
                    n.name
                ));
            }
        } else {
            problems.push(format!(
                "node {} ({}) is not directly reachable from {underlay}: host-gw needs every node on one L2 segment",
                n.name, n.public_ip
            ));
        }
    }
    (want, problems)
}
