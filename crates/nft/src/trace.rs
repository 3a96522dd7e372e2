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
//! A packet may name the interfaces it came in and goes out on, its source
//! MAC and its packet type, for the CNI plugins' and the lab gateway's
//! tables; in an `inet` table, IPv4 fields match IPv4 packets only.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::model::{ChainType, ElemData, Expr, Field, Hook, Proto, Table, Value, Verdict};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: Proto,
    pub dport: u16,
    pub mark: u32,
    /// The interface it arrived on (`iifname`), if any.
    pub iif: Option<String>,
    /// The interface it leaves by (`oifname`), if known.
    pub oif: Option<String>,
    /// Its source MAC (`ether saddr`), if it is a frame.
    pub src_mac: Option<[u8; 6]>,
    /// `meta pkttype`: 0 for a frame addressed to this host's MAC.
    pub pkttype: u8,
}

impl Packet {
    pub fn new(src: &str, dst: &str, proto: Proto, dport: u16) -> Packet {
        Packet {
            src: src.parse().expect("src ip"),
            dst: dst.parse().expect("dst ip"),
            proto,
            dport,
            mark: 0,
            iif: None,
            oif: None,
            src_mac: None,
            pkttype: 0,
        }
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
}

enum Flow {
    FellOff,
    Return,
    Accept,
    Drop,
    Reject,
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
}

struct Run<'p> {
    pkt: Packet,
    /// The packet as it arrived (conntrack's original direction).
    orig: Packet,
    dnat: Option<(IpAddr, Option<u16>)>,
    masq: bool,
    notrack: bool,
    path: Vec<String>,
    pick: &'p mut dyn FnMut(u32) -> u32,
}

fn field(pkt: &Packet, orig: &Packet, f: Field) -> Option<Value> {
    Some(match f {
        Field::CtOrigIpDaddr if orig.dst.is_ipv4() => Value::Addr(orig.dst),
        Field::CtOrigIp6Daddr if orig.dst.is_ipv6() => Value::Addr(orig.dst),
        Field::CtOrigDport => Value::Port(orig.dport),
        Field::IpSaddr if pkt.src.is_ipv4() => Value::Addr(pkt.src),
        Field::IpDaddr if pkt.dst.is_ipv4() => Value::Addr(pkt.dst),
        Field::Ip6Saddr if pkt.src.is_ipv6() => Value::Addr(pkt.src),
        Field::Ip6Daddr if pkt.dst.is_ipv6() => Value::Addr(pkt.dst),
        Field::L4Proto => Value::Proto(pkt.proto),
        Field::Dport => Value::Port(pkt.dport),
        Field::Mark => Value::U32(pkt.mark),
        Field::IifName => Value::Name(pkt.iif.clone()?),
        Field::OifName => Value::Name(pkt.oif.clone()?),
        Field::EtherSaddr => Value::Mac(pkt.src_mac?),
        Field::NfProto => Value::U8(if pkt.src.is_ipv4() { 2 } else { 10 }),
        Field::PktType => Value::U8(pkt.pkttype),
        _ => return None,
    })
}

/// Whether a packet value matches an element value (prefixes match inside).
fn value_matches(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Addr(a), Value::Net(n)) => n.contains(a),
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
        }
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

    fn eval_chain(&mut self, name: &str, run: &mut Run<'_>, depth: usize) -> Flow {
        if depth > 16 {
            return Flow::Drop;
        }
        run.path.push(name.to_string());
        let Some(chain) = self.table.chains.get(name) else {
            return Flow::Drop;
        };
        'rules: for rule in &chain.rules {
            for e in &rule.exprs {
                match e {
                    Expr::Cmp {
                        field: f,
                        neg,
                        value,
                    } => {
                        let Some(v) = field(&run.pkt, &run.orig, *f) else {
                            continue 'rules;
                        };
                        if value_matches(&v, value) == *neg {
                            continue 'rules;
                        }
                    }
                    Expr::InSet { keys, set, neg } => {
                        let Some(k) = Self::keys(run, keys) else {
                            continue 'rules;
                        };
                        if self.lookup(set, &k).is_some() == *neg {
                            continue 'rules;
                        }
                    }
                    Expr::VMap { keys, map } => {
                        let Some(k) = Self::keys(run, keys) else {
                            continue 'rules;
                        };
                        match self.lookup(map, &k) {
                            Some(Some(ElemData::Verdict(v))) => {
                                match self.verdict(&v, run, depth) {
                                    Some(f) => return f,
                                    None => continue 'rules,
                                }
                            }
                            _ => continue 'rules,
                        }
                    }
                    Expr::Numgen { modulus, value } => {
                        if (run.pick)(*modulus) != *value {
                            continue 'rules;
                        }
                    }
                    Expr::FibDaddrLocal => {
                        if !self.local.contains(&run.pkt.dst) {
                            continue 'rules;
                        }
                    }
                    Expr::FibDaddrNotLocal => {
                        if self.local.contains(&run.pkt.dst) {
                            continue 'rules;
                        }
                    }
                    Expr::FibSaddrLocal => {
                        if !self.local.contains(&run.pkt.src) {
                            continue 'rules;
                        }
                    }
                    Expr::CtDnat => {
                        if run.dnat.is_none() {
                            continue 'rules;
                        }
                    }
                    // The tracer follows the first packet of a flow.
                    Expr::CtStateNew => {}
                    Expr::MarkSet { mask } => {
                        if run.pkt.mark & mask == 0 {
                            continue 'rules;
                        }
                    }
                    Expr::SetMark { bits } => run.pkt.mark |= bits,
                    Expr::UpdateSet { keys, set } | Expr::AddSet { keys, set } => {
                        if let Some(k) = Self::keys(run, keys) {
                            self.dynamic.entry(set.clone()).or_default().insert(k);
                        }
                    }
                    Expr::Counter => {}
                    Expr::CounterRef(name) => *self.counters.entry(name.clone()).or_default() += 1,
                    Expr::Notrack => run.notrack = true,
                    Expr::MapDnat { keys, map, .. } => {
                        let Some(k) = Self::keys(run, keys) else {
                            continue 'rules;
                        };
                        let Some(Some(ElemData::Data(d))) = self.lookup(map, &k) else {
                            continue 'rules;
                        };
                        let (Some(Value::Addr(addr)), Some(Value::Port(port))) =
                            (d.first(), d.get(1))
                        else {
                            continue 'rules;
                        };
                        run.dnat = Some((*addr, Some(*port)));
                        run.pkt.dst = *addr;
                        run.pkt.dport = *port;
                        return Flow::Accept;
                    }
                    Expr::Dnat { addr, port } => {
                        run.dnat = Some((*addr, *port));
                        run.pkt.dst = *addr;
                        if let Some(p) = port {
                            run.pkt.dport = *p;
                        }
                        return Flow::Accept;
                    }
                    Expr::PickDnat { keys, modulus, map } => {
                        let Some(mut k) = Self::keys(run, keys) else {
                            continue 'rules;
                        };
                        k.push(Value::U32((run.pick)(*modulus)));
                        let Some(Some(ElemData::Data(d))) = self.lookup(map, &k) else {
                            continue 'rules;
                        };
                        let (Some(Value::Addr(addr)), Some(Value::Port(port))) =
                            (d.first(), d.get(1))
                        else {
                            continue 'rules;
                        };
                        run.dnat = Some((*addr, Some(*port)));
                        run.pkt.dst = *addr;
                        run.pkt.dport = *port;
                        return Flow::Accept;
                    }
                    Expr::Masquerade { .. } => {
                        run.masq = true;
                        return Flow::Accept;
                    }
                    Expr::Reject { .. } => return Flow::Reject,
                    Expr::Verdict(v) => match self.verdict(v, run, depth) {
                        Some(f) => return f,
                        None => continue 'rules,
                    },
                }
            }
        }
        Flow::FellOff
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
