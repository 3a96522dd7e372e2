//! The proxy's own health endpoint, kube-proxy's `--healthz-bind-address`
//! (`:10256`, `/healthz` and `/livez`).
//!
//! Cloud load balancers probe it for `externalTrafficPolicy: Cluster`
//! Services (a node whose proxy is stuck, or that is being drained, should
//! get no new traffic), and tools written for kube-proxy read its JSON
//! (upstream's e2e checks for `lastUpdated`). The semantics are
//! kube-proxy's:
//!
//! - an input the next sync must apply is *queued* ([`Health::queued`]);
//!   a successful sync *updates* ([`Health::updated`]) and clears it;
//! - the proxy is unhealthy when the oldest queued input has waited longer
//!   than the timeout (kube-proxy: twice its sync period); a proxy that has
//!   nothing queued is healthy, also while it starts;
//! - `/healthz` also fails when this node is not eligible for traffic: its
//!   Node is unknown, being deleted, or tainted
//!   `ToBeDeletedByClusterAutoscaler`. `/livez` ignores the node.
//!
//! [`report`] is pure (times injected) and unit-tested; [`Health`] is the
//! shared state the sync loop writes and the HTTP server reads.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use podnet_api::k8s_openapi::api::core::v1::Node;
use podnet_api::k8s_openapi::jiff::Timestamp;

/// The taint the cluster autoscaler puts on a node it is about to remove.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// The default listen address, kube-proxy's.
pub const DEFAULT_ADDR: &str = "0.0.0.0:10256";

/// What the sync loop has told the health endpoint.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// When the last successful sync finished.
    pub last_updated: Option<Timestamp>,
    /// When the oldest input not yet applied arrived.
    pub pending_since: Option<Instant>,
    /// This node is eligible for traffic (None: its Node not seen yet).
    pub node_eligible: Option<bool>,
}

/// The proxy's health, shared by the sync loop and the HTTP server.
#[derive(Debug)]
pub struct Health {
    state: Mutex<State>,
    timeout: Duration,
    /// The address families the proxy programs (`IPv4`, `IPv6`), for the
    /// per-family status kube-proxy reports.
    families: Vec<&'static str>,
}

impl Health {
    pub fn new(timeout: Duration, families: Vec<&'static str>) -> Arc<Health> {
        Arc::new(Health {
            state: Mutex::new(State::default()),
            timeout,
            families,
        })
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// An input arrived that the next sync must apply.
    pub fn queued(&self) {
        self.with(|s| {
            s.pending_since.get_or_insert_with(Instant::now);
        });
    }

    /// A sync succeeded: everything queued before it is applied.
    pub fn updated(&self) {
        self.with(|s| {
            s.pending_since = None;
            s.last_updated = Some(Timestamp::now());
        });
    }

    /// This node's Node object changed (None: deleted).
    pub fn node(&self, node: Option<&Node>) {
        let eligible = node.map(eligible);
        self.with(|s| s.node_eligible = eligible);
    }

    /// The answer to `path` (`/healthz` or `/livez`); None for another.
    pub fn page(&self, path: &str) -> Option<(u16, &'static str, String)> {
        let with_node = match path.split('?').next() {
            Some("/healthz") => true,
            Some("/livez") => false,
            _ => return None,
        };
        let state = self.with(|s| s.clone());
        let now = (Instant::now(), Timestamp::now());
        let (code, body) = report(&state, now, self.timeout, &self.families, with_node);
        Some((code, "application/json", body))
    }
}

/// A node takes traffic unless it is being deleted or the autoscaler has
/// marked it for removal.
pub fn eligible(node: &Node) -> bool {
    let deleting = node.metadata.deletion_timestamp.is_some();
    let marked = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == TO_BE_DELETED_TAINT));
    !deleting && !marked
}

/// The status code and JSON body, as kube-proxy's: `healthy` is false once
/// a queued input has waited longer than `timeout`; with `with_node`
/// (`/healthz`), an ineligible node fails too and `nodeEligible` is
/// reported. While healthy, `lastUpdated` is the current time (kube-proxy
/// keeps that meaning for old clients: "recent while healthy"); the
/// per-family `status` holds the real time of the last sync.
pub fn report(
    s: &State,
    (now, now_ts): (Instant, Timestamp),
    timeout: Duration,
    families: &[&str],
    with_node: bool,
) -> (u16, String) {
    let late = s
        .pending_since
        .is_some_and(|t| now.saturating_duration_since(t) >= timeout);
    let synced = s.last_updated.unwrap_or(Timestamp::UNIX_EPOCH);
    let node_ok = s.node_eligible.unwrap_or(false);
    let ok = !late && (!with_node || node_ok);
    let mut body = serde_json::json!({
        "lastUpdated": (if ok { now_ts } else { synced }).to_string(),
        "currentTime": now_ts.to_string(),
        "healthy": !late,
        "status": families
            .iter()
            .map(|f| (f.to_string(), serde_json::json!({
                "lastUpdated": synced.to_string(),
                "healthy": !late,
            })))
            .collect::<serde_json::Map<_, _>>(),
    });
    if with_node {
        body["nodeEligible"] = serde_json::Value::Bool(node_ok);
    }
    (if ok { 200 } else { 503 }, body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAMS: &[&str] = &["IPv4", "IPv6"];

    fn at(s: &State, after: Duration, with_node: bool) -> (u16, serde_json::Value) {
        let base = s.pending_since.unwrap_or_else(Instant::now);
        let now_ts: Timestamp = "2026-11-27T08:00:00Z".parse().unwrap();
        let (code, body) = report(
            s,
            (base + after, now_ts),
            Duration::from_secs(60),
            FAMS,
            with_node,
        );
        (code, serde_json::from_str(&body).unwrap())
    }

    fn synced_on_a_good_node() -> State {
        State {
            last_updated: Some("2026-11-27T07:59:00Z".parse().unwrap()),
            pending_since: None,
            node_eligible: Some(true),
        }
    }

    #[test]
    fn a_synced_proxy_on_an_eligible_node_is_healthy_and_recent() {
        let (code, body) = at(&synced_on_a_good_node(), Duration::ZERO, true);
        assert_eq!(code, 200);
        assert_eq!(body["lastUpdated"], "2026-11-27T08:00:00Z");
        assert_eq!(body["nodeEligible"], true);
        assert_eq!(
            body["status"]["IPv6"]["lastUpdated"],
            "2026-11-27T07:59:00Z"
        );
    }

    #[test]
    fn a_queued_change_is_healthy_until_it_waited_the_timeout() {
        let mut s = synced_on_a_good_node();
        s.pending_since = Some(Instant::now());
        assert_eq!(at(&s, Duration::from_secs(59), true).0, 200);
        let (code, body) = at(&s, Duration::from_secs(60), true);
        assert_eq!(code, 503);
        assert_eq!(body["healthy"], false);
        assert_eq!(body["lastUpdated"], "2026-11-27T07:59:00Z");
        assert_eq!(at(&s, Duration::from_secs(60), false).0, 503, "livez too");
    }

    #[test]
    fn an_ineligible_or_unknown_node_fails_healthz_but_not_livez() {
        for eligible in [Some(false), None] {
            let mut s = synced_on_a_good_node();
            s.node_eligible = eligible;
            let (code, body) = at(&s, Duration::ZERO, true);
            assert_eq!((code, &body["nodeEligible"]), (503, &false.into()));
            let (code, body) = at(&s, Duration::ZERO, false);
            assert_eq!(code, 200);
            assert!(body.get("nodeEligible").is_none());
        }
    }

    #[test]
    fn a_node_being_deleted_or_marked_by_the_autoscaler_is_not_eligible() {
        let node = |extra: serde_json::Value| -> Node {
            let mut n = serde_json::json!({"metadata": {"name": "n1"}});
            for (k, v) in extra.as_object().unwrap() {
                n[k] = v.clone();
            }
            serde_json::from_value(n).unwrap()
        };
        assert!(eligible(&node(serde_json::json!({}))));
        let marked = node(serde_json::json!({"spec": {"taints": [
            {"key": TO_BE_DELETED_TAINT, "effect": "NoSchedule"}]}}));
        assert!(!eligible(&marked));
        let mut deleting = node(serde_json::json!({}));
        deleting.metadata.deletion_timestamp = Some(
            podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
        );
        assert!(!eligible(&deleting));
        let other = node(serde_json::json!({"spec": {"taints": [
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}}));
        assert!(eligible(&other));
    }

    #[test]
    fn only_healthz_and_livez_are_answered() {
        let h = Health::new(Duration::from_secs(60), vec!["IPv4"]);
        h.updated();
        assert_eq!(h.page("/livez").unwrap().0, 200);
        assert_eq!(h.page("/healthz?verbose").unwrap().0, 503, "node unknown");
        assert!(h.page("/metrics").is_none());
    }
}
