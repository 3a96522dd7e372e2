//! Unique names and the network-namespace guard: every test that touches
//! the kernel gets namespaces of its own, so tests run in parallel without
//! colliding and leave nothing behind, even when they panic.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use podnet_kernel::{KernelError, Netns};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name unique across parallel tests and processes: `pn-<tag>-<pid>-<n>`.
/// The pid is cut to five digits so that, with a short tag, the name also
/// fits an interface name (15 bytes).
pub fn unique(tag: &str) -> String {
    format!(
        "pn-{tag}-{}-{}",
        std::process::id() % 100_000,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Fails the test (never skips it) when it does not run as root: it is
/// about to create namespaces, links or nft tables, and a test that
/// cannot do what it checks must not count as a pass.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "this test needs root (it creates network namespaces, links or nft tables): run the tests as root"
    );
}

/// A named network namespace (under `/run/netns`, so `ip netns exec` sees
/// it), removed when the guard drops, even when the test panics.
///
/// Declare it before anything that lives inside it (a [`crate::Proc`], an
/// [`crate::Etcd`]): locals drop in reverse order, so those go first.
pub struct TestNs {
    name: String,
    /// `None` once [`TestNs::delete`] has run.
    ns: Option<Netns>,
}

impl TestNs {
    /// A fresh namespace named [`unique`]`(tag)`, loopback up. Fails the
    /// test when not root or when the kernel refuses.
    pub fn new(tag: &str) -> TestNs {
        require_root();
        let name = unique(tag);
        TestNs::create(name.clone()).unwrap_or_else(|e| panic!("creating netns {name}: {e}"))
    }

    /// A namespace with exactly this name, the error returned rather than
    /// panicked: the benchmarks name theirs after their pid (to find what a
    /// killed run left) and report errors as errors.
    pub fn create(name: impl Into<String>) -> Result<TestNs, KernelError> {
        let name = name.into();
        let ns = Netns::create_named(&name)?;
        Ok(TestNs { name, ns: Some(ns) })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The open handle, for netlink handles and runtimes that take one.
    pub fn netns(&self) -> &Netns {
        self.ns.as_ref().expect("a TestNs is open until deleted")
    }

    /// The namespace's file, `/run/netns/<name>`.
    pub fn path(&self) -> &Path {
        self.netns().path()
    }

    /// Runs `f` on this thread inside the namespace (sockets made there
    /// stay there).
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        self.netns()
            .run(f)
            .unwrap_or_else(|e| panic!("entering netns {}: {e}", self.name))
    }

    /// `program` to be run inside the namespace (`ip netns exec`).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        command_in(&self.name, program)
    }

    /// Runs a shell command inside the namespace; its stdout. Fails the
    /// test when the command fails.
    pub fn sh(&self, cmd: &str) -> String {
        sh_in(&self.name, cmd)
    }

    /// Runs a shell command inside the namespace: whether it succeeded,
    /// and its stdout followed by its stderr.
    pub fn try_sh(&self, cmd: &str) -> (bool, String) {
        try_sh_in(&self.name, cmd)
    }

    /// `nft ARGS` inside the namespace; its stdout. Fails the test when
    /// nft fails.
    pub fn nft(&self, args: &str) -> String {
        crate::nft(Some(&self.name), args)
            .unwrap_or_else(|e| panic!("nft {args} in {}: {e}", self.name))
    }

    /// `nft list WHAT` inside the namespace; `None` when there is no such
    /// table, set, map or chain.
    pub fn nft_list(&self, what: &str) -> Option<String> {
        crate::nft_list(Some(&self.name), what)
    }

    /// Closes the handle and removes the namespace now, reporting what
    /// failed (a drop can only print it).
    pub fn delete(mut self) -> Result<(), KernelError> {
        self.ns = None;
        Netns::delete_named(&self.name)
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        if self.ns.take().is_none() {
            return; // `delete` has run
        }
        if let Err(e) = Netns::delete_named(&self.name) {
            eprintln!("warning: removing netns {}: {e}", self.name);
        }
    }
}

/// `program` to be run inside the named namespace (`ip netns exec NS
/// PROGRAM`, which execs it: the child's pid is the program's).
pub fn command_in(ns: &str, program: impl AsRef<OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    c
}

/// `sh -c CMD` inside the named namespace, or in this process's own.
pub(crate) fn shell(ns: Option<&str>, cmd: &str) -> Output {
    let mut c = match ns {
        Some(ns) => command_in(ns, "sh"),
        None => Command::new("sh"),
    };
    c.args(["-c", cmd])
        .output()
        .unwrap_or_else(|e| panic!("running `{cmd}` in {ns:?}: {e}"))
}

/// Runs a shell command inside the named namespace: whether it succeeded,
/// and its stdout followed by its stderr.
pub fn try_sh_in(ns: &str, cmd: &str) -> (bool, String) {
    let out = shell(Some(ns), cmd);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Runs a shell command inside the named namespace; its stdout. Fails the
/// test when the command fails.
pub fn sh_in(ns: &str, cmd: &str) -> String {
    let out = shell(Some(ns), cmd);
    assert!(
        out.status.success(),
        "`{cmd}` in {ns} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
