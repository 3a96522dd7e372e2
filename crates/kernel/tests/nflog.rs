//! nflog against the kernel: an nftables `log group` rule in a throwaway
//! namespace, and the packets it logs read back through a [`Listener`].

use std::net::{IpAddr, UdpSocket};
use std::time::{Duration, Instant};

use podnet_kernel::nflog::{parse_flow, Flow, Listener, LogPacket};
use podnet_testkit::TestNs;

const GROUP: u16 = 7;

/// Reads until `want` packets arrived, failing after `deadline`.
fn read(l: &mut Listener, want: usize, deadline: Duration) -> Vec<LogPacket> {
    let end = Instant::now() + deadline;
    let mut got = Vec::new();
    while got.len() < want {
        assert!(
            Instant::now() < end,
            "timed out waiting for {want} logged packets; got {got:?}"
        );
        got.extend(l.recv().unwrap());
    }
    got
}

#[test]
fn log_group_packets_carry_prefix_flow_and_sequence() {
    let ns = TestNs::new("nflog");
    ns.nft("add table inet pnlog");
    ns.nft("add chain inet pnlog out '{ type filter hook output priority 0; }'");
    ns.nft(&format!(
        "add rule inet pnlog out udp dport 9 log prefix '\"pn-test\"' group {GROUP}"
    ));
    // The listener and the senders live in the namespace.
    let (mut l, v4, v6) = ns.run(|| {
        (
            Listener::bind(GROUP).unwrap(),
            UdpSocket::bind("127.0.0.1:0").unwrap(),
            UdpSocket::bind("[::1]:0").unwrap(),
        )
    });
    l.set_timeout(Some(Duration::from_millis(200))).unwrap();
    // The group is taken: a second socket may not bind it.
    let again = ns
        .run(|| Listener::bind(GROUP))
        .err()
        .expect("group bound twice");
    assert!(again.to_string().contains("group 7"), "{again}");

    v4.send_to(b"hello", "127.0.0.1:9").unwrap();
    v6.send_to(b"hello", "[::1]:9").unwrap();
    let got = read(&mut l, 2, Duration::from_secs(10));
    assert_eq!(got.len(), 2, "{got:?}");

    let flows: Vec<Flow> = got
        .iter()
        .map(|p| parse_flow(&p.payload).unwrap_or_else(|| panic!("not IP: {p:?}")))
        .collect();
    let want = |src: &UdpSocket, dst: &str| Flow {
        src: src.local_addr().unwrap().ip(),
        dst: dst.parse::<IpAddr>().unwrap(),
        proto: 17,
        sport: src.local_addr().unwrap().port(),
        dport: 9,
    };
    assert_eq!(flows, vec![want(&v4, "127.0.0.1"), want(&v6, "::1")]);
    assert!(got.iter().all(|p| p.prefix == "pn-test"), "{got:?}");
    assert_eq!(
        got.iter().map(|p| p.family).collect::<Vec<_>>(),
        vec![libc::AF_INET as u8, libc::AF_INET6 as u8]
    );
    // 20 (IPv4) + 8 (UDP) + 5 bytes: shorter than the copy range, whole.
    assert_eq!(got[0].payload.len(), 33);
    assert!(got[0].payload.ends_with(b"hello"));
    let seq0 = got[0].seq.expect("sequence numbers were asked for");
    assert_eq!(got[1].seq, Some(seq0.wrapping_add(1)));
    assert_eq!(l.lost(), 0);

    // A long packet is cut at the copy range.
    v4.send_to(&[0u8; 1000], "127.0.0.1:9").unwrap();
    let long = read(&mut l, 1, Duration::from_secs(10));
    assert_eq!(long[0].payload.len(), 128);
    assert_eq!(parse_flow(&long[0].payload), Some(flows[0]));
    assert_eq!(long[0].seq, Some(seq0.wrapping_add(2)));

    // Unmatched traffic is not logged: the timeout returns nothing.
    v4.send_to(b"x", "127.0.0.1:10").unwrap();
    assert_eq!(l.recv().unwrap(), vec![]);
    assert_eq!(l.lost(), 0);
}

#[test]
fn an_overrun_is_counted_with_the_packets_it_dropped() {
    let ns = TestNs::new("nflogx");
    ns.nft("add table ip pnlog");
    ns.nft("add chain ip pnlog out '{ type filter hook output priority 0; }'");
    ns.nft(&format!(
        "add rule ip pnlog out udp dport 9 log group {GROUP}"
    ));
    let (mut l, tx) = ns.run(|| {
        (
            Listener::bind(GROUP).unwrap(),
            UdpSocket::bind("127.0.0.1:0").unwrap(),
        )
    });
    l.set_timeout(Some(Duration::from_millis(200))).unwrap();
    // Room for one batch: the kernel queues a datagram while the buffer
    // is below its limit, so the first batch gets in and the rest do not.
    l.set_buffer(0).unwrap();
    // Each full batch is sent from inside the send that completes it,
    // so when the last send returns, three batches have been offered.
    let batch = podnet_kernel::nflog::QUEUE_THRESHOLD as usize;
    for _ in 0..3 * batch {
        tx.send_to(b"x", "127.0.0.1:9").unwrap();
    }
    let first = read(&mut l, batch, Duration::from_secs(10));
    assert_eq!(first.len(), batch);
    let seq0 = first[0].seq.unwrap();
    // The overrun shows up once the queue is drained.
    let end = Instant::now() + Duration::from_secs(10);
    while l.lost() == 0 {
        assert!(Instant::now() < end, "no overrun reported");
        assert_eq!(l.recv().unwrap(), vec![]);
    }
    assert_eq!(l.lost(), 1);

    // The next packet that gets through shows how many were dropped.
    tx.send_to(b"x", "127.0.0.1:9").unwrap();
    let next = read(&mut l, 1, Duration::from_secs(10));
    assert_eq!(next[0].seq, Some(seq0.wrapping_add(3 * batch as u32)));
    assert_eq!(l.lost(), 1 + 2 * batch as u64);
}
