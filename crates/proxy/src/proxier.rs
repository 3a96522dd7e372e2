//! The service proxy on the reconcile loop: one watch of Services,
//! EndpointSlices and this node's Node feeds one input store
//! ([`crate::inputs`]) and a table per address family
//! ([`crate::family`]: `ip podnet`, `ip6 podnet`), plus the health-check
//! node ports.
//!
//! An event marks its Service dirty; a sync decodes each dirty Service
//! once, plans its fragment for every family, and each family diffs and
//! applies its own batch. Events that arrive together are coalesced into
//! one sync; an identical sync sends nothing. Stale UDP conntrack entries
//! towards removed endpoints are flushed, so clients do not keep sending
//! into the void (the classic 5-second DNS delay).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use podnet_api::{Kind, Object};
use podnet_daemon::Metrics;
use podnet_nft::model::Table;
use podnet_reconcile::{Scope, Subsystem, SyncError};
use podnet_source::{Delta, Subscription};

use crate::family::{FamilyChanges, FamilyTable, Planned};
use crate::healthcheck;
use crate::healthz::Health;
use crate::inputs::{Decoded, InputStore, Inputs, Watched};
use crate::rules::{NodeInfo, Stack, TABLE};
use crate::ProxyError;

/// The service proxy of one node, both families together.
pub struct Proxier {
    node: NodeInfo,
    store: InputStore,
    families: Vec<FamilyTable>,
    /// Services watched since the last sync (for [`Proxier::sync`]).
    dirty: BTreeSet<String>,
    health: healthcheck::Server,
    /// The proxy's own `/healthz` (kube-proxy's :10256), if served.
    healthz: Option<Arc<Health>>,
}

/// What one sync will do, per family, before the kernel is consulted.
pub enum FamilyPlan {
    /// Replace the whole table (the first sync, a sync after a failure or
    /// a zone change). Planned while it is encoded, Service by Service, so
    /// the peak is the wire buffer and not the ruleset as trees.
    Full,
    /// The new fragments of the dirty Services.
    Partial(Vec<Planned>),
}

impl Proxier {
    pub fn new(
        node: impl Into<NodeInfo>,
        stacks: Vec<Stack>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ProxyError> {
        Ok(Proxier {
            node: node.into(),
            store: InputStore::default(),
            families: stacks
                .into_iter()
                .map(|st| FamilyTable::new(st, metrics.clone()))
                .collect::<Result<Vec<_>, _>>()?,
            dirty: BTreeSet::new(),
            health: healthcheck::Server::new(),
            healthz: None,
        })
    }

    /// Reports queued inputs, syncs and this node's Node to `h`.
    pub fn with_healthz(mut self, h: Arc<Health>) -> Self {
        self.healthz = Some(h);
        self
    }

    /// Takes one delta from the object source into the proxy's view (the
    /// `watch` verb); true if it concerns the proxy. Only Services,
    /// EndpointSlices and this node's Node matter.
    pub fn watch(&mut self, d: &Delta) -> bool {
        let key = d.key();
        if key.kind == Kind::Node {
            return self.watch_node(&key.name, d.object());
        }
        match self.store.watch(d) {
            Watched::Other => false,
            Watched::Service(id, svc) => {
                for f in &mut self.families {
                    f.service_changed(&id, svc);
                }
                self.dirty.insert(id);
                true
            }
            Watched::Slices(ids) => {
                self.dirty.extend(ids);
                true
            }
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
        if let Some(h) = &self.healthz {
            h.node(match o {
                Some(Object::Node(n)) => Some(n.as_ref()),
                _ => None,
            });
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
        self.families.iter_mut().for_each(FamilyTable::forget);
        true
    }

    /// Forgets every input and what is applied (before a relist): the next
    /// sync replaces the whole tables.
    pub fn reset(&mut self) {
        self.store.clear();
        self.dirty.clear();
        for f in &mut self.families {
            f.forget();
            f.forget_services();
        }
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

/// Decodes each distinct version of a Service's inputs once, whatever
/// number of families plan from it.
#[derive(Default)]
struct Decodes(Vec<(Inputs, Decoded)>);

impl Decodes {
    fn get(&mut self, i: &Inputs) -> &Decoded {
        let at = match self.0.iter().position(|(k, _)| k.same(i)) {
            Some(at) => at,
            None => {
                self.0.push((i.clone(), i.decode()));
                self.0.len() - 1
            }
        };
        &self.0[at].1
    }
}

impl Subsystem for Proxier {
    type Input = Vec<Delta>;
    type Key = String;
    type Plan = Vec<FamilyPlan>;
    /// Per family, the table's use count (None: missing or unreadable).
    type Observed = Vec<Option<u32>>;
    type Changes = Vec<FamilyChanges>;

    fn name(&self) -> &'static str {
        "proxy"
    }

    fn watch(&mut self, input: Vec<Delta>, dirty: &mut BTreeSet<String>) {
        for d in &input {
            Proxier::watch(self, d);
        }
        dirty.append(&mut self.dirty);
        if let (Some(h), false) = (&self.healthz, dirty.is_empty()) {
            h.queued();
        }
    }

    fn plan(&self, scope: &Scope<String>) -> Vec<FamilyPlan> {
        let Scope::Only(ids) = scope else {
            return self.families.iter().map(|_| FamilyPlan::Full).collect();
        };
        let mut out: Vec<FamilyPlan> = self
            .families
            .iter()
            .map(|f| match f.needs_full() {
                true => FamilyPlan::Full,
                false => FamilyPlan::Partial(Vec::new()),
            })
            .collect();
        if out.iter().all(|p| matches!(p, FamilyPlan::Full)) {
            return out;
        }
        for id in ids {
            let inputs = self.store.inputs(id);
            let d = inputs.decode();
            for (f, p) in self.families.iter().zip(&mut out) {
                if let FamilyPlan::Partial(v) = p {
                    let fragment = f.plan(&d, &self.node);
                    let (id, inputs) = (id.clone(), inputs.clone());
                    v.push(Planned {
                        id,
                        inputs,
                        fragment,
                    });
                }
            }
        }
        out
    }

    fn observe(&mut self, _scope: &Scope<String>) -> Result<Vec<Option<u32>>, SyncError> {
        Ok(self.families.iter_mut().map(FamilyTable::observe).collect())
    }

    fn diff(&self, plan: Vec<FamilyPlan>, observed: Vec<Option<u32>>) -> Vec<FamilyChanges> {
        let mut decodes: BTreeMap<String, Decodes> = BTreeMap::new();
        let decodes = std::cell::RefCell::new(&mut decodes);
        self.families
            .iter()
            .zip(plan.into_iter().zip(observed))
            .map(|(f, (p, seen))| match p {
                FamilyPlan::Full => FamilyChanges::Replace,
                FamilyPlan::Partial(v) => {
                    let old = |id: &str, i: &Inputs| -> Table {
                        let mut all = decodes.borrow_mut();
                        f.plan(all.entry(id.to_string()).or_default().get(i), &self.node)
                    };
                    f.diff(v, &old, seen)
                }
            })
            .collect()
    }

    /// Applies every family's batch; a failure in one fails the sync (the
    /// loop retries with a full sync) after the others were applied.
    fn apply(&mut self, changes: Vec<FamilyChanges>) -> Result<usize, SyncError> {
        let mut n = 0;
        let mut err = None;
        for (f, c) in self.families.iter_mut().zip(changes) {
            match f.apply(c, &self.store, &self.node) {
                Ok(k) => n += k,
                Err(e) => err = Some(SyncError(e.to_string())),
            }
        }
        err.map_or(Ok(n), Err)
    }

    /// A resync only observes: a table is rebuilt when it drifted.
    fn resync(&self) -> Scope<String> {
        Scope::Only(BTreeSet::new())
    }

    fn synced(&mut self, scope: &Scope<String>, ok: bool) {
        if let (Some(h), true) = (&self.healthz, ok) {
            h.updated();
        }
        let node = &self.node.name;
        if scope.is_full() {
            self.store.take_touched();
            self.health.resync(self.store.health_targets(node));
        } else {
            for id in self.store.take_touched() {
                self.health.update(&id, self.store.health_target(&id, node));
            }
        }
    }
}

/// Runs the proxy until `shutdown`: a [`Proxier`] in the reconcile
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
    let mut proxy = Proxier::new(node, stacks, metrics.clone())?;
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
    use podnet_nft::model::Family;
    Ok(podnet_nft::sync::remove(&[Family::Ip, Family::Ip6], TABLE)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::family::{endpoint_count, fragment_diff};
    use crate::rules::fragment;
    use crate::stale::udp_endpoints;
    use podnet_api::k8s_openapi::api::core::v1::Service;
    use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
    use podnet_nft::diff::Change;
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
}
