//! The allocator's rules, one test each, and a randomized run that checks
//! after every step that no address is held twice (except shared under
//! MetalLB's rule) and that every address is in a pool serving its Service.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::pool::IPAddressPool;
use serde_json::{json, Value};

use super::*;

fn pool(name: &str, spec: Value) -> IPAddressPool {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

fn pools(ps: &[IPAddressPool]) -> Pools {
    let (p, bad) = Pools::new(ps);
    assert!(bad.is_empty(), "{bad:?}");
    p
}

/// A LoadBalancer Service `shop/<name>` with `spec` merged in, these
/// annotations, and the status addresses given.
fn lb(name: &str, spec: Value, annotations: Value, status: &[&str]) -> Service {
    let mut s = json!({"type": "LoadBalancer", "ports": [{"port": 80}], "selector": {"app": name}});
    for (k, v) in spec.as_object().unwrap() {
        s[k] = v.clone();
    }
    let labels = s.get("labels").cloned().unwrap_or(json!({}));
    s.as_object_mut().unwrap().remove("labels");
    let ingress: Vec<Value> = status.iter().map(|ip| json!({"ip": ip})).collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop", "labels": labels, "annotations": annotations},
        "spec": s,
        "status": {"loadBalancer": {"ingress": ingress}}}))
    .unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn assigned(d: &Decision) -> Vec<String> {
    match d {
        Decision::Assigned(ips) => ips.iter().map(|i| i.to_string()).collect(),
        d => panic!("not assigned: {d:?}"),
    }
}

fn pending(d: &Decision) -> &str {
    match d {
        Decision::Pending(why) => why,
        d => panic!("not pending: {d:?}"),
    }
}

fn no_labels() -> BTreeMap<String, String> {
    BTreeMap::new()
}

#[test]
fn the_first_pool_by_name_with_auto_assign_that_serves_the_service() {
    let ps = pools(&[
        pool("b-lan", json!({"addresses": ["192.0.2.0/30"]})),
        pool(
            "a-manual",
            json!({"addresses": ["198.51.100.0/30"], "autoAssign": false}),
        ),
        pool(
            "c-edge",
            json!({"addresses": ["203.0.113.0/30"],
            "serviceSelector": {"matchLabels": {"tier": "edge"}}}),
        ),
        pool(
            "0-team",
            json!({"addresses": ["203.0.113.8/30"],
            "namespaceSelector": {"matchLabels": {"team": "red"}}}),
        ),
    ]);
    let mut a = Allocator::new(&ps, Holdings::default());
    let web = lb("web", json!({}), json!({}), &[]);
    assert_eq!(assigned(&a.assign(&web, &no_labels())), ["192.0.2.0"]);
    let api = lb("api", json!({}), json!({}), &[]);
    assert_eq!(
        assigned(&a.assign(&api, &no_labels())),
        ["192.0.2.1"],
        "lowest free"
    );
    // The namespace's labels pick 0-team first.
    let red: BTreeMap<String, String> = [("team".to_string(), "red".to_string())].into();
    let red_svc = lb("red", json!({}), json!({}), &[]);
    assert_eq!(assigned(&a.assign(&red_svc, &red)), ["203.0.113.8"]);
    // The Service's labels alone do not pass c-edge before b-lan (names).
    let edge = lb("edge", json!({"labels": {"tier": "edge"}}), json!({}), &[]);
    assert_eq!(assigned(&a.assign(&edge, &no_labels())), ["192.0.2.2"]);
    // The annotation picks a pool, autoAssign or not.
    let manual = lb(
        "manual",
        json!({}),
        json!({POOL_ANNOTATION: "a-manual"}),
        &[],
    );
    assert_eq!(assigned(&a.assign(&manual, &no_labels())), ["198.51.100.0"]);
    // b-lan full: the next pool that serves (c-edge does not serve it).
    let d = lb("d", json!({}), json!({}), &[]);
    assert_eq!(assigned(&a.assign(&d, &no_labels())), ["192.0.2.3"]);
    let e = lb("e", json!({}), json!({}), &[]);
    assert_eq!(
        pending(&a.assign(&e, &no_labels())),
        "no free IPv4 address in pools b-lan"
    );
    let e_edge = lb("e", json!({"labels": {"tier": "edge"}}), json!({}), &[]);
    assert_eq!(assigned(&a.assign(&e_edge, &no_labels())), ["203.0.113.0"]);
}

#[test]
fn pool_annotations_that_cannot_be_followed_say_why() {
    let ps = pools(&[pool(
        "edge",
        json!({"addresses": ["192.0.2.0/30"],
        "serviceSelector": {"matchLabels": {"tier": "edge"}}}),
    )]);
    let mut a = Allocator::new(&ps, Holdings::default());
    let s = lb("web", json!({}), json!({POOL_ANNOTATION: "lan"}), &[]);
    assert_eq!(
        pending(&a.assign(&s, &no_labels())),
        "annotation podnet.io/address-pool: there is no IPAddressPool \"lan\""
    );
    let s = lb("web", json!({}), json!({POOL_ANNOTATION: "edge"}), &[]);
    assert_eq!(
        pending(&a.assign(&s, &no_labels())),
        "annotation podnet.io/address-pool: pool edge does not serve this Service \
         (its serviceSelector or namespaceSelector)"
    );
    let s = lb("web", json!({}), json!({}), &[]);
    assert_eq!(
        pending(&a.assign(&s, &no_labels())),
        "no IPAddressPool serves this Service (by its serviceSelector and namespaceSelector)"
    );
    let none = Pools::default();
    let mut a = Allocator::new(&none, Holdings::default());
    assert_eq!(
        pending(&a.assign(&s, &no_labels())),
        "there are no IPAddressPools"
    );
    let ps = pools(&[pool(
        "manual",
        json!({"addresses": ["192.0.2.0/30"], "autoAssign": false}),
    )]);
    let mut a = Allocator::new(&ps, Holdings::default());
    assert_eq!(
        pending(&a.assign(&s, &no_labels())),
        "the pools that serve this Service (manual) have autoAssign off: name one with the \
         annotation podnet.io/address-pool, or ask for an address"
    );
}

#[test]
fn requested_addresses_are_honoured_only_when_served_and_free() {
    let ps = pools(&[
        pool(
            "lan",
            json!({"addresses": ["192.0.2.0/28"], "autoAssign": false}),
        ),
        pool(
            "edge",
            json!({"addresses": ["198.51.100.0/28"],
            "serviceSelector": {"matchLabels": {"tier": "edge"}}}),
        ),
    ]);
    let mut a = Allocator::new(&ps, Holdings::default());
    let web = lb(
        "web",
        json!({"loadBalancerIP": "192.0.2.7"}),
        json!({}),
        &[],
    );
    assert_eq!(
        assigned(&a.assign(&web, &no_labels())),
        ["192.0.2.7"],
        "autoAssign off does not stop a request"
    );
    let thief = lb(
        "thief",
        json!({}),
        json!({IPS_ANNOTATION: "192.0.2.7"}),
        &[],
    );
    assert_eq!(
        pending(&a.assign(&thief, &no_labels())),
        "192.0.2.7 is already in use by Service shop/web"
    );
    let out = lb(
        "out",
        json!({"loadBalancerIP": "203.0.113.1"}),
        json!({}),
        &[],
    );
    assert_eq!(
        pending(&a.assign(&out, &no_labels())),
        "203.0.113.1 is in no IPAddressPool"
    );
    let edge = lb(
        "e",
        json!({"loadBalancerIP": "198.51.100.1"}),
        json!({}),
        &[],
    );
    assert_eq!(
        pending(&a.assign(&edge, &no_labels())),
        "198.51.100.1 is in pool edge, which does not serve this Service"
    );
    let other_pool = lb(
        "p",
        json!({"loadBalancerIP": "192.0.2.8"}),
        json!({POOL_ANNOTATION: "edge"}),
        &[],
    );
    let d = a.assign(&other_pool, &no_labels());
    assert!(pending(&d).contains("pool edge does not serve"), "{d:?}");
    // web lets go (deleted: released by the caller), the thief gets it.
    a.holdings.release(&key_of(&web));
    assert_eq!(assigned(&a.assign(&thief, &no_labels())), ["192.0.2.7"]);
    // A refused request holds nothing: what the Service had is given back.
    let moved = lb(
        "thief",
        json!({}),
        json!({IPS_ANNOTATION: "203.0.113.9"}),
        &["192.0.2.7"],
    );
    assert!(pending(&a.assign(&moved, &no_labels())).contains("in no IPAddressPool"));
    assert!(a
        .holdings
        .free_for(ip("192.0.2.7"), &("x".into(), "y".into())));
}

#[test]
fn current_addresses_are_kept_while_valid_and_taken_back_when_not() {
    let ps = pools(&[pool("lan", json!({"addresses": ["192.0.2.0/28"]}))]);
    let mut a = Allocator::new(&ps, Holdings::default());
    let web = lb("web", json!({}), json!({}), &["192.0.2.9"]);
    a.seed(&web);
    assert_eq!(
        assigned(&a.assign(&web, &no_labels())),
        ["192.0.2.9"],
        "not moved to .0"
    );
    // The pool shrinks away from it: taken back, replaced from the pool.
    let smaller = pools(&[pool("lan", json!({"addresses": ["192.0.2.0/29"]}))]);
    let mut a = Allocator::new(&smaller, Holdings::default());
    a.seed(&web);
    assert_eq!(assigned(&a.assign(&web, &no_labels())), ["192.0.2.0"]);
    // No pool at all: nothing.
    let none = Pools::default();
    let mut a = Allocator::new(&none, Holdings::default());
    a.seed(&web);
    assert_eq!(
        pending(&a.assign(&web, &no_labels())),
        "there are no IPAddressPools"
    );
    assert_eq!(a.holdings.of(&key_of(&web)).count(), 0);
    // A pool that stops selecting the Service takes it back too.
    let picky = pools(&[pool(
        "lan",
        json!({"addresses": ["192.0.2.0/28"],
        "serviceSelector": {"matchLabels": {"tier": "edge"}}}),
    )]);
    let mut a = Allocator::new(&picky, Holdings::default());
    a.seed(&web);
    assert!(matches!(a.assign(&web, &no_labels()), Decision::Pending(_)));
    // An address buggy under avoidBuggyIPs is taken back.
    let avoid = pools(&[pool(
        "lan",
        json!({"addresses": ["192.0.2.0/24"], "avoidBuggyIPs": true}),
    )]);
    let mut a = Allocator::new(&avoid, Holdings::default());
    let zero = lb("zero", json!({}), json!({}), &["192.0.2.0"]);
    a.seed(&zero);
    assert_eq!(assigned(&a.assign(&zero, &no_labels())), ["192.0.2.1"]);
}

#[test]
fn not_load_balancers_and_other_classes() {
    let ps = pools(&[pool("lan", json!({"addresses": ["192.0.2.0/28"]}))]);
    let mut a = Allocator::new(&ps, Holdings::default());
    let was = lb("web", json!({}), json!({}), &["192.0.2.3"]);
    a.seed(&was);
    let now = lb(
        "web",
        json!({"type": "ClusterIP"}),
        json!({}),
        &["192.0.2.3"],
    );
    assert_eq!(a.assign(&now, &no_labels()), Decision::NotLoadBalancer);
    assert!(a
        .holdings
        .free_for(ip("192.0.2.3"), &("x".into(), "y".into())));
    let other = lb(
        "cloud",
        json!({"loadBalancerClass": "example.com/cloud"}),
        json!({}),
        &["192.0.2.0"],
    );
    a.seed(&other);
    assert_eq!(
        a.assign(&other, &no_labels()),
        Decision::OtherClass("example.com/cloud".into())
    );
    // Its status is not ours: .0 stays free for our Services.
    let ours = lb(
        "ours",
        json!({"loadBalancerClass": LB_CLASS}),
        json!({}),
        &[],
    );
    assert_eq!(assigned(&a.assign(&ours, &no_labels())), ["192.0.2.0"]);
}

#[test]
fn families_single_prefer_and_require_dual_stack() {
    let both = pools(&[pool(
        "lan",
        json!({"addresses": ["192.0.2.0/30", "2001:db8::/126"]}),
    )]);
    let mut a = Allocator::new(&both, Holdings::default());
    let v6 = lb("v6", json!({"ipFamilies": ["IPv6"]}), json!({}), &[]);
    assert_eq!(assigned(&a.assign(&v6, &no_labels())), ["2001:db8::"]);
    let req = lb(
        "req",
        json!({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6", "IPv4"]}),
        json!({}),
        &[],
    );
    assert_eq!(
        assigned(&a.assign(&req, &no_labels())),
        ["2001:db8::1", "192.0.2.0"]
    );
    let v4only = pools(&[pool("lan", json!({"addresses": ["192.0.2.0/30"]}))]);
    let mut a = Allocator::new(&v4only, Holdings::default());
    let prefer = lb(
        "prefer",
        json!({"ipFamilyPolicy": "PreferDualStack"}),
        json!({}),
        &[],
    );
    assert_eq!(assigned(&a.assign(&prefer, &no_labels())), ["192.0.2.0"]);
    assert_eq!(
        pending(&a.assign(&req, &no_labels())),
        "no pool that serves this Service (lan) has IPv6 addresses"
    );
    assert_eq!(a.holdings.of(&key_of(&req)).count(), 0, "all or nothing");
    let bad = lb(
        "bad",
        json!({"loadBalancerIP": "2001:db8::1", "clusterIP": "10.96.0.5"}),
        json!({}),
        &[],
    );
    assert_eq!(
        pending(&a.assign(&bad, &no_labels())),
        "2001:db8::1 is IPv6 but the Service is IPv4 single-stack"
    );
}

#[test]
fn services_with_one_sharing_key_and_disjoint_ports_share() {
    let ps = pools(&[pool("lan", json!({"addresses": ["192.0.2.0/30"]}))]);
    let mut a = Allocator::new(&ps, Holdings::default());
    let share = |name: &str, proto: &str, key: &str| {
        lb(
            name,
            json!({"ports": [{"port": 53, "protocol": proto}], "selector": {"app": "dns"}}),
            json!({SHARING_ANNOTATION: key}),
            &[],
        )
    };
    let tcp = share("dns-tcp", "TCP", "dns");
    let udp = share("dns-udp", "UDP", "dns");
    assert_eq!(assigned(&a.assign(&tcp, &no_labels())), ["192.0.2.0"]);
    assert_eq!(
        assigned(&a.assign(&udp, &no_labels())),
        ["192.0.2.0"],
        "joins the shared address"
    );
    // Same port: no sharing, its own address.
    let tcp2 = share("dns-tcp2", "TCP", "dns");
    assert_eq!(assigned(&a.assign(&tcp2, &no_labels())), ["192.0.2.1"]);
    // Another key never joins; asking for the address by name is refused.
    let other = share("other", "SCTP", "other");
    assert_eq!(assigned(&a.assign(&other, &no_labels())), ["192.0.2.2"]);
    let mut asks = share("asks", "TCP", "dns");
    asks.spec.as_mut().unwrap().load_balancer_ip = Some("192.0.2.0".into());
    let d = a.assign(&asks, &no_labels());
    assert!(
        pending(&d).starts_with("192.0.2.0 is already in use by Service shop/dns-"),
        "{d:?}"
    );
    // Without the annotation, never shared.
    let plain = lb(
        "plain",
        json!({"loadBalancerIP": "192.0.2.0", "ports": [{"port": 1}]}),
        json!({}),
        &[],
    );
    assert!(matches!(
        a.assign(&plain, &no_labels()),
        Decision::Pending(_)
    ));
    // When one sharer goes, the other keeps the address (its status now
    // shows it, as the controller wrote it).
    a.holdings.release(&key_of(&tcp));
    let mut udp_now = share("dns-udp", "UDP", "dns");
    udp_now.status = lb("x", json!({}), json!({}), &["192.0.2.0"]).status;
    assert_eq!(assigned(&a.assign(&udp_now, &no_labels())), ["192.0.2.0"]);
    assert!(a
        .holdings
        .others(ip("192.0.2.0"), &key_of(&udp_now))
        .next()
        .is_none());
}

#[test]
fn a_restart_keeps_every_address_and_settles_conflicts_once() {
    let ps = pools(&[pool("lan", json!({"addresses": ["192.0.2.0/29"]}))]);
    let svcs = vec![
        lb("a", json!({}), json!({}), &["192.0.2.5"]),
        lb("b", json!({}), json!({}), &[]),
        lb("c", json!({}), json!({}), &["192.0.2.0"]),
        // Two statuses claim .3 (written by hand): one keeps it.
        lb("d", json!({}), json!({}), &["192.0.2.3"]),
        lb("e", json!({}), json!({}), &["192.0.2.3"]),
    ];
    let got = assign_all(&ps, &svcs, &BTreeMap::new());
    let of = |n: &str| assigned(&got[&("shop".to_string(), n.to_string())]);
    assert_eq!(of("a"), ["192.0.2.5"]);
    assert_eq!(of("c"), ["192.0.2.0"]);
    assert_eq!(of("e"), ["192.0.2.3"]);
    assert_eq!(
        of("d"),
        ["192.0.2.1"],
        "d gave way (e was decided after it, still holding)"
    );
    assert_eq!(of("b"), ["192.0.2.2"], "new Services after every holder");
    // The same input decides the same way.
    assert_eq!(assign_all(&ps, &svcs, &BTreeMap::new()), got);
}

/// Random Services (some sharing, some asking for addresses, some other
/// types) come, change and go, and pools change under them; after every
/// step each address is held once (or shared compatibly) and lies in a
/// pool that serves its holder.
#[test]
fn randomized_never_twice_and_always_in_a_serving_pool() {
    let mut rng = podnet_testkit::Rng::new(7);
    let pool_sets = [
        vec![
            pool("a", json!({"addresses": ["192.0.2.0/29"]})),
            pool(
                "b",
                json!({"addresses": ["192.0.2.8-192.0.2.11", "2001:db8::/125"]}),
            ),
        ],
        vec![
            pool("a", json!({"addresses": ["192.0.2.0/30"]})),
            pool(
                "c",
                json!({"addresses": ["192.0.2.16/29"], "serviceSelector": {"matchLabels": {"t": "x"}}}),
            ),
        ],
    ];
    let mut svcs: BTreeMap<String, Service> = BTreeMap::new();
    let (mut shared, mut refused, mut v6) = (0, 0, 0);
    for step in 0..400 {
        let ps = pools(&pool_sets[(step / 100) % 2]);
        let name = format!("s{}", rng.below(12));
        if rng.below(5) == 0 {
            svcs.remove(&name);
        } else {
            let spec = match rng.below(6) {
                0 => json!({"type": "ClusterIP"}),
                1 => json!({"loadBalancerIP": format!("192.0.2.{}", rng.below(24))}),
                2 => json!({"ipFamilyPolicy": "PreferDualStack", "labels": {"t": "x"}}),
                3 => {
                    let proto = ["TCP", "UDP"][rng.below(2)];
                    json!({"ports": [{"port": 53, "protocol": proto}]})
                }
                _ => json!({}),
            };
            let ann = if rng.below(2) == 0 {
                json!({SHARING_ANNOTATION: "k"})
            } else {
                json!({})
            };
            let mut s = lb(&name, spec, ann, &[]);
            s.status = svcs.get(&name).and_then(|o| o.status.clone());
            svcs.insert(name, s);
        }
        let got = assign_all(&ps, svcs.values(), &BTreeMap::new());
        let mut holders: HashMap<IpAddr, Vec<ServiceKey>> = HashMap::new();
        for (k, d) in &got {
            let s = svcs.get_mut(&k.1).unwrap();
            let ips = match d {
                Decision::Assigned(ips) => ips.clone(),
                Decision::Pending(_) => {
                    refused += 1;
                    vec![]
                }
                _ => vec![],
            };
            v6 += ips.iter().filter(|i| i.is_ipv6()).count();
            let labels = s.metadata.labels.clone().unwrap_or_default();
            for ip in &ips {
                assert!(
                    ps.iter()
                        .any(|p| p.holds(*ip) && p.serves(&labels, &BTreeMap::new())),
                    "step {step}: {ip} of {k:?} is in no serving pool"
                );
                holders.entry(*ip).or_default().push(k.clone());
            }
            // What the controller would write back.
            let ingress: Vec<Value> = ips.iter().map(|i| json!({"ip": i.to_string()})).collect();
            let st = json!({"loadBalancer": {"ingress": ingress}});
            s.status = Some(serde_json::from_value(st).unwrap());
        }
        for (ip, hs) in holders {
            shared += usize::from(hs.len() > 1);
            for (i, x) in hs.iter().enumerate() {
                for y in &hs[i + 1..] {
                    let (x, y) = (&svcs[&x.1], &svcs[&y.1]);
                    let ok = matches!((Sharing::of(x), Sharing::of(y)), (Some(a), Some(b)) if a.compatible(&b));
                    assert!(
                        ok,
                        "step {step}: {ip} held by {:?} and {:?}",
                        key_of(x),
                        key_of(y)
                    );
                }
            }
        }
    }
    // The run went through the interesting cases.
    assert!(
        shared > 0 && refused > 0 && v6 > 0,
        "{shared} {refused} {v6}"
    );
}
