//! Per-route and per-backend counters on the request path: atomics found
//! by a borrowed-key lookup under a read lock (no allocation per
//! request once a route's counters exist), flushed into the daemon's
//! Prometheus registry periodically.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use podnet_daemon::{Counter, Histogram, Metrics, BUCKETS};

use crate::model::{BackendKey, RouteRef};

const REQUESTS: Counter = Counter::new(
    "podnet_gateway_requests_total",
    "Requests answered, by route (kind/namespace/name/rule; none: no route matched) and status class.",
);
const BACKEND_REQUESTS: Counter = Counter::new(
    "podnet_gateway_backend_requests_total",
    "Requests sent to a backend Service port, by status class of the answer.",
);
const SECONDS: Histogram = Histogram::new(
    "podnet_gateway_request_seconds",
    "Time from a request's head to its response head, by route.",
);

/// Status classes counted (1xx-5xx).
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

#[derive(Default)]
struct Counts {
    by_class: [AtomicU64; 5],
    buckets: [AtomicU64; BUCKETS.len() + 1],
    sum_micros: AtomicU64,
}

impl Counts {
    fn add(&self, status: u16, took: Option<Duration>) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.by_class[class].fetch_add(1, Relaxed);
        if let Some(t) = took {
            let secs = t.as_secs_f64();
            let b = BUCKETS
                .iter()
                .position(|b| secs <= *b)
                .unwrap_or(BUCKETS.len());
            self.buckets[b].fetch_add(1, Relaxed);
            self.sum_micros.fetch_add(t.as_micros() as u64, Relaxed);
        }
    }
}

/// A map of counters that grows under a write lock once per key.
struct Family<K>(RwLock<HashMap<K, Arc<Counts>>>);

impl<K: std::hash::Hash + Eq + Clone> Family<K> {
    fn get(&self, k: &K) -> Arc<Counts> {
        if let Some(c) = self.0.read().unwrap_or_else(|p| p.into_inner()).get(k) {
            return c.clone();
        }
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .entry(k.clone())
            .or_default()
            .clone()
    }

    fn all(&self) -> Vec<(K, Arc<Counts>)> {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

impl<K> Default for Family<K> {
    fn default() -> Self {
        Family(RwLock::new(HashMap::new()))
    }
}

/// Counters by route and by backend.
#[derive(Default)]
pub struct Stats {
    routes: Family<RouteRef>,
    backends: Family<BackendKey>,
}

/// The route label of requests no route matched.
fn unmatched() -> RouteRef {
    RouteRef {
        kind: "none",
        namespace: String::new(),
        name: String::new(),
        rule: 0,
    }
}

impl Stats {
    /// Counts one answer for `route` (None: no route matched), and for
    /// the backend that gave it.
    pub fn record(
        &self,
        route: Option<&RouteRef>,
        backend: Option<&BackendKey>,
        status: u16,
        took: Duration,
    ) {
        let counts = match route {
            Some(r) => self.routes.get(r),
            None => self.routes.get(&unmatched()),
        };
        counts.add(status, Some(took));
        if let Some(b) = backend {
            self.backends.get(b).add(status, None);
        }
    }

    /// Moves what was counted since the last flush into `m`.
    pub fn flush(&self, m: &Metrics) {
        for (r, c) in self.routes.all() {
            let route = format!("route=\"{}/{}/{}/{}\"", r.kind, r.namespace, r.name, r.rule);
            flush_classes(m, &REQUESTS, &route, &c);
            let counts: Vec<u64> = c.buckets.iter().map(|b| b.swap(0, Relaxed)).collect();
            if counts.iter().any(|n| *n > 0) {
                let sum = c.sum_micros.swap(0, Relaxed) as f64 / 1e6;
                m.sample_buckets(&SECONDS, &route, &counts, sum);
            }
        }
        for (b, c) in self.backends.all() {
            flush_classes(m, &BACKEND_REQUESTS, &format!("backend=\"{b}\""), &c);
        }
    }
}

fn flush_classes(m: &Metrics, family: &Counter, labels: &str, c: &Counts) {
    for (i, class) in CLASSES.iter().enumerate() {
        let n = c.by_class[i].swap(0, Relaxed);
        if n > 0 {
            m.count(family, &format!("{labels},code=\"{class}\""), n as f64);
        }
    }
}
