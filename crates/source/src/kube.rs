//! The object source over the Kubernetes API (Kubernetes mode).
//!
//! One `kube-runtime` watcher per subscribed kind (list, then watch from
//! the list's resourceVersion; on 410 Gone or a broken stream it relists by
//! itself, bracketed by `Init` … `InitDone`). Each relist is turned into
//! the difference against what consumers already have ([`crate::cache`]),
//! exactly as the store source does after a gap, so consumers cannot tell
//! the two apart. After an error a kind waits as [`crate::retry`] says (a
//! second at most while the apiserver is down or starting) and relists;
//! while errors last, the health
//! (a `podnet_daemon::StoreWatch`, probed with `GET /version`) fails
//! `/readyz`, and consumers keep what they have.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use kube::api::Api;
use kube::runtime::watcher::{self, Event as WEvent};
use kube::Client;
use podnet_api::bgp::{BGPConfiguration, BGPPeer};
use podnet_api::gateway::{Gateway, GatewayClass, HTTPRoute, ReferenceGrant};
use podnet_api::k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, Service};
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::k8s_openapi::api::networking::v1::{Ingress, IngressClass, NetworkPolicy};
use podnet_api::nad::NetworkAttachmentDefinition;
use podnet_api::pool::IPAddressPool;
use podnet_api::{Kind, Object};
use podnet_daemon::StoreWatch;

use crate::cache::Cache;
use crate::retry::{Failure, Retry};
use crate::{Delta, Hub, ObjectKey, CHUNK};

pub struct KubeSource {
    client: Client,
    health: StoreWatch,
    pub(crate) hub: Hub,
}

impl KubeSource {
    /// The cluster's BGPConfiguration `default`, read once (by a list of
    /// that one name: the agent's role lists and watches the kind, and
    /// needs no `get` for this).
    pub(crate) async fn bgp_configuration(&self) -> Result<Option<BGPConfiguration>, String> {
        let api: Api<BGPConfiguration> = Api::all(self.client.clone());
        let only = format!("metadata.name={}", podnet_api::bgp::DEFAULT_NAME);
        let lp = kube::api::ListParams::default().fields(&only);
        let list = api.list(&lp).await.map_err(|e| e.to_string())?;
        Ok(list.items.into_iter().next())
    }
}

/// One watcher event, made kind-agnostic.
enum Msg {
    Init,
    InitApply(Object),
    InitDone,
    Apply(Object),
    Delete(Object),
}

type Tagged = (Kind, Result<Msg, watcher::Error>);

fn watch_kind<K>(client: &Client, kind: Kind, wrap: fn(K) -> Object) -> BoxStream<'static, Tagged>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    let api: Api<K> = Api::all(client.clone());
    let fresh = move || watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    retrying(fresh)
        .map(move |r| {
            let m = r.map(|e| match e {
                WEvent::Init => Msg::Init,
                WEvent::InitApply(o) => Msg::InitApply(wrap(o)),
                WEvent::InitDone => Msg::InitDone,
                WEvent::Apply(o) => Msg::Apply(wrap(o)),
                WEvent::Delete(o) => Msg::Delete(wrap(o)),
            });
            (kind, m)
        })
        .boxed()
}

type Watch<K> = BoxStream<'static, Result<WEvent<K>, watcher::Error>>;

/// A watcher that, after an error, waits as [`Retry`] says and starts
/// over with a fresh list. Starting over (rather than resuming the watch
/// from its resourceVersion, which a watcher does silently) makes every
/// recovery end in `InitDone`, the proof that the kind is followed again,
/// and a restarted apiserver's watch cache would answer an old
/// resourceVersion with 410 Gone anyway. `Init` alone proves nothing (it
/// precedes the list), so only later events reset the delay.
fn retrying<K: Send + 'static>(
    fresh: impl Fn() -> Watch<K> + Send + 'static,
) -> impl futures::Stream<Item = Result<WEvent<K>, watcher::Error>> + Send {
    let first = fresh();
    stream::unfold(
        (first, fresh, Retry::default(), None),
        |(mut inner, fresh, mut retry, pause)| async move {
            if let Some(d) = pause {
                tokio::time::sleep(d).await;
                inner = fresh();
            }
            let item = inner.next().await?;
            let pause = match &item {
                // 410 Gone: the list is merely too old; relist at once.
                Err(e) if failure(e) == Failure::Answered(410) => Some(Duration::ZERO),
                Err(e) => Some(retry.delay(failure(e), std::time::Instant::now())),
                Ok(WEvent::Init) => None,
                Ok(_) => {
                    retry.reset();
                    None
                }
            };
            Some((item, (inner, fresh, retry, pause)))
        },
    )
}

/// What a watcher error got from the server.
fn failure(e: &watcher::Error) -> Failure {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => Failure::of(e),
        watcher::Error::WatchError(s) => Failure::Answered(s.code),
        _ => Failure::Unanswered,
    }
}

/// The HTTP code the API server answered a watcher with, if it answered.
fn answer_code(e: &watcher::Error) -> Option<u16> {
    Some(match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code,
        watcher::Error::WatchError(s) => s.code,
        _ => return None,
    })
}

fn stream_for(client: &Client, kind: Kind) -> Option<BoxStream<'static, Tagged>> {
    Some(match kind {
        Kind::Namespace => {
            watch_kind::<Namespace>(client, kind, |o| Object::Namespace(Box::new(o)))
        }
        Kind::Node => watch_kind::<Node>(client, kind, |o| Object::Node(Box::new(o))),
        Kind::Pod => watch_kind::<Pod>(client, kind, |o| Object::Pod(Box::new(o))),
        Kind::Service => watch_kind::<Service>(client, kind, |o| Object::Service(Box::new(o))),
        Kind::EndpointSlice => {
            watch_kind::<EndpointSlice>(client, kind, |o| Object::EndpointSlice(Box::new(o)))
        }
        Kind::NetworkPolicy => {
            watch_kind::<NetworkPolicy>(client, kind, |o| Object::NetworkPolicy(Box::new(o)))
        }
        // podnet's own NetworkConfig is no API resource: in Kubernetes
        // mode the network config comes from the agent's flags or file.
        Kind::NetworkConfig => return None,
        // CustomResourceDefinitions (deploy/parts/05-crds.yaml).
        Kind::IPAddressPool => {
            watch_kind::<IPAddressPool>(client, kind, |o| Object::IPAddressPool(Box::new(o)))
        }
        Kind::BGPConfiguration => {
            watch_kind::<BGPConfiguration>(client, kind, |o| Object::BGPConfiguration(Box::new(o)))
        }
        Kind::BGPPeer => watch_kind::<BGPPeer>(client, kind, |o| Object::BGPPeer(Box::new(o))),
        Kind::Secret => watch_kind::<Secret>(client, kind, |o| Object::Secret(Box::new(o))),
        Kind::Ingress => watch_kind::<Ingress>(client, kind, |o| Object::Ingress(Box::new(o))),
        Kind::IngressClass => {
            watch_kind::<IngressClass>(client, kind, |o| Object::IngressClass(Box::new(o)))
        }
        Kind::GatewayClass => {
            watch_kind::<GatewayClass>(client, kind, |o| Object::GatewayClass(Box::new(o)))
        }
        Kind::Gateway => watch_kind::<Gateway>(client, kind, |o| Object::Gateway(Box::new(o))),
        Kind::HTTPRoute => {
            watch_kind::<HTTPRoute>(client, kind, |o| Object::HTTPRoute(Box::new(o)))
        }
        Kind::ReferenceGrant => {
            watch_kind::<ReferenceGrant>(client, kind, |o| Object::ReferenceGrant(Box::new(o)))
        }
        Kind::NetworkAttachmentDefinition => {
            watch_kind::<NetworkAttachmentDefinition>(client, kind, |o| {
                Object::NetworkAttachmentDefinition(Box::new(o))
            })
        }
    })
}

async fn list_of<K>(client: &Client, wrap: fn(K) -> Object) -> Result<Vec<Object>, kube::Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let api: Api<K> = Api::all(client.clone());
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(wrap)
        .collect())
}

/// Every object of `kinds`, listed now (for a consumer's resync).
async fn list(client: &Client, kinds: &BTreeSet<Kind>) -> Result<Vec<Object>, kube::Error> {
    let mut out = Vec::new();
    for k in kinds {
        out.extend(match k {
            Kind::Namespace => {
                list_of::<Namespace>(client, |o| Object::Namespace(Box::new(o))).await?
            }
            Kind::Node => list_of::<Node>(client, |o| Object::Node(Box::new(o))).await?,
            Kind::Pod => list_of::<Pod>(client, |o| Object::Pod(Box::new(o))).await?,
            Kind::Service => list_of::<Service>(client, |o| Object::Service(Box::new(o))).await?,
            Kind::EndpointSlice => {
                list_of::<EndpointSlice>(client, |o| Object::EndpointSlice(Box::new(o))).await?
            }
            Kind::NetworkPolicy => {
                list_of::<NetworkPolicy>(client, |o| Object::NetworkPolicy(Box::new(o))).await?
            }
            Kind::NetworkConfig => Vec::new(),
            Kind::IPAddressPool => {
                list_of::<IPAddressPool>(client, |o| Object::IPAddressPool(Box::new(o))).await?
            }
            Kind::BGPConfiguration => {
                list_of::<BGPConfiguration>(client, |o| Object::BGPConfiguration(Box::new(o)))
                    .await?
            }
            Kind::BGPPeer => list_of::<BGPPeer>(client, |o| Object::BGPPeer(Box::new(o))).await?,
            Kind::Secret => list_of::<Secret>(client, |o| Object::Secret(Box::new(o))).await?,
            Kind::Ingress => list_of::<Ingress>(client, |o| Object::Ingress(Box::new(o))).await?,
            Kind::IngressClass => {
                list_of::<IngressClass>(client, |o| Object::IngressClass(Box::new(o))).await?
            }
            Kind::GatewayClass => {
                list_of::<GatewayClass>(client, |o| Object::GatewayClass(Box::new(o))).await?
            }
            Kind::Gateway => list_of::<Gateway>(client, |o| Object::Gateway(Box::new(o))).await?,
            Kind::HTTPRoute => {
                list_of::<HTTPRoute>(client, |o| Object::HTTPRoute(Box::new(o))).await?
            }
            Kind::ReferenceGrant => {
                list_of::<ReferenceGrant>(client, |o| Object::ReferenceGrant(Box::new(o))).await?
            }
            Kind::NetworkAttachmentDefinition => {
                list_of::<NetworkAttachmentDefinition>(client, |o| {
                    Object::NetworkAttachmentDefinition(Box::new(o))
                })
                .await?
            }
        });
    }
    Ok(out)
}

/// Where the watchers stand, folded from their messages.
struct Progress {
    /// What the consumers have.
    cache: Cache,
    /// Kinds between Init and InitDone.
    relisting: BTreeSet<Kind>,
    /// Kinds whose first list has not completed.
    waiting: BTreeSet<Kind>,
    /// Kinds whose watcher last reported an error (it retries by itself).
    failing: BTreeSet<Kind>,
}

impl Progress {
    /// Folds one watcher message in; the deltas it yields go to `out`.
    fn absorb(
        &mut self,
        kind: Kind,
        m: Result<Msg, watcher::Error>,
        health: &StoreWatch,
        out: &mut Vec<Delta>,
    ) {
        // `Init` comes before the list: it proves nothing yet.
        if m.is_ok() && !matches!(m, Ok(Msg::Init)) {
            self.failing.remove(&kind);
        }
        match m {
            Ok(Msg::Init) => {
                self.relisting.insert(kind);
                self.cache.begin_relist(kind);
            }
            Ok(Msg::InitApply(o)) => out.extend(self.cache.relisted(o)),
            Ok(Msg::InitDone) => {
                self.relisting.remove(&kind);
                out.extend(self.cache.end_relist(kind));
                if self.waiting.remove(&kind) && self.waiting.is_empty() {
                    health.watching();
                }
            }
            Ok(Msg::Apply(o)) => out.extend(self.cache.put(o)),
            Ok(Msg::Delete(o)) => out.extend(self.cache.delete(ObjectKey::of(&o))),
            Err(e) => {
                report_watch_error(kind, &e, self.failing.contains(&kind));
                health.broken(&format!("{kind} watch: {e}"));
                self.failing.insert(kind);
            }
        }
    }

    /// Every kind listed at least once and none mid-relist: what consumers
    /// have is a complete picture.
    fn settled(&self) -> bool {
        self.relisting.is_empty() && self.waiting.is_empty()
    }
}

/// Logs a watch error. A denial is the operator's to fix (RBAC), not a
/// blip: say so at once, once per failing spell (`already_failing`); so is
/// a kind the API server does not serve (podnet's own kinds, whose
/// CustomResourceDefinitions are not installed).
fn report_watch_error(kind: Kind, e: &watcher::Error, already_failing: bool) {
    match answer_code(e) {
        Some(code @ (401 | 403)) if !already_failing => tracing::warn!(
            kind = %kind,
            code,
            "the API server denies list/watch of {kind}: {e} \
             (retrying; a starting API server does this for a few seconds, \
             but if it lasts, the ClusterRole of this ServiceAccount needs it; \
             see deploy/parts)"
        ),
        Some(404) if !already_failing => tracing::warn!(
            kind = %kind,
            "the API server does not serve {kind}: {e} (retrying; its \
             CustomResourceDefinition is not installed: see deploy/parts/05-crds.yaml)"
        ),
        _ => tracing::debug!(kind = %kind, "watch: {e}"),
    }
}

impl KubeSource {
    pub fn new(client: Client, health: StoreWatch) -> Self {
        KubeSource {
            client,
            health,
            hub: Hub::default(),
        }
    }

    pub(crate) async fn run(mut self) {
        let kinds = self.hub.kinds();
        let streams: Vec<_> = kinds
            .iter()
            .filter_map(|&k| stream_for(&self.client, k))
            .collect();
        let waiting: BTreeSet<Kind> = kinds
            .iter()
            .copied()
            .filter(|k| *k != Kind::NetworkConfig)
            .collect();
        if waiting.is_empty() {
            self.hub.ready().await;
            return std::future::pending().await;
        }
        let _probe = self.health.probe({
            let client = self.client.clone();
            move || {
                let client = client.clone();
                async move { client.apiserver_version().await }
            }
        });
        let mut progress = Progress {
            cache: Cache::default(),
            relisting: BTreeSet::new(),
            waiting,
            failing: BTreeSet::new(),
        };
        let mut ready = false;
        let mut all = stream::select_all(streams).ready_chunks(1024);
        loop {
            let chunk = tokio::select! {
                Some(id) = self.hub.resync_rx.recv() => {
                    self.resync(id).await;
                    continue;
                }
                c = all.next() => c,
            };
            let Some(chunk) = chunk else { break };
            self.health.event();
            let mut out = Vec::new();
            let was_failing = !progress.failing.is_empty();
            for (kind, m) in chunk {
                progress.absorb(kind, m, &self.health, &mut out);
            }
            if progress.relisting.is_empty() && !out.is_empty() {
                tracing::debug!(
                    n = out.len(),
                    first = ?out[0].key(),
                    "watch deltas to the subscribers"
                );
            }
            for chunk in out.chunks(CHUNK) {
                self.hub.send(chunk).await;
            }
            if was_failing && progress.failing.is_empty() && progress.waiting.is_empty() {
                self.health.watching();
            }
            if !ready && progress.settled() {
                ready = true;
                self.hub.ready().await;
            }
        }
    }

    /// Answers subscriber `id`'s resync with a fresh list of its kinds;
    /// a failed list is asked for again after the health's backoff.
    async fn resync(&mut self, id: usize) {
        let kinds = self.hub.kinds_of(id);
        match list(&self.client, &kinds).await {
            Ok(objs) => self.hub.snapshot(id, objs).await,
            Err(e) => {
                self.health.broken(&format!("listing for a resync: {e}"));
                let _ = self.hub.resync_tx.send(id);
                self.health.backoff().await;
            }
        }
    }
}
