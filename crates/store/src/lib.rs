//! The cluster datastore. One small interface, [`Store`], with etcd's model:
//! a revisioned key space, all-or-nothing transactions with per-key
//! conditions, ordered watches from any retained revision, and leases.
//!
//! - [`sqlite`]: the embedded default, one file shared by every process on a
//!   machine (`sqlite:///var/lib/podnet/state.db`);
//! - [`etcd`]: etcd v3 (`etcd://host:port[,host:port]`), for many machines;
//! - [`objects`]: Kubernetes objects on top of either, with resourceVersion
//!   compare-and-swap.
//!
//! The implementation is picked by [`open`] from the URL and held in the
//! [`AnyStore`] enum: no registry, no trait objects.

pub mod etcd;
pub mod objects;
pub mod sqlite;

pub use objects::Objects;

use std::future::Future;

/// A revision of the whole key space, as in etcd.
pub type Rev = i64;

pub const DEFAULT_URL: &str = "sqlite:///var/lib/podnet/state.db";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub create_rev: Rev,
    pub mod_rev: Rev,
    pub lease: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Put,
    Delete,
}

/// One change. For a delete, `kv.value` is the value before deletion and
/// `kv.mod_rev` the revision of the deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub typ: EventType,
    pub kv: KeyValue,
}

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Fails with [`StoreError::AlreadyExists`] if the key exists.
    Create {
        key: String,
        value: Vec<u8>,
        lease: i64,
    },
    /// Fails with [`StoreError::Conflict`] unless the key's mod revision is `rev`.
    Update {
        key: String,
        value: Vec<u8>,
        rev: Rev,
        lease: i64,
    },
    /// Unconditional write.
    Put {
        key: String,
        value: Vec<u8>,
        lease: i64,
    },
    /// With `rev`, fails unless the key's mod revision matches; a missing
    /// key fails with NotFound only when `rev` is given.
    Delete { key: String, rev: Option<Rev> },
}

impl Op {
    pub fn key(&self) -> &str {
        match self {
            Op::Create { key, .. }
            | Op::Update { key, .. }
            | Op::Put { key, .. }
            | Op::Delete { key, .. } => key,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("conflict on {key}: expected revision {want}, found {have}")]
    Conflict { key: String, want: Rev, have: Rev },
    #[error("{0} already exists")]
    AlreadyExists(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("revision {rev} has been compacted (oldest retained is {oldest}); relist")]
    Compacted { rev: Rev, oldest: Rev },
    #[error("lease {0:x} not found or expired")]
    LeaseNotFound(i64),
    #[error("invalid store URL {0:?}: want sqlite:///abs/path.db or etcd://host:port[,host:port]")]
    Url(String),
    #[error("{0}")]
    Backend(String),
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// What a watch delivers: the events of one revision at a time, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchMsg {
    Events(Rev, Vec<Event>),
    /// The watcher fell behind the retained history: relist, then watch
    /// from the list's revision.
    Compacted(Rev),
}

/// A live watch; dropping it stops the watcher.
pub struct Watch {
    pub rx: tokio::sync::mpsc::Receiver<Result<WatchMsg>>,
    _stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Watch {
    pub(crate) fn new(
        rx: tokio::sync::mpsc::Receiver<Result<WatchMsg>>,
        stop: tokio::sync::oneshot::Sender<()>,
    ) -> Self {
        Watch {
            rx,
            _stop: Some(stop),
        }
    }

    pub async fn next(&mut self) -> Option<Result<WatchMsg>> {
        self.rx.recv().await
    }

    /// `first` followed by every message already queued behind it, so a
    /// burst of events is handled in one pass (one sync, one reconcile).
    pub fn with_queued(
        &mut self,
        first: Option<Result<WatchMsg>>,
    ) -> Vec<Option<Result<WatchMsg>>> {
        let mut msgs = vec![first];
        while let Ok(m) = self.rx.try_recv() {
            msgs.push(Some(m));
        }
        msgs
    }
}

/// The datastore interface both backends implement.
pub trait Store {
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<KeyValue>>> + Send;
    /// Every key under `prefix`, sorted, with the revision of the snapshot.
    fn list(&self, prefix: &str) -> impl Future<Output = Result<(Vec<KeyValue>, Rev)>> + Send;
    /// Applies every op or none; returns the new revision.
    fn txn(&self, ops: Vec<Op>) -> impl Future<Output = Result<Rev>> + Send;
    /// Events under `prefix` with revision >= `from`, in order, no gaps.
    fn watch(&self, prefix: &str, from: Rev) -> impl Future<Output = Result<Watch>> + Send;
    fn grant(&self, ttl_secs: i64) -> impl Future<Output = Result<i64>> + Send;
    fn keepalive(&self, lease: i64) -> impl Future<Output = Result<()>> + Send;
    fn revoke(&self, lease: i64) -> impl Future<Output = Result<()>> + Send;
    fn revision(&self) -> impl Future<Output = Result<Rev>> + Send;
    /// Forgets history up to `rev`; watches from before it get Compacted.
    fn compact(&self, rev: Rev) -> impl Future<Output = Result<()>> + Send;
}

/// Either backend, chosen by URL.
#[derive(Clone)]
pub enum AnyStore {
    Sqlite(sqlite::SqliteStore),
    Etcd(Box<etcd::EtcdStore>),
}

/// Opens a store from its URL (`sqlite:///path.db` or `etcd://h:p,...`).
pub async fn open(url: &str) -> Result<AnyStore> {
    if let Some(path) = url.strip_prefix("sqlite://") {
        if !path.starts_with('/') {
            return Err(StoreError::Url(url.to_string()));
        }
        return Ok(AnyStore::Sqlite(sqlite::SqliteStore::open(path)?));
    }
    if url.starts_with("etcd://") || url.starts_with("etcds://") {
        return Ok(AnyStore::Etcd(Box::new(
            etcd::EtcdStore::connect(url).await?,
        )));
    }
    Err(StoreError::Url(url.to_string()))
}

macro_rules! dispatch {
    ($self:expr, $s:ident => $e:expr) => {
        match $self {
            AnyStore::Sqlite($s) => $e,
            AnyStore::Etcd($s) => $e,
        }
    };
}

impl Store for AnyStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        dispatch!(self, s => s.get(key).await)
    }
    async fn list(&self, prefix: &str) -> Result<(Vec<KeyValue>, Rev)> {
        dispatch!(self, s => s.list(prefix).await)
    }
    async fn txn(&self, ops: Vec<Op>) -> Result<Rev> {
        dispatch!(self, s => s.txn(ops).await)
    }
    async fn watch(&self, prefix: &str, from: Rev) -> Result<Watch> {
        dispatch!(self, s => s.watch(prefix, from).await)
    }
    async fn grant(&self, ttl: i64) -> Result<i64> {
        dispatch!(self, s => s.grant(ttl).await)
    }
    async fn keepalive(&self, lease: i64) -> Result<()> {
        dispatch!(self, s => s.keepalive(lease).await)
    }
    async fn revoke(&self, lease: i64) -> Result<()> {
        dispatch!(self, s => s.revoke(lease).await)
    }
    async fn revision(&self) -> Result<Rev> {
        dispatch!(self, s => s.revision().await)
    }
    async fn compact(&self, rev: Rev) -> Result<()> {
        dispatch!(self, s => s.compact(rev).await)
    }
}

/// Convenience single-op helpers, for every store.
pub trait StoreExt: Store {
    fn create(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: i64,
    ) -> impl Future<Output = Result<Rev>> + Send
    where
        Self: Sync,
    {
        self.txn(vec![Op::Create {
            key: key.to_string(),
            value,
            lease,
        }])
    }
    fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        rev: Rev,
    ) -> impl Future<Output = Result<Rev>> + Send
    where
        Self: Sync,
    {
        self.txn(vec![Op::Update {
            key: key.to_string(),
            value,
            rev,
            lease: 0,
        }])
    }
    fn put(&self, key: &str, value: Vec<u8>) -> impl Future<Output = Result<Rev>> + Send
    where
        Self: Sync,
    {
        self.txn(vec![Op::Put {
            key: key.to_string(),
            value,
            lease: 0,
        }])
    }
    fn delete(&self, key: &str, rev: Option<Rev>) -> impl Future<Output = Result<Rev>> + Send
    where
        Self: Sync,
    {
        self.txn(vec![Op::Delete {
            key: key.to_string(),
            rev,
        }])
    }
}

impl<S: Store> StoreExt for S {}

/// The end of a prefix range: the prefix with its last byte incremented.
pub(crate) fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut b = prefix.as_bytes().to_vec();
    while let Some(last) = b.pop() {
        if last < 0xff {
            b.push(last + 1);
            return b;
        }
    }
    vec![0]
}
