//! The servers a test starts: a free port to put one on, and one plain
//! HTTP GET for the health and metrics endpoints of etcd and of podnet's
//! daemons, from this namespace or from inside another.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use podnet_daemon::{HttpError, HttpGet};
use podnet_kernel::Netns;

/// How long a connect or a read may take before the GET counts as
/// unanswered (the callers poll, so this only bounds one try).
const TIMEOUT: Duration = Duration::from_secs(5);

/// `GET PATH` over HTTP/1.0 to `addr`, connected from inside `ns` when
/// given: the status code and the body, or `None` when nothing answers
/// (a daemon still starting, or gone). A namespace that cannot be entered
/// is a broken test: it panics.
pub fn http_get(ns: Option<&Netns>, addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    match HttpGet::new(TIMEOUT).netns(ns).get(addr, path) {
        Ok(r) => Some((r.status, r.body)),
        Err(HttpError::Netns { source, .. }) => panic!("entering the namespace: {source:?}"),
        Err(_) => None,
    }
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
