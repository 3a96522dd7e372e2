//! What a speaker sends each neighbour, and with which attributes
//! (RFC 4271 §5 and §9.1.3, route reflection per RFC 4456 §6), pure.
//!
//! - Its own routes (a node's pod CIDR, a Service address): to an iBGP
//!   neighbour with an empty AS_PATH and LOCAL_PREF 100, to an eBGP one
//!   with this speaker's AS; next hop itself.
//! - Routes learned over eBGP: to iBGP neighbours with next hop self (as
//!   Calico's nodes do, so nothing needs the external next hop).
//! - Nothing learned goes to an eBGP neighbour: a node is no transit. Its
//!   routers hear from each node what that node serves (its pod CIDR, its
//!   Service addresses), never another node's routes with this node as
//!   next hop: a Local Service's /32 must come only from nodes with an
//!   endpoint, and a router that learned every pod CIDR from every node
//!   would send half its traffic the long way.
//! - Routes learned over iBGP: never to another iBGP neighbour, unless this
//!   speaker reflects (a cluster ID is set) and the route came from a
//!   client or goes to one; a reflected route carries its ORIGINATOR_ID and
//!   this cluster prepended to its CLUSTER_LIST, its next hop unchanged.
//! - Never back to the neighbour it came from.
//!
//! On eBGP LOCAL_PREF, ORIGINATOR_ID and CLUSTER_LIST are removed and MED
//! is not passed on.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::rib::{Local, Route};
use crate::wire::{Afi, AsSegment, MpReach, Origin, PathAttrs, Safi};

/// A neighbour of a speaker: who it is for the export rules (its
/// address, AS, and whether it is a reflector client), and how its
/// session is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neighbour {
    pub addr: IpAddr,
    pub asn: u32,
    /// A route-reflector client of this speaker.
    pub client: bool,
    /// GTSM (RFC 5082, [`crate::gtsm`]): the neighbour is on the link, and
    /// a packet of the session that arrives with TTL below 255 is dropped
    /// (a pod or a host behind a router that forges the neighbour's
    /// address never reaches the session). The neighbour must send with
    /// 255 too: BIRD's `ttl security`, FRR's `ttl-security hops 1`.
    pub ttl_security: bool,
    /// BFD with the neighbour (when the speaker runs BFD): its Down drops
    /// the session at once (RFC 5882).
    pub bfd: bool,
}

impl Neighbour {
    /// A node of the mesh: on the link, not a reflector client, GTSM on,
    /// BFD when the speaker runs it.
    pub fn new(addr: IpAddr, asn: u32) -> Neighbour {
        Neighbour {
            addr,
            asn,
            client: false,
            ttl_security: true,
            bfd: true,
        }
    }
}

/// The addresses this speaker puts as next hop, per family.
#[derive(Debug, Clone, Copy)]
pub struct NextHops {
    pub v4: Ipv4Addr,
    pub v6: Option<Ipv6Addr>,
}

/// Where a route came from.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// This speaker's own.
    Local,
    Learned(&'a Route),
}

/// The attributes `to` is sent for a route of family `afi` from `src`;
/// None when `to` must not get it.
pub fn export(
    local: &Local,
    hops: &NextHops,
    to: &Neighbour,
    afi: Afi,
    src: Source<'_>,
) -> Option<PathAttrs> {
    let external = to.asn != local.asn;
    let mut attrs = match src {
        Source::Local => PathAttrs {
            origin: Some(Origin::Igp),
            ..Default::default()
        },
        Source::Learned(r) => {
            if r.from.addr == to.addr || external {
                return None;
            }
            if !external && !r.from.external {
                return reflect(local, to, r);
            }
            let mut a = (*r.attrs).clone();
            a.med = None;
            a
        }
    };
    if external {
        prepend(&mut attrs.as_path, local.asn);
        attrs.local_pref = None;
        attrs.originator_id = None;
        attrs.cluster_list.clear();
    } else {
        attrs.local_pref = Some(attrs.local_pref.unwrap_or(100));
    }
    next_hop_self(&mut attrs, hops, afi).then_some(attrs)
}

/// An iBGP-learned route towards an iBGP neighbour: only by reflection,
/// its next hop kept.
fn reflect(local: &Local, to: &Neighbour, r: &Route) -> Option<PathAttrs> {
    let cluster = local.cluster_id?;
    if !(to.client || r.from.client) {
        return None;
    }
    let mut a = (*r.attrs).clone();
    a.originator_id = Some(a.originator_id.unwrap_or(r.from.router_id));
    a.cluster_list.insert(0, cluster);
    match r.next_hop {
        IpAddr::V4(h) => a.next_hop = Some(h),
        IpAddr::V6(h) => {
            a.mp_reach = Some(MpReach {
                afi: Afi::Ipv6,
                safi: Safi::Unicast,
                next_hops: vec![IpAddr::V6(h)],
                nlri: vec![],
            })
        }
    }
    Some(a)
}

fn prepend(path: &mut Vec<AsSegment>, asn: u32) {
    match path.first_mut() {
        Some(AsSegment::Sequence(v)) if v.len() < 255 => v.insert(0, asn),
        _ => path.insert(0, AsSegment::Sequence(vec![asn])),
    }
}

/// Sets this speaker as the next hop; false when the family has no
/// address of ours.
fn next_hop_self(a: &mut PathAttrs, hops: &NextHops, afi: Afi) -> bool {
    match afi {
        Afi::Ipv4 => {
            a.next_hop = Some(hops.v4);
            a.mp_reach = None;
            true
        }
        Afi::Ipv6 => {
            let Some(v6) = hops.v6 else { return false };
            a.next_hop = None;
            a.mp_reach = Some(MpReach {
                afi: Afi::Ipv6,
                safi: Safi::Unicast,
                next_hops: vec![IpAddr::V6(v6)],
                nlri: vec![],
            });
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rib::PeerId;

    const LOCAL: Local = Local {
        asn: 64512,
        router_id: Ipv4Addr::new(10, 0, 0, 1),
        cluster_id: None,
    };
    const HOPS: NextHops = NextHops {
        v4: Ipv4Addr::new(10, 0, 0, 1),
        v6: None,
    };

    fn neighbour(last: u8, asn: u32, client: bool) -> Neighbour {
        Neighbour {
            addr: IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)),
            asn,
            client,
            ttl_security: false,
            bfd: false,
        }
    }

    fn learned(last: u8, asn: u32, client: bool, path: Vec<u32>) -> Route {
        Route {
            from: PeerId {
                addr: IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)),
                router_id: Ipv4Addr::new(10, 0, 0, last),
                asn,
                external: asn != LOCAL.asn,
                client,
            },
            attrs: std::sync::Arc::new(PathAttrs {
                origin: Some(Origin::Igp),
                as_path: match path.is_empty() {
                    true => vec![],
                    false => vec![AsSegment::Sequence(path)],
                },
                med: Some(7),
                local_pref: Some(150),
                ..Default::default()
            }),
            next_hop: IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)),
        }
    }

    #[test]
    fn our_own_routes_go_to_ibgp_plain_and_to_ebgp_with_our_as() {
        let i = export(
            &LOCAL,
            &HOPS,
            &neighbour(2, 64512, false),
            Afi::Ipv4,
            Source::Local,
        )
        .unwrap();
        assert!(i.as_path.is_empty());
        assert_eq!((i.local_pref, i.next_hop), (Some(100), Some(HOPS.v4)));
        let e = export(
            &LOCAL,
            &HOPS,
            &neighbour(9, 65009, false),
            Afi::Ipv4,
            Source::Local,
        )
        .unwrap();
        assert_eq!(e.as_path, vec![AsSegment::Sequence(vec![64512])]);
        assert_eq!(e.local_pref, None);
        // No IPv6 address of ours: no IPv6 route.
        assert!(export(
            &LOCAL,
            &HOPS,
            &neighbour(2, 64512, false),
            Afi::Ipv6,
            Source::Local
        )
        .is_none());
    }

    #[test]
    fn ibgp_routes_are_not_passed_between_ibgp_neighbours_without_reflection() {
        let r = learned(2, 64512, false, vec![]);
        let to = neighbour(3, 64512, false);
        assert!(export(&LOCAL, &HOPS, &to, Afi::Ipv4, Source::Learned(&r)).is_none());
        // ...nor back to where they came from, even on eBGP.
        let e = learned(9, 65009, false, vec![65009]);
        assert!(export(
            &LOCAL,
            &HOPS,
            &neighbour(9, 65009, false),
            Afi::Ipv4,
            Source::Learned(&e)
        )
        .is_none());
        // An eBGP route to iBGP: next hop self, its MED not passed on.
        let i = export(&LOCAL, &HOPS, &to, Afi::Ipv4, Source::Learned(&e)).unwrap();
        assert_eq!((i.next_hop, i.med), (Some(HOPS.v4), None));
        assert_eq!(i.as_path, vec![AsSegment::Sequence(vec![65009])]);
    }

    #[test]
    fn a_reflector_passes_client_routes_to_all_and_others_to_clients_only() {
        let rr = Local {
            cluster_id: Some(Ipv4Addr::new(10, 0, 0, 1)),
            ..LOCAL
        };
        let from_client = learned(2, 64512, true, vec![]);
        let from_other = learned(3, 64512, false, vec![]);
        let client = neighbour(4, 64512, true);
        let other = neighbour(5, 64512, false);
        let a = export(&rr, &HOPS, &other, Afi::Ipv4, Source::Learned(&from_client)).unwrap();
        assert_eq!(a.originator_id, Some(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(a.cluster_list, vec![Ipv4Addr::new(10, 0, 0, 1)]);
        assert_eq!(
            a.next_hop,
            Some(Ipv4Addr::new(10, 0, 0, 2)),
            "next hop kept"
        );
        assert_eq!(a.local_pref, Some(150), "iBGP attributes kept");
        assert!(export(&rr, &HOPS, &client, Afi::Ipv4, Source::Learned(&from_other)).is_some());
        assert!(export(&rr, &HOPS, &other, Afi::Ipv4, Source::Learned(&from_other)).is_none());
    }

    /// A node is no transit: what it learned, over iBGP (another node's
    /// pod CIDR, its Service /32) or over eBGP (a router's routes), never
    /// goes to an external neighbour; its own routes do, without iBGP's
    /// attributes.
    #[test]
    fn nothing_learned_goes_to_an_external_neighbour() {
        let router = neighbour(9, 65009, false);
        let mut r = learned(2, 64512, true, vec![]);
        let a = std::sync::Arc::make_mut(&mut r.attrs);
        a.originator_id = Some(Ipv4Addr::new(10, 0, 0, 2));
        a.cluster_list = vec![Ipv4Addr::new(10, 0, 0, 1)];
        assert!(export(&LOCAL, &HOPS, &router, Afi::Ipv4, Source::Learned(&r)).is_none());
        let from_router = learned(8, 65008, false, vec![65008]);
        let learned_ebgp = Source::Learned(&from_router);
        assert!(export(&LOCAL, &HOPS, &router, Afi::Ipv4, learned_ebgp).is_none());
        let e = export(&LOCAL, &HOPS, &router, Afi::Ipv4, Source::Local).unwrap();
        assert_eq!(e.local_pref, None);
        assert_eq!(e.originator_id, None);
        assert!(e.cluster_list.is_empty());
        assert_eq!(e.as_path, vec![AsSegment::Sequence(vec![64512])]);
    }
}
