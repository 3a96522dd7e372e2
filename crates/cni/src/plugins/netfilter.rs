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
//! Both tables are planned as typed [`Table`]s ([`masq_table`],
//! [`spoof_table`], pure) and changed over nf_tables netlink, one
//! transaction per call. They are shared by every container on the host, so
//! a call never replaces them: it declares what is missing, rewrites the
//! base rules and adds or removes only its own elements ([`diff::ensure`]
//! plus element changes). Adding is idempotent (elements are added, which
//! never fails on duplicates); removal adds then deletes each element, so
//! removing twice, or racing another removal, is fine too. Reading back
//! (DEL's owner lookup, CHECK) is a netlink dump of the sets.

use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;
use podnet_kernel::KernelError;
use podnet_nft::diff::{self, Change};
use podnet_nft::model::{
    Chain, ChainType, Expr, Family, Field, Hook, KeyType, Rule, Set, Table, Value as NftValue,
    Verdict,
};
use podnet_nft::netlink::Conn;
use serde_json::Value;

pub const MASQ_TABLE: &str = "podnet-cni";

/// The masquerade sets, by family: (pods to masquerade, pod . own subnet
/// pairs left alone).
const MASQ_SETS: [(&str, &str); 2] = [("masq4", "nomasq4"), ("masq6", "nomasq6")];

fn set_of(key: Vec<KeyType>, interval: bool) -> Set {
    let mut s = Set::new(key);
    s.interval = interval;
    s
}

/// Table `inet podnet-cni` without elements: the sets and the postrouting
/// chain that masquerades what leaves a pod's own subnet (not multicast).
pub fn masq_table() -> Table {
    let mut t = Table::new(Family::Inet, MASQ_TABLE);
    let mut rules = Vec::new();
    for (v4, (m, nm)) in [(true, MASQ_SETS[0]), (false, MASQ_SETS[1])] {
        let (addr, saddr, daddr, mcast) = if v4 {
            (
                KeyType::Ipv4Addr,
                Field::IpSaddr,
                Field::IpDaddr,
                "224.0.0.0/4",
            )
        } else {
            (
                KeyType::Ipv6Addr,
                Field::Ip6Saddr,
                Field::Ip6Daddr,
                "ff00::/8",
            )
        };
        t.sets.insert(m.into(), set_of(vec![addr], false));
        t.sets.insert(nm.into(), set_of(vec![addr, addr], true));
        rules.push(Rule::new(vec![
            Expr::InSet {
                keys: vec![saddr, daddr],
                set: nm.into(),
                neg: false,
            },
            Expr::Verdict(Verdict::Return),
        ]));
        rules.push(Rule::new(vec![
            Expr::InSet {
                keys: vec![saddr],
                set: m.into(),
                neg: false,
            },
            Expr::Cmp {
                field: daddr,
                neg: true,
                value: NftValue::Net(mcast.parse().expect("prefix")),
            },
            Expr::Masquerade {
                fully_random: false,
            },
        ]));
    }
    t.chains.insert(
        "postrouting".into(),
        Chain::base(ChainType::Nat, Hook::Postrouting, 100).with_rules(rules),
    );
    t
}

/// A prefix as a range element value (a single address as itself).
fn net_value(n: IpNet) -> NftValue {
    if n.prefix_len() == n.max_prefix_len() {
        NftValue::Addr(n.addr())
    } else {
        NftValue::Net(n)
    }
}

/// The two elements one pod address owns: (set, key).
fn masq_elements(n: &IpNet) -> [(&'static str, Vec<NftValue>); 2] {
    let (m, nm) = if n.addr().is_ipv4() {
        MASQ_SETS[0]
    } else {
        MASQ_SETS[1]
    };
    [
        (m, vec![NftValue::Addr(n.addr())]),
        (nm, vec![NftValue::Addr(n.addr()), net_value(n.trunc())]),
    ]
}

/// Adds a pod's elements, owned by `owner`, to a planned table (for
/// tracing what a set of pods amounts to).
pub fn add_pod(t: &mut Table, addrs: &[IpNet], owner: &str) {
    for n in addrs {
        for (set, key) in masq_elements(n) {
            if let Some(s) = t.sets.get_mut(set) {
                s.elements.insert(key.clone(), None);
                s.comments.insert(key, owner.to_string());
            }
        }
    }
}

/// Groups (set, key) pairs by set, in first-seen order.
fn by_set(
    els: impl IntoIterator<Item = (String, Vec<NftValue>)>,
) -> Vec<(String, Vec<Vec<NftValue>>)> {
    let mut out: Vec<(String, Vec<Vec<NftValue>>)> = Vec::new();
    for (set, key) in els {
        match out.iter_mut().find(|(s, _)| *s == set) {
            Some((_, keys)) => keys.push(key),
            None => out.push((set, vec![key])),
        }
    }
    out
}

/// Add-then-delete of each element: removes it whether or not it exists.
fn remove_changes(els: Vec<(String, Vec<Vec<NftValue>>)>) -> Vec<Change> {
    let mut out = Vec::new();
    for (set, keys) in els {
        out.push(Change::AddElems {
            set: set.clone(),
            elems: keys.iter().map(|k| (k.clone(), None)).collect(),
        });
        out.push(Change::DelElems { set, keys });
    }
    out
}

/// The transaction [`masq_add`] applies: the table declared, then each
/// element put in place with its owner as its comment. An element an earlier
/// owner of the same address left behind is replaced, so it changes hands.
pub fn masq_add_changes(addrs: &[IpNet], owner: &str) -> Vec<Change> {
    let mut out = diff::ensure(&masq_table());
    let els = by_set(
        addrs
            .iter()
            .flat_map(masq_elements)
            .map(|(s, k)| (s.to_string(), k)),
    );
    for (set, keys) in &els {
        out.extend(remove_changes(vec![(set.clone(), keys.clone())]));
        out.push(Change::AddCommented {
            set: set.clone(),
            elems: keys
                .iter()
                .map(|k| (k.clone(), None, owner.to_string()))
                .collect(),
        });
    }
    out
}

/// Masquerades traffic from each pod address leaving its own subnet. Every
/// element carries its owner (`<network>/<containerID>`) as its comment,
/// which is how [`masq_del`] finds them without knowing the addresses.
pub fn masq_add(addrs: &[IpNet], owner: &str) -> Result<(), KernelError> {
    Conn::open()?.apply(&masq_table(), &masq_add_changes(addrs, owner))
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

/// Renders one value of `nft -j` output back into nft syntax (tests inspect
/// the table with `nft -j`).
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

/// A masquerade element's key from its nft syntax (addresses and prefixes
/// joined by ` . `).
fn parse_key(text: &str) -> Option<Vec<NftValue>> {
    text.split(" . ")
        .map(|p| match p.parse::<IpNet>() {
            Ok(n) => Some(net_value(n)),
            Err(_) => p.parse::<IpAddr>().ok().map(NftValue::Addr),
        })
        .collect()
}

/// The masquerade sets' elements as the kernel holds them (none when the
/// table does not exist), read over netlink.
pub fn masq_listing(conn: &mut Conn) -> Result<Vec<MasqElement>, KernelError> {
    let t = masq_table();
    let mut out = Vec::new();
    for (m, nm) in MASQ_SETS {
        for name in [m, nm] {
            let Some(set) = conn.elements(Family::Inet, MASQ_TABLE, name, &t.sets[name])? else {
                continue;
            };
            for k in set.elements.keys() {
                let Some(NftValue::Addr(ip)) = k.first() else {
                    continue;
                };
                out.push(MasqElement {
                    set: name.to_string(),
                    key: Set::element_text(k, &None),
                    ip: *ip,
                    comment: set.comments.get(k).cloned(),
                });
            }
        }
    }
    Ok(out)
}

/// The transaction that removes `doomed` (add-then-delete: an element a
/// concurrent DEL removed first must not fail the batch).
pub fn masq_del_changes(doomed: &[&MasqElement]) -> Vec<Change> {
    remove_changes(by_set(
        doomed
            .iter()
            .filter_map(|e| Some((e.set.clone(), parse_key(&e.key)?))),
    ))
}

/// Removes the masquerade elements of `owner` (and uncommented ones of
/// `addrs`), found by reading the table, so it works with no address known.
pub fn masq_del(owner: &str, addrs: &[IpNet]) -> Result<(), KernelError> {
    let mut conn = Conn::open()?;
    let els = masq_listing(&mut conn)?;
    let doomed = owned_elements(&els, owner, addrs);
    if doomed.is_empty() {
        return Ok(());
    }
    let mut changes = diff::ensure(&masq_table());
    changes.extend(masq_del_changes(&doomed));
    conn.apply(&masq_table(), &changes)
}

/// Whether a pod address is currently masqueraded (for CHECK).
pub fn masq_present(n: &IpNet) -> Result<bool, KernelError> {
    let set = if n.addr().is_ipv4() { "masq4" } else { "masq6" };
    let t = masq_table();
    Ok(Conn::open()?
        .elements(Family::Inet, MASQ_TABLE, set, &t.sets[set])?
        .is_some_and(|s| s.elements.contains_key(&vec![NftValue::Addr(n.addr())])))
}

/// Table `bridge podnet-cni` without elements: frames from a port in
/// `spoofports` must come from that port's MAC (`spoofok`), or are dropped.
pub fn spoof_table() -> Table {
    let mut t = Table::new(Family::Bridge, MASQ_TABLE);
    t.sets
        .insert("spoofports".into(), Set::new(vec![KeyType::IfName]));
    t.sets.insert(
        "spoofok".into(),
        Set::new(vec![KeyType::IfName, KeyType::EtherAddr]),
    );
    t.chains.insert(
        "prerouting".into(),
        Chain::base(ChainType::Filter, Hook::Prerouting, -300).with_rules(vec![Rule::new(vec![
            Expr::InSet {
                keys: vec![Field::IifName],
                set: "spoofports".into(),
                neg: false,
            },
            Expr::InSet {
                keys: vec![Field::IifName, Field::EtherSaddr],
                set: "spoofok".into(),
                neg: true,
            },
            Expr::Verdict(Verdict::Drop),
        ])]),
    );
    t
}

/// A MAC in `aa:bb:cc:dd:ee:ff` form.
fn mac_value(mac: &str) -> Result<NftValue, KernelError> {
    let b: Vec<u8> = mac
        .split(':')
        .filter_map(|x| u8::from_str_radix(x, 16).ok())
        .collect();
    let b: [u8; 6] = b.try_into().map_err(|_| KernelError::Netlink {
        op: format!("MAC spoof check for {mac}"),
        source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        detail: Some("not a MAC address".into()),
    })?;
    Ok(NftValue::Mac(b))
}

/// The elements of one port's spoof check: (set, key).
fn spoof_elements(
    port: &str,
    mac: Option<&str>,
) -> Result<Vec<(String, Vec<NftValue>)>, KernelError> {
    let p = NftValue::Name(port.to_string());
    let mut out = vec![("spoofports".to_string(), vec![p.clone()])];
    if let Some(m) = mac {
        out.push(("spoofok".to_string(), vec![p, mac_value(m)?]));
    }
    Ok(out)
}

/// The transaction [`macspoof_add`] applies.
pub fn macspoof_add_changes(port: &str, mac: &str) -> Result<Vec<Change>, KernelError> {
    let mut out = diff::ensure(&spoof_table());
    for (set, keys) in by_set(spoof_elements(port, Some(mac))?) {
        out.push(Change::AddElems {
            set,
            elems: keys.into_iter().map(|k| (k, None)).collect(),
        });
    }
    Ok(out)
}

/// Drops frames from `port` whose source MAC is not `mac`.
pub fn macspoof_add(port: &str, mac: &str) -> Result<(), KernelError> {
    Conn::open()?.apply(&spoof_table(), &macspoof_add_changes(port, mac)?)
}

/// Lifts the check for `port` (its `spoofok` element too, when the MAC is
/// known); removing twice is fine.
pub fn macspoof_del(port: &str, mac: Option<&str>) -> Result<(), KernelError> {
    let mut changes = diff::ensure(&spoof_table());
    changes.extend(remove_changes(by_set(spoof_elements(port, mac)?)));
    Conn::open()?.apply(&spoof_table(), &changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use podnet_nft::model::Proto;
    use podnet_nft::trace::{Fate, Packet, Tracer};

    fn nets(a: &[&str]) -> Vec<IpNet> {
        a.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn masq_of(t: &Table, src: &str, dst: &str) -> bool {
        Tracer::new(t)
            .incoming(&Packet::new(src, dst, Proto::Tcp, 80), &mut |_| 0)
            .masquerade
    }

    #[test]
    fn pods_leaving_their_subnet_are_masqueraded_and_pod_to_pod_is_not() {
        let mut t = masq_table();
        add_pod(&mut t, &nets(&["10.1.0.2/24", "fd00::2/64"]), "n/ctr");
        add_pod(&mut t, &nets(&["10.1.0.3/24"]), "n/other");
        assert!(masq_of(&t, "10.1.0.2", "8.8.8.8"), "pod to the world");
        assert!(masq_of(&t, "10.1.0.3", "10.2.0.1"), "another pod too");
        assert!(!masq_of(&t, "10.1.0.2", "10.1.0.3"), "pod to pod");
        assert!(!masq_of(&t, "10.1.0.2", "224.0.0.251"), "multicast");
        assert!(!masq_of(&t, "10.1.0.9", "8.8.8.8"), "not a pod of ours");
        assert!(
            masq_of(&t, "fd00::2", "2001:db8::1"),
            "IPv6 pod to the world"
        );
        assert!(!masq_of(&t, "fd00::2", "fd00::7"), "IPv6 pod to pod");
        assert!(!masq_of(&t, "fd00::2", "ff02::fb"), "IPv6 multicast");
        let r = t.render();
        assert!(
            r.contains("10.1.0.2 . 10.1.0.0/24 comment \"n/ctr\""),
            "{r}"
        );
    }

    #[test]
    fn adding_puts_each_element_in_place_with_its_owner() {
        let c = masq_add_changes(&nets(&["10.1.0.2/24"]), "n/ctr");
        let text = diff::render(&masq_table(), &c);
        assert!(text.starts_with("add table inet podnet-cni\n"), "{text}");
        for want in [
            "add element inet podnet-cni masq4 { 10.1.0.2 }\ndelete element inet podnet-cni masq4 { 10.1.0.2 }\nadd element inet podnet-cni masq4 { 10.1.0.2 comment \"n/ctr\" }",
            "add element inet podnet-cni nomasq4 { 10.1.0.2 . 10.1.0.0/24 comment \"n/ctr\" }",
            "add rule inet podnet-cni postrouting ip saddr @masq4 ip daddr != 224.0.0.0/4 masquerade",
        ] {
            assert!(text.contains(want), "{want} in\n{text}");
        }
        // Removal is add-then-delete of the owner's elements.
        let els = parse_masq_listing(LISTING);
        let c = masq_del_changes(&owned_elements(&els, "n/ctr", &[]));
        assert_eq!(diff::ops(&c), 8);
        assert!(c.contains(&Change::DelElems {
            set: "nomasq4".into(),
            keys: vec![vec![
                NftValue::Addr("10.1.0.2".parse().unwrap()),
                NftValue::Net("10.1.0.0/24".parse().unwrap())
            ]]
        }));
    }

    #[test]
    fn a_spoofed_source_mac_is_dropped() {
        let mut t = spoof_table();
        for c in macspoof_add_changes("veth1", "02:00:00:00:00:01").unwrap() {
            if let Change::AddElems { set, elems } = c {
                t.sets.get_mut(&set).unwrap().elements.extend(elems);
            }
        }
        let frame = |port: &str, mac: [u8; 6]| {
            Tracer::new(&t)
                .incoming(
                    &Packet::new("10.1.0.2", "10.1.0.3", Proto::Tcp, 80)
                        .on(port)
                        .from_mac(mac),
                    &mut |_| 0,
                )
                .fate
        };
        assert_eq!(frame("veth1", [2, 0, 0, 0, 0, 1]), Fate::Accept);
        assert_eq!(frame("veth1", [2, 0, 0, 0, 0, 9]), Fate::Drop, "spoofed");
        assert_eq!(
            frame("veth2", [2, 0, 0, 0, 0, 9]),
            Fate::Accept,
            "unchecked port"
        );
        assert!(macspoof_add_changes("veth1", "nonsense").is_err());
    }

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
