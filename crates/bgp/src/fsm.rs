//! One BGP session's finite state machine (RFC 4271 §8), pure: a
//! [`Session`] takes an [`Event`] (a connection came up, a message arrived,
//! a timer fired) and answers with [`Action`]s (connect, send, arm a timer,
//! close) that the caller carries out. No socket, no clock: timers are
//! armed and disarmed by name, and the caller reports when one fires, so
//! every transition is unit-tested without a peer or a wait.
//!
//! What it decides: the OPEN it sends, whether the peer's OPEN is
//! acceptable (the AS configured, a BGP identifier that is not 0 and not
//! ours, a hold time that is 0 or at least 3), what the two negotiated
//! (hold time, keepalive interval, 4-octet AS numbers, address families,
//! route refresh, the peer's graceful restart), and the NOTIFICATION for
//! anything unexpected. Each connection gets its own state machine; which
//! of two simultaneous connections survives (§6.8) is the caller's.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::wire::{fsm_error, open_error, CEASE, FSM_ERROR, HOLD_TIMER_EXPIRED, OPEN_ERROR};
use crate::wire::{Afi, Capability, GracefulRestart, Message, Notification, Open, Safi};

/// RFC 4271 §8.2.2's states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Idle,
    Connect,
    Active,
    OpenSent,
    OpenConfirm,
    Established,
}

/// What this side wants of one peer.
#[derive(Debug, Clone)]
pub struct Config {
    pub local_as: u32,
    pub peer_as: u32,
    pub router_id: Ipv4Addr,
    /// Proposed hold time in seconds (0: no keepalives at all).
    pub hold_time: u16,
    /// How long to wait between connection attempts.
    pub connect_retry: Duration,
    /// Only wait for the peer to connect (a route reflector's clients
    /// connect to it, say).
    pub passive: bool,
    pub families: Vec<(Afi, Safi)>,
    /// Advertise graceful restart with this restart time (seconds);
    /// `restarting` when this speaker came back within it (RFC 4724).
    pub graceful_restart: Option<(u16, bool)>,
    /// GTSM (RFC 5082, [`crate::gtsm`]): the peer is on the link, sends
    /// with TTL 255, and anything that arrives with less is dropped. The
    /// peer must do the same (BIRD's `ttl security`, FRR's
    /// `ttl-security hops 1`).
    pub ttl_security: bool,
}

/// Why an Established session went down when its TCP connection ended
/// with no NOTIFICATION (the peer's process went away): a peer with
/// graceful restart keeps its routes then (RFC 4724 §4.2).
pub const CONNECTION_LOST: &str = "the connection was lost";

/// The timers the caller keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timer {
    ConnectRetry,
    Hold,
    Keepalive,
}

/// What happened.
// A Message is moved once per event, as `wire::Message` itself is.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Event {
    /// Start the session (ManualStart, or its passive form).
    Start,
    /// Stop it (ManualStop): a Cease with this subcode ([`crate::wire::cease`]: an
    /// administrative shutdown, a neighbour de-configured) is sent if a
    /// connection is up.
    Stop(u8),
    /// The TCP connection is up (either way).
    Connected,
    /// The connection failed or was closed by the peer.
    ConnectionLost,
    /// A whole message arrived.
    Received(Message),
    /// A message could not be decoded: this NOTIFICATION says why.
    Malformed(Notification),
    /// BFD says the neighbour is unreachable (RFC 5882): the session goes
    /// down at once, without waiting for the hold timer.
    PathDown,
    Expired(Timer),
}

/// What the caller must do, in order.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Open a TCP connection to the peer.
    Connect,
    Send(Message),
    /// Close the connection (after sending what came before).
    Close,
    Arm(Timer, Duration),
    Disarm(Timer),
    /// The session is up with these terms.
    Up(Negotiated),
    /// The session went down (it was Established); why, for logs.
    Down(String),
}

/// What both sides agreed on, from the two OPENs.
#[derive(Debug, Clone, PartialEq)]
pub struct Negotiated {
    pub peer_as: u32,
    pub peer_id: Ipv4Addr,
    /// Seconds; 0: no hold timer and no keepalives.
    pub hold_time: u16,
    pub keepalive: Duration,
    pub four_octet_as: bool,
    /// Families both sides named (IPv4 unicast when neither named any,
    /// as RFC 4760 says of a speaker without the capability).
    pub families: Vec<(Afi, Safi)>,
    pub route_refresh: bool,
    /// The peer's graceful restart capability, if it sent one.
    pub peer_restart: Option<GracefulRestart>,
}

/// The hold time while waiting for the peer's OPEN (RFC 4271 §8: "a large
/// value", 4 minutes suggested).
const OPEN_HOLD: Duration = Duration::from_secs(240);

/// One connection's session state.
#[derive(Debug, Clone)]
pub struct Session {
    config: Config,
    state: State,
    negotiated: Option<Negotiated>,
}

impl Session {
    pub fn new(config: Config) -> Session {
        Session {
            config,
            state: State::Idle,
            negotiated: None,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// The terms of the session while it is Established.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.negotiated
            .as_ref()
            .filter(|_| self.state == State::Established)
    }

    /// The OPEN this side sends.
    pub fn open(&self) -> Open {
        let c = &self.config;
        let mut caps: Vec<Capability> = c
            .families
            .iter()
            .map(|&(a, s)| Capability::Multiprotocol(a, s))
            .collect();
        caps.push(Capability::RouteRefresh);
        caps.push(Capability::FourOctetAs(c.local_as));
        if let Some((time, restarting)) = c.graceful_restart {
            caps.push(Capability::GracefulRestart(GracefulRestart {
                restarting,
                notification: false,
                time,
                families: c.families.iter().map(|&(a, s)| (a, s, true)).collect(),
            }));
        }
        Open {
            asn: c.local_as,
            hold_time: c.hold_time,
            router_id: c.router_id,
            capabilities: caps,
        }
    }

    /// Takes one event; returns what to do.
    pub fn handle(&mut self, ev: Event) -> Vec<Action> {
        match (self.state, ev) {
            (State::Idle, Event::Start) => self.start(),
            (State::Idle, _) => Vec::new(),
            (_, Event::Start) => Vec::new(),
            (_, Event::Stop(subcode)) => self.stop(subcode),
            (State::Connect | State::Active, ev) => self.connecting(ev),
            (State::OpenSent, ev) => self.open_sent(ev),
            (State::OpenConfirm, ev) => self.open_confirm(ev),
            (State::Established, ev) => self.established(ev),
        }
    }

    fn start(&mut self) -> Vec<Action> {
        let retry = Action::Arm(Timer::ConnectRetry, self.config.connect_retry);
        if self.config.passive {
            self.state = State::Active;
            vec![retry]
        } else {
            self.state = State::Connect;
            vec![retry, Action::Connect]
        }
    }

    /// ManualStop: a Cease to a peer we talk to, then Idle.
    fn stop(&mut self, subcode: u8) -> Vec<Action> {
        let talking = matches!(
            self.state,
            State::OpenSent | State::OpenConfirm | State::Established
        );
        let mut out = Vec::new();
        if talking {
            out.push(Action::Send(Message::Notification(Notification {
                code: CEASE,
                subcode,
                data: Vec::new(),
            })));
        }
        out.extend(self.go_idle("stopped".into()));
        out
    }

    fn connecting(&mut self, ev: Event) -> Vec<Action> {
        match ev {
            Event::Connected => {
                self.state = State::OpenSent;
                vec![
                    Action::Disarm(Timer::ConnectRetry),
                    Action::Send(Message::Open(self.open())),
                    Action::Arm(Timer::Hold, OPEN_HOLD),
                ]
            }
            Event::Expired(Timer::ConnectRetry) => {
                let mut out = vec![Action::Arm(Timer::ConnectRetry, self.config.connect_retry)];
                if !self.config.passive {
                    self.state = State::Connect;
                    out.push(Action::Connect);
                }
                out
            }
            Event::ConnectionLost => {
                self.state = State::Active;
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    fn open_sent(&mut self, ev: Event) -> Vec<Action> {
        match ev {
            Event::Received(Message::Open(o)) => match self.accept(&o) {
                Ok(n) => {
                    let mut out = vec![Action::Send(Message::Keepalive)];
                    out.extend(self.hold_timers(&n));
                    self.negotiated = Some(n);
                    self.state = State::OpenConfirm;
                    out
                }
                Err(note) => self.fail(note, "refused the peer's OPEN"),
            },
            // The peer closed before its OPEN: try again later (§8.2.2).
            Event::ConnectionLost => {
                self.state = State::Active;
                vec![
                    Action::Close,
                    Action::Disarm(Timer::Hold),
                    Action::Arm(Timer::ConnectRetry, self.config.connect_retry),
                ]
            }
            ev => self.common(ev),
        }
    }

    fn open_confirm(&mut self, ev: Event) -> Vec<Action> {
        match ev {
            Event::Received(Message::Keepalive) => {
                self.state = State::Established;
                let n = self.negotiated.clone().expect("negotiated in OpenSent");
                let mut out = self.restart_hold(&n);
                out.push(Action::Up(n));
                out
            }
            Event::Expired(Timer::Keepalive) => self.keepalive(),
            ev => self.common(ev),
        }
    }

    fn established(&mut self, ev: Event) -> Vec<Action> {
        match ev {
            Event::Received(Message::Keepalive)
            | Event::Received(Message::Update(_))
            | Event::Received(Message::RouteRefresh(_)) => {
                let n = self
                    .negotiated
                    .clone()
                    .expect("negotiated when Established");
                self.restart_hold(&n)
            }
            Event::Expired(Timer::Keepalive) => self.keepalive(),
            ev => self.common(ev),
        }
    }

    /// What OpenSent, OpenConfirm and Established do alike: a peer's
    /// NOTIFICATION, a lost connection, an expired hold timer, garbage, an
    /// unexpected message.
    fn common(&mut self, ev: Event) -> Vec<Action> {
        match ev {
            Event::Received(Message::Notification(n)) => {
                let why = format!("the peer sent NOTIFICATION {}", n.describe());
                let mut out = vec![Action::Close];
                out.extend(self.go_idle(why));
                out
            }
            Event::ConnectionLost => {
                let mut out = vec![Action::Close];
                out.extend(self.go_idle(CONNECTION_LOST.into()));
                out
            }
            Event::Expired(Timer::Hold) => {
                let note = Notification {
                    code: HOLD_TIMER_EXPIRED,
                    subcode: 0,
                    data: Vec::new(),
                };
                self.fail(note, "the hold timer expired")
            }
            Event::Malformed(note) => self.fail(note, "the peer sent a malformed message"),
            Event::PathDown => {
                let mut out = vec![Action::Close];
                out.extend(self.go_idle("BFD says the neighbour is unreachable".into()));
                out
            }
            // Anything else here is out of order (§6.6).
            Event::Received(m) => {
                let note = Notification {
                    code: FSM_ERROR,
                    subcode: fsm_subcode(self.state),
                    data: Vec::new(),
                };
                let why = format!("unexpected {} in {:?}", kind(&m), self.state);
                self.fail(note, &why)
            }
            _ => Vec::new(),
        }
    }

    /// Sends `note`, closes, and goes Idle.
    fn fail(&mut self, note: Notification, why: &str) -> Vec<Action> {
        let why = format!("{why}: sent NOTIFICATION {}", note.describe());
        let mut out = vec![Action::Send(Message::Notification(note)), Action::Close];
        out.extend(self.go_idle(why));
        out
    }

    /// Idle, every timer off; `Down` when the session had been up. The
    /// caller restarts the session (after a back-off) with [`Event::Start`].
    fn go_idle(&mut self, why: String) -> Vec<Action> {
        let was_up = self.state == State::Established;
        self.state = State::Idle;
        self.negotiated = None;
        let mut out = vec![
            Action::Disarm(Timer::ConnectRetry),
            Action::Disarm(Timer::Hold),
            Action::Disarm(Timer::Keepalive),
        ];
        if was_up {
            out.push(Action::Down(why));
        }
        out
    }

    fn keepalive(&self) -> Vec<Action> {
        match &self.negotiated {
            Some(n) if n.hold_time > 0 => vec![
                Action::Send(Message::Keepalive),
                Action::Arm(Timer::Keepalive, n.keepalive),
            ],
            _ => Vec::new(),
        }
    }

    /// The hold and keepalive timers at the negotiated values (none when
    /// the hold time is 0).
    fn hold_timers(&self, n: &Negotiated) -> Vec<Action> {
        match n.hold_time {
            0 => vec![
                Action::Disarm(Timer::Hold),
                Action::Disarm(Timer::Keepalive),
            ],
            h => vec![
                Action::Arm(Timer::Hold, Duration::from_secs(h.into())),
                Action::Arm(Timer::Keepalive, n.keepalive),
            ],
        }
    }

    /// Any message from the peer restarts the hold timer (§4.4).
    fn restart_hold(&self, n: &Negotiated) -> Vec<Action> {
        match n.hold_time {
            0 => Vec::new(),
            h => vec![Action::Arm(Timer::Hold, Duration::from_secs(h.into()))],
        }
    }

    /// The terms, or the NOTIFICATION that refuses the peer's OPEN.
    fn accept(&self, o: &Open) -> Result<Negotiated, Notification> {
        let refuse = |subcode| Notification {
            code: OPEN_ERROR,
            subcode,
            data: Vec::new(),
        };
        let c = &self.config;
        let peer_as = o.peer_asn();
        if peer_as != c.peer_as {
            return Err(refuse(open_error::BAD_PEER_AS));
        }
        let internal = peer_as == c.local_as;
        if o.router_id.is_unspecified() || (internal && o.router_id == c.router_id) {
            return Err(refuse(open_error::BAD_BGP_IDENTIFIER));
        }
        if o.hold_time == 1 || o.hold_time == 2 {
            return Err(refuse(open_error::UNACCEPTABLE_HOLD_TIME));
        }
        let hold_time = o.hold_time.min(c.hold_time);
        let theirs: Vec<(Afi, Safi)> = o
            .capabilities
            .iter()
            .filter_map(|cap| match cap {
                Capability::Multiprotocol(a, s) => Some((*a, *s)),
                _ => None,
            })
            .collect();
        let theirs = match theirs.is_empty() {
            true => vec![(Afi::Ipv4, Safi::Unicast)],
            false => theirs,
        };
        Ok(Negotiated {
            peer_as,
            peer_id: o.router_id,
            hold_time,
            keepalive: Duration::from_secs(u64::from(hold_time / 3).max(1)),
            four_octet_as: o
                .capabilities
                .iter()
                .any(|c| matches!(c, Capability::FourOctetAs(_))),
            families: c
                .families
                .iter()
                .copied()
                .filter(|f| theirs.contains(f))
                .collect(),
            route_refresh: o.capabilities.iter().any(|c| {
                matches!(
                    c,
                    Capability::RouteRefresh | Capability::EnhancedRouteRefresh
                )
            }),
            peer_restart: o.capabilities.iter().find_map(|c| match c {
                Capability::GracefulRestart(g) => Some(g.clone()),
                _ => None,
            }),
        })
    }
}

/// RFC 6608's FSM Error subcodes: which state the unexpected message
/// arrived in.
fn fsm_subcode(s: State) -> u8 {
    match s {
        State::OpenSent => fsm_error::UNEXPECTED_IN_OPEN_SENT,
        State::OpenConfirm => fsm_error::UNEXPECTED_IN_OPEN_CONFIRM,
        State::Established => fsm_error::UNEXPECTED_IN_ESTABLISHED,
        _ => fsm_error::UNSPECIFIED,
    }
}

fn kind(m: &Message) -> &'static str {
    match m {
        Message::Open(_) => "OPEN",
        Message::Update(_) => "UPDATE",
        Message::Notification(_) => "NOTIFICATION",
        Message::Keepalive => "KEEPALIVE",
        Message::RouteRefresh(_) => "ROUTE-REFRESH",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{cease, PathAttrs, Update};

    fn config() -> Config {
        Config {
            local_as: 64512,
            peer_as: 64512,
            router_id: Ipv4Addr::new(10, 0, 0, 1),
            hold_time: 90,
            connect_retry: Duration::from_secs(5),
            passive: false,
            families: vec![(Afi::Ipv4, Safi::Unicast), (Afi::Ipv6, Safi::Unicast)],
            graceful_restart: Some((120, false)),
            ttl_security: false,
        }
    }

    /// The peer's OPEN; its 4-octet AS capability says `asn` too.
    fn peer_open(asn: u32, id: [u8; 4], hold: u16, caps: Vec<Capability>) -> Event {
        let caps = caps
            .into_iter()
            .map(|c| match c {
                Capability::FourOctetAs(_) => Capability::FourOctetAs(asn),
                c => c,
            })
            .collect();
        Event::Received(Message::Open(Open {
            asn,
            hold_time: hold,
            router_id: Ipv4Addr::from(id),
            capabilities: caps,
        }))
    }

    fn ipv4_only() -> Vec<Capability> {
        vec![
            Capability::Multiprotocol(Afi::Ipv4, Safi::Unicast),
            Capability::FourOctetAs(64512),
            Capability::RouteRefresh,
        ]
    }

    /// Start, connect, OPENs and KEEPALIVEs: Established with the smaller
    /// hold time, a keepalive a third of it, the families both named.
    fn established(s: &mut Session) -> Negotiated {
        assert_eq!(
            s.handle(Event::Start),
            vec![
                Action::Arm(Timer::ConnectRetry, Duration::from_secs(5)),
                Action::Connect
            ]
        );
        let out = s.handle(Event::Connected);
        assert!(matches!(&out[1], Action::Send(Message::Open(o)) if o.asn == 64512));
        assert_eq!(s.state(), State::OpenSent);
        let out = s.handle(peer_open(64512, [10, 0, 0, 2], 30, ipv4_only()));
        assert_eq!(out[0], Action::Send(Message::Keepalive));
        assert!(out.contains(&Action::Arm(Timer::Hold, Duration::from_secs(30))));
        assert!(out.contains(&Action::Arm(Timer::Keepalive, Duration::from_secs(10))));
        assert_eq!(s.state(), State::OpenConfirm);
        let out = s.handle(Event::Received(Message::Keepalive));
        assert_eq!(s.state(), State::Established);
        match out.last() {
            Some(Action::Up(n)) => n.clone(),
            o => panic!("no Up: {o:?}"),
        }
    }

    #[test]
    fn a_session_comes_up_with_the_terms_both_sides_share() {
        let mut s = Session::new(config());
        let n = established(&mut s);
        assert_eq!(n.hold_time, 30);
        assert_eq!(n.keepalive, Duration::from_secs(10));
        assert_eq!(n.families, vec![(Afi::Ipv4, Safi::Unicast)]);
        assert!(n.four_octet_as && n.route_refresh);
        assert_eq!(n.peer_id, Ipv4Addr::new(10, 0, 0, 2));
        assert_eq!(s.negotiated(), Some(&n));
        // Keepalives go out on their timer; anything received restarts
        // the hold timer.
        assert_eq!(
            s.handle(Event::Expired(Timer::Keepalive)),
            vec![
                Action::Send(Message::Keepalive),
                Action::Arm(Timer::Keepalive, Duration::from_secs(10))
            ]
        );
        let update = Update {
            withdrawn: vec![],
            attrs: PathAttrs::default(),
            nlri: vec![],
        };
        assert_eq!(
            s.handle(Event::Received(Message::Update(update))),
            vec![Action::Arm(Timer::Hold, Duration::from_secs(30))]
        );
    }

    #[test]
    fn our_open_carries_our_families_as4_route_refresh_and_graceful_restart() {
        let o = Session::new(config()).open();
        assert_eq!(o.hold_time, 90);
        assert!(o.capabilities.contains(&Capability::FourOctetAs(64512)));
        assert!(o.capabilities.contains(&Capability::RouteRefresh));
        assert!(o
            .capabilities
            .contains(&Capability::Multiprotocol(Afi::Ipv6, Safi::Unicast)));
        assert!(o.capabilities.iter().any(
            |c| matches!(c, Capability::GracefulRestart(g) if g.time == 120 && !g.restarting)
        ));
    }

    /// Each refused OPEN is answered with the NOTIFICATION RFC 4271 names,
    /// the connection closed and the session Idle.
    #[test]
    fn a_bad_open_is_refused_with_the_right_notification() {
        let cases = [
            (peer_open(64999, [10, 0, 0, 2], 90, ipv4_only()), (2, 2)),
            (peer_open(64512, [0, 0, 0, 0], 90, ipv4_only()), (2, 3)),
            (peer_open(64512, [10, 0, 0, 1], 90, ipv4_only()), (2, 3)),
            (peer_open(64512, [10, 0, 0, 2], 2, ipv4_only()), (2, 6)),
        ];
        for (open, (code, subcode)) in cases {
            let mut s = Session::new(config());
            s.handle(Event::Start);
            s.handle(Event::Connected);
            let out = s.handle(open);
            match &out[0] {
                Action::Send(Message::Notification(n)) => {
                    assert_eq!((n.code, n.subcode), (code, subcode), "{out:?}")
                }
                o => panic!("no NOTIFICATION: {o:?}"),
            }
            assert_eq!(out[1], Action::Close);
            assert_eq!(s.state(), State::Idle);
            assert!(
                !out.iter().any(|a| matches!(a, Action::Down(_))),
                "never up"
            );
        }
    }

    #[test]
    fn a_hold_time_of_zero_means_no_timers() {
        let mut s = Session::new(config());
        s.handle(Event::Start);
        s.handle(Event::Connected);
        let out = s.handle(peer_open(64512, [10, 0, 0, 2], 0, ipv4_only()));
        assert!(out.contains(&Action::Disarm(Timer::Hold)));
        assert!(!out.iter().any(|a| matches!(a, Action::Arm(..))));
        s.handle(Event::Received(Message::Keepalive));
        assert_eq!(s.state(), State::Established);
        assert!(s.handle(Event::Expired(Timer::Keepalive)).is_empty());
    }

    /// What takes an Established session down: the hold timer, the peer's
    /// NOTIFICATION, a lost connection, garbage, an OPEN out of order, and
    /// our own stop; each says so once with `Down`.
    #[test]
    fn an_established_session_goes_down_for_each_reason_with_its_notification() {
        let garbage = Notification {
            code: 1,
            subcode: 2,
            data: vec![0, 9],
        };
        let cases: Vec<(Event, Option<(u8, u8)>)> = vec![
            (Event::Expired(Timer::Hold), Some((4, 0))),
            (
                Event::Received(Message::Notification(Notification::cease(2))),
                None,
            ),
            (Event::ConnectionLost, None),
            (Event::Malformed(garbage), Some((1, 2))),
            (
                peer_open(64512, [10, 0, 0, 2], 90, ipv4_only()),
                Some((5, 3)),
            ),
            (Event::Stop(cease::ADMINISTRATIVE_SHUTDOWN), Some((6, 2))),
            (Event::Stop(cease::PEER_DECONFIGURED), Some((6, 3))),
        ];
        for (ev, sent) in cases {
            let mut s = Session::new(config());
            established(&mut s);
            let out = s.handle(ev.clone());
            let note = out.iter().find_map(|a| match a {
                Action::Send(Message::Notification(n)) => Some((n.code, n.subcode)),
                _ => None,
            });
            assert_eq!(note, sent, "{ev:?}: {out:?}");
            assert_eq!(
                out.iter().filter(|a| matches!(a, Action::Down(_))).count(),
                1,
                "{ev:?}: {out:?}"
            );
            assert_eq!(s.state(), State::Idle);
            assert!(s.negotiated().is_none());
        }
    }

    #[test]
    fn a_passive_session_waits_and_a_failed_connection_is_retried() {
        let mut s = Session::new(Config {
            passive: true,
            ..config()
        });
        assert_eq!(
            s.handle(Event::Start),
            vec![Action::Arm(Timer::ConnectRetry, Duration::from_secs(5))]
        );
        assert_eq!(s.state(), State::Active);
        assert!(!s
            .handle(Event::Expired(Timer::ConnectRetry))
            .contains(&Action::Connect));
        let mut s = Session::new(config());
        s.handle(Event::Start);
        s.handle(Event::ConnectionLost);
        assert_eq!(s.state(), State::Active);
        let out = s.handle(Event::Expired(Timer::ConnectRetry));
        assert!(out.contains(&Action::Connect));
        assert_eq!(s.state(), State::Connect);
    }
}
