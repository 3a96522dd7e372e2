//! Our own speakers among themselves, as nodes run them: three namespaces
//! on one bridge, each speaker originating its node's pod CIDR. In a full
//! iBGP mesh every node learns the other two, with their addresses as next
//! hops; a node that goes away (its speaker dropped) is withdrawn
//! everywhere. Through a route reflector, two clients that peer only with
//! it learn each other's routes, the next hop still the originator's. A
//! neighbour set changed at run time (a node joins, one leaves) starts and
//! stops just the sessions that changed.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use podnet_bgp::export::{Neighbour, NextHops};
use podnet_bgp::fsm::Config;
use podnet_bgp::rib::{Change, Local};
use podnet_bgp::speaker::{Speaker, SpeakerConfig};
use podnet_bgp::wire::{Afi, Safi};
use podnet_testkit::{require_root, TestNs};
use tokio::sync::{mpsc, Barrier};

mod common;

use common::{meet, runtime};

fn addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 98, 0, i as u8 + 1)
}

fn pod_cidr(i: usize) -> IpNet {
    format!("10.244.{}.0/24", i + 1).parse().unwrap()
}

/// A bridge in a namespace of its own, and `n` node namespaces on it.
fn lan(n: usize) -> (TestNs, Vec<TestNs>) {
    let sw = TestNs::new("bgp-sw");
    sw.sh("ip link add br0 type bridge && ip link set br0 up");
    let nodes: Vec<TestNs> = (0..n)
        .map(|i| {
            let node = TestNs::new("bgp-node");
            sw.sh(&format!(
                "ip link add sw{i} type veth peer name eth0 netns {} && \
                 ip link set sw{i} master br0 up",
                node.name()
            ));
            node.sh(&format!(
                "ip link set lo up && ip addr add {}/24 dev eth0 && ip link set eth0 up",
                addr(i)
            ));
            node
        })
        .collect();
    (sw, nodes)
}

fn config(i: usize, neighbours: Vec<(usize, bool)>, reflector: bool) -> SpeakerConfig {
    SpeakerConfig {
        local: Local {
            asn: 64512,
            router_id: addr(i),
            cluster_id: reflector.then(|| addr(i)),
        },
        hops: NextHops {
            v4: addr(i),
            v6: None,
        },
        listen: IpAddr::V4(addr(i)),
        session: Config {
            local_as: 64512,
            peer_as: 64512,
            router_id: addr(i),
            hold_time: 9,
            connect_retry: Duration::from_secs(1),
            passive: false,
            families: vec![(Afi::Ipv4, Safi::Unicast)],
            graceful_restart: None,
            ttl_security: true,
        },
        neighbours: neighbours
            .into_iter()
            .map(|(j, client)| Neighbour {
                client,
                ..Neighbour::new(IpAddr::V4(addr(j)), 64512)
            })
            .collect(),
        bfd: None,
    }
}

/// The best routes as the changes built them: prefix -> next hop.
type Table = BTreeMap<IpNet, IpAddr>;

/// Applies changes until `done(table)` holds (20 s at most).
async fn until(
    rx: &mut mpsc::Receiver<Vec<Change>>,
    t: &mut Table,
    what: &str,
    done: impl Fn(&Table) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done(t) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some(cs)) => {
                for (p, r) in cs {
                    match r {
                        Some(r) => t.insert(p, r.next_hop),
                        None => t.remove(&p),
                    };
                }
            }
            other => panic!("waiting for {what}: {other:?}; the table: {t:?}"),
        }
    }
}

#[test]
fn a_full_mesh_learns_every_pod_cidr_and_forgets_a_node_that_goes() {
    require_root();
    let (_sw, nodes) = lan(3);
    let converged = Arc::new(Barrier::new(3));
    let gone = Arc::new(Barrier::new(3));
    // The two that stay, until both saw the third go (the first to leave
    // would take its own route with it).
    let seen = Arc::new(Barrier::new(2));
    std::thread::scope(|s| {
        for (i, node) in nodes.iter().enumerate() {
            let (converged, gone, seen) = (converged.clone(), gone.clone(), seen.clone());
            s.spawn(move || {
                node.run(|| {
                    runtime().block_on(async {
                        let others = (0..3).filter(|j| *j != i).map(|j| (j, false)).collect();
                        let (tx, mut rx) = mpsc::channel(64);
                        let sp = Speaker::start(config(i, others, false), tx).await.unwrap();
                        sp.originate(vec![(Afi::Ipv4, pod_cidr(i))]).await;
                        let mut t = Table::new();
                        let want: Table = (0..3)
                            .filter(|j| *j != i)
                            .map(|j| (pod_cidr(j), IpAddr::V4(addr(j))))
                            .collect();
                        until(&mut rx, &mut t, "the mesh", |t| *t == want).await;
                        meet(&converged).await;
                        if i == 2 {
                            drop(sp);
                            meet(&gone).await;
                            return;
                        }
                        meet(&gone).await;
                        until(&mut rx, &mut t, "node 3 withdrawn", |t| {
                            !t.contains_key(&pod_cidr(2)) && t.contains_key(&pod_cidr(1 - i))
                        })
                        .await;
                        meet(&seen).await;
                    })
                })
            });
        }
    });
}

#[test]
fn clients_of_a_route_reflector_learn_each_other_through_it() {
    require_root();
    let (_sw, nodes) = lan(3);
    let converged = Arc::new(Barrier::new(3));
    std::thread::scope(|s| {
        for (i, node) in nodes.iter().enumerate() {
            let converged = converged.clone();
            s.spawn(move || {
                node.run(|| {
                    runtime().block_on(async {
                        // Node 0 reflects; 1 and 2 peer only with it.
                        let (neighbours, reflector) = match i {
                            0 => (vec![(1, true), (2, true)], true),
                            _ => (vec![(0, false)], false),
                        };
                        let (tx, mut rx) = mpsc::channel(64);
                        let sp = Speaker::start(config(i, neighbours, reflector), tx)
                            .await
                            .unwrap();
                        sp.originate(vec![(Afi::Ipv4, pod_cidr(i))]).await;
                        let mut t = Table::new();
                        let want: Table = (0..3)
                            .filter(|j| *j != i)
                            .map(|j| (pod_cidr(j), IpAddr::V4(addr(j))))
                            .collect();
                        until(&mut rx, &mut t, "every pod CIDR", |t| *t == want).await;
                        // Up until every node has converged.
                        meet(&converged).await;
                        drop(sp);
                    })
                })
            });
        }
    });
}

/// Node 2's speaker, with node 1 as its one neighbour at first; nodes 0
/// and 1 are bare sessions (their events tell what they saw), dialling
/// node 2 (the higher address waits). Node 0 is added at run time: its
/// session comes up and routes go both ways. Removed: it gets a Cease
/// (Peer De-configured), its route leaves node 2's table at once, and node
/// 1's session was never touched. Then node 1 made a reflector client: its
/// session is stopped (Other Configuration Change) and comes up again.
#[test]
fn a_neighbour_added_at_run_time_comes_up_and_one_removed_gets_a_cease_and_its_routes_go() {
    require_root();
    let (_sw, nodes) = lan(3);
    let added = Arc::new(Barrier::new(3));
    let removed = Arc::new(Barrier::new(3));
    let checked = Arc::new(Barrier::new(3));
    let restarted = Arc::new(Barrier::new(2));
    let neighbour = |j: usize| Neighbour::new(IpAddr::V4(addr(j)), 64512);
    std::thread::scope(|s| {
        let (a, r, c) = (added.clone(), removed.clone(), checked.clone());
        let again = restarted.clone();
        let speaker_node = &nodes[2];
        s.spawn(move || {
            speaker_node.run(|| {
                runtime().block_on(async {
                    let (tx, mut rx) = mpsc::channel(64);
                    let sp = Speaker::start(config(2, vec![(1, false)], false), tx)
                        .await
                        .unwrap();
                    sp.originate(vec![(Afi::Ipv4, pod_cidr(2))]).await;
                    let mut t = Table::new();
                    until(&mut rx, &mut t, "node 1's route", |t| {
                        t.contains_key(&pod_cidr(1))
                    })
                    .await;
                    sp.set_neighbours(vec![neighbour(1), neighbour(0)])
                        .await
                        .unwrap();
                    until(&mut rx, &mut t, "node 0's route", |t| {
                        t.get(&pod_cidr(0)) == Some(&IpAddr::V4(addr(0)))
                    })
                    .await;
                    meet(&a).await;
                    sp.set_neighbours(vec![neighbour(1)]).await.unwrap();
                    until(&mut rx, &mut t, "node 0's route withdrawn", |t| {
                        !t.contains_key(&pod_cidr(0)) && t.contains_key(&pod_cidr(1))
                    })
                    .await;
                    meet(&r).await;
                    meet(&c).await;
                    let client = Neighbour {
                        client: true,
                        ..neighbour(1)
                    };
                    sp.set_neighbours(vec![client]).await.unwrap();
                    meet(&again).await;
                })
            })
        });
        for (i, node) in nodes.iter().enumerate().take(2) {
            let meetings = [&added, &removed, &checked, &restarted].map(|b| b.clone());
            s.spawn(move || node.run(|| runtime().block_on(bare(i, meetings))));
        }
    });
}

async fn next(
    i: usize,
    rx: &mut mpsc::Receiver<podnet_bgp::peer::PeerEvent>,
) -> podnet_bgp::peer::PeerEvent {
    match tokio::time::timeout(Duration::from_secs(20), rx.recv()).await {
        Ok(Some(e)) => e,
        other => panic!("node {i}: waiting for an event: {other:?}"),
    }
}

/// Node `i` as a bare session with node 2: up, node 2's route heard, then
/// node 0 sees the Cease of its removal and node 1 sees nothing at all;
/// then node 1 sees its session started again.
async fn bare(i: usize, meetings: [Arc<Barrier>; 4]) {
    let [added, removed, checked, restarted] = meetings;
    use podnet_bgp::peer::{Announce, Peer, PeerEvent};
    use podnet_bgp::wire::{Origin, PathAttrs};
    let cfg = Config {
        local_as: 64512,
        peer_as: 64512,
        router_id: addr(i),
        hold_time: 9,
        connect_retry: Duration::from_secs(1),
        passive: false,
        families: vec![(Afi::Ipv4, Safi::Unicast)],
        graceful_restart: None,
        ttl_security: true,
    };
    let (tx, mut rx) = mpsc::channel(64);
    let peer = Peer::start(cfg, (addr(2), 179).into(), tx);
    let attrs = PathAttrs {
        origin: Some(Origin::Igp),
        as_path: vec![],
        next_hop: Some(addr(i)),
        local_pref: Some(100),
        ..Default::default()
    };
    peer.announce(Announce {
        routes: vec![(Afi::Ipv4, attrs, vec![pod_cidr(i)])],
    });
    while !matches!(next(i, &mut rx).await, PeerEvent::Up(_)) {}
    let want = match pod_cidr(2) {
        IpNet::V4(p) => p,
        IpNet::V6(_) => unreachable!(),
    };
    loop {
        if let PeerEvent::Update(u) = next(i, &mut rx).await {
            if u.nlri.contains(&want) {
                break;
            }
        }
    }
    meet(&added).await;
    if i == 0 {
        let why = loop {
            if let PeerEvent::Down(why) = next(i, &mut rx).await {
                break why;
            }
        };
        assert!(
            why.contains("NOTIFICATION Cease/Peer De-configured"),
            "{why}"
        );
    }
    meet(&removed).await;
    if i == 1 {
        while let Ok(e) = rx.try_recv() {
            assert!(
                !matches!(e, PeerEvent::Up(_) | PeerEvent::Down(_)),
                "node 1's session was touched: {e:?}"
            );
        }
    }
    meet(&checked).await;
    if i == 1 {
        let why = loop {
            if let PeerEvent::Down(why) = next(i, &mut rx).await {
                break why;
            }
        };
        assert!(
            why.contains("NOTIFICATION Cease/Other Configuration Change"),
            "{why}"
        );
        while !matches!(next(i, &mut rx).await, PeerEvent::Up(_)) {}
        meet(&restarted).await;
    }
    peer.stop();
}
