//! One address family's table (`ip podnet` or `ip6 podnet`), kept equal to
//! the plan through the shared sync layer ([`podnet_nft::sync`]), doing
//! work proportional to what changed.
//!
//! Each Service owns a fragment of the table ([`crate::rules::fragment`]):
//! its map elements, chains and affinity sets. A partial sync re-plans only
//! the dirty Services' fragments, diffs each against what was applied, and
//! sends the changes as one batch: atomic, no `nft` process, no table
//! re-read. What the kernel holds is not kept as rules: it is remembered as
//! the [`Inputs`] the applied fragment was planned from, and re-planned
//! when that Service changes, since planning is pure.
//!
//! The first sync (and any sync after a failure, a drift or a zone change)
//! replaces the whole table in one transaction, streamed Service by
//! Service, so a restarted agent never leaves a half-built table and
//! established connections keep their conntrack NAT state.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Instant;

use podnet_daemon::Metrics;
use podnet_nft::diff::{diff, ops, Change};
use podnet_nft::model::{Set, Table};
use podnet_nft::sync::{elements_last, TableSync};

use crate::inputs::{Decoded, InputStore, Inputs};
use crate::rules::{
    base_table, fragment, is_fast_count_set, programmed_ip, shell, NodeInfo, Stack, TABLE,
};
use crate::stale::{udp_endpoints, Flush, Port, UdpView};
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

/// Services planned into one chunk of a full sync: their element
/// additions to each shared set go out as one message instead of one per
/// Service, which is most of a full sync's kernel work.
const FULL_SYNC_GROUP: usize = 64;

/// What the kernel holds for one Service.
pub struct Applied {
    inputs: Inputs,
    endpoints: usize,
}

/// One Service's new fragment in a partial sync, with the inputs it was
/// planned from.
pub struct Planned {
    pub id: String,
    pub inputs: Inputs,
    pub fragment: Table,
}

/// What one family's sync sends.
pub enum FamilyChanges {
    /// Replace the table.
    Replace,
    /// Per-Service fragment changes, as one batch.
    Partial {
        changes: Vec<Change>,
        planned: BTreeMap<String, Applied>,
        gone_udp: BTreeSet<Port>,
    },
}

/// The changes from one Service fragment to another. The per-count sets of
/// the fast path are declared by the base table and appear in a fragment
/// only when it uses one: each side gets the other's missing declarations
/// of those, so the diff carries their element changes, never their
/// creation or removal. A fragment's own sets (affinity) are diffed as
/// they are.
pub(crate) fn fragment_diff(mut old: Table, mut new: Table) -> Vec<Change> {
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

/// Endpoints in a fragment: endpoint chains and fast-path endpoints.
pub(crate) fn endpoint_count(t: &Table) -> usize {
    t.chains.keys().filter(|c| c.starts_with("ep-")).count()
        + t.sets
            .get("fast-endpoints")
            .map(|s| s.elements.len())
            .unwrap_or(0)
}

/// What one sync sent, for its bookkeeping once the kernel answered.
struct Sent {
    t0: Instant,
    full: bool,
    ops: usize,
    planned: BTreeMap<String, Applied>,
    flush: Flush,
}

/// One family's table and what it holds.
pub struct FamilyTable {
    pub(crate) stack: Stack,
    /// What the kernel holds, per Service; None: unknown (full sync next).
    applied: Option<BTreeMap<String, Applied>>,
    table: TableSync,
    metrics: Arc<Metrics>,
    /// Endpoints programmed, kept up to date per change (not recounted).
    endpoints: usize,
    /// Services this family's table holds nothing of
    /// ([`crate::rules::programmed_ip`]): a full sync skips them unplanned
    /// (the IPv6 table of a cluster whose Services are IPv4 plans none).
    elsewhere: HashSet<String>,
}

impl FamilyTable {
    pub fn new(stack: Stack, metrics: Arc<Metrics>) -> Result<Self, ProxyError> {
        Ok(FamilyTable {
            table: TableSync::open(stack.family, TABLE)?,
            stack,
            applied: None,
            metrics,
            endpoints: 0,
            elsewhere: HashSet::new(),
        })
    }

    pub fn name(&self) -> &'static str {
        match self.stack.family {
            podnet_nft::model::Family::Ip6 => "proxy-ipv6",
            _ => "proxy-ipv4",
        }
    }

    /// Takes note of Service `id`'s new version (None: deleted).
    pub fn service_changed(
        &mut self,
        id: &str,
        svc: Option<&podnet_api::k8s_openapi::api::core::v1::Service>,
    ) {
        match svc {
            Some(s) if programmed_ip(s, &self.stack).is_none() => {
                self.elsewhere.insert(id.to_string());
            }
            _ => {
                self.elsewhere.remove(id);
            }
        }
    }

    /// Forgets what is applied: the next sync replaces the whole table.
    pub fn forget(&mut self) {
        self.applied = None;
    }

    pub fn forget_services(&mut self) {
        self.elsewhere.clear();
    }

    /// Whether the next sync must replace the table.
    pub fn needs_full(&self) -> bool {
        self.applied.is_none() || !self.table.loaded()
    }

    /// Plans one Service's fragment.
    pub fn plan(&self, d: &Decoded, node: &NodeInfo) -> Table {
        fragment(d.service.as_ref(), &d.slices, node, &self.stack)
    }

    /// The table's use count (chains + sets): equal to what our last apply
    /// left unless someone changed the table. None: missing or unreadable.
    pub fn observe(&mut self) -> Option<u32> {
        self.table.observe_use().ok().flatten()
    }

    /// A partial sync's changes: each new fragment against the old one,
    /// re-planned from the inputs it was applied from (`old`, decoded
    /// once for every family). A table that drifted is replaced.
    pub fn diff(
        &self,
        fragments: Vec<Planned>,
        old: &dyn Fn(&str, &Inputs) -> Table,
        observed: Option<u32>,
    ) -> FamilyChanges {
        let Some(applied) = self.applied.as_ref().filter(|_| self.table.loaded()) else {
            return FamilyChanges::Replace;
        };
        if observed.is_none() || self.table.drifted(observed) {
            // Someone deleted the table or one of its chains or sets.
            tracing::warn!(
                "table {} {TABLE} changed outside podnet (use {observed:?}, expected {:?}); rebuilding it",
                self.stack.family.name(),
                self.table.expected_use()
            );
            return FamilyChanges::Replace;
        }
        let mut planned: BTreeMap<String, Applied> = BTreeMap::new();
        let mut changes: Vec<Change> = Vec::new();
        let mut gone_udp = BTreeSet::new();
        for Planned {
            id,
            inputs,
            fragment,
        } in fragments
        {
            let before = applied
                .get(&id)
                .map(|a| a.inputs.clone())
                .unwrap_or_default();
            let was = old(&id, &before);
            gone_udp.extend(
                udp_endpoints(&was)
                    .difference(&udp_endpoints(&fragment))
                    .cloned(),
            );
            let endpoints = endpoint_count(&fragment);
            changes.extend(fragment_diff(was, fragment));
            planned.insert(id, Applied { inputs, endpoints });
        }
        FamilyChanges::Partial {
            changes,
            planned,
            gone_udp,
        }
    }

    /// The inputs of Service `id` as applied (for sharing a decode between
    /// families).
    pub fn applied_inputs(&self, id: &str) -> Inputs {
        self.applied
            .as_ref()
            .and_then(|a| a.get(id))
            .map(|a| a.inputs.clone())
            .unwrap_or_default()
    }

    /// Sends one sync; returns the number of operations.
    pub fn apply(
        &mut self,
        changes: FamilyChanges,
        store: &InputStore,
        node: &NodeInfo,
    ) -> Result<usize, ProxyError> {
        let t0 = Instant::now();
        match changes {
            FamilyChanges::Replace => self.full_sync(t0, store, node),
            FamilyChanges::Partial {
                changes,
                planned,
                gone_udp,
            } => {
                let n = ops(&changes);
                let res = self.table.apply(&self.table.shell(), &changes);
                let done = Sent {
                    t0,
                    full: false,
                    ops: n,
                    planned,
                    flush: Flush::Gone(gone_udp),
                };
                self.finish(res, done, store.service_count())
            }
        }
    }

    /// Replaces the whole table in one transaction, streamed Service by
    /// Service: each fragment is planned, encoded onto the wire buffer and
    /// dropped, so the peak is the batch's wire size, not the ruleset held
    /// as trees.
    fn full_sync(
        &mut self,
        t0: Instant,
        store: &InputStore,
        node: &NodeInfo,
    ) -> Result<usize, ProxyError> {
        let ids: Vec<&String> = store
            .ids()
            .into_iter()
            .filter(|id| !self.elsewhere.contains(*id))
            .collect();
        let empty = shell(&self.stack);
        // A restarted agent does not know what the last one removed
        // without flushing (it may have stopped in between): it reconciles
        // UDP conntrack entries against the new table's front ends, if
        // there are any such entries.
        let reconcile = crate::stale::any_udp_nat();
        type Chunk = (Vec<Change>, Vec<(String, Applied)>, UdpView);
        let stack = &self.stack;
        let chunk_of = |k: usize| -> Option<Chunk> {
            if k == 0 {
                let replace = podnet_nft::diff::replace(&base_table(stack, node));
                return Some((replace, Vec::new(), UdpView::default()));
            }
            let group = ids.get((k - 1) * FULL_SYNC_GROUP..)?;
            if group.is_empty() {
                return None;
            }
            let (mut changes, mut applied, mut udp) = (Vec::new(), Vec::new(), UdpView::default());
            for id in group.iter().take(FULL_SYNC_GROUP) {
                let inputs = store.inputs(id);
                let d = inputs.decode();
                let f = fragment(d.service.as_ref(), &d.slices, node, stack);
                let endpoints = endpoint_count(&f);
                if reconcile {
                    udp.merge(UdpView::of(&f));
                }
                changes.extend(fragment_diff(empty.clone(), f));
                applied.push((id.to_string(), Applied { inputs, endpoints }));
            }
            Some((elements_last(changes), applied, udp))
        };
        let (mut planned, mut udp, mut n) = (BTreeMap::new(), UdpView::default(), 0);
        let shell_table = self.table.shell();
        let res = self.table.load(
            &shell_table,
            &mut |k| {
                let (changes, applied, u) = chunk_of(k)?;
                n += ops(&changes);
                planned.extend(applied);
                udp.merge(u);
                Some(changes)
            },
            &|k| chunk_of(k).map(|(c, ..)| c).unwrap_or_default(),
        );
        let flush = match reconcile {
            true => Flush::Reconcile(udp, self.stack.service_cidr),
            false => Flush::Gone(BTreeSet::new()),
        };
        self.applied = None;
        let done = Sent {
            t0,
            full: true,
            ops: n,
            planned,
            flush,
        };
        self.finish(res, done, store.service_count())
    }

    /// Records the outcome of an applied sync: state, counters, metrics.
    fn finish(
        &mut self,
        res: Result<(), podnet_kernel::KernelError>,
        sent: Sent,
        services: usize,
    ) -> Result<usize, ProxyError> {
        let Sent {
            t0,
            full,
            ops: n,
            planned,
            flush,
        } = sent;
        let fam = self.stack.label();
        if let Err(e) = res {
            self.applied = None;
            let label = format!("family=\"{fam}\"");
            self.metrics.count(&PROXY_SYNC_FAILURES_TOTAL, &label, 1.0);
            return Err(ProxyError::Other(format!("service sync ({fam}): {e}")));
        }
        if n > 0 {
            crate::stale::flush(&flush);
        }
        self.remember(planned);
        if n > 0 {
            self.record_sync(t0, full, n, services);
        }
        Ok(n)
    }

    /// Takes what a successful sync applied as the kernel's state: the
    /// fragments it planned (a full sync's replace everything; a partial
    /// sync's replace or drop theirs), and the endpoint count with them.
    fn remember(&mut self, planned: BTreeMap<String, Applied>) {
        let Some(a) = &mut self.applied else {
            self.endpoints = planned.values().map(|a| a.endpoints).sum();
            self.applied = Some(planned);
            return;
        };
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

    /// The metrics and log line of a sync that applied `n` operations,
    /// started at `t0`.
    fn record_sync(&self, t0: Instant, full: bool, n: usize, services: usize) {
        let fam = self.stack.label();
        let kind = if full { "full" } else { "partial" };
        let secs = t0.elapsed().as_secs_f64();
        let labels = format!("kind=\"{kind}\",family=\"{fam}\"");
        let fam_label = format!("family=\"{fam}\"");
        let m = &self.metrics;
        m.sample(&PROXY_SYNC_DURATION_SECONDS, &labels, secs);
        m.sample(&PROXY_SYNC_OPERATIONS, &labels, n as f64);
        m.count(&PROXY_SYNC_OPERATIONS_TOTAL, &fam_label, n as f64);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        m.gauge(&PROXY_LAST_SYNC_TIMESTAMP_SECONDS, &fam_label, now);
        m.gauge(&PROXY_SERVICES, &fam_label, services as f64);
        m.gauge(&PROXY_ENDPOINTS, &fam_label, self.endpoints as f64);
        tracing::debug!(
            kind,
            family = fam,
            ops = n,
            ms = secs * 1000.0,
            "service sync"
        );
    }
}
