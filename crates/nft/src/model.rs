//! A typed model of the nftables state podnet owns: one table, its sets and
//! maps, its named counters, its chains and their rules, expressed in the
//! handful of expressions podnet's tables need (the service proxy, the
//! node's masquerade, the CNI plugins' masquerade, MAC spoof check and
//! port mappings, the lab gateway's leak counter).
//!
//! The model is plain data: it is planned by pure code, diffed against the
//! last applied model ([`crate::diff`]), rendered as `nft` text for humans and
//! golden tests ([`Table::render`]), and evaluated by the packet tracer
//! ([`crate::trace`]) in unit tests without root.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::net::IpAddr;

use ipnet::IpNet;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    Ip,
    Ip6,
    Inet,
    /// Frames crossing a Linux bridge (the CNI MAC spoof check).
    Bridge,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
            Family::Inet => "inet",
            Family::Bridge => "bridge",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChainType {
    Filter,
    Nat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BaseChain {
    pub kind: ChainType,
    pub hook: Hook,
    pub priority: i32,
}

/// A packet field a rule can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    IpSaddr,
    IpDaddr,
    Ip6Saddr,
    Ip6Daddr,
    /// meta l4proto
    L4Proto,
    /// th dport (TCP, UDP or SCTP destination port)
    Dport,
    /// th sport (TCP, UDP or SCTP source port)
    Sport,
    /// meta mark
    Mark,
    /// The connection's original destination (before DNAT), from conntrack.
    CtOrigIpDaddr,
    CtOrigIp6Daddr,
    CtOrigDport,
    /// meta iifname: the interface the packet came in on (in a bridge
    /// table, the bridge port).
    IifName,
    /// meta oifname
    OifName,
    /// ether saddr (bridge tables)
    EtherSaddr,
    /// meta nfproto: the packet's layer-3 family in an `inet` table
    /// (`Value::U8(2)` IPv4, `Value::U8(10)` IPv6).
    NfProto,
    /// meta pkttype (`Value::U8(0)` is `host`: addressed to our MAC).
    PktType,
    /// ether type (bridge tables; `Value::U16`). A VLAN-tagged frame reads
    /// as 0x8100 here even when the tag was taken off into the skb.
    EtherType,
    /// arp saddr ether: an ARP packet's sender hardware address (Ethernet,
    /// IPv4 ARP; read at its fixed offset: only after `ether type arp`).
    ArpSha,
    /// arp saddr ip: an ARP packet's sender protocol address.
    ArpSpa,
    /// meta iifgroup: the netdev group of the interface (in a bridge
    /// table, the port) a frame came in on (`Value::U32`).
    IifGroup,
    /// icmpv6 type (read at the transport header: only after `meta
    /// l4proto` is 58, compared as `Value::U8`).
    Icmp6Type,
    /// The target address of an ICMPv6 neighbour solicitation or
    /// advertisement (only after `icmpv6 type` is 135 or 136).
    NdTarget,
}

impl Field {
    pub fn text(self) -> &'static str {
        match self {
            Field::IpSaddr => "ip saddr",
            Field::IpDaddr => "ip daddr",
            Field::Ip6Saddr => "ip6 saddr",
            Field::Ip6Daddr => "ip6 daddr",
            Field::L4Proto => "meta l4proto",
            Field::Dport => "th dport",
            Field::Sport => "th sport",
            Field::Mark => "meta mark",
            Field::CtOrigIpDaddr => "ct original ip daddr",
            Field::CtOrigIp6Daddr => "ct original ip6 daddr",
            Field::CtOrigDport => "ct original proto-dst",
            Field::IifName => "iifname",
            Field::OifName => "oifname",
            Field::EtherSaddr => "ether saddr",
            Field::NfProto => "meta nfproto",
            Field::PktType => "meta pkttype",
            Field::EtherType => "ether type",
            Field::ArpSha => "arp saddr ether",
            Field::ArpSpa => "arp saddr ip",
            Field::IifGroup => "meta iifgroup",
            Field::Icmp6Type => "icmpv6 type",
            Field::NdTarget => "icmpv6 taddr",
        }
    }

    /// The set key type this field is looked up as.
    pub fn key_type(self) -> KeyType {
        match self {
            Field::IpSaddr | Field::IpDaddr | Field::CtOrigIpDaddr | Field::ArpSpa => {
                KeyType::Ipv4Addr
            }
            Field::Ip6Saddr | Field::Ip6Daddr | Field::CtOrigIp6Daddr | Field::NdTarget => {
                KeyType::Ipv6Addr
            }
            Field::L4Proto => KeyType::InetProto,
            Field::Dport | Field::Sport | Field::CtOrigDport => KeyType::InetService,
            Field::Mark => KeyType::Mark,
            Field::IifName | Field::OifName => KeyType::IfName,
            Field::IifGroup => KeyType::DevGroup,
            Field::EtherSaddr | Field::ArpSha => KeyType::EtherAddr,
            Field::NfProto => KeyType::NfProto,
            Field::PktType => KeyType::PktType,
            Field::EtherType => KeyType::EtherType,
            Field::Icmp6Type => KeyType::Icmp6Type,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeyType {
    Ipv4Addr,
    Ipv6Addr,
    InetProto,
    InetService,
    Mark,
    /// An interface name (16 bytes, NUL padded).
    IfName,
    EtherAddr,
    NfProto,
    PktType,
    EtherType,
    Icmp6Type,
    DevGroup,
}

impl KeyType {
    pub fn text(self) -> &'static str {
        match self {
            KeyType::Ipv4Addr => "ipv4_addr",
            KeyType::Ipv6Addr => "ipv6_addr",
            KeyType::InetProto => "inet_proto",
            KeyType::InetService => "inet_service",
            KeyType::Mark => "mark",
            KeyType::IfName => "ifname",
            KeyType::EtherAddr => "ether_addr",
            KeyType::NfProto => "nf_proto",
            KeyType::PktType => "pkt_type",
            KeyType::EtherType => "ether_type",
            KeyType::Icmp6Type => "icmpv6_type",
            KeyType::DevGroup => "devgroup",
        }
    }
}

/// A value of one key field.
///
/// In an interval set (`flags interval`) an address field and a port field
/// hold ranges, and the kernel keeps only each range's first and last
/// value, so one range has several spellings here. The kernel's copy reads
/// back ([`crate::netlink::Conn::elements`]) in one canonical spelling,
/// which is what [`Value::canonical`] gives:
///
/// - an address field is `Addr` for a single address (also what a /32 or
///   /128 `Net` becomes) and `Net` for a shorter prefix, host bits zero;
/// - a port field is `Port` for a single port (also `PortRange(p, p)`) and
///   `PortRange(lo, hi)` with `lo < hi` otherwise;
/// - every other field is an exact value.
///
/// Plan in the canonical spelling. A planned key spelled otherwise (a
/// NetworkPolicy `ipBlock` of `10.0.0.5/32`, say) still reads back as it
/// was planned, so a repeated sync is 0 operations either way; only an
/// element nobody planned shows in the canonical spelling.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Value {
    Addr(IpAddr),
    Net(IpNet),
    Proto(Proto),
    Port(u16),
    /// The ports `lo..=hi` (`80-90`): a port field of an interval set, or
    /// `th dport` in a [`Expr::Cmp`] (a NetworkPolicy port with `endPort`).
    PortRange(u16, u16),
    U32(u32),
    /// A one-byte value (nfproto, pkttype, icmpv6 type, or a layer-4
    /// protocol number with no [`Proto`]: 58 for ICMPv6).
    U8(u8),
    /// A two-byte value in network order (ether type).
    U16(u16),
    /// An interface name.
    Name(String),
    Mac([u8; 6]),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    pub fn number(self) -> u8 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
            Proto::Sctp => 132,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
        }
    }
}

impl Value {
    fn text(&self) -> String {
        match self {
            Value::Addr(a) => a.to_string(),
            Value::Net(n) => n.to_string(),
            Value::Proto(p) => p.name().to_string(),
            Value::Port(p) => p.to_string(),
            Value::PortRange(lo, hi) => format!("{lo}-{hi}"),
            Value::U32(v) => format!("0x{v:08x}"),
            Value::U8(v) => v.to_string(),
            Value::U16(v) => format!("0x{v:04x}"),
            Value::Name(n) => format!("\"{}\"", n.replace('"', "_")),
            Value::Mac(m) => m
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":"),
        }
    }

    /// The canonical spelling of this value as an interval-set field (see
    /// [`Value`]): a full-length prefix is its address, a prefix has its
    /// host bits cleared, a one-port range is its port.
    pub fn canonical(&self) -> Value {
        match self {
            Value::Net(n) if n.prefix_len() == n.max_prefix_len() => Value::Addr(n.addr()),
            Value::Net(n) => Value::Net(n.trunc()),
            Value::PortRange(lo, hi) if lo == hi => Value::Port(*lo),
            v => v.clone(),
        }
    }

    /// Whether [`Value::canonical`] leaves this value as it is (without
    /// building the canonical one).
    pub fn is_canonical(&self) -> bool {
        match self {
            Value::Net(n) => n.prefix_len() < n.max_prefix_len() && n.trunc() == *n,
            Value::PortRange(lo, hi) => lo != hi,
            _ => true,
        }
    }
}

/// The most bytes of a log prefix the kernel keeps (`NF_LOG_PREFIXLEN`
/// less its NUL).
const LOG_PREFIX_MAX: usize = 127;

/// A log prefix as it is sent and rendered: cut to what the kernel keeps
/// (on a character boundary) and without `"`, which `nft` cannot quote.
pub(crate) fn log_prefix(p: &str) -> String {
    let mut end = p.len().min(LOG_PREFIX_MAX);
    while !p.is_char_boundary(end) {
        end -= 1;
    }
    p[..end].replace('"', "'")
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    Accept,
    Drop,
    Return,
    Jump(String),
    Goto(String),
}

impl Verdict {
    pub fn text(&self) -> String {
        match self {
            Verdict::Accept => "accept".into(),
            Verdict::Drop => "drop".into(),
            Verdict::Return => "return".into(),
            Verdict::Jump(c) => format!("jump {c}"),
            Verdict::Goto(c) => format!("goto {c}"),
        }
    }
}

/// One statement of a rule. Matches come first, then at most one terminal
/// action (or a verdict).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    /// `field == value` (or `!=`); an address field against a `Net` is a
    /// prefix match, a port field against a `PortRange` a range match.
    Cmp {
        field: Field,
        neg: bool,
        value: Value,
    },
    /// `keys @set` (or `!= @set`): the concatenation is in the set.
    InSet {
        keys: Vec<Field>,
        set: String,
        neg: bool,
    },
    /// `keys vmap @map`: jump/goto/accept/drop by lookup; no match falls through.
    VMap {
        keys: Vec<Field>,
        map: String,
    },
    /// `numgen random mod modulus == value`: one in `modulus` matches.
    Numgen {
        modulus: u32,
        value: u32,
    },
    /// `fib daddr type local`
    FibDaddrLocal,
    /// `fib daddr type != local`: the packet is not for this host.
    FibDaddrNotLocal,
    /// `fib saddr type local`: the packet was sent by this host (from one
    /// of its own addresses), whichever hook sees it.
    FibSaddrLocal,
    /// `ct status dnat`
    CtDnat,
    /// `ct state new`: the first packet of a connection. Checks that only
    /// matter when a connection starts stay off every later packet.
    CtStateNew,
    /// `ct state invalid`: a packet conntrack could not place in any
    /// connection (a stray RST or FIN, an ICMP error about nothing).
    CtStateInvalid,
    /// `meta mark & mask != 0`
    MarkSet {
        mask: u32,
    },
    /// `meta mark set meta mark | bits`
    SetMark {
        bits: u32,
    },
    /// `update @set { key }`: add or refresh the key (with the set's timeout).
    UpdateSet {
        keys: Vec<Field>,
        set: String,
    },
    /// `add @set { key }`: add the key if absent (never refreshes).
    AddSet {
        keys: Vec<Field>,
        set: String,
    },
    Counter,
    /// `counter name NAME`: count into the table's named counter.
    CounterRef(String),
    /// `notrack`: no connection tracking for this packet.
    Notrack,
    /// `meta nftrace set 1`: the kernel reports every rule this packet
    /// meets from here on (`podnet trace` reads the reports).
    SetNftrace,
    Dnat {
        addr: IpAddr,
        port: Option<u16>,
    },
    /// DNAT to the value of data map `map` (address . port) at key
    /// `keys . (numgen random mod modulus)`.
    PickDnat {
        keys: Vec<Field>,
        modulus: u32,
        map: String,
    },
    /// `dnat ip[6] to keys map @map`: DNAT to the address . port the data
    /// map holds for the key; no element, no change (the rule goes on).
    MapDnat {
        keys: Vec<Field>,
        map: String,
        v6: bool,
    },
    Masquerade {
        fully_random: bool,
    },
    /// `reject`: ICMP (ICMPv6) port unreachable in the table's own family,
    /// which a TCP or UDP client sees as "connection refused"; a TCP reset
    /// for TCP when `tcp_reset`.
    Reject {
        tcp_reset: bool,
    },
    /// `log prefix "PREFIX" group N`: a copy of the packet goes to NFLOG
    /// group `group` (the NetworkPolicy verdict log reads it from there,
    /// not from the kernel log), and the rule goes on. The prefix tells
    /// the reader which policy decided; the kernel keeps 127 bytes of it,
    /// and a `"` is sent as `'` (nft has no way to quote it).
    Log {
        group: u16,
        prefix: String,
    },
    /// `limit rate [over] RATE/second burst BURST packets`: matches while
    /// the packets per second stay within `rate` (at least 1, with `burst`
    /// packets of slack, at least 1 as `nft` requires), or, with `over`,
    /// only once they exceed it. A log rule behind a limit cannot flood
    /// the reader; a drop behind `over` caps a flood.
    Limit {
        rate: u64,
        burst: u32,
        over: bool,
    },
    Verdict(Verdict),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Rule {
    pub exprs: Vec<Expr>,
    pub comment: Option<String>,
}

impl Rule {
    pub fn new(exprs: Vec<Expr>) -> Rule {
        Rule {
            exprs,
            comment: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain {
    pub base: Option<BaseChain>,
    pub rules: Vec<Rule>,
}

impl Chain {
    /// A base chain (attached to a netfilter hook) with no rules yet. Every
    /// table podnet plans has a few; with this a plan names only what sets
    /// the chain apart: its type, hook and priority (then its rules, with
    /// [`Chain::with_rules`]).
    pub fn base(kind: ChainType, hook: Hook, priority: i32) -> Chain {
        Chain {
            base: Some(BaseChain {
                kind,
                hook,
                priority,
            }),
            rules: vec![],
        }
    }

    /// The chain with these rules in place of its own, so a plan can build
    /// a chain in one expression.
    pub fn with_rules(self, rules: Vec<Rule>) -> Chain {
        Chain { rules, ..self }
    }
}

/// What a map maps to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MapData {
    Verdict,
    /// Values of these types, concatenated.
    Data(Vec<KeyType>),
}

/// One element's data (for maps).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ElemData {
    Verdict(Verdict),
    Data(Vec<Value>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    pub key: Vec<KeyType>,
    pub data: Option<MapData>,
    /// `flags interval`: address fields may hold prefixes (`Value::Net`)
    /// and port fields ranges (`Value::PortRange`), with one field or
    /// concatenated (a NetworkPolicy's `pod . peer CIDR . proto . ports`).
    /// Elements must not overlap (the kernel refuses; `nft` would merge
    /// them, we do not); see [`Value`] for the spelling they read back in.
    pub interval: bool,
    /// Element timeout in seconds (dynamic sets, e.g. session affinity).
    pub timeout: Option<u32>,
    /// Filled from the packet path (`add @set`): `flags dynamic`.
    pub dynamic: bool,
    /// The most elements the set holds (`size N`).
    pub size: Option<u32>,
    /// Elements, keyed by their concatenated key.
    pub elements: BTreeMap<Vec<Value>, Option<ElemData>>,
    /// Element comments, by key (elements without one are not listed):
    /// how a shared set records who owns an element.
    pub comments: BTreeMap<Vec<Value>, String>,
}

impl Set {
    pub fn new(key: Vec<KeyType>) -> Set {
        Set {
            key,
            data: None,
            interval: false,
            timeout: None,
            dynamic: false,
            size: None,
            elements: BTreeMap::new(),
            comments: BTreeMap::new(),
        }
    }

    /// Whether the kernel adds this set's elements itself (from rules), so
    /// its elements are not part of the planned state.
    pub fn kernel_filled(&self) -> bool {
        self.dynamic || self.timeout.is_some()
    }
    pub fn map(key: Vec<KeyType>) -> Set {
        Set {
            data: Some(MapData::Verdict),
            ..Set::new(key)
        }
    }
    pub fn data_map(key: Vec<KeyType>, data: Vec<KeyType>) -> Set {
        Set {
            data: Some(MapData::Data(data)),
            ..Set::new(key)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub family: Family,
    pub name: String,
    pub sets: BTreeMap<String, Set>,
    /// Named counters (`counter NAME {}`), read back with
    /// [`crate::netlink::Conn::counter`].
    pub counters: BTreeSet<String>,
    pub chains: BTreeMap<String, Chain>,
}

fn keys_text(keys: &[Field]) -> String {
    keys.iter()
        .map(|k| k.text())
        .collect::<Vec<_>>()
        .join(" . ")
}

impl Expr {
    pub fn text(&self) -> String {
        match self {
            Expr::Cmp { field, neg, value } => format!(
                "{} {}{}",
                field.text(),
                if *neg { "!= " } else { "" },
                value.text()
            ),
            Expr::InSet { keys, set, neg } => format!(
                "{} {}@{set}",
                keys_text(keys),
                if *neg { "!= " } else { "" }
            ),
            Expr::VMap { keys, map } => format!("{} vmap @{map}", keys_text(keys)),
            Expr::Numgen { modulus, value } => format!("numgen random mod {modulus} {value}"),
            Expr::FibDaddrLocal => "fib daddr type local".into(),
            Expr::FibDaddrNotLocal => "fib daddr type != local".into(),
            Expr::FibSaddrLocal => "fib saddr type local".into(),
            Expr::CtDnat => "ct status dnat".into(),
            Expr::CtStateNew => "ct state new".into(),
            Expr::CtStateInvalid => "ct state invalid".into(),
            Expr::MarkSet { mask } => format!("meta mark & 0x{mask:08x} != 0"),
            Expr::SetMark { bits } => format!("meta mark set meta mark | 0x{bits:08x}"),
            Expr::UpdateSet { keys, set } => format!("update @{set} {{ {} }}", keys_text(keys)),
            Expr::AddSet { keys, set } => format!("add @{set} {{ {} }}", keys_text(keys)),
            Expr::Counter => "counter".into(),
            Expr::CounterRef(n) => format!("counter name \"{n}\""),
            Expr::Notrack => "notrack".into(),
            Expr::SetNftrace => "meta nftrace set 1".into(),
            Expr::MapDnat { keys, map, v6 } => format!(
                "dnat {} to {} map @{map}",
                if *v6 { "ip6" } else { "ip" },
                keys_text(keys)
            ),
            Expr::Dnat {
                addr: IpAddr::V4(a),
                port,
            } => match port {
                Some(p) => format!("dnat ip to {a}:{p}"),
                None => format!("dnat ip to {a}"),
            },
            Expr::Dnat {
                addr: IpAddr::V6(a),
                port,
            } => match port {
                Some(p) => format!("dnat ip6 to [{a}]:{p}"),
                None => format!("dnat ip6 to {a}"),
            },
            Expr::Masquerade { fully_random } => {
                if *fully_random {
                    "masquerade fully-random".into()
                } else {
                    "masquerade".into()
                }
            }
            Expr::PickDnat { keys, modulus, map } => {
                let fam = if keys.contains(&Field::Ip6Daddr) {
                    "ip6"
                } else {
                    "ip"
                };
                format!(
                    "dnat {fam} to {} . numgen random mod {modulus} map @{map}",
                    keys_text(keys)
                )
            }
            Expr::Reject { tcp_reset: true } => "reject with tcp reset".into(),
            Expr::Reject { tcp_reset: false } => "reject".into(),
            Expr::Log { group, prefix } => {
                format!("log prefix \"{}\" group {group}", log_prefix(prefix))
            }
            Expr::Limit { rate, burst, over } => format!(
                "limit rate {}{rate}/second burst {burst} packets",
                if *over { "over " } else { "" }
            ),
            Expr::Verdict(v) => v.text(),
        }
    }
}

impl Rule {
    pub fn text(&self) -> String {
        let mut s = self
            .exprs
            .iter()
            .map(|e| e.text())
            .collect::<Vec<_>>()
            .join(" ");
        if let Some(c) = &self.comment {
            let _ = write!(s, " comment \"{}\"", c.replace('"', "'"));
        }
        s
    }
}

fn elem_text(key: &[Value], data: &Option<ElemData>) -> String {
    let k = key.iter().map(|v| v.text()).collect::<Vec<_>>().join(" . ");
    match data {
        Some(ElemData::Verdict(v)) => format!("{k} : {}", v.text()),
        Some(ElemData::Data(d)) => format!(
            "{k} : {}",
            d.iter().map(|v| v.text()).collect::<Vec<_>>().join(" . ")
        ),
        None => k,
    }
}

impl Set {
    /// The declaration (`type ... ; flags ...`) without elements.
    pub fn decl_text(&self) -> String {
        let key = self
            .key
            .iter()
            .map(|k| k.text())
            .collect::<Vec<_>>()
            .join(" . ");
        let mut s = match &self.data {
            Some(MapData::Verdict) => format!("type {key} : verdict;"),
            Some(MapData::Data(d)) => format!(
                "type {key} : {};",
                d.iter().map(|k| k.text()).collect::<Vec<_>>().join(" . ")
            ),
            None => format!("type {key};"),
        };
        let mut flags = Vec::new();
        if self.interval {
            flags.push("interval");
        }
        if self.timeout.is_some() {
            flags.push("timeout");
        }
        if self.dynamic {
            flags.push("dynamic");
        }
        if !flags.is_empty() {
            let _ = write!(s, " flags {};", flags.join(","));
        }
        if let Some(t) = self.timeout {
            let _ = write!(s, " timeout {t}s;");
        }
        if let Some(n) = self.size {
            let _ = write!(s, " size {n};");
        }
        s
    }

    pub fn element_text(key: &[Value], data: &Option<ElemData>) -> String {
        elem_text(key, data)
    }
}

impl Table {
    pub fn new(family: Family, name: &str) -> Table {
        Table {
            family,
            name: name.to_string(),
            sets: BTreeMap::new(),
            counters: BTreeSet::new(),
            chains: BTreeMap::new(),
        }
    }

    /// The whole table as `nft -f` input (deterministic: for golden tests).
    pub fn render(&self) -> String {
        let mut s = format!("table {} {} {{\n", self.family.name(), self.name);
        for c in &self.counters {
            let _ = writeln!(s, "\tcounter {c} {{\n\t}}");
        }
        for (name, set) in &self.sets {
            let kw = if set.data.is_some() { "map" } else { "set" };
            let _ = writeln!(s, "\t{kw} {name} {{\n\t\t{}", set.decl_text());
            if !set.elements.is_empty() {
                let els: Vec<String> = set
                    .elements
                    .iter()
                    .map(|(k, d)| match set.comments.get(k) {
                        Some(c) => {
                            format!("{} comment \"{}\"", elem_text(k, d), c.replace('"', "'"))
                        }
                        None => elem_text(k, d),
                    })
                    .collect();
                let _ = writeln!(s, "\t\telements = {{ {} }}", els.join(",\n\t\t\t     "));
            }
            s.push_str("\t}\n");
        }
        for (name, c) in &self.chains {
            let _ = writeln!(s, "\tchain {name} {{");
            if let Some(b) = &c.base {
                let kind = match b.kind {
                    ChainType::Filter => "filter",
                    ChainType::Nat => "nat",
                };
                let hook = match b.hook {
                    Hook::Prerouting => "prerouting",
                    Hook::Input => "input",
                    Hook::Forward => "forward",
                    Hook::Output => "output",
                    Hook::Postrouting => "postrouting",
                };
                let _ = writeln!(
                    s,
                    "\t\ttype {kind} hook {hook} priority {}; policy accept;",
                    b.priority
                );
            }
            for r in &c.rules {
                let _ = writeln!(s, "\t\t{}", r.text());
            }
            s.push_str("\t}\n");
        }
        s.push_str("}\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_values_have_one_canonical_spelling() {
        let net = |s: &str| Value::Net(s.parse().unwrap());
        let addr = |s: &str| Value::Addr(s.parse().unwrap());
        for (given, canonical) in [
            (net("10.0.0.5/32"), addr("10.0.0.5")),
            (net("fd00::5/128"), addr("fd00::5")),
            (net("10.0.0.5/24"), net("10.0.0.0/24")),
            (net("10.0.0.0/24"), net("10.0.0.0/24")),
            (addr("10.0.0.5"), addr("10.0.0.5")),
            (Value::PortRange(80, 80), Value::Port(80)),
            (Value::PortRange(80, 90), Value::PortRange(80, 90)),
            (Value::Port(80), Value::Port(80)),
        ] {
            assert_eq!(given.canonical(), canonical, "{given:?}");
            assert_eq!(given.is_canonical(), given == canonical, "{given:?}");
        }
        assert_eq!(Value::PortRange(80, 90).text(), "80-90");
    }
}
