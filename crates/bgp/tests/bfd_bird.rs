//! BFD with BIRD 2's `protocol bfd`, over IPv4 and over IPv6: a session
//! between our BFD link and BIRD's over a veth pair comes Up on both sides
//! (hop limit 255 both ways on IPv6, as TTL 255 on IPv4); BIRD frozen
//! (SIGSTOP, a hung node) is noticed by us within the detection time, as
//! DetectionTimeExpired; BIRD thawed, the session comes back Up.

mod common;

use std::time::{Duration, Instant};

use common::{link, runtime, until, Bird, THEM, THEM6, US, US6};
use podnet_bgp::bfd::{Diag, Edge, Timing};
use podnet_bgp::bfd_link::Bfd;
use podnet_testkit::{require_root, Frozen};
use tokio::sync::mpsc;

/// BIRD's BFD with us, `ours` and `theirs` the two ends' addresses.
fn bird_conf(log: &std::path::Path, ours: &str, theirs: &str) -> String {
    format!(
        r#"router id {THEM};
log "{}" all;
protocol device {{}}
protocol bfd {{
  interface "pnb1" {{ min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }};
  neighbor {ours} local {theirs};
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
    with_bird("bfd-bird", US, THEM);
}

#[test]
fn bfd_with_bird_over_ipv6_comes_up_notices_a_frozen_peer_and_recovers() {
    with_bird("bfd-bird6", US6, THEM6);
}

/// Our BFD session from `ours` with BIRD at `theirs`: Up, a frozen BIRD
/// noticed, Up again.
fn with_bird(tag: &str, ours: &str, theirs: &str) {
    require_root();
    let (us, them) = link(tag);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("bird-daemon.log");
    let bird = Bird::start(&them, dir.path(), &bird_conf(&log, ours, theirs));
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
            let bfd = Bfd::start(ours.parse().unwrap()).await.expect("BFD socket");
            bfd.add(theirs.parse().unwrap(), timing, tx).await;
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
