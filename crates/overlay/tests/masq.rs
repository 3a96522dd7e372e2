//! The masquerade table against the kernel, in a private namespace: it is
//! installed over netlink, a second sync changes nothing, what is deleted
//! behind the agent's back comes back, and removal removes it.

use podnet_overlay::masq::{self, MasqTable};
use podnet_testkit::TestNs;

/// `nft ARGS` inside the namespace (inspection and vandalism only).
fn nft(ns: &TestNs, args: &str) -> String {
    ns.nft(args)
}

#[test]
fn masquerade_table_installs_resyncs_repairs_and_goes() {
    let ns = TestNs::new("masq");
    let name = &ns;
    let with_tunnel = MasqTable {
        network: "10.244.0.0/16".parse().unwrap(),
        subnet: "10.244.1.0/24".parse().unwrap(),
        tunnel: Some(("192.168.200.11".parse().unwrap(), 8472)),
        ipv6: None,
    };
    // Another table of the family, with chains, sets and rules of its own,
    // is none of the masquerade table's business.
    nft(
        name,
        "-f - <<'EOF'\ntable ip other {\n\tset s { type ipv4_addr; }\n\tcounter c { }\n\tchain postrouting { type nat hook postrouting priority srcnat; ip saddr @s masquerade; }\n\tchain stray { counter; }\n}\nEOF",
    );
    ns.netns()
        .run(|| {
            let first = with_tunnel.sync().unwrap();
            assert!(!first.is_empty());
            assert_eq!(
                with_tunnel.sync().unwrap(),
                vec![],
                "a second sync is a no-op"
            );
        })
        .unwrap();
    let listed = nft(name, "list table ip podnet-masq");
    for want in [
        "type nat hook postrouting priority srcnat; policy accept;",
        "ip saddr 10.244.0.0/16 ip daddr 10.244.0.0/16 return",
        "ip saddr 10.244.0.0/16 ip daddr != 224.0.0.0/4 masquerade",
        "ip saddr != 10.244.0.0/16 ip daddr 10.244.1.0/24 return",
        "ip saddr != 10.244.0.0/16 ip daddr 10.244.0.0/16 masquerade",
        "type filter hook prerouting priority raw; policy accept;",
        "ip daddr 192.168.200.11 udp dport 8472 notrack",
        "ip saddr 192.168.200.11 udp dport 8472 notrack",
    ] {
        assert!(listed.contains(want), "{want:?} in\n{listed}");
    }

    // Behind the agent's back: a rule, then a chain, then the whole table.
    for vandalism in [
        "flush chain ip podnet-masq postrouting",
        "delete chain ip podnet-masq tunnel-out",
        "delete table ip podnet-masq",
    ] {
        nft(name, vandalism);
        ns.netns()
            .run(|| {
                assert!(!with_tunnel.sync().unwrap().is_empty(), "{vandalism}");
                assert_eq!(with_tunnel.sync().unwrap(), vec![], "after {vandalism}");
            })
            .unwrap();
        assert_eq!(
            nft(name, "list table ip podnet-masq"),
            listed,
            "{vandalism}"
        );
    }

    // Switching to host-gw drops the tunnel chains (a leftover of vxlan).
    let host_gw = MasqTable {
        tunnel: None,
        ..with_tunnel
    };
    ns.netns()
        .run(|| {
            assert!(!host_gw.sync().unwrap().is_empty());
            assert_eq!(host_gw.sync().unwrap(), vec![]);
        })
        .unwrap();
    let listed = nft(name, "list table ip podnet-masq");
    assert!(!listed.contains("tunnel"), "{listed}");

    ns.netns()
        .run(|| {
            assert!(masq::remove().unwrap());
            assert!(!masq::remove().unwrap(), "removing twice is fine");
        })
        .unwrap();
    assert_eq!(nft(name, "list tables"), "table ip other\n");
    assert!(nft(name, "list table ip other").contains("chain stray"));
}

/// A dual-stack node's IPv6 table: installed beside the IPv4 one,
/// repaired, dropped when the node is no longer dual-stack, and removed
/// with it.
#[test]
fn the_ipv6_table_comes_is_repaired_and_goes() {
    let ns = TestNs::new("masq6");
    let name = &ns;
    let single = MasqTable {
        network: "10.244.0.0/16".parse().unwrap(),
        subnet: "10.244.1.0/24".parse().unwrap(),
        tunnel: None,
        ipv6: None,
    };
    let dual = MasqTable {
        ipv6: Some((
            "fd00:10:244::/56".parse().unwrap(),
            "fd00:10:244:1::/64".parse().unwrap(),
        )),
        ..single
    };
    ns.netns()
        .run(|| {
            assert!(!dual.sync().unwrap().is_empty());
            assert_eq!(dual.sync().unwrap(), vec![]);
        })
        .unwrap();
    let listed6 = nft(name, "list table ip6 podnet-masq");
    for want in [
        "ip6 saddr fd00:10:244::/56 ip6 daddr fd00:10:244::/56 return",
        "ip6 saddr fd00:10:244::/56 ip6 daddr != ff00::/8 masquerade",
        "ip6 saddr != fd00:10:244::/56 ip6 daddr fd00:10:244:1::/64 return",
    ] {
        assert!(listed6.contains(want), "{want:?} in\n{listed6}");
    }
    nft(name, "delete table ip6 podnet-masq");
    ns.netns()
        .run(|| assert!(!dual.sync().unwrap().is_empty(), "repaired"))
        .unwrap();
    assert_eq!(nft(name, "list table ip6 podnet-masq"), listed6);
    ns.netns()
        .run(|| {
            assert!(!single.sync().unwrap().is_empty(), "v6 table dropped");
            assert_eq!(single.sync().unwrap(), vec![]);
        })
        .unwrap();
    assert_eq!(nft(name, "list tables"), "table ip podnet-masq\n");
    ns.netns()
        .run(|| {
            dual.sync().unwrap();
            assert!(masq::remove().unwrap());
        })
        .unwrap();
    assert_eq!(nft(name, "list tables"), "");
}
