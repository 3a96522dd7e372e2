//! Subnet leases, flannel's way: each node holds one subnet of the cluster
//! network as a store key with a TTL lease, renewed while the agent lives.
//!
//! - key `/podnet/subnets/10.244.1.0-24`, value the lease attributes
//!   (flannel's `PublicIP`, `BackendType`, `BackendData`, plus `Node`);
//! - a restarted node gets its previous subnet back (found by node name, or
//!   from the subnet.env it wrote);
//! - an expired lease disappears with its key, freeing the subnet;
//! - two agents can never hold one subnet: the key is created with a
//!   create-only condition.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use podnet_api::netconfig::Resolved;
use podnet_store::{AnyStore, KeyValue, Op, Rev, Store, StoreError};
use serde::{Deserialize, Serialize};

pub const PREFIX: &str = "/podnet/subnets/";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attrs {
    #[serde(rename = "PublicIP")]
    pub public_ip: Ipv4Addr,
    #[serde(rename = "BackendType")]
    pub backend_type: String,
    #[serde(rename = "BackendData", default)]
    pub backend_data: serde_json::Value,
    #[serde(rename = "Node", default)]
    pub node: String,
}

impl Attrs {
    pub fn vtep_mac(&self) -> Option<[u8; 6]> {
        let s = self.backend_data.get("VtepMAC")?.as_str()?;
        let v: Vec<u8> = s
            .split(':')
            .filter_map(|p| u8::from_str_radix(p, 16).ok())
            .collect();
        v.try_into().ok()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetLease {
    pub subnet: Ipv4Net,
    pub attrs: Attrs,
    pub mod_rev: Rev,
    pub lease_id: i64,
}

pub fn key(subnet: &Ipv4Net) -> String {
    format!("{PREFIX}{}-{}", subnet.network(), subnet.prefix_len())
}

pub fn parse_key(k: &str) -> Option<Ipv4Net> {
    let (ip, len) = k.strip_prefix(PREFIX)?.split_once('-')?;
    Ipv4Net::new(ip.parse().ok()?, len.parse().ok()?).ok()
}

pub fn decode(kv: &KeyValue) -> Option<SubnetLease> {
    Some(SubnetLease {
        subnet: parse_key(&kv.key)?,
        attrs: serde_json::from_slice(&kv.value).ok()?,
        mod_rev: kv.mod_rev,
        lease_id: kv.lease,
    })
}

/// The candidate subnets in [SubnetMin, SubnetMax].
pub fn candidates(cfg: &Resolved) -> Vec<Ipv4Net> {
    cfg.network
        .subnets(cfg.subnet_len)
        .map(|it| {
            it.filter(|s| {
                s.network() >= cfg.subnet_min.network() && s.network() <= cfg.subnet_max.network()
            })
            .collect()
        })
        .unwrap_or_default()
}

/// Picks a free subnet: the node's own lease first, then the one it had
/// before (from its subnet.env), then the first free one from a start that
/// depends on the node name (so simultaneous agents rarely collide).
pub fn choose(
    cfg: &Resolved,
    taken: &[SubnetLease],
    node: &str,
    previous: Option<Ipv4Net>,
) -> Option<Ipv4Net> {
    if let Some(mine) = taken
        .iter()
        .find(|l| l.attrs.node == node && candidates_contains(cfg, &l.subnet))
    {
        return Some(mine.subnet);
    }
    if let Some(p) = previous {
        if candidates_contains(cfg, &p) && !taken.iter().any(|l| l.subnet == p) {
            return Some(p);
        }
    }
    let all = candidates(cfg);
    if all.is_empty() {
        return None;
    }
    let start = node
        .bytes()
        .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize))
        % all.len();
    (0..all.len())
        .map(|i| all[(start + i) % all.len()])
        .find(|s| !taken.iter().any(|l| l.subnet == *s))
}

fn candidates_contains(cfg: &Resolved, s: &Ipv4Net) -> bool {
    s.prefix_len() == cfg.subnet_len
        && cfg.network.contains(s)
        && s.network() >= cfg.subnet_min.network()
        && s.network() <= cfg.subnet_max.network()
}

/// Acquires (or re-acquires) this node's subnet; returns it with its lease.
pub async fn acquire(
    store: &AnyStore,
    cfg: &Resolved,
    node: &str,
    attrs: &Attrs,
    previous: Option<Ipv4Net>,
    ttl: i64,
) -> Result<SubnetLease, StoreError> {
    for _ in 0..20 {
        let (kvs, _) = store.list(PREFIX).await?;
        let taken: Vec<SubnetLease> = kvs.iter().filter_map(decode).collect();
        let subnet = choose(cfg, &taken, node, previous).ok_or_else(|| {
            StoreError::Backend(format!(
                "no free subnet left in {} (SubnetLen {})",
                cfg.network, cfg.subnet_len
            ))
        })?;
        let lease = store.grant(ttl).await?;
        let value = serde_json::to_vec(attrs).expect("json");
        let k = key(&subnet);
        let op = match taken.iter().find(|l| l.subnet == subnet) {
            // Our own old lease: take it over with a compare-and-swap.
            Some(old) => Op::Update {
                key: k,
                value,
                rev: old.mod_rev,
                lease,
            },
            None => Op::Create {
                key: k,
                value,
                lease,
            },
        };
        match store.txn(vec![op]).await {
            Ok(rev) => {
                return Ok(SubnetLease {
                    subnet,
                    attrs: attrs.clone(),
                    mod_rev: rev,
                    lease_id: lease,
                });
            }
            Err(StoreError::AlreadyExists(_))
            | Err(StoreError::Conflict { .. })
            | Err(StoreError::NotFound(_)) => {
                let _ = store.revoke(lease).await;
                continue;
            }
            Err(e) => {
                let _ = store.revoke(lease).await;
                return Err(e);
            }
        }
    }
    Err(StoreError::Backend(
        "could not acquire a subnet: too much contention".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use podnet_api::netconfig::NetworkConfig;

    fn cfg() -> Resolved {
        let c: NetworkConfig = serde_json::from_value(
            serde_json::json!({"spec": {"Network": "10.244.0.0/22", "SubnetLen": 24}}),
        )
        .unwrap();
        c.resolve().unwrap()
    }

    fn lease(s: &str, node: &str) -> SubnetLease {
        SubnetLease {
            subnet: s.parse().unwrap(),
            attrs: Attrs {
                public_ip: "1.2.3.4".parse().unwrap(),
                backend_type: "vxlan".into(),
                backend_data: serde_json::json!({"VtepMAC": "02:00:00:00:00:01"}),
                node: node.into(),
            },
            mod_rev: 1,
            lease_id: 1,
        }
    }

    #[test]
    fn keys_round_trip() {
        let s: Ipv4Net = "10.244.3.0/24".parse().unwrap();
        assert_eq!(key(&s), "/podnet/subnets/10.244.3.0-24");
        assert_eq!(parse_key(&key(&s)), Some(s));
        assert_eq!(
            lease("10.244.1.0/24", "a").attrs.vtep_mac(),
            Some([2, 0, 0, 0, 0, 1])
        );
    }

    #[test]
    fn choice_prefers_own_then_previous_then_free() {
        let c = cfg();
        // /22 with /24s: flannel skips the first, so .1, .2, .3 are candidates
        assert_eq!(candidates(&c).len(), 3);
        let taken = vec![lease("10.244.2.0/24", "a")];
        assert_eq!(
            choose(&c, &taken, "a", None),
            Some("10.244.2.0/24".parse().unwrap())
        );
        assert_eq!(
            choose(&c, &taken, "b", Some("10.244.3.0/24".parse().unwrap())),
            Some("10.244.3.0/24".parse().unwrap())
        );
        let got = choose(&c, &taken, "b", Some("10.244.2.0/24".parse().unwrap())).unwrap();
        assert_ne!(got.to_string(), "10.244.2.0/24");
        let full = vec![
            lease("10.244.1.0/24", "x"),
            lease("10.244.2.0/24", "y"),
            lease("10.244.3.0/24", "z"),
        ];
        assert_eq!(choose(&c, &full, "b", None), None);
    }
}
