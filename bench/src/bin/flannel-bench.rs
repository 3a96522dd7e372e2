//! podnet's data plane against the real flannel, per backend (vxlan,
//! host-gw), in the same run: pod-to-pod iperf3 across nodes (1 and 4
//! streams) and ping in alternating rounds, then the time from a node's
//! network daemon starting to a pod on that node being reachable from a pod
//! on another node.
//!
//! Two Kubernetes-mode labs stand side by side per backend, each with its
//! own etcd, kube-apiserver and kube-controller-manager: one runs
//! `podnet agent` on every node (`lab up --kube`), the other runs no podnet
//! daemon (`kube_agents: false`) and this program starts flanneld
//! (`scripts/flannel.sh`) in each node's network namespace with
//! `--kube-subnet-mgr --ip-masq`, as flannel's manifest does, against that
//! lab's API server. Pods on both get their network from podnet's `podnet`
//! CNI meta plugin reading the node's subnet.env, which in the flannel lab
//! flanneld writes (flannel's format; "ours with flannel's subnet.env").
//!
//! Every measurement pairs the two labs in the same round (which one goes
//! first alternates), so both see the same machine weather; the verdicts
//! are medians of the per-round podnet/flannel ratios.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use podnet_bench::iperf::{iperf, iperf_server, median, pair, ping, ratios};
use podnet_kernel::netns::Netns;
use podnet_lab::{serve::PortSpec, Lab, LabState, NodeInfo, Reach, UpOptions};

#[derive(Parser)]
struct Args {
    /// The podnet binary (default: next to this one).
    #[arg(long)]
    podnet: Option<PathBuf>,
    /// flanneld (default: $FLANNELD, else scripts/flannel.sh's cache path).
    #[arg(long)]
    flanneld: Option<PathBuf>,
    /// Backends to measure.
    #[arg(long, default_value = "vxlan,host-gw")]
    backends: String,
    /// Alternating rounds per backend.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Seconds per iperf3 run.
    #[arg(long, default_value_t = 2)]
    seconds: u32,
    /// Node joins per side and backend (each adds a node to both labs).
    #[arg(long, default_value_t = 3)]
    joins: usize,
}

const FLANNEL_DEFAULT: &str = "/var/cache/podnet-peers/flannel-v0.28.10/flanneld";
const POD_NS: &str = "default";

/// A lab that goes down when dropped, with the flanneld processes this
/// program started in it.
struct Side {
    lab: Lab,
    flannel: Vec<Child>,
    label: &'static str,
}

impl Drop for Side {
    fn drop(&mut self) {
        for c in &mut self.flannel {
            // SIGTERM first: flanneld exits cleanly on it.
            // SAFETY: plain kill(2) on our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
        for c in &mut self.flannel {
            let deadline = Instant::now() + Duration::from_secs(5);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Err(e) = self.lab.down() {
            eprintln!("flannel-bench: lab {} down: {e}", self.lab.name);
        }
    }
}

fn node_dir(lab: &Lab, node: &str) -> PathBuf {
    lab.dir.join("nodes").join(node)
}

/// flannel's net-conf.json for this lab (the same Network as the lab's
/// kube-controller-manager --cluster-cidr).
fn write_flannel_conf(lab: &Lab, backend: &str) -> Result<PathBuf> {
    let p = lab.dir.join("flannel-net-conf.json");
    let conf = serde_json::json!({
        "Network": podnet_lab::kube::CLUSTER_CIDR,
        "Backend": {"Type": backend},
    });
    std::fs::write(&p, conf.to_string()).with_context(|| format!("writing {}", p.display()))?;
    Ok(p)
}

/// Starts flanneld in `node`'s network namespace only (not `ip netns
/// exec`, which remounts /sys), logging to the lab's logs directory.
fn start_flanneld(flanneld: &Path, lab: &Lab, node: &NodeInfo) -> Result<Child> {
    let kubeconfig = lab.kubeconfig()?;
    let log_path = lab.log_path(&format!("flanneld-{}", node.name));
    let log = std::fs::File::create(&log_path)?;
    let mut cmd = Command::new(flanneld);
    cmd.args([
        "--kube-subnet-mgr",
        "--ip-masq",
        "--iface=eth0",
        &format!("--kubeconfig-file={}", kubeconfig.display()),
        &format!(
            "--net-config-path={}",
            lab.dir.join("flannel-net-conf.json").display()
        ),
        &format!(
            "--subnet-file={}",
            node_dir(lab, &node.name).join("subnet.env").display()
        ),
    ])
    .env("NODE_NAME", &node.name)
    .stdin(Stdio::null())
    .stdout(log.try_clone()?)
    .stderr(log)
    .process_group(0);
    Ok(Netns::named(&node.netns)?.run(|| cmd.spawn())??)
}

/// The podCIDR of every node, from its subnet.env's FLANNEL_SUBNET.
fn subnet_of(lab: &Lab, node: &str) -> Option<ipnet::Ipv4Net> {
    let text = std::fs::read_to_string(node_dir(lab, node).join("subnet.env")).ok()?;
    let s = text
        .lines()
        .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))?;
    s.trim().parse::<ipnet::Ipv4Net>().ok().map(|n| n.trunc())
}

/// Whether `ns` has a route to `cidr` (exact prefix).
fn has_route(ns: &str, cidr: &ipnet::Ipv4Net) -> bool {
    Command::new("ip")
        .args(["-n", ns, "route", "show", "exact", &cidr.to_string()])
        .output()
        .map(|o| o.status.success() && !o.stdout.trim_ascii().is_empty())
        .unwrap_or(false)
}

/// Polls until every node in `nodes` has a subnet.env and a route to every
/// other node's subnet, or the deadline passes.
fn wait_mesh(lab: &Lab, nodes: &[NodeInfo], what: &str, deadline: Instant) -> Result<()> {
    loop {
        let subnets: BTreeMap<&str, Option<ipnet::Ipv4Net>> = nodes
            .iter()
            .map(|n| (n.name.as_str(), subnet_of(lab, &n.name)))
            .collect();
        let mut missing = Vec::new();
        for n in nodes {
            for m in nodes.iter().filter(|m| m.name != n.name) {
                match subnets[m.name.as_str()] {
                    Some(s) if has_route(&n.netns, &s) => {}
                    _ => missing.push(format!("{}->{}", n.name, m.name)),
                }
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{what}: routes missing after waiting: {missing:?}; see {}/logs",
                lab.dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn up_side(
    rt: &tokio::runtime::Runtime,
    exe: &Path,
    flanneld: &Path,
    name: &str,
    backend: &str,
    flannel: bool,
) -> Result<(Side, LabState)> {
    let mut side = Side {
        lab: Lab::new(name, exe.to_path_buf())?,
        flannel: vec![],
        label: if flannel { "flannel" } else { "podnet" },
    };
    let st = rt.block_on(side.lab.up(&UpOptions {
        kube: true,
        kube_agents: !flannel,
        dns_replicas: 0,
        ..UpOptions::new(2, backend)
    }))?;
    if flannel {
        write_flannel_conf(&side.lab, backend)?;
        for n in &st.nodes {
            // flanneld writes it; the lab's own copy goes, so what pods
            // read below is flannel's.
            let _ = std::fs::remove_file(node_dir(&side.lab, &n.name).join("subnet.env"));
            side.flannel.push(start_flanneld(flanneld, &side.lab, n)?);
        }
        wait_mesh(
            &side.lab,
            &st.nodes,
            "flanneld",
            Instant::now() + Duration::from_secs(60),
        )?;
    }
    for (pod, node) in [("c", "node1"), ("s", "node2")] {
        rt.block_on(side.lab.run_pod(
            POD_NS,
            pod,
            Some(node),
            Default::default(),
            &[PortSpec::tcp(80)],
        ))?;
    }
    Ok((side, st))
}

/// The pod-to-pod path of one lab: client namespace, server address.
struct PodPath {
    client_ns: String,
    server_ns: String,
    server_ip: String,
}

fn pod_path(lab: &Lab) -> Result<PodPath> {
    let c = lab.pod(POD_NS, "c")?;
    let s = lab.pod(POD_NS, "s")?;
    Ok(PodPath {
        client_ns: c.netns,
        server_ns: s.netns,
        server_ip: s.ip,
    })
}

/// Throughput and ping, alternating rounds; prints the table rows.
fn throughput(a: &Args, backend: &str, paths: &[PodPath; 2]) -> Result<()> {
    let _servers = [
        iperf_server(&paths[0].server_ns, &paths[0].server_ip)?,
        iperf_server(&paths[1].server_ns, &paths[1].server_ip)?,
    ];
    let (mut one, mut four, mut pings) = ([vec![], vec![]], [vec![], vec![]], [vec![], vec![]]);
    for r in 0..a.rounds {
        podnet_bench::check_interrupted()?;
        let run = |streams| {
            pair(r, |i| {
                iperf(&paths[i].client_ns, &paths[i].server_ip, streams, a.seconds)
            })
        };
        let (p, f) = run(1)?;
        one[0].push(p);
        one[1].push(f);
        let (p, f) = run(4)?;
        four[0].push(p);
        four[1].push(f);
        let (p, f) = pair(r, |i| ping(&paths[i].client_ns, &paths[i].server_ip))?;
        pings[0].push(p);
        pings[1].push(f);
        eprintln!(
            "flannel-bench: {backend} round {}: 1 stream {:.2}/{:.2}, 4 streams {:.2}/{:.2} Gbit/s, ping {:.3}/{:.3} ms (podnet/flannel)",
            r + 1,
            one[0][r],
            one[1][r],
            four[0][r],
            four[1][r],
            pings[0][r],
            pings[1][r]
        );
    }
    for (i, label) in ["podnet", "flannel"].iter().enumerate() {
        println!(
            "{:<16} {:>9.2} {:>9.2} {:>9.3}",
            format!("{label} {backend}"),
            median(&one[i]),
            median(&four[i]),
            median(&pings[i]),
        );
    }
    let (r1, r4, rp) = (
        ratios(&one[0], &one[1]),
        ratios(&four[0], &four[1]),
        ratios(&pings[0], &pings[1]),
    );
    println!(
        "{:<16} {:>9.2} {:>9.2} {:>9.2}   {}",
        "  podnet/flannel",
        r1,
        r4,
        rp,
        if r1 >= 0.97 && r4 >= 0.97 {
            "throughput target >=0.97 met"
        } else {
            "throughput target >=0.97 NOT met"
        }
    );
    Ok(())
}

/// One node join on one side: a new node with its Node object, podCIDR and
/// a pod (CNI files written by the lab, as before any network daemon),
/// then its daemon starts; returns the time from that start until the pod
/// answers a TCP probe from pod `c` on node1.
fn join(
    rt: &tokio::runtime::Runtime,
    side: &mut Side,
    flanneld: &Path,
    k: usize,
) -> Result<Duration> {
    let lab = &side.lab;
    let node = rt.block_on(lab.add_kube_node_without_agent())?;
    let pod = format!("j{k}");
    let info = rt.block_on(lab.run_pod(
        POD_NS,
        &pod,
        Some(&node.name),
        Default::default(),
        &[PortSpec::tcp(80)],
    ))?;
    let target = SocketAddr::new(info.ip.parse().context("joined pod's IP")?, 80);
    let t0 = Instant::now();
    if side.label == "flannel" {
        let _ = std::fs::remove_file(node_dir(lab, &node.name).join("subnet.env"));
        let child = start_flanneld(flanneld, lab, &node)?;
        side.flannel.push(child);
    } else {
        side.lab.restart_agent(&node.name)?;
    }
    let deadline = t0 + Duration::from_secs(60);
    loop {
        match side
            .lab
            .reach(POD_NS, "c", target, false, Duration::from_millis(20))
        {
            Reach::Connected(_) => return Ok(t0.elapsed()),
            other => {
                if Instant::now() > deadline {
                    bail!(
                        "{} {}: pod {target} not reachable from node1 60 s after the daemon started (last: {other:?}); see {}/logs",
                        side.label,
                        node.name,
                        side.lab.dir.display()
                    );
                }
            }
        }
        // The probe's own timeout paces the loop when packets are dropped;
        // an immediate error (unreachable) gets a short pause.
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn node_join(
    a: &Args,
    rt: &tokio::runtime::Runtime,
    sides: &mut [Side; 2],
    flanneld: &Path,
    backend: &str,
) -> Result<()> {
    let mut t = [vec![], vec![]];
    for k in 0..a.joins {
        podnet_bench::check_interrupted()?;
        let order = if k % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let d = join(rt, &mut sides[i], flanneld, k)?;
            eprintln!(
                "flannel-bench: {backend} join {}: {} {:.0} ms",
                k + 1,
                sides[i].label,
                d.as_secs_f64() * 1e3
            );
            t[i].push(d.as_secs_f64() * 1e3);
        }
    }
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "node join ({backend}): daemon start -> new node's pod reachable from node1, ms: podnet median {:.0} [{}], flannel median {:.0} [{}], podnet/flannel {:.2}",
        median(&t[0]),
        fmt(&t[0]),
        median(&t[1]),
        fmt(&t[1]),
        ratios(&t[0], &t[1]),
    );
    Ok(())
}

fn main() -> Result<()> {
    let a = Args::parse();
    podnet_bench::require_root()?;
    podnet_bench::catch_interrupts();
    let exe = podnet_bench::locate_podnet(a.podnet.as_deref())?;
    let flanneld = a
        .flanneld
        .clone()
        .or_else(|| std::env::var_os("FLANNELD").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(FLANNEL_DEFAULT));
    let version = Command::new(&flanneld)
        .arg("--version")
        .output()
        .with_context(|| format!("{}: run scripts/flannel.sh first", flanneld.display()))?;
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string()
        + String::from_utf8_lossy(&version.stderr).trim();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "podnet {} against flanneld {version} (--kube-subnet-mgr --ip-masq), each in its own --kube lab, 2 nodes;",
        exe.display()
    );
    println!(
        "{} alternating rounds of {} s per stream count; Gbit/s and ms are medians, ratios are medians of per-round podnet/flannel ratios\n",
        a.rounds, a.seconds
    );
    let id = std::process::id() % 10000;
    for backend in a.backends.split(',').filter(|b| !b.is_empty()) {
        if !["vxlan", "host-gw"].contains(&backend) {
            bail!("--backends {backend:?}: vxlan or host-gw");
        }
        eprintln!("flannel-bench: {backend}: labs up (podnet, then flannel) ...");
        let (pn, _) = up_side(&rt, &exe, &flanneld, &format!("fp{id}"), backend, false)?;
        let (fl, _) = up_side(&rt, &exe, &flanneld, &format!("ff{id}"), backend, true)?;
        let paths = [pod_path(&pn.lab)?, pod_path(&fl.lab)?];
        println!(
            "{:<16} {:>9} {:>9} {:>9}",
            "pod to pod", "1 stream", "4 streams", "ping ms"
        );
        throughput(&a, backend, &paths)?;
        let mut sides = [pn, fl];
        if a.joins > 0 {
            node_join(&a, &rt, &mut sides, &flanneld, backend)?;
        }
        println!();
        drop(sides);
    }
    Ok(())
}
