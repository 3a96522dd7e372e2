//! The service proxy's pure core: Services and EndpointSlices in, the
//! nftables table `ip podnet` out (as a [`podnet_nft::model::Table`]).
//!
//! Dispatch is data, as in kube-proxy's nftables mode: one verdict map keyed
//! by `address . protocol . port` for ClusterIPs, externalIPs and
//! LoadBalancer IPs, one keyed by `protocol . port` for NodePorts, each
//! element a `goto` into the Service port's chain; a packet costs one hash
//! lookup whatever the number of Services. Endpoint choice is a short run of
//! `numgen random mod k == 0` rules (no per-Service anonymous map, which the
//! kernel is slow to load); session affinity uses one timeout set per
//! endpoint. Services without usable endpoints are in a filter map that
//! rejects, so clients fail at once instead of timing out; a Local traffic
//! policy without an endpoint on this node drops there instead. What the
//! Service rules leave of traffic to the Service CIDR (a ClusterIP's
//! unserved port, an address no Service holds) is rejected or dropped on
//! the node, never routed out (`cluster-ips-check`).
//!
//! Which endpoints a port uses follows kube-proxy's CategorizeEndpoints:
//! ready ones (narrowed by topology hints when they apply), else
//! serving-terminating ones, separately for the Cluster and Local
//! policies.
//!
//! Masquerade: traffic to a Service from outside the cluster CIDR, traffic
//! arriving through a NodePort/externalIP/LB with the Cluster policy, and
//! hairpin traffic (an endpoint reaching itself through its Service) are
//! marked and masqueraded in postrouting; pod-to-Service traffic from inside
//! the cluster keeps its source address.
//!
//! Each address family has its own table, `ip podnet` and `ip6 podnet`,
//! planned by the same code for a [`Stack`] (as kube-proxy runs one proxier
//! per family): a dual-stack Service contributes its IPv4 ClusterIP and
//! endpoints to one and its IPv6 ones to the other.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use podnet_api::k8s_openapi::api::core::v1::{Service, ServicePort};
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_nft::model::{
    BaseChain, Chain, ChainType, ElemData, Expr, Family, Field, Hook, KeyType, Proto, Rule, Set,
    Table, Value, Verdict,
};

pub const TABLE: &str = "podnet";
pub const MASQ_MARK: u32 = 0x4000;
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10800;
/// Most endpoints a Service port may have and still take the fast path.
pub const FAST_MAX: u32 = 64;

/// One address family's table and the cluster's pod network in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stack {
    /// `Family::Ip` or `Family::Ip6`.
    pub family: Family,
    /// Pod traffic (from inside this range) keeps its source address; with
    /// no pod network in this family every client is external.
    pub cluster_cidr: Option<IpNet>,
    /// The Service CIDR of this family: traffic to an address in it that no
    /// Service holds is dropped on the node instead of following the
    /// default route out (kube-proxy's "Drop traffic to unallocated
    /// ClusterIPs").
    pub service_cidr: Option<IpNet>,
}

impl Stack {
    pub fn v4(cluster_cidr: Ipv4Net) -> Stack {
        Stack {
            family: Family::Ip,
            cluster_cidr: Some(IpNet::V4(cluster_cidr)),
            service_cidr: None,
        }
    }

    pub fn v6(cluster_cidr: Option<Ipv6Net>) -> Stack {
        Stack {
            family: Family::Ip6,
            cluster_cidr: cluster_cidr.map(IpNet::V6),
            service_cidr: None,
        }
    }

    /// The same stack with its Service CIDR (ignored when it is of the
    /// other family).
    pub fn with_service_cidr(mut self, cidr: Option<IpNet>) -> Stack {
        self.service_cidr = cidr.filter(|c| self.holds(&c.addr()));
        self
    }

    fn is_v6(&self) -> bool {
        self.family == Family::Ip6
    }

    fn saddr(&self) -> Field {
        if self.is_v6() {
            Field::Ip6Saddr
        } else {
            Field::IpSaddr
        }
    }

    fn daddr(&self) -> Field {
        if self.is_v6() {
            Field::Ip6Daddr
        } else {
            Field::IpDaddr
        }
    }

    fn addr_key(&self) -> KeyType {
        if self.is_v6() {
            KeyType::Ipv6Addr
        } else {
            KeyType::Ipv4Addr
        }
    }

    /// Whether an address belongs to this family.
    pub fn holds(&self, ip: &IpAddr) -> bool {
        ip.is_ipv6() == self.is_v6()
    }

    /// The EndpointSlice `addressType` this family reads.
    fn address_type(&self) -> &'static str {
        if self.is_v6() {
            "IPv6"
        } else {
            "IPv4"
        }
    }

    fn loopback(&self) -> IpNet {
        if self.is_v6() {
            "::1/128".parse().expect("static")
        } else {
            "127.0.0.0/8".parse().expect("static")
        }
    }

    /// The key types of a Service address map: address . protocol . port.
    fn svc_key_types(&self) -> Vec<KeyType> {
        vec![self.addr_key(), KeyType::InetProto, KeyType::InetService]
    }

    fn ct_orig_daddr(&self) -> Field {
        if self.is_v6() {
            Field::CtOrigIp6Daddr
        } else {
            Field::CtOrigIpDaddr
        }
    }

    /// Short name for metrics and logs.
    pub fn label(&self) -> &'static str {
        if self.is_v6() {
            "ipv6"
        } else {
            "ipv4"
        }
    }
}

/// What the planner knows about the node it plans for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// The Node's name: endpoints with this `nodeName` are local.
    pub name: String,
    /// Its `topology.kubernetes.io/zone` label, for zone hints.
    pub zone: Option<String>,
    /// The node's own addresses: a loadBalancerSourceRanges entry that
    /// holds one of them also admits the LB IPs as sources (a node reaching
    /// a VIP it holds locally does so from the VIP).
    pub ips: Vec<IpAddr>,
    /// The addresses NodePorts are accepted on (kube-proxy's
    /// `--nodeport-addresses`); loopback never is. None: every local
    /// address but loopback.
    pub nodeport_ips: Option<Vec<IpAddr>>,
}

impl NodeInfo {
    pub fn named(name: &str) -> NodeInfo {
        NodeInfo {
            name: name.to_string(),
            ..NodeInfo::default()
        }
    }
}

impl From<&str> for NodeInfo {
    fn from(name: &str) -> NodeInfo {
        NodeInfo::named(name)
    }
}

impl From<String> for NodeInfo {
    fn from(name: String) -> NodeInfo {
        NodeInfo {
            name,
            ..NodeInfo::default()
        }
    }
}

/// Labels that take a Service away from this proxy (kube-proxy's watch
/// selector): `service.kubernetes.io/headless`, and
/// `service.kubernetes.io/service-proxy-name` naming another proxy.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
pub const PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// The `service-proxy-name` value that keeps a Service ours.
pub const PROXY_NAME: &str = "podnet";

/// Whether the Service's labels hand it to no proxy or to another one.
pub fn opted_out(svc: &Service) -> bool {
    labels_opt_out(svc.metadata.labels.as_ref())
}

/// The same for an EndpointSlice: kube-proxy's watch selector applies to
/// both kinds, so a slice labelled headless (or for another proxy) gives
/// its Service no endpoints, whatever the Service says (upstream's e2e
/// "Services should implement service.kubernetes.io/headless").
pub fn slice_opted_out(s: &EndpointSlice) -> bool {
    labels_opt_out(s.metadata.labels.as_ref())
}

fn labels_opt_out(l: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    let Some(l) = l else { return false };
    l.contains_key(HEADLESS_LABEL) || l.get(PROXY_NAME_LABEL).is_some_and(|v| v != PROXY_NAME)
}

/// What the planner needs to know about this node and cluster.
#[derive(Debug, Clone)]
pub struct ProxyInput<'a> {
    pub node: &'a NodeInfo,
    pub stack: Stack,
    pub services: &'a [Service],
    pub slices: &'a [EndpointSlice],
}

/// One usable endpoint of one Service port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Ep {
    ip: IpAddr,
    port: u16,
    local: bool,
}

fn hash8(s: &str) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("{:08x}", (h ^ (h >> 32)) as u32)
}

fn proto_of(p: &Option<String>) -> Option<Proto> {
    match p.as_deref().unwrap_or("TCP") {
        "TCP" => Some(Proto::Tcp),
        "UDP" => Some(Proto::Udp),
        "SCTP" => Some(Proto::Sctp),
        _ => None,
    }
}

/// A Service port's usable endpoints on this node, from the one
/// categorization (`podnet_api::endpoints`, kube-proxy's
/// CategorizeEndpoints).
#[derive(Debug, Default, PartialEq, Eq)]
struct Usable {
    /// For the Cluster policy.
    cluster: Vec<Ep>,
    /// For the Local policy.
    local: Vec<Ep>,
    /// Whether any endpoint anywhere can serve: without one the Service is
    /// rejected; with one but none for a Local policy, dropped.
    any: bool,
}

/// The endpoints of one Service port in this family, by Kubernetes rules.
fn endpoints(
    svc: &Service,
    port: &ServicePort,
    slices: &[EndpointSlice],
    node: &NodeInfo,
    stack: &Stack,
) -> Usable {
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    let mine: Vec<&EndpointSlice> = slices
        .iter()
        .filter(|s| {
            s.metadata.namespace.as_deref().unwrap_or("default") == ns
                && podnet_api::endpoints::service_name(s) == Some(name)
                && s.address_type == stack.address_type()
                && !slice_opted_out(s)
        })
        .collect();
    let proto = port.protocol.as_deref().unwrap_or("TCP");
    let port_name = port.name.as_deref().unwrap_or("");
    let listed = podnet_api::endpoints::listed(&mine, port_name, proto, &|ip| stack.holds(ip));
    let c = podnet_api::endpoints::categorize(&listed, &node.name, node.zone.as_deref());
    let eps = |idx: &[usize]| -> Vec<Ep> {
        let mut v: Vec<Ep> = idx
            .iter()
            .map(|&i| Ep {
                ip: listed[i].ip,
                port: listed[i].port,
                local: listed[i].on(&node.name),
            })
            .collect();
        v.sort();
        v.dedup();
        v
    };
    Usable {
        cluster: eps(&c.cluster),
        local: eps(&c.local),
        any: c.any,
    }
}

fn base(kind: ChainType, hook: Hook, priority: i32) -> Chain {
    Chain {
        base: Some(BaseChain {
            kind,
            hook,
            priority,
        }),
        rules: vec![],
    }
}

fn goto(c: &str) -> Expr {
    Expr::Verdict(Verdict::Goto(c.to_string()))
}

fn svc_key(ip: IpAddr, proto: Proto, port: u16) -> Vec<Value> {
    vec![Value::Addr(ip), Value::Proto(proto), Value::Port(port)]
}

/// Rules that pick one of `eps` uniformly (numgen cascade), with affinity.
fn pick_rules(eps: &[(String, &Ep)], affinity: bool, stack: &Stack) -> Vec<Rule> {
    let mut rules = Vec::new();
    if affinity {
        for (chain, _) in eps {
            rules.push(Rule::new(vec![
                Expr::InSet {
                    keys: vec![stack.saddr()],
                    set: format!("aff-{}", &chain[3..]),
                    neg: false,
                },
                goto(chain),
            ]));
        }
    }
    let n = eps.len() as u32;
    for (i, (chain, _)) in eps.iter().enumerate() {
        let left = n - i as u32;
        if left > 1 {
            rules.push(Rule::new(vec![
                Expr::Numgen {
                    modulus: left,
                    value: 0,
                },
                goto(chain),
            ]));
        } else {
            rules.push(Rule::new(vec![goto(chain)]));
        }
    }
    rules
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

/// The parts of the table every Service shares: base chains, the dispatch
/// maps (empty) and this node's NodePort addresses.
pub fn base_table(stack: &Stack, node: &NodeInfo) -> Table {
    let mut t = shell(stack);
    if let Some(ips) = &node.nodeport_ips {
        let mut set = Set::new(vec![stack.addr_key()]);
        for ip in ips.iter().filter(|ip| stack.holds(ip) && !ip.is_loopback()) {
            set.elements.insert(vec![Value::Addr(*ip)], None);
        }
        t.sets.insert("nodeport-ips".into(), set);
    }
    let three = vec![stack.daddr(), Field::L4Proto, Field::Dport];
    // Fast-path dispatch: one lookup decides fast or not; the port's
    // endpoint count picks the chain whose `numgen` modulus matches; that
    // chain DNATs through the endpoint map. Every per-Service part is a set
    // element, so Service changes never add rules or verdicts.
    let mut fast = vec![mark_external(stack)];
    for n in 1..=FAST_MAX {
        let (set, chain) = (fast_set(n), format!("pick-{n}"));
        t.sets.insert(set.clone(), Set::new(stack.svc_key_types()));
        fast.push(Rule::new(vec![
            Expr::InSet {
                keys: three.clone(),
                set,
                neg: false,
            },
            Expr::Verdict(Verdict::Goto(chain.clone())),
        ]));
        t.chains.insert(
            chain,
            Chain {
                base: None,
                rules: vec![Rule::new(vec![Expr::PickDnat {
                    keys: three.clone(),
                    modulus: n,
                    map: "fast-endpoints".into(),
                }])],
            },
        );
    }
    t.chains.insert(
        "fast-dispatch".into(),
        Chain {
            base: None,
            rules: fast,
        },
    );
    let dispatch = vec![
        Rule::new(vec![
            Expr::InSet {
                keys: three.clone(),
                set: "fast-services".into(),
                neg: false,
            },
            Expr::Verdict(Verdict::Jump("fast-dispatch".into())),
        ]),
        Rule::new(vec![Expr::VMap {
            keys: vec![stack.daddr(), Field::L4Proto, Field::Dport],
            map: "service-ips".into(),
        }]),
        // The address check only for ports that are NodePorts: every other
        // new connection through the node skips it.
        Rule::new(
            [Expr::InSet {
                keys: vec![Field::L4Proto, Field::Dport],
                set: "service-nodeports".into(),
                neg: false,
            }]
            .into_iter()
            .chain(nodeport_daddr(stack, node))
            .chain([Expr::VMap {
                keys: vec![Field::L4Proto, Field::Dport],
                map: "service-nodeports".into(),
            }])
            .collect(),
        ),
    ];
    t.chains.insert(
        "services".into(),
        Chain {
            base: None,
            rules: dispatch,
        },
    );
    let mut nat_pre = base(ChainType::Nat, Hook::Prerouting, -100);
    nat_pre
        .rules
        .push(Rule::new(vec![Expr::Verdict(Verdict::Jump(
            "services".into(),
        ))]));
    t.chains.insert("nat-prerouting".into(), nat_pre);
    let mut nat_out = base(ChainType::Nat, Hook::Output, -100);
    nat_out
        .rules
        .push(Rule::new(vec![Expr::Verdict(Verdict::Jump(
            "services".into(),
        ))]));
    t.chains.insert("nat-output".into(), nat_out);
    let mut nat_post = base(ChainType::Nat, Hook::Postrouting, 100);
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
        Chain {
            base: None,
            rules: vec![Rule::new(vec![Expr::SetMark { bits: MASQ_MARK }])],
        },
    );
    // Services without endpoints are rejected (or, with a Local policy and
    // none here, dropped) in the filter hooks: ClusterIPs and external
    // addresses in input, forward and output; NodePorts in input only, as
    // upstream does. The node's own traffic to one of its NodePorts is
    // DNATed in nat output (a Local policy short-circuits it to every
    // endpoint); only what nothing DNATed is delivered locally, where
    // input judges it.
    t.chains.insert(
        "service-endpoints-check".into(),
        Chain {
            base: None,
            rules: vec![Rule::new(vec![Expr::VMap {
                keys: vec![stack.daddr(), Field::L4Proto, Field::Dport],
                map: "no-endpoint-services".into(),
            }])],
        },
    );
    t.chains.insert(
        "nodeport-endpoints-check".into(),
        Chain {
            base: None,
            rules: vec![Rule::new(
                [Expr::InSet {
                    keys: vec![Field::L4Proto, Field::Dport],
                    set: "no-endpoint-nodeports".into(),
                    neg: false,
                }]
                .into_iter()
                .chain(nodeport_daddr(stack, node))
                .chain([Expr::VMap {
                    keys: vec![Field::L4Proto, Field::Dport],
                    map: "no-endpoint-nodeports".into(),
                }])
                .collect(),
            )],
        },
    );
    t.chains.insert(
        "reject-chain".into(),
        Chain {
            base: None,
            rules: vec![Rule::new(vec![Expr::Reject { tcp_reset: false }])],
        },
    );
    // Traffic to the Service CIDR that no Service took: a ClusterIP on a
    // port or protocol it does not serve is rejected, an address no Service
    // holds is dropped; neither may follow the default route off the node.
    // Judged after DNAT, so only what the Service rules left is seen.
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
    t.chains.insert(
        "cluster-ips-check".into(),
        Chain {
            base: None,
            rules: ips_check,
        },
    );
    let jump_new = |c: &str| {
        Rule::new(vec![
            Expr::CtStateNew,
            Expr::Verdict(Verdict::Jump(c.into())),
        ])
    };
    // Incoming and forwarded packets were DNATed in prerouting already.
    // Only a connection's first packet can be for a Service without
    // endpoints; later packets skip the lookups.
    for (name, hook) in [
        ("filter-input", Hook::Input),
        ("filter-forward", Hook::Forward),
    ] {
        let mut c = base(ChainType::Filter, hook, -110);
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
    let mut post_dnat = base(ChainType::Filter, Hook::Output, -90);
    post_dnat.rules.push(jump_new("service-endpoints-check"));
    post_dnat.rules.push(jump_new("cluster-ips-check"));
    t.chains.insert("filter-output-post-dnat".into(), post_dnat);

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

/// One Service's contribution: its map elements, chains and affinity sets.
/// Diffing old and new fragments is how a change to one Service costs work
/// proportional to that Service alone.
pub fn fragment(
    svc: Option<&Service>,
    slices: &[EndpointSlice],
    node: &NodeInfo,
    stack: &Stack,
) -> Table {
    let mut t = shell(stack);
    if let Some(svc) = svc {
        add_service(&mut t, svc, slices, node, stack);
    }
    t
}

/// Adds a fragment's elements, sets and chains to a table.
pub fn merge(t: &mut Table, f: &Table) {
    for (name, set) in &f.sets {
        match t.sets.get_mut(name) {
            Some(s) => s
                .elements
                .extend(set.elements.iter().map(|(k, v)| (k.clone(), v.clone()))),
            None => {
                t.sets.insert(name.clone(), set.clone());
            }
        }
    }
    for (name, c) in &f.chains {
        t.chains.insert(name.clone(), c.clone());
    }
}

/// Plans the whole table (full syncs and tests).
pub fn plan(input: &ProxyInput<'_>) -> Table {
    let mut t = base_table(&input.stack, input.node);
    for svc in input.services {
        add_service(&mut t, svc, input.slices, input.node, &input.stack);
    }
    t
}

/// Rules that send traffic from outside the cluster's pod network to be
/// masqueraded (all traffic, when the family has no pod network).
fn mark_external(stack: &Stack) -> Rule {
    let mut exprs = Vec::new();
    if let Some(c) = stack.cluster_cidr {
        exprs.push(Expr::Cmp {
            field: stack.saddr(),
            neg: true,
            value: Value::Net(c),
        });
    }
    exprs.push(Expr::Verdict(Verdict::Jump("mark-for-masquerade".into())));
    Rule::new(exprs)
}

/// The Service's ClusterIP in this family: `clusterIPs` (dual-stack) or
/// `clusterIP`.
/// The ClusterIP this family programs `svc` under; None when this
/// family's table holds nothing of it (an ExternalName, a Service another
/// proxy owns, or one with no ClusterIP of the family: as kube-proxy, a
/// family's proxier ignores a Service without a ClusterIP of its own).
/// A full sync skips such Services without planning them.
pub fn programmed_ip(svc: &Service, stack: &Stack) -> Option<IpAddr> {
    let spec = svc.spec.as_ref()?;
    let ty = spec.type_.as_deref().unwrap_or("ClusterIP");
    if ty == "ExternalName" || opted_out(svc) {
        return None;
    }
    cluster_ip_of(spec, stack)
}

fn cluster_ip_of(
    spec: &podnet_api::k8s_openapi::api::core::v1::ServiceSpec,
    stack: &Stack,
) -> Option<IpAddr> {
    spec.cluster_ips
        .iter()
        .flatten()
        .chain(spec.cluster_ip.iter())
        .filter_map(|c| c.parse::<IpAddr>().ok())
        .find(|ip| stack.holds(ip))
}

/// The set holding the fast-path ports with `n` endpoints.
pub fn fast_set(n: u32) -> String {
    format!("fast-{n}")
}

/// Whether `name` is one of the base table's per-count fast-path sets.
pub fn is_fast_count_set(name: &str) -> bool {
    name.strip_prefix("fast-")
        .and_then(|n| n.parse::<u32>().ok())
        .is_some_and(|n| (1..=FAST_MAX).contains(&n))
}

/// A fast-path Service port's elements.
fn add_fast(t: &mut Table, stack: &Stack, cip: IpAddr, proto: Proto, port: u16, eps: &[&Ep]) {
    let key = svc_key(cip, proto, port);
    t.sets
        .entry(fast_set(eps.len() as u32))
        .or_insert_with(|| Set::new(stack.svc_key_types()))
        .elements
        .insert(key.clone(), None);
    let mut elems = |name: &str, k: Vec<Value>, d: Option<ElemData>| {
        t.sets
            .get_mut(name)
            .expect("declared in the shell")
            .elements
            .insert(k, d);
    };
    elems("fast-services", key.clone(), None);
    for (i, e) in eps.iter().enumerate() {
        let mut k = key.clone();
        k.push(Value::U32(i as u32));
        elems(
            "fast-endpoints",
            k,
            Some(ElemData::Data(vec![Value::Addr(e.ip), Value::Port(e.port)])),
        );
        elems(
            "fast-hairpin",
            vec![
                Value::Addr(e.ip),
                Value::Addr(e.ip),
                Value::Addr(cip),
                Value::Port(port),
            ],
            None,
        );
    }
}

/// Adds `key → verdict` to one of the no-endpoint filter maps: reject when
/// the Service has no usable endpoint anywhere, drop when a Local policy
/// finds none on this node (upstream: "has no local endpoints").
fn no_endpoints(t: &mut Table, map: &str, key: Vec<Value>, any: bool) {
    let v = if any {
        Verdict::Drop
    } else {
        Verdict::Goto("reject-chain".into())
    };
    t.sets
        .get_mut(map)
        .expect("declared in the shell")
        .elements
        .insert(key, Some(ElemData::Verdict(v)));
}

fn add_service(
    t: &mut Table,
    svc: &Service,
    slices: &[EndpointSlice],
    node: &NodeInfo,
    stack: &Stack,
) {
    let (Some(spec), Some(cip)) = (&svc.spec, programmed_ip(svc, stack)) else {
        return;
    };
    let ty = spec.type_.as_deref().unwrap_or("ClusterIP");
    t.sets
        .get_mut("cluster-ips")
        .expect("declared in the shell")
        .elements
        .insert(vec![Value::Addr(cip)], None);
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    let affinity = spec.session_affinity.as_deref() == Some("ClientIP");
    let timeout = spec
        .session_affinity_config
        .as_ref()
        .and_then(|c| c.client_ip.as_ref())
        .and_then(|c| c.timeout_seconds)
        .map(|t| t as u32)
        .unwrap_or(DEFAULT_AFFINITY_TIMEOUT);
    let int_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let lb_ips: Vec<IpAddr> = svc
        .status
        .iter()
        .flat_map(|s| s.load_balancer.iter())
        .flat_map(|l| l.ingress.iter().flatten())
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .filter(|ip| stack.holds(ip))
        .collect();
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
    for port in spec.ports.iter().flatten() {
        let Some(proto) = proto_of(&port.protocol) else {
            continue;
        };
        let Ok(sport) = u16::try_from(port.port) else {
            continue;
        };
        let usable = endpoints(svc, port, slices, node, stack);
        let int_eps: Vec<&Ep> = if int_local {
            usable.local.iter().collect()
        } else {
            usable.cluster.iter().collect()
        };
        let ext_eps: Vec<&Ep> = if ext_local {
            usable.local.iter().collect()
        } else {
            usable.cluster.iter().collect()
        };
        let node_port = port
            .node_port
            .and_then(|p| u16::try_from(p).ok())
            .filter(|_| node_ports_on);
        let external = node_port.is_some() || !external_ips.is_empty();

        // The fast path: a ClusterIP-only port without affinity is data in
        // three maps, no chains of its own.
        if !affinity && !external && !int_eps.is_empty() && int_eps.len() <= FAST_MAX as usize {
            add_fast(t, stack, cip, proto, sport, &int_eps);
            continue;
        }
        let id = hash8(&format!(
            "{ns}/{name}/{}/{}",
            port.name.as_deref().unwrap_or(""),
            proto.name()
        ));

        // Endpoint chains, shared by the cluster and external paths.
        let mut reachable: Vec<&Ep> = int_eps.clone();
        if external && usable.any {
            // External traffic from pods and the node itself is sent to the
            // Cluster endpoints whatever the external policy.
            reachable.extend(usable.cluster.iter());
            reachable.extend(ext_eps.iter().copied());
        }
        reachable.sort();
        reachable.dedup();
        let mut ep_chains: BTreeMap<&Ep, String> = BTreeMap::new();
        for e in reachable {
            let ec = format!("ep-{}", hash8(&format!("{id}/{}:{}", e.ip, e.port)));
            let mut rules = vec![Rule::new(vec![
                Expr::Cmp {
                    field: stack.saddr(),
                    neg: false,
                    value: Value::Addr(e.ip),
                },
                Expr::Verdict(Verdict::Jump("mark-for-masquerade".into())),
            ])];
            let mut dnat = Vec::new();
            if affinity {
                let set = format!("aff-{}", &ec[3..]);
                let mut s = Set::new(vec![stack.addr_key()]);
                s.timeout = Some(timeout);
                t.sets.insert(set.clone(), s);
                dnat.push(Expr::UpdateSet {
                    keys: vec![stack.saddr()],
                    set,
                });
            }
            dnat.push(Expr::Cmp {
                field: Field::L4Proto,
                neg: false,
                value: Value::Proto(proto),
            });
            dnat.push(Expr::Dnat {
                addr: e.ip,
                port: Some(e.port),
            });
            rules.push(Rule::new(dnat));
            t.chains.insert(ec.clone(), Chain { base: None, rules });
            ep_chains.insert(e, ec);
        }
        let picks = |eps: &[&Ep]| -> Vec<Rule> {
            let named: Vec<(String, &Ep)> =
                eps.iter().map(|e| (ep_chains[*e].clone(), *e)).collect();
            pick_rules(&named, affinity, stack)
        };

        // The cluster path: ClusterIP.
        let svc_chain = format!("svc-{id}");
        if int_eps.is_empty() {
            no_endpoints(
                t,
                "no-endpoint-services",
                svc_key(cip, proto, sport),
                usable.any,
            );
        } else {
            let mut rules = vec![mark_external(stack)];
            rules.extend(picks(&int_eps));
            t.chains
                .insert(svc_chain.clone(), Chain { base: None, rules });
            t.sets
                .get_mut("service-ips")
                .expect("declared")
                .elements
                .insert(
                    svc_key(cip, proto, sport),
                    Some(ElemData::Verdict(Verdict::Goto(svc_chain.clone()))),
                );
        }

        // The external path: NodePort, externalIPs, LoadBalancer IPs.
        if !external {
            continue;
        }
        if !usable.any || ext_eps.is_empty() {
            for ip in &external_ips {
                no_endpoints(
                    t,
                    "no-endpoint-services",
                    svc_key(*ip, proto, sport),
                    usable.any,
                );
            }
            if let Some(np) = node_port {
                no_endpoints(
                    t,
                    "no-endpoint-nodeports",
                    vec![Value::Proto(proto), Value::Port(np)],
                    usable.any,
                );
            }
        }
        if !usable.any {
            continue;
        }
        let ext_chain = format!("ext-{id}");
        let mut rules = Vec::new();
        if ext_local {
            // Pods and the node reach an external address of a Local
            // Service as if through an outside load balancer coming back:
            // to every endpoint, and the node's own traffic masqueraded.
            let cluster_chain = if int_local {
                let c = format!("all-{id}");
                let eps: Vec<&Ep> = usable.cluster.iter().collect();
                t.chains.insert(
                    c.clone(),
                    Chain {
                        base: None,
                        rules: picks(&eps),
                    },
                );
                c
            } else {
                svc_chain.clone()
            };
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
                Expr::Verdict(Verdict::Jump("mark-for-masquerade".into())),
            ]));
            rules.push(Rule::new(vec![Expr::FibSaddrLocal, goto(&cluster_chain)]));
        } else {
            rules.push(Rule::new(vec![Expr::Verdict(Verdict::Jump(
                "mark-for-masquerade".into(),
            ))]));
        }
        // With no endpoint for outside traffic here, the rest falls through
        // to the filter maps' drop.
        rules.extend(picks(&ext_eps));
        t.chains
            .insert(ext_chain.clone(), Chain { base: None, rules });
        // loadBalancerSourceRanges: only listed sources get in; a range
        // holding this node's address also admits the LB IPs themselves
        // (the node reaching a VIP it holds locally does so from the VIP).
        let mut sources: Vec<IpNet> = ranges.clone();
        if ranges
            .iter()
            .any(|r| node.ips.iter().any(|ip| r.contains(ip)))
        {
            sources.extend(lb_ips.iter().map(|ip| IpNet::from(*ip)));
        }
        for ip in &external_ips {
            let target = if lb_ips.contains(ip) && !ranges.is_empty() {
                let fw = format!("fw-{id}");
                let mut r: Vec<Rule> = sources
                    .iter()
                    .map(|n| {
                        Rule::new(vec![
                            Expr::Cmp {
                                field: stack.saddr(),
                                neg: false,
                                value: Value::Net(*n),
                            },
                            goto(&ext_chain),
                        ])
                    })
                    .collect();
                r.push(Rule::new(vec![Expr::Verdict(Verdict::Drop)]));
                t.chains.insert(
                    fw.clone(),
                    Chain {
                        base: None,
                        rules: r,
                    },
                );
                fw
            } else {
                ext_chain.clone()
            };
            t.sets
                .get_mut("service-ips")
                .expect("declared")
                .elements
                .insert(
                    svc_key(*ip, proto, sport),
                    Some(ElemData::Verdict(Verdict::Goto(target))),
                );
        }
        if let Some(np) = node_port {
            t.sets
                .get_mut("service-nodeports")
                .expect("declared")
                .elements
                .insert(
                    vec![Value::Proto(proto), Value::Port(np)],
                    Some(ElemData::Verdict(Verdict::Goto(ext_chain.clone()))),
                );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podnet_nft::diff::{diff, ops, Change};
    use podnet_nft::trace::{Fate, Packet, Tracer};
    use serde_json::json;
    use std::collections::BTreeSet;

    const NODE_IP: &str = "192.168.200.11";

    fn svc(name: &str, spec: serde_json::Value) -> Service {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec}),
        )
        .unwrap()
    }

    fn slice(svc: &str, eps: &[(&str, bool, bool, &str)], port: i32) -> EndpointSlice {
        let endpoints: Vec<serde_json::Value> = eps
            .iter()
            .map(|(ip, ready, term, node)| {
                json!({"addresses": [ip], "nodeName": node,
                "conditions": {"ready": ready, "serving": *ready || *term, "terminating": term}})
            })
            .collect();
        serde_json::from_value(json!({"metadata": {"name": format!("{svc}-x"), "namespace": "default",
                "labels": {"kubernetes.io/service-name": svc}},
            "addressType": "IPv4", "endpoints": endpoints, "ports": [{"name": "http", "protocol": "TCP", "port": port}]}))
        .unwrap()
    }

    fn web(extra: serde_json::Value) -> Service {
        let mut spec = json!({"clusterIP": "10.96.0.50", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}], "selector": {"app": "web"}});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        svc("web", spec)
    }

    fn two_eps() -> EndpointSlice {
        slice(
            "web",
            &[
                ("10.244.1.5", true, false, "node1"),
                ("10.244.2.5", true, false, "node2"),
            ],
            8080,
        )
    }

    fn v4() -> Stack {
        Stack::v4("10.244.0.0/16".parse().unwrap())
    }

    /// node1 at NODE_IP, accepting NodePorts on every local address.
    fn node1() -> NodeInfo {
        NodeInfo {
            ips: vec![NODE_IP.parse().unwrap()],
            ..NodeInfo::named("node1")
        }
    }

    fn plan_for(services: &[Service], slices: &[EndpointSlice]) -> Table {
        plan(&ProxyInput {
            node: &node1(),
            stack: v4(),
            services,
            slices,
        })
    }

    fn targets(t: &Table, p: &Packet) -> BTreeSet<String> {
        Tracer::new(t)
            .with_local(&[NODE_IP])
            .incoming_targets(p, 12)
            .into_iter()
            .map(|d| {
                d.map(|(a, p)| format!("{a}:{}", p.unwrap_or(0)))
                    .unwrap_or_else(|| "none".into())
            })
            .collect()
    }

    /// The packet tracer table: (flow) -> (verdict, DNAT targets, masquerade).
    #[test]
    fn cluster_ip_distributes_over_ready_endpoints_without_masquerade_from_pods() {
        let t = plan_for(&[web(json!({}))], &[two_eps()]);
        let from_pod = Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80);
        assert_eq!(
            targets(&t, &from_pod),
            BTreeSet::from(["10.244.1.5:8080".to_string(), "10.244.2.5:8080".to_string()])
        );
        let o = Tracer::new(&t).incoming(&from_pod, &mut |_| 0);
        assert_eq!(o.fate, Fate::Accept);
        assert!(!o.masquerade, "pod-to-Service keeps the pod's source");
        // From outside the cluster CIDR: masqueraded.
        let o = Tracer::new(&t).incoming(
            &Packet::new("192.168.200.50", "10.96.0.50", Proto::Tcp, 80),
            &mut |_| 1,
        );
        assert_eq!(o.dnat, Some(("10.244.2.5".parse().unwrap(), Some(8080))));
        assert!(o.masquerade);
        // Wrong port or protocol: not DNATed, and rejected on the node
        // (kube-proxy's cluster-ips-check) instead of leaving it.
        let o = Tracer::new(&t).incoming(
            &Packet::new("10.244.3.9", "10.96.0.50", Proto::Udp, 80),
            &mut |_| 0,
        );
        assert_eq!((o.fate, o.dnat), (Fate::Reject, None));
    }

    #[test]
    fn hairpin_is_masqueraded() {
        let t = plan_for(&[web(json!({}))], &[two_eps()]);
        let o = Tracer::new(&t).incoming(
            &Packet::new("10.244.1.5", "10.96.0.50", Proto::Tcp, 80),
            &mut |_| 0,
        );
        assert_eq!(o.dnat, Some(("10.244.1.5".parse().unwrap(), Some(8080))));
        assert!(
            o.masquerade,
            "an endpoint reaching itself must be masqueraded"
        );
    }

    #[test]
    fn no_usable_endpoints_rejects_and_terminating_are_a_fallback() {
        let t = plan_for(&[web(json!({}))], &[]);
        let o = Tracer::new(&t).incoming(
            &Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80),
            &mut |_| 0,
        );
        assert_eq!(o.fate, Fate::Reject);
        let only_term = slice(
            "web",
            &[
                ("10.244.1.5", false, true, "node1"),
                ("10.244.1.6", false, false, "node1"),
            ],
            8080,
        );
        let t = plan_for(&[web(json!({}))], &[only_term]);
        assert_eq!(
            targets(&t, &Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80)),
            BTreeSet::from(["10.244.1.5:8080".to_string()])
        );
        let mixed = slice(
            "web",
            &[
                ("10.244.1.5", false, true, "node1"),
                ("10.244.1.7", true, false, "node1"),
            ],
            8080,
        );
        let t = plan_for(&[web(json!({}))], &[mixed]);
        assert_eq!(
            targets(&t, &Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80)),
            BTreeSet::from(["10.244.1.7:8080".to_string()])
        );
    }

    #[test]
    fn node_ports_external_ips_and_lb_ips() {
        let s = web(
            json!({"type": "LoadBalancer", "externalIPs": ["203.0.113.7"],
            "ports": [{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}],
            "loadBalancerSourceRanges": ["198.51.100.0/24"]}),
        );
        let mut s = s;
        s.status =
            serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "198.18.0.9"}]}}))
                .unwrap();
        let t = plan_for(&[s], &[two_eps()]);
        let np = Packet::new("198.51.100.20", NODE_IP, Proto::Tcp, 30080);
        let o = Tracer::new(&t)
            .with_local(&[NODE_IP])
            .incoming(&np, &mut |_| 0);
        assert!(
            o.dnat.is_some() && o.masquerade,
            "NodePort with Cluster policy: DNAT + masquerade ({o:?})"
        );
        let o = Tracer::new(&t).incoming(
            &Packet::new("198.51.100.20", "203.0.113.7", Proto::Tcp, 80),
            &mut |_| 0,
        );
        assert!(o.dnat.is_some(), "externalIP");
        let o = Tracer::new(&t).incoming(
            &Packet::new("198.51.100.20", "198.18.0.9", Proto::Tcp, 80),
            &mut |_| 0,
        );
        assert!(o.dnat.is_some(), "LB IP from an allowed range");
        let o = Tracer::new(&t).incoming(
            &Packet::new("192.0.2.1", "198.18.0.9", Proto::Tcp, 80),
            &mut |_| 0,
        );
        assert_eq!(
            o.fate,
            Fate::Drop,
            "LB IP from outside loadBalancerSourceRanges"
        );
        // A NodePort on a non-local address is not ours.
        let o = Tracer::new(&t).with_local(&[NODE_IP]).incoming(
            &Packet::new("198.51.100.20", "192.168.200.99", Proto::Tcp, 30080),
            &mut |_| 0,
        );
        assert_eq!(o.dnat, None);
    }

    #[test]
    fn external_traffic_policy_local_keeps_source_and_uses_local_endpoints() {
        let s = web(json!({"type": "NodePort", "externalTrafficPolicy": "Local",
            "ports": [{"name": "http", "port": 80, "nodePort": 30081, "protocol": "TCP"}]}));
        let t = plan_for(std::slice::from_ref(&s), &[two_eps()]);
        let np = Packet::new("198.51.100.20", NODE_IP, Proto::Tcp, 30081);
        let mut tr = Tracer::new(&t).with_local(&[NODE_IP]);
        assert_eq!(
            tr.incoming_targets(&np, 6).len(),
            1,
            "only node1's endpoint"
        );
        let o = tr.incoming(&np, &mut |_| 0);
        assert_eq!(o.dnat, Some(("10.244.1.5".parse().unwrap(), Some(8080))));
        assert!(!o.masquerade, "client source preserved");
        // No local endpoint: dropped ("has no local endpoints"), not
        // rejected: the Service has endpoints, just not here.
        let remote_only = slice("web", &[("10.244.2.5", true, false, "node2")], 8080);
        let t = plan_for(&[s], &[remote_only]);
        let o = Tracer::new(&t)
            .with_local(&[NODE_IP])
            .incoming(&np, &mut |_| 0);
        assert_eq!((o.fate, o.dnat), (Fate::Drop, None));
    }

    #[test]
    fn internal_traffic_policy_local() {
        let t = plan_for(
            &[web(json!({"internalTrafficPolicy": "Local"}))],
            &[two_eps()],
        );
        let p = Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80);
        assert_eq!(
            targets(&t, &p),
            BTreeSet::from(["10.244.1.5:8080".to_string()])
        );
    }

    #[test]
    fn session_affinity_sticks() {
        let t = plan_for(&[web(json!({"sessionAffinity": "ClientIP"}))], &[two_eps()]);
        assert!(t
            .sets
            .values()
            .any(|s| s.timeout == Some(DEFAULT_AFFINITY_TIMEOUT)));
        let mut tr = Tracer::new(&t);
        let p = Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80);
        let first = tr.incoming(&p, &mut |_| 1).dnat;
        for draw in [0, 0, 1, 0] {
            assert_eq!(
                tr.incoming(&p, &mut |_| draw).dnat,
                first,
                "affinity must stick"
            );
        }
        let other = tr
            .incoming(
                &Packet::new("10.244.3.10", "10.96.0.50", Proto::Tcp, 80),
                &mut |_| 0,
            )
            .dnat;
        assert_ne!(other, first);
    }

    #[test]
    fn external_name_and_headless_get_no_rules() {
        let en = svc(
            "ext",
            json!({"type": "ExternalName", "externalName": "example.com"}),
        );
        let hl = svc("hl", json!({"clusterIP": "None", "ports": [{"port": 80}]}));
        let t = plan_for(&[en, hl], &[]);
        assert!(t.sets.iter().all(|(_, s)| s.elements.is_empty()));
        assert!(!t.chains.keys().any(|c| c.starts_with("svc-")));
    }

    #[test]
    fn repeated_sync_is_zero_ops_and_one_endpoint_change_is_small() {
        let mut svcs = Vec::new();
        let mut slices = Vec::new();
        for i in 0..200 {
            svcs.push(svc(
                &format!("s{i}"),
                json!({"clusterIP": format!("10.96.{}.{}", i / 250, i % 250 + 1),
                "ports": [{"name": "http", "port": 80}], "selector": {"a": "b"}}),
            ));
            slices.push(slice(
                &format!("s{i}"),
                &[
                    (
                        &format!("10.244.{}.{}", i / 250 + 1, i % 250 + 1),
                        true,
                        false,
                        "node2",
                    ),
                    ("10.244.9.9", true, false, "node3"),
                ],
                8080,
            ));
        }
        let t1 = plan_for(&svcs, &slices);
        assert_eq!(ops(&diff(Some(&t1), &plan_for(&svcs, &slices))), 0);
        slices[7] = slice(
            "s7",
            &[
                ("10.244.1.8", true, false, "node2"),
                ("10.244.9.10", true, false, "node3"),
            ],
            8080,
        );
        let t2 = plan_for(&svcs, &slices);
        let d = diff(Some(&t1), &t2);
        assert!(
            ops(&d) <= 10,
            "one endpoint change cost {} ops: {d:?}",
            ops(&d)
        );
        // A Service added: its element plus its chains.
        svcs.push(svc(
            "new",
            json!({"clusterIP": "10.96.5.5", "ports": [{"name": "http", "port": 80}]}),
        ));
        slices.push(slice("new", &[("10.244.5.5", true, false, "node2")], 80));
        let d = diff(Some(&t2), &plan_for(&svcs, &slices));
        assert_eq!(
            ops(&d),
            5,
            "a fast-path Service is five elements (cluster-ips, fast, fast-1, endpoint, hairpin): {d:?}"
        );
        assert!(
            d.iter().all(|c| matches!(c, Change::AddElems { .. })),
            "no chains or rules, so the kernel has nothing to re-validate: {d:?}"
        );
        // The same Service with a NodePort takes the chain path.
        let last = svcs.len() - 1;
        svcs[last] = svc(
            "new",
            json!({"type": "NodePort", "clusterIP": "10.96.5.5",
                   "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}),
        );
        let d = diff(Some(&t2), &plan_for(&svcs, &slices));
        assert!(
            d.iter().any(|c| matches!(c, Change::AddChain { .. })),
            "{d:?}"
        );
    }

    #[test]
    fn fragments_merge_into_the_full_plan() {
        let services = [
            web(json!({"sessionAffinity": "ClientIP"})),
            svc(
                "other",
                json!({"clusterIP": "10.96.0.60", "ports": [{"name": "http", "port": 81}]}),
            ),
        ];
        let slices = [two_eps()];
        let full = plan_for(&services, &slices);
        let mut merged = base_table(&v4(), &node1());
        for s in &services {
            merge(&mut merged, &fragment(Some(s), &slices, &node1(), &v4()));
        }
        assert_eq!(merged, full);
        // Removing a Service is the diff from its fragment to an empty one.
        let f = fragment(Some(&services[0]), &slices, &node1(), &v4());
        let gone = fragment(None, &[], &node1(), &v4());
        let d = diff(Some(&f), &gone);
        assert!(
            d.iter()
                .any(|c| matches!(c, podnet_nft::diff::Change::DelSet { .. })),
            "affinity sets go too"
        );
        assert!(!d.iter().any(
            |c| matches!(c, podnet_nft::diff::Change::DelSet { name } if name == "service-ips")
        ));
    }

    #[test]
    fn ipv6_and_dual_stack() {
        let s = svc(
            "web",
            json!({"clusterIP": "10.96.0.50", "clusterIPs": ["10.96.0.50", "fd00:96::50"],
                "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "PreferDualStack",
                "type": "NodePort", "externalIPs": ["2001:db8::7"],
                "ports": [{"name": "http", "port": 80, "nodePort": 30090, "protocol": "TCP"}]}),
        );
        let v6_slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "web-v6", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv6",
            "endpoints": [{"addresses": ["fd00:244:0:1::5"], "nodeName": "node1",
                "conditions": {"ready": true}}],
            "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]}))
        .unwrap();
        let slices = [two_eps(), v6_slice];
        let v6 = Stack::v6(Some("fd00:244::/48".parse().unwrap()));
        let t6 = plan(&ProxyInput {
            node: &node1(),
            stack: v6,
            services: std::slice::from_ref(&s),
            slices: &slices,
        });
        assert_eq!(t6.family, Family::Ip6);
        let from_pod = Packet::new("fd00:244:0:2::9", "fd00:96::50", Proto::Tcp, 80);
        let o = Tracer::new(&t6).incoming(&from_pod, &mut |_| 0);
        assert_eq!(
            o.dnat,
            Some(("fd00:244:0:1::5".parse().unwrap(), Some(8080)))
        );
        assert!(!o.masquerade, "pod source kept over IPv6 too");
        let o = Tracer::new(&t6).incoming(
            &Packet::new("2001:db8:1::1", "2001:db8::7", Proto::Tcp, 80),
            &mut |_| 0,
        );
        assert!(o.dnat.is_some() && o.masquerade, "IPv6 externalIP: {o:?}");
        let o = Tracer::new(&t6).with_local(&["fd00:200::11"]).incoming(
            &Packet::new("2001:db8:1::1", "fd00:200::11", Proto::Tcp, 30090),
            &mut |_| 0,
        );
        assert!(o.dnat.is_some(), "NodePort on the node's IPv6 address");
        // The IPv4 table carries only the IPv4 half, and vice versa.
        let t4 = plan_for(std::slice::from_ref(&s), &slices);
        let targets4 = targets(
            &t4,
            &Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80),
        );
        assert_eq!(
            targets4,
            BTreeSet::from(["10.244.1.5:8080".to_string(), "10.244.2.5:8080".to_string()])
        );
        assert!(!t4.render().contains("fd00"), "{}", t4.render());
        let r6 = t6.render();
        assert!(!r6.contains("10.96.0.50"), "{r6}");
        for want in [
            "table ip6 podnet",
            "type ipv6_addr . inet_proto . inet_service : verdict;",
            "ip6 daddr . meta l4proto . th dport vmap @service-ips",
            "ip6 saddr != fd00:244::/48 jump mark-for-masquerade",
            "dnat ip6 to [fd00:244:0:1::5]:8080",
        ] {
            assert!(r6.contains(want), "missing {want:?} in\n{r6}");
        }
        // A family without a pod network treats every client as external.
        let bare = plan(&ProxyInput {
            node: &node1(),
            stack: Stack::v6(None),
            services: std::slice::from_ref(&s),
            slices: &slices,
        });
        let o = Tracer::new(&bare).incoming(&from_pod, &mut |_| 0);
        assert!(o.dnat.is_some() && o.masquerade);
    }

    #[test]
    fn golden_render_of_a_small_service_set() {
        // web takes the fast path; api (affinity) the chain path.
        let api = svc(
            "api",
            json!({"clusterIP": "10.96.0.60", "sessionAffinity": "ClientIP",
                   "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}),
        );
        let t = plan_for(
            &[web(json!({})), api],
            &[
                slice("web", &[("10.244.1.5", true, false, "node1")], 8080),
                slice("api", &[("10.244.1.6", true, false, "node1")], 8080),
            ],
        );
        let r = t.render();
        for want in [
            "set fast-services {\n\t\ttype ipv4_addr . inet_proto . inet_service;",
            "set fast-1 {\n\t\ttype ipv4_addr . inet_proto . inet_service;\n\t\telements = { 10.96.0.50 . tcp . 80 }",
            "type ipv4_addr . inet_proto . inet_service . mark : ipv4_addr . inet_service;",
            "10.96.0.50 . tcp . 80 . 0x00000000 : 10.244.1.5 . 8080",
            "10.244.1.5 . 10.244.1.5 . 10.96.0.50 . 80",
            "\t\tip daddr . meta l4proto . th dport @fast-services jump fast-dispatch\n",
            "\t\tip daddr . meta l4proto . th dport @fast-2 goto pick-2\n",
            "\t\tdnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @fast-endpoints\n",
            "\t\tct status dnat ip saddr . ip daddr . ct original ip daddr . ct original proto-dst @fast-hairpin masquerade fully-random\n",
            "map service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict;",
            "10.96.0.60 . tcp . 80 : goto svc-",
            "\t\tip daddr . meta l4proto . th dport vmap @service-ips\n",
            "\t\tmeta l4proto . th dport @service-nodeports fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports\n",
            "\t\tip saddr != 10.244.0.0/16 jump mark-for-masquerade\n",
            " meta l4proto tcp dnat ip to 10.244.1.6:8080\n",
            "\t\tmeta mark & 0x00004000 != 0 masquerade fully-random\n",
            "type nat hook prerouting priority -100; policy accept;",
        ] {
            assert!(r.contains(want), "missing {want:?} in\n{r}");
        }
    }

    // ---- issue 12: kube-proxy semantics, one tracer row per item ----

    fn v4_with_services() -> Stack {
        v4().with_service_cidr(Some("10.96.0.0/12".parse().unwrap()))
    }

    fn plan_on(node: &NodeInfo, services: &[Service], slices: &[EndpointSlice]) -> Table {
        plan(&ProxyInput {
            node,
            stack: v4_with_services(),
            services,
            slices,
        })
    }

    fn one(t: &Table, tr_local: &[&str], p: &Packet) -> (Fate, Option<String>, bool) {
        let o = Tracer::new(t).with_local(tr_local).incoming(p, &mut |_| 0);
        (
            o.fate,
            o.dnat.map(|(a, p)| format!("{a}:{}", p.unwrap_or(0))),
            o.masquerade,
        )
    }

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// `web` on the fast path, `sticky` (a NodePort) on the chain path.
    fn fast_and_chain() -> (Vec<Service>, Vec<EndpointSlice>) {
        let mut sticky = web(json!({"clusterIP": "10.96.0.51", "type": "NodePort",
            "ports": [{"name": "http", "port": 80, "nodePort": 30090, "protocol": "TCP"}]}));
        sticky.metadata.name = Some("sticky".into());
        let mut sticky_eps = two_eps();
        sticky_eps
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("kubernetes.io/service-name".into(), "sticky".into());
        (vec![web(json!({})), sticky], vec![two_eps(), sticky_eps])
    }

    #[test]
    fn unserved_ports_of_cluster_ips_reject_and_unallocated_service_addresses_drop() {
        let (services, slices) = fast_and_chain();
        let t = plan_on(&node1(), &services, &slices);
        assert!(
            t.sets["fast-services"].elements.len() == 1,
            "web is on the fast path"
        );
        for cip in ["10.96.0.50", "10.96.0.51"] {
            // The served port is DNATed on both paths ...
            let (fate, dnat, _) = one(
                &t,
                &[NODE_IP],
                &Packet::new("10.244.3.9", cip, Proto::Tcp, 80),
            );
            assert_eq!(fate, Fate::Accept);
            assert!(dnat.is_some(), "{cip}:80");
            // ... another port or protocol of the ClusterIP is rejected,
            for p in [
                Packet::new("10.244.3.9", cip, Proto::Tcp, 81),
                Packet::new("10.244.3.9", cip, Proto::Udp, 80),
            ] {
                assert_eq!(
                    one(&t, &[NODE_IP], &p),
                    (Fate::Reject, None, false),
                    "{p:?}"
                );
                // from the node itself too (checked after nat output).
                let o = Tracer::new(&t).with_local(&[NODE_IP]).local(
                    &Packet {
                        src: NODE_IP.parse().unwrap(),
                        ..p.clone()
                    },
                    &mut |_| 0,
                );
                assert_eq!(o.fate, Fate::Reject, "{p:?} from the node");
                assert!(o.path.contains(&"filter-output-post-dnat".to_string()));
            }
        }
        // An address of the Service CIDR that no Service holds is dropped.
        let p = Packet::new("10.244.3.9", "10.96.0.77", Proto::Tcp, 80);
        assert_eq!(one(&t, &[NODE_IP], &p), (Fate::Drop, None, false));
        // Outside the Service CIDR nothing is ours: routed as usual.
        let p = Packet::new("10.244.3.9", "10.200.0.1", Proto::Tcp, 80);
        assert_eq!(one(&t, &[NODE_IP], &p), (Fate::Accept, None, false));
    }

    #[test]
    fn services_without_endpoints_reject_on_every_path_and_family() {
        let (services, _) = fast_and_chain();
        let mut lb = web(json!({"clusterIP": "10.96.0.52", "type": "LoadBalancer",
            "externalIPs": ["203.0.113.7"],
            "ports": [{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}]}));
        lb.metadata.name = Some("lb".into());
        lb.status =
            serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "198.18.0.9"}]}}))
                .unwrap();
        let mut all = services;
        all.push(lb);
        let t = plan_on(&node1(), &all, &[]);
        for (src, dst, port) in [
            ("10.244.3.9", "10.96.0.50", 80),
            ("10.244.3.9", "10.96.0.51", 80),
            ("10.244.3.9", "10.96.0.52", 80),
            ("198.51.100.20", "203.0.113.7", 80),
            ("198.51.100.20", "198.18.0.9", 80),
            ("198.51.100.20", NODE_IP, 30080),
            ("10.244.3.9", NODE_IP, 30080),
        ] {
            let p = Packet::new(src, dst, Proto::Tcp, port);
            assert_eq!(
                one(&t, &[NODE_IP], &p),
                (Fate::Reject, None, false),
                "{p:?}"
            );
        }
        // The reject rule is the family's own ICMP type (see the nft
        // netlink encoder); `reject` in the model text.
        assert_eq!(t.chains["reject-chain"].rules[0].text(), "reject");
    }

    #[test]
    fn local_policy_falls_back_to_local_serving_terminating_endpoints() {
        // node1's only endpoint is terminating but serving; node2's is ready.
        let s = web(json!({"type": "NodePort", "externalTrafficPolicy": "Local",
            "ports": [{"name": "http", "port": 80, "nodePort": 30081, "protocol": "TCP"}]}));
        let eps = slice(
            "web",
            &[
                ("10.244.1.5", false, true, "node1"),
                ("10.244.2.5", true, false, "node2"),
            ],
            8080,
        );
        let t = plan_on(
            &node1(),
            std::slice::from_ref(&s),
            std::slice::from_ref(&eps),
        );
        let np = Packet::new("198.51.100.20", NODE_IP, Proto::Tcp, 30081);
        assert_eq!(
            one(&t, &[NODE_IP], &np),
            (Fate::Accept, Some("10.244.1.5:8080".into()), false),
            "external traffic uses the local serving-terminating endpoint"
        );
        // ClusterIP traffic (Cluster policy) still uses the ready one.
        assert_eq!(
            targets(&t, &Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80)),
            set(&["10.244.2.5:8080"])
        );
        // The same with internalTrafficPolicy Local, for ClusterIP traffic.
        let t = plan_on(
            &node1(),
            &[web(json!({"internalTrafficPolicy": "Local"}))],
            std::slice::from_ref(&eps),
        );
        assert_eq!(
            targets(&t, &Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80)),
            set(&["10.244.1.5:8080"])
        );
    }

    #[test]
    fn the_nodes_own_traffic_is_judged_after_nat_output() {
        // As upstream: the node's own traffic meets nat output first (a
        // Local policy short-circuits it to every endpoint), then the
        // endpoint checks; NodePorts nothing DNATed reach input, where
        // they are checked.
        let t = plan_on(&node1(), &[], &[]);
        let chain = |name: &str| {
            t.chains[name]
                .rules
                .iter()
                .flat_map(|r| r.exprs.iter())
                .filter_map(|e| match e {
                    Expr::Verdict(Verdict::Jump(c)) => Some(c.clone()),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            chain("filter-input"),
            ["nodeport-endpoints-check", "service-endpoints-check"]
        );
        assert!(!t.chains.contains_key("filter-output"));
        assert_eq!(
            chain("filter-output-post-dnat"),
            ["service-endpoints-check", "cluster-ips-check"]
        );
        assert_eq!(
            chain("filter-forward"),
            ["service-endpoints-check", "cluster-ips-check"]
        );
    }

    #[test]
    fn external_local_short_circuits_pods_and_the_node_to_every_endpoint() {
        let mut s = web(
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
            "externalIPs": ["203.0.113.7"],
            "ports": [{"name": "http", "port": 80, "nodePort": 30082, "protocol": "TCP"}]}),
        );
        s.status =
            serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "198.18.0.9"}]}}))
                .unwrap();
        let both = set(&["10.244.1.5:8080", "10.244.2.5:8080"]);
        for eps in [
            two_eps(),
            slice("web", &[("10.244.2.5", true, false, "node2")], 8080),
        ] {
            let t = plan_on(
                &node1(),
                std::slice::from_ref(&s),
                std::slice::from_ref(&eps),
            );
            let all: BTreeSet<String> = eps
                .endpoints
                .iter()
                .flatten()
                .map(|e| format!("{}:8080", e.addresses[0]))
                .collect();
            for (dst, port) in [("203.0.113.7", 80), ("198.18.0.9", 80), (NODE_IP, 30082)] {
                // From a pod: every endpoint, source kept.
                let p = Packet::new("10.244.3.9", dst, Proto::Tcp, port);
                let mut tr = Tracer::new(&t).with_local(&[NODE_IP]);
                let got: BTreeSet<String> = tr
                    .incoming_targets(&p, 12)
                    .into_iter()
                    .map(|d| {
                        d.map(|(a, p)| format!("{a}:{}", p.unwrap_or(0)))
                            .unwrap_or_default()
                    })
                    .collect();
                assert_eq!(got, all, "pod to {dst}:{port}");
                assert!(!tr.incoming(&p, &mut |_| 0).masquerade);
                // From the node: every endpoint, masqueraded.
                let o = Tracer::new(&t)
                    .with_local(&[NODE_IP])
                    .local(&Packet::new(NODE_IP, dst, Proto::Tcp, port), &mut |_| 0);
                // With or without a local endpoint: upstream checks the
                // node's own traffic after nat output short-circuited it
                // (kube-proxy nftables does, podnet/tests/kubeproxy_diff.rs).
                assert!(
                    o.dnat.is_some() && o.masquerade,
                    "node to {dst}:{port}: {o:?}"
                );
                assert_eq!(o.fate, Fate::Accept, "node to {dst}:{port}: {o:?}");
            }
            // From outside: local endpoints only, or dropped without one.
            let ext = Packet::new("198.51.100.20", "203.0.113.7", Proto::Tcp, 80);
            if all == both {
                assert_eq!(
                    one(&t, &[NODE_IP], &ext),
                    (Fate::Accept, Some("10.244.1.5:8080".into()), false)
                );
            } else {
                assert_eq!(one(&t, &[NODE_IP], &ext), (Fate::Drop, None, false));
            }
        }
    }

    #[test]
    fn local_policies_without_local_endpoints_drop_and_without_any_reject() {
        let remote = slice("web", &[("10.244.2.5", true, false, "node2")], 8080);
        let int = web(json!({"internalTrafficPolicy": "Local"}));
        let p = Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80);
        let t = plan_on(
            &node1(),
            std::slice::from_ref(&int),
            std::slice::from_ref(&remote),
        );
        assert_eq!(
            one(&t, &[NODE_IP], &p),
            (Fate::Drop, None, false),
            "iTP Local, none here"
        );
        let t = plan_on(&node1(), std::slice::from_ref(&int), &[]);
        assert_eq!(
            one(&t, &[NODE_IP], &p),
            (Fate::Reject, None, false),
            "no endpoints at all"
        );
        let ext = web(json!({"type": "NodePort", "externalTrafficPolicy": "Local",
            "ports": [{"name": "http", "port": 80, "nodePort": 30083, "protocol": "TCP"}]}));
        let np = Packet::new("198.51.100.20", NODE_IP, Proto::Tcp, 30083);
        let t = plan_on(
            &node1(),
            std::slice::from_ref(&ext),
            std::slice::from_ref(&remote),
        );
        assert_eq!(
            one(&t, &[NODE_IP], &np),
            (Fate::Drop, None, false),
            "eTP Local, none here"
        );
        let t = plan_on(&node1(), std::slice::from_ref(&ext), &[]);
        assert_eq!(
            one(&t, &[NODE_IP], &np),
            (Fate::Reject, None, false),
            "no endpoints at all"
        );
    }

    #[test]
    fn lb_source_ranges_admit_the_lb_ips_when_a_range_holds_the_node() {
        let lb = |ranges: &[&str]| {
            let mut s = web(
                json!({"type": "LoadBalancer", "loadBalancerSourceRanges": ranges,
                "ports": [{"name": "http", "port": 80, "nodePort": 30084, "protocol": "TCP"}]}),
            );
            s.status = serde_json::from_value(
                json!({"loadBalancer": {"ingress": [{"ip": "198.18.0.9"}]}}),
            )
            .unwrap();
            s
        };
        let from_vip = Packet::new("198.18.0.9", "198.18.0.9", Proto::Tcp, 80);
        let t = plan_on(&node1(), &[lb(&["192.168.200.0/24"])], &[two_eps()]);
        assert!(
            one(&t, &[NODE_IP], &from_vip).1.is_some(),
            "range holds the node IP"
        );
        let ok = Packet::new("192.168.200.50", "198.18.0.9", Proto::Tcp, 80);
        assert!(one(&t, &[NODE_IP], &ok).1.is_some());
        let t = plan_on(&node1(), &[lb(&["198.51.100.0/24"])], &[two_eps()]);
        assert_eq!(one(&t, &[NODE_IP], &from_vip), (Fate::Drop, None, false));
    }

    fn hinted(eps: &[(&str, &str, Option<&str>, Option<&str>)]) -> EndpointSlice {
        let endpoints: Vec<serde_json::Value> = eps
            .iter()
            .map(|(ip, node, zone, for_node)| {
                let mut hints = json!({});
                if let Some(z) = zone {
                    hints["forZones"] = json!([{"name": z}]);
                }
                if let Some(n) = for_node {
                    hints["forNodes"] = json!([{"name": n}]);
                }
                json!({"addresses": [ip], "nodeName": node, "hints": hints,
                    "conditions": {"ready": true, "serving": true, "terminating": false}})
            })
            .collect();
        serde_json::from_value(json!({"metadata": {"name": "web-x", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "endpoints": endpoints,
            "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]}))
        .unwrap()
    }

    #[test]
    fn topology_hints_and_prefer_same_node() {
        let zoned = NodeInfo {
            zone: Some("a".into()),
            ..node1()
        };
        let unzoned = NodeInfo {
            zone: None,
            ..zoned.clone()
        };
        let p = Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80);
        let a = "10.244.1.5:8080";
        let both = set(&[a, "10.244.2.5:8080"]);
        let cases: Vec<(&str, &NodeInfo, EndpointSlice, BTreeSet<String>)> = vec![
            (
                "zone hints for this zone",
                &zoned,
                hinted(&[
                    ("10.244.1.5", "node1", Some("a"), None),
                    ("10.244.2.5", "node2", Some("b"), None),
                ]),
                set(&[a]),
            ),
            (
                "node without a zone label",
                &unzoned,
                hinted(&[
                    ("10.244.1.5", "node1", Some("a"), None),
                    ("10.244.2.5", "node2", Some("b"), None),
                ]),
                both.clone(),
            ),
            (
                "an endpoint without hints",
                &zoned,
                hinted(&[
                    ("10.244.1.5", "node1", Some("a"), None),
                    ("10.244.2.5", "node2", None, None),
                ]),
                both.clone(),
            ),
            (
                "no endpoint for this zone",
                &zoned,
                hinted(&[
                    ("10.244.1.5", "node1", Some("b"), None),
                    ("10.244.2.5", "node2", Some("c"), None),
                ]),
                both.clone(),
            ),
            (
                "PreferSameNode",
                &zoned,
                hinted(&[
                    ("10.244.1.5", "node1", Some("b"), Some("node1")),
                    ("10.244.2.5", "node2", Some("a"), Some("node2")),
                ]),
                set(&[a]),
            ),
        ];
        for (why, node, eps, want) in cases {
            for (services, name) in [
                (vec![web(json!({}))], "fast"),
                (fast_and_chain().0[1..].to_vec(), "chain"),
            ] {
                let mut eps = eps.clone();
                let svc_name = services[0].metadata.name.clone().unwrap();
                eps.metadata
                    .labels
                    .as_mut()
                    .unwrap()
                    .insert("kubernetes.io/service-name".into(), svc_name);
                let t = plan_on(node, &services, &[eps]);
                let cip = cluster_ip_of(services[0].spec.as_ref().unwrap(), &v4())
                    .unwrap()
                    .to_string();
                let p = Packet {
                    dst: cip.parse().unwrap(),
                    ..p.clone()
                };
                assert_eq!(targets(&t, &p), want, "{why} ({name} path)");
            }
        }
        // A Local policy ignores hints: node1's endpoint is hinted for zone b.
        let t = plan_on(
            &zoned,
            &[web(json!({"internalTrafficPolicy": "Local"}))],
            &[hinted(&[
                ("10.244.1.5", "node1", Some("b"), None),
                ("10.244.2.5", "node2", Some("a"), None),
            ])],
        );
        assert_eq!(targets(&t, &p), set(&[a]));
    }

    #[test]
    fn opt_out_labels_take_a_service_away_and_back() {
        let label = |k: &str, v: &str| {
            let mut s = web(json!({}));
            s.metadata.labels = Some([(k.to_string(), v.to_string())].into());
            s
        };
        let p = Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80);
        let empty = plan_on(&node1(), &[], &[]);
        for s in [
            label(HEADLESS_LABEL, ""),
            label(PROXY_NAME_LABEL, "other-proxy"),
        ] {
            let t = plan_on(&node1(), std::slice::from_ref(&s), &[two_eps()]);
            assert_eq!(t, empty, "{:?}: no rules at all", s.metadata.labels);
            // The ClusterIP is not ours now: dropped as an unheld address.
            assert_eq!(one(&t, &[NODE_IP], &p).0, Fate::Drop);
        }
        let ours = plan_on(
            &node1(),
            &[label(PROXY_NAME_LABEL, PROXY_NAME)],
            &[two_eps()],
        );
        assert_eq!(ours, plan_on(&node1(), &[web(json!({}))], &[two_eps()]));
        assert!(one(&ours, &[NODE_IP], &p).1.is_some());
    }

    #[test]
    fn a_slice_labelled_headless_or_for_another_proxy_gives_no_endpoints() {
        let p = Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80);
        let svc = web(json!({}));
        let with = plan_on(&node1(), std::slice::from_ref(&svc), &[two_eps()]);
        assert!(one(&with, &[NODE_IP], &p).1.is_some());
        let no_eps = plan_on(&node1(), std::slice::from_ref(&svc), &[]);
        for (k, v) in [(HEADLESS_LABEL, ""), (PROXY_NAME_LABEL, "other-proxy")] {
            let mut s = two_eps();
            s.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(k.into(), v.into());
            let t = plan_on(&node1(), std::slice::from_ref(&svc), &[s]);
            assert_eq!(t, no_eps, "slice labelled {k}={v:?}");
        }
    }

    #[test]
    fn node_ports_only_on_the_nodeport_addresses_never_loopback() {
        let s = web(json!({"type": "NodePort", "sessionAffinity": "None",
            "ports": [{"name": "http", "port": 80, "nodePort": 30085, "protocol": "TCP"}]}));
        let node = NodeInfo {
            nodeport_ips: Some(vec![NODE_IP.parse().unwrap(), "127.0.0.1".parse().unwrap()]),
            ..node1()
        };
        let t = plan_on(&node, std::slice::from_ref(&s), &[two_eps()]);
        assert_eq!(
            t.sets["nodeport-ips"].elements.keys().collect::<Vec<_>>(),
            vec![&vec![Value::Addr(NODE_IP.parse().unwrap())]],
            "loopback is never a NodePort address"
        );
        let local = [NODE_IP, "10.99.0.1", "127.0.0.1"];
        let at = |dst: &str| {
            let o = Tracer::new(&t)
                .with_local(&local)
                .local(&Packet::new(NODE_IP, dst, Proto::Tcp, 30085), &mut |_| 0);
            o.dnat
        };
        assert!(at(NODE_IP).is_some());
        assert_eq!(at("10.99.0.1"), None, "another local address");
        assert_eq!(at("127.0.0.1"), None, "loopback");
        // Without a list (`0.0.0.0/0`): every local address but loopback.
        let t = plan_on(&node1(), std::slice::from_ref(&s), &[two_eps()]);
        let at = |dst: &str| {
            Tracer::new(&t)
                .with_local(&local)
                .local(&Packet::new(NODE_IP, dst, Proto::Tcp, 30085), &mut |_| 0)
                .dnat
        };
        assert!(at("10.99.0.1").is_some());
        assert_eq!(at("127.0.0.1"), None);
    }
}
