//! Processes, below the lab's roles: starting a detached process that logs
//! to a file and records its pid (so `lab down` finds it even after a
//! crash), and stopping and finding processes by pid, command line or
//! network namespace. Plain functions over a directory, free of [`Lab`],
//! so the control plane ([`crate::kube`]) and real nodes
//! ([`crate::realnode`]) use them as the lab does ([`crate::daemon`]).
//!
//! [`Lab`]: crate::Lab

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use podnet_kernel::Netns;

use crate::error::{io, LabError};

/// Starts each run's section of a role's log (see
/// [`Lab::log_path`](crate::Lab::log_path)).
pub const SPAWN_MARK: &str = "=== podnet lab:";

/// Starts a detached process (optionally inside a namespace), logging to
/// `<dir>/logs/<role>.log` and recording its pid under `<dir>/pids/<role>`,
/// so `lab down` finds it even after a crash. A role started again (a
/// restarted agent) appends to its log, after a line that marks the start,
/// so what the last run said before it died stays.
pub(crate) fn spawn_logged(
    dir: &Path,
    role: &str,
    cmd: &mut Command,
    ns: Option<&str>,
) -> Result<u32, LabError> {
    use std::io::Write;
    let path = dir.join("logs").join(format!("{role}.log"));
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| io(format!("opening {}", path.display()), e))?;
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    writeln!(
        log,
        "{SPAWN_MARK} {role} starting (unix time {}.{:03})",
        since_epoch.as_secs(),
        since_epoch.subsec_millis()
    )
    .map_err(|e| io(format!("writing {}", path.display()), e))?;
    let log2 = log.try_clone().map_err(|e| io("log", e))?;
    cmd.stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        // The log is a file: plain text, no colour codes.
        .env("NO_COLOR", "1")
        .process_group(0);
    let child = match ns {
        Some(ns) => Netns::named(ns)?.run(|| cmd.spawn())?,
        None => cmd.spawn(),
    }
    .map_err(|e| io(format!("starting {role}"), e))?;
    let pid = child.id();
    std::fs::write(dir.join("pids").join(role), pid.to_string())
        .map_err(|e| io("writing pid", e))?;
    // The child is a daemon: reap it in the background if we outlive it.
    std::thread::spawn(move || {
        let mut c = child;
        let _ = c.wait();
    });
    Ok(pid)
}

/// SIGTERM, then SIGKILL after a grace period; true if it was running.
pub(crate) fn kill_wait(pid: i32) -> bool {
    // SAFETY: plain kill(2) calls.
    if pid <= 1 || unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(3);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if alive(pid) {
        unsafe { libc::kill(pid, libc::SIGKILL) };
        wait_gone(pid);
    }
    true
}

pub(crate) fn alive(pid: i32) -> bool {
    // A zombie has exited: treat it as gone, once its other threads have
    // too (a killed process's leader turns zombie while its other threads
    // are still exiting, and its sockets close only after the last one).
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let zombie = s
                .rsplit(')')
                .next()
                .map(|r| r.trim_start().starts_with('Z'))
                .unwrap_or(false);
            let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
                .map(|d| d.count())
                .unwrap_or(0);
            !zombie || threads > 1
        }
        Err(_) => false,
    }
}

pub(crate) fn wait_gone(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every process but this one and those it runs under, by pid: a
/// `timeout`, `sudo` or shell that started `podnet lab --name X down`
/// names the lab too, and must not be taken for one of its strays.
fn other_pids() -> impl Iterator<Item = i32> {
    let mine = lineage(std::process::id() as i32);
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(move |pid| !mine.contains(pid))
}

/// `pid` and its ancestors, up to init.
fn lineage(pid: i32) -> Vec<i32> {
    let mut out = vec![pid];
    let mut cur = pid;
    while let Some(parent) = parent_of(cur).filter(|p| *p > 1 && !out.contains(p)) {
        out.push(parent);
        cur = parent;
    }
    out
}

/// A process's parent, from `/proc/PID/stat` (its fourth field, after the
/// parenthesised name, which may itself hold spaces and parentheses).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

pub(crate) fn processes_mentioning(marker: &str) -> Vec<i32> {
    other_pids()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .collect()
}

pub(crate) fn processes_in_netns(ns_path: &Path) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(target) = std::fs::metadata(ns_path) else {
        return vec![];
    };
    other_pids()
        .filter(|pid| {
            std::fs::metadata(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|m| m.ino() == target.ino() && m.dev() == target.dev())
        })
        .collect()
}

#[cfg(test)]
mod lineage_tests {
    use super::*;

    /// The process that runs this one (the test harness's parent, as a
    /// `timeout` or `sudo` would be) is never among the others.
    #[test]
    fn a_process_never_counts_its_ancestors_as_others() {
        let me = std::process::id() as i32;
        // SAFETY: getppid(2) cannot fail.
        let parent = unsafe { libc::getppid() };
        let line = lineage(me);
        assert_eq!(line[0], me);
        assert_eq!(parent_of(me), Some(parent));
        if parent > 1 {
            assert!(line.contains(&parent), "{line:?}");
        }
        let others: Vec<i32> = other_pids().collect();
        assert!(!others.contains(&me) && !others.contains(&parent));
        assert!(!others.is_empty(), "init at least is another process");
    }
}
