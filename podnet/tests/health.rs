//! Health that tells the truth: a real etcd dies under a running
//! controller, DNS and node agent, and comes back.
//!
//! Everything runs in one private network namespace (so every port is ours
//! and the agent's tables, devices and sysctls stay out of the machine's
//! way). While etcd is down, each daemon's `/readyz` fails with the reason,
//! `podnet_store_watch_up` shows 0 for each watching loop and each loop logs
//! its loss once; when etcd is back on the same data and ports, `/readyz`
//! passes again, each loop logs its recovery once, and the daemons really
//! follow the store again: a Service applied after the recovery gets its
//! ClusterIP from the controller, its name from DNS and its rules from the
//! agent's proxy.
//!
//! No sleep stands in for readiness: every wait polls a state with a
//! generous deadline, and nothing asserts how long anything took.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::TestNs;

/// How long a watch may miss the store before it counts as lost (the
/// daemons' default is 10 s; the test lowers it through the environment).
const WATCH_TIMEOUT: &str = "2s";

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A free TCP port inside the namespace (nothing else runs there).
fn free_port(ns: &TestNs) -> u16 {
    ns.ns
        .run(|| {
            TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
        })
        .expect("entering the namespace")
        .expect("free port")
}

/// A free UDP and TCP port inside the namespace.
fn free_udp_port(ns: &TestNs) -> u16 {
    loop {
        let p = ns
            .ns
            .run(|| {
                UdpSocket::bind("127.0.0.1:0")
                    .and_then(|u| u.local_addr())
                    .map(|a| a.port())
            })
            .unwrap()
            .unwrap();
        let tcp_free = ns
            .ns
            .run(|| TcpListener::bind(("127.0.0.1", p)).is_ok())
            .unwrap();
        if tcp_free {
            return p;
        }
    }
}

/// One GET inside the namespace: the status code and the body.
fn http(ns: &TestNs, port: u16, path: &str) -> (u16, String) {
    ns.ns
        .run(|| {
            let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
                return (0, String::new());
            };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
            let _ = s.write_all(req.as_bytes());
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            let code = out
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let body = out
                .split_once("\r\n\r\n")
                .map(|(_, b)| b.to_string())
                .unwrap_or_default();
            (code, body)
        })
        .unwrap()
}

/// A metric's value by its exact name and labels, if present.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// A real etcd inside the namespace, killed like a crash and restarted on
/// the same data directory and ports.
struct Etcd {
    ns: String,
    dir: PathBuf,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

impl Etcd {
    fn start(ns: &TestNs, dir: &Path) -> Etcd {
        let mut e = Etcd {
            ns: ns.name.clone(),
            dir: dir.join("etcd"),
            client: free_port(ns),
            peer: 0,
            child: None,
        };
        loop {
            e.peer = free_port(ns);
            if e.peer != e.client {
                break;
            }
        }
        e.launch(ns);
        e
    }

    fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.client)
    }

    fn launch(&mut self, ns: &TestNs) {
        let c = format!("http://127.0.0.1:{}", self.client);
        let p = format!("http://127.0.0.1:{}", self.peer);
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns,
                "etcd",
                "--name",
                "t",
                "--data-dir",
            ])
            .arg(&self.dir)
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
            .args([
                "--listen-peer-urls",
                &p,
                "--initial-advertise-peer-urls",
                &p,
            ])
            .args(["--initial-cluster", &format!("t={p}")])
            .args(["--heartbeat-interval", "10", "--election-timeout", "100"])
            .args(["--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd not found: apt-get install etcd-server");
        self.child = Some(child);
        let port = self.client;
        eventually("etcd healthy", || {
            let (code, body) = http(ns, port, "/health");
            code == 200 && body.contains("\"health\":\"true\"")
        });
    }

    /// SIGKILL: no goodbye to the clients.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A podnet daemon inside the namespace, its log in a file.
struct Daemon {
    name: &'static str,
    log: PathBuf,
    metrics: u16,
    child: Child,
}

impl Daemon {
    fn start(ns: &TestNs, dir: &Path, name: &'static str, store: &str, args: &[&str]) -> Daemon {
        let metrics = free_port(ns);
        let log = dir.join(format!("{name}.log"));
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name])
            .arg(env!("CARGO_BIN_EXE_podnet"))
            .args(["--store", store])
            .args(args)
            .args(["--metrics-addr", &format!("127.0.0.1:{metrics}")])
            .env("PODNET_WATCH_TIMEOUT", WATCH_TIMEOUT)
            .env("PODNET_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Daemon {
            name,
            log,
            metrics,
            child,
        }
    }

    fn readyz(&self, ns: &TestNs) -> (u16, String) {
        http(ns, self.metrics, "/readyz")
    }

    fn metrics(&self, ns: &TestNs) -> String {
        http(ns, self.metrics, "/metrics").1
    }

    /// The log, without colour codes.
    fn log(&self) -> String {
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

    /// Log lines with `what` for `component`.
    fn count(&self, what: &str, component: &str) -> usize {
        let tag = format!("component=\"{component}\"");
        self.log()
            .lines()
            .filter(|l| l.contains(what) && l.contains(&tag))
            .count()
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn podnet(ns: &TestNs, store: &str, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut c = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(env!("CARGO_BIN_EXE_podnet"))
        .args(["--store", store])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = c.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    let out = c.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn apply_service(ns: &TestNs, store: &str, name: &str) {
    let yaml = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\n\
         spec:\n  selector:\n    app: {name}\n  ports:\n  - port: 80\n    protocol: TCP\n"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (ok, out) = podnet(ns, store, &["apply", "-f", "-"], Some(&yaml));
        if ok {
            return;
        }
        assert!(Instant::now() < deadline, "applying Service {name}: {out}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The Service's ClusterIP once the controller has allocated it.
fn cluster_ip(ns: &TestNs, store: &str, name: &str) -> Option<String> {
    let (ok, out) = podnet(ns, store, &["get", "svc", name, "-o", "json"], None);
    if !ok {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    v["spec"]["clusterIP"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(String::from)
}

fn dig(ns: &TestNs, port: u16, name: &str) -> String {
    let (_, out) = ns.try_sh(&format!(
        "dig +short +time=1 +tries=1 @127.0.0.1 -p {port} {name} A"
    ));
    out.trim().to_string()
}

/// The agent's service table mentions the address.
fn proxied(ns: &TestNs, ip: &str) -> bool {
    let (_, out) = ns.try_sh("nft list table ip podnet");
    out.contains(ip)
}

/// Every watching loop of a daemon, with the daemon that runs it.
const LOOPS: [(usize, &str); 4] = [(0, "controller"), (1, "dns"), (2, "overlay"), (2, "agent")];

#[test]
fn readyz_follows_the_store_through_an_etcd_crash() {
    let ns = TestNs::new("hz");
    let dir = tempfile::tempdir().unwrap();
    // The node's underlay: a veth pair inside the namespace.
    ns.sh(
        "ip link add hz0 type veth peer name hz1 && ip addr add 10.251.0.1/24 dev hz0 \
         && ip link set hz0 up && ip link set hz1 up",
    );
    let mut etcd = Etcd::start(&ns, dir.path());
    let url = etcd.url();
    let dns_port = free_udp_port(&ns);
    let subnet_file = dir.path().join("subnet.env");
    let cni_dir = dir.path().join("net.d");
    let mut daemons = [
        Daemon::start(&ns, dir.path(), "controller", &url, &["controller"]),
        Daemon::start(
            &ns,
            dir.path(),
            "dns",
            &url,
            &[
                "dns",
                "--listen",
                &format!("127.0.0.1:{dns_port}"),
                "--upstream",
                "127.0.0.1:9",
                "--threads",
                "1",
            ],
        ),
        Daemon::start(
            &ns,
            dir.path(),
            "agent",
            &url,
            &[
                "agent",
                "--node",
                "hz-node",
                "--iface",
                "hz0",
                "--subnet-file",
                subnet_file.to_str().unwrap(),
                "--cni-conf-dir",
                cni_dir.to_str().unwrap(),
            ],
        ),
    ];
    for d in daemons.iter_mut() {
        eventually(&format!("{} ready", d.name), || {
            assert!(d.alive(), "{} exited:\n{}", d.name, d.log());
            d.readyz(&ns).0 == 200
        });
    }
    // Working before the crash.
    apply_service(&ns, &url, "before");
    let before_ip = {
        let mut ip = None;
        eventually("ClusterIP for before", || {
            ip = cluster_ip(&ns, &url, "before");
            ip.is_some()
        });
        ip.unwrap()
    };
    eventually("DNS answers before", || {
        dig(&ns, dns_port, "before.default.svc.cluster.local") == before_ip
    });
    eventually("proxy has before", || proxied(&ns, &before_ip));
    for (i, c) in LOOPS {
        let m = daemons[i].metrics(&ns);
        let series = format!("podnet_store_watch_up{{component=\"{c}\"}}");
        assert_eq!(metric(&m, &series), Some(1.0), "{c}: {m}");
        assert_eq!(daemons[i].count("store watch lost", c), 0, "{c}");
    }

    etcd.kill();
    for d in &daemons {
        eventually(&format!("{} not ready", d.name), || {
            let (code, body) = d.readyz(&ns);
            code == 503 && body.contains("store watch (") && body.contains(") lost")
        });
    }
    for (i, c) in LOOPS {
        let d = &daemons[i];
        let (_, body) = d.readyz(&ns);
        assert!(
            body.contains(&format!("store watch ({c}) lost")),
            "{}: {body}",
            d.name
        );
        let m = d.metrics(&ns);
        let up = format!("podnet_store_watch_up{{component=\"{c}\"}}");
        let losses = format!("podnet_store_watch_losses_total{{component=\"{c}\"}}");
        assert_eq!(metric(&m, &up), Some(0.0), "{c}: {m}");
        assert_eq!(metric(&m, &losses), Some(1.0), "{c}: {m}");
    }
    // The outage goes on through many probes and retries: still one line
    // per loop (the metric says how long, not the log).
    let lost_secs = |d: &Daemon, c: &str| {
        let series = format!("podnet_store_watch_lost_seconds{{component=\"{c}\"}}");
        metric(&d.metrics(&ns), &series).unwrap_or(0.0)
    };
    eventually("a long outage", || {
        LOOPS.iter().all(|&(i, c)| lost_secs(&daemons[i], c) >= 3.0)
    });
    for (i, c) in LOOPS {
        let d = &daemons[i];
        assert_eq!(d.count("store watch lost", c), 1, "{c}:\n{}", d.log());
        assert_eq!(d.count("store watch recovered", c), 0, "{c}:\n{}", d.log());
    }
    // Served from the last known state meanwhile.
    assert_eq!(
        dig(&ns, dns_port, "before.default.svc.cluster.local"),
        before_ip
    );

    etcd.launch(&ns);
    for d in &daemons {
        eventually(&format!("{} ready again", d.name), || {
            d.readyz(&ns).0 == 200
        });
    }
    for (i, c) in LOOPS {
        let d = &daemons[i];
        eventually(&format!("{c} recovery logged"), || {
            d.count("store watch recovered", c) >= 1
        });
        let m = d.metrics(&ns);
        let up = format!("podnet_store_watch_up{{component=\"{c}\"}}");
        let lost = format!("podnet_store_watch_lost_seconds{{component=\"{c}\"}}");
        assert_eq!(metric(&m, &up), Some(1.0), "{c}: {m}");
        assert_eq!(metric(&m, &lost), Some(0.0), "{c}: {m}");
    }

    // Really resumed: a Service made now is allocated, named and proxied.
    apply_service(&ns, &url, "after");
    let after_ip = {
        let mut ip = None;
        eventually("ClusterIP for after", || {
            ip = cluster_ip(&ns, &url, "after");
            ip.is_some()
        });
        ip.unwrap()
    };
    eventually("DNS answers after", || {
        dig(&ns, dns_port, "after.default.svc.cluster.local") == after_ip
    });
    eventually("proxy has after", || proxied(&ns, &after_ip));

    for (i, c) in LOOPS {
        let d = &daemons[i];
        assert_eq!(d.count("store watch lost", c), 1, "{c}:\n{}", d.log());
        assert_eq!(d.count("store watch recovered", c), 1, "{c}:\n{}", d.log());
        let m = d.metrics(&ns);
        let losses = format!("podnet_store_watch_losses_total{{component=\"{c}\"}}");
        assert_eq!(metric(&m, &losses), Some(1.0), "{c}: {m}");
    }
    for d in daemons.iter_mut() {
        assert!(d.alive(), "{} exited:\n{}", d.name, d.log());
    }
}
