//! A node's BGP speaker: a listener, one [`Peer`] per neighbour, the
//! [`Rib`], and the export rules ([`crate::export`]) that say what each
//! neighbour is sent. The owner says which routes this node originates and
//! who its neighbours are (both may change at any time: nodes join and
//! leave the mesh), and hears every change of the best routes (to install
//! them in the kernel).
//!
//! Between two speakers one side dials and the other listens (the one
//! with the higher address waits), so a node mesh never has two
//! connections for one session; a router that dials us (BIRD, FRR) is
//! accepted the same way. A connection from an address that is not a
//! neighbour now is closed at once.
//!
//! A neighbour on the link is guarded by GTSM (RFC 5082,
//! [`crate::gtsm`]): its session sends with TTL 255 and drops whatever
//! arrives with less, and while every neighbour is such, so does the
//! listener, so a SYN from beyond a router (a pod forging a node's
//! address) never even opens a connection.
//!
//! Each neighbour's session holds what that neighbour is to have from us
//! ([`crate::adj_out`]): a change of the best routes or of our own hands
//! each session only the prefixes that changed, and a session that comes up
//! sends its whole table by itself.
//!
//! A neighbour that leaves the set is stopped with a Cease (Peer
//! De-configured) and its routes leave the RIB at once (the owner hears
//! it, the other neighbours are sent the withdrawals); one whose AS,
//! reflector-client flag or GTSM changed is stopped (Other Configuration
//! Change) and started again; the others are not touched.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ipnet::IpNet;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::mpsc;

use crate::bfd::{Edge, Timing};
use crate::bfd_link::Bfd;
use crate::export::{export, Neighbour, NextHops, Source};
use crate::fsm::{Config, Negotiated};
use crate::gtsm;
use crate::peer::{Peer, PeerEvent};
use crate::rib::{Change, Local, PeerId, Rib};
use crate::status::Board;
use crate::wire::{cease, Afi, PathAttrs};

/// The BGP port.
pub const PORT: u16 = 179;

/// What a speaker is.
#[derive(Debug, Clone)]
pub struct SpeakerConfig {
    pub local: Local,
    pub hops: NextHops,
    /// The address it listens and dials from.
    pub listen: IpAddr,
    /// The session template (AS, timers, families); `peer_as`, `passive`
    /// and `ttl_security` are set per neighbour.
    pub session: Config,
    /// The neighbours it starts with; [`Speaker::set_neighbours`] replaces
    /// them.
    pub neighbours: Vec<Neighbour>,
    /// BFD with every neighbour, at this timing: a session whose BFD goes
    /// down is dropped at once (RFC 5882), not after the hold time.
    pub bfd: Option<Timing>,
}

/// Why a speaker did not start, or refused a neighbour set.
#[derive(Debug, thiserror::Error)]
pub enum SpeakerError {
    #[error("binding the BGP listener on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("starting BFD on {addr}: {source}")]
    Bfd {
        addr: IpAddr,
        source: std::io::Error,
    },
    #[error("neighbour {0} is listed twice")]
    Duplicate(IpAddr),
    #[error("neighbour {0} is this speaker's own address")]
    Ourselves(IpAddr),
    #[error(
        "neighbour {addr} is not of the family of the address the speaker listens on ({listen})"
    )]
    Family { addr: IpAddr, listen: IpAddr },
    #[error("the speaker has stopped")]
    Stopped,
}

/// What the owner asks of the running speaker.
enum Cmd {
    Originate(Vec<(Afi, IpNet)>),
    Neighbours(Vec<Neighbour>),
    /// The owner's routes are in: sessions may be sent their tables.
    Release,
}

/// A running speaker; dropped, its sessions just close, with no
/// NOTIFICATION, as when its process exits (an agent stopping for a
/// restart or an upgrade): peers with graceful restart keep its routes
/// until it is back. A neighbour removed from the set gets a Cease.
pub struct Speaker {
    listen: IpAddr,
    cmds: mpsc::Sender<Cmd>,
    /// Open once the owner's routes are in ([`Speaker::release`]).
    gate: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Speaker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Speaker {
    /// Binds the listener and starts every neighbour's session; best-route
    /// changes go to `changes`, which the owner must keep reading (the
    /// speaker waits for room there).
    pub async fn start(
        cfg: SpeakerConfig,
        changes: mpsc::Sender<Vec<Change>>,
    ) -> Result<Speaker, SpeakerError> {
        Speaker::start_with(cfg, changes, Board::default()).await
    }

    /// [`Speaker::start`], keeping each neighbour's line on `board`.
    pub async fn start_with(
        cfg: SpeakerConfig,
        changes: mpsc::Sender<Vec<Change>>,
        board: Board,
    ) -> Result<Speaker, SpeakerError> {
        Speaker::start_shared(cfg, changes, board, None, false).await
    }

    /// [`Speaker::start_with`] on a BFD mux shared with others on this
    /// address (one UDP port 3784 per address; the node's liveness uses
    /// it too), when the config asks for BFD. With `held`, sessions come
    /// up but are sent nothing, not even End-of-RIB, until
    /// [`Speaker::release`]: a restarted node whose first table went out
    /// empty would have its peers, which kept its routes through the
    /// restart, drop them at that End-of-RIB.
    pub async fn start_shared(
        cfg: SpeakerConfig,
        changes: mpsc::Sender<Vec<Change>>,
        board: Board,
        mux: Option<Arc<Bfd>>,
        held: bool,
    ) -> Result<Speaker, SpeakerError> {
        let gate = Arc::new(AtomicBool::new(!held));
        check(cfg.listen, &cfg.neighbours)?;
        let addr = SocketAddr::new(cfg.listen, PORT);
        let all_gtsm = cfg.neighbours.iter().all(|n| n.ttl_security);
        let listener =
            listen(addr, all_gtsm).map_err(|source| SpeakerError::Listen { addr, source })?;
        let (down_tx, bfd_down) = mpsc::channel(16);
        let bfd = match (cfg.bfd, mux) {
            (Some(t), Some(m)) => Some((m, t)),
            (Some(t), None) => {
                let b = Bfd::start(cfg.listen)
                    .await
                    .map_err(|source| SpeakerError::Bfd {
                        addr: cfg.listen,
                        source,
                    })?;
                Some((Arc::new(b), t))
            }
            (None, _) => None,
        };
        let (cmds, cmd_rx) = mpsc::channel(8);
        let (events_tx, events) = mpsc::channel(256);
        let (expired_tx, expired) = mpsc::channel(16);
        let first = cfg.neighbours.clone();
        let mut state = State {
            cfg,
            listener,
            peers: HashMap::new(),
            next_gen: 0,
            events: events_tx,
            bfd,
            bfd_subs: HashMap::new(),
            bfd_down: down_tx,
            up: HashMap::new(),
            rib: Rib::default(),
            own: BTreeSet::new(),
            changes,
            board,
            gate: gate.clone(),
            restart: HashMap::new(),
            restarting: HashMap::new(),
            expired: expired_tx,
        };
        let listen = state.cfg.listen;
        for n in first {
            state.add(n).await;
        }
        state.guard_listener();
        let task = tokio::spawn(state.run(events, cmd_rx, bfd_down, expired));
        Ok(Speaker {
            listen,
            cmds,
            gate,
            task,
        })
    }

    /// Opens the gate of a held speaker: every session gets its table and
    /// End-of-RIB now.
    pub async fn release(&self) {
        self.gate.store(true, Ordering::Relaxed);
        let _ = self.cmds.send(Cmd::Release).await;
    }

    /// Replaces the routes this node originates (the neighbours are sent
    /// only the prefixes that came or went).
    pub async fn originate(&self, routes: Vec<(Afi, IpNet)>) {
        let _ = self.cmds.send(Cmd::Originate(routes)).await;
    }

    /// Replaces the neighbours: new ones are started, gone ones stopped
    /// with a Cease (their routes leave the RIB at once), changed ones
    /// (AS, reflector client, GTSM) started again; the others keep their
    /// sessions. Checked first: a bad set changes nothing.
    pub async fn set_neighbours(&self, ns: Vec<Neighbour>) -> Result<(), SpeakerError> {
        check(self.listen, &ns)?;
        self.cmds
            .send(Cmd::Neighbours(ns))
            .await
            .map_err(|_| SpeakerError::Stopped)
    }
}

/// The listener: it answers with TTL 255 (a GTSM neighbour checks the
/// SYN-ACK too), and takes only 255 from the start when every initial
/// neighbour has GTSM (no window before [`State::guard_listener`]).
fn listen(addr: SocketAddr, all_gtsm: bool) -> std::io::Result<TcpListener> {
    let s = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    s.set_reuseaddr(true)?;
    gtsm::send_255(&s, addr.is_ipv6())?;
    // The TTL check is in place before the first SYN can arrive.
    gtsm::min_ttl(&s, addr.is_ipv6(), all_gtsm)?;
    s.bind(addr)?;
    s.listen(1024)
}

/// A neighbour set the speaker can run: no address twice, not its own,
/// each of its own family.
fn check(listen: IpAddr, ns: &[Neighbour]) -> Result<(), SpeakerError> {
    let mut seen = std::collections::HashSet::new();
    for n in ns {
        if n.addr == listen {
            return Err(SpeakerError::Ourselves(n.addr));
        }
        if n.addr.is_ipv4() != listen.is_ipv4() {
            return Err(SpeakerError::Family {
                addr: n.addr,
                listen,
            });
        }
        if !seen.insert(n.addr) {
            return Err(SpeakerError::Duplicate(n.addr));
        }
    }
    Ok(())
}

/// A neighbour's running session; `gen` tells its events from those of
/// an earlier session with the same address.
struct Running {
    n: Neighbour,
    peer: Peer,
    gen: u64,
}

struct State {
    cfg: SpeakerConfig,
    listener: TcpListener,
    peers: HashMap<IpAddr, Running>,
    next_gen: u64,
    /// Every peer's events, with its address and generation.
    events: mpsc::Sender<(IpAddr, u64, PeerEvent)>,
    bfd: Option<(Arc<Bfd>, Timing)>,
    /// Per neighbour with BFD, the task that hears its session's edges
    /// (aborted, it leaves the shared session).
    bfd_subs: HashMap<IpAddr, tokio::task::JoinHandle<()>>,
    /// BFD's Down, per neighbour address.
    bfd_down: mpsc::Sender<IpAddr>,
    /// Sessions that are up, and who is at the other end.
    up: HashMap<IpAddr, PeerId>,
    rib: Rib,
    /// The prefixes this node originates.
    own: BTreeSet<IpNet>,
    changes: mpsc::Sender<Vec<Change>>,
    board: Board,
    gate: Arc<AtomicBool>,
    /// Per session that is up, the restart time its peer asked for
    /// (graceful restart), if any.
    restart: HashMap<IpAddr, u16>,
    /// Peers whose routes are kept while they restart, and the session
    /// generation that went down.
    restarting: HashMap<IpAddr, (PeerId, u64)>,
    /// A restart time ran out: (peer, the generation that went down).
    expired: mpsc::Sender<(IpAddr, u64)>,
}

impl State {
    async fn run(
        mut self,
        mut events: mpsc::Receiver<(IpAddr, u64, PeerEvent)>,
        mut cmds: mpsc::Receiver<Cmd>,
        mut bfd_down: mpsc::Receiver<IpAddr>,
        mut expired: mpsc::Receiver<(IpAddr, u64)>,
    ) {
        loop {
            tokio::select! {
                Ok((s, from)) = self.listener.accept() => {
                    match self.peers.get(&from.ip()) {
                        Some(r) => r.peer.accept(s),
                        None => tracing::warn!(%from, "BGP connection from a stranger closed"),
                    }
                }
                Some((addr, gen, e)) = events.recv() => {
                    if self.peers.get(&addr).is_some_and(|r| r.gen == gen) {
                        self.event(addr, gen, e).await;
                    }
                }
                Some(addr) = bfd_down.recv() => {
                    if let Some(r) = self.peers.get(&addr) {
                        r.peer.path_down();
                    }
                }
                Some((addr, gen)) = expired.recv() => self.restart_expired(addr, gen).await,
                Some(cmd) = cmds.recv() => match cmd {
                    Cmd::Originate(own) => self.originate(own),
                    Cmd::Neighbours(ns) => self.set_neighbours(ns).await,
                    Cmd::Release => self.peers.values().for_each(|r| r.peer.wake()),
                },
                else => return,
            }
        }
    }

    /// Stops the neighbours that went or changed, then starts the new and
    /// the changed ones.
    async fn set_neighbours(&mut self, ns: Vec<Neighbour>) {
        let wanted: HashMap<IpAddr, Neighbour> = ns.iter().map(|n| (n.addr, *n)).collect();
        let going: Vec<IpAddr> = self
            .peers
            .iter()
            .filter(|(addr, r)| wanted.get(addr) != Some(&r.n))
            .map(|(addr, _)| *addr)
            .collect();
        let mut changes = Vec::new();
        for addr in &going {
            changes.extend(self.remove(*addr, wanted.contains_key(addr)).await);
        }
        if !changes.is_empty() {
            self.export(changes.iter().map(|(p, _)| *p));
            let _ = self.changes.send(changes).await;
        }
        for n in ns {
            if !self.peers.contains_key(&n.addr) {
                self.add(n).await;
            }
        }
        self.guard_listener();
    }

    /// GTSM on the listener when every neighbour has it: a SYN that
    /// arrives with TTL below 255 is dropped before any connection exists
    /// (RFC 5082 §3). With a neighbour without it, the listener takes any
    /// TTL, and the check of a GTSM neighbour's connection starts once it
    /// is accepted (what arrived before, its OPEN say, was taken).
    fn guard_listener(&self) {
        let all = self.peers.values().all(|r| r.n.ttl_security);
        if let Err(e) = gtsm::min_ttl(&self.listener, self.cfg.listen.is_ipv6(), all) {
            tracing::error!("BGP listener's TTL check not set: {e}");
        }
    }

    /// Starts a neighbour's session, and its BFD when it asks for it (a
    /// session started again keeps the BFD it had).
    async fn add(&mut self, n: Neighbour) {
        let (tx, mut rx) = mpsc::channel(64);
        let session = Config {
            peer_as: n.asn,
            passive: self.cfg.listen > n.addr,
            ttl_security: n.ttl_security,
            ..self.cfg.session.clone()
        };
        let remote = SocketAddr::new(n.addr, PORT);
        let peer = Peer::start_gated(session, remote, tx, self.gate.clone());
        let gen = self.next_gen;
        self.next_gen += 1;
        let (fwd, addr) = (self.events.clone(), n.addr);
        tokio::spawn(async move {
            while let Some(e) = rx.recv().await {
                if fwd.send((addr, gen, e)).await.is_err() {
                    return;
                }
            }
        });
        peer.update(self.table_for(&n));
        self.board.update(n.addr, |p| p.asn = n.asn);
        self.peers.insert(n.addr, Running { n, peer, gen });
        match (n.bfd, self.bfd_subs.contains_key(&n.addr)) {
            (true, false) => self.start_bfd(n.addr).await,
            (false, true) => {
                if let Some(sub) = self.bfd_subs.remove(&n.addr) {
                    sub.abort();
                }
            }
            _ => {}
        }
    }

    /// BFD with `addr`, if the speaker runs BFD; its Down goes to the run
    /// loop.
    async fn start_bfd(&mut self, addr: IpAddr) {
        let Some((bfd, t)) = &self.bfd else { return };
        let (tx, mut rx) = mpsc::channel(4);
        bfd.add(addr, *t, tx).await;
        let (down, board) = (self.bfd_down.clone(), self.board.clone());
        board.update(addr, |p| p.bfd = "Down".into());
        let sub = tokio::spawn(async move {
            while let Some(e) = rx.recv().await {
                let up = matches!(e, Edge::Up);
                board.update(addr, |p| p.bfd = if up { "Up" } else { "Down" }.into());
                if !up && down.send(addr).await.is_err() {
                    return;
                }
            }
        });
        self.bfd_subs.insert(addr, sub);
    }

    /// Stops a neighbour's session with a Cease (and its BFD, unless
    /// `staying`: it is started again at once); returns the best routes
    /// that changed as its routes left the RIB.
    async fn remove(&mut self, addr: IpAddr, staying: bool) -> Vec<Change> {
        let Some(r) = self.peers.remove(&addr) else {
            return Vec::new();
        };
        tracing::info!(peer = %addr, "BGP neighbour removed");
        r.peer.stop_with(match staying {
            true => cease::OTHER_CONFIGURATION_CHANGE,
            false => cease::PEER_DECONFIGURED,
        });
        if !staying {
            if let Some(sub) = self.bfd_subs.remove(&addr) {
                sub.abort();
            }
        }
        self.restart.remove(&addr);
        if !staying {
            self.board.remove(addr);
        }
        let gone = self.up.remove(&addr);
        match gone.or(self.restarting.remove(&addr).map(|(id, _)| id)) {
            Some(id) => self.rib.peer_down(&id),
            None => Vec::new(),
        }
    }

    async fn event(&mut self, addr: IpAddr, gen: u64, e: PeerEvent) {
        let changes = match e {
            PeerEvent::Up(n) => {
                let id = self.peer_id(addr, &n);
                self.up.insert(addr, id);
                let time = n.peer_restart.as_ref().map_or(0, |g| g.time);
                self.restart.insert(addr, time);
                self.board.state(addr, "Established");
                self.board.update(addr, |p| p.asn = n.peer_as);
                return;
            }
            PeerEvent::Down(why) => {
                tracing::info!(peer = %addr, "BGP session down: {why}");
                self.board.state(addr, "Active");
                self.board.update(addr, |p| p.last_error = why.clone());
                match self.up.remove(&addr) {
                    Some(id) => self.session_down(addr, gen, id, &why),
                    None => return,
                }
            }
            PeerEvent::Update(u) => match self.up.get(&addr) {
                Some(id) => {
                    let id = *id;
                    let mut c = self.rib.update(&self.cfg.local, id, &u);
                    if let Some(afi) = u.is_end_of_rib() {
                        c.extend(self.end_of_rib(addr, id, afi));
                    }
                    c
                }
                None => return,
            },
        };
        self.refresh(addr);
        if changes.is_empty() {
            return;
        }
        self.export(changes.iter().map(|(p, _)| *p));
        let _ = self.changes.send(changes).await;
    }

    /// A session went down: its routes leave the RIB, unless the peer has
    /// graceful restart and the connection just ended (no NOTIFICATION,
    /// no BFD Down): then they stay, stale, until it is back and says
    /// End-of-RIB or its restart time runs out (RFC 4724 §4.2).
    fn session_down(&mut self, addr: IpAddr, gen: u64, id: PeerId, why: &str) -> Vec<Change> {
        let time = self.restart.remove(&addr).unwrap_or(0);
        if time == 0 || why != crate::fsm::CONNECTION_LOST {
            self.restarting.remove(&addr);
            return self.rib.peer_down(&id);
        }
        tracing::info!(peer = %addr, time, "keeping the peer's routes while it restarts");
        self.rib.peer_restarting(&id);
        self.restarting.insert(addr, (id, gen));
        let tx = self.expired.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(time.into())).await;
            let _ = tx.send((addr, gen)).await;
        });
        Vec::new()
    }

    /// A restarted peer's End-of-RIB: what it did not announce again goes.
    fn end_of_rib(&mut self, addr: IpAddr, id: PeerId, afi: Afi) -> Vec<Change> {
        if !self.rib.restarting(addr) {
            return Vec::new();
        }
        let c = self.rib.end_of_rib(&id, afi == Afi::Ipv6);
        if !self.rib.restarting(addr) {
            self.restarting.remove(&addr);
        }
        c
    }

    /// A peer's restart time ran out before it came back with its
    /// End-of-RIB: its stale routes go.
    async fn restart_expired(&mut self, addr: IpAddr, gen: u64) {
        if self.restarting.get(&addr).map(|(_, g)| *g) != Some(gen) {
            return;
        }
        let Some((id, _)) = self.restarting.remove(&addr) else {
            return;
        };
        tracing::info!(peer = %addr, "the peer's restart time ran out; its routes go");
        let changes = self.rib.peer_down(&id);
        self.refresh(addr);
        if !changes.is_empty() {
            self.export(changes.iter().map(|(p, _)| *p));
            let _ = self.changes.send(changes).await;
        }
    }

    /// The neighbour's counts on the board.
    fn refresh(&self, addr: IpAddr) {
        let sent = self.peers.get(&addr).map_or(0, |r| r.peer.sent());
        let received = self.rib.received(addr);
        self.board.update(addr, |p| {
            p.sent = sent;
            p.received = received;
        });
    }

    fn peer_id(&self, addr: IpAddr, n: &Negotiated) -> PeerId {
        let client = self.peers.get(&addr).is_some_and(|r| r.n.client);
        PeerId {
            addr,
            router_id: n.peer_id,
            asn: n.peer_as,
            external: n.peer_as != self.cfg.local.asn,
            client,
        }
    }

    /// Replaces our own routes; only the prefixes that came or went are
    /// exported again.
    fn originate(&mut self, routes: Vec<(Afi, IpNet)>) {
        let own: BTreeSet<IpNet> = routes.into_iter().map(|(_, p)| p).collect();
        let changed: Vec<IpNet> = self.own.symmetric_difference(&own).copied().collect();
        self.own = own;
        self.export(changed.into_iter());
    }

    /// What `nb` gets for prefix `p` (our own, or the best route).
    fn attrs_for(&self, nb: &Neighbour, p: &IpNet) -> Option<PathAttrs> {
        let (local, hops, afi) = (&self.cfg.local, &self.cfg.hops, Afi::of(p));
        if self.own.contains(p) {
            return export(local, hops, nb, afi, Source::Local);
        }
        let r = self.rib.best(p)?;
        export(local, hops, nb, afi, Source::Learned(r))
    }

    /// Everything `nb` is to have from us (a neighbour just added).
    fn table_for(&self, nb: &Neighbour) -> Vec<(IpNet, Option<PathAttrs>)> {
        let learned = self
            .rib
            .best_routes()
            .map(|(p, _)| p)
            .filter(|p| !self.own.contains(p));
        self.own
            .iter()
            .chain(learned)
            .filter_map(|p| self.attrs_for(nb, p).map(|a| (*p, Some(a))))
            .collect()
    }

    /// Hands every neighbour's session these prefixes' routes as they are
    /// now: a change costs what changed, not the table (each session sends
    /// only what differs from what its peer holds).
    fn export(&self, prefixes: impl Iterator<Item = IpNet>) {
        let prefixes: Vec<IpNet> = prefixes.collect();
        for r in self.peers.values() {
            let routes = prefixes
                .iter()
                .map(|p| (*p, self.attrs_for(&r.n, p)))
                .collect();
            r.peer.update(routes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(addr: &str) -> Neighbour {
        Neighbour::new(addr.parse().unwrap(), 64512)
    }

    #[test]
    fn a_neighbour_set_is_refused_naming_what_is_wrong() {
        let listen: IpAddr = "10.0.0.1".parse().unwrap();
        assert!(check(listen, &[n("10.0.0.2"), n("10.0.0.3")]).is_ok());
        let cases = [
            (
                vec![n("10.0.0.2"), n("10.0.0.2")],
                "neighbour 10.0.0.2 is listed twice",
            ),
            (
                vec![n("10.0.0.1")],
                "neighbour 10.0.0.1 is this speaker's own address",
            ),
            (
                vec![n("fd00::2")],
                "neighbour fd00::2 is not of the family of the address the speaker listens on (10.0.0.1)",
            ),
        ];
        for (ns, want) in cases {
            let e = check(listen, &ns).unwrap_err();
            assert_eq!(e.to_string(), want);
        }
    }
}
