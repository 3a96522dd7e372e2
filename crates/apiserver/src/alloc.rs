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
use podnet_api::ipfamily::{self, ServiceCidrs};
use podnet_api::k8s_openapi::api::core::v1::{Service, ServiceSpec};
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

/// Gives `spec` a ClusterIP for each of its families that has none yet
/// ([`ipfamily::missing`]), from that family's CIDR, the first one also
/// as `clusterIP`. Pure; Err says why not: a family the cluster has no
/// CIDR for (its config changed since admission), or one with no free
/// address left. Nothing is given then.
pub fn assign_cluster_ips(
    spec: &mut ServiceSpec,
    cidrs: &ServiceCidrs,
    taken: &HashSet<IpAddr>,
    hint: u64,
) -> std::result::Result<(), String> {
    // Each family is missing once and picks from its own CIDR, so the
    // picks cannot collide with each other: `taken` is enough.
    let missing = ipfamily::missing(spec, cidrs);
    let mut picked = Vec::new();
    for family in &missing {
        let cidr = cidrs
            .of_family(family)
            .ok_or_else(|| format!("{family} is not configured on this cluster (ServiceCIDR)"))?;
        let ip = pick_ip(&cidr, taken, hint >> 20)
            .ok_or_else(|| format!("service CIDR {cidr} is exhausted"))?;
        picked.push(ip);
    }
    for (family, ip) in missing.into_iter().zip(picked) {
        let ips = spec.cluster_ips.get_or_insert_with(Vec::new);
        if ips.is_empty() {
            if let Some(c) = spec.cluster_ip.clone().filter(|c| !c.is_empty()) {
                ips.push(c);
            }
        }
        ips.push(ip.to_string());
        if spec.cluster_ip.as_deref().unwrap_or_default().is_empty() {
            spec.cluster_ip = Some(ip.to_string());
        }
        if spec
            .ip_families
            .as_ref()
            .is_none_or(|f| f.len() < ips.len())
        {
            spec.ip_families
                .get_or_insert_with(Vec::new)
                .push(family.to_string());
        }
    }
    Ok(())
}

/// Picks a free NodePort. Pure.
pub fn pick_port(range: (u16, u16), taken: &HashSet<u16>, start_hint: u64) -> Option<u16> {
    let span = (range.1 - range.0) as u64 + 1;
    (0..span)
        .map(|i| range.0 + ((start_hint + i) % span) as u16)
        .find(|p| !taken.contains(p))
}

/// Gives `spec` the node ports the server assigns and it still lacks: one
/// per port when [`allocates_node_ports`], and the health-check node port
/// when [`needs_health_check_port`]; ports already set stay as they are.
/// Picks from `range` avoiding `taken`, the ports the spec already holds
/// and what it picks itself. Pure; None when the range has no free port
/// left (then `spec` is partly filled and should be dropped).
pub fn assign_node_ports(
    spec: &mut ServiceSpec,
    range: (u16, u16),
    taken: &HashSet<u16>,
    hint: u64,
) -> Option<()> {
    let mut taken = taken.clone();
    let held = spec.ports.iter().flatten().filter_map(|p| p.node_port);
    taken.extend(
        held.chain(spec.health_check_node_port)
            .filter_map(|p| u16::try_from(p).ok()),
    );
    if allocates_node_ports(spec) {
        for p in spec.ports.iter_mut().flatten() {
            if p.node_port.is_none() {
                let port = pick_port(range, &taken, hint >> 24)?;
                taken.insert(port);
                p.node_port = Some(port as i32);
            }
        }
    }
    if needs_health_check_port(spec) {
        let port = pick_port(range, &taken, hint >> 28)?;
        spec.health_check_node_port = Some(port as i32);
    }
    Some(())
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
    // Headless and ExternalName Services get none; every other a
    // ClusterIP per family (a second one comes when families outnumber
    // the addresses: a Service made dual-stack, or written that way).
    let fams = spec.ip_families.as_ref().map_or(1, Vec::len);
    let have = spec
        .cluster_ips
        .as_ref()
        .map_or(0, Vec::len)
        .max(usize::from(
            !spec.cluster_ip.as_deref().unwrap_or_default().is_empty(),
        ));
    let no_ip = spec.cluster_ip.as_deref() != Some("None") && have < fams;
    let no_ports =
        allocates_node_ports(spec) && spec.ports.iter().flatten().any(|p| p.node_port.is_none());
    no_ip || no_ports || needs_health_check_port(spec)
}

/// Whether the server gives the Service's ports NodePorts they lack, as
/// the API server decides (`shouldAllocateNodePorts`): always for
/// `type: NodePort`; for `type: LoadBalancer` unless
/// `spec.allocateLoadBalancerNodePorts` is false, which load balancers
/// that reach pods directly ask for so no node port is spent on them.
/// NodePorts given explicitly are kept either way (they are reserved from
/// the spec, see [`keys`]), and the health-check node port does not depend
/// on it ([`needs_health_check_port`]).
pub fn allocates_node_ports(spec: &ServiceSpec) -> bool {
    match spec.type_.as_deref() {
        Some("NodePort") => true,
        Some("LoadBalancer") => spec.allocate_load_balancer_node_ports != Some(false),
        _ => false,
    }
}

/// A LoadBalancer Service with `externalTrafficPolicy: Local` gets a
/// health-check node port, as the API server allocates one: cloud load
/// balancers probe it to learn which nodes have local endpoints.
pub fn needs_health_check_port(spec: &ServiceSpec) -> bool {
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

    fn spec(v: serde_json::Value) -> ServiceSpec {
        serde_json::from_value(v).unwrap()
    }

    /// What the controller gives a spec with nothing taken yet: the node
    /// ports of its ports, and its health-check node port.
    fn assigned(v: serde_json::Value) -> (Vec<Option<i32>>, Option<i32>) {
        let mut s = spec(v);
        assign_node_ports(&mut s, (30000, 32767), &HashSet::new(), 0).unwrap();
        let ports = s.ports.iter().flatten().map(|p| p.node_port).collect();
        (ports, s.health_check_node_port)
    }

    /// The API server's `shouldAllocateNodePorts`: a LoadBalancer with
    /// `allocateLoadBalancerNodePorts: false` gets no node ports, keeps
    /// the ones it asks for, and still gets a health-check node port for
    /// `externalTrafficPolicy: Local`.
    #[test]
    fn load_balancers_may_opt_out_of_node_ports() {
        let two = json!([{"name": "a", "port": 80}, {"name": "b", "port": 81}]);
        let lb = |allocate: Option<bool>| {
            let mut v = json!({"type": "LoadBalancer", "clusterIP": "10.96.0.9", "ports": two});
            if let Some(a) = allocate {
                v["allocateLoadBalancerNodePorts"] = json!(a);
            }
            v
        };
        for (v, want) in [
            (lb(None), true),
            (lb(Some(true)), true),
            (lb(Some(false)), false),
            (json!({"type": "NodePort", "ports": two}), true),
            (json!({"type": "ClusterIP", "ports": two}), false),
            (json!({"ports": two}), false),
            (
                json!({"type": "ExternalName", "externalName": "x.com"}),
                false,
            ),
        ] {
            assert_eq!(allocates_node_ports(&spec(v.clone())), want, "{v}");
            let (ports, _) = assigned(v.clone());
            assert!(ports.iter().all(|p| p.is_some() == want), "{v}: {ports:?}");
        }

        // Nothing left to allocate: the controller leaves it alone.
        let opted_out =
            svc(json!({"metadata": {"name": "w", "namespace": "n"}, "spec": lb(Some(false))}));
        assert!(!needs_allocation(&opted_out));
        assert!(needs_allocation(&svc(
            json!({"metadata": {"name": "w", "namespace": "n"}, "spec": lb(None)})
        )));

        // An explicit node port is kept (and reserved); the other port
        // stays without one.
        let mut v = lb(Some(false));
        v["ports"][0]["nodePort"] = json!(30080);
        let (ports, hc) = assigned(v.clone());
        assert_eq!(ports, [Some(30080), None]);
        assert_eq!(hc, None);
        let held = svc(json!({"metadata": {"name": "w", "namespace": "n"}, "spec": v}));
        assert!(!needs_allocation(&held));
        assert!(keys(&held).contains("/registry/allocations/nodeports/30080"));

        // externalTrafficPolicy: Local still needs its health-check port.
        let mut v = lb(Some(false));
        v["externalTrafficPolicy"] = json!("Local");
        let local = svc(json!({"metadata": {"name": "w", "namespace": "n"}, "spec": v.clone()}));
        assert!(needs_allocation(&local));
        let (ports, hc) = assigned(v);
        assert_eq!(ports, [None, None]);
        assert!(hc.is_some_and(|p| (30000..=32767).contains(&p)), "{hc:?}");
    }

    #[test]
    fn assigned_node_ports_are_distinct_and_free() {
        let mut s = spec(
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
            "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 81, "nodePort": 30001}]}),
        );
        let taken: HashSet<u16> = [30000, 30002].into();
        assign_node_ports(&mut s, (30000, 30004), &taken, 0).unwrap();
        let got: Vec<i32> = s
            .ports
            .iter()
            .flatten()
            .filter_map(|p| p.node_port)
            .chain(s.health_check_node_port)
            .collect();
        assert_eq!(got.len(), 3);
        assert_eq!(got[1], 30001, "a given port is kept");
        let distinct: HashSet<i32> = got.iter().copied().collect();
        assert_eq!(distinct.len(), 3, "{got:?}");
        assert!(got.iter().all(|p| !taken.contains(&(*p as u16))), "{got:?}");
        // Exhausted: one free port for two needs.
        let mut s = spec(json!({"type": "NodePort",
            "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 81}]}));
        let taken: HashSet<u16> = (30000..30004).collect();
        assert!(assign_node_ports(&mut s, (30000, 30004), &taken, 0).is_none());
    }

    /// A ClusterIP per family, each from its own CIDR, the first also as
    /// `clusterIP`; a family the cluster lost gives nothing and says so.
    #[test]
    fn cluster_ips_per_family() {
        let cidrs = ServiceCidrs {
            primary: "10.96.0.0/12".parse().unwrap(),
            secondary: Some("fd00:10:96::/112".parse().unwrap()),
        };
        let mut s = spec(json!({"ipFamilies": ["IPv6", "IPv4"], "ports": [{"port": 80}]}));
        assign_cluster_ips(&mut s, &cidrs, &HashSet::new(), 0).unwrap();
        let ips = s.cluster_ips.clone().unwrap();
        assert_eq!(ips.len(), 2);
        assert!(
            ips[0].starts_with("fd00:10:96::") && ips[1].starts_with("10."),
            "{ips:?}"
        );
        assert_eq!(s.cluster_ip.as_deref(), Some(ips[0].as_str()));
        assert_eq!(s.ip_families.unwrap(), ["IPv6", "IPv4"]);
        // Upgraded: the second family's address only.
        let mut s = spec(
            json!({"clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5"],
            "ipFamilies": ["IPv4", "IPv6"]}),
        );
        assign_cluster_ips(&mut s, &cidrs, &HashSet::new(), 0).unwrap();
        assert_eq!(s.cluster_ips.as_ref().unwrap()[0], "10.96.0.5");
        assert!(s.cluster_ips.as_ref().unwrap()[1].contains(':'));
        let single = ServiceCidrs::single(cidrs.primary);
        let mut s = spec(json!({"ipFamilies": ["IPv4", "IPv6"]}));
        let e = assign_cluster_ips(&mut s, &single, &HashSet::new(), 0).unwrap_err();
        assert!(e.contains("IPv6 is not configured"), "{e}");
        assert_eq!(s.cluster_ips, None, "nothing given");
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
