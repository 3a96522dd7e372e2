//! udp: a TUN device `podnet.tun` holding the whole cluster network, and
//! podnet's userspace tunnel ([`crate::tunnel`]) carrying its packets to
//! the right node over UDP (flannel's udp backend, with TCP offload).
//! The TUN device exists only while this process holds it open, so it is
//! opened when the backend is made and cannot be repaired while running.

use std::net::Ipv4Addr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use podnet_kernel::{Handle, KernelError};

use crate::kernel::Device;
use crate::plan::{Desired, Dev, RouteSpec};
use crate::tunnel::UdpTunnel;

pub const DEV: &str = "podnet.tun";
/// Outer IPv4 + UDP headers.
pub const OVERHEAD: u32 = 28;

pub struct Udp {
    pub port: u16,
    tun: Option<std::fs::File>,
    tunnel: Option<UdpTunnel>,
}

impl Udp {
    pub fn new(port: u16) -> Self {
        Udp {
            port,
            tun: None,
            tunnel: None,
        }
    }

    /// Opens the TUN device (first call) and sets its MTU and state.
    pub fn ensure_device(&mut self, h: &mut Handle, mtu: u32) -> Result<Device, KernelError> {
        crate::kernel::ensure_tun(h, DEV, &mut self.tun, self.tunnel.is_some(), mtu)
    }

    /// Starts the tunnel's threads on the opened device.
    pub fn start(&mut self, underlay_ip: Ipv4Addr) -> Result<(), String> {
        let tun = self.tun.take().ok_or("the TUN device is not open")?;
        self.tunnel = Some(
            UdpTunnel::start(tun, underlay_ip, self.port)
                .map_err(|e| format!("starting UDP tunnel on port {}: {e}", self.port))?,
        );
        Ok(())
    }

    pub fn set_peers(&self, peers: Vec<(IpNet, Ipv4Addr)>) {
        if let Some(t) = &self.tunnel {
            t.set_table(peers);
        }
    }
}

/// One route per family: the whole network into the TUN device (the
/// IPv6 one too in a dual-stack cluster; it rides the IPv4 underlay).
pub fn plan(network: Ipv4Net, network6: Option<Ipv6Net>) -> (Desired, Vec<String>) {
    let mut want = Desired::default();
    for dst in std::iter::once(IpNet::V4(network)).chain(network6.map(IpNet::V6)) {
        want.routes.insert(RouteSpec {
            dst,
            gw: None,
            dev: Dev::Overlay,
            onlink: false,
        });
    }
    (want, Vec::new())
}
