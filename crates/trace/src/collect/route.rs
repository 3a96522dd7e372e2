//! The routing hops: the source pod's own route, its veth and bridge on
//! the node, and each node's routing decision with the backend that
//! carries the packet on (VXLAN, host-gw, the UDP tunnel, or the bridge).

use std::net::IpAddr;

use podnet_kernel::{Handle, Link, LinkKind, Netns};

use super::{open_netns, Node, Pod};
use crate::hops::{named, Hop, HopKind, Names};
use crate::TraceError;

/// The source pod's own routing decision.
pub(super) fn pod_route_hop(pod: &Pod, dst: IpAddr, names: &Names) -> Result<Hop, TraceError> {
    let ns = open_netns(&pod.netns)?;
    let (r, dev) = ns.run(|| -> Result<_, TraceError> {
        let mut h = Handle::new()?;
        let r = h.route_get(dst, None, None)?;
        let dev = match r.route.oif {
            Some(i) => h.link_by_index(i)?.map(|l| l.name).unwrap_or_default(),
            None => String::new(),
        };
        Ok((r, dev))
    })??;
    let prefix = r
        .route
        .dst
        .map(|d| d.to_string())
        .unwrap_or_else(|| "default".into());
    let via = r
        .route
        .gateway
        .map(|g| format!(" via {g}"))
        .unwrap_or_default();
    Ok(Hop::new(
        &pod.name,
        HopKind::PodRoute,
        format!(
            "{} -> {}: route {prefix}{via} dev {dev}",
            named(names, pod.ip),
            named(names, dst)
        ),
    )
    .with("route", prefix)
    .with(
        "via",
        r.route.gateway.map(|g| g.to_string()).unwrap_or_default(),
    )
    .with("dev", dev))
}

/// The pod's veth on the node and its bridge: the pod's interface names
/// its peer's index (IFLA_LINK), which the node resolves.
pub(super) fn veth_hop(pod: &Pod, node_ns: &Netns) -> Result<(Hop, Option<u32>), TraceError> {
    let pns = open_netns(&pod.netns)?;
    let (ifname, peer) = pns.run(|| -> Result<_, TraceError> {
        let mut h = Handle::new()?;
        let l = h
            .links()?
            .into_iter()
            .find(|l| l.kind == LinkKind::Veth)
            .ok_or_else(|| TraceError::Msg(format!("pod {} has no veth", pod.name)))?;
        Ok((l.name, l.peer))
    })??;
    let peer =
        peer.ok_or_else(|| TraceError::Msg(format!("{}'s {ifname} names no peer", pod.name)))?;
    let node = pod.node.clone().unwrap_or_default();
    let (host_if, bridge, bridge_index) = node_ns.run(|| -> Result<_, TraceError> {
        let mut h = Handle::new()?;
        let l = h
            .link_by_index(peer)?
            .ok_or_else(|| TraceError::Msg(format!("no link #{peer} on node {}", node)))?;
        let b = match l.master {
            Some(m) => h.link_by_index(m)?,
            None => None,
        };
        Ok((
            l.name,
            b.as_ref().map(|b| b.name.clone()),
            b.map(|b| b.index),
        ))
    })??;
    let summary = match &bridge {
        Some(b) => format!(
            "{ifname} -> veth {host_if} on {}, a port of bridge {b}",
            node
        ),
        None => format!("{ifname} -> veth {host_if} on {} (no bridge)", node),
    };
    Ok((
        Hop::new(&node, HopKind::Veth, summary)
            .with("pod_if", ifname)
            .with("host_if", host_if)
            .with("bridge", bridge.unwrap_or_default()),
        bridge_index,
    ))
}

/// A node's routing decision for a packet from `src` to `dst` that came
/// in on `iif`, and the backend that carries it: a VXLAN VTEP and the
/// remote node behind it (neighbour, then FDB entry), a host-gw next hop,
/// the UDP tunnel's TUN device, or local delivery.
pub(super) fn route_hop(
    node: &Node,
    ns: &Netns,
    src: IpAddr,
    dst: IpAddr,
    iif: Option<u32>,
    names: &Names,
    nodes: &[Node],
) -> Result<Hop, (String, String)> {
    let r = ns
        .run(|| -> Result<Hop, TraceError> {
            let mut h = Handle::new()?;
            let r = h.route_get(dst, Some(src), iif)?;
            let dev = match r.route.oif {
                Some(i) => h.link_by_index(i)?,
                None => None,
            };
            let prefix = r
                .route
                .dst
                .map(|d| d.to_string())
                .unwrap_or_else(|| "default".into());
            let via = r.route.gateway;
            let mut hop = Hop::new(&node.name, HopKind::Route, "")
                .with("route", &prefix)
                .with("type", r.kind_name())
                .with(
                    "dev",
                    dev.as_ref().map(|d| d.name.clone()).unwrap_or_default(),
                );
            if let Some(g) = via {
                hop = hop.with("via", g);
            }
            let devname = dev.as_ref().map(|d| d.name.clone()).unwrap_or_default();
            let (mut hop, backend) = match dev.as_ref() {
                _ if r.kind == 2 => (hop, "local delivery".to_string()),
                Some(d) if d.kind == LinkKind::Vxlan => vxlan_backend(&mut h, d, via, names, hop),
                Some(d) if d.kind == LinkKind::Tun => udp_backend(node, nodes, dst, &devname, hop),
                Some(d) if d.kind == LinkKind::Bridge => (
                    hop.with("backend", "bridge"),
                    format!("this node's bridge {devname}"),
                ),
                _ => gateway_backend(via, names, &devname, hop),
            };
            let via_s = via.map(|g| format!(" via {g}")).unwrap_or_default();
            hop.summary = format!(
                "route to {}: {prefix}{via_s} dev {devname} ({}); {backend}",
                named(names, dst),
                r.kind_name()
            );
            Ok(hop)
        })
        .map_err(|e| (node.name.clone(), e.to_string()))?;
    r.map_err(|e| (node.name.clone(), e.to_string()))
}

/// VXLAN: the next hop's neighbour entry gives the remote VTEP's MAC, and
/// the FDB entry for that MAC the VTEP's address (and so the node).
fn vxlan_backend(
    h: &mut Handle,
    d: &Link,
    via: Option<IpAddr>,
    names: &Names,
    mut hop: Hop,
) -> (Hop, String) {
    let devname = &d.name;
    let mac = via.and_then(|g| {
        h.neighbours(d.index, false)
            .ok()?
            .into_iter()
            .find(|n| n.dst == Some(g))
            .map(|n| n.mac)
    });
    let vtep = mac.and_then(|m| {
        h.neighbours(d.index, true)
            .ok()?
            .into_iter()
            .find(|n| n.mac == m)
            .and_then(|n| n.dst)
    });
    if let Some(v) = vtep {
        hop = hop.with("backend", "vxlan").with("vtep", v);
        if let Some(n) = names.get(&v) {
            hop = hop.with("remote_node", n);
        }
    }
    let summary = format!(
        "vxlan: {devname}, VTEP MAC {} -> remote {}",
        mac.map(|m| podnet_kernel::rtnl::format_mac(&m))
            .unwrap_or_else(|| "(no neighbour)".into()),
        vtep.map(|v| named(names, v))
            .unwrap_or_else(|| "(no FDB entry)".into())
    );
    (hop, summary)
}

/// The UDP tunnel: the agent encapsulates to the node whose subnet holds
/// the destination.
fn udp_backend(node: &Node, nodes: &[Node], dst: IpAddr, devname: &str, hop: Hop) -> (Hop, String) {
    let hop = hop.with("backend", "udp");
    let to = nodes
        .iter()
        .find(|n| n.name != node.name && n.subnets.iter().any(|s| s.contains(&dst)));
    match to {
        Some(n) => (
            hop.with("remote_node", &n.name),
            format!(
                "udp tunnel: {devname}, the agent encapsulates to {} (its subnet holds {dst})",
                n.name
            ),
        ),
        None => (
            hop,
            format!("udp tunnel: {devname} (the agent encapsulates)"),
        ),
    }
}

/// Any other device: a next hop that is a node (host-gw), one outside the
/// cluster network, or straight out.
fn gateway_backend(via: Option<IpAddr>, names: &Names, devname: &str, hop: Hop) -> (Hop, String) {
    match via {
        Some(g) if names.get(&g).is_some_and(|n| !n.contains('/')) => {
            let mut hop = hop.with("backend", "host-gw").with("next_hop", g);
            if let Some(n) = names.get(&g) {
                hop = hop.with("remote_node", n);
            }
            (
                hop,
                format!("host-gw: next hop {} on {devname}", named(names, g)),
            )
        }
        Some(g) => (
            hop.with("backend", "out").with("next_hop", g),
            format!("out of the cluster network: next hop {g} on {devname}"),
        ),
        None => (hop, format!("out {devname}")),
    }
}
