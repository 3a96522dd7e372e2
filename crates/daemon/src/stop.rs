//! Stopping a blocking reader thread (an NFLOG group, conntrack events)
//! with the async task that started it. Tasks stop by being dropped (a
//! dropped future, an aborted or dropped `JoinSet`); a thread cannot be
//! dropped, so it polls a flag that the task's [`StopOnDrop`] raises when
//! the task goes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Raises its flag when dropped.
#[derive(Debug, Default)]
pub struct StopOnDrop(Arc<AtomicBool>);

impl StopOnDrop {
    pub fn new() -> StopOnDrop {
        StopOnDrop::default()
    }

    /// The flag for the thread to poll.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_rises_when_the_owner_goes() {
        let s = StopOnDrop::new();
        let f = s.flag();
        assert!(!f.load(Ordering::Relaxed));
        drop(s);
        assert!(f.load(Ordering::Relaxed));
    }
}
