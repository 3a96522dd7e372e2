//! `podnet lab up --kubelet`: each lab node runs a real containerd 2.x and
//! kubelet 1.37 (scripts/node-peers.sh, scripts/k8s-peers.sh), and podnet
//! is installed the way an operator installs it: `kubectl apply -f
//! deploy/podnet.yaml`, its image imported into every node's containerd
//! (scripts/dev-image.sh packs the binary under test). The lab starts
//! nothing of podnet; no kube-proxy and no CoreDNS run.
//!
//! Asserted, end to end:
//! - the kubelets start the agent DaemonSet and cluster DNS from deploy/,
//!   Running on every node, and the nodes turn Ready;
//! - a pod the scheduler placed on one node reaches a pod on the other
//!   through a ClusterIP Service, by its cluster DNS name (upstream's
//!   agnhost image, built offline by scripts/e2e-images.sh);
//! - the apiserver reaches the kubelets (`kubectl exec`, `kubectl logs`)
//!   through the lab's egress proxy;
//! - the kubelets leave the machine's sysctls alone (they would set six of
//!   them), and `lab down` leaves no process, mount, cgroup or file.
//!
//! Needs root, the binaries of scripts/k8s-peers.sh and
//! scripts/node-peers.sh (scripts/test-setup.sh builds them); without them
//! the test fails and says so.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn podnet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_podnet"))
        .args(args)
        .output()
        .expect("run podnet")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs a repo script, returning its stdout; fails the test with its
/// output otherwise.
fn script(name: &str, args: &[&str]) -> String {
    let o = Command::new("bash")
        .arg(repo().join("scripts").join(name))
        .args(args)
        .env("GOPROXY", "off")
        .output()
        .expect("bash");
    assert!(o.status.success(), "scripts/{name} {args:?}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A `--kubelet` lab, taken down when dropped (also on panic).
struct RealLab {
    name: String,
    kubectl: PathBuf,
    down: bool,
}

impl RealLab {
    fn lab(&self, args: &[&str]) -> Output {
        let mut a = vec!["lab", "--name", &self.name];
        a.extend_from_slice(args);
        podnet(&a)
    }

    fn dir(&self) -> PathBuf {
        Path::new(podnet_lab::RUN_DIR).join(&self.name)
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut c = Command::new(&self.kubectl);
        c.arg("--kubeconfig")
            .arg(self.dir().join("kubeconfig"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("run kubectl");
        {
            use std::io::Write;
            let mut i = child.stdin.take().unwrap();
            i.write_all(stdin.unwrap_or_default().as_bytes()).unwrap();
        }
        child.wait_with_output().unwrap()
    }

    fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let o = self.kubectl(args, stdin);
        assert!(o.status.success(), "kubectl {args:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&a, None)).unwrap()
    }
}

impl Drop for RealLab {
    fn drop(&mut self) {
        if !self.down {
            let _ = self.lab(&["down"]);
        }
    }
}

/// What of lab `name` is left on the machine: processes naming its
/// directories, mounts under them, its cgroups, its data.
fn leftovers(name: &str) -> Vec<String> {
    let run = format!("{}/{name}/", podnet_lab::RUN_DIR);
    let data = format!("{}/{name}", podnet_lab::realnode::DATA_DIR);
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if e.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(&run) || c.contains(&data) {
                out.push(format!("process: {c}"));
            }
        }
    }
    for l in std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
    {
        if l.contains(&run) || l.contains(&data) {
            out.push(format!("mount: {l}"));
        }
    }
    let cg = format!("pn-{name}-");
    for h in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        for e in std::fs::read_dir(h.path()).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(&cg) {
                out.push(format!("cgroup: {}", e.path().display()));
            }
        }
    }
    for p in [&data, run.trim_end_matches('/')] {
        if Path::new(p).exists() {
            out.push(format!("file: {p}"));
        }
    }
    out
}

fn eventually<T>(what: &str, secs: u64, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => panic!("timed out: {what}; last: {last}"),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

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

#[test]
fn real_kubelets_run_podnet_from_deploy_and_lab_down_leaves_nothing() {
    let peers = podnet_lab::kube::Peers::find()
        .unwrap_or_else(|e| panic!("{e}\n(the binaries come from scripts/k8s-peers.sh)"));
    let name = format!("rk{}", std::process::id() % 100_000);
    let before = podnet_lab::realnode::host::sysctls();

    // A missing image archive is refused before anything is made.
    let o = podnet(&[
        "lab", "--name", &name, "up", "--kubelet", "--image", "/nonexistent.tar",
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("--image /nonexistent.tar: no such file"),
        "{}",
        text(&o)
    );
    assert!(leftovers(&name).is_empty(), "{:?}", leftovers(&name));

    let images = script("e2e-images.sh", &[]);
    let archive = |needle: &str| {
        images
            .lines()
            .filter_map(|l| l.strip_prefix("archive="))
            .find(|a| a.contains(needle))
            .unwrap_or_else(|| panic!("no {needle} archive in: {images}"))
            .to_string()
    };
    let (pause, agnhost) = (archive("pause"), archive("agnhost"));
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("podnet.tar");
    script(
        "dev-image.sh",
        &[env!("CARGO_BIN_EXE_podnet"), dev.to_str().unwrap()],
    );

    let mut lab = RealLab {
        name: name.clone(),
        kubectl: peers.kubectl,
        down: false,
    };
    let o = lab.lab(&[
        "up",
        "--nodes",
        "2",
        "--kubelet",
        "--image",
        &pause,
        "--image",
        &agnhost,
        "--image",
        dev.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "lab up --kubelet: {}", text(&o));
    let up = text(&o);
    let api = up
        .split("kubernetesServiceHost ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("lab up names no API address: {up}"));
    let (host, port) = api.rsplit_once(':').unwrap();

    // As an operator: deploy/podnet.yaml with the ConfigMap's API override.
    let manifest = std::fs::read_to_string(repo().join("deploy/podnet.yaml"))
        .unwrap()
        .replace(
            "  # kubernetesServiceHost: \"192.0.2.10\"",
            &format!("  kubernetesServiceHost: \"{host}\""),
        )
        .replace(
            "  # kubernetesServicePort: \"6443\"",
            &format!("  kubernetesServicePort: \"{port}\""),
        );
    assert!(manifest.contains(&format!("kubernetesServiceHost: \"{host}\"")));
    lab.ok(&["apply", "-f", "-"], Some(&manifest));
    let ns = ["-n", "kube-system"];
    for what in ["ds/podnet-agent", "deploy/podnet-dns"] {
        lab.ok(&[ns[0], ns[1], "rollout", "status", what, "--timeout=240s"], None);
    }
    lab.ok(
        &["wait", "--for=condition=Ready", "node", "--all", "--timeout=120s"],
        None,
    );
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

    // The kubelets ran, and the machine's sysctls are as they were.
    assert_eq!(podnet_lab::realnode::host::sysctls(), before);

    // Across nodes, through a ClusterIP Service, by its DNS name.
    lab.ok(&["apply", "-f", "-"], Some(APP));
    lab.ok(
        &["wait", "-n", "smoke", "--for=condition=Ready", "pod", "--all", "--timeout=120s"],
        None,
    );
    let url = "http://server.smoke.svc.cluster.local/hostname";
    let answer = eventually("the Service answers by name", 30, || {
        let o = lab.kubectl(
            &["exec", "-n", "smoke", "client", "--", "curl", "-sS", "--max-time", "3", url],
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

    lab.down = true;
    let o = lab.lab(&["down"]);
    assert!(o.status.success(), "lab down: {}", text(&o));
    assert_eq!(leftovers(&name), Vec::<String>::new());
    assert_eq!(podnet_lab::realnode::host::sysctls(), before);
}
