//! The pod network between nodes: flannel's job. Given this node's subnet
//! and every other node's (from `podnet_source::subnets`, leases or Node
//! podCIDRs), it keeps the kernel able to reach every pod:
//!
//! - [`backend`]: the [`Backend`] enum, one job per backend (vxlan,
//!   host-gw, udp); the only place that matches on the backend type;
//! - [`plan`]: the pure data of routes, neighbours and FDB entries, and
//!   their diff;
//! - [`kernel`]: the netlink edge that observes and applies them (podnet's
//!   routes carry their own protocol number);
//! - [`tunnel`], [`gso`]: the udp backend's userspace data path;
//! - [`masq`]: the masquerade table `ip podnet-masq`;
//! - [`files`]: subnet.env and the CNI conflist;
//! - [`claim`]: the node's subnet claim kept while the loop runs, as the
//!   node agent runs it.
//!
//! [`Overlay`] is a subsystem of the one reconcile loop
//! (`podnet_reconcile`): watch the subnet map, plan (pure, by the backend),
//! observe the kernel, diff, apply. A repeated sync changes nothing; a
//! resync repairs anything deleted behind our back.

pub mod backend;
pub mod claim;
pub mod files;
pub mod gso;
pub mod kernel;
pub mod masq;
pub mod plan;
pub mod tunnel;
pub mod wg;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use ipnet::Ipv4Net;
use podnet_api::netconfig::Resolved;
use podnet_daemon::Metrics;
use podnet_kernel::Handle;
use podnet_reconcile::{Scope, Subsystem, SyncError};
use podnet_source::subnets::{Attrs, SubnetLease, SubnetMap};

pub use backend::Backend;
pub use masq::{MasqTable, MASQ_TABLE};

const AGENT_SYNCS_TOTAL: podnet_daemon::Counter =
    podnet_daemon::Counter::new("podnet_agent_syncs_total", "Syncs run.");
const AGENT_LEASES: podnet_daemon::Gauge =
    podnet_daemon::Gauge::new("podnet_agent_leases", "Subnet leases known.");
const WG_PACKETS_TOTAL: podnet_daemon::Gauge = podnet_daemon::Gauge::new(
    "podnet_wireguard_packets_total",
    "Packets of the encrypted overlay: sent (encrypted), received (decrypted and delivered), rejected (not from a peer, not authentic, or from outside the sender's subnet).",
);
const AGENT_SYNC_OPS_TOTAL: podnet_daemon::Counter =
    podnet_daemon::Counter::new("podnet_agent_sync_ops_total", "Kernel operations applied.");

#[derive(Debug, thiserror::Error)]
pub enum OverlayError {
    #[error("kernel: {0}")]
    Kernel(#[from] podnet_kernel::KernelError),
    #[error("{0}")]
    Other(String),
}

/// Where the node's files go.
#[derive(Debug, Clone)]
pub struct Paths {
    /// subnet.env, read by the `podnet` CNI meta-plugin.
    pub subnet_file: PathBuf,
    pub cni_conf_dir: PathBuf,
    pub cni_data_dir: Option<PathBuf>,
}

/// What feeds the overlay's loop: the subnet map, or this node's own
/// subnet after a (re-)acquisition.
#[derive(Debug)]
pub enum OverlayInput {
    Nodes(SubnetMap),
    Mine(SubnetLease),
    /// Best-route changes from the BGP speaker (the bgp backend).
    Learned(Vec<podnet_bgp::rib::Change>),
}

/// This node's overlay: the backend, its device, this node's subnet and
/// everyone else's.
pub struct Overlay {
    node: String,
    paths: Paths,
    cfg: Resolved,
    backend: Backend,
    underlay: kernel::Underlay,
    device: Option<kernel::Device>,
    mtu: u32,
    mine: Option<SubnetLease>,
    nodes: SubnetMap,
    metrics: Arc<Metrics>,
}

impl Overlay {
    /// Finds the underlay (`iface`, else the default route's device) and
    /// brings up the backend's device; nothing else is touched until this
    /// node has a subnet ([`Overlay::start`]).
    pub fn new(
        node: &str,
        iface: Option<&str>,
        mtu: Option<u32>,
        paths: Paths,
        cfg: Resolved,
        metrics: Arc<Metrics>,
    ) -> Result<Overlay, OverlayError> {
        let mut h = Handle::new()?;
        let underlay = kernel::find_underlay(&mut h, iface)?;
        let state_dir = paths
            .subnet_file
            .parent()
            .unwrap_or(std::path::Path::new("/run/podnet"));
        let mut backend = Backend::from_config(&cfg, state_dir).map_err(OverlayError::Other)?;
        let mtu = mtu.unwrap_or_else(|| backend.mtu(underlay.mtu));
        let _ = podnet_kernel::netns::write_sysctl("net.ipv4.ip_forward", "1");
        ensure_bridge_netfilter(true);
        let device = backend.ensure_device(&mut h, &underlay, mtu)?;
        remove_stale_vtep(&mut h, &backend)?;
        Ok(Overlay {
            node: node.to_string(),
            paths,
            cfg,
            backend,
            underlay,
            device,
            mtu,
            mine: None,
            nodes: SubnetMap::new(),
            metrics,
        })
    }

    pub fn underlay(&self) -> &kernel::Underlay {
        &self.underlay
    }

    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    pub fn backend_mut(&mut self) -> &mut Backend {
        &mut self.backend
    }

    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// What this node publishes with its subnet (flannel's lease
    /// attributes, or the node annotations).
    pub fn attrs(&self) -> Attrs {
        Attrs {
            public_ip: self.underlay.ip,
            backend_type: self.backend.name().into(),
            backend_data: self.backend.data(self.device),
            node: self.node.clone(),
            // Standalone leases leave it out (it follows from the IPv4
            // subnet); Kubernetes mode reads it from the Node.
            ipv6_subnet: None,
            public_ipv6: self.ipv6_underlay(),
        }
    }

    /// With this node's subnet: the device's address, the userspace
    /// tunnel, the masquerade table and the node's files. After this the
    /// node's own pods work; [`Overlay`] in the loop connects the others.
    pub fn start(&mut self, mine: SubnetLease) -> Result<(), OverlayError> {
        let mut h = Handle::new()?;
        self.mine = Some(mine);
        if let Some((idx, _)) = self.device {
            kernel::ensure_overlay_addr(&mut h, idx, self.subnet(), self.subnet6())?;
        }
        self.backend
            .start(self.underlay.ip)
            .map_err(OverlayError::Other)?;
        if self.cfg.ipv6_subnet_len.is_some() && !self.backend.carries_ipv6() {
            tracing::warn!(
                backend = self.backend.name(),
                "dual-stack: this backend carries IPv4 only; pods' IPv6 addresses reach pods of this node only"
            );
        }
        self.masq_table()
            .sync()
            .map_err(|e| OverlayError::Other(format!("installing pod masquerade: {e}")))?;
        self.write_files()
    }

    fn subnet(&self) -> Ipv4Net {
        self.mine
            .as_ref()
            .map(|m| m.subnet)
            .unwrap_or(self.cfg.subnet_min)
    }

    /// This node's IPv6 pod subnet in a dual-stack cluster: what its
    /// source said (Node podCIDRs), else the IPv4 subnet's twin.
    fn subnet6(&self) -> Option<ipnet::Ipv6Net> {
        self.cfg.ipv6_subnet_len?;
        self.mine
            .as_ref()
            .and_then(|m| m.attrs.ipv6_subnet)
            .or_else(|| self.cfg.ipv6_subnet_of(self.subnet()))
    }

    /// This node as the plans see it.
    fn me(&self) -> plan::NodeView {
        plan::NodeView {
            name: self.node.clone(),
            subnet: self.subnet(),
            subnet6: self.subnet6(),
            public_ip: self.underlay.ip,
            public_ip6: self.underlay.ip6.map(|n| n.addr()),
            vtep_mac: None,
            wg_key: None,
        }
    }

    /// This node's IPv6 underlay address in a dual-stack cluster (the
    /// BGP speaker's IPv6 next hop).
    pub fn ipv6_underlay(&self) -> Option<std::net::Ipv6Addr> {
        self.cfg.ipv6_subnet_len?;
        self.underlay.ip6.map(|n| n.addr())
    }

    fn masq_table(&self) -> MasqTable {
        MasqTable {
            network: self.cfg.network,
            subnet: self.subnet(),
            tunnel: self.backend.tunnel(self.underlay.ip),
            ipv6: self.cfg.ipv6_network.zip(self.subnet6()),
        }
    }

    fn write_files(&self) -> Result<(), OverlayError> {
        let p = &self.paths;
        let six = self.cfg.ipv6_network.zip(self.subnet6());
        let env = files::subnet_env(self.cfg.network, self.subnet(), self.mtu, true, six);
        files::write_if_changed(&p.subnet_file, &env).map_err(|e| {
            OverlayError::Other(format!("writing {}: {e}", p.subnet_file.display()))
        })?;
        let list = files::conflist(&p.subnet_file, p.cni_data_dir.as_deref());
        let path = p.cni_conf_dir.join(files::CONFLIST_NAME);
        files::write_if_changed(&path, &serde_json::to_string_pretty(&list).expect("json"))
            .map_err(|e| OverlayError::Other(format!("writing {}: {e}", path.display())))?;
        Ok(())
    }
}

/// The overlay's plan: routes, neighbours and FDB entries, the userspace
/// tunnel's peers, and what could not be planned.
pub struct OverlayPlan {
    want: plan::Desired,
    peers: Vec<plan::NodeView>,
    problems: Vec<String>,
}

/// What the kernel holds: the backend device's index and our entries.
pub struct OverlayObserved {
    device: Option<u32>,
    have: plan::Desired,
}

pub struct OverlayChanges {
    plan: OverlayPlan,
    /// The backend device is missing or was replaced behind our back.
    device: bool,
    diff: plan::Diff,
}

impl Subsystem for Overlay {
    type Input = OverlayInput;
    /// The overlay plans the whole map every time (a route per node).
    type Key = ();
    type Plan = OverlayPlan;
    type Observed = OverlayObserved;
    type Changes = OverlayChanges;

    fn name(&self) -> &'static str {
        "overlay"
    }

    fn watch(&mut self, input: OverlayInput, dirty: &mut BTreeSet<()>) {
        match input {
            OverlayInput::Nodes(m) => self.nodes = m,
            OverlayInput::Mine(l) => self.mine = Some(l),
            OverlayInput::Learned(c) => {
                if let Backend::Bgp(b) = &mut self.backend {
                    b.learn(c, self.underlay.net);
                }
            }
        }
        dirty.insert(());
    }

    fn plan(&self, _scope: &Scope<()>) -> OverlayPlan {
        let views: Vec<plan::NodeView> = self
            .nodes
            .values()
            .map(|l| plan::NodeView {
                name: l.attrs.node.clone(),
                subnet: l.subnet,
                subnet6: self.cfg.ipv6_subnet_len.and_then(|_| {
                    l.attrs
                        .ipv6_subnet
                        .or_else(|| self.cfg.ipv6_subnet_of(l.subnet))
                }),
                public_ip: l.attrs.public_ip,
                public_ip6: l.attrs.public_ipv6,
                vtep_mac: l.attrs.vtep_mac(),
                wg_key: backend::wireguard::public_key_of(&l.attrs.backend_data),
            })
            .collect();
        let me = self.me();
        let nets = plan::Nets {
            network: self.cfg.network,
            network6: self
                .cfg
                .ipv6_network
                .filter(|_| self.cfg.ipv6_subnet_len.is_some()),
            underlay: self.underlay.net,
            underlay6: self.underlay.ip6.map(|n| n.trunc()),
        };
        let (want, problems) = self.backend.plan(&nets, &me, &views);
        let peers = views
            .iter()
            .filter(|n| n.subnet != me.subnet)
            .cloned()
            .collect();
        OverlayPlan {
            want,
            peers,
            problems,
        }
    }

    fn observe(&mut self, _scope: &Scope<()>) -> Result<OverlayObserved, SyncError> {
        let mut h = Handle::new()?;
        let device = match self.backend.device_name() {
            Some(dev) => h.link(dev)?.map(|l| l.index),
            None => None,
        };
        let have = kernel::observe(&mut h, device, &self.underlay)?;
        Ok(OverlayObserved { device, have })
    }

    fn diff(&self, plan: OverlayPlan, observed: OverlayObserved) -> OverlayChanges {
        let device = observed.device != self.device.map(|d| d.0);
        let mut diff = plan::diff(&plan.want, &observed.have);
        if let Backend::Bgp(b) = &self.backend {
            let others: Vec<Ipv4Net> = plan.peers.iter().map(|n| n.subnet).collect();
            if !b.settled(&others) {
                // A restarted speaker is still hearing its peers' tables.
                diff.del_routes.clear();
            }
        }
        OverlayChanges { plan, device, diff }
    }

    fn apply(&mut self, c: OverlayChanges) -> Result<usize, SyncError> {
        for p in &c.plan.problems {
            tracing::warn!("{p}");
        }
        self.backend.set_peers(&self.me(), &c.plan.peers);
        let mut h = Handle::new()?;
        if c.device {
            // Someone deleted the backend device: put it back.
            if !self.backend.device_repairable() {
                return Err(SyncError(format!(
                    "the {} device vanished; restart the agent",
                    self.backend.name()
                )));
            }
            self.device = self
                .backend
                .ensure_device(&mut h, &self.underlay, self.mtu)?;
        }
        if let Some((idx, _)) = self.device {
            kernel::ensure_overlay_addr(&mut h, idx, self.subnet(), self.subnet6())?;
        }
        let n = c.diff.ops();
        if n > 0 {
            let (done, errs) =
                kernel::apply(&mut h, &c.diff, self.device.map(|o| o.0), &self.underlay);
            tracing::info!(ops = n, done, "applied network changes");
            self.metrics.count(&AGENT_SYNC_OPS_TOTAL, "", done as f64);
            if !errs.is_empty() {
                return Err(SyncError(errs.join("; ")));
            }
        }
        // The node's files and the masquerade table follow this node's
        // subnet; both are rewritten only when they differ.
        self.write_files().map_err(|e| SyncError(e.to_string()))?;
        self.masq_table().repair();
        ensure_bridge_netfilter(false);
        self.metrics.count(&AGENT_SYNCS_TOTAL, "", 1.0);
        self.metrics
            .gauge(&AGENT_LEASES, "", self.nodes.len() as f64);
        if let Some(c) = self.backend.wg_counters() {
            for (result, v) in [
                ("sent", &c.sent),
                ("received", &c.received),
                ("rejected", &c.rejected),
            ] {
                let n = v.load(std::sync::atomic::Ordering::Relaxed) as f64;
                self.metrics
                    .gauge(&WG_PACKETS_TOTAL, &format!("result=\"{result}\""), n);
            }
        }
        Ok(n)
    }

    fn synced(&mut self, _scope: &Scope<()>, ok: bool) {
        if ok {
            self.metrics.set_ready(true);
        }
    }
}

/// A VTEP an earlier run left when this one uses another backend: it
/// would go on taking VXLAN from the underlay into the pods (with
/// `Encrypt`, unencrypted and unauthenticated), so it goes.
fn remove_stale_vtep(h: &mut Handle, backend: &Backend) -> Result<(), OverlayError> {
    if backend.device_name() == Some(kernel::VXLAN_DEV) {
        return Ok(());
    }
    if let Some(l) = h.link(kernel::VXLAN_DEV)? {
        h.delete_link(l.index)?;
        tracing::info!(
            backend = backend.name(),
            "removed the VXLAN device {} an earlier run left",
            kernel::VXLAN_DEV
        );
    }
    Ok(())
}

/// Same-node Service replies cross the pod bridge at L2; conntrack only
/// un-DNATs them when the bridge hands them to netfilter
/// (`bridge-nf-call-iptables=1`, as kube-proxy requires).
pub fn ensure_bridge_netfilter(report_missing: bool) {
    for key in [
        "net.bridge.bridge-nf-call-iptables",
        "net.bridge.bridge-nf-call-ip6tables",
    ] {
        match podnet_kernel::netns::read_sysctl(key) {
            Ok(v) if v == "1" => {}
            Ok(_) => match podnet_kernel::netns::write_sysctl(key, "1") {
                Ok(()) => tracing::info!(key, "turned on bridge netfilter"),
                Err(e) => {
                    tracing::warn!(key, error = %e, "cannot turn on bridge netfilter: Service traffic between pods on one node will break")
                }
            },
            Err(_) => {
                if report_missing {
                    tracing::warn!(key, "br_netfilter is not loaded: Service traffic between pods on one node will break (modprobe br_netfilter)");
                }
                return;
            }
        }
    }
}

/// Removes what the overlay installed on this node (for `--cleanup`);
/// returns what it removed.
pub fn cleanup(iface: Option<&str>, paths: &Paths) -> Result<Vec<String>, OverlayError> {
    let mut done = Vec::new();
    let mut h = Handle::new()?;
    if let Ok(u) = kernel::find_underlay(&mut h, iface) {
        let n = kernel::remove_all(&mut h, &u)?;
        done.push(format!(
            "removed {n} routes/neighbours/FDB entries and the backend device"
        ));
    } else {
        for dev in [kernel::VXLAN_DEV, kernel::TUN_DEV, kernel::WG_DEV] {
            h.delete_link_by_name(dev)?;
        }
    }
    if masq::remove().map_err(|e| OverlayError::Other(format!("removing pod masquerade: {e}")))? {
        done.push(format!("removed nft table(s) ip/ip6 {MASQ_TABLE}"));
    }
    for p in [
        paths.subnet_file.clone(),
        paths.cni_conf_dir.join(files::CONFLIST_NAME),
    ] {
        if std::fs::remove_file(&p).is_ok() {
            done.push(format!("removed {}", p.display()));
        }
    }
    Ok(done)
}
