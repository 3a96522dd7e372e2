//! `bgp-failover`: how long a LoadBalancer IP is unreachable from a router
//! when the node its traffic goes to is cut off, with BFD between the
//! nodes and the router and without it (the hold time decides then), in
//! the same run, alternating.
//!
//! A lab with the `bgp` backend, two nodes and a real BIRD as the
//! top-of-rack router (`--router bird`, hold time 9 s); a Cluster
//! LoadBalancer Service with a pod on each node, its pool's block
//! advertised by both nodes (ECMP at the router). A client in the
//! router's namespace asks the LB IP every 10 ms; the node the router
//! sends it to (`ip route get`) is cut off at the switch (its bridge port
//! down); the time from the cut to the client's first answer after it is
//! the failover. The BGPPeer's `bfd` flips between the variants (the
//! session restarts with the new terms) and the link comes back between
//! rounds.

use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use podnet_bench::{locate_podnet, ms, require_root, Stats};
use podnet_kernel::Netns;

#[derive(Parser)]
struct Args {
    /// Failovers per variant.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    #[arg(long)]
    podnet: Option<std::path::PathBuf>,
}

const LAB: &str = "bfo";

struct Lab {
    exe: std::path::PathBuf,
}

impl Lab {
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let mut c = Command::new(&self.exe);
        c.args(args).stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut p = c.spawn()?;
        if let Some(text) = stdin {
            use std::io::Write;
            p.stdin
                .take()
                .context("stdin")?
                .write_all(text.as_bytes())?;
        }
        drop(p.stdin.take());
        let out = p.wait_with_output()?;
        if !out.status.success() {
            bail!("podnet {args:?} failed");
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn lab(&self, args: &[&str]) -> Result<String> {
        let mut a = vec!["lab", "--name", LAB];
        a.extend_from_slice(args);
        self.run(&a, None)
    }

    fn apply(&self, yaml: &str) -> Result<()> {
        let store = format!("sqlite:///run/podnet-lab/{LAB}/state.db");
        self.run(&["--store", &store, "apply", "-f", "-"], Some(yaml))
            .map(drop)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.lab(&["down"]);
    }
}

fn sh(ns: &str, cmd: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", cmd])
        .output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
    let t = Instant::now();
    while !f() {
        if t.elapsed() > limit {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

const OBJECTS: &str = "apiVersion: podnet.io/v1\nkind: IPAddressPool\nmetadata: {name: public}\n\
spec: {addresses: [198.51.100.0/28]}\n---\napiVersion: podnet.io/v1\nkind: BGPConfiguration\n\
metadata: {name: default}\nspec: {serviceLoadBalancerIPs: [{cidr: 198.51.100.0/28}]}\n---\n\
apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {selector: {app: web}, \
type: LoadBalancer, ports: [{port: 80, targetPort: 8080}]}\n";

fn peer(bfd: bool) -> String {
    format!(
        "apiVersion: podnet.io/v1\nkind: BGPPeer\nmetadata: {{name: tor}}\n\
         spec: {{peerIP: 192.168.200.254, asNumber: 64513, bfd: {bfd}}}\n"
    )
}

/// The lab, its pods and objects; the LB IP.
fn setup(lab: &Lab) -> Result<IpAddr> {
    lab.lab(&["up", "--nodes", "2", "--backend", "bgp", "--router", "bird"])?;
    for i in 1..=2 {
        let (pod, node) = (format!("default/web{i}"), format!("node{i}"));
        lab.lab(&[
            "run", &pod, "--node", &node, "--labels", "app=web", "--ports", "8080/tcp",
        ])?;
    }
    lab.apply(OBJECTS)?;
    let store = format!("sqlite:///run/podnet-lab/{LAB}/state.db");
    let mut ip = None;
    until("the LB IP", Duration::from_secs(30), || {
        let out = lab.run(
            &["--store", &store, "get", "svc", "web", "-o", "json"],
            None,
        );
        let v: serde_json::Value = out
            .ok()
            .and_then(|o| serde_json::from_str(&o).ok())
            .unwrap_or_default();
        ip = v["status"]["loadBalancer"]["ingress"][0]["ip"]
            .as_str()
            .and_then(|s| s.parse().ok());
        ip.is_some()
    })?;
    ip.context("no LB IP")
}

fn tor() -> String {
    format!("pn-{LAB}-tor")
}

/// Both nodes behind the block at the router, and (with BFD) both BFD
/// sessions up.
fn settled(bfd: bool) -> bool {
    let r = sh(&tor(), "ip route show 198.51.100.0/28");
    let both = r.contains("192.168.200.11") && r.contains("192.168.200.12");
    let ctl = format!("/run/podnet-lab/{LAB}/tor/bird.ctl");
    let s = sh(
        &tor(),
        &format!("timeout 2 birdc -s {ctl} show bfd sessions"),
    );
    both && (!bfd || s.matches(" Up ").count() == 2)
}

/// A client in the router's namespace asking every 10 ms; the times of
/// its answers.
fn client(ip: IpAddr, stop: Arc<AtomicBool>, ok: Arc<Mutex<Vec<Instant>>>) -> Result<()> {
    let ns = Netns::named(&tor())?;
    std::thread::spawn(move || {
        let _ = ns.run(|| {
            let addr = SocketAddr::new(ip, 80);
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let timeout = Duration::from_millis(100);
                if podnet_lab::serve::ask(addr, false, "hostname", timeout).is_ok() {
                    ok.lock().expect("answers").push(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(10).saturating_sub(t.elapsed()));
            }
        });
    });
    Ok(())
}

/// One failover: the node the client's traffic goes to is cut off; the
/// time until the client is answered again.
fn failover(ip: IpAddr) -> Result<Duration> {
    let via = sh(&tor(), &format!("ip route get {ip} from 192.168.200.254"));
    let node = if via.contains("192.168.200.11") { 1 } else { 2 };
    let (stop, ok) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(Mutex::new(Vec::new())),
    );
    client(ip, stop.clone(), ok.clone())?;
    until("the client answered", Duration::from_secs(10), || {
        !ok.lock().expect("answers").is_empty()
    })?;
    let port = format!("to-node{node}");
    let under = format!("pn-{LAB}-net");
    sh(&under, &format!("ip link set {port} down"));
    let cut = Instant::now();
    let back = until("an answer after the cut", Duration::from_secs(60), || {
        ok.lock()
            .expect("answers")
            .iter()
            .any(|t| *t > cut + Duration::from_millis(50))
    });
    stop.store(true, Ordering::Relaxed);
    sh(&under, &format!("ip link set {port} up"));
    back?;
    let first = ok
        .lock()
        .expect("answers")
        .iter()
        .copied()
        .filter(|t| *t > cut + Duration::from_millis(50))
        .min()
        .context("no answer")?;
    Ok(first - cut)
}

fn main() -> Result<()> {
    let args = Args::parse();
    require_root()?;
    let lab = Lab {
        exe: locate_podnet(args.podnet.as_deref())?,
    };
    let _ = lab.lab(&["down"]);
    let ip = setup(&lab)?;
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for round in 0..args.rounds {
        for k in 0..2 {
            let bfd = (round + k) % 2 == 0;
            lab.apply(&peer(bfd))?;
            until("the router settled", Duration::from_secs(60), || {
                settled(bfd)
            })?;
            let t = failover(ip)?;
            eprintln!("round {round}: bfd={bfd}: {:.0} ms", ms(t));
            times[usize::from(!bfd)].push(t);
            until("the router settled again", Duration::from_secs(90), || {
                settled(bfd)
            })?;
        }
    }
    let (b, h) = (Stats::of(&times[0]), Stats::of(&times[1]));
    let (b, h) = (b.context("no BFD runs")?, h.context("no hold-time runs")?);
    println!(
        "bgp-failover: {} rounds each, BIRD router, node cut off at the switch",
        args.rounds
    );
    println!(
        "  with BFD (100 ms x 3): median {:.0} ms, max {:.0} ms",
        ms(b.median),
        ms(b.max)
    );
    println!(
        "  without (hold 9 s):    median {:.0} ms, max {:.0} ms",
        ms(h.median),
        ms(h.max)
    );
    println!("  ratio without/with: {:.1}x", ms(h.median) / ms(b.median));
    Ok(())
}
