//! End-to-end tests in the lab: real agents on real namespaces, per backend.
//! The mesh, the Service and the DNS tests run in both modes: standalone
//! (the podnet store and `podnet controller`) and Kubernetes (`lab up
//! --kube`: a real etcd, kube-apiserver and kube-controller-manager, the
//! agents and DNS reading the API, objects written with a real kubectl).

use std::io::{Read, Write};
use std::process::{Command, Output};
use std::time::Duration;

use podnet_kernel::Netns;
use podnet_testkit::{eventually, http_get, nft, nft_list, require_root, try_sh_in};

/// The bound on every wait.
#[path = "common/kubectl.rs"]
mod kubectl;

const WAIT: Duration = Duration::from_secs(20);

struct Lab {
    name: String,
    /// A Kubernetes-mode lab (`lab up --kube`).
    kube: bool,
}

/// Which mode a test's lab runs in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Standalone,
    Kube,
    /// `--dual-stack`: pods get IPv6 addresses too.
    DualStack,
    KubeDualStack,
}

impl Mode {
    fn flags(self) -> &'static [&'static str] {
        match self {
            Mode::Standalone => &[],
            Mode::Kube => &["--kube"],
            Mode::DualStack => &["--dual-stack"],
            Mode::KubeDualStack => &["--kube", "--dual-stack"],
        }
    }
}

fn podnet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_podnet"))
        .args(args)
        .output()
        .expect("run podnet")
}

impl Lab {
    fn up(tag: &str, backend: &str, nodes: usize) -> Lab {
        Lab::up_in(Mode::Standalone, tag, backend, nodes)
    }

    fn up_in(mode: Mode, tag: &str, backend: &str, nodes: usize) -> Lab {
        Lab::up_with(tag, backend, nodes, mode.flags())
    }

    /// A standalone lab (or `--kube` in `extra`) with more `lab up` flags.
    fn up_with(tag: &str, backend: &str, nodes: usize, extra: &[&str]) -> Lab {
        require_root();
        let name = format!("{tag}{}", std::process::id() % 100_000);
        let lab = Lab {
            name,
            kube: extra.contains(&"--kube"),
        };
        let n = nodes.to_string();
        let mut args = vec!["up", "--nodes", &n, "--backend", backend, "--resync", "1"];
        args.extend_from_slice(extra);
        lab.ok(&args);
        lab
    }

    /// `kubectl ARGS` against a Kubernetes-mode lab, with `stdin`.
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        kubectl::run(&kubectl::path(), &self.name, args, stdin)
    }

    /// A Service as JSON, from the store or the API (Null when absent).
    fn service_json(&self, name: &str) -> serde_json::Value {
        self.service_json_in(name, "default")
    }

    fn service_json_in(&self, name: &str, ns: &str) -> serde_json::Value {
        let o = if self.kube {
            self.kubectl(&["get", "svc", name, "-n", ns, "-o", "json"], None)
        } else {
            podnet(&[
                "--store",
                &self.store(),
                "get",
                "svc",
                name,
                "-n",
                ns,
                "-o",
                "json",
            ])
        };
        serde_json::from_slice(&o.stdout).unwrap_or_default()
    }

    fn run(&self, args: &[&str]) -> Output {
        let mut a = vec!["lab", "--name", &self.name];
        a.extend_from_slice(args);
        podnet(&a)
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "lab {args:?}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    fn pod(&self, name: &str, node: &str) -> String {
        self.ok(&[
            "run",
            &format!("default/{name}"),
            "--node",
            node,
            "--ports",
            "8080/tcp,8081/udp",
        ]);
        self.pod_record(name)["ip"].as_str().unwrap().to_string()
    }

    fn pod_netns(&self, name: &str) -> String {
        self.pod_record(name)["netns"].as_str().unwrap().to_string()
    }

    /// What `lab run` recorded for pod `default/NAME`.
    fn pod_record(&self, name: &str) -> serde_json::Value {
        self.pod_record_in("default", name)
    }

    fn pod_record_in(&self, ns: &str, name: &str) -> serde_json::Value {
        serde_json::from_slice(
            &std::fs::read(format!(
                "/run/podnet-lab/{}/pods/{ns}_{name}.json",
                self.name
            ))
            .unwrap(),
        )
        .unwrap()
    }

    fn node_ns(&self, node: &str) -> String {
        format!("pn-{}-{node}", self.name)
    }

    fn sh(&self, ns: &str, cmd: &str) -> (bool, String) {
        try_sh_in(ns, cmd)
    }

    /// `nft list WHAT` in a node's namespace; `None` when absent.
    fn nft_list(&self, node: &str, what: &str) -> Option<String> {
        nft_list(Some(&self.node_ns(node)), what)
    }

    /// Waits until the node's (restarted) agent answers `/readyz` on the
    /// lab's metrics address: it has synced the node once.
    fn agent_ready(&self, node: &str) {
        let ns = Netns::named(&self.node_ns(node)).unwrap();
        let addr = ([127, 0, 0, 1], 10249).into();
        self.eventually(&format!("the agent on {node} ready"), || {
            http_get(Some(&ns), addr, "/readyz").is_some_and(|(code, _)| code == 200)
        });
    }

    fn mtu(&self) -> u32 {
        let env = std::fs::read_to_string(format!(
            "/run/podnet-lab/{}/nodes/node1/subnet.env",
            self.name
        ))
        .unwrap();
        env.lines()
            .find_map(|l| l.strip_prefix("FLANNEL_MTU="))
            .unwrap()
            .parse()
            .unwrap()
    }

    /// Routes, neighbours and FDB entries podnet owns on a node.
    fn kernel_state(&self, node: &str) -> String {
        let ns = self.node_ns(node);
        let (_, r) = self.sh(&ns, "ip route show proto 112; ip neigh show nud permanent; bridge fdb show dev podnet.1 2>/dev/null | grep dst || true");
        r
    }

    fn eventually(&self, what: &str, f: impl FnMut() -> bool) {
        eventually(what, WAIT, f)
    }
}

/// A TCP echo on port 9000 in one pod, connected from another: the first
/// round trip is done by [`Echo::open`], later ones prove the connection
/// outlived whatever happened in between.
struct Echo;

impl Echo {
    fn open(
        lab: &Lab,
        server_pod: &str,
        client_pod: &str,
        addr: &str,
    ) -> (std::net::TcpStream, std::thread::JoinHandle<()>) {
        let listener = lab.listen_in(server_pod, 9000);
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 64];
            for _ in 0..2 {
                let n = s.read(&mut buf).unwrap();
                s.write_all(&buf[..n]).unwrap();
            }
        });
        let mut conn = lab.connect_from(client_pod, addr, 9000);
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Self::round_trip(&mut conn, b"before");
        (conn, server)
    }

    fn round_trip(conn: &mut std::net::TcpStream, msg: &[u8]) {
        let mut buf = [0u8; 64];
        conn.write_all(msg).unwrap();
        let n = conn.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], msg, "the connection broke");
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.run(&["down"]);
    }
}

impl Lab {
    /// A TCP listener on `port` inside pod `pod`'s namespace.
    fn listen_in(&self, pod: &str, port: u16) -> std::net::TcpListener {
        Netns::named(&self.pod_netns(pod))
            .unwrap()
            .run(|| std::net::TcpListener::bind(("::", port)))
            .unwrap()
            .unwrap()
    }

    /// A TCP connection from pod `pod`'s namespace to `addr:port`.
    fn connect_from(&self, pod: &str, addr: &str, port: u16) -> std::net::TcpStream {
        Netns::named(&self.pod_netns(pod))
            .unwrap()
            .run(|| std::net::TcpStream::connect((addr, port)))
            .unwrap()
            .unwrap()
    }
}

/// Streams 8 MiB from `client_pod` to `server_pod` at `addr` and back over
/// one TCP connection, and checks every byte: large writes leave as TCP
/// super-packets, so this is what exercises segmentation and coalescing
/// in a backend (the UDP tunnel does both in userspace).
fn bulk_echo(lab: &Lab, client_pod: &str, server_pod: &str, addr: &str) {
    const LEN: usize = 8 << 20;
    let listener = lab.listen_in(server_pod, 9001);
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = vec![0u8; 256 << 10];
        let mut left = LEN;
        while left > 0 {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "client closed early");
            s.write_all(&buf[..n]).unwrap();
            left -= n;
        }
    });
    let data: Vec<u8> = (0..LEN).map(|i| (i * 131 + (i >> 13)) as u8).collect();
    let conn = lab.connect_from(client_pod, addr, 9001);
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut w = conn.try_clone().unwrap();
    let sent = data.clone();
    let writer = std::thread::spawn(move || w.write_all(&sent).unwrap());
    let mut back = vec![0u8; LEN];
    let mut r = conn;
    r.read_exact(&mut back).expect("the whole echo back");
    writer.join().unwrap();
    server.join().unwrap();
    assert!(back == data, "echoed bytes differ");
}

/// Every pod reaches every other on TCP and UDP by pod IP, sees the real
/// client address, and full-MTU packets cross without fragmentation.
fn full_mesh(backend: &str, tag: &str) {
    full_mesh_in(Mode::Standalone, backend, tag)
}

fn full_mesh_in(mode: Mode, backend: &str, tag: &str) {
    full_mesh_with(mode, backend, tag, &[]);
}

/// [`full_mesh_in`] with more `lab up` flags; returns the lab and the
/// pods' addresses.
fn full_mesh_with(mode: Mode, backend: &str, tag: &str, flags: &[&str]) -> (Lab, Vec<String>) {
    let mut extra = flags.to_vec();
    extra.extend_from_slice(mode.flags());
    let lab = Lab::up_with(tag, backend, 3, &extra);
    let ips: Vec<String> = (1..=3)
        .map(|i| lab.pod(&format!("p{i}"), &format!("node{i}")))
        .collect();
    for i in 0..3 {
        for j in 0..3 {
            if i == j {
                continue;
            }
            let from = format!("default/p{}", i + 1);
            assert_eq!(
                lab.ok(&["probe", &from, &format!("{}:8080", ips[j])]),
                format!("p{}", j + 1),
                "tcp p{i}->p{j}"
            );
            assert_eq!(
                lab.ok(&["probe", &from, &format!("{}:8081/udp", ips[j])]),
                format!("p{}", j + 1),
                "udp p{i}->p{j}"
            );
            assert_eq!(
                lab.ok(&[
                    "probe",
                    &from,
                    &format!("{}:8080", ips[j]),
                    "--ask",
                    "clientip"
                ]),
                ips[i],
                "NAT between pods"
            );
            assert_eq!(
                lab.ok(&[
                    "probe",
                    &from,
                    &format!("{}:8081/udp", ips[j]),
                    "--ask",
                    "clientip"
                ]),
                ips[i],
                "NAT between pods (udp)"
            );
        }
    }
    // The path MTU is exactly the pod MTU: full-size packets with DF pass,
    // one byte more does not.
    let mtu = lab.mtu();
    let p1 = lab.pod_netns("p1");
    let (ok, out) = lab.sh(
        &p1,
        &format!("ping -M do -c 1 -W 2 -s {} {}", mtu - 28, ips[1]),
    );
    assert!(ok, "DF ping at MTU {mtu} failed: {out}");
    let (ok, _) = lab.sh(
        &p1,
        &format!("ping -M do -c 1 -W 2 -s {} {}", mtu - 27, ips[1]),
    );
    assert!(!ok, "a packet above the MTU went through");
    bulk_echo(&lab, "p1", "p2", &ips[1]);
    // Pods reach the outside (the underlay) masqueraded as their node.
    let (ok, out) = lab.sh(&p1, "ping -c 1 -W 2 192.168.200.12");
    assert!(
        ok,
        "pod cannot reach another node's underlay address: {out}"
    );
    (lab, ips)
}

#[test]
fn vxlan_full_mesh() {
    full_mesh("vxlan", "vx");
}

#[test]
fn host_gw_full_mesh() {
    full_mesh("host-gw", "hg");
}

#[test]
fn vxlan_full_mesh_kube() {
    full_mesh_in(Mode::Kube, "vxlan", "vxk");
}

#[test]
fn host_gw_full_mesh_kube() {
    full_mesh_in(Mode::Kube, "host-gw", "hgk");
}

#[test]
fn udp_full_mesh_kube() {
    full_mesh_in(Mode::Kube, "udp", "udk");
}

#[test]
fn udp_full_mesh() {
    full_mesh("udp", "ud");
}

#[test]
fn bgp_full_mesh() {
    full_mesh("bgp", "bg");
}

#[test]
fn bgp_full_mesh_kube() {
    full_mesh_in(Mode::Kube, "bgp", "bgk");
}

/// The bgp backend: no tunnel device, each other node's subnet routed via
/// its underlay address as learned over the mesh; an agent restart loses
/// no packet of a stream across nodes (the kernel keeps forwarding while
/// the restarted speaker hears its peers' tables, and the peers keep its
/// routes: graceful restart); a node that leaves is withdrawn and one
/// that joins is reachable without restarting anyone.
#[test]
fn bgp_mesh_follows_nodes_and_survives_agent_restarts() {
    let lab = Lab::up("bgr", "bgp", 3);
    let _ip1 = lab.pod("p1", "node1");
    let ip2 = lab.pod("p2", "node2");
    let _ip3 = lab.pod("p3", "node3");
    let n1 = lab.node_ns("node1");
    let tunnels = lab.sh(&n1, "ip link show type vxlan; ip tuntap show").1;
    assert!(
        tunnels.trim().is_empty(),
        "a tunnel device on a bgp node: {tunnels}"
    );
    let routes = lab.kernel_state("node1");
    assert_eq!(routes.matches(" via 192.168.200.").count(), 2, "{routes}");

    // A stream of pings from p1 to p2 across both agents' restarts.
    let ping = Command::new("ip")
        .args(["netns", "exec", &lab.pod_netns("p1"), "ping", "-i", "0.02"])
        .arg(&ip2)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("ping");
    let (mut conn, server) = Echo::open(&lab, "p2", "p1", &ip2);
    let before = lab.kernel_state("node1");
    lab.ok(&["restart-agent", "node1"]);
    lab.ok(&["restart-agent", "node2"]);
    lab.agent_ready("node1");
    lab.agent_ready("node2");
    lab.eventually("the routes as before", || {
        lab.kernel_state("node1") == before
    });
    // ping prints its count on SIGINT.
    unsafe { libc::kill(ping.id() as i32, libc::SIGINT) };
    let out = String::from_utf8_lossy(&ping.wait_with_output().unwrap().stdout).into_owned();
    assert!(out.contains(" received,"), "no ping summary: {out}");
    assert!(
        out.contains(" 0% packet loss"),
        "packets lost across the agents' restarts: {out}"
    );
    assert_eq!(
        before,
        lab.kernel_state("node1"),
        "a restart changed routes"
    );
    Echo::round_trip(&mut conn, b"after");
    server.join().unwrap();

    // A node leaves: its subnet is withdrawn everywhere.
    lab.ok(&["remove-node", "node3"]);
    lab.eventually("node3's subnet gone from node1", || {
        lab.kernel_state("node1").matches(" via ").count() == 1
    });
    // A node joins: reachable both ways without restarting anyone.
    let added = lab.ok(&["add-node"]);
    let new_node = added.split_whitespace().nth(1).unwrap().to_string();
    let ip4 = lab.pod("p4", &new_node);
    assert_eq!(
        lab.ok(&["probe", "default/p1", &format!("{ip4}:8080")]),
        "p4"
    );
    assert_eq!(
        lab.ok(&["probe", "default/p4", &format!("{ip2}:8081/udp")]),
        "p2"
    );
}

#[test]
fn nodes_leave_and_join_and_agents_restart() {
    let lab = Lab::up("ch", "vxlan", 3);
    let ip1 = lab.pod("p1", "node1");
    let ip2 = lab.pod("p2", "node2");
    let _ip3 = lab.pod("p3", "node3");

    // A long-lived TCP connection from p1 to p2.
    let (mut conn, server) = Echo::open(&lab, "p2", "p1", &ip2);

    // Someone switches the pod bridge's netfilter hooks off; the restarted
    // agent switches them back on (same-node Service replies need them).
    let n1 = lab.node_ns("node1");
    let brnf = "sysctl -n net.bridge.bridge-nf-call-iptables";
    assert_eq!(
        lab.sh(&n1, brnf).1.trim(),
        "1",
        "br_netfilter must be available on the test machine"
    );
    lab.sh(&n1, "sysctl -qw net.bridge.bridge-nf-call-iptables=0");

    // Agents killed and restarted: kernel state unchanged, connection alive.
    let before: Vec<String> = ["node1", "node2"]
        .iter()
        .map(|n| lab.kernel_state(n))
        .collect();
    lab.ok(&["restart-agent", "node1"]);
    lab.ok(&["restart-agent", "node2"]);
    lab.agent_ready("node1");
    lab.agent_ready("node2");
    let after: Vec<String> = ["node1", "node2"]
        .iter()
        .map(|n| lab.kernel_state(n))
        .collect();
    assert_eq!(before, after, "an agent restart changed kernel state");
    Echo::round_trip(&mut conn, b"after");
    server.join().unwrap();
    lab.eventually("bridge netfilter back on", || {
        lab.sh(&n1, brnf).1.trim() == "1"
    });
    // ... and the running agent repairs it at its next resync.
    lab.sh(&n1, "sysctl -qw net.bridge.bridge-nf-call-iptables=0");
    lab.eventually("bridge netfilter repaired", || {
        lab.sh(&n1, brnf).1.trim() == "1"
    });

    // A route deleted by hand comes back within the resync period.
    let subnet2 = {
        let (_, r) = lab.sh(
            &n1,
            &format!(
                "ip route show proto 112 | grep '{}'",
                ip2.rsplit_once('.').unwrap().0
            ),
        );
        r.split_whitespace().next().unwrap().to_string()
    };
    lab.sh(&n1, &format!("ip route del {subnet2}"));
    lab.eventually("route restored", || {
        lab.sh(&n1, "ip route show proto 112").1.contains(&subnet2)
    });
    assert_eq!(
        lab.ok(&["probe", "default/p1", &format!("{ip2}:8080")]),
        "p2"
    );

    // A node leaves: the others drop its routes, neighbour and FDB entries.
    let st3 = lab.kernel_state("node1");
    assert_eq!(st3.matches("onlink").count(), 2, "{st3}");
    lab.ok(&["remove-node", "node3"]);
    lab.eventually("node3 gone from node1", || {
        let s = lab.kernel_state("node1");
        s.matches("onlink").count() == 1
            && s.matches("PERMANENT").count() == 1
            && s.matches(" dst ").count() == 1
    });
    // A node joins: reachable without restarting anyone.
    let added = lab.ok(&["add-node"]);
    let new_node = added.split_whitespace().nth(1).unwrap().to_string();
    let ip4 = lab.pod("p4", &new_node);
    assert_eq!(
        lab.ok(&["probe", "default/p1", &format!("{ip4}:8080")]),
        "p4"
    );
    assert_eq!(
        lab.ok(&["probe", "default/p4", &format!("{ip1}:8081/udp")]),
        "p1"
    );
}

/// `--no-policy` takes NetworkPolicy off the node: the policy table an
/// earlier agent left is removed, so nothing judges (or fails closed on)
/// pods with nobody updating it. This is also the way down to a version
/// without NetworkPolicy (podnet/tests/upgrade.rs shows why it is needed).
#[test]
fn an_agent_without_policy_removes_the_policy_table() {
    let lab = Lab::up("np", "vxlan", 1);
    let n1 = lab.node_ns("node1");
    let table = |ns: &str| podnet_testkit::nft_list(Some(ns), "table ip podnet-policy");
    eventually("node1's policy table", WAIT, || table(&n1).is_some());
    lab.ok(&["stop-agent", "node1"]);
    assert!(table(&n1).is_some(), "a stopped agent leaves its tables");
    let l = podnet_lab::Lab::new(&lab.name, env!("CARGO_BIN_EXE_podnet").into()).unwrap();
    let st = l.state().unwrap();
    let mut args = l.daemon_args(&st, podnet_lab::Daemon::Agent(&st.nodes[0]));
    args.push("--no-policy".into());
    let mut cmd = podnet_testkit::command_in(&n1, env!("CARGO_BIN_EXE_podnet"));
    cmd.args(&args);
    let logs = tempfile::tempdir().unwrap();
    let agent = podnet_testkit::Proc::spawn("agent", cmd, logs.path());
    eventually("the policy table gone, and said so", WAIT, || {
        agent.check();
        table(&n1).is_none()
            && agent
                .log()
                .contains("removed the nft table ip podnet-policy")
    });
    // A pod started now is reachable: nothing judges it.
    let ip = lab.pod("late", "node1");
    lab.pod("peer", "node1");
    let who = lab.ok(&["probe", "default/peer", &format!("{ip}:8080")]);
    assert_eq!(who, "late");
    drop(agent);
    // The lab's agent, policy on, puts it back.
    lab.ok(&["restart-agent", "node1"]);
    eventually("node1's policy table back", WAIT, || table(&n1).is_some());
}

#[test]
fn lab_down_after_a_crash_leaves_nothing() {
    let lab = Lab::up("cr", "host-gw", 2);
    lab.pod("p1", "node1");
    // Crash: kill every lab process hard.
    let pids = std::fs::read_dir(format!("/run/podnet-lab/{}/pids", lab.name)).unwrap();
    for p in pids.flatten() {
        let pid: i32 = std::fs::read_to_string(p.path())
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    lab.ok(&["down"]);
    let left: Vec<String> = std::fs::read_dir("/run/netns")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("pn-{}-", lab.name)))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(!std::path::Path::new(&format!("/run/podnet-lab/{}", lab.name)).exists());
    let marker = format!("podnet-lab/{}/", lab.name);
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| {
            c.contains(&marker) && c.split(' ').next().unwrap_or_default().ends_with("podnet")
        })
        .collect();
    assert!(left.is_empty(), "processes left: {left:?}");
}

#[test]
fn services_through_the_proxy() {
    services_through_the_proxy_in(Mode::Standalone, "sv");
}

#[test]
fn services_through_the_proxy_kube() {
    services_through_the_proxy_in(Mode::Kube, "svk");
}

/// The same in a dual-stack lab (Services are IPv4: their suite must not
/// mind the pods' second family).
#[test]
fn services_through_the_proxy_dual_stack() {
    services_through_the_proxy_in(Mode::DualStack, "svd");
}

#[test]
fn services_through_the_proxy_dual_stack_kube() {
    services_through_the_proxy_in(Mode::KubeDualStack, "svq");
}

fn services_through_the_proxy_in(mode: Mode, tag: &str) {
    let lab = Lab::up_in(mode, tag, "vxlan", 2);
    lab.ok(&[
        "run",
        "default/w1",
        "--node",
        "node1",
        "--labels",
        "app=web",
        "--ports",
        "8080/tcp,8081/udp",
    ]);
    lab.ok(&[
        "run",
        "default/w2",
        "--node",
        "node2",
        "--labels",
        "app=web",
        "--ports",
        "8080/tcp,8081/udp",
    ]);
    lab.ok(&[
        "run",
        "default/c",
        "--node",
        "node1",
        "--labels",
        "app=client",
        "--ports",
        "80/tcp",
    ]);
    let c_ip = lab.pod("c2", "node2");
    let dual = matches!(mode, Mode::DualStack | Mode::KubeDualStack);
    lab.apply(&suite_services(dual));
    let cip = {
        let mut ip = String::new();
        lab.eventually("a ClusterIP", || {
            let v = lab.service_json("web");
            ip = v["spec"]["clusterIP"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            !ip.is_empty()
        });
        ip
    };
    // Both endpoints answer through the ClusterIP, over TCP and UDP.
    let mut seen = std::collections::BTreeSet::new();
    lab.eventually("both endpoints behind the ClusterIP", || {
        if let Ok(who) = String::from_utf8(
            lab.run(&["probe", "default/c", &format!("{cip}:80")])
                .stdout,
        ) {
            seen.insert(who.trim().to_string());
        }
        seen.contains("w1") && seen.contains("w2")
    });
    lab.eventually("udp through the ClusterIP", || {
        let o = lab.run(&["probe", "default/c", &format!("{cip}:53/udp")]);
        o.status.success() && String::from_utf8_lossy(&o.stdout).trim().starts_with('w')
    });
    // Pod-to-Service keeps the pod's source address.
    assert_eq!(
        lab.ok(&[
            "probe",
            "default/c2",
            &format!("{cip}:80"),
            "--ask",
            "clientip"
        ]),
        c_ip
    );
    // A Service without endpoints is rejected ("connection refused"), not
    // timed out.
    let e = probe_err(&lab, "c", "10.96.0.99:80");
    assert!(refused(&e), "no-endpoint Service must be rejected: {e}");
    // NodePort from another node's namespace reaches an endpoint.
    let (ok, out) = lab.sh(
        &lab.node_ns("node2"),
        "bash -c 'exec 3<>/dev/tcp/192.168.200.11/30080; echo hostname >&3; cat <&3'",
    );
    assert!(ok && out.trim().starts_with('w'), "{out}");
    // The rules are data: one map element per Service port.
    let table = lab.nft_list("node1", "map ip podnet service-ips");
    assert!(
        table
            .as_ref()
            .is_some_and(|t| t.contains(&format!("{cip} . tcp . 80"))),
        "{table:?}"
    );
    if dual {
        services_over_ipv6(&lab);
    }
}

/// The Service suite's Services: `web` (NodePort 30080, TCP and UDP) and
/// `empty` (a fixed ClusterIP, no endpoints); on a dual-stack lab both
/// get both families.
fn suite_services(dual: bool) -> String {
    let (web_fams, empty_ips) = match dual {
        true => (
            "  ipFamilyPolicy: PreferDualStack\n",
            ", clusterIPs: [10.96.0.99, 'fd00:10:96::99'], ipFamilyPolicy: RequireDualStack",
        ),
        false => ("", ""),
    };
    format!("apiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nspec:\n  selector: {{app: web}}\n  type: NodePort\n{web_fams}  \
        ports: [{{name: http, port: 80, targetPort: 8080, nodePort: 30080}}, {{name: dns, port: 53, targetPort: 8081, protocol: UDP}}]\n\
        ---\napiVersion: v1\nkind: Service\nmetadata: {{name: empty}}\nspec: {{clusterIP: 10.96.0.99{empty_ips}, selector: {{app: none}}, ports: [{{port: 80}}]}}\n")
}

/// The dual-stack half of the Service suite: `web`'s IPv6 ClusterIP
/// reaches both endpoints over TCP and UDP, keeps the client's IPv6
/// address, `empty`'s IPv6 ClusterIP is refused, and the `ip6` table
/// holds the Service as data.
fn services_over_ipv6(lab: &Lab) {
    let mut cip6 = String::new();
    lab.eventually("an IPv6 ClusterIP", || {
        let v = lab.service_json("web");
        let ips = &v["spec"]["clusterIPs"];
        cip6 = ips[1].as_str().unwrap_or_default().to_string();
        assert!(
            ips.as_array().is_none_or(|a| a.len() <= 2),
            "{ips}: at most one per family"
        );
        cip6.contains(':')
    });
    assert!(cip6.starts_with("fd00:10:96::"), "{cip6}");
    let v = lab.service_json("web");
    assert_eq!(v["spec"]["ipFamilies"], serde_json::json!(["IPv4", "IPv6"]));
    let mut seen = std::collections::BTreeSet::new();
    lab.eventually("both endpoints behind the IPv6 ClusterIP", || {
        let o = lab.run(&["probe", "default/c", &format!("[{cip6}]:80")]);
        seen.insert(String::from_utf8_lossy(&o.stdout).trim().to_string());
        seen.contains("w1") && seen.contains("w2")
    });
    lab.eventually("udp through the IPv6 ClusterIP", || {
        let o = lab.run(&["probe", "default/c", &format!("[{cip6}]:53/udp")]);
        o.status.success() && String::from_utf8_lossy(&o.stdout).trim().starts_with('w')
    });
    let c2_6 = lab.pod_record("c2")["ip6"]
        .as_str()
        .expect("c2 has an IPv6 address")
        .to_string();
    assert_eq!(
        lab.ok(&[
            "probe",
            "default/c2",
            &format!("[{cip6}]:80"),
            "--ask",
            "clientip"
        ]),
        c2_6
    );
    let e = probe_err(lab, "c", "[fd00:10:96::99]:80");
    assert!(
        refused(&e),
        "no-endpoint IPv6 Service must be rejected: {e}"
    );
    // The NodePort on node1's IPv6 underlay address, from node2 (a
    // dual-stack node's NodePorts are on its primary address of each
    // family, as kube-proxy's default).
    let (ok, out) = lab.sh(
        &lab.node_ns("node2"),
        "bash -c 'exec 3<>/dev/tcp/fd00:192:168:200::11/30080; echo hostname >&3; cat <&3'",
    );
    assert!(
        ok && out.trim().starts_with('w'),
        "NodePort over IPv6: {out}"
    );
    let table = lab.nft_list("node1", "map ip6 podnet service-ips");
    assert!(
        table
            .as_ref()
            .is_some_and(|t| t.contains(&format!("{cip6} . tcp . 80"))),
        "{table:?}"
    );
}

#[test]
fn lab_on_etcd() {
    require_root();
    let etcd = podnet_testkit::Etcd::start();
    let lab = Lab {
        name: format!("et{}", std::process::id() % 100_000),
        kube: false,
    };
    let o = podnet(&[
        "--store",
        &etcd.url(),
        "lab",
        "--name",
        &lab.name,
        "up",
        "--nodes",
        "2",
        "--backend",
        "host-gw",
        "--resync",
        "1",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let _a = lab.pod("a", "node1");
    let b = lab.pod("b", "node2");
    assert_eq!(lab.ok(&["probe", "default/a", &format!("{b}:8080")]), "b");
    let pods = podnet(&["--store", &etcd.url(), "get", "po", "-o", "name"]);
    assert!(String::from_utf8_lossy(&pods.stdout).contains("pod/b"));
}

impl Lab {
    fn pod_labelled(&self, name: &str, node: &str, labels: &str) -> String {
        self.ok(&[
            "run",
            &format!("default/{name}"),
            "--node",
            node,
            "--labels",
            labels,
            "--ports",
            "8080/tcp,8081/udp",
        ]);
        self.pod_ip(name)
    }

    fn pod_ip(&self, name: &str) -> String {
        self.pod_record(name)["ip"].as_str().unwrap().to_string()
    }

    fn store(&self) -> String {
        format!("sqlite:///run/podnet-lab/{}/state.db", self.name)
    }

    fn apply(&self, manifest: &str) {
        if self.kube {
            let o = self.kubectl(&["apply", "-f", "-"], Some(manifest));
            assert!(
                o.status.success(),
                "kubectl apply failed: {}\n{manifest}",
                String::from_utf8_lossy(&o.stderr)
            );
            return;
        }
        let mut p = Command::new(env!("CARGO_BIN_EXE_podnet"))
            .args(["--store", &self.store(), "apply", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        p.stdin
            .take()
            .unwrap()
            .write_all(manifest.as_bytes())
            .unwrap();
        assert!(p.wait().unwrap().success(), "apply failed:\n{manifest}");
    }

    /// A Service's spec once the controller has filled it in.
    fn spec(&self, svc: &str, field: &str) -> serde_json::Value {
        let mut v = serde_json::Value::Null;
        self.eventually(&format!("{svc} spec.{field}"), || {
            v = self.service_json(svc)["spec"][field].clone();
            !v.is_null()
        });
        v
    }
}

/// One TCP request from a namespace with bash: `ask` sent, the answer back.
fn ask_from(lab: &Lab, ns: &str, addr: &str, port: u16, ask: &str) -> (bool, String) {
    lab.sh(
        ns,
        &format!("timeout 3 bash -c 'exec 3<>/dev/tcp/{addr}/{port}; echo {ask} >&3; cat <&3'"),
    )
}

/// Every Service type through real agents: externalIPs and LB IPs from
/// outside the cluster, `externalTrafficPolicy: Local` with its health
/// check and preserved client IP, affinity, hairpin, a connection that
/// outlives agent restarts, a deleted table rebuilt, and `--cleanup`.
#[test]
fn service_types_from_outside_and_inside() {
    service_types_in(Mode::Standalone, "st");
}

#[test]
fn service_types_from_outside_and_inside_kube() {
    service_types_in(Mode::Kube, "stk");
}

fn service_types_in(mode: Mode, tag: &str) {
    let lab = Lab::up_in(mode, tag, "vxlan", 2);
    lab.pod_labelled("w1", "node1", "app=web");
    lab.pod_labelled("w2", "node2", "app=web");
    let c_ip = lab.pod_labelled("c", "node2", "app=client");
    let l1_ip = lab.pod_labelled("l1", "node1", "app=loc");
    lab.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: sticky}\n\
         spec: {selector: {app: web}, sessionAffinity: ClientIP, ports: [{port: 80, targetPort: 8080}]}\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {name: ext}\n\
         spec: {selector: {app: web}, externalIPs: [203.0.113.10], ports: [{port: 80, targetPort: 8080}]}\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {name: loc}\n\
         spec:\n  selector: {app: loc}\n  type: LoadBalancer\n  externalTrafficPolicy: Local\n  \
         ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30081}, {name: long, port: 9000, targetPort: 9000}]\n\
         status: {loadBalancer: {ingress: [{ip: 203.0.113.20}]}}\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {name: plain}\n\
         spec: {selector: {app: loc}, ports: [{port: 80, targetPort: 8080}]}\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {name: spread}\n\
         spec: {selector: {app: web}, ports: [{port: 80, targetPort: 8080}]}\n",
    );
    if lab.kube {
        // The API server keeps status out of apply: the LB IP is written
        // to the status subresource, as a load-balancer controller does.
        let o = lab.kubectl(
            &[
                "patch",
                "svc",
                "loc",
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"loadBalancer":{"ingress":[{"ip":"203.0.113.20"}]}}}"#,
            ],
            None,
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    // A client outside the cluster: an address on the underlay bridge, with
    // the external and LB IPs routed to node1.
    let out = format!("pn-{}-net", lab.name);
    let (ok, msg) = lab.sh(
        &out,
        "ip addr add 192.168.200.250/24 dev br0 && \
         ip route add 203.0.113.10/32 via 192.168.200.11 && \
         ip route add 203.0.113.20/32 via 192.168.200.11",
    );
    assert!(ok, "{msg}");
    let (n1, n2) = ("192.168.200.11", "192.168.200.12");
    let hc = lab.spec("loc", "healthCheckNodePort").as_u64().unwrap() as u16;
    let loc_ip = lab.spec("loc", "clusterIP").as_str().unwrap().to_string();
    let sticky_ip = lab
        .spec("sticky", "clusterIP")
        .as_str()
        .unwrap()
        .to_string();

    // externalIP from outside reaches an endpoint (masqueraded: either node).
    lab.eventually("externalIP from outside", || {
        let (ok, o) = ask_from(&lab, &out, "203.0.113.10", 80, "hostname");
        ok && o.trim().starts_with('w')
    });
    // LB IP with Local: the endpoint sees the real client address.
    lab.eventually("LB IP from outside, client IP kept", || {
        ask_from(&lab, &out, "203.0.113.20", 80, "clientip")
            .1
            .trim()
            == "192.168.200.250"
    });
    // NodePort with Local: the node with the endpoint answers with the
    // client address; the other node has none and does not forward.
    assert_eq!(
        ask_from(&lab, &out, n1, 30081, "clientip").1.trim(),
        "192.168.200.250"
    );
    assert!(!ask_from(&lab, &out, n2, 30081, "hostname").0);
    // The health-check node port tells a load balancer which node to use.
    let health = |node: &str| {
        lab.sh(
            &out,
            &format!(
                "timeout 3 bash -c 'exec 3<>/dev/tcp/{node}/{hc}; printf \"GET /healthz HTTP/1.0\\r\\n\\r\\n\" >&3; cat <&3'"
            ),
        )
        .1
    };
    lab.eventually("health check 200 on node1", || {
        let h = health(n1);
        h.starts_with("HTTP/1.1 200") && h.contains("\"localEndpoints\":1")
    });
    let h2 = health(n2);
    assert!(
        h2.starts_with("HTTP/1.1 503") && h2.contains("\"localEndpoints\":0"),
        "{h2}"
    );
    // ClientIP affinity: one client always lands on the same endpoint.
    lab.eventually("sticky reachable", || {
        lab.run(&["probe", "default/c", &format!("{sticky_ip}:80")])
            .status
            .success()
    });
    let answers: std::collections::BTreeSet<String> = (0..8)
        .map(|_| lab.ok(&["probe", "default/c", &format!("{sticky_ip}:80")]))
        .collect();
    assert_eq!(answers.len(), 1, "affinity broken: {answers:?}");
    // Hairpin: a pod reaches itself through its own Service, masqueraded.
    assert_eq!(
        lab.ok(&["probe", "default/l1", &format!("{loc_ip}:80")]),
        "l1"
    );
    assert_ne!(
        lab.ok(&[
            "probe",
            "default/l1",
            &format!("{loc_ip}:80"),
            "--ask",
            "clientip"
        ]),
        l1_ip,
        "hairpin traffic must be masqueraded"
    );
    // The same through a plain ClusterIP (the fast path: map elements, no
    // per-Service chains): hairpin masqueraded, another pod's address kept.
    let plain_ip = lab.spec("plain", "clusterIP").as_str().unwrap().to_string();
    lab.eventually("plain ClusterIP on the fast path", || {
        lab.nft_list("node1", "set ip podnet fast-services")
            .is_some_and(|t| t.contains(&plain_ip))
    });
    let plain = format!("{plain_ip}:80");
    assert_eq!(lab.ok(&["probe", "default/l1", &plain]), "l1");
    assert_ne!(
        lab.ok(&["probe", "default/l1", &plain, "--ask", "clientip"]),
        l1_ip,
        "fast-path hairpin traffic must be masqueraded"
    );
    assert_eq!(
        lab.ok(&["probe", "default/c", &plain, "--ask", "clientip"]),
        c_ip,
        "pod-to-Service traffic keeps its source on the fast path"
    );
    let spread = format!("{}:80", lab.spec("spread", "clusterIP").as_str().unwrap());
    let answers: std::collections::BTreeSet<String> = (0..24)
        .map(|_| lab.ok(&["probe", "default/c", &spread]))
        .collect();
    assert_eq!(
        answers,
        std::collections::BTreeSet::from(["w1".to_string(), "w2".to_string()]),
        "the fast path spreads over both endpoints"
    );

    // A connection through the ClusterIP survives both agents restarting.
    let (mut conn, server) = Echo::open(&lab, "l1", "c", &loc_ip);
    let map = |node: &str| {
        (
            lab.nft_list(node, "map ip podnet service-ips"),
            lab.nft_list(node, "map ip podnet service-nodeports"),
        )
    };
    // A restarted agent's first sync replaces the table whole, so a new
    // table handle says the restarted proxy has synced.
    let handle = |node: &str| {
        nft(Some(&lab.node_ns(node)), "-a list table ip podnet")
            .ok()?
            .lines()
            .next()
            .filter(|l| l.contains("# handle"))
            .map(str::to_string)
    };
    let before = (map("node1"), map("node2"));
    let handles = (handle("node1"), handle("node2"));
    assert!(handles.0.is_some() && handles.1.is_some(), "{handles:?}");
    lab.ok(&["restart-agent", "node1"]);
    lab.ok(&["restart-agent", "node2"]);
    lab.eventually("restarted proxies synced", || {
        handle("node1") != handles.0 && handle("node2") != handles.1
    });
    assert_eq!(
        before,
        (map("node1"), map("node2")),
        "restart changed the maps"
    );
    Echo::round_trip(&mut conn, b"after");
    server.join().unwrap();

    // Someone deletes the table: the agent rebuilds it.
    let ns1 = lab.node_ns("node1");
    nft(Some(&ns1), "delete table ip podnet").unwrap();
    lab.eventually("table rebuilt", || {
        lab.nft_list("node1", "map ip podnet service-ips")
            .is_some_and(|t| t.contains(&format!("{sticky_ip} . tcp . 80")))
    });
    // So is the pod masquerade table.
    nft(Some(&ns1), "delete table ip podnet-masq").unwrap();
    lab.eventually("masquerade table rebuilt", || {
        lab.nft_list("node1", "table ip podnet-masq")
            .is_some_and(|t| t.contains("masquerade"))
    });

    // `--cleanup` (run by remove-node) leaves no proxy table behind.
    let tables_before = lab.nft_list("node2", "tables").unwrap();
    assert!(tables_before.contains("table ip podnet"), "{tables_before}");
    assert!(
        tables_before.contains("table ip podnet-policy"),
        "{tables_before}"
    );
    // A trace table a killed `podnet trace` left goes too.
    let ns2 = lab.node_ns("node2");
    nft(Some(&ns2), "add table inet podnet-trace").unwrap();
    let removed = lab.ok(&["stop-agent", "node2", "--cleanup"]);
    assert!(removed.contains("ip podnet"), "{removed}");
    assert!(removed.contains("ip podnet-policy"), "{removed}");
    assert!(removed.contains("inet podnet-trace"), "{removed}");
    let tables = lab.nft_list("node2", "tables").unwrap();
    assert!(!tables.contains("podnet"), "{tables}");
}

/// Pods resolve `svc`, `svc.ns` and `svc.ns.svc.cluster.local` through
/// their resolv.conf (cluster DNS behind the kube-dns Service, reached
/// through the agents' proxy) and connect to what they resolve.
#[test]
fn lab_pods_resolve_services() {
    lab_pods_resolve_services_in(Mode::Standalone, "dn");
}

#[test]
fn lab_pods_resolve_services_kube() {
    lab_pods_resolve_services_in(Mode::Kube, "dnk");
}

#[test]
fn lab_pods_resolve_services_dual_stack() {
    lab_pods_resolve_services_in(Mode::DualStack, "dnd");
}

#[test]
fn lab_pods_resolve_services_dual_stack_kube() {
    lab_pods_resolve_services_in(Mode::KubeDualStack, "dnq");
}

fn lab_pods_resolve_services_in(mode: Mode, tag: &str) {
    let lab = Lab::up_in(mode, tag, "vxlan", 2);
    for (pod, node, extra) in [
        (
            "pn-dns/web",
            "node2",
            vec!["--labels", "app=web", "--ports", "80/tcp"],
        ),
        ("pn-dns/client", "node1", vec!["--ports", "81/tcp"]),
        ("pn-other/far", "node2", vec!["--ports", "82/tcp"]),
    ] {
        let mut args = vec!["run", pod, "--node", node];
        args.extend(extra);
        lab.ok(&args);
    }
    lab.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: pn-dns}\n\
         spec: {selector: {app: web}, ports: [{name: http, port: 80, targetPort: 80}]}\n",
    );
    // Same namespace: the short name; other namespace: svc.ns; and the FQDN.
    for (pod, name) in [
        ("pn-dns/client", "web"),
        ("pn-dns/client", "web.pn-dns"),
        ("pn-dns/client", "web.pn-dns.svc.cluster.local"),
        ("pn-other/far", "web.pn-dns"),
        ("pn-other/far", "web.pn-dns.svc.cluster.local."),
    ] {
        let mut out = String::new();
        lab.eventually(&format!("{pod}: {name} resolves"), || {
            let o = lab.run(&["exec", pod, "--", "getent", "hosts", name]);
            out = String::from_utf8_lossy(&o.stdout).to_string();
            o.status.success() && out.starts_with("10.")
        });
        assert!(out.contains("web.pn-dns.svc.cluster.local"), "{out}");
        // And connect to it by name (probe resolves through the pod's
        // resolv.conf).
        assert_eq!(lab.ok(&["probe", pod, &format!("{name}:80")]), "web");
    }
    // dig from a pod reaches the kube-dns Service for records of every kind.
    let srv = lab.ok(&[
        "exec",
        "pn-dns/client",
        "--",
        "dig",
        "+short",
        "_http._tcp.web.pn-dns.svc.cluster.local",
        "SRV",
    ]);
    assert_eq!(srv, "0 100 80 web.pn-dns.svc.cluster.local.");
    let nx = lab.run(&["exec", "pn-dns/client", "--", "getent", "hosts", "nope"]);
    assert!(!nx.status.success());
    if matches!(mode, Mode::DualStack | Mode::KubeDualStack) {
        names_over_ipv6(&lab);
    }
}

/// The dual-stack half of the DNS suite: a PreferDualStack Service has an
/// AAAA record with its IPv6 ClusterIP and a PTR back from it; the
/// single-stack one has none (NODATA, not an error).
fn names_over_ipv6(lab: &Lab) {
    lab.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web6, namespace: pn-dns}\n\
         spec: {selector: {app: web}, ipFamilyPolicy: PreferDualStack, ports: [{name: http, port: 80}]}\n",
    );
    let mut cip6 = String::new();
    lab.eventually("web6 gets an IPv6 ClusterIP", || {
        let o = lab.service_json_in("web6", "pn-dns");
        cip6 = o["spec"]["clusterIPs"][1]
            .as_str()
            .unwrap_or_default()
            .to_string();
        !cip6.is_empty()
    });
    let dig = |args: &[&str]| {
        let mut a = vec!["exec", "pn-dns/client", "--", "dig", "+short"];
        a.extend(args);
        lab.ok(&a)
    };
    let fqdn = "web6.pn-dns.svc.cluster.local";
    lab.eventually("AAAA for web6", || dig(&[fqdn, "AAAA"]) == cip6);
    assert_eq!(dig(&["-x", &cip6]), format!("{fqdn}."));
    assert_eq!(dig(&["web.pn-dns.svc.cluster.local", "AAAA"]), "");
    let status = lab.ok(&[
        "exec",
        "pn-dns/client",
        "--",
        "dig",
        "web.pn-dns.svc.cluster.local",
        "AAAA",
    ]);
    assert!(status.contains("status: NOERROR"), "{status}");
    // Through the name, over IPv6, to the pod behind it.
    assert_eq!(
        lab.ok(&["probe", "pn-dns/client", &format!("[{cip6}]:80")]),
        "web"
    );
}

// ---- The underlay gateway, logs across restarts, publishNotReadyAddresses.

/// The lab library's handle on a test lab (for what the CLI does not print).
fn lab_lib(lab: &Lab) -> podnet_lab::Lab {
    podnet_lab::Lab::new(&lab.name, env!("CARGO_BIN_EXE_podnet").into()).unwrap()
}

/// Lab nodes have a default route, as real nodes do, to a gateway on the
/// underlay that forwards nothing and counts what reaches it. Traffic the
/// nodes handle (pod to pod, a Service without endpoints rejected) never
/// reaches it; traffic nothing handles leaves the node, masqueraded when it
/// comes from a pod, and dies there. Nothing can leave the machine.
#[test]
fn nodes_route_out_to_a_gateway_that_forwards_nothing() {
    let lab = Lab::up("gw", "vxlan", 2);
    let gw = podnet_lab::gateway::gateway().to_string();
    let underlay = format!("pn-{}-net", lab.name);
    let default_route = |node: &str| lab.sh(&lab.node_ns(node), "ip route show default").1;
    for node in ["node1", "node2"] {
        assert_eq!(
            default_route(node).trim(),
            format!("default via {gw} dev eth0"),
            "{node}"
        );
    }
    // Neither the underlay switch nor the gateway forwards, routes
    // anywhere, or has a link out of the lab.
    let gw_ns = lab_lib(&lab).gateway_ns();
    for (ns, own) in [
        (&underlay, &["lo", "br0"][..]),
        (&gw_ns, &["lo", "eth0"][..]),
    ] {
        let (_, fwd) = lab.sh(
            ns,
            "sysctl -n net.ipv4.ip_forward net.ipv6.conf.all.forwarding",
        );
        assert_eq!(
            fwd.split_whitespace().collect::<Vec<_>>(),
            ["0", "0"],
            "{ns}"
        );
        // (iproute2 says "Peer netns reference is invalid" on stderr when a
        // veth's peer namespace goes away meanwhile: another test's.)
        let (_, links) = lab.sh(
            ns,
            "ip -o link show 2>/dev/null | cut -d: -f2 | cut -d@ -f1",
        );
        for l in links.split_whitespace() {
            assert!(
                own.contains(&l) || (ns == &underlay && l.starts_with("to-")),
                "link {l} in {ns}: {links}"
            );
        }
        let (_, routes) = lab.sh(ns, "ip route show default; ip -6 route show default");
        assert!(routes.trim().is_empty(), "{ns}: {routes}");
    }

    let lib = lab_lib(&lab);
    let c_ip = lab.pod("c", "node1");
    let s_ip = lab.pod("s", "node2");
    lab.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: empty}\n\
         spec: {clusterIP: 10.96.0.98, selector: {app: none}, ports: [{port: 80}]}\n",
    );
    lab.eventually("the Service without endpoints rejected", || {
        let o = lab.run(&["probe", "default/c", "10.96.0.98:80"]);
        refused(&String::from_utf8_lossy(&o.stderr))
    });
    // Handled on the nodes: nothing reaches the gateway.
    let before = lib.gateway_leaks().unwrap();
    assert_eq!(
        lab.ok(&["probe", "default/c", &format!("{s_ip}:8080")]),
        "s"
    );
    assert_eq!(
        lab.ok(&["probe", "default/c", &format!("{s_ip}:8081/udp")]),
        "s"
    );
    assert!(!lab
        .run(&["probe", "default/c", "10.96.0.98:80"])
        .status
        .success());
    assert_eq!(
        lib.gateway_leaks().unwrap().packets,
        before.packets,
        "traffic the nodes handle reached the gateway: {:?}",
        lib.gateway_leaks()
    );
    // Handled nowhere: it leaves node1 as node1 (masqueraded) and dies.
    assert!(!lab
        .run(&["probe", "default/c", "198.51.100.7:80"])
        .status
        .success());
    let after = lib.gateway_leaks().unwrap();
    assert!(after.packets > before.packets, "{after:?}");
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    assert!(
        after
            .flows
            .contains(&(ip("192.168.200.11"), ip("198.51.100.7"))),
        "{after:?}"
    );
    assert!(
        !after.flows.iter().any(|(src, _)| *src == ip(&c_ip)),
        "pod traffic left its node unmasqueraded: {after:?}"
    );
    // Names outside the cluster get an answer (the upstream resolvers are
    // unreachable from the lab, so SERVFAIL) instead of hanging the pod's
    // resolver past dig's one try.
    let o = lab.run(&[
        "exec",
        "default/c",
        "--",
        "dig",
        "+tries=1",
        "+time=8",
        "nothing.example.",
        "A",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("status: SERVFAIL") || out.contains("status: REFUSED"),
        "{out}"
    );
    // A node added later gets the same default route.
    let added = lab.ok(&["add-node"]);
    let node = added.split_whitespace().nth(1).unwrap().to_string();
    assert_eq!(
        default_route(&node).trim(),
        format!("default via {gw} dev eth0")
    );
}

/// `restart-agent` appends to the agent's log: what the killed run said
/// stays, followed by the new run's lines.
#[test]
fn restart_agent_keeps_the_killed_runs_log() {
    let lab = Lab::up("lg", "host-gw", 1);
    let path = lab_lib(&lab).log_path("agent-node1");
    let first = std::fs::read_to_string(&path).unwrap();
    let mark = podnet_lab::SPAWN_MARK;
    assert_eq!(first.matches(mark).count(), 1, "{first}");
    // A run's first line without its timestamp: what the agent says first.
    let opening = |run: &str| {
        run.lines()
            .nth(1)
            .and_then(|l| l.split_once(' '))
            .map(|(_, said)| said.to_string())
    };
    let said = opening(first.split(mark).nth(1).unwrap());
    assert!(said.is_some(), "the agent logged nothing: {first}");
    lab.ok(&["restart-agent", "node1"]);
    let mut log = String::new();
    lab.eventually("the second run logs", || {
        log = std::fs::read_to_string(&path).unwrap();
        log.split(mark).count() == 3 && opening(log.rsplit(mark).next().unwrap()).is_some()
    });
    assert!(
        log.starts_with(&first),
        "the first run's lines were lost:\n{log}"
    );
    let runs: Vec<&str> = log.split(mark).skip(1).collect();
    assert_eq!(runs.len(), 2, "{log}");
    assert_eq!(opening(runs[1]), said, "{log}");
}

/// A Service with `publishNotReadyAddresses` reaches a pod that is not
/// Ready; a plain Service over the same pod has no endpoint (rejected).
#[test]
fn published_not_ready_pods_are_reachable_through_their_service() {
    let lab = Lab::up("nr", "vxlan", 2);
    let store = lab.store();
    lab.pod_labelled("peer", "node1", "app=peer");
    lab.pod_labelled("c", "node2", "app=client");
    lab.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: peers}\n\
         spec: {clusterIP: 10.96.0.91, publishNotReadyAddresses: true, selector: {app: peer}, ports: [{port: 80, targetPort: 8080}]}\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {name: ready-only}\n\
         spec: {clusterIP: 10.96.0.92, selector: {app: peer}, ports: [{port: 80, targetPort: 8080}]}\n",
    );
    for vip in ["10.96.0.91:80", "10.96.0.92:80"] {
        lab.eventually(&format!("{vip} answers while the pod is Ready"), || {
            lab.run(&["probe", "default/c", vip])
                .stdout
                .starts_with(b"peer")
        });
    }
    // The pod stops being Ready (as its kubelet would report).
    let o = podnet(&["--store", &store, "get", "po", "peer", "-o", "json"]);
    let mut pod: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    pod["status"]["conditions"] = serde_json::json!([{"type": "Ready", "status": "False"}]);
    lab.apply(&pod.to_string());
    lab.eventually("the plain Service loses its only endpoint", || {
        !lab.run(&["probe", "default/c", "10.96.0.92:80"])
            .status
            .success()
    });
    assert_eq!(lab.ok(&["probe", "default/c", "10.96.0.91:80"]), "peer");
    // The slices say why: ready because published, not serving.
    let conditions = |svc: &str| {
        let o = podnet(&["--store", &store, "get", "eps", "-o", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["metadata"]["labels"]["kubernetes.io/service-name"] == svc)
            .map(|s| s["endpoints"][0]["conditions"].clone())
            .unwrap()
    };
    assert_eq!(
        conditions("peers"),
        serde_json::json!({"ready": true, "serving": false, "terminating": false})
    );
    assert_eq!(
        conditions("ready-only"),
        serde_json::json!({"ready": false, "serving": false, "terminating": false})
    );
}

/// A probe that must fail, and why it failed, from `lab probe`'s error.
fn probe_err(lab: &Lab, pod: &str, target: &str) -> String {
    let o = lab.run(&["probe", &format!("default/{pod}"), target]);
    assert!(
        !o.status.success(),
        "{pod} -> {target} answered: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn refused(err: &str) -> bool {
    err.contains("Connection refused")
}

fn timed_out(err: &str) -> bool {
    err.contains("timed out") || err.contains("Resource temporarily unavailable")
}

/// kube-proxy's packet-flow semantics with real traffic, on nodes that have
/// a default route (to a gateway that forwards nothing): every refusal is
/// checked as "connection refused", every drop as a silent timeout with
/// nothing for the Service range reaching the gateway. Fast-path and
/// chain-path Services are both exercised where both apply.
#[test]
fn proxy_semantics_with_real_traffic() {
    let lab = Lab::up("ps", "vxlan", 2);
    let lib = lab_lib(&lab);
    lab.pod_labelled("w1", "node1", "app=web,one=yes");
    lab.pod_labelled("w2", "node2", "app=web");
    lab.pod_labelled("c", "node1", "app=client");
    lab.pod_labelled("c2", "node2", "app=client");
    let (w1, w2) = (lab.pod_ip("w1"), lab.pod_ip("w2"));
    let (n1, n2) = ("192.168.200.11", "192.168.200.12");
    // Hand-written slices (Services without selectors): w1 serving but
    // terminating on node1, w2 ready on node2; and zone hints.
    let slice = |svc: &str, eps: &str| {
        format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: {svc}-1, labels: {{kubernetes.io/service-name: {svc}}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints: {eps}\n"
        )
    };
    let zoned = format!(
        "[{{addresses: [{w1}], nodeName: node1, hints: {{forZones: [{{name: a}}]}}}}, \
          {{addresses: [{w2}], nodeName: node2, hints: {{forZones: [{{name: b}}]}}}}]"
    );
    lab.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: none}}\n\
         spec: {{clusterIP: 10.96.0.91, type: NodePort, selector: {{app: nothing}},\n  \
           ports: [{{name: http, port: 80, nodePort: 30091}}, {{name: dns, port: 53, protocol: UDP}}]}}\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {{name: fast}}\n\
         spec: {{clusterIP: 10.96.0.92, selector: {{app: web}}, ports: [{{name: http, port: 80, targetPort: 8080}}]}}\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {{name: chain}}\n\
         spec: {{clusterIP: 10.96.0.93, type: NodePort, selector: {{app: web}},\n  \
           ports: [{{name: http, port: 80, targetPort: 8080, nodePort: 30092}}]}}\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {{name: loc}}\n\
         spec: {{clusterIP: 10.96.0.94, type: NodePort, externalTrafficPolicy: Local, selector: {{one: 'yes'}},\n  \
           ports: [{{name: http, port: 80, targetPort: 8080, nodePort: 30093}}]}}\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {{name: term}}\n\
         spec: {{clusterIP: 10.96.0.95, type: NodePort, externalTrafficPolicy: Local,\n  \
           ports: [{{name: http, port: 80, nodePort: 30094}}]}}\n\
         ---\n{}\
         ---\napiVersion: v1\nkind: Service\nmetadata: {{name: topo}}\n\
         spec: {{clusterIP: 10.96.0.96, ports: [{{name: http, port: 80}}]}}\n\
         ---\n{}\
         ---\napiVersion: v1\nkind: Service\nmetadata: {{name: topo2}}\n\
         spec: {{clusterIP: 10.96.0.102, type: NodePort, ports: [{{name: http, port: 80, nodePort: 30097}}]}}\n\
         ---\n{}\
         ---\napiVersion: v1\nkind: Service\nmetadata: {{name: optout, labels: {{service.kubernetes.io/service-proxy-name: other}}}}\n\
         spec: {{clusterIP: 10.96.0.97, selector: {{app: web}}, ports: [{{name: http, port: 80, targetPort: 8080}}]}}\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {{name: lbnode}}\n\
         spec: {{clusterIP: 10.96.0.100, type: LoadBalancer, selector: {{app: web}}, loadBalancerSourceRanges: [192.168.200.0/24],\n  \
           ports: [{{name: http, port: 80, targetPort: 8080, nodePort: 30095}}]}}\n\
         status: {{loadBalancer: {{ingress: [{{ip: 203.0.113.31}}]}}}}\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {{name: lbelse}}\n\
         spec: {{clusterIP: 10.96.0.101, type: LoadBalancer, selector: {{app: web}}, loadBalancerSourceRanges: [198.51.100.0/24],\n  \
           ports: [{{name: http, port: 80, targetPort: 8080, nodePort: 30096}}]}}\n\
         status: {{loadBalancer: {{ingress: [{{ip: 203.0.113.32}}]}}}}\n",
        slice(
            "term",
            &format!(
                "[{{addresses: [{w1}], nodeName: node1, conditions: {{ready: false, serving: true, terminating: true}}}}, \
                  {{addresses: [{w2}], nodeName: node2, conditions: {{ready: true, serving: true, terminating: false}}}}]"
            )
        ),
        slice("topo", &zoned),
        slice("topo2", &zoned),
    ));
    // An outside client on the underlay.
    let out = format!("pn-{}-net", lab.name);
    assert!(lab.sh(&out, "ip addr add 192.168.200.250/24 dev br0").0);
    lab.eventually("every Service programmed on both nodes", || {
        ["node1", "node2"].iter().all(|n| {
            let m = lab.nft_list(n, "table ip podnet").unwrap_or_default();
            [
                "10.96.0.91",
                "10.96.0.92",
                "10.96.0.93",
                "10.96.0.95",
                "10.96.0.96",
                "10.96.0.102",
                "203.0.113.32",
            ]
            .iter()
            .all(|ip| m.contains(ip))
        })
    });
    let leaks = || lib.gateway_leaks().unwrap().packets;
    let before = leaks();

    // 1. No endpoints anywhere: refused at once, TCP and UDP, ClusterIP and
    // NodePort, from a pod, from outside and from the node itself.
    for target in ["10.96.0.91:80", "10.96.0.91:53/udp"] {
        let e = probe_err(&lab, "c", target);
        assert!(refused(&e), "{target}: {e}");
    }
    for (ns, addr) in [(&out, n1), (&lab.node_ns("node2"), n2)] {
        let (ok, e) = ask_from(&lab, ns, addr, 30091, "hostname");
        assert!(
            !ok && e.contains("Connection refused"),
            "{ns} -> {addr}:30091: {e}"
        );
    }
    // 2. A ClusterIP's unserved port or protocol: refused, on both paths.
    for target in ["10.96.0.92:81", "10.96.0.93:81", "10.96.0.92:80/udp"] {
        let e = probe_err(&lab, "c", target);
        assert!(refused(&e), "{target}: {e}");
    }
    // 3. An unheld address of the Service CIDR: dropped on the node.
    let e = probe_err(&lab, "c", "10.96.0.99:80");
    assert!(timed_out(&e), "{e}");
    assert_eq!(leaks(), before, "Service-range traffic left the node");

    // 4. externalTrafficPolicy Local, endpoint only on node1: from outside,
    // node1 serves and node2 drops ("no local endpoints"); a pod on node2
    // is short-circuited to the endpoint through node2's NodePort.
    assert_eq!(
        ask_from(&lab, &out, n1, 30093, "clientip").1.trim(),
        "192.168.200.250"
    );
    let (ok, e) = ask_from(&lab, &out, n2, 30093, "hostname");
    assert!(
        !ok && !e.contains("refused"),
        "node2 must drop, not refuse: {e}"
    );
    let m = lab
        .nft_list("node2", "map ip podnet no-endpoint-nodeports")
        .unwrap_or_default();
    assert!(m.contains("tcp . 30093 : drop"), "{m}");
    assert_eq!(
        lab.ok(&["probe", "default/c2", &format!("{n2}:30093")]),
        "w1"
    );
    // The node itself with a local endpoint: to every endpoint, masqueraded.
    assert!(ask_from(&lab, &lab.node_ns("node1"), n1, 30093, "hostname")
        .1
        .trim()
        .starts_with('w'));

    // 5. Local falls back to node1's serving-terminating endpoint; the
    // ClusterIP (Cluster policy) keeps using the ready one.
    assert_eq!(ask_from(&lab, &out, n1, 30094, "hostname").1.trim(), "w1");
    for _ in 0..6 {
        assert_eq!(lab.ok(&["probe", "default/c", "10.96.0.95:80"]), "w2");
    }

    // 6. Zone hints: node1 in zone a uses w1 only; node2 (no zone label)
    // uses both.
    for _ in 0..6 {
        let who = lab.ok(&["probe", "default/c2", "10.96.0.96:80"]);
        assert!(who == "w1" || who == "w2", "{who}");
    }
    let node: serde_json::Value = serde_json::from_slice(
        &podnet(&[
            "--store",
            &lab.store(),
            "get",
            "node",
            "node1",
            "-o",
            "json",
        ])
        .stdout,
    )
    .unwrap();
    let mut node = node;
    node["metadata"]["labels"]["topology.kubernetes.io/zone"] = "a".into();
    lab.apply(&node.to_string());
    // The fast path (topo) and the chain path (topo2, a NodePort).
    for cip in ["10.96.0.96:80", "10.96.0.102:80"] {
        lab.eventually(&format!("node1 follows its zone's hints ({cip})"), || {
            (0..8).all(|_| lab.ok(&["probe", "default/c", cip]) == "w1")
        });
        let seen: std::collections::BTreeSet<String> = (0..24)
            .map(|_| lab.ok(&["probe", "default/c2", cip]))
            .collect();
        assert_eq!(
            seen.len(),
            2,
            "node2 has no zone: every endpoint ({cip}: {seen:?})"
        );
    }

    // 7. A Service handed to another proxy gets no rules (its address is
    // unheld: dropped); removing the label brings them back.
    let e = probe_err(&lab, "c", "10.96.0.97:80");
    assert!(timed_out(&e), "{e}");
    lab.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: optout, labels: {}}\n\
         spec: {clusterIP: 10.96.0.97, selector: {app: web}, ports: [{name: http, port: 80, targetPort: 8080}]}\n",
    );
    lab.eventually("optout served once the label is gone", || {
        lab.run(&["probe", "default/c", "10.96.0.97:80"])
            .status
            .success()
    });

    // 8. NodePorts only on the node's address: not on loopback, not on its
    // pod-network address.
    let ns1 = lab.node_ns("node1");
    assert!(ask_from(&lab, &ns1, n1, 30092, "hostname")
        .1
        .trim()
        .starts_with('w'));
    let bridge = lab
        .sh(
            &ns1,
            "ip -4 -o addr show | awk '$4 ~ /^10[.]244[.]/ {print $4}' | head -1 | cut -d/ -f1",
        )
        .1;
    assert!(bridge.trim().starts_with("10.244."), "{bridge}");
    for addr in ["127.0.0.1", bridge.trim()] {
        let (ok, e) = ask_from(&lab, &ns1, addr, 30092, "hostname");
        assert!(
            !ok && e.contains("Connection refused"),
            "NodePort answered on {addr}: {e}"
        );
    }

    // 9. loadBalancerSourceRanges holding the node's address admit the LB
    // IP as a source: node1 holds both VIPs locally and reaches each from it.
    assert!(
        lab.sh(
            &ns1,
            "ip addr add 203.0.113.31/32 dev lo && ip addr add 203.0.113.32/32 dev lo"
        )
        .0
    );
    let (ok, who) = ask_from(&lab, &ns1, "203.0.113.31", 80, "hostname");
    assert!(ok && who.trim().starts_with('w'), "{who}");
    let (ok, e) = ask_from(&lab, &ns1, "203.0.113.32", 80, "hostname");
    assert!(
        !ok && !e.contains("refused"),
        "outside the ranges: dropped ({e})"
    );
    assert_eq!(leaks(), before, "Service-range traffic left the node");
}

// ---- The pod bridge's MAC under pod churn, and CNI ADD while the agent is down.

/// Node `node`'s pod bridge: its MAC and how it was assigned
/// (`addr_assign_type`; 3 is set by userspace, which a bridge keeps).
fn bridge_mac(lab: &Lab, node: &str) -> String {
    let (ok, out) = lab.sh(
        &lab.node_ns(node),
        "echo $(cat /sys/class/net/podnet0/address /sys/class/net/podnet0/addr_assign_type)",
    );
    assert!(ok, "{out}");
    out.trim().to_string()
}

/// Probes from one pod to an address, one fresh TCP connection after
/// another (paced), until stopped; every outcome kept with its cause.
struct ProbeLoop {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    seen: std::sync::Arc<std::sync::Mutex<Vec<podnet_lab::Reach>>>,
    thread: std::thread::JoinHandle<()>,
}

impl ProbeLoop {
    fn start(lab: &Lab, pod: &str, target: std::net::SocketAddr) -> ProbeLoop {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (lib, pod) = (lab_lib(lab), pod.to_string());
        let (stop2, seen2) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            while !stop2.load(std::sync::atomic::Ordering::SeqCst) {
                let r = lib.reach("default", &pod, target, false, Duration::from_secs(1));
                seen2.lock().unwrap().push(r);
                // Pacing, so the loop does not load the shared machine.
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        ProbeLoop { stop, seen, thread }
    }

    fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Waits until `n` more probes have finished.
    fn advance(&self, n: usize) {
        let want = self.count() + n;
        eventually(&format!("{n} more probes"), WAIT, || self.count() >= want);
    }

    fn stop(self) -> Vec<podnet_lab::Reach> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().unwrap();
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

/// Pods start and stop on a node while a pod there keeps opening
/// connections to a pod on another node, through its gateway, the pod
/// bridge: none may fail (issue 23). The bridge used to take the lowest MAC
/// among its ports, so its MAC changed as pods came and went (all zeros
/// after the last DEL), while pods kept sending to the gateway MAC they had
/// cached, which was no longer the bridge's once the pod whose MAC it was
/// had gone: traffic off the node failed until the pod's neighbour entry
/// was renewed. Now the bridge keeps one MAC, set by us (`addr_assign_type`
/// 3), from its first ADD to after its last DEL.
#[test]
fn pod_churn_keeps_the_bridge_mac_and_traffic_off_the_node() {
    let lab = Lab::up("mc", "vxlan", 2);
    // node1 runs the DNS pod; node2's bridge is made by its first pod.
    let mut macs = Vec::new();
    for i in 0..4 {
        lab.pod(&format!("c{i}"), "node2");
        macs.push((format!("ADD c{i}"), bridge_mac(&lab, "node2")));
    }
    lab.pod("client", "node2");
    let server = lab.pod("server", "node1");
    let target = std::net::SocketAddr::new(server.parse().unwrap(), 8080);
    let probes = ProbeLoop::start(&lab, "client", target);
    probes.advance(5);
    // Churn: the pods that were there before the client leave, new ones
    // come and go; the probes go on through each step.
    let mut step = |what: String, args: &[&str]| {
        lab.ok(args);
        macs.push((what, bridge_mac(&lab, "node2")));
        probes.advance(5);
    };
    for i in 0..4 {
        step(format!("DEL c{i}"), &["rm", &format!("default/c{i}")]);
    }
    for i in 4..8 {
        let pod = format!("default/c{i}");
        step(
            format!("ADD c{i}"),
            &["run", &pod, "--node", "node2", "--ports", "8080/tcp"],
        );
        step(format!("DEL c{i}"), &["rm", &pod]);
    }
    probes.advance(10);
    let seen = probes.stop();
    let failed: Vec<String> = seen
        .iter()
        .filter(|r| !matches!(r, podnet_lab::Reach::Connected(who) if who == "default/server"))
        .map(|r| format!("{r:?}"))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} probes from client to server failed across pod churn: {failed:?}; the bridge's MAC: {macs:?}",
        failed.len(),
        seen.len()
    );
    // The client is the last pod on node2: after its DEL the bridge is empty.
    lab.ok(&["rm", "default/client"]);
    macs.push(("DEL client (the last)".into(), bridge_mac(&lab, "node2")));
    let first = macs[0].1.clone();
    assert!(first.ends_with(" 3"), "pinned from the first ADD: {macs:?}");
    assert!(
        macs.iter().all(|(_, m)| *m == first),
        "the bridge's MAC changed: {macs:?}"
    );
}

/// The IPAM allocations host-local holds for a lab node's pods.
fn node_ipam(lab: &Lab, node: &str) -> Vec<String> {
    let dir = format!(
        "/run/podnet-lab/{}/nodes/{node}/cni/networks/podnet",
        lab.name
    );
    let mut v: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
        .collect();
    v.sort();
    v
}

/// The lab's pod namespaces (`pn-<lab>-p<hash>`).
fn pod_namespaces(lab: &Lab) -> Vec<String> {
    let prefix = format!("pn-{}-p", lab.name);
    let mut v: Vec<String> = std::fs::read_dir("/run/netns")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    v.sort();
    v
}

/// CNI ADD while the node's agent is down (issue 23). It used to succeed:
/// the pod reported Ready while the agent's table, failing closed, dropped
/// its traffic. Now ADD waits a bounded time for the agent and then fails
/// with a retryable CNI error that names the agent's socket, leaving no
/// veth and no IPAM allocation; `lab run` then removes the sandbox and the
/// Pod object again, as a kubelet would retry. An ADD that starts while
/// the agent is down and sees it come back within the wait succeeds.
#[test]
fn cni_add_fails_while_the_agent_is_down_and_waits_for_its_return() {
    let lab = Lab::up("ad", "vxlan", 1);
    lab.pod("first", "node1");
    let n1 = lab.node_ns("node1");
    let veths = || lab.sh(&n1, "ip -o link show type veth").1;
    let (veths_before, ipam_before) = (veths(), node_ipam(&lab, "node1"));
    let ns_before = pod_namespaces(&lab);
    let socket = format!("/run/podnet-lab/{}/nodes/node1/agent.sock", lab.name);

    lab.ok(&["stop-agent", "node1"]);
    let lib = lab_lib(&lab);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ports = podnet_lab::serve::parse_ports("8080/tcp").unwrap();
    let run = |name: &str| {
        rt.block_on(lib.run_pod("default", name, Some("node1"), Default::default(), &ports))
    };
    match run("late") {
        Err(podnet_lab::LabError::Cni(e)) => {
            assert_eq!(e.code, 11, "try again later: {e}");
            assert!(
                e.msg.starts_with(&format!(
                    "podnet: the podnet agent is not running on this node: nothing listens on its socket {socket} (waited 5.0s)"
                )),
                "{e}"
            );
        }
        other => panic!("ADD with the agent down: {other:?}"),
    }
    assert_eq!(veths(), veths_before, "a veth left behind");
    assert_eq!(
        node_ipam(&lab, "node1"),
        ipam_before,
        "an address left allocated"
    );
    assert_eq!(pod_namespaces(&lab), ns_before, "the sandbox left behind");
    let o = podnet(&["--store", &lab.store(), "get", "pod", "late", "-o", "json"]);
    assert!(
        !o.status.success(),
        "the Pod object left behind: {}",
        String::from_utf8_lossy(&o.stdout)
    );

    // An ADD that starts while the agent is down: once its sandbox exists
    // (the ADD runs right after), the agent comes back.
    let late = std::thread::scope(|s| {
        let add = s.spawn(|| run("late"));
        lab.eventually("late's sandbox", || {
            pod_namespaces(&lab).len() > ns_before.len()
        });
        lab.ok(&["restart-agent", "node1"]);
        add.join().unwrap()
    })
    .expect("ADD that saw the agent return within the wait");
    assert_eq!(
        lab.ok(&["probe", "default/first", &format!("{}:8080", late.ip)]),
        "late"
    );
}

// ---- BGP, LoadBalancer IPs, two racks (issue 26).

/// An address pool, the cluster's BGP configuration (the pool's block
/// advertised), the router as every node's peer, and a Local
/// LoadBalancer Service for pods labelled app=web.
const LB_OBJECTS: &str = "apiVersion: podnet.io/v1\nkind: IPAddressPool\nmetadata: {name: public}\n\
spec: {addresses: [198.51.100.0/28]}\n\
---\napiVersion: podnet.io/v1\nkind: BGPConfiguration\nmetadata: {name: default}\n\
spec: {serviceLoadBalancerIPs: [{cidr: 198.51.100.0/28}]}\n\
---\napiVersion: podnet.io/v1\nkind: BGPPeer\nmetadata: {name: tor}\n\
spec: {peerIP: 192.168.200.254, asNumber: 64513, bfd: true}\n\
---\napiVersion: v1\nkind: Service\nmetadata: {name: web}\n\
spec: {selector: {app: web}, type: LoadBalancer, externalTrafficPolicy: Local, ports: [{port: 80, targetPort: 8080}]}\n";

impl Lab {
    /// The first LoadBalancer IP the controller gave Service `svc`.
    fn lb_ip(&self, svc: &str) -> String {
        let mut ip = String::new();
        self.eventually(&format!("{svc}'s LoadBalancer IP"), || {
            let v = &self.service_json(svc)["status"]["loadBalancer"]["ingress"][0]["ip"];
            ip = v.as_str().unwrap_or_default().to_string();
            !ip.is_empty()
        });
        ip
    }

    fn router_ns(&self) -> String {
        format!("pn-{}-tor", self.name)
    }
}

/// LoadBalancer Services over BGP to a real router on the underlay: the
/// pool gives the Service an address; under Local only the node with the
/// endpoint advertises the /32 (the block comes from every node); the
/// router installs it, a client in its namespace reaches the pod, and the
/// pod sees the client's own address; the last endpoint going withdraws
/// the /32. The router also learned every node's pod CIDR.
fn lb_over_bgp(router: &str, tag: &str) {
    lb_over_bgp_in(router, tag, &[]);
}

/// [`lb_over_bgp`] in a lab with more `lab up` flags (`--kube`: the
/// address comes from LB IPAM's Kubernetes-mode replicas, through the
/// API).
fn lb_over_bgp_in(router: &str, tag: &str, extra: &[&str]) {
    let mut flags = vec!["--router", router];
    flags.extend_from_slice(extra);
    let lab = Lab::up_with(tag, "bgp", 2, &flags);
    lab.pod_labelled("web1", "node1", "app=web");
    lab.apply(LB_OBJECTS);
    let ip = lab.lb_ip("web");
    assert!(ip.starts_with("198.51.100."), "{ip}");
    let tor = lab.router_ns();
    lab.eventually("the router's route to the LB IP via node1", || {
        lab.sh(&tor, &format!("ip route show {ip}/32"))
            .1
            .contains("via 192.168.200.11")
    });
    lab.eventually("both pod CIDRs at the router", || {
        lab.sh(&tor, "ip route show root 10.244.0.0/16")
            .1
            .lines()
            .filter(|l| l.starts_with("10.244."))
            .count()
            >= 2
    });
    let r = lab.sh(&tor, &format!("ip route show {ip}/32")).1;
    assert!(!r.contains("192.168.200.12"), "node2 has no endpoint: {r}");
    lab.eventually("the LB IP from the router, client address kept", || {
        ask_from(&lab, &tor, &ip, 80, "clientip").1.trim() == "192.168.200.254"
    });
    assert_eq!(ask_from(&lab, &tor, &ip, 80, "hostname").1.trim(), "web1");
    // The sessions as `podnet bgp status` and the metrics show them.
    let status = podnet(&["bgp", "status", "--lab", &lab.name]);
    let status = String::from_utf8_lossy(&status.stdout);
    let router = status.lines().filter(|l| l.starts_with("192.168.200.254 "));
    assert_eq!(
        router.filter(|l| l.contains("Established")).count(),
        2,
        "{status}"
    );
    let ns = Netns::named(&lab.node_ns("node1")).unwrap();
    let addr = "127.0.0.1:10249".parse().unwrap();
    lab.eventually("the session in node1's metrics", || {
        http_get(Some(&ns), addr, "/metrics")
            .is_some_and(|(_, m)| m.contains("podnet_bgp_session_up{peer=\"192.168.200.254\"} 1"))
    });
    lab.ok(&["rm", "default/web1"]);
    lab.eventually("the /32 withdrawn with the last endpoint", || {
        let r = lab.sh(&tor, &format!("ip route show {ip}/32")).1;
        !r.contains("via")
    });
}

#[test]
fn lb_over_bgp_with_bird() {
    lb_over_bgp("bird", "lbb");
}

/// The same in Kubernetes mode: the pool, the BGP kinds and the Service
/// through the API; LB IPAM's elected replica gives the address.
#[test]
fn lb_over_bgp_with_bird_in_kubernetes_mode() {
    lb_over_bgp_in("bird", "lbk", &["--kube"]);
}

/// Graceful restart with a real router: the agent of the node with the
/// Local Service's endpoint is killed and started again while a client in
/// the router's namespace asks the LB IP every 20 ms; the router (BIRD,
/// or FRR: both put what they learn in the kernel) keeps the node's
/// routes through the restart and no ask fails. (BFD is off for this
/// peer: BFD lives in the agent, so a restart looks like a failure to a
/// router that has it, unless the router runs it gracefully.)
#[test]
fn the_router_keeps_a_restarting_agents_routes() {
    router_keeps_a_restarting_agents_routes("bird", "grr");
}

#[test]
fn frr_keeps_a_restarting_agents_routes() {
    router_keeps_a_restarting_agents_routes("frr", "grf");
}

fn router_keeps_a_restarting_agents_routes(router: &str, tag: &str) {
    let lab = Lab::up_with(tag, "bgp", 2, &["--router", router]);
    lab.pod_labelled("web1", "node1", "app=web");
    lab.apply(LB_OBJECTS);
    lab.apply(
        "apiVersion: podnet.io/v1\nkind: BGPPeer\nmetadata: {name: tor}\n\
         spec: {peerIP: 192.168.200.254, asNumber: 64513, bfd: false}\n",
    );
    let ip = lab.lb_ip("web");
    let tor = lab.router_ns();
    lab.eventually("the LB IP from the router", || {
        ask_from(&lab, &tor, &ip, 80, "hostname").1.trim() == "web1"
    });
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let asker = {
        let (stop, tor, ip) = (stop.clone(), tor.clone(), ip.clone());
        std::thread::spawn(move || {
            let ns = Netns::named(&tor).unwrap();
            let addr: std::net::SocketAddr = format!("{ip}:80").parse().unwrap();
            let (mut ok, mut failed) = (0, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = ns
                    .run(|| podnet_lab::serve::ask(addr, false, "hostname", WAIT))
                    .unwrap();
                match r {
                    Ok(_) => ok += 1,
                    Err(e) => failed.push(e.to_string()),
                }
                // The router's own word: the /32 via node1 never goes.
                let route = try_sh_in(&tor, &format!("ip route show {ip}/32")).1;
                if !route.contains("192.168.200.11") {
                    failed.push(format!("the router lost the route: {route:?}"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (ok, failed)
        })
    };
    lab.ok(&["restart-agent", "node1"]);
    lab.agent_ready("node1");
    let status = || podnet(&["bgp", "status", "--lab", &lab.name]).stdout;
    lab.eventually("node1's session with the router back", || {
        String::from_utf8_lossy(&status())
            .lines()
            .filter(|l| l.starts_with("192.168.200.254 ") && l.contains("Established"))
            .count()
            == 2
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = asker.join().unwrap();
    assert!(
        ok > 0 && failed.is_empty(),
        "{ok} answered, failed: {failed:?}"
    );
}

/// The nodes' AS comes from the BGPConfiguration: the mesh runs in 64512
/// until the cluster's says 65010; agents started after that run their
/// speakers in 65010 (their mesh neighbour established in it).
#[test]
fn the_nodes_as_comes_from_the_bgp_configuration() {
    nodes_as_from_the_bgp_configuration(Lab::up("bas", "bgp", 2));
}

/// The same in Kubernetes mode (the agent lists the kind's one object at
/// its start: its role grants list and watch, no get).
#[test]
fn the_nodes_as_comes_from_the_bgp_configuration_kube() {
    nodes_as_from_the_bgp_configuration(Lab::up_in(Mode::Kube, "bak", "bgp", 2));
}

fn nodes_as_from_the_bgp_configuration(lab: Lab) {
    let status = || {
        String::from_utf8_lossy(&podnet(&["bgp", "status", "--lab", &lab.name]).stdout).into_owned()
    };
    let mesh_in = |asn: &str| {
        let s = status();
        let up = |peer: &str| {
            s.lines().any(|l| {
                l.starts_with(peer) && l.contains(&format!(" {asn} ")) && l.contains("Established")
            })
        };
        up("192.168.200.11 ") && up("192.168.200.12 ")
    };
    lab.eventually("the mesh established in 64512", || mesh_in("64512"));
    lab.apply("apiVersion: podnet.io/v1\nkind: BGPConfiguration\nmetadata: {name: default}\nspec: {asNumber: 65010}\n");
    for node in ["node1", "node2"] {
        lab.ok(&["restart-agent", node]);
        lab.agent_ready(node);
    }
    lab.eventually("the mesh established in 65010", || mesh_in("65010"));
}

/// GoBGP, built from its Go module and cached by version.
fn build_gobgp() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/gobgp.sh");
    let built = Command::new("bash").arg(script).output().unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
}

/// GoBGP as the router: it keeps what it learns in its own RIB (no FIB
/// without zebra), so the check is its RIB: both pod CIDRs, and the LB
/// IP's /32 from node1 only (the Local Service's endpoint is there).
#[test]
fn lb_over_bgp_with_gobgp() {
    build_gobgp();
    let lab = Lab::up_with("lbg", "bgp", 2, &["--router", "gobgp"]);
    lab.pod_labelled("web1", "node1", "app=web");
    lab.apply(LB_OBJECTS);
    let ip = lab.lb_ip("web");
    let tor = lab.router_ns();
    let cli = "/var/cache/podnet-peers/gobgp-v4.8.0/gobgp";
    let rib = || {
        lab.sh(&tor, &format!("timeout 2 {cli} global rib -a ipv4"))
            .1
    };
    lab.eventually("the LB IP's /32 from node1 in GoBGP's RIB", || {
        rib()
            .lines()
            .any(|l| l.contains(&format!("{ip}/32")) && l.contains("192.168.200.11"))
    });
    let r = rib();
    assert_eq!(
        r.lines().filter(|l| l.contains(" 10.244.")).count(),
        2,
        "{r}"
    );
    assert!(
        !r.lines()
            .any(|l| l.contains(&format!("{ip}/32")) && l.contains("192.168.200.12")),
        "{r}"
    );
}

/// BFD between the nodes and BIRD: a node whose agent freezes (its BFD
/// goes quiet, its kernel still forwards) is dropped by the router on
/// BFD's word, not after the 9 s hold time, and its routes go; thawed,
/// the session comes back.
#[test]
fn bfd_drops_a_frozen_node_at_the_router() {
    let lab = Lab::up_with("bfd", "bgp", 2, &["--router", "bird"]);
    lab.apply(LB_OBJECTS);
    let tor = lab.router_ns();
    let birdc = |cmd: &str| {
        let ctl = format!("/run/podnet-lab/{}/tor/bird.ctl", lab.name);
        lab.sh(&tor, &format!("timeout 2 birdc -s {ctl} {cmd}")).1
    };
    lab.eventually("BFD up with both nodes", || {
        birdc("show bfd sessions").matches(" Up ").count() == 2
    });
    let dropped = || birdc("show protocols").contains("BFD session down");
    frozen_node_dropped(&lab, &dropped, &|| kernel_has_node1_cidr(&lab));
}

/// Whether the router's kernel routes a pod CIDR via node1 (BIRD and FRR
/// install what they learn).
fn kernel_has_node1_cidr(lab: &Lab) -> bool {
    lab.sh(&lab.router_ns(), "ip route show root 10.244.0.0/16")
        .1
        .lines()
        .any(|l| l.contains("via 192.168.200.11"))
}

/// The same with FRR (bfdd beside bgpd): its BFD peers up with both
/// nodes, then the frozen node's session closed with a Cease, BFD Down
/// (6/10), as bgpd logs it. (The dynamic neighbour is deleted with its
/// session, so its reset reason is gone from `show bgp neighbors`.)
#[test]
fn bfd_drops_a_frozen_node_at_frr() {
    let lab = Lab::up_with("bff", "bgp", 2, &["--router", "frr"]);
    lab.apply(LB_OBJECTS);
    let tor = lab.router_ns();
    let vtysh = |cmd: &str| {
        let dir = format!("/run/podnet-lab/{}/tor", lab.name);
        lab.sh(
            &tor,
            &format!("timeout 2 vtysh --vty_socket {dir} -c '{cmd}'"),
        )
        .1
    };
    lab.eventually("BFD up with both nodes", || {
        vtysh("show bfd peers brief").matches(" up ").count() == 2
    });
    let log = format!("/run/podnet-lab/{}/logs/tor-bgpd.log", lab.name);
    let dropped = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("sent to neighbor 192.168.200.11 6/10 (Cease/BFD Down)")
    };
    frozen_node_dropped(&lab, &dropped, &|| kernel_has_node1_cidr(&lab));
}

/// The same with GoBGP's own BFD (on the nodes' peer group): its BFD up
/// with both nodes, then node1's BFD session expired by its word, and
/// node1's pod CIDR gone from its RIB (GoBGP keeps no FIB).
#[test]
fn bfd_drops_a_frozen_node_at_gobgp() {
    build_gobgp();
    let lab = Lab::up_with("bfg", "bgp", 2, &["--router", "gobgp"]);
    lab.apply(LB_OBJECTS);
    let tor = lab.router_ns();
    let cli = "/var/cache/podnet-peers/gobgp-v4.8.0/gobgp";
    let gobgp = |args: &str| lab.sh(&tor, &format!("timeout 2 {cli} {args}")).1;
    // (`-j` gives the BFD state as its enum's number: 1 is UP.)
    let bfd_up = |p: &serde_json::Value| {
        let st = &p["state"]["bfd_state"]["session_state"];
        st == 1 || st == "BFD_SESSION_STATE_UP"
    };
    lab.eventually("BFD up with both nodes", || {
        let v: serde_json::Value = serde_json::from_str(&gobgp("-j neighbor")).unwrap_or_default();
        v.as_array()
            .is_some_and(|a| a.iter().filter(|p| bfd_up(p)).count() == 2)
    });
    let log = format!("/run/podnet-lab/{}/logs/tor-gobgpd.log", lab.name);
    let dropped = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains("\"msg\":\"Expired\"") && l.contains("\"Peer\":\"192.168.200.11\""))
    };
    let in_rib = || {
        gobgp("global rib -a ipv4")
            .lines()
            .any(|l| l.contains(" 10.244.") && l.contains("192.168.200.11"))
    };
    frozen_node_dropped(&lab, &dropped, &in_rib);
}

/// node1's agent frozen: the router drops it (`dropped` says so in the
/// router's own words) and its pod CIDR goes from the router's table
/// (`has_cidr`); thawed, it comes back.
fn frozen_node_dropped(lab: &Lab, dropped: &dyn Fn() -> bool, has_cidr: &dyn Fn() -> bool) {
    lab.eventually("node1's pod CIDR at the router", has_cidr);
    let pids = format!("/run/podnet-lab/{}/pids/agent-node1", lab.name);
    let frozen = podnet_testkit::Frozen::pid_file(&pids);
    // (BIRD names its dynamic sessions in the order they came up, so the
    // frozen node's is whichever one says so.)
    lab.eventually("the router drops node1 on BFD's word", dropped);
    lab.eventually("node1's pod CIDR gone from the router", || !has_cidr());
    drop(frozen);
    lab.eventually("node1 back at the router", has_cidr);
}

#[test]
fn lb_over_bgp_with_frr() {
    lb_over_bgp("frr", "lbf");
}

/// LoadBalancer IPs over L2: one node answers ARP for the address; when
/// its agent stops answering (frozen: BFD goes quiet), another node takes
/// the address over with a gratuitous ARP and the client, which flushed
/// nothing, reaches the Service again.
#[test]
fn lb_over_l2_moves_when_the_owner_freezes() {
    let lab = Lab::up_with("l2f", "vxlan", 2, &["--l2-announce"]);
    lab.pod_labelled("web1", "node1", "app=web");
    lab.pod_labelled("web2", "node2", "app=web");
    lab.apply(
        "apiVersion: podnet.io/v1\nkind: IPAddressPool\nmetadata: {name: lan}\n\
         spec: {addresses: [192.168.200.240-192.168.200.247]}\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {name: web}\n\
         spec: {selector: {app: web}, type: LoadBalancer, ports: [{port: 80, targetPort: 8080}]}\n",
    );
    let ip = lab.lb_ip("web");
    // A client on the underlay segment, with no route to the address:
    // only ARP brings its packets to a node.
    let out = format!("pn-{}-net", lab.name);
    let (ok, msg) = lab.sh(&out, "ip addr add 192.168.200.250/24 dev br0");
    assert!(ok, "{msg}");
    lab.eventually("the LB IP over L2", || {
        ask_from(&lab, &out, &ip, 80, "hostname")
            .1
            .trim()
            .starts_with("web")
    });
    let mac_of = |ns: &str, dev: &str| {
        lab.sh(ns, &format!("cat /sys/class/net/{dev}/address"))
            .1
            .trim()
            .to_string()
    };
    let macs = [
        mac_of(&lab.node_ns("node1"), "eth0"),
        mac_of(&lab.node_ns("node2"), "eth0"),
    ];
    let neigh = || lab.sh(&out, &format!("ip neigh show {ip}")).1;
    let owner = macs
        .iter()
        .position(|m| neigh().contains(m.as_str()))
        .expect("a node's MAC");
    let owner_node = format!("node{}", owner + 1);
    let pids = format!("/run/podnet-lab/{}/pids/agent-{owner_node}", lab.name);
    let _frozen = podnet_testkit::Frozen::pid_file(&pids);
    let t0 = std::time::Instant::now();
    lab.eventually("the other node took the address", || {
        neigh().contains(macs[1 - owner].as_str())
    });
    lab.eventually("the LB IP answers again", || {
        ask_from(&lab, &out, &ip, 80, "hostname")
            .1
            .trim()
            .starts_with("web")
    });
    println!(
        "L2 takeover after freezing {owner_node}'s agent: {:?}",
        t0.elapsed()
    );
}

/// The bgp backend across two racks, Calico's way with a top-of-rack
/// router: each node peers with the router of its rack (a BGPPeer per
/// node) and advertises its pod CIDR there; the mesh's routes to a node in
/// the other rack have a next hop beyond the segment and go through the
/// router (the recursive next hop), which learned that CIDR from its
/// node. No tunnel anywhere; every pod reaches every other.
#[test]
fn bgp_across_two_racks_through_the_router() {
    let lab = Lab::up_with("bgx", "bgp", 3, &["--racks", "2", "--router", "bird"]);
    let peers: String = [("node1", 200), ("node2", 201), ("node3", 200)]
        .iter()
        .map(|(n, rack)| {
            format!(
                "---\napiVersion: podnet.io/v1\nkind: BGPPeer\nmetadata: {{name: tor-{n}}}\n\
                 spec: {{peerIP: 192.168.{rack}.254, asNumber: 64513, node: {n}}}\n"
            )
        })
        .collect();
    lab.apply(&peers);
    let ips: Vec<String> = (1..=3)
        .map(|i| lab.pod(&format!("p{i}"), &format!("node{i}")))
        .collect();
    let routes = lab.kernel_state("node1");
    assert!(routes.contains("via 192.168.200.13 dev eth0"), "{routes}");
    assert!(
        routes.contains("via 192.168.200.254 dev eth0"),
        "node2 is beyond the router: {routes}"
    );
    for i in 0..3 {
        for j in (0..3).filter(|j| *j != i) {
            let (from, to) = (format!("default/p{}", i + 1), format!("{}:8080", ips[j]));
            lab.eventually(&format!("p{i} -> p{j}"), || {
                lab.run(&["probe", &from, &to]).status.success()
            });
        }
    }
}

/// Two racks (underlay subnets) joined by the router, vxlan in its
/// cross-subnet mode: nodes in one rack route to each other directly,
/// across racks through the VTEP; every pod reaches every other.
#[test]
fn vxlan_cross_subnet_across_two_racks() {
    let lab = Lab::up_with("xs", "vxlan", 3, &["--racks", "2"]);
    let ips: Vec<String> = (1..=3)
        .map(|i| lab.pod(&format!("p{i}"), &format!("node{i}")))
        .collect();
    for i in 0..3 {
        for j in (0..3).filter(|j| *j != i) {
            assert_eq!(
                lab.ok(&[
                    "probe",
                    &format!("default/p{}", i + 1),
                    &format!("{}:8080", ips[j])
                ]),
                format!("p{}", j + 1),
                "p{i} -> p{j}"
            );
        }
    }
    // node1 (rack 1): node3 (rack 1) directly, node2 (rack 2) by VXLAN.
    let routes = lab.kernel_state("node1");
    assert!(routes.contains("via 192.168.200.13 dev eth0"), "{routes}");
    assert_eq!(routes.matches("onlink").count(), 1, "{routes}");
    let n2 = lab.sh(&lab.node_ns("node2"), "ip -4 addr show eth0").1;
    assert!(n2.contains("192.168.201.12/24"), "node2 is in rack 2: {n2}");
}

// ---- Extra networks, the Multus way.

/// A NetworkAttachmentDefinition for a macvlan on each node's underlay
/// (`eth0`), addresses and MACs as the pods ask (static IPAM with the
/// `ips` and `mac` capabilities).
const LAN: &str = r#"apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: lan, namespace: default}
spec:
  config: '{"cniVersion": "1.0.0", "type": "macvlan", "master": "eth0", "mode": "bridge", "capabilities": {"ips": true, "mac": true}, "ipam": {"type": "static"}}'
"#;

impl Lab {
    /// Pod `default/NAME` as the store or the API holds it.
    fn pod_json(&self, name: &str) -> serde_json::Value {
        let o = if self.kube {
            self.kubectl(&["get", "pod", name, "-o", "json"], None)
        } else {
            podnet(&["--store", &self.store(), "get", "pod", name, "-o", "json"])
        };
        serde_json::from_slice(&o.stdout).unwrap_or_default()
    }

    /// The pod's network-status annotation, once written.
    fn network_status(&self, name: &str) -> serde_json::Value {
        let mut v = serde_json::Value::Null;
        self.eventually(&format!("{name}'s network-status"), || {
            let a = &self.pod_json(name)["metadata"]["annotations"]
                ["k8s.v1.cni.cncf.io/network-status"];
            v = a
                .as_str()
                .and_then(|s| serde_json::from_str(s).ok())
                .unwrap_or_default();
            !v.is_null()
        });
        v
    }

    fn run_with_networks(&self, pod: &str, node: &str, networks: &str) -> Output {
        let a = format!("k8s.v1.cni.cncf.io/networks={networks}");
        self.run(&[
            "run",
            pod,
            "--node",
            node,
            "--ports",
            "8080/tcp",
            "--annotation",
            &a,
        ])
    }
}

#[test]
fn a_pod_gets_a_macvlan_network_the_multus_way() {
    extra_networks_in(Mode::Standalone, "mn");
}

#[test]
fn a_pod_gets_a_macvlan_network_the_multus_way_kube() {
    extra_networks_in(Mode::Kube, "mnk");
}

fn extra_networks_in(mode: Mode, tag: &str) {
    let lab = Lab::up_in(mode, tag, "vxlan", 2);
    lab.apply(LAN);
    let a = r#"[{"name": "lan", "ips": ["192.168.250.11/24"]}]"#;
    let b = r#"[{"name": "lan", "interface": "lan0", "ips": ["192.168.250.12/24"], "mac": "02:00:00:00:fa:12"}]"#;
    for (pod, node, nets) in [("default/a", "node1", a), ("default/b", "node2", b)] {
        let o = lab.run_with_networks(pod, node, nets);
        assert!(
            o.status.success(),
            "{pod}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // Each pod has its default network and the macvlan, and reaches the
    // other's macvlan address across the underlay (no overlay, no NAT).
    let shown = lab.ok(&[
        "exec",
        "default/b",
        "--",
        "ip",
        "-d",
        "-o",
        "link",
        "show",
        "lan0",
    ]);
    assert!(
        shown.contains("02:00:00:00:fa:12") && shown.contains("macvlan mode bridge"),
        "{shown}"
    );
    assert_eq!(lab.ok(&["probe", "default/a", "192.168.250.12:8080"]), "b");
    assert_eq!(
        lab.ok(&[
            "probe",
            "default/a",
            "192.168.250.12:8080",
            "--ask",
            "clientip"
        ]),
        "192.168.250.11"
    );
    // network-status: the default network first, then the extra one.
    let st = lab.network_status("b");
    assert_eq!(st[0]["interface"], "eth0", "{st}");
    assert_eq!(st[0]["default"], true, "{st}");
    assert_eq!(st[0]["ips"][0], lab.pod_ip("b").as_str(), "{st}");
    assert_eq!(
        (
            &st[1]["name"],
            &st[1]["interface"],
            &st[1]["ips"][0],
            &st[1]["mac"]
        ),
        (
            &"default/lan".into(),
            &"lan0".into(),
            &"192.168.250.12".into(),
            &"02:00:00:00:fa:12".into()
        ),
        "{st}"
    );
    assert_eq!(st.as_array().map(Vec::len), Some(2), "{st}");
    refused_networks(&lab);
    // DEL takes the extra network's record with it.
    let records = format!(
        "/run/podnet-lab/{}/nodes/node2/cni/podnet/networks",
        lab.name
    );
    assert_eq!(
        std::fs::read_dir(&records).map(|d| d.count()).unwrap_or(0),
        1,
        "{records}"
    );
    lab.ok(&["rm", "default/b"]);
    assert_eq!(
        std::fs::read_dir(&records).map(|d| d.count()).unwrap_or(0),
        0,
        "{records}"
    );
}

/// What a pod may not have fails its sandbox with a message naming why,
/// and leaves no pod behind.
fn refused_networks(lab: &Lab) {
    lab.ok(&["run", "other/x", "--node", "node1", "--ports", "8080/tcp"]);
    for (pod, nets, why) in [
        (
            "default/c",
            "nope",
            "NetworkAttachmentDefinition default/nope not found",
        ),
        (
            "other/d",
            "default/lan",
            "may attach only networks of its own namespace, not default/lan",
        ),
        (
            "default/e",
            "lan@eth0",
            "interface \"eth0\" is the pod's own",
        ),
    ] {
        let o = lab.run_with_networks(pod, "node1", nets);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(why), "{pod}: {err}");
        let (ns, name) = pod.split_once('/').unwrap();
        let rec = format!("/run/podnet-lab/{}/pods/{ns}_{name}.json", lab.name);
        assert!(!std::path::Path::new(&rec).exists(), "{pod} left behind");
    }
}

// ---- The encrypted overlay.

#[test]
fn encrypted_full_mesh() {
    let (lab, ips) = full_mesh_with(Mode::Standalone, "vxlan", "enc", &["--encrypt"]);
    nothing_in_clear_on_the_underlay(&lab, &ips[1]);
}

#[test]
fn encrypted_full_mesh_kube() {
    let (lab, ips) = full_mesh_with(Mode::Kube, "vxlan", "eck", &["--encrypt"]);
    nothing_in_clear_on_the_underlay(&lab, &ips[1]);
}

/// tcpdump on its bridge and on its underlay while pod p1 (node1) sends a
/// marker to p2 (node2): the bridge shows it (the capture works), the
/// underlay carries only WireGuard's UDP 51820 and never the marker.
fn nothing_in_clear_on_the_underlay(lab: &Lab, p2: &str) {
    const MARKER: &[u8] = b"PODNET-PLAINTEXT-MARKER-7f3a";
    let dir = tempfile::tempdir().unwrap();
    let node1 = lab.node_ns("node1");
    let capture = |dev: &str, filter: &str| {
        let file = dir.path().join(format!("{dev}.pcap"));
        let mut c = podnet_testkit::command_in(&node1, "tcpdump");
        c.args(["--immediate-mode", "-i", dev, "-n", "-U", "-w"])
            .arg(&file)
            .arg(filter);
        let mut child = c
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("tcpdump (scripts/test-setup.sh installs it)");
        // Capturing once it says so.
        let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut err, &mut line).unwrap();
        assert!(line.contains("listening on"), "tcpdump: {line}");
        (child, file)
    };
    let (mut under, under_file) = capture("eth0", "udp");
    let (mut bridge, bridge_file) = capture("podnet0", "tcp port 9002");
    let listener = lab.listen_in("p2", 9002);
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        got
    });
    let mut c = lab.connect_from("p1", p2, 9002);
    for _ in 0..200 {
        c.write_all(MARKER).unwrap();
    }
    drop(c);
    assert_eq!(server.join().unwrap().len(), 200 * MARKER.len());
    for child in [&mut under, &mut bridge] {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        child.wait().unwrap();
    }
    let has = |f: &std::path::Path| {
        let b = std::fs::read(f).unwrap();
        b.windows(MARKER.len()).any(|w| w == MARKER)
    };
    let count = |f: &std::path::Path, filter: &str| {
        let o = Command::new("tcpdump")
            .args(["-n", "-r"])
            .arg(f)
            .arg(filter)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).lines().count()
    };
    assert!(
        has(&bridge_file),
        "the marker crossed node1's bridge (the capture works): {} packets there",
        count(&bridge_file, "")
    );
    assert!(
        !has(&under_file),
        "the marker was seen in clear on the underlay"
    );
    assert!(
        count(&under_file, "udp dst port 51820") > 0,
        "no WireGuard packets on the underlay"
    );
}

// ---- Dual-stack pods.

#[test]
fn dual_stack_full_mesh_vxlan() {
    dual_stack_mesh(Mode::DualStack, "dsv", "vxlan");
}

#[test]
fn dual_stack_full_mesh_vxlan_kube() {
    dual_stack_mesh(Mode::KubeDualStack, "dsk", "vxlan");
}

/// host-gw routes IPv6 pod subnets via the nodes' IPv6 underlay
/// addresses (a dual-stack lab's underlay has them).
#[test]
fn dual_stack_full_mesh_host_gw() {
    dual_stack_mesh(Mode::DualStack, "dsh", "host-gw");
}

#[test]
fn dual_stack_full_mesh_host_gw_kube() {
    dual_stack_mesh(Mode::KubeDualStack, "dsg", "host-gw");
}

/// The BGP mesh carries IPv6 unicast beside IPv4 (MP-BGP on the same
/// sessions): each node's IPv6 subnet via its IPv6 underlay address.
#[test]
fn dual_stack_full_mesh_bgp() {
    dual_stack_mesh(Mode::DualStack, "dsb", "bgp");
}

#[test]
fn dual_stack_full_mesh_bgp_kube() {
    dual_stack_mesh(Mode::KubeDualStack, "dsc", "bgp");
}

/// The userspace tunnel carries IPv6 packets inside its IPv4 datagrams.
#[test]
fn dual_stack_full_mesh_udp() {
    dual_stack_mesh(Mode::DualStack, "dsu", "udp");
}

#[test]
fn dual_stack_full_mesh_udp_kube() {
    dual_stack_mesh(Mode::KubeDualStack, "dsw", "udp");
}

/// The encrypted overlay carries IPv6 pods (each peer's tunnel speaks for
/// both its subnets) in both modes.
#[test]
fn dual_stack_full_mesh_encrypted() {
    dual_stack_mesh(Mode::DualStack, "dse", "vxlan+encrypt");
}

#[test]
fn dual_stack_full_mesh_encrypted_kube() {
    dual_stack_mesh(Mode::KubeDualStack, "dsf", "vxlan+encrypt");
}

/// Every pod has an IPv4 and an IPv6 address; every pod reaches every
/// other by its IPv6 address, TCP and UDP, and sees the real client
/// address (no NAT); a stream crosses whole. IPv4 keeps working beside.
/// `backend` may end in `+encrypt` (`lab up --encrypt`).
fn dual_stack_mesh(mode: Mode, tag: &str, backend: &str) {
    let mut flags = mode.flags().to_vec();
    let backend = match backend.strip_suffix("+encrypt") {
        Some(b) => {
            flags.push("--encrypt");
            b
        }
        None => backend,
    };
    let lab = Lab::up_with(tag, backend, 3, &flags);
    let mut six = Vec::new();
    for i in 1..=3 {
        lab.pod_labelled(&format!("p{i}"), &format!("node{i}"), &format!("app=p{i}"));
        let r = lab.pod_record(&format!("p{i}"));
        let ip6 = r["ip6"]
            .as_str()
            .unwrap_or_else(|| panic!("p{i} has no IPv6 address: {r}"));
        assert!(ip6.starts_with("fd00:10:244:"), "{ip6}");
        six.push(ip6.to_string());
    }
    for i in 0..3 {
        for j in (0..3).filter(|j| *j != i) {
            let from = format!("default/p{}", i + 1);
            for port in ["8080", "8081/udp"] {
                let to = format!("[{}]:{port}", six[j]);
                assert_eq!(
                    lab.ok(&["probe", &from, &to]),
                    format!("p{}", j + 1),
                    "{from} -> {to}"
                );
                assert_eq!(
                    lab.ok(&["probe", &from, &to, "--ask", "clientip"]),
                    six[i],
                    "no NAT between pods: {from} -> {to}"
                );
            }
        }
    }
    // The Pod's status lists both addresses.
    let v = lab.pod_json("p2");
    let ips: Vec<&str> = v["status"]["podIPs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["ip"].as_str())
        .collect();
    assert_eq!(ips, [lab.pod_ip("p2").as_str(), six[1].as_str()]);
    bulk_echo(&lab, "p1", "p2", &six[1]);
    assert_eq!(
        lab.ok(&["probe", "default/p1", &format!("{}:8080", lab.pod_ip("p3"))]),
        "p3"
    );
    // IPv6 leaving the pod network leaves masqueraded as its node's
    // (IPv6 underlay) address, and dies at the lab's gateway.
    let lib = lab_lib(&lab);
    assert!(!lab
        .run(&["probe", "default/p1", "[2001:db8::7]:80"])
        .status
        .success());
    let leaks = lib.gateway_leaks().unwrap();
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    assert!(
        leaks
            .flows
            .contains(&(ip("fd00:192:168:200::11"), ip("2001:db8::7"))),
        "{leaks:?}"
    );
    assert!(
        !leaks.flows.iter().any(|(src, _)| *src == ip(&six[0])),
        "IPv6 pod traffic left its node unmasqueraded: {leaks:?}"
    );
}

/// A node switched to the encrypted overlay drops the VTEP its earlier
/// run made: left in place it would go on taking plain VXLAN from the
/// underlay into the pods.
#[test]
fn an_agent_turned_to_encryption_removes_its_vtep() {
    let lab = Lab::up("enr", "vxlan", 2);
    let node1 = lab.node_ns("node1");
    assert!(
        lab.sh(&node1, "ip link show podnet.1").0,
        "the VTEP is there first"
    );
    lab.apply(
        "apiVersion: podnet.io/v1\nkind: NetworkConfig\nmetadata: {name: default}\n\
         spec: {Network: 10.244.0.0/16, SubnetLen: 24, Backend: {Type: vxlan}, Encrypt: true}\n",
    );
    lab.ok(&["restart-agent", "node1"]);
    lab.agent_ready("node1");
    assert!(
        lab.sh(&node1, "ip link show podnet.wg").0,
        "the tunnel is up"
    );
    let (vtep, out) = lab.sh(&node1, "ip link show podnet.1");
    assert!(!vtep, "the old VTEP is still there: {out}");
}
