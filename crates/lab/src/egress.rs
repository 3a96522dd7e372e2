//! The apiserver's way into the lab network: an HTTP CONNECT proxy on a
//! Unix socket, serving kube-apiserver's egress selector (`cluster`).
//!
//! The apiserver runs in the machine's namespace, where neither the nodes'
//! underlay addresses nor pod addresses are routed; it still has to reach
//! every kubelet on :10250 (exec, logs, port-forward) and, for its proxy
//! subresources, pods. kube-apiserver's `--egress-selector-config-file`
//! sends that traffic through an HTTP CONNECT proxy (the protocol
//! konnectivity speaks) on a Unix socket; this module is that proxy. The
//! socket lives on the shared filesystem, the process lives in the lab's
//! gateway namespace, on the underlay like a node, and dials from there.
//!
//! Who may ask: the socket is created mode 0600 under the lab's root-owned
//! directory, so only root (the apiserver) connects. What it dials: IP
//! literals only (no names to resolve), and only into the lab's underlay
//! and cluster networks, so the socket is no way out of the lab.

use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

use ipnet::IpNet;
use podnet_kernel::Netns;

/// The longest CONNECT request head accepted.
const MAX_HEAD: usize = 8192;
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a CONNECT request is refused, with the HTTP status it answers.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not a well-formed `CONNECT ip:port HTTP/1.x` head (400).
    BadRequest(String),
    /// A target outside the networks the proxy serves (403).
    Forbidden(SocketAddr),
}

/// The target of a CONNECT request head (everything up to the blank line),
/// if it is an IP literal inside one of `allowed`.
pub fn target(head: &str, allowed: &[IpNet]) -> Result<SocketAddr, Refusal> {
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (method, authority, version) = (parts.next(), parts.next(), parts.next());
    if method != Some("CONNECT") || !version.is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Err(Refusal::BadRequest(format!(
            "expected `CONNECT host:port HTTP/1.1`, got {line:?}"
        )));
    }
    let authority = authority.unwrap_or_default();
    let addr: SocketAddr = authority
        .parse()
        .map_err(|_| Refusal::BadRequest(format!("{authority:?} is not an IP address and port")))?;
    let ip: IpAddr = addr.ip();
    if !allowed.iter().any(|n| n.contains(&ip)) {
        return Err(Refusal::Forbidden(addr));
    }
    Ok(addr)
}

fn read_head(c: &mut UnixStream) -> std::io::Result<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    // Byte by byte: whatever follows the head belongs to the tunnel.
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_HEAD || c.read(&mut byte)? == 0 {
            return Err(std::io::Error::other("no complete request head"));
        }
        head.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// Copies until EOF or an error on either side, then runs `done` (the
/// half-close that tells the other side).
fn pipe(mut from: impl Read, mut to: impl Write, done: impl FnOnce()) {
    let _ = std::io::copy(&mut from, &mut to);
    done();
}

fn serve(mut c: UnixStream, allowed: &[IpNet]) {
    let _ = c.set_read_timeout(Some(DIAL_TIMEOUT));
    let Ok(head) = read_head(&mut c) else { return };
    let _ = c.set_read_timeout(None);
    let addr = match target(&head, allowed) {
        Ok(a) => a,
        Err(Refusal::BadRequest(why)) => {
            let _ = write!(c, "HTTP/1.1 400 Bad Request\r\n\r\n{why}\n");
            return;
        }
        Err(Refusal::Forbidden(a)) => {
            let _ = write!(c, "HTTP/1.1 403 Forbidden\r\n\r\n{a} is outside the lab\n");
            return;
        }
    };
    let out = match TcpStream::connect_timeout(&addr, DIAL_TIMEOUT) {
        Ok(o) => o,
        Err(e) => {
            let _ = write!(c, "HTTP/1.1 502 Bad Gateway\r\n\r\ndialing {addr}: {e}\n");
            return;
        }
    };
    let _ = out.set_nodelay(true);
    if c.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .is_err()
    {
        return;
    }
    let (Ok(c2), Ok(o2)) = (c.try_clone(), out.try_clone()) else {
        return;
    };
    let t = std::thread::spawn(move || {
        pipe(c2, &o2, || {
            let _ = o2.shutdown(Shutdown::Write);
        })
    });
    let c3 = c.try_clone();
    pipe(&out, c, || {
        if let Ok(c3) = c3 {
            let _ = c3.shutdown(Shutdown::Write);
        }
    });
    let _ = t.join();
}

/// Serves CONNECT requests on the Unix socket `socket`, dialing from
/// inside namespace `ns` to addresses in `allowed` only. Runs until killed.
pub fn run(ns: &str, socket: &Path, allowed: Vec<IpNet>) -> std::io::Result<()> {
    let netns = Netns::named(ns).map_err(std::io::Error::other)?;
    let _ = std::fs::remove_file(socket);
    let l = UnixListener::bind(socket)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    // Threads spawned inside the namespace are born in it: every dial
    // leaves from the gateway.
    netns
        .run(|| {
            for c in l.incoming().flatten() {
                let allowed = allowed.clone();
                std::thread::spawn(move || serve(c, &allowed));
            }
        })
        .map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets() -> Vec<IpNet> {
        vec![
            "192.168.200.0/24".parse().unwrap(),
            "10.244.0.0/16".parse().unwrap(),
        ]
    }

    #[test]
    fn connect_to_a_node_or_pod() {
        let h = "CONNECT 192.168.200.11:10250 HTTP/1.1\r\nHost: 192.168.200.11:10250\r\n\r\n";
        assert_eq!(
            target(h, &nets()),
            Ok("192.168.200.11:10250".parse().unwrap())
        );
        let h = "CONNECT 10.244.1.5:8080 HTTP/1.1\r\n\r\n";
        assert_eq!(target(h, &nets()), Ok("10.244.1.5:8080".parse().unwrap()));
    }

    #[test]
    fn refuses_other_methods_names_and_networks() {
        let bad = |h: &str| matches!(target(h, &nets()), Err(Refusal::BadRequest(_)));
        assert!(bad("GET / HTTP/1.1\r\n\r\n"));
        assert!(bad("CONNECT node1:10250 HTTP/1.1\r\n\r\n"));
        assert!(bad("CONNECT 192.168.200.11 HTTP/1.1\r\n\r\n"));
        assert!(bad("CONNECT 192.168.200.11:10250\r\n\r\n"));
        assert_eq!(
            target("CONNECT 127.0.0.1:2379 HTTP/1.1\r\n\r\n", &nets()),
            Err(Refusal::Forbidden("127.0.0.1:2379".parse().unwrap()))
        );
    }
}
