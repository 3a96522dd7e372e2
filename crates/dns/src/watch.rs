//! Keeps the served zone in step with the cluster: one subscription to the
//! object source (Namespaces, Services, EndpointSlices), the first snapshot
//! published once the source's first list is in (the zone stops answering
//! SERVFAIL), then a new snapshot after each batch of deltas, so answers
//! follow the cluster within milliseconds. Gaps in the store's or the API
//! server's watch are the source's business: it relists and delivers only
//! the difference. The one relist DNS asks for itself is a Service turning
//! headless, whose endpoints it did not keep ([`Subscription::resync`]).

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use podnet_api::{Kind, Object};
use podnet_daemon::Metrics;
use podnet_source::{Delta, Subscription};

use crate::zone::{Builder, Snapshot};

/// Applies one delta from the object source to the builder; false if DNS
/// does not care.
pub fn observe(b: &mut Builder, d: &Delta) -> bool {
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
    metrics.observe(
        "podnet_dns_zone_update_seconds",
        "Time to rebuild and publish the zone after a change.",
        mode,
        t.elapsed().as_secs_f64(),
    );
    metrics.inc(
        "podnet_dns_zone_updates_total",
        "Zone snapshots published.",
        mode,
        1.0,
    );
    metrics.set(
        "podnet_dns_zone_names",
        "Names in the cluster zone.",
        "",
        names as f64,
    );
    metrics.set(
        "podnet_dns_services",
        "Services known to DNS.",
        "",
        b.service_count() as f64,
    );
}

/// The kinds DNS subscribes to.
pub const KINDS: [Kind; 3] = [Kind::Namespace, Kind::Service, Kind::EndpointSlice];

/// Runs until `shutdown`: keeps `zone` equal to the object source's view.
/// The first snapshot is published once the source's first list is in
/// (until then the zone answers SERVFAIL); then every batch of deltas
/// publishes a new one. A lost store or API server fails `/readyz` through
/// the source's health while answers keep coming from the last snapshot.
pub async fn run(
    mut sub: Subscription,
    mut b: Builder,
    zone: Arc<ArcSwap<Snapshot>>,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut ready = false;
    loop {
        let batch = tokio::select! {
            _ = &mut shutdown => return,
            b = sub.next_batch() => b,
        };
        let Some(batch) = batch else {
            metrics.set_unhealthy(Some("the object source stopped".into()));
            return;
        };
        let mut full = false;
        if let Some(objs) = &batch.snapshot {
            // The resync asked for below: everything, from scratch.
            b.clear_objects();
            for o in objs {
                observe(&mut b, &Delta::Updated(o.clone()));
            }
            full = true;
            metrics.inc(
                "podnet_dns_relists_total",
                "Full relists of the store.",
                "",
                1.0,
            );
        }
        for d in &batch.deltas {
            observe(&mut b, d);
        }
        if batch.ready && !ready {
            ready = true;
            full = true;
        }
        if !ready {
            continue;
        }
        if b.take_relist() {
            tracing::info!("a Service turned headless; relisting for its endpoints");
            sub.resync();
        }
        if full || b.has_changes() {
            publish(&mut b, &zone, &metrics, full);
        }
        if full {
            // A full load frees megabytes of decoded objects: hand them
            // back to the system instead of keeping them in malloc's free
            // lists.
            // SAFETY: malloc_trim only releases free heap memory.
            unsafe { libc::malloc_trim(0) };
        }
        if full && !metrics.is_ready() {
            tracing::info!(
                names = zone.load().name_count(),
                services = b.service_count(),
                "zone loaded; serving"
            );
            metrics.set_ready(true);
        }
    }
}
