//! The backend side: pooled HTTP/1.1 and h2c clients, one try with its
//! timeout, and the WebSocket (Upgrade) splice.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = BoxBody<Bytes, BoxError>;

/// Why a try failed before a response came.
#[derive(Debug, thiserror::Error)]
pub enum TryError {
    #[error("backend {0}: connect: {1}")]
    Connect(SocketAddr, String),
    #[error("backend {0}: {1}")]
    Request(SocketAddr, String),
    #[error("backend {0}: no response within {1:?}")]
    Timeout(SocketAddr, Duration),
}

impl TryError {
    /// A connection never made: safe to try elsewhere whatever the method.
    pub fn before_sending(&self) -> bool {
        matches!(self, TryError::Connect(..))
    }
}

thread_local! {
    /// Each data-plane thread keeps its own pools: a request never waits
    /// on another thread's connection, and no lock is shared.
    static CLIENTS: Clients = Clients::new();
}

/// This thread's pools.
pub fn clients() -> Clients {
    CLIENTS.with(Clients::clone)
}

/// One pool per protocol (clones share the pools).
#[derive(Clone)]
pub struct Clients {
    http1: Client<HttpConnector, Body>,
    h2c: Client<HttpConnector, Body>,
}

impl Default for Clients {
    fn default() -> Self {
        Self::new()
    }
}

impl Clients {
    pub fn new() -> Clients {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        conn.set_connect_timeout(Some(Duration::from_secs(5)));
        let http1 = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(256)
            .set_host(false)
            .build(conn.clone());
        let h2c = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .set_host(false)
            .build(conn);
        Clients { http1, h2c }
    }

    /// Sends `req` (its URI already pointing at `addr`) and waits up to
    /// `timeout` for the response head.
    pub async fn send(
        &self,
        addr: SocketAddr,
        mut req: Request<Body>,
        h2c: bool,
        timeout: Option<Duration>,
    ) -> Result<Response<hyper::body::Incoming>, TryError> {
        let client = match h2c {
            true => {
                *req.version_mut() = Version::HTTP_2;
                &self.h2c
            }
            false => {
                *req.version_mut() = Version::HTTP_11;
                &self.http1
            }
        };
        let fut = client.request(req);
        let res = match timeout {
            Some(t) => tokio::time::timeout(t, fut)
                .await
                .map_err(|_| TryError::Timeout(addr, t))?,
            None => fut.await,
        };
        res.map_err(|e| match e.is_connect() {
            true => TryError::Connect(addr, source_chain(&e)),
            false => TryError::Request(addr, source_chain(&e)),
        })
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Joins the client's upgraded connection to the backend's, both ways,
/// once both sides have switched protocols.
pub fn splice(client: hyper::upgrade::OnUpgrade, backend: hyper::upgrade::OnUpgrade) {
    tokio::spawn(async move {
        let (c, b) = match tokio::try_join!(client, backend) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!("upgrade failed: {e}");
                return;
            }
        };
        let mut c = TokioIo::new(c);
        let mut b = TokioIo::new(b);
        if let Err(e) = tokio::io::copy_bidirectional(&mut c, &mut b).await {
            tracing::debug!("upgraded connection ended: {e}");
        }
    });
}

/// A body of fixed bytes.
pub fn full(b: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(b.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A streaming body passed through.
pub fn stream(b: hyper::body::Incoming) -> Body {
    b.map_err(|e| Box::new(e) as BoxError).boxed()
}
