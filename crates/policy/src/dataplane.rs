//! The policy subsystem on the reconcile loop: it watches Pods, Namespaces
//! and NetworkPolicies, marks the local pods a change touches, plans their
//! elements ([`crate::plan`]), and applies the element difference as one
//! batch. A full sync (the first, a resync, a repair) reads the kernel's
//! table and diffs the whole plan against it.
//!
//! What a change dirties, so its cost is what it touches:
//! - a pod: itself when local, and the local pods selected by every policy
//!   one of whose pod peers matched it before or after;
//! - a namespace's labels: the local pods selected by policies that select
//!   peers by namespace labels;
//! - a policy: the local pods it selected before and after.
//!
//! The CNI plugin's ADD reaches this loop as [`PolicyInput::Added`]: the pod's
//! address becomes known before the kubelet writes its status, the pod is
//! planned at once, and the plugin is answered when the batch is in the
//! kernel (see [`crate::hint`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use ipnet::IpNet;
use podnet_api::{Kind, Object};
use podnet_daemon::Metrics;
use podnet_nft::diff::{self, Change};
use podnet_nft::model::{Family, Table};
use podnet_nft::sync::{Held, Owners, TableSync};
use podnet_reconcile::{Scope, Subsystem, SyncError};
use podnet_source::Delta;
use tokio::sync::oneshot;

use crate::plan::{self, Elem, LogLimit, SetId};
use crate::world::{Key, Peer, PodView, Policy, PortMatch, World};

const POLICY_CONNECTIONS_CUT_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_policy_connections_cut_total",
    "Established connections removed by --policy-strict.",
);
const POLICY_ELEMENTS: podnet_daemon::Gauge = podnet_daemon::Gauge::new(
    "podnet_policy_elements",
    "Set elements the policy table holds, per set.",
);

/// An acknowledgement the CNI plugin waits for.
pub type Ack = oneshot::Sender<Result<(), String>>;

/// What the policy loop is fed.
pub enum PolicyInput {
    Deltas(Vec<Delta>),
    /// This node's pod subnets (for failing closed).
    Subnets(Vec<IpNet>),
    /// A CNI ADD on this node: pod `key` has `ips`; `ack` once programmed.
    Added {
        key: Key,
        ips: Vec<IpAddr>,
        ack: Option<Ack>,
    },
    /// A CNI DEL: the addresses are free again.
    Removed {
        key: Key,
    },
}

/// A dirty mark.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dirty {
    /// The table's chains (the node's subnets changed): a full sync.
    Skeleton,
    /// A periodic resync's cheap check: the tables' use counts (chains,
    /// sets, counters) against what was applied; a table someone changed
    /// is replaced whole.
    Check,
    Pod(Key),
}

/// Whether a sync of `scope` reads and rewrites the whole table.
fn whole(scope: &Scope<Dirty>) -> bool {
    match scope {
        Scope::Full => true,
        Scope::Only(k) => k.contains(&Dirty::Skeleton),
    }
}

/// Options of the data plane.
#[derive(Debug, Clone)]
pub struct Options {
    pub node: String,
    /// Also plan the IPv6 table.
    pub ipv6: bool,
    pub limit: LogLimit,
    /// `--policy-strict`: cut established connections no longer allowed.
    pub strict: bool,
}

/// The node's policy data plane: the view it plans from (shared with the
/// verdict log, which explains drops from the same objects), the elements
/// it applied per pod (so a change is diffed against them, not against the
/// kernel), and the CNI plugins waiting for their pods.
pub struct PolicyPlane {
    opts: Options,
    world: Arc<RwLock<World>>,
    subnets: Vec<IpNet>,
    /// Pods the CNI plugin announced, with their addresses, until their
    /// status carries them.
    hints: BTreeMap<Key, Vec<IpAddr>>,
    /// Pods known only from the CNI plugin (no Pod object).
    bare: BTreeSet<Key>,
    /// Elements as applied, per owning pod.
    owners: Owners<Key, Elem>,
    /// Elements per set (kept with `owners`, for the metrics).
    counts: BTreeMap<SetId, usize>,
    /// The interval sets' elements per family and set (kept with `owners`):
    /// what a rebuilt set keeps, without reading every element applied.
    ranges: HashMap<(bool, SetId), HashSet<Elem>>,
    resyncs: std::cell::Cell<u32>,
    /// The tables without elements (what a partial sync's batches are
    /// encoded against), made again only when the subnets change.
    skeletons: Vec<Table>,
    /// The kernel's tables, one per family (as the skeletons).
    tables: Vec<TableSync>,
    waiters: Vec<(Key, Ack)>,
    metrics: Arc<Metrics>,
    /// Whether the last sync changed any element (for strict mode).
    changed: bool,
    /// The batches the last sync sent.
    batches: Vec<BatchReport>,
    /// Whether a full sync has succeeded: until then every sync is full,
    /// so watching skips working out what a change dirties (the first
    /// list of thousands of pods and policies would cost their product).
    whole_done: bool,
}

/// How often a periodic resync reads the whole tables back: reading
/// 400,000 elements costs seconds of kernel time, the use-count check
/// nothing.
pub const FULL_EVERY: u32 = 30;

fn family(v6: bool) -> Family {
    if v6 {
        Family::Ip6
    } else {
        Family::Ip
    }
}

/// What `observe` read: whole tables (a full sync), their use counts (a
/// periodic check), or nothing (a change: the applied elements are known).
pub enum Seen {
    Tables(Vec<Option<Table>>),
    Uses(Vec<Option<u32>>),
    Nothing,
}

/// What a sync plans: the whole tables (first sync, resync, repair), or
/// the new elements of the pods a change touched.
pub enum PolicyPlan {
    /// The tables' skeletons, and the elements per owning pod they hold.
    Full(Vec<Table>, Vec<(Key, Vec<Elem>)>),
    Pods(Vec<(Key, Vec<Elem>)>),
}

/// Per table, the batch to send; and the elements per pod it leaves, for
/// the bookkeeping once it is applied.
pub enum PolicyChanges {
    Full(Vec<(Table, Batch)>, Vec<(Key, Vec<Elem>)>),
    /// Per family (an index into the plane's skeletons), element changes.
    Elems(Vec<(usize, Vec<Change>)>, Vec<(Key, Vec<Elem>)>),
}

/// One table's batch in a full sync.
pub enum Batch {
    /// The difference from the kernel's table.
    Diff(Vec<Change>),
    /// A table made anew (none in the kernel, or replaced): its skeleton's
    /// changes, then its elements, sorted by set, turned into changes a
    /// chunk at a time as the batch is encoded, so the whole table never
    /// exists twice in memory.
    Fresh { head: Vec<Change>, elems: Vec<Elem> },
}

impl Batch {
    fn ops(&self) -> usize {
        match self {
            Batch::Diff(c) => diff::ops(c),
            Batch::Fresh { head, elems } => diff::ops(head) + elems.len(),
        }
    }
}

/// What one batch sent: for tests and benchmarks, which check that no
/// batch deletes more from a pipapo set one by one than
/// [`diff::delete_one_by_one`] allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchReport {
    /// Operations (elements, rules, sets, chains) in the batch.
    pub ops: usize,
    /// The most elements it deletes one by one from one pipapo set.
    pub pipapo_deletes: usize,
    /// The pipapo sets it rebuilds instead.
    pub rebuilt: usize,
}

impl BatchReport {
    fn of_changes(t: &Table, c: &[Change]) -> BatchReport {
        BatchReport {
            ops: diff::ops(c),
            pipapo_deletes: diff::max_pipapo_deletes(t, c),
            rebuilt: c
                .iter()
                .filter(|c| matches!(c, Change::DelSet { .. }))
                .count(),
        }
    }

    fn of(t: &Table, b: &Batch) -> BatchReport {
        match b {
            Batch::Diff(c) => BatchReport::of_changes(t, c),
            Batch::Fresh { .. } => BatchReport {
                ops: b.ops(),
                pipapo_deletes: 0,
                rebuilt: 0,
            },
        }
    }
}

/// The family's elements of `owned`, sorted (by set first) and without
/// duplicates.
fn family_elems(owned: &[(Key, Vec<Elem>)], v6: bool) -> Vec<Elem> {
    let mut v: Vec<Elem> = owned
        .iter()
        .flat_map(|(_, e)| e.iter())
        .filter(|e| e.v6() == v6)
        .copied()
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

impl PolicyPlane {
    pub fn new(
        opts: Options,
        world: Arc<RwLock<World>>,
        metrics: Arc<Metrics>,
    ) -> Result<PolicyPlane, SyncError> {
        let mut p = PolicyPlane::detached(opts, world, metrics);
        p.tables = p
            .families()
            .into_iter()
            .map(|v6| TableSync::open(family(v6), plan::TABLE))
            .collect::<Result<_, _>>()?;
        Ok(p)
    }

    /// A plane without a kernel connection: plan and diff only (tests,
    /// benchmarks of the pure part).
    pub fn detached(opts: Options, world: Arc<RwLock<World>>, metrics: Arc<Metrics>) -> Self {
        let mut p = PolicyPlane {
            opts,
            world,
            subnets: Vec::new(),
            hints: BTreeMap::new(),
            bare: BTreeSet::new(),
            owners: Owners::default(),
            counts: BTreeMap::new(),
            ranges: HashMap::new(),
            resyncs: std::cell::Cell::new(0),
            skeletons: Vec::new(),
            tables: Vec::new(),
            waiters: Vec::new(),
            metrics,
            changed: false,
            batches: Vec::new(),
            whole_done: false,
        };
        p.skeletons = p.make_skeletons();
        p.tables = p
            .families()
            .into_iter()
            .map(|v6| TableSync::detached(family(v6), plan::TABLE))
            .collect();
        p
    }

    fn make_skeletons(&self) -> Vec<Table> {
        self.families()
            .into_iter()
            .map(|v6| plan::skeleton(v6, &self.subnets, self.opts.limit))
            .collect()
    }

    /// The view, for readers beside the loop (the verdict log).
    pub fn world(&self) -> Arc<RwLock<World>> {
        self.world.clone()
    }

    fn families(&self) -> Vec<bool> {
        if self.opts.ipv6 {
            vec![false, true]
        } else {
            vec![false]
        }
    }

    fn local_targets(w: &World, node: &str, p: &Policy, out: &mut BTreeSet<Dirty>) {
        for (k, v) in w.pods_in_matching(&p.key.ns, &p.selector) {
            if plan::is_local(v, node) {
                out.insert(Dirty::Pod(k.clone()));
            }
        }
    }

    /// The view of pod `k` with a CNI hint filled in.
    fn with_hint(&self, k: &Key, mut v: PodView) -> PodView {
        if v.ips.is_empty() {
            if let Some(ips) = self.hints.get(k) {
                v.ips = ips.clone();
                if v.node.is_none() {
                    v.node = Some(self.opts.node.clone());
                }
            }
        }
        v
    }

    fn set_pod(&mut self, k: Key, new: Option<PodView>, dirty: &mut BTreeSet<Dirty>) {
        let new = new.map(|v| self.with_hint(&k, v));
        let mut w = self.world.write().expect("world lock");
        let old = w.set_pod(k.clone(), new.clone());
        if old == new {
            return;
        }
        let node = self.opts.node.as_str();
        dirty.insert(Dirty::Pod(k.clone()));
        if !self.whole_done {
            return;
        }
        // What a peer can see of the pod: its addresses and named ports.
        let moved =
            old.as_ref().map(|v| (&v.ips, &v.ports)) != new.as_ref().map(|v| (&v.ips, &v.ports));
        let old_v = old.as_ref().filter(|v| !v.ips.is_empty());
        let new_v = new.as_ref().filter(|v| !v.ips.is_empty());
        let mut touched: Vec<&Policy> = Vec::new();
        // Only policies of the pod's namespace and the wide ones that reach
        // its namespace can name it.
        for p in w.policies_in(&k.ns).chain(w.wide_for(&k.ns)) {
            let rules = p.ingress.iter().chain(p.egress.iter()).flatten();
            let by_peer = rules.clone().any(|r| {
                r.peers.iter().flatten().any(|peer| {
                    if !matches!(peer, Peer::Pods { .. }) {
                        return false;
                    }
                    let m = |v: Option<&PodView>| {
                        v.is_some_and(|v| w.peer_matches_pod(peer, &p.key.ns, &k, v))
                    };
                    let (was, is) = (m(old_v), m(new_v));
                    was != is || (is && moved)
                })
            });
            // Egress to a named port of any pod (no peers, or an ipBlock):
            // resolved on every pod carrying the name.
            let by_port = moved
                && p.egress.iter().flatten().any(|r| {
                    let open = r
                        .peers
                        .as_ref()
                        .is_none_or(|ps| ps.iter().any(|x| matches!(x, Peer::Block { .. })));
                    open && r.ports.iter().flatten().any(|m| match m {
                        PortMatch::Named(proto, name) => [old_v, new_v]
                            .into_iter()
                            .flatten()
                            .any(|v| v.named(name, *proto).is_some()),
                        _ => false,
                    })
                });
            if by_peer || by_port {
                touched.push(p);
            }
        }
        for p in touched {
            Self::local_targets(&w, node, p, dirty);
        }
    }

    fn watch_delta(&mut self, d: &Delta, dirty: &mut BTreeSet<Dirty>) {
        let key = d.key();
        let ns = key.namespace.clone().unwrap_or_default();
        let obj = match d {
            Delta::Added(o) | Delta::Updated(o) => Some(o.as_ref()),
            Delta::Deleted(_) => None,
        };
        match key.kind {
            Kind::Pod => {
                let v = match obj {
                    Some(Object::Pod(p)) => Some(PodView::of(p)),
                    _ => None,
                };
                let k = Key::new(&ns, &key.name);
                self.bare.remove(&k);
                if v.as_ref().is_some_and(|v| !v.ips.is_empty()) || v.is_none() {
                    // The status (or the deletion) takes over from a hint.
                    self.hints.remove(&k);
                }
                self.set_pod(k, v, dirty);
            }
            Kind::Namespace => {
                let labels = match obj {
                    Some(Object::Namespace(n)) => {
                        Some(n.metadata.labels.clone().unwrap_or_default())
                    }
                    _ => None,
                };
                let mut w = self.world.write().expect("world lock");
                let old = w.set_namespace(&key.name, labels.clone());
                if old == labels || !self.whole_done {
                    return;
                }
                let node = self.opts.node.as_str();
                for p in w.policies.values().filter(|p| p.uses_namespace_labels()) {
                    Self::local_targets(&w, node, p, dirty);
                }
            }
            Kind::NetworkPolicy => {
                let p = match obj {
                    Some(Object::NetworkPolicy(p)) => Policy::compile(p),
                    _ => None,
                };
                let mut w = self.world.write().expect("world lock");
                let k = Key::new(&ns, &key.name);
                let old = w.set_policy(k, p.clone());
                if old == p || !self.whole_done {
                    return;
                }
                let node = self.opts.node.as_str();
                for p in [old, p].iter().flatten() {
                    Self::local_targets(&w, node, p, dirty);
                }
            }
            _ => {}
        }
    }

    /// The view's pod `k`, as it is now.
    fn pod_view(&self, k: &Key) -> Option<PodView> {
        self.world.read().expect("world lock").pods.get(k).cloned()
    }

    fn pod_plan(&self, w: &World, k: &Key) -> Vec<Elem> {
        match w.pods.get(k) {
            Some(v) => plan::pod_elements(w, &self.opts.node, k, v),
            None => Vec::new(),
        }
    }

    /// The whole plan: every local pod's elements, and the tables holding
    /// them.
    fn full_plan(&self) -> PolicyPlan {
        let w = self.world.read().expect("world lock");
        let owned: Vec<(Key, Vec<Elem>)> = w
            .pods
            .keys()
            .map(|k| (k.clone(), self.pod_plan(&w, k)))
            .filter(|(_, e)| !e.is_empty())
            .collect();
        let tables = self
            .families()
            .into_iter()
            .map(|v6| plan::skeleton(v6, &self.subnets, self.opts.limit))
            .collect();
        PolicyPlan::Full(tables, owned)
    }

    fn record(&mut self, owned: Vec<(Key, Vec<Elem>)>) {
        let (counts, ranges) = (&mut self.counts, &mut self.ranges);
        self.owners.record(owned, |e, held| match held {
            Held::Gained => {
                *counts.entry(e.set).or_insert(0) += 1;
                if e.set.interval() {
                    ranges.entry((e.v6(), e.set)).or_default().insert(*e);
                }
            }
            Held::Lost => {
                *counts.entry(e.set).or_insert(1) -= 1;
                if let Some(r) = ranges.get_mut(&(e.v6(), e.set)) {
                    r.remove(e);
                }
            }
        });
    }

    /// Pending CNI acks, answered after a sync.
    fn answer(&mut self, ok: bool) {
        if !ok {
            return;
        }
        for (k, ack) in self.waiters.drain(..) {
            tracing::debug!(pod = %k, "programmed; answering the CNI plugin");
            let _ = ack.send(Ok(()));
        }
    }

    /// Element counts per set, for metrics and tests.
    /// Every element as applied (for tests: after partial syncs it must
    /// equal what a full plan holds).
    pub fn applied_elements(&self) -> BTreeSet<Elem> {
        self.owners.elements().copied().collect()
    }

    /// What a full plan holds now.
    pub fn planned_elements(&self) -> BTreeSet<Elem> {
        match self.full_plan() {
            PolicyPlan::Full(_, owned) => owned.into_iter().flat_map(|(_, e)| e).collect(),
            PolicyPlan::Pods(_) => unreachable!("full_plan plans whole tables"),
        }
    }

    /// Elements per kind of set (shards added up).
    pub fn element_counts(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for (s, n) in &self.counts {
            *m.entry(s.kind()).or_insert(0) += n;
        }
        m
    }

    /// The batches the last sync sent (none when it changed nothing).
    pub fn last_batches(&self) -> &[BatchReport] {
        &self.batches
    }

    /// Established connections no longer allowed, cut (strict mode).
    fn cut_established(&mut self) {
        let w = self.world.read().expect("world lock");
        match crate::strict::cut(&w, &self.opts.node) {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(
                    connections = n,
                    "policy-strict: cut connections no longer allowed"
                );
                self.metrics
                    .count(&POLICY_CONNECTIONS_CUT_TOTAL, "", n as f64);
            }
            Err(e) => tracing::warn!("policy-strict: {e}"),
        }
    }
}

/// What one sync's element changes hold: per family (an index into the
/// plane's skeletons) the changes, before and after the plane's state.
struct ElemState<'a> {
    tables: &'a [Table],
    owners: &'a Owners<Key, Elem>,
    /// Elements per set (both families), before the change.
    counts: &'a BTreeMap<SetId, usize>,
    /// The interval sets' elements, before the change.
    ranges: &'a HashMap<(bool, SetId), HashSet<Elem>>,
}

/// The element changes from the applied state to `new` (the new elements
/// of the pods it names), per family. Removals come sorted, as additions
/// do: the kernel's pipapo sets delete far faster in the order they were
/// filled. A pipapo set that would lose more elements one by one than
/// [`diff::delete_one_by_one`] allows is rebuilt in the batch instead
/// (a chain change, on this rare path only: a policy with many ipBlocks
/// going away, or a pod leaving a crowded shard).
fn elem_changes(st: &ElemState<'_>, new: &[(Key, Vec<Elem>)]) -> Vec<(usize, Vec<Change>)> {
    let (added, removed) = st.owners.changes(new);
    let mut adds: BTreeMap<(bool, SetId), Vec<&Elem>> = BTreeMap::new();
    let mut dels: BTreeMap<(bool, SetId), Vec<&Elem>> = BTreeMap::new();
    for e in added {
        adds.entry((e.v6(), e.set)).or_default().push(e);
    }
    for e in removed {
        dels.entry((e.v6(), e.set)).or_default().push(e);
    }
    for v in adds.values_mut().chain(dels.values_mut()) {
        v.sort_unstable();
    }
    let mut out = Vec::new();
    for (i, t) in st.tables.iter().enumerate() {
        let v6 = t.family == Family::Ip6;
        let mut ch = Vec::new();
        // Removals first: an interval element may be replaced by ones that
        // overlap it, which the kernel accepts only once it is gone.
        for ((f, s), es) in &dels {
            if *f == v6 {
                ch.push(Change::DelElems {
                    set: s.name(),
                    keys: es.iter().map(|e| e.key()).collect(),
                });
            }
        }
        for ((f, s), es) in &adds {
            if *f == v6 {
                ch.push(Change::AddElems {
                    set: s.name(),
                    elems: es.iter().map(|e| (e.key(), e.data())).collect(),
                });
            }
        }
        if ch.is_empty() {
            continue;
        }
        let ids: HashMap<String, SetId> = dels
            .keys()
            .filter(|(f, _)| *f == v6)
            .map(|(_, s)| (s.name(), *s))
            .collect();
        let held = |name: &str| {
            ids.get(name)
                .and_then(|s| st.counts.get(s))
                .copied()
                .unwrap_or(0)
        };
        // What a rebuilt set holds after the batch: the applied elements
        // it keeps, and the ones added.
        let mut want = |name: &str| {
            let mut set = t.sets[name].clone();
            let Some(&sid) = ids.get(name) else {
                return set;
            };
            let gone: HashSet<&Elem> = dels[&(v6, sid)].iter().copied().collect();
            let kept = st
                .ranges
                .get(&(v6, sid))
                .into_iter()
                .flatten()
                .filter(|e| !gone.contains(e));
            let added = adds.get(&(v6, sid)).into_iter().flatten().copied();
            for e in kept.chain(added) {
                set.elements.insert(e.key(), e.data());
            }
            set
        };
        out.push((i, diff::bound_pipapo_deletes(t, ch, &held, &mut want)));
    }
    out
}

impl Subsystem for PolicyPlane {
    type Input = PolicyInput;
    type Key = Dirty;
    type Plan = PolicyPlan;
    type Observed = Seen;
    type Changes = PolicyChanges;

    fn name(&self) -> &'static str {
        "policy"
    }

    fn watch(&mut self, input: PolicyInput, dirty: &mut BTreeSet<Dirty>) {
        match input {
            PolicyInput::Deltas(ds) => {
                for d in &ds {
                    self.watch_delta(d, dirty);
                }
            }
            PolicyInput::Subnets(s) => {
                if s != self.subnets {
                    self.subnets = s;
                    self.skeletons = self.make_skeletons();
                    dirty.insert(Dirty::Skeleton);
                }
            }
            PolicyInput::Added { key, ips, ack } => {
                self.hints.insert(key.clone(), ips.clone());
                let v = match self.pod_view(&key) {
                    Some(v) => v,
                    // No Pod object (a bare container): known, selected by
                    // nothing that needs labels.
                    None => {
                        self.bare.insert(key.clone());
                        PodView {
                            labels: Default::default(),
                            ips: Vec::new(),
                            node: Some(self.opts.node.clone()),
                            host_network: false,
                            ports: Vec::new(),
                        }
                    }
                };
                self.set_pod(key.clone(), Some(v), dirty);
                dirty.insert(Dirty::Pod(key.clone()));
                if let Some(a) = ack {
                    self.waiters.push((key, a));
                }
            }
            PolicyInput::Removed { key } => {
                if self.bare.remove(&key) {
                    self.hints.remove(&key);
                    self.set_pod(key, None, dirty);
                } else if self.hints.remove(&key).is_some() {
                    // The sandbox is gone before the status said anything.
                    if let Some(mut v) = self.pod_view(&key) {
                        v.ips.clear();
                        self.set_pod(key, Some(v), dirty);
                    }
                }
            }
        }
    }

    fn plan(&self, scope: &Scope<Dirty>) -> PolicyPlan {
        match scope {
            _ if whole(scope) => self.full_plan(),
            Scope::Full => unreachable!("a full scope is whole"),
            Scope::Only(keys) => {
                let w = self.world.read().expect("world lock");
                PolicyPlan::Pods(
                    keys.iter()
                        .filter_map(|d| match d {
                            Dirty::Pod(k) => Some((k.clone(), self.pod_plan(&w, k))),
                            Dirty::Skeleton | Dirty::Check => None,
                        })
                        .collect(),
                )
            }
        }
    }

    fn observe(&mut self, scope: &Scope<Dirty>) -> Result<Seen, SyncError> {
        if whole(scope) {
            let mut out = Vec::new();
            for (t, want) in self.tables.iter_mut().zip(&self.skeletons) {
                out.push(t.observe(want)?);
            }
            return Ok(Seen::Tables(out));
        }
        match scope {
            Scope::Only(k) if k.contains(&Dirty::Check) => {
                let mut out = Vec::new();
                for t in &mut self.tables {
                    out.push(t.observe_use()?);
                }
                Ok(Seen::Uses(out))
            }
            _ => Ok(Seen::Nothing),
        }
    }

    fn diff(&self, plan: PolicyPlan, observed: Seen) -> PolicyChanges {
        match (plan, observed) {
            (PolicyPlan::Full(want, owned), seen) => {
                let have = match seen {
                    Seen::Tables(t) => t,
                    _ => Vec::new(),
                };
                let ch = want
                    .into_iter()
                    .enumerate()
                    .map(|(i, t)| {
                        let v6 = t.family == Family::Ip6;
                        let b = match have.get(i).and_then(|o| o.as_ref()) {
                            Some(h) => {
                                let mut full = t.clone();
                                plan::fill(&mut full, owned.iter().flat_map(|(_, e)| e.iter()));
                                let d = diff::diff(Some(h), &full);
                                let held = |s: &str| h.sets.get(s).map_or(0, |s| s.elements.len());
                                Batch::Diff(diff::bound_pipapo_deletes(&full, d, &held, &mut |s| {
                                    full.sets[s].clone()
                                }))
                            }
                            None => Batch::Fresh {
                                head: diff::diff(None, &t),
                                elems: family_elems(&owned, v6),
                            },
                        };
                        (t, b)
                    })
                    .collect();
                PolicyChanges::Full(ch, owned)
            }
            (PolicyPlan::Pods(_), Seen::Uses(u))
                if self.tables.iter().zip(&u).any(|(t, u)| t.drifted(*u)) =>
            {
                // Someone changed a table's chains or sets: replace it
                // whole, in one batch (new connections only are judged, so
                // nothing established notices).
                tracing::warn!(
                    have = ?u,
                    want = ?self.tables.iter().map(TableSync::expected_use).collect::<Vec<_>>(),
                    "policy table changed behind the agent's back; rebuilding it"
                );
                let PolicyPlan::Full(want, owned) = self.full_plan() else {
                    unreachable!("full_plan plans whole tables")
                };
                let ch = want
                    .into_iter()
                    .map(|t| {
                        let b = Batch::Fresh {
                            head: diff::replace(&t),
                            elems: family_elems(&owned, t.family == Family::Ip6),
                        };
                        (t, b)
                    })
                    .collect();
                PolicyChanges::Full(ch, owned)
            }
            (PolicyPlan::Pods(new), _) => PolicyChanges::Elems(
                elem_changes(
                    &ElemState {
                        tables: &self.skeletons,
                        owners: &self.owners,
                        counts: &self.counts,
                        ranges: &self.ranges,
                    },
                    &new,
                ),
                new,
            ),
        }
    }

    fn apply(&mut self, changes: PolicyChanges) -> Result<usize, SyncError> {
        let (n, owned, full) = match changes {
            PolicyChanges::Full(batches, owned) => {
                self.owners.clear();
                self.counts.clear();
                self.ranges.clear();
                let n = batches.iter().map(|(_, b)| b.ops()).sum();
                self.batches = batches
                    .iter()
                    .filter(|(_, b)| b.ops() > 0)
                    .map(|(t, b)| BatchReport::of(t, b))
                    .collect();
                for (kept, (t, b)) in self.tables.iter_mut().zip(batches) {
                    match b {
                        Batch::Diff(c) => kept.apply(&t, &c)?,
                        Batch::Fresh { head, elems } => kept.load_fresh(&t, head, &elems)?,
                    }
                }
                (n, owned, true)
            }
            PolicyChanges::Elems(batches, owned) => {
                let n = batches.iter().map(|(_, c)| diff::ops(c)).sum();
                self.batches = batches
                    .iter()
                    .map(|(i, c)| BatchReport::of_changes(&self.skeletons[*i], c))
                    .collect();
                for (i, c) in batches {
                    self.tables[i].apply(&self.skeletons[i], &c)?;
                }
                (n, owned, false)
            }
        };
        self.record(owned);
        self.changed = n > 0;
        if full {
            self.whole_done = true;
        }
        Ok(n)
    }

    /// Mostly the cheap check; every [`FULL_EVERY`]th resync reads the
    /// whole tables back (elements someone deleted are put back then).
    fn resync(&self) -> Scope<Dirty> {
        let n = self.resyncs.get().wrapping_add(1);
        self.resyncs.set(n);
        if n.is_multiple_of(FULL_EVERY) {
            Scope::Full
        } else {
            Scope::Only([Dirty::Check].into_iter().collect())
        }
    }

    fn synced(&mut self, _scope: &Scope<Dirty>, ok: bool) {
        self.answer(ok);
        if ok && self.changed && self.opts.strict && self.tables.iter().any(TableSync::attached) {
            self.cut_established();
        }
        if ok {
            for (set, n) in self.element_counts() {
                self.metrics
                    .gauge(&POLICY_ELEMENTS, &format!("set=\"{set}\""), n as f64);
            }
        }
    }
}
