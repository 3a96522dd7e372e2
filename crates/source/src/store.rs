//! The object source over the podnet store (standalone mode).
//!
//! Each subscribed kind is listed under its own key prefix (so a proxy that
//! wants Services never reads every Pod), then one watch on `/registry/`
//! follows them all from the oldest list's revision; an event a kind's own
//! list already reflected is dropped by revision. A compacted watch, a
//! broken stream or a store that comes back after a loss means a relist,
//! delivered as the difference ([`crate::cache`]). The watch's health is a
//! `podnet_daemon::StoreWatch`: a store that stays away fails `/readyz`
//! while consumers keep what they have.
//!
//! This is the only code that reads `/registry/` keys.

use std::collections::{BTreeMap, BTreeSet};

use podnet_api::bgp::{BGPConfiguration, BGPPeer};
use podnet_api::k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::k8s_openapi::api::networking::v1::NetworkPolicy;
use podnet_api::pool::IPAddressPool;
use podnet_api::{Kind, Object};
use podnet_daemon::StoreWatch;
use podnet_store::{AnyStore, EventType, KeyValue, Rev, Store, WatchMsg};

use crate::cache::Cache;
use crate::{Hub, ObjectKey, CHUNK};

pub struct StoreSource {
    store: AnyStore,
    health: StoreWatch,
    pub(crate) hub: Hub,
}

/// The kind and key of a `/registry/<plural>/[<ns>/]<name>` key.
pub fn parse_key(key: &str) -> Option<ObjectKey> {
    let rest = key.strip_prefix("/registry/")?;
    let (plural, rest) = rest.split_once('/')?;
    let kind = Kind::ALL.into_iter().find(|k| k.plural() == plural)?;
    if kind.namespaced() {
        let (ns, name) = rest.split_once('/')?;
        Some(ObjectKey {
            kind,
            namespace: Some(ns.to_string()),
            name: name.to_string(),
        })
    } else {
        Some(ObjectKey {
            kind,
            namespace: None,
            name: rest.to_string(),
        })
    }
}

/// Straight from the stored bytes into the typed object (no
/// `serde_json::Value` in between: a full list decodes every object), with
/// the resourceVersion the store's revision gives it.
pub fn decode(kind: Kind, kv: &KeyValue) -> Option<Object> {
    fn de<T: serde::de::DeserializeOwned>(b: &[u8]) -> Option<Box<T>> {
        serde_json::from_slice(b).ok().map(Box::new)
    }
    let mut o = match kind {
        Kind::Namespace => Object::Namespace(de::<Namespace>(&kv.value)?),
        Kind::Node => Object::Node(de::<Node>(&kv.value)?),
        Kind::Pod => Object::Pod(de::<Pod>(&kv.value)?),
        Kind::Service => Object::Service(de::<Service>(&kv.value)?),
        Kind::EndpointSlice => Object::EndpointSlice(de::<EndpointSlice>(&kv.value)?),
        Kind::NetworkPolicy => Object::NetworkPolicy(de::<NetworkPolicy>(&kv.value)?),
        Kind::NetworkConfig => return podnet_store::objects::decode(kv).ok(),
        Kind::IPAddressPool => Object::IPAddressPool(de::<IPAddressPool>(&kv.value)?),
        Kind::BGPConfiguration => Object::BGPConfiguration(de::<BGPConfiguration>(&kv.value)?),
        Kind::BGPPeer => Object::BGPPeer(de::<BGPPeer>(&kv.value)?),
        Kind::Secret => Object::Secret(de(&kv.value)?),
        Kind::Ingress => Object::Ingress(de(&kv.value)?),
        Kind::IngressClass => Object::IngressClass(de(&kv.value)?),
        Kind::GatewayClass => Object::GatewayClass(de(&kv.value)?),
        Kind::Gateway => Object::Gateway(de(&kv.value)?),
        Kind::HTTPRoute => Object::HTTPRoute(de(&kv.value)?),
        Kind::ReferenceGrant => Object::ReferenceGrant(de(&kv.value)?),
        Kind::NetworkAttachmentDefinition => Object::NetworkAttachmentDefinition(de(&kv.value)?),
    };
    o.meta_mut().resource_version = Some(kv.mod_rev.to_string());
    Some(o)
}

fn decode_logged(kind: Kind, kv: &KeyValue) -> Option<Object> {
    let o = decode(kind, kv);
    if o.is_none() {
        tracing::warn!(key = %kv.key, "skipping an object the store holds but podnet cannot decode");
    }
    o
}

/// The cluster's network config as the store holds it now (one read, no
/// watch), for daemons that size themselves from it at start (the agent's
/// network, DNS's zones): `None` when there is none. A change needs a
/// restart, as with flannel's net-conf.json.
pub async fn network_config(
    store: &AnyStore,
) -> podnet_store::Result<Option<podnet_api::netconfig::NetworkConfig>> {
    let key = Kind::NetworkConfig.key(None, podnet_api::netconfig::DEFAULT_NAME);
    Ok(store
        .get(&key)
        .await?
        .and_then(|kv| decode(Kind::NetworkConfig, &kv))
        .and_then(|o| match o {
            Object::NetworkConfig(c) => Some(*c),
            _ => None,
        }))
}

/// The cluster's BGPConfiguration `default`, if stored.
pub async fn bgp_configuration(
    store: &AnyStore,
) -> podnet_store::Result<Option<podnet_api::bgp::BGPConfiguration>> {
    let key = Kind::BGPConfiguration.key(None, podnet_api::bgp::DEFAULT_NAME);
    Ok(store
        .get(&key)
        .await?
        .and_then(|kv| decode(Kind::BGPConfiguration, &kv))
        .and_then(|o| match o {
            Object::BGPConfiguration(c) => Some(*c),
            _ => None,
        }))
}

impl StoreSource {
    pub(crate) async fn bgp_configuration(
        &self,
    ) -> Result<Option<podnet_api::bgp::BGPConfiguration>, String> {
        bgp_configuration(&self.store)
            .await
            .map_err(|e| e.to_string())
    }
}

enum Step {
    /// Relist (after a gap or a failure).
    Relist,
}

impl StoreSource {
    pub fn new(store: AnyStore, health: StoreWatch) -> Self {
        StoreSource {
            store,
            health,
            hub: Hub::default(),
        }
    }

    /// Relists every subscribed kind into `cache`, delivering the
    /// difference kind by kind in chunks (a full list is never decoded
    /// whole); returns, per kind, the revision its list reflects.
    async fn relist(
        &self,
        kinds: &BTreeSet<Kind>,
        cache: &mut Cache,
    ) -> podnet_store::Result<BTreeMap<Kind, Rev>> {
        let mut revs = BTreeMap::new();
        for &k in kinds {
            let (kvs, rev) = self.store.list(&k.prefix(None)).await?;
            revs.insert(k, rev);
            cache.begin_relist(k);
            for chunk in kvs.chunks(CHUNK) {
                let out: Vec<_> = chunk
                    .iter()
                    .filter_map(|kv| decode_logged(k, kv))
                    .filter_map(|o| cache.relisted(o))
                    .collect();
                self.hub.send(&out).await;
            }
            drop(kvs);
            self.hub.send(&cache.end_relist(k)).await;
        }
        Ok(revs)
    }

    /// Every object of `kinds`, listed now (for a consumer's resync).
    async fn list(&self, kinds: &BTreeSet<Kind>) -> podnet_store::Result<Vec<Object>> {
        let mut objs = Vec::new();
        for &k in kinds {
            let (kvs, _) = self.store.list(&k.prefix(None)).await?;
            objs.extend(kvs.iter().filter_map(|kv| decode_logged(k, kv)));
        }
        Ok(objs)
    }

    pub(crate) async fn run(mut self) {
        let kinds = self.hub.kinds();
        if kinds.is_empty() {
            return;
        }
        let _probe = self.health.probe({
            let store = self.store.clone();
            move || {
                let store = store.clone();
                async move { store.revision().await }
            }
        });
        let mut cache = Cache::default();
        let mut ready = false;
        loop {
            let revs = match self.relist(&kinds, &mut cache).await {
                Ok(r) => r,
                Err(e) => {
                    self.health.broken(&format!("listing: {e}"));
                    self.health.backoff().await;
                    continue;
                }
            };
            // From the oldest list on: the store keeps the history, so the
            // list and the watch meet.
            let from = revs.values().copied().min().unwrap_or(0) + 1;
            let mut w = match self.store.watch("/registry/", from).await {
                Ok(w) => w,
                Err(e) => {
                    self.health.broken(&format!("watching: {e}"));
                    self.health.backoff().await;
                    continue;
                }
            };
            if !ready {
                ready = true;
                self.hub.ready().await;
            }
            self.health.watching();
            let Step::Relist = self.follow(&mut w, &kinds, &revs, &mut cache).await;
        }
    }

    /// Follows one watch until it must be replaced by a relist.
    async fn follow(
        &mut self,
        w: &mut podnet_store::Watch,
        kinds: &BTreeSet<Kind>,
        listed: &BTreeMap<Kind, Rev>,
        cache: &mut Cache,
    ) -> Step {
        loop {
            let m = tokio::select! {
                Some(id) = self.hub.resync_rx.recv() => {
                    let kinds = self.hub.kinds_of(id);
                    match self.list(&kinds).await {
                        Ok(objs) => self.hub.snapshot(id, objs).await,
                        Err(e) => {
                            self.health.broken(&format!("listing: {e}"));
                            // Asked again after the relist.
                            let _ = self.hub.resync_tx.send(id);
                            return Step::Relist;
                        }
                    }
                    continue;
                }
                // The store is back after a loss: the old stream may never
                // resume.
                _ = self.health.recovered() => return Step::Relist,
                m = w.next() => m,
            };
            self.health.event();
            let mut out = Vec::new();
            let mut relist = false;
            for m in w.with_queued(m) {
                match m {
                    Some(Ok(WatchMsg::Events(rev, evs))) => {
                        for ev in evs {
                            let Some(key) = parse_key(&ev.kv.key) else {
                                continue;
                            };
                            if !kinds.contains(&key.kind)
                                || listed.get(&key.kind).is_some_and(|r| rev <= *r)
                            {
                                continue;
                            }
                            let d = match ev.typ {
                                EventType::Put => {
                                    decode_logged(key.kind, &ev.kv).and_then(|o| cache.put(o))
                                }
                                EventType::Delete => cache.delete(key),
                            };
                            out.extend(d);
                        }
                    }
                    Some(Ok(WatchMsg::Compacted(_))) => relist = true,
                    Some(Err(e)) => {
                        self.health.broken(&format!("watch: {e}"));
                        relist = true;
                    }
                    None => {
                        self.health.broken(&"watch ended");
                        relist = true;
                    }
                }
            }
            self.hub.send(&out).await;
            if relist {
                return Step::Relist;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_into_kind_namespace_and_name() {
        let k = parse_key("/registry/services/default/web").unwrap();
        assert_eq!(k.kind, Kind::Service);
        assert_eq!(k.namespace.as_deref(), Some("default"));
        assert_eq!(k.name, "web");
        let k = parse_key("/registry/ipaddresspools/lan").unwrap();
        assert_eq!(
            (k.kind, k.namespace, k.name.as_str()),
            (Kind::IPAddressPool, None, "lan")
        );
        assert!(parse_key("/registry/allocations/lbips/192.0.2.1").is_none());
        let k = parse_key("/registry/nodes/node1").unwrap();
        assert_eq!(
            (k.kind, k.namespace, k.name.as_str()),
            (Kind::Node, None, "node1")
        );
        assert!(parse_key("/registry/widgets/x").is_none());
        assert!(parse_key("/podnet/subnets/10.244.1.0-24").is_none());
    }
}
