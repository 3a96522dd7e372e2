//! The backends, one job each (flannel's design): how this node reaches
//! the other nodes' pod subnets. Picked once from the network config into
//! the [`Backend`] enum, which is the only `match` on the backend type:
//!
//! - [`vxlan`]: a VTEP, and per remote node a route via its VTEP address,
//!   a permanent neighbour and an FDB entry (or a plain route on the same
//!   segment with `DirectRouting`);
//! - [`hostgw`]: a route per remote node via its underlay address (every
//!   node on one L2 segment);
//! - [`udp`]: a TUN device and podnet's userspace tunnel (for networks
//!   where nothing else passes);
//! - [`bgp`]: no device; the node's BGP speaker spreads its pod CIDR to a
//!   mesh of the other nodes and the routes it learns are installed;
//! - [`wireguard`]: with `Encrypt`, in place of vxlan, host-gw or udp: a
//!   TUN device and the agent's WireGuard tunnel.

pub mod bgp;
pub mod hostgw;
pub mod udp;
pub mod vxlan;
pub mod wireguard;

use std::net::Ipv4Addr;
use std::path::Path;

use podnet_api::netconfig::{BackendType, Resolved};
use podnet_kernel::{Handle, KernelError};

use crate::kernel::{Device, Underlay};
use crate::plan::{Desired, Nets, NodeView};

/// The configured backend.
pub enum Backend {
    Vxlan(vxlan::Vxlan),
    HostGw(hostgw::HostGw),
    Udp(udp::Udp),
    Bgp(bgp::Bgp),
    Wireguard(wireguard::Wireguard),
}

impl Backend {
    /// The configured backend; with `Encrypt`, the WireGuard tunnel with
    /// the node's key from `state_dir` (made there on first start).
    pub fn from_config(cfg: &Resolved, state_dir: &Path) -> Result<Backend, String> {
        if cfg.encrypt {
            let key = wireguard::Wireguard::key_path(state_dir);
            return wireguard::Wireguard::new(crate::wg::PORT, &key).map(Backend::Wireguard);
        }
        Ok(match cfg.backend {
            BackendType::Vxlan => Backend::Vxlan(vxlan::Vxlan {
                vni: cfg.vni,
                port: cfg.port,
                direct_routing: cfg.direct_routing,
            }),
            BackendType::HostGw => Backend::HostGw(hostgw::HostGw),
            BackendType::Udp => Backend::Udp(udp::Udp::new(cfg.port)),
            BackendType::Bgp => Backend::Bgp(bgp::Bgp::new(bgp::DEFAULT_ASN)),
        })
    }

    /// The name flannel uses (in subnet leases and node annotations).
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Vxlan(_) => "vxlan",
            Backend::HostGw(_) => "host-gw",
            Backend::Udp(_) => "udp",
            Backend::Bgp(_) => "bgp",
            Backend::Wireguard(_) => "wireguard",
        }
    }

    /// Pod MTU: the underlay's minus the encapsulation.
    pub fn mtu(&self, underlay_mtu: u32) -> u32 {
        match self {
            Backend::Vxlan(_) => underlay_mtu - vxlan::OVERHEAD,
            Backend::HostGw(_) | Backend::Bgp(_) => underlay_mtu,
            Backend::Udp(_) => underlay_mtu - udp::OVERHEAD,
            Backend::Wireguard(_) => wireguard::mtu(underlay_mtu),
        }
    }

    /// The backend's own device, if it has one.
    pub fn device_name(&self) -> Option<&'static str> {
        match self {
            Backend::Vxlan(_) => Some(vxlan::DEV),
            Backend::HostGw(_) | Backend::Bgp(_) => None,
            Backend::Udp(_) => Some(udp::DEV),
            Backend::Wireguard(_) => Some(wireguard::DEV),
        }
    }

    /// Creates, adopts or repairs the backend's device.
    pub fn ensure_device(
        &mut self,
        h: &mut Handle,
        underlay: &Underlay,
        mtu: u32,
    ) -> Result<Option<Device>, KernelError> {
        match self {
            Backend::Vxlan(v) => v.ensure_device(h, underlay, mtu).map(Some),
            Backend::HostGw(_) | Backend::Bgp(_) => Ok(None),
            Backend::Udp(u) => u.ensure_device(h, mtu).map(Some),
            Backend::Wireguard(w) => w.ensure_device(h, mtu).map(Some),
        }
    }

    /// What other nodes need to reach this one (flannel's BackendData).
    pub fn data(&self, device: Option<Device>) -> serde_json::Value {
        match self {
            Backend::Vxlan(v) => v.data(device),
            Backend::Wireguard(w) => w.data(),
            Backend::HostGw(_) | Backend::Udp(_) | Backend::Bgp(_) => serde_json::json!({}),
        }
    }

    /// This node's tunnel endpoint (address, UDP port): its packets are
    /// exempt from connection tracking.
    pub fn tunnel(&self, underlay_ip: Ipv4Addr) -> Option<(Ipv4Addr, u16)> {
        match self {
            Backend::Vxlan(v) => Some((underlay_ip, v.port)),
            Backend::HostGw(_) | Backend::Bgp(_) => None,
            Backend::Udp(u) => Some((underlay_ip, u.port)),
            Backend::Wireguard(w) => Some((underlay_ip, w.port)),
        }
    }

    /// The routes, neighbours and FDB entries to reach every other node;
    /// nodes this backend cannot reach are reported, not planned. Pure.
    pub fn plan(&self, nets: &Nets, me: &NodeView, nodes: &[NodeView]) -> (Desired, Vec<String>) {
        let Nets {
            network, underlay, ..
        } = *nets;
        let others: Vec<&NodeView> = nodes
            .iter()
            .filter(|n| n.name != me.name && n.subnet != me.subnet)
            .collect();
        match self {
            Backend::Vxlan(v) => v.plan(&others, underlay),
            Backend::HostGw(_) => hostgw::plan(&others, underlay, nets.underlay6),
            Backend::Udp(_) => udp::plan(network, nets.network6),
            Backend::Bgp(b) => b.plan(me, &others, nets),
            Backend::Wireguard(_) => wireguard::plan(network, nets.network6, &others),
        }
    }

    /// Starts what runs beside the kernel (the UDP tunnel's threads).
    pub fn start(&mut self, underlay_ip: Ipv4Addr) -> Result<(), String> {
        match self {
            Backend::Udp(u) => u.start(underlay_ip),
            Backend::Wireguard(w) => w.start(underlay_ip),
            _ => Ok(()),
        }
    }

    /// Tells what runs beside the kernel where every node is: the
    /// userspace tunnel the other nodes' subnets, the BGP speaker this
    /// node's own (which it originates).
    pub fn set_peers(&self, me: &NodeView, peers: &[NodeView]) {
        match self {
            Backend::Udp(u) => u.set_peers(
                peers
                    .iter()
                    .flat_map(|n| subnets(n).map(|s| (s, n.public_ip)))
                    .collect(),
            ),
            Backend::Wireguard(w) => w.set_peers(
                peers
                    .iter()
                    .filter_map(|n| Some((subnets(n).collect(), n.public_ip, n.wg_key?)))
                    .collect(),
            ),
            Backend::Bgp(b) => b.originate(me.subnet, me.subnet6),
            _ => {}
        }
    }

    /// Where routes learned from a routing protocol come from (taken
    /// once, by whoever feeds the overlay's loop).
    pub fn take_learned(
        &mut self,
    ) -> Option<tokio::sync::mpsc::Receiver<Vec<podnet_bgp::rib::Change>>> {
        match self {
            Backend::Bgp(b) => b.take_changes(),
            _ => None,
        }
    }

    /// Whether it carries the pods' IPv6 traffic in a dual-stack cluster.
    pub fn carries_ipv6(&self) -> bool {
        !matches!(self, Backend::Bgp(_))
    }

    /// The encrypted overlay's counters (for metrics).
    pub fn wg_counters(&self) -> Option<&crate::wg::Counters> {
        match self {
            Backend::Wireguard(w) => w.tunnel().map(|t| t.counters.as_ref()),
            _ => None,
        }
    }

    /// Whether a vanished device can be recreated while running (a TUN
    /// device dies with the descriptor that made it).
    pub fn device_repairable(&self) -> bool {
        !matches!(self, Backend::Udp(_) | Backend::Wireguard(_))
    }
}

/// A node's pod subnets: its IPv4 one, and its IPv6 one if dual-stack.
fn subnets(n: &NodeView) -> impl Iterator<Item = ipnet::IpNet> {
    std::iter::once(n.subnet.into()).chain(n.subnet6.map(Into::into))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{diff, Dev, FdbSpec, NeighSpec, RouteSpec};
    use ipnet::Ipv4Net;

    fn node(name: &str, subnet: &str, ip: &str, mac: u8) -> NodeView {
        NodeView {
            name: name.into(),
            subnet: subnet.parse().unwrap(),
            subnet6: None,
            public_ip: ip.parse().unwrap(),
            public_ip6: None,
            vtep_mac: Some([2, 0, 0, 0, 0, mac]),
            wg_key: None,
        }
    }

    fn nodes() -> Vec<NodeView> {
        vec![
            node("a", "10.244.1.0/24", "192.168.9.1", 1),
            node("b", "10.244.2.0/24", "192.168.9.2", 2),
            node("c", "10.244.3.0/24", "10.0.0.3", 3),
        ]
    }

    fn vxlan(direct_routing: bool) -> Backend {
        Backend::Vxlan(vxlan::Vxlan {
            vni: 1,
            port: 8472,
            direct_routing,
        })
    }

    fn net() -> Ipv4Net {
        "10.244.0.0/16".parse().unwrap()
    }

    fn seg() -> Ipv4Net {
        "192.168.9.0/24".parse().unwrap()
    }

    /// The networks of the tests' cluster, with this IPv6 underlay.
    fn nets(underlay6: Option<ipnet::Ipv6Net>) -> Nets {
        Nets {
            network: net(),
            network6: Some("fd00:10:244::/56".parse().unwrap()),
            underlay: seg(),
            underlay6,
        }
    }

    #[test]
    fn vxlan_plans_route_neigh_fdb_per_remote() {
        let n = nodes();
        let (d, p) = vxlan(false).plan(&nets(None), &n[0], &n);
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
        let (d, _) = vxlan(true).plan(&nets(None), &n[0], &n);
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
        let (d, p) = Backend::HostGw(hostgw::HostGw).plan(&nets(None), &n[0], &n);
        assert_eq!(d.routes.len(), 1);
        assert_eq!(p.len(), 1);
        assert!(
            p[0].contains("node c (10.0.0.3) is not directly reachable"),
            "{}",
            p[0]
        );
    }

    #[test]
    fn udp_routes_the_whole_network_into_the_tunnel() {
        let n = nodes();
        let udp = Backend::Udp(udp::Udp::new(8285));
        let (d, p) = udp.plan(&nets(None), &n[0], &n);
        assert!(p.is_empty());
        let dsts: Vec<String> = d.routes.iter().map(|r| r.dst.to_string()).collect();
        assert_eq!(dsts, ["10.244.0.0/16", "fd00:10:244::/56"], "both families");
        let single = Nets {
            network6: None,
            ..nets(None)
        };
        assert_eq!(udp.plan(&single, &n[0], &n).0.routes.len(), 1);
    }

    #[test]
    fn the_encrypted_overlay_fails_closed_on_nodes_without_a_key() {
        let mut n = nodes();
        n[1].wg_key = Some([7; 32]);
        let others: Vec<&NodeView> = n[1..].iter().collect();
        let (d, p) = wireguard::plan(net(), None, &others);
        assert_eq!(d.routes.len(), 1, "the whole network into the tunnel");
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].contains("node c (10.0.0.3) publishes no WireGuard key"),
            "{}",
            p[0]
        );
    }

    /// Dual-stack: the VTEP carries each node's IPv6 subnet too (route
    /// via its VTEP's IPv6 address, a neighbour entry with the same MAC,
    /// one FDB entry); host-gw routes it via an IPv6 underlay, and says
    /// why not without one.
    #[test]
    fn vxlan_and_host_gw_carry_ipv6_pods() {
        let mut n = nodes();
        for (i, v) in n.iter_mut().enumerate() {
            v.subnet6 = Some(format!("fd00:10:244:{}::/64", i + 1).parse().unwrap());
        }
        let (d, p) = vxlan(false).plan(&nets(None), &n[0], &n);
        assert!(p.is_empty(), "{p:?}");
        assert_eq!((d.routes.len(), d.neighs.len(), d.fdbs.len()), (4, 4, 2));
        assert!(d.routes.contains(&RouteSpec {
            dst: "fd00:10:244:2::/64".parse().unwrap(),
            gw: Some("fd00:10:244:2::".parse().unwrap()),
            dev: Dev::Overlay,
            onlink: true
        }));
        assert!(d.neighs.contains(&NeighSpec {
            ip: "fd00:10:244:2::".parse().unwrap(),
            mac: [2, 0, 0, 0, 0, 2]
        }));
        // DirectRouting: IPv4 plainly, IPv6 still through the VTEP.
        let (d, _) = vxlan(true).plan(&nets(None), &n[0], &n);
        assert!(d.routes.contains(&RouteSpec {
            dst: "fd00:10:244:2::/64".parse().unwrap(),
            gw: Some("fd00:10:244:2::".parse().unwrap()),
            dev: Dev::Overlay,
            onlink: true
        }));
        // host-gw without an IPv6 underlay: IPv4 only, and says why.
        let (d, p) = Backend::HostGw(hostgw::HostGw).plan(&nets(None), &n[0], &n);
        assert_eq!(d.routes.len(), 1);
        assert!(
            p.iter()
                .any(|m| m.contains("node b's IPv6 pods (fd00:10:244:2::/64) are not routed")),
            "{p:?}"
        );
        // With one: via the node's IPv6 underlay address on the segment.
        let seg6: ipnet::Ipv6Net = "fd00:192:168:9::/64".parse().unwrap();
        n[1].public_ip6 = Some("fd00:192:168:9::2".parse().unwrap());
        let (d, p) = Backend::HostGw(hostgw::HostGw).plan(&nets(Some(seg6)), &n[0], &n);
        assert!(d.routes.contains(&RouteSpec {
            dst: "fd00:10:244:2::/64".parse().unwrap(),
            gw: Some("fd00:192:168:9::2".parse().unwrap()),
            dev: Dev::Underlay,
            onlink: false
        }));
        assert_eq!(d.routes.len(), 2, "node c is off both segments");
        assert_eq!(p.len(), 1, "{p:?}");
    }

    #[test]
    fn diff_is_empty_when_converged_and_exact_otherwise() {
        let n = nodes();
        let (want, _) = vxlan(false).plan(&nets(None), &n[0], &n);
        assert!(diff(&want, &want).is_empty());
        let (less, _) = vxlan(false).plan(&nets(None), &n[0], &n[..2]);
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
        assert_eq!(vxlan(false).mtu(1500), 1450);
        assert_eq!(Backend::Udp(udp::Udp::new(8285)).mtu(1500), 1472);
        assert_eq!(Backend::HostGw(hostgw::HostGw).mtu(1500), 1500);
    }
}
