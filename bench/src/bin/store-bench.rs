//! Store benchmark: per backend (sqlite and a real etcd, in the same run),
//! the time `podnet apply` takes for 10,000 Services, and the latency from a
//! write to its arrival at a watcher (median and p99 over 1,000 writes).
//!
//! Targets (issue 3): 10k Services in < 10 s on sqlite and < 20 s on etcd;
//! watch p99 < 20 ms on sqlite and < 10 ms on etcd.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use podnet_store::{Store, StoreExt, WatchMsg};

#[derive(Parser)]
struct Args {
    /// The podnet binary (default: target/release/podnet).
    #[arg(long, default_value = "target/release/podnet")]
    podnet: PathBuf,
    #[arg(long, default_value_t = 10_000)]
    services: usize,
    #[arg(long, default_value_t = 1_000)]
    writes: usize,
}

fn manifest(n: usize) -> String {
    let mut s = String::with_capacity(n * 200);
    for i in 0..n {
        s.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: bench}}\n\
             spec: {{selector: {{app: app-{i}}}, ports: [{{name: http, port: 80, targetPort: 8080}}]}}\n"
        ));
    }
    s
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

async fn watch_latency(url: &str, writes: usize) -> Result<(f64, f64)> {
    let s = podnet_store::open(url).await?;
    let start = s.revision().await? + 1;
    let mut w = s.watch("/bench/latency/", start).await?;
    let mut lat = Vec::with_capacity(writes);
    for i in 0..writes {
        let key = format!("/bench/latency/k{}", i % 100);
        let t0 = Instant::now();
        let rev = s.put(&key, i.to_string().into_bytes()).await?;
        loop {
            match tokio::time::timeout(Duration::from_secs(5), w.next()).await {
                Ok(Some(Ok(WatchMsg::Events(r, _)))) if r >= rev => break,
                Ok(Some(Ok(WatchMsg::Events(..)))) => continue,
                other => bail!("watch failed: {other:?}"),
            }
        }
        lat.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((pct(&mut lat.clone(), 0.5), pct(&mut lat, 0.99)))
}

fn apply(podnet: &PathBuf, url: &str, file: &std::path::Path) -> Result<f64> {
    let t0 = Instant::now();
    let out = Command::new(podnet)
        .args(["apply", "-f"])
        .arg(file)
        .env("PODNET_STORE", url)
        .output()
        .with_context(|| format!("running {}", podnet.display()))?;
    let secs = t0.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("apply failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let created = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.ends_with("created"))
        .count();
    if created == 0 {
        bail!("apply created nothing");
    }
    Ok(secs)
}

fn main() -> Result<()> {
    let a = Args::parse();
    if !a.podnet.exists() {
        bail!(
            "{} not found: cargo build --release first",
            a.podnet.display()
        );
    }
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("services.yaml");
    std::fs::write(&file, manifest(a.services))?;
    let etcd = podnet_testkit::Etcd::start();
    let backends = [
        (
            "sqlite",
            format!("sqlite://{}", dir.path().join("state.db").display()),
            10.0,
            20.0,
        ),
        ("etcd", etcd.url(), 20.0, 10.0),
    ];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "{:<8} {:>14} {:>10} {:>14} {:>14} {:>10}",
        "backend", "apply 10k (s)", "target", "watch p50 ms", "watch p99 ms", "target"
    );
    for (name, url, apply_target, p99_target) in backends {
        let secs = apply(&a.podnet, &url, &file)?;
        let (p50, p99) = rt.block_on(watch_latency(&url, a.writes))?;
        println!(
            "{name:<8} {secs:>14.2} {:>10} {p50:>14.2} {p99:>14.2} {:>10}",
            format!(
                "<{apply_target}{}",
                if secs < apply_target { " ok" } else { " MISS" }
            ),
            format!(
                "<{p99_target}{}",
                if p99 < p99_target { " ok" } else { " MISS" }
            )
        );
    }
    Ok(())
}
