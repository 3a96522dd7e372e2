//! Graceful restart with BIRD 2 (RFC 4724), as an agent restart needs it:
//! our speaker announces the capability; when its connection drops with
//! no NOTIFICATION (the process went away), BIRD keeps our route and
//! waits for us (its restart timer) instead of withdrawing it; the
//! restarted speaker (the Restart State bit set) comes back, announces
//! again and sends End-of-RIB, which ends BIRD's wait with the route in
//! place. Without the capability, BIRD drops the
//! route at once (the control case).

mod common;

use common::{link, ours, runtime, session, until, Bird, THEM as BIRD, US};
use podnet_bgp::fsm::Config;
use podnet_bgp::peer::{Peer, PeerEvent};
use podnet_bgp::wire::{Afi, Safi};
use podnet_testkit::require_root;
use tokio::sync::mpsc;

fn bird_conf(log: &std::path::Path) -> String {
    format!(
        r#"router id {BIRD};
log "{}" all;
protocol device {{}}
protocol bgp podnet {{
  local {BIRD} as 64513;
  neighbor {US} as 64512;
  hold time 9;
  connect retry time 1;
  graceful restart on;
  ipv4 {{ import all; export none; }};
}}
"#,
        log.display()
    )
}

fn config(restart: Option<(u16, bool)>) -> Config {
    Config {
        graceful_restart: restart,
        ..session(64513, vec![(Afi::Ipv4, Safi::Unicast)])
    }
}

/// A session with BIRD, announcing our route, up.
async fn start(cfg: Config, diag: &dyn Fn() -> String) -> (Peer, mpsc::Receiver<PeerEvent>) {
    let (tx, mut rx) = mpsc::channel(64);
    let peer = Peer::start(cfg, format!("{BIRD}:179").parse().unwrap(), tx);
    peer.announce(ours(false));
    common::up(&mut rx, diag).await;
    (peer, rx)
}

#[test]
fn bird_keeps_our_routes_across_a_restart_with_graceful_restart_and_not_without() {
    require_root();
    let (us, them) = link("bgp-gr");
    let dir = tempfile::tempdir().unwrap();
    let bird = Bird::start(
        &them,
        dir.path(),
        &bird_conf(&dir.path().join("bird-daemon.log")),
    );
    let birdc = |what: &str| bird.birdc(what);
    let route = || birdc("show route 10.244.1.0/24 all");
    let diag = || {
        format!(
            "{}\nroute: {}\nprotocol: {}",
            bird.proc.log(),
            route(),
            birdc("show protocols all podnet")
        )
    };
    let held = || route().contains("10.244.1.0/24");
    us.run(|| {
        runtime().block_on(async {
            // Without the capability: gone as soon as the connection is.
            let (peer, _rx) = start(config(None), &diag).await;
            until("BIRD to hold our route", &diag, held).await;
            peer.abandon();
            until(
                "BIRD to drop our route (no graceful restart)",
                &diag,
                || !held(),
            )
            .await;

            // With it: kept across the gap, BIRD waiting for us...
            let (peer, _rx) = start(config(Some((120, false))), &diag).await;
            until("BIRD to hold our route again", &diag, held).await;
            until("BIRD to see our graceful restart", &diag, || {
                birdc("show protocols all podnet").contains("Graceful restart")
            })
            .await;
            peer.abandon();
            let restarting =
                || birdc("show protocols all podnet").contains("graceful restart active");
            until("BIRD to wait for our restart", &diag, restarting).await;
            assert!(held(), "the route was kept\n{}", diag());
            // ...until we are back with End-of-RIB, the route in place.
            let (peer, _rx) = start(config(Some((120, true))), &diag).await;
            until("BIRD's wait over", &diag, || !restarting()).await;
            assert!(held(), "{}", diag());
            peer.stop();
        })
    });
}
