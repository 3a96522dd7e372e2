//! What the Gateway API CRDs' schemas and CEL rules refuse at admission,
//! for the standalone mode (in a real cluster the API server refuses the
//! same). What only the implementation can judge (a missing backend, an
//! unsupported filter) is no admission error: it lands in the object's
//! status, and the rest of it keeps working.

use std::collections::BTreeSet;

use super::listener::{Gateway, Listener};
use super::route::{HTTPPathModifier, HTTPRoute, HTTPRouteFilter, HTTPRouteMatch};
use super::{GatewayClass, ReferenceGrant};
use crate::FieldError;

fn err(field: impl Into<String>, msg: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        msg: msg.into(),
    }
}

/// Hostnames as listeners and routes take them: a DNS name, optionally
/// starting with one `*.` label; no IP address, no port.
pub fn hostname(field: &str, h: &str, out: &mut Vec<FieldError>) {
    let rest = h.strip_prefix("*.").unwrap_or(h);
    let ok = !rest.is_empty()
        && h.len() <= 253
        && rest.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
        && rest.parse::<std::net::IpAddr>().is_err();
    if !ok {
        out.push(err(
            field,
            format!("{h:?} is not a lowercase DNS name (optionally starting with \"*.\")"),
        ));
    }
}

pub fn gateway_class(c: &GatewayClass) -> Vec<FieldError> {
    let mut out = Vec::new();
    let n = &c.spec.controller_name;
    if n.is_empty() || !n.contains('/') {
        out.push(err(
            "spec.controllerName",
            format!("{n:?} must be a domain-prefixed path, e.g. podnet.io/gateway"),
        ));
    }
    out
}

pub fn gateway(g: &Gateway) -> Vec<FieldError> {
    let mut out = Vec::new();
    if g.spec.gateway_class_name.is_empty() {
        out.push(err("spec.gatewayClassName", "required"));
    }
    if g.spec.listeners.is_empty() || g.spec.listeners.len() > 64 {
        out.push(err("spec.listeners", "between 1 and 64 listeners"));
    }
    let mut names = BTreeSet::new();
    for (i, l) in g.spec.listeners.iter().enumerate() {
        if !names.insert(l.name.as_str()) {
            out.push(err(
                format!("spec.listeners[{i}].name"),
                format!("{:?} is used twice", l.name),
            ));
        }
        listener(i, l, &mut out);
    }
    out
}

fn listener(i: usize, l: &Listener, out: &mut Vec<FieldError>) {
    let f = |s: &str| format!("spec.listeners[{i}].{s}");
    if l.name.is_empty() {
        out.push(err(f("name"), "required"));
    }
    if !(1..=65535).contains(&l.port) {
        out.push(err(f("port"), format!("{} is not in 1-65535", l.port)));
    }
    if let Some(h) = &l.hostname {
        hostname(&f("hostname"), h, out);
    }
    match l.protocol.as_str() {
        "HTTP" | "TCP" | "UDP" if l.tls.is_some() => {
            out.push(err(f("tls"), format!("must be unset for {}", l.protocol)))
        }
        "HTTPS" | "TLS" if l.tls.is_none() => {
            out.push(err(f("tls"), format!("required for {}", l.protocol)))
        }
        "HTTPS" => {
            let tls = l.tls.as_ref().expect("checked");
            let terminate = tls.mode.as_deref().unwrap_or("Terminate") == "Terminate";
            if terminate && tls.certificate_refs.is_empty() {
                out.push(err(
                    f("tls.certificateRefs"),
                    "at least one certificate when mode is Terminate",
                ));
            }
        }
        "" => out.push(err(f("protocol"), "required")),
        _ => {}
    }
}

pub fn http_route(r: &HTTPRoute) -> Vec<FieldError> {
    let mut out = Vec::new();
    if r.spec.parent_refs.len() > 32 {
        out.push(err("spec.parentRefs", "at most 32"));
    }
    for (i, h) in r.spec.hostnames.iter().enumerate() {
        hostname(&format!("spec.hostnames[{i}]"), h, &mut out);
    }
    for (i, rule) in r.spec.rules.iter().enumerate() {
        let at = format!("spec.rules[{i}]");
        for (j, m) in rule.matches.iter().flatten().enumerate() {
            route_match(&format!("{at}.matches[{j}]"), m, &mut out);
        }
        for (j, fl) in rule.filters.iter().enumerate() {
            filter(&format!("{at}.filters[{j}]"), fl, &mut out);
        }
        let redirect = rule.filters.iter().any(|f| f.type_ == "RequestRedirect");
        let rewrite = rule.filters.iter().any(|f| f.type_ == "URLRewrite");
        if redirect && rewrite {
            out.push(err(
                format!("{at}.filters"),
                "RequestRedirect and URLRewrite cannot both be set",
            ));
        }
        if redirect && !rule.backend_refs.is_empty() {
            out.push(err(
                format!("{at}.backendRefs"),
                "must be empty with a RequestRedirect filter",
            ));
        }
        for (j, b) in rule.backend_refs.iter().enumerate() {
            let bf = format!("{at}.backendRefs[{j}]");
            if !(0..=1_000_000).contains(&b.weight.unwrap_or(1)) {
                out.push(err(format!("{bf}.weight"), "must be in 0-1000000"));
            }
            if b.backend.is_service() && b.backend.port.is_none() {
                out.push(err(format!("{bf}.port"), "required for a Service"));
            }
            for (k, fl) in b.filters.iter().enumerate() {
                filter(&format!("{bf}.filters[{k}]"), fl, &mut out);
            }
        }
    }
    out
}

fn route_match(at: &str, m: &HTTPRouteMatch, out: &mut Vec<FieldError>) {
    if let Some(p) = &m.path {
        let ty = p.type_.as_deref().unwrap_or("PathPrefix");
        let v = p.value.as_deref().unwrap_or("/");
        match ty {
            "Exact" | "PathPrefix" if !v.starts_with('/') => {
                out.push(err(format!("{at}.path.value"), "must be an absolute path"))
            }
            "Exact" | "PathPrefix"
                if v.contains("//") || v.contains("/./") || v.contains("/../") =>
            {
                out.push(err(
                    format!("{at}.path.value"),
                    "must not contain //, /./ or /../",
                ))
            }
            "Exact" | "PathPrefix" | "RegularExpression" => {}
            other => out.push(err(
                format!("{at}.path.type"),
                format!("{other:?} is not Exact, PathPrefix or RegularExpression"),
            )),
        }
    }
    let mut seen = BTreeSet::new();
    for (k, h) in m.headers.iter().enumerate() {
        if !seen.insert(h.name.to_ascii_lowercase()) {
            out.push(err(
                format!("{at}.headers[{k}].name"),
                format!("{:?} is matched twice", h.name),
            ));
        }
    }
    if let Some(meth) = &m.method {
        const METHODS: [&str; 9] = [
            "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
        ];
        if !METHODS.contains(&meth.as_str()) {
            out.push(err(
                format!("{at}.method"),
                format!("{meth:?} is not an HTTP method"),
            ));
        }
    }
}

fn filter(at: &str, f: &HTTPRouteFilter, out: &mut Vec<FieldError>) {
    let present = [
        ("RequestHeaderModifier", f.request_header_modifier.is_some()),
        (
            "ResponseHeaderModifier",
            f.response_header_modifier.is_some(),
        ),
        ("RequestRedirect", f.request_redirect.is_some()),
        ("URLRewrite", f.url_rewrite.is_some()),
        ("RequestMirror", f.request_mirror.is_some()),
        ("ExtensionRef", f.extension_ref.is_some()),
    ];
    for (name, set) in present {
        if (name == f.type_) != set {
            let field = format!("{at}.{}", lower_first(name));
            out.push(err(
                field,
                match set {
                    true => format!("must be unset when type is {:?}", f.type_),
                    false => format!("required when type is {name}"),
                },
            ));
        }
    }
    if let Some(r) = &f.request_redirect {
        if let Some(c) = r.status_code {
            if ![301, 302, 303, 307, 308].contains(&c) {
                out.push(err(
                    format!("{at}.requestRedirect.statusCode"),
                    format!("{c} is not 301, 302, 303, 307 or 308"),
                ));
            }
        }
        if let Some(p) = &r.path {
            path_modifier(&format!("{at}.requestRedirect.path"), p, out);
        }
    }
    if let Some(p) = f.url_rewrite.as_ref().and_then(|u| u.path.as_ref()) {
        path_modifier(&format!("{at}.urlRewrite.path"), p, out);
    }
}

fn path_modifier(at: &str, p: &HTTPPathModifier, out: &mut Vec<FieldError>) {
    let ok = match p.type_.as_str() {
        "ReplaceFullPath" => p.replace_full_path.is_some() && p.replace_prefix_match.is_none(),
        "ReplacePrefixMatch" => p.replace_prefix_match.is_some() && p.replace_full_path.is_none(),
        _ => false,
    };
    if !ok {
        out.push(err(
            at,
            "type ReplaceFullPath with replaceFullPath, or ReplacePrefixMatch with replacePrefixMatch",
        ));
    }
}

fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_ascii_lowercase().to_string() + c.as_str(),
        None => String::new(),
    }
}

pub fn reference_grant(g: &ReferenceGrant) -> Vec<FieldError> {
    let mut out = Vec::new();
    if g.spec.from.is_empty() {
        out.push(err("spec.from", "at least one"));
    }
    if g.spec.to.is_empty() {
        out.push(err("spec.to", "at least one"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn route(spec: serde_json::Value) -> HTTPRoute {
        serde_json::from_value(json!({"metadata": {"name": "r"}, "spec": spec})).unwrap()
    }

    #[test]
    fn routes_are_checked_as_the_crd_does() {
        let ok = route(
            json!({"parentRefs": [{"name": "gw"}], "hostnames": ["*.example.com"],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/a"}}],
                       "backendRefs": [{"name": "web", "port": 80, "weight": 3}]}]}),
        );
        assert_eq!(http_route(&ok), vec![]);
        let bad = route(json!({"hostnames": ["Example.com", "1.2.3.4"],
            "rules": [{"matches": [{"path": {"type": "Exact", "value": "a"}, "method": "FETCH"}],
                       "filters": [{"type": "RequestRedirect"}, {"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplaceFullPath"}}}],
                       "backendRefs": [{"name": "web"}]}]}));
        let fields: Vec<String> = http_route(&bad).into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            [
                "spec.hostnames[0]",
                "spec.hostnames[1]",
                "spec.rules[0].matches[0].path.value",
                "spec.rules[0].matches[0].method",
                "spec.rules[0].filters[0].requestRedirect",
                "spec.rules[0].filters[1].urlRewrite.path",
                "spec.rules[0].filters",
                "spec.rules[0].backendRefs",
                "spec.rules[0].backendRefs[0].port",
            ]
        );
    }

    #[test]
    fn gateways_need_unique_listeners_and_certificates_for_https() {
        let g: Gateway = serde_json::from_value(json!({"metadata": {"name": "g"},
            "spec": {"gatewayClassName": "podnet", "listeners": [
                {"name": "a", "port": 80, "protocol": "HTTP"},
                {"name": "a", "port": 443, "protocol": "HTTPS", "tls": {"certificateRefs": []}},
                {"name": "b", "port": 0, "protocol": "HTTPS"}]}}))
        .unwrap();
        let got: Vec<String> = gateway(&g).into_iter().map(|e| e.to_string()).collect();
        assert_eq!(
            got,
            [
                "spec.listeners[1].name: \"a\" is used twice",
                "spec.listeners[1].tls.certificateRefs: at least one certificate when mode is Terminate",
                "spec.listeners[2].port: 0 is not in 1-65535",
                "spec.listeners[2].tls: required for HTTPS",
            ]
        );
    }
}
