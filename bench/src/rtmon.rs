//! A netlink monitor of one network namespace, as `ip monitor route neigh`
//! is: a thread joins the namespace's IPv4 route and neighbour groups and
//! stamps every change with the moment it read it, so the lab benchmarks
//! can say when a route reached a node's kernel or when a client's
//! neighbour entry moved to another MAC, instead of polling for it.
//!
//! The stamp is taken when the datagram is read: the kernel queues the
//! notification when the change is committed, and the thread blocks in
//! `recv`, so the stamp trails the change by a thread wake-up.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use anyhow::{bail, Context, Result};
use ipnet::Ipv4Net;
use podnet_kernel::Netns;

/// IPv4 routes (RTMGRP_IPV4_ROUTE).
pub const ROUTES: u32 = 0x40;
/// Neighbours (RTMGRP_NEIGH).
pub const NEIGHBOURS: u32 = 0x4;

const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const RTM_NEWNEIGH: u16 = 28;
const RTM_DELNEIGH: u16 = 29;
const RT_TABLE_MAIN: u8 = 254;

/// One change the kernel announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// An IPv4 route in the main table, added (or replaced) or deleted.
    Route {
        dst: Ipv4Net,
        gateway: Option<Ipv4Addr>,
        added: bool,
    },
    /// A neighbour entry, added or updated (with its MAC, if any) or deleted.
    Neigh {
        dst: IpAddr,
        mac: Option<[u8; 6]>,
        added: bool,
    },
}

/// A change, when it was read (monotonic, and by the wall clock, to
/// compare with times other processes wrote down), and which monitor (the
/// caller's tag) saw it.
#[derive(Debug, Clone)]
pub struct Stamped {
    pub at: Instant,
    pub wall: SystemTime,
    pub tag: usize,
    pub change: Change,
}

/// A running monitor; dropping it stops its thread (within 100 ms).
pub struct Monitor {
    stop: Arc<AtomicBool>,
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Starts a monitor of `groups` ([`ROUTES`], [`NEIGHBOURS`]) in namespace
/// `netns`; every change goes to `tx` tagged `tag`. Returns once the
/// socket is subscribed, so no change after the return is missed.
pub fn spawn(netns: &str, groups: u32, tag: usize, tx: Sender<Stamped>) -> Result<Monitor> {
    let fd = Netns::named(netns)
        .with_context(|| format!("namespace {netns}"))?
        .run(|| subscribe(groups))?
        .with_context(|| format!("netlink monitor in {netns}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::Builder::new()
        .name(format!("rtmon-{tag}"))
        .spawn(move || read_loop(fd, tag, tx, flag))
        .context("starting the monitor thread")?;
    Ok(Monitor { stop })
}

/// A NETLINK_ROUTE socket in the calling thread's namespace, joined to
/// `groups`, with a 100 ms receive timeout (so the thread sees its stop
/// flag) and a large buffer (a burst must not overflow it).
fn subscribe(groups: u32) -> std::io::Result<OwnedFd> {
    let fd = podnet_kernel::nl::rtnl_listener(groups, 4 << 20, false)?;
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: setsockopt with a correctly sized timeval on our socket.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
    Ok(fd)
}

fn read_loop(fd: OwnedFd, tag: usize, tx: Sender<Stamped>, stop: Arc<AtomicBool>) {
    let mut buf = vec![0u8; 1 << 16];
    while !stop.load(Ordering::SeqCst) {
        // SAFETY: recv into a buffer we own, of the length given.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                0,
            )
        };
        let (at, wall) = (Instant::now(), SystemTime::now());
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => continue,
                // The socket overflowed: changes were lost. Say so; a
                // benchmark waiting for one then fails on its deadline.
                Some(libc::ENOBUFS) => {
                    eprintln!("rtmon-{tag}: netlink buffer overflow, changes lost");
                    continue;
                }
                _ => {
                    eprintln!("rtmon-{tag}: {e}");
                    return;
                }
            }
        }
        for change in parse(&buf[..n as usize]) {
            if tx
                .send(Stamped {
                    at,
                    wall,
                    tag,
                    change,
                })
                .is_err()
            {
                return;
            }
        }
    }
}

/// The route and neighbour changes in one netlink datagram.
pub fn parse(buf: &[u8]) -> Vec<Change> {
    podnet_kernel::nl::Messages::new(buf)
        .filter_map(|m| match m.msg_type {
            RTM_NEWROUTE | RTM_DELROUTE => route(m.body, m.msg_type == RTM_NEWROUTE),
            RTM_NEWNEIGH | RTM_DELNEIGH => neigh(m.body, m.msg_type == RTM_NEWNEIGH),
            _ => None,
        })
        .collect()
}

/// The attributes (type, payload) after a fixed header of `skip` bytes.
fn attrs(body: &[u8], skip: usize) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut off = skip;
    while off + 4 <= body.len() {
        let len = u16::from_ne_bytes([body[off], body[off + 1]]) as usize;
        let ty = u16::from_ne_bytes([body[off + 2], body[off + 3]]) & 0x3fff;
        if len < 4 || off + len > body.len() {
            break;
        }
        out.push((ty, &body[off + 4..off + len]));
        off += (len + 3) & !3;
    }
    out
}

fn v4(b: &[u8]) -> Option<Ipv4Addr> {
    <[u8; 4]>::try_from(b).ok().map(Ipv4Addr::from)
}

/// An rtmsg (12 bytes: family, dst_len, src_len, tos, table, protocol,
/// scope, type, flags) and its attributes: RTA_DST 1, RTA_GATEWAY 5,
/// RTA_TABLE 15.
fn route(body: &[u8], added: bool) -> Option<Change> {
    if body.len() < 12 || body[0] != libc::AF_INET as u8 {
        return None;
    }
    let mut table = body[4] as u32;
    let (mut dst, mut gateway) = (Ipv4Addr::UNSPECIFIED, None);
    for (ty, v) in attrs(body, 12) {
        match ty {
            1 => dst = v4(v)?,
            5 => gateway = v4(v),
            15 if v.len() == 4 => table = u32::from_ne_bytes(v.try_into().expect("4 bytes")),
            _ => {}
        }
    }
    if table != RT_TABLE_MAIN as u32 {
        return None;
    }
    Some(Change::Route {
        dst: Ipv4Net::new(dst, body[1]).ok()?,
        gateway,
        added,
    })
}

/// An ndmsg (12 bytes: family, pads, ifindex, state, flags, type) and its
/// attributes: NDA_DST 1, NDA_LLADDR 2.
fn neigh(body: &[u8], added: bool) -> Option<Change> {
    if body.len() < 12 {
        return None;
    }
    let (mut dst, mut mac) = (None, None);
    for (ty, v) in attrs(body, 12) {
        match ty {
            1 => {
                dst = match v.len() {
                    4 => v4(v).map(IpAddr::V4),
                    16 => <[u8; 16]>::try_from(v).ok().map(IpAddr::from),
                    _ => None,
                }
            }
            2 => mac = <[u8; 6]>::try_from(v).ok(),
            _ => {}
        }
    }
    Some(Change::Neigh {
        dst: dst?,
        mac,
        added,
    })
}

/// Fails unless `mac` reads as six hex bytes `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let v: Vec<u8> = s
        .trim()
        .split(':')
        .map(|p| u8::from_str_radix(p, 16))
        .collect::<Result<_, _>>()
        .with_context(|| format!("MAC {s:?}"))?;
    match <[u8; 6]>::try_from(v) {
        Ok(m) => Ok(m),
        Err(_) => bail!("MAC {s:?}: want six bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nlmsg(ty: u16, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&[0u8; 10]);
        m.extend_from_slice(body);
        m
    }

    fn attr(ty: u16, v: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((4 + v.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&ty.to_ne_bytes());
        a.extend_from_slice(v);
        while a.len() % 4 != 0 {
            a.push(0);
        }
        a
    }

    #[test]
    fn routes_and_neighbours_parse() {
        let mut rt = vec![libc::AF_INET as u8, 24, 0, 0, 254, 112, 0, 1, 0, 0, 0, 0];
        rt.extend(attr(1, &[10, 244, 7, 0]));
        rt.extend(attr(5, &[192, 168, 200, 14]));
        let mut nd = vec![libc::AF_INET as u8, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 1];
        nd.extend(attr(1, &[192, 168, 200, 240]));
        nd.extend(attr(2, &[2, 0, 0, 0, 0, 9]));
        let mut buf = nlmsg(RTM_NEWROUTE, &rt);
        buf.extend(nlmsg(RTM_DELNEIGH, &nd));
        let got = parse(&buf);
        assert_eq!(
            got,
            vec![
                Change::Route {
                    dst: "10.244.7.0/24".parse().unwrap(),
                    gateway: Some(Ipv4Addr::new(192, 168, 200, 14)),
                    added: true,
                },
                Change::Neigh {
                    dst: "192.168.200.240".parse().unwrap(),
                    mac: Some([2, 0, 0, 0, 0, 9]),
                    added: false,
                },
            ]
        );
        // A route of another table is not reported.
        rt[4] = 255;
        assert!(parse(&nlmsg(RTM_NEWROUTE, &rt)).is_empty());
    }

    #[test]
    fn macs_parse_or_say_what_is_wrong() {
        assert_eq!(
            parse_mac("02:00:0a:ff:00:01\n").unwrap(),
            [2, 0, 10, 255, 0, 1]
        );
        assert!(parse_mac("02:00")
            .unwrap_err()
            .to_string()
            .contains("six bytes"));
        assert!(parse_mac("zz:00:00:00:00:00").is_err());
    }
}
