//! The routes a speaker learned and the one it uses per prefix: each
//! peer's Adj-RIB-In, and the Loc-RIB the decision process (RFC 4271 §9.1)
//! picks from them, with route reflection's loop checks (RFC 4456). Pure:
//! UPDATEs and session losses go in, the changes to the best routes come
//! out, for the caller to install in the kernel and pass on to peers.
//!
//! A peer whose session ended without a goodbye while it had graceful
//! restart (RFC 4724 §4.2) keeps its routes, marked stale, until it comes
//! back and says End-of-RIB (what it did not announce again goes then) or
//! its restart time runs out (the caller's timer: then [`Rib::peer_down`]).
//! A route is one per peer address, so a restarted peer's routes replace
//! its stale ones whatever it now calls itself.
//!
//! Only what a node's speaker needs of the decision process is here, in
//! this order: highest LOCAL_PREF (100 when absent), shortest AS_PATH (a
//! set counts one), lowest ORIGIN, lowest MED among routes from the same
//! neighbouring AS, eBGP before iBGP, shortest CLUSTER_LIST, lowest
//! ORIGINATOR_ID or peer BGP identifier, lowest peer address.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use ipnet::IpNet;

use crate::wire::{AsSegment, Origin, PathAttrs, Update};

/// Who sent a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerId {
    pub addr: IpAddr,
    pub router_id: Ipv4Addr,
    pub asn: u32,
    /// Whether it is an eBGP peer.
    pub external: bool,
    /// Whether it is a route-reflector client of this speaker.
    pub client: bool,
}

/// One route as learned.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub from: PeerId,
    /// Shared by every prefix of the UPDATE that brought it (the
    /// attributes are most of a route's size).
    pub attrs: Arc<PathAttrs>,
    /// The next hop (IPv4 from NEXT_HOP, IPv6 from MP_REACH_NLRI).
    pub next_hop: IpAddr,
}

/// A best route that changed: `None` when the prefix has no route left.
pub type Change = (IpNet, Option<Route>);

/// The speaker's own identity, for the loop checks.
#[derive(Debug, Clone, Copy)]
pub struct Local {
    pub asn: u32,
    pub router_id: Ipv4Addr,
    /// The cluster ID when this speaker reflects routes (its router ID by
    /// default, RFC 4456 §7).
    pub cluster_id: Option<Ipv4Addr>,
}

/// One prefix's routes, one per peer (a few at most: a vector, not a map,
/// whose nodes would be sized for many), and which of them is in use.
/// Never empty: a prefix without routes has no entry.
#[derive(Debug)]
struct Entry {
    routes: Vec<Route>,
    best: usize,
}

impl Entry {
    fn best(&self) -> &Route {
        &self.routes[self.best]
    }

    /// Replaces `r.from`'s route, or adds it; whether it was added.
    fn put(&mut self, r: Route) -> bool {
        match self.routes.iter_mut().find(|x| x.from.addr == r.from.addr) {
            Some(x) => {
                *x = r;
                false
            }
            None => {
                self.routes.push(r);
                true
            }
        }
    }

    /// Removes `addr`'s route; whether there was one.
    fn take(&mut self, addr: IpAddr) -> bool {
        let before = self.routes.len();
        self.routes.retain(|r| r.from.addr != addr);
        self.routes.len() < before
    }

    /// The decision process over this prefix's routes.
    fn decide(&mut self) {
        let best = self
            .routes
            .iter()
            .enumerate()
            .min_by(|a, b| compare(a.1, b.1));
        self.best = best.map_or(0, |(i, _)| i);
    }
}

/// Every route learned, per prefix and peer, and the best per prefix:
/// one entry per prefix, so a route costs one search of the table.
#[derive(Debug, Default)]
pub struct Rib {
    table: BTreeMap<IpNet, Entry>,
    /// Per restarting peer, the prefixes it has not announced again.
    stale: BTreeMap<IpAddr, BTreeSet<IpNet>>,
    /// Per peer, how many prefixes it has routes for (kept as routes come
    /// and go, for the status).
    counts: BTreeMap<IpAddr, usize>,
}

impl Rib {
    /// The route in use for `prefix`.
    pub fn best(&self, prefix: &IpNet) -> Option<&Route> {
        self.table.get(prefix).map(Entry::best)
    }

    /// Every prefix with a route in use, and the route.
    pub fn best_routes(&self) -> impl Iterator<Item = (&IpNet, &Route)> {
        self.table.iter().map(|(p, e)| (p, e.best()))
    }

    /// Takes one UPDATE from `from`: its withdrawals, then its routes (a
    /// route that loops back to this speaker is treated as a withdrawal).
    /// Returns the best routes that changed (a prefix at most once).
    pub fn update(&mut self, local: &Local, from: PeerId, u: &Update) -> Vec<Change> {
        let unreach = u
            .attrs
            .mp_unreach
            .iter()
            .flat_map(|m| m.withdrawn.iter().copied());
        let withdrawn: Vec<IpNet> = u
            .withdrawn
            .iter()
            .map(|p| IpNet::V4(*p))
            .chain(unreach)
            .collect();
        let mut out = Vec::new();
        for p in &withdrawn {
            self.set(&mut out, *p, from.addr, None);
        }
        let looped = loops(local, &u.attrs);
        let mut attrs = u.attrs.clone();
        attrs.mp_reach = None;
        attrs.mp_unreach = None;
        let attrs = Arc::new(attrs);
        let v4 = u
            .nlri
            .iter()
            .map(|p| (IpNet::V4(*p), u.attrs.next_hop.map(IpAddr::V4)));
        let v6 = u.attrs.mp_reach.iter().flat_map(|m| {
            let hop = m.next_hops.first().copied();
            m.nlri.iter().map(move |p| (*p, hop))
        });
        let mut announced = 0;
        for (p, hop) in v4.chain(v6) {
            announced += 1;
            let r = match (looped, hop) {
                (false, Some(next_hop)) => Some(Route {
                    from,
                    attrs: attrs.clone(),
                    next_hop,
                }),
                _ => None,
            };
            self.set(&mut out, p, from.addr, r);
            self.not_stale(from.addr, &p);
        }
        for p in &withdrawn {
            self.not_stale(from.addr, p);
        }
        if !withdrawn.is_empty() && announced > 0 {
            last_per_prefix(&mut out);
        }
        out
    }

    /// Sets (or, with None, removes) `addr`'s route to `p`; a change of
    /// the best route goes to `out`.
    fn set(&mut self, out: &mut Vec<Change>, p: IpNet, addr: IpAddr, r: Option<Route>) {
        use std::collections::btree_map::Entry as Slot;
        let (before, after, delta) = match self.table.entry(p) {
            Slot::Vacant(v) => {
                let Some(r) = r else { return };
                let after = r.clone();
                v.insert(Entry {
                    routes: vec![r],
                    best: 0,
                });
                (None, Some(after), 1)
            }
            Slot::Occupied(mut o) => {
                let e = o.get_mut();
                let before = e.best().clone();
                let delta = match r {
                    Some(r) => isize::from(e.put(r)),
                    None => -isize::from(e.take(addr)),
                };
                let after = match e.routes.is_empty() {
                    true => {
                        o.remove();
                        None
                    }
                    false => {
                        e.decide();
                        Some(e.best().clone())
                    }
                };
                (Some(before), after, delta)
            }
        };
        self.count(addr, delta);
        if before != after {
            out.push((p, after));
        }
    }

    fn count(&mut self, addr: IpAddr, delta: isize) {
        let c = self.counts.entry(addr).or_default();
        *c = c.saturating_add_signed(delta);
        if *c == 0 {
            self.counts.remove(&addr);
        }
    }

    /// What a restarting peer said again is no longer stale.
    fn not_stale(&mut self, addr: IpAddr, p: &IpNet) {
        if let Some(stale) = self.stale.get_mut(&addr) {
            stale.remove(p);
        }
    }

    /// Forgets every route of a peer whose session went down (or whose
    /// restart time ran out).
    pub fn peer_down(&mut self, from: &PeerId) -> Vec<Change> {
        self.stale.remove(&from.addr);
        let mut out = Vec::new();
        for p in self.prefixes_of(from.addr) {
            self.set(&mut out, p, from.addr, None);
        }
        out
    }

    /// The peer's session ended without a NOTIFICATION and it had graceful
    /// restart: its routes stay, stale, while it restarts.
    pub fn peer_restarting(&mut self, from: &PeerId) {
        let prefixes = self.prefixes_of(from.addr).into_iter().collect();
        self.stale.insert(from.addr, prefixes);
    }

    /// Whether `addr`'s routes are held for its restart.
    pub fn restarting(&self, addr: IpAddr) -> bool {
        self.stale.contains_key(&addr)
    }

    /// The restarted peer's End-of-RIB for `v6` (or IPv4) unicast: its
    /// routes of that family it did not announce again go.
    pub fn end_of_rib(&mut self, from: &PeerId, v6: bool) -> Vec<Change> {
        let Some(stale) = self.stale.get_mut(&from.addr) else {
            return Vec::new();
        };
        let gone: Vec<IpNet> = stale
            .iter()
            .filter(|p| matches!(p, IpNet::V6(_)) == v6)
            .copied()
            .collect();
        for p in &gone {
            stale.remove(p);
        }
        if stale.is_empty() {
            self.stale.remove(&from.addr);
        }
        let mut out = Vec::new();
        for p in gone {
            self.set(&mut out, p, from.addr, None);
        }
        out
    }

    fn prefixes_of(&self, addr: IpAddr) -> Vec<IpNet> {
        self.table
            .iter()
            .filter(|(_, e)| e.routes.iter().any(|r| r.from.addr == addr))
            .map(|(p, _)| *p)
            .collect()
    }

    /// How many prefixes `addr` has routes for.
    pub fn received(&self, addr: IpAddr) -> usize {
        self.counts.get(&addr).copied().unwrap_or(0)
    }
}

/// Keeps each prefix's last change only (an UPDATE that withdraws and
/// announces one prefix, which RFC 4271 does not forbid).
fn last_per_prefix(out: &mut Vec<Change>) {
    let mut seen = std::collections::HashSet::new();
    let mut kept: Vec<Change> = out
        .drain(..)
        .rev()
        .filter(|(p, _)| seen.insert(*p))
        .collect();
    kept.reverse();
    *out = kept;
}

/// Whether a route came back to this speaker: its own AS in the path
/// (eBGP), its router ID as ORIGINATOR_ID, or its cluster ID in the
/// CLUSTER_LIST (RFC 4456 §8).
fn loops(local: &Local, a: &PathAttrs) -> bool {
    let in_path = a.as_path.iter().any(|s| match s {
        AsSegment::Sequence(v) | AsSegment::Set(v) => v.contains(&local.asn),
    });
    let mine = a.originator_id == Some(local.router_id);
    let cluster = local.cluster_id.unwrap_or(local.router_id);
    in_path || mine || a.cluster_list.contains(&cluster)
}

fn path_len(a: &PathAttrs) -> usize {
    a.as_path
        .iter()
        .map(|s| match s {
            AsSegment::Sequence(v) => v.len(),
            AsSegment::Set(_) => 1,
        })
        .sum()
}

fn origin_rank(o: Option<&Origin>) -> u8 {
    match o {
        Some(Origin::Igp) | None => 0,
        Some(Origin::Egp) => 1,
        Some(Origin::Incomplete) => 2,
    }
}

/// The first AS of the path: the neighbouring AS MED is compared within.
fn neighbour_as(a: &PathAttrs) -> Option<u32> {
    a.as_path.iter().find_map(|s| match s {
        AsSegment::Sequence(v) => v.first().copied(),
        AsSegment::Set(_) => None,
    })
}

/// Orders two routes to one prefix: `Less` is the better one.
fn compare(a: &Route, b: &Route) -> std::cmp::Ordering {
    let (x, y) = (&a.attrs, &b.attrs);
    let pref = |r: &PathAttrs| r.local_pref.unwrap_or(100);
    pref(y)
        .cmp(&pref(x))
        .then(path_len(x).cmp(&path_len(y)))
        .then(origin_rank(x.origin.as_ref()).cmp(&origin_rank(y.origin.as_ref())))
        .then_with(|| match neighbour_as(x) == neighbour_as(y) {
            true => x.med.unwrap_or(0).cmp(&y.med.unwrap_or(0)),
            false => std::cmp::Ordering::Equal,
        })
        .then(b.from.external.cmp(&a.from.external))
        .then(x.cluster_list.len().cmp(&y.cluster_list.len()))
        .then_with(|| {
            let id = |r: &Route| r.attrs.originator_id.unwrap_or(r.from.router_id);
            id(a).cmp(&id(b))
        })
        .then(a.from.addr.cmp(&b.from.addr))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Afi, MpReach, MpUnreach, Safi};

    const LOCAL: Local = Local {
        asn: 64512,
        router_id: Ipv4Addr::new(10, 0, 0, 1),
        cluster_id: None,
    };

    fn peer(last: u8, asn: u32) -> PeerId {
        PeerId {
            addr: IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)),
            router_id: Ipv4Addr::new(10, 0, 0, last),
            asn,
            external: asn != LOCAL.asn,
            client: false,
        }
    }

    fn announce(prefix: &str, path: Vec<u32>, tweak: impl FnOnce(&mut PathAttrs)) -> Update {
        let mut attrs = PathAttrs {
            origin: Some(Origin::Igp),
            as_path: vec![AsSegment::Sequence(path)],
            next_hop: Some(Ipv4Addr::new(192, 0, 2, 1)),
            ..Default::default()
        };
        tweak(&mut attrs);
        Update {
            withdrawn: vec![],
            attrs,
            nlri: vec![prefix.parse().unwrap()],
        }
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn the_decision_process_prefers_pref_then_path_then_origin_then_med_then_ebgp() {
        let p = "10.244.1.0/24";
        let cases: Vec<(Update, Update)> = vec![
            // higher LOCAL_PREF wins over a shorter path
            (
                announce(p, vec![1, 2, 3], |a| a.local_pref = Some(200)),
                announce(p, vec![1], |_| {}),
            ),
            // shorter AS_PATH
            (
                announce(p, vec![1], |_| {}),
                announce(p, vec![1, 2], |_| {}),
            ),
            // lower ORIGIN
            (
                announce(p, vec![1], |_| {}),
                announce(p, vec![2], |a| a.origin = Some(Origin::Incomplete)),
            ),
            // lower MED, same neighbouring AS
            (
                announce(p, vec![7], |a| a.med = Some(5)),
                announce(p, vec![7], |a| a.med = Some(50)),
            ),
        ];
        for (better, worse) in cases {
            let mut rib = Rib::default();
            rib.update(&LOCAL, peer(3, 65003), &worse);
            let changes = rib.update(&LOCAL, peer(2, 65002), &better);
            assert_eq!(changes.len(), 1, "{better:?}");
            assert_eq!(rib.best(&net(p)).unwrap().from, peer(2, 65002));
            // Announced the other way round: the same choice, no change.
            let mut rib = Rib::default();
            rib.update(&LOCAL, peer(2, 65002), &better);
            assert!(rib.update(&LOCAL, peer(3, 65003), &worse).is_empty());
            assert_eq!(rib.best(&net(p)).unwrap().from, peer(2, 65002));
        }
        // All else equal (one AS long, from different neighbouring ASes):
        // eBGP before iBGP, whichever came first.
        for order in [[2u8, 3], [3, 2]] {
            let mut rib = Rib::default();
            for last in order {
                let (from, u) = match last {
                    2 => (peer(2, 64512), announce(p, vec![65009], |_| {})),
                    _ => (peer(3, 65003), announce(p, vec![65003], |_| {})),
                };
                rib.update(&LOCAL, from, &u);
            }
            assert_eq!(rib.best(&net(p)).unwrap().from, peer(3, 65003));
        }
    }

    #[test]
    fn withdrawals_and_a_lost_peer_fall_back_to_the_next_route_then_to_none() {
        let p = "10.244.2.0/24";
        let mut rib = Rib::default();
        rib.update(&LOCAL, peer(2, 65002), &announce(p, vec![65002], |_| {}));
        rib.update(&LOCAL, peer(3, 65003), &announce(p, vec![65003, 1], |_| {}));
        assert_eq!(rib.best(&net(p)).unwrap().from, peer(2, 65002));
        let withdraw = Update {
            withdrawn: vec![p.parse().unwrap()],
            ..Default::default()
        };
        let c = rib.update(&LOCAL, peer(2, 65002), &withdraw);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].1.as_ref().unwrap().from, peer(3, 65003));
        let c = rib.peer_down(&peer(3, 65003));
        assert_eq!(c, vec![(net(p), None)]);
        assert!(rib.best(&net(p)).is_none());
        assert!(rib.peer_down(&peer(3, 65003)).is_empty());
    }

    /// An UPDATE that withdraws a prefix and announces it again says one
    /// change, the last; the per-peer count follows routes, not UPDATEs.
    #[test]
    fn a_prefix_withdrawn_and_announced_in_one_update_is_one_change() {
        let p = "10.244.3.0/24";
        let mut rib = Rib::default();
        let mut u = announce(p, vec![65002], |_| {});
        rib.update(&LOCAL, peer(2, 65002), &u);
        assert_eq!(rib.received(peer(2, 65002).addr), 1);
        u.withdrawn = vec![p.parse().unwrap()];
        u.attrs.med = Some(9);
        let c = rib.update(&LOCAL, peer(2, 65002), &u);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].1.as_ref().unwrap().attrs.med, Some(9));
        assert_eq!(rib.received(peer(2, 65002).addr), 1);
        // The same route again changes nothing.
        assert!(rib
            .update(
                &LOCAL,
                peer(2, 65002),
                &announce(p, vec![65002], |a| a.med = Some(9))
            )
            .is_empty());
        rib.update(
            &LOCAL,
            peer(2, 65002),
            &Update {
                withdrawn: vec![p.parse().unwrap()],
                ..Default::default()
            },
        );
        assert_eq!(rib.received(peer(2, 65002).addr), 0);
        assert!(rib.best_routes().next().is_none());
    }

    #[test]
    fn ipv6_routes_come_and_go_in_mp_reach_and_mp_unreach() {
        let p = net("fd00:244:1::/64");
        let hop: IpAddr = "fd00::2".parse().unwrap();
        let reach = Update {
            attrs: PathAttrs {
                origin: Some(Origin::Igp),
                as_path: vec![AsSegment::Sequence(vec![65002])],
                mp_reach: Some(MpReach {
                    afi: Afi::Ipv6,
                    safi: Safi::Unicast,
                    next_hops: vec![hop],
                    nlri: vec![p],
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut rib = Rib::default();
        let c = rib.update(&LOCAL, peer(2, 65002), &reach);
        assert_eq!(c[0].1.as_ref().unwrap().next_hop, hop);
        let unreach = Update {
            attrs: PathAttrs {
                mp_unreach: Some(MpUnreach {
                    afi: Afi::Ipv6,
                    safi: Safi::Unicast,
                    withdrawn: vec![p],
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            rib.update(&LOCAL, peer(2, 65002), &unreach),
            vec![(p, None)]
        );
    }

    /// Graceful restart, receiving side: a peer that went away without a
    /// goodbye keeps its routes; back, what it announces again stays and
    /// what it does not goes at its End-of-RIB; a peer whose restart time
    /// ran out loses everything.
    #[test]
    fn a_restarting_peer_keeps_its_routes_until_its_end_of_rib() {
        let (kept, dropped) = ("10.244.4.0/24", "10.244.5.0/24");
        let mut rib = Rib::default();
        let from = peer(2, 64512);
        rib.update(&LOCAL, from, &announce(kept, vec![], |_| {}));
        rib.update(&LOCAL, from, &announce(dropped, vec![], |_| {}));
        rib.peer_restarting(&from);
        assert!(rib.restarting(from.addr));
        assert!(rib.best(&net(kept)).is_some() && rib.best(&net(dropped)).is_some());
        // Back under a new identifier: its announcement replaces the stale
        // route (one route per peer address), with no best-route change.
        let back = PeerId {
            router_id: Ipv4Addr::new(10, 9, 9, 9),
            ..from
        };
        let c = rib.update(&LOCAL, back, &announce(kept, vec![], |_| {}));
        assert_eq!(c.len(), 1, "the route's peer changed: {c:?}");
        assert!(rib.end_of_rib(&back, true).is_empty(), "no IPv6 was stale");
        let c = rib.end_of_rib(&back, false);
        assert_eq!(c, vec![(net(dropped), None)]);
        assert!(!rib.restarting(from.addr));
        assert_eq!(rib.best(&net(kept)).unwrap().from, back);
        assert_eq!(rib.received(from.addr), 1);
        // A restart that never comes back.
        rib.peer_restarting(&back);
        assert_eq!(rib.peer_down(&back), vec![(net(kept), None)]);
        assert!(!rib.restarting(from.addr));
        assert_eq!(rib.received(from.addr), 0);
    }

    /// A route that comes back (our AS in its path, our ID as its
    /// originator, our cluster in its list) is not used, and replaces what
    /// that peer said of the prefix before, as a withdrawal would.
    #[test]
    fn a_route_that_loops_back_is_dropped() {
        let p = "10.244.3.0/24";
        let ours = LOCAL.router_id;
        type Tweak = Box<dyn Fn(&mut PathAttrs)>;
        let looping: Vec<Tweak> = vec![
            Box::new(|a| a.as_path = vec![AsSegment::Sequence(vec![65002, 64512])]),
            Box::new(move |a| a.originator_id = Some(ours)),
            Box::new(move |a| a.cluster_list = vec![Ipv4Addr::new(1, 1, 1, 1), ours]),
        ];
        for tweak in looping {
            let mut rib = Rib::default();
            rib.update(&LOCAL, peer(2, 65002), &announce(p, vec![65002], |_| {}));
            let c = rib.update(
                &LOCAL,
                peer(2, 65002),
                &announce(p, vec![65002], |a| tweak(a)),
            );
            assert_eq!(c, vec![(net(p), None)]);
        }
    }
}
