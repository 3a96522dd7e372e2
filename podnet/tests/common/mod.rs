//! What the CNI tests share: a private plugin directory, plugin runners and
//! one-shot TCP peers. Namespaces come from the testkit ([`TestNs`]).
//!
//! Every test gets its own "host" namespace, so bridges, nft tables and
//! sysctls never touch the machine's own namespace, and tests run in
//! parallel without colliding.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command as Proc;
use std::time::Duration;

use podnet_cni::runtime::{Attach, Runtime};
use podnet_testkit::eventually;
pub use podnet_testkit::TestNs;
use serde_json::Value;

/// Our plugins installed in a private directory, plus scratch state dirs.
pub struct Plugins {
    pub dir: tempfile::TempDir,
}

impl Plugins {
    pub fn install() -> Plugins {
        let dir = tempfile::tempdir().expect("tempdir");
        let st = Proc::new(env!("CARGO_BIN_EXE_podnet"))
            .args(["cni", "install"])
            .arg(dir.path())
            .output()
            .expect("podnet cni install");
        assert!(
            st.status.success(),
            "install: {}",
            String::from_utf8_lossy(&st.stderr)
        );
        Plugins { dir }
    }

    pub fn bin(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

pub const REFERENCE_DIR: &str = "/usr/lib/cni";

/// Fails loudly when a required peer is missing: CI installs it, so a
/// missing one is a broken setup, never a reason to skip.
pub fn require_reference_plugins() {
    assert!(
        Path::new(REFERENCE_DIR).join("bridge").exists(),
        "reference CNI plugins missing in {REFERENCE_DIR}: apt-get install containernetworking-plugins"
    );
}

pub fn runtime(bin: &Path, host: &TestNs) -> Runtime {
    Runtime::new(bin).in_netns(host.path())
}

pub fn attach(id: &str, pod: &TestNs) -> Attach {
    Attach {
        container_id: id.to_string(),
        netns: pod.path().display().to_string(),
        ifname: "eth0".into(),
        ..Default::default()
    }
}

/// Runs one plugin binary by hand with raw env and stdin (for error tests).
pub fn raw_call(
    exe: &Path,
    env: &[(&str, &str)],
    stdin: &str,
    host: Option<&TestNs>,
) -> (i32, Value, String) {
    let spawn = || {
        let mut p = Proc::new(exe);
        p.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default());
        for (k, v) in env {
            p.env(k, v);
        }
        p.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn plugin")
    };
    let mut child = match host {
        Some(h) => h.run(spawn),
        None => spawn(),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        out.status.code().unwrap_or(-1),
        v,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The IPv4 address (without prefix) of a result's first IP.
pub fn first_ip(r: &Value) -> String {
    r["ips"][0]["address"]
        .as_str()
        .unwrap_or_default()
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

/// Starts a one-shot TCP server in `ns` on `port`, which answers with its
/// name and reports the peer address it saw.
pub fn serve_once(ns: &TestNs, port: u16, name: &str) -> std::thread::JoinHandle<String> {
    // The previous server on this port may still be closing its accepted
    // connection (FIN_WAIT: the client's FIN is on its way back through
    // NAT), which SO_REUSEADDR does not cover: retry briefly.
    let l = eventually(
        &format!("port {port} free in {}", ns.name()),
        Duration::from_secs(3),
        || match ns.run(|| TcpListener::bind(("0.0.0.0", port))) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => None,
            other => Some(other.unwrap_or_else(|e| panic!("bind: {e:?}"))),
        },
    );
    let name = name.to_string();
    std::thread::spawn(move || {
        l.set_nonblocking(false).unwrap();
        let (mut s, peer) = l.accept().expect("accept");
        let _ = s.write_all(name.as_bytes());
        peer.ip().to_string()
    })
}

/// Connects from inside `ns` to `addr` and returns what the server said.
pub fn connect_from(ns: &TestNs, addr: &str) -> std::io::Result<String> {
    ns.run(|| -> std::io::Result<String> {
        let sa: std::net::SocketAddr = addr.parse().expect("socket address");
        let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(3))?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
}

/// Names of the links in a namespace.
pub fn links(ns: &TestNs) -> Vec<String> {
    let mut h = podnet_kernel::Handle::in_netns(ns.netns()).unwrap();
    h.links().unwrap().into_iter().map(|l| l.name).collect()
}
