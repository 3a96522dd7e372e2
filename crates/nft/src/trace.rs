//! A packet tracer over the typed model, for unit tests without root: a flow
//! goes in (source, destination, protocol, port), and out come the verdict,
//! the DNAT target and whether it was masqueraded, with the chains it
//! passed. It follows netfilter's order: prerouting (or output, for local
//! traffic), then forward or input, then postrouting; base chains of one
//! hook run by priority; `jump` returns, `goto` does not.
//!
//! `numgen random` draws from a caller-supplied picker, so a test can walk
//! every branch; `update @set` and `add @set` add to a per-trace copy of
//! dynamic sets, so affinity can be traced across packets with [`Tracer`],
//! and named counters count in [`Tracer::counters`].
//!
//! `log` records its prefix in [`Outcome::logs`] and goes on, as the kernel
//! does, so a test sees which policy rules a packet was logged by. `limit`
//! sees every packet within its rate unless [`Tracer::over_limit`] says the
//! flow is over it, so both sides of a rate limit can be walked.
//!
//! Set lookups match ranges as the kernel does: an address inside an
//! element's prefix, a port inside its port range.
//!
//! A packet may name the interfaces it came in and goes out on, its source
//! MAC and its packet type, for the CNI plugins' and the lab gateway's
//! tables; in an `inet` table, IPv4 fields match IPv4 packets only.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::model::{ChainType, ElemData, Expr, Field, Hook, Proto, Table, Value, Verdict};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: Proto,
    pub dport: u16,
    /// The source port (0 when it does not matter).
    pub sport: u16,
    pub mark: u32,
    /// The interface it arrived on (`iifname`), if any.
    pub iif: Option<String>,
    /// The interface it leaves by (`oifname`), if known.
    pub oif: Option<String>,
    /// Its source MAC (`ether saddr`), if it is a frame.
    pub src_mac: Option<[u8; 6]>,
    /// `meta pkttype`: 0 for a frame addressed to this host's MAC.
    pub pkttype: u8,
    /// What only some tables read: the frame's layer 2 (the guard's
    /// bridge table), ICMPv6, conntrack's state.
    pub extra: Extra,
}

/// The less common parts of a [`Packet`], all absent by default: an IP
/// packet of its addresses' family, TCP/UDP/SCTP by `proto`, tracked as
/// the first packet of a new connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extra {
    /// `ether type`; none: IPv4 or IPv6 by the addresses. Other types
    /// (ARP, a VLAN tag) have no IP header: the IP fields read nothing.
    pub ether_type: Option<u16>,
    /// `meta iifgroup`: the netdev group of the port it came in on.
    pub iif_group: u32,
    /// An ARP packet's sender hardware and protocol addresses.
    pub arp: Option<([u8; 6], Ipv4Addr)>,
    /// An ICMPv6 packet (instead of `proto`): its type and, for neighbour
    /// discovery, its target address.
    pub icmp6: Option<(u8, Option<Ipv6Addr>)>,
    /// Conntrack found no connection for it (`ct state invalid`).
    pub ct_invalid: bool,
}

/// The ether types the tracer knows.
pub const ETH_IP: u16 = 0x0800;
pub const ETH_ARP: u16 = 0x0806;
pub const ETH_IP6: u16 = 0x86dd;
pub const ETH_VLAN: u16 = 0x8100;

impl Packet {
    /// From address literals (tests).
    pub fn new(src: &str, dst: &str, proto: Proto, dport: u16) -> Packet {
        Packet::between(
            src.parse().expect("src ip"),
            dst.parse().expect("dst ip"),
            proto,
            dport,
        )
    }

    /// A routed packet of a new flow, with nothing else known.
    pub fn between(src: IpAddr, dst: IpAddr, proto: Proto, dport: u16) -> Packet {
        Packet {
            src,
            dst,
            proto,
            dport,
            sport: 0,
            mark: 0,
            iif: None,
            oif: None,
            src_mac: None,
            pkttype: 0,
            extra: Extra::default(),
        }
    }

    /// The ether type the frame carries.
    pub fn ether_type(&self) -> u16 {
        match self.extra.ether_type {
            Some(t) => t,
            None if self.src.is_ipv4() => ETH_IP,
            None => ETH_IP6,
        }
    }

    /// An ARP packet from port `port` of netdev group `group`, from MAC
    /// `mac`, claiming `sha` is at `spa` (its IP addresses are `spa` and
    /// `0.0.0.0`).
    pub fn arp(group: u32, port: &str, mac: [u8; 6], sha: [u8; 6], spa: Ipv4Addr) -> Packet {
        let mut p = Packet::new(&spa.to_string(), "0.0.0.0", Proto::Udp, 0)
            .on(port)
            .from_mac(mac);
        p.extra.ether_type = Some(ETH_ARP);
        p.extra.iif_group = group;
        p.extra.arp = Some((sha, spa));
        p
    }

    /// The same packet as a frame entering a bridge on port `port` (of
    /// netdev group `group`) from MAC `mac`.
    pub fn bridged(mut self, group: u32, port: &str, mac: [u8; 6]) -> Packet {
        self.extra.iif_group = group;
        self.on(port).from_mac(mac)
    }

    /// The same packet arriving on interface `iif`.
    pub fn on(mut self, iif: &str) -> Packet {
        self.iif = Some(iif.to_string());
        self
    }

    /// The same packet as a frame from MAC `mac`.
    pub fn from_mac(mut self, mac: [u8; 6]) -> Packet {
        self.src_mac = Some(mac);
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Accept,
    Drop,
    Reject,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub fate: Fate,
    pub dnat: Option<(IpAddr, Option<u16>)>,
    pub masquerade: bool,
    /// Whether a rule exempted it from connection tracking.
    pub notrack: bool,
    /// Chains visited, in order.
    pub path: Vec<String>,
    /// The prefixes of the `log` statements it passed, in order, as the
    /// kernel sends them (see [`crate::model::Expr::Log`]).
    pub logs: Vec<String>,
}

enum Flow {
    FellOff,
    Return,
    Accept,
    Drop,
    Reject,
}

/// What one expression makes of its rule.
enum Step {
    /// On to the rule's next expression.
    Next,
    /// The rule ends here (no match, or a jump that came back): on to the
    /// chain's next rule.
    NextRule,
    /// The chain ends here.
    End(Flow),
}

impl Step {
    /// A match goes on to the next expression, a mismatch to the next rule.
    fn matched(m: bool) -> Step {
        if m {
            Step::Next
        } else {
            Step::NextRule
        }
    }
}

/// Traces packets through one table, keeping dynamic-set updates between
/// packets (as the kernel keeps affinity entries).
pub struct Tracer<'a> {
    table: &'a Table,
    /// Addresses that `fib daddr type local` and `fib saddr type local`
    /// consider local.
    pub local: BTreeSet<IpAddr>,
    dynamic: BTreeMap<String, BTreeSet<Vec<Value>>>,
    /// Packets counted by each named counter so far.
    pub counters: BTreeMap<String, u64>,
    /// Whether the traced packets exceed every `limit` (then `limit rate
    /// over` matches and a plain `limit` does not); false by default.
    pub over_limit: bool,
}

struct Run<'p> {
    pkt: Packet,
    /// The packet as it arrived (conntrack's original direction).
    orig: Packet,
    dnat: Option<(IpAddr, Option<u16>)>,
    masq: bool,
    notrack: bool,
    path: Vec<String>,
    logs: Vec<String>,
    pick: &'p mut dyn FnMut(u32) -> u32,
}

impl Run<'_> {
    /// Rewrites the destination (and port, if given), as DNAT does.
    fn dnat_to(&mut self, addr: IpAddr, port: Option<u16>) {
        self.dnat = Some((addr, port));
        self.pkt.dst = addr;
        if let Some(p) = port {
            self.pkt.dport = p;
        }
    }
}

fn field(pkt: &Packet, orig: &Packet, f: Field) -> Option<Value> {
    let ip = matches!(pkt.ether_type(), ETH_IP | ETH_IP6);
    let x = &pkt.extra;
    Some(match f {
        Field::IpSaddr | Field::IpDaddr | Field::Ip6Saddr | Field::Ip6Daddr if !ip => return None,
        Field::L4Proto | Field::Dport | Field::Sport if !ip => return None,
        Field::L4Proto if x.icmp6.is_some() => Value::U8(58),
        Field::Dport | Field::Sport if x.icmp6.is_some() => return None,
        Field::EtherType => Value::U16(pkt.ether_type()),
        Field::ArpSha if pkt.ether_type() == ETH_ARP => Value::Mac(x.arp?.0),
        Field::ArpSpa if pkt.ether_type() == ETH_ARP => Value::Addr(x.arp?.1.into()),
        Field::IifGroup => Value::U32(x.iif_group),
        Field::Icmp6Type => Value::U8(x.icmp6?.0),
        Field::NdTarget => Value::Addr(x.icmp6?.1?.into()),
        Field::CtOrigIpDaddr if orig.dst.is_ipv4() => Value::Addr(orig.dst),
        Field::CtOrigIp6Daddr if orig.dst.is_ipv6() => Value::Addr(orig.dst),
        Field::CtOrigDport => Value::Port(orig.dport),
        Field::IpSaddr if pkt.src.is_ipv4() => Value::Addr(pkt.src),
        Field::IpDaddr if pkt.dst.is_ipv4() => Value::Addr(pkt.dst),
        Field::Ip6Saddr if pkt.src.is_ipv6() => Value::Addr(pkt.src),
        Field::Ip6Daddr if pkt.dst.is_ipv6() => Value::Addr(pkt.dst),
        Field::L4Proto => Value::Proto(pkt.proto),
        Field::Dport => Value::Port(pkt.dport),
        Field::Sport => Value::Port(pkt.sport),
        Field::Mark => Value::U32(pkt.mark),
        Field::IifName => Value::Name(pkt.iif.clone()?),
        Field::OifName => Value::Name(pkt.oif.clone()?),
        Field::EtherSaddr => Value::Mac(pkt.src_mac?),
        Field::NfProto => Value::U8(if pkt.src.is_ipv4() { 2 } else { 10 }),
        Field::PktType => Value::U8(pkt.pkttype),
        _ => return None,
    })
}

/// Whether a packet value matches an element value (prefixes and port
/// ranges match inside).
fn value_matches(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Addr(a), Value::Net(n)) => n.contains(a),
        (Value::Port(p), Value::PortRange(lo, hi)) => (lo..=hi).contains(&p),
        _ => have == want,
    }
}

fn key_matches(have: &[Value], want: &[Value]) -> bool {
    have.len() == want.len() && have.iter().zip(want).all(|(h, w)| value_matches(h, w))
}

impl<'a> Tracer<'a> {
    pub fn new(table: &'a Table) -> Self {
        Tracer {
            table,
            local: BTreeSet::new(),
            dynamic: BTreeMap::new(),
            counters: BTreeMap::new(),
            over_limit: false,
        }
    }

    /// The same tracer with every `limit` exceeded (or not).
    pub fn with_over_limit(mut self, over: bool) -> Self {
        self.over_limit = over;
        self
    }

    pub fn with_local(mut self, addrs: &[&str]) -> Self {
        self.local = addrs.iter().map(|a| a.parse().expect("local ip")).collect();
        self
    }

    fn base_chains(&self, hook: Hook) -> Vec<&'a str> {
        let mut v: Vec<(i32, u8, &str)> = self
            .table
            .chains
            .iter()
            .filter_map(|(n, c)| {
                let b = c.base?;
                (b.hook == hook).then_some((
                    b.priority,
                    if b.kind == ChainType::Nat { 0 } else { 1 },
                    n.as_str(),
                ))
            })
            .collect();
        v.sort();
        v.into_iter().map(|(_, _, n)| n).collect()
    }

    fn lookup(&self, set: &str, key: &[Value]) -> Option<Option<ElemData>> {
        if self
            .dynamic
            .get(set)
            .map(|s| s.iter().any(|k| key_matches(key, k)))
            .unwrap_or(false)
        {
            return Some(None);
        }
        let s = self.table.sets.get(set)?;
        s.elements
            .iter()
            .find(|(k, _)| key_matches(key, k))
            .map(|(_, d)| d.clone())
    }

    fn keys(run: &Run<'_>, fields: &[Field]) -> Option<Vec<Value>> {
        fields
            .iter()
            .map(|f| field(&run.pkt, &run.orig, *f))
            .collect()
    }

    /// Runs chain `name` (reached through `depth` jumps) until a rule ends
    /// it or its rules run out.
    fn eval_chain(&mut self, name: &str, run: &mut Run<'_>, depth: usize) -> Flow {
        if depth > 16 {
            return Flow::Drop;
        }
        run.path.push(name.to_string());
        let Some(chain) = self.table.chains.get(name) else {
            return Flow::Drop;
        };
        for rule in &chain.rules {
            if let Some(flow) = self.eval_rule(&rule.exprs, run, depth) {
                return flow;
            }
        }
        Flow::FellOff
    }

    /// Runs one rule's expressions in order; `None` means "continue with
    /// the next rule" (it did not match, or it matched without ending the
    /// chain).
    fn eval_rule(&mut self, exprs: &[Expr], run: &mut Run<'_>, depth: usize) -> Option<Flow> {
        for e in exprs {
            match self.eval_expr(e, run, depth) {
                Step::Next => {}
                Step::NextRule => return None,
                Step::End(flow) => return Some(flow),
            }
        }
        None
    }

    /// Evaluates one expression of a rule against the packet.
    fn eval_expr(&mut self, e: &Expr, run: &mut Run<'_>, depth: usize) -> Step {
        let local = |a: &IpAddr| self.local.contains(a);
        match e {
            Expr::Cmp {
                field: f,
                neg,
                value,
            } => Step::matched(
                field(&run.pkt, &run.orig, *f).is_some_and(|v| value_matches(&v, value) != *neg),
            ),
            Expr::InSet { keys, set, neg } => Step::matched(
                Self::keys(run, keys).is_some_and(|k| self.lookup(set, &k).is_some() != *neg),
            ),
            Expr::VMap { keys, map } => self.vmap(keys, map, run, depth),
            Expr::Numgen { modulus, value } => Step::matched((run.pick)(*modulus) == *value),
            Expr::FibDaddrLocal => Step::matched(local(&run.pkt.dst)),
            Expr::FibDaddrNotLocal => Step::matched(!local(&run.pkt.dst)),
            Expr::FibSaddrLocal => Step::matched(local(&run.pkt.src)),
            Expr::CtDnat => Step::matched(run.dnat.is_some()),
            // The tracer follows the first packet of a flow (or a
            // packet conntrack found invalid).
            Expr::CtStateNew => Step::matched(!run.pkt.extra.ct_invalid),
            Expr::CtStateInvalid => Step::matched(run.pkt.extra.ct_invalid),
            Expr::MarkSet { mask } => Step::matched(run.pkt.mark & mask != 0),
            Expr::SetMark { bits } => {
                run.pkt.mark |= bits;
                Step::Next
            }
            Expr::UpdateSet { keys, set } | Expr::AddSet { keys, set } => {
                if let Some(k) = Self::keys(run, keys) {
                    self.dynamic.entry(set.clone()).or_default().insert(k);
                }
                Step::Next
            }
            Expr::Counter | Expr::SetNftrace => Step::Next,
            Expr::CounterRef(name) => {
                *self.counters.entry(name.clone()).or_default() += 1;
                Step::Next
            }
            Expr::Notrack => {
                run.notrack = true;
                Step::Next
            }
            Expr::MapDnat { keys, map, .. } => {
                let key = Self::keys(run, keys);
                self.map_dnat(map, key, run)
            }
            Expr::Dnat { addr, port } => {
                run.dnat_to(*addr, *port);
                Step::End(Flow::Accept)
            }
            Expr::PickDnat { keys, modulus, map } => {
                let key = Self::keys(run, keys).map(|mut k| {
                    k.push(Value::U32((run.pick)(*modulus)));
                    k
                });
                self.map_dnat(map, key, run)
            }
            Expr::Masquerade { .. } => {
                run.masq = true;
                Step::End(Flow::Accept)
            }
            Expr::Reject { .. } => Step::End(Flow::Reject),
            Expr::Log { prefix, .. } => {
                run.logs.push(crate::model::log_prefix(prefix));
                Step::Next
            }
            Expr::Limit { over, .. } => Step::matched(*over == self.over_limit),
            Expr::Verdict(v) => self.verdict_step(v, run, depth),
        }
    }

    /// `<keys> vmap @map`: the verdict of the element the packet's key
    /// finds; no element, no match.
    fn vmap(&mut self, keys: &[Field], map: &str, run: &mut Run<'_>, depth: usize) -> Step {
        let Some(k) = Self::keys(run, keys) else {
            return Step::NextRule;
        };
        match self.lookup(map, &k) {
            Some(Some(ElemData::Verdict(v))) => self.verdict_step(&v, run, depth),
            _ => Step::NextRule,
        }
    }

    /// DNAT to the address and port map `map` holds for `key`; no key or
    /// no element, no match.
    fn map_dnat(&self, map: &str, key: Option<Vec<Value>>, run: &mut Run<'_>) -> Step {
        let Some(k) = key else {
            return Step::NextRule;
        };
        let Some(Some(ElemData::Data(d))) = self.lookup(map, &k) else {
            return Step::NextRule;
        };
        let (Some(Value::Addr(addr)), Some(Value::Port(port))) = (d.first(), d.get(1)) else {
            return Step::NextRule;
        };
        run.dnat_to(*addr, Some(*port));
        Step::End(Flow::Accept)
    }

    /// A verdict as a rule's step: the chain ends unless it is a jump
    /// that came back.
    fn verdict_step(&mut self, v: &Verdict, run: &mut Run<'_>, depth: usize) -> Step {
        match self.verdict(v, run, depth) {
            Some(f) => Step::End(f),
            None => Step::NextRule,
        }
    }

    /// Applies a verdict; `None` means "continue with the next rule".
    fn verdict(&mut self, v: &Verdict, run: &mut Run<'_>, depth: usize) -> Option<Flow> {
        match v {
            Verdict::Accept => Some(Flow::Accept),
            Verdict::Drop => Some(Flow::Drop),
            Verdict::Return => Some(Flow::Return),
            Verdict::Jump(c) => match self.eval_chain(c, run, depth + 1) {
                Flow::FellOff | Flow::Return => None,
                f => Some(f),
            },
            Verdict::Goto(c) => match self.eval_chain(c, run, depth + 1) {
                Flow::FellOff | Flow::Return => Some(Flow::Return),
                f => Some(f),
            },
        }
    }

    fn hook(&mut self, hook: Hook, run: &mut Run<'_>) -> Option<Fate> {
        for c in self.base_chains(hook) {
            match self.eval_chain(c, run, 0) {
                Flow::Drop => return Some(Fate::Drop),
                Flow::Reject => return Some(Fate::Reject),
                _ => {}
            }
        }
        None
    }

    fn finish(
        &mut self,
        hooks: &[Hook],
        pkt: &Packet,
        pick: &mut dyn FnMut(u32) -> u32,
    ) -> Outcome {
        let mut run = Run {
            pkt: pkt.clone(),
            orig: pkt.clone(),
            dnat: None,
            masq: false,
            notrack: false,
            path: Vec::new(),
            logs: Vec::new(),
            pick,
        };
        let mut fate = Fate::Accept;
        for h in hooks {
            // After prerouting, a packet still addressed to us goes to input.
            let h = match h {
                Hook::Forward if self.local.contains(&run.pkt.dst) => Hook::Input,
                h => *h,
            };
            if let Some(f) = self.hook(h, &mut run) {
                fate = f;
                break;
            }
        }
        Outcome {
            fate,
            dnat: run.dnat,
            masquerade: run.masq,
            notrack: run.notrack,
            path: run.path,
            logs: run.logs,
        }
    }

    /// A packet arriving on an interface: prerouting, forward/input, postrouting.
    pub fn incoming(&mut self, pkt: &Packet, pick: &mut dyn FnMut(u32) -> u32) -> Outcome {
        self.finish(
            &[Hook::Prerouting, Hook::Forward, Hook::Postrouting],
            pkt,
            pick,
        )
    }

    /// A packet sent by a local process: output, postrouting.
    pub fn local(&mut self, pkt: &Packet, pick: &mut dyn FnMut(u32) -> u32) -> Outcome {
        self.finish(&[Hook::Output, Hook::Postrouting], pkt, pick)
    }

    /// Every DNAT target an incoming packet can reach, over all random draws.
    pub fn incoming_targets(
        &mut self,
        pkt: &Packet,
        draws: u32,
    ) -> BTreeSet<Option<(IpAddr, Option<u16>)>> {
        let mut out = BTreeSet::new();
        for seed in 0..draws {
            let mut n = seed;
            let mut pick = |m: u32| {
                let r = n % m;
                n /= m.max(1);
                r
            };
            out.insert(self.incoming(pkt, &mut pick).dnat);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Chain, KeyType, Rule, Set};

    fn v(s: &str) -> Value {
        match s.parse::<ipnet::IpNet>() {
            Ok(n) => Value::Net(n),
            Err(_) => Value::Addr(s.parse().expect("an address or a prefix")),
        }
    }

    /// A NetworkPolicy-shaped table: (pod . peer . proto . port) allow sets
    /// with prefixes and port ranges, a logged and rate-limited default
    /// deny, a flood guard.
    fn policy() -> Table {
        let mut t = Table::new(crate::model::Family::Inet, "np");
        for (name, addr, pod, peers) in [
            (
                "allow4",
                KeyType::Ipv4Addr,
                "10.0.1.5",
                ["10.0.2.0/24", "10.0.3.7"],
            ),
            (
                "allow6",
                KeyType::Ipv6Addr,
                "fd00::5",
                ["fd00:2::/64", "fd00:3::7"],
            ),
        ] {
            let mut s = Set::new(vec![addr, addr, KeyType::InetProto, KeyType::InetService]);
            s.interval = true;
            s.elements.insert(
                vec![
                    v(pod),
                    v(peers[0]),
                    Value::Proto(Proto::Tcp),
                    Value::PortRange(8000, 8100),
                ],
                None,
            );
            s.elements.insert(
                vec![
                    v(pod),
                    v(peers[1]),
                    Value::Proto(Proto::Udp),
                    Value::Port(53),
                ],
                None,
            );
            t.sets.insert(name.into(), s);
        }
        let lookup = |keys: Vec<Field>, set: &str| Expr::InSet {
            keys,
            set: set.into(),
            neg: false,
        };
        let log = |p: &str| Expr::Log {
            group: 7,
            prefix: p.into(),
        };
        let accept = Expr::Verdict(Verdict::Accept);
        t.chains.insert(
            "forward".into(),
            Chain::base(ChainType::Filter, Hook::Forward, 0).with_rules(vec![
                Rule::new(vec![
                    Expr::Limit {
                        rate: 1000,
                        burst: 100,
                        over: true,
                    },
                    Expr::Verdict(Verdict::Drop),
                ]),
                Rule::new(vec![
                    lookup(
                        vec![Field::IpDaddr, Field::IpSaddr, Field::L4Proto, Field::Dport],
                        "allow4",
                    ),
                    log("np allow"),
                    accept.clone(),
                ]),
                Rule::new(vec![
                    lookup(
                        vec![
                            Field::Ip6Daddr,
                            Field::Ip6Saddr,
                            Field::L4Proto,
                            Field::Dport,
                        ],
                        "allow6",
                    ),
                    log("np allow"),
                    accept.clone(),
                ]),
                Rule::new(vec![
                    Expr::Cmp {
                        field: Field::Dport,
                        neg: false,
                        value: Value::PortRange(9000, 9100),
                    },
                    accept,
                ]),
                Rule::new(vec![
                    Expr::Limit {
                        rate: 10,
                        burst: 5,
                        over: false,
                    },
                    log("np deny"),
                ]),
                Rule::new(vec![Expr::Verdict(Verdict::Drop)]),
            ]),
        );
        t
    }

    fn trace(t: &mut Tracer<'_>, src: &str, dst: &str, proto: Proto, port: u16) -> Outcome {
        t.incoming(&Packet::new(src, dst, proto, port), &mut |_| 0)
    }

    #[test]
    fn policy_sets_match_prefixes_and_port_ranges() {
        let t = policy();
        let mut tr = Tracer::new(&t);
        let mut allowed = |src, dst, proto, port| {
            let o = trace(&mut tr, src, dst, proto, port);
            match o.fate {
                Fate::Accept => {
                    assert_eq!(o.logs, ["np allow"], "{src} -> {dst} {port}");
                    true
                }
                _ => {
                    assert_eq!(o.logs, ["np deny"], "{src} -> {dst} {port}");
                    false
                }
            }
        };
        // A prefix and a port range, both ends inclusive.
        assert!(allowed("10.0.2.9", "10.0.1.5", Proto::Tcp, 8000));
        assert!(allowed("10.0.2.255", "10.0.1.5", Proto::Tcp, 8100));
        assert!(!allowed("10.0.2.9", "10.0.1.5", Proto::Tcp, 8101));
        assert!(!allowed("10.0.2.9", "10.0.1.5", Proto::Tcp, 7999));
        assert!(!allowed("10.0.4.1", "10.0.1.5", Proto::Tcp, 8050));
        assert!(!allowed("10.0.2.9", "10.0.1.5", Proto::Udp, 8050));
        assert!(!allowed("10.0.2.9", "10.0.1.6", Proto::Tcp, 8050));
        // An exact peer and an exact port.
        assert!(allowed("10.0.3.7", "10.0.1.5", Proto::Udp, 53));
        assert!(!allowed("10.0.3.8", "10.0.1.5", Proto::Udp, 53));
        assert!(!allowed("10.0.3.7", "10.0.1.5", Proto::Udp, 54));
        // IPv6 keys alike.
        assert!(allowed("fd00:2::9", "fd00::5", Proto::Tcp, 8100));
        assert!(!allowed("fd00:2:0:1::9", "fd00::5", Proto::Tcp, 8100));
        assert!(allowed("fd00:3::7", "fd00::5", Proto::Udp, 53));
        assert!(!allowed("fd00:3::8", "fd00::5", Proto::Udp, 53));
        assert!(!allowed("10.9.9.9", "10.0.1.5", Proto::Tcp, 9101));
        // `th dport 9000-9100` matches inside, not outside (and logs nothing).
        let o = trace(&mut tr, "10.9.9.9", "10.0.1.5", Proto::Tcp, 9100);
        assert_eq!((o.fate, o.logs.len()), (Fate::Accept, 0));
    }

    #[test]
    fn limits_can_be_traced_on_both_sides() {
        let t = policy();
        // Within every limit: the flood guard never matches, the deny is logged.
        let mut under = Tracer::new(&t);
        let o = trace(&mut under, "10.0.4.1", "10.0.1.5", Proto::Tcp, 80);
        assert_eq!((o.fate, o.logs), (Fate::Drop, vec!["np deny".to_string()]));
        // Over them: the flood guard drops first, and nothing is logged.
        let mut over = Tracer::new(&t).with_over_limit(true);
        for (src, port) in [("10.0.4.1", 80), ("10.0.2.9", 8050)] {
            let o = trace(&mut over, src, "10.0.1.5", Proto::Tcp, port);
            assert_eq!((o.fate, o.logs), (Fate::Drop, vec![]));
        }
    }

    #[test]
    fn log_and_limit_render_as_nft_writes_them() {
        let r = policy().render();
        for want in [
            "type ipv4_addr . ipv4_addr . inet_proto . inet_service; flags interval;",
            "type ipv6_addr . ipv6_addr . inet_proto . inet_service; flags interval;",
            "10.0.1.5 . 10.0.2.0/24 . tcp . 8000-8100",
            "10.0.1.5 . 10.0.3.7 . udp . 53",
            "fd00::5 . fd00:2::/64 . tcp . 8000-8100",
            "limit rate over 1000/second burst 100 packets drop",
            "ip daddr . ip saddr . meta l4proto . th dport @allow4 log prefix \"np allow\" group 7 accept",
            "th dport 9000-9100 accept",
            "limit rate 10/second burst 5 packets log prefix \"np deny\" group 7",
        ] {
            assert!(r.contains(want), "{want:?} in\n{r}");
        }
        // What nft cannot quote, and what the kernel would cut, is neither
        // sent nor rendered.
        let long = Expr::Log {
            group: 1,
            prefix: format!("a\"b{}", "é".repeat(100)),
        };
        let text = long.text();
        let prefix = text
            .strip_prefix("log prefix \"")
            .and_then(|s| s.strip_suffix("\" group 1"))
            .unwrap();
        assert!(prefix.starts_with("a'b") && prefix.len() <= 127, "{text}");
    }
}
