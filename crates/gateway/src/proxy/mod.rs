//! The data plane: listeners that accept HTTP/1.1 and HTTP/2 (plain or
//! TLS), and a handler that routes each request by the current table.
//! The table, endpoints and certificates are swapped atomically; a
//! request in flight keeps the table it started with, so a route change
//! never drops it.
//!
//! Layout: [`listen`] ports and connections, [`handle`] one request,
//! [`forward`] the backend side (pooled clients, retries, upgrades),
//! [`filters`] pure request edits, [`stats`] counters, [`workers`] the
//! data plane's threads.

pub mod filters;
pub mod forward;
pub mod handle;
pub mod listen;
pub mod stats;
pub mod workers;

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::model::{Endpoints, Table};

/// The state every connection reads.
pub struct Shared {
    pub table: ArcSwap<Table>,
    pub endpoints: ArcSwap<Endpoints>,
    /// TLS server configs by port.
    pub tls: ArcSwap<HashMap<crate::model::Bind, Arc<rustls::ServerConfig>>>,
    pub stats: stats::Stats,
    /// Log every request (target `podnet::access`).
    pub access_log: bool,
    /// How long a client may take to send a request's head, counted from
    /// when the connection is ready for one (so also how long an idle
    /// HTTP/1.1 connection is kept): a client that dribbles bytes or sits
    /// idle cannot hold connections for ever.
    pub header_timeout: std::time::Duration,
}

/// nginx's client_header_timeout is 60 s, HAProxy's examples use 10 s.
pub const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl Shared {
    pub fn new(access_log: bool) -> Arc<Shared> {
        Shared::with_header_timeout(access_log, HEADER_TIMEOUT)
    }

    pub fn with_header_timeout(
        access_log: bool,
        header_timeout: std::time::Duration,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            table: ArcSwap::from_pointee(Table::default()),
            endpoints: ArcSwap::from_pointee(Endpoints::default()),
            tls: ArcSwap::from_pointee(HashMap::new()),
            stats: stats::Stats::default(),
            access_log,
            header_timeout,
        })
    }

    /// Serves `table` from now on, with TLS configs rebuilt for the
    /// ports whose certificates changed (parsing keys is the costly part
    /// of a swap).
    pub fn set_table(&self, table: Table) {
        let (old, old_tls) = (self.table.load(), self.tls.load());
        let mut tls = HashMap::new();
        for (port, t) in table.ports.iter().filter(|(_, t)| t.tls) {
            let same = old
                .ports
                .get(port)
                .is_some_and(|o| o.tls && o.certs == t.certs);
            let kept = old_tls.get(port).filter(|_| same).cloned();
            let config = kept.unwrap_or_else(|| {
                crate::tls::server_config(Arc::new(crate::tls::Resolver::new(&t.certs)))
            });
            tls.insert(*port, config);
        }
        self.tls.store(Arc::new(tls));
        self.table.store(Arc::new(table));
    }
}
