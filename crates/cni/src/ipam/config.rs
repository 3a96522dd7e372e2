//! host-local's configuration: range sets, the legacy single-range keys, and
//! the reference plugin's defaults (start after the network address, end
//! before the IPv4 broadcast, gateway at the first address).

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;

use super::alloc::{add, last_addr};
use crate::error::CniError;
use crate::types::RouteConf;

#[derive(Debug, Clone, Deserialize, Default)]
pub struct RawRange {
    #[serde(default)]
    pub subnet: Option<String>,
    #[serde(rename = "rangeStart", default)]
    pub range_start: Option<IpAddr>,
    #[serde(rename = "rangeEnd", default)]
    pub range_end: Option<IpAddr>,
    #[serde(default)]
    pub gateway: Option<IpAddr>,
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct RawIpam {
    #[serde(rename = "type", default)]
    pub ipam_type: String,
    #[serde(default)]
    pub ranges: Vec<Vec<RawRange>>,
    /// The old single-range form (`subnet`, `rangeStart`, `rangeEnd`,
    /// `gateway` at the top), read as the first range set.
    #[serde(flatten)]
    pub single: RawRange,
    #[serde(default)]
    pub routes: Vec<RouteConf>,
    #[serde(rename = "dataDir", default)]
    pub data_dir: Option<String>,
    #[serde(rename = "resolvConf", default)]
    pub resolv_conf: Option<String>,
}

/// One canonical range: every field resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub subnet: IpNet,
    pub start: IpAddr,
    pub end: IpAddr,
    pub gateway: Option<IpAddr>,
}

impl Range {
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.subnet.contains(&ip) && ip >= self.start && ip <= self.end
    }
}

pub type RangeSet = Vec<Range>;

#[derive(Debug, Clone)]
pub struct IpamConf {
    pub range_sets: Vec<RangeSet>,
    pub routes: Vec<RouteConf>,
    pub data_dir: String,
    pub resolv_conf: Option<String>,
}

pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

impl IpamConf {
    /// Canonicalises the raw configuration; `name` is the network's name.
    pub fn from_raw(raw: RawIpam, name: &str) -> Result<IpamConf, CniError> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(CniError::config(format!("invalid network name {name:?}")));
        }
        let mut sets = raw.ranges;
        if raw.single.subnet.is_some() {
            sets.insert(0, vec![raw.single]);
        }
        if sets.is_empty() {
            return Err(CniError::config(
                "host-local: no IP ranges specified (\"ranges\" or \"subnet\")",
            ));
        }
        let mut range_sets = Vec::new();
        for (i, set) in sets.into_iter().enumerate() {
            if set.is_empty() {
                return Err(CniError::config(format!(
                    "host-local: range set {i} is empty"
                )));
            }
            let mut out: RangeSet = Vec::new();
            for r in set {
                let r = canonical_range(r, i)?;
                if let Some(f) = out.first() {
                    if f.subnet.addr().is_ipv4() != r.subnet.addr().is_ipv4() {
                        return Err(CniError::config(format!(
                            "host-local: range set {i} mixes address families"
                        )));
                    }
                }
                for o in &out {
                    if r.start <= o.end && o.start <= r.end {
                        return Err(CniError::config(format!(
                            "host-local: range set {i}: {} overlaps with {}",
                            r.subnet, o.subnet
                        )));
                    }
                }
                out.push(r);
            }
            for (j, other) in range_sets.iter().enumerate() {
                let other: &RangeSet = other;
                for a in &out {
                    for b in other {
                        if a.start <= b.end && b.start <= a.end {
                            return Err(CniError::config(format!(
                                "host-local: range set {i} overlaps with range set {j}"
                            )));
                        }
                    }
                }
            }
            range_sets.push(out);
        }
        let data_dir = raw.data_dir.unwrap_or_else(|| DEFAULT_DATA_DIR.to_string());
        Ok(IpamConf {
            range_sets,
            routes: raw.routes,
            data_dir: format!("{}/{}", data_dir.trim_end_matches('/'), name),
            resolv_conf: raw.resolv_conf,
        })
    }
}

fn canonical_range(r: RawRange, set: usize) -> Result<Range, CniError> {
    let s = r.subnet.ok_or_else(|| {
        CniError::config(format!("host-local: range set {set}: missing \"subnet\""))
    })?;
    let subnet: IpNet = s
        .parse()
        .map_err(|_| CniError::config(format!("host-local: invalid subnet {s:?}")))?;
    let subnet = subnet.trunc();
    if subnet.prefix_len() == 0 {
        return Err(CniError::config(format!(
            "host-local: subnet {subnet} is the whole address family, not a pod network"
        )));
    }
    let link_local: IpNet = if subnet.addr().is_ipv4() {
        "169.254.0.0/16".parse().expect("static")
    } else {
        "fe80::/10".parse().expect("static")
    };
    if subnet.contains(&link_local.network()) || link_local.contains(&subnet.network()) {
        return Err(CniError::config(format!(
            "host-local: subnet {subnet} overlaps the link-local range {link_local}"
        )));
    }
    let max = if subnet.addr().is_ipv4() { 32 } else { 128 };
    if subnet.prefix_len() > max - 2 {
        return Err(CniError::config(format!(
            "host-local: network {subnet} too small to allocate from"
        )));
    }
    let first = add(subnet.network(), 1);
    let mut last = last_addr(&subnet);
    if subnet.addr().is_ipv4() {
        last = add(last, -1);
    }
    let start = r.range_start.unwrap_or(first);
    let end = r.range_end.unwrap_or(last);
    for (what, ip) in [("rangeStart", start), ("rangeEnd", end)] {
        if !subnet.contains(&ip) || ip < first || ip > last {
            return Err(CniError::config(format!(
                "host-local: {what} {ip} not in network {subnet}"
            )));
        }
    }
    if start > end {
        return Err(CniError::config(format!(
            "host-local: rangeStart {start} is after rangeEnd {end}"
        )));
    }
    let gateway = Some(r.gateway.unwrap_or(first));
    if let Some(g) = r.gateway {
        if !subnet.contains(&g) {
            return Err(CniError::config(format!(
                "host-local: gateway {g} not in network {subnet}"
            )));
        }
    }
    Ok(Range {
        subnet,
        start,
        end,
        gateway,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(v: serde_json::Value) -> Result<IpamConf, CniError> {
        IpamConf::from_raw(serde_json::from_value(v).unwrap(), "net")
    }

    #[test]
    fn defaults_like_the_reference() {
        let c = conf(json!({"subnet": "10.1.2.0/24"})).unwrap();
        let r = &c.range_sets[0][0];
        assert_eq!(r.start.to_string(), "10.1.2.1");
        assert_eq!(r.end.to_string(), "10.1.2.254");
        assert_eq!(r.gateway.unwrap().to_string(), "10.1.2.1");
        assert_eq!(c.data_dir, "/var/lib/cni/networks/net");
        let c = conf(json!({"ranges": [[{"subnet": "fd00::/120"}]]})).unwrap();
        assert_eq!(c.range_sets[0][0].end.to_string(), "fd00::ff");
    }

    #[test]
    fn host_bits_are_masked() {
        let c = conf(json!({"subnet": "10.244.1.1/24"})).unwrap();
        assert_eq!(c.range_sets[0][0].subnet.to_string(), "10.244.1.0/24");
    }

    #[test]
    fn errors_name_the_problem() {
        let e = conf(json!({"subnet": "10.1.2.0/33"})).unwrap_err();
        assert!(e.msg.contains("invalid subnet"), "{}", e.msg);
        assert_eq!(e.code, 7);
        let e = conf(json!({"subnet": "10.1.2.0/24", "rangeStart": "10.1.3.5"})).unwrap_err();
        assert!(
            e.msg.contains("rangeStart 10.1.3.5 not in network"),
            "{}",
            e.msg
        );
        let e = conf(json!({"subnet": "10.1.2.0/31"})).unwrap_err();
        assert!(e.msg.contains("too small"));
        let e = conf(json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.0/25"}]]}))
            .unwrap_err();
        assert!(e.msg.contains("overlaps"));
        let e = conf(json!({})).unwrap_err();
        assert!(e.msg.contains("no IP ranges"));
    }

    #[test]
    fn default_and_link_local_subnets_are_refused() {
        for (s, msg) in [
            (
                "0.0.0.0/0",
                "host-local: subnet 0.0.0.0/0 is the whole address family, not a pod network",
            ),
            (
                "10.1.2.3/0",
                "host-local: subnet 0.0.0.0/0 is the whole address family, not a pod network",
            ),
            (
                "::/0",
                "host-local: subnet ::/0 is the whole address family, not a pod network",
            ),
            (
                "169.254.0.0/16",
                "host-local: subnet 169.254.0.0/16 overlaps the link-local range 169.254.0.0/16",
            ),
            (
                "169.254.7.0/24",
                "host-local: subnet 169.254.7.0/24 overlaps the link-local range 169.254.0.0/16",
            ),
            (
                "128.0.0.0/1",
                "host-local: subnet 128.0.0.0/1 overlaps the link-local range 169.254.0.0/16",
            ),
            (
                "fe80::/10",
                "host-local: subnet fe80::/10 overlaps the link-local range fe80::/10",
            ),
            (
                "fe80::/64",
                "host-local: subnet fe80::/64 overlaps the link-local range fe80::/10",
            ),
        ] {
            let e = conf(json!({"subnet": s})).unwrap_err();
            assert_eq!((e.code, e.msg.as_str()), (7, msg), "{s}");
            // The same in the ranges form.
            let e = conf(json!({"ranges": [[{"subnet": s}]]})).unwrap_err();
            assert_eq!((e.code, e.msg.as_str()), (7, msg), "{s}");
        }
        // Neighbours of the link-local ranges are fine.
        conf(json!({"subnet": "169.253.0.0/16"})).unwrap();
        conf(json!({"subnet": "169.255.0.0/16"})).unwrap();
        conf(json!({"subnet": "fec0::/64"})).unwrap();
        // /31, /32, /127, /128: too small, as the reference says too.
        for s in ["10.9.0.0/31", "10.9.0.1/32", "fd00::/127", "fd00::/128"] {
            let e = conf(json!({"subnet": s})).unwrap_err();
            assert_eq!(e.code, 7, "{s}");
            assert!(
                e.msg.ends_with("too small to allocate from"),
                "{s}: {}",
                e.msg
            );
        }
    }
}
