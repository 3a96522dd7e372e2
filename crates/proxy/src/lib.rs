//! The service proxy: kube-proxy's job, on nftables.
//!
//! - [`rules`]: the pure core, Services and EndpointSlices in, one Service's
//!   fragment of the `ip podnet`/`ip6 podnet` table out; traced in tests;
//! - [`inputs`]: the one store of Services and EndpointSlices both
//!   families plan from, kept as bytes and decoded once per sync;
//! - [`family`]: one address family's table kept equal to the plan
//!   through `podnet_nft::sync`, partial syncs costing what changed;
//! - [`proxier`]: the proxy as a subsystem of the reconcile loop
//!   (`podnet_reconcile`): the store, a table per family, the health-check
//!   node ports;
//! - [`healthcheck`]: the health-check node ports of
//!   `externalTrafficPolicy: Local` Services;
//! - [`node`]: the proxy as a node agent runs it (its kinds, NodePort
//!   addresses, conntrack timeouts, `/healthz`);
//! - [`healthz`]: the proxy's own `/healthz` and `/livez` (kube-proxy's
//!   :10256), for load balancers and kube-proxy's tools;
//! - [`stale`]: the UDP conntrack entries a sync leaves pointing at
//!   endpoints a Service no longer has, and their flush;
//! - [`ct_timeouts`]: kube-proxy's conntrack timeouts (CLOSE_WAIT 1 h,
//!   established 24 h), which Service connections' NAT lives on.
//!
//! The proxy reads cluster state only through the object source it is
//! handed (a `podnet_source::Subscription`), in either mode.

pub mod ct_timeouts;
pub mod family;
pub mod healthcheck;
pub mod healthz;
pub mod inputs;
pub mod node;
pub mod proxier;
pub mod rules;
pub mod stale;

pub use proxier::{cleanup, run, Proxier};
pub use rules::{NodeInfo, Stack, TABLE};

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("kernel: {0}")]
    Kernel(#[from] podnet_kernel::KernelError),
    #[error("{0}")]
    Other(String),
}
