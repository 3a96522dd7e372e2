//! The proxier against the real kernel, in a throwaway namespace: the
//! fast path's IPv4 and IPv6 register layouts load, list and change.

mod common;

use common::{del, kv, put};
use podnet_proxy::proxier::Proxier;
use podnet_proxy::rules::Stack;
use podnet_testkit::TestNs;

fn service(cip: &str) -> podnet_api::Object {
    kv(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"clusterIP": cip, "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}]}
    }))
}

fn slice(family: &str, addrs: &[&str]) -> podnet_api::Object {
    kv(serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": family,
        "endpoints": addrs.iter().map(|a| serde_json::json!({"addresses": [a]})).collect::<Vec<_>>(),
        "ports": [{"port": 8080, "protocol": "TCP"}]
    }))
}

fn run(stack: Stack, family: &str, cip: &str, eps: [&str; 3], fam: &str) {
    let ns = TestNs::new(&format!("proxier-{fam}"));
    let nft = |args: &str| ns.nft(args);
    ns.run(|| {
        let mut p = Proxier::new("n1", vec![stack], podnet_daemon::Metrics::new()).unwrap();
        p.watch(&put(service(cip)));
        p.watch(&put(slice(family, &eps[..2])));
        assert!(p.sync().unwrap() > 0);
        let t = nft(&format!("list table {fam} podnet"));
        assert!(t.contains(&format!("{cip} . tcp . 80")), "{t}");
        assert!(t.contains("numgen random mod 2 map @fast-endpoints"), "{t}");
        assert!(nft(&format!("list set {fam} podnet fast-2")).contains(cip));
        // Nothing changed: nothing sent.
        assert_eq!(p.sync().unwrap(), 0);
        // A third endpoint: the port moves from fast-2 to fast-3, elements only.
        p.watch(&put(slice(family, &eps)));
        let ops = p.sync().unwrap();
        assert!(ops <= 6, "{ops} operations for one endpoint");
        assert!(!nft(&format!("list set {fam} podnet fast-2")).contains(cip));
        assert!(nft(&format!("list set {fam} podnet fast-3")).contains(cip));
        let m = nft(&format!("list map {fam} podnet fast-endpoints"));
        for e in eps {
            assert!(m.contains(e), "{e} missing in {m}");
        }
        // Deleted: its elements go.
        p.watch(&del(service(cip)));
        p.watch(&del(slice(family, &eps)));
        p.sync().unwrap();
        assert!(!nft(&format!("list table {fam} podnet")).contains(cip));
    });
}

#[test]
fn fast_path_ipv4_loads_lists_and_changes_by_elements() {
    run(
        Stack::v4("10.244.0.0/16".parse().unwrap()),
        "IPv4",
        "10.96.7.7",
        ["10.244.1.2", "10.244.2.2", "10.244.3.2"],
        "ip",
    );
}

#[test]
fn fast_path_ipv6_loads_lists_and_changes_by_elements() {
    run(
        Stack::v6(Some("fd00:244::/48".parse().unwrap())),
        "IPv6",
        "fd00:96::7",
        ["fd00:244:0:1::2", "fd00:244:0:2::2", "fd00:244:0:3::2"],
        "ip6",
    );
}

/// Both families from one proxier and one store, through the shared sync
/// layer: a chain someone added is noticed by the use count at the next
/// sync (even one with nothing to do) and the table rebuilt; a batch the
/// kernel refuses (an element someone else removed first) fails that sync,
/// and the next one replaces the table whole.
#[test]
fn a_table_changed_outside_is_rebuilt_and_a_refused_batch_is_followed_by_a_full_sync() {
    let ns = TestNs::new("proxier-drift");
    let nft = |args: &str| ns.nft(args);
    let dual = |name: &str| {
        kv(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"clusterIP": "10.96.7.8", "clusterIPs": ["10.96.7.8", "fd00:96::8"],
                     "ipFamilyPolicy": "RequireDualStack",
                     "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}]}
        }))
    };
    let stacks = vec![
        Stack::v4("10.244.0.0/16".parse().unwrap()),
        Stack::v6(Some("fd00:244::/48".parse().unwrap())),
    ];
    ns.run(|| {
        let mut p = Proxier::new("n1", stacks, podnet_daemon::Metrics::new()).unwrap();
        p.watch(&put(dual("web")));
        p.watch(&put(slice("IPv4", &["10.244.1.2"])));
        assert!(p.sync().unwrap() > 0);
        assert_eq!(p.sync().unwrap(), 0);
        assert!(nft("list table ip6 podnet").contains("fd00:96::8"));
        // Someone adds a chain to the IPv6 table: the next sync sees it.
        nft("add chain ip6 podnet intruder");
        assert!(p.sync().unwrap() > 0, "the drifted table is rebuilt");
        let t = nft("list table ip6 podnet");
        assert!(!t.contains("intruder") && t.contains("fd00:96::8"), "{t}");
        assert_eq!(p.sync().unwrap(), 0);
        // Someone removes the endpoint's element the proxy will remove.
        nft("delete element ip podnet fast-endpoints { 10.96.7.8 . tcp . 80 . 0 }");
        p.watch(&put(slice("IPv4", &["10.244.2.2"])));
        let e = p.sync().unwrap_err().to_string();
        assert!(e.contains("service sync (ipv4)"), "{e}");
        // The next sync is full: the table is right again.
        assert!(p.sync().unwrap() > 0);
        let t = nft("list map ip podnet fast-endpoints");
        assert!(t.contains("10.244.2.2") && !t.contains("10.244.1.2"), "{t}");
        assert_eq!(p.sync().unwrap(), 0);
    });
}
