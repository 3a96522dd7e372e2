//! Ingresses of podnet's class, compiled into the same table as routes:
//! each rule's paths on the Ingress HTTP port (and on the HTTPS port for
//! hosts its `tls` lists, with their Secrets' certificates), and the
//! default backend behind every host the Ingress names.

use std::sync::Arc;

use podnet_api::k8s_openapi::api::networking::v1::{Ingress, IngressBackend, IngressSpec};

use super::part::Part;
use super::{Config, Key, World};
use crate::model::hosts::Host;
use crate::model::matcher::{Match, Order, PathMatch};
use crate::model::{Backend, BackendKey, Certificate, Entry, RouteRef, Rule};

const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";
const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

/// Whether the Ingress is ours: it names our class, or names none while
/// our IngressClass is the default.
pub fn ours(w: &World, cfg: &Config, i: &Ingress) -> bool {
    let named = i
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref());
    let legacy = i
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LEGACY_CLASS_ANNOTATION));
    match (named, legacy) {
        (Some(c), _) => c == cfg.ingress_class,
        (None, Some(c)) => *c == cfg.ingress_class,
        (None, None) => w.ingress_classes.get(&cfg.ingress_class).is_some_and(|c| {
            c.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                .is_some_and(|v| v == "true")
        }),
    }
}

/// What the Ingress adds, if it is ours.
pub fn part(w: &World, cfg: &Config, k: &Key, i: &Ingress) -> Option<Part> {
    if !ours(w, cfg, i) {
        return None;
    }
    let mut part = Part::default();
    if let Some(spec) = &i.spec {
        one(w, cfg, k, i, spec, &mut part);
    }
    Some(part)
}

fn one(w: &World, cfg: &Config, k: &Key, i: &Ingress, spec: &IngressSpec, b: &mut Part) {
    let created = i
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_second());
    let tls_hosts: Vec<(Host, Option<&str>)> = spec
        .tls
        .iter()
        .flatten()
        .flat_map(|t| {
            t.hosts
                .iter()
                .flatten()
                .map(move |h| (Host::ingress(Some(h)), t.secret_name.as_deref()))
        })
        .collect();
    let mut hosts_named = Vec::new();
    for (ri, r) in spec.rules.iter().flatten().enumerate() {
        let host = Host::ingress(r.host.as_deref());
        hosts_named.push(host.clone());
        for (pi, p) in r.http.iter().flat_map(|h| h.paths.iter()).enumerate() {
            let path = p.path.clone().unwrap_or_else(|| "/".into());
            let m = match p.path_type.as_str() {
                "Exact" => PathMatch::Exact(path),
                _ => PathMatch::Prefix(path),
            };
            let rule = Arc::new(rule_for(w, k, ri, &p.backend, b));
            let order = Order {
                created,
                route: format!("{}/{}", k.0, k.1),
                rule: ri,
                index: pi,
            };
            let entry = Entry {
                m: Match {
                    path: m,
                    ..Match::any()
                },
                order,
                rule,
            };
            place(cfg, &tls_hosts, &host, entry, b);
        }
    }
    if let Some(d) = &spec.default_backend {
        let rule = Arc::new(rule_for(w, k, usize::MAX, d, b));
        hosts_named.push(Host::Any);
        hosts_named.dedup();
        for host in hosts_named {
            let order = Order {
                created: i64::MAX,
                route: format!("{}/{}", k.0, k.1),
                rule: usize::MAX,
                index: 0,
            };
            let entry = Entry {
                m: Match::any(),
                order,
                rule: rule.clone(),
            };
            place(cfg, &tls_hosts, &host, entry, b);
        }
    }
    for (host, secret) in tls_hosts {
        let pair = secret
            .and_then(|s| w.secrets.get(&(k.0.clone(), s.to_string())))
            .and_then(super::listeners::tls_pair);
        if let Some((chain_pem, key_pem)) = pair {
            let bind = cfg.ingress_https_port.into();
            b.ports.insert(bind);
            b.tls.insert(bind);
            b.certs.push((
                bind,
                Certificate {
                    host,
                    chain_pem,
                    key_pem,
                },
            ));
        }
    }
}

/// Puts an entry on the HTTP port, and on the HTTPS port when the host
/// is one of the Ingress's TLS hosts.
fn place(cfg: &Config, tls_hosts: &[(Host, Option<&str>)], host: &Host, e: Entry, b: &mut Part) {
    if tls_hosts
        .iter()
        .any(|(h, _)| h == host || (*host == Host::Any))
    {
        let bind = cfg.ingress_https_port.into();
        b.tls.insert(bind);
        b.push((bind, &Host::Any), host, [e.clone()]);
    }
    b.push((cfg.ingress_http_port.into(), &Host::Any), host, [e]);
}

fn rule_for(w: &World, k: &Key, ri: usize, be: &IngressBackend, b: &mut Part) -> Rule {
    let key = be.service.as_ref().and_then(|s| {
        let svc = w.services.get(&(k.0.clone(), s.name.clone()))?;
        let ports = svc.spec.as_ref()?.ports.as_ref()?;
        let want = s.port.as_ref()?;
        let p = ports.iter().find(|p| match (&want.number, &want.name) {
            (Some(n), _) => p.port == *n,
            (None, Some(name)) => p.name.as_deref() == Some(name),
            _ => false,
        })?;
        Some(BackendKey {
            namespace: k.0.clone(),
            service: s.name.clone(),
            port: p.port as u16,
        })
    });
    if let Some(key) = &key {
        b.backends.insert(key.clone());
    }
    Rule {
        route: RouteRef {
            kind: "Ingress",
            namespace: k.0.clone(),
            name: k.1.clone(),
            rule: ri,
        },
        request_headers: None,
        response_headers: None,
        redirect: None,
        rewrite: None,
        backends: vec![Backend {
            key,
            weight: 1,
            request_headers: None,
            response_headers: None,
        }],
        mirrors: Vec::new(),
        timeout: None,
        backend_timeout: None,
        retry: None,
    }
}
