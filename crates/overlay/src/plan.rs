//! The overlay's pure data: the routes, neighbour entries and FDB entries
//! the kernel should hold (each backend plans them, [`crate::backend`]),
//! and the difference between that and what it holds now.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// What the plan needs to know about one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub subnet: Ipv4Net,
    /// Its IPv6 pod subnet, in a dual-stack cluster.
    pub subnet6: Option<Ipv6Net>,
    pub public_ip: Ipv4Addr,
    /// Its IPv6 underlay address (dual-stack over an IPv6 underlay).
    pub public_ip6: Option<Ipv6Addr>,
    pub vtep_mac: Option<[u8; 6]>,
    /// Its WireGuard public key (the encrypted overlay).
    pub wg_key: Option<[u8; 32]>,
}

/// The networks a plan is made in: the pod networks (the IPv6 one in a
/// dual-stack cluster) and this node's underlay segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nets {
    pub network: Ipv4Net,
    pub network6: Option<Ipv6Net>,
    pub underlay: Ipv4Net,
    pub underlay6: Option<Ipv6Net>,
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
    pub dst: IpNet,
    pub gw: Option<IpAddr>,
    pub dev: Dev,
    pub onlink: bool,
}

impl RouteSpec {
    /// A plain route via a next hop on the underlay (host-gw, BGP,
    /// VXLAN's direct routing), of either family.
    pub fn via_underlay(dst: impl Into<IpNet>, gw: impl Into<IpAddr>) -> RouteSpec {
        RouteSpec {
            dst: dst.into(),
            gw: Some(gw.into()),
            dev: Dev::Underlay,
            onlink: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NeighSpec {
    pub ip: IpAddr,
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
