//! The compiler kept up to date one object at a time against one
//! compiled from scratch: after every random change to HTTPRoutes and
//! Ingresses (their hosts, parents, matches, backends, TLS and class),
//! both must serve the same table and show the same statuses.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use super::compiler::Compiler;
use super::part::Source;
use super::*;
use crate::model::Bind;
use podnet_api::Object;
use podnet_testkit::Rng;

fn put(w: &mut World, v: Value) {
    w.put(Object::from_value(v).unwrap());
}

fn base() -> World {
    let c = rcgen::generate_simple_self_signed(vec!["secure.example.com".into()]).unwrap();
    let mut w = World::default();
    put(
        &mut w,
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": "podnet"}, "spec": {"controllerName": "podnet.io/gateway"}}),
    );
    put(
        &mut w,
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "gw1", "namespace": "app"}, "spec": {"gatewayClassName": "podnet", "listeners": [
            {"name": "http", "port": 80, "protocol": "HTTP"},
            {"name": "wild", "port": 8080, "protocol": "HTTP", "hostname": "*.example.com"}]}}),
    );
    put(
        &mut w,
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "gw2", "namespace": "app"}, "spec": {"gatewayClassName": "podnet", "listeners": [
            {"name": "http", "port": 80, "protocol": "HTTP", "hostname": "a.example.com"}]}}),
    );
    for svc in ["web", "api"] {
        put(
            &mut w,
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": svc, "namespace": "app"},
            "spec": {"ports": [{"name": "http", "port": 8080}]}}),
        );
    }
    put(
        &mut w,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tls", "namespace": "app"},
        "type": "kubernetes.io/tls", "stringData": {"tls.crt": c.cert.pem(), "tls.key": c.signing_key.serialize_pem()}}),
    );
    w
}

fn random_route(rng: &mut Rng, name: &str) -> Value {
    let hosts: Vec<&str> = (0..rng.below(3))
        .map(|_| {
            *rng.pick(&[
                "a.example.com",
                "b.example.com",
                "*.example.com",
                "x.example.net",
            ])
        })
        .collect();
    let parent = match rng.below(4) {
        0 => json!({"name": "gw1"}),
        1 => json!({"name": "gw1", "sectionName": "wild"}),
        2 => json!({"name": "gw2"}),
        _ => json!({"name": "gone"}),
    };
    let rules: Vec<Value> = (0..1 + rng.below(2))
        .map(|_| {
            json!({"matches": [{"path": {"type": *rng.pick(&["PathPrefix", "Exact"]), "value": *rng.pick(&["/", "/api", "/api/v1"])}}],
                   "backendRefs": [{"name": *rng.pick(&["web", "api", "missing"]), "port": 8080}]})
        })
        .collect();
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": "app", "generation": rng.below(5)},
        "spec": {"parentRefs": [parent], "hostnames": hosts, "rules": rules}})
}

fn random_ingress(rng: &mut Rng, name: &str) -> Value {
    let host = *rng.pick(&["secure.example.com", "a.example.com", "*.example.com"]);
    let mut spec = json!({
        "ingressClassName": *rng.pick(&["podnet", "podnet", "other"]),
        "rules": [{"host": host, "http": {"paths": [{"path": *rng.pick(&["/", "/api"]), "pathType": "Prefix",
            "backend": {"service": {"name": *rng.pick(&["web", "missing"]), "port": {"number": 8080}}}}]}}]});
    if rng.below(2) == 0 {
        spec["tls"] = json!([{"hosts": [host], "secretName": "tls"}]);
    }
    if rng.below(3) == 0 {
        spec["defaultBackend"] = json!({"service": {"name": "api", "port": {"number": 8080}}});
    }
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": "app"}, "spec": spec})
}

/// One random change; returns what it touched.
fn change(rng: &mut Rng, w: &mut World) -> Source {
    let ingress = rng.below(4) == 0;
    let name = format!("o{}", rng.below(if ingress { 4 } else { 12 }));
    let key = ("app".to_string(), name.clone());
    let kind = if ingress {
        podnet_api::Kind::Ingress
    } else {
        podnet_api::Kind::HTTPRoute
    };
    match (rng.below(4), ingress) {
        (0, _) => w.remove(kind, Some("app"), &name),
        (_, true) => put(w, random_ingress(rng, &name)),
        (_, false) => put(w, random_route(rng, &name)),
    }
    match ingress {
        true => Source::Ingress(key),
        false => Source::Route(key),
    }
}

type Served = BTreeMap<(Bind, String), (bool, Vec<String>, Vec<String>)>;

/// The table written out comparably: per port and host pattern, TLS,
/// certificate hosts and entries (route, match, order) in order.
fn served(t: &crate::model::Table) -> Served {
    let mut out = BTreeMap::new();
    for (bind, pt) in &t.ports {
        let certs: Vec<String> = pt.certs.iter().map(|c| c.host.to_string()).collect();
        out.insert((*bind, String::new()), (pt.tls, certs, Vec::new()));
        for (l, patterns) in pt.hosts.iter() {
            for (h, es) in patterns.iter() {
                let es = es
                    .iter()
                    .map(|e| format!("{} {:?} {:?}", e.rule.route, e.m, e.order))
                    .collect();
                out.insert((*bind, format!("{l:?} {h:?}")), (pt.tls, Vec::new(), es));
            }
        }
    }
    out
}

#[test]
fn one_object_at_a_time_equals_compiling_everything() {
    let cfg = Config::default();
    for seed in 1..=8u64 {
        let mut rng = Rng::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut w = base();
        let mut c = Compiler::new(&w, &cfg);
        for step in 0..150 {
            let changed: BTreeSet<Source> = (0..1 + rng.below(3))
                .map(|_| change(&mut rng, &mut w))
                .collect();
            let before: BTreeSet<_> = c.backends().cloned().collect();
            let touched = c.update(&w, &changed);
            let after: BTreeSet<_> = c.backends().cloned().collect();
            // Every backend that came or went is among those reported.
            let moved: BTreeSet<_> = before.symmetric_difference(&after).cloned().collect();
            assert!(moved.is_subset(&touched), "{moved:?} not in {touched:?}");
            for svc in ["web", "api", "missing"] {
                let of: Vec<_> = c.backends_of("app", svc).collect();
                let all: Vec<_> = c.backends().filter(|k| k.service == svc).collect();
                assert_eq!(of, all, "backends of {svc}");
            }
            let fresh = Compiler::new(&w, &cfg);
            let at = format!("seed {seed} step {step} after {changed:?}");
            assert_eq!(served(c.table()), served(fresh.table()), "{at}");
            assert_eq!(c.statuses(None), fresh.statuses(None), "{at}");
            assert_eq!(
                c.backends().collect::<Vec<_>>(),
                fresh.backends().collect::<Vec<_>>(),
                "{at}"
            );
            let part = c.statuses(Some(&changed));
            assert_eq!(part.gateways, fresh.statuses(None).gateways, "{at}");
        }
        assert!(c.served() > 0, "seed {seed}: the walk served something");
    }
}
