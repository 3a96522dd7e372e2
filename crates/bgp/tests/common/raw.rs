//! A bare BGP peer played by the test on a TCP socket: it completes the
//! handshake and then reads exactly what our side sends, message by
//! message, or writes what no router would (a hostile peer).

use std::net::Ipv4Addr;
use std::time::Duration;

use podnet_bgp::wire::{Afi, Capability, Codec, Message, Open, Safi, Update};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Both sides speak 4-octet AS numbers (the raw peer says so).
const CODEC: Codec = Codec {
    four_octet_as: true,
};

/// A message as bytes.
pub fn bytes(m: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    CODEC.encode(m, &mut out).unwrap();
    out
}

/// The test's end of one connection with our side.
pub struct RawPeer {
    pub s: TcpStream,
    inbox: Vec<u8>,
}

impl RawPeer {
    /// Takes our side's connection on `l` and opens the session as AS
    /// `asn` with identifier `id` (IPv4 unicast, 4-octet AS numbers): its
    /// OPEN and KEEPALIVE.
    pub async fn accept(l: &TcpListener, asn: u32, id: Ipv4Addr) -> RawPeer {
        let (s, _) = tokio::time::timeout(Duration::from_secs(20), l.accept())
            .await
            .expect("our side never connected")
            .unwrap();
        let mut raw = RawPeer {
            s,
            inbox: Vec::new(),
        };
        let open = Message::Open(Open {
            asn,
            hold_time: 9,
            router_id: id,
            capabilities: vec![
                Capability::Multiprotocol(Afi::Ipv4, Safi::Unicast),
                Capability::FourOctetAs(asn),
            ],
        });
        raw.send(&open).await;
        raw.send(&Message::Keepalive).await;
        raw
    }

    pub async fn send(&mut self, m: &Message) {
        self.s.write_all(&bytes(m)).await.unwrap();
    }

    /// The next message our side sent (20 s at most); None when it closed
    /// the connection.
    pub async fn next(&mut self) -> Option<Message> {
        let mut buf = [0u8; 8192];
        loop {
            if let Some((m, used)) = CODEC.decode(&self.inbox).expect("a well-formed message") {
                self.inbox.drain(..used);
                return Some(m);
            }
            let read = tokio::time::timeout(Duration::from_secs(20), self.s.read(&mut buf));
            match read.await.expect("our side said nothing for 20 s") {
                Ok(n) if n > 0 => self.inbox.extend_from_slice(&buf[..n]),
                _ => return None,
            }
        }
    }

    /// The next UPDATE, KEEPALIVEs and our OPEN passed over; anything
    /// else fails the test.
    pub async fn update(&mut self) -> Update {
        loop {
            match self.next().await {
                Some(Message::Update(u)) => return u,
                Some(Message::Keepalive | Message::Open(_)) => {}
                other => panic!("waiting for an UPDATE: {other:?}"),
            }
        }
    }
}
