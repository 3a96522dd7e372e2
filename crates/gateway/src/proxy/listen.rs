//! Ports: one accept loop per port the table serves, opened and closed
//! as the table changes; each connection speaks HTTP/1.1 or HTTP/2
//! (ALPN, or the h2 preface on plain ports) and TLS where the port
//! terminates it. A closed port stops accepting; its open connections
//! finish what they carry.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::handle::{handle, Conn};
use super::workers::Workers;
use super::Shared;
use crate::model::Bind;

#[derive(Debug, thiserror::Error)]
#[error("binding {addr}: {err}")]
pub struct BindError {
    pub bind: Bind,
    pub addr: SocketAddr,
    pub err: std::io::Error,
}

/// Where a table port is bound (the production binder is the port on
/// one address; tests bind port 0 and ask [`Ports::local`]).
pub type Binder = Arc<dyn Fn(Bind) -> SocketAddr + Send + Sync>;

/// The open ports, and the signal that tells their connections to finish.
pub struct Ports {
    shared: Arc<Shared>,
    workers: Workers,
    bind: Binder,
    open: BTreeMap<Bind, (SocketAddr, watch::Sender<bool>)>,
    /// Closes every connection gracefully at shutdown.
    draining: watch::Sender<bool>,
}

impl Ports {
    /// Ports bound on `address`.
    pub fn new(shared: Arc<Shared>, workers: Workers, address: IpAddr) -> Ports {
        Ports::with_binder(
            shared,
            workers,
            Arc::new(move |b: Bind| SocketAddr::new(b.ip.unwrap_or(address), b.port)),
        )
    }

    pub fn with_binder(shared: Arc<Shared>, workers: Workers, bind: Binder) -> Ports {
        Ports {
            shared,
            workers,
            bind,
            open: BTreeMap::new(),
            draining: watch::channel(false).0,
        }
    }

    /// The address a table port is bound at.
    pub fn local(&self, bind: impl Into<Bind>) -> Option<SocketAddr> {
        self.open.get(&bind.into()).map(|(a, _)| *a)
    }

    /// Opens the ports `want` has and closes the others; a port that
    /// cannot be bound is returned, the rest proceed.
    pub async fn reconcile(&mut self, want: &BTreeSet<Bind>) -> Vec<BindError> {
        let gone: Vec<Bind> = self
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
        let new: Vec<Bind> = want
            .iter()
            .filter(|p| !self.open.contains_key(p))
            .copied()
            .collect();
        for p in new {
            match self.open_port(p) {
                Ok((local, tx)) => drop(self.open.insert(p, (local, tx))),
                Err(e) => errs.push(e),
            }
        }
        errs
    }

    /// One `SO_REUSEPORT` socket per worker on the port's address (the
    /// first binds the port, the others join it), each accepted on its
    /// worker's thread.
    fn open_port(&mut self, p: Bind) -> Result<(SocketAddr, watch::Sender<bool>), BindError> {
        let mut addr = (self.bind)(p);
        let (tx, _) = watch::channel(false);
        for h in self.workers.handles() {
            let l = reuseport_listener(addr).map_err(|err| BindError { bind: p, addr, err })?;
            // Port 0 (tests): the others join the port the first got.
            addr = l.local_addr().unwrap_or(addr);
            let (shared, stop, drain) = (
                self.shared.clone(),
                tx.subscribe(),
                self.draining.subscribe(),
            );
            h.spawn(async move {
                match TcpListener::from_std(l) {
                    Ok(l) => accept(l, p, shared, stop, drain).await,
                    Err(e) => tracing::warn!(bind = %p, "listening: {e}"),
                }
            });
        }
        Ok((addr, tx))
    }

    /// Stops accepting everywhere and asks every connection to finish.
    pub fn drain(&mut self) {
        for (_, (_, stop)) in std::mem::take(&mut self.open) {
            let _ = stop.send(true);
        }
        let _ = self.draining.send(true);
    }
}

fn reuseport_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let s = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    s.set_reuseaddr(true)?;
    s.set_reuseport(true)?;
    s.bind(addr)?;
    let l = s.listen(1024)?;
    l.into_std()
}

async fn accept(
    l: TcpListener,
    bind: Bind,
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
                    tokio::spawn(connection(s, remote, bind, shared.clone(), draining.clone()));
                }
                Err(e) => {
                    tracing::warn!(%bind, "accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
        }
    }
}

async fn connection(
    s: TcpStream,
    remote: SocketAddr,
    bind: Bind,
    shared: Arc<Shared>,
    draining: watch::Receiver<bool>,
) {
    let tls = shared.tls.load().get(&bind).cloned();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let conn = Arc::new(Conn::new(bind, scheme, remote));
    let timeout = shared.header_timeout;
    let svc = {
        let shared = shared.clone();
        service_fn(move |req| handle(shared.clone(), conn.clone(), req))
    };
    match tls {
        Some(cfg) => {
            let hs = tokio_rustls::TlsAcceptor::from(cfg).accept(s);
            match tokio::time::timeout(timeout, hs).await {
                Ok(Ok(t)) => serve(TokioIo::new(t), svc, timeout, draining).await,
                Ok(Err(e)) => tracing::debug!(%remote, %bind, "TLS handshake: {e}"),
                Err(_) => tracing::debug!(%remote, %bind, "TLS handshake: timed out"),
            }
        }
        None => serve(TokioIo::new(s), svc, timeout, draining).await,
    }
}

async fn serve<I, S>(io: I, svc: S, timeout: Duration, mut draining: watch::Receiver<bool>)
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
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout);
    // HTTP/2: a peer that stops answering pings is dropped.
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(timeout)
        .keep_alive_timeout(timeout);
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
