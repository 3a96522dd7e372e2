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
//! datagram from a fresh socket each, to a closed port of the server: a
//! new conntrack entry per datagram, answered by a port-unreachable) from
//! several threads; node1's `podnet_flows_total` and
//! `podnet_flows_lost_total` before and after give the flows recorded per
//! second and whether any were lost.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use podnet_bench::{
    catch_interrupts, check_interrupted, conn_rate, locate_podnet, require_root, LabGuard,
};
use podnet_kernel::Netns;
use podnet_lab::{serve::PortSpec, UpOptions};

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

/// The ground truth for the flood: the connections node `netns`'s
/// conntrack holds (a flood's entries live far longer than the flood).
/// Counting first packets would not do: a source port reused within the
/// UDP timeout joins the entry it left, which is no new connection.
fn tracked(netns: &str) -> Result<u64> {
    let ns = Netns::named(netns)?;
    Ok(podnet_kernel::conntrack::Table::in_netns(&ns)?
        .list(None)?
        .len() as u64)
}

/// New UDP flows (a fresh socket each) from `client` to `dst` for `secs`.
fn flood(client: &str, dst: SocketAddr, secs: f64, threads: usize) -> Result<u64> {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let client = client.to_string();
            std::thread::spawn(move || -> Result<u64> {
                Netns::named(&client)?.run(|| {
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        let s = UdpSocket::bind("0.0.0.0:0")?;
                        s.send_to(b"x", dst)?;
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
    let st = rt.block_on(lab.0.up(&UpOptions {
        nodes: 2,
        backend: "vxlan".into(),
        store: None,
        resync_secs: 10,
        kube: false,
        kube_agents: true,
        dns_replicas: 1,
        daemon_exe: None,
    }))?;
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
    let srv_ip: IpAddr = srv.ip.parse()?;
    let target = SocketAddr::new(srv_ip, 8080);
    let nodes: Vec<String> = st.nodes.iter().map(|n| n.name.clone()).collect();
    let set_flows = |on: bool| -> Result<()> {
        let extra: &[&str] = if on { &[] } else { &["--no-flows"] };
        for n in &nodes {
            lab.0.restart_agent_args(n, extra)?;
        }
        Ok(())
    };

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
            // A restarted agent's first sync is busy: warm up, discarded.
            conn_rate(&cli.netns, target, 0.5)?;
            let rate = conn_rate(&cli.netns, target, a.seconds)?;
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

    // Capacity, with the flow log on.
    set_flows(true)?;
    let node1 = &st.nodes[0].netns;
    let rec0 = metric(node1, "podnet_flows_total{verdict=\"forwarded\"}")?;
    let lost0 = metric(node1, "podnet_flows_lost_total")?;
    let ins0 = tracked(node1)?;
    let t0 = Instant::now();
    let sent = flood(
        &cli.netns,
        SocketAddr::new(srv_ip, 9),
        a.flood_seconds,
        a.flood_threads,
    )?;
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
    let confirmed = tracked(node1)?.saturating_sub(ins0);

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
        "flood: {sent} new UDP flows in {secs:.1} s ({:.0}/s offered); node1's conntrack gained {confirmed} connections ({:.0}/s); its flow log recorded {:.0} ({:.0}/s); lost event batches {:.0}",
        sent as f64 / secs,
        confirmed as f64 / secs,
        rec1 - rec0,
        (rec1 - rec0) / secs,
        lost1 - lost0
    );
    Ok(())
}
