//! Replacing the binaries of a running lab's daemons one at a time, as a
//! rolling upgrade (or downgrade) does, for the upgrade and version-skew
//! tests (`podnet/tests/upgrade.rs`). Kept apart from the lab's plumbing
//! (`lib.rs`) because it is one concern: which binary each daemon runs, and
//! how to swap it without the cluster noticing.
//!
//! - Which binary: every daemon role (`agent-<node>`, `dns`, `dns-<i>`)
//!   runs the lab's own executable unless `<lab dir>/exe/<role>` (a
//!   symlink) names another. [`UpOptions::daemon_exe`] sets it for every
//!   agent and DNS replica at `lab up`; [`Lab::restart_agent_with`] and
//!   [`Lab::replace_dns`] for one daemon. A daemon restarted any other way
//!   (`restart-agent`) keeps its role's binary, as a node keeps what is
//!   installed on it. Everything else (the CNI plugins, `podnet serve`, the
//!   forwarders, `agent --cleanup`) runs the lab's own executable.
//! - An agent is replaced as a DaemonSet's rolling update does it: stopped
//!   without cleanup (SIGTERM: the data plane stays and keeps forwarding),
//!   started from the other binary, and waited for until `/readyz` passes
//!   and its overlay and service proxy have each completed a full sync
//!   ([`Lab::wait_agent_synced`]).
//! - Cluster DNS with several replicas ([`UpOptions::dns_replicas`],
//!   Kubernetes mode): replica 1 is `kube-system/podnet-dns` on the first
//!   node, as in every lab; replica `i` is `podnet-dns-<i>` on the nodes in
//!   turn, all labelled `k8s-app=kube-dns` behind the `kube-dns` Service.
//! - A DNS replica is replaced as a Deployment's rolling update with a
//!   readiness probe does ([`Lab::replace_dns`], in two halves so a test
//!   can watch the gap: [`Lab::stop_dns`], [`Lab::start_dns_with`]): its
//!   pod is marked not Ready (the kubelet's part), then drained:
//!   kube-controller-manager's EndpointSlice says not ready, and every
//!   node's proxy no longer DNATs to it and holds no UDP conntrack entry
//!   towards it (so no client's next query follows a stale entry); then it
//!   is stopped, started from the other binary, probed until ready (its
//!   `/readyz` and an answer on its pod IP), marked Ready, and waited for
//!   until every proxy sends to it again. No sleep stands in for any of
//!   these states: each is polled until it holds, within a deadline.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use podnet_api::netconfig;
use podnet_daemon::HttpGet;
use podnet_kernel::Netns;

use crate::clusterdns::{dns_answers, dns_labels};
use crate::error::{io, msg, LabError};
use crate::{
    kubelet, Daemon, Lab, LabState, PodInfo, UpOptions, DNS_NAMESPACE, DNS_POD, DNS_SERVICE,
};

/// Where the per-role binary links live, in the lab directory.
const EXE_DIR: &str = "exe";
/// The agents' metrics and health address, inside their node's namespace
/// (see [`Lab::daemon_args`]).
pub const AGENT_METRICS: &str = "127.0.0.1:10249";
/// The DNS servers' metrics and health address, inside their pod.
pub const DNS_METRICS: &str = "127.0.0.1:9153";
/// The subsystems every agent version runs, whose first full sync makes
/// an agent "synced" ([`Lab::wait_agent_synced`]).
pub const AGENT_SUBSYSTEMS: &[&str] = &["overlay", "proxy"];
/// How long one agent or DNS replacement may take before it fails.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// One replica of the lab's cluster DNS: where it runs and under which
/// names the lab records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsReplica {
    /// 1-based.
    pub index: usize,
    /// Its pod in `kube-system`.
    pub pod: String,
    /// Its process's role (pid file, log).
    pub role: String,
    /// The role of the forwarder that brings the apiserver into its pod.
    pub forwarder: String,
    pub node: String,
}

/// Refuses what `lab up` cannot do with the rollout options, before
/// anything is made.
pub(crate) fn check_options(o: &UpOptions) -> Result<(), LabError> {
    if o.dns_replicas > 1 && !(o.kube && o.kube_agents) {
        return Err(msg(format!(
            "{} DNS replicas: more than one needs Kubernetes mode with agents (--kube), \
             where readiness drives the kube-dns endpoints",
            o.dns_replicas
        )));
    }
    if let Some(exe) = &o.daemon_exe {
        if !exe.is_file() {
            return Err(msg(format!(
                "daemon binary {}: no such file",
                exe.display()
            )));
        }
    }
    Ok(())
}

fn is_daemon_role(role: &str) -> bool {
    role.starts_with("agent-") || role == "dns" || role.starts_with("dns-")
}

/// `GET path` over HTTP/1.0 to `addr` from inside `netns`: the status code
/// and body, or `None` when nothing answers (a daemon starting or gone).
pub(crate) fn http_get(netns: &str, addr: &str, path: &str) -> Option<(u16, String)> {
    let addr: SocketAddr = addr.parse().ok()?;
    let ns = Netns::named(netns).ok()?;
    let r = HttpGet::new(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(2))
        .netns(Some(&ns))
        .get(addr, path)
        .ok()?;
    Some((r.status, r.body))
}

/// Whether the policy table in `netns` fails closed on the node's pod
/// subnet yet (its judge chain sends unknown addresses to `deny-unknown`).
fn policy_fails_closed(netns: &str) -> bool {
    Netns::named(netns)
        .ok()
        .and_then(|ns| {
            ns.run(|| {
                Command::new("nft")
                    .args(["list", "chain", "ip", "podnet-policy", "judge"])
                    .output()
            })
            .ok()
        })
        .and_then(|o| o.ok())
        .is_some_and(|o| String::from_utf8_lossy(&o.stdout).contains("deny-unknown"))
}

/// The subsystems with at least one successful full sync, from an agent's
/// `/metrics` (`podnet_reconcile_syncs_total{subsystem="…",scope="full"}`).
pub fn fully_synced(metrics: &str) -> Vec<String> {
    let mut out = Vec::new();
    for l in metrics.lines() {
        let Some(rest) = l.strip_prefix("podnet_reconcile_syncs_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        if !labels.contains("scope=\"full\"") {
            continue;
        }
        let n: f64 = value.trim().parse().unwrap_or(0.0);
        let sub = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix("subsystem=\""))
            .map(|v| v.trim_end_matches('"').to_string());
        if let (Some(sub), true) = (sub, n >= 1.0) {
            out.push(sub);
        }
    }
    out
}

/// Whether `text` holds `ip` as a whole address (not as the prefix of a
/// longer one: 10.0.0.1 is not in 10.0.0.12).
fn mentions_ip(text: &str, ip: &str) -> bool {
    text.split(|c: char| !(c.is_ascii_hexdigit() || c == '.' || c == ':'))
        .any(|t| t == ip)
}

/// Runs `program args` inside the named namespace (`ip netns exec`).
fn output_in(netns: &str, program: &str, args: &[&str]) -> Result<String, LabError> {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, program])
        .args(args)
        .output()
        .map_err(|e| io(format!("running {program} in {netns}"), e))?;
    if !out.status.success() {
        return Err(msg(format!(
            "{program} {} in {netns}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Lab {
    fn exe_link(&self, role: &str) -> PathBuf {
        self.dir.join(EXE_DIR).join(role)
    }

    /// The binary role `role` runs (see the module docs): its own link,
    /// else for a daemon the lab-wide daemon link, else the lab's own.
    pub fn role_exe(&self, role: &str) -> PathBuf {
        if let Ok(p) = std::fs::read_link(self.exe_link(role)) {
            return p;
        }
        if is_daemon_role(role) {
            if let Ok(p) = std::fs::read_link(self.exe_link("daemons")) {
                return p;
            }
        }
        self.exe.clone()
    }

    /// The binary node `node`'s agent runs.
    pub fn agent_exe(&self, node: &str) -> PathBuf {
        self.role_exe(&format!("agent-{node}"))
    }

    /// Records that role `role` runs `exe` from its next start on.
    fn set_role_exe(&self, role: &str, exe: &Path) -> Result<(), LabError> {
        let dir = self.dir.join(EXE_DIR);
        std::fs::create_dir_all(&dir).map_err(|e| io(format!("creating {}", dir.display()), e))?;
        let exe = std::fs::canonicalize(exe).map_err(|e| io(format!("{}", exe.display()), e))?;
        let link = self.exe_link(role);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&exe, &link)
            .map_err(|e| io(format!("linking {}", link.display()), e))
    }

    /// `lab up`: the daemons' binary, when it is not the lab's own.
    pub(crate) fn record_daemon_exe(&self, o: &UpOptions) -> Result<(), LabError> {
        match &o.daemon_exe {
            Some(exe) => self.set_role_exe("daemons", exe),
            None => Ok(()),
        }
    }

    /// The `/metrics` text of node `node`'s agent.
    pub fn agent_metrics(&self, node: &str) -> Result<String, LabError> {
        let n = self.node_info(node)?;
        match http_get(&n.netns, AGENT_METRICS, "/metrics") {
            Some((200, body)) => Ok(body),
            other => Err(msg(format!(
                "agent on {node}: /metrics answered {:?}",
                other.map(|o| o.0)
            ))),
        }
    }

    pub(crate) fn node_info(&self, node: &str) -> Result<crate::NodeInfo, LabError> {
        self.node_in(&self.state()?, node)
    }

    /// Waits until node `node`'s agent passes `/readyz` and its overlay,
    /// its service proxy and the subsystems in `also` (say, `policy` for a
    /// version that has it) have each completed a full sync: the kernel
    /// then holds what this agent planned, not what its predecessor left.
    pub fn wait_agent_synced(
        &self,
        node: &str,
        also: &[&str],
        timeout: Duration,
    ) -> Result<(), LabError> {
        let want: Vec<&str> = AGENT_SUBSYSTEMS.iter().chain(also).copied().collect();
        self.wait_agent_subsystems(node, &want, timeout)
    }

    /// [`Lab::wait_agent_synced`] for exactly the subsystems `want` (an
    /// agent run with `--no-proxy` has no proxy to wait for).
    pub(crate) fn wait_agent_subsystems(
        &self,
        node: &str,
        want: &[&str],
        timeout: Duration,
    ) -> Result<(), LabError> {
        let n = self.node_info(node)?;
        let role = format!("agent-{node}");
        let deadline = Instant::now() + timeout;
        loop {
            let ready = http_get(&n.netns, AGENT_METRICS, "/readyz");
            let synced = match http_get(&n.netns, AGENT_METRICS, "/metrics") {
                Some((200, m)) => fully_synced(&m),
                _ => vec![],
            };
            let missing: Vec<&str> = want
                .iter()
                .filter(|s| !synced.iter().any(|x| x == *s))
                .copied()
                .collect();
            // The policy plane's first full sync can come before it knows
            // the node's subnet; it fails closed on it from the sync after.
            let closed = !want.contains(&"policy") || policy_fails_closed(&n.netns);
            if matches!(ready, Some((200, _))) && missing.is_empty() && closed {
                return Ok(());
            }
            if !self.role_alive(&role) {
                return Err(msg(format!(
                    "the agent on {node} ({}) exited; see {}",
                    self.agent_exe(node).display(),
                    self.log_path(&role).display()
                )));
            }
            if Instant::now() > deadline {
                // The log's tail goes into the error: a test's guard takes
                // the lab (and its logs) down before anyone can look.
                let log = std::fs::read_to_string(self.log_path(&role)).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                return Err(msg(format!(
                    "the agent on {node} is not synced after {timeout:?} (/readyz: {:?}; no full sync yet: {missing:?}); {}'s last lines:\n{}",
                    ready.map(|r| r.0),
                    self.log_path(&role).display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Replaces node `node`'s agent with `exe`, as a rolling update of the
    /// agents' DaemonSet does on one node: stops it without cleanup (the
    /// data plane stays in place and keeps forwarding), starts `exe` with
    /// the same command line, and waits until it is synced
    /// ([`Lab::wait_agent_synced`]).
    pub fn restart_agent_with(&self, node: &str, exe: &Path) -> Result<(), LabError> {
        let st = self.state()?;
        let n = self.node_info(node)?;
        self.stop_agent(node, false)?;
        self.set_role_exe(&format!("agent-{node}"), exe)?;
        self.start_agent(&st, &n)?;
        self.wait_agent_synced(node, &[], STEP_TIMEOUT)
    }

    /// Restarts node `node`'s agent with `extra` arguments after the lab's
    /// own (`--no-flows`, `--no-proxy`: a benchmark's other contender), and
    /// waits until it has synced.
    pub fn restart_agent_args(&self, node: &str, extra: &[&str]) -> Result<(), LabError> {
        let st = self.state()?;
        let n = self.node_info(node)?;
        self.stop_agent(node, false)?;
        let mut args = self.daemon_args(&st, crate::Daemon::Agent(&n));
        args.extend(extra.iter().map(|s| s.to_string()));
        self.ensure_forwarder(&st, &format!("forward-{node}"), &n.netns)?;
        self.spawn_daemon(
            &format!("agent-{node}"),
            Some(&n.netns),
            &args,
            crate::daemon::agent_caps(&st),
        )?;
        self.wait_agent_synced(node, &[], STEP_TIMEOUT)
    }

    /// Cluster DNS replica `index` (1-based): its names and node.
    pub fn dns_replica(&self, index: usize) -> Result<DnsReplica, LabError> {
        let st = self.state()?;
        if index == 0 || st.nodes.is_empty() {
            return Err(msg(format!("no DNS replica {index}")));
        }
        let node = st.nodes[(index - 1) % st.nodes.len()].name.clone();
        let suffix = |base: &str| match index {
            1 => base.to_string(),
            i => format!("{base}-{i}"),
        };
        Ok(DnsReplica {
            index,
            pod: suffix(DNS_POD),
            role: suffix("dns"),
            forwarder: suffix("forward-dns"),
            node,
        })
    }

    /// `lab up`: DNS replicas 2 to `replicas` (replica 1 is started by
    /// `start_dns`), each serving and in every node's proxy before the
    /// next.
    pub(crate) async fn start_dns_replicas(
        &self,
        st: &LabState,
        replicas: usize,
    ) -> Result<(), LabError> {
        if replicas < 2 {
            return Ok(());
        }
        for i in 2..=replicas {
            let r = self.dns_replica(i)?;
            let pod = self
                .run_pod(
                    DNS_NAMESPACE,
                    &r.pod,
                    Some(&r.node),
                    dns_labels().into(),
                    &[],
                )
                .await?;
            self.ensure_forwarder(st, &r.forwarder, &pod.netns)?;
            self.spawn_dns(st, &r, &pod)?;
            self.wait_dns_serving(&r, &pod, Instant::now() + STEP_TIMEOUT)?;
        }
        let deadline = Instant::now() + STEP_TIMEOUT;
        for i in 1..=replicas {
            let pod = self.pod(DNS_NAMESPACE, &self.dns_replica(i)?.pod)?;
            self.wait_proxies(st, &pod.ip, true, deadline).await?;
        }
        Ok(())
    }

    fn spawn_dns(&self, st: &LabState, r: &DnsReplica, pod: &PodInfo) -> Result<u32, LabError> {
        let upstreams = dns_upstreams();
        self.spawn_daemon(
            &r.role,
            Some(&pod.netns),
            &self.daemon_args(
                st,
                Daemon::Dns {
                    node: &r.node,
                    upstreams: &upstreams,
                },
            ),
            crate::DNS_CAPS,
        )
    }

    /// What a readiness probe waits for: the replica's `/readyz` passes
    /// (its first full load is done) and it answers on its pod IP.
    fn wait_dns_serving(
        &self,
        r: &DnsReplica,
        pod: &PodInfo,
        deadline: Instant,
    ) -> Result<(), LabError> {
        let node_ns = Netns::named(&self.node_info(&r.node)?.netns)?;
        let ip: IpAddr = pod
            .ip
            .parse()
            .map_err(|_| msg(format!("DNS pod {} has no IP ({:?})", r.pod, pod.ip)))?;
        let probe = format!("dns-version.{}", netconfig::DEFAULT_ZONE);
        loop {
            let ready = matches!(http_get(&pod.netns, DNS_METRICS, "/readyz"), Some((200, _)));
            if ready && node_ns.run(|| dns_answers(SocketAddr::new(ip, 53), &probe))? {
                return Ok(());
            }
            if !self.role_alive(&r.role) {
                return Err(msg(format!(
                    "DNS replica {} ({}) exited; see {}",
                    r.index,
                    self.role_exe(&r.role).display(),
                    self.log_path(&r.role).display()
                )));
            }
            if Instant::now() > deadline {
                return Err(msg(format!(
                    "DNS replica {} does not serve on {ip} (ready: {ready}); see {}",
                    r.index,
                    self.log_path(&r.role).display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the kube-dns EndpointSlices list `ip`, and if so whether
    /// ready.
    async fn dns_endpoint(c: &kube::Client, ip: &str) -> Result<Option<bool>, LabError> {
        let api: Api<EndpointSlice> = Api::namespaced(c.clone(), DNS_NAMESPACE);
        let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={DNS_SERVICE}"));
        let slices = api
            .list(&lp)
            .await
            .map_err(|e| msg(format!("listing the {DNS_SERVICE} EndpointSlices: {e}")))?;
        Ok(slices
            .items
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .find(|e| e.addresses.iter().any(|a| a == ip))
            .map(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true)))
    }

    /// Waits until kube-controller-manager's EndpointSlice shows the DNS
    /// endpoint `ip` ready (`ready`) or not ready or gone (`!ready`).
    async fn wait_dns_endpoint(
        &self,
        c: &kube::Client,
        ip: &str,
        ready: bool,
        deadline: Instant,
    ) -> Result<(), LabError> {
        loop {
            let got = Self::dns_endpoint(c, ip).await?;
            let ok = match ready {
                true => got == Some(true),
                false => got != Some(true),
            };
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(msg(format!(
                    "the {DNS_SERVICE} EndpointSlice never showed {ip} {} (last: {got:?})",
                    if ready { "ready" } else { "not ready" }
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Per node: whether its service proxy's table (`ip podnet`) DNATs to
    /// `ip`, and how many UDP conntrack entries lead there from the DNS
    /// Service.
    pub fn proxy_view(
        &self,
        st: &LabState,
        ip: &str,
    ) -> Result<BTreeMap<String, (bool, usize)>, LabError> {
        let mut out = BTreeMap::new();
        for n in &st.nodes {
            let table = output_in(&n.netns, "nft", &["list", "table", "ip", "podnet"])?;
            let ct = output_in(
                &n.netns,
                "conntrack",
                &[
                    "-L",
                    "-p",
                    "udp",
                    "--orig-dst",
                    netconfig::DEFAULT_DNS_IP,
                    "--reply-src",
                    ip,
                ],
            )?;
            out.insert(
                n.name.clone(),
                (
                    mentions_ip(&table, ip),
                    ct.lines().filter(|l| !l.is_empty()).count(),
                ),
            );
        }
        Ok(out)
    }

    /// Waits until every node's proxy sends to `ip` (`present`), or until
    /// none does and none keeps a UDP conntrack entry towards it from the
    /// DNS Service (the proxy flushes those when it drops an endpoint).
    async fn wait_proxies(
        &self,
        st: &LabState,
        ip: &str,
        present: bool,
        deadline: Instant,
    ) -> Result<(), LabError> {
        loop {
            let view = self.proxy_view(st, ip)?;
            let ok = view.values().all(|&(has, ct)| match present {
                true => has,
                false => !has && ct == 0,
            });
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(msg(format!(
                    "the nodes' proxies never {} {ip} (node: (in table, UDP conntrack entries)): {view:?}",
                    if present { "all sent to" } else { "all dropped" }
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Replaces DNS replica `index`'s server with `exe` without a failed
    /// query: [`Lab::stop_dns`], then [`Lab::start_dns_with`].
    pub async fn replace_dns(&self, index: usize, exe: &Path) -> Result<(), LabError> {
        self.stop_dns(index).await?;
        self.start_dns_with(index, exe).await
    }

    /// The first half of a DNS replica's replacement: its pod marked not
    /// Ready, drained from every proxy (see the module docs), its server
    /// stopped. The other replicas answer meanwhile. Kubernetes mode only:
    /// readiness is the API's Pod status.
    pub async fn stop_dns(&self, index: usize) -> Result<(), LabError> {
        let (st, r, pod, c) = self.dns_rollout(index).await?;
        let deadline = Instant::now() + STEP_TIMEOUT;
        kubelet::set_pod_ready(&c, DNS_NAMESPACE, &r.pod, false).await?;
        self.wait_dns_endpoint(&c, &pod.ip, false, deadline).await?;
        self.wait_proxies(&st, &pod.ip, false, deadline).await?;
        self.kill_role(&r.role);
        Ok(())
    }

    /// The second half: DNS replica `index`'s server started from `exe`,
    /// serving, its pod marked Ready, and every proxy sending to it again.
    pub async fn start_dns_with(&self, index: usize, exe: &Path) -> Result<(), LabError> {
        let (st, r, pod, c) = self.dns_rollout(index).await?;
        let deadline = Instant::now() + STEP_TIMEOUT;
        self.kill_role(&r.role);
        self.set_role_exe(&r.role, exe)?;
        self.spawn_dns(&st, &r, &pod)?;
        self.wait_dns_serving(&r, &pod, deadline)?;
        kubelet::set_pod_ready(&c, DNS_NAMESPACE, &r.pod, true).await?;
        self.wait_dns_endpoint(&c, &pod.ip, true, deadline).await?;
        self.wait_proxies(&st, &pod.ip, true, deadline).await?;
        Ok(())
    }

    /// What a DNS replica's replacement works with.
    async fn dns_rollout(
        &self,
        index: usize,
    ) -> Result<(LabState, DnsReplica, PodInfo, kube::Client), LabError> {
        let st = self.state()?;
        if !st.kube {
            return Err(msg("replacing a DNS replica needs a --kube lab"));
        }
        let r = self.dns_replica(index)?;
        let pod = self.pod(DNS_NAMESPACE, &r.pod)?;
        let c = self.kube_client().await?;
        Ok((st, r, pod, c))
    }
}

/// The DNS servers' upstreams: the machine's nameservers, minus loopback
/// ones (a pod's loopback is its own).
pub(crate) fn dns_upstreams() -> Vec<String> {
    std::fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<IpAddr>().ok())
        .filter(|ip| !ip.is_loopback())
        .map(|ip| ip.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_syncs_are_read_per_subsystem() {
        let m = "# HELP podnet_reconcile_syncs_total Syncs\n\
                 podnet_reconcile_syncs_total{subsystem=\"overlay\",scope=\"full\"} 1\n\
                 podnet_reconcile_syncs_total{subsystem=\"proxy\",scope=\"partial\"} 4\n\
                 podnet_reconcile_syncs_total{subsystem=\"policy\",scope=\"full\"} 0\n";
        assert_eq!(fully_synced(m), vec!["overlay".to_string()]);
    }

    #[test]
    fn an_address_is_matched_whole() {
        let t = "elements = { 10.96.0.10 . udp . 53 : 10.244.1.12 . 53 }";
        assert!(mentions_ip(t, "10.244.1.12"));
        assert!(!mentions_ip(t, "10.244.1.1"));
        assert!(!mentions_ip(t, "10.96.0.1"));
    }

    #[test]
    fn more_dns_replicas_need_kubernetes_mode() {
        let o = UpOptions {
            resync_secs: 1,
            kube_agents: false,
            dns_replicas: 2,
            ..UpOptions::new(2, "vxlan")
        };
        assert!(check_options(&o).is_err());
        let k = UpOptions {
            kube: true,
            kube_agents: true,
            ..o.clone()
        };
        assert!(check_options(&k).is_ok());
        let missing = UpOptions {
            daemon_exe: Some("/nonexistent/podnet".into()),
            ..k
        };
        assert!(check_options(&missing).is_err());
    }
}
