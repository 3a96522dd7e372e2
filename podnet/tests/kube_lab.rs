//! `podnet lab up --kube`: a real etcd, kube-apiserver and
//! kube-controller-manager behind the lab, checked with a real kubectl.
//! The lab runs without agents (`--no-agents`): what is asserted here is
//! the control plane's and the lab-kubelet's part (Nodes and their
//! podCIDRs, Pods with their status, EndpointSlices from the real
//! controller), which holds whatever the agents do.
//!
//! Needs root and the binaries of `scripts/k8s-peers.sh`; without them the
//! test fails and says so.

#[path = "common/kubectl.rs"]
mod kubectl;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
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

/// A `--kube` lab, taken down when dropped (also on panic).
struct KubeLab {
    name: String,
    kubectl: PathBuf,
    down: bool,
}

impl KubeLab {
    fn up(tag: &str, nodes: usize) -> KubeLab {
        let peers = podnet_lab::kube::Peers::find()
            .unwrap_or_else(|e| panic!("{e}\n(the binaries come from scripts/k8s-peers.sh)"));
        let lab = KubeLab {
            name: format!("{tag}{}", std::process::id() % 100_000),
            kubectl: peers.kubectl,
            down: false,
        };
        let n = nodes.to_string();
        lab.ok(&["up", "--kube", "--no-agents", "--nodes", &n]);
        lab
    }

    fn dir(&self) -> PathBuf {
        Path::new(podnet_lab::RUN_DIR).join(&self.name)
    }

    fn lab(&self, args: &[&str]) -> Output {
        let mut a = vec!["lab", "--name", &self.name];
        a.extend_from_slice(args);
        podnet(&a)
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.lab(args);
        assert!(o.status.success(), "lab {args:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// The real kubectl with the path `lab kubeconfig` prints.
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let kc = self.ok(&["kubeconfig"]);
        kubectl::run_as(&self.kubectl, Path::new(&kc), &self.dir(), args, stdin)
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let o = self.kubectl(&a, None);
        assert!(o.status.success(), "kubectl {a:?}: {}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    fn take_down(&mut self) -> String {
        self.down = true;
        let o = self.lab(&["down"]);
        assert!(o.status.success(), "lab down: {}", text(&o));
        text(&o)
    }
}

impl Drop for KubeLab {
    fn drop(&mut self) {
        if !self.down {
            let _ = self.lab(&["down"]);
        }
    }
}

/// Polls `f` until it yields, for at most 60 s (the controllers work
/// asynchronously); then fails with `what` and the last state seen.
fn eventually<T>(what: &str, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => panic!("timed out: {what}; last: {last}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn condition(pod: &Value, ty: &str) -> String {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == ty)
        .map(|c| c["status"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default()
}

fn processes_mentioning(marker: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if e.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(marker) {
                out.push(c);
            }
        }
    }
    out
}

#[test]
fn kube_lab_nodes_pods_and_endpoint_slices_through_the_real_control_plane() {
    let mut lab = KubeLab::up("kl", 2);

    // Every node is registered with its underlay IP and has a /24 from
    // the cluster CIDR, allocated by kube-controller-manager.
    let cluster: Ipv4Net = "10.244.0.0/16".parse().unwrap();
    let nodes = lab.json(&["get", "nodes"]);
    let items = nodes["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{nodes:#}");
    let mut cidrs = std::collections::BTreeMap::new();
    for (i, n) in items.iter().enumerate() {
        let name = n["metadata"]["name"].as_str().unwrap();
        assert_eq!(name, format!("node{}", i + 1));
        assert_eq!(n["metadata"]["labels"]["kubernetes.io/hostname"], name);
        let internal = n["status"]["addresses"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["type"] == "InternalIP")
            .unwrap_or_else(|| panic!("{name} has no InternalIP: {n:#}"));
        assert_eq!(internal["address"], format!("192.168.200.{}", 11 + i));
        let cidr: Ipv4Net = n["spec"]["podCIDR"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} has no podCIDR: {n:#}"))
            .parse()
            .unwrap();
        assert!(cluster.contains(&cidr) && cidr.prefix_len() == 24, "{cidr}");
        assert_eq!(n["spec"]["podCIDRs"][0], cidr.to_string());
        cidrs.insert(name.to_string(), cidr);
    }
    assert_ne!(cidrs["node1"], cidrs["node2"]);

    // Inside a node namespace, the node's kubeconfig reaches the apiserver
    // (through the lab's forwarder at the same loopback address), as the
    // agent's ServiceAccount: it may list nodes, and not get one (the agent
    // never does).
    let node_kc = lab.dir().join("nodes/node2/kubeconfig");

    // Every file holding a bearer token or a private key is readable by
    // root only (issue 23: the token kubeconfigs were 0644); certificates
    // and the admin kubeconfig (which names the key's file) need not be.
    let mode = |p: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o777
    };
    let pki = lab.dir().join("kube/pki");
    let mut secrets = vec![
        lab.dir().join("nodes/node1/kubeconfig"),
        node_kc.clone(),
        lab.dir().join("dns-kubeconfig"),
    ];
    for e in std::fs::read_dir(&pki).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "key") {
            secrets.push(e.path());
        }
    }
    assert!(secrets.len() >= 3 + 4, "{secrets:?}");
    for p in &secrets {
        let text = std::fs::read_to_string(p).unwrap();
        assert!(
            text.contains("token: ") || text.contains("PRIVATE KEY"),
            "{} holds no secret",
            p.display()
        );
        assert_eq!(mode(p), 0o600, "{} is mode {:o}", p.display(), mode(p));
    }
    assert_eq!(mode(&pki.join("ca.crt")), 0o644);
    let node_kubectl = |args: &[&str]| {
        Command::new("ip")
            .args(["netns", "exec", &format!("pn-{}-node2", lab.name)])
            .arg(&lab.kubectl)
            .arg("--kubeconfig")
            .arg(&node_kc)
            .arg("--cache-dir")
            .arg(lab.dir().join("kubectl-cache"))
            .args(args)
            .output()
            .unwrap()
    };
    let o = node_kubectl(&["get", "nodes", "-o", "name"]);
    assert!(o.status.success(), "kubectl in node2: {}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "node/node1\nnode/node2"
    );
    let o = node_kubectl(&["get", "node", "node2", "-o", "name"]);
    assert!(
        !o.status.success()
            && text(&o).contains(
                "User \"system:serviceaccount:kube-system:podnet-agent\" cannot get resource \"nodes\""
            ),
        "{}",
        text(&o)
    );

    // Cluster DNS: the kube-dns Service at 10.96.0.10, its pod an endpoint.
    let dns = lab.json(&["get", "service", "-n", "kube-system", "kube-dns"]);
    assert_eq!(dns["spec"]["clusterIP"], "10.96.0.10");
    let mut ports: Vec<(String, String, i64)> = dns["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["protocol"].as_str().unwrap().to_string(),
                p["port"].as_i64().unwrap(),
            )
        })
        .collect();
    ports.sort();
    assert_eq!(
        ports,
        vec![
            ("dns".to_string(), "UDP".to_string(), 53),
            ("dns-tcp".to_string(), "TCP".to_string(), 53)
        ]
    );
    let dns_pod = lab.json(&["get", "pod", "-n", "kube-system", "podnet-dns"]);
    let dns_ip = dns_pod["status"]["podIP"].as_str().unwrap().to_string();
    eventually("the kube-dns EndpointSlice lists the DNS pod", || {
        let s = lab.json(&[
            "get",
            "endpointslices",
            "-n",
            "kube-system",
            "-l",
            "kubernetes.io/service-name=kube-dns",
        ]);
        let found = s["items"].as_array().unwrap().iter().any(|sl| {
            sl["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["addresses"][0] == dns_ip.as_str())
        });
        found.then_some(()).ok_or(format!("{s:#}"))
    });

    // `lab run`: a Pod bound to node2 with its IP from node2's podCIDR,
    // Running and Ready as the lab's kubelet reported.
    lab.ok(&[
        "run",
        "web/server",
        "--node",
        "node2",
        "--ports",
        "8080/tcp,8081/udp",
        "--labels",
        "app=web",
    ]);
    let pod = lab.json(&["get", "pod", "-n", "web", "server"]);
    assert_eq!(pod["spec"]["nodeName"], "node2");
    assert_eq!(pod["status"]["phase"], "Running");
    assert_eq!(condition(&pod, "Ready"), "True");
    assert_eq!(condition(&pod, "ContainersReady"), "True");
    assert_eq!(pod["status"]["hostIP"], "192.168.200.12");
    let ip: std::net::Ipv4Addr = pod["status"]["podIP"].as_str().unwrap().parse().unwrap();
    assert!(
        cidrs["node2"].contains(&ip),
        "{ip} not in {}",
        cidrs["node2"]
    );
    assert_eq!(pod["status"]["podIPs"][0]["ip"], ip.to_string());
    let cports = &pod["spec"]["containers"][0]["ports"];
    assert_eq!(cports[0]["name"], "tcp-8080", "{cports}");
    assert_eq!(cports[1]["protocol"], "UDP", "{cports}");

    // A Service made with kubectl gets an EndpointSlice from the real
    // controller, resolving the named targetPort against the pod.
    let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: web}\n\
               spec: {selector: {app: web}, ports: [{name: http, port: 80, targetPort: tcp-8080}]}\n";
    let o = lab.kubectl(&["apply", "-f", "-"], Some(svc));
    assert!(o.status.success(), "kubectl apply: {}", text(&o));
    let slices = || {
        lab.json(&[
            "get",
            "endpointslices",
            "-n",
            "web",
            "-l",
            "kubernetes.io/service-name=web",
        ])
    };
    eventually("the web EndpointSlice lists the pod", || {
        let s = slices();
        let items = s["items"].as_array().unwrap();
        let ok = items.iter().any(|sl| {
            sl["ports"][0]["port"] == 8080
                && sl["ports"][0]["name"] == "http"
                && sl["endpoints"].as_array().into_iter().flatten().any(|e| {
                    e["addresses"][0] == ip.to_string().as_str()
                        && e["conditions"]["ready"] == true
                        && e["nodeName"] == "node2"
                        && e["targetRef"]["name"] == "server"
                })
        });
        ok.then_some(()).ok_or(format!("{s:#}"))
    });

    // `lab rm`: the Pod goes, and with it the slice's endpoint.
    lab.ok(&["rm", "web/server"]);
    let o = lab.kubectl(&["get", "pod", "-n", "web", "server"], None);
    assert!(
        !o.status.success() && text(&o).contains("NotFound"),
        "{}",
        text(&o)
    );
    eventually("the endpoint leaves the slice", || {
        let s = slices();
        let left: Vec<&Value> = s["items"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|sl| sl["endpoints"].as_array().into_iter().flatten())
            .collect();
        let has_slice = !s["items"].as_array().unwrap().is_empty();
        (has_slice && left.is_empty())
            .then_some(())
            .ok_or(format!("{s:#}"))
    });

    // `lab down` leaves no process, namespace or file behind.
    let dir = lab.dir();
    let said = lab.take_down();
    for role in ["etcd", "kube-apiserver", "kube-controller-manager"] {
        assert!(said.contains(&format!("stopped {role}")), "{said}");
    }
    assert!(!dir.exists(), "{} is still there", dir.display());
    let marker = format!("{}/", dir.display());
    assert_eq!(processes_mentioning(&marker), Vec::<String>::new());
    let prefix = format!("pn-{}-", lab.name);
    let left: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "namespaces left: {left:?}");
}

/// Two `--kube` labs at once (as parallel tests run them): separate ports,
/// directories and clusters; each comes down on its own.
#[test]
fn two_kube_labs_side_by_side() {
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| KubeLab::up("ka", 1));
        let b = s.spawn(|| KubeLab::up("kb", 1));
        (a.join().unwrap(), b.join().unwrap())
    });
    let server = |l: &KubeLab| {
        let kc = std::fs::read_to_string(l.ok(&["kubeconfig"])).unwrap();
        kc.lines()
            .find_map(|l| l.trim().strip_prefix("server: ").map(str::to_string))
            .unwrap()
    };
    assert_ne!(server(&a), server(&b));
    a.ok(&["run", "only/in-a", "--node", "node1", "--ports", "8080/tcp"]);
    let pods = |l: &KubeLab| -> Vec<String> {
        l.json(&["get", "pods", "-A"])["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(pods(&a).contains(&"in-a".to_string()), "{:?}", pods(&a));
    assert!(!pods(&b).contains(&"in-a".to_string()), "{:?}", pods(&b));
    drop(a);
    // b's control plane is untouched by a's teardown.
    assert_eq!(
        b.json(&["get", "nodes"])["items"].as_array().unwrap().len(),
        1
    );
}

/// `lab up --kube` killed while the control plane starts (its processes
/// run detached): `lab down` still stops them and removes everything.
#[test]
fn lab_down_after_up_crashed_mid_start() {
    let peers = podnet_lab::kube::Peers::find()
        .unwrap_or_else(|e| panic!("{e}\n(the binaries come from scripts/k8s-peers.sh)"));
    let mut lab = KubeLab {
        name: format!("kc{}", std::process::id() % 100_000),
        kubectl: peers.kubectl,
        down: false,
    };
    let mut up = Command::new(env!("CARGO_BIN_EXE_podnet"))
        .args(["lab", "--name", &lab.name, "up", "--kube", "--no-agents"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = lab.dir().join("pids").join("kube-apiserver");
    eventually("lab up starts kube-apiserver", || {
        started
            .exists()
            .then_some(())
            .ok_or_else(|| format!("no {} (lab up: {:?})", started.display(), up.try_wait()))
    });
    assert!(up.try_wait().unwrap().is_none(), "lab up finished already");
    up.kill().unwrap();
    up.wait().unwrap();
    let marker = format!("{}/", lab.dir().display());
    assert!(
        processes_mentioning(&marker)
            .iter()
            .any(|c| c.contains("kube-apiserver")),
        "the control plane outlives the crashed lab up"
    );
    let said = lab.take_down();
    assert!(said.contains("kube-apiserver"), "{said}");
    assert!(!lab.dir().exists());
    assert_eq!(processes_mentioning(&marker), Vec::<String>::new());
}

/// Without the Kubernetes binaries `lab up --kube` fails loudly, names the
/// script that builds them, and makes nothing.
#[test]
fn missing_kubernetes_binaries_fail_naming_the_script() {
    let name = format!("km{}", std::process::id() % 100_000);
    let o = Command::new(env!("CARGO_BIN_EXE_podnet"))
        .args(["lab", "--name", &name, "up", "--kube", "--no-agents"])
        .env("KUBE_APISERVER", "/nonexistent/kube-apiserver")
        .output()
        .unwrap();
    let said = text(&o);
    assert!(!o.status.success(), "{said}");
    assert!(said.contains("scripts/k8s-peers.sh"), "{said}");
    assert!(said.contains("kube-apiserver"), "{said}");
    assert!(!Path::new(podnet_lab::RUN_DIR).join(&name).exists());
    assert!(!Path::new("/run/netns")
        .join(format!("pn-{name}-net"))
        .exists());
}
