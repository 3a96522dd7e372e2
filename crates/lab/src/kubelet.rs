//! The lab's kubelet duties in Kubernetes mode, done through the API with
//! the admin's client: registering Nodes (addresses, hostname label, Ready),
//! waiting for kube-controller-manager's podCIDRs, creating Pods bound to a
//! node and writing their status through the status subresource once CNI
//! has wired them, as a kubelet would, and deleting them. The Pod object
//! itself ([`pod_object`]) is the same in standalone mode, where the lab
//! writes it to the store in the same order.
//!
//! Kept apart from [`crate::kube`] (which runs the control plane) and from
//! the lab's namespace plumbing (`lib.rs`), so the API calls a kubelet makes
//! are in one place and read like the kubelet's own sequence.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Namespace, Node, Pod, PodSpec, Service, ServiceAccount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

use crate::kube::KubeError;
use crate::serve::PortSpec;

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> KubeError {
    let what = what.into();
    move |e| KubeError::Api(what, e)
}

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Registers node `name` (label `kubernetes.io/hostname`) and writes its
/// status: the InternalIP `ip`, its hostname, and Ready, since in the lab
/// the node's "kubelet" is this process and it is up.
pub async fn register_node(c: &Client, name: &str, ip: Ipv4Addr) -> Result<(), KubeError> {
    let nodes: Api<Node> = Api::all(c.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_string(), name.to_string()),
                ("kubernetes.io/os".to_string(), "linux".to_string()),
            ])),
            ..Default::default()
        },
        ..Default::default()
    };
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(e) if status_code(&e) == Some(409) => {}
        Err(e) => return Err(KubeError::Api(format!("creating Node {name}"), e)),
    }
    let t = now();
    let status = json!({"status": {
        "addresses": [
            {"type": "InternalIP", "address": ip.to_string()},
            {"type": "Hostname", "address": name},
        ],
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "podnet lab node", "lastHeartbeatTime": t, "lastTransitionTime": t,
        }],
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(api_err(format!("writing Node {name} status")))?;
    Ok(())
}

/// Waits until kube-controller-manager has given every node in `names` a
/// podCIDR; returns them by node.
pub async fn wait_pod_cidrs(
    c: &Client,
    names: &[String],
    deadline: Instant,
) -> Result<BTreeMap<String, Ipv4Net>, KubeError> {
    let nodes: Api<Node> = Api::all(c.clone());
    loop {
        let mut got = BTreeMap::new();
        for n in nodes
            .list(&Default::default())
            .await
            .map_err(api_err("listing Nodes"))?
        {
            let name = n.metadata.name.clone().unwrap_or_default();
            let cidr = n
                .spec
                .as_ref()
                .and_then(|s| s.pod_cidr.as_deref())
                .and_then(|c| c.parse::<Ipv4Net>().ok());
            if let Some(cidr) = cidr {
                got.insert(name, cidr);
            }
        }
        let missing: Vec<&String> = names.iter().filter(|n| !got.contains_key(*n)).collect();
        if missing.is_empty() {
            return Ok(got);
        }
        if Instant::now() > deadline {
            return Err(KubeError::Start(format!(
                "kube-controller-manager gave no podCIDR to {missing:?} (see its log)"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates namespace `ns` if missing and waits for its `default`
/// ServiceAccount (the ServiceAccount admission plugin refuses Pods
/// until kube-controller-manager has made it).
pub async fn ensure_namespace(c: &Client, ns: &str) -> Result<(), KubeError> {
    let nss: Api<Namespace> = Api::all(c.clone());
    let obj = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match nss.create(&PostParams::default(), &obj).await {
        Ok(_) => {}
        Err(e) if status_code(&e) == Some(409) => {}
        Err(e) => return Err(KubeError::Api(format!("creating Namespace {ns}"), e)),
    }
    let sas: Api<ServiceAccount> = Api::namespaced(c.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    while sas
        .get_opt("default")
        .await
        .map_err(api_err(format!("reading ServiceAccount {ns}/default")))?
        .is_none()
    {
        if Instant::now() > deadline {
            return Err(KubeError::Start(format!(
                "no ServiceAccount {ns}/default from kube-controller-manager"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The container port name of a lab port: its own name, else `tcp-80`,
/// `udp-53`.
pub fn port_name(p: &PortSpec) -> String {
    p.name
        .clone()
        .unwrap_or_else(|| format!("{}-{}", if p.udp { "udp" } else { "tcp" }, p.port))
}

/// A lab pod's labels and annotations (`k8s.v1.cni.cncf.io/networks`
/// asks for extra networks).
#[derive(Debug, Clone, Default)]
pub struct PodMeta {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl From<BTreeMap<String, String>> for PodMeta {
    fn from(labels: BTreeMap<String, String>) -> PodMeta {
        PodMeta {
            labels,
            annotations: BTreeMap::new(),
        }
    }
}

/// The Pod `ns/name` bound to `node` (as if scheduled there), one
/// container declaring `ports`, with no status yet: what both modes
/// register before the pod's sandbox exists, as a kubelet finds it.
pub fn pod_object(ns: &str, name: &str, node: &str, meta: PodMeta, ports: &[PortSpec]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(meta.labels),
            annotations: (!meta.annotations.is_empty()).then_some(meta.annotations),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            automount_service_account_token: Some(false),
            containers: vec![Container {
                name: "serve".into(),
                image: Some("podnet".into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|p| ContainerPort {
                            name: Some(port_name(p)),
                            container_port: p.port as i32,
                            protocol: Some(if p.udp { "UDP" } else { "TCP" }.into()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

/// Creates `pod` (see [`pod_object`]) through the API.
pub async fn create_pod(c: &Client, pod: &Pod) -> Result<(), KubeError> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    pods.create(&PostParams::default(), pod)
        .await
        .map_err(api_err(format!("creating Pod {ns}/{name}")))?;
    Ok(())
}

/// Writes the status a kubelet writes once the pod's sandbox and container
/// run: its IP, its node's IP, phase Running, Ready and ContainersReady.
pub async fn set_pod_running(
    c: &Client,
    ns: &str,
    name: &str,
    (ip, ip6): (&str, Option<&str>),
    host_ip: Ipv4Addr,
) -> Result<(), KubeError> {
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    let ips: Vec<serde_json::Value> = std::iter::once(ip)
        .chain(ip6)
        .map(|ip| json!({"ip": ip}))
        .collect();
    let t = now();
    let cond = |ty: &str| json!({"type": ty, "status": "True", "lastTransitionTime": t});
    let status = json!({"status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": ips,
        "hostIP": host_ip.to_string(),
        "hostIPs": [{"ip": host_ip.to_string()}],
        "startTime": t,
        "conditions": [
            cond("PodScheduled"), cond("Initialized"), cond("ContainersReady"), cond("Ready"),
        ],
        "containerStatuses": [{
            "name": "serve", "image": "podnet", "imageID": "", "ready": true,
            "started": true, "restartCount": 0, "state": {"running": {"startedAt": t}},
        }],
    }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(api_err(format!("writing Pod {ns}/{name} status")))?;
    Ok(())
}

/// Writes what a kubelet writes when a pod's readiness probe starts
/// failing (`ready: false`) or passes again: the Ready and ContainersReady
/// conditions, merged by type into the status (the other conditions and
/// the IPs stay). kube-controller-manager then marks the pod's endpoints
/// not ready, and service proxies stop sending it new connections, which
/// is how a rolling replacement drains a pod before stopping it.
pub async fn set_pod_ready(c: &Client, ns: &str, name: &str, ready: bool) -> Result<(), KubeError> {
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    let t = now();
    let status = if ready { "True" } else { "False" };
    let cond = |ty: &str| json!({"type": ty, "status": status, "lastTransitionTime": t});
    let patch = json!({"status": {
        "conditions": [cond("ContainersReady"), cond("Ready")],
    }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map_err(api_err(format!("writing Pod {ns}/{name} readiness")))?;
    Ok(())
}

/// Deletes Pod `ns/name` at once (grace period 0: the lab has already
/// stopped it, as a kubelet confirms a deletion); a missing Pod is fine.
pub async fn delete_pod(c: &Client, ns: &str, name: &str) -> Result<(), KubeError> {
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    match pods
        .delete(name, &DeleteParams::default().grace_period(0))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if status_code(&e) == Some(404) => Ok(()),
        Err(e) => Err(KubeError::Api(format!("deleting Pod {ns}/{name}"), e)),
    }
}

/// Creates `svc` unless a Service of that name exists.
pub async fn ensure_service(c: &Client, svc: &Service) -> Result<(), KubeError> {
    let ns = svc.metadata.namespace.clone().unwrap_or_default();
    let name = svc.metadata.name.clone().unwrap_or_default();
    let api: Api<Service> = Api::namespaced(c.clone(), &ns);
    match api.create(&PostParams::default(), svc).await {
        Ok(_) => Ok(()),
        Err(e) if status_code(&e) == Some(409) => Ok(()),
        Err(e) => Err(KubeError::Api(format!("creating Service {ns}/{name}"), e)),
    }
}

#[cfg(test)]
mod tests {
    use crate::serve::PortSpec;

    #[test]
    fn port_names_are_valid_iana_names() {
        for (p, want) in [
            (PortSpec::tcp(80), "tcp-80"),
            (PortSpec::udp(65535), "udp-65535"),
            (PortSpec::tcp(80).named("serve-80-tcp"), "serve-80-tcp"),
        ] {
            let n = super::port_name(&p);
            assert_eq!(n, want);
            assert!(podnet_api::validate::is_port_name(&n), "{n}");
        }
    }

    /// The Pod both modes register: bound to its node, named container
    /// ports, no status until the sandbox runs.
    #[test]
    fn pod_object_declares_named_ports_and_no_status() {
        let ports = crate::serve::parse_ports("serve-80-tcp=80/tcp,81/udp").unwrap();
        let labels: std::collections::BTreeMap<String, String> =
            [("pod".to_string(), "a".to_string())].into();
        let p = super::pod_object("x", "a", "node2", labels.into(), &ports);
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["spec"]["nodeName"], "node2");
        assert_eq!(v["metadata"]["labels"]["pod"], "a");
        assert_eq!(
            v["spec"]["containers"][0]["ports"],
            serde_json::json!([
                {"name": "serve-80-tcp", "containerPort": 80, "protocol": "TCP"},
                {"name": "udp-81", "containerPort": 81, "protocol": "UDP"},
            ])
        );
        assert!(p.status.is_none());
    }
}
