//! Packets lost on a stream across nodes while agents restart: the bgp
//! backend (graceful restart: the kernel keeps its routes, the peers keep
//! theirs) against vxlan (nothing to re-learn), in one run.
//!
//! Two standalone labs of 3 nodes stand side by side, one per backend,
//! with pod p1 on node1 and p2 on node2. In each lab a UDP stream runs from
//! p1 to an echo in p2 the whole time: one numbered datagram every
//! `--interval-ms`, each echoed back; the program marks which numbers
//! reached p2 and which came back. A round restarts, per lab (which lab
//! goes first alternates), the agents on node1 and node2 the way `podnet
//! lab restart-agent` does (SIGKILL, then a new agent), one right after
//! the other; then waits until both answer `/readyz`, node1's and node2's
//! routes are what they were before and, with bgp, every node's `/bgp`
//! page (`podnet bgp status`) shows each neighbour Established with a
//! route from it, and lets the stream run for `--hold-secs` more. Every datagram sent from the first kill to the end
//! of the hold that did not come back is lost to that restart. A netlink
//! route monitor on the 3 nodes counts pod-CIDR routes deleted meanwhile.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use ipnet::Ipv4Net;
use podnet_bench::rtmon::{self, Change, Monitor, Stamped};
use podnet_bench::{lab_options, ms, up_lab, wait_agent_ready, KeepLogs, LabGuard};
use podnet_kernel::{Handle, Netns};
use podnet_lab::serve::PortSpec;

#[derive(Parser)]
struct Args {
    /// The podnet binary (default: next to this one).
    #[arg(long)]
    podnet: Option<PathBuf>,
    /// Rounds; each restarts node1's and node2's agents once per backend.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Milliseconds between two datagrams of the stream.
    #[arg(long, default_value_t = 2)]
    interval_ms: u64,
    /// Seconds the stream goes on after the agents are ready again.
    #[arg(long, default_value_t = 3)]
    hold_secs: u64,
    /// Keep the labs' logs in this directory (under each lab's name).
    #[arg(long)]
    logs: Option<PathBuf>,
}

const ECHO_PORT: u16 = 9100;
/// A datagram not back within this is lost.
const BACK_WITHIN: Duration = Duration::from_millis(500);

/// One datagram: when it left, whether it reached p2, whether it came back.
#[derive(Debug, Clone, Copy)]
struct Rec {
    sent: Instant,
    there: bool,
    back: bool,
}

type Log = Arc<Mutex<Vec<Rec>>>;

/// The stream's two threads; they stop when this is dropped.
struct Stream {
    log: Log,
    stop: Arc<AtomicBool>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn lock(log: &Log) -> Result<std::sync::MutexGuard<'_, Vec<Rec>>> {
    log.lock().map_err(|_| anyhow!("stream log poisoned"))
}

impl Stream {
    /// The echo bound in `server_ns`, the sender in `client_ns`.
    fn start(
        client_ns: &str,
        server_ns: &str,
        server: Ipv4Addr,
        every: Duration,
    ) -> Result<Stream> {
        let echo = Netns::named(server_ns)?.run(|| UdpSocket::bind(("0.0.0.0", ECHO_PORT)))??;
        let tx = Netns::named(client_ns)?.run(|| UdpSocket::bind("0.0.0.0:0"))??;
        tx.connect(SocketAddr::from((server, ECHO_PORT)))?;
        echo.set_read_timeout(Some(Duration::from_millis(100)))?;
        tx.set_nonblocking(true)?;
        let (log, stop): (Log, _) = (Arc::default(), Arc::new(AtomicBool::new(false)));
        let (l, s) = (log.clone(), stop.clone());
        std::thread::spawn(move || {
            if let Err(e) = echo_loop(&echo, &l, &s) {
                eprintln!("agent-restart: echo: {e:#}");
            }
        });
        let (l, s) = (log.clone(), stop.clone());
        std::thread::spawn(move || {
            if let Err(e) = send_loop(&tx, every, &l, &s) {
                eprintln!("agent-restart: sender: {e:#}");
            }
        });
        Ok(Stream { log, stop })
    }

    /// Waits until every datagram of the last half second came back.
    fn wait_flowing(&self, what: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = Instant::now();
            let settled = |r: &&Rec| now.duration_since(r.sent) > BACK_WITHIN;
            let recent = |r: &&Rec| now.duration_since(r.sent) < BACK_WITHIN * 2;
            let l = lock(&self.log)?;
            let w: Vec<&Rec> = l
                .iter()
                .rev()
                .take(2000)
                .filter(settled)
                .filter(recent)
                .collect();
            if !w.is_empty() && w.iter().all(|r| r.back) {
                return Ok(());
            }
            drop(l);
            if now > deadline {
                bail!("{what}: the stream does not flow");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The number the next datagram gets.
    fn next_seq(&self) -> Result<usize> {
        Ok(lock(&self.log)?.len())
    }

    /// When the first and the last of datagrams `from..to` that did not
    /// come back were sent.
    fn lost_span(&self, from: usize, to: usize) -> Result<Option<(Instant, Instant)>> {
        let l = lock(&self.log)?;
        let w = &l[from.min(l.len())..to.min(l.len())];
        let mut lost = w.iter().filter(|r| !r.back).map(|r| r.sent);
        Ok(lost
            .next()
            .map(|first| (first, lost.next_back().unwrap_or(first))))
    }

    /// Of datagrams `from..to`: (not at p2, not back).
    fn lost(&self, from: usize, to: usize) -> Result<(usize, usize)> {
        let l = lock(&self.log)?;
        let w = &l[from.min(l.len())..to.min(l.len())];
        Ok((
            w.iter().filter(|r| !r.there).count(),
            w.iter().filter(|r| !r.back).count(),
        ))
    }
}

fn seq_of(b: &[u8]) -> Option<usize> {
    Some(u64::from_be_bytes(b.get(..8)?.try_into().ok()?) as usize)
}

fn echo_loop(s: &UdpSocket, log: &Log, stop: &AtomicBool) -> Result<()> {
    let mut buf = [0u8; 64];
    while !stop.load(Ordering::SeqCst) {
        let Ok((n, peer)) = s.recv_from(&mut buf) else {
            continue;
        };
        if let Some(seq) = seq_of(&buf[..n]) {
            if let Some(r) = lock(log)?.get_mut(seq) {
                r.there = true;
            }
            let _ = s.send_to(&buf[..n], peer);
        }
    }
    Ok(())
}

fn send_loop(s: &UdpSocket, every: Duration, log: &Log, stop: &AtomicBool) -> Result<()> {
    let mut next = Instant::now();
    let mut buf = [0u8; 64];
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now >= next {
            let seq = {
                let mut l = lock(log)?;
                l.push(Rec {
                    sent: now,
                    there: false,
                    back: false,
                });
                l.len() - 1
            };
            // A send error (an ICMP error heard on the socket) is a loss.
            let _ = s.send(&(seq as u64).to_be_bytes());
            next += every;
        }
        while let Ok(n) = s.recv(&mut buf) {
            if let Some(seq) = seq_of(&buf[..n]) {
                if let Some(r) = lock(log)?.get_mut(seq) {
                    r.back = r.sent.elapsed() <= BACK_WITHIN;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// One backend's lab, its stream, and a route monitor on each node.
struct Side {
    backend: &'static str,
    _logs: KeepLogs,
    // Fields drop in order: the stream and monitors stop before the lab goes.
    stream: Stream,
    _monitors: Vec<Monitor>,
    routes: Receiver<Stamped>,
    netns: Vec<(String, String)>,
    lab: LabGuard,
}

fn up_side(
    rt: &tokio::runtime::Runtime,
    exe: &Path,
    name: &str,
    backend: &'static str,
    a: &Args,
) -> Result<Side> {
    eprintln!("agent-restart: {backend}: lab {name} up (3 nodes) ...");
    let lab = up_lab(rt, exe, name, &lab_options(3, backend, false))?;
    let mut pods = Vec::new();
    for (pod, node) in [("p1", "node1"), ("p2", "node2")] {
        let p = rt.block_on(lab.0.run_pod(
            "default",
            pod,
            Some(node),
            Default::default(),
            &[PortSpec::tcp(8080)],
        ))?;
        pods.push(p);
    }
    let server: Ipv4Addr = pods[1]
        .ip
        .parse()
        .with_context(|| format!("p2's IP {:?}", pods[1].ip))?;
    let (tx, routes) = channel();
    let mut monitors = Vec::new();
    let mut netns = Vec::new();
    for (i, n) in lab.0.state()?.nodes.iter().enumerate() {
        monitors.push(rtmon::spawn(&n.netns, rtmon::ROUTES, i, tx.clone())?);
        netns.push((n.name.clone(), n.netns.clone()));
    }
    let every = Duration::from_millis(a.interval_ms);
    let stream = Stream::start(&pods[0].netns, &pods[1].netns, server, every)?;
    let _logs = KeepLogs {
        lab_dir: lab.0.dir.clone(),
        to: a.logs.clone(),
    };
    Ok(Side {
        backend,
        _logs,
        lab,
        netns,
        stream,
        routes,
        _monitors: monitors,
    })
}

/// The routes podnet installed on a node (protocol 112), comparable.
fn podnet_routes(ns: &str) -> Result<BTreeSet<String>> {
    Netns::named(ns)?.run(|| -> Result<BTreeSet<String>> {
        let mut h = Handle::new()?;
        Ok(h.routes(false, None)?
            .into_iter()
            .filter(|r| r.protocol == Some(112))
            .map(|r| format!("{:?} via {:?} dev {:?}", r.dst, r.gateway, r.oif))
            .collect())
    })?
}

/// With the bgp backend: whether the agent in `ns` (its `/bgp` page, what
/// `podnet bgp status` shows) has every one of its `peers` neighbours
/// Established and a route from each. Always true for other backends.
fn bgp_settled(backend: &str, ns: &str, peers: usize) -> Result<bool> {
    if backend != "bgp" {
        return Ok(true);
    }
    let netns = Netns::named(ns)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], 10249));
    let Ok(r) = podnet_daemon::HttpGet::new(Duration::from_secs(1))
        .netns(Some(&netns))
        .get(addr, "/bgp")
    else {
        return Ok(false);
    };
    let v: serde_json::Value = serde_json::from_str(&r.body).context("the agent's /bgp page")?;
    let up = v["peers"].as_array().map_or(0, |ps| {
        ps.iter()
            .filter(|p| p["state"] == "Established" && p["received"].as_u64().unwrap_or(0) > 0)
            .count()
    });
    Ok(up == peers)
}

/// Waits until node1's and node2's routes are what they were before the
/// restart and, with bgp, every node's sessions are back.
fn wait_back(s: &Side, before: &[BTreeSet<String>], deadline: Instant) -> Result<()> {
    for ((node, ns), want) in s.netns.iter().zip(before) {
        while &podnet_routes(ns)? != want {
            if Instant::now() > deadline {
                bail!(
                    "{}: {node}'s routes differ after its restart; see {}/logs",
                    s.backend,
                    s.lab.0.dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for (node, ns) in &s.netns {
        while !bgp_settled(s.backend, ns, s.netns.len() - 1)? {
            if Instant::now() > deadline {
                bail!(
                    "{}: {node}'s BGP sessions are not all back; see {}/logs",
                    s.backend,
                    s.lab.0.dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// What one round of restarts cost a side.
#[derive(Debug, Clone, Copy)]
struct Sample {
    lost_there: usize,
    lost_back: usize,
    sent: usize,
    deleted_routes: usize,
    ready: Duration,
    /// Until the routes were as before and (bgp) every session was back.
    back: Duration,
}

/// Restarts node1's and node2's agents, waits until they are ready with
/// the routes they had, holds, and counts what the stream lost.
fn restart_round(a: &Args, s: &Side) -> Result<Sample> {
    let cluster: Ipv4Net = "10.244.0.0/16".parse()?;
    s.stream.wait_flowing(s.backend)?;
    let restarted = &s.netns[..2];
    let before: Vec<BTreeSet<String>> = restarted
        .iter()
        .map(|(_, ns)| podnet_routes(ns))
        .collect::<Result<_>>()?;
    while s.routes.try_recv().is_ok() {}
    let from = s.stream.next_seq()?;
    let t0 = Instant::now();
    for (node, _) in restarted {
        s.lab.0.restart_agent(node)?;
    }
    let deadline = t0 + Duration::from_secs(60);
    for (_, ns) in restarted {
        wait_agent_ready(ns, deadline)?;
    }
    let ready = t0.elapsed();
    wait_back(s, &before, deadline)?;
    let back = t0.elapsed();
    std::thread::sleep(Duration::from_secs(a.hold_secs));
    let to = s.stream.next_seq()?;
    std::thread::sleep(BACK_WITHIN + Duration::from_millis(100));
    let (lost_there, lost_back) = s.stream.lost(from, to)?;
    if let Some((a, b)) = s.stream.lost_span(from, to)? {
        eprintln!(
            "agent-restart:   {}: lost datagrams sent from +{:.0} to +{:.0} ms",
            s.backend,
            ms(a.saturating_duration_since(t0)),
            ms(b.saturating_duration_since(t0))
        );
    }
    let deleted: Vec<String> = s
        .routes
        .try_iter()
        .filter_map(|e| match e.change {
            Change::Route {
                dst, added: false, ..
            } if cluster.contains(&dst) => Some(format!(
                "{} {dst} at +{:.0} ms",
                s.netns[e.tag].0,
                ms(e.at.saturating_duration_since(t0))
            )),
            _ => None,
        })
        .collect();
    if !deleted.is_empty() {
        eprintln!(
            "agent-restart:   {}: routes deleted: {}",
            s.backend,
            deleted.join(", ")
        );
    }
    let deleted_routes = deleted.len();
    Ok(Sample {
        lost_there,
        lost_back,
        sent: to - from,
        deleted_routes,
        ready,
        back,
    })
}

fn run_rounds(a: &Args, sides: &[Side]) -> Result<Vec<Vec<Sample>>> {
    let mut out = vec![vec![]; sides.len()];
    for r in 0..a.rounds {
        for k in 0..sides.len() {
            podnet_bench::check_interrupted()?;
            let i = (r + k) % sides.len();
            let x = restart_round(a, &sides[i])?;
            eprintln!(
                "agent-restart: round {}/{} {}: {} of {} datagrams lost ({} before p2), {} pod-CIDR routes deleted, agents ready after {:.0} ms, all back after {:.0} ms",
                r + 1, a.rounds, sides[i].backend, x.lost_back, x.sent, x.lost_there, x.deleted_routes, ms(x.ready), ms(x.back)
            );
            out[i].push(x);
        }
    }
    Ok(out)
}

fn median_max(mut v: Vec<usize>) -> (usize, usize) {
    v.sort();
    (v[v.len() / 2], v[v.len() - 1])
}

fn report(a: &Args, sides: &[Side], res: &[Vec<Sample>]) {
    println!(
        "\nagent restart (node1 and node2: SIGKILL, new agent) under a UDP echo stream p1@node1 -> p2@node2, one datagram every {} ms;",
        a.interval_ms
    );
    println!(
        "{} rounds, backends alternating; a round counts from the first kill to {} s after both agents are ready and everything is back\n",
        a.rounds, a.hold_secs
    );
    println!(
        "{:<8} {:>7} {:>12} {:>6} {:>14} {:>15} {:>10} {:>10}",
        "backend",
        "rounds",
        "lost median",
        "max",
        "lost/sent",
        "routes deleted",
        "ready ms",
        "back ms"
    );
    let median = |mut v: Vec<Duration>| {
        v.sort();
        ms(v[v.len() / 2])
    };
    for (s, v) in sides.iter().zip(res) {
        if v.is_empty() {
            continue;
        }
        let (med, max) = median_max(v.iter().map(|x| x.lost_back).collect());
        let total: usize = v.iter().map(|x| x.lost_back).sum();
        let sent: usize = v.iter().map(|x| x.sent).sum();
        let deleted: usize = v.iter().map(|x| x.deleted_routes).sum();
        println!(
            "{:<8} {:>7} {:>12} {:>6} {:>14} {:>15} {:>10.0} {:>10.0}",
            s.backend,
            v.len(),
            med,
            max,
            format!("{total}/{sent}"),
            deleted,
            median(v.iter().map(|x| x.ready).collect()),
            median(v.iter().map(|x| x.back).collect()),
        );
    }
    println!("\n(ready: both agents answer /readyz; back: their routes as before and, with bgp, every node's sessions Established with routes; medians from the first kill)");
}

fn main() -> Result<()> {
    let a = Args::parse();
    if a.rounds == 0 || a.interval_ms == 0 {
        bail!("--rounds and --interval-ms must be at least 1");
    }
    let (exe, rt) = podnet_bench::lab_bench_start(a.podnet.as_deref())?;
    let id = std::process::id() % 10000;
    let sides = [
        up_side(&rt, &exe, &format!("arb{id}"), "bgp", &a)?,
        up_side(&rt, &exe, &format!("arv{id}"), "vxlan", &a)?,
    ];
    let res = run_rounds(&a, &sides)?;
    println!("podnet {}", exe.display());
    report(&a, &sides, &res);
    Ok(())
}
