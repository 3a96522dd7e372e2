//! BFD over UDP (RFC 5881) for every neighbour of one local address: the
//! edge that carries out [`crate::bfd`]'s state machines. One socket
//! receives on port 3784 of the local address and hands each packet to the
//! session of its source; each session sends from a port of its own. Both
//! ways TTL (IPv6: hop limit) 255, and the kernel drops anything that
//! arrives with less ([`crate::gtsm`]), so only a neighbour on the link
//! can move a session.
//! Each session's Up and Down go to whoever added it; a BGP session follows
//! them (RFC 5882).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::bfd::{Edge, Packet, Session, Timing, PORT};
use crate::gtsm;

enum Cmd {
    Add(IpAddr, Timing, mpsc::Sender<Edge>),
    Remove(IpAddr),
}

/// BFD for one local address; dropped, every session stops.
pub struct Bfd {
    cmd: mpsc::Sender<Cmd>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Bfd {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Bfd {
    /// Binds the receiving socket on `local`.
    pub async fn start(local: IpAddr) -> std::io::Result<Bfd> {
        let rx = UdpSocket::bind(SocketAddr::new(local, PORT)).await?;
        gtsm::min_ttl(&rx, local.is_ipv6(), true)?;
        let (cmd, cmds) = mpsc::channel(16);
        let mux = Mux {
            local,
            rx,
            sessions: HashMap::new(),
            next_disc: 1,
            jitter: Jitter(u64::from(std::process::id()) | 1),
        };
        let task = tokio::spawn(mux.run(cmds));
        Ok(Bfd { cmd, task })
    }

    /// Starts a session with `neighbour`; its Up and Down go to `edges`.
    pub async fn add(&self, neighbour: IpAddr, timing: Timing, edges: mpsc::Sender<Edge>) {
        let _ = self.cmd.send(Cmd::Add(neighbour, timing, edges)).await;
    }

    /// Ends the session with `neighbour`, for every subscriber. A
    /// subscriber that only leaves drops its receiver instead: a session
    /// whose subscribers have all gone ends by itself.
    pub async fn remove(&self, neighbour: IpAddr) {
        let _ = self.cmd.send(Cmd::Remove(neighbour)).await;
    }
}

/// One session and its clock.
struct Sess {
    s: Session,
    tx: UdpSocket,
    next_tx: Instant,
    heard: Option<Instant>,
    /// Everyone who added this neighbour (the BGP session, node liveness):
    /// one session per neighbour, its edges to each.
    edges: Vec<mpsc::Sender<Edge>>,
    up: bool,
}

impl Sess {
    /// Tells every subscriber, forgetting those that left.
    async fn tell(&mut self, e: Edge) {
        self.up = matches!(e, Edge::Up);
        self.edges.retain(|t| !t.is_closed());
        for t in &self.edges {
            let _ = t.send(e).await;
        }
    }
}

impl Sess {
    fn detect_at(&self) -> Option<Instant> {
        Some(self.heard? + self.s.detection_time()?)
    }

    fn due(&self) -> Instant {
        self.detect_at()
            .map_or(self.next_tx, |d| d.min(self.next_tx))
    }
}

struct Mux {
    local: IpAddr,
    rx: UdpSocket,
    sessions: HashMap<IpAddr, Sess>,
    next_disc: u32,
    jitter: Jitter,
}

impl Mux {
    async fn run(mut self, mut cmds: mpsc::Receiver<Cmd>) {
        let mut buf = [0u8; 64];
        loop {
            let due = self.sessions.values().map(Sess::due).min();
            let wake = async {
                match due {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = wake => self.timers().await,
                r = self.rx.recv_from(&mut buf) => {
                    if let Ok((n, from)) = r {
                        self.received(from.ip(), &buf[..n]).await;
                    }
                }
                c = cmds.recv() => match c {
                    Some(Cmd::Add(n, t, e)) => self.add(n, t, e).await,
                    Some(Cmd::Remove(n)) => {
                        self.sessions.remove(&n);
                    }
                    None => return,
                },
            }
        }
    }

    async fn add(&mut self, neighbour: IpAddr, timing: Timing, edges: mpsc::Sender<Edge>) {
        if let Some(sess) = self.sessions.get_mut(&neighbour) {
            // A second subscriber joins the session as it is.
            if sess.up {
                let _ = edges.send(Edge::Up).await;
            }
            sess.edges.push(edges);
            return;
        }
        let tx = async {
            let tx = UdpSocket::bind(SocketAddr::new(self.local, 0)).await?;
            gtsm::send_255(&tx, self.local.is_ipv6())?;
            tx.connect(SocketAddr::new(neighbour, PORT)).await?;
            Ok::<_, std::io::Error>(tx)
        };
        let tx = match tx.await {
            Ok(tx) => tx,
            Err(e) => {
                tracing::warn!(%neighbour, "BFD session not started: {e}");
                return;
            }
        };
        let disc = self.next_disc;
        self.next_disc = self.next_disc.wrapping_add(1).max(1);
        let sess = Sess {
            s: Session::new(timing, disc),
            tx,
            next_tx: Instant::now(),
            heard: None,
            edges: vec![edges],
            up: false,
        };
        self.sessions.insert(neighbour, sess);
    }

    /// Sends what is due and declares silent neighbours down.
    async fn timers(&mut self) {
        let now = Instant::now();
        // Sessions nobody listens to any more end.
        self.sessions
            .retain(|_, s| s.edges.iter().any(|t| !t.is_closed()));
        for sess in self.sessions.values_mut() {
            if sess.detect_at().is_some_and(|d| d <= now) {
                sess.heard = None;
                if let Some(e) = sess.s.expired() {
                    sess.tell(e).await;
                }
                sess.next_tx = now;
            }
            if sess.next_tx <= now {
                let _ = sess.tx.send(&sess.s.packet().encode()).await;
                sess.next_tx = now + self.jitter.scale(sess.s.tx_interval());
            }
        }
    }

    async fn received(&mut self, from: IpAddr, b: &[u8]) {
        let Some(sess) = self.sessions.get_mut(&from) else {
            return;
        };
        let Ok(p) = Packet::decode(b) else { return };
        sess.heard = Some(Instant::now());
        let before = sess.s.state();
        let edge = sess.s.receive(&p);
        if sess.s.state() != before || p.poll {
            sess.next_tx = Instant::now();
        }
        if let Some(e) = edge {
            sess.tell(e).await;
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
