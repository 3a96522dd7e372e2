//! Shared pieces of podnet's benchmarks: namespace names that tell a killed
//! run's leftovers (the guards themselves are the testkit's [`TestNs`],
//! which clean up even on panic or Ctrl-C), finding the release binary,
//! and the statistics.
//!
//! Binaries:
//! - `cni-bench`: ADD/DEL latency of bridge + host-local, podnet's plugins
//!   against the reference ones, executed as real binaries;
//! - `veth-cost`: the kernel-level experiment behind the DEL numbers
//!   (what a veth deletion costs in the netlink call, and why);
//! - `policy-bench`: NetworkPolicy at 10,000 pods × 10,000 policies (full
//!   programming, memory, one-change latency), the new-connection rate
//!   through the policy table, and enforcement latency in a lab.
//!
//! [`conn_rate`] is the new-connection rate both `proxy-bench` and
//! `policy-bench` measure with; [`connrate`] the pinned, paired one
//! `kubeproxy-bench` compares proxies by.

pub mod connrate;
pub mod iperf;
pub mod l7;
pub mod objects;
pub mod rtmon;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use podnet_kernel::Netns;
#[cfg(doc)]
use podnet_testkit::TestNs;

/// Every namespace a benchmark creates starts with this, followed by the
/// creating process id, so leftovers of a killed run can be recognised.
pub const NS_PREFIX: &str = "pn-bench-";

/// A unique namespace name for [`TestNs::create`]: `pn-bench-<pid>-<what>`.
pub fn ns_name(what: &str) -> String {
    format!("{NS_PREFIX}{}-{what}", std::process::id())
}

/// Removes `pn-bench-<pid>-*` namespaces whose process is gone (left by a
/// run that was killed with SIGKILL, the one case guards cannot cover).
pub fn remove_stale_namespaces() -> Vec<String> {
    let mut removed = Vec::new();
    let Ok(rd) = std::fs::read_dir(podnet_kernel::netns::NETNS_RUN_DIR) else {
        return removed;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(NS_PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() && Netns::delete_named(&name).is_ok() {
            removed.push(name);
        }
    }
    removed
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Turns SIGINT and SIGTERM into a flag, so the run stops between steps and
/// the guards on the stack clean up.
pub fn catch_interrupts() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

pub fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

pub fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("this benchmark creates network namespaces and links: run it as root");
    }
    Ok(())
}

/// Finds the release `podnet` binary: `--podnet`, else next to this
/// executable (cargo puts both in target/release), else the workspace's
/// target/release.
pub fn locate_podnet(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        if !p.is_file() {
            bail!("--podnet {}: no such file", p.display());
        }
        return std::fs::canonicalize(p).with_context(|| format!("resolving {}", p.display()));
    }
    let mut candidates = Vec::new();
    if let Ok(me) = std::env::current_exe() {
        if let Some(dir) = me.parent() {
            candidates.push(dir.join("podnet"));
        }
    }
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/podnet"));
    candidates.push(PathBuf::from("target/release/podnet"));
    for c in &candidates {
        if c.is_file() {
            return std::fs::canonicalize(c).with_context(|| format!("resolving {}", c.display()));
        }
    }
    bail!(
        "podnet binary not found (looked at {}); run `cargo build --release` first or pass --podnet PATH",
        candidates.iter().map(|c| c.display().to_string()).collect::<Vec<_>>().join(", ")
    )
}

/// Order statistics over a set of durations.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub n: usize,
    pub median: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub mean: Duration,
    pub min: Duration,
    pub max: Duration,
}

impl Stats {
    /// `None` for an empty sample.
    pub fn of(samples: &[Duration]) -> Option<Stats> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort();
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2
        };
        // Nearest rank: the smallest value with at least 90% of samples at or below it.
        let p90 = s[(n * 9).div_ceil(10).max(1) - 1];
        // Below 100 samples this is the maximum.
        let p99 = s[(n * 99).div_ceil(100).max(1) - 1];
        let mean = s.iter().sum::<Duration>() / n as u32;
        Some(Stats {
            n,
            median,
            p90,
            p99,
            mean,
            min: s[0],
            max: s[n - 1],
        })
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A lab that goes down when dropped, on every way out (the library's
/// teardown: namespaces, links, processes, files).
pub struct LabGuard(pub podnet_lab::Lab);

impl Drop for LabGuard {
    fn drop(&mut self) {
        if let Err(e) = self.0.down() {
            eprintln!("lab {} down: {e}", self.0.name);
        }
    }
}

/// Copies a lab's logs to `to/<lab name>/` when dropped (before the lab's
/// [`LabGuard`], which removes them: declare it after the guard), so a
/// run's product logs can be read after the run, also a failed one.
pub struct KeepLogs {
    pub lab_dir: PathBuf,
    pub to: Option<PathBuf>,
}

impl Drop for KeepLogs {
    fn drop(&mut self) {
        let Some(to) = &self.to else { return };
        let name = self.lab_dir.file_name().unwrap_or_default();
        let dst = to.join(name);
        let copy = || -> std::io::Result<()> {
            std::fs::create_dir_all(&dst)?;
            for e in std::fs::read_dir(self.lab_dir.join("logs"))?.flatten() {
                std::fs::copy(e.path(), dst.join(e.file_name()))?;
            }
            Ok(())
        };
        match copy() {
            Ok(()) => eprintln!(
                "logs of {} kept in {}",
                self.lab_dir.display(),
                dst.display()
            ),
            Err(e) => eprintln!("keeping the logs of {}: {e}", self.lab_dir.display()),
        }
    }
}

/// The start every lab benchmark shares: root, Ctrl-C turned into a
/// clean stop, the podnet binary (`--podnet`, else beside this one), and
/// a runtime of two workers for the lab's async calls.
pub fn lab_bench_start(podnet: Option<&Path>) -> Result<(PathBuf, tokio::runtime::Runtime)> {
    require_root()?;
    catch_interrupts();
    let exe = locate_podnet(podnet)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    Ok((exe, rt))
}

/// The options of a standalone lab (`podnet lab up --nodes N --backend B
/// [--l2-announce]`, as the CLI sets them): the lab's store, controller,
/// one DNS server, no router.
pub fn lab_options(nodes: usize, backend: &str, l2_announce: bool) -> podnet_lab::UpOptions {
    podnet_lab::UpOptions {
        l2_announce,
        ..podnet_lab::UpOptions::new(nodes, backend)
    }
}

/// Brings lab `name` up under a guard, so a failed `up` is taken down too.
pub fn up_lab(
    rt: &tokio::runtime::Runtime,
    exe: &Path,
    name: &str,
    o: &podnet_lab::UpOptions,
) -> Result<LabGuard> {
    let guard = LabGuard(podnet_lab::Lab::new(name, exe.to_path_buf())?);
    rt.block_on(guard.0.up(o))
        .with_context(|| format!("lab {name} up ({} nodes, {})", o.nodes, o.backend))?;
    Ok(guard)
}

/// Waits until the agent in namespace `netns` answers `/readyz` with 200
/// on the lab's metrics address (it has synced its node once).
pub fn wait_agent_ready(netns: &str, deadline: std::time::Instant) -> Result<()> {
    let ns = Netns::named(netns)?;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 10249));
    loop {
        let got = podnet_daemon::HttpGet::new(Duration::from_secs(1))
            .netns(Some(&ns))
            .get(addr, "/readyz");
        if got.is_ok_and(|r| r.status == 200) {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            bail!("the agent in {netns} is not ready (/readyz) after waiting");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `podnet --store STORE apply -f -` with `manifest` on stdin, as a user
/// applies objects to a standalone cluster.
pub fn podnet_apply(exe: &Path, store: &str, manifest: &str) -> Result<()> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut p = Command::new(exe)
        .args(["--store", store, "apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", exe.display()))?;
    p.stdin
        .take()
        .context("apply's stdin")?
        .write_all(manifest.as_bytes())?;
    let out = p.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "podnet apply: {}\n{manifest}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `podnet --store STORE get KIND NAME -o json`, parsed.
pub fn podnet_get(exe: &Path, store: &str, kind: &str, name: &str) -> Result<serde_json::Value> {
    let out = std::process::Command::new(exe)
        .args(["--store", store, "get", kind, name, "-o", "json"])
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    if !out.status.success() {
        bail!(
            "podnet get {kind} {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("podnet get {kind} {name} -o json"))
}

/// Sets SO_LINGER 0, so closing the socket resets the connection: a rate
/// test never runs out of ports or fills TIME_WAIT.
fn reset_on_close(s: &std::net::TcpStream) {
    use std::os::fd::AsRawFd;
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a socket we own, with a correctly sized value.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &l as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// A TCP server for [`conn_rate`]: a listener on `port` in namespace
/// `netns` whose thread accepts and drops connections as fast as they come
/// (a server that answers each one fills its accept queue, and every SYN it
/// then drops costs the client a 1 s retransmit: the rate would measure the
/// server). It runs until the process ends.
pub fn accept_loop(netns: &str, port: u16) -> Result<()> {
    let listener =
        Netns::named(netns)?.run(|| std::net::TcpListener::bind(("0.0.0.0", port)))??;
    std::thread::spawn(move || {
        for c in listener.incoming() {
            drop(c);
        }
    });
    Ok(())
}

/// New TCP connections per second from namespace `client` to `addr` for
/// `secs`, two client threads; each connection completes the handshake and
/// is reset at once. A lost SYN costs its retransmission time, as it would
/// for a real client; only persistent failure ends the run.
pub fn conn_rate(client: &str, addr: std::net::SocketAddr, secs: f64) -> Result<f64> {
    use std::time::Instant;
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let client = client.to_string();
            std::thread::spawn(move || -> Result<u64> {
                Netns::named(&client)?.run(|| {
                    let (mut n, mut failed) = (0u64, 0u64);
                    while Instant::now() < deadline {
                        match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
                            Ok(s) => {
                                reset_on_close(&s);
                                n += 1;
                            }
                            Err(e) => {
                                failed += 1;
                                if failed > 10 + n / 100 {
                                    bail!("connecting to {addr}: {e} ({failed} failures, {n} ok)");
                                }
                            }
                        }
                    }
                    Ok(n)
                })?
            })
        })
        .collect();
    let t0 = Instant::now();
    let mut total = 0;
    for t in threads {
        total += t
            .join()
            .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
    }
    Ok(total as f64 / t0.elapsed().as_secs_f64().max(secs))
}

/// A `/proc/PID/status` memory field (`"VmRSS:"`, `"VmHWM:"`, ...) in MiB;
/// 0 when the process or the field is gone.
pub fn proc_status_mib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&x| Duration::from_millis(x)).collect()
    }

    #[test]
    fn median_and_p90() {
        let s = Stats::of(&d(&[5, 1, 3, 2, 4])).unwrap();
        assert_eq!(s.median, Duration::from_millis(3));
        assert_eq!(s.p90, Duration::from_millis(5));
        assert_eq!(s.min, Duration::from_millis(1));
        let s = Stats::of(&d(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10])).unwrap();
        assert_eq!(s.median, Duration::from_micros(5500));
        assert_eq!(s.p90, Duration::from_millis(9));
        assert_eq!(s.p99, Duration::from_millis(10));
        assert_eq!(s.mean, Duration::from_micros(5500));
        assert!(Stats::of(&[]).is_none());
        let s = Stats::of(&d(&[7])).unwrap();
        assert_eq!(
            (s.median, s.p90),
            (Duration::from_millis(7), Duration::from_millis(7))
        );
    }
}
