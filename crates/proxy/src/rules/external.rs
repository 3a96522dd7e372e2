//! The external path of a chain-path Service port: NodePorts, externalIPs
//! and LoadBalancer IPs lead to its `ext-<id>` chain, which applies the
//! external traffic policy (masquerade for Cluster; for Local, this node's
//! endpoints, with pods and the node itself short-circuited to every
//! endpoint), and loadBalancerSourceRanges put a `fw-<id>` chain before
//! the LB IPs.

use ipnet::IpNet;
use podnet_nft::model::{Expr, Rule, Table, Value, Verdict};

use super::blocks::{chain, goto, insert_goto, jump, no_endpoints, nodeport_key, svc_key};
use super::endpoints::Ep;
use super::service::{ChainPort, ServiceView};
use super::NodeInfo;

/// Adds the port's external addresses and NodePort; `svc_chain` is its
/// ClusterIP chain.
pub(super) fn add_external(t: &mut Table, p: &ChainPort<'_>, svc_chain: &str, node: &NodeInfo) {
    if !p.usable.any || p.ext_eps.is_empty() {
        add_no_endpoints(t, p);
    }
    if !p.usable.any {
        return;
    }
    let ext_chain = add_ext_chain(t, p, svc_chain);
    let sources = allowed_sources(p.v, node);
    for ip in &p.v.external_ips {
        let target = if p.v.lb_ips.contains(ip) && !p.v.ranges.is_empty() {
            add_firewall(t, p, &sources, &ext_chain)
        } else {
            ext_chain.clone()
        };
        insert_goto(t, "service-ips", svc_key(*ip, p.proto, p.port), target);
    }
    if let Some(np) = p.node_port {
        insert_goto(
            t,
            "service-nodeports",
            nodeport_key(p.proto, np),
            ext_chain.clone(),
        );
    }
}

/// The port's external addresses and NodePort in the no-endpoint maps.
fn add_no_endpoints(t: &mut Table, p: &ChainPort<'_>) {
    for ip in &p.v.external_ips {
        no_endpoints(
            t,
            "no-endpoint-services",
            svc_key(*ip, p.proto, p.port),
            p.usable.any,
        );
    }
    if let Some(np) = p.node_port {
        no_endpoints(
            t,
            "no-endpoint-nodeports",
            nodeport_key(p.proto, np),
            p.usable.any,
        );
    }
}

/// The `ext-<id>` chain; returns its name.
fn add_ext_chain(t: &mut Table, p: &ChainPort<'_>, svc_chain: &str) -> String {
    let ext_chain = format!("ext-{}", p.id);
    let mut rules = if p.v.ext_local {
        short_circuit(t, p, svc_chain)
    } else {
        vec![Rule::new(vec![jump("mark-for-masquerade")])]
    };
    // With no endpoint for outside traffic here, the rest falls through
    // to the filter maps' drop.
    rules.extend(p.picks(&p.ext_eps));
    t.chains.insert(ext_chain.clone(), chain(rules));
    ext_chain
}

/// The head of a Local policy's `ext-<id>` chain. Pods and the node reach
/// an external address of a Local Service as if through an outside load
/// balancer coming back: to every endpoint, and the node's own traffic
/// masqueraded.
fn short_circuit(t: &mut Table, p: &ChainPort<'_>, svc_chain: &str) -> Vec<Rule> {
    let stack = p.stack;
    let cluster_chain = if p.v.int_local {
        let c = format!("all-{}", p.id);
        let eps: Vec<&Ep> = p.usable.cluster.iter().collect();
        t.chains.insert(c.clone(), chain(p.picks(&eps)));
        c
    } else {
        svc_chain.to_string()
    };
    let mut rules = Vec::new();
    if let Some(c) = stack.cluster_cidr {
        rules.push(Rule::new(vec![
            Expr::Cmp {
                field: stack.saddr(),
                neg: false,
                value: Value::Net(c),
            },
            goto(&cluster_chain),
        ]));
    }
    rules.push(Rule::new(vec![
        Expr::FibSaddrLocal,
        jump("mark-for-masquerade"),
    ]));
    rules.push(Rule::new(vec![Expr::FibSaddrLocal, goto(&cluster_chain)]));
    rules
}

/// loadBalancerSourceRanges: only listed sources get in; a range
/// holding this node's address also admits the LB IPs themselves
/// (the node reaching a VIP it holds locally does so from the VIP).
fn allowed_sources(v: &ServiceView<'_>, node: &NodeInfo) -> Vec<IpNet> {
    let mut sources: Vec<IpNet> = v.ranges.clone();
    if v.ranges
        .iter()
        .any(|r| node.ips.iter().any(|ip| r.contains(ip)))
    {
        sources.extend(v.lb_ips.iter().map(|ip| IpNet::from(*ip)));
    }
    sources
}

/// The `fw-<id>` chain: `sources` on to `ext_chain`, the rest dropped;
/// returns its name.
fn add_firewall(t: &mut Table, p: &ChainPort<'_>, sources: &[IpNet], ext_chain: &str) -> String {
    let fw = format!("fw-{}", p.id);
    let mut r: Vec<Rule> = sources
        .iter()
        .map(|n| {
            Rule::new(vec![
                Expr::Cmp {
                    field: p.stack.saddr(),
                    neg: false,
                    value: Value::Net(*n),
                },
                goto(ext_chain),
            ])
        })
        .collect();
    r.push(Rule::new(vec![Expr::Verdict(Verdict::Drop)]));
    t.chains.insert(fw.clone(), chain(r));
    fw
}
