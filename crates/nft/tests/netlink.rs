//! The netlink encoder against the real kernel, in a private namespace: what
//! we send must read back through `nft list` as the same ruleset, and
//! incremental changes must land exactly.

use podnet_nft::diff::diff;
use podnet_nft::model::*;
use podnet_nft::netlink::Conn;
use podnet_testkit::TestNs;

fn every_expression() -> Table {
    let mut t = Table::new(Family::Ip, "pntest");
    let mut m = Set::map(vec![
        KeyType::Ipv4Addr,
        KeyType::InetProto,
        KeyType::InetService,
    ]);
    m.elements.insert(
        vec![
            Value::Addr("10.96.0.1".parse().unwrap()),
            Value::Proto(Proto::Tcp),
            Value::Port(443),
        ],
        Some(ElemData::Verdict(Verdict::Goto("svc-a".into()))),
    );
    t.sets.insert("service-ips".into(), m);
    let mut np = Set::map(vec![KeyType::InetProto, KeyType::InetService]);
    np.elements.insert(
        vec![Value::Proto(Proto::Udp), Value::Port(30053)],
        Some(ElemData::Verdict(Verdict::Goto("svc-a".into()))),
    );
    t.sets.insert("service-nodeports".into(), np);
    let mut aff = Set::new(vec![KeyType::Ipv4Addr]);
    aff.timeout = Some(10800);
    t.sets.insert("aff-a".into(), aff);
    t.chains.insert(
        "nat-prerouting".into(),
        Chain {
            base: Some(BaseChain {
                kind: ChainType::Nat,
                hook: Hook::Prerouting,
                priority: -100,
            }),
            rules: vec![
                Rule::new(vec![Expr::VMap {
                    keys: vec![Field::IpDaddr, Field::L4Proto, Field::Dport],
                    map: "service-ips".into(),
                }]),
                Rule::new(vec![
                    Expr::FibDaddrLocal,
                    Expr::Cmp {
                        field: Field::IpDaddr,
                        neg: true,
                        value: Value::Net("127.0.0.0/8".parse().unwrap()),
                    },
                    Expr::VMap {
                        keys: vec![Field::L4Proto, Field::Dport],
                        map: "service-nodeports".into(),
                    },
                ]),
            ],
        },
    );
    t.chains.insert(
        "nat-postrouting".into(),
        Chain {
            base: Some(BaseChain {
                kind: ChainType::Nat,
                hook: Hook::Postrouting,
                priority: 100,
            }),
            rules: vec![
                Rule::new(vec![
                    Expr::MarkSet { mask: 0x4000 },
                    Expr::Masquerade { fully_random: true },
                ]),
                Rule::new(vec![Expr::CtDnat, Expr::Counter]),
                Rule::new(vec![Expr::CtStateNew, Expr::Counter]),
                Rule::new(vec![Expr::FibSaddrLocal, Expr::Counter]),
            ],
        },
    );
    t.chains.insert(
        "mark".into(),
        Chain {
            base: None,
            rules: vec![Rule::new(vec![Expr::SetMark { bits: 0x4000 }])],
        },
    );
    t.chains.insert(
        "svc-a".into(),
        Chain {
            base: None,
            rules: vec![
                Rule::new(vec![
                    Expr::Cmp {
                        field: Field::IpSaddr,
                        neg: true,
                        value: Value::Net("10.244.0.0/16".parse().unwrap()),
                    },
                    Expr::Verdict(Verdict::Jump("mark".into())),
                ]),
                Rule::new(vec![
                    Expr::InSet {
                        keys: vec![Field::IpSaddr],
                        set: "aff-a".into(),
                        neg: false,
                    },
                    Expr::Verdict(Verdict::Goto("ep-a".into())),
                ]),
                Rule::new(vec![
                    Expr::Numgen {
                        modulus: 2,
                        value: 0,
                    },
                    Expr::Verdict(Verdict::Goto("ep-a".into())),
                ]),
                Rule::new(vec![Expr::Verdict(Verdict::Goto("ep-b".into()))]),
            ],
        },
    );
    for (c, ip) in [("ep-a", "10.244.1.5"), ("ep-b", "10.244.2.5")] {
        t.chains.insert(
            c.into(),
            Chain {
                base: None,
                rules: vec![
                    Rule::new(vec![Expr::UpdateSet {
                        keys: vec![Field::IpSaddr],
                        set: "aff-a".into(),
                    }]),
                    Rule::new(vec![
                        Expr::Cmp {
                            field: Field::L4Proto,
                            neg: false,
                            value: Value::Proto(Proto::Tcp),
                        },
                        Expr::Dnat {
                            addr: ip.parse().unwrap(),
                            port: Some(8080),
                        },
                    ]),
                ],
            },
        );
    }
    // The service proxy's fast path: data maps, a numgen-indexed DNAT and a
    // hairpin check on conntrack's original destination.
    let three = vec![KeyType::Ipv4Addr, KeyType::InetProto, KeyType::InetService];
    let mut indexed = three.clone();
    indexed.push(KeyType::Mark);
    let mut eps = Set::data_map(indexed, vec![KeyType::Ipv4Addr, KeyType::InetService]);
    eps.elements.insert(
        vec![
            Value::Addr("10.96.0.7".parse().unwrap()),
            Value::Proto(Proto::Tcp),
            Value::Port(80),
            Value::U32(1),
        ],
        Some(ElemData::Data(vec![
            Value::Addr("10.244.3.7".parse().unwrap()),
            Value::Port(8080),
        ])),
    );
    t.sets.insert("fast-endpoints".into(), eps);
    let mut hp = Set::new(vec![
        KeyType::Ipv4Addr,
        KeyType::Ipv4Addr,
        KeyType::Ipv4Addr,
        KeyType::InetService,
    ]);
    hp.elements.insert(
        vec![
            Value::Addr("10.244.3.7".parse().unwrap()),
            Value::Addr("10.244.3.7".parse().unwrap()),
            Value::Addr("10.96.0.7".parse().unwrap()),
            Value::Port(80),
        ],
        None,
    );
    t.sets.insert("fast-hairpin".into(), hp);
    t.chains.insert(
        "pick-2".into(),
        Chain {
            base: None,
            rules: vec![Rule::new(vec![Expr::PickDnat {
                keys: vec![Field::IpDaddr, Field::L4Proto, Field::Dport],
                modulus: 2,
                map: "fast-endpoints".into(),
            }])],
        },
    );
    t.chains
        .get_mut("nat-postrouting")
        .unwrap()
        .rules
        .push(Rule::new(vec![
            Expr::CtDnat,
            Expr::InSet {
                keys: vec![
                    Field::IpSaddr,
                    Field::IpDaddr,
                    Field::CtOrigIpDaddr,
                    Field::CtOrigDport,
                ],
                set: "fast-hairpin".into(),
                neg: false,
            },
            Expr::Masquerade { fully_random: true },
        ]));
    t.chains.insert(
        "filter-forward".into(),
        Chain {
            base: Some(BaseChain {
                kind: ChainType::Filter,
                hook: Hook::Forward,
                priority: -110,
            }),
            rules: vec![Rule::new(vec![
                Expr::Cmp {
                    field: Field::IpDaddr,
                    neg: false,
                    value: Value::Addr("10.96.0.99".parse().unwrap()),
                },
                Expr::Reject { tcp_reset: false },
            ])],
        },
    );
    t
}

#[test]
fn every_expression_reads_back_as_written() {
    let g = TestNs::new("nl");
    let ns = g.netns();
    let list = || g.nft_list("ruleset").expect("a ruleset");
    let t = every_expression();
    ns.run(|| Conn::open().unwrap().apply(&t, &diff(None, &t)))
        .unwrap()
        .unwrap();
    let got = list();
    for want in [
        "type ipv4_addr . inet_proto . inet_service : verdict",
        "10.96.0.1 . tcp . 443 : goto svc-a",
        "udp . 30053 : goto svc-a",
        "ip daddr . meta l4proto . th dport vmap @service-ips",
        "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports",
        "meta mark & 0x00004000 != 0x00000000 masquerade fully-random",
        "ct status dnat",
        "ct state new counter",
        "meta mark set meta mark | 0x00004000",
        "ip saddr != 10.244.0.0/16 jump mark",
        "ip saddr @aff-a goto ep-a",
        "numgen random mod 2 0 goto ep-a",
        "update @aff-a { ip saddr }",
        "meta l4proto tcp dnat to 10.244.1.5:8080",
        "ip daddr 10.96.0.99 reject",
        "type nat hook prerouting priority dstnat; policy accept;",
        "timeout 3h",
        "type ipv4_addr . inet_proto . inet_service . mark : ipv4_addr . inet_service",
        "10.96.0.7 . tcp . 80 . 0x00000001 : 10.244.3.7 . 8080",
        "dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @fast-endpoints",
        "ct status dnat ip saddr . ip daddr . ct original ip daddr . ct original proto-dst @fast-hairpin masquerade fully-random",
        "10.244.3.7 . 10.244.3.7 . 10.96.0.7 . 80",
    ] {
        assert!(got.contains(want), "missing {want:?} in\n{got}");
    }
    // An incremental change: one element out, one in, one chain rewritten.
    let mut t2 = t.clone();
    let m = t2.sets.get_mut("service-ips").unwrap();
    m.elements.clear();
    m.elements.insert(
        vec![
            Value::Addr("10.96.0.2".parse().unwrap()),
            Value::Proto(Proto::Udp),
            Value::Port(53),
        ],
        Some(ElemData::Verdict(Verdict::Goto("svc-a".into()))),
    );
    t2.chains.get_mut("ep-b").unwrap().rules[1] = Rule::new(vec![Expr::Dnat {
        addr: "10.244.2.6".parse().unwrap(),
        port: Some(9090),
    }]);
    let d = diff(Some(&t), &t2);
    ns.run(|| Conn::open().unwrap().apply(&t2, &d))
        .unwrap()
        .unwrap();
    let got = list();
    assert!(
        got.contains("10.96.0.2 . udp . 53 : goto svc-a") && !got.contains("10.96.0.1 . tcp . 443"),
        "{got}"
    );
    assert!(
        got.contains("dnat to 10.244.2.6:9090") && !got.contains("10.244.2.5"),
        "{got}"
    );
    // A failing transaction changes nothing (a goto to a missing chain).
    let mut bad = t2.clone();
    bad.sets.get_mut("service-ips").unwrap().elements.insert(
        vec![
            Value::Addr("10.96.0.3".parse().unwrap()),
            Value::Proto(Proto::Tcp),
            Value::Port(80),
        ],
        Some(ElemData::Verdict(Verdict::Goto("nope".into()))),
    );
    bad.chains.get_mut("ep-a").unwrap().rules.clear();
    let e = ns
        .run(|| Conn::open().unwrap().apply(&bad, &diff(Some(&t2), &bad)))
        .unwrap()
        .unwrap_err();
    assert!(
        e.to_string().contains("service-ips") || e.to_string().contains("nope"),
        "{e}"
    );
    assert_eq!(list(), got, "a failed batch must leave the table as it was");
    // A full replace swaps the table atomically, whatever is there.
    ns.run(|| {
        Conn::open()
            .unwrap()
            .apply(&t, &podnet_nft::diff::replace(&t))
    })
    .unwrap()
    .unwrap();
    assert!(list().contains("10.96.0.1 . tcp . 443"));
    // The use count follows chains others add or delete.
    let use_of = || {
        ns.run(|| Conn::open().unwrap().table_use(Family::Ip, "pntest"))
            .unwrap()
            .unwrap()
    };
    let full = use_of().expect("table exists");
    assert_eq!(full as usize, t.chains.len() + t.sets.len());
    g.nft("add chain ip pntest stray");
    assert_eq!(use_of(), Some(full + 1));
    g.nft("delete chain ip pntest stray");
    assert_eq!(use_of(), Some(full));
    assert!(ns
        .run(|| Conn::open().unwrap().delete_table(Family::Ip, "pntest"))
        .unwrap()
        .unwrap());
    assert!(!list().contains("pntest"));
    assert_eq!(use_of(), None);
}

/// A table with what the node's and the CNI plugins' tables need beyond
/// the proxy's: an `inet` table with concatenated ranges, commented
/// elements, a named counter, a dynamic set filled by `add @set`.
fn shared_table() -> Table {
    let mut t = Table::new(Family::Inet, "pnshared");
    let mut masq = Set::new(vec![KeyType::Ipv4Addr]);
    let pod = vec![Value::Addr("10.1.0.2".parse().unwrap())];
    masq.elements.insert(pod.clone(), None);
    masq.comments.insert(pod, "net/ctr1".into());
    masq.elements
        .insert(vec![Value::Addr("10.1.0.9".parse().unwrap())], None);
    t.sets.insert("masq4".into(), masq);
    let mut nomasq = Set::new(vec![KeyType::Ipv4Addr, KeyType::Ipv4Addr]);
    nomasq.interval = true;
    let pair = vec![
        Value::Addr("10.1.0.2".parse().unwrap()),
        Value::Net("10.1.0.0/24".parse().unwrap()),
    ];
    nomasq.elements.insert(pair.clone(), None);
    nomasq.comments.insert(pair, "net/ctr1".into());
    t.sets.insert("nomasq4".into(), nomasq);
    let mut hp = Set::data_map(
        vec![KeyType::InetProto, KeyType::InetService],
        vec![KeyType::Ipv4Addr, KeyType::InetService],
    );
    hp.elements.insert(
        vec![Value::Proto(Proto::Tcp), Value::Port(8080)],
        Some(ElemData::Data(vec![
            Value::Addr("10.1.0.2".parse().unwrap()),
            Value::Port(80),
        ])),
    );
    t.sets.insert("hp4any".into(), hp);
    let mut seen = Set::new(vec![KeyType::Ipv4Addr, KeyType::Ipv4Addr]);
    seen.dynamic = true;
    seen.size = Some(65535);
    t.sets.insert("seen".into(), seen);
    t.counters.insert("hits".into());
    t.chains.insert(
        "post".into(),
        Chain {
            base: Some(BaseChain {
                kind: ChainType::Nat,
                hook: Hook::Postrouting,
                priority: 100,
            }),
            rules: vec![
                Rule::new(vec![
                    Expr::InSet {
                        keys: vec![Field::IpSaddr, Field::IpDaddr],
                        set: "nomasq4".into(),
                        neg: false,
                    },
                    Expr::Verdict(Verdict::Return),
                ]),
                Rule::new(vec![
                    Expr::InSet {
                        keys: vec![Field::IpSaddr],
                        set: "masq4".into(),
                        neg: false,
                    },
                    Expr::Masquerade {
                        fully_random: false,
                    },
                ]),
            ],
        },
    );
    t.chains.insert(
        "pre".into(),
        Chain {
            base: Some(BaseChain {
                kind: ChainType::Nat,
                hook: Hook::Prerouting,
                priority: -100,
            }),
            rules: vec![Rule::new(vec![
                Expr::FibDaddrLocal,
                Expr::Cmp {
                    field: Field::NfProto,
                    neg: false,
                    value: Value::U8(2),
                },
                Expr::MapDnat {
                    keys: vec![Field::L4Proto, Field::Dport],
                    map: "hp4any".into(),
                    v6: false,
                },
            ])],
        },
    );
    t.chains.insert(
        "raw".into(),
        Chain {
            base: Some(BaseChain {
                kind: ChainType::Filter,
                hook: Hook::Prerouting,
                priority: -300,
            }),
            rules: vec![Rule::new(vec![
                Expr::Cmp {
                    field: Field::IifName,
                    neg: false,
                    value: Value::Name("lo".into()),
                },
                Expr::Cmp {
                    field: Field::PktType,
                    neg: false,
                    value: Value::U8(0),
                },
                Expr::FibDaddrNotLocal,
                Expr::CounterRef("hits".into()),
                Expr::AddSet {
                    keys: vec![Field::IpSaddr, Field::IpDaddr],
                    set: "seen".into(),
                },
                Expr::Notrack,
            ])],
        },
    );
    t
}

#[test]
fn shared_table_features_round_trip_through_the_kernel() {
    let g = TestNs::new("nftshared");
    let ns = g.netns();
    let list = || g.nft_list("ruleset").expect("a ruleset");
    let t = shared_table();
    let sync = |t: &Table| ns.run(|| Conn::open().unwrap().sync(t)).unwrap().unwrap();
    assert!(!sync(&t).is_empty());
    assert_eq!(sync(&t), vec![], "the second sync changes nothing");
    let got = list();
    for want in [
        "counter hits",
        "10.1.0.2 comment \"net/ctr1\"",
        "10.1.0.2 . 10.1.0.0/24 comment \"net/ctr1\"",
        "tcp . 8080 : 10.1.0.2 . 80",
        "ip saddr . ip daddr @nomasq4 return",
        "ip saddr @masq4 masquerade",
        "dnat ip to meta l4proto . th dport map @hp4any",
        "iifname \"lo\" meta pkttype host fib daddr type != local counter name \"hits\" add @seen { ip saddr . ip daddr } notrack",
        "size 65535",
    ] {
        assert!(got.contains(want), "{want:?} in\n{got}");
    }
    // Elements, comments and counters read back over netlink.
    let (masq, counter) = ns
        .run(|| {
            let mut c = Conn::open().unwrap();
            (
                c.elements(Family::Inet, "pnshared", "nomasq4", &t.sets["nomasq4"])
                    .unwrap()
                    .unwrap(),
                c.counter(Family::Inet, "pnshared", "hits").unwrap(),
            )
        })
        .unwrap();
    assert_eq!(masq, t.sets["nomasq4"]);
    assert_eq!(counter, Some((0, 0)));
    // Changed behind our back: one element, one rule; the sync repairs both.
    let sh = |cmd: &str| {
        g.nft(&format!("'{cmd}'"));
    };
    sh("delete element inet pnshared masq4 { 10.1.0.9 }");
    sh("add rule inet pnshared post counter");
    let repair = sync(&t);
    assert_eq!(podnet_nft::diff::ops(&repair), 4, "{repair:?}");
    assert_eq!(sync(&t), vec![]);
    assert_eq!(list(), got);
    // A comment that changes hands is an element replaced.
    let mut t2 = t.clone();
    let pod = vec![Value::Addr("10.1.0.2".parse().unwrap())];
    t2.sets
        .get_mut("masq4")
        .unwrap()
        .comments
        .insert(pod, "net/ctr2".into());
    assert_eq!(podnet_nft::diff::ops(&sync(&t2)), 2);
    assert!(list().contains("10.1.0.2 comment \"net/ctr2\""));
    assert!(ns
        .run(|| Conn::open().unwrap().delete_table(Family::Inet, "pnshared"))
        .unwrap()
        .unwrap());
}

#[test]
fn an_element_lookup_finds_exactly_what_the_set_holds() {
    let g = TestNs::new("nlget");
    let ns = g.netns();
    let t = every_expression();
    let key = |ip: &str, port: u16| {
        vec![
            Value::Addr(ip.parse().unwrap()),
            Value::Proto(Proto::Tcp),
            Value::Port(port),
        ]
    };
    let (held, other_port, missing_table) = ns
        .run(|| {
            let mut c = Conn::open().unwrap();
            // Before the table exists: not found, not an error.
            let missing = c
                .has_element(t.family, &t.name, "service-ips", &key("10.96.0.1", 443))
                .unwrap();
            c.apply(&t, &diff(None, &t)).unwrap();
            let held = c
                .has_element(t.family, &t.name, "service-ips", &key("10.96.0.1", 443))
                .unwrap();
            let other = c
                .has_element(t.family, &t.name, "service-ips", &key("10.96.0.1", 444))
                .unwrap();
            (held, other, missing)
        })
        .unwrap();
    assert!(held, "the element the table was written with");
    assert!(!other_port, "a key differing in one field");
    assert!(!missing_table, "no table yet");
}
