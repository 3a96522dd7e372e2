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

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use podnet_api::k8s_openapi::api::core::v1::{ObjectReference, Pod, Service};
use podnet_api::k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointPort, EndpointSlice,
};
use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use podnet_api::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use podnet_api::selector;

pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "podnet-controller";

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

type PortSet = Vec<(Option<String>, String, i32)>;

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
pub fn desired(svc: &Service, pods: &[&Pod]) -> Vec<EndpointSlice> {
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
    let empty = BTreeMap::new();
    // (family, port set) -> endpoints
    let mut groups: BTreeMap<(String, PortSet), Vec<Endpoint>> = BTreeMap::new();
    for pod in pods {
        if pod.metadata.namespace.as_deref().unwrap_or("default") != ns
            || !selector::matches_map(
                &spec.selector,
                pod.metadata.labels.as_ref().unwrap_or(&empty),
            )
        {
            continue;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded") | Some("Failed")) {
            continue;
        }
        let mut ports: PortSet = Vec::new();
        for p in spec.ports.iter().flatten() {
            let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
            if let Some(n) = resolve(&p.target_port, p.port, &proto, pod) {
                ports.push((p.name.clone(), proto, n));
            }
        }
        if ports.is_empty() && spec.ports.as_ref().map(|p| !p.is_empty()).unwrap_or(false) {
            continue;
        }
        let conditions = conditions(pod, publish_not_ready);
        let pspec = pod.spec.as_ref();
        let hostname = pspec
            .filter(|s| s.subdomain.as_deref() == Some(name.as_str()))
            .and_then(|s| s.hostname.clone());
        for ip in pod_ips(pod) {
            let fam = if ip.is_ipv4() { "IPv4" } else { "IPv6" };
            groups
                .entry((fam.into(), ports.clone()))
                .or_default()
                .push(Endpoint {
                    addresses: vec![ip.to_string()],
                    conditions: Some(conditions.clone()),
                    hostname: hostname.clone(),
                    node_name: pspec.and_then(|s| s.node_name.clone()),
                    target_ref: Some(ObjectReference {
                        kind: Some("Pod".into()),
                        namespace: Some(ns.clone()),
                        name: pod.metadata.name.clone(),
                        uid: pod.metadata.uid.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
        }
    }
    let labels: BTreeMap<String, String> = [
        (SERVICE_NAME_LABEL.to_string(), name.clone()),
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
    ]
    .into();
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: name.clone(),
        uid: svc.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let mut out = Vec::new();
    if groups.is_empty() {
        // An empty slice says "selector matched nothing", as Kubernetes does.
        let fam = if spec
            .cluster_ip
            .as_deref()
            .map(|c| c.contains(':'))
            .unwrap_or(false)
        {
            "IPv6"
        } else {
            "IPv4"
        };
        groups.insert((fam.into(), Vec::new()), Vec::new());
    }
    for ((fam, ports), mut eps) in groups {
        eps.sort_by(|a, b| a.addresses.cmp(&b.addresses));
        let key = format!("{fam}|{ports:?}");
        out.push(EndpointSlice {
            metadata: ObjectMeta {
                name: Some(format!("{name}-{}", short_hash(&key))),
                namespace: Some(ns.clone()),
                labels: Some(labels.clone()),
                owner_references: Some(vec![owner.clone()]),
                ..Default::default()
            },
            address_type: fam,
            endpoints: eps,
            ports: Some(
                ports
                    .into_iter()
                    .map(|(n, proto, port)| EndpointPort {
                        name: n,
                        protocol: Some(proto),
                        port: Some(port),
                        app_protocol: None,
                    })
                    .collect(),
            ),
        });
    }
    out
}

/// Whether two slices carry the same data (ignoring server-owned metadata).
pub fn same(a: &EndpointSlice, b: &EndpointSlice) -> bool {
    a.address_type == b.address_type
        && a.endpoints == b.endpoints
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

    #[test]
    fn selects_ready_and_not_ready_pods_with_conditions() {
        let s = svc(
            json!({"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
        );
        let a = pod("a", json!({"app": "web"}), "10.244.1.5", true, None);
        let b = pod("b", json!({"app": "web"}), "10.244.2.7", false, None);
        let c = pod("c", json!({"app": "db"}), "10.244.2.8", true, None);
        let d = desired(&s, &[&a, &b, &c]);
        assert_eq!(d.len(), 1);
        let sl = &d[0];
        assert_eq!(sl.address_type, "IPv4");
        assert_eq!(sl.endpoints.len(), 2);
        assert_eq!(sl.endpoints[0].addresses, vec!["10.244.1.5"]);
        assert_eq!(
            sl.endpoints[0].conditions.as_ref().unwrap().ready,
            Some(true)
        );
        assert_eq!(
            sl.endpoints[1].conditions.as_ref().unwrap().ready,
            Some(false)
        );
        assert_eq!(sl.endpoints[0].node_name.as_deref(), Some("n1"));
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
        let d = desired(&s, &[&a, &b, &c]);
        assert_eq!(d.len(), 2, "one slice per resolved port");
        let ports: Vec<i32> = d
            .iter()
            .map(|s| s.ports.as_ref().unwrap()[0].port.unwrap())
            .collect();
        assert!(ports.contains(&8080) && ports.contains(&9090));
        assert_ne!(d[0].metadata.name, d[1].metadata.name);
    }

    #[test]
    fn no_selector_or_external_name_means_no_slices() {
        assert!(desired(&svc(json!({"ports": [{"port": 80}]})), &[]).is_empty());
        assert!(desired(
            &svc(json!({"type": "ExternalName", "externalName": "x.com", "selector": {"a": "b"}})),
            &[]
        )
        .is_empty());
        let empty = desired(
            &svc(json!({"selector": {"app": "web"}, "ports": [{"port": 80}]})),
            &[],
        );
        assert_eq!(empty.len(), 1);
        assert!(empty[0].endpoints.is_empty());
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
        let c = desired(&s, &[&a])[0].endpoints[0]
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

        let published = desired(&spec(true), &pods);
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
        let plain = desired(&spec(false), &pods);
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
}
