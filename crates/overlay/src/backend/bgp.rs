//! bgp: no device and no encapsulation; every node is a BGP router
//! (Calico's way). The node's speaker (`podnet_bgp`) originates its pod
//! CIDR and peers with every other node in a full iBGP mesh (AS 64512 by
//! default); the best route to each other node's CIDR goes into the
//! kernel via the next hop it was learned with.
//!
//! Who is a neighbour is the agent's business (`podnet_agent::bgp`: the
//! mesh, route reflectors, configured routers, from the Node objects), so
//! a node that joins or leaves changes the mesh without a restart. Only
//! prefixes inside the cluster network are installed, and only via a next
//! hop on the underlay's segment: a peer cannot steer the node's other
//! traffic, and a node beyond a router is reported, not half-routed.
//!
//! The agent starts the node's speaker (shared with the Service
//! announcer) and attaches it here. Its best-route changes come into the
//! overlay's loop as [`crate::OverlayInput::Learned`], and the loop plans
//! from them like any other input (pure); its apply hands the speaker the
//! node's own CIDR. In a dual-stack cluster the same sessions carry IPv6
//! unicast too (MP-BGP): each node originates its IPv6 subnet with its
//! IPv6 underlay address as the next hop, and learned IPv6 routes go in
//! via next hops on the IPv6 segment.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use podnet_bgp::bfd::Timing;
use podnet_bgp::export::NextHops;
use podnet_bgp::fsm::Config;
use podnet_bgp::node::NodeSpeaker;
use podnet_bgp::rib::{Change, Local};
use podnet_bgp::speaker::SpeakerConfig;
use podnet_bgp::wire::{Afi, Safi};
use tokio::sync::mpsc;

use crate::plan::{Desired, Nets, NodeView, RouteSpec};

/// The owner of the node's pod CIDR on the node's speaker.
pub const OWNER: &str = "pod-cidr";

/// The private AS Calico and kube-router give a cluster by default.
pub const DEFAULT_ASN: u32 = 64512;

/// How long a peer keeps this node's routes after the agent stops without
/// a goodbye (an upgrade, a crash): RFC 4724's restart time.
const RESTART_TIME: u16 = 120;

/// How long after a start the routes already in the kernel stay while
/// the peers' tables come in (unless every node's is in sooner).
const SETTLE: Duration = Duration::from_secs(30);

pub struct Bgp {
    pub asn: u32,
    speaker: Option<Arc<NodeSpeaker>>,
    runtime: Option<tokio::runtime::Handle>,
    /// The best route's next hop per learned IPv4 prefix.
    learned: BTreeMap<Ipv4Net, Ipv4Addr>,
    /// The same for IPv6 prefixes (dual-stack).
    learned6: BTreeMap<Ipv6Net, Ipv6Addr>,
    changes: Option<mpsc::Receiver<Vec<Change>>>,
    started: Option<Instant>,
    /// Latched: once settled, a lost route is a lost route.
    settled: AtomicBool,
}

impl Bgp {
    pub fn new(asn: u32) -> Bgp {
        Bgp {
            asn,
            speaker: None,
            runtime: None,
            learned: BTreeMap::new(),
            learned6: BTreeMap::new(),
            changes: None,
            started: None,
            settled: AtomicBool::new(false),
        }
    }

    /// The node's speaker, on its underlay address: iBGP with the other
    /// nodes, graceful restart, IPv4 unicast, and IPv6 unicast with `ip6`
    /// (a dual-stack node's IPv6 underlay address, its IPv6 next hop). It
    /// waits for neighbours.
    pub fn speaker_config(&self, ip: Ipv4Addr, ip6: Option<Ipv6Addr>) -> SpeakerConfig {
        let mut families = vec![(Afi::Ipv4, Safi::Unicast)];
        if ip6.is_some() {
            families.push((Afi::Ipv6, Safi::Unicast));
        }
        SpeakerConfig {
            local: Local {
                asn: self.asn,
                router_id: ip,
                // Set always: reflection happens only towards neighbours
                // marked as clients (a reflector's, by the topology).
                cluster_id: Some(ip),
            },
            hops: NextHops { v4: ip, v6: ip6 },
            listen: IpAddr::V4(ip),
            session: Config {
                local_as: self.asn,
                peer_as: self.asn,
                router_id: ip,
                hold_time: 90,
                connect_retry: Duration::from_secs(1),
                passive: false,
                families,
                graceful_restart: Some((RESTART_TIME, false)),
                // Per neighbour (the topology's: on for the mesh on this
                // node's segment).
                ttl_security: false,
            },
            neighbours: Vec::new(),
            // For the neighbours that ask for it (BGPConfiguration's and
            // BGPPeer's `bfd`): a dead peer is dropped in 300 ms.
            bfd: Some(Timing {
                desired_min_tx: Duration::from_millis(100),
                required_min_rx: Duration::from_millis(100),
                detect_mult: 3,
            }),
        }
    }

    /// Takes the node's speaker (the agent starts it and shares it with
    /// the Service announcer) and its best-route changes.
    pub fn attach(&mut self, speaker: Arc<NodeSpeaker>, changes: mpsc::Receiver<Vec<Change>>) {
        self.speaker = Some(speaker);
        self.changes = Some(changes);
        self.runtime = tokio::runtime::Handle::try_current().ok();
        self.started = Some(Instant::now());
    }

    /// The speaker's best-route changes, for the overlay's loop (taken
    /// once).
    pub fn take_changes(&mut self) -> Option<mpsc::Receiver<Vec<Change>>> {
        self.changes.take()
    }

    /// Takes in best-route changes (IPv4, and IPv6 in a dual-stack
    /// cluster).
    /// A next hop beyond this node's segment (a node in another rack) is
    /// resolved through the underlay's own routes to the gateway that
    /// reaches it (the top-of-rack router, which learned the pod CIDR from
    /// that node): BGP's recursive next hop.
    pub fn learn(&mut self, changes: Vec<Change>, segment: Ipv4Net) {
        // Many routes share a next hop: each is resolved once per batch,
        // over one netlink socket opened only if one is off the segment.
        let mut resolver = Resolver {
            segment,
            handle: None,
            done: BTreeMap::new(),
        };
        for (prefix, best) in changes {
            match (prefix, best.map(|r| r.next_hop)) {
                (IpNet::V4(p), Some(IpAddr::V4(nh))) => {
                    self.learned.insert(p, resolver.resolve(nh));
                }
                (IpNet::V4(p), _) => {
                    self.learned.remove(&p);
                }
                // IPv6 next hops are taken as learned (the plan installs
                // only those on the IPv6 segment).
                (IpNet::V6(p), Some(IpAddr::V6(nh))) => {
                    self.learned6.insert(p, nh);
                }
                (IpNet::V6(p), _) => {
                    self.learned6.remove(&p);
                }
            }
        }
    }

    /// Hands the speaker this node's CIDR to originate (the speaker hears
    /// only a change). Runs in the loop's apply, on a blocking thread.
    pub fn originate(&self, mine: Ipv4Net, mine6: Option<Ipv6Net>) {
        let (Some(speaker), Some(rt)) = (&self.speaker, &self.runtime) else {
            return;
        };
        let own = std::iter::once(IpNet::V4(mine))
            .chain(mine6.map(IpNet::V6))
            .collect();
        rt.block_on(speaker.set_routes(OWNER, own));
    }

    /// Whether routes may be taken out of the kernel: not while a started
    /// (or restarted) agent is still hearing its peers' tables, so a
    /// restart never drops a route that is coming back (the kernel keeps
    /// forwarding, as graceful restart's peers keep ours). Settled once a
    /// route to every other node's subnet is learned, or after
    /// [`SETTLE`]; from then on (a peer that goes away later is kept by
    /// graceful restart in the RIB, not here).
    pub fn settled(&self, others: &[Ipv4Net]) -> bool {
        if self.settled.load(Ordering::Relaxed) {
            return true;
        }
        let learned = |s: &Ipv4Net| self.learned.keys().any(|l| l.contains(s));
        let now = self.started.is_none_or(|t| t.elapsed() >= SETTLE) || others.iter().all(learned);
        self.settled.store(now, Ordering::Relaxed);
        now
    }

    pub fn plan(&self, me: &NodeView, others: &[&NodeView], nets: &Nets) -> (Desired, Vec<String>) {
        let (mut want, mut problems) = plan(&self.learned, me, others, nets.network, nets.underlay);
        let (want6, problems6) = plan6(&self.learned6, me, others, nets);
        want.routes.extend(want6.routes);
        problems.extend(problems6);
        (want, problems)
    }
}

/// Next hops resolved for one batch of best-route changes.
struct Resolver {
    segment: Ipv4Net,
    handle: Option<podnet_kernel::Handle>,
    done: BTreeMap<Ipv4Addr, Ipv4Addr>,
}

impl Resolver {
    /// The gateway on the segment the kernel reaches `nh` through (`nh`
    /// itself when it is on the segment or cannot be resolved; the plan
    /// reports it then).
    fn resolve(&mut self, nh: Ipv4Addr) -> Ipv4Addr {
        if self.segment.contains(&nh) {
            return nh;
        }
        if let Some(gw) = self.done.get(&nh) {
            return *gw;
        }
        if self.handle.is_none() {
            self.handle = podnet_kernel::Handle::new().ok();
        }
        let via = self
            .handle
            .as_mut()
            .and_then(|h| h.route_get(IpAddr::V4(nh), None, None).ok())
            .and_then(|r| r.route.gateway);
        let gw = match via {
            Some(IpAddr::V4(gw)) if self.segment.contains(&gw) => gw,
            _ => nh,
        };
        self.done.insert(nh, gw);
        gw
    }
}

/// A route per learned prefix inside another node's leased subnet, via
/// its next hop on the underlay. Pure.
pub fn plan(
    learned: &BTreeMap<Ipv4Net, Ipv4Addr>,
    me: &NodeView,
    others: &[&NodeView],
    network: Ipv4Net,
    underlay: Ipv4Net,
) -> (Desired, Vec<String>) {
    let mut want = Desired::default();
    let mut problems = Vec::new();
    for (dst, nh) in learned {
        if !network.contains(dst) || dst.contains(&me.subnet) || me.subnet.contains(dst) {
            continue;
        }
        // Only inside a subnet another node holds now: a released lease's
        // route (kept by its peers through graceful restart) never
        // competes with the node that leases the subnet next.
        if !others.iter().any(|n| n.subnet.contains(dst)) {
            continue;
        }
        if !underlay.contains(nh) {
            problems.push(format!(
                "BGP route {dst} via {nh}: the next hop is not on {underlay}; not installed"
            ));
            continue;
        }
        want.routes.insert(RouteSpec::via_underlay(*dst, *nh));
    }
    (want, problems)
}

/// [`plan`] for IPv6: a route per learned prefix inside another node's
/// IPv6 subnet, via its next hop on the IPv6 underlay segment. Pure.
pub fn plan6(
    learned: &BTreeMap<Ipv6Net, Ipv6Addr>,
    me: &NodeView,
    others: &[&NodeView],
    nets: &Nets,
) -> (Desired, Vec<String>) {
    let mut want = Desired::default();
    let mut problems = Vec::new();
    let Some(network6) = nets.network6 else {
        return (want, problems);
    };
    for (dst, nh) in learned {
        let mine = me
            .subnet6
            .is_some_and(|m| m.contains(dst) || dst.contains(&m));
        let leased = others
            .iter()
            .any(|n| n.subnet6.is_some_and(|s| s.contains(dst)));
        if !network6.contains(dst) || mine || !leased {
            continue;
        }
        if !nets.underlay6.is_some_and(|u| u.contains(nh)) {
            problems.push(format!(
                "BGP route {dst} via {nh}: the next hop is not on this node's IPv6 segment; not installed"
            ));
            continue;
        }
        want.routes.insert(RouteSpec::via_underlay(*dst, *nh));
    }
    (want, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Dev;

    fn me() -> NodeView {
        NodeView {
            name: "a".into(),
            subnet: "10.244.1.0/24".parse().unwrap(),
            subnet6: None,
            public_ip6: None,
            public_ip: "192.168.9.1".parse().unwrap(),
            vtep_mac: None,
            wg_key: None,
        }
    }

    fn learned(routes: &[(&str, &str)]) -> BTreeMap<Ipv4Net, Ipv4Addr> {
        routes
            .iter()
            .map(|(p, nh)| (p.parse().unwrap(), nh.parse().unwrap()))
            .collect()
    }

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    /// Nodes b, c, d hold 10.244.2-4.0/24.
    fn leased() -> Vec<&'static NodeView> {
        static NODES: std::sync::OnceLock<Vec<NodeView>> = std::sync::OnceLock::new();
        NODES
            .get_or_init(|| {
                (2..=4)
                    .map(|i| NodeView {
                        name: format!("n{i}"),
                        subnet: format!("10.244.{i}.0/24").parse().unwrap(),
                        subnet6: None,
                        public_ip6: None,
                        public_ip: format!("192.168.9.{i}").parse().unwrap(),
                        vtep_mac: None,
                        wg_key: None,
                    })
                    .collect()
            })
            .iter()
            .collect()
    }

    /// A route to a subnet no node leases (a released lease, kept by
    /// graceful restart at the peers) is not installed.
    /// IPv6: learned routes into other nodes' IPv6 subnets go in via
    /// next hops on the IPv6 segment; anything else is left out or
    /// reported.
    #[test]
    fn ipv6_routes_via_the_ipv6_segment() {
        let mut me = me();
        me.subnet6 = Some("fd00:10:244:1::/64".parse().unwrap());
        let mut other = (*leased()[0]).clone();
        other.subnet6 = Some("fd00:10:244:2::/64".parse().unwrap());
        let learned: BTreeMap<Ipv6Net, Ipv6Addr> = [
            ("fd00:10:244:2::/64", "fd00:192:168:9::2"),
            ("fd00:10:244:1::/64", "fd00:192:168:9::1"),
            ("fd00:10:244:3::/64", "fd00:192:168:9::3"),
            ("2001:db8::/64", "fd00:192:168:9::2"),
        ]
        .iter()
        .map(|(p, n)| (p.parse().unwrap(), n.parse().unwrap()))
        .collect();
        let mut nets = Nets {
            network: "10.244.0.0/16".parse().unwrap(),
            network6: Some("fd00:10:244::/56".parse().unwrap()),
            underlay: "192.168.9.0/24".parse().unwrap(),
            underlay6: Some("fd00:192:168:9::/64".parse().unwrap()),
        };
        let (d, p) = plan6(&learned, &me, &[&other], &nets);
        assert!(p.is_empty(), "{p:?}");
        let routes: Vec<String> = d
            .routes
            .iter()
            .map(|r| format!("{} via {}", r.dst, r.gw.unwrap()))
            .collect();
        assert_eq!(routes, ["fd00:10:244:2::/64 via fd00:192:168:9::2"]);
        nets.underlay6 = None;
        let (d, p) = plan6(&learned, &me, &[&other], &nets);
        assert!(d.routes.is_empty());
        assert_eq!(p.len(), 1, "{p:?}");
    }

    #[test]
    fn only_subnets_other_nodes_lease_are_installed() {
        let l = learned(&[
            ("10.244.2.0/24", "192.168.9.2"),
            ("10.244.9.0/24", "192.168.9.9"),
        ]);
        let (d, _) = plan(
            &l,
            &me(),
            &leased(),
            net("10.244.0.0/16"),
            net("192.168.9.0/24"),
        );
        let dsts: Vec<ipnet::IpNet> = d.routes.iter().map(|r| r.dst).collect();
        assert_eq!(dsts, vec![ipnet::IpNet::V4(net("10.244.2.0/24"))]);
    }

    #[test]
    fn a_route_per_learned_subnet_via_its_next_hop() {
        let l = learned(&[
            ("10.244.2.0/24", "192.168.9.2"),
            ("10.244.3.0/24", "192.168.9.3"),
        ]);
        let (d, p) = plan(
            &l,
            &me(),
            &leased(),
            net("10.244.0.0/16"),
            net("192.168.9.0/24"),
        );
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(d.routes.len(), 2);
        assert!(d.routes.contains(&RouteSpec {
            dst: net("10.244.3.0/24").into(),
            gw: Some("192.168.9.3".parse().unwrap()),
            dev: Dev::Underlay,
            onlink: false,
        }));
        assert!(d.neighs.is_empty() && d.fdbs.is_empty());
    }

    /// A peer cannot steer other traffic or this node's own pods: a
    /// default route, a prefix outside the cluster network, one covering
    /// or inside this node's subnet are never installed.
    #[test]
    fn only_other_subnets_of_the_cluster_network_are_installed() {
        let l = learned(&[
            ("0.0.0.0/0", "192.168.9.2"),
            ("10.96.0.0/12", "192.168.9.2"),
            ("10.244.0.0/16", "192.168.9.2"),
            ("10.244.1.128/25", "192.168.9.2"),
            ("10.244.2.0/24", "192.168.9.2"),
        ]);
        let (d, p) = plan(
            &l,
            &me(),
            &leased(),
            net("10.244.0.0/16"),
            net("192.168.9.0/24"),
        );
        assert!(p.is_empty(), "{p:?}");
        let dsts: Vec<ipnet::IpNet> = d.routes.iter().map(|r| r.dst).collect();
        assert_eq!(dsts, vec![ipnet::IpNet::V4(net("10.244.2.0/24"))]);
    }

    #[test]
    fn a_next_hop_off_the_segment_is_reported_not_installed() {
        let l = learned(&[("10.244.4.0/24", "10.0.0.4")]);
        let (d, p) = plan(
            &l,
            &me(),
            &leased(),
            net("10.244.0.0/16"),
            net("192.168.9.0/24"),
        );
        assert!(d.routes.is_empty());
        assert_eq!(p.len(), 1);
        assert!(p[0].contains("10.244.4.0/24 via 10.0.0.4"), "{}", p[0]);
    }

    #[test]
    fn settled_once_every_other_subnet_is_learned() {
        assert!(
            Bgp::new(DEFAULT_ASN).settled(&[net("10.244.2.0/24")]),
            "never started"
        );
        let mut b = Bgp::new(DEFAULT_ASN);
        b.started = Some(Instant::now());
        assert!(!b.settled(&[net("10.244.2.0/24")]));
        b.learned = learned(&[("10.244.2.0/24", "192.168.9.2")]);
        assert!(!b.settled(&[net("10.244.2.0/24"), net("10.244.3.0/24")]));
        assert!(b.settled(&[net("10.244.2.0/24")]));
        // Latched: a node lost later no longer holds deletions back.
        b.learned.clear();
        assert!(b.settled(&[net("10.244.2.0/24")]));
    }
}
