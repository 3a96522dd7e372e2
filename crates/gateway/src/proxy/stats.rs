//! Per-route and per-backend counters on the request path: atomics, no
//! lock per request once a route's counters exist; flushed into the
//! daemon's Prometheus registry periodically.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use podnet_daemon::{Counter, Histogram, Metrics, BUCKETS};

use crate::model::RouteRef;

const REQUESTS: Counter = Counter::new(
    "podnet_gateway_requests_total",
    "Requests answered, by route (kind/namespace/name), backend Service and status class.",
);
const SECONDS: Histogram = Histogram::new(
    "podnet_gateway_request_seconds",
    "Time from a request's head to its response head, by route.",
);

/// Status classes counted (1xx-5xx).
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

#[derive(Default)]
struct RouteStats {
    by_class: [AtomicU64; 5],
    buckets: [AtomicU64; BUCKETS.len() + 1],
    sum_micros: AtomicU64,
}

/// Counters by (route, backend) label set.
#[derive(Default)]
pub struct Stats {
    routes: RwLock<HashMap<(RouteRef, String), Arc<RouteStats>>>,
}

impl Stats {
    /// Counts one answer for `route` (None: no route matched) from
    /// `backend` ("" when none was tried).
    pub fn record(&self, route: Option<&RouteRef>, backend: &str, status: u16, took: Duration) {
        let key = match route {
            Some(r) => (r.clone(), backend.to_string()),
            None => (
                RouteRef {
                    kind: "none",
                    namespace: String::new(),
                    name: String::new(),
                    rule: 0,
                },
                String::new(),
            ),
        };
        let s = self
            .routes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned();
        let s = s.unwrap_or_else(|| {
            self.routes
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .entry(key)
                .or_default()
                .clone()
        });
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        s.by_class[class].fetch_add(1, Relaxed);
        let secs = took.as_secs_f64();
        let b = BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(BUCKETS.len());
        s.buckets[b].fetch_add(1, Relaxed);
        s.sum_micros.fetch_add(took.as_micros() as u64, Relaxed);
    }

    /// Moves what was counted since the last flush into `m`.
    pub fn flush(&self, m: &Metrics) {
        let all: Vec<_> = self
            .routes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for ((r, backend), s) in all {
            let route = format!("{}/{}/{}", r.kind, r.namespace, r.name);
            for (i, c) in CLASSES.iter().enumerate() {
                let n = s.by_class[i].swap(0, Relaxed);
                if n > 0 {
                    m.count(
                        &REQUESTS,
                        &format!("route=\"{route}\",backend=\"{backend}\",code=\"{c}\""),
                        n as f64,
                    );
                }
            }
            let counts: Vec<u64> = s.buckets.iter().map(|b| b.swap(0, Relaxed)).collect();
            if counts.iter().any(|c| *c > 0) {
                let sum = s.sum_micros.swap(0, Relaxed) as f64 / 1e6;
                m.sample_buckets(&SECONDS, &format!("route=\"{route}\""), &counts, sum);
            }
        }
    }
}
