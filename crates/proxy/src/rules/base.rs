//! The fixed part of a family's table, which every Service shares: the
//! empty dispatch maps and sets ([`shell`]), and around them the hooks,
//! the dispatch chain, masquerade, and the filter checks for Services
//! without endpoints and for Service addresses nothing served
//! ([`base_table`]). No element of a Service is here: a Service change
//! never touches these chains.

use podnet_nft::model::{
    Chain, ChainType, Expr, Field, Hook, KeyType, Rule, Set, Table, Value, Verdict,
};

use super::blocks::{chain, jump};
use super::{fast, NodeInfo, Stack, MASQ_MARK, TABLE};

/// The parts of the table every Service shares: base chains, the dispatch
/// maps (empty) and this node's NodePort addresses.
pub fn base_table(stack: &Stack, node: &NodeInfo) -> Table {
    let mut t = shell(stack);
    add_nodeport_ips(&mut t, stack, node);
    fast::add_dispatch(&mut t, stack);
    add_services_chain(&mut t, stack, node);
    add_nat_hooks(&mut t, stack);
    add_endpoint_checks(&mut t, stack, node);
    add_cluster_ips_check(&mut t, stack);
    add_filter_hooks(&mut t);
    t
}

/// The empty shared maps a Service fragment writes its elements into.
pub fn shell(stack: &Stack) -> Table {
    let mut t = Table::new(stack.family, TABLE);
    let three = vec![stack.addr_key(), KeyType::InetProto, KeyType::InetService];
    let two = vec![KeyType::InetProto, KeyType::InetService];
    t.sets.insert("service-ips".into(), Set::map(three.clone()));
    t.sets
        .insert("service-nodeports".into(), Set::map(two.clone()));
    t.sets
        .insert("no-endpoint-services".into(), Set::map(three.clone()));
    t.sets.insert("no-endpoint-nodeports".into(), Set::map(two));
    // Every ClusterIP, for the check of what the Service rules left.
    t.sets
        .insert("cluster-ips".into(), Set::new(vec![stack.addr_key()]));
    // The fast path: every fast port's address, its endpoints by index,
    // and the (endpoint, endpoint, Service address, port) quadruples that
    // mark a pod reaching itself through the Service. (The per-count sets
    // `fast-<n>` are declared by the base table; a fragment carries the one
    // it uses.)
    t.sets
        .insert("fast-services".into(), Set::new(three.clone()));
    let mut indexed = three;
    indexed.push(KeyType::Mark);
    t.sets.insert(
        "fast-endpoints".into(),
        Set::data_map(indexed, vec![stack.addr_key(), KeyType::InetService]),
    );
    t.sets.insert(
        "fast-hairpin".into(),
        Set::new(vec![
            stack.addr_key(),
            stack.addr_key(),
            stack.addr_key(),
            KeyType::InetService,
        ]),
    );
    t
}

/// The `nodeport-ips` set, when NodePorts are accepted on listed addresses
/// only (never loopback).
fn add_nodeport_ips(t: &mut Table, stack: &Stack, node: &NodeInfo) {
    if let Some(ips) = &node.nodeport_ips {
        let mut set = Set::new(vec![stack.addr_key()]);
        for ip in ips.iter().filter(|ip| stack.holds(ip) && !ip.is_loopback()) {
            set.elements.insert(vec![Value::Addr(*ip)], None);
        }
        t.sets.insert("nodeport-ips".into(), set);
    }
}

/// The condition "addressed to a NodePort address of this node": the
/// `nodeport-ips` set, or any local address but loopback.
fn nodeport_daddr(stack: &Stack, node: &NodeInfo) -> Vec<Expr> {
    match node.nodeport_ips {
        Some(_) => vec![Expr::InSet {
            keys: vec![stack.daddr()],
            set: "nodeport-ips".into(),
            neg: false,
        }],
        None => vec![
            Expr::FibDaddrLocal,
            Expr::Cmp {
                field: stack.daddr(),
                neg: true,
                value: Value::Net(stack.loopback()),
            },
        ],
    }
}

/// A lookup in the NodePort map `map`, for a port its same-named set
/// lists and addressed to a NodePort address of this node.
fn nodeport_lookup(stack: &Stack, node: &NodeInfo, map: &str) -> Rule {
    Rule::new(
        [Expr::InSet {
            keys: vec![Field::L4Proto, Field::Dport],
            set: map.into(),
            neg: false,
        }]
        .into_iter()
        .chain(nodeport_daddr(stack, node))
        .chain([Expr::VMap {
            keys: vec![Field::L4Proto, Field::Dport],
            map: map.into(),
        }])
        .collect(),
    )
}

/// The `services` chain: the fast path, then the address map, then
/// NodePorts.
fn add_services_chain(t: &mut Table, stack: &Stack, node: &NodeInfo) {
    let dispatch = vec![
        Rule::new(vec![
            Expr::InSet {
                keys: vec![stack.daddr(), Field::L4Proto, Field::Dport],
                set: "fast-services".into(),
                neg: false,
            },
            jump("fast-dispatch"),
        ]),
        Rule::new(vec![Expr::VMap {
            keys: vec![stack.daddr(), Field::L4Proto, Field::Dport],
            map: "service-ips".into(),
        }]),
        // The address check only for ports that are NodePorts: every other
        // new connection through the node skips it.
        nodeport_lookup(stack, node, "service-nodeports"),
    ];
    t.chains.insert("services".into(), chain(dispatch));
}

/// The nat hooks: prerouting and output dispatch to `services`;
/// postrouting masquerades hairpin fast-path traffic and what was marked.
fn add_nat_hooks(t: &mut Table, stack: &Stack) {
    let mut nat_pre = Chain::base(ChainType::Nat, Hook::Prerouting, -100);
    nat_pre.rules.push(Rule::new(vec![jump("services")]));
    t.chains.insert("nat-prerouting".into(), nat_pre);
    let mut nat_out = Chain::base(ChainType::Nat, Hook::Output, -100);
    nat_out.rules.push(Rule::new(vec![jump("services")]));
    t.chains.insert("nat-output".into(), nat_out);
    let mut nat_post = Chain::base(ChainType::Nat, Hook::Postrouting, 100);
    // Hairpin on the fast path: the endpoint is the client.
    nat_post.rules.push(Rule::new(vec![
        Expr::CtDnat,
        Expr::InSet {
            keys: vec![
                stack.saddr(),
                stack.daddr(),
                stack.ct_orig_daddr(),
                Field::CtOrigDport,
            ],
            set: "fast-hairpin".into(),
            neg: false,
        },
        Expr::Masquerade { fully_random: true },
    ]));
    nat_post.rules.push(Rule::new(vec![
        Expr::MarkSet { mask: MASQ_MARK },
        Expr::Masquerade { fully_random: true },
    ]));
    t.chains.insert("nat-postrouting".into(), nat_post);
    t.chains.insert(
        "mark-for-masquerade".into(),
        chain(vec![Rule::new(vec![Expr::SetMark { bits: MASQ_MARK }])]),
    );
}

/// Services without endpoints are rejected (or, with a Local policy and
/// none here, dropped) in the filter hooks: ClusterIPs and external
/// addresses in input, forward and output; NodePorts in input only, as
/// upstream does. The node's own traffic to one of its NodePorts is
/// DNATed in nat output (a Local policy short-circuits it to every
/// endpoint); only what nothing DNATed is delivered locally, where
/// input judges it.
fn add_endpoint_checks(t: &mut Table, stack: &Stack, node: &NodeInfo) {
    t.chains.insert(
        "service-endpoints-check".into(),
        chain(vec![Rule::new(vec![Expr::VMap {
            keys: vec![stack.daddr(), Field::L4Proto, Field::Dport],
            map: "no-endpoint-services".into(),
        }])]),
    );
    t.chains.insert(
        "nodeport-endpoints-check".into(),
        chain(vec![nodeport_lookup(stack, node, "no-endpoint-nodeports")]),
    );
    t.chains.insert(
        "reject-chain".into(),
        chain(vec![Rule::new(vec![Expr::Reject { tcp_reset: false }])]),
    );
}

/// Traffic to the Service CIDR that no Service took: a ClusterIP on a
/// port or protocol it does not serve is rejected, an address no Service
/// holds is dropped; neither may follow the default route off the node.
/// Judged after DNAT, so only what the Service rules left is seen.
fn add_cluster_ips_check(t: &mut Table, stack: &Stack) {
    let mut ips_check = vec![Rule::new(vec![
        Expr::InSet {
            keys: vec![stack.daddr()],
            set: "cluster-ips".into(),
            neg: false,
        },
        Expr::Reject { tcp_reset: false },
    ])];
    if let Some(cidr) = stack.service_cidr {
        ips_check.push(Rule::new(vec![
            Expr::Cmp {
                field: stack.daddr(),
                neg: false,
                value: Value::Net(cidr),
            },
            Expr::Verdict(Verdict::Drop),
        ]));
    }
    t.chains
        .insert("cluster-ips-check".into(), chain(ips_check));
}

/// The filter hooks that run the checks, on a connection's first packet
/// only (later packets skip the lookups).
fn add_filter_hooks(t: &mut Table) {
    let jump_new = |c: &str| Rule::new(vec![Expr::CtStateNew, jump(c)]);
    // Incoming and forwarded packets were DNATed in prerouting already.
    // Only a connection's first packet can be for a Service without
    // endpoints; later packets skip the lookups.
    for (name, hook) in [
        ("filter-input", Hook::Input),
        ("filter-forward", Hook::Forward),
    ] {
        let mut c = Chain::base(ChainType::Filter, hook, -110);
        if hook == Hook::Input {
            c.rules.push(jump_new("nodeport-endpoints-check"));
        }
        c.rules.push(jump_new("service-endpoints-check"));
        if hook == Hook::Forward {
            c.rules.push(jump_new("cluster-ips-check"));
        }
        t.chains.insert(name.into(), c);
    }
    // The node's own traffic is DNATed in nat output (-100): it is checked
    // after that, as upstream does, so what nat output short-circuited (an
    // external address or NodePort of a Local Service with no endpoint
    // here, reached from the node) is not dropped as "no local endpoints".
    let mut post_dnat = Chain::base(ChainType::Filter, Hook::Output, -90);
    post_dnat.rules.push(jump_new("service-endpoints-check"));
    post_dnat.rules.push(jump_new("cluster-ips-check"));
    t.chains.insert("filter-output-post-dnat".into(), post_dnat);
}
