//! `podnet lab up --kubelet`: each lab node runs a real containerd 2.x and
//! kubelet 1.37 (scripts/node-peers.sh, scripts/k8s-peers.sh), and podnet
//! is installed the way an operator installs it: `kubectl apply -f
//! deploy/podnet.yaml`, its image imported into every node's containerd
//! (scripts/dev-image.sh packs the binary under test). The lab starts
//! nothing of podnet; no kube-proxy and no CoreDNS run.
//!
//! Asserted, end to end:
//! - the kubelets start the agent DaemonSet and cluster DNS from deploy/,
//!   Running on every node, and the nodes turn Ready, each in a zone of
//!   its own;
//! - a pod the scheduler placed on one node reaches a pod on the other
//!   through a ClusterIP Service, by its cluster DNS name (upstream's
//!   agnhost image, built offline by scripts/e2e-images.sh);
//! - the apiserver reaches the kubelets (`kubectl exec`, `kubectl logs`)
//!   through the lab's egress proxy;
//! - the kubelets leave the machine's sysctls alone (they would set six of
//!   them), and `lab down` leaves no process, mount, cgroup or file, also
//!   with its pid records lost (as after a crash).
//!
//! Needs root, the binaries of scripts/k8s-peers.sh and
//! scripts/node-peers.sh (scripts/test-setup.sh builds them); without them
//! the test fails and says so.

#[path = "common/reallab.rs"]
mod reallab;

use std::path::{Path, PathBuf};

use reallab::{
    e2e_image, eventually, leftovers, podnet, podnet_image, text, RealLab, DEPLOY_IMAGE,
};

const APP: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: smoke}
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: smoke, labels: {app: server}}
spec:
  nodeSelector: {kubernetes.io/hostname: node2}
  containers:
  - name: netexec
    image: registry.k8s.io/e2e-test-images/agnhost:2.66.1
    args: [netexec, --http-port=8080]
    ports: [{containerPort: 8080}]
    readinessProbe:
      httpGet: {path: /hostname, port: 8080}
      periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata: {name: server, namespace: smoke}
spec:
  selector: {app: server}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: smoke}
spec:
  nodeSelector: {kubernetes.io/hostname: node1}
  containers:
  - name: client
    image: registry.k8s.io/e2e-test-images/agnhost:2.66.1
    args: [pause]
"#;

/// A pod on node1 reaches one on node2 through a ClusterIP Service, by
/// its cluster DNS name; `kubectl exec` and `logs` work.
fn across_nodes_by_name(lab: &RealLab) {
    // Across nodes, through a ClusterIP Service, by its DNS name.
    lab.ok(&["apply", "-f", "-"], Some(APP));
    lab.ok(
        &[
            "wait",
            "-n",
            "smoke",
            "--for=condition=Ready",
            "pod",
            "--all",
            "--timeout=120s",
        ],
        None,
    );
    let url = "http://server.smoke.svc.cluster.local/hostname";
    let answer = eventually("the Service answers by name", 30, || {
        let o = lab.kubectl(
            &[
                "exec",
                "-n",
                "smoke",
                "client",
                "--",
                "curl",
                "-sS",
                "--max-time",
                "3",
                url,
            ],
            None,
        );
        match o.status.success() {
            true => Ok(String::from_utf8_lossy(&o.stdout).trim().to_string()),
            false => Err(text(&o)),
        }
    });
    assert_eq!(answer, "server");
    // kubectl logs, like exec, goes apiserver -> egress proxy -> kubelet.
    let logs = lab.ok(&["logs", "-n", "smoke", "server"], None);
    assert!(logs.contains("Started HTTP server"), "{logs}");
}

#[test]
fn real_kubelets_run_podnet_from_deploy_and_lab_down_leaves_nothing() {
    let name = format!("rk{}", std::process::id() % 100_000);
    let before = podnet_lab::realnode::host::sysctls();

    // A missing image archive is refused before anything is made.
    let o = podnet(&[
        "lab",
        "--name",
        &name,
        "up",
        "--kubelet",
        "--image",
        "/nonexistent.tar",
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("--image /nonexistent.tar: no such file"),
        "{}",
        text(&o)
    );
    assert!(leftovers(&name).is_empty(), "{:?}", leftovers(&name));

    let tmp = tempfile::tempdir().unwrap();
    let dev = podnet_image(
        Path::new(env!("CARGO_BIN_EXE_podnet")),
        DEPLOY_IMAGE,
        tmp.path(),
    );
    let images = [e2e_image("pause"), e2e_image("agnhost")]
        .map(PathBuf::from)
        .into_iter()
        .chain([dev])
        .collect::<Vec<_>>();
    let (mut lab, host, port) = RealLab::up("rk", 2, &images);
    let name = lab.name.clone();
    // As an operator: deploy/podnet.yaml with the ConfigMap's API override.
    lab.install(&host, &port, DEPLOY_IMAGE);
    let pods = lab.json(&["get", "pods", "-n", "kube-system"]);
    let mut agents: Vec<String> = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["labels"]["app.kubernetes.io/component"] == "agent")
        .map(|p| {
            assert_eq!(p["status"]["phase"], "Running", "{p:#}");
            p["spec"]["nodeName"].as_str().unwrap().to_string()
        })
        .collect();
    agents.sort();
    assert_eq!(agents, ["node1", "node2"], "{pods:#}");
    // Each kubelet registered its node in a zone of its own.
    for n in ["node1", "node2"] {
        let node = lab.json(&["get", "node", n]);
        assert_eq!(
            node["metadata"]["labels"][podnet_lab::realnode::ZONE_LABEL],
            podnet_lab::realnode::zone_of(n).as_str(),
            "{n}"
        );
    }

    // The kubelets ran, and the machine's sysctls are as they were.
    assert_eq!(podnet_lab::realnode::host::sysctls(), before);

    across_nodes_by_name(&lab);

    // As after a crash of the lab's own process: the pid records are gone,
    // and `lab down` finds everything from what is on the machine.
    std::fs::remove_dir_all(lab.dir().join("pids")).unwrap();
    lab.down = true;
    let o = lab.lab(&["down"]);
    assert!(o.status.success(), "lab down: {}", text(&o));
    assert_eq!(leftovers(&name), Vec::<String>::new());
    assert_eq!(podnet_lab::realnode::host::sysctls(), before);
}
