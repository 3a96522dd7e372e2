//! Everything outside the cluster zone: forwarding to upstream resolvers,
//! with failover, and a bounded cache of their answers.
//!
//! Upstreams are tried in order starting from the last one that worked; a
//! timeout, a refused port, a SERVFAIL/REFUSED or a garbled answer moves on
//! to the next. When every upstream fails the client gets SERVFAIL, never
//! silence. Each attempt uses a fresh connected UDP socket (random port,
//! random ID, answer checked against the question), and a truncated answer
//! is fetched again over TCP.
//!
//! The cache keeps positive answers for their smallest TTL and negative ones
//! (NXDOMAIN, NODATA) for the SOA's negative TTL (RFC 2308), both capped. It
//! stores the upstream message without its OPT record; a hit copies it,
//! rewrites the ID, the client's question spelling and the aged TTLs.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::stats::Stats;
use crate::wire::{self, Message, Query};

/// Longest time a positive answer is cached (CoreDNS's default).
pub const MAX_POSITIVE_TTL: u32 = 3600;
/// Longest time a negative answer is cached (CoreDNS's default).
pub const MAX_NEGATIVE_TTL: u32 = 1800;
const SHARDS: usize = 16;

/// Cache key: lowercased wire name, type, class.
type Key = (Box<[u8]>, u16, u16);

struct Cached {
    /// The upstream answer without OPT; ID and question to be rewritten.
    msg: Box<[u8]>,
    /// (offset, original TTL) of every record.
    ttls: Box<[(usize, u32)]>,
    stored: Instant,
    expires: Instant,
}

/// A bounded, sharded answer cache.
pub struct Cache {
    shards: Vec<Mutex<HashMap<Key, Arc<Cached>>>>,
    per_shard: usize,
}

impl Cache {
    /// A cache of at most `size` answers (0 disables it).
    pub fn new(size: usize) -> Cache {
        Cache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: size.div_ceil(SHARDS),
        }
    }

    fn shard(&self, name: &[u8], qtype: u16) -> &Mutex<HashMap<Key, Arc<Cached>>> {
        let h = crate::zone::hash_name(name) ^ qtype as u64;
        &self.shards[(h % SHARDS as u64) as usize]
    }

    fn get(&self, name: &[u8], qtype: u16, qclass: u16) -> Option<Arc<Cached>> {
        if self.per_shard == 0 {
            return None;
        }
        let key: Key = (name.into(), qtype, qclass);
        let s = self
            .shard(name, qtype)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let e = s.get(&key)?;
        (e.expires > Instant::now()).then(|| e.clone())
    }

    fn put(&self, name: &[u8], qtype: u16, qclass: u16, c: Cached) {
        if self.per_shard == 0 {
            return;
        }
        let mut s = self
            .shard(name, qtype)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if s.len() >= self.per_shard {
            let now = Instant::now();
            s.retain(|_, v| v.expires > now);
            if s.len() >= self.per_shard {
                // Still full: drop an arbitrary entry (the map's first).
                if let Some(k) = s.keys().next().cloned() {
                    s.remove(&k);
                }
            }
        }
        s.insert((name.into(), qtype, qclass), Arc::new(c));
    }

    /// Answers held (expired ones included until evicted).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why upstream resolution failed.
#[derive(Debug)]
enum Attempt {
    /// No usable answer from this upstream.
    Failed,
}

/// The forwarder: upstream list, failover state, cache.
pub struct Forwarder {
    upstreams: Vec<SocketAddr>,
    preferred: AtomicUsize,
    timeout: Duration,
    pub cache: Cache,
    /// Failed attempts per upstream (same order as `upstreams`).
    pub errors: Vec<AtomicU64>,
}

fn random_id() -> u16 {
    let mut b = [0u8; 2];
    // SAFETY: a valid 2-byte buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 2, 0) };
    if n != 2 {
        let t = Instant::now().elapsed().subsec_nanos() ^ std::process::id();
        return t as u16;
    }
    u16::from_ne_bytes(b)
}

/// The smallest TTL to cache a message for, if it may be cached at all.
fn cache_ttl(m: &Message) -> Option<u32> {
    let rcode = m.rcode();
    let soa_neg = || {
        m.authority.iter().find_map(|r| match &r.rdata {
            wire::RData::Soa { minimum, .. } => Some(r.ttl.min(*minimum)),
            _ => None,
        })
    };
    if rcode == wire::NXDOMAIN || (rcode == wire::NOERROR && m.answers.is_empty()) {
        return soa_neg()
            .map(|t| t.min(MAX_NEGATIVE_TTL))
            .filter(|t| *t > 0);
    }
    if rcode != wire::NOERROR {
        return None;
    }
    m.answers
        .iter()
        .chain(&m.authority)
        .chain(&m.additional)
        .map(|r| r.ttl)
        .min()
        .map(|t| t.min(MAX_POSITIVE_TTL))
        .filter(|t| *t > 0)
}

impl Forwarder {
    pub fn new(upstreams: Vec<SocketAddr>, timeout: Duration, cache_size: usize) -> Forwarder {
        let errors = upstreams.iter().map(|_| AtomicU64::new(0)).collect();
        Forwarder {
            upstreams,
            preferred: AtomicUsize::new(0),
            timeout,
            cache: Cache::new(cache_size),
            errors,
        }
    }

    pub fn upstreams(&self) -> &[SocketAddr] {
        &self.upstreams
    }

    /// Answers `q` from the cache into `out`, if it can.
    pub fn cached(&self, q: &Query, out: &mut Vec<u8>, st: &Stats) -> bool {
        match self.cache.get(q.qname.wire(), q.qtype, q.qclass) {
            Some(c) => {
                Stats::bump(&st.cache_hits);
                to_client(&c, q, out);
                true
            }
            None => {
                Stats::bump(&st.cache_misses);
                false
            }
        }
    }

    /// Answers `q` from upstream (or the cache) into `out`; SERVFAIL when
    /// no upstream gives a usable answer.
    pub async fn answer(&self, q: &Query<'_>, out: &mut Vec<u8>) {
        match self.resolve(q.qname.wire(), q.qtype, q.qclass).await {
            Some(c) => to_client(&c, q, out),
            None => crate::zone::simple_reply(q, wire::SERVFAIL, out),
        }
    }

    /// The upstream answer for a name (lowercased wire form), as a parsed
    /// message; `None` when every upstream failed.
    pub async fn lookup(&self, name: &[u8], qtype: u16) -> Option<Message> {
        let c = self.resolve(name, qtype, wire::CLASS_IN).await?;
        Message::parse(&c.msg).ok()
    }

    async fn resolve(&self, name: &[u8], qtype: u16, qclass: u16) -> Option<Arc<Cached>> {
        if let Some(c) = self.cache.get(name, qtype, qclass) {
            return Some(c);
        }
        let n = self.upstreams.len();
        let first = self.preferred.load(Relaxed);
        for k in 0..n {
            let i = (first + k) % n;
            match self.ask(self.upstreams[i], name, qtype, qclass).await {
                Ok((msg, parsed)) => {
                    if i != first {
                        tracing::info!(upstream = %self.upstreams[i], "failing over to upstream");
                        self.preferred.store(i, Relaxed);
                    }
                    let c = cache_entry(msg, &parsed);
                    if let Some(ttl) = cache_ttl(&parsed) {
                        let now = Instant::now();
                        self.cache.put(
                            name,
                            qtype,
                            qclass,
                            Cached {
                                msg: c.msg.clone(),
                                ttls: c.ttls.clone(),
                                stored: now,
                                expires: now + Duration::from_secs(ttl as u64),
                            },
                        );
                    }
                    return Some(Arc::new(c));
                }
                Err(Attempt::Failed) => {
                    self.errors[i].fetch_add(1, Relaxed);
                }
            }
        }
        None
    }

    /// One upstream, UDP then (on truncation) TCP.
    async fn ask(
        &self,
        up: SocketAddr,
        name: &[u8],
        qtype: u16,
        qclass: u16,
    ) -> Result<(Vec<u8>, Message), Attempt> {
        let id = random_id();
        let mut query = wire::build_query(id, name, qtype, Some(wire::OUR_EDNS_SIZE));
        if qclass != wire::CLASS_IN {
            let n = query.len();
            // The class sits right before the OPT record (11 bytes).
            query[n - 13..n - 11].copy_from_slice(&qclass.to_be_bytes());
        }
        let deadline = tokio::time::Instant::now() + self.timeout;
        let bind: SocketAddr = if up.is_ipv4() {
            "0.0.0.0:0".parse().expect("addr")
        } else {
            "[::]:0".parse().expect("addr")
        };
        let sock = tokio::net::UdpSocket::bind(bind)
            .await
            .map_err(|_| Attempt::Failed)?;
        sock.connect(up).await.map_err(|_| Attempt::Failed)?;
        sock.send(&query).await.map_err(|_| Attempt::Failed)?;
        let mut buf = vec![0u8; 65535];
        loop {
            let n = match tokio::time::timeout_at(deadline, sock.recv(&mut buf)).await {
                Ok(Ok(n)) => n,
                _ => return Err(Attempt::Failed),
            };
            let resp = &buf[..n];
            let Some(m) = check(resp, id, name, qtype, qclass) else {
                // Not our answer (spoofed or stale): keep waiting.
                continue;
            };
            if m.header.flags & wire::TC != 0 {
                return self
                    .ask_tcp(up, &query, id, name, qtype, qclass, deadline)
                    .await;
            }
            return usable(resp.to_vec(), m);
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn ask_tcp(
        &self,
        up: SocketAddr,
        query: &[u8],
        id: u16,
        name: &[u8],
        qtype: u16,
        qclass: u16,
        deadline: tokio::time::Instant,
    ) -> Result<(Vec<u8>, Message), Attempt> {
        let work = async {
            let mut s = tokio::net::TcpStream::connect(up).await.ok()?;
            let mut framed = (query.len() as u16).to_be_bytes().to_vec();
            framed.extend_from_slice(query);
            s.write_all(&framed).await.ok()?;
            let mut len = [0u8; 2];
            s.read_exact(&mut len).await.ok()?;
            let mut resp = vec![0u8; u16::from_be_bytes(len) as usize];
            s.read_exact(&mut resp).await.ok()?;
            Some(resp)
        };
        let resp = tokio::time::timeout_at(deadline, work)
            .await
            .ok()
            .flatten()
            .ok_or(Attempt::Failed)?;
        let m = check(&resp, id, name, qtype, qclass).ok_or(Attempt::Failed)?;
        usable(resp, m)
    }
}

/// Parses an upstream answer and checks it answers our question.
fn check(resp: &[u8], id: u16, name: &[u8], qtype: u16, qclass: u16) -> Option<Message> {
    let m = Message::parse(resp).ok()?;
    if m.header.id != id || m.header.flags & wire::QR == 0 || m.questions.len() != 1 {
        return None;
    }
    let (qn, t, c) = &m.questions[0];
    (qn.eq_ignore_ascii_case(name) && *t == qtype && *c == qclass).then_some(m)
}

/// SERVFAIL and REFUSED mean "try another upstream".
fn usable(resp: Vec<u8>, m: Message) -> Result<(Vec<u8>, Message), Attempt> {
    match m.rcode() {
        wire::SERVFAIL | wire::REFUSED | wire::NOTIMP | wire::FORMERR => Err(Attempt::Failed),
        _ => Ok((resp, m)),
    }
}

/// The cacheable form: OPT removed when it is the last record (it always
/// is in practice; otherwise the message is kept whole).
fn cache_entry(mut msg: Vec<u8>, m: &Message) -> Cached {
    if let Some((s, e)) = m.opt_span {
        if e == msg.len() && msg.len() >= wire::HEADER_LEN {
            msg.truncate(s);
            let ar = m.header.ar.saturating_sub(1);
            msg[10..12].copy_from_slice(&ar.to_be_bytes());
        }
    }
    let ttls: Vec<(usize, u32)> = m
        .ttl_offsets
        .iter()
        .copied()
        .zip(m.answers.iter().chain(&m.authority).chain(&m.additional))
        .map(|(o, r)| (o, r.ttl))
        .filter(|(o, _)| o + 4 <= msg.len())
        .collect();
    let now = Instant::now();
    Cached {
        msg: msg.into_boxed_slice(),
        ttls: ttls.into_boxed_slice(),
        stored: now,
        expires: now,
    }
}

/// Writes a cached answer for the client: its ID, its question spelling,
/// aged TTLs, RD/CD as it asked, and an OPT if it sent one.
fn to_client(c: &Cached, q: &Query, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&c.msg);
    if out.len() < wire::HEADER_LEN {
        crate::zone::simple_reply(q, wire::SERVFAIL, out);
        return;
    }
    out[0..2].copy_from_slice(&q.header.id.to_be_bytes());
    let flags = u16::from_be_bytes([out[2], out[3]]);
    let flags =
        (flags & !(wire::RD | wire::CD | wire::TC)) | (q.header.flags & (wire::RD | wire::CD));
    out[2..4].copy_from_slice(&flags.to_be_bytes());
    let qend = wire::HEADER_LEN + q.question.len();
    if out.len() >= qend && out[4..6] == [0, 1] {
        out[wire::HEADER_LEN..qend].copy_from_slice(q.question);
    }
    let age = c.stored.elapsed().as_secs() as u32;
    for &(off, ttl) in c.ttls.iter() {
        out[off..off + 4].copy_from_slice(&ttl.saturating_sub(age).to_be_bytes());
    }
    if let Some(e) = q.edns {
        let ar = u16::from_be_bytes([out[10], out[11]]).saturating_add(1);
        out[10..12].copy_from_slice(&ar.to_be_bytes());
        wire::write_opt(out, e.dnssec_ok, 0);
    }
}

/// Nameservers from a resolv.conf, port 53.
pub fn from_resolv_conf(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == "nameserver").then_some(())?;
            let ip: std::net::IpAddr = w.next()?.split('%').next()?.parse().ok()?;
            Some(SocketAddr::new(ip, 53))
        })
        .collect()
}

/// Parses `IP`, `IP:PORT` or `[IPv6]:PORT` (port 53 by default).
pub fn parse_upstream(s: &str) -> Option<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Some(a);
    }
    let ip: std::net::IpAddr = s.trim_matches(|c| c == '[' || c == ']').parse().ok()?;
    Some(SocketAddr::new(ip, 53))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_and_flags() {
        let t = "# x\nnameserver 10.0.0.2\nsearch a\nnameserver fe80::1%eth0\nnameserver bogus\n";
        let v = from_resolv_conf(t);
        assert_eq!(
            v,
            vec![
                "10.0.0.2:53".parse().unwrap(),
                "[fe80::1]:53".parse().unwrap()
            ]
        );
        assert_eq!(
            parse_upstream("1.2.3.4"),
            Some("1.2.3.4:53".parse().unwrap())
        );
        assert_eq!(
            parse_upstream("1.2.3.4:5353"),
            Some("1.2.3.4:5353".parse().unwrap())
        );
        assert_eq!(parse_upstream("::1"), Some("[::1]:53".parse().unwrap()));
        assert_eq!(parse_upstream("nope"), None);
    }

    #[test]
    fn cache_bounded_and_ttls() {
        let c = Cache::new(16);
        for i in 0..100u16 {
            let now = Instant::now();
            c.put(
                format!("n{i}").as_bytes(),
                1,
                1,
                Cached {
                    msg: Box::new([]),
                    ttls: Box::new([]),
                    stored: now,
                    expires: now + Duration::from_secs(60),
                },
            );
        }
        assert!(c.len() <= 16, "{}", c.len());
        // Negative TTL from the SOA, capped; positive from the records.
        let neg = Message {
            header: wire::Header {
                flags: wire::QR | 3,
                ..Default::default()
            },
            authority: vec![wire::Record {
                name: vec![0],
                rtype: wire::TYPE_SOA,
                class: 1,
                ttl: 900,
                rdata: wire::RData::Soa {
                    mname: vec![0],
                    rname: vec![0],
                    serial: 1,
                    refresh: 1,
                    retry: 1,
                    expire: 1,
                    minimum: 60,
                },
            }],
            ..Default::default()
        };
        assert_eq!(cache_ttl(&neg), Some(60));
        let servfail = Message {
            header: wire::Header {
                flags: wire::QR | 2,
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(cache_ttl(&servfail), None);
    }
}
