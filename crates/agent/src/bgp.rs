//! The node's BGP in the agent (the bgp backend): it starts the node's one
//! speaker (`podnet_bgp::node::NodeSpeaker`) on the underlay address and
//! attaches it to the overlay, which owns the mesh of the other nodes and
//! the node's pod CIDR; and it runs the Service announcer, which owns the
//! Service addresses this node originates (`podnet_bgp::adverts`: the
//! configured blocks, and a Local Service's addresses while it has a ready
//! endpoint here).
//!
//! The announcer keeps, per Service, the host routes it gave last, so a
//! change costs that Service (and the union of the small per-Service
//! sets), never a pass over every Service.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ipnet::IpNet;
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::{Kind, Object};
use podnet_bgp::adverts::{self, ServiceBlocks};
use podnet_bgp::node::NodeSpeaker;
use podnet_overlay::{Backend, Overlay};
use podnet_source::{Delta, Subscription};

use crate::AgentError;

/// The kinds the Service announcer reads.
pub const KINDS: &[Kind] = &[Kind::Service, Kind::EndpointSlice];

/// With the bgp backend: starts the node's speaker and attaches it to the
/// overlay; None for the other backends.
pub async fn start(overlay: &mut Overlay) -> Result<Option<Arc<NodeSpeaker>>, AgentError> {
    let ip = overlay.underlay().ip;
    let Backend::Bgp(b) = overlay.backend_mut() else {
        return Ok(None);
    };
    let (speaker, changes) = NodeSpeaker::start(b.speaker_config(ip))
        .await
        .map_err(|e| AgentError::Other(format!("starting BGP on {ip}:179: {e}")))?;
    let speaker = Arc::new(speaker);
    b.attach(speaker.clone(), changes);
    Ok(Some(speaker))
}

/// Service keys (namespace, name).
type SvcKey = (String, String);

/// What the announcer knows.
#[derive(Default)]
struct Announcer {
    node: String,
    blocks: ServiceBlocks,
    services: BTreeMap<SvcKey, Arc<Object>>,
    /// Per Service, its slices by name.
    slices: BTreeMap<SvcKey, BTreeMap<String, Arc<Object>>>,
    /// Each slice's Service, by the slice's (namespace, name).
    slice_owner: BTreeMap<(String, String), SvcKey>,
    /// Per Service, the host routes it has now.
    hosts: BTreeMap<SvcKey, BTreeSet<IpNet>>,
}

impl Announcer {
    /// Takes a batch of deltas; returns the Services they touched.
    fn take(&mut self, deltas: &[Delta]) -> BTreeSet<SvcKey> {
        let mut touched = BTreeSet::new();
        for d in deltas {
            let k = d.key();
            let ns = k.namespace.clone().unwrap_or_default();
            match (k.kind, d) {
                (Kind::Service, Delta::Added(o) | Delta::Updated(o)) => {
                    self.services
                        .insert((ns.clone(), k.name.clone()), o.clone());
                    touched.insert((ns, k.name));
                }
                (Kind::Service, Delta::Deleted(_)) => {
                    self.services.remove(&(ns.clone(), k.name.clone()));
                    touched.insert((ns, k.name));
                }
                (Kind::EndpointSlice, _) => touched.extend(self.slice(ns, &k.name, d)),
                _ => {}
            }
        }
        touched
    }

    /// Files a slice under its Service (by label); the Services it touched
    /// (two when it moved from one to another).
    fn slice(&mut self, ns: String, name: &str, d: &Delta) -> Vec<SvcKey> {
        let mut touched: Vec<SvcKey> = self.forget_slice(&ns, name).into_iter().collect();
        if let Delta::Added(o) | Delta::Updated(o) = d {
            if let Object::EndpointSlice(s) = o.as_ref() {
                if let Some(svc) = podnet_api::endpoints::service_name(s) {
                    let key = (ns, svc.to_string());
                    self.slices
                        .entry(key.clone())
                        .or_default()
                        .insert(name.to_string(), o.clone());
                    self.slice_owner
                        .insert((key.0.clone(), name.to_string()), key.clone());
                    touched.push(key);
                }
            }
        }
        touched
    }

    fn forget_slice(&mut self, ns: &str, name: &str) -> Option<SvcKey> {
        let key = self
            .slice_owner
            .remove(&(ns.to_string(), name.to_string()))?;
        if let Some(by) = self.slices.get_mut(&key) {
            by.remove(name);
            if by.is_empty() {
                self.slices.remove(&key);
            }
        }
        Some(key)
    }

    /// Recomputes the touched Services' host routes.
    fn plan(&mut self, touched: BTreeSet<SvcKey>) {
        for key in touched {
            let routes = match self.services.get(&key).map(|o| o.as_ref()) {
                Some(Object::Service(svc)) => {
                    let slices: Vec<&EndpointSlice> = self
                        .slices
                        .get(&key)
                        .into_iter()
                        .flat_map(|by| by.values())
                        .filter_map(|o| match o.as_ref() {
                            Object::EndpointSlice(s) => Some(s),
                            _ => None,
                        })
                        .collect();
                    adverts::host_routes(&self.blocks, &self.node, svc, &slices)
                }
                _ => BTreeSet::new(),
            };
            if routes.is_empty() {
                self.hosts.remove(&key);
            } else {
                self.hosts.insert(key, routes);
            }
        }
    }

    fn routes(&self) -> BTreeSet<IpNet> {
        let mut out = adverts::block_routes(&self.blocks);
        out.extend(self.hosts.values().flatten().copied());
        out
    }
}

/// Announces this node's Service addresses over `speaker` until the
/// subscription ends.
pub async fn announce(
    mut sub: Subscription,
    node: String,
    blocks: ServiceBlocks,
    speaker: Arc<NodeSpeaker>,
) {
    let mut a = Announcer {
        node,
        blocks,
        ..Default::default()
    };
    while let Some(b) = sub.next_batch().await {
        let touched = a.take(&b.deltas);
        a.plan(touched);
        speaker.set_routes("services", a.routes()).await;
    }
}
