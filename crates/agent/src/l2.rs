//! L2 announcement in the agent (`--l2-announce`): this node answers ARP
//! and Neighbor Discovery on its underlay for its share of the
//! LoadBalancer IPs (`podnet_lb::l2`), and takes over another node's
//! share the moment that node stops answering BFD.
//!
//! Every agent computes the same owners from the same inputs
//! (`podnet_lb::l2::election`, rendezvous hashing) and nodes never
//! negotiate, so what they must agree on is who is alive. That comes
//! from BFD (`podnet_bgp::bfd_link`, 100 ms × 3) between this node and
//! every other node's InternalIP: a node is alive from its session's Up
//! until its Down. A node whose session has never come up counts as alive
//! for a grace period after it appears (a node that is starting), then as
//! dead until it answers; so every agent in the cluster must run L2
//! announcement for any of them to.
//!
//! An IP's eligible nodes are the alive ones; for a Service with
//! `externalTrafficPolicy: Local`, only the alive ones with a ready
//! endpoint of it, so the client's address is kept; an IP with none is
//! announced by nobody.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::{Kind, Object};
use podnet_bgp::bfd::{Edge, Timing};
use podnet_bgp::bfd_link::Bfd;
use podnet_daemon::Metrics;
use podnet_lb::l2::{election, Announce, Responder};
use podnet_source::{Delta, Subscription};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::services::{ServiceCache, SvcKey};

/// The kinds L2 announcement reads.
pub const KINDS: &[Kind] = &[Kind::Service, Kind::EndpointSlice, Kind::Node];

/// How long a node that never answered BFD counts as alive.
const GRACE: Duration = Duration::from_secs(3);

/// Node liveness by BFD: 100 ms × 3, a dead node is noticed in 300 ms.
fn timing() -> Timing {
    Timing {
        desired_min_tx: Duration::from_millis(100),
        required_min_rx: Duration::from_millis(100),
        detect_mult: 3,
    }
}

/// What one node looks like to the election.
#[derive(Debug, Clone)]
struct Peer {
    ip: IpAddr,
    up: bool,
    /// Whether its session was ever up (after that, no grace).
    ever_up: bool,
    /// When it appeared.
    since: Instant,
}

/// What L2 announcement knows.
struct State {
    node: String,
    cache: ServiceCache,
    /// Every other node, by name.
    peers: BTreeMap<String, Peer>,
    /// This node's share, per Service that has one.
    mine: BTreeMap<SvcKey, BTreeSet<IpAddr>>,
}

impl State {
    fn alive(&self, now: Instant) -> BTreeSet<&str> {
        let mut out: BTreeSet<&str> = self
            .peers
            .iter()
            .filter(|(_, p)| p.up || (!p.ever_up && now.duration_since(p.since) < GRACE))
            .map(|(n, _)| n.as_str())
            .collect();
        out.insert(self.node.as_str());
        out
    }

    /// This node's share of one Service's LoadBalancer IPs (each IP's
    /// owner is decided on its own, so a Service costs only itself).
    fn share(&self, key: &SvcKey, alive: &BTreeSet<&str>) -> BTreeSet<IpAddr> {
        let Some(svc) = self.cache.service(key) else {
            return BTreeSet::new();
        };
        let eligible = match podnet_api::service::external_local(svc) {
            true => ready_nodes(&self.cache.slices(key), alive),
            false => alive.clone(),
        };
        let ips = lb_ips(svc).into_iter().map(|ip| (ip, eligible.clone()));
        election::owned_by(&self.node, ips)
    }

    /// This node's share of every LoadBalancer IP, computed afresh (the
    /// tests' oracle for [`State::refresh`]).
    #[cfg(test)]
    fn owned(&self, now: Instant) -> BTreeSet<IpAddr> {
        let alive = self.alive(now);
        let keys = self.cache.services().map(|(k, _)| k.clone());
        keys.flat_map(|k| self.share(&k, &alive)).collect()
    }

    /// Recomputes the share of `keys` (None: every Service, as liveness
    /// changed); the whole share, from the per-Service ones.
    fn refresh(&mut self, keys: Option<BTreeSet<SvcKey>>, now: Instant) -> BTreeSet<IpAddr> {
        let keys: Vec<SvcKey> = match keys {
            Some(k) => k.into_iter().collect(),
            None => {
                self.mine.clear();
                self.cache.services().map(|(k, _)| k.clone()).collect()
            }
        };
        let shares: Vec<(SvcKey, BTreeSet<IpAddr>)> = {
            let alive = self.alive(now);
            keys.into_iter()
                .map(|k| {
                    let s = self.share(&k, &alive);
                    (k, s)
                })
                .collect()
        };
        for (k, share) in shares {
            match share.is_empty() {
                true => self.mine.remove(&k),
                false => self.mine.insert(k, share),
            };
        }
        self.mine.values().flatten().copied().collect()
    }

    /// Files a batch's Nodes; the nodes that appeared and went.
    fn nodes(&mut self, deltas: &[Delta], now: Instant) -> (Vec<IpAddr>, Vec<IpAddr>) {
        let (mut added, mut gone) = (Vec::new(), Vec::new());
        for d in deltas {
            let k = d.key();
            if k.kind != Kind::Node || k.name == self.node {
                continue;
            }
            let ip = match d {
                Delta::Added(o) | Delta::Updated(o) => internal_ip(o),
                Delta::Deleted(_) => None,
            };
            let old = self.peers.get(&k.name).map(|p| p.ip);
            if old == ip {
                continue;
            }
            gone.extend(old);
            self.peers.remove(&k.name);
            if let Some(ip) = ip {
                added.push(ip);
                let p = Peer {
                    ip,
                    up: false,
                    ever_up: false,
                    since: now,
                };
                self.peers.insert(k.name, p);
            }
        }
        (added, gone)
    }

    /// Whether a node that never answered ran out of grace in
    /// (`from`, `to`].
    fn grace_ended(&self, from: Instant, to: Instant) -> bool {
        self.peers.values().any(|p| {
            let end = p.since + GRACE;
            !p.ever_up && end > from && end <= to
        })
    }

    fn edge(&mut self, ip: IpAddr, e: &Edge) {
        if let Some(p) = self.peers.values_mut().find(|p| p.ip == ip) {
            p.up = matches!(e, Edge::Up);
            p.ever_up |= p.up;
        }
    }
}

fn internal_ip(o: &Object) -> Option<IpAddr> {
    match o {
        Object::Node(n) => crate::services::internal_ip(n),
        _ => None,
    }
}

fn lb_ips(svc: &Service) -> Vec<IpAddr> {
    let lb = svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer");
    match lb {
        true => podnet_api::service::lb_ingress_ips(svc),
        false => Vec::new(),
    }
}

/// The alive nodes with a ready endpoint in `slices`.
fn ready_nodes<'a>(slices: &[&EndpointSlice], alive: &BTreeSet<&'a str>) -> BTreeSet<&'a str> {
    alive
        .iter()
        .filter(|n| podnet_api::endpoints::ready_on(slices, n) > 0)
        .copied()
        .collect()
}

/// Runs L2 announcement on `iface` until the subscription ends; a
/// failure to start is reported on `/readyz` and in the log.
pub async fn run(
    sub: Subscription,
    node: String,
    iface: String,
    bfd: Arc<Bfd>,
    metrics: Arc<Metrics>,
) {
    if let Err(e) = run_inner(sub, node, &iface, bfd).await {
        tracing::error!("L2 announcement stopped: {e}");
        metrics.set_unhealthy_for("l2", Some(format!("L2 announcement stopped: {e}")));
    }
}

async fn run_inner(
    mut sub: Subscription,
    node: String,
    iface: &str,
    bfd: Arc<Bfd>,
) -> Result<(), String> {
    let responder = Responder::start(iface, Announce::default()).map_err(|e| e.to_string())?;
    // Per node, the task hearing its BFD edges: aborted, it leaves the
    // session (which BGP may share).
    let mut subs: BTreeMap<IpAddr, tokio::task::JoinHandle<()>> = BTreeMap::new();
    let (edges_tx, mut edges) = mpsc::channel::<(IpAddr, Edge)>(64);
    let mut st = State {
        node,
        cache: ServiceCache::default(),
        peers: BTreeMap::new(),
        mine: BTreeMap::new(),
    };
    // A node past its grace period changes the result with no input.
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut last = Instant::now();
    loop {
        // Which Services to look at again (None: all, liveness changed).
        let mut dirty: Option<Option<BTreeSet<SvcKey>>> = Some(None);
        tokio::select! {
            b = sub.next_batch() => {
                let Some(b) = b else { return Ok(()) };
                let touched = st.cache.take(&b.deltas);
                let (added, gone) = st.nodes(&b.deltas, Instant::now());
                let nodes_changed = !added.is_empty() || !gone.is_empty();
                dirty = Some((!nodes_changed).then_some(touched));
                for p in gone {
                    if let Some(t) = subs.remove(&p) {
                        t.abort();
                    }
                }
                for p in added {
                    let (tx, fwd) = (mpsc::channel(8), edges_tx.clone());
                    bfd.add(p, timing(), tx.0).await;
                    subs.insert(p, tokio::spawn(forward(p, tx.1, fwd)));
                }
            }
            Some((p, e)) = edges.recv() => {
                tracing::info!(node_ip = %p, up = matches!(e, Edge::Up), "node liveness");
                st.edge(p, &e);
                if matches!(e, Edge::Up) {
                    // It may have taken some of ours while it could not
                    // hear us (a cut link): our clients must hear us again.
                    responder.announce_again();
                }
            }
            _ = tick.tick() => {
                let now = Instant::now();
                dirty = st.grace_ended(last, now).then_some(None);
                last = now;
            }
        }
        let Some(keys) = dirty else { continue };
        let owned = st.refresh(keys, Instant::now());
        if owned != responder.owned() {
            tracing::info!(?owned, "L2 announcement: this node's LoadBalancer IPs");
            responder.set_owned(owned);
        }
    }
}

/// One BFD session's edges, tagged with its neighbour.
async fn forward(ip: IpAddr, mut rx: mpsc::Receiver<Edge>, tx: mpsc::Sender<(IpAddr, Edge)>) {
    while let Some(e) = rx.recv().await {
        if tx.send((ip, e)).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn added(o: Object) -> Delta {
        Delta::Added(Arc::new(o))
    }

    fn node(name: &str, ip: &str) -> Delta {
        added(Object::Node(Box::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "status": {"addresses": [{"type": "InternalIP", "address": ip}]}}))
            .unwrap(),
        )))
    }

    fn lb(name: &str, ip: &str, policy: &str) -> Delta {
        added(Object::Service(Box::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"type": "LoadBalancer", "externalTrafficPolicy": policy},
                "status": {"loadBalancer": {"ingress": [{"ip": ip}]}}}))
            .unwrap(),
        )))
    }

    fn slice(svc: &str, node: &str) -> Delta {
        added(Object::EndpointSlice(Box::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("{svc}-1"), "namespace": "default",
                    "labels": {"kubernetes.io/service-name": svc}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.244.2.5"], "nodeName": node}]}))
            .unwrap(),
        )))
    }

    fn state(me: &str, deltas: &[Delta], now: Instant) -> State {
        let mut st = State {
            node: me.into(),
            cache: ServiceCache::default(),
            peers: BTreeMap::new(),
            mine: BTreeMap::new(),
        };
        st.cache.take(deltas);
        st.nodes(deltas, now);
        st
    }

    /// Every node computes the same owners; a node whose BFD goes down
    /// loses its IPs to the others; a Local Service's IP goes only to a
    /// node with an endpoint, and to nobody when that node is down.
    #[test]
    fn owners_follow_liveness_and_local_endpoints() {
        let now = Instant::now();
        let ips: Vec<String> = (1..=20).map(|i| format!("198.51.100.{i}")).collect();
        let mut deltas = vec![node("n1", "192.168.200.11"), node("n2", "192.168.200.12")];
        deltas.extend(ips.iter().map(|ip| lb(&format!("s{ip}"), ip, "Cluster")));
        let a = state("n1", &deltas, now);
        let b = state("n2", &deltas, now);
        let (oa, ob) = (a.owned(now), b.owned(now));
        assert!(oa.is_disjoint(&ob), "{oa:?} {ob:?}");
        assert_eq!(oa.len() + ob.len(), 20);
        assert!(
            !oa.is_empty() && !ob.is_empty(),
            "rendezvous hashing spreads them"
        );
        // n2 stops answering: n1 owns everything.
        let mut a = a;
        let n2: IpAddr = "192.168.200.12".parse().unwrap();
        a.edge(n2, &Edge::Up);
        a.edge(n2, &Edge::Down(podnet_bgp::bfd::Diag::DetectionTimeExpired));
        assert_eq!(a.owned(Instant::now()).len(), 20);

        let local = vec![
            node("n1", "192.168.200.11"),
            node("n2", "192.168.200.12"),
            lb("web", "198.51.100.99", "Local"),
            slice("web", "n2"),
        ];
        let ip: IpAddr = "198.51.100.99".parse().unwrap();
        assert!(state("n1", &local, now).owned(now).is_empty());
        assert_eq!(
            state("n2", &local, now).owned(now),
            [ip].into_iter().collect()
        );
        // n1's view once n2 is down: nobody has an endpoint.
        let mut a = state("n1", &local, now);
        a.edge(n2, &Edge::Down(podnet_bgp::bfd::Diag::DetectionTimeExpired));
        assert!(a.owned(Instant::now()).is_empty());
    }

    /// The per-Service share kept across batches is the full one.
    #[test]
    fn the_share_kept_per_service_is_the_whole_share() {
        let now = Instant::now();
        let mut deltas = vec![node("n2", "192.168.200.12")];
        deltas.extend((1..=9).map(|i| lb(&format!("s{i}"), &format!("198.51.100.{i}"), "Cluster")));
        let mut st = state("n1", &deltas, now);
        let all = st.refresh(None, now);
        assert_eq!(all, st.owned(now));
        let touched = st.cache.take(&[Delta::Deleted(podnet_source::ObjectKey {
            kind: Kind::Service,
            namespace: Some("default".into()),
            name: "s1".into(),
        })]);
        let after = st.refresh(Some(touched), now);
        assert_eq!(after, st.owned(now));
        assert!(!after.contains(&"198.51.100.1".parse::<IpAddr>().unwrap()));
    }

    #[test]
    fn a_node_that_never_answers_is_alive_only_for_its_grace() {
        let now = Instant::now();
        let st = state("n1", &[node("n2", "192.168.200.12")], now);
        assert!(st.alive(now).contains("n2"));
        assert!(!st.alive(now + GRACE).contains("n2"));
        assert!(st.grace_ended(now, now + GRACE));
        assert!(!st.grace_ended(now + GRACE, now + GRACE * 2));
    }
}
