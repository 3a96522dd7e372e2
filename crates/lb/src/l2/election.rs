//! Which node announces each LoadBalancer IP: rendezvous (highest random
//! weight) hashing, pure and the same on every node.
//!
//! Every eligible node gets a score for the IP, a hash of the node's name
//! and the address; the lowest score owns the IP, and the rest, in score
//! order, are the order of takeover. No node talks to another to decide:
//! nodes that see the same eligible set agree, and when a node leaves only
//! the IPs it owned move (each to its runner-up), while a node that joins
//! takes only the IPs it now scores best for. MetalLB's L2 mode elects the
//! same way (its hash is SHA-256; ours is below).
//!
//! The hash is FNV-1a (64 bit) over the node name, a NUL separator, the
//! address family and the address bytes, then MurmurHash3's 64-bit
//! finaliser to spread FNV's weak low bits. Both are fixed by their
//! definitions, so nodes built from different versions of podnet (or of
//! Rust: std's `DefaultHasher` is not stable across releases) still agree;
//! a golden test pins the values. It is not a defence against anyone
//! choosing node names to win IPs, which no one in a cluster needs to do.
//!
//! The eligible set is the caller's: the nodes it believes alive and, for
//! a Service with `externalTrafficPolicy: Local`, only those among them
//! with a ready local endpoint for that Service (so traffic is never
//! announced to a node that would have to drop it or forward it away,
//! losing the client's source address). Hence [`owned_by`] takes one
//! eligible set per IP.

use std::collections::BTreeSet;
use std::net::IpAddr;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The score of `node` for `ip`; the lowest score wins the IP. Stable
/// across builds and versions: changing it would make nodes of different
/// versions disagree during an upgrade.
pub fn score(node: &str, ip: IpAddr) -> u64 {
    let mut h = FNV_OFFSET;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(FNV_PRIME);
        }
    };
    eat(node.as_bytes());
    eat(&[0]);
    match ip {
        IpAddr::V4(a) => {
            eat(&[4]);
            eat(&a.octets());
        }
        IpAddr::V6(a) => {
            eat(&[6]);
            eat(&a.octets());
        }
    }
    fmix64(h)
}

/// MurmurHash3's 64-bit finaliser: every input bit affects every output
/// bit.
fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// The eligible nodes in takeover order for `ip`: the owner first, then
/// whoever would own it if those before left. Duplicates count once; a
/// tie of scores (not expected in practice) goes to the smaller name.
pub fn ranking<'n, S>(ip: IpAddr, eligible: impl IntoIterator<Item = &'n S>) -> Vec<&'n str>
where
    S: AsRef<str> + ?Sized + 'n,
{
    let mut ranked: Vec<(u64, &str)> = eligible
        .into_iter()
        .map(|n| (score(n.as_ref(), ip), n.as_ref()))
        .collect();
    ranked.sort_unstable();
    ranked.dedup();
    ranked.into_iter().map(|(_, n)| n).collect()
}

/// The node that announces `ip` among `eligible`; `None` when no node is
/// eligible (then nobody answers for the IP, which is right: under
/// `externalTrafficPolicy: Local` with no ready endpoint, traffic would be
/// dropped anyway).
pub fn owner<'n, S>(ip: IpAddr, eligible: impl IntoIterator<Item = &'n S>) -> Option<&'n str>
where
    S: AsRef<str> + ?Sized + 'n,
{
    eligible
        .into_iter()
        .map(|n| (score(n.as_ref(), ip), n.as_ref()))
        .min()
        .map(|(_, n)| n)
}

/// The IPs node `me` announces: those it owns among their eligible sets,
/// one set per IP (the same set for every IP under `Cluster` traffic
/// policy, the nodes with a ready local endpoint under `Local`). What
/// [`crate::l2::Responder::set_owned`] is fed.
pub fn owned_by<'n, E, S>(me: &str, ips: impl IntoIterator<Item = (IpAddr, E)>) -> BTreeSet<IpAddr>
where
    E: IntoIterator<Item = &'n S>,
    S: AsRef<str> + ?Sized + 'n,
{
    ips.into_iter()
        .filter_map(|(ip, eligible)| (owner(ip, eligible) == Some(me)).then_some(ip))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn v4(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0xc633_6400 + n)) // 198.51.100.0 + n
    }

    fn nodes(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("node-{i}")).collect()
    }

    fn owners(ips: &[IpAddr], eligible: &[String]) -> BTreeMap<IpAddr, String> {
        ips.iter()
            .map(|ip| (*ip, owner(*ip, eligible).unwrap().to_string()))
            .collect()
    }

    #[test]
    fn scores_are_pinned_so_every_version_agrees() {
        // Computed apart from this code (a Python rendering of the
        // definition above); if these change, nodes of the old and new
        // versions would elect different owners.
        let ip4 = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 200));
        let ip6 = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x200));
        assert_eq!(score("", ip4), GOLDEN[0]);
        assert_eq!(score("node-a", ip4), GOLDEN[1]);
        assert_eq!(score("node-a", ip6), GOLDEN[2]);
        assert_eq!(score("node-b", ip4), GOLDEN[3]);
        // The family is part of the input: ::c633:64c8 is not 198.51.100.200.
        let mapped = IpAddr::V6(Ipv6Addr::from(0xc633_64c8u128));
        assert_ne!(score("node-a", mapped), score("node-a", ip4));
    }
    const GOLDEN: [u64; 4] = [
        0x1b2e_29ba_b38b_c871,
        0xaed7_459b_da62_f4f6,
        0x41f9_b7c7_3369_33b7,
        0x3b68_e04f_1cb1_20f1,
    ];

    #[test]
    fn the_owner_does_not_depend_on_the_order_of_the_eligible_set() {
        let mut all = nodes(5);
        let ips: Vec<IpAddr> = (0..200).map(v4).collect();
        let first = owners(&ips, &all);
        all.reverse();
        assert_eq!(owners(&ips, &all), first);
        all.rotate_left(2);
        all.push("node-3".into()); // a duplicate changes nothing
        assert_eq!(owners(&ips, &all), first);
        for ip in &ips {
            assert_eq!(ranking(*ip, &all)[0], first[ip]);
            assert_eq!(ranking(*ip, &all).len(), 5);
        }
        assert_eq!(owner::<String>(v4(1), &[]), None);
    }

    #[test]
    fn when_a_node_leaves_only_its_ips_move_each_to_its_runner_up() {
        let all = nodes(5);
        let ips: Vec<IpAddr> = (0..1000)
            .map(v4)
            .chain((0..1000u16).map(|i| IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, i))))
            .collect();
        let before = owners(&ips, &all);
        let leaving = "node-2";
        let rest: Vec<String> = all.iter().filter(|n| *n != leaving).cloned().collect();
        let after = owners(&ips, &rest);
        let mut moved = 0;
        for ip in &ips {
            if before[ip] == leaving {
                moved += 1;
                assert_eq!(
                    after[ip],
                    ranking(*ip, &all)[1],
                    "{ip} goes to its runner-up"
                );
            } else {
                assert_eq!(after[ip], before[ip], "{ip} was not the leaver's: it stays");
            }
        }
        assert!(moved > 0);
        // And back: when it returns, it takes exactly its IPs again.
        assert_eq!(owners(&ips, &all), before);
    }

    #[test]
    fn ips_spread_over_the_nodes() {
        let all = nodes(4);
        let ips: Vec<IpAddr> = (0..4000).map(v4).collect();
        let mut count: BTreeMap<String, usize> = BTreeMap::new();
        for o in owners(&ips, &all).into_values() {
            *count.entry(o).or_default() += 1;
        }
        assert_eq!(count.len(), 4);
        for (node, n) in count {
            assert!((800..1200).contains(&n), "{node} owns {n} of 4000 IPs");
        }
    }

    #[test]
    fn owned_by_takes_one_eligible_set_per_ip_for_local_traffic_policy() {
        let all = nodes(3);
        let a = v4(10);
        let b = v4(11);
        let a_owner = owner(a, &all).unwrap().to_string();
        // Under Local, b has a ready endpoint on a_owner's node only.
        let b_eligible = [a_owner.clone()];
        let mine = owned_by(&a_owner, [(a, &all[..]), (b, &b_eligible[..])]);
        assert_eq!(mine, BTreeSet::from([a, b]));
        for other in all.iter().filter(|n| **n != a_owner) {
            assert_eq!(
                owned_by(other, [(a, &all[..]), (b, &b_eligible[..])]),
                BTreeSet::new()
            );
        }
        // No eligible node: nobody announces it.
        let none: [&str; 0] = [];
        assert_eq!(owned_by(&a_owner, [(b, &none[..])]), BTreeSet::new());
    }
}
