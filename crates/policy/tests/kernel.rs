//! The policy plane against a real kernel, in a fresh namespace: the first
//! sync builds the table, changes cost elements only, a repeated sync
//! changes nothing, and what someone else deletes is put back.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use podnet_api::Object;
use podnet_nft::model::{Family, Value};
use podnet_nft::netlink::Conn;
use podnet_policy::dataplane::{Dirty, Options, PolicyInput, PolicyPlane};
use podnet_policy::plan::{self, SetId};
use podnet_policy::{Key, World};
use podnet_reconcile::{sync, Scope, Subsystem};
use podnet_source::Delta;
use podnet_testkit::{require_root, TestNs};
use serde_json::json;

fn pod(ns: &str, name: &str, ip: &str, labels: serde_json::Value) -> Delta {
    Delta::Updated(Arc::new(Object::Pod(Box::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
        }))
        .unwrap(),
    ))))
}

fn ns(name: &str) -> Delta {
    Delta::Added(Arc::new(Object::Namespace(Box::new(
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {"ns": name}}}))
            .unwrap(),
    ))))
}

fn netpol(ns: &str, name: &str, spec: serde_json::Value) -> Delta {
    Delta::Updated(Arc::new(Object::NetworkPolicy(Box::new(
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns}, "spec": spec}))
            .unwrap(),
    ))))
}

struct Fixture {
    ns: TestNs,
    plane: PolicyPlane,
}

impl Fixture {
    fn new(tag: &str) -> Fixture {
        require_root();
        let ns = TestNs::new(tag);
        let plane = ns.run(plane).expect("plane");
        Fixture { ns, plane }
    }

    /// Watches `deltas` and syncs what they dirtied; returns the ops sent.
    fn feed(&mut self, deltas: Vec<Delta>) -> usize {
        let mut dirty = BTreeSet::new();
        self.plane.watch(PolicyInput::Deltas(deltas), &mut dirty);
        sync(&mut self.plane, &Scope::Only(dirty)).expect("sync")
    }

    fn full(&mut self) -> usize {
        sync(&mut self.plane, &Scope::Full).expect("full sync")
    }

    fn has(&self, set: SetId, key: Vec<Value>) -> bool {
        let decl = set.decl(false);
        self.ns.run(|| {
            let mut c = Conn::open().unwrap();
            c.elements(Family::Ip, plan::TABLE, &set.name(), &decl)
                .unwrap()
                .is_some_and(|s| s.elements.contains_key(&key))
        })
    }
}

fn a(s: &str) -> Value {
    Value::Addr(s.parse().unwrap())
}

#[test]
fn changes_are_elements_and_a_repeated_sync_is_nothing() {
    let mut f = Fixture::new("polk");
    let mut dirty = BTreeSet::new();
    f.plane.watch(
        PolicyInput::Subnets(vec!["10.9.1.0/24".parse().unwrap()]),
        &mut dirty,
    );
    f.plane.watch(
        PolicyInput::Deltas(vec![
            ns("x"),
            ns("y"),
            pod("x", "a", "10.9.1.2", json!({"pod": "a"})),
            pod("x", "b", "10.9.1.3", json!({"pod": "b"})),
            pod("y", "c", "10.9.2.4", json!({"pod": "c"})),
            netpol(
                "x",
                "web",
                json!({"podSelector": {"matchLabels": {"pod": "a"}},
                       "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}],
                                    "ports": [{"port": 80}]}]}),
            ),
        ]),
        &mut dirty,
    );
    assert!(f.full() > 0, "the first sync builds the table");
    assert_eq!(f.full(), 0, "a repeated full sync changes nothing");
    let want = [
        a("10.9.1.2"),
        a("10.9.2.4"),
        Value::Proto(podnet_nft::model::Proto::Tcp),
        Value::Port(80),
    ];
    assert!(f.has(SetId::InIsolated, vec![a("10.9.1.2")]));
    assert!(f.has(SetId::InPodPort, want.to_vec()));
    assert!(!f.has(SetId::InIsolated, vec![a("10.9.1.3")]));

    // y/c loses its namespace's match: one pod change, its element goes.
    let ops = f.feed(vec![
        pod("y", "c", "10.9.2.4", json!({"pod": "c"})),
        Delta::Updated(Arc::new(Object::Namespace(Box::new(
            serde_json::from_value(json!({"metadata": {"name": "y", "labels": {"ns": "other"}}}))
                .unwrap(),
        )))),
    ]);
    assert_eq!(ops, 1, "one element removed");
    assert!(!f.has(SetId::InPodPort, want.to_vec()));
    assert_eq!(f.feed(vec![]), 0);
    assert_eq!(
        f.full(),
        0,
        "the incremental path left what a full plan wants"
    );

    // x/b gets label pod=a: it becomes isolated (and keeps its pods entry).
    let ops = f.feed(vec![pod("x", "b", "10.9.1.3", json!({"pod": "a"}))]);
    assert_eq!(ops, 2, "in-isolated and the shard map gain x/b");
    assert!(f.has(SetId::InIsolated, vec![a("10.9.1.3")]));
    assert_eq!(f.full(), 0);

    // Someone deletes an element: a full sync (the resync) puts it back.
    f.ns.nft("delete element ip podnet-policy in-isolated { 10.9.1.3 }");
    assert!(!f.has(SetId::InIsolated, vec![a("10.9.1.3")]));
    assert_eq!(f.full(), 1);
    assert!(f.has(SetId::InIsolated, vec![a("10.9.1.3")]));

    // The periodic check reads use counts only: nothing to do...
    let check = || Scope::Only([Dirty::Check].into_iter().collect());
    assert_eq!(sync(&mut f.plane, &check()).unwrap(), 0);
    // ...until someone adds or removes a set or chain: rebuilt whole.
    f.ns.nft("'add set ip podnet-policy stray { type ipv4_addr; }'");
    assert!(sync(&mut f.plane, &check()).unwrap() > 0);
    let t = f.ns.nft_list("table ip podnet-policy").unwrap();
    assert!(!t.contains("stray"), "{t}");
    assert!(f.has(SetId::InIsolated, vec![a("10.9.1.3")]));
    assert_eq!(sync(&mut f.plane, &check()).unwrap(), 0);
    assert_eq!(f.full(), 0);

    // Someone deletes the table: repaired whole.
    f.ns.nft("delete table ip podnet-policy");
    assert!(f.full() > 0);
    assert!(f.has(SetId::InIsolated, vec![a("10.9.1.3")]));
    assert_eq!(f.full(), 0);

    // The policy goes: its elements go, the pods stay known.
    let ops = f.feed(vec![Delta::Deleted(podnet_source::ObjectKey {
        kind: podnet_api::Kind::NetworkPolicy,
        namespace: Some("x".into()),
        name: "web".into(),
    })]);
    assert_eq!(ops, 4, "two pods leave in-isolated and the shard map");
    assert!(f.has(SetId::Pods, vec![a("10.9.1.2")]));
    assert_eq!(f.full(), 0);
}

/// A restarted agent whose first full sync finds its table as planned
/// sends nothing, and still knows what to expect of it: its periodic check
/// notices a set someone adds afterwards.
#[test]
fn a_restarted_plane_that_finds_its_table_intact_still_notices_drift() {
    let mut f = Fixture::new("polr");
    let world = |p: &mut PolicyPlane| {
        let mut dirty = BTreeSet::new();
        p.watch(
            PolicyInput::Subnets(vec!["10.9.1.0/24".parse().unwrap()]),
            &mut dirty,
        );
        p.watch(
            PolicyInput::Deltas(vec![
                ns("x"),
                pod("x", "a", "10.9.1.2", json!({"pod": "a"})),
                netpol("x", "deny", json!({"podSelector": {}})),
            ]),
            &mut dirty,
        );
    };
    world(&mut f.plane);
    assert!(f.full() > 0);
    // The agent restarts: a new plane over the same kernel table.
    f.plane = f.ns.run(plane).expect("plane");
    world(&mut f.plane);
    assert_eq!(f.full(), 0, "the table was already as planned");
    let check = || Scope::Only([Dirty::Check].into_iter().collect());
    assert_eq!(sync(&mut f.plane, &check()).unwrap(), 0);
    f.ns.nft("'add set ip podnet-policy stray { type ipv4_addr; }'");
    assert!(
        sync(&mut f.plane, &check()).unwrap() > 0,
        "the check noticed the stray set"
    );
    let t = f.ns.nft_list("table ip podnet-policy").unwrap();
    assert!(!t.contains("stray"), "{t}");
}

#[test]
fn a_cni_hint_programs_a_pod_before_its_status() {
    let mut f = Fixture::new("polh");
    let mut dirty = BTreeSet::new();
    f.plane.watch(
        PolicyInput::Deltas(vec![
            ns("x"),
            netpol("x", "deny", json!({"podSelector": {}})),
        ]),
        &mut dirty,
    );
    f.full();
    // The Pod object exists, bound to the node, without an address.
    let bare = Delta::Updated(Arc::new(Object::Pod(Box::new(
        serde_json::from_value(json!({
            "metadata": {"name": "new", "namespace": "x", "labels": {"pod": "new"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}
        }))
        .unwrap(),
    ))));
    assert_eq!(f.feed(vec![bare]), 0, "no address, nothing to program");
    let (ack, mut done) = tokio::sync::oneshot::channel();
    let mut dirty = BTreeSet::new();
    f.plane.watch(
        PolicyInput::Added {
            key: Key::new("x", "new"),
            ips: vec!["10.9.1.7".parse().unwrap()],
            ack: Some(ack),
        },
        &mut dirty,
    );
    assert!(dirty.contains(&Dirty::Pod(Key::new("x", "new"))));
    assert!(done.try_recv().is_err(), "not answered before the sync");
    let scope = Scope::Only(dirty);
    let ops = sync(&mut f.plane, &scope).unwrap();
    f.plane.synced(&scope, true);
    assert_eq!(ops, 3, "pods, in-isolated and its shard's map entry");
    assert_eq!(done.try_recv().unwrap(), Ok(()));
    assert!(f.has(SetId::InIsolated, vec![a("10.9.1.7")]));
    // The status arrives with the same address: nothing to do.
    assert_eq!(
        f.feed(vec![pod("x", "new", "10.9.1.7", json!({"pod": "new"}))]),
        0
    );
    assert_eq!(f.full(), 0);
}

/// The policy table as the kernel holds it: read into the model (sets with
/// their elements, chains with their rules), and as `nft list` prints it,
/// line by line (sorted: a rebuilt set is listed after the others).
fn snapshot(ns: &TestNs) -> (podnet_nft::model::Table, Vec<String>) {
    let want = plan::skeleton(false, &["10.9.0.0/16".parse().unwrap()], Default::default());
    let t = ns
        .run(|| Conn::open().unwrap().observe(&want))
        .unwrap()
        .expect("the table exists");
    let mut lines: Vec<String> = ns
        .nft_list("table ip podnet-policy")
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    lines.sort();
    (t, lines)
}

fn assert_same(
    before: &(podnet_nft::model::Table, Vec<String>),
    after: &(podnet_nft::model::Table, Vec<String>),
) {
    assert!(
        before.0 == after.0,
        "the table's sets, elements or chains differ from before the policy came"
    );
    assert_eq!(
        before.1, after.1,
        "nft list differs from before the policy came"
    );
}

/// A policy of `n` ipBlocks (`11.x.y.0/24`) on TCP 443 for pods `pod=a`.
fn many_blocks(n: usize) -> Delta {
    let from: Vec<serde_json::Value> = (0..n)
        .map(|i| json!({"ipBlock": {"cidr": format!("11.{}.{}.0/24", i >> 8, i & 255)}}))
        .collect();
    netpol(
        "x",
        "blocks",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": from, "ports": [{"protocol": "TCP", "port": 443}]}]}),
    )
}

fn plane() -> Result<PolicyPlane, podnet_reconcile::SyncError> {
    PolicyPlane::new(
        Options {
            node: "n1".into(),
            ipv6: false,
            limit: Default::default(),
            strict: false,
        },
        Arc::new(RwLock::new(World::new())),
        podnet_daemon::Metrics::new(),
    )
}

/// Pods a and c of namespace x, and c's policy of one ipBlock.
fn blocks_world(p: &mut PolicyPlane) {
    let mut dirty = BTreeSet::new();
    p.watch(
        PolicyInput::Subnets(vec!["10.9.0.0/16".parse().unwrap()]),
        &mut dirty,
    );
    p.watch(
        PolicyInput::Deltas(vec![
            ns("x"),
            pod("x", "a", "10.9.1.2", json!({"pod": "a"})),
            pod("x", "c", "10.9.2.2", json!({"pod": "c"})),
            netpol(
                "x",
                "c-web",
                json!({"podSelector": {"matchLabels": {"pod": "c"}},
                       "ingress": [{"from": [{"ipBlock": {"cidr": "192.168.0.0/16"}}],
                                    "ports": [{"protocol": "TCP", "port": 443}]}]}),
            ),
        ]),
        &mut dirty,
    );
}

#[test]
fn a_policy_with_many_ip_blocks_goes_in_bounded_batches_leaving_the_table_as_before() {
    let mut f = Fixture::new("polb");
    // a and c share a shard (the low byte of their addresses); c keeps an
    // ipBlock of its own there, which must survive a's policy going.
    blocks_world(&mut f.plane);
    assert!(f.full() > 0);
    let before = snapshot(&f.ns);
    let k = plan::shard("10.9.1.2".parse().unwrap());
    assert_eq!(k, plan::shard("10.9.2.2".parse().unwrap()));
    let c_block = vec![
        a("10.9.2.2"),
        Value::Net("192.168.0.0/16".parse().unwrap()),
        Value::Proto(podnet_nft::model::Proto::Tcp),
        Value::Port(443),
    ];
    assert!(f.has(SetId::InNetPort(k), c_block.clone()));

    const N: usize = 2000;
    assert_eq!(
        f.feed(vec![many_blocks(N)]),
        N + 2,
        "the ranges, isolation, shard map"
    );
    let last = vec![
        a("10.9.1.2"),
        Value::Net(
            format!("11.{}.{}.0/24", (N - 1) >> 8, (N - 1) & 255)
                .parse()
                .unwrap(),
        ),
        Value::Proto(podnet_nft::model::Proto::Tcp),
        Value::Port(443),
    ];
    assert!(f.has(SetId::InNetPort(k), last.clone()));

    // The policy goes: N ranges leave a pipapo set of N + 1. No batch
    // deletes them one by one beyond the budget: the set is rebuilt with
    // c's range in the same batch.
    let ops = f.feed(vec![Delta::Deleted(podnet_source::ObjectKey {
        kind: podnet_api::Kind::NetworkPolicy,
        namespace: Some("x".into()),
        name: "blocks".into(),
    })]);
    assert!(ops > 0);
    let batches = f.plane.last_batches().to_vec();
    assert!(!batches.is_empty());
    for b in &batches {
        assert!(
            b.pipapo_deletes * b.pipapo_deletes <= podnet_nft::diff::PIPAPO_DELETE_BUDGET,
            "a batch deletes {} elements one by one from a pipapo set of about {N}: {batches:?}",
            b.pipapo_deletes
        );
    }
    assert_eq!(
        batches.iter().map(|b| b.rebuilt).sum::<usize>(),
        1,
        "{batches:?}"
    );
    assert!(!f.has(SetId::InNetPort(k), last));
    assert!(f.has(SetId::InNetPort(k), c_block));
    assert_eq!(
        f.full(),
        0,
        "the incremental path left what a full plan wants"
    );
    assert_same(&before, &snapshot(&f.ns));

    // A full sync that finds the ranges in the kernel (the agent restarted
    // after the policy went) removes them in a bounded batch too.
    assert_eq!(f.feed(vec![many_blocks(N)]), N + 2);
    let mut restarted = f.ns.run(plane).expect("plane");
    blocks_world(&mut restarted);
    assert!(sync(&mut restarted, &Scope::Full).expect("full sync") > 0);
    let batches = restarted.last_batches().to_vec();
    for b in &batches {
        assert!(
            b.pipapo_deletes * b.pipapo_deletes <= podnet_nft::diff::PIPAPO_DELETE_BUDGET,
            "the full sync deletes {} elements one by one: {batches:?}",
            b.pipapo_deletes
        );
    }
    assert_same(&before, &snapshot(&f.ns));
    assert_eq!(sync(&mut restarted, &Scope::Full).unwrap(), 0);
}
