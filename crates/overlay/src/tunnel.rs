//! The userspace UDP backend, as flannel's `udp` mode: packets the kernel
//! routes into the TUN device are read by the agent, looked up by
//! destination in the lease table, and sent whole inside a UDP datagram to
//! the owning node's agent, which writes them into its own TUN device.
//!
//! The wire format is flannel's: one complete IP packet per datagram (IPv4,
//! or IPv6 in a dual-stack cluster, always over the IPv4 underlay).
//! What keeps it from costing two system calls per 1.4 KiB packet is
//! offload at both ends (see `gso`): a TCP super-packet read from the TUN
//! device is segmented here and leaves in one UDP GSO `sendmsg`; the
//! receiving socket takes batches with UDP GRO, and consecutive packets of
//! one TCP stream go back into the TUN device as one super-packet. Without
//! UDP GSO (an old kernel), packets are sent one `sendto` each.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ipnet::IpNet;

use podnet_kernel::nl::set_int_opt;

use crate::gso::{self, Coalescer, VnetHdr, VNET_HDR_LEN};

/// Where each remote subnet's agent listens (IPv4 and IPv6 subnets).
pub type Table = Arc<RwLock<Vec<(IpNet, Ipv4Addr)>>>;

/// Packets per UDP GSO send: the kernel's limit is 64 segments, and the
/// whole batch must fit one UDP datagram's 64 KiB.
pub(crate) const GSO_MAX_SEGS: usize = 64;
pub(crate) const GSO_MAX_BYTES: usize = 65000;

pub struct UdpTunnel {
    pub table: Table,
    stop: Arc<AtomicBool>,
    pub sent: Arc<AtomicU64>,
    pub received: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// The destination of an IPv4 or IPv6 packet.
pub fn ip_dst(pkt: &[u8]) -> Option<IpAddr> {
    match pkt.first()? >> 4 {
        4 if pkt.len() >= 20 => Some(Ipv4Addr::new(pkt[16], pkt[17], pkt[18], pkt[19]).into()),
        6 if pkt.len() >= 40 => {
            let b: [u8; 16] = pkt[24..40].try_into().ok()?;
            Some(Ipv6Addr::from(b).into())
        }
        _ => None,
    }
}

/// Which node's agent takes a packet for `dst`.
pub fn lookup(table: &[(IpNet, Ipv4Addr)], dst: IpAddr) -> Option<Ipv4Addr> {
    table
        .iter()
        .find(|(n, _)| n.contains(&dst))
        .map(|(_, ip)| *ip)
}

pub(crate) fn sockaddr(ip: Ipv4Addr, port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// One `sendmsg` of `buf`, cut by the kernel into datagrams of `seg` bytes
/// when it holds more than one.
pub(crate) fn send_segments(
    fd: RawFd,
    buf: &[u8],
    seg: usize,
    to: &libc::sockaddr_in,
) -> std::io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut control = [0u64; 4];
    // SAFETY: zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = to as *const libc::sockaddr_in as *mut libc::c_void;
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if buf.len() > seg {
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        // SAFETY: CMSG_* only compute sizes and offsets inside `control`,
        // which is large enough for one u16 payload.
        unsafe {
            msg.msg_controllen = libc::CMSG_SPACE(2) as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_UDP;
            (*c).cmsg_type = libc::UDP_SEGMENT;
            (*c).cmsg_len = libc::CMSG_LEN(2) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, seg as u16);
        }
    }
    // SAFETY: msg describes valid memory for the duration of the call.
    if unsafe { libc::sendmsg(fd, &msg, 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// One `recvmsg` into `buf`: the bytes received and, for a UDP GRO batch,
/// the size of each datagram in it.
fn recv_batch(fd: RawFd, buf: &mut [u8]) -> std::io::Result<(usize, Option<usize>)> {
    recv_batch_from(fd, buf).map(|(n, seg, _)| (n, seg))
}

/// [`recv_batch`], also saying who sent the batch.
pub(crate) fn recv_batch_from(
    fd: RawFd,
    buf: &mut [u8],
) -> std::io::Result<(usize, Option<usize>, Ipv4Addr)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: a zeroed sockaddr_in is valid; the kernel fills it.
    let mut from: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    // SAFETY: zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = &mut from as *mut libc::sockaddr_in as *mut libc::c_void;
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: msg describes valid memory for the duration of the call.
    let n = unsafe { libc::recvmsg(fd, &mut msg, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut seg = None;
    // SAFETY: the kernel filled `control` and set msg_controllen; CMSG_*
    // walk it within that length.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                seg = usize::try_from(v).ok().filter(|&v| v > 0);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    let src = Ipv4Addr::from(u32::from_be(from.sin_addr.s_addr));
    Ok((n as usize, seg, src))
}

/// Writes one packet into the TUN device behind a virtio-net header.
pub(crate) fn tun_write(fd: RawFd, hdr: &[u8], pkt: &[u8]) -> bool {
    let iov = [
        libc::iovec {
            iov_base: hdr.as_ptr() as *mut libc::c_void,
            iov_len: hdr.len(),
        },
        libc::iovec {
            iov_base: pkt.as_ptr() as *mut libc::c_void,
            iov_len: pkt.len(),
        },
    ];
    // SAFETY: both iovecs point at live slices.
    unsafe { libc::writev(fd, iov.as_ptr(), 2) >= 0 }
}

/// The sending half: TUN reads to UDP sends.
struct Encap {
    sock: UdpSocket,
    table: Table,
    port: u16,
    gso: bool,
    sent: Arc<AtomicU64>,
    segs: Vec<u8>,
}

impl Encap {
    fn run(mut self, tun: File, stop: &AtomicBool) {
        read_tun(&tun, stop, |hdr, pkt| self.forward(hdr, pkt));
    }

    fn forward(&mut self, hdr: &[u8], pkt: &mut [u8]) {
        let (Some(h), Some(dst)) = (VnetHdr::parse(hdr), ip_dst(pkt)) else {
            return;
        };
        let to = lookup(&self.table.read().unwrap_or_else(|p| p.into_inner()), dst);
        let Some(to) = to else {
            return;
        };
        let to = sockaddr(to, self.port);
        let fd = self.sock.as_raw_fd();
        if h.gso_type == gso::GSO_NONE {
            if gso::finish_checksum(&h, pkt).is_ok()
                && send_segments(fd, pkt, pkt.len(), &to).is_ok()
            {
                self.sent.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        let mut segs = std::mem::take(&mut self.segs);
        segs.clear();
        match gso::segment(&h, pkt, &mut segs) {
            Ok(seg) => {
                let per_send = GSO_MAX_SEGS.min(GSO_MAX_BYTES / seg).max(1) * seg;
                for chunk in segs.chunks(per_send) {
                    self.send_chunk(fd, chunk, seg, &to);
                }
            }
            Err(e) => tracing::debug!(?e, "dropping a packet the tunnel cannot segment"),
        }
        self.segs = segs;
    }

    /// Sends equal-size packets laid end to end: one GSO send, or one send
    /// per packet once the kernel has refused GSO.
    fn send_chunk(&mut self, fd: RawFd, chunk: &[u8], seg: usize, to: &libc::sockaddr_in) {
        let n = chunk.len().div_ceil(seg) as u64;
        if self.gso {
            match send_segments(fd, chunk, seg, to) {
                Ok(()) => {
                    self.sent.fetch_add(n, Ordering::Relaxed);
                    return;
                }
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINVAL | libc::EIO | libc::ENOPROTOOPT)
                    ) =>
                {
                    tracing::warn!(error = %e, "UDP GSO refused; sending one datagram per packet");
                    self.gso = false;
                }
                Err(_) => return,
            }
        }
        for p in chunk.chunks(seg) {
            if send_segments(fd, p, p.len(), to).is_ok() {
                self.sent.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The receiving half: UDP batches to TUN writes.
fn decap(sock: UdpSocket, tun: File, received: Arc<AtomicU64>, stop: &AtomicBool) {
    let mut buf = vec![0u8; 65536 + 4096];
    let (sfd, tfd) = (sock.as_raw_fd(), tun.as_raw_fd());
    let plain = VnetHdr::default().encode();
    let mut co = Coalescer::default();
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, seg)) = recv_batch(sfd, &mut buf) else {
            continue;
        };
        let mut count = 0;
        for p in buf[..n].chunks(seg.unwrap_or(n).max(1)) {
            if ip_dst(p).is_none() {
                continue;
            }
            count += 1;
            if co.push(p) {
                continue;
            }
            if let Some(glued) = co.take() {
                tun_write(tfd, &glued[..VNET_HDR_LEN], &glued[VNET_HDR_LEN..]);
            }
            if !co.push(p) {
                tun_write(tfd, &plain, p);
            }
        }
        if let Some(glued) = co.take() {
            tun_write(tfd, &glued[..VNET_HDR_LEN], &glued[VNET_HDR_LEN..]);
        }
        received.fetch_add(count, Ordering::Relaxed);
    }
}

/// The tunnel's UDP socket on `bind:port` (GRO on, a deep receive
/// buffer, reads that time out so the threads see a stop), with `tun`
/// made non-blocking for the sending thread's poll.
pub(crate) fn open_socket(tun: &File, bind: Ipv4Addr, port: u16) -> std::io::Result<UdpSocket> {
    let sock = UdpSocket::bind(SocketAddrV4::new(bind, port))?;
    sock.set_read_timeout(Some(Duration::from_millis(200)))?;
    let fd = sock.as_raw_fd();
    if let Err(e) = set_int_opt(fd, libc::SOL_UDP, libc::UDP_GRO, 1) {
        tracing::warn!(error = %e, "UDP GRO unavailable; receiving one datagram per call");
    }
    // UDP has no back-pressure: room for a few 64 KiB batches while the
    // receiving thread writes the previous ones into the TUN device.
    let _ = set_int_opt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 4 << 20);
    // SAFETY: valid fd; F_SETFL with O_NONBLOCK.
    unsafe { libc::fcntl(tun.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    Ok(sock)
}

/// Reads the TUN device until `stop`: each packet with its virtio-net
/// header, handed to `forward`.
pub(crate) fn read_tun(tun: &File, stop: &AtomicBool, mut forward: impl FnMut(&[u8], &mut [u8])) {
    let mut tun = tun;
    let mut buf = vec![0u8; VNET_HDR_LEN + 65536];
    let fd = tun.as_raw_fd();
    while !stop.load(Ordering::Relaxed) {
        let n = match tun.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut pfd, 1, 200) };
                continue;
            }
            Err(_) => continue,
        };
        if n > VNET_HDR_LEN {
            let (hdr, pkt) = buf[..n].split_at_mut(VNET_HDR_LEN);
            forward(hdr, pkt);
        }
    }
}

impl UdpTunnel {
    /// `tun` must come from `podnet_kernel::tun::open_tun` (virtio-net
    /// headers, TCP segmentation offload).
    pub fn start(tun: File, bind: Ipv4Addr, port: u16) -> std::io::Result<UdpTunnel> {
        let sock = open_socket(&tun, bind, port)?;
        let table: Table = Arc::new(RwLock::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (sent, received) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let encap_tun = tun.try_clone()?;
        let encap = Encap {
            sock: sock.try_clone()?,
            table: table.clone(),
            port,
            gso: true,
            sent: sent.clone(),
            segs: Vec::new(),
        };
        let mut threads = Vec::new();
        let s = stop.clone();
        threads.push(
            std::thread::Builder::new()
                .name("udp-encap".into())
                .spawn(move || encap.run(encap_tun, &s))?,
        );
        let (s, r) = (stop.clone(), received.clone());
        threads.push(
            std::thread::Builder::new()
                .name("udp-decap".into())
                .spawn(move || decap(sock, tun, r, &s))?,
        );
        Ok(UdpTunnel {
            table,
            stop,
            sent,
            received,
            threads,
        })
    }

    pub fn set_table(&self, t: Vec<(IpNet, Ipv4Addr)>) {
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
        assert_eq!(ip_dst(&p), Some("10.244.2.9".parse().unwrap()));
        assert_eq!(ip_dst(&p[..10]), None);
        let mut p6 = vec![0u8; 40];
        p6[0] = 0x60;
        p6[24..40].copy_from_slice(&"fd00:10:244:2::9".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(ip_dst(&p6), Some("fd00:10:244:2::9".parse().unwrap()));
        assert_eq!(ip_dst(&p6[..30]), None);
        let t = vec![
            (
                "10.244.1.0/24".parse().unwrap(),
                "192.168.0.1".parse().unwrap(),
            ),
            (
                "10.244.2.0/24".parse().unwrap(),
                "192.168.0.2".parse().unwrap(),
            ),
            (
                "fd00:10:244:2::/64".parse().unwrap(),
                "192.168.0.2".parse().unwrap(),
            ),
        ];
        assert_eq!(
            lookup(&t, "fd00:10:244:2::9".parse().unwrap()),
            Some("192.168.0.2".parse().unwrap())
        );
        assert_eq!(
            lookup(&t, "10.244.2.9".parse().unwrap()),
            Some("192.168.0.2".parse().unwrap())
        );
        assert_eq!(lookup(&t, "10.9.9.9".parse().unwrap()), None);
    }
}
