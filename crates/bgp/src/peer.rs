//! One peer over TCP: the edge that carries out what the state machine
//! ([`crate::fsm`]) decides. It connects, frames and decodes messages
//! ([`crate::wire`]), keeps the three timers as deadlines, announces this
//! speaker's routes when the session comes up (then End-of-RIB), and hands
//! every session change and UPDATE to its owner over a channel. A session
//! that goes down is started again after the connect-retry time.
//!
//! It owns no routing decision: what to announce comes in through
//! [`Peer::announce`], what the peer sends goes out as [`PeerEvent`]s.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use ipnet::IpNet;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::fsm::{Action, Config, Event, Negotiated, Session, State, Timer};
use crate::wire::{cease, pack, pack_withdrawals, Afi, Codec, Message, PathAttrs, Update};

/// What this speaker announces to the peer: per family, the attributes and
/// the prefixes carrying them.
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

/// A running peer's handle: what to announce, and a way to stop it.
pub struct Peer {
    announce: watch::Sender<Announce>,
    stop: Option<tokio::sync::oneshot::Sender<u8>>,
    inbound: mpsc::Sender<TcpStream>,
    path_down: mpsc::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Peer {
    /// Starts the session with `remote` (its BGP port); events arrive on
    /// `events`.
    pub fn start(config: Config, remote: SocketAddr, events: mpsc::Sender<PeerEvent>) -> Peer {
        let (announce, routes) = watch::channel(Announce::default());
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
            routes,
            inbox: Vec::new(),
            buf: vec![0; 65536],
            advertised: BTreeMap::new(),
            eor_sent: false,
            accepted,
            down,
        };
        let task = tokio::spawn(link.run(stopped));
        Peer {
            announce,
            stop: Some(stop),
            inbound,
            path_down,
            task,
        }
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

    /// Replaces what is announced; sent when the session is (or comes) up.
    pub fn announce(&self, a: Announce) {
        self.announce.send_replace(a);
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

/// The connection and the timers of one session.
struct Link {
    session: Session,
    config: Config,
    remote: SocketAddr,
    stream: Option<TcpStream>,
    codec: Codec,
    timers: HashMap<Timer, Instant>,
    events: mpsc::Sender<PeerEvent>,
    routes: watch::Receiver<Announce>,
    /// Bytes read and not yet a whole message.
    inbox: Vec<u8>,
    /// What one read fills.
    buf: Vec<u8>,
    /// What the peer holds from us (Adj-RIB-Out): a change sends only
    /// what differs from it.
    advertised: BTreeMap<(Afi, IpNet), PathAttrs>,
    /// Whether this session's End-of-RIB went out.
    eor_sent: bool,
    /// Connections the peer opened, from the speaker's listener.
    accepted: mpsc::Receiver<TcpStream>,
    /// BFD's word that the path is down.
    down: mpsc::Receiver<()>,
}

/// What woke the loop.
enum Wake {
    /// With the Cease subcode to send.
    Stop(u8),
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
                Wake::Accepted(s) => {
                    let waiting = matches!(self.session.state(), State::Active | State::Connect);
                    if waiting && self.stream.is_none() {
                        let _ = s.set_nodelay(true);
                        self.stream = Some(s);
                        self.inbox.clear();
                        self.codec = Codec::default();
                        self.feed(Event::Connected).await;
                    }
                }
                Wake::PathDown => self.feed(Event::PathDown).await,
                Wake::Routes => {
                    if self.session.state() == State::Established {
                        self.send_routes().await;
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
            routes,
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
            s = stop => Wake::Stop(s.unwrap_or(cease::ADMINISTRATIVE_SHUTDOWN)),
            t = sleep => Wake::Timer(t),
            r = read => Wake::Read(r),
            Some(s) = accepted.recv() => Wake::Accepted(s),
            Some(()) = down.recv() => Wake::PathDown,
            // Closed only with the handle, which `stop` answers for.
            Ok(()) = routes.changed() => Wake::Routes,
        }
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
                let dial = TcpStream::connect(self.remote);
                match tokio::time::timeout(self.config.connect_retry, dial).await {
                    Ok(Ok(s)) => {
                        let _ = s.set_nodelay(true);
                        self.stream = Some(s);
                        self.inbox.clear();
                        self.codec = Codec::default();
                        Some(Event::Connected)
                    }
                    _ => Some(Event::ConnectionLost),
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
                self.advertised.clear();
                self.eor_sent = false;
                let _ = self.events.send(PeerEvent::Up(n)).await;
                self.send_routes().await;
                None
            }
            Action::Down(why) => {
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

    /// Brings the peer's view of our routes to what is announced: withdraws
    /// what went, sends what is new or changed (nothing else), and after
    /// the first round of a session End-of-RIB per negotiated family.
    async fn send_routes(&mut self) {
        let a = self.routes.borrow_and_update().clone();
        let families: Vec<Afi> = match self.session.negotiated() {
            Some(n) => n.families.iter().map(|(a, _)| *a).collect(),
            None => return,
        };
        let now: BTreeMap<(Afi, IpNet), &PathAttrs> = a
            .routes
            .iter()
            .filter(|(afi, ..)| families.contains(afi))
            .flat_map(|(afi, attrs, ps)| ps.iter().map(move |p| ((*afi, *p), attrs)))
            .collect();
        let mut updates = Vec::new();
        for afi in &families {
            let gone: Vec<IpNet> = self
                .advertised
                .keys()
                .filter(|(f, p)| f == afi && !now.contains_key(&(*f, *p)))
                .map(|(_, p)| *p)
                .collect();
            updates.extend(pack_withdrawals(&self.codec, *afi, &gone));
        }
        for (afi, attrs, prefixes) in &a.routes {
            let changed: Vec<IpNet> = prefixes
                .iter()
                .filter(|p| {
                    families.contains(afi) && self.advertised.get(&(*afi, **p)) != Some(attrs)
                })
                .copied()
                .collect();
            updates.extend(pack(&self.codec, attrs, *afi, &changed));
        }
        self.advertised = now.into_iter().map(|(k, v)| (k, v.clone())).collect();
        if !std::mem::replace(&mut self.eor_sent, true) {
            updates.extend(families.iter().map(|f| Update::end_of_rib(*f)));
        }
        for u in updates {
            if self.send(&Message::Update(u)).await.is_err() {
                return;
            }
        }
    }
}
