//! `podnet serve`: what runs inside every lab pod. It answers on each listed
//! TCP and UDP port with its pod name, or with the client's address when
//! asked `clientip` (like agnhost's netexec), so a probe shows who answered
//! and whether the source address survived the trip.

use std::io::{Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::time::Duration;

/// One port to serve: number and protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSpec {
    pub port: u16,
    pub udp: bool,
}

/// Parses "80/tcp,81/udp,82" (tcp when no protocol is given).
pub fn parse_ports(s: &str) -> Result<Vec<PortSpec>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (n, proto) = p.split_once('/').unwrap_or((p, "tcp"));
            let port: u16 = n
                .parse()
                .map_err(|_| format!("invalid port {n:?} in {s:?}"))?;
            if port == 0 {
                return Err(format!("port 0 in {s:?}"));
            }
            match proto.to_ascii_lowercase().as_str() {
                "tcp" => Ok(PortSpec { port, udp: false }),
                "udp" => Ok(PortSpec { port, udp: true }),
                o => Err(format!("unknown protocol {o:?} in {s:?} (tcp, udp)")),
            }
        })
        .collect()
}

/// The answer to one request.
pub fn answer(name: &str, request: &str, peer: std::net::IpAddr) -> String {
    match request.trim() {
        "clientip" => peer.to_string(),
        _ => name.to_string(),
    }
}

/// Serves until the process is killed.
pub fn serve(name: &str, ports: &[PortSpec]) -> std::io::Result<()> {
    let mut threads = Vec::new();
    for p in ports {
        let name = name.to_string();
        if p.udp {
            let s = UdpSocket::bind(("0.0.0.0", p.port))?;
            threads.push(std::thread::spawn(move || {
                let mut buf = [0u8; 2048];
                loop {
                    if let Ok((n, peer)) = s.recv_from(&mut buf) {
                        let a = answer(&name, &String::from_utf8_lossy(&buf[..n]), peer.ip());
                        let _ = s.send_to(format!("{a}\n").as_bytes(), peer);
                    }
                }
            }));
        } else {
            let l = TcpListener::bind(("0.0.0.0", p.port))?;
            threads.push(std::thread::spawn(move || {
                for c in l.incoming().flatten() {
                    let name = name.clone();
                    std::thread::spawn(move || {
                        let mut c = c;
                        let peer = match c.peer_addr() {
                            Ok(p) => p.ip(),
                            Err(_) => return,
                        };
                        let _ = c.set_read_timeout(Some(Duration::from_millis(200)));
                        let mut buf = [0u8; 256];
                        let n = c.read(&mut buf).unwrap_or(0);
                        let a = answer(&name, &String::from_utf8_lossy(&buf[..n]), peer);
                        let _ = c.write_all(format!("{a}\n").as_bytes());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_parse() {
        assert_eq!(
            parse_ports("80/tcp, 81/UDP,82").unwrap(),
            vec![
                PortSpec {
                    port: 80,
                    udp: false
                },
                PortSpec {
                    port: 81,
                    udp: true
                },
                PortSpec {
                    port: 82,
                    udp: false
                }
            ]
        );
        assert!(parse_ports("80/icmp").is_err());
        assert!(parse_ports("x").is_err());
    }

    #[test]
    fn serves_name_and_client_ip_on_loopback() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        std::thread::spawn(move || {
            serve(
                "pod-a",
                &[PortSpec { port, udp: false }, PortSpec { port, udp: true }],
            )
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
    }
}
