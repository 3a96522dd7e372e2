//! `podnet trace` in the lab: real probes, and every hop asserted from the
//! JSON the command prints (the same hops as the text). Pod to pod on the
//! same node and across nodes per backend, pod to ClusterIP, to a Service
//! without endpoints, outside to NodePort, and a connection a
//! NetworkPolicy denies. Each trace must also agree with the pure
//! evaluators (no hop flagged) and leave no trace table behind.

use std::time::Duration;

use podnet_testkit::{eventually, nft_list, require_root};
use serde_json::Value;

#[path = "common/kubelab.rs"]
mod kubelab;
use kubelab::podnet;

const WAIT: Duration = Duration::from_secs(30);

/// A trace between two pods of one node: bridged, both ends judged there.
const SAME_NODE_HOPS: [&str; 7] = [
    "pod-route",
    "veth",
    "rule",
    "route",
    "policy",
    "masquerade",
    "deliver",
];

/// A standalone lab, removed when dropped.
struct Lab {
    name: String,
    nodes: usize,
}

/// Tracing in a lab someone else owns (by name and node count).
struct Tracer<'a> {
    name: &'a str,
    nodes: usize,
}

impl Lab {
    fn up(tag: &str, backend: &str, nodes: usize) -> Lab {
        Lab::up_with(tag, backend, nodes, &[])
    }

    fn up_with(tag: &str, backend: &str, nodes: usize, extra: &[&str]) -> Lab {
        require_root();
        let lab = Lab {
            name: format!("{tag}{}", std::process::id() % 100_000),
            nodes,
        };
        let n = nodes.to_string();
        let mut args = vec!["up", "--nodes", &n, "--backend", backend, "--resync", "1"];
        args.extend_from_slice(extra);
        lab.ok(&args);
        lab
    }

    /// What `lab run` recorded for pod default/NAME.
    fn record(&self, name: &str) -> Value {
        serde_json::from_slice(
            &std::fs::read(format!(
                "/run/podnet-lab/{}/pods/default_{name}.json",
                self.name
            ))
            .unwrap(),
        )
        .unwrap()
    }

    /// The IPv6 address of pod default/NAME (a dual-stack lab's).
    fn ip6(&self, name: &str) -> String {
        self.record(name)["ip6"]
            .as_str()
            .expect("an IPv6 address")
            .to_string()
    }

    fn ok(&self, args: &[&str]) -> String {
        let mut a = vec!["lab", "--name", &self.name];
        a.extend_from_slice(args);
        let o = podnet(&a);
        assert!(
            o.status.success(),
            "lab {args:?}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// Runs pod default/NAME on NODE (serving 80/tcp), with labels; its IP.
    fn pod(&self, name: &str, node: &str, labels: &str) -> String {
        let pod = format!("default/{name}");
        let mut args = vec!["run", &pod, "--node", node];
        if !labels.is_empty() {
            args.extend(["--labels", labels]);
        }
        self.ok(&args);
        self.record(name)["ip"].as_str().unwrap().to_string()
    }

    fn apply(&self, manifest: &str) {
        let store = format!("sqlite:///run/podnet-lab/{}/state.db", self.name);
        let path = std::env::temp_dir().join(format!("pn-trace-{}.yaml", self.name));
        std::fs::write(&path, manifest).unwrap();
        let o = podnet(&["--store", &store, "apply", "-f", path.to_str().unwrap()]);
        let _ = std::fs::remove_file(&path);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }

    fn spec(&self, svc: &str, field: &str) -> Value {
        let store = format!("sqlite:///run/podnet-lab/{}/state.db", self.name);
        eventually(&format!("{svc} spec.{field}"), WAIT, || {
            let o = podnet(&["--store", &store, "get", "svc", svc, "-o", "json"]);
            let v: Value = serde_json::from_slice(&o.stdout).ok()?;
            let f = v["spec"][field].clone();
            (!f.is_null()).then_some(f)
        })
    }

    fn tracer(&self) -> Tracer<'_> {
        Tracer {
            name: &self.name,
            nodes: self.nodes,
        }
    }

    fn trace_until(&self, src: &str, dst: &str, want: &str) -> Value {
        self.tracer().trace_until(src, dst, want)
    }
}

impl Tracer<'_> {
    /// `podnet trace SRC DST -o json`, parsed; checks what every trace
    /// must hold: the kernel and the pure evaluators agree, nothing was
    /// lost, and no trace table is left on any node.
    fn trace(&self, src: &str, dst: &str) -> Value {
        let t = self.trace_only(src, dst);
        self.no_table_left();
        t
    }

    /// No trace table is left on any node.
    fn no_table_left(&self) {
        for n in 1..=self.nodes {
            let ns = format!("pn-{}-node{n}", self.name);
            assert_eq!(
                nft_list(Some(&ns), "table inet podnet-trace"),
                None,
                "the trace table is left on node{n}"
            );
        }
    }

    /// [`Tracer::trace`] without the check for tables (which traces
    /// running at the same time hold).
    fn trace_only(&self, src: &str, dst: &str) -> Value {
        let o = podnet(&["trace", "--lab", self.name, src, dst, "-o", "json"]);
        assert!(
            o.status.success(),
            "trace {src} {dst}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let t: Value = serde_json::from_slice(&o.stdout).expect("trace JSON");
        for h in t["hops"].as_array().expect("hops") {
            assert!(h.get("disagreement").is_none(), "{src} -> {dst}: {h}");
        }
        assert_eq!(t["lost_events"], 0, "{t}");
        t
    }

    /// Traces until the outcome is `want` (the objects reach the agents
    /// on their own time), then returns that trace.
    fn trace_until(&self, src: &str, dst: &str, want: &str) -> Value {
        let mut last = Value::Null;
        let got = podnet_testkit::try_eventually(WAIT, || {
            last = self.trace(src, dst);
            (last["outcome"]["outcome"] == want).then(|| last.clone())
        });
        got.unwrap_or_else(|_| panic!("{src} -> {dst} never {want}; last trace: {last:#}"))
    }
}

/// `podnet trace SRC DST -o json` as on a real node: inside the node's
/// namespace, with no --lab, the cluster read as `cluster` says (the store
/// or a kubeconfig); `Err` carries stderr. Checks what every trace must
/// hold, and that no trace table is left on the node.
fn on_node(lab: &str, node: &str, cluster: &[&str], src: &str, dst: &str) -> Result<Value, String> {
    let ns = format!("pn-{lab}-{node}");
    let o = std::process::Command::new("ip")
        .args(["netns", "exec", &ns, env!("CARGO_BIN_EXE_podnet")])
        .args(["trace", src, dst, "--node", node, "-o", "json"])
        .args(cluster)
        .output()
        .unwrap();
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    let t: Value = serde_json::from_slice(&o.stdout).expect("trace JSON");
    for h in t["hops"].as_array().expect("hops") {
        assert!(h.get("disagreement").is_none(), "{src} -> {dst}: {h}");
    }
    assert_eq!(t["lost_events"], 0, "{t}");
    assert_eq!(
        nft_list(Some(&ns), "table inet podnet-trace"),
        None,
        "the trace table is left on {node}"
    );
    Ok(t)
}

/// What a trace from node1 to a pod on node2 shows on a real node: node1's
/// hops, the tunnel to node2, delivery, and node2 named as not observed.
fn check_seen_from_node1(t: &Value, backend: &str, answered_by: &str) {
    assert_eq!(t["outcome"]["outcome"], "connected", "{t:#}");
    assert_eq!(one(t, "veth")["at"], "node1");
    assert!(!rules_in(t, "node1", "podnet").is_empty(), "{t:#}");
    assert!(rules_in(t, "node2", "podnet").is_empty(), "{t:#}");
    let route = one(t, "route");
    assert_eq!(route["data"]["backend"], backend, "{route}");
    assert_eq!(route["data"]["remote_node"], "node2", "{route}");
    assert_eq!(t["unobserved"], serde_json::json!(["node2"]));
    assert_eq!(one(t, "deliver")["data"]["answered_by"], answered_by);
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = podnet(&["lab", "--name", &self.name, "down"]);
    }
}

/// The hops of `kind`, in order.
fn hops<'a>(t: &'a Value, kind: &str) -> Vec<&'a Value> {
    t["hops"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["kind"] == kind)
        .collect()
}

fn one<'a>(t: &'a Value, kind: &str) -> &'a Value {
    let h = hops(t, kind);
    assert_eq!(h.len(), 1, "one {kind} hop in {t:#}");
    h[0]
}

fn kinds(t: &Value) -> Vec<String> {
    let mut k: Vec<String> = t["hops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["kind"].as_str().unwrap().to_string())
        .collect();
    k.dedup();
    k
}

/// The rule hops at `node` from table `table`.
fn rules_in<'a>(t: &'a Value, node: &str, table: &str) -> Vec<&'a Value> {
    hops(t, "rule")
        .into_iter()
        .filter(|h| h["at"] == node && h["data"]["table"] == table)
        .collect()
}

const SERVICES: &str = "apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 80, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: default}
spec:
  selector: {app: nothing}
  ports: [{port: 80, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: webnp, namespace: default}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 80, protocol: TCP}]
";

const DENY: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-locked, namespace: default}
spec:
  podSelector: {matchLabels: {app: locked}}
  policyTypes: [Ingress]
";

#[test]
fn traces_every_path_in_a_vxlan_lab() {
    let lab = Lab::up("trv", "vxlan", 2);
    let a = lab.pod("a", "node1", "");
    let c = lab.pod("c", "node1", "");
    let b = lab.pod("b", "node2", "");
    let web = lab.pod("web1", "node2", "app=web");
    let locked = lab.pod("locked", "node2", "app=locked");
    lab.apply(SERVICES);
    lab.apply(DENY);

    // Same node: bridged, both ends judged on node1.
    let t = lab.trace_until("default/a", "default/c:80", "connected");
    assert_eq!(kinds(&t), SAME_NODE_HOPS, "{t:#}");
    let r = one(&t, "pod-route");
    assert_eq!(
        (r["at"].as_str(), r["data"]["dev"].as_str()),
        (Some("default/a"), Some("eth0"))
    );
    assert_eq!(one(&t, "veth")["data"]["bridge"], "podnet0");
    let route = one(&t, "route");
    assert_eq!(route["data"]["backend"], "bridge", "{route}");
    assert_eq!(route["data"]["dev"], "podnet0");
    let p = one(&t, "policy");
    assert_eq!(
        (p["at"].as_str(), p["data"]["judges"].as_str()),
        (Some("node1"), Some("egress and ingress"))
    );
    assert_eq!(p["data"]["allowed"], "true");
    assert_eq!(one(&t, "masquerade")["data"]["masquerade"], "false");
    let d = one(&t, "deliver");
    assert_eq!(d["data"]["answered_by"], "default/c");
    assert_eq!(d["at"], "default/c");
    assert!(!rules_in(&t, "node1", "podnet-policy").is_empty(), "{t:#}");
    assert!(t["src"].as_str().unwrap().contains(&a));
    assert!(t["dst"].as_str().unwrap().contains(&c));

    // Across nodes: the VXLAN VTEP and node2 behind it, egress judged on
    // node1 and ingress on node2, each node's rules in turn.
    let t = lab.trace_until("default/a", "default/b:80", "connected");
    let route = one(&t, "route");
    assert_eq!(route["at"], "node1");
    assert_eq!(route["data"]["backend"], "vxlan", "{route}");
    assert_eq!(route["data"]["vtep"], "192.168.200.12");
    assert_eq!(route["data"]["remote_node"], "node2");
    assert_eq!(route["data"]["dev"], "podnet.1");
    let pols = hops(&t, "policy");
    let judged: Vec<(&str, &str)> = pols
        .iter()
        .map(|p| {
            (
                p["at"].as_str().unwrap(),
                p["data"]["judges"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(judged, [("node1", "egress"), ("node2", "ingress")]);
    assert!(!rules_in(&t, "node2", "podnet").is_empty(), "{t:#}");
    assert_eq!(one(&t, "deliver")["data"]["answered_by"], "default/b");
    assert!(t["dst"].as_str().unwrap().contains(&b));

    // A ClusterIP: the DNAT's Service port and endpoint, from conntrack,
    // among what the proxy's tracer expects; then on to node2.
    let cip = lab.spec("web", "clusterIP").as_str().unwrap().to_string();
    let t = lab.trace_until("default/a", "default/web:80", "connected");
    let s = one(&t, "service");
    assert_eq!(s["at"], "node1");
    assert_eq!(s["data"]["service"], "default/web:http");
    assert_eq!(s["data"]["frontend"], format!("{cip}:80"));
    assert_eq!(s["data"]["endpoint"], format!("{web}:80"));
    assert_eq!(s["data"]["candidates"], format!("{web}:80"));
    assert_eq!(s["data"]["why"], "the only endpoint");
    let dnat: Vec<&Value> = rules_in(&t, "node1", "podnet")
        .into_iter()
        .filter(|h| h["summary"].as_str().unwrap().contains("dnat"))
        .collect();
    assert_eq!(dnat.len(), 1, "the DNAT rule, by its text: {t:#}");
    assert_eq!(one(&t, "route")["data"]["remote_node"], "node2");
    assert_eq!(one(&t, "deliver")["data"]["answered_by"], "default/web1");
    let order = kinds(&t);
    let at = |k: &str| order.iter().position(|x| x == k).unwrap();
    assert!(
        at("rule") < at("service") && at("service") < at("route") && at("route") < at("deliver")
    );

    // No endpoints: the proxy's reject, named as such.
    let t = lab.trace_until("default/a", "default/empty:80", "refused");
    let drop = one(&t, "drop");
    assert_eq!(drop["at"], "node1");
    assert_eq!(
        drop["data"]["reason"],
        "rejected: the Service has no endpoints"
    );
    let reject: Vec<&Value> = rules_in(&t, "node1", "podnet")
        .into_iter()
        .filter(|h| h["data"]["chain"] == "reject-chain")
        .collect();
    assert_eq!(reject.len(), 1, "{t:#}");
    assert_eq!(reject[0]["data"]["verdict"], "drop");
    assert!(
        hops(&t, "service").is_empty(),
        "no DNAT for no endpoints: {t:#}"
    );
    assert!(hops(&t, "deliver").is_empty());

    // From outside to a NodePort on node1: DNAT to node2's endpoint,
    // masqueraded (the Cluster policy), delivered.
    let np = lab.spec("webnp", "ports")[0]["nodePort"].as_u64().unwrap();
    let t = lab.trace_until("outside", &format!("node1:{np}"), "connected");
    assert!(
        hops(&t, "veth").is_empty(),
        "an outside host has no veth: {t:#}"
    );
    assert_eq!(one(&t, "pod-route")["at"], "outside (the lab's gateway)");
    let s = one(&t, "service");
    assert_eq!(s["data"]["service"], "default/webnp:http (NodePort)");
    assert_eq!(s["data"]["frontend"], format!("192.168.200.11:{np}"));
    assert_eq!(s["data"]["endpoint"], format!("{web}:80"));
    let m = one(&t, "masquerade");
    assert_eq!(m["data"]["masquerade"], "true", "{m}");
    assert_eq!(one(&t, "route")["data"]["remote_node"], "node2");
    assert_eq!(one(&t, "deliver")["data"]["answered_by"], "default/web1");

    // Denied by a NetworkPolicy on node2: egress allowed on node1,
    // ingress dropped on node2 in the deny chain, and the evaluator says
    // the same (a disagreement would fail `trace`).
    let t = lab.trace_until("default/a", "default/locked:80", "timed-out");
    let pols = hops(&t, "policy");
    assert_eq!(pols.len(), 2, "{t:#}");
    assert_eq!(pols[0]["data"]["allowed"], "true");
    assert_eq!(pols[1]["at"], "node2");
    assert_eq!(pols[1]["data"]["allowed"], "false");
    assert_eq!(pols[1]["data"]["denied_in"], "deny-ingress");
    assert!(pols[1]["data"]["evaluator"]
        .as_str()
        .unwrap()
        .contains("isolated by default/deny-locked"));
    let drop = one(&t, "drop");
    assert_eq!(drop["at"], "node2");
    assert_eq!(
        drop["data"]["reason"],
        "denied by NetworkPolicy (table podnet-policy, chain deny-ingress)"
    );
    assert!(t["dst"].as_str().unwrap().contains(&locked));

    // To an address outside the cluster (the lab's gateway, which
    // answers a closed port with a reset): out of node1's underlay,
    // masqueraded to node1's address, refused by the destination itself.
    let t = lab.tracer().trace("default/a", "192.168.200.1:80");
    assert_eq!(t["outcome"]["outcome"], "refused", "{t:#}");
    let route = one(&t, "route");
    assert_eq!(route["data"]["dev"], "eth0", "{route}");
    assert!(route["data"].get("remote_node").is_none(), "{route}");
    // No ingress in the cluster to judge: only the pod's egress.
    assert_eq!(one(&t, "policy")["data"]["judges"], "egress");
    let m = one(&t, "masquerade");
    assert_eq!(
        (m["data"]["masquerade"].as_str(), m["data"]["to"].as_str()),
        (Some("true"), Some("192.168.200.11")),
        "{m}"
    );
    assert_eq!(
        one(&t, "drop")["data"]["reason"],
        "refused by the destination (no server on the port)"
    );

    // On a real node: the same command inside node1, no --lab, the
    // cluster read from the store and node1's subnet.env.
    let store = format!("sqlite:///run/podnet-lab/{}/state.db", lab.name);
    let subnet = format!("/run/podnet-lab/{}/nodes/node1/subnet.env", lab.name);
    let cluster = ["--store", &store, "--subnet-file", &subnet];
    let cluster = &cluster[..];
    let t = on_node(&lab.name, "node1", cluster, "default/a", "default/b:80").unwrap();
    check_seen_from_node1(&t, "vxlan", "default/b");
    assert!(t["src"].as_str().unwrap().contains(&a));
    // A pod of another node is traced there.
    let err = on_node(&lab.name, "node1", cluster, "default/b", "default/a:80").unwrap_err();
    assert!(
        err.contains("SRC default/b runs on node node2, not on this node (node1)"),
        "{err}"
    );
    let err = on_node(&lab.name, "node1", cluster, "outside", "default/a:80").unwrap_err();
    assert!(
        err.contains("on a real node SRC is a pod of this node"),
        "{err}"
    );

    // A drop no rule made: node2's VXLAN device is gone (its agent is
    // stopped, so nothing repairs it). The packet reaches node2 and its
    // kernel frees it for want of a socket on the VXLAN port: the trace
    // says so from the skb:kfree_skb tracepoint. (The drop is seen when
    // the sender's thread carries the packet to its end, as it does unless
    // the kernel defers to ksoftirqd: hence a few tries.)
    lab.ok(&["stop-agent", "node2"]);
    podnet_testkit::sh_in(&format!("pn-{}-node2", lab.name), "ip link del podnet.1");
    let t = eventually("the kernel's drop reason", WAIT, || {
        let t = lab.tracer().trace("default/a", "default/b:80");
        let d = hops(&t, "drop").first().cloned().cloned()?;
        (t["outcome"]["outcome"] == "timed-out" && d["data"]["kernel_reason"] == "NO_SOCKET")
            .then_some(t)
    });
    let d = one(&t, "drop");
    assert_eq!(
        d["data"]["reason"], "dropped by the kernel: NO_SOCKET in __udp4_lib_rcv",
        "{t:#}"
    );
    assert_eq!(one(&t, "route")["data"]["remote_node"], "node2");
}

/// Across nodes in the other backends: host-gw routes to the other node's
/// address; the udp backend hands the packet to its TUN device.
/// Dual-stack: a trace to an IPv6 address leaves from the pod's IPv6
/// address and follows the `ip6` tables on both nodes, across the VTEP;
/// through an IPv6 ClusterIP it is translated to the endpoint's IPv6
/// address.
#[test]
fn traces_ipv6_paths_in_a_dual_stack_lab() {
    let lab = Lab::up_with("trd", "vxlan", 2, &["--dual-stack"]);
    lab.pod("a", "node1", "");
    lab.pod("b", "node2", "app=web");
    let (a6, b6) = (lab.ip6("a"), lab.ip6("b"));
    let t = lab.trace_until("default/a", &format!("[{b6}]:80"), "connected");
    assert!(t["src"].as_str().unwrap().contains(&a6), "{}", t["src"]);
    let route = one(&t, "route");
    assert_eq!(route["at"], "node1");
    assert_eq!(route["data"]["backend"], "vxlan", "{route}");
    assert_eq!(route["data"]["remote_node"], "node2", "{route}");
    for node in ["node1", "node2"] {
        let v6_rules = hops(&t, "rule")
            .into_iter()
            .filter(|h| h["at"] == node && h["summary"].as_str().unwrap().starts_with("ip6 "))
            .count();
        assert!(v6_rules > 0, "no ip6 rule hop on {node}: {t:#}");
    }
    assert_eq!(one(&t, "deliver")["data"]["answered_by"], "default/b");
    lab.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web6, namespace: default}\n\
         spec: {selector: {app: web}, ipFamilyPolicy: PreferDualStack, ports: [{port: 80}]}\n",
    );
    let cip6 = eventually("web6's IPv6 ClusterIP", WAIT, || {
        let store = format!("sqlite:///run/podnet-lab/{}/state.db", lab.name);
        let o = podnet(&["--store", &store, "get", "svc", "web6", "-o", "json"]);
        let v: Value = serde_json::from_slice(&o.stdout).ok()?;
        v["spec"]["clusterIPs"][1].as_str().map(String::from)
    });
    // One address per family, the second the IPv6 one.
    let ips = lab.spec("web6", "clusterIPs");
    assert_eq!(ips.as_array().map(Vec::len), Some(2), "{ips}");
    assert!(cip6.starts_with("fd00:10:96::"), "{cip6}");
    let t = lab.trace_until("default/a", &format!("[{cip6}]:80"), "connected");
    let text = t.to_string();
    assert!(text.contains(&b6), "the endpoint's IPv6 address: {t:#}");
    assert_eq!(one(&t, "deliver")["data"]["answered_by"], "default/b");
}

#[test]
fn traces_across_nodes_in_host_gw_and_udp_labs() {
    for (tag, backend) in [("trh", "host-gw"), ("tru", "udp")] {
        let lab = Lab::up(tag, backend, 2);
        lab.pod("a", "node1", "");
        lab.pod("b", "node2", "");
        let t = lab.trace_until("default/a", "default/b:80", "connected");
        let route = one(&t, "route");
        assert_eq!(route["at"], "node1");
        match backend {
            "host-gw" => {
                assert_eq!(route["data"]["backend"], "host-gw", "{route}");
                assert_eq!(route["data"]["next_hop"], "192.168.200.12");
                assert_eq!(route["data"]["remote_node"], "node2");
                // node2's own rules are part of the path.
                assert!(!rules_in(&t, "node2", "podnet").is_empty(), "{t:#}");
            }
            _ => {
                assert_eq!(route["data"]["backend"], "udp", "{route}");
                // The node the agent encapsulates to, from its subnet.
                assert_eq!(route["data"]["remote_node"], "node2");
                assert!(!rules_in(&t, "node2", "podnet").is_empty(), "{t:#}");
            }
        }
        assert_eq!(one(&t, "deliver")["data"]["answered_by"], "default/b");
    }
}

#[test]
fn a_trace_names_what_is_wrong_with_its_arguments() {
    let lab = Lab::up("trx", "vxlan", 1);
    lab.pod("a", "node1", "");
    for (src, dst, want) in [
        ("default/nope", "default/a:80", "not a pod of lab"),
        (
            "default/a",
            "default/nope:80",
            "no pod, Service or node of that name",
        ),
        ("default/a", "default/a", "want DST:PORT"),
        ("default/a", "default/a:80/icmp", "not a port number"),
    ] {
        let o = podnet(&["trace", "--lab", &lab.name, src, dst]);
        assert!(!o.status.success(), "{src} {dst}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{src} {dst}: {err}");
    }
    // Without --lab, as a newcomer types it right after `lab up`: the
    // trace looks at this machine as a node, the pod is not on it, and the
    // answer names the lab that is up.
    let store = format!("sqlite:///run/podnet-lab/{}/state.db", lab.name);
    let o = podnet(&["trace", "default/a", "default/a:80", "--store", &store]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("runs on node node1, not on this node"),
        "{err}"
    );
    assert!(
        err.contains("up on this machine: did you mean --lab"),
        "{err}"
    );
    assert!(err.contains(&format!("--lab {}", lab.name)), "{err}");
}

/// A killed trace's table does not stop the next trace, and traces run at
/// once on one node take turns: each gets its own probe's hops.
#[test]
fn traces_take_turns_and_recover_a_killed_ones_table() {
    let lab = Lab::up("trk", "vxlan", 1);
    lab.pod("a", "node1", "");
    lab.ok(&[
        "run",
        "default/c",
        "--node",
        "node1",
        "--ports",
        "80/tcp,5353/udp",
    ]);
    let ns = format!("pn-{}-node1", lab.name);
    // What `kill -9` of a trace mid-probe leaves: its table, marking
    // another source port.
    podnet_testkit::nft(
        Some(&ns),
        "'add table inet podnet-trace; add chain inet podnet-trace pre { type filter hook prerouting priority -350; }; add rule inet podnet-trace pre tcp sport 20001 meta nftrace set 1'",
    )
    .unwrap();
    let t = lab.trace_until("default/a", "default/c:80", "connected");
    assert_eq!(one(&t, "deliver")["data"]["answered_by"], "default/c");
    let traces: Vec<Value> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..3)
            .map(|_| s.spawn(|| lab.tracer().trace_only("default/a", "default/c:80")))
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    lab.tracer().no_table_left();
    let mut ports = Vec::new();
    for t in &traces {
        assert_eq!(t["outcome"]["outcome"], "connected", "{t:#}");
        assert_eq!(kinds(t), SAME_NODE_HOPS, "{t:#}");
        assert_eq!(one(t, "deliver")["data"]["answered_by"], "default/c");
        ports.push(t["sport"].as_u64().unwrap());
    }
    ports.sort();
    ports.dedup();
    assert_eq!(ports.len(), 3, "each trace probes from its own port");

    // UDP: the datagram's path and the server's answer.
    let t = lab.trace_until("default/a", "default/c:5353/udp", "connected");
    assert_eq!(t["proto"], "udp");
    assert_eq!(kinds(&t), SAME_NODE_HOPS, "{t:#}");
    assert_eq!(one(&t, "deliver")["data"]["answered_by"], "default/c");
    assert_eq!(one(&t, "policy")["data"]["allowed"], "true");
    // A UDP port nothing listens on: the pod's kernel answers port
    // unreachable, and the trace says so.
    let t = lab.tracer().trace("default/a", "default/c:5354/udp");
    assert_eq!(t["outcome"]["outcome"], "refused", "{t:#}");
    assert!(hops(&t, "deliver").is_empty(), "{t:#}");
    assert_eq!(
        one(&t, "drop")["data"]["reason"],
        "refused by the destination (no server on the port)"
    );
}

/// `podnet flows --lab`: every node's flow log, each address named. A
/// denied connection shows on the denying node with its policy; a
/// Service connection shows its endpoint; the metrics count per verdict.
#[test]
fn the_flow_log_shows_a_denied_connection_with_its_policy() {
    let lab = Lab::up("trf", "vxlan", 2);
    lab.pod("a", "node1", "");
    let web = lab.pod("web1", "node2", "app=web");
    let locked = lab.pod("locked", "node2", "app=locked");
    lab.apply(SERVICES);
    lab.apply(DENY);
    let cip = lab.spec("web", "clusterIP").as_str().unwrap().to_string();
    let flows = |args: &[&str]| -> Vec<Value> {
        let mut a = vec!["flows", "--lab", lab.name.as_str(), "-o", "json"];
        a.extend_from_slice(args);
        let o = podnet(&a);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON flow per line"))
            .collect()
    };
    // The denial: traced until the policy is in force, then in the log.
    lab.trace_until("default/a", "default/locked:80", "timed-out");
    let dropped = eventually("the denial in the flow log", WAIT, || {
        let d = flows(&["--verdict", "dropped", "--pod", "default/locked"]);
        (!d.is_empty()).then_some(d)
    });
    let d = &dropped[0];
    assert_eq!(d["node"], "node2", "{d}");
    assert_eq!(d["src_name"], "default/a");
    assert_eq!(d["dst_name"], "default/locked");
    assert_eq!(d["dst"], locked);
    assert_eq!(d["dport"], 80);
    assert_eq!(d["policies"], serde_json::json!(["default/deny-locked"]));
    assert!(
        d["reason"].as_str().unwrap().starts_with("ingress denied"),
        "{d}"
    );
    assert!(dropped.iter().all(|f| f["verdict"] == "dropped"));

    // A Service connection: forwarded on node1 with the endpoint, and on
    // node2 to the endpoint itself.
    lab.trace_until("default/a", "default/web:80", "connected");
    let fwd = flows(&["--verdict", "forwarded", "--pod", "default/web1"]);
    let via_svc = fwd
        .iter()
        .find(|f| f["node"] == "node1" && f["dst"] == cip.as_str())
        .unwrap_or_else(|| panic!("no Service flow on node1: {fwd:#?}"));
    assert_eq!(via_svc["dst_name"], "Service default/web");
    assert_eq!(via_svc["endpoint"], format!("{web}:80"));
    assert_eq!(via_svc["endpoint_name"], "default/web1");
    assert_eq!(via_svc["masqueraded"], false);
    assert!(fwd
        .iter()
        .any(|f| f["node"] == "node2" && f["dst_name"] == "default/web1"));

    // The metrics count what the log holds, per verdict.
    let ns = podnet_kernel::Netns::named(&format!("pn-{}-node2", lab.name)).unwrap();
    let (code, m) =
        podnet_testkit::http_get(Some(&ns), ([127, 0, 0, 1], 10249).into(), "/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(
        m.lines()
            .any(|l| l.starts_with("podnet_flows_total{verdict=\"dropped\"}")),
        "{m}"
    );
    // A bad query is refused by name.
    let (code, body) =
        podnet_testkit::http_get(Some(&ns), ([127, 0, 0, 1], 10249).into(), "/flows?after=x")
            .unwrap();
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("after"), "{body}");
}

/// Kubernetes mode: the names and Services come from the real apiserver;
/// the same hops, from a pod to a ClusterIP across nodes.
#[test]
fn traces_a_cluster_ip_in_a_kube_lab() {
    let lab = kubelab::KubeLab::up(2);
    let run = |pod: &str, node: &str, labels: &str| {
        let mut a = vec![
            "lab",
            "--name",
            lab.name.as_str(),
            "run",
            pod,
            "--node",
            node,
        ];
        if !labels.is_empty() {
            a.extend(["--labels", labels]);
        }
        let o = podnet(&a);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    run("default/a", "node1", "");
    run("default/web1", "node2", "app=web");
    lab.ok(&["apply", "-f", "-"], Some(SERVICES));
    let t = Tracer {
        name: &lab.name,
        nodes: 2,
    }
    .trace_until("default/a", "default/web:80", "connected");
    let s = one(&t, "service");
    assert_eq!(s["data"]["service"], "default/web:http");
    assert_eq!(s["data"]["why"], "the only endpoint");
    let route = one(&t, "route");
    assert_eq!(route["data"]["backend"], "vxlan");
    assert_eq!(route["data"]["remote_node"], "node2");
    assert_eq!(one(&t, "deliver")["data"]["answered_by"], "default/web1");

    // On a real node of the cluster: inside node1, no --lab, reading the
    // Kubernetes API with the node agent's own kubeconfig (its RBAC).
    let dir = format!("/run/podnet-lab/{}", lab.name);
    let kubeconfig = format!("{dir}/nodes/node1/kubeconfig");
    let net_conf = format!("{dir}/net-conf.json");
    let cluster = ["--kubeconfig", &kubeconfig, "--net-conf", &net_conf];
    let t = on_node(&lab.name, "node1", &cluster, "default/a", "default/web:80").unwrap();
    check_seen_from_node1(&t, "vxlan", "default/web1");
    assert_eq!(one(&t, "service")["data"]["service"], "default/web:http");
}
