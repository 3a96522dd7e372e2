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
//!
//! Forwarding is recursion on a client's behalf, so only clients on the
//! [`AllowList`] get it (by default loopback and the cluster's and nodes'
//! networks); the server answers everyone else REFUSED for names outside
//! the cluster zone, so it is never an open resolver.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
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

/// The clients that may have names outside the cluster zone resolved for
/// them (recursion, BIND's `allow-recursion`). Everyone may still query
/// the cluster zone and the reverse zones it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowList {
    nets: Vec<ipnet::IpNet>,
}

impl AllowList {
    /// These networks (host bits dropped, duplicates and networks inside
    /// another one removed).
    pub fn new(nets: impl IntoIterator<Item = ipnet::IpNet>) -> AllowList {
        let v: Vec<ipnet::IpNet> = nets.into_iter().map(|n| n.trunc()).collect();
        AllowList {
            nets: ipnet::IpNet::aggregate(&v),
        }
    }

    /// Every client: an open resolver.
    pub fn any() -> AllowList {
        AllowList::new(["0.0.0.0/0", "::/0"].map(|n| n.parse().expect("CIDR")))
    }

    /// Loopback plus the cluster's own networks: the Service CIDR and the
    /// pod network(s). What a server that knows nothing of its host allows.
    pub fn cluster(
        service_cidr: ipnet::IpNet,
        network: ipnet::IpNet,
        ipv6_network: Option<ipnet::IpNet>,
    ) -> AllowList {
        let loopback = ["127.0.0.0/8", "::1/128"].map(|n| n.parse().expect("CIDR"));
        AllowList::new(
            loopback
                .into_iter()
                .chain([service_cidr, network])
                .chain(ipv6_network),
        )
    }

    /// This list plus `more`.
    pub fn with(&self, more: impl IntoIterator<Item = ipnet::IpNet>) -> AllowList {
        AllowList::new(self.nets.iter().copied().chain(more))
    }

    /// Whether `client` may recurse. IPv4-mapped IPv6 addresses (a
    /// dual-stack socket's IPv4 clients) count as the IPv4 address.
    pub fn allows(&self, client: IpAddr) -> bool {
        let ip = client.to_canonical();
        self.nets.iter().any(|n| n.contains(&ip))
    }

    pub fn nets(&self) -> &[ipnet::IpNet] {
        &self.nets
    }

    /// Parses `--allow-recursion` items: `CIDR`, a bare IP (one address),
    /// `default` (the `default` list), `any` (everyone) or `none`. The
    /// items replace the default list; name `default` to extend it.
    pub fn parse(items: &[String], default: &AllowList) -> Result<AllowList, String> {
        let mut nets = Vec::new();
        for it in items.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            match it {
                "default" => nets.extend_from_slice(&default.nets),
                "any" => nets.extend_from_slice(&AllowList::any().nets),
                "none" => {}
                _ => {
                    let net = match it.parse::<ipnet::IpNet>() {
                        Ok(n) => n,
                        Err(_) => it
                            .parse::<IpAddr>()
                            .map(ipnet::IpNet::from)
                            .map_err(|_| format!("{it:?}: want CIDR, IP, default, any or none"))?,
                    };
                    nets.push(net);
                }
            }
        }
        if items.iter().any(|s| s.trim() == "none") && !nets.is_empty() {
            return Err("\"none\" cannot be combined with other entries".into());
        }
        Ok(AllowList::new(nets))
    }
}

impl std::fmt::Display for AllowList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.nets.is_empty() {
            return f.write_str("none");
        }
        for (i, n) in self.nets.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{n}")?;
        }
        Ok(())
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

/// The whole way an upstream reply takes to the client, without the
/// sockets: checked against the question we sent (`id`, and `q`'s name,
/// type and class), judged usable, cut down as the cache stores it, and
/// written into `out` for the client who asked `q`. `false` when the
/// forwarder would not use the reply (it waits or tries another upstream).
/// For tests: the fuzzer feeds it hostile replies.
pub fn relay(resp: &[u8], id: u16, q: &Query, out: &mut Vec<u8>) -> bool {
    let Some(m) = check(resp, id, q.qname.wire(), q.qtype, q.qclass) else {
        return false;
    };
    let Ok((msg, m)) = usable(resp.to_vec(), m) else {
        return false;
    };
    let _ = cache_ttl(&m);
    to_client(&cache_entry(msg, &m), q, out);
    true
}

/// Parses an upstream answer and checks it answers our question, spelled
/// out as we sent it: a compressed question (a pointer into the header
/// reads as a name too) would be longer than the client's, which replaces
/// it in place.
fn check(resp: &[u8], id: u16, name: &[u8], qtype: u16, qclass: u16) -> Option<Message> {
    let m = Message::parse(resp).ok()?;
    if m.header.id != id || m.header.flags & wire::QR == 0 || m.questions.len() != 1 {
        return None;
    }
    let spelled = resp.get(wire::HEADER_LEN..wire::HEADER_LEN + name.len())?;
    if !spelled.eq_ignore_ascii_case(name) {
        return None;
    }
    let (qn, t, c) = &m.questions[0];
    (qn.eq_ignore_ascii_case(name) && *t == qtype && *c == qclass).then_some(m)
}

/// SERVFAIL and REFUSED mean "try another upstream". So does an OPT
/// record that is not the last record: only TSIG or SIG(0), which we never
/// ask for, may follow it, and it could not be cut out of the middle
/// without breaking compression pointers behind it. So does a name that
/// points into bytes [`to_client`] rewrites in place (the header's ID,
/// flags and counts, or a TTL that ages): it would read differently, or
/// not at all, in the client's copy. No real server compresses that way.
fn usable(resp: Vec<u8>, m: Message) -> Result<(Vec<u8>, Message), Attempt> {
    if let Some((s, _)) = m.opt_span {
        if m.ttl_offsets.iter().any(|&o| o > s) {
            return Err(Attempt::Failed);
        }
    }
    let rewritten =
        |p: usize| p < wire::HEADER_LEN || m.ttl_offsets.iter().any(|&o| (o..o + 4).contains(&p));
    if m.pointer_targets.iter().any(|&p| rewritten(p)) {
        return Err(Attempt::Failed);
    }
    match m.rcode() {
        wire::SERVFAIL | wire::REFUSED | wire::NOTIMP | wire::FORMERR => Err(Attempt::Failed),
        _ => Ok((resp, m)),
    }
}

/// Where the records of a parsed message end: bytes after that are junk,
/// and the client's OPT must not be appended behind them. `check` made
/// sure the one question is spelled out, uncompressed.
fn parsed_end(msg: &[u8], m: &Message) -> usize {
    let question_end = wire::HEADER_LEN + m.questions.first().map_or(0, |q| q.0.len() + 4);
    // Each TTL is followed by RDLENGTH and the record data.
    let record_end = |ttl_at: usize| {
        msg.get(ttl_at + 4..ttl_at + 6)
            .map(|b| ttl_at + 6 + u16::from_be_bytes([b[0], b[1]]) as usize)
            .unwrap_or(msg.len())
    };
    m.ttl_offsets
        .iter()
        .map(|&o| record_end(o))
        .chain(m.opt_span.map(|(_, e)| e))
        .fold(question_end, usize::max)
        .min(msg.len())
}

/// The cacheable form: without trailing junk, and without the OPT record,
/// which [`usable`] made sure is the last record.
fn cache_entry(mut msg: Vec<u8>, m: &Message) -> Cached {
    msg.truncate(parsed_end(&msg, m));
    if let Some((s, _)) = m.opt_span {
        if s >= wire::HEADER_LEN {
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

    fn nets(v: &[&str]) -> Vec<ipnet::IpNet> {
        v.iter().map(|n| n.parse().unwrap()).collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn allow_list_decision() {
        let l = AllowList::cluster(
            "10.96.0.0/12".parse().unwrap(),
            "10.244.0.0/16".parse().unwrap(),
            Some("fd00:10:244::/56".parse().unwrap()),
        )
        .with(nets(&["192.168.1.7/24"]));
        for yes in [
            "127.0.0.1",
            "127.0.0.2",
            "::1",
            "10.96.0.10",
            "10.111.255.255",
            "10.244.3.4",
            "fd00:10:244:0:ff::1",
            "192.168.1.200",
            // A dual-stack socket's IPv4 clients are IPv4 clients.
            "::ffff:10.244.3.4",
            "::ffff:127.0.0.1",
        ] {
            assert!(l.allows(ip(yes)), "{yes} should be allowed by {l}");
        }
        for no in [
            "10.95.255.255",
            "10.112.0.0",
            "10.245.0.1",
            "192.168.2.1",
            "198.51.100.2",
            "8.8.8.8",
            "::2",
            "fd00:10:245::1",
            "::ffff:198.51.100.2",
            "0.0.0.0",
        ] {
            assert!(!l.allows(ip(no)), "{no} should be refused by {l}");
        }
        // Host bits dropped, covered networks merged away.
        assert_eq!(
            l.to_string(),
            "10.96.0.0/12,10.244.0.0/16,127.0.0.0/8,192.168.1.0/24,::1/128,fd00:10:244::/56"
        );
        assert!(AllowList::any().allows(ip("203.0.113.1")));
        assert!(AllowList::any().allows(ip("2001:db8::1")));
        let none = AllowList::new([]);
        assert!(!none.allows(ip("127.0.0.1")));
        assert_eq!(none.to_string(), "none");
    }

    #[test]
    fn allow_recursion_flag() {
        let default = AllowList::new(nets(&["127.0.0.0/8", "10.244.0.0/16"]));
        let p = |v: &[&str]| {
            AllowList::parse(
                &v.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                &default,
            )
        };
        // Items replace the default...
        let l = p(&["203.0.113.0/24"]).unwrap();
        assert_eq!(l.nets(), nets(&["203.0.113.0/24"]));
        assert!(!l.allows(ip("127.0.0.1")));
        // ...unless `default` is named; a bare IP is one address.
        let l = p(&["default", "203.0.113.9", "2001:db8::1"]).unwrap();
        assert!(l.allows(ip("127.0.0.1")) && l.allows(ip("10.244.9.9")));
        assert!(l.allows(ip("203.0.113.9")) && !l.allows(ip("203.0.113.10")));
        assert!(l.allows(ip("2001:db8::1")) && !l.allows(ip("2001:db8::2")));
        assert_eq!(p(&["any"]).unwrap(), AllowList::any());
        assert_eq!(p(&["none"]).unwrap().nets(), &[] as &[ipnet::IpNet]);
        assert_eq!(p(&[" default ", ""]).unwrap(), default);
        let e = p(&["default", "10.0.0.0/33"]).unwrap_err();
        assert!(e.contains("10.0.0.0/33"), "{e}");
        assert!(p(&["everyone"]).unwrap_err().contains("everyone"));
        assert!(p(&["none", "10.0.0.0/8"]).is_err());
    }

    /// An upstream answer to `a.test A` (ID 7) with one A record.
    fn upstream_answer() -> Vec<u8> {
        let name = wire::name_from_str("a.test").unwrap();
        let h = wire::Header {
            id: 7,
            flags: wire::QR | wire::RA,
            ..Default::default()
        };
        let mut w = wire::Writer::with_question(h, &name, wire::TYPE_A, wire::CLASS_IN);
        w.record(&wire::Record {
            name,
            rtype: wire::TYPE_A,
            class: 1,
            ttl: 60,
            rdata: wire::RData::A([192, 0, 2, 1].into()),
        });
        w.set_counts(1, 0, 0);
        w.buf
    }

    /// What `relay` gives a client that asked `A.test A` with EDNS.
    fn relayed(resp: &[u8]) -> Option<Message> {
        let cq = wire::build_query(
            0xbeef,
            &wire::name_from_str("A.test").unwrap(),
            1,
            Some(1232),
        );
        let q = wire::parse_query(&cq).unwrap();
        let mut out = Vec::new();
        if !relay(resp, 7, &q, &mut out) {
            return None;
        }
        assert_eq!(
            &out[wire::HEADER_LEN..wire::HEADER_LEN + q.question.len()],
            q.question
        );
        Some(Message::parse(&out).expect("the client's answer parses"))
    }

    #[test]
    fn upstream_replies_in_odd_shapes() {
        let good = upstream_answer();
        let m = relayed(&good).unwrap();
        assert_eq!(m.header.id, 0xbeef);
        assert_eq!(m.answers.len(), 1);
        assert!(m.opt_span.is_some());
        // Another ID: not ours.
        let mut other = good.clone();
        other[1] = 8;
        assert!(relayed(&other).is_none());
        // Junk after the last record is dropped, not left in front of the
        // client's OPT.
        let mut junk = good.clone();
        junk.extend_from_slice(&[0, 0xc0]);
        assert_eq!(relayed(&junk).unwrap().answers.len(), 1);
        // The question's root written as a pointer into the header (a zero
        // byte there): the same name, but not as we spelled it.
        let mut ptr = good[..wire::HEADER_LEN + 7].to_vec();
        ptr.extend_from_slice(&[0xc0, 4]);
        ptr.extend_from_slice(&good[wire::HEADER_LEN + 8..]);
        assert!(Message::parse(&ptr).is_ok());
        assert!(relayed(&ptr).is_none());
        // An OPT that is not the last record.
        let mut opt_first = good[..wire::HEADER_LEN + 12].to_vec();
        wire::write_opt(&mut opt_first, false, 0);
        opt_first.extend_from_slice(&good[wire::HEADER_LEN + 12..]);
        opt_first[7] = 0; // an: 0
        opt_first[11] = 2; // ar: OPT, A
        assert_eq!(Message::parse(&opt_first).unwrap().additional.len(), 1);
        assert!(relayed(&opt_first).is_none());
        // The same OPT last is fine, and replaced by the client's.
        let mut opt_last = good.clone();
        wire::write_opt(&mut opt_last, true, 0);
        opt_last[11] = 1;
        let m = relayed(&opt_last).unwrap();
        assert_eq!(m.answers.len(), 1);
        assert_eq!(m.header.ar, 1);
    }

    /// A reply whose one A record's owner name is `owner` (raw wire bytes),
    /// after `good`'s own record.
    fn with_second_owner(good: &[u8], owner: &[u8]) -> Vec<u8> {
        let mut b = good.to_vec();
        b.extend_from_slice(owner);
        b.extend_from_slice(&[0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 2]);
        b[7] = 2; // an: 2
        b
    }

    #[test]
    fn names_pointing_into_rewritten_bytes_are_refused() {
        let good = upstream_answer();
        // Found by fuzzing: a name pointing into the header's ID (here the
        // byte 0, which reads as the root) reads as garbage once the
        // client's ID is written over it.
        let into_id = with_second_owner(&good, &[0xc0, 0]);
        assert_eq!(Message::parse(&into_id).unwrap().answers[1].name, [0]);
        assert!(relayed(&into_id).is_none());
        // The same for a TTL, which ages in the cache: the first record's
        // TTL is 0,0,0,60, so its first byte reads as the root today.
        let ttl = Message::parse(&good).unwrap().ttl_offsets[0];
        let into_ttl = with_second_owner(&good, &[0xc0, ttl as u8]);
        assert_eq!(Message::parse(&into_ttl).unwrap().answers[1].name, [0]);
        assert!(relayed(&into_ttl).is_none());
        // A pointer to the question's name is what servers really send.
        let into_question = with_second_owner(&good, &[0xc0, wire::HEADER_LEN as u8]);
        assert_eq!(relayed(&into_question).unwrap().answers.len(), 2);
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
