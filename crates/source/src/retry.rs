//! How a daemon retries the Kubernetes API after a failure: one policy for
//! every watcher of the object source and every write the agent repeats.
//!
//! client-go's reflector backoff (800 ms doubling to 30 s, which
//! kube-runtime's `default_backoff` copies) is kind to a struggling API
//! server but slow to notice one that is back: while a restarted
//! apiserver was down the watchers' delays grew to 30 s, and its first
//! answers (403 while its RBAC cache warms, 5xx, 429) grew them further,
//! so agents took 51 s and 68 s to follow it again. Here:
//!
//! - a failure without an answer (refused, reset, timed out: the server is
//!   down or restarting) is retried after 50 ms doubling to [`QUICK_CAP`],
//!   however long it lasts: a refused connection costs nothing;
//! - an answered failure (401, 403, 429, 5xx, ...) is retried as quickly
//!   during its first [`GRACE`]: a starting apiserver gives those for a few
//!   seconds. Only a refusal that outlasts the grace is treated as what it
//!   then is (a missing RBAC rule, an overloaded server): 1 s doubling to
//!   [`SLOW_CAP`].
//!
//! Every delay is jittered (between half and all of it), so the daemons of
//! a cluster do not come back in step.

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

/// The longest delay while the server is down or starting.
pub const QUICK_CAP: Duration = Duration::from_secs(1);
/// How long answered failures are taken for a starting server's.
pub const GRACE: Duration = Duration::from_secs(30);
/// The longest delay for a lasting refusal.
pub const SLOW_CAP: Duration = Duration::from_secs(30);
const QUICK_FIRST: Duration = Duration::from_millis(50);
const SLOW_FIRST: Duration = Duration::from_secs(1);

/// What a failed request got back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No HTTP answer: the connection failed or broke.
    Unanswered,
    /// The server answered with this status code.
    Answered(u16),
}

impl Failure {
    /// Classifies a client error.
    pub fn of(e: &kube::Error) -> Failure {
        match e {
            kube::Error::Api(s) => Failure::Answered(s.code),
            _ => Failure::Unanswered,
        }
    }
}

/// The retry state of one request loop; see the module docs.
#[derive(Debug, Default)]
pub struct Retry {
    /// Consecutive failures.
    failures: u32,
    /// Since when the server has answered with failures only.
    answered_since: Option<Instant>,
}

impl Retry {
    /// A request succeeded: the next failure starts over.
    pub fn reset(&mut self) {
        *self = Retry::default();
    }

    /// The delay before the next attempt after `f` at `now`.
    pub fn delay(&mut self, f: Failure, now: Instant) -> Duration {
        let d = self.plain_delay(f, now);
        jitter(d, random_unit())
    }

    /// [`Retry::delay`] before jitter.
    fn plain_delay(&mut self, f: Failure, now: Instant) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let since = match f {
            Failure::Unanswered => {
                self.answered_since = None;
                None
            }
            Failure::Answered(_) => Some(*self.answered_since.get_or_insert(now)),
        };
        match since {
            Some(t) if now.duration_since(t) >= GRACE => {
                // Doubling from SLOW_FIRST, counted from the grace's end.
                let past = now.duration_since(t) - GRACE;
                let steps = (past.as_secs() / 2).min(8) as u32;
                (SLOW_FIRST * 2u32.pow(steps)).min(SLOW_CAP)
            }
            _ => (QUICK_FIRST * 2u32.pow((self.failures - 1).min(10))).min(QUICK_CAP),
        }
    }
}

/// Between half of `d` and all of it, by `unit` in [0, 1).
fn jitter(d: Duration, unit: f64) -> Duration {
    d.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
}

/// A number in [0, 1) that differs between calls and processes.
fn random_unit() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_is_down_is_retried_within_a_second_however_long_it_lasts() {
        let mut r = Retry::default();
        let t0 = Instant::now();
        let delays: Vec<Duration> = (0..100)
            .map(|i| r.plain_delay(Failure::Unanswered, t0 + Duration::from_secs(i)))
            .collect();
        assert_eq!(delays[0], Duration::from_millis(50));
        assert_eq!(delays[1], Duration::from_millis(100));
        assert!(delays.iter().all(|d| *d <= QUICK_CAP), "{delays:?}");
        assert_eq!(delays[99], QUICK_CAP);
    }

    #[test]
    fn a_starting_servers_403_and_5xx_are_retried_quickly_after_a_long_outage() {
        let mut r = Retry::default();
        let t0 = Instant::now();
        // Down for two minutes...
        for i in 0..120 {
            r.plain_delay(Failure::Unanswered, t0 + Duration::from_secs(i));
        }
        // ...then back, refusing while its caches warm.
        let back = t0 + Duration::from_secs(120);
        for (i, code) in [403, 403, 500, 429, 401, 403].into_iter().enumerate() {
            let now = back + Duration::from_millis(300 * i as u64);
            assert!(r.plain_delay(Failure::Answered(code), now) <= QUICK_CAP);
        }
    }

    #[test]
    fn a_lasting_denial_backs_off_to_thirty_seconds() {
        let mut r = Retry::default();
        let t0 = Instant::now();
        let f = Failure::Answered(403);
        assert!(r.plain_delay(f, t0) <= QUICK_CAP);
        let late = t0 + GRACE + Duration::from_secs(1);
        let d = r.plain_delay(f, late);
        assert!(d >= SLOW_FIRST, "{d:?}");
        assert_eq!(r.plain_delay(f, t0 + Duration::from_secs(600)), SLOW_CAP);
        // A success starts over.
        r.reset();
        assert_eq!(r.plain_delay(f, t0 + Duration::from_secs(601)), QUICK_FIRST);
    }

    #[test]
    fn jitter_stays_between_half_and_all() {
        let d = Duration::from_secs(1);
        assert_eq!(jitter(d, 0.0), Duration::from_millis(500));
        assert!(jitter(d, 0.999) <= d);
        for _ in 0..100 {
            let u = random_unit();
            assert!((0.0..1.0).contains(&u), "{u}");
        }
    }
}
