//! nf_tables over netlink: a change list ([`crate::diff::Change`]) encoded as
//! one nfnetlink batch, applied as one kernel transaction (all or nothing),
//! without the `nft` tool re-reading the table on every call.
//!
//! Reading back ([`Conn::observe`], [`Conn::elements`], [`Conn::counter`])
//! is netlink too: chains, rules, sets, their elements (with comments) and
//! named counters are dumped and decoded into the same model, so a sync is
//! observe → diff → apply, and a table changed behind our back is repaired
//! by the same diff. Rules are compared by shape (the kernel expressions
//! each rule is made of, and its comment) rather than decoded: enough to
//! notice a rule deleted, added or replaced.
//!
//! In `inet` tables a match on an IPv4 or IPv6 header field first checks
//! `meta nfproto`, as `nft` does, so an IPv6 packet is never read as IPv4.
//!
//! Registers: single values go in the 16-byte `NFT_REG_1`/`NFT_REG_2`;
//! concatenated keys are laid out in consecutive 32-bit registers from
//! `NFT_REG32_00`, each field padded to four bytes, which is also how set
//! keys are laid out in elements. A one-field key is as long as its field
//! (a port is two bytes), as `nft` declares it, so `nft list` shows it.
//!
//! Interval sets hold ranges the way `nft` writes them, so the kernel picks
//! the same set type and `nft list` shows the same elements: a
//! concatenation (the pipapo set) sends each element's last values in
//! `KEY_END`, a single address or port being the range [x, x]; a one-field
//! set (the rbtree set) sends an element at the range's first value and one
//! flagged `INTERVAL_END` at the value after its last. Either reads back in
//! the canonical spelling of [`crate::model::Value`].

use std::collections::BTreeMap;
use std::net::IpAddr;

use podnet_kernel::nl::{
    get_str, Attrs, Msg, Socket, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP,
};
use podnet_kernel::KernelError;

use crate::diff::Change;
use crate::model::{
    BaseChain, Chain, ChainType, ElemData, Expr, Family, Field, Hook, KeyType, MapData, Proto,
    Rule, Set, Table, Value, Verdict,
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
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_GETSET: u16 = 10;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_GETSETELEM: u16 = 13;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFT_MSG_NEWOBJ: u16 = 18;
const NFT_MSG_GETOBJ: u16 = 19;
const NFT_MSG_DELOBJ: u16 = 20;
const NFT_OBJECT_COUNTER: u32 = 1;

const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_SET_ELEM_FLAGS: u16 = 3;
const NFTA_SET_ELEM_KEY_END: u16 = 10;
const NFT_SET_ELEM_INTERVAL_END: u32 = 1;

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
        Family::Bridge => 7,
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
        KeyType::IfName => 16,
        KeyType::EtherAddr => 6,
        KeyType::NfProto | KeyType::PktType | KeyType::Icmp6Type => 1,
        KeyType::EtherType => 2,
        KeyType::DevGroup => 4,
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
        KeyType::IfName => 41,
        KeyType::EtherAddr => 9,
        KeyType::NfProto => 2,
        KeyType::PktType => 31,
        KeyType::EtherType => 10,
        KeyType::Icmp6Type => 29,
        KeyType::DevGroup => 43,
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
        Value::Port(p) | Value::PortRange(p, _) => p.to_be_bytes().to_vec(),
        Value::U32(x) => x.to_ne_bytes().to_vec(),
        Value::U8(x) => vec![*x],
        Value::U16(x) => x.to_be_bytes().to_vec(),
        Value::Name(n) => {
            // IFNAMSIZ, NUL padded (what `meta iifname` loads).
            let mut b = n.as_bytes()[..n.len().min(15)].to_vec();
            b.resize(16, 0);
            b
        }
        Value::Mac(m) => m.to_vec(),
    }
}

/// The last value of a range element: a prefix's last address, a port
/// range's last port, else the value itself (a single address or port is
/// the range [x, x]).
fn value_end_bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::Net(n) => match n.broadcast() {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        },
        Value::PortRange(_, hi) => hi.to_be_bytes().to_vec(),
        v => value_bytes(v),
    }
}

/// A concatenated range end, laid out like [`key_bytes`].
fn key_end_bytes(vals: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in vals {
        let b = value_end_bytes(v);
        let l = padded(b.len());
        out.extend_from_slice(&b);
        out.resize(out.len() + (l - b.len()), 0);
    }
    out
}

/// libnftnl's user data for a comment (rules: type 0, element: type 0):
/// type, length, NUL-terminated text.
fn comment_udata(c: &str) -> Vec<u8> {
    let text = &c.as_bytes()[..c.len().min(254)];
    let mut ud = vec![0u8, (text.len() + 1) as u8];
    ud.extend_from_slice(text);
    ud.push(0);
    ud
}

fn comment_from_udata(ud: &[u8]) -> Option<String> {
    let mut i = 0;
    while i + 2 <= ud.len() {
        let (ty, len) = (ud[i], ud[i + 1] as usize);
        let v = ud.get(i + 2..i + 2 + len)?;
        if ty == 0 {
            let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
            return Some(String::from_utf8_lossy(&v[..end]).into_owned());
        }
        i += 2 + len;
    }
    None
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

/// A set element's key: a concatenation padded per field, a single field
/// as it is (as `nft` declares such a set, so `nft list` reads a port as a
/// port).
fn elem_key_bytes(vals: &[Value]) -> Vec<u8> {
    match vals {
        [v] => value_bytes(v),
        vals => key_bytes(vals),
    }
}

/// A set's key length: see [`elem_key_bytes`].
fn set_key_len(key: &[KeyType]) -> usize {
    match key {
        [k] => field_len(*k),
        key => key.iter().map(|k| padded(field_len(*k))).sum(),
    }
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
    family: Family,
    /// The `meta nfproto` this rule has checked so far (inet tables).
    checked: Option<u8>,
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
            Field::Sport => self.payload(2, 0, 2, reg),
            Field::Mark => self.meta(3, reg),
            // NFT_CT_DST_IP / NFT_CT_DST_IP6 / NFT_CT_PROTO_DST, original direction.
            Field::CtOrigIpDaddr => self.ct_orig(20, reg),
            Field::CtOrigIp6Daddr => self.ct_orig(22, reg),
            Field::CtOrigDport => self.ct_orig(12, reg),
            Field::IifName => self.meta(6, reg),
            Field::OifName => self.meta(7, reg),
            Field::EtherSaddr => self.payload(0, 6, 6, reg),
            Field::NfProto => self.meta(15, reg),
            Field::PktType => self.meta(19, reg),
            Field::EtherType => self.payload(0, 12, 2, reg),
            Field::ArpSha => self.payload(1, 8, 6, reg),
            Field::ArpSpa => self.payload(1, 14, 4, reg),
            Field::IifGroup => self.meta(21, reg), // NFT_META_IIFGROUP
            Field::Icmp6Type => self.payload(2, 0, 1, reg),
            Field::NdTarget => self.payload(2, 8, 16, reg),
        }
        field_len(f.key_type())
    }

    /// In an `inet` table, checks the layer-3 family the fields need before
    /// they are loaded (once per rule).
    fn family_dep(&mut self, fields: &[Field]) {
        if self.family != Family::Inet {
            return;
        }
        let need = fields.iter().find_map(|f| match f {
            Field::IpSaddr | Field::IpDaddr | Field::CtOrigIpDaddr => Some(2u8),
            Field::Ip6Saddr | Field::Ip6Daddr | Field::CtOrigIp6Daddr => Some(10u8),
            _ => None,
        });
        if let Some(p) = need {
            if self.checked != Some(p) {
                self.meta(15, NFT_REG_1);
                self.cmp(NFT_REG_1, false, &[p]);
                self.checked = Some(p);
            }
        }
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

/// The fields an expression reads from the packet's headers.
fn expr_fields(e: &Expr) -> &[Field] {
    match e {
        Expr::Cmp { field, .. } => std::slice::from_ref(field),
        Expr::InSet { keys, .. }
        | Expr::VMap { keys, .. }
        | Expr::UpdateSet { keys, .. }
        | Expr::AddSet { keys, .. }
        | Expr::PickDnat { keys, .. }
        | Expr::MapDnat { keys, .. } => keys,
        _ => &[],
    }
}

fn encode_expr(x: &mut Ex<'_>, e: &Expr, family: Family) {
    x.family_dep(expr_fields(e));
    if let Expr::Cmp {
        field: Field::NfProto,
        neg: false,
        value: Value::U8(p),
    } = e
    {
        // An explicit family check stands for the implicit one.
        x.checked = Some(*p);
    }
    match e {
        Expr::Cmp { field, neg, value } => {
            let len = x.load(*field, NFT_REG_1);
            match value {
                Value::Net(n) if n.prefix_len() < n.max_prefix_len() => {
                    let mask = prefix_mask(n.prefix_len(), len);
                    x.bitwise(NFT_REG_1, &mask, &vec![0; len]);
                    x.cmp(NFT_REG_1, *neg, &value_bytes(value));
                }
                Value::PortRange(lo, hi) => x.expr("range", |m| {
                    m.u32_be(1, NFT_REG_1).u32_be(2, *neg as u32); // NFT_RANGE_EQ / NEQ
                    m.begin(3).attr(NFTA_DATA_VALUE, &lo.to_be_bytes()).end();
                    m.begin(4).attr(NFTA_DATA_VALUE, &hi.to_be_bytes()).end();
                }),
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
        Expr::FibDaddrNotLocal => {
            x.expr("fib", |m| {
                m.u32_be(1, NFT_REG_1).u32_be(2, 3).u32_be(3, 2);
            });
            x.cmp(NFT_REG_1, true, &2u32.to_ne_bytes()); // != RTN_LOCAL
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
        Expr::CtStateInvalid => {
            x.expr("ct", |m| {
                m.u32_be(2, 0).u32_be(1, NFT_REG_1); // NFT_CT_STATE
            });
            x.bitwise(NFT_REG_1, &1u32.to_ne_bytes(), &[0; 4]); // NF_CT_STATE_INVALID_BIT
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
        Expr::AddSet { keys, set } => {
            let r = if keys.len() == 1 {
                x.load(keys[0], NFT_REG_1);
                NFT_REG_1
            } else {
                x.load_keys(keys)
            };
            x.expr("dynset", |m| {
                m.str(1, set).u32_be(3, 0).u32_be(4, r); // NFT_DYNSET_OP_ADD
            });
        }
        Expr::Counter => x.expr("counter", |m| {
            m.u64_be(1, 0).u64_be(2, 0);
        }),
        Expr::CounterRef(name) => x.expr("objref", |m| {
            m.u32_be(1, NFT_OBJECT_COUNTER).str(2, name);
        }),
        Expr::Notrack => x.expr("notrack", |_| {}),
        Expr::SetNftrace => {
            x.immediate_data(NFT_REG_1, &[1]);
            x.expr("meta", |m| {
                m.u32_be(2, 12).u32_be(3, NFT_REG_1); // NFT_META_NFTRACE, sreg
            });
        }
        Expr::MapDnat { keys, map, v6 } => {
            let addr = x.load_keys_end(keys);
            x.lookup(map, NFT_REG32_00, Some(addr), false);
            let port = addr + if *v6 { 4 } else { 1 };
            x.expr("nat", |m| {
                m.u32_be(1, 1) // NFT_NAT_DNAT
                    .u32_be(2, if *v6 { 10 } else { 2 })
                    .u32_be(3, addr)
                    .u32_be(5, port)
                    .u32_be(7, 3); // MAP_IPS | PROTO_SPECIFIED
            });
        }
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
        Expr::Log { group, prefix } => x.expr("log", |m| {
            // A group makes it an NFLOG (nfnetlink_log) logger, not syslog.
            m.u16_be(1, *group)
                .str(2, &crate::model::log_prefix(prefix));
        }),
        Expr::Limit { rate, burst, over } => x.expr("limit", |m| {
            m.u64_be(1, *rate) // NFTA_LIMIT_RATE
                .u64_be(2, 1) // NFTA_LIMIT_UNIT: per second
                .u32_be(3, *burst)
                .u32_be(4, 0) // NFTA_LIMIT_TYPE: NFT_LIMIT_PKTS
                .u32_be(5, *over as u32); // NFTA_LIMIT_FLAGS: NFT_LIMIT_F_INV
        }),
        Expr::Verdict(v) => x.verdict(v),
    }
}

fn rule_msg(t: &Table, chain: &str, r: &Rule) -> Msg {
    let mut m = msg(t, NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND);
    m.str(1, &t.name).str(2, chain);
    m.begin(4);
    {
        let mut x = Ex {
            m: &mut m,
            family: t.family,
            checked: None,
        };
        for e in &r.exprs {
            encode_expr(&mut x, e, t.family);
        }
    }
    m.end();
    if let Some(c) = &r.comment {
        m.attr(7, &comment_udata(c));
    }
    m
}

/// What a rule looks like in a dump: its expressions' names and its user
/// data (the comment).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shape {
    exprs: Vec<String>,
    udata: Option<Vec<u8>>,
}

/// Reads a rule's shape from its attributes (after the nfgenmsg header).
fn shape_of(attrs: &[u8]) -> (Option<String>, Shape) {
    let mut chain = None;
    let mut shape = Shape {
        exprs: Vec::new(),
        udata: None,
    };
    for (ty, v) in Attrs::new(attrs) {
        match ty {
            2 => chain = Some(get_str(v)),
            4 => {
                for (_, e) in Attrs::new(v) {
                    if let Some((_, n)) = Attrs::new(e).find(|(t, _)| *t == 1) {
                        shape.exprs.push(get_str(n));
                    }
                }
            }
            7 => shape.udata = Some(v.to_vec()),
            _ => {}
        }
    }
    (chain, shape)
}

/// The shape the kernel will report for one of our rules.
fn rule_shape(t: &Table, chain: &str, r: &Rule) -> Shape {
    let bytes = rule_msg(t, chain, r).finish(0);
    shape_of(&bytes[20..]).1
}

fn set_msg(t: &Table, name: &str, s: &Set) -> Msg {
    let mut m = msg(t, NFT_MSG_NEWSET, NLM_F_CREATE);
    let key_len = set_key_len(&s.key);
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
    if s.dynamic {
        flags |= 0x20; // NFT_SET_EVAL
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
    if s.key == [KeyType::IfName] {
        // libnftnl user data: the key is a host-endian string (without
        // it `nft list` shows the names as empty strings).
        let mut ud = vec![0u8, 4]; // NFTNL_UDATA_SET_KEYBYTEORDER
        ud.extend_from_slice(&1u32.to_ne_bytes()); // BYTEORDER_HOST_ENDIAN
        m.attr(13, &ud); // NFTA_SET_USERDATA
    }
    if s.key.len() > 1 || s.size.is_some() {
        m.begin(9); // NFTA_SET_DESC
        if let Some(n) = s.size {
            m.u32_be(1, n);
        }
        if s.key.len() > 1 {
            m.begin(2);
            for k in &s.key {
                m.begin(NFTA_LIST_ELEM)
                    .u32_be(1, field_len(*k) as u32)
                    .end();
            }
            m.end();
        }
        m.end();
    }
    m
}

/// What the kernel reports for a set we declared this way: flags, key
/// type, key length, data type, data length.
fn set_decl_attrs(s: &Set) -> (u32, u32, u32, Option<(u32, u32)>) {
    let bytes = set_msg(&Table::new(Family::Ip, "x"), "x", s).finish(0);
    let (mut flags, mut kt, mut kl, mut dt, mut dl) = (0, 0, 0, None, 0);
    for (ty, v) in Attrs::new(&bytes[20..]) {
        match ty {
            3 => flags = be32(v),
            4 => kt = be32(v),
            5 => kl = be32(v),
            6 => dt = Some(be32(v)),
            7 => dl = be32(v),
            _ => {}
        }
    }
    (flags, kt, kl, dt.map(|t| (t, dl)))
}

fn be32(v: &[u8]) -> u32 {
    v.get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .unwrap_or(0)
}

fn be64(v: &[u8]) -> u64 {
    v.get(..8)
        .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
        .unwrap_or(0)
}

/// One element as the encoder takes it: key, data, comment.
type Elem<'e> = (&'e [Value], Option<&'e ElemData>, Option<&'e str>);

/// How a set's elements hold ranges in the kernel.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ranges {
    /// Exact keys only.
    None,
    /// A concatenation (the pipapo set): one element, its range end in
    /// `KEY_END`.
    KeyEnd,
    /// One field (the rbtree set): an element opens the range at its first
    /// value, and a second one flagged `INTERVAL_END` closes it at the value
    /// after its last (none when the range runs to the field's end), as
    /// `nft` writes them; both are added and deleted together.
    EndElement,
}

fn ranges(s: &Set) -> Ranges {
    match (s.interval, s.key.len()) {
        (false, _) => Ranges::None,
        (true, 1) => Ranges::EndElement,
        (true, _) => Ranges::KeyEnd,
    }
}

/// Big-endian `b + 1`, or None when `b` is all ones.
fn after(b: &[u8]) -> Option<Vec<u8>> {
    let mut out = b.to_vec();
    for x in out.iter_mut().rev() {
        let (v, carry) = x.overflowing_add(1);
        *x = v;
        if !carry {
            return Some(out);
        }
    }
    None
}

/// Big-endian `b - 1`, or None when `b` is zero.
fn before(b: &[u8]) -> Option<Vec<u8>> {
    let mut out = b.to_vec();
    for x in out.iter_mut().rev() {
        let (v, borrow) = x.overflowing_sub(1);
        *x = v;
        if !borrow {
            return Some(out);
        }
    }
    None
}

/// The key of the element that closes a one-field range: the value after
/// its last; None when the range runs to the end.
fn interval_end_key(k: &[Value]) -> Option<Vec<u8>> {
    after(&value_end_bytes(k.first()?))
}

fn elems_msgs(t: &Table, set: &str, elems: &[Elem<'_>], add: bool) -> Vec<Msg> {
    let ranges = t.sets.get(set).map(ranges).unwrap_or(Ranges::None);
    let mut out = Vec::new();
    // Keep every message's nested element list under the 64 KiB attribute
    // limit (a one-field range is two elements).
    let per = if ranges == Ranges::EndElement {
        128
    } else {
        256
    };
    for chunk in elems.chunks(per) {
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
        for (k, d, c) in chunk {
            m.begin(NFTA_LIST_ELEM);
            m.begin(NFTA_SET_ELEM_KEY)
                .attr(NFTA_DATA_VALUE, &elem_key_bytes(k))
                .end();
            if ranges == Ranges::KeyEnd {
                m.begin(NFTA_SET_ELEM_KEY_END)
                    .attr(NFTA_DATA_VALUE, &key_end_bytes(k))
                    .end();
            }
            if add {
                match d {
                    Some(ElemData::Verdict(v)) => {
                        m.begin(NFTA_SET_ELEM_DATA);
                        verdict(&mut m, v);
                        m.end();
                    }
                    Some(ElemData::Data(vals)) => {
                        m.begin(NFTA_SET_ELEM_DATA)
                            .attr(NFTA_DATA_VALUE, &key_bytes(vals))
                            .end();
                    }
                    None => {}
                }
                if let Some(c) = c {
                    m.attr(NFTA_SET_ELEM_USERDATA, &comment_udata(c));
                }
            }
            m.end();
            if ranges == Ranges::EndElement {
                if let Some(end) = interval_end_key(k) {
                    m.begin(NFTA_LIST_ELEM);
                    m.begin(NFTA_SET_ELEM_KEY).attr(NFTA_DATA_VALUE, &end).end();
                    m.u32_be(NFTA_SET_ELEM_FLAGS, NFT_SET_ELEM_INTERVAL_END);
                    m.end();
                }
            }
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
        Change::AddElems { set, .. } | Change::AddCommented { set, .. } => {
            format!("adding elements to {set}")
        }
        Change::AddCounter { name } => format!("adding counter {name}"),
        Change::DelCounter { name } => format!("deleting counter {name}"),
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
                let e: Vec<Elem<'_>> = elems
                    .iter()
                    .map(|(k, d)| (k.as_slice(), d.as_ref(), None))
                    .collect();
                for (i, m) in elems_msgs(t, set, &e, true).into_iter().enumerate() {
                    emit(m, ci, i);
                }
            }
            Change::AddCommented { set, elems } => {
                let e: Vec<Elem<'_>> = elems
                    .iter()
                    .map(|(k, d, c)| (k.as_slice(), d.as_ref(), Some(c.as_str())))
                    .collect();
                for (i, m) in elems_msgs(t, set, &e, true).into_iter().enumerate() {
                    emit(m, ci, i);
                }
            }
            Change::DelElems { set, keys } => {
                let e: Vec<Elem<'_>> = keys.iter().map(|k| (k.as_slice(), None, None)).collect();
                for (i, m) in elems_msgs(t, set, &e, false).into_iter().enumerate() {
                    emit(m, ci, i);
                }
            }
            Change::AddCounter { name } => {
                let mut m = msg(t, NFT_MSG_NEWOBJ, NLM_F_CREATE);
                m.str(1, &t.name).str(2, name).u32_be(3, NFT_OBJECT_COUNTER);
                m.begin(4).u64_be(1, 0).u64_be(2, 0).end();
                emit(m, ci, 0);
            }
            Change::DelCounter { name } => {
                let mut m = msg(t, NFT_MSG_DELOBJ, 0);
                m.str(1, &t.name).str(2, name).u32_be(3, NFT_OBJECT_COUNTER);
                emit(m, ci, 0);
            }
        }
    }
}

fn hook_from_num(n: u32) -> Option<Hook> {
    Some(match n {
        0 => Hook::Prerouting,
        1 => Hook::Input,
        2 => Hook::Forward,
        3 => Hook::Output,
        4 => Hook::Postrouting,
        _ => return None,
    })
}

/// One field's value from its bytes and its range end, in the canonical
/// spelling of [`Value`]: a range [x, x] is `Addr`/`Port`, a wider one the
/// `Net` it spans or a `PortRange`.
fn decode_value(k: KeyType, b: &[u8], end: Option<&[u8]>) -> Option<Value> {
    let addr = |b: &[u8]| -> Option<IpAddr> {
        Some(match b.len() {
            4 => IpAddr::from(<[u8; 4]>::try_from(b).ok()?),
            _ => IpAddr::from(<[u8; 16]>::try_from(b).ok()?),
        })
    };
    Some(match k {
        KeyType::Ipv4Addr | KeyType::Ipv6Addr => {
            let start = addr(b)?;
            match end.filter(|e| *e != b) {
                Some(e) => {
                    let bits = b.len() * 8;
                    let (s, e) = (be_uint(b), be_uint(e));
                    let prefix = (s ^ e).leading_zeros() as usize - (128 - bits);
                    Value::Net(ipnet::IpNet::new(start, prefix as u8).ok()?)
                }
                None => Value::Addr(start),
            }
        }
        KeyType::InetProto => match b.first()? {
            6 => Value::Proto(Proto::Tcp),
            17 => Value::Proto(Proto::Udp),
            132 => Value::Proto(Proto::Sctp),
            n => Value::U8(*n),
        },
        KeyType::InetService => {
            let port = |b: &[u8]| Some(u16::from_be_bytes([*b.first()?, *b.get(1)?]));
            let lo = port(b)?;
            match end.and_then(port).filter(|hi| *hi != lo) {
                Some(hi) => Value::PortRange(lo, hi),
                None => Value::Port(lo),
            }
        }
        KeyType::Mark => Value::U32(u32::from_ne_bytes(b.get(..4)?.try_into().ok()?)),
        KeyType::IfName => Value::Name(get_str(b)),
        KeyType::EtherAddr => Value::Mac(b.get(..6)?.try_into().ok()?),
        KeyType::NfProto | KeyType::PktType | KeyType::Icmp6Type => Value::U8(*b.first()?),
        KeyType::EtherType => Value::U16(u16::from_be_bytes(b.get(..2)?.try_into().ok()?)),
        KeyType::DevGroup => Value::U32(u32::from_ne_bytes(b.get(..4)?.try_into().ok()?)),
    })
}

fn be_uint(b: &[u8]) -> u128 {
    b.iter().fold(0u128, |acc, x| (acc << 8) | *x as u128)
}

/// A concatenated key (and range end) split by the key types.
fn decode_key(types: &[KeyType], b: &[u8], end: Option<&[u8]>) -> Option<Vec<Value>> {
    let mut off = 0;
    let mut out = Vec::with_capacity(types.len());
    for k in types {
        let len = field_len(*k);
        let field = b.get(off..off + len)?;
        let fend = end.and_then(|e| e.get(off..off + len));
        out.push(decode_value(*k, field, fend)?);
        off += padded(len);
    }
    Some(out)
}

/// One element of a one-field interval set as dumped: its key, whether it
/// closes a range, its data and comment.
type Bound = (Vec<u8>, bool, Option<ElemData>, Option<String>);

/// The ranges of a one-field interval set from its elements (in any
/// order): each opening element runs to the value before the next
/// element's (the closing one, normally), or to the field's end when none
/// follows. A closing element with nothing open (`nft` writes one at zero)
/// is no range.
fn pair_bounds(
    types: &[KeyType],
    mut bounds: Vec<Bound>,
) -> Vec<(Vec<Value>, Option<ElemData>, Option<String>)> {
    let Some(&k) = types.first() else {
        return Vec::new();
    };
    let len = field_len(k);
    // By key; at one key, the range that closes there before the one that opens.
    bounds.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let mut out = Vec::new();
    for (i, (key, closes, data, comment)) in bounds.iter().enumerate() {
        if *closes {
            continue;
        }
        let Some(first) = key.get(..len) else {
            continue;
        };
        let last = match bounds.get(i + 1) {
            Some((next, ..)) => next.get(..len).and_then(before),
            None => Some(vec![0xff; len]),
        };
        let Some(last) = last else { continue };
        if let Some(v) = decode_value(k, first, Some(&last)) {
            out.push((vec![v], data.clone(), comment.clone()));
        }
    }
    out
}

fn decode_data(attr: &[u8], data: &Option<MapData>) -> Option<ElemData> {
    for (ty, v) in Attrs::new(attr) {
        match (ty, data) {
            (NFTA_DATA_VALUE, Some(MapData::Data(types))) => {
                return decode_key(types, v, None).map(ElemData::Data)
            }
            (NFTA_DATA_VERDICT, _) => {
                let (mut code, mut chain) = (None, None);
                for (vt, vv) in Attrs::new(v) {
                    match vt {
                        NFTA_VERDICT_CODE => code = Some(be32(vv) as i32),
                        NFTA_VERDICT_CHAIN => chain = Some(get_str(vv)),
                        _ => {}
                    }
                }
                return Some(ElemData::Verdict(match (code?, chain) {
                    (NF_ACCEPT, _) => Verdict::Accept,
                    (NF_DROP, _) => Verdict::Drop,
                    (NFT_RETURN, _) => Verdict::Return,
                    (NFT_JUMP, Some(c)) => Verdict::Jump(c),
                    (NFT_GOTO, Some(c)) => Verdict::Goto(c),
                    _ => return None,
                }));
            }
            _ => {}
        }
    }
    None
}

/// Where a rule sits, as [`Conn::rule_refs`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRef {
    /// `nfgen_family`: 1 inet, 2 ip, 10 ip6, 7 bridge, 5 netdev.
    pub family: u8,
    pub table: String,
    pub chain: String,
    pub handle: u64,
    /// Its position in its chain, from 0.
    pub index: usize,
    pub comment: Option<String>,
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

    /// Sends a dump request and returns each reply's attributes (after the
    /// nfgenmsg header); `Ok(None)` when the table (or set) is missing.
    fn dump(
        &mut self,
        family: Family,
        table: Option<&str>,
        cmd: u16,
        attrs: &dyn Fn(&mut Msg),
        what: &dyn Fn() -> String,
    ) -> Result<Option<Vec<Vec<u8>>>, KernelError> {
        let mut m = Msg::new((NFNL_SUBSYS_NFTABLES << 8) | cmd, NLM_F_DUMP);
        m.raw(&[family_num(family), 0, 0, 0]);
        attrs(&mut m);
        match self.sock.request(m, what) {
            // Some dumps (chains) list every table of the family whatever
            // the filter says: keep the table asked for (attribute 1 is
            // the table name in chain, rule, set and object messages).
            Ok(r) => Ok(Some(
                r.into_iter()
                    .map(|r| r.body.get(4..).unwrap_or_default().to_vec())
                    .filter(|a| {
                        table
                            .is_none_or(|t| Attrs::new(a).any(|(ty, v)| ty == 1 && get_str(v) == t))
                    })
                    .collect(),
            )),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every rule of every table in the namespace, in chain order: what a
    /// trace event's (table, chain, handle) refers to. For a table of ours
    /// the rule's place in its chain is its place in the plan.
    pub fn rule_refs(&mut self) -> Result<Vec<RuleRef>, KernelError> {
        let mut m = Msg::new((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETRULE, NLM_F_DUMP);
        m.raw(&[0, 0, 0, 0]); // every family
        let replies = self.sock.request(m, &|| "listing nftables rules".into())?;
        let mut out: Vec<RuleRef> = Vec::new();
        let mut seen: BTreeMap<(u8, String, String), usize> = BTreeMap::new();
        for r in replies {
            let Some(&family) = r.body.first() else {
                continue;
            };
            let mut rr = RuleRef {
                family,
                table: String::new(),
                chain: String::new(),
                handle: 0,
                index: 0,
                comment: None,
            };
            for (ty, v) in Attrs::new(r.body.get(4..).unwrap_or_default()) {
                match ty {
                    1 => rr.table = get_str(v),
                    2 => rr.chain = get_str(v),
                    3 if v.len() >= 8 => {
                        rr.handle = u64::from_be_bytes(v[..8].try_into().unwrap_or_default())
                    }
                    7 => rr.comment = comment_from_udata(v),
                    _ => {}
                }
            }
            let next = seen
                .entry((family, rr.table.clone(), rr.chain.clone()))
                .or_insert(0);
            rr.index = *next;
            *next += 1;
            out.push(rr);
        }
        Ok(out)
    }

    /// The kernel's copy of table `want.family`/`want.name` in the model's
    /// terms, or None when it does not exist. Chains, sets, counters and
    /// elements are read as they are; a chain whose rules have the shapes of
    /// `want`'s rules is taken to hold them, any other rule shows up as an
    /// unplanned one, and a set declared otherwise than in `want` as an
    /// undeclared one, so [`crate::diff::diff`] from this to `want` is the
    /// repair. The elements of sets the kernel fills itself are not read.
    pub fn observe(&mut self, want: &Table) -> Result<Option<Table>, KernelError> {
        let (fam, name) = (want.family, want.name.as_str());
        let what = || format!("reading table {} {name}", fam.name());
        let by_table = |m: &mut Msg| {
            m.str(1, name);
        };
        let Some(used) = self.table_use(fam, name)? else {
            return Ok(None);
        };
        let mut t = Table::new(fam, name);
        // Chains one at a time by name: a chain dump lists every chain of
        // the family (the service proxy's thousands too). Only when the
        // table holds more than that (its use count covers chains, sets
        // and objects) is the whole family dumped, to find the strays.
        let mut chains = Vec::new();
        for cname in want.chains.keys() {
            let mut m = msg(want, NFT_MSG_GETCHAIN, 0);
            m.str(1, name).str(3, cname);
            match self.sock.request(m, &what) {
                Ok(r) => chains.extend(
                    r.into_iter()
                        .map(|r| r.body.get(4..).unwrap_or_default().to_vec()),
                ),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        let sets = self
            .dump(fam, Some(name), NFT_MSG_GETSET, &by_table, &what)?
            .unwrap_or_default();
        let objs = self
            .dump(
                fam,
                Some(name),
                NFT_MSG_GETOBJ,
                &|m: &mut Msg| {
                    m.str(1, name).u32_be(3, NFT_OBJECT_COUNTER);
                },
                &what,
            )?
            .unwrap_or_default();
        if used as usize > chains.len() + sets.len() + objs.len() {
            chains = self
                .dump(fam, Some(name), NFT_MSG_GETCHAIN, &by_table, &what)?
                .unwrap_or_default();
        }
        for a in chains {
            let (mut cname, mut hook, mut prio, mut kind) = (None, None, 0i32, ChainType::Filter);
            for (ty, v) in Attrs::new(&a) {
                match ty {
                    3 => cname = Some(get_str(v)),
                    4 => {
                        for (hty, hv) in Attrs::new(v) {
                            match hty {
                                1 => hook = Some(be32(hv)),
                                2 => prio = be32(hv) as i32,
                                _ => {}
                            }
                        }
                    }
                    7 if get_str(v) == "nat" => kind = ChainType::Nat,
                    _ => {}
                }
            }
            let Some(cname) = cname else { continue };
            let base = hook.and_then(hook_from_num).map(|hook| BaseChain {
                kind,
                hook,
                priority: prio,
            });
            t.chains.insert(
                cname,
                Chain {
                    base,
                    rules: vec![],
                },
            );
        }
        let mut shapes: BTreeMap<String, Vec<Shape>> = BTreeMap::new();
        for a in self
            .dump(fam, Some(name), NFT_MSG_GETRULE, &by_table, &what)?
            .unwrap_or_default()
        {
            if let (Some(c), shape) = shape_of(&a) {
                shapes.entry(c).or_default().push(shape);
            }
        }
        for (cname, c) in t.chains.iter_mut() {
            let got = shapes.remove(cname).unwrap_or_default();
            c.rules = match want.chains.get(cname) {
                Some(w)
                    if w.rules.len() == got.len()
                        && w.rules
                            .iter()
                            .zip(&got)
                            .all(|(r, s)| rule_shape(want, cname, r) == *s) =>
                {
                    w.rules.clone()
                }
                _ => got
                    .iter()
                    .map(|_| Rule {
                        exprs: vec![],
                        comment: Some("not planned".into()),
                    })
                    .collect(),
            };
        }
        for a in sets {
            let (mut sname, mut flags, mut kt, mut kl, mut dt) = (None, 0, 0, 0, None);
            for (ty, v) in Attrs::new(&a) {
                match ty {
                    2 => sname = Some(get_str(v)),
                    3 => flags = be32(v),
                    4 => kt = be32(v),
                    5 => kl = be32(v),
                    6 => dt = Some(be32(v)),
                    _ => {}
                }
            }
            let Some(sname) = sname else { continue };
            let set = match want.sets.get(&sname) {
                Some(w)
                    if {
                        let (f, k, l, d) = set_decl_attrs(w);
                        (f, k, l, d.map(|d| d.0)) == (flags, kt, kl, dt)
                    } =>
                {
                    if w.kernel_filled() {
                        w.clone()
                    } else {
                        match self.elements(fam, name, &sname, w)? {
                            Some(s) => s,
                            None => continue,
                        }
                    }
                }
                _ => Set::new(vec![]),
            };
            t.sets.insert(sname, set);
        }
        for a in objs {
            if let Some((_, v)) = Attrs::new(&a).find(|(t, _)| *t == 2) {
                t.counters.insert(get_str(v));
            }
        }
        Ok(Some(t))
    }

    /// Brings the kernel's table to `want` (observe, diff, apply in one
    /// transaction) and returns the changes it took: none when the kernel
    /// already held `want`.
    pub fn sync(&mut self, want: &Table) -> Result<Vec<Change>, KernelError> {
        let have = self.observe(want)?;
        let changes = crate::diff::diff(have.as_ref(), want);
        self.apply(want, &changes)?;
        Ok(changes)
    }

    /// Set `set` of the table as the kernel holds it: `decl`'s declaration
    /// with the kernel's elements and their comments (None when the table
    /// or the set does not exist). Keys are decoded with `decl`'s key types.
    pub fn elements(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        decl: &Set,
    ) -> Result<Option<Set>, KernelError> {
        let Some(replies) = self.dump(
            family,
            None, // element lists name their table, but the request is exact
            NFT_MSG_GETSETELEM,
            &|m: &mut Msg| {
                m.str(1, table).str(2, set);
            },
            &|| format!("reading set {set} of table {} {table}", family.name()),
        )?
        else {
            return Ok(None);
        };
        let mut out = Set {
            elements: BTreeMap::new(),
            comments: BTreeMap::new(),
            ..decl.clone()
        };
        // Ranges read back in the canonical spelling (see `Value`); a key
        // `decl` spells otherwise (a /32 `Net`, a one-port range) is given
        // back as spelled there, so observe equals the plan either way.
        let respell: BTreeMap<Vec<Value>, &Vec<Value>> = if decl.interval {
            decl.elements
                .keys()
                .filter(|k| !k.iter().all(Value::is_canonical))
                .map(|k| (k.iter().map(Value::canonical).collect(), k))
                .collect()
        } else {
            BTreeMap::new()
        };
        let mut insert = |k: Vec<Value>, data: Option<ElemData>, comment: Option<String>| {
            let k = match respell.get(&k) {
                Some(planned) => (*planned).clone(),
                None => k,
            };
            if let Some(c) = comment {
                out.comments.insert(k.clone(), c);
            }
            out.elements.insert(k, data);
        };
        // One-field ranges: each element's key, whether it closes a range,
        // its data and comment, paired once all are read.
        let one_field = ranges(decl) == Ranges::EndElement;
        let mut bounds = Vec::new();
        for a in replies {
            for (ty, list) in Attrs::new(&a) {
                if ty != 3 {
                    continue;
                }
                for (_, el) in Attrs::new(list) {
                    let (mut key, mut end, mut data, mut comment) = (None, None, None, None);
                    let mut interval_end = false;
                    for (ety, ev) in Attrs::new(el) {
                        let value = || {
                            Attrs::new(ev)
                                .find(|(t, _)| *t == NFTA_DATA_VALUE)
                                .map(|(_, v)| v.to_vec())
                        };
                        match ety {
                            NFTA_SET_ELEM_KEY => key = value(),
                            NFTA_SET_ELEM_KEY_END => end = value(),
                            NFTA_SET_ELEM_DATA => data = decode_data(ev, &decl.data),
                            NFTA_SET_ELEM_FLAGS => {
                                interval_end = be32(ev) & NFT_SET_ELEM_INTERVAL_END != 0
                            }
                            NFTA_SET_ELEM_USERDATA => comment = comment_from_udata(ev),
                            _ => {}
                        }
                    }
                    let Some(key) = key else { continue };
                    if one_field {
                        bounds.push((key, interval_end, data, comment));
                        continue;
                    }
                    if interval_end {
                        continue;
                    }
                    if let Some(k) = decode_key(&decl.key, &key, end.as_deref()) {
                        insert(k, data, comment);
                    }
                }
            }
        }
        if one_field {
            for (k, data, comment) in pair_bounds(&decl.key, bounds) {
                insert(k, data, comment);
            }
        }
        Ok(Some(out))
    }

    /// Whether set `set` of table `family`/`table` holds `key` now: one
    /// exact lookup (no dump), cheap enough to poll while a set holds tens
    /// of thousands of elements (the benchmarks watch rules land this way).
    pub fn has_element(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        key: &[Value],
    ) -> Result<bool, KernelError> {
        let t = Table::new(family, table);
        let mut m = msg(&t, NFT_MSG_GETSETELEM, 0);
        m.str(1, table).str(2, set);
        m.begin(3);
        m.begin(NFTA_LIST_ELEM);
        m.begin(NFTA_SET_ELEM_KEY)
            .attr(NFTA_DATA_VALUE, &elem_key_bytes(key))
            .end();
        m.end();
        m.end();
        match self.sock.request(m, &|| {
            format!(
                "looking up an element of set {set} in {} {table}",
                family.name()
            )
        }) {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Named counter `name`'s (packets, bytes), or None when it (or its
    /// table) does not exist.
    pub fn counter(
        &mut self,
        family: Family,
        table: &str,
        name: &str,
    ) -> Result<Option<(u64, u64)>, KernelError> {
        let t = Table::new(family, table);
        let mut m = msg(&t, NFT_MSG_GETOBJ, 0);
        m.str(1, table).str(2, name).u32_be(3, NFT_OBJECT_COUNTER);
        let replies = match self.sock.request(m, &|| {
            format!("reading counter {name} of table {} {table}", family.name())
        }) {
            Ok(r) => r,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        for r in replies {
            for (ty, v) in Attrs::new(r.body.get(4..).unwrap_or_default()) {
                if ty == 4 {
                    let (mut packets, mut bytes) = (0, 0);
                    for (cty, cv) in Attrs::new(v) {
                        match cty {
                            1 => bytes = be64(cv),
                            2 => packets = be64(cv),
                            _ => {}
                        }
                    }
                    return Ok(Some((packets, bytes)));
                }
            }
        }
        Ok(None)
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

    #[test]
    fn keys_and_ranges_decode_back() {
        let types = [KeyType::Ipv4Addr, KeyType::Ipv4Addr];
        let k = vec![
            Value::Addr("10.1.0.2".parse().unwrap()),
            Value::Net("10.1.0.0/24".parse().unwrap()),
        ];
        let (start, end) = (key_bytes(&k), key_end_bytes(&k));
        assert_eq!(&end[4..], &[10, 1, 0, 255]);
        assert_eq!(decode_key(&types, &start, Some(&end)), Some(k));
        let types = [KeyType::IfName, KeyType::EtherAddr];
        let k = vec![Value::Name("veth1".into()), Value::Mac([2, 0, 0, 0, 0, 1])];
        assert_eq!(key_bytes(&k).len(), 24);
        assert_eq!(decode_key(&types, &key_bytes(&k), None), Some(k));
        let v6 = vec![Value::Net("fd00::/64".parse().unwrap())];
        assert_eq!(
            decode_key(
                &[KeyType::Ipv6Addr],
                &key_bytes(&v6),
                Some(&key_end_bytes(&v6))
            ),
            Some(v6)
        );
        assert_eq!(
            comment_from_udata(&comment_udata("n/ctr")).as_deref(),
            Some("n/ctr")
        );
    }

    #[test]
    fn policy_ranges_encode_per_field_and_decode_canonically() {
        // pod . peer prefix . proto . port range: each field padded to four
        // bytes, a single value the range [x, x].
        let types = [
            KeyType::Ipv4Addr,
            KeyType::Ipv4Addr,
            KeyType::InetProto,
            KeyType::InetService,
        ];
        let k = vec![
            Value::Addr("10.0.1.5".parse().unwrap()),
            Value::Net("10.2.0.0/16".parse().unwrap()),
            Value::Proto(Proto::Tcp),
            Value::PortRange(80, 90),
        ];
        assert_eq!(
            key_bytes(&k),
            [10, 0, 1, 5, 10, 2, 0, 0, 6, 0, 0, 0, 0, 80, 0, 0]
        );
        assert_eq!(
            key_end_bytes(&k),
            [10, 0, 1, 5, 10, 2, 255, 255, 6, 0, 0, 0, 0, 90, 0, 0]
        );
        assert_eq!(
            decode_key(&types, &key_bytes(&k), Some(&key_end_bytes(&k))),
            Some(k)
        );
        // Exact values read back as Addr and Port, however they were spelled.
        let exact = vec![
            Value::Addr("10.0.1.5".parse().unwrap()),
            Value::Net("10.2.0.5/32".parse().unwrap()),
            Value::Proto(Proto::Udp),
            Value::PortRange(53, 53),
        ];
        let canonical: Vec<Value> = exact.iter().map(Value::canonical).collect();
        assert_eq!(
            canonical[1..],
            [
                Value::Addr("10.2.0.5".parse().unwrap()),
                Value::Proto(Proto::Udp),
                Value::Port(53)
            ]
        );
        assert_eq!(key_bytes(&exact), key_bytes(&canonical));
        assert_eq!(key_end_bytes(&exact), key_end_bytes(&canonical));
        assert_eq!(
            decode_key(&types, &key_bytes(&exact), Some(&key_end_bytes(&exact))),
            Some(canonical)
        );
        // IPv6: 16-byte fields, the same rules.
        let types6 = [
            KeyType::Ipv6Addr,
            KeyType::Ipv6Addr,
            KeyType::InetProto,
            KeyType::InetService,
        ];
        let k6 = vec![
            Value::Addr("fd00::5".parse().unwrap()),
            Value::Net("fd00:2::/64".parse().unwrap()),
            Value::Proto(Proto::Sctp),
            Value::Port(9000),
        ];
        let (start, end) = (key_bytes(&k6), key_end_bytes(&k6));
        assert_eq!((start.len(), end.len()), (40, 40));
        assert_eq!(&end[24..32], &[0xff; 8]);
        assert_eq!(&end[32..], &[132, 0, 0, 0, 0x23, 0x28, 0, 0]);
        assert_eq!(decode_key(&types6, &start, Some(&end)), Some(k6));
    }

    #[test]
    fn one_field_ranges_are_element_pairs() {
        let ports = [KeyType::InetService];
        // 22, 80-90 and 91-100 (adjacent), 65000 up to the end; as the
        // kernel dumps them (descending), with nft's closing element at 0.
        let b = |key: &[u8], closes: bool| (key.to_vec(), closes, None, None);
        let bounds = vec![
            b(&[0xfd, 0xe8], false),
            b(&[0, 101], true),
            b(&[0, 91], false),
            b(&[0, 91], true),
            b(&[0, 80], false),
            b(&[0, 23], true),
            b(&[0, 22], false),
            b(&[0, 0], true),
        ];
        let keys: Vec<Vec<Value>> = pair_bounds(&ports, bounds)
            .into_iter()
            .map(|(k, ..)| k)
            .collect();
        assert_eq!(
            keys,
            [
                vec![Value::Port(22)],
                vec![Value::PortRange(80, 90)],
                vec![Value::PortRange(91, 100)],
                vec![Value::PortRange(65000, 65535)],
            ]
        );
        // What the encoder sends for them: the closing key is the value
        // after the last, none for a range that runs to the end.
        assert_eq!(interval_end_key(&[Value::Port(22)]), Some(vec![0, 23]));
        assert_eq!(
            interval_end_key(&[Value::PortRange(80, 90)]),
            Some(vec![0, 91])
        );
        assert_eq!(interval_end_key(&[Value::PortRange(65000, 65535)]), None);
        assert_eq!(
            interval_end_key(&[Value::Net("10.255.0.0/16".parse().unwrap())]),
            Some(vec![11, 0, 0, 0])
        );
        assert_eq!(before(&[11, 0, 0, 0]), Some(vec![10, 255, 255, 255]));
        assert_eq!(before(&[0, 0]), None);
        // A one-field key is as long as its field, as nft declares it.
        assert_eq!(set_key_len(&ports), 2);
        assert_eq!(elem_key_bytes(&[Value::Port(80)]), [0, 80]);
        assert_eq!(set_key_len(&[KeyType::InetProto, KeyType::InetService]), 8);
        let nets = pair_bounds(
            &[KeyType::Ipv4Addr],
            vec![
                b(&[0, 0, 0, 0], false),
                b(&[128, 0, 0, 0], true),
                b(&[192, 168, 1, 1], false),
                b(&[192, 168, 1, 2], true),
            ],
        );
        assert_eq!(
            nets.into_iter().map(|(k, ..)| k).collect::<Vec<_>>(),
            [
                vec![Value::Net("0.0.0.0/1".parse().unwrap())],
                vec![Value::Addr("192.168.1.1".parse().unwrap())],
            ]
        );
    }

    #[test]
    fn log_and_limit_are_their_kernel_expressions() {
        let t = Table::new(Family::Ip, "x");
        let r = Rule::new(vec![
            Expr::Limit {
                rate: 10,
                burst: 5,
                over: true,
            },
            Expr::Log {
                group: 3,
                prefix: "np".into(),
            },
            Expr::Cmp {
                field: Field::Dport,
                neg: true,
                value: Value::PortRange(80, 90),
            },
        ]);
        assert_eq!(
            rule_shape(&t, "c", &r).exprs,
            ["limit", "log", "payload", "range"]
        );
    }

    #[test]
    fn inet_rules_check_the_family_once() {
        let mut t = Table::new(Family::Inet, "x");
        t.sets.insert("s".into(), Set::new(vec![KeyType::Ipv4Addr]));
        let r = Rule::new(vec![
            Expr::InSet {
                keys: vec![Field::IpSaddr],
                set: "s".into(),
                neg: false,
            },
            Expr::Cmp {
                field: Field::IpDaddr,
                neg: true,
                value: Value::Net("224.0.0.0/4".parse().unwrap()),
            },
            Expr::Masquerade {
                fully_random: false,
            },
        ]);
        let shape = rule_shape(&t, "c", &r).exprs;
        assert_eq!(
            shape,
            ["meta", "cmp", "payload", "lookup", "payload", "bitwise", "cmp", "masq"]
        );
        t.family = Family::Ip;
        assert_eq!(rule_shape(&t, "c", &r).exprs[0], "payload");
    }

    /// Each payload load of a rule as (base, offset, len), and each meta
    /// load's key.
    fn loads(t: &Table, r: &Rule) -> Vec<(String, Vec<u32>)> {
        let bytes = rule_msg(t, "c", r).finish(0);
        let mut out = Vec::new();
        for (ty, v) in Attrs::new(&bytes[20..]) {
            if ty != 4 {
                continue;
            }
            for (_, e) in Attrs::new(v) {
                let mut name = String::new();
                let mut vals = Vec::new();
                for (et, ev) in Attrs::new(e) {
                    match et {
                        1 => name = get_str(ev),
                        2 => {
                            for (at, av) in Attrs::new(ev) {
                                let keep = match name.as_str() {
                                    "payload" => (2..=4).contains(&at),
                                    "meta" => at == 2,
                                    _ => false,
                                };
                                if keep {
                                    vals.push(be32(av));
                                }
                            }
                        }
                        _ => {}
                    }
                }
                if name == "payload" || name == "meta" {
                    out.push((name, vals));
                }
            }
        }
        out
    }

    #[test]
    fn bridge_fields_load_their_headers() {
        let mut t = Table::new(Family::Bridge, "x");
        let types = vec![KeyType::IfName, KeyType::EtherAddr, KeyType::Ipv4Addr];
        t.sets.insert("arp".into(), Set::new(types));
        let r = Rule::new(vec![
            Expr::Cmp {
                field: Field::IifGroup,
                neg: true,
                value: Value::U32(0x706e),
            },
            Expr::Cmp {
                field: Field::EtherType,
                neg: false,
                value: Value::U16(0x0806),
            },
            Expr::InSet {
                keys: vec![Field::IifName, Field::ArpSha, Field::ArpSpa],
                set: "arp".into(),
                neg: false,
            },
            Expr::Cmp {
                field: Field::Icmp6Type,
                neg: false,
                value: Value::U8(136),
            },
            Expr::Cmp {
                field: Field::NdTarget,
                neg: false,
                value: Value::Addr("fd00::1".parse().unwrap()),
            },
        ]);
        let p = |v: &[u32]| ("payload".to_string(), v.to_vec());
        let m = |k: u32| ("meta".to_string(), vec![k]);
        assert_eq!(
            loads(&t, &r),
            [
                m(21),
                p(&[0, 12, 2]),
                m(6),
                p(&[1, 8, 6]),
                p(&[1, 14, 4]),
                p(&[2, 0, 1]),
                p(&[2, 8, 16])
            ]
        );
        assert_eq!(value_bytes(&Value::U16(0x86dd)), [0x86, 0xdd]);
        assert_eq!(
            decode_value(KeyType::EtherType, &[0x08, 0x06], None),
            Some(Value::U16(0x0806))
        );
        let invalid = Rule::new(vec![Expr::CtStateInvalid, Expr::Verdict(Verdict::Drop)]);
        assert_eq!(
            rule_shape(&t, "c", &invalid).exprs,
            ["ct", "bitwise", "cmp", "immediate"]
        );
    }
}
