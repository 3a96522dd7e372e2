//! What a Service asks of LB IPAM, read from its spec and annotations:
//! whether it is podnet's to serve at all, which families, which
//! addresses or pool it names, and whether it may share an address.
//! A request that cannot be met as written is an error whose text names
//! the field or annotation, for the controller to log.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use podnet_api::k8s_openapi::api::core::v1::{Service, ServiceSpec};

use super::Family;

/// The `spec.loadBalancerClass` podnet serves (as does a Service with no
/// class: podnet is the cluster's default implementation).
pub const LB_CLASS: &str = "podnet.io/lb";
/// Names the pool a Service's automatic address comes from.
pub const POOL_ANNOTATION: &str = "podnet.io/address-pool";
/// The addresses a Service asks for, comma-separated, one per family; it
/// wins over `spec.loadBalancerIP` (deprecated upstream, one family only).
pub const IPS_ANNOTATION: &str = "podnet.io/loadBalancerIPs";
/// Services with the same value may share an address when their ports do
/// not overlap (MetalLB's `allow-shared-ip`).
pub const SHARING_ANNOTATION: &str = "podnet.io/allow-shared-ip";

/// Whether a Service is podnet's to give an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Not `type: LoadBalancer`: it holds no load-balancer address.
    NotLoadBalancer,
    /// Another implementation's class: left alone, as Kubernetes expects
    /// of the default implementation.
    OtherClass(String),
    Ours,
}

pub fn scope(svc: &Service) -> Scope {
    let Some(spec) = &svc.spec else {
        return Scope::NotLoadBalancer;
    };
    if spec.type_.as_deref() != Some("LoadBalancer") {
        return Scope::NotLoadBalancer;
    }
    match spec.load_balancer_class.as_deref() {
        None | Some(LB_CLASS) => Scope::Ours,
        Some(c) => Scope::OtherClass(c.to_string()),
    }
}

/// What sharing an address takes (MetalLB's rule): the same sharing key,
/// no port used by both (number and protocol), and, if either sends
/// external traffic only to local endpoints, the same pods (the same
/// selector), since one node answers for the address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sharing {
    pub key: String,
    pub ports: BTreeSet<(i32, String)>,
    pub local: bool,
    pub selector: BTreeMap<String, String>,
}

impl Sharing {
    pub fn of(svc: &Service) -> Option<Sharing> {
        let key = svc
            .metadata
            .annotations
            .as_ref()?
            .get(SHARING_ANNOTATION)?
            .trim();
        if key.is_empty() {
            return None;
        }
        let spec = svc.spec.clone().unwrap_or_default();
        Some(Sharing {
            key: key.to_string(),
            ports: spec
                .ports
                .iter()
                .flatten()
                .map(|p| (p.port, p.protocol.clone().unwrap_or_else(|| "TCP".into())))
                .collect(),
            local: spec.external_traffic_policy.as_deref() == Some("Local"),
            selector: spec.selector.unwrap_or_default(),
        })
    }

    pub fn compatible(&self, o: &Sharing) -> bool {
        self.key == o.key
            && self.ports.is_disjoint(&o.ports)
            && (!(self.local || o.local) || self.selector == o.selector)
    }
}

/// A Service's request, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The families to give addresses of, in order.
    pub families: Vec<Family>,
    /// Every family or nothing (single-stack, `RequireDualStack`); else
    /// (`PreferDualStack`) as many as can be had, at least one.
    pub need_all: bool,
    /// Addresses asked for by name, in `families` order; empty: automatic.
    pub requested: Vec<IpAddr>,
    /// The pool named by [`POOL_ANNOTATION`].
    pub pool: Option<String>,
    pub sharing: Option<Sharing>,
}

fn annotation<'a>(svc: &'a Service, key: &str) -> Option<&'a str> {
    svc.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
}

/// Reads what `svc` (a Service of [`Scope::Ours`]) asks for.
pub fn read(svc: &Service) -> Result<Request, String> {
    let spec = svc.spec.clone().unwrap_or_default();
    let requested = requested(svc, &spec)?;
    let (families, need_all) = families(&spec, &requested)?;
    let requested = match_families(&spec, families.clone(), need_all, requested)?;
    let families = if requested.is_empty() {
        families
    } else {
        requested.iter().map(|ip| Family::of(*ip)).collect()
    };
    Ok(Request {
        families,
        need_all,
        requested,
        pool: annotation(svc, POOL_ANNOTATION).map(str::to_string),
        sharing: Sharing::of(svc),
    })
}

/// The addresses asked for: the annotation's list, or else
/// `spec.loadBalancerIP`; at most one per family.
fn requested(svc: &Service, spec: &ServiceSpec) -> Result<Vec<IpAddr>, String> {
    let from_spec = spec
        .load_balancer_ip
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty());
    let (what, list): (String, Vec<&str>) = match annotation(svc, IPS_ANNOTATION) {
        Some(a) => (
            format!("annotation {IPS_ANNOTATION}"),
            a.split(',').map(str::trim).collect(),
        ),
        None => match from_spec {
            Some(s) => ("spec.loadBalancerIP".to_string(), vec![s]),
            None => return Ok(Vec::new()),
        },
    };
    let mut out: Vec<IpAddr> = Vec::new();
    for s in list {
        let ip: IpAddr = s
            .parse()
            .map_err(|_| format!("{what}: {s:?} is not an IP address"))?;
        if let Some(o) = out.iter().find(|o| Family::of(**o) == Family::of(ip)) {
            return Err(format!(
                "{what}: {o} and {ip} are both {}: ask for one address per family",
                Family::of(ip)
            ));
        }
        out.push(ip);
    }
    if let (Some(s), true) = (from_spec, what.starts_with("annotation")) {
        if !s.parse().is_ok_and(|ip: IpAddr| out.contains(&ip)) {
            return Err(format!(
                "spec.loadBalancerIP {s} is not among annotation {IPS_ANNOTATION}: remove one"
            ));
        }
    }
    Ok(out)
}

/// The families a Service wants, from `spec.ipFamilyPolicy` and
/// `spec.ipFamilies` (else its ClusterIPs' families, else those of the
/// addresses it asks for, else IPv4), and whether it needs all of them.
fn families(spec: &ServiceSpec, requested: &[IpAddr]) -> Result<(Vec<Family>, bool), String> {
    let mut base = Vec::new();
    for (i, f) in spec.ip_families.iter().flatten().enumerate() {
        match f.as_str() {
            "IPv4" => base.push(Family::V4),
            "IPv6" => base.push(Family::V6),
            o => return Err(format!("spec.ipFamilies[{i}]: unknown family {o:?}")),
        }
    }
    if base.is_empty() {
        let ips = spec
            .cluster_ips
            .iter()
            .flatten()
            .chain(spec.cluster_ip.iter());
        base = ips.filter_map(|s| s.parse().ok()).map(Family::of).collect();
    }
    if base.is_empty() {
        base = requested.iter().map(|ip| Family::of(*ip)).collect();
    }
    let first = base.first().copied().unwrap_or(Family::V4);
    match spec.ip_family_policy.as_deref() {
        None | Some("SingleStack") => Ok((vec![first], true)),
        Some("PreferDualStack") => Ok((vec![first, first.other()], false)),
        Some("RequireDualStack") => Ok((vec![first, first.other()], true)),
        Some(o) => Err(format!("spec.ipFamilyPolicy: unknown policy {o:?}")),
    }
}

/// The requested addresses in family order, each of a family the Service
/// has, all of them when it needs every family.
fn match_families(
    spec: &ServiceSpec,
    families: Vec<Family>,
    need_all: bool,
    requested: Vec<IpAddr>,
) -> Result<Vec<IpAddr>, String> {
    if requested.is_empty() {
        return Ok(requested);
    }
    let policy = spec.ip_family_policy.as_deref().unwrap_or("SingleStack");
    let stack = match families.as_slice() {
        [f] => format!("{f} single-stack"),
        _ => format!("dual-stack ({policy})"),
    };
    if let Some(ip) = requested
        .iter()
        .find(|ip| !families.contains(&Family::of(**ip)))
    {
        return Err(format!(
            "{ip} is {} but the Service is {stack}",
            Family::of(*ip)
        ));
    }
    if need_all && requested.len() < families.len() {
        return Err(format!(
            "the Service is {stack}: ask for one address of each family"
        ));
    }
    let mut out = requested;
    out.sort_by_key(|ip| families.iter().position(|f| *f == Family::of(*ip)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(spec: serde_json::Value, annotations: serde_json::Value) -> Service {
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "shop",
            "annotations": annotations}, "spec": spec}))
        .unwrap()
    }

    fn lb(extra: serde_json::Value) -> serde_json::Value {
        let mut s = json!({"type": "LoadBalancer", "ports": [{"port": 80}]});
        for (k, v) in extra.as_object().unwrap() {
            s[k] = v.clone();
        }
        s
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn only_load_balancers_of_our_class_or_none() {
        let s = |spec| scope(&svc(spec, json!({})));
        assert_eq!(s(json!({"ports": [{"port": 80}]})), Scope::NotLoadBalancer);
        assert_eq!(s(json!({"type": "NodePort"})), Scope::NotLoadBalancer);
        assert_eq!(s(lb(json!({}))), Scope::Ours);
        assert_eq!(
            s(lb(json!({"loadBalancerClass": "podnet.io/lb"}))),
            Scope::Ours
        );
        assert_eq!(
            s(lb(json!({"loadBalancerClass": "example.com/cloud"}))),
            Scope::OtherClass("example.com/cloud".into())
        );
    }

    #[test]
    fn families_follow_the_policy_and_the_cluster_ips() {
        let r = |spec| read(&svc(spec, json!({}))).map(|r| (r.families, r.need_all));
        use Family::*;
        assert_eq!(r(lb(json!({}))), Ok((vec![V4], true)), "nothing said: IPv4");
        assert_eq!(r(lb(json!({"clusterIP": "fd00::5"}))), Ok((vec![V6], true)));
        assert_eq!(r(lb(json!({"ipFamilies": ["IPv6"]}))), Ok((vec![V6], true)));
        assert_eq!(
            r(lb(json!({"ipFamilyPolicy": "PreferDualStack"}))),
            Ok((vec![V4, V6], false))
        );
        assert_eq!(
            r(lb(
                json!({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6", "IPv4"]})
            )),
            Ok((vec![V6, V4], true))
        );
        assert_eq!(
            r(lb(json!({"ipFamilyPolicy": "Sometimes"}))),
            Err("spec.ipFamilyPolicy: unknown policy \"Sometimes\"".into())
        );
    }

    #[test]
    fn requested_addresses_by_annotation_or_spec() {
        let r = |spec, ann| read(&svc(spec, ann));
        let got = r(lb(json!({"loadBalancerIP": "192.0.2.5"})), json!({})).unwrap();
        assert_eq!(got.requested, [ip("192.0.2.5")]);
        // The annotation, one per family, in the families' order.
        let got = r(
            lb(json!({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"]})),
            json!({IPS_ANNOTATION: "2001:db8::5, 192.0.2.5"}),
        )
        .unwrap();
        assert_eq!(got.requested, [ip("192.0.2.5"), ip("2001:db8::5")]);
        assert_eq!(got.families, [Family::V4, Family::V6]);
        // Nothing else said: the annotation's order is the families'.
        let got = r(
            lb(json!({"ipFamilyPolicy": "RequireDualStack"})),
            json!({IPS_ANNOTATION: "2001:db8::5, 192.0.2.5"}),
        )
        .unwrap();
        assert_eq!(got.families, [Family::V6, Family::V4]);
        // PreferDualStack with one address: that family only.
        let got = r(
            lb(json!({"ipFamilyPolicy": "PreferDualStack"})),
            json!({IPS_ANNOTATION: "2001:db8::5"}),
        )
        .unwrap();
        assert_eq!(got.families, [Family::V6]);
        for (spec, ann, want) in [
            (lb(json!({"loadBalancerIP": "banana"})), json!({}),
             "spec.loadBalancerIP: \"banana\" is not an IP address"),
            (lb(json!({})), json!({IPS_ANNOTATION: "192.0.2.5,192.0.2.6"}),
             "annotation podnet.io/loadBalancerIPs: 192.0.2.5 and 192.0.2.6 are both IPv4: ask for one address per family"),
            (lb(json!({"clusterIP": "10.96.0.9"})), json!({IPS_ANNOTATION: "2001:db8::5"}),
             "2001:db8::5 is IPv6 but the Service is IPv4 single-stack"),
            (lb(json!({"ipFamilyPolicy": "RequireDualStack"})), json!({IPS_ANNOTATION: "192.0.2.5"}),
             "the Service is dual-stack (RequireDualStack): ask for one address of each family"),
            (lb(json!({"loadBalancerIP": "192.0.2.9"})), json!({IPS_ANNOTATION: "192.0.2.5"}),
             "spec.loadBalancerIP 192.0.2.9 is not among annotation podnet.io/loadBalancerIPs: remove one"),
        ] {
            assert_eq!(r(spec.clone(), ann.clone()), Err(want.to_string()), "{spec} {ann}");
        }
        // A requested address decides the family of a Service that says
        // nothing else.
        let got = r(lb(json!({"loadBalancerIP": "2001:db8::7"})), json!({})).unwrap();
        assert_eq!(got.families, [Family::V6]);
    }

    #[test]
    fn sharing_needs_the_key_disjoint_ports_and_for_local_the_same_pods() {
        let s = |spec: serde_json::Value, key: &str| {
            Sharing::of(&svc(spec, json!({SHARING_ANNOTATION: key}))).unwrap()
        };
        let tcp =
            lb(json!({"ports": [{"port": 53, "protocol": "TCP"}], "selector": {"app": "dns"}}));
        let udp =
            lb(json!({"ports": [{"port": 53, "protocol": "UDP"}], "selector": {"app": "dns"}}));
        assert!(s(tcp.clone(), "dns").compatible(&s(udp.clone(), "dns")));
        assert!(!s(tcp.clone(), "dns").compatible(&s(udp.clone(), "other")));
        assert!(
            !s(tcp.clone(), "dns").compatible(&s(tcp.clone(), "dns")),
            "port overlap"
        );
        let mut local = udp.clone();
        local["externalTrafficPolicy"] = json!("Local");
        assert!(
            s(tcp.clone(), "dns").compatible(&s(local.clone(), "dns")),
            "same pods"
        );
        local["selector"] = json!({"app": "other"});
        assert!(
            !s(tcp, "dns").compatible(&s(local, "dns")),
            "Local, other pods"
        );
        assert!(Sharing::of(&svc(udp, json!({SHARING_ANNOTATION: " "}))).is_none());
    }
}
