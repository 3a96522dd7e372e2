//! The object source's hub against a real store (sqlite in a temporary
//! directory): each subscription gets its kinds and only those, `Ready`
//! only after every kind's first list, later changes as deltas, a reader
//! that falls behind loses nothing, and a stopped source ends its
//! subscriptions. (A relist after a gap delivering only the difference is
//! the cache's, unit-tested in `cache.rs`.)

use std::collections::BTreeSet;
use std::time::Duration;

use podnet_api::{Kind, Object};
use podnet_source::{Batch, Delta, Source, Subscription};
use podnet_store::objects::Objects;
use podnet_store::Store;

/// How long one batch may take to arrive (a bound, not a pacing).
const WAIT: Duration = Duration::from_secs(20);

fn object(kind: &str, name: &str) -> Object {
    let o = match kind {
        "Service" => serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.9", "ports": [{"port": 80}]}
        }),
        _ => serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "i"}]}
        }),
    };
    Object::from_value(o).unwrap()
}

async fn store() -> (tempfile::TempDir, Objects) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("s.db").display());
    let s = podnet_store::open(&url).await.unwrap();
    (dir, Objects::new(s))
}

async fn next(sub: &mut Subscription) -> Batch {
    tokio::time::timeout(WAIT, sub.next_batch())
        .await
        .expect("a batch in time")
        .expect("the subscription is open")
}

/// Batches until `Ready`; the names of every object added meanwhile.
async fn until_ready(sub: &mut Subscription) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    loop {
        let b = next(sub).await;
        for d in &b.deltas {
            if let Delta::Added(o) = d {
                names.insert(format!("{:?}/{}", o.kind(), o.name()));
            }
        }
        if b.ready {
            return names;
        }
    }
}

fn source(s: &Objects) -> Source {
    let m = podnet_daemon::Metrics::new();
    Source::store(s.store.clone(), m.store_watch("test"))
}

#[tokio::test]
async fn each_subscriber_gets_its_kinds_and_ready_after_every_first_list() {
    let (_d, s) = store().await;
    s.create(object("Service", "web"), vec![]).await.unwrap();
    s.create(object("Pod", "p1"), vec![]).await.unwrap();
    let mut src = source(&s);
    let mut services = src.subscribe(&[Kind::Service]);
    let mut both = src.subscribe(&[Kind::Service, Kind::Pod]);
    let _run = src.start();
    assert_eq!(
        until_ready(&mut services).await,
        BTreeSet::from(["Service/web".to_string()])
    );
    assert_eq!(
        until_ready(&mut both).await,
        BTreeSet::from(["Service/web".to_string(), "Pod/p1".to_string()])
    );
    // After Ready: a change is one delta, to the subscribers of its kind.
    s.create(object("Pod", "p2"), vec![]).await.unwrap();
    s.create(object("Service", "api"), vec![]).await.unwrap();
    let mut seen = BTreeSet::new();
    while seen.len() < 2 {
        for d in next(&mut both).await.deltas {
            seen.insert(d.key().name);
        }
    }
    assert_eq!(seen, BTreeSet::from(["p2".into(), "api".into()]));
    let b = next(&mut services).await;
    let names: Vec<String> = b.deltas.iter().map(|d| d.key().name).collect();
    assert_eq!(names, ["api"], "a Service subscriber got another kind");
}

#[tokio::test]
async fn a_reader_that_falls_behind_loses_nothing() {
    let (_d, s) = store().await;
    let mut src = source(&s);
    let mut slow = src.subscribe(&[Kind::Pod]);
    let _run = src.start();
    assert!(until_ready(&mut slow).await.is_empty());
    // Many changes while nobody reads: the source waits for the reader.
    const N: usize = 300;
    for i in 0..N {
        s.create(object("Pod", &format!("p{i}")), vec![])
            .await
            .unwrap();
    }
    let mut seen = BTreeSet::new();
    while seen.len() < N {
        for d in next(&mut slow).await.deltas {
            assert!(matches!(d, Delta::Added(_)), "{d:?}");
            seen.insert(d.key().name);
        }
    }
    assert_eq!(seen.len(), N);
}

#[tokio::test]
async fn a_stopped_source_ends_its_subscriptions_and_a_new_one_lists_after_compaction() {
    let (_d, s) = store().await;
    s.create(object("Pod", "kept"), vec![]).await.unwrap();
    s.create(object("Pod", "gone"), vec![]).await.unwrap();
    let mut src = source(&s);
    let mut sub = src.subscribe(&[Kind::Pod]);
    let run = src.start();
    assert_eq!(until_ready(&mut sub).await.len(), 2);
    // The source stops; meanwhile one object goes, one comes, and the
    // history is compacted past the source's revision.
    drop(run);
    assert!(
        tokio::time::timeout(WAIT, sub.next_batch())
            .await
            .unwrap()
            .is_none(),
        "a stopped source ends its subscriptions"
    );
    s.delete(Kind::Pod, Some("default"), "gone", None, vec![])
        .await
        .unwrap();
    s.create(object("Pod", "new"), vec![]).await.unwrap();
    let rev = s.store.revision().await.unwrap();
    s.store.compact(rev).await.unwrap();
    // A new source lists again from scratch: everything now, no stale.
    let mut src = source(&s);
    let mut sub = src.subscribe(&[Kind::Pod]);
    let _run = src.start();
    assert_eq!(
        until_ready(&mut sub).await,
        BTreeSet::from(["Pod/kept".to_string(), "Pod/new".to_string()])
    );
}
