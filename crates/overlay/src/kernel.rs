//! The agent's kernel edge: the underlay, the backend device, observing the
//! routes/neighbours/FDB entries podnet owns, and applying a [`Diff`].
//!
//! podnet's routes carry their own protocol number ([`RTPROT_PODNET`]) so
//! they are told apart from everyone else's without any local bookkeeping;
//! neighbour and FDB entries are ours if they are permanent and on our VTEP.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use podnet_kernel::neigh::NUD_PERMANENT;
use podnet_kernel::{Handle, KernelError, LinkKind, Neigh, Route};

use crate::plan::{Desired, Dev, Diff, FdbSpec, NeighSpec, RouteSpec};

/// The rtnetlink protocol number marking podnet's routes.
pub const RTPROT_PODNET: u8 = 112;
pub use crate::backend::udp::DEV as TUN_DEV;
pub use crate::backend::vxlan::DEV as VXLAN_DEV;
pub use crate::backend::wireguard::DEV as WG_DEV;

#[derive(Debug, Clone)]
pub struct Underlay {
    pub index: u32,
    pub name: String,
    pub ip: Ipv4Addr,
    pub net: Ipv4Net,
    pub mtu: u32,
    /// Its global IPv6 address and prefix, if it has one (an IPv6
    /// underlay, for host-gw's IPv6 routes in a dual-stack cluster).
    pub ip6: Option<Ipv6Net>,
}

/// Finds the node's underlay: `--iface`, else the default route's device,
/// else the first non-loopback interface with an IPv4 address.
pub fn find_underlay(h: &mut Handle, iface: Option<&str>) -> Result<Underlay, KernelError> {
    let links = h.links()?;
    let addrs = h.addrs(0)?;
    let v4 = |idx: u32| {
        addrs.iter().find_map(|a| match a.net {
            IpNet::V4(n) if a.index == idx && a.scope == 0 => Some(n),
            _ => None,
        })
    };
    let v6 = |idx: u32| {
        addrs.iter().find_map(|a| match a.net {
            IpNet::V6(n) if a.index == idx && a.scope == 0 => Some(n),
            _ => None,
        })
    };
    let pick = |idx: u32| -> Option<Underlay> {
        let l = links.iter().find(|l| l.index == idx)?;
        let n = v4(idx)?;
        Some(Underlay {
            index: idx,
            name: l.name.clone(),
            ip: n.addr(),
            net: n.trunc(),
            mtu: l.mtu,
            ip6: v6(idx),
        })
    };
    if let Some(name) = iface {
        let l = links
            .iter()
            .find(|l| l.name == name)
            .ok_or_else(|| KernelError::Other(format!("--iface {name}: no such interface")))?;
        return pick(l.index)
            .ok_or_else(|| KernelError::Other(format!("--iface {name}: has no IPv4 address")));
    }
    let default = h
        .routes(false, None)?
        .into_iter()
        .find(|r| r.dst.is_none())
        .and_then(|r| r.oif);
    if let Some(u) = default.and_then(pick) {
        return Ok(u);
    }
    links
        .iter()
        .filter(|l| l.name != "lo" && !l.name.starts_with("podnet") && l.kind != LinkKind::Bridge)
        .find_map(|l| pick(l.index))
        .ok_or_else(|| {
            KernelError::Other("no interface with an IPv4 address found; pass --iface".into())
        })
}

/// The backend device: its index and (for a VTEP) its MAC.
pub type Device = (u32, Option<[u8; 6]>);

/// A userspace tunnel's TUN device `name`: opened into `held` unless it
/// is open or already handed to the running tunnel, with its MTU set and
/// up. (A TUN device lives as long as its descriptor.)
pub fn ensure_tun(
    h: &mut Handle,
    name: &str,
    held: &mut Option<std::fs::File>,
    running: bool,
    mtu: u32,
) -> Result<Device, KernelError> {
    if held.is_none() && !running {
        *held = Some(podnet_kernel::tun::open_tun(name)?);
    }
    let l = h.require_link(name)?;
    if l.mtu != mtu {
        h.set_mtu(l.index, mtu)?;
    }
    if !l.is_up() {
        h.set_up(l.index)?;
    }
    Ok((l.index, None))
}

/// Gives the overlay device exactly one address per family: the subnet's
/// network address as a /32 (flannel's layout), and in a dual-stack
/// cluster the IPv6 subnet's as a /128, so node-originated traffic has a
/// source inside the cluster network. (IPv6 link-local addresses stay.)
pub fn ensure_overlay_addr(
    h: &mut Handle,
    index: u32,
    subnet: Ipv4Net,
    subnet6: Option<ipnet::Ipv6Net>,
) -> Result<(), KernelError> {
    let four = IpNet::V4(Ipv4Net::new(subnet.network(), 32).expect("/32"));
    let six = subnet6.map(|s| IpNet::V6(ipnet::Ipv6Net::new(s.network(), 128).expect("/128")));
    let have = h.addrs(index)?;
    let ours = |a: &IpNet| match a {
        IpNet::V4(_) => true,
        IpNet::V6(n) => n.addr().segments()[0] & 0xffc0 != 0xfe80,
    };
    for a in have
        .iter()
        .filter(|a| a.net != four && Some(a.net) != six && ours(&a.net))
    {
        h.del_addr(index, a.net)?;
    }
    for want in std::iter::once(four).chain(six) {
        if !have.iter().any(|a| a.net == want) {
            h.add_addr(index, want, true)?;
        }
    }
    Ok(())
}

/// What podnet currently has in the kernel.
pub fn observe(
    h: &mut Handle,
    overlay: Option<u32>,
    underlay: &Underlay,
) -> Result<Desired, KernelError> {
    let mut d = Desired::default();
    let mut all = h.routes(false, None)?;
    all.extend(h.routes(true, None)?);
    for r in all {
        if r.protocol != Some(RTPROT_PODNET) {
            continue;
        }
        let Some(dst) = r.dst else {
            continue;
        };
        let dev = if r.oif.is_some() && r.oif == overlay {
            Dev::Overlay
        } else if r.oif == Some(underlay.index) {
            Dev::Underlay
        } else {
            // Ours, but on a device we do not use any more: it must go.
            Dev::Underlay
        };
        d.routes.insert(RouteSpec {
            dst,
            gw: r.gateway,
            dev,
            onlink: r.onlink,
        });
    }
    if let Some(ov) = overlay {
        for n in h.neighbours(ov, false)? {
            if n.state & NUD_PERMANENT != 0 {
                if let Some(ip) = n.dst {
                    d.neighs.insert(NeighSpec { ip, mac: n.mac });
                }
            }
        }
        for n in h.neighbours(ov, true)? {
            if n.state & NUD_PERMANENT != 0 && n.mac != [0; 6] {
                if let Some(IpAddr::V4(ip)) = n.dst {
                    d.fdbs.insert(FdbSpec {
                        mac: n.mac,
                        dst: ip,
                    });
                }
            }
        }
    }
    Ok(d)
}

fn kroute(r: &RouteSpec, overlay: Option<u32>, underlay: &Underlay) -> Route {
    Route {
        dst: Some(r.dst),
        gateway: r.gw,
        v6: r.dst.addr().is_ipv6(),
        oif: Some(match r.dev {
            Dev::Overlay => overlay.unwrap_or(underlay.index),
            Dev::Underlay => underlay.index,
        }),
        protocol: Some(RTPROT_PODNET),
        onlink: r.onlink,
        scope: Some(if r.gw.is_some() { 0 } else { 253 }),
        ..Default::default()
    }
}

/// Applies a diff; returns how many operations succeeded and the failures.
pub fn apply(
    h: &mut Handle,
    diff: &Diff,
    overlay: Option<u32>,
    underlay: &Underlay,
) -> (usize, Vec<String>) {
    let mut done = 0;
    let mut errs = Vec::new();
    let mut run = |r: Result<(), KernelError>| match r {
        Ok(()) => done += 1,
        Err(e) if e.is_not_found() => done += 1,
        Err(e) => errs.push(e.to_string()),
    };
    for r in &diff.del_routes {
        let mut kr = kroute(r, overlay, underlay);
        kr.oif = None;
        kr.scope = None;
        run(h.del_route(&kr));
    }
    let ov = overlay.unwrap_or(0);
    // A permanent entry on the overlay device: an FDB entry (VTEP) or a
    // neighbour (ARP).
    let entry = |dst: IpAddr, mac, fdb| Neigh {
        ifindex: ov,
        dst: Some(dst),
        mac,
        state: NUD_PERMANENT,
        fdb,
    };
    for f in &diff.del_fdbs {
        run(h.del_neighbour(&entry(f.dst.into(), f.mac, true)));
    }
    for n in &diff.del_neighs {
        run(h.del_neighbour(&entry(n.ip, n.mac, false)));
    }
    for f in &diff.add_fdbs {
        run(h.set_neighbour(&entry(f.dst.into(), f.mac, true)));
    }
    for n in &diff.add_neighs {
        run(h.set_neighbour(&entry(n.ip, n.mac, false)));
    }
    for r in &diff.add_routes {
        run(h.replace_route(&kroute(r, overlay, underlay)));
    }
    (done, errs)
}

/// Removes every route podnet owns (for --cleanup).
pub fn remove_all(h: &mut Handle, underlay: &Underlay) -> Result<usize, KernelError> {
    let overlay = h
        .link(VXLAN_DEV)?
        .or(h.link(TUN_DEV)?)
        .or(h.link(WG_DEV)?)
        .map(|l| l.index);
    let have = observe(h, overlay, underlay)?;
    let d = crate::plan::diff(&Desired::default(), &have);
    let (n, errs) = apply(h, &d, overlay, underlay);
    if let Some(e) = errs.first() {
        return Err(KernelError::Other(e.clone()));
    }
    for dev in [VXLAN_DEV, TUN_DEV, WG_DEV] {
        h.delete_link_by_name(dev)?;
    }
    Ok(n)
}

/// The set of cluster-network routes, for tests that compare kernel state.
pub fn snapshot(h: &mut Handle) -> Result<BTreeSet<String>, KernelError> {
    let mut out = BTreeSet::new();
    let mut all = h.routes(false, None)?;
    all.extend(h.routes(true, None)?);
    for r in all
        .into_iter()
        .filter(|r| r.protocol == Some(RTPROT_PODNET))
    {
        out.insert(format!(
            "{:?} via {:?} dev {:?} onlink {}",
            r.dst, r.gateway, r.oif, r.onlink
        ));
    }
    Ok(out)
}
