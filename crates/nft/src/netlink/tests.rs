//! Round trips between the encoder and the decoder without a kernel:
//! keys and ranges laid out and read back, and the expressions rules are
//! made of (the kernel tests in `tests/netlink.rs` check what it accepts).

use podnet_kernel::nl::{get_str, Attrs};

use super::decode::{decode_key, decode_value, pair_bounds};
use super::expr::{prefix_mask, rule_msg};
use super::layout::{
    be32, before, comment_from_udata, comment_udata, elem_key_bytes, interval_end_key, key_bytes,
    key_end_bytes, set_key_len, value_bytes,
};
use super::shape::rule_shape;
use crate::model::{Expr, Family, Field, KeyType, Proto, Rule, Set, Table, Value, Verdict};

#[test]
fn keys_are_padded_per_field() {
    let k = key_bytes(&[
        Value::Addr("10.96.0.1".parse().unwrap()),
        Value::Proto(crate::model::Proto::Tcp),
        Value::Port(443),
    ]);
    assert_eq!(k, vec![10, 96, 0, 1, 6, 0, 0, 0, 1, 187, 0, 0]);
    assert_eq!(prefix_mask(20, 4), vec![255, 255, 240, 0]);
    assert_eq!(prefix_mask(0, 4), vec![0, 0, 0, 0]);
}

#[test]
fn keys_and_ranges_decode_back() {
    let types = [KeyType::Ipv4Addr, KeyType::Ipv4Addr];
    let k = vec![
        Value::Addr("10.1.0.2".parse().unwrap()),
        Value::Net("10.1.0.0/24".parse().unwrap()),
    ];
    let (start, end) = (key_bytes(&k), key_end_bytes(&k));
    assert_eq!(&end[4..], &[10, 1, 0, 255]);
    assert_eq!(decode_key(&types, &start, Some(&end)), Some(k));
    let types = [KeyType::IfName, KeyType::EtherAddr];
    let k = vec![Value::Name("veth1".into()), Value::Mac([2, 0, 0, 0, 0, 1])];
    assert_eq!(key_bytes(&k).len(), 24);
    assert_eq!(decode_key(&types, &key_bytes(&k), None), Some(k));
    let v6 = vec![Value::Net("fd00::/64".parse().unwrap())];
    assert_eq!(
        decode_key(
            &[KeyType::Ipv6Addr],
            &key_bytes(&v6),
            Some(&key_end_bytes(&v6))
        ),
        Some(v6)
    );
    assert_eq!(
        comment_from_udata(&comment_udata("n/ctr")).as_deref(),
        Some("n/ctr")
    );
}

#[test]
fn policy_ranges_encode_per_field_and_decode_canonically() {
    // pod . peer prefix . proto . port range: each field padded to four
    // bytes, a single value the range [x, x].
    let types = [
        KeyType::Ipv4Addr,
        KeyType::Ipv4Addr,
        KeyType::InetProto,
        KeyType::InetService,
    ];
    let k = vec![
        Value::Addr("10.0.1.5".parse().unwrap()),
        Value::Net("10.2.0.0/16".parse().unwrap()),
        Value::Proto(Proto::Tcp),
        Value::PortRange(80, 90),
    ];
    assert_eq!(
        key_bytes(&k),
        [10, 0, 1, 5, 10, 2, 0, 0, 6, 0, 0, 0, 0, 80, 0, 0]
    );
    assert_eq!(
        key_end_bytes(&k),
        [10, 0, 1, 5, 10, 2, 255, 255, 6, 0, 0, 0, 0, 90, 0, 0]
    );
    assert_eq!(
        decode_key(&types, &key_bytes(&k), Some(&key_end_bytes(&k))),
        Some(k)
    );
    // Exact values read back as Addr and Port, however they were spelled.
    let exact = vec![
        Value::Addr("10.0.1.5".parse().unwrap()),
        Value::Net("10.2.0.5/32".parse().unwrap()),
        Value::Proto(Proto::Udp),
        Value::PortRange(53, 53),
    ];
    let canonical: Vec<Value> = exact.iter().map(Value::canonical).collect();
    assert_eq!(
        canonical[1..],
        [
            Value::Addr("10.2.0.5".parse().unwrap()),
            Value::Proto(Proto::Udp),
            Value::Port(53)
        ]
    );
    assert_eq!(key_bytes(&exact), key_bytes(&canonical));
    assert_eq!(key_end_bytes(&exact), key_end_bytes(&canonical));
    assert_eq!(
        decode_key(&types, &key_bytes(&exact), Some(&key_end_bytes(&exact))),
        Some(canonical)
    );
    // IPv6: 16-byte fields, the same rules.
    let types6 = [
        KeyType::Ipv6Addr,
        KeyType::Ipv6Addr,
        KeyType::InetProto,
        KeyType::InetService,
    ];
    let k6 = vec![
        Value::Addr("fd00::5".parse().unwrap()),
        Value::Net("fd00:2::/64".parse().unwrap()),
        Value::Proto(Proto::Sctp),
        Value::Port(9000),
    ];
    let (start, end) = (key_bytes(&k6), key_end_bytes(&k6));
    assert_eq!((start.len(), end.len()), (40, 40));
    assert_eq!(&end[24..32], &[0xff; 8]);
    assert_eq!(&end[32..], &[132, 0, 0, 0, 0x23, 0x28, 0, 0]);
    assert_eq!(decode_key(&types6, &start, Some(&end)), Some(k6));
}

#[test]
fn one_field_ranges_are_element_pairs() {
    let ports = [KeyType::InetService];
    // 22, 80-90 and 91-100 (adjacent), 65000 up to the end; as the
    // kernel dumps them (descending), with nft's closing element at 0.
    let b = |key: &[u8], closes: bool| (key.to_vec(), closes, None, None);
    let bounds = vec![
        b(&[0xfd, 0xe8], false),
        b(&[0, 101], true),
        b(&[0, 91], false),
        b(&[0, 91], true),
        b(&[0, 80], false),
        b(&[0, 23], true),
        b(&[0, 22], false),
        b(&[0, 0], true),
    ];
    let keys: Vec<Vec<Value>> = pair_bounds(&ports, bounds)
        .into_iter()
        .map(|(k, ..)| k)
        .collect();
    assert_eq!(
        keys,
        [
            vec![Value::Port(22)],
            vec![Value::PortRange(80, 90)],
            vec![Value::PortRange(91, 100)],
            vec![Value::PortRange(65000, 65535)],
        ]
    );
    // What the encoder sends for them: the closing key is the value
    // after the last, none for a range that runs to the end.
    assert_eq!(interval_end_key(&[Value::Port(22)]), Some(vec![0, 23]));
    assert_eq!(
        interval_end_key(&[Value::PortRange(80, 90)]),
        Some(vec![0, 91])
    );
    assert_eq!(interval_end_key(&[Value::PortRange(65000, 65535)]), None);
    assert_eq!(
        interval_end_key(&[Value::Net("10.255.0.0/16".parse().unwrap())]),
        Some(vec![11, 0, 0, 0])
    );
    assert_eq!(before(&[11, 0, 0, 0]), Some(vec![10, 255, 255, 255]));
    assert_eq!(before(&[0, 0]), None);
    // A one-field key is as long as its field, as nft declares it.
    assert_eq!(set_key_len(&ports), 2);
    assert_eq!(elem_key_bytes(&[Value::Port(80)]), [0, 80]);
    assert_eq!(set_key_len(&[KeyType::InetProto, KeyType::InetService]), 8);
    let nets = pair_bounds(
        &[KeyType::Ipv4Addr],
        vec![
            b(&[0, 0, 0, 0], false),
            b(&[128, 0, 0, 0], true),
            b(&[192, 168, 1, 1], false),
            b(&[192, 168, 1, 2], true),
        ],
    );
    assert_eq!(
        nets.into_iter().map(|(k, ..)| k).collect::<Vec<_>>(),
        [
            vec![Value::Net("0.0.0.0/1".parse().unwrap())],
            vec![Value::Addr("192.168.1.1".parse().unwrap())],
        ]
    );
}

#[test]
fn log_and_limit_are_their_kernel_expressions() {
    let t = Table::new(Family::Ip, "x");
    let r = Rule::new(vec![
        Expr::Limit {
            rate: 10,
            burst: 5,
            over: true,
        },
        Expr::Log {
            group: 3,
            prefix: "np".into(),
        },
        Expr::Cmp {
            field: Field::Dport,
            neg: true,
            value: Value::PortRange(80, 90),
        },
    ]);
    assert_eq!(
        rule_shape(&t, "c", &r).exprs,
        ["limit", "log", "payload", "range"]
    );
}

#[test]
fn inet_rules_check_the_family_once() {
    let mut t = Table::new(Family::Inet, "x");
    t.sets.insert("s".into(), Set::new(vec![KeyType::Ipv4Addr]));
    let r = Rule::new(vec![
        Expr::InSet {
            keys: vec![Field::IpSaddr],
            set: "s".into(),
            neg: false,
        },
        Expr::Cmp {
            field: Field::IpDaddr,
            neg: true,
            value: Value::Net("224.0.0.0/4".parse().unwrap()),
        },
        Expr::Masquerade {
            fully_random: false,
        },
    ]);
    let shape = rule_shape(&t, "c", &r).exprs;
    assert_eq!(
        shape,
        ["meta", "cmp", "payload", "lookup", "payload", "bitwise", "cmp", "masq"]
    );
    t.family = Family::Ip;
    assert_eq!(rule_shape(&t, "c", &r).exprs[0], "payload");
}

/// Each payload load of a rule as (base, offset, len), and each meta
/// load's key.
fn loads(t: &Table, r: &Rule) -> Vec<(String, Vec<u32>)> {
    let bytes = rule_msg(t, "c", r).finish(0);
    let mut out = Vec::new();
    for (ty, v) in Attrs::new(&bytes[20..]) {
        if ty != 4 {
            continue;
        }
        for (_, e) in Attrs::new(v) {
            let mut name = String::new();
            let mut vals = Vec::new();
            for (et, ev) in Attrs::new(e) {
                match et {
                    1 => name = get_str(ev),
                    2 => {
                        for (at, av) in Attrs::new(ev) {
                            let keep = match name.as_str() {
                                "payload" => (2..=4).contains(&at),
                                "meta" => at == 2,
                                _ => false,
                            };
                            if keep {
                                vals.push(be32(av));
                            }
                        }
                    }
                    _ => {}
                }
            }
            if name == "payload" || name == "meta" {
                out.push((name, vals));
            }
        }
    }
    out
}

#[test]
fn bridge_fields_load_their_headers() {
    let mut t = Table::new(Family::Bridge, "x");
    let types = vec![KeyType::IfName, KeyType::EtherAddr, KeyType::Ipv4Addr];
    t.sets.insert("arp".into(), Set::new(types));
    let r = Rule::new(vec![
        Expr::Cmp {
            field: Field::IifGroup,
            neg: true,
            value: Value::U32(0x706e),
        },
        Expr::Cmp {
            field: Field::EtherType,
            neg: false,
            value: Value::U16(0x0806),
        },
        Expr::InSet {
            keys: vec![Field::IifName, Field::ArpSha, Field::ArpSpa],
            set: "arp".into(),
            neg: false,
        },
        Expr::Cmp {
            field: Field::Icmp6Type,
            neg: false,
            value: Value::U8(136),
        },
        Expr::Cmp {
            field: Field::NdTarget,
            neg: false,
            value: Value::Addr("fd00::1".parse().unwrap()),
        },
    ]);
    let p = |v: &[u32]| ("payload".to_string(), v.to_vec());
    let m = |k: u32| ("meta".to_string(), vec![k]);
    assert_eq!(
        loads(&t, &r),
        [
            m(21),
            p(&[0, 12, 2]),
            m(6),
            p(&[1, 8, 6]),
            p(&[1, 14, 4]),
            p(&[2, 0, 1]),
            p(&[2, 8, 16])
        ]
    );
    assert_eq!(value_bytes(&Value::U16(0x86dd)), [0x86, 0xdd]);
    assert_eq!(
        decode_value(KeyType::EtherType, &[0x08, 0x06], None),
        Some(Value::U16(0x0806))
    );
    let invalid = Rule::new(vec![Expr::CtStateInvalid, Expr::Verdict(Verdict::Drop)]);
    assert_eq!(
        rule_shape(&t, "c", &invalid).exprs,
        ["ct", "bitwise", "cmp", "immediate"]
    );
}
