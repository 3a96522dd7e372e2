//! The probe: one real connection from a chosen source port, whose
//! outcome is told apart by cause, as the kernel reported it to the
//! socket.
//!
//! TCP connects and, when a request is given, sends it and reads the
//! answer. UDP sends the request on a connected socket (only a connected
//! socket hears the ICMP error a reject sends) and waits for one answer.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use serde::Serialize;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// How the probe ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Outcome {
    /// Connected (TCP) or answered (UDP); `answer` is what came back, if
    /// a request was sent.
    Connected { answer: String },
    /// A TCP reset or an ICMP port-unreachable: a reject, or no server.
    Refused,
    /// An ICMP host/network-unreachable or administratively-prohibited.
    Unreachable { error: String },
    /// Nothing came back in time: a drop somewhere.
    TimedOut,
    /// Anything else, with the error.
    Failed { error: String },
}

impl Outcome {
    fn of(e: &std::io::Error) -> Outcome {
        use std::io::ErrorKind as K;
        match e.kind() {
            K::ConnectionRefused => Outcome::Refused,
            K::TimedOut | K::WouldBlock => Outcome::TimedOut,
            K::HostUnreachable | K::NetworkUnreachable => Outcome::Unreachable {
                error: e.to_string(),
            },
            _ => Outcome::Failed {
                error: e.to_string(),
            },
        }
    }

    pub fn text(&self) -> String {
        match self {
            Outcome::Connected { answer } if answer.is_empty() => "connected".into(),
            Outcome::Connected { answer } => format!("connected, answered {answer:?}"),
            Outcome::Refused => "refused".into(),
            Outcome::Unreachable { error } => format!("unreachable ({error})"),
            Outcome::TimedOut => "timed out".into(),
            Outcome::Failed { error } => format!("failed ({error})"),
        }
    }
}

/// One probe from `sport` to `dst`, in the calling thread's namespace.
pub fn probe(
    dst: SocketAddr,
    udp: bool,
    sport: u16,
    request: Option<&str>,
    timeout: Duration,
) -> Outcome {
    let r = if udp {
        probe_udp(dst, sport, request.unwrap_or("\n"), timeout)
    } else {
        probe_tcp(dst, sport, request, timeout)
    };
    match r {
        Ok(answer) => Outcome::Connected { answer },
        Err(e) => Outcome::of(&e),
    }
}

fn bound(dst: SocketAddr, ty: Type, proto: Protocol, sport: u16) -> std::io::Result<Socket> {
    let s = Socket::new(Domain::for_address(dst), ty, Some(proto))?;
    s.set_reuse_address(true)?;
    let any: SocketAddr = if dst.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], sport))
    } else {
        SocketAddr::from(([0u16; 8], sport))
    };
    s.bind(&SockAddr::from(any))?;
    Ok(s)
}

fn probe_tcp(
    dst: SocketAddr,
    sport: u16,
    request: Option<&str>,
    timeout: Duration,
) -> std::io::Result<String> {
    let s = bound(dst, Type::STREAM, Protocol::TCP, sport)?;
    s.connect_timeout(&SockAddr::from(dst), timeout)?;
    let mut c: TcpStream = s.into();
    let Some(req) = request else {
        return Ok(String::new());
    };
    c.set_read_timeout(Some(timeout))?;
    c.write_all(format!("{req}\n").as_bytes())?;
    let mut out = String::new();
    c.read_to_string(&mut out)?;
    Ok(out.trim().to_string())
}

fn probe_udp(
    dst: SocketAddr,
    sport: u16,
    request: &str,
    timeout: Duration,
) -> std::io::Result<String> {
    let s = bound(dst, Type::DGRAM, Protocol::UDP, sport)?;
    let u: UdpSocket = s.into();
    u.set_read_timeout(Some(timeout))?;
    u.connect(dst)?;
    u.send(format!("{request}\n").as_bytes())?;
    let mut buf = [0u8; 2048];
    let n = u.recv(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string())
}
