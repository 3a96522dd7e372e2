//! What every podnet daemon shares: a Prometheus `/metrics` endpoint,
//! `/healthz` and `/readyz`, SIGTERM/SIGINT handling, and the health of the
//! daemons' store watches ([`StoreWatch`]).
//!
//! The HTTP side is deliberately tiny (one request per connection, GET only):
//! it serves scrapes and probes, nothing else, so it needs no HTTP stack.
//!
//! A store watch can go quiet without an error (an etcd stream waits
//! forever for a dead server), so every watch loop pairs its watch with an
//! active probe ([`StoreWatch::probe`]): a cheap store request at a fifth of
//! the [watch timeout](watch_timeout). When neither the probe nor the watch
//! has reached the store for the timeout (or the loop's lists keep failing
//! that long), the watch is *lost*: one warning, `/readyz` fails with the
//! reason, and `podnet_store_watch_up` drops to 0. Retries log at debug.
//! When the store answers again the loop relists ([`StoreWatch::recovered`]),
//! and once its new watch runs ([`StoreWatch::watching`]) one info line says
//! so and `/readyz` passes again.
//!
//! The other end, a blocking GET of such endpoints for tools and tests,
//! is [`client`] ([`HttpGet`]).

pub mod stop;

pub use stop::StopOnDrop;

use std::collections::BTreeMap;
use std::fmt::Display;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

pub mod client;
pub use client::{HttpError, HttpGet, Response};

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

/// A counter family, declared once (name and help) beside the code that
/// counts: a call site names the family, never its text, and can only add.
#[derive(Debug, Clone, Copy)]
pub struct Counter {
    pub name: &'static str,
    pub help: &'static str,
}

/// A gauge family: a value that is set.
#[derive(Debug, Clone, Copy)]
pub struct Gauge {
    pub name: &'static str,
    pub help: &'static str,
}

/// A histogram family of durations in seconds ([`BUCKETS`]).
#[derive(Debug, Clone, Copy)]
pub struct Histogram {
    pub name: &'static str,
    pub help: &'static str,
}

impl Counter {
    pub const fn new(name: &'static str, help: &'static str) -> Counter {
        Counter { name, help }
    }
}

impl Gauge {
    pub const fn new(name: &'static str, help: &'static str) -> Gauge {
        Gauge { name, help }
    }
}

impl Histogram {
    pub const fn new(name: &'static str, help: &'static str) -> Histogram {
        Histogram { name, help }
    }
}

const STORE_WATCH_UP: Gauge = Gauge::new(
    "podnet_store_watch_up",
    "1 while the component's store watch follows the store; 0 before its first list and after it lost the store for the watch timeout.",
);
const STORE_WATCH_LOST_SECONDS: Gauge = Gauge::new(
    "podnet_store_watch_lost_seconds",
    "Seconds since a lost store watch last reached the store (0 while up).",
);

/// A small metrics registry: families of counters, gauges and histograms
/// with labels.
#[derive(Default)]
pub struct Metrics {
    families: Mutex<BTreeMap<&'static str, Family>>,
    ready: AtomicBool,
    /// Why `/healthz` fails, per component (`""` for the daemon itself).
    unhealthy: Mutex<BTreeMap<&'static str, String>>,
    watches: Mutex<BTreeMap<&'static str, Arc<WatchState>>>,
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

    /// Records one sample (in seconds) in a histogram.
    pub fn sample(&self, h: &Histogram, labels: &str, secs: f64) {
        let mut counts = [0u64; BUCKETS.len() + 1];
        counts[BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(BUCKETS.len())] = 1;
        self.sample_buckets(h, labels, &counts, secs);
    }

    /// Adds pre-aggregated samples to a histogram: `counts[i]` values fell
    /// in bucket `i` (`counts[BUCKETS.len()]`, if given, above the last),
    /// summing to `sum` seconds. For hot paths that count locally (DNS) and
    /// cannot take a lock per sample.
    pub fn sample_buckets(&self, h: &Histogram, labels: &str, counts: &[u64], sum: f64) {
        let mut fams = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let fam = fams.entry(h.name).or_insert_with(|| Family {
            help: h.help,
            typ: MetricType::Histogram,
            values: BTreeMap::new(),
            hists: BTreeMap::new(),
        });
        let hist = fam.hists.entry(labels.to_string()).or_default();
        for (i, c) in counts.iter().enumerate() {
            if let Some(slot) = hist.counts.get_mut(i) {
                *slot += c;
            }
            hist.count += c;
        }
        hist.sum += sum;
    }

    /// Marks the daemon unhealthy (with the reason `/healthz` shows) or
    /// healthy again (`None`).
    pub fn set_unhealthy(&self, why: Option<String>) {
        self.set_unhealthy_for("", why);
    }

    /// Like [`Metrics::set_unhealthy`] for one component of the daemon, so
    /// two loops never overwrite each other's reason.
    pub fn set_unhealthy_for(&self, component: &'static str, why: Option<String>) {
        let mut u = self.unhealthy.lock().unwrap_or_else(|p| p.into_inner());
        match why {
            Some(w) => u.insert(component, w),
            None => u.remove(component),
        };
    }

    /// Why `/healthz` fails, if it does (every component's reason).
    pub fn unhealthy(&self) -> Option<String> {
        let u = self.unhealthy.lock().unwrap_or_else(|p| p.into_inner());
        if u.is_empty() {
            return None;
        }
        Some(u.values().cloned().collect::<Vec<_>>().join("; "))
    }

    /// Adds to a counter; `labels` is Prometheus label text like `kind="svc"`.
    pub fn count(&self, c: &Counter, labels: &str, by: f64) {
        self.with(c.name, c.help, MetricType::Counter, labels, |v| *v += by);
    }

    /// Sets a gauge.
    pub fn gauge(&self, g: &Gauge, labels: &str, to: f64) {
        self.with(g.name, g.help, MetricType::Gauge, labels, |v| *v = to);
    }

    pub fn set_ready(&self, r: bool) {
        self.ready.store(r, Ordering::Relaxed);
    }

    /// The daemon's own readiness flag (its first full load is done); see
    /// [`Metrics::readiness`] for what `/readyz` answers.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// What `/readyz` answers: ready once the daemon says so, unless one
    /// of its store watches is lost (then the reasons, one per watch).
    pub fn readiness(&self) -> Result<(), String> {
        let lost: Vec<String> = self
            .watch_states()
            .iter()
            .filter_map(|w| w.lost_reason())
            .collect();
        if !lost.is_empty() {
            return Err(lost.join("; "));
        }
        if !self.is_ready() {
            return Err("not ready".into());
        }
        Ok(())
    }

    /// The health of one loop's store watch, `component` naming the loop
    /// (`controller`, `dns`, `proxy`, `overlay`) in logs, `/readyz` and the
    /// `podnet_store_watch_*` metrics. Uses [`watch_timeout`]. Asking again
    /// for the same component (a loop restarting) returns the same state,
    /// with its failures forgotten (it starts over with a list).
    pub fn store_watch(&self, component: &'static str) -> StoreWatch {
        self.store_watch_with(component, watch_timeout())
    }

    /// [`Metrics::store_watch`] with an explicit timeout.
    pub fn store_watch_with(&self, component: &'static str, timeout: Duration) -> StoreWatch {
        let mut ws = self.watches.lock().unwrap_or_else(|p| p.into_inner());
        let st = ws
            .entry(component)
            .or_insert_with(|| Arc::new(WatchState::new(component, timeout)))
            .clone();
        st.lock().failing = false;
        StoreWatch { st }
    }

    fn watch_states(&self) -> Vec<Arc<WatchState>> {
        let ws = self.watches.lock().unwrap_or_else(|p| p.into_inner());
        ws.values().cloned().collect()
    }

    /// The Prometheus text exposition format.
    pub fn render(&self) -> String {
        for w in self.watch_states() {
            let labels = format!("component=\"{}\"", w.component);
            let (up, lost_secs, losses) = w.gauges();
            self.gauge(&STORE_WATCH_UP, &labels, up);
            self.gauge(&STORE_WATCH_LOST_SECONDS, &labels, lost_secs);
            self.with(
                "podnet_store_watch_losses_total",
                "Times the component's store watch was declared lost.",
                MetricType::Counter,
                &labels,
                |v| *v = losses,
            );
        }
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
///
/// An address in use is tried again for a few seconds: a daemon restarted
/// at once (a supervisor, `lab restart-agent`) may start while its killed
/// predecessor's sockets are still being closed.
pub async fn bind(addr: &str) -> std::io::Result<TcpListener> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match TcpListener::bind(addr).await {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            r => return r,
        }
    }
}

/// A daemon's own pages beside the standard ones: given the request's
/// path (with its query), a status, a content type and a body; None for a
/// path it does not serve.
pub type Pages = Arc<dyn Fn(&str) -> Option<(u16, &'static str, String)> + Send + Sync>;

/// Serves /metrics, /healthz and /readyz until the listener is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    serve_with(listener, metrics, None).await
}

/// [`serve`], with `pages` for any other path (the agent's `/flows`).
pub async fn serve_with(listener: TcpListener, metrics: Arc<Metrics>, pages: Option<Pages>) {
    let all: Pages = Arc::new(move |path: &str| {
        Some(match path {
            "/metrics" => (200, "text/plain; version=0.0.4", metrics.render()),
            "/healthz" | "/livez" => match metrics.unhealthy() {
                None => (200, "text/plain", "ok\n".to_string()),
                Some(why) => (503, "text/plain", format!("unhealthy: {why}\n")),
            },
            "/readyz" => match metrics.readiness() {
                Ok(()) => (200, "text/plain", "ok\n".to_string()),
                Err(why) => (503, "text/plain", format!("{why}\n")),
            },
            other => return pages.as_ref().and_then(|p| p(other)),
        })
    });
    serve_pages(listener, all).await
}

/// Most connections a page server holds at once. The proxy's `/healthz`
/// listens on every address (kube-proxy's :10256), so a pod can open
/// connections and send nothing: each is held at most [`ANSWER_TIME`], and
/// past this many a new one is closed at once, so a flood costs a bounded
/// number of sockets and tasks while probes keep being answered as the
/// flood's connections time out.
pub const MAX_CONNECTIONS: usize = 64;
/// How long one connection may take to send its request and read the
/// answer.
pub const ANSWER_TIME: Duration = Duration::from_secs(5);

/// Answers every request on `listener` with `pages` (404 for a path it
/// does not serve), one request per connection, until the listener is
/// dropped: the HTTP of the metrics endpoint and of any other small status
/// endpoint (the proxy's `/healthz` on :10256).
pub async fn serve_pages(listener: TcpListener, pages: Pages) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((s, _)) = listener.accept().await else {
            continue;
        };
        // Full: the connection is dropped (closed) unanswered.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let pages = pages.clone();
        tokio::spawn(async move {
            answer(s, pages).await;
            drop(slot);
        });
    }
}

/// Reads one request's head and writes the page's answer, all within
/// [`ANSWER_TIME`].
async fn answer(mut s: tokio::net::TcpStream, pages: Pages) {
    // The request line may arrive in pieces: read up to the end of the
    // headers (or 2 KiB).
    let mut buf = vec![0u8; 2048];
    let mut n = 0;
    let deadline = tokio::time::Instant::now() + ANSWER_TIME;
    while n < buf.len() && !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout_at(deadline, s.read(&mut buf[n..])).await {
            Ok(Ok(0)) => break,
            Ok(Ok(k)) => n += k,
            _ => return,
        }
    }
    let req = String::from_utf8_lossy(&buf[..n]);
    let path = req.split_whitespace().nth(1).unwrap_or("/");
    let (code, ctype, body) = pages(path).unwrap_or((404, "text/plain", "not found\n".to_string()));
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        503 => "Service Unavailable",
        _ => "Not Found",
    };
    let resp = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nX-Content-Type-Options: nosniff\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout_at(deadline, s.write_all(resp.as_bytes())).await;
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

/// How long a store watch may go without reaching the store before it is
/// declared lost (`/readyz` fails), unless [`set_watch_timeout`] or
/// [`WATCH_TIMEOUT_ENV`] says otherwise. Long enough to ride out an etcd
/// leader election, short enough that a dead store shows within seconds.
pub const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment variable that sets the watch timeout, e.g. `10`, `2.5s`
/// or `500ms` (see [`parse_duration`]).
pub const WATCH_TIMEOUT_ENV: &str = "PODNET_WATCH_TIMEOUT";

/// Set by a `--watch-timeout` flag, in milliseconds; 0: not set.
static WATCH_TIMEOUT_MS: AtomicU64 = AtomicU64::new(0);

/// Sets the watch timeout for every [`Metrics::store_watch`] made after it
/// (for a command-line flag; beats [`WATCH_TIMEOUT_ENV`]).
pub fn set_watch_timeout(d: Duration) {
    WATCH_TIMEOUT_MS.store((d.as_millis() as u64).max(1), Ordering::Relaxed);
}

/// The watch timeout: [`set_watch_timeout`], else [`WATCH_TIMEOUT_ENV`],
/// else [`DEFAULT_WATCH_TIMEOUT`].
pub fn watch_timeout() -> Duration {
    match WATCH_TIMEOUT_MS.load(Ordering::Relaxed) {
        0 => match std::env::var(WATCH_TIMEOUT_ENV) {
            Ok(s) => parse_duration(&s).unwrap_or_else(|e| {
                tracing::warn!("{WATCH_TIMEOUT_ENV}: {e}; using {DEFAULT_WATCH_TIMEOUT:?}");
                DEFAULT_WATCH_TIMEOUT
            }),
            Err(_) => DEFAULT_WATCH_TIMEOUT,
        },
        ms => Duration::from_millis(ms),
    }
}

/// Parses a positive duration: seconds (`10`, `2.5`), or with a unit
/// (`500ms`, `10s`, `1m`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: want e.g. 10, 2.5s or 500ms"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        _ => return Err(format!("invalid duration {s:?}: unit must be ms, s or m")),
    };
    if !(secs.is_finite() && secs > 0.0 && secs < 1e9) {
        return Err(format!("invalid duration {s:?}: must be positive"));
    }
    Ok(Duration::from_secs_f64(secs))
}

struct WatchInner {
    /// The loop's last list or watch failed (set by `broken`, cleared by
    /// `watching`): probes alone no longer prove the watch works.
    failing: bool,
    /// A watch has run at least once.
    established: bool,
    /// When the watch was last known to follow the store.
    last_ok: Instant,
    /// Set while lost: when the watch last reached the store.
    lost_at: Option<Instant>,
    last_err: Option<String>,
    losses: u64,
    /// Lost, and the store answers again: the loop should relist.
    relist: bool,
    /// Consecutive failed (re)lists, for the retry backoff.
    retries: u32,
}

struct WatchState {
    component: &'static str,
    timeout: Duration,
    inner: Mutex<WatchInner>,
    wake: tokio::sync::Notify,
}

impl WatchState {
    fn new(component: &'static str, timeout: Duration) -> Self {
        WatchState {
            component,
            timeout,
            inner: Mutex::new(WatchInner {
                failing: false,
                established: false,
                last_ok: Instant::now(),
                lost_at: None,
                last_err: None,
                losses: 0,
                relist: false,
                retries: 0,
            }),
            wake: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WatchInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Declares the watch lost once it has been out of touch too long.
    fn check(&self) {
        let mut s = self.lock();
        if s.lost_at.is_some() || s.last_ok.elapsed() <= self.timeout {
            return;
        }
        s.lost_at = Some(s.last_ok);
        s.losses += 1;
        let err = s.last_err.clone().unwrap_or_else(|| "no answer".into());
        let what = if s.established {
            "no contact with the store"
        } else {
            "no watch on the store yet"
        };
        tracing::warn!(
            component = self.component,
            error = %err,
            "store watch lost: {what} for over {:?}; /readyz fails until it is back",
            self.timeout
        );
    }

    fn probe_ok(&self) {
        let mut s = self.lock();
        if !s.failing {
            s.last_ok = Instant::now();
        }
        if s.lost_at.is_some() && !s.relist {
            s.relist = true;
            self.wake.notify_waiters();
        }
    }

    fn probe_failed(&self, why: String) {
        self.lock().last_err = Some(why);
    }

    fn lost_reason(&self) -> Option<String> {
        let s = self.lock();
        let at = s.lost_at?;
        Some(format!(
            "store watch ({}) lost: no contact with the store for {}s: {}",
            self.component,
            at.elapsed().as_secs(),
            s.last_err.as_deref().unwrap_or("no answer")
        ))
    }

    /// `podnet_store_watch_up`, `_lost_seconds` and `_losses_total`.
    fn gauges(&self) -> (f64, f64, f64) {
        let s = self.lock();
        let up = s.established && s.lost_at.is_none();
        let lost = s.lost_at.map(|t| t.elapsed().as_secs_f64()).unwrap_or(0.0);
        (up as u8 as f64, lost, s.losses as f64)
    }
}

/// One watch loop's view of its store watch; see the crate docs. Cheap to
/// clone; made by [`Metrics::store_watch`].
///
/// The loop reports [`watching`](Self::watching) after each successful list
/// and watch, [`event`](Self::event) per watch message and
/// [`broken`](Self::broken) on a failed list or watch; it keeps a
/// [`probe`](Self::probe) running, and relists when
/// [`recovered`](Self::recovered) resolves.
#[derive(Clone)]
pub struct StoreWatch {
    st: Arc<WatchState>,
}

impl StoreWatch {
    pub fn component(&self) -> &'static str {
        self.st.component
    }

    pub fn timeout(&self) -> Duration {
        self.st.timeout
    }

    /// The loop listed and watches again: it follows the store. Ends a
    /// loss (logged once).
    pub fn watching(&self) {
        let mut s = self.st.lock();
        s.failing = false;
        s.established = true;
        s.last_ok = Instant::now();
        s.relist = false;
        s.retries = 0;
        s.last_err = None;
        if let Some(at) = s.lost_at.take() {
            tracing::info!(
                component = self.st.component,
                "store watch recovered after {}s without the store; ready again",
                at.elapsed().as_secs()
            );
        }
    }

    /// A watch message arrived: the stream is alive.
    pub fn event(&self) {
        let mut s = self.st.lock();
        if !s.failing {
            s.last_ok = Instant::now();
        }
    }

    /// A list or the watch failed; the loop relists. Logged at debug only:
    /// a failure that lasts shows as one loss.
    pub fn broken(&self, why: &dyn Display) {
        let why = why.to_string();
        tracing::debug!(
            component = self.st.component,
            "store watch: {why}; relisting"
        );
        let mut s = self.st.lock();
        s.failing = true;
        s.last_err = Some(why);
    }

    /// Whether the watch is lost now.
    pub fn is_lost(&self) -> bool {
        self.st.lock().lost_at.is_some()
    }

    /// Sleeps before the next (re)list attempt: 100 ms doubling to 1 s.
    pub async fn backoff(&self) {
        let n = {
            let mut s = self.st.lock();
            s.retries = s.retries.saturating_add(1);
            s.retries
        };
        let d = Duration::from_millis((100u64 << (n.min(5) - 1)).min(1000));
        tokio::time::sleep(d).await;
    }

    /// Resolves when the store answers again after a loss: the loop should
    /// drop its watch and relist (the old stream may never resume).
    pub async fn recovered(&self) {
        loop {
            let woken = self.st.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.st.lock().relist {
                return;
            }
            woken.await;
        }
    }

    /// Starts the active check: `probe` (a cheap store request, such as
    /// reading the current revision) runs every fifth of the timeout, each
    /// given half the timeout to answer. Stops when the guard drops.
    pub fn probe<F, Fut, T, E>(&self, probe: F) -> Probe
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        E: Display,
    {
        let st = self.st.clone();
        Probe(tokio::spawn(async move {
            let every = (st.timeout / 5).clamp(Duration::from_millis(50), Duration::from_secs(2));
            let limit = (st.timeout / 2).max(every);
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut inflight = None;
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        st.check();
                        if inflight.is_none() {
                            inflight = Some(Box::pin(tokio::time::timeout(limit, probe())));
                        }
                    }
                    r = async { inflight.as_mut().expect("guarded").await }, if inflight.is_some() => {
                        inflight = None;
                        match r {
                            Ok(Ok(_)) => st.probe_ok(),
                            Ok(Err(e)) => st.probe_failed(e.to_string()),
                            Err(_) => st.probe_failed(format!("no answer within {limit:?}")),
                        }
                        st.check();
                    }
                }
            }
        }))
    }
}

/// The running probe of a [`StoreWatch`]; dropping it stops the probe.
pub struct Probe(tokio::task::JoinHandle<()>);

impl Drop for Probe {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One GET on a fresh connection: the bytes that came back (empty: the
    /// server closed it unanswered).
    async fn get(addr: SocketAddr, path: &str) -> Vec<u8> {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = c
            .write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
            .await;
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(20), c.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "the server neither answered nor closed");
        out
    }

    #[tokio::test]
    async fn a_flood_of_idle_connections_is_capped_and_answers_resume_after_it() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let pages: Pages =
            Arc::new(|p: &str| (p == "/healthz").then(|| (200, "text/plain", "ok\n".to_string())));
        tokio::spawn(serve_pages(l, pages));
        assert!(get(addr, "/healthz").await.starts_with(b"HTTP/1.1 200"));
        // Connections that send nothing take every slot (the server
        // accepts in order, so they are in before the next one).
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        assert!(
            get(addr, "/healthz").await.is_empty(),
            "a connection past the cap was answered"
        );
        // The flood goes: answers come again (once the server has seen
        // the idle connections close).
        drop(idle);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let got = get(addr, "/healthz").await;
            if got.starts_with(b"HTTP/1.1 200") {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no answer after the flood"
            );
        }
    }

    #[test]
    fn prometheus_text() {
        let m = Metrics::new();
        const SYNCS: Counter = Counter::new("podnet_syncs_total", "Syncs run.");
        const SERVICES: Gauge = Gauge::new("podnet_services", "Services known.");
        const SYNC_SECONDS: Histogram = Histogram::new("podnet_sync_seconds", "Sync time.");
        m.count(&SYNCS, "", 1.0);
        m.count(&SYNCS, "", 2.0);
        m.gauge(&SERVICES, "type=\"ClusterIP\"", 5.0);
        let t = m.render();
        assert!(
            t.contains("# TYPE podnet_syncs_total counter\npodnet_syncs_total 3\n"),
            "{t}"
        );
        assert!(t.contains("podnet_services{type=\"ClusterIP\"} 5"), "{t}");
        m.sample(&SYNC_SECONDS, "mode=\"full\"", 0.003);
        m.sample(&SYNC_SECONDS, "mode=\"full\"", 20.0);
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

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2.5s"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration(" 1m "), Ok(Duration::from_secs(60)));
        for bad in ["", "0", "-1", "5h", "abc", "nan"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {text}"))
    }

    /// Polls `f` until it holds, or fails after a generous deadline.
    async fn until(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The store goes away under a running watch and comes back: lost once,
    /// a relist asked for when it answers, ready again only once the loop
    /// watches again.
    #[tokio::test]
    async fn store_watch_loss_and_recovery() {
        let m = Metrics::new();
        m.set_ready(true);
        let w = m.store_watch_with("dns", Duration::from_millis(300));
        let up = Arc::new(AtomicBool::new(true));
        let u = up.clone();
        let _probe = w.probe(move || {
            let ok = u.load(Ordering::Relaxed);
            async move {
                if ok {
                    Ok(7)
                } else {
                    Err("connection refused")
                }
            }
        });
        w.watching();
        assert_eq!(m.readiness(), Ok(()));
        let t = m.render();
        assert_eq!(
            line(&t, "podnet_store_watch_up{"),
            "podnet_store_watch_up{component=\"dns\"} 1"
        );

        up.store(false, Ordering::Relaxed);
        until("the loss", || w.is_lost()).await;
        let why = m.readiness().unwrap_err();
        assert!(why.contains("store watch (dns) lost"), "{why}");
        assert!(why.contains("connection refused"), "{why}");
        let t = m.render();
        assert!(
            t.contains("podnet_store_watch_up{component=\"dns\"} 0\n"),
            "{t}"
        );
        assert!(
            t.contains("# TYPE podnet_store_watch_losses_total counter\n"),
            "{t}"
        );
        assert!(
            t.contains("podnet_store_watch_losses_total{component=\"dns\"} 1\n"),
            "{t}"
        );
        assert!(
            !t.contains("podnet_store_watch_lost_seconds{component=\"dns\"} 0\n"),
            "{t}"
        );
        // No relist while the store stays away, and one loss only.
        let early = tokio::time::timeout(Duration::from_secs(1), w.recovered()).await;
        assert!(early.is_err());
        assert!(m.render().contains("losses_total{component=\"dns\"} 1\n"));

        up.store(true, Ordering::Relaxed);
        tokio::time::timeout(Duration::from_secs(20), w.recovered())
            .await
            .expect("a relist is asked for once the store answers");
        // Not ready until the loop really watches again.
        assert!(m.readiness().is_err());
        w.watching();
        assert_eq!(m.readiness(), Ok(()));
        let t = m.render();
        assert!(
            t.contains("podnet_store_watch_up{component=\"dns\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("podnet_store_watch_lost_seconds{component=\"dns\"} 0\n"),
            "{t}"
        );
        assert!(
            t.contains("podnet_store_watch_losses_total{component=\"dns\"} 1\n"),
            "{t}"
        );
        // Nothing left to relist for.
        assert!(
            tokio::time::timeout(Duration::from_millis(500), w.recovered())
                .await
                .is_err()
        );
    }

    /// A store request that never answers (an etcd stream waiting for a
    /// dead server) is a loss too; so is a loop that cannot get its watch
    /// back although the store answers.
    #[tokio::test]
    async fn silent_store_and_failing_lists_are_losses() {
        let m = Metrics::new();
        m.set_ready(true);
        let hung = m.store_watch_with("controller", Duration::from_millis(300));
        let _p1 = hung.probe(std::future::pending::<Result<(), String>>);
        hung.watching();
        let relisting = m.store_watch_with("proxy", Duration::from_millis(300));
        let _p2 = relisting.probe(|| async { Ok::<_, String>(()) });
        relisting.watching();
        relisting.broken(&"watch closed");
        // A long first list while the store answers is no loss.
        let slow = m.store_watch_with("overlay", Duration::from_millis(300));
        let _p3 = slow.probe(|| async { Ok::<_, String>(()) });
        until("both losses", || hung.is_lost() && relisting.is_lost()).await;
        assert!(!slow.is_lost());
        let why = m.readiness().unwrap_err();
        assert!(why.contains("store watch (controller) lost"), "{why}");
        assert!(why.contains("no answer within"), "{why}");
        assert!(why.contains("store watch (proxy) lost"), "{why}");
        assert!(why.contains("watch closed"), "{why}");
        // A restarted loop gets the same state back, still lost.
        let again = m.store_watch_with("proxy", Duration::from_millis(300));
        assert!(again.is_lost());
        again.watching();
        assert!(!relisting.is_lost());
    }
}
