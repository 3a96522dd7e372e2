//! The flow log's cost and capacity (issue: "the new-connection rate with
//! `flows` enabled, against disabled; flow events per second the agent
//! keeps up with before it counts losses").
//!
//! One 2-node lab (standalone, vxlan): a client pod on node1, a server pod
//! on node2. Each round runs the new-connection rate (`conn_rate`: two
//! threads, TCP handshakes reset at once) twice, once with both agents
//! keeping their flow log and once with `--no-flows`, in alternating
//! order, so both see the same machine weather; the verdict is the median
//! of the per-round ratios.
//!
//! Capacity: with the flow log on, the client floods new UDP flows (one
//! datagram each, every one on a tuple of its own, to closed ports of the
//! server: a new conntrack entry per datagram) from several threads.
//! node1 counts the first packets of new connections it forwards in a
//! table of the bench's own (the ground truth); its `podnet_flows_total`
//! and `podnet_flows_lost_total` before and after give the flows the log
//! recorded per second and whether any were lost.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use podnet_bench::{
    accept_loop, catch_interrupts, check_interrupted, conn_rate, locate_podnet, require_root,
    LabGuard,
};
use podnet_kernel::Netns;
use podnet_lab::{serve::PortSpec, PodInfo, UpOptions};

#[derive(Parser)]
#[command(
    about = "The flow log: connection rate with it on and off, and the flow events per second it keeps up with"
)]
struct Args {
    /// The podnet binary the lab runs (default: next to this one).
    #[arg(long)]
    podnet: Option<PathBuf>,
    /// Alternating rounds (each: one run with flows, one without).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Seconds per connection-rate run.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Seconds of the UDP flood.
    #[arg(long, default_value_t = 3.0)]
    flood_seconds: f64,
    /// Flood threads.
    #[arg(long, default_value_t = 2)]
    flood_threads: usize,
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A counter's value from node `netns`'s agent metrics (summed over the
/// label sets that start with `prefix`).
fn metric(netns: &str, prefix: &str) -> Result<f64> {
    let ns = Netns::named(netns)?;
    let (code, body) =
        podnet_testkit::http_get(Some(&ns), ([127, 0, 0, 1], 10249).into(), "/metrics")
            .context("reading the agent's metrics")?;
    anyhow::ensure!(code == 200, "metrics: HTTP {code}");
    Ok(body
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// The ground truth for the flood: a named counter of the first packets
/// of new connections node `netns` forwards, in a table of the bench's own
/// (`inet flows-bench`, gone with the lab). The flood's tuples are all
/// different, so each first packet is one new connection.
fn count_new_flows(netns: &str) -> Result<()> {
    use podnet_nft::model::{Chain, ChainType, Expr, Family, Hook, Rule, Table};
    let mut t = Table::new(Family::Inet, "flows-bench");
    t.counters.insert("new".into());
    t.chains.insert(
        "fwd".into(),
        Chain::base(ChainType::Filter, Hook::Forward, 0).with_rules(vec![Rule::new(vec![
            Expr::CtStateNew,
            Expr::CounterRef("new".into()),
        ])]),
    );
    Netns::named(netns)?.run(|| -> Result<()> {
        let mut c = podnet_nft::netlink::Conn::open()?;
        c.apply(&t, &podnet_nft::diff::diff(None, &t))?;
        Ok(())
    })?
}

/// New connections node `netns` has forwarded since [`count_new_flows`].
fn new_flows(netns: &str) -> Result<u64> {
    Netns::named(netns)?.run(|| -> Result<u64> {
        let mut c = podnet_nft::netlink::Conn::open()?;
        Ok(
            c.counter(podnet_nft::model::Family::Inet, "flows-bench", "new")?
                .map(|(packets, _)| packets)
                .unwrap_or(0),
        )
    })?
}

/// New UDP flows from `client` to `dst`'s address for `secs`: one datagram
/// each, every one on a tuple of its own (thread `t` sends from source
/// ports 20000 + t*16000 + i, cycling the destination port after each pass),
/// so none joins an earlier connection.
fn flood(client: &str, dst: IpAddr, secs: f64, threads: usize) -> Result<u64> {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let client = client.to_string();
            std::thread::spawn(move || -> Result<u64> {
                Netns::named(&client)?.run(|| {
                    let mut n = 0u64;
                    let base = 20000 + (t as u16) * 16000;
                    while Instant::now() < deadline {
                        let sport = base + (n % 16000) as u16;
                        let dport = 10000 + (n / 16000) as u16;
                        let s = UdpSocket::bind(("0.0.0.0", sport))?;
                        s.send_to(b"x", SocketAddr::new(dst, dport))?;
                        n += 1;
                    }
                    Ok(n)
                })?
            })
        })
        .collect();
    let mut total = 0;
    for h in hs {
        total += h
            .join()
            .map_err(|_| anyhow::anyhow!("flood thread panicked"))??;
    }
    Ok(total)
}

/// Brings the lab up and starts the bench's two pods, the client on node1
/// and the server on node2, so the rounds and the flood run between nodes.
fn up_pair(
    lab: &LabGuard,
    rt: &tokio::runtime::Runtime,
) -> Result<(podnet_lab::LabState, PodInfo, PodInfo)> {
    let st = rt.block_on(lab.0.up(&UpOptions::new(2, "vxlan")))?;
    let ports = [PortSpec::tcp(8080)];
    let cli = rt.block_on(lab.0.run_pod(
        "default",
        "fbcli",
        Some("node1"),
        Default::default(),
        &ports,
    ))?;
    let srv = rt.block_on(lab.0.run_pod(
        "default",
        "fbsrv",
        Some("node2"),
        Default::default(),
        &ports,
    ))?;
    Ok((st, cli, srv))
}

/// The cost part: per round one connection-rate run with the flow log and
/// one without, in alternating order; returns the rates with, without,
/// and the per-round ratios.
fn rate_rounds(
    a: &Args,
    client: &str,
    target: SocketAddr,
    set_flows: &impl Fn(bool) -> Result<()>,
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let (mut on, mut off, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..a.rounds {
        check_interrupted()?;
        let order = if r % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        let mut got = [0.0; 2];
        for flows in order {
            set_flows(flows)?;
            // A restarted agent's first syncs are busy: warm up, discarded.
            conn_rate(client, target, 2.0)?;
            let rate = conn_rate(client, target, a.seconds)?;
            got[usize::from(!flows)] = rate;
        }
        eprintln!(
            "round {}: with flows {:.0}/s, without {:.0}/s, ratio {:.3}",
            r + 1,
            got[0],
            got[1],
            got[0] / got[1]
        );
        on.push(got[0]);
        off.push(got[1]);
        ratio.push(got[0] / got[1]);
    }
    Ok((on, off, ratio))
}

/// What the flood measured on node1: datagrams sent, for how long, the
/// new connections node1 forwarded (the ground truth), and what its flow
/// log recorded and lost meanwhile.
struct Capacity {
    sent: u64,
    secs: f64,
    confirmed: u64,
    recorded: f64,
    lost: f64,
}

/// The capacity part, with the flow log on: floods new UDP flows from the
/// client pod and compares node1's flow log against the bench's counter.
fn capacity(a: &Args, node1: &str, client: &str, srv_ip: IpAddr) -> Result<Capacity> {
    let rec0 = metric(node1, "podnet_flows_total{verdict=\"forwarded\"}")?;
    let lost0 = metric(node1, "podnet_flows_lost_total")?;
    count_new_flows(node1)?;
    let ins0 = new_flows(node1)?;
    let t0 = Instant::now();
    let sent = flood(client, srv_ip, a.flood_seconds, a.flood_threads)?;
    let secs = t0.elapsed().as_secs_f64();
    // The reader drains what the kernel queued: wait until the count stops
    // growing (each read is a state, not a guess at time).
    let mut rec1 = metric(node1, "podnet_flows_total{verdict=\"forwarded\"}")?;
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = metric(node1, "podnet_flows_total{verdict=\"forwarded\"}")?;
        if now == rec1 {
            break;
        }
        rec1 = now;
    }
    let lost1 = metric(node1, "podnet_flows_lost_total")?;
    let confirmed = new_flows(node1)? - ins0;
    Ok(Capacity {
        sent,
        secs,
        confirmed,
        recorded: rec1 - rec0,
        lost: lost1 - lost0,
    })
}

fn main() -> Result<()> {
    let a = Args::parse();
    require_root()?;
    catch_interrupts();
    let exe = locate_podnet(a.podnet.as_deref())?;
    let name = format!("fb{}", std::process::id() % 100_000);
    let lab = LabGuard(podnet_lab::Lab::new(&name, exe)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    eprintln!("flows-bench: lab {name} up (2 nodes, vxlan)");
    let (st, cli, srv) = up_pair(&lab, &rt)?;
    let srv_ip: IpAddr = srv.ip.parse()?;
    // The connections' server: an accept loop of the bench's own in the
    // server pod (the lab's `podnet serve` answers each connection).
    accept_loop(&srv.netns, 9090)?;
    let target = SocketAddr::new(srv_ip, 9090);
    let nodes: Vec<String> = st.nodes.iter().map(|n| n.name.clone()).collect();
    let set_flows = |on: bool| -> Result<()> {
        let extra: &[&str] = if on { &[] } else { &["--no-flows"] };
        for n in &nodes {
            lab.0.restart_agent_args(n, extra)?;
        }
        Ok(())
    };

    let (on, off, ratio) = rate_rounds(&a, &cli.netns, target, &set_flows)?;

    // Capacity, with the flow log on.
    set_flows(true)?;
    let Capacity {
        sent,
        secs,
        confirmed,
        recorded,
        lost,
    } = capacity(&a, &st.nodes[0].netns, &cli.netns, srv_ip)?;

    println!(
        "flows-bench: {} rounds, {} s per run, lab {name}",
        a.rounds, a.seconds
    );
    println!(
        "new connections/s  with flow log {:.0}  without {:.0}  ratio (median of rounds) {:.3}  target >= 0.95: {}",
        median(&on),
        median(&off),
        median(&ratio),
        if median(&ratio) >= 0.95 { "met" } else { "MISSED" }
    );
    println!(
        "flood: {sent} new UDP flows in {secs:.1} s ({:.0}/s offered); node1 forwarded {confirmed} new connections ({:.0}/s); its flow log recorded {:.0} ({:.0}/s); lost event batches {:.0}",
        sent as f64 / secs,
        confirmed as f64 / secs,
        recorded,
        recorded / secs,
        lost
    );
    Ok(())
}
