//! podnet's service proxy against the real kube-proxy, in the same run
//! (issue 16's proxy benchmark).
//!
//! One 3-node `podnet lab up --kube` (real etcd, kube-apiserver and
//! kube-controller-manager). The proxies take turns on it: either every
//! node's `podnet agent` runs its own proxy, or the agents run with
//! `--no-proxy` and every node runs kube-proxy (built from
//! k8s.io/kubernetes at the apiserver's version by `scripts/k8s-peers.sh
//! kube-proxy`) in `--proxy-mode=nftables`, inside the node's network
//! namespace, with the lab's admin kubeconfig (the lab forwards the
//! apiserver's address into each node namespace). Between turns the
//! outgoing proxy is stopped and its nftables tables are deleted, so each
//! turn starts cold.
//!
//! Both proxies are observed the same way, from outside: kube-proxy's
//! nftables table `ip kube-proxy` and podnet's `ip podnet` each have a set
//! `cluster-ips` that holds every Service's ClusterIP once the proxy has
//! programmed it, and the bench polls it with one exact netlink lookup per
//! node. Per size (`--sizes`, Services with one ready endpoint each) and per
//! turn it measures:
//! - **cold start**: from starting the proxies until every node holds every
//!   ClusterIP (a full resync after a restart, with no table left over);
//! - **network programming latency**: `--creates` Services created one at a
//!   time through the API, each from the moment its POST is sent until its
//!   ClusterIP is on every node (the upstream SLI); measured Services get no
//!   endpoints and are deleted after the turn, so every turn starts from the
//!   same set;
//! - **CPU seconds and peak RSS** of each node's proxy process over the turn
//!   (for podnet that is the whole agent: overlay and policy included).
//!
//! It prints p50/p99 per proxy and size and podnet's ratio to kube-proxy.
//! The lab (and every process it or the bench started) is removed at the
//! end, also on error.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use futures::stream::{self, StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, PostParams};
use podnet_api::k8s_openapi::api::core::v1::{Namespace, Service};
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use podnet_bench::objects::{cluster_ip, http_service, one_endpoint_slice};
use podnet_kernel::Netns;
use podnet_nft::model::{Family, Value};
use podnet_nft::netlink::Conn;
use tokio::runtime::Runtime;

#[derive(Parser)]
#[command(about = "podnet's service proxy against kube-proxy (nftables) in one kube lab")]
struct Args {
    /// Services present during each size's turns.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    sizes: Vec<usize>,
    /// Turns of each proxy per size (the order alternates per round).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Services created one at a time and measured per turn.
    #[arg(long, default_value_t = 100)]
    creates: usize,
    /// API requests in flight while filling.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// The podnet binary the lab runs.
    #[arg(long, default_value = "target/release/podnet")]
    podnet: PathBuf,
    /// kube-proxy; by default `scripts/k8s-peers.sh kube-proxy` finds or builds it.
    #[arg(long)]
    kube_proxy: Option<PathBuf>,
    /// Give up on one Service after this long.
    #[arg(long, default_value = "30s", value_parser = podnet_daemon::parse_duration)]
    timeout: Duration,
    /// kube-proxy's `--iptables-min-sync-period`, which sets the nftables
    /// mode's minimum sync period too (its default when not
    /// given: 1s, which bounds every change's latency from below when
    /// changes come back to back).
    #[arg(long)]
    kp_min_sync_period: Option<String>,
}

const NS: &str = "kpb";
/// kube-proxy's metrics and healthz inside a node namespace (the agent
/// keeps 127.0.0.1:10249).
const KP_METRICS: &str = "127.0.0.1:10349";
const KP_HEALTHZ: &str = "127.0.0.1:10356";

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Proxy {
    Podnet,
    KubeNft,
}

impl Proxy {
    fn name(self) -> &'static str {
        match self {
            Proxy::Podnet => "podnet",
            Proxy::KubeNft => "kube-proxy nftables",
        }
    }
    fn table(self) -> &'static str {
        match self {
            Proxy::Podnet => "podnet",
            Proxy::KubeNft => "kube-proxy",
        }
    }
    /// The pid file (under the lab's `pids/`) of the process on `node`.
    fn role(self, node: &str) -> String {
        match self {
            Proxy::Podnet => format!("agent-{node}"),
            Proxy::KubeNft => format!("kube-proxy-{node}"),
        }
    }
}

/// Removes the lab, and so every process recorded in its `pids/` (the
/// bench records its own there too), on every way out.
struct LabGuard(podnet_lab::Lab);

impl Drop for LabGuard {
    fn drop(&mut self) {
        if let Err(e) = self.0.down() {
            eprintln!("kubeproxy-bench: lab down: {e}");
        }
    }
}

/// One netlink connection per node, opened inside its namespace.
struct Nodes(Vec<(String, String, Conn)>);

impl Nodes {
    fn open(lab: &podnet_lab::Lab) -> Result<Nodes> {
        let st = lab.state()?;
        let mut v = Vec::new();
        for n in &st.nodes {
            let c = Netns::named(&n.netns)?.run(Conn::open)??;
            v.push((n.name.clone(), n.netns.clone(), c));
        }
        Ok(Nodes(v))
    }

    fn has(c: &mut Conn, table: &str, ip: IpAddr) -> Result<bool> {
        Ok(c.has_element(Family::Ip, table, "cluster-ips", &[Value::Addr(ip)])?)
    }

    /// How many nodes hold `ip` in `table`'s `cluster-ips`.
    fn holding(&mut self, table: &str, ip: IpAddr) -> Result<usize> {
        let mut n = 0;
        for (name, _, c) in &mut self.0 {
            if Self::has(c, table, ip).with_context(|| format!("reading {name}'s {table}"))? {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Waits until every node holds every one of `ips` in `table`.
    fn wait_all(&mut self, table: &str, ips: &[IpAddr], deadline: Instant) -> Result<()> {
        let mut pending: Vec<Vec<IpAddr>> = self.0.iter().map(|_| ips.to_vec()).collect();
        loop {
            for ((name, _, c), p) in self.0.iter_mut().zip(pending.iter_mut()) {
                let mut err = None;
                p.retain(|ip| match Self::has(c, table, *ip) {
                    Ok(h) => !h,
                    Err(e) => {
                        err = Some(e);
                        true
                    }
                });
                if let Some(e) = err {
                    return Err(e.context(format!("reading {name}'s {table}")));
                }
            }
            let left: usize = pending.iter().map(Vec::len).sum();
            if left == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{left} ClusterIPs still missing from table {table} on some node");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Deletes table `name` (ip and ip6) in every node.
    fn delete_tables(&mut self, name: &str) -> Result<()> {
        for (_, _, c) in &mut self.0 {
            for fam in [Family::Ip, Family::Ip6] {
                c.delete_table(fam, name)?;
            }
        }
        Ok(())
    }
}

/// CPU seconds (user + system) and VmHWM (MiB) of process `pid`.
fn usage(pid: i32) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command; utime and stime are 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf(3) only.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = (f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / tck;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<f64>()
        .ok()?
        / 1024.0;
    Some((cpu, hwm))
}

fn read_pid(lab: &podnet_lab::Lab, role: &str) -> Option<i32> {
    std::fs::read_to_string(lab.dir.join("pids").join(role))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// SIGTERM, then SIGKILL after 10 s; waits until `pid` is gone.
fn stop(pid: i32) {
    // SAFETY: plain kill(2).
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}")).exists() {
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true);
        if zombie {
            break;
        }
        if Instant::now() > deadline {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts `cmd` detached inside namespace `netns`, logging to the lab's
/// `logs/<role>.log` and recording its pid as the lab records its own
/// (so `lab down` stops it too).
fn spawn_in(lab: &podnet_lab::Lab, role: &str, netns: &str, cmd: &mut Command) -> Result<i32> {
    use std::os::unix::process::CommandExt;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(lab.log_path(role))?;
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0);
    let child = Netns::named(netns)?
        .run(|| cmd.spawn())?
        .with_context(|| format!("starting {role}"))?;
    let pid = child.id() as i32;
    std::fs::write(lab.dir.join("pids").join(role), pid.to_string())?;
    std::thread::spawn(move || {
        let mut c = child;
        let _ = c.wait();
    });
    Ok(pid)
}

struct Bench {
    lab: LabGuard,
    rt: Runtime,
    svcs: Api<Service>,
    nodes: Nodes,
    kube_proxy: PathBuf,
    kp_extra: Vec<String>,
    admin_kubeconfig: PathBuf,
    /// The proxy running now (None: agents with `--no-proxy`).
    active: Option<Proxy>,
}

impl Bench {
    fn node_names(&self) -> Vec<(String, String)> {
        self.nodes
            .0
            .iter()
            .map(|(n, ns, _)| (n.clone(), ns.clone()))
            .collect()
    }

    /// Replaces every node's agent with one that runs `--no-proxy`.
    fn agents_without_proxy(&self) -> Result<()> {
        let lab = &self.lab.0;
        let st = lab.state()?;
        for node in &st.nodes {
            lab.stop_agent(&node.name, false)?;
            let mut args = lab.daemon_args(&st, podnet_lab::Daemon::Agent(node));
            args.push("--no-proxy".into());
            let mut cmd = Command::new(&lab.exe);
            cmd.args(&args).env("NO_COLOR", "1");
            spawn_in(lab, &format!("agent-{}", node.name), &node.netns, &mut cmd)?;
        }
        Ok(())
    }

    /// Stops the active proxy, deletes its tables; returns each node's
    /// (CPU seconds, peak RSS MiB) of its process.
    fn deactivate(&mut self) -> Result<Vec<(f64, f64)>> {
        let Some(p) = self.active.take() else {
            return Ok(vec![]);
        };
        let mut use_ = Vec::new();
        for (node, _) in self.node_names() {
            if let Some(u) = read_pid(&self.lab.0, &p.role(&node)).and_then(usage) {
                use_.push(u);
            }
        }
        match p {
            Proxy::Podnet => self.agents_without_proxy()?,
            Proxy::KubeNft => {
                for (node, _) in self.node_names() {
                    if let Some(pid) = read_pid(&self.lab.0, &p.role(&node)) {
                        stop(pid);
                    }
                    let _ = std::fs::remove_file(self.lab.0.dir.join("pids").join(p.role(&node)));
                }
            }
        }
        self.nodes.delete_tables(p.table())?;
        Ok(use_)
    }

    /// Starts `p` on every node (nothing else runs a proxy).
    fn activate(&mut self, p: Proxy) -> Result<()> {
        assert!(self.active.is_none());
        for (node, netns) in self.node_names() {
            match p {
                Proxy::Podnet => self.lab.0.restart_agent(&node)?,
                Proxy::KubeNft => {
                    let mut cmd = Command::new(&self.kube_proxy);
                    cmd.args([
                        format!("--kubeconfig={}", self.admin_kubeconfig.display()),
                        format!("--hostname-override={node}"),
                        "--proxy-mode=nftables".into(),
                        "--cluster-cidr=10.244.0.0/16".into(),
                        format!("--metrics-bind-address={KP_METRICS}"),
                        format!("--healthz-bind-address={KP_HEALTHZ}"),
                        // A node namespace shares the host's conntrack
                        // limits: leave them as they are.
                        "--conntrack-max-per-core=0".into(),
                        "--conntrack-tcp-timeout-established=0".into(),
                        "--conntrack-tcp-timeout-close-wait=0".into(),
                        "--v=1".into(),
                    ]);
                    cmd.args(&self.kp_extra);
                    spawn_in(&self.lab.0, &p.role(&node), &netns, &mut cmd)?;
                }
            }
        }
        self.active = Some(p);
        Ok(())
    }
}

#[derive(Default)]
struct Figures {
    prog: Vec<f64>,
    /// Per turn: the median programming latency.
    turn_p50: Vec<f64>,
    cold: Vec<f64>,
    /// Per turn: CPU seconds summed over nodes, the largest peak RSS.
    cpu: Vec<f64>,
    rss: Vec<f64>,
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn kube_proxy_path(a: &Args) -> Result<PathBuf> {
    if let Some(p) = &a.kube_proxy {
        return Ok(p.clone());
    }
    let out = Command::new("scripts/k8s-peers.sh")
        .arg("kube-proxy")
        .stderr(Stdio::inherit())
        .output()
        .context("running scripts/k8s-peers.sh kube-proxy (run from the repository root, or pass --kube-proxy)")?;
    if !out.status.success() {
        bail!("scripts/k8s-peers.sh kube-proxy failed");
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("KUBE_PROXY="))
        .map(PathBuf::from)
        .context("scripts/k8s-peers.sh printed no KUBE_PROXY=")
}

fn main() -> Result<()> {
    let a = Args::parse();
    if !a.podnet.exists() {
        bail!(
            "{} not found: build it first (cargo build --release)",
            a.podnet.display()
        );
    }
    let kube_proxy = kube_proxy_path(&a)?;
    let version = Command::new(&kube_proxy).arg("--version").output()?;
    let kp_version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let exe = std::fs::canonicalize(&a.podnet)?;
    let name = format!("kp{}", std::process::id() % 100_000);
    let lab = LabGuard(podnet_lab::Lab::new(&name, exe)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    eprintln!("kubeproxy-bench: lab {name} up (--kube, {} nodes)", a.nodes);
    rt.block_on(lab.0.up(&podnet_lab::UpOptions {
        nodes: a.nodes,
        backend: "vxlan".into(),
        store: None,
        resync_secs: 10,
        kube: true,
        kube_agents: true,
        dns_replicas: 1,
        daemon_exe: None,
    }))?;
    let client = rt.block_on(lab.0.kube_client())?;
    let svcs: Api<Service> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let nss: Api<Namespace> = Api::all(client.clone());
    rt.block_on(nss.create(
        &PostParams::default(),
        &Namespace {
            metadata: ObjectMeta {
                name: Some(NS.into()),
                ..Default::default()
            },
            ..Default::default()
        },
    ))?;
    let nodes = Nodes::open(&lab.0)?;
    let admin_kubeconfig = lab.0.kubeconfig()?;
    let mut b = Bench {
        lab,
        rt,
        svcs,
        nodes,
        kube_proxy,
        kp_extra: a
            .kp_min_sync_period
            .iter()
            .map(|d| format!("--iptables-min-sync-period={d}"))
            .collect(),
        admin_kubeconfig,
        active: Some(Proxy::Podnet),
    };
    b.deactivate()?;

    let mut ips: Vec<IpAddr> = Vec::new();
    let mut results: BTreeMap<(usize, Proxy), Figures> = BTreeMap::new();
    let mut sizes = a.sizes.clone();
    sizes.sort_unstable();
    let mut turn = 0usize;
    for &size in &sizes {
        // Fill with no proxy running.
        let t0 = Instant::now();
        let from = ips.len();
        let more: Vec<IpAddr> = b.rt.block_on(async {
            stream::iter(from..size)
                .map(|i| {
                    let (svcs, slices) = (b.svcs.clone(), slices.clone());
                    async move {
                        let s = svcs
                            .create(&PostParams::default(), &http_service(NS, &format!("s{i}")))
                            .await?;
                        slices
                            .create(&PostParams::default(), &one_endpoint_slice(NS, i))
                            .await?;
                        anyhow::Ok(cluster_ip(&s)?)
                    }
                })
                .buffer_unordered(a.concurrency)
                .try_collect()
                .await
        })?;
        ips.extend(more);
        eprintln!(
            "kubeproxy-bench: {size} Services with one endpoint each through the API ({:.1} s)",
            t0.elapsed().as_secs_f64()
        );
        for round in 0..a.rounds {
            let order = if round % 2 == 0 {
                [Proxy::Podnet, Proxy::KubeNft]
            } else {
                [Proxy::KubeNft, Proxy::Podnet]
            };
            for p in order {
                turn += 1;
                let t = Instant::now();
                b.activate(p)?;
                b.nodes
                    .wait_all(p.table(), &ips, t + Duration::from_secs(600))
                    .with_context(|| format!("{} cold start at {size}", p.name()))?;
                let cold = t.elapsed().as_secs_f64();
                let mut lat = Vec::with_capacity(a.creates);
                let mut made = Vec::with_capacity(a.creates);
                for k in 0..a.creates {
                    let name = format!("m{turn}-{k}");
                    let t = Instant::now();
                    let s = b.rt.block_on(
                        b.svcs
                            .create(&PostParams::default(), &http_service(NS, &name)),
                    )?;
                    made.push(name);
                    let ip = cluster_ip(&s)?;
                    while b.nodes.holding(p.table(), ip)? < a.nodes {
                        if t.elapsed() > a.timeout {
                            bail!(
                                "{}: {ip} not on every node within {:?}",
                                p.name(),
                                a.timeout
                            );
                        }
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                let use_ = b.deactivate()?;
                // Back to `size` Services, with no proxy running.
                b.rt.block_on(async {
                    stream::iter(made)
                        .map(|n| {
                            let svcs = b.svcs.clone();
                            async move {
                                svcs.delete(&n, &DeleteParams::default()).await?;
                                anyhow::Ok(())
                            }
                        })
                        .buffer_unordered(a.concurrency)
                        .try_collect::<Vec<()>>()
                        .await
                })?;
                let f = results.entry((size, p)).or_default();
                let cpu: f64 = use_.iter().map(|u| u.0).sum();
                let rss = use_.iter().map(|u| u.1).fold(0.0, f64::max);
                eprintln!(
                    "kubeproxy-bench: {size} Services, round {}, {}: cold start {cold:.2} s, programming p50 {:.1} ms p99 {:.1} ms, CPU {cpu:.1} s (all nodes), peak RSS {rss:.0} MiB",
                    round + 1,
                    p.name(),
                    pct(&lat, 0.5),
                    pct(&lat, 0.99)
                );
                f.turn_p50.push(pct(&lat, 0.5));
                f.prog.extend(lat);
                f.cold.push(cold);
                f.cpu.push(cpu);
                f.rss.push(rss);
            }
        }
    }

    println!(
        "kubeproxy-bench: {} nodes, {} rounds per size, {} creates per turn, podnet {} against {kp_version} (--proxy-mode=nftables, --iptables-min-sync-period {})",
        a.nodes,
        a.rounds,
        a.creates,
        env!("CARGO_PKG_VERSION"),
        a.kp_min_sync_period.as_deref().unwrap_or("1s (default)")
    );
    let med = |v: &[f64]| if v.is_empty() { f64::NAN } else { pct(v, 0.5) };
    for &size in &sizes {
        for p in [Proxy::Podnet, Proxy::KubeNft] {
            let Some(f) = results.get(&(size, p)) else {
                continue;
            };
            println!(
                "{size:>6} Services  {:<20} programming p50 {:>8.1} ms  p99 {:>8.1} ms  (n={}, turn medians {:?})  cold start {:.2} s (median of {})  CPU {:.1} s per turn ({:.1} s over all its turns, all nodes)  peak RSS {:.0} MiB",
                p.name(),
                pct(&f.prog, 0.5),
                pct(&f.prog, 0.99),
                f.prog.len(),
                f.turn_p50.iter().map(|x| (x * 10.0).round() / 10.0).collect::<Vec<_>>(),
                med(&f.cold),
                f.cold.len(),
                med(&f.cpu),
                f.cpu.iter().sum::<f64>(),
                med(&f.rss),
            );
        }
        if let (Some(pn), Some(kp)) = (
            results.get(&(size, Proxy::Podnet)),
            results.get(&(size, Proxy::KubeNft)),
        ) {
            println!(
                "{size:>6} Services  podnet / kube-proxy nftables: programming p50 {:.3}x  p99 {:.3}x  cold start {:.3}x  CPU {:.2}x  RSS {:.2}x",
                pct(&pn.prog, 0.5) / pct(&kp.prog, 0.5),
                pct(&pn.prog, 0.99) / pct(&kp.prog, 0.99),
                med(&pn.cold) / med(&kp.cold),
                med(&pn.cpu) / med(&kp.cpu),
                med(&pn.rss) / med(&kp.rss),
            );
        }
    }
    if let Some(&big) = sizes.last() {
        if let (Some(pn), Some(kp)) = (
            results.get(&(big, Proxy::Podnet)),
            results.get(&(big, Proxy::KubeNft)),
        ) {
            let r = pct(&pn.prog, 0.99) / pct(&kp.prog, 0.99);
            println!(
                "target: programming p99 <= 0.1x kube-proxy nftables at {big} Services: {:.3}x, {}",
                r,
                if r <= 0.1 { "met" } else { "MISSED" }
            );
        }
    }
    Ok(())
}
