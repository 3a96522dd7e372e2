//! Kubernetes mode against the real thing, through the lab's control plane
//! (`podnet lab up --kube`: a real etcd, kube-apiserver and
//! kube-controller-manager v1.37 from `scripts/k8s-peers.sh`), with a
//! `podnet agent` per node and `podnet dns` that read only the API.
//!
//! What a flannel + kube-proxy + CoreDNS user relies on, checked with a
//! real kubectl:
//! - each node's subnet is the podCIDR kube-controller-manager allocated,
//!   written to its subnet.env;
//! - each agent publishes its `podnet.io/` annotations (flannel's
//!   kube-subnet-mgr conventions) and clears its node's
//!   `NetworkUnavailable` condition;
//! - a node reaches another node's podCIDR over the VXLAN device while that
//!   node is published, and stops when its annotations go;
//! - a Service gets its ClusterIP from the real apiserver, its rules on
//!   every node and its name in cluster DNS; deleted, it loses both.
//!
//! No sleep stands in for readiness: every wait polls a state with a
//! deadline, and nothing asserts how long anything took.

use podnet_testkit::{eventually, nft_list, try_sh_in};

#[path = "common/kubelab.rs"]
mod kubelab;
use kubelab::{podnet, KubeLab, WAIT};

#[test]
fn agents_and_dns_follow_the_real_apiserver_and_controller_manager() {
    let lab = KubeLab::up(2);
    let mut cidrs = Vec::new();
    for node in ["node1", "node2"] {
        let n = lab.json(&["get", "node", node]);
        let cidr = n["spec"]["podCIDR"]
            .as_str()
            .expect("a podCIDR")
            .to_string();
        let net: ipnet::Ipv4Net = cidr.parse().unwrap();
        assert!(
            "10.244.0.0/16"
                .parse::<ipnet::Ipv4Net>()
                .unwrap()
                .contains(&net),
            "{cidr}"
        );
        // The agent's subnet is the allocated podCIDR.
        let env = std::fs::read_to_string(format!(
            "/run/podnet-lab/{}/nodes/{node}/subnet.env",
            lab.name
        ))
        .unwrap();
        let gw = format!("{}/{}", net.hosts().next().unwrap(), net.prefix_len());
        assert!(
            env.contains(&format!("FLANNEL_SUBNET={gw}")),
            "{node}: {env}"
        );
        // Published as flannel's kube-subnet-mgr does, and up.
        let underlay = format!("192.168.200.{}", if node == "node1" { 11 } else { 12 });
        eventually(&format!("{node}'s annotations and condition"), WAIT, || {
            let n = lab.json(&["get", "node", node]);
            let ann = &n["metadata"]["annotations"];
            let published = ann["podnet.io/backend-type"] == "vxlan"
                && ann["podnet.io/public-ip"] == underlay.as_str()
                && ann["podnet.io/kube-subnet-manager"] == "true"
                && ann["podnet.io/backend-data"]
                    .as_str()
                    .is_some_and(|d| d.contains("VtepMAC"));
            let up = n["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter().any(|c| {
                    c["type"] == "NetworkUnavailable"
                        && c["status"] == "False"
                        && c["reason"] == "PodnetIsUp"
                })
            });
            published && up
        });
        cidrs.push(cidr);
    }
    assert_ne!(cidrs[0], cidrs[1]);

    // node1 reaches node2's podCIDR over the VTEP while node2 is published.
    let route = format!("ip route show {}", cidrs[1]);
    eventually("node1's route to node2's podCIDR", WAIT, || {
        try_sh_in(&lab.node_ns("node1"), &route)
            .1
            .contains("dev podnet.1")
    });
    // A node that stops publishing (its agent removed its annotations)
    // leaves the mesh.
    lab.ok(
        &[
            "annotate",
            "node",
            "node2",
            "podnet.io/backend-type-",
            "podnet.io/backend-data-",
            "podnet.io/public-ip-",
        ],
        None,
    );
    eventually("node1's route to node2 gone", WAIT, || {
        try_sh_in(&lab.node_ns("node1"), &route).1.trim().is_empty()
    });

    // An agent's --cleanup takes its node out of the mesh the same way.
    let o = podnet(&[
        "lab",
        "--name",
        &lab.name,
        "stop-agent",
        "node1",
        "--cleanup",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let n = lab.json(&["get", "node", "node1"]);
    assert!(
        n["metadata"]["annotations"]["podnet.io/public-ip"].is_null(),
        "{}",
        n["metadata"]["annotations"]
    );
    assert!(n["spec"]["podCIDR"].is_string(), "the podCIDR stays");
    let o = podnet(&["lab", "--name", &lab.name, "restart-agent", "node1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    eventually("node1 published again after its restart", WAIT, || {
        lab.json(&["get", "node", "node1"])["metadata"]["annotations"]["podnet.io/public-ip"]
            == "192.168.200.11"
    });

    // A Service through the real apiserver: ClusterIP, rules, name.
    lab.ok(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: default\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\nports: [{name: http, port: 8080, protocol: TCP}]\nendpoints: [{addresses: [\"10.244.99.5\"], conditions: {ready: true}}]\n",
        ),
    );
    let svc = lab.json(&["get", "service", "web"]);
    let cip = svc["spec"]["clusterIP"].as_str().unwrap().to_string();
    let range: ipnet::IpNet = "10.96.0.0/12".parse().unwrap();
    assert!(
        range.contains(&cip.parse::<std::net::IpAddr>().unwrap()),
        "ClusterIP {cip} from the apiserver's 10.96.0.0/12"
    );
    for node in ["node1", "node2"] {
        eventually(&format!("{node}'s rules for the Service"), WAIT, || {
            nft_list(Some(&lab.node_ns(node)), "table ip podnet")
                .is_some_and(|t| t.contains(&cip) && t.contains("10.244.99.5"))
        });
    }
    eventually("DNS answering web.default.svc.cluster.local", WAIT, || {
        lab.dig("web.default.svc.cluster.local") == cip
    });
    lab.ok(&["delete", "service", "web"], None);
    lab.ok(&["delete", "endpointslice", "web-1"], None);
    eventually("the rules and the name gone with the Service", WAIT, || {
        nft_list(Some(&lab.node_ns("node1")), "table ip podnet").is_some_and(|t| !t.contains(&cip))
            && lab.rcode("web.default.svc.cluster.local") == "NXDOMAIN"
    });

    in_cluster_dns(&lab);
}

/// `podnet dns` with the in-cluster configuration, as the manifests in
/// `deploy/` run it, in a pod: no kubeconfig, only the ServiceAccount's
/// token, CA and namespace under /var/run/secrets/kubernetes.io/serviceaccount
/// and `KUBERNETES_SERVICE_HOST=10.96.0.1`. It reaches the API through the
/// `kubernetes` Service, which the real apiserver publishes (its lease
/// reconciler) and podnet's proxy DNATs to the apiserver's endpoint. A
/// private mount namespace gives the pod those files (the DNS
/// ServiceAccount's token, which its RBAC from `deploy/` limits).
fn in_cluster_dns(lab: &KubeLab) {
    let o = podnet(&[
        "lab",
        "--name",
        &lab.name,
        "run",
        "kube-system/incluster",
        "--node",
        "node2",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(format!(
            "/run/podnet-lab/{}/pods/kube-system_incluster.json",
            lab.name
        ))
        .unwrap(),
    )
    .unwrap();
    let pod_ns = rec["netns"].as_str().unwrap().to_string();
    let slices = lab.json(&["get", "endpointslices", "-n", "default"]);
    assert!(
        slices["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["metadata"]["name"] == "kubernetes"
                && s["endpoints"][0]["addresses"][0] == "192.168.200.1"),
        "the apiserver publishes the kubernetes Service's endpoint: {slices:#}"
    );
    let kc = std::fs::read_to_string(format!("/run/podnet-lab/{}/dns-kubeconfig", lab.name))
        .expect("the lab's DNS kubeconfig");
    let field = |k: &str| {
        kc.lines()
            .find_map(|l| l.trim().strip_prefix(k))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("no {k} in the DNS kubeconfig"))
    };
    let files = tempfile::tempdir().unwrap();
    std::fs::write(files.path().join("token"), field("token:")).unwrap();
    std::fs::copy(field("certificate-authority:"), files.path().join("ca.crt")).unwrap();
    std::fs::write(files.path().join("namespace"), "kube-system").unwrap();
    let sa = "/run/secrets/kubernetes.io/serviceaccount";
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["netns", "exec", &pod_ns])
        .args(["unshare", "--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs podnet-test /run && mkdir -p {sa} && cp {}/* {sa}/ && \
             exec {} dns --listen 127.0.0.1:5353 --metrics-addr 127.0.0.1:9153",
            files.path().display(),
            env!("CARGO_BIN_EXE_podnet")
        ))
        .env("KUBERNETES_SERVICE_HOST", "10.96.0.1")
        .env("KUBERNETES_SERVICE_PORT", "443")
        .env("HOME", files.path())
        .env_remove("KUBECONFIG")
        .env_remove("KUBECONFIG_PODNET");
    let dns = podnet_testkit::Proc::spawn("in-cluster-dns", cmd, files.path());
    let ns = podnet_kernel::Netns::named(&pod_ns).unwrap();
    eventually("in-cluster podnet dns ready", WAIT, || {
        dns.check();
        podnet_testkit::http_get(Some(&ns), ([127, 0, 0, 1], 9153).into(), "/readyz")
            .is_some_and(|(code, _)| code == 200)
    });
    let (ok, out) = try_sh_in(
        &pod_ns,
        "dig +short +time=2 +tries=1 @127.0.0.1 -p 5353 kubernetes.default.svc.cluster.local A",
    );
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "10.96.0.1");
}
