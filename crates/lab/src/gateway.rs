//! The underlay and its gateway: where a lab node's default route points.
//!
//! A real node has a default route, so traffic nothing on the node handles
//! leaves it instead of failing locally with "network unreachable". Lab
//! nodes get the same: a default route via [`gateway`], the address of a
//! namespace `pn-<lab>-gw` plugged into the underlay bridge like a node
//! (its own namespace, so the underlay namespace stays a plain switch where
//! tests can put "outside" clients with addresses of their own).
//!
//! The gateway is a dead end: neither it nor the underlay namespace forwards
//! (IPv4 and IPv6 forwarding are switched off explicitly), neither has an
//! uplink, and an nftables table in the gateway counts and drops every
//! packet that is sent to the gateway's MAC but is not for the gateway.
//! Tests read that count with [`crate::Lab::gateway_leaks`] to tell
//! "dropped on the node" (count unchanged) from "left the node unhandled"
//! (count grew, with the flow).
//!
//! The underlay is IPv4 only (nodes have link-local IPv6 addresses and no
//! IPv6 routes); the table counts IPv6 too, should that change.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

use ipnet::Ipv4Net;
use podnet_kernel::rtnl::Route;
use podnet_kernel::{Handle, Netns};

use crate::{io, msg, LabError};

/// The underlay bridge in the underlay namespace.
pub const BRIDGE: &str = "br0";
/// The gateway's port on the bridge; its end in the gateway is `eth0`.
pub const PORT: &str = "to-gw";
const IFACE: &str = "eth0";
/// The nftables table in the gateway namespace that counts leaks.
pub const TABLE: &str = "podnet-lab-gateway";

/// The underlay network every node's `eth0` is on.
pub fn underlay() -> Ipv4Net {
    Ipv4Net::new(Ipv4Addr::new(192, 168, 200, 0), 24).expect("prefix")
}

/// The underlay's first host address: the nodes' default gateway.
pub fn gateway() -> Ipv4Addr {
    host(1)
}

/// Node `index`'s underlay address (node1 is .11).
pub fn node_ip(index: usize) -> Result<Ipv4Addr, LabError> {
    u8::try_from(10 + index)
        .ok()
        .filter(|h| *h < 255)
        .map(host)
        .ok_or_else(|| msg(format!("node{index}: no underlay address left")))
}

fn host(n: u8) -> Ipv4Addr {
    let o = underlay().network().octets();
    Ipv4Addr::new(o[0], o[1], o[2], n)
}

/// The leak table as an `nft -f` script: a named counter, a set of the
/// (source, destination) pairs seen per family, then drop.
pub fn script() -> String {
    let t = TABLE;
    format!(
        "table inet {t} {{\n\
         \tcounter leaked {{ }}\n\
         \tset leaked-v4 {{ type ipv4_addr . ipv4_addr; size 65535; flags dynamic; }}\n\
         \tset leaked-v6 {{ type ipv6_addr . ipv6_addr; size 65535; flags dynamic; }}\n\
         \tchain prerouting {{\n\
         \t\ttype filter hook prerouting priority raw; policy accept;\n\
         \t\tiifname \"{IFACE}\" meta pkttype host fib daddr type != local goto leaked\n\
         \t}}\n\
         \tchain leaked {{\n\
         \t\tcounter name \"leaked\"\n\
         \t\tmeta nfproto ipv4 add @leaked-v4 {{ ip saddr . ip daddr }}\n\
         \t\tmeta nfproto ipv6 add @leaked-v6 {{ ip6 saddr . ip6 daddr }}\n\
         \t\tdrop\n\
         \t}}\n\
         }}\n"
    )
}

/// Switches IPv4 and IPv6 forwarding off in the calling thread's namespace.
fn no_forwarding() -> Result<(), LabError> {
    use podnet_kernel::netns::write_sysctl;
    write_sysctl("net.ipv4.ip_forward", "0")?;
    if std::path::Path::new("/proc/sys/net/ipv6").exists() {
        write_sysctl("net.ipv6.conf.all.forwarding", "0")?;
    }
    Ok(())
}

/// The underlay namespace `under` (its bridge made) as a switch that routes
/// nothing, and `gw` as the gateway on it: the gateway address, no
/// forwarding in either, and the leak table.
pub fn install(under: &Netns, gw: &Netns) -> Result<(), LabError> {
    under.run(|| -> Result<(), LabError> {
        no_forwarding()?;
        // Frames bridged between nodes stay out of this namespace's IP
        // hooks (absent without br_netfilter, which is fine).
        for k in [
            "net.bridge.bridge-nf-call-iptables",
            "net.bridge.bridge-nf-call-ip6tables",
            "net.bridge.bridge-nf-call-arptables",
        ] {
            let _ = podnet_kernel::netns::write_sysctl(k, "0");
        }
        Ok(())
    })??;
    let mut uh = Handle::in_netns(under)?;
    uh.create_veth(PORT, IFACE, Some(gw.fd()), None, None)?;
    let br = uh.require_link(BRIDGE)?;
    let p = uh.require_link(PORT)?;
    uh.set_master(p.index, br.index)?;
    uh.set_up(p.index)?;
    gw.run(|| -> Result<(), LabError> {
        no_forwarding()?;
        nft(&["-f", "-"], Some(&script()))?;
        Ok(())
    })??;
    let mut gh = Handle::in_netns(gw)?;
    let e = gh.require_link(IFACE)?;
    gh.add_addr(
        e.index,
        ipnet::IpNet::V4(Ipv4Net::new(gateway(), underlay().prefix_len()).expect("prefix")),
        true,
    )?;
    gh.set_up(e.index)?;
    Ok(())
}

/// The default route of a node whose underlay link is `index`.
pub fn default_route(index: u32) -> Route {
    Route {
        dst: None,
        gateway: Some(IpAddr::V4(gateway())),
        oif: Some(index),
        ..Default::default()
    }
}

/// What reached the gateway and was dropped there: packets that left a
/// node because nothing on it handled them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leaks {
    /// Packets counted since the lab came up.
    pub packets: u64,
    /// Their (source, destination) pairs, as they left the node (after the
    /// node's masquerade).
    pub flows: BTreeSet<(IpAddr, IpAddr)>,
}

/// Reads the leak table in the gateway namespace `ns`.
pub fn leaks(ns: &Netns) -> Result<Leaks, LabError> {
    let out = ns.run(|| nft(&["-j", "list", "table", "inet", TABLE], None))??;
    parse_leaks(&out)
}

fn parse_leaks(json: &str) -> Result<Leaks, LabError> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| msg(format!("nft -j output: {e}")))?;
    let mut l = Leaks::default();
    let mut found = false;
    for o in v["nftables"].as_array().into_iter().flatten() {
        if let Some(c) = o.get("counter").filter(|c| c["name"] == "leaked") {
            l.packets = c["packets"].as_u64().unwrap_or(0);
            found = true;
        }
        if let Some(s) = o
            .get("set")
            .filter(|s| s["name"].as_str().is_some_and(|n| n.starts_with("leaked-")))
        {
            for e in s["elem"].as_array().into_iter().flatten() {
                // Plain `{"concat": [..]}`, or wrapped when elements carry
                // metadata: `{"elem": {"val": {"concat": [..]}}}`.
                let c = e.get("elem").map(|x| &x["val"]).unwrap_or(e);
                let pair: Vec<IpAddr> = c["concat"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|a| a.as_str()?.parse().ok())
                    .collect();
                if let [src, dst] = pair[..] {
                    l.flows.insert((src, dst));
                }
            }
        }
    }
    if !found {
        return Err(msg(format!("no counter \"leaked\" in table inet {TABLE}")));
    }
    Ok(l)
}

/// Runs `nft ARGS` in the calling thread's namespace, with `stdin` fed in.
fn nft(args: &[&str], stdin: Option<&str>) -> Result<String, LabError> {
    use std::io::Write;
    use std::process::Stdio;
    let what = || format!("nft {}", args.join(" "));
    let mut child = Command::new("nft")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| io(what(), e))?;
    let mut pipe = child.stdin.take().expect("piped stdin");
    if let Some(s) = stdin {
        pipe.write_all(s.as_bytes()).map_err(|e| io(what(), e))?;
    }
    drop(pipe);
    let out = child.wait_with_output().map_err(|e| io(what(), e))?;
    if !out.status.success() {
        return Err(msg(format!(
            "{}: {}",
            what(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_derive_from_the_underlay() {
        assert_eq!(gateway(), Ipv4Addr::new(192, 168, 200, 1));
        assert_eq!(node_ip(1).unwrap(), Ipv4Addr::new(192, 168, 200, 11));
        assert!(underlay().contains(&node_ip(244).unwrap()));
        assert!(node_ip(245).is_err(), "the broadcast address is no node's");
        assert_eq!(default_route(7).gateway, Some(IpAddr::V4(gateway())));
    }

    #[test]
    fn leaks_parse_from_nft_json() {
        let j = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
            {"table": {"family": "inet", "name": "podnet-lab-gateway", "handle": 1}},
            {"counter": {"family": "inet", "name": "leaked", "table": "podnet-lab-gateway", "packets": 4, "bytes": 288}},
            {"set": {"family": "inet", "name": "leaked-v4", "type": ["ipv4_addr", "ipv4_addr"],
                     "elem": [{"concat": ["192.168.200.11", "198.51.100.7"]},
                              {"elem": {"val": {"concat": ["192.168.200.12", "198.51.100.8"]}, "expires": 1}}]}},
            {"set": {"family": "inet", "name": "leaked-v6", "type": ["ipv6_addr", "ipv6_addr"]}}]}"#;
        let l = parse_leaks(j).unwrap();
        assert_eq!(l.packets, 4);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            l.flows,
            BTreeSet::from([
                (ip("192.168.200.11"), ip("198.51.100.7")),
                (ip("192.168.200.12"), ip("198.51.100.8")),
            ])
        );
        assert!(parse_leaks(r#"{"nftables": []}"#).is_err());
    }

    #[test]
    fn script_counts_only_frames_for_the_gateway_mac_not_for_it() {
        let s = script();
        assert!(
            s.contains("iifname \"eth0\" meta pkttype host fib daddr type != local goto leaked")
        );
        assert!(s.contains("counter name \"leaked\""));
        assert!(s.trim_end().ends_with("drop\n\t}\n}"));
    }
}
