//! The encrypted overlay against plain VXLAN, in the same run: two
//! standalone labs of two nodes side by side, one `--backend vxlan`, the
//! other the same with `--encrypt` (WireGuard's protocol in the agent),
//! each with a client pod on node1 and a server pod on node2. Rounds
//! alternate which lab goes first; each round measures pod-to-pod iperf3
//! across the nodes with 1 and 4 streams (with the machine's CPU time
//! during the run, for CPU per Gbit/s) and 200 pings (p50, p99). The
//! verdicts are medians of the per-round encrypted/plain ratios; the
//! target is at least 0.5 of VXLAN's throughput on this 2-core machine.

use anyhow::Result;
use clap::Parser;
use podnet_bench::iperf::{
    cpu_busy_secs, iperf, iperf_server, median, pair, percentile, ratios, rtts,
};
use podnet_bench::{lab_bench_start, up_lab, LabGuard};
use podnet_lab::serve::PortSpec;
use podnet_lab::UpOptions;

#[derive(Parser)]
struct Args {
    /// The podnet binary (default: next to this one).
    #[arg(long)]
    podnet: Option<std::path::PathBuf>,
    /// Alternating rounds.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Seconds per iperf3 run.
    #[arg(long, default_value_t = 3)]
    seconds: u32,
}

/// One lab's pod-to-pod path.
struct Side {
    _lab: LabGuard,
    client_ns: String,
    server_ns: String,
    server_ip: String,
}

fn side(
    rt: &tokio::runtime::Runtime,
    exe: &std::path::Path,
    name: &str,
    encrypt: bool,
) -> Result<Side> {
    let o = UpOptions {
        encrypt,
        dns_replicas: 0,
        ..UpOptions::new(2, "vxlan")
    };
    let lab = up_lab(rt, exe, name, &o)?;
    let mut pods = Vec::new();
    for (pod, node) in [("c", "node1"), ("s", "node2")] {
        pods.push(rt.block_on(lab.0.run_pod(
            "default",
            pod,
            Some(node),
            Default::default(),
            &[PortSpec::tcp(80)],
        ))?);
    }
    Ok(Side {
        _lab: lab,
        client_ns: pods[0].netns.clone(),
        server_ns: pods[1].netns.clone(),
        server_ip: pods[1].ip.clone(),
    })
}

/// One iperf3 run: Gbit/s, and the machine's CPU seconds per Gbit sent.
fn measure(s: &Side, streams: u32, secs: u32) -> Result<(f64, f64)> {
    let before = cpu_busy_secs();
    let gbps = iperf(&s.client_ns, &s.server_ip, streams, secs)?;
    let cpu = cpu_busy_secs() - before;
    Ok((gbps, cpu / (gbps * f64::from(secs))))
}

#[derive(Default)]
struct Series {
    one: Vec<f64>,
    four: Vec<f64>,
    cpu1: Vec<f64>,
    cpu4: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let (exe, rt) = lab_bench_start(a.podnet.as_deref())?;
    eprintln!("encrypt-bench: two labs (vxlan, vxlan + encrypt), 2 nodes each");
    let sides = [
        side(&rt, &exe, "ebplain", false)?,
        side(&rt, &exe, "ebenc", true)?,
    ];
    let _servers = [
        iperf_server(&sides[0].server_ns, &sides[0].server_ip)?,
        iperf_server(&sides[1].server_ns, &sides[1].server_ip)?,
    ];
    let mut s = [Series::default(), Series::default()];
    for r in 0..a.rounds {
        podnet_bench::check_interrupted()?;
        let (p, e) = pair(r, |i| measure(&sides[i], 1, a.seconds))?;
        for (i, (g, c)) in [p, e].into_iter().enumerate() {
            s[i].one.push(g);
            s[i].cpu1.push(c);
        }
        let (p, e) = pair(r, |i| measure(&sides[i], 4, a.seconds))?;
        for (i, (g, c)) in [p, e].into_iter().enumerate() {
            s[i].four.push(g);
            s[i].cpu4.push(c);
        }
        let (p, e) = pair(r, |i| {
            rtts(&sides[i].client_ns, &sides[i].server_ip, 200, "0.01")
        })?;
        for (i, v) in [p, e].into_iter().enumerate() {
            s[i].p50.push(percentile(&v, 50.0));
            s[i].p99.push(percentile(&v, 99.0));
        }
        eprintln!(
            "encrypt-bench: round {}: 1 stream {:.2}/{:.2}, 4 streams {:.2}/{:.2} Gbit/s (vxlan/encrypted)",
            r + 1,
            s[0].one[r],
            s[1].one[r],
            s[0].four[r],
            s[1].four[r]
        );
    }
    report(&a, &s);
    Ok(())
}

fn report(a: &Args, s: &[Series; 2]) {
    println!(
        "\npod to pod across nodes, {} rounds x {} s, medians",
        a.rounds, a.seconds
    );
    println!(
        "{:<22} {:>9} {:>9} {:>12} {:>12} {:>8} {:>8}",
        "", "1 stream", "4 streams", "CPU s/Gbit 1", "CPU s/Gbit 4", "p50 ms", "p99 ms"
    );
    println!(
        "{:<22} {:>9} {:>9} {:>12} {:>12} {:>8} {:>8}",
        "", "Gbit/s", "Gbit/s", "", "", "ping", "ping"
    );
    for (i, label) in ["vxlan", "vxlan + encrypt"].iter().enumerate() {
        println!(
            "{:<22} {:>9.2} {:>9.2} {:>12.3} {:>12.3} {:>8.3} {:>8.3}",
            label,
            median(&s[i].one),
            median(&s[i].four),
            median(&s[i].cpu1),
            median(&s[i].cpu4),
            median(&s[i].p50),
            median(&s[i].p99)
        );
    }
    let (r1, r4) = (ratios(&s[1].one, &s[0].one), ratios(&s[1].four, &s[0].four));
    println!(
        "{:<22} {:>9.2} {:>9.2} {:>12.2} {:>12.2} {:>8.2} {:>8.2}   {}",
        "  encrypted/vxlan",
        r1,
        r4,
        ratios(&s[1].cpu1, &s[0].cpu1),
        ratios(&s[1].cpu4, &s[0].cpu4),
        ratios(&s[1].p50, &s[0].p50),
        ratios(&s[1].p99, &s[0].p99),
        if r1 >= 0.5 && r4 >= 0.5 {
            "throughput target >=0.5 met"
        } else {
            "throughput target >=0.5 NOT met"
        }
    );
}
