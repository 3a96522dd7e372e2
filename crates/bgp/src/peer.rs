//! One peer over TCP: the edge that carries out what the state machine
//! ([`crate::fsm`]) decides. It connects, frames and decodes messages
//! ([`crate::wire`]), keeps the three timers as deadlines, holds what the
//! peer is to have from this speaker (its Adj-RIB-Out, [`crate::adj_out`])
//! and sends all of it when the session comes up (then End-of-RIB), and
//! hands every session change and UPDATE to its owner over a channel. A
//! session that goes down is started again after the connect-retry time.
//! With GTSM ([`Config::ttl_security`], [`crate::gtsm`]) its connection,
//! dialled or accepted, sends with TTL 255 and takes nothing less.
//!
//! It owns no routing decision: what to announce comes in through
//! [`Peer::update`] (the prefixes that changed: a change costs what
//! changed, not the table) or [`Peer::announce`] (a whole table), what the
//! peer sends goes out as [`PeerEvent`]s. Changes wait in a batch that
//! keeps the last word per prefix, so a session that cannot keep up (or is
//! down) holds one entry per prefix, never a queue of every change.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ipnet::IpNet;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::adj_out::{share, updates, AdjOut, Batch, Routed};
use crate::fsm::{Action, Config, Event, Negotiated, Session, State, Timer};
use crate::gtsm;
use crate::wire::{cease, Afi, Codec, Message, PathAttrs, Update};

/// A whole table to announce ([`Peer::announce`]): per family, the
/// attributes and the prefixes carrying them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Announce {
    pub routes: Vec<(Afi, PathAttrs, Vec<IpNet>)>,
}

/// What the peer's session tells its owner.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum PeerEvent {
    Up(Negotiated),
    Down(String),
    Update(Update),
}

/// The changes waiting for the session's task, shared with it.
type Pending = Arc<Mutex<Batch>>;

fn lock(p: &Pending) -> MutexGuard<'_, Batch> {
    // A batch is whole after every change: a panic elsewhere leaves it
    // usable.
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running peer's handle: what to announce, and a way to stop it.
pub struct Peer {
    pending: Pending,
    /// Wakes the task when `pending` has something (one wake stands for
    /// any number of changes).
    wake: mpsc::Sender<()>,
    stop: Option<tokio::sync::oneshot::Sender<u8>>,
    inbound: mpsc::Sender<TcpStream>,
    path_down: mpsc::Sender<()>,
    /// The size of the peer's Adj-RIB-Out, kept by the task.
    sent: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Peer {
    /// Starts the session with `remote` (its BGP port); events arrive on
    /// `events`.
    pub fn start(config: Config, remote: SocketAddr, events: mpsc::Sender<PeerEvent>) -> Peer {
        Peer::start_gated(config, remote, events, Arc::new(AtomicBool::new(true)))
    }

    /// [`Peer::start`], sending nothing to the peer (no table, no
    /// End-of-RIB) while `gate` is shut: a session that comes up before the
    /// speaker's owner has named its routes waits for them instead of
    /// telling the peer, with an early End-of-RIB, that there are none.
    /// Opening the gate takes a [`Peer::wake`].
    pub fn start_gated(
        config: Config,
        remote: SocketAddr,
        events: mpsc::Sender<PeerEvent>,
        gate: Arc<AtomicBool>,
    ) -> Peer {
        let pending = Pending::default();
        let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (wake, woken) = mpsc::channel(1);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let (inbound, accepted) = mpsc::channel(1);
        let (path_down, down) = mpsc::channel(1);
        let link = Link {
            session: Session::new(config.clone()),
            config,
            remote,
            stream: None,
            codec: Codec::default(),
            timers: HashMap::new(),
            events,
            pending: pending.clone(),
            woken,
            out: AdjOut::default(),
            sent: sent.clone(),
            inbox: Vec::new(),
            buf: vec![0; 65536],
            accepted,
            down,
            gate,
            table_owed: false,
        };
        let task = tokio::spawn(link.run(stopped));
        Peer {
            pending,
            sent,
            wake,
            stop: Some(stop),
            inbound,
            path_down,
            task,
        }
    }

    /// How many prefixes the peer is to hold from us.
    pub fn sent(&self) -> usize {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Hands over a connection the peer opened to us (the speaker's
    /// listener found it by its address). It is taken while this side has
    /// none; otherwise it is closed, the connection already there winning
    /// (a passive side never has one of its own, so nothing collides).
    pub fn accept(&self, s: TcpStream) {
        let _ = self.inbound.try_send(s);
    }

    /// BFD says the neighbour is unreachable: the session goes down now.
    pub fn path_down(&self) {
        let _ = self.path_down.try_send(());
    }

    /// Changes the routes of these prefixes only (None: withdrawn); the
    /// peer is sent what differs from what it holds, at once if the session
    /// is up, else with everything when it comes up.
    /// Has the task look at its routes again (after the gate opened).
    pub fn wake(&self) {
        let _ = self.wake.try_send(());
    }

    pub fn update(&self, changes: Vec<(IpNet, Option<PathAttrs>)>) {
        if changes.is_empty() {
            return;
        }
        let changes: Vec<Routed> = share(changes).collect();
        lock(&self.pending).changes.extend(changes);
        let _ = self.wake.try_send(());
    }

    /// Replaces the whole table (what is not in `a` is withdrawn). It costs
    /// the table: for a one-off table (a test, a feeder); a running speaker
    /// says what changed with [`Peer::update`].
    pub fn announce(&self, a: Announce) {
        let whole = a
            .routes
            .into_iter()
            .flat_map(|(_, attrs, ps)| {
                let attrs = Arc::new(attrs);
                ps.into_iter().map(move |p| (p, attrs.clone()))
            })
            .collect();
        let mut b = lock(&self.pending);
        b.whole = Some(whole);
        b.changes.clear();
        drop(b);
        let _ = self.wake.try_send(());
    }

    /// Stops the session (a Cease, Administrative Shutdown, goes to the
    /// peer).
    pub fn stop(self) {
        self.stop_with(cease::ADMINISTRATIVE_SHUTDOWN);
    }

    /// Stops the session with a Cease of this subcode ([`cease`]): Peer
    /// De-configured for a neighbour removed, Other Configuration Change
    /// for one about to start again with new terms (RFC 4486).
    pub fn stop_with(mut self, cease_subcode: u8) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(cease_subcode);
        }
    }

    /// Drops the connection with no NOTIFICATION, as a process that exits
    /// does: a peer that honours graceful restart keeps this speaker's
    /// routes until it comes back (RFC 4724).
    pub fn abandon(self) {
        self.task.abort();
    }
}

/// Opens the connection; with GTSM its SYN leaves with TTL 255 and the
/// answer must arrive with 255.
async fn dial(remote: SocketAddr, ttl_security: bool) -> std::io::Result<TcpStream> {
    let s = match remote {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if ttl_security {
        gtsm::secure(&s, remote.is_ipv6())?;
    }
    s.connect(remote).await
}

/// The connection and the timers of one session.
struct Link {
    session: Session,
    config: Config,
    remote: SocketAddr,
    stream: Option<TcpStream>,
    codec: Codec,
    timers: HashMap<Timer, Instant>,
    events: mpsc::Sender<PeerEvent>,
    pending: Pending,
    woken: mpsc::Receiver<()>,
    /// What the peer is to hold from us; while the session is up, what it
    /// holds.
    out: AdjOut,
    /// Bytes read and not yet a whole message.
    inbox: Vec<u8>,
    /// What one read fills.
    buf: Vec<u8>,
    /// Connections the peer opened, from the speaker's listener.
    accepted: mpsc::Receiver<TcpStream>,
    /// How many prefixes the peer is to hold, for the status.
    sent: Arc<std::sync::atomic::AtomicUsize>,
    /// BFD's word that the path is down.
    down: mpsc::Receiver<()>,
    /// Shut: nothing goes to the peer yet ([`Peer::start_gated`]).
    gate: Arc<AtomicBool>,
    /// The session came up while the gate was shut: its table and
    /// End-of-RIB go when it opens.
    table_owed: bool,
}

/// What woke the loop.
enum Wake {
    /// With the Cease subcode to send.
    Stop(u8),
    /// The handle was dropped without a stop: close, no NOTIFICATION.
    Abandoned,
    Timer(Timer),
    Read(std::io::Result<usize>),
    Routes,
    Accepted(TcpStream),
    PathDown,
}

impl Link {
    async fn run(mut self, mut stop: tokio::sync::oneshot::Receiver<u8>) {
        self.feed(Event::Start).await;
        loop {
            let wake = self.next(&mut stop).await;
            match wake {
                Wake::Stop(subcode) => {
                    self.feed(Event::Stop(subcode)).await;
                    return;
                }
                Wake::Abandoned => return,
                Wake::Timer(t) => {
                    self.timers.remove(&t);
                    self.feed(Event::Expired(t)).await;
                }
                Wake::Read(Ok(0)) | Wake::Read(Err(_)) => {
                    self.feed(Event::ConnectionLost).await;
                }
                Wake::Read(Ok(n)) => {
                    let Link { inbox, buf, .. } = &mut self;
                    inbox.extend_from_slice(&buf[..n]);
                    self.take_messages().await;
                }
                Wake::Accepted(s) => self.accepted(s).await,
                Wake::PathDown => self.feed(Event::PathDown).await,
                Wake::Routes => {
                    let changed = self.take_pending();
                    if self.session.state() == State::Established {
                        self.send_changes(&changed).await;
                    }
                }
            }
            if self.session.state() == State::Idle {
                // Down: start again after the connect-retry time.
                tokio::select! {
                    _ = &mut stop => return,
                    _ = tokio::time::sleep(self.config.connect_retry) => {}
                }
                self.feed(Event::Start).await;
            }
        }
    }

    /// Waits for the next thing to happen.
    async fn next(&mut self, stop: &mut tokio::sync::oneshot::Receiver<u8>) -> Wake {
        let Link {
            timers,
            stream,
            woken,
            buf,
            accepted,
            down,
            ..
        } = self;
        let timer = timers
            .iter()
            .min_by_key(|(_, at)| **at)
            .map(|(t, at)| (*t, *at));
        let sleep = async {
            match timer {
                Some((t, at)) => {
                    tokio::time::sleep_until(at).await;
                    t
                }
                None => std::future::pending().await,
            }
        };
        let read = async {
            match stream.as_mut() {
                Some(s) => s.read(buf).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // A handle dropped stops the session as `stop` does.
            s = stop => match s {
                Ok(subcode) => Wake::Stop(subcode),
                // The handle was dropped: gone as a process that exits.
                Err(_) => Wake::Abandoned,
            },
            t = sleep => Wake::Timer(t),
            r = read => Wake::Read(r),
            Some(s) = accepted.recv() => Wake::Accepted(s),
            Some(()) = down.recv() => Wake::PathDown,
            // Closed only with the handle, which `stop` answers for.
            Some(()) = woken.recv() => Wake::Routes,
        }
    }

    /// A connection the peer opened: taken while this side has none, with
    /// this session's TTL check (the listener's may differ).
    async fn accepted(&mut self, s: TcpStream) {
        let waiting = matches!(self.session.state(), State::Active | State::Connect);
        if !waiting || self.stream.is_some() {
            return;
        }
        let v6 = self.remote.is_ipv6();
        let checked = match self.config.ttl_security {
            true => gtsm::secure(&s, v6),
            false => gtsm::min_ttl(&s, v6, false),
        };
        if let Err(e) = checked {
            tracing::warn!(peer = %self.remote, "connection dropped, its TTL check not set: {e}");
            return;
        }
        self.attach(s);
        self.feed(Event::Connected).await;
    }

    /// Makes `s` the session's connection, a fresh codec reading it.
    fn attach(&mut self, s: TcpStream) {
        let _ = s.set_nodelay(true);
        self.stream = Some(s);
        self.inbox.clear();
        self.codec = Codec::default();
    }

    /// Decodes every whole message in the inbox and feeds it in.
    async fn take_messages(&mut self) {
        loop {
            match self.codec.decode(&self.inbox) {
                Ok(Some((m, used))) => {
                    self.inbox.drain(..used);
                    if let Message::Update(u) = &m {
                        let _ = self.events.send(PeerEvent::Update(u.clone())).await;
                    }
                    self.feed(Event::Received(m)).await;
                    if self.stream.is_none() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(peer = %self.remote, "malformed message: {e}");
                    self.inbox.clear();
                    self.feed(Event::Malformed(e.notification())).await;
                    return;
                }
            }
        }
    }

    /// Feeds one event to the state machine and carries out its actions
    /// (a connect's outcome is fed back in).
    async fn feed(&mut self, ev: Event) {
        let mut queue = vec![ev];
        while let Some(ev) = queue.pop() {
            for a in self.session.handle(ev) {
                if let Some(next) = self.act(a).await {
                    queue.push(next);
                }
            }
        }
    }

    async fn act(&mut self, a: Action) -> Option<Event> {
        match a {
            Action::Connect => {
                let dial = dial(self.remote, self.config.ttl_security);
                match tokio::time::timeout(self.config.connect_retry, dial).await {
                    Ok(Ok(s)) => {
                        self.attach(s);
                        Some(Event::Connected)
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(peer = %self.remote, "connecting: {e}");
                        Some(Event::ConnectionLost)
                    }
                    Err(_) => Some(Event::ConnectionLost),
                }
            }
            Action::Send(m) => self.send(&m).await.err().map(|_| Event::ConnectionLost),
            Action::Close => {
                self.stream = None;
                None
            }
            Action::Arm(t, d) => {
                self.timers.insert(t, Instant::now() + d);
                None
            }
            Action::Disarm(t) => {
                self.timers.remove(&t);
                None
            }
            Action::Up(n) => {
                self.codec = Codec {
                    four_octet_as: n.four_octet_as,
                };
                let _ = self.events.send(PeerEvent::Up(n)).await;
                self.take_pending();
                self.table_owed = true;
                self.send_changes(&[]).await;
                None
            }
            Action::Down(why) => {
                self.table_owed = false;
                let _ = self.events.send(PeerEvent::Down(why)).await;
                None
            }
        }
    }

    async fn send(&mut self, m: &Message) -> std::io::Result<()> {
        let mut out = Vec::new();
        self.codec
            .encode(m, &mut out)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        match self.stream.as_mut() {
            Some(s) => s.write_all(&out).await,
            None => Ok(()),
        }
    }

    /// Applies the changes waiting; those that differ from what the peer
    /// is to hold.
    fn take_pending(&mut self) -> Vec<Routed> {
        let b = std::mem::take(&mut *lock(&self.pending));
        match b.is_empty() {
            true => Vec::new(),
            false => {
                let changed = self.out.apply(b);
                self.sent
                    .store(self.out.len(), std::sync::atomic::Ordering::Relaxed);
                changed
            }
        }
    }

    /// The families the session carries (none unless Established).
    fn families(&self) -> Vec<Afi> {
        match self.session.negotiated() {
            Some(n) => n.families.iter().map(|(a, _)| *a).collect(),
            None => Vec::new(),
        }
    }

    /// Sends what changed (the session is up).
    async fn send_routes(&mut self, changed: &[Routed]) {
        let families = self.families();
        for u in updates(&self.codec, &families, changed) {
            if self.send(&Message::Update(u)).await.is_err() {
                return;
            }
        }
    }

    /// What the session is owed once the gate is open: the whole table
    /// (it came up since), else what changed.
    async fn send_changes(&mut self, changed: &[Routed]) {
        if !self.gate.load(Ordering::Relaxed) {
            return;
        }
        match std::mem::take(&mut self.table_owed) {
            true => self.send_table().await,
            false => self.send_routes(changed).await,
        }
    }

    /// Sends everything to a session that came up, then End-of-RIB per
    /// family.
    async fn send_table(&mut self) {
        let all = self.out.all();
        self.send_routes(&all).await;
        for f in self.families() {
            if self
                .send(&Message::Update(Update::end_of_rib(f)))
                .await
                .is_err()
            {
                return;
            }
        }
    }
}
