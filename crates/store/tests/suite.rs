//! The shared store suite: every test runs against sqlite and a real etcd.

use std::time::{Duration, Instant};

use podnet_store::{AnyStore, EventType, Op, Store, StoreError, StoreExt, WatchMsg};
use podnet_testkit::{eventually_async, Etcd};

struct Fixture {
    store: AnyStore,
    _dir: Option<tempfile::TempDir>,
    _etcd: Option<Etcd>,
    pub path: Option<std::path::PathBuf>,
}

async fn sqlite() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let store = podnet_store::open(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    Fixture {
        store,
        _dir: Some(dir),
        _etcd: None,
        path: Some(path),
    }
}

async fn etcd() -> (Fixture, String) {
    let e = Etcd::start();
    let url = e.url();
    let store = podnet_store::open(&url).await.unwrap();
    (
        Fixture {
            store,
            _dir: None,
            _etcd: Some(e),
            path: None,
        },
        url,
    )
}

/// Collects watch events until `n` arrive or a few seconds pass.
async fn collect(w: &mut podnet_store::Watch, n: usize) -> Vec<(i64, String, EventType)> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, w.next()).await {
            Ok(Some(Ok(WatchMsg::Events(_, evs)))) => {
                for e in evs {
                    out.push((e.kv.mod_rev, e.kv.key, e.typ));
                }
            }
            Ok(Some(Ok(WatchMsg::Compacted(r)))) => panic!("unexpected compaction at {r}"),
            Ok(Some(Err(e))) => panic!("watch error: {e}"),
            Ok(None) | Err(_) => break,
        }
    }
    out
}

async fn crud_and_cas(s: &AnyStore) {
    let r1 = s.create("/t/a", b"1".to_vec(), 0).await.unwrap();
    assert_eq!(
        s.create("/t/a", b"x".to_vec(), 0).await.unwrap_err(),
        StoreError::AlreadyExists("/t/a".into())
    );
    let kv = s.get("/t/a").await.unwrap().unwrap();
    assert_eq!(
        (kv.value.as_slice(), kv.create_rev, kv.mod_rev),
        (&b"1"[..], r1, r1)
    );
    let r2 = s.update("/t/a", b"2".to_vec(), r1).await.unwrap();
    assert!(r2 > r1);
    // A stale resourceVersion is a conflict and changes nothing.
    match s.update("/t/a", b"3".to_vec(), r1).await.unwrap_err() {
        StoreError::Conflict { want, have, .. } => assert_eq!((want, have), (r1, r2)),
        e => panic!("{e}"),
    }
    assert_eq!(s.get("/t/a").await.unwrap().unwrap().value, b"2");
    assert!(matches!(
        s.update("/t/zz", b"".to_vec(), 5).await.unwrap_err(),
        StoreError::NotFound(_)
    ));
    s.create("/t/b", b"b".to_vec(), 0).await.unwrap();
    s.create("/u/c", b"c".to_vec(), 0).await.unwrap();
    let (items, rev) = s.list("/t/").await.unwrap();
    assert_eq!(
        items.iter().map(|k| k.key.as_str()).collect::<Vec<_>>(),
        ["/t/a", "/t/b"]
    );
    assert!(rev >= r2);
    // Transactions are all-or-nothing.
    let e = s
        .txn(vec![
            Op::Create {
                key: "/t/new".into(),
                value: b"n".to_vec(),
                lease: 0,
            },
            Op::Create {
                key: "/t/b".into(),
                value: b"dup".to_vec(),
                lease: 0,
            },
        ])
        .await
        .unwrap_err();
    assert_eq!(e, StoreError::AlreadyExists("/t/b".into()));
    assert!(s.get("/t/new").await.unwrap().is_none());
    // Delete with and without a revision; deleting a missing key is fine.
    let b = s.get("/t/b").await.unwrap().unwrap();
    assert!(matches!(
        s.delete("/t/b", Some(b.mod_rev - 1)).await.unwrap_err(),
        StoreError::Conflict { .. }
    ));
    s.delete("/t/b", Some(b.mod_rev)).await.unwrap();
    s.delete("/t/b", None).await.unwrap();
    assert!(s.get("/t/b").await.unwrap().is_none());
}

async fn watch_in_order_and_resume(s: &AnyStore) {
    let start = s.revision().await.unwrap() + 1;
    let mut w = s.watch("/w/", start).await.unwrap();
    for i in 0..50 {
        s.put(&format!("/w/{i:02}"), vec![i as u8]).await.unwrap();
        s.put("/other/x", vec![i as u8]).await.unwrap();
    }
    s.delete("/w/07", None).await.unwrap();
    let got = collect(&mut w, 51).await;
    assert_eq!(got.len(), 51, "missed events");
    assert!(
        got.windows(2).all(|p| p[0].0 < p[1].0),
        "events out of order or duplicated"
    );
    assert!(got.iter().all(|e| e.1.starts_with("/w/")));
    assert_eq!(got[50].2, EventType::Delete);
    // A client that stopped after 20 events resumes from the next revision
    // and misses nothing.
    let resume = got[19].0 + 1;
    drop(w);
    let mut w2 = s.watch("/w/", resume).await.unwrap();
    let again = collect(&mut w2, 31).await;
    assert_eq!(again, got[20..].to_vec());
}

async fn compaction_says_relist(s: &AnyStore) {
    let r = s.put("/c/a", b"1".to_vec()).await.unwrap();
    s.put("/c/a", b"2".to_vec()).await.unwrap();
    let now = s.put("/c/a", b"3".to_vec()).await.unwrap();
    s.compact(now).await.unwrap();
    let mut w = s.watch("/c/", r).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(5), w.next()).await {
        Ok(Some(Ok(WatchMsg::Compacted(c)))) => assert!(c >= r),
        Ok(Some(Err(StoreError::Compacted { .. }))) => {}
        other => panic!("expected a compaction signal, got {other:?}"),
    }
}

async fn leases_expire_and_renew(s: &AnyStore) {
    let short = s.grant(1).await.unwrap();
    let kept = s.grant(2).await.unwrap();
    s.txn(vec![Op::Create {
        key: "/l/short".into(),
        value: b"s".to_vec(),
        lease: short,
    }])
    .await
    .unwrap();
    s.txn(vec![Op::Create {
        key: "/l/kept".into(),
        value: b"k".to_vec(),
        lease: kept,
    }])
    .await
    .unwrap();
    let rev = s.revision().await.unwrap();
    let mut w = s.watch("/l/", rev + 1).await.unwrap();
    eventually_async(
        "the leased key to expire",
        Duration::from_secs(8),
        move || async move {
            s.keepalive(kept).await.unwrap();
            s.get("/l/short").await.unwrap().is_none()
        },
    )
    .await;
    // Keepalives keep the other alive past its own TTL: time passes on
    // purpose here (3 s against a 2 s TTL), nothing is awaited.
    for _ in 0..15 {
        s.keepalive(kept).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(s.get("/l/kept").await.unwrap().is_some());
    assert!(matches!(
        s.keepalive(short).await.unwrap_err(),
        StoreError::LeaseNotFound(_)
    ));
    let ev = collect(&mut w, 1).await;
    assert_eq!((ev[0].1.as_str(), ev[0].2), ("/l/short", EventType::Delete));
    s.revoke(kept).await.unwrap();
    assert!(s.get("/l/kept").await.unwrap().is_none());
    assert!(matches!(
        s.txn(vec![Op::Put {
            key: "/l/x".into(),
            value: vec![],
            lease: short
        }])
        .await
        .unwrap_err(),
        StoreError::LeaseNotFound(_)
    ));
}

macro_rules! both {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let f = super::sqlite().await;
                super::$name(&f.store).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn etcd() {
                let (f, _) = super::etcd().await;
                super::$name(&f.store).await;
            }
        }
    };
}

both!(crud_and_cas);
both!(watch_in_order_and_resume);
both!(compaction_says_relist);
both!(leases_expire_and_renew);

/// A second process writing to the same sqlite file while this one watches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_processes_write_and_watch() {
    let f = sqlite().await;
    let path = f.path.clone().unwrap();
    let start = f.store.revision().await.unwrap() + 1;
    let mut w = f.store.watch("/mp/", start).await.unwrap();
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_process_writer",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("PODNET_STORE_HELPER_DB", &path)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Meanwhile this process writes too.
    for i in 0..100 {
        f.store
            .put(&format!("/mp/parent-{i:03}"), vec![1])
            .await
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let got = collect(&mut w, 200).await;
    assert_eq!(got.len(), 200);
    assert_eq!(got.iter().filter(|e| e.1.contains("child")).count(), 100);
    assert!(got.windows(2).all(|p| p[0].0 < p[1].0));
}

/// Not a test on its own: the child half of the test above, which runs
/// it by name (so it shows as ignored, never as a pass, in a normal run).
#[tokio::test]
#[ignore = "the child half of the multi-process watch test, which runs it"]
async fn helper_process_writer() {
    let db = std::env::var("PODNET_STORE_HELPER_DB")
        .expect("run only by the multi-process watch test, which sets PODNET_STORE_HELPER_DB");
    let s = podnet_store::open(&format!("sqlite://{db}")).await.unwrap();
    for i in 0..100 {
        s.put(&format!("/mp/child-{i:03}"), vec![2]).await.unwrap();
    }
}

/// Processes that start together (a controller and the first `podnet
/// apply`) open a fresh file at once: every one gets the store, whichever
/// of them creates the schema and turns WAL on.
#[test]
fn sqlite_processes_opening_a_fresh_file_together_all_succeed() {
    for round in 0..100 {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let children: Vec<_> = (0..6)
            .map(|_| {
                std::process::Command::new(std::env::current_exe().unwrap())
                    .args(["--exact", "helper_process_opener", "--ignored"])
                    .args(["--nocapture", "--test-threads", "1"])
                    .env("PODNET_STORE_HELPER_DB", &db)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "round {round}: an opener failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
        }
    }
}

/// Not a test on its own: one of the openers of the test above.
#[tokio::test]
#[ignore = "a child of the concurrent-open test, which runs it"]
async fn helper_process_opener() {
    let db = std::env::var("PODNET_STORE_HELPER_DB")
        .expect("run only by the concurrent-open test, which sets PODNET_STORE_HELPER_DB");
    let s = podnet_store::open(&format!("sqlite://{db}")).await.unwrap();
    s.revision().await.unwrap();
}

/// etcd dies and comes back in the middle of a watch: no event is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restart_mid_watch_loses_nothing() {
    let mut e = Etcd::start();
    let url = e.url();
    let s = podnet_store::open(&url).await.unwrap();
    let start = s.revision().await.unwrap() + 1;
    let mut w = s.watch("/r/", start).await.unwrap();
    for i in 0..10 {
        s.put(&format!("/r/before-{i}"), vec![]).await.unwrap();
    }
    let first = collect(&mut w, 10).await;
    assert_eq!(first.len(), 10);
    e.kill();
    // Writes land while the watcher is disconnected (through a new client
    // after the restart).
    e.restart();
    let s2 = podnet_store::open(&url).await.unwrap();
    let s2 = &s2;
    for i in 0..10 {
        let key = &format!("/r/after-{i}");
        eventually_async("etcd back for writes", Duration::from_secs(10), move || {
            s2.put(key, vec![])
        })
        .await;
    }
    let rest = collect(&mut w, 10).await;
    assert_eq!(rest.len(), 10, "lost events across the restart: {rest:?}");
    assert!(rest.iter().all(|e| e.1.contains("after")));
    assert!(rest[0].0 > first[9].0);
}
