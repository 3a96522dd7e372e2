//! The node's BGP in the agent (the bgp backend): it starts the node's one
//! speaker (`podnet_bgp::node::NodeSpeaker`) on the underlay address and
//! attaches it to the overlay, which originates the node's pod CIDR and
//! installs what is learned; and [`run`] owns the rest, from the object
//! source:
//!
//! - the sessions (`podnet_bgp::topology`): the node mesh (or the route
//!   reflectors, Nodes labelled `podnet.io/route-reflector=true`), as the
//!   cluster's `BGPConfiguration` says, and the `BGPPeer`s that select
//!   this node;
//! - the Service addresses this node originates (`podnet_bgp::adverts`:
//!   the configured blocks, and a Local Service's addresses while it has
//!   a ready endpoint here). Per Service it keeps the host routes it gave
//!   last, so a change costs that Service, never a pass over all of them.
//!
//! The cluster's AS is read once, when the speaker starts (64512 unless
//! configured); a changed AS needs an agent restart, and says so.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ipnet::IpNet;
use podnet_api::bgp::BGPPeerSpec;
use podnet_api::Kind;
use podnet_api::Object;
use podnet_bgp::adverts::{self, ServiceBlocks};
use podnet_bgp::export::Neighbour;
use podnet_bgp::node::NodeSpeaker;
use podnet_bgp::topology;
use podnet_overlay::{Backend, Overlay};
use podnet_source::{Delta, Subscription};

use crate::services::{ServiceCache, SvcKey};
use crate::AgentError;

/// The kinds the node's BGP reads.
pub const KINDS: &[Kind] = &[
    Kind::Service,
    Kind::EndpointSlice,
    Kind::Node,
    Kind::BGPConfiguration,
    Kind::BGPPeer,
];

const BGP_SESSION_UP: podnet_daemon::Gauge = podnet_daemon::Gauge::new(
    "podnet_bgp_session_up",
    "1 while the BGP session with the peer is Established.",
);
const BGP_RECEIVED: podnet_daemon::Gauge = podnet_daemon::Gauge::new(
    "podnet_bgp_prefixes_received",
    "Prefixes the BGP peer has routes to us for.",
);
const BGP_SENT: podnet_daemon::Gauge = podnet_daemon::Gauge::new(
    "podnet_bgp_prefixes_sent",
    "Prefixes we announce to the BGP peer.",
);
const BGP_BFD_UP: podnet_daemon::Gauge = podnet_daemon::Gauge::new(
    "podnet_bgp_bfd_up",
    "1 while the BFD session with the BGP peer is Up (absent without BFD).",
);

/// Copies the sessions' board into the metrics every few seconds (a
/// peer that went is set to 0).
pub async fn metrics(board: podnet_bgp::status::Board, m: Arc<podnet_daemon::Metrics>) {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(2));
    loop {
        tick.tick().await;
        let mut now = BTreeSet::new();
        for p in board.snapshot() {
            let Some(addr) = p.addr else { continue };
            let l = format!("peer=\"{addr}\"");
            m.gauge(
                &BGP_SESSION_UP,
                &l,
                f64::from(u8::from(p.state == "Established")),
            );
            m.gauge(&BGP_RECEIVED, &l, p.received as f64);
            m.gauge(&BGP_SENT, &l, p.sent as f64);
            if !p.bfd.is_empty() {
                m.gauge(&BGP_BFD_UP, &l, f64::from(u8::from(p.bfd == "Up")));
            }
            now.insert(l);
        }
        for l in seen.difference(&now) {
            for g in [&BGP_SESSION_UP, &BGP_RECEIVED, &BGP_SENT] {
                m.gauge(g, l, 0.0);
            }
        }
        seen = now;
    }
}

/// The owner of the Service addresses on the node's speaker.
const SERVICES: &str = "services";

/// With the bgp backend: starts the node's speaker and attaches it to the
/// overlay; None for the other backends.
pub async fn start(
    overlay: &mut Overlay,
    asn: u32,
    board: podnet_bgp::status::Board,
    bfd: Option<Arc<podnet_bgp::bfd_link::Bfd>>,
) -> Result<Option<Arc<NodeSpeaker>>, AgentError> {
    let ip = overlay.underlay().ip;
    let ip6 = overlay.ipv6_underlay();
    let Backend::Bgp(b) = overlay.backend_mut() else {
        return Ok(None);
    };
    b.asn = asn;
    let owners = [podnet_overlay::backend::bgp::OWNER, SERVICES];
    let (speaker, changes) = NodeSpeaker::start(b.speaker_config(ip, ip6), board, &owners, bfd)
        .await
        .map_err(|e| AgentError::Other(format!("starting BGP: {e}")))?;
    let speaker = Arc::new(speaker);
    b.attach(speaker.clone(), changes);
    Ok(Some(speaker))
}

/// What the node's BGP knows.
struct Routing {
    me: topology::Node,
    /// The AS the speaker runs in (the BGPConfiguration's when the agent
    /// started; a change needs an agent restart).
    asn: u32,
    blocks: ServiceBlocks,
    mesh: topology::Mesh,
    cache: ServiceCache,
    /// Per Service, the host routes it has now.
    hosts: BTreeMap<SvcKey, BTreeSet<IpNet>>,
    /// The other nodes, and this node's labels (for BGPPeer selectors).
    nodes: BTreeMap<String, topology::Node>,
    labels: BTreeMap<String, String>,
    peers: BTreeMap<String, BGPPeerSpec>,
    /// The node's underlay segment: mesh neighbours on it get GTSM.
    segment: Option<IpNet>,
}

impl Routing {
    /// Takes a batch; whether the sessions' side changed, and the
    /// Services whose routes must be recomputed.
    fn take(&mut self, deltas: &[Delta]) -> (bool, BTreeSet<SvcKey>) {
        let mut touched = self.cache.take(deltas);
        let mut sessions = false;
        for d in deltas {
            let k = d.key();
            let obj = match d {
                Delta::Added(o) | Delta::Updated(o) => Some(o.as_ref()),
                Delta::Deleted(_) => None,
            };
            match k.kind {
                Kind::Node => sessions |= self.node(&k.name, obj),
                Kind::BGPPeer => {
                    match obj {
                        Some(Object::BGPPeer(p)) => self.peers.insert(k.name, p.spec.clone()),
                        _ => self.peers.remove(&k.name),
                    };
                    sessions = true;
                }
                Kind::BGPConfiguration if k.name == podnet_api::bgp::DEFAULT_NAME => {
                    if self.config(obj) {
                        // New blocks: every Service's host routes change.
                        touched.extend(self.cache.services().map(|(k, _)| k.clone()));
                    }
                    sessions = true;
                }
                _ => {}
            }
        }
        (sessions, touched)
    }

    /// Files a Node; whether the mesh may have changed.
    fn node(&mut self, name: &str, obj: Option<&Object>) -> bool {
        let Some(Object::Node(n)) = obj else {
            return self.nodes.remove(name).is_some();
        };
        let labels = n.metadata.labels.clone().unwrap_or_default();
        let reflector = labels
            .get(podnet_api::bgp::ROUTE_REFLECTOR_LABEL)
            .is_some_and(|v| v == "true");
        if name == self.me.name {
            self.me.reflector = reflector;
            self.labels = labels;
            return true;
        }
        let Some(ip) = crate::services::internal_ip(n) else {
            return self.nodes.remove(name).is_some();
        };
        let node = topology::Node {
            name: name.to_string(),
            ip,
            reflector,
        };
        self.nodes.insert(name.to_string(), node.clone()) != Some(node)
    }

    /// Takes the cluster's BGPConfiguration; whether the blocks changed.
    fn config(&mut self, obj: Option<&Object>) -> bool {
        let spec = match obj {
            Some(Object::BGPConfiguration(c)) => c.spec.clone(),
            _ => Default::default(),
        };
        if spec.as_number() != self.asn {
            tracing::warn!(
                running = self.asn,
                configured = spec.as_number(),
                "the cluster's AS changed: restart the agent to apply it"
            );
        }
        self.mesh.enabled = spec.node_to_node_mesh_enabled();
        self.mesh.bfd = spec.bfd.is_some();
        let cidrs = |v: &[podnet_api::bgp::CidrEntry]| -> Vec<IpNet> {
            v.iter().filter_map(|c| c.cidr.parse().ok()).collect()
        };
        let blocks = ServiceBlocks {
            cluster_ips: cidrs(&spec.service_cluster_ips),
            external_ips: cidrs(&spec.service_external_ips),
            load_balancer_ips: cidrs(&spec.service_load_balancer_ips),
        };
        std::mem::replace(&mut self.blocks, blocks) != self.blocks
    }

    /// This node's neighbours: the mesh and the configured peers that
    /// select it.
    fn neighbours(&self) -> (Vec<Neighbour>, Vec<Neighbour>, Vec<String>) {
        let nodes: Vec<topology::Node> = self.nodes.values().cloned().collect();
        let mesh = topology::mesh(&self.me, &nodes, self.mesh, self.segment);
        let mine: Vec<topology::Configured> = self
            .peers
            .values()
            .filter(|p| self.selects(p))
            .filter_map(|p| {
                Some(topology::Configured {
                    ip: p.peer_ip.parse().ok()?,
                    asn: p.as_number?,
                    bfd: p.bfd.unwrap_or(false),
                })
            })
            .collect();
        let (peers, problems) = topology::configured(&self.me, &mine);
        (mesh, peers, problems)
    }

    fn selects(&self, p: &BGPPeerSpec) -> bool {
        if let Some(n) = &p.node {
            return *n == self.me.name;
        }
        p.node_selector
            .as_ref()
            .is_none_or(|s| podnet_api::selector::matches(s, &self.labels))
    }

    /// Recomputes the touched Services' host routes.
    fn plan(&mut self, touched: BTreeSet<SvcKey>) {
        for key in touched {
            let routes = match self.cache.service(&key) {
                Some(svc) => {
                    let node = &self.me.name;
                    adverts::host_routes(&self.blocks, node, svc, &self.cache.slices(&key))
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

/// Runs the node's BGP side until the subscription ends: the sessions
/// (mesh, reflectors, configured peers) and the Service addresses, for
/// the node `me` (its name, its underlay segment, and the AS its speaker
/// runs in).
pub async fn run(mut sub: Subscription, me: (String, IpNet, u32), speaker: Arc<NodeSpeaker>) {
    let (node, segment, asn) = me;
    let ip = segment.addr();
    let mut r = Routing {
        me: topology::Node {
            name: node,
            ip,
            reflector: false,
        },
        asn,
        blocks: ServiceBlocks::default(),
        mesh: topology::Mesh {
            asn,
            enabled: true,
            bfd: false,
        },
        cache: ServiceCache::default(),
        hosts: BTreeMap::new(),
        nodes: BTreeMap::new(),
        labels: BTreeMap::new(),
        peers: BTreeMap::new(),
        segment: Some(segment.trunc()),
    };
    let mut first = true;
    while let Some(b) = sub.next_batch().await {
        let (sessions, touched) = r.take(&b.deltas);
        if sessions {
            let (mesh, peers, mut problems) = r.neighbours();
            problems.extend(speaker.set_neighbours("mesh", mesh).await);
            problems.extend(speaker.set_neighbours("peers", peers).await);
            for p in problems {
                tracing::warn!("{p}");
            }
        }
        // The first batch always speaks: sessions wait for every owner.
        if !touched.is_empty() || std::mem::take(&mut first) {
            r.plan(touched);
            speaker.set_routes(SERVICES, r.routes()).await;
        }
    }
}
