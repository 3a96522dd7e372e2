//! The servers a test starts: a free port to put one on, and one plain
//! HTTP GET for the health and metrics endpoints of etcd and of podnet's
//! daemons, from this namespace or from inside another.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use podnet_kernel::Netns;

/// How long a connect or a read may take before the GET counts as
/// unanswered (the callers poll, so this only bounds one try).
const TIMEOUT: Duration = Duration::from_secs(5);

/// `GET PATH` over HTTP/1.0 to `addr`, connected from inside `ns` when
/// given: the status code and the body, or `None` when nothing answers
/// (a daemon still starting, or gone).
pub fn http_get(ns: Option<&Netns>, addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let connect = || TcpStream::connect_timeout(&addr, TIMEOUT);
    let mut s = match ns {
        Some(ns) => ns.run(connect).expect("entering the namespace"),
        None => connect(),
    }
    .ok()?;
    s.set_read_timeout(Some(TIMEOUT)).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((code, body))
}

/// A TCP port nothing listens on now, on the loopback of `ns` (or of this
/// process's namespace), for a server the test is about to start.
pub fn free_port(ns: Option<&Netns>) -> u16 {
    let bind = || {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
    };
    match ns {
        Some(ns) => ns.run(bind).expect("entering the namespace"),
        None => bind(),
    }
    .expect("a free port")
}
