//! Subnet ownership: which node holds which pod subnet, and how to reach
//! it (public IP, backend type and data). The overlay reads this and only
//! this; where it comes from is one enum:
//!
//! - [`Subnets::Leases`] ([`leases`]): TTL leases in the podnet store,
//!   flannel's etcd subnet manager (standalone mode);
//! - [`Subnets::PodCidr`] ([`podcidr`]): `Node.spec.podCIDRs` allocated by
//!   kube-controller-manager (`--allocate-node-cidrs`), with the backend
//!   type, backend data and public IP as `podnet.io/` node annotations, as
//!   flannel's kube-subnet-mgr does (Kubernetes mode).

pub mod leases;
pub mod podcidr;

use std::collections::BTreeMap;

use ipnet::Ipv4Net;

pub use leases::{Attrs, SubnetLease};

use crate::SourceError;

/// Every node's subnet, by subnet.
pub type SubnetMap = BTreeMap<Ipv4Net, SubnetLease>;

/// What [`Subnets::next`] reports.
#[derive(Debug)]
pub enum Change {
    /// The subnets of every node now (including this one's).
    Nodes(SubnetMap),
    /// This node's subnet is no longer its own (an expired or deleted
    /// lease, a changed podCIDR): acquire again.
    LostMine,
}

/// Where subnet ownership comes from.
pub enum Subnets {
    Leases(leases::Leases),
    PodCidr(podcidr::PodCidr),
}

impl Subnets {
    /// Claims this node's subnet (a lease; or the podCIDR the controller
    /// manager allocated, waiting for it) and publishes `attrs` with it.
    pub async fn acquire(
        &mut self,
        attrs: &Attrs,
        previous: Option<Ipv4Net>,
    ) -> Result<SubnetLease, SourceError> {
        match self {
            Subnets::Leases(l) => l.acquire(attrs, previous).await,
            Subnets::PodCidr(p) => p.acquire(attrs).await,
        }
    }

    /// The next change of the subnet map; the map comes whole, so the
    /// overlay's plan stays a pure function of it.
    pub async fn next(&mut self) -> Result<Change, SourceError> {
        match self {
            Subnets::Leases(l) => l.next().await,
            Subnets::PodCidr(p) => p.next().await,
        }
    }

    /// Keeps the claim alive (a lease keepalive; nothing for a podCIDR).
    pub async fn renew(&mut self) -> Result<(), SourceError> {
        match self {
            Subnets::Leases(l) => l.renew().await,
            Subnets::PodCidr(_) => Ok(()),
        }
    }

    /// How often [`Subnets::renew`] must run, if at all.
    pub fn renew_every(&self) -> Option<std::time::Duration> {
        match self {
            Subnets::Leases(l) => Some(l.renew_every()),
            Subnets::PodCidr(_) => None,
        }
    }

    /// The node's network is up: the node becomes schedulable for pods
    /// (standalone: the Node object is registered with its subnet;
    /// Kubernetes: its `NetworkUnavailable` condition is cleared).
    pub async fn network_up(&self, node_ip: std::net::Ipv4Addr) -> Result<(), SourceError> {
        match self {
            Subnets::Leases(l) => l.network_up(node_ip).await,
            Subnets::PodCidr(p) => p.network_up().await,
        }
    }

    /// Gives the subnet back (for `--cleanup`): revokes the lease, or
    /// removes the annotations.
    pub async fn release(&mut self) -> Result<(), SourceError> {
        match self {
            Subnets::Leases(l) => l.release().await,
            Subnets::PodCidr(p) => p.release().await,
        }
    }
}
