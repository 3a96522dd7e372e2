//! The data plane's plan: NetworkPolicy as set elements in a fixed table.
//!
//! The chains never change with the objects; every pod, label, namespace
//! or policy change is element additions and removals only, so no change
//! makes the kernel re-validate the table's jumps (which costs what the
//! whole table holds, as the service proxy found). A new connection takes
//! at most four hash or interval lookups per direction whatever the number
//! of policies; established traffic takes none.
//!
//! Per family (`ip podnet-policy`, `ip6 podnet-policy`), elements are keyed
//! by a pod on this node first, so each local pod's elements are its own
//! ([`pod_elements`]) and a change re-plans the local pods it touches:
//!
//! | set | key | holds |
//! |---|---|---|
//! | `pods` | addr | this node's pods the agent has programmed |
//! | `in-isolated` | addr | local pods isolated for ingress |
//! | `in-pod-all` | dst . src | a pod peer, every port |
//! | `in-pod-port` | dst . src . proto . port | a pod peer, one port |
//! | `in-net-all` | dst . src net | an ipBlock (or any source), every port |
//! | `in-net-port` | dst . src net . proto . port range | an ipBlock, any source, or a port range |
//!
//! and the same for egress (`eg-*`, keyed source first). The `*-net-*`
//! sets are interval sets (concatenated ranges); their elements are made
//! disjoint here, since the kernel refuses overlapping ones. The kernel
//! deletes their elements at a cost of the shard's size each, so a change
//! that would delete many from one shard (a policy with thousands of
//! ipBlocks going away) rebuilds that shard's set in its batch instead:
//! the one case where a change rewrites chains (the shard's own, three
//! rules), see `podnet_nft::diff::bound_pipapo_deletes`.
//!
//! Fail closed: a new connection from or to an address in this node's pod
//! subnet that is not in `pods` is dropped (and logged as "unknown"), so a
//! pod the agent has not programmed yet is never reachable unjudged.
//!
//! Packets conntrack finds `invalid` (a stray RST or FIN, an ICMP error
//! about no connection) to or from an isolated pod are dropped and counted
//! ([`COUNTER_INVALID`]), as Calico does: they build no connection, but
//! would let anyone reset the pod's connections or talk to it covertly.
//! They are not logged (nothing about them names a flow a policy denies).
//! Replies of allowed connections are `established`, never `invalid`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use podnet_nft::model::{
    Chain, ChainType, ElemData, Expr, Family, Field, Hook, KeyType, Proto, Rule, Set, Table, Value,
    Verdict,
};

use crate::world::{in_block, Dir, Key, Peer, PodView, PortMatch, World};

/// The table's name in both families.
pub const TABLE: &str = "podnet-policy";
/// The NFLOG group denied connections are logged to.
pub const LOG_GROUP: u16 = 100;
/// The log prefixes, one per cause.
pub const PREFIX_INGRESS: &str = "podnet-policy ingress";
pub const PREFIX_EGRESS: &str = "podnet-policy egress";
pub const PREFIX_UNKNOWN: &str = "podnet-policy unknown";

/// How many shards the interval sets are cut into, per direction. The
/// kernel's concatenated-range sets (pipapo) copy their whole lookup data
/// on the first change in a transaction, so a change costs the set's size:
/// each local pod's interval elements live in shard [`shard`] of its
/// address, reached through a verdict map with one element per isolated
/// pod, and a change copies one shard, not all of them.
pub const SHARDS: u16 = 256;

/// The shard of a local pod's address.
pub fn shard(ip: IpAddr) -> u16 {
    let low = match ip {
        IpAddr::V4(a) => u32::from(a),
        IpAddr::V6(a) => u128::from(a) as u32,
    };
    (low % SHARDS as u32) as u16
}

/// One of the table's sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetId {
    Pods,
    InIsolated,
    InPodAll,
    InPodPort,
    /// Verdict map: isolated local pod → `goto in-net-<shard>`.
    InShard,
    InNetAll(u16),
    InNetPort(u16),
    EgIsolated,
    EgPodAll,
    EgPodPort,
    EgShard,
    EgNetAll(u16),
    EgNetPort(u16),
}

impl SetId {
    /// Every set of the table.
    pub fn all() -> Vec<SetId> {
        let mut v = vec![
            SetId::Pods,
            SetId::InIsolated,
            SetId::InPodAll,
            SetId::InPodPort,
            SetId::InShard,
            SetId::EgIsolated,
            SetId::EgPodAll,
            SetId::EgPodPort,
            SetId::EgShard,
        ];
        for k in 0..SHARDS {
            v.extend([
                SetId::InNetAll(k),
                SetId::InNetPort(k),
                SetId::EgNetAll(k),
                SetId::EgNetPort(k),
            ]);
        }
        v
    }

    pub fn name(self) -> String {
        match self {
            SetId::Pods => "pods".into(),
            SetId::InIsolated => "in-isolated".into(),
            SetId::InPodAll => "in-pod-all".into(),
            SetId::InPodPort => "in-pod-port".into(),
            SetId::InShard => "in-net-shard".into(),
            SetId::InNetAll(k) => format!("in-net-all-{k}"),
            SetId::InNetPort(k) => format!("in-net-port-{k}"),
            SetId::EgIsolated => "eg-isolated".into(),
            SetId::EgPodAll => "eg-pod-all".into(),
            SetId::EgPodPort => "eg-pod-port".into(),
            SetId::EgShard => "eg-net-shard".into(),
            SetId::EgNetAll(k) => format!("eg-net-all-{k}"),
            SetId::EgNetPort(k) => format!("eg-net-port-{k}"),
        }
    }

    /// The set's kind without its shard (for metrics).
    pub fn kind(self) -> &'static str {
        match self {
            SetId::Pods => "pods",
            SetId::InIsolated => "in-isolated",
            SetId::InPodAll => "in-pod-all",
            SetId::InPodPort => "in-pod-port",
            SetId::InShard => "in-net-shard",
            SetId::InNetAll(_) => "in-net-all",
            SetId::InNetPort(_) => "in-net-port",
            SetId::EgIsolated => "eg-isolated",
            SetId::EgPodAll => "eg-pod-all",
            SetId::EgPodPort => "eg-pod-port",
            SetId::EgShard => "eg-net-shard",
            SetId::EgNetAll(_) => "eg-net-all",
            SetId::EgNetPort(_) => "eg-net-port",
        }
    }

    /// Whether it is an interval set (concatenated: the kernel's pipapo).
    pub fn interval(self) -> bool {
        matches!(
            self,
            SetId::InNetAll(_) | SetId::InNetPort(_) | SetId::EgNetAll(_) | SetId::EgNetPort(_)
        )
    }

    /// The declaration in family `v6` or not.
    pub fn decl(self, v6: bool) -> Set {
        let a = if v6 {
            KeyType::Ipv6Addr
        } else {
            KeyType::Ipv4Addr
        };
        let key = match self {
            SetId::Pods | SetId::InIsolated | SetId::EgIsolated => vec![a],
            SetId::InShard | SetId::EgShard => return Set::map(vec![a]),
            SetId::InPodAll | SetId::EgPodAll | SetId::InNetAll(_) | SetId::EgNetAll(_) => {
                vec![a, a]
            }
            SetId::InPodPort | SetId::EgPodPort | SetId::InNetPort(_) | SetId::EgNetPort(_) => {
                vec![a, a, KeyType::InetProto, KeyType::InetService]
            }
        };
        let mut s = Set::new(key);
        s.interval = self.interval();
        s
    }
}

/// One element: a set and its key, packed (no heap): a node holds
/// hundreds of thousands of them at 10,000 pods × 10,000 policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Elem {
    pub set: SetId,
    /// The local pod's address: every key's first field.
    pub local: IpAddr,
    /// The remote end: an address (a full prefix) in the `*-pod-*` sets, a
    /// prefix in the `*-net-*` sets; none in the one-field sets.
    pub remote: Option<IpNet>,
    pub proto: Option<Proto>,
    /// The port range (one port: `from == to`).
    pub ports: (u16, u16),
}

impl podnet_nft::sync::Element for Elem {
    fn set_name(&self) -> String {
        self.set.name()
    }
    fn key(&self) -> Vec<Value> {
        Elem::key(self)
    }
    fn data(&self) -> Option<ElemData> {
        Elem::data(self)
    }
}

impl Elem {
    fn one(set: SetId, local: IpAddr) -> Elem {
        Elem {
            set,
            local,
            remote: None,
            proto: None,
            ports: (0, 0),
        }
    }

    /// Whether it belongs to the `ip6` table.
    pub fn v6(&self) -> bool {
        self.local.is_ipv6()
    }

    /// A verdict map element's verdict: the shard chain of the pod.
    pub fn data(&self) -> Option<ElemData> {
        let dir = match self.set {
            SetId::InShard => "in",
            SetId::EgShard => "eg",
            _ => return None,
        };
        Some(ElemData::Verdict(Verdict::Goto(format!(
            "{dir}-net-{}",
            shard(self.local)
        ))))
    }

    /// The key as the set holds it.
    pub fn key(&self) -> Vec<Value> {
        let mut k = vec![Value::Addr(self.local)];
        let Some(r) = self.remote else {
            return k;
        };
        k.push(match self.set.interval() {
            true => Value::Net(r).canonical(),
            false => Value::Addr(r.addr()),
        });
        if let Some(p) = self.proto {
            k.push(Value::Proto(p));
            k.push(iv_port(self.ports.0, self.ports.1));
        }
        k
    }
}

/// A port range as a field of an interval set.
fn iv_port(a: u16, b: u16) -> Value {
    if a == b {
        Value::Port(a)
    } else {
        Value::PortRange(a, b)
    }
}

/// Whether pod `v` is on `node` with an address policies can judge.
pub fn is_local(v: &PodView, node: &str) -> bool {
    !v.host_network && !v.ips.is_empty() && v.node.as_deref() == Some(node)
}

fn any_net(v6: bool) -> IpNet {
    if v6 {
        "::/0".parse().expect("net")
    } else {
        "0.0.0.0/0".parse().expect("net")
    }
}

/// `cidr` minus `except`, as disjoint prefixes.
pub fn block_nets(cidr: &IpNet, except: &[IpNet]) -> Vec<IpNet> {
    let mut out = vec![cidr.trunc()];
    for x in except {
        let x = x.trunc();
        let mut next = Vec::new();
        for n in out {
            if x.contains(&n) {
                continue;
            }
            if !n.contains(&x) {
                next.push(n);
                continue;
            }
            // Split n until x is cut out: the halves not holding x stay.
            let mut cur = n;
            while cur.prefix_len() < x.prefix_len() {
                let halves: Vec<IpNet> = cur
                    .subnets(cur.prefix_len() + 1)
                    .expect("subnets")
                    .collect();
                for h in halves {
                    if h.contains(&x) {
                        cur = h;
                    } else {
                        next.push(h);
                    }
                }
            }
        }
        out = next;
    }
    out
}

/// The largest prefixes of `nets`: nested ones dropped, duplicates merged;
/// sorted. Sorted by network and then by length, a prefix is nested in an
/// earlier kept one only if it is nested in the last kept one (kept
/// prefixes are disjoint), so this costs a sort, not `nets`² (a policy may
/// name 10,000 ipBlocks).
fn maximal(mut nets: Vec<IpNet>) -> Vec<IpNet> {
    for n in nets.iter_mut() {
        *n = n.trunc();
    }
    nets.sort_unstable();
    nets.dedup();
    let mut out: Vec<IpNet> = Vec::with_capacity(nets.len());
    for n in nets {
        match out.last() {
            Some(l) if l.contains(&n) => {}
            _ => out.push(n),
        }
    }
    out
}

/// Boxes (net, proto, from, to) made disjoint, as the kernel's interval
/// sets need: per protocol, the port axis is cut at every box edge; in each
/// piece only the largest prefixes stay; pieces of one prefix that touch
/// are merged again. The pieces are swept in order with the boxes covering
/// the current one kept sorted, so each piece costs the boxes covering it
/// (not every box, and no sort).
fn disjoint_boxes(boxes: &[(IpNet, Proto, u16, u16)]) -> Vec<(IpNet, Proto, u16, u16)> {
    let mut out = Vec::new();
    let protos: BTreeSet<Proto> = boxes.iter().map(|b| b.1).collect();
    for p in protos {
        // Per cut: the boxes that start there and those that end before it.
        let mut starts: BTreeMap<u32, Vec<IpNet>> = BTreeMap::new();
        let mut ends: BTreeMap<u32, Vec<IpNet>> = BTreeMap::new();
        for b in boxes.iter().filter(|b| b.1 == p) {
            let n = b.0.trunc();
            starts.entry(b.2 as u32).or_default().push(n);
            ends.entry(b.3 as u32 + 1).or_default().push(n);
        }
        let cuts: Vec<u32> = starts.keys().chain(ends.keys()).copied().collect();
        let cuts: Vec<u32> = cuts
            .into_iter()
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .collect();
        // The boxes covering the current piece, with their multiplicity.
        let mut active: BTreeMap<IpNet, u32> = BTreeMap::new();
        // net → ranges, in order.
        let mut per_net: BTreeMap<IpNet, Vec<(u32, u32)>> = BTreeMap::new();
        for w in cuts.windows(2) {
            let (lo, hi) = (w[0], w[1] - 1);
            for n in ends.get(&lo).into_iter().flatten() {
                if let Some(c) = active.get_mut(n) {
                    *c -= 1;
                    if *c == 0 {
                        active.remove(n);
                    }
                }
            }
            for n in starts.get(&lo).into_iter().flatten() {
                *active.entry(*n).or_insert(0) += 1;
            }
            // `active` is sorted: its largest prefixes in one pass.
            let mut last: Option<IpNet> = None;
            for n in active.keys() {
                if last.is_some_and(|l| l.contains(n)) {
                    continue;
                }
                last = Some(*n);
                let rs = per_net.entry(*n).or_default();
                match rs.last_mut() {
                    Some(r) if r.1 + 1 == lo => r.1 = hi,
                    _ => rs.push((lo, hi)),
                }
            }
        }
        for (n, rs) in per_net {
            for (lo, hi) in rs {
                out.push((n, p, lo as u16, hi as u16));
            }
        }
    }
    out
}

/// What one local address admits in one direction, before it becomes
/// elements.
#[derive(Default)]
struct Admits {
    pod_all: BTreeSet<IpAddr>,
    pod_port: BTreeSet<(IpAddr, Proto, u16)>,
    net_all: Vec<IpNet>,
    net_port: Vec<(IpNet, Proto, u16, u16)>,
}

/// An ipBlock: a prefix and its exceptions.
type Block = (IpNet, Vec<IpNet>);

/// A port match as a range, resolved on `dst` for a named port.
fn resolve(m: &PortMatch, dst: Option<&PodView>) -> Option<(Proto, u16, u16)> {
    match m {
        PortMatch::Proto(p) => Some((*p, 0, 65535)),
        PortMatch::Range(p, a, b) => Some((*p, *a, *b)),
        PortMatch::Named(p, n) => dst
            .and_then(|d| d.named(n, *p))
            .map(|port| (*p, port, port)),
    }
}

fn admits(w: &World, k: &Key, v: &PodView, ip: IpAddr, dir: Dir) -> Option<Admits> {
    let v6 = ip.is_ipv6();
    let same = |a: &IpAddr| a.is_ipv6() == v6;
    let mut isolated = false;
    let mut a = Admits::default();
    for p in w.selecting(k, v) {
        let rules = match dir {
            Dir::Ingress => &p.ingress,
            Dir::Egress => &p.egress,
        };
        let Some(rules) = rules else { continue };
        isolated = true;
        for r in rules {
            // The remote ends this rule names.
            let (pods, nets): (Vec<(&Key, &PodView)>, Vec<Block>) = match &r.peers {
                None => (Vec::new(), vec![(any_net(v6), Vec::new())]),
                Some(peers) => {
                    let mut pods = Vec::new();
                    let mut nets = Vec::new();
                    for peer in peers {
                        match peer {
                            Peer::Block { cidr, except } => {
                                if matches!(cidr, IpNet::V6(_)) == v6 {
                                    nets.push((*cidr, except.clone()));
                                }
                            }
                            Peer::Pods { .. } => pods.extend(w.peer_pods(peer, &p.key.ns)),
                        }
                    }
                    (pods, nets)
                }
            };
            let flat_nets = || {
                nets.iter()
                    .flat_map(|(c, x)| block_nets(c, x))
                    .collect::<Vec<_>>()
            };
            match &r.ports {
                None => {
                    for (_, pv) in &pods {
                        a.pod_all.extend(pv.ips.iter().filter(|x| same(x)));
                    }
                    a.net_all.extend(flat_nets());
                }
                Some(ms) => {
                    for m in ms {
                        match (dir, m) {
                            // Egress to a named port: resolved on each
                            // destination pod.
                            (Dir::Egress, PortMatch::Named(proto, name)) => {
                                for (_, pv) in &pods {
                                    if let Some(port) = pv.named(name, *proto) {
                                        for rip in pv.ips.iter().filter(|x| same(x)) {
                                            a.pod_port.insert((*rip, *proto, port));
                                        }
                                    }
                                }
                                if !nets.is_empty() {
                                    for (_, pv) in w.pods_with_port(name, *proto) {
                                        let port = pv.named(name, *proto).expect("has port");
                                        for rip in pv.ips.iter().filter(|x| same(x)) {
                                            if nets.iter().any(|(c, x)| in_block(*rip, c, x)) {
                                                a.pod_port.insert((*rip, *proto, port));
                                            }
                                        }
                                    }
                                }
                            }
                            _ => {
                                let dst = match dir {
                                    Dir::Ingress => Some(v),
                                    Dir::Egress => None,
                                };
                                let Some((proto, lo, hi)) = resolve(m, dst) else {
                                    continue;
                                };
                                for (_, pv) in &pods {
                                    for rip in pv.ips.iter().filter(|x| same(x)) {
                                        if lo == hi {
                                            a.pod_port.insert((*rip, proto, lo));
                                        } else {
                                            a.net_port.push((IpNet::from(*rip), proto, lo, hi));
                                        }
                                    }
                                }
                                for n in flat_nets() {
                                    a.net_port.push((n, proto, lo, hi));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    isolated.then_some(a)
}

/// The elements local pod `k` owns: its `pods` entry, and per address and
/// direction its isolation and what it admits. Empty for a pod that is not
/// on `node`.
pub fn pod_elements(w: &World, node: &str, k: &Key, v: &PodView) -> Vec<Elem> {
    let mut out = Vec::new();
    if !is_local(v, node) {
        return out;
    }
    for &ip in &v.ips {
        out.push(Elem::one(SetId::Pods, ip));
        for dir in [Dir::Ingress, Dir::Egress] {
            let Some(a) = admits(w, k, v, ip, dir) else {
                continue;
            };
            let k = shard(ip);
            let (iso, pod_all, pod_port, to_shard, net_all, net_port) = match dir {
                Dir::Ingress => (
                    SetId::InIsolated,
                    SetId::InPodAll,
                    SetId::InPodPort,
                    SetId::InShard,
                    SetId::InNetAll(k),
                    SetId::InNetPort(k),
                ),
                Dir::Egress => (
                    SetId::EgIsolated,
                    SetId::EgPodAll,
                    SetId::EgPodPort,
                    SetId::EgShard,
                    SetId::EgNetAll(k),
                    SetId::EgNetPort(k),
                ),
            };
            let e = |set, remote: IpNet, proto, ports| Elem {
                set,
                local: ip,
                remote: Some(remote),
                proto,
                ports,
            };
            out.push(Elem::one(iso, ip));
            out.push(Elem::one(to_shard, ip));
            for r in &a.pod_all {
                out.push(e(pod_all, IpNet::from(*r), None, (0, 0)));
            }
            for (r, p, port) in &a.pod_port {
                out.push(e(pod_port, IpNet::from(*r), Some(*p), (*port, *port)));
            }
            for n in maximal(a.net_all) {
                out.push(e(net_all, n, None, (0, 0)));
            }
            for (n, p, lo, hi) in disjoint_boxes(&a.net_port) {
                out.push(e(net_port, n, Some(p), (lo, hi)));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// How denied connections are logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLimit {
    /// Log lines per second, per table (the rest are counted, not logged).
    pub rate: u64,
    pub burst: u32,
}

impl Default for LogLimit {
    fn default() -> Self {
        LogLimit {
            rate: 100,
            burst: 200,
        }
    }
}

/// The named counters: every denial per cause, and the log lines the rate
/// limit suppressed.
pub const COUNTER_INGRESS: &str = "denied-ingress";
pub const COUNTER_EGRESS: &str = "denied-egress";
pub const COUNTER_UNKNOWN: &str = "denied-unknown";
pub const COUNTER_INVALID: &str = "denied-invalid";
pub const COUNTER_SUPPRESSED: &str = "log-suppressed";

fn deny_chain(counter: &str, prefix: &str, limit: LogLimit) -> Chain {
    Chain {
        base: None,
        rules: vec![
            Rule::new(vec![Expr::CounterRef(counter.into())]),
            Rule::new(vec![
                Expr::Limit {
                    rate: limit.rate,
                    burst: limit.burst,
                    over: true,
                },
                Expr::CounterRef(COUNTER_SUPPRESSED.into()),
                Expr::Verdict(Verdict::Drop),
            ]),
            Rule::new(vec![
                Expr::Log {
                    group: LOG_GROUP,
                    prefix: prefix.into(),
                },
                Expr::Verdict(Verdict::Drop),
            ]),
        ],
    }
}

/// `judge-invalid`: packets conntrack finds invalid, to or from an
/// isolated pod, go to `deny-invalid`, which counts and drops them.
fn invalid_chains(t: &mut Table, saddr: Field, daddr: Field) {
    let invalid = |f: Field, set: SetId| {
        Rule::new(vec![
            Expr::InSet {
                keys: vec![f],
                set: set.name(),
                neg: false,
            },
            Expr::Verdict(Verdict::Goto("deny-invalid".into())),
        ])
    };
    t.chains.insert(
        "judge-invalid".into(),
        Chain {
            base: None,
            rules: vec![
                invalid(daddr, SetId::InIsolated),
                invalid(saddr, SetId::EgIsolated),
            ],
        },
    );
    t.chains.insert(
        "deny-invalid".into(),
        Chain {
            base: None,
            rules: vec![Rule::new(vec![
                Expr::CounterRef(COUNTER_INVALID.into()),
                Expr::Verdict(Verdict::Drop),
            ])],
        },
    );
}

/// The table with its chains and empty sets. `subnets` are this node's pod
/// subnets (of this family), for failing closed.
pub fn skeleton(v6: bool, subnets: &[IpNet], limit: LogLimit) -> Table {
    let fam = if v6 { Family::Ip6 } else { Family::Ip };
    let (saddr, daddr) = if v6 {
        (Field::Ip6Saddr, Field::Ip6Daddr)
    } else {
        (Field::IpSaddr, Field::IpDaddr)
    };
    let subnets: Vec<IpNet> = subnets
        .iter()
        .filter(|n| matches!(n, IpNet::V6(_)) == v6)
        .copied()
        .collect();
    let mut t = Table::new(fam, TABLE);
    for s in SetId::all() {
        t.sets.insert(s.name(), s.decl(v6));
    }
    for c in [
        COUNTER_INGRESS,
        COUNTER_EGRESS,
        COUNTER_UNKNOWN,
        COUNTER_INVALID,
        COUNTER_SUPPRESSED,
    ] {
        t.counters.insert(c.into());
    }
    hook_chains(&mut t);
    invalid_chains(&mut t, saddr, daddr);
    judge_chains(&mut t, saddr, daddr, &subnets);
    direction_chains(&mut t, v6, "egress", saddr, daddr);
    direction_chains(&mut t, v6, "ingress", daddr, saddr);
    t.chains.insert(
        "deny-egress".into(),
        deny_chain(COUNTER_EGRESS, PREFIX_EGRESS, limit),
    );
    t.chains.insert(
        "deny-ingress".into(),
        deny_chain(COUNTER_INGRESS, PREFIX_INGRESS, limit),
    );
    t.chains.insert(
        "deny-unknown".into(),
        deny_chain(COUNTER_UNKNOWN, PREFIX_UNKNOWN, limit),
    );
    t
}

/// The two base chains: new connections (and invalid packets) that are
/// forwarded or reach this node go to be judged.
fn hook_chains(t: &mut Table) {
    let jump = |c: &str| Expr::Verdict(Verdict::Jump(c.into()));
    // After the service proxy's filter chains (priority 0): the
    // destination is the endpoint, after DNAT.
    t.chains.insert(
        "forward".into(),
        Chain::base(ChainType::Filter, Hook::Forward, 10).with_rules(vec![
            Rule::new(vec![Expr::CtStateInvalid, jump("judge-invalid")]),
            Rule::new(vec![Expr::CtStateNew, jump("judge")]),
        ]),
    );
    t.chains.insert(
        "input".into(),
        Chain::base(ChainType::Filter, Hook::Input, 10)
            .with_rules(vec![Rule::new(vec![Expr::CtStateNew, jump("judge-input")])]),
    );
}

/// Fail closed: an address of field `f` in the pod subnet `n` that is not
/// a programmed pod goes to `deny-unknown`.
fn unknown_pod(f: Field, n: IpNet) -> Rule {
    Rule::new(vec![
        Expr::Cmp {
            field: f,
            neg: false,
            value: Value::Net(n),
        },
        Expr::InSet {
            keys: vec![f],
            set: SetId::Pods.name(),
            neg: true,
        },
        Expr::Verdict(Verdict::Goto("deny-unknown".into())),
    ])
}

/// An isolated pod (field `f` in `set`) is judged in chain `dir`.
fn isolated(f: Field, set: SetId, dir: &str) -> Rule {
    Rule::new(vec![
        Expr::InSet {
            keys: vec![f],
            set: set.name(),
            neg: false,
        },
        Expr::Verdict(Verdict::Jump(dir.into())),
    ])
}

/// `judge` (forwarded connections: both ends' pods) and `judge-input`
/// (connections to this node: the source pod's egress only). `subnets` are
/// this node's pod subnets of the table's family.
fn judge_chains(t: &mut Table, saddr: Field, daddr: Field, subnets: &[IpNet]) {
    let mut judge = Vec::new();
    for n in subnets {
        for f in [saddr, daddr] {
            judge.push(unknown_pod(f, *n));
        }
    }
    judge.push(isolated(saddr, SetId::EgIsolated, "egress"));
    judge.push(isolated(daddr, SetId::InIsolated, "ingress"));
    // Pods' traffic to this node's own addresses meets the input hook, not
    // forward: judged for the pod's egress (and failing closed) there too.
    // What the node sends itself is never judged.
    let mut judge_input = vec![Rule::new(vec![
        Expr::FibSaddrLocal,
        Expr::Verdict(Verdict::Return),
    ])];
    for n in subnets {
        judge_input.push(unknown_pod(saddr, *n));
    }
    judge_input.push(isolated(saddr, SetId::EgIsolated, "egress"));
    t.chains.insert(
        "judge".into(),
        Chain {
            base: None,
            rules: judge,
        },
    );
    t.chains.insert(
        "judge-input".into(),
        Chain {
            base: None,
            rules: judge_input,
        },
    );
}

/// One lookup rule: allowed, so back to `judge`.
fn lookup(v6: bool, local: Field, remote: Field, set: SetId) -> Rule {
    let keys = match set.decl(v6).key.len() {
        2 => vec![local, remote],
        _ => vec![local, remote, Field::L4Proto, Field::Dport],
    };
    Rule::new(vec![
        Expr::InSet {
            keys,
            set: set.name(),
            neg: false,
        },
        Expr::Verdict(Verdict::Return),
    ])
}

/// One direction's chains (`dir` is "egress" or "ingress"; `local` is the
/// field that holds this node's pod): the exact pod peers, then the pod's
/// shard of ranges, each ending in `deny-{dir}`.
fn direction_chains(t: &mut Table, v6: bool, dir: &str, local: Field, remote: Field) {
    let ingress = dir == "ingress";
    let (pod_all, pod_port, to_shard) = if ingress {
        (SetId::InPodAll, SetId::InPodPort, SetId::InShard)
    } else {
        (SetId::EgPodAll, SetId::EgPodPort, SetId::EgShard)
    };
    let deny = Rule::new(vec![Expr::Verdict(Verdict::Goto(format!("deny-{dir}")))]);
    // Exact pod peers in hash sets, then the pod's shard of ranges.
    t.chains.insert(
        dir.into(),
        Chain {
            base: None,
            rules: vec![
                lookup(v6, local, remote, pod_all),
                lookup(v6, local, remote, pod_port),
                Rule::new(vec![Expr::VMap {
                    keys: vec![local],
                    map: to_shard.name(),
                }]),
                deny.clone(),
            ],
        },
    );
    // Reached by `goto`: a `return` goes back to `judge`.
    for k in 0..SHARDS {
        let (all, port) = if ingress {
            (SetId::InNetAll(k), SetId::InNetPort(k))
        } else {
            (SetId::EgNetAll(k), SetId::EgNetPort(k))
        };
        t.chains.insert(
            format!("{}-net-{k}", &dir[..2]),
            Chain {
                base: None,
                rules: vec![
                    lookup(v6, local, remote, all),
                    lookup(v6, local, remote, port),
                    deny.clone(),
                ],
            },
        );
    }
}

/// Adds elements to their sets in `t` (those of `t`'s family).
pub fn fill<'a>(t: &mut Table, elems: impl IntoIterator<Item = &'a Elem>) {
    let v6 = t.family == Family::Ip6;
    for e in elems {
        if e.v6() != v6 {
            continue;
        }
        if let Some(s) = t.sets.get_mut(&e.set.name()) {
            s.elements.insert(e.key(), e.data());
        }
    }
}

/// The whole table for `node`: every local pod's elements (for full syncs
/// and the tracer tests).
pub fn table(w: &World, node: &str, v6: bool, subnets: &[IpNet], limit: LogLimit) -> Table {
    let mut t = skeleton(v6, subnets, limit);
    for (k, v) in &w.pods {
        fill(&mut t, &pod_elements(w, node, k, v));
    }
    t
}

#[cfg(test)]
mod cost_tests {
    //! The interval planning against its pairwise definition: the same
    //! elements, whatever the input's size or order.
    use super::*;

    /// A deterministic stream of prefixes in 10.0.0.0/16, nested and
    /// repeated often.
    fn nets(n: usize, seed: u64) -> Vec<IpNet> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let len = 16 + ((x >> 40) % 17) as u8;
                let addr = 0x0a00_0000u32 | ((x >> 20) as u32 & 0xffff);
                IpNet::new(IpAddr::from(addr.to_be_bytes()), len)
                    .unwrap()
                    .trunc()
            })
            .collect()
    }

    /// The definition: every prefix no other one holds, once, sorted.
    fn maximal_pairwise(nets: &[IpNet]) -> Vec<IpNet> {
        let mut out: Vec<IpNet> = nets
            .iter()
            .filter(|n| !nets.iter().any(|o| o != *n && o.contains(*n)))
            .copied()
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The definition: per protocol and port, the largest prefixes of the
    /// boxes holding that port, runs of ports merged.
    fn boxes_pointwise(boxes: &[(IpNet, Proto, u16, u16)]) -> Vec<(IpNet, Proto, u16, u16)> {
        let mut per: BTreeMap<(IpNet, Proto), Vec<(u16, u16)>> = BTreeMap::new();
        let protos: BTreeSet<Proto> = boxes.iter().map(|b| b.1).collect();
        for p in protos {
            for port in 0..=u16::MAX {
                let nets: Vec<IpNet> = boxes
                    .iter()
                    .filter(|b| b.1 == p && b.2 <= port && port <= b.3)
                    .map(|b| b.0)
                    .collect();
                for n in maximal_pairwise(&nets) {
                    let rs = per.entry((n, p)).or_default();
                    match rs.last_mut() {
                        Some(r) if r.1 as u32 + 1 == port as u32 => r.1 = port,
                        _ => rs.push((port, port)),
                    }
                }
            }
        }
        let mut out: Vec<_> = per
            .into_iter()
            .flat_map(|((n, p), rs)| rs.into_iter().map(move |(a, b)| (n, p, a, b)))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn maximal_keeps_exactly_the_prefixes_no_other_holds() {
        for (n, seed) in [(0, 1), (1, 2), (50, 3), (400, 4), (2000, 5)] {
            let v = nets(n, seed);
            assert_eq!(maximal(v.clone()), maximal_pairwise(&v), "{n} prefixes");
            let mut rev = v.clone();
            rev.reverse();
            assert_eq!(maximal(rev), maximal_pairwise(&v), "{n} prefixes, reversed");
        }
        // Across families nothing nests.
        let mixed: Vec<IpNet> = ["::/0", "10.0.0.0/8", "10.1.0.0/16", "fd00::/8"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(
            maximal(mixed),
            vec!["10.0.0.0/8".parse().unwrap(), "::/0".parse().unwrap()]
        );
    }

    #[test]
    fn disjoint_boxes_are_the_pointwise_largest_prefixes() {
        let ns = nets(60, 7);
        let mut x = 11u64;
        let mut boxes = Vec::new();
        for (i, n) in ns.iter().enumerate() {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            let lo = (x >> 33) as u16 % 200;
            let hi = lo + (x >> 50) as u16 % 40;
            let p = if i % 3 == 0 { Proto::Udp } else { Proto::Tcp };
            boxes.push((*n, p, lo, hi));
        }
        // A full range and a single port among them.
        boxes.push(("10.0.0.0/16".parse().unwrap(), Proto::Tcp, 0, 65535));
        boxes.push(("10.0.3.0/24".parse().unwrap(), Proto::Udp, 65535, 65535));
        let mut got = disjoint_boxes(&boxes);
        got.sort();
        assert_eq!(got, boxes_pointwise(&boxes));
    }

    #[test]
    fn a_policy_with_ten_thousand_ip_blocks_plans_one_element_each() {
        let mut w = World::new();
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "x", "labels": {"app": "a"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
            "status": {"podIP": "10.9.1.2", "podIPs": [{"ip": "10.9.1.2"}]}
        }))
        .unwrap();
        let key = Key::new("x", "a");
        w.set_pod(key.clone(), Some(PodView::of(&pod)));
        let from: Vec<serde_json::Value> = (0..10_000)
            .map(|i| serde_json::json!({"ipBlock": {"cidr": format!("11.{}.{}.0/24", i >> 8, i & 255)}}))
            .collect();
        let np: k8s_openapi::api::networking::v1::NetworkPolicy =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "big", "namespace": "x"},
                "spec": {"podSelector": {}, "ingress": [
                    {"from": from.clone()},
                    {"from": from, "ports": [{"protocol": "TCP", "port": 443}]}]}
            }))
            .unwrap();
        let c = crate::world::Policy::compile(&np).unwrap();
        w.set_policy(c.key.clone(), Some(c));
        let v = w.pods[&key].clone();
        let es = pod_elements(&w, "n1", &key, &v);
        let k = shard("10.9.1.2".parse().unwrap());
        let all = es.iter().filter(|e| e.set == SetId::InNetAll(k)).count();
        let port: Vec<&Elem> = es.iter().filter(|e| e.set == SetId::InNetPort(k)).collect();
        assert_eq!(all, 10_000);
        assert_eq!(port.len(), 10_000);
        assert!(port
            .iter()
            .all(|e| e.proto == Some(Proto::Tcp) && e.ports == (443, 443)));
        assert_eq!(
            port[0].remote,
            Some("11.0.0.0/24".parse().unwrap()),
            "elements come sorted"
        );
    }
}
