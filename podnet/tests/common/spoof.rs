//! Raw-packet tools for the anti-spoofing and invalid-packet tests, as an
//! attacker in a pod would use them: hand-made IPv4/TCP packets with any
//! source and flags (a raw `IPPROTO_RAW` socket), gratuitous ARP (a packet
//! socket), a TCP connection from a chosen source address, and a capture
//! inside the target pod that says which of those packets arrived.
//!
//! Every socket is opened inside the pod's network namespace (on the
//! calling thread only, see `Netns::run`) and keeps working there after
//! the thread leaves it.

#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::time::{Duration, Instant};

use podnet_kernel::netns::Netns;

pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const FIN: u8 = 0x01;
pub const ACK: u8 = 0x10;

fn ip_out(args: &[&str]) -> String {
    let o = Command::new("ip").args(args).output().expect("ip");
    assert!(
        o.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `ip -n NETNS ARGS`, which must succeed; its output.
pub fn ip_in(netns: &str, args: &[&str]) -> String {
    let mut a = vec!["-n", netns];
    a.extend_from_slice(args);
    ip_out(&a)
}

/// The MAC of `dev` in `netns`.
pub fn mac_of(netns: &str, dev: &str) -> [u8; 6] {
    let out = ip_in(netns, &["-o", "link", "show", "dev", dev]);
    let mac = out
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap_or_else(|| panic!("no MAC in {out:?}"));
    let mut m = [0u8; 6];
    for (b, s) in m.iter_mut().zip(mac.split(':')) {
        *b = u8::from_str_radix(s, 16).unwrap();
    }
    m
}

/// The interface index of `dev` in `netns`.
pub fn ifindex(netns: &str, dev: &str) -> u32 {
    let out = ip_in(netns, &["-o", "link", "show", "dev", dev]);
    out.split(':').next().unwrap().trim().parse().unwrap()
}

/// The link-local IPv6 address of `dev` in `netns`.
pub fn link_local(netns: &str, dev: &str) -> std::net::Ipv6Addr {
    let out = ip_in(
        netns,
        &["-o", "-6", "addr", "show", "dev", dev, "scope", "link"],
    );
    let a = out
        .split_whitespace()
        .skip_while(|w| *w != "inet6")
        .nth(1)
        .unwrap_or_else(|| panic!("no link-local address in {out:?}"));
    a.split('/').next().unwrap().parse().unwrap()
}

/// Whether `dev` in `netns` has a link-local IPv6 address it can use
/// (duplicate address detection over).
pub fn link_local_ready(netns: &str, dev: &str) -> bool {
    let out = ip_in(
        netns,
        &["-o", "-6", "addr", "show", "dev", dev, "scope", "link"],
    );
    out.contains("inet6") && !out.contains("tentative")
}

/// The MAC `netns` holds for `ip` on `dev`, if any.
pub fn neighbour(netns: &str, dev: &str, ip: Ipv4Addr) -> Option<[u8; 6]> {
    let out = ip_in(netns, &["neigh", "show", &ip.to_string(), "dev", dev]);
    let mac = out
        .split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)?;
    let mut m = [0u8; 6];
    for (b, s) in m.iter_mut().zip(mac.split(':')) {
        *b = u8::from_str_radix(s, 16).ok()?;
    }
    Some(m)
}

fn sum16(data: &[u8], mut acc: u32) -> u32 {
    for c in data.chunks(2) {
        acc += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// An IPv4 packet holding a TCP segment with `flags` and no payload.
pub fn tcp_packet(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let mut tcp = vec![0u8; 20];
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&dport.to_be_bytes());
    tcp[4..8].copy_from_slice(&0x1000_0000u32.to_be_bytes());
    if flags & ACK != 0 {
        tcp[8..12].copy_from_slice(&0x2000_0000u32.to_be_bytes());
    }
    tcp[12] = 5 << 4;
    tcp[13] = flags;
    tcp[14..16].copy_from_slice(&8192u16.to_be_bytes());
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&[0, 6, 0, 20]);
    let c = fold(sum16(&tcp, sum16(&pseudo, 0)));
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
    let mut ip = vec![0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&40u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let c = fold(sum16(&ip, 0));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip.extend_from_slice(&tcp);
    ip
}

fn check(r: libc::c_int, what: &str) -> libc::c_int {
    assert!(r >= 0, "{what}: {}", std::io::Error::last_os_error());
    r
}

/// Sends hand-made IPv4 packets from inside `netns` (routed by the pod's
/// own table, so they leave by its `eth0` with its MAC).
pub fn send_raw(netns: &str, packets: &[Vec<u8>]) {
    Netns::named(netns)
        .unwrap()
        .run(|| unsafe {
            let fd = check(
                libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW),
                "raw socket",
            );
            let fd = OwnedFd::from_raw_fd(fd);
            for p in packets {
                let mut sa: libc::sockaddr_in = std::mem::zeroed();
                sa.sin_family = libc::AF_INET as u16;
                sa.sin_addr.s_addr = u32::from_ne_bytes(p[16..20].try_into().unwrap());
                let n = libc::sendto(
                    fd.as_raw_fd(),
                    p.as_ptr().cast(),
                    p.len(),
                    0,
                    (&sa as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as u32,
                );
                check(n as i32, "sendto");
            }
        })
        .unwrap();
}

/// Sends a gratuitous ARP from `dev` in `netns`: a broadcast request from
/// MAC `mac` saying that `ip` is at `mac`.
pub fn send_garp(netns: &str, dev: &str, mac: [u8; 6], ip: Ipv4Addr) {
    let index = ifindex(netns, dev);
    let mut f = vec![0xffu8; 6];
    f.extend_from_slice(&mac);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&ip.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&ip.octets());
    Netns::named(netns)
        .unwrap()
        .run(|| unsafe {
            let fd = check(
                libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0),
                "packet socket",
            );
            let fd = OwnedFd::from_raw_fd(fd);
            let mut sa: libc::sockaddr_ll = std::mem::zeroed();
            sa.sll_family = libc::AF_PACKET as u16;
            sa.sll_ifindex = index as i32;
            sa.sll_halen = 6;
            sa.sll_addr[..6].copy_from_slice(&[0xff; 6]);
            let n = libc::sendto(
                fd.as_raw_fd(),
                f.as_ptr().cast(),
                f.len(),
                0,
                (&sa as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            check(n as i32, "sendto (ARP)");
        })
        .unwrap();
}

/// What connecting from a chosen source address did.
#[derive(Debug, PartialEq, Eq)]
pub enum Connect {
    Connected,
    TimedOut,
    Failed(String),
}

/// A TCP connection from `src` (an address of `netns`) to `dst`, waiting
/// at most `timeout`.
pub fn connect_from(netns: &str, src: Ipv4Addr, dst: SocketAddr, timeout: Duration) -> Connect {
    let SocketAddr::V4(dst) = dst else {
        panic!("IPv4 only")
    };
    Netns::named(netns)
        .unwrap()
        .run(|| unsafe {
            let fd = check(
                libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0),
                "tcp socket",
            );
            let fd = OwnedFd::from_raw_fd(fd);
            let sa = |ip: Ipv4Addr, port: u16| {
                let mut sa: libc::sockaddr_in = std::mem::zeroed();
                sa.sin_family = libc::AF_INET as u16;
                sa.sin_port = port.to_be();
                sa.sin_addr.s_addr = u32::from_ne_bytes(ip.octets());
                sa
            };
            let len = std::mem::size_of::<libc::sockaddr_in>() as u32;
            let me = sa(src, 0);
            check(
                libc::bind(
                    fd.as_raw_fd(),
                    (&me as *const libc::sockaddr_in).cast(),
                    len,
                ),
                "bind",
            );
            let to = sa(*dst.ip(), dst.port());
            libc::connect(
                fd.as_raw_fd(),
                (&to as *const libc::sockaddr_in).cast(),
                len,
            );
            let mut p = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLOUT,
                revents: 0,
            };
            if libc::poll(&mut p, 1, timeout.as_millis() as i32) == 0 {
                return Connect::TimedOut;
            }
            let mut err: libc::c_int = 0;
            let mut l = std::mem::size_of::<libc::c_int>() as u32;
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                (&mut err as *mut libc::c_int).cast(),
                &mut l,
            );
            match err {
                0 => Connect::Connected,
                e => Connect::Failed(std::io::Error::from_raw_os_error(e).to_string()),
            }
        })
        .unwrap()
}

/// One TCP segment a capture saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub src: Ipv4Addr,
    pub sport: u16,
    pub dport: u16,
    pub flags: u8,
}

/// A capture of the IPv4 TCP segments arriving at `dev` in a pod.
pub struct Capture(OwnedFd);

impl Capture {
    pub fn open(netns: &str, dev: &str) -> Capture {
        let index = ifindex(netns, dev);
        Netns::named(netns)
            .unwrap()
            .run(|| unsafe {
                let proto = (libc::ETH_P_IP as u16).to_be() as i32;
                let fd = check(
                    libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM, proto),
                    "capture socket",
                );
                let fd = OwnedFd::from_raw_fd(fd);
                let mut sa: libc::sockaddr_ll = std::mem::zeroed();
                sa.sll_family = libc::AF_PACKET as u16;
                sa.sll_protocol = proto as u16;
                sa.sll_ifindex = index as i32;
                check(
                    libc::bind(
                        fd.as_raw_fd(),
                        (&sa as *const libc::sockaddr_ll).cast(),
                        std::mem::size_of::<libc::sockaddr_ll>() as u32,
                    ),
                    "bind capture",
                );
                Capture(fd)
            })
            .unwrap()
    }

    /// Segments arriving until one matches `until` (the control packet,
    /// sent after the ones under test on the same path), or `deadline`.
    /// Returns what it saw, and whether the control came.
    pub fn until(&self, until: impl Fn(&Seen) -> bool, deadline: Duration) -> (Vec<Seen>, bool) {
        let end = Instant::now() + deadline;
        let mut seen = Vec::new();
        let mut buf = [0u8; 2048];
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return (seen, false);
            }
            let mut p = libc::pollfd {
                fd: self.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            if unsafe { libc::poll(&mut p, 1, left.as_millis().max(1) as i32) } <= 0 {
                continue;
            }
            let n =
                unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 40 || buf[9] != 6 {
                continue;
            }
            let hl = (buf[0] & 0x0f) as usize * 4;
            let t = &buf[hl..n as usize];
            let s = Seen {
                src: Ipv4Addr::new(buf[12], buf[13], buf[14], buf[15]),
                sport: u16::from_be_bytes([t[0], t[1]]),
                dport: u16::from_be_bytes([t[2], t[3]]),
                flags: t[13],
            };
            seen.push(s);
            if until(&s) {
                return (seen, true);
            }
        }
    }
}
