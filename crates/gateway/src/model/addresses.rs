//! Each Gateway's own address, from a pool (`podnet gateway
//! --address-pool`): Gateways that listen on the same port must not share
//! routes, so each gets an address of its own to be served on. Pure: which
//! Gateway holds which address. A Gateway keeps what its status shows (a
//! restart moves nothing), else what this gateway gave it before (its
//! status may not be written yet when the next Gateway comes), else takes
//! the address its spec asks for, else the lowest free one; older
//! Gateways choose first.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use podnet_api::gateway::Gateway;
use podnet_api::pool::{ip_to_u128, u128_to_ip, AddressRange};

use super::build::Key;

/// The addresses Gateways may be given.
#[derive(Debug, Clone)]
pub struct Pool {
    pub ranges: Vec<AddressRange>,
}

/// The most addresses a pool hands out (a /16 of IPv4).
const MAX: u128 = 65_536;

impl Pool {
    /// `first-last` or a CIDR, comma-separated.
    pub fn parse(s: &str) -> Result<Pool, String> {
        let ranges = s
            .split(',')
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(AddressRange::parse)
            .collect::<Result<Vec<_>, _>>()?;
        if ranges.is_empty() {
            return Err("no address range".into());
        }
        Ok(Pool { ranges })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(ip))
    }

    /// Every address, in order (at most [`MAX`]).
    fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.ranges.iter().flat_map(|r| {
            let (a, b) = (ip_to_u128(r.first()), ip_to_u128(r.last()));
            (a..=b.min(a + MAX - 1)).map(move |n| u128_to_ip(n, r.first()))
        })
    }
}

fn shown(g: &Gateway) -> Vec<IpAddr> {
    g.status
        .iter()
        .flat_map(|s| s.addresses.iter())
        .filter_map(|a| a.value.parse().ok())
        .collect()
}

fn asked(g: &Gateway) -> Vec<IpAddr> {
    g.spec
        .addresses
        .iter()
        .filter(|a| a.type_.as_deref().unwrap_or("IPAddress") == "IPAddress")
        .filter_map(|a| a.value.parse().ok())
        .collect()
}

/// Where a Gateway's address may come from, in order.
type Pick<'a> = &'a dyn Fn(&Key, &Gateway) -> Vec<IpAddr>;

/// The address of each of `ours` (Gateways without one: the pool ran
/// out), `given` what the last assignment gave.
pub fn assign(
    gateways: &BTreeMap<Key, Gateway>,
    ours: &BTreeSet<Key>,
    pool: &Pool,
    given: &BTreeMap<Key, IpAddr>,
) -> BTreeMap<Key, IpAddr> {
    let mut order: Vec<(&Key, &Gateway)> =
        gateways.iter().filter(|(k, _)| ours.contains(*k)).collect();
    order.sort_by_key(|(k, g)| {
        (
            g.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second()),
            (*k).clone(),
        )
    });
    let mut taken = BTreeSet::new();
    let mut out = BTreeMap::new();
    // What statuses show first, then what was given, then what specs ask
    // for.
    let before = |k: &Key, _: &Gateway| given.get(k).copied().into_iter().collect();
    let picks: [Pick; 3] = [&|_, g| shown(g), &before, &|_, g| asked(g)];
    for pick in picks {
        for (k, g) in &order {
            if out.contains_key(*k) {
                continue;
            }
            if let Some(ip) = pick(k, g)
                .into_iter()
                .find(|ip| pool.contains(*ip) && !taken.contains(ip))
            {
                taken.insert(ip);
                out.insert((*k).clone(), ip);
            }
        }
    }
    let mut free = pool.addresses().filter(|ip| !taken.contains(ip));
    for (k, _) in order {
        if out.contains_key(k) {
            continue;
        }
        match free.next() {
            Some(ip) => drop(out.insert(k.clone(), ip)),
            None => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gw(name: &str, created: &str, status: Option<&str>, spec: Option<&str>) -> (Key, Gateway) {
        let mut v = json!({"metadata": {"name": name, "namespace": "x", "creationTimestamp": created},
                           "spec": {"gatewayClassName": "podnet", "listeners": []}});
        if let Some(s) = status {
            v["status"] = json!({"addresses": [{"value": s}]});
        }
        if let Some(a) = spec {
            v["spec"]["addresses"] = json!([{"type": "IPAddress", "value": a}]);
        }
        (
            ("x".into(), name.into()),
            serde_json::from_value(v).unwrap(),
        )
    }

    #[test]
    fn gateways_keep_their_addresses_and_new_ones_take_the_lowest_free() {
        let pool = Pool::parse("10.0.0.1-10.0.0.3").unwrap();
        let all: BTreeMap<Key, Gateway> = [
            gw("old", "2026-01-01T00:00:00Z", None, None),
            gw("kept", "2026-01-02T00:00:00Z", Some("10.0.0.1"), None),
            gw("asks", "2026-01-03T00:00:00Z", None, Some("10.0.0.3")),
            gw("late", "2026-01-04T00:00:00Z", None, None),
            gw("outside", "2026-01-05T00:00:00Z", Some("192.0.2.1"), None),
        ]
        .into_iter()
        .collect();
        let ours: BTreeSet<Key> = all.keys().cloned().collect();
        let got: Vec<(String, String)> = assign(&all, &ours, &pool, &BTreeMap::new())
            .into_iter()
            .map(|(k, ip)| (k.1, ip.to_string()))
            .collect();
        assert_eq!(
            got,
            [
                ("asks".into(), "10.0.0.3".into()),
                ("kept".into(), "10.0.0.1".into()),
                ("old".into(), "10.0.0.2".into())
            ],
            "late and outside find the pool empty"
        );
        assert!(Pool::parse("").is_err() && Pool::parse("10.0.0.9-10.0.0.1").is_err());
    }

    /// Two Gateways created in one second, the second (by name, first)
    /// arriving before the first's status is written: the first keeps
    /// the address it was given (conformance: GatewayHTTPListenerIsolation
    /// read an address that then moved).
    #[test]
    fn an_address_given_stays_before_the_status_shows_it() {
        let pool = Pool::parse("10.0.0.1-10.0.0.3").unwrap();
        let b = gw("b", "2026-01-01T00:00:00Z", None, None);
        let first: BTreeMap<Key, Gateway> = [b.clone()].into_iter().collect();
        let ours: BTreeSet<Key> = first.keys().cloned().collect();
        let given = assign(&first, &ours, &pool, &BTreeMap::new());
        assert_eq!(given[&b.0].to_string(), "10.0.0.1");
        let both: BTreeMap<Key, Gateway> = [b.clone(), gw("a", "2026-01-01T00:00:00Z", None, None)]
            .into_iter()
            .collect();
        let ours: BTreeSet<Key> = both.keys().cloned().collect();
        let got = assign(&both, &ours, &pool, &given);
        assert_eq!(got[&b.0].to_string(), "10.0.0.1", "b keeps its address");
        assert_eq!(
            got[&("x".to_string(), "a".to_string())].to_string(),
            "10.0.0.2"
        );
    }
}
