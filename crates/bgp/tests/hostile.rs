//! A hostile or broken peer, seen from our speaker: whatever it sends, it
//! gets the NOTIFICATION RFC 4271 §6 names, the connection is closed, and
//! our side says why; nothing else happens (no panic, no stall, the
//! session is tried again later). The "peer" here is the test itself on a
//! TCP listener: it plays an attacker, not a router, so no daemon would do.

mod common;

use std::time::Duration;

use common::raw::{bytes, RawPeer};
use common::{link, next, runtime, session, THEM};
use podnet_bgp::fsm::Config;
use podnet_bgp::peer::{Peer, PeerEvent};
use podnet_bgp::wire::{Afi, Capability, Message, Notification, Open, Safi};
use podnet_testkit::require_root;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// A long connect retry: one connection per case.
fn config() -> Config {
    Config {
        connect_retry: Duration::from_secs(30),
        ..session(64513, vec![(Afi::Ipv4, Safi::Unicast)])
    }
}

/// Our speaker connects; the "peer" completes the handshake, then sends
/// `garbage`. Returns the NOTIFICATION we sent and our Down reason.
async fn after_handshake(garbage: &[u8]) -> (Notification, String) {
    let l = TcpListener::bind(format!("{THEM}:179")).await.unwrap();
    let (tx, mut rx) = mpsc::channel(64);
    let peer = Peer::start(config(), format!("{THEM}:179").parse().unwrap(), tx);
    let mut raw = RawPeer::accept(&l, 64513, THEM.parse().unwrap()).await;
    let none = || String::new();
    loop {
        if let PeerEvent::Up(_) = next(&mut rx, "the session", &none).await {
            break;
        }
    }
    raw.s.write_all(garbage).await.unwrap();
    let n = loop {
        match raw.next().await {
            Some(Message::Notification(n)) => break n,
            Some(_) => {}
            None => panic!("closed with no NOTIFICATION"),
        }
    };
    let why = loop {
        if let PeerEvent::Down(why) = next(&mut rx, "the session going down", &none).await {
            break why;
        }
    };
    // The connection is closed after it.
    assert!(raw.next().await.is_none(), "the connection stayed open");
    peer.stop();
    (n, why)
}

#[test]
fn garbage_from_a_peer_gets_the_notification_rfc_4271_names_and_a_closed_connection() {
    require_root();
    // The listener and our speaker share one namespace (the speaker dials
    // the listener's address there): what is tested is the speaker's
    // answer, not the path.
    let (_us, them) = link("bgp-hostile");
    let keepalive = bytes(&Message::Keepalive);
    let cases: Vec<(&str, Vec<u8>, (u8, u8))> = vec![
        (
            "a broken marker",
            {
                let mut k = keepalive.clone();
                k[3] = 0;
                k
            },
            (1, 1),
        ),
        (
            "a length beyond 4096",
            {
                let mut k = keepalive.clone();
                k[16..18].copy_from_slice(&5000u16.to_be_bytes());
                k
            },
            (1, 2),
        ),
        (
            "an unknown type",
            {
                let mut k = keepalive.clone();
                k[18] = 99;
                k
            },
            (1, 3),
        ),
        ("a second OPEN", Vec::new(), (5, 3)),
    ];
    for (what, mut garbage, want) in cases {
        if garbage.is_empty() {
            garbage = bytes(&Message::Open(Open {
                asn: 64513,
                hold_time: 9,
                router_id: THEM.parse().unwrap(),
                capabilities: vec![Capability::FourOctetAs(64513)],
            }));
        }
        let (n, why) = them.run(|| runtime().block_on(after_handshake(&garbage)));
        assert_eq!((n.code, n.subcode), want, "{what}: {n:?}");
        assert!(why.contains("sent NOTIFICATION"), "{what}: {why}");
    }
}
