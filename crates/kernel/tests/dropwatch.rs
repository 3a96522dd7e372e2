//! The kernel's drop reasons, read from the `skb:kfree_skb` tracepoint for
//! the packets one thread sends.

use std::net::UdpSocket;

use podnet_kernel::dropwatch::{gettid, DropWatch};
use podnet_testkit::{require_root, TestNs};

/// A datagram to a port nobody listens on is freed by the UDP stack with
/// `NO_SOCKET`, inside the sender's system call: the sender's watch has
/// it. Another thread's datagram is not in it.
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
            let w = DropWatch::start(gettid()).unwrap();
            // Another thread's drop, while the watch runs.
            std::thread::scope(|sc| {
                // A new thread starts in its creator's namespace.
                sc.spawn(|| {
                    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
                    s.send_to(b"other", closed).unwrap();
                })
                .join()
                .unwrap();
            });
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.send_to(b"probe", closed).unwrap();
            let drops = w.stop().unwrap();
            let ours: Vec<_> = drops.iter().filter(|d| d.reason == "NO_SOCKET").collect();
            assert_eq!(ours.len(), 1, "{drops:?}");
            assert_eq!(ours[0].protocol, 0x0800);
            assert!(ours[0].location.starts_with("__udp4_lib_rcv"), "{drops:?}");
        })
        .unwrap();
}
