//! TCP forwarding from inside a node namespace to the machine's namespace,
//! so agents in lab nodes reach an etcd the user runs on this machine's
//! loopback (127.0.0.1 inside a node namespace is the node's own).
//!
//! The forwarder process lives in the machine's namespace; it binds its
//! listener inside the node namespace (sockets keep the namespace they were
//! made in) and dials out from its own.

use std::net::{Shutdown, TcpListener, TcpStream};

use podnet_kernel::Netns;

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}

/// Listens on `addr` inside namespace `ns` and forwards every connection
/// to `addr` as seen from here; `LISTEN=TARGET` listens on one address
/// and dials another. Runs until killed.
pub fn forward(ns: &str, addrs: &[String]) -> std::io::Result<()> {
    let netns = Netns::named(ns).map_err(std::io::Error::other)?;
    let mut threads = Vec::new();
    for addr in addrs {
        let (listen, target) = addr.split_once('=').unwrap_or((addr, addr));
        let l = netns
            .run(|| TcpListener::bind(listen))
            .map_err(std::io::Error::other)??;
        let target = target.to_string();
        threads.push(std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let target = target.clone();
                std::thread::spawn(move || {
                    if let Ok(out) = TcpStream::connect(&target) {
                        let _ = c.set_nodelay(true);
                        let _ = out.set_nodelay(true);
                        let (c2, o2) = match (c.try_clone(), out.try_clone()) {
                            (Ok(a), Ok(b)) => (a, b),
                            _ => return,
                        };
                        let t = std::thread::spawn(move || pipe(c2, o2));
                        pipe(out, c);
                        let _ = t.join();
                    }
                });
            }
        }));
    }
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

/// The host:port endpoints of an etcd store URL (empty for other stores).
pub fn etcd_endpoints(url: &str) -> Vec<String> {
    let rest = match url
        .strip_prefix("etcd://")
        .or_else(|| url.strip_prefix("etcds://"))
    {
        Some(r) => r,
        None => return vec![],
    };
    let hosts = rest.split('?').next().unwrap_or_default();
    hosts
        .split(',')
        .map(|h| h.trim().trim_end_matches('/').to_string())
        .filter(|h| !h.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn endpoints() {
        assert_eq!(
            super::etcd_endpoints("etcd://127.0.0.1:2379,10.0.0.1:2379"),
            vec!["127.0.0.1:2379", "10.0.0.1:2379"]
        );
        assert!(super::etcd_endpoints("sqlite:///x.db").is_empty());
    }
}
