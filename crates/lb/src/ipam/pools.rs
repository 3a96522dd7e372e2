//! The address pools as the allocator reads them: each IPAddressPool's
//! entries parsed once, which Services and namespaces it serves, and the
//! lowest usable address of a family that the caller's test accepts.

use std::collections::BTreeMap;
use std::net::IpAddr;

use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use podnet_api::pool::{ip_to_u128, u128_to_ip, AddressRange, IPAddressPool};
use podnet_api::selector;

use super::Family;

/// One pool, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    pub name: String,
    pub ranges: Vec<AddressRange>,
    pub auto_assign: bool,
    pub avoid_buggy_ips: bool,
    service_selector: LabelSelector,
    namespace_selector: LabelSelector,
}

impl Pool {
    /// The pool, or why it cannot be used (an entry that does not parse:
    /// admission refuses those, but the store may hold an older one).
    pub fn new(p: &IPAddressPool) -> Result<Pool, String> {
        let ranges = p.ranges().map_err(|errs| {
            errs.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        })?;
        Ok(Pool {
            name: p.name().to_string(),
            ranges,
            auto_assign: p.spec.auto_assign(),
            avoid_buggy_ips: p.spec.avoid_buggy_ips(),
            service_selector: p.spec.service_selector.clone().unwrap_or_default(),
            namespace_selector: p.spec.namespace_selector.clone().unwrap_or_default(),
        })
    }

    /// Whether the pool serves a Service with these labels in a namespace
    /// with these labels (an absent or empty selector matches all).
    pub fn serves(
        &self,
        service_labels: &BTreeMap<String, String>,
        namespace_labels: &BTreeMap<String, String>,
    ) -> bool {
        selector::matches(&self.service_selector, service_labels)
            && selector::matches(&self.namespace_selector, namespace_labels)
    }

    /// Whether the pool may hand out `ip`: inside one of its entries, and
    /// not a `.0` or `.255` when it avoids those.
    pub fn holds(&self, ip: IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(ip)) && !(self.avoid_buggy_ips && buggy(ip))
    }

    pub fn has_family(&self, f: Family) -> bool {
        self.ranges.iter().any(|r| Family::of(r.first()) == f)
    }

    /// The lowest address of family `f` the pool may hand out and `free`
    /// accepts. Each entry is walked from its start and only rejected
    /// addresses are stepped over, so the cost follows how many are taken,
    /// not the size of the entry (an IPv6 /64 costs no more than a /28).
    pub fn first(&self, f: Family, mut free: impl FnMut(IpAddr) -> bool) -> Option<IpAddr> {
        for r in self.ranges.iter().filter(|r| Family::of(r.first()) == f) {
            let (lo, hi) = (ip_to_u128(r.first()), ip_to_u128(r.last()));
            let mut n = lo;
            loop {
                let ip = u128_to_ip(n, r.first());
                if !(self.avoid_buggy_ips && buggy(ip)) && free(ip) {
                    return Some(ip);
                }
                if n == hi {
                    break;
                }
                n += 1;
            }
        }
        None
    }
}

/// An IPv4 address ending in .0 or .255, which some clients and routers
/// wrongly treat as a network or broadcast address.
fn buggy(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => matches!(a.octets()[3], 0 | 255),
        IpAddr::V6(_) => false,
    }
}

/// Every usable pool, ordered by name (the order automatic assignment
/// tries them in).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pools {
    pools: Vec<Pool>,
}

impl Pools {
    /// The pools that parse; the others are returned with the reason, for
    /// the caller to log (a pool that cannot be read serves nothing, and
    /// the addresses it held are taken back like any outside every pool).
    pub fn new<'a>(
        pools: impl IntoIterator<Item = &'a IPAddressPool>,
    ) -> (Pools, Vec<(String, String)>) {
        let mut ok = Vec::new();
        let mut bad = Vec::new();
        for p in pools {
            match Pool::new(p) {
                Ok(p) => ok.push(p),
                Err(e) => bad.push((p.name().to_string(), e)),
            }
        }
        ok.sort_by(|a, b| a.name.cmp(&b.name));
        (Pools { pools: ok }, bad)
    }

    pub fn get(&self, name: &str) -> Option<&Pool> {
        self.pools.iter().find(|p| p.name == name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Pool> {
        self.pools.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }

    /// Whether any pool may hand out `ip`.
    pub fn hold(&self, ip: IpAddr) -> bool {
        self.pools.iter().any(|p| p.holds(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::HashSet;

    fn pool(spec: serde_json::Value) -> IPAddressPool {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_lowest_free_address_first_skipping_what_is_taken() {
        let p = Pool::new(&pool(
            json!({"addresses": ["192.0.2.0/30", "192.0.2.8-192.0.2.9", "2001:db8::/64"]}),
        ))
        .unwrap();
        let mut taken = HashSet::new();
        let mut got = Vec::new();
        while let Some(a) = p.first(Family::V4, |a| !taken.contains(&a)) {
            taken.insert(a);
            got.push(a.to_string());
        }
        assert_eq!(
            got,
            [
                "192.0.2.0",
                "192.0.2.1",
                "192.0.2.2",
                "192.0.2.3",
                "192.0.2.8",
                "192.0.2.9"
            ],
            "CIDRs hand out every address, as MetalLB does"
        );
        assert_eq!(p.first(Family::V6, |_| true), Some(ip("2001:db8::")));
        // A /64 with a few taken: found at once.
        let v6: HashSet<IpAddr> = (0..100u128)
            .map(|i| u128_to_ip(ip_to_u128(ip("2001:db8::")) + i, ip("::")))
            .collect();
        assert_eq!(
            p.first(Family::V6, |a| !v6.contains(&a)),
            Some(ip("2001:db8::64"))
        );
        let v4only = Pool::new(&pool(json!({"addresses": ["192.0.2.0/30"]}))).unwrap();
        assert!(!v4only.has_family(Family::V6));
        assert_eq!(v4only.first(Family::V6, |_| true), None);
    }

    #[test]
    fn buggy_addresses_are_skipped_only_when_asked() {
        let spec = json!({"addresses": ["192.0.2.255-192.0.3.1"], "avoidBuggyIPs": true});
        let p = Pool::new(&pool(spec)).unwrap();
        assert_eq!(p.first(Family::V4, |_| true), Some(ip("192.0.3.1")));
        assert!(!p.holds(ip("192.0.3.0")) && !p.holds(ip("192.0.2.255")));
        assert!(p.holds(ip("192.0.3.1")));
        let p = Pool::new(&pool(json!({"addresses": ["192.0.2.255-192.0.3.1"]}))).unwrap();
        assert_eq!(p.first(Family::V4, |_| true), Some(ip("192.0.2.255")));
        // IPv6 has no such addresses.
        let spec = json!({"addresses": ["2001:db8::ff-2001:db8::100"], "avoidBuggyIPs": true});
        let p = Pool::new(&pool(spec)).unwrap();
        assert_eq!(p.first(Family::V6, |_| true), Some(ip("2001:db8::ff")));
    }

    #[test]
    fn selectors_empty_or_absent_serve_everything() {
        let l = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let all = Pool::new(&pool(
            json!({"addresses": ["192.0.2.0/30"], "serviceSelector": {}}),
        ))
        .unwrap();
        assert!(all.serves(&l(&[]), &l(&[])));
        let some = Pool::new(&pool(json!({"addresses": ["192.0.2.0/30"],
            "serviceSelector": {"matchLabels": {"tier": "edge"}},
            "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]}})))
        .unwrap();
        assert!(some.serves(&l(&[("tier", "edge")]), &l(&[("team", "b")])));
        assert!(!some.serves(&l(&[("tier", "edge")]), &l(&[("team", "c")])));
        assert!(!some.serves(&l(&[]), &l(&[("team", "a")])));
    }

    #[test]
    fn pools_are_ordered_by_name_and_bad_ones_reported() {
        let mut b = pool(json!({"addresses": ["192.0.2.0/30"]}));
        b.metadata.name = Some("b".into());
        let mut a = pool(json!({"addresses": ["198.51.100.0/30"]}));
        a.metadata.name = Some("a".into());
        let mut bad = pool(json!({"addresses": ["nope"]}));
        bad.metadata.name = Some("bad".into());
        let (pools, errs) = Pools::new([&b, &bad, &a]);
        let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].0, "bad");
        assert!(errs[0].1.starts_with("spec.addresses[0]"), "{errs:?}");
        assert!(pools.hold(ip("192.0.2.3")) && !pools.hold(ip("192.0.2.4")));
    }
}
