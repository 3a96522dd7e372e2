//! A child process owned by a test: its output goes to a log file, it is
//! killed and reaped on drop (so a failing test leaves no daemon behind),
//! and a test can ask at any point whether it is still alive, failing
//! with the log's tail when it is not.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::eventually;

/// How many log lines [`Proc::check`] shows of a process that died.
const TAIL: usize = 30;

pub struct Proc {
    name: String,
    /// `None` once killed or stopped. Behind a lock so that
    /// [`Proc::check`] works through a shared reference, from inside a
    /// polling closure that reads other state too.
    child: Mutex<Option<Child>>,
    pid: u32,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` (from [`crate::TestNs::command`] to run it in a
    /// namespace) with stdin closed and stdout and stderr appended to
    /// `LOG_DIR/NAME.log`, so a restart under the same name keeps what the
    /// earlier run said.
    pub fn spawn(name: &str, mut cmd: Command, log_dir: &Path) -> Proc {
        let log = log_dir.join(format!("{name}.log"));
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap_or_else(|e| panic!("opening {}: {e}", log.display()));
        let out = file.try_clone().expect("duplicating the log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({cmd:?}): {e}"));
        Proc {
            name: name.to_string(),
            pid: child.id(),
            child: Mutex::new(Some(child)),
            log,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The log so far, without terminal colour codes.
    pub fn log(&self) -> String {
        let raw = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut out = String::with_capacity(raw.len());
        let mut esc = false;
        for ch in raw.chars() {
            match (esc, ch) {
                (false, '\u{1b}') => esc = true,
                (true, 'm') => esc = false,
                (true, _) => {}
                (false, c) => out.push(c),
            }
        }
        out
    }

    /// Whether the process is still running.
    pub fn alive(&self) -> bool {
        self.exited().is_none() && self.child().is_some()
    }

    /// Fails the test when the process exited (it was meant to keep
    /// running), with the last lines of its log. A process this guard
    /// killed or stopped on purpose passes.
    pub fn check(&self) {
        if let Some(st) = self.exited() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(TAIL)..].join("\n");
            panic!(
                "{} exited ({st}); the end of {}:\n{tail}",
                self.name,
                self.log.display()
            );
        }
    }

    /// SIGTERM, then waits up to `deadline` for the process to exit: how
    /// it exited. Fails the test when it does not stop (the drop then
    /// kills it).
    pub fn terminate(&mut self, deadline: Duration) -> ExitStatus {
        let what = format!("{} to exit on SIGTERM", self.name);
        let slot = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        let c = slot.as_mut().expect("the process was already stopped");
        // SAFETY: plain kill(2) on our own child, which is not reaped yet.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        let st = eventually(&what, deadline, || {
            c.try_wait().expect("waiting for a child")
        });
        *slot = None;
        st
    }

    /// SIGKILL, like a crash, and reaps it. Idempotent.
    pub fn kill(&mut self) {
        let slot = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(mut c) = slot.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// How the process exited, when it did (not when this guard stopped it).
    fn exited(&self) -> Option<ExitStatus> {
        self.child().as_mut()?.try_wait().ok().flatten()
    }

    fn child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A process stopped with SIGSTOP (a frozen daemon: alive, silent), let go
/// with SIGCONT when dropped, so a failing test never leaves it frozen.
pub struct Frozen(pub i32);

impl Frozen {
    pub fn freeze(pid: u32) -> Frozen {
        // SAFETY: a signal to a process the test started.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        Frozen(pid as i32)
    }

    /// Freezes the process whose pid file is `path` (a lab role's).
    pub fn pid_file(path: &str) -> Frozen {
        let pid: u32 = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading {path}: {e}"))
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{path}: not a pid: {e}"));
        Frozen::freeze(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}
