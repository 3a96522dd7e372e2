//! Real nodes (`lab up --kubelet`): each node namespace runs its own
//! containerd and kubelet, so the pods of a lab cluster are started by a
//! real kubelet through containerd's CRI, and get their network from the
//! CNI plugins the podnet DaemonSet installed, as on any cluster.
//!
//! This module owns one node's runtime: finding the binaries
//! ([`NodePeers`]), its directories (run state under the lab dir, images
//! and kubelet data under [`DATA_DIR`]), its configs ([`config`]), its
//! share of the machine ([`host`]: mount namespace, cgroup, sysctl
//! shadows) and its two processes, started with `nsenter` into the node's
//! mount and network namespaces (not `ip netns exec`, which remounts
//! `/sys` and hides `/sys/fs/cgroup`). The control plane's side is in
//! [`crate::kube`] ([`crate::kube::KubeletPlan`]); `lab down` calls
//! [`host::cleanup`].

mod cluster;
pub mod config;
pub mod host;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{io, msg, LabError};
use crate::NodeInfo;

/// Where real nodes keep what is too big for /run (images, kubelet data).
pub const DATA_DIR: &str = "/var/lib/podnet-lab";
/// The script that builds containerd, runc and crictl.
pub const NODE_PEERS_SCRIPT: &str = "scripts/node-peers.sh";

/// The binaries of a real node, from `scripts/k8s-peers.sh kubelet
/// kube-scheduler` and `scripts/node-peers.sh` (run so that they never
/// build: a missing binary is an error naming the script).
#[derive(Debug, Clone)]
pub struct NodePeers {
    pub kubelet: PathBuf,
    pub kube_scheduler: PathBuf,
    pub containerd: PathBuf,
    pub ctr: PathBuf,
    pub runc: PathBuf,
}

fn script_vars(script: &Path, args: &[&str]) -> Result<Vec<(String, PathBuf)>, LabError> {
    let out = Command::new("bash")
        .arg(script)
        .args(args)
        .env("GOPROXY", "off")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io(format!("running {}", script.display()), e))?;
    if !out.status.success() {
        return Err(msg(format!(
            "the real-node binaries are not built; run `bash {} {}` (it builds and caches \
             them): {}",
            script.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), PathBuf::from(v)))
        .collect())
}

impl NodePeers {
    pub fn find() -> Result<NodePeers, LabError> {
        let k8s = crate::kube::peers_script();
        let node = k8s.with_file_name("node-peers.sh");
        let mut vars = script_vars(&k8s, &["kubelet", "kube-scheduler"])?;
        vars.extend(script_vars(&node, &[])?);
        let get = |k: &str| {
            vars.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
                .filter(|p| p.exists())
                .ok_or_else(|| msg(format!("{k} is missing; run scripts/{}", node.display())))
        };
        Ok(NodePeers {
            kubelet: get("KUBELET")?,
            kube_scheduler: get("KUBE_SCHEDULER")?,
            containerd: get("CONTAINERD")?,
            ctr: get("CTR")?,
            runc: get("RUNC")?,
        })
    }
}

/// One node of a real-kubelet lab.
pub struct RealNode<'a> {
    pub lab: &'a str,
    pub lab_dir: &'a Path,
    pub node: &'a NodeInfo,
    /// A dual-stack lab: the kubelet reports both underlay addresses.
    pub dual_stack: bool,
}

impl RealNode<'_> {
    /// The kubelet's `--node-ip`: the underlay address, and its IPv6 twin
    /// in a dual-stack lab (the Node then lists both InternalIPs).
    fn node_ips(&self) -> String {
        match self.dual_stack {
            true => format!("{},{}", self.node.ip, crate::gateway::twin6(self.node.ip)),
            false => self.node.ip.to_string(),
        }
    }

    fn run_dir(&self) -> PathBuf {
        self.lab_dir.join("nodes").join(&self.node.name)
    }

    fn data_dir(&self) -> PathBuf {
        Path::new(DATA_DIR).join(self.lab).join(&self.node.name)
    }

    /// The kubelet's cgroupRoot, in every hierarchy.
    pub fn cgroup_root(&self) -> String {
        format!("/pn-{}-{}", self.lab, self.node.name)
    }

    pub fn containerd_socket(&self) -> PathBuf {
        self.run_dir().join("containerd.sock")
    }

    fn pin(&self) -> PathBuf {
        self.lab_dir.join("mnt").join(&self.node.name)
    }

    /// `nsenter` into the node's mount and network namespaces, then
    /// `program`.
    fn nsenter(&self, program: &Path) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--mount={}", self.pin().display()))
            .arg(format!(
                "--net={}",
                Path::new(podnet_kernel::netns::NETNS_RUN_DIR)
                    .join(&self.node.netns)
                    .display()
            ))
            .arg("--")
            .arg(program);
        c
    }

    /// The node's cgroup and mount namespace.
    pub fn prepare(&self) -> Result<(), LabError> {
        host::create_cgroup(&self.cgroup_root())?;
        host::mount_namespace(
            self.lab_dir,
            &self.node.name,
            &self.data_dir(),
            &self.run_dir().join("sysctl"),
        )?;
        Ok(())
    }

    /// Starts containerd and waits until it answers.
    pub fn start_containerd(&self, peers: &NodePeers) -> Result<(), LabError> {
        let run = self.run_dir();
        let data = self.data_dir();
        let cfg = run.join("containerd.toml");
        let text = config::containerd(&config::ContainerdPaths {
            root: &data.join("containerd"),
            state: &run.join("containerd"),
            socket: &self.containerd_socket(),
            opt: &data.join("opt"),
            runc: &run.join("runc"),
        });
        std::fs::write(&cfg, text).map_err(|e| io("writing containerd.toml", e))?;
        // The shim and runc are found on PATH, next to containerd first.
        let mut path = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .collect::<Vec<_>>();
        for b in [&peers.runc, &peers.containerd] {
            if let Some(d) = b.parent() {
                path.insert(0, d.to_path_buf());
            }
        }
        let tmp = data.join("tmp");
        std::fs::create_dir_all(&tmp).map_err(|e| io("creating containerd's tmp", e))?;
        let mut cmd = self.nsenter(&peers.containerd);
        cmd.arg("--config")
            .arg(&cfg)
            .env("PATH", std::env::join_paths(path).expect("PATH"))
            .env("TMPDIR", &tmp);
        let role = format!("containerd-{}", self.node.name);
        let pid = crate::process::spawn_logged(self.lab_dir, &role, &mut cmd, None)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ok = Command::new(&peers.ctr)
                .arg("--address")
                .arg(self.containerd_socket())
                .arg("version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(());
            }
            if !crate::process::alive(pid as i32) || Instant::now() > deadline {
                return Err(msg(format!(
                    "{role} did not start; see {}",
                    self.lab_dir
                        .join("logs")
                        .join(format!("{role}.log"))
                        .display()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Imports image archives into the CRI's namespace (`k8s.io`).
    pub fn import(&self, peers: &NodePeers, archives: &[PathBuf]) -> Result<(), LabError> {
        for a in archives {
            let out = Command::new(&peers.ctr)
                .arg("--address")
                .arg(self.containerd_socket())
                .args(["-n", "k8s.io", "images", "import"])
                .arg(a)
                .stdin(Stdio::null())
                .output()
                .map_err(|e| io("running ctr", e))?;
            if !out.status.success() {
                return Err(msg(format!(
                    "{}: importing {}: {}",
                    self.node.name,
                    a.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
        }
        Ok(())
    }

    /// Writes the kubelet's kubeconfig (its node certificate from
    /// `pki_dir`, the apiserver at `server`) and config, and starts it.
    pub fn start_kubelet(
        &self,
        peers: &NodePeers,
        server: &str,
        pki_dir: &Path,
        cluster_dns: &str,
    ) -> Result<u32, LabError> {
        let run = self.run_dir();
        let kc = run.join("kubelet.kubeconfig");
        let user = format!("node-{}", self.node.name);
        std::fs::write(&kc, crate::kube::kubeconfig_text(server, pki_dir, &user))
            .map_err(|e| io("writing the kubelet's kubeconfig", e))?;
        let resolv = run.join("resolv.conf");
        // Pods with dnsPolicy Default (cluster DNS among them) get this;
        // the lab has no upstream resolver, so it names none.
        std::fs::write(&resolv, "options ndots:1\n").map_err(|e| io("writing resolv.conf", e))?;
        let cgroup_root = self.cgroup_root();
        let cfg = run.join("kubelet.yaml");
        let text = config::kubelet(&config::KubeletNode {
            ip: self.node.ip,
            cgroup_root: &cgroup_root,
            containerd_socket: &self.containerd_socket(),
            ca: &pki_dir.join("ca.crt"),
            resolv_conf: &resolv,
            cluster_dns,
        });
        std::fs::write(&cfg, text).map_err(|e| io("writing kubelet.yaml", e))?;
        let mut cmd = self.nsenter(&peers.kubelet);
        cmd.arg(format!("--config={}", cfg.display()))
            .arg(format!("--kubeconfig={}", kc.display()))
            .arg(format!("--hostname-override={}", self.node.name))
            .arg(format!("--node-ip={}", self.node_ips()))
            // A zone per node, as a cloud provider labels its nodes: the
            // topology-aware routing of Services (hints, trafficDistribution)
            // has zones to choose between, and upstream's specs for it run.
            .arg(format!(
                "--node-labels={ZONE_LABEL}={}",
                zone_of(&self.node.name)
            ))
            .arg("--v=1");
        crate::process::spawn_logged(
            self.lab_dir,
            &format!("kubelet-{}", self.node.name),
            &mut cmd,
            None,
        )
    }
}

/// The label a node's zone is in.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The zone of lab node `name` in a real-kubelet lab: its own.
pub fn zone_of(name: &str) -> String {
    format!("zone-{name}")
}
