//! The cluster zone: what the Kubernetes DNS-Based Service Discovery spec
//! (schema 1.1.0) says must exist, built from Services, EndpointSlices and
//! Namespaces, and the answer to any query for it.
//!
//! Pure: no I/O. Two halves:
//! - [`Builder`] owns the objects and the records each Service contributes.
//!   A change re-derives only the changed Service's records and recompiles
//!   only the names whose records (or existence) changed, so an update costs
//!   work proportional to the change. Memory is watched (10,000 Services
//!   and 50,000 endpoints in under 30 MB): endpoints are kept only for
//!   headless Services (the only ones that publish them), and each record
//!   is stored once, in its name's node.
//! - [`Snapshot`] is immutable and shared by every server thread. For each
//!   (lowercased name, query type) it holds the encoded answer body, with
//!   compression pointers laid out for a response whose question is that
//!   name, so answering is one hash lookup and a copy. Each name's answers
//!   are packed into one allocation with the name. Snapshots share
//!   their 256 shards (`Arc`); publishing clones only the shards a change
//!   touched.
//!
//! Names that exist without records (`svc.<zone>`, `<ns>.svc.<zone>`,
//! `_tcp.<svc>...`) answer NODATA; every other name under the zone answers
//! NXDOMAIN at once (search-path misses such as `<x>.<ns>.svc.<zone>.<zone>`
//! never go upstream). Negative answers carry the zone's SOA, whose minimum
//! is the configured TTL (RFC 2308).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::wire::{self, Header, NameBuf, Query, RData, Record, Writer};

/// The spec version `dns-version.<zone>` reports.
pub const SCHEMA_VERSION: &str = "1.1.0";
const SHARDS: usize = 256;
/// Bodies are capped so a huge headless Service still fits a TCP message.
const MAX_BODY: usize = 60_000;
/// The label EndpointSlices carry naming their Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
const TOLERATE_UNREADY: &str = "service.alpha.kubernetes.io/tolerate-unready-endpoints";

/// What the zone serves.
#[derive(Debug, Clone)]
pub struct ZoneConfig {
    /// The cluster domain, e.g. `cluster.local`.
    pub zone: String,
    /// TTL of every record, and the negative-caching TTL.
    pub ttl: u32,
    /// Answer `a-b-c-d.<ns>.pod.<zone>` (CoreDNS's `pods insecure`).
    pub pods: bool,
    /// Networks whose reverse names we are authoritative for (the service
    /// and cluster CIDRs): a miss there is NXDOMAIN, not a forward.
    pub reverse: Vec<IpNet>,
}

impl Default for ZoneConfig {
    fn default() -> Self {
        ZoneConfig {
            zone: podnet_api::netconfig::DEFAULT_ZONE.into(),
            ttl: 5,
            pods: false,
            reverse: vec![
                podnet_api::netconfig::DEFAULT_SERVICE_CIDR
                    .parse()
                    .expect("default CIDR"),
                podnet_api::netconfig::DEFAULT_NETWORK
                    .parse()
                    .expect("default CIDR"),
            ],
        }
    }
}

/// A fast, well-mixed hash of a lowercased wire name. The top byte picks
/// the shard, the rest indexes the table.
pub fn hash_name(b: &[u8]) -> u64 {
    let mut h: u64 = b.len() as u64;
    for chunk in b.chunks(8) {
        let mut a = [0u8; 8];
        a[..chunk.len()].copy_from_slice(chunk);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(a)).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

fn shard_of(h: u64) -> usize {
    (h >> 56) as usize % SHARDS
}

/// One precomputed answer: counts and the bytes after the question.
#[derive(Debug, Clone, Copy)]
struct Rrset<'a> {
    qtype: u16,
    an: u16,
    ar: u16,
    body: &'a [u8],
}

/// Everything a name answers, while being compiled.
#[derive(Debug, Default)]
struct Entry {
    rrsets: Vec<(u16, u16, u16, Vec<u8>)>,
    /// An ExternalName Service: a CNAME to chase for other types.
    cname: Option<Vec<u8>>,
}

impl Entry {
    /// Packs the entry and its name into one allocation (tens of
    /// thousands of names: one block each, not five):
    /// `[name len][name][cname len][cname][count]` then per rrset
    /// `[qtype][an][ar][body len]` (u16 each) and the body.
    fn pack(&self, name: &[u8]) -> Arc<[u8]> {
        let cname = self.cname.as_deref().unwrap_or_default();
        let size =
            3 + name.len() + cname.len() + self.rrsets.iter().map(|r| 8 + r.3.len()).sum::<usize>();
        let mut b = Vec::with_capacity(size);
        b.push(name.len() as u8);
        b.extend_from_slice(name);
        b.push(cname.len() as u8);
        b.extend_from_slice(cname);
        b.push(self.rrsets.len().min(255) as u8);
        for (t, an, ar, body) in self.rrsets.iter().take(255) {
            for v in [*t, *an, *ar, body.len() as u16] {
                b.extend_from_slice(&v.to_be_bytes());
            }
            b.extend_from_slice(body);
        }
        b.into()
    }
}

/// A packed entry, read in place.
#[derive(Clone, Copy)]
struct Packed<'a>(&'a [u8]);

impl<'a> Packed<'a> {
    fn key(self) -> &'a [u8] {
        let l = self.0[0] as usize;
        &self.0[1..1 + l]
    }

    fn cname_at(self) -> usize {
        1 + self.0[0] as usize
    }

    /// An ExternalName Service: the CNAME target to chase.
    fn cname(self) -> Option<&'a [u8]> {
        let at = self.cname_at();
        let l = self.0[at] as usize;
        (l > 0).then(|| &self.0[at + 1..at + 1 + l])
    }

    fn rrsets(self) -> impl Iterator<Item = Rrset<'a>> {
        let b = self.0;
        let at = self.cname_at();
        let mut i = at + 1 + b[at] as usize;
        let mut left = b[i];
        i += 1;
        std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            left -= 1;
            let u = |o: usize| u16::from_be_bytes([b[i + o], b[i + o + 1]]);
            let (qtype, an, ar, len) = (u(0), u(2), u(4), u(6) as usize);
            let body = &b[i + 8..i + 8 + len];
            i += 8 + len;
            Some(Rrset {
                qtype,
                an,
                ar,
                body,
            })
        })
    }
}

type Table = hashbrown::HashTable<Arc<[u8]>>;

/// An immutable view of the zone, swapped in atomically on every change.
pub struct Snapshot {
    /// False until the first full load: the zone answers SERVFAIL, never a
    /// wrong NXDOMAIN.
    pub ready: bool,
    zone: Vec<u8>,
    pod_zone: Vec<u8>,
    ttl: u32,
    pods: bool,
    reverse: Vec<(IpNet, usize)>,
    soa_rdata: Vec<u8>,
    shards: Vec<Arc<Table>>,
    names: usize,
}

/// What to do with a query after the zone has seen it.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome<'a> {
    /// `out` holds the complete response.
    Answered,
    /// Not ours: forward upstream.
    Forward,
    /// `out` holds header, question and the CNAME (one answer, no OPT);
    /// the target must be resolved for the query type and appended.
    Chase { target: &'a [u8] },
}

fn begin(out: &mut Vec<u8>, q: &Query, rcode: u8, aa: bool, an: u16, ns: u16, ar: u16) {
    out.clear();
    Header {
        id: q.header.id,
        flags: wire::response_flags(q.header.flags, rcode, if aa { wire::AA } else { 0 }),
        qd: 1,
        an,
        ns,
        ar: ar + q.edns.is_some() as u16,
    }
    .write(out);
    out.extend_from_slice(q.question);
}

fn end(out: &mut Vec<u8>, q: &Query) {
    if let Some(e) = q.edns {
        wire::write_opt(out, e.dnssec_ok, 0);
    }
}

/// Writes a complete error-style response (SERVFAIL, REFUSED) for `q`.
pub fn simple_reply(q: &Query, rcode: u8, out: &mut Vec<u8>) {
    begin(out, q, rcode, false, 0, 0, 0);
    end(out, q);
}

impl Snapshot {
    /// An empty, not-ready zone: what the server answers before the store
    /// has been read.
    pub fn empty(cfg: &ZoneConfig) -> Snapshot {
        let mut b = Builder::new(cfg.clone());
        let mut s = b.publish_inner(false);
        s.ready = false;
        s
    }

    /// Names with an entry (records or empty non-terminals).
    pub fn name_count(&self) -> usize {
        self.names
    }

    fn get(&self, key: &[u8]) -> Option<Packed<'_>> {
        let h = hash_name(key);
        self.shards[shard_of(h)]
            .find(h, |e| Packed(e).key() == key)
            .map(|e| Packed(e))
    }

    /// Whether this query name belongs to the cluster zone or one of our
    /// reverse zones (the forwarder's cache must not shadow it).
    pub fn owns(&self, q: &NameBuf) -> bool {
        q.zone_start(&self.zone).is_some() || self.reverse_apex(q).is_some()
    }

    fn reverse_apex(&self, q: &NameBuf) -> Option<usize> {
        let ip = wire::parse_reverse(q)?;
        self.reverse
            .iter()
            .find(|(net, _)| net.contains(&ip))
            .map(|(_, labels)| *labels)
    }

    /// Answers `q` into `out` if it is ours.
    pub fn respond<'a>(&'a self, q: &Query, out: &mut Vec<u8>) -> Outcome<'a> {
        let n = &q.qname;
        let apex = match n.zone_start(&self.zone) {
            Some(i) => i,
            None => {
                let Some(labels) = self.reverse_apex(n) else {
                    // Reverse names for single IPs we serve but outside our
                    // networks, e.g. a Service with an external ClusterIP.
                    if q.qtype == wire::TYPE_PTR && self.ready {
                        if let Some(e) = self.get(n.wire()) {
                            return self.found(q, e, out);
                        }
                    }
                    return Outcome::Forward;
                };
                // The apex is the octet-aligned (or nibble-aligned) network.
                n.label_count().saturating_sub(labels)
            }
        };
        if !self.ready {
            simple_reply(q, wire::SERVFAIL, out);
            return Outcome::Answered;
        }
        if q.qclass != wire::CLASS_IN && q.qclass != wire::CLASS_ANY {
            simple_reply(q, wire::REFUSED, out);
            return Outcome::Answered;
        }
        if q.qtype == wire::TYPE_AXFR || q.qtype == wire::TYPE_IXFR {
            simple_reply(q, wire::REFUSED, out);
            return Outcome::Answered;
        }
        if self.pods {
            if let Some(p) = n.zone_start(&self.pod_zone) {
                return self.pod(q, p, apex, out);
            }
        }
        match self.get(n.wire()) {
            Some(e) => self.found(q, e, out),
            None => {
                self.negative(q, true, apex, out);
                Outcome::Answered
            }
        }
    }

    fn found<'a>(&self, q: &Query, e: Packed<'a>, out: &mut Vec<u8>) -> Outcome<'a> {
        if let Some(target) = e.cname() {
            if q.qtype != wire::TYPE_CNAME && q.qtype != wire::TYPE_ANY {
                if let Some(r) = e.rrsets().find(|r| r.qtype == wire::TYPE_CNAME) {
                    out.clear();
                    Header {
                        id: q.header.id,
                        flags: wire::response_flags(q.header.flags, wire::NOERROR, wire::AA),
                        qd: 1,
                        an: r.an,
                        ns: 0,
                        ar: 0,
                    }
                    .write(out);
                    out.extend_from_slice(q.question);
                    out.extend_from_slice(r.body);
                    return Outcome::Chase { target };
                }
            }
        }
        // ANY: one RRset, the lowest type (A before AAAA before SRV), as
        // RFC 8482 allows; CoreDNS answers NODATA.
        let rr = match e.rrsets().find(|r| r.qtype == q.qtype) {
            None if q.qtype == wire::TYPE_ANY => e.rrsets().next(),
            r => r,
        };
        match rr {
            Some(r) => {
                begin(out, q, wire::NOERROR, true, r.an, 0, r.ar);
                out.extend_from_slice(r.body);
                end(out, q);
            }
            None => {
                let apex = q
                    .qname
                    .zone_start(&self.zone)
                    .or_else(|| {
                        self.reverse_apex(&q.qname)
                            .map(|l| q.qname.label_count().saturating_sub(l))
                    })
                    // A reverse name outside our networks: the SOA owner is
                    // the name itself.
                    .unwrap_or(0);
                self.negative(q, false, apex, out);
            }
        }
        Outcome::Answered
    }

    /// NXDOMAIN or NODATA with the SOA in authority, owned by the apex
    /// (a pointer into the question).
    fn negative(&self, q: &Query, nxdomain: bool, apex_label: usize, out: &mut Vec<u8>) {
        let rcode = if nxdomain {
            wire::NXDOMAIN
        } else {
            wire::NOERROR
        };
        begin(out, q, rcode, true, 0, 1, 0);
        let off = wire::HEADER_LEN + q.qname.label_offset(apex_label);
        out.extend_from_slice(&(0xc000 | off as u16).to_be_bytes());
        out.extend_from_slice(&wire::TYPE_SOA.to_be_bytes());
        out.extend_from_slice(&wire::CLASS_IN.to_be_bytes());
        out.extend_from_slice(&self.ttl.to_be_bytes());
        out.extend_from_slice(&(self.soa_rdata.len() as u16).to_be_bytes());
        out.extend_from_slice(&self.soa_rdata);
        end(out, q);
    }

    /// Whether `<ns>.svc.<zone>` exists; `ns` is a lowercased label.
    /// Built on the stack: this runs per pod query.
    fn namespace_exists(&self, ns: &[u8]) -> bool {
        let mut key = [0u8; wire::MAX_NAME];
        let len = 1 + ns.len() + 4 + self.zone.len();
        if ns.is_empty() || len > key.len() {
            return false;
        }
        key[0] = ns.len() as u8;
        key[1..1 + ns.len()].copy_from_slice(ns);
        let at = 1 + ns.len();
        key[at..at + 4].copy_from_slice(b"\x03svc");
        key[at + 4..len].copy_from_slice(&self.zone);
        self.get(&key[..len]).is_some()
    }

    /// `a-b-c-d.<ns>.pod.<zone>`: synthesized from the name itself.
    fn pod<'a>(&self, q: &Query, pod_label: usize, apex: usize, out: &mut Vec<u8>) -> Outcome<'a> {
        let n = &q.qname;
        match pod_label {
            // pod.<zone> exists, without records; <ns>.pod.<zone> too, for
            // a namespace that exists.
            0 => {
                self.negative(q, false, apex, out);
                Outcome::Answered
            }
            1 => {
                let exists = self.namespace_exists(n.label(0));
                self.negative(q, !exists, apex, out);
                Outcome::Answered
            }
            2 => {
                // Like CoreDNS's `pods insecure`: only in a namespace that
                // exists (`<ns>.svc.<zone>` does exactly then: a Namespace,
                // or a Service inside one, holds it).
                if !self.namespace_exists(n.label(1)) {
                    self.negative(q, true, apex, out);
                    return Outcome::Answered;
                }
                let text = String::from_utf8_lossy(n.label(0));
                let ip: Option<IpAddr> = if text.matches('-').count() == 3 {
                    text.replace('-', ".").parse().ok()
                } else {
                    text.replace('-', ":").parse().ok()
                };
                let Some(ip) = ip else {
                    self.negative(q, true, apex, out);
                    return Outcome::Answered;
                };
                let (want, rdata) = match ip {
                    IpAddr::V4(v4) => (wire::TYPE_A, RData::A(v4)),
                    IpAddr::V6(v6) => (wire::TYPE_AAAA, RData::Aaaa(v6)),
                };
                if q.qtype != want && q.qtype != wire::TYPE_ANY {
                    self.negative(q, false, apex, out);
                    return Outcome::Answered;
                }
                begin(out, q, wire::NOERROR, true, 1, 0, 0);
                let mut w = Writer::resume(std::mem::take(out));
                w.learn_question(n.wire());
                w.record(&Record {
                    name: n.wire().to_vec(),
                    rtype: want,
                    class: wire::CLASS_IN,
                    ttl: self.ttl,
                    rdata,
                });
                *out = w.buf;
                end(out, q);
                Outcome::Answered
            }
            _ => {
                self.negative(q, true, apex, out);
                Outcome::Answered
            }
        }
    }

    /// Answers a name and type as a parsed message (tests, tools).
    pub fn answer(&self, name: &str, qtype: u16) -> Option<wire::Message> {
        let qn = wire::name_from_str(name).ok()?;
        let m = wire::build_query(7, &qn, qtype, Some(4096));
        let q = wire::parse_query(&m).ok()?;
        let mut out = Vec::new();
        match self.respond(&q, &mut out) {
            Outcome::Answered | Outcome::Chase { .. } => {}
            Outcome::Forward => return None,
        }
        match wire::Message::parse(&out) {
            Ok(m) => Some(m),
            Err(e) => panic!("unparsable answer for {name}: {e}: {out:?}"),
        }
    }
}

/// One record a Service (or the zone itself) contributes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Rec {
    rtype: u16,
    rdata: RData,
}

#[derive(Debug, Default)]
struct Node {
    recs: Vec<(u32, Rec)>,
    /// Records at or below this name, plus fixed references: the name
    /// exists while this is positive.
    refs: u32,
}

#[derive(Debug, Clone, PartialEq)]
enum SvcKind {
    /// ClusterIP not allocated yet: no records until it is.
    Pending,
    ClusterIp(Box<[IpAddr]>),
    Headless,
    ExternalName(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq)]
struct SvcInfo {
    kind: SvcKind,
    /// Named ports: (name, protocol, port).
    ports: Box<[NamedPort]>,
    publish_not_ready: bool,
}

/// One endpoint address (an endpoint with two addresses is two of these).
/// Kept small: a cluster holds tens of thousands.
#[derive(Debug, Clone, PartialEq)]
struct Ep {
    addr: IpAddr,
    hostname: Option<Box<str>>,
    ready: bool,
}

#[derive(Debug, Clone, PartialEq)]
struct SliceInfo {
    service: Option<Box<str>>,
    endpoints: Box<[Ep]>,
    ports: Box<[NamedPort]>,
}

type SvcKey = (String, String);

/// A port: (name, empty when unnamed; lowercase protocol; port), for SRV
/// records.
type NamedPort = (Box<str>, Box<str>, u16);

struct Owned {
    id: u32,
    hash: u64,
    names: Box<[Box<[u8]>]>,
}

/// Owns the cluster objects DNS cares about and maintains the snapshot.
pub struct Builder {
    cfg: ZoneConfig,
    zone: Vec<u8>,
    serial: u32,
    services: HashMap<SvcKey, SvcInfo>,
    slices: HashMap<SvcKey, SliceInfo>,
    by_service: HashMap<SvcKey, Vec<Box<str>>>,
    namespaces: HashSet<String>,
    next_owner: u32,
    /// Services deleted while not headless since the last relist: their
    /// slices were not kept, so one recreated headless needs a relist.
    gone_non_headless: HashSet<SvcKey>,
    /// A Service turned headless whose slices were stored without their
    /// endpoints: the caller must relist.
    needs_relist: bool,
    /// What each Service contributed: its owner id in `nodes`, a hash of
    /// its records (to skip unchanged Services) and the names they sit at,
    /// one per record. The records themselves live only in `nodes`.
    owned: HashMap<SvcKey, Owned>,
    nodes: HashMap<Vec<u8>, Node>,
    shards: Vec<Arc<Table>>,
    names: usize,
    pending: BTreeSet<SvcKey>,
    dirty: HashSet<Vec<u8>>,
}

const FIXED_OWNER: u32 = 0;

fn valid_label(s: &str) -> bool {
    !s.is_empty() && s.len() <= 63 && !s.contains('.')
}

fn dashed(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => v6.to_string().replace(':', "-"),
    }
}

fn prepend(label: &str, name: &[u8]) -> Option<Vec<u8>> {
    if !valid_label(label) || label.len() + 1 + name.len() > wire::MAX_NAME {
        return None;
    }
    let mut v = Vec::with_capacity(label.len() + 1 + name.len());
    v.push(label.len() as u8);
    v.extend(label.bytes().map(|c| c.to_ascii_lowercase()));
    v.extend_from_slice(name);
    Some(v)
}

fn a_rec(ip: IpAddr) -> Rec {
    match ip {
        IpAddr::V4(v4) => Rec {
            rtype: wire::TYPE_A,
            rdata: RData::A(v4),
        },
        IpAddr::V6(v6) => Rec {
            rtype: wire::TYPE_AAAA,
            rdata: RData::Aaaa(v6),
        },
    }
}

/// The parent of a wire name (without its first label).
fn parent(name: &[u8]) -> Option<&[u8]> {
    let l = *name.first()? as usize;
    if l == 0 {
        return None;
    }
    name.get(1 + l..)
}

impl Builder {
    pub fn new(cfg: ZoneConfig) -> Builder {
        let zone = wire::name_from_str(&cfg.zone)
            .unwrap_or_else(|_| wire::name_from_str("cluster.local").expect("valid"));
        let mut b = Builder {
            cfg,
            zone,
            serial: 1,
            services: HashMap::new(),
            slices: HashMap::new(),
            by_service: HashMap::new(),
            namespaces: HashSet::new(),
            next_owner: 1,
            gone_non_headless: HashSet::new(),
            needs_relist: false,
            owned: HashMap::new(),
            nodes: HashMap::new(),
            shards: (0..SHARDS).map(|_| Arc::new(Table::new())).collect(),
            names: 0,
            pending: BTreeSet::new(),
            dirty: HashSet::new(),
        };
        b.add_fixed();
        b
    }

    pub fn config(&self) -> &ZoneConfig {
        &self.cfg
    }

    fn add_fixed(&mut self) {
        let z = self.zone.clone();
        let txt = prepend("dns-version", &z).expect("short");
        self.add_rec(
            FIXED_OWNER,
            txt,
            Rec {
                rtype: wire::TYPE_TXT,
                rdata: RData::Txt(vec![SCHEMA_VERSION.as_bytes().to_vec()]),
            },
        );
        let svc = prepend("svc", &z).expect("short");
        self.adjust(&svc, 1);
        if self.cfg.pods {
            let pod = prepend("pod", &z).expect("short");
            self.adjust(&pod, 1);
        }
        // The apex SOA is added at publish time (its serial changes).
        self.adjust(&z, 1);
    }

    fn soa(&self) -> RData {
        let mname = prepend("ns", &prepend("dns", &self.zone).expect("short")).expect("short");
        RData::Soa {
            mname,
            rname: prepend("hostmaster", &self.zone).expect("short"),
            serial: self.serial,
            refresh: 7200,
            retry: 1800,
            expire: 86400,
            minimum: self.cfg.ttl,
        }
    }

    fn under_zone(&self, name: &[u8]) -> bool {
        name.len() >= self.zone.len() && name.ends_with(&self.zone) && {
            // On a label boundary: walk labels until the suffix starts.
            let mut i = 0;
            let off = name.len() - self.zone.len();
            while i < off {
                i += 1 + name[i] as usize;
            }
            i == off
        }
    }

    /// Adds `delta` references to a name and, inside the zone, to every
    /// ancestor up to the apex; names that appear or vanish become dirty.
    fn adjust(&mut self, name: &[u8], delta: i64) {
        let inside = self.under_zone(name);
        let mut cur: &[u8] = name;
        loop {
            let node = self.nodes.entry(cur.to_vec()).or_default();
            let before = node.refs;
            node.refs = (node.refs as i64 + delta).max(0) as u32;
            if (before == 0) != (node.refs == 0) {
                self.dirty.insert(cur.to_vec());
            }
            if !inside || cur == &self.zone[..] {
                break;
            }
            match parent(cur) {
                Some(p) => cur = p,
                None => break,
            }
        }
    }

    fn add_rec(&mut self, owner: u32, name: Vec<u8>, rec: Rec) {
        self.adjust(&name, 1);
        let node = self.nodes.entry(name.clone()).or_default();
        node.recs.push((owner, rec));
        self.dirty.insert(name);
    }

    /// Takes back every record `owner` put at `names` (one entry per
    /// record, so reference counts drop by as many).
    fn remove_owner_recs(&mut self, owner: u32, names: &[Box<[u8]>]) {
        for name in names {
            if let Some(node) = self.nodes.get_mut(&name[..]) {
                node.recs.retain(|(o, _)| *o != owner);
            }
            self.dirty.insert(name.to_vec());
            self.adjust(name, -1);
        }
    }

    /// Whether the store must be listed again (and clears the flag):
    /// endpoints of non-headless Services are not kept (a ClusterIP
    /// Service's DNS records do not depend on them), so a Service that
    /// becomes headless needs them read again.
    pub fn take_relist(&mut self) -> bool {
        std::mem::take(&mut self.needs_relist)
    }

    /// Records or replaces a Service.
    pub fn upsert_service(&mut self, svc: &Service) {
        let ns = svc
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let Some(name) = svc.metadata.name.clone() else {
            return;
        };
        let spec = svc.spec.clone().unwrap_or_default();
        let kind = if spec.type_.as_deref() == Some("ExternalName") {
            match spec
                .external_name
                .as_deref()
                .and_then(|n| wire::name_from_str(n).ok())
            {
                Some(w) if w.len() > 1 => SvcKind::ExternalName(w),
                _ => SvcKind::Pending,
            }
        } else if spec.cluster_ip.as_deref() == Some("None") {
            SvcKind::Headless
        } else {
            let mut ips: Vec<IpAddr> = spec
                .cluster_ips
                .iter()
                .flatten()
                .chain(spec.cluster_ip.iter())
                .filter_map(|s| s.parse().ok())
                .collect();
            ips.sort();
            ips.dedup();
            if ips.is_empty() {
                SvcKind::Pending
            } else {
                SvcKind::ClusterIp(ips.into())
            }
        };
        let ports = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|p| named_port(p.name.as_deref(), p.protocol.as_deref(), Some(p.port)))
            .collect();
        let tolerate = svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(TOLERATE_UNREADY))
            .map(|v| v == "true")
            .unwrap_or(false);
        let info = SvcInfo {
            kind,
            ports,
            publish_not_ready: spec.publish_not_ready_addresses.unwrap_or(false) || tolerate,
        };
        let key = (ns, name);
        if self.services.get(&key) != Some(&info) {
            if info.kind == SvcKind::Headless {
                // Its slices may have been dropped while it was not headless.
                let was_other = self
                    .services
                    .get(&key)
                    .is_some_and(|i| i.kind != SvcKind::Headless);
                self.needs_relist |= was_other || self.gone_non_headless.remove(&key);
            }
            self.services.insert(key.clone(), info);
            self.pending.insert(key);
        }
    }

    pub fn delete_service(&mut self, ns: &str, name: &str) {
        let key = (ns.to_string(), name.to_string());
        if let Some(old) = self.services.remove(&key) {
            if old.kind != SvcKind::Headless {
                self.gone_non_headless.insert(key.clone());
                // Bounded: past this, a relist forgets them all.
                self.needs_relist |= self.gone_non_headless.len() > 4096;
            }
            self.pending.insert(key);
        }
    }

    /// Records or replaces an EndpointSlice.
    pub fn upsert_slice(&mut self, s: &EndpointSlice) {
        let ns = s
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let Some(name) = s.metadata.name.clone() else {
            return;
        };
        let service: Option<Box<str>> = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
            .map(|v| v.as_str().into());
        let fqdn = s.address_type.eq_ignore_ascii_case("FQDN");
        let endpoints = s
            .endpoints
            .iter()
            .flatten()
            .filter(|_| !fqdn)
            .flat_map(|e| {
                let hostname: Option<Box<str>> = e
                    .hostname
                    .as_deref()
                    .filter(|h| valid_label(h))
                    .map(Into::into);
                let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
                e.addresses
                    .iter()
                    .filter_map(|a| a.parse().ok())
                    .map(move |addr| Ep {
                        addr,
                        hostname: hostname.clone(),
                        ready,
                    })
            })
            .collect();
        let ports = s
            .ports
            .iter()
            .flatten()
            .filter_map(|p| named_port(p.name.as_deref(), p.protocol.as_deref(), p.port))
            .collect();
        // Only headless Services publish endpoints: slices of a known
        // ClusterIP or ExternalName Service are not kept at all.
        let keep = match &service {
            Some(svc) => self
                .services
                .get(&(ns.clone(), svc.to_string()))
                .is_none_or(|i| i.kind == SvcKind::Headless),
            None => false,
        };
        if !keep {
            self.delete_slice(&ns, &name);
            return;
        }
        let info = SliceInfo {
            service,
            endpoints,
            ports,
        };
        let key = (ns.clone(), name.clone());
        if self.slices.get(&key) == Some(&info) {
            return;
        }
        self.delete_slice(&ns, &name);
        if let Some(svc) = &info.service {
            let sk = (ns.clone(), svc.to_string());
            let set = self.by_service.entry(sk.clone()).or_default();
            if !set.iter().any(|n| **n == *name) {
                set.push(name.as_str().into());
            }
            self.pending.insert(sk);
        }
        self.slices.insert(key, info);
    }

    pub fn delete_slice(&mut self, ns: &str, name: &str) {
        let key = (ns.to_string(), name.to_string());
        if let Some(old) = self.slices.remove(&key) {
            if let Some(svc) = old.service {
                let sk = (ns.to_string(), svc.to_string());
                if let Some(set) = self.by_service.get_mut(&sk) {
                    set.retain(|n| **n != *name);
                    if set.is_empty() {
                        self.by_service.remove(&sk);
                    }
                }
                self.pending.insert(sk);
            }
        }
    }

    /// A Namespace makes `<ns>.svc.<zone>` exist (NODATA, not NXDOMAIN).
    pub fn upsert_namespace(&mut self, name: &str) {
        if valid_label(name) && self.namespaces.insert(name.to_string()) {
            if let Some(n) = self.ns_name(name) {
                self.adjust(&n, 1);
            }
        }
    }

    pub fn delete_namespace(&mut self, name: &str) {
        if self.namespaces.remove(name) {
            if let Some(n) = self.ns_name(name) {
                self.adjust(&n, -1);
            }
        }
    }

    fn ns_name(&self, ns: &str) -> Option<Vec<u8>> {
        prepend(ns, &prepend("svc", &self.zone)?)
    }

    /// Forgets everything (before a relist), keeping the published shards
    /// so the change is computed against what is served.
    pub fn clear_objects(&mut self) {
        let svcs: Vec<SvcKey> = self.services.keys().cloned().collect();
        for (ns, n) in svcs {
            self.delete_service(&ns, &n);
        }
        let slices: Vec<SvcKey> = self.slices.keys().cloned().collect();
        for (ns, n) in slices {
            self.delete_slice(&ns, &n);
        }
        let nss: Vec<String> = self.namespaces.iter().cloned().collect();
        for n in nss {
            self.delete_namespace(&n);
        }
        self.gone_non_headless.clear();
    }

    /// The records a Service contributes, by name.
    fn service_records(&self, key: &SvcKey) -> Vec<(Vec<u8>, Rec)> {
        let mut out = Vec::new();
        let Some(svc) = self.services.get(key) else {
            return out;
        };
        let (ns, name) = key;
        let Some(base) = self.ns_name(ns).and_then(|n| prepend(name, &n)) else {
            return out;
        };
        // An unnamed port has no `_<port>._<proto>` name (spec 2.3.2), only
        // its SRV record at the Service name.
        let srv_name = |port: &str, proto: &str| -> Option<Vec<u8>> {
            if port.is_empty() {
                return None;
            }
            prepend(&format!("_{port}"), &prepend(&format!("_{proto}"), &base)?)
        };
        // A port's SRV record pointing at `target`: at `_<port>._<proto>`
        // when the port is named, and at the Service name in any case.
        let srvs = |(pname, proto, port): &NamedPort, target: &Vec<u8>| {
            let srv = Rec {
                rtype: wire::TYPE_SRV,
                rdata: RData::Srv {
                    priority: 0,
                    weight: 100,
                    port: *port,
                    target: target.clone(),
                },
            };
            let named = srv_name(pname, proto).map(|n| (n, srv.clone()));
            named.into_iter().chain([(base.clone(), srv)])
        };
        match &svc.kind {
            SvcKind::Pending => {}
            SvcKind::ExternalName(target) => out.push((
                base.clone(),
                Rec {
                    rtype: wire::TYPE_CNAME,
                    rdata: RData::Name(target.clone()),
                },
            )),
            SvcKind::ClusterIp(ips) => {
                for ip in ips.iter() {
                    out.push((base.clone(), a_rec(*ip)));
                    out.push((
                        wire::reverse_name(*ip),
                        Rec {
                            rtype: wire::TYPE_PTR,
                            rdata: RData::Name(base.clone()),
                        },
                    ));
                }
                for p in &svc.ports {
                    out.extend(srvs(p, &base));
                }
            }
            SvcKind::Headless => {
                let mut seen = HashSet::new();
                for slice in self
                    .by_service
                    .get(key)
                    .into_iter()
                    .flatten()
                    .filter_map(|s| self.slices.get(&(ns.clone(), s.to_string())))
                {
                    for ep in slice.endpoints.iter() {
                        if !ep.ready && !svc.publish_not_ready {
                            continue;
                        }
                        {
                            let ip = &ep.addr;
                            let host = ep
                                .hostname
                                .as_deref()
                                .map(String::from)
                                .unwrap_or_else(|| dashed(*ip));
                            if !seen.insert((host.clone(), *ip)) {
                                continue;
                            }
                            let Some(hname) = prepend(&host, &base) else {
                                continue;
                            };
                            out.push((base.clone(), a_rec(*ip)));
                            out.push((hname.clone(), a_rec(*ip)));
                            out.push((
                                wire::reverse_name(*ip),
                                Rec {
                                    rtype: wire::TYPE_PTR,
                                    rdata: RData::Name(hname.clone()),
                                },
                            ));
                            for p in slice.ports.iter() {
                                out.extend(srvs(p, &hname));
                            }
                        }
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// Re-derives the pending Services' records.
    fn refresh_pending(&mut self) {
        use std::hash::{Hash, Hasher};
        for key in std::mem::take(&mut self.pending) {
            let new = self.service_records(&key);
            let mut h = std::collections::hash_map::DefaultHasher::new();
            new.hash(&mut h);
            let hash = h.finish();
            let old = self.owned.remove(&key);
            let id = match old {
                Some(o) if o.hash == hash => {
                    self.owned.insert(key, o);
                    continue;
                }
                Some(o) => {
                    self.remove_owner_recs(o.id, &o.names);
                    o.id
                }
                None => {
                    let id = self.next_owner;
                    self.next_owner = self.next_owner.wrapping_add(1).max(1);
                    id
                }
            };
            if new.is_empty() {
                continue;
            }
            let names: Box<[Box<[u8]>]> = new.iter().map(|(n, _)| n[..].into()).collect();
            for (name, rec) in new {
                self.add_rec(id, name, rec);
            }
            self.owned.insert(key, Owned { id, hash, names });
        }
    }

    /// Encodes every answer a name gives.
    fn compile(&self, name: &[u8], node: &Node) -> Entry {
        let ttl = self.cfg.ttl;
        let mut recs: Vec<&Rec> = node.recs.iter().map(|(_, r)| r).collect();
        recs.sort();
        recs.dedup();
        let mut entry = Entry::default();
        let mut types: Vec<u16> = recs.iter().map(|r| r.rtype).collect();
        types.dedup();
        let record = |r: &Rec, owner: &[u8]| Record {
            name: owner.to_vec(),
            rtype: r.rtype,
            class: wire::CLASS_IN,
            ttl,
            rdata: r.rdata.clone(),
        };
        // ANY has no body of its own: the lookup answers it with the name's
        // first RRset (RFC 8482's minimal ANY answer; saves memory).
        for &t in types.iter() {
            let of_type: Vec<&Rec> = recs.iter().copied().filter(|r| r.rtype == t).collect();
            if of_type.is_empty() {
                continue;
            }
            let mut w = Writer::with_question(Header::default(), name, t, wire::CLASS_IN);
            let start = w.buf.len();
            let n = of_type.iter().filter(|r| r.rtype == wire::TYPE_SRV).count() as u16;
            let mut an = 0u16;
            let mut targets = Vec::new();
            for r in &of_type {
                let mut rec = record(r, name);
                if let RData::Srv { weight, target, .. } = &mut rec.rdata {
                    *weight = (100 / n.max(1)).max(1);
                    if t == wire::TYPE_SRV && !targets.contains(target) {
                        targets.push(target.clone());
                    }
                }
                let before = w.buf.len();
                w.record(&rec);
                if w.buf.len() - start > MAX_BODY {
                    w.buf.truncate(before);
                    break;
                }
                an += 1;
            }
            // SRV answers carry the targets' addresses (spec 2.3.2, 2.4.2).
            let mut ar = 0u16;
            for target in &targets {
                let Some(tn) = self.nodes.get(target) else {
                    continue;
                };
                let mut addrs: Vec<&Rec> = tn
                    .recs
                    .iter()
                    .map(|(_, r)| r)
                    .filter(|r| r.rtype == wire::TYPE_A || r.rtype == wire::TYPE_AAAA)
                    .collect();
                addrs.sort();
                addrs.dedup();
                for r in addrs {
                    let before = w.buf.len();
                    w.record(&record(r, target));
                    if w.buf.len() - start > MAX_BODY {
                        w.buf.truncate(before);
                        break;
                    }
                    ar += 1;
                }
            }
            if t == wire::TYPE_CNAME {
                if let Some(RData::Name(target)) = of_type.first().map(|r| &r.rdata) {
                    entry.cname = Some(target.clone());
                }
            }
            entry.rrsets.push((t, an, ar, w.buf[start..].to_vec()));
        }
        entry
    }

    /// Applies pending changes and returns the snapshot to serve.
    pub fn publish(&mut self, ready: bool) -> Arc<Snapshot> {
        Arc::new(self.publish_inner(ready))
    }

    /// Whether anything changed since the last publish.
    pub fn has_changes(&self) -> bool {
        !self.pending.is_empty() || !self.dirty.is_empty()
    }

    fn publish_inner(&mut self, ready: bool) -> Snapshot {
        self.refresh_pending();
        // The apex SOA carries a serial that moves with every change.
        if !self.dirty.is_empty() || self.serial == 1 {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as u32)
                .unwrap_or(0);
            self.serial = now.max(self.serial.wrapping_add(1));
            let soa = Rec {
                rtype: wire::TYPE_SOA,
                rdata: self.soa(),
            };
            let z = self.zone.clone();
            if let Some(node) = self.nodes.get_mut(&z) {
                node.recs
                    .retain(|(o, r)| !(*o == FIXED_OWNER && r.rtype == wire::TYPE_SOA));
                node.recs.push((FIXED_OWNER, soa));
            }
            self.dirty.insert(z);
        }
        for name in std::mem::take(&mut self.dirty) {
            let h = hash_name(&name);
            let live = self.nodes.get(&name).filter(|n| n.refs > 0);
            let compiled = live.map(|n| self.compile(&name, n).pack(&name));
            let shard = Arc::make_mut(&mut self.shards[shard_of(h)]);
            match shard.find_entry(h, |e| Packed(e).key() == &name[..]) {
                Ok(occ) => {
                    if let Some(e) = compiled {
                        *occ.into_mut() = e;
                    } else {
                        occ.remove();
                        self.names -= 1;
                    }
                }
                Err(_) => {
                    if let Some(e) = compiled {
                        shard.insert_unique(h, e, |e| hash_name(Packed(e).key()));
                        self.names += 1;
                    }
                }
            }
            if let Some(n) = self.nodes.get_mut(&name) {
                if n.refs == 0 && n.recs.is_empty() {
                    self.nodes.remove(&name);
                } else {
                    // Most names hold one record; a Vec grown by push keeps
                    // room for four. At 10,000 Services that slack is
                    // megabytes.
                    n.recs.shrink_to_fit();
                }
            }
        }
        // Uncompressed: it is copied into responses of any layout.
        let soa_rdata = match self.soa() {
            RData::Soa {
                mname,
                rname,
                serial,
                refresh,
                retry,
                expire,
                minimum,
            } => {
                let mut v = mname;
                v.extend_from_slice(&rname);
                for x in [serial, refresh, retry, expire, minimum] {
                    v.extend_from_slice(&x.to_be_bytes());
                }
                v
            }
            _ => unreachable!("soa() returns an SOA"),
        };
        let reverse = self
            .cfg
            .reverse
            .iter()
            .map(|net| {
                let labels = match net {
                    IpNet::V4(n) => (n.prefix_len() / 8) as usize + 2,
                    IpNet::V6(n) => (n.prefix_len() / 4) as usize + 2,
                };
                (*net, labels)
            })
            .collect();
        Snapshot {
            ready,
            zone: self.zone.clone(),
            pod_zone: prepend("pod", &self.zone).unwrap_or_default(),
            ttl: self.cfg.ttl,
            pods: self.cfg.pods,
            reverse,
            soa_rdata,
            shards: self.shards.clone(),
            names: self.names,
        }
    }

    /// Services known (for metrics).
    pub fn service_count(&self) -> usize {
        self.services.len()
    }
}

/// A port as SRV records use it: (name, protocol, port), both lowercased.
/// An unnamed port has an empty name: it has no `_<port>._<proto>` record
/// (spec 2.3.2), but the SRV records on the Service name itself (an
/// extension CoreDNS has, and clients use) list every port, as CoreDNS's
/// do. Out-of-range ports have none.
fn named_port(
    name: Option<&str>,
    protocol: Option<&str>,
    port: Option<i32>,
) -> Option<(Box<str>, Box<str>, u16)> {
    let n = name.unwrap_or_default();
    let port = u16::try_from(port?).ok()?;
    Some((
        n.to_ascii_lowercase().into_boxed_str(),
        protocol
            .unwrap_or("TCP")
            .to_ascii_lowercase()
            .into_boxed_str(),
        port,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use podnet_api::k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use podnet_api::k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
    use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use wire::*;

    fn svc(ns: &str, name: &str, ip: &str, ports: &[(&str, i32, &str)]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                cluster_ips: if ip == "None" || ip.is_empty() {
                    None
                } else {
                    Some(vec![ip.into()])
                },
                ports: Some(
                    ports
                        .iter()
                        .map(|(n, p, proto)| ServicePort {
                            name: (!n.is_empty()).then(|| n.to_string()),
                            port: *p,
                            protocol: Some(proto.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn external(ns: &str, name: &str, target: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("ExternalName".into()),
                external_name: Some(target.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn slice(
        ns: &str,
        name: &str,
        svc: &str,
        eps: &[(&str, Option<&str>, bool)],
        ports: &[(&str, i32)],
    ) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                labels: Some([(SERVICE_NAME_LABEL.to_string(), svc.to_string())].into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: Some(
                eps.iter()
                    .map(|(ip, host, ready)| Endpoint {
                        addresses: vec![ip.to_string()],
                        hostname: host.map(String::from),
                        conditions: Some(EndpointConditions {
                            ready: Some(*ready),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p)| EndpointPort {
                        name: Some(n.to_string()),
                        port: Some(*p),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
        }
    }

    fn fixture() -> Builder {
        let mut b = Builder::new(ZoneConfig::default());
        b.upsert_namespace("default");
        b.upsert_namespace("empty");
        b.upsert_service(&svc(
            "default",
            "kubernetes",
            "10.96.0.1",
            &[("https", 443, "TCP")],
        ));
        b.upsert_service(&svc(
            "shop",
            "web",
            "10.96.5.5",
            &[("http", 80, "TCP"), ("", 81, "TCP"), ("dns", 53, "UDP")],
        ));
        b.upsert_service(&svc("shop", "db", "None", &[("pg", 5432, "TCP")]));
        b.upsert_slice(&slice(
            "shop",
            "db-abc",
            "db",
            &[
                ("10.244.1.5", Some("db-0"), true),
                ("10.244.2.6", None, true),
                ("10.244.3.7", Some("db-2"), false),
            ],
            &[("pg", 5432)],
        ));
        b.upsert_service(&svc("shop", "nobody", "None", &[]));
        b.upsert_service(&external("shop", "ext", "www.Example.com"));
        b.upsert_service(&external("shop", "inner", "web.shop.svc.cluster.local"));
        b.upsert_service(&svc("shop", "pending", "", &[]));
        b
    }

    fn ask(s: &Snapshot, name: &str, t: u16) -> Message {
        s.answer(name, t)
            .unwrap_or_else(|| panic!("{name} was forwarded"))
    }

    fn names(rs: &[Record]) -> Vec<String> {
        rs.iter().map(|r| name_to_string(&r.name)).collect()
    }

    #[test]
    fn dns_version() {
        let s = fixture().publish(true);
        let m = ask(&s, "dns-version.cluster.local", TYPE_TXT);
        assert_eq!(m.rcode(), NOERROR);
        assert_eq!(m.answers[0].rdata, RData::Txt(vec![b"1.1.0".to_vec()]));
        assert!(m.header.flags & AA != 0);
        assert_eq!(m.answers[0].ttl, 5);
        // A for the TXT name: NODATA.
        let m = ask(&s, "dns-version.cluster.local", TYPE_A);
        assert_eq!(m.rcode(), NOERROR);
        assert!(m.answers.is_empty());
        assert_eq!(m.authority[0].rtype, TYPE_SOA);
    }

    #[test]
    fn cluster_ip_a_srv_ptr() {
        let s = fixture().publish(true);
        let m = ask(&s, "web.shop.svc.cluster.local", TYPE_A);
        assert_eq!(m.rcode(), NOERROR);
        assert_eq!(m.answers.len(), 1);
        assert_eq!(m.answers[0].rdata, RData::A("10.96.5.5".parse().unwrap()));
        // Case-insensitive; the question's case is echoed.
        let m = ask(&s, "WEB.Shop.SVC.cluster.LOCAL", TYPE_A);
        assert_eq!(m.answers.len(), 1);
        // AAAA on a v4 Service: NODATA with SOA whose TTL is the negative TTL.
        let m = ask(&s, "web.shop.svc.cluster.local", TYPE_AAAA);
        assert_eq!(m.rcode(), NOERROR);
        assert!(m.answers.is_empty());
        assert_eq!(name_to_string(&m.authority[0].name), "cluster.local.");
        match &m.authority[0].rdata {
            RData::Soa { minimum, .. } => assert_eq!(*minimum, 5),
            r => panic!("{r:?}"),
        }
        // SRV for named ports, with the A in additional.
        let m = ask(&s, "_http._tcp.web.shop.svc.cluster.local", TYPE_SRV);
        assert_eq!(m.rcode(), NOERROR);
        assert_eq!(
            m.answers[0].rdata,
            RData::Srv {
                priority: 0,
                weight: 100,
                port: 80,
                target: name_from_str("web.shop.svc.cluster.local").unwrap()
            }
        );
        assert_eq!(
            m.additional[0].rdata,
            RData::A("10.96.5.5".parse().unwrap())
        );
        let m = ask(&s, "_dns._udp.web.shop.svc.cluster.local", TYPE_SRV);
        assert_eq!(m.answers.len(), 1);
        // SRV on the Service name itself: every port, named or not (an
        // extension of the spec, as CoreDNS answers it), the A in
        // additional. The unnamed port has no `_<port>._<proto>` name.
        let m = ask(&s, "web.shop.svc.cluster.local", TYPE_SRV);
        assert_eq!(m.rcode(), NOERROR);
        let mut ports: Vec<u16> = m
            .answers
            .iter()
            .map(|r| match &r.rdata {
                RData::Srv {
                    port,
                    weight,
                    target,
                    ..
                } => {
                    assert_eq!(*weight, 33);
                    assert_eq!(name_to_string(target), "web.shop.svc.cluster.local.");
                    *port
                }
                r => panic!("{r:?}"),
            })
            .collect();
        ports.sort();
        assert_eq!(ports, vec![53, 80, 81]);
        assert_eq!(
            m.additional[0].rdata,
            RData::A("10.96.5.5".parse().unwrap())
        );
        let m = ask(&s, "_._tcp.web.shop.svc.cluster.local", TYPE_SRV);
        assert_eq!(m.rcode(), NXDOMAIN);
        // Wrong protocol: NXDOMAIN; the protocol label alone: NODATA.
        let m = ask(&s, "_dns._tcp.web.shop.svc.cluster.local", TYPE_SRV);
        assert_eq!(m.rcode(), NXDOMAIN);
        let m = ask(&s, "_tcp.web.shop.svc.cluster.local", TYPE_SRV);
        assert_eq!(m.rcode(), NOERROR);
        assert!(m.answers.is_empty());
        // PTR.
        let m = ask(&s, "5.5.96.10.in-addr.arpa", TYPE_PTR);
        assert_eq!(m.rcode(), NOERROR);
        assert_eq!(
            m.answers[0].rdata,
            RData::Name(name_from_str("web.shop.svc.cluster.local").unwrap())
        );
        // A missing address in the service CIDR: NXDOMAIN from us, with the
        // reverse zone's SOA.
        let m = ask(&s, "9.9.96.10.in-addr.arpa", TYPE_PTR);
        assert_eq!(m.rcode(), NXDOMAIN);
        assert_eq!(name_to_string(&m.authority[0].name), "10.in-addr.arpa.");
        // Outside our networks: forwarded.
        assert!(s.answer("1.1.168.192.in-addr.arpa", TYPE_PTR).is_none());
        // A pending Service (no ClusterIP yet) does not exist.
        let m = ask(&s, "pending.shop.svc.cluster.local", TYPE_A);
        assert_eq!(m.rcode(), NXDOMAIN);
    }

    #[test]
    fn headless() {
        let s = fixture().publish(true);
        let m = ask(&s, "db.shop.svc.cluster.local", TYPE_A);
        let mut ips: Vec<_> = m.answers.iter().map(|r| r.rdata.clone()).collect();
        ips.sort();
        assert_eq!(
            ips,
            vec![
                RData::A("10.244.1.5".parse().unwrap()),
                RData::A("10.244.2.6".parse().unwrap())
            ],
            "only ready endpoints"
        );
        let m = ask(&s, "db-0.db.shop.svc.cluster.local", TYPE_A);
        assert_eq!(m.answers[0].rdata, RData::A("10.244.1.5".parse().unwrap()));
        // No hostname: the dashed IP stands in.
        let m = ask(&s, "10-244-2-6.db.shop.svc.cluster.local", TYPE_A);
        assert_eq!(m.answers.len(), 1);
        // Not ready: absent.
        let m = ask(&s, "db-2.db.shop.svc.cluster.local", TYPE_A);
        assert_eq!(m.rcode(), NXDOMAIN);
        let m = ask(&s, "_pg._tcp.db.shop.svc.cluster.local", TYPE_SRV);
        assert_eq!(m.answers.len(), 2);
        let mut targets = names(&m.additional);
        targets.sort();
        assert_eq!(
            targets,
            vec![
                "10-244-2-6.db.shop.svc.cluster.local.",
                "db-0.db.shop.svc.cluster.local."
            ]
        );
        for a in &m.answers {
            let RData::Srv { port, weight, .. } = a.rdata else {
                panic!()
            };
            assert_eq!((port, weight), (5432, 50));
        }
        // SRV on the headless Service name: one per ready endpoint and port.
        let m = ask(&s, "db.shop.svc.cluster.local", TYPE_SRV);
        assert_eq!(m.answers.len(), 2);
        assert_eq!(m.additional.len(), 2);
        let m = ask(&s, "5.1.244.10.in-addr.arpa", TYPE_PTR);
        assert_eq!(
            m.answers[0].rdata,
            RData::Name(name_from_str("db-0.db.shop.svc.cluster.local").unwrap())
        );
        // Headless without ready endpoints: NXDOMAIN (spec 2.4.1).
        let m = ask(&s, "nobody.shop.svc.cluster.local", TYPE_A);
        assert_eq!(m.rcode(), NXDOMAIN);
        // A missing pod IP in the cluster CIDR: NXDOMAIN.
        let m = ask(&s, "9.9.244.10.in-addr.arpa", TYPE_PTR);
        assert_eq!(m.rcode(), NXDOMAIN);
    }

    #[test]
    fn external_name() {
        let s = fixture().publish(true);
        let q = build_query(
            1,
            &name_from_str("ext.shop.svc.cluster.local").unwrap(),
            TYPE_A,
            None,
        );
        let pq = parse_query(&q).unwrap();
        let mut out = Vec::new();
        let o = s.respond(&pq, &mut out);
        assert_eq!(
            o,
            Outcome::Chase {
                target: &name_from_str("www.example.com").unwrap()[..]
            }
        );
        let m = Message::parse(&out).unwrap();
        assert_eq!(m.answers[0].rtype, TYPE_CNAME);
        let m = ask(&s, "ext.shop.svc.cluster.local", TYPE_CNAME);
        assert_eq!(m.rcode(), NOERROR);
        assert_eq!(
            m.answers[0].rdata,
            RData::Name(name_from_str("www.example.com").unwrap())
        );
    }

    #[test]
    fn nxdomain_vs_nodata() {
        let s = fixture().publish(true);
        for (name, rcode) in [
            ("cluster.local", NOERROR),
            ("svc.cluster.local", NOERROR),
            ("default.svc.cluster.local", NOERROR),
            ("empty.svc.cluster.local", NOERROR),
            ("shop.svc.cluster.local", NOERROR),
            ("nope.svc.cluster.local", NXDOMAIN),
            ("nope.default.svc.cluster.local", NXDOMAIN),
            ("web.shop.svc.cluster.local.cluster.local", NXDOMAIN),
            (
                "web.shop.svc.cluster.local.shop.svc.cluster.local",
                NXDOMAIN,
            ),
            ("x.web.shop.svc.cluster.local", NXDOMAIN),
            ("pod.cluster.local", NXDOMAIN),
            ("10-1-2-3.default.pod.cluster.local", NXDOMAIN),
            ("anything.cluster.local", NXDOMAIN),
        ] {
            let m = ask(&s, name, TYPE_A);
            assert_eq!(m.rcode(), rcode, "{name}");
            assert!(m.answers.is_empty(), "{name}");
            assert_eq!(m.authority.len(), 1, "{name}: SOA");
            assert_eq!(m.authority[0].ttl, 5);
            assert_eq!(name_to_string(&m.authority[0].name), "cluster.local.");
        }
        let m = ask(&s, "cluster.local", TYPE_SOA);
        assert_eq!(m.answers[0].rtype, TYPE_SOA);
        // Other names are not ours.
        assert!(s.answer("example.com", TYPE_A).is_none());
        assert!(s.answer("local", TYPE_A).is_none());
        assert!(s.answer("xcluster.local", TYPE_A).is_none());
    }

    #[test]
    fn not_ready_is_servfail() {
        let s = Arc::new(Snapshot::empty(&ZoneConfig::default()));
        let m = ask(&s, "web.shop.svc.cluster.local", TYPE_A);
        assert_eq!(m.rcode(), SERVFAIL);
        let m = ask(&s, "5.5.96.10.in-addr.arpa", TYPE_PTR);
        assert_eq!(m.rcode(), SERVFAIL);
        assert!(s.answer("example.com", TYPE_A).is_none());
    }

    #[test]
    fn pods_when_enabled() {
        let mut b = Builder::new(ZoneConfig {
            pods: true,
            ..Default::default()
        });
        b.upsert_namespace("default");
        let s = b.publish(true);
        let m = ask(&s, "10-244-1-5.default.pod.cluster.local", TYPE_A);
        assert_eq!(m.answers[0].rdata, RData::A("10.244.1.5".parse().unwrap()));
        // Case-insensitive in the namespace too.
        let m = ask(&s, "10-244-1-5.DeFault.pod.cluster.local", TYPE_A);
        assert_eq!(m.answers.len(), 1);
        // Only in namespaces that exist (as CoreDNS's `pods insecure`).
        let m = ask(&s, "10-244-1-5.nope.pod.cluster.local", TYPE_A);
        assert_eq!((m.rcode(), m.answers.len()), (NXDOMAIN, 0));
        let m = ask(&s, "nope.pod.cluster.local", TYPE_A);
        assert_eq!(m.rcode(), NXDOMAIN);
        assert_eq!(name_to_string(&m.authority[0].name), "cluster.local.");
        let m = ask(&s, "10-244-1-5.default.pod.cluster.local", TYPE_AAAA);
        assert_eq!((m.rcode(), m.answers.len()), (NOERROR, 0));
        let m = ask(&s, "fd00--1.default.pod.cluster.local", TYPE_AAAA);
        assert_eq!(m.answers[0].rdata, RData::Aaaa("fd00::1".parse().unwrap()));
        let m = ask(&s, "nonsense.default.pod.cluster.local", TYPE_A);
        assert_eq!(m.rcode(), NXDOMAIN);
        let m = ask(&s, "default.pod.cluster.local", TYPE_A);
        assert_eq!(m.rcode(), NOERROR);
        let m = ask(&s, "pod.cluster.local", TYPE_A);
        assert_eq!(m.rcode(), NOERROR);
        // A namespace created later makes its pod names answer; deleted,
        // they are gone again.
        b.upsert_namespace("late");
        let s = b.publish(true);
        let m = ask(&s, "10-244-1-5.late.pod.cluster.local", TYPE_A);
        assert_eq!(m.answers.len(), 1);
        b.delete_namespace("late");
        let s = b.publish(true);
        let m = ask(&s, "10-244-1-5.late.pod.cluster.local", TYPE_A);
        assert_eq!(m.rcode(), NXDOMAIN);
    }

    #[test]
    fn updates_touch_only_what_changed() {
        let mut b = fixture();
        let s1 = b.publish(true);
        let names_before = s1.name_count();
        // Endpoint becomes ready: it appears; the old snapshot is unchanged.
        b.upsert_slice(&slice(
            "shop",
            "db-abc",
            "db",
            &[
                ("10.244.1.5", Some("db-0"), true),
                ("10.244.2.6", None, true),
                ("10.244.3.7", Some("db-2"), true),
            ],
            &[("pg", 5432)],
        ));
        let s2 = b.publish(true);
        assert_eq!(
            ask(&s2, "db.shop.svc.cluster.local", TYPE_A).answers.len(),
            3
        );
        assert_eq!(
            ask(&s1, "db.shop.svc.cluster.local", TYPE_A).answers.len(),
            2
        );
        let shared = s1
            .shards
            .iter()
            .zip(&s2.shards)
            .filter(|(a, b)| Arc::ptr_eq(a, b))
            .count();
        assert!(shared > SHARDS - 10, "only touched shards copied: {shared}");
        // Delete a Service: its names go, its namespace stays (Services remain).
        b.delete_service("shop", "web");
        let s3 = b.publish(true);
        assert_eq!(
            ask(&s3, "web.shop.svc.cluster.local", TYPE_A).rcode(),
            NXDOMAIN
        );
        assert_eq!(
            ask(&s3, "5.5.96.10.in-addr.arpa", TYPE_PTR).rcode(),
            NXDOMAIN
        );
        assert_eq!(
            ask(&s3, "_http._tcp.web.shop.svc.cluster.local", TYPE_SRV).rcode(),
            NXDOMAIN
        );
        assert_eq!(ask(&s3, "shop.svc.cluster.local", TYPE_A).rcode(), NOERROR);
        // Remove everything in shop: the namespace name goes too.
        for n in ["db", "nobody", "ext", "inner", "pending"] {
            b.delete_service("shop", n);
        }
        b.delete_slice("shop", "db-abc");
        let s4 = b.publish(true);
        assert_eq!(ask(&s4, "shop.svc.cluster.local", TYPE_A).rcode(), NXDOMAIN);
        assert_eq!(
            ask(&s4, "db-0.db.shop.svc.cluster.local", TYPE_A).rcode(),
            NXDOMAIN
        );
        // Back to the start: same names as the fixture had minus shop's.
        assert!(s4.name_count() < names_before);
        // Clearing everything and re-adding is idempotent.
        b.clear_objects();
        let s5 = b.publish(true);
        assert_eq!(
            ask(&s5, "kubernetes.default.svc.cluster.local", TYPE_A).rcode(),
            NXDOMAIN
        );
        assert_eq!(ask(&s5, "svc.cluster.local", TYPE_A).rcode(), NOERROR);
        assert_eq!(
            ask(&s5, "default.svc.cluster.local", TYPE_A).rcode(),
            NXDOMAIN
        );
        // A Service changes IP: the old PTR goes.
        b.upsert_service(&svc("a", "b", "10.96.0.20", &[]));
        b.publish(true);
        b.upsert_service(&svc("a", "b", "10.96.0.21", &[]));
        let s6 = b.publish(true);
        assert_eq!(
            ask(&s6, "20.0.96.10.in-addr.arpa", TYPE_PTR).rcode(),
            NXDOMAIN
        );
        assert_eq!(
            ask(&s6, "21.0.96.10.in-addr.arpa", TYPE_PTR).answers.len(),
            1
        );
        assert!(!b.has_changes());
    }

    #[test]
    fn endpoints_of_cluster_ip_services_are_not_kept() {
        let mut b = Builder::new(ZoneConfig::default());
        b.upsert_service(&svc("x", "s", "10.96.0.30", &[]));
        b.upsert_slice(&slice("x", "s-1", "s", &[("10.244.0.9", None, true)], &[]));
        let s1 = b.publish(true);
        assert_eq!(ask(&s1, "s.x.svc.cluster.local", TYPE_A).answers.len(), 1);
        assert!(!b.take_relist());
        // Now headless: the endpoints were not kept, so the caller relists.
        b.upsert_service(&svc("x", "s", "None", &[]));
        assert!(b.take_relist());
        assert!(!b.take_relist());
        // The relist: clear, Services first, then slices.
        b.clear_objects();
        b.upsert_service(&svc("x", "s", "None", &[]));
        b.upsert_slice(&slice("x", "s-1", "s", &[("10.244.0.9", None, true)], &[]));
        let s2 = b.publish(true);
        let m = ask(&s2, "s.x.svc.cluster.local", TYPE_A);
        assert_eq!(m.answers[0].rdata, RData::A("10.244.0.9".parse().unwrap()));
        // Deleted as ClusterIP and recreated headless: relist too.
        b.upsert_service(&svc("x", "t", "10.96.0.31", &[]));
        b.delete_service("x", "t");
        b.upsert_service(&svc("x", "t", "None", &[]));
        assert!(b.take_relist());
        // A slice seen before its Service keeps its endpoints.
        b.upsert_slice(&slice("x", "h-1", "h", &[("10.244.0.8", None, true)], &[]));
        b.upsert_service(&svc("x", "h", "None", &[]));
        assert!(!b.take_relist());
        let s3 = b.publish(true);
        assert_eq!(ask(&s3, "h.x.svc.cluster.local", TYPE_A).answers.len(), 1);
    }

    #[test]
    fn custom_zone_and_ttl() {
        let mut b = Builder::new(ZoneConfig {
            zone: "Corp.Example".into(),
            ttl: 30,
            ..Default::default()
        });
        b.upsert_service(&svc("x", "y", "10.96.0.9", &[]));
        let s = b.publish(true);
        let m = ask(&s, "y.x.svc.corp.example", TYPE_A);
        assert_eq!(m.answers[0].ttl, 30);
        assert!(s.answer("y.x.svc.cluster.local", TYPE_A).is_none());
    }

    #[test]
    fn any_and_class() {
        let s = fixture().publish(true);
        // ANY: one RRset (RFC 8482), the lowest type: the A, not the SRVs.
        let m = ask(&s, "web.shop.svc.cluster.local", TYPE_ANY);
        assert_eq!(m.answers.len(), 1);
        assert_eq!(m.answers[0].rtype, TYPE_A);
        let qn = name_from_str("web.shop.svc.cluster.local").unwrap();
        let mut q = build_query(1, &qn, TYPE_A, None);
        let n = q.len();
        q[n - 1] = 3; // class CH
        let pq = parse_query(&q).unwrap();
        let mut out = Vec::new();
        s.respond(&pq, &mut out);
        assert_eq!(Message::parse(&out).unwrap().rcode(), REFUSED);
    }

    #[test]
    fn big_headless_is_capped() {
        let mut b = Builder::new(ZoneConfig::default());
        b.upsert_service(&svc("big", "h", "None", &[("p", 1, "TCP")]));
        let eps: Vec<(String, bool)> = (0..3000)
            .map(|i| (format!("10.244.{}.{}", i / 250, i % 250 + 1), true))
            .collect();
        let refs: Vec<(&str, Option<&str>, bool)> =
            eps.iter().map(|(ip, r)| (ip.as_str(), None, *r)).collect();
        b.upsert_slice(&slice("big", "h-1", "h", &refs, &[("p", 1)]));
        let s = b.publish(true);
        let m = ask(&s, "h.big.svc.cluster.local", TYPE_A);
        assert_eq!(m.answers.len(), 3000);
        let m = ask(&s, "_p._tcp.h.big.svc.cluster.local", TYPE_SRV);
        assert!(!m.answers.is_empty() && m.answers.len() <= 3000);
    }
}
