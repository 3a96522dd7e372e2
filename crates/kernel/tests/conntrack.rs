//! conntrack against the kernel: a TCP connection over loopback in a
//! throwaway namespace, listed and deleted through ctnetlink.

use std::io::Write;
use std::net::{IpAddr, TcpListener, TcpStream};

use podnet_kernel::conntrack::{
    self, Entry, IpFamily, Table, Tuple, IPS_ASSURED, IPS_CONFIRMED, IPS_SEEN_REPLY,
    TCP_CONNTRACK_ESTABLISHED,
};
use podnet_testkit::TestNs;

fn find(entries: &[Entry], orig: &Tuple) -> Option<Entry> {
    entries
        .iter()
        .find(|e| e.proto == 6 && e.orig == *orig)
        .cloned()
}

#[test]
fn an_open_connection_is_listed_and_deleted() {
    let ns = TestNs::new("ct");
    // A fresh namespace tracks nothing until a rule needs conntrack.
    ns.nft("add table inet pnct");
    ns.nft("add chain inet pnct out '{ type filter hook output priority 0; }'");
    ns.nft("add rule inet pnct out ct state established counter");
    let (_server, client, _accepted) = ns.run(|| {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(server.local_addr().unwrap()).unwrap();
        // Accept returns once the handshake's last ACK went through the
        // hooks: the entry is established by then.
        let (accepted, _) = server.accept().unwrap();
        (server, client, accepted)
    });
    (&client).write_all(b"x").unwrap();
    let (local, peer) = (client.local_addr().unwrap(), client.peer_addr().unwrap());
    let lo: IpAddr = "127.0.0.1".parse().unwrap();
    let orig = Tuple {
        src: lo,
        dst: lo,
        sport: local.port(),
        dport: peer.port(),
        icmp: None,
    };

    let mut t = Table::in_netns(ns.netns()).unwrap();
    let all = t.list(None).unwrap();
    let e = find(&all, &orig).unwrap_or_else(|| panic!("{orig:?} not in {all:?}"));
    assert_eq!(
        e.reply,
        Tuple {
            src: lo,
            dst: lo,
            sport: peer.port(),
            dport: local.port(),
            icmp: None,
        }
    );
    let want = IPS_CONFIRMED | IPS_SEEN_REPLY | IPS_ASSURED;
    assert_eq!(e.status & want, want, "status {:#x}", e.status);
    assert_eq!(e.tcp_state, Some(TCP_CONNTRACK_ESTABLISHED));
    assert_eq!((e.zone, e.mark), (0, 0));
    assert!(e.id.is_some() && e.timeout > 0, "{e:?}");
    // The family filter applies.
    assert!(find(&t.list(Some(IpFamily::V4)).unwrap(), &orig).is_some());
    assert!(t.list(Some(IpFamily::V6)).unwrap().is_empty());
    // The free functions speak for the calling thread's namespace.
    assert!(ns
        .run(|| find(&conntrack::list(None).unwrap(), &orig))
        .is_some());
    assert!(find(&conntrack::list(None).unwrap(), &orig).is_none());

    assert!(t.delete(&e).unwrap());
    let after = t.list(None).unwrap();
    assert!(find(&after, &orig).is_none(), "{after:?}");
    // Gone already: false, not an error.
    assert!(!t.delete(&e).unwrap());
    assert!(!ns.run(|| conntrack::delete(&e)).unwrap());
}
