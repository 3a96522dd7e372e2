//! The one reconcile loop. Every subsystem that keeps something in step
//! with cluster state (the overlay's routes, the service proxy's table,
//! DNS's zone, NetworkPolicy next) is a [`Subsystem`] with the same five
//! verbs, and [`run`] drives it the same way:
//!
//! 1. **watch**: take what changed from the input (object-source deltas,
//!    the subnet map) and mark the keys it touches dirty;
//! 2. **plan**: the desired state for the dirty keys, or for everything —
//!    a pure function of what was watched;
//! 3. **observe**: what the kernel holds for them — reading the kernel and
//!    nothing else;
//! 4. **diff**: the difference — pure;
//! 5. **apply**: the difference as one atomic batch.
//!
//! The loop owns the rest, once for all subsystems: the dirty set; the
//! coalescing of a burst of input into one sync; nothing synced before the
//! input's first complete view ([`Input::Ready`]); a resync period (each
//! subsystem says how wide a resync is: the overlay replans everything,
//! the proxy only observes whether its table drifted); after a failed sync
//! a full one, retried with a delay; and health: `/healthz` fails with the
//! subsystem's name once syncs have failed for longer than the stall limit,
//! and the `podnet_reconcile_*` metrics count syncs, operations and
//! failures per subsystem. A sync is blocking kernel work, so it runs on a
//! thread of its own (the runtime's blocking pool): one loop's long sync,
//! such as a resync reading a whole table back, never holds another loop's
//! change or the object source behind it.
//!
//! Felix's split, in our words: the object source is the syncer, `plan` is
//! the calculation layer, `observe`/`diff`/`apply` the dataplane manager.

use std::collections::BTreeSet;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use podnet_daemon::Metrics;
use podnet_source::{Delta, Subscription};
use tokio::sync::mpsc;

const RECONCILE_FAILURES_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_reconcile_failures_total",
    "Failed syncs per subsystem.",
);
const RECONCILE_OPERATIONS_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_reconcile_operations_total",
    "Kernel operations applied per subsystem.",
);
const RECONCILE_SYNCS_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_reconcile_syncs_total",
    "Syncs (plan, observe, diff, apply) per subsystem and scope.",
);
const RECONCILE_SYNC_SECONDS: podnet_daemon::Histogram = podnet_daemon::Histogram::new(
    "podnet_reconcile_sync_seconds",
    "Time of syncs that changed something, per subsystem.",
);

/// What a loop is fed.
#[derive(Debug)]
pub enum Input<T> {
    /// Something changed.
    Changes(T),
    /// The input's view is complete: the first sync may run.
    Ready,
}

/// How much one sync covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope<K: Ord> {
    /// Everything the subsystem owns.
    Full,
    /// Only these keys (possibly none: then only `observe` can find work,
    /// such as a table someone else changed).
    Only(BTreeSet<K>),
}

impl<K: Ord> Scope<K> {
    fn merge(self, other: Scope<K>) -> Scope<K> {
        match (self, other) {
            (Scope::Full, _) | (_, Scope::Full) => Scope::Full,
            (Scope::Only(mut a), Scope::Only(mut b)) => {
                a.append(&mut b);
                Scope::Only(a)
            }
        }
    }

    pub fn is_full(&self) -> bool {
        matches!(self, Scope::Full)
    }

    fn label(&self) -> &'static str {
        match self {
            Scope::Full => "full",
            Scope::Only(_) => "partial",
        }
    }
}

/// Why a sync failed; the loop retries with a full sync.
#[derive(Debug, Clone)]
pub struct SyncError(pub String);

impl fmt::Display for SyncError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<E: std::error::Error> From<E> for SyncError {
    fn from(e: E) -> Self {
        SyncError(e.to_string())
    }
}

/// One slice of state kept equal to the cluster's, with the five verbs.
pub trait Subsystem {
    /// What [`Subsystem::watch`] takes.
    type Input;
    /// What a dirty mark names (a Service, a node subnet, a name...).
    type Key: Ord + Clone;
    type Plan;
    type Observed;
    type Changes;

    /// For logs, metrics and `/healthz`.
    fn name(&self) -> &'static str;

    /// Takes one batch of input into the subsystem's view; marks what it
    /// touches.
    fn watch(&mut self, input: Self::Input, dirty: &mut BTreeSet<Self::Key>);

    /// The desired state for `scope`. Pure: no I/O.
    fn plan(&self, scope: &Scope<Self::Key>) -> Self::Plan;

    /// What the kernel holds for `scope`. Reads the kernel, nothing else.
    fn observe(&mut self, scope: &Scope<Self::Key>) -> Result<Self::Observed, SyncError>;

    /// What to change. Pure.
    fn diff(&self, plan: Self::Plan, observed: Self::Observed) -> Self::Changes;

    /// Applies the changes as one atomic batch; returns the operations
    /// sent (0 when nothing changed).
    fn apply(&mut self, changes: Self::Changes) -> Result<usize, SyncError>;

    /// How wide a periodic resync is. Default: everything.
    fn resync(&self) -> Scope<Self::Key> {
        Scope::Full
    }

    /// After each sync attempt, for work that follows the applied state
    /// (health-check servers, metrics). Default: nothing.
    fn synced(&mut self, _scope: &Scope<Self::Key>, _ok: bool) {}
}

/// The loop's timing.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// How often a resync runs (repairs what someone else changed).
    pub resync: Duration,
    /// The delay before a failed sync is retried (as a full sync).
    pub retry: Duration,
    /// How long syncs may keep failing before `/healthz` says so.
    pub stall: Duration,
}

impl Options {
    pub fn new(resync: Duration) -> Self {
        Options {
            resync,
            retry: Duration::from_secs(1),
            stall: Duration::from_secs(30),
        }
    }
}

/// A loop's input channel. Bounded, so a loop that falls behind slows
/// what feeds it (down to the object source) instead of letting decoded
/// objects pile up in memory.
pub fn channel<T>() -> (mpsc::Sender<Input<T>>, mpsc::Receiver<Input<T>>) {
    mpsc::channel(2)
}

/// One sync: plan, observe, diff, apply.
pub fn sync<S: Subsystem>(s: &mut S, scope: &Scope<S::Key>) -> Result<usize, SyncError> {
    let plan = s.plan(scope);
    let observed = s.observe(scope)?;
    let changes = s.diff(plan, observed);
    s.apply(changes)
}

/// What a subscription batch brings a loop, before the loop's own input
/// type wraps it ([`forward`]).
pub enum Feed {
    /// A snapshot of every object, asked for with
    /// `Subscription::resync`.
    Snapshot(Vec<std::sync::Arc<podnet_api::Object>>),
    /// Changes since the last batch.
    Deltas(Vec<Delta>),
}

/// Forwards an object-source subscription into a loop's channel until
/// either side ends: each batch's snapshot and deltas, mapped into the
/// loop's input by `map` (None: dropped), then `Ready` once the source's
/// first list is in. The one subscription-to-loop adapter; the caller
/// spawns it, or runs it beside other inputs of the same loop.
pub async fn forward<T>(
    mut sub: Subscription,
    tx: mpsc::Sender<Input<T>>,
    map: impl Fn(Feed) -> Option<T>,
) {
    while let Some(b) = sub.next_batch().await {
        let feeds = b
            .snapshot
            .map(Feed::Snapshot)
            .into_iter()
            .chain((!b.deltas.is_empty()).then_some(Feed::Deltas(b.deltas)));
        for f in feeds {
            if let Some(x) = map(f) {
                if tx.send(Input::Changes(x)).await.is_err() {
                    return;
                }
            }
        }
        if b.ready && tx.send(Input::Ready).await.is_err() {
            return;
        }
    }
}

/// Feeds a loop from an object-source subscription: batches of deltas,
/// then `Ready` once the source's first list is in.
pub fn from_subscription(sub: Subscription) -> mpsc::Receiver<Input<Vec<Delta>>> {
    let (tx, rx) = channel();
    tokio::spawn(forward(sub, tx, |f| match f {
        Feed::Deltas(d) => Some(d),
        Feed::Snapshot(_) => {
            tracing::warn!("a resync snapshot reached a reconcile loop; ignored");
            None
        }
    }));
    rx
}

/// One sync and its [`Subsystem::synced`], on a thread of the runtime's
/// blocking pool: a sync is blocking kernel work (netlink round trips, a
/// whole table read back on a resync) that can take a while, and on a
/// runtime worker it would hold every task queued behind it, such as
/// another subsystem's loop with a change to apply or the object source
/// decoding the next event. Each loop waits for its own sync only.
async fn sync_on_own_thread<S>(
    mut s: S,
    scope: Scope<S::Key>,
) -> (S, Scope<S::Key>, Result<usize, SyncError>)
where
    S: Subsystem + Send + 'static,
    S::Key: Send + 'static,
{
    let done = tokio::task::spawn_blocking(move || {
        let res = sync(&mut s, &scope);
        s.synced(&scope, res.is_ok());
        (s, scope, res)
    })
    .await;
    match done {
        Ok(r) => r,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// What a loop owes between syncs.
struct Owed<K: Ord> {
    /// The source's first list is in: syncs may run.
    ready: bool,
    dirty: BTreeSet<K>,
    /// Work owed besides the dirty keys (a resync, a full sync).
    extra: Option<Scope<K>>,
    /// Since when syncs fail (then every sync is a full one).
    failing_since: Option<Instant>,
}

impl<K: Ord + Clone> Owed<K> {
    fn owe(&mut self, s: Scope<K>) {
        self.extra = Some(match self.extra.take() {
            Some(o) => o.merge(s),
            None => s,
        });
    }

    /// Takes one input and everything already queued behind it, so they
    /// make one sync.
    fn take<S>(
        &mut self,
        s: &mut S,
        first: Input<S::Input>,
        rest: &mut mpsc::Receiver<Input<S::Input>>,
    ) where
        S: Subsystem<Key = K>,
    {
        let mut next = Some(first);
        while let Some(m) = next {
            match m {
                Input::Changes(c) => s.watch(c, &mut self.dirty),
                Input::Ready if !self.ready => {
                    self.ready = true;
                    self.owe(Scope::Full);
                }
                Input::Ready => {}
            }
            next = rest.try_recv().ok();
        }
    }

    /// The next sync's scope, if one is due.
    fn next_scope(&mut self) -> Option<Scope<K>> {
        if !self.ready {
            return None;
        }
        let scope = match self.extra.take() {
            Some(o) => o.merge(Scope::Only(std::mem::take(&mut self.dirty))),
            None if self.dirty.is_empty() => return None,
            None => Scope::Only(std::mem::take(&mut self.dirty)),
        };
        Some(match self.failing_since {
            Some(_) => Scope::Full,
            None => scope,
        })
    }
}

/// Drives `s` until `shutdown` resolves or the input ends; see the crate
/// docs.
pub async fn run<S>(
    mut s: S,
    mut input: mpsc::Receiver<Input<S::Input>>,
    opts: Options,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) where
    S: Subsystem + Send + 'static,
    S::Key: Send + 'static,
{
    tokio::pin!(shutdown);
    let name = s.name();
    let mut owed = Owed {
        ready: false,
        dirty: BTreeSet::new(),
        extra: None,
        failing_since: None,
    };
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + opts.resync, opts.resync);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tick.tick() => {
                let r = s.resync();
                owed.owe(r);
            }
            _ = tokio::time::sleep(opts.retry), if owed.ready && owed.failing_since.is_some() => {
                owed.owe(Scope::Full);
            }
            m = input.recv() => {
                let Some(m) = m else {
                    tracing::warn!(subsystem = name, "input ended; the loop stops");
                    metrics.set_unhealthy_for(name, Some(format!("{name}: its input ended")));
                    return;
                };
                owed.take(&mut s, m, &mut input);
            }
        }
        let Some(scope) = owed.next_scope() else {
            continue;
        };
        let t0 = Instant::now();
        let (back, scope, res) = sync_on_own_thread(s, scope).await;
        s = back;
        match res {
            Ok(n) => {
                if owed.failing_since.take().is_some() {
                    tracing::info!(subsystem = name, "in sync again");
                    metrics.set_unhealthy_for(name, None);
                }
                record_sync(&metrics, name, &scope, n, t0);
            }
            Err(e) => {
                let since = *owed.failing_since.get_or_insert_with(Instant::now);
                record_failure(&metrics, name, &e, since, opts.stall);
            }
        }
    }
}

/// A sync that went through: its log line and metrics.
fn record_sync<K: Ord>(metrics: &Metrics, name: &str, scope: &Scope<K>, n: usize, t0: Instant) {
    let labels = format!("subsystem=\"{name}\"");
    tracing::debug!(
        subsystem = name,
        scope = scope.label(),
        ops = n,
        ms = t0.elapsed().as_secs_f64() * 1e3,
        "synced"
    );
    metrics.count(
        &RECONCILE_SYNCS_TOTAL,
        &format!("{labels},scope=\"{}\"", scope.label()),
        1.0,
    );
    metrics.count(&RECONCILE_OPERATIONS_TOTAL, &labels, n as f64);
    if n > 0 {
        metrics.sample(&RECONCILE_SYNC_SECONDS, &labels, t0.elapsed().as_secs_f64());
    }
}

/// A sync that failed, failing since `since`: a warning, the failure
/// count, and `/readyz` failing once that is longer than `stall`.
fn record_failure(
    metrics: &Metrics,
    name: &'static str,
    e: &SyncError,
    since: Instant,
    stall: Duration,
) {
    tracing::warn!(
        subsystem = name,
        "sync failed: {e}; retrying with a full sync"
    );
    metrics.count(
        &RECONCILE_FAILURES_TOTAL,
        &format!("subsystem=\"{name}\""),
        1.0,
    );
    if since.elapsed() > stall {
        metrics.set_unhealthy_for(
            name,
            Some(format!(
                "{name} has not synced for {}s: {e}",
                since.elapsed().as_secs()
            )),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    /// A subsystem over a fake "kernel" map, recording every verb call.
    struct Fake {
        want: BTreeMap<u32, u32>,
        kernel: Arc<Mutex<BTreeMap<u32, u32>>>,
        fail: Arc<Mutex<u32>>,
        log: Arc<Mutex<Vec<String>>>,
        /// When set, `apply` says so on the first sender and then blocks
        /// until the second one is dropped (a long sync).
        hold: Option<Hold>,
    }

    /// A long sync's gate: "entered", then wait for "release".
    type Hold = (
        std::sync::mpsc::Sender<()>,
        Arc<Mutex<std::sync::mpsc::Receiver<()>>>,
    );

    impl Fake {
        fn new(kernel: Arc<Mutex<BTreeMap<u32, u32>>>, log: Arc<Mutex<Vec<String>>>) -> Fake {
            Fake {
                want: BTreeMap::new(),
                kernel,
                fail: Arc::new(Mutex::new(0)),
                log,
                hold: None,
            }
        }
    }

    impl Subsystem for Fake {
        type Input = Vec<(u32, u32)>;
        type Key = u32;
        type Plan = BTreeMap<u32, Option<u32>>;
        type Observed = BTreeMap<u32, Option<u32>>;
        type Changes = Vec<(u32, Option<u32>)>;

        fn name(&self) -> &'static str {
            "fake"
        }
        fn watch(&mut self, input: Self::Input, dirty: &mut BTreeSet<u32>) {
            for (k, v) in input {
                self.want.insert(k, v);
                dirty.insert(k);
            }
        }
        fn plan(&self, scope: &Scope<u32>) -> Self::Plan {
            match scope {
                Scope::Full => self.want.iter().map(|(k, v)| (*k, Some(*v))).collect(),
                Scope::Only(ks) => ks.iter().map(|k| (*k, self.want.get(k).copied())).collect(),
            }
        }
        fn observe(&mut self, scope: &Scope<u32>) -> Result<Self::Observed, SyncError> {
            let k = self.kernel.lock().unwrap();
            Ok(match scope {
                Scope::Full => k.iter().map(|(a, b)| (*a, Some(*b))).collect(),
                Scope::Only(ks) => ks.iter().map(|a| (*a, k.get(a).copied())).collect(),
            })
        }
        fn diff(&self, plan: Self::Plan, observed: Self::Observed) -> Self::Changes {
            let mut out: Vec<(u32, Option<u32>)> = plan
                .iter()
                .filter(|(k, v)| observed.get(k).copied().flatten() != **v)
                .map(|(k, v)| (*k, *v))
                .collect();
            out.extend(
                observed
                    .keys()
                    .filter(|k| !plan.contains_key(k))
                    .map(|k| (*k, None)),
            );
            out
        }
        fn apply(&mut self, changes: Self::Changes) -> Result<usize, SyncError> {
            if let Some((entered, release)) = &self.hold {
                let _ = entered.send(());
                let _ = release.lock().unwrap().recv();
            }
            let mut f = self.fail.lock().unwrap();
            if *f > 0 {
                *f -= 1;
                self.log.lock().unwrap().push("fail".into());
                return Err(SyncError("injected".into()));
            }
            let mut k = self.kernel.lock().unwrap();
            for (a, b) in &changes {
                match b {
                    Some(v) => k.insert(*a, *v),
                    None => k.remove(a),
                };
            }
            self.log
                .lock()
                .unwrap()
                .push(format!("apply {}", changes.len()));
            Ok(changes.len())
        }
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        for _ in 0..2000 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("timed out waiting for {what}");
    }

    #[tokio::test]
    async fn nothing_before_ready_then_coalesced_syncs_and_a_full_sync_after_failure() {
        let kernel = Arc::new(Mutex::new(BTreeMap::from([(9, 9)])));
        let fail = Arc::new(Mutex::new(0));
        let log = Arc::new(Mutex::new(Vec::new()));
        let s = Fake {
            fail: fail.clone(),
            ..Fake::new(kernel.clone(), log.clone())
        };
        let (tx, rx) = channel();
        let metrics = Metrics::new();
        let opts = Options {
            resync: Duration::from_secs(3600),
            retry: Duration::from_millis(10),
            stall: Duration::from_secs(3600),
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let h = tokio::spawn(run(s, rx, opts, metrics.clone(), async move {
            let _ = stop_rx.await;
        }));
        // Changes before Ready are only watched.
        tx.send(Input::Changes(vec![(1, 1)])).await.unwrap();
        tx.send(Input::Changes(vec![(2, 2)])).await.unwrap();
        tokio::task::yield_now().await;
        assert!(log.lock().unwrap().is_empty());
        // Ready: one full sync, which also removes what nobody wants.
        tx.send(Input::Ready).await.unwrap();
        until("the first sync", || !log.lock().unwrap().is_empty()).await;
        assert_eq!(*log.lock().unwrap(), vec!["apply 3"]);
        assert_eq!(*kernel.lock().unwrap(), BTreeMap::from([(1, 1), (2, 2)]));
        // A change touches only its key.
        tx.send(Input::Changes(vec![(1, 5)])).await.unwrap();
        until("a partial sync", || log.lock().unwrap().len() == 2).await;
        assert_eq!(log.lock().unwrap()[1], "apply 1");
        // A failure is retried as a full sync, which also repairs drift.
        *fail.lock().unwrap() = 1;
        kernel.lock().unwrap().remove(&2);
        tx.send(Input::Changes(vec![(3, 3)])).await.unwrap();
        until("the retry", || log.lock().unwrap().len() == 4).await;
        assert_eq!(log.lock().unwrap()[2..], ["fail", "apply 2"]);
        assert_eq!(
            *kernel.lock().unwrap(),
            BTreeMap::from([(1, 5), (2, 2), (3, 3)])
        );
        assert!(metrics
            .render()
            .contains("podnet_reconcile_failures_total{subsystem=\"fake\"} 1"));
        stop_tx.send(()).unwrap();
        h.await.unwrap();
    }

    /// One loop's long sync (a resync reading a whole table back) must not
    /// hold another loop's change: on a runtime with a single worker, the
    /// second loop still applies while the first one's sync is blocked.
    #[test]
    fn a_long_sync_in_one_loop_holds_no_other_loop() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let metrics = Metrics::new();
        let opts = Options {
            resync: Duration::from_secs(3600),
            retry: Duration::from_secs(3600),
            stall: Duration::from_secs(3600),
        };
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let slow = Fake {
            hold: Some((entered_tx, Arc::new(Mutex::new(release_rx)))),
            ..Fake::new(Default::default(), Default::default())
        };
        let fast_kernel: Arc<Mutex<BTreeMap<u32, u32>>> = Default::default();
        let fast_log: Arc<Mutex<Vec<String>>> = Default::default();
        let fast = Fake::new(fast_kernel.clone(), fast_log.clone());
        let (slow_tx, slow_rx) = channel();
        let (fast_tx, fast_rx) = channel();
        let _g = rt.enter();
        rt.spawn(run(
            slow,
            slow_rx,
            opts,
            metrics.clone(),
            std::future::pending(),
        ));
        rt.spawn(run(
            fast,
            fast_rx,
            opts,
            metrics.clone(),
            std::future::pending(),
        ));
        slow_tx.blocking_send(Input::Ready).unwrap();
        entered
            .recv_timeout(Duration::from_secs(30))
            .expect("the slow loop's first sync started");
        // The slow loop is inside its sync now; the fast loop gets a change.
        fast_tx.blocking_send(Input::Ready).unwrap();
        fast_tx.blocking_send(Input::Changes(vec![(7, 7)])).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while fast_kernel.lock().unwrap().get(&7).is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the fast loop's change waited behind the slow loop's sync (log: {:?})",
                fast_log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        drop(release);
        rt.shutdown_timeout(Duration::from_secs(5));
    }
}
