//! The served zone: an immutable [`Snapshot`] shared by every server
//! thread, and the answer to any query for it. Lookups only: the
//! builder decides what exists; this decides what each query gets back
//! (positive answers, CNAMEs to chase, NODATA and NXDOMAIN with the SOA,
//! refusals, synthesized pod names), without allocating on the hot path.

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::table::{hash_name, shard_of, Packed, Table};
use super::{Builder, ZoneConfig};
use crate::wire::{self, Header, NameBuf, Query, RData, Record, Writer};

/// An immutable view of the zone, swapped in atomically on every change.
pub struct Snapshot {
    /// False until the first full load: the zone answers SERVFAIL, never a
    /// wrong NXDOMAIN.
    pub ready: bool,
    pub(super) zone: Vec<u8>,
    pub(super) pod_zone: Vec<u8>,
    pub(super) ttl: u32,
    pub(super) pods: bool,
    /// Each reverse network with the label count of its apex.
    pub(super) reverse: Vec<(IpNet, usize)>,
    /// The SOA's RDATA, uncompressed: it is copied into responses of any
    /// layout.
    pub(super) soa_rdata: Vec<u8>,
    pub(super) shards: Vec<Arc<Table>>,
    pub(super) names: usize,
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

/// Starts a response to `q` in `out`: the header with these counts (the
/// OPT counted when the query had one) and the question, copied.
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

/// Ends a response: the OPT record when the query had one.
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

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::*;
    use wire::*;

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
}
