//! A Kubernetes-mode lab for a test (`podnet lab up --kube`: a real etcd,
//! kube-apiserver and kube-controller-manager, a `podnet agent` per node
//! and cluster DNS, each daemon as its ServiceAccount from `deploy/`), a
//! real kubectl with the admin's kubeconfig, and the lab taken down on drop
//! whatever happened.

#![allow(dead_code)]

use std::process::{Command, Output};
use std::time::Duration;

use podnet_testkit::{require_root, try_sh_in};

#[path = "kubectl.rs"]
mod kubectl;

pub const WAIT: Duration = Duration::from_secs(60);

pub struct KubeLab {
    pub name: String,
    pub kubectl: String,
    pub kubeconfig: String,
}

pub fn podnet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_podnet"))
        .args(args)
        .output()
        .expect("run podnet")
}

impl KubeLab {
    pub fn up(nodes: usize) -> KubeLab {
        require_root();
        // Unique per lab of this process too: the tests of one file run
        // in parallel (8 characters at most).
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10;
        let name = format!("ku{}{n}", std::process::id() % 100_000);
        let n = nodes.to_string();
        let o = podnet(&["lab", "--name", &name, "up", "--kube", "--nodes", &n]);
        // Down on drop from here on, whatever happened.
        let mut lab = KubeLab {
            name,
            kubectl: String::new(),
            kubeconfig: String::new(),
        };
        assert!(
            o.status.success(),
            "lab up --kube: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        let kc = podnet(&["lab", "--name", &lab.name, "kubeconfig"]);
        lab.kubeconfig = String::from_utf8_lossy(&kc.stdout).trim().to_string();
        lab.kubectl = kubectl::path().display().to_string();
        lab
    }

    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        let o = kubectl::run(self.kubectl.as_ref(), &self.name, args, stdin);
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
        )
    }

    /// `kubectl ARGS` with another identity's `kubeconfig` (a node's).
    pub fn kubectl_as(&self, kubeconfig: &std::path::Path, args: &[&str]) -> (bool, String) {
        let dir = std::path::PathBuf::from(format!("/run/podnet-lab/{}", self.name));
        let o = kubectl::run_as(self.kubectl.as_ref(), kubeconfig, &dir, args, None);
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
        )
    }

    pub fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out) = self.kubectl(args, stdin);
        assert!(ok, "kubectl {args:?}: {out}");
        out
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&a, None)).expect("kubectl JSON")
    }

    pub fn node_ns(&self, node: &str) -> String {
        format!("pn-{}-{node}", self.name)
    }

    /// Cluster DNS's A answer for `name`, asked from pod-less node1.
    pub fn dig(&self, name: &str) -> String {
        try_sh_in(
            &self.node_ns("node1"),
            &format!("dig +short +time=1 +tries=1 @10.96.0.10 {name} A"),
        )
        .1
        .trim()
        .to_string()
    }

    /// Cluster DNS's response code for `name` (NOERROR, NXDOMAIN...), or
    /// "no answer" when none came: an empty `dig +short` alone cannot tell
    /// a removed name from a server that did not answer.
    pub fn rcode(&self, name: &str) -> String {
        let out = try_sh_in(
            &self.node_ns("node1"),
            &format!("dig +time=1 +tries=1 @10.96.0.10 {name} A"),
        )
        .1;
        out.split("status: ")
            .nth(1)
            .and_then(|r| r.split(',').next())
            .unwrap_or("no answer")
            .to_string()
    }
}

impl Drop for KubeLab {
    fn drop(&mut self) {
        let _ = podnet(&["lab", "--name", &self.name, "down"]);
    }
}
