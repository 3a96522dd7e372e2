//! The store writes of the controller's `apply`: reservations released
//! (a deleted Service's, and orphans in a full sync), addresses and ports
//! allocated, EndpointSlices created, updated and deleted, then the
//! load-balancer addresses (their writes are [`super::lb`]'s). Each write is
//! conditional on the revision the cache saw, so a concurrent writer makes
//! it fail (and the loop retry) instead of being overwritten.

use std::collections::HashSet;

use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::{Kind, Object};
use podnet_reconcile::SyncError;
use podnet_store::{KeyValue, Op, Store, StoreError};

use super::{
    Controller, ControllerChanges, Key, SliceWrite, CONTROLLER_ALLOCATIONS_TOTAL,
    CONTROLLER_ENDPOINTSLICE_WRITES_TOTAL, CONTROLLER_ERRORS_TOTAL, CONTROLLER_SNAPSHOTS_TOTAL,
};
use crate::{alloc, lbips};

/// What an apply's writes came to.
#[derive(Default)]
struct Tally {
    writes: usize,
    failed: Vec<String>,
}

impl Tally {
    fn note(&mut self, what: &Key, r: Result<usize, StoreError>) {
        match r {
            Ok(n) => self.writes += n,
            Err(e) => self.failed.push(format!("{}/{}: {e}", what.0, what.1)),
        }
    }
}

impl Controller {
    /// Every write of one sync; the sync fails (and is retried whole) if
    /// any failed, after the others were made.
    pub(super) async fn write(&mut self, c: ControllerChanges) -> Result<usize, SyncError> {
        let mut t = Tally::default();
        for s in std::mem::take(&mut self.gone) {
            self.release_for(&s).await;
            self.lb_release_gone(&s).await;
        }
        if let Some((res, held)) = c.reservations {
            t.writes += self.release_orphans(res, &held).await;
        }
        for k in &c.allocate {
            match self.allocate(k).await {
                // Exhausted: nothing a retry fixes; the next resync tries
                // again (the API server would have refused the Service).
                Err(StoreError::Backend(e)) if e.contains("exhausted") => {
                    tracing::warn!(service = %format!("{}/{}", k.0, k.1), "{e}");
                    self.metrics.count(&CONTROLLER_ERRORS_TOTAL, "", 1.0);
                }
                r => t.note(k, r),
            }
        }
        for (k, w) in c.slices {
            let r = self.write_slice(w).await.map(|()| 1);
            t.note(&k, r);
        }
        let r = self.lb_sync(c.lb).await;
        t.note(&("load balancers".into(), String::new()), r);
        if t.failed.is_empty() {
            return Ok(t.writes);
        }
        self.metrics
            .count(&CONTROLLER_ERRORS_TOTAL, "", t.failed.len() as f64);
        Err(SyncError(format!(
            "{} of {} writes failed, first {}",
            t.failed.len(),
            t.writes + t.failed.len(),
            t.failed[0]
        )))
    }

    async fn write_slice(&mut self, w: SliceWrite) -> Result<(), StoreError> {
        match w {
            SliceWrite::Create(d) => {
                let name = d.metadata.name.clone().unwrap_or_default();
                self.create_slice(d, &name).await
            }
            SliceWrite::Update(d, e) => self.update_slice(d, &e).await,
            SliceWrite::Delete(e) => {
                let ns = e.metadata.namespace.clone().unwrap_or_default();
                let name = e.metadata.name.clone().unwrap_or_default();
                self.delete_slice(&ns, name, &e).await
            }
        }
    }

    /// Deletes reservations whose Service is gone or no longer holds them
    /// (`held` names those still held), and refreshes the taken sets from
    /// what the store holds. Each delete is guarded by the key's revision,
    /// so a reservation that changed since is left alone. Returns the
    /// reservations released.
    async fn release_orphans(&mut self, res: Vec<KeyValue>, held: &HashSet<String>) -> usize {
        self.state.ips.clear();
        self.state.ports.clear();
        self.lb.reserved.clear();
        let mut n = 0;
        for kv in &res {
            if held.contains(&kv.key) {
                self.remember(kv);
                continue;
            }
            tracing::info!(key = %kv.key, "releasing orphaned reservation");
            let released = self
                .objs
                .store
                .txn(vec![Op::Delete {
                    key: kv.key.clone(),
                    rev: Some(kv.mod_rev),
                }])
                .await;
            match released {
                Ok(_) => n += 1,
                Err(_) => self.remember(kv),
            }
        }
        self.metrics.count(&CONTROLLER_SNAPSHOTS_TOTAL, "", 1.0);
        n
    }

    /// Takes a reservation the store holds as taken.
    fn remember(&mut self, kv: &KeyValue) {
        self.state.remember_alloc(&kv.key);
        if let Some(ip) = lbips::ip_of(&kv.key) {
            self.lb
                .reserved
                .insert(ip, lbips::Reservation::decode(&kv.value));
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
                    self.state.forget_alloc(&key);
                }
            }
        }
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
    async fn allocate(&mut self, k: &Key) -> Result<usize, StoreError> {
        for _ in 0..50 {
            let Some(svc) = self.state.services.get(k).cloned() else {
                return Ok(0);
            };
            if !alloc::needs_allocation(&svc) {
                return Ok(0);
            }
            let mut new = svc.clone();
            let spec = new.spec.as_mut().expect("needs_allocation implies a spec");
            self.hint = self
                .hint
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            alloc::assign_cluster_ips(spec, &self.cfg.service_cidrs(), &self.state.ips, self.hint)
                .map_err(StoreError::Backend)?;
            alloc::assign_node_ports(spec, self.cfg.node_port_range, &self.state.ports, self.hint)
                .ok_or_else(|| StoreError::Backend("node port range is exhausted".into()))?;
            let ops = alloc::transition(Some(&svc), Some(&new));
            match self.objs.update(Object::Service(Box::new(new)), ops).await {
                Ok(Object::Service(s)) => {
                    for key in alloc::keys(&s) {
                        self.state.remember_alloc(&key);
                    }
                    self.metrics.count(&CONTROLLER_ALLOCATIONS_TOTAL, "", 1.0);
                    self.state.services.insert(k.clone(), *s);
                    return Ok(1);
                }
                Ok(_) => return Ok(1),
                Err(StoreError::AlreadyExists(key)) => {
                    // Someone else holds it: remember and pick again.
                    self.state.remember_alloc(&key);
                }
                Err(StoreError::Conflict { .. }) => {
                    match self.objs.get(Kind::Service, Some(&k.0), &k.1).await? {
                        Some(Object::Service(s)) => {
                            self.state.services.insert(k.clone(), *s);
                        }
                        _ => {
                            self.state.services.remove(k);
                            return Ok(0);
                        }
                    }
                }
                Err(StoreError::NotFound(_)) => {
                    self.state.services.remove(k);
                    return Ok(0);
                }
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Backend("allocation kept colliding".into()))
    }
}
