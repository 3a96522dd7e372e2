//! How a chain-path Service port reaches its endpoints: one `ep-<hash>`
//! chain per endpoint (hairpin mark, affinity update, DNAT), and the
//! `numgen` cascade that picks one of them uniformly, affinity first.

use std::collections::BTreeMap;

use podnet_nft::model::{Expr, Field, Proto, Rule, Set, Table, Value};

use super::blocks::{chain, goto, hash8, jump};
use super::endpoints::Ep;
use super::Stack;

/// Adds the DNAT chain of each endpoint in `reachable` (and, with
/// affinity, given as its timeout, its affinity set) for the port `id`;
/// returns each endpoint's chain name.
pub(super) fn add_endpoint_chains<'a>(
    t: &mut Table,
    stack: &Stack,
    id: &str,
    proto: Proto,
    affinity: Option<u32>,
    reachable: Vec<&'a Ep>,
) -> BTreeMap<&'a Ep, String> {
    let mut ep_chains: BTreeMap<&Ep, String> = BTreeMap::new();
    for e in reachable {
        let ec = format!("ep-{}", hash8(&format!("{id}/{}:{}", e.ip, e.port)));
        let mut rules = vec![Rule::new(vec![
            Expr::Cmp {
                field: stack.saddr(),
                neg: false,
                value: Value::Addr(e.ip),
            },
            jump("mark-for-masquerade"),
        ])];
        let mut dnat = Vec::new();
        if let Some(timeout) = affinity {
            dnat.push(add_affinity_set(t, stack, &ec, timeout));
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
        t.chains.insert(ec.clone(), chain(rules));
        ep_chains.insert(e, ec);
    }
    ep_chains
}

/// Adds the affinity set of the endpoint chain `ec` (`aff-<hash>`, client
/// addresses with a timeout); returns the expression that records a
/// client in it.
fn add_affinity_set(t: &mut Table, stack: &Stack, ec: &str, timeout: u32) -> Expr {
    let set = format!("aff-{}", &ec[3..]);
    let mut s = Set::new(vec![stack.addr_key()]);
    s.timeout = Some(timeout);
    t.sets.insert(set.clone(), s);
    Expr::UpdateSet {
        keys: vec![stack.saddr()],
        set,
    }
}

/// Rules that pick one of the endpoint chains `chains` uniformly (numgen
/// cascade), with affinity.
pub(super) fn pick_rules(chains: &[&str], affinity: bool, stack: &Stack) -> Vec<Rule> {
    let mut rules = Vec::new();
    if affinity {
        for chain in chains {
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
    let n = chains.len() as u32;
    for (i, chain) in chains.iter().enumerate() {
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
