//! The lab: a multi-node cluster on one machine, built from network
//! namespaces, running the real binaries.
//!
//! - an underlay namespace `pn-<lab>-net` holds a bridge; every node is a
//!   namespace `pn-<lab>-<node>` whose `eth0` is plugged into it, with a
//!   default route to the gateway `pn-<lab>-gw`, plugged in the same way,
//!   which forwards nothing and counts what reaches it ([`gateway`]);
//! - each node runs a real `podnet agent`; the controller runs beside them;
//! - `lab run` makes a pod: a namespace wired through the real CNI plugins
//!   (the node's conflist, run with the node as host), registered as a Pod
//!   object, with `podnet serve` answering inside it;
//! - everything the lab makes is recorded under `/run/podnet-lab/<lab>/`, so
//!   `lab down` removes it all, also after a crash.
//!
//! Two modes. Standalone (the default): objects live in the lab's store and
//! `podnet controller` does the API server's duties. Kubernetes (`--kube`):
//! a real etcd, kube-apiserver and kube-controller-manager run for the lab
//! ([`kube`]), nodes and pods are registered through the API and the lab
//! writes pod status as their kubelet ([`kubelet`]); daemons get a
//! kubeconfig instead of a store ([`Lab::daemon_args`]).
//!
//! Rolling replacements of the daemons' binaries (an upgrade or a
//! downgrade, one agent or DNS replica at a time) are [`upgrade`]'s.

pub mod coredns;
pub mod egress;
pub mod forward;
pub mod gateway;
pub mod kube;
pub mod kubelet;
pub mod kubeproxy;
pub mod realnode;
pub mod serve;
pub mod upgrade;

pub use serve::Reach;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use podnet_api::k8s_openapi::api::core::v1::{
    Namespace, PodCondition, PodIP, PodStatus, Service, ServicePort, ServiceSpec,
};
use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use podnet_api::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use podnet_api::netconfig::{self, NetworkConfig, NetworkSpec};
use podnet_api::{Kind, Object};
use podnet_cni::runtime::{Attach, Runtime};
use podnet_kernel::{Handle, Netns};
use podnet_store::{Objects, StoreError};
use serde::{Deserialize, Serialize};

pub const RUN_DIR: &str = "/run/podnet-lab";
/// The agent's capabilities in `deploy/`'s DaemonSet: CAP_NET_ADMIN.
pub const AGENT_CAPS: &[u32] = &[12];
/// Cluster DNS's capabilities in `deploy/`'s Deployment:
/// CAP_NET_BIND_SERVICE.
pub const DNS_CAPS: &[u32] = &[10];

/// Where the lab's cluster DNS lives, as in kubeadm clusters.
pub const DNS_NAMESPACE: &str = "kube-system";
pub const DNS_POD: &str = "podnet-dns";
pub const DNS_SERVICE: &str = "kube-dns";
/// Starts each run's section of a role's log (see [`Lab::log_path`]).
pub const SPAWN_MARK: &str = "=== podnet lab:";

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("{0}")]
    Msg(String),
    #[error("kernel: {0}")]
    Kernel(#[from] podnet_kernel::KernelError),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("CNI: {0}")]
    Cni(#[from] podnet_cni::CniError),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error(transparent)]
    Kube(#[from] kube::KubeError),
}

fn msg(s: impl Into<String>) -> LabError {
    LabError::Msg(s.into())
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    pub netns: String,
    pub ip: Ipv4Addr,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub netns: String,
    pub node: String,
    pub ip: String,
    pub container_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabState {
    pub name: String,
    pub backend: String,
    pub store: String,
    pub underlay_ns: String,
    pub nodes: Vec<NodeInfo>,
    pub resync_secs: u64,
    /// Kubernetes mode: a real control plane instead of the store's
    /// controller (state files from before it load as standalone).
    #[serde(default)]
    pub kube: bool,
    /// Real nodes: containerd and a kubelet per node ([`realnode`]).
    #[serde(default)]
    pub kubelet: bool,
}

/// A lab by name: where its state lives.
#[derive(Debug, Clone)]
pub struct Lab {
    pub name: String,
    pub dir: PathBuf,
    pub exe: PathBuf,
}

/// A daemon the lab runs, for [`Lab::daemon_args`].
#[derive(Debug, Clone, Copy)]
pub enum Daemon<'a> {
    /// `podnet agent` on a node.
    Agent(&'a NodeInfo),
    /// `podnet dns` in the DNS pod on `node`, forwarding to `upstreams`.
    Dns {
        node: &'a str,
        upstreams: &'a [String],
    },
}

#[derive(Debug, Clone)]
pub struct UpOptions {
    pub nodes: usize,
    pub backend: String,
    pub store: Option<String>,
    pub resync_secs: u64,
    /// Run a real etcd, kube-apiserver and kube-controller-manager, and
    /// register nodes and pods through the API ([`kube`], [`kubelet`]).
    pub kube: bool,
    /// In Kubernetes mode, start the agents and cluster DNS. Without them
    /// the lab writes each node's CNI files from its podCIDR itself, so
    /// pods still get addresses (the control-plane and kubelet duties can
    /// be tested on their own).
    pub kube_agents: bool,
    /// Cluster DNS replicas, one pod per node in turn (0 and 1: the one
    /// `kube-system/podnet-dns` on the first node). More than one needs
    /// Kubernetes mode, for rolling replacements ([`upgrade`]).
    pub dns_replicas: usize,
    /// Real nodes ([`realnode`]): a containerd and a kubelet per node and a
    /// kube-scheduler; the lab starts nothing of podnet (Kubernetes mode).
    pub kubelet: bool,
    /// With `kubelet`: image archives every node's containerd imports.
    pub images: Vec<PathBuf>,
    /// The binary the agents and DNS run instead of the lab's own (an
    /// older podnet, for upgrade tests); everything else runs the lab's.
    pub daemon_exe: Option<PathBuf>,
}

fn io(what: impl Into<String>, e: std::io::Error) -> LabError {
    LabError::Io(what.into(), e)
}

impl Lab {
    pub fn new(name: &str, exe: PathBuf) -> Result<Lab, LabError> {
        let ok = !name.is_empty()
            && name.len() <= 8
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if !ok {
            return Err(msg(format!(
                "invalid lab name {name:?}: 1-8 lowercase letters or digits"
            )));
        }
        Ok(Lab {
            name: name.to_string(),
            dir: Path::new(RUN_DIR).join(name),
            exe,
        })
    }

    fn ns_name(&self, what: &str) -> String {
        format!("pn-{}-{what}", self.name)
    }

    /// The namespace of the nodes' default gateway ([`gateway`]).
    pub fn gateway_ns(&self) -> String {
        self.ns_name("gw")
    }

    fn state_path(&self) -> PathBuf {
        self.dir.join("lab.json")
    }

    pub fn state(&self) -> Result<LabState, LabError> {
        let b = std::fs::read(self.state_path())
            .map_err(|_| msg(format!("lab {:?} is not up (podnet lab up)", self.name)))?;
        serde_json::from_slice(&b)
            .map_err(|e| msg(format!("corrupt {}: {e}", self.state_path().display())))
    }

    fn save(&self, s: &LabState) -> Result<(), LabError> {
        std::fs::write(
            self.state_path(),
            serde_json::to_vec_pretty(s).expect("json"),
        )
        .map_err(|e| io("writing lab state", e))
    }

    fn node_dir(&self, node: &str) -> PathBuf {
        self.dir.join("nodes").join(node)
    }

    pub fn bin_dir(&self) -> PathBuf {
        self.dir.join("bin")
    }

    /// Where role `role` logs: `logs/<role>.log` in the lab directory.
    pub fn log_path(&self, role: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{role}.log"))
    }

    /// Starts a detached `podnet` process (optionally inside a namespace);
    /// see [`spawn_logged`].
    fn spawn(
        &self,
        role: &str,
        ns: Option<&str>,
        args: &[String],
        env: &[(&str, String)],
    ) -> Result<u32, LabError> {
        let mut cmd = Command::new(self.role_exe(role));
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        spawn_logged(&self.dir, role, &mut cmd, ns)
    }

    /// [`Lab::spawn`] for a daemon that `deploy/` runs with only the
    /// capabilities `keep`: the lab runs it so too (root, with every other
    /// capability gone from its bounding set, so its permitted set is
    /// `keep`), so every lab test checks the manifests' privilege claims.
    fn spawn_daemon(
        &self,
        role: &str,
        ns: Option<&str>,
        args: &[String],
        keep: &'static [u32],
    ) -> Result<u32, LabError> {
        let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(40);
        let mut cmd = Command::new(self.role_exe(role));
        cmd.args(args);
        // SAFETY: prctl(2) only, between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                for cap in (0..=last).filter(|c| !keep.contains(c)) {
                    if libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            })
        };
        spawn_logged(&self.dir, role, &mut cmd, ns)
    }

    /// Whether the recorded process of `role` still runs.
    fn role_alive(&self, role: &str) -> bool {
        std::fs::read_to_string(self.dir.join("pids").join(role))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .is_some_and(alive)
    }

    fn kill_role(&self, role: &str) {
        let p = self.dir.join("pids").join(role);
        if let Some(pid) = std::fs::read_to_string(&p)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            kill_wait(pid);
        }
        let _ = std::fs::remove_file(p);
    }

    /// The command line of a lab daemon, in both modes: the one place to
    /// change how agents and DNS are started. Standalone, they read the
    /// lab's store (`--store`); in Kubernetes mode, the API through their
    /// node's kubeconfig (`--kubeconfig`, see [`Lab::node_kubeconfig`]).
    pub fn daemon_args(&self, st: &LabState, daemon: Daemon<'_>) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        if !st.kube {
            a.extend(["--store".into(), st.store.clone()]);
        }
        let source = |a: &mut Vec<String>, kubeconfig: PathBuf| {
            if st.kube {
                a.push("--kubeconfig".into());
                a.push(kubeconfig.display().to_string());
                a.push("--net-conf".into());
                a.push(self.net_conf_path().display().to_string());
            }
        };
        match daemon {
            Daemon::Agent(node) => {
                let d = self.node_dir(&node.name);
                a.push("agent".into());
                source(&mut a, self.node_kubeconfig(&node.name));
                a.extend([
                    "--node".into(),
                    node.name.clone(),
                    "--iface".into(),
                    "eth0".into(),
                    "--subnet-file".into(),
                    d.join("subnet.env").display().to_string(),
                    "--cni-conf-dir".into(),
                    d.join("net.d").display().to_string(),
                    "--cni-data-dir".into(),
                    d.join("cni").display().to_string(),
                    "--resync".into(),
                    st.resync_secs.to_string(),
                    "--metrics-addr".into(),
                    "127.0.0.1:10249".into(),
                ]);
            }
            Daemon::Dns { node: _, upstreams } => {
                a.push("dns".into());
                source(&mut a, self.dns_kubeconfig());
                a.extend([
                    "--listen".into(),
                    "0.0.0.0:53".into(),
                    "--metrics-addr".into(),
                    "127.0.0.1:9153".into(),
                    format!("--upstream={}", upstreams.join(",")),
                    "--upstream-timeout-ms".into(),
                    "1000".into(),
                ]);
            }
        }
        a
    }

    fn agent_args(&self, st: &LabState, node: &NodeInfo) -> Vec<String> {
        self.daemon_args(st, Daemon::Agent(node))
    }

    /// The kubeconfig of node `node`'s daemons in Kubernetes mode:
    /// `<lab dir>/nodes/<node>/kubeconfig`. It names the apiserver at
    /// 127.0.0.1:<port>, which a forwarder serves inside the node's (and
    /// the DNS pod's) namespace.
    pub fn node_kubeconfig(&self, node: &str) -> PathBuf {
        self.node_dir(node).join("kubeconfig")
    }

    /// The kubeconfig of cluster DNS in Kubernetes mode, as ServiceAccount
    /// `kube-system/podnet-dns`: `<lab dir>/dns-kubeconfig`.
    pub fn dns_kubeconfig(&self) -> PathBuf {
        self.dir.join("dns-kubeconfig")
    }

    /// The network config of a Kubernetes-mode lab's daemons (flannel's
    /// net-conf.json fields): `<lab dir>/net-conf.json`.
    pub fn net_conf_path(&self) -> PathBuf {
        self.dir.join("net-conf.json")
    }

    /// The admin kubeconfig of a Kubernetes-mode lab, for kubectl:
    /// `<lab dir>/kubeconfig`.
    pub fn kubeconfig(&self) -> Result<PathBuf, LabError> {
        if !self.state()?.kube {
            return Err(msg(format!(
                "lab {:?} runs no Kubernetes control plane (podnet lab up --kube)",
                self.name
            )));
        }
        Ok(kube::ControlPlane::open(&self.dir)?.admin_kubeconfig())
    }

    /// An admin client of a Kubernetes-mode lab's apiserver.
    pub async fn kube_client(&self) -> Result<::kube::Client, LabError> {
        Ok(kube::ControlPlane::open(&self.dir)?.client().await?)
    }

    fn start_agent(&self, st: &LabState, node: &NodeInfo) -> Result<(), LabError> {
        // An etcd on this machine's loopback is reached through a forwarder.
        self.ensure_forwarder(st, &format!("forward-{}", node.name), &node.netns)?;
        self.spawn_daemon(
            &format!("agent-{}", node.name),
            Some(&node.netns),
            &self.agent_args(st, node),
            AGENT_CAPS,
        )?;
        Ok(())
    }

    /// Adds one node: its namespace, its underlay link, its agent.
    fn add_node_ns(&self, st: &mut LabState, index: usize) -> Result<NodeInfo, LabError> {
        let name = format!("node{index}");
        let netns = self.ns_name(&name);
        let ip = gateway::node_ip(index)?;
        let ns = Netns::create_named(&netns)?;
        let under = Netns::named(&st.underlay_ns)?;
        let mut uh = Handle::in_netns(&under)?;
        let port = format!("to-{name}");
        uh.create_veth(&port, "eth0", Some(ns.fd()), None, None)?;
        let br = uh.require_link(gateway::BRIDGE)?;
        let p = uh.require_link(&port)?;
        uh.set_master(p.index, br.index)?;
        uh.set_up(p.index)?;
        let mut nh = Handle::in_netns(&ns)?;
        let e = nh.require_link("eth0")?;
        nh.add_addr(
            e.index,
            ipnet::IpNet::V4(
                ipnet::Ipv4Net::new(ip, gateway::underlay().prefix_len()).expect("prefix"),
            ),
            true,
        )?;
        nh.set_up(e.index)?;
        // As on a real node, what nothing here handles leaves by default.
        nh.add_route(&gateway::default_route(e.index))?;
        std::fs::create_dir_all(self.node_dir(&name)).map_err(|e| io("creating node dir", e))?;
        let info = NodeInfo { name, netns, ip };
        st.nodes.push(info.clone());
        Ok(info)
    }

    async fn objects(&self, st: &LabState) -> Result<Objects, LabError> {
        Ok(Objects::new(podnet_store::open(&st.store).await?))
    }

    /// Waits until `node` has its subnet.env and routes to every other node.
    fn wait_node_ready(
        &self,
        st: &LabState,
        node: &NodeInfo,
        deadline: Instant,
    ) -> Result<(), LabError> {
        let want = if st.backend == "udp" {
            1
        } else {
            st.nodes.len().saturating_sub(1)
        };
        loop {
            let env_ok = self.node_dir(&node.name).join("subnet.env").exists();
            let routes = Netns::named(&node.netns)?.run(
                || -> Result<usize, podnet_kernel::KernelError> {
                    let mut h = Handle::new()?;
                    Ok(h.routes(false, None)?
                        .into_iter()
                        .filter(|r| r.protocol == Some(112))
                        .count())
                },
            )??;
            if env_ok && routes >= want {
                return Ok(());
            }
            // In Kubernetes mode an agent that exits says why at once (the
            // daemons' --kubeconfig support may lag the lab's).
            if st.kube && !self.role_alive(&format!("agent-{}", node.name)) {
                return Err(msg(format!(
                    "the agent on {} exited; see {}",
                    node.name,
                    self.log_path(&format!("agent-{}", node.name)).display()
                )));
            }
            if Instant::now() > deadline {
                return Err(msg(format!(
                    "node {} not ready after waiting (subnet.env: {env_ok}, routes {routes}/{want}); see {}",
                    node.name,
                    self.log_path(&format!("agent-{}", node.name)).display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub async fn up(&self, o: &UpOptions) -> Result<LabState, LabError> {
        if self.state_path().exists() {
            return Err(msg(format!(
                "lab {:?} is already up; run `podnet lab down` first",
                self.name
            )));
        }
        if !(1..=50).contains(&o.nodes) {
            return Err(msg(format!("--nodes {}: between 1 and 50", o.nodes)));
        }
        let bt = netconfig::BackendType::parse(&o.backend).ok_or_else(|| {
            msg(format!(
                "unknown backend {:?} (vxlan, host-gw, udp)",
                o.backend
            ))
        })?;
        let _ = bt;
        if o.kube && o.store.is_some() {
            return Err(msg(
                "--store and --kube: a Kubernetes-mode lab keeps its objects in its own etcd",
            ));
        }
        upgrade::check_options(o)?;
        // The Kubernetes binaries are found before anything is made.
        if o.kubelet && !o.kube {
            return Err(msg("--kubelet: real nodes need Kubernetes mode (--kube)"));
        }
        let peers = match o.kube {
            true => Some(kube::Peers::find()?),
            false => None,
        };
        let node_peers = match o.kubelet {
            true => Some(realnode::NodePeers::find()?),
            false => None,
        };
        for i in &o.images {
            if !i.is_file() {
                return Err(msg(format!("--image {}: no such file", i.display())));
            }
        }
        // Leftovers of a crashed lab of the same name go first.
        self.down()?;
        for d in ["logs", "pids", "nodes", "pods"] {
            std::fs::create_dir_all(self.dir.join(d))
                .map_err(|e| io(format!("creating {}", self.dir.display()), e))?;
        }
        let r = match self.record_daemon_exe(o) {
            Ok(()) => self.up_inner(o, peers, node_peers).await,
            Err(e) => Err(e),
        };
        match r {
            Ok(st) => Ok(st),
            Err(e) => {
                // The logs say why; they outlive the lab they describe.
                let kept = self.keep_logs();
                let _ = self.down();
                Err(match kept {
                    Some(d) => msg(format!("{e} (the lab's logs are in {})", d.display())),
                    None => e,
                })
            }
        }
    }

    /// Copies the lab's logs out of its directory (which `down` removes),
    /// to `/tmp/podnet-lab-<name>-logs/`.
    fn keep_logs(&self) -> Option<PathBuf> {
        let to = std::env::temp_dir().join(format!("podnet-lab-{}-logs", self.name));
        let _ = std::fs::remove_dir_all(&to);
        std::fs::create_dir_all(&to).ok()?;
        for e in std::fs::read_dir(self.dir.join("logs")).ok()?.flatten() {
            let _ = std::fs::copy(e.path(), to.join(e.file_name()));
        }
        Some(to)
    }

    async fn up_inner(
        &self,
        o: &UpOptions,
        peers: Option<kube::Peers>,
        node_peers: Option<realnode::NodePeers>,
    ) -> Result<LabState, LabError> {
        let store = o
            .store
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", self.dir.join("state.db").display()));
        let mut st = LabState {
            name: self.name.clone(),
            backend: o.backend.clone(),
            store,
            underlay_ns: self.ns_name("net"),
            nodes: vec![],
            resync_secs: o.resync_secs,
            kube: o.kube,
            kubelet: o.kubelet,
        };
        // The underlay: one bridge in its own namespace, and the nodes'
        // gateway on it (no uplink: nothing leaves the machine).
        let under = Netns::create_named(&st.underlay_ns)?;
        let mut uh = Handle::in_netns(&under)?;
        uh.create_bridge(gateway::BRIDGE, None, None)?;
        uh.set_up_by_name(gateway::BRIDGE)?;
        let gw = Netns::create_named(&self.gateway_ns())?;
        gateway::install(&under, &gw)?;
        self.save(&st)?;
        self.link_plugins()?;
        if let (Some(peers), Some(np)) = (&peers, &node_peers) {
            return self.up_kubelets(st, o, peers, np).await;
        }
        if let Some(peers) = peers {
            return self.up_kube(st, o, &peers).await;
        }

        // Cluster config.
        let objs = self.objects(&st).await?;
        let cfg = NetworkConfig {
            api_version: netconfig::API_VERSION.into(),
            kind: "NetworkConfig".into(),
            metadata: ObjectMeta {
                name: Some(netconfig::DEFAULT_NAME.into()),
                ..Default::default()
            },
            spec: NetworkSpec {
                network: Some(netconfig::DEFAULT_NETWORK.into()),
                subnet_len: Some(24),
                backend: netconfig::Backend {
                    backend_type: Some(o.backend.clone()),
                    ..Default::default()
                },
                ..Default::default()
            },
        };
        upsert(&objs, Object::NetworkConfig(Box::new(cfg))).await?;

        // The controller, then the nodes and their agents.
        self.spawn(
            "controller",
            None,
            &[
                "--store".into(),
                st.store.clone(),
                "controller".into(),
                "--metrics-addr".into(),
                "127.0.0.1:0".into(),
            ],
            &[],
        )?;
        for i in 1..=o.nodes {
            self.add_node_ns(&mut st, i)?;
        }
        self.save(&st)?;
        for n in &st.nodes {
            self.start_agent(&st, n)?;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for n in &st.nodes {
            self.wait_node_ready(&st, n, deadline)?;
        }
        self.start_dns(&st, true).await?;
        Ok(st)
    }

    /// The CNI plugins: links to this binary in the lab's bin dir.
    fn link_plugins(&self) -> Result<(), LabError> {
        let bin = self.bin_dir();
        std::fs::create_dir_all(&bin).map_err(|e| io("creating bin dir", e))?;
        for name in podnet_cni::plugins::NAMES {
            let dst = bin.join(name);
            let _ = std::fs::remove_file(&dst);
            std::os::unix::fs::symlink(&self.exe, &dst)
                .map_err(|e| io(format!("linking {}", dst.display()), e))?;
        }
        Ok(())
    }

    /// `lab up --kube` after the underlay: the control plane, the Node
    /// objects and their podCIDRs, the kube-dns Service, then agents (or,
    /// without them, each node's CNI files from its podCIDR) and DNS.
    async fn up_kube(
        &self,
        mut st: LabState,
        o: &UpOptions,
        peers: &kube::Peers,
    ) -> Result<LabState, LabError> {
        let cp = kube::ControlPlane::start(&self.dir, peers).await?;
        // The agents' and DNS's network config, as flannel's net-conf.json
        // (kube-controller-manager's --cluster-cidr is the Network).
        let conf = serde_json::json!({
            "Network": kube::CLUSTER_CIDR,
            "SubnetLen": 24,
            "Backend": {"Type": st.backend},
            "ServiceCIDR": kube::SERVICE_CIDR,
        });
        std::fs::write(self.net_conf_path(), conf.to_string())
            .map_err(|e| io("writing the lab's net-conf.json", e))?;
        let c = cp.client().await?;
        // The daemons' identities and rights, exactly as deploy/ ships them.
        kube::apply_rbac(&c, kube::AGENT_RBAC).await?;
        kube::apply_rbac(&c, kube::AGENT_ADMISSION).await?;
        kube::apply_rbac(&c, kube::DNS_RBAC).await?;
        cp.write_service_account_kubeconfig(&c, kube::DNS_ACCOUNT, None, &self.dns_kubeconfig())
            .await?;
        // kube-dns first, so no other Service can take its address.
        kubelet::ensure_namespace(&c, DNS_NAMESPACE).await?;
        let dns_ip: IpAddr = netconfig::DEFAULT_DNS_IP.parse().expect("default IP");
        kubelet::ensure_service(&c, &dns_service(dns_ip, dns_labels())).await?;
        for i in 1..=o.nodes {
            self.add_node_ns(&mut st, i)?;
        }
        self.save(&st)?;
        for n in &st.nodes {
            kubelet::register_node(&c, &n.name, n.ip).await?;
            // The node's kubeconfig works inside its namespace from now on,
            // agent or not.
            cp.write_service_account_kubeconfig(
                &c,
                kube::AGENT_ACCOUNT,
                Some(&n.name),
                &self.node_kubeconfig(&n.name),
            )
            .await?;
            self.ensure_forwarder(&st, &format!("forward-{}", n.name), &n.netns)?;
        }
        self.forward_apiserver_at_gateway(&cp)?;
        let names: Vec<String> = st.nodes.iter().map(|n| n.name.clone()).collect();
        let cidrs =
            kubelet::wait_pod_cidrs(&c, &names, Instant::now() + Duration::from_secs(60)).await?;
        if o.kube_agents {
            for n in &st.nodes {
                self.start_agent(&st, n)?;
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            for n in &st.nodes {
                self.wait_node_ready(&st, n, deadline)?;
            }
        } else {
            for n in &st.nodes {
                self.write_cni_files(n, cidrs[&n.name])?;
            }
        }
        self.start_dns(&st, o.kube_agents).await?;
        if o.kube_agents {
            self.start_dns_replicas(&st, o.dns_replicas).await?;
        }
        Ok(st)
    }

    /// The `kubernetes` Service's endpoint, and where real kubelets find
    /// the API: the gateway, forwarding to the apiserver here.
    fn forward_apiserver_at_gateway(&self, cp: &kube::ControlPlane) -> Result<(), LabError> {
        let api = cp.advertised_addr();
        let args = [
            "lab".to_string(),
            "--name".into(),
            self.name.clone(),
            "forward".into(),
            self.gateway_ns(),
            format!("{api}={}", cp.apiserver_addr()),
        ];
        self.spawn("forward-gw", None, &args, &[])?;
        let gw = Netns::named(&self.gateway_ns())?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while gw
            .run(|| std::net::TcpStream::connect(api.as_str()))?
            .is_err()
        {
            if Instant::now() > deadline {
                return Err(msg(
                    "the apiserver's forwarder in the gateway did not start",
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// What a node's agent writes for the CNI side (subnet.env and the
    /// conflist), written by the lab for a node that runs no agent.
    fn write_cni_files(&self, node: &NodeInfo, subnet: ipnet::Ipv4Net) -> Result<(), LabError> {
        use podnet_overlay::files;
        let d = self.node_dir(&node.name);
        let network: ipnet::Ipv4Net = kube::CLUSTER_CIDR.parse().expect("cluster CIDR");
        let subnet_file = d.join("subnet.env");
        files::write_if_changed(
            &subnet_file,
            &files::subnet_env(network, subnet, 1450, true),
        )
        .map_err(|e| io(format!("writing {}", subnet_file.display()), e))?;
        let mut list = files::conflist(&subnet_file, Some(&d.join("cni")));
        // No agent runs here (yet): ADD must not wait for one. The agent,
        // once started, writes its own conflist, which requires it.
        list["plugins"][0]["requireAgent"] = serde_json::json!(false);
        let p = d.join("net.d").join(files::CONFLIST_NAME);
        files::write_if_changed(&p, &serde_json::to_string_pretty(&list).expect("json"))
            .map_err(|e| io(format!("writing {}", p.display()), e))?;
        Ok(())
    }

    /// Starts a forwarder into `netns` when its daemons need this machine's
    /// loopback: the store's etcd there, or the lab's kube-apiserver
    /// (recorded as role `role`).
    fn ensure_forwarder(&self, st: &LabState, role: &str, netns: &str) -> Result<(), LabError> {
        let mut eps = if st.kube {
            vec![]
        } else {
            forward::etcd_endpoints(&st.store)
        };
        if st.kube {
            eps.push(kube::ControlPlane::open(&self.dir)?.apiserver_addr());
        }
        if eps.is_empty() || self.dir.join("pids").join(role).exists() {
            return Ok(());
        }
        let mut args = vec![
            "lab".to_string(),
            "--name".into(),
            self.name.clone(),
            "forward".into(),
            netns.to_string(),
        ];
        args.extend(eps.iter().cloned());
        self.spawn(role, None, &args, &[])?;
        // Ready when the listener answers inside the namespace.
        let ns = Netns::named(netns)?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while ns
            .run(|| std::net::TcpStream::connect(eps[0].as_str()))?
            .is_err()
        {
            if Instant::now() > deadline {
                return Err(msg(format!("forwarder into {netns} did not start")));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Cluster DNS the way clusters run CoreDNS: a `podnet dns` process in
    /// a pod (`kube-system/podnet-dns`, labelled `k8s-app=kube-dns`) on the
    /// first node, and the Service `kube-system/kube-dns` at the DNS service
    /// IP selecting it, so pods reach it through the agents' service proxy.
    /// Without `run_server` only the pod is made (Kubernetes mode without
    /// agents, where the Service's endpoints are what is tested).
    async fn start_dns(&self, st: &LabState, run_server: bool) -> Result<(), LabError> {
        let Some(node) = st.nodes.first() else {
            return Ok(());
        };
        let labels = dns_labels();
        let pod = self
            .run_pod(
                DNS_NAMESPACE,
                DNS_POD,
                Some(&node.name),
                labels.clone(),
                &[],
            )
            .await?;
        if !run_server {
            return Ok(());
        }
        self.ensure_forwarder(st, "forward-dns", &pod.netns)?;
        let upstreams = upgrade::dns_upstreams();
        self.spawn_daemon(
            "dns",
            Some(&pod.netns),
            &self.daemon_args(
                st,
                Daemon::Dns {
                    node: &node.name,
                    upstreams: &upstreams,
                },
            ),
            DNS_CAPS,
        )?;
        let (dns_ip, zone) = if st.kube {
            // The Service was made with the control plane (`up_kube`).
            (
                netconfig::DEFAULT_DNS_IP.parse().expect("default IP"),
                netconfig::DEFAULT_ZONE.to_string(),
            )
        } else {
            self.standalone_dns_service(st, labels).await?
        };
        // Ready when it answers on the pod IP, then through the Service.
        let probe = format!("dns-version.{zone}");
        let node_ns = Netns::named(&node.netns)?;
        let pod_ip: IpAddr = pod
            .ip
            .parse()
            .map_err(|_| msg(format!("DNS pod has no IP ({:?})", pod.ip)))?;
        let deadline = Instant::now() + Duration::from_secs(15);
        while !node_ns.run(|| dns_answers(SocketAddr::new(pod_ip, 53), &probe))? {
            if Instant::now() > deadline {
                return Err(msg(format!(
                    "cluster DNS did not answer on {pod_ip}; see {}",
                    self.log_path("dns").display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Through the Service from a pod (the DNS pod itself, hairpinned:
        // a node namespace has no route to the service CIDR).
        let pod_ns = Netns::named(&pod.netns)?;
        let deadline = Instant::now() + Duration::from_secs(15);
        while !pod_ns.run(|| dns_answers(SocketAddr::new(dns_ip, 53), &probe))? {
            if Instant::now() > deadline {
                tracing::warn!(
                    "cluster DNS answers on {pod_ip} but not yet through the Service {dns_ip}"
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Standalone: the cluster DNS address and zone from the store's
    /// NetworkConfig, and the kube-dns Service there.
    async fn standalone_dns_service(
        &self,
        st: &LabState,
        labels: BTreeMap<String, String>,
    ) -> Result<(IpAddr, String), LabError> {
        let objs = self.objects(st).await?;
        let (dns_ip, zone) = match objs
            .get(Kind::NetworkConfig, None, netconfig::DEFAULT_NAME)
            .await?
        {
            Some(Object::NetworkConfig(c)) => c
                .resolve()
                .map(|r| (r.dns_service_ip, r.cluster_domain))
                .map_err(|(f, m)| msg(format!("NetworkConfig {f}: {m}")))?,
            _ => (
                netconfig::DEFAULT_DNS_IP.parse().expect("default IP"),
                netconfig::DEFAULT_ZONE.to_string(),
            ),
        };
        let svc = dns_service(dns_ip, labels);
        if objs
            .get(Kind::Service, Some(DNS_NAMESPACE), DNS_SERVICE)
            .await?
            .is_none()
        {
            let ops = podnet_apiserver::alloc::transition(None, Some(&svc));
            objs.create(Object::Service(Box::new(svc)), ops).await?;
        }
        Ok((dns_ip, zone))
    }

    /// Adds a node to a running lab.
    pub fn add_node(&self) -> Result<NodeInfo, LabError> {
        let mut st = self.state()?;
        if st.kube {
            return Err(msg("add-node is not supported in a --kube lab yet"));
        }
        let next = next_node_index(&st);
        let n = self.add_node_ns(&mut st, next)?;
        self.save(&st)?;
        self.start_agent(&st, &n)?;
        self.wait_node_ready(&st, &n, Instant::now() + Duration::from_secs(30))?;
        Ok(n)
    }

    /// Kubernetes mode: adds a node with no network daemon yet, as a
    /// kubelet joins a cluster: its namespace and underlay link, its Node
    /// object, its kubeconfig and forwarder, and (once kube-controller-
    /// manager gave it a podCIDR) the CNI files a daemon would write, so
    /// pods can start on it. The caller then starts the node's network
    /// daemon (`restart_agent`, or another one such as flanneld) and times
    /// how soon the node's pods are reachable (`flannel-bench`).
    pub async fn add_kube_node_without_agent(&self) -> Result<NodeInfo, LabError> {
        let mut st = self.state()?;
        if !st.kube {
            return Err(msg("add_kube_node_without_agent: a --kube lab only"));
        }
        let next = next_node_index(&st);
        let n = self.add_node_ns(&mut st, next)?;
        self.save(&st)?;
        let cp = kube::ControlPlane::open(&self.dir)?;
        let c = cp.client().await?;
        kubelet::register_node(&c, &n.name, n.ip).await?;
        cp.write_service_account_kubeconfig(
            &c,
            kube::AGENT_ACCOUNT,
            Some(&n.name),
            &self.node_kubeconfig(&n.name),
        )
        .await?;
        self.ensure_forwarder(&st, &format!("forward-{}", n.name), &n.netns)?;
        let cidrs = kubelet::wait_pod_cidrs(
            &c,
            std::slice::from_ref(&n.name),
            Instant::now() + Duration::from_secs(60),
        )
        .await?;
        self.write_cni_files(&n, cidrs[&n.name])?;
        Ok(n)
    }

    /// Removes a node: stops its agent, runs `agent --cleanup` (which gives
    /// its subnet back), and deletes its namespace.
    pub fn remove_node(&self, node: &str) -> Result<(), LabError> {
        if self.state()?.kube {
            return Err(msg("remove-node is not supported in a --kube lab yet"));
        }
        self.stop_agent(node, true)?;
        let mut st = self.state()?;
        let n = st
            .nodes
            .iter()
            .find(|n| n.name == node)
            .cloned()
            .ok_or_else(|| msg(format!("no node {node:?} in lab {}", self.name)))?;
        self.kill_role(&format!("forward-{node}"));
        Netns::delete_named(&n.netns)?;
        if let Ok(u) = Netns::named(&st.underlay_ns) {
            if let Ok(mut h) = Handle::in_netns(&u) {
                let _ = h.delete_link_by_name(&format!("to-{node}"));
            }
        }
        st.nodes.retain(|x| x.name != node);
        self.save(&st)
    }

    /// Stops a node's agent (SIGTERM: the data plane stays) and, with
    /// `cleanup`, runs `agent --cleanup` there, which removes everything
    /// the agent installed and gives the node's subnet back. The node's
    /// namespace stays, so what is left can be inspected.
    pub fn stop_agent(&self, node: &str, cleanup: bool) -> Result<Vec<String>, LabError> {
        let st = self.state()?;
        let n = st
            .nodes
            .iter()
            .find(|n| n.name == node)
            .cloned()
            .ok_or_else(|| msg(format!("no node {node:?} in lab {}", self.name)))?;
        self.kill_role(&format!("agent-{node}"));
        if !cleanup {
            return Ok(vec![]);
        }
        let mut args = self.agent_args(&st, &n);
        args.push("--cleanup".into());
        let out = Netns::named(&n.netns)?
            .run(|| Command::new(&self.exe).args(&args).output())?
            .map_err(|e| io("running agent --cleanup", e))?;
        if !out.status.success() {
            return Err(msg(format!(
                "agent --cleanup on {node}: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect())
    }

    /// Kubernetes mode: kills the API server (SIGKILL) and starts it again,
    /// returning once it is ready (`/readyz`); the daemons must find it
    /// again by themselves.
    pub async fn restart_apiserver(&self) -> Result<(), LabError> {
        if !self.state()?.kube {
            return Err(msg("restart-apiserver: a --kube lab only"));
        }
        kube::ControlPlane::open(&self.dir)?
            .restart_apiserver()
            .await?;
        Ok(())
    }

    /// Kills a node's agent hard (SIGKILL) and starts it again.
    pub fn restart_agent(&self, node: &str) -> Result<(), LabError> {
        let st = self.state()?;
        let n = st
            .nodes
            .iter()
            .find(|n| n.name == node)
            .cloned()
            .ok_or_else(|| msg(format!("no node {node:?}")))?;
        let p = self.dir.join("pids").join(format!("agent-{node}"));
        if let Some(pid) = std::fs::read_to_string(&p)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            wait_gone(pid);
        }
        self.start_agent(&st, &n)
    }

    fn pod_file(&self, ns: &str, pod: &str) -> PathBuf {
        self.dir.join("pods").join(format!("{ns}_{pod}.json"))
    }

    pub fn pod(&self, ns: &str, pod: &str) -> Result<PodInfo, LabError> {
        let b = std::fs::read(self.pod_file(ns, pod))
            .map_err(|_| msg(format!("no pod {ns}/{pod} in lab {}", self.name)))?;
        serde_json::from_slice(&b).map_err(|e| msg(format!("corrupt pod record: {e}")))
    }

    /// Creates a pod on a node through the real CNI plugins, in a kubelet's
    /// order, in both modes: the Pod object first (namespace created if
    /// absent; bound to its node, labels, named container ports, no
    /// status), so whatever runs at CNI ADD (a policy agent) finds it; then
    /// the sandbox; then the status (IP, Running, Ready). Through the API in
    /// Kubernetes mode, in the store otherwise. On failure the sandbox and
    /// the object are removed again.
    pub async fn run_pod(
        &self,
        ns: &str,
        pod: &str,
        node: Option<&str>,
        labels: BTreeMap<String, String>,
        ports: &[serve::PortSpec],
    ) -> Result<PodInfo, LabError> {
        let st = self.state()?;
        if self.pod_file(ns, pod).exists() {
            return Err(msg(format!("pod {ns}/{pod} already exists")));
        }
        let n = match node {
            Some(want) => st
                .nodes
                .iter()
                .find(|n| n.name == want)
                .cloned()
                .ok_or_else(|| msg(format!("no node {want:?}")))?,
            None => {
                let count = std::fs::read_dir(self.dir.join("pods"))
                    .map(|r| r.count())
                    .unwrap_or(0);
                st.nodes
                    .get(count % st.nodes.len().max(1))
                    .cloned()
                    .ok_or_else(|| msg("the lab has no nodes"))?
            }
        };
        let api = match st.kube {
            true => PodApi::Kube(self.kube_client().await?),
            false => PodApi::Store(self.objects(&st).await?),
        };
        let obj = kubelet::pod_object(ns, pod, &n.name, labels, ports);
        match &api {
            PodApi::Kube(c) => {
                kubelet::ensure_namespace(c, ns).await?;
                kubelet::create_pod(c, &obj).await?;
            }
            PodApi::Store(objs) => {
                ensure_store_namespace(objs, ns).await?;
                upsert(objs, Object::Pod(Box::new(obj))).await?;
            }
        }
        let r = self.start_pod(ns, pod, &n, ports, &api).await;
        if r.is_err() {
            if self.pod_file(ns, pod).exists() {
                let _ = self.remove_sandbox(&st, ns, pod);
            }
            let _ = api.delete_pod(ns, pod).await;
        }
        r
    }

    /// The sandbox of a pod on node `n`: namespace, CNI, DNS config,
    /// server; then the status of its object, which exists already.
    async fn start_pod(
        &self,
        ns: &str,
        pod: &str,
        n: &NodeInfo,
        ports: &[serve::PortSpec],
        api: &PodApi,
    ) -> Result<PodInfo, LabError> {
        let netns = format!("pn-{}-p{}", self.name, short_hash(&format!("{ns}/{pod}")));
        let pns = Netns::create_named(&netns)?;
        let container_id = format!("lab-{}-{ns}-{pod}", self.name);
        let list_path = self
            .node_dir(&n.name)
            .join("net.d")
            .join("10-podnet.conflist");
        let list: serde_json::Value = match std::fs::read(&list_path)
            .map_err(|e| io(format!("reading {}", list_path.display()), e))
            .and_then(|b| {
                serde_json::from_slice(&b).map_err(|e| msg(format!("{}: {e}", list_path.display())))
            }) {
            Ok(l) => l,
            Err(e) => {
                let _ = Netns::delete_named(&netns);
                return Err(e);
            }
        };
        let rt = Runtime::new(self.bin_dir()).in_netns(Path::new("/run/netns").join(&n.netns));
        let attach = Attach {
            container_id: container_id.clone(),
            netns: pns.path().display().to_string(),
            ifname: "eth0".into(),
            args: format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={pod}"),
            ..Default::default()
        };
        let res = match rt.add_list(&list, &attach) {
            Ok(r) => r,
            Err(e) => {
                let _ = Netns::delete_named(&netns);
                return Err(e.into());
            }
        };
        let ip = res["ips"][0]["address"]
            .as_str()
            .unwrap_or_default()
            .split('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let info = PodInfo {
            namespace: ns.into(),
            name: pod.into(),
            netns: netns.clone(),
            node: n.name.clone(),
            ip: ip.clone(),
            container_id,
        };
        std::fs::write(
            self.pod_file(ns, pod),
            serde_json::to_vec_pretty(&info).expect("json"),
        )
        .map_err(|e| io("writing pod record", e))?;

        // Cluster DNS for `lab exec` (ip netns exec bind-mounts this file).
        let config = match api {
            PodApi::Store(objs) => {
                objs.get(Kind::NetworkConfig, None, netconfig::DEFAULT_NAME)
                    .await?
            }
            PodApi::Kube(_) => None,
        };
        let (dns_ip, zone) = match config {
            Some(Object::NetworkConfig(c)) => c
                .resolve()
                .map(|r| (r.dns_service_ip.to_string(), r.cluster_domain))
                .unwrap_or_default(),
            _ => (
                netconfig::DEFAULT_DNS_IP.into(),
                netconfig::DEFAULT_ZONE.into(),
            ),
        };
        let etc = Path::new("/etc/netns").join(&netns);
        std::fs::create_dir_all(&etc).map_err(|e| io("creating /etc/netns", e))?;
        std::fs::write(
            etc.join("resolv.conf"),
            format!(
                "nameserver {dns_ip}\nsearch {ns}.svc.{zone} svc.{zone} {zone}\noptions ndots:5\n"
            ),
        )
        .map_err(|e| io("writing resolv.conf", e))?;

        if !ports.is_empty() {
            let spec = ports
                .iter()
                .map(serve::PortSpec::number_and_protocol)
                .collect::<Vec<_>>()
                .join(",");
            self.spawn(
                &format!("pod-{ns}_{pod}"),
                Some(&netns),
                &[
                    "serve".into(),
                    "--namespace".into(),
                    ns.into(),
                    "--name".into(),
                    pod.into(),
                    "--ports".into(),
                    spec,
                ],
                &[],
            )?;
            // Ready when the first TCP port answers (bounded).
            if let Some(p) = ports.iter().find(|p| !p.udp) {
                let deadline = Instant::now() + Duration::from_secs(10);
                let addr: SocketAddr = format!("127.0.0.1:{}", p.port).parse().expect("addr");
                while pns
                    .run(|| serve::ask(addr, false, "hostname", Duration::from_millis(200)))?
                    .is_err()
                {
                    if Instant::now() > deadline {
                        return Err(msg(format!("pod {ns}/{pod}: server did not start")));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }

        // The kubelet's part: the sandbox runs, so the status says so.
        match api {
            PodApi::Kube(c) => kubelet::set_pod_running(c, ns, pod, &ip, n.ip).await?,
            PodApi::Store(objs) => set_store_pod_running(objs, ns, pod, &ip, n.ip).await?,
        }
        Ok(info)
    }

    /// Asks `target` from inside a pod; returns who answered.
    pub fn probe(
        &self,
        ns: &str,
        pod: &str,
        target: &str,
        request: &str,
    ) -> Result<String, LabError> {
        let p = self.pod(ns, pod)?;
        let (hostport, proto) = match target.rsplit_once('/') {
            Some((h, pr)) if pr.eq_ignore_ascii_case("tcp") || pr.eq_ignore_ascii_case("udp") => {
                (h, pr.to_ascii_lowercase())
            }
            _ => (target, "tcp".to_string()),
        };
        let (host, port) = hostport
            .rsplit_once(':')
            .ok_or_else(|| msg(format!("{target:?}: want HOST:PORT[/tcp|/udp]")))?;
        let port: u16 = port
            .parse()
            .map_err(|_| msg(format!("{target:?}: bad port")))?;
        let ns_handle = Netns::named(&p.netns)?;
        let ip: IpAddr = match host.trim_matches(['[', ']']).parse() {
            Ok(ip) => ip,
            // A name: the pod's own resolver (its resolv.conf, which
            // `ip netns exec` bind-mounts: cluster DNS, search path, ndots).
            Err(_) => resolve_in_pod(&p.netns, host)?,
        };
        let addr = SocketAddr::new(ip, port);
        ns_handle
            .run(|| serve::ask(addr, proto == "udp", request, Duration::from_secs(3)))?
            .map_err(|e| io(format!("{proto} {addr} from {ns}/{pod}"), e))
    }

    /// Asks `target` from inside pod `ns/pod` who answers ([`serve::WHOAMI`]),
    /// and says what happened by cause ([`Reach`]): a UDP probe uses a
    /// connected socket, so a reject (ICMP port-unreachable) shows as
    /// [`Reach::Refused`] and a drop as [`Reach::TimedOut`]. It enters the
    /// pod's namespace on the calling thread only (and leaves it again), so
    /// many probes can run at once, one per thread.
    pub fn reach(
        &self,
        ns: &str,
        pod: &str,
        target: SocketAddr,
        udp: bool,
        timeout: Duration,
    ) -> Reach {
        let p = match self.pod(ns, pod) {
            Ok(p) => p,
            Err(e) => return Reach::Other(e.to_string()),
        };
        Netns::named(&p.netns)
            .and_then(|n| n.run(|| serve::reach(target, udp, timeout)))
            .unwrap_or_else(|e| Reach::Other(format!("entering {}: {e}", p.netns)))
    }

    /// What reached the underlay gateway since the lab came up: packets
    /// that left a node because nothing on the node handled them (see
    /// [`gateway`]). An unchanged count after some traffic means it was
    /// handled, or dropped, on the node.
    pub fn gateway_leaks(&self) -> Result<gateway::Leaks, LabError> {
        self.state()?;
        gateway::leaks(&Netns::named(&self.gateway_ns())?)
    }

    /// Removes one pod (CNI DEL, namespace, record, Pod object).
    pub async fn delete_pod(&self, ns: &str, pod: &str) -> Result<(), LabError> {
        let st = self.state()?;
        self.pod(ns, pod)?;
        self.remove_sandbox(&st, ns, pod)?;
        let api = match st.kube {
            true => PodApi::Kube(self.kube_client().await?),
            false => PodApi::Store(self.objects(&st).await?),
        };
        api.delete_pod(ns, pod).await
    }

    /// A pod's sandbox: its server, CNI DEL, its namespace, its record.
    fn remove_sandbox(&self, st: &LabState, ns: &str, pod: &str) -> Result<(), LabError> {
        let p = self.pod(ns, pod)?;
        self.kill_role(&format!("pod-{ns}_{pod}"));
        let list_path = self
            .node_dir(&p.node)
            .join("net.d")
            .join("10-podnet.conflist");
        if let Ok(b) = std::fs::read(&list_path) {
            if let Ok(list) = serde_json::from_slice::<serde_json::Value>(&b) {
                if let Some(n) = st.nodes.iter().find(|n| n.name == p.node) {
                    let rt = Runtime::new(self.bin_dir())
                        .in_netns(Path::new("/run/netns").join(&n.netns));
                    let a = Attach {
                        container_id: p.container_id.clone(),
                        netns: format!("/run/netns/{}", p.netns),
                        ifname: "eth0".into(),
                        ..Default::default()
                    };
                    rt.del_list(&list, &a, None)?;
                }
            }
        }
        Netns::delete_named(&p.netns)?;
        let _ = std::fs::remove_dir_all(Path::new("/etc/netns").join(&p.netns));
        let _ = std::fs::remove_file(self.pod_file(ns, pod));
        Ok(())
    }

    /// Removes everything the lab made: processes, namespaces, files.
    pub fn down(&self) -> Result<Vec<String>, LabError> {
        let mut done = Vec::new();
        // Processes: recorded pids, plus any process still using our files.
        if let Ok(rd) = std::fs::read_dir(self.dir.join("pids")) {
            for e in rd.flatten() {
                if let Some(pid) = std::fs::read_to_string(e.path())
                    .ok()
                    .and_then(|s| s.trim().parse::<i32>().ok())
                {
                    if kill_wait(pid) {
                        done.push(format!(
                            "stopped {} (pid {pid})",
                            e.file_name().to_string_lossy()
                        ));
                    }
                }
            }
        }
        // With the slash: lab "a1" must not match lab "a12"'s files.
        let marker = format!("{}/", self.dir.display());
        for pid in processes_mentioning(&marker) {
            if kill_wait(pid) {
                done.push(format!("stopped stray pid {pid}"));
            }
        }
        // Real nodes: their pods' processes, mount namespaces, cgroups and
        // data (a no-op for other labs).
        done.extend(realnode::host::cleanup(
            &self.name,
            &self.dir,
            &Path::new(realnode::DATA_DIR).join(&self.name),
        ));
        // Namespaces: every pn-<lab>-*.
        let prefix = format!("pn-{}-", self.name);
        if let Ok(rd) = std::fs::read_dir(podnet_kernel::netns::NETNS_RUN_DIR) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with(&prefix) {
                    for pid in processes_in_netns(&e.path()) {
                        kill_wait(pid);
                    }
                    Netns::delete_named(&n)?;
                    let _ = std::fs::remove_dir_all(Path::new("/etc/netns").join(&n));
                    done.push(format!("deleted netns {n}"));
                }
            }
        }
        if self.dir.exists() {
            std::fs::remove_dir_all(&self.dir)
                .map_err(|e| io(format!("removing {}", self.dir.display()), e))?;
            done.push(format!("removed {}", self.dir.display()));
        }
        Ok(done)
    }
}

/// Starts a detached process (optionally inside a namespace), logging to
/// `<dir>/logs/<role>.log` and recording its pid under `<dir>/pids/<role>`,
/// so `lab down` finds it even after a crash. A role started again (a
/// restarted agent) appends to its log, after a line that marks the start,
/// so what the last run said before it died stays.
pub(crate) fn spawn_logged(
    dir: &Path,
    role: &str,
    cmd: &mut Command,
    ns: Option<&str>,
) -> Result<u32, LabError> {
    use std::io::Write;
    let path = dir.join("logs").join(format!("{role}.log"));
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| io(format!("opening {}", path.display()), e))?;
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    writeln!(
        log,
        "{SPAWN_MARK} {role} starting (unix time {}.{:03})",
        since_epoch.as_secs(),
        since_epoch.subsec_millis()
    )
    .map_err(|e| io(format!("writing {}", path.display()), e))?;
    let log2 = log.try_clone().map_err(|e| io("log", e))?;
    cmd.stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        // The log is a file: plain text, no colour codes.
        .env("NO_COLOR", "1")
        .process_group(0);
    let child = match ns {
        Some(ns) => Netns::named(ns)?.run(|| cmd.spawn())?,
        None => cmd.spawn(),
    }
    .map_err(|e| io(format!("starting {role}"), e))?;
    let pid = child.id();
    std::fs::write(dir.join("pids").join(role), pid.to_string())
        .map_err(|e| io("writing pid", e))?;
    // The child is a daemon: reap it in the background if we outlive it.
    std::thread::spawn(move || {
        let mut c = child;
        let _ = c.wait();
    });
    Ok(pid)
}

/// Resolves `host` as a process in the pod would (glibc through the pod's
/// resolv.conf), via `ip netns exec NETNS getent ahosts HOST`.
fn resolve_in_pod(netns: &str, host: &str) -> Result<IpAddr, LabError> {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, "getent", "ahosts", host])
        .output()
        .map_err(|e| io(format!("resolving {host} in {netns}"), e))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| msg(format!("{host}: no address from the pod's resolver")))
}

/// The number the next node of a lab gets (`node<N>`): one past the
/// highest, so a removed node's name is not reused.
fn next_node_index(st: &LabState) -> usize {
    st.nodes
        .iter()
        .filter_map(|n| n.name.strip_prefix("node")?.parse::<usize>().ok())
        .max()
        .unwrap_or(0)
        + 1
}

/// The labels of the cluster DNS pod, which kube-dns selects.
fn dns_labels() -> BTreeMap<String, String> {
    BTreeMap::from([("k8s-app".to_string(), "kube-dns".to_string())])
}

/// The `kube-dns` Service: the DNS service IP, port 53 over UDP and TCP.
fn dns_service(ip: IpAddr, selector: BTreeMap<String, String>) -> Service {
    let port = |name: &str, proto: &str| ServicePort {
        name: Some(name.into()),
        port: 53,
        protocol: Some(proto.into()),
        target_port: Some(IntOrString::Int(53)),
        ..Default::default()
    };
    Service {
        metadata: ObjectMeta {
            name: Some(DNS_SERVICE.into()),
            namespace: Some(DNS_NAMESPACE.into()),
            labels: Some(selector.clone()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some(ip.to_string()),
            cluster_ips: Some(vec![ip.to_string()]),
            selector: Some(selector),
            ports: Some(vec![port("dns", "UDP"), port("dns-tcp", "TCP")]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Whether a DNS server at `addr` answers `name` TXT with NOERROR.
fn dns_answers(addr: SocketAddr, name: &str) -> bool {
    let c = podnet_dns::client::Client {
        timeout: Duration::from_millis(300),
        ..podnet_dns::client::Client::new(addr)
    };
    c.udp(name, podnet_dns::wire::TYPE_TXT)
        .map(|m| m.rcode() == podnet_dns::wire::NOERROR)
        .unwrap_or(false)
}

/// Where a pod's object lives: the API (Kubernetes mode) or the store.
enum PodApi {
    Kube(::kube::Client),
    Store(Objects),
}

impl PodApi {
    /// Deletes the Pod object; a missing one is fine.
    async fn delete_pod(&self, ns: &str, pod: &str) -> Result<(), LabError> {
        match self {
            PodApi::Kube(c) => Ok(kubelet::delete_pod(c, ns, pod).await?),
            PodApi::Store(objs) => {
                podnet_apiserver::admission::delete_one(objs, Kind::Pod, Some(ns), pod)
                    .await
                    .map_err(msg)?;
                Ok(())
            }
        }
    }
}

/// Standalone: creates namespace `ns` unless it exists, through admission
/// (which labels it `kubernetes.io/metadata.name`, as the API server does).
async fn ensure_store_namespace(objs: &Objects, ns: &str) -> Result<(), LabError> {
    if objs.get(Kind::Namespace, None, ns).await?.is_some() {
        return Ok(());
    }
    let nso = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let ctx = podnet_apiserver::admission::context(objs).await?;
    podnet_apiserver::admission::apply_one(objs, &ctx, Object::Namespace(Box::new(nso)))
        .await
        .map_err(|e| msg(format!("creating namespace {ns}: {e}")))?;
    Ok(())
}

/// Standalone: the status a kubelet writes once the pod runs (IP, its
/// node's IP, Running, Ready), onto the Pod object made before the sandbox.
async fn set_store_pod_running(
    objs: &Objects,
    ns: &str,
    pod: &str,
    ip: &str,
    host_ip: Ipv4Addr,
) -> Result<(), LabError> {
    let cond = |t: &str| PodCondition {
        type_: t.into(),
        status: "True".into(),
        ..Default::default()
    };
    let status = PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some(ip.into()),
        pod_ips: Some(vec![PodIP { ip: ip.into() }]),
        host_ip: Some(host_ip.to_string()),
        conditions: Some(vec![
            cond("PodScheduled"),
            cond("Initialized"),
            cond("ContainersReady"),
            cond("Ready"),
        ]),
        ..Default::default()
    };
    for _ in 0..5 {
        let Some(Object::Pod(mut p)) = objs.get(Kind::Pod, Some(ns), pod).await? else {
            return Err(msg(format!("Pod {ns}/{pod} vanished before it ran")));
        };
        p.status = Some(status.clone());
        match objs.update(Object::Pod(p), vec![]).await {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(msg(format!("Pod {ns}/{pod} keeps changing")))
}

async fn upsert(objs: &Objects, o: Object) -> Result<(), LabError> {
    for _ in 0..5 {
        let r = match objs.get(o.kind(), o.namespace(), o.name()).await? {
            Some(old) => {
                let mut n = o.clone();
                n.meta_mut().resource_version = old.meta().resource_version.clone();
                n.meta_mut().uid = old.meta().uid.clone();
                n.meta_mut().creation_timestamp = old.meta().creation_timestamp.clone();
                objs.update(n, vec![]).await
            }
            None => objs.create(o.clone(), vec![]).await,
        };
        match r {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { .. }) | Err(StoreError::AlreadyExists(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(msg(format!("{} keeps changing", o.describe())))
}

fn short_hash(s: &str) -> String {
    let mut h: u32 = 0x811c9dc5;
    for b in s.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x01000193);
    }
    format!("{h:08x}")
}

/// SIGTERM, then SIGKILL after a grace period; true if it was running.
pub(crate) fn kill_wait(pid: i32) -> bool {
    // SAFETY: plain kill(2) calls.
    if pid <= 1 || unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(3);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if alive(pid) {
        unsafe { libc::kill(pid, libc::SIGKILL) };
        wait_gone(pid);
    }
    true
}

pub(crate) fn alive(pid: i32) -> bool {
    // A zombie has exited: treat it as gone, once its other threads have
    // too (a killed process's leader turns zombie while its other threads
    // are still exiting, and its sockets close only after the last one).
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let zombie = s
                .rsplit(')')
                .next()
                .map(|r| r.trim_start().starts_with('Z'))
                .unwrap_or(false);
            let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
                .map(|d| d.count())
                .unwrap_or(0);
            !zombie || threads > 1
        }
        Err(_) => false,
    }
}

fn wait_gone(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(crate) fn processes_mentioning(marker: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if pid == me {
                continue;
            }
            if let Ok(c) = std::fs::read(format!("/proc/{pid}/cmdline")) {
                if String::from_utf8_lossy(&c).contains(marker) {
                    out.push(pid);
                }
            }
        }
    }
    out
}

fn processes_in_netns(ns_path: &Path) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(target) = std::fs::metadata(ns_path) else {
        return vec![];
    };
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if pid == me {
                continue;
            }
            if let Ok(m) = std::fs::metadata(format!("/proc/{pid}/ns/net")) {
                if m.ino() == target.ino() && m.dev() == target.dev() {
                    out.push(pid);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(kube: bool) -> LabState {
        LabState {
            name: "t".into(),
            backend: "vxlan".into(),
            store: "sqlite:///run/podnet-lab/t/state.db".into(),
            underlay_ns: "pn-t-net".into(),
            nodes: vec![],
            resync_secs: 5,
            kube,
            kubelet: false,
        }
    }

    /// Standalone daemons read the store; in Kubernetes mode the same
    /// daemons get their node's kubeconfig instead, nothing else changes.
    #[test]
    fn daemon_args_per_mode() {
        let lab = Lab::new("t", "/bin/podnet".into()).unwrap();
        let node = NodeInfo {
            name: "node1".into(),
            netns: "pn-t-node1".into(),
            ip: Ipv4Addr::new(192, 168, 200, 11),
        };
        let alone = lab.daemon_args(&state(false), Daemon::Agent(&node));
        assert_eq!(
            alone[..5],
            [
                "--store",
                "sqlite:///run/podnet-lab/t/state.db",
                "agent",
                "--node",
                "node1"
            ]
        );
        let kube = lab.daemon_args(&state(true), Daemon::Agent(&node));
        assert_eq!(
            kube[..5],
            [
                "agent",
                "--kubeconfig",
                "/run/podnet-lab/t/nodes/node1/kubeconfig",
                "--net-conf",
                "/run/podnet-lab/t/net-conf.json"
            ]
        );
        assert_eq!(kube[5..], alone[3..]);
        let up = ["10.0.0.53".to_string()];
        let dns = |kube| {
            lab.daemon_args(
                &state(kube),
                Daemon::Dns {
                    node: "node1",
                    upstreams: &up,
                },
            )
        };
        assert_eq!(dns(false)[2], "dns");
        assert!(dns(false).contains(&"--upstream=10.0.0.53".to_string()));
        assert_eq!(dns(true)[..2], ["dns", "--kubeconfig"]);
        assert!(!dns(true).contains(&"--store".to_string()));
    }

    /// State files written before Kubernetes mode still load (standalone).
    #[test]
    fn old_state_files_load_as_standalone() {
        let mut v = serde_json::to_value(state(true)).unwrap();
        v.as_object_mut().unwrap().remove("kube");
        let st: LabState = serde_json::from_value(v).unwrap();
        assert!(!st.kube);
    }
}
