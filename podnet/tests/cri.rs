//! containerd's CRI as the kubelet-side client of podnet's CNI plugins
//! (issue 15): on a Kubernetes-mode lab node, a pod sandbox created through
//! containerd 1.6's CRI gets its network from the conflist the node's agent
//! wrote, is reachable across the VXLAN overlay, and is torn down by the
//! DEL containerd sends on StopPodSandbox and again on RemovePodSandbox.
//!
//! The flow is a kubelet's: the Pod (bound to node1) is in the API first,
//! then RunPodSandbox with the pod's metadata, a hostPort and Linux
//! options, then the pod status with the sandbox's IP. Every check names
//! its cause: the IP against node1's `subnet.env`, the address and routes
//! inside the sandbox's own namespace (found through containerd's verbose
//! status), the host-side veth on node1's bridge, host-local's lease,
//! portmap's record, libcni's cache, real connections from a pod on node2
//! (to the pod IP and to the hostPort), and the plugins' own log lines
//! (through containerd's log) for the number of ADD and DEL calls.
//!
//! The containerd harness (config, pause image, cleanup) is in
//! `common/cri.rs`. Needs root, containerd 1.6, runc, busybox-static and
//! the Kubernetes peers of `scripts/k8s-peers.sh`: `bash scripts/setup.sh`
//! installs them all; without them the test fails and says so.

#[path = "common/cri.rs"]
mod cri;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::{IpNet, Ipv4Net};
use k8s_cri::v1 as crv;
use kube::Api;
use podnet_api::k8s_openapi::api::core::v1::Pod;
use podnet_cni::plugins::meta::SubnetEnv;
use podnet_kernel::{Handle, Netns};
use podnet_lab::kubelet;
use podnet_lab::serve::{self, PortSpec, Reach};
use podnet_testkit::{eventually, eventually_async, require_root};
use serde_json::Value;

/// The pod's namespace and names in the API.
const NS: &str = "cri";
const POD: &str = "sandbox";
const PEER: &str = "peer";
/// The port the sandbox's listener and the peer's server answer on.
const PORT: u16 = 8080;
/// The sandbox's hostPort on node1 (a kubelet passes it as a port mapping;
/// containerd hands it to portmap with capitalised keys).
const HOST_PORT: u16 = 18080;
/// How long one probe waits.
const PROBE: Duration = Duration::from_secs(3);
/// How long containerd and the agents may take to reach a state.
const SETTLE: Duration = Duration::from_secs(30);

/// A Kubernetes-mode lab for this test, taken down on drop (also on panic).
struct LabGuard {
    lab: podnet_lab::Lab,
    down: bool,
}

impl LabGuard {
    async fn up() -> LabGuard {
        podnet_lab::kube::Peers::find()
            .unwrap_or_else(|e| panic!("{e}\n(the binaries come from scripts/k8s-peers.sh)"));
        let name = format!("cr{}", std::process::id() % 100_000);
        let exe = PathBuf::from(env!("CARGO_BIN_EXE_podnet"));
        let g = LabGuard {
            lab: podnet_lab::Lab::new(&name, exe).expect("lab name"),
            down: false,
        };
        g.lab
            .up(&podnet_lab::UpOptions {
                resync_secs: 5,
                kube: true,
                ..podnet_lab::UpOptions::new(2, "vxlan")
            })
            .await
            .unwrap_or_else(|e| panic!("lab up --kube: {e}"));
        g
    }

    fn take_down(&mut self) {
        self.down = true;
        self.lab
            .down()
            .unwrap_or_else(|e| panic!("lab down {}: {e}", self.lab.name));
    }
}

impl Drop for LabGuard {
    fn drop(&mut self) {
        if !self.down {
            if let Err(e) = self.lab.down() {
                eprintln!("lab down {}: {e}", self.lab.name);
            }
        }
    }
}

fn json(s: &str, what: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("{what}: {e}: {s}"))
}

/// The files containerd's CNI loader considers in `dir`, by name (the
/// order it picks them in; with `max_conf_num = 1` only the first counts).
fn cni_conf_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            [".conf", ".conflist", ".json"]
                .iter()
                .any(|x| n.ends_with(x))
        })
        .collect();
    v.sort();
    v
}

/// The sandbox config a kubelet sends for Pod `uid`: metadata, hostname,
/// cluster DNS, a hostPort, the kubelet's labels and annotations, and
/// Linux options (cgroup parent, the pod's own network and IPC
/// namespaces).
fn sandbox_config(uid: &str, cgroup_parent: String, log_dir: &Path) -> crv::PodSandboxConfig {
    let labels = BTreeMap::from([
        ("io.kubernetes.pod.name".to_string(), POD.to_string()),
        ("io.kubernetes.pod.namespace".to_string(), NS.to_string()),
        ("io.kubernetes.pod.uid".to_string(), uid.to_string()),
        ("app".to_string(), "cri".to_string()),
    ]);
    crv::PodSandboxConfig {
        metadata: Some(crv::PodSandboxMetadata {
            name: POD.into(),
            uid: uid.into(),
            namespace: NS.into(),
            attempt: 0,
        }),
        hostname: POD.into(),
        log_directory: log_dir.display().to_string(),
        dns_config: Some(crv::DnsConfig {
            servers: vec!["10.96.0.10".into()],
            searches: vec![
                format!("{NS}.svc.cluster.local"),
                "svc.cluster.local".into(),
                "cluster.local".into(),
            ],
            options: vec!["ndots:5".into()],
        }),
        port_mappings: vec![crv::PortMapping {
            protocol: crv::Protocol::Tcp as i32,
            container_port: PORT as i32,
            host_port: HOST_PORT as i32,
            host_ip: String::new(),
        }],
        labels: labels.into_iter().collect(),
        annotations: [("kubernetes.io/config.source".to_string(), "api".to_string())]
            .into_iter()
            .collect(),
        linux: Some(crv::LinuxPodSandboxConfig {
            cgroup_parent,
            security_context: Some(crv::LinuxSandboxSecurityContext {
                namespace_options: Some(crv::NamespaceOption {
                    network: crv::NamespaceMode::Pod as i32,
                    pid: crv::NamespaceMode::Container as i32,
                    ipc: crv::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// PodSandboxStatus with containerd's verbose `info` parsed.
async fn sandbox_status(cri: &mut cri::Cri, id: &str) -> (crv::PodSandboxStatus, Value) {
    let r = cri
        .runtime
        .pod_sandbox_status(crv::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        })
        .await
        .unwrap_or_else(|e| panic!("PodSandboxStatus {id}: {e}"))
        .into_inner();
    let info = r
        .info
        .get("info")
        .map(|s| json(s, "status info"))
        .unwrap_or_default();
    (r.status.expect("a status"), info)
}

/// The device and inode of a namespace file: equal means the same namespace.
fn ns_id(path: &Path) -> (u64, u64) {
    let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.dev(), m.ino())
}

/// A TCP server inside a namespace answering like `podnet serve` for
/// `NS/POD`, until [`Listener::close`]. It must be closed before the
/// sandbox stops: its socket would keep the namespace, and the veth in it,
/// alive.
struct Listener {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Listener {
    fn start(ns: &Netns, port: u16) -> Listener {
        let l = ns
            .run(|| TcpListener::bind(("0.0.0.0", port)))
            .expect("entering the sandbox")
            .expect("binding in the sandbox");
        l.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut c, peer)) => {
                        let _ = c.set_nonblocking(false);
                        let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
                        let mut buf = [0u8; 256];
                        let n = c.read(&mut buf).unwrap_or(0);
                        let req = String::from_utf8_lossy(&buf[..n]);
                        let a = serve::answer(NS, POD, &req, peer.ip());
                        let _ = c.write_all(format!("{a}\n").as_bytes());
                    }
                    // Nothing pending: look again soon (this is a server's
                    // accept loop, not a wait for a state).
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Listener {
            stop,
            thread: Some(thread),
        }
    }

    fn close(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.close();
    }
}

/// Whether `routes` (dst, gateway), the kernel's or go-cni's, route `dst`
/// via `gw`. No destination is the default route.
fn has_route(routes: &[(Option<IpNet>, Option<IpAddr>)], dst: IpNet, gw: Ipv4Addr) -> bool {
    let default: IpNet = "0.0.0.0/0".parse().unwrap();
    routes
        .iter()
        .any(|(d, g)| d.unwrap_or(default).trunc() == dst && *g == Some(IpAddr::V4(gw)))
}

/// Node1's CNI side as its agent wrote it: what containerd is pointed at,
/// and what the checks compare with.
struct NodeCni {
    /// `<lab dir>/nodes/node1`.
    dir: PathBuf,
    conf_dir: PathBuf,
    conflist: Value,
    net_name: String,
    plugins: Vec<String>,
    env: SubnetEnv,
    subnet: Ipv4Net,
    gateway: Ipv4Addr,
}

impl NodeCni {
    /// Reads node `node`'s files, and checks the agent's conflist is the one
    /// containerd will load: the first config file by name.
    fn read(lab: &podnet_lab::Lab, node: &str) -> NodeCni {
        let dir = lab.dir.join("nodes").join(node);
        let conf_dir = dir.join("net.d");
        let files = cni_conf_files(&conf_dir);
        assert_eq!(
            files.first().map(String::as_str),
            Some("10-podnet.conflist"),
            "containerd loads the first config in {} by name; it holds {files:?}",
            conf_dir.display()
        );
        let conflist = json(
            &std::fs::read_to_string(conf_dir.join("10-podnet.conflist")).unwrap(),
            "the agent's conflist",
        );
        let plugins = conflist["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["type"].as_str().unwrap().to_string())
            .collect();
        let env = SubnetEnv::parse(
            &std::fs::read_to_string(dir.join("subnet.env")).unwrap(),
            "subnet.env",
        )
        .unwrap();
        let IpNet::V4(subnet) = env.subnet.trunc() else {
            panic!("{node}'s subnet {} is not IPv4", env.subnet)
        };
        NodeCni {
            net_name: conflist["name"].as_str().unwrap().to_string(),
            gateway: subnet.hosts().next().unwrap(),
            dir,
            conf_dir,
            conflist,
            plugins,
            env,
            subnet,
        }
    }
}

/// containerd in `node`'s namespace on the lab's plugins and the node's
/// conflist, with the pause image imported; returns once the CRI answers,
/// sees the image, reports RuntimeReady and NetworkReady, and says it
/// loaded exactly the agent's conflist.
async fn start_containerd(
    lab: &podnet_lab::Lab,
    node: &podnet_lab::NodeInfo,
    cni: &NodeCni,
) -> (cri::Containerd, cri::Cri) {
    let pause = cri::pause_image();
    let mut ctrd =
        cri::Containerd::start(&node.netns, &lab.bin_dir(), &cni.conf_dir, &pause.reference);
    let mut c = ctrd.connect().await;
    let v = c
        .runtime
        .version(crv::VersionRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (v.runtime_name.as_str(), v.runtime_api_version.as_str()),
        ("containerd", "v1"),
        "{v:?}"
    );
    ctrd.import(&pause.archive);
    // The CRI plugin learns of imported images from containerd's events.
    let image = crv::ImageSpec {
        image: pause.reference.clone(),
        ..Default::default()
    };
    let images = c.images.clone();
    eventually_async("the CRI to see the pause image", SETTLE, || {
        let (mut images, image) = (images.clone(), image.clone());
        async move {
            images
                .image_status(crv::ImageStatusRequest {
                    image: Some(image),
                    verbose: false,
                })
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.into_inner().image.ok_or("not yet".to_string()))
        }
    })
    .await;
    let rt = c.runtime.clone();
    let info = eventually_async("CRI RuntimeReady and NetworkReady", SETTLE, || {
        let mut rt = rt.clone();
        async move {
            let r = rt
                .status(crv::StatusRequest { verbose: true })
                .await
                .map_err(|e| e.to_string())?
                .into_inner();
            let conds = r.status.map(|s| s.conditions).unwrap_or_default();
            let ready = |t: &str| conds.iter().any(|c| c.r#type == t && c.status);
            if ready("RuntimeReady") && ready("NetworkReady") {
                Ok(r.info)
            } else {
                Err(format!("{conds:?}"))
            }
        }
    })
    .await;
    let loaded = json(&info["cniconfig"], "cniconfig");
    assert_eq!(
        loaded["PluginConfDir"].as_str(),
        cni.conf_dir.to_str(),
        "{loaded}"
    );
    let network = loaded["Networks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["IFName"] == "eth0")
        .unwrap_or_else(|| panic!("containerd loaded no eth0 network: {loaded}"));
    assert_eq!(
        network["Config"]["Name"].as_str(),
        Some(cni.net_name.as_str())
    );
    assert_eq!(
        json(
            network["Config"]["Source"].as_str().unwrap(),
            "loaded source"
        ),
        cni.conflist,
        "containerd loaded something else than {}/10-podnet.conflist",
        cni.conf_dir.display()
    );
    (ctrd, c)
}

/// What a sandbox got, each piece where its owner keeps it.
struct Attachment {
    ip: Ipv4Addr,
    /// The sandbox's namespace, as containerd named it.
    netns: PathBuf,
    /// The host side, on node1.
    veth: String,
    /// host-local's lease, the meta-plugin's saved delegate config,
    /// portmap's record, libcni's cached result.
    state_files: Vec<PathBuf>,
}

/// Checks 1-5: the sandbox's address, interface, routes, host veth and
/// the plugins' state, against node1's files and containerd's report.
fn check_attachment(
    cni: &NodeCni,
    node: &podnet_lab::NodeInfo,
    id: &str,
    status: &crv::PodSandboxStatus,
    info: &Value,
) -> Attachment {
    // 1. The address is node1's: inside the subnet its agent leased.
    let ip: Ipv4Addr = status
        .network
        .as_ref()
        .map(|n| n.ip.as_str())
        .unwrap_or_default()
        .parse()
        .unwrap_or_else(|e| panic!("sandbox IP {:?}: {e}", status.network));
    assert!(
        cni.subnet.contains(&ip) && ip != cni.gateway,
        "sandbox IP {ip} is not a pod address of node1's subnet {}",
        cni.subnet
    );

    // 2. It is on eth0 in the sandbox's own namespace: the one containerd
    //    reports, which the pause process is in.
    let netns = info["runtimeSpec"]["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["type"] == "network")
        .and_then(|n| n["path"].as_str())
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no network namespace path in {info}"));
    let pid = info["pid"].as_u64().expect("the sandbox's pid");
    assert_eq!(
        ns_id(&netns),
        ns_id(Path::new(&format!("/proc/{pid}/ns/net"))),
        "{} is not the pause process's network namespace",
        netns.display()
    );
    let mut sh = Handle::in_netns(&Netns::open(&netns).unwrap()).unwrap();
    let eth0 = sh.require_link("eth0").unwrap();
    let addrs: Vec<IpNet> = sh
        .addrs(eth0.index)
        .unwrap()
        .into_iter()
        .map(|a| a.net)
        .collect();
    let want = IpNet::V4(Ipv4Net::new(ip, cni.subnet.prefix_len()).unwrap());
    assert!(addrs.contains(&want), "eth0 has {addrs:?}, want {want}");
    assert!(eth0.is_up(), "eth0 is down");
    if let Some(mtu) = cni.env.mtu {
        assert_eq!(eth0.mtu, mtu, "eth0's MTU is not node1's subnet.env MTU");
    }

    // 3. Routes: the default route and the cluster network, both via the
    //    node's bridge gateway (the delegate's isDefaultGateway and
    //    host-local's route), in the kernel and in go-cni's result.
    let gw = cni.gateway;
    let routes: Vec<(Option<IpNet>, Option<IpAddr>)> = sh
        .routes(false, None)
        .unwrap()
        .into_iter()
        .filter(|r| r.table.unwrap_or(254) == 254)
        .map(|r| (r.dst, r.gateway))
        .collect();
    let default: IpNet = "0.0.0.0/0".parse().unwrap();
    assert!(
        has_route(&routes, default, gw),
        "no default route via {gw} in the sandbox: {routes:?}"
    );
    assert!(
        has_route(&routes, cni.env.network.trunc(), gw),
        "no route to the cluster network {} via {gw}: {routes:?}",
        cni.env.network
    );
    let result = &info["cniResult"];
    let result_routes: Vec<(Option<IpNet>, Option<IpAddr>)> = result["Routes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["dst"].as_str().and_then(|d| d.parse().ok()),
                r["gw"].as_str().and_then(|g| g.parse().ok()),
            )
        })
        .collect();
    assert!(
        has_route(&result_routes, default, gw),
        "containerd's CNI result has no default route via {gw}: {result}"
    );

    // 4. The host side: a veth on node1's bridge whose peer is eth0, named
    //    in the CNI result containerd keeps.
    let veth = result["Interfaces"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(name, c)| {
            name.starts_with("veth") && c["Sandbox"].as_str().unwrap_or_default().is_empty()
        })
        .map(|(n, _)| n.clone())
        .unwrap_or_else(|| panic!("no host veth in containerd's CNI result {result}"));
    let mut nh = Handle::in_netns(&Netns::named(&node.netns).unwrap()).unwrap();
    let host = nh
        .link(&veth)
        .unwrap()
        .unwrap_or_else(|| panic!("{veth} is not in {}", node.netns));
    assert_eq!(eth0.peer, Some(host.index), "eth0's peer is not {veth}");
    let bridge = host
        .master
        .and_then(|m| nh.link_by_index(m).unwrap())
        .map(|l| l.name);
    assert_eq!(bridge.as_deref(), Some("podnet0"), "{veth}'s master");

    // 5. host-local's lease, the meta-plugin's saved delegate config and
    //    portmap's record of the hostPort (under the conflist's dataDirs)
    //    name this sandbox, and libcni cached the result.
    let data = cni.dir.join("cni");
    let lease = data
        .join("networks")
        .join(&cni.net_name)
        .join(ip.to_string());
    let text = std::fs::read_to_string(&lease)
        .unwrap_or_else(|e| panic!("host-local lease {}: {e}", lease.display()));
    assert!(
        text.starts_with(id),
        "{} names {text:?}, not sandbox {id}",
        lease.display()
    );
    let saved = data.join("podnet").join(id);
    assert!(
        saved.exists(),
        "no saved delegate config {}",
        saved.display()
    );
    let portmap = data.join("portmap").join(format!("{id}-eth0.json"));
    let mapped = std::fs::read_to_string(&portmap)
        .unwrap_or_else(|e| panic!("portmap state {}: {e}", portmap.display()));
    assert!(
        mapped.contains(&HOST_PORT.to_string()),
        "portmap recorded {mapped} for hostPort {HOST_PORT}"
    );
    let cache = Path::new("/var/lib/cni/results").join(format!("{}-{id}-eth0", cni.net_name));
    assert!(
        cache.exists(),
        "libcni cached no result at {}",
        cache.display()
    );
    Attachment {
        ip,
        netns,
        veth,
        state_files: vec![lease, saved, portmap, cache],
    }
}

/// Check 6: a pod on node2 reaches the sandbox across the overlay and the
/// sandbox reaches it, unmasqueraded both ways; the hostPort answers on
/// node1's address through portmap's DNAT.
fn check_reachability(
    lab: &podnet_lab::Lab,
    node: &podnet_lab::NodeInfo,
    peer: &podnet_lab::PodInfo,
    a: &Attachment,
) {
    let sandbox = Netns::open(&a.netns).unwrap();
    let _listener = Listener::start(&sandbox, PORT);
    let ask_from_peer = |what: &str, target: SocketAddr| {
        let who = eventually(what, SETTLE, || {
            match lab.reach(NS, PEER, target, false, PROBE) {
                Reach::Connected(w) => Ok(w),
                other => Err(format!("{other:?}")),
            }
        });
        assert_eq!(who, format!("{NS}/{POD}"), "who answered at {target}");
    };
    ask_from_peer(
        "node2's pod to reach the sandbox",
        SocketAddr::new(IpAddr::V4(a.ip), PORT),
    );
    let seen = lab
        .probe(NS, PEER, &format!("{}:{PORT}", a.ip), "clientip")
        .unwrap();
    assert_eq!(
        seen, peer.ip,
        "the sandbox saw the peer as {seen}, not its pod IP"
    );
    let peer_addr = SocketAddr::new(peer.ip.parse().unwrap(), PORT);
    let (back, peer_saw) = sandbox
        .run(|| {
            (
                serve::ask(peer_addr, false, serve::WHOAMI, PROBE),
                serve::ask(peer_addr, false, "clientip", PROBE),
            )
        })
        .unwrap();
    assert_eq!(back.unwrap(), format!("{NS}/{PEER}"), "sandbox → peer");
    assert_eq!(
        peer_saw.unwrap(),
        a.ip.to_string(),
        "the peer saw the sandbox as"
    );
    ask_from_peer(
        "node2's pod to reach the sandbox's hostPort",
        SocketAddr::new(IpAddr::V4(node.ip), HOST_PORT),
    );
    // The listener and the namespace handle close here: nothing of ours
    // may hold the namespace (and the veth in it) past the stop.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_cri_sandbox_on_podnet() {
    require_root();
    cri::require_containerd();
    let t0 = Instant::now();
    let mut lab = LabGuard::up().await;
    let st = lab.lab.state().unwrap();
    let (node1, node2) = (&st.nodes[0], &st.nodes[1]);
    let cni = NodeCni::read(&lab.lab, &node1.name);
    let (mut ctrd, mut cri) = start_containerd(&lab.lab, node1, &cni).await;
    eprintln!(
        "cri test: lab {} and containerd in {} up after {:?}",
        lab.lab.name,
        node1.netns,
        t0.elapsed()
    );

    // The kubelet's side: the Pod is in the API, bound to node1, before its
    // sandbox exists; a peer pod runs on node2.
    let client = lab.lab.kube_client().await.unwrap();
    kubelet::ensure_namespace(&client, NS).await.unwrap();
    let labels = BTreeMap::from([("app".to_string(), "cri".to_string())]);
    let pod = kubelet::pod_object(NS, POD, &node1.name, labels.clone().into(), &[]);
    kubelet::create_pod(&client, &pod).await.unwrap();
    let uid = Api::<Pod>::namespaced(client.clone(), NS)
        .get(POD)
        .await
        .unwrap()
        .metadata
        .uid
        .expect("a uid");
    let peer = lab
        .lab
        .run_pod(
            NS,
            PEER,
            Some(&node2.name),
            labels.into(),
            &[PortSpec::tcp(PORT)],
        )
        .await
        .unwrap();

    // RunPodSandbox: containerd makes the namespace and runs our conflist.
    let log_dir = ctrd.dir().join("pods").join(format!("{NS}_{POD}_{uid}"));
    let id = cri
        .runtime
        .run_pod_sandbox(crv::RunPodSandboxRequest {
            config: Some(sandbox_config(&uid, ctrd.cgroup_parent(&uid), &log_dir)),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", ctrd.log()))
        .into_inner()
        .pod_sandbox_id;
    ctrd.note_sandbox(&id);
    let (status, info) = sandbox_status(&mut cri, &id).await;
    assert_eq!(status.state, crv::PodSandboxState::SandboxReady as i32);
    let a = check_attachment(&cni, node1, &id, &status, &info);
    kubelet::set_pod_running(&client, NS, POD, (&a.ip.to_string(), None), node1.ip)
        .await
        .unwrap();
    eprintln!(
        "cri test: sandbox {id} has {} after {:?}",
        a.ip,
        t0.elapsed()
    );
    // One ADD per plugin containerd ran: loopback for its lo network, and
    // each plugin of our conflist.
    let adds = ctrd.cni_calls("ADD", &id);
    assert_eq!(
        adds,
        1 + cni.plugins.len(),
        "ADD calls for {id} (loopback + {:?}); containerd's log:\n{}",
        cni.plugins,
        ctrd.log()
    );
    assert_eq!(ctrd.cni_calls("DEL", &id), 0, "a DEL before any stop");
    check_reachability(&lab.lab, node1, &peer, &a);

    // 7. StopPodSandbox: containerd sends DEL; the address, the veth, the
    //    namespace, the hostPort and libcni's cache entry go.
    cri.runtime
        .stop_pod_sandbox(crv::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("StopPodSandbox: {e}\n{}", ctrd.log()));
    let (status, info) = sandbox_status(&mut cri, &id).await;
    assert_eq!(status.state, crv::PodSandboxState::SandboxNotready as i32);
    assert_eq!(info["netNamespaceClosed"], true, "{info}");
    assert_eq!(
        ctrd.cni_calls("DEL", &id),
        adds,
        "StopPodSandbox: one DEL per plugin that had an ADD"
    );
    for f in &a.state_files {
        assert!(!f.exists(), "{} survived DEL", f.display());
    }
    let mut nh = Handle::in_netns(&Netns::named(&node1.netns).unwrap()).unwrap();
    assert!(
        nh.link(&a.veth).unwrap().is_none(),
        "{} is still on node1 after DEL",
        a.veth
    );
    assert!(
        !a.netns.exists(),
        "containerd left the sandbox's namespace {}",
        a.netns.display()
    );
    for t in [
        SocketAddr::new(IpAddr::V4(a.ip), PORT),
        SocketAddr::new(IpAddr::V4(node1.ip), HOST_PORT),
    ] {
        let r = lab.lab.reach(NS, PEER, t, false, Duration::from_secs(1));
        assert!(
            !matches!(r, Reach::Connected(_)),
            "something still answers at {t}: {r:?}"
        );
    }

    // 8. RemovePodSandbox: containerd sends DEL again (the namespace is
    //    gone, CNI_NETNS is empty); it must succeed and leave nothing.
    cri.runtime
        .remove_pod_sandbox(crv::RemovePodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("RemovePodSandbox: {e}\n{}", ctrd.log()));
    assert_eq!(
        ctrd.cni_calls("DEL", &id),
        2 * adds,
        "RemovePodSandbox: a second DEL per plugin"
    );
    let gone = cri
        .runtime
        .pod_sandbox_status(crv::PodSandboxStatusRequest {
            pod_sandbox_id: id.clone(),
            verbose: false,
        })
        .await;
    assert_eq!(
        gone.map(|_| ()).map_err(|e| e.code()),
        Err(tonic::Code::NotFound),
        "the sandbox is still known"
    );
    let list = cri
        .runtime
        .list_pod_sandbox(crv::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .into_inner()
        .items;
    assert!(list.is_empty(), "sandboxes left: {list:?}");
    assert_eq!(
        ctrd.plugin_complaints(),
        Vec::<String>::new(),
        "our plugins warned or failed under containerd"
    );
    for f in &a.state_files {
        assert!(!f.exists(), "{} is back after the second DEL", f.display());
    }
    let left = ctrd.sandbox_leftovers();
    assert!(left.is_empty(), "containerd left: {left:?}");
    kubelet::delete_pod(&client, NS, POD).await.unwrap();

    // Down: containerd, then the lab; nothing of either stays.
    let containerd_pid = ctrd.pid();
    let dir = ctrd.dir().to_path_buf();
    let errs = ctrd.stop();
    assert!(errs.is_empty(), "stopping containerd: {errs:?}");
    assert!(ctrd.processes().is_empty(), "{:?}", ctrd.processes());
    assert!(ctrd.mounts().is_empty(), "{:?}", ctrd.mounts());
    assert!(ctrd.cgroups().is_empty(), "{:?}", ctrd.cgroups());
    drop(ctrd);
    assert!(!dir.exists(), "{} left", dir.display());
    if let Some(p) = containerd_pid {
        assert!(!Path::new(&format!("/proc/{p}")).exists());
    }
    let prefix = format!("pn-{}-", lab.lab.name);
    lab.take_down();
    let left: Vec<String> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "namespaces left: {left:?}");
    eprintln!("cri test: done in {:?}", t0.elapsed());
}
