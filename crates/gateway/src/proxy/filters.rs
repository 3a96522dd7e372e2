//! A rule's filters applied to a request or response (pure): header
//! edits, URL rewrites and the Location of a redirect.

use http::header::HeaderMap;
use http::uri::PathAndQuery;

use crate::model::matcher::Match;
use crate::model::{HeaderEdit, PathEdit, Redirect, Rewrite};

/// Set replaces, add appends, remove deletes (in that order, as the
/// spec's examples read).
pub fn edit_headers(h: &mut HeaderMap, e: &HeaderEdit) {
    for (n, v) in &e.set {
        h.insert(n.clone(), v.clone());
    }
    for (n, v) in &e.add {
        h.append(n.clone(), v.clone());
    }
    for n in &e.remove {
        h.remove(n);
    }
}

/// The path after a ReplaceFullPath or ReplacePrefixMatch, given the
/// match that selected the rule.
pub fn edit_path(path: &str, edit: &PathEdit, m: &Match) -> String {
    match edit {
        PathEdit::Full(p) => p.clone(),
        PathEdit::Prefix(replacement) => {
            let prefix = m.path.prefix().unwrap_or("/").trim_end_matches('/');
            let rest = path.get(prefix.len()..).unwrap_or("");
            let rep = replacement.trim_end_matches('/');
            match (rep.is_empty(), rest.is_empty()) {
                (true, true) => "/".into(),
                (true, false) => rest.to_string(),
                (false, _) => format!("{rep}{rest}"),
            }
        }
    }
}

/// The request's new path-and-query and Host after a URLRewrite.
pub fn rewrite(pq: &PathAndQuery, rw: &Rewrite, m: &Match) -> (PathAndQuery, Option<String>) {
    let path = match &rw.path {
        Some(e) => edit_path(pq.path(), e, m),
        None => pq.path().to_string(),
    };
    let full = match pq.query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    (
        full.parse().unwrap_or_else(|_| pq.clone()),
        rw.hostname.clone(),
    )
}

/// Where a redirect sends the client: scheme, host and port from the
/// filter or the request; the port left out when it is the scheme's
/// default.
pub fn location(
    r: &Redirect,
    scheme: &str,
    host: &str,
    port: u16,
    pq: &PathAndQuery,
    m: &Match,
) -> String {
    let scheme_out = r.scheme.as_deref().unwrap_or(scheme);
    let host_out = r.hostname.as_deref().unwrap_or(host);
    let port_out = match (r.port, &r.scheme) {
        (Some(p), _) => p,
        // A scheme change without a port goes to the new scheme's default.
        (None, Some(_)) => default_port(scheme_out),
        (None, None) => port,
    };
    let authority = match port_out == default_port(scheme_out) {
        true => host_out.to_string(),
        false => format!("{host_out}:{port_out}"),
    };
    let path = match &r.path {
        Some(e) => edit_path(pq.path(), e, m),
        None => pq.path().to_string(),
    };
    match pq.query() {
        Some(q) => format!("{scheme_out}://{authority}{path}?{q}"),
        None => format!("{scheme_out}://{authority}{path}"),
    }
}

fn default_port(scheme: &str) -> u16 {
    match scheme {
        "https" => 443,
        _ => 80,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::matcher::PathMatch;

    fn prefix(p: &str) -> Match {
        Match {
            path: PathMatch::Prefix(p.into()),
            ..Match::any()
        }
    }

    #[test]
    fn prefix_replacement_keeps_the_rest_of_the_path() {
        let m = prefix("/prefix/one");
        for (path, rep, want) in [
            ("/prefix/one/two", "/one", "/one/two"),
            ("/prefix/one", "/one", "/one"),
            ("/prefix/one/", "/", "/"),
            ("/prefix/one/two", "/", "/two"),
            ("/prefix/one", "/", "/"),
        ] {
            assert_eq!(
                edit_path(path, &PathEdit::Prefix(rep.into()), &m),
                want,
                "{path} {rep}"
            );
        }
    }

    #[test]
    fn redirects_build_their_location() {
        let pq: PathAndQuery = "/a/b?x=1".parse().unwrap();
        let m = prefix("/a");
        let r = Redirect {
            scheme: Some("https".into()),
            status: 301,
            ..Default::default()
        };
        assert_eq!(
            location(&r, "http", "ex.com", 80, &pq, &m),
            "https://ex.com/a/b?x=1"
        );
        let r = Redirect {
            port: Some(8443),
            hostname: Some("other".into()),
            status: 302,
            ..Default::default()
        };
        assert_eq!(
            location(&r, "http", "ex.com", 80, &pq, &m),
            "http://other:8443/a/b?x=1"
        );
        let r = Redirect {
            path: Some(PathEdit::Prefix("/z".into())),
            status: 302,
            ..Default::default()
        };
        assert_eq!(
            location(&r, "http", "ex.com", 8080, &pq, &m),
            "http://ex.com:8080/z/b?x=1"
        );
    }

    #[test]
    fn headers_are_set_added_and_removed() {
        let mut h = HeaderMap::new();
        h.insert("a", "1".parse().unwrap());
        h.insert("gone", "x".parse().unwrap());
        let e = HeaderEdit {
            set: vec![("a".parse().unwrap(), "2".parse().unwrap())],
            add: vec![("a".parse().unwrap(), "3".parse().unwrap())],
            remove: vec!["gone".parse().unwrap()],
        };
        edit_headers(&mut h, &e);
        let a: Vec<_> = h.get_all("a").iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(a, ["2", "3"]);
        assert!(h.get("gone").is_none());
    }
}
