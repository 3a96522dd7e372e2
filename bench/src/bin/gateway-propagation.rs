//! gateway-propagation: how fast `podnet gateway` serves a new route, and
//! whether route churn costs any request (issue 27's two control-plane
//! figures).
//!
//! - **Propagation**: with `--present` HTTPRoutes in the store, `--creates`
//!   times: one HTTPRoute is created (written to the store, as
//!   `podnet apply` does) and its host is asked for in a tight loop until
//!   the gateway answers 200; the time from the write to that answer,
//!   p50/p99.
//! - **Churn**: while `h2load` loads one route for the whole phase,
//!   `--churn` routes are added and then removed, one write each; every
//!   request must get a 200 (h2load's failed and non-2xx counts).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use podnet_api::{Kind, Object};

use podnet_bench::l7::{self, Ports, Proc};
use podnet_daemon::HttpGet;

#[derive(Parser)]
#[command(about = "podnet gateway: route propagation latency and churn under load")]
struct Args {
    #[arg(long)]
    podnet: Option<PathBuf>,
    /// Routes present before the measured creates.
    #[arg(long, default_value_t = 10_000)]
    present: usize,
    #[arg(long, default_value_t = 1_000)]
    creates: usize,
    /// Routes added then removed during the churn phase.
    #[arg(long, default_value_t = 3_000)]
    churn: usize,
}

fn status(port: u16, host: &str) -> u16 {
    HttpGet::new(Duration::from_secs(2))
        .host(host)
        .get(SocketAddr::from(([127, 0, 0, 1], port)), "/api/x")
        .map_or(0, |r| r.status)
}

fn route_object(name: &str, host: &str) -> Result<Object> {
    let y = l7::route(0)
        .replace("name: r0,", &format!("name: {name},"))
        .replace(&l7::host(0), host);
    let docs = podnet_api::manifest::parse(y.as_bytes()).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    docs.into_iter()
        .next()
        .map(|d| d.object)
        .context("no document")
}

fn main() -> Result<()> {
    podnet_bench::require_root()?;
    podnet_bench::catch_interrupts();
    let a = Args::parse();
    let exe = podnet_bench::locate_podnet(a.podnet.as_deref())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let be = l7::ok_backends(&rt, 1)?[0];
    let port = l7::free_port()?;
    let p = Ports {
        h1: port,
        h2c: port,
        tls: l7::free_port()?,
    };
    let cert = l7::certificate()?;
    let store_url = format!("sqlite://{}/state.db", dir.path().display());
    let objs = l7::write(
        dir.path(),
        "objs.yaml",
        &l7::podnet_objects(a.present, &[be], p, &cert),
    )?;
    let t0 = Instant::now();
    let o = Command::new(&exe)
        .args(["--store", &store_url, "apply", "-f"])
        .arg(&objs)
        .output()?;
    if !o.status.success() {
        bail!("apply: {}", String::from_utf8_lossy(&o.stderr));
    }
    println!(
        "gateway-propagation: {} routes applied in {:.1} s",
        a.present,
        t0.elapsed().as_secs_f64()
    );
    let metrics = format!("127.0.0.1:{}", l7::free_port()?);
    let mut cmd = Command::new(&exe);
    cmd.args([
        "--store",
        &store_url,
        "gateway",
        "--address",
        "127.0.0.1",
        "--metrics-addr",
        &metrics,
    ])
    .env("RUST_LOG", "warn");
    let mut gw = Proc::start("podnet", &mut cmd, &dir.path().join("gateway.log"))?;
    let t0 = Instant::now();
    while status(port, &l7::host(a.present - 1)) != 200 {
        gw.alive()?;
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "serving all {} routes {:.1} s after start; {:.1} MiB resident",
        a.present,
        t0.elapsed().as_secs_f64(),
        gw.rss_mib()
    );
    let store = rt.block_on(podnet_store::open(&store_url))?;
    let objs = podnet_store::objects::Objects::new(store);
    propagation(&rt, &objs, &mut gw, port, a.creates)?;
    churn(&rt, &objs, &mut gw, port, a.churn, dir.path())?;
    Ok(())
}

fn propagation(
    rt: &tokio::runtime::Runtime,
    objs: &podnet_store::objects::Objects,
    gw: &mut Proc,
    port: u16,
    n: usize,
) -> Result<()> {
    let mut took = Vec::with_capacity(n);
    for i in 0..n {
        podnet_bench::check_interrupted()?;
        let host = format!("new{i}.bench.example");
        let o = route_object(&format!("new{i}"), &host)?;
        let t0 = Instant::now();
        rt.block_on(objs.create(o, Vec::new()))?;
        loop {
            if status(port, &host) == 200 {
                break;
            }
            if t0.elapsed() > Duration::from_secs(30) {
                gw.alive()?;
                bail!("route new{i} not served after 30 s");
            }
        }
        took.push(t0.elapsed());
    }
    let s = podnet_bench::Stats::of(&took).context("no samples")?;
    println!(
        "propagation, HTTPRoute created -> served, {n} creates: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {:.1} MiB resident",
        podnet_bench::ms(s.median), podnet_bench::ms(s.p90), podnet_bench::ms(s.p99), podnet_bench::ms(s.max), gw.rss_mib()
    );
    Ok(())
}

fn churn(
    rt: &tokio::runtime::Runtime,
    objs: &podnet_store::objects::Objects,
    gw: &mut Proc,
    port: u16,
    n: usize,
    dir: &std::path::Path,
) -> Result<()> {
    // One write every 2 ms, inside a load that starts a second before
    // and ends seconds after.
    let pace = Duration::from_millis(2);
    let secs = (2 * n as u64 * 2) / 1000 + 5;
    let load = Command::new("h2load")
        .arg(format!("http://{}:{port}/api/x", l7::host(1)))
        .arg(format!("--connect-to=127.0.0.1:{port}"))
        .args(["--h1", "-t", "1", "-c", "8", "-D", &secs.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("h2load")?;
    std::thread::sleep(Duration::from_secs(1));
    let t0 = Instant::now();
    for i in 0..2 * n {
        let name = format!("churn{}", i % n);
        match i < n {
            true => rt
                .block_on(objs.create(
                    route_object(&name, &format!("{name}.bench.example"))?,
                    Vec::new(),
                ))
                .map(drop)?,
            false => rt
                .block_on(objs.delete(Kind::HTTPRoute, Some("default"), &name, None, Vec::new()))
                .map(drop)?,
        }
        std::thread::sleep(pace);
    }
    let churned = t0.elapsed();
    let out = load.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let _ = std::fs::write(dir.join("churn-h2load.txt"), text.as_bytes());
    gw.alive()?;
    let line = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .unwrap_or("")
            .trim()
            .to_string()
    };
    println!("churn: {n} routes added and {n} removed, one write per 2 ms, in {:.1} s under load ({secs} s of h1 load, 8 connections): {} | {}", churned.as_secs_f64(), line("requests:"), line("status codes:"));
    Ok(())
}
