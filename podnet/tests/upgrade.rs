//! Upgrade under load, and version skew (issue 15).
//!
//! A 2-node Kubernetes-mode lab (vxlan) starts with its agents and both
//! cluster DNS replicas on the last release (the `podnet` of 943d8ce, the
//! last commit that passed CI, built by `scripts/old-podnet.sh`; the CNI
//! plugins, pods' servers and forwarders run the current binary). While a
//! client pod on node1 streams TCP to a pod on node2 (to its IP and through
//! a ClusterIP), opens new connections to a ClusterIP with endpoints on
//! both nodes, and queries cluster DNS (`common/load.rs`), the daemons are
//! replaced one at a time: node1's agent old→new (then the skew check),
//! DNS replica 1, node2's agent, DNS replica 2; then all of it back,
//! new→old (skew checked again with node1 old and node2 new). Agents are
//! replaced as a DaemonSet update does (stopped without cleanup, started
//! from the other binary, waited for until ready and synced), DNS replicas
//! as a Deployment with a readiness probe does (not Ready, drained from
//! every proxy, replaced, Ready again): `podnet_lab::upgrade`.
//!
//! After every step: no stream broke, no new connection and no DNS query
//! failed so far, and each kind of load ran during the step and after it;
//! the counts are printed per step. Then, load stopped, every node is
//! started fresh on each version (`agent --cleanup`, podnet's state
//! checked gone, started, synced) and its kernel state
//! (`common/kstate.rs`) compared with what it held after each step on that
//! version.
//!
//! The downgrade finding: 943d8ce predates NetworkPolicy, so an old agent
//! neither knows nor removes the `podnet-policy` table a new agent left. The
//! test checks that the state after new→old is exactly the old fresh start
//! plus that table (equal to the new version's own), that it breaks none of
//! the running traffic, and shows what it does break: it fails closed on
//! addresses it does not know, so a pod started on the node after the
//! downgrade can neither be reached nor reach anything with a new
//! connection, until the table is deleted (`nft delete table ip
//! podnet-policy` here; in a cluster, rolling out this version with
//! `--no-policy` first removes it: podnet/tests/lab.rs
//! `an_agent_without_policy_removes_the_policy_table`).
//!
//! Needs root, the Kubernetes peers (`scripts/k8s-peers.sh`) and a Rust
//! toolchain for the old build (about a minute cold, cached after); set
//! `PODNET_OLD=/path/to/podnet` to use another old binary, or
//! `PODNET_OLD_REV` to build another revision.

#[path = "common/kstate.rs"]
mod kstate;
#[path = "common/load.rs"]
mod load;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kstate::Snapshot;
use load::{Load, Targets};
use podnet_api::k8s_openapi::api::core::v1::{Node, Service};
use podnet_lab::{Lab, Reach, UpOptions};
use podnet_testkit::{eventually, require_root};

/// The port the test's echo server listens on in the stream server pod.
const STREAM_PORT: u16 = 9100;
const NS: &str = "load";
const CLIENT: &str = "client";
/// The stream server, on node2; with SRV1 (node1) an endpoint of `echo`.
const SRV2: &str = "srv2";
const SRV1: &str = "srv1";
const LATE: &str = "late";
const NODES: [&str; 2] = ["node1", "node2"];
const DNS_NAME: &str = "kubernetes.default.svc.cluster.local";
const SETTLE: Duration = Duration::from_secs(60);
/// Round trips every kind of load must make while a daemon is down.
const GAP_ROUNDS: u64 = 5;

#[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord)]
enum Version {
    Old,
    New,
}

/// The two binaries, and what each version's agent runs.
struct Versions {
    old: PathBuf,
    new: PathBuf,
}

impl Versions {
    fn exe(&self, v: Version) -> &Path {
        match v {
            Version::Old => &self.old,
            Version::New => &self.new,
        }
    }

    /// The subsystems beyond overlay and proxy a version's agent runs.
    fn also(v: Version) -> &'static [&'static str] {
        match v {
            Version::Old => &[],
            Version::New => &["policy"],
        }
    }
}

/// The old binary: `PODNET_OLD`, or what `scripts/old-podnet.sh` builds.
fn old_podnet() -> PathBuf {
    if let Ok(p) = std::env::var("PODNET_OLD") {
        return PathBuf::from(p);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/old-podnet.sh");
    let t0 = Instant::now();
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed:\n{stderr}",
        script.display()
    );
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .and_then(|l| l.strip_prefix("PODNET_OLD="))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{} printed no PODNET_OLD= line", script.display()));
    eprintln!(
        "old podnet: {} ({:.1}s{})",
        path.display(),
        t0.elapsed().as_secs_f64(),
        if stderr.contains("built in") {
            ", built now"
        } else {
            ", cached"
        }
    );
    path
}

/// The lab, taken down on drop (also on panic): no namespace, link, nft
/// table (they live in the lab's namespaces) or process stays.
struct Guard {
    lab: Lab,
    rt: tokio::runtime::Runtime,
    down: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.down {
            if let Err(e) = self.lab.down() {
                eprintln!("lab down: {e}");
            }
        }
    }
}

impl Guard {
    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    fn netns(&self, node: &str) -> String {
        format!("pn-{}-{node}", self.lab.name)
    }

    fn pod_ip(&self, pod: &str) -> IpAddr {
        self.lab.pod(NS, pod).unwrap().ip.parse().unwrap()
    }

    /// The executable the process of role `role` runs now.
    fn running_exe(&self, role: &str) -> PathBuf {
        let pid = std::fs::read_to_string(self.lab.dir.join("pids").join(role))
            .unwrap_or_else(|e| panic!("no pid for {role}: {e}"));
        std::fs::read_link(format!("/proc/{}/exe", pid.trim()))
            .unwrap_or_else(|e| panic!("{role} (pid {}) is not running: {e}", pid.trim()))
    }

    fn assert_runs(&self, role: &str, exe: &Path) {
        assert_eq!(
            self.running_exe(role),
            std::fs::canonicalize(exe).unwrap(),
            "{role} runs the wrong binary"
        );
    }

    /// Every node's snapshot, VTEP MACs named by node.
    fn snapshots(&self) -> BTreeMap<String, Snapshot> {
        let vteps: BTreeMap<String, String> = NODES
            .iter()
            .filter_map(|n| Some((kstate::vtep_mac(&self.netns(n))?, n.to_string())))
            .collect();
        NODES
            .iter()
            .map(|n| (n.to_string(), kstate::snapshot(&self.netns(n), &vteps)))
            .collect()
    }

    /// Asks `addr` who answers from pod `from`.
    fn reach(&self, from: &str, addr: SocketAddr) -> Reach {
        self.lab
            .reach(NS, from, addr, false, Duration::from_secs(3))
    }

    /// Probes the ClusterIP `svc` from pod `from` until both endpoints
    /// have answered (each new connection picks one at random).
    fn both_endpoints_answer(&self, from: &str, svc: SocketAddr) {
        let mut seen = BTreeMap::new();
        for _ in 0..200 {
            match self.reach(from, svc) {
                Reach::Connected(who) => *seen.entry(who).or_insert(0) += 1,
                other => panic!("{from} -> {svc}: {other:?}"),
            }
            if seen.len() == 2 {
                return;
            }
        }
        panic!("{from} -> {svc}: only {seen:?} answered in 200 connections");
    }
}

/// Whether process `pid` has exited (gone, or a zombie not reaped yet).
fn exited(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// A node's kernel state after a step.
struct Taken {
    node: String,
    version: Version,
    /// It runs the old version after the new one ran there.
    leftover: bool,
    step: String,
    snap: Snapshot,
}

/// One step's record, for the report.
struct Row {
    step: String,
    secs: f64,
    during: String,
}

#[test]
fn upgrade_and_downgrade_under_load_one_daemon_at_a_time() {
    require_root();
    let v = Versions {
        old: old_podnet(),
        new: PathBuf::from(env!("CARGO_BIN_EXE_podnet")),
    };
    assert_ne!(
        std::fs::canonicalize(&v.old).unwrap(),
        std::fs::canonicalize(&v.new).unwrap()
    );
    let t_start = Instant::now();
    let name = format!("up{}", std::process::id() % 100_000);
    let g = Guard {
        lab: Lab::new(&name, v.new.clone()).unwrap(),
        rt: tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap(),
        down: false,
    };
    g.block_on(g.lab.up(&UpOptions {
        resync_secs: 5,
        kube: true,
        dns_replicas: 2,
        daemon_exe: Some(v.old.clone()),
        ..UpOptions::new(2, "vxlan")
    }))
    .unwrap_or_else(|e| panic!("lab up on the old daemons: {e}"));
    // The old binary took the current lab's command lines: its agents and
    // DNS servers run and are synced.
    let mut running: BTreeMap<String, Version> = BTreeMap::new();
    for n in NODES {
        g.assert_runs(&format!("agent-{n}"), &v.old);
        g.lab
            .wait_agent_synced(n, Versions::also(Version::Old), SETTLE)
            .unwrap();
        running.insert(n.to_string(), Version::Old);
    }
    for i in 1..=2 {
        g.assert_runs(&g.lab.dns_replica(i).unwrap().role, &v.old);
    }
    assert_eq!(g.lab.dns_replica(2).unwrap().node, "node2");
    eprintln!(
        "lab up on the old agents and DNS: {:.1}s",
        t_start.elapsed().as_secs_f64()
    );

    // The workload: a client on node1, echo endpoints on both nodes, the
    // stream server on node2.
    let labels = |kv: &[(&str, &str)]| {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
            .into()
    };
    let port80 = [podnet_lab::serve::PortSpec::tcp(80)];
    g.block_on(async {
        g.lab
            .run_pod(NS, CLIENT, Some("node1"), labels(&[]), &[])
            .await?;
        g.lab
            .run_pod(NS, SRV1, Some("node1"), labels(&[("app", "echo")]), &port80)
            .await?;
        g.lab
            .run_pod(
                NS,
                SRV2,
                Some("node2"),
                labels(&[("app", "echo"), ("role", "stream")]),
                &port80,
            )
            .await
    })
    .unwrap();
    let client = g.block_on(g.lab.kube_client()).unwrap();
    let (srv1_ip, srv2_ip) = (g.pod_ip(SRV1), g.pod_ip(SRV2));
    let echo_ip = create_service(
        &g,
        &client,
        "echo",
        ("app", "echo"),
        80,
        &[srv1_ip, srv2_ip],
    );
    let stream_ip = create_service(
        &g,
        &client,
        "stream",
        ("role", "stream"),
        STREAM_PORT,
        &[srv2_ip],
    );
    let kubernetes_ip: Ipv4Addr = g.block_on(async {
        let api: kube::Api<Service> = kube::Api::namespaced(client.clone(), "default");
        let s = api.get("kubernetes").await.unwrap();
        s.spec.unwrap().cluster_ip.unwrap().parse().unwrap()
    });
    let echo = SocketAddr::new(echo_ip, 80);
    g.both_endpoints_answer(CLIENT, echo);
    let targets = Targets {
        client_ns: g.lab.pod(NS, CLIENT).unwrap().netns,
        server_ns: g.lab.pod(NS, SRV2).unwrap().netns,
        server_port: STREAM_PORT,
        streams: vec![
            ("pod-ip".into(), SocketAddr::new(srv2_ip, STREAM_PORT)),
            ("cluster-ip".into(), SocketAddr::new(stream_ip, STREAM_PORT)),
        ],
        service: echo,
        answerers: vec![format!("{NS}/{SRV1}"), format!("{NS}/{SRV2}")],
        dns_server: SocketAddr::new(podnet_api::netconfig::DEFAULT_DNS_IP.parse().unwrap(), 53),
        dns_name: DNS_NAME.into(),
        dns_want: kubernetes_ip,
    };
    let cidrs = pod_cidrs(&g, &client);
    let t_load = Instant::now();
    let load = Load::start(&targets);
    let start = load.counts();
    eventually("the load to flow", SETTLE, || {
        load.counts().advanced_by(&start, 1)
    });
    let c0 = load.counts();
    assert_eq!(c0.failures(), "", "load failed before any step");

    // Every node's snapshot after each step, with the version it ran and
    // whether the new version ran there before (leftovers).
    let mut snaps: Vec<Taken> = Vec::new();
    let mut had_new: BTreeMap<String, bool> =
        NODES.iter().map(|n| (n.to_string(), false)).collect();
    let record = |snaps: &mut Vec<Taken>,
                  step: &str,
                  running: &BTreeMap<String, Version>,
                  had_new: &BTreeMap<String, bool>| {
        for (node, snap) in g.snapshots() {
            let version = running[&node];
            snaps.push(Taken {
                leftover: version == Version::Old && had_new[&node],
                node,
                version,
                step: step.into(),
                snap,
            });
        }
    };
    record(&mut snaps, "start", &running, &had_new);

    enum Do {
        Agent(&'static str, Version),
        Dns(usize, Version),
    }
    let plan = [
        Do::Agent("node1", Version::New),
        Do::Dns(1, Version::New),
        Do::Agent("node2", Version::New),
        Do::Dns(2, Version::New),
        Do::Agent("node1", Version::Old),
        Do::Dns(1, Version::Old),
        Do::Agent("node2", Version::Old),
        Do::Dns(2, Version::Old),
    ];
    let mut rows = vec![Row {
        step: "load started, until it flows".into(),
        secs: t_load.elapsed().as_secs_f64(),
        during: c0.row(&start),
    }];
    for (i, step) in plan.iter().enumerate() {
        let before = load.counts();
        let t0 = Instant::now();
        // Each daemon is stopped first, and the load must make progress
        // while it is down (so no step can pass without load, however
        // quick), then the other version starts.
        let gap = |what: &str| {
            let at = load.counts();
            let t = Instant::now();
            eventually(&format!("the load to flow while {what}"), SETTLE, || {
                load.counts().advanced_by(&at, GAP_ROUNDS)
            });
            t.elapsed()
        };
        let (what, down) = match *step {
            Do::Agent(node, to) => {
                let from = running[node];
                let role = format!("agent-{node}");
                let pid = std::fs::read_to_string(g.lab.dir.join("pids").join(&role)).unwrap();
                g.lab.stop_agent(node, false).unwrap();
                assert!(
                    exited(pid.trim()),
                    "{role} (pid {}) still runs after stop_agent",
                    pid.trim()
                );
                let down = gap(&format!("no agent runs on {node}"));
                g.lab
                    .restart_agent_with(node, v.exe(to))
                    .unwrap_or_else(|e| panic!("agent on {node} {from:?} -> {to:?}: {e}"));
                g.lab
                    .wait_agent_synced(node, Versions::also(to), SETTLE)
                    .unwrap();
                g.assert_runs(&role, v.exe(to));
                running.insert(node.into(), to);
                if to == Version::New {
                    had_new.insert(node.into(), true);
                }
                (format!("{}. agent {node} {from:?} -> {to:?}", i + 1), down)
            }
            Do::Dns(r, to) => {
                let role = g.lab.dns_replica(r).unwrap().role;
                g.block_on(g.lab.stop_dns(r))
                    .unwrap_or_else(|e| panic!("draining DNS replica {r}: {e}"));
                let down = gap(&format!("DNS replica {r} is down"));
                g.block_on(g.lab.start_dns_with(r, v.exe(to)))
                    .unwrap_or_else(|e| panic!("DNS replica {r} -> {to:?}: {e}"));
                g.assert_runs(&role, v.exe(to));
                (format!("{}. DNS replica {r} -> {to:?}", i + 1), down)
            }
        };
        let secs = t0.elapsed().as_secs_f64();
        let during = load.counts();
        // The load ran during the step, and still flows after it.
        assert!(
            during.advanced_by(&before, GAP_ROUNDS),
            "{what}: not every kind of load ran during the step:\nbefore {before}\nafter  {during}"
        );
        eventually(&format!("the load to flow after {what}"), SETTLE, || {
            load.counts().advanced_by(&during, 1)
        });
        let after = load.counts();
        eprintln!(
            "{what} ({secs:.1}s, daemon down {} ms): {}",
            down.as_millis(),
            after.row(&before)
        );
        assert_eq!(after.failures(), "", "{what}: the load failed");
        rows.push(Row {
            step: what.clone(),
            secs,
            during: after.row(&before),
        });
        record(&mut snaps, &what, &running, &had_new);
        // Version skew: one node new, the other old.
        if let Do::Agent("node1", _) = step {
            check_mesh(&g, &client, &cidrs, echo);
        }
    }
    let total = load.stop();
    assert_eq!(total.failures(), "", "the load failed");
    assert_eq!(total.broken(), 0);

    eprintln!("\nupgrade under load, per step (KiB sent/received per stream):");
    for r in &rows {
        eprintln!("  {:<32} {:>5.1}s  {}", r.step, r.secs, r.during);
    }
    eprintln!("  total: {total}\n");

    downgrade_leftover(&g, echo);

    // Fresh starts, load stopped: each version on each node, compared with
    // what the node held after every step on that version.
    for ver in [Version::Old, Version::New] {
        for n in NODES {
            g.lab.stop_agent(n, true).unwrap();
            let left = kstate::agent_part(&g.snapshots()[n]);
            assert!(
                left.is_empty(),
                "agent --cleanup on {n} left podnet state:\n{}",
                kstate::diff(&Snapshot::new(), &left)
            );
            g.lab.restart_agent_with(n, v.exe(ver)).unwrap();
            g.lab
                .wait_agent_synced(n, Versions::also(ver), SETTLE)
                .unwrap();
        }
        for n in NODES {
            let refs: Vec<&Taken> = snaps
                .iter()
                .filter(|t| t.node == n && t.version == ver)
                .collect();
            let pure = refs
                .iter()
                .find(|t| !t.leftover)
                .unwrap_or_else(|| panic!("no snapshot of {n} on {ver:?} without leftovers"));
            // Converged: the other node may still be learning this one's
            // new VTEP (a fresh start makes a new device).
            let fresh = match podnet_testkit::try_eventually(SETTLE, || {
                let s = g.snapshots()[n].clone();
                if s == pure.snap {
                    Ok(s)
                } else {
                    Err(kstate::diff(&pure.snap, &s))
                }
            }) {
                Ok(s) => s,
                Err(d) => panic!(
                    "{n}, fresh start on {ver:?}, differs from after step {:?} (want: that step; got: fresh):\n{}",
                    pure.step,
                    d.unwrap_or_default()
                ),
            };
            for t in &refs {
                let (step, s) = (&t.step, &t.snap);
                if !t.leftover {
                    assert!(
                        s == &fresh,
                        "{n} after {step:?} differs from its fresh start on {ver:?}:\n{}",
                        kstate::diff(&fresh, s)
                    );
                    continue;
                }
                // New -> old: the old fresh start plus the new version's
                // policy table, as the new version made it on this node
                // (whose own fresh start is checked next).
                let policy = kstate::table_part(s, kstate::POLICY_TABLE);
                assert!(
                    !policy.is_empty(),
                    "{n} after {step:?}: no leftover policy table"
                );
                assert!(
                    kstate::without_leftovers(s) == fresh,
                    "{n} after {step:?}, apart from the policy and guard tables, differs from its fresh start on {ver:?}:\n{}",
                    kstate::diff(&fresh, &kstate::without_leftovers(s))
                );
                let new_policy = snaps
                    .iter()
                    .find(|x| x.node == n && x.version == Version::New)
                    .map(|x| kstate::table_part(&x.snap, kstate::POLICY_TABLE))
                    .unwrap();
                assert!(
                    policy == new_policy,
                    "{n} after {step:?}: the leftover policy table is not the new version's:\n{}",
                    kstate::diff(&new_policy, &policy)
                );
            }
            eprintln!(
                "{n}: fresh start on {ver:?} matches {} snapshot(s) ({})",
                refs.len(),
                kstate::summary(&fresh)
            );
        }
    }

    // Down: nothing of the lab stays.
    let mut g = g;
    let dir = g.lab.dir.clone();
    g.down = true;
    g.lab.down().unwrap();
    assert!(!dir.exists(), "{} is still there", dir.display());
    let prefix = format!("pn-{name}-");
    let left: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "namespaces left: {left:?}");
    eprintln!("run time: {:.0}s", t_start.elapsed().as_secs_f64());
}

/// Creates ClusterIP Service `load/<name>` selecting `<key>=<value>` on
/// `port`; returns its ClusterIP once both nodes' proxies DNAT it to every
/// one of `endpoints`.
fn create_service(
    g: &Guard,
    c: &kube::Client,
    name: &str,
    (key, value): (&str, &str),
    port: u16,
    endpoints: &[IpAddr],
) -> IpAddr {
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "selector": {key: value},
            "ports": [{"port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }))
    .unwrap();
    let ip: IpAddr = g.block_on(async {
        let api: kube::Api<Service> = kube::Api::namespaced(c.clone(), NS);
        let s = api.create(&Default::default(), &svc).await.unwrap();
        s.spec.unwrap().cluster_ip.unwrap().parse().unwrap()
    });
    for n in NODES {
        let ns = g.netns(n);
        eventually(
            &format!("Service {name} and its endpoints in {n}'s proxy"),
            SETTLE,
            || {
                let t = podnet_testkit::nft_list(Some(&ns), "table ip podnet").unwrap_or_default();
                t.contains(&format!("{ip} . tcp . {port}"))
                    && endpoints
                        .iter()
                        .all(|e| t.contains(&format!("{e} . {port}")))
            },
        );
    }
    ip
}

/// Every node's podCIDR.
fn pod_cidrs(g: &Guard, c: &kube::Client) -> BTreeMap<String, ipnet::Ipv4Net> {
    g.block_on(async {
        let api: kube::Api<Node> = kube::Api::all(c.clone());
        let mut out = BTreeMap::new();
        for n in NODES {
            let node = api.get(n).await.unwrap();
            let cidr = node.spec.unwrap().pod_cidr.unwrap().parse().unwrap();
            out.insert(n.to_string(), cidr);
        }
        out
    })
}

/// The mesh works with node1 and node2 on different versions: pod to pod
/// across nodes both ways, a ClusterIP reaching endpoints on both nodes
/// from both nodes, each node's route, neighbour and FDB entry towards the
/// other, and each node's annotations (written by one version) naming the
/// VTEP the other version programmed.
fn check_mesh(
    g: &Guard,
    c: &kube::Client,
    cidrs: &BTreeMap<String, ipnet::Ipv4Net>,
    echo: SocketAddr,
) {
    let srv1 = SocketAddr::new(g.pod_ip(SRV1), 80);
    let srv2 = SocketAddr::new(g.pod_ip(SRV2), 80);
    assert_eq!(
        g.reach(CLIENT, srv2),
        Reach::Connected(format!("{NS}/{SRV2}"))
    );
    assert_eq!(
        g.reach(SRV2, srv1),
        Reach::Connected(format!("{NS}/{SRV1}"))
    );
    g.both_endpoints_answer(CLIENT, echo);
    g.both_endpoints_answer(SRV2, echo);
    let snaps = g.snapshots();
    let nodes: BTreeMap<String, Node> = g.block_on(async {
        let api: kube::Api<Node> = kube::Api::all(c.clone());
        let mut out = BTreeMap::new();
        for n in NODES {
            out.insert(n.to_string(), api.get(n).await.unwrap());
        }
        out
    });
    let annotations = |n: &str| -> BTreeMap<String, String> {
        nodes[n]
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k.starts_with("podnet.io/"))
            .collect()
    };
    let (a1, a2) = (annotations("node1"), annotations("node2"));
    assert!(
        !a1.is_empty() && a1.keys().eq(a2.keys()),
        "node annotations differ in form between versions:\nnode1 {a1:?}\nnode2 {a2:?}"
    );
    for (me, peer) in [("node1", "node2"), ("node2", "node1")] {
        let s = &snaps[me];
        let cidr = cidrs[peer];
        let route = s
            .get(&format!("route main unicast {cidr}"))
            .unwrap_or_else(|| panic!("{me} has no route to {peer}'s {cidr}"));
        assert!(route.contains("\"dev\":\"podnet.1\""), "{me}: {route}");
        let peer_ip = g
            .lab
            .state()
            .unwrap()
            .nodes
            .iter()
            .find(|n| n.name == peer)
            .unwrap()
            .ip;
        let fdb = format!("fdb podnet.1 vtep({peer}) {peer_ip}");
        assert!(
            s.contains_key(&fdb),
            "{me} has no {fdb}: {:?}",
            s.keys()
                .filter(|k| k.starts_with("fdb"))
                .collect::<Vec<_>>()
        );
        let neigh = s
            .get(&format!("neigh podnet.1 {}", cidr.network()))
            .unwrap_or_else(|| panic!("{me} has no neighbour for {peer}'s VTEP"));
        assert!(neigh.contains(&format!("vtep({peer})")), "{me}: {neigh}");
        let data = annotations(peer)
            .into_iter()
            .find(|(k, _)| k.ends_with("backend-data"))
            .map(|(_, v)| v)
            .unwrap_or_else(|| {
                panic!(
                    "{peer} has no backend-data annotation: {:?}",
                    annotations(peer)
                )
            });
        let mac = kstate::vtep_mac(&g.netns(peer)).unwrap();
        assert!(
            data.contains(&mac),
            "{peer}'s backend-data {data} does not name its VTEP {mac}"
        );
    }
    eprintln!(
        "skew check passed (node1 {:?}, node2 {:?})",
        g.lab.agent_exe("node1").file_name().unwrap(),
        g.lab.agent_exe("node2").file_name().unwrap()
    );
}

/// After the downgrade: what the new version's leftover policy table does
/// on a node the old version runs (see the module docs), and that deleting
/// it is the cure.
fn downgrade_leftover(g: &Guard, echo: SocketAddr) {
    let n1 = g.netns("node1");
    assert!(
        podnet_testkit::nft_list(Some(&n1), &format!("table ip {}", kstate::POLICY_TABLE))
            .is_some(),
        "no leftover policy table on node1 after the downgrade"
    );
    g.block_on(g.lab.run_pod(
        NS,
        LATE,
        Some("node1"),
        Default::default(),
        &[podnet_lab::serve::PortSpec::tcp(80)],
    ))
    .unwrap();
    let late = SocketAddr::new(g.pod_ip(LATE), 80);
    let to_late = g.reach(SRV2, late);
    let from_late = g.lab.reach(NS, LATE, echo, false, Duration::from_secs(3));
    eprintln!(
        "FINDING: after new -> old, a pod started on node1 with the leftover {} table: \
         srv2 -> late: {to_late:?}; late -> echo ClusterIP: {from_late:?}",
        kstate::POLICY_TABLE
    );
    assert_eq!(
        (to_late, from_late),
        (Reach::TimedOut, Reach::TimedOut),
        "the leftover policy table no longer drops a late pod's new connections: \
         update the downgrade finding in this file's docs"
    );
    for n in NODES {
        podnet_testkit::nft(
            Some(&g.netns(n)),
            &format!("delete table ip {}", kstate::POLICY_TABLE),
        )
        .unwrap();
        // The port guard, too: the old agent does not know the late pod's
        // port, so the guard fails closed on it.
        podnet_testkit::nft(
            Some(&g.netns(n)),
            &format!("delete table bridge {}", kstate::GUARD_TABLE),
        )
        .unwrap();
    }
    assert_eq!(
        g.reach(SRV2, late),
        Reach::Connected(format!("{NS}/{LATE}"))
    );
    assert!(matches!(
        g.lab.reach(NS, LATE, echo, false, Duration::from_secs(3)),
        Reach::Connected(_)
    ));
    eprintln!("with the leftover table deleted, the late pod connects both ways");
    g.block_on(g.lab.delete_pod(NS, LATE)).unwrap();
}
