//! The embedded store: etcd's model on one SQLite file, shared by every
//! process on the machine.
//!
//! - `kv` holds the live keys with their create/mod revisions and lease;
//! - `log` holds every change, keyed by (revision, sequence), for watches;
//! - `meta` holds the current and the compacted revision;
//! - `leases` holds lease deadlines.
//!
//! Writes are `BEGIN IMMEDIATE` transactions in WAL mode, so several
//! processes write safely and readers never block. Watchers poll SQLite's
//! `data_version` (a memory read) every couple of milliseconds and read the
//! log from their last revision, so they see other processes' writes in
//! order, with no gaps. Expired leases are swept by whoever touches the store
//! next (writers, readers and watchers), producing delete events.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::{
    prefix_end, Event, EventType, KeyValue, Op, Result, Rev, Store, StoreError, Watch, WatchMsg,
};

/// How many revisions of history watches can resume from.
pub const RETAIN_REVISIONS: i64 = 100_000;
const COMPACT_EVERY: i64 = 1_000;
const POLL: Duration = Duration::from_millis(2);

#[derive(Clone)]
pub struct SqliteStore {
    path: Arc<String>,
    conn: Arc<Mutex<Connection>>,
}

fn be(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(format!("sqlite: {e}"))
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn connect(path: &str) -> Result<Connection> {
    if let Some(dir) = Path::new(path).parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::Backend(format!("creating {}: {e}", dir.display())))?;
    }
    let c =
        Connection::open(path).map_err(|e| StoreError::Backend(format!("opening {path}: {e}")))?;
    c.busy_timeout(OPEN_PATIENCE).map_err(be)?;
    // SQLite answers "locked" at once, without waiting on the busy handler,
    // when two processes open a fresh file together: one is switching it to
    // WAL or creating the schema while the other reads the header. Those
    // steps are idempotent, so they are retried until the patience runs out.
    let deadline = Instant::now() + OPEN_PATIENCE;
    loop {
        match prepare(&c) {
            Err(e) if is_busy(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            r => return r.map(|()| c).map_err(be),
        }
    }
}

/// How long opening waits for other processes that hold the file.
const OPEN_PATIENCE: Duration = Duration::from_secs(30);

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// WAL mode and the schema: safe to run again after a busy failure.
fn prepare(c: &Connection) -> rusqlite::Result<()> {
    c.pragma_update(None, "journal_mode", "WAL")?;
    c.pragma_update(None, "synchronous", "NORMAL")?;
    c.execute_batch(
        "CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY CHECK (id = 0), rev INTEGER NOT NULL, compact INTEGER NOT NULL);
         INSERT OR IGNORE INTO meta VALUES (0, 1, 0);
         CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL, create_rev INTEGER NOT NULL,
                                        mod_rev INTEGER NOT NULL, lease INTEGER NOT NULL DEFAULT 0);
         CREATE INDEX IF NOT EXISTS kv_lease ON kv(lease) WHERE lease != 0;
         CREATE TABLE IF NOT EXISTS log (rev INTEGER NOT NULL, seq INTEGER NOT NULL, key TEXT NOT NULL,
                                         deleted INTEGER NOT NULL, value BLOB NOT NULL, create_rev INTEGER NOT NULL,
                                         lease INTEGER NOT NULL, PRIMARY KEY (rev, seq));
         CREATE TABLE IF NOT EXISTS leases (id INTEGER PRIMARY KEY, ttl INTEGER NOT NULL, expires REAL NOT NULL);
         CREATE INDEX IF NOT EXISTS leases_expires ON leases(expires);",
    )
}

fn current_rev(c: &Connection) -> Result<Rev> {
    c.query_row("SELECT rev FROM meta WHERE id = 0", [], |r| r.get(0))
        .map_err(be)
}

fn any_expired(c: &Connection) -> Result<bool> {
    c.query_row(
        "SELECT EXISTS(SELECT 1 FROM leases WHERE expires < ?1)",
        [now()],
        |r| r.get(0),
    )
    .map_err(be)
}

struct Row {
    value: Vec<u8>,
    create_rev: Rev,
    mod_rev: Rev,
    lease: i64,
}

fn get_row(c: &Connection, key: &str) -> Result<Option<Row>> {
    c.query_row(
        "SELECT value, create_rev, mod_rev, lease FROM kv WHERE key = ?1",
        [key],
        |r| {
            Ok(Row {
                value: r.get(0)?,
                create_rev: r.get(1)?,
                mod_rev: r.get(2)?,
                lease: r.get(3)?,
            })
        },
    )
    .optional()
    .map_err(be)
}

/// Deletes keys of the given leases (and the leases) at one new revision.
fn expire_leases(c: &Connection, ids: &[i64]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut doomed = Vec::new();
    {
        let mut st = c
            .prepare_cached("SELECT key, value, create_rev FROM kv WHERE lease = ?1 ORDER BY key")
            .map_err(be)?;
        for id in ids {
            let rows = st
                .query_map([id], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, Vec<u8>>(1)?,
                        r.get::<_, i64>(2)?,
                        *id,
                    ))
                })
                .map_err(be)?;
            for row in rows {
                doomed.push(row.map_err(be)?);
            }
        }
    }
    if !doomed.is_empty() {
        let rev = current_rev(c)? + 1;
        for (seq, (key, value, create_rev, lease)) in doomed.iter().enumerate() {
            c.execute("DELETE FROM kv WHERE key = ?1", [key])
                .map_err(be)?;
            c.execute(
                "INSERT INTO log VALUES (?1, ?2, ?3, 1, ?4, ?5, ?6)",
                params![rev, seq as i64, key, value, create_rev, lease],
            )
            .map_err(be)?;
        }
        c.execute("UPDATE meta SET rev = ?1 WHERE id = 0", [rev])
            .map_err(be)?;
    }
    for id in ids {
        c.execute("DELETE FROM leases WHERE id = ?1", [id])
            .map_err(be)?;
    }
    Ok(())
}

fn sweep(c: &Connection) -> Result<()> {
    let ids: Vec<i64> = {
        let mut st = c
            .prepare_cached("SELECT id FROM leases WHERE expires < ?1")
            .map_err(be)?;
        let rows = st.query_map([now()], |r| r.get(0)).map_err(be)?;
        rows.collect::<std::result::Result<_, _>>().map_err(be)?
    };
    expire_leases(c, &ids)
}

/// Runs a sweep in its own write transaction, only when something expired.
fn sweep_if_needed(c: &mut Connection) -> Result<()> {
    if any_expired(c)? {
        let tx = c
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(be)?;
        sweep(&tx)?;
        tx.commit().map_err(be)?;
    }
    Ok(())
}

fn lease_alive(c: &Connection, lease: i64) -> Result<bool> {
    c.query_row(
        "SELECT EXISTS(SELECT 1 FROM leases WHERE id = ?1 AND expires >= ?2)",
        params![lease, now()],
        |r| r.get(0),
    )
    .map_err(be)
}

fn apply_txn(c: &mut Connection, ops: &[Op]) -> Result<Rev> {
    let tx = c
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(be)?;
    sweep(&tx)?;
    let mut seen = std::collections::HashSet::new();
    let mut effective = Vec::new();
    for op in ops {
        if !seen.insert(op.key()) {
            return Err(StoreError::Backend(format!(
                "duplicate key {} in one transaction",
                op.key()
            )));
        }
        let cur = get_row(&tx, op.key())?;
        if check_op(&tx, op, cur.as_ref())? {
            effective.push((op, cur));
        }
    }
    let mut rev = current_rev(&tx)?;
    if !effective.is_empty() {
        rev += 1;
        for (seq, (op, cur)) in effective.into_iter().enumerate() {
            write_op(&tx, rev, seq as i64, op, cur)?;
        }
        tx.execute("UPDATE meta SET rev = ?1 WHERE id = 0", [rev])
            .map_err(be)?;
        compact_if_due(&tx, rev)?;
    }
    tx.commit().map_err(be)?;
    Ok(rev)
}

/// Checks `op`'s condition against the key's current row `cur` (existence,
/// expected revision, live lease). `Ok(false)`: the op changes nothing (a
/// delete of a missing key without a revision) and is left out.
fn check_op(c: &Connection, op: &Op, cur: Option<&Row>) -> Result<bool> {
    match op {
        Op::Create { key, .. } if cur.is_some() => {
            return Err(StoreError::AlreadyExists(key.clone()))
        }
        Op::Update { key, rev, .. }
        | Op::Delete {
            key,
            rev: Some(rev),
        } => match cur {
            None => return Err(StoreError::NotFound(key.clone())),
            Some(r) if r.mod_rev != *rev => {
                return Err(StoreError::Conflict {
                    key: key.clone(),
                    want: *rev,
                    have: r.mod_rev,
                })
            }
            _ => {}
        },
        Op::Delete { rev: None, .. } if cur.is_none() => return Ok(false),
        _ => {}
    }
    if let Op::Create { lease, .. } | Op::Update { lease, .. } | Op::Put { lease, .. } = op {
        if *lease != 0 && !lease_alive(c, *lease)? {
            return Err(StoreError::LeaseNotFound(*lease));
        }
    }
    Ok(true)
}

/// Applies one checked op at revision `rev`: the live row in `kv` and its
/// event, number `seq` of the revision, in `log`.
fn write_op(c: &Connection, rev: Rev, seq: i64, op: &Op, cur: Option<Row>) -> Result<()> {
    match op {
        Op::Create { key, value, lease }
        | Op::Update {
            key, value, lease, ..
        }
        | Op::Put { key, value, lease } => {
            let create_rev = cur.as_ref().map(|r| r.create_rev).unwrap_or(rev);
            c.execute(
                "INSERT INTO kv VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(key) DO UPDATE SET value = ?2, mod_rev = ?4, lease = ?5",
                params![key, value, create_rev, rev, lease],
            )
            .map_err(be)?;
            c.execute(
                "INSERT INTO log VALUES (?1, ?2, ?3, 0, ?4, ?5, ?6)",
                params![rev, seq, key, value, create_rev, lease],
            )
            .map_err(be)?;
        }
        Op::Delete { key, .. } => {
            let r = cur.expect("checked above");
            c.execute("DELETE FROM kv WHERE key = ?1", [key])
                .map_err(be)?;
            c.execute(
                "INSERT INTO log VALUES (?1, ?2, ?3, 1, ?4, ?5, ?6)",
                params![rev, seq, key, r.value, r.create_rev, r.lease],
            )
            .map_err(be)?;
        }
    }
    Ok(())
}

/// Every [`COMPACT_EVERY`] revisions, drops the log older than
/// [`RETAIN_REVISIONS`] and records where history now starts.
fn compact_if_due(c: &Connection, rev: Rev) -> Result<()> {
    if rev % COMPACT_EVERY == 0 && rev > RETAIN_REVISIONS {
        let upto = rev - RETAIN_REVISIONS;
        c.execute("DELETE FROM log WHERE rev <= ?1", [upto])
            .map_err(be)?;
        c.execute("UPDATE meta SET compact = ?1 WHERE id = 0", [upto])
            .map_err(be)?;
    }
    Ok(())
}

impl SqliteStore {
    pub fn open(path: &str) -> Result<SqliteStore> {
        let c = connect(path)?;
        Ok(SqliteStore {
            path: Arc::new(path.to_string()),
            conn: Arc::new(Mutex::new(c)),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T>) -> Result<T> {
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut c)
    }
}

/// Events after a revision, with the current and compacted revisions.
type EventBatch = (Vec<(Rev, Event)>, Rev, Rev);

fn read_events(c: &mut Connection, prefix: &str, after: Rev) -> Result<EventBatch> {
    let tx = c.transaction().map_err(be)?;
    let (rev, compact): (Rev, Rev) = tx
        .query_row("SELECT rev, compact FROM meta WHERE id = 0", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .map_err(be)?;
    let mut out = Vec::new();
    if rev > after && compact <= after {
        let end = String::from_utf8(prefix_end(prefix)).unwrap_or_else(|_| "\u{10ffff}".into());
        let mut st = tx
            .prepare_cached(
                "SELECT rev, key, deleted, value, create_rev, lease FROM log
                 WHERE rev > ?1 AND key >= ?2 AND key < ?3 ORDER BY rev, seq",
            )
            .map_err(be)?;
        let rows = st
            .query_map(params![after, prefix, end], |r| {
                let rev: Rev = r.get(0)?;
                let deleted: bool = r.get(2)?;
                Ok((
                    rev,
                    Event {
                        typ: if deleted {
                            EventType::Delete
                        } else {
                            EventType::Put
                        },
                        kv: KeyValue {
                            key: r.get(1)?,
                            value: r.get(3)?,
                            create_rev: r.get(4)?,
                            mod_rev: rev,
                            lease: r.get(5)?,
                        },
                    },
                ))
            })
            .map_err(be)?;
        for row in rows {
            out.push(row.map_err(be)?);
        }
    }
    drop(tx);
    Ok((out, rev, compact))
}

fn watch_loop(
    path: String,
    prefix: String,
    from: Rev,
    tx: tokio::sync::mpsc::Sender<Result<WatchMsg>>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let mut c = match connect(&path) {
        Ok(c) => c,
        Err(e) => {
            let _ = tx.blocking_send(Err(e));
            return;
        }
    };
    let mut last = from - 1;
    let mut version: i64 = -1;
    let mut last_sweep = Instant::now();
    loop {
        if tx.is_closed()
            || !matches!(
                stop.try_recv(),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty)
            )
        {
            return;
        }
        let v: i64 = match c.query_row("PRAGMA data_version", [], |r| r.get(0)) {
            Ok(v) => v,
            Err(e) => {
                let _ = tx.blocking_send(Err(be(e)));
                return;
            }
        };
        if v != version {
            version = v;
            match read_events(&mut c, &prefix, last) {
                Ok((events, rev, compact)) => {
                    if compact > last {
                        let _ = tx.blocking_send(Ok(WatchMsg::Compacted(compact)));
                        return;
                    }
                    let mut batch: Vec<Event> = Vec::new();
                    let mut batch_rev = 0;
                    for (r, ev) in events {
                        if r != batch_rev
                            && !batch.is_empty()
                            && tx
                                .blocking_send(Ok(WatchMsg::Events(
                                    batch_rev,
                                    std::mem::take(&mut batch),
                                )))
                                .is_err()
                        {
                            return;
                        }
                        batch_rev = r;
                        batch.push(ev);
                    }
                    if !batch.is_empty()
                        && tx
                            .blocking_send(Ok(WatchMsg::Events(batch_rev, batch)))
                            .is_err()
                    {
                        return;
                    }
                    last = last.max(rev);
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
        }
        if last_sweep.elapsed() > Duration::from_millis(250) {
            last_sweep = Instant::now();
            if let Err(e) = sweep_if_needed(&mut c) {
                tracing::warn!("lease sweep: {e}");
            }
        }
        std::thread::sleep(POLL);
    }
}

impl Store for SqliteStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        self.with(|c| {
            sweep_if_needed(c)?;
            Ok(get_row(c, key)?.map(|r| KeyValue {
                key: key.to_string(),
                value: r.value,
                create_rev: r.create_rev,
                mod_rev: r.mod_rev,
                lease: r.lease,
            }))
        })
    }

    async fn list(&self, prefix: &str) -> Result<(Vec<KeyValue>, Rev)> {
        self.with(|c| {
            sweep_if_needed(c)?;
            let tx = c.transaction().map_err(be)?;
            let rev = current_rev(&tx)?;
            let end = String::from_utf8(prefix_end(prefix)).unwrap_or_else(|_| "\u{10ffff}".into());
            let mut out = Vec::new();
            {
                let mut st = tx
                    .prepare_cached(
                        "SELECT key, value, create_rev, mod_rev, lease FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key",
                    )
                    .map_err(be)?;
                let rows = st
                    .query_map(params![prefix, end], |r| {
                        Ok(KeyValue {
                            key: r.get(0)?,
                            value: r.get(1)?,
                            create_rev: r.get(2)?,
                            mod_rev: r.get(3)?,
                            lease: r.get(4)?,
                        })
                    })
                    .map_err(be)?;
                for r in rows {
                    out.push(r.map_err(be)?);
                }
            }
            tx.commit().map_err(be)?;
            Ok((out, rev))
        })
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<Rev> {
        self.with(|c| apply_txn(c, &ops))
    }

    async fn watch(&self, prefix: &str, from: Rev) -> Result<Watch> {
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let (path, prefix) = (self.path.to_string(), prefix.to_string());
        std::thread::Builder::new()
            .name("sqlite-watch".into())
            .spawn(move || watch_loop(path, prefix, from, tx, stop_rx))
            .map_err(|e| StoreError::Backend(format!("starting watcher: {e}")))?;
        Ok(Watch::new(rx, stop_tx))
    }

    async fn grant(&self, ttl: i64) -> Result<i64> {
        self.with(|c| {
            let mut id: i64 = 0;
            while id <= 0 {
                let mut b = [0u8; 8];
                // SAFETY: valid buffer.
                unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 8, 0) };
                id = i64::from_ne_bytes(b) & 0x7fff_ffff_ffff_ffff;
            }
            c.execute(
                "INSERT INTO leases VALUES (?1, ?2, ?3)",
                params![id, ttl, now() + ttl as f64],
            )
            .map_err(be)?;
            Ok(id)
        })
    }

    async fn keepalive(&self, lease: i64) -> Result<()> {
        self.with(|c| {
            sweep_if_needed(c)?;
            let n = c
                .execute(
                    "UPDATE leases SET expires = ?2 + ttl WHERE id = ?1 AND expires >= ?2",
                    params![lease, now()],
                )
                .map_err(be)?;
            if n == 0 {
                return Err(StoreError::LeaseNotFound(lease));
            }
            Ok(())
        })
    }

    async fn revoke(&self, lease: i64) -> Result<()> {
        self.with(|c| {
            let tx = c
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(be)?;
            expire_leases(&tx, &[lease])?;
            tx.commit().map_err(be)
        })
    }

    async fn revision(&self) -> Result<Rev> {
        self.with(|c| current_rev(c))
    }

    async fn compact(&self, rev: Rev) -> Result<()> {
        self.with(|c| {
            let tx = c
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(be)?;
            tx.execute("DELETE FROM log WHERE rev <= ?1", [rev])
                .map_err(be)?;
            tx.execute(
                "UPDATE meta SET compact = MAX(compact, ?1) WHERE id = 0",
                [rev],
            )
            .map_err(be)?;
            tx.commit().map_err(be)
        })
    }
}
