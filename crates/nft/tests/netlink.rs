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

/// What a NetworkPolicy data plane needs: (pod . peer . proto . port)
/// interval sets whose peer is a prefix or an address and whose port is a
/// range or a port, in IPv4 and IPv6, two-field (address . prefix) sets,
/// `th dport` ranges, an NFLOG verdict log and rate limits.
fn policy_table() -> Table {
    let mut t = Table::new(Family::Inet, "pnpolicy");
    let v = |s: &str| match s.parse::<ipnet::IpNet>() {
        Ok(n) => Value::Net(n),
        Err(_) => Value::Addr(s.parse().unwrap()),
    };
    let four = |a: KeyType| {
        let mut s = Set::new(vec![a, a, KeyType::InetProto, KeyType::InetService]);
        s.interval = true;
        s
    };
    let two = |a: KeyType| {
        let mut s = Set::new(vec![a, a]);
        s.interval = true;
        s
    };
    let (tcp, udp, sctp) = (
        Value::Proto(Proto::Tcp),
        Value::Proto(Proto::Udp),
        Value::Proto(Proto::Sctp),
    );
    let mut allow4 = four(KeyType::Ipv4Addr);
    for k in [
        vec![
            v("10.0.1.5"),
            v("10.0.2.0/24"),
            tcp.clone(),
            Value::PortRange(8000, 8100),
        ],
        // An exact peer spelled as a /32, as an ipBlock would have it.
        vec![
            v("10.0.1.5"),
            v("10.0.3.7/32"),
            udp.clone(),
            Value::Port(53),
        ],
        vec![v("10.0.1.6"), v("0.0.0.0/0"), tcp.clone(), Value::Port(80)],
        vec![
            v("10.0.1.6"),
            v("10.0.4.0/22"),
            sctp.clone(),
            Value::PortRange(1, 65535),
        ],
    ] {
        allow4.elements.insert(k, None);
    }
    allow4.comments.insert(
        vec![v("10.0.1.6"), v("0.0.0.0/0"), tcp.clone(), Value::Port(80)],
        "default/web".into(),
    );
    t.sets.insert("allow4".into(), allow4);
    let mut allow6 = four(KeyType::Ipv6Addr);
    for k in [
        vec![
            v("fd00::5"),
            v("fd00:2::/64"),
            tcp.clone(),
            Value::PortRange(8000, 8100),
        ],
        vec![v("fd00::5"), v("fd00:3::7"), udp.clone(), Value::Port(53)],
        vec![v("fd00::6"), v("::/0"), tcp.clone(), Value::Port(443)],
    ] {
        allow6.elements.insert(k, None);
    }
    t.sets.insert("allow6".into(), allow6);
    let mut pair4 = two(KeyType::Ipv4Addr);
    pair4
        .elements
        .insert(vec![v("10.0.1.5"), v("10.0.2.0/24")], None);
    pair4
        .elements
        .insert(vec![v("10.0.1.5"), v("10.0.3.7")], None);
    t.sets.insert("pair4".into(), pair4);
    let mut pair6 = two(KeyType::Ipv6Addr);
    pair6
        .elements
        .insert(vec![v("fd00::5"), v("fd00:2::/64")], None);
    pair6
        .elements
        .insert(vec![v("fd00::5"), v("fd00:3::7/128")], None);
    t.sets.insert("pair6".into(), pair6);
    // One-field ranges: adjacent ones, exact values, one running to the end.
    let mut cidr4 = Set::new(vec![KeyType::Ipv4Addr]);
    cidr4.interval = true;
    for c in ["10.0.0.0/8", "11.0.0.0/8", "192.168.1.1", "224.0.0.0/3"] {
        cidr4.elements.insert(vec![v(c)], None);
    }
    cidr4
        .comments
        .insert(vec![v("192.168.1.1")], "default/db".into());
    t.sets.insert("cidr4".into(), cidr4);
    let mut cidr6 = Set::new(vec![KeyType::Ipv6Addr]);
    cidr6.interval = true;
    for c in ["fd00::/16", "::1/128", "ff00::/8"] {
        cidr6.elements.insert(vec![v(c)], None);
    }
    t.sets.insert("cidr6".into(), cidr6);
    let mut ports = Set::new(vec![KeyType::InetService]);
    ports.interval = true;
    for p in [
        Value::Port(22),
        Value::PortRange(80, 90),
        Value::PortRange(91, 100),
        Value::PortRange(65000, 65535),
    ] {
        ports.elements.insert(vec![p], None);
    }
    t.sets.insert("ports".into(), ports);
    let mut cidrv = Set::map(vec![KeyType::Ipv4Addr]);
    cidrv.interval = true;
    cidrv.elements.insert(
        vec![v("10.0.0.0/8")],
        Some(ElemData::Verdict(Verdict::Accept)),
    );
    cidrv.elements.insert(
        vec![v("10.0.0.0/8").canonical()],
        Some(ElemData::Verdict(Verdict::Accept)),
    );
    cidrv.elements.insert(
        vec![v("172.16.0.0/12")],
        Some(ElemData::Verdict(Verdict::Drop)),
    );
    t.sets.insert("cidrv".into(), cidrv);
    let lookup = |keys: Vec<Field>, set: &str| Expr::InSet {
        keys,
        set: set.into(),
        neg: false,
    };
    let log = |p: &str| Expr::Log {
        group: 7,
        prefix: p.into(),
    };
    let accept = || Expr::Verdict(Verdict::Accept);
    t.chains.insert(
        "forward".into(),
        Chain {
            base: Some(BaseChain {
                kind: ChainType::Filter,
                hook: Hook::Forward,
                priority: 0,
            }),
            rules: vec![
                Rule::new(vec![
                    Expr::Limit {
                        rate: 1000,
                        burst: 100,
                        over: true,
                    },
                    Expr::Verdict(Verdict::Drop),
                ]),
                Rule::new(vec![
                    lookup(
                        vec![Field::IpDaddr, Field::IpSaddr, Field::L4Proto, Field::Dport],
                        "allow4",
                    ),
                    log("np allow"),
                    accept(),
                ]),
                Rule::new(vec![
                    lookup(
                        vec![
                            Field::Ip6Daddr,
                            Field::Ip6Saddr,
                            Field::L4Proto,
                            Field::Dport,
                        ],
                        "allow6",
                    ),
                    log("np allow"),
                    accept(),
                ]),
                Rule::new(vec![
                    lookup(vec![Field::IpDaddr, Field::IpSaddr], "pair4"),
                    accept(),
                ]),
                Rule::new(vec![
                    lookup(vec![Field::Ip6Daddr, Field::Ip6Saddr], "pair6"),
                    accept(),
                ]),
                Rule::new(vec![
                    Expr::Cmp {
                        field: Field::Dport,
                        neg: false,
                        value: Value::PortRange(9000, 9100),
                    },
                    accept(),
                ]),
                Rule::new(vec![
                    lookup(vec![Field::IpSaddr], "cidr4"),
                    lookup(vec![Field::Dport], "ports"),
                    accept(),
                ]),
                Rule::new(vec![
                    Expr::InSet {
                        keys: vec![Field::Ip6Saddr],
                        set: "cidr6".into(),
                        neg: true,
                    },
                    Expr::Verdict(Verdict::Drop),
                ]),
                Rule::new(vec![Expr::VMap {
                    keys: vec![Field::IpDaddr],
                    map: "cidrv".into(),
                }]),
                Rule::new(vec![
                    Expr::Cmp {
                        field: Field::Dport,
                        neg: true,
                        value: Value::PortRange(80, 90),
                    },
                    Expr::Limit {
                        rate: 10,
                        burst: 5,
                        over: false,
                    },
                    log("np deny"),
                ]),
                Rule::new(vec![Expr::Verdict(Verdict::Drop)]),
            ],
        },
    );
    t
}

/// An `nft list` text with each set's elements sorted: a concatenated
/// interval set lists them in the order they were added.
fn elements_sorted(listing: &str) -> String {
    let mut out = String::new();
    let mut rest = listing;
    while let Some(i) = rest.find("elements = { ") {
        let (head, tail) = rest.split_at(i + "elements = { ".len());
        let end = tail.find(" }").expect("elements end");
        let mut els: Vec<&str> = tail[..end].split(',').map(str::trim).collect();
        els.sort();
        out.push_str(head);
        out.push_str(&els.join(", "));
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[test]
fn policy_features_round_trip_through_the_kernel() {
    let g = TestNs::new("nftnp");
    let ns = g.netns();
    let t = policy_table();
    let list = || g.nft_list("table inet pnpolicy").expect("the table");
    let sync = |t: &Table| ns.run(|| Conn::open().unwrap().sync(t)).unwrap().unwrap();
    let observe = |t: &Table| {
        ns.run(|| Conn::open().unwrap().observe(t))
            .unwrap()
            .unwrap()
    };
    // The render is what `nft -f` accepts (checked against this namespace's
    // kernel before anything is there).
    let mut check = g.command("nft");
    check
        .args(["-c", "-f", "/dev/stdin"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = check.spawn().expect("nft");
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(t.render().as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "nft -c rejects the render: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        t.render()
    );
    // Applied over netlink, it reads back equal, so the next sync is empty.
    assert!(!sync(&t).is_empty());
    assert_eq!(observe(&t).as_ref(), Some(&t));
    assert_eq!(sync(&t), vec![], "the second sync changes nothing");
    // The kernel holds what nft itself makes of the render: the same
    // listing as the render loaded by `nft -f` in a second namespace.
    let got = list();
    let twin = TestNs::new("nftnp2");
    let path = std::env::temp_dir().join(format!("{}.nft", twin.name()));
    std::fs::write(&path, t.render()).unwrap();
    let loaded = twin.nft(&format!("-f {}", path.display()));
    let _ = std::fs::remove_file(&path);
    assert_eq!(loaded, "");
    assert_eq!(
        elements_sorted(&got),
        elements_sorted(
            &twin
                .nft_list("table inet pnpolicy")
                .expect("the twin table")
        )
    );
    drop(twin);
    let got = elements_sorted(&got);
    for want in [
        "10.0.1.5 . 10.0.2.0/24 . tcp . 8000-8100",
        "10.0.1.5 . 10.0.3.7 . udp . 53",
        "10.0.1.6 . 0.0.0.0/0 . tcp . 80 comment \"default/web\"",
        "10.0.1.6 . 10.0.4.0/22 . sctp . 1-65535",
        "fd00::5 . fd00:2::/64 . tcp . 8000-8100",
        "fd00::6 . ::/0 . tcp . 443",
        "10.0.1.5 . 10.0.2.0/24",
        "fd00::5 . fd00:3::7",
        "{ 10.0.0.0/8, 11.0.0.0/8, 192.168.1.1 comment \"default/db\", 224.0.0.0/3 }",
        "{ ::1, fd00::/16, ff00::/8 }",
        "{ 22, 65000-65535, 80-90, 91-100 }",
        "{ 10.0.0.0/8 : accept, 172.16.0.0/12 : drop }",
        "ip saddr @cidr4 th dport @ports accept",
        "ip6 saddr != @cidr6 drop",
        "ip daddr vmap @cidrv",
        "limit rate over 1000/second burst 100 packets drop",
        "ip daddr . ip saddr . meta l4proto . th dport @allow4 log prefix \"np allow\" group 7 accept",
        "ip6 daddr . ip6 saddr . meta l4proto . th dport @allow6 log prefix \"np allow\" group 7 accept",
        "th dport 9000-9100 accept",
        // (nft leaves out a burst of 5 packets, its default)
        "th dport != 80-90 limit rate 10/second log prefix \"np deny\" group 7",
    ] {
        assert!(got.contains(want), "{want:?} in\n{got}");
    }
    // One range element out of each four-field set: element deletes only.
    let mut t2 = t.clone();
    let gone4 = vec![
        Value::Addr("10.0.1.5".parse().unwrap()),
        Value::Net("10.0.2.0/24".parse().unwrap()),
        Value::Proto(Proto::Tcp),
        Value::PortRange(8000, 8100),
    ];
    let gone6 = vec![
        Value::Addr("fd00::5".parse().unwrap()),
        Value::Net("fd00:2::/64".parse().unwrap()),
        Value::Proto(Proto::Tcp),
        Value::PortRange(8000, 8100),
    ];
    assert!(t2
        .sets
        .get_mut("allow4")
        .unwrap()
        .elements
        .remove(&gone4)
        .is_some());
    assert!(t2
        .sets
        .get_mut("allow6")
        .unwrap()
        .elements
        .remove(&gone6)
        .is_some());
    // One-field ranges whose closing element sits where the next opens.
    let gone_cidr = vec![Value::Net("10.0.0.0/8".parse().unwrap())];
    let gone_ports = vec![Value::PortRange(80, 90)];
    for (set, k) in [("cidr4", &gone_cidr), ("ports", &gone_ports)] {
        assert!(t2.sets.get_mut(set).unwrap().elements.remove(k).is_some());
    }
    let d = diff(Some(&t), &t2);
    let del = |set: &str, k: Vec<Value>| podnet_nft::diff::Change::DelElems {
        set: set.into(),
        keys: vec![k],
    };
    assert_eq!(
        d,
        vec![
            del("allow4", gone4),
            del("allow6", gone6),
            del("cidr4", gone_cidr),
            del("ports", gone_ports),
        ]
    );
    ns.run(|| Conn::open().unwrap().apply(&t2, &d))
        .unwrap()
        .unwrap();
    assert_eq!(observe(&t2).as_ref(), Some(&t2));
    assert_eq!(sync(&t2), vec![]);
    let got = elements_sorted(&list());
    assert!(
        !got.contains("10.0.1.5 . 10.0.2.0/24 . tcp")
            && !got.contains("fd00::5 . fd00:2::/64 . tcp")
            && got.contains("10.0.1.5 . 10.0.3.7 . udp . 53")
            && got.contains("10.0.1.5 . 10.0.2.0/24")
            && got.contains("elements = { 11.0.0.0/8, 192.168.1.1")
            && got.contains("elements = { 22, 65000-65535, 91-100 }"),
        "{got}"
    );
    // And back in: element adds only.
    let d = diff(Some(&t2), &t);
    assert!(
        d.iter()
            .all(|c| matches!(c, podnet_nft::diff::Change::AddElems { .. })),
        "{d:?}"
    );
    assert_eq!(podnet_nft::diff::ops(&d), 4);
    ns.run(|| Conn::open().unwrap().apply(&t, &d))
        .unwrap()
        .unwrap();
    assert_eq!(observe(&t).as_ref(), Some(&t));
    assert!(ns
        .run(|| Conn::open().unwrap().delete_table(Family::Inet, "pnpolicy"))
        .unwrap()
        .unwrap());
}
