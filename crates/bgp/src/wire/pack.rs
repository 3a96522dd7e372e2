//! Routes into UPDATE messages that fit [`MAX_LEN`]: a node announces its
//! whole table at session start, thousands of prefixes with the same
//! attributes, and a message holds only so many. Each message carries
//! the attributes once and as many prefixes as fit after them.

use ipnet::IpNet;

use super::update::{afi_of, prefix_size};
use super::{Afi, Codec, Message, MpReach, PathAttrs, Safi, Update, MAX_LEN};

/// UPDATEs announcing `prefixes` of family `afi` with `attrs`, each at
/// most [`MAX_LEN`] bytes once encoded with `codec`, the prefixes in
/// order. Prefixes of the other family are left out.
///
/// IPv4 routes go in the NLRI field with `attrs.next_hop`; any
/// multiprotocol attribute in `attrs` is dropped. IPv6 routes go in an
/// MP_REACH_NLRI whose next hops are those of `attrs.mp_reach` (give it
/// with the global next hop, the link-local one second if the peer shares
/// the link, and no NLRI: its prefixes are ignored); `attrs.next_hop` and
/// any MP_UNREACH_NLRI are dropped.
///
/// If the attributes leave no room for even one prefix, or cannot be
/// encoded, each message gets one prefix and encoding it says why.
pub fn pack(codec: &Codec, attrs: &PathAttrs, afi: Afi, prefixes: &[IpNet]) -> Vec<Update> {
    let mut base = Update {
        attrs: attrs.clone(),
        ..Update::default()
    };
    base.attrs.mp_unreach = None;
    if afi == Afi::Ipv6 {
        base.attrs.next_hop = None;
    }
    base.attrs.mp_reach = (afi == Afi::Ipv6).then(|| MpReach {
        afi,
        safi: Safi::Unicast,
        next_hops: attrs
            .mp_reach
            .as_ref()
            .map(|m| m.next_hops.clone())
            .unwrap_or_default(),
        nlri: Vec::new(),
    });
    split(codec, &base, afi, prefixes)
        .into_iter()
        .map(|chunk| {
            let mut u = base.clone();
            match &mut u.attrs.mp_reach {
                Some(m) => m.nlri = chunk,
                None => u.nlri = v4_only(chunk),
            }
            u
        })
        .collect()
}

/// UPDATEs withdrawing `prefixes` of family `afi`, each at most
/// [`MAX_LEN`] bytes: IPv4 ones in the Withdrawn Routes field, IPv6 ones
/// in MP_UNREACH_NLRI, with no other attribute. Prefixes of the other
/// family are left out.
pub fn pack_withdrawals(codec: &Codec, afi: Afi, prefixes: &[IpNet]) -> Vec<Update> {
    let base = match afi {
        Afi::Ipv4 => Update::default(),
        Afi::Ipv6 => Update::end_of_rib(afi),
    };
    split(codec, &base, afi, prefixes)
        .into_iter()
        .map(|chunk| {
            let mut u = base.clone();
            match &mut u.attrs.mp_unreach {
                Some(m) => m.withdrawn = chunk,
                None => u.withdrawn = v4_only(chunk),
            }
            u
        })
        .collect()
}

fn v4_only(nets: Vec<IpNet>) -> Vec<ipnet::Ipv4Net> {
    nets.into_iter()
        .filter_map(|n| match n {
            IpNet::V4(n) => Some(n),
            IpNet::V6(_) => None,
        })
        .collect()
}

/// The prefixes of `afi` in runs that fit after `base` (an UPDATE with
/// the attributes and no prefix). One byte is kept back for the length
/// field of a multiprotocol attribute that grows past 255 bytes.
fn split(codec: &Codec, base: &Update, afi: Afi, prefixes: &[IpNet]) -> Vec<Vec<IpNet>> {
    let mut scratch = Vec::new();
    let fixed = match codec.encode(&Message::Update(base.clone()), &mut scratch) {
        Ok(()) => scratch.len(),
        Err(_) => MAX_LEN,
    };
    let room = MAX_LEN.saturating_sub(fixed + 1);
    let mut runs: Vec<Vec<IpNet>> = Vec::new();
    let mut used = room;
    for p in prefixes.iter().filter(|p| afi_of(p) == afi) {
        let size = prefix_size(p);
        match runs.last_mut() {
            Some(run) if used + size <= room => run.push(*p),
            _ => {
                runs.push(vec![*p]);
                used = 0;
            }
        }
        used += size;
    }
    runs
}
