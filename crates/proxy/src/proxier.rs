//! The service proxy loop: watch Services and EndpointSlices, and keep the
//! kernel's `ip podnet` table equal to the plan, doing work proportional to
//! what changed.
//!
//! Each Service owns a fragment of the table ([`crate::rules::fragment`]):
//! its map elements, chains and affinity sets. An event marks its Service
//! dirty; a sync recomputes only dirty fragments, diffs each against what was
//! applied, and sends all the changes as one nf_tables netlink batch
//! ([`podnet_nft::netlink`]): atomic, no `nft` process, no table re-read.
//! Events that arrive together are coalesced into one sync; an identical
//! sync sends nothing.
//!
//! The first sync (and any sync after a failure) replaces the whole table in
//! one transaction, so a restarted agent never leaves a half-built table and
//! established connections keep their conntrack NAT state. Stale UDP
//! conntrack entries towards removed endpoints are flushed, so clients do not
//! keep sending into the void (the classic 5-second DNS delay).
//!
//! Memory: the proxier keeps each Service and EndpointSlice as the bytes the
//! store holds (a few hundred bytes each) and decodes them only to plan.
//! What the kernel holds is not kept as rules either: it is remembered as
//! the inputs the applied fragment was planned from (shared with the current
//! inputs while nothing changed), and re-planned when that Service changes,
//! since planning is pure. At 50k Services this keeps tens of megabytes
//! instead of a gigabyte of decoded objects and rule trees.
//!
//! There is one [`Proxier`] per address family (`ip podnet`, `ip6 podnet`);
//! [`run`] feeds both from one watch.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::{Kind, Object};
use podnet_daemon::Metrics;
use podnet_nft::diff::{diff, ops, Change};
use podnet_nft::model::{ElemData, Set, Table, Value};
use podnet_nft::netlink::Conn;
use podnet_reconcile::{Scope, Subsystem, SyncError};
use podnet_source::{Delta, Subscription};

use crate::healthcheck;
use crate::healthz::Health;
use crate::rules::{
    base_table, fragment, is_fast_count_set, programmed_ip, shell, NodeInfo, Stack, TABLE,
};
use crate::stale::{udp_endpoints, Flush, UdpView};
use crate::ProxyError;

const PROXY_ENDPOINTS: podnet_daemon::Gauge = podnet_daemon::Gauge::new(
    "podnet_proxy_endpoints",
    "Endpoints programmed (DNAT targets).",
);
const PROXY_LAST_SYNC_TIMESTAMP_SECONDS: podnet_daemon::Gauge = podnet_daemon::Gauge::new(
    "podnet_proxy_last_sync_timestamp_seconds",
    "When the last sync succeeded.",
);
const PROXY_SERVICES: podnet_daemon::Gauge =
    podnet_daemon::Gauge::new("podnet_proxy_services", "Services known to the proxy.");
const PROXY_SYNC_DURATION_SECONDS: podnet_daemon::Histogram = podnet_daemon::Histogram::new(
    "podnet_proxy_sync_duration_seconds",
    "Time to plan, diff and apply one sync (full or partial).",
);
const PROXY_SYNC_FAILURES_TOTAL: podnet_daemon::Counter =
    podnet_daemon::Counter::new("podnet_proxy_sync_failures_total", "Syncs that failed.");
const PROXY_SYNC_OPERATIONS: podnet_daemon::Histogram = podnet_daemon::Histogram::new(
    "podnet_proxy_sync_operations",
    "nf_tables operations per applied sync (as a histogram of counts).",
);
const PROXY_SYNC_OPERATIONS_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_proxy_sync_operations_total",
    "nf_tables operations applied.",
);

/// "ns/name" of the Service an object belongs to.
fn service_id(o: &Object) -> Option<String> {
    let ns = o.namespace().unwrap_or("default");
    match o {
        Object::Service(_) => Some(format!("{ns}/{}", o.name())),
        Object::EndpointSlice(s) => {
            podnet_api::endpoints::service_name(s).map(|n| format!("{ns}/{n}"))
        }
        _ => None,
    }
}

/// An object as JSON bytes; decoded when a plan needs it.
type Raw = Arc<[u8]>;

fn encode<T: serde::Serialize>(o: &T) -> Raw {
    Arc::from(serde_json::to_vec(o).expect("objects serialize"))
}

/// Straight into the typed object, with no `serde_json::Value` in between:
/// a full sync decodes every Service and slice once more.
fn decode_service(raw: &[u8]) -> Option<Service> {
    serde_json::from_slice(raw).ok()
}

fn decode_slices<'a>(raws: impl IntoIterator<Item = &'a Raw>) -> Vec<EndpointSlice> {
    raws.into_iter()
        .filter_map(|r| serde_json::from_slice(r).ok())
        .collect()
}

/// The inputs one Service's applied fragment was planned from.
#[derive(Clone, Default)]
pub struct Inputs {
    service: Option<Raw>,
    slices: Vec<Raw>,
}

impl Inputs {
    fn is_empty(&self) -> bool {
        self.service.is_none() && self.slices.is_empty()
    }
}

/// What the kernel holds for one Service.
pub struct Applied {
    inputs: Inputs,
    endpoints: usize,
}

pub struct Proxier {
    node: NodeInfo,
    stack: Stack,
    services: BTreeMap<String, Raw>,
    /// Slices by "namespace/name", with the Service they belong to.
    slices: BTreeMap<String, (String, Raw)>,
    by_service: BTreeMap<String, BTreeSet<String>>,
    dirty: BTreeSet<String>,
    /// What the kernel holds, per Service; None: unknown (full sync next).
    applied: Option<BTreeMap<String, Applied>>,
    conn: Option<Conn>,
    metrics: Arc<Metrics>,
    /// Endpoints programmed, kept up to date per change (not recounted).
    endpoints: usize,
    /// When a sync last succeeded (a zero-op sync counts).
    last_ok: Option<Instant>,
    /// Services changed since [`Proxier::take_touched`] (for health checks).
    touched: BTreeSet<String>,
    /// The table's use count (chains + sets) after our last apply.
    expect_use: Option<u32>,
    /// Services this family's table holds nothing of
    /// ([`crate::rules::programmed_ip`]): a full sync skips them unplanned
    /// (the IPv6 proxier of a cluster whose Services are IPv4 decodes none).
    elsewhere: HashSet<String>,
    /// Services with a health-check node port ([`healthcheck::port`]):
    /// what a relist's health-check resync visits.
    with_health: BTreeSet<String>,
}

/// The changes from one Service fragment to another. The per-count sets of
/// the fast path are declared by the base table and appear in a fragment
/// only when it uses one: each side gets the other's missing declarations
/// of those, so the diff carries their element changes, never their
/// creation or removal. A fragment's own sets (affinity) are diffed as
/// they are.
fn fragment_diff(mut old: Table, mut new: Table) -> Vec<Change> {
    let shared: Vec<(String, Set)> = new
        .sets
        .iter()
        .chain(old.sets.iter())
        .filter(|(name, _)| is_fast_count_set(name))
        .map(|(name, s)| {
            (
                name.clone(),
                Set {
                    elements: Default::default(),
                    ..s.clone()
                },
            )
        })
        .collect();
    for (name, s) in shared {
        old.sets.entry(name.clone()).or_insert_with(|| s.clone());
        new.sets.entry(name).or_insert(s);
    }
    diff(Some(&old), &new)
}

/// Services planned into one chunk of a full sync: their element
/// additions to each shared set go out as one message instead of one per
/// Service, which is most of a full sync's kernel work.
const FULL_SYNC_GROUP: usize = 64;

/// The same additions with every element addition moved behind the rest
/// and merged per set (first-seen order). Valid for changes that only add:
/// the sets and chains an element refers to are then created first.
fn elements_last(changes: Vec<Change>) -> Vec<Change> {
    let mut rest = Vec::with_capacity(changes.len());
    type Elems = Vec<(Vec<Value>, Option<ElemData>)>;
    let mut elems: Vec<(String, Elems)> = Vec::new();
    for c in changes {
        match c {
            Change::AddElems { set, elems: e } => match elems.iter_mut().find(|(s, _)| *s == set) {
                Some((_, v)) => v.extend(e),
                None => elems.push((set, e)),
            },
            c => rest.push(c),
        }
    }
    rest.extend(
        elems
            .into_iter()
            .map(|(set, elems)| Change::AddElems { set, elems }),
    );
    rest
}

/// Endpoints in a fragment: endpoint chains and fast-path endpoints.
fn endpoint_count(t: &Table) -> usize {
    t.chains.keys().filter(|c| c.starts_with("ep-")).count()
        + t.sets
            .get("fast-endpoints")
            .map(|s| s.elements.len())
            .unwrap_or(0)
}

impl Proxier {
    pub fn new(
        node: impl Into<NodeInfo>,
        stack: Stack,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ProxyError> {
        Ok(Proxier {
            node: node.into(),
            stack,
            services: BTreeMap::new(),
            slices: BTreeMap::new(),
            by_service: BTreeMap::new(),
            dirty: BTreeSet::new(),
            applied: None,
            conn: Some(Conn::open()?),
            metrics,
            endpoints: 0,
            last_ok: None,
            touched: BTreeSet::new(),
            expect_use: None,
            elsewhere: HashSet::new(),
            with_health: BTreeSet::new(),
        })
    }

    /// Takes one delta from the object source into the proxy's view (the
    /// `watch` verb); true if it concerns the proxy. Only Services,
    /// EndpointSlices and this node's Node matter.
    pub fn watch(&mut self, d: &Delta) -> bool {
        let key = d.key();
        let ns = key.namespace.clone().unwrap_or_else(|| "default".into());
        match (key.kind, d.object()) {
            (Kind::Node, o) => self.watch_node(&key.name, o),
            (Kind::Service, o) => {
                let id = format!("{ns}/{}", key.name);
                self.dirty.insert(id.clone());
                self.touched.insert(id.clone());
                self.elsewhere.remove(&id);
                self.with_health.remove(&id);
                match o {
                    Some(Object::Service(svc)) => {
                        if programmed_ip(svc, &self.stack).is_none() {
                            self.elsewhere.insert(id.clone());
                        }
                        if healthcheck::port(svc).is_some() {
                            self.with_health.insert(id.clone());
                        }
                        self.services.insert(id, encode(svc.as_ref()));
                    }
                    _ => {
                        self.services.remove(&id);
                    }
                }
                true
            }
            (Kind::EndpointSlice, o) => {
                let skey = format!("{ns}/{}", key.name);
                if let Some((old, _)) = self.slices.remove(&skey) {
                    if let Some(set) = self.by_service.get_mut(&old) {
                        set.remove(&skey);
                    }
                    self.touched.insert(old.clone());
                    self.dirty.insert(old);
                }
                let Some(obj @ Object::EndpointSlice(slice)) = o else {
                    return true;
                };
                let Some(id) = service_id(obj) else {
                    return true;
                };
                self.dirty.insert(id.clone());
                self.touched.insert(id.clone());
                self.by_service
                    .entry(id.clone())
                    .or_default()
                    .insert(skey.clone());
                self.slices.insert(skey, (id, encode(slice.as_ref())));
                true
            }
            _ => false,
        }
    }

    /// This node's zone label decides which topology hints apply: when it
    /// changes, the next sync replaces the whole table (as kube-proxy
    /// resyncs on a node label change). A partial sync could not do it:
    /// the applied fragments are remembered as their inputs and re-planned
    /// with the node as it is now, so old and new would look alike.
    fn watch_node(&mut self, name: &str, o: Option<&Object>) -> bool {
        if name != self.node.name {
            return false;
        }
        let zone = match o {
            Some(Object::Node(n)) => n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("topology.kubernetes.io/zone"))
                .cloned(),
            _ => None,
        };
        if zone == self.node.zone {
            return false;
        }
        self.node.zone = zone;
        self.applied = None;
        true
    }

    /// The current inputs of Service `id` (shared bytes, no copies).
    fn inputs(&self, id: &str) -> Inputs {
        Inputs {
            service: self.services.get(id).cloned(),
            slices: self
                .by_service
                .get(id)
                .into_iter()
                .flatten()
                .filter_map(|k| self.slices.get(k).map(|(_, r)| r.clone()))
                .collect(),
        }
    }

    /// Plans one Service's fragment from its inputs.
    fn plan(&self, i: &Inputs) -> Table {
        let svc = i.service.as_deref().and_then(decode_service);
        let slices = decode_slices(&i.slices);
        fragment(svc.as_ref(), &slices, &self.node, &self.stack)
    }

    /// The table's use count; None when it is missing or unreadable.
    fn table_use(&mut self) -> Option<u32> {
        let c = self.conn.as_mut()?;
        c.table_use(self.stack.family, TABLE).ok().flatten()
    }

    fn record_use(&mut self) {
        self.expect_use = self.table_use();
    }

    /// Services changed since the last call.
    pub fn take_touched(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.touched)
    }

    /// What Service `id`'s health-check node port should report here.
    pub fn health_target(&self, id: &str) -> Option<(u16, healthcheck::Target)> {
        let i = self.inputs(id);
        let svc = decode_service(i.service.as_deref()?)?;
        let slices = decode_slices(&i.slices);
        let refs: Vec<&EndpointSlice> = slices.iter().collect();
        healthcheck::target(&svc, &refs, &self.node.name)
    }

    /// The health-check target of every Service that has one (after a
    /// relist; the others have none to report).
    pub fn health_targets(&self) -> BTreeMap<String, Option<(u16, healthcheck::Target)>> {
        self.with_health
            .iter()
            .map(|id| (id.clone(), self.health_target(id)))
            .collect()
    }

    /// Forgets what is applied: the next sync replaces the whole table.
    pub fn reset(&mut self) {
        self.applied = None;
        self.services.clear();
        self.slices.clear();
        self.by_service.clear();
        self.dirty.clear();
        self.elsewhere.clear();
        self.with_health.clear();
    }

    /// Replaces the whole table in one transaction, streamed Service by
    /// Service: each fragment is planned, encoded onto the wire buffer and
    /// dropped, so the peak is the batch's wire size, not the ruleset held
    /// as trees.
    fn full_sync(&mut self, t0: Instant) -> Result<usize, ProxyError> {
        self.dirty.clear();
        let ids: Vec<String> = self
            .services
            .keys()
            .cloned()
            .chain(self.by_service.keys().cloned())
            .filter(|id| !self.elsewhere.contains(id))
            .collect::<BTreeSet<String>>()
            .into_iter()
            .collect();
        let empty = shell(&self.stack);
        // A restarted agent does not know what the last one removed
        // without flushing (it may have stopped in between): it reconciles
        // UDP conntrack entries against the new table's front ends, if
        // there are any such entries.
        let reconcile = crate::stale::any_udp_nat();
        type Chunk = (Vec<Change>, Vec<(String, Applied)>, UdpView);
        let chunk_of = |k: usize, this: &Proxier| -> Option<Chunk> {
            if k == 0 {
                return Some((
                    podnet_nft::diff::replace(&base_table(&this.stack, &this.node)),
                    Vec::new(),
                    UdpView::default(),
                ));
            }
            let group = ids.get((k - 1) * FULL_SYNC_GROUP..)?;
            if group.is_empty() {
                return None;
            }
            let mut changes = Vec::new();
            let mut applied = Vec::new();
            let mut udp = UdpView::default();
            for id in group.iter().take(FULL_SYNC_GROUP) {
                let inputs = this.inputs(id);
                let f = this.plan(&inputs);
                let endpoints = endpoint_count(&f);
                if reconcile {
                    udp.merge(UdpView::of(&f));
                }
                changes.extend(fragment_diff(empty.clone(), f));
                applied.push((id.clone(), Applied { inputs, endpoints }));
            }
            Some((elements_last(changes), applied, udp))
        };
        let mut planned: BTreeMap<String, Applied> = BTreeMap::new();
        let mut udp = UdpView::default();
        let mut n = 0;
        let shell_table = Table::new(self.stack.family, TABLE);
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => Conn::open().map_err(|e| ProxyError::Other(e.to_string()))?,
        };
        let res = {
            let this: &Proxier = self;
            let r = conn.apply_chunks(
                &shell_table,
                &mut |k| {
                    let (changes, applied, u) = chunk_of(k, this)?;
                    n += ops(&changes);
                    planned.extend(applied);
                    udp.merge(u);
                    Some(changes)
                },
                &|k| chunk_of(k, this).map(|(c, ..)| c).unwrap_or_default(),
            );
            r.map_err(|e| e.to_string())
        };
        self.conn = Some(conn);
        let flush = match reconcile {
            true => Flush::Reconcile(udp, self.stack.service_cidr),
            false => Flush::Gone(BTreeSet::new()),
        };
        self.finish(t0, true, n, res, planned, flush)
    }

    /// One sync of what was watched since the last one (plan, observe,
    /// diff, apply); returns the number of operations sent. The agent's
    /// loop drives the same verbs through [`podnet_reconcile`]; this is for
    /// tests and benchmarks that drive a proxier by hand.
    pub fn sync(&mut self) -> Result<usize, ProxyError> {
        let scope = Scope::Only(std::mem::take(&mut self.dirty));
        podnet_reconcile::sync(self, &scope).map_err(|e| ProxyError::Other(e.0))
    }
}

/// What one proxier's sync will do, before the kernel is consulted.
pub enum ProxyPlan {
    /// Replace the whole table (the first sync, a sync after a failure or
    /// a zone change). Planned while it is encoded, Service by Service, so
    /// the peak is the wire buffer and not the ruleset as trees.
    Full,
    /// The new fragments of the dirty Services, with their inputs.
    Partial(Vec<(String, Inputs, Table)>),
}

/// What one proxier's sync sends.
pub enum ProxyChanges {
    /// Replace the table.
    Replace,
    /// Per-Service fragment changes, as one batch.
    Partial {
        changes: Vec<Change>,
        planned: BTreeMap<String, Applied>,
        gone_udp: BTreeSet<crate::stale::Port>,
    },
}

impl Subsystem for Proxier {
    type Input = Vec<Delta>;
    type Key = String;
    type Plan = ProxyPlan;
    /// The table's use count (chains + sets): equal to what our last apply
    /// left unless someone changed the table. None: missing or unreadable.
    type Observed = Option<u32>;
    type Changes = ProxyChanges;

    fn name(&self) -> &'static str {
        match self.stack.family {
            podnet_nft::model::Family::Ip6 => "proxy-ipv6",
            _ => "proxy-ipv4",
        }
    }

    fn watch(&mut self, input: Vec<Delta>, dirty: &mut BTreeSet<String>) {
        for d in &input {
            Proxier::watch(self, d);
        }
        dirty.append(&mut self.dirty);
    }

    fn plan(&self, scope: &Scope<String>) -> ProxyPlan {
        match (scope, &self.applied) {
            (Scope::Only(ids), Some(_)) => ProxyPlan::Partial(
                ids.iter()
                    .map(|id| {
                        let inputs = self.inputs(id);
                        let t = Proxier::plan(self, &inputs);
                        (id.clone(), inputs, t)
                    })
                    .collect(),
            ),
            _ => ProxyPlan::Full,
        }
    }

    fn observe(&mut self, _scope: &Scope<String>) -> Result<Option<u32>, SyncError> {
        Ok(self.table_use())
    }

    fn diff(&self, plan: ProxyPlan, observed: Option<u32>) -> ProxyChanges {
        let ProxyPlan::Partial(fragments) = plan else {
            return ProxyChanges::Replace;
        };
        let Some(applied) = &self.applied else {
            return ProxyChanges::Replace;
        };
        if observed.is_none() || observed != self.expect_use {
            // Someone deleted the table or one of its chains or sets.
            tracing::warn!(
                "table {} {TABLE} changed outside podnet (use {observed:?}, expected {:?}); rebuilding it",
                self.stack.family.name(),
                self.expect_use
            );
            return ProxyChanges::Replace;
        }
        let mut planned: BTreeMap<String, Applied> = BTreeMap::new();
        let mut changes: Vec<Change> = Vec::new();
        let mut gone_udp = BTreeSet::new();
        for (id, inputs, new) in fragments {
            let old = Proxier::plan(
                self,
                &applied
                    .get(&id)
                    .map(|a| a.inputs.clone())
                    .unwrap_or_default(),
            );
            gone_udp.extend(
                udp_endpoints(&old)
                    .difference(&udp_endpoints(&new))
                    .cloned(),
            );
            let endpoints = endpoint_count(&new);
            changes.extend(fragment_diff(old, new));
            planned.insert(id, Applied { inputs, endpoints });
        }
        ProxyChanges::Partial {
            changes,
            planned,
            gone_udp,
        }
    }

    fn apply(&mut self, changes: ProxyChanges) -> Result<usize, SyncError> {
        let t0 = Instant::now();
        let r = match changes {
            ProxyChanges::Replace => self.full_sync(t0),
            ProxyChanges::Partial {
                changes,
                planned,
                gone_udp,
            } => {
                let n = ops(&changes);
                let res = if n == 0 {
                    Ok(())
                } else {
                    let table = Table::new(self.stack.family, TABLE);
                    match &mut self.conn {
                        Some(c) => c.apply(&table, &changes).map_err(|e| e.to_string()),
                        None => Err("no nfnetlink socket".to_string()),
                    }
                };
                self.finish(t0, false, n, res, planned, Flush::Gone(gone_udp))
            }
        };
        r.map_err(|e| SyncError(e.to_string()))
    }

    /// A resync only observes: the table is rebuilt when it drifted.
    fn resync(&self) -> Scope<String> {
        Scope::Only(BTreeSet::new())
    }
}

impl Proxier {
    /// Records the outcome of an applied sync: state, counters, metrics.
    fn finish(
        &mut self,
        t0: Instant,
        full: bool,
        n: usize,
        res: Result<(), String>,
        planned: BTreeMap<String, Applied>,
        flush: Flush,
    ) -> Result<usize, ProxyError> {
        let fam = self.stack.label();
        match res {
            Ok(()) => {
                if n > 0 {
                    crate::stale::flush(&flush);
                    self.record_use();
                }
                self.remember(planned);
                self.last_ok = Some(Instant::now());
                if n == 0 {
                    return Ok(0);
                }
                self.record_sync(t0, full, n);
                Ok(n)
            }
            Err(e) => {
                self.applied = None;
                self.conn = Conn::open().ok();
                self.metrics.count(
                    &PROXY_SYNC_FAILURES_TOTAL,
                    &format!("family=\"{fam}\""),
                    1.0,
                );
                Err(ProxyError::Other(format!("service sync ({fam}): {e}")))
            }
        }
    }

    /// Takes what a successful sync applied as the kernel's state: the
    /// fragments it planned (a full sync's replace everything; a partial
    /// sync's replace or drop theirs), and the endpoint count with them.
    fn remember(&mut self, planned: BTreeMap<String, Applied>) {
        match &mut self.applied {
            Some(a) => {
                for (id, p) in planned {
                    let before = a.get(&id).map(|x| x.endpoints).unwrap_or(0);
                    let live = !p.inputs.is_empty();
                    let after = if live { p.endpoints } else { 0 };
                    self.endpoints = (self.endpoints + after).saturating_sub(before);
                    if live {
                        a.insert(id, p);
                    } else {
                        a.remove(&id);
                    }
                }
            }
            None => {
                self.endpoints = planned.values().map(|a| a.endpoints).sum();
                self.applied = Some(planned);
            }
        }
    }

    /// The metrics and log line of a sync that applied `n` operations,
    /// started at `t0`.
    fn record_sync(&self, t0: Instant, full: bool, n: usize) {
        let fam = self.stack.label();
        let kind = if full { "full" } else { "partial" };
        let secs = t0.elapsed().as_secs_f64();
        let labels = format!("kind=\"{kind}\",family=\"{fam}\"");
        let fam_label = format!("family=\"{fam}\"");
        self.metrics
            .sample(&PROXY_SYNC_DURATION_SECONDS, &labels, secs);
        self.metrics
            .sample(&PROXY_SYNC_OPERATIONS, &labels, n as f64);
        self.metrics
            .count(&PROXY_SYNC_OPERATIONS_TOTAL, &fam_label, n as f64);
        self.metrics.gauge(
            &PROXY_LAST_SYNC_TIMESTAMP_SECONDS,
            &fam_label,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
        self.metrics
            .gauge(&PROXY_SERVICES, &fam_label, self.services.len() as f64);
        self.metrics
            .gauge(&PROXY_ENDPOINTS, &fam_label, self.endpoints as f64);
        tracing::debug!(
            kind,
            family = fam,
            ops = n,
            ms = secs * 1000.0,
            "service sync"
        );
    }
}

/// The service proxy as one reconcile subsystem: a [`Proxier`] per
/// address family (each applies its own batch), and the health-check node
/// ports, which follow the first family's view of Services (every proxier
/// sees the same Services and slices).
pub struct ServiceProxy {
    ps: Vec<Proxier>,
    health: healthcheck::Server,
    /// The proxy's own `/healthz` (kube-proxy's :10256), if served.
    healthz: Option<Arc<Health>>,
}

impl ServiceProxy {
    pub fn new(
        node: NodeInfo,
        stacks: Vec<Stack>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ProxyError> {
        Ok(ServiceProxy {
            ps: stacks
                .into_iter()
                .map(|st| Proxier::new(node.clone(), st, metrics.clone()))
                .collect::<Result<Vec<_>, _>>()?,
            health: healthcheck::Server::new(),
            healthz: None,
        })
    }

    /// Reports queued inputs, syncs and this node's Node to `h`.
    pub fn with_healthz(mut self, h: Arc<Health>) -> Self {
        self.healthz = Some(h);
        self
    }
}

impl Subsystem for ServiceProxy {
    type Input = Vec<Delta>;
    type Key = String;
    type Plan = Vec<ProxyPlan>;
    type Observed = Vec<Option<u32>>;
    type Changes = Vec<ProxyChanges>;

    fn name(&self) -> &'static str {
        "proxy"
    }

    fn watch(&mut self, input: Vec<Delta>, dirty: &mut BTreeSet<String>) {
        if let (Some(h), Some(p)) = (&self.healthz, self.ps.first()) {
            for d in &input {
                let key = d.key();
                if key.kind == Kind::Node && key.name == p.node.name {
                    h.node(match d.object() {
                        Some(Object::Node(n)) => Some(n.as_ref()),
                        _ => None,
                    });
                }
            }
        }
        for p in &mut self.ps {
            Subsystem::watch(p, input.clone(), dirty);
        }
        if let (Some(h), false) = (&self.healthz, dirty.is_empty()) {
            h.queued();
        }
    }

    fn plan(&self, scope: &Scope<String>) -> Vec<ProxyPlan> {
        self.ps.iter().map(|p| Subsystem::plan(p, scope)).collect()
    }

    fn observe(&mut self, scope: &Scope<String>) -> Result<Vec<Option<u32>>, SyncError> {
        self.ps
            .iter_mut()
            .map(|p| Subsystem::observe(p, scope))
            .collect()
    }

    fn diff(&self, plan: Vec<ProxyPlan>, observed: Vec<Option<u32>>) -> Vec<ProxyChanges> {
        self.ps
            .iter()
            .zip(plan.into_iter().zip(observed))
            .map(|(p, (pl, ob))| Subsystem::diff(p, pl, ob))
            .collect()
    }

    /// Applies every family's batch; a failure in one fails the sync (the
    /// loop retries with a full sync) after the others were applied.
    fn apply(&mut self, changes: Vec<ProxyChanges>) -> Result<usize, SyncError> {
        let mut n = 0;
        let mut err = None;
        for (p, c) in self.ps.iter_mut().zip(changes) {
            match Subsystem::apply(p, c) {
                Ok(k) => n += k,
                Err(e) => err = Some(e),
            }
        }
        err.map_or(Ok(n), Err)
    }

    fn resync(&self) -> Scope<String> {
        Scope::Only(BTreeSet::new())
    }

    fn synced(&mut self, scope: &Scope<String>, ok: bool) {
        if let (Some(h), true) = (&self.healthz, ok) {
            h.updated();
        }
        let Some(p) = self.ps.first_mut() else { return };
        if scope.is_full() {
            p.take_touched();
            self.health.resync(p.health_targets());
        } else {
            for id in p.take_touched() {
                self.health.update(&id, p.health_target(&id));
            }
        }
    }
}

/// Runs the proxy until `shutdown`: a [`ServiceProxy`] in the reconcile
/// loop, fed by one subscription to the object source (Services,
/// EndpointSlices and Nodes); the rules stay in place afterwards.
///
/// Nothing is synced before the source's view is complete: a restarted
/// agent's first sync replaces the table with one built from every Service
/// and slice, so established connections keep their endpoints.
pub async fn run(
    sub: Subscription,
    node: NodeInfo,
    stacks: Vec<Stack>,
    resync: Duration,
    healthz: Option<Arc<Health>>,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ProxyError> {
    let mut proxy = ServiceProxy::new(node, stacks, metrics.clone())?;
    if let Some(h) = healthz {
        proxy = proxy.with_healthz(h);
    }
    podnet_reconcile::run(
        proxy,
        podnet_reconcile::from_subscription(sub),
        podnet_reconcile::Options::new(resync),
        metrics,
        shutdown,
    )
    .await;
    Ok(())
}

/// Removes the proxy's tables (for --cleanup); returns the ones removed.
pub fn cleanup() -> Result<Vec<String>, ProxyError> {
    let mut c = Conn::open()?;
    let mut gone = Vec::new();
    for fam in [
        podnet_nft::model::Family::Ip,
        podnet_nft::model::Family::Ip6,
    ] {
        if c.delete_table(fam, TABLE)? {
            gone.push(format!("{} {TABLE}", fam.name()));
        }
    }
    Ok(gone)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::fragment;

    fn service(eps: &[&str]) -> (Service, EndpointSlice) {
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.9", "ports": [{"port": 80, "protocol": "UDP"}]}
        }))
        .unwrap();
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": eps.iter().map(|a| serde_json::json!({"addresses": [a]})).collect::<Vec<_>>(),
            "ports": [{"port": 53, "protocol": "UDP"}]
        }))
        .unwrap();
        (svc, slice)
    }

    #[test]
    fn kept_bytes_decode_straight_into_typed_objects() {
        let (svc, slice) = service(&["10.244.1.2"]);
        let raw = encode(&svc);
        assert_eq!(
            serde_json::from_slice::<Service>(&raw).unwrap().spec,
            svc.spec
        );
        let raw = encode(&slice);
        let back = serde_json::from_slice::<EndpointSlice>(&raw).unwrap();
        assert_eq!(back.endpoints, slice.endpoints);
    }

    #[test]
    fn a_fast_port_changing_its_endpoint_count_moves_between_count_sets() {
        let stack = Stack::v4("10.244.0.0/16".parse().unwrap());
        let (s1, e1) = service(&["10.244.1.2"]);
        let (s2, e2) = service(&["10.244.1.2", "10.244.2.2"]);
        let old = fragment(Some(&s1), &[e1], &"n1".into(), &stack);
        let new = fragment(Some(&s2), &[e2], &"n1".into(), &stack);
        assert_eq!(endpoint_count(&old), 1);
        assert_eq!(endpoint_count(&new), 2);
        assert_eq!(
            udp_endpoints(&new),
            BTreeSet::from([
                ("10.244.1.2".parse().unwrap(), 53),
                ("10.244.2.2".parse().unwrap(), 53)
            ])
        );
        let d = fragment_diff(old.clone(), new);
        assert!(
            d.iter()
                .all(|c| matches!(c, Change::AddElems { .. } | Change::DelElems { .. })),
            "{d:?}"
        );
        let names = |del: bool| -> BTreeSet<String> {
            d.iter()
                .filter_map(|c| match c {
                    Change::DelElems { set, .. } if del => Some(set.clone()),
                    Change::AddElems { set, .. } if !del => Some(set.clone()),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(names(true), BTreeSet::from(["fast-1".to_string()]));
        assert!(names(false).contains("fast-2"), "{d:?}");
        // Against the shell (a full sync), a fragment is only elements.
        let full = fragment_diff(crate::rules::shell(&stack), old);
        assert!(full.iter().all(|c| matches!(c, Change::AddElems { .. })));
        // A fragment's own sets (affinity) are created with it.
        let (mut s3, e3) = service(&["10.244.1.2"]);
        s3.spec.as_mut().unwrap().session_affinity = Some("ClientIP".into());
        let aff = fragment(Some(&s3), &[e3], &"n1".into(), &stack);
        let d = fragment_diff(crate::rules::shell(&stack), aff);
        assert!(
            d.iter()
                .any(|c| matches!(c, Change::AddSet { name, .. } if name.starts_with("aff-"))),
            "{d:?}"
        );
    }

    fn svc(name: &str, spec: serde_json::Value) -> Delta {
        let o = serde_json::json!({
            "kind": "Service", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec
        });
        Delta::Updated(Arc::new(Object::from_value(o).unwrap()))
    }

    /// A relist's health-check resync visits the Services that have a
    /// health-check port, not all 10,000: before, it decoded every Service
    /// (about 140 ms at 10,000, holding the first change after a cold
    /// start), and a Service that loses its port still loses it.
    #[test]
    fn health_targets_are_only_the_services_with_a_health_check_port() {
        let mut p = Proxier::new(
            "n1",
            Stack::v4("10.244.0.0/16".parse().unwrap()),
            Arc::new(Metrics::default()),
        )
        .unwrap();
        let lb = serde_json::json!({"type": "LoadBalancer", "clusterIP": "10.96.0.3",
            "externalTrafficPolicy": "Local", "healthCheckNodePort": 31999,
            "ports": [{"port": 80, "nodePort": 30080}]});
        for d in [
            svc(
                "plain",
                serde_json::json!({"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}),
            ),
            svc(
                "lb-cluster",
                serde_json::json!({"type": "LoadBalancer", "clusterIP": "10.96.0.2",
                "ports": [{"port": 80, "nodePort": 30081}]}),
            ),
            svc("lb-local", lb.clone()),
        ] {
            p.watch(&d);
        }
        let keys = |p: &Proxier| p.health_targets().into_keys().collect::<Vec<_>>();
        assert_eq!(keys(&p), ["default/lb-local"]);
        let mut cluster = lb;
        cluster["externalTrafficPolicy"] = "Cluster".into();
        p.watch(&svc("lb-local", cluster));
        assert!(keys(&p).is_empty(), "{:?}", keys(&p));
    }

    /// What a family's full sync may skip unplanned: exactly the Services
    /// whose fragment in that family is empty.
    #[test]
    fn a_family_programs_only_services_with_a_cluster_ip_of_its_own() {
        let v4 = Stack::v4("10.244.0.0/16".parse().unwrap());
        let v6 = Stack::v6(Some("fd00:244::/48".parse().unwrap()));
        let cases = [
            (
                serde_json::json!({"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}),
                true,
                false,
            ),
            (
                serde_json::json!({"clusterIP": "fd00:96::1", "clusterIPs": ["fd00:96::1"],
                "ports": [{"port": 80}]}),
                false,
                true,
            ),
            (
                serde_json::json!({"clusterIP": "10.96.0.2", "clusterIPs": ["10.96.0.2", "fd00:96::2"],
                "ipFamilyPolicy": "RequireDualStack", "ports": [{"port": 80}]}),
                true,
                true,
            ),
            (
                serde_json::json!({"type": "ExternalName", "externalName": "example.org"}),
                false,
                false,
            ),
            (
                serde_json::json!({"clusterIP": "None", "ports": [{"port": 80}]}),
                false,
                false,
            ),
        ];
        for (spec, in4, in6) in cases {
            let s: Service = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "s", "namespace": "default"}, "spec": spec
            }))
            .unwrap();
            for (stack, want) in [(&v4, in4), (&v6, in6)] {
                let got = crate::rules::programmed_ip(&s, stack).is_some();
                assert_eq!(got, want, "{:?} in {:?}", s.spec, stack.family);
                let empty =
                    fragment(Some(&s), &[], &"n1".into(), stack) == crate::rules::shell(stack);
                assert_eq!(empty, !want, "{:?} in {:?}", s.spec, stack.family);
            }
        }
    }

    #[test]
    fn a_full_sync_chunk_creates_before_it_fills_and_merges_elements_per_set() {
        let e = |s: &str, v: u32| Change::AddElems {
            set: s.into(),
            elems: vec![(vec![Value::U32(v)], None)],
        };
        let chain = |n: &str| Change::AddChain {
            name: n.into(),
            base: None,
        };
        let got = elements_last(vec![
            e("a", 1),
            chain("x"),
            e("b", 2),
            e("a", 3),
            chain("y"),
        ]);
        let want = vec![
            chain("x"),
            chain("y"),
            Change::AddElems {
                set: "a".into(),
                elems: vec![(vec![Value::U32(1)], None), (vec![Value::U32(3)], None)],
            },
            e("b", 2),
        ];
        assert_eq!(got, want);
        assert_eq!(ops(&got), 5);
    }
}
