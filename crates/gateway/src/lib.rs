//! podnet's L7 gateway (`podnet gateway`): the Gateway API (GatewayClass,
//! Gateway, HTTPRoute, ReferenceGrant) and Ingress, served by an HTTP/1.1
//! and HTTP/2 reverse proxy with TLS termination, routing straight to
//! the pods EndpointSlices list.
//!
//! Layout, in the order a change flows:
//! - [`model`]: pure. Objects → the routing table (hosts, matches in the
//!   spec's precedence, filters, weighted backends) and the verdicts
//!   statuses are made of; endpoints resolved apart from routes.
//! - [`status`]: pure. Verdicts → the conditions the specs define.
//! - [`tls`]: certificates from Secrets, picked by SNI.
//! - [`local`]: the Gateways' own addresses on this node's loopback.
//! - [`proxy`]: the data plane: ports, connections, one request's path.
//! - [`run`]: the loop that feeds the model from the object source, swaps
//!   tables in and writes statuses through an injected [`write`]r.

pub mod local;
pub mod model;
pub mod proxy;
pub mod run;
pub mod status;
pub mod tls;
pub mod write;

pub use model::build::world::KINDS;
