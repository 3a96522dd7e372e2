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

/// A veth's far end is told apart by namespace id, not by index or
/// address (both repeat across namespaces): the host end's
/// `link_netnsid` is the id the host gives the pod's namespace, and a
/// namespace with no link to the host has no id there.
#[test]
fn a_veth_names_its_peer_namespace_by_id() {
    let host = TestNs::new("nsidh");
    let pod = TestNs::new("nsidp");
    let other = TestNs::new("nsido");
    let mut h = Handle::in_netns(host.netns()).unwrap();
    h.create_veth("pnh0", "eth0", Some(pod.netns().fd()), None, None)
        .unwrap();
    let end = h.require_link("pnh0").unwrap();
    let id = h.nsid_of(pod.netns()).unwrap();
    assert!(id.is_some(), "the pod's namespace got no id in the host's");
    assert_eq!(end.link_netnsid, id);
    assert_eq!(h.nsid_of(other.netns()).unwrap(), None);
    // Within one namespace a veth's peer has no namespace id.
    let mut p = Handle::in_netns(pod.netns()).unwrap();
    p.create_veth("pnx0", "pnx1", None, None, None).unwrap();
    assert_eq!(p.require_link("pnx0").unwrap().link_netnsid, None);
    // The pod's end names the host's namespace likewise.
    let eth0 = p.require_link("eth0").unwrap();
    assert_eq!(eth0.peer, Some(end.index));
    assert_eq!(eth0.link_netnsid, p.nsid_of(host.netns()).unwrap());
}

/// A macvlan is born in a pod's namespace on a parent in the host's,
/// with its mode read back; two in bridge mode on one parent reach each
/// other through it, and the host never sees them.
#[test]
fn macvlans_on_one_parent_reach_each_other_in_bridge_mode() {
    use podnet_kernel::{LinkKind, MacvlanMode, MacvlanSpec};
    use std::time::Duration;
    let host = TestNs::new("mvh");
    let a = TestNs::new("mva");
    let b = TestNs::new("mvb");
    let mut h = Handle::in_netns(host.netns()).unwrap();
    // A veth as the parent (no dummy links here), both ends up for carrier.
    h.create_veth("pnmv0", "pnmv1", None, None, None).unwrap();
    let parent = h.require_link("pnmv0").unwrap();
    h.set_up(parent.index).unwrap();
    h.set_up_by_name("pnmv1").unwrap();
    for (i, (ns, ip)) in [(&a, "10.77.0.1/24"), (&b, "10.77.0.2/24")]
        .into_iter()
        .enumerate()
    {
        let mac = [0x02, 0x4d, 0x56, 0, 0, i as u8 + 1];
        let spec = MacvlanSpec {
            name: "net1",
            master: parent.index,
            mode: MacvlanMode::Bridge,
            mtu: Some(1400),
            mac: Some(mac),
            bc_queue_len: Some(500),
        };
        h.create_macvlan(&spec, Some(ns.netns().fd())).unwrap();
        let mut p = Handle::in_netns(ns.netns()).unwrap();
        let l = p.require_link("net1").unwrap();
        assert_eq!(
            (&l.kind, l.macvlan_mode, l.mtu, l.mac),
            (
                &LinkKind::Macvlan,
                Some(MacvlanMode::Bridge),
                1400,
                Some(mac)
            )
        );
        p.add_addr(l.index, ip.parse().unwrap(), true).unwrap();
        p.set_up(l.index).unwrap();
    }
    assert!(
        h.link("net1").unwrap().is_none(),
        "born in the pods' namespaces"
    );
    let listener = b.run(|| std::net::TcpListener::bind("10.77.0.2:0").unwrap());
    let to = std::net::SocketAddr::new(
        "10.77.0.2".parse().unwrap(),
        listener.local_addr().unwrap().port(),
    );
    let c = a.run(|| std::net::TcpStream::connect_timeout(&to, Duration::from_secs(10)));
    assert!(c.is_ok(), "a reached b over the parent: {c:?}");
    // A parent that does not exist is named in the error.
    let spec = MacvlanSpec {
        name: "pnmv9",
        master: 999_999,
        mode: MacvlanMode::Bridge,
        mtu: None,
        mac: None,
        bc_queue_len: None,
    };
    let e = h.create_macvlan(&spec, None).unwrap_err();
    assert!(e.to_string().contains("macvlan pnmv9"), "{e}");
}
