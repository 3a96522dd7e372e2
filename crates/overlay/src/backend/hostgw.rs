//! host-gw: a route per remote node's subnet via its underlay address. No
//! device, no encapsulation; every node must be on one L2 segment, and a
//! node that is not is reported instead of routed.

use ipnet::Ipv4Net;

use crate::plan::{Desired, Dev, NodeView, RouteSpec};

pub struct HostGw;

pub fn plan(others: &[&NodeView], underlay: Ipv4Net) -> (Desired, Vec<String>) {
    let mut want = Desired::default();
    let mut problems = Vec::new();
    for n in others {
        if underlay.contains(&n.public_ip) {
            want.routes.insert(RouteSpec {
                dst: n.subnet,
                gw: Some(n.public_ip),
                dev: Dev::Underlay,
                onlink: false,
            });
        } else {
            problems.push(format!(
                "node {} ({}) is not directly reachable from {underlay}: host-gw needs every node on one L2 segment",
                n.name, n.public_ip
            ));
        }
    }
    (want, problems)
}
