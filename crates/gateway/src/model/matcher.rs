//! One rule's match (path, headers, query parameters, method), how it is
//! tested against a request, and the Gateway API's precedence between
//! matches: Exact path, then regular expression, then the longest
//! prefix; then a method; then more header matches; then more query
//! matches; ties go to the older route, then the route's name, then the
//! rule's order.

use std::cmp::Ordering;

use regex::Regex;

/// How a path is compared.
#[derive(Debug, Clone)]
pub enum PathMatch {
    Exact(String),
    /// Element-wise: `/foo` matches `/foo`, `/foo/` and `/foo/bar`, not
    /// `/foobar` (Gateway API PathPrefix and Ingress Prefix alike).
    Prefix(String),
    /// Anchored at both ends ([`anchored`]): the whole path must match.
    Regex(Regex),
}

/// A regular expression that must match a whole value (as Envoy's
/// `safe_regex` does), so `/v1` does not match `/a/v1/b`.
pub fn anchored(pattern: &str) -> Result<Regex, regex::Error> {
    Regex::new(&format!("^(?:{pattern})$"))
}

impl PathMatch {
    fn rank(&self) -> (u8, usize) {
        match self {
            PathMatch::Exact(p) => (3, p.len()),
            PathMatch::Regex(r) => (2, r.as_str().len()),
            PathMatch::Prefix(p) => (1, p.len()),
        }
    }

    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathMatch::Exact(p) => path == p,
            PathMatch::Regex(r) => r.is_match(path),
            PathMatch::Prefix(p) => {
                let p = p.trim_end_matches('/');
                p.is_empty()
                    || (path.starts_with(p)
                        && matches!(path.as_bytes().get(p.len()), None | Some(b'/')))
            }
        }
    }

    /// The matched prefix, for ReplacePrefixMatch.
    pub fn prefix(&self) -> Option<&str> {
        match self {
            PathMatch::Prefix(p) => Some(p),
            _ => None,
        }
    }
}

impl std::fmt::Display for PathMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathMatch::Exact(p) => write!(f, "path Exact {p}"),
            PathMatch::Prefix(p) => write!(f, "path PathPrefix {p}"),
            PathMatch::Regex(r) => write!(f, "path RegularExpression {}", r.as_str()),
        }
    }
}

impl std::fmt::Display for Match {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.path)?;
        if let Some(m) = &self.method {
            write!(f, ", method {m}")?;
        }
        for (n, _) in &self.headers {
            write!(f, ", header {n}")?;
        }
        for (n, _) in &self.query {
            write!(f, ", query {n}")?;
        }
        Ok(())
    }
}

/// A header or query value test.
#[derive(Debug, Clone)]
pub enum ValueMatch {
    Exact(String),
    /// Anchored, as paths are.
    Regex(Regex),
}

impl ValueMatch {
    pub fn matches(&self, v: &str) -> bool {
        match self {
            ValueMatch::Exact(e) => v == e,
            ValueMatch::Regex(r) => r.is_match(v),
        }
    }
}

/// One match of a rule; every present part must hold.
#[derive(Debug, Clone)]
pub struct Match {
    pub path: PathMatch,
    /// Lowercase names.
    pub headers: Vec<(String, ValueMatch)>,
    pub query: Vec<(String, ValueMatch)>,
    pub method: Option<http::Method>,
}

/// What a match is tested against.
pub struct Request<'a> {
    pub method: &'a http::Method,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a http::HeaderMap,
}

impl Match {
    pub fn any() -> Match {
        Match {
            path: PathMatch::Prefix("/".into()),
            headers: Vec::new(),
            query: Vec::new(),
            method: None,
        }
    }

    pub fn matches(&self, r: &Request) -> bool {
        self.path.matches(r.path)
            && self.method.as_ref().is_none_or(|m| m == r.method)
            && self.headers.iter().all(|(n, v)| {
                // Several values of one header are one comma-joined value.
                let vals: Vec<&str> = r
                    .headers
                    .get_all(n)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .collect();
                !vals.is_empty() && v.matches(&vals.join(","))
            })
            && self.query.iter().all(|(n, v)| {
                // The first occurrence of a parameter counts.
                query_value(r.query.unwrap_or(""), n).is_some_and(|q| v.matches(&q))
            })
    }

    /// Higher is tried first.
    pub fn specificity(&self) -> (u8, usize, bool, usize, usize) {
        let (kind, len) = self.path.rank();
        (
            kind,
            len,
            self.method.is_some(),
            self.headers.len(),
            self.query.len(),
        )
    }
}

/// The first value of query parameter `name` (exact, case-sensitive
/// name), percent-decoded.
fn query_value(q: &str, name: &str) -> Option<String> {
    q.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (percent_decode(k) == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b'+', ..) => {
                out.push(b' ');
                i += 1;
            }
            (c, ..) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The tie-breakers between matches of equal specificity: the route's
/// age (older first), its namespace/name, then rule and match order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Order {
    pub created: i64,
    pub route: String,
    pub rule: usize,
    pub index: usize,
}

/// Sorts most specific first.
pub fn by_precedence(a: (&Match, &Order), b: (&Match, &Order)) -> Ordering {
    b.0.specificity()
        .cmp(&a.0.specificity())
        .then_with(|| a.1.cmp(b.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(path: &'a str, q: Option<&'a str>, h: &'a http::HeaderMap) -> Request<'a> {
        Request {
            method: &http::Method::GET,
            path,
            query: q,
            headers: h,
        }
    }

    #[test]
    fn prefixes_match_whole_segments() {
        let p = PathMatch::Prefix("/foo".into());
        let h = http::HeaderMap::new();
        for (path, want) in [
            ("/foo", true),
            ("/foo/", true),
            ("/foo/bar", true),
            ("/foobar", false),
            ("/", false),
        ] {
            assert_eq!(p.matches(path), want, "{path}");
            let _ = req(path, None, &h);
        }
        assert!(PathMatch::Prefix("/foo/".into()).matches("/foo"));
        assert!(PathMatch::Prefix("/".into()).matches("/anything"));
        let r = PathMatch::Regex(anchored("/v[0-9]+/.*").unwrap());
        assert!(r.matches("/v2/x"));
        assert!(!r.matches("/a/v2/x"), "a regex matches the whole path");
    }

    #[test]
    fn headers_and_query_parameters() {
        let mut h = http::HeaderMap::new();
        h.insert("version", "two".parse().unwrap());
        let m = Match {
            path: PathMatch::Prefix("/".into()),
            headers: vec![("version".into(), ValueMatch::Exact("two".into()))],
            query: vec![("animal".into(), ValueMatch::Exact("whale".into()))],
            method: None,
        };
        assert!(m.matches(&req("/", Some("animal=whale&x=1"), &h)));
        assert!(!m.matches(&req("/", Some("animal=dolphin"), &h)));
        assert!(
            m.matches(&req("/", Some("animal=whale&animal=dolphin"), &h)),
            "the first value counts"
        );
        assert!(!m.matches(&req("/", Some("animal=whale"), &http::HeaderMap::new())));
    }

    #[test]
    fn precedence_follows_the_spec() {
        let o = |created, route: &str, rule| Order {
            created,
            route: route.into(),
            rule,
            index: 0,
        };
        let pre = |p: &str| Match {
            path: PathMatch::Prefix(p.into()),
            ..Match::any()
        };
        let exact = Match {
            path: PathMatch::Exact("/a".into()),
            ..Match::any()
        };
        let mut with_header = pre("/a");
        with_header
            .headers
            .push(("x".into(), ValueMatch::Exact("1".into())));
        let mut v = [
            (pre("/"), o(1, "a/r", 0)),
            (pre("/a"), o(5, "a/r", 1)),
            (pre("/a"), o(2, "z/r", 0)),
            (with_header, o(9, "a/r", 2)),
            (exact, o(9, "b/r", 0)),
        ];
        v.sort_by(|a, b| by_precedence((&a.0, &a.1), (&b.0, &b.1)));
        let got: Vec<(String, usize)> = v.iter().map(|(_, o)| (o.route.clone(), o.rule)).collect();
        assert_eq!(
            got,
            [
                ("b/r".into(), 0),
                ("a/r".into(), 2),
                ("z/r".into(), 0),
                ("a/r".into(), 1),
                ("a/r".into(), 0)
            ]
        );
    }
}
