//! Interop with FRR's bgpd (Debian's `frr`), the other router the field
//! runs: our speaker and bgpd as eBGP peers over a veth pair, with IPv4
//! and IPv6 unicast on one session (IPv6 in MP_REACH_NLRI). Routes go both
//! ways in both families, a withdrawal reaches bgpd, and bgpd's shutdown
//! of the neighbor is seen as the session going down with its Cease.
//! bgpd runs alone (no zebra: `-Z`), listening on the veth address only.

mod common;

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use common::{down, link, next, ours, runtime, session, until, up, THEM as FRR, US};
use ipnet::IpNet;
use podnet_bgp::peer::{Announce, Peer, PeerEvent};
use podnet_bgp::wire::{Afi, AsSegment, Safi};
use podnet_testkit::{require_root, Proc};
use tokio::sync::mpsc;

fn frr_conf() -> String {
    format!(
        "frr defaults traditional
hostname pnfrr
log stdout debugging
router bgp 64514
 bgp router-id {FRR}
 no bgp ebgp-requires-policy
 no bgp network import-check
 neighbor {US} remote-as 64512
 neighbor {US} timers 3 9
 neighbor {US} timers connect 1
 address-family ipv4 unicast
  network 10.244.8.0/24
 exit-address-family
 address-family ipv6 unicast
  neighbor {US} activate
  network fd00:244:8::/64
 exit-address-family
"
    )
}

fn start_bgpd(them: &podnet_testkit::TestNs, dir: &Path) -> Proc {
    let conf = dir.join("bgpd.conf");
    std::fs::write(&conf, frr_conf()).unwrap();
    let mut cmd = them.command("/usr/lib/frr/bgpd");
    cmd.arg("-f")
        .arg(&conf)
        .arg("-i")
        .arg(dir.join("bgpd.pid"))
        .arg("--vty_socket")
        .arg(dir)
        .args(["-Z", "-S", "-n", "-P", "0", "-l", FRR]);
    Proc::spawn("bgpd", cmd, dir)
}

#[test]
fn a_session_with_frr_carries_ipv4_and_ipv6_routes_both_ways() {
    require_root();
    let (us, them) = link("bgp-frr");
    let dir = tempfile::tempdir().unwrap();
    let mut bgpd = start_bgpd(&them, dir.path());
    // Each command one `-c`, in order (a configuration change is several).
    let vtysh_all = |cmds: &[&str]| {
        let args: String = cmds.iter().map(|c| format!(" -c '{c}'")).collect();
        them.try_sh(&format!(
            "vtysh --vty_socket {}{args}",
            dir.path().display()
        ))
        .1
    };
    let vtysh = |cmd: &str| vtysh_all(&[cmd]);
    let diag = || {
        format!(
            "bgpd's log:\n{}\nneighbor: {}",
            bgpd.log(),
            vtysh("show bgp neighbors")
        )
    };
    us.run(|| {
        runtime().block_on(async {
            let (tx, mut rx) = mpsc::channel(64);
            let config = session(
                64514,
                vec![(Afi::Ipv4, Safi::Unicast), (Afi::Ipv6, Safi::Unicast)],
            );
            let peer = Peer::start(config, format!("{FRR}:179").parse().unwrap(), tx);
            peer.announce(ours(true));
            let up = up(&mut rx, &diag).await;
            assert_eq!(up.peer_as, 64514);
            assert_eq!(
                up.families,
                vec![(Afi::Ipv4, Safi::Unicast), (Afi::Ipv6, Safi::Unicast)]
            );
            // bgpd's routes, both families.
            let want4: ipnet::Ipv4Net = "10.244.8.0/24".parse().unwrap();
            let want6: IpNet = "fd00:244:8::/64".parse().unwrap();
            let (mut got4, mut got6) = (false, false);
            while !(got4 && got6) {
                if let PeerEvent::Update(u) = next(&mut rx, "bgpd's routes", &diag).await {
                    if u.nlri.contains(&want4) {
                        assert_eq!(u.attrs.next_hop, Some(FRR.parse().unwrap()));
                        got4 = true;
                    }
                    if let Some(r) = u
                        .attrs
                        .mp_reach
                        .as_ref()
                        .filter(|r| r.nlri.contains(&want6))
                    {
                        assert!(
                            r.next_hops.iter().any(|h| matches!(h, IpAddr::V6(_))),
                            "{r:?}"
                        );
                        assert_eq!(u.attrs.as_path, vec![AsSegment::Sequence(vec![64514])]);
                        got6 = true;
                    }
                }
            }
            // Ours reach bgpd, both families...
            for (af, p) in [("ipv4", "10.244.1.0/24"), ("ipv6", "fd00:244:1::/64")] {
                until(&format!("bgpd to hold {p}"), &diag, || {
                    vtysh(&format!("show bgp {af} unicast {p}")).contains("64512")
                })
                .await;
            }
            // ...and go when we stop announcing them.
            peer.announce(Announce::default());
            for (af, p) in [("ipv4", "10.244.1.0/24"), ("ipv6", "fd00:244:1::/64")] {
                until(&format!("bgpd to drop {p}"), &diag, || {
                    vtysh(&format!("show bgp {af} unicast {p}")).contains("not in table")
                })
                .await;
            }
            // bgpd shuts the neighbor down: a Cease, seen as Down.
            let shut = format!("neighbor {US} shutdown");
            vtysh_all(&["configure terminal", "router bgp 64514", &shut]);
            let down = down(&mut rx, &diag).await;
            assert!(down.contains("Cease"), "{down}");
            peer.stop();
        })
    });
    bgpd.terminate(Duration::from_secs(5));
}
