//! A node's one speaker, shared by everyone in the agent who wants
//! something of it: the overlay (the mesh of the other nodes, the node's
//! pod CIDR), the Service announcer (Service addresses) and the
//! configured peers (a top-of-rack router). Each owner replaces only its
//! own part; the speaker is told the union, and only when it changed.
//!
//! A neighbour two owners name (a node that is also a configured peer) is
//! taken from the owner that comes first in name order, so the result
//! never depends on who spoke last.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use tokio::sync::{mpsc, Mutex};

use crate::bfd_link::Bfd;
use crate::export::Neighbour;
use crate::rib::Change;
use crate::speaker::{Speaker, SpeakerConfig, SpeakerError};
use crate::status::Board;
use crate::wire::Afi;

/// What every owner wants.
#[derive(Default)]
struct Parts {
    neighbours: BTreeMap<&'static str, Vec<Neighbour>>,
    routes: BTreeMap<&'static str, BTreeSet<IpNet>>,
    told_neighbours: Option<Vec<Neighbour>>,
    told_routes: Option<BTreeSet<IpNet>>,
    /// The owners whose routes must be in before sessions are sent any.
    waiting: BTreeSet<&'static str>,
}

pub struct NodeSpeaker {
    speaker: Speaker,
    listen: IpAddr,
    parts: Mutex<Parts>,
}

impl NodeSpeaker {
    /// Starts the speaker (its listener bound); best-route changes arrive
    /// on the receiver. Sessions start at once (a neighbour that dials
    /// is never turned away as a stranger), but nothing is sent to them
    /// before each of `owners` has named its routes once: a restarted
    /// node's first table and its End-of-RIB would otherwise go out empty,
    /// and its peers, which kept its routes through the restart, would drop
    /// them at that End-of-RIB.
    pub async fn start(
        cfg: SpeakerConfig,
        board: Board,
        owners: &[&'static str],
        bfd: Option<Arc<Bfd>>,
    ) -> Result<(NodeSpeaker, mpsc::Receiver<Vec<Change>>), SpeakerError> {
        let (tx, rx) = mpsc::channel(64);
        let listen = cfg.listen;
        let speaker = Speaker::start_shared(cfg, tx, board, bfd, !owners.is_empty()).await?;
        Ok((
            NodeSpeaker {
                speaker,
                listen,
                parts: Mutex::new(Parts {
                    waiting: owners.iter().copied().collect(),
                    ..Default::default()
                }),
            },
            rx,
        ))
    }

    /// Replaces `owner`'s neighbours. One that cannot be (this node
    /// itself, the other address family) is left out and named in the
    /// returned problems; the others are used.
    pub async fn set_neighbours(&self, owner: &'static str, ns: Vec<Neighbour>) -> Vec<String> {
        let mut problems = Vec::new();
        let ns: Vec<Neighbour> = ns
            .into_iter()
            .filter(|n| {
                let why = if n.addr == self.listen {
                    "it is this node's own address"
                } else if n.addr.is_ipv4() != self.listen.is_ipv4() {
                    "the speaker listens on the other address family"
                } else {
                    return true;
                };
                problems.push(format!(
                    "BGP neighbour {} ({owner}) left out: {why}",
                    n.addr
                ));
                false
            })
            .collect();
        let mut p = self.parts.lock().await;
        p.neighbours.insert(owner, ns);
        problems.extend(self.tell_neighbours(&mut p).await);
        problems
    }

    /// Tells the speaker the union of the neighbours, when it changed.
    async fn tell_neighbours(&self, p: &mut Parts) -> Vec<String> {
        let mut all: Vec<Neighbour> = Vec::new();
        for n in p.neighbours.values().flatten() {
            if !all.iter().any(|a| a.addr == n.addr) {
                all.push(*n);
            }
        }
        all.sort_by_key(|n| n.addr);
        if p.told_neighbours.as_ref() == Some(&all) {
            return Vec::new();
        }
        let before = p.told_neighbours.clone().unwrap_or_default();
        for n in all.iter().filter(|n| !before.contains(n)) {
            self.hello(n.addr);
        }
        match self.speaker.set_neighbours(all.clone()).await {
            Ok(()) => {
                p.told_neighbours = Some(all);
                Vec::new()
            }
            Err(e) => vec![format!("BGP neighbours: {e}")],
        }
    }

    /// Makes this node's kernel resolve a new neighbour's address (one
    /// empty datagram to its BGP port, where nothing listens for UDP). The
    /// side that only listens would otherwise never send the neighbour a
    /// frame, and a neighbour that still holds this node's old MAC (a node
    /// replaced under the same address) would keep dialling into nothing
    /// until its entry timed out; the ARP request carries the new one.
    fn hello(&self, to: IpAddr) {
        let s = std::net::UdpSocket::bind((self.listen, 0));
        if let Err(e) = s.and_then(|s| s.send_to(&[], (to, crate::speaker::PORT))) {
            tracing::debug!(%to, "hello to a new BGP neighbour: {e}");
        }
    }

    /// Replaces the prefixes `owner` originates.
    pub async fn set_routes(&self, owner: &'static str, routes: BTreeSet<IpNet>) {
        let mut p = self.parts.lock().await;
        p.routes.insert(owner, routes);
        let all: BTreeSet<IpNet> = p.routes.values().flatten().copied().collect();
        if p.told_routes.as_ref() != Some(&all) {
            let own = all.iter().map(|n| (family(n), *n)).collect();
            self.speaker.originate(own).await;
            p.told_routes = Some(all);
        }
        if p.waiting.remove(owner) && p.waiting.is_empty() {
            self.speaker.release().await;
        }
    }

    /// The neighbours the speaker has now, for status and tests.
    pub async fn neighbours(&self) -> Vec<IpAddr> {
        let p = self.parts.lock().await;
        p.told_neighbours.iter().flatten().map(|n| n.addr).collect()
    }

    pub fn speaker(&self) -> &Speaker {
        &self.speaker
    }
}

fn family(n: &IpNet) -> Afi {
    match n {
        IpNet::V4(_) => Afi::Ipv4,
        IpNet::V6(_) => Afi::Ipv6,
    }
}
