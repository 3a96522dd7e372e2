//! Data-plane benchmark: iperf3 TCP throughput (1 and 4 streams) and ping
//! latency pod-to-pod across two lab nodes, per backend, against the raw
//! underlay between the same two node namespaces, in the same run.
//!
//! Targets (issue 4): host-gw >= 0.9x underlay, vxlan >= 0.7x; udp reported.
//!
//! The machine is shared and its throughput drifts by tens of percent from
//! one second to the next, so one underlay figure against one pod figure
//! says little. Each backend's lab measures both paths in alternating
//! rounds (underlay then pod, pod then underlay, ...), and the verdict is
//! the median of the per-round ratios; the medians of the raw figures are
//! printed beside it.
//!
//! The peer: not flannel itself (`flannel-bench` runs the real flanneld);
//! each `--reference` backend is a kernel-only copy of the data path
//! flannel and the reference bridge plugin would leave in the kernel, built by this program with `ip` and `bridge` commands alone (an
//! underlay bridge, two node namespaces, a pod behind a `cni0`-style bridge
//! on each, and either a VXLAN VTEP with one route, neighbour and FDB entry
//! per remote subnet, or one direct route). No podnet process and no
//! netfilter table is involved, so its ratios are what the kernel itself
//! gives on this machine, measured in the same rounds as the podnet lab
//! beside it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use podnet_bench::ns_name;
use podnet_testkit::TestNs;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "target/release/podnet")]
    podnet: PathBuf,
    /// Seconds per iperf3 run.
    #[arg(long, default_value_t = 2)]
    seconds: u32,
    /// Alternating underlay/pod rounds per backend and stream count.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Backends to measure.
    #[arg(long, default_value = "host-gw,vxlan,udp")]
    backends: String,
    /// Kernel-only reference paths (flannel's layout, built with `ip`),
    /// measured in the same rounds as the podnet backend they name; empty
    /// for none.
    #[arg(long, default_value = "host-gw,vxlan")]
    reference: String,
    /// Runs the 1-stream client and server on CPU 0 (`iperf3 -A 0,0`): a
    /// cost comparison without cross-CPU reordering on the veth backlogs.
    #[arg(long)]
    pin: bool,
}

struct Lab {
    podnet: PathBuf,
    name: String,
}

impl Lab {
    fn cmd(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(&self.podnet)
            .args(["lab", "--name", &self.name])
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!("lab {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.cmd(&["down"]);
    }
}

fn pod_field(lab: &str, pod: &str, field: &str) -> Result<String> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(format!(
        "/run/podnet-lab/{lab}/pods/default_{pod}.json"
    ))?)?;
    Ok(v[field].as_str().unwrap_or_default().to_string())
}

struct Server(Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn iperf_server(ns: &str, bind: &str) -> Result<Server> {
    let c = Command::new("ip")
        .args([
            "netns", "exec", ns, "iperf3", "-s", "-B", bind, "-p", "5201",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("iperf3 missing: apt-get install iperf3")?;
    Ok(Server(c))
}

/// Gbit/s from one iperf3 client run (retries while the server starts).
fn iperf(ns: &str, dst: &str, streams: u32, secs: u32, pin: bool) -> Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                "iperf3",
                "-J",
                "-c",
                dst,
                "-p",
                "5201",
                "-t",
                &secs.to_string(),
                "-P",
                &streams.to_string(),
            ])
            .args(if pin { &["-A", "0,0"][..] } else { &[] })
            .output()?;
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
            let bps = v["end"]["sum_received"]["bits_per_second"]
                .as_f64()
                .unwrap_or(0.0);
            if bps > 0.0 {
                return Ok(bps / 1e9);
            }
        }
        if Instant::now() > deadline {
            bail!(
                "iperf3 to {dst} from {ns}: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Median RTT in ms over 20 pings.
fn ping(ns: &str, dst: &str) -> Result<f64> {
    let out = Command::new("ip")
        .args([
            "netns", "exec", ns, "ping", "-c", "20", "-i", "0.05", "-q", dst,
        ])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // rtt min/avg/max/mdev = a/b/c/d ms: report avg (ping -q gives no median).
    let line = text
        .lines()
        .find(|l| l.contains("min/avg/max"))
        .context("ping produced no summary")?;
    let nums = line.split('=').nth(1).context("ping summary")?.trim();
    Ok(nums.split('/').nth(1).context("avg")?.parse()?)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Underlay and pod figures of alternating rounds, and their ratios.
#[derive(Default)]
struct Paired {
    underlay: Vec<f64>,
    pod: Vec<f64>,
}

impl Paired {
    /// Measures round `r`'s pair, underlay first in even rounds and pod
    /// first in odd ones.
    fn round(&mut self, r: usize, mut f: impl FnMut(bool) -> Result<f64>) -> Result<()> {
        let (u, q) = if r.is_multiple_of(2) {
            let u = f(false)?;
            (u, f(true)?)
        } else {
            let q = f(true)?;
            (f(false)?, q)
        };
        self.underlay.push(u);
        self.pod.push(q);
        Ok(())
    }

    fn ratio(&self) -> f64 {
        let r: Vec<f64> = self
            .underlay
            .iter()
            .zip(&self.pod)
            .map(|(u, q)| q / u)
            .collect();
        median(&r)
    }
}

/// The two paths of one configuration: node to node over the underlay, and
/// pod to pod across the same two nodes.
struct Paths {
    under_client: String,
    under_server: String,
    under_ip: String,
    pod_client: String,
    pod_server: String,
    pod_ip: String,
}

impl Paths {
    /// The client's namespace and the server address of one path.
    fn client(&self, pod: bool) -> (&str, &str) {
        if pod {
            (&self.pod_client, &self.pod_ip)
        } else {
            (&self.under_client, &self.under_ip)
        }
    }
}

/// A kernel-only copy of one backend's data path (see the module docs).
/// The namespaces go when it drops, taking every device with them.
struct Reference {
    _namespaces: Vec<TestNs>,
}

/// Runs `tool -n ns <line>` (`ip` or `bridge`); `line` is split on spaces.
fn run(tool: &str, ns: &str, line: &str) -> Result<()> {
    let out = Command::new(tool)
        .args(["-n", ns])
        .args(line.split_whitespace())
        .output()?;
    if !out.status.success() {
        bail!(
            "{tool} -n {ns} {line}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn ip(ns: &str, line: &str) -> Result<()> {
    run("ip", ns, line)
}

fn link_mac(ns: &str, dev: &str) -> Result<String> {
    let out = Command::new("ip")
        .args(["-n", ns, "-j", "link", "show", "dev", dev])
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("ip -j link show {dev} in {ns}"))?;
    Ok(v[0]["address"]
        .as_str()
        .context("link without an address")?
        .to_string())
}

impl Reference {
    /// Underlay 192.168.77.0/24, pod subnets 10.77.N.0/24 (pod .2 behind a
    /// bridge at .1), as flannel with the reference bridge plugin sets them.
    fn build(backend: &str) -> Result<(Reference, Paths)> {
        let vxlan = match backend {
            "vxlan" => true,
            "host-gw" => false,
            other => bail!("no kernel reference for backend {other:?} (host-gw, vxlan)"),
        };
        let names: Vec<String> = ["ref-u", "ref-n1", "ref-n2", "ref-p1", "ref-p2"]
            .iter()
            .map(|w| ns_name(w))
            .collect();
        let mut namespaces = Vec::new();
        for n in &names {
            namespaces.push(TestNs::create(n.clone())?);
            ip(n, "link set lo up")?;
        }
        for g in &namespaces[1..3] {
            g.netns()
                .run(|| podnet_kernel::netns::write_sysctl("net.ipv4.ip_forward", "1"))??;
        }
        let r = Reference {
            _namespaces: namespaces,
        };
        let (u, node, pod) = (&names[0], &names[1..3], &names[3..5]);
        let mtu = if vxlan { 1450 } else { 1500 };
        ip(u, "link add br0 type bridge")?;
        ip(u, "link set br0 up")?;
        for i in 0..2 {
            let (n, p, k) = (&node[i], &pod[i], i + 1);
            let addr = format!("192.168.77.1{k}");
            ip(
                u,
                &format!("link add to{k} type veth peer name eth0 netns {n}"),
            )?;
            ip(u, &format!("link set to{k} master br0 up"))?;
            ip(n, &format!("addr add {addr}/24 dev eth0"))?;
            ip(n, "link set eth0 up")?;
            if vxlan {
                // flannel's VTEP: VNI 1, port 8472, no learning; the outer
                // UDP checksum left at the kernel's default.
                ip(
                    n,
                    &format!(
                        "link add vx type vxlan id 1 local {addr} dev eth0 dstport 8472 nolearning"
                    ),
                )?;
                ip(n, &format!("link set vx mtu {mtu} up"))?;
                ip(n, &format!("addr add 10.77.{k}.0/32 dev vx"))?;
            }
            ip(n, "link add cni0 type bridge")?;
            ip(n, &format!("link set cni0 mtu {mtu} up"))?;
            ip(n, &format!("addr add 10.77.{k}.1/24 dev cni0"))?;
            ip(
                n,
                &format!("link add vp type veth peer name eth0 netns {p}"),
            )?;
            ip(n, &format!("link set vp mtu {mtu} master cni0 up"))?;
            ip(p, &format!("link set eth0 mtu {mtu} up"))?;
            ip(p, &format!("addr add 10.77.{k}.2/24 dev eth0"))?;
            ip(p, &format!("route add default via 10.77.{k}.1"))?;
        }
        for i in 0..2 {
            let (n, j) = (&node[i], 2 - i);
            let (subnet, remote) = (format!("10.77.{j}.0/24"), format!("192.168.77.1{j}"));
            if vxlan {
                let mac = link_mac(&node[j - 1], "vx")?;
                let gw = format!("10.77.{j}.0");
                ip(
                    n,
                    &format!("neigh add {gw} lladdr {mac} dev vx nud permanent"),
                )?;
                run(
                    "bridge",
                    n,
                    &format!("fdb add {mac} dev vx dst {remote} self permanent"),
                )?;
                ip(n, &format!("route add {subnet} via {gw} dev vx onlink"))?;
            } else {
                ip(n, &format!("route add {subnet} via {remote} dev eth0"))?;
            }
        }
        let paths = Paths {
            under_client: node[0].clone(),
            under_server: node[1].clone(),
            under_ip: "192.168.77.12".into(),
            pod_client: pod[0].clone(),
            pod_server: pod[1].clone(),
            pod_ip: "10.77.2.2".into(),
        };
        Ok((r, paths))
    }
}

fn target(backend: &str) -> &'static str {
    match backend {
        "host-gw" => ">=0.90",
        "vxlan" => ">=0.70",
        _ => "report",
    }
}

/// One configuration's figures: 1 stream, 4 streams, ping.
#[derive(Default)]
struct Figures {
    one: Paired,
    four: Paired,
    pings: Paired,
}

/// Measures every configuration in `rows` in the same rounds (each round
/// visits them all, underlay and pod in alternating order), so that a
/// podnet backend and its kernel-only peer see the same machine weather,
/// and prints one table row each. With two rows, also the per-round ratio
/// of their pod figures.
fn measure(a: &Args, rows: &[(String, &str, &Paths)]) -> Result<()> {
    let mut servers = Vec::new();
    for (_, _, p) in rows {
        servers.push(iperf_server(&p.under_server, &p.under_ip)?);
        servers.push(iperf_server(&p.pod_server, &p.pod_ip)?);
    }
    let mut figs: Vec<Figures> = rows.iter().map(|_| Figures::default()).collect();
    for r in 0..a.rounds {
        for ((_, _, p), f) in rows.iter().zip(&mut figs) {
            f.one.round(r, |pod| {
                let (ns, dst) = p.client(pod);
                iperf(ns, dst, 1, a.seconds, a.pin)
            })?;
            f.four.round(r, |pod| {
                let (ns, dst) = p.client(pod);
                iperf(ns, dst, 4, a.seconds, false)
            })?;
            if r < 3 {
                f.pings.round(r, |pod| {
                    let (ns, dst) = p.client(pod);
                    ping(ns, dst)
                })?;
            }
        }
    }
    for ((label, target, _), f) in rows.iter().zip(&figs) {
        println!(
            "{label:<15} {:>9.2} {:>9.2} {:>6.2} {:>9.2} {:>9.2} {:>6.2} {:>8.3} {:>8.3} {target:>8}",
            median(&f.one.underlay),
            median(&f.one.pod),
            f.one.ratio(),
            median(&f.four.underlay),
            median(&f.four.pod),
            f.four.ratio(),
            median(&f.pings.underlay),
            median(&f.pings.pod),
        );
    }
    if let [ours, peer] = &figs[..] {
        let per_round =
            |a: &[f64], b: &[f64]| median(&a.iter().zip(b).map(|(x, y)| x / y).collect::<Vec<_>>());
        println!(
            "{:<15} pod/pod: 1 stream {:.2}, 4 streams {:.2} (median of per-round ratios)",
            "  podnet/kernel",
            per_round(&ours.one.pod, &peer.one.pod),
            per_round(&ours.four.pod, &peer.four.pod),
        );
    }
    drop(servers);
    Ok(())
}

fn main() -> Result<()> {
    let a = Args::parse();
    if !a.podnet.exists() {
        bail!(
            "{} not found: cargo build --release first",
            a.podnet.display()
        );
    }
    podnet_bench::remove_stale_namespaces();
    println!(
        "{} rounds of {} s per path and stream count{}; Gbit/s and ms are medians, x = median of per-round pod/underlay ratios",
        a.rounds,
        a.seconds,
        if a.pin { " (1 stream: client and server on CPU 0)" } else { "" }
    );
    println!("kernel <backend>: the same path with no podnet process or netfilter table (flannel's layout, built with ip)\n");
    println!(
        "{:<15} {:>9} {:>9} {:>6} {:>9} {:>9} {:>6} {:>8} {:>8} {:>8}",
        "path", "under 1", "pod 1", "x1", "under 4", "pod 4", "x4", "ping u", "ping pod", "target"
    );
    let list = |s: &str| -> Vec<String> {
        s.split(',')
            .filter(|b| !b.is_empty())
            .map(str::to_string)
            .collect()
    };
    let backends = list(&a.backends);
    let references = list(&a.reference);
    if let Some(r) = references
        .iter()
        .find(|r| !["host-gw", "vxlan"].contains(&r.as_str()))
    {
        bail!("--reference {r:?}: a kernel reference exists for host-gw and vxlan only");
    }
    for backend in &backends {
        let lab = Lab {
            podnet: a.podnet.clone(),
            name: format!("bn{}", std::process::id() % 10000),
        };
        lab.cmd(&["up", "--nodes", "2", "--backend", backend])?;
        lab.cmd(&["run", "default/c", "--node", "node1", "--ports", "80/tcp"])?;
        lab.cmd(&["run", "default/s", "--node", "node2", "--ports", "80/tcp"])?;
        let paths = Paths {
            under_client: format!("pn-{}-node1", lab.name),
            under_server: format!("pn-{}-node2", lab.name),
            under_ip: "192.168.200.12".into(),
            pod_client: pod_field(&lab.name, "c", "netns")?,
            pod_server: pod_field(&lab.name, "s", "netns")?,
            pod_ip: pod_field(&lab.name, "s", "ip")?,
        };
        let ours = (format!("podnet {backend}"), target(backend), &paths);
        if references.contains(backend) {
            let (reference, peer_paths) = Reference::build(backend)?;
            measure(
                &a,
                &[ours, (format!("kernel {backend}"), "peer", &peer_paths)],
            )?;
            drop(reference);
        } else {
            measure(&a, &[ours])?;
        }
        drop(lab);
    }
    Ok(())
}
