//! The evaluator against hand-written truth (the e2e suite's model: x, y, z
//! with pods a, b, c), and the nft plan, traced, against the evaluator:
//! table-driven and with random policies, pods and flows.

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use podnet_nft::model::Proto;
use podnet_nft::trace::{Fate, Packet, Tracer};
use serde_json::json;

use crate::eval::{evaluate, Flow};
use crate::plan::{self, LogLimit};
use crate::world::{Key, PodView, Policy, World};

const NSS: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];

fn ip_of(ns: usize, pod: usize) -> IpAddr {
    format!("10.244.{}.{}", ns + 1, pod + 10).parse().unwrap()
}

fn pod_obj(ns: &str, name: &str, ip: IpAddr, node: &str, labels: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "ports": [
            {"name": "serve-80-tcp", "containerPort": 80, "protocol": "TCP"},
            {"name": "serve-80-udp", "containerPort": 80, "protocol": "UDP"},
            {"name": "serve-81-tcp", "containerPort": 81, "protocol": "TCP"},
            {"name": "serve-81-udp", "containerPort": 81, "protocol": "UDP"},
        ]}]},
        "status": {"phase": "Running", "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]}
    }))
    .unwrap()
}

/// The e2e model; pods of x on node n1, of y on n2, of z on n1.
fn model() -> World {
    let mut w = World::new();
    for (i, ns) in NSS.iter().enumerate() {
        let mut l = std::collections::BTreeMap::new();
        l.insert("ns".to_string(), ns.to_string());
        l.insert("kubernetes.io/metadata.name".to_string(), ns.to_string());
        w.set_namespace(ns, Some(l));
        for (j, p) in PODS.iter().enumerate() {
            let node = if i == 1 { "n2" } else { "n1" };
            let o = pod_obj(ns, p, ip_of(i, j), node, json!({"pod": p}));
            w.set_pod(Key::new(ns, p), Some(PodView::of(&o)));
        }
    }
    w
}

fn policy(w: &mut World, ns: &str, v: serde_json::Value) {
    let mut v = v;
    v["metadata"]["namespace"] = json!(ns);
    let p: NetworkPolicy = serde_json::from_value(v).unwrap();
    let c = Policy::compile(&p).unwrap();
    w.set_policy(c.key.clone(), Some(c));
}

fn ip(w: &World, who: &str) -> IpAddr {
    if let Ok(ip) = who.parse() {
        return ip;
    }
    let (ns, p) = who.split_once('/').unwrap();
    w.pods[&Key::new(ns, p)].ips[0]
}

fn allowed(w: &World, from: &str, to: &str, proto: Proto, port: u16) -> bool {
    let f = Flow {
        src: ip(w, from),
        dst: ip(w, to),
        proto,
        port,
    };
    evaluate(w, &f).allowed()
}

/// The two nodes' tables.
fn tables(w: &World) -> Vec<(String, podnet_nft::model::Table)> {
    ["n1", "n2"]
        .iter()
        .map(|n| {
            let subnet: IpNet = if *n == "n1" {
                "10.244.1.0/24"
            } else {
                "10.244.2.0/24"
            }
            .parse()
            .unwrap();
            (
                n.to_string(),
                plan::table(w, n, false, &[subnet], LogLimit::default()),
            )
        })
        .collect()
}

/// What the kernel tables do with a flow: it crosses the source's node
/// and the destination's (once when they are the same).
fn traced(w: &World, ts: &[(String, podnet_nft::model::Table)], f: &Flow) -> bool {
    let node = |ip: IpAddr| w.pod_at(ip).and_then(|(_, v)| v.node.clone());
    let mut nodes: Vec<String> = [node(f.src), node(f.dst)].into_iter().flatten().collect();
    nodes.dedup();
    nodes.iter().all(|n| {
        let t = &ts.iter().find(|(x, _)| x == n).unwrap().1;
        let pkt = Packet::new(&f.src.to_string(), &f.dst.to_string(), f.proto, f.port);
        let out = Tracer::new(t).incoming(&pkt, &mut |_| 0);
        out.fate == Fate::Accept
    })
}

/// Every pod pair, TCP/UDP 80/81, plus an outside address both ways: the
/// tracer must agree with the evaluator.
fn agree(w: &World) {
    let ts = tables(w);
    let mut ends: Vec<IpAddr> = w.pods.values().flat_map(|v| v.ips.clone()).collect();
    ends.push("192.168.7.7".parse().unwrap());
    for &s in &ends {
        for &d in &ends {
            if s == d {
                continue;
            }
            for proto in [Proto::Tcp, Proto::Udp] {
                for port in [80, 81, 82] {
                    let f = Flow {
                        src: s,
                        dst: d,
                        proto,
                        port,
                    };
                    let v = evaluate(w, &f);
                    assert_eq!(
                        traced(w, &ts, &f),
                        v.allowed(),
                        "{f}: evaluator says {} ({})",
                        v.allowed(),
                        v.reason()
                    );
                }
            }
        }
    }
}

#[test]
fn no_policy_allows_everything() {
    let w = model();
    assert!(allowed(&w, "x/a", "y/b", Proto::Tcp, 80));
    assert!(allowed(&w, "192.168.7.7", "z/c", Proto::Udp, 81));
    agree(&w);
}

#[test]
fn default_deny_ingress_isolates_only_its_namespace() {
    let mut w = model();
    policy(
        &mut w,
        "x",
        json!({"metadata": {"name": "deny"}, "spec": {"podSelector": {}}}),
    );
    assert!(!allowed(&w, "y/a", "x/b", Proto::Tcp, 80));
    assert!(!allowed(&w, "x/a", "x/b", Proto::Tcp, 80));
    assert!(
        allowed(&w, "x/a", "y/b", Proto::Tcp, 80),
        "egress is not isolated"
    );
    let v = evaluate(
        &w,
        &Flow {
            src: ip(&w, "y/a"),
            dst: ip(&w, "x/b"),
            proto: Proto::Tcp,
            port: 80,
        },
    );
    assert_eq!(v.ingress.isolated_by, vec![Key::new("x", "deny")]);
    assert!(
        v.reason()
            .contains("isolated by [x/deny], no rule allowed it"),
        "{}",
        v.reason()
    );
    agree(&w);
}

#[test]
fn policy_types_default_and_egress_only() {
    let mut w = model();
    // Egress rules but no policyTypes: Ingress and Egress.
    policy(
        &mut w,
        "y",
        json!({"metadata": {"name": "e"}, "spec": {"podSelector": {"matchLabels": {"pod": "a"}},
            "egress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]}}),
    );
    assert!(
        !allowed(&w, "x/a", "y/a", Proto::Tcp, 80),
        "ingress isolated too"
    );
    assert!(!allowed(&w, "y/a", "x/a", Proto::Tcp, 80));
    assert!(allowed(&w, "y/a", "x/a", Proto::Udp, 53));
    assert!(
        !allowed(&w, "y/a", "x/a", Proto::Tcp, 53),
        "UDP never opens TCP"
    );
    agree(&w);
    // policyTypes Egress only: ingress stays open.
    policy(
        &mut w,
        "y",
        json!({"metadata": {"name": "e"}, "spec": {"podSelector": {"matchLabels": {"pod": "a"}},
            "policyTypes": ["Egress"], "egress": []}}),
    );
    assert!(allowed(&w, "x/a", "y/a", Proto::Tcp, 80));
    assert!(!allowed(&w, "y/a", "x/a", Proto::Udp, 53));
    agree(&w);
}

#[test]
fn peers_and_vs_or() {
    let mut w = model();
    // One peer with both selectors: pods b in namespaces y.
    policy(
        &mut w,
        "x",
        json!({"metadata": {"name": "and"}, "spec": {"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}},
                                   "podSelector": {"matchLabels": {"pod": "b"}}}]}]}}),
    );
    assert!(allowed(&w, "y/b", "x/a", Proto::Tcp, 80));
    assert!(!allowed(&w, "y/a", "x/a", Proto::Tcp, 80));
    assert!(!allowed(&w, "x/b", "x/a", Proto::Tcp, 80));
    agree(&w);
    // Two peers: any pod of y, or pods b of x (own namespace).
    policy(
        &mut w,
        "x",
        json!({"metadata": {"name": "and"}, "spec": {"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}},
                                  {"podSelector": {"matchLabels": {"pod": "b"}}}]}]}}),
    );
    assert!(allowed(&w, "y/a", "x/a", Proto::Tcp, 80));
    assert!(allowed(&w, "x/b", "x/a", Proto::Tcp, 80));
    assert!(!allowed(&w, "z/b", "x/a", Proto::Tcp, 80));
    assert!(!allowed(&w, "x/c", "x/a", Proto::Tcp, 80));
    agree(&w);
    // matchExpressions, and {} namespaces meaning all.
    policy(
        &mut w,
        "x",
        json!({"metadata": {"name": "and"}, "spec": {"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"namespaceSelector": {},
                "podSelector": {"matchExpressions": [{"key": "pod", "operator": "NotIn", "values": ["b"]}]}}]}]}}),
    );
    assert!(allowed(&w, "z/c", "x/a", Proto::Tcp, 80));
    assert!(!allowed(&w, "z/b", "x/a", Proto::Tcp, 80));
    assert!(!allowed(&w, "192.168.7.7", "x/a", Proto::Tcp, 80));
    agree(&w);
}

#[test]
fn ports_named_ranges_and_protocols() {
    let mut w = model();
    // Named port: x/b's serve-81-tcp is 81; make x/c's differ.
    let o = pod_obj("x", "c", ip_of(0, 2), "n1", json!({"pod": "c"}));
    let mut v = PodView::of(&o);
    v.ports.iter_mut().for_each(|p| {
        if p.name == "serve-81-tcp" {
            p.port = 8181
        }
    });
    w.set_pod(Key::new("x", "c"), Some(v));
    policy(
        &mut w,
        "x",
        json!({"metadata": {"name": "named"}, "spec": {"podSelector": {},
            "ingress": [{"ports": [{"port": "serve-81-tcp"}, {"port": 9000, "endPort": 9010, "protocol": "UDP"},
                                   {"protocol": "SCTP"}]}]}}),
    );
    assert!(allowed(&w, "y/a", "x/b", Proto::Tcp, 81));
    assert!(!allowed(&w, "y/a", "x/b", Proto::Tcp, 80));
    assert!(!allowed(&w, "y/a", "x/c", Proto::Tcp, 81), "x/c names 8181");
    assert!(allowed(&w, "y/a", "x/c", Proto::Tcp, 8181));
    assert!(allowed(&w, "y/a", "x/a", Proto::Udp, 9005));
    assert!(!allowed(&w, "y/a", "x/a", Proto::Udp, 9011));
    assert!(!allowed(&w, "y/a", "x/a", Proto::Tcp, 9005));
    assert!(allowed(&w, "y/a", "x/a", Proto::Sctp, 1234));
    agree(&w);
    // Egress to a named port resolves on each destination.
    policy(
        &mut w,
        "y",
        json!({"metadata": {"name": "eg"}, "spec": {"podSelector": {}, "policyTypes": ["Egress"],
            "egress": [{"ports": [{"port": "serve-81-tcp"}]}]}}),
    );
    assert!(allowed(&w, "y/a", "x/b", Proto::Tcp, 81));
    assert!(allowed(&w, "y/a", "x/c", Proto::Tcp, 8181));
    assert!(!allowed(&w, "y/a", "x/c", Proto::Tcp, 81));
    agree(&w);
}

#[test]
fn ip_blocks_with_except() {
    let mut w = model();
    policy(
        &mut w,
        "x",
        json!({"metadata": {"name": "blk"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.2.0/24"]}}]}],
            "egress": [{"to": [{"ipBlock": {"cidr": "10.244.3.0/24", "except": ["10.244.3.11/32"]}}],
                        "ports": [{"port": 80}, {"port": 81, "endPort": 90}]}]}}),
    );
    assert!(allowed(&w, "z/a", "x/a", Proto::Tcp, 80));
    assert!(!allowed(&w, "y/a", "x/a", Proto::Tcp, 80), "except");
    assert!(!allowed(&w, "192.168.7.7", "x/a", Proto::Tcp, 80));
    assert!(allowed(&w, "x/a", "z/a", Proto::Tcp, 80));
    assert!(allowed(&w, "x/a", "z/a", Proto::Tcp, 85));
    assert!(
        !allowed(&w, "x/a", "z/b", Proto::Tcp, 80),
        "10.244.3.11 excepted"
    );
    assert!(!allowed(&w, "x/a", "y/a", Proto::Tcp, 80));
    agree(&w);
}

#[test]
fn block_nets_cut_out_excepts() {
    let n = |s: &str| s.parse::<IpNet>().unwrap();
    let got = plan::block_nets(&n("10.0.0.0/8"), &[n("10.1.0.0/16"), n("10.200.0.0/13")]);
    for x in ["10.1.2.3", "10.200.0.1", "10.207.255.255"] {
        let ip: IpAddr = x.parse().unwrap();
        assert!(!got.iter().any(|g| g.contains(&ip)), "{x} in {got:?}");
    }
    for x in [
        "10.0.0.1",
        "10.2.0.0",
        "10.199.255.255",
        "10.208.0.0",
        "10.255.255.255",
    ] {
        let ip: IpAddr = x.parse().unwrap();
        assert_eq!(got.iter().filter(|g| g.contains(&ip)).count(), 1, "{x}");
    }
}

#[test]
fn stacked_policies_add_up_and_hostnetwork_is_never_selected() {
    let mut w = model();
    policy(
        &mut w,
        "x",
        json!({"metadata": {"name": "p1"}, "spec": {"podSelector": {},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}}),
    );
    policy(
        &mut w,
        "x",
        json!({"metadata": {"name": "p2"}, "spec": {"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}}], "ports": [{"port": 81}]}]}}),
    );
    assert!(allowed(&w, "x/b", "x/a", Proto::Tcp, 80));
    assert!(allowed(&w, "z/c", "x/a", Proto::Tcp, 81));
    assert!(!allowed(&w, "z/c", "x/a", Proto::Tcp, 80));
    assert!(!allowed(&w, "z/c", "x/b", Proto::Tcp, 81));
    agree(&w);
    // A hostNetwork pod in x: not selected, so not isolated.
    let mut o = pod_obj(
        "x",
        "host",
        "10.244.1.99".parse().unwrap(),
        "n1",
        json!({"pod": "a"}),
    );
    o.spec.as_mut().unwrap().host_network = Some(true);
    w.set_pod(Key::new("x", "host"), Some(PodView::of(&o)));
    assert!(allowed(&w, "y/a", "10.244.1.99", Proto::Tcp, 80));
}

mod random {
    use super::*;
    use proptest::prelude::*;

    fn selector() -> impl Strategy<Value = serde_json::Value> {
        prop_oneof![
            Just(json!({})),
            (0..3usize).prop_map(|i| json!({"matchLabels": {"pod": PODS[i]}})),
            (0..3usize).prop_map(
                |i| json!({"matchExpressions": [{"key": "pod", "operator": "NotIn", "values": [PODS[i]]}]})
            ),
        ]
    }

    fn ns_selector() -> impl Strategy<Value = serde_json::Value> {
        prop_oneof![
            Just(json!({})),
            (0..3usize).prop_map(|i| json!({"matchLabels": {"ns": NSS[i]}})),
        ]
    }

    fn peer() -> impl Strategy<Value = serde_json::Value> {
        prop_oneof![
            selector().prop_map(|s| json!({"podSelector": s})),
            ns_selector().prop_map(|s| json!({"namespaceSelector": s})),
            (selector(), ns_selector())
                .prop_map(|(p, n)| json!({"podSelector": p, "namespaceSelector": n})),
            (1..4u8, 0..3u8).prop_map(|(n, x)| json!({"ipBlock": {
                "cidr": format!("10.244.{n}.0/24"),
                "except": [format!("10.244.{n}.{}/32", 10 + x)]}})),
            Just(json!({"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.244.0.0/16"]}})),
        ]
    }

    fn port() -> impl Strategy<Value = serde_json::Value> {
        prop_oneof![
            Just(json!({"port": 80})),
            Just(json!({"port": 81, "protocol": "UDP"})),
            Just(json!({"port": 80, "endPort": 82})),
            Just(json!({"port": "serve-81-tcp"})),
            Just(json!({"port": "serve-80-udp", "protocol": "UDP"})),
            Just(json!({"protocol": "UDP"})),
        ]
    }

    fn rule(peers_key: &'static str) -> impl Strategy<Value = serde_json::Value> {
        (
            prop::option::of(prop::collection::vec(peer(), 0..3)),
            prop::option::of(prop::collection::vec(port(), 0..3)),
        )
            .prop_map(move |(peers, ports)| {
                let mut r = json!({});
                if let Some(p) = peers {
                    r[peers_key] = json!(p);
                }
                if let Some(p) = ports {
                    r["ports"] = json!(p);
                }
                r
            })
    }

    pub(super) fn policy_json() -> impl Strategy<Value = serde_json::Value> {
        (
            selector(),
            prop::option::of(prop::collection::vec(rule("from"), 0..3)),
            prop::option::of(prop::collection::vec(rule("to"), 0..3)),
            prop_oneof![
                Just(None),
                Just(Some(vec!["Ingress"])),
                Just(Some(vec!["Egress"])),
                Just(Some(vec!["Ingress", "Egress"]))
            ],
        )
            .prop_map(|(sel, ing, eg, types)| {
                let mut spec = json!({"podSelector": sel});
                if let Some(i) = ing {
                    spec["ingress"] = json!(i);
                }
                if let Some(e) = eg {
                    spec["egress"] = json!(e);
                }
                if let Some(t) = types {
                    spec["policyTypes"] = json!(t);
                }
                spec
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn traced_plan_equals_the_evaluator(
            specs in prop::collection::vec((0..3usize, policy_json()), 1..4),
            relabel in prop::option::of((0..3usize, 0..3usize, 0..3usize)),
        ) {
            let mut w = model();
            if let Some((n, p, to)) = relabel {
                let o = pod_obj(NSS[n], PODS[p], ip_of(n, p), if n == 1 { "n2" } else { "n1" }, json!({"pod": PODS[to]}));
                w.set_pod(Key::new(NSS[n], PODS[p]), Some(PodView::of(&o)));
            }
            for (i, (ns, spec)) in specs.into_iter().enumerate() {
                policy(&mut w, NSS[ns], json!({"metadata": {"name": format!("p{i}")}, "spec": spec}));
            }
            agree(&w);
        }
    }
}

#[test]
fn pods_reaching_their_node_are_judged_for_egress_and_the_node_never() {
    let mut w = model();
    policy(
        &mut w,
        "x",
        json!({"metadata": {"name": "dns-only"}, "spec": {"podSelector": {}, "policyTypes": ["Egress", "Ingress"],
            "egress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]}}),
    );
    let t = plan::table(
        &w,
        "n1",
        false,
        &["10.244.1.0/24".parse().unwrap()],
        LogLimit::default(),
    );
    let node_ip = "10.244.1.1";
    let x_a = ip(&w, "x/a").to_string();
    let mut tr = Tracer::new(&t).with_local(&[node_ip]);
    let to_node = |port, proto| Packet::new(&x_a, node_ip, proto, port);
    assert_eq!(
        tr.incoming(&to_node(53, Proto::Udp), &mut |_| 0).fate,
        Fate::Accept
    );
    let o = tr.incoming(&to_node(10249, Proto::Tcp), &mut |_| 0);
    assert_eq!(o.fate, Fate::Drop);
    assert_eq!(o.logs, vec![plan::PREFIX_EGRESS.to_string()]);
    // The node reaches its isolated pods; from its bridge address too.
    let from_node = Packet::new(node_ip, &x_a, Proto::Tcp, 80);
    assert_eq!(tr.local(&from_node, &mut |_| 0).fate, Fate::Accept);
    // A stranger in the node's subnet fails closed, forwarded or local.
    let stray = Packet::new("10.244.1.200", "10.244.3.10", Proto::Tcp, 80);
    let o = tr.incoming(&stray, &mut |_| 0);
    assert_eq!(
        (o.fate, o.logs),
        (Fate::Drop, vec![plan::PREFIX_UNKNOWN.to_string()])
    );
    let stray = Packet::new("10.244.1.200", node_ip, Proto::Tcp, 22);
    assert_eq!(tr.incoming(&stray, &mut |_| 0).fate, Fate::Drop);
}

#[test]
fn ipv6_pods_are_judged_in_the_ip6_table() {
    let mut w = World::new();
    let mut l = std::collections::BTreeMap::new();
    l.insert("ns".to_string(), "x".to_string());
    w.set_namespace("x", Some(l));
    for (name, ip) in [
        ("a", "fd00:10::a"),
        ("b", "fd00:10::b"),
        ("c", "fd00:20::c"),
    ] {
        let o = pod_obj("x", name, ip.parse().unwrap(), "n1", json!({"pod": name}));
        w.set_pod(Key::new("x", name), Some(PodView::of(&o)));
    }
    policy(
        &mut w,
        "x",
        json!({"metadata": {"name": "v6"}, "spec": {"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"ipBlock": {"cidr": "fd00:10::/64", "except": ["fd00:10::b/128"]}},
                                  {"podSelector": {"matchLabels": {"pod": "c"}}}],
                         "ports": [{"port": 80}, {"port": 1000, "endPort": 2000}]}]}}),
    );
    let t = plan::table(
        &w,
        "n1",
        true,
        &["fd00:10::/64".parse().unwrap()],
        LogLimit::default(),
    );
    assert_eq!(t.family, podnet_nft::model::Family::Ip6);
    let v4 = plan::table(&w, "n1", false, &[], LogLimit::default());
    assert!(
        v4.sets.values().all(|s| s.elements.is_empty()),
        "no IPv6 element in the ip table"
    );
    let a = "fd00:10::a";
    for (src, port, want) in [
        ("fd00:10::99", 80, true),
        ("fd00:10::99", 1500, true),
        ("fd00:10::99", 81, false),
        ("fd00:10::b", 80, false),
        ("fd00:20::c", 80, true),
        ("fd00:20::c", 2001, false),
        ("fd00:30::1", 80, false),
    ] {
        let f = Flow {
            src: src.parse().unwrap(),
            dst: a.parse().unwrap(),
            proto: Proto::Tcp,
            port,
        };
        assert_eq!(evaluate(&w, &f).allowed(), want, "{f}");
        let pkt = Packet::new(src, a, Proto::Tcp, port);
        let got = Tracer::new(&t).incoming(&pkt, &mut |_| 0).fate == Fate::Accept;
        // fd00:10::99 is in the node's subnet but no pod: failing closed.
        let want_traced = want && src != "fd00:10::99";
        assert_eq!(got, want_traced, "traced {f}");
    }
}

/// The incremental path against the full plan: after random pod label,
/// namespace label and policy changes, each followed by a partial sync of
/// only what the watch marked dirty, the applied elements equal a full
/// plan's. A change that forgets to dirty a pod fails here.
mod incremental {
    use super::*;
    use crate::dataplane::{Options, PolicyInput, PolicyPlane};
    use podnet_api::Object;
    use podnet_reconcile::{sync, Scope, Subsystem};
    use podnet_source::Delta;
    use proptest::prelude::*;
    use std::sync::{Arc, RwLock};

    fn pod_delta(ns: usize, p: usize, label: usize, named: bool) -> Delta {
        let mut o = pod_obj(
            NSS[ns],
            PODS[p],
            ip_of(ns, p),
            "n1",
            json!({"pod": PODS[label]}),
        );
        if !named {
            o.spec.as_mut().unwrap().containers[0].ports = None;
        }
        Delta::Updated(Arc::new(Object::Pod(Box::new(o))))
    }

    fn ns_delta(ns: usize, label: usize) -> Delta {
        Delta::Updated(Arc::new(Object::Namespace(Box::new(
            serde_json::from_value(
                json!({"metadata": {"name": NSS[ns], "labels": {"ns": NSS[label]}}}),
            )
            .unwrap(),
        ))))
    }

    fn policy_delta(ns: usize, i: usize, spec: serde_json::Value) -> Delta {
        Delta::Updated(Arc::new(Object::NetworkPolicy(Box::new(
            serde_json::from_value(
                json!({"metadata": {"name": format!("p{i}"), "namespace": NSS[ns]}, "spec": spec}),
            )
            .unwrap(),
        ))))
    }

    #[derive(Debug, Clone)]
    enum Step {
        Pod(usize, usize, usize, bool),
        Ns(usize, usize),
        Policy(usize, usize, serde_json::Value),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..3usize, 0..3usize, 0..3usize, any::<bool>())
                .prop_map(|(n, p, l, named)| Step::Pod(n, p, l, named)),
            (0..3usize, 0..3usize).prop_map(|(n, l)| Step::Ns(n, l)),
            (0..3usize, 0..3usize, super::random::policy_json())
                .prop_map(|(n, i, s)| Step::Policy(n, i, s)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn partial_syncs_keep_what_a_full_plan_wants(
            start in prop::collection::vec((0..3usize, super::random::policy_json()), 0..3),
            steps in prop::collection::vec(step(), 1..8),
        ) {
            let mut plane = PolicyPlane::detached(
                Options { node: "n1".into(), ipv6: false, limit: Default::default(), strict: false },
                Arc::new(RwLock::new(World::new())),
                podnet_daemon::Metrics::new(),
            );
            let mut first = Vec::new();
            for n in 0..3 {
                first.push(ns_delta(n, n));
                for p in 0..3 {
                    first.push(pod_delta(n, p, p, true));
                }
            }
            for (i, (n, spec)) in start.into_iter().enumerate() {
                first.push(policy_delta(n, i, spec));
            }
            let mut dirty = std::collections::BTreeSet::new();
            plane.watch(PolicyInput::Deltas(first), &mut dirty);
            sync(&mut plane, &Scope::Full).unwrap();
            prop_assert_eq!(plane.applied_elements(), plane.planned_elements());
            for s in steps {
                let d = match s.clone() {
                    Step::Pod(n, p, l, named) => pod_delta(n, p, l, named),
                    Step::Ns(n, l) => ns_delta(n, l),
                    Step::Policy(n, i, spec) => policy_delta(n, i, spec),
                };
                let mut dirty = std::collections::BTreeSet::new();
                plane.watch(PolicyInput::Deltas(vec![d]), &mut dirty);
                sync(&mut plane, &Scope::Only(dirty)).unwrap();
                prop_assert_eq!(plane.applied_elements(), plane.planned_elements(), "after {:?}", s);
            }
        }
    }
}

#[test]
fn invalid_packets_to_or_from_isolated_pods_are_dropped_and_counted() {
    let mut w = model();
    // x/b admits x/a on port 80 only; x/c is not isolated.
    policy(
        &mut w,
        "x",
        json!({"metadata": {"name": "b-from-a"}, "spec": {"podSelector": {"matchLabels": {"pod": "b"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "a"}}}],
                         "ports": [{"port": 80, "protocol": "TCP"}]}]}}),
    );
    let t = plan::table(
        &w,
        "n1",
        false,
        &["10.244.1.0/24".parse().unwrap()],
        LogLimit::default(),
    );
    let (a, b, c) = (ip(&w, "x/a"), ip(&w, "x/b"), ip(&w, "x/c"));
    let pkt = |s: IpAddr, d: IpAddr, port, invalid| {
        let mut p = Packet::new(&s.to_string(), &d.to_string(), Proto::Tcp, port);
        p.extra.ct_invalid = invalid;
        p
    };
    let mut tr = Tracer::new(&t);
    // A stray RST to the isolated pod, even from the allowed peer and port.
    for p in [pkt(c, b, 81, true), pkt(a, b, 80, true)] {
        let o = tr.incoming(&p, &mut |_| 0);
        assert_eq!((o.fate, o.logs.len()), (Fate::Drop, 0), "{p:?}");
    }
    assert_eq!(tr.counters.get(plan::COUNTER_INVALID), Some(&2));
    // To a pod no policy isolates, invalid is not the table's business;
    // a new connection the policy allows passes.
    assert_eq!(
        tr.incoming(&pkt(a, c, 81, true), &mut |_| 0).fate,
        Fate::Accept
    );
    assert_eq!(
        tr.incoming(&pkt(a, b, 80, false), &mut |_| 0).fate,
        Fate::Accept
    );
    assert_eq!(
        tr.incoming(&pkt(c, b, 80, false), &mut |_| 0).fate,
        Fate::Drop
    );
}
