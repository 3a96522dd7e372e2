//! GTSM (RFC 5082) on our speaker's sessions and listener. A node's
//! speaker, a neighbour on its link, and a host one router away that
//! claims to be a neighbour (as a pod that forges a node's address would):
//!
//! - the neighbour on the link, TTL 255 both ways, comes up;
//! - the host beyond the router never gets a connection, even sending with
//!   TTL 255 (it arrives with 254): its connect times out, because the
//!   node's kernel dropped the SYN for its TTL (TcpExt TCPMinTTLDrop
//!   counts it), and its session never comes up;
//! - the same host, its GTSM turned off at the speaker, comes up over the
//!   same path: what kept it out was the TTL check, nothing else.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use common::{meet, runtime};
use ipnet::IpNet;
use podnet_bgp::export::{Neighbour, NextHops};
use podnet_bgp::fsm::Config;
use podnet_bgp::gtsm;
use podnet_bgp::peer::{Announce, Peer, PeerEvent};
use podnet_bgp::rib::{Change, Local};
use podnet_bgp::speaker::{Speaker, SpeakerConfig};
use podnet_bgp::wire::{Afi, Origin, PathAttrs, Safi};
use podnet_testkit::{require_root, TestNs};
use tokio::net::TcpSocket;
use tokio::sync::{mpsc, Barrier};

/// The node (the highest address: it waits, the others dial), the
/// neighbour on its link, the router's two ends, and the host beyond it.
const NODE: &str = "10.96.9.9";
const NEAR: &str = "10.96.9.3";
const ROUTER_LAN: &str = "10.96.9.1";
const ROUTER_FAR: &str = "10.96.1.1";
const FAR: &str = "10.96.1.2";

struct Lab {
    _sw: TestNs,
    node: TestNs,
    near: TestNs,
    _router: TestNs,
    far: TestNs,
}

/// The node, the neighbour and the router on one bridge; the far host on
/// a link of the router's, routed through it both ways.
fn lab() -> Lab {
    let sw = TestNs::new("gtsm-sw");
    sw.sh("ip link add br0 type bridge && ip link set br0 up");
    let on_lan = |tag: &str, i: usize, addr: &str| {
        let ns = TestNs::new(tag);
        sw.sh(&format!(
            "ip link add sw{i} type veth peer name eth0 netns {} && ip link set sw{i} master br0 up",
            ns.name()
        ));
        ns.sh(&format!(
            "ip addr add {addr}/24 dev eth0 && ip link set eth0 up"
        ));
        ns
    };
    let node = on_lan("gtsm-node", 0, NODE);
    let near = on_lan("gtsm-near", 1, NEAR);
    let router = on_lan("gtsm-rtr", 2, ROUTER_LAN);
    let far = TestNs::new("gtsm-far");
    router.sh(&format!(
        "ip link add eth1 type veth peer name eth0 netns {} && \
         ip addr add {ROUTER_FAR}/24 dev eth1 && ip link set eth1 up && \
         sysctl -qw net.ipv4.ip_forward=1",
        far.name()
    ));
    far.sh(&format!(
        "ip addr add {FAR}/24 dev eth0 && ip link set eth0 up && \
         ip route add default via {ROUTER_FAR}"
    ));
    node.sh(&format!("ip route add 10.96.1.0/24 via {ROUTER_LAN}"));
    Lab {
        _sw: sw,
        node,
        near,
        _router: router,
        far,
    }
}

fn session(id: &str, ttl_security: bool) -> Config {
    Config {
        local_as: 64512,
        peer_as: 64512,
        router_id: id.parse().unwrap(),
        hold_time: 9,
        connect_retry: Duration::from_secs(1),
        passive: false,
        families: vec![(Afi::Ipv4, Safi::Unicast)],
        graceful_restart: None,
        ttl_security,
    }
}

fn neighbour(addr: &str, ttl_security: bool) -> Neighbour {
    Neighbour {
        ttl_security,
        ..Neighbour::new(addr.parse().unwrap(), 64512)
    }
}

fn speaker(neighbours: Vec<Neighbour>) -> SpeakerConfig {
    let id = NODE.parse().unwrap();
    SpeakerConfig {
        local: Local {
            asn: 64512,
            router_id: id,
            cluster_id: None,
        },
        hops: NextHops { v4: id, v6: None },
        listen: IpAddr::V4(id),
        session: session(NODE, true),
        neighbours,
        bfd: None,
    }
}

/// `ns`'s count of TCP segments dropped for their TTL (TcpExt
/// TCPMinTTLDrop in /proc/net/netstat: a line of names, a line of values).
fn min_ttl_drops(ns: &TestNs) -> u64 {
    let text = ns.sh("cat /proc/net/netstat");
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| l.starts_with("TcpExt:"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let [names, values] = &rows[..] else {
        panic!("no TcpExt in /proc/net/netstat: {text}");
    };
    let i = names
        .iter()
        .position(|n| *n == "TCPMinTTLDrop")
        .expect("TCPMinTTLDrop in TcpExt");
    values[i].parse().unwrap()
}

/// The prefix a neighbour announces, and the one the node does.
fn prefix(addr: &str) -> IpNet {
    let last: u8 = addr.rsplit('.').next().unwrap().parse().unwrap();
    format!("10.244.{last}.0/24").parse().unwrap()
}

/// Applies the node's best-route changes until `p` is there (20 s at
/// most).
async fn learn(rx: &mut mpsc::Receiver<Vec<Change>>, p: IpNet, what: &str) {
    loop {
        match tokio::time::timeout(Duration::from_secs(20), rx.recv()).await {
            Ok(Some(cs)) if cs.iter().any(|(q, r)| *q == p && r.is_some()) => return,
            Ok(Some(_)) => {}
            other => panic!("waiting for {what}: {other:?}"),
        }
    }
}

/// A bare session from `addr` to the node, announcing `prefix(addr)`.
fn bare(addr: &str, ttl_security: bool) -> (Peer, mpsc::Receiver<PeerEvent>) {
    let (tx, rx) = mpsc::channel(64);
    let node: SocketAddr = format!("{NODE}:179").parse().unwrap();
    let peer = Peer::start(session(addr, ttl_security), node, tx);
    let attrs = PathAttrs {
        origin: Some(Origin::Igp),
        next_hop: Some(addr.parse().unwrap()),
        local_pref: Some(100),
        ..Default::default()
    };
    peer.announce(Announce {
        routes: vec![(Afi::Ipv4, attrs, vec![prefix(addr)])],
    });
    (peer, rx)
}

async fn up(rx: &mut mpsc::Receiver<PeerEvent>, who: &str) {
    loop {
        match tokio::time::timeout(Duration::from_secs(20), rx.recv()).await {
            Ok(Some(PeerEvent::Up(_))) => return,
            Ok(Some(_)) => {}
            other => panic!("{who}: waiting for the session: {other:?}"),
        }
    }
}

#[test]
fn a_syn_from_beyond_a_router_never_reaches_a_gtsm_listener_and_one_on_the_link_does() {
    require_root();
    let lab = lab();
    // The far host has tried (phase one); everyone is done.
    // The node listens; the far host has tried (phase one); all done.
    let listening = Arc::new(Barrier::new(2));
    let tried = Arc::new(Barrier::new(2));
    let done = Arc::new(Barrier::new(3));
    let drops_before = min_ttl_drops(&lab.node);
    std::thread::scope(|s| {
        let (tried_n, done_n, listening_n) = (tried.clone(), done.clone(), listening.clone());
        let lab = &lab;
        s.spawn(move || {
            lab.node.run(|| {
                runtime().block_on(async {
                    let (tx, mut rx) = mpsc::channel(64);
                    let all_gtsm = vec![neighbour(NEAR, true), neighbour(FAR, true)];
                    let sp = Speaker::start(speaker(all_gtsm), tx).await.unwrap();
                    // A refused connect would prove nothing: the far host
                    // tries only once the node listens.
                    meet(&listening_n).await;
                    learn(&mut rx, prefix(NEAR), "the neighbour on the link").await;
                    meet(&tried_n).await;
                    let drops = min_ttl_drops(&lab.node);
                    assert!(
                        drops > drops_before,
                        "no SYN dropped for its TTL ({drops_before} -> {drops})"
                    );
                    // Nor did the far host's route reach us some other way.
                    while let Ok(cs) = rx.try_recv() {
                        assert!(!cs.iter().any(|(p, _)| *p == prefix(FAR)), "{cs:?}");
                    }
                    // The control: GTSM off for the far host, same path.
                    sp.set_neighbours(vec![neighbour(NEAR, true), neighbour(FAR, false)])
                        .await
                        .unwrap();
                    learn(&mut rx, prefix(FAR), "the far host without GTSM").await;
                    meet(&done_n).await;
                })
            })
        });
        let done_near = done.clone();
        s.spawn(move || {
            lab.near.run(|| {
                runtime().block_on(async {
                    let (peer, mut rx) = bare(NEAR, true);
                    up(&mut rx, "the neighbour on the link").await;
                    meet(&done_near).await;
                    peer.stop();
                })
            })
        });
        s.spawn(move || {
            lab.far
                .run(|| runtime().block_on(far(listening, tried, done)))
        });
    });
}

/// The far host: its session (without GTSM, so that it comes up once the
/// node lets it), and a connect sent with TTL 255 (taking any answer)
/// that must time out.
async fn far(listening: Arc<Barrier>, tried: Arc<Barrier>, done: Arc<Barrier>) {
    meet(&listening).await;
    let (peer, mut rx) = bare(FAR, false);
    let sock = TcpSocket::new_v4().unwrap();
    gtsm::send_255(&sock, false).unwrap();
    let node: SocketAddr = format!("{NODE}:179").parse().unwrap();
    let connect = tokio::time::timeout(Duration::from_secs(3), sock.connect(node)).await;
    assert!(
        connect.is_err(),
        "a connect from beyond the router was answered: {connect:?}"
    );
    while let Ok(e) = rx.try_recv() {
        assert!(
            !matches!(e, PeerEvent::Up(_)),
            "the far host's session came up through GTSM"
        );
    }
    meet(&tried).await;
    up(&mut rx, "the far host without GTSM").await;
    meet(&done).await;
    peer.stop();
}

/// BIRD with its `ttl security` on (TTL 255 sent, less dropped) and our
/// session with GTSM: the session comes up and BIRD's route arrives, so
/// both ends send 255 and take 255.
#[test]
fn bird_with_ttl_security_and_our_gtsm_session_come_up() {
    use common::{link, next, up as session_up, Bird, THEM as BIRD, US};
    require_root();
    let (us, them) = link("gtsm-bird");
    let dir = tempfile::tempdir().unwrap();
    let conf = format!(
        r#"router id {BIRD};
log "{log}" all;
protocol device {{}}
protocol static st {{ ipv4; route 10.244.9.0/24 blackhole; }}
protocol bgp podnet {{
  local {BIRD} as 64513;
  neighbor {US} as 64512;
  ttl security on;
  hold time 9;
  connect retry time 1;
  ipv4 {{ import all; export where proto = "st"; }};
}}
"#,
        log = dir.path().join("bird-daemon.log").display()
    );
    let bird = Bird::start(&them, dir.path(), &conf);
    let diag = || bird.diag("podnet");
    us.run(|| {
        runtime().block_on(async {
            let (tx, mut rx) = mpsc::channel(64);
            let cfg = Config {
                ttl_security: true,
                ..common::session(64513, vec![(Afi::Ipv4, Safi::Unicast)])
            };
            let peer = Peer::start(cfg, format!("{BIRD}:179").parse().unwrap(), tx);
            session_up(&mut rx, &diag).await;
            let want: ipnet::Ipv4Net = "10.244.9.0/24".parse().unwrap();
            loop {
                match next(&mut rx, "BIRD's route", &diag).await {
                    PeerEvent::Update(u) if u.nlri.contains(&want) => break,
                    _ => {}
                }
            }
            peer.stop();
        })
    });
}
