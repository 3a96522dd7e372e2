//! DNS benchmark: `dnsperf` against `podnet dns` and against unbound serving
//! the same Service A records as local-data, on this machine, in one run:
//! one server thread each, then all threads. Random names from the set.
//!
//! Targets (issue 6): podnet ≥ 1.0× unbound's qps at one thread, p99 ≤ 1 ms,
//! memory ≤ 50 MB at 10,000 Services and 50,000 endpoints. This is the
//! unbound comparison (static local-data, no Kubernetes API): CoreDNS's
//! published figure (~17k qps per core) is printed beside ours only as a
//! published figure; `coredns-bench` measures the real CoreDNS.

use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use podnet_store::{Op, Store};

/// CoreDNS's published throughput per core for cluster names.
const COREDNS_QPS_PER_CORE: f64 = 17_000.0;

#[derive(Parser)]
struct Args {
    /// The podnet binary (default: target/release/podnet).
    #[arg(long, default_value = "target/release/podnet")]
    podnet: PathBuf,
    /// Seconds per dnsperf run.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    #[arg(long, default_value_t = 10_000)]
    services: usize,
    /// Endpoints per Service, in EndpointSlices (loaded, not queried).
    #[arg(long, default_value_t = 5)]
    endpoints: usize,
    /// Queries dnsperf keeps in flight.
    #[arg(long, default_value_t = 100)]
    outstanding: usize,
    /// Threads for the "all threads" runs (default: the number of cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Offered load (queries/s) of the latency runs: p50/p99 are measured
    /// below saturation, where a closed loop's queueing does not dominate.
    #[arg(long, default_value_t = 20_000)]
    latency_qps: u64,
}

fn svc_ip(i: usize) -> String {
    // 10.96.0.0/12 above the static band: 10.100.x.y.
    format!(
        "10.{}.{}.{}",
        100 + i / 65_000,
        (i / 250) % 256,
        i % 250 + 1
    )
}

fn svc_name(i: usize) -> String {
    format!("svc-{i}.bench.svc.cluster.local")
}

/// Writes Services and EndpointSlices straight into a fresh sqlite store.
async fn fill_store(url: &str, services: usize, eps: usize) -> Result<()> {
    let s = podnet_store::open(url).await?;
    let mut ops = Vec::new();
    for i in 0..services {
        let svc = serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("svc-{i}"), "namespace": "bench"},
            "spec": {"clusterIP": svc_ip(i), "clusterIPs": [svc_ip(i)],
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}});
        let endpoints: Vec<serde_json::Value> = (0..eps)
            .map(|e| {
                let n = i * eps + e;
                serde_json::json!({"addresses": [format!("10.244.{}.{}", n / 250 % 256, n % 250 + 1)],
                    "conditions": {"ready": true}, "nodeName": "node1"})
            })
            .collect();
        let slice = serde_json::json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("svc-{i}-abc"), "namespace": "bench",
                         "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
            "addressType": "IPv4", "endpoints": endpoints,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]});
        for v in [svc, slice] {
            let o = podnet_api::Object::from_value(v)?;
            ops.push(Op::Put {
                key: o.key(),
                value: podnet_store::objects::encode(&o),
                lease: 0,
            });
        }
        if ops.len() >= 1000 {
            s.txn(std::mem::take(&mut ops)).await?;
        }
    }
    if !ops.is_empty() {
        s.txn(ops).await?;
    }
    Ok(())
}

/// dnsperf's input: random names from the set (it loops over the file).
fn query_file(path: &Path, services: usize) -> Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..200_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        writeln!(f, "{} A", svc_name(x as usize % services))?;
    }
    Ok(())
}

fn unbound_conf(path: &Path, port: u16, threads: usize, services: usize) -> Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(
        f,
        "server:\n  interface: 127.0.0.1\n  port: {port}\n  num-threads: {threads}\n  \
         do-daemonize: no\n  chroot: \"\"\n  username: \"\"\n  pidfile: \"\"\n  \
         use-syslog: no\n  logfile: \"\"\n  verbosity: 0\n  do-ip6: no\n  so-reuseport: yes\n  \
         access-control: 127.0.0.0/8 allow\n  num-queries-per-thread: 4096\n  \
         so-rcvbuf: 8m\n  so-sndbuf: 8m\n  local-zone: \"cluster.local.\" static"
    )?;
    for i in 0..services {
        writeln!(f, "  local-data: \"{}. 5 IN A {}\"", svc_name(i), svc_ip(i))?;
    }
    Ok(())
}

fn free_port() -> Result<u16> {
    let u = UdpSocket::bind("127.0.0.1:0")?;
    let t = std::net::TcpListener::bind(u.local_addr()?)?;
    Ok(t.local_addr()?.port())
}

/// Waits until `addr` answers the last Service's name with an address.
fn wait_answers(addr: SocketAddr, name: &str, child: &mut Child) -> Result<()> {
    let c = podnet_dns::client::Client {
        timeout: Duration::from_millis(200),
        ..podnet_dns::client::Client::new(addr)
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(m) = c.udp(name, podnet_dns::wire::TYPE_A) {
            if !m.answers.is_empty() {
                return Ok(());
            }
        }
        if let Some(st) = child.try_wait()? {
            bail!("server exited early: {st}");
        }
        if Instant::now() > deadline {
            bail!("{addr} never answered {name}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Run {
    qps: f64,
    avg_ms: f64,
    lost: f64,
}

/// dnsperf against 127.0.0.1:`port` with names from `file`, for `secs`,
/// with `threads` threads and as many client sockets.
fn dnsperf_cmd(port: u16, file: &Path, secs: u64, threads: usize) -> Command {
    let mut c = Command::new("dnsperf");
    c.args(["-s", "127.0.0.1", "-p", &port.to_string(), "-d"])
        .arg(file)
        .args([
            "-l",
            &secs.to_string(),
            "-T",
            &threads.to_string(),
            "-c",
            &threads.to_string(),
        ]);
    c
}

fn dnsperf(port: u16, file: &Path, secs: u64, threads: usize, outstanding: usize) -> Result<Run> {
    let out = dnsperf_cmd(port, file, secs, threads)
        .args(["-q", &outstanding.to_string()])
        .output()
        .context("running dnsperf (apt-get install dnsperf)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    };
    let (Some(qps), Some(avg)) = (field("Queries per second:"), field("Average Latency (s):"))
    else {
        bail!("unexpected dnsperf output:\n{text}");
    };
    let lost = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Queries lost:"))
        .and_then(|v| v.split_whitespace().nth(1))
        .map(|p| p.trim_matches(|c| c == '(' || c == ')' || c == '%'))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0.0);
    Ok(Run {
        qps,
        avg_ms: avg * 1000.0,
        lost,
    })
}

/// p50/p99 (ms) from dnsperf's per-query report (`-v`) at `qps` offered.
fn latency(port: u16, file: &Path, secs: u64, threads: usize, qps: u64) -> Result<(f64, f64)> {
    let out = dnsperf_cmd(port, file, secs, threads)
        .args(["-v", "-Q", &qps.to_string()])
        .stderr(Stdio::null())
        .output()?;
    let mut v: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("> "))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    if v.is_empty() {
        bail!("dnsperf -v reported no latencies");
    }
    v.sort_by(|a, b| a.partial_cmp(b).expect("numbers"));
    let p = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize] * 1000.0;
    Ok((p(0.5), p(0.99)))
}

struct Server {
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) of our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_podnet(a: &Args, url: &str, port: u16, threads: usize, dir: &Path) -> Result<Server> {
    let log = std::fs::File::create(dir.join(format!("podnet-{threads}.log")))?;
    let child = Command::new(&a.podnet)
        .args([
            "--store",
            url,
            "dns",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--metrics-addr",
            "127.0.0.1:0",
            "--upstream",
            "127.0.0.1:9",
            "--threads",
            &threads.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", a.podnet.display()))?;
    Ok(Server { child })
}

fn start_unbound(conf: &Path, dir: &Path, threads: usize) -> Result<Server> {
    let log = std::fs::File::create(dir.join(format!("unbound-{threads}.log")))?;
    let child = Command::new("unbound")
        .args(["-d", "-c"])
        .arg(conf)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting unbound (apt-get install unbound)")?;
    Ok(Server { child })
}

/// One thread count's figures: podnet's saturation run and p50/p99, then
/// unbound's, then unbound's RSS.
type Row = (usize, Run, f64, f64, Run, f64, f64, f64);

/// What podnet's memory looked like at one thread: (RSS after loading, peak,
/// load seconds) and (RssAnon, RssFile after loading, RSS after the runs).
type Memory = ((f64, f64, f64), (f64, f64, f64));

/// Loads the Services and EndpointSlices into the sqlite store both
/// servers' runs start from, and says how long that took.
fn load_store(a: &Args, url: &str) -> Result<()> {
    let t = Instant::now();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(fill_store(url, a.services, a.endpoints))?;
    println!(
        "store: {} Services, {} endpoints written in {:.1}s",
        a.services,
        a.services * a.endpoints,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// podnet dns's turn at `threads` threads: started on a free port, loaded,
/// then saturated and latency-measured; its memory is kept only for the
/// one-thread turn, the one the targets are about.
fn bench_podnet(
    a: &Args,
    url: &str,
    dir: &Path,
    queries: &Path,
    last: &str,
    threads: usize,
) -> Result<(Run, f64, f64, Option<Memory>)> {
    let port = free_port()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let t = Instant::now();
    let mut p = start_podnet(a, url, port, threads, dir)?;
    wait_answers(addr, last, &mut p.child)?;
    let load = t.elapsed().as_secs_f64();
    let rss = podnet_bench::proc_status_mib(p.child.id(), "VmRSS:");
    let (anon, file) = (
        podnet_bench::proc_status_mib(p.child.id(), "RssAnon:"),
        podnet_bench::proc_status_mib(p.child.id(), "RssFile:"),
    );
    let ours = dnsperf(port, queries, a.seconds, threads, a.outstanding)?;
    let (p50, p99) = latency(port, queries, a.seconds.min(5), threads, a.latency_qps)?;
    let hwm = podnet_bench::proc_status_mib(p.child.id(), "VmHWM:");
    let memory = if threads == 1 {
        Some((
            (rss, hwm, load),
            (
                anon,
                file,
                podnet_bench::proc_status_mib(p.child.id(), "VmRSS:"),
            ),
        ))
    } else {
        None
    };
    drop(p);
    Ok((ours, p50, p99, memory))
}

/// unbound's turn at `threads` threads, serving the same records as
/// local-data: the same runs as podnet's, plus its RSS once loaded.
fn bench_unbound(
    a: &Args,
    dir: &Path,
    queries: &Path,
    last: &str,
    threads: usize,
) -> Result<(Run, f64, f64, f64)> {
    let port = free_port()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let conf = dir.join(format!("unbound-{threads}.conf"));
    unbound_conf(&conf, port, threads, a.services)?;
    let mut u = start_unbound(&conf, dir, threads)?;
    wait_answers(addr, last, &mut u.child)?;
    let uss = podnet_bench::proc_status_mib(u.child.id(), "VmRSS:");
    let theirs = dnsperf(port, queries, a.seconds, threads, a.outstanding)?;
    let (up50, up99) = latency(port, queries, a.seconds.min(5), threads, a.latency_qps)?;
    drop(u);
    Ok((theirs, up50, up99, uss))
}

/// The comparison table, one row per thread count, then the one-thread
/// figures against the targets and podnet's memory.
fn print_report(a: &Args, rows: &[Row], memory: (f64, f64, f64), mem_split: (f64, f64, f64)) {
    println!(
        "\n{} Services ({} endpoints), {} s per run, random names; qps and avg latency at \
         saturation (dnsperf -q {}, closed loop); p50/p99 at {} queries/s offered",
        a.services,
        a.services * a.endpoints,
        a.seconds,
        a.outstanding,
        a.latency_qps
    );
    println!(
        "{:<8} {:>12} {:>12} {:>7} {:>24} {:>24}",
        "threads",
        "podnet qps",
        "unbound qps",
        "ratio",
        "podnet avg | p50/p99 ms",
        "unbound avg | p50/p99 ms"
    );
    for (threads, ours, p50, p99, theirs, up50, up99, _) in rows {
        println!(
            "{:<8} {:>12.0} {:>12.0} {:>6.2}× {:>24} {:>24}",
            threads,
            ours.qps,
            theirs.qps,
            ours.qps / theirs.qps,
            format!("{:.3} | {:.3}/{:.3}", ours.avg_ms, p50, p99),
            format!("{:.3} | {:.3}/{:.3}", theirs.avg_ms, up50, up99),
        );
        if ours.lost > 0.0 || theirs.lost > 0.0 {
            println!(
                "         lost: podnet {}%, unbound {}%",
                ours.lost, theirs.lost
            );
        }
    }
    let one = &rows[0];
    println!(
        "\nat one thread: podnet {:.0} qps = {:.2}× unbound (target ≥ 1.0×), {:.1}× CoreDNS's published ~{:.0}k qps per core (a published figure, not measured here: see coredns-bench)",
        one.1.qps,
        one.1.qps / one.4.qps,
        one.1.qps / COREDNS_QPS_PER_CORE,
        COREDNS_QPS_PER_CORE / 1000.0
    );
    println!(
        "p99 at one thread, {} queries/s: podnet {:.3} ms (target ≤ 1 ms), unbound {:.3} ms",
        a.latency_qps, one.3, one.6
    );
    println!(
        "memory: podnet dns RSS {:.1} MB after loading (peak {:.1} MB, target ≤ 50 MB; loaded in {:.1}s); unbound RSS {:.1} MB",
        memory.0, memory.1, memory.2, one.7
    );
    println!(
        "  of which after loading: {:.1} MB heap and stacks (RssAnon), {:.1} MB the binary's and libraries' pages (RssFile); RSS after the query runs {:.1} MB",
        mem_split.0, mem_split.1, mem_split.2
    );
}

fn main() -> Result<()> {
    let a = Args::parse();
    let all = a.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let dir = tempfile::Builder::new().prefix("pn-dns-bench").tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("state.db").display());
    load_store(&a, &url)?;
    let queries = dir.path().join("queries.txt");
    query_file(&queries, a.services)?;
    let last = svc_name(a.services - 1);
    let mut rows = Vec::new();
    let mut memory = (0.0, 0.0, 0.0);
    let mut mem_split = (0.0, 0.0, 0.0);
    for threads in [1, all] {
        let (ours, p50, p99, mem) = bench_podnet(&a, &url, dir.path(), &queries, &last, threads)?;
        if let Some((m, split)) = mem {
            memory = m;
            mem_split = split;
        }
        let (theirs, up50, up99, uss) = bench_unbound(&a, dir.path(), &queries, &last, threads)?;
        rows.push((threads, ours, p50, p99, theirs, up50, up99, uss));
    }
    print_report(&a, &rows, memory, mem_split);
    Ok(())
}
