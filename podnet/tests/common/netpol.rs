//! The NetworkPolicy end-to-end harness, after the Kubernetes e2e suite
//! (test/e2e/network/netpol): a fixed [`Model`] of pods in a lab, a
//! [`Reachability`] truth table of what should connect, and a check that
//! probes every pair with real traffic ([`Harness::check`]), retries until
//! enforcement converges, and prints the expected and observed tables side
//! by side when it does not.
//!
//! - The model: namespaces `x`, `y`, `z` (labels `ns=<name>`, plus the
//!   `kubernetes.io/metadata.name` the API server adds), pods `a`, `b`, `c`
//!   in each (label `pod=<name>`), spread over the lab's two nodes, each
//!   serving TCP and UDP on ports 80 and 81 with the container port names
//!   `serve-80-tcp`, `serve-80-udp`, `serve-81-tcp`, `serve-81-udp`; one
//!   ClusterIP Service `s-<pod>` per pod with the same four ports, whose
//!   targetPorts are those names.
//! - Policies, label changes and deletions go through the real front doors:
//!   `podnet apply`/`podnet delete` on the lab's store in standalone mode,
//!   a real kubectl against the lab's kube-apiserver in Kubernetes mode
//!   ([`Cluster`]).
//! - A probe is one connection from a pod's network namespace
//!   ([`podnet_lab::Lab::reach`]) asking who answers. An expected ALLOW must
//!   connect and be answered by the pod the table names (through a Service,
//!   by its endpoint); an expected DENY must time out: a policy drops. A
//!   refusal would be a reject rule or no server, and fails the check.
//! - Self pairs: a pod reaching its own IP never leaves its namespace, so
//!   that pair is expected allowed whatever the table says; through its own
//!   Service (hairpin) the pair is not checked, as Kubernetes leaves it
//!   undefined (kubernetes#95879).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use podnet_lab::Reach;
use podnet_testkit::require_root;
use serde_json::Value;

#[path = "kubectl.rs"]
mod kubectl;

pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
pub const PODS: [&str; 3] = ["a", "b", "c"];
/// The lab's nodes; pods alternate between them.
pub const NODES: usize = 2;
/// Every pod serves these, named as in the e2e suite.
pub const PORTS: &str =
    "serve-80-tcp=80/tcp,serve-80-udp=80/udp,serve-81-tcp=81/tcp,serve-81-udp=81/udp";
/// How long one probe waits for a connection or an answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a table may take to match after a change (enforcement
/// converging).
pub const CONVERGE: Duration = Duration::from_secs(30);
/// A mismatching table that has not changed for this long is final.
pub const STABLE: Duration = Duration::from_secs(8);
/// The pause between two rounds of a check that did not match yet.
const ROUND_PAUSE: Duration = Duration::from_millis(100);
/// Probes in flight at once.
const PARALLEL: usize = 64;
/// The cluster DNS Service.
pub const DNS_IP: &str = "10.96.0.10";

/// Which mode a lab runs in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Standalone,
    Kube,
}

// ---- The lab and its front doors.

/// A lab for one test (`lab down` on drop) and the tools that change its
/// objects: `podnet` on its store, or kubectl against its apiserver.
pub struct Cluster {
    pub name: String,
    pub mode: Mode,
    pub lab: podnet_lab::Lab,
    kubectl: Option<String>,
    /// A `--dual-stack` lab: the model's pod addresses are IPv6.
    pub dual: bool,
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run_with_stdin(cmd: &mut Command, stdin: Option<&str>) -> Output {
    let mut p = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut i = p.stdin.take().unwrap();
    if let Some(t) = stdin {
        i.write_all(t.as_bytes()).unwrap();
    }
    drop(i);
    p.wait_with_output().unwrap()
}

impl Cluster {
    /// `podnet lab up` with two vxlan nodes: `tag` (2 letters) plus the
    /// mode's letter and the process id name the lab.
    pub fn up(mode: Mode, tag: &str) -> Cluster {
        Cluster::up_with(mode, tag, false)
    }

    /// [`Cluster::up`], dual-stack with `dual`.
    pub fn up_with(mode: Mode, tag: &str, dual: bool) -> Cluster {
        require_root();
        let m = match (mode == Mode::Kube, dual) {
            (true, false) => 'k',
            (false, false) => 's',
            (true, true) => 'q',
            (false, true) => 'd',
        };
        let name = format!("{tag}{m}{}", std::process::id() % 100_000);
        let exe = env!("CARGO_BIN_EXE_podnet").into();
        let c = Cluster {
            lab: podnet_lab::Lab::new(&name, exe).expect("lab name"),
            name,
            mode,
            kubectl: (mode == Mode::Kube).then(|| kubectl::path().display().to_string()),
            dual,
        };
        let nodes = NODES.to_string();
        let mut args = vec![
            "up",
            "--nodes",
            &nodes,
            "--backend",
            "vxlan",
            "--resync",
            "1",
        ];
        if mode == Mode::Kube {
            args.push("--kube");
        }
        if dual {
            args.push("--dual-stack");
        }
        c.lab_ok(&args);
        c
    }

    pub fn store(&self) -> String {
        format!("sqlite:///run/podnet-lab/{}/state.db", self.name)
    }

    /// `podnet ARGS` (on the lab's store in standalone mode).
    pub fn podnet(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut c = Command::new(env!("CARGO_BIN_EXE_podnet"));
        if self.mode == Mode::Standalone {
            c.args(["--store", &self.store()]);
        }
        c.args(args);
        run_with_stdin(&mut c, stdin)
    }

    /// `podnet lab --name LAB ARGS`; panics with the output on failure.
    pub fn lab_ok(&self, args: &[&str]) -> String {
        let mut a = vec!["lab", "--name", &self.name];
        a.extend_from_slice(args);
        let o = Command::new(env!("CARGO_BIN_EXE_podnet"))
            .args(&a)
            .output()
            .expect("podnet lab");
        assert!(
            o.status.success(),
            "podnet lab {args:?}: {}{}",
            text(&o.stdout),
            text(&o.stderr)
        );
        text(&o.stdout).trim().to_string()
    }

    /// `kubectl ARGS` against the lab's apiserver (Kubernetes mode).
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let kubectl = self.kubectl.as_ref().expect("a --kube lab");
        kubectl::run(kubectl.as_ref(), &self.name, args, stdin)
    }

    /// The mode's tool (`podnet` or kubectl) with ARGS; panics on failure.
    pub fn tool_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let o = match self.mode {
            Mode::Standalone => self.podnet(args, stdin),
            Mode::Kube => self.kubectl(args, stdin),
        };
        assert!(
            o.status.success(),
            "{} {args:?} failed: {}{}{}",
            if self.mode == Mode::Kube {
                "kubectl"
            } else {
                "podnet"
            },
            text(&o.stdout),
            text(&o.stderr),
            stdin.map(|s| format!("\ninput:\n{s}")).unwrap_or_default()
        );
        text(&o.stdout)
    }

    /// Applies manifests (multi-document YAML or JSON).
    pub fn apply(&self, manifest: &str) {
        self.tool_ok(&["apply", "-f", "-"], Some(manifest));
    }

    /// Deletes one object; a missing one is fine.
    pub fn delete(&self, kind: &str, ns: Option<&str>, name: &str) {
        let mut a = vec!["delete", kind, name, "--ignore-not-found"];
        if let Some(ns) = ns {
            a.extend(["-n", ns]);
        }
        self.tool_ok(&a, None);
    }

    /// One object as JSON.
    pub fn get_json(&self, kind: &str, ns: Option<&str>, name: &str) -> Value {
        let mut a = vec!["get", kind, name, "-o", "json"];
        if let Some(ns) = ns {
            a.extend(["-n", ns]);
        }
        serde_json::from_str(&self.tool_ok(&a, None)).expect("json")
    }

    /// Every object of a kind in every namespace, as JSON.
    pub fn list_json(&self, kind: &str) -> Vec<Value> {
        let v: Value =
            serde_json::from_str(&self.tool_ok(&["get", kind, "-A", "-o", "json"], None))
                .expect("json");
        v["items"].as_array().cloned().unwrap_or_default()
    }

    /// The labels of an object.
    pub fn labels(&self, kind: &str, ns: Option<&str>, name: &str) -> BTreeMap<String, String> {
        serde_json::from_value(self.get_json(kind, ns, name)["metadata"]["labels"].clone())
            .unwrap_or_default()
    }

    /// Sets (`Some`) or removes (`None`) labels of an object: `kubectl
    /// label` in Kubernetes mode; standalone, the object is read, changed
    /// and applied again with `podnet apply`.
    pub fn label(
        &self,
        kind: &str,
        ns: Option<&str>,
        name: &str,
        changes: &[(&str, Option<&str>)],
    ) {
        match self.mode {
            Mode::Kube => {
                let kv: Vec<String> = changes
                    .iter()
                    .map(|(k, v)| match v {
                        Some(v) => format!("{k}={v}"),
                        None => format!("{k}-"),
                    })
                    .collect();
                let mut a = vec!["label", kind, name, "--overwrite"];
                if let Some(ns) = ns {
                    a.extend(["-n", ns]);
                }
                a.extend(kv.iter().map(String::as_str));
                self.tool_ok(&a, None);
            }
            Mode::Standalone => {
                let mut o = self.get_json(kind, ns, name);
                let labels = &mut o["metadata"]["labels"];
                if !labels.is_object() {
                    *labels = serde_json::json!({});
                }
                let m = labels.as_object_mut().unwrap();
                for (k, v) in changes {
                    match v {
                        Some(v) => m.insert(k.to_string(), Value::from(*v)),
                        None => m.remove(*k),
                    };
                }
                self.apply(&o.to_string());
            }
        }
    }

    /// Deletes every NetworkPolicy in the cluster.
    pub fn delete_all_policies(&self) {
        for p in self.list_json("networkpolicies") {
            let ns = p["metadata"]["namespace"].as_str().unwrap_or("default");
            let name = p["metadata"]["name"].as_str().unwrap_or_default();
            self.delete("networkpolicy", Some(ns), name);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(env!("CARGO_BIN_EXE_podnet"))
            .args(["lab", "--name", &self.name, "down"])
            .output();
    }
}

// ---- The model.

/// One pod of the model.
#[derive(Clone, Debug)]
pub struct ModelPod {
    pub ns: String,
    pub name: String,
    pub node: String,
    pub ip: IpAddr,
    /// The ClusterIP of its Service `s-<name>`.
    pub service_ip: IpAddr,
}

impl ModelPod {
    /// `ns/name`, as tables and `whoami` answers write it.
    pub fn id(&self) -> String {
        format!("{}/{}", self.ns, self.name)
    }
}

/// The pods in table order (x/a, x/b, x/c, y/a, ...), with the labels of
/// every pod and namespace as first made, to restore after a scenario.
pub struct Model {
    pub pods: Vec<ModelPod>,
    labels: BTreeMap<(String, Option<String>, String), BTreeMap<String, String>>,
    /// Judged on IPv6 (a dual-stack lab).
    pub dual: bool,
}

/// `ns/pod` of every model pod, in table order.
pub fn pod_ids() -> Vec<String> {
    NAMESPACES
        .iter()
        .flat_map(|ns| PODS.iter().map(move |p| format!("{ns}/{p}")))
        .collect()
}

/// The Service of every model pod: ports 80 and 81 over TCP and UDP, the
/// named container ports as targetPorts.
/// Dual-stack: each Service is PreferDualStack, and probed on its IPv6
/// ClusterIP.
fn services_manifest(dual: bool) -> String {
    let mut m = String::new();
    let families = match dual {
        true => "  ipFamilyPolicy: PreferDualStack\n",
        false => "",
    };
    for ns in NAMESPACES {
        for p in PODS {
            let _ = write!(
                m,
                "---\napiVersion: v1\nkind: Service\nmetadata: {{name: s-{p}, namespace: \"{ns}\"}}\n\
                 spec:\n  selector: {{pod: {p}}}\n{families}  ports:\n"
            );
            for port in [80, 81] {
                for proto in ["tcp", "udp"] {
                    let _ = writeln!(
                        m,
                        "  - {{name: serve-{port}-{proto}, port: {port}, protocol: {}, targetPort: serve-{port}-{proto}}}",
                        proto.to_uppercase()
                    );
                }
            }
        }
    }
    m
}

impl Model {
    /// Makes the model in a fresh lab: namespaces, pods (in parallel, each
    /// through `lab run`), Services; waits for their ClusterIPs.
    pub fn build(c: &Cluster) -> Model {
        let nss: String = NAMESPACES
            .iter()
            .map(|ns| {
                format!("---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: \"{ns}\", labels: {{ns: \"{ns}\"}}}}\n")
            })
            .collect();
        c.apply(&nss);
        let ids = pod_ids();
        std::thread::scope(|s| {
            for (i, id) in ids.iter().enumerate() {
                s.spawn(move || {
                    let pod = id.split_once('/').unwrap().1;
                    c.lab_ok(&[
                        "run",
                        id,
                        "--node",
                        &format!("node{}", i % NODES + 1),
                        "--labels",
                        &format!("pod={pod}"),
                        "--ports",
                        PORTS,
                    ]);
                });
            }
        });
        c.apply(&services_manifest(c.dual));
        let mut pods = Vec::new();
        for id in &ids {
            let (ns, name) = id.split_once('/').unwrap();
            let rec = c.lab.pod(ns, name).expect("pod record");
            let svc = format!("s-{name}");
            let service_ip = podnet_testkit::eventually(
                &format!("a ClusterIP for {ns}/{svc}"),
                Duration::from_secs(20),
                || {
                    let spec = &c.get_json("svc", Some(ns), &svc)["spec"];
                    let ip = match c.dual {
                        true => &spec["clusterIPs"][1],
                        false => &spec["clusterIP"],
                    };
                    ip.as_str().and_then(|s| s.parse::<IpAddr>().ok())
                },
            );
            pods.push(ModelPod {
                ns: ns.into(),
                name: name.into(),
                node: rec.node,
                // Dual-stack: policies are judged on the IPv6 addresses
                // (ipBlock scenarios then name IPv6 CIDRs).
                ip: match c.dual {
                    true => rec.ip6.as_deref().expect("a dual-stack pod's IPv6").parse(),
                    false => rec.ip.parse(),
                }
                .expect("pod IP"),
                service_ip,
            });
        }
        let mut labels = BTreeMap::new();
        for p in &pods {
            let key = ("pod".to_string(), Some(p.ns.clone()), p.name.clone());
            labels.insert(key, c.labels("pod", Some(&p.ns), &p.name));
        }
        for ns in NAMESPACES {
            let key = ("namespace".to_string(), None, ns.to_string());
            labels.insert(key, c.labels("namespace", None, ns));
        }
        Model {
            pods,
            labels,
            dual: c.dual,
        }
    }

    /// Pod `id`'s address as a one-address ipBlock CIDR, in the family the
    /// model is judged in.
    pub fn host_cidr(&self, id: &str) -> String {
        match self.ip(id) {
            IpAddr::V4(a) => format!("{a}/32"),
            IpAddr::V6(a) => format!("{a}/128"),
        }
    }

    /// The pod network in the family the model is judged in (the lab's,
    /// in both modes).
    pub fn pod_network(&self) -> &'static str {
        match self.dual {
            true => "fd00:10:244::/56",
            false => "10.244.0.0/16",
        }
    }

    /// The model pod `ns/name`.
    pub fn pod(&self, id: &str) -> &ModelPod {
        self.pods
            .iter()
            .find(|p| p.id() == id)
            .unwrap_or_else(|| panic!("no pod {id} in the model"))
    }

    pub fn ip(&self, id: &str) -> IpAddr {
        self.pod(id).ip
    }

    /// Puts back the labels of every pod and namespace as they were made.
    pub fn restore_labels(&self, c: &Cluster) {
        for ((kind, ns, name), want) in &self.labels {
            let have = c.labels(kind, ns.as_deref(), name);
            if &have == want {
                continue;
            }
            let mut changes: Vec<(&str, Option<&str>)> = want
                .iter()
                .filter(|(k, v)| have.get(*k) != Some(v))
                .map(|(k, v)| (k.as_str(), Some(v.as_str())))
                .collect();
            changes.extend(
                have.keys()
                    .filter(|k| !want.contains_key(*k))
                    .map(|k| (k.as_str(), None)),
            );
            c.label(kind, ns.as_deref(), name, &changes);
        }
    }
}

// ---- Truth tables.

/// Who a row or column of an expectation covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    Any,
    Namespace(String),
    Pod(String, String),
}

impl Peer {
    fn matches(&self, id: &str) -> bool {
        let (ns, pod) = id.split_once('/').expect("ns/pod");
        match self {
            Peer::Any => true,
            Peer::Namespace(n) => n == ns,
            Peer::Pod(n, p) => n == ns && p == pod,
        }
    }
}

/// `"*"` is every pod, `"x"` every pod in namespace x, `"x/a"` one pod.
impl From<&str> for Peer {
    fn from(s: &str) -> Peer {
        match s.split_once('/') {
            _ if s == "*" || s.is_empty() => Peer::Any,
            Some((ns, pod)) => Peer::Pod(ns.into(), pod.into()),
            None => Peer::Namespace(s.into()),
        }
    }
}

/// What should connect: one boolean per (from, to) pair of model pods, set
/// like the e2e suite's Reachability. Later calls override earlier ones.
#[derive(Clone, Debug)]
pub struct Reachability {
    pods: Vec<String>,
    allowed: Vec<Vec<bool>>,
}

impl Reachability {
    /// Every pair `allowed`.
    pub fn new(allowed: bool) -> Reachability {
        let pods = pod_ids();
        let n = pods.len();
        Reachability {
            pods,
            allowed: vec![vec![allowed; n]; n],
        }
    }

    pub fn expect_all(&mut self, allowed: bool) -> &mut Self {
        self.expect_peer(Peer::Any, Peer::Any, allowed)
    }

    /// Every pair from a pod `from` covers to a pod `to` covers.
    pub fn expect_peer(
        &mut self,
        from: impl Into<Peer>,
        to: impl Into<Peer>,
        allowed: bool,
    ) -> &mut Self {
        let (from, to) = (from.into(), to.into());
        for (i, f) in self.pods.iter().enumerate() {
            for (j, t) in self.pods.iter().enumerate() {
                if from.matches(f) && to.matches(t) {
                    self.allowed[i][j] = allowed;
                }
            }
        }
        self
    }

    /// One pair of pods, `ns/pod` each.
    pub fn expect(&mut self, from: &str, to: &str, allowed: bool) -> &mut Self {
        assert!(
            from.contains('/') && to.contains('/'),
            "expect() takes two pods: {from} {to}"
        );
        self.expect_peer(from, to, allowed)
    }

    /// Every pod to `to`.
    pub fn expect_all_ingress(&mut self, to: &str, allowed: bool) -> &mut Self {
        self.expect_peer(Peer::Any, to, allowed)
    }

    /// `from` to every pod.
    pub fn expect_all_egress(&mut self, from: &str, allowed: bool) -> &mut Self {
        self.expect_peer(from, Peer::Any, allowed)
    }

    /// What a probe from pod `i` to pod `j` must find: `None` when the
    /// pair is not checked (a pod through its own Service).
    fn want(&self, i: usize, j: usize, via: Via) -> Option<bool> {
        match (i == j, via) {
            (true, Via::PodIp) => Some(true),
            (true, Via::Service) => None,
            (false, _) => Some(self.allowed[i][j]),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

/// Where probes go: the target pod's IP, or its Service's ClusterIP (then
/// the endpoint pod's policy judges, after DNAT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    PodIp,
    Service,
}

/// What to probe: a port and protocol, to pod IPs or through Services.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub port: u16,
    pub proto: Proto,
    pub via: Via,
}

impl Target {
    pub const fn tcp(port: u16) -> Target {
        Target {
            port,
            proto: Proto::Tcp,
            via: Via::PodIp,
        }
    }

    pub const fn udp(port: u16) -> Target {
        Target {
            port,
            proto: Proto::Udp,
            via: Via::PodIp,
        }
    }

    /// The same port, through each pod's Service.
    pub const fn service(self) -> Target {
        Target {
            port: self.port,
            proto: self.proto,
            via: Via::Service,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = match self.proto {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
        };
        let v = match self.via {
            Via::PodIp => "to pod IPs",
            Via::Service => "to Service ClusterIPs",
        };
        write!(f, "{p}/{} {v}", self.port)
    }
}

/// One probe's verdict against its expectation.
fn matches(want: Option<bool>, got: &Reach, to: &str) -> bool {
    match (want, got) {
        (None, _) => true,
        (Some(true), Reach::Connected(who)) => who == to,
        (Some(false), Reach::TimedOut) => true,
        _ => false,
    }
}

fn describe(got: &Reach) -> String {
    match got {
        Reach::Connected(who) => format!("connected, answered by {who}"),
        Reach::Refused => "refused (a reject rule, or no server)".into(),
        Reach::TimedOut => "timed out (dropped)".into(),
        Reach::Other(e) => format!("failed: {e}"),
    }
}

/// One table's probes: `observed[i][j]` for pods `i` to `j` (None: not
/// probed).
type Observed = Vec<Vec<Option<Reach>>>;

/// The observed letter of a cell: the [`Reach::letter`], or `W` when the
/// wrong pod answered, `-` when not probed.
fn observed_letter(got: &Option<Reach>, to: &str) -> char {
    match got {
        None => '-',
        Some(Reach::Connected(who)) if who != to => 'W',
        Some(r) => r.letter(),
    }
}

/// Expected, observed and comparison tables side by side, then every
/// mismatch in words.
fn report(target: &Target, r: &Reachability, obs: &Observed) -> (usize, String) {
    let ids = &r.pods;
    let n = ids.len();
    let header = |title: &str| -> Vec<String> {
        let mut rows = vec![format!("{title:<40}")];
        let mut h = String::from("-   ");
        for id in ids {
            let _ = write!(h, " {id}");
        }
        rows.push(format!("{h:<40}"));
        rows
    };
    let mut exp = header("expected");
    let mut got = header("observed");
    let mut cmp = header("comparison");
    let mut wrong = Vec::new();
    for i in 0..n {
        let (mut e, mut o, mut c) = (ids[i].clone(), ids[i].clone(), ids[i].clone());
        for j in 0..n {
            let want = r.want(i, j, target.via);
            let ok = match (&obs[i][j], want) {
                (_, None) => true,
                (Some(g), w) => matches(w, g, &ids[j]),
                (None, Some(_)) => false,
            };
            let el = match want {
                None => '-',
                Some(true) => '.',
                Some(false) => 'X',
            };
            let _ = write!(e, "   {el}");
            let _ = write!(o, "   {}", observed_letter(&obs[i][j], &ids[j]));
            let _ = write!(c, "   {}", if ok { '.' } else { 'X' });
            if !ok {
                let g = obs[i][j].as_ref().map(describe).unwrap_or_default();
                wrong.push(format!(
                    "  {} -> {}: expected {}, {g}",
                    ids[i],
                    ids[j],
                    if want == Some(true) {
                        format!("an answer from {}", ids[j])
                    } else {
                        "a drop (timeout)".to_string()
                    }
                ));
            }
        }
        exp.push(format!("{e:<40}"));
        got.push(format!("{o:<40}"));
        cmp.push(format!("{c:<40}"));
    }
    let mut out = format!("{target}: {} of {} pairs wrong\n", wrong.len(), n * n);
    for k in 0..exp.len() {
        let _ = writeln!(out, "{}  {}  {}", exp[k], got[k], cmp[k]);
    }
    out.push_str(
        "expected: . allowed, X denied, - not checked | observed: . answered by the right pod, \
         W answered by another pod, X timed out, R refused, ? other error\n",
    );
    for w in &wrong {
        out.push_str(w);
        out.push('\n');
    }
    (wrong.len(), out)
}

// ---- The harness.

/// A lab with the model in it: what scenarios get.
pub struct Harness {
    pub cluster: Cluster,
    pub model: Model,
}

/// A scenario: a name and the function that runs it.
pub type Scenario = (&'static str, fn(&Harness));

impl Harness {
    /// A lab in `mode` with the model built and everything reachable.
    pub fn up(mode: Mode, tag: &str) -> Harness {
        Harness::up_with(mode, tag, false)
    }

    /// [`Harness::up`], dual-stack with `dual`.
    pub fn up_with(mode: Mode, tag: &str, dual: bool) -> Harness {
        let cluster = Cluster::up_with(mode, tag, dual);
        let model = Model::build(&cluster);
        let h = Harness { cluster, model };
        // Ready when every pod reaches every pod and Service on every port.
        let all = Reachability::new(true);
        let mut cases = Vec::new();
        for t in Harness::all_targets() {
            cases.push((t, &all));
            cases.push((t.service(), &all));
        }
        if let Err(e) = h.try_check(&cases, Duration::from_secs(60), None) {
            panic!("the model never became fully reachable without policies:\n{e}");
        }
        h
    }

    /// TCP and UDP on ports 80 and 81, to pod IPs.
    pub fn all_targets() -> [Target; 4] {
        [
            Target::tcp(80),
            Target::udp(80),
            Target::tcp(81),
            Target::udp(81),
        ]
    }

    pub fn mode(&self) -> Mode {
        self.cluster.mode
    }

    pub fn apply(&self, manifest: &str) {
        self.cluster.apply(manifest)
    }

    pub fn delete_policy(&self, ns: &str, name: &str) {
        self.cluster.delete("networkpolicy", Some(ns), name)
    }

    /// Sets or removes labels of pod `ns/pod`.
    pub fn label_pod(&self, id: &str, changes: &[(&str, Option<&str>)]) {
        let (ns, pod) = id.split_once('/').expect("ns/pod");
        self.cluster.label("pod", Some(ns), pod, changes)
    }

    /// Sets or removes labels of a namespace.
    pub fn label_namespace(&self, ns: &str, changes: &[(&str, Option<&str>)]) {
        self.cluster.label("namespace", None, ns, changes)
    }

    /// One probe from model pod `from` (`ns/pod`).
    pub fn reach(&self, from: &str, addr: SocketAddr, udp: bool) -> Reach {
        let (ns, pod) = from.split_once('/').expect("ns/pod");
        self.cluster.lab.reach(ns, pod, addr, udp, PROBE_TIMEOUT)
    }

    /// Probes every case's pairs at once (bounded threads, each probe
    /// entering its pod's namespace on its own thread).
    fn observe(&self, cases: &[(Target, &Reachability)]) -> Vec<Observed> {
        let pods = &self.model.pods;
        let n = pods.len();
        let mut jobs = Vec::new();
        for (c, (t, r)) in cases.iter().enumerate() {
            for i in 0..n {
                for j in 0..n {
                    if r.want(i, j, t.via).is_some() {
                        jobs.push((c, i, j));
                    }
                }
            }
        }
        let results: Mutex<Vec<Observed>> = Mutex::new(vec![vec![vec![None; n]; n]; cases.len()]);
        let next = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..PARALLEL.min(jobs.len()) {
                s.spawn(|| loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(c, i, j)) = jobs.get(k) else {
                        return;
                    };
                    let t = cases[c].0;
                    let to = &pods[j];
                    let ip = match t.via {
                        Via::PodIp => to.ip,
                        Via::Service => to.service_ip,
                    };
                    let got = self.cluster.lab.reach(
                        &pods[i].ns,
                        &pods[i].name,
                        SocketAddr::new(ip, t.port),
                        t.proto == Proto::Udp,
                        PROBE_TIMEOUT,
                    );
                    results.lock().unwrap()[c][i][j] = Some(got);
                });
            }
        });
        results.into_inner().unwrap()
    }

    /// Probes until every case's table matches (a full round, all at once),
    /// or `bound` passes, or (with `stable`) the observed tables stop
    /// changing for that long while wrong. The error is the report of the
    /// last round.
    pub fn try_check(
        &self,
        cases: &[(Target, &Reachability)],
        bound: Duration,
        stable: Option<Duration>,
    ) -> Result<usize, String> {
        let start = Instant::now();
        let mut rounds = 0;
        let mut last: Option<(String, Instant)> = None;
        loop {
            rounds += 1;
            let obs = self.observe(cases);
            let mut bad = 0;
            let mut text = String::new();
            let mut summary = Vec::new();
            let mut print = String::new();
            for ((t, r), o) in cases.iter().zip(&obs) {
                let (wrong, rep) = report(t, r, o);
                bad += wrong;
                if wrong > 0 {
                    text.push_str(&rep);
                    summary.push(format!("{t}: {wrong} wrong"));
                }
                for row in o {
                    for cell in row {
                        let _ = write!(print, "{cell:?}");
                    }
                }
            }
            if bad == 0 {
                return Ok(rounds);
            }
            let now = Instant::now();
            if last.as_ref().map(|(p, _)| p != &print).unwrap_or(true) {
                last = Some((print, now));
            }
            let since = now - last.as_ref().unwrap().1;
            let gave_up = if now - start > bound {
                Some(format!("after {:.1} s", (now - start).as_secs_f64()))
            } else {
                stable.filter(|s| since >= *s).map(|s| {
                    format!(
                        "after {:.1} s: the tables stopped changing for {} s",
                        (now - start).as_secs_f64(),
                        s.as_secs()
                    )
                })
            };
            if let Some(why) = gave_up {
                return Err(format!(
                    "truth tables do not match: {} ({rounds} rounds, {why})\n{text}",
                    summary.join(", ")
                ));
            }
            // A breath between rounds: the lab's daemons share the cores.
            std::thread::sleep(ROUND_PAUSE);
        }
    }

    /// Every case's table must match once enforcement converges; panics
    /// with the tables otherwise.
    pub fn check(&self, cases: &[(Target, &Reachability)]) {
        if let Err(e) = self.try_check(cases, CONVERGE, Some(STABLE)) {
            panic!("{e}");
        }
    }

    /// One table for several targets.
    pub fn check_all(&self, targets: &[Target], r: &Reachability) {
        let cases: Vec<(Target, &Reachability)> = targets.iter().map(|t| (*t, r)).collect();
        self.check(&cases)
    }

    /// One probe from `from` must eventually find what `want` accepts (a
    /// probe outside the model's tables); panics with the last finding.
    pub fn eventually_reach(
        &self,
        what: &str,
        from: &str,
        addr: SocketAddr,
        udp: bool,
        want: impl Fn(&Reach) -> bool,
    ) {
        let start = Instant::now();
        loop {
            let got = self.reach(from, addr, udp);
            if want(&got) {
                return;
            }
            if start.elapsed() > CONVERGE {
                panic!(
                    "{what}: {from} -> {addr}/{}: {}",
                    if udp { "udp" } else { "tcp" },
                    describe(&got)
                );
            }
        }
    }

    /// Between scenarios: no policies, the labels as made, and everything
    /// reachable again (so the next scenario never sees this one's state).
    pub fn reset(&self) {
        self.cluster.delete_all_policies();
        self.model.restore_labels(&self.cluster);
        let all = Reachability::new(true);
        let cases: Vec<(Target, &Reachability)> =
            Harness::all_targets().iter().map(|t| (*t, &all)).collect();
        if let Err(e) = self.try_check(&cases, CONVERGE, None) {
            panic!("after removing every policy, not everything is reachable again:\n{e}");
        }
    }

    /// Runs scenarios one after another in one lab, each followed by a
    /// [`Harness::reset`]; a failing scenario does not stop the others.
    /// Panics at the end naming every failure. `PODNET_NETPOL_SCENARIO`
    /// (comma-separated substrings) runs only matching scenarios.
    pub fn run(mode: Mode, tag: &str, scenarios: &[Scenario]) {
        Harness::run_with(mode, tag, scenarios, false)
    }

    /// [`Harness::run`] in a `--dual-stack` lab, judging pods' IPv6
    /// addresses and through the Services' IPv6 ClusterIPs.
    pub fn run_dual_stack(mode: Mode, tag: &str, scenarios: &[Scenario]) {
        Harness::run_with(mode, tag, scenarios, true)
    }

    fn run_with(mode: Mode, tag: &str, scenarios: &[Scenario], dual: bool) {
        let filter: Vec<String> = std::env::var("PODNET_NETPOL_SCENARIO")
            .map(|s| s.split(',').map(|x| x.trim().to_string()).collect())
            .unwrap_or_default();
        let chosen: Vec<&Scenario> = scenarios
            .iter()
            .filter(|(name, _)| {
                filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()))
            })
            .collect();
        assert!(
            !chosen.is_empty(),
            "no scenario matches PODNET_NETPOL_SCENARIO={filter:?}"
        );
        let h = Harness::up_with(mode, tag, dual);
        let mut failed = Vec::new();
        for (name, f) in chosen {
            let start = Instant::now();
            eprintln!("=== {mode:?} scenario {name}");
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&h)));
            let secs = start.elapsed().as_secs_f64();
            match r {
                Ok(()) => eprintln!("=== {mode:?} scenario {name}: ok ({secs:.1} s)"),
                Err(e) => {
                    let m = e
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    let first = m.lines().next().unwrap_or_default().to_string();
                    eprintln!("=== {mode:?} scenario {name}: FAILED ({secs:.1} s): {first}");
                    failed.push(format!("{name}: {first}"));
                }
            }
            h.reset();
        }
        assert!(
            failed.is_empty(),
            "{} of the {mode:?} scenarios failed (tables above):\n  {}",
            failed.len(),
            failed.join("\n  ")
        );
    }
}

/// A NetworkPolicy manifest; `spec` is the YAML of its spec (indented as
/// the caller likes: the common indentation is removed).
pub fn policy(ns: &str, name: &str, spec: &str) -> String {
    let lines: Vec<&str> = spec.lines().filter(|l| !l.trim().is_empty()).collect();
    let indent = lines
        .iter()
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let body: String = lines
        .iter()
        .map(|l| format!("  {}\n", &l[indent..]))
        .collect();
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: {name}\n  namespace: \"{ns}\"\nspec:\n{body}"
    )
}
