//! The planner's tests: fixtures and tracer shorthands here; the cases by
//! concept in `cluster` (ClusterIP traffic and endpoint choice),
//! `external` (NodePorts, external addresses, LB source ranges, the
//! external policy) and `table` (which Services get rules, sync costs,
//! fragments, families, the rendered text). Issue 12's kube-proxy
//! semantics are one tracer row per item across them.

use super::input::cluster_ip_of;
use super::*;
use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_nft::diff::{diff, ops, Change};
use podnet_nft::model::{Expr, Family, Proto, Table, Value, Verdict};
use podnet_nft::trace::{Fate, Packet, Tracer};
use serde_json::json;
use std::collections::BTreeSet;

mod cluster;
mod external;
mod table;

const NODE_IP: &str = "192.168.200.11";

fn svc(name: &str, spec: serde_json::Value) -> Service {
    serde_json::from_value(
        json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec}),
    )
    .unwrap()
}

fn slice(svc: &str, eps: &[(&str, bool, bool, &str)], port: i32) -> EndpointSlice {
    let endpoints: Vec<serde_json::Value> = eps
        .iter()
        .map(|(ip, ready, term, node)| {
            json!({"addresses": [ip], "nodeName": node,
            "conditions": {"ready": ready, "serving": *ready || *term, "terminating": term}})
        })
        .collect();
    serde_json::from_value(json!({"metadata": {"name": format!("{svc}-x"), "namespace": "default",
            "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4", "endpoints": endpoints, "ports": [{"name": "http", "protocol": "TCP", "port": port}]}))
    .unwrap()
}

fn web(extra: serde_json::Value) -> Service {
    let mut spec = json!({"clusterIP": "10.96.0.50", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}], "selector": {"app": "web"}});
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    svc("web", spec)
}

fn two_eps() -> EndpointSlice {
    slice(
        "web",
        &[
            ("10.244.1.5", true, false, "node1"),
            ("10.244.2.5", true, false, "node2"),
        ],
        8080,
    )
}

fn v4() -> Stack {
    Stack::v4("10.244.0.0/16".parse().unwrap())
}

/// node1 at NODE_IP, accepting NodePorts on every local address.
fn node1() -> NodeInfo {
    NodeInfo {
        ips: vec![NODE_IP.parse().unwrap()],
        ..NodeInfo::named("node1")
    }
}

fn plan_for(services: &[Service], slices: &[EndpointSlice]) -> Table {
    plan(&ProxyInput {
        node: &node1(),
        stack: v4(),
        services,
        slices,
    })
}

fn targets(t: &Table, p: &Packet) -> BTreeSet<String> {
    Tracer::new(t)
        .with_local(&[NODE_IP])
        .incoming_targets(p, 12)
        .into_iter()
        .map(|d| {
            d.map(|(a, p)| format!("{a}:{}", p.unwrap_or(0)))
                .unwrap_or_else(|| "none".into())
        })
        .collect()
}

fn v4_with_services() -> Stack {
    v4().with_service_cidr(Some("10.96.0.0/12".parse().unwrap()))
}

fn plan_on(node: &NodeInfo, services: &[Service], slices: &[EndpointSlice]) -> Table {
    plan(&ProxyInput {
        node,
        stack: v4_with_services(),
        services,
        slices,
    })
}

fn one(t: &Table, tr_local: &[&str], p: &Packet) -> (Fate, Option<String>, bool) {
    let o = Tracer::new(t).with_local(tr_local).incoming(p, &mut |_| 0);
    (
        o.fate,
        o.dnat.map(|(a, p)| format!("{a}:{}", p.unwrap_or(0))),
        o.masquerade,
    )
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// `web` on the fast path, `sticky` (a NodePort) on the chain path.
fn fast_and_chain() -> (Vec<Service>, Vec<EndpointSlice>) {
    let mut sticky = web(json!({"clusterIP": "10.96.0.51", "type": "NodePort",
        "ports": [{"name": "http", "port": 80, "nodePort": 30090, "protocol": "TCP"}]}));
    sticky.metadata.name = Some("sticky".into());
    let mut sticky_eps = two_eps();
    sticky_eps
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("kubernetes.io/service-name".into(), "sticky".into());
    (vec![web(json!({})), sticky], vec![two_eps(), sticky_eps])
}

fn hinted(eps: &[(&str, &str, Option<&str>, Option<&str>)]) -> EndpointSlice {
    let endpoints: Vec<serde_json::Value> = eps
        .iter()
        .map(|(ip, node, zone, for_node)| {
            let mut hints = json!({});
            if let Some(z) = zone {
                hints["forZones"] = json!([{"name": z}]);
            }
            if let Some(n) = for_node {
                hints["forNodes"] = json!([{"name": n}]);
            }
            json!({"addresses": [ip], "nodeName": node, "hints": hints,
                "conditions": {"ready": true, "serving": true, "terminating": false}})
        })
        .collect();
    serde_json::from_value(json!({"metadata": {"name": "web-x", "namespace": "default",
            "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4", "endpoints": endpoints,
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]}))
    .unwrap()
}
