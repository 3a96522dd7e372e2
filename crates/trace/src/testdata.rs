//! Shared test data: a conntrack entry of a pod's connection to a
//! Service port, DNATed to an endpoint on another node.

use std::net::IpAddr;

use podnet_kernel::conntrack::{Entry, Tuple};

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// 10.244.1.2:40000 -> 10.96.0.20:80, answered by 10.244.2.7:8080, with
/// the `IPS_*` bits `status`.
pub fn entry(status: u32) -> Entry {
    Entry {
        proto: 6,
        orig: Tuple {
            src: ip("10.244.1.2"),
            dst: ip("10.96.0.20"),
            sport: 40000,
            dport: 80,
            icmp: None,
        },
        reply: Tuple {
            src: ip("10.244.2.7"),
            dst: ip("10.244.1.2"),
            sport: 8080,
            dport: 40000,
            icmp: None,
        },
        status,
        zone: 0,
        mark: 0,
        timeout: 120,
        id: None,
        tcp_state: None,
    }
}
