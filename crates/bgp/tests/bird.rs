//! Interop with BIRD 2 (Debian's `bird2`), the router most BGP networks
//! already run: our speaker in one namespace and BIRD in another, joined
//! by a veth pair, as eBGP peers. The session comes up, routes go both
//! ways, a withdrawal reaches BIRD, and BIRD's shutdown is seen as the
//! session going down with its Cease. BIRD as a 2-octet-AS speaker: the
//! 4-octet AS in its path, sent as AS_TRANS with AS4_PATH, is rebuilt.

use std::net::Ipv4Addr;
use std::path::Path;

use podnet_bgp::peer::{Announce, Peer, PeerEvent};
use podnet_bgp::wire::{Afi, AsSegment, Safi};
use podnet_testkit::require_root;
use tokio::sync::mpsc;

mod common;

use common::{down, link, next, ours, runtime, session, until, up, Bird, THEM as BIRD, US};

fn bird_conf(dir: &Path) -> String {
    format!(
        r#"router id {BIRD};
log "{log}" all;
protocol device {{}}
protocol static st {{
  ipv4;
  route 10.244.9.0/24 blackhole;
}}
protocol bgp podnet {{
  local {BIRD} as 64513;
  neighbor {US} as 64512;
  hold time 9;
  connect retry time 1;
  ipv4 {{ import all; export where proto = "st"; }};
}}
"#,
        log = dir.join("bird-daemon.log").display()
    )
}

#[test]
fn a_session_with_bird_carries_routes_both_ways_and_sees_its_shutdown() {
    require_root();
    let (us, them) = link("bgp-bird");
    let dir = tempfile::tempdir().unwrap();
    let bird = Bird::start(&them, dir.path(), &bird_conf(dir.path()));
    let birdc = |what: &str| bird.birdc(what);
    let diag = || bird.diag("podnet");

    us.run(|| {
        runtime().block_on(async {
            let (tx, mut rx) = mpsc::channel(64);
            let config = session(64513, vec![(Afi::Ipv4, Safi::Unicast)]);
            let peer = Peer::start(config, format!("{BIRD}:179").parse().unwrap(), tx);
            peer.announce(ours(false));
            let up = up(&mut rx, &diag).await;
            assert_eq!(up.peer_as, 64513);
            assert_eq!(up.peer_id, BIRD.parse::<Ipv4Addr>().unwrap());
            assert!(up.four_octet_as);
            // BIRD's static route reaches us, with BIRD's AS first.
            let want: ipnet::Ipv4Net = "10.244.9.0/24".parse().unwrap();
            let got = loop {
                match next(&mut rx, "BIRD's route", &diag).await {
                    PeerEvent::Update(u) if u.nlri.contains(&want) => break u,
                    _ => {}
                }
            };
            assert_eq!(got.attrs.as_path, vec![AsSegment::Sequence(vec![64513])]);
            assert_eq!(got.attrs.next_hop, Some(BIRD.parse().unwrap()));
            // Ours reaches BIRD...
            until("BIRD to hold 10.244.1.0/24", &diag, || {
                birdc("show route 10.244.1.0/24").contains("10.244.1.0/24")
            })
            .await;
            // ...and goes when we stop announcing it.
            peer.announce(Announce::default());
            until("BIRD to drop 10.244.1.0/24", &diag, || {
                !birdc("show route 10.244.1.0/24").contains("10.244.1.0/24")
            })
            .await;
            // BIRD shuts the session down: a Cease, seen as Down.
            birdc("disable podnet");
            let down = down(&mut rx, &diag).await;
            assert!(down.contains("Cease"), "{down}");
            peer.stop();
        })
    });
}

/// BIRD as a 2-octet-AS speaker (`enable as4 off`) sends a route whose
/// path holds a 4-octet AS: on the wire AS_PATH carries AS_TRANS and
/// AS4_PATH the real number; ours rebuilds the path (RFC 6793 §4.2.3).
#[test]
fn a_two_octet_birds_path_is_rebuilt_with_its_four_octet_as() {
    require_root();
    let (us, them) = link("bgp-as4");
    let dir = tempfile::tempdir().unwrap();
    let conf = format!(
        r#"router id {BIRD};
log "{log}" all;
protocol device {{}}
protocol static st {{
  ipv4;
  route 10.244.9.0/24 blackhole;
}}
protocol bgp podnet {{
  local {BIRD} as 64513;
  neighbor {US} as 64512;
  enable as4 off;
  hold time 9;
  connect retry time 1;
  ipv4 {{
    import all;
    export filter {{ if proto = "st" then {{ bgp_path.prepend(4200000000); accept; }} reject; }};
  }};
}}
"#,
        log = dir.path().join("bird-daemon.log").display()
    );
    let bird = Bird::start(&them, dir.path(), &conf);
    let diag = || bird.diag("podnet");
    us.run(|| {
        runtime().block_on(async {
            let (tx, mut rx) = mpsc::channel(64);
            let config = session(64513, vec![(Afi::Ipv4, Safi::Unicast)]);
            let peer = Peer::start(config, format!("{BIRD}:179").parse().unwrap(), tx);
            let up = up(&mut rx, &diag).await;
            assert!(!up.four_octet_as, "BIRD spoke 4-octet AS numbers");
            let want: ipnet::Ipv4Net = "10.244.9.0/24".parse().unwrap();
            let got = loop {
                match next(&mut rx, "BIRD's route", &diag).await {
                    PeerEvent::Update(u) if u.nlri.contains(&want) => break u,
                    _ => {}
                }
            };
            assert_eq!(
                got.attrs.as_path,
                vec![AsSegment::Sequence(vec![64513, 4_200_000_000])]
            );
            peer.stop();
        })
    });
}
