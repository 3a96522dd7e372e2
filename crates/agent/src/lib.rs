//! `podnet agent`: one per node. It leases the node a subnet of the cluster
//! network, connects the nodes with the configured backend (vxlan, host-gw
//! or udp), masquerades pod traffic leaving the cluster, and writes the
//! files the CNI plugins read.
//!
//! - [`lease`]: subnet leases in the store (flannel semantics);
//! - [`plan`]: the pure plan and diff of routes, neighbours and FDB entries;
//! - [`kernel`]: the netlink edge that observes and applies;
//! - [`udp`]: the userspace UDP tunnel;
//! - [`files`]: subnet.env and the conflist;
//! - [`masq`]: the masquerade table `ip podnet-masq`.
//!
//! The loop watches the leases; every change (and a periodic resync that
//! repairs anything deleted behind our back) re-plans, observes the kernel,
//! and applies only the difference. A repeated sync changes nothing. The
//! lease and proxy watches report their health as `podnet_daemon::StoreWatch`
//! components `overlay` and `proxy`: a lost store fails `/readyz`, the data
//! plane stays as it is, and the store's return brings a relist. SIGTERM
//! leaves the data plane in place, so established connections survive a
//! restart; `--cleanup` removes everything.

pub mod files;
pub mod gso;
pub mod healthcheck;
pub mod kernel;
pub mod lease;
pub mod masq;
pub mod plan;
pub mod proxier;
pub mod proxy;
pub mod udp;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use podnet_api::k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus,
};
use podnet_api::netconfig::{self, BackendType, Resolved};
use podnet_api::{Kind, Object};
use podnet_daemon::Metrics;
use podnet_kernel::Handle;
use podnet_store::{AnyStore, EventType, Objects, Store, StoreError, WatchMsg};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
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

/// Registers or refreshes this node's Node object.
async fn register_node(
    objs: &Objects,
    name: &str,
    ip: Ipv4Addr,
    subnet: Ipv4Net,
) -> Result<(), StoreError> {
    for _ in 0..5 {
        let existing = objs.get(Kind::Node, None, name).await?;
        let mut node = match &existing {
            Some(Object::Node(n)) => (**n).clone(),
            _ => Node::default(),
        };
        node.metadata.name = Some(name.to_string());
        node.spec = Some(NodeSpec {
            pod_cidr: Some(subnet.to_string()),
            pod_cidrs: Some(vec![subnet.to_string()]),
            ..node.spec.clone().unwrap_or_default()
        });
        node.status = Some(NodeStatus {
            addresses: Some(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: ip.to_string(),
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: name.to_string(),
                },
            ]),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: Some("PodnetAgentReady".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let obj = Object::Node(Box::new(node));
        let r = match existing {
            Some(_) => objs.update(obj, vec![]).await,
            None => objs.create(obj, vec![]).await,
        };
        match r {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { .. }) | Err(StoreError::AlreadyExists(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

struct Runtime {
    objs: Objects,
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

    /// Plans, observes, diffs and applies; returns the number of ops.
    fn sync(&mut self) -> Result<usize, AgentError> {
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
        for p in &problems {
            tracing::warn!("{p}");
        }
        if let Some(u) = &self.udp {
            u.set_table(
                self.leases
                    .values()
                    .filter(|l| l.subnet != self.mine.subnet)
                    .map(|l| (l.subnet, l.attrs.public_ip))
                    .collect(),
            );
        }
        let mut h = Handle::new()?;
        // The device itself may have been deleted by someone: repair it.
        if self.cfg.backend != BackendType::HostGw {
            let dev = if self.cfg.backend == BackendType::Vxlan {
                kernel::VXLAN_DEV
            } else {
                kernel::TUN_DEV
            };
            let present = h.link(dev)?.map(|l| l.index);
            if present != self.overlay.map(|o| o.0) {
                if self.cfg.backend == BackendType::Udp && present.is_none() {
                    return Err(AgentError::Other(
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
        }
        let have = kernel::observe(&mut h, self.overlay.map(|o| o.0), &self.underlay)?;
        let d = plan::diff(&want, &have);
        let n = d.ops();
        if n > 0 {
            let (done, errs) = kernel::apply(&mut h, &d, self.overlay.map(|o| o.0), &self.underlay);
            tracing::info!(ops = n, done, "applied network changes");
            for e in &errs {
                tracing::warn!("{e}");
            }
            self.metrics.inc(
                "podnet_agent_sync_ops_total",
                "Kernel operations applied.",
                "",
                done as f64,
            );
            if !errs.is_empty() {
                return Err(AgentError::Other(errs.join("; ")));
            }
        }
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

    async fn reacquire(&mut self) -> Result<(), AgentError> {
        let attrs = self.attrs();
        self.mine = lease::acquire(
            &self.objs.store,
            &self.cfg,
            &self.opts.node,
            &attrs,
            Some(self.mine.subnet),
            self.opts.lease_ttl,
        )
        .await?;
        tracing::info!(subnet = %self.mine.subnet, "lease re-acquired");
        self.write_files()?;
        Ok(())
    }
}

/// Runs the agent until `shutdown` resolves; the data plane stays.
pub async fn run(
    store: AnyStore,
    opts: Options,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    tokio::pin!(shutdown);
    let objs = Objects::new(store.clone());
    let cfg = load_config(&objs).await?;
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
        objs: objs.clone(),
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
    rt.mine = lease::acquire(&store, &cfg, &opts.node, &attrs, previous, opts.lease_ttl).await?;
    tracing::info!(node = %opts.node, subnet = %rt.mine.subnet, public_ip = %underlay.ip, backend = backend_name(cfg.backend), mtu, "lease acquired");
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
    register_node(&objs, &opts.node, underlay.ip, rt.mine.subnet).await?;

    // The service proxy runs beside the network loop; its rules stay when
    // the agent stops.
    let _proxy = opts.proxy.then(|| {
        let (store, m) = (store.clone(), metrics.clone());
        let have: Vec<std::net::IpAddr> = h
            .addrs(0)
            .map(|a| a.into_iter().map(|a| a.net.addr()).collect())
            .unwrap_or_default();
        let node = proxy::NodeInfo {
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
            proxy::Stack::v4(cfg.network).with_service_cidr(svc_cidr),
            proxy::Stack::v6(cfg.ipv6_network).with_service_cidr(svc_cidr),
        ];
        let resync = opts.resync;
        AbortOnDrop(tokio::spawn(async move {
            // A store outage ends one run; the next starts with a full sync.
            loop {
                let run = proxier::run(
                    store.clone(),
                    node.clone(),
                    stacks.clone(),
                    resync,
                    m.clone(),
                    std::future::pending(),
                );
                if let Err(e) = run.await {
                    tracing::error!("service proxy: {e}; restarting in 1s");
                    m.set_unhealthy(Some(format!("service proxy: {e}")));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }))
    });

    let mut next_renew = Instant::now() + Duration::from_secs((opts.lease_ttl / 3).max(1) as u64);
    // A lost store fails /readyz (component="overlay"); routes stay as they
    // are meanwhile, and the store's return brings a relist.
    let health = metrics.store_watch("overlay");
    let _probe = health.probe({
        let store = store.clone();
        move || {
            let store = store.clone();
            async move { store.revision().await }
        }
    });
    'relist: loop {
        let listed = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            r = store.list(lease::PREFIX) => r,
        };
        let (kvs, rev) = match listed {
            Ok(l) => l,
            Err(e) => {
                health.broken(&format!("listing leases: {e}"));
                tokio::select! {
                    _ = &mut shutdown => return Ok(()),
                    _ = health.backoff() => continue 'relist,
                }
            }
        };
        rt.leases = kvs
            .iter()
            .filter_map(lease::decode)
            .map(|l| (l.subnet, l))
            .collect();
        if !rt.leases.contains_key(&rt.mine.subnet)
            || rt.leases[&rt.mine.subnet].attrs.node != opts.node
        {
            rt.reacquire().await?;
            continue 'relist;
        }
        if let Err(e) = rt.sync() {
            tracing::warn!("sync: {e}");
        }
        metrics.set_ready(true);
        let watch = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            w = store.watch(lease::PREFIX, rev + 1) => w,
        };
        let mut w = match watch {
            Ok(w) => w,
            Err(e) => {
                health.broken(&format!("watching leases: {e}"));
                tokio::select! {
                    _ = &mut shutdown => return Ok(()),
                    _ = health.backoff() => continue 'relist,
                }
            }
        };
        health.watching();
        let mut next_resync = Instant::now() + opts.resync;
        loop {
            let wake = next_resync.min(next_renew);
            tokio::select! {
                _ = &mut shutdown => {
                    tracing::info!("shutting down; the data plane stays in place");
                    return Ok(());
                }
                _ = tokio::time::sleep_until(wake.into()) => {
                    if Instant::now() >= next_renew {
                        next_renew = Instant::now() + Duration::from_secs((opts.lease_ttl / 3).max(1) as u64);
                        match store.keepalive(rt.mine.lease_id).await {
                            Ok(()) => {}
                            Err(StoreError::LeaseNotFound(_)) => {
                                tracing::warn!("lease expired; re-acquiring");
                                rt.reacquire().await?;
                                continue 'relist;
                            }
                            Err(e) => tracing::warn!("lease renewal: {e}"),
                        }
                    }
                    if Instant::now() >= next_resync {
                        next_resync = Instant::now() + opts.resync;
                        if let Err(e) = rt.sync() {
                            tracing::warn!("resync: {e}");
                        }
                        rt.masq_table().repair();
                        ensure_bridge_netfilter(false);
                    }
                }
                // The store is back after a loss: relist.
                _ = health.recovered() => continue 'relist,
                m = w.next() => {
                    health.event();
                    let mut relist = false;
                    for m in w.with_queued(m) {
                        match m {
                            Some(Ok(WatchMsg::Events(_, evs))) => {
                                for ev in evs {
                                    let Some(subnet) = lease::parse_key(&ev.kv.key) else { continue };
                                    match ev.typ {
                                        EventType::Put => {
                                            if let Some(l) = lease::decode(&ev.kv) {
                                                rt.leases.insert(subnet, l);
                                            }
                                        }
                                        EventType::Delete => {
                                            rt.leases.remove(&subnet);
                                            if subnet == rt.mine.subnet {
                                                relist = true;
                                            }
                                        }
                                    }
                                }
                            }
                            Some(Ok(WatchMsg::Compacted(_))) => relist = true,
                            Some(Err(e)) => {
                                health.broken(&format!("lease watch: {e}"));
                                relist = true;
                            }
                            None => {
                                health.broken(&"lease watch ended");
                                relist = true;
                            }
                        }
                    }
                    if relist {
                        continue 'relist;
                    }
                    if let Err(e) = rt.sync() {
                        tracing::warn!("sync: {e}");
                    }
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
    for t in proxier::cleanup()? {
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
