//! podnet's service proxy against the real kube-proxy (`--proxy-mode=
//! nftables`), verdict by verdict: on the same Services, EndpointSlices
//! and pods, the same probes must end the same way.
//!
//! One 2-node Kubernetes-mode lab (real etcd, kube-apiserver and
//! kube-controller-manager). Every Service feature the lab tests exercise
//! gets a Service ([`SERVICES`]): ClusterIP (TCP and UDP, an unserved port
//! and protocol, an unallocated address of the Service CIDR), no endpoints,
//! NodePort (and where it must not answer: loopback, the pod bridge),
//! sessionAffinity, externalIPs, LoadBalancer with `externalTrafficPolicy:
//! Local` and its health-check node port, serving-terminating endpoints,
//! loadBalancerSourceRanges, `internalTrafficPolicy: Local`, zone hints, a
//! Service handed to another proxy, hairpin. [`probes`] then asks each
//! from a pod on the endpoint's node and on the other node, from the nodes
//! themselves, from a client outside the cluster (on the underlay) and
//! from a backend itself, over TCP or UDP, and records each outcome by
//! cause ([`verdict`]): which backends answered (`w1+w2`: both; and, where
//! asked, whether the backend saw the client's own address), `refused`
//! (ECONNREFUSED: a TCP reset or an ICMP port-unreachable), `timeout`
//! (dropped), `rejected at send (EPERM)` (a UDP datagram rejected in the
//! sender's own output path), or the error itself (an ICMP
//! admin-prohibited shows as "No route to host"). The health-check node
//! port is asked over HTTP: its status and `localEndpoints`.
//!
//! The probes run twice on the same lab: first with podnet's agents
//! (proxy included), then with the agents run `--no-proxy` and one
//! kube-proxy per node ([`podnet_lab::kubeproxy`]). Each turn starts from a
//! proxy that has just synced everything from scratch. The two tables are
//! diffed: every difference must be in [`KNOWN`], with its reason, and
//! every entry of [`KNOWN`] must still differ, so the list stays true.
//! Both proxies must have served (the basic ClusterIP probes connect
//! under each), so the test cannot pass on two dead data planes.
//!
//! On a difference, each node's tables as they were during both turns
//! (and the gateway's leak count) are printed with the failure;
//! `PODNET_KPDIFF_SHOW=1` prints them on success too.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use podnet_daemon::{HttpError, HttpGet};
use podnet_kernel::Netns;
use podnet_lab::serve::{self, Reach};
use podnet_testkit::{eventually, try_sh_in};

#[path = "common/kubelab.rs"]
mod kubelab;
use kubelab::{podnet, KubeLab, WAIT};

/// How long a probe waits for an answer: a drop shows as this timeout.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Tries of a probe over a Service with several endpoints (stopping once
/// two backends answered): both show with probability 1 - 2^-15.
const SPREAD_TRIES: usize = 16;
/// Tries of a sessionAffinity probe: all must reach one backend.
const STICKY_TRIES: usize = 8;

const N1: &str = "192.168.200.11";
const N2: &str = "192.168.200.12";
/// The client outside the cluster, on the underlay bridge.
const OUTSIDE: &str = "192.168.200.250";

/// Differences that are intended: (probe, podnet's verdict, kube-proxy's
/// verdict, why). Each must still occur.
const KNOWN: &[(&str, &str, &str, &str)] = &[];

/// The Services and hand-written EndpointSlices (`@W1@`, `@W2@`: the
/// backends' pod addresses). Fixed ClusterIPs and node ports keep the probe
/// table readable.
const SERVICES: &str = "\
apiVersion: v1
kind: Service
metadata: {name: plain}
spec:
  clusterIP: 10.96.0.91
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}, {name: dns, port: 53, targetPort: 8081, protocol: UDP}]
---
apiVersion: v1
kind: Service
metadata: {name: none}
spec:
  clusterIP: 10.96.0.92
  type: NodePort
  selector: {app: nothing}
  ports: [{name: http, port: 80, nodePort: 30092}, {name: dns, port: 53, protocol: UDP, nodePort: 30093}]
---
apiVersion: v1
kind: Service
metadata: {name: sticky}
spec:
  clusterIP: 10.96.0.93
  selector: {app: web}
  sessionAffinity: ClientIP
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: ext}
spec:
  clusterIP: 10.96.0.94
  selector: {app: web}
  externalIPs: [203.0.113.10]
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: loc}
spec:
  clusterIP: 10.96.0.95
  type: LoadBalancer
  externalTrafficPolicy: Local
  healthCheckNodePort: 30100
  selector: {one: 'yes'}
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30095}]
---
apiVersion: v1
kind: Service
metadata: {name: term}
spec:
  clusterIP: 10.96.0.96
  type: NodePort
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30096}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: term-1, labels: {kubernetes.io/service-name: term}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: ['@W1@'], nodeName: node1, conditions: {ready: false, serving: true, terminating: true}}
- {addresses: ['@W2@'], nodeName: node2, conditions: {ready: true, serving: true, terminating: false}}
---
apiVersion: v1
kind: Service
metadata: {name: lbok}
spec:
  clusterIP: 10.96.0.97
  type: LoadBalancer
  selector: {app: web}
  loadBalancerSourceRanges: [192.168.200.0/24]
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30097}]
---
apiVersion: v1
kind: Service
metadata: {name: lbelse}
spec:
  clusterIP: 10.96.0.98
  type: LoadBalancer
  selector: {app: web}
  loadBalancerSourceRanges: [198.51.100.0/24]
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30098}]
---
apiVersion: v1
kind: Service
metadata: {name: optout, labels: {service.kubernetes.io/service-proxy-name: other}}
spec:
  clusterIP: 10.96.0.99
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: itl}
spec:
  clusterIP: 10.96.0.100
  internalTrafficPolicy: Local
  selector: {one: 'yes'}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: topo}
spec:
  clusterIP: 10.96.0.101
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: topo-1, labels: {kubernetes.io/service-name: topo}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: ['@W1@'], nodeName: node1, zone: a, hints: {forZones: [{name: a}]}}
- {addresses: ['@W2@'], nodeName: node2, zone: b, hints: {forZones: [{name: b}]}}
---
apiVersion: v1
kind: Service
metadata: {name: np}
spec:
  clusterIP: 10.96.0.102
  type: NodePort
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30102}, {name: dns, port: 53, targetPort: 8081, protocol: UDP, nodePort: 30103}]
";

/// LoadBalancer addresses, as a load-balancer controller writes them.
const LB_IPS: &[(&str, &str)] = &[
    ("loc", "203.0.113.20"),
    ("lbok", "203.0.113.31"),
    ("lbelse", "203.0.113.32"),
];

/// Selector Services and how many endpoints their slices must list before
/// the proxies are started.
const SELECTED: &[(&str, usize)] = &[
    ("plain", 2),
    ("sticky", 2),
    ("ext", 2),
    ("loc", 1),
    ("lbok", 2),
    ("lbelse", 2),
    ("optout", 2),
    ("itl", 1),
    ("np", 2),
];

/// Where a probe is sent from: `c1`, `c2` (client pods on node1, node2),
/// `w1` (a backend, on node1), `node1`, `node2` (the nodes' own
/// namespaces), `outside` (the underlay, [`OUTSIDE`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Src {
    /// A client pod on node1 / node2.
    C1,
    C2,
    /// A backend itself (w1, on node1).
    W1,
    /// A node's own namespace.
    Node1,
    Node2,
    /// A client on the underlay, outside the cluster.
    Outside,
}

impl Src {
    fn name(self) -> &'static str {
        match self {
            Src::C1 => "c1",
            Src::C2 => "c2",
            Src::W1 => "w1",
            Src::Node1 => "node1",
            Src::Node2 => "node2",
            Src::Outside => "outside",
        }
    }
}

/// How many times a probe asks, and what its verdict summarises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tries {
    /// One question.
    Once,
    /// Up to [`SPREAD_TRIES`]: which backends answer.
    Spread,
    /// [`STICKY_TRIES`]: whether one backend answers them all.
    Sticky,
}

#[derive(Clone, Debug)]
struct Probe {
    scenario: &'static str,
    from: Src,
    to: SocketAddr,
    udp: bool,
    tries: Tries,
    /// Also ask `clientip` once: did the backend see the client's address?
    client_ip: bool,
}

impl Probe {
    fn id(&self) -> String {
        format!(
            "{}: {} -> {}/{}",
            self.scenario,
            self.from.name(),
            self.to,
            if self.udp { "udp" } else { "tcp" }
        )
    }
}

/// The probe table. `bridge` is node1's pod-bridge address.
fn probes(bridge: &str) -> Vec<Probe> {
    use Src::*;
    use Tries::*;
    let mut v = Vec::new();
    let mut p = |scenario, from, to: &str, udp, tries, client_ip| {
        v.push(Probe {
            scenario,
            from,
            to: to.parse().expect("probe address"),
            udp,
            tries,
            client_ip,
        })
    };
    // ClusterIP, two endpoints (w1 on node1, w2 on node2).
    p("plain", C1, "10.96.0.91:80", false, Spread, true);
    p("plain", C2, "10.96.0.91:80", false, Spread, true);
    p("plain", C1, "10.96.0.91:53", true, Spread, false);
    p("plain", C2, "10.96.0.91:53", true, Spread, false);
    p("plain", Node1, "10.96.0.91:80", false, Spread, true);
    p("plain", Node2, "10.96.0.91:53", true, Spread, false);
    // Its unserved port and protocol.
    p("plain", C1, "10.96.0.91:81", false, Once, false);
    p("plain", C1, "10.96.0.91:80", true, Once, false);
    p("plain", Node1, "10.96.0.91:81", false, Once, false);
    // An address of the Service CIDR that no Service holds.
    p("unheld", C1, "10.96.0.250:80", false, Once, false);
    p("unheld", Node1, "10.96.0.250:80", false, Once, false);
    // No endpoints: ClusterIP and NodePort, TCP and UDP.
    p("none", C1, "10.96.0.92:80", false, Once, false);
    p("none", C1, "10.96.0.92:53", true, Once, false);
    p("none", Outside, "192.168.200.11:30092", false, Once, false);
    p("none", Outside, "192.168.200.11:30093", true, Once, false);
    p("none", Node2, "192.168.200.12:30092", false, Once, false);
    p("none", Node2, "10.96.0.92:80", false, Once, false);
    p("none", Node2, "10.96.0.92:53", true, Once, false);
    // sessionAffinity: ClientIP.
    p("sticky", C2, "10.96.0.93:80", false, Sticky, false);
    p("sticky", Node1, "10.96.0.93:80", false, Sticky, false);
    // externalIPs (routed to node1 from outside).
    p("ext", Outside, "203.0.113.10:80", false, Spread, true);
    p("ext", C1, "203.0.113.10:80", false, Spread, true);
    p("ext", Node2, "203.0.113.10:80", false, Spread, false);
    p("ext", C1, "10.96.0.94:80", false, Spread, false);
    p("ext", Outside, "203.0.113.10:81", false, Once, false);
    // LoadBalancer, externalTrafficPolicy Local, its endpoint on node1.
    p("loc", Outside, "192.168.200.11:30095", false, Once, true);
    p("loc", Outside, "192.168.200.12:30095", false, Once, false);
    p("loc", Outside, "203.0.113.20:80", false, Once, true);
    p("loc", C2, "192.168.200.12:30095", false, Once, false);
    p("loc", C2, "203.0.113.20:80", false, Once, false);
    p("loc", Node1, "192.168.200.11:30095", false, Once, false);
    p("loc", Node2, "192.168.200.12:30095", false, Once, false);
    p("loc", Node1, "203.0.113.20:80", false, Once, false);
    p("loc", Node2, "203.0.113.20:80", false, Once, false);
    p("loc", C2, "10.96.0.95:80", false, Once, true);
    // Hairpin: the backend through its own Service.
    p("loc", W1, "10.96.0.95:80", false, Once, true);
    p("loc", W1, "192.168.200.11:30095", false, Once, true);
    p("loc", C1, "192.168.200.11:30095", false, Once, true);
    // Serving-terminating endpoint on node1, ready one on node2, Local.
    p("term", Outside, "192.168.200.11:30096", false, Once, true);
    p("term", Outside, "192.168.200.12:30096", false, Once, true);
    p("term", C1, "10.96.0.96:80", false, Spread, false);
    p("term", C1, "192.168.200.11:30096", false, Spread, false);
    p("term", Node1, "192.168.200.11:30096", false, Spread, false);
    // loadBalancerSourceRanges (outside's address in lbok's only).
    p("lbok", Outside, "203.0.113.31:80", false, Spread, true);
    p("lbok", Node1, "203.0.113.31:80", false, Spread, false);
    p("lbok", C1, "203.0.113.31:80", false, Once, false);
    p("lbelse", Node1, "203.0.113.32:80", false, Once, false);
    p("lbelse", Outside, "203.0.113.32:80", false, Once, false);
    p(
        "lbelse",
        Outside,
        "192.168.200.11:30098",
        false,
        Spread,
        false,
    );
    p("lbelse", C1, "203.0.113.32:80", false, Once, false);
    // A Service for another proxy (service.kubernetes.io/service-proxy-name).
    p("optout", C1, "10.96.0.99:80", false, Once, false);
    // internalTrafficPolicy Local, its endpoint on node1.
    p("itl", C1, "10.96.0.100:80", false, Spread, false);
    p("itl", C2, "10.96.0.100:80", false, Once, false);
    p("itl", Node1, "10.96.0.100:80", false, Spread, false);
    p("itl", Node2, "10.96.0.100:80", false, Once, false);
    // Zone hints: node1 is in zone a (w1's), node2 has no zone.
    p("topo", C1, "10.96.0.101:80", false, Spread, false);
    p("topo", C2, "10.96.0.101:80", false, Spread, false);
    // NodePort: on the node's address, not on loopback or the pod bridge.
    p("np", Node1, "192.168.200.11:30102", false, Spread, false);
    p("np", Outside, "192.168.200.12:30102", false, Spread, true);
    p("np", Outside, "192.168.200.11:30103", true, Spread, false);
    p("np", C1, "192.168.200.12:30102", false, Spread, true);
    p("np", Node1, "127.0.0.1:30102", false, Once, false);
    p("np", Outside, "192.168.200.11:30199", false, Once, false);
    p("np", Node1, &format!("{bridge}:30102"), false, Once, false);
    v
}

/// The health-check node port of `loc`, asked from outside on each node.
const HEALTH: &[&str] = &["192.168.200.11:30100", "192.168.200.12:30100"];

/// What one probe found.
fn verdict(r: &[Reach]) -> String {
    let mut set = BTreeSet::new();
    for x in r {
        set.insert(match x {
            Reach::Connected(who) => who.strip_prefix("default/").unwrap_or(who).to_string(),
            Reach::Refused => "refused".into(),
            Reach::TimedOut => "timeout".into(),
            // A reject in the sender's own output path: the kernel drops
            // the datagram and sendmsg(2) fails with EPERM.
            Reach::Other(e) if e.contains("os error 1)") => "rejected at send (EPERM)".into(),
            Reach::Other(e) => format!("error: {e}"),
        });
    }
    set.into_iter().collect::<Vec<_>>().join("+")
}

struct Diff {
    lab: KubeLab,
    lib: podnet_lab::Lab,
    /// Namespaces and own addresses of the probe sources.
    sources: BTreeMap<&'static str, (String, String)>,
}

impl Diff {
    fn source(&self, f: Src) -> &(String, String) {
        &self.sources[f.name()]
    }

    fn ask(&self, f: Src, to: SocketAddr, udp: bool, request: &str) -> std::io::Result<String> {
        let (ns, _) = self.source(f);
        Netns::named(ns)
            .expect("source namespace")
            .run(|| serve::ask(to, udp, request, PROBE_TIMEOUT))
            .expect("entering the source namespace")
    }

    fn run(&self, p: &Probe) -> String {
        let n = match p.tries {
            Tries::Once => 1,
            Tries::Spread => SPREAD_TRIES,
            Tries::Sticky => STICKY_TRIES,
        };
        let mut got = Vec::new();
        for _ in 0..n {
            let r = Reach::of(self.ask(p.from, p.to, p.udp, serve::WHOAMI), p.udp);
            let failed = !matches!(r, Reach::Connected(_));
            got.push(r);
            let backends = verdict(&got).matches('+').count() + 1;
            // A failure ends it (it would repeat), so do two backends.
            if failed || (p.tries == Tries::Spread && backends >= 2) {
                break;
            }
        }
        let mut v = verdict(&got);
        if p.tries == Tries::Sticky && got.len() == STICKY_TRIES && !v.contains('+') {
            v = if v.starts_with('w') {
                "one backend for every try".into()
            } else {
                v
            };
        }
        if p.client_ip && matches!(got.first(), Some(Reach::Connected(_))) {
            let own = &self.source(p.from).1;
            let seen = self.ask(p.from, p.to, p.udp, "clientip");
            v += match seen {
                Ok(ip) if &ip == own => ", client address kept",
                Ok(_) => ", client address translated",
                Err(_) => ", clientip unanswered",
            };
        }
        v
    }

    fn health(&self, addr: &str) -> String {
        let (ns, _) = self.source(Src::Outside);
        let ns = Netns::named(ns).unwrap();
        let addr: SocketAddr = addr.parse().unwrap();
        match HttpGet::new(PROBE_TIMEOUT)
            .netns(Some(&ns))
            .get(addr, "/healthz")
        {
            Ok(r) => {
                let local = r
                    .body
                    .split("\"localEndpoints\":")
                    .nth(1)
                    .and_then(|r| r.trim_start().split(|c: char| !c.is_ascii_digit()).next())
                    .unwrap_or("?")
                    .to_string();
                format!("HTTP {}, localEndpoints {local}", r.status)
            }
            Err(HttpError::Io { source, .. }) => format!("{:?}", Reach::of(Err(source), false)),
            Err(e @ HttpError::Malformed { .. }) => format!("{:?}", Reach::Other(e.to_string())),
            Err(e) => panic!("{e}"),
        }
    }

    /// Every probe, in parallel (each on its own thread, in its source's
    /// namespace), then the health checks.
    fn table(&self, probes: &[Probe]) -> BTreeMap<String, String> {
        let mut out: BTreeMap<String, String> = std::thread::scope(|s| {
            let hs: Vec<_> = probes
                .iter()
                .map(|p| s.spawn(move || (p.id(), self.run(p))))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for h in HEALTH {
            out.insert(
                format!("loc: outside -> {h}/tcp GET /healthz"),
                self.health(h),
            );
        }
        out
    }

    /// Every node's nftables tables whose name starts with `prefix`, and
    /// what the gateway saw leave the nodes so far, as text.
    fn kernel_state(&self, who: &str, prefix: &str) -> String {
        let mut out = format!(
            "=== kernel state during {who}'s turn (gateway leaks so far: {:?})\n",
            self.lib.gateway_leaks().map(|l| l.packets)
        );
        for n in ["node1", "node2"] {
            let ns = self.lab.node_ns(n);
            let tables = podnet_testkit::nft_list(Some(&ns), "tables").unwrap_or_default();
            for t in tables.lines().filter_map(|l| l.strip_prefix("table ")) {
                if t.split_whitespace()
                    .nth(1)
                    .is_some_and(|name| name.starts_with(prefix))
                {
                    let body = podnet_testkit::nft_list(Some(&ns), &format!("table {t}"));
                    out += &format!("--- {n}: table {t}\n{}\n", body.unwrap_or_default());
                }
            }
        }
        out
    }

    /// Waits until the basic ClusterIP answers from both client pods: the
    /// data plane of the proxy now running works at all.
    fn wait_served(&self, who: &str) {
        for f in [Src::C1, Src::C2] {
            eventually(
                &format!("{who}: {} reaches plain's ClusterIP", f.name()),
                WAIT,
                || self.ask(f, "10.96.0.91:80".parse().unwrap(), false, serve::WHOAMI),
            );
            // And both of its UDP endpoints answer: once, right after the
            // agents' restart, every UDP try from c1 went to w1 while the
            // table read afterwards held both (cause not found; see
            // bench/README.md). The verdicts compare settled proxies.
            let mut seen = BTreeSet::new();
            let mut tries = 0;
            eventually(
                &format!("{who}: {} gets both of plain's UDP endpoints", f.name()),
                WAIT,
                || {
                    if let Ok(w) =
                        self.ask(f, "10.96.0.91:53".parse().unwrap(), true, serve::WHOAMI)
                    {
                        seen.insert(w);
                    }
                    tries += 1;
                    if tries == SPREAD_TRIES && seen.len() < 2 {
                        // The transient again: keep the kernel's state
                        // at this moment for whoever looks into it.
                        let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                            .join(format!("kubeproxy-diff-udp-transient-{who}.txt"));
                        let _ = std::fs::write(&p, self.kernel_state(who, ""));
                        eprintln!(
                            "{who}: one UDP endpoint after {tries} tries; see {}",
                            p.display()
                        );
                    }
                    (seen.len() >= 2).then_some(())
                },
            );
        }
    }
}

fn ok(o: std::process::Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The number of ready endpoints the slices of Service `svc` list.
fn ready_endpoints(lab: &KubeLab, svc: &str) -> usize {
    let v = lab.json(&[
        "get",
        "endpointslices",
        "-l",
        &format!("kubernetes.io/service-name={svc}"),
    ]);
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
        .filter(|e| e["conditions"]["ready"] == true)
        .count()
}

fn setup() -> Diff {
    let lab = KubeLab::up(2);
    let lib =
        podnet_lab::Lab::new(&lab.name, PathBuf::from(env!("CARGO_BIN_EXE_podnet"))).expect("lab");
    let run = |pod: &str, node: &str, labels: &str| {
        ok(
            podnet(&[
                "lab",
                "--name",
                &lab.name,
                "run",
                &format!("default/{pod}"),
                "--node",
                node,
                "--labels",
                labels,
                "--ports",
                "8080/tcp,8081/udp",
            ]),
            &format!("lab run {pod}"),
        );
        lib.pod("default", pod).expect("pod record")
    };
    let w1 = run("w1", "node1", "app=web,one=yes");
    let w2 = run("w2", "node2", "app=web");
    let c1 = run("c1", "node1", "app=client");
    let c2 = run("c2", "node2", "app=client");
    // node1 is in zone a; node2 has no zone.
    lab.ok(
        &["label", "node", "node1", "topology.kubernetes.io/zone=a"],
        None,
    );
    lab.ok(
        &["apply", "-f", "-"],
        Some(&SERVICES.replace("@W1@", &w1.ip).replace("@W2@", &w2.ip)),
    );
    for (svc, ip) in LB_IPS {
        lab.ok(
            &[
                "patch",
                "svc",
                svc,
                "--subresource=status",
                "--type=merge",
                "-p",
                &format!(r#"{{"status":{{"loadBalancer":{{"ingress":[{{"ip":"{ip}"}}]}}}}}}"#),
            ],
            None,
        );
    }
    for (svc, n) in SELECTED {
        eventually(
            &format!("{svc}'s slices list {n} ready endpoints"),
            WAIT,
            || ready_endpoints(&lab, svc) == *n,
        );
    }
    // The outside client: an address on the underlay bridge, with the
    // external and LoadBalancer addresses routed to node1.
    let underlay = format!("pn-{}-net", lab.name);
    let (done, out) = try_sh_in(
        &underlay,
        &format!(
            "ip addr add {OUTSIDE}/24 dev br0 && \
             for ip in 203.0.113.10 203.0.113.20 203.0.113.31 203.0.113.32; do \
               ip route add $ip/32 via {N1} || exit 1; done"
        ),
    );
    assert!(done, "{out}");
    // The kernel's ICMP manners, the same under both proxies, must not
    // thin out the verdicts: no ICMP rate limit (a suppressed
    // port-unreachable reads as a drop) and no redirects (a probe the node
    // forwards back out of eth0 would send the outside client one, and a
    // redirect restarts that client's ICMP rate-limit bucket on the node:
    // both use one inet_peer). Once, before this, both `none` probes from
    // outside timed out in podnet's turn; that this was the cause is a
    // hypothesis (bench/README.md).
    for n in ["node1", "node2"] {
        let (done, out) = try_sh_in(
            &lab.node_ns(n),
            "sysctl -qw net.ipv4.icmp_ratelimit=0 net.ipv4.conf.all.send_redirects=0 \
             net.ipv4.conf.default.send_redirects=0 net.ipv4.conf.eth0.send_redirects=0",
        );
        assert!(done, "{n}: {out}");
    }
    let mut sources = BTreeMap::new();
    sources.insert("c1", (c1.netns.clone(), c1.ip.clone()));
    sources.insert("c2", (c2.netns.clone(), c2.ip.clone()));
    sources.insert("w1", (w1.netns.clone(), w1.ip.clone()));
    sources.insert("node1", (lab.node_ns("node1"), N1.to_string()));
    sources.insert("node2", (lab.node_ns("node2"), N2.to_string()));
    sources.insert("outside", (underlay, OUTSIDE.to_string()));
    Diff { lab, lib, sources }
}

/// node1's pod-bridge address.
fn bridge_address(d: &Diff) -> String {
    let (_, out) = try_sh_in(
        &d.lab.node_ns("node1"),
        "ip -4 -o addr show dev podnet0 | awk '{print $4}' | cut -d/ -f1",
    );
    let a = out.trim().to_string();
    assert!(a.parse::<IpAddr>().is_ok(), "podnet0's address: {out:?}");
    a
}

fn print_table(title: &str, t: &BTreeMap<String, String>) {
    eprintln!("--- {title}");
    for (k, v) in t {
        eprintln!("{k:<62} => {v}");
    }
}

#[test]
fn podnet_and_kube_proxy_nftables_give_the_same_packet_flow_verdicts() {
    let kube_proxy = podnet_lab::kubeproxy::find_binary().unwrap_or_else(|e| panic!("{e}"));
    let d = setup();
    let probes = probes(&bridge_address(&d));
    let nodes = ["node1", "node2"];

    // podnet: every agent restarted, so its proxy synced all of the above
    // from scratch, as kube-proxy will.
    for n in nodes {
        d.lib.restart_agent(n).unwrap();
    }
    for n in nodes {
        d.lib.wait_agent_synced(n, &[], WAIT).unwrap();
    }
    d.wait_served("podnet");
    let podnet_table = d.table(&probes);
    // What each proxy had in the kernel while probed, shown on a failure
    // (the lab, and so the kernel state, is gone by then).
    let mut evidence = d.kernel_state("podnet", "podnet");
    print_table("podnet", &podnet_table);

    // kube-proxy nftables: agents without their proxy (and its tables).
    d.lib.agents_without_proxy().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let kp = rt
        .block_on(
            d.lib
                .start_kube_proxy(&podnet_lab::kubeproxy::Options::new(kube_proxy)),
        )
        .unwrap();
    d.wait_served("kube-proxy");
    let kube_table = d.table(&probes);
    evidence += &d.kernel_state("kube-proxy", "kube-proxy");
    print_table("kube-proxy nftables", &kube_table);
    // It ran with the rights kubeadm gives it: nothing was refused.
    for n in nodes {
        let log = std::fs::read_to_string(d.lib.log_path(&podnet_lab::kubeproxy::role(n)))
            .unwrap_or_default();
        assert!(
            log.contains("nftables"),
            "kube-proxy on {n} logged nothing useful:\n{log}"
        );
        let denied: Vec<&str> = log.lines().filter(|l| l.contains("forbidden")).collect();
        assert!(
            denied.is_empty(),
            "kube-proxy on {n} was refused: {denied:#?}"
        );
    }
    kp.stop().unwrap();
    for n in nodes {
        let t = podnet_testkit::nft_list(Some(&d.lab.node_ns(n)), "tables").unwrap_or_default();
        assert!(
            !t.contains("kube-proxy"),
            "kube-proxy's table left on {n}: {t}"
        );
    }

    // Both proxies served: the basic ClusterIP reached both backends.
    let basic = probes[0].id();
    for (who, t) in [("podnet", &podnet_table), ("kube-proxy", &kube_table)] {
        assert!(
            t[&basic].starts_with("w1+w2"),
            "{who} did not serve the basic ClusterIP: {}",
            t[&basic]
        );
    }

    // The diff, against the list of intended differences.
    let mut unexplained = Vec::new();
    let mut explained = BTreeSet::new();
    for (id, pn) in &podnet_table {
        let kp = &kube_table[id];
        if pn == kp {
            continue;
        }
        match KNOWN.iter().find(|k| id == k.0) {
            Some(k) if k.1 == pn && k.2 == kp => {
                explained.insert(k.0);
            }
            _ => unexplained.push(format!("{id}\n    podnet:     {pn}\n    kube-proxy: {kp}")),
        }
    }
    let stale: Vec<&str> = KNOWN
        .iter()
        .filter(|k| !explained.contains(k.0))
        .map(|k| k.0)
        .collect();
    for (id, pn, kp, why) in KNOWN {
        eprintln!("known difference: {id}: podnet {pn}, kube-proxy {kp}: {why}");
    }
    if !unexplained.is_empty() || std::env::var_os("PODNET_KPDIFF_SHOW").is_some() {
        eprintln!("{evidence}");
    }
    assert!(
        unexplained.is_empty(),
        "{} unexplained differences (each node's tables during both turns printed above):\n{}",
        unexplained.len(),
        unexplained.join("\n")
    );
    assert!(
        stale.is_empty(),
        "listed differences that no longer occur: {stale:?}"
    );
}
