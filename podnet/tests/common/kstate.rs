//! The kernel state podnet owns on one lab node, as a comparable snapshot,
//! read through the CLI tools (`nft`, `ip`, `bridge`): independent
//! witnesses of what podnet wrote over netlink. Used to check that the
//! state after an upgrade or downgrade step is what a fresh start of the
//! same version makes (podnet/tests/upgrade.rs).
//!
//! A snapshot is a map from a key (what an entry is: a table's chain, a
//! route, a link, an FDB entry) to its canonical JSON, so two snapshots
//! diff entry by entry ([`diff`]). What is in it:
//! - every nftables table whose name starts with `podnet` (the agent's
//!   `podnet`, `podnet-masq`, `podnet-policy`, and the CNI plugins' own),
//!   from `nft -j list ruleset`: handles and counters dropped, set and map
//!   elements included and sorted, each chain's rules in order;
//! - routes (`ip -j route show table all`) that podnet installed (protocol
//!   112) or that lead through its VXLAN device, but for the IPv6
//!   link-local and multicast ones the kernel gives every link;
//! - the VXLAN and bridge links (kind, MTU, MAC, VXLAN id/port/local/
//!   learning) and their addresses;
//! - the VXLAN device's FDB entries and permanent neighbours.
//!
//! VTEP MACs are random per device, so a fresh start (which recreates the
//! device) changes them: every node's current VTEP MAC is replaced by
//! `vtep(<node>)` before comparing.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use podnet_testkit::command_in;
use serde_json::{json, Value};

/// The agent's nftables tables (what `agent --cleanup` removes).
pub const AGENT_TABLES: &[&str] = &["podnet", "podnet-masq", "podnet-policy", "podnet-guard"];
/// The table the policy plane added after the last release.
pub const POLICY_TABLE: &str = "podnet-policy";
/// The pod ports' anti-spoofing guard (`bridge podnet-guard`), which came
/// with the policy plane's fixes of issue 23.
pub const GUARD_TABLE: &str = "podnet-guard";

/// `s` without the tables a newer agent leaves behind for an older one
/// (the policy table and the port guard).
pub fn without_leftovers(s: &Snapshot) -> Snapshot {
    without_table(&without_table(s, GUARD_TABLE), POLICY_TABLE)
}
/// podnet's route protocol number (`RTPROT_PODNET`).
const RTPROT_PODNET: &str = "112";

/// One node's podnet kernel state: key → canonical JSON.
pub type Snapshot = BTreeMap<String, String>;

fn run_json(ns: &str, program: &str, args: &[&str]) -> Value {
    let out = command_in(ns, program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} {args:?} in {ns}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} in {ns}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    if text.trim().is_empty() {
        return json!([]);
    }
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{program} {args:?} in {ns}: not JSON ({e}): {text}"))
}

/// Drops what changes without the state changing: handles, counters'
/// values, expiry countdowns; sorts set elements.
fn normalise(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("handle");
            m.remove("expires");
            if let Some(c) = m.get_mut("counter") {
                *c = Value::Null;
            }
            for (_, x) in m.iter_mut() {
                normalise(x);
            }
            if let Some(Value::Array(elems)) = m.get_mut("elem") {
                elems.sort_by_key(|e| e.to_string());
            }
        }
        Value::Array(a) => a.iter_mut().for_each(normalise),
        _ => {}
    }
}

fn is_podnet_table(o: &Value) -> bool {
    o["table"].as_str().is_some_and(|t| t.starts_with("podnet"))
}

fn nft_entries(ns: &str, out: &mut Snapshot) {
    let v = run_json(ns, "nft", &["-j", "list", "ruleset"]);
    let mut rules: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for item in v["nftables"].as_array().into_iter().flatten() {
        let Some((kind, body)) = item.as_object().and_then(|o| o.iter().next()) else {
            continue;
        };
        let mut body = body.clone();
        normalise(&mut body);
        if let Some(o) = body
            .as_object_mut()
            .filter(|_| kind == "counter" || kind == "quota")
        {
            for k in ["packets", "bytes", "used"] {
                o.remove(k);
            }
        }
        let fam = body["family"].as_str().unwrap_or("?").to_string();
        match kind.as_str() {
            "metainfo" => {}
            "table" => {
                let name = body["name"].as_str().unwrap_or("?");
                if name.starts_with("podnet") {
                    out.insert(format!("nft {fam} {name}"), body.to_string());
                }
            }
            "rule" => {
                if is_podnet_table(&body) {
                    let key = format!(
                        "nft {fam} {} chain {} rules",
                        body["table"].as_str().unwrap_or("?"),
                        body["chain"].as_str().unwrap_or("?")
                    );
                    rules.entry(key).or_default().push(body);
                }
            }
            _ => {
                if is_podnet_table(&body) {
                    let key = format!(
                        "nft {fam} {} {kind} {}",
                        body["table"].as_str().unwrap_or("?"),
                        body["name"].as_str().unwrap_or("?")
                    );
                    out.insert(key, body.to_string());
                }
            }
        }
    }
    for (k, r) in rules {
        out.insert(k, Value::Array(r).to_string());
    }
}

/// The node's VXLAN and bridge links by name, from `ip -j -d link show`.
fn podnet_links(ns: &str) -> Vec<Value> {
    run_json(ns, "ip", &["-j", "-d", "link", "show"])
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|l| {
            matches!(
                l["linkinfo"]["info_kind"].as_str(),
                Some("vxlan") | Some("bridge")
            )
        })
        .collect()
}

/// The node's VTEP MAC (its VXLAN device's address), if it has one.
pub fn vtep_mac(ns: &str) -> Option<String> {
    podnet_links(ns)
        .into_iter()
        .find(|l| l["linkinfo"]["info_kind"] == "vxlan")
        .and_then(|l| l["address"].as_str().map(str::to_string))
}

/// An IPv6 link-local or multicast route: the kernel adds them to every
/// link once IPv6 configures it (after duplicate address detection, so
/// their presence is a matter of timing), and podnet has no part in them.
fn kernel_ipv6(r: &Value) -> bool {
    let dst = r["dst"].as_str().unwrap_or_default();
    let addr = dst.split('/').next().unwrap_or_default();
    match addr.parse::<std::net::Ipv6Addr>() {
        Ok(a) => a.is_multicast() || (a.segments()[0] & 0xffc0) == 0xfe80,
        Err(_) => false,
    }
}

/// Takes node `ns`'s snapshot; `vteps` maps each node's current VTEP MAC
/// to its name.
pub fn snapshot(ns: &str, vteps: &BTreeMap<String, String>) -> Snapshot {
    let mut out = Snapshot::new();
    nft_entries(ns, &mut out);
    let links = podnet_links(ns);
    let vxlan: BTreeSet<String> = links
        .iter()
        .filter(|l| l["linkinfo"]["info_kind"] == "vxlan")
        .filter_map(|l| l["ifname"].as_str().map(str::to_string))
        .collect();
    for l in &links {
        let name = l["ifname"].as_str().unwrap_or("?");
        let kind = l["linkinfo"]["info_kind"].as_str().unwrap_or("?");
        let d = &l["linkinfo"]["info_data"];
        let mut e = json!({
            "kind": kind,
            "mtu": l["mtu"],
            "address": l["address"],
            "up": l["flags"].as_array().is_some_and(|f| f.iter().any(|x| x == "UP")),
        });
        if kind == "vxlan" {
            e["vxlan"] = json!({
                "id": d["id"], "port": d["port"], "local": d["local"],
                "learning": d["learning"], "link": d["link"],
            });
        }
        out.insert(format!("link {name}"), e.to_string());
        let addrs = run_json(ns, "ip", &["-j", "addr", "show", "dev", name]);
        let mut a: Vec<String> = addrs[0]["addr_info"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["family"] == "inet" || a["scope"] != "link")
            .map(|a| format!("{}/{}", a["local"].as_str().unwrap_or("?"), a["prefixlen"]))
            .collect();
        a.sort();
        out.insert(format!("addr {name}"), json!(a).to_string());
    }
    for mut r in run_json(ns, "ip", &["-j", "route", "show", "table", "all"])
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let ours = r["protocol"].as_str() == Some(RTPROT_PODNET)
            || r["dev"].as_str().is_some_and(|d| vxlan.contains(d));
        if !ours || kernel_ipv6(&r) {
            continue;
        }
        normalise(&mut r);
        let key = format!(
            "route {} {} {}",
            r["table"].as_str().unwrap_or("main"),
            r["type"].as_str().unwrap_or("unicast"),
            r["dst"].as_str().unwrap_or("?")
        );
        out.insert(key, r.to_string());
    }
    for dev in &vxlan {
        for f in run_json(ns, "bridge", &["-j", "fdb", "show", "dev", dev])
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            let key = format!(
                "fdb {dev} {} {}",
                f["mac"].as_str().unwrap_or("?"),
                f["dst"].as_str().unwrap_or("-")
            );
            out.insert(
                key,
                json!({"state": f["state"], "flags": f["flags"]}).to_string(),
            );
        }
        for n in run_json(ns, "ip", &["-j", "neigh", "show", "dev", dev])
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            let permanent = n["state"]
                .as_array()
                .is_some_and(|s| s.iter().any(|x| x == "PERMANENT"));
            if permanent {
                let key = format!("neigh {dev} {}", n["dst"].as_str().unwrap_or("?"));
                out.insert(key, json!({"lladdr": n["lladdr"]}).to_string());
            }
        }
    }
    // VTEP MACs by node name, in keys and values.
    out.into_iter()
        .map(|(k, v)| {
            let (mut k, mut v) = (k, v);
            for (mac, node) in vteps {
                let sym = format!("vtep({node})");
                k = k.replace(mac.as_str(), &sym);
                v = v.replace(mac.as_str(), &sym);
            }
            (k, v)
        })
        .collect()
}

/// What is left of the agent's state in a snapshot: its tables, its
/// routes, its VXLAN device and what hangs off it (the bridge and the CNI
/// plugins' tables belong to the pods' CNI attachments, which stay).
pub fn agent_part(s: &Snapshot) -> Snapshot {
    s.iter()
        .filter(|(k, _)| {
            let table = k
                .strip_prefix("nft ")
                .and_then(|r| r.split(' ').nth(1))
                .map(|t| AGENT_TABLES.contains(&t));
            match table {
                Some(agent) => agent,
                None => {
                    k.starts_with("route ")
                        || k.starts_with("fdb ")
                        || k.starts_with("neigh ")
                        || k.starts_with("link podnet.")
                        || k.starts_with("addr podnet.")
                }
            }
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The entries of table `table` (any family).
pub fn table_part(s: &Snapshot, table: &str) -> Snapshot {
    s.iter()
        .filter(|(k, _)| {
            k.strip_prefix("nft ")
                .and_then(|r| r.split(' ').nth(1))
                .is_some_and(|t| t == table)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// `s` without table `table`.
pub fn without_table(s: &Snapshot, table: &str) -> Snapshot {
    let t = table_part(s, table);
    s.iter()
        .filter(|(k, _)| !t.contains_key(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn short(v: &str) -> String {
    match v.char_indices().nth(600) {
        Some((i, _)) => format!("{}… ({} bytes)", &v[..i], v.len()),
        None => v.to_string(),
    }
}

/// What differs between `want` and `got`, entry by entry; empty when
/// equal.
pub fn diff(want: &Snapshot, got: &Snapshot) -> String {
    let mut out = String::new();
    for (k, v) in want {
        match got.get(k) {
            None => writeln!(out, "  missing {k}: {}", short(v)).unwrap(),
            Some(g) if g != v => writeln!(
                out,
                "  changed {k}:\n    want {}\n    got  {}",
                short(v),
                short(g)
            )
            .unwrap(),
            _ => {}
        }
    }
    for (k, v) in got {
        if !want.contains_key(k) {
            writeln!(out, "  extra {k}: {}", short(v)).unwrap();
        }
    }
    out
}

/// How many entries of each kind a snapshot holds (per nft table, then
/// routes, links, addresses, FDB and neighbour entries).
pub fn summary(s: &Snapshot) -> String {
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for k in s.keys() {
        let w: Vec<&str> = k.split(' ').collect();
        let kind = match w[0] {
            "nft" => format!("{} {}", w[1], w.get(2).unwrap_or(&"?")),
            other => other.to_string(),
        };
        *by.entry(kind).or_default() += 1;
    }
    by.iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
