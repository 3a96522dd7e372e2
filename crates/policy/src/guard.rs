//! The anti-spoofing guard's plan (pure): table `bridge podnet-guard`,
//! which lets a frame from a pod's port into the pod bridge only when it
//! speaks with the pod's own addresses, so that a policy that trusts a
//! source address can trust it (Calico and Cilium enforce the same per
//! pod).
//!
//! The facts come from the CNI ADD, never from inside the pod (a pod can
//! change its own addresses): the host side of the pod's veth (the bridge
//! port), the pod's MAC and its IPAM addresses ([`Port`]). The chains never
//! change with the pods; each port is elements in four sets:
//!
//! | set | key | holds |
//! |---|---|---|
//! | `port-mac` | port . mac | the port's pod MAC |
//! | `port-ip4` | port . ipv4 | its IPv4 addresses |
//! | `port-arp` | port . mac . ipv4 | ARP it may send: its MAC at its address |
//! | `port-ip6` | port . ipv6 | its IPv6 addresses |
//!
//! A frame entering a bridge from a pod's port is dropped (and counted
//! in [`COUNTER`]) unless its source MAC is the port's; then IPv4 must come
//! from the port's IPv4 addresses, ARP must announce the port's own MAC at
//! the port's own address (no answering for another pod), and IPv6 must
//! come from the port's IPv6 addresses, or from a link-local or the
//! unspecified address to a multicast group (neighbour and router
//! solicitation, MLD, duplicate address detection); a neighbour
//! advertisement must name one of the port's own IPv6 addresses, and a pod
//! never sends router advertisements or redirects. Without an IPv6 network
//! no IPv6 leaves a pod at all (no policy judges it). Every other ether
//! type, a VLAN tag included, is dropped. A port the guard does not know
//! (not programmed yet) has no MAC element: fail closed.
//!
//! Which ports are pods': those in netdev group [`PORT_GROUP`], where the
//! `podnet` CNI plugin puts the host side of every pod's veth (through its
//! bridge delegate's `podnetPortGroup`) before the pod runs. (Matching the
//! bridge itself, `meta ibrname`, needs the kernel's bridge meta module,
//! which not every kernel has.) Frames the node sends into the bridge, and
//! ports outside the group (another bridge's, a container runtime's own),
//! are not the guard's business.

use std::net::IpAddr;

use podnet_nft::model::{
    Chain, ChainType, Expr, Family, Field, Hook, KeyType, Rule, Set, Table, Value, Verdict,
};

/// The table's name (family `bridge`).
pub const TABLE: &str = "podnet-guard";
/// The netdev group of pods' ports (`podnet_cni`'s meta plugin puts them
/// there: the same number, "pn").
pub const PORT_GROUP: u32 = 0x706e;
/// Frames the guard dropped.
pub const COUNTER: &str = "spoofed";

const SET_MAC: &str = "port-mac";
const SET_IP4: &str = "port-ip4";
const SET_ARP: &str = "port-arp";
const SET_IP6: &str = "port-ip6";

/// ICMPv6 types the guard looks at.
const ICMP6_RA: u8 = 134;
const ICMP6_NA: u8 = 136;
const ICMP6_REDIRECT: u8 = 137;
const ICMPV6: u8 = 58;

/// A pod's bridge port and the addresses it may use, as the CNI ADD
/// recorded them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Port {
    /// The host side of the pod's veth.
    pub port: String,
    pub mac: [u8; 6],
    pub ips: Vec<IpAddr>,
}

fn cmp(field: Field, value: Value) -> Expr {
    Expr::Cmp {
        field,
        neg: false,
        value,
    }
}

fn in_set(keys: Vec<Field>, set: &str, neg: bool) -> Expr {
    Expr::InSet {
        keys,
        set: set.into(),
        neg,
    }
}

fn verdict(v: Verdict) -> Expr {
    Expr::Verdict(v)
}

fn deny() -> Expr {
    verdict(Verdict::Goto("deny".into()))
}

fn net(s: &str) -> Value {
    Value::Net(s.parse().expect("net"))
}

/// The IPv6 chain: with an IPv6 network, a pod's own addresses, and
/// link-local or unspecified sources to multicast only; without, nothing.
fn ip6_rules(ipv6: bool) -> Vec<Rule> {
    if !ipv6 {
        return vec![Rule::new(vec![deny()])];
    }
    let icmp = |t: u8| {
        vec![
            cmp(Field::L4Proto, Value::U8(ICMPV6)),
            cmp(Field::Icmp6Type, Value::U8(t)),
        ]
    };
    let mut na = icmp(ICMP6_NA);
    na.extend([
        in_set(vec![Field::IifName, Field::NdTarget], SET_IP6, true),
        deny(),
    ]);
    let mut ra = icmp(ICMP6_RA);
    ra.push(deny());
    let mut redirect = icmp(ICMP6_REDIRECT);
    redirect.push(deny());
    let mut rules = vec![Rule::new(ra), Rule::new(redirect), Rule::new(na)];
    rules.push(Rule::new(vec![
        in_set(vec![Field::IifName, Field::Ip6Saddr], SET_IP6, false),
        verdict(Verdict::Accept),
    ]));
    for src in ["fe80::/10", "::/128"] {
        rules.push(Rule::new(vec![
            cmp(Field::Ip6Saddr, net(src)),
            cmp(Field::Ip6Daddr, net("ff00::/8")),
            verdict(Verdict::Accept),
        ]));
    }
    rules.push(Rule::new(vec![deny()]));
    rules
}

/// The table with its chains and empty sets; `ipv6` when the cluster has
/// an IPv6 network.
pub fn skeleton(ipv6: bool) -> Table {
    let mut t = Table::new(Family::Bridge, TABLE);
    let (ifn, mac) = (KeyType::IfName, KeyType::EtherAddr);
    for (name, key) in [
        (SET_MAC, vec![ifn, mac]),
        (SET_IP4, vec![ifn, KeyType::Ipv4Addr]),
        (SET_ARP, vec![ifn, mac, KeyType::Ipv4Addr]),
        (SET_IP6, vec![ifn, KeyType::Ipv6Addr]),
    ] {
        t.sets.insert(name.into(), Set::new(key));
    }
    t.counters.insert(COUNTER.into());
    let goto = |c: &str| verdict(Verdict::Goto(c.into()));
    t.chains.insert(
        "prerouting".into(),
        // Before anything else on the bridge looks at the frame.
        Chain::base(ChainType::Filter, Hook::Prerouting, -300).with_rules(vec![
            Rule::new(vec![
                Expr::Cmp {
                    field: Field::IifGroup,
                    neg: true,
                    value: Value::U32(PORT_GROUP),
                },
                verdict(Verdict::Accept),
            ]),
            Rule::new(vec![
                in_set(vec![Field::IifName, Field::EtherSaddr], SET_MAC, true),
                deny(),
            ]),
            Rule::new(vec![cmp(Field::EtherType, Value::U16(0x0800)), goto("ip4")]),
            Rule::new(vec![cmp(Field::EtherType, Value::U16(0x0806)), goto("arp")]),
            Rule::new(vec![cmp(Field::EtherType, Value::U16(0x86dd)), goto("ip6")]),
            Rule::new(vec![deny()]),
        ]),
    );
    let own = |keys: Vec<Field>, set: &str| {
        vec![
            Rule::new(vec![in_set(keys, set, false), verdict(Verdict::Accept)]),
            Rule::new(vec![deny()]),
        ]
    };
    let chain = |rules| Chain { base: None, rules };
    t.chains.insert(
        "ip4".into(),
        chain(own(vec![Field::IifName, Field::IpSaddr], SET_IP4)),
    );
    t.chains.insert(
        "arp".into(),
        chain(own(
            vec![Field::IifName, Field::ArpSha, Field::ArpSpa],
            SET_ARP,
        )),
    );
    t.chains.insert("ip6".into(), chain(ip6_rules(ipv6)));
    t.chains.insert(
        "deny".into(),
        chain(vec![Rule::new(vec![
            Expr::CounterRef(COUNTER.into()),
            verdict(Verdict::Drop),
        ])]),
    );
    t
}

/// Adds a port's elements to `t`.
pub fn fill(t: &mut Table, p: &Port) {
    let name = Value::Name(p.port.clone());
    let mac = Value::Mac(p.mac);
    let mut add = |set: &str, key: Vec<Value>| {
        if let Some(s) = t.sets.get_mut(set) {
            s.elements.insert(key, None);
        }
    };
    add(SET_MAC, vec![name.clone(), mac.clone()]);
    for ip in &p.ips {
        match ip {
            IpAddr::V4(_) => {
                add(SET_IP4, vec![name.clone(), Value::Addr(*ip)]);
                add(SET_ARP, vec![name.clone(), mac.clone(), Value::Addr(*ip)]);
            }
            IpAddr::V6(_) => add(SET_IP6, vec![name.clone(), Value::Addr(*ip)]),
        }
    }
}

/// The whole table for these ports.
pub fn table<'a>(ipv6: bool, ports: impl IntoIterator<Item = &'a Port>) -> Table {
    let mut t = skeleton(ipv6);
    for p in ports {
        fill(&mut t, p);
    }
    t
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for b in out.iter_mut() {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use podnet_nft::model::Proto;
    use podnet_nft::trace::{Fate, Packet, Tracer, ETH_VLAN};

    const A_MAC: [u8; 6] = [0x0a, 0x58, 10, 244, 1, 2];
    const C_MAC: [u8; 6] = [0x0a, 0x58, 10, 244, 1, 4];

    fn ports() -> Vec<Port> {
        vec![
            Port {
                port: "vethA".into(),
                mac: A_MAC,
                ips: vec!["10.244.1.2".parse().unwrap(), "fd00::2".parse().unwrap()],
            },
            Port {
                port: "vethC".into(),
                mac: C_MAC,
                ips: vec!["10.244.1.4".parse().unwrap(), "fd00::4".parse().unwrap()],
            },
        ]
    }

    fn fate(t: &Table, p: &Packet) -> Fate {
        let mut tr = Tracer::new(t);
        let o = tr.incoming(p, &mut |_| 0);
        if o.fate == Fate::Drop {
            assert_eq!(tr.counters.get(COUNTER), Some(&1), "{p:?}: counted");
        }
        o.fate
    }

    fn ip(src: &str, dst: &str, port: &str, mac: [u8; 6]) -> Packet {
        Packet::new(src, dst, Proto::Tcp, 80).bridged(PORT_GROUP, port, mac)
    }

    #[test]
    fn a_pod_sends_only_from_its_own_ipv4_and_mac() {
        let t = table(false, &ports());
        assert_eq!(
            fate(&t, &ip("10.244.1.4", "10.244.1.3", "vethC", C_MAC)),
            Fate::Accept
        );
        // c with a's address, with its own MAC or with a's.
        assert_eq!(
            fate(&t, &ip("10.244.1.2", "10.244.1.3", "vethC", C_MAC)),
            Fate::Drop
        );
        assert_eq!(
            fate(&t, &ip("10.244.1.2", "10.244.1.3", "vethC", A_MAC)),
            Fate::Drop
        );
        assert_eq!(
            fate(&t, &ip("10.244.1.4", "10.244.1.3", "vethC", A_MAC)),
            Fate::Drop
        );
        // a itself keeps its traffic.
        assert_eq!(
            fate(&t, &ip("10.244.1.2", "10.244.1.3", "vethA", A_MAC)),
            Fate::Accept
        );
        // A port nobody programmed: fail closed.
        assert_eq!(
            fate(&t, &ip("10.244.1.9", "10.244.1.3", "vethX", [2; 6])),
            Fate::Drop
        );
        // A port outside the group is not the guard's business.
        let mut other = ip("10.244.1.2", "10.244.1.3", "vethC", C_MAC);
        other.extra.iif_group = 0;
        assert_eq!(fate(&t, &other), Fate::Accept);
    }

    #[test]
    fn arp_announces_only_the_pods_own_mac_at_its_own_address() {
        let t = table(false, &ports());
        let a4 = "10.244.1.2".parse().unwrap();
        let c4 = "10.244.1.4".parse().unwrap();
        let arp = |port, mac, sha, spa| Packet::arp(PORT_GROUP, port, mac, sha, spa);
        assert_eq!(fate(&t, &arp("vethC", C_MAC, C_MAC, c4)), Fate::Accept);
        assert_eq!(fate(&t, &arp("vethA", A_MAC, A_MAC, a4)), Fate::Accept);
        // Gratuitous ARP for a's address from c, in every disguise.
        assert_eq!(fate(&t, &arp("vethC", C_MAC, C_MAC, a4)), Fate::Drop);
        assert_eq!(fate(&t, &arp("vethC", C_MAC, A_MAC, a4)), Fate::Drop);
        assert_eq!(fate(&t, &arp("vethC", A_MAC, A_MAC, a4)), Fate::Drop);
        assert_eq!(fate(&t, &arp("vethC", C_MAC, A_MAC, c4)), Fate::Drop);
    }

    #[test]
    fn other_ether_types_and_vlan_tags_are_dropped() {
        let t = table(true, &ports());
        for ty in [ETH_VLAN, 0x88cc, 0x8863] {
            let mut p = ip("10.244.1.4", "10.244.1.3", "vethC", C_MAC);
            p.extra.ether_type = Some(ty);
            assert_eq!(fate(&t, &p), Fate::Drop, "ether type {ty:#x}");
        }
    }

    #[test]
    fn no_ipv6_network_no_ipv6_from_pods() {
        let t = table(false, &ports());
        for (src, dst) in [
            ("fe80::4", "fe80::3"),
            ("fd00::4", "fd00::3"),
            ("fe80::4", "ff02::1"),
        ] {
            assert_eq!(fate(&t, &ip(src, dst, "vethC", C_MAC)), Fate::Drop, "{src}");
        }
    }

    fn icmp6(src: &str, dst: &str, ty: u8, target: Option<&str>) -> Packet {
        let mut p = ip(src, dst, "vethC", C_MAC);
        p.extra.icmp6 = Some((ty, target.map(|t| t.parse().unwrap())));
        p
    }

    #[test]
    fn ipv6_from_own_addresses_and_link_local_to_multicast_only() {
        let t = table(true, &ports());
        assert_eq!(
            fate(&t, &ip("fd00::4", "fd00::3", "vethC", C_MAC)),
            Fate::Accept
        );
        // Spoofed, and link-local to another pod.
        assert_eq!(
            fate(&t, &ip("fd00::2", "fd00::3", "vethC", C_MAC)),
            Fate::Drop
        );
        assert_eq!(
            fate(&t, &ip("fe80::4", "fe80::3", "vethC", C_MAC)),
            Fate::Drop
        );
        // Neighbour and router solicitation, DAD, MLD.
        let ns = icmp6("fe80::4", "ff02::1:ff00:3", 135, Some("fd00::3"));
        assert_eq!(fate(&t, &ns), Fate::Accept);
        assert_eq!(
            fate(&t, &icmp6("::", "ff02::1:ff00:4", 135, Some("fd00::4"))),
            Fate::Accept
        );
        assert_eq!(
            fate(&t, &icmp6("fe80::4", "ff02::2", 133, None)),
            Fate::Accept
        );
        // Advertisements: only for its own address; no RA, no redirect.
        let na = |src, dst, target| icmp6(src, dst, 136, Some(target));
        assert_eq!(fate(&t, &na("fd00::4", "fd00::3", "fd00::4")), Fate::Accept);
        assert_eq!(fate(&t, &na("fd00::4", "ff02::1", "fd00::2")), Fate::Drop);
        assert_eq!(fate(&t, &na("fe80::4", "ff02::1", "fd00::2")), Fate::Drop);
        assert_eq!(
            fate(&t, &icmp6("fe80::4", "ff02::1", 134, None)),
            Fate::Drop
        );
        assert_eq!(
            fate(&t, &icmp6("fd00::4", "fd00::3", 137, None)),
            Fate::Drop
        );
    }

    #[test]
    fn macs_parse() {
        assert_eq!(
            parse_mac("0a:58:0a:f4:01:02"),
            Some([0x0a, 0x58, 10, 244, 1, 2])
        );
        assert_eq!(parse_mac("0a:58:0a:f4:01"), None);
        assert_eq!(parse_mac("0a:58:0a:f4:01:02:03"), None);
    }
}
