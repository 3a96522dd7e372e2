//! The service proxy loop: watch Services and EndpointSlices, plan the table
//! ([`crate::proxy::plan`]), diff it against what was applied last, and apply
//! only the difference as one atomic transaction.
//!
//! The first sync (and any sync after a failure) replaces the whole table in
//! one transaction, so a restarted agent never leaves a half-built table and
//! established connections keep their conntrack NAT state. Events arriving
//! together are coalesced into one sync. Stale UDP conntrack entries towards
//! removed endpoints are flushed, so clients do not keep sending into the
//! void (the classic 5-second DNS delay).
//!
//! Changes go to the kernel as one nf_tables netlink batch
//! ([`podnet_nft::netlink`]): no `nft` process, no re-reading of the table.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::{Kind, Object};
use podnet_daemon::Metrics;
use podnet_nft::diff::{diff, ops, replace};
use podnet_nft::model::{Table, Value};
use podnet_nft::netlink::Conn;
use podnet_store::objects::decode;
use podnet_store::{AnyStore, EventType, Store, WatchMsg};

use crate::proxy::{plan, ProxyInput, TABLE};
use crate::AgentError;

/// UDP endpoints (ip, port) per Service chain, for conntrack flushing.
fn udp_endpoints(t: &Table) -> BTreeSet<(IpAddr, u16)> {
    let mut out = BTreeSet::new();
    for c in t.chains.values() {
        for r in &c.rules {
            let udp = r.exprs.iter().any(|e| {
                matches!(
                    e,
                    podnet_nft::model::Expr::Cmp {
                        value: Value::Proto(podnet_nft::model::Proto::Udp),
                        ..
                    }
                )
            });
            for e in &r.exprs {
                if let podnet_nft::model::Expr::Dnat {
                    addr,
                    port: Some(p),
                } = e
                {
                    if udp {
                        out.insert((*addr, *p));
                    }
                }
            }
        }
    }
    out
}

fn flush_conntrack(gone: &BTreeSet<(IpAddr, u16)>) {
    for (ip, port) in gone {
        let r = std::process::Command::new("conntrack")
            .args([
                "-D",
                "-p",
                "udp",
                "--reply-src",
                &ip.to_string(),
                "--reply-port-src",
                &port.to_string(),
            ])
            .output();
        if let Err(e) = r {
            tracing::warn!("conntrack (apt-get install conntrack): {e}");
            return;
        }
    }
}

struct Proxier {
    node: String,
    cluster_cidr: Ipv4Net,
    services: BTreeMap<String, Service>,
    slices: BTreeMap<String, EndpointSlice>,
    applied: Option<Table>,
    conn: Option<Conn>,
    metrics: Arc<Metrics>,
}

impl Proxier {
    fn observe(&mut self, typ: EventType, key: &str, kv: &podnet_store::KeyValue) -> bool {
        let is_svc = key.starts_with(&Kind::Service.prefix(None));
        let is_eps = key.starts_with(&Kind::EndpointSlice.prefix(None));
        if !is_svc && !is_eps {
            return false;
        }
        match (typ, decode(kv)) {
            (EventType::Put, Ok(Object::Service(s))) => {
                self.services.insert(key.to_string(), *s);
            }
            (EventType::Put, Ok(Object::EndpointSlice(s))) => {
                self.slices.insert(key.to_string(), *s);
            }
            (EventType::Delete, _) => {
                self.services.remove(key);
                self.slices.remove(key);
            }
            _ => return false,
        }
        true
    }

    /// One sync: full when nothing is known to be applied, partial otherwise.
    fn sync(&mut self) -> Result<usize, AgentError> {
        let t0 = Instant::now();
        let services: Vec<Service> = self.services.values().cloned().collect();
        let slices: Vec<EndpointSlice> = self.slices.values().cloned().collect();
        let want = plan(&ProxyInput {
            node: &self.node,
            cluster_cidr: self.cluster_cidr,
            services: &services,
            slices: &slices,
        });
        let full = self.applied.is_none();
        let changes = match &self.applied {
            Some(old) => diff(Some(old), &want),
            None => replace(&want),
        };
        let n = ops(&changes);
        if n == 0 {
            return Ok(0);
        }
        let res = match &mut self.conn {
            Some(c) => c.apply(&want, &changes).map_err(|e| e.to_string()),
            None => Err("no nfnetlink socket".to_string()),
        };
        let kind = if full { "full" } else { "partial" };
        match res {
            Ok(()) => {
                if let Some(old) = &self.applied {
                    let gone: BTreeSet<_> = udp_endpoints(old)
                        .difference(&udp_endpoints(&want))
                        .cloned()
                        .collect();
                    flush_conntrack(&gone);
                }
                let secs = t0.elapsed().as_secs_f64();
                let labels = format!("kind=\"{kind}\"");
                self.metrics.inc(
                    "podnet_proxy_sync_duration_seconds_sum",
                    "Total time spent in syncs.",
                    &labels,
                    secs,
                );
                self.metrics.inc(
                    "podnet_proxy_sync_duration_seconds_count",
                    "Syncs applied.",
                    &labels,
                    1.0,
                );
                self.metrics.inc(
                    "podnet_proxy_sync_operations_total",
                    "nf_tables operations applied.",
                    "",
                    n as f64,
                );
                self.metrics.set(
                    "podnet_proxy_last_sync_timestamp_seconds",
                    "When the last sync succeeded.",
                    "",
                    podnet_store::objects::now().as_second() as f64,
                );
                let eps = want
                    .sets
                    .get("service-ips")
                    .map(|s| s.elements.len())
                    .unwrap_or(0);
                self.metrics.set(
                    "podnet_proxy_service_ports",
                    "Service addresses programmed.",
                    "",
                    eps as f64,
                );
                self.metrics.set(
                    "podnet_proxy_endpoints",
                    "Endpoint chains programmed.",
                    "",
                    want.chains.keys().filter(|c| c.starts_with("ep-")).count() as f64,
                );
                self.applied = Some(want);
                tracing::debug!(kind, ops = n, ms = secs * 1000.0, "service sync");
                Ok(n)
            }
            Err(e) => {
                self.applied = None;
                self.conn = Conn::open().ok();
                self.metrics.inc(
                    "podnet_proxy_sync_failures_total",
                    "Syncs that failed.",
                    "",
                    1.0,
                );
                Err(AgentError::Other(format!("service sync: {e}")))
            }
        }
    }
}

/// Runs the proxy until `shutdown`; the rules stay in place afterwards.
pub async fn run(
    store: AnyStore,
    node: String,
    cluster_cidr: Ipv4Net,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), AgentError> {
    tokio::pin!(shutdown);
    let mut p = Proxier {
        node,
        cluster_cidr,
        services: BTreeMap::new(),
        slices: BTreeMap::new(),
        applied: None,
        conn: Some(Conn::open()?),
        metrics,
    };
    loop {
        let (kvs, rev) = store.list("/registry/").await?;
        p.services.clear();
        p.slices.clear();
        for kv in &kvs {
            p.observe(EventType::Put, &kv.key, kv);
        }
        p.applied = None;
        if let Err(e) = p.sync() {
            tracing::warn!("{e}");
        }
        let mut w = store.watch("/registry/", rev + 1).await?;
        loop {
            let retry = p.applied.is_none();
            let m = tokio::select! {
                _ = &mut shutdown => return Ok(()),
                _ = tokio::time::sleep(Duration::from_secs(1)), if retry => None,
                m = w.next() => Some(m),
            };
            let mut relist = false;
            let mut changed = retry;
            let mut msgs = vec![];
            if let Some(m) = m {
                msgs.push(m);
            }
            while let Ok(m) = w.rx.try_recv() {
                msgs.push(Some(m));
            }
            for m in msgs {
                match m {
                    Some(Ok(WatchMsg::Events(_, evs))) => {
                        for ev in evs {
                            changed |= p.observe(ev.typ, &ev.kv.key.clone(), &ev.kv);
                        }
                    }
                    _ => relist = true,
                }
            }
            if relist {
                break;
            }
            if changed {
                if let Err(e) = p.sync() {
                    tracing::warn!("{e}");
                }
            }
        }
    }
}

/// Removes the proxy's table (for --cleanup).
pub fn cleanup() -> Result<bool, AgentError> {
    Ok(Conn::open()?.delete_table(podnet_nft::model::Family::Ip, TABLE)?)
}
