//! The object source: the one place a podnet process learns cluster state.
//!
//! Every consumer (the overlay, the service proxy, DNS, the standalone
//! controller, and NetworkPolicy next) subscribes to the kinds it needs and
//! receives typed [`Delta`]s; none of them reads a store key or an API
//! response. There is one [`Source`] per process, with two implementations
//! picked by an enum (no trait objects):
//!
//! - [`store`]: the podnet store (sqlite or etcd), the standalone mode;
//! - [`kube`]: the Kubernetes API, through `kube-runtime`'s watcher, the way
//!   flannel's kube-subnet-mgr, kube-proxy and CoreDNS read it.
//!
//! Both behave alike, as kube-runtime's watcher → reflector does: list each
//! kind, then watch; after a watch gap (a compacted revision, a 410 Gone, a
//! broken stream, a lost store) relist and emit only the difference against
//! what was already delivered ([`cache`]), so no event is ever missed and a
//! consumer never starts over. [`Event::Ready`] follows the first complete
//! list of every subscribed kind: consumers do their first full sync then,
//! never on a partial view (a proxy that synced Services before their
//! EndpointSlices arrived would reject traffic to them for a moment).
//!
//! [`subnets`] is the other half of a node's view: which node owns which pod
//! subnet, from leases in the store or from `Node.spec.podCIDRs`; [`node`]
//! bundles both with the network config into what a node agent is handed.

pub mod cache;
pub mod kube;
pub mod node;
pub mod retry;
pub mod store;
pub mod subnets;

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use podnet_api::{Kind, Object};
use podnet_daemon::StoreWatch;
use tokio::sync::mpsc;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("store: {0}")]
    Store(#[from] podnet_store::StoreError),
    #[error("kubernetes API: {0}")]
    Kube(#[from] ::kube::Error),
    #[error("kubeconfig: {0}")]
    KubeConfig(String),
    #[error("{0}")]
    Other(String),
}

/// Which object a delta is about; consumers key their state by it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub kind: Kind,
    /// `None` for cluster-scoped kinds.
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectKey {
    pub fn of(o: &Object) -> ObjectKey {
        ObjectKey {
            kind: o.kind(),
            namespace: o.namespace().map(str::to_string),
            name: o.name().to_string(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// One change to one object. Deltas of one object arrive in order.
#[derive(Debug, Clone)]
pub enum Delta {
    /// The object is new to this consumer.
    Added(Arc<Object>),
    /// The object changed (its resourceVersion differs from the last one
    /// delivered).
    Updated(Arc<Object>),
    /// The object is gone.
    Deleted(ObjectKey),
}

impl Delta {
    pub fn key(&self) -> ObjectKey {
        match self {
            Delta::Added(o) | Delta::Updated(o) => ObjectKey::of(o),
            Delta::Deleted(k) => k.clone(),
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Delta::Added(o) | Delta::Updated(o) => o.kind(),
            Delta::Deleted(k) => k.kind,
        }
    }

    /// The object, unless it was deleted.
    pub fn object(&self) -> Option<&Object> {
        match self {
            Delta::Added(o) | Delta::Updated(o) => Some(o),
            Delta::Deleted(_) => None,
        }
    }
}

/// What a subscription receives.
#[derive(Debug, Clone)]
pub enum Event {
    Deltas(Vec<Delta>),
    /// Every subscribed kind has been listed once: the consumer's view is
    /// complete. Sent once.
    Ready,
    /// Every object of the subscription's kinds, freshly listed, in answer
    /// to [`Subscription::resync`]: the consumer rebuilds its view from it.
    Snapshot(Vec<Arc<Object>>),
}

/// A batch of what arrived together: the deltas in order, and whether the
/// view became complete with them.
#[derive(Debug, Default)]
pub struct Batch {
    pub deltas: Vec<Delta>,
    pub ready: bool,
    /// A snapshot asked for with [`Subscription::resync`]; the deltas that
    /// follow it in this batch came after it.
    pub snapshot: Option<Vec<Arc<Object>>>,
}

/// One consumer's stream of events for the kinds it asked for.
pub struct Subscription {
    rx: mpsc::Receiver<Event>,
    id: usize,
    resync: mpsc::UnboundedSender<usize>,
}

impl Subscription {
    /// Asks the source for a [`Event::Snapshot`] of everything this
    /// subscription covers: for a consumer that dropped objects it did not
    /// need and now needs them (DNS keeps no endpoints of ClusterIP
    /// Services until one turns headless).
    pub fn resync(&self) {
        let _ = self.resync.send(self.id);
    }

    /// A handle that asks for this subscription's snapshot from elsewhere
    /// (the subscription itself may be owned by a forwarding task).
    pub fn resyncer(&self) -> Resyncer {
        Resyncer {
            id: self.id,
            tx: self.resync.clone(),
        }
    }

    /// The next event; `None` once the source has stopped.
    pub async fn recv(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// Waits for the next event and merges everything already queued
    /// behind it into one batch, so a burst costs one sync. `None` once the
    /// source has stopped.
    pub async fn next_batch(&mut self) -> Option<Batch> {
        let first = self.rx.recv().await?;
        let mut b = Batch::default();
        b.push(first);
        while let Ok(e) = self.rx.try_recv() {
            b.push(e);
        }
        Some(b)
    }
}

/// See [`Subscription::resyncer`].
#[derive(Clone)]
pub struct Resyncer {
    id: usize,
    tx: mpsc::UnboundedSender<usize>,
}

impl Resyncer {
    /// As [`Subscription::resync`].
    pub fn resync(&self) {
        let _ = self.tx.send(self.id);
    }
}

impl Batch {
    fn push(&mut self, e: Event) {
        match e {
            Event::Deltas(mut d) => self.deltas.append(&mut d),
            Event::Ready => self.ready = true,
            Event::Snapshot(objs) => {
                self.deltas.clear();
                self.snapshot = Some(objs);
            }
        }
    }
}

/// Events a subscriber may have queued before the source waits for it.
/// With [`CHUNK`]-sized events this bounds what a relist holds decoded at
/// once (a full list is never in memory whole), at the price of a slow
/// consumer slowing the source for the others of its process.
const QUEUE: usize = 2;

/// The most deltas in one event.
pub(crate) const CHUNK: usize = 64;

/// The subscribers of one source: each gets the deltas of its kinds.
pub(crate) struct Hub {
    subs: Vec<(BTreeSet<Kind>, mpsc::Sender<Event>)>,
    pub(crate) resync_tx: mpsc::UnboundedSender<usize>,
    /// Resync requests, by subscriber index.
    pub(crate) resync_rx: mpsc::UnboundedReceiver<usize>,
}

impl Default for Hub {
    fn default() -> Self {
        let (resync_tx, resync_rx) = mpsc::unbounded_channel();
        Hub {
            subs: Vec::new(),
            resync_tx,
            resync_rx,
        }
    }
}

impl Hub {
    fn subscribe(&mut self, kinds: &[Kind]) -> Subscription {
        let (tx, rx) = mpsc::channel(QUEUE);
        self.subs.push((kinds.iter().copied().collect(), tx));
        Subscription {
            rx,
            id: self.subs.len() - 1,
            resync: self.resync_tx.clone(),
        }
    }

    /// The kinds subscriber `id` covers.
    pub(crate) fn kinds_of(&self, id: usize) -> BTreeSet<Kind> {
        self.subs
            .get(id)
            .map(|(k, _)| k.clone())
            .unwrap_or_default()
    }

    pub(crate) async fn snapshot(&self, id: usize, objs: Vec<Object>) {
        if let Some((_, tx)) = self.subs.get(id) {
            let _ = tx
                .send(Event::Snapshot(objs.into_iter().map(Arc::new).collect()))
                .await;
        }
    }

    /// Every kind any subscriber wants.
    pub(crate) fn kinds(&self) -> BTreeSet<Kind> {
        self.subs
            .iter()
            .flat_map(|(k, _)| k.iter().copied())
            .collect()
    }

    /// Delivers `deltas` to every subscriber of their kinds, waiting while
    /// one has [`QUEUE`] events unread. A subscriber that is gone is skipped.
    pub(crate) async fn send(&self, deltas: &[Delta]) {
        if deltas.is_empty() {
            return;
        }
        for (kinds, tx) in &self.subs {
            let mine: Vec<Delta> = deltas
                .iter()
                .filter(|d| kinds.contains(&d.kind()))
                .cloned()
                .collect();
            if !mine.is_empty() {
                let _ = tx.send(Event::Deltas(mine)).await;
            }
        }
    }

    pub(crate) async fn ready(&self) {
        for (_, tx) in &self.subs {
            let _ = tx.send(Event::Ready).await;
        }
    }
}

/// The object source of this process.
pub enum Source {
    Store(store::StoreSource),
    Kube(kube::KubeSource),
}

impl Source {
    /// Reads the podnet store; `health` reports the watch (a lost store
    /// fails `/readyz`).
    pub fn store(store: podnet_store::AnyStore, health: StoreWatch) -> Source {
        Source::Store(store::StoreSource::new(store, health))
    }

    /// Reads the Kubernetes API with `client`.
    pub fn kube(client: ::kube::Client, health: StoreWatch) -> Source {
        Source::Kube(kube::KubeSource::new(client, health))
    }

    /// A stream of `kinds`; subscribe before [`Source::start`]. Every
    /// subscription must be read from then on: the source waits for a
    /// reader with unread events (that bounds its memory), so one left
    /// unread stalls the others.
    pub fn subscribe(&mut self, kinds: &[Kind]) -> Subscription {
        match self {
            Source::Store(s) => s.hub.subscribe(kinds),
            Source::Kube(s) => s.hub.subscribe(kinds),
        }
    }

    /// The nodes' AS as the cluster's BGPConfiguration `default` says
    /// (64512 without one, or when it cannot be read now: then a
    /// warning), read once: a node's speaker runs in one AS for its life,
    /// and the agent reads this before it starts it.
    pub async fn bgp_as(&self) -> u32 {
        let got = match self {
            Source::Store(s) => s.bgp_configuration().await,
            Source::Kube(s) => s.bgp_configuration().await,
        };
        match got {
            Ok(c) => c.map_or(podnet_api::bgp::DEFAULT_AS, |c| c.spec.as_number()),
            Err(e) => {
                tracing::warn!("reading the BGPConfiguration: {e}; the nodes' AS is the default");
                podnet_api::bgp::DEFAULT_AS
            }
        }
    }

    /// Starts listing and watching; runs until the returned guard drops.
    pub fn start(self) -> Running {
        let task = match self {
            Source::Store(s) => tokio::spawn(s.run()),
            Source::Kube(s) => tokio::spawn(s.run()),
        };
        Running(task)
    }
}

/// A started source; dropping it stops it (subscriptions then end).
pub struct Running(tokio::task::JoinHandle<()>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A Kubernetes client from `--kubeconfig PATH`, or else the in-cluster
/// service-account config, or else `$KUBECONFIG`/`~/.kube/config`.
pub async fn kube_client(
    kubeconfig: Option<&std::path::Path>,
) -> Result<::kube::Client, SourceError> {
    let config = match kubeconfig {
        Some(p) => {
            let kc = ::kube::config::Kubeconfig::read_from(p)
                .map_err(|e| SourceError::KubeConfig(format!("{}: {e}", p.display())))?;
            ::kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| SourceError::KubeConfig(format!("{}: {e}", p.display())))?
        }
        None => ::kube::Config::infer()
            .await
            .map_err(|e| SourceError::KubeConfig(e.to_string()))?,
    };
    ::kube::Client::try_from(config).map_err(SourceError::Kube)
}
