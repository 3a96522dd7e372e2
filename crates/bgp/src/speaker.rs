//! A node's BGP speaker: a listener, one [`Peer`] per configured
//! neighbour, the [`Rib`], and the export rules ([`crate::export`]) that
//! say what each neighbour is sent. The owner says which routes this node
//! originates and hears every change of the best routes (to install them
//! in the kernel).
//!
//! Between two speakers one side dials and the other listens (the one
//! with the higher address waits), so a node mesh never has two
//! connections for one session; a router that dials us (BIRD, FRR) is
//! accepted the same way. A connection from an address that is not a
//! neighbour is closed at once.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::bfd::{Edge, Timing};
use crate::bfd_link::Bfd;
use crate::export::{export, Neighbour, NextHops, Source};
use crate::fsm::{Config, Negotiated};
use crate::peer::{Announce, Peer, PeerEvent};
use crate::rib::{Change, Local, PeerId, Rib};
use crate::wire::{Afi, PathAttrs};

/// The BGP port.
pub const PORT: u16 = 179;

/// What a speaker is.
#[derive(Debug, Clone)]
pub struct SpeakerConfig {
    pub local: Local,
    pub hops: NextHops,
    /// The address it listens and dials from.
    pub listen: IpAddr,
    /// The session template (AS, timers, families); `peer_as` and
    /// `passive` are set per neighbour.
    pub session: Config,
    pub neighbours: Vec<Neighbour>,
    /// BFD with every neighbour, at this timing: a session whose BFD goes
    /// down is dropped at once (RFC 5882), not after the hold time.
    pub bfd: Option<Timing>,
}

/// A running speaker; dropped, it stops (its sessions just close).
pub struct Speaker {
    originate: mpsc::Sender<Vec<(Afi, IpNet)>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Speaker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Speaker {
    /// Binds the listener and starts every neighbour's session; best-route
    /// changes go to `changes`.
    pub async fn start(
        cfg: SpeakerConfig,
        changes: mpsc::Sender<Vec<Change>>,
    ) -> std::io::Result<Speaker> {
        let listener = TcpListener::bind(SocketAddr::new(cfg.listen, PORT)).await?;
        let (originate, wanted) = mpsc::channel(8);
        let (events_tx, events) = mpsc::channel(256);
        let mut peers = HashMap::new();
        for n in &cfg.neighbours {
            let (tx, mut rx) = mpsc::channel(64);
            let session = Config {
                peer_as: n.asn,
                passive: cfg.listen > n.addr,
                ..cfg.session.clone()
            };
            let peer = Peer::start(session, SocketAddr::new(n.addr, PORT), tx);
            let (fwd, addr) = (events_tx.clone(), n.addr);
            tokio::spawn(async move {
                while let Some(e) = rx.recv().await {
                    if fwd.send((addr, e)).await.is_err() {
                        return;
                    }
                }
            });
            peers.insert(n.addr, (*n, peer));
        }
        let (down_tx, bfd_down) = mpsc::channel(16);
        let bfd = match cfg.bfd {
            Some(t) => Some(start_bfd(&cfg, t, down_tx).await?),
            None => None,
        };
        let state = State {
            cfg,
            peers,
            _bfd: bfd,
            up: HashMap::new(),
            rib: Rib::default(),
            own: Vec::new(),
            out: HashMap::new(),
            changes,
        };
        let task = tokio::spawn(state.run(listener, events, wanted, bfd_down));
        Ok(Speaker { originate, task })
    }

    /// Replaces the routes this node originates.
    pub async fn originate(&self, routes: Vec<(Afi, IpNet)>) {
        let _ = self.originate.send(routes).await;
    }
}

/// BFD with every neighbour; each one's Down goes to `down`.
async fn start_bfd(
    cfg: &SpeakerConfig,
    t: Timing,
    down: mpsc::Sender<IpAddr>,
) -> std::io::Result<Bfd> {
    let bfd = Bfd::start(cfg.listen).await?;
    for n in &cfg.neighbours {
        let (tx, mut rx) = mpsc::channel(4);
        bfd.add(n.addr, t, tx).await;
        let (down, addr) = (down.clone(), n.addr);
        tokio::spawn(async move {
            while let Some(e) = rx.recv().await {
                if matches!(e, Edge::Down(_)) && down.send(addr).await.is_err() {
                    return;
                }
            }
        });
    }
    Ok(bfd)
}

struct State {
    cfg: SpeakerConfig,
    peers: HashMap<IpAddr, (Neighbour, Peer)>,
    _bfd: Option<Bfd>,
    /// Sessions that are up, and who is at the other end.
    up: HashMap<IpAddr, PeerId>,
    rib: Rib,
    own: Vec<(Afi, IpNet)>,
    /// What each neighbour should hold from us (Adj-RIB-Out, wanted).
    out: HashMap<IpAddr, BTreeMap<IpNet, PathAttrs>>,
    changes: mpsc::Sender<Vec<Change>>,
}

impl State {
    async fn run(
        mut self,
        listener: TcpListener,
        mut events: mpsc::Receiver<(IpAddr, PeerEvent)>,
        mut wanted: mpsc::Receiver<Vec<(Afi, IpNet)>>,
        mut bfd_down: mpsc::Receiver<IpAddr>,
    ) {
        loop {
            tokio::select! {
                Ok((s, from)) = listener.accept() => {
                    match self.peers.get(&from.ip()) {
                        Some((_, p)) => p.accept(s),
                        None => tracing::warn!(%from, "BGP connection from a stranger closed"),
                    }
                }
                Some((addr, e)) = events.recv() => self.event(addr, e).await,
                Some(addr) = bfd_down.recv() => {
                    if let Some((_, p)) = self.peers.get(&addr) {
                        p.path_down();
                    }
                }
                Some(own) = wanted.recv() => {
                    self.own = own;
                    self.export_all();
                }
                else => return,
            }
        }
    }

    async fn event(&mut self, addr: IpAddr, e: PeerEvent) {
        let changes = match e {
            PeerEvent::Up(n) => {
                let id = self.peer_id(addr, &n);
                self.up.insert(addr, id);
                self.export_to(addr);
                return;
            }
            PeerEvent::Down(why) => {
                tracing::info!(peer = %addr, "BGP session down: {why}");
                match self.up.remove(&addr) {
                    Some(id) => self.rib.peer_down(&id),
                    None => return,
                }
            }
            PeerEvent::Update(u) => match self.up.get(&addr) {
                Some(id) => self.rib.update(&self.cfg.local, *id, &u),
                None => return,
            },
        };
        if changes.is_empty() {
            return;
        }
        self.export_changes(&changes);
        let _ = self.changes.send(changes).await;
    }

    fn peer_id(&self, addr: IpAddr, n: &Negotiated) -> PeerId {
        let client = self.peers.get(&addr).is_some_and(|(nb, _)| nb.client);
        PeerId {
            addr,
            router_id: n.peer_id,
            asn: n.peer_as,
            external: n.peer_as != self.cfg.local.asn,
            client,
        }
    }

    /// Recomputes what every neighbour holds from us (our own routes
    /// changed).
    fn export_all(&mut self) {
        let addrs: Vec<IpAddr> = self.up.keys().copied().collect();
        for addr in addrs {
            self.export_to(addr);
        }
    }

    /// What `nb` gets for prefix `p` (our own, or the best route).
    fn attrs_for(&self, nb: &Neighbour, p: &IpNet) -> Option<PathAttrs> {
        let afi = match p {
            IpNet::V4(_) => Afi::Ipv4,
            IpNet::V6(_) => Afi::Ipv6,
        };
        let (local, hops) = (&self.cfg.local, &self.cfg.hops);
        if self.own.iter().any(|(_, o)| o == p) {
            return export(local, hops, nb, afi, Source::Local);
        }
        let r = self.rib.best(p)?;
        export(local, hops, nb, afi, Source::Learned(r))
    }

    /// Everything neighbour `addr` should hold from us, computed whole (a
    /// session that came up, our own routes changed).
    fn export_to(&mut self, addr: IpAddr) {
        let Some((nb, _)) = self.peers.get(&addr) else {
            return;
        };
        let nb = *nb;
        let prefixes: Vec<IpNet> = self
            .own
            .iter()
            .map(|(_, p)| *p)
            .chain(self.rib.best_routes().map(|(p, _)| *p))
            .collect();
        let out = prefixes
            .into_iter()
            .filter_map(|p| self.attrs_for(&nb, &p).map(|a| (p, a)))
            .collect();
        self.out.insert(addr, out);
        self.announce(addr);
    }

    /// Only the changed prefixes, towards every neighbour that is up: a
    /// change costs what changed, not the table.
    fn export_changes(&mut self, changes: &[Change]) {
        let addrs: Vec<IpAddr> = self.up.keys().copied().collect();
        for addr in addrs {
            let Some((nb, _)) = self.peers.get(&addr) else {
                continue;
            };
            let nb = *nb;
            let mut touched = false;
            for (p, _) in changes {
                let attrs = self.attrs_for(&nb, p);
                let out = self.out.entry(addr).or_default();
                let before = match attrs {
                    Some(a) => out.insert(*p, a.clone()).filter(|b| *b == a).is_none(),
                    None => out.remove(p).is_some(),
                };
                touched |= before;
            }
            if touched {
                self.announce(addr);
            }
        }
    }

    /// Hands neighbour `addr`'s routes to its session, grouped by
    /// attributes (one UPDATE carries many prefixes of one group).
    fn announce(&self, addr: IpAddr) {
        let (Some((_, peer)), Some(out)) = (self.peers.get(&addr), self.out.get(&addr)) else {
            return;
        };
        let mut groups: Vec<(Afi, PathAttrs, Vec<IpNet>)> = Vec::new();
        for (p, attrs) in out {
            let afi = match p {
                IpNet::V4(_) => Afi::Ipv4,
                IpNet::V6(_) => Afi::Ipv6,
            };
            match groups.iter_mut().find(|(f, a, _)| *f == afi && a == attrs) {
                Some((_, _, ps)) => ps.push(*p),
                None => groups.push((afi, attrs.clone(), vec![*p])),
            }
        }
        peer.announce(Announce { routes: groups });
    }
}
