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
use podnet_api::Kind;
use podnet_bgp::adverts::{self, ServiceBlocks};
use podnet_bgp::node::NodeSpeaker;
use podnet_overlay::{Backend, Overlay};
use podnet_source::Subscription;

use crate::services::{ServiceCache, SvcKey};
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

/// What the announcer knows.
#[derive(Default)]
struct Announcer {
    node: String,
    blocks: ServiceBlocks,
    cache: ServiceCache,
    /// Per Service, the host routes it has now.
    hosts: BTreeMap<SvcKey, BTreeSet<IpNet>>,
}

impl Announcer {
    /// Recomputes the touched Services' host routes.
    fn plan(&mut self, touched: BTreeSet<SvcKey>) {
        for key in touched {
            let routes = match self.cache.service(&key) {
                Some(svc) => {
                    adverts::host_routes(&self.blocks, &self.node, svc, &self.cache.slices(&key))
                }
                None => BTreeSet::new(),
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
        let touched = a.cache.take(&b.deltas);
        a.plan(touched);
        speaker.set_routes("services", a.routes()).await;
    }
}
