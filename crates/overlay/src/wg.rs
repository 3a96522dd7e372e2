//! The encrypted overlay's data path: pod packets between nodes carried
//! in WireGuard's protocol (Noise IK handshakes, ChaCha20-Poly1305
//! transport, rekeying every two minutes: boringtun's `Tunn`, one per
//! peer node) over UDP, through a TUN device, with the udp backend's I/O
//! ([`crate::tunnel`]): a TCP super-packet read from the TUN device is
//! segmented, each segment encrypted, and the batch leaves in one UDP GSO
//! send; received batches (UDP GRO) are decrypted and glued back into
//! super-packets for the TUN device.
//!
//! Cryptokey routing, as WireGuard defines it: a packet goes to the peer
//! whose pod subnet (IPv4, or IPv6 in a dual-stack cluster) holds its
//! destination, and a packet that arrives is accepted only from a peer's
//! address, only if it authenticates under that peer's session, and only
//! if its inner source lies in one of that peer's subnets. Everything
//! else is dropped and counted ([`Counters`]).

use std::collections::HashMap;
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use ipnet::IpNet;

use crate::gso::{self, Coalescer, VnetHdr, VNET_HDR_LEN};
use crate::tunnel::{
    ip_dst, open_socket, read_tun, recv_batch_from, send_segments, sockaddr, tun_write,
    GSO_MAX_BYTES, GSO_MAX_SEGS,
};

/// WireGuard's default port.
pub const PORT: u16 = 51820;
/// Outer IPv4 + UDP + WireGuard's data header and tag.
pub const OVERHEAD: u32 = 20 + 8 + 32;
/// Room a message needs beyond its plaintext (header, tag, padding), and
/// the smallest buffer `Tunn` writes into (a handshake initiation).
const ROOM: usize = 32 + 16;
const MIN_OUT: usize = 148;

/// One peer node: where it listens, its key, the subnets it speaks for
/// (its IPv4 pod subnet, and its IPv6 one in a dual-stack cluster).
pub struct Peer {
    pub subnets: Vec<IpNet>,
    pub ip: Ipv4Addr,
    pub key: [u8; 32],
    tunn: Mutex<Tunn>,
}

/// The peers by destination subnet and by underlay address.
#[derive(Default)]
struct Peers {
    by_subnet: Vec<Arc<Peer>>,
    by_ip: HashMap<Ipv4Addr, Arc<Peer>>,
}

impl Peers {
    fn route(&self, dst: IpAddr) -> Option<Arc<Peer>> {
        self.by_subnet.iter().find(|p| p.speaks_for(dst)).cloned()
    }
}

impl Peer {
    fn speaks_for(&self, a: IpAddr) -> bool {
        self.subnets.iter().any(|s| s.contains(&a))
    }
}

/// What the tunnel did, for metrics and tests.
#[derive(Default)]
pub struct Counters {
    /// Packets encrypted and sent.
    pub sent: AtomicU64,
    /// Packets decrypted and delivered.
    pub received: AtomicU64,
    /// Datagrams or packets dropped: from no peer's address, failing
    /// authentication, or with an inner source outside the sender's
    /// subnet.
    pub rejected: AtomicU64,
}

pub struct WgTunnel {
    secret: StaticSecret,
    peers: Arc<RwLock<Peers>>,
    next_index: AtomicU32,
    pub counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Sends one message to a peer (handshakes, cookies, keepalives).
fn send_one(fd: RawFd, msg: &[u8], to: Ipv4Addr, port: u16) {
    let _ = send_segments(fd, msg, msg.len(), &sockaddr(to, port));
}

/// The sending half: TUN reads, encrypted, to UDP sends.
struct Encap {
    sock: UdpSocket,
    peers: Arc<RwLock<Peers>>,
    port: u16,
    gso: bool,
    counters: Arc<Counters>,
    segs: Vec<u8>,
    out: Vec<u8>,
}

impl Encap {
    fn forward(&mut self, hdr: &[u8], pkt: &mut [u8]) {
        let (Some(h), Some(dst)) = (VnetHdr::parse(hdr), ip_dst(pkt)) else {
            return;
        };
        let peer = self
            .peers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .route(dst);
        let Some(peer) = peer else { return };
        if h.gso_type == gso::GSO_NONE {
            if gso::finish_checksum(&h, pkt).is_ok() {
                self.seal(&peer, pkt, pkt.len());
            }
            return;
        }
        let mut segs = std::mem::take(&mut self.segs);
        segs.clear();
        match gso::segment(&h, pkt, &mut segs) {
            Ok(seg) => self.seal(&peer, &segs, seg),
            Err(e) => tracing::debug!(?e, "dropping a packet the tunnel cannot segment"),
        }
        self.segs = segs;
    }

    /// Encrypts the packets laid end to end in `data` (each `seg` bytes,
    /// the last maybe shorter) for `peer` and sends them. Data messages
    /// of equal plaintext length have equal length, so they leave in GSO
    /// batches; a handshake the first packet starts leaves on its own.
    fn seal(&mut self, peer: &Peer, data: &[u8], seg: usize) {
        let fd = self.sock.as_raw_fd();
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        let mut ct_seg = 0;
        {
            let mut tunn = peer.tunn.lock().unwrap_or_else(|p| p.into_inner());
            for p in data.chunks(seg) {
                let start = out.len();
                out.resize(start + (p.len() + ROOM).max(MIN_OUT), 0);
                match tunn.encapsulate(p, &mut out[start..]) {
                    // A data message (type 4): batched.
                    TunnResult::WriteToNetwork(m) if m.first() == Some(&4) => {
                        let n = m.len();
                        ct_seg = ct_seg.max(n);
                        out.truncate(start + n);
                    }
                    // A handshake initiation (the packet waits for it).
                    TunnResult::WriteToNetwork(m) => {
                        send_one(fd, m, peer.ip, self.port);
                        out.truncate(start);
                    }
                    _ => out.truncate(start),
                }
            }
        }
        if ct_seg > 0 {
            self.send_batch(fd, &out, ct_seg, peer.ip);
        }
        self.out = out;
    }

    fn send_batch(&mut self, fd: RawFd, out: &[u8], seg: usize, to: Ipv4Addr) {
        let to = sockaddr(to, self.port);
        let per_send = GSO_MAX_SEGS.min(GSO_MAX_BYTES / seg).max(1) * seg;
        for chunk in out.chunks(per_send) {
            let n = chunk.len().div_ceil(seg) as u64;
            if self.gso && chunk.len() > seg {
                match send_segments(fd, chunk, seg, &to) {
                    Ok(()) => {
                        self.counters.sent.fetch_add(n, Ordering::Relaxed);
                        continue;
                    }
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EIO)) => {
                        tracing::warn!(error = %e, "UDP GSO refused; sending one datagram per packet");
                        self.gso = false;
                    }
                    Err(_) => continue,
                }
            }
            for m in chunk.chunks(seg) {
                if send_segments(fd, m, m.len(), &to).is_ok() {
                    self.counters.sent.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// The receiving half: UDP batches, authenticated and decrypted, to TUN
/// writes.
struct Decap {
    sock: UdpSocket,
    tun: File,
    peers: Arc<RwLock<Peers>>,
    port: u16,
    counters: Arc<Counters>,
}

impl Decap {
    fn run(self, stop: &AtomicBool) {
        let mut buf = vec![0u8; 65536 + 4096];
        let mut plain = vec![0u8; 65536];
        let mut co = Coalescer::default();
        let sfd = self.sock.as_raw_fd();
        while !stop.load(Ordering::Relaxed) {
            let Ok((n, seg, src)) = recv_batch_from(sfd, &mut buf) else {
                continue;
            };
            let peer = self
                .peers
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .by_ip
                .get(&src)
                .cloned();
            let Some(peer) = peer else {
                let count = n.div_ceil(seg.unwrap_or(n).max(1)) as u64;
                self.counters.rejected.fetch_add(count, Ordering::Relaxed);
                continue;
            };
            let mut tunn = peer.tunn.lock().unwrap_or_else(|p| p.into_inner());
            for d in buf[..n].chunks(seg.unwrap_or(n).max(1)) {
                self.open(&peer, &mut tunn, d, &mut plain, &mut co);
            }
            drop(tunn);
            self.flush(&mut co);
        }
    }

    /// One datagram from `peer`.
    fn open(&self, peer: &Peer, tunn: &mut Tunn, d: &[u8], plain: &mut [u8], co: &mut Coalescer) {
        let sfd = self.sock.as_raw_fd();
        match tunn.decapsulate(Some(IpAddr::V4(peer.ip)), d, plain) {
            TunnResult::WriteToTunnelV4(p, from) if peer.speaks_for(from.into()) => {
                self.deliver(p, co);
            }
            TunnResult::WriteToTunnelV6(p, from) if peer.speaks_for(from.into()) => {
                self.deliver(p, co);
            }
            TunnResult::WriteToNetwork(m) => {
                // A handshake answered (or a cookie): then whatever waited
                // for the session.
                send_one(sfd, m, peer.ip, self.port);
                while let TunnResult::WriteToNetwork(m) = tunn.decapsulate(None, &[], plain) {
                    send_one(sfd, m, peer.ip, self.port);
                }
            }
            TunnResult::Done => {}
            // An inner source outside the peer's subnets, or a message
            // that does not authenticate.
            _ => {
                self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// An authentic packet from a peer's subnet, into the TUN device
    /// (glued to the ones before it when they are one TCP stream).
    fn deliver(&self, p: &[u8], co: &mut Coalescer) {
        self.counters.received.fetch_add(1, Ordering::Relaxed);
        if !co.push(p) {
            self.flush(co);
            if !co.push(p) {
                tun_write(self.tun.as_raw_fd(), &VnetHdr::default().encode(), p);
            }
        }
    }

    fn flush(&self, co: &mut Coalescer) {
        if let Some(glued) = co.take() {
            tun_write(
                self.tun.as_raw_fd(),
                &glued[..VNET_HDR_LEN],
                &glued[VNET_HDR_LEN..],
            );
        }
    }
}

/// Every peer's timers (handshake retries, rekeying, keepalives), ticked
/// as WireGuard asks (often enough for its 5 s and 10 s timers).
fn timers(sock: UdpSocket, peers: Arc<RwLock<Peers>>, port: u16, stop: &AtomicBool) {
    let mut out = vec![0u8; MIN_OUT.max(256)];
    let fd = sock.as_raw_fd();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        let all: Vec<Arc<Peer>> = peers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_subnet
            .clone();
        for p in all {
            let mut t = p.tunn.lock().unwrap_or_else(|e| e.into_inner());
            if let TunnResult::WriteToNetwork(m) = t.update_timers(&mut out) {
                send_one(fd, m, p.ip, port);
            }
        }
    }
}

impl WgTunnel {
    /// `tun` must come from `podnet_kernel::tun::open_tun`.
    pub fn start(
        tun: File,
        bind: Ipv4Addr,
        port: u16,
        secret: StaticSecret,
    ) -> std::io::Result<WgTunnel> {
        let sock = open_socket(&tun, bind, port)?;
        let peers = Arc::new(RwLock::new(Peers::default()));
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut encap = Encap {
            sock: sock.try_clone()?,
            peers: peers.clone(),
            port,
            gso: true,
            counters: counters.clone(),
            segs: Vec::new(),
            out: Vec::new(),
        };
        let decap = Decap {
            sock: sock.try_clone()?,
            tun: tun.try_clone()?,
            peers: peers.clone(),
            port,
            counters: counters.clone(),
        };
        let mut threads = Vec::new();
        let s = stop.clone();
        threads.push(
            std::thread::Builder::new()
                .name("wg-encap".into())
                .spawn(move || read_tun(&tun, &s, |hdr, pkt| encap.forward(hdr, pkt)))?,
        );
        let s = stop.clone();
        threads.push(
            std::thread::Builder::new()
                .name("wg-decap".into())
                .spawn(move || decap.run(&s))?,
        );
        let (s, p) = (stop.clone(), peers.clone());
        threads.push(
            std::thread::Builder::new()
                .name("wg-timers".into())
                .spawn(move || timers(sock, p, port, &s))?,
        );
        Ok(WgTunnel {
            secret,
            peers,
            next_index: AtomicU32::new(1),
            counters,
            stop,
            threads,
        })
    }

    /// The peer nodes now: each (subnets, underlay address, public key). A
    /// peer whose subnets, address and key are unchanged keeps its
    /// sessions.
    pub fn set_peers(&self, want: Vec<(Vec<IpNet>, Ipv4Addr, [u8; 32])>) {
        let old = self.peers.read().unwrap_or_else(|p| p.into_inner());
        let mut next = Peers::default();
        for (subnets, ip, key) in want {
            let kept = old
                .by_subnet
                .iter()
                .find(|p| p.subnets == subnets && p.ip == ip && p.key == key)
                .cloned();
            let peer = kept.unwrap_or_else(|| {
                // Session indexes are 24 bits (Tunn shifts them by 8).
                let index = self.next_index.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
                Arc::new(Peer {
                    subnets,
                    ip,
                    key,
                    tunn: Mutex::new(Tunn::new(
                        self.secret.clone(),
                        PublicKey::from(key),
                        None,
                        None,
                        index,
                        None,
                    )),
                })
            });
            next.by_ip.insert(ip, peer.clone());
            next.by_subnet.push(peer);
        }
        drop(old);
        *self.peers.write().unwrap_or_else(|p| p.into_inner()) = next;
    }
}

impl Drop for WgTunnel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
