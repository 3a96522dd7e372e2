//! Interop with GoBGP (`gobgpd` v4.8.0, built from its Go module by
//! scripts/gobgp.sh and cached by version): our speaker and gobgpd as eBGP
//! peers over a veth pair, IPv4 and IPv6 unicast on one session. Routes go
//! both ways (gobgpd's added with its CLI), a withdrawal reaches gobgpd,
//! and gobgpd disabling the neighbor is seen as the session going down.
//! Graceful restart (gobgpd as the receiving, helper side): our route is
//! kept across a dropped connection while it has the capability, and goes
//! at once without.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{down, link, next, ours, runtime, session, until, up, THEM as GOBGP, US};
use ipnet::IpNet;
use podnet_bgp::peer::{Announce, Peer, PeerEvent};
use podnet_bgp::wire::{Afi, AsSegment, Safi};
use podnet_testkit::{require_root, Proc};
use tokio::sync::mpsc;

/// gobgpd, from scripts/gobgp.sh's cache (built on first use).
fn gobgpd() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gobgp.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .output()
        .expect("running scripts/gobgp.sh");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scripts/gobgp.sh failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = text
        .lines()
        .find_map(|l| l.strip_prefix("GOBGPD="))
        .unwrap_or_else(|| panic!("scripts/gobgp.sh named no gobgpd: {text}"));
    PathBuf::from(path)
}

fn conf() -> String {
    conf_with("")
}

/// The configuration, with `extra` at the end of the neighbor's section.
fn conf_with(extra: &str) -> String {
    let family = |name: &str| {
        format!("  [[neighbors.afi-safis]]\n    [neighbors.afi-safis.config]\n      afi-safi-name = \"{name}\"\n")
    };
    format!(
        r#"[global.config]
  as = 64515
  router-id = "{GOBGP}"
  local-address-list = ["{GOBGP}"]
[[neighbors]]
  [neighbors.config]
    neighbor-address = "{US}"
    peer-as = 64512
  [neighbors.timers.config]
    connect-retry = 1
    hold-time = 9
    keepalive-interval = 3
{}{}{extra}"#,
        family("ipv4-unicast"),
        family("ipv6-unicast")
    )
}

/// gobgpd in `ns` with `conf`, its CLI, once its API answers.
fn start_gobgpd(ns: &podnet_testkit::TestNs, dir: &Path, conf: &str) -> (Proc, PathBuf) {
    let daemon = gobgpd();
    let conf_path = dir.join("gobgpd.toml");
    std::fs::write(&conf_path, conf).unwrap();
    let mut cmd = ns.command(&daemon);
    cmd.arg("-f")
        .arg(&conf_path)
        .args(["-t", "toml", "--pprof-disable"]);
    (
        Proc::spawn("gobgpd", cmd, dir),
        daemon.with_file_name("gobgp"),
    )
}

#[test]
fn a_session_with_gobgp_carries_ipv4_and_ipv6_routes_both_ways() {
    require_root();
    let (us, them) = link("bgp-gobgp");
    let dir = tempfile::tempdir().unwrap();
    let (mut gobgpd, cli) = start_gobgpd(&them, dir.path(), &conf());
    let gobgp = |args: &str| them.try_sh(&format!("{} {args}", cli.display())).1;
    let diag = || {
        format!(
            "gobgpd's log:\n{}\nneighbor: {}",
            gobgpd.log(),
            gobgp("neighbor")
        )
    };
    us.run(|| {
        runtime().block_on(async {
            // gobgpd's own routes, added once its API answers.
            until("gobgpd's API", &diag, || {
                them.try_sh(&format!("{} global", cli.display())).0
            })
            .await;
            gobgp("global rib add -a ipv4 10.244.7.0/24");
            gobgp("global rib add -a ipv6 fd00:244:7::/64");
            let (tx, mut rx) = mpsc::channel(64);
            let config = session(
                64515,
                vec![(Afi::Ipv4, Safi::Unicast), (Afi::Ipv6, Safi::Unicast)],
            );
            let peer = Peer::start(config, format!("{GOBGP}:179").parse().unwrap(), tx);
            peer.announce(ours(true));
            let up = up(&mut rx, &diag).await;
            assert_eq!(up.peer_as, 64515);
            assert_eq!(up.families.len(), 2, "{up:?}");
            let want4: ipnet::Ipv4Net = "10.244.7.0/24".parse().unwrap();
            let want6: IpNet = "fd00:244:7::/64".parse().unwrap();
            let (mut got4, mut got6) = (false, false);
            while !(got4 && got6) {
                if let PeerEvent::Update(u) = next(&mut rx, "gobgpd's routes", &diag).await {
                    got4 |= u.nlri.contains(&want4);
                    got6 |= u
                        .attrs
                        .mp_reach
                        .as_ref()
                        .is_some_and(|r| r.nlri.contains(&want6));
                    if got4 || got6 {
                        assert_eq!(u.attrs.as_path, vec![AsSegment::Sequence(vec![64515])]);
                    }
                }
            }
            for (af, p) in [("ipv4", "10.244.1.0/24"), ("ipv6", "fd00:244:1::/64")] {
                until(&format!("gobgpd to hold {p}"), &diag, || {
                    gobgp(&format!("global rib -a {af} {p}")).contains("64512")
                })
                .await;
            }
            peer.announce(Announce::default());
            for (af, p) in [("ipv4", "10.244.1.0/24"), ("ipv6", "fd00:244:1::/64")] {
                until(&format!("gobgpd to drop {p}"), &diag, || {
                    !gobgp(&format!("global rib -a {af} {p}")).contains("64512")
                })
                .await;
            }
            gobgp(&format!("neighbor {US} disable"));
            let down = down(&mut rx, &diag).await;
            assert!(down.contains("Cease"), "{down}");
            peer.stop();
        })
    });
    gobgpd.terminate(Duration::from_secs(5));
}

/// Graceful restart with gobgpd as the helper: with the capability our
/// route stays in its RIB after our connection drops without a
/// NOTIFICATION (gobgpd no longer Established), and our restarted
/// speaker's End-of-RIB ends the wait with the route in place; without
/// the capability the route goes with the connection.
#[test]
fn gobgp_keeps_our_routes_across_a_restart_with_graceful_restart_and_not_without() {
    require_root();
    let (us, them) = link("bgp-gobgp-gr");
    let dir = tempfile::tempdir().unwrap();
    let gr = "  [neighbors.graceful-restart.config]\n    enabled = true\n    restart-time = 120\n";
    let (mut gobgpd, cli) = start_gobgpd(&them, dir.path(), &conf_with(gr));
    let gobgp = |args: &str| {
        them.try_sh(&format!("timeout 2 {} {args}", cli.display()))
            .1
    };
    let diag = || {
        format!(
            "gobgpd's log:\n{}\nneighbor: {}",
            gobgpd.log(),
            gobgp(&format!("neighbor {US}"))
        )
    };
    let held = || gobgp("global rib -a ipv4 10.244.1.0/24").contains("64512");
    let established = || gobgp(&format!("neighbor {US}")).contains("STATE_ESTABLISHED");
    us.run(|| {
        runtime().block_on(async {
            until("gobgpd's API", &diag, || {
                them.try_sh(&format!("{} global", cli.display())).0
            })
            .await;
            let start = |restart: Option<(u16, bool)>| {
                let (tx, rx) = mpsc::channel(64);
                let config = podnet_bgp::fsm::Config {
                    graceful_restart: restart,
                    ..session(64515, vec![(Afi::Ipv4, Safi::Unicast)])
                };
                let peer = Peer::start(config, format!("{GOBGP}:179").parse().unwrap(), tx);
                peer.announce(ours(false));
                (peer, rx)
            };
            // Without the capability: gone with the connection.
            let (peer, mut rx) = start(None);
            up(&mut rx, &diag).await;
            until("gobgpd to hold our route", &diag, held).await;
            peer.abandon();
            until(
                "gobgpd to drop our route (no graceful restart)",
                &diag,
                || !held(),
            )
            .await;
            // With it: kept while we are away...
            let (peer, mut rx) = start(Some((120, false)));
            up(&mut rx, &diag).await;
            until("gobgpd to hold our route again", &diag, held).await;
            until("gobgpd to see our graceful restart", &diag, || {
                gobgp(&format!("neighbor {US}")).lines().any(|l| {
                    l.contains("graceful-restart:") && l.contains("advertised and received")
                })
            })
            .await;
            peer.abandon();
            until("gobgpd to see the session gone", &diag, || !established()).await;
            assert!(held(), "the route was kept\n{}", diag());
            // ...and after we are back with End-of-RIB.
            let (peer, mut rx) = start(Some((120, true)));
            up(&mut rx, &diag).await;
            until("gobgpd established again", &diag, established).await;
            assert!(held(), "{}", diag());
            peer.stop();
        })
    });
    gobgpd.terminate(Duration::from_secs(5));
}
