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
//! - `/api/events`: server-sent events, `topology` when the picture
//!   changed and `flow` for each new flow of any node (read from each
//!   agent's `/flows`);
//! - `/api/trace?src=&dst=`: runs `podnet trace` and returns its hops.
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

const PAGE: &str = include_str!("ui/index.html");

#[derive(Serialize, PartialEq)]
struct NodeView {
    name: String,
    ip: IpAddr,
    subnet: Option<String>,
}

#[derive(Serialize, PartialEq)]
struct PodView {
    name: String,
    ip: Option<IpAddr>,
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
        })
        .collect();
    let pods = v
        .world
        .pods
        .iter()
        .map(|(k, p)| PodView {
            name: k.to_string(),
            ip: p.ips.first().copied(),
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
            cluster_ip: spec.cluster_ip.clone(),
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
    ctx: TraceContext,
    view: Arc<RwLock<View>>,
}

async fn respond(s: &mut tokio::net::TcpStream, code: u16, ctype: &str, body: &str) {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        _ => "Not Found",
    };
    let resp = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(resp.as_bytes()).await;
}

/// The event stream: the picture when it changes, each node's new flows.
async fn events(ui: Arc<Ui>, mut s: tokio::net::TcpStream) {
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\nConnection: keep-alive\r\n\r\n";
    if s.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let mut last_topology = String::new();
    let mut after: BTreeMap<String, u64> = BTreeMap::new();
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
            let mut res = Vec::new();
            for (name, ns, addr) in &sources {
                let from = cursors.get(name).copied().unwrap_or(0);
                let path = format!("/flows?after={from}");
                let r = match ns {
                    Some(ns) => ns.run(|| crate::trace::http_get(*addr, &path)).ok(),
                    None => Some(crate::trace::http_get(*addr, &path)),
                };
                if let Some(Ok((200, body))) = r {
                    if let Ok(p) = serde_json::from_str::<podnet_trace::flows::Page>(&body) {
                        res.push((name.clone(), p));
                    }
                }
            }
            res
        })
        .await
        .unwrap_or_default();
        for (node, page) in got {
            after.insert(node, page.last);
            for f in page.flows {
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

async fn handle(ui: Arc<Ui>, mut s: tokio::net::TcpStream) {
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while n < buf.len() && !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout_at(deadline, s.read(&mut buf[n..])).await {
            Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
            Ok(Ok(k)) => n += k,
        }
    }
    let req = String::from_utf8_lossy(&buf[..n]).to_string();
    let target = req.split_whitespace().nth(1).unwrap_or("/").to_string();
    let (path, q) = target.split_once('?').unwrap_or((&target, ""));
    match path {
        "/" | "/index.html" => respond(&mut s, 200, "text/html; charset=utf-8", PAGE).await,
        "/api/topology" => {
            let body = {
                let v = ui.view.read().expect("view");
                serde_json::to_string(&topology(&ui.ctx, &v)).unwrap_or_default()
            };
            respond(&mut s, 200, "application/json", &body).await
        }
        "/api/events" => events(ui, s).await,
        "/api/trace" => {
            let q = query(q);
            let (Some(src), Some(dst)) = (q.get("src").cloned(), q.get("dst").cloned()) else {
                return respond(&mut s, 400, "text/plain", "want ?src=POD&dst=DST:PORT\n").await;
            };
            let u = ui.clone();
            let r = tokio::task::spawn_blocking(move || {
                let v = u.view.read().expect("view");
                crate::trace::trace_in(&u.ctx, &v, &src, &dst)
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
        _ => respond(&mut s, 404, "text/plain", "not found\n").await,
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
    eprintln!(
        "podnet ui: {} on http://{}/",
        ctx.label(),
        listener.local_addr()?
    );
    let ui = Arc::new(Ui { ctx, view });
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
    fn queries_decode() {
        let q = query("src=default%2Fa&dst=default/web:80&x=a+b&bad=%zz");
        assert_eq!(q["src"], "default/a");
        assert_eq!(q["dst"], "default/web:80");
        assert_eq!(q["x"], "a b");
        assert_eq!(q["bad"], "%zz");
    }
}
