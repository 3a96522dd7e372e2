//! LoadBalancer address reservations, safe across processes, like
//! ClusterIPs' ([`crate::alloc`]): every address a Service's
//! `status.loadBalancer.ingress` shows has a key of its own,
//! `/registry/allocations/lbips/<ip>`, written in the same transaction as
//! that status. Two controllers can then never give one address to two
//! Services: the second `Create` of a key fails and that controller
//! decides again.
//!
//! The value names the holders, `ns/name` like a ClusterIP's; an address
//! shared under MetalLB's rule (`podnet.io/allow-shared-ip`) lists every
//! holder and the sharing key: `ns/a,ns/b;shared=<key>`. Joining or
//! leaving a shared address rewrites the value conditionally on its
//! revision, so concurrent changes to one address are serialized too.

use std::collections::BTreeSet;
use std::net::IpAddr;

use podnet_api::k8s_openapi::api::core::v1::Service;

/// Where the reservations live (under [`crate::alloc::ALLOC_PREFIX`], so
/// the controller's full sync sees them with the others).
pub const LB_PREFIX: &str = "/registry/allocations/lbips/";

const SHARED: &str = ";shared=";

pub fn key(ip: IpAddr) -> String {
    format!("{LB_PREFIX}{ip}")
}

/// The address a reservation key is for.
pub fn ip_of(key: &str) -> Option<IpAddr> {
    key.strip_prefix(LB_PREFIX)?.parse().ok()
}

/// Who holds a load-balancer address.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reservation {
    /// `namespace/name` of each holder.
    pub holders: BTreeSet<String>,
    /// The sharing key, for a shared address.
    pub sharing: Option<String>,
}

impl Reservation {
    pub fn new(holder: String, sharing: Option<String>) -> Reservation {
        Reservation {
            holders: BTreeSet::from([holder]),
            sharing,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut s = self.holders.iter().cloned().collect::<Vec<_>>().join(",");
        if let Some(k) = &self.sharing {
            s.push_str(SHARED);
            s.push_str(k);
        }
        s.into_bytes()
    }

    pub fn decode(b: &[u8]) -> Reservation {
        let s = String::from_utf8_lossy(b);
        let (holders, sharing) = match s.split_once(SHARED) {
            Some((h, k)) => (h.to_string(), Some(k.to_string())),
            None => (s.into_owned(), None),
        };
        Reservation {
            holders: holders
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(str::to_string)
                .collect(),
            sharing,
        }
    }
}

/// `namespace/name`, as reservations name a Service.
pub fn owner(svc: &Service) -> String {
    crate::alloc::owner(svc)
}

/// The reservation keys a Service's status shows, whatever its type: a
/// Service that stops being a LoadBalancer keeps its reservation until
/// the controller clears the status and releases it in one transaction.
pub fn keys_shown(svc: &Service) -> BTreeSet<String> {
    podnet_lb::ipam::status_ips(svc)
        .into_iter()
        .map(key)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let one = Reservation::new("shop/web".into(), None);
        assert_eq!(one.encode(), b"shop/web");
        assert_eq!(Reservation::decode(b"shop/web"), one);
        let mut shared = Reservation::new("shop/dns-tcp".into(), Some("dns;x=1".into()));
        shared.holders.insert("shop/dns-udp".into());
        assert_eq!(shared.encode(), b"shop/dns-tcp,shop/dns-udp;shared=dns;x=1");
        assert_eq!(Reservation::decode(&shared.encode()), shared);
        assert_eq!(
            key("192.0.2.1".parse().unwrap()),
            "/registry/allocations/lbips/192.0.2.1"
        );
        assert_eq!(
            ip_of("/registry/allocations/lbips/2001:db8::1"),
            "2001:db8::1".parse().ok()
        );
        assert_eq!(ip_of("/registry/allocations/clusterips/10.96.0.1"), None);
    }
}
