//! One BFD session over UDP (RFC 5881): the edge that carries out
//! [`crate::bfd`]'s state machine. It receives on port 3784 of the local
//! address, sends from a port of its own, both with TTL 255, and has the
//! kernel drop anything that arrives with a lower TTL (`IP_MINTTL`), so
//! only a neighbour on the link can move the session. Session changes go
//! to the owner over a channel; the BGP session follows them.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::bfd::{Edge, Packet, Session, Timing, PORT};

/// A running BFD session; dropped, it stops.
pub struct BfdLink {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for BfdLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The TTL every BFD packet is sent with, and the least one accepted.
const TTL: u32 = 255;

fn min_ttl(s: &UdpSocket) -> std::io::Result<()> {
    let v: libc::c_int = TTL as libc::c_int;
    // SAFETY: a valid socket, an int option of the right size.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MINTTL,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    match r {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

impl BfdLink {
    /// Starts a session from `local` to `neighbour` (IPv4); its Up and
    /// Down go to `edges`. `disc` must be unique among this node's
    /// sessions.
    pub async fn start(
        local: IpAddr,
        neighbour: IpAddr,
        timing: Timing,
        disc: u32,
        edges: mpsc::Sender<Edge>,
    ) -> std::io::Result<BfdLink> {
        let rx = UdpSocket::bind(SocketAddr::new(local, PORT)).await?;
        min_ttl(&rx)?;
        let tx = UdpSocket::bind(SocketAddr::new(local, 0)).await?;
        tx.set_ttl(TTL)?;
        tx.connect(SocketAddr::new(neighbour, PORT)).await?;
        let session = Session::new(timing, disc);
        let task = tokio::spawn(run(session, rx, tx, neighbour, edges));
        Ok(BfdLink { task })
    }
}

/// Sends on the transmit interval (jittered to 75–100 %), receives, and
/// declares the neighbour down after its detection time of silence.
async fn run(
    mut s: Session,
    rx: UdpSocket,
    tx: UdpSocket,
    neighbour: IpAddr,
    edges: mpsc::Sender<Edge>,
) {
    let mut buf = [0u8; 64];
    let mut next_tx = Instant::now();
    let mut heard: Option<Instant> = None;
    let mut jitter = Jitter(u64::from(std::process::id()) | 1);
    loop {
        let deadline = heard.and_then(|h| s.detection_time().map(|d| h + d));
        let expire = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let mut edge = None;
        tokio::select! {
            _ = tokio::time::sleep_until(next_tx) => {
                let _ = tx.send(&s.packet().encode()).await;
                next_tx = Instant::now() + jitter.scale(s.tx_interval());
            }
            _ = expire => {
                heard = None;
                edge = s.expired();
            }
            r = rx.recv_from(&mut buf) => {
                let Ok((n, from)) = r else { continue };
                if from.ip() != neighbour {
                    continue;
                }
                let Ok(p) = Packet::decode(&buf[..n]) else { continue };
                heard = Some(Instant::now());
                let before = s.state();
                edge = s.receive(&p);
                if s.state() != before || p.poll {
                    next_tx = Instant::now();
                }
            }
        }
        if let Some(e) = edge {
            if edges.send(e).await.is_err() {
                return;
            }
        }
    }
}

/// RFC 5880 §6.8.7's jitter: each interval 75–100 % of the nominal one.
struct Jitter(u64);

impl Jitter {
    fn scale(&mut self, d: Duration) -> Duration {
        // xorshift64: enough to keep two speakers' packets apart.
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let pct = 75 + (self.0 % 26);
        d * pct as u32 / 100
    }
}
