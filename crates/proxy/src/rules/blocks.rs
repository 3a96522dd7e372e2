//! Building blocks the base table and the Service fragments share: short
//! names for the expressions and elements they write over and over, the
//! rule that marks external clients for masquerade, and the stable hash
//! that names a Service port's chains.

use std::net::IpAddr;

use podnet_nft::model::{Chain, ElemData, Expr, Proto, Rule, Table, Value, Verdict};

use super::Stack;

/// A short name for a Service port's or endpoint's chain: FNV-1a folded
/// to 32 bits, so the name is the same on every sync and every node.
pub(super) fn hash8(s: &str) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("{:08x}", (h ^ (h >> 32)) as u32)
}

/// The verdict `goto c`.
pub(super) fn goto(c: &str) -> Expr {
    Expr::Verdict(Verdict::Goto(c.to_string()))
}

/// The verdict `jump c`.
pub(super) fn jump(c: &str) -> Expr {
    Expr::Verdict(Verdict::Jump(c.into()))
}

/// The key of an `address . protocol . port` (Service address) map.
pub(super) fn svc_key(ip: IpAddr, proto: Proto, port: u16) -> Vec<Value> {
    vec![Value::Addr(ip), Value::Proto(proto), Value::Port(port)]
}

/// The key of a `protocol . port` (NodePort) map.
pub(super) fn nodeport_key(proto: Proto, port: u16) -> Vec<Value> {
    vec![Value::Proto(proto), Value::Port(port)]
}

/// Adds an element to one of the sets or maps the shell declares, which
/// every fragment and the base table carry.
pub(super) fn insert_elem(t: &mut Table, set: &str, key: Vec<Value>, data: Option<ElemData>) {
    t.sets
        .get_mut(set)
        .expect("declared in the shell")
        .elements
        .insert(key, data);
}

/// Adds `key → goto chain` to one of the dispatch maps.
pub(super) fn insert_goto(t: &mut Table, map: &str, key: Vec<Value>, chain: String) {
    insert_elem(t, map, key, Some(ElemData::Verdict(Verdict::Goto(chain))));
}

/// Adds `key → verdict` to one of the no-endpoint filter maps: reject when
/// the Service has no usable endpoint anywhere, drop when a Local policy
/// finds none on this node (upstream: "has no local endpoints").
pub(super) fn no_endpoints(t: &mut Table, map: &str, key: Vec<Value>, any: bool) {
    let v = if any {
        Verdict::Drop
    } else {
        Verdict::Goto("reject-chain".into())
    };
    insert_elem(t, map, key, Some(ElemData::Verdict(v)));
}

/// Rules that send traffic from outside the cluster's pod network to be
/// masqueraded (all traffic, when the family has no pod network).
pub(super) fn mark_external(stack: &Stack) -> Rule {
    let mut exprs = Vec::new();
    if let Some(c) = stack.cluster_cidr {
        exprs.push(Expr::Cmp {
            field: stack.saddr(),
            neg: true,
            value: Value::Net(c),
        });
    }
    exprs.push(jump("mark-for-masquerade"));
    Rule::new(exprs)
}

/// A regular (non-base) chain.
pub(super) fn chain(rules: Vec<Rule>) -> Chain {
    Chain { base: None, rules }
}
