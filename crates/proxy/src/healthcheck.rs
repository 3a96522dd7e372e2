//! Health-check node ports for `externalTrafficPolicy: Local` Services.
//!
//! A load balancer in front of such a Service must send traffic only to
//! nodes that have a local endpoint, or the packet is dropped there (Local
//! never forwards to another node, so the client IP survives). Kubernetes
//! gives the Service a `healthCheckNodePort`; every node answers HTTP on it
//! with 200 and the number of local ready endpoints, or 503 when it has
//! none. This module owns that answer:
//!
//! - [`target`] is pure: a Service and its EndpointSlices in, the port and
//!   the local endpoint count out.
//! - [`Server`] keeps one listener per port, opening and closing them as
//!   Services come and go, and answers from shared counts, so an endpoint
//!   change updates a number and never rebinds a socket.
//!
//! The body follows kube-proxy's, so tools that read it keep working.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

/// What a health-check port reports for one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub namespace: String,
    pub name: String,
    /// Ready endpoints on this node.
    pub local: usize,
}

/// The health-check port of a Service and what it should report on `node`;
/// None when the Service needs no health check.
pub fn target(svc: &Service, slices: &[&EndpointSlice], node: &str) -> Option<(u16, Target)> {
    let port = port(svc)?;
    let local = podnet_api::endpoints::ready_on(slices, node);
    Some((
        port,
        Target {
            namespace: svc
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: svc.metadata.name.clone().unwrap_or_default(),
            local,
        },
    ))
}

/// The HTTP status and JSON body a port answers with.
pub fn response(t: &Target) -> (u16, String) {
    let body = serde_json::json!({
        "service": {"namespace": t.namespace, "name": t.name},
        "localEndpoints": t.local,
        "serviceProxyHealthy": true,
    })
    .to_string();
    (if t.local > 0 { 200 } else { 503 }, body)
}

type Shared = Arc<RwLock<BTreeMap<u16, Target>>>;

/// The listeners; lives in the proxy loop.
#[derive(Default)]
pub struct Server {
    state: Shared,
    /// Which port each Service ("ns/name") holds.
    ports: BTreeMap<String, u16>,
    listeners: BTreeMap<u16, JoinHandle<()>>,
}

impl Server {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets what Service `id` needs; opens or closes its port as required.
    pub fn update(&mut self, id: &str, want: Option<(u16, Target)>) {
        let old = self.ports.get(id).copied();
        if let Some(p) = old {
            if want.as_ref().map(|(q, _)| *q) != Some(p) {
                self.ports.remove(id);
                self.state.write().unwrap().remove(&p);
                if let Some(h) = self.listeners.remove(&p) {
                    h.abort();
                }
            }
        }
        let Some((port, t)) = want else { return };
        self.ports.insert(id.to_string(), port);
        self.state.write().unwrap().insert(port, t);
        if !self.listeners.contains_key(&port) {
            match listen(port) {
                Ok(l) => {
                    let state = self.state.clone();
                    self.listeners
                        .insert(port, tokio::spawn(serve(l, port, state)));
                }
                // Retried on the Service's next change or the next relist.
                Err(e) => tracing::warn!("health-check node port {port} for {id}: {e}"),
            }
        }
    }

    /// Replaces everything (after a relist): Services not in `all` lose
    /// their ports.
    pub fn resync(&mut self, all: BTreeMap<String, Option<(u16, Target)>>) {
        let stale: Vec<String> = self
            .ports
            .keys()
            .filter(|id| !all.contains_key(*id))
            .cloned()
            .collect();
        for id in stale {
            self.update(&id, None);
        }
        for (id, want) in all {
            self.update(&id, want);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        for h in self.listeners.values() {
            h.abort();
        }
    }
}

/// The health-check node port `svc` asks for: a LoadBalancer Service with
/// `externalTrafficPolicy: Local` and a port. Only such Services have a
/// target, so the proxy keeps their names and a relist visits those only.
pub fn port(svc: &Service) -> Option<u16> {
    let spec = svc.spec.as_ref()?;
    if spec.type_.as_deref() != Some("LoadBalancer")
        || spec.external_traffic_policy.as_deref() != Some("Local")
    {
        return None;
    }
    u16::try_from(spec.health_check_node_port?)
        .ok()
        .filter(|p| *p != 0)
}

/// All addresses of the node: dual-stack when IPv6 exists, IPv4 otherwise.
fn listen(port: u16) -> std::io::Result<tokio::net::TcpListener> {
    let any6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port);
    let any4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
    let l = match std::net::TcpListener::bind(any6) {
        Ok(l) => l,
        Err(_) => std::net::TcpListener::bind(any4)?,
    };
    l.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(l)
}

async fn serve(l: tokio::net::TcpListener, port: u16, state: Shared) {
    loop {
        let Ok((mut s, _)) = l.accept().await else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            // Read the request head (any path answers, as kube-proxy's does).
            let mut buf = [0u8; 2048];
            let mut n = 0;
            let read = async {
                while n < buf.len() {
                    match s.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(k) => n += k,
                    }
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
            let t = state.read().unwrap().get(&port).cloned();
            let local = t.as_ref().map(|t| t.local).unwrap_or(0);
            let (code, body) = match &t {
                Some(t) => response(t),
                None => (503, "{}".to_string()),
            };
            let reason = if code == 200 {
                "OK"
            } else {
                "Service Unavailable"
            };
            let msg = format!(
                "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\n\
                 X-Content-Type-Options: nosniff\r\nX-Load-Balancing-Endpoint-Weight: {local}\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(msg.as_bytes()).await;
            let _ = s.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(spec: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop"}, "spec": spec}))
        .unwrap()
    }

    fn slice(fam: &str, eps: &[(&str, &str, bool)]) -> EndpointSlice {
        let eps: Vec<_> = eps
            .iter()
            .map(|(a, n, r)| json!({"addresses": [a], "nodeName": n, "conditions": {"ready": r}}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": format!("web-{fam}"), "namespace": "shop"},
            "addressType": fam, "endpoints": eps}))
        .unwrap()
    }

    #[test]
    fn counts_local_ready_endpoints_once_per_pod() {
        let s = svc(
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
            "healthCheckNodePort": 31000, "ports": [{"port": 80}]}),
        );
        let v4 = slice(
            "IPv4",
            &[
                ("10.244.1.5", "node1", true),
                ("10.244.1.6", "node1", false),
                ("10.244.2.5", "node2", true),
            ],
        );
        let v6 = slice("IPv6", &[("fd00::5", "node1", true)]);
        let (port, t) = target(&s, &[&v4, &v6], "node1").unwrap();
        assert_eq!((port, t.local), (31000, 1));
        assert_eq!(response(&t).0, 200);
        let (_, t3) = target(&s, &[&v4], "node3").unwrap();
        assert_eq!(t3.local, 0);
        let (code, body) = response(&t3);
        assert_eq!(code, 503);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["service"]["namespace"], "shop");
        assert_eq!(v["localEndpoints"], 0);
    }

    #[test]
    fn only_local_load_balancers_have_one() {
        for spec in [
            json!({"type": "LoadBalancer", "healthCheckNodePort": 31000}),
            json!({"type": "NodePort", "externalTrafficPolicy": "Local"}),
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local"}),
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Cluster",
                "healthCheckNodePort": 31000}),
        ] {
            assert_eq!(target(&svc(spec.clone()), &[], "n"), None, "{spec}");
        }
    }
}
