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

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;

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
fn iperf(ns: &str, dst: &str, streams: u32, secs: u32) -> Result<f64> {
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
    /// Runs `rounds` pairs, swapping which path goes first each round.
    fn run(rounds: usize, mut f: impl FnMut(bool) -> Result<f64>) -> Result<Paired> {
        let mut p = Paired::default();
        for r in 0..rounds {
            let (u, q) = if r % 2 == 0 {
                let u = f(false)?;
                (u, f(true)?)
            } else {
                let q = f(true)?;
                (f(false)?, q)
            };
            p.underlay.push(u);
            p.pod.push(q);
        }
        Ok(p)
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

fn main() -> Result<()> {
    let a = Args::parse();
    if !a.podnet.exists() {
        bail!(
            "{} not found: cargo build --release first",
            a.podnet.display()
        );
    }
    println!(
        "{} rounds of {} s per path and stream count; Gbit/s and ms are medians, x = median of per-round pod/underlay ratios\n",
        a.rounds, a.seconds
    );
    println!(
        "{:<9} {:>9} {:>9} {:>6} {:>9} {:>9} {:>6} {:>8} {:>8} {:>8}",
        "backend",
        "under 1",
        "pod 1",
        "x1",
        "under 4",
        "pod 4",
        "x4",
        "ping u",
        "ping pod",
        "target"
    );
    for backend in a.backends.split(',') {
        let lab = Lab {
            podnet: a.podnet.clone(),
            name: format!("bn{}", std::process::id() % 10000),
        };
        lab.cmd(&["up", "--nodes", "2", "--backend", backend])?;
        lab.cmd(&["run", "default/c", "--node", "node1", "--ports", "80/tcp"])?;
        lab.cmd(&["run", "default/s", "--node", "node2", "--ports", "80/tcp"])?;
        let (n1, n2) = (
            format!("pn-{}-node1", lab.name),
            format!("pn-{}-node2", lab.name),
        );
        let (cns, sns, sip) = (
            pod_field(&lab.name, "c", "netns")?,
            pod_field(&lab.name, "s", "netns")?,
            pod_field(&lab.name, "s", "ip")?,
        );
        let under_ip = "192.168.200.12";
        let _u = iperf_server(&n2, under_ip)?;
        let _p = iperf_server(&sns, &sip)?;
        let path = |pod: bool| {
            if pod {
                (cns.as_str(), sip.as_str())
            } else {
                (n1.as_str(), under_ip)
            }
        };
        let one = Paired::run(a.rounds, |pod| {
            let (ns, dst) = path(pod);
            iperf(ns, dst, 1, a.seconds)
        })?;
        let four = Paired::run(a.rounds, |pod| {
            let (ns, dst) = path(pod);
            iperf(ns, dst, 4, a.seconds)
        })?;
        let pings = Paired::run(3, |pod| {
            let (ns, dst) = path(pod);
            ping(ns, dst)
        })?;
        let target = match backend {
            "host-gw" => ">=0.90",
            "vxlan" => ">=0.70",
            _ => "report",
        };
        println!(
            "{backend:<9} {:>9.2} {:>9.2} {:>6.2} {:>9.2} {:>9.2} {:>6.2} {:>8.3} {:>8.3} {target:>8}",
            median(&one.underlay),
            median(&one.pod),
            one.ratio(),
            median(&four.underlay),
            median(&four.pod),
            four.ratio(),
            median(&pings.underlay),
            median(&pings.pod),
        );
    }
    Ok(())
}
