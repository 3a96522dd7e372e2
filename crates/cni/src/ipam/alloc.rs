//! The pure allocator: which address comes next in a range set, round-robin
//! from the last one handed out, skipping gateways and taken addresses. It is
//! the reference host-local's order, so a switch between the two keeps
//! handing out addresses in the same sequence.

use std::net::IpAddr;

use ipnet::IpNet;

use super::config::{Range, RangeSet};

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

fn from_u128(v: u128, v4: bool) -> IpAddr {
    if v4 {
        IpAddr::V4((v as u32).into())
    } else {
        IpAddr::V6(v.into())
    }
}

/// `ip + delta`, wrapping within the family.
pub fn add(ip: IpAddr, delta: i64) -> IpAddr {
    let v4 = ip.is_ipv4();
    let n = to_u128(ip);
    let r = if delta >= 0 {
        n.wrapping_add(delta as u128)
    } else {
        n.wrapping_sub(delta.unsigned_abs() as u128)
    };
    from_u128(r, v4)
}

/// The last address in a network.
pub fn last_addr(n: &IpNet) -> IpAddr {
    n.broadcast()
}

/// Picks the next free address after `last` (or from the start). Returns the
/// address and the index of its range, or `None` when the set is exhausted.
pub fn next_free(
    set: &RangeSet,
    last: Option<IpAddr>,
    taken: impl Fn(IpAddr) -> bool,
) -> Option<(IpAddr, usize)> {
    if set.is_empty() {
        return None;
    }
    // Where to begin: just after `last` if it lies in the set.
    let (mut ri, mut cur) =
        match last.and_then(|l| set.iter().position(|r| r.contains(l)).map(|i| (i, l))) {
            Some((i, l)) => advance(set, i, l),
            None => (0, set[0].start),
        };
    let (start_ri, start) = (ri, cur);
    loop {
        let r: &Range = &set[ri];
        if Some(cur) != r.gateway && !taken(cur) {
            return Some((cur, ri));
        }
        (ri, cur) = advance(set, ri, cur);
        if ri == start_ri && cur == start {
            return None;
        }
    }
}

fn advance(set: &RangeSet, ri: usize, ip: IpAddr) -> (usize, IpAddr) {
    if ip >= set[ri].end {
        let n = (ri + 1) % set.len();
        (n, set[n].start)
    } else {
        (ri, add(ip, 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::config::IpamConf;
    use serde_json::json;
    use std::collections::HashSet;

    fn set(v: serde_json::Value) -> RangeSet {
        IpamConf::from_raw(serde_json::from_value(v).unwrap(), "n")
            .unwrap()
            .range_sets
            .remove(0)
    }

    #[test]
    fn round_robin_skips_gateway_and_taken() {
        let s = set(json!({"subnet": "10.0.0.0/29"}));
        // .1 is the gateway, so the first is .2
        let (ip, _) = next_free(&s, None, |_| false).unwrap();
        assert_eq!(ip.to_string(), "10.0.0.2");
        let (ip, _) = next_free(&s, Some("10.0.0.2".parse().unwrap()), |_| false).unwrap();
        assert_eq!(ip.to_string(), "10.0.0.3");
        // wraps after the end (.6) back to the start
        let (ip, _) = next_free(&s, Some("10.0.0.6".parse().unwrap()), |_| false).unwrap();
        assert_eq!(ip.to_string(), "10.0.0.2");
        let taken: HashSet<IpAddr> = ["10.0.0.3", "10.0.0.4"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let (ip, _) = next_free(&s, Some("10.0.0.2".parse().unwrap()), |i| {
            taken.contains(&i)
        })
        .unwrap();
        assert_eq!(ip.to_string(), "10.0.0.5");
    }

    #[test]
    fn exhaustion_returns_none() {
        let s = set(json!({"subnet": "10.0.0.0/30"}));
        // /30: .1 gateway, .2 only usable
        assert_eq!(
            next_free(&s, None, |_| false).unwrap().0.to_string(),
            "10.0.0.2"
        );
        assert!(next_free(&s, None, |i| i.to_string() == "10.0.0.2").is_none());
    }

    #[test]
    fn multiple_ranges_in_a_set() {
        let s = set(json!({"ranges": [[
            {"subnet": "10.0.0.0/30"},
            {"subnet": "10.0.1.0/30"}
        ]]}));
        let (ip, ri) = next_free(&s, Some("10.0.0.2".parse().unwrap()), |_| false).unwrap();
        assert_eq!((ip.to_string().as_str(), ri), ("10.0.1.2", 1));
    }

    #[test]
    fn v6_and_arithmetic() {
        assert_eq!(
            add("10.0.0.255".parse().unwrap(), 1).to_string(),
            "10.0.1.0"
        );
        assert_eq!(add("fd00::1".parse().unwrap(), -1).to_string(), "fd00::");
        let s = set(
            json!({"ranges": [[{"subnet": "fd00::/64", "rangeStart": "fd00::10", "rangeEnd": "fd00::12"}]]}),
        );
        let (ip, _) = next_free(&s, Some("fd00::12".parse().unwrap()), |_| false).unwrap();
        assert_eq!(ip.to_string(), "fd00::10");
    }
}
