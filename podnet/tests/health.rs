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

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use podnet_testkit::{eventually, free_port, http_get, Etcd, Proc, TestNs};

/// How long a watch may miss the store before it counts as lost (the
/// daemons' default is 10 s; the test lowers it through the environment).
const WATCH_TIMEOUT: &str = "2s";

/// The bound on every wait: generous, since the machine is shared.
const WAIT: Duration = Duration::from_secs(90);

/// A free UDP and TCP port inside the namespace.
fn free_udp_port(ns: &TestNs) -> u16 {
    loop {
        let p = ns
            .run(|| {
                UdpSocket::bind("127.0.0.1:0")
                    .and_then(|u| u.local_addr())
                    .map(|a| a.port())
            })
            .unwrap();
        if ns.run(|| TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return p;
        }
    }
}

/// One GET inside the namespace: the status code and the body (0 and
/// nothing when nothing answers).
fn http(ns: &TestNs, port: u16, path: &str) -> (u16, String) {
    http_get(
        Some(ns.netns()),
        SocketAddr::from(([127, 0, 0, 1], port)),
        path,
    )
    .unwrap_or_default()
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

/// A podnet daemon inside the namespace, its log in a file.
struct Daemon {
    name: &'static str,
    metrics: u16,
    proc: Proc,
}

impl Daemon {
    fn start(ns: &TestNs, dir: &Path, name: &'static str, store: &str, args: &[&str]) -> Daemon {
        let metrics = free_port(Some(ns.netns()));
        let mut cmd = ns.command(env!("CARGO_BIN_EXE_podnet"));
        cmd.args(["--store", store])
            .args(args)
            .args(["--metrics-addr", &format!("127.0.0.1:{metrics}")])
            .env("PODNET_WATCH_TIMEOUT", WATCH_TIMEOUT)
            .env("PODNET_LOG", "info")
            .env("NO_COLOR", "1");
        Daemon {
            name,
            metrics,
            proc: Proc::spawn(name, cmd, dir),
        }
    }

    fn readyz(&self, ns: &TestNs) -> (u16, String) {
        http(ns, self.metrics, "/readyz")
    }

    fn metrics(&self, ns: &TestNs) -> String {
        http(ns, self.metrics, "/metrics").1
    }

    /// Log lines with `what` for `component`.
    fn count(&self, what: &str, component: &str) -> usize {
        let tag = format!("component=\"{component}\"");
        self.proc
            .log()
            .lines()
            .filter(|l| l.contains(what) && l.contains(&tag))
            .count()
    }
}

fn podnet(ns: &TestNs, store: &str, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    use std::io::Write;
    let mut c = ns
        .command(env!("CARGO_BIN_EXE_podnet"))
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
    eventually(&format!("applying Service {name}"), WAIT, || {
        match podnet(ns, store, &["apply", "-f", "-"], Some(&yaml)) {
            (true, _) => Ok(()),
            (false, out) => Err(out),
        }
    });
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
    ns.nft_list("table ip podnet")
        .is_some_and(|t| t.contains(ip))
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
    let mut etcd = Etcd::start_in(&ns);
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
        eventually(&format!("{} ready", d.name), WAIT, || {
            d.proc.check();
            d.readyz(&ns).0 == 200
        });
    }
    // Working before the crash.
    apply_service(&ns, &url, "before");
    let before_ip = eventually("ClusterIP for before", WAIT, || {
        cluster_ip(&ns, &url, "before")
    });
    eventually("DNS answers before", WAIT, || {
        dig(&ns, dns_port, "before.default.svc.cluster.local") == before_ip
    });
    eventually("proxy has before", WAIT, || proxied(&ns, &before_ip));
    for (i, c) in LOOPS {
        let m = daemons[i].metrics(&ns);
        let series = format!("podnet_store_watch_up{{component=\"{c}\"}}");
        assert_eq!(metric(&m, &series), Some(1.0), "{c}: {m}");
        assert_eq!(daemons[i].count("store watch lost", c), 0, "{c}");
    }

    etcd.kill();
    for d in &daemons {
        eventually(&format!("{} not ready", d.name), WAIT, || {
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
    eventually("a long outage", WAIT, || {
        LOOPS.iter().all(|&(i, c)| lost_secs(&daemons[i], c) >= 3.0)
    });
    for (i, c) in LOOPS {
        let d = &daemons[i];
        assert_eq!(d.count("store watch lost", c), 1, "{c}:\n{}", d.proc.log());
        assert_eq!(
            d.count("store watch recovered", c),
            0,
            "{c}:\n{}",
            d.proc.log()
        );
    }
    // Served from the last known state meanwhile.
    assert_eq!(
        dig(&ns, dns_port, "before.default.svc.cluster.local"),
        before_ip
    );

    etcd.restart();
    for d in &daemons {
        eventually(&format!("{} ready again", d.name), WAIT, || {
            d.readyz(&ns).0 == 200
        });
    }
    for (i, c) in LOOPS {
        let d = &daemons[i];
        eventually(&format!("{c} recovery logged"), WAIT, || {
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
    let after_ip = eventually("ClusterIP for after", WAIT, || {
        cluster_ip(&ns, &url, "after")
    });
    eventually("DNS answers after", WAIT, || {
        dig(&ns, dns_port, "after.default.svc.cluster.local") == after_ip
    });
    eventually("proxy has after", WAIT, || proxied(&ns, &after_ip));

    for (i, c) in LOOPS {
        let d = &daemons[i];
        assert_eq!(d.count("store watch lost", c), 1, "{c}:\n{}", d.proc.log());
        assert_eq!(
            d.count("store watch recovered", c),
            1,
            "{c}:\n{}",
            d.proc.log()
        );
        let m = d.metrics(&ns);
        let losses = format!("podnet_store_watch_losses_total{{component=\"{c}\"}}");
        assert_eq!(metric(&m, &losses), Some(1.0), "{c}: {m}");
    }
    for d in daemons.iter_mut() {
        d.proc.check();
    }
}
