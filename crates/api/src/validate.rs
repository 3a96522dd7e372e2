//! Validation like the API server's, for the fields networking relies on:
//! names, CIDRs and IPs, ports and protocols, label selectors, and the
//! Service type rules. Every error names the field path.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Pod, Service, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::gateway::validate as gateway;
use crate::ipfamily::{self, ServiceCidrs};
use crate::object::Object;
use crate::{netconfig, FieldError};

/// Cluster settings validation depends on.
#[derive(Debug, Clone)]
pub struct Context {
    pub service_cidrs: ServiceCidrs,
    pub node_port_range: (u16, u16),
}

impl Context {
    /// The context a cluster's NetworkConfig implies (defaults without one).
    pub fn from_config(c: Option<&netconfig::NetworkConfig>) -> Context {
        match c.and_then(|c| c.resolve().ok()) {
            Some(r) => Context {
                service_cidrs: r.service_cidrs(),
                node_port_range: r.node_port_range,
            },
            None => Context::default(),
        }
    }
}

impl Default for Context {
    fn default() -> Self {
        Context {
            service_cidrs: ServiceCidrs::single(
                netconfig::DEFAULT_SERVICE_CIDR
                    .parse()
                    .expect("default CIDR"),
            ),
            node_port_range: netconfig::DEFAULT_NODE_PORT_RANGE,
        }
    }
}

#[derive(Default)]
struct Errs(Vec<FieldError>);

impl Errs {
    fn add(&mut self, field: impl Into<String>, msg: impl Into<String>) {
        self.0.push(FieldError {
            field: field.into(),
            msg: msg.into(),
        });
    }
}

pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

/// An IANA service name, as used for named ports.
pub fn is_port_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && s.bytes().any(|b| b.is_ascii_lowercase())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}

fn label_key_ok(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
    name_ok && prefix.map(is_dns1123_subdomain).unwrap_or(true)
}

fn label_value_ok(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && v.as_bytes()[0].is_ascii_alphanumeric()
            && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric())
}

fn labels(e: &mut Errs, path: &str, m: &Option<BTreeMap<String, String>>) {
    for (k, v) in m.iter().flatten() {
        if !label_key_ok(k) {
            e.add(format!("{path}[{k}]"), format!("invalid label key {k:?}"));
        }
        if !label_value_ok(v) {
            e.add(format!("{path}[{k}]"), format!("invalid label value {v:?}"));
        }
    }
}

pub fn selector(e: &mut Vec<FieldError>, path: &str, s: &LabelSelector) {
    let mut errs = Errs(std::mem::take(e));
    labels(&mut errs, &format!("{path}.matchLabels"), &s.match_labels);
    for (i, r) in s.match_expressions.iter().flatten().enumerate() {
        let p = format!("{path}.matchExpressions[{i}]");
        if !label_key_ok(&r.key) {
            errs.add(format!("{p}.key"), format!("invalid label key {:?}", r.key));
        }
        let n = r.values.as_ref().map(|v| v.len()).unwrap_or(0);
        match r.operator.as_str() {
            "In" | "NotIn" if n == 0 => {
                errs.add(format!("{p}.values"), "must be non-empty for In and NotIn")
            }
            "Exists" | "DoesNotExist" if n > 0 => errs.add(
                format!("{p}.values"),
                "must be empty for Exists and DoesNotExist",
            ),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            o => errs.add(
                format!("{p}.operator"),
                format!("{o:?} is not a valid selector operator"),
            ),
        }
        for v in r.values.iter().flatten() {
            if !label_value_ok(v) {
                errs.add(format!("{p}.values"), format!("invalid label value {v:?}"));
            }
        }
    }
    *e = errs.0;
}

fn protocol(e: &mut Errs, path: &str, p: &Option<String>) {
    if let Some(p) = p {
        if !matches!(p.as_str(), "TCP" | "UDP" | "SCTP") {
            e.add(path, format!("unsupported protocol {p:?} (TCP, UDP, SCTP)"));
        }
    }
}

fn port_num(e: &mut Errs, path: &str, p: i32) {
    if !(1..=65535).contains(&p) {
        e.add(path, format!("{p} must be between 1 and 65535"));
    }
}

fn int_or_name(e: &mut Errs, path: &str, p: &IntOrString) {
    match p {
        IntOrString::Int(n) => port_num(e, path, *n),
        IntOrString::String(s) => {
            if let Ok(n) = s.parse::<i32>() {
                port_num(e, path, n)
            } else if !is_port_name(s) {
                e.add(
                    path,
                    format!("{s:?} is neither a port number nor a valid port name"),
                );
            }
        }
    }
}

fn ip(e: &mut Errs, path: &str, s: &str) -> Option<IpAddr> {
    match s.parse::<IpAddr>() {
        Ok(ip) => Some(ip),
        Err(_) => {
            e.add(path, format!("{s:?} is not a valid IP address"));
            None
        }
    }
}

fn cidr(e: &mut Errs, path: &str, s: &str) -> Option<IpNet> {
    match s.parse::<IpNet>() {
        Ok(n) => Some(n),
        Err(_) => {
            e.add(path, format!("{s:?} is not a valid CIDR"));
            None
        }
    }
}

/// Validates one object; an empty list means it is acceptable.
pub fn validate(o: &Object, ctx: &Context) -> Vec<FieldError> {
    let mut e = Errs::default();
    let name = o.name();
    let name_ok = match o {
        Object::Service(_) => is_dns1035_label(name),
        Object::Namespace(_) => is_dns1123_label(name),
        _ => is_dns1123_subdomain(name),
    };
    if name.is_empty() {
        e.add("metadata.name", "required");
    } else if !name_ok {
        e.add("metadata.name", format!("{name:?} is not a valid name"));
    }
    if let Some(ns) = o.namespace() {
        if !is_dns1123_label(ns) {
            e.add(
                "metadata.namespace",
                format!("{ns:?} is not a valid namespace name"),
            );
        }
    }
    labels(&mut e, "metadata.labels", &o.meta().labels);
    match o {
        Object::Service(s) => service(&mut e, s, ctx),
        Object::Pod(p) => pod(&mut e, p),
        Object::Node(n) => node(&mut e, n),
        Object::EndpointSlice(s) => endpoint_slice(&mut e, s),
        Object::NetworkPolicy(p) => network_policy(&mut e, p),
        Object::NetworkConfig(c) => {
            if let Err((f, m)) = c.resolve() {
                e.add(f, m);
            }
        }
        Object::IPAddressPool(p) => e.0.extend(p.validate()),
        Object::BGPConfiguration(c) => e.0.extend(c.validate()),
        Object::BGPPeer(p) => e.0.extend(p.validate()),
        Object::GatewayClass(c) => e.0.extend(gateway::gateway_class(c)),
        Object::Gateway(g) => e.0.extend(gateway::gateway(g)),
        Object::HTTPRoute(r) => e.0.extend(gateway::http_route(r)),
        Object::ReferenceGrant(g) => e.0.extend(gateway::reference_grant(g)),
        Object::Ingress(i) => e.0.extend(crate::ingress::validate(i)),
        Object::Secret(s) => secret(&mut e, s),
        Object::NetworkAttachmentDefinition(n) => {
            if let Err(m) = n.cni_config() {
                e.add("spec.config", m);
            }
        }
        Object::Namespace(_) | Object::IngressClass(_) => {}
    }
    e.0
}

/// A `kubernetes.io/tls` Secret carries both halves of its pair.
fn secret(e: &mut Errs, s: &k8s_openapi::api::core::v1::Secret) {
    if s.type_.as_deref() == Some("kubernetes.io/tls") {
        let data = s.data.as_ref();
        let string_data = s.string_data.as_ref();
        for key in ["tls.crt", "tls.key"] {
            let has = data.is_some_and(|d| d.contains_key(key))
                || string_data.is_some_and(|d| d.contains_key(key));
            if !has {
                e.add(
                    format!("data[{key}]"),
                    "required for type kubernetes.io/tls",
                );
            }
        }
    }
}

fn service(e: &mut Errs, s: &Service, ctx: &Context) {
    let Some(spec) = &s.spec else {
        e.add("spec", "required");
        return;
    };
    let ty = spec.type_.as_deref().unwrap_or("ClusterIP");
    if !matches!(
        ty,
        "ClusterIP" | "NodePort" | "LoadBalancer" | "ExternalName"
    ) {
        e.add("spec.type", format!("unsupported type {ty:?}"));
        return;
    }
    service_kind(e, spec, ty);
    service_cluster_ips(e, spec, ty, ctx);
    service_ports(e, spec, ty, ctx);
    labels(e, "spec.selector", &spec.selector);
    for (i, x) in spec.external_ips.iter().flatten().enumerate() {
        ip(e, &format!("spec.externalIPs[{i}]"), x);
    }
    for (i, x) in spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .enumerate()
    {
        cidr(e, &format!("spec.loadBalancerSourceRanges[{i}]"), x);
    }
    session_affinity(e, spec);
    traffic_policies(e, spec, ty);
    if let Some(st) = &s.status {
        for (i, ing) in st
            .load_balancer
            .iter()
            .flat_map(|l| l.ingress.iter().flatten())
            .enumerate()
        {
            if let Some(x) = &ing.ip {
                ip(e, &format!("status.loadBalancer.ingress[{i}].ip"), x);
            }
        }
    }
}

/// What the type asks for: an ExternalName Service a DNS name and no
/// ClusterIP; any other, ports unless it is headless.
fn service_kind(e: &mut Errs, spec: &ServiceSpec, ty: &str) {
    let cip = spec.cluster_ip.as_deref().unwrap_or("");
    if ty == "ExternalName" {
        match spec.external_name.as_deref() {
            None | Some("") => e.add("spec.externalName", "required for type ExternalName"),
            Some(n) if !is_dns1123_subdomain(n.trim_end_matches('.')) => e.add(
                "spec.externalName",
                format!("{n:?} is not a valid DNS name"),
            ),
            _ => {}
        }
        if !cip.is_empty() {
            e.add("spec.clusterIP", "must be empty for type ExternalName");
        }
    } else if spec.ports.as_ref().map(|p| p.is_empty()).unwrap_or(true) && cip != "None" {
        e.add("spec.ports", "required");
    }
}

/// `clusterIP` (headless only for types without node ports) and
/// `clusterIPs` with the families ([`ipfamily::check_fields`], on the
/// fields as a create normalizes them), each address in its family's
/// Service CIDR (a family the cluster lacks is reported when the
/// families are given out, [`ipfamily::init`]).
fn service_cluster_ips(e: &mut Errs, spec: &ServiceSpec, ty: &str, ctx: &Context) {
    let mut spec = spec.clone();
    if ty != "ExternalName" {
        ipfamily::normalize_create(&mut spec);
    }
    if spec.cluster_ip.as_deref() == Some("None") && matches!(ty, "NodePort" | "LoadBalancer") {
        e.add(
            "spec.clusterIP",
            format!("may not be None (headless) for type {ty}"),
        );
    }
    let errs = ipfamily::check_fields(&spec);
    let fields_ok = errs.is_empty();
    e.0.extend(errs);
    if !fields_ok || ty == "ExternalName" {
        return;
    }
    for (i, c) in spec.cluster_ips.iter().flatten().enumerate() {
        let Ok(a) = c.parse::<IpAddr>() else { continue };
        if let Some(cidr) = ctx.service_cidrs.for_ip(&a) {
            if !cidr.contains(&a) {
                e.add(
                    format!("spec.clusterIPs[{i}]"),
                    format!("{a} is not in the service CIDR {cidr}"),
                );
            }
        }
    }
}

/// Each port: number, protocol, a unique name (required when there are
/// several), unique port and protocol, target port and node port.
fn service_ports(e: &mut Errs, spec: &ServiceSpec, ty: &str, ctx: &Context) {
    let ports = spec.ports.as_deref().unwrap_or_default();
    let mut names = HashSet::new();
    let mut seen = HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        let path = format!("spec.ports[{i}]");
        port_num(e, &format!("{path}.port"), p.port);
        protocol(e, &format!("{path}.protocol"), &p.protocol);
        match &p.name {
            Some(n) if !n.is_empty() => {
                if !is_dns1123_label(n) {
                    e.add(
                        format!("{path}.name"),
                        format!("{n:?} is not a valid port name"),
                    );
                }
                if !names.insert(n.clone()) {
                    e.add(format!("{path}.name"), format!("duplicate port name {n:?}"));
                }
            }
            _ if ports.len() > 1 => e.add(
                format!("{path}.name"),
                "required when there is more than one port",
            ),
            _ => {}
        }
        let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        if !seen.insert((p.port, proto.clone())) {
            e.add(
                format!("{path}.port"),
                format!("duplicate port {}/{proto}", p.port),
            );
        }
        if let Some(t) = &p.target_port {
            int_or_name(e, &format!("{path}.targetPort"), t);
        }
        if let Some(np) = p.node_port {
            node_port(e, &path, np, ty, ctx);
        }
    }
}

/// A port's `nodePort`: only for types with node ports, in the range.
fn node_port(e: &mut Errs, path: &str, np: i32, ty: &str, ctx: &Context) {
    if !matches!(ty, "NodePort" | "LoadBalancer") {
        e.add(
            format!("{path}.nodePort"),
            format!("may not be set for type {ty}"),
        );
    } else if np < ctx.node_port_range.0 as i32 || np > ctx.node_port_range.1 as i32 {
        e.add(
            format!("{path}.nodePort"),
            format!(
                "{np} is outside the node port range {}-{}",
                ctx.node_port_range.0, ctx.node_port_range.1
            ),
        );
    }
}

/// `sessionAffinity` and, for ClientIP, its timeout.
fn session_affinity(e: &mut Errs, spec: &ServiceSpec) {
    match spec.session_affinity.as_deref() {
        None | Some("None") => {}
        Some("ClientIP") => {
            let t = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            if let Some(t) = t {
                if !(1..=86400).contains(&t) {
                    e.add(
                        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                        format!("{t} must be between 1 and 86400"),
                    );
                }
            }
        }
        Some(o) => e.add(
            "spec.sessionAffinity",
            format!("unsupported value {o:?} (None, ClientIP)"),
        ),
    }
}

/// `externalTrafficPolicy` (Local only where traffic comes from outside)
/// and `internalTrafficPolicy`.
fn traffic_policies(e: &mut Errs, spec: &ServiceSpec, ty: &str) {
    if let Some(p) = spec.external_traffic_policy.as_deref() {
        if !matches!(p, "Cluster" | "Local") {
            e.add(
                "spec.externalTrafficPolicy",
                format!("unsupported value {p:?}"),
            );
        } else if p == "Local"
            && !matches!(ty, "NodePort" | "LoadBalancer")
            && spec.external_ips.is_none()
        {
            e.add(
                "spec.externalTrafficPolicy",
                format!("may only be Local for NodePort or LoadBalancer, not {ty}"),
            );
        }
    }
    if let Some(p) = spec.internal_traffic_policy.as_deref() {
        if !matches!(p, "Cluster" | "Local") {
            e.add(
                "spec.internalTrafficPolicy",
                format!("unsupported value {p:?}"),
            );
        }
    }
}

fn pod(e: &mut Errs, p: &Pod) {
    if let Some(spec) = &p.spec {
        for (ci, c) in spec.containers.iter().enumerate() {
            for (i, port) in c.ports.iter().flatten().enumerate() {
                let path = format!("spec.containers[{ci}].ports[{i}]");
                port_num(e, &format!("{path}.containerPort"), port.container_port);
                protocol(e, &format!("{path}.protocol"), &port.protocol);
                if let Some(h) = port.host_port {
                    port_num(e, &format!("{path}.hostPort"), h);
                }
                if let Some(n) = &port.name {
                    if !is_port_name(n) {
                        e.add(
                            format!("{path}.name"),
                            format!("{n:?} is not a valid port name"),
                        );
                    }
                }
            }
        }
    }
    if let Some(st) = &p.status {
        if let Some(x) = &st.pod_ip {
            ip(e, "status.podIP", x);
        }
        for (i, x) in st.pod_ips.iter().flatten().enumerate() {
            ip(e, &format!("status.podIPs[{i}].ip"), &x.ip);
        }
    }
}

fn node(e: &mut Errs, n: &Node) {
    if let Some(spec) = &n.spec {
        if let Some(c) = &spec.pod_cidr {
            cidr(e, "spec.podCIDR", c);
        }
        for (i, c) in spec.pod_cidrs.iter().flatten().enumerate() {
            cidr(e, &format!("spec.podCIDRs[{i}]"), c);
        }
    }
    for (i, a) in n
        .status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten())
        .enumerate()
    {
        if matches!(a.type_.as_str(), "InternalIP" | "ExternalIP") {
            ip(e, &format!("status.addresses[{i}].address"), &a.address);
        }
    }
}

fn endpoint_slice(e: &mut Errs, s: &EndpointSlice) {
    let at = s.address_type.as_str();
    if !matches!(at, "IPv4" | "IPv6" | "FQDN") {
        e.add(
            "addressType",
            format!("unsupported value {at:?} (IPv4, IPv6, FQDN)"),
        );
    }
    for (i, ep) in s.endpoints.iter().flatten().enumerate() {
        if ep.addresses.is_empty() || ep.addresses.len() > 100 {
            e.add(
                format!("endpoints[{i}].addresses"),
                "must have between 1 and 100 addresses",
            );
        }
        for (j, a) in ep.addresses.iter().enumerate() {
            let path = format!("endpoints[{i}].addresses[{j}]");
            match (at, a.parse::<IpAddr>()) {
                ("IPv4", Ok(IpAddr::V4(_))) | ("IPv6", Ok(IpAddr::V6(_))) => {}
                ("FQDN", _) if is_dns1123_subdomain(a) => {}
                _ => e.add(path, format!("{a:?} is not a valid {at} address")),
            }
        }
        if let Some(h) = &ep.hostname {
            if !is_dns1123_label(h) {
                e.add(
                    format!("endpoints[{i}].hostname"),
                    format!("{h:?} is not a valid DNS label"),
                );
            }
        }
    }
    for (i, p) in s.ports.iter().flatten().enumerate() {
        if let Some(n) = p.port {
            port_num(e, &format!("ports[{i}].port"), n);
        }
        protocol(e, &format!("ports[{i}].protocol"), &p.protocol);
    }
}

fn policy_port(e: &mut Errs, path: &str, p: &NetworkPolicyPort) {
    protocol(e, &format!("{path}.protocol"), &p.protocol);
    if let Some(port) = &p.port {
        int_or_name(e, &format!("{path}.port"), port);
    }
    if let Some(end) = p.end_port {
        match &p.port {
            Some(IntOrString::Int(start)) if end >= *start => {
                port_num(e, &format!("{path}.endPort"), end)
            }
            Some(IntOrString::Int(start)) => e.add(
                format!("{path}.endPort"),
                format!("{end} is before port {start}"),
            ),
            _ => e.add(format!("{path}.endPort"), "requires a numeric port"),
        }
    }
}

fn policy_peer(e: &mut Errs, path: &str, p: &NetworkPolicyPeer) {
    let mut inner = std::mem::take(&mut e.0);
    if let Some(s) = &p.pod_selector {
        selector(&mut inner, &format!("{path}.podSelector"), s);
    }
    if let Some(s) = &p.namespace_selector {
        selector(&mut inner, &format!("{path}.namespaceSelector"), s);
    }
    e.0 = inner;
    if let Some(b) = &p.ip_block {
        if p.pod_selector.is_some() || p.namespace_selector.is_some() {
            e.add(
                path,
                "ipBlock may not be combined with podSelector or namespaceSelector",
            );
        }
        if let Some(net) = cidr(e, &format!("{path}.ipBlock.cidr"), &b.cidr) {
            for (i, x) in b.except.iter().flatten().enumerate() {
                let xp = format!("{path}.ipBlock.except[{i}]");
                if let Some(xn) = cidr(e, &xp, x) {
                    if !net.contains(&xn) || xn.prefix_len() <= net.prefix_len() {
                        e.add(xp, format!("{x} must be strictly within {}", b.cidr));
                    }
                }
            }
        }
    } else if p.pod_selector.is_none() && p.namespace_selector.is_none() {
        e.add(
            path,
            "must specify podSelector, namespaceSelector or ipBlock",
        );
    }
}

fn network_policy(e: &mut Errs, p: &NetworkPolicy) {
    let Some(spec) = &p.spec else {
        e.add("spec", "required");
        return;
    };
    let mut inner = std::mem::take(&mut e.0);
    selector(
        &mut inner,
        "spec.podSelector",
        spec.pod_selector
            .as_ref()
            .unwrap_or(&LabelSelector::default()),
    );
    e.0 = inner;
    for (i, t) in spec.policy_types.iter().flatten().enumerate() {
        if !matches!(t.as_str(), "Ingress" | "Egress") {
            e.add(
                format!("spec.policyTypes[{i}]"),
                format!("unsupported value {t:?} (Ingress, Egress)"),
            );
        }
    }
    for (i, r) in spec.ingress.iter().flatten().enumerate() {
        for (j, peer) in r.from.iter().flatten().enumerate() {
            policy_peer(e, &format!("spec.ingress[{i}].from[{j}]"), peer);
        }
        for (j, port) in r.ports.iter().flatten().enumerate() {
            policy_port(e, &format!("spec.ingress[{i}].ports[{j}]"), port);
        }
    }
    for (i, r) in spec.egress.iter().flatten().enumerate() {
        for (j, peer) in r.to.iter().flatten().enumerate() {
            policy_peer(e, &format!("spec.egress[{i}].to[{j}]"), peer);
        }
        for (j, port) in r.ports.iter().flatten().enumerate() {
            policy_port(e, &format!("spec.egress[{i}].ports[{j}]"), port);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(v: serde_json::Value) -> Vec<String> {
        let o = Object::from_value(v).unwrap();
        validate(&o, &Context::default())
            .into_iter()
            .map(|e| format!("{}: {}", e.field, e.msg))
            .collect()
    }

    fn svc(spec: serde_json::Value) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": spec})
    }

    #[test]
    fn good_services_pass() {
        assert!(check(svc(
            json!({"ports": [{"port": 80, "targetPort": "http"}], "selector": {"app": "web"}})
        ))
        .is_empty());
        assert!(check(svc(
            json!({"clusterIP": "None", "selector": {"app": "web"}})
        ))
        .is_empty());
        assert!(check(svc(
            json!({"type": "ExternalName", "externalName": "example.com"})
        ))
        .is_empty());
        assert!(check(svc(
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]})
        ))
        .is_empty());
    }

    #[test]
    fn service_rules() {
        let e = check(svc(
            json!({"type": "ExternalName", "externalName": "x.com", "clusterIP": "10.96.0.5"}),
        ));
        assert_eq!(
            e,
            vec!["spec.clusterIP: must be empty for type ExternalName"]
        );
        let e = check(svc(
            json!({"type": "NodePort", "clusterIP": "None", "ports": [{"port": 80}]}),
        ));
        assert!(e[0].contains("headless"), "{e:?}");
        let e = check(svc(
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 80}]}),
        ));
        assert!(
            e[0].starts_with("spec.ports[0].nodePort: 80 is outside"),
            "{e:?}"
        );
        let e = check(svc(json!({"ports": [{"port": 80, "nodePort": 30001}]})));
        assert!(e[0].contains("may not be set for type ClusterIP"), "{e:?}");
        let e = check(svc(json!({"ports": [{"port": 70000, "protocol": "ICMP"}]})));
        assert_eq!(e.len(), 2, "{e:?}");
        let e = check(svc(
            json!({"clusterIP": "10.1.2.3", "ports": [{"port": 80}]}),
        ));
        assert!(e[0].contains("not in the service CIDR"), "{e:?}");
        let e = check(svc(json!({"clusterIP": "banana", "ports": [{"port": 80}]})));
        assert!(e[0].contains("not a valid IP"), "{e:?}");
        let e = check(svc(json!({"ports": [{"port": 80}, {"port": 81}]})));
        assert!(
            e[0].contains("required when there is more than one port"),
            "{e:?}"
        );
    }

    #[test]
    fn selectors_and_policies() {
        let e = check(
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "p", "namespace": "x"},
            "spec": {"podSelector": {"matchExpressions": [{"key": "app", "operator": "Equals", "values": ["a"]}]},
                     "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/16"]}}],
                                  "ports": [{"port": 100, "endPort": 50}]}]}}),
        );
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(e[0].starts_with("spec.podSelector.matchExpressions[0].operator"));
        let ok = check(
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "p"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}),
        );
        assert!(ok.is_empty(), "{ok:?}");
    }

    #[test]
    fn names_labels_and_cidrs() {
        let e = check(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "Node_1", "labels": {"a b": "c"}},
            "spec": {"podCIDR": "10.244.1.0/40"}}),
        );
        assert_eq!(e.len(), 3, "{e:?}");
        let e = check(
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "s"},
            "addressType": "IPv4", "endpoints": [{"addresses": ["fd00::1"]}]}),
        );
        assert!(e[0].contains("not a valid IPv4"), "{e:?}");
    }
}
