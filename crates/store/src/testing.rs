//! A real etcd server for tests and benchmarks: private ports, a temporary
//! data directory, fast election timings, and a drop guard that kills it.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct EtcdServer {
    child: Option<Child>,
    pub dir: PathBuf,
    pub client_port: u16,
    pub peer_port: u16,
    owns_dir: bool,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

impl EtcdServer {
    /// Starts etcd and waits until it answers (fails loudly if the
    /// `etcd-server` package is missing: tests never skip silently).
    pub fn start() -> EtcdServer {
        let dir =
            std::env::temp_dir().join(format!("pn-etcd-{}-{}", std::process::id(), free_port()));
        let mut s = EtcdServer {
            child: None,
            dir,
            client_port: free_port(),
            peer_port: free_port(),
            owns_dir: true,
        };
        s.launch();
        s
    }

    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.client_port)
    }

    fn launch(&mut self) {
        let c = format!("http://127.0.0.1:{}", self.client_port);
        let p = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(&self.dir)
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
            .args([
                "--listen-peer-urls",
                &p,
                "--initial-advertise-peer-urls",
                &p,
            ])
            .args(["--initial-cluster", &format!("t={p}")])
            .args([
                "--heartbeat-interval",
                "10",
                "--election-timeout",
                "100",
                "--log-level",
                "error",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd not found: apt-get install etcd-server (scripts/setup.sh does)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if healthy(self.client_port) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not become healthy on port {}",
                self.client_port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills etcd (like a crash) without removing its data.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same ports and data.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }
}

/// etcd's own /health endpoint, over plain HTTP on the client port.
fn healthy(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"GET /health HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.contains("\"health\":\"true\"")
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
        if self.owns_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
