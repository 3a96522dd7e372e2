//! What the interop tests share: two namespaces joined by a veth pair
//! (our speaker in one, the real daemon in the other), and waits that do
//! not block the runtime the peer's task runs on.

#![allow(dead_code)]

use std::time::Duration;

use podnet_bgp::peer::PeerEvent;
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

/// A process stopped with SIGSTOP (a hung node), continued when this is
/// dropped, even when the test fails: a stopped process cannot be
/// terminated, and its cleanup would wait forever.
pub struct Frozen(pub i32);

impl Frozen {
    pub fn freeze(pid: u32) -> Frozen {
        // SAFETY: a signal to a child the test started.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        Frozen(pid as i32)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}
