//! gateway-bench: `podnet gateway` against nginx and HAProxy (issue 27),
//! the same routes in front of the same backends, in one run.
//!
//! Two keep-alive HTTP/1.1 backends run in this process. Each proxy gets
//! `--routes` routes (host `h<i>.bench.example`, prefix `/api/`;
//! [`podnet_bench::l7`] writes the three configurations). Then, per point
//! (HTTP/1.1 or HTTP/2, plain or TLS, 1/16/64 connections), `h2load`
//! loads one route of each proxy in turn, alternating the order each
//! round, and this prints the medians over rounds of requests/s and of
//! each run's p50 and p99 (from h2load's per-request log), the ratios
//! against nginx, and the proxies' CPU time per 1,000 requests. Every
//! answer must be a 200: a failed request fails the run.
//!
//! Then memory: each proxy restarted with `--memory-routes` routes (the
//! figure at 10,000), its resident size after a few requests.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use podnet_bench::l7::{self, Ports, Proc};
use podnet_daemon::HttpGet;

#[derive(Parser)]
#[command(about = "podnet gateway against nginx and HAProxy, same routes, same backends")]
struct Args {
    #[arg(long)]
    podnet: Option<PathBuf>,
    #[arg(long, default_value_t = 100)]
    routes: usize,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds of load per run (after one second of warm-up).
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    conns: Vec<usize>,
    /// Routes for the memory figure (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    memory_routes: usize,
}

fn ports() -> Result<Ports> {
    Ok(Ports {
        h1: l7::free_port()?,
        h2c: l7::free_port()?,
        tls: l7::free_port()?,
    })
}

/// Waits until `port` answers a route with 200.
fn wait_serving(p: &mut Proc, port: u16) -> Result<()> {
    let host = l7::host(0);
    for _ in 0..600 {
        p.alive()?;
        let r = HttpGet::new(Duration::from_secs(2))
            .host(&host)
            .get(SocketAddr::from(([127, 0, 0, 1], port)), "/api/ready");
        if r.is_ok_and(|r| r.status == 200) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{} never answered on {port}", p.name)
}

struct Setup {
    dir: PathBuf,
    backends: Vec<SocketAddr>,
    cert: (String, String),
}

fn start_podnet(s: &Setup, exe: &Path, routes: usize, p: Ports) -> Result<Proc> {
    let store = format!("sqlite://{}/podnet-{routes}.db", s.dir.display());
    let objs = l7::write(
        &s.dir,
        "podnet.yaml",
        &l7::podnet_objects(routes, &s.backends, p, &s.cert),
    )?;
    let o = Command::new(exe)
        .args(["--store", &store, "apply", "-f"])
        .arg(&objs)
        .output()?;
    if !o.status.success() {
        bail!("podnet apply: {}", String::from_utf8_lossy(&o.stderr));
    }
    let metrics = format!("127.0.0.1:{}", l7::free_port()?);
    let mut cmd = Command::new(exe);
    cmd.args([
        "--store",
        &store,
        "gateway",
        "--address",
        "127.0.0.1",
        "--metrics-addr",
        &metrics,
    ])
    .env("RUST_LOG", "warn");
    let mut proc = Proc::start("podnet", &mut cmd, &s.dir.join("podnet.log"))?;
    wait_serving(&mut proc, p.h1)?;
    Ok(proc)
}

fn start_nginx(s: &Setup, routes: usize, p: Ports) -> Result<Proc> {
    l7::write(&s.dir, "tls.crt", &s.cert.0)?;
    l7::write(&s.dir, "tls.key", &s.cert.1)?;
    let conf = l7::write(
        &s.dir,
        "nginx.conf",
        &l7::nginx_conf(&s.dir, routes, &s.backends, p),
    )?;
    let mut proc = Proc::start(
        "nginx",
        Command::new("nginx").arg("-c").arg(&conf),
        &s.dir.join("nginx.log"),
    )?;
    wait_serving(&mut proc, p.h1)?;
    Ok(proc)
}

fn start_haproxy(s: &Setup, routes: usize, p: Ports) -> Result<Proc> {
    l7::write(&s.dir, "tls.pem", &format!("{}{}", s.cert.0, s.cert.1))?;
    let hosts: String = (0..routes).map(|i| l7::host(i) + "\n").collect();
    l7::write(&s.dir, "hosts.lst", &hosts)?;
    let conf = l7::write(
        &s.dir,
        "haproxy.cfg",
        &l7::haproxy_conf(&s.dir, &s.backends, p),
    )?;
    let mut proc = Proc::start(
        "haproxy",
        Command::new("haproxy").arg("-db").arg("-f").arg(&conf),
        &s.dir.join("haproxy.log"),
    )?;
    wait_serving(&mut proc, p.h1)?;
    Ok(proc)
}

/// One load point.
#[derive(Debug, Clone, Copy)]
struct Point {
    h2: bool,
    tls: bool,
    conns: usize,
}

impl std::fmt::Display for Point {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let proto = if self.h2 { "h2" } else { "h1" };
        write!(
            f,
            "{proto} {} c={}",
            if self.tls { "tls" } else { "plain" },
            self.conns
        )
    }
}

/// What one run measured.
#[derive(Debug, Clone, Copy)]
struct Run {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_ms_per_1k: f64,
}

/// One h2load run against `port` of a proxy.
fn load(dir: &Path, proxy: &Proc, ports: Ports, pt: Point, secs: u64) -> Result<Run> {
    let port = match (pt.tls, pt.h2) {
        (true, _) => ports.tls,
        (false, true) => ports.h2c,
        (false, false) => ports.h1,
    };
    let route = l7::host(1);
    let scheme = if pt.tls { "https" } else { "http" };
    let log = dir.join("h2load.log");
    let _ = std::fs::remove_file(&log);
    let mut cmd = Command::new("h2load");
    cmd.arg(format!("{scheme}://{route}:{port}/api/x"))
        .arg(format!("--connect-to=127.0.0.1:{port}"))
        .args([
            "-t",
            "1",
            "-m",
            "1",
            "-c",
            &pt.conns.to_string(),
            "-D",
            &secs.to_string(),
            "--warm-up-time=1",
        ])
        .arg(format!("--log-file={}", log.display()));
    if !pt.h2 {
        cmd.arg("--h1");
    }
    let cpu0 = proxy.cpu_seconds();
    let o = cmd.output().context("running h2load")?;
    let cpu = proxy.cpu_seconds() - cpu0;
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let done = field(&out, "requests: ", "succeeded, ")?;
    let failed = field(&out, "succeeded, ", "failed, ")?;
    let rps = out
        .split(" req/s")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok());
    // Every answer a 2xx: no other class counted. (Not "2xx == done":
    // h2load can count a request done whose status it did not record as
    // the run stops; that is not an error answer.)
    let codes_ok = out.contains("status codes: ")
        && field(&out, "2xx, ", "3xx")? == 0.0
        && field(&out, "3xx, ", "4xx")? == 0.0
        && field(&out, "4xx, ", "5xx")? == 0.0;
    if failed > 0.0 || !codes_ok || done == 0.0 {
        bail!(
            "{} at {pt}: {failed} failed, not all 2xx:\n{out}",
            proxy.name
        );
    }
    let mut lat: Vec<u64> = std::fs::read_to_string(&log)?
        .lines()
        .filter_map(|l| l.split('\t').nth(2)?.parse().ok())
        .collect();
    lat.sort_unstable();
    let q = |f: f64| {
        lat.get(((lat.len() as f64 * f) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0) as f64
            / 1000.0
    };
    Ok(Run {
        rps: rps.unwrap_or(0.0),
        p50_ms: q(0.50),
        p99_ms: q(0.99),
        cpu_ms_per_1k: cpu * 1000.0 / done * 1000.0,
    })
}

/// The number between `before` and `after` in h2load's summary.
fn field(out: &str, before: &str, after: &str) -> Result<f64> {
    let rest = out
        .split(before)
        .nth(1)
        .with_context(|| format!("no {before:?} in h2load's output:\n{out}"))?;
    let v = rest
        .split(after)
        .next()
        .unwrap_or("")
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or("")
        .replace(',', "");
    v.parse().with_context(|| format!("{before:?}: {v:?}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
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
    let tmp = tempfile::tempdir()?;
    let s = Setup {
        dir: tmp.path().to_path_buf(),
        backends: l7::ok_backends(&rt, 2)?,
        cert: l7::certificate()?,
    };
    let names = ["podnet", "nginx", "haproxy"];
    let ports = [ports()?, ports()?, ports()?];
    let ports = [
        Ports {
            h2c: ports[0].h1,
            ..ports[0]
        },
        ports[1],
        ports[2],
    ];
    let procs = [
        start_podnet(&s, &exe, a.routes, ports[0])?,
        start_nginx(&s, a.routes, ports[1])?,
        start_haproxy(&s, a.routes, ports[2])?,
    ];
    println!(
        "gateway-bench: {} routes, {} rounds of {} s per point, proxies alternating; medians",
        a.routes, a.rounds, a.seconds
    );
    println!(
        "{:<16} {:>8} {:>10} {:>8} {:>8} {:>10} {:>8}",
        "point", "proxy", "req/s", "p50 ms", "p99 ms", "cpu ms/1k", "vs nginx"
    );
    for h2 in [false, true] {
        for tls in [false, true] {
            for &conns in &a.conns {
                let pt = Point { h2, tls, conns };
                let mut runs: [Vec<Run>; 3] = Default::default();
                for round in 0..a.rounds {
                    for k in 0..3 {
                        let i = (k + round) % 3;
                        podnet_bench::check_interrupted()?;
                        runs[i].push(load(&s.dir, &procs[i], ports[i], pt, a.seconds)?);
                    }
                }
                report(pt, &names, &runs);
            }
        }
    }
    drop(procs);
    if a.memory_routes > 0 {
        memory(&s, &exe, a.memory_routes)?;
    }
    Ok(())
}

fn report(pt: Point, names: &[&str; 3], runs: &[Vec<Run>; 3]) {
    let med = |i: usize, f: fn(&Run) -> f64| median(runs[i].iter().map(f).collect());
    let nginx_rps = med(1, |r| r.rps);
    for (i, name) in names.iter().enumerate() {
        println!(
            "{:<16} {:>8} {:>10.0} {:>8.3} {:>8.3} {:>10.1} {:>7.2}x",
            pt.to_string(),
            name,
            med(i, |r| r.rps),
            med(i, |r| r.p50_ms),
            med(i, |r| r.p99_ms),
            med(i, |r| r.cpu_ms_per_1k),
            med(i, |r| r.rps) / nginx_rps
        );
    }
}

/// Resident memory with `routes` routes, each proxy after a few requests.
fn memory(s: &Setup, exe: &Path, routes: usize) -> Result<()> {
    let p = ports()?;
    let mut out = Vec::new();
    for name in ["podnet", "nginx", "haproxy"] {
        let t0 = std::time::Instant::now();
        let proc = match name {
            "podnet" => start_podnet(s, exe, routes, Ports { h2c: p.h1, ..p })?,
            "nginx" => start_nginx(s, routes, p)?,
            _ => start_haproxy(s, routes, p)?,
        };
        let ready = t0.elapsed();
        out.push((name, proc.rss_mib(), ready));
    }
    for (name, rss, ready) in out {
        println!("memory at {routes} routes: {name:>8} {rss:>8.1} MiB resident (processes summed), serving {:.1} s after start", ready.as_secs_f64());
    }
    Ok(())
}
