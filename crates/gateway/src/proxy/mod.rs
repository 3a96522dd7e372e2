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
}

impl Shared {
    pub fn new(access_log: bool) -> Arc<Shared> {
        Arc::new(Shared {
            table: ArcSwap::from_pointee(Table::default()),
            endpoints: ArcSwap::from_pointee(Endpoints::default()),
            tls: ArcSwap::from_pointee(HashMap::new()),
            stats: stats::Stats::default(),
            access_log,
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
