//! Which route a request would take, and why (`podnet trace` of a URL):
//! the table, the listeners behind the port, the host pattern that chose
//! the entries, the first match in precedence order, the filters, and
//! the backends with their endpoints. Pure: the same lookup the data
//! plane makes, written out.

use std::net::SocketAddr;

use serde_json::{json, Value};

use super::build::Statuses;
use super::matcher::Request;
use super::{Bind, Endpoints, PathEdit, Table};

/// One explained request.
#[derive(Debug, Clone, PartialEq)]
pub struct Explained {
    pub bind: Bind,
    /// Who listens there: `Gateway NS/NAME listener L`, `Ingress`.
    pub listeners: Vec<String>,
    /// The host pattern whose entries were searched.
    pub host: Option<String>,
    /// Entries under that pattern, in precedence order.
    pub candidates: usize,
    pub route: Option<String>,
    pub matched: Option<String>,
    pub filters: Vec<String>,
    /// Service port, weight, endpoints.
    pub backends: Vec<(String, u32, Vec<SocketAddr>)>,
    /// What the client gets.
    pub outcome: String,
}

fn edit(e: &PathEdit) -> String {
    match e {
        PathEdit::Full(p) => format!("path to {p}"),
        PathEdit::Prefix(p) => format!("matched prefix to {p}"),
    }
}

/// Explains `r` for `host` on `bind`.
pub fn explain(
    t: &Table,
    s: &Statuses,
    eps: &Endpoints,
    bind: Bind,
    host: &str,
    r: &Request,
    ingress_ports: &[u16],
) -> Explained {
    let mut out = Explained {
        bind,
        listeners: listeners(s, bind, ingress_ports),
        host: None,
        candidates: 0,
        route: None,
        matched: None,
        filters: Vec::new(),
        backends: Vec::new(),
        outcome: String::new(),
    };
    let Some(pt) = t.ports.get(&bind) else {
        out.outcome = format!("connection refused: nothing serves {bind}");
        return out;
    };
    let Some((_, pattern, entries)) = pt.entries(host) else {
        out.outcome = format!("404: no route for host {host}");
        return out;
    };
    out.host = Some(pattern.to_string());
    out.candidates = entries.len();
    let Some(e) = entries.iter().find(|e| e.m.matches(r)) else {
        out.outcome = format!(
            "404: none of the {} entries for {pattern} matches",
            entries.len()
        );
        return out;
    };
    let rule = &e.rule;
    out.route = Some(rule.route.to_string());
    out.matched = Some(e.m.to_string());
    for (what, h) in [
        ("request headers", &rule.request_headers),
        ("response headers", &rule.response_headers),
    ] {
        if let Some(h) = h {
            out.filters.push(format!(
                "{what}: set {}, add {}, remove {}",
                h.set.len(),
                h.add.len(),
                h.remove.len()
            ));
        }
    }
    if let Some(rw) = &rule.rewrite {
        let host = rw.hostname.as_ref().map(|h| format!("host to {h}"));
        out.filters.push(format!(
            "URLRewrite: {}",
            [host, rw.path.as_ref().map(edit)]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for (k, share) in &rule.mirrors {
        out.filters
            .push(format!("RequestMirror to {k} ({:.0} %)", share * 100.0));
    }
    if let Some(rd) = &rule.redirect {
        out.outcome = format!("{} redirect", rd.status);
        return out;
    }
    for b in &rule.backends {
        let name = b
            .key
            .as_ref()
            .map_or_else(|| "(invalid reference)".to_string(), |k| k.to_string());
        let addrs = b
            .key
            .as_ref()
            .and_then(|k| eps.get(k))
            .map(|e| e.addrs.clone())
            .unwrap_or_default();
        out.backends.push((name, b.weight, addrs));
    }
    out.outcome = match (
        rule.total_weight(),
        out.backends.iter().any(|b| !b.2.is_empty()),
    ) {
        (0, _) => "500: every backend has weight 0".into(),
        (_, false) => "503 or 500: no backend has a ready endpoint or a valid reference".into(),
        _ => "proxied to one endpoint of a backend, chosen by weight".into(),
    };
    out
}

fn listeners(s: &Statuses, bind: Bind, ingress_ports: &[u16]) -> Vec<String> {
    let mut out: Vec<String> = s
        .gateways
        .iter()
        .filter(|(_, g)| g.address == bind.ip)
        .flat_map(|((ns, name), g)| {
            g.listeners
                .iter()
                .filter(|l| l.port == bind.port)
                .map(move |l| format!("Gateway {ns}/{name} listener {}", l.name))
        })
        .collect();
    if bind.ip.is_none() && ingress_ports.contains(&bind.port) && !s.ingresses.is_empty() {
        out.push("Ingresses".into());
    }
    out
}

impl Explained {
    pub fn text(&self) -> String {
        let mut s = format!("{:<10}{}\n", "on", self.bind);
        s += &format!(
            "{:<10}{}\n",
            "listener",
            if self.listeners.is_empty() {
                "-".into()
            } else {
                self.listeners.join("; ")
            }
        );
        if let Some(h) = &self.host {
            s += &format!(
                "{:<10}{h} ({} entries in precedence order)\n",
                "host", self.candidates
            );
        }
        if let (Some(r), Some(m)) = (&self.route, &self.matched) {
            s += &format!("{:<10}{r}, match: {m}\n", "route");
        }
        for f in &self.filters {
            s += &format!("{:<10}{f}\n", "filter");
        }
        for (b, w, eps) in &self.backends {
            let e: Vec<String> = eps.iter().map(|a| a.to_string()).collect();
            s += &format!(
                "{:<10}{b} weight {w}: {}\n",
                "backend",
                if e.is_empty() {
                    "no ready endpoint".into()
                } else {
                    e.join(", ")
                }
            );
        }
        s += &format!("{:<10}{}\n", "outcome", self.outcome);
        s
    }

    pub fn json(&self) -> Value {
        json!({
            "bind": self.bind.to_string(), "listeners": self.listeners, "host": self.host, "candidates": self.candidates,
            "route": self.route, "match": self.matched, "filters": self.filters,
            "backends": self.backends.iter().map(|(b, w, e)| json!({"backend": b, "weight": w, "endpoints": e.iter().map(|a| a.to_string()).collect::<Vec<_>>()})).collect::<Vec<_>>(),
            "outcome": self.outcome,
        })
    }
}
