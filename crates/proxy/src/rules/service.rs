//! One Service's contribution to the table: what the planner reads of it
//! ([`ServiceView`]), which path each of its ports takes (the fast path,
//! or chains), and the chain path's ClusterIP dispatch. Endpoint chains
//! and the external path are their own modules; this one ties them
//! together per port.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use podnet_api::k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_nft::model::{Proto, Rule, Table, Value};

use super::blocks::{chain, hash8, insert_elem, insert_goto, mark_external, no_endpoints, svc_key};
use super::endpoint_chains::{add_endpoint_chains, pick_rules};
use super::endpoints::{endpoints, Ep, Usable};
use super::fast::{add_fast, FAST_MAX};
use super::{external, programmed_ip, NodeInfo, Stack, DEFAULT_AFFINITY_TIMEOUT};

/// What the planner reads of a Service's spec and status, in one family,
/// once for all its ports.
pub(super) struct ServiceView<'a> {
    svc: &'a Service,
    spec: &'a ServiceSpec,
    /// The ClusterIP of this family.
    pub(super) cip: IpAddr,
    /// `sessionAffinity: ClientIP`.
    pub(super) affinity: bool,
    /// Its timeout, in seconds.
    pub(super) timeout: u32,
    /// `internalTrafficPolicy: Local`.
    pub(super) int_local: bool,
    /// `externalTrafficPolicy: Local`, for a Service reachable from
    /// outside.
    pub(super) ext_local: bool,
    /// Whether the Service's type opens NodePorts.
    node_ports_on: bool,
    /// The LoadBalancer ingress IPs of this family.
    pub(super) lb_ips: Vec<IpAddr>,
    /// Every external address: the externalIPs, then the LB IPs.
    pub(super) external_ips: Vec<IpAddr>,
    /// loadBalancerSourceRanges of this family.
    pub(super) ranges: Vec<IpNet>,
}

impl<'a> ServiceView<'a> {
    /// None when this family's table holds nothing of the Service.
    fn new(svc: &'a Service, stack: &Stack) -> Option<ServiceView<'a>> {
        let (Some(spec), Some(cip)) = (&svc.spec, programmed_ip(svc, stack)) else {
            return None;
        };
        let ty = spec.type_.as_deref().unwrap_or("ClusterIP");
        let lb_ips = lb_ips(svc, stack);
        let external_ips: Vec<IpAddr> = spec
            .external_ips
            .iter()
            .flatten()
            .filter_map(|a| a.parse().ok())
            .filter(|ip| stack.holds(ip))
            .chain(lb_ips.iter().copied())
            .collect();
        let node_ports_on = matches!(ty, "NodePort" | "LoadBalancer");
        // The external policy applies only to a Service reachable from outside.
        let ext_local = spec.external_traffic_policy.as_deref() == Some("Local")
            && (node_ports_on || !external_ips.is_empty());
        let ranges: Vec<IpNet> = spec
            .load_balancer_source_ranges
            .iter()
            .flatten()
            .filter_map(|r| r.trim().parse::<IpNet>().ok())
            .filter(|n| stack.holds(&n.addr()))
            .collect();
        Some(ServiceView {
            svc,
            spec,
            cip,
            affinity: spec.session_affinity.as_deref() == Some("ClientIP"),
            timeout: affinity_timeout(spec),
            int_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
            ext_local,
            node_ports_on,
            lb_ips,
            external_ips,
            ranges,
        })
    }

    /// The hash naming a chain-path port's chains: stable across syncs,
    /// distinct per Service, port name and protocol.
    fn port_id(&self, port: &ServicePort, proto: Proto) -> String {
        let ns = self.svc.metadata.namespace.as_deref().unwrap_or("default");
        let name = self.svc.metadata.name.as_deref().unwrap_or_default();
        hash8(&format!(
            "{ns}/{name}/{}/{}",
            port.name.as_deref().unwrap_or(""),
            proto.name()
        ))
    }
}

/// The LoadBalancer ingress IPs of this family.
fn lb_ips(svc: &Service, stack: &Stack) -> Vec<IpAddr> {
    svc.status
        .iter()
        .flat_map(|s| s.load_balancer.iter())
        .flat_map(|l| l.ingress.iter().flatten())
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .filter(|ip| stack.holds(ip))
        .collect()
}

fn affinity_timeout(spec: &ServiceSpec) -> u32 {
    spec.session_affinity_config
        .as_ref()
        .and_then(|c| c.client_ip.as_ref())
        .and_then(|c| c.timeout_seconds)
        .map(|t| t as u32)
        .unwrap_or(DEFAULT_AFFINITY_TIMEOUT)
}

fn proto_of(p: &Option<String>) -> Option<Proto> {
    match p.as_deref().unwrap_or("TCP") {
        "TCP" => Some(Proto::Tcp),
        "UDP" => Some(Proto::Udp),
        "SCTP" => Some(Proto::Sctp),
        _ => None,
    }
}

/// The endpoints a policy uses: this node's for Local, else the Cluster
/// ones.
fn policy_eps(usable: &Usable, local: bool) -> Vec<&Ep> {
    if local {
        usable.local.iter().collect()
    } else {
        usable.cluster.iter().collect()
    }
}

/// One Service port on the chain path: its names, its endpoints and the
/// chains that DNAT to them, which the ClusterIP and external paths pick
/// from.
pub(super) struct ChainPort<'a> {
    pub(super) v: &'a ServiceView<'a>,
    pub(super) stack: &'a Stack,
    pub(super) proto: Proto,
    pub(super) port: u16,
    /// The NodePort, when the Service's type opens one.
    pub(super) node_port: Option<u16>,
    /// Names the port's chains (`svc-<id>`, `ext-<id>`, `fw-<id>`, ...).
    pub(super) id: String,
    pub(super) usable: &'a Usable,
    /// The endpoints for the internal policy.
    pub(super) int_eps: Vec<&'a Ep>,
    /// The endpoints for the external policy.
    pub(super) ext_eps: Vec<&'a Ep>,
    /// Each reachable endpoint's DNAT chain.
    ep_chains: BTreeMap<&'a Ep, String>,
}

impl ChainPort<'_> {
    /// Rules that pick one of `eps` through their endpoint chains.
    pub(super) fn picks(&self, eps: &[&Ep]) -> Vec<Rule> {
        let named: Vec<&str> = eps.iter().map(|e| self.ep_chains[*e].as_str()).collect();
        pick_rules(&named, self.v.affinity, self.stack)
    }
}

/// Adds one Service's ClusterIP and ports to `t`.
pub(super) fn add_service(
    t: &mut Table,
    svc: &Service,
    slices: &[EndpointSlice],
    node: &NodeInfo,
    stack: &Stack,
) {
    let Some(v) = ServiceView::new(svc, stack) else {
        return;
    };
    insert_elem(t, "cluster-ips", vec![Value::Addr(v.cip)], None);
    for port in v.spec.ports.iter().flatten() {
        add_port(t, &v, port, slices, node, stack);
    }
}

/// Adds one Service port: on the fast path when it can, else as chains.
fn add_port(
    t: &mut Table,
    v: &ServiceView<'_>,
    port: &ServicePort,
    slices: &[EndpointSlice],
    node: &NodeInfo,
    stack: &Stack,
) {
    let Some(proto) = proto_of(&port.protocol) else {
        return;
    };
    let Ok(sport) = u16::try_from(port.port) else {
        return;
    };
    let usable = endpoints(v.svc, port, slices, node, stack);
    let int_eps = policy_eps(&usable, v.int_local);
    let node_port = port
        .node_port
        .and_then(|p| u16::try_from(p).ok())
        .filter(|_| v.node_ports_on);
    let external = node_port.is_some() || !v.external_ips.is_empty();

    // The fast path: a ClusterIP-only port without affinity is data in
    // three maps, no chains of its own.
    if !v.affinity && !external && !int_eps.is_empty() && int_eps.len() <= FAST_MAX as usize {
        add_fast(t, stack, v.cip, proto, sport, &int_eps);
        return;
    }
    let id = v.port_id(port, proto);
    let ext_eps = policy_eps(&usable, v.ext_local);
    let affinity = v.affinity.then_some(v.timeout);
    let to = reachable(&usable, &int_eps, &ext_eps, external);
    let ep_chains = add_endpoint_chains(t, stack, &id, proto, affinity, to);
    let p = ChainPort {
        v,
        stack,
        proto,
        port: sport,
        node_port,
        id,
        usable: &usable,
        int_eps,
        ext_eps,
        ep_chains,
    };
    let svc_chain = add_cluster_path(t, &p);
    if external {
        external::add_external(t, &p, &svc_chain, node);
    }
}

/// The endpoints any of the port's paths sends to, each once.
fn reachable<'a>(
    usable: &'a Usable,
    int_eps: &[&'a Ep],
    ext_eps: &[&'a Ep],
    external: bool,
) -> Vec<&'a Ep> {
    let mut reachable: Vec<&Ep> = int_eps.to_vec();
    if external && usable.any {
        // External traffic from pods and the node itself is sent to the
        // Cluster endpoints whatever the external policy.
        reachable.extend(usable.cluster.iter());
        reachable.extend(ext_eps.iter().copied());
    }
    reachable.sort();
    reachable.dedup();
    reachable
}

/// The cluster path: the ClusterIP's element in `service-ips`, to the
/// port's `svc-<id>` chain, or in the no-endpoint map. Returns the chain's
/// name.
fn add_cluster_path(t: &mut Table, p: &ChainPort<'_>) -> String {
    let svc_chain = format!("svc-{}", p.id);
    let key = svc_key(p.v.cip, p.proto, p.port);
    if p.int_eps.is_empty() {
        no_endpoints(t, "no-endpoint-services", key, p.usable.any);
    } else {
        let mut rules = vec![mark_external(p.stack)];
        rules.extend(p.picks(&p.int_eps));
        t.chains.insert(svc_chain.clone(), chain(rules));
        insert_goto(t, "service-ips", key, svc_chain.clone());
    }
    svc_chain
}
