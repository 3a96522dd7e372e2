//! What every podnet daemon shares: a Prometheus `/metrics` endpoint,
//! `/healthz` and `/readyz`, and SIGTERM/SIGINT handling.
//!
//! The HTTP side is deliberately tiny (one request per connection, GET only):
//! it serves scrapes and probes, nothing else, so it needs no HTTP stack.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
}

/// Upper bounds (seconds) of histogram buckets: 50 µs to 10 s, fine enough
/// to tell a millisecond sync or a sub-millisecond DNS answer from a slow one.
pub const BUCKETS: [f64; 16] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 10.0,
];

#[derive(Default, Clone)]
struct Hist {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

struct Family {
    help: &'static str,
    typ: MetricType,
    values: BTreeMap<String, f64>,
    hists: BTreeMap<String, Hist>,
}

/// A small metrics registry: families of counters, gauges and histograms
/// with labels.
#[derive(Default)]
pub struct Metrics {
    families: Mutex<BTreeMap<&'static str, Family>>,
    ready: AtomicBool,
    unhealthy: Mutex<Option<String>>,
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        Arc::new(Metrics::default())
    }

    fn with(
        &self,
        name: &'static str,
        help: &'static str,
        typ: MetricType,
        labels: &str,
        f: impl FnOnce(&mut f64),
    ) {
        let mut fams = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let fam = fams.entry(name).or_insert_with(|| Family {
            help,
            typ,
            values: BTreeMap::new(),
            hists: BTreeMap::new(),
        });
        f(fam.values.entry(labels.to_string()).or_insert(0.0));
    }

    /// Records one observation (in seconds) in a histogram.
    pub fn observe(&self, name: &'static str, help: &'static str, labels: &str, secs: f64) {
        let mut counts = [0u64; BUCKETS.len() + 1];
        counts[BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(BUCKETS.len())] = 1;
        self.observe_buckets(name, help, labels, &counts, secs);
    }

    /// Adds pre-aggregated observations to a histogram: `counts[i]` values
    /// fell in bucket `i` (`counts[BUCKETS.len()]`, if given, above the last),
    /// summing to `sum` seconds. For hot paths that count locally (DNS) and
    /// cannot take a lock per observation.
    pub fn observe_buckets(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &str,
        counts: &[u64],
        sum: f64,
    ) {
        let mut fams = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let fam = fams.entry(name).or_insert_with(|| Family {
            help,
            typ: MetricType::Histogram,
            values: BTreeMap::new(),
            hists: BTreeMap::new(),
        });
        let h = fam.hists.entry(labels.to_string()).or_default();
        for (i, c) in counts.iter().enumerate() {
            if let Some(slot) = h.counts.get_mut(i) {
                *slot += c;
            }
            h.count += c;
        }
        h.sum += sum;
    }

    /// Marks the daemon unhealthy (with the reason `/healthz` shows) or
    /// healthy again (`None`).
    pub fn set_unhealthy(&self, why: Option<String>) {
        *self.unhealthy.lock().unwrap_or_else(|p| p.into_inner()) = why;
    }

    /// Why `/healthz` fails, if it does.
    pub fn unhealthy(&self) -> Option<String> {
        self.unhealthy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Adds to a counter; `labels` is Prometheus label text like `kind="svc"`.
    pub fn inc(&self, name: &'static str, help: &'static str, labels: &str, by: f64) {
        self.with(name, help, MetricType::Counter, labels, |v| *v += by);
    }

    pub fn set(&self, name: &'static str, help: &'static str, labels: &str, to: f64) {
        self.with(name, help, MetricType::Gauge, labels, |v| *v = to);
    }

    pub fn set_ready(&self, r: bool) {
        self.ready.store(r, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition format.
    pub fn render(&self) -> String {
        let fams = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        for (name, f) in fams.iter() {
            let t = match f.typ {
                MetricType::Counter => "counter",
                MetricType::Gauge => "gauge",
                MetricType::Histogram => "histogram",
            };
            out.push_str(&format!("# HELP {name} {}\n# TYPE {name} {t}\n", f.help));
            for (labels, h) in &f.hists {
                let sep = if labels.is_empty() { "" } else { "," };
                let mut cum = 0;
                for (b, c) in BUCKETS.iter().zip(h.counts.iter()) {
                    cum += c;
                    out.push_str(&format!("{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cum}\n"));
                }
                out.push_str(&format!(
                    "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}\n",
                    h.count
                ));
                let braces = if labels.is_empty() {
                    String::new()
                } else {
                    format!("{{{labels}}}")
                };
                out.push_str(&format!("{name}_sum{braces} {}\n", h.sum));
                out.push_str(&format!("{name}_count{braces} {}\n", h.count));
            }
            for (labels, v) in &f.values {
                if labels.is_empty() {
                    out.push_str(&format!("{name} {v}\n"));
                } else {
                    out.push_str(&format!("{name}{{{labels}}} {v}\n"));
                }
            }
        }
        out
    }
}

/// Binds the metrics/health listener (so callers learn the port at once).
pub async fn bind(addr: &str) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves /metrics, /healthz and /readyz until the listener is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            continue;
        };
        let m = metrics.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            let n = match tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut buf))
                .await
            {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let req = String::from_utf8_lossy(&buf[..n]);
            let path = req.split_whitespace().nth(1).unwrap_or("/");
            let (code, ctype, body) = match path {
                "/metrics" => (200, "text/plain; version=0.0.4", m.render()),
                "/healthz" | "/livez" => match m.unhealthy() {
                    None => (200, "text/plain", "ok\n".to_string()),
                    Some(why) => (503, "text/plain", format!("unhealthy: {why}\n")),
                },
                "/readyz" if m.is_ready() => (200, "text/plain", "ok\n".to_string()),
                "/readyz" => (503, "text/plain", "not ready\n".to_string()),
                _ => (404, "text/plain", "not found\n".to_string()),
            };
            let reason = match code {
                200 => "OK",
                503 => "Service Unavailable",
                _ => "Not Found",
            };
            let resp = format!(
                "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(resp.as_bytes()).await;
        });
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}

/// Parses a listen address, accepting ":9090" for all interfaces.
pub fn listen_addr(s: &str) -> Result<SocketAddr, String> {
    let s = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_string()
    };
    s.parse()
        .map_err(|_| format!("invalid listen address {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text() {
        let m = Metrics::new();
        m.inc("podnet_syncs_total", "Syncs run.", "", 1.0);
        m.inc("podnet_syncs_total", "Syncs run.", "", 2.0);
        m.set(
            "podnet_services",
            "Services known.",
            "type=\"ClusterIP\"",
            5.0,
        );
        let t = m.render();
        assert!(
            t.contains("# TYPE podnet_syncs_total counter\npodnet_syncs_total 3\n"),
            "{t}"
        );
        assert!(t.contains("podnet_services{type=\"ClusterIP\"} 5"), "{t}");
        m.observe("podnet_sync_seconds", "Sync time.", "mode=\"full\"", 0.003);
        m.observe("podnet_sync_seconds", "Sync time.", "mode=\"full\"", 20.0);
        let t = m.render();
        assert!(t.contains("# TYPE podnet_sync_seconds histogram"), "{t}");
        assert!(
            t.contains("podnet_sync_seconds_bucket{mode=\"full\",le=\"0.0025\"} 0\n"),
            "{t}"
        );
        assert!(
            t.contains("podnet_sync_seconds_bucket{mode=\"full\",le=\"0.005\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("podnet_sync_seconds_bucket{mode=\"full\",le=\"+Inf\"} 2\n"),
            "{t}"
        );
        assert!(
            t.contains("podnet_sync_seconds_count{mode=\"full\"} 2\n"),
            "{t}"
        );
    }
}
