//! One HTTPRoute's rules compiled: matches, filters, weighted backends
//! (each reference checked: kind, ReferenceGrant, the Service and its
//! port), timeouts and retries; and the route's ResolvedRefs verdict.

use std::sync::Arc;
use std::time::Duration;

use podnet_api::gateway::route::{
    BackendObjectReference, HTTPHeaderFilter, HTTPPathModifier, HTTPRouteFilter, HTTPRouteMatch,
    HTTPRouteRule,
};
use podnet_api::gateway::HTTPRoute;

use super::{Key, Verdict, World};
use crate::model::matcher::{anchored, Match, PathMatch, ValueMatch};
use crate::model::{
    Backend, BackendKey, HeaderEdit, PathEdit, Redirect, Retry, Rewrite, RouteRef, Rule,
};

pub struct Compiled {
    pub rules: Vec<Arc<Rule>>,
    pub resolved: Verdict,
}

pub fn compile(w: &World, k: &Key, r: &HTTPRoute) -> Compiled {
    let mut resolved = Verdict::yes("ResolvedRefs");
    let mut rules = Vec::new();
    for (i, spec) in r.spec.rules.iter().enumerate() {
        let route = RouteRef {
            kind: "HTTPRoute",
            namespace: k.0.clone(),
            name: k.1.clone(),
            rule: i,
        };
        rules.push(Arc::new(rule(w, route, spec, &mut resolved)));
    }
    Compiled { rules, resolved }
}

fn rule(w: &World, route: RouteRef, spec: &HTTPRouteRule, resolved: &mut Verdict) -> Rule {
    let mut out = Rule {
        request_headers: None,
        response_headers: None,
        redirect: None,
        rewrite: None,
        backends: Vec::new(),
        mirrors: Vec::new(),
        timeout: spec
            .timeouts
            .as_ref()
            .and_then(|t| t.request.as_deref())
            .and_then(duration),
        backend_timeout: spec
            .timeouts
            .as_ref()
            .and_then(|t| t.backend_request.as_deref())
            .and_then(duration),
        retry: spec.retry.as_ref().map(|r| Retry {
            codes: r
                .codes
                .iter()
                .filter_map(|c| u16::try_from(*c).ok())
                .collect(),
            attempts: r.attempts.map_or(1, |a| a.max(0) as u32),
            backoff: r.backoff.as_deref().and_then(duration),
        }),
        route,
    };
    let mut broken = false;
    let ns = out.route.namespace.clone();
    for f in &spec.filters {
        broken |= !filter(w, &ns, f, &mut out, resolved);
    }
    for b in &spec.backend_refs {
        let key = backend(w, &ns, &b.backend, resolved);
        let mut be = Backend {
            key,
            weight: b.weight.unwrap_or(1).max(0) as u32,
            request_headers: None,
            response_headers: None,
        };
        for f in &b.filters {
            match f.type_.as_str() {
                "RequestHeaderModifier" => {
                    be.request_headers = f.request_header_modifier.as_ref().map(headers)
                }
                "ResponseHeaderModifier" => {
                    be.response_headers = f.response_header_modifier.as_ref().map(headers)
                }
                _ => broken = true,
            }
        }
        out.backends.push(be);
    }
    if broken {
        // A filter podnet cannot apply: the rule answers 500 rather than
        // skip it.
        out.backends = vec![Backend {
            key: None,
            weight: 1,
            request_headers: None,
            response_headers: None,
        }];
        out.redirect = None;
    }
    out
}

/// Applies one filter to `out`; false if podnet cannot honour it.
fn filter(
    w: &World,
    ns: &str,
    f: &HTTPRouteFilter,
    out: &mut Rule,
    resolved: &mut Verdict,
) -> bool {
    match f.type_.as_str() {
        "RequestHeaderModifier" => {
            out.request_headers = f.request_header_modifier.as_ref().map(headers)
        }
        "ResponseHeaderModifier" => {
            out.response_headers = f.response_header_modifier.as_ref().map(headers)
        }
        "RequestRedirect" => {
            let Some(r) = &f.request_redirect else {
                return false;
            };
            out.redirect = Some(Redirect {
                scheme: r.scheme.clone(),
                hostname: r.hostname.clone(),
                path: r.path.as_ref().map(path_edit),
                port: r.port.and_then(|p| u16::try_from(p).ok()),
                status: r
                    .status_code
                    .and_then(|c| u16::try_from(c).ok())
                    .unwrap_or(302),
            });
        }
        "URLRewrite" => {
            let Some(r) = &f.url_rewrite else {
                return false;
            };
            out.rewrite = Some(Rewrite {
                hostname: r.hostname.clone(),
                path: r.path.as_ref().map(path_edit),
            });
        }
        "RequestMirror" => {
            let Some(m) = &f.request_mirror else {
                return false;
            };
            let share = match (&m.fraction, m.percent) {
                (Some(fr), _) => fr.numerator as f64 / fr.denominator.unwrap_or(100).max(1) as f64,
                (None, Some(p)) => p as f64 / 100.0,
                (None, None) => 1.0,
            };
            if let Some(k) = backend(w, ns, &m.backend_ref, resolved) {
                out.mirrors.push((k, share.clamp(0.0, 1.0)));
            }
        }
        _ => return false,
    }
    true
}

fn path_edit(p: &HTTPPathModifier) -> PathEdit {
    match p.type_.as_str() {
        "ReplaceFullPath" => PathEdit::Full(p.replace_full_path.clone().unwrap_or_default()),
        _ => PathEdit::Prefix(p.replace_prefix_match.clone().unwrap_or_default()),
    }
}

fn headers(f: &HTTPHeaderFilter) -> HeaderEdit {
    let pair = |h: &podnet_api::gateway::route::HTTPHeader| {
        Some((
            http::HeaderName::try_from(h.name.as_str()).ok()?,
            http::HeaderValue::try_from(h.value.as_str()).ok()?,
        ))
    };
    HeaderEdit {
        set: f.set.iter().filter_map(pair).collect(),
        add: f.add.iter().filter_map(pair).collect(),
        remove: f
            .remove
            .iter()
            .filter_map(|n| http::HeaderName::try_from(n.as_str()).ok())
            .collect(),
    }
}

/// A backend reference checked; None (and `resolved` set to why) when it
/// cannot be used.
fn backend(
    w: &World,
    route_ns: &str,
    b: &BackendObjectReference,
    resolved: &mut Verdict,
) -> Option<BackendKey> {
    let mut fail = |reason: &'static str, msg: String| {
        if resolved.ok {
            *resolved = Verdict::no(reason, msg);
        }
        None
    };
    if !b.is_service() {
        return fail(
            "InvalidKind",
            format!("backend {} is not a Service", b.name),
        );
    }
    let ns = b.namespace.clone().unwrap_or_else(|| route_ns.to_string());
    if !w.granted(("HTTPRoute", route_ns), ("", "Service", &ns, &b.name)) {
        return fail(
            "RefNotPermitted",
            format!(
                "no ReferenceGrant in {ns} lets HTTPRoutes in {route_ns} use Service {}",
                b.name
            ),
        );
    }
    let Some(svc) = w.services.get(&(ns.clone(), b.name.clone())) else {
        return fail(
            "BackendNotFound",
            format!("Service {ns}/{} does not exist", b.name),
        );
    };
    let port = b.port.unwrap_or(0);
    let has = svc
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .any(|p| p.port == port);
    if !has {
        return fail(
            "BackendNotFound",
            format!("Service {ns}/{} has no port {port}", b.name),
        );
    }
    Some(BackendKey {
        namespace: ns,
        service: b.name.clone(),
        port: port as u16,
    })
}

/// A rule's matches (none given: everything).
pub fn matches_of(spec: &HTTPRouteRule) -> Vec<Match> {
    match spec.matches.as_deref() {
        None | Some([]) => vec![Match::any()],
        Some(ms) => ms.iter().filter_map(one_match).collect(),
    }
}

fn value(ty: Option<&str>, v: &str) -> Option<ValueMatch> {
    Some(match ty {
        Some("RegularExpression") => ValueMatch::Regex(anchored(v).ok()?),
        _ => ValueMatch::Exact(v.to_string()),
    })
}

fn one_match(m: &HTTPRouteMatch) -> Option<Match> {
    let path = match &m.path {
        None => PathMatch::Prefix("/".into()),
        Some(p) => {
            let v = p.value.clone().unwrap_or_else(|| "/".into());
            match p.type_.as_deref() {
                Some("Exact") => PathMatch::Exact(v),
                Some("RegularExpression") => PathMatch::Regex(anchored(&v).ok()?),
                _ => PathMatch::Prefix(v),
            }
        }
    };
    let mut headers = Vec::new();
    for h in &m.headers {
        headers.push((
            h.name.to_ascii_lowercase(),
            value(h.type_.as_deref(), &h.value)?,
        ));
    }
    let mut query = Vec::new();
    for q in &m.query_params {
        query.push((q.name.clone(), value(q.type_.as_deref(), &q.value)?));
    }
    let method = match &m.method {
        Some(s) => Some(http::Method::from_bytes(s.as_bytes()).ok()?),
        None => None,
    };
    Some(Match {
        path,
        headers,
        query,
        method,
    })
}

/// A Gateway API duration: "1h", "30m", "10s", "500ms", combined
/// ("1m30s"); "0s" is no limit.
pub fn duration(s: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = [("ms", 2), ("h", 1), ("m", 1), ("s", 1)]
            .into_iter()
            .find(|(u, _)| rest.starts_with(u))?;
        total += match unit {
            "ms" => Duration::from_millis(n),
            "h" => Duration::from_secs(n * 3600),
            "m" => Duration::from_secs(n * 60),
            _ => Duration::from_secs(n),
        };
        rest = &rest[len..];
    }
    (!total.is_zero()).then_some(total)
}
