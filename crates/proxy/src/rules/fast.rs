//! The fast path: a ClusterIP-only Service port without affinity and with
//! at most [`FAST_MAX`] endpoints is set elements only, no chain or rule of
//! its own. The base table holds the dispatch that reads those elements
//! ([`add_dispatch`]); a port adds its elements ([`add_fast`]). A change
//! to such a port adds no rule and no verdict, so the kernel never
//! re-validates the table.

use std::net::IpAddr;

use podnet_nft::model::{ElemData, Expr, Field, Proto, Rule, Set, Table, Value, Verdict};

use super::blocks::{chain, insert_elem, mark_external, svc_key};
use super::endpoints::Ep;
use super::Stack;

/// Most endpoints a Service port may have and still take the fast path.
pub const FAST_MAX: u32 = 64;

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

/// The base table's fast-path dispatch (`fast-dispatch`, the per-count
/// sets and `pick-<n>` chains).
pub(super) fn add_dispatch(t: &mut Table, stack: &Stack) {
    let three = vec![stack.daddr(), Field::L4Proto, Field::Dport];
    // Fast-path dispatch: one lookup decides fast or not; the port's
    // endpoint count picks the chain whose `numgen` modulus matches; that
    // chain DNATs through the endpoint map. Every per-Service part is a set
    // element, so Service changes never add rules or verdicts.
    let mut fast = vec![mark_external(stack)];
    for n in 1..=FAST_MAX {
        let (set, chain_name) = (fast_set(n), format!("pick-{n}"));
        t.sets.insert(set.clone(), Set::new(stack.svc_key_types()));
        fast.push(Rule::new(vec![
            Expr::InSet {
                keys: three.clone(),
                set,
                neg: false,
            },
            Expr::Verdict(Verdict::Goto(chain_name.clone())),
        ]));
        t.chains.insert(
            chain_name,
            chain(vec![Rule::new(vec![Expr::PickDnat {
                keys: three.clone(),
                modulus: n,
                map: "fast-endpoints".into(),
            }])]),
        );
    }
    t.chains.insert("fast-dispatch".into(), chain(fast));
}

/// A fast-path Service port's elements.
pub(super) fn add_fast(
    t: &mut Table,
    stack: &Stack,
    cip: IpAddr,
    proto: Proto,
    port: u16,
    eps: &[&Ep],
) {
    let key = svc_key(cip, proto, port);
    t.sets
        .entry(fast_set(eps.len() as u32))
        .or_insert_with(|| Set::new(stack.svc_key_types()))
        .elements
        .insert(key.clone(), None);
    insert_elem(t, "fast-services", key.clone(), None);
    for (i, e) in eps.iter().enumerate() {
        let mut k = key.clone();
        k.push(Value::U32(i as u32));
        insert_elem(
            t,
            "fast-endpoints",
            k,
            Some(ElemData::Data(vec![Value::Addr(e.ip), Value::Port(e.port)])),
        );
        insert_elem(
            t,
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
