//! A raw `AF_PACKET` socket bound to one interface and one EtherType:
//! whole Ethernet frames in and out, non-blocking, for the responder's
//! event loop.
//!
//! The socket is created with protocol 0 (which receives nothing), given
//! its filter, and only then bound to its EtherType and interface, so no
//! frame slips in unfiltered. Frames another host's traffic put on the
//! wire (`PACKET_OTHERHOST`, seen in promiscuous mode) and our own
//! transmissions (`PACKET_OUTGOING`) are dropped on receipt: a responder
//! answers only what was sent to it, on its own interface.

use std::io;
use std::mem::{size_of, size_of_val, zeroed};
use std::net::Ipv6Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::L2Error;

/// One classic BPF instruction (`struct sock_filter`).
pub(crate) type Insn = libc::sock_filter;

const fn insn(code: u32, jt: u8, jf: u8, k: u32) -> Insn {
    Insn {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

const LDB_ABS: u32 = libc::BPF_LD | libc::BPF_B | libc::BPF_ABS;
const JEQ_K: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
const RET_K: u32 = libc::BPF_RET | libc::BPF_K;

/// Accepts IPv6 frames whose next header is ICMPv6 (byte 20 of the frame)
/// with type Neighbor Solicitation or Advertisement (byte 54), so the
/// responder is woken only for Neighbor Discovery, not for every IPv6
/// packet the node receives.
pub(crate) const NDP_FILTER: [Insn; 7] = [
    insn(LDB_ABS, 0, 0, 20),
    insn(JEQ_K, 0, 4, 58),
    insn(LDB_ABS, 0, 0, 54),
    insn(JEQ_K, 1, 0, 135),
    insn(JEQ_K, 0, 1, 136),
    insn(RET_K, 0, 0, 0xffff),
    insn(RET_K, 0, 0, 0),
];

/// A bound packet socket.
#[derive(Debug)]
pub(crate) struct PacketSocket {
    fd: OwnedFd,
}

impl PacketSocket {
    /// Opens a socket on interface `ifindex` (named `iface` in errors)
    /// receiving frames of `ethertype` that pass `filter`.
    pub(crate) fn open(
        iface: &str,
        ifindex: u32,
        ethertype: u16,
        filter: Option<&[Insn]>,
    ) -> Result<PacketSocket, L2Error> {
        let fail = |op: &'static str, source: io::Error| L2Error::Socket {
            iface: iface.to_string(),
            op,
            source,
        };
        // SAFETY: plain socket(2) call.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(fail(
                "opening an AF_PACKET socket (needs CAP_NET_RAW)",
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: raw is a fresh descriptor that nothing else owns.
        let sock = PacketSocket {
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
        };
        if let Some(f) = filter {
            let prog = libc::sock_fprog {
                len: f.len() as u16,
                filter: f.as_ptr() as *mut Insn,
            };
            sock.setsockopt(libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog)
                .map_err(|e| fail("attaching the socket filter", e))?;
        }
        // SAFETY: sockaddr_ll is plain data; all zeroes is valid.
        let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ethertype.to_be();
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: sll is a valid sockaddr_ll of the size given.
        let rc = unsafe {
            libc::bind(
                sock.fd.as_raw_fd(),
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(fail(
                "binding the AF_PACKET socket to the interface",
                io::Error::last_os_error(),
            ));
        }
        Ok(sock)
    }

    fn setsockopt<T>(&self, level: i32, name: i32, value: &T) -> io::Result<()> {
        // SAFETY: value points at a T of the size given.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                level,
                name,
                value as *const T as *const libc::c_void,
                size_of_val(value) as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Receives one frame into `buf`: its length, or `None` for a frame
    /// that was not sent to this host (ours, or another host's). A frame
    /// longer than `buf` arrives cut to it.
    pub(crate) fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: sockaddr_ll is plain data; all zeroes is valid.
        let mut from: libc::sockaddr_ll = unsafe { zeroed() };
        let mut len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: buf and from are valid for the sizes given.
        let n = unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                0,
                &mut from as *mut libc::sockaddr_ll as *mut libc::sockaddr,
                &mut len,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        match from.sll_pkttype {
            libc::PACKET_HOST | libc::PACKET_BROADCAST | libc::PACKET_MULTICAST => {
                Ok(Some(n as usize))
            }
            _ => Ok(None),
        }
    }

    /// Sends one whole Ethernet frame out of the interface.
    pub(crate) fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: frame is valid for its length; the socket is bound, so
        // send(2) needs no address.
        let n = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                frame.as_ptr() as *const libc::c_void,
                frame.len(),
                0,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl AsRawFd for PacketSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// An IPv6 datagram socket that holds the interface's memberships of the
/// solicited-node groups of the owned IPv6 addresses. Joining through the
/// IPv6 stack (not a packet socket's membership) makes the kernel both
/// open the NIC's multicast filter and send MLD reports, so a switch doing
/// MLD snooping forwards the solicitations to this port too.
#[derive(Debug)]
pub(crate) struct GroupSocket {
    fd: OwnedFd,
    ifindex: u32,
}

impl GroupSocket {
    pub(crate) fn open(ifindex: u32) -> io::Result<GroupSocket> {
        // SAFETY: plain socket(2) call.
        let raw = unsafe { libc::socket(libc::AF_INET6, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(GroupSocket { fd, ifindex })
    }

    /// Joins `group` on the interface (once per group: a second join of
    /// the same group fails with `EADDRINUSE`).
    pub(crate) fn join(&self, group: Ipv6Addr) -> io::Result<()> {
        self.membership(libc::IPV6_ADD_MEMBERSHIP, group)
    }

    pub(crate) fn leave(&self, group: Ipv6Addr) -> io::Result<()> {
        self.membership(libc::IPV6_DROP_MEMBERSHIP, group)
    }

    fn membership(&self, op: i32, group: Ipv6Addr) -> io::Result<()> {
        let mr = libc::ipv6_mreq {
            ipv6mr_multiaddr: libc::in6_addr {
                s6_addr: group.octets(),
            },
            ipv6mr_interface: self.ifindex,
        };
        // SAFETY: mr is a valid ipv6_mreq of the size given.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::IPPROTO_IPV6,
                op,
                &mr as *const libc::ipv6_mreq as *const libc::c_void,
                size_of::<libc::ipv6_mreq>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}
