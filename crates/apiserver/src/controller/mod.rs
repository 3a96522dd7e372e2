//! `podnet controller`: the API server's and the controller manager's
//! background networking duties in standalone mode.
//!
//! - ClusterIP and NodePort allocation for Services that have none (see
//!   [`crate::alloc`]: reservations are keys written in the same
//!   transaction as the Service, so concurrent allocators never collide);
//! - EndpointSlices for every Service with a selector, from ready Pods
//!   ([`endpoints`] is the pure planner), each endpoint with its Node's
//!   zone label, and the topology hints of `spec.trafficDistribution`;
//! - release of reservations a deleted Service held;
//! - LoadBalancer addresses from the IPAddressPools ([`lb`], LB IPAM),
//!   each reserved in the transaction that writes the Service's status.
//!
//! The controller is a [`Subsystem`] of the one reconcile loop
//! (`podnet_reconcile`), whose "kernel" is the store: one subscription to
//! the object source (standalone mode's store source) for Nodes, Services,
//! Pods, EndpointSlices, the NetworkConfig, IPAddressPools and Namespaces
//! (whose labels pools select by) is its input. Deltas mark
//! Services dirty (a Node whose zone label
//! changes marks the Services selecting a Pod on that Node, found through
//! a node -> Pods index, so the cost follows the Node's Pods, not the
//! cluster's Services times Pods); the loop coalesces a burst of deltas
//! into one sync, so work follows what changed. `plan` is the slices each
//! dirty Service should have ([`State::desired_slices`], pure); `observe`
//! reads the store only in a full sync (the reservations, for orphans);
//! `diff` compares with the slices the watch cache holds; `apply` writes,
//! one conditional write per object (the store has no multi-object batch
//! across Services). Watch gaps are the source's business (it relists and
//! delivers the difference). A failed write fails the sync, and the loop
//! retries with a full one; a periodic resync (full) repairs anything
//! edited behind our back and releases reservations no Service holds,
//! judged on the store itself (the allocator owns those keys, as the API
//! server owns its allocation bitmaps).
//!
//! Layout: [`state`] is the cache and its index, [`writes`] the store
//! writes of `apply`, [`lb`] the LoadBalancer addresses (state, decisions
//! through `podnet_lb::ipam`, and their writes).

mod lb;
mod state;
mod writes;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::netconfig::{self, Resolved};
use podnet_api::{Kind, Object};
use podnet_daemon::Metrics;
use podnet_reconcile::{Scope, Subsystem, SyncError};
use podnet_source::{Delta, Subscription};
use podnet_store::{KeyValue, Objects, Store, StoreError};

use crate::{alloc, endpoints, lbips};
pub use state::{Key, State};

pub(crate) const CONTROLLER_ALLOCATIONS_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_controller_allocations_total",
    "Services given addresses or ports.",
);
pub(crate) const CONTROLLER_ENDPOINTSLICE_WRITES_TOTAL: podnet_daemon::Counter =
    podnet_daemon::Counter::new(
        "podnet_controller_endpointslice_writes_total",
        "EndpointSlice writes.",
    );
pub(crate) const CONTROLLER_ERRORS_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_controller_errors_total",
    "Reconcile errors (retried).",
);
pub(crate) const CONTROLLER_PODS: podnet_daemon::Gauge =
    podnet_daemon::Gauge::new("podnet_controller_pods", "Pods known to the controller.");
pub(crate) const CONTROLLER_SERVICES: podnet_daemon::Gauge = podnet_daemon::Gauge::new(
    "podnet_controller_services",
    "Services known to the controller.",
);
pub(crate) const CONTROLLER_SNAPSHOTS_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_controller_snapshots_total",
    "Full passes over every Service and reservation.",
);

pub(crate) const CONTROLLER_LB_PENDING: podnet_daemon::Gauge = podnet_daemon::Gauge::new(
    "podnet_controller_lb_pending",
    "LoadBalancer Services without an address (the controller logs why).",
);

/// What the controller subscribes to.
pub const KINDS: [Kind; 7] = [
    Kind::Node,
    Kind::Service,
    Kind::Pod,
    Kind::EndpointSlice,
    Kind::NetworkConfig,
    Kind::IPAddressPool,
    Kind::Namespace,
];

pub struct Controller {
    objs: Objects,
    metrics: Arc<Metrics>,
    cfg: Resolved,
    state: State,
    hint: u64,
    /// Deleted Services whose reservations the next apply releases.
    gone: Vec<Service>,
    /// Pools, namespaces' labels and reservations for LB IPAM.
    lb: lb::LbState,
    /// Whether `/readyz` has been told the first sync went through.
    said_ready: bool,
}

fn default_cfg() -> Resolved {
    netconfig::NetworkConfig::default()
        .resolve()
        .expect("defaults resolve")
}

/// One slice write.
pub enum SliceWrite {
    Create(EndpointSlice),
    /// The desired slice, and the one it replaces.
    Update(EndpointSlice, Box<EndpointSlice>),
    Delete(EndpointSlice),
}

/// What a sync plans: per dirty Service, whether it lacks addresses or
/// ports, and the slices it should have.
pub struct ControllerPlan {
    full: bool,
    services: Vec<(Key, bool, Vec<EndpointSlice>)>,
    /// The Services whose load-balancer addresses are decided.
    lb: Vec<Key>,
}

/// What a sync writes.
#[derive(Default)]
pub struct ControllerChanges {
    /// A full sync: the reservations the store holds, and the keys of
    /// those a Service still holds (the rest are orphans).
    reservations: Option<(Vec<KeyValue>, HashSet<String>)>,
    allocate: Vec<Key>,
    slices: Vec<(Key, SliceWrite)>,
    lb: Vec<Key>,
}

impl Controller {
    pub fn new(objs: Objects, metrics: Arc<Metrics>) -> Self {
        Controller {
            objs,
            metrics,
            cfg: default_cfg(),
            state: State::default(),
            hint: std::process::id() as u64 * 7919,
            gone: Vec::new(),
            lb: lb::LbState::default(),
            said_ready: false,
        }
    }

    /// Runs until `shutdown` resolves, fed by `sub` (Nodes, Services, Pods,
    /// EndpointSlices and NetworkConfigs from the object source; see
    /// [`KINDS`]) through the reconcile loop. `resync` bounds how long a
    /// change made behind the controller's back can stay unrepaired: every
    /// period it reconciles every Service and releases orphaned
    /// reservations. Nothing is written before the source's first complete
    /// list. An object source that ends is an error.
    pub async fn run(
        self,
        sub: Subscription,
        resync: Duration,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), StoreError> {
        let asked = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = asked.clone();
        let shutdown = async move {
            shutdown.await;
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        };
        let metrics = self.metrics.clone();
        podnet_reconcile::run(
            self,
            podnet_reconcile::from_subscription(sub),
            podnet_reconcile::Options::new(resync),
            metrics,
            shutdown,
        )
        .await;
        match asked.load(std::sync::atomic::Ordering::SeqCst) {
            true => Ok(()),
            false => Err(StoreError::Backend("the object source stopped".into())),
        }
    }

    /// Takes one delta into the caches and marks the Services it affects.
    fn watch_delta(&mut self, d: &Delta, dirty: &mut BTreeSet<Key>) {
        let key = d.key();
        let k: Key = (key.namespace.clone().unwrap_or_default(), key.name.clone());
        let ns = k.0.clone();
        match (key.kind, d.object()) {
            (Kind::Service, Some(Object::Service(s))) => {
                dirty.insert(k.clone());
                for r in alloc::keys(s) {
                    self.state.remember_alloc(&r);
                }
                self.state.services.insert(k, (**s).clone());
            }
            (Kind::Service, None) => {
                dirty.insert(k.clone());
                if let Some(s) = self.state.services.remove(&k) {
                    self.gone.push(s);
                }
            }
            (Kind::Pod, o) => {
                let empty = BTreeMap::new();
                let old = self
                    .state
                    .pods
                    .get(&k)
                    .and_then(|o| o.metadata.labels.clone())
                    .unwrap_or_default();
                let new = match o {
                    Some(Object::Pod(p)) => p.metadata.labels.clone().unwrap_or_default(),
                    _ => BTreeMap::new(),
                };
                for labels in [&old, &new, &empty] {
                    dirty.extend(
                        endpoints::services_selecting(self.state.services_in(&ns), &ns, labels)
                            .into_iter()
                            .map(|n| (ns.clone(), n)),
                    );
                }
                let old = match o {
                    Some(Object::Pod(p)) => self.state.pods.insert(k.clone(), (**p).clone()),
                    _ => self.state.pods.remove(&k),
                };
                self.state.unindex_pod(old.as_ref(), &k);
                if let Some(Object::Pod(p)) = o {
                    self.state.index_pod(p, &k);
                }
            }
            (Kind::Node, o) => {
                let name = k.1;
                let zone = match o {
                    Some(Object::Node(n)) => endpoints::node_zone(n).map(str::to_string),
                    _ => None,
                };
                if self.state.zones.get(&name) == zone.as_ref() {
                    return;
                }
                match zone {
                    Some(z) => self.state.zones.insert(name.clone(), z),
                    None => self.state.zones.remove(&name),
                };
                // Every endpoint on the node carries its zone (and hints
                // derive from it): the Services selecting its Pods change.
                dirty.extend(self.state.services_on_node(&name));
            }
            (Kind::EndpointSlice, o) => {
                // A deleted slice's Service is known from the cache.
                let svc = match o {
                    Some(Object::EndpointSlice(s)) => endpoints::managed_service(s),
                    _ => self
                        .state
                        .slices
                        .get(&k)
                        .and_then(endpoints::managed_service),
                }
                .map(str::to_string);
                if let Some(svc) = svc {
                    dirty.insert((ns.clone(), svc));
                    match o {
                        Some(Object::EndpointSlice(s)) => {
                            self.state.slices.insert(k, (**s).clone());
                        }
                        _ => {
                            self.state.slices.remove(&k);
                        }
                    }
                }
            }
            (Kind::IPAddressPool | Kind::Namespace, o) => self.lb_watch(&key, o, dirty),
            (Kind::NetworkConfig, o) if key.name == netconfig::DEFAULT_NAME => match o {
                Some(Object::NetworkConfig(c)) => match c.resolve() {
                    Ok(r) => self.cfg = r,
                    Err((f, m)) => {
                        tracing::warn!("NetworkConfig {f}: {m}; keeping the previous settings")
                    }
                },
                _ => self.cfg = default_cfg(),
            },
            _ => {}
        }
    }

    /// The writes that bring Service `k`'s slices to `desired`, from what
    /// the watch cache holds.
    fn slice_writes(&self, k: &Key, desired: Vec<EndpointSlice>) -> Vec<SliceWrite> {
        let existing = self.state.existing_slices(k);
        let name = |s: &EndpointSlice| s.metadata.name.clone().unwrap_or_default();
        let names: HashSet<String> = desired.iter().map(name).collect();
        let mut out = Vec::new();
        for d in desired {
            match existing.iter().find(|e| name(e) == name(&d)) {
                Some(e) if endpoints::same(e, &d) => {}
                Some(e) => out.push(SliceWrite::Update(d, Box::new(e.clone()))),
                None => out.push(SliceWrite::Create(d)),
            }
        }
        for e in existing {
            if !names.contains(&name(&e)) {
                out.push(SliceWrite::Delete(e));
            }
        }
        out
    }
}

impl Subsystem for Controller {
    type Input = Vec<Delta>;
    type Key = Key;
    type Plan = ControllerPlan;
    /// In a full sync, the reservations and Services the store holds.
    type Observed = Option<(Vec<KeyValue>, Vec<Object>)>;
    type Changes = ControllerChanges;

    fn name(&self) -> &'static str {
        "controller"
    }

    fn watch(&mut self, input: Vec<Delta>, dirty: &mut BTreeSet<Key>) {
        for d in &input {
            self.watch_delta(d, dirty);
        }
    }

    fn plan(&self, scope: &Scope<Key>) -> ControllerPlan {
        let keys = match scope {
            Scope::Full => self.state.all_service_keys(),
            Scope::Only(k) => k.clone(),
        };
        let lb = self.lb_candidates(&keys);
        let services = keys
            .into_iter()
            .map(|k| {
                let lacks = self
                    .state
                    .services
                    .get(&k)
                    .is_some_and(alloc::needs_allocation);
                let desired = self.state.desired_slices(&k);
                (k, lacks, desired)
            })
            .collect();
        ControllerPlan {
            full: scope.is_full(),
            services,
            lb,
        }
    }

    /// Reads the store, in a full sync only: the reservations first and
    /// the Services after, so a reservation written with its Service in
    /// one transaction always finds it.
    fn observe(&mut self, scope: &Scope<Key>) -> Result<Self::Observed, SyncError> {
        if !scope.is_full() {
            return Ok(None);
        }
        let store = self.objs.store.clone();
        let listed = tokio::runtime::Handle::current().block_on(async {
            let (res, _) = store.list(alloc::ALLOC_PREFIX).await?;
            let (svcs, _) = self.objs.list(Kind::Service, None).await?;
            Ok::<_, StoreError>((res, svcs))
        })?;
        Ok(Some(listed))
    }

    fn diff(&self, plan: ControllerPlan, observed: Self::Observed) -> ControllerChanges {
        let mut out = ControllerChanges {
            reservations: observed.filter(|_| plan.full).map(|(res, svcs)| {
                let held = svcs
                    .iter()
                    .filter_map(alloc::as_service)
                    .flat_map(|s| alloc::keys(s).into_iter().chain(lbips::keys_shown(s)))
                    .collect();
                (res, held)
            }),
            lb: plan.lb,
            ..Default::default()
        };
        for (k, lacks, desired) in plan.services {
            if lacks {
                out.allocate.push(k.clone());
            }
            for w in self.slice_writes(&k, desired) {
                out.slices.push((k.clone(), w));
            }
        }
        out
    }

    fn apply(&mut self, changes: ControllerChanges) -> Result<usize, SyncError> {
        let handle = tokio::runtime::Handle::current();
        handle.block_on(self.write(changes))
    }

    fn synced(&mut self, _scope: &Scope<Key>, ok: bool) {
        let m = &self.metrics;
        m.gauge(&CONTROLLER_SERVICES, "", self.state.services.len() as f64);
        m.gauge(&CONTROLLER_PODS, "", self.state.pods.len() as f64);
        m.gauge(&CONTROLLER_LB_PENDING, "", self.lb.pending.len() as f64);
        if ok && !self.said_ready {
            self.said_ready = true;
            m.set_ready(true);
        }
    }
}
