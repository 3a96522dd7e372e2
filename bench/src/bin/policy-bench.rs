//! NetworkPolicy benchmark: podnet's policy subsystem (`crates/policy`)
//! with real kernel objects, in one run.
//!
//! 1. **Node-local, at scale** (a fresh `pn-bench-<pid>-node` namespace):
//!    `--pods` pods (`--namespaces` × pods per namespace, all on this node,
//!    labelled `app`/`tier`, with named container ports) and `--policies`
//!    NetworkPolicies (a mix of pod, namespace, named-port, ipBlock, any-port
//!    and egress rules, see [`Shape::policy`]) are fed to a `PolicyPlane` as
//!    object-source deltas, in the store source's order (Namespaces, Pods,
//!    NetworkPolicies, 64 per batch); then:
//!    - the first full sync (`Scope::Full`) from an empty kernel: time per
//!      verb, operations, element counts, and memory (VmHWM reset through
//!      `/proc/self/clear_refs` before the feed: the peak during feed and
//!      sync over the RSS before it; the RSS the planner's state keeps);
//!    - `--changes` one-policy changes (a `Delta::Updated` of one policy
//!      whose rule changes, then a partial sync of the dirty scope the watch
//!      produced) and as many one-pod label changes (its `app` label moves
//!      to another group, so other policies select it and other peers match
//!      it): time per change (watch + sync), median and p99, operations;
//!    - a full sync at the end must send 0 operations.
//! 2. **New-connection rate** between two of those pods, made real: client
//!    and server namespaces with veths on a bridge in the node namespace
//!    (`bridge-nf-call-iptables=1` there, so bridged packets cross the
//!    forward hook). The same pair is built on two more node namespaces:
//!    the baseline, podnet's policy table with no NetworkPolicy, and one
//!    with no table at all; TCP connects per second are measured on the
//!    three in alternating rounds, and the target is 10k policies against
//!    the baseline.
//!    With the whole table loaded the two pods are selected by policies
//!    that allow the flow; a denied flow is checked to be dropped (and
//!    counted) first, so the allowed one is known to cross the table.
//! 3. **Cluster-wide enforcement latency** in a 3-node lab (`podnet lab
//!    up`): a policy selecting pods on every node is toggled between
//!    allowing and denying a client group with `podnet apply -f -`, and
//!    each change is timed from the apply's start until every node's
//!    kernel (`ip podnet-policy`, `in-pod-port`) reflects it.
//!
//! Targets: one change ≤ 5 ms node-local; full programming ≤ 2 s and
//! ≤ 150 MB; connection rate ≥ 0.9× without the table; p99 ≤ 1 s in the lab.

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use podnet_api::k8s_openapi::api::core::v1::{Namespace, Pod};
use podnet_api::k8s_openapi::api::networking::v1::NetworkPolicy;
use podnet_api::{Kind, Object};
use podnet_bench::{
    catch_interrupts, check_interrupted, conn_rate, locate_podnet, ns_name,
    remove_stale_namespaces, require_root,
};
use podnet_kernel::Netns;
use podnet_nft::diff::Change;
use podnet_nft::model::{Family, Proto, Value};
use podnet_nft::netlink::Conn;
use podnet_policy::dataplane::{Dirty, Options, PolicyChanges, PolicyInput, PolicyPlane};
use podnet_policy::plan::{self, LogLimit};
use podnet_policy::World;
use podnet_reconcile::{Scope, Subsystem, SyncError};
use podnet_source::Delta;
use podnet_testkit::{try_sh_in, TestNs};
use serde_json::json;

#[derive(Parser)]
#[command(
    about = "NetworkPolicy: programming time, memory, change latency, connection rate, lab latency"
)]
struct Args {
    /// Pods on the benchmark's node (spread over --namespaces).
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    /// NetworkPolicies (spread over --namespaces).
    #[arg(long, default_value_t = 10_000)]
    policies: usize,
    #[arg(long, default_value_t = 100)]
    namespaces: usize,
    /// Measured one-policy changes, and as many one-pod label changes.
    #[arg(long, default_value_t = 200)]
    changes: usize,
    /// Connection-rate rounds (each measures every configuration once).
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Seconds per connection-rate sample.
    #[arg(long, default_value_t = 0.5)]
    seconds: f64,
    /// Feed the policies before the pods (the store source lists pods
    /// first).
    #[arg(long)]
    policies_first: bool,
    /// Skip the connection-rate part.
    #[arg(long)]
    skip_conn: bool,
    /// Skip the lab part.
    #[arg(long)]
    skip_lab: bool,
    /// Measured policy changes in the lab.
    #[arg(long, default_value_t = 100)]
    lab_changes: usize,
    #[arg(long, default_value_t = 3)]
    lab_nodes: usize,
    /// Server pods per lab node (plus one client pod each).
    #[arg(long, default_value_t = 2)]
    lab_pods: usize,
    /// Give up on one lab change after this long.
    #[arg(long, default_value = "30s", value_parser = podnet_daemon::parse_duration)]
    lab_timeout: Duration,
    /// The podnet binary the lab runs (default: next to this one).
    #[arg(long)]
    podnet: Option<PathBuf>,
    /// Instead of parts 1-3: add and remove one policy with this many
    /// ipBlocks, for each size given (comma-separated), e.g. 250,500,1000,10000.
    #[arg(long, value_delimiter = ',')]
    ipblocks: Vec<usize>,
    /// Add/remove runs per --ipblocks size and shape.
    #[arg(long, default_value_t = 5)]
    ipblock_runs: usize,
}

const NODE: &str = "bench-node";
const TIERS: [&str; 4] = ["web", "api", "db", "cache"];
const SUBNET: &str = "10.244.0.0/16";

fn se(e: SyncError) -> anyhow::Error {
    anyhow!("policy sync: {e}")
}

/// An IPv4 policy plane of [`NODE`] with an empty view, in `node`'s
/// namespace.
fn fresh_plane(node: &TestNs) -> Result<PolicyPlane> {
    let opts = Options {
        node: NODE.into(),
        ipv6: false,
        limit: LogLimit::default(),
        strict: false,
    };
    let world = Arc::new(RwLock::new(World::new()));
    node.netns()
        .run(|| PolicyPlane::new(opts, world, podnet_daemon::Metrics::new()))?
        .map_err(se)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Nearest-rank percentile (`p` in 0..=1).
fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = ((p * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

fn median(v: &[f64]) -> f64 {
    pct(v, 0.5)
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

/// A small deterministic generator, so every run changes the same objects.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n.max(1) as u64) as usize
    }
}

// ---------------------------------------------------------------- memory

fn status_kb(key: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(f64::NAN)
}

fn rss_mb() -> f64 {
    status_kb("VmRSS:") / 1024.0
}

fn hwm_mb() -> f64 {
    status_kb("VmHWM:") / 1024.0
}

/// Resets VmHWM to the current RSS (`clear_refs` 5, Linux ≥ 4.0).
fn reset_hwm() -> Result<()> {
    std::fs::write("/proc/self/clear_refs", "5").context("resetting VmHWM (/proc/self/clear_refs)")
}

/// Gives freed heap pages back, so RSS shows what is still allocated.
fn trim_heap() {
    // SAFETY: malloc_trim only releases free memory of the allocator.
    unsafe {
        libc::malloc_trim(0);
    }
}

// ---------------------------------------------------------------- workload

/// The cluster the benchmark builds: namespaces `ns-<n>`, pods `p-<j>` in
/// each, policies `np-<k>` in each.
#[derive(Clone, Copy)]
struct Shape {
    namespaces: usize,
    pods_per_ns: usize,
    policies_per_ns: usize,
}

impl Shape {
    /// Label groups per namespace (`app-<x>`, 4 pods each).
    fn groups(&self) -> usize {
        (self.pods_per_ns / 4).max(2)
    }

    fn pod_ip(&self, n: usize, j: usize) -> Ipv4Addr {
        Ipv4Addr::from(
            u32::from(Ipv4Addr::new(10, 244, 0, 0)) + 2 + (n * self.pods_per_ns + j) as u32,
        )
    }

    fn app(&self, x: usize) -> String {
        format!("app-{}", x % self.groups())
    }

    fn namespace(&self, n: usize) -> Namespace {
        serde_json::from_value(json!({
            "metadata": {"name": format!("ns-{n}"), "labels": {
                "kubernetes.io/metadata.name": format!("ns-{n}"),
                "team": format!("team-{}", n % 10),
                "env": if n.is_multiple_of(2) { "prod" } else { "dev" },
            }}
        }))
        .expect("namespace")
    }

    /// Pod `j` of namespace `n`: `app-<j/4>` (moved by `shift` groups),
    /// a tier, three named ports.
    fn pod(&self, n: usize, j: usize, shift: usize) -> Pod {
        let ip = self.pod_ip(n, j).to_string();
        serde_json::from_value(json!({
            "metadata": {"name": format!("p-{j}"), "namespace": format!("ns-{n}"),
                "labels": {"app": self.app(j / 4 + shift), "tier": TIERS[j % 4]}},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "bench", "ports": [
                {"name": "http", "containerPort": 8080, "protocol": "TCP"},
                {"name": "metrics", "containerPort": 9090, "protocol": "TCP"},
                {"name": "dns", "containerPort": 53, "protocol": "UDP"},
            ]}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
        }))
        .expect("pod")
    }

    /// Policy `k` of namespace `n` at version `v`. It selects one `app`
    /// group (4 pods; every 20th narrows that to 2 by tier with
    /// matchExpressions) and allows ingress:
    /// - 60 %: from another group of its namespace on one port;
    /// - 20 %: from a group of the next namespace (namespaceSelector) on
    ///   two ports;
    /// - 10 %: from every `web` pod of its namespace on the named port
    ///   `http`;
    /// - 10 %: from an ipBlock with an exception, and a group, on one port;
    /// - 2 % each instead: any port from a group; from the `api` pod of
    ///   `app-0` in every namespace of the team (namespace labels).
    ///
    /// A quarter also isolate egress: to a group on 8080 (every tenth of
    /// those on the named port `metrics`), DNS to `app-0` of `ns-0`, and
    /// every tenth to the internet on 443 (an ipBlock with the private
    /// ranges excepted). Policies selecting the same group name different
    /// peer groups. An odd version adds port `10000 + k` to the ingress
    /// rule (for the any-port rule: moves its peer to the next group), so
    /// every change changes elements.
    fn policy(&self, n: usize, k: usize, v: usize) -> NetworkPolicy {
        let s = k / self.groups();
        let ports = |first: Vec<serde_json::Value>| {
            let mut p = first;
            if v % 2 == 1 {
                p.push(json!({"protocol": "TCP", "port": 10_000 + k}));
            }
            serde_json::Value::Array(p)
        };
        let tcp = |p: u16| json!({"protocol": "TCP", "port": p});
        let mut sel = json!({"matchLabels": {"app": self.app(k)}});
        if k % 20 == 7 {
            sel["matchExpressions"] =
                json!([{"key": "tier", "operator": "In", "values": ["web", "api"]}]);
        }
        let ingress = if k % 50 == 11 {
            json!([{"from": [{"podSelector": {"matchLabels": {"app": self.app(k + 4 + s + v % 2)}}}]}])
        } else if k % 50 == 8 {
            json!([{"from": [{"namespaceSelector": {"matchLabels": {"team": format!("team-{}", n % 10)}},
                              "podSelector": {"matchLabels": {"app": "app-0", "tier": "api"}}}],
                    "ports": ports(vec![tcp(8080)])}])
        } else {
            match k % 10 {
                0..=5 => {
                    json!([{"from": [{"podSelector": {"matchLabels": {"app": self.app(k + 1 + s)}}}],
                                 "ports": ports(vec![tcp(8080)])}])
                }
                6 | 7 => json!([{"from": [{"namespaceSelector": {"matchLabels": {
                                     "kubernetes.io/metadata.name": format!("ns-{}", (n + 1) % self.namespaces)}},
                                   "podSelector": {"matchLabels": {"app": self.app(k + 2 + s)}}}],
                                 "ports": ports(vec![tcp(8080), tcp(9090)])}]),
                8 => json!([{"from": [{"podSelector": {"matchLabels": {"tier": "web"}}}],
                             "ports": ports(vec![json!({"protocol": "TCP", "port": "http"})])}]),
                _ => {
                    let b = 16 + k % 16;
                    json!([{"from": [{"ipBlock": {"cidr": format!("172.{b}.0.0/16"),
                                                  "except": [format!("172.{b}.{}.0/24", k % 256)]}},
                                     {"podSelector": {"matchLabels": {"app": self.app(k + 3 + s)}}}],
                            "ports": ports(vec![tcp(443)])}])
                }
            }
        };
        let mut spec = json!({"podSelector": sel, "policyTypes": ["Ingress"], "ingress": ingress});
        if k.is_multiple_of(4) {
            let first = if k % 40 == 4 {
                json!({"protocol": "TCP", "port": "metrics"})
            } else {
                tcp(8080)
            };
            let mut eg = vec![
                json!({"to": [{"podSelector": {"matchLabels": {"app": self.app(k + 2 + s)}}}], "ports": [first]}),
                json!({"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ns-0"}},
                               "podSelector": {"matchLabels": {"app": "app-0"}}}],
                       "ports": [{"protocol": "UDP", "port": 53}, tcp(53)]}),
            ];
            if k % 40 == 8 {
                eg.push(json!({"to": [{"ipBlock": {"cidr": "0.0.0.0/0",
                                   "except": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]}}],
                               "ports": [tcp(443)]}));
            }
            spec["egress"] = json!(eg);
            spec["policyTypes"] = json!(["Ingress", "Egress"]);
        }
        serde_json::from_value(json!({
            "metadata": {"name": format!("np-{k}"), "namespace": format!("ns-{n}")},
            "spec": spec
        }))
        .expect("policy")
    }

    /// The connection test's pair: the client `ns-0/p-0` (`app-0`) and the
    /// server `ns-0/p-4` (`app-1`).
    fn client(&self) -> Ipv4Addr {
        self.pod_ip(0, 0)
    }

    fn server(&self) -> Ipv4Addr {
        self.pod_ip(0, 4)
    }

    /// Two more policies in `ns-0`: the server's ingress from the client
    /// group on 8080, the client group's egress to the server group on 8080.
    fn pair_policies(&self) -> Vec<NetworkPolicy> {
        [
            json!({"metadata": {"name": "bench-server", "namespace": "ns-0"}, "spec": {
                "podSelector": {"matchLabels": {"app": "app-1"}}, "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "app-0"}}}],
                             "ports": [{"protocol": "TCP", "port": 8080}]}]}}),
            json!({"metadata": {"name": "bench-client", "namespace": "ns-0"}, "spec": {
                "podSelector": {"matchLabels": {"app": "app-0"}}, "policyTypes": ["Egress"],
                "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "app-1"}}}],
                            "ports": [{"protocol": "TCP", "port": 8080}]}]}}),
        ]
        .into_iter()
        .map(|v| serde_json::from_value(v).expect("policy"))
        .collect()
    }
}

fn added(o: Object) -> Delta {
    Delta::Added(Arc::new(o))
}

fn updated(o: Object) -> Delta {
    Delta::Updated(Arc::new(o))
}

// ---------------------------------------------------------------- syncs

/// One sync as `podnet_reconcile::sync` runs it (plan, observe, diff,
/// apply), each verb timed; then `synced`, which the loop calls after it.
#[derive(Default, Clone, Copy)]
struct Timed {
    ops: usize,
    plan: Duration,
    observe: Duration,
    diff: Duration,
    apply: Duration,
    synced: Duration,
    /// The batch touched an interval set (`*-net-*`).
    interval: bool,
    /// The most elements a batch deleted one by one from one pipapo set,
    /// and the pipapo sets rebuilt instead.
    pipapo_deletes: usize,
    rebuilt: usize,
    /// CPU seconds (user, system) of this thread per verb: plan, observe,
    /// diff, apply. System time is the kernel's work for our netlink calls.
    cpu: [(f64, f64); 4],
}

impl Timed {
    fn sync(&self) -> Duration {
        self.plan + self.observe + self.diff + self.apply
    }
}

/// This thread's (user, system) CPU seconds so far.
fn thread_cpu() -> (f64, f64) {
    // SAFETY: getrusage fills the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (s(u.ru_utime), s(u.ru_stime))
}

fn sync_timed(p: &mut PolicyPlane, scope: &Scope<Dirty>) -> Result<Timed> {
    let mut t = Timed::default();
    let mut c0 = thread_cpu();
    let mut lap = |i: usize| {
        let c = thread_cpu();
        t.cpu[i] = (c.0 - c0.0, c.1 - c0.1);
        c0 = c;
    };
    let t0 = Instant::now();
    let plan = p.plan(scope);
    t.plan = t0.elapsed();
    lap(0);
    let t0 = Instant::now();
    let observed = p.observe(scope).map_err(se)?;
    t.observe = t0.elapsed();
    lap(1);
    let t0 = Instant::now();
    let changes = p.diff(plan, observed);
    t.diff = t0.elapsed();
    lap(2);
    if let PolicyChanges::Elems(batches, _) = &changes {
        t.interval = batches.iter().flat_map(|(_, c)| c).any(|c| match c {
            Change::AddElems { set, .. } | Change::DelElems { set, .. } => set.contains("-net-"),
            _ => false,
        });
    }
    let t0 = Instant::now();
    t.ops = p.apply(changes).map_err(se)?;
    t.apply = t0.elapsed();
    lap(3);
    for b in p.last_batches() {
        t.pipapo_deletes = t.pipapo_deletes.max(b.pipapo_deletes);
        t.rebuilt += b.rebuilt;
    }
    let t0 = Instant::now();
    p.synced(scope, true);
    t.synced = t0.elapsed();
    Ok(t)
}

/// "plan 0.7 s (user 0.7, sys 0.0), ..." for a full sync.
fn full_breakdown(t: &Timed) -> String {
    let names = ["plan", "observe", "diff", "apply"];
    let walls = [t.plan, t.observe, t.diff, t.apply];
    names
        .iter()
        .zip(walls)
        .zip(t.cpu)
        .map(|((n, w), (u, s))| {
            format!("{n} {:.3} s (cpu user {u:.3}, sys {s:.3})", w.as_secs_f64())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One measured change: the watch of one delta, then the partial sync of
/// the dirty scope it produced.
struct Sample {
    watch: Duration,
    sync: Timed,
    dirty: usize,
}

impl Sample {
    /// Watch + sync: what the target counts.
    fn total_ms(&self) -> f64 {
        ms(self.watch + self.sync.sync())
    }
}

fn change(p: &mut PolicyPlane, d: Delta) -> Result<Sample> {
    let mut dirty = BTreeSet::new();
    let t0 = Instant::now();
    p.watch(PolicyInput::Deltas(vec![d]), &mut dirty);
    let watch = t0.elapsed();
    let n = dirty.len();
    let sync = sync_timed(p, &Scope::Only(dirty))?;
    Ok(Sample {
        watch,
        sync,
        dirty: n,
    })
}

fn report_changes(what: &str, s: &[Sample]) -> f64 {
    let col = |f: &dyn Fn(&Sample) -> f64| -> (f64, f64) {
        let v: Vec<f64> = s.iter().map(f).collect();
        (median(&v), pct(&v, 0.99))
    };
    let total = col(&|x| x.total_ms());
    let watch = col(&|x| ms(x.watch));
    let plan = col(&|x| ms(x.sync.plan));
    let diff = col(&|x| ms(x.sync.diff));
    let apply = col(&|x| ms(x.sync.apply));
    let synced = col(&|x| ms(x.sync.synced));
    let looped = col(&|x| x.total_ms() + ms(x.sync.synced));
    let ops = col(&|x| x.sync.ops as f64);
    let dirty = col(&|x| x.dirty as f64);
    println!(
        "{what}: n={} watch+sync median {:.2} ms, p99 {:.2} ms (max {:.2} ms); ops median {:.0}, p99 {:.0}; dirty pods median {:.0}",
        s.len(),
        total.0,
        total.1,
        pct(&s.iter().map(|x| x.total_ms()).collect::<Vec<_>>(), 1.0),
        ops.0,
        ops.1,
        dirty.0
    );
    println!(
        "    median / p99 per step: watch {:.2} / {:.2} ms, plan {:.2} / {:.2}, diff {:.2} / {:.2}, apply {:.2} / {:.2}; \
         then the loop's synced() {:.2} / {:.2} ms",
        watch.0, watch.1, plan.0, plan.1, diff.0, diff.1, apply.0, apply.1, synced.0, synced.1
    );
    println!(
        "    with the loop's synced() after the sync (what the agent pays per change): median {:.2} ms, p99 {:.2} ms",
        looped.0, looped.1
    );
    let rebuilt: Vec<f64> = s
        .iter()
        .filter(|x| x.sync.rebuilt > 0)
        .map(|x| ms(x.sync.apply))
        .collect();
    let dels: Vec<f64> = s.iter().map(|x| x.sync.pipapo_deletes as f64).collect();
    println!(
        "    pipapo sets: most deleted one by one in a batch median {:.0}, max {:.0}; syncs rebuilding a set {} (apply median {:.2} ms, max {:.2} ms)",
        median(&dels),
        pct(&dels, 1.0),
        rebuilt.len(),
        median(&rebuilt),
        pct(&rebuilt, 1.0)
    );
    for iv in [false, true] {
        let v: Vec<f64> = s
            .iter()
            .filter(|x| x.sync.interval == iv)
            .map(|x| ms(x.sync.apply))
            .collect();
        if !v.is_empty() {
            println!(
                "    apply of batches {} an interval set (*-net-*): n={} median {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                if iv { "touching" } else { "not touching" },
                v.len(),
                median(&v),
                pct(&v, 0.99),
                pct(&v, 1.0)
            );
        }
    }
    total.1
}

// ---------------------------------------------------------------- part 1

struct Local {
    plane: PolicyPlane,
    full_s: f64,
    peak_growth_mb: f64,
    policy_p99_ms: f64,
    pod_p99_ms: f64,
    policy_median_ms: f64,
    pod_median_ms: f64,
}

fn node_local(a: &Args, shape: Shape, node: &TestNs) -> Result<Local> {
    let world = Arc::new(RwLock::new(World::new()));
    let opts = Options {
        node: NODE.into(),
        ipv6: false,
        limit: LogLimit::default(),
        strict: false,
    };
    let metrics = podnet_daemon::Metrics::new();
    let mut plane = node
        .netns()
        .run(|| PolicyPlane::new(opts, world.clone(), metrics))?
        .map_err(se)?;

    // Feed, in the store source's order and batch size.
    trim_heap();
    reset_hwm()?;
    let rss0 = rss_mb();
    let hwm0 = hwm_mb();
    let fed = feed(a, shape, &mut plane)?;
    let rss_fed = rss_mb();
    check_interrupted()?;

    // The first full sync, from an empty kernel.
    let full = sync_timed(&mut plane, &Scope::Full)?;
    let rss1 = rss_mb();
    let hwm1 = hwm_mb();
    trim_heap();
    let rss1_trim = rss_mb();
    let counts = plane.element_counts();
    let replan = replan_time(&world);
    report_full(a, shape, node, fed, &full, &counts, replan);
    let peak_growth = hwm1 - rss0;
    println!(
        "memory: RSS before the feed {rss0:.1} MB (VmHWM reset: {hwm0:.1}); after the feed {rss_fed:.1}; after the full sync {rss1:.1} ({rss1_trim:.1} after malloc_trim); \
         peak VmHWM {hwm1:.1} MB: growth {peak_growth:.1} MB; planner state kept (trimmed RSS growth) {:.1} MB",
        rss1_trim - rss0
    );
    check_interrupted()?;

    // One-policy changes, then one-pod label changes.
    let (pol, pod) = measure_changes(a, shape, &mut plane)?;
    let policy_p99 = report_changes("one-policy change", &pol);
    let pod_p99 = report_changes("one-pod label change", &pod);
    check_resync(&mut plane)?;
    let med = |v: &[Sample]| median(&v.iter().map(|x| x.total_ms()).collect::<Vec<_>>());
    Ok(Local {
        full_s: full.sync().as_secs_f64(),
        peak_growth_mb: peak_growth,
        policy_p99_ms: policy_p99,
        pod_p99_ms: pod_p99,
        policy_median_ms: med(&pol),
        pod_median_ms: med(&pod),
        plane,
    })
}

/// Feeds the whole workload to `plane` as watch deltas, in the store
/// source's order and batch size (or policies before pods with
/// `--policies-first`), then the pod subnet; returns the time spent in
/// `watch` and the batches fed.
fn feed(a: &Args, shape: Shape, plane: &mut PolicyPlane) -> Result<(Duration, usize)> {
    let mut dirty = BTreeSet::new();
    let mut feed_time = Duration::ZERO;
    let mut batches = 0usize;
    let mut feed = |plane: &mut PolicyPlane, ds: Vec<Delta>| {
        let t0 = Instant::now();
        plane.watch(PolicyInput::Deltas(ds), &mut dirty);
        feed_time += t0.elapsed();
        batches += 1;
    };
    const CHUNK: usize = 64;
    let nss: Vec<usize> = (0..shape.namespaces).collect();
    for c in nss.chunks(CHUNK) {
        let ds = c
            .iter()
            .map(|&n| added(Object::Namespace(Box::new(shape.namespace(n)))))
            .collect();
        feed(plane, ds);
    }
    let pods: Vec<(usize, usize)> = (0..shape.namespaces)
        .flat_map(|n| (0..shape.pods_per_ns).map(move |j| (n, j)))
        .collect();
    let pols: Vec<(usize, usize)> = (0..shape.namespaces)
        .flat_map(|n| (0..shape.policies_per_ns).map(move |k| (n, k)))
        .collect();
    // The store source lists kinds in order: Namespaces, then Pods, then
    // NetworkPolicies; `--policies-first` feeds the policies before the
    // pods (as a source that lists kinds concurrently may).
    let kinds = if a.policies_first {
        [Kind::NetworkPolicy, Kind::Pod]
    } else {
        [Kind::Pod, Kind::NetworkPolicy]
    };
    for kind in kinds {
        let list = if kind == Kind::Pod { &pods } else { &pols };
        for c in list.chunks(CHUNK) {
            let ds = c
                .iter()
                .map(|&(n, x)| match kind {
                    Kind::Pod => added(Object::Pod(Box::new(shape.pod(n, x, 0)))),
                    _ => added(Object::NetworkPolicy(Box::new(shape.policy(n, x, 0)))),
                })
                .collect();
            feed(plane, ds);
        }
    }
    feed(
        plane,
        shape
            .pair_policies()
            .into_iter()
            .map(|p| added(Object::NetworkPolicy(Box::new(p))))
            .collect(),
    );
    plane.watch(
        PolicyInput::Subnets(vec![SUBNET.parse()?]),
        &mut BTreeSet::new(),
    );
    Ok((feed_time, batches))
}

/// Profile: what planning every pod costs (the plan verb does it, and
/// apply does it again for its bookkeeping), to tell the planner's share
/// of the full sync's apply from the kernel's.
fn replan_time(world: &RwLock<World>) -> Duration {
    let w = world.read().expect("world");
    let t0 = Instant::now();
    let mut n = 0usize;
    for (k, v) in &w.pods {
        n += plan::pod_elements(&w, NODE, k, v).len();
    }
    std::hint::black_box(n);
    t0.elapsed()
}

/// Prints part 1's workload, the feed and the first full sync (with its
/// per-verb breakdown and the replanning profile).
fn report_full(
    a: &Args,
    shape: Shape,
    node: &TestNs,
    (feed_time, batches): (Duration, usize),
    full: &Timed,
    counts: &std::collections::BTreeMap<&'static str, usize>,
    replan: Duration,
) {
    let elements: usize = counts.values().sum();
    println!(
        "== 1. node-local: {} pods ({} namespaces x {}), {} policies (+2 for the connection test), node {NODE}, netns {}",
        shape.namespaces * shape.pods_per_ns,
        shape.namespaces,
        shape.pods_per_ns,
        shape.namespaces * shape.policies_per_ns,
        node.name()
    );
    println!(
        "feed ({}): {} batches of deltas watched in {:.3} s",
        if a.policies_first {
            "Namespaces, NetworkPolicies, Pods"
        } else {
            "Namespaces, Pods, NetworkPolicies: the store source's order"
        },
        batches,
        feed_time.as_secs_f64()
    );
    println!(
        "full programming (first full sync, empty kernel): {:.3} s: {}; then synced() {:.3} s; {} ops, {} elements: {}",
        full.sync().as_secs_f64(),
        full_breakdown(full),
        full.synced.as_secs_f64(),
        full.ops,
        elements,
        counts
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "    profile: planning every pod once (plan::pod_elements) takes {:.3} s; apply plans every pod again (all_owned), so ~{:.3} s of apply is kernel + bookkeeping",
        replan.as_secs_f64(),
        (full.apply.saturating_sub(replan)).as_secs_f64()
    );
    println!(
        "    feed + full sync: {:.3} s",
        (feed_time + full.sync()).as_secs_f64()
    );
}

/// The measured changes: `--changes` one-policy changes, then as many
/// one-pod label changes, in namespaces other than `ns-0` (which holds the
/// connection test's pair) where there are others; each must send
/// operations.
fn measure_changes(
    a: &Args,
    shape: Shape,
    plane: &mut PolicyPlane,
) -> Result<(Vec<Sample>, Vec<Sample>)> {
    // One-policy changes.
    let mut rng = Lcg(0x5eed);
    let mut versions: HashMap<(usize, usize), usize> = HashMap::new();
    let mut pol = Vec::with_capacity(a.changes);
    let other_ns = |rng: &mut Lcg| {
        if shape.namespaces > 1 {
            1 + rng.below(shape.namespaces - 1)
        } else {
            0
        }
    };
    for _ in 0..a.changes {
        let (n, k) = (other_ns(&mut rng), rng.below(shape.policies_per_ns));
        let v = versions.entry((n, k)).or_insert(0);
        *v += 1;
        let d = updated(Object::NetworkPolicy(Box::new(shape.policy(n, k, *v))));
        let s = change(plane, d)?;
        if s.sync.ops == 0 {
            bail!("changing policy ns-{n}/np-{k} sent no operations");
        }
        pol.push(s);
    }
    check_interrupted()?;
    // One-pod label changes.
    let mut shifts: HashMap<(usize, usize), usize> = HashMap::new();
    let mut pod = Vec::with_capacity(a.changes);
    for _ in 0..a.changes {
        let (n, j) = (other_ns(&mut rng), rng.below(shape.pods_per_ns));
        let s = shifts.entry((n, j)).or_insert(0);
        *s = 1 - *s;
        let d = updated(Object::Pod(Box::new(shape.pod(n, j, *s))));
        let s = change(plane, d)?;
        if s.sync.ops == 0 {
            bail!("relabelling pod ns-{n}/p-{j} sent no operations");
        }
        pod.push(s);
    }
    Ok((pol, pod))
}

/// The incremental path must have left exactly the full plan: a full sync
/// after the changes has to send nothing.
fn check_resync(plane: &mut PolicyPlane) -> Result<()> {
    let resync = sync_timed(plane, &Scope::Full)?;
    if resync.ops != 0 {
        bail!(
            "after the changes a full sync still sent {} operations: the incremental path drifted",
            resync.ops
        );
    }
    println!(
        "check: a full sync after the changes sends 0 ops; it took {:.3} s: {} (what every periodic resync costs at this size)",
        resync.sync().as_secs_f64(),
        full_breakdown(&resync)
    );
    Ok(())
}

// ---------------------------------------------------------------- ipBlocks

/// A policy selecting `app=big` whose ingress allows `n` ipBlocks (the
/// distinct /24s `11.x.y.0/24`), on TCP 443 or (`port` false) every port.
fn ipblock_policy(n: usize, port: bool) -> NetworkPolicy {
    let from: Vec<serde_json::Value> = (0..n)
        .map(|i| json!({"ipBlock": {"cidr": format!("11.{}.{}.0/24", (i >> 8) & 255, i & 255)}}))
        .collect();
    let mut rule = json!({"from": from});
    if port {
        rule["ports"] = json!([{"protocol": "TCP", "port": 443}]);
    }
    serde_json::from_value(json!({
        "metadata": {"name": "many-blocks", "namespace": "ns-0"},
        "spec": {"podSelector": {"matchLabels": {"app": "big"}},
                 "policyTypes": ["Ingress"], "ingress": [rule]}
    }))
    .expect("policy")
}

/// One add or removal of the ipBlock policy: time (ours: watch, plan and
/// diff; the kernel's: apply, which sends the batches), and the batches.
struct BlockRun {
    total_ms: f64,
    ours_ms: f64,
    apply_ms: f64,
    apply_sys_s: f64,
    batches: Vec<podnet_policy::dataplane::BatchReport>,
}

fn block_run(p: &mut PolicyPlane, d: Delta) -> Result<BlockRun> {
    let s = change(p, d)?;
    Ok(BlockRun {
        total_ms: s.total_ms(),
        ours_ms: ms(s.watch + s.sync.plan + s.sync.observe + s.sync.diff),
        apply_ms: ms(s.sync.apply),
        apply_sys_s: s.sync.cpu[3].1,
        batches: p.last_batches().to_vec(),
    })
}

fn report_block_runs(what: &str, v: &[BlockRun]) -> f64 {
    let col = |f: &dyn Fn(&BlockRun) -> f64| v.iter().map(f).collect::<Vec<f64>>();
    let total = col(&|r| r.total_ms);
    let batches = v.iter().flat_map(|r| r.batches.iter());
    let max_ops = batches.clone().map(|b| b.ops).max().unwrap_or(0);
    let max_del = batches.clone().map(|b| b.pipapo_deletes).max().unwrap_or(0);
    let rebuilt = batches.clone().map(|b| b.rebuilt).max().unwrap_or(0);
    println!(
        "    {what}: n={} median {:.2} ms (min {:.2}, max {:.2}); ours (watch+plan+diff) median {:.2} ms, \
         apply (netlink batches) median {:.2} ms (kernel sys CPU {:.3} s); batches per sync {}, \
         largest {} ops, most pipapo deletions one by one in a batch {} (bound: diff::delete_one_by_one), sets rebuilt {}",
        v.len(),
        median(&total),
        pct(&total, 0.0),
        pct(&total, 1.0),
        median(&col(&|r| r.ours_ms)),
        median(&col(&|r| r.apply_ms)),
        median(&col(&|r| r.apply_sys_s)),
        v.first().map_or(0, |r| r.batches.len()),
        max_ops,
        max_del,
        rebuilt
    );
    median(&total)
}

/// Adds and removes the ipBlock policy `--ipblock-runs` times per size and
/// shape in a fresh node namespace holding 8 pods (one selected); returns
/// the removal medians per (size, shape).
fn ipblock_case(a: &Args) -> Result<Vec<(usize, bool, f64)>> {
    let mut out = Vec::new();
    let shape = Shape {
        namespaces: 1,
        pods_per_ns: 8,
        policies_per_ns: 0,
    };
    for &n in &a.ipblocks {
        for port in [false, true] {
            let node = TestNs::create(ns_name("ipb"))?;
            let mut plane = fresh_plane(&node)?;
            let mut ds = vec![added(Object::Namespace(Box::new(shape.namespace(0))))];
            for j in 0..shape.pods_per_ns {
                let mut p = shape.pod(0, j, 0);
                if j == 0 {
                    let labels = p.metadata.labels.get_or_insert_with(Default::default);
                    labels.insert("app".into(), "big".into());
                }
                ds.push(added(Object::Pod(Box::new(p))));
            }
            let mut dirty = BTreeSet::new();
            plane.watch(PolicyInput::Deltas(ds), &mut dirty);
            plane.watch(PolicyInput::Subnets(vec![SUBNET.parse()?]), &mut dirty);
            sync_timed(&mut plane, &Scope::Full)?;
            let (mut adds, mut dels) = (Vec::new(), Vec::new());
            for _ in 0..a.ipblock_runs {
                let pol = ipblock_policy(n, port);
                adds.push(block_run(
                    &mut plane,
                    updated(Object::NetworkPolicy(Box::new(pol))),
                )?);
                dels.push(block_run(
                    &mut plane,
                    Delta::Deleted(podnet_source::ObjectKey {
                        kind: Kind::NetworkPolicy,
                        namespace: Some("ns-0".into()),
                        name: "many-blocks".into(),
                    }),
                )?);
                check_interrupted()?;
            }
            let left = sync_timed(&mut plane, &Scope::Full)?;
            if left.ops != 0 {
                bail!(
                    "after removing the ipBlock policy a full sync still sent {} operations",
                    left.ops
                );
            }
            println!(
                "{n} ipBlocks, {} (netns {}):",
                if port {
                    "TCP 443 (in-net-port)"
                } else {
                    "every port (in-net-all)"
                },
                node.name()
            );
            report_block_runs("add   ", &adds);
            let med = report_block_runs("remove", &dels);
            out.push((n, port, med));
            drop(plane);
            node.delete()?;
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------- part 2

fn sh(ns: &str, cmd: &str) -> Result<String> {
    let (ok, out) = try_sh_in(ns, cmd);
    if !ok {
        bail!("{ns}: {cmd}: {out}");
    }
    Ok(out)
}

fn denied_packets(c: &mut Conn) -> Result<u64> {
    let mut n = 0;
    for name in [
        plan::COUNTER_EGRESS,
        plan::COUNTER_INGRESS,
        plan::COUNTER_UNKNOWN,
    ] {
        n += c
            .counter(Family::Ip, plan::TABLE, name)?
            .map(|x| x.0)
            .unwrap_or(0);
    }
    Ok(n)
}

/// One node's pod pair: a client and a server namespace on a bridge in
/// the node namespace, the server accepting on 8080 and 8081.
struct Pair {
    cli: TestNs,
    _srv: TestNs,
    _listeners: Vec<std::net::TcpListener>,
}

fn pair(node: &TestNs, tag: &str, cip: Ipv4Addr, sip: Ipv4Addr) -> Result<Pair> {
    let cli = TestNs::create(ns_name(&format!("{tag}-cli")))?;
    let srv = TestNs::create(ns_name(&format!("{tag}-srv")))?;
    let nn = node.name();
    sh(
        nn,
        &format!(
            "ip link add br0 type bridge && ip addr add 10.244.0.1/16 dev br0 && ip link set br0 up && \
             ip link add c0 type veth peer name eth0 netns {} && ip link add s0 type veth peer name eth0 netns {} && \
             ip link set c0 master br0 up && ip link set s0 master br0 up && \
             sysctl -qw net.bridge.bridge-nf-call-iptables=1",
            cli.name(),
            srv.name()
        ),
    )?;
    for (ns, ip) in [(&cli, cip), (&srv, sip)] {
        sh(
            ns.name(),
            &format!("ip addr add {ip}/16 dev eth0 && ip link set eth0 up && ip route add default via 10.244.0.1"),
        )?;
    }
    let bnf = sh(nn, "sysctl -n net.bridge.bridge-nf-call-iptables")?;
    if bnf.trim() != "1" {
        bail!("bridge-nf-call-iptables is {bnf:?} in {nn}: bridged packets would skip netfilter");
    }
    let mut listeners = Vec::new();
    for port in [8080u16, 8081] {
        let l = srv.run(|| std::net::TcpListener::bind(SocketAddr::new(IpAddr::V4(sip), port)))?;
        {
            use std::os::fd::AsRawFd;
            // SAFETY: listen(2) again on our socket only raises its backlog.
            unsafe { libc::listen(l.as_raw_fd(), 4096) };
        }
        for _ in 0..2 {
            let l = l.try_clone()?;
            std::thread::spawn(move || {
                while let Ok((s, _)) = l.accept() {
                    drop(s);
                }
            });
        }
        listeners.push(l);
    }
    Ok(Pair {
        cli,
        _srv: srv,
        _listeners: listeners,
    })
}

fn connects(p: &Pair, to: SocketAddr, secs: u64) -> bool {
    p.cli
        .run(|| TcpStream::connect_timeout(&to, Duration::from_secs(secs)))
        .is_ok()
}

struct ConnResult {
    table: Vec<f64>,
    none: Vec<f64>,
    ct: Vec<f64>,
    ratios: Vec<f64>,
}

/// Three identical nodes, each with the same client and server pod: the
/// benchmark's node with the whole policy table (from part 1), one with no
/// table at all, and the baseline: podnet's policy table with no
/// NetworkPolicy (what a podnet node without policies runs: connection
/// tracking and the table's lookups, no pod isolated). Rounds visit all three in turn, in an
/// order that alternates, so they share the machine's weather without
/// reloading the table between samples.
fn connection_rate(a: &Args, shape: Shape, node: &TestNs) -> Result<ConnResult> {
    let (cip, sip) = (shape.client(), shape.server());
    let allowed = SocketAddr::new(IpAddr::V4(sip), 8080);
    let denied = SocketAddr::new(IpAddr::V4(sip), 8081);
    let with_table = pair(node, "pt", cip, sip)?;
    let none_node = TestNs::create(ns_name("node-none"))?;
    let none = pair(&none_node, "pn", cip, sip)?;
    // The baseline "no policy": what a podnet node without NetworkPolicy
    // runs, the agent's policy table holding only the two pods (every new
    // connection is tracked and looked up, no pod is isolated).
    let ct_node = TestNs::create(ns_name("node-nopol"))?;
    let ct = pair(&ct_node, "pc", cip, sip)?;
    {
        let mut empty = fresh_plane(&ct_node)?;
        let mut dirty = BTreeSet::new();
        empty.watch(
            PolicyInput::Deltas(vec![
                added(Object::Namespace(Box::new(shape.namespace(0)))),
                added(Object::Pod(Box::new(shape.pod(0, 0, 0)))),
                added(Object::Pod(Box::new(shape.pod(0, 4, 0)))),
            ]),
            &mut dirty,
        );
        empty.watch(
            PolicyInput::Subnets(vec!["10.244.0.0/16".parse().expect("net")]),
            &mut dirty,
        );
        podnet_reconcile::sync(&mut empty, &Scope::Full).map_err(se)?;
    }
    // With the table the allowed flow connects and the denied one is
    // dropped and counted, so the measured path crosses the table; without
    // it the denied port is open, so the drop was the table's.
    let mut nconn = node.run(Conn::open)?;
    let before = denied_packets(&mut nconn)?;
    if !connects(&with_table, allowed, 3) {
        bail!("client {cip} cannot reach the server {allowed} with the policy table loaded");
    }
    if connects(&with_table, denied, 1) {
        bail!("client {cip} reached {denied}, which no policy allows: the flow does not cross the policy table");
    }
    let after = denied_packets(&mut nconn)?;
    if after <= before {
        bail!("the denied connection to {denied} failed but no denial counter moved ({before} -> {after})");
    }
    for (what, p) in [
        ("no table", &none),
        ("the policy table without policies", &ct),
    ] {
        if !connects(p, denied, 3) {
            bail!("{denied} is unreachable on the node with {what}");
        }
    }
    let (mut t, mut n, mut c, mut ratios) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in 0..a.rounds {
        check_interrupted()?;
        let order: [(&Pair, &mut Vec<f64>); 3] = if r.is_multiple_of(2) {
            [(&with_table, &mut t), (&none, &mut n), (&ct, &mut c)]
        } else {
            [(&ct, &mut c), (&none, &mut n), (&with_table, &mut t)]
        };
        for (p, out) in order {
            out.push(conn_rate(p.cli.name(), allowed, a.seconds)?);
        }
        let (tr, nr, cr) = (t[r], n[r], c[r]);
        ratios.push(tr / cr);
        eprintln!(
            "policy-bench: round {}: 10k policies {tr:.0}/s, no table {nr:.0}/s, no policy {cr:.0}/s",
            r + 1
        );
    }
    Ok(ConnResult {
        table: t,
        none: n,
        ct: c,
        ratios,
    })
}

// ---------------------------------------------------------------- part 3

/// The lab, removed on every way out (`podnet lab down`; the library's
/// teardown if the command fails).
struct LabGuard {
    lab: podnet_lab::Lab,
}

impl Drop for LabGuard {
    fn drop(&mut self) {
        let out = Command::new(&self.lab.exe)
            .env_remove("PODNET_STORE")
            .args(["lab", "--name", &self.lab.name, "down"])
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            other => {
                eprintln!(
                    "policy-bench: `podnet lab down` failed ({other:?}); removing the lab directly"
                );
                if let Err(e) = self.lab.down() {
                    eprintln!("policy-bench: lab down: {e}");
                }
            }
        }
    }
}

fn podnet_ok(exe: &Path, args: &[&str]) -> Result<String> {
    let o = Command::new(exe)
        .env_remove("PODNET_STORE")
        .args(args)
        .output()
        .with_context(|| format!("running podnet {args:?}"))?;
    if !o.status.success() {
        bail!(
            "podnet {args:?}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn toggle_yaml(allow: bool) -> String {
    let ingress = if allow {
        "  ingress:\n  - from:\n    - podSelector:\n        matchLabels: {app: pbcli}\n    ports:\n    - {protocol: TCP, port: 8080}\n"
    } else {
        "  ingress: []\n"
    };
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: pb-toggle\n  namespace: default\n\
         spec:\n  podSelector:\n    matchLabels: {{app: pbweb}}\n  policyTypes: [Ingress]\n{ingress}"
    )
}

fn apply(exe: &Path, store: &str, yaml: &str) -> Result<Child> {
    let mut c = Command::new(exe)
        .env_remove("PODNET_STORE")
        .args(["--store", store, "apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning podnet apply")?;
    c.stdin.take().expect("piped").write_all(yaml.as_bytes())?;
    Ok(c)
}

fn finish(c: Child) -> Result<()> {
    let o = c.wait_with_output()?;
    if !o.status.success() {
        bail!("podnet apply: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(())
}

/// Per node: a netlink connection in its namespace, and the elements that
/// say "client may reach server on 8080" for the servers on that node.
struct Watch {
    nodes: Vec<(String, Conn, Vec<Vec<Value>>)>,
}

impl Watch {
    /// How many expected elements are in the state `present` now.
    fn matching(&mut self, present: bool) -> Result<(usize, usize)> {
        let (mut ok, mut all) = (0, 0);
        for (name, c, keys) in &mut self.nodes {
            for k in keys.iter() {
                all += 1;
                let has = c
                    .has_element(Family::Ip, plan::TABLE, "in-pod-port", k)
                    .with_context(|| format!("reading node {name}'s policy table"))?;
                if has == present {
                    ok += 1;
                }
            }
        }
        Ok((ok, all))
    }

    fn all(&mut self, present: bool) -> Result<bool> {
        let (ok, all) = self.matching(present)?;
        Ok(ok == all)
    }
}

struct LabResult {
    latency: Vec<f64>,
    after_apply: Vec<f64>,
    apply: Vec<f64>,
    pods: usize,
}

fn lab(a: &Args) -> Result<LabResult> {
    let exe = locate_podnet(a.podnet.as_deref())?;
    let name = format!("pb{}", std::process::id() % 100_000);
    let guard = LabGuard {
        lab: podnet_lab::Lab::new(&name, exe.clone())?,
    };
    let nodes = a.lab_nodes.to_string();
    eprintln!("policy-bench: podnet lab --name {name} up --nodes {nodes} --resync 1");
    podnet_ok(
        &exe,
        &[
            "lab", "--name", &name, "up", "--nodes", &nodes, "--resync", "1",
        ],
    )?;
    let st = guard.lab.state()?;
    let store = st.store.clone();
    eprintln!("policy-bench: lab {name} up, store {store}");
    check_interrupted()?;
    let pods = lab_pods(a, &exe, &name, &st)?;
    let mut watch = lab_watch(a, &guard, &st)?;
    // The allowing version first, unmeasured: every node has it.
    finish(apply(&exe, &store, &toggle_yaml(true))?)?;
    let t0 = Instant::now();
    while !watch.all(true)? {
        if t0.elapsed() > Duration::from_secs(60) {
            let (ok, all) = watch.matching(true)?;
            bail!("the first policy is on {ok} of {all} node elements after 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let (mut latency, mut after_apply, mut applies) = (Vec::new(), Vec::new(), Vec::new());
    for c in 0..a.lab_changes {
        check_interrupted()?;
        let (seen, applied) = lab_change(a, &exe, &store, &mut watch, c)?;
        latency.push(ms(seen));
        after_apply.push(ms(seen.saturating_sub(applied)));
        applies.push(ms(applied));
    }
    drop(watch);
    drop(guard);
    Ok(LabResult {
        latency,
        after_apply,
        apply: applies,
        pods,
    })
}

/// Starts the lab's pods through `podnet lab run`: `--lab-pods` servers
/// (`app=pbweb`) and one client (`app=pbcli`) per node; returns how many.
fn lab_pods(a: &Args, exe: &Path, name: &str, st: &podnet_lab::LabState) -> Result<usize> {
    let mut pods = 0;
    for n in &st.nodes {
        for m in 0..a.lab_pods {
            podnet_ok(
                exe,
                &[
                    "lab",
                    "--name",
                    name,
                    "run",
                    &format!("default/web-{}-{m}", n.name),
                    "--node",
                    &n.name,
                    "--labels",
                    "app=pbweb",
                    "--ports",
                    "8080/tcp",
                ],
            )?;
            pods += 1;
        }
        podnet_ok(
            exe,
            &[
                "lab",
                "--name",
                name,
                "run",
                &format!("default/cli-{}", n.name),
                "--node",
                &n.name,
                "--labels",
                "app=pbcli",
                "--ports",
                "8080/tcp",
            ],
        )?;
        pods += 1;
        check_interrupted()?;
    }
    Ok(pods)
}

/// What the lab's changes are timed against: per node, a netlink
/// connection in its namespace and the `in-pod-port` elements letting
/// every client reach that node's servers on 8080.
fn lab_watch(a: &Args, guard: &LabGuard, st: &podnet_lab::LabState) -> Result<Watch> {
    let ip = |pod: &str| -> Result<IpAddr> {
        let p = guard.lab.pod("default", pod)?;
        p.ip.split('/')
            .next()
            .unwrap_or_default()
            .parse()
            .with_context(|| format!("pod {pod} address {:?}", p.ip))
    };
    let clients: Vec<IpAddr> = st
        .nodes
        .iter()
        .map(|n| ip(&format!("cli-{}", n.name)))
        .collect::<Result<_>>()?;
    let mut watch = Watch { nodes: Vec::new() };
    for n in &st.nodes {
        let c = Netns::named(&n.netns)?.run(Conn::open)??;
        let mut keys = Vec::new();
        for m in 0..a.lab_pods {
            let w = ip(&format!("web-{}-{m}", n.name))?;
            for c in &clients {
                keys.push(vec![
                    Value::Addr(w),
                    Value::Addr(*c),
                    Value::Proto(Proto::Tcp),
                    Value::Port(8080),
                ]);
            }
        }
        watch.nodes.push((n.name.clone(), c, keys));
    }
    Ok(watch)
}

/// Measured change `c` (odd: allow, even: deny): applies the toggled
/// policy and polls every node's kernel until it reflects it; returns the
/// time until then and until the apply command exited, both from its
/// start.
fn lab_change(
    a: &Args,
    exe: &Path,
    store: &str,
    watch: &mut Watch,
    c: usize,
) -> Result<(Duration, Duration)> {
    let allow = c % 2 == 1;
    let yaml = toggle_yaml(allow);
    let t0 = Instant::now();
    let mut child = Some(apply(exe, store, &yaml)?);
    let mut applied: Option<Duration> = None;
    let seen = loop {
        if applied.is_none() {
            if let Some(ch) = child.as_mut() {
                if ch.try_wait()?.is_some() {
                    applied = Some(t0.elapsed());
                    finish(child.take().expect("child"))?;
                }
            }
        }
        if watch.all(allow)? {
            break t0.elapsed();
        }
        if t0.elapsed() > a.lab_timeout {
            let (ok, all) = watch.matching(allow)?;
            bail!(
                "change {c} ({}): {ok} of {all} node elements reflect it after {:?}",
                if allow { "allow" } else { "deny" },
                a.lab_timeout
            );
        }
        std::thread::sleep(Duration::from_micros(200));
    };
    if let Some(ch) = child.take() {
        finish(ch)?;
        applied = Some(t0.elapsed());
    }
    let applied = applied.expect("apply finished");
    Ok((seen, applied))
}

// ---------------------------------------------------------------- main

/// The `--ipblocks` mode, instead of parts 1-3: the add/remove runs per
/// size and shape, then their summary.
fn ipblock_mode(a: &Args) -> Result<()> {
    println!(
        "== removing one policy with many ipBlocks ({} runs per size)",
        a.ipblock_runs
    );
    let r = ipblock_case(a)?;
    println!("\n== summary");
    for (n, port, med) in r {
        println!(
            "removing a policy with {n} ipBlocks ({}): median {med:.2} ms{}",
            if port { "TCP 443" } else { "every port" },
            if n >= 10_000 {
                format!(" (target < 100 ms: {})", verdict(med < 100.0))
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

/// The summary's line for part 2, the connection rate.
fn report_conn(a: &Args, c: &ConnResult) {
    let r = median(&c.ratios);
    println!(
        "new connections/s, {} rounds x {} s per side: 10k policies median {:.0}, no policy (podnet's table, no NetworkPolicy) {:.0}, no table at all {:.0}; \
         10k policies / no policy: median of per-round ratios {:.2}x (range {:.2}-{:.2}), ratio of medians {:.2}x (target >= 0.9x: {}); \
         10k policies / no table at all {:.2}x (connection tracking included)",
        c.table.len(),
        a.seconds,
        median(&c.table),
        median(&c.ct),
        median(&c.none),
        r,
        pct(&c.ratios, 0.0),
        pct(&c.ratios, 1.0),
        median(&c.table) / median(&c.ct),
        verdict(r >= 0.9),
        median(&c.table) / median(&c.none)
    );
}

/// The summary's lines for part 3, the lab.
fn report_lab(a: &Args, l: &LabResult) {
    println!(
        "lab ({} nodes, {} pods, --resync 1): {} policy changes via `podnet apply -f -`, apply start -> every node's kernel: \
         median {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms (target p99 <= 1 s: {})",
        a.lab_nodes,
        l.pods,
        l.latency.len(),
        median(&l.latency),
        pct(&l.latency, 0.9),
        pct(&l.latency, 0.99),
        pct(&l.latency, 1.0),
        verdict(pct(&l.latency, 0.99) <= 1000.0)
    );
    println!(
        "    the apply command itself (spawn to exit): median {:.1} ms, p99 {:.1} ms; after it exited, until every node: median {:.1} ms, p99 {:.1} ms",
        median(&l.apply),
        pct(&l.apply, 0.99),
        median(&l.after_apply),
        pct(&l.after_apply, 0.99)
    );
}

fn main() -> Result<()> {
    let a = Args::parse();
    require_root()?;
    catch_interrupts();
    for n in remove_stale_namespaces() {
        eprintln!("policy-bench: removed {n}, left by a killed run");
    }
    if a.namespaces == 0 || a.pods / a.namespaces < 8 {
        bail!("--pods / --namespaces must be at least 8 (the connection test uses pods 0 and 4 of ns-0)");
    }
    let shape = Shape {
        namespaces: a.namespaces,
        pods_per_ns: a.pods / a.namespaces,
        policies_per_ns: a.policies / a.namespaces,
    };
    if !a.ipblocks.is_empty() {
        return ipblock_mode(&a);
    }
    let node = TestNs::create(ns_name("node"))?;
    let local = node_local(&a, shape, &node)?;
    check_interrupted()?;
    let conn = if a.skip_conn {
        None
    } else {
        Some(connection_rate(&a, shape, &node)?)
    };
    drop(local.plane);
    node.delete()?;
    let lab = if a.skip_lab { None } else { Some(lab(&a)?) };

    println!("\n== summary (targets beside the figures)");
    println!(
        "full programming: {:.3} s (target <= 2 s: {}); peak RSS growth {:.1} MB (target <= 150 MB: {})",
        local.full_s,
        verdict(local.full_s <= 2.0),
        local.peak_growth_mb,
        verdict(local.peak_growth_mb <= 150.0)
    );
    println!(
        "one-policy change: median {:.2} ms, p99 {:.2} ms (target <= 5 ms: {} at p99, {} at the median)",
        local.policy_median_ms,
        local.policy_p99_ms,
        verdict(local.policy_p99_ms <= 5.0),
        verdict(local.policy_median_ms <= 5.0)
    );
    println!(
        "one-pod label change: median {:.2} ms, p99 {:.2} ms (target <= 5 ms: {} at p99, {} at the median)",
        local.pod_median_ms,
        local.pod_p99_ms,
        verdict(local.pod_p99_ms <= 5.0),
        verdict(local.pod_median_ms <= 5.0)
    );
    if let Some(c) = conn {
        report_conn(&a, &c);
    }
    if let Some(l) = lab {
        report_lab(&a, &l);
    }
    Ok(())
}
