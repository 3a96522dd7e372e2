//! The agent's half of the flow log (`podnet flows`): it feeds the node's
//! [`FlowLog`] from conntrack's new-connection events and from the policy
//! verdict log's denials, names each address from the cluster's objects
//! (pods, Services, nodes), counts flows per verdict and losses in the
//! metrics, and serves the log at `/flows?after=N&limit=M` on the metrics
//! address.
//!
//! The conntrack events are read on a thread of their own (a blocking
//! socket that the kernel fills without waiting); a full socket drops
//! events, and those are counted as lost, never silently skipped.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use podnet_api::{Kind, Object};
use podnet_daemon::Metrics;
use podnet_kernel::conntrack::{EventKind, Events};
use podnet_source::{Delta, Subscription};
use podnet_trace::flows::{self, FlowLog, FlowRecord, Page};
use podnet_trace::hops::Names;

const FLOWS_LOST_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_flows_lost_total",
    "Conntrack event batches the kernel dropped before the flow log read them.",
);
const FLOWS_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_flows_total",
    "Flows in this node's flow log, per verdict.",
);

/// The kinds whose addresses name flows.
pub const KINDS: &[Kind] = &[Kind::Pod, Kind::Service, Kind::Node];

/// The most records one `/flows` answer carries.
pub const PAGE_LIMIT: usize = 1000;

/// The shared log and what names its addresses.
#[derive(Clone)]
pub struct Recorder {
    node: String,
    log: Arc<Mutex<FlowLog>>,
    names: Arc<RwLock<Names>>,
    metrics: Arc<Metrics>,
}

impl Recorder {
    pub fn new(node: &str, log: Arc<Mutex<FlowLog>>, metrics: Arc<Metrics>) -> Recorder {
        Recorder {
            node: node.to_string(),
            log,
            names: Arc::new(RwLock::new(Names::new())),
            metrics,
        }
    }

    fn push(&self, r: FlowRecord) {
        self.metrics
            .count(&FLOWS_TOTAL, &format!("verdict=\"{}\"", r.verdict), 1.0);
        self.log.lock().expect("flow log").push(r);
    }

    /// The policy verdict log's sink: each denial becomes a dropped flow.
    pub fn denial_sink(&self) -> podnet_policy::log::DenialSink {
        let me = self.clone();
        Arc::new(move |d: &podnet_policy::log::Denial| {
            // Named under the read lock (no copy of the names per flow).
            let r = flows::dropped(
                &me.node,
                d.flow.src,
                d.flow.dst,
                d.flow.proto.name(),
                d.flow.port,
                d.policies.clone(),
                format!("{} denied: {}", d.cause, d.reason),
                &me.names.read().expect("names"),
            );
            me.push(r);
        })
    }

    /// Keeps the names current from `sub` (subscribed to [`KINDS`]).
    pub async fn names(self, mut sub: Subscription) {
        let mut by_key: std::collections::BTreeMap<String, Vec<IpAddr>> = Default::default();
        while let Some(b) = sub.next_batch().await {
            let mut names = self.names.write().expect("names");
            for d in &b.deltas {
                let k = d.key();
                let id = format!(
                    "{:?}/{}/{}",
                    k.kind,
                    k.namespace.clone().unwrap_or_default(),
                    k.name
                );
                for ip in by_key.remove(&id).unwrap_or_default() {
                    names.remove(&ip);
                }
                let (Delta::Added(o) | Delta::Updated(o)) = d else {
                    continue;
                };
                let ns = k.namespace.clone().unwrap_or_default();
                let (label, ips): (String, Vec<IpAddr>) = match o.as_ref() {
                    Object::Pod(p) => {
                        let host = p
                            .spec
                            .as_ref()
                            .and_then(|s| s.host_network)
                            .unwrap_or(false);
                        if host {
                            continue;
                        }
                        let ips = p
                            .status
                            .as_ref()
                            .and_then(|s| s.pod_ips.clone())
                            .unwrap_or_default()
                            .iter()
                            .filter_map(|i| i.ip.parse().ok())
                            .collect();
                        (format!("{ns}/{}", k.name), ips)
                    }
                    Object::Service(s) => (
                        format!("Service {ns}/{}", k.name),
                        s.spec
                            .as_ref()
                            .and_then(|s| s.cluster_ips.clone())
                            .unwrap_or_default()
                            .iter()
                            .filter_map(|i| i.parse().ok())
                            .collect(),
                    ),
                    Object::Node(n) => (
                        format!("node {}", k.name),
                        n.status
                            .as_ref()
                            .and_then(|s| s.addresses.clone())
                            .unwrap_or_default()
                            .iter()
                            .filter_map(|a| a.address.parse().ok())
                            .collect(),
                    ),
                    _ => continue,
                };
                for ip in &ips {
                    names.insert(*ip, label.clone());
                }
                by_key.insert(id, ips);
            }
        }
    }

    /// Runs the flow log until dropped: names from `sub` (read at once,
    /// like every subscription), new connections from conntrack on a
    /// thread that stops with this future.
    pub async fn run(self, sub: Subscription) {
        let stop = podnet_daemon::StopOnDrop::new();
        let (r, flag) = (self.clone(), stop.flag());
        if let Err(e) = std::thread::Builder::new()
            .name("flow-log".into())
            .spawn(move || r.conntrack(flag))
        {
            tracing::error!("starting the flow log: {e}");
            self.metrics
                .set_unhealthy_for("flows", Some(format!("starting the flow log: {e}")));
        }
        self.names(sub).await;
    }

    /// Reads new connections from conntrack until `stop`; its own thread.
    pub fn conntrack(self, stop: Arc<AtomicBool>) {
        let mut ev = match Events::open(&[EventKind::New]) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!("flow log: conntrack events: {e}");
                self.metrics
                    .set_unhealthy_for("flows", Some(format!("flow log: conntrack events: {e}")));
                return;
            }
        };
        let _ = ev.set_buffer(4 << 20);
        let _ = ev.set_timeout(Some(Duration::from_millis(500)));
        let mut lost = 0;
        while !stop.load(Ordering::Relaxed) {
            let got = match ev.recv() {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!("flow log: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            if ev.lost() > lost {
                let n = ev.lost() - lost;
                lost = ev.lost();
                self.metrics.count(&FLOWS_LOST_TOTAL, "", n as f64);
                self.log.lock().expect("flow log").add_lost(n);
            }
            if got.is_empty() {
                continue;
            }
            // Named under the read lock (no copy of the names per batch),
            // logged after it.
            let records: Vec<FlowRecord> = {
                let names = self.names.read().expect("names");
                got.iter()
                    .filter(|(_, e)| !(e.orig.src.is_loopback() && e.orig.dst.is_loopback()))
                    .map(|(_, e)| flows::forwarded(&self.node, e, &names))
                    .collect()
            };
            for r in records {
                self.push(r);
            }
        }
    }
}

/// The `/flows` page: `?after=N&limit=M` (both optional).
pub fn page(log: &Mutex<FlowLog>, path_and_query: &str) -> Option<(u16, &'static str, String)> {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    if path != "/flows" {
        return None;
    }
    let mut after = 0u64;
    let mut limit = PAGE_LIMIT;
    for kv in query.split('&').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let bad = || {
            Some((
                400,
                "text/plain",
                format!("/flows: {k}={v:?} is not a number\n"),
            ))
        };
        match k {
            "after" => match v.parse() {
                Ok(n) => after = n,
                Err(_) => return bad(),
            },
            "limit" => match v.parse::<usize>() {
                Ok(n) => limit = n.min(PAGE_LIMIT),
                Err(_) => return bad(),
            },
            _ => {
                return Some((
                    400,
                    "text/plain",
                    format!("/flows: unknown parameter {k:?}\n"),
                ))
            }
        }
    }
    let p: Page = log.lock().expect("flow log").page(after, limit);
    Some((
        200,
        "application/json",
        serde_json::to_string(&p).unwrap_or_default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_reads_its_query_and_refuses_nonsense() {
        let log = Mutex::new(FlowLog::new(8));
        let (code, _, body) = page(&log, "/flows").unwrap();
        assert_eq!(code, 200);
        let p: Page = serde_json::from_str(&body).unwrap();
        assert_eq!((p.flows.len(), p.last), (0, 0));
        assert_eq!(page(&log, "/flows?after=x").unwrap().0, 400);
        assert!(page(&log, "/flows?bogus=1")
            .unwrap()
            .2
            .contains("unknown parameter \"bogus\""));
        assert_eq!(page(&log, "/flows?after=0&limit=5").unwrap().0, 200);
        assert!(page(&log, "/metrics2").is_none());
    }
}
