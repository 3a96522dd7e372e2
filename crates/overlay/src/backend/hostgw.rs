//! host-gw: a route per remote node's subnet via its underlay address. No
//! device, no encapsulation; every node must be on one L2 segment, and a
//! node that is not is reported instead of routed. IPv6 pods (dual-stack)
//! are routed via the node's IPv6 underlay address (flannel's
//! `PublicIPv6`): Linux routes no IPv6 prefix via an IPv4 next hop, so a
//! node without one on this node's IPv6 segment is reported instead.

use ipnet::{Ipv4Net, Ipv6Net};

use crate::plan::{Desired, NodeView, RouteSpec};

pub struct HostGw;

pub fn plan(
    others: &[&NodeView],
    underlay: Ipv4Net,
    underlay6: Option<Ipv6Net>,
) -> (Desired, Vec<String>) {
    let mut want = Desired::default();
    let mut problems = Vec::new();
    for n in others {
        if underlay.contains(&n.public_ip) {
            want.routes
                .insert(RouteSpec::via_underlay(n.subnet, n.public_ip));
            if let Some(six) = n.subnet6 {
                match n.public_ip6.filter(|a| underlay6.is_some_and(|u| u.contains(a))) {
                    Some(gw6) => {
                        want.routes.insert(RouteSpec::via_underlay(six, gw6));
                    }
                    None => problems.push(format!(
                        "node {}'s IPv6 pods ({six}) are not routed: host-gw needs both nodes' IPv6 underlay addresses on one segment (this node: {}, it: {})",
                        n.name,
                        underlay6.map_or("none".into(), |u| u.to_string()),
                        n.public_ip6.map_or("none".into(), |a| a.to_string()),
                    )),
                }
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
