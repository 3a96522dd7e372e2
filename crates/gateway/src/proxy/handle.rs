//! One request: look its rule up in the current table, answer a
//! redirect, or edit it by the rule's filters and send it to one of the
//! rule's backends (by weight), retrying only where that is safe or the
//! route asks for it; then edit the response and count it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use hyper::body::{Body as _, Incoming};

use super::filters;
use super::forward::{self, full, stream, Body, TryError};
use super::Shared;
use crate::model::hosts::request_host;
use crate::model::matcher::{Match, Request as Req};
use crate::model::{Backend, BackendEndpoints, Rule};

/// The connection a request came on.
pub struct Conn {
    /// What the listener serves (the table's key).
    pub bind: crate::model::Bind,
    pub scheme: &'static str,
    pub remote: SocketAddr,
    /// The client's address as a header value (X-Forwarded-For), made
    /// once per connection.
    pub remote_ip: HeaderValue,
}

impl Conn {
    pub fn new(bind: crate::model::Bind, scheme: &'static str, remote: SocketAddr) -> Conn {
        let ip = remote.ip().to_string();
        Conn {
            bind,
            scheme,
            remote,
            remote_ip: HeaderValue::try_from(ip).expect("an address is a header value"),
        }
    }
}

static TURN: AtomicU64 = AtomicU64::new(0);

/// A cheap spread for backend and endpoint choice (splitmix64 of a
/// counter): uniform enough for weights, no lock, no syscall.
fn next_random() -> u64 {
    let mut z = TURN.fetch_add(0x9E37_79B9_7F4A_7C15, Relaxed);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn status(code: StatusCode, why: &str) -> Response<Body> {
    let mut r = Response::new(full(format!("{why}\n")));
    *r.status_mut() = code;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

/// Serves one request.
pub async fn handle(
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let start = Instant::now();
    let table = shared.table.load_full();
    let host = request_host(req.uri(), req.headers());
    // Only the access log needs these after the request is consumed.
    let logged = shared
        .access_log
        .then(|| (req.method().clone(), req.uri().path().to_string()));
    let found = table.route(
        conn.bind,
        &host,
        &Req {
            method: req.method(),
            path: req.uri().path(),
            query: req.uri().query(),
            headers: req.headers(),
        },
    );
    let Some(found) = found else {
        shared.stats.record(None, None, 404, start.elapsed());
        log(&conn, logged, &host, 404, None, None);
        return Ok(status(StatusCode::NOT_FOUND, "no route"));
    };
    let (rule, m) = (found.rule, found.m);
    let (resp, backend) = match &rule.redirect {
        Some(r) => (redirect(r, &conn, &host, &req, m), None),
        None => {
            let fut = proxy(&shared, &conn, rule, m, &host, req);
            match rule.timeout {
                Some(t) => match tokio::time::timeout(t, fut).await {
                    Ok(r) => r,
                    Err(_) => (status(StatusCode::GATEWAY_TIMEOUT, "request timeout"), None),
                },
                None => fut.await,
            }
        }
    };
    let code = resp.status().as_u16();
    let key = backend.and_then(|i| rule.backends[i].key.as_ref());
    shared
        .stats
        .record(Some(&rule.route), key, code, start.elapsed());
    log(&conn, logged, &host, code, Some(rule), key);
    Ok(resp)
}

fn log(
    c: &Conn,
    logged: Option<(http::Method, String)>,
    host: &str,
    code: u16,
    rule: Option<&Rule>,
    backend: Option<&crate::model::BackendKey>,
) {
    if let Some((method, path)) = logged {
        let route = rule
            .map(|r| r.route.to_string())
            .unwrap_or_else(|| "-".into());
        let backend = backend.map(|b| b.to_string()).unwrap_or_default();
        tracing::info!(target: "podnet::access", client = %c.remote, bind = %c.bind, %method, host, path, code, route, backend);
    }
}

fn redirect(
    r: &crate::model::Redirect,
    conn: &Conn,
    host: &str,
    req: &Request<Incoming>,
    m: &Match,
) -> Response<Body> {
    let pq = req
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    let loc = filters::location(r, conn.scheme, host, conn.bind.port, &pq, m);
    let mut resp = Response::new(full(Vec::new()));
    *resp.status_mut() = StatusCode::from_u16(r.status).unwrap_or(StatusCode::FOUND);
    if let Ok(v) = HeaderValue::try_from(loc) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp
}

/// Picks a backend (its index) by weight; None when every weight is 0.
fn pick(rule: &Rule) -> Option<usize> {
    if let [only] = rule.backends.as_slice() {
        return (only.weight > 0).then_some(0);
    }
    let total = rule.total_weight();
    if total == 0 {
        return None;
    }
    let mut at = next_random() % total;
    rule.backends.iter().position(|b| {
        let hit = at < u64::from(b.weight);
        at = at.saturating_sub(u64::from(b.weight));
        hit
    })
}

/// Names made once: a `&str` name is parsed again on every use.
const HOP_BY_HOP: [header::HeaderName; 8] = [
    header::CONNECTION,
    header::HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];
const X_FORWARDED_FOR: header::HeaderName = header::HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: header::HeaderName = header::HeaderName::from_static("x-forwarded-proto");

fn strip_hop_by_hop(h: &mut HeaderMap, upgrading: bool) {
    if h.contains_key(header::CONNECTION) {
        strip_connection_named(h, upgrading);
    }
    for n in &HOP_BY_HOP {
        h.remove(n);
    }
    if upgrading {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        h.remove(header::UPGRADE);
    }
}

/// Removes the headers `Connection` names (but `upgrade` when upgrading).
fn strip_connection_named(h: &mut HeaderMap, upgrading: bool) {
    let named: Vec<String> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()))
        .filter(|s| !(upgrading && s == "upgrade"))
        .collect();
    for n in named {
        h.remove(n.as_str());
    }
}

fn is_upgrade(h: &HeaderMap) -> bool {
    h.contains_key(header::UPGRADE)
        && h.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str()
                .is_ok_and(|s| s.to_ascii_lowercase().contains("upgrade"))
        })
}

/// Forwards to a backend of `rule`; returns the response and the index
/// of the backend that gave it.
async fn proxy(
    shared: &Shared,
    conn: &Conn,
    rule: &Rule,
    m: &Match,
    host: &str,
    mut req: Request<Incoming>,
) -> (Response<Body>, Option<usize>) {
    let Some(bi) = pick(rule) else {
        return (
            status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "every backend has weight 0",
            ),
            None,
        );
    };
    let b = &rule.backends[bi];
    let Some(key) = &b.key else {
        return (
            status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the route's backend reference is invalid",
            ),
            Some(bi),
        );
    };
    let eps = shared
        .endpoints
        .load()
        .get(key)
        .cloned()
        .unwrap_or_default();
    if eps.addrs.is_empty() {
        return (
            status(StatusCode::SERVICE_UNAVAILABLE, "no ready endpoint"),
            Some(bi),
        );
    }
    let upgrading = is_upgrade(req.headers()) && req.version() == http::Version::HTTP_11;
    let client_upgrade = upgrading.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    edit_request(&mut parts, conn, rule, b, m, host, upgrading);
    let replayable = body.is_end_stream();
    mirror(shared, rule, &parts, replayable);
    let mut resp = match send(rule, &eps, parts, body, replayable).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!("{e}");
            let code = match e {
                TryError::Timeout(..) => StatusCode::GATEWAY_TIMEOUT,
                TryError::Connect(..) => StatusCode::SERVICE_UNAVAILABLE,
                TryError::Request(..) => StatusCode::BAD_GATEWAY,
            };
            return (status(code, &e.to_string()), Some(bi));
        }
    };
    let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
    if let (true, Some(cu)) = (switching, client_upgrade) {
        forward::splice(cu, hyper::upgrade::on(&mut resp));
    }
    let (mut rp, rb) = resp.into_parts();
    strip_hop_by_hop(&mut rp.headers, switching);
    for e in [&rule.response_headers, &b.response_headers]
        .into_iter()
        .flatten()
    {
        filters::edit_headers(&mut rp.headers, e);
    }
    (Response::from_parts(rp, stream(rb)), Some(bi))
}

fn edit_request(
    parts: &mut http::request::Parts,
    conn: &Conn,
    rule: &Rule,
    b: &Backend,
    m: &Match,
    host: &str,
    upgrading: bool,
) {
    // The Host the backend sees: the rewrite's, else the request
    // target's authority (HTTP/2, absolute-form), else the client's Host
    // header as it came, else the host routed on.
    let authority = parts.uri.authority().map(|a| a.as_str().to_string());
    strip_hop_by_hop(&mut parts.headers, upgrading);
    for e in [&rule.request_headers, &b.request_headers]
        .into_iter()
        .flatten()
    {
        filters::edit_headers(&mut parts.headers, e);
    }
    let pq = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    let (pq, new_host) = match &rule.rewrite {
        Some(rw) => filters::rewrite(&pq, rw, m),
        None => (pq, None),
    };
    parts.uri = Uri::from(pq);
    let host_value = match (new_host, authority) {
        (Some(h), _) | (None, Some(h)) => Some(h),
        (None, None) if parts.headers.contains_key(header::HOST) => None,
        (None, None) => Some(host.to_string()),
    };
    if let Some(Ok(v)) = host_value.map(HeaderValue::try_from) {
        parts.headers.insert(header::HOST, v);
    }
    let xff = match parts.headers.get(&X_FORWARDED_FOR).map(|v| v.as_bytes()) {
        Some(prev) => {
            let mut v = prev.to_vec();
            v.extend_from_slice(b", ");
            v.extend_from_slice(conn.remote_ip.as_bytes());
            HeaderValue::from_bytes(&v).ok()
        }
        None => Some(conn.remote_ip.clone()),
    };
    if let Some(v) = xff {
        parts.headers.insert(X_FORWARDED_FOR, v);
    }
    parts
        .headers
        .insert(X_FORWARDED_PROTO, HeaderValue::from_static(conn.scheme));
}

/// Tries endpoints until one answers: a connection that could not be
/// made is tried elsewhere once (nothing was sent); a response or
/// failure after sending is retried only as the route's retry allows,
/// and only for a request without a body.
async fn send(
    rule: &Rule,
    eps: &BackendEndpoints,
    parts: http::request::Parts,
    body: Incoming,
    replayable: bool,
) -> Result<Response<Incoming>, TryError> {
    let retry = rule.retry.as_ref();
    let attempts = 1 + retry.map_or(0, |r| r.attempts) as usize;
    // More than one try needs the request head again.
    let again_possible = replayable && (attempts > 1 || eps.addrs.len() > 1);
    let spare = again_possible.then(|| parts.clone());
    let mut parts = Some(parts);
    let mut body = Some(stream(body));
    let mut connect_retry = true;
    let mut tried = 0;
    let start = next_random() as usize;
    loop {
        let i = (start + tried) % eps.addrs.len();
        tried += 1;
        let mut head = match parts.take() {
            Some(p) => p,
            None => spare.clone().expect("a spare head when trying again"),
        };
        head.uri = backend_uri(&eps.authorities[i], &head.uri);
        let req = Request::from_parts(head, body.take().unwrap_or_else(|| full(Vec::new())));
        let res = forward::clients()
            .send(eps.addrs[i], req, eps.h2c, rule.backend_timeout)
            .await;
        let again = tried < attempts && replayable;
        match res {
            Ok(r) if again && retry.is_some_and(|rt| rt.codes.contains(&r.status().as_u16())) => {}
            Ok(r) => return Ok(r),
            Err(e)
                if e.before_sending() && again_possible && connect_retry && eps.addrs.len() > 1 =>
            {
                connect_retry = false
            }
            Err(_) if again => {}
            Err(e) => return Err(e),
        }
        if spare.is_none() {
            // Nothing to send again with.
            return Err(TryError::Request(eps.addrs[i], "no retry possible".into()));
        }
        if let Some(b) = retry.and_then(|r| r.backoff) {
            tokio::time::sleep(b).await;
        }
    }
}

/// `http://ENDPOINT/path?query`, without parsing anything again.
fn backend_uri(authority: &http::uri::Authority, uri: &Uri) -> Uri {
    let mut p = http::uri::Parts::default();
    p.scheme = Some(http::uri::Scheme::HTTP);
    p.authority = Some(authority.clone());
    p.path_and_query = Some(
        uri.path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
    );
    Uri::from_parts(p).unwrap_or_else(|_| uri.clone())
}

/// Sends a copy of a bodiless request to each mirror (the share it asks
/// for), answers ignored.
fn mirror(shared: &Shared, rule: &Rule, parts: &http::request::Parts, replayable: bool) {
    if rule.mirrors.is_empty() || !replayable {
        return;
    }
    let eps = shared.endpoints.load();
    for (key, share) in &rule.mirrors {
        if (next_random() % 10_000) as f64 >= share * 10_000.0 {
            continue;
        }
        let Some(e) = eps.get(key).filter(|e| !e.addrs.is_empty()).cloned() else {
            continue;
        };
        let addr = e.addrs[next_random() as usize % e.addrs.len()];
        let mut req = Request::from_parts(parts.clone(), full(Vec::new()));
        let pq = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let Ok(u) = Uri::builder()
            .scheme("http")
            .authority(addr.to_string())
            .path_and_query(pq)
            .build()
        else {
            continue;
        };
        *req.uri_mut() = u;
        let clients = forward::clients();
        tokio::spawn(async move {
            let _ = clients
                .send(addr, req, e.h2c, Some(std::time::Duration::from_secs(10)))
                .await;
        });
    }
}
