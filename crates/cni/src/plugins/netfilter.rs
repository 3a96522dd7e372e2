//! The nftables state the CNI plugins own, as data in sets rather than one
//! rule per container.
//!
//! Table `inet podnet-cni` masquerades pod traffic (bridge `ipMasq`):
//! - `masq4`/`masq6` hold pod addresses to masquerade;
//! - `nomasq4`/`nomasq6` hold `pod . own-subnet` pairs that are left alone,
//!   so pods on one bridge talk without NAT, as with the reference plugin.
//!
//! Table `bridge podnet-cni` enforces `macspoofchk`: frames entering from a
//! listed port must carry that port's container MAC.
//!
//! Every masquerade element carries its owner, `<network>/<containerID>`,
//! as its comment: DEL finds a pod's elements by owner, so it needs neither
//! a prevResult nor the pod's namespace.
//!
//! Adding is idempotent (base chains are flushed and rewritten in the same
//! transaction; elements are added, which never fails on duplicates).
//! Removal adds then deletes each element, so removing twice is fine too.

use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;
use podnet_nft::{apply, quote, NftError};
use serde_json::Value;

pub const MASQ_TABLE: &str = "podnet-cni";

fn masq_header(s: &mut String) {
    s.push_str(&format!(
        "add table inet {t}\n\
         add chain inet {t} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}\n\
         add set inet {t} masq4 {{ type ipv4_addr; }}\n\
         add set inet {t} masq6 {{ type ipv6_addr; }}\n\
         add set inet {t} nomasq4 {{ type ipv4_addr . ipv4_addr; flags interval; }}\n\
         add set inet {t} nomasq6 {{ type ipv6_addr . ipv6_addr; flags interval; }}\n",
        t = MASQ_TABLE
    ));
}

/// The two elements one pod address owns: (set, element text).
fn masq_elements(n: &IpNet) -> [(&'static str, String); 2] {
    let (m, nm) = if n.addr().is_ipv4() {
        ("masq4", "nomasq4")
    } else {
        ("masq6", "nomasq6")
    };
    [
        (m, n.addr().to_string()),
        (nm, format!("{} . {}", n.addr(), n.trunc())),
    ]
}

/// Masquerades traffic from each pod address leaving its own subnet. Every
/// element carries its owner (`<network>/<containerID>`) as its comment,
/// which is how [`masq_del`] finds them without knowing the addresses. An
/// element an earlier owner of the same address left behind is replaced, so
/// it changes hands.
pub fn masq_add(addrs: &[IpNet], owner: &str) -> Result<(), NftError> {
    let mut s = String::new();
    masq_header(&mut s);
    let t = MASQ_TABLE;
    s.push_str(&format!(
        "flush chain inet {t} postrouting\n\
         add rule inet {t} postrouting ip saddr . ip daddr @nomasq4 return\n\
         add rule inet {t} postrouting ip saddr @masq4 ip daddr != 224.0.0.0/4 masquerade\n\
         add rule inet {t} postrouting ip6 saddr . ip6 daddr @nomasq6 return\n\
         add rule inet {t} postrouting ip6 saddr @masq6 ip6 daddr != ff00::/8 masquerade\n"
    ));
    let c = quote(owner);
    for n in addrs {
        for (set, el) in masq_elements(n) {
            s.push_str(&format!(
                "add element inet {t} {set} {{ {el} }}\n\
                 delete element inet {t} {set} {{ {el} }}\n\
                 add element inet {t} {set} {{ {el} comment {c} }}\n"
            ));
        }
    }
    apply("adding masquerade for pod addresses", &s)
}

/// One element of the masquerade sets as the kernel holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasqElement {
    pub set: String,
    /// The element in nft syntax (`10.1.0.2 . 10.1.0.0/24`).
    pub key: String,
    /// The pod address (the element's first component).
    pub ip: IpAddr,
    pub comment: Option<String>,
}

/// Renders one value of `nft -j` output back into nft syntax.
fn render_json_value(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Object(o) => {
            if let Some(p) = o.get("prefix") {
                Some(format!("{}/{}", p.get("addr")?.as_str()?, p.get("len")?))
            } else if let Some(r) = o.get("range") {
                let r = r.as_array()?;
                Some(format!(
                    "{}-{}",
                    render_json_value(r.first()?)?,
                    render_json_value(r.get(1)?)?
                ))
            } else if let Some(c) = o.get("concat") {
                let parts: Option<Vec<String>> =
                    c.as_array()?.iter().map(render_json_value).collect();
                Some(parts?.join(" . "))
            } else {
                None
            }
        }
        _ => None,
    }
}

/// The masquerade sets' elements from `nft -j list table inet podnet-cni`.
pub fn parse_masq_listing(json: &str) -> Vec<MasqElement> {
    let Ok(v) = serde_json::from_str::<Value>(json) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let items = v.get("nftables").and_then(|n| n.as_array());
    for set in items.into_iter().flatten().filter_map(|i| i.get("set")) {
        let Some(name) = set.get("name").and_then(|n| n.as_str()) else {
            continue;
        };
        if !matches!(name, "masq4" | "masq6" | "nomasq4" | "nomasq6") {
            continue;
        }
        for e in set
            .get("elem")
            .and_then(|e| e.as_array())
            .into_iter()
            .flatten()
        {
            // With a comment: {"elem": {"val": V, "comment": C}}; without: V.
            let (val, comment) = match e.get("elem") {
                Some(inner) => (
                    inner.get("val"),
                    inner
                        .get("comment")
                        .and_then(|c| c.as_str())
                        .map(String::from),
                ),
                None => (Some(e), None),
            };
            let Some(val) = val else { continue };
            let first = match val.get("concat").and_then(|c| c.as_array()) {
                Some(parts) => parts.first(),
                None => Some(val),
            };
            let (Some(key), Some(ip)) = (
                render_json_value(val),
                first
                    .and_then(|f| f.as_str())
                    .and_then(|f| f.parse::<IpAddr>().ok()),
            ) else {
                continue;
            };
            out.push(MasqElement {
                set: name.to_string(),
                key,
                ip,
                comment,
            });
        }
    }
    out
}

/// The elements that belong to `owner`: those that carry its comment, and
/// uncommented ones (written before elements carried owners) of its
/// addresses or of `addrs`. Elements of another owner are never chosen.
pub fn owned_elements<'a>(
    els: &'a [MasqElement],
    owner: &str,
    addrs: &[IpNet],
) -> Vec<&'a MasqElement> {
    let mut ips: HashSet<IpAddr> = addrs.iter().map(|a| a.addr()).collect();
    ips.extend(
        els.iter()
            .filter(|e| e.comment.as_deref() == Some(owner))
            .map(|e| e.ip),
    );
    els.iter()
        .filter(|e| match e.comment.as_deref() {
            Some(c) => c == owner,
            None => ips.contains(&e.ip),
        })
        .collect()
}

/// Removes the masquerade elements of `owner` (and uncommented ones of
/// `addrs`), found by reading the table, so it works with no address known.
pub fn masq_del(owner: &str, addrs: &[IpNet]) -> Result<(), NftError> {
    let listing = match podnet_nft::query(&["-j", "list", "table", "inet", MASQ_TABLE]) {
        Ok(l) => l,
        Err(NftError::Failed { stderr, .. }) if stderr.contains("No such file") => return Ok(()),
        Err(e) => return Err(e),
    };
    let els = parse_masq_listing(&listing);
    let doomed = owned_elements(&els, owner, addrs);
    if doomed.is_empty() {
        return Ok(());
    }
    let mut s = String::new();
    masq_header(&mut s);
    let t = MASQ_TABLE;
    for e in doomed {
        // add-then-delete: a concurrent removal must not fail the batch.
        s.push_str(&format!(
            "add element inet {t} {set} {{ {k} }}\ndelete element inet {t} {set} {{ {k} }}\n",
            set = e.set,
            k = e.key
        ));
    }
    apply("removing masquerade for pod addresses", &s)
}

/// Whether a pod address is currently masqueraded (for CHECK).
pub fn masq_present(n: &IpNet) -> Result<bool, NftError> {
    let set = if n.addr().is_ipv4() { "masq4" } else { "masq6" };
    match podnet_nft::query(&[
        "get",
        "element",
        "inet",
        MASQ_TABLE,
        set,
        &format!("{{ {} }}", n.addr()),
    ]) {
        Ok(_) => Ok(true),
        Err(NftError::Failed { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

fn spoof_header(s: &mut String) {
    s.push_str(&format!(
        "add table bridge {t}\n\
         add chain bridge {t} prerouting {{ type filter hook prerouting priority -300; policy accept; }}\n\
         add set bridge {t} spoofports {{ type ifname; }}\n\
         add set bridge {t} spoofok {{ type ifname . ether_addr; }}\n",
        t = MASQ_TABLE
    ));
}

/// Drops frames from `port` whose source MAC is not `mac`.
pub fn macspoof_add(port: &str, mac: &str) -> Result<(), NftError> {
    let mut s = String::new();
    spoof_header(&mut s);
    let t = MASQ_TABLE;
    s.push_str(&format!(
        "flush chain bridge {t} prerouting\n\
         add rule bridge {t} prerouting iifname @spoofports iifname . ether saddr != @spoofok drop\n\
         add element bridge {t} spoofports {{ {p} }}\n\
         add element bridge {t} spoofok {{ {p} . {mac} }}\n",
        p = quote(port)
    ));
    apply("adding MAC spoof check", &s)
}

pub fn macspoof_del(port: &str, mac: Option<&str>) -> Result<(), NftError> {
    let mut s = String::new();
    spoof_header(&mut s);
    let t = MASQ_TABLE;
    let p = quote(port);
    s.push_str(&format!(
        "add element bridge {t} spoofports {{ {p} }}\ndelete element bridge {t} spoofports {{ {p} }}\n"
    ));
    if let Some(mac) = mac {
        s.push_str(&format!(
            "add element bridge {t} spoofok {{ {p} . {mac} }}\ndelete element bridge {t} spoofok {{ {p} . {mac} }}\n"
        ));
    }
    apply("removing MAC spoof check", &s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `nft -j list table inet podnet-cni` (nftables 1.0.6) with owned,
    /// foreign and legacy (uncommented) elements.
    const LISTING: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
        {"table": {"family": "inet", "name": "podnet-cni", "handle": 1}},
        {"chain": {"family": "inet", "table": "podnet-cni", "name": "postrouting", "handle": 5}},
        {"set": {"family": "inet", "name": "masq4", "table": "podnet-cni", "type": "ipv4_addr", "handle": 1,
          "elem": [{"elem": {"val": "10.1.0.2", "comment": "n/ctr"}}, {"elem": {"val": "10.1.0.3", "comment": "n/other"}}, "10.1.0.9"]}},
        {"set": {"family": "inet", "name": "nomasq4", "table": "podnet-cni", "type": ["ipv4_addr", "ipv4_addr"], "handle": 2, "flags": ["interval"],
          "elem": [{"concat": ["10.1.0.2", {"prefix": {"addr": "10.1.0.0", "len": 24}}]},
                   {"elem": {"val": {"concat": ["10.1.0.3", {"prefix": {"addr": "10.1.0.0", "len": 24}}]}, "comment": "n/other"}}]}},
        {"set": {"family": "inet", "name": "masq6", "table": "podnet-cni", "type": "ipv6_addr", "handle": 3,
          "elem": [{"elem": {"val": "fd00::2", "comment": "n/ctr"}}]}},
        {"set": {"family": "inet", "name": "nomasq6", "table": "podnet-cni", "type": ["ipv6_addr", "ipv6_addr"], "handle": 4, "flags": ["interval"],
          "elem": [{"elem": {"val": {"concat": ["fd00::2", {"prefix": {"addr": "fd00::", "len": 64}}]}, "comment": "n/ctr"}}]}}]}"#;

    fn keys(v: Vec<&MasqElement>) -> Vec<String> {
        v.iter().map(|e| format!("{} {}", e.set, e.key)).collect()
    }

    #[test]
    fn listing_parses_into_elements() {
        let els = parse_masq_listing(LISTING);
        assert_eq!(els.len(), 7);
        assert_eq!(els[3].key, "10.1.0.2 . 10.1.0.0/24");
        assert_eq!(els[3].comment, None);
        assert_eq!(els[3].ip.to_string(), "10.1.0.2");
        assert_eq!(els[4].comment.as_deref(), Some("n/other"));
        assert!(parse_masq_listing("not json").is_empty());
    }

    #[test]
    fn owner_finds_its_elements_without_addresses() {
        let els = parse_masq_listing(LISTING);
        // No prevResult, no namespace: the owner alone finds its four
        // elements, including the uncommented (legacy) nomasq4 one.
        assert_eq!(
            keys(owned_elements(&els, "n/ctr", &[])),
            vec![
                "masq4 10.1.0.2",
                "nomasq4 10.1.0.2 . 10.1.0.0/24",
                "masq6 fd00::2",
                "nomasq6 fd00::2 . fd00::/64"
            ]
        );
        // Another owner's elements are never taken, even by address.
        let other: Vec<IpNet> = vec!["10.1.0.3/24".parse().unwrap()];
        assert!(owned_elements(&els, "n/ctr2", &other).is_empty());
        // Legacy elements go by address.
        let legacy: Vec<IpNet> = vec!["10.1.0.9/24".parse().unwrap()];
        assert_eq!(
            keys(owned_elements(&els, "n/gone", &legacy)),
            vec!["masq4 10.1.0.9"]
        );
    }
}
