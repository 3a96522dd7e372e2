//! Objects → the routing [`Table`], the backends' endpoints, and the
//! status every object should show, in one pure pass.
//!
//! Layout: [`world`] the inputs, [`listeners`] GatewayClasses, Gateways
//! and their listeners (certificates included), [`routes`] an HTTPRoute
//! attached to them, [`rules`] one rule's filters and backends,
//! [`ingress`] an Ingress, [`part`] what one route or Ingress adds,
//! [`compiler`] the parts merged and kept between changes,
//! [`endpoints`] a backend's endpoints; [`crate::status`] turns the
//! verdicts into conditions.

pub mod compiler;
pub mod endpoints;
pub mod ingress;
pub mod listeners;
pub mod part;
pub mod routes;
pub mod rules;
pub mod world;

use std::collections::{BTreeMap, BTreeSet};

use super::{BackendKey, Table};
pub use world::{Key, World};

/// What podnet's gateway serves, besides the objects.
#[derive(Debug, Clone)]
pub struct Config {
    /// GatewayClasses naming this controller are ours.
    pub controller_name: String,
    /// The IngressClass whose Ingresses are ours.
    pub ingress_class: String,
    /// Where Ingresses are served: plain and TLS.
    pub ingress_http_port: u16,
    pub ingress_https_port: u16,
    /// Addresses to give each Gateway one of its own (None: every Gateway
    /// on the gateway's one address).
    pub pool: Option<crate::model::addresses::Pool>,
    /// The ports Gateway listeners may open (the node's ports).
    pub listener_ports: crate::model::ports::PortSet,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            controller_name: podnet_api::gateway::CONTROLLER_NAME.into(),
            ingress_class: podnet_api::ingress::CLASS.into(),
            ingress_http_port: 80,
            ingress_https_port: 443,
            pool: None,
            listener_ports: Default::default(),
        }
    }
}

/// Why a condition is what it is: (status, reason, message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub ok: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Verdict {
    pub fn yes(reason: &'static str) -> Verdict {
        Verdict {
            ok: true,
            reason,
            message: String::new(),
        }
    }

    pub fn no(reason: &'static str, message: impl Into<String>) -> Verdict {
        Verdict {
            ok: false,
            reason,
            message: message.into(),
        }
    }
}

/// One listener's judged state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerState {
    pub name: String,
    pub port: u16,
    pub accepted: Verdict,
    pub resolved_refs: Verdict,
    pub conflicted: Option<Verdict>,
    pub programmed: Verdict,
    pub supported_kinds: Vec<String>,
    pub attached_routes: i32,
}

/// A Gateway's judged state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayState {
    /// Its own address (from the pool).
    pub address: Option<std::net::IpAddr>,
    pub generation: Option<i64>,
    pub accepted: Verdict,
    pub programmed: Verdict,
    pub listeners: Vec<ListenerState>,
}

/// A route's state towards one of its parents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentState {
    pub parent: podnet_api::gateway::ParentReference,
    pub accepted: Verdict,
    pub resolved_refs: Verdict,
}

/// The statuses every object of ours should show.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Statuses {
    /// Our GatewayClasses (cluster-scoped: namespace "").
    pub classes: BTreeMap<String, (Option<i64>, Verdict)>,
    pub gateways: BTreeMap<Key, GatewayState>,
    /// Routes with at least one parent of ours, with their generation.
    pub routes: BTreeMap<Key, (Option<i64>, Vec<ParentState>)>,
    /// Our Ingresses.
    pub ingresses: BTreeSet<Key>,
}

impl Statuses {
    /// Marks the listeners on `port` not programmed: the data plane could
    /// not bind it (`why`); a Gateway left with no programmed listener
    /// is not programmed either.
    pub fn port_unavailable(&mut self, bind: impl Into<crate::model::Bind>, why: &str) {
        let bind = bind.into();
        let port = bind.port;
        for g in self.gateways.values_mut().filter(|g| g.address == bind.ip) {
            for l in g.listeners.iter_mut().filter(|l| l.port == port) {
                l.programmed =
                    Verdict::no("Pending", format!("port {port} cannot be bound: {why}"));
            }
            if g.programmed.ok && !g.listeners.iter().any(|l| l.programmed.ok) {
                g.programmed = Verdict::no("Pending", "no listener's port could be bound");
            }
        }
    }
}

/// The compiled state.
#[derive(Debug, Clone, Default)]
pub struct Built {
    pub table: Table,
    pub statuses: Statuses,
    /// Every backend some rule sends to (for [`endpoints::resolve`]).
    pub backends: BTreeSet<BackendKey>,
}

/// Compiles everything.
pub fn build(w: &World, cfg: &Config) -> Built {
    compiler::Compiler::new(w, cfg).built()
}

#[cfg(test)]
mod incremental_tests;
#[cfg(test)]
mod tests;
