//! A change costs what changed: our session towards a peer that holds
//! 20,000 of our routes sends, for one prefix changed, one UPDATE with
//! that prefix and nothing else; for one withdrawn, one UPDATE that
//! withdraws it; for a route set to what the peer already holds, nothing.
//! The "peer" is the test on a loopback socket, reading every message.

mod common;

use std::time::Duration;

use common::raw::RawPeer;
use common::{runtime, session, US};
use ipnet::{IpNet, Ipv4Net};
use podnet_bgp::fsm::Config;
use podnet_bgp::peer::Peer;
use podnet_bgp::wire::{Afi, AsSegment, Origin, PathAttrs, Safi};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const ROUTES: u32 = 20_000;

fn net(i: u32) -> Ipv4Net {
    Ipv4Net::new(std::net::Ipv4Addr::from(0x0a80_0000 + (i << 8)), 24).unwrap()
}

fn attrs(med: u32) -> PathAttrs {
    PathAttrs {
        origin: Some(Origin::Igp),
        as_path: vec![AsSegment::Sequence(vec![64512])],
        next_hop: Some(US.parse().unwrap()),
        med: Some(med),
        ..Default::default()
    }
}

#[test]
fn one_prefix_changed_among_many_is_one_update_of_that_prefix() {
    runtime().block_on(async {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (tx, _rx) = mpsc::channel(64);
        let cfg = Config {
            connect_retry: Duration::from_secs(30),
            ..session(64513, vec![(Afi::Ipv4, Safi::Unicast)])
        };
        let peer = Peer::start(cfg, l.local_addr().unwrap(), tx);
        peer.update(
            (0..ROUTES)
                .map(|i| (IpNet::V4(net(i)), Some(attrs(0))))
                .collect(),
        );
        let mut raw = RawPeer::accept(&l, 64513, "10.99.0.2".parse().unwrap()).await;
        // The whole table when the session comes up, packed, then
        // End-of-RIB.
        let (mut updates, mut prefixes) = (0, 0);
        loop {
            let u = raw.update().await;
            if u.is_end_of_rib() == Some(Afi::Ipv4) {
                break;
            }
            updates += 1;
            prefixes += u.nlri.len();
        }
        assert_eq!(prefixes, ROUTES as usize);
        assert!(updates <= 25, "{updates} UPDATEs for {ROUTES} routes");

        // One changed: one UPDATE, that prefix alone, its new MED.
        peer.update(vec![(IpNet::V4(net(7)), Some(attrs(5)))]);
        let u = raw.update().await;
        assert_eq!((u.nlri, u.withdrawn), (vec![net(7)], vec![]));
        assert_eq!(u.attrs.med, Some(5));

        // One withdrawn: one UPDATE withdrawing it.
        peer.update(vec![(IpNet::V4(net(8)), None)]);
        let u = raw.update().await;
        assert_eq!((u.nlri, u.withdrawn), (vec![], vec![net(8)]));

        // What the peer holds already sends nothing: the next UPDATE is
        // the change after it.
        peer.update(vec![(IpNet::V4(net(7)), Some(attrs(5)))]);
        peer.update(vec![(IpNet::V4(net(9)), Some(attrs(6)))]);
        let u = raw.update().await;
        assert_eq!((u.nlri, u.withdrawn), (vec![net(9)], vec![]));
        assert_eq!(u.attrs.med, Some(6));
        peer.stop();
    });
}
