//! `podnet agent`: one per node, thin. The binary hands it the node's view
//! of the cluster (`podnet_source::node::NodeView`: the one object source,
//! the subnet claim through leases or the Node's podCIDR, the network
//! config), so it never opens the store or the API itself. It claims the
//! node's subnet and runs the node's subsystems on the one reconcile loop
//! (`podnet_reconcile`):
//!
//! - the overlay (`podnet_overlay`): the backend (vxlan, host-gw, udp),
//!   routes, masquerade and the CNI files;
//! - the service proxy (`podnet_proxy`): Services on nftables;
//! - NetworkPolicy (`podnet_policy`): the node's pods' ingress and egress
//!   on nftables, the CNI plugin's wait for a new pod, the verdict log;
//! - the flow log ([`flows`]): new connections from conntrack's events and
//!   the verdict log's denials, served at `/flows` (`podnet flows`).
//!
//! The object source's and the lease watch's health are
//! `podnet_daemon::StoreWatch` components `agent` and `overlay`: a lost
//! store fails `/readyz`, the data plane stays as it is, and the store's
//! return brings a relist. SIGTERM leaves the data plane in place, so
//! established connections survive a restart; `--cleanup` removes
//! everything.

pub mod flows;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use podnet_api::Kind;
use podnet_daemon::Metrics;
use podnet_kernel::Handle;
use podnet_overlay::{Overlay, OverlayInput, Paths};
use podnet_reconcile::Input;
use podnet_source::node::{Claim, NodeView};
use podnet_source::subnets;

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
    /// The node's flow log, fed by this agent (None: `--no-flows`).
    pub flows: Option<Arc<std::sync::Mutex<podnet_trace::flows::FlowLog>>>,
}

/// How long a queued proxy change may wait for its sync before the
/// proxy's `/healthz` fails: kube-proxy's, twice its default sync period.
const PROXY_HEALTH_TIMEOUT: Duration = Duration::from_secs(60);

/// Serves the proxy's `/healthz` on `addr`, if it can be bound (a node
/// that runs kube-proxy too keeps kube-proxy's; the agent runs without).
async fn serve_healthz(
    addr: std::net::SocketAddr,
    stacks: &[podnet_proxy::Stack],
) -> Option<Arc<podnet_proxy::healthz::Health>> {
    let l = match podnet_daemon::bind(&addr.to_string()).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("proxy healthz address {addr}: {e}; serving no proxy /healthz");
            return None;
        }
    };
    let families = stacks
        .iter()
        .map(|s| match s.family {
            podnet_nft::model::Family::Ip6 => "IPv6",
            _ => "IPv4",
        })
        .collect();
    let h = podnet_proxy::healthz::Health::new(PROXY_HEALTH_TIMEOUT, families);
    let pages = h.clone();
    tokio::spawn(podnet_daemon::serve_pages(
        l,
        Arc::new(move |p: &str| pages.page(p)),
    ));
    tracing::info!(%addr, "proxy healthz");
    Some(h)
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

/// Runs the agent until `shutdown` resolves; the data plane stays.
pub async fn run(
    view: NodeView,
    opts: Options,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    tokio::pin!(shutdown);
    // One object source for the whole agent; the overlay's subnets and the
    // proxy subscribe to it.
    let NodeView {
        mut source,
        mut subnets,
        config: cfg,
    } = view;
    let proxy_sub = opts
        .proxy
        .then(|| source.subscribe(&[Kind::Service, Kind::EndpointSlice, Kind::Node]));
    let policy_sub = opts.policy.then(|| source.subscribe(podnet_policy::KINDS));
    let flows_sub = opts.flows.as_ref().map(|_| source.subscribe(flows::KINDS));
    let _source = source.start();

    let paths = Paths {
        subnet_file: opts.subnet_file.clone(),
        cni_conf_dir: opts.cni_conf_dir.clone(),
        cni_data_dir: opts.cni_data_dir.clone(),
    };
    let mut overlay = Overlay::new(
        &opts.node,
        opts.iface.as_deref(),
        opts.mtu,
        paths,
        cfg.clone(),
        metrics.clone(),
    )
    .map_err(|e| AgentError::Other(e.to_string()))?;
    let underlay = overlay.underlay().clone();
    // The service proxy runs beside the network loop; its rules stay when
    // the agent stops. It starts first: every subscription to the source
    // must be read, or the source (which waits for slow readers) stalls
    // the node's subnet subscription too.
    let _proxy = proxy_sub.map(|sub| {
        let m = metrics.clone();
        let have: Vec<std::net::IpAddr> = Handle::new()
            .and_then(|mut h| h.addrs(0))
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
        match podnet_proxy::ct_timeouts::apply(&opts.ct_timeouts) {
            Ok(set) if !set.is_empty() => tracing::info!(?set, "conntrack timeouts"),
            Ok(_) => {}
            Err(e) => tracing::warn!("conntrack timeouts not set: {e}"),
        }
        let svc_cidr = Some(cfg.service_cidr);
        let stacks = vec![
            podnet_proxy::Stack::v4(cfg.network).with_service_cidr(svc_cidr),
            podnet_proxy::Stack::v6(cfg.ipv6_network).with_service_cidr(svc_cidr),
        ];
        let resync = opts.resync;
        let healthz_addr = opts.healthz_addr;
        AbortOnDrop(tokio::spawn(async move {
            let healthz = match healthz_addr {
                Some(addr) => serve_healthz(addr, &stacks).await,
                None => None,
            };
            let run = podnet_proxy::run(
                sub,
                node,
                stacks,
                resync,
                healthz,
                m.clone(),
                std::future::pending(),
            );
            if let Err(e) = run.await {
                tracing::error!("service proxy stopped: {e}");
                m.set_unhealthy_for("proxy", Some(format!("service proxy stopped: {e}")));
            }
        }))
    });

    // The flow log: names from its subscription (read at once, like every
    // subscription), new connections from conntrack on a thread.
    let recorder = opts
        .flows
        .clone()
        .map(|log| flows::Recorder::new(&opts.node, log, metrics.clone()));
    let _flows = match (&recorder, flows_sub) {
        (Some(r), Some(sub)) => {
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (r2, s2) = (r.clone(), stop.clone());
            std::thread::Builder::new()
                .name("flow-log".into())
                .spawn(move || r2.conntrack(s2))
                .map_err(|e| AgentError::Other(format!("starting the flow log: {e}")))?;
            Some((
                AbortOnDrop(tokio::spawn(r.clone().names(sub))),
                StopOnDrop(stop),
            ))
        }
        _ => None,
    };

    // NetworkPolicy, also before the subnet claim (its subscription must
    // be read); it fails closed on the subnet once it is known.
    let policy = match policy_sub {
        Some(sub) => {
            let popts = podnet_policy::Options {
                node: opts.node.clone(),
                ipv6: cfg.ipv6_network.is_some(),
                limit: Default::default(),
                strict: opts.policy_strict,
            };
            let socket = podnet_policy::hint::socket_for(&opts.subnet_file);
            let sink = recorder.as_ref().map(|r| r.denial_sink());
            let (feed, fut) =
                podnet_policy::start_with(sub, popts, socket, opts.resync, metrics.clone(), sink)
                    .map_err(|e| AgentError::Other(e.to_string()))?;
            Some((feed, AbortOnDrop(tokio::spawn(fut))))
        }
        None => {
            // Policy off: a table an enforcing agent left would go on
            // judging with nobody updating it, and fail closed on every
            // new pod. (This is also the way down to a version without
            // NetworkPolicy: roll out --no-policy first.)
            match podnet_policy::cleanup() {
                Ok(gone) => {
                    for t in gone {
                        tracing::info!(
                            "NetworkPolicy is off (--no-policy): removed the nft table {t} an earlier agent left"
                        );
                    }
                }
                Err(e) => tracing::warn!(
                    "NetworkPolicy is off (--no-policy), but the policy tables could not be checked: {e}"
                ),
            }
            None
        }
    };
    // Without policy the CNI plugin's ADD still waits for an agent on the
    // socket (see podnet_cni's meta plugin): answer it.
    let _cni_socket = policy.is_none().then(|| {
        let socket = podnet_policy::hint::socket_for(&opts.subnet_file);
        let m = metrics.clone();
        AbortOnDrop(tokio::spawn(async move {
            if let Err(e) = podnet_policy::hint::serve_without_policy(socket.clone()).await {
                tracing::error!("CNI socket {}: {e}", socket.display());
                m.set_unhealthy_for("policy", Some(format!("CNI socket: {e}")));
            }
        }))
    });

    let attrs = overlay.attrs();
    let previous = podnet_overlay::files::previous_subnet(&opts.subnet_file);
    let mine = tokio::select! {
        _ = &mut shutdown => return Ok(()),
        r = subnets.acquire(&attrs, previous) => r?,
    };
    tracing::info!(node = %opts.node, subnet = %mine.subnet, public_ip = %underlay.ip, backend = overlay.backend().name(), mtu = overlay.mtu(), "subnet acquired");
    overlay
        .start(mine.clone())
        .map_err(|e| AgentError::Other(e.to_string()))?;
    subnets.network_up(underlay.ip).await?;
    if let Some((feed, _)) = &policy {
        feed.subnets(vec![ipnet::IpNet::V4(mine.subnet)]).await;
    }

    // The overlay's reconcile loop; this task keeps the subnet claim and
    // feeds it the subnet map.
    let (tx, rx) = podnet_reconcile::channel();
    let overlay_loop = AbortOnDrop(tokio::spawn(podnet_reconcile::run(
        overlay,
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
                    let _ = tx.send(Input::Changes(OverlayInput::Nodes(map))).await;
                    if !ready {
                        ready = true;
                        let _ = tx.send(Input::Ready).await;
                    }
                }
                subnets::Change::LostMine => {
                    let l = subnets.acquire(&attrs, Some(mine_subnet)).await?;
                    tracing::info!(subnet = %l.subnet, "subnet re-acquired");
                    mine_subnet = l.subnet;
                    if let Some((feed, _)) = &policy {
                        feed.subnets(vec![ipnet::IpNet::V4(l.subnet)]).await;
                    }
                    let _ = tx.send(Input::Changes(OverlayInput::Mine(l))).await;
                }
            }
        }
    }
}

struct StopOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
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
pub async fn cleanup(claim: Option<Claim>, opts: &Options) -> Result<Vec<String>, AgentError> {
    let paths = Paths {
        subnet_file: opts.subnet_file.clone(),
        cni_conf_dir: opts.cni_conf_dir.clone(),
        cni_data_dir: opts.cni_data_dir.clone(),
    };
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
