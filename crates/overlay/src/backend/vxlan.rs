//! vxlan: the kernel's VTEP `podnet.1` (VNI and UDP port from the config,
//! learning off), and per remote node a route to its subnet via its VTEP
//! address (the subnet's network address, on-link), a permanent neighbour
//! entry for that address with the remote VTEP's MAC, and an FDB entry
//! sending that MAC to the node's underlay address. With `DirectRouting`,
//! nodes on the same segment get a plain route instead, as with host-gw.
//! In a dual-stack cluster the same VTEP carries IPv6 pods inside the
//! IPv4 underlay: a route to the node's IPv6 subnet via its VTEP's IPv6
//! address (that subnet's network address), and a permanent neighbour
//! entry for it with the same MAC.

use std::net::IpAddr;

use ipnet::Ipv4Net;
use podnet_kernel::{Handle, KernelError, LinkKind, VxlanOpts};

use crate::kernel::{Device, Underlay};
use crate::plan::{Desired, Dev, FdbSpec, NeighSpec, NodeView, RouteSpec};

pub const DEV: &str = "podnet.1";
/// Outer IPv4 + UDP + VXLAN + inner Ethernet headers.
pub const OVERHEAD: u32 = 50;

pub struct Vxlan {
    pub vni: u32,
    pub port: u16,
    pub direct_routing: bool,
}

impl Vxlan {
    pub fn plan(&self, others: &[&NodeView], underlay: Ipv4Net) -> (Desired, Vec<String>) {
        let mut want = Desired::default();
        let mut problems = Vec::new();
        for n in others {
            let direct = self.direct_routing && underlay.contains(&n.public_ip);
            if direct {
                want.routes
                    .insert(RouteSpec::via_underlay(n.subnet, n.public_ip));
                if n.subnet6.is_none() {
                    continue;
                }
            }
            let Some(mac) = n.vtep_mac else {
                problems.push(format!("node {} has no VTEP MAC in its lease yet", n.name));
                continue;
            };
            // (IPv6 always crosses the VTEP: the underlay is IPv4.)
            let mut nets: Vec<ipnet::IpNet> = n.subnet6.into_iter().map(Into::into).collect();
            if !direct {
                nets.push(n.subnet.into());
            }
            for net in nets {
                let vtep = net.network();
                want.routes.insert(RouteSpec {
                    dst: net,
                    gw: Some(vtep),
                    dev: Dev::Overlay,
                    onlink: true,
                });
                want.neighs.insert(NeighSpec { ip: vtep, mac });
            }
            want.fdbs.insert(FdbSpec {
                mac,
                dst: n.public_ip,
            });
        }
        (want, problems)
    }

    /// Creates or adopts the VTEP (replacing anything else by its name),
    /// with the right MTU, up.
    pub fn ensure_device(
        &self,
        h: &mut Handle,
        u: &Underlay,
        mtu: u32,
    ) -> Result<Device, KernelError> {
        let create = |h: &mut Handle| -> Result<podnet_kernel::Link, KernelError> {
            h.create_vxlan(&VxlanOpts {
                name: DEV.into(),
                vni: self.vni,
                port: self.port,
                local: Some(IpAddr::V4(u.ip)),
                link: Some(u.index),
                mtu: Some(mtu),
                mac: None,
            })?;
            h.require_link(DEV)
        };
        let link = match h.link(DEV)? {
            Some(l) if l.kind == LinkKind::Vxlan => l,
            Some(l) => {
                // Something else by our name: replace it.
                h.delete_link(l.index)?;
                create(h)?
            }
            None => create(h)?,
        };
        if link.mtu != mtu {
            h.set_mtu(link.index, mtu)?;
        }
        if !link.is_up() {
            h.set_up(link.index)?;
        }
        Ok((link.index, link.mac))
    }

    /// `{"VNI": …, "VtepMAC": "…"}`, as flannel publishes it.
    pub fn data(&self, device: Option<Device>) -> serde_json::Value {
        match device.and_then(|(_, m)| m) {
            Some(m) => serde_json::json!({
                "VNI": self.vni,
                "VtepMAC": podnet_kernel::rtnl::format_mac(&m),
            }),
            None => serde_json::json!({}),
        }
    }
}
