//! Ports: one accept loop per port the table serves, opened and closed
//! as the table changes; each connection speaks HTTP/1.1 or HTTP/2
//! (ALPN, or the h2 preface on plain ports) and TLS where the port
//! terminates it. A closed port stops accepting; its open connections
//! finish what they carry.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::handle::{handle, Conn};
use super::Shared;

#[derive(Debug, thiserror::Error)]
#[error("binding {addr}: {err}")]
pub struct BindError {
    pub addr: SocketAddr,
    pub err: std::io::Error,
}

/// Where a table port is bound (the production binder is the port on
/// one address; tests bind port 0 and ask [`Ports::local`]).
pub type Binder = Arc<dyn Fn(u16) -> SocketAddr + Send + Sync>;

/// The open ports, and the signal that tells their connections to finish.
pub struct Ports {
    shared: Arc<Shared>,
    bind: Binder,
    open: BTreeMap<u16, (SocketAddr, watch::Sender<bool>)>,
    /// Closes every connection gracefully at shutdown.
    draining: watch::Sender<bool>,
}

impl Ports {
    /// Ports bound on `address`.
    pub fn new(shared: Arc<Shared>, address: IpAddr) -> Ports {
        Ports::with_binder(shared, Arc::new(move |p| SocketAddr::new(address, p)))
    }

    pub fn with_binder(shared: Arc<Shared>, bind: Binder) -> Ports {
        Ports {
            shared,
            bind,
            open: BTreeMap::new(),
            draining: watch::channel(false).0,
        }
    }

    /// The address a table port is bound at.
    pub fn local(&self, port: u16) -> Option<SocketAddr> {
        self.open.get(&port).map(|(a, _)| *a)
    }

    /// Opens the ports `want` has and closes the others; a port that
    /// cannot be bound is returned, the rest proceed.
    pub async fn reconcile(&mut self, want: &BTreeSet<u16>) -> Vec<BindError> {
        let gone: Vec<u16> = self
            .open
            .keys()
            .filter(|p| !want.contains(p))
            .copied()
            .collect();
        for p in gone {
            if let Some((_, stop)) = self.open.remove(&p) {
                let _ = stop.send(true);
            }
        }
        let mut errs = Vec::new();
        let new: Vec<u16> = want
            .iter()
            .filter(|p| !self.open.contains_key(p))
            .copied()
            .collect();
        for p in new {
            let addr = (self.bind)(p);
            match TcpListener::bind(addr).await {
                Ok(l) => {
                    let local = l.local_addr().unwrap_or(addr);
                    let (tx, rx) = watch::channel(false);
                    tokio::spawn(accept(
                        l,
                        p,
                        self.shared.clone(),
                        rx,
                        self.draining.subscribe(),
                    ));
                    self.open.insert(p, (local, tx));
                }
                Err(err) => errs.push(BindError { addr, err }),
            }
        }
        errs
    }

    /// Stops accepting everywhere and asks every connection to finish.
    pub fn drain(&mut self) {
        for (_, (_, stop)) in std::mem::take(&mut self.open) {
            let _ = stop.send(true);
        }
        let _ = self.draining.send(true);
    }
}

async fn accept(
    l: TcpListener,
    port: u16,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    draining: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            r = l.accept() => match r {
                Ok((s, remote)) => {
                    let _ = s.set_nodelay(true);
                    tokio::spawn(connection(s, remote, port, shared.clone(), draining.clone()));
                }
                Err(e) => {
                    tracing::warn!(port, "accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
        }
    }
}

async fn connection(
    s: TcpStream,
    remote: SocketAddr,
    port: u16,
    shared: Arc<Shared>,
    draining: watch::Receiver<bool>,
) {
    let tls = shared.tls.load().get(&port).cloned();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let conn = Arc::new(Conn {
        port,
        scheme,
        remote,
    });
    let svc = {
        let shared = shared.clone();
        service_fn(move |req| handle(shared.clone(), conn.clone(), req))
    };
    match tls {
        Some(cfg) => match tokio_rustls::TlsAcceptor::from(cfg).accept(s).await {
            Ok(t) => serve(TokioIo::new(t), svc, draining).await,
            Err(e) => tracing::debug!(%remote, port, "TLS handshake: {e}"),
        },
        None => serve(TokioIo::new(s), svc, draining).await,
    }
}

async fn serve<I, S>(io: I, svc: S, mut draining: watch::Receiver<bool>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<super::forward::Body>,
            Error = std::convert::Infallible,
        > + Send
        + 'static,
    S::Future: Send + 'static,
{
    let builder = auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection_with_upgrades(io, svc);
    tokio::pin!(conn);
    let drain = async move {
        let _ = draining.wait_for(|d| *d).await.map(|_| ());
    };
    tokio::select! {
        r = conn.as_mut() => if let Err(e) = r { tracing::debug!("connection: {e}") },
        _ = drain => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}
