//! One HTTPRoute attached to our Gateways: for each parent reference,
//! the listeners that take the route (section, port, allowed namespaces
//! and kinds, hostname intersection), the route's entries in their port
//! tables, and the route's verdicts towards that parent — as the
//! route's [`Part`].

use std::collections::BTreeMap;
use std::sync::Arc;

use podnet_api::gateway::{HTTPRoute, ParentReference};

use super::listeners::{From, Gw, Open};
use super::part::Part;
use super::{rules, Key, ParentState, Verdict, World};
use crate::model::hosts::Host;
use crate::model::matcher::Order;
use crate::model::{Entry, Rule};

/// What `r` adds, if it has a parent among our Gateways.
pub fn part(w: &World, gws: &BTreeMap<Key, Gw>, k: &Key, r: &HTTPRoute) -> Option<Part> {
    let mut parents = Vec::new();
    let mut part = Part::default();
    let compiled = rules::compile(w, k, r);
    for p in r.spec.parent_refs.iter().filter(|p| p.is_gateway()) {
        let gk = (
            p.namespace.clone().unwrap_or_else(|| k.0.clone()),
            p.name.clone(),
        );
        let Some(gw) = gws.get(&gk) else { continue };
        let accepted = attach_to(w, (k, r), p, (&gk, gw), &compiled.rules, &mut part);
        parents.push(ParentState {
            parent: p.clone(),
            accepted,
            resolved_refs: compiled.resolved.clone(),
        });
    }
    if parents.is_empty() {
        return None;
    }
    for rule in &compiled.rules {
        part.backends
            .extend(rule.backends.iter().filter_map(|b| b.key.clone()));
        part.backends
            .extend(rule.mirrors.iter().map(|m| m.0.clone()));
    }
    part.route_status = Some((r.metadata.generation, parents));
    Some(part)
}

/// Attaches one route to the listeners of `gw` that take it; the verdict
/// is the route's Accepted condition for this parent.
fn attach_to(
    w: &World,
    (k, r): (&Key, &HTTPRoute),
    p: &ParentReference,
    (gk, gw): (&Key, &Gw),
    rules: &[Arc<Rule>],
    part: &mut Part,
) -> Verdict {
    let named: Vec<(usize, &Open)> = gw
        .listeners
        .iter()
        .enumerate()
        .filter(|(_, l)| p.section_name.as_ref().is_none_or(|s| *s == l.name))
        .filter(|(_, l)| p.port.is_none_or(|port| i32::from(l.bind.port) == port))
        .collect();
    if named.is_empty() {
        return Verdict::no(
            "NoMatchingParent",
            "no listener has that sectionName or port",
        );
    }
    let mut allowed = 0;
    let mut attached = 0;
    for (i, l) in named {
        if !l.attachable
            || !l.takes_http_routes
            || !namespace_allowed(w, &l.from, &gw.namespace, &k.0)
        {
            continue;
        }
        allowed += 1;
        let hosts = effective_hosts(r, &l.host);
        if hosts.is_empty() {
            continue;
        }
        attached += 1;
        part.attached.push((gk.clone(), i));
        if !l.serving {
            continue;
        }
        for h in &hosts {
            part.push((l.bind, &l.host), h, entries(k, r, rules));
        }
    }
    match (allowed, attached) {
        (0, _) => Verdict::no(
            "NotAllowedByListeners",
            "no listener allows this route (namespace or kind)",
        ),
        (_, 0) => Verdict::no(
            "NoMatchingListenerHostname",
            "no hostname of the route matches a listener's",
        ),
        _ => Verdict::yes("Accepted"),
    }
}

/// The route's entries: one per match of each rule.
fn entries(k: &Key, r: &HTTPRoute, rules: &[Arc<Rule>]) -> Vec<Entry> {
    let created = r
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_second());
    let mut out = Vec::new();
    for (ri, (spec, rule)) in r.spec.rules.iter().zip(rules).enumerate() {
        let matches = rules::matches_of(spec);
        for (mi, m) in matches.into_iter().enumerate() {
            let order = Order {
                created,
                route: format!("{}/{}", k.0, k.1),
                rule: ri,
                index: mi,
            };
            out.push(Entry {
                m,
                order,
                rule: rule.clone(),
            });
        }
    }
    out
}

/// The route's hostnames as this listener serves them (none: it does not
/// attach here).
fn effective_hosts(r: &HTTPRoute, listener: &Host) -> Vec<Host> {
    if r.spec.hostnames.is_empty() {
        return vec![listener.clone()];
    }
    let mut out: Vec<Host> = r
        .spec
        .hostnames
        .iter()
        .filter_map(|h| Host::gateway(Some(h)).intersect(listener))
        .collect();
    out.sort();
    out.dedup();
    out
}

fn namespace_allowed(w: &World, from: &From, gw_ns: &str, route_ns: &str) -> bool {
    match from {
        From::Same => gw_ns == route_ns,
        From::All => true,
        From::Selector(sel) => w.namespaces.get(route_ns).is_some_and(|ns| {
            let labels = ns.metadata.labels.clone().unwrap_or_default();
            podnet_api::selector::matches(sel, &labels)
        }),
    }
}
