//! The difference between the table last applied and the table wanted, as
//! an ordered list of changes that form one valid transaction: things are
//! created before they are referenced and unreferenced before they are
//! deleted. An identical table yields no change at all.
//!
//! Chains are replaced whole (flush, then add its rules) when any rule
//! differs; per-Service chains are small, so this keeps rule handles out of
//! the picture. Set and map elements are added and removed one by one, which
//! is where the volume is, except where the kernel makes removal cost more
//! than adding: a pipapo set losing many elements is rebuilt within the
//! batch ([`bound_pipapo_deletes`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{BaseChain, Chain, ElemData, Rule, Set, Table, Value};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Removes the table if it exists (first step of a full replace).
    ResetTable,
    AddTable,
    AddSet {
        name: String,
        set: Set,
    },
    DelSet {
        name: String,
    },
    AddChain {
        name: String,
        base: Option<BaseChain>,
    },
    DelChain {
        name: String,
    },
    FlushChain {
        name: String,
    },
    AddRules {
        chain: String,
        rules: Vec<Rule>,
    },
    AddElems {
        set: String,
        elems: Vec<(Vec<Value>, Option<ElemData>)>,
    },
    /// Elements that carry a comment (their owner, in a shared set).
    AddCommented {
        set: String,
        elems: Vec<(Vec<Value>, Option<ElemData>, String)>,
    },
    /// A named counter (`counter NAME {}`), starting at zero.
    AddCounter {
        name: String,
    },
    DelCounter {
        name: String,
    },
    DelElems {
        set: String,
        keys: Vec<Vec<Value>>,
    },
}

impl Change {
    /// How many kernel objects this change touches (for op counting).
    pub fn ops(&self) -> usize {
        match self {
            Change::AddRules { rules, .. } => rules.len(),
            Change::AddElems { elems, .. } => elems.len(),
            Change::AddCommented { elems, .. } => elems.len(),
            Change::DelElems { keys, .. } => keys.len(),
            _ => 1,
        }
    }
}

/// Total operations in a change list.
pub fn ops(changes: &[Change]) -> usize {
    changes.iter().map(Change::ops).sum()
}

fn same_decl(a: &Set, b: &Set) -> bool {
    a.key == b.key
        && a.data == b.data
        && a.interval == b.interval
        && a.timeout == b.timeout
        && a.dynamic == b.dynamic
        && a.size == b.size
}

/// Whether element `k` of `new` is held by `old` as it is (data and comment).
fn same_elem(old: &Set, new: &Set, k: &Vec<Value>) -> bool {
    old.elements.get(k) == new.elements.get(k) && old.comments.get(k) == new.comments.get(k)
}

/// The changes that add `elems` of set `name` (keys and data from `s`),
/// split into plain and commented ones.
fn add_elems<'a>(
    out: &mut Vec<Change>,
    name: &str,
    s: &Set,
    keys: impl Iterator<Item = &'a Vec<Value>>,
) {
    let (mut plain, mut commented) = (Vec::new(), Vec::new());
    for k in keys {
        let d = s.elements.get(k).cloned().flatten();
        match s.comments.get(k) {
            Some(c) => commented.push((k.clone(), d, c.clone())),
            None => plain.push((k.clone(), d)),
        }
    }
    if !plain.is_empty() {
        out.push(Change::AddElems {
            set: name.to_string(),
            elems: plain,
        });
    }
    if !commented.is_empty() {
        out.push(Change::AddCommented {
            set: name.to_string(),
            elems: commented,
        });
    }
}

/// The declarations of `t` (table, sets, counters, chains) and its rules,
/// for a table several processes share (the CNI plugins' tables): whatever
/// exists is kept, the base rules are rewritten, no element is touched.
/// Applying it twice is harmless.
pub fn ensure(t: &Table) -> Vec<Change> {
    let mut out = vec![Change::AddTable];
    for (name, s) in &t.sets {
        out.push(add_set(name, s));
    }
    for name in &t.counters {
        out.push(Change::AddCounter { name: name.clone() });
    }
    for (name, c) in &t.chains {
        out.push(Change::AddChain {
            name: name.clone(),
            base: c.base,
        });
    }
    for (name, c) in &t.chains {
        out.push(Change::FlushChain { name: name.clone() });
        if !c.rules.is_empty() {
            out.push(Change::AddRules {
                chain: name.clone(),
                rules: c.rules.clone(),
            });
        }
    }
    out
}

/// Plans the transaction from `old` (None: nothing applied yet) to `new`.
pub fn diff(old: Option<&Table>, new: &Table) -> Vec<Change> {
    let empty = Table::new(new.family, &new.name);
    let (old, fresh) = match old {
        Some(o) => (o, false),
        None => (&empty, true),
    };
    let mut out = Vec::new();
    if fresh {
        out.push(Change::AddTable);
    }
    // 1. New sets and chains (and sets whose declaration changed).
    let recreated = add_sets_and_chains(&mut out, old, new);
    // 2. Element removals (they may reference chains about to go).
    del_elems(&mut out, old, new);
    // 3. Rules of changed chains (and emptying chains that will be deleted).
    rewrite_rules(&mut out, old, new);
    // 4. Sets whose declaration changed are rebuilt (rules referencing
    //    them were rewritten above only if they changed too; a redeclared
    //    set keeps its name, so references stay valid after re-adding).
    for name in &recreated {
        out.push(Change::DelSet { name: name.clone() });
        out.push(add_set(name, &new.sets[name]));
    }
    // 5. Chains that are gone.
    for name in old.chains.keys() {
        if !new.chains.contains_key(name) {
            out.push(Change::DelChain { name: name.clone() });
        }
    }
    // 6. Element additions (their target chains exist now).
    add_new_elems(&mut out, old, new, &recreated);
    // 7. Sets that are gone (nothing references them any more).
    del_sets_and_counters(&mut out, old, new);
    out
}

/// Declares set `name` as `s` does, without its elements.
fn add_set(name: &str, s: &Set) -> Change {
    Change::AddSet {
        name: name.to_string(),
        set: Set {
            elements: Default::default(),
            comments: Default::default(),
            ..s.clone()
        },
    }
}

/// Step 1 of [`diff`]: adds the sets, counters and chains `old` lacks and
/// rebuilds chains whose hook changed; returns the sets whose
/// declaration changed, which are rebuilt later (step 4).
fn add_sets_and_chains(out: &mut Vec<Change>, old: &Table, new: &Table) -> Vec<String> {
    let mut recreated = Vec::new();
    for (name, s) in &new.sets {
        match old.sets.get(name) {
            None => out.push(add_set(name, s)),
            Some(o) if !same_decl(o, s) => recreated.push(name.clone()),
            _ => {}
        }
    }
    for name in &new.counters {
        if !old.counters.contains(name) {
            out.push(Change::AddCounter { name: name.clone() });
        }
    }
    for (name, c) in &new.chains {
        match old.chains.get(name) {
            None => out.push(Change::AddChain {
                name: name.clone(),
                base: c.base,
            }),
            Some(o) if o.base != c.base => {
                // A chain cannot change its hook in place: rebuild it.
                out.push(Change::FlushChain { name: name.clone() });
                out.push(Change::DelChain { name: name.clone() });
                out.push(Change::AddChain {
                    name: name.clone(),
                    base: c.base,
                });
            }
            _ => {}
        }
    }
    recreated
}

/// Step 2 of [`diff`]: deletes the elements of sets declared alike in
/// both that `new` does not hold as they are.
fn del_elems(out: &mut Vec<Change>, old: &Table, new: &Table) {
    for (name, s) in &old.sets {
        let keys: Vec<Vec<Value>> = match new.sets.get(name) {
            Some(n) if same_decl(s, n) => s
                .elements
                .keys()
                .filter(|k| !same_elem(s, n, k))
                .cloned()
                .collect(),
            _ => continue,
        };
        if !keys.is_empty() {
            out.push(Change::DelElems {
                set: name.clone(),
                keys,
            });
        }
    }
}

/// Step 3 of [`diff`]: rewrites the rules of chains whose rules changed,
/// and empties the chains `new` drops.
fn rewrite_rules(out: &mut Vec<Change>, old: &Table, new: &Table) {
    for (name, c) in &new.chains {
        let prev: Option<&Chain> = old.chains.get(name).filter(|o| o.base == c.base);
        if prev
            .map(|p| p.rules != c.rules)
            .unwrap_or(!c.rules.is_empty())
        {
            if prev.map(|p| !p.rules.is_empty()).unwrap_or(false) {
                out.push(Change::FlushChain { name: name.clone() });
            }
            if !c.rules.is_empty() {
                out.push(Change::AddRules {
                    chain: name.clone(),
                    rules: c.rules.clone(),
                });
            }
        }
    }
    for (name, c) in &old.chains {
        if !new.chains.contains_key(name) && !c.rules.is_empty() {
            out.push(Change::FlushChain { name: name.clone() });
        }
    }
}

/// Step 6 of [`diff`]: adds the elements `old` does not hold as they are
/// (all of them in new and rebuilt sets).
fn add_new_elems(out: &mut Vec<Change>, old: &Table, new: &Table, recreated: &[String]) {
    for (name, s) in &new.sets {
        let prev = old
            .sets
            .get(name)
            .filter(|o| same_decl(o, s) && !recreated.contains(name));
        let keys = s
            .elements
            .keys()
            .filter(|k| prev.map(|p| !same_elem(p, s, k)).unwrap_or(true));
        add_elems(out, name, s, keys);
    }
}

/// Step 7 of [`diff`]: deletes the sets and counters `new` drops.
fn del_sets_and_counters(out: &mut Vec<Change>, old: &Table, new: &Table) {
    for name in old.sets.keys() {
        if !new.sets.contains_key(name) {
            out.push(Change::DelSet { name: name.clone() });
        }
    }
    for name in &old.counters {
        if !new.counters.contains(name) {
            out.push(Change::DelCounter { name: name.clone() });
        }
    }
}

/// Whether the kernel keeps `s` as a pipapo set (an interval set whose key
/// concatenates fields). Its costs are superlinear (measured on 6.18, see
/// [`PIPAPO_DELETE_BUDGET`]): deleting one element costs what the set
/// holds, about 2.5 µs per element held (the kernel re-scans and re-copies
/// its lookup data per deleted element), while adding costs about 7 ns per
/// element held per element added (10,000 into an empty set: 0.74 s), and
/// destroying the whole set is linear and cheap.
pub fn pipapo(s: &Set) -> bool {
    s.interval && s.key.len() > 1
}

/// The deletion work one batch may always do one by one in one pipapo set:
/// elements deleted × elements the set holds, about 4.5 ms of kernel time
/// under the nftables lock (one element from a set of 1,800, 12 from 150).
/// Beyond it, the set is rebuilt in the batch instead
/// ([`bound_pipapo_deletes`]) whenever re-adding what stays is cheaper than
/// the deletions (by the costs measured in [`pipapo`]: a deletion costs
/// what [`DELETE_VS_ADD`] additions do, per element held). So a batch's
/// deletions never cost more than the larger of this budget and what adding
/// the set's remaining elements costs: removal costs what addition costs.
/// The budget is where a rebuild costs the same: a rebuild rewrites the
/// chains naming the set, which makes the kernel validate the table's
/// jumps again, and measured 3–4.5 ms for a policy shard of ~150 elements
/// (policy-bench, one-pod label changes). With 4,096 (about 10 ms) the
/// worst label change's batch took 9.7 ms; with 1,800, 4.5–7.7 ms.
pub const PIPAPO_DELETE_BUDGET: usize = 1800;

/// A pipapo deletion's cost over an addition's, per element the set holds
/// (2.5 µs / 7.4 ns, measured on 6.18).
pub const DELETE_VS_ADD: u128 = 338;

/// Whether deleting `deletes` elements one by one from a pipapo set holding
/// `held` is the way to go: within [`PIPAPO_DELETE_BUDGET`], or cheaper
/// than deleting the set and adding the `held - deletes` that stay.
pub fn delete_one_by_one(deletes: usize, held: usize) -> bool {
    let held = held.max(deletes);
    let work = deletes as u128 * held as u128;
    let stay = (held - deletes) as u128;
    work <= PIPAPO_DELETE_BUDGET as u128 || work * DELETE_VS_ADD <= stay * stay
}

/// Whether rule `r` names set `name`.
fn references(r: &Rule, name: &str) -> bool {
    use crate::model::Expr;
    r.exprs.iter().any(|e| match e {
        Expr::InSet { set, .. } | Expr::UpdateSet { set, .. } | Expr::AddSet { set, .. } => {
            set == name
        }
        Expr::VMap { map, .. } | Expr::PickDnat { map, .. } | Expr::MapDnat { map, .. } => {
            map == name
        }
        _ => false,
    })
}

/// Rewrites `changes`, one batch of table `t` (the wanted table: its set
/// declarations and chain rules), so that no pipapo set loses elements one
/// by one where [`delete_one_by_one`] says no: such a set is rebuilt in the
/// same transaction instead. The chains whose rules name it are flushed,
/// the set is deleted (the kernel frees it whole) and declared again with
/// `want(set)`, what it must hold after the batch, and the chains' rules
/// from `t` are added back; the batch's other changes of that set are
/// dropped. `held(set)` is how many elements the set holds before the
/// batch. The transaction is atomic: no packet sees the set half built.
pub fn bound_pipapo_deletes(
    t: &Table,
    changes: Vec<Change>,
    held: &dyn Fn(&str) -> usize,
    want: &mut dyn FnMut(&str) -> Set,
) -> Vec<Change> {
    let mut deletes: BTreeMap<&str, usize> = BTreeMap::new();
    for c in &changes {
        if let Change::DelElems { set, keys } = c {
            if t.sets.get(set).is_some_and(pipapo) {
                *deletes.entry(set.as_str()).or_insert(0) += keys.len();
            }
        }
    }
    let rebuilt: BTreeSet<String> = deletes
        .into_iter()
        .filter(|(s, d)| !delete_one_by_one(*d, held(s)))
        .map(|(s, _)| s.to_string())
        .collect();
    if rebuilt.is_empty() {
        return changes;
    }
    let chains: Vec<&String> = t
        .chains
        .iter()
        .filter(|(_, c)| {
            c.rules
                .iter()
                .any(|r| rebuilt.iter().any(|s| references(r, s)))
        })
        .map(|(n, _)| n)
        .collect();
    let mut block = Vec::new();
    for name in &chains {
        block.push(Change::FlushChain {
            name: name.to_string(),
        });
    }
    for name in &rebuilt {
        block.push(Change::DelSet { name: name.clone() });
    }
    for name in &rebuilt {
        let s = want(name);
        block.push(Change::AddSet {
            name: name.clone(),
            set: Set {
                elements: Default::default(),
                comments: Default::default(),
                ..t.sets[name].clone()
            },
        });
        add_elems(&mut block, name, &s, s.elements.keys());
    }
    for name in &chains {
        let rules = &t.chains[*name].rules;
        if !rules.is_empty() {
            block.push(Change::AddRules {
                chain: name.to_string(),
                rules: rules.clone(),
            });
        }
    }
    let mut out = Vec::with_capacity(changes.len() + block.len());
    let mut block = Some(block);
    for c in changes {
        let of_rebuilt = match &c {
            Change::DelElems { set, .. }
            | Change::AddElems { set, .. }
            | Change::AddCommented { set, .. } => rebuilt.contains(set),
            _ => false,
        };
        if !of_rebuilt {
            out.push(c);
        } else if matches!(c, Change::DelElems { .. }) {
            // The rebuild goes where the first deletion was: before the
            // additions, after what they depend on.
            out.extend(block.take().into_iter().flatten());
        }
    }
    out
}

/// The most elements `changes` delete one by one from one pipapo set of
/// `t` (what [`bound_pipapo_deletes`] bounds; for reports and tests).
pub fn max_pipapo_deletes(t: &Table, changes: &[Change]) -> usize {
    let mut per: BTreeMap<&str, usize> = BTreeMap::new();
    for c in changes {
        if let Change::DelElems { set, keys } = c {
            if t.sets.get(set).is_some_and(pipapo) {
                *per.entry(set.as_str()).or_insert(0) += keys.len();
            }
        }
    }
    per.into_values().max().unwrap_or(0)
}

/// A full replace: whatever table of that name exists is swapped for
/// `new` in one transaction (connections keep their conntrack state).
pub fn replace(new: &Table) -> Vec<Change> {
    let mut v = vec![Change::ResetTable];
    v.extend(diff(None, new));
    v
}

/// The change list as an `nft -f` script (one atomic transaction).
pub fn render(t: &Table, changes: &[Change]) -> String {
    let (f, n) = (t.family.name(), &t.name);
    let mut s = String::new();
    for c in changes {
        match c {
            Change::ResetTable => s.push_str(&format!("add table {f} {n}\ndelete table {f} {n}\n")),
            Change::AddTable => s.push_str(&format!("add table {f} {n}\n")),
            Change::AddSet { name, set } => {
                let kw = if set.data.is_some() { "map" } else { "set" };
                s.push_str(&format!(
                    "add {kw} {f} {n} {name} {{ {} }}\n",
                    set.decl_text()
                ));
            }
            Change::DelSet { name } => s.push_str(&format!("delete set {f} {n} {name}\n")),
            Change::AddChain { name, base } => match base {
                Some(b) => {
                    let kind = match b.kind {
                        crate::model::ChainType::Filter => "filter",
                        crate::model::ChainType::Nat => "nat",
                    };
                    let hook = format!("{:?}", b.hook).to_ascii_lowercase();
                    s.push_str(&format!(
                        "add chain {f} {n} {name} {{ type {kind} hook {hook} priority {}; policy accept; }}\n",
                        b.priority
                    ));
                }
                None => s.push_str(&format!("add chain {f} {n} {name}\n")),
            },
            Change::DelChain { name } => s.push_str(&format!("delete chain {f} {n} {name}\n")),
            Change::FlushChain { name } => s.push_str(&format!("flush chain {f} {n} {name}\n")),
            Change::AddRules { chain, rules } => {
                for r in rules {
                    s.push_str(&format!("add rule {f} {n} {chain} {}\n", r.text()));
                }
            }
            Change::AddElems { set, elems } => {
                for chunk in elems.chunks(1000) {
                    let els: Vec<String> =
                        chunk.iter().map(|(k, d)| Set::element_text(k, d)).collect();
                    s.push_str(&format!(
                        "add element {f} {n} {set} {{ {} }}\n",
                        els.join(", ")
                    ));
                }
            }
            Change::AddCommented { set, elems } => {
                for (k, d, c) in elems {
                    s.push_str(&format!(
                        "add element {f} {n} {set} {{ {} comment \"{}\" }}\n",
                        Set::element_text(k, d),
                        c.replace('"', "'")
                    ));
                }
            }
            Change::AddCounter { name } => {
                s.push_str(&format!("add counter {f} {n} {name}\n"));
            }
            Change::DelCounter { name } => {
                s.push_str(&format!("delete counter {f} {n} {name}\n"));
            }
            Change::DelElems { set, keys } => {
                for chunk in keys.chunks(1000) {
                    let els: Vec<String> =
                        chunk.iter().map(|k| Set::element_text(k, &None)).collect();
                    s.push_str(&format!(
                        "delete element {f} {n} {set} {{ {} }}\n",
                        els.join(", ")
                    ));
                }
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::*;

    fn table(extra_elem: bool, rule_port: u16) -> Table {
        let mut t = Table::new(Family::Ip, "podnet");
        let mut m = Set::map(vec![
            KeyType::Ipv4Addr,
            KeyType::InetProto,
            KeyType::InetService,
        ]);
        m.elements.insert(
            vec![
                Value::Addr("10.96.0.1".parse().unwrap()),
                Value::Proto(Proto::Tcp),
                Value::Port(443),
            ],
            Some(ElemData::Verdict(Verdict::Goto("svc-a".into()))),
        );
        if extra_elem {
            m.elements.insert(
                vec![
                    Value::Addr("10.96.0.2".parse().unwrap()),
                    Value::Proto(Proto::Udp),
                    Value::Port(53),
                ],
                Some(ElemData::Verdict(Verdict::Goto("svc-b".into()))),
            );
        }
        t.sets.insert("service-ips".into(), m);
        t.chains.insert(
            "svc-a".into(),
            Chain {
                base: None,
                rules: vec![Rule::new(vec![Expr::Dnat {
                    addr: "10.244.1.5".parse().unwrap(),
                    port: Some(rule_port),
                }])],
            },
        );
        if extra_elem {
            t.chains.insert(
                "svc-b".into(),
                Chain {
                    base: None,
                    rules: vec![Rule::new(vec![Expr::Reject { tcp_reset: false }])],
                },
            );
        }
        t
    }

    #[test]
    fn identical_tables_need_no_change() {
        let t = table(true, 80);
        assert!(diff(Some(&t), &t).is_empty());
    }

    #[test]
    fn first_sync_creates_everything_in_order() {
        let t = table(true, 80);
        let d = diff(None, &t);
        assert_eq!(d[0], Change::AddTable);
        let pos = |f: &dyn Fn(&Change) -> bool| d.iter().position(f).unwrap();
        assert!(
            pos(&|c| matches!(c, Change::AddChain { name, .. } if name == "svc-b"))
                < pos(&|c| matches!(c, Change::AddElems { .. }))
        );
        assert_eq!(ops(&d), 1 + 1 + 2 + 2 + 2);
    }

    #[test]
    fn small_changes_are_small() {
        let old = table(true, 80);
        // one endpoint port changes: one chain rewritten
        let d = diff(Some(&old), &table(true, 8080));
        assert_eq!(
            d,
            vec![
                Change::FlushChain {
                    name: "svc-a".into()
                },
                Change::AddRules {
                    chain: "svc-a".into(),
                    rules: table(true, 8080).chains["svc-a"].rules.clone()
                }
            ]
        );
        // a Service removed: its element, its chain
        let d = diff(Some(&old), &table(false, 80));
        assert_eq!(ops(&d), 3, "{d:?}");
        let del_el = d
            .iter()
            .position(|c| matches!(c, Change::DelElems { .. }))
            .unwrap();
        let del_ch = d
            .iter()
            .position(|c| matches!(c, Change::DelChain { .. }))
            .unwrap();
        assert!(del_el < del_ch, "unreference before delete");
        let text = render(&old, &d);
        assert!(
            text.contains("delete element ip podnet service-ips { 10.96.0.2 . udp . 53 }"),
            "{text}"
        );
        assert!(text.contains("delete chain ip podnet svc-b"));
    }

    #[test]
    fn render_is_stable() {
        let t = table(false, 80);
        let r = t.render();
        assert!(
            r.contains(
                "map service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict;"
            ),
            "{r}"
        );
        assert!(r.contains("10.96.0.1 . tcp . 443 : goto svc-a"));
        assert!(r.contains("dnat ip to 10.244.1.5:80"));
    }

    #[test]
    fn comments_and_counters_are_part_of_the_state() {
        let mut old = Table::new(Family::Inet, "t");
        let mut s = Set::new(vec![KeyType::Ipv4Addr]);
        let k = vec![Value::Addr("10.1.0.2".parse().unwrap())];
        s.elements.insert(k.clone(), None);
        s.comments.insert(k.clone(), "n/a".into());
        old.sets.insert("masq4".into(), s);
        let mut new = old.clone();
        assert!(diff(Some(&old), &new).is_empty());
        new.sets
            .get_mut("masq4")
            .unwrap()
            .comments
            .insert(k.clone(), "n/b".into());
        new.counters.insert("hits".into());
        let d = diff(Some(&old), &new);
        assert_eq!(
            d,
            vec![
                Change::AddCounter {
                    name: "hits".into()
                },
                Change::DelElems {
                    set: "masq4".into(),
                    keys: vec![k.clone()]
                },
                Change::AddCommented {
                    set: "masq4".into(),
                    elems: vec![(k, None, "n/b".into())]
                },
            ]
        );
        assert!(render(&new, &d).contains("add element inet t masq4 { 10.1.0.2 comment \"n/b\" }"));
        let gone = diff(Some(&new), &old);
        assert_eq!(
            gone.last(),
            Some(&Change::DelCounter {
                name: "hits".into()
            })
        );
        // ensure declares everything and rewrites the rules, touching no element.
        let e = ensure(&new);
        assert_eq!(e[0], Change::AddTable);
        assert!(e.iter().all(|c| !matches!(
            c,
            Change::AddElems { .. } | Change::AddCommented { .. } | Change::DelElems { .. }
        )));
        assert!(
            matches!(&e[1], Change::AddSet { set, .. } if set.elements.is_empty() && set.comments.is_empty())
        );
    }

    /// A table with a pipapo set `ranges` (addr . net) and a hash set
    /// `hosts`, both named by chain `judge`; `ranges` holds `n` elements.
    fn pipapo_table(n: u32) -> Table {
        let mut t = Table::new(Family::Ip, "t");
        let mut r = Set::new(vec![KeyType::Ipv4Addr, KeyType::Ipv4Addr]);
        r.interval = true;
        for i in 0..n {
            r.elements.insert(range_key(i), None);
        }
        t.sets.insert("ranges".into(), r);
        t.sets
            .insert("hosts".into(), Set::new(vec![KeyType::Ipv4Addr]));
        let lookup = |set: &str, keys: Vec<Field>| {
            Rule::new(vec![
                Expr::InSet {
                    keys,
                    set: set.into(),
                    neg: false,
                },
                Expr::Verdict(Verdict::Accept),
            ])
        };
        t.chains.insert(
            "judge".into(),
            Chain {
                base: None,
                rules: vec![
                    lookup("ranges", vec![Field::IpDaddr, Field::IpSaddr]),
                    lookup("hosts", vec![Field::IpSaddr]),
                ],
            },
        );
        t.chains.insert("other".into(), Chain::default());
        t
    }

    fn range_key(i: u32) -> Vec<Value> {
        let net = ipnet::IpNet::new(
            std::net::IpAddr::from((0x0b00_0000 | (i << 8)).to_be_bytes()),
            24,
        )
        .unwrap();
        vec![Value::Addr("10.9.1.2".parse().unwrap()), Value::Net(net)]
    }

    fn host(i: u8) -> Vec<Value> {
        vec![Value::Addr(std::net::IpAddr::from([10, 0, 0, i]))]
    }

    #[test]
    fn a_pipapo_set_losing_many_elements_is_rebuilt_with_what_stays() {
        let old = pipapo_table(1000);
        // 990 ranges go, one comes, a host comes: the set is rebuilt with
        // the 10 that stay and the new one, in the same batch.
        let mut new = pipapo_table(10);
        new.sets
            .get_mut("ranges")
            .unwrap()
            .elements
            .insert(range_key(5000), None);
        new.sets
            .get_mut("hosts")
            .unwrap()
            .elements
            .insert(host(1), None);
        let d = diff(Some(&old), &new);
        assert_eq!(max_pipapo_deletes(&new, &d), 990);
        let held = |s: &str| old.sets[s].elements.len();
        let b = bound_pipapo_deletes(&new, d, &held, &mut |s| new.sets[s].clone());
        assert_eq!(max_pipapo_deletes(&new, &b), 0, "{b:?}");
        let empty_ranges = Set {
            elements: Default::default(),
            ..new.sets["ranges"].clone()
        };
        let mut kept: Vec<(Vec<Value>, Option<ElemData>)> =
            (0..10).map(|i| (range_key(i), None)).collect();
        kept.push((range_key(5000), None));
        assert_eq!(
            b,
            vec![
                Change::FlushChain {
                    name: "judge".into()
                },
                Change::DelSet {
                    name: "ranges".into()
                },
                Change::AddSet {
                    name: "ranges".into(),
                    set: empty_ranges
                },
                Change::AddElems {
                    set: "ranges".into(),
                    elems: kept
                },
                Change::AddRules {
                    chain: "judge".into(),
                    rules: new.chains["judge"].rules.clone()
                },
                Change::AddElems {
                    set: "hosts".into(),
                    elems: vec![(host(1), None)]
                },
            ]
        );
    }

    #[test]
    fn small_pipapo_deletions_and_other_sets_stay_one_by_one() {
        let old = pipapo_table(20);
        let mut new = pipapo_table(18);
        new.sets
            .get_mut("hosts")
            .unwrap()
            .elements
            .insert(host(2), None);
        let d = diff(Some(&old), &new);
        let held = |s: &str| old.sets[s].elements.len();
        let b = bound_pipapo_deletes(&new, d.clone(), &held, &mut |_| unreachable!());
        assert_eq!(b, d, "2 of 20 is within the budget");
        assert_eq!(max_pipapo_deletes(&new, &b), 2);
        // A hash set loses any number one by one.
        let mut old = pipapo_table(0);
        for i in 0..200 {
            old.sets
                .get_mut("hosts")
                .unwrap()
                .elements
                .insert(host(i), None);
        }
        let new = pipapo_table(0);
        let d = diff(Some(&old), &new);
        let held = |s: &str| old.sets[s].elements.len();
        assert_eq!(
            bound_pipapo_deletes(&new, d.clone(), &held, &mut |_| unreachable!()),
            d
        );
    }

    #[test]
    fn one_by_one_only_while_cheaper_than_re_adding() {
        // Within the budget: always.
        assert!(delete_one_by_one(1, PIPAPO_DELETE_BUDGET));
        assert!(delete_one_by_one(0, 1_000_000));
        // Everything, or nearly, goes: rebuild.
        assert!(!delete_one_by_one(10_000, 10_000));
        assert!(!delete_one_by_one(9_000, 10_000));
        // One from a huge set: deleting it beats re-adding the rest.
        assert!(delete_one_by_one(1, 100_000));
        assert!(!delete_one_by_one(1_000, 100_000));
    }
}
