//! nf_tables over netlink: a change list ([`crate::diff::Change`]) encoded as
//! one nfnetlink batch, applied as one kernel transaction (all or nothing),
//! without the `nft` tool re-reading the table on every call.
//!
//! Registers: single values go in the 16-byte `NFT_REG_1`/`NFT_REG_2`;
//! concatenated keys are laid out in consecutive 32-bit registers from
//! `NFT_REG32_00`, each field padded to four bytes, which is also how set
//! keys are laid out in elements.

use std::net::IpAddr;

use podnet_kernel::nl::{Msg, Socket, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE};
use podnet_kernel::KernelError;

use crate::diff::Change;
use crate::model::{
    BaseChain, ChainType, ElemData, Expr, Family, Field, Hook, KeyType, MapData, Rule, Set, Table,
    Value, Verdict,
};

const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;

const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_DELSET: u16 = 11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;

const NFTA_LIST_ELEM: u16 = 1;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_REG_2: u32 = 2;
const NFT_REG32_00: u32 = 8;

const NF_DROP: i32 = 0;
const NF_ACCEPT: i32 = 1;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
const NFT_RETURN: i32 = -5;

fn family_num(f: Family) -> u8 {
    match f {
        Family::Ip => 2,
        Family::Ip6 => 10,
        Family::Inet => 1,
    }
}

fn msg(t: &Table, cmd: u16, flags: u16) -> Msg {
    let mut m = Msg::new((NFNL_SUBSYS_NFTABLES << 8) | cmd, flags | NLM_F_ACK);
    m.raw(&[family_num(t.family), 0, 0, 0]);
    m
}

fn field_len(k: KeyType) -> usize {
    match k {
        KeyType::Ipv4Addr => 4,
        KeyType::Ipv6Addr => 16,
        KeyType::InetProto => 1,
        KeyType::InetService => 2,
        KeyType::Mark => 4,
    }
}

fn padded(n: usize) -> usize {
    (n + 3) & !3
}

/// nft's own datatype ids, so `nft list` shows our sets readably.
fn type_id(k: KeyType) -> u32 {
    match k {
        KeyType::Ipv4Addr => 7,
        KeyType::Ipv6Addr => 8,
        KeyType::InetProto => 12,
        KeyType::InetService => 13,
        KeyType::Mark => 19,
    }
}

fn value_bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::Addr(IpAddr::V4(a)) => a.octets().to_vec(),
        Value::Addr(IpAddr::V6(a)) => a.octets().to_vec(),
        Value::Net(n) => match n.network() {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        },
        Value::Proto(p) => vec![p.number()],
        Value::Port(p) => p.to_be_bytes().to_vec(),
        Value::U32(x) => x.to_ne_bytes().to_vec(),
    }
}

/// A concatenated key, each field padded to a 4-byte boundary.
fn key_bytes(vals: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in vals {
        let b = value_bytes(v);
        let l = padded(b.len());
        out.extend_from_slice(&b);
        out.resize(out.len() + (l - b.len()), 0);
    }
    out
}

fn verdict(m: &mut Msg, v: &Verdict) {
    let (code, chain) = match v {
        Verdict::Accept => (NF_ACCEPT, None),
        Verdict::Drop => (NF_DROP, None),
        Verdict::Return => (NFT_RETURN, None),
        Verdict::Jump(c) => (NFT_JUMP, Some(c)),
        Verdict::Goto(c) => (NFT_GOTO, Some(c)),
    };
    m.begin(NFTA_DATA_VERDICT);
    m.u32_be(NFTA_VERDICT_CODE, code as u32);
    if let Some(c) = chain {
        m.str(NFTA_VERDICT_CHAIN, c);
    }
    m.end();
}

struct Ex<'a> {
    m: &'a mut Msg,
}

impl Ex<'_> {
    fn expr(&mut self, name: &str, body: impl FnOnce(&mut Msg)) {
        self.m.begin(NFTA_LIST_ELEM);
        self.m.str(1, name); // NFTA_EXPR_NAME
        self.m.begin(2); // NFTA_EXPR_DATA
        body(self.m);
        self.m.end().end();
    }

    fn payload(&mut self, base: u32, offset: u32, len: u32, dreg: u32) {
        self.expr("payload", |m| {
            m.u32_be(1, dreg)
                .u32_be(2, base)
                .u32_be(3, offset)
                .u32_be(4, len);
        });
    }

    fn meta(&mut self, key: u32, dreg: u32) {
        self.expr("meta", |m| {
            m.u32_be(2, key).u32_be(1, dreg);
        });
    }

    fn cmp(&mut self, sreg: u32, neq: bool, data: &[u8]) {
        self.expr("cmp", |m| {
            m.u32_be(1, sreg).u32_be(2, neq as u32);
            m.begin(3).attr(NFTA_DATA_VALUE, data).end();
        });
    }

    fn bitwise(&mut self, reg: u32, mask: &[u8], xor: &[u8]) {
        self.expr("bitwise", |m| {
            m.u32_be(1, reg).u32_be(2, reg).u32_be(3, mask.len() as u32);
            m.begin(4).attr(NFTA_DATA_VALUE, mask).end();
            m.begin(5).attr(NFTA_DATA_VALUE, xor).end();
        });
    }

    fn immediate_data(&mut self, dreg: u32, data: &[u8]) {
        self.expr("immediate", |m| {
            m.u32_be(1, dreg);
            m.begin(2).attr(NFTA_DATA_VALUE, data).end();
        });
    }

    fn verdict(&mut self, v: &Verdict) {
        self.expr("immediate", |m| {
            m.u32_be(1, NFT_REG_VERDICT);
            m.begin(2);
            verdict(m, v);
            m.end();
        });
    }

    /// Loads a field into `reg`; returns its length in bytes.
    fn load(&mut self, f: Field, reg: u32) -> usize {
        match f {
            Field::IpSaddr => self.payload(1, 12, 4, reg),
            Field::IpDaddr => self.payload(1, 16, 4, reg),
            Field::Ip6Saddr => self.payload(1, 8, 16, reg),
            Field::Ip6Daddr => self.payload(1, 24, 16, reg),
            Field::L4Proto => self.meta(16, reg),
            Field::Dport => self.payload(2, 2, 2, reg),
            Field::Mark => self.meta(3, reg),
            // NFT_CT_DST_IP / NFT_CT_DST_IP6 / NFT_CT_PROTO_DST, original direction.
            Field::CtOrigIpDaddr => self.ct_orig(20, reg),
            Field::CtOrigIp6Daddr => self.ct_orig(22, reg),
            Field::CtOrigDport => self.ct_orig(12, reg),
        }
        field_len(f.key_type())
    }

    fn ct_orig(&mut self, key: u32, dreg: u32) {
        self.expr("ct", |m| {
            m.u32_be(2, key).u32_be(1, dreg).u8(3, 0); // NFTA_CT_DIRECTION: original
        });
    }

    /// Loads a concatenation into 32-bit registers from NFT_REG32_00;
    /// returns the first register after it.
    fn load_keys_end(&mut self, keys: &[Field]) -> u32 {
        self.load_keys(keys);
        NFT_REG32_00 + keys_regs(keys)
    }

    /// Loads a concatenation into 32-bit registers from NFT_REG32_00.
    fn load_keys(&mut self, keys: &[Field]) -> u32 {
        let mut reg = NFT_REG32_00;
        for k in keys {
            let len = self.load(*k, reg);
            reg += (padded(len) / 4) as u32;
        }
        NFT_REG32_00
    }

    fn lookup(&mut self, set: &str, sreg: u32, dreg: Option<u32>, neg: bool) {
        self.expr("lookup", |m| {
            m.str(1, set).u32_be(2, sreg);
            if let Some(d) = dreg {
                m.u32_be(3, d);
            }
            if neg {
                m.u32_be(5, 1);
            }
        });
    }
}

/// How many 32-bit registers a concatenation of `keys` fills.
fn keys_regs(keys: &[Field]) -> u32 {
    keys.iter()
        .map(|k| (padded(field_len(k.key_type())) / 4) as u32)
        .sum()
}

fn prefix_mask(len: u8, bytes: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes];
    for (i, b) in out.iter_mut().enumerate() {
        let bits = (len as usize).saturating_sub(i * 8).min(8);
        *b = if bits == 0 { 0 } else { 0xffu8 << (8 - bits) };
    }
    out
}

fn encode_expr(x: &mut Ex<'_>, e: &Expr, family: Family) {
    match e {
        Expr::Cmp { field, neg, value } => {
            let len = x.load(*field, NFT_REG_1);
            match value {
                Value::Net(n) if n.prefix_len() < n.max_prefix_len() => {
                    let mask = prefix_mask(n.prefix_len(), len);
                    x.bitwise(NFT_REG_1, &mask, &vec![0; len]);
                    x.cmp(NFT_REG_1, *neg, &value_bytes(value));
                }
                v => x.cmp(NFT_REG_1, *neg, &value_bytes(v)),
            }
        }
        Expr::InSet { keys, set, neg } => {
            let r = if keys.len() == 1 {
                x.load(keys[0], NFT_REG_1);
                NFT_REG_1
            } else {
                x.load_keys(keys)
            };
            x.lookup(set, r, None, *neg);
        }
        Expr::VMap { keys, map } => {
            let r = if keys.len() == 1 {
                x.load(keys[0], NFT_REG_1);
                NFT_REG_1
            } else {
                x.load_keys(keys)
            };
            x.lookup(map, r, Some(NFT_REG_VERDICT), false);
        }
        Expr::Numgen { modulus, value } => {
            x.expr("numgen", |m| {
                m.u32_be(1, NFT_REG_1).u32_be(2, *modulus).u32_be(3, 1);
            });
            x.cmp(NFT_REG_1, false, &value.to_ne_bytes());
        }
        Expr::FibDaddrLocal => {
            x.expr("fib", |m| {
                // result: address type; flags: daddr
                m.u32_be(1, NFT_REG_1).u32_be(2, 3).u32_be(3, 2);
            });
            x.cmp(NFT_REG_1, false, &2u32.to_ne_bytes()); // RTN_LOCAL
        }
        Expr::FibSaddrLocal => {
            x.expr("fib", |m| {
                // result: address type; flags: saddr
                m.u32_be(1, NFT_REG_1).u32_be(2, 3).u32_be(3, 1);
            });
            x.cmp(NFT_REG_1, false, &2u32.to_ne_bytes()); // RTN_LOCAL
        }
        Expr::CtDnat => {
            x.expr("ct", |m| {
                m.u32_be(2, 2).u32_be(1, NFT_REG_1); // NFT_CT_STATUS
            });
            x.bitwise(NFT_REG_1, &0x20u32.to_ne_bytes(), &[0; 4]); // IPS_DST_NAT
            x.cmp(NFT_REG_1, true, &[0; 4]);
        }
        Expr::CtStateNew => {
            x.expr("ct", |m| {
                m.u32_be(2, 0).u32_be(1, NFT_REG_1); // NFT_CT_STATE
            });
            x.bitwise(NFT_REG_1, &8u32.to_ne_bytes(), &[0; 4]); // NF_CT_STATE_BIT(IP_CT_NEW)
            x.cmp(NFT_REG_1, true, &[0; 4]);
        }
        Expr::MarkSet { mask } => {
            x.meta(3, NFT_REG_1);
            x.bitwise(NFT_REG_1, &mask.to_ne_bytes(), &[0; 4]);
            x.cmp(NFT_REG_1, true, &[0; 4]);
        }
        Expr::SetMark { bits } => {
            x.meta(3, NFT_REG_1);
            x.bitwise(NFT_REG_1, &(!bits).to_ne_bytes(), &bits.to_ne_bytes());
            x.expr("meta", |m| {
                m.u32_be(2, 3).u32_be(3, NFT_REG_1);
            });
        }
        Expr::UpdateSet { keys, set } => {
            let r = if keys.len() == 1 {
                x.load(keys[0], NFT_REG_1);
                NFT_REG_1
            } else {
                x.load_keys(keys)
            };
            x.expr("dynset", |m| {
                m.str(1, set).u32_be(3, 1).u32_be(4, r);
            });
        }
        Expr::Counter => x.expr("counter", |m| {
            m.u64_be(1, 0).u64_be(2, 0);
        }),
        Expr::Dnat { addr, port } => {
            x.immediate_data(NFT_REG_1, &value_bytes(&Value::Addr(*addr)));
            if let Some(p) = port {
                x.immediate_data(NFT_REG_2, &p.to_be_bytes());
            }
            let fam = if addr.is_ipv4() { 2 } else { 10 };
            let _ = family;
            x.expr("nat", |m| {
                m.u32_be(1, 1).u32_be(2, fam).u32_be(3, NFT_REG_1);
                let mut flags = 1; // NF_NAT_RANGE_MAP_IPS
                if port.is_some() {
                    m.u32_be(5, NFT_REG_2);
                    flags |= 2; // NF_NAT_RANGE_PROTO_SPECIFIED
                }
                m.u32_be(7, flags);
            });
        }
        Expr::PickDnat { keys, modulus, map } => {
            // keys . index -> address . port, right after the key registers.
            let idx = x.load_keys_end(keys);
            x.expr("numgen", |m| {
                m.u32_be(1, idx).u32_be(2, *modulus).u32_be(3, 1);
            });
            let addr = idx + 1;
            x.lookup(map, NFT_REG32_00, Some(addr), false);
            let v6 = keys.contains(&Field::Ip6Daddr);
            let port = addr + if v6 { 4 } else { 1 };
            x.expr("nat", |m| {
                m.u32_be(1, 1) // NFT_NAT_DNAT
                    .u32_be(2, if v6 { 10 } else { 2 })
                    .u32_be(3, addr)
                    .u32_be(5, port)
                    .u32_be(7, 3); // MAP_IPS | PROTO_SPECIFIED
            });
        }
        Expr::Masquerade { fully_random } => x.expr("masq", |m| {
            if *fully_random {
                m.u32_be(1, 0x10);
            }
        }),
        Expr::Reject { tcp_reset } => {
            if *tcp_reset {
                x.meta(16, NFT_REG_1);
                x.cmp(NFT_REG_1, false, &[6]);
                x.expr("reject", |m| {
                    m.u32_be(1, 1);
                });
            } else {
                // The family's own ICMP type: the kernel's ip and ip6 reject
                // evaluate only NFT_REJECT_ICMP_UNREACH and TCP_RST, and
                // silently drop an icmpx reject (which only `inet` and
                // `bridge` tables understand).
                let (ty, code) = match family {
                    Family::Ip => (0, 3),  // ICMP_PORT_UNREACH
                    Family::Ip6 => (0, 4), // ICMPV6_PORT_UNREACH
                    _ => (2, 1),           // NFT_REJECT_ICMPX_PORT_UNREACH
                };
                x.expr("reject", |m| {
                    m.u32_be(1, ty).u8(2, code);
                });
            }
        }
        Expr::Verdict(v) => x.verdict(v),
    }
}

fn rule_msg(t: &Table, chain: &str, r: &Rule) -> Msg {
    let mut m = msg(t, NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND);
    m.str(1, &t.name).str(2, chain);
    m.begin(4);
    {
        let mut x = Ex { m: &mut m };
        for e in &r.exprs {
            encode_expr(&mut x, e, t.family);
        }
    }
    m.end();
    if let Some(c) = &r.comment {
        // libnftnl udata: type 0 (comment), length, NUL-terminated text.
        let mut ud = vec![0u8, (c.len() + 1).min(255) as u8];
        ud.extend_from_slice(&c.as_bytes()[..c.len().min(254)]);
        ud.push(0);
        m.attr(7, &ud);
    }
    m
}

fn set_msg(t: &Table, name: &str, s: &Set) -> Msg {
    let mut m = msg(t, NFT_MSG_NEWSET, NLM_F_CREATE);
    let key_len: usize = s.key.iter().map(|k| padded(field_len(*k))).sum();
    let mut flags = 0u32;
    if s.interval {
        flags |= 0x4;
    }
    if s.data.is_some() {
        flags |= 0x8;
    }
    if s.timeout.is_some() {
        flags |= 0x10;
    }
    if s.key.len() > 1 {
        flags |= 0x80; // NFT_SET_CONCAT
    }
    let ty = s.key.iter().fold(0u32, |acc, k| (acc << 6) | type_id(*k));
    m.str(1, &t.name)
        .str(2, name)
        .u32_be(3, flags)
        .u32_be(4, ty)
        .u32_be(5, key_len as u32);
    match &s.data {
        Some(MapData::Verdict) => {
            m.u32_be(6, 0xffff_ff00).u32_be(7, 0);
        }
        Some(MapData::Data(d)) => {
            let ty = d.iter().fold(0u32, |acc, k| (acc << 6) | type_id(*k));
            let len: usize = d.iter().map(|k| padded(field_len(*k))).sum();
            m.u32_be(6, ty).u32_be(7, len as u32);
        }
        None => {}
    }
    if let Some(secs) = s.timeout {
        m.u64_be(11, secs as u64 * 1000);
    }
    m.u32_be(10, 1); // NFTA_SET_ID
    if s.key.len() > 1 {
        m.begin(9).begin(2);
        for k in &s.key {
            m.begin(NFTA_LIST_ELEM)
                .u32_be(1, field_len(*k) as u32)
                .end();
        }
        m.end().end();
    }
    m
}

fn elems_msgs(
    t: &Table,
    set: &str,
    elems: &[(Vec<Value>, Option<ElemData>)],
    add: bool,
) -> Vec<Msg> {
    let mut out = Vec::new();
    // Keep every message's nested element list under the 64 KiB attribute limit.
    for chunk in elems.chunks(256) {
        let mut m = msg(
            t,
            if add {
                NFT_MSG_NEWSETELEM
            } else {
                NFT_MSG_DELSETELEM
            },
            if add { NLM_F_CREATE } else { 0 },
        );
        m.str(1, &t.name).str(2, set);
        m.begin(3);
        for (k, d) in chunk {
            m.begin(NFTA_LIST_ELEM);
            m.begin(1).attr(NFTA_DATA_VALUE, &key_bytes(k)).end();
            if add {
                match d {
                    Some(ElemData::Verdict(v)) => {
                        m.begin(2);
                        verdict(&mut m, v);
                        m.end();
                    }
                    Some(ElemData::Data(vals)) => {
                        m.begin(2).attr(NFTA_DATA_VALUE, &key_bytes(vals)).end();
                    }
                    None => {}
                }
            }
            m.end();
        }
        m.end();
        out.push(m);
    }
    out
}

fn hook_num(h: Hook) -> u32 {
    match h {
        Hook::Prerouting => 0,
        Hook::Input => 1,
        Hook::Forward => 2,
        Hook::Output => 3,
        Hook::Postrouting => 4,
    }
}

fn chain_msg(t: &Table, name: &str, base: &Option<BaseChain>) -> Msg {
    let mut m = msg(t, NFT_MSG_NEWCHAIN, NLM_F_CREATE);
    m.str(1, &t.name).str(3, name);
    if let Some(b) = base {
        m.begin(4)
            .u32_be(1, hook_num(b.hook))
            .u32_be(2, b.priority as u32)
            .end();
        m.u32_be(5, NF_ACCEPT as u32);
        m.str(
            7,
            if b.kind == ChainType::Nat {
                "nat"
            } else {
                "filter"
            },
        );
    }
    m
}

fn name_msg_table(t: &Table) -> Msg {
    let mut m = msg(t, NFT_MSG_DELTABLE, 0);
    m.str(1, &t.name);
    m
}

fn name_msg(t: &Table, cmd: u16, attr: u16, name: &str) -> Msg {
    let mut m = msg(t, cmd, 0);
    m.str(1, &t.name).str(attr, name);
    m
}

/// Encodes a change list as the messages of one batch.
pub fn encode(t: &Table, changes: &[Change]) -> (Vec<Msg>, Vec<String>) {
    let mut msgs = Vec::new();
    let mut what = Vec::new();
    encode_each(t, changes, &mut |m, ci, sub| {
        msgs.push(m);
        what.push(describe(t, &changes[ci], sub));
    });
    (msgs, what)
}

/// What message `sub` of change `c` does, for error texts (computed only
/// when a message fails: rendering every rule up front would cost as much
/// as encoding it).
fn describe(t: &Table, c: &Change, sub: usize) -> String {
    match c {
        Change::ResetTable if sub == 0 => format!("adding table {}", t.name),
        Change::ResetTable => format!("deleting table {}", t.name),
        Change::AddTable => format!("adding table {}", t.name),
        Change::AddSet { name, .. } => format!("adding set {name}"),
        Change::DelSet { name } => format!("deleting set {name}"),
        Change::AddChain { name, .. } => format!("adding chain {name}"),
        Change::DelChain { name } => format!("deleting chain {name}"),
        Change::FlushChain { name } => format!("flushing chain {name}"),
        Change::AddRules { chain, rules } => match rules.get(sub) {
            Some(r) => format!("adding rule to {chain}: {}", r.text()),
            None => format!("adding rule to {chain}"),
        },
        Change::AddElems { set, .. } => format!("adding elements to {set}"),
        Change::DelElems { set, .. } => format!("deleting elements from {set}"),
    }
}

/// Encodes each change's messages in order, handing each to `emit` with
/// the index of its change and its number within that change.
fn encode_each(t: &Table, changes: &[Change], emit: &mut dyn FnMut(Msg, usize, usize)) {
    for (ci, c) in changes.iter().enumerate() {
        match c {
            Change::ResetTable => {
                // add-then-delete: no error whether or not it existed.
                let mut m = msg(t, NFT_MSG_NEWTABLE, NLM_F_CREATE);
                m.str(1, &t.name);
                emit(m, ci, 0);
                emit(name_msg_table(t), ci, 1);
            }
            Change::AddTable => {
                let mut m = msg(t, NFT_MSG_NEWTABLE, NLM_F_CREATE);
                m.str(1, &t.name);
                emit(m, ci, 0);
            }
            Change::AddSet { name, set } => emit(set_msg(t, name, set), ci, 0),
            Change::DelSet { name } => emit(name_msg(t, NFT_MSG_DELSET, 2, name), ci, 0),
            Change::AddChain { name, base } => emit(chain_msg(t, name, base), ci, 0),
            Change::DelChain { name } => emit(name_msg(t, NFT_MSG_DELCHAIN, 3, name), ci, 0),
            Change::FlushChain { name } => emit(name_msg(t, NFT_MSG_DELRULE, 2, name), ci, 0),
            Change::AddRules { chain, rules } => {
                for (i, r) in rules.iter().enumerate() {
                    emit(rule_msg(t, chain, r), ci, i);
                }
            }
            Change::AddElems { set, elems } => {
                for (i, m) in elems_msgs(t, set, elems, true).into_iter().enumerate() {
                    emit(m, ci, i);
                }
            }
            Change::DelElems { set, keys } => {
                let e: Vec<(Vec<Value>, Option<ElemData>)> =
                    keys.iter().map(|k| (k.clone(), None)).collect();
                for (i, m) in elems_msgs(t, set, &e, false).into_iter().enumerate() {
                    emit(m, ci, i);
                }
            }
        }
    }
}

/// An nfnetlink socket for applying batches (reuse it: opening costs).
pub struct Conn {
    sock: Socket,
}

impl Conn {
    pub fn open() -> Result<Conn, KernelError> {
        Ok(Conn {
            sock: Socket::open(NETLINK_NETFILTER)
                .map_err(|e| KernelError::io("opening nfnetlink socket", e))?,
        })
    }

    /// Applies the changes as one transaction.
    pub fn apply(&mut self, t: &Table, changes: &[Change]) -> Result<(), KernelError> {
        if changes.is_empty() {
            return Ok(());
        }
        // One chunk (a copy: partial syncs are small).
        self.apply_chunks(t, &mut |k| (k == 0).then(|| changes.to_vec()), &|_| {
            changes.to_vec()
        })
    }

    /// Applies one transaction whose changes come in chunks: `chunk(k)`
    /// gives chunk k (None after the last), which is encoded onto the wire
    /// buffer and dropped at once, so a full replace of a large table never
    /// holds its change list. `redo(k)` must give chunk k again; it is
    /// called only to name the change that failed.
    pub fn apply_chunks(
        &mut self,
        t: &Table,
        chunk: &mut dyn FnMut(usize) -> Option<Vec<Change>>,
        redo: &dyn Fn(usize) -> Vec<Change>,
    ) -> Result<(), KernelError> {
        // Message i of the batch came from index[i - 1] (0 is BEGIN).
        let index = std::cell::RefCell::new(Vec::<(u32, u32, u32)>::new());
        self.sock.batch_with(
            &mut |push| {
                let mut begin = Msg::new(NFNL_MSG_BATCH_BEGIN, 0);
                begin.raw(&[0, 0, 0, NFNL_SUBSYS_NFTABLES as u8]);
                push(begin);
                let mut k = 0;
                while let Some(changes) = chunk(k) {
                    encode_each(t, &changes, &mut |m, ci, sub| {
                        index.borrow_mut().push((k as u32, ci as u32, sub as u32));
                        push(m);
                    });
                    k += 1;
                }
                let mut end = Msg::new(NFNL_MSG_BATCH_END, 0);
                end.raw(&[0, 0, 0, NFNL_SUBSYS_NFTABLES as u8]);
                push(end);
            },
            &|i| {
                i.checked_sub(1)
                    .and_then(|i| index.borrow().get(i).copied())
                    .and_then(|(k, ci, sub)| {
                        let changes = redo(k as usize);
                        changes
                            .get(ci as usize)
                            .map(|c| describe(t, c, sub as usize))
                    })
                    .unwrap_or_else(|| "nf_tables batch".into())
            },
        )
    }

    /// The table's use count (its chains, sets and objects), or None when
    /// it does not exist: a cheap way to notice that someone else deleted
    /// the table or part of it, without reading its contents.
    pub fn table_use(&mut self, family: Family, name: &str) -> Result<Option<u32>, KernelError> {
        const NFTA_TABLE_USE: u16 = 3;
        let t = Table::new(family, name);
        let mut m = msg(&t, NFT_MSG_GETTABLE, 0);
        m.str(1, name);
        let replies = match self
            .sock
            .request(m, &|| format!("reading table {} {name}", family.name()))
        {
            Ok(r) => r,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        for r in replies {
            let attrs = r.body.get(4..).unwrap_or_default();
            for (ty, v) in podnet_kernel::nl::Attrs::new(attrs) {
                if ty == NFTA_TABLE_USE && v.len() >= 4 {
                    return Ok(Some(u32::from_be_bytes([v[0], v[1], v[2], v[3]])));
                }
            }
        }
        Ok(Some(0))
    }

    /// Deletes a whole table (missing is fine).
    pub fn delete_table(&mut self, family: Family, name: &str) -> Result<bool, KernelError> {
        let t = Table::new(family, name);
        let mut m = msg(&t, NFT_MSG_DELTABLE, 0);
        m.str(1, name);
        let mut begin = Msg::new(NFNL_MSG_BATCH_BEGIN, 0);
        begin.raw(&[0, 0, 0, NFNL_SUBSYS_NFTABLES as u8]);
        let mut end = Msg::new(NFNL_MSG_BATCH_END, 0);
        end.raw(&[0, 0, 0, NFNL_SUBSYS_NFTABLES as u8]);
        match self
            .sock
            .batch(vec![begin, m, end], &|_| format!("deleting table {name}"))
        {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_padded_per_field() {
        let k = key_bytes(&[
            Value::Addr("10.96.0.1".parse().unwrap()),
            Value::Proto(crate::model::Proto::Tcp),
            Value::Port(443),
        ]);
        assert_eq!(k, vec![10, 96, 0, 1, 6, 0, 0, 0, 1, 187, 0, 0]);
        assert_eq!(prefix_mask(20, 4), vec![255, 255, 240, 0]);
        assert_eq!(prefix_mask(0, 4), vec![0, 0, 0, 0]);
    }
}
