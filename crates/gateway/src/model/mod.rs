//! The routing table the data plane serves from, compiled (purely) from
//! Gateways, HTTPRoutes and Ingresses: per port, per host pattern, the
//! rules in precedence order, each with its filters and weighted
//! backends. A request is answered by one lookup; nothing here does I/O.
//!
//! Backends name a Service port ([`BackendKey`]); which endpoints serve
//! it is a separate map ([`Endpoints`]) so an endpoint change replaces
//! one entry and never recompiles the routes.
//!
//! Layout: [`hosts`] host patterns and their table, [`matcher`] one
//! match and precedence, [`build`] objects → table and statuses.

pub mod addresses;
pub mod build;
pub mod explain;
pub mod hosts;
pub mod matcher;
pub mod ports;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hosts::{Host, HostMap};
use matcher::{Match, Order, Request};

/// A Service port a rule sends to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendKey {
    pub namespace: String,
    pub service: String,
    pub port: u16,
}

impl std::fmt::Display for BackendKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}:{}", self.namespace, self.service, self.port)
    }
}

/// The ready endpoints of each backend, and whether it speaks h2c.
pub type Endpoints = HashMap<BackendKey, Arc<BackendEndpoints>>;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct BackendEndpoints {
    pub addrs: Vec<SocketAddr>,
    /// `addrs` as URI authorities, made once.
    pub authorities: Vec<http::uri::Authority>,
    /// The Service port's appProtocol is `kubernetes.io/h2c`.
    pub h2c: bool,
    /// `kubernetes.io/ws` or `kubernetes.io/wss`.
    pub websocket: bool,
}

/// Header edits (RequestHeaderModifier / ResponseHeaderModifier).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderEdit {
    pub set: Vec<(http::HeaderName, http::HeaderValue)>,
    pub add: Vec<(http::HeaderName, http::HeaderValue)>,
    pub remove: Vec<http::HeaderName>,
}

/// How a path is rewritten or redirected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathEdit {
    Full(String),
    /// Replace the matched prefix.
    Prefix(String),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redirect {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub path: Option<PathEdit>,
    pub port: Option<u16>,
    pub status: u16,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rewrite {
    pub hostname: Option<String>,
    pub path: Option<PathEdit>,
}

/// One backend of a rule; `key` None is an invalid reference, whose share
/// of requests gets a 500 as the spec asks.
#[derive(Debug, Clone, PartialEq)]
pub struct Backend {
    pub key: Option<BackendKey>,
    pub weight: u32,
    pub request_headers: Option<HeaderEdit>,
    pub response_headers: Option<HeaderEdit>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retry {
    pub codes: Vec<u16>,
    pub attempts: u32,
    pub backoff: Option<Duration>,
}

/// Which object a rule came from, for logs, metrics and `podnet trace`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteRef {
    /// "HTTPRoute" or "Ingress".
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub rule: usize,
}

impl std::fmt::Display for RouteRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}/{} rule {}",
            self.kind, self.namespace, self.name, self.rule
        )
    }
}

/// What a matched request gets.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub route: RouteRef,
    pub request_headers: Option<HeaderEdit>,
    pub response_headers: Option<HeaderEdit>,
    pub redirect: Option<Redirect>,
    pub rewrite: Option<Rewrite>,
    pub backends: Vec<Backend>,
    pub mirrors: Vec<(BackendKey, f64)>,
    /// The whole request, retries included.
    pub timeout: Option<Duration>,
    /// One try at a backend.
    pub backend_timeout: Option<Duration>,
    pub retry: Option<Retry>,
}

impl Rule {
    pub fn total_weight(&self) -> u64 {
        self.backends.iter().map(|b| b.weight as u64).sum()
    }
}

/// One match of one rule, in a host's precedence list.
#[derive(Debug, Clone)]
pub struct Entry {
    pub m: Match,
    pub order: Order,
    pub rule: Arc<Rule>,
}

/// A listener's certificate, as PEM (turned into a rustls key by the
/// data plane).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Certificate {
    pub host: Host,
    pub chain_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

/// Everything served on one port.
#[derive(Debug, Clone, Default)]
pub struct PortTable {
    /// TLS is terminated here (HTTPS listeners, Ingress TLS).
    pub tls: bool,
    /// Per listener hostname (the most specific that matches a request's
    /// host takes it: listener isolation), each host pattern's entries in
    /// precedence order, shared with the compiler's copy (a swap clones
    /// pointers, not entries).
    pub hosts: HostMap<HostMap<Arc<Vec<Entry>>>>,
    /// Most specific host first; the first that matches the SNI serves.
    pub certs: Vec<Certificate>,
}

impl PortTable {
    /// The entries a request for `host` searches: the most specific
    /// listener's, under its most specific host pattern; with both
    /// patterns.
    pub fn entries(&self, host: &str) -> Option<(Host, Host, &Arc<Vec<Entry>>)> {
        let (listener, patterns) = self.hosts.get_with_pattern(host)?;
        let (pattern, entries) = patterns.get_with_pattern(host)?;
        Some((listener, pattern, entries))
    }
}

/// Where a port table is served: a port on the gateway's own address
/// (`ip` None: every Gateway without an address of its own, and
/// Ingresses), or on one Gateway's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bind {
    pub ip: Option<std::net::IpAddr>,
    pub port: u16,
}

impl From<u16> for Bind {
    fn from(port: u16) -> Bind {
        Bind { ip: None, port }
    }
}

impl std::fmt::Display for Bind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.ip {
            Some(ip) => write!(f, "{}", std::net::SocketAddr::new(ip, self.port)),
            None => write!(f, "*:{}", self.port),
        }
    }
}

/// The whole routing state.
#[derive(Debug, Clone, Default)]
pub struct Table {
    pub ports: BTreeMap<Bind, PortTable>,
}

/// The outcome of a lookup.
pub struct Found<'a> {
    pub rule: &'a Arc<Rule>,
    pub m: &'a Match,
}

impl Table {
    /// The rule a request on `bind` for `host` takes: the most specific
    /// host pattern's entries, first match in precedence order.
    pub fn route<'a>(
        &'a self,
        bind: impl Into<Bind>,
        host: &str,
        r: &Request,
    ) -> Option<Found<'a>> {
        let entries = self.ports.get(&bind.into())?.entries(host)?.2;
        entries.iter().find(|e| e.m.matches(r)).map(|e| Found {
            rule: &e.rule,
            m: &e.m,
        })
    }
}

/// Certificates sort most specific host first.
pub(crate) fn host_rank(h: &Host) -> (u8, usize) {
    match h {
        Host::Exact(e) => (2, e.len()),
        Host::Wildcard { suffix, .. } => (1, suffix.len()),
        Host::Any => (0, 0),
    }
}
