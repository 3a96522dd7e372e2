//! The connection-tracking table over ctnetlink (NETLINK_NETFILTER,
//! subsystem CTNETLINK): list the entries of a namespace, delete one.
//!
//! It owns the table's wire format: tuples (addresses, protocol, ports or
//! ICMP id/type/code), status bits, zone, mark and id. The proxy needs it
//! to drop the UDP entries that still steer clients to a removed endpoint,
//! and a verdict log to match a logged packet with its connection; both
//! used to run the `conntrack` tool for that.
//!
//! A delete names the entry by its original tuple, its zone and its id
//! (a per-entry number the kernel hands out in dumps), so an entry listed
//! a while ago and since replaced by a new connection on the same tuple is
//! left alone: that delete reports `false`, like one whose entry expired.
//!
//! A namespace tracks connections only once something there needs it (an
//! nftables `ct` expression or NAT, an iptables state match): until then
//! its table stays empty.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::nflog::{nfgenmsg, NETLINK_NETFILTER};
use crate::nl::{self, Attrs, Msg, Socket};
use crate::{KernelError, Netns};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_STATUS: u16 = 3;
const CTA_PROTOINFO: u16 = 4;
const CTA_TIMEOUT: u16 = 7;
const CTA_MARK: u16 = 8;
const CTA_ID: u16 = 12;
const CTA_ZONE: u16 = 18;

const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_PROTO_ICMP_ID: u16 = 4;
const CTA_PROTO_ICMP_TYPE: u16 = 5;
const CTA_PROTO_ICMP_CODE: u16 = 6;
const CTA_PROTO_ICMPV6_ID: u16 = 7;
const CTA_PROTO_ICMPV6_TYPE: u16 = 8;
const CTA_PROTO_ICMPV6_CODE: u16 = 9;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_STATE: u16 = 1;

const IPPROTO_ICMP: u8 = 1;
const IPPROTO_ICMPV6: u8 = 58;

/// Status bits ([`Entry::status`]), from `enum ip_conntrack_status`.
pub const IPS_EXPECTED: u32 = 1 << 0;
pub const IPS_SEEN_REPLY: u32 = 1 << 1;
pub const IPS_ASSURED: u32 = 1 << 2;
pub const IPS_CONFIRMED: u32 = 1 << 3;
pub const IPS_SRC_NAT: u32 = 1 << 4;
pub const IPS_DST_NAT: u32 = 1 << 5;

/// [`Entry::tcp_state`] of a connection past its handshake.
pub const TCP_CONNTRACK_ESTABLISHED: u8 = 3;

/// An address family to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    fn af(self) -> u8 {
        match self {
            IpFamily::V4 => libc::AF_INET as u8,
            IpFamily::V6 => libc::AF_INET6 as u8,
        }
    }
}

/// An ICMP or ICMPv6 tuple's identity in place of ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Icmp {
    pub kind: u8,
    pub code: u8,
    pub id: u16,
}

const NO_ICMP: Icmp = Icmp {
    kind: 0,
    code: 0,
    id: 0,
};

/// One direction of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// 0 for protocols without ports.
    pub sport: u16,
    pub dport: u16,
    /// ICMP and ICMPv6 only.
    pub icmp: Option<Icmp>,
}

/// A conntrack entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The transport protocol (IPPROTO_*).
    pub proto: u8,
    /// As the first packet went.
    pub orig: Tuple,
    /// As replies come back (after NAT, what differs from `orig` reversed).
    pub reply: Tuple,
    /// `IPS_*` bits.
    pub status: u32,
    pub zone: u16,
    pub mark: u32,
    /// Seconds until the entry expires.
    pub timeout: u32,
    /// The kernel's id for this entry, which a delete checks.
    pub id: Option<u32>,
    /// TCP only: `TCP_CONNTRACK_*`.
    pub tcp_state: Option<u8>,
}

impl Entry {
    pub fn describe(&self) -> String {
        let t = &self.orig;
        format!(
            "conntrack entry proto {} {} -> {} sport {} dport {} zone {}",
            self.proto, t.src, t.dst, t.sport, t.dport, self.zone
        )
    }
}

/// One ctnetlink socket in one namespace (reuse it for many deletes).
pub struct Table {
    sock: Socket,
}

impl Table {
    /// The calling thread's current namespace.
    pub fn new() -> Result<Self, KernelError> {
        let sock = Socket::open(NETLINK_NETFILTER)
            .map_err(|e| KernelError::io("opening ctnetlink socket", e))?;
        Ok(Table { sock })
    }

    /// Another namespace; the socket stays bound there.
    pub fn in_netns(ns: &Netns) -> Result<Self, KernelError> {
        ns.run(Table::new)?
    }

    /// Every entry of the namespace (all zones), or those of one family.
    pub fn list(&mut self, family: Option<IpFamily>) -> Result<Vec<Entry>, KernelError> {
        let mut m = Msg::new(
            (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET,
            nl::NLM_F_DUMP,
        );
        m.raw(&nfgenmsg(
            family.map_or(libc::AF_UNSPEC as u8, IpFamily::af),
            0,
        ));
        let op = || match family {
            None => "listing conntrack entries".to_string(),
            Some(f) => format!("listing {f:?} conntrack entries"),
        };
        let replies = self.sock.request(m, &op)?;
        let new = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW;
        Ok(replies
            .iter()
            .filter(|r| r.msg_type == new)
            .filter_map(|r| parse_entry(&r.body))
            .collect())
    }

    /// Deletes the entry: `false` when it is gone already (expired,
    /// deleted, or replaced by a new connection on the same tuple).
    pub fn delete(&mut self, entry: &Entry) -> Result<bool, KernelError> {
        let m = delete_msg(entry);
        match self
            .sock
            .request(m, &|| format!("deleting {}", entry.describe()))
        {
            Ok(_) => Ok(true),
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// What happened to a connection, as the event says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A new connection was confirmed (its first packet left the hooks).
    New,
    /// Its state changed (a TCP state, a status bit).
    Update,
    /// It ended (closed, timed out, or deleted).
    Destroy,
}

/// The connection-tracking events of one namespace (ctnetlink's multicast
/// groups): a flow log hears of every new connection as the kernel
/// confirms it, without polling the table. The kernel sends only while
/// someone listens. Delivery does not wait for a slow reader: a full
/// receive buffer drops events, which [`Events::lost`] counts.
pub struct Events {
    sock: Socket,
    lost: u64,
}

impl Events {
    /// Joins the groups of `kinds` in the calling thread's namespace.
    pub fn open(kinds: &[EventKind]) -> Result<Events, KernelError> {
        use std::os::fd::AsRawFd;
        const NETLINK_ADD_MEMBERSHIP: i32 = 1;
        let sock = Socket::open(NETLINK_NETFILTER)
            .map_err(|e| KernelError::io("opening a ctnetlink event socket", e))?;
        for k in kinds {
            let group = match k {
                EventKind::New => 1,
                EventKind::Update => 2,
                EventKind::Destroy => 3,
            };
            nl::set_int_opt(
                sock.as_raw_fd(),
                libc::SOL_NETLINK,
                NETLINK_ADD_MEMBERSHIP,
                group,
            )
            .map_err(|e| KernelError::io(format!("joining conntrack event group {group}"), e))?;
        }
        Ok(Events { sock, lost: 0 })
    }

    /// Sets the socket's receive buffer (the kernel doubles it).
    pub fn set_buffer(&mut self, bytes: usize) -> Result<(), KernelError> {
        let v = i32::try_from(bytes / 2).unwrap_or(i32::MAX / 2);
        self.sock
            .set_recv_buffer(v)
            .map_err(|e| KernelError::io("setting the conntrack event buffer", e))
    }

    /// Makes [`Events::recv`] return `Ok(vec![])` after `timeout` without
    /// events; `None` waits forever.
    pub fn set_timeout(&mut self, timeout: Option<std::time::Duration>) -> Result<(), KernelError> {
        self.sock
            .set_recv_timeout(timeout)
            .map_err(|e| KernelError::io("setting the conntrack event timeout", e))
    }

    /// The events of the next datagram; empty after a timeout. An overrun
    /// is counted in [`Events::lost`] and the wait goes on.
    pub fn recv(&mut self) -> Result<Vec<(EventKind, Entry)>, KernelError> {
        let Some(msgs) = self
            .sock
            .recv_counting(&mut self.lost, &|| "conntrack events".into())?
        else {
            return Ok(Vec::new());
        };
        let new = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW;
        let del = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE;
        Ok(msgs
            .filter_map(|m| {
                let kind = if m.msg_type == del {
                    EventKind::Destroy
                } else if m.msg_type == new && m.flags & nl::NLM_F_CREATE != 0 {
                    EventKind::New
                } else if m.msg_type == new {
                    EventKind::Update
                } else {
                    return None;
                };
                parse_entry(m.body).map(|e| (kind, e))
            })
            .collect())
    }

    /// Receive-buffer overruns so far (each dropped one or more events).
    pub fn lost(&self) -> u64 {
        self.lost
    }
}

/// [`Table::list`] in the calling thread's namespace.
pub fn list(family: Option<IpFamily>) -> Result<Vec<Entry>, KernelError> {
    Table::new()?.list(family)
}

/// [`Table::delete`] in the calling thread's namespace.
pub fn delete(entry: &Entry) -> Result<bool, KernelError> {
    Table::new()?.delete(entry)
}

fn delete_msg(entry: &Entry) -> Msg {
    let family = match entry.orig.src {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    };
    let mut m = Msg::new(
        (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE,
        nl::NLM_F_ACK,
    );
    m.raw(&nfgenmsg(family, 0));
    // Never without the tuple: a delete that names nothing flushes the table.
    m.begin(CTA_TUPLE_ORIG);
    put_tuple(&mut m, entry.proto, &entry.orig);
    m.end();
    if entry.zone != 0 {
        m.u16_be(CTA_ZONE, entry.zone);
    }
    if let Some(id) = entry.id {
        m.u32_be(CTA_ID, id);
    }
    m
}

fn put_tuple(m: &mut Msg, proto: u8, t: &Tuple) {
    m.begin(CTA_TUPLE_IP);
    match (t.src, t.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            m.attr(CTA_IP_V4_SRC, &s.octets());
            m.attr(CTA_IP_V4_DST, &d.octets());
        }
        (s, d) => {
            m.attr(CTA_IP_V6_SRC, &v6(s).octets());
            m.attr(CTA_IP_V6_DST, &v6(d).octets());
        }
    }
    m.end();
    m.begin(CTA_TUPLE_PROTO);
    m.u8(CTA_PROTO_NUM, proto);
    let icmp = t.icmp.unwrap_or(NO_ICMP);
    match proto {
        IPPROTO_ICMP => {
            m.u16_be(CTA_PROTO_ICMP_ID, icmp.id);
            m.u8(CTA_PROTO_ICMP_TYPE, icmp.kind);
            m.u8(CTA_PROTO_ICMP_CODE, icmp.code);
        }
        IPPROTO_ICMPV6 => {
            m.u16_be(CTA_PROTO_ICMPV6_ID, icmp.id);
            m.u8(CTA_PROTO_ICMPV6_TYPE, icmp.kind);
            m.u8(CTA_PROTO_ICMPV6_CODE, icmp.code);
        }
        // Protocols without ports ignore them (their tuples hold zeros).
        _ => {
            m.u16_be(CTA_PROTO_SRC_PORT, t.sport);
            m.u16_be(CTA_PROTO_DST_PORT, t.dport);
        }
    }
    m.end();
}

fn v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

fn be16(v: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(v.get(..2)?.try_into().ok()?))
}

fn be32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

/// One `IPCTNL_MSG_CT_NEW` body: nfgenmsg, then attributes. `None` without
/// both tuples.
fn parse_entry(body: &[u8]) -> Option<Entry> {
    let mut orig = None;
    let mut reply = None;
    let mut e = Entry {
        proto: 0,
        orig: Tuple {
            src: Ipv4Addr::UNSPECIFIED.into(),
            dst: Ipv4Addr::UNSPECIFIED.into(),
            sport: 0,
            dport: 0,
            icmp: None,
        },
        reply: Tuple {
            src: Ipv4Addr::UNSPECIFIED.into(),
            dst: Ipv4Addr::UNSPECIFIED.into(),
            sport: 0,
            dport: 0,
            icmp: None,
        },
        status: 0,
        zone: 0,
        mark: 0,
        timeout: 0,
        id: None,
        tcp_state: None,
    };
    for (ty, v) in Attrs::new(body.get(4..)?) {
        match ty {
            CTA_TUPLE_ORIG => orig = parse_tuple(v),
            CTA_TUPLE_REPLY => reply = parse_tuple(v),
            CTA_STATUS => e.status = be32(v)?,
            CTA_TIMEOUT => e.timeout = be32(v)?,
            CTA_MARK => e.mark = be32(v)?,
            CTA_ID => e.id = be32(v),
            CTA_ZONE => e.zone = be16(v)?,
            CTA_PROTOINFO => {
                e.tcp_state = Attrs::new(v)
                    .find(|(t, _)| *t == CTA_PROTOINFO_TCP)
                    .and_then(|(_, tcp)| {
                        Attrs::new(tcp).find(|(t, _)| *t == CTA_PROTOINFO_TCP_STATE)
                    })
                    .and_then(|(_, s)| s.first().copied())
            }
            _ => {}
        }
    }
    let (proto, orig) = orig?;
    e.proto = proto;
    e.orig = orig;
    e.reply = reply?.1;
    Some(e)
}

/// A `CTA_TUPLE_*` nest: its protocol and the tuple.
fn parse_tuple(data: &[u8]) -> Option<(u8, Tuple)> {
    let (mut src, mut dst) = (None, None);
    let mut proto = None;
    let (mut sport, mut dport) = (0, 0);
    let mut icmp: Option<Icmp> = None;
    for (ty, v) in Attrs::new(data) {
        match ty {
            CTA_TUPLE_IP => {
                for (ty, a) in Attrs::new(v) {
                    let addr: Option<IpAddr> = match ty {
                        CTA_IP_V4_SRC | CTA_IP_V4_DST => <[u8; 4]>::try_from(a)
                            .ok()
                            .map(|o| Ipv4Addr::from(o).into()),
                        CTA_IP_V6_SRC | CTA_IP_V6_DST => <[u8; 16]>::try_from(a)
                            .ok()
                            .map(|o| Ipv6Addr::from(o).into()),
                        _ => continue,
                    };
                    match ty {
                        CTA_IP_V4_SRC | CTA_IP_V6_SRC => src = addr,
                        _ => dst = addr,
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for (ty, p) in Attrs::new(v) {
                    match ty {
                        CTA_PROTO_NUM => proto = p.first().copied(),
                        CTA_PROTO_SRC_PORT => sport = be16(p)?,
                        CTA_PROTO_DST_PORT => dport = be16(p)?,
                        CTA_PROTO_ICMP_ID | CTA_PROTO_ICMPV6_ID => {
                            icmp.get_or_insert(NO_ICMP).id = be16(p)?
                        }
                        CTA_PROTO_ICMP_TYPE | CTA_PROTO_ICMPV6_TYPE => {
                            icmp.get_or_insert(NO_ICMP).kind = *p.first()?
                        }
                        CTA_PROTO_ICMP_CODE | CTA_PROTO_ICMPV6_CODE => {
                            icmp.get_or_insert(NO_ICMP).code = *p.first()?
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some((
        proto?,
        Tuple {
            src: src?,
            dst: dst?,
            sport,
            dport,
            icmp,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(src: &str, dst: &str, sport: u16, dport: u16) -> Tuple {
        Tuple {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            sport,
            dport,
            icmp: None,
        }
    }

    /// What the kernel sends for an entry, built with the encoder a delete
    /// uses: the delete's tuple is then the dump's, byte for byte.
    fn dump_message(e: &Entry) -> Vec<u8> {
        let mut m = Msg::new((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW, 0);
        m.raw(&nfgenmsg(libc::AF_INET as u8, 0));
        m.begin(CTA_TUPLE_ORIG);
        put_tuple(&mut m, e.proto, &e.orig);
        m.end().begin(CTA_TUPLE_REPLY);
        put_tuple(&mut m, e.proto, &e.reply);
        m.end()
            .u32_be(CTA_STATUS, e.status)
            .u32_be(CTA_TIMEOUT, e.timeout)
            .u32_be(CTA_MARK, e.mark)
            .u32_be(CTA_ID, e.id.unwrap())
            .u16_be(CTA_ZONE, e.zone);
        if let Some(s) = e.tcp_state {
            m.begin(CTA_PROTOINFO)
                .begin(CTA_PROTOINFO_TCP)
                .u8(CTA_PROTOINFO_TCP_STATE, s)
                .end()
                .end();
        }
        m.finish(0)[16..].to_vec()
    }

    #[test]
    fn entries_round_trip_through_the_wire_format() {
        let tcp = Entry {
            proto: 6,
            orig: tuple("10.244.1.5", "10.96.0.10", 40000, 53),
            reply: tuple("10.244.2.7", "10.244.1.5", 5353, 40000),
            status: IPS_CONFIRMED | IPS_SEEN_REPLY | IPS_DST_NAT,
            zone: 3,
            mark: 0x4000,
            timeout: 431999,
            id: Some(0xdead_beef),
            tcp_state: Some(TCP_CONNTRACK_ESTABLISHED),
        };
        assert_eq!(parse_entry(&dump_message(&tcp)), Some(tcp.clone()));

        let mut ping = tcp.clone();
        ping.proto = IPPROTO_ICMPV6;
        ping.tcp_state = None;
        let icmp = Some(Icmp {
            kind: 128,
            code: 0,
            id: 77,
        });
        ping.orig = Tuple {
            icmp,
            ..tuple("fd00::1", "fd00::2", 0, 0)
        };
        ping.reply = Tuple {
            icmp: Some(Icmp {
                kind: 129,
                code: 0,
                id: 77,
            }),
            ..tuple("fd00::2", "fd00::1", 0, 0)
        };
        assert_eq!(parse_entry(&dump_message(&ping)), Some(ping));
    }

    #[test]
    fn delete_names_the_original_tuple_zone_and_id() {
        let e = Entry {
            proto: 17,
            orig: tuple("10.0.0.1", "10.0.0.2", 1000, 53),
            reply: tuple("10.0.0.2", "10.0.0.1", 53, 1000),
            status: 0,
            zone: 9,
            mark: 0,
            timeout: 30,
            id: Some(12345),
            tcp_state: None,
        };
        let bytes = delete_msg(&e).finish(1);
        let attrs: Vec<_> = Attrs::new(&bytes[20..]).collect();
        assert_eq!(
            attrs.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            vec![CTA_TUPLE_ORIG, CTA_ZONE, CTA_ID]
        );
        assert_eq!(parse_tuple(attrs[0].1), Some((17, e.orig)));
        assert_eq!(be16(attrs[1].1), Some(9));
        assert_eq!(be32(attrs[2].1), Some(12345));
    }

    #[test]
    fn an_entry_without_both_tuples_is_skipped() {
        let mut m = Msg::new(0, 0);
        m.raw(&[2, 0, 0, 0]).begin(CTA_TUPLE_ORIG);
        put_tuple(&mut m, 6, &tuple("10.0.0.1", "10.0.0.2", 1, 2));
        m.end().u32_be(CTA_STATUS, 8);
        assert_eq!(parse_entry(&m.finish(0)[16..]), None);
    }
}
