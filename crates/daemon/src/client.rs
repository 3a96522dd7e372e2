//! The other end of the daemons' HTTP: one blocking GET, for the tools and
//! tests that poll `/metrics`, `/readyz`, `/healthz` or `/flows` (podnet's
//! own, or etcd's, CoreDNS's and kube-proxy's), often from inside a lab
//! node's or a test's network namespace.
//!
//! It speaks HTTP/1.0, one request per connection, like the server in this
//! crate: the answer ends when the server closes the connection, so there is
//! no `Content-Length` or chunked body to follow and no HTTP stack to pull
//! in. Callers choose their timeouts (a readiness poll gives up on a port
//! in a fifth of a second; a scrape waits seconds) and what a failure
//! means to them, so every failure comes back typed.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use podnet_kernel::{KernelError, Netns};

/// One answer: the status code and the body (bytes that are not UTF-8
/// replaced, as metrics and JSON never have them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

/// Why a GET got no answer, with the address and path it was for.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The namespace to connect from could not be entered.
    #[error("GET http://{addr}{path}: {source}")]
    Netns {
        addr: SocketAddr,
        path: String,
        #[source]
        source: KernelError,
    },
    /// Connecting, sending or reading failed (refused, timed out, reset):
    /// `source` tells which, for callers that report the cause.
    #[error("GET http://{addr}{path}: {source}")]
    Io {
        addr: SocketAddr,
        path: String,
        #[source]
        source: io::Error,
    },
    /// Something answered, but not with an HTTP status line and head.
    #[error("GET http://{addr}{path}: not an HTTP answer: {start:?}")]
    Malformed {
        addr: SocketAddr,
        path: String,
        start: String,
    },
}

/// A GET's settings: the namespace to connect from and the timeouts. Built
/// once per caller (`HttpGet::new(timeout).netns(ns)`), used for any
/// number of requests.
#[derive(Debug, Clone, Copy)]
pub struct HttpGet<'a> {
    netns: Option<&'a Netns>,
    connect_timeout: Duration,
    read_timeout: Duration,
    /// The Host header (default: the address).
    host: Option<&'a str>,
}

impl<'a> HttpGet<'a> {
    /// From this thread's namespace, `timeout` for the connect and again
    /// for each read.
    pub fn new(timeout: Duration) -> HttpGet<'a> {
        HttpGet {
            netns: None,
            connect_timeout: timeout,
            read_timeout: timeout,
            host: None,
        }
    }

    /// Names `host` in the Host header (a virtual host behind one address,
    /// as an HTTP router routes by it).
    pub fn host(self, host: &'a str) -> HttpGet<'a> {
        HttpGet {
            host: Some(host),
            ..self
        }
    }

    /// A different bound for the connect: short when a refused or silent
    /// port only means "not up yet" and the caller polls again.
    pub fn connect_timeout(self, timeout: Duration) -> HttpGet<'a> {
        HttpGet {
            connect_timeout: timeout,
            ..self
        }
    }

    /// Connects from inside `ns` when given (the socket stays usable
    /// outside it: only the connect needs the namespace).
    pub fn netns(self, ns: Option<&'a Netns>) -> HttpGet<'a> {
        HttpGet { netns: ns, ..self }
    }

    /// `GET path` on `addr`: the answer, whatever its status.
    pub fn get(&self, addr: SocketAddr, path: &str) -> Result<Response, HttpError> {
        let io_err = |source| HttpError::Io {
            addr,
            path: path.to_string(),
            source,
        };
        let connect = || TcpStream::connect_timeout(&addr, self.connect_timeout);
        let mut s = match self.netns {
            Some(ns) => ns.run(connect).map_err(|source| HttpError::Netns {
                addr,
                path: path.to_string(),
                source,
            })?,
            None => connect(),
        }
        .map_err(io_err)?;
        s.set_read_timeout(Some(self.read_timeout))
            .map_err(io_err)?;
        let host = self.host.map_or_else(|| addr.to_string(), str::to_string);
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
            .map_err(io_err)?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).map_err(io_err)?;
        parse(&raw).ok_or_else(|| {
            let text = String::from_utf8_lossy(&raw);
            HttpError::Malformed {
                addr,
                path: path.to_string(),
                start: text.chars().take(80).collect(),
            }
        })
    }
}

/// The status and body of a whole answer; `None` without a status line
/// (`HTTP/1.x CODE ...`) or the blank line that ends the head.
fn parse(raw: &[u8]) -> Option<Response> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut status_line = head.split_whitespace();
    if !status_line.next()?.starts_with("HTTP/") {
        return None;
    }
    let status = status_line.next()?.parse().ok()?;
    Some(Response {
        status,
        body: body.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::thread;

    use super::*;

    /// A server on a free loopback port that answers one connection with
    /// `answer` (after reading the request's head) and returns the request.
    fn serve_once(answer: &'static [u8]) -> (SocketAddr, thread::JoinHandle<String>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let h = thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 512];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = c.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                req.extend_from_slice(&buf[..n]);
            }
            c.write_all(answer).unwrap();
            String::from_utf8(req).unwrap()
        });
        (addr, h)
    }

    #[test]
    fn status_and_body() {
        let (addr, h) = serve_once(b"HTTP/1.1 503 Service Unavailable\r\nA: b\r\n\r\nnot ready\n");
        let r = HttpGet::new(Duration::from_secs(5))
            .get(addr, "/readyz")
            .unwrap();
        assert_eq!(
            r,
            Response {
                status: 503,
                body: "not ready\n".into()
            }
        );
        assert_eq!(
            h.join().unwrap(),
            format!("GET /readyz HTTP/1.0\r\nHost: {addr}\r\n\r\n")
        );
    }

    #[test]
    fn not_http_is_malformed() {
        let (addr, h) = serve_once(b"SSH-2.0-OpenSSH\r\n");
        let e = HttpGet::new(Duration::from_secs(5))
            .get(addr, "/")
            .unwrap_err();
        assert!(matches!(e, HttpError::Malformed { .. }), "{e}");
        h.join().unwrap();
    }

    #[test]
    fn nothing_listening_is_an_io_error() {
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let e = HttpGet::new(Duration::from_secs(5))
            .get(addr, "/metrics")
            .unwrap_err();
        match e {
            HttpError::Io { source, .. } => {
                assert_eq!(source.kind(), io::ErrorKind::ConnectionRefused)
            }
            e => panic!("{e}"),
        }
    }

    #[test]
    fn a_silent_server_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = HttpGet::new(Duration::from_millis(100))
            .get(l.local_addr().unwrap(), "/")
            .unwrap_err();
        match e {
            HttpError::Io { source, .. } => assert!(
                matches!(
                    source.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ),
                "{source}"
            ),
            e => panic!("{e}"),
        }
    }
}
