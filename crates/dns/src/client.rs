//! A small blocking DNS client over UDP and TCP: what the tests, the
//! benchmark and `dig`-less tools use to talk to a server. UDP answers with
//! TC set are retried over TCP, as a stub resolver does.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use crate::wire::{self, Message};

/// Errors a query can meet.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("bad name: {0}")]
    Wire(#[from] wire::WireError),
    #[error("answer does not match the query")]
    Mismatch,
}

/// Where and how to ask.
#[derive(Debug, Clone, Copy)]
pub struct Client {
    pub server: SocketAddr,
    pub timeout: Duration,
    /// EDNS payload size to advertise (`None`: no OPT, 512-byte limit).
    pub edns: Option<u16>,
}

impl Client {
    pub fn new(server: SocketAddr) -> Client {
        Client {
            server,
            timeout: Duration::from_secs(3),
            edns: Some(wire::OUR_EDNS_SIZE),
        }
    }

    fn query_bytes(&self, name: &str, qtype: u16) -> Result<(u16, Vec<u8>), ClientError> {
        let id = (std::process::id() as u16) ^ (qtype << 3) ^ name.len() as u16;
        let qn = wire::name_from_str(name)?;
        Ok((id, wire::build_query(id, &qn, qtype, self.edns)))
    }

    /// A UDP socket connected to the server, with the timeout set.
    fn udp_socket(&self) -> Result<UdpSocket, ClientError> {
        let bind = if self.server.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        };
        let s = UdpSocket::bind(bind)?;
        s.set_read_timeout(Some(self.timeout))?;
        s.connect(self.server)?;
        Ok(s)
    }

    /// One UDP exchange; the answer may be truncated.
    pub fn udp(&self, name: &str, qtype: u16) -> Result<Message, ClientError> {
        let (id, q) = self.query_bytes(name, qtype)?;
        let s = self.udp_socket()?;
        s.send(&q)?;
        let mut buf = vec![0u8; 65535];
        loop {
            let n = s.recv(&mut buf)?;
            let m = Message::parse(&buf[..n])?;
            if m.header.id == id {
                return Ok(m);
            }
        }
    }

    /// Raw bytes over UDP (fuzzing, malformed-input tests).
    pub fn udp_raw(&self, msg: &[u8]) -> Result<Vec<u8>, ClientError> {
        let s = self.udp_socket()?;
        s.send(msg)?;
        let mut buf = vec![0u8; 65535];
        let n = s.recv(&mut buf)?;
        Ok(buf[..n].to_vec())
    }

    /// One TCP exchange.
    pub fn tcp(&self, name: &str, qtype: u16) -> Result<Message, ClientError> {
        let (id, q) = self.query_bytes(name, qtype)?;
        let mut s = TcpStream::connect_timeout(&self.server, self.timeout)?;
        s.set_read_timeout(Some(self.timeout))?;
        let mut framed = (q.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&q);
        s.write_all(&framed)?;
        let mut len = [0u8; 2];
        s.read_exact(&mut len)?;
        let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
        s.read_exact(&mut buf)?;
        let m = Message::parse(&buf)?;
        if m.header.id != id {
            return Err(ClientError::Mismatch);
        }
        Ok(m)
    }

    /// UDP, retried over TCP when truncated.
    pub fn query(&self, name: &str, qtype: u16) -> Result<Message, ClientError> {
        let m = self.udp(name, qtype)?;
        if m.header.flags & wire::TC != 0 {
            return self.tcp(name, qtype);
        }
        Ok(m)
    }
}
