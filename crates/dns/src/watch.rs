//! Keeps the served zone in step with the store: list Namespaces, Services
//! and EndpointSlices, publish the first snapshot (the zone stops answering
//! SERVFAIL), then apply watch events as they come and publish a new
//! snapshot after each batch, so answers follow the store within
//! milliseconds. A compacted watch or a broken stream means a relist into a
//! cleared [`Builder`]: the next snapshot is computed against what is
//! served, so only the names that really changed are rebuilt (flannel's
//! lesson: after a gap, compare a fresh snapshot with the known state).
//! The watch's health is a `podnet_daemon::StoreWatch`: a store that stays
//! away fails `/readyz` (answers keep coming from the last snapshot), and
//! its return brings a relist.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use podnet_api::{Kind, Object};
use podnet_daemon::Metrics;
use podnet_store::{objects::decode, AnyStore, EventType, KeyValue, Store, WatchMsg};

use crate::zone::{Builder, Snapshot};

const UNHEALTHY_AFTER: Duration = Duration::from_secs(30);
const KINDS: [Kind; 3] = [Kind::Namespace, Kind::Service, Kind::EndpointSlice];

/// Namespace and name from a key `/registry/<plural>/[<ns>/]<name>`.
fn key_parts(key: &str, kind: Kind) -> Option<(String, String)> {
    let rest = key.strip_prefix(&kind.prefix(None))?;
    let rest = rest.trim_start_matches('/');
    match rest.split_once('/') {
        Some((ns, name)) => Some((ns.to_string(), name.to_string())),
        None => Some((String::new(), rest.to_string())),
    }
}

/// Applies one store change to the builder; false if DNS does not care.
pub fn observe(b: &mut Builder, typ: EventType, kv: &KeyValue) -> bool {
    let Some(kind) = KINDS
        .into_iter()
        .find(|k| kv.key.starts_with(&k.prefix(None)))
    else {
        return false;
    };
    let Some((ns, name)) = key_parts(&kv.key, kind) else {
        return false;
    };
    if typ == EventType::Delete {
        match kind {
            Kind::Namespace => b.delete_namespace(&name),
            Kind::Service => b.delete_service(&ns, &name),
            _ => b.delete_slice(&ns, &name),
        }
        return true;
    }
    match decode(kv) {
        Ok(Object::Namespace(_)) => b.upsert_namespace(&name),
        Ok(Object::Service(s)) => b.upsert_service(&s),
        Ok(Object::EndpointSlice(s)) => b.upsert_slice(&s),
        Ok(_) => return false,
        Err(e) => {
            tracing::warn!(key = kv.key, "skipping undecodable object: {e}");
            return false;
        }
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

/// Lists everything DNS needs; returns the revision to watch from.
async fn relist(store: &AnyStore, b: &mut Builder) -> podnet_store::Result<i64> {
    let mut rev = i64::MAX;
    b.clear_objects();
    // One kind at a time, so only one kind's raw objects are in memory.
    for k in KINDS {
        let (kvs, r) = store.list(&k.prefix(None)).await?;
        rev = rev.min(r);
        for kv in &kvs {
            observe(b, EventType::Put, kv);
        }
    }
    // Lists at slightly different revisions: watching from the oldest
    // replays a few events onto newer state, which converges (every event
    // carries a whole object).
    Ok(rev)
}

/// Runs until `shutdown`: keeps `zone` equal to the store's view. The
/// watch's health (`component="dns"`) is probed in the background: a store
/// gone for the watch timeout fails `/readyz` (answers keep coming from the
/// last snapshot), and its return brings a relist.
pub async fn run(
    store: AnyStore,
    mut b: Builder,
    zone: Arc<ArcSwap<Snapshot>>,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let health = metrics.store_watch("dns");
    let _probe = health.probe({
        let store = store.clone();
        move || {
            let store = store.clone();
            async move { store.revision().await }
        }
    });
    // When the store has been unreachable this long, /healthz says so
    // (answers keep coming from the last snapshot meanwhile).
    let mut failing_since: Option<Instant> = None;
    loop {
        let rev = tokio::select! {
            _ = &mut shutdown => return,
            r = relist(&store, &mut b) => r,
        };
        let rev = match rev {
            Ok(r) => r,
            Err(e) => {
                health.broken(&format!("listing the store: {e}"));
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() > UNHEALTHY_AFTER {
                    metrics.set_unhealthy(Some(format!(
                        "cannot list the store for {}s: {e}",
                        since.elapsed().as_secs()
                    )));
                }
                tokio::select! {
                    _ = &mut shutdown => return,
                    _ = health.backoff() => {}
                }
                continue;
            }
        };
        failing_since = None;
        metrics.set_unhealthy(None);
        b.take_relist();
        publish(&mut b, &zone, &metrics, true);
        // A full load frees megabytes of decoded objects: hand them back
        // to the system instead of keeping them in malloc's free lists.
        // SAFETY: malloc_trim only releases free heap memory.
        unsafe { libc::malloc_trim(0) };
        if !metrics.is_ready() {
            tracing::info!(
                names = zone.load().name_count(),
                services = b.service_count(),
                "zone loaded; serving"
            );
        }
        metrics.set_ready(true);
        let w = tokio::select! {
            _ = &mut shutdown => return,
            w = store.watch("/registry/", rev + 1) => w,
        };
        let mut w = match w {
            Ok(w) => w,
            Err(e) => {
                health.broken(&format!("watching the store: {e}"));
                tokio::select! {
                    _ = &mut shutdown => return,
                    _ = health.backoff() => {}
                }
                continue;
            }
        };
        health.watching();
        'watch: loop {
            let first = tokio::select! {
                _ = &mut shutdown => return,
                // The store is back after a loss: the old stream may never
                // resume, so relist.
                _ = health.recovered() => break 'watch,
                m = w.next() => m,
            };
            health.event();
            for m in w.with_queued(first) {
                match m {
                    Some(Ok(WatchMsg::Events(_, evs))) => {
                        for ev in evs {
                            observe(&mut b, ev.typ, &ev.kv);
                        }
                    }
                    Some(Ok(WatchMsg::Compacted(_))) => {
                        tracing::info!("watch compacted; relisting");
                        break 'watch;
                    }
                    Some(Err(e)) => {
                        health.broken(&format!("watch: {e}"));
                        break 'watch;
                    }
                    None => {
                        health.broken(&"watch ended");
                        break 'watch;
                    }
                }
            }
            if b.take_relist() {
                tracing::info!("a Service turned headless; relisting for its endpoints");
                break 'watch;
            }
            if b.has_changes() {
                publish(&mut b, &zone, &metrics, false);
            }
        }
        metrics.inc(
            "podnet_dns_relists_total",
            "Full relists of the store.",
            "",
            1.0,
        );
    }
}
