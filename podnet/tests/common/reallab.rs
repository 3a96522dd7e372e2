//! A real-kubelet lab for tests (`podnet lab up --kubelet`), with podnet
//! installed from deploy/podnet.yaml as an operator installs it: the drop
//! guard, kubectl against it, the image archives (scripts/e2e-images.sh,
//! scripts/dev-image.sh), and what a lab leaves behind.

#![allow(dead_code)]

#[path = "kubectl.rs"]
mod kubectl;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn podnet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_podnet"))
        .args(args)
        .output()
        .expect("run podnet")
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs a repo script, returning its stdout; fails the test with its
/// output otherwise.
pub fn script(name: &str, args: &[&str]) -> String {
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
pub struct RealLab {
    pub name: String,
    pub kubectl: PathBuf,
    pub down: bool,
}

impl RealLab {
    pub fn lab(&self, args: &[&str]) -> Output {
        let mut a = vec!["lab", "--name", &self.name];
        a.extend_from_slice(args);
        podnet(&a)
    }

    pub fn dir(&self) -> PathBuf {
        Path::new(podnet_lab::RUN_DIR).join(&self.name)
    }

    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        kubectl::run(&self.kubectl, &self.name, args, stdin)
    }

    pub fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let o = self.kubectl(args, stdin);
        assert!(o.status.success(), "kubectl {args:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    pub fn json(&self, args: &[&str]) -> Value {
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
/// directories or the lab itself (`podnet lab --name NAME ...`, such as the
/// API server's forwarder in the host's namespace), mounts under them, its
/// cgroups, its data.
pub fn leftovers(name: &str) -> Vec<String> {
    let run = format!("{}/{name}/", podnet_lab::RUN_DIR);
    let data = format!("{}/{name}", podnet_lab::realnode::DATA_DIR);
    let helper = format!("--name {name} ");
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if e.file_name().to_string_lossy().parse::<u32>().is_err() || e.file_name() == *me {
            continue;
        }
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(&run) || c.contains(&data) || c.contains(&helper) {
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

pub fn eventually<T>(what: &str, secs: u64, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => panic!("timed out: {what}; last: {last}"),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// The image name deploy/podnet.yaml runs.
pub const DEPLOY_IMAGE: &str = "localhost/podnet:0.1.0";

/// The archives scripts/e2e-images.sh prints, by a part of their name.
pub fn e2e_image(needle: &str) -> String {
    let images = script("e2e-images.sh", &[]);
    images
        .lines()
        .filter_map(|l| l.strip_prefix("archive="))
        .find(|a| a.contains(needle))
        .unwrap_or_else(|| panic!("no {needle} archive in: {images}"))
        .to_string()
}

/// An image archive of the podnet binary `bin`, named `reference`
/// (scripts/dev-image.sh), written into `dir`.
pub fn podnet_image(bin: &Path, reference: &str, dir: &Path) -> PathBuf {
    let out = dir.join(format!("{}.tar", reference.replace(['/', ':'], "_")));
    let o = Command::new("bash")
        .arg(repo().join("scripts/dev-image.sh"))
        .arg(bin)
        .arg(&out)
        .env("PODNET_IMAGE", reference)
        .output()
        .expect("bash");
    assert!(o.status.success(), "dev-image.sh: {}", text(&o));
    out
}

impl RealLab {
    /// `lab up --kubelet` with `nodes` nodes and these image archives;
    /// returns the lab and the API address (host, port) its pods use.
    pub fn up(tag: &str, nodes: usize, images: &[PathBuf]) -> (RealLab, String, String) {
        let peers = podnet_lab::kube::Peers::find()
            .unwrap_or_else(|e| panic!("{e}\n(the binaries come from scripts/k8s-peers.sh)"));
        let lab = RealLab {
            name: format!("{tag}{}", std::process::id() % 100_000),
            kubectl: peers.kubectl,
            down: false,
        };
        let n = nodes.to_string();
        let mut args = vec!["up", "--nodes", &n, "--kubelet"];
        for i in images {
            args.extend(["--image", i.to_str().unwrap()]);
        }
        let o = lab.lab(&args);
        assert!(o.status.success(), "lab up --kubelet: {}", text(&o));
        let up = text(&o);
        let field = |k: &str| {
            up.split(&format!("{k}: "))
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .unwrap_or_else(|| panic!("lab up names no {k}: {up}"))
                .to_string()
        };
        let (host, port) = (
            field("kubernetesServiceHost"),
            field("kubernetesServicePort"),
        );
        (lab, host, port)
    }

    /// deploy/podnet.yaml as an operator applies it: the ConfigMap's API
    /// override set, `image` for every podnet container; waits until the
    /// DaemonSet and DNS are rolled out and every node is Ready.
    pub fn install(&self, host: &str, port: &str, image: &str) {
        let manifest = std::fs::read_to_string(repo().join("deploy/podnet.yaml")).unwrap();
        self.apply_podnet(&manifest, host, port, image);
        self.ok(
            &[
                "wait",
                "--for=condition=Ready",
                "node",
                "--all",
                "--timeout=120s",
            ],
            None,
        );
    }

    /// Applies a podnet manifest (this one's, or a release's) with the API
    /// override and `image`, and waits until the kubelets rolled it out.
    pub fn apply_podnet(&self, manifest: &str, host: &str, port: &str, image: &str) {
        let manifest = manifest
            .replace(
                "  # kubernetesServiceHost: \"192.0.2.10\"",
                &format!("  kubernetesServiceHost: \"{host}\""),
            )
            .replace(
                "  # kubernetesServicePort: \"6443\"",
                &format!("  kubernetesServicePort: \"{port}\""),
            )
            .replace(DEPLOY_IMAGE, image);
        assert!(manifest.contains(&format!("kubernetesServiceHost: \"{host}\"")));
        assert!(manifest.contains(&format!("image: {image}")));
        self.ok(&["apply", "-f", "-"], Some(&manifest));
        self.rolled_out();
        // The pods of the components this manifest has (an older one
        // lacks some: `kubectl apply` leaves those running as they were).
        let components: Vec<&str> = manifest
            .lines()
            .filter_map(|l| l.trim().strip_prefix("app.kubernetes.io/component: "))
            .collect();
        eventually("every podnet pod to run the image", 120, || {
            let imgs: Vec<(String, String)> = self
                .podnet_images()
                .into_iter()
                .filter(|(_, _, c)| components.contains(&c.as_str()))
                .map(|(p, i, _)| (p, i))
                .collect();
            match imgs.iter().all(|(_, i)| i == image) {
                true => Ok(()),
                false => Err(format!("{imgs:?}")),
            }
        });
    }

    /// Waits until the agent DaemonSet and the DNS and LB IPAM
    /// Deployments are rolled out.
    pub fn rolled_out(&self) {
        for what in [
            "ds/podnet-agent",
            "deploy/podnet-dns",
            "deploy/podnet-lb-ipam",
        ] {
            self.ok(
                &[
                    "-n",
                    "kube-system",
                    "rollout",
                    "status",
                    what,
                    "--timeout=300s",
                ],
                None,
            );
        }
    }

    /// The images podnet's pods in kube-system run, by pod name.
    /// Pod, image and component of each of podnet's pods.
    pub fn podnet_images(&self) -> Vec<(String, String, String)> {
        let pods = self.json(&["get", "pods", "-n", "kube-system"]);
        pods["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["metadata"]["labels"]["app.kubernetes.io/name"] == "podnet")
            .flat_map(|p| {
                let name = p["metadata"]["name"].as_str().unwrap().to_string();
                let labels = &p["metadata"]["labels"];
                let component = labels["app.kubernetes.io/component"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                p["spec"]["containers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(move |c| {
                        let image = c["image"].as_str().unwrap().to_string();
                        (name.clone(), image, component.clone())
                    })
            })
            .collect()
    }

    /// A named network namespace (`pn-<lab>-pod-<pod>`, so `lab down`
    /// removes it) for pod `ns/pod`, as `ip netns attach` makes one from a
    /// process of the pod (found in its cgroup, which names its UID).
    pub fn attach_pod_netns(&self, ns: &str, pod: &str) -> String {
        let p = self.json(&["get", "pod", "-n", ns, pod]);
        let uid = p["metadata"]["uid"].as_str().unwrap().replace('-', "_");
        let node = p["spec"]["nodeName"].as_str().unwrap();
        let root = format!("/sys/fs/cgroup/pids/pn-{}-{node}", self.name);
        let pid = find_pod_pid(Path::new(&root), &format!("pod{}", uid.replace('_', "-")))
            .or_else(|| find_pod_pid(Path::new(&root), &format!("pod{uid}")))
            .unwrap_or_else(|| panic!("no process of pod {ns}/{pod} under {root}"));
        let name = format!("pn-{}-pod-{pod}", self.name);
        let o = Command::new("ip")
            .args(["netns", "attach", &name, &pid.to_string()])
            .output()
            .unwrap();
        assert!(o.status.success(), "ip netns attach: {}", text(&o));
        name
    }
}

fn find_pod_pid(dir: &Path, pod_dir: &str) -> Option<u32> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if e.file_name().to_string_lossy() == pod_dir {
            return pids_below(&e.path());
        }
        if let Some(p) = find_pod_pid(&e.path(), pod_dir) {
            return Some(p);
        }
    }
    None
}

fn pids_below(dir: &Path) -> Option<u32> {
    let own = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    if let Some(p) = own.lines().find_map(|l| l.trim().parse().ok()) {
        return Some(p);
    }
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .find_map(|e| pids_below(&e.path()))
}
