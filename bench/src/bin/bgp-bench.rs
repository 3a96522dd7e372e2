//! bgp-bench: route load (issue 26). A feeder, podnet's own BGP peer in one
//! namespace, sends `--routes` IPv4 prefixes over eBGP to a receiver in
//! another namespace, which is in turn (alternating, `--rounds` times):
//! podnet's speaker (this binary's `--receive` mode, a process of its own),
//! BIRD 2, FRR's bgpd (alone, `-Z`) and GoBGP (scripts/gobgp.sh).
//!
//! Measured per run: the time from the feeder's session coming up to the
//! receiver holding every route in its RIB (received and selected; not
//! installed in the kernel: no receiver here exports to it), read by
//! polling each receiver's own view every `--poll-ms` (20; podnet's process says so
//! itself), and the receiver's peak memory (VmHWM). Printed: medians, and
//! the ratio of each against BIRD.

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use ipnet::{IpNet, Ipv4Net};
use podnet_bench::connrate::median;
use podnet_bgp::export::{Neighbour, NextHops};
use podnet_bgp::fsm::Config;
use podnet_bgp::peer::{Announce, Peer, PeerEvent};
use podnet_bgp::rib::Local;
use podnet_bgp::speaker::{Speaker, SpeakerConfig};
use podnet_bgp::wire::{Afi, AsSegment, Origin, PathAttrs, Safi};
use podnet_testkit::TestNs;
use tokio::sync::mpsc;

const FEEDER: Ipv4Addr = Ipv4Addr::new(10, 97, 0, 1);
const RECEIVER: Ipv4Addr = Ipv4Addr::new(10, 97, 0, 2);

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 100_000)]
    routes: usize,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Receivers to run, in turn.
    #[arg(long, default_value = "podnet,bird,frr,gobgp")]
    receivers: String,
    /// How often a daemon is asked how many routes it holds (its CLI's
    /// answer is late by up to this much plus the CLI's own time).
    #[arg(long, default_value_t = 20)]
    poll_ms: u64,
    /// Internal: run podnet's speaker as the receiver of this many routes.
    #[arg(long, hide = true)]
    receive: Option<usize>,
}

fn session(local_as: u32, peer_as: u32, id: Ipv4Addr) -> Config {
    Config {
        local_as,
        peer_as,
        router_id: id,
        hold_time: 90,
        connect_retry: Duration::from_secs(1),
        passive: false,
        families: vec![(Afi::Ipv4, Safi::Unicast)],
        graceful_restart: None,
        ttl_security: false,
    }
}

/// The `--receive` mode: a speaker (AS 64512) with the feeder as its one
/// neighbour; prints `have N` once its RIB holds N routes.
async fn receive(n: usize) -> Result<()> {
    let (tx, mut rx) = mpsc::channel(1024);
    let cfg = SpeakerConfig {
        local: Local {
            asn: 64512,
            router_id: RECEIVER,
            cluster_id: None,
        },
        hops: NextHops {
            v4: RECEIVER,
            v6: None,
        },
        listen: IpAddr::V4(RECEIVER),
        session: session(64512, 64513, RECEIVER),
        neighbours: vec![Neighbour {
            addr: IpAddr::V4(FEEDER),
            asn: 64513,
            client: false,
            ttl_security: false,
            bfd: false,
        }],
        bfd: None,
    };
    let _sp = Speaker::start(cfg, tx).await?;
    println!("listening");
    // Which of the feed's prefixes have a route: one flag per prefix
    // (hashing them cost the receiver a tenth of its time).
    let mut have = vec![false; n];
    let mut count = 0;
    while let Some(cs) = rx.recv().await {
        for (p, r) in cs {
            let Some(i) = feed_index(&p).filter(|i| *i < n) else {
                continue;
            };
            count += usize::from(r.is_some() && !have[i]);
            count -= usize::from(r.is_none() && have[i]);
            have[i] = r.is_some();
        }
        if count >= n {
            println!("have {count}");
        }
    }
    Ok(())
}

/// Where the feed's prefixes start: 100.64.0.0/10.
const FEED_BASE: u32 = 0x6440_0000;

/// N distinct /32s in 100.64.0.0/10.
fn prefixes(n: usize) -> Vec<IpNet> {
    (0..n as u32)
        .map(|i| IpNet::V4(Ipv4Net::new(Ipv4Addr::from(FEED_BASE + i), 32).unwrap()))
        .collect()
}

/// A feed prefix's place in [`prefixes`].
fn feed_index(p: &IpNet) -> Option<usize> {
    match p {
        IpNet::V4(v) if v.prefix_len() == 32 => {
            let i = u32::from(v.addr()).checked_sub(FEED_BASE)?;
            Some(i as usize)
        }
        _ => None,
    }
}

/// One receiver under test: started in `ns`, asked how many routes it has.
struct Receiver {
    name: String,
    child: std::process::Child,
    count: Box<dyn Fn() -> usize>,
    /// podnet's process reports itself on stdout.
    lines: Option<std::io::Lines<BufReader<std::process::ChildStdout>>>,
    _dir: tempfile::TempDir,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn number_after(text: &str, key: &str) -> usize {
    text.find(key)
        .map(|i| &text[i + key.len()..])
        .map(|t| t.trim_start_matches([' ', ':', '"']))
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .unwrap_or(0)
}

/// The receiver's command line, its configuration written into `d`.
fn receiver_command(
    which: &str,
    ns: &TestNs,
    n: usize,
    d: &Path,
    gobgpd: &Path,
) -> Result<Command> {
    Ok(match which {
        "podnet" => {
            let mut c = ns.command(std::env::current_exe()?);
            c.arg("--receive").arg(n.to_string());
            c
        }
        "bird" => {
            let conf = format!(
                "router id {RECEIVER};\nprotocol device {{}}\nprotocol bgp feeder {{\n local {RECEIVER} as 64512;\n neighbor {FEEDER} as 64513;\n ipv4 {{ import all; export none; }};\n}}\n"
            );
            std::fs::write(d.join("bird.conf"), conf)?;
            let mut c = ns.command("bird");
            c.arg("-f")
                .arg("-c")
                .arg(d.join("bird.conf"))
                .arg("-s")
                .arg(d.join("ctl"));
            c
        }
        "frr" => {
            let conf = format!(
                "frr defaults traditional\nrouter bgp 64512\n bgp router-id {RECEIVER}\n no bgp ebgp-requires-policy\n neighbor {FEEDER} remote-as 64513\n"
            );
            std::fs::write(d.join("bgpd.conf"), conf)?;
            let mut c = ns.command("/usr/lib/frr/bgpd");
            c.arg("-f")
                .arg(d.join("bgpd.conf"))
                .arg("-i")
                .arg(d.join("pid"));
            c.arg("--vty_socket")
                .arg(d)
                .args(["-Z", "-S", "-n", "-P", "0"]);
            c.args(["-l", &RECEIVER.to_string()]);
            c
        }
        "gobgp" => {
            let conf = format!(
                "[global.config]\n  as = 64512\n  router-id = \"{RECEIVER}\"\n  local-address-list = [\"{RECEIVER}\"]\n[[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"{FEEDER}\"\n    peer-as = 64513\n"
            );
            std::fs::write(d.join("gobgpd.toml"), conf)?;
            let mut c = ns.command(gobgpd);
            c.arg("-f")
                .arg(d.join("gobgpd.toml"))
                .args(["-t", "toml", "--pprof-disable"]);
            c
        }
        other => bail!("unknown receiver {other}"),
    })
}

/// How many routes a daemon holds, asked with its own CLI in `ns`.
fn counter(which: &str, ns: &TestNs, d: &Path, gobgpd: &Path) -> Box<dyn Fn() -> usize> {
    let nsname = ns.name().to_string();
    let sh = move |cmd: String| podnet_testkit::try_sh_in(&nsname, &cmd).1;
    match which {
        "bird" => {
            let ctl = d.join("ctl");
            Box::new(move || {
                let out = sh(format!("birdc -s {} show route count", ctl.display()));
                number_after(&out, "ready.\n")
            })
        }
        "frr" => {
            let d = d.to_path_buf();
            Box::new(move || {
                let out = sh(format!(
                    "vtysh --vty_socket {} -c 'show bgp ipv4 unicast summary json'",
                    d.display()
                ));
                number_after(&out, "pfxRcd")
            })
        }
        "gobgp" => {
            let cli = gobgpd.with_file_name("gobgp");
            Box::new(move || {
                let out = sh(format!("{} global rib summary -a ipv4", cli.display()));
                number_after(&out, "Destination:")
            })
        }
        _ => Box::new(|| 0),
    }
}

fn start_receiver(which: &str, ns: &TestNs, n: usize, gobgpd: &Path) -> Result<Receiver> {
    let dir = tempfile::tempdir()?;
    let mut cmd = receiver_command(which, ns, n, dir.path(), gobgpd)?;
    let piped = which == "podnet";
    cmd.stdin(Stdio::null()).stderr(Stdio::null());
    cmd.stdout(if piped { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd.spawn().with_context(|| format!("starting {which}"))?;
    let lines = match piped {
        true => Some(BufReader::new(child.stdout.take().expect("piped")).lines()),
        false => None,
    };
    Ok(Receiver {
        name: which.into(),
        child,
        count: counter(which, ns, dir.path(), gobgpd),
        lines,
        _dir: dir,
    })
}

/// One run: the receiver up, the feeder's session, the clock from Up to
/// every route held. Returns (seconds, VmHWM MiB). The feeder's runtime
/// has worker threads made in the feeder's namespace, so its session goes
/// on while this thread polls the receiver.
fn run_one(feeder: &TestNs, r: &mut Receiver, n: usize, poll: Duration) -> Result<(f64, f64)> {
    let rt = feeder.run(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
    })?;
    if let Some(lines) = r.lines.as_mut() {
        let first = lines.next().transpose()?.unwrap_or_default();
        if first != "listening" {
            bail!("podnet's receiver said {first:?}");
        }
    }
    let (tx, mut rx) = mpsc::channel(64);
    let attrs = PathAttrs {
        origin: Some(Origin::Igp),
        as_path: vec![AsSegment::Sequence(vec![64513])],
        next_hop: Some(FEEDER),
        ..Default::default()
    };
    let all = prefixes(n);
    let up = {
        rt.block_on(async {
            let peer = Peer::start(session(64513, 64512, FEEDER), (RECEIVER, 179).into(), tx);
            peer.announce(Announce {
                routes: vec![(Afi::Ipv4, attrs, all)],
            });
            loop {
                match tokio::time::timeout(Duration::from_secs(60), rx.recv()).await {
                    Ok(Some(PeerEvent::Up(_))) => return Ok((peer, Instant::now())),
                    Ok(Some(_)) => {}
                    _ => bail!("no session with {}", r.name),
                }
            }
        })
    };
    let (peer, t0) = up?;
    let deadline = t0 + Duration::from_secs(300);
    loop {
        let done = match r.lines.as_mut() {
            Some(lines) => lines
                .next()
                .transpose()?
                .is_some_and(|l| l.starts_with("have ")),
            None => (r.count)() >= n,
        };
        if done {
            break;
        }
        if Instant::now() > deadline {
            bail!("{} holds {} of {n} routes after 300 s", r.name, (r.count)());
        }
        if r.lines.is_none() {
            std::thread::sleep(poll);
        }
    }
    let took = t0.elapsed().as_secs_f64();
    let mem = podnet_bench::proc_status_mib(r.child.id(), "VmHWM:");
    rt.block_on(async { peer.stop() });
    Ok((took, mem))
}

/// The two namespaces, joined by a veth pair.
fn pair() -> Result<(TestNs, TestNs)> {
    let feeder = TestNs::create(podnet_bench::ns_name("bgp-feeder"))?;
    let recv = TestNs::create(podnet_bench::ns_name("bgp-receiver"))?;
    feeder.sh(&format!(
        "ip link add bb0 type veth peer name bb1 netns {}",
        recv.name()
    ));
    feeder.sh(&format!(
        "ip link set lo up && ip addr add {FEEDER}/24 dev bb0 && ip link set bb0 up"
    ));
    recv.sh(&format!(
        "ip link set lo up && ip addr add {RECEIVER}/24 dev bb1 && ip link set bb1 up"
    ));
    Ok((feeder, recv))
}

fn gobgpd() -> Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gobgp.sh");
    let out = Command::new("bash").arg(script).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let p = text
        .lines()
        .find_map(|l| l.strip_prefix("GOBGPD="))
        .context("scripts/gobgp.sh")?;
    Ok(PathBuf::from(p))
}

fn main() -> Result<()> {
    let a = Args::parse();
    if let Some(n) = a.receive {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        return rt.block_on(receive(n));
    }
    podnet_bench::require_root()?;
    podnet_bench::remove_stale_namespaces();
    let gobgpd = gobgpd()?;
    let receivers: Vec<&str> = a.receivers.split(',').collect();
    let mut results: Vec<(String, Vec<f64>, Vec<f64>)> = receivers
        .iter()
        .map(|r| (r.to_string(), vec![], vec![]))
        .collect();
    for round in 0..a.rounds {
        for (i, which) in receivers.iter().enumerate() {
            let (feeder, recv) = pair()?;
            let mut r = start_receiver(which, &recv, a.routes, &gobgpd)?;
            let (t, mem) = run_one(&feeder, &mut r, a.routes, Duration::from_millis(a.poll_ms))?;
            eprintln!(
                "round {}: {which}: {} routes in {t:.3} s, VmHWM {mem:.1} MiB",
                round + 1,
                a.routes
            );
            results[i].1.push(t);
            results[i].2.push(mem);
        }
    }
    let bird = results.iter().find(|r| r.0 == "bird").map(|r| median(&r.1));
    println!(
        "{} IPv4 routes over eBGP, {} rounds (medians):",
        a.routes, a.rounds
    );
    for (name, times, mems) in &results {
        let t = median(times);
        let ratio = bird
            .map(|b| format!("  {:.2}x BIRD", t / b))
            .unwrap_or_default();
        println!(
            "  {name:7} {t:7.3} s  VmHWM {:6.1} MiB{ratio}",
            median(mems)
        );
    }
    Ok(())
}
