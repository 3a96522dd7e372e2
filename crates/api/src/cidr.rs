//! CIDR arithmetic for allocators: the n-th address of a range, how many a
//! range holds, and the inverse.

use std::net::IpAddr;

use ipnet::IpNet;

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

/// Number of addresses in the network, capped at `u64::MAX`.
pub fn size(n: &IpNet) -> u64 {
    let bits = n.max_prefix_len() - n.prefix_len();
    if bits >= 64 {
        u64::MAX
    } else {
        1u64 << bits
    }
}

/// The address at `offset` from the network address.
pub fn nth(n: &IpNet, offset: u64) -> Option<IpAddr> {
    if offset >= size(n) {
        return None;
    }
    let base = to_u128(n.network()) + offset as u128;
    Some(match n {
        IpNet::V4(_) => IpAddr::V4((base as u32).into()),
        IpNet::V6(_) => IpAddr::V6(base.into()),
    })
}

/// The offset of `ip` within `n`, if it is inside.
pub fn offset(n: &IpNet, ip: IpAddr) -> Option<u64> {
    if !n.contains(&ip) {
        return None;
    }
    Some((to_u128(ip) - to_u128(n.network())) as u64)
}

/// How many host addresses an allocator may hand out: all but the network
/// address (and, for IPv4, the broadcast address).
pub fn usable(n: &IpNet) -> (u64, u64) {
    let s = size(n);
    match n {
        IpNet::V4(_) if s > 2 => (1, s - 1),
        _ => (1, s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic() {
        let n: IpNet = "10.96.0.0/12".parse().unwrap();
        assert_eq!(size(&n), 1 << 20);
        assert_eq!(nth(&n, 10).unwrap().to_string(), "10.96.0.10");
        assert_eq!(offset(&n, "10.96.1.0".parse().unwrap()), Some(256));
        assert_eq!(offset(&n, "10.112.0.0".parse().unwrap()), None);
        assert_eq!(usable(&n), (1, (1 << 20) - 1));
        let v6: IpNet = "fd00::/112".parse().unwrap();
        assert_eq!(nth(&v6, 5).unwrap().to_string(), "fd00::5");
    }
}
