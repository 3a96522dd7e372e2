//! When a responder announces: a newly owned address is announced at once
//! and then again a few times (a gratuitous ARP or an unsolicited Neighbor
//! Advertisement is a single unacknowledged frame, and one lost frame
//! would leave clients on the old node until their caches expire). Pure:
//! the caller passes the time in.
//!
//! The repeats also cover a client that ignored the first announcement:
//! Linux accepts an ARP update for an entry only after the entry's
//! `locktime` (1 s by default) has passed since its last change, unless
//! the update is a gratuitous ARP. Our announcements are gratuitous, and
//! the last repeat comes a full second after the first anyway.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// How often and how far apart a gained address is announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announce {
    /// Frames per gained address, the first at once (at least 1).
    pub count: u32,
    /// The gap between two of them.
    pub interval: Duration,
}

impl Default for Announce {
    /// Three frames over one second: at 0, 0.5 and 1 s.
    fn default() -> Self {
        Announce {
            count: 3,
            interval: Duration::from_millis(500),
        }
    }
}

/// The announcements still to send, per address.
#[derive(Debug, Default)]
pub struct Schedule {
    cfg: Announce,
    /// Address → (frames still to send, when the next is due).
    pending: BTreeMap<IpAddr, (u32, Instant)>,
}

impl Schedule {
    pub fn new(cfg: Announce) -> Schedule {
        Schedule {
            cfg,
            pending: BTreeMap::new(),
        }
    }

    /// `ip` was gained at `now`: announce it from now on (again from the
    /// start when it was still being announced).
    pub fn gained(&mut self, ip: IpAddr, now: Instant) {
        self.pending.insert(ip, (self.cfg.count.max(1), now));
    }

    /// `ip` was lost: no more announcements for it.
    pub fn lost(&mut self, ip: IpAddr) {
        self.pending.remove(&ip);
    }

    /// The addresses to announce at `now`, each once; their next frames
    /// are scheduled one interval on.
    pub fn due(&mut self, now: Instant) -> Vec<IpAddr> {
        let interval = self.cfg.interval;
        let mut due = Vec::new();
        self.pending.retain(|ip, (left, at)| {
            if *at > now {
                return true;
            }
            due.push(*ip);
            *left -= 1;
            *at = now + interval;
            *left > 0
        });
        due
    }

    /// When the next frame is due, if any is.
    pub fn next_at(&self) -> Option<Instant> {
        self.pending.values().map(|(_, at)| *at).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(n: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(198, 51, 100, n))
    }

    #[test]
    fn a_gained_address_is_announced_at_once_then_repeated() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = Schedule::new(Announce::default());
        assert_eq!(s.next_at(), None);
        s.gained(ip(1), t0);
        assert_eq!(s.next_at(), Some(t0));
        assert_eq!(s.due(t0), vec![ip(1)]);
        assert_eq!(s.due(t0 + ms(499)), Vec::<IpAddr>::new());
        assert_eq!(s.next_at(), Some(t0 + ms(500)));
        assert_eq!(s.due(t0 + ms(500)), vec![ip(1)]);
        assert_eq!(s.due(t0 + ms(1000)), vec![ip(1)]);
        assert_eq!(s.next_at(), None, "three frames in all");
        assert_eq!(s.due(t0 + ms(5000)), Vec::<IpAddr>::new());
    }

    #[test]
    fn a_lost_address_is_not_announced_and_a_regained_one_starts_over() {
        let t0 = Instant::now();
        let mut s = Schedule::new(Announce {
            count: 2,
            interval: Duration::from_secs(1),
        });
        s.gained(ip(1), t0);
        s.gained(ip(2), t0);
        assert_eq!(s.due(t0), vec![ip(1), ip(2)]);
        s.lost(ip(1));
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(s.due(t1), vec![ip(2)]);
        s.gained(ip(1), t1);
        assert_eq!(s.due(t1), vec![ip(1)]);
        assert_eq!(s.due(t1 + Duration::from_secs(1)), vec![ip(1)]);
        assert_eq!(s.next_at(), None);
        // A count of 0 still announces once.
        let mut s = Schedule::new(Announce {
            count: 0,
            interval: Duration::from_secs(1),
        });
        s.gained(ip(3), t0);
        assert_eq!(s.due(t0), vec![ip(3)]);
        assert_eq!(s.next_at(), None);
    }
}
