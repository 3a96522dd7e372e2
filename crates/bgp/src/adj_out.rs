//! What one peer is to hold from this speaker (its Adj-RIB-Out, RFC 4271
//! §3.2), changed a prefix at a time, and the UPDATEs that carry a change,
//! pure. A change costs what changed: a batch of changed prefixes is
//! applied to the table, and only the prefixes whose route really changed
//! come out, to be sent; the whole table is sent only to a session that
//! comes up.
//!
//! Prefixes that share attributes go in one UPDATE (as many as fit, see
//! [`crate::wire::pack`]), withdrawals before announcements.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ipnet::IpNet;

use crate::wire::{pack, pack_withdrawals, Afi, Codec, PathAttrs, Update};

/// A prefix's new route (None: withdrawn), the attributes shared by the
/// prefixes that have the same.
pub type Routed = (IpNet, Option<Arc<PathAttrs>>);

/// Changes not yet applied; a later change to a prefix replaces an
/// earlier one. Attributes are shared ([`share`]): a batch of many
/// prefixes holds one copy of each set, and a withdrawal costs a pointer.
#[derive(Debug, Default)]
pub struct Batch {
    /// A whole new table, applied before `changes`.
    pub whole: Option<BTreeMap<IpNet, Arc<PathAttrs>>>,
    pub changes: BTreeMap<IpNet, Option<Arc<PathAttrs>>>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.whole.is_none() && self.changes.is_empty()
    }
}

/// Routes with their attributes shared: one [`Arc`] for a run of
/// prefixes with equal attributes (a table comes mostly in such runs).
pub fn share(
    routes: impl IntoIterator<Item = (IpNet, Option<PathAttrs>)>,
) -> impl Iterator<Item = Routed> {
    let mut last: Option<Arc<PathAttrs>> = None;
    routes.into_iter().map(move |(p, a)| {
        let a = a.map(|a| match last.take() {
            Some(l) if *l == a => l,
            _ => Arc::new(a),
        });
        if a.is_some() {
            last = a.clone();
        }
        (p, a)
    })
}

/// The routes a peer is to hold from us, whether or not its session is up.
#[derive(Debug, Default)]
pub struct AdjOut {
    wanted: BTreeMap<IpNet, Arc<PathAttrs>>,
}

impl AdjOut {
    pub fn len(&self) -> usize {
        self.wanted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.wanted.is_empty()
    }

    /// Applies `b`; returns the prefixes whose route differs from before,
    /// with the route now (nothing for a prefix set to what it had).
    pub fn apply(&mut self, b: Batch) -> Vec<Routed> {
        let Some(mut whole) = b.whole else {
            let mut out = Vec::new();
            for (p, a) in b.changes {
                self.set(&mut out, p, a);
            }
            return out;
        };
        // The changes after a whole table are part of it.
        for (p, a) in b.changes {
            match a {
                Some(a) => whole.insert(p, a),
                None => whole.remove(&p),
            };
        }
        if self.wanted.is_empty() {
            let out = whole.iter().map(|(p, a)| (*p, Some(a.clone()))).collect();
            self.wanted = whole;
            return out;
        }
        let gone: Vec<IpNet> = self
            .wanted
            .keys()
            .filter(|p| !whole.contains_key(p))
            .copied()
            .collect();
        let mut out = Vec::new();
        for p in gone {
            self.set(&mut out, p, None);
        }
        for (p, a) in whole {
            self.set(&mut out, p, Some(a));
        }
        out
    }

    /// Sets one prefix's route; says so in `out` if it changed.
    fn set(&mut self, out: &mut Vec<Routed>, p: IpNet, a: Option<Arc<PathAttrs>>) {
        use std::collections::btree_map::Entry;
        let changed = match (self.wanted.entry(p), &a) {
            (Entry::Occupied(o), None) => {
                o.remove();
                true
            }
            (Entry::Vacant(_), None) => false,
            (Entry::Occupied(mut o), Some(a)) => {
                let differs = !same(o.get(), a);
                if differs {
                    o.insert(a.clone());
                }
                differs
            }
            (Entry::Vacant(v), Some(a)) => {
                v.insert(a.clone());
                true
            }
        };
        if changed {
            out.push((p, a));
        }
    }

    /// Every route, for a session that came up.
    pub fn all(&self) -> Vec<Routed> {
        self.wanted
            .iter()
            .map(|(p, a)| (*p, Some(a.clone())))
            .collect()
    }
}

/// Equal attributes, the pointer compared first.
fn same(a: &Arc<PathAttrs>, b: &Arc<PathAttrs>) -> bool {
    Arc::ptr_eq(a, b) || **a == **b
}

/// The UPDATEs that bring a peer's view to `routes`, over a session that
/// carries `families` (prefixes of other families are left out): the
/// withdrawals, then the announcements, prefixes with equal attributes in
/// one UPDATE.
pub fn updates(codec: &Codec, families: &[Afi], routes: &[Routed]) -> Vec<Update> {
    let carried = |p: &IpNet| families.contains(&Afi::of(p));
    let mut out = Vec::new();
    for afi in families {
        let gone: Vec<IpNet> = routes
            .iter()
            .filter(|(p, a)| a.is_none() && Afi::of(p) == *afi)
            .map(|(p, _)| *p)
            .collect();
        out.extend(pack_withdrawals(codec, *afi, &gone));
    }
    let mut groups: Vec<(Afi, &Arc<PathAttrs>, Vec<IpNet>)> = Vec::new();
    let mut index: HashMap<(Afi, &PathAttrs), usize> = HashMap::new();
    for (p, a) in routes {
        let Some(a) = a.as_ref().filter(|_| carried(p)) else {
            continue;
        };
        let afi = Afi::of(p);
        // Most runs share one attribute set: no hashing for those.
        if let Some((f, g, ps)) = groups.last_mut() {
            if *f == afi && Arc::ptr_eq(g, a) {
                ps.push(*p);
                continue;
            }
        }
        match index.get(&(afi, &**a)) {
            Some(i) => groups[*i].2.push(*p),
            None => {
                index.insert((afi, &**a), groups.len());
                groups.push((afi, a, vec![*p]));
            }
        }
    }
    for (afi, attrs, prefixes) in groups {
        out.extend(pack(codec, attrs, afi, &prefixes));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Origin;

    fn attrs(med: u32) -> PathAttrs {
        PathAttrs {
            origin: Some(Origin::Igp),
            next_hop: Some("10.0.0.1".parse().unwrap()),
            local_pref: Some(100),
            med: Some(med),
            ..Default::default()
        }
    }

    fn net(i: u32) -> IpNet {
        IpNet::V4(
            ipnet::Ipv4Net::new(std::net::Ipv4Addr::from(0x0a80_0000 + (i << 8)), 24).unwrap(),
        )
    }

    /// A table of 10,000 routes, as a session that comes up gets them.
    fn table() -> (AdjOut, Vec<Update>) {
        let mut out = AdjOut::default();
        let all = out.apply(Batch {
            changes: share((0..10_000).map(|i| (net(i), Some(attrs(0))))).collect(),
            ..Default::default()
        });
        assert_eq!(all.len(), 10_000);
        let codec = Codec {
            four_octet_as: true,
        };
        let sent = updates(&codec, &[Afi::Ipv4], &out.all());
        (out, sent)
    }

    #[test]
    fn one_changed_prefix_among_many_is_one_update_of_that_prefix() {
        let (mut out, whole) = table();
        let codec = Codec {
            four_octet_as: true,
        };
        let carried: usize = whole.iter().map(|u| u.nlri.len()).sum();
        assert_eq!(carried, 10_000);
        assert!(whole.len() < 20, "packed: {} UPDATEs", whole.len());
        // A new MED for one prefix: one UPDATE, that prefix alone.
        let d = out.apply(Batch {
            changes: [(net(77), Some(Arc::new(attrs(5))))].into(),
            ..Default::default()
        });
        let sent = updates(&codec, &[Afi::Ipv4], &d);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].nlri, vec![net(77).to_string().parse().unwrap()]);
        assert_eq!(sent[0].attrs.med, Some(5));
        assert!(sent[0].withdrawn.is_empty());
        // One withdrawn: one UPDATE withdrawing it.
        let d = out.apply(Batch {
            changes: [(net(78), None)].into(),
            ..Default::default()
        });
        let sent = updates(&codec, &[Afi::Ipv4], &d);
        assert_eq!(sent.len(), 1);
        assert_eq!(
            sent[0].withdrawn,
            vec![net(78).to_string().parse().unwrap()]
        );
        assert!(sent[0].nlri.is_empty());
        assert_eq!(out.len(), 9_999);
    }

    #[test]
    fn what_the_peer_already_holds_is_not_sent_again() {
        let (mut out, _) = table();
        let whole = || -> BTreeMap<IpNet, Arc<PathAttrs>> {
            let a = Arc::new(attrs(0));
            (0..10_000).map(|i| (net(i), a.clone())).collect()
        };
        // The same route again.
        let same = Batch {
            changes: [(net(1), Some(Arc::new(attrs(0))))].into(),
            ..Default::default()
        };
        assert!(out.apply(same).is_empty());
        // A change undone in the same batch: after a whole table, a change
        // to one of its prefixes.
        let mut changed = whole();
        changed.insert(net(2), Arc::new(attrs(9)));
        let undone = Batch {
            whole: Some(changed),
            changes: [(net(2), Some(Arc::new(attrs(0))))].into(),
        };
        assert!(out.apply(undone).is_empty());
        // A whole table that differs in two routes sends those two.
        let gone = Batch {
            changes: [(net(3), None)].into(),
            ..Default::default()
        };
        assert_eq!(out.apply(gone).len(), 1);
        let mut back = whole();
        back.remove(&net(5));
        let d = out.apply(Batch {
            whole: Some(back),
            ..Default::default()
        });
        let mut got: Vec<(IpNet, bool)> = d.iter().map(|(p, a)| (*p, a.is_some())).collect();
        got.sort();
        assert_eq!(got, vec![(net(3), true), (net(5), false)]);
    }

    #[test]
    fn withdrawals_go_first_and_other_families_are_left_out() {
        let v6: IpNet = "fd00:244::/64".parse().unwrap();
        let routes: Vec<Routed> = vec![
            (net(1), Some(Arc::new(attrs(0)))),
            (net(2), None),
            (v6, Some(Arc::new(attrs(0)))),
            (net(3), Some(Arc::new(attrs(0)))),
            (net(4), Some(Arc::new(attrs(1)))),
        ];
        let codec = Codec {
            four_octet_as: true,
        };
        let sent = updates(&codec, &[Afi::Ipv4], &routes);
        assert_eq!(sent.len(), 3, "{sent:?}");
        assert_eq!(sent[0].withdrawn.len(), 1);
        // Equal attributes in one UPDATE, though not shared nor adjacent.
        assert_eq!(sent[1].nlri.len(), 2);
        assert_eq!(sent[2].attrs.med, Some(1));
        assert!(sent.iter().all(|u| u.attrs.mp_reach.is_none()));
    }
}
