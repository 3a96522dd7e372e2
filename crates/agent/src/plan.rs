//! The pure core of the node agent: from this node's lease and everyone
//! else's, the routes, neighbour entries and FDB entries the kernel should
//! hold; and the difference between that and what it holds now.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use podnet_api::netconfig::BackendType;

/// What the plan needs to know about one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub subnet: Ipv4Net,
    pub public_ip: Ipv4Addr,
    pub vtep_mac: Option<[u8; 6]>,
}

/// Which device a route leaves through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dev {
    /// The backend's device (VTEP or TUN).
    Overlay,
    /// The node's underlay interface.
    Underlay,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteSpec {
    pub dst: Ipv4Net,
    pub gw: Option<Ipv4Addr>,
    pub dev: Dev,
    pub onlink: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NeighSpec {
    pub ip: Ipv4Addr,
    pub mac: [u8; 6],
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FdbSpec {
    pub mac: [u8; 6],
    pub dst: Ipv4Addr,
}

/// The kernel state one node should have for reaching the others.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    pub routes: BTreeSet<RouteSpec>,
    pub neighs: BTreeSet<NeighSpec>,
    pub fdbs: BTreeSet<FdbSpec>,
}

/// Everything that must change to go from `have` to `want`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    pub add_routes: Vec<RouteSpec>,
    pub del_routes: Vec<RouteSpec>,
    pub add_neighs: Vec<NeighSpec>,
    pub del_neighs: Vec<NeighSpec>,
    pub add_fdbs: Vec<FdbSpec>,
    pub del_fdbs: Vec<FdbSpec>,
}

impl Diff {
    pub fn is_empty(&self) -> bool {
        self.ops() == 0
    }
    pub fn ops(&self) -> usize {
        self.add_routes.len()
            + self.del_routes.len()
            + self.add_neighs.len()
            + self.del_neighs.len()
            + self.add_fdbs.len()
            + self.del_fdbs.len()
    }
}

pub fn diff(want: &Desired, have: &Desired) -> Diff {
    fn d<T: Ord + Clone>(a: &BTreeSet<T>, b: &BTreeSet<T>) -> Vec<T> {
        a.difference(b).cloned().collect()
    }
    Diff {
        add_routes: d(&want.routes, &have.routes),
        del_routes: d(&have.routes, &want.routes),
        add_neighs: d(&want.neighs, &have.neighs),
        del_neighs: d(&have.neighs, &want.neighs),
        add_fdbs: d(&want.fdbs, &have.fdbs),
        del_fdbs: d(&have.fdbs, &want.fdbs),
    }
}

/// Plans the kernel state for `me` given every node's lease. Nodes that
/// cannot be reached with this backend are reported, not planned.
pub fn plan(
    backend: BackendType,
    network: Ipv4Net,
    me: &NodeView,
    nodes: &[NodeView],
    underlay: Ipv4Net,
    direct_routing: bool,
) -> (Desired, Vec<String>) {
    let mut want = Desired::default();
    let mut problems = Vec::new();
    if backend == BackendType::Udp {
        want.routes.insert(RouteSpec {
            dst: network,
            gw: None,
            dev: Dev::Overlay,
            onlink: false,
        });
        return (want, problems);
    }
    for n in nodes
        .iter()
        .filter(|n| n.name != me.name && n.subnet != me.subnet)
    {
        let same_l2 = underlay.contains(&n.public_ip);
        match backend {
            BackendType::HostGw => {
                if same_l2 {
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
            BackendType::Vxlan => {
                if direct_routing && same_l2 {
                    want.routes.insert(RouteSpec {
                        dst: n.subnet,
                        gw: Some(n.public_ip),
                        dev: Dev::Underlay,
                        onlink: false,
                    });
                    continue;
                }
                let Some(mac) = n.vtep_mac else {
                    problems.push(format!("node {} has no VTEP MAC in its lease yet", n.name));
                    continue;
                };
                let vtep = n.subnet.network();
                want.routes.insert(RouteSpec {
                    dst: n.subnet,
                    gw: Some(vtep),
                    dev: Dev::Overlay,
                    onlink: true,
                });
                want.neighs.insert(NeighSpec { ip: vtep, mac });
                want.fdbs.insert(FdbSpec {
                    mac,
                    dst: n.public_ip,
                });
            }
            BackendType::Udp => unreachable!("handled above"),
        }
    }
    (want, problems)
}

/// MTU for pods: the underlay's minus the backend's encapsulation.
pub fn mtu(backend: BackendType, underlay_mtu: u32) -> u32 {
    match backend {
        BackendType::Vxlan => underlay_mtu - 50,
        BackendType::Udp => underlay_mtu - 28,
        BackendType::HostGw => underlay_mtu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, subnet: &str, ip: &str, mac: u8) -> NodeView {
        NodeView {
            name: name.into(),
            subnet: subnet.parse().unwrap(),
            public_ip: ip.parse().unwrap(),
            vtep_mac: Some([2, 0, 0, 0, 0, mac]),
        }
    }

    fn nodes() -> Vec<NodeView> {
        vec![
            node("a", "10.244.1.0/24", "192.168.9.1", 1),
            node("b", "10.244.2.0/24", "192.168.9.2", 2),
            node("c", "10.244.3.0/24", "10.0.0.3", 3),
        ]
    }

    #[test]
    fn vxlan_plans_route_neigh_fdb_per_remote() {
        let n = nodes();
        let (d, p) = plan(
            BackendType::Vxlan,
            "10.244.0.0/16".parse().unwrap(),
            &n[0],
            &n,
            "192.168.9.0/24".parse().unwrap(),
            false,
        );
        assert!(p.is_empty());
        assert_eq!(d.routes.len(), 2);
        assert!(d.routes.contains(&RouteSpec {
            dst: "10.244.2.0/24".parse().unwrap(),
            gw: Some("10.244.2.0".parse().unwrap()),
            dev: Dev::Overlay,
            onlink: true
        }));
        assert!(d.neighs.contains(&NeighSpec {
            ip: "10.244.3.0".parse().unwrap(),
            mac: [2, 0, 0, 0, 0, 3]
        }));
        assert!(d.fdbs.contains(&FdbSpec {
            mac: [2, 0, 0, 0, 0, 3],
            dst: "10.0.0.3".parse().unwrap()
        }));
    }

    #[test]
    fn direct_routing_uses_plain_routes_on_the_same_segment() {
        let n = nodes();
        let (d, _) = plan(
            BackendType::Vxlan,
            "10.244.0.0/16".parse().unwrap(),
            &n[0],
            &n,
            "192.168.9.0/24".parse().unwrap(),
            true,
        );
        assert!(d.routes.contains(&RouteSpec {
            dst: "10.244.2.0/24".parse().unwrap(),
            gw: Some("192.168.9.2".parse().unwrap()),
            dev: Dev::Underlay,
            onlink: false
        }));
        assert_eq!(
            d.fdbs.len(),
            1,
            "only the off-segment node goes through the VTEP"
        );
    }

    #[test]
    fn host_gw_reports_unreachable_nodes() {
        let n = nodes();
        let (d, p) = plan(
            BackendType::HostGw,
            "10.244.0.0/16".parse().unwrap(),
            &n[0],
            &n,
            "192.168.9.0/24".parse().unwrap(),
            false,
        );
        assert_eq!(d.routes.len(), 1);
        assert_eq!(p.len(), 1);
        assert!(
            p[0].contains("node c (10.0.0.3) is not directly reachable"),
            "{}",
            p[0]
        );
    }

    #[test]
    fn diff_is_empty_when_converged_and_exact_otherwise() {
        let n = nodes();
        let (want, _) = plan(
            BackendType::Vxlan,
            "10.244.0.0/16".parse().unwrap(),
            &n[0],
            &n,
            "192.168.9.0/24".parse().unwrap(),
            false,
        );
        assert!(diff(&want, &want).is_empty());
        let (less, _) = plan(
            BackendType::Vxlan,
            "10.244.0.0/16".parse().unwrap(),
            &n[0],
            &n[..2],
            "192.168.9.0/24".parse().unwrap(),
            false,
        );
        let d = diff(&less, &want);
        assert_eq!(
            (
                d.del_routes.len(),
                d.del_neighs.len(),
                d.del_fdbs.len(),
                d.add_routes.len()
            ),
            (1, 1, 1, 0)
        );
        assert_eq!(mtu(BackendType::Vxlan, 1500), 1450);
        assert_eq!(mtu(BackendType::Udp, 1500), 1472);
    }
}
