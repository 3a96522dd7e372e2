//! The kernel's drop reasons, read from the `skb:kfree_skb` tracepoint for
//! the packets one thread sends.

use std::net::UdpSocket;

use podnet_kernel::dropwatch::{gettid, DropWatch};
use podnet_testkit::{require_root, TestNs};

/// A datagram to a port nobody listens on is freed by the UDP stack with
/// `NO_SOCKET`, inside the sender's system call: the sender's watch has
/// it, and a watch on another thread does not.
#[test]
fn a_datagram_to_a_closed_port_is_dropped_for_no_socket() {
    require_root();
    let ns = TestNs::new("drop");
    ns.netns()
        .run(|| {
            podnet_kernel::Handle::new()
                .and_then(|mut h| {
                    let lo = h.require_link("lo")?;
                    h.set_up(lo.index)
                })
                .unwrap();
            let closed = {
                let s = UdpSocket::bind("127.0.0.1:0").unwrap();
                s.local_addr().unwrap()
            };
            // The kernel finishes the datagram's receive inside the send
            // unless its softirq thread is busy (a loaded machine): then
            // the drop is ksoftirqd's, not ours. So: a few tries.
            let mut seen = Vec::new();
            for _ in 0..50 {
                let w = DropWatch::start(gettid()).unwrap();
                let s = UdpSocket::bind("127.0.0.1:0").unwrap();
                s.send_to(b"probe", closed).unwrap();
                seen = w.stop().unwrap();
                seen.retain(|d| d.reason == "NO_SOCKET");
                if !seen.is_empty() {
                    break;
                }
            }
            assert!(
                seen.iter()
                    .any(|d| d.protocol == 0x0800 && d.location.starts_with("__udp4_lib_rcv")),
                "our datagram's drop was never seen: {seen:?}"
            );

            // A watch on another thread, which sends nothing while we do,
            // records none of our drops.
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let (tid_tx, tid_rx) = std::sync::mpsc::channel();
            std::thread::scope(|sc| {
                sc.spawn(move || {
                    tid_tx.send(gettid()).unwrap();
                    let _ = rx.recv();
                });
                let w = DropWatch::start(tid_rx.recv().unwrap()).unwrap();
                let s = UdpSocket::bind("127.0.0.1:0").unwrap();
                for _ in 0..5 {
                    s.send_to(b"probe", closed).unwrap();
                }
                let theirs = w.stop().unwrap();
                drop(tx);
                assert!(theirs.is_empty(), "{theirs:?}");
            });
        })
        .unwrap();
}
