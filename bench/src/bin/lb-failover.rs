//! How soon a LoadBalancer IP announced over L2 (`--l2-announce`,
//! MetalLB's L2 mode) answers again after its owner node is cut off.
//!
//! A standalone lab of 2 nodes (vxlan), a pool on the underlay
//! (192.168.200.240-247), a LoadBalancer Service with a UDP port and a pod
//! behind it on each node. A client on the underlay bridge (192.168.200.250
//! on `br0` in `pn-<lab>-net`, no route to the address: only ARP brings its
//! packets to a node) sends one request every `--interval-ms` from a fresh
//! UDP socket (a new flow each time, as a new TCP connection would be) and
//! stamps every answer. The owner is the node whose `eth0` MAC the client's
//! neighbour entry holds. Then the owner is cut off, two ways that
//! alternate from round to round:
//!
//! - `freeze`: its agent is stopped (SIGSTOP; SIGCONT afterwards, on every
//!   way out). Its kernel still forwards, so only the announcement moves;
//! - `link-down`: its `eth0` goes down (afterwards up again, with the
//!   default route the kernel dropped with it): the node is gone.
//!
//! Per cut: the time to the first answer to a request sent after the cut
//! (the target is 2 s), the time until the client's neighbour entry holds
//! the other node's MAC (a netlink monitor, [`podnet_bench::rtmon`]), and
//! the requests sent after the cut that were never answered.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use podnet_bench::rtmon::{self, Change, Stamped};
use podnet_bench::{lab_options, ms, podnet_apply, podnet_get, up_lab, KeepLogs, LabGuard, Stats};
use podnet_kernel::{Handle, Netns};
use podnet_lab::serve::PortSpec;

#[derive(Parser)]
struct Args {
    /// The podnet binary (default: next to this one).
    #[arg(long)]
    podnet: Option<PathBuf>,
    /// Cuts per variant.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Milliseconds between two requests of the client.
    #[arg(long, default_value_t = 10)]
    interval_ms: u64,
    /// Keep the lab's logs in this directory (under the lab's name).
    #[arg(long)]
    logs: Option<PathBuf>,
}

const CLIENT: &str = "192.168.200.250/24";
const UDP_PORT: u16 = 81;
/// A request unanswered this long is lost.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);
/// How long a cut may last before the failover counts as not happening.
const CUT_PATIENCE: Duration = Duration::from_secs(15);
const OBJECTS: &str = "apiVersion: podnet.io/v1\nkind: IPAddressPool\nmetadata: {name: lan}\n\
spec: {addresses: [192.168.200.240-192.168.200.247]}\n\
---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\n\
spec: {selector: {app: web}, type: LoadBalancer, ports: [{name: udp, port: 81, protocol: UDP, targetPort: 8081}]}\n";

/// One request: when it left, when its answer came.
#[derive(Debug, Clone, Copy)]
struct Probe {
    sent: Instant,
    answered: Option<Instant>,
}

/// The client's request loop, running in the underlay namespace until
/// dropped.
struct Client {
    log: Arc<Mutex<Vec<Probe>>>,
    stop: Arc<AtomicBool>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Client {
    fn start(netns: &str, target: SocketAddr, every: Duration) -> Result<Client> {
        let ns = Netns::named(netns)?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (log.clone(), stop.clone());
        std::thread::spawn(move || {
            let r = ns.run(|| client_loop(target, every, &l, &s));
            if let Err(e) = r.map_err(anyhow::Error::from).and_then(|r| r) {
                eprintln!("lb-failover: client: {e:#}");
            }
        });
        Ok(Client { log, stop })
    }

    fn probes(&self) -> Vec<Probe> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

fn client_loop(
    target: SocketAddr,
    every: Duration,
    log: &Mutex<Vec<Probe>>,
    stop: &AtomicBool,
) -> Result<()> {
    let mut pending: Vec<(usize, UdpSocket)> = Vec::new();
    let mut next = Instant::now();
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now >= next {
            let s = UdpSocket::bind("0.0.0.0:0").context("client socket")?;
            s.set_nonblocking(true)?;
            // A send error (no neighbour yet) is an unanswered request.
            let _ = s.send_to(b"hostname\n", target);
            let mut l = log.lock().map_err(|_| anyhow::anyhow!("log poisoned"))?;
            l.push(Probe {
                sent: now,
                answered: None,
            });
            pending.push((l.len() - 1, s));
            next += every;
        }
        let mut l = log.lock().map_err(|_| anyhow::anyhow!("log poisoned"))?;
        pending.retain(|(i, s)| match s.recv(&mut buf) {
            Ok(_) => {
                l[*i].answered = Some(Instant::now());
                false
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                l[*i].sent.elapsed() < ANSWER_WITHIN
            }
            Err(_) => false,
        });
        drop(l);
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// The lab, the Service's address, and what tells the nodes apart.
struct Setup {
    lab: LabGuard,
    underlay: String,
    lb_ip: Ipv4Addr,
    /// The client's bridge in the underlay namespace.
    br_index: u32,
    /// Per node: name, namespace, eth0 MAC.
    nodes: Vec<(String, String, [u8; 6])>,
}

fn setup(rt: &tokio::runtime::Runtime, exe: &std::path::Path, name: &str) -> Result<Setup> {
    eprintln!("lb-failover: lab {name} up (vxlan, 2 nodes, --l2-announce) ...");
    let lab = up_lab(rt, exe, name, &lab_options(2, "vxlan", true))?;
    let st = lab.0.state()?;
    for (pod, node) in [("web1", "node1"), ("web2", "node2")] {
        let labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        let ports = [PortSpec::tcp(8080), PortSpec::udp(8081)];
        rt.block_on(
            lab.0
                .run_pod("default", pod, Some(node), labels.into(), &ports),
        )?;
    }
    podnet_apply(exe, &st.store, OBJECTS)?;
    let lb_ip = wait_lb_ip(exe, &st.store)?;
    let mut h = Handle::in_netns(&Netns::named(&st.underlay_ns)?)?;
    let br = h.require_link(podnet_lab::gateway::BRIDGE)?;
    h.add_addr(br.index, CLIENT.parse()?, true)?;
    let mut nodes = Vec::new();
    for n in &st.nodes {
        let mut nh = Handle::in_netns(&Netns::named(&n.netns)?)?;
        let mac = rtmon::parse_mac(&nh.require_link("eth0")?.mac_string())?;
        nodes.push((n.name.clone(), n.netns.clone(), mac));
    }
    Ok(Setup {
        lab,
        underlay: st.underlay_ns,
        lb_ip,
        br_index: br.index,
        nodes,
    })
}

fn wait_lb_ip(exe: &std::path::Path, store: &str) -> Result<Ipv4Addr> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = podnet_get(exe, store, "svc", "web")?;
        if let Some(ip) = v["status"]["loadBalancer"]["ingress"][0]["ip"].as_str() {
            return ip
                .parse()
                .with_context(|| format!("LoadBalancer IP {ip:?}"));
        }
        if Instant::now() > deadline {
            bail!("Service web got no LoadBalancer IP: {v}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The node whose MAC the client's neighbour entry for the address holds.
fn owner(s: &Setup) -> Result<Option<usize>> {
    let mut h = Handle::in_netns(&Netns::named(&s.underlay)?)?;
    let macs: Vec<[u8; 6]> = h
        .neighbours(s.br_index, false)?
        .into_iter()
        .filter(|n| n.dst == Some(IpAddr::V4(s.lb_ip)))
        .map(|n| n.mac)
        .collect();
    Ok(s.nodes.iter().position(|(_, _, m)| macs.contains(m)))
}

/// What the agents say, from their logs (the product's own account):
/// which nodes announce the address now (the last `gained`/`lost` line of
/// each responder for it), and whether every agent sees every other node
/// alive (the last BFD liveness line per peer says `up=true`).
fn agents_view(s: &Setup) -> Result<(Vec<usize>, bool)> {
    let ip = format!("ip={}", s.lb_ip);
    let (mut claim, mut all_up) = (Vec::new(), true);
    for (i, (name, _, _)) in s.nodes.iter().enumerate() {
        let p = s.lab.0.log_path(&format!("agent-{name}"));
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        let last = text.lines().rfind(|l| {
            l.contains(&ip) && (l.contains("gained: announcing") || l.contains("lost: no longer"))
        });
        if last.is_some_and(|l| l.contains("gained")) {
            claim.push(i);
        }
        let mut peers: BTreeMap<&str, bool> = BTreeMap::new();
        for l in text.lines().filter(|l| l.contains("node liveness")) {
            if let Some(peer) = l
                .split("node_ip=")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
            {
                peers.insert(peer, l.contains("up=true"));
            }
        }
        all_up &= peers.len() == s.nodes.len() - 1 && peers.values().all(|u| *u);
    }
    Ok((claim, all_up))
}

/// Waits until every agent sees every node alive, exactly one node
/// announces the address, the client's neighbour entry names that node,
/// and the last second of requests was all answered. Returns the owner and
/// how long the client's entry named another node than the one that
/// announces (after a restore: the node that took over has yielded, and
/// the owner, whose own view never changed, announced nothing).
fn wait_steady(s: &Setup, c: &Client) -> Result<(usize, Option<Duration>)> {
    let start = Instant::now();
    let deadline = start + Duration::from_secs(60);
    let mut astray: Option<(Instant, Instant)> = None;
    loop {
        let now = Instant::now();
        let window: Vec<Probe> = c
            .probes()
            .into_iter()
            .filter(|p| now.duration_since(p.sent) > Duration::from_millis(300))
            .filter(|p| now.duration_since(p.sent) < Duration::from_millis(1300))
            .collect();
        let answered = !window.is_empty() && window.iter().all(|p| p.answered.is_some());
        let (claim, all_up) = agents_view(s)?;
        let entry = owner(s)?;
        if all_up && claim.len() == 1 {
            if entry.is_some() && entry != Some(claim[0]) {
                let first = astray.map_or(now, |a| a.0);
                astray = Some((first, now));
            }
            if answered && entry == Some(claim[0]) {
                return Ok((claim[0], astray.map(|(a, b)| b - a)));
            }
        }
        if now > deadline {
            bail!(
                "no steady owner of {} (agents announcing: {claim:?}, all alive: {all_up}, client's entry: {entry:?}, answered: {answered}); see {}/logs",
                s.lb_ip,
                s.lab.0.dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Freeze,
    LinkDown,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Freeze => "freeze agent",
            Variant::LinkDown => "eth0 down",
        }
    }
}

/// The owner's eth0, down while this lives; up again on drop, with the
/// default route the kernel removed with it.
struct LinkDown {
    netns: String,
}

impl LinkDown {
    fn cut(netns: &str) -> Result<LinkDown> {
        let mut h = Handle::in_netns(&Netns::named(netns)?)?;
        let e = h.require_link("eth0")?;
        let guard = LinkDown {
            netns: netns.to_string(),
        };
        h.set_down(e.index)?;
        Ok(guard)
    }
}

impl Drop for LinkDown {
    fn drop(&mut self) {
        let r = (|| -> Result<()> {
            let mut h = Handle::in_netns(&Netns::named(&self.netns)?)?;
            let e = h.require_link("eth0")?;
            h.set_up(e.index)?;
            h.replace_route(&podnet_lab::gateway::default_route(e.index))?;
            Ok(())
        })();
        if let Err(e) = r {
            eprintln!("lb-failover: restoring eth0 in {}: {e:#}", self.netns);
        }
    }
}

/// Whatever undoes a cut when dropped.
enum Cut {
    Frozen(#[allow(dead_code)] podnet_testkit::Frozen),
    Down(#[allow(dead_code)] LinkDown),
}

fn cut(s: &Setup, node: usize, v: Variant) -> Result<Cut> {
    let (name, netns, _) = &s.nodes[node];
    match v {
        Variant::Freeze => {
            let p = s.lab.0.dir.join("pids").join(format!("agent-{name}"));
            let pid: u32 = std::fs::read_to_string(&p)
                .with_context(|| format!("reading {}", p.display()))?
                .trim()
                .parse()
                .with_context(|| format!("{}: not a pid", p.display()))?;
            Ok(Cut::Frozen(podnet_testkit::Frozen::freeze(pid)))
        }
        Variant::LinkDown => Ok(Cut::Down(LinkDown::cut(netns)?)),
    }
}

/// What one cut showed, times from the cut.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Before the cut: how long the client pointed at a node that had
    /// stopped announcing the address (after the previous restore).
    astray: Option<Duration>,
    first_answer: Option<Duration>,
    takeover: Option<Duration>,
    lost: usize,
}

/// The first answer to a request sent at or after `at`.
fn first_answer(probes: &[Probe], at: Instant) -> Option<Instant> {
    probes
        .iter()
        .filter(|p| p.sent >= at)
        .filter_map(|p| p.answered)
        .min()
}

/// When the client's entry for the address first named another node than
/// `owner`, among the neighbour changes queued in `rx`.
fn takeover(s: &Setup, owner: usize, rx: &Receiver<Stamped>, seen: &mut Option<Instant>) {
    while let Ok(ev) = rx.try_recv() {
        if let Change::Neigh {
            dst,
            mac: Some(m),
            added: true,
        } = ev.change
        {
            let other = s
                .nodes
                .iter()
                .enumerate()
                .any(|(i, n)| i != owner && n.2 == m);
            if dst == IpAddr::V4(s.lb_ip) && other && seen.is_none() {
                *seen = Some(ev.at);
            }
        }
    }
}

/// One cut of the current owner, held until the address answers again
/// (or [`CUT_PATIENCE`]), then for [`ANSWER_WITHIN`] more, so every
/// request sent during it is answered or lost; then undone.
fn cut_once(s: &Setup, c: &Client, neigh: &Receiver<Stamped>, v: Variant) -> Result<Sample> {
    let (owner, astray) = wait_steady(s, c)?;
    if let Some(d) = astray {
        eprintln!(
            "lb-failover:   (before this cut the client's entry named a node that no longer announced {} for {:.0} ms; {} does)",
            s.lb_ip,
            ms(d),
            s.nodes[owner].0
        );
    }
    while neigh.try_recv().is_ok() {}
    let at = Instant::now();
    let guard = cut(s, owner, v)?;
    let mut moved = None;
    loop {
        takeover(s, owner, neigh, &mut moved);
        let first = first_answer(&c.probes(), at);
        if (moved.is_some() && first.is_some()) || at.elapsed() > CUT_PATIENCE {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(ANSWER_WITHIN + Duration::from_millis(100));
    takeover(s, owner, neigh, &mut moved);
    let end = Instant::now() - ANSWER_WITHIN;
    let probes = c.probes();
    drop(guard);
    let lost = probes
        .iter()
        .filter(|p| p.sent >= at && p.sent <= end && p.answered.is_none())
        .count();
    let sample = Sample {
        astray,
        first_answer: first_answer(&probes, at).map(|t| t - at),
        takeover: moved.map(|t| t.saturating_duration_since(at)),
        lost,
    };
    let f = |d: Option<Duration>| d.map_or("never".into(), |d| format!("{:.0} ms", ms(d)));
    eprintln!(
        "lb-failover:   {} of {}: first answer {}, neighbour moved {}, {} requests lost",
        v.name(),
        s.nodes[owner].0,
        f(sample.first_answer),
        f(sample.takeover),
        lost
    );
    Ok(sample)
}

/// Rounds of both cuts, which one goes first alternating.
fn run_rounds(
    a: &Args,
    s: &Setup,
    c: &Client,
    neigh: &Receiver<Stamped>,
) -> Result<BTreeMap<&'static str, Vec<Sample>>> {
    let mut out: BTreeMap<&'static str, Vec<Sample>> = BTreeMap::new();
    for r in 0..a.rounds {
        eprintln!("lb-failover: round {}/{}", r + 1, a.rounds);
        let order = if r % 2 == 0 {
            [Variant::Freeze, Variant::LinkDown]
        } else {
            [Variant::LinkDown, Variant::Freeze]
        };
        for v in order {
            podnet_bench::check_interrupted()?;
            out.entry(v.name())
                .or_default()
                .push(cut_once(s, c, neigh, v)?);
        }
    }
    Ok(out)
}

fn report(a: &Args, res: &BTreeMap<&'static str, Vec<Sample>>) {
    println!(
        "\nL2 failover of a LoadBalancer IP, 2 nodes, a request every {} ms from the underlay; {} cuts per variant, alternating; ms",
        a.interval_ms, a.rounds
    );
    println!(
        "{:<14} {:>12} {:>8} {:>8}   {:>14} {:>8}   {:>10} {:>8}",
        "cut", "first answer", "max", "never", "neighbour moved", "max", "lost (med)", "max"
    );
    for (name, v) in res {
        let fa: Vec<Duration> = v.iter().filter_map(|x| x.first_answer).collect();
        let to: Vec<Duration> = v.iter().filter_map(|x| x.takeover).collect();
        let mut lost: Vec<usize> = v.iter().map(|x| x.lost).collect();
        lost.sort();
        let (f, t) = (Stats::of(&fa), Stats::of(&to));
        let m = |s: Option<Stats>, pick: fn(&Stats) -> Duration| {
            s.map_or("-".into(), |s| format!("{:.0}", ms(pick(&s))))
        };
        println!(
            "{:<14} {:>12} {:>8} {:>8}   {:>14} {:>8}   {:>10} {:>8}",
            name,
            m(f, |s| s.median),
            m(f, |s| s.max),
            v.len() - fa.len(),
            m(t, |s| s.median),
            m(t, |s| s.max),
            lost[lost.len() / 2],
            lost[lost.len() - 1],
        );
        let met = fa.len() == v.len() && f.is_some_and(|s| s.max <= Duration::from_secs(2));
        println!(
            "{:<14} target first answer <= 2 s in every cut: {}",
            "",
            if met { "met" } else { "NOT met" }
        );
    }
    let astray: Vec<Duration> = res.values().flatten().filter_map(|x| x.astray).collect();
    let n: usize = res.values().map(Vec::len).sum();
    match Stats::of(&astray) {
        None => println!("\nbefore every cut the client's entry named the announcing node at once"),
        Some(st) => println!(
            "\nbefore {} of {n} cuts (after the previous one was undone) the client's entry named a node that no longer announced the address: median {:.0} ms, max {:.0} ms",
            st.n,
            ms(st.median),
            ms(st.max)
        ),
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    if a.rounds == 0 || a.interval_ms == 0 {
        bail!("--rounds and --interval-ms must be at least 1");
    }
    let (exe, rt) = podnet_bench::lab_bench_start(a.podnet.as_deref())?;
    let s = setup(&rt, &exe, &format!("lf{}", std::process::id() % 10000))?;
    let _logs = KeepLogs {
        lab_dir: s.lab.0.dir.clone(),
        to: a.logs.clone(),
    };
    let (tx, neigh) = channel();
    let _mon = rtmon::spawn(&s.underlay, rtmon::NEIGHBOURS, 0, tx)?;
    let target = SocketAddr::new(IpAddr::V4(s.lb_ip), UDP_PORT);
    let client = Client::start(&s.underlay, target, Duration::from_millis(a.interval_ms))?;
    let res = run_rounds(&a, &s, &client, &neigh)?;
    println!("podnet {}", exe.display());
    report(&a, &res);
    Ok(())
}
