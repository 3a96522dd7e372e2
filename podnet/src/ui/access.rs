//! Who may use `podnet ui`, decided on every request before anything is
//! read or run. The server listens on loopback, but loopback is shared by
//! every local user, and any web page the operator's browser opens can
//! send requests to it: cross-site, or through DNS rebinding (a name the
//! attacker owns, resolving to 127.0.0.1, so that the page's own origin
//! reaches this port). So:
//! - the `Host` header must name this server: `127.0.0.1:PORT`,
//!   `localhost:PORT`, `[::1]:PORT` or the listen address (when listening
//!   on every address: any address literal with this port). A rebound
//!   name is refused with 421 before anything is read;
//! - an `Origin` header, when sent, must be this server too (403): a page
//!   of another origin can neither act nor read;
//! - every API request carries the token drawn at start (32 random bytes)
//!   as `Authorization: Bearer`, compared in constant time (403 without
//!   it). The page reads it once from the URL printed at start, as
//!   Jupyter does, and keeps it in its tab's `sessionStorage`, which is
//!   scoped to scheme, host and port: a cookie would also be sent to
//!   every other port of 127.0.0.1, where another local user may listen;
//! - an action (a trace) is POST only (405 for GET), so no link, image or
//!   redirect can start one.
//!
//! The page itself (static HTML, no cluster data) is served without the
//! token; everything that reveals the cluster or acts needs it.

use std::net::{IpAddr, SocketAddr};

use subtle::ConstantTimeEq;

/// A request's head and body, as the checks and the routes read them.
pub struct Request {
    pub method: String,
    pub path: String,
    pub query: String,
    headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// Parses the request line and the headers (the text before the blank
    /// line); None when there is no request line.
    pub fn parse_head(head: &str) -> Option<Request> {
        let mut lines = head.split("\r\n");
        let mut first = lines.next()?.split_whitespace();
        let method = first.next()?.to_string();
        let target = first.next()?;
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let headers = lines
            .filter_map(|l| {
                let (k, v) = l.split_once(':')?;
                Some((k.trim().to_ascii_lowercase(), v.trim().to_string()))
            })
            .collect();
        Some(Request {
            method,
            path: path.to_string(),
            query: query.to_string(),
            headers,
            body: Vec::new(),
        })
    }

    /// Every value of header `name` (lowercase), in order.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The body's length, when the request declares one.
    pub fn content_length(&self) -> Option<usize> {
        self.all("content-length").first()?.parse().ok()
    }
}

/// Why a request is not served: the status and a body that says so.
#[derive(Debug, PartialEq)]
pub struct Refusal {
    pub code: u16,
    pub body: String,
}

/// The rules of one `podnet ui`: its names and its token.
pub struct Access {
    token: String,
    port: u16,
    /// `host:port` names this server answers to (lowercase).
    hosts: Vec<String>,
    /// Listening on every address: any address literal with our port is
    /// this server too (a literal cannot be rebound, only a name can).
    any_address: bool,
    /// Where the printed URL points.
    url_host: String,
}

fn literal(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => format!("[{a}]"),
    }
}

impl Access {
    /// The rules for a server bound to `listen`, with a fresh token from
    /// the operating system's random source.
    pub fn new(listen: SocketAddr) -> Result<Access, getrandom::Error> {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b)?;
        let token: String = b.iter().map(|x| format!("{x:02x}")).collect();
        Ok(Access::with_token(listen, token))
    }

    fn with_token(listen: SocketAddr, token: String) -> Access {
        let port = listen.port();
        let ip = listen.ip();
        let mut names = vec!["127.0.0.1".to_string(), "localhost".into(), "[::1]".into()];
        if !ip.is_loopback() && !ip.is_unspecified() {
            names.push(literal(ip));
        }
        let mut hosts: Vec<String> = names.iter().map(|n| format!("{n}:{port}")).collect();
        // A browser leaves out the scheme's default port.
        if port == 80 {
            hosts.extend(names);
        }
        let url_host = match ip {
            IpAddr::V6(a) if a.is_loopback() => format!("[::1]:{port}"),
            a if a.is_loopback() || a.is_unspecified() => format!("127.0.0.1:{port}"),
            a => format!("{}:{port}", literal(a)),
        };
        Access {
            token,
            port,
            hosts,
            any_address: ip.is_unspecified(),
            url_host,
        }
    }

    /// The URL to print at start: the page, handed the token.
    pub fn url(&self) -> String {
        format!("http://{}/?token={}", self.url_host, self.token)
    }

    fn names_us(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        self.hosts.contains(&host)
            || (self.any_address
                && host
                    .parse::<SocketAddr>()
                    .is_ok_and(|a| a.port() == self.port))
    }

    /// The checks every request passes first: `Host` names this server,
    /// and `Origin`, when sent, is this server.
    pub fn admit(&self, req: &Request) -> Result<(), Refusal> {
        let hosts = req.all("host");
        if hosts.len() != 1 || !self.names_us(hosts[0]) {
            return Err(Refusal {
                code: 421,
                body: format!(
                    "podnet ui: Host {:?} is not this server; it answers only to {}, so that \
                     a page reaching this port under another name (DNS rebinding) gets nothing\n",
                    hosts.join(", "),
                    self.hosts.join(", ")
                ),
            });
        }
        for o in req.all("origin") {
            let ours = o.strip_prefix("http://").is_some_and(|h| self.names_us(h));
            if !ours {
                return Err(Refusal {
                    code: 403,
                    body: format!(
                        "podnet ui: Origin {o:?} is not this server (http://{}); requests \
                         from other web pages are refused\n",
                        self.url_host
                    ),
                });
            }
        }
        Ok(())
    }

    /// Whether the request carries this start's token
    /// (`Authorization: Bearer TOKEN`, exactly once), compared in
    /// constant time.
    pub fn authorized(&self, req: &Request) -> bool {
        let got = req.all("authorization");
        got.len() == 1
            && got[0]
                .strip_prefix("Bearer ")
                .is_some_and(|t| bool::from(t.trim().as_bytes().ct_eq(self.token.as_bytes())))
    }

    /// The refusal for a request without the token.
    pub fn unauthorized(&self) -> Refusal {
        Refusal {
            code: 403,
            body: format!(
                "podnet ui: this needs the token podnet ui printed at start: open the URL it \
                 printed (http://{}/?token=…), or send Authorization: Bearer TOKEN\n",
                self.url_host
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(head: &str) -> Request {
        Request::parse_head(head).unwrap()
    }

    fn access(listen: &str) -> Access {
        Access::with_token(listen.parse().unwrap(), "t0k".into())
    }

    #[test]
    fn hosts_and_origins_must_name_this_server() {
        let a = access("127.0.0.1:10280");
        for h in [
            "127.0.0.1:10280",
            "localhost:10280",
            "LOCALHOST:10280",
            "[::1]:10280",
        ] {
            assert_eq!(
                a.admit(&req(&format!("GET / HTTP/1.1\r\nHost: {h}"))),
                Ok(())
            );
        }
        for head in [
            "GET / HTTP/1.1\r\nHost: evil.example:10280",
            "GET / HTTP/1.1\r\nHost: 127.0.0.1:10281",
            "GET / HTTP/1.1\r\nHost: 127.0.0.1",
            "GET / HTTP/1.1\r\nHost: 10.0.0.1:10280",
            "GET / HTTP/1.1",
            "GET / HTTP/1.1\r\nHost: 127.0.0.1:10280\r\nHost: evil.example",
        ] {
            assert_eq!(a.admit(&req(head)).unwrap_err().code, 421, "{head}");
        }
        let ok =
            "POST /api/trace HTTP/1.1\r\nHost: 127.0.0.1:10280\r\nOrigin: http://localhost:10280";
        assert_eq!(a.admit(&req(ok)), Ok(()));
        for o in [
            "http://evil.example",
            "http://127.0.0.1:8080",
            "https://127.0.0.1:10280",
            "null",
        ] {
            let head = format!("POST /api/trace HTTP/1.1\r\nHost: 127.0.0.1:10280\r\nOrigin: {o}");
            let r = a.admit(&req(&head)).unwrap_err();
            assert_eq!(r.code, 403, "{o}");
            assert!(r.body.contains(o), "{}", r.body);
        }
        // Port 80: a browser leaves it out.
        let a = access("127.0.0.1:80");
        assert_eq!(a.admit(&req("GET / HTTP/1.1\r\nHost: localhost")), Ok(()));
        // Every address: literals with our port, never another name.
        let a = access("0.0.0.0:10280");
        assert_eq!(
            a.admit(&req("GET / HTTP/1.1\r\nHost: 192.0.2.7:10280")),
            Ok(())
        );
        assert_eq!(
            a.admit(&req("GET / HTTP/1.1\r\nHost: evil.example:10280"))
                .unwrap_err()
                .code,
            421
        );
        assert!(a.url().starts_with("http://127.0.0.1:10280/?token="));
    }

    #[test]
    fn the_token_is_a_bearer_header_once() {
        let a = access("127.0.0.1:10280");
        let h = "GET /api/topology HTTP/1.1\r\nHost: 127.0.0.1:10280";
        assert!(a.authorized(&req(&format!("{h}\r\nAuthorization: Bearer t0k"))));
        assert!(!a.authorized(&req(h)));
        assert!(!a.authorized(&req(&format!("{h}\r\nAuthorization: Bearer t0"))));
        assert!(!a.authorized(&req(&format!("{h}\r\nAuthorization: Bearer t0kk"))));
        assert!(!a.authorized(&req(&format!("{h}\r\nAuthorization: t0k"))));
        assert!(!a.authorized(&req(&format!(
            "{h}\r\nAuthorization: Bearer x\r\nAuthorization: Bearer t0k"
        ))));
        // Fresh tokens: 64 hex digits, different each start.
        let l = "127.0.0.1:1".parse().unwrap();
        let (x, y) = (Access::new(l).unwrap(), Access::new(l).unwrap());
        assert_eq!(x.token.len(), 64);
        assert_ne!(x.token, y.token);
    }
}
