//! The Gateways' addresses on a node's loopback, in a namespace of the
//! test's own: put there, repaired when removed by hand, taken off when
//! no Gateway holds them, and nothing outside the pool touched.

use std::collections::BTreeSet;
use std::net::IpAddr;

use podnet_gateway::local;
use podnet_gateway::model::addresses::Pool;
use podnet_testkit::{require_root, TestNs};

fn lo_addrs(ns: &TestNs) -> String {
    ns.sh("ip -4 -o addr show dev lo | awk '{print $4}' | sort | tr '\\n' ' '")
}

#[test]
fn gateway_addresses_follow_the_assignment() {
    require_root();
    let ns = TestNs::new("gwlo");
    ns.sh("ip link set lo up && ip addr add 10.9.0.99/32 dev lo");
    let pool = Pool::parse("10.9.0.1-10.9.0.10").unwrap();
    let want = |ips: &[&str]| {
        ips.iter()
            .map(|s| s.parse::<IpAddr>().unwrap())
            .collect::<BTreeSet<_>>()
    };
    let c = ns
        .run(|| local::sync(&pool, &want(&["10.9.0.1", "10.9.0.2"])))
        .unwrap();
    assert_eq!(c.added.len(), 2);
    assert_eq!(
        lo_addrs(&ns),
        "10.9.0.1/32 10.9.0.2/32 10.9.0.99/32 127.0.0.1/8 "
    );
    // Someone removes one: the next sync puts it back.
    ns.sh("ip addr del 10.9.0.2/32 dev lo");
    let c = ns
        .run(|| local::sync(&pool, &want(&["10.9.0.1", "10.9.0.2"])))
        .unwrap();
    assert_eq!(
        (c.added, c.removed.len()),
        (want(&["10.9.0.2"]).into_iter().collect(), 0)
    );
    // Nothing held any more: the pool's addresses go, 10.9.0.99 stays.
    let c = ns.run(|| local::sync(&pool, &BTreeSet::new())).unwrap();
    assert_eq!(c.removed.len(), 2);
    assert_eq!(lo_addrs(&ns), "10.9.0.99/32 127.0.0.1/8 ");
    // A sync that changes nothing does nothing.
    assert_eq!(
        ns.run(|| local::sync(&pool, &BTreeSet::new())).unwrap(),
        local::Changed::default()
    );
}
