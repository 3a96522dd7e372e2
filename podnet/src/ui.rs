//! `podnet ui --lab NAME [--listen 127.0.0.1:PORT]`: one page, served by
//! podnet itself, that shows the lab: its nodes with their subnets and
//! tunnels, the pods on each node, the Services with their endpoints, the
//! live flows of every node, and a trace drawn as a path across that
//! picture.
//!
//! The page (`ui/index.html`, plain HTML, CSS and JavaScript with no
//! dependencies) is compiled into the binary. It reads:
//! - `/api/topology`: the picture, from a [`View`] kept current from the
//!   lab's object source;
//! - `/api/flows`: the newest flows every agent still holds (its `/flows`
//!   log), so the page opens on what already happened, with each node's
//!   cursor;
//! - `/api/events?after=NODE:N,...`: server-sent events, `topology` when
//!   the picture changed and `flow` for each new flow of any node after
//!   the cursors (read from each agent's `/flows`);
//! - `POST /api/trace` (form body `src=&dst=`): runs `podnet trace` and
//!   returns its hops.
//!
//! Who may ask is decided first, on every request ([`access`]): the Host
//! and Origin must name this server, the API needs the token printed at
//! start, and a trace is POST only.
//!
//! The server is a small HTTP/1.1 loop on tokio, like the daemons' metrics
//! server: one request per connection, the event stream held open.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::trace::{Target, TraceContext, View};
use podnet_trace::flows::{FlowRecord, Page};

mod access;
use access::{Access, Refusal, Request};

const PAGE: &str = include_str!("ui/index.html");

#[derive(Serialize, PartialEq)]
struct NodeView {
    name: String,
    ip: IpAddr,
    subnet: Option<String>,
    /// Its IPv6 pod subnet (dual-stack).
    subnet6: Option<String>,
}

#[derive(Serialize, PartialEq)]
struct PodView {
    name: String,
    ip: Option<IpAddr>,
    /// Its IPv6 address (dual-stack).
    ip6: Option<IpAddr>,
    node: Option<String>,
}

#[derive(Serialize, PartialEq)]
struct ServiceView {
    name: String,
    kind: String,
    cluster_ip: Option<String>,
    ports: Vec<String>,
    endpoints: Vec<String>,
}

#[derive(Serialize, PartialEq)]
struct Topology {
    /// What is shown: `lab NAME` or `node NAME`.
    lab: String,
    backend: String,
    nodes: Vec<NodeView>,
    pods: Vec<PodView>,
    services: Vec<ServiceView>,
}

fn topology(ctx: &TraceContext, v: &View) -> Topology {
    let nodes = ctx
        .nodes(v)
        .into_iter()
        .map(|n| NodeView {
            name: n.name,
            ip: n.ip,
            subnet: n.subnet.map(|s| s.to_string()),
            subnet6: n.subnet6.map(|s| s.to_string()),
        })
        .collect();
    let pods = v
        .world
        .pods
        .iter()
        .map(|(k, p)| PodView {
            name: k.to_string(),
            ip: p
                .ips
                .iter()
                .find(|i| i.is_ipv4())
                .or(p.ips.first())
                .copied(),
            ip6: p.ips.iter().find(|i| i.is_ipv6()).copied(),
            node: p.node.clone(),
        })
        .collect();
    let mut services = Vec::new();
    for (id, s) in &v.services {
        let spec = s.spec.clone().unwrap_or_default();
        let mut endpoints: Vec<String> = v
            .slices
            .values()
            .filter(|sl| {
                sl.metadata.namespace == s.metadata.namespace
                    && sl
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("kubernetes.io/service-name"))
                        == s.metadata.name.as_ref()
            })
            .flat_map(|sl| {
                let ports: Vec<i32> = sl
                    .ports
                    .clone()
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|p| p.port)
                    .collect();
                sl.endpoints
                    .iter()
                    .flatten()
                    .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
                    .flat_map(move |e| {
                        let ports = ports.clone();
                        e.addresses.clone().into_iter().flat_map(move |a| {
                            ports.clone().into_iter().map(move |p| format!("{a}:{p}"))
                        })
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        endpoints.sort();
        endpoints.dedup();
        services.push(ServiceView {
            name: id.clone(),
            kind: spec.type_.clone().unwrap_or_else(|| "ClusterIP".into()),
            // Every family's (a dual-stack Service has two).
            cluster_ip: match spec.cluster_ips.as_deref() {
                Some(ips) if ips.len() > 1 => Some(ips.join(", ")),
                _ => spec.cluster_ip.clone(),
            },
            ports: spec
                .ports
                .unwrap_or_default()
                .iter()
                .map(|p| {
                    let proto = p.protocol.clone().unwrap_or("TCP".into());
                    match p.node_port {
                        Some(np) => format!("{}:{np}/{proto}", p.port),
                        None => format!("{}/{proto}", p.port),
                    }
                })
                .collect(),
            endpoints,
        });
    }
    Topology {
        lab: ctx.label(),
        backend: ctx.backend(),
        nodes,
        pods,
        services,
    }
}

/// Decodes `%XX` and `+` in a query value.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 3 <= b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (unescape(k), unescape(v))
        })
        .collect()
}

struct Ui {
    access: Access,
    ctx: TraceContext,
    view: Arc<RwLock<View>>,
}

/// Headers on every answer: no caching, no framing by another page, no
/// Referer (the page's URL may still hold the token), no sniffing.
const COMMON: &str = "Cache-Control: no-store\r\nX-Frame-Options: DENY\r\n\
    Content-Security-Policy: frame-ancestors 'none'\r\nReferrer-Policy: no-referrer\r\n\
    X-Content-Type-Options: nosniff\r\n";

/// The page talks to this server only: were something injected into it,
/// it could not send the token or the cluster's picture elsewhere.
const PAGE_POLICY: &str = "Content-Security-Policy: default-src 'none'; \
    script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; \
    base-uri 'none'; form-action 'none'\r\n";

async fn respond_with(
    s: &mut tokio::net::TcpStream,
    code: u16,
    ctype: &str,
    extra: &str,
    body: &str,
) {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        405 => "Method Not Allowed",
        413 => "Content Too Large",
        421 => "Misdirected Request",
        _ => "Not Found",
    };
    let resp = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{COMMON}{extra}Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(resp.as_bytes()).await;
}

async fn respond(s: &mut tokio::net::TcpStream, code: u16, ctype: &str, body: &str) {
    respond_with(s, code, ctype, "", body).await
}

/// The most flows the page shows, and so the most `/api/flows` gives.
const RECENT: usize = 200;

type FlowSource = (String, Option<podnet_kernel::Netns>, SocketAddr);

/// One node's flows after `from`, read page by page from its agent's
/// `/flows` until caught up, keeping the newest `keep`; and the number to
/// ask after next. None when the agent does not answer.
fn flows_after(src: &FlowSource, from: u64, keep: usize) -> Option<(Vec<FlowRecord>, u64)> {
    let (_, ns, addr) = src;
    let mut flows: Vec<FlowRecord> = Vec::new();
    let mut after = from;
    // The log holds a few pages at most; the bound only guards a log
    // that grows faster than it is read.
    for _ in 0..16 {
        let path = format!("/flows?after={after}");
        let got = crate::trace::agent_get(ns.as_ref()).get(*addr, &path);
        let Ok(podnet_daemon::Response { status: 200, body }) = got else {
            return None;
        };
        let page: Page = serde_json::from_str(&body).ok()?;
        let done = page.flows.is_empty() || page.last == after;
        after = page.last;
        flows.extend(page.flows);
        let extra = flows.len().saturating_sub(keep);
        flows.drain(..extra);
        if done {
            break;
        }
    }
    Some((flows, after))
}

/// The cursors a client hands the event stream: `node:N,node:N`.
fn cursors(q: &str) -> BTreeMap<String, u64> {
    query(q)
        .get("after")
        .map(|a| {
            a.split(',')
                .filter_map(|c| {
                    let (n, v) = c.rsplit_once(':')?;
                    Some((n.to_string(), v.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `/api/flows`: the newest flows of every node (at most [`RECENT`], oldest
/// first), so the page opens on what already happened, and each node's
/// cursor, from which the event stream goes on.
async fn recent_flows(ui: &Ui) -> String {
    let sources = ui.ctx.flow_sources().unwrap_or_default();
    let (mut flows, after) = tokio::task::spawn_blocking(move || {
        let mut flows = Vec::new();
        let mut after = BTreeMap::new();
        for src in &sources {
            if let Some((f, last)) = flows_after(src, 0, RECENT) {
                flows.extend(f);
                after.insert(src.0.clone(), last);
            }
        }
        (flows, after)
    })
    .await
    .unwrap_or_default();
    flows.sort_by_key(|f| (f.time_ms, f.node.clone(), f.seq));
    let extra = flows.len().saturating_sub(RECENT);
    flows.drain(..extra);
    serde_json::json!({"flows": flows, "after": after}).to_string()
}

/// The event stream: the picture when it changes, each node's new flows
/// after the cursors the client gave (from the start of each log without).
async fn events(ui: Arc<Ui>, mut s: tokio::net::TcpStream, mut after: BTreeMap<String, u64>) {
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n{COMMON}Connection: keep-alive\r\n\r\n"
    );
    if s.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let mut last_topology = String::new();
    loop {
        let t = {
            let v = ui.view.read().expect("view");
            serde_json::to_string(&topology(&ui.ctx, &v)).unwrap_or_default()
        };
        let mut out = String::new();
        if t != last_topology {
            out.push_str(&format!("event: topology\ndata: {t}\n\n"));
            last_topology = t;
        }
        // Each node's new flows (its agent's /flows, inside its namespace).
        let sources = ui.ctx.flow_sources().unwrap_or_default();
        let cursors = after.clone();
        let got = tokio::task::spawn_blocking(move || {
            sources
                .iter()
                .filter_map(|src| {
                    let from = cursors.get(&src.0).copied().unwrap_or(0);
                    let (flows, last) = flows_after(src, from, usize::MAX)?;
                    Some((src.0.clone(), flows, last))
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        for (node, flows, last) in got {
            after.insert(node, last);
            for f in flows {
                out.push_str(&format!(
                    "event: flow\ndata: {}\n\n",
                    serde_json::to_string(&f).unwrap_or_default()
                ));
            }
        }
        if out.is_empty() {
            out.push_str(": keep-alive\n\n");
        }
        if s.write_all(out.as_bytes()).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Reads one request: a head of at most 8 KiB and a body of at most
/// 16 KiB (by its Content-Length), within 5 s.
async fn read_request(s: &mut tokio::net::TcpStream) -> Result<Request, (u16, &'static str)> {
    const HEAD: usize = 8192;
    const BODY: usize = 16384;
    let mut buf = Vec::with_capacity(4096);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    async fn read(
        s: &mut tokio::net::TcpStream,
        buf: &mut Vec<u8>,
        deadline: tokio::time::Instant,
    ) -> bool {
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Ok(Ok(k)) if k > 0 => {
                buf.extend_from_slice(&chunk[..k]);
                true
            }
            _ => false,
        }
    }
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > HEAD {
            return Err((413, "podnet ui: request head too large\n"));
        }
        if !read(s, &mut buf, deadline).await {
            return Err((400, "podnet ui: incomplete request\n"));
        }
    };
    let mut req = Request::parse_head(&String::from_utf8_lossy(&buf[..end]))
        .ok_or((400, "podnet ui: no request line\n"))?;
    let want = req.content_length().unwrap_or(0);
    if want > BODY {
        return Err((413, "podnet ui: request body too large\n"));
    }
    let mut body = buf.split_off(end + 4);
    while body.len() < want {
        if !read(s, &mut body, deadline).await {
            return Err((400, "podnet ui: incomplete request body\n"));
        }
    }
    body.truncate(want);
    req.body = body;
    Ok(req)
}

/// The one method each path takes: reading is GET, acting is POST.
fn method_of(path: &str) -> Option<&'static str> {
    match path {
        "/" | "/index.html" | "/api/topology" | "/api/flows" | "/api/events" => Some("GET"),
        "/api/trace" => Some("POST"),
        _ => None,
    }
}

async fn refuse(s: &mut tokio::net::TcpStream, req: &Request, r: Refusal, extra: &str) {
    tracing::warn!("refused {} {}: {}", req.method, req.path, r.body.trim_end());
    respond_with(s, r.code, "text/plain; charset=utf-8", extra, &r.body).await
}

async fn handle(ui: Arc<Ui>, mut s: tokio::net::TcpStream) {
    let req = match read_request(&mut s).await {
        Ok(r) => r,
        Err((code, msg)) => return respond(&mut s, code, "text/plain", msg).await,
    };
    // Host and Origin first: a rebound name or a foreign page learns
    // nothing, not even which paths exist.
    if let Err(r) = ui.access.admit(&req) {
        return refuse(&mut s, &req, r, "").await;
    }
    let Some(method) = method_of(&req.path) else {
        return respond(&mut s, 404, "text/plain", "not found\n").await;
    };
    if req.method != method {
        let r = Refusal {
            code: 405,
            body: format!("podnet ui: {} takes {method} only\n", req.path),
        };
        return refuse(&mut s, &req, r, &format!("Allow: {method}\r\n")).await;
    }
    let page = matches!(req.path.as_str(), "/" | "/index.html");
    if !page && !ui.access.authorized(&req) {
        return refuse(&mut s, &req, ui.access.unauthorized(), "").await;
    }
    match req.path.as_str() {
        "/api/topology" => {
            let body = {
                let v = ui.view.read().expect("view");
                serde_json::to_string(&topology(&ui.ctx, &v)).unwrap_or_default()
            };
            respond(&mut s, 200, "application/json", &body).await
        }
        "/api/flows" => {
            let body = recent_flows(&ui).await;
            respond(&mut s, 200, "application/json", &body).await
        }
        "/api/events" => {
            let after = cursors(&req.query);
            events(ui, s, after).await
        }
        "/api/trace" => trace(ui, s, &req).await,
        _ => respond_with(&mut s, 200, "text/html; charset=utf-8", PAGE_POLICY, PAGE).await,
    }
}

/// `POST /api/trace` with a form body `src=POD&dst=DST:PORT`: runs the
/// trace and answers its hops.
async fn trace(ui: Arc<Ui>, mut s: tokio::net::TcpStream, req: &Request) {
    let q = query(&String::from_utf8_lossy(&req.body));
    let (Some(src), Some(dst)) = (q.get("src").cloned(), q.get("dst").cloned()) else {
        return respond(
            &mut s,
            400,
            "text/plain",
            "want a form body src=POD&dst=DST:PORT\n",
        )
        .await;
    };
    let r = tokio::task::spawn_blocking(move || {
        let v = ui.view.read().expect("view");
        crate::trace::trace_in(&ui.ctx, &v, &src, &dst)
    })
    .await
    .map_err(|e| anyhow!("{e}"))
    .and_then(|r| r);
    match r {
        Ok(t) => {
            respond(
                &mut s,
                200,
                "application/json",
                &serde_json::to_string(&t).unwrap_or_default(),
            )
            .await
        }
        Err(e) => respond(&mut s, 400, "text/plain", &format!("{e:#}\n")).await,
    }
}

/// `podnet ui`: serves until interrupted.
pub async fn run(target: &Target, listen: &str) -> Result<()> {
    let addr: SocketAddr = podnet_daemon::listen_addr(listen).map_err(anyhow::Error::msg)?;
    let (ctx, source) = TraceContext::open(target).await?;
    let view = Arc::new(RwLock::new(View::default()));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let _keep = tokio::spawn(crate::trace::keep(source, view.clone(), Some(tx)));
    tokio::time::timeout(Duration::from_secs(15), rx)
        .await
        .map_err(|_| anyhow!("the cluster's objects did not arrive within 15s"))?
        .map_err(|_| anyhow!("the object source ended"))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    let access =
        Access::new(listener.local_addr()?).map_err(|e| anyhow!("drawing the ui's token: {e}"))?;
    // The one way in, as Jupyter prints it: the page with its token.
    eprintln!("podnet ui: {} on {}", ctx.label(), access.url());
    let ui = Arc::new(Ui { access, ctx, view });
    // The standalone nodes' subnet leases are not objects: reread them.
    let refresher = ui.clone();
    let _leases = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            if let Err(e) = refresher.ctx.refresh().await {
                tracing::warn!("{e:#}");
            }
        }
    });
    loop {
        tokio::select! {
            _ = podnet_daemon::shutdown_signal() => return Ok(()),
            a = listener.accept() => {
                if let Ok((s, _)) = a {
                    tokio::spawn(handle(ui.clone(), s));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_decode() {
        let c = cursors("after=node1%3A12%2Cnode2:3,bad:x,nocolon");
        assert_eq!(c, [("node1".into(), 12), ("node2".into(), 3)].into());
        assert!(cursors("").is_empty());
    }

    #[test]
    fn queries_decode() {
        let q = query("src=default%2Fa&dst=default/web:80&x=a+b&bad=%zz");
        assert_eq!(q["src"], "default/a");
        assert_eq!(q["dst"], "default/web:80");
        assert_eq!(q["x"], "a b");
        assert_eq!(q["bad"], "%zz");
    }
}
