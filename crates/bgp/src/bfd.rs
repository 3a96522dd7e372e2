//! BFD (RFC 5880, single hop per RFC 5881), asynchronous mode, pure: the
//! control packet as bytes and back, and one session's state machine. A
//! BGP session whose BFD session goes down is dropped at once, so a dead
//! peer is noticed in a few hundred milliseconds rather than after the
//! hold time (90 s by BIRD's default).
//!
//! The state machine takes received packets and the detection timer's
//! expiry, and says what to send and when the session goes Up or Down;
//! the caller keeps the clock and the UDP socket (port 3784, TTL 255 both
//! ways: a packet that arrives with a lower TTL came from further than
//! one hop and is dropped, RFC 5881 §5). No authentication: the A bit is
//! refused.

use std::time::Duration;

/// The single-hop control port (RFC 5881 §4).
pub const PORT: u16 = 3784;
/// A packet without authentication.
pub const LEN: usize = 24;

/// RFC 5880 §4.1's session states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    AdminDown = 0,
    Down = 1,
    Init = 2,
    Up = 3,
}

/// Why a session went down (the Diag field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Diag {
    None = 0,
    DetectionTimeExpired = 1,
    NeighborSignaledDown = 3,
    AdministrativelyDown = 7,
}

/// One control packet (no authentication section).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    pub diag: u8,
    pub state: State,
    pub poll: bool,
    pub fin: bool,
    pub detect_mult: u8,
    pub my_disc: u32,
    pub your_disc: u32,
    /// Microseconds.
    pub desired_min_tx: u32,
    pub required_min_rx: u32,
    pub required_min_echo_rx: u32,
}

/// Why a received packet was discarded (RFC 5880 §6.8.6).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Discard {
    #[error("{0} bytes: shorter than a control packet")]
    Short(usize),
    #[error("version {0}, not 1")]
    Version(u8),
    #[error("length field {0} is not 24 (no authentication) or is more than the packet")]
    Length(u8),
    #[error("detect multiplier 0")]
    DetectMult,
    #[error("the multipoint bit is set")]
    Multipoint,
    #[error("my discriminator 0")]
    NoDiscriminator,
    #[error("authentication present, none configured")]
    Auth,
    #[error("your discriminator 0 in state {0:?}")]
    NoYourDiscriminator(State),
}

impl Packet {
    pub fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[0] = (1 << 5) | (self.diag & 0x1f);
        b[1] = ((self.state as u8) << 6) | (u8::from(self.poll) << 5) | (u8::from(self.fin) << 4);
        b[2] = self.detect_mult;
        b[3] = LEN as u8;
        for (at, v) in [
            (4, self.my_disc),
            (8, self.your_disc),
            (12, self.desired_min_tx),
            (16, self.required_min_rx),
            (20, self.required_min_echo_rx),
        ] {
            b[at..at + 4].copy_from_slice(&v.to_be_bytes());
        }
        b
    }

    /// The packet, or why it is discarded.
    pub fn decode(b: &[u8]) -> Result<Packet, Discard> {
        if b.len() < LEN {
            return Err(Discard::Short(b.len()));
        }
        let version = b[0] >> 5;
        if version != 1 {
            return Err(Discard::Version(version));
        }
        if b[1] & 0x04 != 0 {
            return Err(Discard::Auth);
        }
        if usize::from(b[3]) != LEN || usize::from(b[3]) > b.len() {
            return Err(Discard::Length(b[3]));
        }
        let word = |at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let p = Packet {
            diag: b[0] & 0x1f,
            state: match b[1] >> 6 {
                0 => State::AdminDown,
                1 => State::Down,
                2 => State::Init,
                _ => State::Up,
            },
            poll: b[1] & 0x20 != 0,
            fin: b[1] & 0x10 != 0,
            detect_mult: b[2],
            my_disc: word(4),
            your_disc: word(8),
            desired_min_tx: word(12),
            required_min_rx: word(16),
            required_min_echo_rx: word(20),
        };
        if p.detect_mult == 0 {
            return Err(Discard::DetectMult);
        }
        if b[1] & 0x01 != 0 {
            return Err(Discard::Multipoint);
        }
        if p.my_disc == 0 {
            return Err(Discard::NoDiscriminator);
        }
        if p.your_disc == 0 && !matches!(p.state, State::Down | State::AdminDown) {
            return Err(Discard::NoYourDiscriminator(p.state));
        }
        Ok(p)
    }
}

/// This side's timing.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub desired_min_tx: Duration,
    pub required_min_rx: Duration,
    pub detect_mult: u8,
}

impl Default for Timing {
    /// 300 ms × 3: a dead peer is noticed within a second.
    fn default() -> Self {
        Timing {
            desired_min_tx: Duration::from_millis(300),
            required_min_rx: Duration::from_millis(300),
            detect_mult: 3,
        }
    }
}

/// While a session is not Up, packets go at most once a second
/// (RFC 5880 §6.8.3).
const SLOW: Duration = Duration::from_secs(1);

/// What changed for the caller after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    Up,
    Down(Diag),
}

/// One BFD session with one neighbour.
#[derive(Debug, Clone)]
pub struct Session {
    timing: Timing,
    state: State,
    diag: Diag,
    my_disc: u32,
    your_disc: u32,
    /// The neighbour's last timing (microseconds) and multiplier.
    remote_min_rx: u32,
    remote_min_tx: u32,
    remote_mult: u8,
    /// The neighbour asked for a Final (a Poll came in).
    owe_final: bool,
}

impl Session {
    /// A session in Down, with a discriminator unique on this node.
    pub fn new(timing: Timing, my_disc: u32) -> Session {
        Session {
            timing,
            state: State::Down,
            diag: Diag::None,
            my_disc,
            your_disc: 0,
            remote_min_rx: 1,
            remote_min_tx: 0,
            remote_mult: 0,
            owe_final: false,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// The next packet to send (the caller sends it every
    /// [`Session::tx_interval`], jittered down by up to 25 %, and at once
    /// after an event that changed the state or owes a Final).
    pub fn packet(&mut self) -> Packet {
        let slow = (self.state != State::Up).then_some(SLOW);
        let tx = slow
            .unwrap_or(self.timing.desired_min_tx)
            .max(self.timing.desired_min_tx);
        let fin = std::mem::take(&mut self.owe_final);
        Packet {
            diag: self.diag as u8,
            state: self.state,
            poll: false,
            fin,
            detect_mult: self.timing.detect_mult,
            my_disc: self.my_disc,
            your_disc: self.your_disc,
            desired_min_tx: micros(tx),
            required_min_rx: micros(self.timing.required_min_rx),
            required_min_echo_rx: 0,
        }
    }

    /// How often to send: this side's rate, never faster than the
    /// neighbour will receive.
    pub fn tx_interval(&self) -> Duration {
        let ours = match self.state {
            State::Up => self.timing.desired_min_tx,
            _ => SLOW.max(self.timing.desired_min_tx),
        };
        ours.max(Duration::from_micros(self.remote_min_rx.into()))
    }

    /// How long without a packet before the neighbour is declared down;
    /// None until one has been heard from.
    pub fn detection_time(&self) -> Option<Duration> {
        if self.remote_mult == 0 {
            return None;
        }
        let rx = Duration::from_micros(self.remote_min_tx.into()).max(self.timing.required_min_rx);
        Some(rx * u32::from(self.remote_mult))
    }

    /// Takes a received packet (already decoded and from the right
    /// neighbour); says whether the session went Up or Down.
    pub fn receive(&mut self, p: &Packet) -> Option<Edge> {
        if p.your_disc != 0 && p.your_disc != self.my_disc {
            return None;
        }
        self.your_disc = p.my_disc;
        self.remote_min_rx = p.required_min_rx;
        self.remote_min_tx = p.desired_min_tx;
        self.remote_mult = p.detect_mult;
        self.owe_final |= p.poll;
        if self.state == State::AdminDown {
            return None;
        }
        let next = match (self.state, p.state) {
            (_, State::AdminDown) if self.state != State::Down => {
                return self.down(Diag::NeighborSignaledDown)
            }
            (State::Down, State::Down) => State::Init,
            (State::Down, State::Init) | (State::Init, State::Init | State::Up) => State::Up,
            (State::Up, State::Down) => return self.down(Diag::NeighborSignaledDown),
            (s, _) => s,
        };
        let changed = next != self.state;
        self.state = next;
        (changed && next == State::Up).then(|| {
            self.diag = Diag::None;
            Edge::Up
        })
    }

    /// The detection time passed without a packet.
    pub fn expired(&mut self) -> Option<Edge> {
        match self.state {
            State::Init | State::Up => self.down(Diag::DetectionTimeExpired),
            _ => None,
        }
    }

    fn down(&mut self, diag: Diag) -> Option<Edge> {
        let was_up = self.state == State::Up;
        self.state = State::Down;
        self.diag = diag;
        self.your_disc = 0;
        self.remote_mult = 0;
        was_up.then_some(Edge::Down(diag))
    }
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sessions exchanging packets come Up through Init, each saying
    /// so once.
    fn up_pair() -> (Session, Session) {
        let mut a = Session::new(Timing::default(), 1);
        let mut b = Session::new(Timing::default(), 2);
        let mut edges = Vec::new();
        for _ in 0..3 {
            let pa = a.packet();
            edges.extend(b.receive(&pa));
            let pb = b.packet();
            edges.extend(a.receive(&pb));
        }
        assert_eq!((a.state(), b.state()), (State::Up, State::Up));
        assert_eq!(edges, vec![Edge::Up, Edge::Up]);
        (a, b)
    }

    #[test]
    fn a_packet_round_trips_and_has_rfc_5880s_layout() {
        let mut s = Session::new(Timing::default(), 0x0102_0304);
        let p = s.packet();
        let b = p.encode();
        assert_eq!(b[0], 0x20, "version 1, no diagnostic");
        assert_eq!(b[1] >> 6, State::Down as u8);
        assert_eq!((b[2], b[3]), (3, 24));
        assert_eq!(&b[4..8], &[1, 2, 3, 4]);
        // Not Up: at most one packet a second is asked for.
        assert_eq!(u32::from_be_bytes([b[12], b[13], b[14], b[15]]), 1_000_000);
        assert_eq!(Packet::decode(&b), Ok(p));
    }

    #[test]
    fn malformed_packets_are_discarded_with_their_reason() {
        let good = Session::new(Timing::default(), 7).packet().encode();
        let with = |f: &dyn Fn(&mut [u8; 24])| {
            let mut b = good;
            f(&mut b);
            Packet::decode(&b)
        };
        assert_eq!(Packet::decode(&good[..20]), Err(Discard::Short(20)));
        assert_eq!(with(&|b| b[0] = 0x40), Err(Discard::Version(2)));
        assert_eq!(with(&|b| b[3] = 30), Err(Discard::Length(30)));
        assert_eq!(with(&|b| b[2] = 0), Err(Discard::DetectMult));
        assert_eq!(with(&|b| b[1] |= 0x01), Err(Discard::Multipoint));
        assert_eq!(with(&|b| b[1] |= 0x04), Err(Discard::Auth));
        assert_eq!(with(&|b| b[4..8].fill(0)), Err(Discard::NoDiscriminator));
        assert_eq!(
            with(&|b| b[1] = (State::Up as u8) << 6),
            Err(Discard::NoYourDiscriminator(State::Up))
        );
    }

    #[test]
    fn timers_follow_both_sides_and_the_detection_time_is_the_remote_multiple() {
        let (mut a, _) = up_pair();
        assert_eq!(a.tx_interval(), Duration::from_millis(300));
        assert_eq!(a.detection_time(), Some(Duration::from_millis(900)));
        // The neighbour receives no faster than 500 ms and sends every 2 s.
        let mut p = Session::new(Timing::default(), 2).packet();
        p.state = State::Up;
        p.your_disc = 1;
        p.required_min_rx = 500_000;
        p.desired_min_tx = 2_000_000;
        p.detect_mult = 5;
        a.receive(&p);
        assert_eq!(a.tx_interval(), Duration::from_millis(500));
        assert_eq!(a.detection_time(), Some(Duration::from_secs(10)));
    }

    #[test]
    fn silence_or_the_neighbour_saying_down_takes_the_session_down_once() {
        let (mut a, mut b) = up_pair();
        assert_eq!(a.expired(), Some(Edge::Down(Diag::DetectionTimeExpired)));
        assert_eq!(a.expired(), None, "already down");
        let pa = a.packet();
        assert_eq!(pa.diag, Diag::DetectionTimeExpired as u8);
        assert_eq!(b.receive(&pa), Some(Edge::Down(Diag::NeighborSignaledDown)));
        // And both come back.
        for _ in 0..3 {
            let pa = a.packet();
            b.receive(&pa);
            let pb = b.packet();
            a.receive(&pb);
        }
        assert_eq!((a.state(), b.state()), (State::Up, State::Up));
    }

    #[test]
    fn a_poll_is_answered_with_a_final_and_a_stranger_is_ignored() {
        let (mut a, _) = up_pair();
        let mut p = Session::new(Timing::default(), 2).packet();
        p.state = State::Up;
        p.your_disc = 1;
        p.poll = true;
        a.receive(&p);
        assert!(a.packet().fin);
        assert!(!a.packet().fin, "one Final per Poll");
        p.your_disc = 99;
        p.state = State::Down;
        assert_eq!(a.receive(&p), None);
        assert_eq!(a.state(), State::Up, "a packet for another session");
    }
}
