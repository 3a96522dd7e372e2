//! The query path: UDP workers, the TCP listener, and the handler both use.
//!
//! UDP is served by plain OS threads (one per core by default) blocked on
//! one shared socket: a cluster name or a cached name is answered right
//! there, synchronously, with no task, no allocation and no lock (the zone
//! is an [`ArcSwap`] load, the stats are per-thread atomics). Only queries
//! that must wait for an upstream (forwarding, ExternalName chasing) are
//! handed to the tokio runtime. TCP (RFC 7766: length-prefixed, several
//! queries per connection) runs on tokio and shares the same handler.
//!
//! UDP answers larger than the client's limit (512 bytes, or its EDNS
//! payload size) are cut to the question with the TC bit set, and the
//! client retries over TCP.
//!
//! Recursion is for the clients on the [`AllowList`] only. Anyone else
//! gets the cluster zone (authoritative answers, CNAMEs chased only inside
//! it) and REFUSED, no bigger than the query, for every other name; their
//! UDP answers are held to 512 bytes whatever EDNS size they claim, so a
//! spoofed source cannot turn a small query into a large answer.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::forward::{AllowList, Forwarder};
use crate::stats::Stats;
use crate::wire::{self, Query};
use crate::zone::{Outcome, Snapshot};

/// How long an idle TCP connection is kept (RFC 7766 suggests seconds).
const TCP_IDLE: Duration = Duration::from_secs(10);
/// Longest ExternalName → ExternalName chain we follow.
const MAX_CHASE: usize = 8;

/// What the synchronous path did with a packet.
#[derive(Debug, PartialEq, Eq)]
pub enum Fast {
    /// `out` holds the response.
    Reply,
    /// Nothing to send (not a query).
    Drop,
    /// Needs an upstream: call [`Handler::slow`].
    Slow,
}

/// Answers queries from the current zone snapshot and the forwarder.
pub struct Handler {
    pub zone: Arc<ArcSwap<Snapshot>>,
    pub fwd: Arc<Forwarder>,
    /// Counters for the TCP and slow paths (UDP workers have their own).
    pub stats: Arc<Stats>,
    /// Clients whose queries for other names are forwarded.
    pub recursion: AllowList,
    /// UDP queries waiting on an upstream; bounded so a flood of
    /// forwarded names cannot pile up tasks without limit.
    inflight: std::sync::atomic::AtomicUsize,
}

/// Most UDP queries waiting on upstreams at once; beyond this they get
/// SERVFAIL at once (the client retries) instead of a task each.
pub const MAX_INFLIGHT: usize = 4096;

/// The largest UDP answer a client outside the allow-list gets, whatever
/// EDNS payload size it announces (RFC 1035's classic limit).
pub const OUTSIDE_UDP_LIMIT: usize = wire::MIN_UDP;

/// REFUSED for a client that may not recurse: header, question and OPT,
/// never larger than the query; RA clear, as recursion is not available
/// to it.
fn refuse(q: &Query, out: &mut Vec<u8>, st: &Stats) {
    crate::zone::simple_reply(q, wire::REFUSED, out);
    out[3] &= !((wire::RA & 0xff) as u8);
    Stats::bump(&st.refused);
}

impl Handler {
    pub fn new(
        zone: Arc<ArcSwap<Snapshot>>,
        fwd: Arc<Forwarder>,
        stats: Arc<Stats>,
        recursion: AllowList,
    ) -> Handler {
        Handler {
            zone,
            fwd,
            stats,
            recursion,
            inflight: Default::default(),
        }
    }

    /// Cuts an oversized UDP answer down to a truncated one. The limit is
    /// the client's (512, or its EDNS size) on the allow-list, 512 off it.
    fn fit(&self, q: &Query, out: &mut Vec<u8>, st: &Stats, peer: IpAddr) {
        if out.len() <= wire::MIN_UDP {
            return;
        }
        let limit = if self.recursion.allows(peer) {
            q.udp_limit()
        } else {
            OUTSIDE_UDP_LIMIT
        };
        if out.len() > limit {
            wire::truncate(out, wire::HEADER_LEN + q.question.len(), q.edns);
            Stats::bump(&st.truncated);
        }
    }

    /// The synchronous path: zone answers, cache hits, error replies,
    /// refusals. `peer` is the client's address.
    pub fn fast(
        &self,
        msg: &[u8],
        out: &mut Vec<u8>,
        udp: bool,
        peer: IpAddr,
        st: &Stats,
        t: Instant,
    ) -> Fast {
        let q = match wire::parse_query(msg) {
            Ok(q) => q,
            Err(bad) => {
                Stats::bump(&st.malformed);
                return if wire::error_reply(msg, &bad, out) {
                    Fast::Reply
                } else {
                    Fast::Drop
                };
            }
        };
        let snap = self.zone.load();
        match snap.respond(&q, out) {
            Outcome::Answered => {}
            Outcome::Forward => {
                if !self.recursion.allows(peer) {
                    refuse(&q, out, st);
                } else if !self.fwd.cached(&q, out, st) {
                    return Fast::Slow;
                }
            }
            Outcome::Chase { .. } => return Fast::Slow,
        }
        if udp {
            self.fit(&q, out, st, peer);
        }
        st.answered(q.qtype, out, t);
        Fast::Reply
    }

    /// The asynchronous path: upstream forwarding and ExternalName chasing.
    pub async fn slow(&self, msg: &[u8], udp: bool, peer: IpAddr, t: Instant) -> Option<Vec<u8>> {
        let q = wire::parse_query(msg).ok()?;
        let snap = self.zone.load_full();
        let mut out = Vec::with_capacity(512);
        let recurse = self.recursion.allows(peer);
        match snap.respond(&q, &mut out) {
            Outcome::Answered => {}
            Outcome::Forward if !recurse => refuse(&q, &mut out, &self.stats),
            Outcome::Forward => {
                if self.fwd.upstreams().is_empty() {
                    crate::zone::simple_reply(&q, wire::SERVFAIL, &mut out);
                } else {
                    self.fwd.answer(&q, &mut out).await;
                }
            }
            Outcome::Chase { target } => {
                let target = target.to_vec();
                self.chase(&q, &snap, target, recurse, &mut out).await;
            }
        }
        if udp {
            self.fit(&q, &mut out, &self.stats, peer);
        }
        self.stats.answered(q.qtype, &out, t);
        Some(out)
    }

    /// Completes an ExternalName answer: `out` holds the header, question
    /// and CNAME; the target's records for the query type are appended,
    /// from the zone when the target is ours, else from upstream when the
    /// client may `recurse` (else the answer ends at the last CNAME, as an
    /// authoritative-only server's does).
    async fn chase(
        &self,
        q: &Query<'_>,
        snap: &Snapshot,
        mut target: Vec<u8>,
        recurse: bool,
        out: &mut Vec<u8>,
    ) {
        let mut extra: Vec<wire::Record> = Vec::new();
        let mut rcode = wire::NOERROR;
        for depth in 0.. {
            if depth == MAX_CHASE {
                rcode = wire::SERVFAIL;
                break;
            }
            let m = wire::build_query(0, &target, q.qtype, Some(wire::MAX_UDP as u16));
            let Ok(tq) = wire::parse_query(&m) else {
                rcode = wire::SERVFAIL;
                break;
            };
            let mut tmp = Vec::new();
            match snap.respond(&tq, &mut tmp) {
                Outcome::Answered => {
                    match wire::Message::parse(&tmp) {
                        Ok(r) => {
                            rcode = r.rcode();
                            extra.extend(r.answers);
                        }
                        Err(_) => rcode = wire::SERVFAIL,
                    }
                    break;
                }
                Outcome::Chase { target: next } => {
                    let next = next.to_vec();
                    if let Ok(r) = wire::Message::parse(&tmp) {
                        extra.extend(r.answers);
                    }
                    target = next;
                }
                Outcome::Forward if !recurse => break,
                Outcome::Forward => {
                    let lower = target.to_ascii_lowercase();
                    match self.fwd.lookup(&lower, q.qtype).await {
                        Some(r) => {
                            rcode = r.rcode();
                            extra.extend(r.answers);
                        }
                        None => rcode = wire::SERVFAIL,
                    }
                    break;
                }
            }
        }
        let mut w = wire::Writer::resume(std::mem::take(out));
        for r in &extra {
            w.record(r);
        }
        let mut buf = w.buf;
        if buf.len() >= wire::HEADER_LEN {
            let an = u16::from_be_bytes([buf[6], buf[7]]).saturating_add(extra.len() as u16);
            buf[6..8].copy_from_slice(&an.to_be_bytes());
            buf[3] = (buf[3] & 0xf0) | (rcode & 0xf);
            let ar = q.edns.is_some() as u16;
            buf[10..12].copy_from_slice(&ar.to_be_bytes());
        }
        if let Some(e) = q.edns {
            wire::write_opt(&mut buf, e.dnssec_ok, 0);
        }
        *out = buf;
    }
}

/// Packets taken from the socket per system call.
const BATCH: usize = 32;
/// Receive buffer per packet. Larger UDP queries are not answered (a
/// client that big uses TCP); real queries are well under 1 KB.
const RBUF: usize = 4096;

fn to_socket_addr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in.
            let a = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(SocketAddr::from((
                u32::from_be(a.sin_addr.s_addr).to_be_bytes(),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6.
            let a = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                a.sin6_addr.s6_addr.into(),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Serves UDP on `sock` until `stop` is set; blocks the calling thread.
/// Packets come in and go out in batches (`recvmmsg`/`sendmmsg`): one
/// system call each way per batch instead of per query.
pub fn udp_worker(
    sock: Arc<UdpSocket>,
    h: Arc<Handler>,
    st: Arc<Stats>,
    rt: tokio::runtime::Handle,
    stop: Arc<AtomicBool>,
) {
    use std::os::fd::AsRawFd;
    let fd = sock.as_raw_fd();
    let w = UdpWorker { sock, h, st, rt };
    let mut b = Batch::new();
    while !stop.load(Ordering::Relaxed) {
        let n = b.recv(fd);
        if n == 0 {
            continue; // the read timeout (to check `stop`), or a transient error
        }
        b.serve(n, &w, Instant::now());
        b.send(fd);
    }
}

/// What a UDP worker answers with: the handler, its own counters, the
/// socket (slow answers are sent from tasks) and the runtime they run on.
struct UdpWorker {
    sock: Arc<UdpSocket>,
    h: Arc<Handler>,
    st: Arc<Stats>,
    rt: tokio::runtime::Handle,
}

impl UdpWorker {
    /// Answers one packet from `peer`; true when `out` holds a reply to
    /// send with the batch.
    fn serve(&self, msg: &[u8], peer: SocketAddr, out: &mut Vec<u8>, t: Instant) -> bool {
        match self.h.fast(msg, out, true, peer.ip(), &self.st, t) {
            Fast::Reply => true,
            Fast::Drop => false,
            Fast::Slow => self.slow(msg, peer, out, t),
        }
    }

    /// Hands a query that needs an upstream to a task, which sends its own
    /// answer. Past [`MAX_INFLIGHT`] such queries it gets SERVFAIL at once
    /// instead (true: `out` holds it).
    fn slow(&self, msg: &[u8], peer: SocketAddr, out: &mut Vec<u8>, t: Instant) -> bool {
        let h = &self.h;
        if h.inflight.fetch_add(1, Ordering::Relaxed) >= MAX_INFLIGHT {
            h.inflight.fetch_sub(1, Ordering::Relaxed);
            Stats::bump(&self.st.shed);
            let Ok(q) = wire::parse_query(msg) else {
                return false;
            };
            crate::zone::simple_reply(&q, wire::SERVFAIL, out);
            self.st.answered(q.qtype, out, t);
            return true;
        }
        let msg = msg.to_vec();
        let (h, sock) = (h.clone(), self.sock.clone());
        self.rt.spawn(async move {
            if let Some(resp) = h.slow(&msg, true, peer.ip(), t).await {
                let _ = sock.send_to(&resp, peer);
            }
            h.inflight.fetch_sub(1, Ordering::Relaxed);
        });
        false
    }
}

/// One worker's batch: the packet buffers, their replies, and the
/// `mmsghdr` arrays `recvmmsg` fills and `sendmmsg` reads. Allocated once;
/// the headers are pointed at the buffers again before every call.
struct Batch {
    bufs: Vec<u8>,
    addrs: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    out_iovs: Vec<libc::iovec>,
    out_hdrs: Vec<libc::mmsghdr>,
    outs: Vec<Vec<u8>>,
    /// The packets (indices) answered in this batch.
    replies: Vec<usize>,
}

impl Batch {
    fn new() -> Batch {
        Batch {
            bufs: vec![0u8; BATCH * RBUF],
            // SAFETY: all-zero is a valid sockaddr_storage, iovec and mmsghdr.
            addrs: vec![unsafe { std::mem::zeroed() }; BATCH],
            iovs: vec![unsafe { std::mem::zeroed() }; BATCH],
            hdrs: vec![unsafe { std::mem::zeroed() }; BATCH],
            out_iovs: vec![unsafe { std::mem::zeroed() }; BATCH],
            out_hdrs: vec![unsafe { std::mem::zeroed() }; BATCH],
            outs: (0..BATCH).map(|_| Vec::with_capacity(1024)).collect(),
            replies: Vec::with_capacity(BATCH),
        }
    }

    /// Waits for packets and takes up to [`BATCH`]; how many came (0 on the
    /// read timeout or an error).
    fn recv(&mut self, fd: std::os::fd::RawFd) -> usize {
        for i in 0..BATCH {
            self.iovs[i].iov_base = self.bufs[i * RBUF..].as_mut_ptr() as *mut libc::c_void;
            self.iovs[i].iov_len = RBUF;
            let m = &mut self.hdrs[i].msg_hdr;
            m.msg_name = &mut self.addrs[i] as *mut _ as *mut libc::c_void;
            m.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            m.msg_iov = &mut self.iovs[i];
            m.msg_iovlen = 1;
            m.msg_control = std::ptr::null_mut();
            m.msg_controllen = 0;
            m.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
        // SAFETY: every header points at live buffers of the stated sizes.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                self.hdrs.as_mut_ptr(),
                BATCH as u32,
                // (The flags' type differs between glibc and musl.)
                libc::MSG_WAITFORONE as _,
                std::ptr::null_mut(),
            )
        };
        n.max(0) as usize
    }

    /// Answers the first `n` packets received, at time `t`, noting which
    /// have a reply to send.
    fn serve(&mut self, n: usize, w: &UdpWorker, t: Instant) {
        self.replies.clear();
        for i in 0..n {
            let len = (self.hdrs[i].msg_len as usize).min(RBUF);
            let msg = &self.bufs[i * RBUF..i * RBUF + len];
            if self.hdrs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                Stats::bump(&w.st.malformed);
                continue;
            }
            let Some(peer) = to_socket_addr(&self.addrs[i]) else {
                continue;
            };
            if w.serve(msg, peer, &mut self.outs[i], t) {
                self.replies.push(i);
            }
        }
    }

    /// Sends the replies, each to the address its query came from.
    fn send(&mut self, fd: std::os::fd::RawFd) {
        for (k, &i) in self.replies.iter().enumerate() {
            self.out_iovs[k].iov_base = self.outs[i].as_mut_ptr() as *mut libc::c_void;
            self.out_iovs[k].iov_len = self.outs[i].len();
            let m = &mut self.out_hdrs[k].msg_hdr;
            m.msg_name = &mut self.addrs[i] as *mut _ as *mut libc::c_void;
            m.msg_namelen = self.hdrs[i].msg_hdr.msg_namelen;
            m.msg_iov = &mut self.out_iovs[k];
            m.msg_iovlen = 1;
            m.msg_control = std::ptr::null_mut();
            m.msg_controllen = 0;
            m.msg_flags = 0;
        }
        let mut sent = 0;
        while sent < self.replies.len() {
            // SAFETY: headers point at live reply buffers and addresses.
            let r = unsafe {
                libc::sendmmsg(
                    fd,
                    self.out_hdrs[sent..].as_mut_ptr(),
                    (self.replies.len() - sent) as u32,
                    0,
                )
            };
            if r <= 0 {
                // Skip the packet the kernel refused (e.g. an unreachable
                // peer) and go on with the rest.
                sent += 1;
            } else {
                sent += r as usize;
            }
        }
    }
}

/// Serves TCP connections until the returned future is dropped.
pub async fn tcp_accept(listener: tokio::net::TcpListener, h: Arc<Handler>) {
    let limit = Arc::new(tokio::sync::Semaphore::new(1024));
    loop {
        let Ok((s, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            continue; // too many connections: drop this one
        };
        let h = h.clone();
        tokio::spawn(async move {
            let _ = tcp_conn(s, peer.ip(), h).await;
            drop(permit);
        });
    }
}

async fn tcp_conn(
    mut s: tokio::net::TcpStream,
    peer: IpAddr,
    h: Arc<Handler>,
) -> std::io::Result<()> {
    let _ = s.set_nodelay(true);
    let mut out = Vec::with_capacity(4096);
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(TCP_IDLE, s.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            _ => return Ok(()),
        }
        let mut msg = vec![0u8; u16::from_be_bytes(len) as usize];
        match tokio::time::timeout(TCP_IDLE, s.read_exact(&mut msg)).await {
            Ok(Ok(_)) => {}
            _ => return Ok(()),
        }
        let t = Instant::now();
        let resp = match h.fast(&msg, &mut out, false, peer, &h.stats, t) {
            Fast::Reply => std::mem::take(&mut out),
            Fast::Drop => return Ok(()),
            Fast::Slow => match h.slow(&msg, false, peer, t).await {
                Some(r) => r,
                None => return Ok(()),
            },
        };
        let mut framed = Vec::with_capacity(resp.len() + 2);
        framed.extend_from_slice(&(resp.len().min(65535) as u16).to_be_bytes());
        framed.extend_from_slice(&resp[..resp.len().min(65535)]);
        s.write_all(&framed).await?;
        out = resp;
    }
}

/// Binds UDP and TCP on the same address; port 0 picks one free for both.
pub fn bind(addr: SocketAddr) -> std::io::Result<(UdpSocket, std::net::TcpListener)> {
    let mut last = None;
    for _ in 0..20 {
        let udp = udp_socket(addr)?;
        let port = udp.local_addr()?.port();
        match tcp_socket(SocketAddr::new(addr.ip(), port)) {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) if addr.port() == 0 => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free port")))
}

fn udp_socket(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    // Room for bursts while the workers catch up.
    let _ = s.set_recv_buffer_size(8 << 20);
    let _ = s.set_send_buffer_size(8 << 20);
    s.bind(&addr.into())?;
    let s: UdpSocket = s.into();
    s.set_read_timeout(Some(Duration::from_millis(200)))?;
    Ok(s)
}

fn tcp_socket(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zone::{Builder, ZoneConfig};

    /// A handler whose zone has `web` (one ClusterIP), `many` (a headless
    /// Service with 100 endpoints), `ext` (an ExternalName outside the
    /// zone) and `alias` (an ExternalName to `web`); no upstream, so a
    /// forwarded name would get SERVFAIL, never REFUSED.
    fn handler() -> Handler {
        let mut b = Builder::new(ZoneConfig::default());
        use podnet_api::k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
        let obj = |v: serde_json::Value| -> Service { serde_json::from_value(v).unwrap() };
        b.upsert_service(&obj(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5"]}
        })));
        b.upsert_service(&obj(serde_json::json!({
            "metadata": {"name": "many", "namespace": "default"},
            "spec": {"clusterIP": "None"}
        })));
        let eps: Vec<serde_json::Value> = (0..100)
            .map(|i| serde_json::json!({"addresses": [format!("10.244.0.{}", i + 1)]}))
            .collect();
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "many-1", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "many"}},
            "addressType": "IPv4", "endpoints": eps
        }))
        .unwrap();
        b.upsert_slice(&slice);
        b.upsert_service(&obj(serde_json::json!({
            "metadata": {"name": "ext", "namespace": "default"},
            "spec": {"type": "ExternalName", "externalName": "api.example.test"}
        })));
        b.upsert_service(&obj(serde_json::json!({
            "metadata": {"name": "alias", "namespace": "default"},
            "spec": {"type": "ExternalName", "externalName": "web.default.svc.cluster.local"}
        })));
        Handler::new(
            Arc::new(ArcSwap::new(b.publish(true))),
            Arc::new(Forwarder::new(vec![], Duration::from_millis(10), 100)),
            Arc::new(Stats::default()),
            AllowList::cluster(
                "10.96.0.0/12".parse().unwrap(),
                "10.244.0.0/16".parse().unwrap(),
                None,
            ),
        )
    }

    const INSIDE: &str = "10.244.1.2";
    const OUTSIDE: &str = "198.51.100.2";

    fn ask(h: &Handler, name: &str, qtype: u16, edns: Option<u16>, peer: &str) -> Vec<u8> {
        let q = wire::build_query(77, &wire::name_from_str(name).unwrap(), qtype, edns);
        let peer: IpAddr = peer.parse().unwrap();
        let mut out = Vec::new();
        let st = Stats::default();
        let r = match h.fast(&q, &mut out, true, peer, &st, Instant::now()) {
            Fast::Reply => out,
            Fast::Drop => panic!("dropped {name}"),
            Fast::Slow => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(h.slow(&q, true, peer, Instant::now()))
                .expect("a reply"),
        };
        assert_eq!(&r[..2], &q[..2], "ID echoed");
        r
    }

    #[test]
    fn outside_clients_get_refused_small_and_the_zone_in_full() {
        let h = handler();
        for edns in [None, Some(4096)] {
            let q = wire::build_query(
                77,
                &wire::name_from_str("www.example.test").unwrap(),
                wire::TYPE_A,
                edns,
            );
            let peer: IpAddr = OUTSIDE.parse().unwrap();
            let st = Stats::default();
            let mut out = Vec::new();
            // Refused right on the fast path: no task, no upstream.
            assert_eq!(
                h.fast(&q, &mut out, true, peer, &st, Instant::now()),
                Fast::Reply
            );
            let m = wire::Message::parse(&out).unwrap();
            assert_eq!(m.rcode(), wire::REFUSED);
            assert_eq!(m.header.flags & wire::RA, 0, "no recursion for it");
            assert!(m.answers.is_empty() && m.authority.is_empty());
            assert!(out.len() <= q.len(), "{} > {}", out.len(), q.len());
            assert_eq!(st.refused.load(Ordering::Relaxed), 1);
        }
        // The same name from inside the cluster is forwarded (and, with
        // no upstream, fails as SERVFAIL: the refusal is about the client).
        let r = ask(&h, "www.example.test", wire::TYPE_A, None, INSIDE);
        assert_eq!(r[3] & 0xf, wire::SERVFAIL);
        // Cluster names answer everyone, reverse names too.
        for peer in [INSIDE, OUTSIDE] {
            let r = ask(
                &h,
                "web.default.svc.cluster.local",
                wire::TYPE_A,
                None,
                peer,
            );
            let m = wire::Message::parse(&r).unwrap();
            assert_eq!(m.rcode(), wire::NOERROR);
            assert_eq!(m.answers.len(), 1, "{peer}");
            let r = ask(&h, "5.0.96.10.in-addr.arpa", wire::TYPE_PTR, None, peer);
            assert_eq!(wire::Message::parse(&r).unwrap().answers.len(), 1);
            let r = ask(&h, "9.9.96.10.in-addr.arpa", wire::TYPE_PTR, None, peer);
            assert_eq!(r[3] & 0xf, wire::NXDOMAIN, "{peer}");
        }
        // An ExternalName inside the zone is chased for both...
        for peer in [INSIDE, OUTSIDE] {
            let r = ask(
                &h,
                "alias.default.svc.cluster.local",
                wire::TYPE_A,
                None,
                peer,
            );
            assert_eq!(wire::Message::parse(&r).unwrap().answers.len(), 2);
        }
        // ...one pointing outside only for the inside client; the outside
        // one gets the CNAME alone, as from an authoritative-only server.
        let r = ask(
            &h,
            "ext.default.svc.cluster.local",
            wire::TYPE_A,
            None,
            OUTSIDE,
        );
        let m = wire::Message::parse(&r).unwrap();
        assert_eq!(m.rcode(), wire::NOERROR);
        assert_eq!(m.answers.len(), 1);
        assert_eq!(m.answers[0].rtype, wire::TYPE_CNAME);
        let r = ask(
            &h,
            "ext.default.svc.cluster.local",
            wire::TYPE_A,
            None,
            INSIDE,
        );
        assert_eq!(r[3] & 0xf, wire::SERVFAIL, "chased upstream (none here)");
    }

    #[test]
    fn outside_clients_get_at_most_512_bytes_over_udp() {
        let h = handler();
        let name = "many.default.svc.cluster.local";
        // 100 A records: about 1.7 KB.
        let inside = ask(&h, name, wire::TYPE_A, Some(4096), INSIDE);
        assert!(inside.len() > 1500, "{}", inside.len());
        assert_eq!(wire::Message::parse(&inside).unwrap().answers.len(), 100);
        let outside = ask(&h, name, wire::TYPE_A, Some(4096), OUTSIDE);
        let m = wire::Message::parse(&outside).unwrap();
        assert!(m.header.flags & wire::TC != 0);
        assert!(m.answers.is_empty());
        assert!(outside.len() <= OUTSIDE_UDP_LIMIT);
        // Over TCP (no spoofing there) the outside client gets it all.
        let q = wire::build_query(1, &wire::name_from_str(name).unwrap(), 1, Some(4096));
        let mut out = Vec::new();
        let peer: IpAddr = OUTSIDE.parse().unwrap();
        let st = Stats::default();
        assert_eq!(
            h.fast(&q, &mut out, false, peer, &st, Instant::now()),
            Fast::Reply
        );
        assert_eq!(wire::Message::parse(&out).unwrap().answers.len(), 100);
    }
}
