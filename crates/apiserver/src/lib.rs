//! The API server's networking duties in standalone mode, in one place;
//! the Kubernetes mode uses none of it (the real kube-apiserver and
//! kube-controller-manager do these jobs there):
//!
//! - [`admission`]: the write path of `podnet apply`/`delete`: validation,
//!   server-owned fields, and the Service's reservations in the same
//!   transaction;
//! - [`alloc`]: ClusterIP and NodePort allocation, safe across processes;
//! - [`lbips`]: LoadBalancer address reservations, the same way;
//! - [`controller`]: `podnet controller`, which allocates what Services
//!   still lack, releases orphaned reservations, writes EndpointSlices
//!   ([`endpoints`] is its pure planner) and LoadBalancer Services'
//!   addresses (`podnet_lb::ipam` decides them), fed by the object source.

pub mod admission;
pub mod alloc;
pub mod controller;
pub mod endpoints;
pub mod lbips;

pub use controller::{Controller, KINDS};
