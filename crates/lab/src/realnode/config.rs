//! The configuration files of a real node's containerd and kubelet, as
//! text (pure: paths in, TOML and YAML out), so what the lab asks of each
//! is readable in one place and checked without root.
//!
//! The choices, and why:
//! - containerd: its own root, state, socket and runc root per node; CNI
//!   from the node's `/opt/cni/bin` and `/etc/cni/net.d` (bound to per-node
//!   directories in the node's mount namespace), one conflist; cgroupfs
//!   (no systemd here); `restrict_oom_score_adj` (no CAP_SYS_RESOURCE, so
//!   runc could not lower a score); the sandboxes' network namespaces under
//!   its state directory; no NRI or CDI (they would share host paths
//!   between nodes); the pause image pinned.
//! - kubelet: cgroupfs under a cgroup root of its own (kubelets sharing
//!   `/kubepods` kill each other's pods), cgroup v1 allowed
//!   (`failCgroupV1: false`), x509 and webhook authentication with
//!   anonymous off and webhook authorization (as kubeadm), the cluster DNS
//!   of `deploy/`, eviction and image GC thresholds low enough for a shared
//!   disk (the lab's nodes share this machine's filesystem, and nothing but
//!   the tests' pods run on them).

use std::net::Ipv4Addr;
use std::path::Path;

/// The pause image the kubelet and containerd use (kubelet v1.37's).
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.2";

/// A TOML or YAML double-quoted string (both accept JSON's escapes).
fn q(p: &Path) -> String {
    serde_json::to_string(&p.display().to_string()).expect("string")
}

/// Where a node's containerd keeps its things.
pub struct ContainerdPaths<'a> {
    pub root: &'a Path,
    pub state: &'a Path,
    pub socket: &'a Path,
    pub opt: &'a Path,
    pub runc: &'a Path,
}

/// containerd 2.x's config (version 3).
pub fn containerd(p: &ContainerdPaths<'_>) -> String {
    let mut ttrpc = p.socket.as_os_str().to_owned();
    ttrpc.push(".ttrpc");
    format!(
        r#"version = 3
root = {root}
state = {state}
oom_score = 0
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
  "io.containerd.nri.v1.nri",
]

[grpc]
  address = {sock}
[ttrpc]
  address = {ttrpc}
[debug]
  level = "info"
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause}"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = []
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = {runc}
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#,
        root = q(p.root),
        state = q(p.state),
        sock = q(p.socket),
        ttrpc = q(Path::new(&ttrpc)),
        opt = q(p.opt),
        runc = q(p.runc),
        pause = PAUSE_IMAGE,
    )
}

/// What differs between the kubelets of one lab.
pub struct KubeletNode<'a> {
    pub ip: Ipv4Addr,
    /// The cgroup (in every v1 hierarchy) its pods go under.
    pub cgroup_root: &'a str,
    pub containerd_socket: &'a Path,
    pub ca: &'a Path,
    pub resolv_conf: &'a Path,
    pub cluster_dns: &'a str,
}

/// The kubelet's KubeletConfiguration.
pub fn kubelet(n: &KubeletNode<'_>) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
containerRuntimeEndpoint: unix://{sock}
address: {ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
clusterDNS: ["{dns}"]
clusterDomain: cluster.local
resolvConf: {resolv}
failSwapOn: false
protectKernelDefaults: false
serializeImagePulls: false
rotateCertificates: false
serverTLSBootstrap: false
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
"#,
        cgroup_root = n.cgroup_root,
        sock = n.containerd_socket.display(),
        ip = n.ip,
        ca = q(n.ca),
        dns = n.cluster_dns,
        resolv = q(n.resolv_conf),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_paths_are_quoted_and_cri_is_cgroupfs() {
        let t = containerd(&ContainerdPaths {
            root: Path::new("/var/lib/podnet-lab/a/node1/containerd"),
            state: Path::new("/run/podnet-lab/a/nodes/node1/containerd"),
            socket: Path::new("/run/podnet-lab/a/nodes/node1/containerd.sock"),
            opt: Path::new("/var/lib/podnet-lab/a/node1/opt"),
            runc: Path::new("/run/podnet-lab/a/nodes/node1/runc"),
        });
        assert!(t.contains("root = \"/var/lib/podnet-lab/a/node1/containerd\""));
        assert!(t.contains("address = \"/run/podnet-lab/a/nodes/node1/containerd.sock.ttrpc\""));
        assert!(t.contains("SystemdCgroup = false"));
        assert!(t.contains("restrict_oom_score_adj = true"));
        assert!(t.contains(&format!("sandbox = \"{PAUSE_IMAGE}\"")));
    }

    #[test]
    fn kubelet_has_its_own_cgroup_root_and_allows_cgroup_v1() {
        let t = kubelet(&KubeletNode {
            ip: Ipv4Addr::new(192, 168, 200, 11),
            cgroup_root: "/pn-a-node1",
            containerd_socket: Path::new("/run/x/containerd.sock"),
            ca: Path::new("/run/x/ca.crt"),
            resolv_conf: Path::new("/run/x/resolv.conf"),
            cluster_dns: "10.96.0.10",
        });
        assert!(t.contains("cgroupRoot: /pn-a-node1\n"));
        assert!(t.contains("failCgroupV1: false\n"));
        assert!(t.contains("containerRuntimeEndpoint: unix:///run/x/containerd.sock\n"));
        assert!(t.contains("address: 192.168.200.11\n"));
        assert!(t.contains("  anonymous:\n    enabled: false\n"));
    }
}
