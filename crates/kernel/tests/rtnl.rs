//! rtnetlink edges in a throwaway namespace.

use ipnet::IpNet;
use podnet_kernel::Handle;
use podnet_testkit::TestNs;

#[test]
fn address_dump_for_one_link_is_filtered_and_links_skip_stats() {
    let ns = TestNs::new("rtnl");
    let mut h = Handle::in_netns(ns.netns()).unwrap();
    h.create_veth("pna0", "pnb0", None, None, None).unwrap();
    let a = h.require_link("pna0").unwrap();
    let b = h.require_link("pnb0").unwrap();
    let na: IpNet = "10.9.0.1/24".parse().unwrap();
    let nb: IpNet = "10.9.1.1/24".parse().unwrap();
    h.add_addr(a.index, na, true).unwrap();
    h.add_addr(b.index, nb, true).unwrap();

    let only_a = h.addrs(a.index).unwrap();
    assert_eq!(only_a.iter().map(|x| x.net).collect::<Vec<_>>(), vec![na]);
    assert!(only_a.iter().all(|x| x.index == a.index));
    let all = h.addrs(0).unwrap();
    assert!(all.iter().any(|x| x.net == na) && all.iter().any(|x| x.net == nb));
    // Strict checking is off again: unfiltered requests still work.
    assert!(h.links().unwrap().iter().any(|l| l.name == "pnb0"));
    assert_eq!(h.link_by_index(b.index).unwrap().unwrap().name, "pnb0");
    assert!(h.link("pnz9").unwrap().is_none());
}
