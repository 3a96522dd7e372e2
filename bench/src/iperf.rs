//! What the data-plane benchmarks share: iperf3 between two namespaces,
//! ping, and the medians and paired ratios of alternating rounds.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// An iperf3 server, stopped when dropped.
pub struct Server(Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn iperf_server(ns: &str, bind: &str) -> Result<Server> {
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

/// Gbit/s received in one iperf3 run (retries while the server starts).
pub fn iperf(ns: &str, dst: &str, streams: u32, secs: u32) -> Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "iperf3", "-J", "-c", dst, "-p", "5201"])
            .args(["-t", &secs.to_string(), "-P", &streams.to_string()])
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
pub fn ping(ns: &str, dst: &str) -> Result<f64> {
    rtts(ns, dst, 20, "0.05").map(|v| median(&v))
}

pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The median of the per-round ratios a/b.
pub fn ratios(a: &[f64], b: &[f64]) -> f64 {
    median(&a.iter().zip(b).map(|(x, y)| x / y).collect::<Vec<_>>())
}

/// Runs `f` on both sides (0 and 1), side 0 first in even rounds, side 1
/// first in odd ones, so both see the same machine weather; returns
/// (side 0, side 1).
pub fn pair<T>(r: usize, mut f: impl FnMut(usize) -> Result<T>) -> Result<(T, T)> {
    if r.is_multiple_of(2) {
        let a = f(0)?;
        Ok((a, f(1)?))
    } else {
        let b = f(1)?;
        Ok((f(0)?, b))
    }
}

/// Every RTT in ms of `count` pings `interval` seconds apart.
pub fn rtts(ns: &str, dst: &str, count: u32, interval: &str) -> Result<Vec<f64>> {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "ping",
            "-c",
            &count.to_string(),
            "-i",
            interval,
            dst,
        ])
        .output()?;
    let v: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.split("time=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    if v.is_empty() {
        bail!("no ping answers from {dst} in {ns}");
    }
    Ok(v)
}

/// The nearest-rank percentile `p` (0-100) of `v`.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v.get(rank - 1).copied().unwrap_or(f64::NAN)
}

/// CPU seconds spent so far by the whole machine, all cores (user,
/// nice, system, irq and softirq time from /proc/stat).
pub fn cpu_busy_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else {
        return 0.0;
    };
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy: f64 = [0, 1, 2, 5, 6].iter().filter_map(|&i| f.get(i)).sum();
    // SAFETY: sysconf is always safe to call.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    busy / hz
}
