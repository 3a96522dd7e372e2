//! Cluster DNS: the Kubernetes DNS-Based Service Discovery spec (schema
//! 1.1.0) served from the store, everything else forwarded upstream. The job
//! CoreDNS's `kubernetes` + `forward` + `cache` plugins do.
//!
//! Layout, one concept per module:
//! - [`wire`]: the DNS wire format (parse queries without allocating,
//!   parse messages, encode with compression); never panics on input.
//! - [`zone`]: pure. Services, EndpointSlices and Namespaces in, an
//!   immutable [`zone::Snapshot`] of pre-encoded answers out, rebuilt
//!   incrementally.
//! - [`watch`]: the store edge: list, watch, relist, publish snapshots.
//! - [`forward`]: upstream resolvers, failover, the answer cache, and the
//!   allow-list of clients that may recurse.
//! - [`server`]: UDP workers, TCP, truncation, refusals, the handler.
//! - [`stats`]: lock-free counters, exported to `/metrics` once a second.
//! - [`client`]: a tiny blocking client (tests, benchmarks, tools).
//!
//! [`run`] takes its sockets and a shutdown future, so tests bind
//! `127.0.0.1:0` and run many servers side by side.

pub mod client;
pub mod forward;
pub mod server;
pub mod stats;
pub mod watch;
pub mod wire;
pub mod zone;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use podnet_daemon::Metrics;
use podnet_source::Source;

pub use forward::AllowList;
pub use zone::ZoneConfig;

const DNS_CACHE_ENTRIES: podnet_daemon::Gauge = podnet_daemon::Gauge::new(
    "podnet_dns_cache_entries",
    "Answers in the forwarding cache.",
);

/// Everything `podnet dns` can be told.
#[derive(Debug, Clone)]
pub struct Config {
    pub zone: ZoneConfig,
    /// Resolvers for names outside the cluster zone, tried in order.
    pub upstreams: Vec<SocketAddr>,
    /// How long one upstream gets before the next is tried.
    pub upstream_timeout: Duration,
    /// Most answers the forwarding cache holds (0: no cache).
    pub cache_size: usize,
    /// UDP worker threads (0: one per core).
    pub threads: usize,
    /// Clients whose queries for names outside the zone are forwarded;
    /// the rest get REFUSED for them.
    pub recursion: AllowList,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            zone: ZoneConfig::default(),
            upstreams: Vec::new(),
            upstream_timeout: Duration::from_secs(2),
            cache_size: 10_000,
            threads: 0,
            recursion: default_recursion(),
        }
    }
}

/// Loopback, the default Service CIDR and the default pod network: the
/// allow-list when nothing more is known (`podnet dns` adds the store's
/// networks and the host's).
fn default_recursion() -> AllowList {
    use podnet_api::netconfig::{DEFAULT_NETWORK, DEFAULT_SERVICE_CIDR};
    AllowList::cluster(
        DEFAULT_SERVICE_CIDR.parse().expect("default CIDR"),
        DEFAULT_NETWORK.parse().expect("default CIDR"),
        None,
    )
}

#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// The server's sockets: UDP and TCP on one address.
pub struct Sockets {
    pub udp: std::net::UdpSocket,
    pub tcp: std::net::TcpListener,
}

impl Sockets {
    /// Binds UDP and TCP on `addr` (port 0: one free port for both).
    pub fn bind(addr: SocketAddr) -> Result<Sockets, DnsError> {
        let (udp, tcp) = server::bind(addr).map_err(|source| DnsError::Io {
            what: format!("binding {addr}"),
            source,
        })?;
        Ok(Sockets { udp, tcp })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.udp.local_addr().expect("bound socket")
    }
}

/// Serves DNS until `shutdown` resolves: UDP worker threads, TCP, the
/// store watch, and a once-a-second metrics export. `/readyz` (through
/// `metrics`) turns ready after the first full load.
pub async fn run(
    cfg: Config,
    sockets: Sockets,
    mut source: Source,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DnsError> {
    let threads = worker_threads(&cfg);
    let zone = Arc::new(ArcSwap::from_pointee(zone::Snapshot::empty(&cfg.zone)));
    let fwd = Arc::new(forward::Forwarder::new(
        cfg.upstreams.clone(),
        cfg.upstream_timeout,
        cfg.cache_size,
    ));
    let shared = Arc::new(stats::Stats::default());
    let handler = Arc::new(server::Handler::new(
        zone.clone(),
        fwd.clone(),
        shared.clone(),
        cfg.recursion.clone(),
    ));
    let tcp = tokio::net::TcpListener::from_std(sockets.tcp).map_err(|source| DnsError::Io {
        what: "registering the TCP listener".into(),
        source,
    })?;
    let udp = Arc::new(sockets.udp);
    let stop = Arc::new(AtomicBool::new(false));
    let UdpWorkers { workers, counters } = spawn_udp_workers(threads, &udp, &handler, &stop)?;
    let blocks = [shared].into_iter().chain(counters).collect();
    tracing::info!(
        listen = %udp.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        zone = cfg.zone.zone,
        threads,
        upstreams = ?cfg.upstreams,
        allow_recursion = %cfg.recursion,
        "dns serving"
    );
    let tcp_task = tokio::spawn(server::tcp_accept(tcp, handler.clone()));
    let (stop_watch_tx, stop_watch_rx) = tokio::sync::oneshot::channel::<()>();
    let sub = source.subscribe(&watch::KINDS);
    let _source = source.start();
    let watch_task = tokio::spawn(watch::run(
        sub,
        zone::Builder::new(cfg.zone.clone()),
        zone.clone(),
        metrics.clone(),
        async move {
            let _ = stop_watch_rx.await;
        },
    ));
    let names: Vec<String> = cfg.upstreams.iter().map(|u| u.to_string()).collect();
    let mut exporter = stats::Exporter::new(blocks, names);
    let export = |exporter: &mut stats::Exporter| export_metrics(exporter, &fwd, &metrics);
    tokio::pin!(shutdown);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            // Polled first, so a signal handler inside is installed at once.
            biased;
            _ = &mut shutdown => break,
            _ = tick.tick() => export(&mut exporter),
        }
    }
    tracing::info!("dns shutting down");
    metrics.set_ready(false);
    stop.store(true, Ordering::Relaxed);
    let _ = stop_watch_tx.send(());
    tcp_task.abort();
    let _ = watch_task.await;
    let _ = tokio::task::spawn_blocking(move || {
        for w in workers {
            let _ = w.join();
        }
    })
    .await;
    export(&mut exporter);
    Ok(())
}

/// UDP worker threads: as configured, else one per core.
fn worker_threads(cfg: &Config) -> usize {
    if cfg.threads == 0 {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    } else {
        cfg.threads
    }
}

/// The UDP worker threads, and the counters each one keeps (in thread
/// order, for the exporter).
struct UdpWorkers {
    workers: Vec<std::thread::JoinHandle<()>>,
    counters: Vec<Arc<stats::Stats>>,
}

/// Starts `threads` UDP workers on `udp`; they run until `stop`.
fn spawn_udp_workers(
    threads: usize,
    udp: &Arc<std::net::UdpSocket>,
    handler: &Arc<server::Handler>,
    stop: &Arc<AtomicBool>,
) -> Result<UdpWorkers, DnsError> {
    let rt = tokio::runtime::Handle::current();
    let mut counters = Vec::new();
    let mut workers = Vec::new();
    for i in 0..threads {
        let st = Arc::new(stats::Stats::default());
        counters.push(st.clone());
        let (udp, h, rt, stop) = (udp.clone(), handler.clone(), rt.clone(), stop.clone());
        let w = std::thread::Builder::new()
            .name(format!("dns-udp-{i}"))
            .spawn(move || server::udp_worker(udp, h, st, rt, stop))
            .map_err(|source| DnsError::Io {
                what: "starting a UDP worker".into(),
                source,
            })?;
        workers.push(w);
    }
    Ok(UdpWorkers { workers, counters })
}

/// One metrics export: the query counters, upstream errors and the
/// forwarding cache's size.
fn export_metrics(exporter: &mut stats::Exporter, fwd: &forward::Forwarder, metrics: &Metrics) {
    let errs: Vec<u64> = fwd
        .errors
        .iter()
        .map(|e| e.load(Ordering::Relaxed))
        .collect();
    exporter.export(metrics, &errs);
    metrics.gauge(&DNS_CACHE_ENTRIES, "", fwd.cache.len() as f64);
}
