//! podnet's service proxy against the real kube-proxy, in the same run
//! (issue 16's proxy benchmark).
//!
//! One 3-node `podnet lab up --kube` (real etcd, kube-apiserver and
//! kube-controller-manager). The proxies take turns on it: either every
//! node's `podnet agent` runs its own proxy, or the agents run with
//! `--no-proxy` and every node runs kube-proxy (built from
//! k8s.io/kubernetes at the apiserver's version by `scripts/k8s-peers.sh
//! kube-proxy`) in `--proxy-mode=nftables` or `--proxy-mode=iptables`,
//! inside the node's network namespace, with the lab's admin kubeconfig
//! (the lab forwards the apiserver's address into each node namespace),
//! with its default settings (in particular its 1 s minimum sync period;
//! `--kp-min-sync-period` adds a row with another one). Between turns the
//! outgoing proxy is stopped and its rules are deleted, so each turn starts
//! cold.
//!
//! The proxies are observed from outside, by the kernel's state of each
//! node, never by their own metrics:
//! - nftables (podnet's `ip podnet`, kube-proxy's `ip kube-proxy`): both
//!   tables have a set `cluster-ips` that holds every Service's ClusterIP
//!   once it is programmed, and a verdict map `no-endpoint-services`
//!   (`ip . proto . port`) that holds a Service port while it has no ready
//!   endpoint; the bench asks each node for the one element over netlink
//!   (an exact lookup, no dump);
//! - iptables (kube-proxy's `iptables` mode, through the host's
//!   `iptables`, nf_tables-backed here): a Service port with no ready
//!   endpoint has a REJECT rule `-d <ClusterIP>/32` in the `filter` table's
//!   chain `KUBE-SERVICES` (a small chain: only such Services), read with
//!   `iptables -t filter -S KUBE-SERVICES` in the node namespace; a Service
//!   with endpoints has a rule `-d <ClusterIP>/32` in the `nat` table's
//!   `KUBE-SERVICES`, read with `iptables -t nat -S KUBE-SERVICES`. Each
//!   read is a process, so these polls are coarser (see the README).
//!
//! Per size (`--sizes`, Services with one ready endpoint each) and per turn
//! it measures:
//! - **cold start**: from starting the proxies until every node holds every
//!   ClusterIP (no rules left over);
//! - **network programming latency**: `--creates` Services created one at a
//!   time through the API, each from the moment its POST is sent until its
//!   ClusterIP is on every node (the upstream SLI); measured Services get no
//!   endpoints and are deleted after the turn, so every turn starts from the
//!   same set;
//! - **endpoint change**: `--endpoint-changes` of the filled Services, one
//!   at a time, get their only endpoint marked not ready (an EndpointSlice
//!   update), timed until every node rejects the Service, then ready again,
//!   timed until no node does (both directions are samples);
//! - **new connections per second** through a ClusterIP: a client pod on
//!   node 1 opens short TCP connections (handshake, then reset) to a
//!   Service whose one endpoint is a pod on node 2, in `--conn-pairs` pairs
//!   of `--conn-secs` slices alternating with the same straight to the
//!   pod's IP, the client and server threads alone on one pinned CPU
//!   (`podnet_bench::connrate`); per round it prints podnet's rate over
//!   kube-proxy's, raw and as shares of the direct path, with the spread;
//! - **restart**: every node's proxy process (podnet: the agent, whose
//!   proxy it is; kube-proxy) stopped with SIGTERM, its rules deleted (as
//!   after a reboot), started again with the same command line; from the
//!   start until every node holds every ClusterIP again;
//! - **CPU seconds and peak RSS** of each node's proxy process over the
//!   turn up to the restart (for podnet that is the whole agent: overlay
//!   and policy included).
//!
//! It prints p50/p99 per proxy and size and podnet's ratios to each
//! kube-proxy. The lab (and every process it or the bench started) is
//! removed at the end, also on error.

use podnet_bench::connrate::{self, median, spread_pct, Paired};
use podnet_bench::LabGuard;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use futures::stream::{self, StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use podnet_api::k8s_openapi::api::core::v1::{Namespace, Service, ServicePort};
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use podnet_api::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use podnet_bench::objects::{cluster_ip, http_service, one_endpoint_slice};
use podnet_kernel::Netns;
use podnet_lab::serve::PortSpec;
use podnet_nft::model::{Family, Proto, Value};
use podnet_nft::netlink::Conn;
use tokio::runtime::Runtime;

#[derive(Parser)]
#[command(about = "podnet's service proxy against kube-proxy (nftables, iptables) in one kube lab")]
struct Args {
    /// Services present during each size's turns.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    sizes: Vec<usize>,
    /// Turns of each proxy per size (the order rotates per round).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Services created one at a time and measured per turn.
    #[arg(long, default_value_t = 100)]
    creates: usize,
    /// Endpoint changes measured per turn (each: one endpoint not ready,
    /// then ready again; two samples).
    #[arg(long, default_value_t = 20)]
    endpoint_changes: usize,
    /// Seconds of each slice of new connections (0: skip the connection
    /// rate). A turn has `--conn-pairs` pairs of slices, one through the
    /// ClusterIP and one straight to the endpoint pod, alternating.
    #[arg(long, default_value_t = 2.0)]
    conn_secs: f64,
    /// Pairs of connection-rate slices per turn.
    #[arg(long, default_value_t = 5)]
    conn_pairs: usize,
    /// The contenders: podnet, nft (kube-proxy nftables), ipt (kube-proxy
    /// iptables), and nft-min (kube-proxy nftables with
    /// `--kp-min-sync-period`, added by default when that is given).
    #[arg(long, value_delimiter = ',')]
    proxies: Vec<String>,
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
    /// The minimum sync period of the `nft-min` row: kube-proxy's
    /// `--iptables-min-sync-period`, which in v1.37 sets the one
    /// `minSyncPeriod` of the iptables and nftables modes alike
    /// (cmd/kube-proxy/app/options.go, processV1Alpha1Flags; there is no
    /// nftables flag); its default is 1s.
    #[arg(long)]
    kp_min_sync_period: Option<String>,
}

const NS: &str = "kpb";
/// kube-proxy's metrics and healthz inside a node namespace (the agent
/// keeps 127.0.0.1:10249).
const KP_METRICS: &str = "127.0.0.1:10349";
const KP_HEALTHZ: &str = "127.0.0.1:10356";
/// The connection-rate Service and its pods.
const ECHO: &str = "echo";
/// The echo pod's accept loop, behind the Service's port 81.
const FAST_PORT: u16 = 9090;
const CLIENT: &str = "client";
const ECHO_PORT: u16 = 8080;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Proxy {
    Podnet,
    KubeNft,
    KubeIpt,
    /// kube-proxy nftables with `--kp-min-sync-period`.
    KubeNftMin,
}

impl Proxy {
    fn parse(s: &str) -> Result<Proxy> {
        Ok(match s {
            "podnet" => Proxy::Podnet,
            "nft" => Proxy::KubeNft,
            "ipt" => Proxy::KubeIpt,
            "nft-min" => Proxy::KubeNftMin,
            _ => bail!("unknown proxy {s:?} (podnet, nft, ipt, nft-min)"),
        })
    }
    fn name(self) -> &'static str {
        match self {
            Proxy::Podnet => "podnet",
            Proxy::KubeNft => "kube-proxy nftables",
            Proxy::KubeIpt => "kube-proxy iptables",
            Proxy::KubeNftMin => "kube-proxy nft min",
        }
    }
    /// The nftables table that has `cluster-ips` (None: iptables).
    fn table(self) -> Option<&'static str> {
        match self {
            Proxy::Podnet => Some("podnet"),
            Proxy::KubeNft | Proxy::KubeNftMin => Some("kube-proxy"),
            Proxy::KubeIpt => None,
        }
    }
    /// The pid file (under the lab's `pids/`) of the process on `node`.
    fn role(self, node: &str) -> String {
        match self {
            Proxy::Podnet => format!("agent-{node}"),
            _ => format!("kube-proxy-{node}"),
        }
    }
}

/// What the bench asks of a node: whether a Service is programmed, or
/// rejected for lack of endpoints.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    /// The ClusterIP is programmed (nftables: `cluster-ips`; iptables: a
    /// rule for it in `KUBE-SERVICES`, `nat` for a Service with endpoints,
    /// `filter` for one without).
    Programmed { endpoints: bool },
    /// Port 80/TCP of the ClusterIP is rejected for lack of endpoints.
    Rejected,
}

/// One netlink connection per node, opened inside its namespace.
struct Nodes(Vec<(String, String, Conn)>);

/// The destination addresses of the rules of `table`'s chain
/// `KUBE-SERVICES` in namespace `netns`, as `iptables -S` prints them.
fn ipt_dests(netns: &str, table: &str) -> Result<BTreeSet<IpAddr>> {
    let out = Netns::named(netns)?
        .run(|| {
            Command::new("iptables")
                .args(["-w", "-t", table, "-S", "KUBE-SERVICES"])
                .stderr(Stdio::null())
                .output()
        })?
        .context("running iptables")?;
    // No chain yet: iptables fails; that is "nothing programmed".
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            w.by_ref().find(|t| *t == "-d")?;
            w.next()?.trim_end_matches("/32").parse().ok()
        })
        .collect())
}

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

    /// How many nodes pass `check` for `ip` under proxy `p`.
    fn count(&mut self, p: Proxy, check: Check, ip: IpAddr) -> Result<usize> {
        let mut n = 0;
        for (name, netns, c) in &mut self.0 {
            let yes = match (p.table(), check) {
                (Some(t), Check::Programmed { .. }) => {
                    c.has_element(Family::Ip, t, "cluster-ips", &[Value::Addr(ip)])
                }
                (Some(t), Check::Rejected) => c.has_element(
                    Family::Ip,
                    t,
                    "no-endpoint-services",
                    &[Value::Addr(ip), Value::Proto(Proto::Tcp), Value::Port(80)],
                ),
                (None, Check::Programmed { endpoints: true }) => {
                    Ok(ipt_dests(netns, "nat")?.contains(&ip))
                }
                (None, _) => Ok(ipt_dests(netns, "filter")?.contains(&ip)),
            }
            .with_context(|| format!("reading {name}'s rules"))?;
            n += usize::from(yes);
        }
        Ok(n)
    }

    /// Polls until `want` nodes pass `check` for `ip` (all nodes, or 0 to
    /// wait for none); the time since `t`, in ms. A netlink lookup is
    /// cheap and polled every millisecond; an iptables read is a process,
    /// polled back to back.
    fn wait(
        &mut self,
        p: Proxy,
        check: Check,
        ip: IpAddr,
        all: bool,
        t: Instant,
        timeout: Duration,
    ) -> Result<f64> {
        let want = if all { self.0.len() } else { 0 };
        while self.count(p, check, ip)? != want {
            if t.elapsed() > timeout {
                bail!(
                    "{}: {ip} not in the expected state on every node within {timeout:?}",
                    p.name()
                );
            }
            if p.table().is_some() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(t.elapsed().as_secs_f64() * 1000.0)
    }

    /// Waits until every node holds every one of `ips` (Services with
    /// endpoints); fails at once when `alive` does (a proxy that exited).
    fn wait_all(
        &mut self,
        p: Proxy,
        ips: &[IpAddr],
        deadline: Instant,
        alive: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let mut pending: Vec<BTreeSet<IpAddr>> = self
            .0
            .iter()
            .map(|_| ips.iter().copied().collect())
            .collect();
        loop {
            for ((name, netns, c), pend) in self.0.iter_mut().zip(pending.iter_mut()) {
                match p.table() {
                    Some(t) => {
                        let mut err = None;
                        pend.retain(|ip| {
                            match c.has_element(Family::Ip, t, "cluster-ips", &[Value::Addr(*ip)]) {
                                Ok(h) => !h,
                                Err(e) => {
                                    err = Some(e);
                                    true
                                }
                            }
                        });
                        if let Some(e) = err {
                            return Err(
                                anyhow::Error::from(e).context(format!("reading {name}'s {t}"))
                            );
                        }
                    }
                    None if !pend.is_empty() => {
                        let have = ipt_dests(netns, "nat")?;
                        pend.retain(|ip| !have.contains(ip));
                    }
                    None => {}
                }
            }
            let left: usize = pending.iter().map(BTreeSet::len).sum();
            if left == 0 {
                return Ok(());
            }
            alive()?;
            if Instant::now() > deadline {
                bail!("{}: {left} ClusterIPs still missing on some node", p.name());
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

/// Fails when `p`'s process on one of `nodes` is gone (it exited: a bad
/// flag, a crash), with the end of its log, instead of waiting out a
/// deadline.
fn alive(lab: &podnet_lab::Lab, p: Proxy, nodes: &[String]) -> Result<()> {
    for node in nodes {
        let role = p.role(node);
        let running = read_pid(lab, &role).is_some_and(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| {
                    !s.rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z')
                })
                .unwrap_or(false)
        });
        if !running {
            let log = std::fs::read_to_string(lab.log_path(&role)).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(10).collect();
            bail!(
                "{} on {node} is not running; the end of its log:\n{}",
                p.name(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
    Ok(())
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
    slices: Api<EndpointSlice>,
    nodes: Nodes,
    kube_proxy: PathBuf,
    min_sync: Option<String>,
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

    /// Each node's (CPU seconds, peak RSS MiB) of `p`'s process.
    fn usage(&self, p: Proxy) -> Vec<(f64, f64)> {
        self.node_names()
            .iter()
            .filter_map(|(node, _)| read_pid(&self.lab.0, &p.role(node)).and_then(usage))
            .collect()
    }

    /// Stops `p`'s process on every node (SIGTERM) and deletes its rules.
    fn stop(&mut self, p: Proxy) -> Result<()> {
        for (node, netns) in self.node_names() {
            match p {
                Proxy::Podnet => {
                    self.lab.0.stop_agent(&node, false)?;
                }
                _ => {
                    if let Some(pid) = read_pid(&self.lab.0, &p.role(&node)) {
                        stop(pid);
                    }
                    let _ = std::fs::remove_file(self.lab.0.dir.join("pids").join(p.role(&node)));
                }
            }
            if p == Proxy::KubeIpt {
                // kube-proxy's own way to remove its rules, every mode's.
                let out = Netns::named(&netns)?
                    .run(|| Command::new(&self.kube_proxy).arg("--cleanup").output())?
                    .context("kube-proxy --cleanup")?;
                if !out.status.success() {
                    bail!(
                        "kube-proxy --cleanup on {node}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
        }
        if let Some(t) = p.table() {
            self.nodes.delete_tables(t)?;
        }
        Ok(())
    }

    /// Starts `p`'s process on every node (for podnet: its agent, with
    /// the proxy on, as the lab starts it).
    fn start(&mut self, p: Proxy) -> Result<()> {
        for (node, netns) in self.node_names() {
            match p {
                Proxy::Podnet => self.lab.0.restart_agent(&node)?,
                _ => {
                    let mut cmd = Command::new(&self.kube_proxy);
                    cmd.args([
                        format!("--kubeconfig={}", self.admin_kubeconfig.display()),
                        format!("--hostname-override={node}"),
                        format!(
                            "--proxy-mode={}",
                            if p == Proxy::KubeIpt {
                                "iptables"
                            } else {
                                "nftables"
                            }
                        ),
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
                    if p == Proxy::KubeNftMin {
                        if let Some(m) = &self.min_sync {
                            cmd.arg(format!("--iptables-min-sync-period={m}"));
                        }
                    }
                    spawn_in(&self.lab.0, &p.role(&node), &netns, &mut cmd)?;
                }
            }
        }
        Ok(())
    }

    /// Stops the active proxy, deletes its rules; the agents go on
    /// without a proxy.
    fn deactivate(&mut self) -> Result<()> {
        let Some(p) = self.active.take() else {
            return Ok(());
        };
        match p {
            Proxy::Podnet => {
                self.agents_without_proxy()?;
                self.nodes.delete_tables("podnet")?;
            }
            _ => self.stop(p)?,
        }
        Ok(())
    }

    /// Starts `p` on every node (nothing else runs a proxy).
    fn activate(&mut self, p: Proxy) -> Result<()> {
        assert!(self.active.is_none());
        self.start(p)?;
        self.active = Some(p);
        Ok(())
    }

    /// Marks the one endpoint of filled Service `s<i>` ready or not.
    fn set_ready(&self, i: usize, ready: bool) -> Result<()> {
        let mut s = one_endpoint_slice(NS, i);
        for e in s.endpoints.iter_mut().flatten() {
            e.conditions.get_or_insert_with(Default::default).ready = Some(ready);
        }
        let patch = serde_json::json!({ "endpoints": s.endpoints });
        self.rt.block_on(self.slices.patch(
            &format!("s{i}-1"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        ))?;
        Ok(())
    }
}

#[derive(Default)]
struct Figures {
    prog: Vec<f64>,
    /// The same creates from the POST's answer on (the proxy's share,
    /// without the API's ClusterIP allocation and write).
    after: Vec<f64>,
    /// Per turn: the median programming latency.
    turn_p50: Vec<f64>,
    /// Endpoint changes (both directions), ms.
    epc: Vec<f64>,
    cold: Vec<f64>,
    restart: Vec<f64>,
    /// New connections per second through a ClusterIP, per turn (the
    /// median of its slices).
    conn: Vec<f64>,
    /// Per turn: the same straight to the endpoint pod.
    direct: Vec<f64>,
    /// Per turn: ClusterIP / direct (the median over its pairs).
    conn_share: Vec<f64>,
    /// Per turn: CPU seconds summed over nodes, the largest peak RSS.
    cpu: Vec<f64>,
    rss: Vec<f64>,
}

/// The connection rate per round, podnet over `kp` (both turns of a round
/// ran back to back), raw and as each turn's ClusterIP/direct share, with
/// the median and the spread across rounds.
fn conn_ratios(size: usize, kp: Proxy, pn: &Figures, k: &Figures) {
    if pn.conn.is_empty() || k.conn.is_empty() {
        return;
    }
    let raw: Vec<f64> = pn.conn.iter().zip(&k.conn).map(|(a, b)| a / b).collect();
    let share: Vec<f64> = pn
        .conn_share
        .iter()
        .zip(&k.conn_share)
        .map(|(a, b)| a / b)
        .collect();
    let r3 = |v: &[f64]| {
        v.iter()
            .map(|x| (x * 1000.0).round() / 1000.0)
            .collect::<Vec<_>>()
    };
    println!(
        "{size:>6} Services  podnet / {}: conn/s per round {:?}, median {:.3}x ±{:.1}%; as shares of the direct path per round {:?}, median {:.3}x ±{:.1}% (podnet keeps {:.3} of direct, {} {:.3})",
        kp.name(),
        r3(&raw),
        median(&raw),
        spread_pct(&raw),
        r3(&share),
        median(&share),
        spread_pct(&share),
        median(&pn.conn_share),
        kp.name(),
        median(&k.conn_share),
    );
}

fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn med(v: &[f64]) -> f64 {
    pct(v, 0.5)
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

/// The connection-rate setup: a pod on the second node serving TCP
/// `ECHO_PORT` (the lab's server, which says who it is) and
/// `FAST_PORT` (an accept loop of the bench's own, for the rate), behind
/// Service `echo` (ports 80 and 81), and a client pod on the first node.
/// Returns the client's namespace, the Service's address (port 80), the
/// endpoint's direct address (`FAST_PORT`) and the accept thread's id.
fn echo_setup(b: &Bench) -> Result<Echo> {
    let st = b.lab.0.state()?;
    let first = st.nodes[0].name.clone();
    let second = st.nodes[1 % st.nodes.len()].name.clone();
    let labels: BTreeMap<String, String> = [("app".to_string(), ECHO.to_string())].into();
    let echo = b.rt.block_on(b.lab.0.run_pod(
        NS,
        ECHO,
        Some(&second),
        labels.clone().into(),
        &[PortSpec::tcp(ECHO_PORT)],
    ))?;
    let server_tid = podnet_bench::connrate::accept_thread(&echo.netns, FAST_PORT)?;
    let direct = SocketAddr::new(echo.ip.parse()?, FAST_PORT);
    let client =
        b.rt.block_on(
            b.lab
                .0
                .run_pod(NS, CLIENT, Some(&first), Default::default(), &[]),
        )?;
    let mut svc = http_service(NS, ECHO);
    if let Some(spec) = svc.spec.as_mut() {
        spec.selector = Some(labels);
        spec.ports = Some(vec![
            ServicePort {
                name: Some("http".into()),
                port: 80,
                target_port: Some(IntOrString::Int(ECHO_PORT.into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            },
            ServicePort {
                name: Some("fast".into()),
                port: 81,
                target_port: Some(IntOrString::Int(FAST_PORT.into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            },
        ]);
    }
    let s = b.rt.block_on(b.svcs.create(&PostParams::default(), &svc))?;
    Ok(Echo {
        client: client.netns,
        service: SocketAddr::new(cluster_ip(&s)?, 80),
        direct,
        server_tid,
    })
}

/// What the connection-rate turns use (see [`echo_setup`]).
struct Echo {
    client: String,
    service: SocketAddr,
    direct: SocketAddr,
    server_tid: i32,
}

/// New connections per second from the client to the Service's second
/// port (the accept loop) and straight to the endpoint, in alternating
/// slices on a pinned CPU (see `podnet_bench::connrate`), once a first
/// connection to the Service gets an answer (it is routed).
fn conn_rate(e: &Echo, pairs: usize, secs: f64) -> Result<Paired> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = Netns::named(&e.client)?
            .run(|| podnet_lab::serve::reach(e.service, false, Duration::from_secs(1)))?;
        if matches!(r, podnet_lab::Reach::Connected(_)) {
            break;
        }
        if Instant::now() > deadline {
            bail!("{} from pod {CLIENT}: {r:?} for 60 s", e.service);
        }
    }
    let fast = SocketAddr::new(e.service.ip(), 81);
    connrate::paired(&e.client, fast, e.direct, &[e.server_tid], pairs, secs)
}

/// The contenders, in turn order: `--proxies`, or podnet and both
/// kube-proxy modes (and nft-min when `--kp-min-sync-period` is given).
fn choose_proxies(a: &Args) -> Result<Vec<Proxy>> {
    let mut proxies: Vec<Proxy> = if a.proxies.is_empty() {
        let mut v = vec![Proxy::Podnet, Proxy::KubeNft, Proxy::KubeIpt];
        if a.kp_min_sync_period.is_some() {
            v.push(Proxy::KubeNftMin);
        }
        v
    } else {
        a.proxies
            .iter()
            .map(|s| Proxy::parse(s))
            .collect::<Result<_>>()?
    };
    proxies.dedup();
    if proxies.contains(&Proxy::KubeNftMin) && a.kp_min_sync_period.is_none() {
        bail!("nft-min needs --kp-min-sync-period");
    }
    Ok(proxies)
}

/// Brings the kube lab up (podnet's agents proxying, as the lab starts
/// them), makes the bench's namespace and opens every node's netlink
/// connection: everything the turns share.
fn open_bench(a: &Args, kube_proxy: PathBuf) -> Result<Bench> {
    let exe = std::fs::canonicalize(&a.podnet)?;
    let name = format!("kp{}", std::process::id() % 100_000);
    let lab = LabGuard(podnet_lab::Lab::new(&name, exe)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    eprintln!("kubeproxy-bench: lab {name} up (--kube, {} nodes)", a.nodes);
    rt.block_on(lab.0.up(&podnet_lab::UpOptions {
        kube: true,
        ..podnet_lab::UpOptions::new(a.nodes, "vxlan")
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
    Ok(Bench {
        lab,
        rt,
        svcs,
        slices,
        nodes,
        kube_proxy,
        min_sync: a.kp_min_sync_period.clone(),
        admin_kubeconfig,
        active: Some(Proxy::Podnet),
    })
}

/// Grows the filled Services (each with one ready endpoint) from those
/// already there up to `size`, with no proxy running; `ips` keeps their
/// ClusterIPs by index. Returns every filled ClusterIP.
fn fill(
    a: &Args,
    b: &Bench,
    ips: &mut BTreeMap<usize, IpAddr>,
    size: usize,
) -> Result<Vec<IpAddr>> {
    let t0 = Instant::now();
    let from = ips.len();
    let more: Vec<(usize, IpAddr)> = b.rt.block_on(async {
        stream::iter(from..size)
            .map(|i| {
                let (svcs, slices) = (b.svcs.clone(), b.slices.clone());
                async move {
                    let s = svcs
                        .create(&PostParams::default(), &http_service(NS, &format!("s{i}")))
                        .await?;
                    slices
                        .create(&PostParams::default(), &one_endpoint_slice(NS, i))
                        .await?;
                    anyhow::Ok((i, cluster_ip(&s)?))
                }
            })
            .buffer_unordered(a.concurrency)
            .try_collect()
            .await
    })?;
    ips.extend(more);
    let all_ips: Vec<IpAddr> = ips.values().copied().collect();
    eprintln!(
        "kubeproxy-bench: {size} Services with one endpoint each through the API ({:.1} s)",
        t0.elapsed().as_secs_f64()
    );
    Ok(all_ips)
}

/// The filled Services one size's turns run against.
struct Filled<'a> {
    size: usize,
    /// ClusterIPs by index.
    ips: &'a BTreeMap<usize, IpAddr>,
    /// Every one of them.
    all: Vec<IpAddr>,
}

/// What one proxy's turn measured (see the module doc).
struct Turn {
    cold: f64,
    /// Programming latency of each create, ms.
    lat: Vec<f64>,
    /// Each create's POST, ms.
    post: Vec<f64>,
    /// Endpoint changes, ms.
    epc: Vec<f64>,
    conn: Option<Paired>,
    /// Each node's (CPU seconds, peak RSS MiB) before the restart.
    use_: Vec<(f64, f64)>,
    restart: f64,
}

/// Waits from `t` until every node holds every filled ClusterIP under
/// `p` (cold start, restart), failing early if `p` exited on a node; the
/// seconds since `t`.
fn wait_filled(
    b: &mut Bench,
    p: Proxy,
    filled: &Filled,
    names: &[String],
    t: Instant,
    what: &str,
) -> Result<f64> {
    let size = filled.size;
    let lab = &b.lab.0;
    b.nodes
        .wait_all(p, &filled.all, t + Duration::from_secs(600), &|| {
            alive(lab, p, names)
        })
        .with_context(|| format!("{} {what} at {size}", p.name()))?;
    Ok(t.elapsed().as_secs_f64())
}

/// The programming latency samples: `--creates` Services without
/// endpoints, one at a time, each timed from its POST until every node
/// has its ClusterIP. Returns the latencies, the Services' names (to
/// delete after the turn) and the POSTs' own times.
fn measure_creates(
    a: &Args,
    b: &mut Bench,
    p: Proxy,
    turn: usize,
) -> Result<(Vec<f64>, Vec<String>, Vec<f64>)> {
    let mut lat = Vec::with_capacity(a.creates);
    let mut made = Vec::with_capacity(a.creates);
    let mut post = Vec::with_capacity(a.creates);
    let mut sent_at = Vec::with_capacity(a.creates);
    for k in 0..a.creates {
        let name = format!("m{turn}-{k}");
        sent_at.push(podnet_store::objects::now());
        let t = Instant::now();
        let s = b.rt.block_on(
            b.svcs
                .create(&PostParams::default(), &http_service(NS, &name)),
        )?;
        made.push(name);
        post.push(t.elapsed().as_secs_f64() * 1000.0);
        let ip = cluster_ip(&s)?;
        lat.push(b.nodes.wait(
            p,
            Check::Programmed { endpoints: false },
            ip,
            true,
            t,
            a.timeout,
        )?);
    }
    if std::env::var_os("KPB_SLOW").is_some() {
        // Which creates were slow, in order (finding the cause).
        let m = pct(&lat, 0.5);
        let slow: Vec<(usize, u64, String)> = lat
            .iter()
            .enumerate()
            .filter(|(_, &l)| l > 3.0 * m)
            .map(|(k, &l)| (k, l as u64, sent_at[k].to_string()))
            .collect();
        eprintln!(
            "kubeproxy-bench: {}: slow creates (index, ms, POST sent at): {slow:?}; POST p50 {:.1} ms max {:.1} ms",
            p.name(),
            pct(&post, 0.5),
            pct(&post, 1.0)
        );
    }
    Ok((lat, made, post))
}

/// The endpoint change samples: `--endpoint-changes` filled Services,
/// spread over the size, each made not ready and then ready again, each
/// direction timed until every node (no node) rejects it.
fn measure_endpoint_changes(
    a: &Args,
    b: &mut Bench,
    p: Proxy,
    filled: &Filled,
) -> Result<Vec<f64>> {
    let size = filled.size;
    let mut epc = Vec::with_capacity(2 * a.endpoint_changes);
    for k in 0..a.endpoint_changes {
        let i = k * size / a.endpoint_changes.max(1);
        let ip = filled.ips[&i];
        for ready in [false, true] {
            let t = Instant::now();
            b.set_ready(i, ready)?;
            epc.push(b.nodes.wait(p, Check::Rejected, ip, !ready, t, a.timeout)?);
        }
    }
    Ok(epc)
}

/// Deletes the turn's measured Services, so the next turn starts from the
/// `size` filled ones.
fn delete_services(a: &Args, b: &Bench, made: Vec<String>) -> Result<()> {
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
    Ok(())
}

/// One proxy's turn at one size: start it cold, measure creates, endpoint
/// changes and the connection rate, restart it, then stop it and remove
/// the turn's Services again.
fn run_turn(
    a: &Args,
    b: &mut Bench,
    echo: Option<&Echo>,
    filled: &Filled,
    p: Proxy,
    turn: usize,
) -> Result<Turn> {
    let t = Instant::now();
    b.activate(p)?;
    let names: Vec<String> = b.node_names().into_iter().map(|n| n.0).collect();
    let cold = wait_filled(b, p, filled, &names, t, "cold start")?;
    let (lat, made, post) = measure_creates(a, b, p, turn)?;
    let epc = measure_endpoint_changes(a, b, p, filled)?;
    let conn = match echo {
        Some(e) => Some(conn_rate(e, a.conn_pairs, a.conn_secs)?),
        None => None,
    };
    let use_ = b.usage(p);
    b.stop(p)?;
    let t = Instant::now();
    b.start(p)?;
    let restart = wait_filled(b, p, filled, &names, t, "restart")?;
    b.deactivate()?;
    // Back to `size` Services, with no proxy running.
    delete_services(a, b, made)?;
    Ok(Turn {
        cold,
        lat,
        post,
        epc,
        conn,
        use_,
        restart,
    })
}

/// Prints a finished turn's summary (progress on stderr) and adds its
/// samples to its size and proxy's figures.
fn record(f: &mut Figures, size: usize, round: usize, p: Proxy, r: Turn) {
    let Turn {
        cold,
        lat,
        post,
        epc,
        conn,
        use_,
        restart,
    } = r;
    let cpu: f64 = use_.iter().map(|u| u.0).sum();
    let rss = use_.iter().map(|u| u.1).fold(0.0, f64::max);
    eprintln!(
        "kubeproxy-bench: {size} Services, round {}, {}: cold start {cold:.2} s, programming p50 {:.1} ms p99 {:.1} ms max {:.1} ms, endpoint change p50 {:.1} ms p99 {:.1} ms, {:.0} conn/s, restart {restart:.2} s, CPU {cpu:.1} s (all nodes), peak RSS {rss:.0} MiB",
        round + 1,
        p.name(),
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        pct(&lat, 1.0),
        pct(&epc, 0.5),
        pct(&epc, 0.99),
        conn.as_ref().map_or(f64::NAN, Paired::service_rate),
    );
    if let Some(c) = &conn {
        eprintln!(
            "kubeproxy-bench: {size} Services, round {}, {}: conn/s per slice through the ClusterIP {:?}, direct {:?}; ClusterIP/direct {:.3}",
            round + 1,
            p.name(),
            c.service.iter().map(|x| x.round()).collect::<Vec<_>>(),
            c.direct.iter().map(|x| x.round()).collect::<Vec<_>>(),
            c.ratio(),
        );
    }
    f.after
        .extend(lat.iter().zip(&post).map(|(l, p)| (l - p).max(0.0)));
    f.turn_p50.push(pct(&lat, 0.5));
    f.prog.extend(lat);
    f.epc.extend(epc);
    f.cold.push(cold);
    f.restart.push(restart);
    if let Some(c) = conn {
        f.conn.push(c.service_rate());
        f.direct.push(c.direct_rate());
        f.conn_share.push(c.ratio());
    }
    f.cpu.push(cpu);
    f.rss.push(rss);
}

/// The final table: per size and proxy the medians and percentiles over
/// its turns, podnet's ratios to each kube-proxy, and the target's verdict.
fn print_results(
    a: &Args,
    kp_version: &str,
    sizes: &[usize],
    proxies: &[Proxy],
    results: &BTreeMap<(usize, Proxy), Figures>,
) {
    println!(
        "kubeproxy-bench: {} nodes, {} rounds per size, {} creates and {} endpoint changes per turn, podnet {} against {kp_version} (defaults: min sync period 1s{})",
        a.nodes,
        a.rounds,
        a.creates,
        a.endpoint_changes,
        env!("CARGO_PKG_VERSION"),
        a.kp_min_sync_period
            .as_deref()
            .map(|m| format!("; nft min: --iptables-min-sync-period={m}"))
            .unwrap_or_default()
    );
    for &size in sizes {
        for &p in proxies {
            let Some(f) = results.get(&(size, p)) else {
                continue;
            };
            println!(
                "{size:>6} Services  {:<20} programming p50 {:>8.1} ms  p99 {:>8.1} ms  (n={}, turn medians {:?}; after the POST's answer p50 {:.1} ms p99 {:.1} ms)  endpoint change p50 {:.1} ms p99 {:.1} ms (n={})  cold start {:.2} s  restart {:.2} s  {:.0} conn/s  CPU {:.1} s per turn  peak RSS {:.0} MiB  (medians of {} turns)",
                p.name(),
                pct(&f.prog, 0.5),
                pct(&f.prog, 0.99),
                f.prog.len(),
                f.turn_p50.iter().map(|x| (x * 10.0).round() / 10.0).collect::<Vec<_>>(),
                pct(&f.after, 0.5),
                pct(&f.after, 0.99),
                pct(&f.epc, 0.5),
                pct(&f.epc, 0.99),
                f.epc.len(),
                med(&f.cold),
                med(&f.restart),
                med(&f.conn),
                med(&f.cpu),
                med(&f.rss),
                f.cold.len(),
            );
        }
        let Some(pn) = results.get(&(size, Proxy::Podnet)) else {
            continue;
        };
        for &kp in proxies {
            let Some(k) = results.get(&(size, kp)).filter(|_| kp != Proxy::Podnet) else {
                continue;
            };
            println!(
                "{size:>6} Services  podnet / {}: programming p50 {:.3}x  p99 {:.3}x  (after the POST's answer p50 {:.3}x p99 {:.3}x)  endpoint change p50 {:.3}x p99 {:.3}x  cold start {:.2}x  restart {:.2}x  conn/s {:.2}x  CPU {:.2}x  RSS {:.2}x",
                kp.name(),
                pct(&pn.prog, 0.5) / pct(&k.prog, 0.5),
                pct(&pn.prog, 0.99) / pct(&k.prog, 0.99),
                pct(&pn.after, 0.5) / pct(&k.after, 0.5),
                pct(&pn.after, 0.99) / pct(&k.after, 0.99),
                pct(&pn.epc, 0.5) / pct(&k.epc, 0.5),
                pct(&pn.epc, 0.99) / pct(&k.epc, 0.99),
                med(&pn.cold) / med(&k.cold),
                med(&pn.restart) / med(&k.restart),
                med(&pn.conn) / med(&k.conn),
                med(&pn.cpu) / med(&k.cpu),
                med(&pn.rss) / med(&k.rss),
            );
            conn_ratios(size, kp, pn, k);
        }
    }
    if let Some(&big) = sizes.last() {
        if let (Some(pn), Some(kp)) = (
            results.get(&(big, Proxy::Podnet)),
            results.get(&(big, Proxy::KubeNft)),
        ) {
            let r = pct(&pn.prog, 0.99) / pct(&kp.prog, 0.99);
            println!(
                "target: programming p99 <= 0.1x kube-proxy nftables (defaults) at {big} Services: {:.3}x, {}",
                r,
                if r <= 0.1 { "met" } else { "MISSED" }
            );
        }
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    if !a.podnet.exists() {
        bail!(
            "{} not found: build it first (cargo build --release)",
            a.podnet.display()
        );
    }
    let proxies = choose_proxies(&a)?;
    let kube_proxy = kube_proxy_path(&a)?;
    let version = Command::new(&kube_proxy).arg("--version").output()?;
    let kp_version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let mut b = open_bench(&a, kube_proxy)?;
    let echo = if a.conn_secs > 0.0 {
        Some(echo_setup(&b)?)
    } else {
        None
    };
    b.deactivate()?;

    // The filled Services' ClusterIPs, by index.
    let mut ips: BTreeMap<usize, IpAddr> = BTreeMap::new();
    let mut results: BTreeMap<(usize, Proxy), Figures> = BTreeMap::new();
    let mut sizes = a.sizes.clone();
    sizes.sort_unstable();
    let mut turn = 0usize;
    for &size in &sizes {
        // Fill with no proxy running.
        let all = fill(&a, &b, &mut ips, size)?;
        let filled = Filled {
            size,
            ips: &ips,
            all,
        };
        for round in 0..a.rounds {
            let mut order = proxies.clone();
            order.rotate_left(round % proxies.len());
            for p in order {
                turn += 1;
                let r = run_turn(&a, &mut b, echo.as_ref(), &filled, p, turn)?;
                record(results.entry((size, p)).or_default(), size, round, p, r);
            }
        }
    }
    print_results(&a, &kp_version, &sizes, &proxies, &results);
    Ok(())
}
