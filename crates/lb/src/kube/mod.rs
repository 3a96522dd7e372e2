//! LB IPAM in Kubernetes mode (`podnet controller` with a kubeconfig, or
//! as the Deployment in `deploy/`): the LoadBalancer Services of a real
//! cluster get `status.loadBalancer.ingress` from the IPAddressPools, as
//! [`crate::ipam`] decides, written through the Service's `status`
//! subresource.
//!
//! Several replicas may run; the one holding the Lease ([`lease`]) alone
//! writes, so one address never goes to two Services. It decides only on
//! a complete view (every Service, pool and namespace listed), from what
//! every Service's status already shows, so a restart or a new leader
//! keeps each address where it is. Each write carries the Service's
//! resourceVersion: a Service changed meanwhile is decided again when the
//! watch brings its new version. Whose an address is travels on the Service itself
//! ([`crate::ipam::status`]'s condition), since no reservation exists
//! outside it.
//!
//! Layout: [`cache`] is the view and what a change moves (pure),
//! [`lease`] the leader election; this file is the loop and the writes.

pub mod cache;
pub use podnet_lease as lease;

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use kube::api::{Api, PostParams};
use kube::Client;
use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::k8s_openapi::jiff::Timestamp;
use podnet_api::Kind;
use podnet_source::Subscription;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::ipam::{status, Allocator, Decision, ServiceKey};
use cache::View;
use lease::{leading, LeaseConfig};

/// The kinds LB IPAM reads.
pub const KINDS: &[Kind] = &[Kind::Service, Kind::IPAddressPool, Kind::Namespace];

/// How often every Service is decided again (a write that failed, a
/// status edited behind our back).
const RESYNC: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum KubeLbError {
    #[error("writing the status of Service {0}/{1}: {2}")]
    Write(String, String, kube::Error),
}

/// Runs LB IPAM on `sub` (subscribed to [`KINDS`]) until `shutdown`,
/// then hands the Lease back if it holds it. `on_ready` is called once
/// the view is complete (a replica that does not lead is ready too: it
/// can take over at once).
pub async fn run(
    client: Client,
    mut sub: Subscription,
    lease_cfg: LeaseConfig,
    on_ready: impl FnOnce(),
    shutdown: impl Future<Output = ()>,
) {
    let mut on_ready = Some(on_ready);
    let leases = Api::namespaced(client.clone(), &lease_cfg.namespace);
    let (tx, mut rx) = watch::channel(None);
    let campaign = tokio::spawn(lease::campaign(leases.clone(), lease_cfg.clone(), tx));
    let mut view = View::default();
    let mut dirty = BTreeSet::new();
    let mut ready = false;
    let mut resync = tokio::time::interval(RESYNC);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            b = sub.next_batch() => {
                let Some(b) = b else { break };
                view.take(&b.deltas, &mut dirty);
                ready |= b.ready;
                if let Some(f) = on_ready.take_if(|_| ready) {
                    f();
                }
            }
            r = rx.changed() => {
                if r.is_err() {
                    break;
                }
                dirty.extend(view.concerned(None));
            }
            _ = resync.tick() => dirty.extend(view.concerned(None)),
            _ = &mut shutdown => break,
        }
        if !ready || !leading(&rx) {
            continue;
        }
        let keys = std::mem::take(&mut dirty);
        let keys = keys.into_iter().chain(view.pending.keys().cloned());
        let keys: Vec<ServiceKey> = view.order(keys.collect::<BTreeSet<_>>());
        if let Err(e) = settle(&client, &mut view, &keys, &rx).await {
            // The next resync (or change) decides them all again.
            tracing::warn!("LB IPAM: {e}");
        }
    }
    campaign.abort();
    if let Err(e) = lease::release(&leases, &lease_cfg).await {
        tracing::warn!("handing the LB IPAM lease back: {e}");
    }
}

/// Decides `keys` in order and writes each status that must change,
/// while this controller leads.
async fn settle(
    client: &Client,
    view: &mut View,
    keys: &[ServiceKey],
    rx: &watch::Receiver<Option<Instant>>,
) -> Result<(), KubeLbError> {
    // The allocator borrows its pools: a copy, so the view stays free
    // to take each write's answer.
    let pools = view.inputs.pools().clone();
    let mut a = Allocator::new(&pools, view.allocator().holdings);
    for k in keys {
        if !leading(rx) {
            return Ok(());
        }
        settle_one(client, view, &mut a, k).await?;
    }
    Ok(())
}

/// Brings one Service's status to its decision. A conflict (the Service
/// changed since this view read it) or a Service gone ends the attempt:
/// the watch brings the newer version, which is decided again then.
async fn settle_one(
    client: &Client,
    view: &mut View,
    a: &mut Allocator<'_>,
    k: &ServiceKey,
) -> Result<(), KubeLbError> {
    let Some(svc) = view.services.get(k).cloned() else {
        a.holdings.release(k);
        view.pending.remove(k);
        return Ok(());
    };
    let d = a.assign(&svc, &view.inputs.labels_of(&k.0));
    note(view, k, &d);
    let Some(st) = status::desired(&svc, &d, |ip| a.pooled(ip), Timestamp::now()) else {
        return Ok(());
    };
    let mut new = svc;
    new.status = Some(st);
    let api: Api<Service> = Api::namespaced(client.clone(), &k.0);
    match api.replace_status(&k.1, &PostParams::default(), &new).await {
        Ok(s) => {
            view.services.insert(k.clone(), s);
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
            tracing::debug!(service = %format!("{}/{}", k.0, k.1), "changed meanwhile: {}", e.message);
            // What it holds now is what its status shows (as this view
            // last read it), not the decision that was not written.
            a.holdings.release(k);
            if let Some(s) = view.services.get(k) {
                a.seed(s);
            }
            Ok(())
        }
        Err(e) => Err(KubeLbError::Write(k.0.clone(), k.1.clone(), e)),
    }
}

/// Logs a Service's reason for having no address when it changes.
fn note(view: &mut View, k: &ServiceKey, d: &Decision) {
    match d {
        Decision::Pending(why) => {
            if view.pending.get(k) != Some(why) {
                tracing::warn!(service = %format!("{}/{}", k.0, k.1), "no load-balancer address: {why}");
                view.pending.insert(k.clone(), why.clone());
            }
        }
        _ => {
            view.pending.remove(k);
        }
    }
}
