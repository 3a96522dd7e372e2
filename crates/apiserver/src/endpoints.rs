//! The pure half of the endpoints controller: from a Service and the Pods in
//! its namespace, the EndpointSlices that should exist.
//!
//! Pods whose named target ports resolve to different numbers land in
//! different slices (one slice per address family and resolved port set),
//! as the Kubernetes EndpointSlice controller does.
//!
//! Conditions follow that controller's `podToEndpoint` too: every pod that
//! is not finished (Succeeded or Failed) is listed, terminating ones
//! included; `serving` is the pod's Ready condition, `terminating` its
//! deletion timestamp, and `ready` is `serving && !terminating`, or always
//! true for a Service with `spec.publishNotReadyAddresses` (whose clients,
//! such as a StatefulSet's peers, want every pod's address from the start).
//!
//! Every endpoint whose Pod's node is known and has a
//! `topology.kubernetes.io/zone` label carries that `zone`, whatever the
//! Service asks for, as `podToEndpoint` sets it: consumers other than
//! proxies (metrics, DNS, load balancers) read it. Topology hints follow
//! the upstream `trafficdist` package
//! (`staging/src/k8s.io/endpointslice/trafficdist/trafficdist.go`) and
//! only Services with `spec.trafficDistribution` get them: see
//! [`HintMode`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use podnet_api::k8s_openapi::api::core::v1::{Node, ObjectReference, Pod, Service, ServiceSpec};
use podnet_api::k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForNode, ForZone,
};
use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use podnet_api::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use podnet_api::selector;

pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "podnet-controller";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The topology annotations whose `Auto` asks for proportional hints; the
/// deprecated one wins when both are set (upstream `hintsEnabled`).
pub const TOPOLOGY_MODE_ANNOTATION: &str = "service.kubernetes.io/topology-mode";
pub const TOPOLOGY_AWARE_HINTS_ANNOTATION: &str = "service.kubernetes.io/topology-aware-hints";

/// Node name -> its `topology.kubernetes.io/zone` label. Nodes without the
/// label (or with an empty one), and unknown nodes, are absent.
pub type Zones = BTreeMap<String, String>;

/// A Node's zone label, if set and not empty.
pub fn node_zone(node: &Node) -> Option<&str> {
    node.metadata
        .labels
        .as_ref()?
        .get(ZONE_LABEL)
        .map(String::as_str)
        .filter(|z| !z.is_empty())
}

/// Which hints a Service's endpoints get, from `spec.trafficDistribution`
/// as upstream's `preferCloseHeuristic` writes them:
///
/// - only ready endpoints (`conditions.ready`) get hints;
/// - an endpoint whose node has a zone label gets `forZones: [its zone]`,
///   one whose node has none gets no zone hint (per endpoint: the others
///   keep theirs; kube-proxy, and our proxy, then ignore zone hints for the
///   Service because not every ready endpoint has one);
/// - with `PreferSameNode`, an endpoint with a `nodeName` also gets
///   `forNodes: [its node]`;
/// - an endpoint left with neither gets no `hints` at all.
///
/// The zone hint is the endpoint's own `zone`, which every endpoint on a
/// zoned node carries, ready or not, with or without hints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HintMode {
    /// `PreferClose` or `PreferSameZone`: zone hints.
    SameZone,
    /// `PreferSameNode`: node hints and zone hints.
    SameNode,
}

/// The Service's hint mode; None for no hints: no or an unknown
/// `trafficDistribution`, or a `topology-mode: Auto` annotation, which
/// upstream lets take precedence over `trafficDistribution`. The `Auto`
/// mode itself (hints proportional to each zone's CPU) is not implemented:
/// such Services get no hints, so every node uses every endpoint, which is
/// also what upstream falls back to when it cannot balance the zones.
pub fn hint_mode(svc: &Service) -> Option<HintMode> {
    if topology_auto(svc) {
        return None;
    }
    match svc.spec.as_ref()?.traffic_distribution.as_deref()? {
        "PreferClose" | "PreferSameZone" => Some(HintMode::SameZone),
        "PreferSameNode" => Some(HintMode::SameNode),
        _ => None,
    }
}

/// Upstream `hintsEnabled`: the deprecated annotation, when present, is
/// the one read.
fn topology_auto(svc: &Service) -> bool {
    let Some(a) = svc.metadata.annotations.as_ref() else {
        return false;
    };
    a.get(TOPOLOGY_AWARE_HINTS_ANNOTATION)
        .or_else(|| a.get(TOPOLOGY_MODE_ANNOTATION))
        .is_some_and(|v| v == "Auto" || v == "auto")
}

/// Sets an endpoint's hints for `mode` (see [`HintMode`]) from its zone.
fn add_hints(ep: &mut Endpoint, mode: HintMode) {
    let ready = ep.conditions.as_ref().and_then(|c| c.ready) == Some(true);
    if !ready {
        return;
    }
    let for_zones = ep.zone.clone().map(|name| vec![ForZone { name }]);
    let for_nodes = ep
        .node_name
        .clone()
        .filter(|n| mode == HintMode::SameNode && !n.is_empty())
        .map(|name| vec![ForNode { name }]);
    if for_zones.is_some() || for_nodes.is_some() {
        ep.hints = Some(EndpointHints {
            for_nodes,
            for_zones,
        });
    }
}

/// Whether a slice is one this controller manages, and for which Service.
pub fn managed_service(s: &EndpointSlice) -> Option<&str> {
    let l = s.metadata.labels.as_ref()?;
    if l.get(MANAGED_BY_LABEL).map(String::as_str) != Some(MANAGED_BY) {
        return None;
    }
    l.get(SERVICE_NAME_LABEL).map(String::as_str)
}

fn pod_ips(p: &Pod) -> Vec<IpAddr> {
    let st = match &p.status {
        Some(s) => s,
        None => return vec![],
    };
    let mut ips: Vec<IpAddr> = st
        .pod_ips
        .iter()
        .flatten()
        .filter_map(|i| i.ip.parse().ok())
        .collect();
    if ips.is_empty() {
        ips.extend(st.pod_ip.as_deref().and_then(|i| i.parse::<IpAddr>().ok()));
    }
    ips
}

pub fn pod_ready(p: &Pod) -> bool {
    p.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// An endpoint's conditions for `pod`, as the Kubernetes EndpointSlice
/// controller sets them: `serving` is the Ready condition, `terminating` the
/// deletion timestamp; `ready` is serving and not terminating, or always
/// true when the Service publishes not-ready addresses.
pub fn conditions(pod: &Pod, publish_not_ready: bool) -> EndpointConditions {
    let serving = pod_ready(pod);
    let terminating = pod.metadata.deletion_timestamp.is_some();
    EndpointConditions {
        ready: Some(publish_not_ready || (serving && !terminating)),
        serving: Some(serving),
        terminating: Some(terminating),
    }
}

/// Resolves a Service port's targetPort for one pod; None if a named port
/// is not declared by the pod.
fn resolve(target: &Option<IntOrString>, port: i32, proto: &str, pod: &Pod) -> Option<i32> {
    match target {
        None => Some(port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(s)) => match s.parse::<i32>() {
            Ok(n) => Some(n),
            Err(_) => pod
                .spec
                .as_ref()?
                .containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find_map(|cp| {
                    let cproto = cp.protocol.as_deref().unwrap_or("TCP");
                    (cp.name.as_deref() == Some(s.as_str()) && cproto == proto)
                        .then_some(cp.container_port)
                }),
        },
    }
}

/// (name, protocol, port, appProtocol) of each port of a slice.
type PortSet = Vec<(Option<String>, String, i32, Option<String>)>;

fn short_hash(s: &str) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    let alphabet = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|i| alphabet[((h >> (i * 8)) % alphabet.len() as u64) as usize] as char)
        .collect()
}

/// The EndpointSlices a Service should have. Services without a selector,
/// and ExternalName Services, get none (their slices are someone else's).
/// `zones` (node name -> zone) gives each endpoint its `zone` and feeds the
/// topology hints of [`hint_mode`].
pub fn desired(svc: &Service, pods: &[&Pod], zones: &Zones) -> Vec<EndpointSlice> {
    let Some(spec) = &svc.spec else { return vec![] };
    if spec.type_.as_deref() == Some("ExternalName")
        || spec.selector.as_ref().map(|s| s.is_empty()).unwrap_or(true)
    {
        return vec![];
    }
    let ns = svc
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = svc.metadata.name.clone().unwrap_or_default();
    let publish_not_ready = spec.publish_not_ready_addresses.unwrap_or(false);
    let hints = hint_mode(svc);
    let families = address_types(spec);
    // (family, port set) -> endpoints
    let mut groups: BTreeMap<(String, PortSet), Vec<Endpoint>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| selects(spec, &ns, p)) {
        // A pod that declares none of the Service's named targetPorts is
        // still an endpoint, in a slice without ports, as Kubernetes'
        // EndpointSlice controller publishes it (headless DNS names it;
        // proxies find no port to send to). Found by differential_kcm.
        let ports = pod_ports(spec, pod);
        for (fam, mut ep) in pod_endpoints(pod, &ns, &name, publish_not_ready, zones) {
            if !families.contains(&fam) {
                continue;
            }
            if let Some(mode) = hints {
                add_hints(&mut ep, mode);
            }
            groups
                .entry((fam.into(), ports.clone()))
                .or_default()
                .push(ep);
        }
    }
    // An empty slice says "selector matched nothing" in a family, as
    // Kubernetes' placeholder does.
    for fam in families {
        if !groups.keys().any(|(f, _)| f == fam) {
            groups.insert((fam.into(), Vec::new()), Vec::new());
        }
    }
    let meta = slice_meta(svc, &ns, &name);
    groups
        .into_iter()
        .map(|((fam, ports), eps)| slice(&meta, &name, fam, ports, eps))
        .collect()
}

/// Whether the Service's endpoints include `pod`: in its namespace,
/// matched by its selector, and not finished (Succeeded or Failed).
fn selects(spec: &ServiceSpec, ns: &str, pod: &Pod) -> bool {
    let empty = BTreeMap::new();
    if pod.metadata.namespace.as_deref().unwrap_or("default") != ns
        || !selector::matches_map(
            &spec.selector,
            pod.metadata.labels.as_ref().unwrap_or(&empty),
        )
    {
        return false;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded") | Some("Failed"))
}

/// The Service's ports as they resolve on `pod`; a named targetPort the
/// pod does not declare is left out.
fn pod_ports(spec: &ServiceSpec, pod: &Pod) -> PortSet {
    let mut ports: PortSet = Vec::new();
    for p in spec.ports.iter().flatten() {
        let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        if let Some(n) = resolve(&p.target_port, p.port, &proto, pod) {
            // As Kubernetes: the name always ("" for an unnamed port),
            // the appProtocol copied.
            let name = p.name.clone().unwrap_or_default();
            ports.push((Some(name), proto, n, p.app_protocol.clone()));
        }
    }
    ports
}

/// One endpoint per pod IP, with its address family; the hostname is the
/// pod's only when its subdomain is the Service (`svc_name`).
fn pod_endpoints(
    pod: &Pod,
    ns: &str,
    svc_name: &str,
    publish_not_ready: bool,
    zones: &Zones,
) -> Vec<(&'static str, Endpoint)> {
    let conditions = conditions(pod, publish_not_ready);
    let pspec = pod.spec.as_ref();
    let hostname = pspec
        .filter(|s| s.subdomain.as_deref() == Some(svc_name))
        .and_then(|s| s.hostname.clone());
    pod_ips(pod)
        .into_iter()
        .map(|ip| {
            let fam = if ip.is_ipv4() { "IPv4" } else { "IPv6" };
            let ep = Endpoint {
                addresses: vec![ip.to_string()],
                conditions: Some(conditions.clone()),
                hostname: hostname.clone(),
                node_name: pspec.and_then(|s| s.node_name.clone()),
                zone: pspec
                    .and_then(|s| s.node_name.as_ref())
                    .and_then(|n| zones.get(n))
                    .cloned(),
                target_ref: Some(ObjectReference {
                    kind: Some("Pod".into()),
                    namespace: Some(ns.to_string()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            (fam, ep)
        })
        .collect()
}

/// The address types of the Service's slices, as the EndpointSlice
/// controller's `getAddressTypesForService`: its `ipFamilies`; without
/// them (written before podnet gave families out, when every Service was
/// IPv4) its ClusterIP's family, else IPv4. (Upstream assumes both for a
/// headless Service without families: a real apiserver never serves
/// one, it defaults them on read.)
fn address_types(spec: &ServiceSpec) -> Vec<&'static str> {
    let fams: Vec<&'static str> = spec
        .ip_families
        .iter()
        .flatten()
        .filter_map(|f| match f.as_str() {
            "IPv4" => Some("IPv4"),
            "IPv6" => Some("IPv6"),
            _ => None,
        })
        .collect();
    if !fams.is_empty() {
        return fams;
    }
    match spec.cluster_ip.as_deref() {
        Some(c) if c.contains(':') => vec!["IPv6"],
        _ => vec!["IPv4"],
    }
}

/// The metadata every slice of the Service shares (all but its name): the
/// namespace, the labels that tie it to the Service and to us, and the
/// Service as its controlling owner.
fn slice_meta(svc: &Service, ns: &str, name: &str) -> ObjectMeta {
    let labels: BTreeMap<String, String> = [
        (SERVICE_NAME_LABEL.to_string(), name.to_string()),
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
    ]
    .into();
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: name.to_string(),
        uid: svc.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    ObjectMeta {
        namespace: Some(ns.to_string()),
        labels: Some(labels),
        owner_references: Some(vec![owner]),
        ..Default::default()
    }
}

/// One slice: its endpoints sorted by address, its name the Service's
/// plus a hash of its family and port set, so it is stable across syncs.
fn slice(
    meta: &ObjectMeta,
    svc_name: &str,
    fam: String,
    ports: PortSet,
    mut eps: Vec<Endpoint>,
) -> EndpointSlice {
    eps.sort_by(|a, b| a.addresses.cmp(&b.addresses));
    let key = format!("{fam}|{ports:?}");
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(format!("{svc_name}-{}", short_hash(&key))),
            ..meta.clone()
        },
        address_type: fam,
        endpoints: Some(eps),
        ports: Some(
            ports
                .into_iter()
                .map(|(n, proto, port, app_protocol)| EndpointPort {
                    name: n,
                    protocol: Some(proto),
                    port: Some(port),
                    app_protocol,
                })
                .collect(),
        ),
    }
}

/// Whether two slices carry the same data (ignoring server-owned metadata).
pub fn same(a: &EndpointSlice, b: &EndpointSlice) -> bool {
    a.address_type == b.address_type
        && a.endpoints.clone().unwrap_or_default() == b.endpoints.clone().unwrap_or_default()
        && a.ports.clone().unwrap_or_default() == b.ports.clone().unwrap_or_default()
        && a.metadata.labels == b.metadata.labels
        && a.metadata.owner_references == b.metadata.owner_references
}

/// Names of the Services in `ns` whose selector matches `labels`.
pub fn services_selecting<'a>(
    services: impl Iterator<Item = &'a Service>,
    ns: &str,
    labels: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    services
        .filter(|s| s.metadata.namespace.as_deref().unwrap_or("default") == ns)
        .filter(|s| {
            selector::matches_map(&s.spec.as_ref().and_then(|sp| sp.selector.clone()), labels)
        })
        .filter_map(|s| s.metadata.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The slices without any Node zones known.
    fn unzoned(svc: &Service, pods: &[&Pod]) -> Vec<EndpointSlice> {
        desired(svc, pods, &Zones::new())
    }

    fn svc(spec: serde_json::Value) -> Service {
        serde_json::from_value(
            json!({"metadata": {"name": "web", "namespace": "shop", "uid": "u1"}, "spec": spec}),
        )
        .unwrap()
    }

    fn pod(
        name: &str,
        labels: serde_json::Value,
        ip: &str,
        ready: bool,
        port_name: Option<(&str, i32)>,
    ) -> Pod {
        let ports = port_name
            .map(|(n, p)| json!([{"name": n, "containerPort": p}]))
            .unwrap_or(json!([]));
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "labels": labels, "uid": format!("uid-{name}")},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": ports}]},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap()
    }

    /// Slices per family of the Service, as the EndpointSlice controller
    /// makes them: a single-stack Service lists only its family's pod
    /// addresses, a dual-stack one both, and a family no pod has gets
    /// its own empty placeholder.
    #[test]
    fn slices_follow_the_services_families() {
        let mut p = pod("a", json!({"app": "web"}), "10.244.1.5", true, None);
        p.status.as_mut().unwrap().pod_ips = Some(
            ["10.244.1.5", "fd00:10:244:1::5"]
                .map(|ip| serde_json::from_value(json!({"ip": ip})).unwrap())
                .to_vec(),
        );
        let v4_only = pod("b", json!({"app": "web"}), "10.244.2.6", true, None);
        let fams = |spec: serde_json::Value, pods: &[&Pod]| -> Vec<(String, Vec<String>)> {
            unzoned(&svc(spec), pods)
                .into_iter()
                .map(|s| {
                    let addrs = s
                        .endpoints
                        .unwrap_or_default()
                        .into_iter()
                        .flat_map(|e| e.addresses)
                        .collect();
                    (s.address_type, addrs)
                })
                .collect()
        };
        let base = json!({"selector": {"app": "web"}, "ports": [{"port": 80}]});
        let with = |fams: serde_json::Value| {
            let mut b = base.clone();
            b["ipFamilies"] = fams;
            b
        };
        assert_eq!(
            fams(with(json!(["IPv4"])), &[&p, &v4_only]),
            [(
                "IPv4".to_string(),
                vec!["10.244.1.5".to_string(), "10.244.2.6".to_string()]
            )]
        );
        let mut dual = fams(with(json!(["IPv4", "IPv6"])), &[&p, &v4_only]);
        dual.sort();
        assert_eq!(
            dual,
            [
                (
                    "IPv4".to_string(),
                    vec!["10.244.1.5".to_string(), "10.244.2.6".to_string()]
                ),
                ("IPv6".to_string(), vec!["fd00:10:244:1::5".to_string()]),
            ]
        );
        let mut placeholders = fams(with(json!(["IPv6", "IPv4"])), &[&v4_only]);
        placeholders.sort();
        assert_eq!(
            placeholders,
            [
                ("IPv4".to_string(), vec!["10.244.2.6".to_string()]),
                ("IPv6".to_string(), vec![]),
            ]
        );
        // Written before families: its ClusterIP's family.
        let mut legacy = base.clone();
        legacy["clusterIP"] = json!("10.96.0.7");
        assert_eq!(fams(legacy, &[&p]).len(), 1);
    }

    #[test]
    fn selects_ready_and_not_ready_pods_with_conditions() {
        let s = svc(
            json!({"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
        );
        let a = pod("a", json!({"app": "web"}), "10.244.1.5", true, None);
        let b = pod("b", json!({"app": "web"}), "10.244.2.7", false, None);
        let c = pod("c", json!({"app": "db"}), "10.244.2.8", true, None);
        let d = unzoned(&s, &[&a, &b, &c]);
        assert_eq!(d.len(), 1);
        let sl = &d[0];
        assert_eq!(sl.address_type, "IPv4");
        assert_eq!(sl.endpoints.as_deref().unwrap_or_default().len(), 2);
        assert_eq!(
            sl.endpoints.as_deref().unwrap()[0].addresses,
            vec!["10.244.1.5"]
        );
        assert_eq!(
            sl.endpoints.as_deref().unwrap()[0]
                .conditions
                .as_ref()
                .unwrap()
                .ready,
            Some(true)
        );
        assert_eq!(
            sl.endpoints.as_deref().unwrap()[1]
                .conditions
                .as_ref()
                .unwrap()
                .ready,
            Some(false)
        );
        assert_eq!(
            sl.endpoints.as_deref().unwrap()[0].node_name.as_deref(),
            Some("n1")
        );
        assert_eq!(sl.ports.as_ref().unwrap()[0].port, Some(8080));
        assert_eq!(managed_service(sl), Some("web"));
    }

    #[test]
    fn named_ports_resolve_per_pod_into_separate_slices() {
        let s =
            svc(json!({"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]}));
        let a = pod(
            "a",
            json!({"app": "web"}),
            "10.244.1.5",
            true,
            Some(("http", 8080)),
        );
        let b = pod(
            "b",
            json!({"app": "web"}),
            "10.244.1.6",
            true,
            Some(("http", 9090)),
        );
        let c = pod("c", json!({"app": "web"}), "10.244.1.7", true, None);
        let d = unzoned(&s, &[&a, &b, &c]);
        assert_eq!(d.len(), 3, "one slice per resolved port set");
        let ports: Vec<Option<i32>> = d
            .iter()
            .map(|s| s.ports.as_ref().unwrap().first().map(|p| p.port.unwrap()))
            .collect();
        assert!(ports.contains(&Some(8080)) && ports.contains(&Some(9090)));
        // The pod without the port is published without ports, as
        // Kubernetes does.
        let portless = d.iter().find(|s| s.ports.as_ref().unwrap().is_empty());
        let eps = portless.unwrap().endpoints.as_deref().unwrap();
        assert_eq!(eps[0].addresses, vec!["10.244.1.7".to_string()]);
        let names: BTreeSet<_> = d.iter().map(|s| s.metadata.name.clone()).collect();
        assert_eq!(names.len(), 3);
    }

    #[test]
    fn no_selector_or_external_name_means_no_slices() {
        assert!(unzoned(&svc(json!({"ports": [{"port": 80}]})), &[]).is_empty());
        assert!(unzoned(
            &svc(json!({"type": "ExternalName", "externalName": "x.com", "selector": {"a": "b"}})),
            &[]
        )
        .is_empty());
        let empty = unzoned(
            &svc(json!({"selector": {"app": "web"}, "ports": [{"port": 80}]})),
            &[],
        );
        assert_eq!(empty.len(), 1);
        assert!(empty[0].endpoints.as_deref().unwrap_or_default().is_empty());
    }

    #[test]
    fn terminating_pods_are_serving_but_not_ready() {
        let s = svc(json!({"selector": {"app": "web"}, "ports": [{"port": 80}]}));
        let mut a = pod("a", json!({"app": "web"}), "10.244.1.5", true, None);
        a.metadata.deletion_timestamp = Some(
            podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                podnet_api::k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        );
        let c = unzoned(&s, &[&a])[0].endpoints.as_deref().unwrap()[0]
            .conditions
            .clone()
            .unwrap();
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(false), Some(true), Some(true))
        );
    }

    fn deleting(mut p: Pod) -> Pod {
        p.metadata.deletion_timestamp = Some(
            podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                podnet_api::k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        );
        p
    }

    /// (ready, serving, terminating)
    type Conds = (Option<bool>, Option<bool>, Option<bool>);

    fn conds(sl: &EndpointSlice) -> BTreeMap<String, Conds> {
        sl.endpoints
            .iter()
            .flatten()
            .map(|e| {
                let c = e.conditions.clone().unwrap();
                (
                    e.target_ref.as_ref().unwrap().name.clone().unwrap(),
                    (c.ready, c.serving, c.terminating),
                )
            })
            .collect()
    }

    /// Upstream `podToEndpoint`: ready = publishNotReadyAddresses ||
    /// (serving && !terminating); serving and terminating stay the pod's.
    #[test]
    fn publish_not_ready_addresses_makes_every_live_pod_ready() {
        let spec = |publish: bool| {
            svc(json!({"selector": {"app": "web"}, "ports": [{"port": 80}],
                       "publishNotReadyAddresses": publish}))
        };
        let web = json!({"app": "web"});
        let up = pod("up", web.clone(), "10.244.1.1", true, None);
        let down = pod("down", web.clone(), "10.244.1.2", false, None);
        let leaving = deleting(pod("leaving", web.clone(), "10.244.1.3", true, None));
        let leaving_down = deleting(pod("leaving-down", web.clone(), "10.244.1.4", false, None));
        let mut done = pod("done", web.clone(), "10.244.1.5", true, None);
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let mut no_ip = pod("no-ip", web.clone(), "", true, None);
        no_ip.status.as_mut().unwrap().pod_ip = None;
        let pods = [&up, &down, &leaving, &leaving_down, &done, &no_ip];
        let t = |r, s, term| (Some(r), Some(s), Some(term));

        let published = unzoned(&spec(true), &pods);
        assert_eq!(published.len(), 1);
        assert_eq!(
            conds(&published[0]),
            BTreeMap::from([
                ("up".to_string(), t(true, true, false)),
                ("down".to_string(), t(true, false, false)),
                ("leaving".to_string(), t(true, true, true)),
                ("leaving-down".to_string(), t(true, false, true)),
            ]),
            "finished pods and pods without an address are never published"
        );
        let plain = unzoned(&spec(false), &pods);
        assert_eq!(
            conds(&plain[0]),
            BTreeMap::from([
                ("up".to_string(), t(true, true, false)),
                ("down".to_string(), t(false, false, false)),
                ("leaving".to_string(), t(false, true, true)),
                ("leaving-down".to_string(), t(false, false, true)),
            ])
        );
        // Turning the flag on or off changes the slice (so it is rewritten).
        assert!(!same(&published[0], &plain[0]));
        assert_eq!(published[0].metadata.name, plain[0].metadata.name);
    }

    #[test]
    fn conditions_of_one_pod() {
        let p = pod("a", json!({}), "10.244.1.1", false, None);
        let c = conditions(&p, false);
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(false), Some(false), Some(false))
        );
        let c = conditions(&deleting(p), true);
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(true), Some(false), Some(true))
        );
    }

    fn on(mut p: Pod, node: &str) -> Pod {
        p.spec.as_mut().unwrap().node_name = Some(node.into());
        p
    }

    fn zones() -> Zones {
        [("na", "a"), ("nb", "b")]
            .into_iter()
            .map(|(n, z)| (n.to_string(), z.to_string()))
            .collect()
    }

    fn distributed(td: &str) -> Service {
        svc(json!({"selector": {"app": "web"}, "ports": [{"port": 80}], "trafficDistribution": td}))
    }

    /// pod name -> (zone, forZones, forNodes); hints None is (_, None, None).
    type Topo = (Option<String>, Option<Vec<String>>, Option<Vec<String>>);

    fn topo(sl: &EndpointSlice) -> BTreeMap<String, Topo> {
        sl.endpoints
            .iter()
            .flatten()
            .map(|e| {
                let h = e.hints.as_ref();
                if let Some(h) = h {
                    assert!(
                        h.for_zones.is_some() || h.for_nodes.is_some(),
                        "empty hints are never written"
                    );
                }
                (
                    e.target_ref.as_ref().unwrap().name.clone().unwrap(),
                    (
                        e.zone.clone(),
                        h.and_then(|h| h.for_zones.as_ref())
                            .map(|z| z.iter().map(|z| z.name.clone()).collect()),
                        h.and_then(|h| h.for_nodes.as_ref())
                            .map(|n| n.iter().map(|n| n.name.clone()).collect()),
                    ),
                )
            })
            .collect()
    }

    /// ready on zone a, ready on zone b, not ready on zone b, ready on a
    /// node without a zone label, ready on a node the controller never saw.
    fn spread() -> Vec<Pod> {
        let web = json!({"app": "web"});
        vec![
            on(pod("a", web.clone(), "10.244.1.1", true, None), "na"),
            on(pod("b", web.clone(), "10.244.2.1", true, None), "nb"),
            on(pod("b-down", web.clone(), "10.244.2.2", false, None), "nb"),
            on(pod("nozone", web.clone(), "10.244.3.1", true, None), "nz"),
            on(pod("ghost", web.clone(), "10.244.4.1", true, None), "gone"),
        ]
    }

    fn s(v: &str) -> Option<String> {
        Some(v.to_string())
    }

    fn l(v: &str) -> Option<Vec<String>> {
        Some(vec![v.to_string()])
    }

    /// Upstream `preferCloseHeuristic` without node hints: each ready
    /// endpoint is hinted for its own node's zone; a not-ready one gets its
    /// zone but no hint; one whose node has no zone gets no hint at all,
    /// and the others keep theirs.
    #[test]
    fn prefer_close_and_same_zone_hint_ready_endpoints_for_their_zone() {
        let pods = spread();
        let refs: Vec<&Pod> = pods.iter().collect();
        for td in ["PreferClose", "PreferSameZone"] {
            let d = desired(&distributed(td), &refs, &zones());
            assert_eq!(d.len(), 1);
            assert_eq!(
                topo(&d[0]),
                BTreeMap::from([
                    ("a".to_string(), (s("a"), l("a"), None)),
                    ("b".to_string(), (s("b"), l("b"), None)),
                    ("b-down".to_string(), (s("b"), None, None)),
                    ("nozone".to_string(), (None, None, None)),
                    ("ghost".to_string(), (None, None, None)),
                ]),
                "{td}"
            );
        }
    }

    #[test]
    fn prefer_same_node_hints_node_and_zone() {
        let pods = spread();
        let refs: Vec<&Pod> = pods.iter().collect();
        let d = desired(&distributed("PreferSameNode"), &refs, &zones());
        assert_eq!(
            topo(&d[0]),
            BTreeMap::from([
                ("a".to_string(), (s("a"), l("a"), l("na"))),
                ("b".to_string(), (s("b"), l("b"), l("nb"))),
                ("b-down".to_string(), (s("b"), None, None)),
                // No zone: a node hint alone.
                ("nozone".to_string(), (None, None, l("nz"))),
                ("ghost".to_string(), (None, None, l("gone"))),
            ])
        );
        // A pod not yet scheduled has no node and so no hint.
        let mut unscheduled = pod("new", json!({"app": "web"}), "10.244.5.1", true, None);
        unscheduled.spec.as_mut().unwrap().node_name = None;
        let d = desired(&distributed("PreferSameNode"), &[&unscheduled], &zones());
        assert_eq!(
            topo(&d[0]),
            BTreeMap::from([("new".to_string(), (None, None, None))])
        );
    }

    /// `ready` is what upstream checks, so publishNotReadyAddresses hints
    /// not-ready pods too.
    #[test]
    fn published_not_ready_endpoints_are_hinted() {
        let down = on(
            pod("down", json!({"app": "web"}), "10.244.2.2", false, None),
            "nb",
        );
        let svc = svc(json!({"selector": {"app": "web"}, "ports": [{"port": 80}],
            "trafficDistribution": "PreferClose", "publishNotReadyAddresses": true}));
        assert_eq!(
            topo(&desired(&svc, &[&down], &zones())[0]),
            BTreeMap::from([("down".to_string(), (s("b"), l("b"), None))])
        );
    }

    /// Without (a known) trafficDistribution endpoints get no `hints`, but
    /// each one on a known, zoned node still gets its `zone`, as upstream
    /// `podToEndpoint` writes it for every Service.
    #[test]
    fn without_traffic_distribution_endpoints_get_zones_but_no_hints() {
        let pods = spread();
        let refs: Vec<&Pod> = pods.iter().collect();
        let plain = svc(json!({"selector": {"app": "web"}, "ports": [{"port": 80}]}));
        let mut auto = distributed("PreferClose");
        auto.metadata.annotations =
            Some([(TOPOLOGY_MODE_ANNOTATION.to_string(), "Auto".to_string())].into());
        for (why, svc) in [
            ("no trafficDistribution", plain.clone()),
            ("an unknown value", distributed("PreferFarAway")),
            ("topology-mode: Auto wins", auto),
        ] {
            let d = desired(&svc, &refs, &zones());
            assert_eq!(d.len(), 1, "{why}");
            assert_eq!(
                topo(&d[0]),
                BTreeMap::from([
                    ("a".to_string(), (s("a"), None, None)),
                    ("b".to_string(), (s("b"), None, None)),
                    ("b-down".to_string(), (s("b"), None, None)),
                    ("nozone".to_string(), (None, None, None)),
                    ("ghost".to_string(), (None, None, None)),
                ]),
                "{why}"
            );
        }
        // Without any zoned node, no endpoint has a zone.
        let d = serde_json::to_value(unzoned(&plain, &refs)).unwrap();
        for ep in d[0]["endpoints"].as_array().unwrap() {
            assert!(
                ep.get("hints").is_none() && ep.get("zone").is_none(),
                "{ep}"
            );
        }
    }

    /// The zone is the node's, for every kind of endpoint: not ready,
    /// terminating, published while not ready, of a headless Service, in
    /// a slice without ports.
    #[test]
    fn every_endpoint_on_a_zoned_node_gets_its_zone() {
        let web = json!({"app": "web"});
        let down = on(pod("down", web.clone(), "10.244.2.2", false, None), "nb");
        let leaving = on(
            deleting(pod("leaving", web.clone(), "10.244.1.3", true, None)),
            "na",
        );
        let mut unscheduled = pod("new", web.clone(), "10.244.5.1", true, None);
        unscheduled.spec.as_mut().unwrap().node_name = None;
        let pods = [&down, &leaving, &unscheduled];
        let want = BTreeMap::from([
            ("down".to_string(), (s("b"), None, None)),
            ("leaving".to_string(), (s("a"), None, None)),
            ("new".to_string(), (None, None, None)),
        ]);
        for spec in [
            json!({"selector": {"app": "web"}, "ports": [{"port": 80}]}),
            json!({"selector": {"app": "web"}, "ports": [{"port": 80}],
                   "publishNotReadyAddresses": true}),
            json!({"selector": {"app": "web"}, "clusterIP": "None",
                   "ports": [{"port": 80}]}),
            json!({"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "nope"}]}),
        ] {
            let d = desired(&svc(spec.clone()), &pods, &zones());
            assert_eq!(d.len(), 1, "{spec}");
            assert_eq!(topo(&d[0]), want, "{spec}");
        }
    }

    /// A node's zone appearing, moving or going rewrites the slices of a
    /// Service without hints too (the controller then updates it in place).
    #[test]
    fn a_zone_change_changes_a_slice_without_hints() {
        let pods = spread();
        let refs: Vec<&Pod> = pods.iter().collect();
        let plain = svc(json!({"selector": {"app": "web"}, "ports": [{"port": 80}]}));
        let before = desired(&plain, &refs, &zones());
        let mut moved = zones();
        moved.insert("nz".into(), "c".into());
        let after = desired(&plain, &refs, &moved);
        assert_eq!(before[0].metadata.name, after[0].metadata.name);
        assert!(!same(&before[0], &after[0]));
        assert_eq!(topo(&after[0])["nozone"], (s("c"), None, None));
        assert!(same(&before[0], &desired(&plain, &refs, &zones())[0]));
    }

    /// Upstream `hintsEnabled`: the deprecated annotation is read first,
    /// and only `Auto`/`auto` turn proportional hints on.
    #[test]
    fn hint_mode_follows_traffic_distribution_and_annotations() {
        let with = |td: &str, ann: &[(&str, &str)]| {
            let mut s = distributed(td);
            s.metadata.annotations = Some(
                ann.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            hint_mode(&s)
        };
        assert_eq!(with("PreferClose", &[]), Some(HintMode::SameZone));
        assert_eq!(with("PreferSameZone", &[]), Some(HintMode::SameZone));
        assert_eq!(with("PreferSameNode", &[]), Some(HintMode::SameNode));
        assert_eq!(with("Other", &[]), None);
        assert_eq!(
            with("PreferClose", &[(TOPOLOGY_MODE_ANNOTATION, "auto")]),
            None
        );
        assert_eq!(
            with("PreferClose", &[(TOPOLOGY_AWARE_HINTS_ANNOTATION, "Auto")]),
            None
        );
        assert_eq!(
            with(
                "PreferClose",
                &[
                    (TOPOLOGY_AWARE_HINTS_ANNOTATION, "Disabled"),
                    (TOPOLOGY_MODE_ANNOTATION, "Auto")
                ]
            ),
            Some(HintMode::SameZone),
            "the deprecated annotation takes precedence"
        );
        assert_eq!(
            with("PreferClose", &[(TOPOLOGY_MODE_ANNOTATION, "Disabled")]),
            Some(HintMode::SameZone)
        );
    }

    /// A node's zone moving rewrites the same slice (the controller then
    /// updates it in place).
    #[test]
    fn a_zone_change_changes_the_slice() {
        let pods = spread();
        let refs: Vec<&Pod> = pods.iter().collect();
        let svc = distributed("PreferClose");
        let before = desired(&svc, &refs, &zones());
        let mut moved = zones();
        moved.insert("nb".into(), "a".into());
        moved.insert("nz".into(), "c".into());
        let after = desired(&svc, &refs, &moved);
        assert_eq!(before[0].metadata.name, after[0].metadata.name);
        assert!(!same(&before[0], &after[0]));
        let t = topo(&after[0]);
        assert_eq!(t["b"], (s("a"), l("a"), None));
        assert_eq!(t["nozone"], (s("c"), l("c"), None));
    }

    #[test]
    fn node_zone_reads_the_label() {
        let node = |labels: serde_json::Value| -> Node {
            serde_json::from_value(json!({"metadata": {"name": "n", "labels": labels}})).unwrap()
        };
        assert_eq!(node_zone(&node(json!({ZONE_LABEL: "a"}))), Some("a"));
        assert_eq!(node_zone(&node(json!({ZONE_LABEL: ""}))), None);
        assert_eq!(node_zone(&node(json!({}))), None);
    }
}
