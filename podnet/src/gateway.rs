//! `podnet gateway`: flags, the object source and status writer for the
//! mode (store or Kubernetes API), and the glue to [`podnet_gateway::run`].

use std::net::IpAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use podnet_api::{Kind, Object};
use podnet_gateway::write::WriteStatus;

/// Flags of `podnet gateway`.
#[derive(clap::Args)]
pub struct GatewayArgs {
    #[command(flatten)]
    kube: crate::cmd::KubeArgs,
    /// The local address every listener port binds.
    #[arg(long, default_value = "0.0.0.0")]
    address: IpAddr,
    /// The address(es) Gateway and Ingress statuses show (where clients
    /// reach this gateway: the node's address when it runs with the
    /// host's network); repeatable or comma-separated.
    #[arg(long, value_delimiter = ',')]
    status_address: Vec<String>,
    /// The IngressClass whose Ingresses this gateway serves.
    #[arg(long, default_value = podnet_api::ingress::CLASS)]
    ingress_class: String,
    /// The port Ingresses are served on without TLS.
    #[arg(long, default_value_t = 80)]
    ingress_http_port: u16,
    /// The port Ingresses with `tls` are served on.
    #[arg(long, default_value_t = 443)]
    ingress_https_port: u16,
    /// Log every request (client, host, path, status, the route that
    /// matched, the backend).
    #[arg(long)]
    access_log: bool,
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, default_value = "127.0.0.1:10290")]
    metrics_addr: String,
    /// Give each Gateway an address of its own from these (`first-last`
    /// or CIDRs, comma-separated), put on this node's loopback so the node
    /// answers for it (needs CAP_NET_ADMIN): Gateways listening on one port
    /// then keep their routes apart. Without it every Gateway is served on
    /// --address and shows --status-address.
    #[arg(long, env = "PODNET_GATEWAY_ADDRESS_POOL")]
    address_pool: Option<String>,
    /// The ports Gateway listeners may open on the node (`80,443,1024-
    /// 65535`: no other privileged port); a listener on any other is not
    /// accepted (reason PortUnavailable). Ingress ports are not limited.
    #[arg(long, env = "PODNET_GATEWAY_LISTENER_PORTS", default_value = podnet_gateway::model::ports::DEFAULT)]
    listener_ports: String,
    /// Seconds a client may take to send a request's head (and an idle
    /// HTTP/1.1 connection is kept; a TLS handshake must end within it;
    /// an HTTP/2 peer must answer a ping within it).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout: u64,
    /// Kubernetes mode: the namespace of the Lease the replicas elect the
    /// one status writer with (every replica serves traffic).
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    lease_namespace: String,
    /// Kubernetes mode: this replica's name in the Lease (default: the
    /// pod's name, else the host name and process ID).
    #[arg(long, env = "POD_NAME")]
    id: Option<String>,
    /// Data-plane threads, each serving its share of the connections on
    /// every port (0: one per CPU).
    #[arg(long, default_value_t = 0)]
    workers: usize,
}

/// The gateway's settings a trace of a URL needs to compile as the
/// gateway does (from the same environment variables its ConfigMap
/// sets).
#[derive(clap::Args, Debug)]
pub struct TraceArgs {
    /// For a URL: the gateway's --address-pool.
    #[arg(long, env = "PODNET_GATEWAY_ADDRESS_POOL")]
    gateway_address_pool: Option<String>,
    /// For a URL: the gateway's --listener-ports.
    #[arg(long, env = "PODNET_GATEWAY_LISTENER_PORTS", default_value = podnet_gateway::model::ports::DEFAULT)]
    gateway_listener_ports: String,
    /// For a URL: the gateway's --ingress-class.
    #[arg(long, default_value = podnet_api::ingress::CLASS)]
    gateway_ingress_class: String,
}

impl TraceArgs {
    pub fn config(&self) -> Result<podnet_gateway::model::build::Config> {
        config(
            &self.gateway_ingress_class,
            (80, 443),
            self.gateway_address_pool.as_deref(),
            &self.gateway_listener_ports,
        )
    }
}

/// The compiler's settings from the flags; a bad one is named.
fn config(
    ingress_class: &str,
    (http, https): (u16, u16),
    pool: Option<&str>,
    listener_ports: &str,
) -> Result<podnet_gateway::model::build::Config> {
    Ok(podnet_gateway::model::build::Config {
        ingress_class: ingress_class.to_string(),
        ingress_http_port: http,
        ingress_https_port: https,
        pool: match pool {
            Some(p) => Some(
                podnet_gateway::model::addresses::Pool::parse(p)
                    .map_err(|e| anyhow::anyhow!("address pool {p:?}: {e}"))?,
            ),
            None => None,
        },
        listener_ports: podnet_gateway::model::ports::PortSet::parse(listener_ports)
            .map_err(|e| anyhow::anyhow!("listener ports: {e}"))?,
        ..Default::default()
    })
}

/// The Lease the gateway replicas elect their status writer with.
const LEASE: &str = "podnet-gateway";

/// Runs the gateway until SIGTERM.
pub async fn run(url: &str, a: GatewayArgs) -> Result<()> {
    let metrics = podnet_daemon::Metrics::new();
    let mut election = None;
    let (mut source, writer, kinds) = if a.kube.enabled() {
        let client = a.kube.client().await?;
        let kinds = kube_kinds(&client).await;
        let source = podnet_source::Source::kube(client.clone(), metrics.store_watch("gateway"));
        election = Some(Election::start(
            &client,
            &a.lease_namespace,
            a.id.as_deref(),
        ));
        (source, podnet_gateway::write::kube(client), kinds)
    } else {
        let store = podnet_store::open(url)
            .await
            .with_context(|| format!("opening store {url}"))?;
        let writer = store_writer(podnet_store::objects::Objects::new(store.clone()));
        let source = podnet_source::Source::store(store, metrics.store_watch("gateway"));
        (source, writer, podnet_gateway::KINDS.to_vec())
    };
    let sub = source.subscribe(&kinds);
    let _source = source.start();
    let maddr = podnet_daemon::listen_addr(&a.metrics_addr).map_err(anyhow::Error::msg)?;
    let listener = podnet_daemon::bind(&maddr.to_string())
        .await
        .with_context(|| format!("binding metrics address {maddr}"))?;
    tokio::spawn(podnet_daemon::serve(listener, metrics.clone()));
    let opts = podnet_gateway::run::Options {
        config: config(
            &a.ingress_class,
            (a.ingress_http_port, a.ingress_https_port),
            a.address_pool.as_deref(),
            &a.listener_ports,
        )?,
        address: a.address,
        status_addresses: a.status_address,
        workers: a.workers,
        leader: election.as_ref().map(|e| e.rx.clone()),
    };
    tracing::info!(store = url, metrics = %maddr, "gateway starting");
    let shared = podnet_gateway::proxy::Shared::with_header_timeout(
        a.access_log,
        std::time::Duration::from_secs(a.header_timeout),
    );
    podnet_gateway::run::run(
        opts,
        sub,
        shared,
        Some(writer),
        metrics,
        podnet_daemon::shutdown_signal(),
    )
    .await
    .context("starting the data plane's threads")?;
    if let Some(e) = election {
        e.stop().await;
    }
    tracing::info!("gateway stopped");
    Ok(())
}

/// The campaign for the status writer's Lease (Kubernetes mode).
struct Election {
    rx: tokio::sync::watch::Receiver<Option<tokio::time::Instant>>,
    task: tokio::task::JoinHandle<()>,
    api: kube::Api<podnet_api::k8s_openapi::api::coordination::v1::Lease>,
    cfg: podnet_lease::LeaseConfig,
}

impl Election {
    fn start(client: &kube::Client, namespace: &str, id: Option<&str>) -> Election {
        let id = id.map(String::from).unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            format!("{}-{}", host.trim(), std::process::id())
        });
        tracing::info!(%id, namespace, lease = LEASE, "campaigning to write statuses");
        let cfg = podnet_lease::LeaseConfig::new(namespace, LEASE, &id);
        let api = kube::Api::namespaced(client.clone(), namespace);
        let (tx, rx) = tokio::sync::watch::channel(None);
        let task = tokio::spawn(podnet_lease::campaign(api.clone(), cfg.clone(), tx));
        Election { rx, task, api, cfg }
    }

    /// Stops campaigning and hands the Lease back if held.
    async fn stop(self) {
        self.task.abort();
        if let Err(e) = podnet_lease::release(&self.api, &self.cfg).await {
            tracing::warn!("handing the gateway's lease back: {e}");
        }
    }
}

/// The kinds to watch in a cluster: the Gateway API's only where its
/// CRDs are installed (a cluster without them still gets Ingress).
async fn kube_kinds(client: &kube::Client) -> Vec<Kind> {
    let api: kube::Api<podnet_api::gateway::GatewayClass> = kube::Api::all(client.clone());
    let installed = match api.list(&kube::api::ListParams::default().limit(1)).await {
        Ok(_) => true,
        Err(kube::Error::Api(s)) if s.code == 404 => false,
        // Anything else (forbidden, unreachable) shows up in the watch.
        Err(_) => true,
    };
    if !installed {
        tracing::warn!(
            "the Gateway API CRDs (gateway.networking.k8s.io/v1) are not installed: serving Ingress only; install them and restart to serve Gateways"
        );
    }
    podnet_gateway::KINDS
        .iter()
        .copied()
        .filter(|k| installed || !k.api_version().starts_with(podnet_api::gateway::GROUP))
        .collect()
}

/// The standalone writer: the object's current version with the new
/// status, compare-and-swapped (re-read on a conflict).
fn store_writer(objs: podnet_store::objects::Objects) -> WriteStatus {
    let objs = Arc::new(objs);
    Arc::new(move |o: Object| {
        let objs = objs.clone();
        Box::pin(async move {
            let mut last = String::new();
            for _ in 0..3 {
                let cur = objs
                    .get(o.kind(), o.namespace(), o.name())
                    .await
                    .map_err(|e| e.to_string())?;
                let Some(cur) = cur else { return Ok(()) };
                let mut v = cur.to_value();
                v["status"] = o.to_value()["status"].clone();
                let new = Object::from_value(v).map_err(|e| e.to_string())?;
                match objs.update(new, Vec::new()).await {
                    Ok(_) => return Ok(()),
                    Err(e) => last = e.to_string(),
                }
            }
            Err(format!("writing the status of {}: {last}", o.describe()))
        })
    })
}
