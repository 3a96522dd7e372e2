//! One view of a Service's endpoints, decoded once, for everyone who reads
//! EndpointSlices: the service proxy (which endpoints a port sends to), its
//! health-check node ports (how many are ready here), cluster DNS (which
//! addresses a headless name answers) and, through the proxy's plan, the
//! trace's oracle. Two things are easy to get subtly different, so they
//! live here only:
//!
//! - an endpoint's conditions with the API's defaults ([`Conditions`]):
//!   an unset `ready` is ready, an unset `serving` is `ready`, an unset
//!   `terminating` is not terminating;
//! - kube-proxy's `CategorizeEndpoints` ([`categorize`]): which endpoints
//!   the Cluster and Local traffic policies use, with topology hints
//!   (node hints, then zone hints) and the serving-terminating fallback.

use std::net::IpAddr;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointHints, EndpointSlice};

/// The label naming the Service a slice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The Service a slice belongs to, by its label.
pub fn service_name(s: &EndpointSlice) -> Option<&str> {
    s.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL))
        .map(String::as_str)
}

/// An endpoint's conditions, with the API's defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conditions {
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

impl Conditions {
    pub fn of(e: &Endpoint) -> Conditions {
        let c = e.conditions.as_ref();
        let ready = c.and_then(|c| c.ready).unwrap_or(true);
        Conditions {
            ready,
            serving: c.and_then(|c| c.serving).unwrap_or(ready),
            terminating: c.and_then(|c| c.terminating).unwrap_or(false),
        }
    }

    /// Terminating but still serving: the fallback when nothing is ready.
    pub fn serving_terminating(&self) -> bool {
        self.serving && self.terminating
    }
}

/// How many distinct pods `slices` list as ready on `node`. A dual-stack
/// pod appears once per family; each family is counted apart and the
/// larger count wins, so one pod is one endpoint. What a health-check node
/// port reports, and whether a node advertises a Local Service's address.
pub fn ready_on(slices: &[&EndpointSlice], node: &str) -> usize {
    let mut per_family: std::collections::BTreeMap<&str, std::collections::BTreeSet<&str>> =
        Default::default();
    for s in slices {
        for e in s.endpoints.iter().flatten() {
            if Conditions::of(e).ready && e.node_name.as_deref() == Some(node) {
                if let Some(a) = e.addresses.first() {
                    per_family
                        .entry(s.address_type.as_str())
                        .or_default()
                        .insert(a);
                }
            }
        }
    }
    per_family.values().map(|s| s.len()).max().unwrap_or(0)
}

/// One endpoint address of one Service port, with what decides its use.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed<'a> {
    pub ip: IpAddr,
    /// The target port the slice gives for the Service port.
    pub port: u16,
    pub node: Option<&'a str>,
    pub cond: Conditions,
    pub hints: Option<&'a EndpointHints>,
}

impl Listed<'_> {
    fn zones(&self) -> impl Iterator<Item = &str> {
        self.hints
            .and_then(|h| h.for_zones.as_ref())
            .into_iter()
            .flatten()
            .map(|z| z.name.as_str())
    }

    fn nodes(&self) -> impl Iterator<Item = &str> {
        self.hints
            .and_then(|h| h.for_nodes.as_ref())
            .into_iter()
            .flatten()
            .map(|n| n.name.as_str())
    }

    fn for_zone(&self, zone: &str) -> bool {
        self.zones().any(|z| z == zone)
    }

    fn for_node(&self, node: &str) -> bool {
        self.nodes().any(|n| n == node)
    }

    /// Whether the endpoint runs on `node`.
    pub fn on(&self, node: &str) -> bool {
        self.node == Some(node)
    }
}

/// The addresses `slices` list for the Service port named `port_name`
/// with protocol `proto` (both as the API spells them; an unset protocol
/// is TCP), in the family `keep` accepts. The caller picks the slices
/// (the Service's, of one address type).
pub fn listed<'a>(
    slices: &[&'a EndpointSlice],
    port_name: &str,
    proto: &str,
    keep: &dyn Fn(&IpAddr) -> bool,
) -> Vec<Listed<'a>> {
    let mut out = Vec::new();
    for s in slices {
        let Some(sp) = s.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or("") == port_name
                && p.protocol.as_deref().unwrap_or("TCP") == proto
        }) else {
            continue;
        };
        let Some(port) = sp.port.and_then(|p| u16::try_from(p).ok()) else {
            continue;
        };
        for e in s.endpoints.iter().flatten() {
            let cond = Conditions::of(e);
            for ip in e.addresses.iter().filter_map(|a| a.parse::<IpAddr>().ok()) {
                if keep(&ip) {
                    out.push(Listed {
                        ip,
                        port,
                        node: e.node_name.as_deref(),
                        cond,
                        hints: e.hints.as_ref(),
                    });
                }
            }
        }
    }
    out
}

/// A Service port's endpoints as kube-proxy categorizes them
/// (`pkg/proxy/topology.go`, CategorizeEndpoints), as indexes into the
/// listed endpoints.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Categorized {
    /// For the Cluster policy: ready endpoints, narrowed by topology hints
    /// when they apply; if none is ready anywhere, the serving-terminating
    /// ones.
    pub cluster: Vec<usize>,
    /// For the Local policy (hints ignored): this node's ready endpoints;
    /// if it has none, its serving-terminating ones.
    pub local: Vec<usize>,
    /// Whether any endpoint anywhere can serve: without one the Service is
    /// rejected; with one but none for a Local policy, dropped.
    pub any: bool,
}

/// Which hints narrow the Cluster endpoints (upstream's topology mode):
/// node hints when every ready endpoint has one and one names this node,
/// else zone hints when every ready endpoint has one and one names this
/// node's zone, else none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Topology {
    All,
    Node,
    Zone,
}

fn topology(listed: &[Listed], node: &str, zone: Option<&str>) -> Topology {
    let ready: Vec<&Listed> = listed.iter().filter(|l| l.cond.ready).collect();
    if ready.is_empty() {
        return Topology::All;
    }
    if ready.iter().all(|l| l.nodes().next().is_some()) && ready.iter().any(|l| l.for_node(node)) {
        return Topology::Node;
    }
    match zone {
        Some(z)
            if ready.iter().all(|l| l.zones().next().is_some())
                && ready.iter().any(|l| l.for_zone(z)) =>
        {
            Topology::Zone
        }
        _ => Topology::All,
    }
}

/// Categorizes the endpoints of one Service port for `node` (in `zone`).
pub fn categorize(listed: &[Listed], node: &str, zone: Option<&str>) -> Categorized {
    let mode = topology(listed, node, zone);
    let pick = |f: &dyn Fn(&Listed) -> bool| -> Vec<usize> {
        (0..listed.len()).filter(|&i| f(&listed[i])).collect()
    };
    let mut cluster = pick(&|l| {
        l.cond.ready
            && match mode {
                Topology::All => true,
                Topology::Node => l.for_node(node),
                Topology::Zone => zone.is_some_and(|z| l.for_zone(z)),
            }
    });
    if cluster.is_empty() {
        cluster = pick(&|l| !l.cond.ready && l.cond.serving_terminating());
    }
    let mut local = pick(&|l| l.on(node) && l.cond.ready);
    if local.is_empty() {
        local = pick(&|l| l.on(node) && !l.cond.ready && l.cond.serving_terminating());
    }
    Categorized {
        any: !cluster.is_empty(),
        cluster,
        local,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(eps: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "s", "namespace": "default",
                         "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4",
            "endpoints": eps,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"},
                      {"name": "dns", "port": 53, "protocol": "UDP"}]
        }))
        .unwrap()
    }

    fn ips(l: &[Listed], idx: &[usize]) -> Vec<String> {
        idx.iter().map(|&i| l[i].ip.to_string()).collect()
    }

    #[test]
    fn conditions_take_the_apis_defaults() {
        let e = |c: serde_json::Value| -> Endpoint {
            serde_json::from_value(json!({"addresses": ["10.0.0.1"], "conditions": c})).unwrap()
        };
        let c = Conditions::of(&e(json!({})));
        assert_eq!((c.ready, c.serving, c.terminating), (true, true, false));
        let c = Conditions::of(&e(json!({"ready": false})));
        assert_eq!((c.ready, c.serving, c.terminating), (false, false, false));
        let c = Conditions::of(&e(
            json!({"ready": false, "serving": true, "terminating": true}),
        ));
        assert!(c.serving_terminating());
    }

    #[test]
    fn listed_picks_the_port_by_name_and_protocol() {
        let s = slice(json!([{"addresses": ["10.0.0.1", "fd00::1"], "nodeName": "n1"}]));
        let l = listed(&[&s], "dns", "UDP", &|ip| ip.is_ipv4());
        assert_eq!(l.len(), 1);
        assert_eq!((l[0].port, l[0].node), (53, Some("n1")));
        assert!(listed(&[&s], "dns", "TCP", &|_| true).is_empty());
    }

    #[test]
    fn terminating_endpoints_serve_only_when_nothing_is_ready() {
        let cond = |ready: bool| json!({"ready": ready, "serving": true, "terminating": !ready});
        let s = slice(json!([
            {"addresses": ["10.0.0.1"], "nodeName": "n1", "conditions": cond(false)},
            {"addresses": ["10.0.0.2"], "nodeName": "n2", "conditions": cond(true)},
        ]));
        let l = listed(&[&s], "http", "TCP", &|_| true);
        let c = categorize(&l, "n1", None);
        assert_eq!(ips(&l, &c.cluster), ["10.0.0.2"]);
        // Local: n1 has no ready endpoint, so its serving-terminating one.
        assert_eq!(ips(&l, &c.local), ["10.0.0.1"]);
        assert!(c.any);
        let s = slice(json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": false}}]));
        let l = listed(&[&s], "http", "TCP", &|_| true);
        assert_eq!(categorize(&l, "n1", None), Categorized::default());
    }

    #[test]
    fn hints_narrow_the_cluster_endpoints_only_when_every_ready_one_has_them() {
        let ep = |ip: &str, zone: &str| json!({"addresses": [ip], "hints": {"forZones": [{"name": zone}]}});
        let s = slice(json!([ep("10.0.0.1", "a"), ep("10.0.0.2", "b")]));
        let l = listed(&[&s], "http", "TCP", &|_| true);
        assert_eq!(
            ips(&l, &categorize(&l, "n1", Some("a")).cluster),
            ["10.0.0.1"]
        );
        // No endpoint for this zone: every endpoint.
        assert_eq!(categorize(&l, "n1", Some("c")).cluster.len(), 2);
        // One ready endpoint without hints: hints are off.
        let s = slice(json!([ep("10.0.0.1", "a"), {"addresses": ["10.0.0.2"]}]));
        let l = listed(&[&s], "http", "TCP", &|_| true);
        assert_eq!(categorize(&l, "n1", Some("a")).cluster.len(), 2);
        // Node hints win over zone hints.
        let s = slice(json!([
            {"addresses": ["10.0.0.1"], "hints": {"forNodes": [{"name": "n1"}], "forZones": [{"name": "b"}]}},
            {"addresses": ["10.0.0.2"], "hints": {"forNodes": [{"name": "n2"}], "forZones": [{"name": "a"}]}},
        ]));
        let l = listed(&[&s], "http", "TCP", &|_| true);
        assert_eq!(
            ips(&l, &categorize(&l, "n1", Some("a")).cluster),
            ["10.0.0.1"]
        );
    }
}
