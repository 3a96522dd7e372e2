//! The userspace UDP backend, as flannel's `udp` mode: packets the kernel
//! routes into the TUN device are read by the agent, looked up by
//! destination in the lease table, and sent whole inside a UDP datagram to
//! the owning node's agent, which writes them into its own TUN device.
//!
//! It costs two copies and two syscalls per packet, so it exists for
//! comparison and for kernels without VXLAN.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ipnet::Ipv4Net;

/// Where each remote subnet's agent listens.
pub type Table = Arc<RwLock<Vec<(Ipv4Net, Ipv4Addr)>>>;

pub struct UdpTunnel {
    pub table: Table,
    stop: Arc<AtomicBool>,
    pub sent: Arc<AtomicU64>,
    pub received: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// The destination of an IPv4 packet.
pub fn ipv4_dst(pkt: &[u8]) -> Option<Ipv4Addr> {
    if pkt.len() < 20 || pkt[0] >> 4 != 4 {
        return None;
    }
    Some(Ipv4Addr::new(pkt[16], pkt[17], pkt[18], pkt[19]))
}

/// Which node's agent takes a packet for `dst`.
pub fn lookup(table: &[(Ipv4Net, Ipv4Addr)], dst: Ipv4Addr) -> Option<Ipv4Addr> {
    table
        .iter()
        .find(|(n, _)| n.contains(&dst))
        .map(|(_, ip)| *ip)
}

impl UdpTunnel {
    pub fn start(tun: File, bind: Ipv4Addr, port: u16) -> std::io::Result<UdpTunnel> {
        let sock = UdpSocket::bind(SocketAddrV4::new(bind, port))?;
        sock.set_read_timeout(Some(Duration::from_millis(200)))?;
        let table: Table = Arc::new(RwLock::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (sent, received) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut tun_w = tun.try_clone()?;
        let mut tun_r = tun;
        let sock_r = sock.try_clone()?;
        let mut threads = Vec::new();
        {
            let (table, stop, sent) = (table.clone(), stop.clone(), sent.clone());
            threads.push(std::thread::Builder::new().name("udp-encap".into()).spawn(
                move || {
                    let mut buf = vec![0u8; 65536];
                    let fd = tun_r.as_raw_fd();
                    while !stop.load(Ordering::Relaxed) {
                        let mut pfd = libc::pollfd {
                            fd,
                            events: libc::POLLIN,
                            revents: 0,
                        };
                        // SAFETY: one valid pollfd.
                        if unsafe { libc::poll(&mut pfd, 1, 200) } <= 0 {
                            continue;
                        }
                        let Ok(n) = tun_r.read(&mut buf) else {
                            continue;
                        };
                        let Some(dst) = ipv4_dst(&buf[..n]) else {
                            continue;
                        };
                        let to = lookup(&table.read().unwrap_or_else(|p| p.into_inner()), dst);
                        if let Some(to) = to {
                            if sock.send_to(&buf[..n], SocketAddrV4::new(to, port)).is_ok() {
                                sent.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                },
            )?);
        }
        {
            let (stop, received) = (stop.clone(), received.clone());
            threads.push(std::thread::Builder::new().name("udp-decap".into()).spawn(
                move || {
                    let mut buf = vec![0u8; 65536];
                    while !stop.load(Ordering::Relaxed) {
                        let Ok((n, _)) = sock_r.recv_from(&mut buf) else {
                            continue;
                        };
                        if ipv4_dst(&buf[..n]).is_some() && tun_w.write_all(&buf[..n]).is_ok() {
                            received.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                },
            )?);
        }
        Ok(UdpTunnel {
            table,
            stop,
            sent,
            received,
            threads,
        })
    }

    pub fn set_table(&self, t: Vec<(Ipv4Net, Ipv4Addr)>) {
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = t;
    }
}

impl Drop for UdpTunnel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packet_routing() {
        let mut p = vec![0u8; 20];
        p[0] = 0x45;
        p[16..20].copy_from_slice(&[10, 244, 2, 9]);
        assert_eq!(ipv4_dst(&p), Some("10.244.2.9".parse().unwrap()));
        assert_eq!(ipv4_dst(&p[..10]), None);
        let t = vec![
            (
                "10.244.1.0/24".parse().unwrap(),
                "192.168.0.1".parse().unwrap(),
            ),
            (
                "10.244.2.0/24".parse().unwrap(),
                "192.168.0.2".parse().unwrap(),
            ),
        ];
        assert_eq!(
            lookup(&t, "10.244.2.9".parse().unwrap()),
            Some("192.168.0.2".parse().unwrap())
        );
        assert_eq!(lookup(&t, "10.9.9.9".parse().unwrap()), None);
    }
}
