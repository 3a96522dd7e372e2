//! Data-plane benchmark: iperf3 TCP throughput (1 and 4 streams) and ping
//! latency pod-to-pod across two lab nodes, per backend, against the raw
//! underlay between the same two node namespaces, in the same run.
//!
//! Targets (issue 4): host-gw >= 0.9x underlay, vxlan >= 0.7x; udp reported.

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
    #[arg(long, default_value_t = 4)]
    seconds: u32,
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

fn main() -> Result<()> {
    let a = Args::parse();
    if !a.podnet.exists() {
        bail!(
            "{} not found: cargo build --release first",
            a.podnet.display()
        );
    }
    println!(
        "{:<9} {:>12} {:>12} {:>10} {:>8} {:>8} {:>8}",
        "path", "1 stream", "4 streams", "ping ms", "x1", "x4", "target"
    );
    let mut underlay: Option<(f64, f64)> = None;
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
        if underlay.is_none() {
            let _srv = iperf_server(&n2, "192.168.200.12")?;
            let u1 = iperf(&n1, "192.168.200.12", 1, a.seconds)?;
            let u4 = iperf(&n1, "192.168.200.12", 4, a.seconds)?;
            let p = ping(&n1, "192.168.200.12")?;
            println!(
                "{:<9} {:>9.2} Gb {:>9.2} Gb {:>10.3} {:>8} {:>8} {:>8}",
                "underlay", u1, u4, p, "1.00", "1.00", ""
            );
            underlay = Some((u1, u4));
        }
        let (u1, u4) = underlay.expect("measured above");
        let (cns, sns, sip) = (
            pod_field(&lab.name, "c", "netns")?,
            pod_field(&lab.name, "s", "netns")?,
            pod_field(&lab.name, "s", "ip")?,
        );
        let _srv = iperf_server(&sns, &sip)?;
        let t1 = iperf(&cns, &sip, 1, a.seconds)?;
        let t4 = iperf(&cns, &sip, 4, a.seconds)?;
        let p = ping(&cns, &sip)?;
        let target = match backend {
            "host-gw" => ">=0.90",
            "vxlan" => ">=0.70",
            _ => "report",
        };
        println!(
            "{backend:<9} {t1:>9.2} Gb {t4:>9.2} Gb {p:>10.3} {:>8.2} {:>8.2} {target:>8}",
            t1 / u1,
            t4 / u4
        );
    }
    Ok(())
}
