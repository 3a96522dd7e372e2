//! A rule's expressions as nf_tables expressions: which header or meta
//! key each field is loaded from, which registers a key fills, and the
//! expression lists `nft` would write for each model expression (so
//! `nft list` shows our rules as it would its own). One rule is one
//! `NEWRULE` message ([`rule_msg`]).

use podnet_kernel::nl::{Msg, NLM_F_APPEND, NLM_F_CREATE};

use super::layout::{comment_udata, field_len, padded, value_bytes, verdict};
use super::{
    msg, NFTA_DATA_VALUE, NFTA_LIST_ELEM, NFT_MSG_NEWRULE, NFT_OBJECT_COUNTER, NFT_REG32_00,
    NFT_REG_1, NFT_REG_2, NFT_REG_VERDICT,
};
use crate::model::{Expr, Family, Field, Rule, Table, Value, Verdict};

/// The expression list of one rule being written, with what the rule has
/// checked so far.
struct Ex<'a> {
    m: &'a mut Msg,
    family: Family,
    /// The `meta nfproto` this rule has checked so far (inet tables).
    checked: Option<u8>,
}

/// The kernel's expressions, one method each.
impl Ex<'_> {
    /// Appends expression `name`, its attributes written by `body`.
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

/// Encoders of the model's expressions, one kind each.
impl Ex<'_> {
    /// Checks the layer-3 family `e`'s fields need, unless the rule has;
    /// an explicit `meta nfproto` match stands for the implicit check.
    fn family_check(&mut self, e: &Expr) {
        self.family_dep(expr_fields(e));
        if let Expr::Cmp {
            field: Field::NfProto,
            neg: false,
            value: Value::U8(p),
        } = e
        {
            // An explicit family check stands for the implicit one.
            self.checked = Some(*p);
        }
    }

    /// Loads a set key: one field into `NFT_REG_1`, a concatenation into
    /// the 32-bit registers; returns the register it starts in.
    fn load_key(&mut self, keys: &[Field]) -> u32 {
        if keys.len() == 1 {
            self.load(keys[0], NFT_REG_1);
            NFT_REG_1
        } else {
            self.load_keys(keys)
        }
    }

    /// `field [!=] value`: a prefix masks the field first, a port range is
    /// a `range` expression.
    fn compare(&mut self, field: Field, neg: bool, value: &Value) {
        let len = self.load(field, NFT_REG_1);
        match value {
            Value::Net(n) if n.prefix_len() < n.max_prefix_len() => {
                let mask = prefix_mask(n.prefix_len(), len);
                self.bitwise(NFT_REG_1, &mask, &vec![0; len]);
                self.cmp(NFT_REG_1, neg, &value_bytes(value));
            }
            Value::PortRange(lo, hi) => self.expr("range", |m| {
                m.u32_be(1, NFT_REG_1).u32_be(2, neg as u32); // NFT_RANGE_EQ / NEQ
                m.begin(3).attr(NFTA_DATA_VALUE, &lo.to_be_bytes()).end();
                m.begin(4).attr(NFTA_DATA_VALUE, &hi.to_be_bytes()).end();
            }),
            v => self.cmp(NFT_REG_1, neg, &value_bytes(v)),
        }
    }

    /// `numgen random mod modulus == value`.
    fn numgen_is(&mut self, modulus: u32, value: u32) {
        self.expr("numgen", |m| {
            m.u32_be(1, NFT_REG_1).u32_be(2, modulus).u32_be(3, 1);
        });
        self.cmp(NFT_REG_1, false, &value.to_ne_bytes());
    }

    /// `fib daddr|saddr type [!=] local`; `flags` is 2 for daddr, 1 for
    /// saddr.
    fn fib_local(&mut self, flags: u32, neq: bool) {
        self.expr("fib", |m| {
            // result: address type
            m.u32_be(1, NFT_REG_1).u32_be(2, 3).u32_be(3, flags);
        });
        self.cmp(NFT_REG_1, neq, &2u32.to_ne_bytes()); // RTN_LOCAL
    }

    /// `ct <key> & bit != 0`: conntrack key `key` (NFT_CT_STATE 0,
    /// NFT_CT_STATUS 2) has `bit` set.
    fn ct_has(&mut self, key: u32, bit: u32) {
        self.expr("ct", |m| {
            m.u32_be(2, key).u32_be(1, NFT_REG_1);
        });
        self.bitwise(NFT_REG_1, &bit.to_ne_bytes(), &[0; 4]);
        self.cmp(NFT_REG_1, true, &[0; 4]);
    }

    /// `meta mark & mask != 0`.
    fn mark_has(&mut self, mask: u32) {
        self.meta(3, NFT_REG_1);
        self.bitwise(NFT_REG_1, &mask.to_ne_bytes(), &[0; 4]);
        self.cmp(NFT_REG_1, true, &[0; 4]);
    }

    /// `meta mark set meta mark | bits`.
    fn set_mark(&mut self, bits: u32) {
        self.meta(3, NFT_REG_1);
        self.bitwise(NFT_REG_1, &(!bits).to_ne_bytes(), &bits.to_ne_bytes());
        self.expr("meta", |m| {
            m.u32_be(2, 3).u32_be(3, NFT_REG_1);
        });
    }

    /// `update @set` (op 1) or `add @set` (op 0, NFT_DYNSET_OP_ADD) with
    /// the key loaded from `keys`.
    fn dynset(&mut self, keys: &[Field], set: &str, op: u32) {
        let r = self.load_key(keys);
        self.expr("dynset", |m| {
            m.str(1, set).u32_be(3, op).u32_be(4, r);
        });
    }

    /// `meta nftrace set 1`.
    fn set_nftrace(&mut self) {
        self.immediate_data(NFT_REG_1, &[1]);
        self.expr("meta", |m| {
            m.u32_be(2, 12).u32_be(3, NFT_REG_1); // NFT_META_NFTRACE, sreg
        });
    }

    /// DNAT to the address (and port after it) a map lookup left in the
    /// registers from `addr`.
    fn dnat_from_regs(&mut self, addr: u32, v6: bool) {
        let port = addr + if v6 { 4 } else { 1 };
        self.expr("nat", |m| {
            m.u32_be(1, 1) // NFT_NAT_DNAT
                .u32_be(2, if v6 { 10 } else { 2 })
                .u32_be(3, addr)
                .u32_be(5, port)
                .u32_be(7, 3); // MAP_IPS | PROTO_SPECIFIED
        });
    }

    /// `dnat to <keys> map @map`: the target right after the key registers.
    fn map_dnat(&mut self, keys: &[Field], map: &str, v6: bool) {
        let addr = self.load_keys_end(keys);
        self.lookup(map, NFT_REG32_00, Some(addr), false);
        self.dnat_from_regs(addr, v6);
    }

    /// `dnat to <keys> . numgen random mod modulus map @map`:
    /// keys . index -> address . port, right after the key registers.
    fn pick_dnat(&mut self, keys: &[Field], modulus: u32, map: &str) {
        let idx = self.load_keys_end(keys);
        self.expr("numgen", |m| {
            m.u32_be(1, idx).u32_be(2, modulus).u32_be(3, 1);
        });
        let addr = idx + 1;
        self.lookup(map, NFT_REG32_00, Some(addr), false);
        self.dnat_from_regs(addr, keys.contains(&Field::Ip6Daddr));
    }

    /// `dnat to addr[:port]`, from immediates.
    fn dnat(&mut self, addr: std::net::IpAddr, port: Option<u16>) {
        self.immediate_data(NFT_REG_1, &value_bytes(&Value::Addr(addr)));
        if let Some(p) = port {
            self.immediate_data(NFT_REG_2, &p.to_be_bytes());
        }
        let fam = if addr.is_ipv4() { 2 } else { 10 };
        self.expr("nat", |m| {
            m.u32_be(1, 1).u32_be(2, fam).u32_be(3, NFT_REG_1);
            let mut flags = 1; // NF_NAT_RANGE_MAP_IPS
            if port.is_some() {
                m.u32_be(5, NFT_REG_2);
                flags |= 2; // NF_NAT_RANGE_PROTO_SPECIFIED
            }
            m.u32_be(7, flags);
        });
    }

    /// `reject with tcp reset` (TCP only) or a port-unreachable.
    fn reject(&mut self, tcp_reset: bool) {
        if tcp_reset {
            self.meta(16, NFT_REG_1);
            self.cmp(NFT_REG_1, false, &[6]);
            self.expr("reject", |m| {
                m.u32_be(1, 1);
            });
            return;
        }
        // The family's own ICMP type: the kernel's ip and ip6 reject
        // evaluate only NFT_REJECT_ICMP_UNREACH and TCP_RST, and
        // silently drop an icmpx reject (which only `inet` and
        // `bridge` tables understand).
        let (ty, code) = match self.family {
            Family::Ip => (0, 3),  // ICMP_PORT_UNREACH
            Family::Ip6 => (0, 4), // ICMPV6_PORT_UNREACH
            _ => (2, 1),           // NFT_REJECT_ICMPX_PORT_UNREACH
        };
        self.expr("reject", |m| {
            m.u32_be(1, ty).u8(2, code);
        });
    }

    /// `log group <group> prefix <prefix>`.
    fn log(&mut self, group: u16, prefix: &str) {
        self.expr("log", |m| {
            // A group makes it an NFLOG (nfnetlink_log) logger, not syslog.
            m.u16_be(1, group).str(2, &crate::model::log_prefix(prefix));
        });
    }

    /// `limit rate [over] <rate>/second burst <burst> packets`.
    fn limit(&mut self, rate: u64, burst: u32, over: bool) {
        self.expr("limit", |m| {
            m.u64_be(1, rate) // NFTA_LIMIT_RATE
                .u64_be(2, 1) // NFTA_LIMIT_UNIT: per second
                .u32_be(3, burst)
                .u32_be(4, 0) // NFTA_LIMIT_TYPE: NFT_LIMIT_PKTS
                .u32_be(5, over as u32); // NFTA_LIMIT_FLAGS: NFT_LIMIT_F_INV
        });
    }
}

/// How many 32-bit registers a concatenation of `keys` fills.
fn keys_regs(keys: &[Field]) -> u32 {
    keys.iter()
        .map(|k| (padded(field_len(k.key_type())) / 4) as u32)
        .sum()
}

/// The mask of a `len`-bit prefix over `bytes` bytes.
pub(super) fn prefix_mask(len: u8, bytes: usize) -> Vec<u8> {
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

/// Appends one model expression to the rule being written.
fn encode_expr(x: &mut Ex<'_>, e: &Expr) {
    x.family_check(e);
    match e {
        Expr::Cmp { field, neg, value } => x.compare(*field, *neg, value),
        Expr::InSet { keys, set, neg } => {
            let r = x.load_key(keys);
            x.lookup(set, r, None, *neg);
        }
        Expr::VMap { keys, map } => {
            let r = x.load_key(keys);
            x.lookup(map, r, Some(NFT_REG_VERDICT), false);
        }
        Expr::Numgen { modulus, value } => x.numgen_is(*modulus, *value),
        Expr::FibDaddrLocal => x.fib_local(2, false),
        Expr::FibDaddrNotLocal => x.fib_local(2, true),
        Expr::FibSaddrLocal => x.fib_local(1, false),
        Expr::CtDnat => x.ct_has(2, 0x20), // NFT_CT_STATUS, IPS_DST_NAT
        Expr::CtStateNew => x.ct_has(0, 8), // NFT_CT_STATE, NF_CT_STATE_BIT(IP_CT_NEW)
        Expr::CtStateInvalid => x.ct_has(0, 1), // NFT_CT_STATE, NF_CT_STATE_INVALID_BIT
        Expr::MarkSet { mask } => x.mark_has(*mask),
        Expr::SetMark { bits } => x.set_mark(*bits),
        Expr::UpdateSet { keys, set } => x.dynset(keys, set, 1),
        Expr::AddSet { keys, set } => x.dynset(keys, set, 0),
        Expr::Counter => x.expr("counter", |m| {
            m.u64_be(1, 0).u64_be(2, 0);
        }),
        Expr::CounterRef(name) => x.expr("objref", |m| {
            m.u32_be(1, NFT_OBJECT_COUNTER).str(2, name);
        }),
        Expr::Notrack => x.expr("notrack", |_| {}),
        Expr::SetNftrace => x.set_nftrace(),
        Expr::MapDnat { keys, map, v6 } => x.map_dnat(keys, map, *v6),
        Expr::Dnat { addr, port } => x.dnat(*addr, *port),
        Expr::PickDnat { keys, modulus, map } => x.pick_dnat(keys, *modulus, map),
        Expr::Masquerade { fully_random } => x.expr("masq", |m| {
            if *fully_random {
                m.u32_be(1, 0x10);
            }
        }),
        Expr::Reject { tcp_reset } => x.reject(*tcp_reset),
        Expr::Log { group, prefix } => x.log(*group, prefix),
        Expr::Limit { rate, burst, over } => x.limit(*rate, *burst, *over),
        Expr::Verdict(v) => x.verdict(v),
    }
}

/// One rule appended to `chain`: its expressions and its comment.
pub(super) fn rule_msg(t: &Table, chain: &str, r: &Rule) -> Msg {
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
            encode_expr(&mut x, e);
        }
    }
    m.end();
    if let Some(c) = &r.comment {
        m.attr(7, &comment_udata(c));
    }
    m
}
