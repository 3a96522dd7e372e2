//! The service proxy's pure core: Services and EndpointSlices in, the
//! nftables table `ip podnet` out (as a [`podnet_nft::model::Table`]).
//!
//! Dispatch is data, as in kube-proxy's nftables mode: one verdict map keyed
//! by `address . protocol . port` for ClusterIPs, externalIPs and
//! LoadBalancer IPs, one keyed by `protocol . port` for NodePorts, each
//! element a `goto` into the Service port's chain; a packet costs one hash
//! lookup whatever the number of Services. Endpoint choice is a short run of
//! `numgen random mod k == 0` rules (no per-Service anonymous map, which the
//! kernel is slow to load); session affinity uses one timeout set per
//! endpoint. Services without usable endpoints are in a filter map that
//! rejects, so clients fail at once instead of timing out; a Local traffic
//! policy without an endpoint on this node drops there instead. What the
//! Service rules leave of traffic to the Service CIDR (a ClusterIP's
//! unserved port, an address no Service holds) is rejected or dropped on
//! the node, never routed out (`cluster-ips-check`).
//!
//! Which endpoints a port uses follows kube-proxy's CategorizeEndpoints:
//! ready ones (narrowed by topology hints when they apply), else
//! serving-terminating ones, separately for the Cluster and Local
//! policies.
//!
//! Masquerade: traffic to a Service from outside the cluster CIDR, traffic
//! arriving through a NodePort/externalIP/LB with the Cluster policy, and
//! hairpin traffic (an endpoint reaching itself through its Service) are
//! marked and masqueraded in postrouting; pod-to-Service traffic from inside
//! the cluster keeps its source address.
//!
//! Each address family has its own table, `ip podnet` and `ip6 podnet`,
//! planned by the same code for a [`Stack`] (as kube-proxy runs one proxier
//! per family): a dual-stack Service contributes its IPv4 ClusterIP and
//! endpoints to one and its IPv6 ones to the other.
//!
//! Layout, one concept per file:
//! - `stack`: [`Stack`], one address family's table and pod network;
//! - `input`: what the planner reads ([`NodeInfo`], [`ProxyInput`]) and
//!   which Services and slices are ours ([`opted_out`], [`programmed_ip`]);
//! - `endpoints`: a Service port's usable endpoints on this node;
//! - `blocks`: rule and element building blocks both halves share;
//! - `base`: the fixed table every Service shares ([`base_table`],
//!   [`shell`]): hooks, dispatch chains, checks;
//! - `fast`: the fast path, a Service port as set elements only;
//! - `service`: one Service's fragment ([`fragment`]'s body): which path
//!   each port takes, and its ClusterIP dispatch;
//! - `endpoint_chains`: a chain-path port's DNAT chains, the numgen pick
//!   and session affinity;
//! - `external`: NodePorts, externalIPs and LoadBalancer IPs, with the
//!   external traffic policy and loadBalancerSourceRanges;
//! - `plan`: whole tables and fragments, and merging them.

mod base;
mod blocks;
mod endpoint_chains;
mod endpoints;
mod external;
mod fast;
mod input;
mod plan;
mod service;
mod stack;

pub use base::{base_table, shell};
pub use fast::{fast_set, is_fast_count_set, FAST_MAX};
pub use input::{
    opted_out, programmed_ip, slice_opted_out, NodeInfo, ProxyInput, HEADLESS_LABEL, PROXY_NAME,
    PROXY_NAME_LABEL,
};
pub use plan::{fragment, merge, plan};
pub use stack::Stack;

pub const TABLE: &str = "podnet";
pub const MASQ_MARK: u32 = 0x4000;
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10800;

#[cfg(test)]
mod tests;
