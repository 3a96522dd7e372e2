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
//! A dual-stack lab's underlay carries IPv6 too ([`underlay6`]: each
//! node's IPv4 address has a twin in `fd00:192:168:200::/64`, the gateway
//! `::1`, and the nodes an IPv6 default route to it), as a dual-stack
//! cluster's nodes do; the table counts IPv6 leaks as IPv4 ones. A
//! single-stack lab's nodes have link-local IPv6 addresses only.
//!
//! The table is planned as a typed [`Table`] ([`table`], pure), installed
//! over nf_tables netlink ([`sync_table`]) and read back over netlink too
//! (the named counter and the dynamic sets, [`leaks`]).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use podnet_kernel::rtnl::Route;
use podnet_kernel::{Handle, KernelError, Netns};
use podnet_nft::diff::Change;
use podnet_nft::model::{
    Chain, ChainType, Expr, Family, Field, Hook, KeyType, Rule, Set, Table, Value, Verdict,
};
use podnet_nft::netlink::Conn;

use crate::error::{msg, LabError};

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

/// Rack `rack`'s bridge in the underlay namespace (rack 1's is
/// [`BRIDGE`]).
pub fn bridge(rack: usize) -> String {
    format!("br{}", rack.saturating_sub(1))
}

/// Rack `rack`'s subnet: rack 1 is the [`underlay`], rack 2 the next /24.
pub fn rack_net(rack: usize) -> Ipv4Net {
    let o = underlay().network().octets();
    let third = o[2].saturating_add(rack.saturating_sub(1) as u8);
    Ipv4Net::new(Ipv4Addr::new(o[0], o[1], third, 0), 24).expect("prefix")
}

/// Which rack node `index` is in: with two racks, odd nodes in rack 1 and
/// even ones in rack 2.
pub fn rack_of(racks: usize, index: usize) -> usize {
    if racks > 1 && index.is_multiple_of(2) {
        2
    } else {
        1
    }
}

/// Node `index`'s address in rack `rack` (node1 is .11).
pub fn node_ip_in(rack: usize, index: usize) -> Result<Ipv4Addr, LabError> {
    let ip = node_ip(index)?.octets();
    let net = rack_net(rack).network().octets();
    Ok(Ipv4Addr::new(net[0], net[1], net[2], ip[3]))
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

/// Rack `rack`'s IPv6 underlay in a dual-stack lab: its IPv4 subnet
/// written into `fd00:192:168:200::/64` (rack 2: `…:201::/64`).
pub fn underlay6(rack: usize) -> Ipv6Net {
    let third = u16::from(rack_net(rack).network().octets()[2]);
    Ipv6Net::new(
        Ipv6Addr::new(0xfd00, 0x192, 0x168, hexish(third), 0, 0, 0, 0),
        64,
    )
    .expect("prefix")
}

/// A decimal number shown as the same digits in hex (200 → 0x200), so an
/// IPv6 twin reads like its IPv4 address.
fn hexish(n: u16) -> u16 {
    u16::from_str_radix(&n.to_string(), 16).expect("at most 3 decimal digits")
}

/// The IPv6 twin of underlay address `ip` (192.168.200.11 →
/// fd00:192:168:200::11).
pub fn twin6(ip: Ipv4Addr) -> Ipv6Addr {
    let o = ip.octets();
    let net = underlay6(if o[2] == underlay().network().octets()[2] {
        1
    } else {
        2
    });
    let s = net.network().segments();
    Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, hexish(u16::from(o[3])))
}

/// The IPv6 default route of a dual-stack lab's rack-1 node whose
/// underlay link is `index`.
pub fn default_route6(index: u32) -> Route {
    Route {
        dst: None,
        gateway: Some(IpAddr::V6(twin6(gateway()))),
        oif: Some(index),
        ..Default::default()
    }
}

/// The named counter every leaked packet counts in.
const COUNTER: &str = "leaked";
/// The sets of leaked (source, destination) pairs, per family.
const FLOW_SETS: [&str; 2] = ["leaked-v4", "leaked-v6"];

/// The leak table: frames sent to the gateway's MAC on its underlay port
/// but not addressed to it are counted in a named counter, their (source,
/// destination) pairs noted in a dynamic set per family, then dropped.
pub fn table() -> Table {
    let mut t = Table::new(Family::Inet, TABLE);
    t.counters.insert(COUNTER.into());
    for (name, addr) in FLOW_SETS.iter().zip([KeyType::Ipv4Addr, KeyType::Ipv6Addr]) {
        let mut s = Set::new(vec![addr, addr]);
        s.dynamic = true;
        s.size = Some(65535);
        t.sets.insert(name.to_string(), s);
    }
    let cmp = |field, value| Expr::Cmp {
        field,
        neg: false,
        value,
    };
    t.chains.insert(
        "prerouting".into(),
        // Priority -300: raw.
        Chain::base(ChainType::Filter, Hook::Prerouting, -300).with_rules(vec![Rule::new(vec![
            cmp(Field::IifName, Value::Name(IFACE.into())),
            cmp(Field::PktType, Value::U8(0)), // host
            Expr::FibDaddrNotLocal,
            Expr::Verdict(Verdict::Goto("leaked".into())),
        ])]),
    );
    let mut leaked = vec![Rule::new(vec![Expr::CounterRef(COUNTER.into())])];
    for (set, nfproto, (s, d)) in [
        (FLOW_SETS[0], 2, (Field::IpSaddr, Field::IpDaddr)),
        (FLOW_SETS[1], 10, (Field::Ip6Saddr, Field::Ip6Daddr)),
    ] {
        leaked.push(Rule::new(vec![
            cmp(Field::NfProto, Value::U8(nfproto)),
            Expr::AddSet {
                keys: vec![s, d],
                set: set.into(),
            },
        ]));
    }
    leaked.push(Rule::new(vec![Expr::Verdict(Verdict::Drop)]));
    t.chains.insert(
        "leaked".into(),
        Chain {
            base: None,
            rules: leaked,
        },
    );
    t
}

/// Installs (or repairs) the leak table in the calling thread's namespace;
/// returns what it changed. The count and the flows seen survive a repair.
pub fn sync_table() -> Result<Vec<Change>, KernelError> {
    Conn::open()?.sync(&table())
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
pub fn install(under: &Netns, gw: &Netns, dual_stack: bool) -> Result<(), LabError> {
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
        sync_table()?;
        Ok(())
    })??;
    let mut gh = Handle::in_netns(gw)?;
    let e = gh.require_link(IFACE)?;
    gh.add_addr(
        e.index,
        ipnet::IpNet::V4(Ipv4Net::new(gateway(), underlay().prefix_len()).expect("prefix")),
        true,
    )?;
    if dual_stack {
        gh.add_addr(
            e.index,
            ipnet::IpNet::V6(Ipv6Net::new(twin6(gateway()), 64).expect("prefix")),
            true,
        )?;
    }
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
    ns.run(leaks_here)?
}

/// Reads the leak table in the calling thread's namespace, over netlink.
pub fn leaks_here() -> Result<Leaks, LabError> {
    let mut c = Conn::open()?;
    let (packets, _) = c
        .counter(Family::Inet, TABLE, COUNTER)?
        .ok_or_else(|| msg(format!("no counter \"{COUNTER}\" in table inet {TABLE}")))?;
    let t = table();
    let mut l = Leaks {
        packets,
        flows: BTreeSet::new(),
    };
    for name in FLOW_SETS {
        let Some(set) = c.elements(Family::Inet, TABLE, name, &t.sets[name])? else {
            continue;
        };
        for k in set.elements.keys() {
            if let [Value::Addr(src), Value::Addr(dst)] = k[..] {
                l.flows.insert((src, dst));
            }
        }
    }
    Ok(l)
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
        assert_eq!(twin6(gateway()).to_string(), "fd00:192:168:200::1");
        assert_eq!(
            twin6(node_ip_in(2, 4).unwrap()).to_string(),
            "fd00:192:168:201::14"
        );
        assert!(underlay6(1).contains(&twin6(node_ip(1).unwrap())));
    }

    #[test]
    fn only_frames_for_the_gateway_mac_not_for_it_are_counted_and_dropped() {
        use podnet_nft::model::Proto;
        use podnet_nft::trace::{Fate, Packet, Tracer};
        let t = table();
        let mut tr = Tracer::new(&t).with_local(&["192.168.200.1"]);
        let leak = Packet::new("192.168.200.11", "198.51.100.7", Proto::Udp, 53).on("eth0");
        let o = tr.incoming(&leak, &mut |_| 0);
        assert_eq!(o.fate, Fate::Drop);
        assert_eq!(o.path, ["prerouting", "leaked"]);
        let v6 = Packet::new("fd00::11", "2001:db8::7", Proto::Tcp, 80).on("eth0");
        assert_eq!(tr.incoming(&v6, &mut |_| 0).fate, Fate::Drop);
        assert_eq!(tr.counters[COUNTER], 2);
        // For the gateway itself, not to its MAC, or from elsewhere: untouched.
        let mine = Packet::new("192.168.200.11", "192.168.200.1", Proto::Udp, 53).on("eth0");
        let mut broadcast = leak.clone();
        broadcast.pkttype = 1;
        for p in [mine, broadcast, leak.clone().on("lo")] {
            assert_eq!(tr.incoming(&p, &mut |_| 0).fate, Fate::Accept, "{p:?}");
        }
        assert_eq!(tr.counters[COUNTER], 2);
        let r = t.render();
        assert!(
            r.contains("iifname \"eth0\" meta pkttype 0 fib daddr type != local goto leaked"),
            "{r}"
        );
        assert!(r.contains("counter name \"leaked\""));
    }
}
