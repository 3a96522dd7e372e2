//! HTTPRoutes attached to our Gateways: for each parent reference, the
//! listeners that take the route (section, port, allowed namespaces and
//! kinds, hostname intersection), the route's entries in their port
//! tables, and the route's verdicts towards that parent.

use std::collections::BTreeMap;
use std::sync::Arc;

use podnet_api::gateway::{HTTPRoute, ParentReference};

use super::listeners::{From, Gw, Open};
use super::{rules, Built, Key, ParentState, Verdict, World};
use crate::model::hosts::Host;
use crate::model::matcher::Order;
use crate::model::{Entry, Rule};

/// Attaches every route with a parent of ours.
pub fn attach(w: &World, gws: &mut BTreeMap<Key, Gw>, b: &mut Built) {
    for (k, r) in &w.routes {
        let mut parents = Vec::new();
        let compiled = rules::compile(w, k, r);
        for p in r.spec.parent_refs.iter().filter(|p| p.is_gateway()) {
            let gk = (
                p.namespace.clone().unwrap_or_else(|| k.0.clone()),
                p.name.clone(),
            );
            let Some(gw) = gws.get_mut(&gk) else { continue };
            let accepted = attach_to(w, k, r, p, gw, &compiled.rules, b);
            parents.push(ParentState {
                parent: p.clone(),
                accepted,
                resolved_refs: compiled.resolved.clone(),
            });
        }
        if !parents.is_empty() {
            b.backends.extend(
                compiled
                    .rules
                    .iter()
                    .flat_map(|r| r.backends.iter().filter_map(|b| b.key.clone())),
            );
            b.backends.extend(
                compiled
                    .rules
                    .iter()
                    .flat_map(|r| r.mirrors.iter().map(|m| m.0.clone())),
            );
            b.statuses
                .routes
                .insert(k.clone(), (r.metadata.generation, parents));
        }
    }
}

/// Attaches one route to the listeners of `gw` that take it; the verdict
/// is the route's Accepted condition for this parent.
fn attach_to(
    w: &World,
    k: &Key,
    r: &HTTPRoute,
    p: &ParentReference,
    gw: &mut Gw,
    rules: &[Arc<Rule>],
    b: &mut Built,
) -> Verdict {
    let named: Vec<&mut Open> = gw
        .listeners
        .iter_mut()
        .filter(|l| p.section_name.as_ref().is_none_or(|s| *s == l.name))
        .filter(|l| p.port.is_none_or(|port| i32::from(l.bind.port) == port))
        .collect();
    if named.is_empty() {
        return Verdict::no(
            "NoMatchingParent",
            "no listener has that sectionName or port",
        );
    }
    let mut allowed = 0;
    let mut attached = 0;
    for l in named {
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
        l.state.attached_routes += 1;
        if !l.serving {
            continue;
        }
        let t = b.table.ports.entry(l.bind).or_default();
        for h in &hosts {
            let list = t.hosts.entry(h);
            push_entries(list, k, r, rules);
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

fn push_entries(list: &mut Vec<Entry>, k: &Key, r: &HTTPRoute, rules: &[Arc<Rule>]) {
    let created = r
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_second());
    for (ri, (spec, rule)) in r.spec.rules.iter().zip(rules).enumerate() {
        let matches = rules::matches_of(spec);
        for (mi, m) in matches.into_iter().enumerate() {
            let order = Order {
                created,
                route: format!("{}/{}", k.0, k.1),
                rule: ri,
                index: mi,
            };
            list.push(Entry {
                m,
                order,
                rule: rule.clone(),
            });
        }
    }
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
