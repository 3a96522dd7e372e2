//! Bounded fuzzing with proptest (a few seconds in all, part of `cargo test`):
//! - the request path: random bytes and mutations of real queries go
//!   through the same handler the UDP and TCP servers use, from a client
//!   allowed to recurse and from one that is not. Nothing may panic; every
//!   reply must parse and echo the ID; an outside client never gets more
//!   than 512 bytes over UDP, nor a REFUSED bigger than its query;
//! - the wire parser itself: messages built from labels and compression
//!   pointers aimed anywhere (backwards, forwards, at themselves), EDNS
//!   OPT records in every shape, and encode → parse round trips;
//! - the forwarder's handling of upstream replies ([`forward::relay`]):
//!   hostile and mutated answers to a question we asked must be refused
//!   or turned into a well-formed answer to the client's own question.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use podnet_dns::forward::{self, AllowList, Forwarder};
use podnet_dns::server::{Fast, Handler, OUTSIDE_UDP_LIMIT};
use podnet_dns::stats::Stats;
use podnet_dns::wire::{self, Message, NameBuf, RData, Record};
use podnet_dns::zone::{Builder, ZoneConfig};
use proptest::prelude::*;

fn shared() -> &'static (Handler, tokio::runtime::Runtime) {
    static H: std::sync::OnceLock<(Handler, tokio::runtime::Runtime)> = std::sync::OnceLock::new();
    H.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        (handler(), rt)
    })
}

fn handler() -> Handler {
    let mut b = Builder::new(ZoneConfig {
        pods: true,
        ..Default::default()
    });
    let svc: podnet_api::k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5"], "ports": [{"name": "http", "port": 80}]}
    }))
    .unwrap();
    b.upsert_service(&svc);
    let ext: podnet_api::k8s_openapi::api::core::v1::Service =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "ext", "namespace": "default"},
            "spec": {"type": "ExternalName", "externalName": "web.default.svc.cluster.local"}
        }))
        .unwrap();
    b.upsert_service(&ext);
    let out: podnet_api::k8s_openapi::api::core::v1::Service =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "out", "namespace": "default"},
            "spec": {"type": "ExternalName", "externalName": "api.example.test"}
        }))
        .unwrap();
    b.upsert_service(&out);
    Handler::new(
        Arc::new(ArcSwap::new(b.publish(true))),
        // No upstreams: the slow path answers SERVFAIL at once.
        Arc::new(Forwarder::new(vec![], Duration::from_millis(10), 100)),
        Arc::new(Stats::default()),
        AllowList::cluster(
            "10.96.0.0/12".parse().unwrap(),
            "10.244.0.0/16".parse().unwrap(),
            None,
        ),
    )
}

/// A client allowed to recurse, and one that is not.
const PEERS: [(&str, bool); 3] = [
    ("127.0.0.1", true),
    ("198.51.100.2", false),
    ("::ffff:203.0.113.9", false),
];

fn check(h: &Handler, rt: &tokio::runtime::Runtime, msg: &[u8]) {
    let st = Stats::default();
    let mut out = Vec::new();
    for (peer, inside) in PEERS {
        let peer: IpAddr = peer.parse().unwrap();
        for udp in [true, false] {
            let reply = match h.fast(msg, &mut out, udp, peer, &st, Instant::now()) {
                Fast::Reply => Some(out.clone()),
                Fast::Drop => None,
                Fast::Slow => rt.block_on(h.slow(msg, udp, peer, Instant::now())),
            };
            let Some(r) = reply else { continue };
            let m = Message::parse(&r).expect("our replies parse");
            assert_eq!(&r[0..2], &msg[0..2], "ID echoed");
            assert!(m.header.flags & wire::QR != 0);
            if udp {
                assert!(r.len() <= 4096);
                if !inside {
                    assert!(r.len() <= OUTSIDE_UDP_LIMIT, "{} bytes to {peer}", r.len());
                }
            }
            if m.rcode() == wire::REFUSED {
                assert!(
                    r.len() <= msg.len(),
                    "REFUSED {} > query {}",
                    r.len(),
                    msg.len()
                );
            }
            if inside {
                assert!(
                    !(m.rcode() == wire::REFUSED && m.header.flags & wire::RA == 0),
                    "a client on the allow-list is never refused recursion"
                );
            }
        }
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let names = [
        "web.default.svc.cluster.local",
        "_http._tcp.web.default.svc.cluster.local",
        "ext.default.svc.cluster.local",
        "out.default.svc.cluster.local",
        "10-1-2-3.default.pod.cluster.local",
        "5.0.96.10.in-addr.arpa",
        "dns-version.cluster.local",
        "example.com",
    ];
    let mut v = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let qn = wire::name_from_str(n).unwrap();
        for t in [1u16, 28, 33, 12, 16, 255, 252] {
            v.push(wire::build_query(i as u16, &qn, t, Some(1232)));
            v.push(wire::build_query(i as u16, &qn, t, None));
        }
    }
    v
}

// ------------------------------------------------------------ wire parser

/// One piece of a generated message body.
#[derive(Debug, Clone)]
enum Tok {
    /// A length byte and that many bytes (up to 70: some are too long).
    Label(Vec<u8>),
    /// A compression pointer to where piece `i % n` starts (so backwards,
    /// forwards or at itself).
    PtrTo(usize),
    /// A compression pointer to any offset.
    Ptr(u16),
    /// The root: a zero byte.
    Zero,
    /// Fixed fields: type, class, TTL, lengths, or junk.
    Raw(Vec<u8>),
}

fn tok() -> impl Strategy<Value = Tok> {
    prop_oneof![
        4 => proptest::collection::vec(any::<u8>(), 0..70).prop_map(Tok::Label),
        3 => any::<usize>().prop_map(Tok::PtrTo),
        1 => any::<u16>().prop_map(Tok::Ptr),
        3 => Just(Tok::Zero),
        3 => proptest::collection::vec(any::<u8>(), 1..12).prop_map(Tok::Raw),
    ]
}

/// A header with small counts, then the pieces laid out.
fn assemble(counts: [u16; 4], flags: u16, toks: &[Tok]) -> Vec<u8> {
    let mut m = vec![0x12, 0x34];
    m.extend_from_slice(&flags.to_be_bytes());
    for c in counts {
        m.extend_from_slice(&c.to_be_bytes());
    }
    let mut starts = Vec::new();
    let mut at = m.len();
    for t in toks {
        starts.push(at);
        at += match t {
            Tok::Label(b) => 1 + b.len(),
            Tok::PtrTo(_) | Tok::Ptr(_) => 2,
            Tok::Zero => 1,
            Tok::Raw(b) => b.len(),
        };
    }
    for t in toks {
        match t {
            Tok::Label(b) => {
                m.push(b.len() as u8);
                m.extend_from_slice(b);
            }
            Tok::PtrTo(i) => {
                let off = (starts[i % starts.len()] & 0x3fff) as u16;
                m.extend_from_slice(&(0xc000 | off).to_be_bytes());
            }
            Tok::Ptr(p) => m.extend_from_slice(&(0xc000 | (p & 0x3fff)).to_be_bytes()),
            Tok::Zero => m.push(0),
            Tok::Raw(b) => m.extend_from_slice(b),
        }
    }
    m
}

/// What any successfully read name must look like.
fn sane_name(w: &[u8]) {
    assert!(w.len() <= wire::MAX_NAME, "{} bytes", w.len());
    assert_eq!(w.last(), Some(&0));
    let n = NameBuf::from_wire_lower(w).expect("a read name re-reads");
    assert_eq!(n.wire(), w.to_ascii_lowercase().as_slice());
}

/// Every parser over `m`, with the invariants their results must keep.
fn parse_everything(m: &[u8]) {
    if let Ok(p) = Message::parse(m) {
        for (n, _, _) in &p.questions {
            sane_name(n);
        }
        for r in p.answers.iter().chain(&p.authority).chain(&p.additional) {
            sane_name(&r.name);
            assert!(r.rtype != wire::TYPE_OPT);
        }
        assert_eq!(
            p.ttl_offsets.len(),
            p.answers.len() + p.authority.len() + p.additional.len()
        );
        assert!(p.ttl_offsets.iter().all(|o| o + 4 <= m.len()));
        if let Some((s, e)) = p.opt_span {
            assert!(s < e && e <= m.len());
        }
    }
    match wire::parse_query(m) {
        Ok(q) => {
            assert_eq!(
                &m[wire::HEADER_LEN..wire::HEADER_LEN + q.question.len()],
                q.question
            );
            sane_name(q.qname.wire());
            let qlen = q.qname.wire().len();
            assert_eq!(
                q.question.len(),
                qlen + 4,
                "the question is never compressed"
            );
            assert_eq!(
                q.question[..qlen].to_ascii_lowercase(),
                q.qname.wire(),
                "qname is the question's name, lowercased"
            );
            assert!((wire::MIN_UDP..=wire::MAX_UDP).contains(&q.udp_limit()));
            if let Some(e) = q.edns {
                assert_eq!(e.version, 0);
            }
        }
        Err(wire::BadQuery::Drop) => {}
        Err(bad) => {
            let mut out = Vec::new();
            assert!(wire::error_reply(m, &bad, &mut out));
            let r = Message::parse(&out).expect("error replies parse");
            assert!(r.header.flags & wire::QR != 0);
            assert!(
                out.len() <= m.len() + 11,
                "an error reply is about the query's size"
            );
        }
    }
}

/// `read_name` from every offset: terminates, and a success is sane.
fn read_names_everywhere(m: &[u8]) {
    for pos in 0..m.len() {
        let mut n = NameBuf::default();
        if let Ok(next) = wire::read_name(m, pos, &mut n, pos % 2 == 0) {
            assert!(next > pos && next <= m.len());
            sane_name(n.wire());
        }
    }
}

/// One OPT record: owner, payload size, extended rcode, version, DO,
/// options (code, bytes).
#[derive(Debug, Clone)]
struct Opt {
    root_owner: bool,
    size: u16,
    ext_rcode: u8,
    version: u8,
    dnssec_ok: bool,
    options: Vec<(u16, Vec<u8>)>,
}

fn opt() -> impl Strategy<Value = Opt> {
    (
        proptest::bool::weighted(0.9),
        any::<u16>(),
        prop_oneof![4 => Just(0u8), 1 => any::<u8>()],
        prop_oneof![4 => Just(0u8), 1 => any::<u8>()],
        any::<bool>(),
        proptest::collection::vec(
            (any::<u16>(), proptest::collection::vec(any::<u8>(), 0..20)),
            0..3,
        ),
    )
        .prop_map(
            |(root_owner, size, ext_rcode, version, dnssec_ok, options)| Opt {
                root_owner,
                size,
                ext_rcode,
                version,
                dnssec_ok,
                options,
            },
        )
}

fn write_opt_record(m: &mut Vec<u8>, o: &Opt) {
    if o.root_owner {
        m.push(0);
    } else {
        m.extend_from_slice(&wire::name_from_str("x.test").unwrap());
    }
    m.extend_from_slice(&wire::TYPE_OPT.to_be_bytes());
    m.extend_from_slice(&o.size.to_be_bytes());
    m.push(o.ext_rcode);
    m.push(o.version);
    m.extend_from_slice(&(if o.dnssec_ok { 0x8000u16 } else { 0 }).to_be_bytes());
    let rd: Vec<u8> = o
        .options
        .iter()
        .flat_map(|(code, b)| {
            let mut v = code.to_be_bytes().to_vec();
            v.extend_from_slice(&(b.len() as u16).to_be_bytes());
            v.extend_from_slice(b);
            v
        })
        .collect();
    m.extend_from_slice(&(rd.len() as u16).to_be_bytes());
    m.extend_from_slice(&rd);
}

/// Names from a small pool of labels, so that compression finds suffixes
/// to share; mixed case, which compression must not care about.
fn name() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![
            Just("a"),
            Just("B"),
            Just("svc"),
            Just("Cluster"),
            Just("local"),
            Just("example"),
            Just("x-1")
        ],
        0..6,
    )
    .prop_map(|ls| {
        let mut w = Vec::new();
        for l in ls {
            w.push(l.len() as u8);
            w.extend_from_slice(l.as_bytes());
        }
        w.push(0);
        w
    })
}

fn rdata() -> impl Strategy<Value = (u16, RData)> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(|b| (wire::TYPE_A, RData::A(b.into()))),
        any::<[u8; 16]>().prop_map(|b| (wire::TYPE_AAAA, RData::Aaaa(b.into()))),
        name().prop_map(|n| (wire::TYPE_CNAME, RData::Name(n))),
        name().prop_map(|n| (wire::TYPE_PTR, RData::Name(n))),
        (any::<u16>(), any::<u16>(), any::<u16>(), name()).prop_map(|(p, w, port, t)| (
            wire::TYPE_SRV,
            RData::Srv {
                priority: p,
                weight: w,
                port,
                target: t
            }
        )),
        (any::<u16>(), name()).prop_map(|(p, n)| (
            wire::TYPE_MX,
            RData::Mx {
                preference: p,
                exchange: n
            }
        )),
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..30), 0..3)
            .prop_map(|t| (wire::TYPE_TXT, RData::Txt(t))),
        (name(), name(), any::<[u32; 5]>()).prop_map(|(m, r, v)| (
            wire::TYPE_SOA,
            RData::Soa {
                mname: m,
                rname: r,
                serial: v[0],
                refresh: v[1],
                retry: v[2],
                expire: v[3],
                minimum: v[4]
            }
        )),
        proptest::collection::vec(any::<u8>(), 0..20).prop_map(|b| (999, RData::Raw(b))),
    ]
}

fn record() -> impl Strategy<Value = Record> {
    (name(), rdata(), any::<u32>()).prop_map(|(name, (rtype, rdata), ttl)| Record {
        name,
        rtype,
        class: wire::CLASS_IN,
        ttl,
        rdata,
    })
}

fn lower(r: &Record) -> Record {
    let l = |n: &Vec<u8>| n.to_ascii_lowercase();
    Record {
        name: l(&r.name),
        rdata: match &r.rdata {
            RData::Name(n) => RData::Name(l(n)),
            RData::Srv {
                priority,
                weight,
                port,
                target,
            } => RData::Srv {
                priority: *priority,
                weight: *weight,
                port: *port,
                target: l(target),
            },
            RData::Mx {
                preference,
                exchange,
            } => RData::Mx {
                preference: *preference,
                exchange: l(exchange),
            },
            RData::Soa {
                mname,
                rname,
                serial,
                refresh,
                retry,
                expire,
                minimum,
            } => RData::Soa {
                mname: l(mname),
                rname: l(rname),
                serial: *serial,
                refresh: *refresh,
                retry: *retry,
                expire: *expire,
                minimum: *minimum,
            },
            other => other.clone(),
        },
        ..r.clone()
    }
}

#[test]
fn compression_loops_and_forward_pointers_are_errors() {
    let hdr = |an: u16| {
        let mut m = vec![0, 1, 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0];
        m[6..8].copy_from_slice(&an.to_be_bytes());
        m
    };
    let mut n = NameBuf::default();
    // A pointer to itself.
    let mut m = hdr(0);
    m.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
    assert_eq!(
        wire::read_name(&m, 12, &mut n, true),
        Err(wire::WireError::BadPointer)
    );
    assert!(Message::parse(&m).is_err());
    // Two pointers at each other: the second points back, the first forward.
    let mut m = hdr(0);
    m.extend_from_slice(&[1, b'a', 0xc0, 16, 0xc0, 12]);
    assert!(wire::read_name(&m, 12, &mut n, true).is_err());
    assert!(wire::read_name(&m, 16, &mut n, true).is_err());
    // A label then a pointer back to that label: a loop through a label.
    let mut m = hdr(0);
    m.extend_from_slice(&[0, 0, 0, 0, 1, b'a', 0xc0, 16]);
    assert!(wire::read_name(&m, 16, &mut n, true).is_err());
    // A chain of backward pointers is fine and bounded by the name length.
    let mut m = hdr(0);
    m.extend_from_slice(&[1, b'a', 0]); // 12: a.
    let mut at = 12u16;
    for _ in 0..200 {
        let here = m.len() as u16;
        m.extend_from_slice(&[1, b'b']);
        m.extend_from_slice(&(0xc000 | at).to_be_bytes());
        at = here;
    }
    assert_eq!(
        wire::read_name(&m, at as usize, &mut n, true),
        Err(wire::WireError::NameTooLong)
    );
    // A query whose question is compressed is malformed (nothing to point
    // back at), not a name read through the header.
    let mut q = hdr(0);
    q[2] = 0x01;
    q[3] = 0;
    q.extend_from_slice(&[0xc0, 4, 0, 1, 0, 1]);
    assert!(matches!(
        wire::parse_query(&q),
        Err(wire::BadQuery::Reply { rcode: 1, .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(msg in proptest::collection::vec(any::<u8>(), 12..600)) {
        let (h, rt) = shared();
        check(h, rt, &msg);
        parse_everything(&msg);
        read_names_everywhere(&msg);
    }

    #[test]
    fn mutated_queries(seed in 0usize..112, edits in proptest::collection::vec((any::<u16>(), any::<u8>()), 1..8), cut in any::<u16>()) {
        let (h, rt) = shared();
        let seeds = seeds();
        let mut m = seeds[seed % seeds.len()].clone();
        for (at, b) in edits {
            let i = at as usize % m.len();
            m[i] = b;
        }
        if (cut as usize).is_multiple_of(4) {
            let n = 12 + cut as usize % (m.len() - 11);
            m.truncate(n);
        }
        check(h, rt, &m);
        parse_everything(&m);
    }

    /// Labels and pointers aimed anywhere: every parser terminates, fails
    /// cleanly or yields sane names; the handler survives it as a query.
    #[test]
    fn names_with_compression_pointers(
        counts in proptest::array::uniform4(0u16..4),
        response in any::<bool>(),
        toks in proptest::collection::vec(tok(), 1..24),
    ) {
        let flags = if response { wire::QR | wire::RA } else { wire::RD };
        let m = assemble(counts, flags, &toks);
        parse_everything(&m);
        read_names_everywhere(&m);
        let (h, rt) = shared();
        check(h, rt, &m);
    }

    /// Queries with OPT records in every shape: the parser's EDNS view is
    /// exactly the one OPT owned by the root in the additional section
    /// (version 0), and anything else is refused the way RFC 6891 says.
    #[test]
    fn edns_in_every_shape(
        name in name(),
        qtype in any::<u16>(),
        opts in proptest::collection::vec(opt(), 0..3),
        in_answer in any::<bool>(),
    ) {
        let mut m = wire::build_query(7, &name, qtype, None);
        let (an, ar) = if in_answer && !opts.is_empty() { (1, opts.len() - 1) } else { (0, opts.len()) };
        m[6..8].copy_from_slice(&(an as u16).to_be_bytes());
        m[10..12].copy_from_slice(&(ar as u16).to_be_bytes());
        for o in &opts {
            write_opt_record(&mut m, o);
        }
        parse_everything(&m);
        let (h, rt) = shared();
        check(h, rt, &m);
        let additional = &opts[an..];
        let parsed = wire::parse_query(&m);
        match additional {
            [] => prop_assert!(parsed.unwrap().edns.is_none()),
            [o] if !o.root_owner => prop_assert!(parsed.is_err()),
            [o] if o.version != 0 => prop_assert!(
                matches!(parsed, Err(wire::BadQuery::Reply { rcode: wire::BADVERS, .. })),
                "BADVERS"
            ),
            [o] => {
                let e = parsed.unwrap().edns.unwrap();
                prop_assert_eq!(e.udp_size, o.size);
                prop_assert_eq!(e.dnssec_ok, o.dnssec_ok);
            }
            _ => prop_assert!(
                matches!(parsed, Err(wire::BadQuery::Reply { rcode: 1, .. })),
                "FORMERR"
            ),
        }
    }

}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    /// What the writer encodes (with compression) parses back to the same
    /// records, names compared without case.
    #[test]
    fn encode_parse_round_trip(qname in name(), records in proptest::collection::vec(record(), 0..12)) {
        let h = wire::Header { id: 9, flags: wire::QR, ..Default::default() };
        let mut w = wire::Writer::with_question(h, &qname, wire::TYPE_A, wire::CLASS_IN);
        for r in &records {
            w.record(r);
        }
        w.set_counts(records.len() as u16, 0, 0);
        let m = Message::parse(&w.buf).expect("our encoding parses");
        prop_assert_eq!(m.questions.len(), 1);
        prop_assert_eq!(m.questions[0].0.to_ascii_lowercase(), qname.to_ascii_lowercase());
        let want: Vec<Record> = records.iter().map(lower).collect();
        let got: Vec<Record> = m.answers.iter().map(lower).collect();
        prop_assert_eq!(got, want);
    }
}

// ------------------------------------------------------- upstream replies

/// How an upstream spells the question in its reply.
#[derive(Debug, Clone, Copy)]
enum QuestionSpelling {
    /// As we sent it.
    Same,
    /// In other letter case.
    Upper,
    /// With the root written as a pointer into the header (offset 4 is
    /// the high byte of QDCOUNT, a zero): the same name, two bytes longer.
    RootViaHeaderPointer,
}

/// An upstream reply to the query `(id, qname, qtype)`.
#[derive(Debug, Clone)]
struct Reply {
    id_ok: bool,
    rcode: u8,
    flags: u16,
    spelling: QuestionSpelling,
    answers: Vec<Record>,
    authority: Vec<Record>,
    /// An OPT record, and where in the additional section it goes.
    opt: Option<(Opt, usize)>,
    additional: Vec<Record>,
    /// Bytes after the last record.
    trailing: Vec<u8>,
    edits: Vec<(u16, u8)>,
    cut: Option<u16>,
}

fn reply() -> impl Strategy<Value = Reply> {
    (
        proptest::bool::weighted(0.95),
        prop_oneof![4 => Just(0u8), 1 => Just(3u8), 1 => 0u8..16],
        prop_oneof![3 => Just(wire::QR | wire::RA | wire::RD), 1 => any::<u16>().prop_map(|f| f | wire::QR)],
        prop_oneof![
            Just(QuestionSpelling::Same),
            Just(QuestionSpelling::Upper),
            Just(QuestionSpelling::RootViaHeaderPointer)
        ],
        proptest::collection::vec(record(), 0..6),
        proptest::collection::vec(record(), 0..3),
        proptest::option::of((opt(), 0usize..3)),
        (
            proptest::collection::vec(record(), 0..3),
            prop_oneof![
                3 => Just(Vec::new()),
                1 => proptest::collection::vec(any::<u8>(), 1..8)
            ],
        ),
        prop_oneof![
            3 => Just(Vec::new()),
            1 => proptest::collection::vec((any::<u16>(), any::<u8>()), 1..6)
        ],
        prop_oneof![4 => Just(None), 1 => any::<u16>().prop_map(Some)],
    )
        .prop_map(
            |(
                id_ok,
                rcode,
                flags,
                spelling,
                answers,
                authority,
                opt,
                (additional, trailing),
                edits,
                cut,
            )| Reply {
                id_ok,
                rcode,
                flags,
                spelling,
                answers,
                authority,
                opt,
                additional,
                trailing,
                edits,
                cut,
            },
        )
}

fn encode_reply(r: &Reply, id: u16, qname: &[u8], qtype: u16) -> Vec<u8> {
    let h = wire::Header {
        id: if r.id_ok { id } else { id.wrapping_add(1) },
        flags: (r.flags & !0xf) | r.rcode as u16,
        ..Default::default()
    };
    let spelled = match r.spelling {
        QuestionSpelling::Upper => qname.to_ascii_uppercase(),
        _ => qname.to_vec(),
    };
    let mut w = wire::Writer::with_question(h, &spelled, qtype, wire::CLASS_IN);
    if let QuestionSpelling::RootViaHeaderPointer = r.spelling {
        // Rewrite the question: the name's final zero becomes c0 04.
        let qend = wire::HEADER_LEN + spelled.len();
        let mut b = w.buf[..qend - 1].to_vec();
        b.extend_from_slice(&[0xc0, 4]);
        b.extend_from_slice(&w.buf[qend..]);
        w = wire::Writer::resume(b);
        w.learn_question(&spelled);
    }
    for rec in r.answers.iter().chain(&r.authority) {
        w.record(rec);
    }
    let mut ar = r.additional.len();
    for (i, rec) in r.additional.iter().enumerate() {
        if let Some((o, at)) = &r.opt {
            if *at == i {
                write_opt_record(&mut w.buf, o);
            }
        }
        w.record(rec);
    }
    if let Some((o, at)) = &r.opt {
        if *at >= r.additional.len() {
            write_opt_record(&mut w.buf, o);
        }
        ar += 1;
    }
    w.set_counts(r.answers.len() as u16, r.authority.len() as u16, ar as u16);
    let mut b = w.buf;
    b.extend_from_slice(&r.trailing);
    for &(at, v) in &r.edits {
        // Keep the ID: a reply with another ID is simply not ours.
        let i = 2 + at as usize % (b.len() - 2);
        b[i] = v;
    }
    if let Some(c) = r.cut {
        b.truncate(c as usize % (b.len() + 1));
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 800, failure_persistence: None, ..ProptestConfig::default() })]

    /// Whatever an upstream sends back, the client gets either nothing from
    /// it (the forwarder moves on) or a well-formed answer to its own
    /// question: its ID and spelling, one OPT exactly when it sent one,
    /// and records that parse.
    #[test]
    fn upstream_replies(
        qname in name(),
        client_spelling in any::<bool>(),
        qtype in prop_oneof![Just(wire::TYPE_A), Just(wire::TYPE_AAAA), Just(wire::TYPE_SRV), any::<u16>()],
        client_edns in proptest::option::of(prop_oneof![Just(512u16), Just(1232), Just(4096)]),
        r in reply(),
    ) {
        let lower = qname.to_ascii_lowercase();
        // The client's query, possibly in other case than we ask upstream.
        let asked = if client_spelling { qname.to_ascii_uppercase() } else { qname.clone() };
        let cq = wire::build_query(0xbeef, &asked, qtype, client_edns);
        let q = wire::parse_query(&cq).unwrap();
        let id = 0x1234;
        let resp = encode_reply(&r, id, &lower, qtype);
        let mut out = Vec::new();
        if forward::relay(&resp, id, &q, &mut out) {
            let m = Message::parse(&out).expect("what the client gets parses");
            prop_assert_eq!(&out[0..2], &[0xbe, 0xef]);
            prop_assert!(m.header.flags & wire::QR != 0);
            prop_assert_eq!(m.questions.len(), 1);
            prop_assert_eq!(
                &out[wire::HEADER_LEN..wire::HEADER_LEN + q.question.len()],
                q.question,
                "the client's own question, spelled as it asked"
            );
            prop_assert_eq!(m.opt_span.is_some(), client_edns.is_some(), "OPT iff the client sent one");
            prop_assert!(![wire::SERVFAIL, wire::REFUSED, wire::FORMERR, wire::NOTIMP].contains(&m.rcode()));
        } else {
            prop_assert!(out.is_empty());
        }
    }
}
