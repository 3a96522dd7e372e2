//! The controller's EndpointSlices as the service proxy reads them: what the
//! controller publishes for `publishNotReadyAddresses` is what the proxy
//! sends traffic to. No root needed: both halves are pure.

use podnet_agent::proxy::{plan, NodeInfo, ProxyInput, Stack};
use podnet_api::k8s_openapi::api::core::v1::{Pod, Service};
use podnet_controller::endpoints::desired;
use serde_json::json;

fn service(name: &str, ip: &str, publish: bool) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"clusterIP": ip, "clusterIPs": [ip], "selector": {"app": "peer"},
                 "publishNotReadyAddresses": publish,
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
    }))
    .unwrap()
}

fn pod(name: &str, ip: &str, ready: bool, terminating: bool) -> Pod {
    let mut meta = json!({"name": name, "namespace": "default", "labels": {"app": "peer"},
                          "uid": format!("uid-{name}")});
    if terminating {
        meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    serde_json::from_value(json!({
        "metadata": meta,
        "spec": {"nodeName": "node2", "containers": [{"name": "c"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                   "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
    }))
    .unwrap()
}

/// The proxy's table for these Services, with the controller's slices.
fn table(services: &[Service], pods: &[&Pod]) -> String {
    let slices: Vec<_> = services.iter().flat_map(|s| desired(s, pods)).collect();
    let node = NodeInfo::named("node1");
    plan(&ProxyInput {
        node: &node,
        stack: Stack::v4("10.244.0.0/16".parse().unwrap()),
        services,
        slices: &slices,
    })
    .render()
}

#[test]
fn published_not_ready_and_terminating_pods_are_proxy_endpoints() {
    let unready = pod("unready", "10.244.2.7", false, false);
    let leaving = pod("leaving", "10.244.2.8", false, true);
    let pods = [&unready, &leaving];
    // Without the flag the pods are not endpoints: neither is ready, and
    // the terminating one is not serving either.
    let plain = table(&[service("plain", "10.96.0.92", false)], &pods);
    for ip in ["10.244.2.7", "10.244.2.8"] {
        assert!(!plain.contains(ip), "{ip} in\n{plain}");
    }
    // With it both are, as the EndpointSlice controller publishes them.
    let published = table(&[service("peers", "10.96.0.91", true)], &pods);
    for ip in ["10.244.2.7", "10.244.2.8"] {
        assert!(published.contains(ip), "{ip} missing from\n{published}");
    }
}
