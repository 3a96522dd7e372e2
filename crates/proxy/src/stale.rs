//! Stale UDP conntrack entries: a UDP "connection" is a conntrack entry
//! whose NAT outlives the rule that chose its endpoint, so a client that
//! reuses its socket (or a new socket that happens to get a port an old
//! entry still holds) keeps sending to an endpoint the Service no longer
//! has, and gets no answer: the classic 5-second DNS timeout.
//!
//! Two ways to find them, one per kind of sync:
//! - a partial sync knows what it removed: the UDP endpoints of a
//!   Service's old fragment that its new fragment lacks ([`udp_endpoints`],
//!   [`stale_udp`]);
//! - a full sync (a restarted agent, a repaired table) does not know what
//!   the table held before, nor what an agent that stopped mid-change
//!   meant to flush. It reconciles instead, as kube-proxy's conntrack
//!   reconciler does: every UDP entry NATed through one of this table's
//!   front ends to something that is not behind that front end now (or
//!   NATed to a Service CIDR address no Service holds any more) is stale
//!   ([`UdpView`], [`stale_in_view`]).
//!
//! Deleting goes over ctnetlink ([`flush`]): the agent's image has no
//! `conntrack` tool.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use podnet_kernel::conntrack;
use podnet_nft::model::{ElemData, Expr, Proto, Table, Value};

/// An address and UDP port: a front end or an endpoint.
pub type Port = (IpAddr, u16);

/// UDP endpoints a fragment DNATs to.
pub fn udp_endpoints(t: &Table) -> BTreeSet<Port> {
    let mut out = BTreeSet::new();
    for (k, d) in t
        .sets
        .get("fast-endpoints")
        .into_iter()
        .flat_map(|s| &s.elements)
    {
        if let (Some(Value::Proto(Proto::Udp)), Some(ElemData::Data(d))) = (k.get(1), d) {
            if let (Some(Value::Addr(a)), Some(Value::Port(p))) = (d.first(), d.get(1)) {
                out.insert((*a, *p));
            }
        }
    }
    for r in t.chains.values().flat_map(|c| &c.rules) {
        let udp = r.exprs.iter().any(|e| {
            matches!(
                e,
                Expr::Cmp {
                    value: Value::Proto(Proto::Udp),
                    ..
                }
            )
        });
        for e in &r.exprs {
            if let (
                true,
                Expr::Dnat {
                    addr,
                    port: Some(p),
                },
            ) = (udp, e)
            {
                out.insert((*addr, *p));
            }
        }
    }
    out
}

/// The UDP entries whose replies come from an endpoint in `gone`: they
/// would keep steering their clients (a long-lived UDP socket) to it.
pub fn stale_udp<'a>(
    entries: &'a [conntrack::Entry],
    gone: &BTreeSet<Port>,
) -> Vec<&'a conntrack::Entry> {
    entries
        .iter()
        .filter(|e| e.proto == libc::IPPROTO_UDP as u8)
        .filter(|e| gone.contains(&(e.reply.src, e.reply.sport)))
        .collect()
}

/// The UDP front ends a table serves and the endpoints behind them, per
/// Service: an address and port (ClusterIP, external and load-balancer
/// IPs), or a node port on any address.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct UdpView {
    pub addrs: BTreeMap<Port, BTreeSet<Port>>,
    pub node_ports: BTreeMap<u16, BTreeSet<Port>>,
}

/// The maps whose keys are a Service's `address . protocol . port`.
const ADDR_MAPS: [&str; 3] = ["service-ips", "no-endpoint-services", "fast-services"];
/// The maps whose keys are a node port's `protocol . port`.
const NODE_PORT_MAPS: [&str; 2] = ["service-nodeports", "no-endpoint-nodeports"];

impl UdpView {
    /// One Service fragment's front ends, each with all the fragment's UDP
    /// endpoints (a Service's ports are not told apart: an entry through
    /// one port to another port's endpoint does not happen).
    pub fn of(fragment: &Table) -> UdpView {
        let keys = |maps: &'static [&'static str]| {
            maps.iter()
                .filter_map(|m| fragment.sets.get(*m))
                .flat_map(|s| s.elements.keys())
        };
        let addrs: Vec<Port> = keys(&ADDR_MAPS)
            .filter_map(|k| match k.as_slice() {
                [Value::Addr(a), Value::Proto(Proto::Udp), Value::Port(p)] => Some((*a, *p)),
                _ => None,
            })
            .collect();
        let node_ports: Vec<u16> = keys(&NODE_PORT_MAPS)
            .filter_map(|k| match k.as_slice() {
                [Value::Proto(Proto::Udp), Value::Port(p)] => Some(*p),
                _ => None,
            })
            .collect();
        // Most Services are TCP only: their fragments' rules are not read.
        if addrs.is_empty() && node_ports.is_empty() {
            return UdpView::default();
        }
        let eps = udp_endpoints(fragment);
        UdpView {
            addrs: addrs.into_iter().map(|a| (a, eps.clone())).collect(),
            node_ports: node_ports.into_iter().map(|p| (p, eps.clone())).collect(),
        }
    }

    /// Adds another fragment's front ends.
    pub fn merge(&mut self, other: UdpView) {
        for (k, eps) in other.addrs {
            self.addrs.entry(k).or_default().extend(eps);
        }
        for (k, eps) in other.node_ports {
            self.node_ports.entry(k).or_default().extend(eps);
        }
    }

    /// Whether an entry NATed from `front` to `ep` is stale: the front end
    /// is ours and `ep` is not behind it, or `front` is in the Service CIDR
    /// and no Service holds it now.
    fn is_stale(&self, front: Port, ep: Port, service_cidr: Option<&IpNet>) -> bool {
        if let Some(eps) = self.addrs.get(&front) {
            return !eps.contains(&ep);
        }
        if service_cidr.is_some_and(|c| c.contains(&front.0)) {
            return true;
        }
        self.node_ports
            .get(&front.1)
            .is_some_and(|eps| !eps.contains(&ep))
    }
}

/// The UDP entries a full sync finds stale against `view`. Entries that
/// were not NATed (their reply comes from where the client sent) are
/// never ours to judge.
pub fn stale_in_view<'a>(
    entries: &'a [conntrack::Entry],
    view: &UdpView,
    service_cidr: Option<&IpNet>,
) -> Vec<&'a conntrack::Entry> {
    entries
        .iter()
        .filter(|e| e.proto == libc::IPPROTO_UDP as u8)
        .filter(|e| {
            let front = (e.orig.dst, e.orig.dport);
            let ep = (e.reply.src, e.reply.sport);
            front != ep && view.is_stale(front, ep, service_cidr)
        })
        .collect()
}

/// Whether the calling thread's namespace holds any UDP entry that was
/// NATed: only then can a full sync find stale ones, so a node without
/// UDP Service traffic pays one conntrack dump instead of a view of every
/// Service, and a namespace with no entries at all not even that (a dump
/// walks the kernel's whole conntrack hash, shared by every namespace:
/// about 9 ms here however few entries are ours). When the table cannot
/// be read, assume there are.
pub fn any_udp_nat() -> bool {
    let count = std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_count");
    if count.is_ok_and(|c| c.trim() == "0") {
        return false;
    }
    conntrack::Table::new()
        .and_then(|mut t| t.list(None))
        .map(|entries| {
            entries.iter().any(|e| {
                e.proto == libc::IPPROTO_UDP as u8
                    && (e.orig.dst, e.orig.dport) != (e.reply.src, e.reply.sport)
            })
        })
        .unwrap_or(true)
}

/// What a sync flushes once its batch is in the kernel.
#[derive(Debug)]
pub enum Flush {
    /// A partial sync: the entries of these removed endpoints.
    Gone(BTreeSet<Port>),
    /// A full sync: whatever the table's front ends no longer lead to.
    Reconcile(UdpView, Option<IpNet>),
}

/// Deletes the stale entries of the calling thread's namespace; returns
/// how many went. Errors are logged: a flush that fails leaves clients
/// waiting for a timeout, not a broken table.
pub fn flush(f: &Flush) -> usize {
    if matches!(f, Flush::Gone(g) if g.is_empty()) {
        return 0;
    }
    let res = conntrack::Table::new().and_then(|mut t| {
        let entries = t.list(None)?;
        let stale = match f {
            Flush::Gone(gone) => stale_udp(&entries, gone),
            Flush::Reconcile(view, cidr) => stale_in_view(&entries, view, cidr.as_ref()),
        };
        let mut n = 0;
        for e in stale {
            if t.delete(e)? {
                n += 1;
            }
        }
        Ok(n)
    });
    match res {
        Ok(n) => {
            if n > 0 {
                tracing::debug!(entries = n, "flushed stale UDP conntrack entries");
            }
            n
        }
        Err(e) => {
            tracing::warn!("flushing stale UDP conntrack entries: {e}");
            0
        }
    }
}

/// [`flush`] of the entries of removed endpoints.
pub fn flush_conntrack(gone: &BTreeSet<Port>) {
    flush(&Flush::Gone(gone.clone()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use podnet_kernel::conntrack::{Entry, Tuple};

    fn entry(proto: u8, client: &str, front: &str, ep: &str) -> Entry {
        let a = |s: &str| -> Port {
            let (ip, port) = s.rsplit_once(':').unwrap();
            (ip.parse().unwrap(), port.parse().unwrap())
        };
        let (c, f, e) = (a(client), a(front), a(ep));
        let t = |src: Port, dst: Port| Tuple {
            src: src.0,
            dst: dst.0,
            sport: src.1,
            dport: dst.1,
            icmp: None,
        };
        Entry {
            proto,
            orig: t(c, f),
            reply: t(e, c),
            status: 0,
            zone: 0,
            mark: 0,
            timeout: 30,
            id: None,
            tcp_state: None,
        }
    }

    fn view() -> UdpView {
        let p = |s: &str| -> Port {
            let (ip, port) = s.rsplit_once(':').unwrap();
            (ip.parse().unwrap(), port.parse().unwrap())
        };
        let mut v = UdpView::default();
        v.addrs
            .insert(p("10.96.0.10:53"), [p("10.244.1.5:53")].into());
        v.addrs.insert(p("10.96.0.20:53"), BTreeSet::new());
        v.node_ports.insert(30053, [p("10.244.1.5:53")].into());
        v
    }

    #[test]
    fn a_full_sync_flushes_what_its_front_ends_no_longer_lead_to() {
        let cidr: IpNet = "10.96.0.0/16".parse().unwrap();
        let udp = libc::IPPROTO_UDP as u8;
        let entries = [
            // Kept: the endpoint is still behind the ClusterIP.
            entry(udp, "10.244.0.4:4000", "10.96.0.10:53", "10.244.1.5:53"),
            // Stale: an endpoint the ClusterIP lost (a DNS pod replaced
            // while the agent restarted).
            entry(udp, "10.244.0.4:4001", "10.96.0.10:53", "10.244.2.2:53"),
            // Stale: the Service has no endpoints now.
            entry(udp, "10.244.0.4:4002", "10.96.0.20:53", "10.244.2.2:53"),
            // Stale: no Service holds this ClusterIP now.
            entry(udp, "10.244.0.4:4003", "10.96.0.99:53", "10.244.2.2:53"),
            // Kept: not NATed (pod to pod).
            entry(udp, "10.244.0.4:4004", "10.244.2.2:53", "10.244.2.2:53"),
            // Kept: NATed by someone else (a hostPort), not through ours.
            entry(udp, "10.0.0.9:4005", "192.168.1.1:8053", "10.244.2.2:53"),
            // Node port: stale to a lost endpoint, kept to the current one.
            entry(udp, "10.0.0.9:4006", "192.168.1.1:30053", "10.244.2.2:53"),
            entry(udp, "10.0.0.9:4007", "192.168.1.1:30053", "10.244.1.5:53"),
            // TCP is never flushed: its connections end themselves.
            entry(6, "10.244.0.4:4008", "10.96.0.10:53", "10.244.2.2:53"),
        ];
        let stale: Vec<u16> = stale_in_view(&entries, &view(), Some(&cidr))
            .iter()
            .map(|e| e.orig.sport)
            .collect();
        assert_eq!(stale, [4001, 4002, 4003, 4006]);
    }

    #[test]
    fn the_view_holds_a_fragments_udp_front_ends_and_endpoints() {
        use podnet_nft::model::Set;
        let mut t = Table::new(podnet_nft::model::Family::Ip, "podnet");
        let cip: IpAddr = "10.96.0.10".parse().unwrap();
        let ep: IpAddr = "10.244.1.5".parse().unwrap();
        let mut fast = Set::new(Vec::new());
        fast.elements.insert(
            vec![Value::Addr(cip), Value::Proto(Proto::Udp), Value::Port(53)],
            None,
        );
        fast.elements.insert(
            vec![Value::Addr(cip), Value::Proto(Proto::Tcp), Value::Port(53)],
            None,
        );
        t.sets.insert("fast-services".into(), fast);
        let mut eps = Set::new(Vec::new());
        eps.elements.insert(
            vec![
                Value::Addr(cip),
                Value::Proto(Proto::Udp),
                Value::Port(53),
                Value::U32(0),
            ],
            Some(ElemData::Data(vec![Value::Addr(ep), Value::Port(5353)])),
        );
        t.sets.insert("fast-endpoints".into(), eps);
        let v = UdpView::of(&t);
        assert_eq!(
            v.addrs,
            BTreeMap::from([((cip, 53), BTreeSet::from([(ep, 5353)]))])
        );
        assert!(v.node_ports.is_empty());
    }
}
