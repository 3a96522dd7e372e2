//! coredns-bench: `podnet dns` against the real CoreDNS (issue 16), both
//! reading the same real kube-apiserver, in one run.
//!
//! This file owns the comparison and nothing else: the control plane is the
//! lab's (`podnet_lab::kube::ControlPlane`: etcd, kube-apiserver and
//! kube-controller-manager on loopback), CoreDNS is what
//! `scripts/coredns.sh` builds from Go modules, and it runs with the default
//! kubeadm Corefile ([`podnet_lab::coredns::Corefile`]), only its ports
//! moved to free loopback ones and `forward` pointed at a stub upstream in
//! this process, which both servers share, so no query leaves the machine. podnet runs with the same settings where it has them
//! (`--ttl 30 --pods-insecure --upstream <stub>`).
//!
//! It creates `--services` ClusterIP Services through the API, then, per
//! CPU configuration (server confined to CPU 0 with dnsperf on CPU 1; then
//! both CPUs shared by server and dnsperf), runs both servers side by side
//! and, in alternating rounds, measures:
//! - qps at saturation with `dnsperf` over random names of the Services;
//! - p50/p99 at a fixed offered load (`dnsperf -Q`, per-query latencies);
//! - resident memory (VmRSS, VmHWM, RssAnon) after loading and after the runs.
//!
//! Once, in the one-CPU configuration, it also measures the time from a
//! Service's create until each server knows the name (polled with a fresh
//! query type each time, which no cache can answer), and until an A query
//! gets its ClusterIP (a client's view, CoreDNS's cache included).
//! Everything it starts is stopped at the end, also on error. The answers
//! themselves are compared by the differential test
//! `podnet/tests/coredns_diff.rs`, which runs CoreDNS the same way
//! ([`podnet_lab::coredns`]).

use std::io::Write;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use futures::stream::{self, StreamExt, TryStreamExt};
use kube::api::{Api, PostParams};
use podnet_api::k8s_openapi::api::core::v1::{Namespace, Service, ServicePort, ServiceSpec};
use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use podnet_bench::objects::cluster_ip;
use podnet_daemon::HttpGet;
use podnet_dns::client::Client as DnsClient;
use podnet_dns::wire::{self, RData};

#[derive(Parser)]
#[command(about = "podnet dns against the real CoreDNS on a real kube-apiserver")]
struct Args {
    /// The podnet binary.
    #[arg(long, default_value = "target/release/podnet")]
    podnet: PathBuf,
    /// The CoreDNS binary (default: $COREDNS, else what scripts/coredns.sh
    /// has cached; it is not built behind your back).
    #[arg(long)]
    coredns: Option<PathBuf>,
    #[arg(long, default_value_t = 10_000)]
    services: usize,
    /// Alternating rounds per CPU configuration (medians are printed).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds per saturation run.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Offered load (queries/s) of the latency runs.
    #[arg(long, default_value_t = 10_000)]
    latency_qps: u64,
    /// Seconds per latency run.
    #[arg(long, default_value_t = 5)]
    latency_seconds: u64,
    /// Queries dnsperf keeps in flight at saturation.
    #[arg(long, default_value_t = 100)]
    outstanding: usize,
    /// Services created one at a time for the "knows the name" latency.
    #[arg(long, default_value_t = 20)]
    creates: usize,
    /// Services created one at a time for the "A answered" latency (each
    /// may take CoreDNS's negative-cache TTL, 30 s).
    #[arg(long, default_value_t = 3)]
    client_creates: usize,
    /// API requests in flight while filling.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
}

const NS: &str = "bench";
const ZONE: &str = "cluster.local";

// ---------------------------------------------------------------- objects

fn meta(name: &str, ns: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        ..Default::default()
    }
}

fn port(name: &str, port: i32, proto: &str) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        protocol: Some(proto.into()),
        ..Default::default()
    }
}

fn cluster_ip_service(name: &str, ns: &str, ports: Vec<ServicePort>) -> Service {
    Service {
        metadata: meta(name, ns),
        spec: Some(ServiceSpec {
            ports: Some(ports),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn svc_fqdn(name: &str, ns: &str) -> String {
    format!("{name}.{ns}.svc.{ZONE}")
}

// ---------------------------------------------------------------- processes

/// A server process, stopped (SIGTERM, then SIGKILL) when dropped.
struct Proc {
    name: &'static str,
    child: Child,
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn check(&mut self, log: &Path) -> Result<()> {
        if let Some(st) = self.child.try_wait()? {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            bail!(
                "{} exited ({st}); the end of {}:\n{}",
                self.name,
                log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SAFETY: kill(2) of our own child, which has not been reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        // CoreDNS's health plugin holds the lameduck (5 s) before exiting.
        let deadline = Instant::now() + Duration::from_secs(8);
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

/// Stops the control plane on every way out.
struct PlaneGuard(podnet_lab::kube::ControlPlane);

impl Drop for PlaneGuard {
    fn drop(&mut self) {
        for line in self.0.stop() {
            eprintln!("coredns-bench: {line}");
        }
    }
}

/// `taskset -c CPUS prog` when pinned, else `prog`.
fn pinned(prog: &Path, cpus: Option<&str>) -> Command {
    match cpus {
        Some(c) => {
            let mut cmd = Command::new("taskset");
            cmd.args(["-c", c]).arg(prog);
            cmd
        }
        None => Command::new(prog),
    }
}

/// A loopback port free for both UDP and TCP (a few tries: the TCP side
/// of a free UDP port may be taken).
fn free_port() -> Result<u16> {
    let mut last = None;
    for _ in 0..20 {
        let u = UdpSocket::bind("127.0.0.1:0")?;
        match std::net::TcpListener::bind(u.local_addr()?) {
            Ok(t) => return Ok(t.local_addr()?.port()),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("tried")).context("no loopback port free for both UDP and TCP")
}

/// The status line of `GET path` on 127.0.0.1:port says 200.
fn http_ok(port: u16, path: &str) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    HttpGet::new(Duration::from_secs(2))
        .connect_timeout(Duration::from_millis(200))
        .get(addr, path)
        .is_ok_and(|r| r.status == 200)
}

/// One server under test: its DNS port, readiness endpoint and process.
struct Server {
    name: &'static str,
    port: u16,
    ready_port: u16,
    ready_path: &'static str,
    log: PathBuf,
    proc: Proc,
}

impl Server {
    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// (VmRSS, VmHWM, RssAnon) in MiB.
    fn memory(&self) -> (f64, f64, f64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.proc.pid()))
            .unwrap_or_default();
        let kb = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
                .map(|kb| kb / 1024.0)
                .unwrap_or(0.0)
        };
        (kb("VmRSS:"), kb("VmHWM:"), kb("RssAnon:"))
    }
}

struct Setup<'a> {
    a: &'a Args,
    coredns: &'a Path,
    kubeconfig: &'a Path,
    upstream: SocketAddr,
    dir: &'a Path,
}

fn start_coredns(s: &Setup, cpus: Option<&str>, tag: &str) -> Result<Server> {
    let (port, health, ready, prom) = (free_port()?, free_port()?, free_port()?, free_port()?);
    let conf = s.dir.join(format!("Corefile-{tag}"));
    let text = podnet_lab::coredns::Corefile {
        port,
        health,
        ready,
        prometheus: prom,
        zone: ZONE,
        kubeconfig: s.kubeconfig,
        context: "podnet-lab",
        upstream: s.upstream,
    }
    .text();
    std::fs::write(&conf, text)?;
    let log = s.dir.join(format!("coredns-{tag}.log"));
    let out = std::fs::File::create(&log)?;
    let child = pinned(s.coredns, cpus)
        .arg("-conf")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("starting {}", s.coredns.display()))?;
    Ok(Server {
        name: "coredns",
        port,
        ready_port: ready,
        ready_path: "/ready",
        log,
        proc: Proc {
            name: "coredns",
            child,
        },
    })
}

fn start_podnet(s: &Setup, cpus: Option<&str>, threads: usize, tag: &str) -> Result<Server> {
    let (port, metrics) = (free_port()?, free_port()?);
    let log = s.dir.join(format!("podnet-{tag}.log"));
    let child = pinned(&s.a.podnet, cpus)
        .arg("dns")
        .arg("--kubeconfig")
        .arg(s.kubeconfig)
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--metrics-addr",
            &format!("127.0.0.1:{metrics}"),
            "--upstream",
            &s.upstream.to_string(),
            "--threads",
            &threads.to_string(),
            "--ttl",
            "30",
            "--pods-insecure",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| format!("starting {}", s.a.podnet.display()))?;
    Ok(Server {
        name: "podnet",
        port,
        ready_port: metrics,
        ready_path: "/readyz",
        log,
        proc: Proc {
            name: "podnet",
            child,
        },
    })
}

/// Polls readiness, then until `name` has an A answer; returns the time
/// since `t0`.
fn wait_ready(srv: &mut Server, name: &str, t0: Instant) -> Result<Duration> {
    let deadline = Instant::now() + Duration::from_secs(180);
    let c = DnsClient {
        timeout: Duration::from_millis(300),
        ..DnsClient::new(srv.addr())
    };
    loop {
        srv.proc.check(&srv.log)?;
        if http_ok(srv.ready_port, srv.ready_path)
            && c.udp(name, wire::TYPE_A)
                .is_ok_and(|m| !m.answers.is_empty())
        {
            return Ok(t0.elapsed());
        }
        if Instant::now() > deadline {
            bail!(
                "{} not ready (GET {} on port {}, then {name} A) after 180 s; see {}",
                srv.name,
                srv.ready_path,
                srv.ready_port,
                srv.log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------- the stub upstream

/// A UDP resolver on loopback for what both servers forward: it answers
/// `example.com A` with 192.0.2.1 (TTL 60), NODATA for its other types and
/// NXDOMAIN for everything else.
fn stub_upstream() -> Result<SocketAddr> {
    let s = UdpSocket::bind("127.0.0.1:0")?;
    let addr = s.local_addr()?;
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok((n, from)) = s.recv_from(&mut buf) {
            if let Some(r) = stub_answer(&buf[..n]) {
                let _ = s.send_to(&r, from);
            }
        }
    });
    Ok(addr)
}

fn stub_answer(q: &[u8]) -> Option<Vec<u8>> {
    let mut p = 12;
    loop {
        let l = *q.get(p)? as usize;
        p += 1;
        if l == 0 {
            break;
        }
        if l & 0xc0 != 0 {
            return None;
        }
        p += l;
    }
    let qend = p + 4;
    if q.len() < qend {
        return None;
    }
    let name = q[12..p].to_ascii_lowercase();
    let qtype = u16::from_be_bytes([q[p], q[p + 1]]);
    let hit = name == b"\x07example\x03com\x00";
    let mut r = q[..qend].to_vec();
    r[2] = 0x80 | (q[2] & 0x01); // QR, RD copied
    r[3] = 0x80 | if hit { 0 } else { 3 }; // RA, NOERROR or NXDOMAIN
    r[4..12].copy_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    if hit && qtype == wire::TYPE_A {
        r[7] = 1;
        r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 1]);
    }
    Some(r)
}

// ---------------------------------------------------------------- dnsperf

fn query_file(path: &Path, services: usize) -> Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..200_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        writeln!(
            f,
            "{} A",
            svc_fqdn(&format!("svc-{}", x as usize % services), NS)
        )?;
    }
    Ok(())
}

fn dnsperf_cmd(port: u16, file: &Path, secs: u64, threads: usize, cpus: Option<&str>) -> Command {
    let mut c = pinned(Path::new("dnsperf"), cpus);
    c.args(["-s", "127.0.0.1", "-p", &port.to_string(), "-d"])
        .arg(file)
        .args([
            "-l",
            &secs.to_string(),
            "-T",
            &threads.to_string(),
            "-c",
            &threads.to_string(),
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// (qps, lost %) at saturation.
fn saturate(
    port: u16,
    file: &Path,
    a: &Args,
    threads: usize,
    cpus: Option<&str>,
) -> Result<(f64, f64)> {
    let out = dnsperf_cmd(port, file, a.seconds, threads, cpus)
        .args(["-q", &a.outstanding.to_string()])
        .output()
        .context("running dnsperf (apt-get install dnsperf)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let qps = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Queries per second:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok());
    let Some(qps) = qps else {
        bail!("unexpected dnsperf output:\n{text}");
    };
    let lost = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Queries lost:"))
        .and_then(|v| v.split_whitespace().nth(1))
        .map(|p| p.trim_matches(|c| c == '(' || c == ')' || c == '%'))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0.0);
    Ok((qps, lost))
}

/// (p50, p99, answered) in ms from dnsperf's per-query lines at a fixed load.
fn latency(
    port: u16,
    file: &Path,
    a: &Args,
    threads: usize,
    cpus: Option<&str>,
) -> Result<(f64, f64, usize)> {
    let out = dnsperf_cmd(port, file, a.latency_seconds, threads, cpus)
        .args(["-v", "-Q", &a.latency_qps.to_string()])
        .output()?;
    let mut v: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("> "))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    if v.is_empty() {
        bail!("dnsperf -v reported no latencies");
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let p = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize] * 1000.0;
    Ok((p(0.5), p(0.99), v.len()))
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// CPU seconds (user + system) `pid` has used so far.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command's ")": state is field 3, utime 14, stime 15.
    let rest: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let tick = |i: usize| {
        rest.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (tick(11) + tick(12)) / hz
}

#[derive(Default)]
struct Figures {
    qps: Vec<f64>,
    /// Server CPU µs per answered query at saturation.
    cpu_us: Vec<f64>,
    /// Server CPU used during the fixed-load runs, in cores.
    cpu_at_load: Vec<f64>,
    lost: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
    load_s: f64,
    mem_loaded: (f64, f64, f64),
    mem_after: (f64, f64, f64),
}

// ---------------------------------------------------------------- name latency

/// Time from the create's POST until each server answers for the new
/// name. `probe`: a fresh private query type per poll, NOERROR (NODATA)
/// once the server knows the name, NXDOMAIN before (no cache holds an
/// answer to it); else A until the ClusterIP comes back, as a client
/// polls (CoreDNS's cache may hold the NXDOMAIN it gave first).
fn name_latency(
    rt: &tokio::runtime::Runtime,
    svcs: &Api<Service>,
    servers: &[&Server],
    i: usize,
    probe: bool,
    qtype: &mut u16,
) -> Result<(f64, Vec<f64>)> {
    let name = format!("new-{i}");
    let fqdn = svc_fqdn(&name, NS);
    let t = Instant::now();
    let s = rt.block_on(svcs.create(
        &PostParams::default(),
        &cluster_ip_service(&name, NS, vec![port("http", 80, "TCP")]),
    ))?;
    let api = t.elapsed().as_secs_f64() * 1000.0;
    let ip = cluster_ip(&s)?;
    let timeout = if probe { 10 } else { 45 };
    let clients: Vec<DnsClient> = servers
        .iter()
        .map(|s| DnsClient {
            timeout: Duration::from_millis(500),
            ..DnsClient::new(s.addr())
        })
        .collect();
    let mut done: Vec<Option<f64>> = vec![None; servers.len()];
    let mut round = 0usize;
    while done.iter().any(Option::is_none) {
        if t.elapsed() > Duration::from_secs(timeout) {
            bail!("{fqdn}: not answered by every server within {timeout} s ({done:?})");
        }
        // Alternate who is asked first.
        for k in 0..servers.len() {
            let j = (k + round) % servers.len();
            if done[j].is_some() {
                continue;
            }
            let ok = if probe {
                *qtype = if *qtype >= 30_000 { 1_000 } else { *qtype + 1 };
                clients[j]
                    .udp(&fqdn, *qtype)
                    .is_ok_and(|m| m.rcode() == wire::NOERROR)
            } else {
                clients[j].udp(&fqdn, wire::TYPE_A).is_ok_and(|m| {
                    m.answers
                        .iter()
                        .any(|r| matches!(r.rdata, RData::A(a) if IpAddr::V4(a) == ip))
                })
            };
            if ok {
                done[j] = Some(t.elapsed().as_secs_f64() * 1000.0);
            }
        }
        round += 1;
        std::thread::sleep(Duration::from_micros(500));
    }
    Ok((
        api,
        done.into_iter().map(|d| d.unwrap_or(f64::NAN)).collect(),
    ))
}

// ---------------------------------------------------------------- main

fn find_coredns(a: &Args) -> Result<PathBuf> {
    match a.coredns.clone() {
        Some(p) => Ok(p),
        None => Ok(podnet_lab::coredns::find()?),
    }
}

struct Config {
    label: &'static str,
    server_cpus: Option<&'static str>,
    perf_cpus: Option<&'static str>,
    threads: usize,
}

/// The name latencies of the pinned pair, per create as [`name_latency`]
/// returns them: the POST's own time, then each server's until it
/// answered for the new name (ms, podnet first).
struct Names {
    /// Polled with fresh query types: when each server knows the name.
    known: Vec<(f64, Vec<f64>)>,
    /// Polled with A: when each answers with the ClusterIP.
    client: Vec<(f64, Vec<f64>)>,
}

/// Creates the bench namespace and `--services` ClusterIP Services through
/// the API, `--concurrency` at a time; returns their API and the fill time
/// in seconds.
fn fill(
    rt: &tokio::runtime::Runtime,
    client: &kube::Client,
    a: &Args,
) -> Result<(Api<Service>, f64)> {
    let nss: Api<Namespace> = Api::all(client.clone());
    let o = Namespace {
        metadata: ObjectMeta {
            name: Some(NS.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    rt.block_on(nss.create(&PostParams::default(), &o))?;
    let svcs: Api<Service> = Api::namespaced(client.clone(), NS);
    let t0 = Instant::now();
    rt.block_on(async {
        stream::iter(0..a.services)
            .map(|i| {
                let svcs = svcs.clone();
                async move {
                    let s =
                        cluster_ip_service(&format!("svc-{i}"), NS, vec![port("http", 80, "TCP")]);
                    svcs.create(&PostParams::default(), &s).await?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(a.concurrency)
            .try_collect::<Vec<()>>()
            .await
    })?;
    let fill = t0.elapsed().as_secs_f64();
    eprintln!(
        "coredns-bench: {} Services created through the API in {fill:.1} s",
        a.services
    );
    Ok((svcs, fill))
}

/// One CPU configuration: starts both servers side by side, times their
/// load, runs the alternating rounds and, given the API (`api`), measures
/// the name latencies on the same pair before both are stopped.
fn measure_config(
    setup: &Setup,
    cfg: &Config,
    queries: &Path,
    last: &str,
    api: Option<(&tokio::runtime::Runtime, &Api<Service>)>,
) -> Result<(Figures, Figures, Option<Names>)> {
    let a = setup.a;
    let tag = format!("{}cpu", cfg.threads);
    let t = Instant::now();
    let mut pn = start_podnet(setup, cfg.server_cpus, cfg.threads, &tag)?;
    let mut cd = start_coredns(setup, cfg.server_cpus, &tag)?;
    let (mut fp, mut fc) = (Figures::default(), Figures::default());
    fp.load_s = wait_ready(&mut pn, last, t)?.as_secs_f64();
    fc.load_s = wait_ready(&mut cd, last, t)?.as_secs_f64();
    fp.mem_loaded = pn.memory();
    fc.mem_loaded = cd.memory();
    eprintln!("coredns-bench: {}: both ready and answering", cfg.label);
    for r in 0..a.rounds {
        let order: [(&Server, &mut Figures); 2] = if r % 2 == 0 {
            [(&pn, &mut fp), (&cd, &mut fc)]
        } else {
            [(&cd, &mut fc), (&pn, &mut fp)]
        };
        for (srv, f) in order {
            measure_server(a, cfg, queries, r, srv, f)?;
        }
    }
    fp.mem_after = pn.memory();
    fc.mem_after = cd.memory();
    let extra = match api {
        Some((rt, svcs)) => Some(name_latencies(a, rt, svcs, &pn, &cd)?),
        None => None,
    };
    drop(pn);
    drop(cd);
    Ok((fp, fc, extra))
}

/// One server's turn in round `r`: saturation, then the fixed load, with
/// the server's CPU read around each, into its figures.
fn measure_server(
    a: &Args,
    cfg: &Config,
    queries: &Path,
    r: usize,
    srv: &Server,
    f: &mut Figures,
) -> Result<()> {
    let c0 = cpu_secs(srv.proc.pid());
    let (q, lost) = saturate(srv.port, queries, a, cfg.threads, cfg.perf_cpus)?;
    let c1 = cpu_secs(srv.proc.pid());
    let (p50, p99, _) = latency(srv.port, queries, a, cfg.threads, cfg.perf_cpus)?;
    let c2 = cpu_secs(srv.proc.pid());
    f.cpu_us.push((c1 - c0) * 1e6 / (q * a.seconds as f64));
    f.cpu_at_load.push((c2 - c1) / a.latency_seconds as f64);
    eprintln!(
        "coredns-bench:   round {} {:<8} {q:>9.0} qps (lost {lost}%), p50 {p50:.3} ms p99 {p99:.3} ms at {} qps",
        r + 1,
        srv.name,
        a.latency_qps
    );
    f.qps.push(q);
    f.lost.push(lost);
    f.p50.push(p50);
    f.p99.push(p99);
    Ok(())
}

/// The name latencies, once, on the pinned pair: `--creates` creates
/// polled with fresh query types ("knows the name"), then
/// `--client-creates` polled with A ("A answered").
fn name_latencies(
    a: &Args,
    rt: &tokio::runtime::Runtime,
    svcs: &Api<Service>,
    pn: &Server,
    cd: &Server,
) -> Result<Names> {
    let mut qtype = 1_000u16;
    let (mut known, mut client) = (Vec::new(), Vec::new());
    for k in 0..a.creates + a.client_creates {
        let probe = k < a.creates;
        let r = name_latency(rt, svcs, &[pn, cd], k, probe, &mut qtype)?;
        if probe {
            known.push(r);
        } else {
            eprintln!(
                "coredns-bench:   A answered after create: podnet {:.1} ms, coredns {:.1} ms",
                r.1[0], r.1[1]
            );
            client.push(r);
        }
    }
    Ok(Names { known, client })
}

/// The report's opening: what was compared, and how.
fn report_header(a: &Args, version: &str, fill: f64) {
    println!(
        "\ncoredns-bench: podnet {} vs {version} (default kubeadm Corefile), one real kube-apiserver, \
         {} Services (+{} measured creates); {} alternating rounds per configuration, medians",
        env!("CARGO_PKG_VERSION"),
        a.services,
        a.creates + a.client_creates,
        a.rounds
    );
    println!(
        "fill: {} Services through the API in {fill:.1} s",
        a.services
    );
    println!(
        "saturation: dnsperf -q {} for {} s over random names of the {} Services; latency: dnsperf -Q {} for {} s",
        a.outstanding, a.seconds, a.services, a.latency_qps, a.latency_seconds
    );
}

/// One CPU configuration's figures, podnet beside CoreDNS.
fn report_config(a: &Args, cfg: &Config, fp: &Figures, fc: &Figures) {
    let (qp, qc) = (median(&fp.qps), median(&fc.qps));
    println!("\n{}:", cfg.label);
    println!(
        "  qps        podnet {qp:>9.0}   coredns {qc:>9.0}   ratio {:.2}×  (rounds: podnet {:?}, coredns {:?})",
        qp / qc,
        fp.qps.iter().map(|q| q.round() as u64).collect::<Vec<_>>(),
        fc.qps.iter().map(|q| q.round() as u64).collect::<Vec<_>>()
    );
    println!(
        "  p50 / p99  podnet {:.3} / {:.3} ms   coredns {:.3} / {:.3} ms   p99 ratio {:.2}× (at {} qps)",
        median(&fp.p50),
        median(&fp.p99),
        median(&fc.p50),
        median(&fc.p99),
        median(&fp.p99) / median(&fc.p99),
        a.latency_qps
    );
    println!(
        "  server CPU per query at saturation: podnet {:.2} µs, coredns {:.2} µs ({:.2}× less); \
         CPU used at {} qps: podnet {:.2} cores, coredns {:.2}",
        median(&fp.cpu_us),
        median(&fc.cpu_us),
        median(&fc.cpu_us) / median(&fp.cpu_us),
        a.latency_qps,
        median(&fp.cpu_at_load),
        median(&fc.cpu_at_load)
    );
    let lost = |f: &Figures| f.lost.iter().cloned().fold(0.0, f64::max);
    if lost(fp) > 0.0 || lost(fc) > 0.0 {
        println!(
            "  most lost at saturation: podnet {}%, coredns {}%",
            lost(fp),
            lost(fc)
        );
    }
    println!(
        "  ready (process start -> /ready and the last name answered): podnet {:.2} s, coredns {:.2} s",
        fp.load_s, fc.load_s
    );
    let m = |x: (f64, f64, f64)| format!("RSS {:.1} MiB (anon {:.1}), peak {:.1}", x.0, x.2, x.1);
    println!(
        "  memory loaded:    podnet {}   coredns {}",
        m(fp.mem_loaded),
        m(fc.mem_loaded)
    );
    println!(
        "  memory after runs: podnet {}   coredns {}",
        m(fp.mem_after),
        m(fc.mem_after)
    );
    println!(
        "  RSS ratio podnet/coredns: {:.2}× loaded, {:.2}× after the runs",
        fp.mem_loaded.0 / fc.mem_loaded.0,
        fp.mem_after.0 / fc.mem_after.0
    );
}

/// The name latencies of the 1-CPU pair: percentiles of "knows the name",
/// then each "A answered" create.
fn report_names(Names { known, client }: &Names) {
    let col = |v: &[(f64, Vec<f64>)], j: usize| v.iter().map(|r| r.1[j]).collect::<Vec<_>>();
    let api: Vec<f64> = known.iter().chain(client).map(|r| r.0).collect();
    println!(
        "\nnew Service name, from the POST (its own p50 {:.1} ms), {} creates, 1-CPU pair:",
        median(&api),
        known.len()
    );
    for (j, who) in ["podnet", "coredns"].iter().enumerate() {
        let v = col(known, j);
        let after: Vec<f64> = known.iter().map(|r| r.1[j] - r.0).collect();
        println!(
            "  {who:<8} knows the name: p50 {:.1} ms  p90 {:.1} ms  max {:.1} ms from the POST sent; \
             p50 {:.1} ms  max {:.1} ms from its answer",
            pct(&v, 0.5),
            pct(&v, 0.9),
            pct(&v, 1.0),
            pct(&after, 0.5),
            pct(&after, 1.0)
        );
    }
    if !client.is_empty() {
        println!(
            "  A polled every ~0.5 ms from the POST's answer (a client's view; caches included), {} creates:",
            client.len()
        );
        for (j, who) in ["podnet", "coredns"].iter().enumerate() {
            let v: Vec<String> = col(client, j).iter().map(|x| format!("{x:.1}")).collect();
            println!("  {who:<8} A answered after: {} ms", v.join(", "));
        }
    }
}

/// The targets, judged on the 1-CPU configuration (podnet, CoreDNS).
fn report_targets(p: &Figures, c: &Figures) {
    println!(
        "\ntargets: qps per core ≥ 3× CoreDNS: {:.2}× ({}); p99 no worse: {:.3} vs {:.3} ms ({}); RSS ≤ 0.5× CoreDNS: {:.2}× ({})",
        median(&p.qps) / median(&c.qps),
        if median(&p.qps) >= 3.0 * median(&c.qps) { "met" } else { "MISSED" },
        median(&p.p99),
        median(&c.p99),
        if median(&p.p99) <= median(&c.p99) { "met" } else { "MISSED" },
        p.mem_after.0 / c.mem_after.0,
        if p.mem_after.0 <= 0.5 * c.mem_after.0 { "met" } else { "MISSED" },
    );
}

fn main() -> Result<()> {
    let a = Args::parse();
    if !a.podnet.exists() {
        bail!(
            "{} not found: cargo build --release -p podnet",
            a.podnet.display()
        );
    }
    let coredns = find_coredns(&a)?;
    let version = Command::new(&coredns).arg("-version").output()?;
    let version = String::from_utf8_lossy(&version.stdout)
        .lines()
        .next()
        .unwrap_or("?")
        .to_string();
    let peers = podnet_lab::kube::Peers::find()?;
    let dir = tempfile::Builder::new()
        .prefix("pn-coredns-bench")
        .tempdir()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;

    let t0 = Instant::now();
    let plane = PlaneGuard(rt.block_on(podnet_lab::kube::ControlPlane::start(dir.path(), &peers))?);
    eprintln!(
        "coredns-bench: control plane up in {:.1} s at {}",
        t0.elapsed().as_secs_f64(),
        plane.0.server()
    );
    let kubeconfig = plane.0.admin_kubeconfig();
    let client = rt.block_on(plane.0.client())?;
    let (svcs, fill) = fill(&rt, &client, &a)?;

    let queries = dir.path().join("queries.txt");
    query_file(&queries, a.services)?;
    let setup = Setup {
        a: &a,
        coredns: &coredns,
        kubeconfig: &kubeconfig,
        upstream: stub_upstream()?,
        dir: dir.path(),
    };
    let last = svc_fqdn(&format!("svc-{}", a.services - 1), NS);
    let configs = [
        Config {
            label: "1 CPU (server on CPU 0, dnsperf on CPU 1, 1 thread each)",
            server_cpus: Some("0"),
            perf_cpus: Some("1"),
            threads: 1,
        },
        Config {
            label: "2 CPUs (server and dnsperf share both, 2 threads each)",
            server_cpus: None,
            perf_cpus: None,
            threads: 2,
        },
    ];
    let mut results: Vec<(usize, Figures, Figures)> = Vec::new();
    let mut extra = None;
    for (ci, cfg) in configs.iter().enumerate() {
        // Name latency, once, on the pinned pair.
        let api = (ci == 0).then_some((&rt, &svcs));
        let (fp, fc, names) = measure_config(&setup, cfg, &queries, &last, api)?;
        if names.is_some() {
            extra = names;
        }
        results.push((ci, fp, fc));
    }

    // ------------------------------------------------------------ report
    report_header(&a, &version, fill);
    for (ci, fp, fc) in &results {
        report_config(&a, &configs[*ci], fp, fc);
    }
    if let Some(names) = extra {
        report_names(&names);
    }
    let r1 = &results[0];
    report_targets(&r1.1, &r1.2);
    drop(plane);
    Ok(())
}
