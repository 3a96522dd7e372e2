//! The new-connection rate as a measurement rather than a sample: what
//! `kubeproxy-bench` compares proxies by.
//!
//! A single 3 s turn of [`crate::conn_rate`] swung by 4× between runs of one
//! build: on a 2-core machine the client shares its CPU with whatever the
//! lab's control plane and the proxies happen to do. So a measurement here:
//! - **pins CPUs** ([`Pinned`]): while it runs, every other task on the
//!   machine is moved to the first CPU (the lab's apiserver, etcd, agents or
//!   kube-proxies, the bench's own runtime) and the client thread and the
//!   server's accept thread run alone on the last one, where the kernel also
//!   does the packet path's softirq work they cause;
//! - **alternates with a baseline** ([`paired`]): slices to the Service's
//!   ClusterIP and straight to the endpoint pod's IP take turns, so each
//!   ClusterIP slice has a direct slice in the same conditions next to it;
//!   a turn's figure is the median of the slices, and its ratio
//!   ClusterIP / direct cancels what drifts between turns (caches, conntrack
//!   size, other load);
//! - uses **one client thread** on its own CPU: the path it measures (the
//!   proxy's rules, conntrack, the tunnel) is kernel work done on that same
//!   CPU, so a second client thread would only compete with it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use podnet_kernel::Netns;

/// The CPUs of this machine, from the affinity of this process.
fn cpus() -> Result<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity
    // fills at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        bail!("sched_getaffinity: {}", std::io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

fn get_affinity(tid: i32) -> Option<libc::cpu_set_t> {
    // SAFETY: as in `cpus`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let r =
        unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    (r == 0).then_some(set)
}

fn set_affinity(tid: i32, set: &libc::cpu_set_t) -> bool {
    // SAFETY: `set` is a valid cpu_set_t of the size given.
    unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set) == 0 }
}

fn only(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: as in `cpus`; CPU_SET writes inside the set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    set
}

/// The tasks (threads) of process `pid`.
fn tasks_of(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|t| t.file_name().to_str().and_then(|s| s.parse().ok()))
                .collect()
        })
        .unwrap_or_default()
}

/// Every task of every process on the machine.
pub fn all_tasks() -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|p| p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .flat_map(tasks_of)
        .collect()
}

/// The calling thread's id.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// While alive: the tasks in `alone` run on the last CPU and the tasks in
/// `others` that can be moved on the others (kernel threads bound to a CPU
/// refuse, and stay). Dropping it gives every moved task its old affinity
/// back, and a task of `others`' processes born meanwhile (it inherited the
/// narrowed set) every CPU again. With one CPU there is nothing to
/// separate: it pins nothing.
pub struct Pinned {
    saved: Vec<(i32, libc::cpu_set_t)>,
    /// The processes whose tasks were moved (for tasks born meanwhile).
    scope: Scope,
    all: libc::cpu_set_t,
    busy: libc::cpu_set_t,
    /// The CPU the measured tasks have to themselves.
    pub cpu: Option<usize>,
}

/// Which tasks [`Pinned`] moves off the measured CPU.
#[derive(Clone, Copy)]
pub enum Scope {
    /// Every task on the machine (a benchmark run).
    Machine,
    /// This process's tasks only (tests).
    Process,
}

impl Scope {
    fn tasks(self) -> Vec<i32> {
        match self {
            Scope::Machine => all_tasks(),
            Scope::Process => tasks_of(std::process::id() as i32),
        }
    }
}

impl Pinned {
    pub fn new(alone: &[i32], scope: Scope) -> Result<Pinned> {
        let cpus = cpus()?;
        let mut p = Pinned {
            saved: Vec::new(),
            scope,
            all: only(&cpus),
            busy: only(&cpus),
            cpu: None,
        };
        let Some((&last, rest)) = cpus.split_last().filter(|(_, r)| !r.is_empty()) else {
            return Ok(p);
        };
        let (quiet, busy) = (only(&[last]), only(rest));
        p.busy = busy;
        for tid in scope.tasks() {
            let Some(old) = get_affinity(tid) else {
                continue;
            };
            let want = if alone.contains(&tid) { &quiet } else { &busy };
            if set_affinity(tid, want) {
                p.saved.push((tid, old));
            } else if alone.contains(&tid) {
                bail!("pinning measured task {tid} to CPU {last} failed");
            }
        }
        p.cpu = Some(last);
        Ok(p)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.cpu.is_none() {
            return;
        }
        for (tid, old) in &self.saved {
            // A task that ended meanwhile refuses: nothing to restore.
            let _ = set_affinity(*tid, old);
        }
        let moved: std::collections::BTreeSet<i32> = self.saved.iter().map(|s| s.0).collect();
        for tid in self.scope.tasks() {
            if moved.contains(&tid) {
                continue;
            }
            let born_narrowed = get_affinity(tid).is_some_and(|s| {
                // SAFETY: comparing two valid sets.
                unsafe { libc::CPU_EQUAL(&s, &self.busy) }
            });
            if born_narrowed {
                let _ = set_affinity(tid, &self.all);
            }
        }
    }
}

/// A server accept thread in namespace `netns` on `port` that takes and
/// drops every connection; returns its thread id (for [`Pinned`]).
pub fn accept_thread(netns: &str, port: u16) -> Result<i32> {
    let listener =
        Netns::named(netns)?.run(|| std::net::TcpListener::bind(("0.0.0.0", port)))??;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(gettid());
        for c in listener.incoming() {
            drop(c);
        }
    });
    rx.recv().context("the accept thread did not start")
}

/// New connections per second from the calling thread (already in the
/// client's namespace) to `addr` for `secs`; each completes the handshake
/// and is reset at once.
fn one_slice(addr: SocketAddr, secs: f64) -> Result<f64> {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(secs);
    let (mut n, mut failed) = (0u64, 0u64);
    while Instant::now() < deadline {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
            Ok(s) => {
                crate::reset_on_close(&s);
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
    Ok(n as f64 / t0.elapsed().as_secs_f64())
}

/// One turn's paired measurement.
#[derive(Debug, Clone, Default)]
pub struct Paired {
    /// Connections/s per slice through the Service.
    pub service: Vec<f64>,
    /// Connections/s per slice straight to the endpoint pod.
    pub direct: Vec<f64>,
}

impl Paired {
    pub fn service_rate(&self) -> f64 {
        median(&self.service)
    }
    pub fn direct_rate(&self) -> f64 {
        median(&self.direct)
    }
    /// Median over the pairs of service / direct: the share of the direct
    /// path's rate the proxy keeps.
    pub fn ratio(&self) -> f64 {
        let r: Vec<f64> = self
            .service
            .iter()
            .zip(&self.direct)
            .map(|(s, d)| s / d)
            .collect();
        median(&r)
    }
}

/// `pairs` pairs of slices of `secs` each from namespace `client`: to
/// `service`, then to `direct`, in turn (which goes first alternates per
/// pair), with the client thread and `server_tids` alone on one CPU.
pub fn paired(
    client: &str,
    service: SocketAddr,
    direct: SocketAddr,
    server_tids: &[i32],
    pairs: usize,
    secs: f64,
) -> Result<Paired> {
    let client = client.to_string();
    let server_tids = server_tids.to_vec();
    std::thread::spawn(move || -> Result<Paired> {
        Netns::named(&client)?.run(|| {
            let mut alone = server_tids.clone();
            alone.push(gettid());
            let _pin = Pinned::new(&alone, Scope::Machine)?;
            // Warm up both paths (ARP, conntrack, caches) outside the figures.
            one_slice(service, 0.3)?;
            one_slice(direct, 0.3)?;
            let mut p = Paired::default();
            for k in 0..pairs {
                let (s, d) = if k % 2 == 0 {
                    let s = one_slice(service, secs)?;
                    (s, one_slice(direct, secs)?)
                } else {
                    let d = one_slice(direct, secs)?;
                    (one_slice(service, secs)?, d)
                };
                p.service.push(s);
                p.direct.push(d);
            }
            Ok(p)
        })?
    })
    .join()
    .map_err(|_| anyhow::anyhow!("client thread panicked"))?
}

/// The median (the mean of the middle two for an even count); NaN when
/// empty.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The spread of `v` around its median, as the largest deviation in
/// percent of the median (the "±" of a figure).
pub fn spread_pct(v: &[f64]) -> f64 {
    let m = median(v);
    v.iter()
        .map(|x| ((x - m) / m).abs() * 100.0)
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert!((spread_pct(&[90.0, 100.0, 110.0]) - 10.0).abs() < 1e-9);
        assert_eq!(spread_pct(&[5.0]), 0.0);
    }

    #[test]
    fn ratio_is_the_median_of_the_pairs() {
        let p = Paired {
            service: vec![8.0, 9.0, 30.0],
            direct: vec![10.0, 10.0, 10.0],
        };
        assert!((p.ratio() - 0.9).abs() < 1e-9);
        assert_eq!(p.service_rate(), 9.0);
        assert_eq!(p.direct_rate(), 10.0);
    }

    #[test]
    fn pinning_moves_this_thread_and_restores_it() {
        let me = gettid();
        let before = get_affinity(me).expect("affinity");
        let cpus = cpus().expect("cpus");
        {
            let p = Pinned::new(&[me], Scope::Process).expect("pin");
            if cpus.len() > 1 {
                let now = get_affinity(me).expect("affinity");
                let last = *cpus.last().expect("a cpu");
                assert_eq!(p.cpu, Some(last));
                assert!(unsafe { libc::CPU_ISSET(last, &now) });
                assert_eq!(unsafe { libc::CPU_COUNT(&now) }, 1);
            } else {
                assert_eq!(p.cpu, None);
            }
        }
        let after = get_affinity(me).expect("affinity");
        assert_eq!(
            unsafe { libc::CPU_COUNT(&after) },
            unsafe { libc::CPU_COUNT(&before) },
            "the old affinity is back"
        );
    }
}
