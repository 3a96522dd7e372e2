//! A real etcd for tests and benchmarks: private ports, a private data
//! directory, fast election timings, on the host's loopback or inside a
//! test's namespace. It can be killed like a crash and started again on
//! the same data and ports, which is how tests check that clients ride
//! out an outage.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use podnet_kernel::Netns;

use crate::{command_in, eventually, free_port, http_get, Proc, TestNs};

/// How long etcd may take to answer `/health` after a start.
const START: Duration = Duration::from_secs(30);

const MISSING: &str = "etcd not found: apt-get install etcd-server (scripts/setup.sh does)";

pub struct Etcd {
    /// The namespace it runs in (name and handle), `None` on the host.
    ns: Option<(String, Netns)>,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    proc: Option<Proc>,
}

impl Etcd {
    /// etcd on the host's loopback; returns once it answers `/health`.
    pub fn start() -> Etcd {
        Etcd::start_on(None)
    }

    /// etcd inside `ns` (on its loopback), for tests that keep every port
    /// in a namespace of their own. Declare it after `ns`, so it stops
    /// before the namespace goes.
    pub fn start_in(ns: &TestNs) -> Etcd {
        let handle = Netns::open(ns.path()).unwrap_or_else(|e| panic!("{e}"));
        Etcd::start_on(Some((ns.name().to_string(), handle)))
    }

    fn start_on(ns: Option<(String, Netns)>) -> Etcd {
        assert!(on_path("etcd"), "{MISSING}");
        let dir = tempfile::Builder::new()
            .prefix("pn-etcd-")
            .tempdir()
            .expect("a temporary directory for etcd");
        let netns = ns.as_ref().map(|(_, h)| h);
        let client_port = free_port(netns);
        let peer_port = loop {
            let p = free_port(netns);
            if p != client_port {
                break p;
            }
        };
        let mut e = Etcd {
            ns,
            dir,
            client_port,
            peer_port,
            proc: None,
        };
        e.launch();
        e
    }

    /// The store URL podnet takes (`--store`, `PODNET_STORE`).
    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.client_port)
    }

    /// The client URL in etcd's own form, for kube-apiserver's
    /// `--etcd-servers`.
    pub fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// etcd's own log (its output across restarts).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// SIGKILL, like a crash: no goodbye to clients; the data stays.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    /// Starts it again (killing it first if it runs) on the same data and
    /// ports; returns once it answers `/health`.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// Fails the test, with the end of etcd's log, if etcd died (a kill
    /// through this fixture does not count).
    pub fn check(&self) {
        if let Some(p) = &self.proc {
            p.check();
        }
    }

    fn launch(&mut self) {
        let mut cmd = match &self.ns {
            Some((name, _)) => command_in(name, "etcd"),
            None => Command::new("etcd"),
        };
        let c = self.client_url();
        let p = format!("http://127.0.0.1:{}", self.peer_port);
        cmd.args(["--name", "t", "--data-dir"])
            .arg(self.data_dir())
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
            .args([
                "--listen-peer-urls",
                &p,
                "--initial-advertise-peer-urls",
                &p,
            ])
            .args(["--initial-cluster", &format!("t={p}")])
            .args(["--heartbeat-interval", "10", "--election-timeout", "100"])
            .args(["--log-level", "error"]);
        let proc = Proc::spawn("etcd", cmd, self.dir.path());
        let addr = SocketAddr::from(([127, 0, 0, 1], self.client_port));
        let netns = self.ns.as_ref().map(|(_, h)| h);
        eventually(&format!("etcd healthy on {addr}"), START, || {
            proc.check();
            http_get(netns, addr, "/health")
                .is_some_and(|(code, body)| code == 200 && body.contains("\"health\":\"true\""))
        });
        self.proc = Some(proc);
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| Path::new(&d).join(program).is_file()))
}
