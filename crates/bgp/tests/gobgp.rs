//! Interop with GoBGP (`gobgpd` v4.8.0, built from its Go module by
//! scripts/gobgp.sh and cached by version): our speaker and gobgpd as eBGP
//! peers over a veth pair, IPv4 and IPv6 unicast on one session. Routes go
//! both ways (gobgpd's added with its CLI), a withdrawal reaches gobgpd,
//! and gobgpd disabling the neighbor is seen as the session going down.

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
{}{}"#,
        family("ipv4-unicast"),
        family("ipv6-unicast")
    )
}

#[test]
fn a_session_with_gobgp_carries_ipv4_and_ipv6_routes_both_ways() {
    require_root();
    let daemon = gobgpd();
    let cli = daemon.with_file_name("gobgp");
    let (us, them) = link("bgp-gobgp");
    let dir = tempfile::tempdir().unwrap();
    let conf_path = dir.path().join("gobgpd.toml");
    std::fs::write(&conf_path, conf()).unwrap();
    let mut cmd = them.command(&daemon);
    cmd.arg("-f")
        .arg(&conf_path)
        .args(["-t", "toml", "--pprof-disable"]);
    let mut gobgpd = Proc::spawn("gobgpd", cmd, dir.path());
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
