//! `podnet serve`: what runs inside every lab pod. It answers on each listed
//! TCP and UDP port with its pod name, with `NAMESPACE/POD` when asked
//! `whoami`, or with the client's address when asked `clientip` (like
//! agnhost's netexec), so a probe shows who answered and whether the source
//! address survived the trip. [`reach`] is the probe side that tells the
//! causes of a failure apart ([`Reach`]).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::time::Duration;

/// The request that [`reach`] sends: the answer is `NAMESPACE/POD`.
pub const WHOAMI: &str = "whoami";

/// One port to serve: number, protocol and, for the Pod's
/// `containerPorts[].name`, an optional name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    pub port: u16,
    pub udp: bool,
    pub name: Option<String>,
}

impl PortSpec {
    pub fn tcp(port: u16) -> PortSpec {
        PortSpec {
            port,
            udp: false,
            name: None,
        }
    }

    pub fn udp(port: u16) -> PortSpec {
        PortSpec {
            port,
            udp: true,
            name: None,
        }
    }

    pub fn named(self, name: &str) -> PortSpec {
        PortSpec {
            name: Some(name.to_string()),
            ..self
        }
    }

    /// `80/tcp`, as `podnet serve --ports` takes it.
    pub fn number_and_protocol(&self) -> String {
        format!("{}/{}", self.port, if self.udp { "udp" } else { "tcp" })
    }
}

/// Parses "80/tcp,81/udp,82" (tcp when no protocol is given), each entry
/// optionally named as a container port is: "serve-80-tcp=80/tcp". Names
/// are IANA service names (at most 15 characters: lowercase letters,
/// digits, inner single hyphens) and unique.
pub fn parse_ports(s: &str) -> Result<Vec<PortSpec>, String> {
    let ports: Vec<PortSpec> = s
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (name, p) = match p.split_once('=') {
                Some((n, rest)) => (Some(n.trim()), rest.trim()),
                None => (None, p),
            };
            if let Some(n) = name {
                if !podnet_api::validate::is_port_name(n) {
                    return Err(format!(
                        "invalid port name {n:?} in {s:?} (an IANA service name: at most 15 \
                         lowercase letters, digits and inner single hyphens)"
                    ));
                }
            }
            let (n, proto) = p.split_once('/').unwrap_or((p, "tcp"));
            let port: u16 = n
                .parse()
                .map_err(|_| format!("invalid port {n:?} in {s:?}"))?;
            if port == 0 {
                return Err(format!("port 0 in {s:?}"));
            }
            let udp = match proto.to_ascii_lowercase().as_str() {
                "tcp" => false,
                "udp" => true,
                o => return Err(format!("unknown protocol {o:?} in {s:?} (tcp, udp)")),
            };
            Ok(PortSpec {
                port,
                udp,
                name: name.map(str::to_string),
            })
        })
        .collect::<Result<_, _>>()?;
    let mut names = std::collections::BTreeSet::new();
    for n in ports.iter().filter_map(|p| p.name.as_deref()) {
        if !names.insert(n) {
            return Err(format!("port name {n:?} given twice in {s:?}"));
        }
    }
    Ok(ports)
}

/// The answer to one request from `peer` to pod `namespace/name`.
pub fn answer(namespace: &str, name: &str, request: &str, peer: std::net::IpAddr) -> String {
    match request.trim() {
        "clientip" => peer.to_string(),
        WHOAMI => format!("{namespace}/{name}"),
        _ => name.to_string(),
    }
}

/// The HTTP answer when `request` is an HTTP request (a gateway or a
/// browser asks): the same answers by the path's last segment
/// (`/clientip`, `/whoami`, anything else the pod name), or `/request`
/// for the request's own head (what a proxy changed on the way).
pub fn http_answer(
    namespace: &str,
    name: &str,
    request: &str,
    peer: std::net::IpAddr,
) -> Option<String> {
    let line = request.lines().next()?;
    let mut parts = line.split_whitespace();
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if !version.starts_with("HTTP/1.") || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let path = target.split('?').next().unwrap_or(target);
    let body = match path.rsplit('/').next().unwrap_or("") {
        "request" => request
            .split("\r\n\r\n")
            .next()
            .unwrap_or("")
            .replace("\r\n", "\n"),
        last => answer(namespace, name, last, peer),
    };
    let body = format!("{body}\n");
    Some(format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ))
}

/// Both families on one socket (`[::]`, IPv4 clients as v4-mapped
/// addresses), or IPv4 alone where the namespace has no IPv6.
fn bind_any<T>(port: u16, bind: impl Fn(&str) -> std::io::Result<T>) -> std::io::Result<T> {
    bind(&format!("[::]:{port}")).or_else(|_| bind(&format!("0.0.0.0:{port}")))
}

/// Serves pod `namespace/name` until the process is killed.
pub fn serve(namespace: &str, name: &str, ports: &[PortSpec]) -> std::io::Result<()> {
    let mut threads = Vec::new();
    for p in ports {
        let name = name.to_string();
        let namespace = namespace.to_string();
        if p.udp {
            let s = bind_any(p.port, |a| UdpSocket::bind(a))?;
            threads.push(std::thread::spawn(move || {
                let mut buf = [0u8; 2048];
                loop {
                    if let Ok((n, peer)) = s.recv_from(&mut buf) {
                        let req = String::from_utf8_lossy(&buf[..n]);
                        let a = answer(&namespace, &name, &req, peer.ip().to_canonical());
                        let _ = s.send_to(format!("{a}\n").as_bytes(), peer);
                    }
                }
            }));
        } else {
            let l = bind_any(p.port, |a| TcpListener::bind(a))?;
            threads.push(std::thread::spawn(move || {
                for c in l.incoming().flatten() {
                    let (namespace, name) = (namespace.clone(), name.clone());
                    std::thread::spawn(move || {
                        let mut c = c;
                        let peer = match c.peer_addr() {
                            Ok(p) => p.ip().to_canonical(),
                            Err(_) => return,
                        };
                        let _ = c.set_read_timeout(Some(Duration::from_millis(200)));
                        let mut buf = [0u8; 4096];
                        let n = c.read(&mut buf).unwrap_or(0);
                        let req = String::from_utf8_lossy(&buf[..n]);
                        let a = match http_answer(&namespace, &name, &req, peer) {
                            Some(h) => h,
                            None => format!("{}\n", answer(&namespace, &name, &req, peer)),
                        };
                        let _ = c.write_all(a.as_bytes());
                    });
                }
            }));
        }
    }
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

/// Sends `request` to a server and returns its answer (the probe side).
pub fn ask(
    addr: std::net::SocketAddr,
    udp: bool,
    request: &str,
    timeout: Duration,
) -> std::io::Result<String> {
    if udp {
        let s = UdpSocket::bind(if addr.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        })?;
        s.set_read_timeout(Some(timeout))?;
        // Connected, as resolvers are: only a connected UDP socket hears
        // the ICMP error of a reject, as "connection refused".
        s.connect(addr)?;
        s.send(format!("{request}\n").as_bytes())?;
        let mut buf = [0u8; 2048];
        let n = s.recv(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string())
    } else {
        let mut c = std::net::TcpStream::connect_timeout(&addr, timeout)?;
        c.set_read_timeout(Some(timeout))?;
        c.write_all(format!("{request}\n").as_bytes())?;
        let mut out = String::new();
        c.read_to_string(&mut out)?;
        Ok(out.trim().to_string())
    }
}

/// What a probe found, told apart by cause: a NetworkPolicy that drops
/// shows as [`Reach::TimedOut`], while [`Reach::Refused`] means a reject
/// (a TCP reset, or the ICMP port-unreachable a connected UDP socket hears)
/// or no server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// Connected and answered; the answer says who (`NAMESPACE/POD` for
    /// [`WHOAMI`]).
    Connected(String),
    Refused,
    /// No TCP connection, or no UDP answer, within the timeout.
    TimedOut,
    /// Anything else: unreachable, reset, connected without an answer...
    Other(String),
}

impl Reach {
    /// Classifies the outcome of [`ask`].
    pub fn of(r: std::io::Result<String>, udp: bool) -> Reach {
        match r {
            Ok(who) => Reach::Connected(who),
            Err(e) => match e.kind() {
                ErrorKind::ConnectionRefused => Reach::Refused,
                // TCP: connect_timeout ran out (a dropped SYN).
                ErrorKind::TimedOut => Reach::TimedOut,
                // UDP: the read timeout ran out with nothing back.
                ErrorKind::WouldBlock if udp => Reach::TimedOut,
                // TCP: connected, then the answer never came.
                ErrorKind::WouldBlock => {
                    Reach::Other("connected, but no answer within the timeout".into())
                }
                _ => Reach::Other(e.to_string()),
            },
        }
    }

    /// One letter for truth tables: `.` connected, `X` timed out, `R`
    /// refused, `?` anything else.
    pub fn letter(&self) -> char {
        match self {
            Reach::Connected(_) => '.',
            Reach::TimedOut => 'X',
            Reach::Refused => 'R',
            Reach::Other(_) => '?',
        }
    }
}

/// Asks [`WHOAMI`] at `addr` from the calling thread's network namespace,
/// over a connected socket (so a UDP reject is heard), and says what
/// happened.
pub fn reach(addr: SocketAddr, udp: bool, timeout: Duration) -> Reach {
    Reach::of(ask(addr, udp, WHOAMI, timeout), udp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_requests_get_http_answers() {
        let peer: std::net::IpAddr = "10.0.0.9".parse().unwrap();
        let a = http_answer(
            "ns",
            "p",
            "GET /x/clientip HTTP/1.1\r\nHost: h\r\n\r\n",
            peer,
        )
        .unwrap();
        assert!(
            a.starts_with("HTTP/1.1 200 OK\r\n") && a.ends_with("\r\n\r\n10.0.0.9\n"),
            "{a}"
        );
        let a = http_answer(
            "ns",
            "p",
            "GET /request HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n\r\n",
            peer,
        )
        .unwrap();
        assert!(
            a.ends_with("GET /request HTTP/1.1\nHost: h\nX-A: 1\n"),
            "{a}"
        );
        assert!(a.contains("Content-Length: 37\r\n"), "{a}");
        assert_eq!(http_answer("ns", "p", "whoami", peer), None);
        assert_eq!(http_answer("ns", "p", "hostname\n", peer), None);
    }

    #[test]
    fn ports_parse() {
        assert_eq!(
            parse_ports("80/tcp, 81/UDP,82").unwrap(),
            vec![PortSpec::tcp(80), PortSpec::udp(81), PortSpec::tcp(82)]
        );
        assert!(parse_ports("80/icmp").is_err());
        assert!(parse_ports("x").is_err());
    }

    #[test]
    fn named_ports_parse_beside_unnamed_ones() {
        assert_eq!(
            parse_ports("serve-80-tcp=80/tcp,serve-81-udp=81/udp,82").unwrap(),
            vec![
                PortSpec::tcp(80).named("serve-80-tcp"),
                PortSpec::udp(81).named("serve-81-udp"),
                PortSpec::tcp(82)
            ]
        );
        for bad in [
            "Serve=80",
            "=80",
            "a-very-long-port-name=80",
            "x--y=80",
            "80=80",
            "a=80,a=81/udp",
        ] {
            assert!(parse_ports(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn serves_name_and_client_ip_on_loopback() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        std::thread::spawn(move || {
            serve("ns", "pod-a", &[PortSpec::tcp(port), PortSpec::udp(port)])
        });
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut got = String::new();
        for _ in 0..100 {
            if let Ok(a) = ask(addr, false, "hostname", Duration::from_secs(1)) {
                got = a;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(got, "pod-a");
        assert_eq!(
            ask(addr, false, "clientip", Duration::from_secs(1)).unwrap(),
            "127.0.0.1"
        );
        assert_eq!(
            ask(addr, true, "hostname", Duration::from_secs(1)).unwrap(),
            "pod-a"
        );
        let t = Duration::from_secs(1);
        assert_eq!(reach(addr, false, t), Reach::Connected("ns/pod-a".into()));
        assert_eq!(reach(addr, true, t), Reach::Connected("ns/pod-a".into()));
    }

    /// Nothing listens: TCP is reset and UDP hears the ICMP
    /// port-unreachable, both as Refused; an address nobody answers
    /// (a blackhole route) is TimedOut for UDP.
    #[test]
    fn reach_tells_refused_from_timed_out() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        let uport = u.local_addr().unwrap().port();
        drop(u);
        let t = Duration::from_millis(300);
        let closed = |p: u16| -> SocketAddr { format!("127.0.0.1:{p}").parse().unwrap() };
        assert_eq!(reach(closed(port), false, t), Reach::Refused);
        assert_eq!(reach(closed(uport), true, t), Reach::Refused);
        // A UDP server that never answers.
        let mute = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(reach(mute.local_addr().unwrap(), true, t), Reach::TimedOut);
        // A TCP server that accepts but never answers.
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let r = reach(silent.local_addr().unwrap(), false, t);
        assert!(matches!(r, Reach::Other(_)), "{r:?}");
        assert_eq!(
            Reach::of(Err(ErrorKind::TimedOut.into()), false),
            Reach::TimedOut
        );
        assert_eq!(
            [
                Reach::Connected("x/a".into()),
                Reach::TimedOut,
                Reach::Refused,
                Reach::Other("?".into())
            ]
            .map(|r| r.letter()),
            ['.', 'X', 'R', '?']
        );
    }
}
