//! podnet's nftables edge: every table podnet owns is planned as a typed
//! model, diffed, applied over nf_tables netlink and traced in tests. No
//! `nft` process is spawned.
//!
//! - [`model`]: a typed model of one table (sets, maps, named counters,
//!   chains, rules), including what a NetworkPolicy data plane needs:
//!   interval sets of prefixes and port ranges (one field or
//!   concatenated), an NFLOG verdict log and rate limits;
//! - [`diff`]: the ordered change list from the applied table to the wanted
//!   one (empty when nothing changed), renderable as `nft -f` text for
//!   humans and golden tests; [`diff::ensure`] for tables several processes
//!   share (the CNI plugins');
//! - [`netlink`]: the change list as one nf_tables batch (one transaction),
//!   and the kernel's table read back into the model (observe, elements
//!   with their comments, counters);
//! - [`sync`]: one table kept by one owner across syncs (drift by use
//!   count, partial and chunked full syncs, element owners, cleanup): the
//!   layer the proxy and the policy reconcile through;
//! - [`trace`]: a packet tracer over the model, for tests without root.
//!
//! The tables: the service proxy's `ip podnet`/`ip6 podnet`, the agent's
//! `ip podnet-masq`, the CNI plugins' `inet podnet-cni`, `bridge podnet-cni`
//! and `inet podnet-portmap`, and the lab gateway's
//! `inet podnet-lab-gateway`.

pub mod diff;
pub mod model;
pub mod netlink;
pub mod sync;
pub mod trace;
