//! `lab up` and `lab down`: checking the options, the underlay and its
//! gateway, the standalone bring-up (store, controller, nodes, DNS), the
//! hand-over to Kubernetes mode ([`crate::kubemode`]) or real nodes
//! ([`crate::realnode`]), and removing everything a lab made, also after a
//! crash.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use podnet_api::netconfig::{self, NetworkConfig, NetworkSpec};
use podnet_api::Object;
use podnet_kernel::{Handle, Netns};

use crate::error::{io, msg, LabError};
use crate::process::{kill_wait, processes_in_netns, processes_mentioning};
use crate::state::{Lab, LabState};
use crate::store::upsert;
use crate::{gateway, kube, realnode, router, upgrade};

#[derive(Debug, Clone)]
pub struct UpOptions {
    pub nodes: usize,
    pub backend: String,
    pub store: Option<String>,
    pub resync_secs: u64,
    /// Run a real etcd, kube-apiserver and kube-controller-manager, and
    /// register nodes and pods through the API ([`kube`], [`kubelet`](crate::kubelet)).
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
    /// A top-of-rack router on the underlay running this daemon (bird,
    /// frr, gobgp), peering with every node ([`crate::router`]).
    pub router: Option<String>,
    /// Underlay subnets (1 or 2), joined by the top-of-rack router; with
    /// two, vxlan runs in its cross-subnet mode (DirectRouting).
    pub racks: usize,
    /// Agents run L2 announcement (`--l2-announce`).
    pub l2_announce: bool,
    /// Pod traffic between nodes encrypted (`Encrypt: true`).
    pub encrypt: bool,
    /// Dual-stack pods (`EnableIPv6`, IPv6Network [`IPV6_NETWORK`]).
    pub dual_stack: bool,
}

/// The lab's IPv6 pod network (dual-stack), the same in both modes.
pub const IPV6_NETWORK: &str = crate::kube::CLUSTER_CIDR6;

impl UpOptions {
    /// A standalone lab of `nodes` on `backend` with the lab's own store,
    /// the agent's default resync (10 s; `lab up`'s flag says 5), one DNS
    /// server, one rack, no router. Callers change the rest with struct
    /// update syntax.
    pub fn new(nodes: usize, backend: &str) -> UpOptions {
        UpOptions {
            nodes,
            backend: backend.into(),
            store: None,
            resync_secs: 10,
            kube: false,
            kube_agents: true,
            dns_replicas: 1,
            kubelet: false,
            images: vec![],
            daemon_exe: None,
            router: None,
            racks: 1,
            l2_announce: false,
            encrypt: false,
            dual_stack: false,
        }
    }
}

/// The standalone lab's NetworkConfig for options `o`.
fn network_config(o: &UpOptions) -> NetworkConfig {
    NetworkConfig {
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
                // Two racks: vxlan only between them (cross-subnet).
                direct_routing: (o.racks > 1).then_some(true),
                ..Default::default()
            },
            encrypt: o.encrypt.then_some(true),
            enable_ipv6: o.dual_stack.then_some(true),
            ipv6_network: o.dual_stack.then(|| IPV6_NETWORK.to_string()),
            service_cidr: o.dual_stack.then(|| crate::kube::service_cidrs(true)),
            ..Default::default()
        },
    }
}

impl Lab {
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
                "unknown backend {:?} (vxlan, host-gw, udp, bgp)",
                o.backend
            ))
        })?;
        let _ = bt;
        if let Some(kind) = &o.router {
            router::RouterKind::parse(kind)?;
        }
        if !(1..=2).contains(&o.racks) {
            return Err(msg(format!("--racks {}: 1 or 2", o.racks)));
        }
        if o.kubelet && (o.router.is_some() || o.racks > 1) {
            return Err(msg("--router and --racks: not with --kubelet yet"));
        }
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
            racks: o.racks,
            router: o.router.clone(),
            l2_announce: o.l2_announce,
            encrypt: o.encrypt,
            dual_stack: o.dual_stack,
        };
        // The underlay: a bridge per rack in its own namespace, and the
        // nodes' gateway on the first (no uplink: nothing leaves the
        // machine); the router, if any, joins the racks.
        let under = Netns::create_named(&st.underlay_ns)?;
        let mut uh = Handle::in_netns(&under)?;
        for rack in 1..=o.racks {
            uh.create_bridge(&gateway::bridge(rack), None, None)?;
            uh.set_up_by_name(&gateway::bridge(rack))?;
        }
        let gw = Netns::create_named(&self.gateway_ns())?;
        gateway::install(&under, &gw, o.dual_stack)?;
        if o.router.is_some() || o.racks > 1 {
            self.add_router_ns(&st.underlay_ns, o.racks)?;
        }
        if let Some(kind) = &o.router {
            self.start_router(router::RouterKind::parse(kind)?, o.racks)?;
        }
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
        upsert(&objs, Object::NetworkConfig(Box::new(network_config(o)))).await?;

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
        self.start_l7_gateway(&st)?;
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
        // With the slash: lab "a1" must not match lab "a12"'s files. And
        // this lab's own `podnet lab --name NAME ...` helpers (a forwarder
        // in the host's namespace names neither our files nor our
        // namespaces), matched whole between the NULs of their cmdline.
        let markers = [
            format!("{}/", self.dir.display()),
            format!("--name\0{}\0", self.name),
        ];
        for pid in markers.iter().flat_map(|m| processes_mentioning(m)) {
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
