//! The gateway's loop: deltas from the object source → the world; a
//! change to an HTTPRoute or Ingress recompiles that object alone (a
//! change to what every route refers to recompiles everything) and swaps
//! the table in; an EndpointSlice change re-resolves its Service's
//! backends only; ports follow the table; statuses that differ are
//! queued and written behind, in their own task, so a slow API never
//! delays routing (and every status is compared again now and then).
//! Of several replicas, the one holding the Lease writes; a new leader
//! compares every status at once.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use podnet_api::Kind;
use podnet_daemon::{Gauge, Histogram, Metrics};
use podnet_source::{Delta, Subscription};
use tokio::sync::watch;

use crate::model::build::compiler::Compiler;
use crate::model::build::part::Source;
use crate::model::build::{endpoints, Config, World};
use crate::model::{BackendKey, Bind, Endpoints};
use crate::proxy::listen::{BindError, Ports};
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
    /// Until when this replica may write statuses (a Lease's leadership:
    /// of several replicas one writes); None: it always may.
    pub leader: Option<watch::Receiver<Option<tokio::time::Instant>>>,
}

impl Options {
    fn leading(&self) -> bool {
        self.leader.as_ref().is_none_or(|rx| {
            rx.borrow()
                .is_some_and(|until| tokio::time::Instant::now() < until)
        })
    }
}

/// Resolves when leadership changes (never without an election).
async fn leadership_changed(rx: &mut Option<watch::Receiver<Option<tokio::time::Instant>>>) {
    match rx {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
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
    let workers = Workers::start(opts.workers)?;
    let queue = Arc::new(write::Queue::default());
    if let Some(w) = writer {
        let o = opts.clone();
        tokio::spawn(write::drain(queue.clone(), w, move || o.leading()));
    }
    let mut leader = opts.leader.clone();
    let mut g = Gateway {
        ports: Ports::new(shared.clone(), workers, opts.address),
        opts,
        world: World::default(),
        compiler: None,
        endpoints: Endpoints::new(),
        shared,
        metrics,
        queue,
        unbound: Vec::new(),
    };
    let mut ready = false;
    // Changes not yet applied (all of them until the first full list).
    let mut dirty = Dirty {
        all: true,
        ..Dirty::default()
    };
    let mut flush = tokio::time::interval(FLUSH);
    let mut ticks = 0u32;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            b = sub.next_batch() => {
                let Some(b) = b else { break };
                absorb(&mut g.world, b.deltas, &mut dirty);
                ready |= b.ready;
                if ready && !dirty.is_empty() {
                    g.apply(std::mem::take(&mut dirty)).await;
                    g.metrics.set_ready(true);
                }
            }
            _ = leadership_changed(&mut leader) => {
                // A new leader compares every status at once.
                g.queue_statuses(None);
            }
            _ = flush.tick() => {
                g.shared.stats.flush(&g.metrics);
                ticks = ticks.wrapping_add(1);
                g.tick(ticks).await;
            }
            _ = &mut shutdown => break,
        }
    }
    g.ports.drain();
    Ok(())
}

const FLUSH: Duration = Duration::from_secs(2);
/// Every this many ticks every status is compared again (a write that
/// failed is retried).
const FULL_STATUS_TICKS: u32 = 15;

/// What deltas changed since the last apply.
#[derive(Default)]
struct Dirty {
    /// Everything: the first list, or a change every route depends on.
    all: bool,
    /// HTTPRoutes and Ingresses added, changed or removed.
    sources: BTreeSet<Source>,
    /// Services whose EndpointSlices changed.
    services: BTreeSet<(String, String)>,
}

impl Dirty {
    fn is_empty(&self) -> bool {
        !self.all && self.sources.is_empty() && self.services.is_empty()
    }
}

/// The loop's state: the objects, the compiled routes, the endpoints
/// served, and the data plane's ports.
struct Gateway {
    opts: Options,
    world: World,
    compiler: Option<Compiler>,
    endpoints: Endpoints,
    shared: Arc<Shared>,
    ports: Ports,
    metrics: Arc<Metrics>,
    queue: Arc<write::Queue>,
    /// Ports that could not be bound.
    unbound: Vec<BindError>,
}

impl Gateway {
    /// Recompiles what changed, swaps the table in, opens its ports,
    /// refreshes the endpoints and queues the statuses that differ.
    async fn apply(&mut self, dirty: Dirty) {
        let t0 = Instant::now();
        // The backends whose endpoints may be wanted or unwanted now
        // (None: all of them).
        let mut backends = None;
        let only = match (&mut self.compiler, dirty.all) {
            (Some(c), false) => {
                backends = Some(c.update(&self.world, &dirty.sources));
                Some(dirty.sources)
            }
            (c, _) => {
                let fresh = match c {
                    Some(c) => c.renew(&self.world),
                    None => Compiler::new(&self.world, &self.opts.config),
                };
                self.compiler = Some(fresh);
                None
            }
        };
        let routes_changed = only.as_ref().is_none_or(|o| !o.is_empty());
        if routes_changed {
            let c = self.compiler.as_ref().expect("compiled above");
            self.shared.set_table(c.table().clone());
            self.metrics
                .sample(&BUILD_SECONDS, "", t0.elapsed().as_secs_f64());
            self.metrics.gauge(&ROUTES, "", c.served() as f64);
            if only.is_none() {
                self.sync_pool();
            }
            let want: BTreeSet<Bind> = c.table().ports.keys().copied().collect();
            self.unbound = self.ports.reconcile(&want).await;
            for e in &self.unbound {
                tracing::warn!("{e}");
            }
        }
        self.sync_endpoints(backends, &dirty.services);
        if routes_changed {
            self.queue_statuses(only.as_ref());
        }
    }

    /// The periodic work: ports that could not be bound are tried again
    /// (another process may have let them go), and now and then every
    /// status is compared again.
    async fn tick(&mut self, ticks: u32) {
        let Some(c) = &self.compiler else { return };
        let retried = !self.unbound.is_empty();
        if retried {
            let want: BTreeSet<Bind> = c.table().ports.keys().copied().collect();
            self.unbound = self.ports.reconcile(&want).await;
        }
        if ticks.is_multiple_of(FULL_STATUS_TICKS) {
            self.queue_statuses(None);
        } else if retried {
            // The Gateways' statuses, which name the ports.
            self.queue_statuses(Some(&BTreeSet::new()));
        }
    }

    /// The Gateways' own addresses on `lo`, when there is a pool.
    fn sync_pool(&self) {
        let (Some(pool), Some(c)) = (&self.opts.config.pool, &self.compiler) else {
            return;
        };
        let own = c
            .statuses(Some(&BTreeSet::new()))
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

    /// Resolves the backends a route change made wanted and those whose
    /// Services' slices changed, forgets those no rule sends to any more;
    /// everything on a full recompile (`touched` None).
    fn sync_endpoints(
        &mut self,
        touched: Option<BTreeSet<BackendKey>>,
        services: &BTreeSet<(String, String)>,
    ) {
        let Some(c) = &self.compiler else { return };
        let Some(touched) = touched else {
            let all: BTreeSet<BackendKey> = c.backends().cloned().collect();
            self.endpoints = endpoints::resolve(&self.world, &all);
            self.shared
                .endpoints
                .store(Arc::new(self.endpoints.clone()));
            return;
        };
        let mut stale = BTreeSet::new();
        let mut changed = false;
        for k in touched {
            match c.sends_to(&k) {
                false => changed |= self.endpoints.remove(&k).is_some(),
                true if !self.endpoints.contains_key(&k) => drop(stale.insert(k)),
                true => {}
            }
        }
        for (ns, name) in services {
            stale.extend(c.backends_of(ns, name).cloned());
        }
        if stale.is_empty() && !changed {
            return;
        }
        self.endpoints
            .extend(endpoints::resolve(&self.world, &stale));
        self.shared
            .endpoints
            .store(Arc::new(self.endpoints.clone()));
    }

    /// Queues the statuses (of Gateways and classes, and of the routes
    /// and Ingresses in `only`; all: None) that differ from the objects'.
    fn queue_statuses(&self, only: Option<&BTreeSet<Source>>) {
        let Some(c) = &self.compiler else { return };
        if !self.opts.leading() {
            return;
        }
        let mut statuses = c.statuses(only);
        for e in &self.unbound {
            statuses.port_unavailable(e.bind, &e.err.to_string());
        }
        let now = podnet_api::k8s_openapi::jiff::Timestamp::now();
        let changed = write::changed(
            &self.world,
            &statuses,
            &self.opts.status_addresses,
            &self.opts.config.controller_name,
            now,
        );
        self.queue.push(changed);
    }
}

/// Applies deltas and notes what they changed. A delta that changed
/// only an object's status (ours, written back) changes nothing.
fn absorb(world: &mut World, deltas: Vec<Delta>, dirty: &mut Dirty) {
    for d in deltas {
        let kind = d.kind();
        let key = d.key();
        let k = (key.namespace.clone().unwrap_or_default(), key.name.clone());
        if kind == Kind::EndpointSlice {
            dirty
                .services
                .extend(slice_service(world.slices.get(&k), &k.0));
        }
        let changed = match d.object() {
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
        if !changed {
            continue;
        }
        match kind {
            Kind::EndpointSlice => dirty
                .services
                .extend(slice_service(world.slices.get(&k), &k.0)),
            Kind::HTTPRoute => drop(dirty.sources.insert(Source::Route(k))),
            Kind::Ingress => drop(dirty.sources.insert(Source::Ingress(k))),
            _ => dirty.all = true,
        }
    }
}

/// The Service a slice belongs to.
fn slice_service(
    s: Option<&podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice>,
    ns: &str,
) -> Option<(String, String)> {
    let svc = podnet_api::endpoints::service_name(s?)?;
    Some((ns.to_string(), svc.to_string()))
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
