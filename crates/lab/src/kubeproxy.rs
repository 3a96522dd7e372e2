//! The real kube-proxy (`--proxy-mode=nftables`) as a Kubernetes-mode lab's
//! service proxy, in place of podnet's: what the proxy benchmark and the
//! packet-flow differential test compare podnet's proxy with.
//!
//! The swap is per lab, both ways:
//! - [`Lab::agents_without_proxy`] restarts every node's agent with
//!   `--no-proxy` (the overlay and NetworkPolicy stay podnet's) and deletes
//!   podnet's proxy tables (`ip podnet`, `ip6 podnet`), so nothing of
//!   podnet's proxy is left to answer;
//! - [`Lab::start_kube_proxy`] starts one kube-proxy per node, inside the
//!   node's namespace, as kubeadm runs it: its own ServiceAccount
//!   `kube-system/kube-proxy` bound to the apiserver's bootstrap role
//!   `system:node-proxier`, `--hostname-override` the node's name,
//!   `--cluster-cidr` the lab's pod network, its metrics and healthz on
//!   loopback inside the namespace ([`METRICS_ADDR`], [`HEALTHZ_ADDR`]:
//!   the agent keeps its own). It returns once every node's kube-proxy
//!   answers `/healthz` and has programmed its table once;
//! - dropping the returned [`KubeProxies`] stops them and deletes their
//!   tables (`ip kube-proxy`, `ip6 kube-proxy`: kube-proxy leaves its rules
//!   in place when stopped); [`Lab::restart_agent`] then
//!   [`Lab::wait_agent_synced`] brings podnet's proxy back.
//!
//! Each kube-proxy is a lab role (`kube-proxy-<node>`: pid file and log in
//! the lab directory), so `lab down` stops it even after a crash. The
//! binary is the one `scripts/k8s-peers.sh kube-proxy` builds and caches
//! ([`find_binary`]).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use podnet_kernel::Netns;
use podnet_nft::model::Family;
use podnet_nft::netlink::Conn;

use crate::error::{io, msg, LabError};
use crate::process::spawn_logged;
use crate::upgrade::http_get;
use crate::{kube, Lab, NodeInfo, AGENT_CAPS};

/// kube-proxy's nftables table (in both families).
pub const TABLE: &str = "kube-proxy";
/// podnet's proxy table (in both families; `podnet_proxy::rules::TABLE`,
/// which the lab does not depend on for one name), removed while
/// kube-proxy runs.
pub const PODNET_TABLE: &str = "podnet";
/// kube-proxy's `/metrics` inside a node's namespace (its default port,
/// 10249, is the agent's there).
pub const METRICS_ADDR: &str = "127.0.0.1:10349";
/// kube-proxy's `/healthz` inside a node's namespace.
pub const HEALTHZ_ADDR: &str = "127.0.0.1:10356";
/// kube-proxy's ServiceAccount, in [`kube::RBAC_NAMESPACE`], as kubeadm
/// names it.
pub const ACCOUNT: &str = "kube-proxy";
/// How long starting the proxies may take before it fails, by default
/// ([`Options::timeout`]; also the bound on each agent's restart).
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// kube-proxy's identity and rights, as kubeadm installs them: a
/// ServiceAccount bound to the role the apiserver bootstraps for proxies.
const RBAC: &str = "apiVersion: v1
kind: ServiceAccount
metadata: {name: kube-proxy, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: 'podnet-lab:node-proxier'}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'system:node-proxier'}
subjects: [{kind: ServiceAccount, name: kube-proxy, namespace: kube-system}]
";

/// The kube-proxy binary: `KUBE_PROXY` in the environment, else the one
/// `scripts/k8s-peers.sh kube-proxy` has cached (run with `GOPROXY=off`,
/// so a machine without it fails at once, naming the script, instead of
/// downloading behind a test's back).
pub fn find_binary() -> Result<PathBuf, LabError> {
    if let Some(p) = std::env::var_os("KUBE_PROXY") {
        return Ok(PathBuf::from(p));
    }
    let script = kube::peers_script();
    let out = Command::new("bash")
        .arg(&script)
        .arg("kube-proxy")
        .env("GOPROXY", "off")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io(format!("running {}", script.display()), e))?;
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("KUBE_PROXY="))
        .map(PathBuf::from);
    match path {
        Some(p) if out.status.success() && p.exists() => Ok(p),
        _ => Err(msg(format!(
            "kube-proxy is not built; run `bash {} kube-proxy` (it builds and caches it): {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// How [`Lab::start_kube_proxy`] runs kube-proxy.
#[derive(Debug, Clone)]
pub struct Options {
    /// The binary ([`find_binary`]).
    pub binary: PathBuf,
    /// More flags, after the lab's (say `--iptables-min-sync-period=0`).
    pub extra_args: Vec<String>,
    /// How long every node's kube-proxy may take to be synced (a first
    /// sync of many Services on a loaded machine takes a while).
    pub timeout: Duration,
}

impl Options {
    /// `binary` with no extra flags and [`START_TIMEOUT`].
    pub fn new(binary: PathBuf) -> Options {
        Options {
            binary,
            extra_args: Vec::new(),
            timeout: START_TIMEOUT,
        }
    }
}

/// kube-proxy running on every node of a lab. Dropping it stops every one
/// of them and deletes their tables; [`KubeProxies::stop`] does the same
/// and says what failed.
#[derive(Debug)]
pub struct KubeProxies {
    lab: Lab,
    nodes: Vec<NodeInfo>,
    stopped: bool,
}

/// The lab role (pid file, log) of the kube-proxy on `node`.
pub fn role(node: &str) -> String {
    format!("kube-proxy-{node}")
}

/// Deletes table `name`, both families, inside namespace `netns` (absent
/// tables are fine).
fn delete_tables(netns: &str, name: &str) -> Result<(), LabError> {
    let mut c = Netns::named(netns)?.run(Conn::open)??;
    for fam in [Family::Ip, Family::Ip6] {
        c.delete_table(fam, name)?;
    }
    Ok(())
}

/// Whether `ip <name>` exists inside namespace `netns`.
fn has_table(netns: &str, name: &str) -> Result<bool, LabError> {
    let mut c = Netns::named(netns)?.run(Conn::open)??;
    Ok(c.table_use(Family::Ip, name)?.is_some())
}

/// Whether a kube-proxy `/metrics` text says it has synced its rules at
/// least once.
fn synced_once(metrics: &str) -> bool {
    // Labelled or not (some versions label it with the IP family).
    metrics.lines().any(|l| {
        l.strip_prefix("kubeproxy_sync_proxy_rules_last_timestamp_seconds")
            .filter(|rest| rest.starts_with([' ', '{']))
            .and_then(|rest| rest.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(|t| t > 0.0)
    })
}

impl Lab {
    /// Restarts every node's agent with `--no-proxy` and deletes podnet's
    /// proxy tables there, waiting until each agent is ready with its
    /// overlay synced: afterwards no podnet rule handles Service traffic.
    pub fn agents_without_proxy(&self) -> Result<(), LabError> {
        let st = self.state()?;
        for node in &st.nodes {
            let role = format!("agent-{}", node.name);
            self.kill_role(&role);
            let mut args = self.agent_args(&st, node);
            args.push("--no-proxy".into());
            self.spawn_daemon(&role, Some(&node.netns), &args, AGENT_CAPS)?;
            delete_tables(&node.netns, PODNET_TABLE)?;
        }
        for node in &st.nodes {
            self.wait_agent_subsystems(&node.name, &["overlay"], START_TIMEOUT)?;
        }
        Ok(())
    }

    /// Starts kube-proxy (nftables mode) on every node and waits until each
    /// answers `/healthz` with 200, reports a completed sync on `/metrics`
    /// and holds its table. Run [`Lab::agents_without_proxy`] first: two
    /// proxies on one node both answer Service traffic.
    pub async fn start_kube_proxy(&self, o: &Options) -> Result<KubeProxies, LabError> {
        let st = self.state()?;
        if !st.kube {
            return Err(msg(
                "kube-proxy needs a Kubernetes-mode lab (lab up --kube)",
            ));
        }
        let cp = kube::ControlPlane::open(&self.dir)?;
        let c = cp.client().await?;
        kube::apply_rbac(&c, RBAC).await?;
        let kubeconfig = self.dir.join("kube-proxy-kubeconfig");
        cp.write_service_account_kubeconfig(&c, ACCOUNT, None, &kubeconfig)
            .await?;
        // From here on, dropping stops whatever started.
        let mut kp = KubeProxies {
            lab: self.clone(),
            nodes: Vec::new(),
            stopped: false,
        };
        for node in &st.nodes {
            let mut cmd = Command::new(&o.binary);
            cmd.args([
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--hostname-override={}", node.name),
                "--proxy-mode=nftables".into(),
                format!("--cluster-cidr={}", kube::CLUSTER_CIDR),
                format!("--metrics-bind-address={METRICS_ADDR}"),
                format!("--healthz-bind-address={HEALTHZ_ADDR}"),
                // A node namespace shares the machine's conntrack limits
                // and timeouts: leave them as they are.
                "--conntrack-max-per-core=0".into(),
                "--conntrack-tcp-timeout-established=0".into(),
                "--conntrack-tcp-timeout-close-wait=0".into(),
                "--v=1".into(),
            ]);
            cmd.args(&o.extra_args);
            kp.nodes.push(node.clone());
            spawn_logged(&self.dir, &role(&node.name), &mut cmd, Some(&node.netns))?;
        }
        let deadline = Instant::now() + o.timeout;
        for node in &st.nodes {
            let r = role(&node.name);
            loop {
                let healthy = matches!(
                    http_get(&node.netns, HEALTHZ_ADDR, "/healthz"),
                    Some((200, _))
                );
                let synced = healthy
                    && http_get(&node.netns, METRICS_ADDR, "/metrics")
                        .is_some_and(|(code, m)| code == 200 && synced_once(&m));
                if synced && has_table(&node.netns, TABLE)? {
                    break;
                }
                if !self.role_alive(&r) {
                    return Err(msg(format!(
                        "kube-proxy on {} exited; see {}",
                        node.name,
                        self.log_path(&r).display()
                    )));
                }
                if Instant::now() > deadline {
                    // The log's tail goes into the error: the caller's
                    // guard may take the lab (and its logs) down.
                    let log = std::fs::read_to_string(self.log_path(&r)).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(30).collect();
                    let sync_lines: Vec<String> = http_get(&node.netns, METRICS_ADDR, "/metrics")
                        .map(|(_, m)| {
                            m.lines()
                                .filter(|l| l.starts_with("kubeproxy_sync_proxy_rules_last"))
                                .map(str::to_string)
                                .collect()
                        })
                        .unwrap_or_default();
                    return Err(msg(format!(
                        "kube-proxy on {} not synced after {:?} (/healthz 200: {healthy}, \
                         sync metrics: {sync_lines:?}, table {TABLE}: {}); {}'s last lines:\n{}",
                        node.name,
                        o.timeout,
                        has_table(&node.netns, TABLE)?,
                        self.log_path(&r).display(),
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    )));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(kp)
    }
}

impl KubeProxies {
    /// The nodes kube-proxy runs on.
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    /// The pid of the kube-proxy on `node`, while it runs.
    pub fn pid(&self, node: &str) -> Option<i32> {
        std::fs::read_to_string(self.lab.dir.join("pids").join(role(node)))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Stops every kube-proxy and deletes its tables on every node.
    pub fn stop(mut self) -> Result<(), LabError> {
        self.stop_all()
    }

    fn stop_all(&mut self) -> Result<(), LabError> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        let mut first_err = None;
        for node in &self.nodes {
            self.lab.kill_role(&role(&node.name));
            if let Err(e) = delete_tables(&node.netns, TABLE) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for KubeProxies {
    fn drop(&mut self) {
        if let Err(e) = self.stop_all() {
            tracing::warn!("stopping kube-proxy: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_timestamp_means_synced() {
        let m = "# HELP x\nkubeproxy_sync_proxy_rules_last_timestamp_seconds 1.7e+09\n";
        assert!(synced_once(m));
        assert!(!synced_once(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds 0\n"
        ));
        assert!(!synced_once(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds_x 5\n"
        ));
        assert!(synced_once(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1.7e+09\n"
        ));
    }
}
