//! `podnet.io/v1 IPAddressPool`: where LoadBalancer Services' addresses
//! come from on bare metal (MetalLB's kind and field names, so a MetalLB
//! pool's spec pastes in), and the address ranges its `spec.addresses`
//! holds.
//!
//! Each entry of `spec.addresses` is a CIDR (`192.0.2.0/28`, all of its
//! addresses, network and broadcast included, as MetalLB hands them out)
//! or an inclusive range `first-last` of one family. Parsing, containment
//! and overlap live here, beside the type, because validation (one pool's
//! entries), admission (against the other pools) and the allocator
//! (`podnet_lb::ipam`) all need the same reading of them.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

use crate::FieldError;

/// The kind's name, as manifests and the CRD spell it.
pub const KIND: &str = "IPAddressPool";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct IPAddressPool {
    #[serde(rename = "apiVersion", default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: IPAddressPoolSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressPoolSpec {
    /// CIDRs or `first-last` ranges, each of one family.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// Whether Services that name neither an address nor a pool may get
    /// one from this pool (default true); a pool without it serves only
    /// Services that ask for it or for one of its addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_assign: Option<bool>,
    /// Skip addresses ending in `.0` and `.255` (IPv4), which some old
    /// routers and clients take for network or broadcast addresses.
    #[serde(
        rename = "avoidBuggyIPs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub avoid_buggy_ips: Option<bool>,
    /// The Services (by their labels) the pool serves; absent or empty:
    /// every Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_selector: Option<LabelSelector>,
    /// The namespaces (by their labels) whose Services the pool serves;
    /// absent or empty: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}

impl IPAddressPoolSpec {
    pub fn auto_assign(&self) -> bool {
        self.auto_assign.unwrap_or(true)
    }

    pub fn avoid_buggy_ips(&self) -> bool {
        self.avoid_buggy_ips.unwrap_or(false)
    }
}

impl IPAddressPool {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// Every entry of `spec.addresses`, parsed, or the errors of those that
    /// do not parse (each naming its index).
    pub fn ranges(&self) -> Result<Vec<AddressRange>, Vec<FieldError>> {
        let mut out = Vec::new();
        let mut errs = Vec::new();
        for (i, a) in self.spec.addresses.iter().enumerate() {
            match AddressRange::parse(a) {
                Ok(r) => out.push(r),
                Err(msg) => errs.push(FieldError {
                    field: format!("spec.addresses[{i}]"),
                    msg,
                }),
            }
        }
        if errs.is_empty() {
            Ok(out)
        } else {
            Err(errs)
        }
    }

    /// The pool's own rules: at least one entry, each parses, no two
    /// overlap, and the selectors are well-formed.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errs = self.validate_addresses();
        let selectors = [
            ("spec.serviceSelector", &self.spec.service_selector),
            ("spec.namespaceSelector", &self.spec.namespace_selector),
        ];
        for (path, sel) in selectors {
            if let Some(sel) = sel {
                crate::validate::selector(&mut errs, path, sel);
            }
        }
        errs
    }

    fn validate_addresses(&self) -> Vec<FieldError> {
        if self.spec.addresses.is_empty() {
            return vec![FieldError {
                field: "spec.addresses".into(),
                msg: "required: at least one CIDR or range".into(),
            }];
        }
        let ranges = match self.ranges() {
            Ok(r) => r,
            Err(e) => return e,
        };
        let mut errs = Vec::new();
        for (i, r) in ranges.iter().enumerate() {
            if let Some(j) = ranges[..i].iter().position(|o| o.overlaps(r)) {
                errs.push(FieldError {
                    field: format!("spec.addresses[{i}]"),
                    msg: format!(
                        "{} overlaps spec.addresses[{j}] {}",
                        self.spec.addresses[i], self.spec.addresses[j]
                    ),
                });
            }
        }
        errs
    }

    /// Where this pool's entries overlap `other`'s (a different pool):
    /// "spec.addresses[1]: 192.0.2.0/28 overlaps pool other-pool". Entries
    /// that do not parse are left to [`IPAddressPool::validate`].
    pub fn overlaps_with(&self, other: &IPAddressPool) -> Vec<FieldError> {
        let theirs: Vec<AddressRange> = other
            .spec
            .addresses
            .iter()
            .filter_map(|a| AddressRange::parse(a).ok())
            .collect();
        self.spec
            .addresses
            .iter()
            .enumerate()
            .filter_map(|(i, a)| {
                let r = AddressRange::parse(a).ok()?;
                theirs.iter().any(|t| t.overlaps(&r)).then(|| FieldError {
                    field: format!("spec.addresses[{i}]"),
                    msg: format!("{a} overlaps pool {}", other.name()),
                })
            })
            .collect()
    }
}

/// One entry of a pool: the addresses from `first` to `last`, inclusive,
/// both of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AddressRange {
    first: IpAddr,
    last: IpAddr,
}

/// An address as a number, for range arithmetic (IPv4 in the low bits).
pub fn ip_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The address of the same family as `like` with number `n`.
pub fn u128_to_ip(n: u128, like: IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4((n as u32).into()),
        IpAddr::V6(_) => IpAddr::V6(n.into()),
    }
}

impl AddressRange {
    /// Reads `192.0.2.0/28`, `2001:db8::/120` or `192.0.2.10-192.0.2.20`
    /// (spaces around the dash allowed). A CIDR with host bits set means
    /// its network (`192.0.2.5/28` is `192.0.2.0/28`), as MetalLB reads it.
    pub fn parse(s: &str) -> Result<AddressRange, String> {
        let t = s.trim();
        if t.contains('/') {
            let n: IpNet = t
                .parse()
                .map_err(|_| format!("{s:?} is not a valid CIDR"))?;
            let n = n.trunc();
            return Ok(AddressRange {
                first: n.network(),
                last: n.broadcast(),
            });
        }
        let Some((a, b)) = t.split_once('-') else {
            return Err(format!(
                "{s:?} is neither a CIDR (192.0.2.0/28) nor a range (192.0.2.10-192.0.2.20)"
            ));
        };
        let ip = |x: &str| {
            x.trim()
                .parse::<IpAddr>()
                .map_err(|_| format!("{s:?}: {:?} is not a valid IP address", x.trim()))
        };
        let (first, last) = (ip(a)?, ip(b)?);
        if first.is_ipv4() != last.is_ipv4() {
            return Err(format!(
                "{s:?} mixes IPv4 and IPv6: a range is of one family"
            ));
        }
        if ip_to_u128(first) > ip_to_u128(last) {
            return Err(format!("{s:?}: the start {first} is after the end {last}"));
        }
        Ok(AddressRange { first, last })
    }

    pub fn first(&self) -> IpAddr {
        self.first
    }

    pub fn last(&self) -> IpAddr {
        self.last
    }

    pub fn is_ipv4(&self) -> bool {
        self.first.is_ipv4()
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.is_ipv4()
            && (ip_to_u128(self.first)..=ip_to_u128(self.last)).contains(&ip_to_u128(ip))
    }

    pub fn overlaps(&self, o: &AddressRange) -> bool {
        self.is_ipv4() == o.is_ipv4()
            && ip_to_u128(self.first) <= ip_to_u128(o.last)
            && ip_to_u128(o.first) <= ip_to_u128(self.last)
    }
}

impl fmt::Display for AddressRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pool(name: &str, addresses: serde_json::Value) -> IPAddressPool {
        serde_json::from_value(json!({"apiVersion": "podnet.io/v1", "kind": KIND,
            "metadata": {"name": name}, "spec": {"addresses": addresses}}))
        .unwrap()
    }

    fn errs(p: &IPAddressPool) -> Vec<String> {
        p.validate().iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn cidrs_and_ranges_parse() {
        let r = AddressRange::parse("192.0.2.0/28").unwrap();
        assert_eq!(
            (r.first().to_string(), r.last().to_string()),
            ("192.0.2.0".into(), "192.0.2.15".into())
        );
        let r = AddressRange::parse("192.0.2.5/28").unwrap();
        assert_eq!(r.first().to_string(), "192.0.2.0", "host bits dropped");
        let r = AddressRange::parse("2001:db8::/120").unwrap();
        assert_eq!(r.last().to_string(), "2001:db8::ff");
        let r = AddressRange::parse(" 192.0.2.10 - 192.0.2.20 ").unwrap();
        assert!(r.contains("192.0.2.10".parse().unwrap()));
        assert!(r.contains("192.0.2.20".parse().unwrap()));
        assert!(!r.contains("192.0.2.21".parse().unwrap()));
        assert!(!r.contains("::ffff:192.0.2.10".parse().unwrap()));
        let one = AddressRange::parse("192.0.2.7-192.0.2.7").unwrap();
        assert_eq!(one.first(), one.last());
    }

    #[test]
    fn bad_entries_are_named() {
        for (s, want) in [
            ("192.0.2.0/33", "is not a valid CIDR"),
            ("banana", "is neither a CIDR"),
            (
                "192.0.2.9-192.0.2.1",
                "the start 192.0.2.9 is after the end 192.0.2.1",
            ),
            ("192.0.2.1-2001:db8::1", "mixes IPv4 and IPv6"),
            ("192.0.2.1-x", "\"x\" is not a valid IP address"),
        ] {
            let e = AddressRange::parse(s).unwrap_err();
            assert!(e.contains(want), "{s}: {e}");
        }
        let p = pool("p", json!(["192.0.2.0/28", "nope"]));
        let e = errs(&p);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].starts_with("spec.addresses[1]: \"nope\""), "{e:?}");
        assert_eq!(
            errs(&pool("p", json!([]))),
            ["spec.addresses: required: at least one CIDR or range"]
        );
        let mut p = pool("p", json!(["192.0.2.0/28"]));
        p.spec.namespace_selector = Some(
            serde_json::from_value(
                json!({"matchExpressions": [{"key": "team", "operator": "In"}]}),
            )
            .unwrap(),
        );
        assert_eq!(
            errs(&p),
            ["spec.namespaceSelector.matchExpressions[0].values: must be non-empty for In and NotIn"]
        );
    }

    #[test]
    fn overlaps_within_a_pool_and_across_pools() {
        let p = pool(
            "p",
            json!(["192.0.2.0/28", "2001:db8::/120", "192.0.2.15-192.0.2.20"]),
        );
        assert_eq!(
            errs(&p),
            ["spec.addresses[2]: 192.0.2.15-192.0.2.20 overlaps spec.addresses[0] 192.0.2.0/28"]
        );
        // Families never overlap; touching ranges do not either.
        assert!(errs(&pool(
            "p",
            json!(["192.0.2.0/28", "192.0.2.16-192.0.2.20", "::/0"])
        ))
        .is_empty());
        let a = pool("a", json!(["198.51.100.0/24", "192.0.2.0/28"]));
        let other = pool("other-pool", json!(["192.0.2.8-192.0.2.9"]));
        let e: Vec<String> = a
            .overlaps_with(&other)
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(
            e,
            ["spec.addresses[1]: 192.0.2.0/28 overlaps pool other-pool"]
        );
        assert!(other
            .overlaps_with(&pool("b", json!(["192.0.2.10/31"])))
            .is_empty());
    }

    #[test]
    fn defaults_and_field_names() {
        let p: IPAddressPool = serde_json::from_value(json!({"metadata": {"name": "p"},
            "spec": {"addresses": ["192.0.2.0/28"], "avoidBuggyIPs": true,
                     "serviceSelector": {"matchLabels": {"a": "b"}}}}))
        .unwrap();
        assert!(p.spec.auto_assign());
        assert!(p.spec.avoid_buggy_ips());
        let v = serde_json::to_value(&p.spec).unwrap();
        assert_eq!(
            v,
            json!({"addresses": ["192.0.2.0/28"], "avoidBuggyIPs": true,
            "serviceSelector": {"matchLabels": {"a": "b"}}})
        );
    }
}
