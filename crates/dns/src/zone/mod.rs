//! The cluster zone: what the Kubernetes DNS-Based Service Discovery spec
//! (schema 1.1.0) says must exist, built from Services, EndpointSlices and
//! Namespaces, and the answer to any query for it.
//!
//! Pure: no I/O. Two halves:
//! - [`Builder`] owns the objects and the records each Service contributes.
//!   A change re-derives only the changed Service's records and recompiles
//!   only the names whose records (or existence) changed, so an update costs
//!   work proportional to the change. Memory is watched (10,000 Services
//!   and 50,000 endpoints in under 30 MB): endpoints are kept only for
//!   headless Services (the only ones that publish them), and each record
//!   is stored once, in its name's node.
//! - [`Snapshot`] is immutable and shared by every server thread. For each
//!   (lowercased name, query type) it holds the encoded answer body, with
//!   compression pointers laid out for a response whose question is that
//!   name, so answering is one hash lookup and a copy. Each name's answers
//!   are packed into one allocation with the name. Snapshots share
//!   their 256 shards (`Arc`); publishing clones only the shards a change
//!   touched.
//!
//! One concept per file:
//! - [`objects`]: what DNS keeps of a Service or EndpointSlice (and
//!   endpoint readiness).
//! - [`records`]: the records a Service contributes.
//! - [`build`]: the [`Builder`], its name tree and publishing.
//! - [`compile`]: a name's records encoded into answer bodies.
//! - [`table`]: the packed per-name format and the sharded table.
//! - [`snapshot`]: the [`Snapshot`] and the answer to every query.
//! - [`names`]: owner-name arithmetic on wire names.
//!
//! Names that exist without records (`svc.<zone>`, `<ns>.svc.<zone>`,
//! `_tcp.<svc>...`) answer NODATA; every other name under the zone answers
//! NXDOMAIN at once (search-path misses such as `<x>.<ns>.svc.<zone>.<zone>`
//! never go upstream). Negative answers carry the zone's SOA, whose minimum
//! is the configured TTL (RFC 2308).

mod build;
mod compile;
mod names;
mod objects;
mod records;
mod snapshot;
mod table;
#[cfg(test)]
mod testkit;

pub use build::Builder;
pub use snapshot::{simple_reply, Outcome, Snapshot};
pub use table::hash_name;

use ipnet::IpNet;

/// The spec version `dns-version.<zone>` reports.
pub const SCHEMA_VERSION: &str = "1.1.0";
/// The label EndpointSlices carry naming their Service.
pub use podnet_api::endpoints::SERVICE_NAME_LABEL;

/// What the zone serves.
#[derive(Debug, Clone)]
pub struct ZoneConfig {
    /// The cluster domain, e.g. `cluster.local`.
    pub zone: String,
    /// TTL of every record, and the negative-caching TTL.
    pub ttl: u32,
    /// Answer `a-b-c-d.<ns>.pod.<zone>` (CoreDNS's `pods insecure`).
    pub pods: bool,
    /// Networks whose reverse names we are authoritative for (the service
    /// and cluster CIDRs): a miss there is NXDOMAIN, not a forward.
    pub reverse: Vec<IpNet>,
}

impl Default for ZoneConfig {
    fn default() -> Self {
        ZoneConfig {
            zone: podnet_api::netconfig::DEFAULT_ZONE.into(),
            ttl: 5,
            pods: false,
            reverse: vec![
                podnet_api::netconfig::DEFAULT_SERVICE_CIDR
                    .parse()
                    .expect("default CIDR"),
                podnet_api::netconfig::DEFAULT_NETWORK
                    .parse()
                    .expect("default CIDR"),
            ],
        }
    }
}
