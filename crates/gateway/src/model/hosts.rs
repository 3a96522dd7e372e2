//! Hostnames: how a listener's hostname and a route's intersect (the
//! names a route serves on that listener), and the table a request's
//! Host header is looked up in: an exact name first, then the longest
//! wildcard suffix, then the catch-all.

use std::collections::HashMap;

/// A hostname pattern: `foo.example.com`, `*.example.com`, or any (`*`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    Any,
    Exact(String),
    /// The suffix after `*` (`.example.com`); matches one or more labels
    /// in front (Gateway API), or exactly one (`single`, Ingress).
    Wildcard {
        suffix: String,
        single: bool,
    },
}

impl Host {
    /// A Gateway API hostname (`*.x` matches any depth).
    pub fn gateway(h: Option<&str>) -> Host {
        match h {
            None | Some("") | Some("*") => Host::Any,
            Some(h) => match h.strip_prefix('*') {
                Some(suffix) => Host::Wildcard {
                    suffix: suffix.to_ascii_lowercase(),
                    single: false,
                },
                None => Host::Exact(h.to_ascii_lowercase()),
            },
        }
    }

    /// An Ingress host (`*.x` matches exactly one label).
    pub fn ingress(h: Option<&str>) -> Host {
        match Host::gateway(h) {
            Host::Wildcard { suffix, .. } => Host::Wildcard {
                suffix,
                single: true,
            },
            other => other,
        }
    }

    pub fn matches(&self, name: &str) -> bool {
        match self {
            Host::Any => true,
            Host::Exact(e) => e == name,
            Host::Wildcard { suffix, single } => {
                name.len() > suffix.len()
                    && name.ends_with(suffix.as_str())
                    && (!single || !name[..name.len() - suffix.len()].contains('.'))
            }
        }
    }

    /// The names both patterns accept, as one pattern (None: none).
    pub fn intersect(&self, other: &Host) -> Option<Host> {
        match (self, other) {
            (Host::Any, h) | (h, Host::Any) => Some(h.clone()),
            (Host::Exact(a), b) | (b, Host::Exact(a)) => {
                b.matches(a).then(|| Host::Exact(a.clone()))
            }
            (Host::Wildcard { suffix: a, .. }, Host::Wildcard { suffix: b, .. }) => {
                let (long, short) = if a.len() >= b.len() {
                    (self, b)
                } else {
                    (other, a)
                };
                let Host::Wildcard { suffix: l, .. } = long else {
                    unreachable!()
                };
                l.ends_with(short.as_str()).then(|| long.clone())
            }
        }
    }
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Any => f.write_str("*"),
            Host::Exact(e) => f.write_str(e),
            Host::Wildcard { suffix, .. } => write!(f, "*{suffix}"),
        }
    }
}

/// Values keyed by host pattern, looked up by a request's host.
#[derive(Debug, Clone)]
pub struct HostMap<T> {
    exact: HashMap<String, T>,
    /// Longest suffix first.
    wildcards: Vec<(Host, T)>,
    any: Option<T>,
}

impl<T> Default for HostMap<T> {
    fn default() -> Self {
        HostMap {
            exact: HashMap::new(),
            wildcards: Vec::new(),
            any: None,
        }
    }
}

impl<T: Default> HostMap<T> {
    /// The entry for `h`, made if new.
    pub fn entry(&mut self, h: &Host) -> &mut T {
        match h {
            Host::Any => self.any.get_or_insert_with(T::default),
            Host::Exact(e) => self.exact.entry(e.clone()).or_default(),
            Host::Wildcard { suffix, .. } => {
                let at = match self.wildcards.iter().position(|(w, _)| w == h) {
                    Some(i) => i,
                    None => {
                        let i = self.wildcards.partition_point(|(w, _)| match w {
                            Host::Wildcard { suffix: s, .. } => s.len() >= suffix.len(),
                            _ => true,
                        });
                        self.wildcards.insert(i, (h.clone(), T::default()));
                        i
                    }
                };
                &mut self.wildcards[at].1
            }
        }
    }
}

impl<T> HostMap<T> {
    /// Sets (Some) or removes (None) the value of pattern `h`.
    pub fn set(&mut self, h: &Host, v: Option<T>) {
        match (h, v) {
            (Host::Any, v) => self.any = v,
            (Host::Exact(e), Some(v)) => drop(self.exact.insert(e.clone(), v)),
            (Host::Exact(e), None) => drop(self.exact.remove(e)),
            (Host::Wildcard { suffix, .. }, v) => {
                let at = self.wildcards.iter().position(|(w, _)| w == h);
                match (at, v) {
                    (Some(i), Some(v)) => self.wildcards[i].1 = v,
                    (Some(i), None) => drop(self.wildcards.remove(i)),
                    (None, Some(v)) => {
                        let i = self.wildcards.partition_point(|(w, _)| match w {
                            Host::Wildcard { suffix: s, .. } => s.len() >= suffix.len(),
                            _ => true,
                        });
                        self.wildcards.insert(i, (h.clone(), v));
                    }
                    (None, None) => {}
                }
            }
        }
    }

    /// Every pattern with its value (exact names in no order).
    pub fn iter(&self) -> impl Iterator<Item = (Host, &T)> {
        self.exact
            .iter()
            .map(|(e, t)| (Host::Exact(e.clone()), t))
            .chain(self.wildcards.iter().map(|(w, t)| (w.clone(), t)))
            .chain(self.any.iter().map(|t| (Host::Any, t)))
    }

    /// Whether no pattern has a value.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcards.is_empty() && self.any.is_none()
    }

    /// The most specific entry for a request's host, with the pattern
    /// that chose it (for explaining a route).
    pub fn get_with_pattern(&self, host: &str) -> Option<(Host, &T)> {
        if let Some(t) = self.exact.get(host) {
            return Some((Host::Exact(host.to_string()), t));
        }
        if let Some((w, t)) = self.wildcards.iter().find(|(w, _)| w.matches(host)) {
            return Some((w.clone(), t));
        }
        self.any.as_ref().map(|t| (Host::Any, t))
    }

    /// The most specific entry for a request's host (lowercase, no port).
    pub fn get(&self, host: &str) -> Option<&T> {
        if let Some(t) = self.exact.get(host) {
            return Some(t);
        }
        self.wildcards
            .iter()
            .find(|(w, _)| w.matches(host))
            .map(|(_, t)| t)
            .or(self.any.as_ref())
    }
}

/// A request's host: the Host header (HTTP/1.1) or `:authority` (h2),
/// lowercased, without the port.
pub fn request_host(uri: &http::Uri, headers: &http::HeaderMap) -> String {
    let raw = uri
        .authority()
        .map(|a| a.host().to_string())
        .or_else(|| {
            headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(String::from)
        })
        .unwrap_or_default();
    let host = match raw.starts_with('[') {
        true => raw
            .split(']')
            .next()
            .map(|h| format!("{h}]"))
            .unwrap_or_default(),
        false => raw.split(':').next().unwrap_or_default().to_string(),
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_differ_between_gateway_api_and_ingress() {
        let g = Host::gateway(Some("*.example.com"));
        let i = Host::ingress(Some("*.example.com"));
        assert!(g.matches("a.example.com") && g.matches("a.b.example.com"));
        assert!(i.matches("a.example.com") && !i.matches("a.b.example.com"));
        assert!(!g.matches("example.com"));
    }

    #[test]
    fn listener_and_route_hostnames_intersect() {
        let h = |s: &str| Host::gateway(Some(s));
        assert_eq!(
            h("*.example.com").intersect(&h("foo.example.com")),
            Some(h("foo.example.com"))
        );
        assert_eq!(
            h("*.example.com").intersect(&h("*.foo.example.com")),
            Some(h("*.foo.example.com"))
        );
        assert_eq!(h("foo.example.com").intersect(&h("bar.example.com")), None);
        assert_eq!(h("*.example.com").intersect(&h("*.example.net")), None);
        assert_eq!(Host::Any.intersect(&h("x.y")), Some(h("x.y")));
    }

    #[test]
    fn the_most_specific_host_wins() {
        let mut m: HostMap<Vec<&str>> = HostMap::default();
        m.entry(&Host::Any).push("any");
        m.entry(&Host::gateway(Some("*.example.com"))).push("wild");
        m.entry(&Host::gateway(Some("*.foo.example.com")))
            .push("deeper");
        m.entry(&Host::gateway(Some("a.example.com"))).push("exact");
        assert_eq!(m.get("a.example.com"), Some(&vec!["exact"]));
        assert_eq!(m.get("b.foo.example.com"), Some(&vec!["deeper"]));
        assert_eq!(m.get("b.example.com"), Some(&vec!["wild"]));
        assert_eq!(m.get("other.net"), Some(&vec!["any"]));
    }

    #[test]
    fn request_hosts_lose_their_port() {
        let mut h = http::HeaderMap::new();
        h.insert("host", "Foo.Example.com:8080".parse().unwrap());
        assert_eq!(request_host(&"/x".parse().unwrap(), &h), "foo.example.com");
        assert_eq!(
            request_host(&"http://[::1]:80/".parse().unwrap(), &h),
            "[::1]"
        );
    }
}
