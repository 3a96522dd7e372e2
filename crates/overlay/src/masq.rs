//! The agent's own nftables table, `ip podnet-masq`: masquerade for pod
//! traffic leaving the cluster network, never between pods (flannel's rules,
//! as one chain); and, with a tunnel backend, the tunnel's own UDP packets
//! exempted from connection tracking. A dual-stack node has the same
//! masquerade chain for its pods' IPv6 addresses in `ip6 podnet-masq`
//! (flannel's IPv6 rules); a node that is no longer dual-stack drops it.
//!
//! The exemption matters because the service proxy's and the masquerade's
//! nat hooks switch conntrack on for the whole node: without it every
//! encapsulated packet is tracked twice more (the tunnel flow on the way out
//! and on the way in) on top of the pod flow inside it. Nothing NATs or
//! filters tunnel packets by state, so tracking them buys nothing; a host
//! firewall that only admits "established" UDP must allow the tunnel port
//! explicitly, as flannel's documentation already asks.
//!
//! The table is planned as a typed [`Table`] ([`MasqTable::plan`], pure) and
//! kept in the kernel over nf_tables netlink ([`MasqTable::sync`]: observe,
//! diff, apply): installed at start, repaired at every resync (no change
//! when nothing was touched), removed by [`remove`].

use std::net::{IpAddr, Ipv4Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use podnet_kernel::KernelError;
use podnet_nft::diff::Change;
use podnet_nft::model::{
    Chain, ChainType, Expr, Family, Field, Hook, Proto, Rule, Table, Value, Verdict,
};
use podnet_nft::netlink::Conn;

pub const MASQ_TABLE: &str = "podnet-masq";

/// nftables' `srcnat` and `raw` priorities.
const SRCNAT: i32 = 100;
const RAW: i32 = -300;

/// What the masquerade table is planned from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MasqTable {
    pub network: Ipv4Net,
    pub subnet: Ipv4Net,
    /// This node's underlay address and the tunnel's UDP port.
    pub tunnel: Option<(Ipv4Addr, u16)>,
    /// The IPv6 pod network and this node's IPv6 subnet (dual-stack).
    pub ipv6: Option<(Ipv6Net, Ipv6Net)>,
}

fn cmp(field: Field, neg: bool, value: Value) -> Expr {
    Expr::Cmp { field, neg, value }
}

/// Flannel's four masquerade rules for one family: pod to pod as it is,
/// pod to the world (not multicast) masqueraded, the world to this node's
/// pods as it is, this host to other nodes' pods masqueraded.
fn postrouting(network: IpNet, subnet: IpNet) -> Chain {
    let (saddr, daddr, multicast) = match network {
        IpNet::V4(_) => (Field::IpSaddr, Field::IpDaddr, "224.0.0.0/4"),
        IpNet::V6(_) => (Field::Ip6Saddr, Field::Ip6Daddr, "ff00::/8"),
    };
    let multicast = Value::Net(multicast.parse().expect("prefix"));
    let masquerade = || Expr::Masquerade {
        fully_random: false,
    };
    let ret = || Expr::Verdict(Verdict::Return);
    let (network, subnet) = (Value::Net(network), Value::Net(subnet));
    Chain::base(ChainType::Nat, Hook::Postrouting, SRCNAT).with_rules(vec![
        Rule::new(vec![
            cmp(saddr, false, network.clone()),
            cmp(daddr, false, network.clone()),
            ret(),
        ]),
        Rule::new(vec![
            cmp(saddr, false, network.clone()),
            cmp(daddr, true, multicast),
            masquerade(),
        ]),
        Rule::new(vec![
            cmp(saddr, true, network.clone()),
            cmp(daddr, false, subnet),
            ret(),
        ]),
        Rule::new(vec![
            cmp(saddr, true, network.clone()),
            cmp(daddr, false, network),
            masquerade(),
        ]),
    ])
}

impl MasqTable {
    /// The table as it should be. Without a tunnel there are no tunnel
    /// chains, so a sync removes those an earlier tunnel backend left.
    pub fn plan(&self) -> Table {
        let mut t = Table::new(Family::Ip, MASQ_TABLE);
        let rule = |exprs| Rule::new(exprs);
        t.chains.insert(
            "postrouting".into(),
            postrouting(IpNet::V4(self.network), IpNet::V4(self.subnet)),
        );
        if let Some((ip, port)) = self.tunnel {
            for (chain, hook, field) in [
                ("tunnel-in", Hook::Prerouting, Field::IpDaddr),
                ("tunnel-out", Hook::Output, Field::IpSaddr),
            ] {
                t.chains.insert(
                    chain.into(),
                    Chain::base(ChainType::Filter, hook, RAW).with_rules(vec![rule(vec![
                        cmp(field, false, Value::Addr(IpAddr::V4(ip))),
                        cmp(Field::L4Proto, false, Value::Proto(Proto::Udp)),
                        cmp(Field::Dport, false, Value::Port(port)),
                        Expr::Notrack,
                    ])]),
                );
            }
        }
        t
    }

    /// The IPv6 table of a dual-stack node (None: the node has none).
    pub fn plan6(&self) -> Option<Table> {
        let (network, subnet) = self.ipv6?;
        let mut t = Table::new(Family::Ip6, MASQ_TABLE);
        t.chains.insert(
            "postrouting".into(),
            postrouting(IpNet::V6(network), IpNet::V6(subnet)),
        );
        Some(t)
    }

    /// Brings the kernel's tables to the plan; returns what it changed
    /// (nothing when the tables are intact).
    pub fn sync(&self) -> Result<Vec<Change>, KernelError> {
        let mut conn = Conn::open()?;
        let mut changes = conn.sync(&self.plan())?;
        match self.plan6() {
            Some(t6) => changes.extend(conn.sync(&t6)?),
            None => {
                // A node no longer dual-stack: its IPv6 table goes.
                if conn.delete_table(Family::Ip6, MASQ_TABLE)? {
                    changes.push(Change::ResetTable);
                }
            }
        }
        Ok(changes)
    }

    /// Puts the table back if someone deleted or changed it (a few netlink
    /// dumps when all is well).
    pub fn repair(&self) {
        match self.sync() {
            Ok(c) if !c.is_empty() => tracing::warn!(
                changes = podnet_nft::diff::ops(&c),
                "table ip {MASQ_TABLE} was changed or removed; restored it"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!("restoring table ip {MASQ_TABLE}: {e}"),
        }
    }
}

/// Removes the tables; whether one was there.
pub fn remove() -> Result<bool, KernelError> {
    let mut conn = Conn::open()?;
    let v4 = conn.delete_table(Family::Ip, MASQ_TABLE)?;
    Ok(conn.delete_table(Family::Ip6, MASQ_TABLE)? || v4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use podnet_nft::trace::{Packet, Tracer};

    fn table(tunnel: bool) -> MasqTable {
        MasqTable {
            network: "10.244.0.0/16".parse().unwrap(),
            subnet: "10.244.1.0/24".parse().unwrap(),
            tunnel: tunnel.then(|| ("192.168.200.11".parse().unwrap(), 8472)),
            ipv6: None,
        }
    }

    #[test]
    fn plan_has_the_flannel_rules_and_tunnel_chains_only_with_a_tunnel() {
        let t = table(true).plan();
        let r = t.render();
        assert!(
            r.contains("ip saddr 10.244.0.0/16 ip daddr != 224.0.0.0/4 masquerade"),
            "{r}"
        );
        assert!(r.contains("ip saddr != 10.244.0.0/16 ip daddr 10.244.1.0/24 return"));
        assert!(r.contains("ip daddr 192.168.200.11 meta l4proto udp th dport 8472 notrack"));
        assert_eq!(t.chains.len(), 3);
        let t = table(false).plan();
        assert_eq!(t.chains.keys().collect::<Vec<_>>(), vec!["postrouting"]);
        // Dropping the tunnel deletes its chains and nothing else.
        let d = podnet_nft::diff::diff(Some(&table(true).plan()), &t);
        assert!(d
            .iter()
            .all(|c| matches!(c, Change::FlushChain { .. } | Change::DelChain { .. })));
        assert!(podnet_nft::diff::diff(Some(&t), &t).is_empty());
    }

    fn out(t: &Table, src: &str, dst: &str) -> bool {
        let o = Tracer::new(t).incoming(&Packet::new(src, dst, Proto::Tcp, 80), &mut |_| 0);
        o.masquerade
    }

    #[test]
    fn pods_leaving_the_cluster_are_masqueraded_and_pod_to_pod_is_not() {
        let t = table(true).plan();
        assert!(out(&t, "10.244.1.5", "8.8.8.8"), "pod to the world");
        assert!(
            !out(&t, "10.244.1.5", "10.244.2.7"),
            "pod to pod, other node"
        );
        assert!(
            !out(&t, "10.244.1.5", "10.244.1.6"),
            "pod to pod, same node"
        );
        assert!(!out(&t, "10.244.1.5", "239.1.2.3"), "multicast");
        assert!(
            !out(&t, "192.168.200.5", "10.244.1.5"),
            "to this node's pods"
        );
        assert!(
            out(&t, "192.168.200.11", "10.244.2.7"),
            "host to other nodes' pods"
        );
    }

    /// A dual-stack node masquerades its pods' IPv6 traffic leaving the
    /// cluster, by the same rules, in its own table.
    #[test]
    fn ipv6_pods_leaving_the_cluster_are_masqueraded() {
        assert!(table(false).plan6().is_none());
        let mut m = table(false);
        m.ipv6 = Some((
            "fd00:10:244::/56".parse().unwrap(),
            "fd00:10:244:1::/64".parse().unwrap(),
        ));
        let t = m.plan6().unwrap();
        assert_eq!(t.family, Family::Ip6);
        let r = t.render();
        assert!(
            r.contains("ip6 saddr fd00:10:244::/56 ip6 daddr != ff00::/8 masquerade"),
            "{r}"
        );
        assert!(
            out(&t, "fd00:10:244:1::5", "2001:db8::1"),
            "pod to the world"
        );
        assert!(
            !out(&t, "fd00:10:244:1::5", "fd00:10:244:2::7"),
            "pod to pod"
        );
        assert!(!out(&t, "fd00:10:244:1::5", "ff02::1"), "multicast");
        assert!(
            !out(&t, "2001:db8::1", "fd00:10:244:1::5"),
            "to this node's pods"
        );
        assert!(
            out(&t, "2001:db8::1", "fd00:10:244:2::7"),
            "host to other nodes' pods"
        );
    }

    #[test]
    fn tunnel_packets_are_not_tracked() {
        let t = table(true).plan();
        let mut tr = Tracer::new(&t).with_local(&["192.168.200.11"]);
        let p = Packet::new("192.168.200.12", "192.168.200.11", Proto::Udp, 8472);
        assert!(tr.incoming(&p, &mut |_| 0).notrack);
        let p = Packet::new("192.168.200.11", "192.168.200.12", Proto::Udp, 8472);
        assert!(tr.local(&p, &mut |_| 0).notrack);
        let p = Packet::new("192.168.200.11", "192.168.200.12", Proto::Udp, 53);
        assert!(!tr.local(&p, &mut |_| 0).notrack);
        let p = Packet::new("192.168.200.11", "192.168.200.12", Proto::Tcp, 8472);
        assert!(!tr.local(&p, &mut |_| 0).notrack);
    }
}
