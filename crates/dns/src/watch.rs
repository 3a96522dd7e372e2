//! Keeps the served zone in step with the cluster: one subscription to the
//! object source (Namespaces, Services, EndpointSlices), the first snapshot
//! published once the source's first list is in (the zone stops answering
//! SERVFAIL), then a new snapshot after each batch of deltas, so answers
//! follow the cluster within milliseconds. Gaps in the store's or the API
//! server's watch are the source's business: it relists and delivers only
//! the difference. The one relist DNS asks for itself is a Service turning
//! headless, whose endpoints it did not keep ([`Subscription::resync`]).
//! The zone is a subsystem of the one reconcile loop ([`Zone`]), like the
//! overlay and the proxy: the loop coalesces bursts and publishes nothing
//! before the source's first complete list.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use podnet_api::{Kind, Object};
use podnet_daemon::Metrics;
use podnet_reconcile::{Feed, Scope, Subsystem, SyncError};
use podnet_source::{Delta, Resyncer, Subscription};

use crate::zone::{Builder, Snapshot};

const DNS_RELISTS_TOTAL: podnet_daemon::Counter =
    podnet_daemon::Counter::new("podnet_dns_relists_total", "Full relists of the store.");
const DNS_SERVICES: podnet_daemon::Gauge =
    podnet_daemon::Gauge::new("podnet_dns_services", "Services known to DNS.");
const DNS_ZONE_NAMES: podnet_daemon::Gauge =
    podnet_daemon::Gauge::new("podnet_dns_zone_names", "Names in the cluster zone.");
const DNS_ZONE_UPDATES_TOTAL: podnet_daemon::Counter =
    podnet_daemon::Counter::new("podnet_dns_zone_updates_total", "Zone snapshots published.");
const DNS_ZONE_UPDATE_SECONDS: podnet_daemon::Histogram = podnet_daemon::Histogram::new(
    "podnet_dns_zone_update_seconds",
    "Time to rebuild and publish the zone after a change.",
);

/// Applies one delta from the object source to the builder; false if DNS
/// does not care.
pub fn apply_delta(b: &mut Builder, d: &Delta) -> bool {
    let key = d.key();
    let ns = key.namespace.as_deref().unwrap_or_default();
    match (key.kind, d.object()) {
        (Kind::Namespace, None) => b.delete_namespace(&key.name),
        (Kind::Service, None) => b.delete_service(ns, &key.name),
        (Kind::EndpointSlice, None) => b.delete_slice(ns, &key.name),
        (_, Some(Object::Namespace(_))) => b.upsert_namespace(&key.name),
        (_, Some(Object::Service(s))) => b.upsert_service(s),
        (_, Some(Object::EndpointSlice(s))) => b.upsert_slice(s),
        _ => return false,
    }
    true
}

fn publish(b: &mut Builder, zone: &ArcSwap<Snapshot>, metrics: &Metrics, full: bool) {
    let t = Instant::now();
    let s = b.publish(true);
    let names = s.name_count();
    zone.store(s);
    let mode = if full {
        "mode=\"full\""
    } else {
        "mode=\"incremental\""
    };
    metrics.sample(&DNS_ZONE_UPDATE_SECONDS, mode, t.elapsed().as_secs_f64());
    metrics.count(&DNS_ZONE_UPDATES_TOTAL, mode, 1.0);
    metrics.gauge(&DNS_ZONE_NAMES, "", names as f64);
    metrics.gauge(&DNS_SERVICES, "", b.service_count() as f64);
}

/// The kinds DNS subscribes to.
pub const KINDS: [Kind; 3] = [Kind::Namespace, Kind::Service, Kind::EndpointSlice];

/// What feeds the zone's loop.
pub enum ZoneInput {
    Deltas(Vec<Delta>),
    /// Everything, asked for with a resync: rebuild from scratch.
    Snapshot(Vec<Arc<Object>>),
}

/// The cluster zone as a reconcile subsystem. DNS owns no kernel state:
/// its "kernel" is the snapshot the servers answer from, swapped
/// atomically. The [`Builder`] keeps the plan incrementally (the names
/// pending since the last publish), so:
/// - watch: deltas into the builder (a Service turning headless asks the
///   source for a snapshot, since its endpoints were not kept);
/// - plan: which names are pending (pure);
/// - observe: the snapshot being served;
/// - diff: whether anything must be republished;
/// - apply: publish the new snapshot (one atomic swap).
pub struct Zone {
    b: Builder,
    zone: Arc<ArcSwap<Snapshot>>,
    metrics: Arc<Metrics>,
    resyncer: Resyncer,
    /// A snapshot rebuilt the builder since the last publish.
    rebuilt: bool,
}

impl Subsystem for Zone {
    type Input = ZoneInput;
    type Key = ();
    /// Whether the builder has pending names.
    type Plan = bool;
    type Observed = Arc<Snapshot>;
    type Changes = bool;

    fn name(&self) -> &'static str {
        "dns"
    }

    fn watch(&mut self, input: ZoneInput, dirty: &mut BTreeSet<()>) {
        match input {
            ZoneInput::Snapshot(objs) => {
                self.b.clear_objects();
                for o in objs {
                    apply_delta(&mut self.b, &Delta::Updated(o));
                }
                self.rebuilt = true;
                self.metrics.count(&DNS_RELISTS_TOTAL, "", 1.0);
            }
            ZoneInput::Deltas(ds) => {
                for d in &ds {
                    apply_delta(&mut self.b, d);
                }
            }
        }
        if self.b.take_relist() {
            tracing::info!("a Service turned headless; relisting for its endpoints");
            self.resyncer.resync();
        }
        dirty.insert(());
    }

    fn plan(&self, scope: &Scope<()>) -> bool {
        scope.is_full() || self.rebuilt || self.b.has_changes()
    }

    fn observe(&mut self, _scope: &Scope<()>) -> Result<Arc<Snapshot>, SyncError> {
        Ok(self.zone.load_full())
    }

    fn diff(&self, plan: bool, _served: Arc<Snapshot>) -> bool {
        plan
    }

    fn apply(&mut self, publish_now: bool) -> Result<usize, SyncError> {
        if !publish_now {
            return Ok(0);
        }
        let full = std::mem::take(&mut self.rebuilt) || !self.metrics.is_ready();
        publish(&mut self.b, &self.zone, &self.metrics, full);
        Ok(1)
    }

    /// No kernel to drift: a resync changes nothing.
    fn resync(&self) -> Scope<()> {
        Scope::Only(BTreeSet::new())
    }

    fn synced(&mut self, scope: &Scope<()>, ok: bool) {
        if !ok || !scope.is_full() {
            return;
        }
        // A full load frees megabytes of decoded objects: hand them back
        // to the system instead of keeping them in malloc's free lists.
        // (glibc only: musl's malloc returns memory by itself.)
        // SAFETY: malloc_trim only releases free heap memory.
        #[cfg(target_env = "gnu")]
        unsafe {
            libc::malloc_trim(0)
        };
        if !self.metrics.is_ready() {
            tracing::info!(
                names = self.zone.load().name_count(),
                services = self.b.service_count(),
                "zone loaded; serving"
            );
            self.metrics.set_ready(true);
        }
    }
}

/// Runs until `shutdown`: keeps `zone` equal to the object source's view,
/// as a [`Zone`] in the reconcile loop. The first snapshot is published
/// once the source's first list is in (until then the zone answers
/// SERVFAIL); then every batch of deltas publishes a new one. A lost store
/// or API server fails `/readyz` through the source's health while answers
/// keep coming from the last snapshot.
pub async fn run(
    sub: Subscription,
    b: Builder,
    zone: Arc<ArcSwap<Snapshot>>,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let z = Zone {
        b,
        zone,
        metrics: metrics.clone(),
        resyncer: sub.resyncer(),
        rebuilt: false,
    };
    let (tx, rx) = podnet_reconcile::channel();
    let forward = tokio::spawn(podnet_reconcile::forward(sub, tx, |f| {
        Some(match f {
            Feed::Snapshot(objs) => ZoneInput::Snapshot(objs),
            Feed::Deltas(d) => ZoneInput::Deltas(d),
        })
    }));
    // Resync period: DNS has nothing to repair; a long one.
    let opts = podnet_reconcile::Options::new(Duration::from_secs(3600));
    podnet_reconcile::run(z, rx, opts, metrics, shutdown).await;
    forward.abort();
}
