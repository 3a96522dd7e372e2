//! Kubernetes mode against the real thing: a real etcd, kube-apiserver and
//! kube-controller-manager (v1.37, built from Go modules by
//! `scripts/k8s-peers.sh`) run inside one private network namespace with
//! a `podnet agent` and `podnet dns` that take everything from the API
//! (`--kubeconfig`), no podnet store anywhere.
//!
//! It checks what a flannel + kube-proxy + CoreDNS user relies on:
//! - the node's subnet is the podCIDR kube-controller-manager allocated
//!   (`--allocate-node-cidrs`), written to subnet.env;
//! - the agent publishes its `podnet.io/` annotations and clears the node's
//!   `NetworkUnavailable` condition;
//! - another node, published the same way, gets its route over the VXLAN
//!   device;
//! - a Service created with a real kubectl gets its ClusterIP from the real
//!   apiserver, its rules from the agent's proxy and its name from DNS; a
//!   deleted Service loses both.
//!
//! No sleep stands in for readiness: every wait polls a state with a
//! generous deadline, and nothing asserts how long anything took.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use podnet_testkit::{eventually, Etcd, Proc, TestNs};

/// The bound on every wait: generous, since the machine is shared.
const WAIT: Duration = Duration::from_secs(120);

/// The real Kubernetes binaries; a missing one fails loudly.
struct Peers {
    apiserver: PathBuf,
    controller_manager: PathBuf,
    kubectl: PathBuf,
}

fn peers() -> Peers {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/k8s-peers.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .expect("running scripts/k8s-peers.sh");
    assert!(
        out.status.success(),
        "scripts/k8s-peers.sh could not provide the Kubernetes peers: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let get = |k: &str| -> PathBuf {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("scripts/k8s-peers.sh printed no {k}"))
    };
    Peers {
        apiserver: get("KUBE_APISERVER"),
        controller_manager: get("KUBE_CONTROLLER_MANAGER"),
        kubectl: get("KUBECTL"),
    }
}

/// Processes started inside the namespace, killed on drop (before the
/// namespace goes, since they are declared after it).
#[derive(Default)]
struct Procs(Vec<Proc>);

impl Procs {
    fn spawn(&mut self, ns: &TestNs, dir: &Path, name: &str, cmd: &Path, args: &[String]) {
        let mut c = ns.command(cmd);
        c.args(args);
        self.0.push(Proc::spawn(name, c, dir));
    }

    /// Fails the test if a process died (with its log's tail).
    fn check(&self) {
        self.0.iter().for_each(Proc::check);
    }
}

fn openssl(dir: &Path, args: &str) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("cd {} && openssl {args}", dir.display()))
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, the apiserver's serving certificate, an admin client certificate
/// (O=system:masters) and the service-account key pair, plus the admin
/// kubeconfig.
fn pki(dir: &Path, node_ip: &str) -> PathBuf {
    openssl(
        dir,
        "req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=pn-test-ca",
    );
    std::fs::write(
        dir.join("san.ext"),
        format!("subjectAltName=IP:127.0.0.1,IP:10.96.0.1,IP:{node_ip},DNS:localhost,DNS:kubernetes.default.svc\n"),
    )
    .unwrap();
    openssl(
        dir,
        "req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=kube-apiserver",
    );
    openssl(dir, "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile san.ext");
    openssl(dir, "req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj /CN=admin/O=system:masters");
    // X.509 v3 (rustls refuses v1 certificates): give it an extension.
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    openssl(dir, "x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out admin.crt -days 2 -extfile client.ext");
    openssl(dir, "genrsa -out sa.key 2048");
    openssl(dir, "rsa -in sa.key -pubout -out sa.pub");
    let kc = dir.join("admin.kubeconfig");
    let d = dir.display();
    std::fs::write(
        &kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: pn\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority: {d}/ca.crt\nusers:\n- name: admin\n  user:\n    client-certificate: {d}/admin.crt\n    client-key: {d}/admin.key\ncontexts:\n- name: pn\n  context: {{cluster: pn, user: admin}}\ncurrent-context: pn\n"
        ),
    )
    .unwrap();
    kc
}

struct Kubectl<'a> {
    ns: &'a TestNs,
    bin: PathBuf,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl<'_> {
    fn run(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        use std::io::Write;
        let mut c = self
            .ns
            .command(&self.bin)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--cache-dir={}", self.cache.display()))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl");
        let mut i = c.stdin.take().unwrap();
        if let Some(s) = stdin {
            i.write_all(s.as_bytes()).unwrap();
        }
        drop(i);
        let out = c.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    }

    fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out) = self.run(args, stdin);
        assert!(ok, "kubectl {args:?}: {out}");
        out
    }

    fn json(&self, args: &[&str]) -> Option<serde_json::Value> {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let (ok, out) = self.run(&a, None);
        ok.then(|| serde_json::from_str(&out).ok()).flatten()
    }
}

fn node_cidr(k: &Kubectl, node: &str) -> Option<String> {
    k.json(&["get", "node", node])?
        .pointer("/spec/podCIDR")?
        .as_str()
        .map(str::to_string)
}

fn dig(ns: &TestNs, name: &str) -> String {
    ns.try_sh(&format!(
        "dig +short +time=1 +tries=1 @127.0.0.1 -p 5353 {name} A"
    ))
    .1
    .trim()
    .to_string()
}

#[test]
fn agent_and_dns_follow_the_real_apiserver_and_controller_manager() {
    let peers = peers();
    let ns = TestNs::new("kube");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut procs = Procs::default();
    // The node's underlay and a default route, as on a real node.
    ns.sh(
        "ip link set lo up && ip link add kb0 type veth peer name kb1 && \
         ip addr add 10.251.0.1/24 dev kb0 && ip link set kb0 up && ip link set kb1 up && \
         ip route add default via 10.251.0.254",
    );
    let kubeconfig = pki(d, "10.251.0.1");
    let s = |v: &str| v.to_string();
    let etcd = Etcd::start_in(&ns);
    let p = |f: &str| d.join(f).display().to_string();
    procs.spawn(
        &ns,
        d,
        "kube-apiserver",
        &peers.apiserver,
        &[
            format!("--etcd-servers={}", etcd.client_url()),
            s("--bind-address=0.0.0.0"),
            s("--secure-port=6443"),
            s("--advertise-address=10.251.0.1"),
            format!("--cert-dir={}", p("apiserver-certs")),
            format!("--tls-cert-file={}", p("server.crt")),
            format!("--tls-private-key-file={}", p("server.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            s("--service-account-issuer=https://kubernetes.default.svc"),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            s("--service-cluster-ip-range=10.96.0.0/12"),
            s("--authorization-mode=RBAC"),
        ],
    );
    let k = Kubectl {
        ns: &ns,
        bin: peers.kubectl.clone(),
        kubeconfig: kubeconfig.clone(),
        cache: d.join("kubectl-cache"),
    };
    eventually("kube-apiserver /readyz", WAIT, || {
        procs.check();
        etcd.check();
        k.run(&["get", "--raw", "/readyz"], None).1.trim() == "ok"
    });
    procs.spawn(
        &ns,
        d,
        "kube-controller-manager",
        &peers.controller_manager,
        &[
            format!("--kubeconfig={}", kubeconfig.display()),
            s("--allocate-node-cidrs"),
            s("--cluster-cidr=10.244.0.0/16"),
            s("--node-cidr-mask-size=24"),
            s("--service-cluster-ip-range=10.96.0.0/12"),
            s("--leader-elect=false"),
            s("--bind-address=127.0.0.1"),
            format!("--cert-dir={}", p("kcm-certs")),
            format!("--flex-volume-plugin-dir={}", p("flex")),
            format!("--root-ca-file={}", p("ca.crt")),
            format!("--service-account-private-key-file={}", p("sa.key")),
        ],
    );
    // Two nodes, registered as a kubelet would.
    for (n, ip) in [("n1", "10.251.0.1"), ("n2", "10.251.0.2")] {
        k.ok(
            &["apply", "-f", "-"],
            Some(&format!(
                "apiVersion: v1\nkind: Node\nmetadata:\n  name: {n}\n  labels: {{kubernetes.io/hostname: {n}}}\nstatus:\n  addresses: [{{type: InternalIP, address: \"{ip}\"}}]\n"
            )),
        );
    }
    let (cidr1, cidr2) = eventually("kube-controller-manager allocating podCIDRs", WAIT, || {
        procs.check();
        etcd.check();
        Some((node_cidr(&k, "n1")?, node_cidr(&k, "n2")?))
    });
    assert!(
        cidr1.starts_with("10.244.") && cidr1.ends_with("/24"),
        "{cidr1}"
    );
    assert_ne!(cidr1, cidr2);

    // The agent and DNS, from the API only.
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_podnet"));
    std::fs::write(
        d.join("net-conf.json"),
        r#"{"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}"#,
    )
    .unwrap();
    std::fs::create_dir_all(d.join("cni")).unwrap();
    procs.spawn(
        &ns,
        d,
        "agent",
        &exe,
        &[
            s("agent"),
            s("--node=n1"),
            s("--iface=kb0"),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--net-conf={}", p("net-conf.json")),
            format!("--subnet-file={}", p("subnet.env")),
            format!("--cni-conf-dir={}", p("cni")),
            s("--metrics-addr=127.0.0.1:10249"),
            s("--resync=1"),
        ],
    );
    procs.spawn(
        &ns,
        d,
        "dns",
        &exe,
        &[
            s("dns"),
            format!("--kubeconfig={}", kubeconfig.display()),
            s("--listen=127.0.0.1:5353"),
            s("--metrics-addr=127.0.0.1:9153"),
            s("--upstream=127.0.0.1:9"),
        ],
    );

    // The subnet is the allocated podCIDR.
    eventually("subnet.env with n1's podCIDR", WAIT, || {
        procs.check();
        etcd.check();
        std::fs::read_to_string(d.join("subnet.env"))
            .map(|t| {
                t.contains(&format!(
                    "PODNET_SUBNET={}",
                    cidr1.replace(".0/24", ".1/24")
                ))
            })
            .unwrap_or(false)
    });
    // Published as flannel's kube-subnet-mgr does, and the network is up.
    eventually(
        "n1's annotations and NetworkUnavailable=False",
        WAIT,
        || {
            let Some(n) = k.json(&["get", "node", "n1"]) else {
                return false;
            };
            let ann = &n["metadata"]["annotations"];
            let published = ann["podnet.io/backend-type"] == "vxlan"
                && ann["podnet.io/public-ip"] == "10.251.0.1"
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
        },
    );
    // Another node joins the mesh once its agent has published itself.
    let route = format!("ip route show {cidr2}");
    assert!(
        ns.sh(&route).trim().is_empty(),
        "no route before n2 is published"
    );
    k.ok(
        &[
            "annotate",
            "node",
            "n2",
            "podnet.io/backend-type=vxlan",
            "podnet.io/public-ip=10.251.0.2",
            r#"podnet.io/backend-data={"VNI":1,"VtepMAC":"02:00:00:00:00:02"}"#,
        ],
        None,
    );
    eventually("a route to n2's podCIDR over podnet.1", WAIT, || {
        ns.sh(&route).contains("dev podnet.1")
    });

    // A Service through the real apiserver: ClusterIP, proxy rules, name.
    k.ok(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: default\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\nports: [{name: http, port: 8080, protocol: TCP}]\nendpoints: [{addresses: [\"10.244.99.5\"], conditions: {ready: true}}]\n",
        ),
    );
    let svc = k.json(&["get", "service", "web"]).expect("the Service");
    let cip = svc["spec"]["clusterIP"].as_str().unwrap().to_string();
    let range: ipnet::IpNet = "10.96.0.0/12".parse().unwrap();
    assert!(
        range.contains(&cip.parse::<std::net::IpAddr>().unwrap()),
        "ClusterIP {cip} from the apiserver's 10.96.0.0/12"
    );
    eventually(
        "the proxy's rules for the ClusterIP and endpoint",
        WAIT,
        || {
            ns.nft_list("table ip podnet")
                .is_some_and(|t| t.contains(&cip) && t.contains("10.244.99.5"))
        },
    );
    eventually("DNS answering web.default.svc.cluster.local", WAIT, || {
        procs.check();
        etcd.check();
        dig(&ns, "web.default.svc.cluster.local") == cip
    });
    k.ok(&["delete", "service", "web"], None);
    k.ok(&["delete", "endpointslice", "web-1"], None);
    eventually("the rules and the name gone with the Service", WAIT, || {
        !ns.nft_list("table ip podnet")
            .is_some_and(|t| t.contains(&cip))
            && dig(&ns, "web.default.svc.cluster.local").is_empty()
    });
    procs.check();
    etcd.check();
}
