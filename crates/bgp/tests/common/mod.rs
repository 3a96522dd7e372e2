//! What the interop tests share: two namespaces joined by a veth pair
//! (our speaker in one, the real daemon in the other), and waits that do
//! not block the runtime the peer's task runs on.

#![allow(dead_code)]

pub mod raw;

use std::time::Duration;

use podnet_bgp::fsm::{Config, Negotiated};
use podnet_bgp::peer::{Announce, PeerEvent};
use podnet_bgp::wire::{Afi, AsSegment, MpReach, Origin, PathAttrs, Safi};
use podnet_testkit::TestNs;
use tokio::sync::mpsc;

/// Our side's addresses, and the daemon's.
pub const US: &str = "10.99.0.1";
pub const THEM: &str = "10.99.0.2";
pub const US6: &str = "fd00:99::1";
pub const THEM6: &str = "fd00:99::2";

/// Two namespaces joined by a veth pair, IPv4 and IPv6 on both ends
/// (IPv6 without duplicate address detection, so it is usable at once).
pub fn link(peer_tag: &str) -> (TestNs, TestNs) {
    let us = TestNs::new("bgp-us");
    let them = TestNs::new(peer_tag);
    us.sh(&format!(
        "ip link add pnb0 type veth peer name pnb1 netns {}",
        them.name()
    ));
    for (ns, dev, v4, v6) in [(&us, "pnb0", US, US6), (&them, "pnb1", THEM, THEM6)] {
        ns.sh(&format!(
            "ip link set lo up && ip addr add {v4}/24 dev {dev} && \
             ip addr add {v6}/64 dev {dev} nodad && ip link set {dev} up"
        ));
    }
    (us, them)
}

/// A runtime for the speaker, made on the thread that is in our namespace
/// (its sockets are made there).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Waits at `b` with the other threads of a test (each on a runtime of
/// its own) without blocking the runtime: the speaker goes on answering
/// its peers (a blocked runtime misses keepalives). Bounded: a thread
/// that failed never comes, and the others must fail too, not hang.
pub async fn meet(b: &std::sync::Arc<tokio::sync::Barrier>) {
    tokio::time::timeout(Duration::from_secs(60), b.wait())
        .await
        .expect("another thread never came to the meeting point (it failed: see above)");
}

/// Polls `f` until it holds (20 s at most) without blocking the runtime,
/// so the peer's task goes on meanwhile.
pub async fn until(what: &str, diag: &dyn Fn() -> String, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            diag()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The next event, or a panic naming what was awaited and what the
/// daemon said.
pub async fn next(
    rx: &mut mpsc::Receiver<PeerEvent>,
    what: &str,
    diag: &dyn Fn() -> String,
) -> PeerEvent {
    match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
        Ok(Some(e)) => e,
        other => panic!("waiting for {what}: {other:?}\n{}", diag()),
    }
}

/// BIRD 2 in `ns` with configuration `conf` (its log and control socket
/// in `dir`); stopped when dropped.
pub struct Bird<'a> {
    pub proc: podnet_testkit::Proc,
    ns: &'a TestNs,
    ctl: std::path::PathBuf,
}

impl<'a> Bird<'a> {
    pub fn start(ns: &'a TestNs, dir: &std::path::Path, conf: &str) -> Bird<'a> {
        let path = dir.join("bird.conf");
        std::fs::write(&path, conf).unwrap();
        let ctl = dir.join("bird.ctl");
        let mut cmd = ns.command("bird");
        cmd.arg("-f").arg("-c").arg(&path).arg("-s").arg(&ctl);
        let proc = podnet_testkit::Proc::spawn("bird", cmd, dir);
        Bird { proc, ns, ctl }
    }

    /// A `birdc` command's output. Its exit status says little ("Network
    /// not found" is a failure), and it is bounded: a frozen BIRD never
    /// answers, and a failure's message asks.
    pub fn birdc(&self, what: &str) -> String {
        let cmd = format!("timeout 2 birdc -s {} {what}", self.ctl.display());
        self.ns.try_sh(&cmd).1
    }

    /// What BIRD said and what its protocol `name` is doing, for a failure.
    pub fn diag(&self, name: &str) -> String {
        let proto = self.birdc(&format!("show protocols all {name}"));
        format!("BIRD's log:\n{}\n{proto}", self.proc.log())
    }
}

impl Drop for Bird<'_> {
    fn drop(&mut self) {
        self.proc.terminate(Duration::from_secs(5));
    }
}

/// Our side of a session with `peer_as` (AS 64512, hold time 9 s, a
/// connect retry of 1 s, no GTSM: the daemons' default).
pub fn session(peer_as: u32, families: Vec<(Afi, Safi)>) -> Config {
    Config {
        local_as: 64512,
        peer_as,
        router_id: US.parse().unwrap(),
        hold_time: 9,
        connect_retry: Duration::from_secs(1),
        passive: false,
        families,
        graceful_restart: None,
        ttl_security: false,
    }
}

/// Our routes: 10.244.1.0/24, and with `v6` also fd00:244:1::/64 (in
/// MP_REACH_NLRI), with AS path 64512 and our addresses as next hops.
pub fn ours(v6: bool) -> Announce {
    let attrs = |six: bool| PathAttrs {
        origin: Some(Origin::Igp),
        as_path: vec![AsSegment::Sequence(vec![64512])],
        next_hop: (!six).then(|| US.parse().unwrap()),
        mp_reach: six.then(|| MpReach {
            afi: Afi::Ipv6,
            safi: Safi::Unicast,
            next_hops: vec![US6.parse().unwrap()],
            nlri: vec![],
        }),
        ..Default::default()
    };
    let mut routes = vec![(
        Afi::Ipv4,
        attrs(false),
        vec!["10.244.1.0/24".parse().unwrap()],
    )];
    if v6 {
        routes.push((
            Afi::Ipv6,
            attrs(true),
            vec!["fd00:244:1::/64".parse().unwrap()],
        ));
    }
    Announce { routes }
}

/// Waits for the session to come up; its terms.
pub async fn up(rx: &mut mpsc::Receiver<PeerEvent>, diag: &dyn Fn() -> String) -> Negotiated {
    loop {
        if let PeerEvent::Up(n) = next(rx, "the session", diag).await {
            return n;
        }
    }
}

/// Waits for the session to go down; why.
pub async fn down(rx: &mut mpsc::Receiver<PeerEvent>, diag: &dyn Fn() -> String) -> String {
    loop {
        if let PeerEvent::Down(why) = next(rx, "the session going down", diag).await {
            return why;
        }
    }
}
