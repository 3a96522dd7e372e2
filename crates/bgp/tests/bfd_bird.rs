//! BFD with BIRD 2's `protocol bfd`: a session between our BFD link and
//! BIRD's over a veth pair comes Up on both sides; BIRD frozen (SIGSTOP, a
//! hung node) is noticed by us within the detection time, as
//! DetectionTimeExpired; BIRD thawed, the session comes back Up.

mod common;

use std::time::{Duration, Instant};

use common::{link, runtime, until, Bird, Frozen, THEM as BIRD, US};
use podnet_bgp::bfd::{Diag, Edge, Timing};
use podnet_bgp::bfd_link::Bfd;
use podnet_testkit::require_root;
use tokio::sync::mpsc;

fn bird_conf(log: &std::path::Path) -> String {
    format!(
        r#"router id {BIRD};
log "{}" all;
protocol device {{}}
protocol bfd {{
  interface "pnb1" {{ min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }};
  neighbor {US} local {BIRD};
}}
"#,
        log.display()
    )
}

/// The next edge, or a panic naming what was awaited.
async fn edge(rx: &mut mpsc::Receiver<Edge>, what: &str, diag: &dyn Fn() -> String) -> Edge {
    match tokio::time::timeout(Duration::from_secs(20), rx.recv()).await {
        Ok(Some(e)) => e,
        other => panic!("waiting for {what}: {other:?}\n{}", diag()),
    }
}

#[test]
fn bfd_with_bird_comes_up_notices_a_frozen_peer_and_recovers() {
    require_root();
    let (us, them) = link("bfd-bird");
    let dir = tempfile::tempdir().unwrap();
    let bird = Bird::start(
        &them,
        dir.path(),
        &bird_conf(&dir.path().join("bird-daemon.log")),
    );
    let birdc = |what: &str| bird.birdc(what);
    let diag = || format!("{}\nbirdc: {}", bird.proc.log(), birdc("show bfd sessions"));
    us.run(|| {
        runtime().block_on(async {
            let (tx, mut rx) = mpsc::channel(16);
            let timing = Timing {
                desired_min_tx: Duration::from_millis(100),
                required_min_rx: Duration::from_millis(100),
                detect_mult: 3,
            };
            let bfd = Bfd::start(US.parse().unwrap()).await.expect("BFD socket");
            bfd.add(BIRD.parse().unwrap(), timing, tx).await;
            assert_eq!(edge(&mut rx, "Up", &diag).await, Edge::Up);
            until("BIRD's session Up", &diag, || {
                birdc("show bfd sessions").contains("Up")
            })
            .await;
            // BIRD hangs: its packets stop.
            let frozen = Frozen::freeze(bird.proc.pid());
            let t0 = Instant::now();
            let e = edge(&mut rx, "Down", &diag).await;
            let took = t0.elapsed();
            drop(frozen);
            assert_eq!(e, Edge::Down(Diag::DetectionTimeExpired));
            eprintln!("frozen peer noticed after {took:?} (detection time 300 ms)");
            assert_eq!(edge(&mut rx, "Up again", &diag).await, Edge::Up);
        })
    });
}
