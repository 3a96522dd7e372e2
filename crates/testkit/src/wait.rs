//! Waiting for a state: the one place a test polls. Tests wait for what
//! they need (a port answers, a route is there, a log line appeared), never
//! for a fixed time, and a wait that runs out fails with what was awaited.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

/// The first pause between two polls; it doubles up to [`LONGEST_PAUSE`],
/// so a quick state is seen at once and a slow one is not polled hard (a
/// poll may run a process, and the machine is shared).
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const LONGEST_PAUSE: Duration = Duration::from_millis(100);

/// What one poll found: the awaited value, or not yet (with why, when the
/// poll can tell).
pub trait Outcome {
    type Value;
    fn settle(self) -> Result<Self::Value, Option<String>>;
}

impl Outcome for bool {
    type Value = ();
    fn settle(self) -> Result<(), Option<String>> {
        if self {
            Ok(())
        } else {
            Err(None)
        }
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn settle(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: Display> Outcome for Result<T, E> {
    type Value = T;
    fn settle(self) -> Result<T, Option<String>> {
        self.map_err(|e| Some(e.to_string()))
    }
}

fn timed_out(what: &str, deadline: Duration, last: Option<String>) -> ! {
    match last {
        Some(e) => panic!("timed out waiting for {what} (deadline {deadline:?}); last: {e}"),
        None => panic!("timed out waiting for {what} (deadline {deadline:?})"),
    }
}

/// Polls `f` until it holds (`true`, `Some`, `Ok`) and returns what it
/// yielded; fails the test when `deadline` passes first, naming `what` and
/// the last error. The deadline bounds the wait; it is never the thing a
/// test asserts.
pub fn eventually<R: Outcome>(what: &str, deadline: Duration, f: impl FnMut() -> R) -> R::Value {
    try_eventually(deadline, f).unwrap_or_else(|last| timed_out(what, deadline, last))
}

/// [`eventually`] for code that must not panic (cleanup in a drop guard,
/// the benchmarks): the last error, if the poll gave one, when `deadline`
/// passes first.
pub fn try_eventually<R: Outcome>(
    deadline: Duration,
    mut f: impl FnMut() -> R,
) -> Result<R::Value, Option<String>> {
    let end = Instant::now() + deadline;
    let mut pause = FIRST_PAUSE;
    loop {
        let last = match f().settle() {
            Ok(v) => return Ok(v),
            Err(last) => last,
        };
        if Instant::now() >= end {
            return Err(last);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

/// [`eventually`] for async tests: the poll is a future, and the pause
/// yields to the runtime instead of blocking its thread.
pub async fn eventually_async<R, F>(
    what: &str,
    deadline: Duration,
    mut f: impl FnMut() -> F,
) -> R::Value
where
    R: Outcome,
    F: Future<Output = R>,
{
    let end = Instant::now() + deadline;
    let mut pause = FIRST_PAUSE;
    loop {
        let last = match f().await.settle() {
            Ok(v) => return v,
            Err(last) => last,
        };
        if Instant::now() >= end {
            timed_out(what, deadline, last);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_what_the_poll_yields_once_it_holds() {
        let mut n = 0;
        let got = eventually("the third poll", Duration::from_secs(5), || {
            n += 1;
            (n == 3).then_some(n * 10)
        });
        assert_eq!((got, n), (30, 3));
        let mut tries = 0;
        let ok: u8 = eventually("an Ok", Duration::from_secs(5), || {
            tries += 1;
            if tries < 2 {
                Err("not yet")
            } else {
                Ok(7)
            }
        });
        assert_eq!(ok, 7);
    }

    #[test]
    #[should_panic(
        expected = "timed out waiting for a state that never comes (deadline 30ms); last: still no"
    )]
    fn fails_with_the_last_error_when_the_deadline_passes() {
        eventually(
            "a state that never comes",
            Duration::from_millis(30),
            || Err::<(), _>("still no"),
        );
    }

    #[tokio::test]
    async fn the_async_twin_polls_futures() {
        let mut n = 0;
        let got = eventually_async("the second poll", Duration::from_secs(5), || {
            n += 1;
            let now = n;
            async move { (now == 2).then_some(now) }
        })
        .await;
        assert_eq!(got, 2);
    }
}
