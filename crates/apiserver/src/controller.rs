//! `podnet controller`: the API server's and the controller manager's
//! background networking duties in standalone mode.
//!
//! - ClusterIP and NodePort allocation for Services that have none (see
//!   [`crate::alloc`]: reservations are keys written in the same
//!   transaction as the Service, so concurrent allocators never collide);
//! - EndpointSlices for every Service with a selector, from ready Pods
//!   ([`endpoints`] is the pure planner), each endpoint with its Node's
//!   zone label, and the topology hints of `spec.trafficDistribution`;
//! - release of reservations a deleted Service held.
//!
//! The loop: one subscription to the object source (standalone mode's
//! store source) for Nodes, Services, Pods, EndpointSlices and the
//! NetworkConfig. Deltas mark Services dirty (a Node whose zone label
//! changes marks the Services selecting a Pod on that Node, found through
//! a node -> Pods index, so the cost follows the Node's Pods, not the
//! cluster's Services times Pods); a burst of deltas is
//! coalesced before reconciling, so work follows what changed. Watch gaps
//! are the source's business (it relists and delivers the difference). A
//! periodic resync repairs anything edited behind our back and releases
//! reservations no Service holds, judged on the store itself (the
//! allocator owns those keys, as the API server owns its allocation
//! bitmaps).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use podnet_api::k8s_openapi::api::core::v1::{Pod, Service};
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::netconfig::{self, Resolved};
use podnet_api::{Kind, Object};
use podnet_daemon::Metrics;
use podnet_source::{Delta, Subscription};
use podnet_store::{Objects, Op, Store, StoreError};

use crate::{alloc, endpoints};

const CONTROLLER_ALLOCATIONS_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_controller_allocations_total",
    "Services given addresses or ports.",
);
const CONTROLLER_ENDPOINTSLICE_WRITES_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_controller_endpointslice_writes_total",
    "EndpointSlice writes.",
);
const CONTROLLER_ERRORS_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_controller_errors_total",
    "Reconcile errors (retried).",
);
const CONTROLLER_PODS: podnet_daemon::Gauge =
    podnet_daemon::Gauge::new("podnet_controller_pods", "Pods known to the controller.");
const CONTROLLER_SERVICES: podnet_daemon::Gauge = podnet_daemon::Gauge::new(
    "podnet_controller_services",
    "Services known to the controller.",
);
const CONTROLLER_SNAPSHOTS_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_controller_snapshots_total",
    "Full passes over every Service and reservation.",
);

type Key = (String, String);

/// What the controller subscribes to.
pub const KINDS: [Kind; 5] = [
    Kind::Node,
    Kind::Service,
    Kind::Pod,
    Kind::EndpointSlice,
    Kind::NetworkConfig,
];

#[derive(Default)]
struct State {
    services: BTreeMap<Key, Service>,
    pods: BTreeMap<Key, Pod>,
    slices: BTreeMap<Key, EndpointSlice>,
    /// Node name -> zone label, for endpoints' zones and topology hints.
    zones: endpoints::Zones,
    /// Node name -> the Pods (namespace, name) bound to it, so a Node's
    /// zone change finds the Services whose endpoints it moves.
    pods_on_node: BTreeMap<String, BTreeSet<Key>>,
    ips: HashSet<IpAddr>,
    ports: HashSet<u16>,
}

fn node_of(p: &Pod) -> Option<&str> {
    p.spec
        .as_ref()?
        .node_name
        .as_deref()
        .filter(|n| !n.is_empty())
}

impl State {
    /// The slices the Service `k` should have from the Pods in its
    /// namespace; none once the Service is gone.
    fn desired_slices(&self, k: &Key) -> Vec<EndpointSlice> {
        let Some(svc) = self.services.get(k) else {
            return vec![];
        };
        let pods: Vec<&Pod> = self
            .pods
            .range((k.0.clone(), String::new())..)
            .take_while(|((ns, _), _)| *ns == k.0)
            .map(|(_, p)| p)
            .collect();
        endpoints::desired(svc, &pods, &self.zones)
    }

    /// The cached slices we manage for the Service `k`.
    fn existing_slices(&self, k: &Key) -> Vec<EndpointSlice> {
        self.slices
            .range((k.0.clone(), String::new())..)
            .take_while(|((ns, _), _)| *ns == k.0)
            .filter(|(_, s)| endpoints::managed_service(s) == Some(k.1.as_str()))
            .map(|(_, s)| s.clone())
            .collect()
    }

    fn index_pod(&mut self, p: &Pod, k: &Key) {
        if let Some(n) = node_of(p) {
            self.pods_on_node
                .entry(n.to_string())
                .or_default()
                .insert(k.clone());
        }
    }

    fn unindex_pod(&mut self, p: Option<&Pod>, k: &Key) {
        let Some(n) = p.and_then(node_of) else { return };
        if let Some(keys) = self.pods_on_node.get_mut(n) {
            keys.remove(k);
            if keys.is_empty() {
                self.pods_on_node.remove(n);
            }
        }
    }

    /// The Services whose selector matches a Pod on `node`: those whose
    /// endpoints carry the node's zone. Each distinct (namespace, labels)
    /// among the node's Pods is matched once.
    fn services_on_node(&self, node: &str) -> BTreeSet<Key> {
        let empty = BTreeMap::new();
        let mut seen = BTreeSet::new();
        let mut out = BTreeSet::new();
        for k in self.pods_on_node.get(node).into_iter().flatten() {
            let Some(p) = self.pods.get(k) else { continue };
            let labels = p.metadata.labels.as_ref().unwrap_or(&empty);
            if !seen.insert((k.0.as_str(), labels)) {
                continue;
            }
            out.extend(
                endpoints::services_selecting(self.services_in(&k.0), &k.0, labels)
                    .into_iter()
                    .map(|n| (k.0.clone(), n)),
            );
        }
        out
    }

    /// The Services of one namespace.
    fn services_in<'a>(&'a self, ns: &'a str) -> impl Iterator<Item = &'a Service> + 'a {
        self.services
            .range((ns.to_string(), String::new())..)
            .take_while(move |((n, _), _)| n == ns)
            .map(|(_, s)| s)
    }
}

pub struct Controller {
    objs: Objects,
    metrics: Arc<Metrics>,
    cfg: Resolved,
    state: State,
    hint: u64,
}

fn default_cfg() -> Resolved {
    netconfig::NetworkConfig::default()
        .resolve()
        .expect("defaults resolve")
}

impl Controller {
    pub fn new(objs: Objects, metrics: Arc<Metrics>) -> Self {
        Controller {
            objs,
            metrics,
            cfg: default_cfg(),
            state: State::default(),
            hint: std::process::id() as u64 * 7919,
        }
    }

    /// Runs until `shutdown` resolves, fed by `sub` (Nodes, Services, Pods,
    /// EndpointSlices and NetworkConfigs from the object source; see
    /// [`KINDS`]). `resync` bounds how long a change made behind the
    /// controller's back can stay unrepaired: every period it reconciles
    /// every Service and releases orphaned reservations. Nothing is written
    /// before the source's first complete list.
    pub async fn run(
        mut self,
        mut sub: Subscription,
        resync: Duration,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), StoreError> {
        tokio::pin!(shutdown);
        let mut ready = false;
        let mut retry: BTreeSet<Key> = BTreeSet::new();
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + resync, resync);
        loop {
            let mut dirty = BTreeSet::new();
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                _ = tick.tick(), if ready => {
                    self.release_orphans().await;
                    dirty = self.all_service_keys();
                }
                _ = tokio::time::sleep(Duration::from_millis(200)), if !retry.is_empty() => {}
                b = sub.next_batch() => {
                    let Some(b) = b else {
                        return Err(StoreError::Backend("the object source stopped".into()));
                    };
                    for d in &b.deltas {
                        self.watch(d, &mut dirty).await;
                    }
                    if b.ready && !ready {
                        ready = true;
                        self.release_orphans().await;
                        dirty = self.all_service_keys();
                        self.metrics.set_ready(true);
                    }
                }
            }
            if !ready {
                continue;
            }
            dirty.append(&mut retry);
            retry = self.reconcile(dirty).await;
        }
    }

    fn all_service_keys(&self) -> BTreeSet<Key> {
        let mut k: BTreeSet<Key> = self.state.services.keys().cloned().collect();
        for ((ns, _), s) in &self.state.slices {
            if let Some(svc) = endpoints::managed_service(s) {
                k.insert((ns.clone(), svc.to_string()));
            }
        }
        k
    }

    /// Deletes reservations whose Service is gone or no longer holds them,
    /// and refreshes the taken sets from what the store holds.
    ///
    /// Judged on the store itself, not on the (possibly lagging) object
    /// source: the reservations are listed first and the Services after,
    /// so a reservation written with its Service in one transaction always
    /// finds it. Each delete is guarded by the key's revision, so a
    /// reservation that changed since is left alone.
    async fn release_orphans(&mut self) {
        let store = self.objs.store.clone();
        let listed = async {
            let (res, _) = store.list(alloc::ALLOC_PREFIX).await?;
            let (svcs, _) = self.objs.list(Kind::Service, None).await?;
            Ok::<_, StoreError>((res, svcs))
        };
        let (res, svcs) = match listed.await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("listing reservations: {e}");
                return;
            }
        };
        let held: HashSet<String> = svcs
            .iter()
            .filter_map(alloc::as_service)
            .flat_map(alloc::keys)
            .collect();
        self.state.ips.clear();
        self.state.ports.clear();
        for kv in &res {
            if held.contains(&kv.key) {
                self.remember_alloc(&kv.key);
                continue;
            }
            tracing::info!(key = %kv.key, "releasing orphaned reservation");
            let released = store
                .txn(vec![Op::Delete {
                    key: kv.key.clone(),
                    rev: Some(kv.mod_rev),
                }])
                .await;
            if released.is_err() {
                self.remember_alloc(&kv.key);
            }
        }
        self.metrics.count(&CONTROLLER_SNAPSHOTS_TOTAL, "", 1.0);
    }

    fn remember_alloc(&mut self, key: &str) {
        if let Some(ip) = key
            .strip_prefix(alloc::IP_PREFIX)
            .and_then(|s| s.parse().ok())
        {
            self.state.ips.insert(ip);
        }
        if let Some(p) = key
            .strip_prefix(alloc::PORT_PREFIX)
            .and_then(|s| s.parse().ok())
        {
            self.state.ports.insert(p);
        }
    }

    fn forget_alloc(&mut self, key: &str) {
        if let Some(ip) = key
            .strip_prefix(alloc::IP_PREFIX)
            .and_then(|s| s.parse().ok())
        {
            self.state.ips.remove(&ip);
        }
        if let Some(p) = key
            .strip_prefix(alloc::PORT_PREFIX)
            .and_then(|s| s.parse().ok())
        {
            self.state.ports.remove(&p);
        }
    }

    /// Takes one delta into the caches and marks the Services it affects.
    async fn watch(&mut self, d: &Delta, dirty: &mut BTreeSet<Key>) {
        let key = d.key();
        let k: Key = (key.namespace.clone().unwrap_or_default(), key.name.clone());
        let ns = k.0.clone();
        match (key.kind, d.object()) {
            (Kind::Service, Some(Object::Service(s))) => {
                dirty.insert(k.clone());
                for r in alloc::keys(s) {
                    self.remember_alloc(&r);
                }
                self.state.services.insert(k, (**s).clone());
            }
            (Kind::Service, None) => {
                dirty.insert(k.clone());
                if let Some(s) = self.state.services.remove(&k) {
                    self.release_for(&s).await;
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

    /// Releases a deleted Service's reservations that still name it.
    async fn release_for(&mut self, s: &Service) {
        let owner = alloc::owner(s);
        for key in alloc::keys(s) {
            if let Ok(Some(kv)) = self.objs.store.get(&key).await {
                if kv.value == owner.as_bytes() {
                    let _ = self
                        .objs
                        .store
                        .txn(vec![Op::Delete {
                            key: key.clone(),
                            rev: Some(kv.mod_rev),
                        }])
                        .await;
                    self.forget_alloc(&key);
                }
            }
        }
    }

    /// Reconciles the given Services; returns those to retry.
    async fn reconcile(&mut self, dirty: BTreeSet<Key>) -> BTreeSet<Key> {
        let mut retry = BTreeSet::new();
        for k in dirty {
            if let Err(e) = self.reconcile_one(&k).await {
                tracing::debug!(service = %format!("{}/{}", k.0, k.1), "reconcile: {e}; will retry");
                self.metrics.count(&CONTROLLER_ERRORS_TOTAL, "", 1.0);
                retry.insert(k);
            }
        }
        self.metrics
            .gauge(&CONTROLLER_SERVICES, "", self.state.services.len() as f64);
        self.metrics
            .gauge(&CONTROLLER_PODS, "", self.state.pods.len() as f64);
        retry
    }

    async fn reconcile_one(&mut self, k: &Key) -> Result<(), StoreError> {
        if self
            .state
            .services
            .get(k)
            .map(alloc::needs_allocation)
            .unwrap_or(false)
        {
            self.allocate(k).await?;
        }
        let desired = self.state.desired_slices(k);
        let existing = self.state.existing_slices(k);
        let names: HashSet<String> = desired
            .iter()
            .filter_map(|d| d.metadata.name.clone())
            .collect();
        for d in desired {
            let name = d.metadata.name.clone().unwrap_or_default();
            match existing
                .iter()
                .find(|e| e.metadata.name.as_deref() == Some(&name))
            {
                Some(e) if endpoints::same(e, &d) => {}
                Some(e) => self.update_slice(d, e).await?,
                None => self.create_slice(d, &name).await?,
            }
        }
        for e in existing {
            let name = e.metadata.name.clone().unwrap_or_default();
            if !names.contains(&name) {
                self.delete_slice(&k.0, name, &e).await?;
            }
        }
        Ok(())
    }

    /// Writes `d` over the slice `e` it replaces, keeping the server-owned
    /// metadata so the update is conditional on `e`'s revision.
    async fn update_slice(
        &mut self,
        d: EndpointSlice,
        e: &EndpointSlice,
    ) -> Result<(), StoreError> {
        let mut upd = d;
        upd.metadata.uid = e.metadata.uid.clone();
        upd.metadata.creation_timestamp = e.metadata.creation_timestamp.clone();
        upd.metadata.resource_version = e.metadata.resource_version.clone();
        let o = self
            .objs
            .update(Object::EndpointSlice(Box::new(upd)), vec![])
            .await?;
        self.count_slice_write("op=\"update\"");
        self.cache_slice(o);
        Ok(())
    }

    /// Creates the slice `d` (named `name`). One that exists already but
    /// was not in the cache yet is an error, so the Service is retried and
    /// takes it over next pass.
    async fn create_slice(&mut self, d: EndpointSlice, name: &str) -> Result<(), StoreError> {
        let o = match self
            .objs
            .create(Object::EndpointSlice(Box::new(d)), vec![])
            .await
        {
            Err(StoreError::AlreadyExists(_)) => {
                // Exists but was not in our cache yet: take it over next pass.
                return Err(StoreError::Backend(format!(
                    "slice {name} appeared concurrently"
                )));
            }
            r => r?,
        };
        self.count_slice_write("op=\"create\"");
        self.cache_slice(o);
        Ok(())
    }

    /// Deletes the slice `e` (named `name` in `ns`) no longer desired, at
    /// its revision; one already gone counts as deleted.
    async fn delete_slice(
        &mut self,
        ns: &str,
        name: String,
        e: &EndpointSlice,
    ) -> Result<(), StoreError> {
        let rev = e
            .metadata
            .resource_version
            .as_deref()
            .and_then(|r| r.parse().ok());
        match self
            .objs
            .delete(Kind::EndpointSlice, Some(ns), &name, rev, vec![])
            .await
        {
            Ok(_) | Err(StoreError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        self.count_slice_write("op=\"delete\"");
        self.state.slices.remove(&(ns.to_string(), name));
        Ok(())
    }

    fn count_slice_write(&self, labels: &str) {
        self.metrics
            .count(&CONTROLLER_ENDPOINTSLICE_WRITES_TOTAL, labels, 1.0);
    }

    fn cache_slice(&mut self, o: Object) {
        if let Object::EndpointSlice(s) = o {
            let k = (
                s.metadata.namespace.clone().unwrap_or_default(),
                s.metadata.name.clone().unwrap_or_default(),
            );
            self.state.slices.insert(k, *s);
        }
    }

    /// Gives a Service its ClusterIP and NodePorts, racing safely with any
    /// other writer: reservation keys and the Service update are one txn.
    async fn allocate(&mut self, k: &Key) -> Result<(), StoreError> {
        for _ in 0..50 {
            let Some(svc) = self.state.services.get(k).cloned() else {
                return Ok(());
            };
            if !alloc::needs_allocation(&svc) {
                return Ok(());
            }
            let mut new = svc.clone();
            let spec = new.spec.as_mut().expect("needs_allocation implies a spec");
            self.hint = self
                .hint
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if spec
                .cluster_ip
                .as_deref()
                .map(str::is_empty)
                .unwrap_or(true)
            {
                let ip = alloc::pick_ip(&self.cfg.service_cidr, &self.state.ips, self.hint >> 20)
                    .ok_or_else(|| {
                    StoreError::Backend(format!(
                        "service CIDR {} is exhausted",
                        self.cfg.service_cidr
                    ))
                })?;
                spec.cluster_ip = Some(ip.to_string());
                spec.cluster_ips = Some(vec![ip.to_string()]);
            }
            alloc::assign_node_ports(spec, self.cfg.node_port_range, &self.state.ports, self.hint)
                .ok_or_else(|| StoreError::Backend("node port range is exhausted".into()))?;
            let ops = alloc::transition(Some(&svc), Some(&new));
            match self.objs.update(Object::Service(Box::new(new)), ops).await {
                Ok(Object::Service(s)) => {
                    for key in alloc::keys(&s) {
                        self.remember_alloc(&key);
                    }
                    self.metrics.count(&CONTROLLER_ALLOCATIONS_TOTAL, "", 1.0);
                    self.state.services.insert(k.clone(), *s);
                    return Ok(());
                }
                Ok(_) => return Ok(()),
                Err(StoreError::AlreadyExists(key)) => {
                    // Someone else holds it: remember and pick again.
                    self.remember_alloc(&key);
                }
                Err(StoreError::Conflict { .. }) => {
                    match self.objs.get(Kind::Service, Some(&k.0), &k.1).await? {
                        Some(Object::Service(s)) => {
                            self.state.services.insert(k.clone(), *s);
                        }
                        _ => {
                            self.state.services.remove(k);
                            return Ok(());
                        }
                    }
                }
                Err(StoreError::NotFound(_)) => {
                    self.state.services.remove(k);
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Backend("allocation kept colliding".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, name: &str, app: &str, node: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
            "spec": {"nodeName": node, "containers": []}}))
        .unwrap()
    }

    fn put_pod(st: &mut State, p: Pod) {
        let k = (
            p.metadata.namespace.clone().unwrap(),
            p.metadata.name.clone().unwrap(),
        );
        let old = st.pods.insert(k.clone(), p.clone());
        st.unindex_pod(old.as_ref(), &k);
        st.index_pod(&p, &k);
    }

    fn del_pod(st: &mut State, ns: &str, name: &str) {
        let k = (ns.to_string(), name.to_string());
        let old = st.pods.remove(&k);
        st.unindex_pod(old.as_ref(), &k);
    }

    fn key(ns: &str, name: &str) -> Key {
        (ns.to_string(), name.to_string())
    }

    /// A Node's zone change reaches exactly the Services selecting a Pod
    /// on it, hints or not, and the index follows Pods that move or go.
    #[test]
    fn services_on_node_follow_the_pods_there() {
        let mut st = State::default();
        for (ns, name, app) in [
            ("a", "web", "web"),
            ("a", "close", "web"),
            ("a", "db", "db"),
            ("b", "web", "web"),
        ] {
            let mut spec = json!({"selector": {"app": app}, "ports": [{"port": 80}]});
            if name == "close" {
                spec["trafficDistribution"] = json!("PreferClose");
            }
            let s: Service = serde_json::from_value(
                json!({"metadata": {"name": name, "namespace": ns}, "spec": spec}),
            )
            .unwrap();
            st.services.insert(key(ns, name), s);
        }
        put_pod(&mut st, pod("a", "w1", "web", Some("n1")));
        put_pod(&mut st, pod("a", "w2", "web", Some("n1")));
        put_pod(&mut st, pod("b", "d1", "db", Some("n1")));
        put_pod(&mut st, pod("a", "d2", "db", Some("n2")));
        put_pod(&mut st, pod("a", "loose", "db", None));

        let web_a = BTreeSet::from([key("a", "web"), key("a", "close")]);
        assert_eq!(
            st.services_on_node("n1"),
            web_a,
            "b/db selects nothing in b"
        );
        assert_eq!(st.services_on_node("n2"), BTreeSet::from([key("a", "db")]));
        assert!(st.services_on_node("n3").is_empty());

        // d2 moves to n1 (and so leaves n2); w1 and w2 go.
        put_pod(&mut st, pod("a", "d2", "db", Some("n1")));
        assert!(st.services_on_node("n2").is_empty());
        assert!(!st.pods_on_node.contains_key("n2"), "empty entries go");
        del_pod(&mut st, "a", "w1");
        del_pod(&mut st, "a", "w2");
        assert_eq!(st.services_on_node("n1"), BTreeSet::from([key("a", "db")]));
        del_pod(&mut st, "a", "d2");
        del_pod(&mut st, "b", "d1");
        del_pod(&mut st, "a", "loose");
        assert!(st.pods_on_node.is_empty());
    }
}
