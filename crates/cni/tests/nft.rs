//! The CNI plugins' nftables tables against the kernel, each in a private
//! namespace: the bridge plugin's `ipMasq` table and MAC spoof check, and
//! portmap's table. Each is changed over netlink the way the plugins do it,
//! then observed: the kernel must hold exactly the plan (no change left to
//! make), lose something behind the plugin's back, get it back from the
//! next call, and let go of it on removal.

use std::sync::atomic::{AtomicUsize, Ordering};

use ipnet::IpNet;
use podnet_cni::plugins::netfilter::{self, MASQ_TABLE};
use podnet_cni::plugins::portmap::{self, PortMapping};
use podnet_kernel::Netns;
use podnet_nft::diff::{diff, ops, Change};
use podnet_nft::model::{Family, Table};
use podnet_nft::netlink::Conn;

/// A fresh namespace, removed when dropped (even on panic).
struct Ns {
    name: String,
    ns: Netns,
}

impl Ns {
    fn new(tag: &str) -> Ns {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "pn-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let ns = Netns::create_named(&name).unwrap();
        Ns { name, ns }
    }

    fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        self.ns.run(f).unwrap()
    }

    /// `nft ARGS` in the namespace (to inspect, or to vandalise).
    fn nft(&self, args: &str) -> String {
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("ip netns exec {} nft {args}", self.name)])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "nft {args}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// What it would take to bring the kernel's table to `want`.
    fn drift(&self, want: &Table) -> Vec<Change> {
        self.run(|| {
            let have = Conn::open().unwrap().observe(want).unwrap();
            diff(have.as_ref(), want)
        })
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Netns::delete_named(&self.name);
    }
}

fn nets(a: &[&str]) -> Vec<IpNet> {
    a.iter().map(|s| s.parse().unwrap()).collect()
}

#[test]
fn ip_masq_elements_are_owned_repaired_and_removed() {
    let ns = Ns::new("cnimasq");
    let (a, b) = (nets(&["10.1.0.2/24", "fd00::2/64"]), nets(&["10.1.0.3/24"]));
    ns.run(|| {
        netfilter::masq_add(&a, "n/a").unwrap();
        netfilter::masq_add(&b, "n/b").unwrap();
        netfilter::masq_add(&a, "n/a").unwrap();
    });
    let mut want = netfilter::masq_table();
    netfilter::add_pod(&mut want, &a, "n/a");
    netfilter::add_pod(&mut want, &b, "n/b");
    assert_eq!(ns.drift(&want), vec![], "the kernel holds the plan");
    let listed = ns.nft("list table inet podnet-cni");
    for line in [
        "ip saddr . ip daddr @nomasq4 return",
        "ip saddr @masq4 ip daddr != 224.0.0.0/4 masquerade",
        "ip6 saddr . ip6 daddr @nomasq6 return",
        "ip6 saddr @masq6 ip6 daddr != ff00::/8 masquerade",
        "10.1.0.2 comment \"n/a\"",
        "10.1.0.3 . 10.1.0.0/24 comment \"n/b\"",
        "fd00::2 . fd00::/64 comment \"n/a\"",
    ] {
        assert!(listed.contains(line), "{line:?} in\n{listed}");
    }
    // netlink and `nft -j` agree on what is there.
    let mut over_netlink = ns.run(|| netfilter::masq_listing(&mut Conn::open().unwrap()).unwrap());
    let mut over_nft = netfilter::parse_masq_listing(&ns.nft("-j list table inet podnet-cni"));
    let key = |e: &netfilter::MasqElement| (e.set.clone(), e.key.clone());
    over_netlink.sort_by_key(key);
    over_nft.sort_by_key(key);
    assert_eq!(over_netlink, over_nft);
    assert_eq!(over_netlink.len(), 6);

    // Behind the plugin's back: an element, then the rules. The next ADD
    // puts them back.
    ns.nft("'delete element inet podnet-cni masq4 { 10.1.0.2 }'");
    assert_eq!(ops(&ns.drift(&want)), 1);
    assert!(!ns.run(|| netfilter::masq_present(&a[0]).unwrap()));
    ns.run(|| netfilter::masq_add(&a, "n/a").unwrap());
    assert_eq!(ns.drift(&want), vec![]);
    ns.nft("flush chain inet podnet-cni postrouting");
    assert!(!ns.drift(&want).is_empty());
    ns.run(|| netfilter::masq_add(&b, "n/b").unwrap());
    assert_eq!(ns.drift(&want), vec![]);
    assert!(ns.run(|| netfilter::masq_present(&a[0]).unwrap()));

    // An element written before elements carried owners goes with DEL by
    // owner alone; the other pod's stay.
    ns.nft(
        "'delete element inet podnet-cni nomasq4 { 10.1.0.2 . 10.1.0.0/24 }; \
         add element inet podnet-cni nomasq4 { 10.1.0.2 . 10.1.0.0/24 }'",
    );
    ns.run(|| {
        netfilter::masq_del("n/a", &[]).unwrap();
        netfilter::masq_del("n/a", &[]).unwrap();
        assert!(!netfilter::masq_present(&a[0]).unwrap());
        assert!(!netfilter::masq_present(&a[1]).unwrap());
        assert!(netfilter::masq_present(&b[0]).unwrap());
    });
    let mut want = netfilter::masq_table();
    netfilter::add_pod(&mut want, &b, "n/b");
    assert_eq!(ns.drift(&want), vec![]);
    ns.run(|| {
        netfilter::masq_del("n/b", &b).unwrap();
        assert_eq!(ns.drift(&netfilter::masq_table()), vec![]);
        assert!(Conn::open()
            .unwrap()
            .delete_table(Family::Inet, MASQ_TABLE)
            .unwrap());
        // With no table, DEL and CHECK have nothing to find.
        netfilter::masq_del("n/b", &b).unwrap();
        assert!(!netfilter::masq_present(&b[0]).unwrap());
    });
    assert_eq!(ns.nft("list tables"), "");
}

#[test]
fn mac_spoof_check_is_added_repaired_and_removed() {
    let ns = Ns::new("cnispoof");
    let mac = "02:00:0a:01:00:02";
    ns.run(|| {
        netfilter::macspoof_add("veth-a", mac).unwrap();
        netfilter::macspoof_add("veth-a", mac).unwrap();
    });
    let mut want = netfilter::spoof_table();
    for c in netfilter::macspoof_add_changes("veth-a", mac).unwrap() {
        if let Change::AddElems { set, elems } = c {
            want.sets.get_mut(&set).unwrap().elements.extend(elems);
        }
    }
    assert_eq!(ns.drift(&want), vec![]);
    let listed = ns.nft("list table bridge podnet-cni");
    for line in [
        "type filter hook prerouting priority dstnat; policy accept;",
        "elements = { \"veth-a\" }",
        "iifname @spoofports iifname . ether saddr != @spoofok drop",
        "\"veth-a\" . 02:00:0a:01:00:02",
    ] {
        assert!(listed.contains(line), "{line:?} in\n{listed}");
    }
    ns.nft("'delete element bridge podnet-cni spoofok { \"veth-a\" . 02:00:0a:01:00:02 }'");
    assert_eq!(ops(&ns.drift(&want)), 1);
    ns.run(|| netfilter::macspoof_add("veth-a", mac).unwrap());
    assert_eq!(ns.drift(&want), vec![]);
    ns.run(|| {
        netfilter::macspoof_del("veth-a", Some(mac)).unwrap();
        netfilter::macspoof_del("veth-a", Some(mac)).unwrap();
        netfilter::macspoof_del("veth-a", None).unwrap();
    });
    assert_eq!(ns.drift(&netfilter::spoof_table()), vec![]);
    assert!(ns.run(|| Conn::open()
        .unwrap()
        .delete_table(Family::Bridge, MASQ_TABLE)
        .unwrap()));
}

#[test]
fn port_mappings_are_added_checked_repaired_and_removed() {
    let ns = Ns::new("cnipm");
    let maps = vec![
        PortMapping {
            host_port: 8080,
            container_port: 80,
            protocol: "tcp".into(),
            host_ip: None,
        },
        PortMapping {
            host_port: 5353,
            container_port: 53,
            protocol: "udp".into(),
            host_ip: Some("192.0.2.1".parse().unwrap()),
        },
    ];
    let els = portmap::plan(&maps, &nets(&["10.1.0.5/24", "fd00::5/64"]), true);
    ns.run(|| {
        portmap::add_elements(&els).unwrap();
        portmap::add_elements(&els).unwrap();
        assert_eq!(portmap::check_elements(&els).unwrap(), None);
    });
    let mut want = portmap::table();
    for c in portmap::add_changes(&els).unwrap() {
        if let Change::AddElems { set, elems } = c {
            want.sets.get_mut(&set).unwrap().elements.extend(elems);
        }
    }
    assert_eq!(ns.drift(&want), vec![]);
    let listed = ns.nft("list table inet podnet-portmap");
    for line in [
        "fib daddr type local jump hostports",
        "dnat ip to ip daddr . meta l4proto . th dport map @hp4",
        "meta nfproto ipv4 dnat ip to meta l4proto . th dport map @hp4any",
        "meta nfproto ipv6 dnat ip6 to meta l4proto . th dport map @hp6any",
        "ct status dnat ip saddr 127.0.0.0/8 ip daddr @snat4 masquerade",
        "ct status dnat ip6 saddr ::1 ip6 daddr @snat6 masquerade",
        "ct status dnat ip saddr . ip daddr @hairpin4 masquerade",
        "tcp . 8080 : 10.1.0.5 . 80",
        "192.0.2.1 . udp . 5353 : 10.1.0.5 . 53",
        "10.1.0.0/24 . 10.1.0.5",
    ] {
        assert!(listed.contains(line), "{line:?} in\n{listed}");
    }

    // Another pod asking for the same host port is refused.
    let other = portmap::plan(&maps[..1], &nets(&["10.1.0.9/24"]), true);
    let e = ns.run(|| portmap::add_elements(&other).unwrap_err());
    assert!(e.is_exists(), "{e}");
    assert_eq!(ns.drift(&want), vec![], "a refused ADD changes nothing");

    // Behind the plugin's back: CHECK notices, the next ADD repairs.
    ns.nft("'delete element inet podnet-portmap hp4any { tcp . 8080 }'");
    assert_eq!(ops(&ns.drift(&want)), 1);
    ns.run(|| {
        let problem = portmap::check_elements(&els).unwrap().unwrap();
        assert!(problem.contains("missing from hp4any"), "{problem}");
        portmap::add_elements(&els).unwrap();
    });
    assert_eq!(ns.drift(&want), vec![]);

    ns.run(|| {
        portmap::del_elements(&els).unwrap();
        portmap::del_elements(&els).unwrap();
        assert!(portmap::check_elements(&els).unwrap().is_some());
    });
    assert_eq!(ns.drift(&portmap::table()), vec![]);
    assert!(ns.run(|| Conn::open()
        .unwrap()
        .delete_table(Family::Inet, portmap::TABLE)
        .unwrap()));
    ns.run(|| portmap::del_elements(&els).unwrap());
    assert_eq!(ns.nft("list tables"), "");
}
