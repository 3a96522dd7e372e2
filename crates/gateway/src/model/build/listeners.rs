//! GatewayClasses and Gateways: which are ours, and each listener's
//! verdicts (protocol, route kinds, certificates, conflicts), with the
//! port tables and certificates the valid listeners open.

use std::collections::BTreeMap;

use podnet_api::gateway::listener::{Gateway, Listener};
use podnet_api::gateway::GROUP;
use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::{Built, Config, GatewayState, Key, ListenerState, Verdict, World};
use crate::model::hosts::Host;
use crate::model::{Bind, Certificate};

/// Which namespaces' routes a listener takes.
#[derive(Debug, Clone)]
pub enum From {
    Same,
    All,
    Selector(LabelSelector),
}

/// A listener as routes see it while they attach.
#[derive(Debug, Clone)]
pub struct Open {
    pub name: String,
    pub bind: Bind,
    pub host: Host,
    pub from: From,
    /// Whether HTTPRoute is among its allowed kinds.
    pub takes_http_routes: bool,
    /// Accepted and in no conflict: routes attach (and count), even
    /// while its references are unresolved.
    pub attachable: bool,
    /// Programmed: traffic is served.
    pub serving: bool,
    pub state: ListenerState,
}

/// A Gateway of ours while routes attach.
#[derive(Debug, Clone)]
pub struct Gw {
    pub namespace: String,
    /// Its own address, when the gateway has a pool.
    pub address: Option<std::net::IpAddr>,
    pub generation: Option<i64>,
    pub listeners: Vec<Open>,
    pub accepted: Verdict,
}

impl Gw {
    pub fn into_state(self) -> GatewayState {
        let any = self.listeners.iter().any(|l| l.state.programmed.ok);
        let programmed = match (self.accepted.ok, any) {
            (true, true) => Verdict::yes("Programmed"),
            (true, false) => Verdict::no("Invalid", "no listener is programmed"),
            (false, _) => Verdict::no("Invalid", self.accepted.message.clone()),
        };
        GatewayState {
            address: self.address,
            generation: self.generation,
            accepted: self.accepted,
            programmed,
            listeners: self.listeners.into_iter().map(|l| l.state).collect(),
        }
    }
}

/// Judges our classes and Gateways; opens the valid listeners' ports.
/// `given`: the addresses the last judgement gave.
pub fn judge(
    w: &World,
    cfg: &Config,
    given: &BTreeMap<Key, std::net::IpAddr>,
    b: &mut Built,
) -> BTreeMap<Key, Gw> {
    for (name, c) in &w.classes {
        if c.spec.controller_name == cfg.controller_name {
            b.statuses.classes.insert(
                name.clone(),
                (c.metadata.generation, Verdict::yes("Accepted")),
            );
        }
    }
    let ours: std::collections::BTreeSet<Key> = w
        .gateways
        .iter()
        .filter(|(_, g)| b.statuses.classes.contains_key(&g.spec.gateway_class_name))
        .map(|(k, _)| k.clone())
        .collect();
    let assigned = match &cfg.pool {
        Some(p) => crate::model::addresses::assign(&w.gateways, &ours, p, given),
        None => BTreeMap::new(),
    };
    let mut out = BTreeMap::new();
    for (k, g) in w.gateways.iter().filter(|(k, _)| ours.contains(*k)) {
        let address = assigned.get(k).copied();
        let mut listeners = listeners_of(w, cfg, k, g, address, b);
        if cfg.pool.is_some() && address.is_none() {
            for l in &mut listeners {
                l.serving = false;
                l.state.programmed = Verdict::no(
                    "AddressNotAssigned",
                    "the gateway's address pool is used up",
                );
            }
        }
        let valid = listeners.iter().filter(|l| l.attachable).count();
        let accepted = match (valid, listeners.len() - valid) {
            (0, _) => Verdict::no("ListenersNotValid", "no listener is valid"),
            (_, 0) => Verdict::yes("Accepted"),
            (_, bad) => Verdict {
                ok: true,
                reason: "ListenersNotValid",
                message: format!("{bad} listener(s) are not valid; see their conditions"),
            },
        };
        out.insert(
            k.clone(),
            Gw {
                namespace: k.0.clone(),
                address,
                generation: g.metadata.generation,
                listeners,
                accepted,
            },
        );
    }
    out
}

fn listeners_of(
    w: &World,
    cfg: &Config,
    k: &Key,
    g: &Gateway,
    ip: Option<std::net::IpAddr>,
    b: &mut Built,
) -> Vec<Open> {
    let mut out: Vec<Open> = Vec::new();
    for l in &g.spec.listeners {
        let (mut o, certs) = judge_listener(w, cfg, k, l, ip);
        conflicts(&mut o, l, &g.spec.listeners);
        if o.state.conflicted.as_ref().is_some_and(|c| c.ok) {
            (o.attachable, o.serving) = (false, false);
            o.state.programmed = Verdict::no("Invalid", "the listener conflicts with another");
        }
        if o.serving {
            let t = b.table.ports.entry(o.bind).or_default();
            t.tls |= l.protocol == "HTTPS";
            t.certs.extend(certs);
        }
        out.push(o);
    }
    out
}

/// Listeners of one Gateway on one port must agree on the protocol and
/// differ in hostname.
fn conflicts(o: &mut Open, l: &Listener, all: &[Listener]) {
    let same_port = all.iter().filter(|x| x.port == l.port && x.name != l.name);
    let mut verdict = Verdict::no("NoConflicts", "");
    for x in same_port {
        let http_family = |p: &str| matches!(p, "HTTP" | "HTTPS");
        if x.protocol != l.protocol && http_family(&x.protocol) && http_family(&l.protocol) {
            verdict = Verdict {
                ok: true,
                reason: "ProtocolConflict",
                message: format!("listener {} uses {} on port {}", x.name, x.protocol, x.port),
            };
        } else if x.protocol == l.protocol && x.hostname == l.hostname {
            verdict = Verdict {
                ok: true,
                reason: "HostnameConflict",
                message: format!(
                    "listener {} has the same hostname on port {}",
                    x.name, x.port
                ),
            };
        }
    }
    o.state.conflicted = Some(verdict);
}

/// A listener's verdicts, and its certificates when it has them.
fn judge_listener(
    w: &World,
    cfg: &Config,
    k: &Key,
    l: &Listener,
    ip: Option<std::net::IpAddr>,
) -> (Open, Vec<Certificate>) {
    let (kinds, kinds_ok) = route_kinds(l);
    let mut state = ListenerState {
        name: l.name.clone(),
        port: u16::try_from(l.port).unwrap_or(0),
        accepted: Verdict::yes("Accepted"),
        resolved_refs: Verdict::yes("ResolvedRefs"),
        conflicted: None,
        programmed: Verdict::yes("Programmed"),
        supported_kinds: kinds.clone(),
        attached_routes: 0,
    };
    if !kinds_ok {
        state.resolved_refs = Verdict::no("InvalidRouteKinds", "only HTTPRoute is supported");
    }
    let port = u16::try_from(l.port).unwrap_or(0);
    let host = Host::gateway(l.hostname.as_deref());
    let mut certs = Vec::new();
    match l.protocol.as_str() {
        "HTTP" => {}
        "HTTPS" => match certificates(w, k, l, &host) {
            Ok(c) => certs = c,
            Err(v) => state.resolved_refs = v,
        },
        p => {
            state.accepted = Verdict::no(
                "UnsupportedProtocol",
                format!("{p} is not served (HTTP and HTTPS are)"),
            );
            // No route kind can attach to a protocol not served.
            state.supported_kinds.clear();
        }
    }
    if state.accepted.ok && !cfg.listener_ports.contains(port) {
        state.accepted = Verdict::no(
            "PortUnavailable",
            format!(
                "port {port} is not one this gateway may open on the node ({}; --listener-ports)",
                cfg.listener_ports
            ),
        );
    }
    if !state.accepted.ok || !state.resolved_refs.ok {
        state.programmed = Verdict::no("Invalid", "see the other conditions");
    }
    let attachable = state.accepted.ok;
    let serving = state.accepted.ok && state.programmed.ok;
    let from = from_of(l);
    let takes_http_routes = state.supported_kinds.iter().any(|k| k == "HTTPRoute");
    (
        Open {
            name: l.name.clone(),
            bind: Bind { ip, port },
            host,
            from,
            takes_http_routes,
            attachable,
            serving,
            state,
        },
        certs,
    )
}

fn from_of(l: &Listener) -> From {
    let ns = l
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref());
    match ns.and_then(|n| n.from.as_deref()) {
        Some("All") => From::All,
        Some("Selector") => From::Selector(ns.and_then(|n| n.selector.clone()).unwrap_or_default()),
        _ => From::Same,
    }
}

/// The route kinds a listener takes, and whether every kind it names is
/// one podnet serves.
fn route_kinds(l: &Listener) -> (Vec<String>, bool) {
    let asked = l
        .allowed_routes
        .as_ref()
        .map(|a| a.kinds.as_slice())
        .unwrap_or(&[]);
    if asked.is_empty() {
        return (vec!["HTTPRoute".into()], true);
    }
    let ok: Vec<String> = asked
        .iter()
        .filter(|k| k.group.as_deref().unwrap_or(GROUP) == GROUP && k.kind == "HTTPRoute")
        .map(|k| k.kind.clone())
        .collect();
    let all = ok.len() == asked.len();
    (ok, all)
}

/// A listener's certificates, each a resolvable, permitted TLS Secret.
fn certificates(
    w: &World,
    k: &Key,
    l: &Listener,
    host: &Host,
) -> Result<Vec<Certificate>, Verdict> {
    let tls = l
        .tls
        .as_ref()
        .ok_or_else(|| Verdict::no("InvalidCertificateRef", "no tls"))?;
    if tls.mode.as_deref().unwrap_or("Terminate") != "Terminate" {
        return Err(Verdict::no(
            "InvalidCertificateRef",
            "only TLS mode Terminate is served",
        ));
    }
    let mut out = Vec::new();
    for r in &tls.certificate_refs {
        let ns = r.namespace.clone().unwrap_or_else(|| k.0.clone());
        if !r.is_secret() {
            return Err(Verdict::no(
                "InvalidCertificateRef",
                format!("{} is not a Secret", r.name),
            ));
        }
        if !w.granted(("Gateway", &k.0), ("", "Secret", &ns, &r.name)) {
            return Err(Verdict::no(
                "RefNotPermitted",
                format!(
                    "no ReferenceGrant in {ns} lets Gateway {}/{} use Secret {}",
                    k.0, k.1, r.name
                ),
            ));
        }
        let pem = w
            .secrets
            .get(&(ns.clone(), r.name.clone()))
            .and_then(tls_pair);
        match pem {
            Some((chain_pem, key_pem)) => out.push(Certificate {
                host: host.clone(),
                chain_pem,
                key_pem,
            }),
            None => {
                return Err(Verdict::no(
                    "InvalidCertificateRef",
                    format!(
                        "Secret {ns}/{} is missing or holds no valid tls.crt and tls.key",
                        r.name
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// A TLS Secret's certificate chain and key, if both parse as PEM.
pub fn tls_pair(s: &podnet_api::k8s_openapi::api::core::v1::Secret) -> Option<(Vec<u8>, Vec<u8>)> {
    // stringData is write-only in the API; a standalone store may keep it.
    let field = |k: &str| {
        s.data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|b| b.0.clone())
            .or_else(|| {
                s.string_data
                    .as_ref()
                    .and_then(|d| d.get(k))
                    .map(|v| v.clone().into_bytes())
            })
    };
    let crt = field("tls.crt")?;
    let key = field("tls.key")?;
    crate::tls::check_pair(&crt, &key).ok()?;
    Some((crt, key))
}
