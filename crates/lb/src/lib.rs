//! LoadBalancer Services on bare metal (issue 26): where their addresses
//! come from and how the network learns where they are.
//!
//! Layout, one concept per module (added as they land):
//! - [`ipam`]: address pools and the allocation of LoadBalancer IPs (pure:
//!   the standalone controller in `podnet-apiserver` stores and reserves
//!   what it decides);
//! - [`kube`]: the same decisions in Kubernetes mode, by the replica that
//!   holds a Lease, written to each Service's status;
//! - [`l2`]: L2 announcement, one node answering ARP/NDP for each address
//!   and another taking over with gratuitous ARP / unsolicited NA.

pub mod ipam;
pub mod kube;
pub mod l2;
