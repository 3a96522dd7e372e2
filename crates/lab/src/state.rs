//! A lab's identity and what it keeps on disk: its name and directory
//! under [`RUN_DIR`], the state it records in `lab.json` (mode, store,
//! nodes), and where its files live. Every other `impl Lab` block builds
//! on these.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{io, msg, LabError};

pub const RUN_DIR: &str = "/run/podnet-lab";

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
    /// Its IPv6 address in a dual-stack lab.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip6: Option<String>,
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
    /// Real nodes: containerd and a kubelet per node ([`realnode`](crate::realnode)).
    #[serde(default)]
    pub kubelet: bool,
    /// Underlay subnets joined by the router (0 in older state files: 1).
    #[serde(default)]
    pub racks: usize,
    /// The top-of-rack router's daemon, if any.
    #[serde(default)]
    pub router: Option<String>,
    /// Agents run L2 announcement.
    #[serde(default)]
    pub l2_announce: bool,
    /// Pod traffic between nodes is encrypted (`Encrypt` in the network
    /// config).
    #[serde(default)]
    pub encrypt: bool,
    /// Pods get IPv6 addresses too (`EnableIPv6`).
    #[serde(default)]
    pub dual_stack: bool,
}

/// A lab by name: where its state lives.
#[derive(Debug, Clone)]
pub struct Lab {
    pub name: String,
    pub dir: PathBuf,
    pub exe: PathBuf,
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

    pub(crate) fn ns_name(&self, what: &str) -> String {
        format!("pn-{}-{what}", self.name)
    }

    /// The namespace of the nodes' default gateway ([`gateway`](crate::gateway)).
    pub fn gateway_ns(&self) -> String {
        self.ns_name("gw")
    }

    pub(crate) fn state_path(&self) -> PathBuf {
        self.dir.join("lab.json")
    }

    pub fn state(&self) -> Result<LabState, LabError> {
        let b = std::fs::read(self.state_path())
            .map_err(|_| msg(format!("lab {:?} is not up (podnet lab up)", self.name)))?;
        serde_json::from_slice(&b)
            .map_err(|e| msg(format!("corrupt {}: {e}", self.state_path().display())))
    }

    pub(crate) fn save(&self, s: &LabState) -> Result<(), LabError> {
        std::fs::write(
            self.state_path(),
            serde_json::to_vec_pretty(s).expect("json"),
        )
        .map_err(|e| io("writing lab state", e))
    }

    pub(crate) fn node_dir(&self, node: &str) -> PathBuf {
        self.dir.join("nodes").join(node)
    }

    pub fn bin_dir(&self) -> PathBuf {
        self.dir.join("bin")
    }

    /// Where role `role` logs: `logs/<role>.log` in the lab directory.
    pub fn log_path(&self, role: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{role}.log"))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A lab state with no nodes, standalone or in Kubernetes mode.
    pub(crate) fn state(kube: bool) -> LabState {
        LabState {
            name: "t".into(),
            backend: "vxlan".into(),
            store: "sqlite:///run/podnet-lab/t/state.db".into(),
            underlay_ns: "pn-t-net".into(),
            nodes: vec![],
            resync_secs: 5,
            kube,
            kubelet: false,
            racks: 1,
            router: None,
            l2_announce: false,
            encrypt: false,
            dual_stack: false,
        }
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
