//! The data plane's threads: one single-threaded runtime per CPU, each
//! accepting on its own `SO_REUSEPORT` socket of every port, so the
//! kernel spreads connections and a connection, its requests and its
//! backend connections stay on one thread (no work stealing, no
//! cross-thread wake-ups per request, as nginx's workers do).

use std::sync::Arc;

use tokio::runtime::Handle;

/// The workers' runtimes; they run until the process exits.
#[derive(Clone)]
pub struct Workers {
    handles: Arc<Vec<Handle>>,
}

impl Workers {
    /// `n` workers (0: one per CPU).
    pub fn start(n: usize) -> std::io::Result<Workers> {
        let n = match n {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let mut handles = Vec::with_capacity(n);
        for i in 0..n {
            // Sockets and timers only: no signal or process driver to
            // check on every park.
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .build()?;
            handles.push(rt.handle().clone());
            std::thread::Builder::new()
                .name(format!("gateway-{i}"))
                .spawn(move || rt.block_on(std::future::pending::<()>()))?;
        }
        Ok(Workers {
            handles: Arc::new(handles),
        })
    }

    pub fn handles(&self) -> &[Handle] {
        &self.handles
    }
}
