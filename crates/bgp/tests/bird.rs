//! Interop with BIRD 2 (Debian's `bird2`), the router most BGP networks
//! already run: our speaker in one namespace and BIRD in another, joined
//! by a veth pair, as eBGP peers. The session comes up, routes go both
//! ways, a withdrawal reaches BIRD, and BIRD's shutdown is seen as the
//! session going down with its Cease.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use ipnet::IpNet;
use podnet_bgp::fsm::Config;
use podnet_bgp::peer::{Announce, Peer, PeerEvent};
use podnet_bgp::wire::{Afi, AsSegment, Origin, PathAttrs, Safi};
use podnet_testkit::{require_root, Proc};
use tokio::sync::mpsc;

mod common;

use common::{link, next, runtime, until, THEM as BIRD, US};

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

fn ours() -> Announce {
    let attrs = PathAttrs {
        origin: Some(Origin::Igp),
        as_path: vec![AsSegment::Sequence(vec![64512])],
        next_hop: Some(US.parse().unwrap()),
        ..Default::default()
    };
    let p: IpNet = "10.244.1.0/24".parse().unwrap();
    Announce {
        routes: vec![(Afi::Ipv4, attrs, vec![p])],
    }
}

#[test]
fn a_session_with_bird_carries_routes_both_ways_and_sees_its_shutdown() {
    require_root();
    let (us, them) = link("bgp-bird");
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("bird.conf");
    std::fs::write(&conf, bird_conf(dir.path())).unwrap();
    let ctl = dir.path().join("bird.ctl");
    let mut cmd = them.command("bird");
    cmd.arg("-f").arg("-c").arg(&conf).arg("-s").arg(&ctl);
    let mut bird = Proc::spawn("bird", cmd, dir.path());
    // birdc's exit status says little ("Network not found" is a failure):
    // its output is what tells.
    let birdc = |what: &str| them.try_sh(&format!("birdc -s {} {what}", ctl.display())).1;
    let diag = || {
        let log = std::fs::read_to_string(dir.path().join("bird-daemon.log")).unwrap_or_default();
        format!(
            "BIRD's log:\n{log}\n{}\nbirdc: {}",
            bird.log(),
            them.try_sh(&format!(
                "birdc -s {} show protocols all podnet",
                ctl.display()
            ))
            .1
        )
    };

    us.run(|| {
        runtime().block_on(async {
            let (tx, mut rx) = mpsc::channel(64);
            let config = Config {
                local_as: 64512,
                peer_as: 64513,
                router_id: US.parse::<Ipv4Addr>().unwrap(),
                hold_time: 9,
                connect_retry: Duration::from_secs(1),
                passive: false,
                families: vec![(Afi::Ipv4, Safi::Unicast)],
                graceful_restart: None,
            };
            let peer = Peer::start(config, format!("{BIRD}:179").parse().unwrap(), tx);
            peer.announce(ours());
            let up = loop {
                match next(&mut rx, "the session with BIRD", &diag).await {
                    PeerEvent::Up(n) => break n,
                    e => eprintln!("before up: {e:?}"),
                }
            };
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
            let down = loop {
                if let PeerEvent::Down(why) = next(&mut rx, "the session going down", &diag).await {
                    break why;
                }
            };
            assert!(down.contains("Cease"), "{down}");
            peer.stop();
        })
    });
    bird.terminate(Duration::from_secs(5));
}
