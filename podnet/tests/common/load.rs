//! Load that must not notice a rolling replacement of podnet's daemons
//! (podnet/tests/upgrade.rs): what a cluster's workloads do all the time,
//! counted so that any disruption shows, with its cause.
//!
//! - Streams: long-lived TCP connections from a client pod to an echo
//!   server the test runs inside a server pod's namespace (across nodes,
//!   straight to the pod IP and through a ClusterIP). The client sends a
//!   patterned chunk, reads it back and checks every byte; bytes are
//!   counted both ways. A reset, an early EOF, a wrong byte or no progress
//!   for [`STALL`] breaks the stream, and nothing mends it: an established
//!   connection must survive every step.
//! - New connections: a loop of fresh TCP connections to a ClusterIP whose
//!   endpoints are on both nodes, each asking who answers; a connection
//!   that fails or gets no answer is a failure, recorded with its error
//!   kind.
//! - DNS: a loop of A queries for a cluster name to the DNS Service IP,
//!   each from a fresh UDP socket, one attempt, a generous timeout; a
//!   timeout, an error code or a wrong address is a failure.
//!
//! Every loop runs on its own thread inside the client pod's namespace,
//! paced (not flat out: the machine is shared), and bounded in count and
//! time ([`Load::MAX_TIME`], [`MAX_ATTEMPTS`]). All traffic stays inside
//! the lab's namespaces.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use podnet_kernel::Netns;

/// No progress on a stream for this long breaks it (TCP retransmits
/// through a short outage well within it).
pub const STALL: Duration = Duration::from_secs(10);
/// One new connection or DNS query may take this long.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// Most attempts one loop makes.
pub const MAX_ATTEMPTS: u64 = 200_000;
/// The pause between two round trips of a loop or a stream.
const PACE: Duration = Duration::from_millis(20);
/// Bytes per stream round trip.
const CHUNK: usize = 16 * 1024;
/// Errors kept per loop (the count is exact; the list is a sample).
const KEEP_ERRORS: usize = 20;

/// What to aim the load at.
#[derive(Debug, Clone)]
pub struct Targets {
    /// The namespace every client runs in (a pod's).
    pub client_ns: String,
    /// The namespace of the pod the test's echo server listens in.
    pub server_ns: String,
    /// The port the echo server listens on there.
    pub server_port: u16,
    /// Streams by name: where each connects (the server pod's IP, or a
    /// ClusterIP whose only endpoint is that pod).
    pub streams: Vec<(String, SocketAddr)>,
    /// The ClusterIP:port the new connections go to.
    pub service: SocketAddr,
    /// Who may answer there (`NAMESPACE/POD`).
    pub answerers: Vec<String>,
    /// The DNS server (the Service IP), the name asked and its address.
    pub dns_server: SocketAddr,
    pub dns_name: String,
    pub dns_want: Ipv4Addr,
}

#[derive(Default)]
struct Loop {
    attempts: AtomicU64,
    failures: AtomicU64,
    errors: Mutex<Vec<String>>,
    answers: Mutex<BTreeMap<String, u64>>,
}

impl Loop {
    fn fail(&self, started: Instant, what: String) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let mut e = self.errors.lock().unwrap();
        if e.len() < KEEP_ERRORS {
            let unix = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            e.push(format!(
                "at {:.1}s (unix {:.3}): {what}",
                started.elapsed().as_secs_f64(),
                unix.as_secs_f64()
            ));
        }
    }

    fn answered(&self, who: &str) {
        *self
            .answers
            .lock()
            .unwrap()
            .entry(who.to_string())
            .or_default() += 1;
    }
}

#[derive(Default)]
struct Stream {
    sent: AtomicU64,
    received: AtomicU64,
    broken: Mutex<Option<String>>,
}

struct Shared {
    started: Instant,
    stop: AtomicBool,
    streams: Vec<(String, Stream)>,
    /// What the echo server saw go wrong (an established connection reset
    /// or closed under it).
    server_errors: Mutex<Vec<String>>,
    conns: Loop,
    dns: Loop,
}

/// The running load; [`Load::stop`] ends it (dropping it does too).
pub struct Load {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// A stream's counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamCounts {
    pub name: String,
    pub sent: u64,
    pub received: u64,
    pub broken: Option<String>,
}

/// All counters at one moment (cumulative since the load started).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counts {
    pub streams: Vec<StreamCounts>,
    pub server_errors: Vec<String>,
    pub conn_attempts: u64,
    pub conn_failures: u64,
    pub conn_errors: Vec<String>,
    /// New connections by who answered.
    pub answers: BTreeMap<String, u64>,
    pub dns_attempts: u64,
    pub dns_failures: u64,
    pub dns_errors: Vec<String>,
}

impl Counts {
    /// Streams broken so far (the client's view and the server's).
    pub fn broken(&self) -> usize {
        self.streams.iter().filter(|s| s.broken.is_some()).count() + self.server_errors.len()
    }

    /// Whether every counter has moved on by `n` since `before`: every
    /// stream made `n` round trips, `n` new connections and `n` DNS queries
    /// were made.
    pub fn advanced_by(&self, before: &Counts, n: u64) -> bool {
        let bytes = n * CHUNK as u64;
        self.conn_attempts >= before.conn_attempts + n
            && self.dns_attempts >= before.dns_attempts + n
            && self
                .streams
                .iter()
                .zip(&before.streams)
                .all(|(a, b)| a.sent >= b.sent + bytes && a.received >= b.received + bytes)
    }

    /// One line of what happened since `before`.
    pub fn row(&self, before: &Counts) -> String {
        let streams: Vec<String> = self
            .streams
            .iter()
            .zip(&before.streams)
            .map(|(a, b)| {
                format!(
                    "{} +{}/+{} KiB{}",
                    a.name,
                    (a.sent - b.sent) / 1024,
                    (a.received - b.received) / 1024,
                    if a.broken.is_some() { " BROKEN" } else { "" }
                )
            })
            .collect();
        let answers: Vec<String> = self
            .answers
            .iter()
            .map(|(who, n)| format!("{who} +{}", n - before.answers.get(who).unwrap_or(&0)))
            .collect();
        format!(
            "streams [{}], broken {}; new connections +{} ({}), failed +{}; DNS queries +{}, failed +{}",
            streams.join(", "),
            self.broken() - before.broken(),
            self.conn_attempts - before.conn_attempts,
            answers.join(", "),
            self.conn_failures - before.conn_failures,
            self.dns_attempts - before.dns_attempts,
            self.dns_failures - before.dns_failures,
        )
    }

    /// Every failure so far, with causes: empty when there is none.
    pub fn failures(&self) -> String {
        let mut out = String::new();
        for s in &self.streams {
            if let Some(b) = &s.broken {
                out += &format!("stream {} broke: {b}\n", s.name);
            }
        }
        for e in &self.server_errors {
            out += &format!("echo server: {e}\n");
        }
        if self.conn_failures > 0 {
            out += &format!(
                "{} new connections failed, e.g. {:?}\n",
                self.conn_failures, self.conn_errors
            );
        }
        if self.dns_failures > 0 {
            out += &format!(
                "{} DNS queries failed, e.g. {:?}\n",
                self.dns_failures, self.dns_errors
            );
        }
        out
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let streams: Vec<String> = self
            .streams
            .iter()
            .map(|s| format!("{} {}/{} KiB", s.name, s.sent / 1024, s.received / 1024))
            .collect();
        write!(
            f,
            "streams [{}], broken {}; new connections {} ({:?}), failed {}; DNS queries {}, failed {}",
            streams.join(", "),
            self.broken(),
            self.conn_attempts,
            self.answers,
            self.conn_failures,
            self.dns_attempts,
            self.dns_failures
        )
    }
}

fn describe(e: &std::io::Error) -> String {
    format!("{:?}: {e}", e.kind())
}

/// Byte `i` of the stream (a pattern that a shifted or repeated chunk
/// breaks).
fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(31) % 251) as u8
}

impl Load {
    /// The longest the load runs before it stops on its own.
    pub const MAX_TIME: Duration = Duration::from_secs(20 * 60);

    /// Starts the echo server, connects the streams (each must connect),
    /// and starts every loop.
    pub fn start(t: &Targets) -> Load {
        let shared = Arc::new(Shared {
            started: Instant::now(),
            stop: AtomicBool::new(false),
            streams: t
                .streams
                .iter()
                .map(|(n, _)| (n.clone(), Stream::default()))
                .collect(),
            server_errors: Mutex::new(Vec::new()),
            conns: Loop::default(),
            dns: Loop::default(),
        });
        let mut threads = Vec::new();
        let listener = Netns::named(&t.server_ns)
            .expect("server namespace")
            .run(|| TcpListener::bind(("0.0.0.0", t.server_port)))
            .expect("entering the server namespace")
            .unwrap_or_else(|e| panic!("echo server on port {}: {e}", t.server_port));
        let n = t.streams.len();
        let sh = shared.clone();
        threads.push(std::thread::spawn(move || echo_server(listener, n, sh)));
        for (i, (name, addr)) in t.streams.iter().enumerate() {
            let conn = Netns::named(&t.client_ns)
                .expect("client namespace")
                .run(|| TcpStream::connect_timeout(addr, TIMEOUT))
                .expect("entering the client namespace")
                .unwrap_or_else(|e| panic!("stream {name} to {addr}: {}", describe(&e)));
            let sh = shared.clone();
            threads.push(std::thread::spawn(move || stream_client(conn, i, sh)));
        }
        let (sh, t2) = (shared.clone(), t.clone());
        threads.push(std::thread::spawn(move || {
            in_ns(&t2.client_ns, || connection_loop(&t2, &sh))
        }));
        let (sh, t2) = (shared.clone(), t.clone());
        threads.push(std::thread::spawn(move || {
            in_ns(&t2.client_ns, || dns_loop(&t2, &sh))
        }));
        Load { shared, threads }
    }

    pub fn counts(&self) -> Counts {
        let s = &self.shared;
        Counts {
            streams: s
                .streams
                .iter()
                .map(|(name, st)| StreamCounts {
                    name: name.clone(),
                    sent: st.sent.load(Ordering::Relaxed),
                    received: st.received.load(Ordering::Relaxed),
                    broken: st.broken.lock().unwrap().clone(),
                })
                .collect(),
            server_errors: s.server_errors.lock().unwrap().clone(),
            conn_attempts: s.conns.attempts.load(Ordering::Relaxed),
            conn_failures: s.conns.failures.load(Ordering::Relaxed),
            conn_errors: s.conns.errors.lock().unwrap().clone(),
            answers: s.conns.answers.lock().unwrap().clone(),
            dns_attempts: s.dns.attempts.load(Ordering::Relaxed),
            dns_failures: s.dns.failures.load(Ordering::Relaxed),
            dns_errors: s.dns.errors.lock().unwrap().clone(),
        }
    }

    /// Stops every loop, closes the streams cleanly (a close is not a
    /// break) and returns the final counts.
    pub fn stop(mut self) -> Counts {
        self.halt();
        self.counts()
    }

    fn halt(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.halt();
    }
}

fn in_ns(ns: &str, f: impl FnOnce()) {
    Netns::named(ns)
        .expect("client namespace")
        .run(f)
        .expect("entering the client namespace");
}

fn running(sh: &Shared, attempts: u64) -> bool {
    !sh.stop.load(Ordering::Relaxed)
        && attempts < MAX_ATTEMPTS
        && sh.started.elapsed() < Load::MAX_TIME
}

/// Echoes every byte back on each of `n` accepted connections until the
/// client closes; anything else (a reset, an early close) is an error.
fn echo_server(l: TcpListener, n: usize, sh: Arc<Shared>) {
    let mut handlers = Vec::new();
    for _ in 0..n {
        let (mut s, peer) = match l.accept() {
            Ok(c) => c,
            Err(e) => {
                sh.server_errors
                    .lock()
                    .unwrap()
                    .push(format!("accept: {}", describe(&e)));
                return;
            }
        };
        let sh = sh.clone();
        handlers.push(std::thread::spawn(move || {
            let mut buf = vec![0u8; CHUNK];
            // Short read timeouts, so a stop is seen even on a connection
            // that went silent.
            let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
            let mut last = Instant::now();
            loop {
                match s.read(&mut buf) {
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        if sh.stop.load(Ordering::Relaxed) {
                            return;
                        }
                        if last.elapsed() > STALL {
                            sh.server_errors
                                .lock()
                                .unwrap()
                                .push(format!("{peer} silent for {STALL:?}"));
                            return;
                        }
                    }
                    Ok(0) => {
                        if !sh.stop.load(Ordering::Relaxed) {
                            sh.server_errors
                                .lock()
                                .unwrap()
                                .push(format!("{peer} closed before the end"));
                        }
                        return;
                    }
                    Ok(k) => {
                        last = Instant::now();
                        if let Err(e) = s.write_all(&buf[..k]) {
                            sh.server_errors
                                .lock()
                                .unwrap()
                                .push(format!("writing to {peer}: {}", describe(&e)));
                            return;
                        }
                    }
                    Err(e) => {
                        sh.server_errors
                            .lock()
                            .unwrap()
                            .push(format!("reading from {peer}: {}", describe(&e)));
                        return;
                    }
                }
            }
        }));
    }
    for h in handlers {
        let _ = h.join();
    }
}

/// One stream: patterned chunks out and back, every byte checked.
fn stream_client(mut c: TcpStream, i: usize, sh: Arc<Shared>) {
    let st = &sh.streams[i].1;
    let broke = |what: String| {
        *st.broken.lock().unwrap() = Some(format!(
            "at {:.1}s: {what}",
            sh.started.elapsed().as_secs_f64()
        ));
    };
    if let Err(e) = c.set_read_timeout(Some(STALL)) {
        return broke(describe(&e));
    }
    let _ = c.set_write_timeout(Some(STALL));
    let mut offset = 0u64;
    let mut back = vec![0u8; CHUNK];
    let mut rounds = 0;
    while running(&sh, rounds) {
        rounds += 1;
        let chunk: Vec<u8> = (0..CHUNK as u64).map(|k| pattern(offset + k)).collect();
        if let Err(e) = c.write_all(&chunk) {
            return broke(format!("sending: {}", describe(&e)));
        }
        st.sent.fetch_add(CHUNK as u64, Ordering::Relaxed);
        if let Err(e) = c.read_exact(&mut back) {
            let what = match e.kind() {
                ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                    format!("no echo for {STALL:?} (stalled)")
                }
                ErrorKind::UnexpectedEof => "EOF from the server".into(),
                _ => describe(&e),
            };
            return broke(format!("receiving: {what}"));
        }
        if back != chunk {
            return broke(format!("wrong bytes back after offset {offset}"));
        }
        st.received.fetch_add(CHUNK as u64, Ordering::Relaxed);
        offset += CHUNK as u64;
        std::thread::sleep(PACE);
    }
    // A clean close: the server sees EOF after the stop flag.
    let _ = c.shutdown(Shutdown::Write);
    let mut rest = [0u8; 1];
    match c.read(&mut rest) {
        Ok(0) => {}
        Ok(_) => broke("bytes after the end".into()),
        Err(e) => broke(format!("closing: {}", describe(&e))),
    }
}

/// New TCP connections to the Service, each asking who answers.
fn connection_loop(t: &Targets, sh: &Shared) {
    let l = &sh.conns;
    let mut n = 0;
    while running(sh, n) {
        n += 1;
        l.attempts.fetch_add(1, Ordering::Relaxed);
        match podnet_lab::serve::ask(t.service, false, podnet_lab::serve::WHOAMI, TIMEOUT) {
            Ok(who) if t.answerers.contains(&who) => l.answered(&who),
            Ok(who) => l.fail(sh.started, format!("unexpected answer {who:?}")),
            Err(e) => l.fail(sh.started, describe(&e)),
        }
        std::thread::sleep(PACE);
    }
}

/// A-record queries to the DNS Service, a fresh socket each, one attempt.
fn dns_loop(t: &Targets, sh: &Shared) {
    use podnet_dns::wire::{RData, NOERROR, TYPE_A};
    let l = &sh.dns;
    let client = podnet_dns::client::Client {
        timeout: TIMEOUT,
        ..podnet_dns::client::Client::new(t.dns_server)
    };
    let mut n = 0;
    while running(sh, n) {
        n += 1;
        l.attempts.fetch_add(1, Ordering::Relaxed);
        match client.udp(&t.dns_name, TYPE_A) {
            Ok(m) if m.rcode() != NOERROR => l.fail(
                sh.started,
                format!("rcode {} for {}", m.rcode(), t.dns_name),
            ),
            Ok(m) => {
                let got: Vec<Ipv4Addr> = m
                    .answers
                    .iter()
                    .filter_map(|r| match r.rdata {
                        RData::A(a) => Some(a),
                        _ => None,
                    })
                    .collect();
                if got == [t.dns_want] {
                    l.answered("ok");
                } else {
                    l.fail(sh.started, format!("{} answered {got:?}", t.dns_name));
                }
            }
            Err(podnet_dns::client::ClientError::Io(e)) => l.fail(sh.started, describe(&e)),
            Err(e) => l.fail(sh.started, e.to_string()),
        }
        std::thread::sleep(PACE);
    }
}
