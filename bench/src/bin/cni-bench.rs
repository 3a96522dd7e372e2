//! `cni-bench`: ADD and DEL latency of bridge + host-local, podnet's plugins
//! against the reference ones (containernetworking-plugins in /usr/lib/cni),
//! in the same run.
//!
//! Each side gets its own private "host" namespace (`pn-bench-<pid>-host-*`)
//! and its own temporary host-local `dataDir`; the configurations are
//! otherwise identical. Every cycle makes a fresh pod namespace, runs ADD
//! then DEL (DEL with the ADD result as `prevResult`, as libcni does), checks
//! the outcome, and removes the namespace. The sides take turns going first.
//! Only the plugin execution is timed: from spawning the bridge binary (which
//! calls host-local itself) to its exit.
//!
//! ```text
//! cargo build --release -p podnet -p podnet-bench && ./target/release/cni-bench --cycles 100
//! ```

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use podnet_bench::{check_interrupted, ms, ns_name, Stats};
use podnet_kernel::{Handle, Netns};
use podnet_testkit::TestNs;
use serde_json::{json, Value};

const NET_NAME: &str = "pn-bench";
const BRIDGE: &str = "pnbench0";
const SUBNET: &str = "10.250.0.0/16";
const IFNAME: &str = "eth0";
const TARGET_RATIO: f64 = 0.3;

#[derive(Parser)]
#[command(
    name = "cni-bench",
    about = "ADD/DEL latency of bridge + host-local: podnet's plugins vs the reference ones",
    after_help = "Run as root after `cargo build --release`:\n  \
                  cargo run --release -p podnet-bench --bin cni-bench -- --cycles 100"
)]
struct Args {
    /// Measured ADD+DEL cycles per implementation.
    #[arg(long, default_value_t = 100)]
    cycles: usize,
    /// Unmeasured cycles per implementation first (the first ADD also creates the bridge).
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// podnet binary to test [default: target/release/podnet].
    #[arg(long)]
    podnet: Option<PathBuf>,
    /// Directory of the reference plugins.
    #[arg(long, default_value = "/usr/lib/cni")]
    reference: PathBuf,
    /// Pause after each implementation's cycle, letting background kernel
    /// work (namespace teardown) finish before the next timed call.
    #[arg(long, default_value_t = 0)]
    settle_ms: u64,
    /// Also measure podnet with PODNET_CNI_SYNC_DEL=1 (DEL waits in the
    /// kernel's netdev_run_todo instead of handing it to a helper).
    #[arg(long)]
    sync_del_variant: bool,
    /// Also measure another podnet build (a differently linked binary, say)
    /// as a further implementation in the same run.
    #[arg(long)]
    also_podnet: Option<PathBuf>,
    /// Write every sample as CSV (impl,cycle,op,ms) to this file.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Exit with status 2 when a median ratio misses the 0.3x target.
    #[arg(long)]
    enforce: bool,
}

/// One implementation under test, with its private host namespace.
struct Side {
    label: &'static str,
    key: &'static str,
    bridge_exe: PathBuf,
    cni_path: PathBuf,
    env: Vec<(String, String)>,
    data_dir: PathBuf,
    host: TestNs,
    add: Vec<Duration>,
    del: Vec<Duration>,
}

fn conf(data_dir: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NET_NAME,
        "type": "bridge",
        "bridge": BRIDGE,
        "isGateway": true,
        "ipMasq": false,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": SUBNET}]],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": data_dir,
        }
    })
}

/// Runs the bridge plugin once inside the side's host namespace and times
/// it from spawn to exit; the namespace switch happens before the clock starts.
fn exec_timed(
    side: &Side,
    cmd: &str,
    id: &str,
    netns: &Path,
    stdin: &[u8],
) -> Result<(Duration, Output)> {
    let mut c = Command::new(&side.bridge_exe);
    c.env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", IFNAME)
        .env("CNI_ARGS", "")
        .env("CNI_PATH", &side.cni_path)
        .envs(side.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let timed = side
        .host
        .netns()
        .run(|| -> std::io::Result<(Duration, Output)> {
            // A child forked from this thread is born in the host namespace.
            let t0 = Instant::now();
            let mut child = c.spawn()?;
            if let Some(mut si) = child.stdin.take() {
                si.write_all(stdin)?;
            }
            let out = child.wait_with_output()?;
            Ok((t0.elapsed(), out))
        })?;
    let (dt, out) = timed.with_context(|| {
        format!(
            "{} {cmd}: executing {}",
            side.label,
            side.bridge_exe.display()
        )
    })?;
    if !out.status.success() {
        bail!(
            "{} {cmd} failed ({}): {} {}",
            side.label,
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok((dt, out))
}

fn result_ip(result: &Value) -> Result<ipnet::IpNet> {
    result["ips"][0]["address"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("ADD result has no ips[0].address: {result}"))
}

fn host_veth(result: &Value) -> Result<String> {
    result["interfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| {
            i["name"] != BRIDGE
                && i.get("sandbox")
                    .map(|s| s.as_str() == Some(""))
                    .unwrap_or(true)
        })
        .and_then(|i| i["name"].as_str())
        .map(String::from)
        .ok_or_else(|| anyhow!("ADD result names no host-side veth: {result}"))
}

fn lease_file(side: &Side, ip: IpAddr) -> PathBuf {
    side.data_dir.join(NET_NAME).join(ip.to_string())
}

/// After ADD: eth0 in the pod with the address, host veth on the bridge, lease on disk.
fn verify_added(side: &Side, pod: &Netns, result: &Value) -> Result<()> {
    let ip = result_ip(result)?;
    let mut p = Handle::in_netns(pod)?;
    let eth = p
        .link(IFNAME)?
        .ok_or_else(|| anyhow!("{}: {IFNAME} missing after ADD", side.label))?;
    if !p.addrs(eth.index)?.iter().any(|a| a.net == ip) {
        bail!("{}: {IFNAME} lacks {ip} after ADD", side.label);
    }
    let mut h = Handle::in_netns(side.host.netns())?;
    let veth = host_veth(result)?;
    let br = h.require_link(BRIDGE)?;
    match h.link(&veth)? {
        Some(l) if l.master == Some(br.index) => {}
        Some(_) => bail!("{}: {veth} is not attached to {BRIDGE}", side.label),
        None => bail!("{}: host veth {veth} missing after ADD", side.label),
    }
    if !lease_file(side, ip.addr()).exists() {
        bail!(
            "{}: no host-local lease for {} after ADD",
            side.label,
            ip.addr()
        );
    }
    Ok(())
}

/// After DEL: both veth ends gone and the address released, right away.
fn verify_deleted(side: &Side, pod: &Netns, result: &Value) -> Result<()> {
    let ip = result_ip(result)?;
    let veth = host_veth(result)?;
    if Handle::in_netns(pod)?.link(IFNAME)?.is_some() {
        bail!("{}: {IFNAME} still in the pod after DEL", side.label);
    }
    let mut h = Handle::in_netns(side.host.netns())?;
    if h.link(&veth)?.is_some() {
        bail!("{}: host veth {veth} still present after DEL", side.label);
    }
    let br = h.require_link(BRIDGE)?;
    if h.links()?.iter().any(|l| l.master == Some(br.index)) {
        bail!("{}: {BRIDGE} still has ports after DEL", side.label);
    }
    if lease_file(side, ip.addr()).exists() {
        bail!(
            "{}: lease for {} not released by DEL",
            side.label,
            ip.addr()
        );
    }
    Ok(())
}

/// One ADD+DEL in a fresh pod namespace; returns the two timings.
fn cycle(side: &Side, i: usize) -> Result<(Duration, Duration)> {
    let pod = TestNs::create(ns_name(&format!("pod-{}-{i}", side.key)))?;
    let id = format!("pnbench-{}-{i}", side.key);
    let base = conf(&side.data_dir);
    let (t_add, out) = exec_timed(side, "ADD", &id, pod.path(), &serde_json::to_vec(&base)?)?;
    let result: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "{}: ADD printed invalid JSON: {}",
            side.label,
            String::from_utf8_lossy(&out.stdout)
        )
    })?;
    verify_added(side, pod.netns(), &result)?;
    let mut del = base;
    del["prevResult"] = result.clone();
    let (t_del, _) = exec_timed(side, "DEL", &id, pod.path(), &serde_json::to_vec(&del)?)?;
    verify_deleted(side, pod.netns(), &result)?;
    Ok((t_add, t_del))
}

fn install_ours(podnet: &Path, dir: &Path) -> Result<()> {
    let out = Command::new(podnet)
        .args(["cni", "install"])
        .arg(dir)
        .output()
        .with_context(|| format!("running {} cni install", podnet.display()))?;
    if !out.status.success() {
        bail!(
            "{} cni install failed: {}",
            podnet.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn row(label: &str, s: &Stats) -> String {
    format!(
        "{label:<24} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
        ms(s.median),
        ms(s.p90),
        ms(s.mean),
        ms(s.min),
        ms(s.max)
    )
}

fn main() {
    if let Err(e) = run() {
        eprintln!("cni-bench: {e:#}");
        std::process::exit(1);
    }
}

/// Gives each implementation under test its `Side`: its own host
/// namespace and host-local `dataDir` under `tmp`, podnet's first and the
/// reference second (the ratios compare those two), then the optional ones.
fn make_sides(args: &Args, tmp: &Path, ours_bin: &Path, alt_bin: &Path) -> Result<Vec<Side>> {
    let mut sides = Vec::new();
    let mut mk = |label, key: &'static str, bin: &Path, env: Vec<(String, String)>| -> Result<()> {
        let data_dir = tmp.join(format!("ipam-{key}"));
        std::fs::create_dir_all(&data_dir)?;
        sides.push(Side {
            label,
            key,
            bridge_exe: bin.join("bridge"),
            cni_path: bin.to_path_buf(),
            env,
            data_dir,
            host: TestNs::create(ns_name(&format!("host-{key}")))?,
            add: Vec::new(),
            del: Vec::new(),
        });
        Ok(())
    };
    mk("podnet", "ours", ours_bin, vec![])?;
    mk("reference", "ref", &args.reference, vec![])?;
    if args.sync_del_variant {
        mk(
            "podnet (sync DEL)",
            "oursync",
            ours_bin,
            vec![("PODNET_CNI_SYNC_DEL".into(), "1".into())],
        )?;
    }
    if let Some(p) = &args.also_podnet {
        let alt = podnet_bench::locate_podnet(Some(p))?;
        install_ours(&alt, alt_bin)?;
        mk("podnet (--also-podnet)", "alt", alt_bin, vec![])?;
    }
    Ok(sides)
}

/// Says what is compared, how, and in which host namespaces, before the
/// (long) run starts.
fn print_setup(
    args: &Args,
    podnet: &Path,
    ours_bin: &Path,
    alt_bin: &Path,
    ref_bridge: &Path,
    sides: &[Side],
) {
    println!("cni-bench: bridge + host-local, cniVersion 1.0.0, ipMasq off, isGateway on, subnet {SUBNET}");
    println!(
        "  podnet:    {} (as {}/bridge)",
        podnet.display(),
        ours_bin.display()
    );
    if let Some(p) = &args.also_podnet {
        println!(
            "  also:      {} (as {}/bridge)",
            p.display(),
            alt_bin.display()
        );
    }
    println!("  reference: {}", ref_bridge.display());
    println!(
        "  {} measured + {} warm-up cycles per implementation, fresh pod namespace per cycle, turns alternate",
        args.cycles, args.warmup
    );
    println!(
        "  host namespaces: {}",
        sides
            .iter()
            .map(|s| s.host.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// The measurement loop: `total` rounds of one cycle per implementation,
/// rotating who goes first; samples are kept after the warm-up. Returns
/// the wall time of the whole loop.
fn run_cycles(args: &Args, sides: &mut [Side], total: usize) -> Result<Duration> {
    let started = Instant::now();
    for i in 0..total {
        // Rotate who goes first, so no implementation always follows another.
        let n = sides.len();
        for k in 0..n {
            check_interrupted()?;
            let side = &mut sides[(i + k) % n];
            let (a, d) = cycle(side, i)?;
            if i >= args.warmup {
                side.add.push(a);
                side.del.push(d);
            }
            if args.settle_ms > 0 {
                std::thread::sleep(Duration::from_millis(args.settle_ms));
            }
        }
        if (i + 1) % 25 == 0 && i + 1 < total {
            eprintln!("  ... {}/{total} cycles", i + 1);
        }
    }
    Ok(started.elapsed())
}

/// Every sample, for analysis beyond the summary (`--csv`).
fn write_csv(path: &Path, sides: &[Side]) -> Result<()> {
    let mut f =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    writeln!(f, "impl,cycle,op,ms")?;
    for s in sides {
        for (op, v) in [("ADD", &s.add), ("DEL", &s.del)] {
            for (i, d) in v.iter().enumerate() {
                writeln!(f, "{},{},{op},{:.3}", s.key, i, ms(*d))?;
            }
        }
    }
    Ok(())
}

/// The ADD and DEL tables and podnet's ratios to the reference against the
/// target; returns whether both medians met it.
fn print_stats(sides: &[Side]) -> bool {
    println!();
    let head = format!(
        "{:<24} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "ms", "median", "p90", "mean", "min", "max"
    );
    let mut medians = Vec::new();
    for (op, pick) in [("ADD", 0), ("DEL", 1)] {
        println!("{op} (bridge + host-local)\n{head}");
        let mut st = Vec::new();
        for s in sides {
            let v = if pick == 0 { &s.add } else { &s.del };
            let stats = Stats::of(v).expect("at least one cycle");
            println!("{}", row(s.label, &stats));
            st.push(stats);
        }
        medians.push(st);
        println!();
    }
    let mut pass = true;
    println!("ratio podnet/reference (target <= {TARGET_RATIO}x):");
    for (op, st) in ["ADD", "DEL"].iter().zip(&medians) {
        let r = ms(st[0].median) / ms(st[1].median);
        let r90 = ms(st[0].p90) / ms(st[1].p90);
        let ok = r <= TARGET_RATIO;
        pass &= ok;
        let extra: String = sides
            .iter()
            .zip(st.iter())
            .skip(2)
            .map(|(side, x)| format!("; {} {:.2}x", side.label, ms(x.median) / ms(st[1].median)))
            .collect();
        println!(
            "  {op}: median {r:.2}x, p90 {r90:.2}x  {}{extra}",
            if ok { "PASS" } else { "MISS" }
        );
    }
    pass
}

fn run() -> Result<()> {
    let args = Args::parse();
    podnet_bench::require_root()?;
    podnet_bench::catch_interrupts();
    for n in podnet_bench::remove_stale_namespaces() {
        eprintln!("removed stale namespace {n}");
    }
    if args.cycles == 0 {
        bail!("--cycles must be at least 1");
    }
    let podnet = podnet_bench::locate_podnet(args.podnet.as_deref())?;
    let ref_bridge = args.reference.join("bridge");
    if !ref_bridge.is_file() || !args.reference.join("host-local").is_file() {
        bail!(
            "reference plugins not found in {} (install containernetworking-plugins)",
            args.reference.display()
        );
    }

    // Dropped last (declared first): removes the plugin links and both dataDirs.
    let tmp = tempfile::Builder::new()
        .prefix("pn-bench-")
        .tempdir()
        .context("creating temp dir")?;
    let ours_bin = tmp.path().join("bin");
    install_ours(&podnet, &ours_bin)?;

    let alt_bin = tmp.path().join("bin-alt");
    let mut sides = make_sides(&args, tmp.path(), &ours_bin, &alt_bin)?;
    print_setup(&args, &podnet, &ours_bin, &alt_bin, &ref_bridge, &sides);

    let total = args.warmup + args.cycles;
    let elapsed = run_cycles(&args, &mut sides, total)?;

    if let Some(path) = &args.csv {
        write_csv(path, &sides)?;
    }

    let pass = print_stats(&sides);
    println!(
        "\n{} cycles in {:.1} s",
        total * sides.len(),
        elapsed.as_secs_f64()
    );
    drop(sides);
    drop(tmp);
    if args.enforce && !pass {
        std::process::exit(2);
    }
    Ok(())
}
