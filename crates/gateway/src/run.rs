//! The gateway's loop: deltas from the object source → the world; a
//! change to routes (or what they refer to) recompiles the table and
//! swaps it in, an EndpointSlice change re-resolves only the endpoints;
//! ports follow the table; statuses that differ are written behind, in
//! their own task, so a slow API never delays routing.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use podnet_api::Kind;
use podnet_daemon::{Gauge, Histogram, Metrics};
use podnet_source::{Delta, Subscription};
use tokio::sync::watch;

use crate::model::build::{self, endpoints, Config, World};
use crate::proxy::listen::Ports;
use crate::proxy::workers::Workers;
use crate::proxy::Shared;
use crate::write::{self, WriteStatus};

const BUILD_SECONDS: Histogram = Histogram::new(
    "podnet_gateway_build_seconds",
    "Time to compile the routing table after a change.",
);
const ROUTES: Gauge = Gauge::new("podnet_gateway_routes", "HTTPRoutes and Ingresses served.");

/// How the gateway runs.
#[derive(Clone)]
pub struct Options {
    pub config: Config,
    /// The local address every port binds.
    pub address: IpAddr,
    /// The addresses Gateways' and Ingresses' statuses show.
    pub status_addresses: Vec<String>,
    /// Data-plane threads (0: one per CPU).
    pub workers: usize,
}

/// Runs until `shutdown`; then stops accepting and lets open
/// connections finish.
pub async fn run(
    opts: Options,
    mut sub: Subscription,
    shared: Arc<Shared>,
    writer: Option<WriteStatus>,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let mut world = World::default();
    let workers = Workers::start(opts.workers)?;
    let mut ports = Ports::new(shared.clone(), workers, opts.address);
    let (status_tx, status_rx) = watch::channel(Vec::new());
    if let Some(w) = writer {
        tokio::spawn(writer_task(w, status_rx));
    }
    let mut ready = false;
    // Changes not yet applied (all of them until the first full list).
    let (mut routes_dirty, mut eps_dirty) = (true, true);
    let mut backends = BTreeSet::new();
    let mut unbound = false;
    let mut flush = tokio::time::interval(Duration::from_secs(2));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            b = sub.next_batch() => {
                let Some(b) = b else { break };
                let (r, e) = absorb(&mut world, b.deltas);
                routes_dirty |= r;
                eps_dirty |= e;
                ready |= b.ready;
                if !ready || !(routes_dirty || eps_dirty) {
                    continue;
                }
                if routes_dirty {
                    (backends, unbound) = rebuild(&opts, &world, &shared, &mut ports, &metrics, &status_tx).await;
                }
                shared.endpoints.store(Arc::new(endpoints::resolve(&world, &backends)));
                (routes_dirty, eps_dirty) = (false, false);
                metrics.set_ready(true);
            }
            _ = flush.tick() => {
                shared.stats.flush(&metrics);
                // A port that could not be bound is tried again (another
                // process may have let it go).
                if unbound {
                    (backends, unbound) = rebuild(&opts, &world, &shared, &mut ports, &metrics, &status_tx).await;
                }
            }
            _ = &mut shutdown => break,
        }
    }
    ports.drain();
    Ok(())
}

/// Compiles and swaps the table in, opens its ports, queues statuses;
/// returns the backends it refers to, and whether a port could not be
/// bound.
async fn rebuild(
    opts: &Options,
    world: &World,
    shared: &Shared,
    ports: &mut Ports,
    metrics: &Metrics,
    status_tx: &watch::Sender<Vec<podnet_api::Object>>,
) -> (BTreeSet<crate::model::BackendKey>, bool) {
    let t0 = Instant::now();
    let mut built = build::build(world, &opts.config);
    let want: BTreeSet<crate::model::Bind> = built.table.ports.keys().copied().collect();
    shared.set_table(built.table);
    metrics.sample(&BUILD_SECONDS, "", t0.elapsed().as_secs_f64());
    metrics.gauge(
        &ROUTES,
        "",
        (built.statuses.routes.len() + built.statuses.ingresses.len()) as f64,
    );
    if let Some(pool) = &opts.config.pool {
        let own = built
            .statuses
            .gateways
            .values()
            .filter_map(|g| g.address)
            .collect();
        match crate::local::sync(pool, &own) {
            Ok(c) if c.added.is_empty() && c.removed.is_empty() => {}
            Ok(c) => {
                tracing::info!(added = ?c.added, removed = ?c.removed, "Gateway addresses on lo")
            }
            Err(e) => tracing::warn!("putting the Gateways' addresses on lo: {e}"),
        }
    }
    let unbound = ports.reconcile(&want).await;
    for e in &unbound {
        tracing::warn!("{e}");
        built.statuses.port_unavailable(e.bind, &e.err.to_string());
    }
    let now = podnet_api::k8s_openapi::jiff::Timestamp::now();
    let changed = write::changed(
        world,
        &built.statuses,
        &opts.status_addresses,
        &opts.config.controller_name,
        now,
    );
    if !changed.is_empty() {
        let _ = status_tx.send(changed);
    }
    (built.backends, !unbound.is_empty())
}

/// Applies deltas; returns whether the routes must be recompiled and
/// whether endpoints changed. A delta that changed only an object's
/// status (ours, written back) recompiles nothing.
fn absorb(world: &mut World, deltas: Vec<Delta>) -> (bool, bool) {
    let (mut routes, mut eps) = (false, false);
    for d in deltas {
        let kind = d.kind();
        let key = d.key();
        let dirty = match d.object() {
            Some(o) => {
                let same = same_but_status(world, o);
                world.put(o.clone());
                !same
            }
            None => {
                world.remove(kind, key.namespace.as_deref(), &key.name);
                true
            }
        };
        match kind {
            Kind::EndpointSlice => eps |= dirty,
            _ => routes |= dirty,
        }
    }
    (routes, eps)
}

/// Whether `o` differs from the stored version only in status and
/// resourceVersion.
fn same_but_status(world: &World, o: &podnet_api::Object) -> bool {
    use podnet_api::Object as O;
    let k = (
        o.namespace().unwrap_or_default().to_string(),
        o.name().to_string(),
    );
    match o {
        O::Gateway(n) => eq_but_status(world.gateways.get(&k), n),
        O::HTTPRoute(n) => eq_but_status(world.routes.get(&k), n),
        O::GatewayClass(n) => eq_but_status(world.classes.get(&k.1), n),
        O::Ingress(n) => eq_but_status(world.ingresses.get(&k), n),
        _ => false,
    }
}

fn eq_but_status<T: Clone + PartialEq + ClearStatus>(old: Option<&T>, new: &T) -> bool {
    old.is_some_and(|old| {
        let (mut a, mut b) = (old.clone(), new.clone());
        a.clear();
        b.clear();
        a == b
    })
}

/// Clears what a status write changes.
trait ClearStatus {
    fn clear(&mut self);
}

macro_rules! clear_status {
    ($t:ty) => {
        impl ClearStatus for $t {
            fn clear(&mut self) {
                self.status = None;
                self.metadata.resource_version = None;
                self.metadata.managed_fields = None;
            }
        }
    };
}
clear_status!(podnet_api::gateway::Gateway);
clear_status!(podnet_api::gateway::HTTPRoute);
clear_status!(podnet_api::gateway::GatewayClass);
clear_status!(podnet_api::k8s_openapi::api::networking::v1::Ingress);

/// Writes the latest wanted statuses, one object at a time; a failed
/// write is logged and tried again with the next change.
async fn writer_task(w: WriteStatus, mut rx: watch::Receiver<Vec<podnet_api::Object>>) {
    while rx.changed().await.is_ok() {
        let batch = rx.borrow_and_update().clone();
        for o in batch {
            if let Err(e) = w(o).await {
                tracing::warn!("{e}");
            }
        }
    }
}
