//! The controller's EndpointSlices as the service proxy reads them: what the
//! controller publishes for `publishNotReadyAddresses` and for
//! `trafficDistribution` is what the proxy sends traffic to. No root needed:
//! the planners are pure, and the controller runs on a private sqlite store.

use std::process::{Command, Stdio};
use std::time::Duration;

use podnet_api::k8s_openapi::api::core::v1::{Pod, Service};
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_apiserver::endpoints::{desired, Zones};
use podnet_proxy::rules::{plan, NodeInfo, ProxyInput, Stack};
use podnet_testkit::{eventually, Proc};
use serde_json::{json, Value};

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
    let slices: Vec<_> = services
        .iter()
        .flat_map(|s| desired(s, pods, &Zones::new()))
        .collect();
    table_on(&NodeInfo::named("node1"), services, &slices)
}

fn table_on(node: &NodeInfo, services: &[Service], slices: &[EndpointSlice]) -> String {
    plan(&ProxyInput {
        node,
        stack: Stack::v4("10.244.0.0/16".parse().unwrap()),
        services,
        slices,
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

/// A private sqlite store with a real `podnet controller` working on it.
struct Standalone {
    controller: Proc,
    url: String,
    _dir: tempfile::TempDir,
}

impl Standalone {
    fn start() -> Standalone {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("state.db").display());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_podnet"));
        cmd.args(["controller", "--metrics-addr", "127.0.0.1:0"])
            .env("PODNET_STORE", &url);
        Standalone {
            controller: Proc::spawn("controller", cmd, dir.path()),
            url,
            _dir: dir,
        }
    }

    fn podnet(&self, args: &[&str], stdin: Option<&str>) -> String {
        let mut c = Command::new(env!("CARGO_BIN_EXE_podnet"));
        c.args(args)
            .env("PODNET_STORE", &self.url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        {
            use std::io::Write;
            let mut input = child.stdin.take().unwrap();
            input
                .write_all(stdin.unwrap_or_default().as_bytes())
                .unwrap();
        }
        let o = child.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "podnet {args:?} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }

    fn apply(&self, doc: &str) {
        self.podnet(&["apply", "-f", "-"], Some(doc));
    }

    fn get(&self, args: &[&str]) -> Value {
        let mut a = vec!["get"];
        a.extend(args);
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.podnet(&a, None)).unwrap()
    }

    fn slices(&self, svc: &str) -> Vec<EndpointSlice> {
        let label = format!("kubernetes.io/service-name={svc}");
        serde_json::from_value(self.get(&["ep", "-n", "default", "-l", &label])["items"].clone())
            .unwrap()
    }

    /// Polls until `f` yields (bounded): the controller works
    /// asynchronously, and must stay up meanwhile.
    fn eventually<T>(&self, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        eventually(what, Duration::from_secs(20), || {
            self.controller.check();
            f()
        })
    }
}

fn node_doc(name: &str, zone: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}, labels: {{topology.kubernetes.io/zone: {zone}}}}}\n"
    )
}

fn placed_pod_doc(name: &str, node: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, labels: {{app: peer}}}}\n\
         spec: {{nodeName: {node}, containers: [{{name: c, image: x}}]}}\n\
         status: {{phase: Running, podIP: {ip}, podIPs: [{{ip: {ip}}}], conditions: [{{type: Ready, status: \"True\"}}]}}\n"
    )
}

/// address -> (zone, forZones, forNodes) of every endpoint in `slices`.
type Topology = Vec<(String, Option<String>, Vec<String>, Vec<String>)>;

fn topology(slices: &[EndpointSlice]) -> Topology {
    let mut t: Topology = slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .map(|e| {
            let h = e.hints.clone().unwrap_or_default();
            (
                e.addresses[0].clone(),
                e.zone.clone(),
                h.for_zones.into_iter().flatten().map(|z| z.name).collect(),
                h.for_nodes.into_iter().flatten().map(|n| n.name).collect(),
            )
        })
        .collect();
    t.sort();
    t
}

/// The `ip:port`s a TCP connection to `cip:80` is DNATed to: the entries of
/// the fast path's `@fast-endpoints` map (`cip . tcp . 80 . n : ip . port`)
/// that the `dnat ... numgen random mod N map @fast-endpoints` rule picks from.
fn dnat_targets(table: &str, cip: &str) -> Vec<String> {
    let key = format!("{cip} . tcp . 80 . ");
    let mut v: Vec<String> = table
        .split(['{', '}', ',', '\n'])
        .filter_map(|e| e.trim().strip_prefix(&key))
        .filter_map(|e| e.split_once(" : "))
        .map(|(_, target)| target.replace(" . ", ":"))
        .collect();
    v.sort();
    v.dedup();
    assert!(
        table.contains("map @fast-endpoints"),
        "the fast path is not in use:\n{table}"
    );
    v
}

fn zoned(zone: Option<&str>) -> NodeInfo {
    NodeInfo {
        zone: zone.map(str::to_string),
        ..NodeInfo::named("nc")
    }
}

/// `trafficDistribution: PreferClose` through the real controller: the
/// slices carry each endpoint's own zone as its hint, the proxy on a zone-a
/// node then sends the ClusterIP only to the zone-a pod, and the hints
/// follow a Node's zone label and the Service's field; zones stay on every
/// endpoint without hints and follow the Node too.
#[test]
fn prefer_close_slices_keep_traffic_in_the_zone() {
    let c = Standalone::start();
    c.apply(&node_doc("na", "a"));
    c.apply(&node_doc("nb", "b"));
    c.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\n\
         spec: {selector: {app: peer}, trafficDistribution: PreferClose, \
         ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]}\n",
    );
    c.apply(&placed_pod_doc("pa", "na", "10.244.1.5"));
    c.apply(&placed_pod_doc("pb", "nb", "10.244.2.5"));

    let hinted = |a: &str, b: &str| -> Topology {
        vec![
            ("10.244.1.5".into(), Some(a.into()), vec![a.into()], vec![]),
            ("10.244.2.5".into(), Some(b.into()), vec![b.into()], vec![]),
        ]
    };
    let slices = c.eventually("zone hints on both endpoints", || {
        let s = c.slices("web");
        (topology(&s) == hinted("a", "b")).then_some(s)
    });
    let svc: Service = c.eventually("a ClusterIP", || {
        let v = c.get(&["svc", "web", "-n", "default"]);
        v["spec"]["clusterIP"]
            .is_string()
            .then(|| serde_json::from_value(v).unwrap())
    });
    let services = std::slice::from_ref(&svc);

    let cip = svc.spec.as_ref().unwrap().cluster_ip.clone().unwrap();
    let to = |node: &NodeInfo, slices: &[EndpointSlice]| {
        dnat_targets(&table_on(node, services, slices), &cip)
    };
    assert_eq!(to(&zoned(Some("a")), &slices), ["10.244.1.5:8080"]);
    assert_eq!(to(&zoned(Some("b")), &slices), ["10.244.2.5:8080"]);
    // A node without a zone label ignores the hints, as kube-proxy does.
    let both = ["10.244.1.5:8080", "10.244.2.5:8080"];
    assert_eq!(to(&zoned(None), &slices), both);

    // Node nb moves to zone a: its endpoint's hint follows, and a zone-a
    // node now uses both.
    c.apply(&node_doc("nb", "a"));
    let slices = c.eventually("hints after nb moved to zone a", || {
        let s = c.slices("web");
        (topology(&s) == hinted("a", "a")).then_some(s)
    });
    let on_a = table_on(&zoned(Some("a")), services, &slices);
    assert!(
        on_a.contains("10.244.1.5") && on_a.contains("10.244.2.5"),
        "{on_a}"
    );

    // Without trafficDistribution the hints go, and every endpoint keeps
    // its node's zone, as kube-controller-manager writes it.
    let mut plain = c.get(&["svc", "web", "-n", "default"]);
    plain["spec"]
        .as_object_mut()
        .unwrap()
        .remove("trafficDistribution");
    plain["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    c.apply(&plain.to_string());
    let zoned_only = |a: &str, b: &str| -> Topology {
        vec![
            ("10.244.1.5".into(), Some(a.into()), vec![], vec![]),
            ("10.244.2.5".into(), Some(b.into()), vec![], vec![]),
        ]
    };
    c.eventually("hints removed, zones kept", || {
        (topology(&c.slices("web")) == zoned_only("a", "a")).then_some(())
    });
    // A zone change reaches a Service without hints too.
    c.apply(&node_doc("nb", "c"));
    c.eventually("zone after nb moved to zone c", || {
        (topology(&c.slices("web")) == zoned_only("a", "c")).then_some(())
    });
}
