//! Who a node peers with (Calico's rules), pure: the other nodes and the
//! configured routers in, this node's neighbours out.
//!
//! - By default every node peers with every other node (a full iBGP mesh
//!   in the cluster's AS).
//! - Once some nodes are route reflectors, the mesh gives way: a
//!   reflector peers with every node (the ordinary ones as its clients,
//!   the other reflectors as plain iBGP), an ordinary node only with the
//!   reflectors.
//! - With the mesh turned off, only configured peers remain.
//! - A configured peer (a top-of-rack router, `BGPPeer`) comes on top,
//!   for every node or the ones it selects; one that names a node's own
//!   address is left out with a problem, not sent to the speaker.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::export::Neighbour;

/// One node as the topology sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub ip: IpAddr,
    pub reflector: bool,
}

/// A configured peer that applies to this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Configured {
    pub ip: IpAddr,
    pub asn: u32,
    pub bfd: bool,
}

/// The cluster-wide settings that shape the mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mesh {
    pub asn: u32,
    pub enabled: bool,
    /// BFD with every node (the cluster's BGPConfiguration has `bfd`).
    pub bfd: bool,
}

/// This node's neighbours among the other nodes; GTSM with those on this
/// node's own segment (`segment`), which are one hop away.
pub fn mesh(me: &Node, nodes: &[Node], m: Mesh, segment: Option<IpNet>) -> Vec<Neighbour> {
    let any_reflector = nodes.iter().any(|n| n.reflector) || me.reflector;
    let others = nodes.iter().filter(|n| n.name != me.name && n.ip != me.ip);
    let mut out: Vec<Neighbour> = others
        .filter(|n| {
            if any_reflector {
                me.reflector || n.reflector
            } else {
                m.enabled
            }
        })
        .map(|n| Neighbour {
            addr: n.ip,
            asn: m.asn,
            client: me.reflector && !n.reflector,
            ttl_security: segment.is_some_and(|s| s.contains(&n.ip)),
            bfd: m.bfd,
        })
        .collect();
    out.sort_by_key(|n| n.addr);
    out.dedup_by_key(|n| n.addr);
    out
}

/// The configured peers, less any that is this node itself; the
/// problems name what was left out.
pub fn configured(me: &Node, peers: &[Configured]) -> (Vec<Neighbour>, Vec<String>) {
    let mut problems = Vec::new();
    let mut out = Vec::new();
    for p in peers {
        if p.ip == me.ip {
            problems.push(format!(
                "BGPPeer {} is node {} itself; not peered",
                p.ip, me.name
            ));
            continue;
        }
        if !out.iter().any(|n: &Neighbour| n.addr == p.ip) {
            // A router's TTL is its own configuration's: GTSM only where
            // both ends agree, and a BGPPeer cannot say so yet.
            out.push(Neighbour {
                addr: p.ip,
                asn: p.asn,
                client: false,
                ttl_security: false,
                bfd: p.bfd,
            });
        }
    }
    (out, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(i: u8, reflector: bool) -> Node {
        Node {
            name: format!("n{i}"),
            ip: IpAddr::from([192, 168, 200, 10 + i]),
            reflector,
        }
    }

    fn addrs(v: &[Neighbour]) -> Vec<u8> {
        v.iter()
            .map(|n| match n.addr {
                IpAddr::V4(a) => a.octets()[3] - 10,
                IpAddr::V6(_) => 0,
            })
            .collect()
    }

    const MESH: Mesh = Mesh {
        asn: 64512,
        enabled: true,
        bfd: false,
    };

    #[test]
    fn a_full_mesh_by_default_and_nothing_when_it_is_off() {
        let nodes = vec![node(1, false), node(2, false), node(3, false)];
        let seg: IpNet = "192.168.200.0/24".parse().unwrap();
        let got = mesh(&nodes[0], &nodes, MESH, Some(seg));
        assert_eq!(addrs(&got), vec![2, 3]);
        assert!(got
            .iter()
            .all(|n| n.asn == 64512 && !n.client && n.ttl_security));
        // A node beyond a router is more than one hop away: no GTSM.
        let far: IpNet = "192.168.201.0/24".parse().unwrap();
        assert!(mesh(&nodes[0], &nodes, MESH, Some(far))
            .iter()
            .all(|n| !n.ttl_security));
        let off = Mesh {
            enabled: false,
            ..MESH
        };
        assert!(mesh(&nodes[0], &nodes, off, None).is_empty());
    }

    /// Reflectors peer with everyone (ordinary nodes as clients); the
    /// others only with the reflectors, mesh or no mesh.
    #[test]
    fn route_reflectors_replace_the_mesh() {
        let nodes = vec![node(1, true), node(2, true), node(3, false), node(4, false)];
        let rr = mesh(&nodes[0], &nodes, MESH, None);
        assert_eq!(addrs(&rr), vec![2, 3, 4]);
        let clients: Vec<bool> = rr.iter().map(|n| n.client).collect();
        assert_eq!(clients, vec![false, true, true]);
        let plain = mesh(&nodes[2], &nodes, MESH, None);
        assert_eq!(addrs(&plain), vec![1, 2]);
        assert!(plain.iter().all(|n| !n.client));
    }

    #[test]
    fn a_configured_peer_that_is_the_node_itself_is_left_out() {
        let me = node(1, false);
        let peers = [
            Configured {
                ip: me.ip,
                asn: 64513,
                bfd: false,
            },
            Configured {
                ip: "192.168.200.254".parse().unwrap(),
                asn: 64513,
                bfd: true,
            },
        ];
        let (got, problems) = configured(&me, &peers);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].asn, 64513);
        assert_eq!(
            problems,
            vec!["BGPPeer 192.168.200.11 is node n1 itself; not peered"]
        );
    }
}
