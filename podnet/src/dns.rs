//! `podnet dns`: flags, and the glue from them to [`podnet_dns::run`].
//! Unset cluster settings (zone, reverse networks) come from the store's
//! NetworkConfig, so DNS agrees with the controller without extra flags.

use anyhow::{Context, Result};
use podnet_api::netconfig;

/// Flags of `podnet dns`.
#[derive(clap::Args)]
pub struct DnsArgs {
    #[command(flatten)]
    kube: crate::cmd::KubeArgs,
    /// Address for DNS over UDP and TCP.
    #[arg(long, default_value = "0.0.0.0:53")]
    listen: String,
    /// Cluster domain (default: the NetworkConfig's ClusterDomain, cluster.local).
    #[arg(long)]
    zone: Option<String>,
    /// TTL of cluster records and of negative answers, in seconds.
    #[arg(long, default_value_t = 5)]
    ttl: u32,
    /// Upstream resolver IP[:PORT] for other names; repeatable or comma-separated
    /// (default: the nameservers of --resolv-conf).
    #[arg(long, value_delimiter = ',')]
    upstream: Vec<String>,
    /// Where to read upstreams from when --upstream is not given.
    #[arg(long, default_value = "/etc/resolv.conf")]
    resolv_conf: std::path::PathBuf,
    /// Time one upstream gets before the next is tried, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    upstream_timeout_ms: u64,
    /// Most forwarded answers to cache (0 disables the cache).
    #[arg(long, default_value_t = 10_000)]
    cache_size: usize,
    /// Answer a-b-c-d.<ns>.pod.<zone> (CoreDNS's `pods insecure`).
    #[arg(long)]
    pods_insecure: bool,
    /// Networks whose reverse (PTR) names are ours; repeatable or
    /// comma-separated (default: the ServiceCIDR and the cluster Network).
    #[arg(long, value_delimiter = ',')]
    reverse_cidr: Vec<String>,
    /// Clients whose queries for names outside the cluster zone are
    /// forwarded upstream (recursion); others get REFUSED for them, while
    /// the cluster zone answers everyone. Items: CIDR, IP, `default`,
    /// `any` (an open resolver) or `none`; repeatable or comma-separated.
    /// Given items replace the default list; add `default` to extend it.
    /// Default: loopback, the ServiceCIDR, the Network and IPv6Network,
    /// and the subnets of this host's interfaces at start.
    #[arg(long, value_delimiter = ',', value_name = "CIDR")]
    allow_recursion: Vec<String>,
    /// UDP worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, default_value = "127.0.0.1:9153")]
    metrics_addr: String,
}

/// The networks of this host's interfaces (its namespace's), read once:
/// the node networks whose clients may recurse by default.
fn host_networks() -> Vec<ipnet::IpNet> {
    let addrs = podnet_kernel::Handle::new().and_then(|mut h| h.addrs(0));
    match addrs {
        Ok(v) => v
            .into_iter()
            // A /0 on an interface would open recursion to everyone.
            .filter(|a| a.net.prefix_len() > 0)
            .map(|a| a.net.trunc())
            .collect(),
        Err(e) => {
            tracing::warn!("reading this host's addresses: {e}; not allowing its networks");
            Vec::new()
        }
    }
}

/// The recursion allow-list: `--allow-recursion`, or the default from the
/// cluster's networks and the host's.
fn recursion(a: &DnsArgs, net: &netconfig::Resolved) -> Result<podnet_dns::AllowList> {
    let default = podnet_dns::AllowList::cluster(
        net.service_cidr,
        ipnet::IpNet::V4(net.network),
        net.ipv6_network.map(ipnet::IpNet::V6),
    )
    .with(net.service_cidr_secondary)
    .with(host_networks());
    if a.allow_recursion.is_empty() {
        return Ok(default);
    }
    podnet_dns::AllowList::parse(&a.allow_recursion, &default)
        .map_err(|e| anyhow::anyhow!("--allow-recursion {e}"))
}

pub(crate) async fn network_config(store: &podnet_store::AnyStore) -> netconfig::Resolved {
    let cfg = podnet_source::store::network_config(store)
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    cfg.resolve().unwrap_or_else(|(f, m)| {
        tracing::warn!("NetworkConfig {f}: {m}; using defaults");
        netconfig::NetworkConfig::default()
            .resolve()
            .expect("defaults are valid")
    })
}

/// Runs the DNS server until SIGTERM.
pub async fn run(url: &str, a: DnsArgs) -> Result<()> {
    // Handlers first: a SIGTERM that arrives once we answer must stop us
    // cleanly, not kill us.
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
    };
    let metrics = podnet_daemon::Metrics::new();
    let (source, net) = if a.kube.enabled() {
        let client = a.kube.client().await?;
        (
            podnet_source::Source::kube(client, metrics.store_watch("dns")),
            a.kube.network_config()?,
        )
    } else {
        let store = podnet_store::open(url)
            .await
            .with_context(|| format!("opening store {url}"))?;
        let net = network_config(&store).await;
        (
            podnet_source::Source::store(store, metrics.store_watch("dns")),
            net,
        )
    };
    let mut reverse = Vec::new();
    for c in &a.reverse_cidr {
        reverse.push(
            c.parse::<ipnet::IpNet>()
                .with_context(|| format!("--reverse-cidr {c:?}"))?,
        );
    }
    if a.reverse_cidr.is_empty() {
        reverse.push(net.service_cidr);
        reverse.extend(net.service_cidr_secondary);
        reverse.push(ipnet::IpNet::V4(net.network));
        if let Some(v6) = net.ipv6_network {
            reverse.push(ipnet::IpNet::V6(v6));
        }
    }
    let mut upstreams = Vec::new();
    for u in a.upstream.iter().filter(|u| !u.is_empty()) {
        upstreams.push(
            podnet_dns::forward::parse_upstream(u)
                .with_context(|| format!("--upstream {u:?}: want IP or IP:PORT"))?,
        );
    }
    if a.upstream.is_empty() {
        let text = std::fs::read_to_string(&a.resolv_conf).unwrap_or_default();
        upstreams = podnet_dns::forward::from_resolv_conf(&text);
        if upstreams.is_empty() {
            tracing::warn!(
                "no nameserver in {}: names outside the zone get SERVFAIL",
                a.resolv_conf.display()
            );
        }
    }
    let recursion = recursion(&a, &net)?;
    let zone = a.zone.clone().unwrap_or(net.cluster_domain);
    podnet_dns::wire::name_from_str(&zone).with_context(|| format!("--zone {zone:?}"))?;
    let cfg = podnet_dns::Config {
        zone: podnet_dns::ZoneConfig {
            zone,
            ttl: a.ttl,
            pods: a.pods_insecure,
            reverse,
        },
        upstreams,
        upstream_timeout: std::time::Duration::from_millis(a.upstream_timeout_ms.max(1)),
        cache_size: a.cache_size,
        threads: a.threads,
        recursion,
    };
    let listen = podnet_daemon::listen_addr(&a.listen).map_err(anyhow::Error::msg)?;
    let sockets = podnet_dns::Sockets::bind(listen)?;
    let maddr = podnet_daemon::listen_addr(&a.metrics_addr).map_err(anyhow::Error::msg)?;
    let listener = podnet_daemon::bind(&maddr.to_string())
        .await
        .with_context(|| format!("binding metrics address {maddr}"))?;
    tracing::info!(store = url, dns = %sockets.local_addr(), metrics = %listener.local_addr()?, "dns starting");
    tokio::spawn(podnet_daemon::serve(listener, metrics.clone()));
    podnet_dns::run(cfg, sockets, source, metrics, shutdown).await?;
    tracing::info!("dns stopped");
    Ok(())
}
