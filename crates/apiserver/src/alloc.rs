//! ClusterIP and NodePort allocation, safe across processes.
//!
//! Every allocated address or port is a key of its own,
//! `/registry/allocations/clusterips/<ip>` or
//! `/registry/allocations/nodeports/<port>`, whose value names the owning
//! Service. It is created in the same transaction that writes the Service,
//! so two concurrent creates can never both win an address: the loser's
//! transaction fails as a whole and it picks another.
//!
//! Dynamic ClusterIPs come from the upper part of the range first, leaving
//! the lower band for addresses people choose (like the DNS service's
//! 10.96.0.10), as the API server does.

use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;

use ipnet::IpNet;
use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::{cidr, Kind, Object};

use podnet_store::{AnyStore, Op, Result, Store};

/// Every reservation, of either kind.
pub const ALLOC_PREFIX: &str = "/registry/allocations/";
pub const IP_PREFIX: &str = "/registry/allocations/clusterips/";
pub const PORT_PREFIX: &str = "/registry/allocations/nodeports/";

pub fn owner(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or("default"),
        svc.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The allocation keys a Service holds, as it is written.
pub fn keys(svc: &Service) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if let Some(spec) = &svc.spec {
        let ips = spec
            .cluster_ip
            .iter()
            .chain(spec.cluster_ips.iter().flatten());
        for ip in ips {
            if let Ok(a) = ip.parse::<IpAddr>() {
                out.insert(format!("{IP_PREFIX}{a}"));
            }
        }
        for p in spec.ports.iter().flatten() {
            if let Some(np) = p.node_port {
                out.insert(format!("{PORT_PREFIX}{np}"));
            }
        }
        if let Some(h) = spec.health_check_node_port {
            out.insert(format!("{PORT_PREFIX}{h}"));
        }
    }
    out
}

/// What a failed reservation means for the user.
pub fn describe_taken(key: &str, holder: Option<&str>) -> String {
    let who = holder
        .map(|h| format!(" to Service {h}"))
        .unwrap_or_default();
    if let Some(ip) = key.strip_prefix(IP_PREFIX) {
        format!("spec.clusterIP: {ip} is already allocated{who}")
    } else if let Some(p) = key.strip_prefix(PORT_PREFIX) {
        format!("spec.ports.nodePort: {p} is already allocated{who}")
    } else {
        format!("{key} is already allocated{who}")
    }
}

/// Ops that move a Service's reservations from `old` to `new`: create what
/// is new (failing if taken), delete what is no longer held.
pub fn transition(old: Option<&Service>, new: Option<&Service>) -> Vec<Op> {
    let before = old.map(keys).unwrap_or_default();
    let after = new.map(keys).unwrap_or_default();
    let mut ops = Vec::new();
    if let Some(n) = new {
        for k in after.difference(&before) {
            ops.push(Op::Create {
                key: k.clone(),
                value: owner(n).into_bytes(),
                lease: 0,
            });
        }
    }
    for k in before.difference(&after) {
        ops.push(Op::Delete {
            key: k.clone(),
            rev: None,
        });
    }
    ops
}

/// Who holds an allocation key (for error messages).
pub async fn holder(store: &AnyStore, key: &str) -> Option<String> {
    store
        .get(key)
        .await
        .ok()
        .flatten()
        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
}

/// Picks a free ClusterIP, upper band first. Pure.
pub fn pick_ip(range: &IpNet, taken: &HashSet<IpAddr>, start_hint: u64) -> Option<IpAddr> {
    let (lo, hi) = cidr::usable(range);
    let total = hi - lo;
    let band = (total / 16).clamp(16, 256).min(total);
    let upper = (lo + band, hi);
    let lower = (lo, lo + band);
    for (a, b) in [upper, lower] {
        if a >= b {
            continue;
        }
        let span = b - a;
        for i in 0..span {
            let off = a + (start_hint + i) % span;
            let ip = cidr::nth(range, off)?;
            if !taken.contains(&ip) {
                return Some(ip);
            }
        }
    }
    None
}

/// Picks a free NodePort. Pure.
pub fn pick_port(range: (u16, u16), taken: &HashSet<u16>, start_hint: u64) -> Option<u16> {
    let span = (range.1 - range.0) as u64 + 1;
    (0..span)
        .map(|i| range.0 + ((start_hint + i) % span) as u16)
        .find(|p| !taken.contains(p))
}

/// Every allocation currently recorded: (clusterIPs, nodePorts).
pub async fn taken(store: &AnyStore) -> Result<(HashSet<IpAddr>, HashSet<u16>)> {
    let (ips, _) = store.list(IP_PREFIX).await?;
    let (ports, _) = store.list(PORT_PREFIX).await?;
    Ok((
        ips.iter()
            .filter_map(|k| k.key.strip_prefix(IP_PREFIX)?.parse().ok())
            .collect(),
        ports
            .iter()
            .filter_map(|k| k.key.strip_prefix(PORT_PREFIX)?.parse().ok())
            .collect(),
    ))
}

/// Whether a Service still needs addresses or ports the controller assigns.
pub fn needs_allocation(svc: &Service) -> bool {
    let Some(spec) = &svc.spec else { return false };
    let ty = spec.type_.as_deref().unwrap_or("ClusterIP");
    if ty == "ExternalName" {
        return false;
    }
    let no_ip = spec
        .cluster_ip
        .as_deref()
        .map(str::is_empty)
        .unwrap_or(true);
    let no_ports = matches!(ty, "NodePort" | "LoadBalancer")
        && spec.ports.iter().flatten().any(|p| p.node_port.is_none());
    no_ip || no_ports || needs_health_check_port(spec)
}

/// A LoadBalancer Service with `externalTrafficPolicy: Local` gets a
/// health-check node port, as the API server allocates one: cloud load
/// balancers probe it to learn which nodes have local endpoints.
pub fn needs_health_check_port(spec: &podnet_api::k8s_openapi::api::core::v1::ServiceSpec) -> bool {
    spec.type_.as_deref() == Some("LoadBalancer")
        && spec.external_traffic_policy.as_deref() == Some("Local")
        && spec.health_check_node_port.is_none()
}

/// Helper for callers holding an [`Object`].
pub fn as_service(o: &Object) -> Option<&Service> {
    match o {
        Object::Service(s) => Some(s),
        _ => None,
    }
}

pub fn service_kind() -> Kind {
    Kind::Service
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn keys_and_transitions() {
        let a = svc(json!({"metadata": {"name": "w", "namespace": "n"},
            "spec": {"clusterIP": "10.96.0.7", "type": "NodePort", "ports": [{"port": 80, "nodePort": 30001}]}}));
        let k = keys(&a);
        assert!(k.contains("/registry/allocations/clusterips/10.96.0.7"));
        assert!(k.contains("/registry/allocations/nodeports/30001"));
        let mut b = a.clone();
        b.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(30002);
        let ops = transition(Some(&a), Some(&b));
        assert_eq!(ops.len(), 2);
        assert!(
            matches!(&ops[0], Op::Create { key, value, .. } if key.ends_with("30002") && value == b"n/w")
        );
        assert!(matches!(&ops[1], Op::Delete { key, .. } if key.ends_with("30001")));
        assert_eq!(transition(Some(&a), None).len(), 2);
        assert!(
            describe_taken("/registry/allocations/clusterips/10.96.0.7", Some("n/x"))
                .contains("already allocated to Service n/x")
        );
    }

    #[test]
    fn picking() {
        let r: IpNet = "10.96.0.0/12".parse().unwrap();
        let ip = pick_ip(&r, &HashSet::new(), 0).unwrap();
        assert_eq!(
            ip.to_string(),
            "10.96.1.1",
            "dynamic range starts above the static band"
        );
        let small: IpNet = "10.0.0.0/29".parse().unwrap(); // usable .1-.6
        let mut taken = HashSet::new();
        for _ in 0..6 {
            let ip = pick_ip(&small, &taken, 0).unwrap();
            assert!(taken.insert(ip));
        }
        assert!(pick_ip(&small, &taken, 0).is_none());
        let ports: HashSet<u16> = (30000..32767).collect();
        assert_eq!(pick_port((30000, 32767), &ports, 5), Some(32767));
    }
}
