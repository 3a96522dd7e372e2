//! BGP that follows BFD, with BIRD 2 (RFC 5882): our speaker and BIRD peer
//! over eBGP with a hold time of 90 s, and run BFD (100 ms × 3) beside it.
//! BIRD frozen (SIGSTOP: a hung node), our speaker drops the session on
//! BFD's word and withdraws BIRD's route within the detection time, not
//! after the 90 s hold time; thawed, the session and the route come back.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use common::{link, runtime, session, Bird, THEM as BIRD, US};
use ipnet::IpNet;
use podnet_bgp::bfd::Timing;
use podnet_bgp::export::{Neighbour, NextHops};
use podnet_bgp::fsm::Config;
use podnet_bgp::rib::{Change, Local};
use podnet_bgp::speaker::{Speaker, SpeakerConfig};
use podnet_bgp::wire::{Afi, Safi};
use podnet_testkit::{require_root, Frozen};
use tokio::sync::mpsc;

/// BIRD peering over eBGP with BFD. Thawed, BIRD's own BFD timers fire
/// before it reads our packets (it heard nothing while frozen): its
/// session fails once more, and BIRD waits its `error wait time` before it
/// tries again, 60 s by default; cut to 1 s, so the return is seen within
/// the test's bound.
fn bird_conf(log: &std::path::Path) -> String {
    format!(
        r#"router id {BIRD};
log "{}" all;
protocol device {{}}
protocol static st {{ ipv4; route 10.244.9.0/24 blackhole; }}
protocol bfd {{
  interface "pnb1" {{ min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }};
}}
protocol bgp podnet {{
  local {BIRD} as 64513;
  neighbor {US} as 64512;
  hold time 90;
  connect retry time 1;
  error wait time 1, 2;
  bfd on;
  ipv4 {{ import all; export where proto = "st"; }};
}}
"#,
        log.display()
    )
}

fn speaker() -> SpeakerConfig {
    let us: Ipv4Addr = US.parse().unwrap();
    SpeakerConfig {
        local: Local {
            asn: 64512,
            router_id: us,
            cluster_id: None,
        },
        hops: NextHops { v4: us, v6: None },
        listen: IpAddr::V4(us),
        session: Config {
            hold_time: 90,
            ..session(64513, vec![(Afi::Ipv4, Safi::Unicast)])
        },
        neighbours: vec![Neighbour {
            addr: BIRD.parse().unwrap(),
            asn: 64513,
            client: false,
            ttl_security: false,
            bfd: true,
        }],
        bfd: Some(Timing {
            desired_min_tx: Duration::from_millis(100),
            required_min_rx: Duration::from_millis(100),
            detect_mult: 3,
        }),
    }
}

/// Waits for the best route to `p` to come (`present`) or go.
async fn route(
    rx: &mut mpsc::Receiver<Vec<Change>>,
    p: IpNet,
    present: bool,
    diag: &dyn Fn() -> String,
) {
    loop {
        match tokio::time::timeout(Duration::from_secs(20), rx.recv()).await {
            Ok(Some(cs)) => {
                if cs.iter().any(|(q, r)| *q == p && r.is_some() == present) {
                    return;
                }
            }
            other => panic!("waiting for {p} present={present}: {other:?}\n{}", diag()),
        }
    }
}

#[test]
fn a_frozen_bird_is_dropped_on_bfds_word_not_after_the_hold_time() {
    require_root();
    let (us, them) = link("bgp-bfd");
    let dir = tempfile::tempdir().unwrap();
    let bird = Bird::start(
        &them,
        dir.path(),
        &bird_conf(&dir.path().join("bird-daemon.log")),
    );
    let birdc = |what: &str| bird.birdc(what);
    let diag = || {
        format!(
            "{}\n{}\n{}",
            bird.proc.log(),
            birdc("show bfd sessions"),
            birdc("show protocols all podnet")
        )
    };
    let p: IpNet = "10.244.9.0/24".parse().unwrap();
    us.run(|| {
        runtime().block_on(async {
            let (tx, mut rx) = mpsc::channel(64);
            let _sp = Speaker::start(speaker(), tx).await.expect("speaker");
            route(&mut rx, p, true, &diag).await;
            let frozen = Frozen::freeze(bird.proc.pid());
            let t0 = Instant::now();
            route(&mut rx, p, false, &diag).await;
            let took = t0.elapsed();
            drop(frozen);
            eprintln!("BIRD's route withdrawn {took:?} after it froze (hold time 90 s)");
            route(&mut rx, p, true, &diag).await;
        })
    });
}
