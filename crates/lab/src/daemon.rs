//! The lab's daemons as roles: their command lines in both modes
//! ([`Lab::daemon_args`]), starting a role's process (a daemon with only
//! the capabilities `deploy/` grants it), asking whether it still runs,
//! stopping it, and the forwarders that give a namespace this machine's
//! loopback. Process mechanics are [`crate::process`]'s.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use podnet_kernel::Netns;

use crate::error::{msg, LabError};
use crate::process::{alive, kill_wait, spawn_logged};
use crate::state::{Lab, LabState, NodeInfo};
use crate::{forward, kube};

/// The agent's capabilities in `deploy/`'s DaemonSet: CAP_NET_ADMIN.
pub const AGENT_CAPS: &[u32] = &[12];

/// What the agent needs beyond [`AGENT_CAPS`] for what this lab runs:
/// CAP_NET_BIND_SERVICE for BGP's port 179, CAP_NET_RAW for L2
/// announcement's packet sockets.
pub fn agent_caps(st: &LabState) -> &'static [u32] {
    match (st.backend == "bgp", st.l2_announce) {
        (false, false) => AGENT_CAPS,
        (true, false) => &[12, 10],
        (false, true) => &[12, 13],
        (true, true) => &[12, 10, 13],
    }
}

/// Cluster DNS's capabilities in `deploy/`'s Deployment:
/// CAP_NET_BIND_SERVICE.
pub const DNS_CAPS: &[u32] = &[10];

/// LB IPAM talks only to the API: no capability.
pub const LB_IPAM_CAPS: &[u32] = &[];

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
    /// `podnet controller` as LB IPAM's replica `id` (Kubernetes mode).
    LbIpam { id: &'a str },
    /// `podnet gateway` with node 1's network, its statuses showing
    /// `address`.
    Gateway { address: std::net::Ipv4Addr },
}

impl Lab {
    /// Starts a detached `podnet` process (optionally inside a namespace);
    /// see [`spawn_logged`].
    pub(crate) fn spawn(
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
    pub(crate) fn spawn_daemon(
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
    pub(crate) fn role_alive(&self, role: &str) -> bool {
        std::fs::read_to_string(self.dir.join("pids").join(role))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .is_some_and(alive)
    }

    pub(crate) fn kill_role(&self, role: &str) {
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
                if st.l2_announce {
                    a.push("--l2-announce".into());
                }
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
            Daemon::LbIpam { id } => {
                a.push("controller".into());
                a.push("--kubeconfig".into());
                a.push(self.lb_ipam_kubeconfig().display().to_string());
                a.extend([
                    "--lease-namespace".into(),
                    kube::RBAC_NAMESPACE.into(),
                    "--id".into(),
                    id.into(),
                    "--metrics-addr".into(),
                    "127.0.0.1:10257".into(),
                ]);
            }
            Daemon::Gateway { address } => {
                a.push("gateway".into());
                if st.kube {
                    a.push("--kubeconfig".into());
                    a.push(self.gateway_kubeconfig().display().to_string());
                }
                a.extend([
                    format!("--status-address={address}"),
                    format!("--metrics-addr={}", crate::l7::GATEWAY_METRICS),
                    "--access-log".into(),
                ]);
            }
        }
        a
    }

    pub(crate) fn agent_args(&self, st: &LabState, node: &NodeInfo) -> Vec<String> {
        self.daemon_args(st, Daemon::Agent(node))
    }

    /// Starts a forwarder into `netns` when its daemons need this machine's
    /// loopback: the store's etcd there, or the lab's kube-apiserver
    /// (recorded as role `role`).
    pub(crate) fn ensure_forwarder(
        &self,
        st: &LabState,
        role: &str,
        netns: &str,
    ) -> Result<(), LabError> {
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
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::state::tests::state;

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
}
