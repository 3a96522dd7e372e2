//! Differential test of podnet's standalone API-server duties against the
//! real ones (issue 13): the same Namespaces, Nodes, Pods and Services go
//! to a private podnet store with a real `podnet controller`, and to a real
//! kube-apiserver with kube-controller-manager (the lab's control plane,
//! [`podnet_lab::kube`], without any network namespace). Then, per
//! Service, both sides' EndpointSlices must agree (addressType, ports,
//! endpoints with their conditions, nodeName, targetRef, zone and hints),
//! and both must allocate ClusterIPs and NodePorts from the same ranges,
//! or none where the Service opts out.
//!
//! The same manifest text is applied to both sides. Pod status goes with
//! the manifest into the store (standalone has no status subresource) and
//! through the status subresource on the real apiserver (`kubectl patch
//! --subresource=status`), as a kubelet writes it. A terminating pod is a
//! real graceful deletion there (the pod stays, with a deletionTimestamp,
//! since no kubelet confirms it), and a deletionTimestamp in the store.
//!
//! Needs the binaries of `scripts/k8s-peers.sh` (fails loudly without).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use serde_json::{json, Value};

const NS: &str = "diff";

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn run(mut c: Command, stdin: Option<&str>) -> Output {
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn");
    {
        use std::io::Write;
        let mut i = child.stdin.take().unwrap();
        i.write_all(stdin.unwrap_or_default().as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

/// Both sides, in one private directory; everything stops and goes when
/// dropped (also on panic).
struct Sides {
    dir: PathBuf,
    rt: tokio::runtime::Runtime,
    cp: Option<podnet_lab::kube::ControlPlane>,
    kubectl: PathBuf,
    store: String,
    controller: Option<Child>,
}

impl Sides {
    fn start() -> Sides {
        Sides::start_with(false)
    }

    /// Both sides; with `dual_stack`, both have an IPv4 and an IPv6
    /// Service CIDR (`--service-cluster-ip-range` with both, and the same
    /// two in podnet's NetworkConfig).
    fn start_with(dual_stack: bool) -> Sides {
        let peers = podnet_lab::kube::Peers::find()
            .unwrap_or_else(|e| panic!("{e}\n(the binaries come from scripts/k8s-peers.sh)"));
        // One directory per instance: tests in this file run in parallel.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("pn-difkcm-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let store = format!("sqlite://{}", dir.join("state.db").display());
        let mut s = Sides {
            dir: dir.clone(),
            rt,
            cp: None,
            kubectl: peers.kubectl.clone(),
            store,
            controller: None,
        };
        let log = std::fs::File::create(dir.join("podnet-controller.log")).unwrap();
        s.controller = Some(
            Command::new(env!("CARGO_BIN_EXE_podnet"))
                .args(["controller", "--metrics-addr", "127.0.0.1:0"])
                .env("PODNET_STORE", &s.store)
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        let cp =
            s.rt.block_on(podnet_lab::kube::ControlPlane::start_with(
                &dir, &peers, None, dual_stack,
            ))
            .unwrap_or_else(|e| panic!("control plane: {e}"));
        s.cp = Some(cp);
        let conf = json!({"apiVersion": "podnet.io/v1", "kind": "NetworkConfig",
            "metadata": {"name": "default"},
            "spec": {"Network": podnet_lab::kube::CLUSTER_CIDR,
                     "ServiceCIDR": podnet_lab::kube::service_cidrs(dual_stack)}});
        s.podnet(&["apply", "-f", "-"], Some(&docs(&[conf])));
        s
    }

    fn cp(&self) -> &podnet_lab::kube::ControlPlane {
        self.cp.as_ref().unwrap()
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Value {
        let mut c = Command::new(&self.kubectl);
        c.arg("--kubeconfig")
            .arg(self.cp().admin_kubeconfig())
            .arg("--cache-dir")
            .arg(self.dir.join("kubectl-cache"))
            .args(args);
        let o = run(c, stdin);
        assert!(o.status.success(), "kubectl {args:?}: {}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
    }

    fn kubectl_raw(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut c = Command::new(&self.kubectl);
        c.arg("--kubeconfig")
            .arg(self.cp().admin_kubeconfig())
            .arg("--cache-dir")
            .arg(self.dir.join("kubectl-cache"))
            .args(args);
        run(c, stdin)
    }

    fn podnet_raw(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut c = Command::new(env!("CARGO_BIN_EXE_podnet"));
        c.args(args).env("PODNET_STORE", &self.store);
        run(c, stdin)
    }

    fn podnet(&self, args: &[&str], stdin: Option<&str>) -> Value {
        let mut c = Command::new(env!("CARGO_BIN_EXE_podnet"));
        c.args(args).env("PODNET_STORE", &self.store);
        let o = run(c, stdin);
        assert!(o.status.success(), "podnet {args:?}: {}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
    }
}

impl Drop for Sides {
    fn drop(&mut self) {
        if let Some(mut c) = self.controller.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(cp) = self.cp.take() {
            cp.stop();
        }
        // A failed start leaves its processes recorded in the directory.
        podnet_lab::kube::ControlPlane {
            dir: self.dir.clone(),
            apiserver_port: 0,
        }
        .stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One pod of the scenario: its manifest (without status), its status as
/// a kubelet would report it, and whether it is being deleted.
struct PodCase {
    name: &'static str,
    app: &'static str,
    node: &'static str,
    ports: Value,
    status: Value,
    terminating: bool,
}

fn running(ip: &str, ready: bool) -> Value {
    json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
           "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]})
}

fn pods() -> Vec<PodCase> {
    let http = |p: i64| json!({"name": "http", "containerPort": p, "protocol": "TCP"});
    let dns = json!({"name": "dns", "containerPort": 5353, "protocol": "UDP"});
    vec![
        PodCase {
            name: "ready-a",
            app: "diff",
            node: "node-a",
            ports: json!([http(8080), dns]),
            status: running("10.244.1.10", true),
            terminating: false,
        },
        // Its named port resolves to another number: a second port set.
        PodCase {
            name: "ready-b",
            app: "diff",
            node: "node-b",
            ports: json!([http(9090)]),
            status: running("10.244.2.10", true),
            terminating: false,
        },
        PodCase {
            name: "unready",
            app: "diff",
            node: "node-a",
            ports: json!([http(8080), dns]),
            status: running("10.244.1.11", false),
            terminating: false,
        },
        PodCase {
            name: "leaving",
            app: "diff",
            node: "node-b",
            ports: json!([http(8080)]),
            status: running("10.244.2.11", true),
            terminating: true,
        },
        PodCase {
            name: "pending",
            app: "diff",
            node: "node-a",
            ports: json!([http(8080)]),
            status: json!({"phase": "Pending"}),
            terminating: false,
        },
        PodCase {
            name: "done",
            app: "diff",
            node: "node-b",
            ports: json!([http(8080)]),
            status: json!({"phase": "Succeeded", "podIP": "10.244.2.12",
                           "podIPs": [{"ip": "10.244.2.12"}],
                           "conditions": [{"type": "Ready", "status": "False"}]}),
            terminating: false,
        },
        // Declares no ports: named targetPorts do not resolve for it.
        PodCase {
            name: "bare",
            app: "diff",
            node: "node-a",
            ports: json!([]),
            status: running("10.244.1.12", true),
            terminating: false,
        },
        PodCase {
            name: "other",
            app: "other",
            node: "node-b",
            ports: json!([http(8080)]),
            status: running("10.244.2.13", true),
            terminating: false,
        },
    ]
}

fn pod_manifest(p: &PodCase) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": p.name, "namespace": NS, "labels": {"app": p.app}},
           "spec": {"nodeName": p.node, "automountServiceAccountToken": false,
                    "containers": [{"name": "c", "image": "x", "ports": p.ports}]}})
}

fn service(name: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["selector"] = json!({"app": "diff"});
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": NS}, "spec": spec})
}

fn services() -> Vec<Value> {
    let web = json!({"name": "web", "port": 80, "targetPort": "http"});
    vec![
        // Several ports, named targetPorts, one of them UDP.
        service(
            "named",
            json!({"ports": [web,
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns"}]}),
        ),
        service(
            "unnamed",
            json!({"ports": [{"port": 80, "targetPort": 8080}]}),
        ),
        service(
            "notready",
            json!({"publishNotReadyAddresses": true, "ports": [web]}),
        ),
        service(
            "headless",
            json!({"clusterIP": "None",
                   "ports": [{"name": "web", "port": 80, "targetPort": 8080}]}),
        ),
        service("nodeport", json!({"type": "NodePort", "ports": [web]})),
        // Topology: hints for the endpoint's zone, or its node and zone.
        service(
            "close",
            json!({"trafficDistribution": "PreferClose", "ports": [web]}),
        ),
        service(
            "samenode",
            json!({"trafficDistribution": "PreferSameNode", "ports": [web]}),
        ),
        service(
            "lb",
            json!({"type": "LoadBalancer", "ports": [
                {"name": "a", "port": 80, "targetPort": 8080, "appProtocol": "http"},
                {"name": "b", "port": 443, "targetPort": 8443}]}),
        ),
    ]
}

/// Multi-document YAML, as a user would write it for either tool.
fn docs(objs: &[Value]) -> String {
    objs.iter()
        .map(|o| serde_yaml::to_string(o).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

/// One endpoint as its slice publishes it, with the slice's address type
/// and ports: the unit both sides are compared in (how endpoints are split
/// into slices is the controller's business). Ports as written, so an
/// omitted name differs from "" (Kubernetes writes "" for unnamed ports).
type Row = (
    String,                                             // addressType
    Vec<(Option<String>, i64, String, Option<String>)>, // name, port, protocol, appProtocol
    String,                                             // address
    (bool, bool, bool),                                 // ready, serving, terminating
    String,                                             // nodeName
    String,                                             // targetRef name
    Topology,
);

/// An endpoint's zone and its hints: forZones, forNodes.
type Topology = (Option<String>, Vec<String>, Vec<String>);

fn topology(e: &Value) -> Topology {
    let names = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| h["name"].as_str().map(str::to_string))
            .collect()
    };
    (
        e["zone"].as_str().map(str::to_string),
        names(&e["hints"]["forZones"]),
        names(&e["hints"]["forNodes"]),
    )
}

fn rows(slices: &Value) -> BTreeMap<String, BTreeSet<Row>> {
    let mut out: BTreeMap<String, BTreeSet<Row>> = BTreeMap::new();
    for s in slices["items"].as_array().into_iter().flatten() {
        let svc = s["metadata"]["labels"]["kubernetes.io/service-name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let set = out.entry(svc).or_default();
        let mut ports: Vec<_> = s["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                (
                    p["name"].as_str().map(str::to_string),
                    p["port"].as_i64().unwrap_or(-1),
                    p["protocol"].as_str().unwrap_or("TCP").to_string(),
                    p["appProtocol"].as_str().map(str::to_string),
                )
            })
            .collect();
        ports.sort();
        let at = s["addressType"].as_str().unwrap_or_default().to_string();
        for e in s["endpoints"].as_array().into_iter().flatten() {
            let c = &e["conditions"];
            for a in e["addresses"].as_array().into_iter().flatten() {
                set.insert((
                    at.clone(),
                    ports.clone(),
                    a.as_str().unwrap_or_default().to_string(),
                    (
                        c["ready"].as_bool().unwrap_or(false),
                        c["serving"].as_bool().unwrap_or(false),
                        c["terminating"].as_bool().unwrap_or(false),
                    ),
                    e["nodeName"].as_str().unwrap_or_default().to_string(),
                    e["targetRef"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    topology(e),
                ));
            }
        }
    }
    out
}

/// What differs between the two sides, one line per row (empty: agreed).
fn diff(
    real: &BTreeMap<String, BTreeSet<Row>>,
    ours: &BTreeMap<String, BTreeSet<Row>>,
) -> Vec<String> {
    let mut out = Vec::new();
    let names: BTreeSet<&String> = real.keys().chain(ours.keys()).collect();
    let empty = BTreeSet::new();
    for n in names {
        let (r, o) = (real.get(n).unwrap_or(&empty), ours.get(n).unwrap_or(&empty));
        for x in r.difference(o) {
            out.push(format!("{n}: only kube-controller-manager: {x:?}"));
        }
        for x in o.difference(r) {
            out.push(format!("{n}: only podnet controller:     {x:?}"));
        }
    }
    out
}

fn show(rows: &BTreeMap<String, BTreeSet<Row>>) -> String {
    rows.iter()
        .flat_map(|(svc, set)| set.iter().map(move |r| format!("  {svc}: {r:?}")))
        .collect::<Vec<_>>()
        .join("\n")
}

fn has(
    rows: &BTreeMap<String, BTreeSet<Row>>,
    svc: &str,
    ip: &str,
    cond: (bool, bool, bool),
) -> bool {
    rows.get(svc)
        .map(|s| s.iter().any(|r| r.2 == ip && r.3 == cond))
        .unwrap_or(false)
}

/// A Service's clusterIP and its ports' (name, nodePort).
type Allocation = (String, Vec<(String, Option<i64>)>);

/// Per Service, its allocations, checked on each side.
fn allocations(svcs: &Value) -> BTreeMap<String, Allocation> {
    svcs["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let ports = s["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    (
                        p["name"].as_str().unwrap_or_default().to_string(),
                        p["nodePort"].as_i64(),
                    )
                })
                .collect();
            (
                s["metadata"]["name"].as_str().unwrap().to_string(),
                (
                    s["spec"]["clusterIP"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    ports,
                ),
            )
        })
        .collect()
}

type Rows = BTreeMap<String, BTreeSet<Row>>;

/// Polls both sides until the real one is `settled` (the writes of the
/// step have reached its controller) and both publish the same endpoints,
/// or a deadline passes (then fails with the difference). Returns both
/// sides.
fn converge(sides: &Sides, what: &str, settled: impl Fn(&Rows) -> bool) -> (Rows, Rows) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let real = rows(&sides.kubectl(&["get", "endpointslices", "-n", NS, "-o", "json"], None));
        let standalone =
            rows(&sides.podnet(&["get", "endpointslices", "-n", NS, "-o", "json"], None));
        let settled = settled(&real);
        let d = diff(&real, &standalone);
        if settled && d.is_empty() {
            break (real, standalone);
        }
        if Instant::now() > deadline {
            panic!(
                "{what}: the sides disagree (real settled: {settled}):\n{}\n\nkube-controller-manager:\n{}\n\npodnet:\n{}",
                d.join("\n"),
                show(&real),
                show(&standalone)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn standalone_controller_agrees_with_kube_controller_manager() {
    let sides = Sides::start();
    let c = sides.rt.block_on(sides.cp().client()).unwrap();

    // The same manifests to both sides.
    let mut base = vec![json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})];
    for (n, zone) in [("node-a", "zone-a"), ("node-b", "zone-b")] {
        base.push(json!({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": n, "labels": {"topology.kubernetes.io/zone": zone}}}));
    }
    let cases = pods();

    // Real: pods are created, then their kubelet writes status through the
    // status subresource; the terminating one is deleted gracefully.
    sides.kubectl(&["apply", "-f", "-"], Some(&docs(&base)));
    sides
        .rt
        .block_on(podnet_lab::kubelet::ensure_namespace(&c, NS))
        .unwrap();
    let manifests: Vec<Value> = cases.iter().map(pod_manifest).collect();
    sides.kubectl(&["apply", "-f", "-"], Some(&docs(&manifests)));
    for p in &cases {
        let patch = json!({"status": p.status}).to_string();
        sides.kubectl(
            &[
                "patch",
                "pod",
                p.name,
                "-n",
                NS,
                "--subresource=status",
                "--type=merge",
                "-p",
                &patch,
                "-o",
                "json",
            ],
            None,
        );
        if p.terminating {
            sides.kubectl(&["delete", "pod", p.name, "-n", NS, "--wait=false"], None);
        }
    }
    sides.kubectl(&["apply", "-f", "-"], Some(&docs(&services())));

    // Standalone: status and deletion timestamp go in with the manifest.
    let mut ours = base.clone();
    for (p, mut m) in cases.iter().zip(manifests) {
        m["status"] = p.status.clone();
        if p.terminating {
            m["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        ours.push(m);
    }
    ours.extend(services());
    sides.podnet(&["apply", "-f", "-"], Some(&docs(&ours)));

    // Both converge: the real side is settled once the late writes show
    // (the unready pod published, the leaving one terminating), and then
    // both sides publish the same endpoints.
    let (real, standalone) = converge(&sides, "created", |real| {
        has(real, "notready", "10.244.1.11", (true, false, false))
            && has(real, "named", "10.244.2.11", (false, true, true))
            && has(real, "lb", "10.244.1.10", (true, true, false))
            && real
                .get("close")
                .is_some_and(|s| s.iter().any(|r| r.6 .0.is_some()))
    });
    assert_eq!(real, standalone);
    // Every pod sits on a zoned node, so every endpoint carries its zone,
    // with hints or without (upstream podToEndpoint): checked on the real
    // side, so the scenario is, and equal on both.
    for (svc, set) in &real {
        for r in set {
            let zone = if r.4 == "node-a" { "zone-a" } else { "zone-b" };
            assert_eq!(r.6 .0.as_deref(), Some(zone), "{svc}: {r:?}");
        }
    }
    // Not vacuous: every Service has endpoints, and the semantics hold.
    for s in [
        "named", "unnamed", "notready", "headless", "nodeport", "lb", "close", "samenode",
    ] {
        assert!(
            real.get(s).is_some_and(|r| !r.is_empty()),
            "{s}: no endpoints"
        );
    }
    let ips = |svc: &str| -> BTreeSet<String> { real[svc].iter().map(|r| r.2.clone()).collect() };
    for excluded in ["10.244.2.12", "10.244.2.13"] {
        assert!(
            !ips("unnamed").contains(excluded),
            "{excluded} in {:?}",
            ips("unnamed")
        );
    }

    // Allocations come from the same ranges on both sides.
    let cidr: Ipv4Net = "10.96.0.0/12".parse().unwrap();
    let real_alloc =
        allocations(&sides.kubectl(&["get", "services", "-n", NS, "-o", "json"], None));
    let our_alloc = allocations(&sides.podnet(&["get", "services", "-n", NS, "-o", "json"], None));
    for (side, alloc) in [("kube-apiserver", &real_alloc), ("podnet", &our_alloc)] {
        assert_eq!(alloc.len(), 8, "{side}: {alloc:?}");
        for (name, (ip, ports)) in alloc {
            if name == "headless" {
                assert_eq!(ip, "None", "{side} {name}");
            } else {
                let ip: std::net::Ipv4Addr = ip
                    .parse()
                    .unwrap_or_else(|_| panic!("{side} {name}: clusterIP {ip:?}"));
                assert!(cidr.contains(&ip), "{side} {name}: {ip} not in {cidr}");
            }
            let wants_node_port = name == "nodeport" || name == "lb";
            for (port, np) in ports {
                match np {
                    Some(np) => {
                        assert!(wants_node_port, "{side} {name}/{port}: nodePort {np}");
                        assert!((30000..=32767).contains(np), "{side} {name}/{port}: {np}");
                    }
                    None => assert!(!wants_node_port, "{side} {name}/{port}: no nodePort"),
                }
            }
        }
    }

    // Changes follow alike: ready-b stops being ready (its kubelet says so
    // through the status subresource), and unready is deleted for good.
    let not_ready = running("10.244.2.10", false);
    let patch = json!({"status": not_ready}).to_string();
    sides.kubectl(
        &[
            "patch",
            "pod",
            "ready-b",
            "-n",
            NS,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
            "-o",
            "json",
        ],
        None,
    );
    sides.kubectl(
        &[
            "delete",
            "pod",
            "unready",
            "-n",
            NS,
            "--grace-period=0",
            "--force",
        ],
        None,
    );
    let ready_b = cases.iter().find(|p| p.name == "ready-b").unwrap();
    let mut m = pod_manifest(ready_b);
    m["status"] = not_ready;
    sides.podnet(&["apply", "-f", "-"], Some(&docs(&[m])));
    sides.podnet(&["delete", "pod", "unready", "-n", NS], None);
    let (real, standalone) = converge(&sides, "changed", |real| {
        has(real, "unnamed", "10.244.2.10", (false, false, false))
            && !real["unnamed"].iter().any(|r| r.2 == "10.244.1.11")
    });
    assert_eq!(real, standalone);
    assert!(has(
        &standalone,
        "close",
        "10.244.2.10",
        (false, false, false)
    ));
    assert!(!standalone["named"].iter().any(|r| r.2 == "10.244.1.11"));
}

/// What a side made of one Service: rejected (with the reason), or its
/// clusterIP and nodePorts once allocated.
#[derive(Debug, PartialEq)]
enum Outcome {
    Rejected(String),
    Made(String, Vec<Option<i64>>),
}

impl Outcome {
    fn accepted(&self) -> bool {
        matches!(self, Outcome::Made(..))
    }
}

/// Polls a side's Service until its allocations are done (a ClusterIP, or
/// none for ExternalName/headless; a nodePort on every port of a NodePort
/// or LoadBalancer Service unless allocation is off).
fn made(get: impl Fn() -> Option<Value>) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = get() {
            let spec = &v["spec"];
            let ip = spec["clusterIP"].as_str().unwrap_or_default().to_string();
            let ports: Vec<Option<i64>> = spec["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| p["nodePort"].as_i64())
                .collect();
            let ty = spec["type"].as_str().unwrap_or("ClusterIP");
            let want_ip = ty != "ExternalName";
            let want_np = (ty == "NodePort" || ty == "LoadBalancer")
                && spec["allocateLoadBalancerNodePorts"] != false;
            if (!want_ip || !ip.is_empty()) && (!want_np || ports.iter().all(Option::is_some)) {
                return Outcome::Made(ip, ports);
            }
            if Instant::now() > deadline {
                return Outcome::Made(ip, ports);
            }
        } else if Instant::now() > deadline {
            return Outcome::Rejected("accepted but never readable".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The same allocation requests, one Service at a time, in order, to both
/// sides: both must accept and reject the same ones, honour requested
/// addresses and ports, and allocate the rest from the same ranges.
#[test]
fn allocation_requests_are_accepted_and_rejected_alike() {
    let sides = Sides::start();
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
    sides.kubectl(
        &["apply", "-f", "-"],
        Some(&docs(std::slice::from_ref(&ns))),
    );
    sides.podnet(&["apply", "-f", "-"], Some(&docs(&[ns])));

    let p = |port: i64| json!({"name": "p", "port": port, "targetPort": 8080});
    let np = |port: i64, node_port: i64| json!({"name": "p", "port": port, "nodePort": node_port});
    let cases: Vec<(&str, Value, bool)> = vec![
        (
            "fixed-ip",
            json!({"clusterIP": "10.96.100.100", "ports": [p(80)]}),
            true,
        ),
        (
            "outside-range",
            json!({"clusterIP": "10.0.0.5", "ports": [p(80)]}),
            false,
        ),
        (
            "taken-ip",
            json!({"clusterIP": "10.96.100.100", "ports": [p(81)]}),
            false,
        ),
        (
            "fixed-np",
            json!({"type": "NodePort", "ports": [np(80, 30080)]}),
            true,
        ),
        (
            "np-below",
            json!({"type": "NodePort", "ports": [np(80, 29999)]}),
            false,
        ),
        (
            "np-above",
            json!({"type": "NodePort", "ports": [np(80, 32768)]}),
            false,
        ),
        (
            "taken-np",
            json!({"type": "NodePort", "ports": [np(81, 30080)]}),
            false,
        ),
        ("np-on-clusterip", json!({"ports": [np(80, 30081)]}), false),
        (
            "headless-np",
            json!({"type": "NodePort", "clusterIP": "None", "ports": [p(80)]}),
            false,
        ),
        (
            "lb-no-np",
            json!({"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
                            "ports": [p(80)]}),
            true,
        ),
        (
            "lb-two",
            json!({"type": "LoadBalancer", "ports": [
            {"name": "a", "port": 80}, {"name": "b", "port": 81, "protocol": "UDP"}]}),
            true,
        ),
        (
            "external",
            json!({"type": "ExternalName", "externalName": "example.com"}),
            true,
        ),
        (
            "headless",
            json!({"clusterIP": "None", "ports": [p(80)]}),
            true,
        ),
        ("auto", json!({"ports": [p(80)]}), true),
    ];
    let mut findings = Vec::new();
    let cidr: Ipv4Net = "10.96.0.0/12".parse().unwrap();
    let mut real_seen = 0;
    for (name, spec, kube_accepts) in &cases {
        let doc = docs(&[json!({"apiVersion": "v1", "kind": "Service",
                                "metadata": {"name": name, "namespace": NS}, "spec": spec})]);
        let real = match sides.kubectl_raw(&["apply", "-f", "-"], Some(&doc)) {
            o if o.status.success() => made(|| {
                let o = sides.kubectl_raw(&["get", "svc", name, "-n", NS, "-o", "json"], None);
                o.status
                    .success()
                    .then(|| serde_json::from_slice(&o.stdout).unwrap())
            }),
            o => Outcome::Rejected(text(&o).trim().to_string()),
        };
        let ours = match sides.podnet_raw(&["apply", "-f", "-"], Some(&doc)) {
            o if o.status.success() => made(|| {
                let o = sides.podnet_raw(&["get", "svc", name, "-n", NS, "-o", "json"], None);
                o.status
                    .success()
                    .then(|| serde_json::from_slice(&o.stdout).unwrap())
            }),
            o => Outcome::Rejected(text(&o).trim().to_string()),
        };
        // The expectation is Kubernetes' documented behaviour; the real
        // side confirms it, so the scenario itself is checked.
        assert_eq!(
            real.accepted(),
            *kube_accepts,
            "{name}: kube-apiserver: {real:?}"
        );
        real_seen += 1;
        if real.accepted() != ours.accepted() {
            findings.push(format!(
                "{name}: kube-apiserver {real:?}\n    podnet {ours:?}"
            ));
            continue;
        }
        let (Outcome::Made(rip, rnp), Outcome::Made(oip, onp)) = (&real, &ours) else {
            continue;
        };
        for (side, ip, nps) in [("kube-apiserver", rip, rnp), ("podnet", oip, onp)] {
            match spec["clusterIP"].as_str() {
                Some(want) => {
                    if ip != want {
                        findings.push(format!("{name}: {side} clusterIP {ip}, asked {want}"));
                    }
                }
                None if spec["type"] == "ExternalName" => {
                    if !ip.is_empty() {
                        findings.push(format!("{name}: {side} gave ExternalName clusterIP {ip}"));
                    }
                }
                None => {
                    if !ip
                        .parse()
                        .is_ok_and(|a: std::net::Ipv4Addr| cidr.contains(&a))
                    {
                        findings.push(format!("{name}: {side} clusterIP {ip:?} not in {cidr}"));
                    }
                }
            }
            for n in nps.iter().flatten() {
                if !(30000..=32767).contains(n) {
                    findings.push(format!("{name}: {side} nodePort {n} out of range"));
                }
            }
        }
        let have = |v: &Vec<Option<i64>>| v.iter().map(Option::is_some).collect::<Vec<_>>();
        // allocateLoadBalancerNodePorts: false gives no node port: the
        // real side confirms the scenario, both sides must agree on it.
        if name == &"lb-no-np" {
            assert_eq!(have(rnp), [false], "{name}: kube-apiserver {rnp:?}");
        }
        if have(rnp) != have(onp) {
            findings.push(format!(
                "{name}: nodePorts kube-apiserver {rnp:?}, podnet {onp:?}"
            ));
        }
        if name == &"fixed-np" && (rnp[0] != Some(30080) || onp[0] != Some(30080)) {
            findings.push(format!("{name}: nodePort 30080 asked: {rnp:?} / {onp:?}"));
        }
    }
    assert_eq!(real_seen, cases.len());
    assert!(
        findings.is_empty(),
        "the sides disagree:\n{}",
        findings.join("\n")
    );
}

/// What a side made of a Service's families: rejected, or its policy, its
/// families and the family of each ClusterIP, once every family has its
/// address.
#[derive(Debug, PartialEq)]
enum Families {
    Rejected(String),
    Made {
        policy: String,
        families: Vec<String>,
        ips: Vec<String>,
    },
}

fn family_of(ip: &str) -> String {
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => "IPv4".into(),
        Ok(std::net::IpAddr::V6(_)) => "IPv6".into(),
        Err(_) => ip.to_string(),
    }
}

/// Polls a side's Service until each family has a ClusterIP (headless and
/// ExternalName Services have none), then reads what it got.
fn families_of(get: impl Fn() -> Option<Value>) -> (Families, Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = get();
        let settled = v.as_ref().is_some_and(|v| {
            let spec = &v["spec"];
            let fams = spec["ipFamilies"].as_array().map_or(0, Vec::len);
            let ips = spec["clusterIPs"].as_array().map_or(0, Vec::len);
            spec["type"] == "ExternalName" || spec["clusterIP"] == "None" || ips >= fams.max(1)
        });
        if settled || Instant::now() > deadline {
            let Some(v) = v else {
                return (Families::Rejected("never readable".into()), vec![]);
            };
            let spec = &v["spec"];
            let strs = |k: &str| -> Vec<String> {
                spec[k]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            };
            let ips = strs("clusterIPs");
            let made = Families::Made {
                policy: spec["ipFamilyPolicy"].as_str().unwrap_or("-").into(),
                families: strs("ipFamilies"),
                ips: ips.iter().map(|i| family_of(i)).collect(),
            };
            return (made, ips);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One side's answer to one Service document.
fn families_made(sides: &Sides, kubectl: bool, name: &str, doc: &str) -> (Families, Vec<String>) {
    let (apply, get) = match kubectl {
        true => (
            sides.kubectl_raw(&["apply", "-f", "-"], Some(doc)),
            Box::new(|| sides.kubectl_raw(&["get", "svc", name, "-n", NS, "-o", "json"], None))
                as Box<dyn Fn() -> Output + '_>,
        ),
        false => (
            sides.podnet_raw(&["apply", "-f", "-"], Some(doc)),
            Box::new(|| sides.podnet_raw(&["get", "svc", name, "-n", NS, "-o", "json"], None))
                as Box<dyn Fn() -> Output + '_>,
        ),
    };
    if !apply.status.success() {
        return (Families::Rejected(text(&apply).trim().to_string()), vec![]);
    }
    families_of(|| {
        let o = get();
        o.status
            .success()
            .then(|| serde_json::from_slice(&o.stdout).unwrap())
    })
}

/// The cases of the family tests: name, spec, whether Kubernetes accepts
/// it (its documented behaviour, confirmed by the real side).
fn family_cases(dual: bool) -> Vec<(&'static str, Value, bool)> {
    let p = json!([{"name": "p", "port": 80}]);
    let sel = json!({"app": "x"});
    let mut cases = vec![
        ("default", json!({"ports": p, "selector": sel}), true),
        (
            "prefer",
            json!({"ports": p, "ipFamilyPolicy": "PreferDualStack"}),
            true,
        ),
        (
            "require",
            json!({"ports": p, "ipFamilyPolicy": "RequireDualStack"}),
            dual,
        ),
        ("v6", json!({"ports": p, "ipFamilies": ["IPv6"]}), dual),
        (
            "v6-first",
            json!({"ports": p, "ipFamilies": ["IPv6", "IPv4"], "ipFamilyPolicy": "RequireDualStack"}),
            dual,
        ),
        (
            "v6-prefer",
            json!({"ports": p, "ipFamilies": ["IPv6"], "ipFamilyPolicy": "PreferDualStack"}),
            dual,
        ),
        (
            "nodeport-prefer",
            json!({"type": "NodePort", "ports": p, "ipFamilyPolicy": "PreferDualStack"}),
            true,
        ),
    ];
    cases.extend(address_family_cases(dual));
    if !dual {
        cases.retain(|(n, ..)| !n.starts_with("fixed-pair"));
    }
    cases
}

/// The rest of [`family_cases`]: given addresses (the cluster must hold
/// their family and range), headless Services, and values Kubernetes
/// refuses on any cluster.
fn address_family_cases(dual: bool) -> Vec<(&'static str, Value, bool)> {
    let p = json!([{"name": "p", "port": 80}]);
    let sel = json!({"app": "x"});
    vec![
        (
            "two-single",
            json!({"ports": p, "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "SingleStack"}),
            false,
        ),
        (
            "two-no-policy",
            json!({"ports": p, "ipFamilies": ["IPv4", "IPv6"]}),
            false,
        ),
        (
            "fixed-v6",
            json!({"ports": p, "clusterIP": "fd00:10:96::100"}),
            dual,
        ),
        (
            "fixed-pair",
            json!({"ports": p, "clusterIP": "10.96.100.101",
                   "clusterIPs": ["10.96.100.101", "fd00:10:96::101"],
                   "ipFamilyPolicy": "RequireDualStack"}),
            dual,
        ),
        (
            "pair-one-family",
            json!({"ports": p, "clusterIP": "10.96.100.102",
                   "clusterIPs": ["10.96.100.102", "10.96.100.103"],
                   "ipFamilyPolicy": "RequireDualStack"}),
            false,
        ),
        (
            "v6-outside",
            json!({"ports": p, "clusterIP": "fd00:99::1"}),
            false,
        ),
        (
            "family-mismatch",
            json!({"ports": p, "clusterIP": "10.96.100.104", "ipFamilies": ["IPv6"]}),
            false,
        ),
        (
            "headless-selectorless",
            json!({"ports": p, "clusterIP": "None"}),
            true,
        ),
        (
            "headless-selector",
            json!({"ports": p, "clusterIP": "None", "selector": sel}),
            true,
        ),
        (
            "external-policy",
            json!({"type": "ExternalName", "externalName": "example.com",
                   "ipFamilyPolicy": "SingleStack"}),
            false,
        ),
        (
            "bad-family",
            json!({"ports": p, "ipFamilies": ["IPv5"]}),
            false,
        ),
        (
            "bad-policy",
            json!({"ports": p, "ipFamilyPolicy": "DualStack"}),
            false,
        ),
    ]
}

/// Families and ClusterIPs on a single-stack and on a dual-stack
/// cluster: both sides accept and reject the same Services and give the
/// same policy, families and address families; each address is in its
/// family's range. Then one Service is upgraded to dual-stack, downgraded,
/// and refused a release of its second address without `SingleStack`.
fn families_alike(dual: bool) {
    let sides = Sides::start_with(dual);
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
    let ns_doc = docs(std::slice::from_ref(&ns));
    sides.kubectl(&["apply", "-f", "-"], Some(&ns_doc));
    sides.podnet(&["apply", "-f", "-"], Some(&ns_doc));
    let svc = |name: &str, spec: &Value| {
        docs(&[json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": NS}, "spec": spec})])
    };
    let ranges: Vec<ipnet::IpNet> = podnet_lab::kube::service_cidrs(dual)
        .split(',')
        .map(|c| c.parse().unwrap())
        .collect();
    let mut findings = Vec::new();
    let cases = family_cases(dual);
    for (name, spec, kube_accepts) in &cases {
        let doc = svc(name, spec);
        let (real, real_ips) = families_made(&sides, true, name, &doc);
        let (ours, our_ips) = families_made(&sides, false, name, &doc);
        let accepted = |f: &Families| matches!(f, Families::Made { .. });
        assert_eq!(
            accepted(&real),
            *kube_accepts,
            "{name}: kube-apiserver: {real:?}"
        );
        match (&real, &ours) {
            (Families::Rejected(_), Families::Rejected(_)) => {}
            (r, o) if r != o => {
                findings.push(format!("{name}: kube-apiserver {r:?}\n    podnet {o:?}"))
            }
            _ => {}
        }
        for (side, ips) in [("kube-apiserver", &real_ips), ("podnet", &our_ips)] {
            for ip in ips.iter().filter(|ip| *ip != "None") {
                let a: std::net::IpAddr = ip.parse().unwrap();
                if !ranges.iter().any(|r| r.contains(&a)) {
                    findings.push(format!("{name}: {side} clusterIP {ip} not in {ranges:?}"));
                }
            }
        }
    }
    if dual {
        let p = json!([{"name": "p", "port": 80}]);
        let steps = [
            ("single", json!({"ports": p}), true),
            (
                "upgrade",
                json!({"ports": p, "ipFamilyPolicy": "PreferDualStack"}),
                true,
            ),
            (
                "release-without-single",
                json!({"ports": p, "ipFamilyPolicy": "RequireDualStack",
                       "ipFamilies": ["IPv4"]}),
                false,
            ),
            (
                "downgrade",
                json!({"ports": p, "ipFamilyPolicy": "SingleStack"}),
                true,
            ),
        ];
        let mut first = (None, None);
        for (step, spec, kube_accepts) in steps {
            let doc = svc("moving", &spec);
            let (real, real_ips) = families_made(&sides, true, "moving", &doc);
            let (ours, our_ips) = families_made(&sides, false, "moving", &doc);
            let ok = |f: &Families| matches!(f, Families::Made { .. });
            assert_eq!(ok(&real), kube_accepts, "{step}: kube-apiserver: {real:?}");
            if ok(&real) != ok(&ours) || (ok(&real) && real != ours) {
                findings.push(format!(
                    "moving/{step}: kube-apiserver {real:?}\n    podnet {ours:?}"
                ));
            }
            // The primary address never changes.
            let (r0, o0) = (real_ips.first().cloned(), our_ips.first().cloned());
            if first.0.is_none() {
                first = (r0, o0);
            } else if ok(&real) && (first.0 != r0 || first.1 != o0) {
                findings.push(format!("moving/{step}: the primary ClusterIP changed"));
            }
        }
    }
    assert!(
        findings.is_empty(),
        "the sides disagree:\n{}",
        findings.join("\n")
    );
}

#[test]
fn service_families_are_given_alike_on_a_dual_stack_cluster() {
    families_alike(true);
}

#[test]
fn service_families_are_given_alike_on_a_single_stack_cluster() {
    families_alike(false);
}
