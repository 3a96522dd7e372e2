//! The codec against hand-made byte vectors (from the RFCs' layouts),
//! round trips of every message and attribute, each RFC 4271 §6 error as
//! its NOTIFICATION, and packing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net};

use super::*;

const C2: Codec = Codec {
    four_octet_as: false,
};
const C4: Codec = Codec {
    four_octet_as: true,
};

/// Bytes from hex, spaces ignored.
fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A whole message: marker, length, type, body.
fn msg(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![0xff; 16];
    m.extend_from_slice(&((19 + body.len()) as u16).to_be_bytes());
    m.push(kind);
    m.extend_from_slice(body);
    m
}

fn update_msg(withdrawn: &[u8], attrs: &[u8], nlri: &[u8]) -> Vec<u8> {
    let mut b = (withdrawn.len() as u16).to_be_bytes().to_vec();
    b.extend_from_slice(withdrawn);
    b.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
    b.extend_from_slice(attrs);
    b.extend_from_slice(nlri);
    msg(2, &b)
}

/// An OPEN with AS 65000, hold 90, id 10.0.0.1 and these raw parameters
/// (their length byte included), after the given version.
fn open_msg(version: u8, my_as: u16, hold: u16, id: [u8; 4], params: &[u8]) -> Vec<u8> {
    let mut b = vec![version];
    b.extend_from_slice(&my_as.to_be_bytes());
    b.extend_from_slice(&hold.to_be_bytes());
    b.extend_from_slice(&id);
    b.extend_from_slice(params);
    msg(1, &b)
}

const ORIGIN_IGP: [u8; 4] = [0x40, 1, 1, 0];
const AS_PATH_65001: [u8; 9] = [0x40, 2, 6, 2, 1, 0, 0, 0xfd, 0xe9];
const NEXT_HOP: [u8; 7] = [0x40, 3, 4, 192, 168, 1, 2];
const NLRI_10_244_1: [u8; 4] = [24, 10, 244, 1];

fn attrs3(extra: &[u8]) -> Vec<u8> {
    [&ORIGIN_IGP[..], &AS_PATH_65001, &NEXT_HOP, extra].concat()
}

fn v4(s: &str) -> Ipv4Net {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn encode(c: &Codec, m: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    c.encode(m, &mut out).unwrap();
    out
}

fn decode(c: &Codec, b: &[u8]) -> Message {
    let (m, n) = c.decode(b).unwrap().expect("a whole message");
    assert_eq!(n, b.len());
    m
}

fn decode_err(c: &Codec, b: &[u8]) -> DecodeError {
    match c.decode(b) {
        Err(e) => e,
        Ok(m) => panic!("decoded {m:?}"),
    }
}

fn round_trip(c: &Codec, m: &Message) {
    let bytes = encode(c, m);
    assert!(bytes.len() <= MAX_LEN);
    assert_eq!(&decode(c, &bytes), m, "bytes {bytes:02x?}");
}

fn path(asns: &[u32]) -> Vec<AsSegment> {
    vec![AsSegment::Sequence(asns.to_vec())]
}

fn route_attrs() -> PathAttrs {
    PathAttrs {
        origin: Some(Origin::Igp),
        as_path: path(&[65001]),
        next_hop: Some(Ipv4Addr::new(192, 168, 1, 2)),
        ..PathAttrs::default()
    }
}

/// Every attribute at once, MP_REACH_NLRI with two next hops.
fn all_attrs() -> PathAttrs {
    PathAttrs {
        origin: Some(Origin::Incomplete),
        as_path: vec![
            AsSegment::Sequence(vec![65001, 4_200_000_000, 7]),
            AsSegment::Set(vec![1, 2, 3]),
        ],
        next_hop: Some(Ipv4Addr::new(10, 0, 0, 1)),
        med: Some(50),
        local_pref: Some(200),
        atomic_aggregate: true,
        aggregator: Some((65010, Ipv4Addr::new(10, 9, 9, 9))),
        communities: vec![0xfde8_0001, 0xffff_ff01],
        large_communities: vec![(4_200_000_000, 1, 2), (65000, 3, 4)],
        originator_id: Some(Ipv4Addr::new(10, 1, 1, 1)),
        cluster_list: vec![Ipv4Addr::new(10, 2, 2, 2), Ipv4Addr::new(10, 3, 3, 3)],
        mp_reach: Some(MpReach {
            afi: Afi::Ipv6,
            safi: Safi::Unicast,
            next_hops: vec!["fd00::2".parse().unwrap(), "fe80::1".parse().unwrap()],
            nlri: vec![net("fd00:244:1::/64"), net("::/0"), net("2001:db8::1/128")],
        }),
        mp_unreach: Some(MpUnreach {
            afi: Afi::Ipv6,
            safi: Safi::Unicast,
            withdrawn: vec![net("fd00:244:2::/64")],
        }),
        other: vec![RawAttr {
            flags: 0xe0,
            code: 99,
            value: vec![1, 2, 3],
        }],
    }
}

fn sample_open() -> Open {
    Open {
        asn: 65000,
        hold_time: 90,
        router_id: Ipv4Addr::new(10, 0, 0, 1),
        capabilities: vec![
            Capability::Multiprotocol(Afi::Ipv4, Safi::Unicast),
            Capability::RouteRefresh,
            Capability::FourOctetAs(65000),
        ],
    }
}

/// A message of each kind and shape, for round trips and the fuzzer.
pub(super) fn samples() -> Vec<Message> {
    let mut big_open = sample_open();
    big_open.asn = 4_200_000_000;
    big_open.capabilities = vec![
        Capability::Multiprotocol(Afi::Ipv6, Safi::Unicast),
        Capability::EnhancedRouteRefresh,
        Capability::FourOctetAs(4_200_000_000),
        Capability::GracefulRestart(GracefulRestart {
            restarting: true,
            notification: true,
            time: 120,
            families: vec![
                (Afi::Ipv4, Safi::Unicast, true),
                (Afi::Ipv6, Safi::Unicast, false),
            ],
        }),
        Capability::Unknown {
            code: 73,
            value: b"node-1".to_vec(),
        },
        Capability::Unknown {
            code: 1,
            value: vec![0, 25, 0, 70],
        },
    ];
    vec![
        Message::Keepalive,
        Message::Open(sample_open()),
        Message::Open(big_open),
        Message::Update(Update {
            withdrawn: vec![v4("10.244.9.0/24"), v4("0.0.0.0/0")],
            attrs: route_attrs(),
            nlri: vec![v4("10.244.1.0/24"), v4("10.96.0.10/32")],
        }),
        Message::Update(Update {
            withdrawn: vec![],
            attrs: all_attrs(),
            nlri: vec![v4("10.244.2.0/23")],
        }),
        Message::Update(Update::end_of_rib(Afi::Ipv4)),
        Message::Update(Update::end_of_rib(Afi::Ipv6)),
        Message::Notification(Notification {
            code: 6,
            subcode: 2,
            data: b"\x05bye!".to_vec(),
        }),
        Message::RouteRefresh(RouteRefresh {
            afi: Afi::Ipv6,
            safi: Safi::Unicast,
            subtype: 1,
        }),
    ]
}

#[test]
fn every_sample_round_trips_with_either_as_size() {
    for m in samples() {
        round_trip(&C4, &m);
        if !matches!(&m, Message::Update(u) if u.attrs == all_attrs()) {
            round_trip(&C2, &m);
        }
    }
}

#[test]
fn keepalive_bytes() {
    let b = hex("ffffffffffffffffffffffffffffffff 0013 04");
    assert_eq!(encode(&C2, &Message::Keepalive), b);
    assert_eq!(decode(&C2, &b), Message::Keepalive);
}

#[test]
fn open_bytes() {
    let b = hex("ffffffffffffffffffffffffffffffff 002d 01
         04 fde8 005a 0a000001 10
         02 0e 01040001 0001 0200 4104 0000fde8");
    let m = Message::Open(sample_open());
    assert_eq!(encode(&C2, &m), b);
    assert_eq!(decode(&C2, &b), m);
}

#[test]
fn open_with_a_four_octet_as_sends_as_trans() {
    let mut o = sample_open();
    o.asn = 4_200_000_000;
    o.capabilities = vec![Capability::FourOctetAs(o.asn)];
    let b = encode(&C2, &Message::Open(o.clone()));
    assert_eq!(b[20..22], AS_TRANS.to_be_bytes());
    assert_eq!(b[22..24], [0, 90]);
    let Message::Open(back) = decode(&C2, &b) else {
        panic!()
    };
    assert_eq!(back.peer_asn(), 4_200_000_000);
    assert_eq!(back, o);
}

#[test]
fn peer_asn_falls_back_to_the_two_octet_field() {
    let b = open_msg(4, 65123, 0, [1, 1, 1, 1], &[0]);
    let Message::Open(o) = decode(&C2, &b) else {
        panic!()
    };
    assert_eq!((o.asn, o.peer_asn(), o.hold_time), (65123, 65123, 0));
    assert!(o.capabilities.is_empty());
}

#[test]
fn open_capabilities_over_several_parameters() {
    // Two parameters of one capability each, as some routers send them.
    let params = hex("0c 02 06 01040002 0001 02 02 4600");
    let b = open_msg(4, 65000, 180, [10, 0, 0, 1], &params);
    let Message::Open(o) = decode(&C2, &b) else {
        panic!()
    };
    assert_eq!(
        o.capabilities,
        vec![
            Capability::Multiprotocol(Afi::Ipv6, Safi::Unicast),
            Capability::EnhancedRouteRefresh
        ]
    );
}

#[test]
fn open_capabilities_over_255_bytes_use_extended_parameters() {
    let mut o = sample_open();
    for code in 128..131 {
        o.capabilities.push(Capability::Unknown {
            code,
            value: vec![code; 100],
        });
    }
    let b = encode(&C2, &Message::Open(o.clone()));
    assert_eq!(b[28..30], [255, 255], "RFC 9072 marker");
    assert_eq!(decode(&C2, &b), Message::Open(o));
}

#[test]
fn graceful_restart_bytes() {
    let gr = GracefulRestart {
        restarting: true,
        notification: false,
        time: 0x123,
        families: vec![(Afi::Ipv6, Safi::Unicast, true)],
    };
    let mut o = sample_open();
    o.capabilities = vec![Capability::GracefulRestart(gr)];
    let b = encode(&C2, &Message::Open(o.clone()));
    assert_eq!(b[28..], hex("0a 02 08 40 06 8123 0002 01 80"));
    // A family not carried here is left out on decode.
    let mut b2 = open_msg(
        4,
        65000,
        90,
        [10, 0, 0, 1],
        &hex("0e 02 0c 40 0a 8123 0002 01 80 0019 46 00"),
    );
    assert_eq!(decode(&C2, &b2), Message::Open(o));
    b2[32] = 0x09; // 2 bytes and 7: not whole families

    assert!(matches!(
        decode_err(&C2, &b2),
        DecodeError {
            code: 2,
            subcode: 0,
            ..
        }
    ));
}

#[test]
fn update_bytes() {
    let b = hex("ffffffffffffffffffffffffffffffff 002f 02
         0000 0014
         40 01 01 00
         40 02 06 02 01 0000fde9
         40 03 04 c0a80102
         18 0af401");
    let m = Message::Update(Update {
        withdrawn: vec![],
        attrs: route_attrs(),
        nlri: vec![v4("10.244.1.0/24")],
    });
    assert_eq!(encode(&C4, &m), b);
    assert_eq!(decode(&C4, &b), m);
    assert_eq!(b, update_msg(&[], &attrs3(&[]), &NLRI_10_244_1));
}

#[test]
fn ipv6_mp_reach_bytes() {
    let b = hex("ffffffffffffffffffffffffffffffff 0045 02
         0000 002e
         40 01 01 00
         40 02 06 02 01 0000fde9
         80 0e 1e 0002 01 10 fd000000000000000000000000000002 00
            40 fd00024400010000");
    let m = Message::Update(Update {
        withdrawn: vec![],
        attrs: PathAttrs {
            origin: Some(Origin::Igp),
            as_path: path(&[65001]),
            mp_reach: Some(MpReach {
                afi: Afi::Ipv6,
                safi: Safi::Unicast,
                next_hops: vec!["fd00::2".parse().unwrap()],
                nlri: vec![net("fd00:244:1::/64")],
            }),
            ..PathAttrs::default()
        },
        nlri: vec![],
    });
    assert_eq!(encode(&C4, &m), b);
    assert_eq!(decode(&C4, &b), m);
}

/// Adds attribute `attr` (its whole TLV) at the end of an encoded
/// UPDATE's attributes, its lengths updated: what a peer could send that
/// our encoder never writes.
fn append_attribute(b: &mut Vec<u8>, attr: &[u8]) {
    let at = |b: &[u8], i: usize| usize::from(u16::from_be_bytes([b[i], b[i + 1]]));
    let withdrawn = at(b, 19);
    let total_at = 19 + 2 + withdrawn;
    let total = at(b, total_at);
    let end = total_at + 2 + total;
    b.splice(end..end, attr.iter().copied());
    let total = u16::try_from(total + attr.len()).unwrap();
    b[total_at..total_at + 2].copy_from_slice(&total.to_be_bytes());
    let len = u16::try_from(b.len()).unwrap();
    b[16..18].copy_from_slice(&len.to_be_bytes());
}

#[test]
fn two_octet_paths_carry_large_ases_in_as4_path() {
    let mut attrs = route_attrs();
    attrs.as_path = path(&[65001, 4_200_000_000]);
    attrs.aggregator = Some((4_200_000_000, Ipv4Addr::new(1, 2, 3, 4)));
    let m = Message::Update(Update {
        attrs: attrs.clone(),
        nlri: vec![v4("10.0.0.0/8")],
        ..Update::default()
    });
    let b = encode(&C2, &m);
    let as_path = hex("40 02 06 02 02 fde9 5ba0");
    let as4_path = hex("c0 11 0a 02 02 0000fde9 fa56ea00");
    let aggregator = hex("c0 07 06 5ba0 01020304");
    let as4_aggregator = hex("c0 12 08 fa56ea00 01020304");
    for part in [as_path, as4_path, aggregator, as4_aggregator] {
        assert!(
            b.windows(part.len()).any(|w| w == part),
            "{part:02x?} in {b:02x?}"
        );
    }
    // Decoded from a 2-octet peer, the path and the aggregator are
    // rebuilt from AS4_PATH and AS4_AGGREGATOR (RFC 6793 §4.2.3).
    let Message::Update(back) = decode(&C2, &b) else {
        panic!()
    };
    assert_eq!(back.attrs, attrs);
    // From a 4-octet peer, the same attributes are ignored: AS_TRANS
    // stays where a 4-octet path has it.
    let mut trans = attrs.clone();
    trans.as_path = path(&[65001, 23456]);
    trans.aggregator = Some((23456, Ipv4Addr::new(1, 2, 3, 4)));
    let m = Message::Update(Update {
        attrs: trans.clone(),
        nlri: vec![v4("10.0.0.0/8")],
        ..Update::default()
    });
    let mut b = encode(&C4, &m);
    let as4_path = hex("c0 11 0a 02 02 0000fde9 fa56ea00");
    append_attribute(&mut b, &as4_path);
    let Message::Update(back) = decode(&C4, &b) else {
        panic!()
    };
    assert_eq!(back.attrs, trans);
}

#[test]
fn long_attributes_use_the_extended_length_flag() {
    let mut attrs = route_attrs();
    attrs.communities = (0..100).collect();
    let m = Message::Update(Update {
        attrs,
        nlri: vec![v4("10.0.0.0/8")],
        ..Update::default()
    });
    let b = encode(&C4, &m);
    let communities = hex("d0 08 0190 00000000 00000001");
    assert!(b.windows(communities.len()).any(|w| w == communities));
    round_trip(&C4, &m);
    // An extended length on a short attribute is accepted too.
    let b = update_msg(&[], &attrs3(&hex("d0 08 0004 0000ffff")), &NLRI_10_244_1);
    let Message::Update(u) = decode(&C4, &b) else {
        panic!()
    };
    assert_eq!(u.attrs.communities, vec![0xffff]);
}

#[test]
fn unknown_attributes_transitive_kept_partial_others_dropped() {
    let extra = hex("c0 63 02 abcd 80 64 01 01");
    let b = update_msg(&[], &attrs3(&extra), &NLRI_10_244_1);
    let Message::Update(u) = decode(&C4, &b) else {
        panic!()
    };
    assert_eq!(
        u.attrs.other,
        vec![RawAttr {
            flags: 0xe0,
            code: 0x63,
            value: vec![0xab, 0xcd]
        }]
    );
}

#[test]
fn host_bits_are_cleared_on_decode_and_encode() {
    let b = update_msg(&[], &attrs3(&[]), &[20, 10, 244, 0xff]);
    let Message::Update(u) = decode(&C4, &b) else {
        panic!()
    };
    assert_eq!(u.nlri, vec![v4("10.244.240.0/20")]);
    let mut u2 = u.clone();
    u2.nlri = vec![v4("10.244.255.255/20")];
    assert_eq!(
        decode(&C4, &encode(&C4, &Message::Update(u2))),
        Message::Update(u)
    );
}

#[test]
fn end_of_rib_both_ways() {
    let v4_eor = hex("ffffffffffffffffffffffffffffffff 0017 02 0000 0000");
    assert_eq!(
        encode(&C4, &Message::Update(Update::end_of_rib(Afi::Ipv4))),
        v4_eor
    );
    let v6_eor = hex("ffffffffffffffffffffffffffffffff 001d 02 0000 0006 80 0f 03 0002 01");
    assert_eq!(
        encode(&C4, &Message::Update(Update::end_of_rib(Afi::Ipv6))),
        v6_eor
    );
    for (b, afi) in [(v4_eor, Afi::Ipv4), (v6_eor, Afi::Ipv6)] {
        let Message::Update(u) = decode(&C4, &b) else {
            panic!()
        };
        assert_eq!(u.is_end_of_rib(), Some(afi));
    }
    let routes = Update {
        nlri: vec![v4("10.0.0.0/8")],
        attrs: route_attrs(),
        ..Update::default()
    };
    assert_eq!(routes.is_end_of_rib(), None);
    let mut withdraw6 = Update::end_of_rib(Afi::Ipv6);
    withdraw6.attrs.mp_unreach.as_mut().unwrap().withdrawn = vec![net("fd00::/64")];
    assert_eq!(withdraw6.is_end_of_rib(), None);
    let mut with_attr = Update::end_of_rib(Afi::Ipv6);
    with_attr.attrs.med = Some(1);
    assert_eq!(with_attr.is_end_of_rib(), None);
}

#[test]
fn route_refresh_bytes_and_the_ones_to_skip() {
    let rr = RouteRefresh {
        afi: Afi::Ipv4,
        safi: Safi::Unicast,
        subtype: 0,
    };
    let b = hex("ffffffffffffffffffffffffffffffff 0017 05 0001 00 01");
    assert_eq!(encode(&C2, &Message::RouteRefresh(rr)), b);
    assert_eq!(decode(&C2, &b), Message::RouteRefresh(rr));
    // An unknown family (RFC 2918 §4) or subtype (RFC 7313 §5) is skipped.
    let skip_family = msg(5, &hex("0019 00 46"));
    let skip_subtype = msg(5, &hex("0001 07 01"));
    let stream = [skip_family, skip_subtype.clone(), b.clone()].concat();
    assert_eq!(
        C2.decode(&stream).unwrap(),
        Some((Message::RouteRefresh(rr), stream.len()))
    );
    assert_eq!(C2.decode(&skip_subtype).unwrap(), None);
}

#[test]
fn partial_buffers_wait_and_streams_split() {
    let a = encode(&C4, &Message::Open(sample_open()));
    let k = encode(&C4, &Message::Keepalive);
    let stream = [a.clone(), k.clone()].concat();
    for n in 0..a.len() {
        assert_eq!(C4.decode(&stream[..n]).unwrap(), None, "{n} bytes");
    }
    let (m, n) = C4.decode(&stream).unwrap().unwrap();
    assert_eq!((m, n), (Message::Open(sample_open()), a.len()));
    assert_eq!(
        C4.decode(&stream[n..]).unwrap(),
        Some((Message::Keepalive, k.len()))
    );
}

#[test]
fn notification_round_trip_and_names() {
    let n = Notification::cease(cease::ADMINISTRATIVE_SHUTDOWN);
    assert_eq!((n.code, n.subcode, n.data.len()), (6, 2, 0));
    let b = encode(&C2, &Message::Notification(n.clone()));
    assert_eq!(b, hex("ffffffffffffffffffffffffffffffff 0015 03 06 02"));
    assert_eq!(decode(&C2, &b), Message::Notification(n.clone()));
    assert_eq!(n.describe(), "Cease/Administrative Shutdown");
    let held = Notification {
        code: HOLD_TIMER_EXPIRED,
        subcode: 0,
        data: vec![],
    };
    assert_eq!(held.describe(), "Hold Timer Expired");
    let with_msg = Notification {
        data: b"\x0bmaintenance".to_vec(),
        ..n
    };
    assert_eq!(
        with_msg.describe(),
        "Cease/Administrative Shutdown: \"maintenance\""
    );
    let odd = |code, subcode| Notification {
        code,
        subcode,
        data: vec![],
    };
    assert_eq!(
        odd(3, 11).describe(),
        "UPDATE Message Error/Malformed AS_PATH"
    );
    assert_eq!(odd(3, 7).describe(), "UPDATE Message Error/subcode 7");
    assert_eq!(odd(2, 0).describe(), "OPEN Message Error");
    assert_eq!(odd(9, 1).describe(), "error code 9/subcode 1");
}

#[test]
fn decode_error_becomes_its_notification() {
    let e = decode_err(&C2, &msg(9, &[]));
    assert_eq!(
        e.notification(),
        Notification {
            code: 1,
            subcode: 3,
            data: vec![9]
        }
    );
    assert_eq!(e.to_string(), "message type 9 is unknown");
}

#[test]
fn encode_errors_leave_the_output_alone() {
    let mut out = vec![1, 2, 3];
    let long = Notification {
        code: 6,
        subcode: 0,
        data: vec![0; MAX_LEN],
    };
    assert_eq!(
        C2.encode(&Message::Notification(long), &mut out),
        Err(EncodeError::TooLong)
    );
    let no_origin = Update {
        nlri: vec![v4("10.0.0.0/8")],
        attrs: PathAttrs {
            next_hop: Some(Ipv4Addr::new(1, 1, 1, 1)),
            ..PathAttrs::default()
        },
        ..Update::default()
    };
    let mut no_next_hop = no_origin.clone();
    no_next_hop.attrs = PathAttrs {
        next_hop: None,
        ..route_attrs()
    };
    let mut bad_hop = Update {
        attrs: all_attrs(),
        ..Update::default()
    };
    bad_hop.attrs.mp_reach.as_mut().unwrap().next_hops = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
    let mut known_raw = Update::default();
    known_raw.attrs.other = vec![RawAttr {
        flags: 0xc0,
        code: 8,
        value: vec![0; 4],
    }];
    for u in [no_origin, no_next_hop, bad_hop, known_raw] {
        let e = C4.encode(&Message::Update(u), &mut out);
        assert!(matches!(e, Err(EncodeError::Invalid(_))), "{e:?}");
    }
    assert_eq!(out, [1, 2, 3]);
}

#[test]
fn long_as_sequences_split_into_segments() {
    let mut attrs = route_attrs();
    attrs.as_path = path(&(1..=300).collect::<Vec<_>>());
    let u = Update {
        attrs,
        nlri: vec![v4("10.0.0.0/8")],
        ..Update::default()
    };
    let Message::Update(back) = decode(&C4, &encode(&C4, &Message::Update(u))) else {
        panic!()
    };
    assert_eq!(
        back.attrs.as_path,
        vec![
            AsSegment::Sequence((1..=255).collect()),
            AsSegment::Sequence((256..=300).collect())
        ]
    );
}

/// (what, message, codec, code, subcode, data if §6 prescribes it).
type Case = (&'static str, Vec<u8>, Codec, u8, u8, Option<Vec<u8>>);

fn header_and_open_cases() -> Vec<Case> {
    let caps = hex("08 02 06 4104 0000fde8");
    let mut bad_marker = encode(&C2, &Message::Keepalive);
    bad_marker[3] = 0xfe;
    let mut short = msg(4, &[]);
    short[17] = 18;
    let mut long = msg(4, &[]);
    long[16..18].copy_from_slice(&4097u16.to_be_bytes());
    let id = [10, 0, 0, 1];
    vec![
        ("bad marker", bad_marker, C2, 1, 1, Some(vec![])),
        ("length 18", short, C2, 1, 2, Some(vec![0, 18])),
        ("length 4097", long, C2, 1, 2, Some(vec![0x10, 0x01])),
        ("long keepalive", msg(4, &[0]), C2, 1, 2, Some(vec![0, 20])),
        ("short open", msg(1, &[4; 9]), C2, 1, 2, Some(vec![0, 28])),
        ("short update", msg(2, &[0; 3]), C2, 1, 2, Some(vec![0, 22])),
        ("type 6", msg(6, &[]), C2, 1, 3, Some(vec![6])),
        (
            "version 3",
            open_msg(3, 65000, 90, id, &caps),
            C2,
            2,
            1,
            Some(vec![0, 4]),
        ),
        ("my AS 0", open_msg(4, 0, 90, id, &[0]), C2, 2, 2, None),
        (
            "4-octet AS 0",
            open_msg(4, 65000, 90, id, &hex("08 02 06 4104 00000000")),
            C2,
            2,
            2,
            None,
        ),
        (
            "id 0",
            open_msg(4, 65000, 90, [0; 4], &caps),
            C2,
            2,
            3,
            None,
        ),
        ("hold 1", open_msg(4, 65000, 1, id, &caps), C2, 2, 6, None),
        ("hold 2", open_msg(4, 65000, 2, id, &caps), C2, 2, 6, None),
        (
            "param type 1",
            open_msg(4, 65000, 90, id, &hex("04 01 02 0000")),
            C2,
            2,
            4,
            None,
        ),
        (
            "params too long",
            open_msg(4, 65000, 90, id, &hex("09 02 06 4104 0000fde8")),
            C2,
            2,
            0,
            None,
        ),
        (
            "capability cut",
            open_msg(4, 65000, 90, id, &hex("04 02 02 4104")),
            C2,
            2,
            0,
            None,
        ),
        (
            "route refresh 5",
            msg(5, &hex("0001 00 01 00")),
            C2,
            1,
            2,
            Some(vec![0, 24]),
        ),
        (
            "BoRR 5",
            msg(5, &hex("0001 01 01 00")),
            C2,
            7,
            1,
            Some(msg(5, &hex("0001 01 01 00"))),
        ),
    ]
}

fn update_cases() -> Vec<Case> {
    let nlri = NLRI_10_244_1;
    let up = |attrs: &[u8]| update_msg(&[], attrs, &nlri);
    let origin_bad_flags = hex("c0 01 01 00");
    let origin_len2 = hex("40 01 02 0000");
    let origin_3 = hex("40 01 01 03");
    let unknown_wk = hex("40 63 01 00");
    let nh_zero = hex("40 03 04 00000000");
    let nh_mcast = hex("40 03 04 e0000001");
    let mp_afi25 = hex("80 0e 09 0019 01 04 01020304 00");
    let med_partial = hex("a0 04 04 00000001");
    let lp_len3 = hex("40 05 03 000001");
    let comm_len5 = hex("c0 08 05 0000000001");
    let p = |a: &[u8], b: &[u8], c: &[u8]| [a, b, c].concat();
    let o = &ORIGIN_IGP[..];
    let a = &AS_PATH_65001[..];
    let n = &NEXT_HOP[..];
    vec![
        (
            "withdrawn past end",
            msg(2, &hex("0010 0000")),
            C4,
            3,
            1,
            Some(vec![]),
        ),
        (
            "attrs past end",
            msg(2, &hex("0000 0009 40010100")),
            C4,
            3,
            1,
            Some(vec![]),
        ),
        (
            "duplicate",
            up(&attrs3(&ORIGIN_IGP)),
            C4,
            3,
            1,
            Some(vec![]),
        ),
        ("cut header", up(&attrs3(&[0x40])), C4, 3, 1, Some(vec![])),
        (
            "unknown well-known",
            up(&attrs3(&unknown_wk)),
            C4,
            3,
            2,
            Some(unknown_wk.clone()),
        ),
        ("no ORIGIN", up(&p(a, n, &[])), C4, 3, 3, Some(vec![1])),
        ("no AS_PATH", up(&p(o, n, &[])), C4, 3, 3, Some(vec![2])),
        ("no NEXT_HOP", up(&p(o, a, &[])), C4, 3, 3, Some(vec![3])),
        (
            "ORIGIN optional",
            up(&p(&origin_bad_flags, a, n)),
            C4,
            3,
            4,
            Some(origin_bad_flags.clone()),
        ),
        (
            "MED partial",
            up(&attrs3(&med_partial)),
            C4,
            3,
            4,
            Some(med_partial.clone()),
        ),
        (
            "ORIGIN of 2",
            up(&p(&origin_len2, a, n)),
            C4,
            3,
            5,
            Some(origin_len2.clone()),
        ),
        (
            "LOCAL_PREF of 3",
            up(&attrs3(&lp_len3)),
            C4,
            3,
            5,
            Some(lp_len3.clone()),
        ),
        (
            "COMMUNITIES of 5",
            up(&attrs3(&comm_len5)),
            C4,
            3,
            5,
            Some(comm_len5.clone()),
        ),
        (
            "value past end",
            up(&attrs3(&hex("c0 08 08 00000001"))),
            C4,
            3,
            5,
            Some(hex("c0 08 08 00000001")),
        ),
        (
            "ORIGIN 3",
            up(&p(&origin_3, a, n)),
            C4,
            3,
            6,
            Some(origin_3.clone()),
        ),
        (
            "NEXT_HOP 0",
            up(&p(o, a, &nh_zero)),
            C4,
            3,
            8,
            Some(nh_zero.clone()),
        ),
        (
            "NEXT_HOP mcast",
            up(&p(o, a, &nh_mcast)),
            C4,
            3,
            8,
            Some(nh_mcast.clone()),
        ),
        (
            "MP AFI 25",
            up(&attrs3(&mp_afi25)),
            C4,
            3,
            9,
            Some(mp_afi25.clone()),
        ),
        (
            "nlri /33",
            update_msg(&[], &attrs3(&[]), &[33, 1, 2, 3, 4, 5]),
            C4,
            3,
            10,
            Some(vec![]),
        ),
        (
            "nlri cut",
            update_msg(&[], &attrs3(&[]), &[24, 10, 244]),
            C4,
            3,
            10,
            Some(vec![]),
        ),
        (
            "withdrawn /40",
            update_msg(&[40, 1, 2, 3, 4, 5], &[], &[]),
            C4,
            3,
            10,
            Some(vec![]),
        ),
        (
            "mp /129",
            up(&attrs3(&hex("80 0f 04 0002 01 81"))),
            C4,
            3,
            10,
            Some(vec![]),
        ),
        (
            "AS_CONFED_SEQUENCE",
            up(&p(o, &hex("40 02 06 03 01 0000fde9"), n)),
            C4,
            3,
            11,
            Some(vec![]),
        ),
        (
            "segment past end",
            up(&p(o, &hex("40 02 06 02 02 0000fde9"), n)),
            C4,
            3,
            11,
            Some(vec![]),
        ),
        (
            "2-octet path read as 4",
            up(&p(o, &hex("40 02 04 02 01 fde9"), n)),
            C4,
            3,
            11,
            Some(vec![]),
        ),
        (
            "empty segment",
            up(&p(o, &hex("40 02 02 02 00"), n)),
            C2,
            3,
            11,
            Some(vec![]),
        ),
    ]
}

#[test]
fn each_error_decodes_to_its_notification() {
    for (what, bytes, codec, code, subcode, data) in
        header_and_open_cases().into_iter().chain(update_cases())
    {
        let e = decode_err(&codec, &bytes);
        assert_eq!((e.code, e.subcode), (code, subcode), "{what}: {e}");
        if let Some(data) = data {
            assert_eq!(e.data, data, "{what}: data");
        }
    }
}

#[test]
fn hold_time_zero_and_three_are_fine() {
    for hold in [0, 3] {
        let b = open_msg(4, 65000, hold, [10, 0, 0, 1], &[0]);
        assert!(matches!(decode(&C2, &b), Message::Open(o) if o.hold_time == hold));
    }
}

/// Encodes every update, checks each fits, and returns the prefixes
/// they carry in order.
fn carried(codec: &Codec, updates: &[Update]) -> Vec<IpNet> {
    let mut all = Vec::new();
    for u in updates {
        let b = encode(codec, &Message::Update(u.clone()));
        assert!(b.len() <= MAX_LEN, "{} bytes", b.len());
        assert_eq!(decode(codec, &b), Message::Update(u.clone()));
        all.extend(u.nlri.iter().chain(&u.withdrawn).map(|n| IpNet::V4(*n)));
        all.extend(u.attrs.mp_reach.iter().flat_map(|m| m.nlri.clone()));
        all.extend(u.attrs.mp_unreach.iter().flat_map(|m| m.withdrawn.clone()));
    }
    all
}

fn hosts_v4(n: u32) -> Vec<IpNet> {
    (0..n)
        .map(|i| IpNet::V4(Ipv4Net::new(Ipv4Addr::from(0x0a00_0000 + i), 32).unwrap()))
        .collect()
}

#[test]
fn pack_splits_2000_ipv4_routes() {
    let prefixes = hosts_v4(2000);
    let mut attrs = all_attrs();
    attrs.mp_unreach = None;
    let updates = pack(&C4, &attrs, Afi::Ipv4, &prefixes);
    assert!(updates.len() >= 3, "{} messages", updates.len());
    assert!(updates.iter().all(|u| u.attrs.mp_reach.is_none()));
    assert_eq!(carried(&C4, &updates), prefixes);
    // Nearly full: each but the last would overflow with one more /32.
    for u in &updates[..updates.len() - 1] {
        assert!(encode(&C4, &Message::Update(u.clone())).len() + 5 >= MAX_LEN);
    }
}

#[test]
fn pack_splits_2000_ipv6_routes() {
    let prefixes: Vec<IpNet> = (0..2000u128)
        .map(|i| {
            IpNet::V6(ipnet::Ipv6Net::new(Ipv6Addr::from((0xfd00u128 << 112) + i), 128).unwrap())
        })
        .collect();
    let mixed: Vec<IpNet> = prefixes.iter().copied().chain(hosts_v4(3)).collect();
    let mut attrs = all_attrs();
    attrs.mp_reach.as_mut().unwrap().nlri.clear();
    attrs.as_path = path(&[65001, 65002]);
    let updates = pack(&C2, &attrs, Afi::Ipv6, &mixed);
    assert!(updates.len() >= 9, "{} messages", updates.len());
    assert!(updates
        .iter()
        .all(|u| u.attrs.next_hop.is_none() && u.nlri.is_empty()));
    assert_eq!(carried(&C2, &updates), prefixes);
}

#[test]
fn pack_withdrawals_both_families() {
    let v4s = hosts_v4(2000);
    let updates = pack_withdrawals(&C4, Afi::Ipv4, &v4s);
    assert!(updates.len() >= 3);
    assert_eq!(carried(&C4, &updates), v4s);
    let v6s: Vec<IpNet> = (0..1000u128)
        .map(|i| IpNet::V6(ipnet::Ipv6Net::new(Ipv6Addr::from(i << 64), 64).unwrap()))
        .collect();
    let updates = pack_withdrawals(&C4, Afi::Ipv6, &v6s);
    assert!(updates.len() >= 3);
    assert!(updates.iter().all(|u| u.is_end_of_rib().is_none()));
    assert_eq!(carried(&C4, &updates), v6s);
    assert!(pack_withdrawals(&C4, Afi::Ipv6, &[]).is_empty());
}
