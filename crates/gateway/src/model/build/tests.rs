//! The builder against the Gateway API's and Ingress's rules, on objects
//! as users write them.

use serde_json::{json, Value};

use super::*;
use crate::model::matcher::Request;
use podnet_api::Object;

fn world(objs: Vec<Value>) -> World {
    let mut w = World::default();
    for v in objs {
        w.put(Object::from_value(v).unwrap());
    }
    w
}

fn class() -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "podnet"},
           "spec": {"controllerName": "podnet.io/gateway"}})
}

fn gateway(ns: &str, name: &str, listeners: Value) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": name, "namespace": ns},
           "spec": {"gatewayClassName": "podnet", "listeners": listeners}})
}

fn service(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
           "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": 3000}]}})
}

fn route(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// The route name and backend service a GET of `host` `path` on `port`
/// takes (None: 404).
fn served(
    b: &Built,
    port: impl Into<crate::model::Bind>,
    host: &str,
    path: &str,
) -> Option<(String, Option<String>)> {
    let h = http::HeaderMap::new();
    let (p, q) = path
        .split_once('?')
        .map_or((path, None), |(p, q)| (p, Some(q)));
    let r = Request {
        method: &http::Method::GET,
        path: p,
        query: q,
        headers: &h,
    };
    let f = b.table.route(port, host, &r)?;
    Some((
        f.rule.route.name.clone(),
        f.rule
            .backends
            .first()
            .and_then(|b| b.key.as_ref())
            .map(|k| k.service.clone()),
    ))
}

#[test]
fn routes_attach_with_hostnames_and_precedence() {
    let w = world(vec![
        class(),
        gateway(
            "infra",
            "gw",
            json!([{"name": "http", "port": 80, "protocol": "HTTP", "hostname": "*.example.com",
                                        "allowedRoutes": {"namespaces": {"from": "All"}}}]),
        ),
        service("app", "web"),
        service("app", "api"),
        route(
            "app",
            "web",
            json!({"parentRefs": [{"name": "gw", "namespace": "infra"}],
            "rules": [{"backendRefs": [{"name": "web", "port": 8080}]}]}),
        ),
        route(
            "app",
            "api",
            json!({"parentRefs": [{"name": "gw", "namespace": "infra"}], "hostnames": ["api.example.com"],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}], "backendRefs": [{"name": "api", "port": 8080}]}]}),
        ),
        route(
            "app",
            "elsewhere",
            json!({"parentRefs": [{"name": "gw", "namespace": "infra"}], "hostnames": ["x.example.net"],
            "rules": [{"backendRefs": [{"name": "api", "port": 8080}]}]}),
        ),
    ]);
    let b = build(&w, &Config::default());
    assert_eq!(
        served(&b, 80, "www.example.com", "/"),
        Some(("web".into(), Some("web".into())))
    );
    assert_eq!(
        served(&b, 80, "api.example.com", "/v1/x"),
        Some(("api".into(), Some("api".into())))
    );
    assert_eq!(
        served(&b, 80, "api.example.com", "/v2"),
        None,
        "the exact host's routes only"
    );
    assert_eq!(served(&b, 80, "example.org", "/"), None);
    let st = &b.statuses;
    let reason = |n: &str| {
        st.routes[&("app".to_string(), n.to_string())].1[0]
            .accepted
            .reason
    };
    assert_eq!(
        (reason("web"), reason("api"), reason("elsewhere")),
        ("Accepted", "Accepted", "NoMatchingListenerHostname")
    );
    let g = &st.gateways[&("infra".to_string(), "gw".to_string())];
    assert_eq!(g.listeners[0].attached_routes, 2);
    assert!(g.programmed.ok);
}

#[test]
fn listeners_admit_routes_by_namespace_and_section() {
    let w = world(vec![
        class(),
        gateway(
            "infra",
            "gw",
            json!([{"name": "same", "port": 80, "protocol": "HTTP"},
                                      {"name": "other", "port": 8080, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "Selector", "selector": {"matchLabels": {"team": "a"}}}}}]),
        ),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "app", "labels": {"team": "a"}}}),
        service("app", "web"),
        route(
            "app",
            "r",
            json!({"parentRefs": [{"name": "gw", "namespace": "infra", "sectionName": "same"}], "rules": [{"backendRefs": [{"name": "web", "port": 8080}]}]}),
        ),
        route(
            "app",
            "s",
            json!({"parentRefs": [{"name": "gw", "namespace": "infra", "sectionName": "other"}], "rules": [{"backendRefs": [{"name": "web", "port": 8080}]}]}),
        ),
        route(
            "app",
            "t",
            json!({"parentRefs": [{"name": "gw", "namespace": "infra", "sectionName": "nope"}]}),
        ),
    ]);
    let b = build(&w, &Config::default());
    let reason = |n: &str| {
        b.statuses.routes[&("app".to_string(), n.to_string())].1[0]
            .accepted
            .reason
    };
    assert_eq!(
        (reason("r"), reason("s"), reason("t")),
        ("NotAllowedByListeners", "Accepted", "NoMatchingParent")
    );
    assert_eq!(
        served(&b, 8080, "any", "/"),
        Some(("s".into(), Some("web".into())))
    );
    assert_eq!(served(&b, 80, "any", "/"), None);
}

#[test]
fn a_backend_in_another_namespace_needs_a_grant() {
    let mut objs = vec![
        class(),
        gateway(
            "app",
            "gw",
            json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
        ),
        service("backends", "web"),
        route(
            "app",
            "r",
            json!({"parentRefs": [{"name": "gw"}], "rules": [{"backendRefs": [{"name": "web", "namespace": "backends", "port": 8080}]}]}),
        ),
    ];
    let b = build(&world(objs.clone()), &Config::default());
    let p = &b.statuses.routes[&("app".to_string(), "r".to_string())].1[0];
    assert_eq!(
        (p.accepted.ok, p.resolved_refs.reason),
        (true, "RefNotPermitted")
    );
    assert_eq!(
        served(&b, 80, "h", "/"),
        Some(("r".into(), None)),
        "an invalid backend answers 500"
    );
    objs.push(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "ReferenceGrant", "metadata": {"name": "g", "namespace": "backends"},
        "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "app"}], "to": [{"group": "", "kind": "Service"}]}}));
    let b = build(&world(objs), &Config::default());
    assert_eq!(
        served(&b, 80, "h", "/"),
        Some(("r".into(), Some("web".into())))
    );
}

#[test]
fn gateways_of_other_classes_and_bad_listeners_are_judged() {
    let w = world(vec![
        class(),
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "other"}, "spec": {"controllerName": "example.com/gw"}}),
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "theirs", "namespace": "x"},
               "spec": {"gatewayClassName": "other", "listeners": [{"name": "h", "port": 80, "protocol": "HTTP"}]}}),
        gateway(
            "x",
            "gw",
            json!([{"name": "udp", "port": 53, "protocol": "UDP"},
                                   {"name": "a", "port": 8081, "protocol": "HTTP"}, {"name": "b", "port": 8081, "protocol": "HTTP"},
                                   {"name": "tls", "port": 443, "protocol": "HTTPS", "tls": {"certificateRefs": [{"name": "missing"}]}}]),
        ),
    ]);
    let b = build(&w, &Config::default());
    assert_eq!(b.statuses.classes.keys().collect::<Vec<_>>(), ["podnet"]);
    assert!(!b
        .statuses
        .gateways
        .contains_key(&("x".to_string(), "theirs".to_string())));
    let g = &b.statuses.gateways[&("x".to_string(), "gw".to_string())];
    let l: Vec<(&str, bool, &str)> = g
        .listeners
        .iter()
        .map(|l| (l.name.as_str(), l.programmed.ok, l.accepted.reason))
        .collect();
    assert_eq!(
        l,
        [
            ("udp", false, "UnsupportedProtocol"),
            ("a", false, "Accepted"),
            ("b", false, "Accepted"),
            ("tls", false, "Accepted")
        ]
    );
    assert_eq!(
        g.listeners[1].conflicted.as_ref().unwrap().reason,
        "HostnameConflict"
    );
    assert_eq!(g.listeners[3].resolved_refs.reason, "InvalidCertificateRef");
    assert!(
        g.listeners[0].supported_kinds.is_empty(),
        "nothing attaches to a protocol not served"
    );
    // The HTTPS listener is valid (its certificate is not resolved, but
    // routes may attach to it), so the Gateway is accepted, with the reason
    // that some listeners are not.
    assert_eq!(
        (g.accepted.ok, g.accepted.reason),
        (true, "ListenersNotValid")
    );
    assert!(!g.programmed.ok, "no listener serves");
    assert!(b.table.ports.is_empty());
}

/// A route attaches to (and counts on) a listener whose certificate is
/// missing, but no traffic is served there (conformance:
/// GatewayWithAttachedRoutes).
#[test]
fn routes_count_on_a_listener_with_unresolved_references() {
    let w = world(vec![
        class(),
        gateway(
            "x",
            "gw",
            json!([{"name": "tls", "port": 443, "protocol": "HTTPS", "tls": {"certificateRefs": [{"name": "does-not-exist"}]}}]),
        ),
        service("x", "web"),
        route(
            "x",
            "r",
            json!({"parentRefs": [{"name": "gw", "sectionName": "tls"}], "rules": [{"backendRefs": [{"name": "web", "port": 8080}]}]}),
        ),
    ]);
    let b = build(&w, &Config::default());
    let g = &b.statuses.gateways[&("x".to_string(), "gw".to_string())];
    assert_eq!(g.listeners[0].attached_routes, 1);
    assert_eq!(
        (
            g.listeners[0].resolved_refs.ok,
            g.listeners[0].programmed.ok
        ),
        (false, false)
    );
    assert!(
        b.statuses.routes[&("x".to_string(), "r".to_string())].1[0]
            .accepted
            .ok
    );
    assert!(served(&b, 443, "any", "/").is_none());
}

#[test]
fn ingresses_route_by_host_and_path_with_a_default_backend() {
    let ing = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "i", "namespace": "app"},
        "spec": {"ingressClassName": "podnet", "defaultBackend": {"service": {"name": "fallback", "port": {"number": 8080}}},
                 "rules": [{"host": "shop.example", "http": {"paths": [
                    {"path": "/cart", "pathType": "Prefix", "backend": {"service": {"name": "cart", "port": {"name": "http"}}}},
                    {"path": "/cart/exact", "pathType": "Exact", "backend": {"service": {"name": "web", "port": {"number": 8080}}}}]}}]}});
    let other = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "o", "namespace": "app"},
        "spec": {"ingressClassName": "nginx", "rules": [{"host": "n.example", "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 8080}}}}]}}]}});
    let w = world(vec![
        ing,
        other,
        service("app", "cart"),
        service("app", "web"),
        service("app", "fallback"),
    ]);
    let b = build(&w, &Config::default());
    let svc = |host: &str, path: &str| served(&b, 80, host, path).and_then(|s| s.1);
    assert_eq!(svc("shop.example", "/cart/x").as_deref(), Some("cart"));
    assert_eq!(svc("shop.example", "/cart/exact").as_deref(), Some("web"));
    assert_eq!(svc("shop.example", "/cartx").as_deref(), Some("fallback"));
    assert_eq!(
        svc("n.example", "/").as_deref(),
        Some("fallback"),
        "another class's Ingress is not ours"
    );
    assert_eq!(b.statuses.ingresses.len(), 1);
}

/// A port the data plane could not bind leaves its listeners, and a
/// Gateway with no other, not programmed.
#[test]
fn an_unbound_port_is_not_programmed() {
    let w = world(vec![
        class(),
        gateway(
            "x",
            "gw",
            json!([{"name": "a", "port": 80, "protocol": "HTTP"}, {"name": "b", "port": 8081, "protocol": "HTTP"}]),
        ),
    ]);
    let mut b = build(&w, &Config::default());
    b.statuses.port_unavailable(80, "Permission denied");
    let g = &b.statuses.gateways[&("x".to_string(), "gw".to_string())];
    let p: Vec<(bool, &str)> = g
        .listeners
        .iter()
        .map(|l| (l.programmed.ok, l.programmed.reason))
        .collect();
    assert_eq!(p, [(false, "Pending"), (true, "Programmed")]);
    assert!(g.programmed.ok, "one listener still serves");
    b.statuses.port_unavailable(8081, "in use");
    let g = &b.statuses.gateways[&("x".to_string(), "gw".to_string())];
    assert_eq!((g.programmed.ok, g.programmed.reason), (false, "Pending"));
}

/// With an address pool, two Gateways on one port each get an address,
/// and each address serves only its Gateway's routes (conformance:
/// HTTPRouteMultipleGateways).
#[test]
fn gateways_on_one_port_keep_their_routes_apart_with_a_pool() {
    let mut objs = vec![
        class(),
        gateway(
            "x",
            "a",
            json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
        ),
        gateway(
            "x",
            "b",
            json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
        ),
        service("x", "va"),
        service("x", "vb"),
    ];
    for (r, gw, svc) in [("ra", "a", "va"), ("rb", "b", "vb")] {
        objs.push(route("x", r, json!({"parentRefs": [{"name": gw}], "rules": [{"backendRefs": [{"name": svc, "port": 8080}]}]})));
    }
    let cfg = Config {
        pool: Some(crate::model::addresses::Pool::parse("10.1.0.1-10.1.0.9").unwrap()),
        ..Config::default()
    };
    let b = build(&world(objs), &cfg);
    let addr = |g: &str| {
        b.statuses.gateways[&("x".to_string(), g.to_string())]
            .address
            .unwrap()
    };
    assert_ne!(addr("a"), addr("b"));
    let at = |g: &str| crate::model::Bind {
        ip: Some(addr(g)),
        port: 80,
    };
    assert_eq!(
        served(&b, at("a"), "h", "/").unwrap().1.as_deref(),
        Some("va")
    );
    assert_eq!(
        served(&b, at("b"), "h", "/").unwrap().1.as_deref(),
        Some("vb")
    );
    assert!(
        served(&b, 80, "h", "/").is_none(),
        "nothing on the shared address"
    );
}

/// `podnet trace` of a URL: the route, the match, the backend and its
/// endpoints, as the data plane would choose them.
#[test]
fn a_request_is_explained() {
    let w = world(vec![
        class(),
        gateway(
            "app",
            "gw",
            json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
        ),
        service("app", "api"),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "api-1", "namespace": "app", "labels": {"kubernetes.io/service-name": "api"}},
               "addressType": "IPv4", "ports": [{"name": "http", "port": 3000}], "endpoints": [{"addresses": ["10.244.1.5"]}]}),
        route(
            "app",
            "api",
            json!({"parentRefs": [{"name": "gw"}], "hostnames": ["api.example.com"],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                       "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"}}}],
                       "backendRefs": [{"name": "api", "port": 8080}]}]}),
        ),
    ]);
    let b = build(&w, &Config::default());
    let eps = endpoints::resolve(&w, &b.backends);
    let h = http::HeaderMap::new();
    let req = |path| Request {
        method: &http::Method::GET,
        path,
        query: None,
        headers: &h,
    };
    let e = crate::model::explain::explain(
        &b.table,
        &b.statuses,
        &eps,
        80.into(),
        "api.example.com",
        &req("/v1/users"),
        &[80, 443],
    );
    assert_eq!(e.listeners, ["Gateway app/gw listener http"]);
    assert_eq!(e.route.as_deref(), Some("HTTPRoute app/api rule 0"));
    assert_eq!(e.matched.as_deref(), Some("path PathPrefix /v1"));
    assert_eq!(e.filters, ["URLRewrite: matched prefix to /"]);
    assert_eq!(
        e.backends,
        [(
            "app/api:8080".to_string(),
            1,
            vec!["10.244.1.5:3000".parse().unwrap()]
        )]
    );
    let miss = crate::model::explain::explain(
        &b.table,
        &b.statuses,
        &eps,
        80.into(),
        "api.example.com",
        &req("/v2"),
        &[80, 443],
    );
    assert_eq!(
        (miss.route, miss.outcome.as_str()),
        (
            None,
            "404: none of the 1 entries for api.example.com matches"
        )
    );
    let closed = crate::model::explain::explain(
        &b.table,
        &b.statuses,
        &eps,
        81.into(),
        "x",
        &req("/"),
        &[80, 443],
    );
    assert!(
        closed.outcome.starts_with("connection refused"),
        "{}",
        closed.outcome
    );
}

#[test]
fn listeners_open_only_the_node_ports_allowed() {
    let w = world(vec![
        class(),
        gateway(
            "tenant",
            "gw",
            json!([{"name": "ssh", "port": 22, "protocol": "HTTP"},
                   {"name": "web", "port": 8080, "protocol": "HTTP"}]),
        ),
    ]);
    let b = build(&w, &Config::default());
    let g = &b.statuses.gateways[&("tenant".to_string(), "gw".to_string())];
    let ssh = &g.listeners[0];
    assert_eq!(
        (ssh.accepted.ok, ssh.accepted.reason, ssh.programmed.ok),
        (false, "PortUnavailable", false)
    );
    assert!(
        ssh.accepted.message.contains("80,443,1024-65535"),
        "{}",
        ssh.accepted.message
    );
    assert!(g.listeners[1].accepted.ok && g.listeners[1].programmed.ok);
    let ports: Vec<u16> = b.table.ports.keys().map(|p| p.port).collect();
    assert_eq!(ports, [8080], "port 22 is not opened");
    // An operator may allow it.
    let cfg = Config {
        listener_ports: crate::model::ports::PortSet::parse("22,8080").unwrap(),
        ..Config::default()
    };
    let b = build(&w, &cfg);
    let ports: Vec<u16> = b.table.ports.keys().map(|p| p.port).collect();
    assert_eq!(ports, [22, 8080]);
}

/// A request is searched only among the routes of the most specific
/// listener that matches its host, even where another listener's route
/// names that host (conformance: GatewayHTTPListenerIsolation).
#[test]
fn the_most_specific_listener_isolates_its_routes() {
    let w = world(vec![
        class(),
        gateway(
            "app",
            "gw",
            json!([{"name": "wild", "port": 80, "protocol": "HTTP", "hostname": "*.example.com"},
                   {"name": "abc", "port": 80, "protocol": "HTTP", "hostname": "abc.example.com"}]),
        ),
        service("app", "web"),
        route(
            "app",
            "w",
            json!({"parentRefs": [{"name": "gw", "sectionName": "wild"}], "hostnames": ["abc.example.com", "x.example.com"],
                   "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/w"}}], "backendRefs": [{"name": "web", "port": 8080}]}]}),
        ),
        route(
            "app",
            "a",
            json!({"parentRefs": [{"name": "gw", "sectionName": "abc"}],
                   "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/a"}}], "backendRefs": [{"name": "web", "port": 8080}]}]}),
        ),
    ]);
    let b = build(&w, &Config::default());
    let name = |host: &str, path: &str| served(&b, 80, host, path).map(|r| r.0);
    assert_eq!(name("abc.example.com", "/a"), Some("a".into()));
    assert_eq!(
        name("abc.example.com", "/w"),
        None,
        "the wildcard listener's route does not serve abc.example.com"
    );
    assert_eq!(name("x.example.com", "/w"), Some("w".into()));
    assert_eq!(name("x.example.com", "/a"), None);
}
