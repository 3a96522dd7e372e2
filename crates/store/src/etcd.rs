//! The etcd v3 backend. Transactions map to etcd `Txn` with one compare per
//! conditional op; watches resume from their last revision when the
//! connection drops (an etcd restart loses no event), and report compaction
//! so the caller relists.
//!
//! URL: `etcd://host:port[,host:port...]`; TLS with
//! `etcds://host:port?ca=/path/ca.pem&cert=/path/client.pem&key=/path/client-key.pem`.

use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType as EtcdEventType,
    GetOptions, Identity, PutOptions, TlsOptions, Txn, TxnOp, WatchOptions, WatchResponse,
    WatchStream,
};

use crate::{Event, EventType, KeyValue, Op, Result, Rev, Store, StoreError, Watch, WatchMsg};

#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
}

fn be(e: etcd_client::Error) -> StoreError {
    StoreError::Backend(format!("etcd: {e}"))
}

fn kv(k: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(k.key()).into_owned(),
        value: k.value().to_vec(),
        create_rev: k.create_revision(),
        mod_rev: k.mod_revision(),
        lease: k.lease(),
    }
}

/// Endpoints and connection options from an etcd URL.
/// TLS files from an etcds:// URL: the CA, and the client cert and key.
pub type TlsFiles = (String, Option<(String, String)>);

pub fn parse_url(url: &str) -> Result<(Vec<String>, Option<TlsFiles>)> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("etcds://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("etcd://") {
        (false, r)
    } else {
        return Err(StoreError::Url(url.to_string()));
    };
    let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
    let scheme = if tls { "https" } else { "http" };
    let eps: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("{scheme}://{}", h.trim_end_matches('/')))
        .collect();
    if eps.is_empty() {
        return Err(StoreError::Url(url.to_string()));
    }
    let q: std::collections::HashMap<&str, &str> = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let tls_opts = if tls {
        let ca = q
            .get("ca")
            .map(|s| s.to_string())
            .ok_or_else(|| StoreError::Url(format!("{url} (etcds:// needs ?ca=PATH)")))?;
        let ident = match (q.get("cert"), q.get("key")) {
            (Some(c), Some(k)) => Some((c.to_string(), k.to_string())),
            (None, None) => None,
            _ => return Err(StoreError::Url(format!("{url} (cert and key go together)"))),
        };
        Some((ca, ident))
    } else {
        None
    };
    Ok((eps, tls_opts))
}

fn read(path: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| StoreError::Backend(format!("reading {path}: {e}")))
}

impl EtcdStore {
    pub async fn connect(url: &str) -> Result<EtcdStore> {
        let (eps, tls) = parse_url(url)?;
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5));
        if let Some((ca, ident)) = tls {
            let mut t = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&ca)?));
            if let Some((c, k)) = ident {
                t = t.identity(Identity::from_pem(read(&c)?, read(&k)?));
            }
            opts = opts.with_tls(t);
        }
        let client = Client::connect(eps, Some(opts)).await.map_err(be)?;
        Ok(EtcdStore { client })
    }

    /// After a failed txn, finds which condition failed, for a precise error.
    async fn explain(&self, ops: &[Op]) -> StoreError {
        for op in ops {
            let cur = match self.get(op.key()).await {
                Ok(c) => c,
                Err(e) => return e,
            };
            match (op, cur) {
                (Op::Create { key, .. }, Some(_)) => return StoreError::AlreadyExists(key.clone()),
                (Op::Update { key, .. }, None) | (Op::Delete { key, rev: Some(_) }, None) => {
                    return StoreError::NotFound(key.clone())
                }
                (Op::Update { key, rev, .. }, Some(c))
                | (
                    Op::Delete {
                        key,
                        rev: Some(rev),
                    },
                    Some(c),
                ) if c.mod_rev != *rev => {
                    return StoreError::Conflict {
                        key: key.clone(),
                        want: *rev,
                        have: c.mod_rev,
                    }
                }
                _ => {}
            }
        }
        StoreError::Backend("etcd: transaction condition failed".into())
    }
}

fn watch_opts(from: Rev) -> WatchOptions {
    WatchOptions::new()
        .with_prefix()
        .with_start_revision(from)
        .with_prev_key()
}

type WatchTx = tokio::sync::mpsc::Sender<Result<WatchMsg>>;
type StopRx = tokio::sync::oneshot::Receiver<()>;

/// The task behind a [`Watch`]: forwards etcd's responses until the Watch
/// is dropped or history is compacted past it, and outlives etcd restarts
/// by resuming from the next unseen revision.
async fn pump_watch(
    client: Client,
    prefix: String,
    from: Rev,
    mut stream: WatchStream,
    tx: WatchTx,
    mut stop_rx: StopRx,
) {
    let mut next = from;
    loop {
        let msg = tokio::select! {
            _ = &mut stop_rx => return,
            m = stream.message() => m,
        };
        if let Ok(Some(resp)) = msg {
            if resp.compact_revision() > 0 {
                let _ = tx
                    .send(Ok(WatchMsg::Compacted(resp.compact_revision())))
                    .await;
                return;
            }
            // A cancelled watch is treated like a dropped connection: resume.
            if !resp.canceled() {
                if !forward_events(&resp, &tx, &mut next).await {
                    return;
                }
                continue;
            }
        }
        // The stream ended (etcd restarted or the connection broke):
        // reconnect and resume from the next unseen revision.
        match reconnect(&client, &prefix, next, &tx, &mut stop_rx).await {
            Some(s) => stream = s,
            None => return,
        }
    }
}

/// Sends a response's events, one [`WatchMsg::Events`] per revision, and
/// moves `next` past each. `false`: the Watch was dropped.
async fn forward_events(resp: &WatchResponse, tx: &WatchTx, next: &mut Rev) -> bool {
    let mut batch: Vec<Event> = Vec::new();
    let mut batch_rev = 0;
    for ev in resp.events() {
        let Some(event) = store_event(ev) else {
            continue;
        };
        let rev = event.kv.mod_rev;
        if rev != batch_rev
            && !batch.is_empty()
            && tx
                .send(Ok(WatchMsg::Events(batch_rev, std::mem::take(&mut batch))))
                .await
                .is_err()
        {
            return false;
        }
        batch_rev = rev;
        batch.push(event);
        *next = rev + 1;
    }
    batch.is_empty()
        || tx
            .send(Ok(WatchMsg::Events(batch_rev, batch)))
            .await
            .is_ok()
}

/// One etcd event as the store reports it; a delete carries the value it
/// deleted (etcd's previous kv), as the sqlite backend's log does.
fn store_event(ev: &etcd_client::Event) -> Option<Event> {
    let mut item = kv(ev.kv()?);
    let typ = match ev.event_type() {
        EtcdEventType::Put => EventType::Put,
        EtcdEventType::Delete => {
            if let Some(p) = ev.prev_kv() {
                item.value = p.value().to_vec();
                item.create_rev = p.create_revision();
                item.lease = p.lease();
            }
            EventType::Delete
        }
    };
    Some(Event { typ, kv: item })
}

/// Opens the watch again from revision `next`, retrying every 100 ms.
/// `None`: the Watch was dropped meanwhile.
async fn reconnect(
    client: &Client,
    prefix: &str,
    next: Rev,
    tx: &WatchTx,
    stop_rx: &mut StopRx,
) -> Option<WatchStream> {
    loop {
        if tx.is_closed() {
            return None;
        }
        tokio::select! {
            _ = &mut *stop_rx => return None,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        // While etcd is down the attempt may wait for it: a
        // dropped Watch must still end this task.
        let mut c = client.clone();
        let attempt = tokio::select! {
            _ = &mut *stop_rx => return None,
            a = c.watch(prefix, Some(watch_opts(next))) => a,
        };
        match attempt {
            Ok(s) => return Some(s),
            Err(e) => tracing::debug!("etcd watch reconnect: {e}"),
        }
    }
}

impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let r = self.client.clone().get(key, None).await.map_err(be)?;
        Ok(r.kvs().first().map(kv))
    }

    async fn list(&self, prefix: &str) -> Result<(Vec<KeyValue>, Rev)> {
        let r = self
            .client
            .clone()
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(be)?;
        let rev = r.header().map(|h| h.revision()).unwrap_or(0);
        Ok((r.kvs().iter().map(kv).collect(), rev))
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<Rev> {
        let mut cmps = Vec::new();
        let mut acts = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for op in &ops {
            if !seen.insert(op.key().to_string()) {
                return Err(StoreError::Backend(format!(
                    "duplicate key {} in one transaction",
                    op.key()
                )));
            }
            let put = |key: &str, value: &[u8], lease: i64| {
                let o = if lease != 0 {
                    Some(PutOptions::new().with_lease(lease))
                } else {
                    None
                };
                TxnOp::put(key, value.to_vec(), o)
            };
            match op {
                Op::Create { key, value, lease } => {
                    cmps.push(Compare::create_revision(key.as_str(), CompareOp::Equal, 0));
                    acts.push(put(key, value, *lease));
                }
                Op::Update {
                    key,
                    value,
                    rev,
                    lease,
                } => {
                    cmps.push(Compare::mod_revision(key.as_str(), CompareOp::Equal, *rev));
                    acts.push(put(key, value, *lease));
                }
                Op::Put { key, value, lease } => acts.push(put(key, value, *lease)),
                Op::Delete { key, rev } => {
                    if let Some(rev) = rev {
                        cmps.push(Compare::mod_revision(key.as_str(), CompareOp::Equal, *rev));
                    }
                    acts.push(TxnOp::delete(key.as_str(), None));
                }
            }
        }
        let r = self
            .client
            .clone()
            .txn(Txn::new().when(cmps).and_then(acts))
            .await
            .map_err(|e| {
                let s = e.to_string();
                if s.contains("requested lease not found") {
                    let lease = ops
                        .iter()
                        .find_map(|o| match o {
                            Op::Create { lease, .. }
                            | Op::Update { lease, .. }
                            | Op::Put { lease, .. }
                                if *lease != 0 =>
                            {
                                Some(*lease)
                            }
                            _ => None,
                        })
                        .unwrap_or(0);
                    StoreError::LeaseNotFound(lease)
                } else {
                    be(e)
                }
            })?;
        if !r.succeeded() {
            return Err(self.explain(&ops).await);
        }
        Ok(r.header().map(|h| h.revision()).unwrap_or(0))
    }

    async fn watch(&self, prefix: &str, from: Rev) -> Result<Watch> {
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let client = self.client.clone();
        let prefix = prefix.to_string();
        // Fail fast on a bad connection, like the sqlite backend.
        let stream = client
            .clone()
            .watch(prefix.as_str(), Some(watch_opts(from)))
            .await
            .map_err(be)?;
        tokio::spawn(pump_watch(client, prefix, from, stream, tx, stop_rx));
        Ok(Watch::new(rx, stop_tx))
    }

    async fn grant(&self, ttl: i64) -> Result<i64> {
        let r = self
            .client
            .clone()
            .lease_grant(ttl, None)
            .await
            .map_err(be)?;
        Ok(r.id())
    }

    async fn keepalive(&self, lease: i64) -> Result<()> {
        let gone = |e: etcd_client::Error| {
            if e.to_string().contains("not found") {
                StoreError::LeaseNotFound(lease)
            } else {
                be(e)
            }
        };
        let (mut keeper, mut stream) = self
            .client
            .clone()
            .lease_keep_alive(lease)
            .await
            .map_err(gone)?;
        keeper.keep_alive().await.map_err(gone)?;
        match stream.message().await.map_err(gone)? {
            Some(r) if r.ttl() > 0 => Ok(()),
            _ => Err(StoreError::LeaseNotFound(lease)),
        }
    }

    async fn revoke(&self, lease: i64) -> Result<()> {
        match self.client.clone().lease_revoke(lease).await {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("not found") => Ok(()),
            Err(e) => Err(be(e)),
        }
    }

    async fn compact(&self, rev: Rev) -> Result<()> {
        self.client.clone().compact(rev, None).await.map_err(be)?;
        Ok(())
    }

    async fn revision(&self) -> Result<Rev> {
        let r = self.client.clone().get("\0", None).await.map_err(be)?;
        Ok(r.header().map(|h| h.revision()).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let (eps, tls) = parse_url("etcd://127.0.0.1:2379,10.0.0.2:2379").unwrap();
        assert_eq!(eps, vec!["http://127.0.0.1:2379", "http://10.0.0.2:2379"]);
        assert!(tls.is_none());
        let (eps, tls) = parse_url("etcds://e:2379?ca=/ca.pem&cert=/c.pem&key=/k.pem").unwrap();
        assert_eq!(eps, vec!["https://e:2379"]);
        assert_eq!(tls.unwrap().1.unwrap().0, "/c.pem");
        assert!(parse_url("etcds://e:2379").is_err());
        assert!(parse_url("etcd://").is_err());
    }
}
