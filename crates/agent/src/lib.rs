//! `podnet agent`: one per node. It takes the node a subnet of the cluster
//! network, connects the nodes with the configured backend (vxlan, host-gw
//! or udp), masquerades pod traffic leaving the cluster, writes the files
//! the CNI plugins read, and runs the service proxy.
//!
//! - [`plan`]: the pure plan and diff of routes, neighbours and FDB entries;
//! - [`kernel`]: the netlink edge that observes and applies;
//! - [`udp`]: the userspace UDP tunnel;
//! - [`files`]: subnet.env and the conflist;
//! - [`masq`]: the masquerade table `ip podnet-masq`;
//! - [`lease`]: re-exported from `podnet_source::subnets::leases`.
//!
//! Cluster state comes from one object source per agent
//! (`podnet_source::Source`: the store, or the Kubernetes API), and subnets
//! from one subnet source (leases, or Node podCIDRs). The overlay and the
//! proxy are each a subsystem of the one reconcile loop
//! (`podnet_reconcile`): every change, and a periodic resync that repairs
//! anything deleted behind our back, re-plans, observes the kernel, and
//! applies only the difference. A repeated sync changes nothing. The
//! object source's and the lease watch's health are `podnet_daemon::StoreWatch`
//! components `agent` and `overlay`: a lost store fails `/readyz`, the data
//! plane stays as it is, and the store's return brings a relist. SIGTERM
//! leaves the data plane in place, so established connections survive a
//! restart; `--cleanup` removes everything.

pub mod files;
pub mod gso;
pub mod kernel;
pub mod masq;
pub mod plan;
pub mod udp;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ipnet::Ipv4Net;
use podnet_api::netconfig::{self, BackendType, Resolved};
use podnet_api::{Kind, Object};
use podnet_daemon::Metrics;
use podnet_kernel::Handle;
use podnet_reconcile::{Input, Scope, SyncError};
pub use podnet_source::subnets::leases as lease;
use podnet_source::subnets::{self, leases::Leases, podcidr::PodCidr, Subnets};
use podnet_source::Source;
use podnet_store::{AnyStore, Objects, Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Source(#[from] podnet_source::SourceError),
    #[error("kernel: {0}")]
    Kernel(#[from] podnet_kernel::KernelError),
    #[error("network config {0}: {1}")]
    Config(String, String),
    #[error("{0}")]
    Other(String),
}

#[derive(Debug, Clone)]
pub struct Options {
    pub node: String,
    pub iface: Option<String>,
    pub subnet_file: PathBuf,
    pub cni_conf_dir: PathBuf,
    pub cni_data_dir: Option<PathBuf>,
    pub lease_ttl: i64,
    pub resync: Duration,
    pub mtu: Option<u32>,
    /// Run the service proxy (nftables) too.
    pub proxy: bool,
    /// Where NodePorts are accepted (kube-proxy's `--nodeport-addresses`):
    /// the node's addresses inside these ranges; empty means the node's
    /// primary address (its underlay IP); a `/0` means every local address
    /// but loopback.
    pub nodeport_addresses: Vec<ipnet::IpNet>,
}

/// The addresses NodePorts are accepted on, from `--nodeport-addresses`
/// and the addresses this node has. Loopback never is (kube-proxy refuses
/// localhost NodePorts too). None: every local address but loopback.
pub fn nodeport_ips(
    ranges: &[ipnet::IpNet],
    primary: std::net::IpAddr,
    have: &[std::net::IpAddr],
) -> Option<Vec<std::net::IpAddr>> {
    if ranges.is_empty() {
        return Some(vec![primary]);
    }
    if ranges.iter().any(|r| r.prefix_len() == 0) {
        return None;
    }
    let mut v: Vec<std::net::IpAddr> = have
        .iter()
        .filter(|ip| !ip.is_loopback() && ranges.iter().any(|r| r.contains(*ip)))
        .copied()
        .collect();
    v.sort();
    v.dedup();
    Some(v)
}

pub use masq::{MasqTable, MASQ_TABLE};

async fn load_config(objs: &Objects) -> Result<Resolved, AgentError> {
    let cfg = match objs
        .get(Kind::NetworkConfig, None, netconfig::DEFAULT_NAME)
        .await?
    {
        Some(Object::NetworkConfig(c)) => *c,
        _ => netconfig::NetworkConfig::default(),
    };
    cfg.resolve().map_err(|(f, m)| AgentError::Config(f, m))
}

fn backend_name(b: BackendType) -> &'static str {
    match b {
        BackendType::Vxlan => "vxlan",
        BackendType::HostGw => "host-gw",
        BackendType::Udp => "udp",
    }
}

struct Runtime {
    opts: Options,
    cfg: Resolved,
    underlay: kernel::Underlay,
    overlay: Option<kernel::Overlay>,
    mine: lease::SubnetLease,
    leases: BTreeMap<Ipv4Net, lease::SubnetLease>,
    udp: Option<udp::UdpTunnel>,
    metrics: Arc<Metrics>,
    mtu: u32,
}

impl Runtime {
    fn masq_table(&self) -> MasqTable {
        MasqTable {
            network: self.cfg.network,
            subnet: self.mine.subnet,
            tunnel: match self.cfg.backend {
                BackendType::Vxlan | BackendType::Udp => Some((self.underlay.ip, self.cfg.port)),
                BackendType::HostGw => None,
            },
        }
    }

    fn attrs(&self) -> lease::Attrs {
        let data = match self.overlay.and_then(|(_, m)| m) {
            Some(m) => {
                serde_json::json!({"VNI": self.cfg.vni, "VtepMAC": podnet_kernel::rtnl::format_mac(&m)})
            }
            None => serde_json::json!({}),
        };
        lease::Attrs {
            public_ip: self.underlay.ip,
            backend_type: backend_name(self.cfg.backend).into(),
            backend_data: data,
            node: self.opts.node.clone(),
        }
    }

    fn write_files(&self) -> Result<(), AgentError> {
        let env = files::subnet_env(self.cfg.network, self.mine.subnet, self.mtu, true);
        files::write_if_changed(&self.opts.subnet_file, &env).map_err(|e| {
            AgentError::Other(format!("writing {}: {e}", self.opts.subnet_file.display()))
        })?;
        let list = files::conflist(&self.opts.subnet_file, self.opts.cni_data_dir.as_deref());
        let p = self.opts.cni_conf_dir.join(files::CONFLIST_NAME);
        files::write_if_changed(&p, &serde_json::to_string_pretty(&list).expect("json"))
            .map_err(|e| AgentError::Other(format!("writing {}: {e}", p.display())))?;
        Ok(())
    }
}

/// What feeds the overlay's loop: the subnet map, or this node's own
/// subnet after a (re-)acquisition.
#[derive(Debug)]
pub enum OverlayInput {
    Nodes(subnets::SubnetMap),
    Mine(lease::SubnetLease),
}

/// The overlay's plan: routes, neighbours and FDB entries, the userspace
/// tunnel's table, and what could not be planned.
pub struct OverlayPlan {
    want: plan::Desired,
    tunnel: Vec<(Ipv4Net, Ipv4Addr)>,
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

impl podnet_reconcile::Subsystem for Runtime {
    type Input = OverlayInput;
    /// The overlay plans the whole map every time (a route per node).
    type Key = ();
    type Plan = OverlayPlan;
    type Observed = OverlayObserved;
    type Changes = OverlayChanges;

    fn name(&self) -> &'static str {
        "overlay"
    }

    fn watch(&mut self, input: OverlayInput, dirty: &mut std::collections::BTreeSet<()>) {
        match input {
            OverlayInput::Nodes(m) => self.leases = m,
            OverlayInput::Mine(l) => self.mine = l,
        }
        dirty.insert(());
    }

    fn plan(&self, _scope: &Scope<()>) -> OverlayPlan {
        let views: Vec<plan::NodeView> = self
            .leases
            .values()
            .map(|l| plan::NodeView {
                name: l.attrs.node.clone(),
                subnet: l.subnet,
                public_ip: l.attrs.public_ip,
                vtep_mac: l.attrs.vtep_mac(),
            })
            .collect();
        let me = plan::NodeView {
            name: self.opts.node.clone(),
            subnet: self.mine.subnet,
            public_ip: self.underlay.ip,
            vtep_mac: None,
        };
        let (want, problems) = plan::plan(
            self.cfg.backend,
            self.cfg.network,
            &me,
            &views,
            self.underlay.net,
            self.cfg.direct_routing,
        );
        let tunnel = self
            .leases
            .values()
            .filter(|l| l.subnet != self.mine.subnet)
            .map(|l| (l.subnet, l.attrs.public_ip))
            .collect();
        OverlayPlan {
            want,
            tunnel,
            problems,
        }
    }

    fn observe(&mut self, _scope: &Scope<()>) -> Result<OverlayObserved, SyncError> {
        let mut h = Handle::new()?;
        let device = match self.cfg.backend {
            BackendType::HostGw => None,
            BackendType::Vxlan => h.link(kernel::VXLAN_DEV)?.map(|l| l.index),
            BackendType::Udp => h.link(kernel::TUN_DEV)?.map(|l| l.index),
        };
        let have = kernel::observe(&mut h, device, &self.underlay)?;
        Ok(OverlayObserved { device, have })
    }

    fn diff(&self, plan: OverlayPlan, observed: OverlayObserved) -> OverlayChanges {
        let device =
            self.cfg.backend != BackendType::HostGw && observed.device != self.overlay.map(|o| o.0);
        let diff = plan::diff(&plan.want, &observed.have);
        OverlayChanges { plan, device, diff }
    }

    fn apply(&mut self, c: OverlayChanges) -> Result<usize, SyncError> {
        for p in &c.plan.problems {
            tracing::warn!("{p}");
        }
        if let Some(u) = &self.udp {
            u.set_table(c.plan.tunnel.clone());
        }
        let mut h = Handle::new()?;
        if c.device {
            // Someone deleted the backend device: put it back.
            if self.cfg.backend == BackendType::Udp {
                return Err(SyncError(
                    "the TUN device vanished; restart the agent".into(),
                ));
            }
            self.overlay = kernel::ensure_device(
                &mut h,
                self.cfg.backend,
                &self.cfg,
                &self.underlay,
                self.mtu,
            )?;
        }
        if let Some((idx, _)) = self.overlay {
            kernel::ensure_overlay_addr(&mut h, idx, self.mine.subnet)?;
        }
        let n = c.diff.ops();
        if n > 0 {
            let (done, errs) =
                kernel::apply(&mut h, &c.diff, self.overlay.map(|o| o.0), &self.underlay);
            tracing::info!(ops = n, done, "applied network changes");
            self.metrics.inc(
                "podnet_agent_sync_ops_total",
                "Kernel operations applied.",
                "",
                done as f64,
            );
            if !errs.is_empty() {
                return Err(SyncError(errs.join("; ")));
            }
        }
        // The node's files and the masquerade table follow this node's
        // subnet; both are rewritten only when they differ.
        self.write_files().map_err(|e| SyncError(e.to_string()))?;
        self.masq_table().repair();
        ensure_bridge_netfilter(false);
        self.metrics
            .inc("podnet_agent_syncs_total", "Syncs run.", "", 1.0);
        self.metrics.set(
            "podnet_agent_leases",
            "Subnet leases known.",
            "",
            self.leases.len() as f64,
        );
        Ok(n)
    }

    fn synced(&mut self, _scope: &Scope<()>, ok: bool) {
        if ok {
            self.metrics.set_ready(true);
        }
    }
}

/// Where the agent's cluster state comes from.
pub enum Cluster {
    /// The podnet store (standalone): leases for subnets, the store's
    /// NetworkConfig.
    Store(AnyStore),
    /// The Kubernetes API: Node.spec.podCIDRs for subnets, the network
    /// config from the agent's `--net-conf` (flannel's net-conf.json).
    Kube {
        client: kube::Client,
        config: Resolved,
    },
}

/// Runs the agent until `shutdown` resolves; the data plane stays.
pub async fn run(
    cluster: Cluster,
    opts: Options,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    tokio::pin!(shutdown);
    // One object source for the whole agent; the overlay's subnets and the
    // proxy subscribe to it.
    let (mut source, cfg) = match &cluster {
        Cluster::Store(store) => (
            Source::store(store.clone(), metrics.store_watch("agent")),
            load_config(&Objects::new(store.clone())).await?,
        ),
        Cluster::Kube { client, config } => (
            Source::kube(client.clone(), metrics.store_watch("agent")),
            config.clone(),
        ),
    };
    let proxy_sub = opts
        .proxy
        .then(|| source.subscribe(&[Kind::Service, Kind::EndpointSlice, Kind::Node]));
    let mut subnets = match &cluster {
        Cluster::Store(store) => Subnets::Leases(Leases::new(
            store.clone(),
            cfg.clone(),
            &opts.node,
            opts.lease_ttl,
            metrics.store_watch("overlay"),
        )),
        Cluster::Kube { client, .. } => Subnets::PodCidr(PodCidr::new(
            client.clone(),
            cfg.clone(),
            &opts.node,
            source.subscribe(&[Kind::Node]),
        )),
    };
    let _source = source.start();

    let mut h = Handle::new()?;
    let underlay = kernel::find_underlay(&mut h, opts.iface.as_deref())?;
    let mtu = opts
        .mtu
        .unwrap_or_else(|| plan::mtu(cfg.backend, underlay.mtu));
    let _ = podnet_kernel::netns::write_sysctl("net.ipv4.ip_forward", "1");
    ensure_bridge_netfilter(true);

    // The UDP backend's TUN device exists only while someone holds it open.
    let mut udp_tun = None;
    if cfg.backend == BackendType::Udp {
        udp_tun = Some(podnet_kernel::tun::open_tun(kernel::TUN_DEV)?);
    }
    let overlay = kernel::ensure_device(&mut h, cfg.backend, &cfg, &underlay, mtu)?;
    let mut rt = Runtime {
        opts: opts.clone(),
        cfg: cfg.clone(),
        underlay: underlay.clone(),
        overlay,
        mine: lease::SubnetLease {
            subnet: cfg.subnet_min,
            attrs: lease::Attrs {
                public_ip: underlay.ip,
                backend_type: String::new(),
                backend_data: serde_json::Value::Null,
                node: opts.node.clone(),
            },
            mod_rev: 0,
            lease_id: 0,
        },
        leases: BTreeMap::new(),
        udp: None,
        metrics: metrics.clone(),
        mtu,
    };
    let attrs = rt.attrs();
    let previous = files::previous_subnet(&opts.subnet_file);
    rt.mine = tokio::select! {
        _ = &mut shutdown => return Ok(()),
        r = subnets.acquire(&attrs, previous) => r?,
    };
    tracing::info!(node = %opts.node, subnet = %rt.mine.subnet, public_ip = %underlay.ip, backend = backend_name(cfg.backend), mtu, "subnet acquired");
    if let Some((idx, _)) = rt.overlay {
        kernel::ensure_overlay_addr(&mut h, idx, rt.mine.subnet)?;
    }
    if let Some(tun) = udp_tun.take() {
        rt.udp = Some(
            udp::UdpTunnel::start(tun, underlay.ip, cfg.port).map_err(|e| {
                AgentError::Other(format!("starting UDP tunnel on port {}: {e}", cfg.port))
            })?,
        );
    }
    rt.masq_table()
        .sync()
        .map_err(|e| AgentError::Other(format!("installing pod masquerade: {e}")))?;
    rt.write_files()?;
    let mine = rt.mine.clone();
    subnets.network_up(underlay.ip).await?;

    // The service proxy runs beside the network loop; its rules stay when
    // the agent stops.
    let _proxy = proxy_sub.map(|sub| {
        let m = metrics.clone();
        let have: Vec<std::net::IpAddr> = h
            .addrs(0)
            .map(|a| a.into_iter().map(|a| a.net.addr()).collect())
            .unwrap_or_default();
        let node = podnet_proxy::NodeInfo {
            name: opts.node.clone(),
            zone: None,
            ips: vec![std::net::IpAddr::V4(underlay.ip)],
            nodeport_ips: nodeport_ips(
                &opts.nodeport_addresses,
                std::net::IpAddr::V4(underlay.ip),
                &have,
            ),
        };
        tracing::info!(nodeport_addresses = ?node.nodeport_ips, "service proxy");
        let svc_cidr = Some(cfg.service_cidr);
        let stacks = vec![
            podnet_proxy::Stack::v4(cfg.network).with_service_cidr(svc_cidr),
            podnet_proxy::Stack::v6(cfg.ipv6_network).with_service_cidr(svc_cidr),
        ];
        let resync = opts.resync;
        AbortOnDrop(tokio::spawn(async move {
            let run =
                podnet_proxy::run(sub, node, stacks, resync, m.clone(), std::future::pending());
            if let Err(e) = run.await {
                tracing::error!("service proxy stopped: {e}");
                m.set_unhealthy_for("proxy", Some(format!("service proxy stopped: {e}")));
            }
        }))
    });

    // The overlay's reconcile loop; this task keeps the subnet claim and
    // feeds it the subnet map.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let overlay_loop = AbortOnDrop(tokio::spawn(podnet_reconcile::run(
        rt,
        rx,
        podnet_reconcile::Options::new(opts.resync),
        metrics.clone(),
        std::future::pending(),
    )));
    let _overlay_loop = overlay_loop;
    let mut mine_subnet = mine.subnet;
    let mut ready = false;
    let renew_every = subnets.renew_every();
    let mut renew = tokio::time::interval(renew_every.unwrap_or(Duration::from_secs(3600)));
    renew.tick().await;
    loop {
        tokio::select! {
            _ = &mut shutdown => {
                tracing::info!("shutting down; the data plane stays in place");
                return Ok(());
            }
            _ = renew.tick(), if renew_every.is_some() => {
                if let Err(e) = subnets.renew().await {
                    tracing::warn!("lease renewal: {e}");
                }
            }
            c = subnets.next() => match c? {
                subnets::Change::Nodes(map) => {
                    let _ = tx.send(Input::Changes(OverlayInput::Nodes(map)));
                    if !ready {
                        ready = true;
                        let _ = tx.send(Input::Ready);
                    }
                }
                subnets::Change::LostMine => {
                    let l = subnets.acquire(&attrs, Some(mine_subnet)).await?;
                    tracing::info!(subnet = %l.subnet, "subnet re-acquired");
                    mine_subnet = l.subnet;
                    let _ = tx.send(Input::Changes(OverlayInput::Mine(l)));
                }
            }
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Removes everything the agent installed on this node and gives the
/// subnet back.
pub async fn cleanup(store: Option<AnyStore>, opts: &Options) -> Result<Vec<String>, AgentError> {
    let mut done = Vec::new();
    let mut h = Handle::new()?;
    if let Ok(u) = kernel::find_underlay(&mut h, opts.iface.as_deref()) {
        let n = kernel::remove_all(&mut h, &u)?;
        done.push(format!(
            "removed {n} routes/neighbours/FDB entries and the backend device"
        ));
    } else {
        for dev in [kernel::VXLAN_DEV, kernel::TUN_DEV] {
            h.delete_link_by_name(dev)?;
        }
    }
    for t in podnet_proxy::cleanup().map_err(|e| AgentError::Other(e.to_string()))? {
        done.push(format!("removed nft table {t}"));
    }
    if masq::remove().map_err(|e| AgentError::Other(format!("removing pod masquerade: {e}")))? {
        done.push(format!("removed nft table ip {MASQ_TABLE}"));
    }
    for p in [
        opts.subnet_file.clone(),
        opts.cni_conf_dir.join(files::CONFLIST_NAME),
    ] {
        if std::fs::remove_file(&p).is_ok() {
            done.push(format!("removed {}", p.display()));
        }
    }
    if let Some(store) = store {
        let (kvs, _) = store.list(lease::PREFIX).await?;
        for l in kvs
            .iter()
            .filter_map(lease::decode)
            .filter(|l| l.attrs.node == opts.node)
        {
            if l.lease_id != 0 {
                store.revoke(l.lease_id).await?;
            }
            let _ = store
                .txn(vec![podnet_store::Op::Delete {
                    key: lease::key(&l.subnet),
                    rev: None,
                }])
                .await;
            done.push(format!("released subnet {}", l.subnet));
        }
    }
    Ok(done)
}

/// Service traffic between two pods on one node comes back across the pod
/// bridge at layer 2; only with the bridge's netfilter hooks on does
/// conntrack see that reply and undo the DNAT (kube-proxy and flannel ask
/// for the same). The switches are per network namespace: turned on at
/// start and at every resync when someone turned them off; a missing
/// `br_netfilter` is reported once, at start, not hidden.
fn ensure_bridge_netfilter(report_missing: bool) {
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
