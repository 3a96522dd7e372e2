//! `meta nftrace set 1` against the real kernel: a table of ours marks one
//! flow, and the trace group reports every rule that flow then meets, in
//! every table, with verdicts that name the rule (by handle, which
//! [`Conn::rule_refs`] maps back to the plan's rule).

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use podnet_kernel::nftrace::{TraceEvent, TraceKind, TraceListener, TraceVerdict};
use podnet_nft::diff::diff;
use podnet_nft::model::*;
use podnet_nft::netlink::Conn;
use podnet_testkit::TestNs;

const SPORT: u16 = 40123;

fn base(hook: Hook, priority: i32, rules: Vec<Rule>) -> Chain {
    Chain {
        base: Some(BaseChain {
            kind: ChainType::Filter,
            hook,
            priority,
        }),
        rules,
    }
}

/// Marks UDP from our source port, before anything else sees it.
fn marker() -> Table {
    let mut t = Table::new(Family::Inet, "pntrace");
    t.chains.insert(
        "out".into(),
        base(
            Hook::Output,
            -300,
            vec![Rule::new(vec![
                Expr::Cmp {
                    field: Field::L4Proto,
                    neg: false,
                    value: Value::Proto(Proto::Udp),
                },
                Expr::Cmp {
                    field: Field::Sport,
                    neg: false,
                    value: Value::Port(SPORT),
                },
                Expr::SetNftrace,
            ])],
        ),
    );
    t
}

/// Counts everything, then drops UDP to port 9 with a comment.
fn filter() -> Table {
    let mut t = Table::new(Family::Ip, "pnfilter");
    let mut drop9 = Rule::new(vec![
        Expr::Cmp {
            field: Field::Dport,
            neg: false,
            value: Value::Port(9),
        },
        Expr::Verdict(Verdict::Drop),
    ]);
    drop9.comment = Some("no discard service here".into());
    t.chains.insert(
        "output".into(),
        base(Hook::Output, 0, vec![Rule::new(vec![Expr::Counter]), drop9]),
    );
    t
}

#[test]
fn a_marked_packet_reports_every_rule_it_meets() {
    let g = TestNs::new("trace");
    let ns = g.netns();
    for t in [marker(), filter()] {
        ns.run(|| Conn::open().unwrap().apply(&t, &diff(None, &t)))
            .unwrap()
            .unwrap();
    }
    // Read back, the kernel's copy is the plan: a repeated sync changes nothing.
    for t in [marker(), filter()] {
        let again = ns.run(|| Conn::open().unwrap().sync(&t)).unwrap().unwrap();
        assert!(again.is_empty(), "{again:?}");
    }
    let got = g.nft_list("table inet pntrace").unwrap();
    assert!(got.contains("udp sport 40123 meta nftrace set 1"), "{got}");
    let mut l = TraceListener::in_netns(ns).unwrap();
    l.set_timeout(Some(Duration::from_millis(200))).unwrap();
    // One datagram from the marked port, one from another (not traced).
    ns.run(|| {
        for port in [SPORT + 1, SPORT] {
            let s = UdpSocket::bind(("127.0.0.1", port)).unwrap();
            // The drop rule makes send fail with EPERM: that is the point.
            let err = s.send_to(b"x", "127.0.0.1:9").unwrap_err();
            assert_eq!(err.raw_os_error(), Some(1) /* EPERM */, "{err}");
        }
    })
    .unwrap();
    let mut events: Vec<TraceEvent> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !events.iter().any(|e| e.verdict == Some(TraceVerdict::Drop)) {
        assert!(Instant::now() < deadline, "no drop reported: {events:#?}");
        events.extend(l.recv().unwrap());
    }
    assert_eq!(l.lost(), 0);
    // All of one packet's walk, which is ours.
    let id = events[0].id;
    assert!(events.iter().all(|e| e.id == id), "{events:#?}");
    let p = events[0]
        .packet
        .expect("the first event carries the headers");
    assert_eq!((p.proto, p.sport, p.dport), (17, SPORT, 9));
    // Each rule that matched reports by its handle; a chain that runs
    // out of rules says so once, without a handle, before its policy.
    let handles: Vec<bool> = events.iter().map(|e| e.rule.is_some()).collect();
    assert_eq!(handles, [true, false, false, true, true], "{events:#?}");
    let walk: Vec<(&str, &str, TraceKind, Option<TraceVerdict>)> = events
        .iter()
        .map(|e| {
            (
                e.table.as_str(),
                e.chain.as_str(),
                e.kind,
                e.verdict.clone(),
            )
        })
        .collect();
    assert_eq!(
        walk,
        vec![
            (
                "pntrace",
                "out",
                TraceKind::Rule,
                Some(TraceVerdict::Continue)
            ),
            (
                "pntrace",
                "out",
                TraceKind::Rule,
                Some(TraceVerdict::Continue)
            ),
            ("pntrace", "out", TraceKind::Policy, None),
            (
                "pnfilter",
                "output",
                TraceKind::Rule,
                Some(TraceVerdict::Continue)
            ),
            (
                "pnfilter",
                "output",
                TraceKind::Rule,
                Some(TraceVerdict::Drop)
            ),
        ]
    );
    assert_eq!(events[2].policy, Some(TraceVerdict::Accept));
    // The handles name the rules: the drop is the second rule of the
    // filter's chain, with its comment.
    let refs = ns
        .run(|| Conn::open().unwrap().rule_refs())
        .unwrap()
        .unwrap();
    let drop = refs
        .iter()
        .find(|r| r.table == "pnfilter" && Some(r.handle) == events[4].rule)
        .expect("the drop's handle is listed");
    assert_eq!(
        (drop.family, drop.chain.as_str(), drop.index),
        (2, "output", 1)
    );
    assert_eq!(drop.comment.as_deref(), Some("no discard service here"));
}

/// The flow log's source: ctnetlink's multicast events report a new
/// connection (with its tuples) once the kernel confirms it, in the
/// namespace it happened in.
#[test]
fn conntrack_events_report_new_connections() {
    use podnet_kernel::conntrack::{EventKind, Events};
    let g = TestNs::new("ctev");
    let ns = g.netns();
    // Connection tracking starts once a rule needs it.
    let mut t = Table::new(Family::Inet, "pnct");
    t.chains.insert(
        "out".into(),
        base(
            Hook::Output,
            0,
            vec![Rule::new(vec![Expr::CtStateNew, Expr::Counter])],
        ),
    );
    ns.run(|| Conn::open().unwrap().apply(&t, &diff(None, &t)))
        .unwrap()
        .unwrap();
    let mut ev = ns
        .run(|| Events::open(&[EventKind::New, EventKind::Destroy]))
        .unwrap()
        .unwrap();
    ev.set_timeout(Some(Duration::from_millis(200))).unwrap();
    let port = ns
        .run(|| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            let c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            let sport = c.local_addr().unwrap().port();
            drop(l.accept().unwrap());
            (port, sport)
        })
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let new = loop {
        assert!(Instant::now() < deadline, "no New event");
        if let Some((_, e)) = ev
            .recv()
            .unwrap()
            .into_iter()
            .find(|(k, e)| *k == EventKind::New && e.orig.dport == port.0)
        {
            break e;
        }
    };
    assert_eq!(new.proto, 6);
    assert_eq!(new.orig.sport, port.1);
    assert_eq!(
        new.orig.src,
        "127.0.0.1".parse::<std::net::IpAddr>().unwrap()
    );
    assert_eq!(new.reply.sport, port.0, "the reply comes from the listener");
    assert_eq!(ev.lost(), 0);
}
