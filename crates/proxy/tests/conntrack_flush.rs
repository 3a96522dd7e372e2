//! The proxy's flush of UDP conntrack entries towards removed endpoints,
//! against the kernel, with no `conntrack` tool to lean on: the agent's
//! image (FROM scratch) has none, and until this test the flush ran that
//! tool, so on a real kubelet it never happened (the agent only warned).
//! PATH is empty while it flushes, so any command it tried to run would
//! fail.

use std::collections::BTreeSet;
use std::net::{IpAddr, UdpSocket};

use podnet_kernel::conntrack::Table;
use podnet_proxy::stale::{flush_conntrack, stale_udp};
use podnet_testkit::TestNs;

#[test]
fn entries_from_a_removed_udp_endpoint_go_and_others_stay() {
    let ns = TestNs::new("ctf");
    // A fresh namespace tracks nothing until a rule needs conntrack.
    ns.nft("add table inet pnctf");
    ns.nft("add chain inet pnctf out '{ type filter hook output priority 0; }'");
    ns.nft("add rule inet pnctf out ct state new counter");
    let lo: IpAddr = "127.0.0.1".parse().unwrap();
    // Two UDP "endpoints" and a client talking to each.
    let (gone_port, kept_port) = ns.run(|| {
        let gone = UdpSocket::bind("127.0.0.1:0").unwrap();
        let kept = UdpSocket::bind("127.0.0.1:0").unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        for s in [&gone, &kept] {
            client.send_to(b"q", s.local_addr().unwrap()).unwrap();
            let mut b = [0u8; 8];
            let (_, from) = s.recv_from(&mut b).unwrap();
            s.send_to(b"a", from).unwrap();
            client.recv_from(&mut b).unwrap();
        }
        (
            gone.local_addr().unwrap().port(),
            kept.local_addr().unwrap().port(),
        )
    });
    let mut t = Table::in_netns(ns.netns()).unwrap();
    let udp_from = |t: &mut Table, port: u16| {
        t.list(None)
            .unwrap()
            .into_iter()
            .filter(|e| e.proto == 17 && e.reply.src == lo && e.reply.sport == port)
            .count()
    };
    assert_eq!(udp_from(&mut t, gone_port), 1);
    assert_eq!(udp_from(&mut t, kept_port), 1);

    let gone: BTreeSet<(IpAddr, u16)> = [(lo, gone_port)].into();
    let all = t.list(None).unwrap();
    assert_eq!(stale_udp(&all, &gone).len(), 1, "{all:?}");
    let path = std::env::var_os("PATH").unwrap_or_default();
    // SAFETY: the only test in this binary; no other thread reads env.
    unsafe { std::env::set_var("PATH", "") };
    ns.run(|| flush_conntrack(&gone));
    unsafe { std::env::set_var("PATH", path) };
    assert_eq!(udp_from(&mut t, gone_port), 0, "the stale entry stayed");
    assert_eq!(
        udp_from(&mut t, kept_port),
        1,
        "another endpoint's entry went"
    );
}
