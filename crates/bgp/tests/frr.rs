//! Interop with FRR's bgpd (Debian's `frr`), the other router the field
//! runs: our speaker and bgpd as eBGP peers over a veth pair, with IPv4
//! and IPv6 unicast on one session (IPv6 in MP_REACH_NLRI). Routes go both
//! ways in both families, a withdrawal reaches bgpd, and bgpd's shutdown
//! of the neighbor is seen as the session going down with its Cease.
//! bgpd runs alone (no zebra: `-Z`), listening on the veth address only.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Duration;

use common::{link, next, runtime, until, THEM as FRR, US, US6};
use ipnet::IpNet;
use podnet_bgp::fsm::Config;
use podnet_bgp::peer::{Announce, Peer, PeerEvent};
use podnet_bgp::wire::{Afi, AsSegment, MpReach, Origin, PathAttrs, Safi};
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

fn ours() -> Announce {
    let attrs = |v6: bool| PathAttrs {
        origin: Some(Origin::Igp),
        as_path: vec![AsSegment::Sequence(vec![64512])],
        next_hop: (!v6).then(|| US.parse().unwrap()),
        mp_reach: v6.then(|| MpReach {
            afi: Afi::Ipv6,
            safi: Safi::Unicast,
            next_hops: vec![US6.parse().unwrap()],
            nlri: vec![],
        }),
        ..Default::default()
    };
    let p4: IpNet = "10.244.1.0/24".parse().unwrap();
    let p6: IpNet = "fd00:244:1::/64".parse().unwrap();
    Announce {
        routes: vec![
            (Afi::Ipv4, attrs(false), vec![p4]),
            (Afi::Ipv6, attrs(true), vec![p6]),
        ],
    }
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
            let config = Config {
                local_as: 64512,
                peer_as: 64514,
                router_id: US.parse::<Ipv4Addr>().unwrap(),
                hold_time: 9,
                connect_retry: Duration::from_secs(1),
                passive: false,
                families: vec![(Afi::Ipv4, Safi::Unicast), (Afi::Ipv6, Safi::Unicast)],
                graceful_restart: None,
            };
            let peer = Peer::start(config, format!("{FRR}:179").parse().unwrap(), tx);
            peer.announce(ours());
            let up = loop {
                if let PeerEvent::Up(n) = next(&mut rx, "the session with bgpd", &diag).await {
                    break n;
                }
            };
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
            let down = loop {
                if let PeerEvent::Down(why) = next(&mut rx, "the session going down", &diag).await {
                    break why;
                }
            };
            assert!(down.contains("Cease"), "{down}");
            peer.stop();
        })
    });
    bgpd.terminate(Duration::from_secs(5));
}
