//! `podnet agent`: one per node, thin. The binary hands it the node's view
//! of the cluster (`podnet_source::node::NodeView`: the one object source,
//! the subnet claim through leases or the Node's podCIDR, the network
//! config), so it never opens the store or the API itself. It claims the
//! node's subnet and runs the node's subsystems on the one reconcile loop
//! (`podnet_reconcile`):
//!
//! - the overlay (`podnet_overlay`): the backend (vxlan, host-gw, udp, bgp),
//!   routes, masquerade and the CNI files;
//! - the service proxy (`podnet_proxy`): Services on nftables;
//! - NetworkPolicy (`podnet_policy`): the node's pods' ingress and egress
//!   on nftables, the CNI plugin's wait for a new pod, the verdict log;
//! - BGP ([`bgp`], with the bgp backend): the node's speaker, shared by
//!   the overlay (mesh, pod CIDR) and the Service announcer;
//! - L2 announcement ([`l2`], `--l2-announce`): ARP/NDP for this node's
//!   share of the LoadBalancer IPs, node liveness by BFD;
//! - the flow log ([`flows`]): new connections from conntrack's events and
//!   the verdict log's denials, served at `/flows` (`podnet flows`).
//!
//! The object source's and the lease watch's health are
//! `podnet_daemon::StoreWatch` components `agent` and `overlay`: a lost
//! store fails `/readyz`, the data plane stays as it is, and the store's
//! return brings a relist. SIGTERM leaves the data plane in place, so
//! established connections survive a restart; `--cleanup` removes
//! everything.

pub mod bgp;
pub mod flows;
pub mod l2;
pub mod networks;
pub mod services;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use podnet_daemon::Metrics;
use podnet_kernel::Handle;
use podnet_overlay::{Overlay, Paths};
use podnet_source::node::{Claim, NodeView};
use tokio::task::JoinSet;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{0}")]
    Source(#[from] podnet_source::SourceError),
    #[error("kernel: {0}")]
    Kernel(#[from] podnet_kernel::KernelError),
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
    /// Where the proxy serves its own `/healthz` and `/livez` (kube-proxy's
    /// `--healthz-bind-address`, `0.0.0.0:10256`); None: nowhere.
    pub healthz_addr: Option<std::net::SocketAddr>,
    /// The conntrack timeouts the proxy keeps on this node (kube-proxy's).
    pub ct_timeouts: podnet_proxy::ct_timeouts::Timeouts,
    /// Enforce NetworkPolicy.
    pub policy: bool,
    /// `--policy-strict`: also cut established connections a policy change
    /// no longer allows.
    pub policy_strict: bool,
    /// L2 announcement of LoadBalancer IPs ([`l2`]).
    pub l2_announce: bool,
    /// Where the node's BGP sessions are shown (`/bgp`, `podnet bgp
    /// status`), with the bgp backend.
    pub bgp_status: podnet_bgp::status::Board,
    /// The node's flow log, fed by this agent (None: `--no-flows`).
    pub flows: Option<Arc<std::sync::Mutex<podnet_trace::flows::FlowLog>>>,
    /// Pods' extra networks ([`networks`]; None: not served, the CNI
    /// plugin attaches the default network only).
    pub networks: Option<networks::Setup>,
}

/// Runs the agent until `shutdown` resolves; the data plane stays. The
/// subsystems run as tasks of one `JoinSet` (dropped, they stop); the
/// subnet claim, which keeps the overlay's loop, runs here: an error
/// there ends the agent.
pub async fn run(
    view: NodeView,
    opts: Options,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    let NodeView {
        mut source,
        subnets,
        config: cfg,
    } = view;
    // Every subscription is made before the source starts, and each is
    // read from then on (the source waits for slow readers).
    let proxy_sub = opts
        .proxy
        .then(|| source.subscribe(podnet_proxy::node::KINDS));
    let policy_sub = opts.policy.then(|| source.subscribe(podnet_policy::KINDS));
    let flows_sub = opts.flows.as_ref().map(|_| source.subscribe(flows::KINDS));
    let networks_sub = opts
        .networks
        .as_ref()
        .map(|s| (s.clone(), source.subscribe(networks::KINDS)));
    let routing_subs = routing_subs(&mut source, &cfg, &opts).await;
    let _source = source.start();

    let paths = paths(&opts);
    let mut overlay = Overlay::new(
        &opts.node,
        opts.iface.as_deref(),
        opts.mtu,
        paths,
        cfg.clone(),
        metrics.clone(),
    )
    .map_err(|e| AgentError::Other(e.to_string()))?;
    let mut tasks = JoinSet::new();
    routing(&mut overlay, &opts, routing_subs, &metrics, &mut tasks).await?;
    if let Some(sub) = proxy_sub {
        let mut ips = vec![std::net::IpAddr::V4(overlay.underlay().ip)];
        ips.extend(overlay.ipv6_underlay().map(std::net::IpAddr::V6));
        tasks.spawn(proxy(sub, &opts, ips, cfg.clone(), &metrics));
    }
    let recorder = opts
        .flows
        .clone()
        .map(|log| flows::Recorder::new(&opts.node, log, metrics.clone()));
    if let (Some(r), Some(sub)) = (&recorder, flows_sub) {
        tasks.spawn(r.clone().run(sub));
    }
    let socket = cni_socket(&opts, networks_sub, &mut tasks);
    let feed = match policy_sub {
        Some(sub) => {
            let popts = podnet_policy::Options {
                node: opts.node.clone(),
                ipv6: cfg.ipv6_network.is_some(),
                limit: Default::default(),
                strict: opts.policy_strict,
            };
            let sink = recorder.as_ref().map(|r| r.denial_sink());
            let (feed, fut) =
                podnet_policy::start_with(sub, popts, socket, opts.resync, metrics.clone(), sink)
                    .map_err(|e| AgentError::Other(e.to_string()))?;
            tasks.spawn(fut);
            Some(feed)
        }
        None => {
            tasks.spawn(podnet_policy::run_disabled(socket, metrics.clone()));
            None
        }
    };
    // The policy loop fails closed on the node's subnet once it is known.
    let claimed = move |s: ipnet::Ipv4Net| {
        let feed = feed.clone();
        async move {
            if let Some(f) = feed {
                f.subnets(vec![ipnet::IpNet::V4(s)]).await;
            }
        }
    };
    let claim = podnet_overlay::claim::run(
        overlay,
        subnets,
        &opts.subnet_file,
        opts.resync,
        metrics.clone(),
        claimed,
    );
    tokio::select! {
        _ = shutdown => {
            tracing::info!("shutting down; the data plane stays in place");
            Ok(())
        }
        r = claim => r.map_err(|e| AgentError::Other(e.to_string())),
    }
}

/// The CNI plugin's socket, answering for the pods' extra networks too
/// when they are served (their view then runs as a task of `tasks`).
fn cni_socket(
    opts: &Options,
    networks: Option<(networks::Setup, podnet_source::Subscription)>,
    tasks: &mut JoinSet<()>,
) -> podnet_policy::hint::Socket {
    let mut socket =
        podnet_policy::hint::Socket::at(podnet_policy::hint::socket_for(&opts.subnet_file));
    if let Some((setup, sub)) = networks {
        let n = networks::Networks::new(setup.write);
        socket.other = Some(n.other());
        tasks.spawn(n.follow(sub));
    }
    socket
}

/// BGP (with the bgp backend) and L2 announcement, as tasks of `tasks`:
/// one BFD mux per node (UDP port 3784 on the underlay address) serves
/// BGP's neighbours and L2 announcement's node liveness alike.
/// What BGP (with the bgp backend: its subscription, and the AS its
/// speaker runs in, read before the source starts) and L2 announcement
/// read.
struct RoutingSubs {
    bgp: Option<(podnet_source::Subscription, u32)>,
    l2: Option<podnet_source::Subscription>,
}

async fn routing_subs(
    source: &mut podnet_source::Source,
    cfg: &podnet_api::netconfig::Resolved,
    opts: &Options,
) -> RoutingSubs {
    let bgp = match cfg.backend == podnet_api::netconfig::BackendType::Bgp {
        true => Some((source.subscribe(bgp::KINDS), source.bgp_as().await)),
        false => None,
    };
    let l2 = opts.l2_announce.then(|| source.subscribe(l2::KINDS));
    RoutingSubs { bgp, l2 }
}

async fn routing(
    overlay: &mut Overlay,
    opts: &Options,
    subs: RoutingSubs,
    metrics: &Arc<Metrics>,
    tasks: &mut JoinSet<()>,
) -> Result<(), AgentError> {
    let RoutingSubs {
        bgp: bgp_sub,
        l2: l2_sub,
    } = subs;
    let asn = bgp_sub
        .as_ref()
        .map_or(podnet_api::bgp::DEFAULT_AS, |(_, asn)| *asn);
    let bfd = match bgp_sub.is_some() || l2_sub.is_some() {
        true => {
            let ip = std::net::IpAddr::V4(overlay.underlay().ip);
            let mux = podnet_bgp::bfd_link::Bfd::start(ip)
                .await
                .map_err(|e| AgentError::Other(format!("BFD on {ip}:3784: {e}")))?;
            Some(Arc::new(mux))
        }
        false => None,
    };
    let speaker = bgp::start(overlay, asn, opts.bgp_status.clone(), bfd.clone()).await?;
    if let (Some(speaker), Some((sub, _))) = (speaker, bgp_sub) {
        let u = overlay.underlay();
        let segment = ipnet::Ipv4Net::new(u.ip, u.net.prefix_len()).expect("prefix");
        let me = (opts.node.clone(), segment.into(), asn);
        tasks.spawn(bgp::run(sub, me, speaker));
        tasks.spawn(bgp::metrics(opts.bgp_status.clone(), metrics.clone()));
    }
    if let (Some(sub), Some(mux)) = (l2_sub, bfd) {
        let iface = overlay.underlay().name.clone();
        tasks.spawn(l2::run(sub, opts.node.clone(), iface, mux, metrics.clone()));
    }
    Ok(())
}

/// The service proxy's task: its loop, or `/readyz` failing with why it
/// stopped.
fn proxy(
    sub: podnet_source::Subscription,
    opts: &Options,
    ips: Vec<std::net::IpAddr>,
    cfg: podnet_api::netconfig::Resolved,
    metrics: &Arc<Metrics>,
) -> impl Future<Output = ()> + Send + 'static {
    let local_ips = Handle::new()
        .and_then(|mut h| h.addrs(0))
        .map(|a| a.into_iter().map(|a| a.net.addr()).collect())
        .unwrap_or_default();
    let node = podnet_proxy::node::NodeProxy {
        node: opts.node.clone(),
        ips,
        local_ips,
        nodeport_addresses: opts.nodeport_addresses.clone(),
        healthz_addr: opts.healthz_addr,
        ct_timeouts: opts.ct_timeouts,
        resync: opts.resync,
    };
    let m = metrics.clone();
    async move {
        if let Err(e) = podnet_proxy::node::run(sub, node, &cfg, m.clone()).await {
            tracing::error!("service proxy stopped: {e}");
            m.set_unhealthy_for("proxy", Some(format!("service proxy stopped: {e}")));
        }
    }
}

/// Where the node's files go.
fn paths(opts: &Options) -> Paths {
    Paths {
        subnet_file: opts.subnet_file.clone(),
        cni_conf_dir: opts.cni_conf_dir.clone(),
        cni_data_dir: opts.cni_data_dir.clone(),
    }
}

/// Removes everything the agent installed on this node and gives the
/// subnet back.
pub async fn cleanup(claim: Option<Claim>, opts: &Options) -> Result<Vec<String>, AgentError> {
    let paths = paths(opts);
    let mut done = podnet_overlay::cleanup(opts.iface.as_deref(), &paths)
        .map_err(|e| AgentError::Other(e.to_string()))?;
    for t in podnet_proxy::cleanup().map_err(|e| AgentError::Other(e.to_string()))? {
        done.push(format!("removed nft table {t}"));
    }
    for t in podnet_policy::cleanup().map_err(|e| AgentError::Other(e.to_string()))? {
        done.push(format!("removed nft table {t}"));
    }
    if podnet_trace::collect::cleanup().map_err(|e| AgentError::Other(e.to_string()))? {
        done.push(format!(
            "removed nft table inet {}",
            podnet_trace::plan::TABLE
        ));
    }
    let _ = std::fs::remove_file(podnet_policy::hint::socket_for(&opts.subnet_file));
    if let Some(claim) = claim {
        done.extend(claim.release(&opts.node).await?);
    }
    Ok(done)
}
