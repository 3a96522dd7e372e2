//! nftables trace events (`meta nftrace set 1`), read over nfnetlink: the
//! kernel's own account of every rule a marked packet met, in order.
//!
//! It owns the socket that joins the namespace's `NFNLGRP_NFTRACE`
//! multicast group ([`TraceListener`]) and a pure decoder ([`decode`]) of
//! the kernel's `NFT_MSG_TRACE` messages into [`TraceEvent`]s. `podnet
//! trace` builds its hop list from these, beside the pure tracers' answer.
//!
//! How the kernel reports: once a rule sets `nftrace` on a packet, every
//! base chain it passes afterwards, in every table of the namespace, sends
//! one event per rule that matched with a verdict or a jump (type
//! [`TraceKind::Rule`]), one when a chain returns ([`TraceKind::Return`])
//! and one when a base chain's policy decides ([`TraceKind::Policy`]). All
//! events of one packet's walk through one hook share an ID. The bit is
//! per packet: it does not follow the packet into a tunnel, and a reply
//! is not marked unless a rule marks it too. Events go only to listeners
//! in the packet's namespace; with no listener the kernel skips the work.
//!
//! Multicast delivery does not wait for a slow reader: a full receive
//! buffer drops events, and the next receive fails with `ENOBUFS`, which
//! [`TraceListener::lost`] counts.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::time::Duration;

use crate::nflog::NETLINK_NETFILTER;
use crate::nl::{Attrs, Socket};
use crate::KernelError;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_TRACE: u16 = 17;
const NFNLGRP_NFTRACE: i32 = 9;
const NETLINK_ADD_MEMBERSHIP: i32 = 1;

const NFTA_TRACE_TABLE: u16 = 1;
const NFTA_TRACE_CHAIN: u16 = 2;
const NFTA_TRACE_RULE_HANDLE: u16 = 3;
const NFTA_TRACE_TYPE: u16 = 4;
const NFTA_TRACE_VERDICT: u16 = 5;
const NFTA_TRACE_ID: u16 = 6;
const NFTA_TRACE_NETWORK_HEADER: u16 = 8;
const NFTA_TRACE_TRANSPORT_HEADER: u16 = 9;
const NFTA_TRACE_IIF: u16 = 10;
const NFTA_TRACE_OIF: u16 = 12;
const NFTA_TRACE_MARK: u16 = 14;
const NFTA_TRACE_NFPROTO: u16 = 15;
const NFTA_TRACE_POLICY: u16 = 16;

const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

/// Why an event was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceKind {
    /// A rule matched and gave a verdict (or jumped).
    Rule,
    /// A chain ended and control returned to its caller.
    Return,
    /// A base chain ended and its policy decided.
    Policy,
    Unknown(u32),
}

/// A verdict as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceVerdict {
    Accept,
    Drop,
    /// `continue`: the rule matched without deciding (a counter, a mark).
    Continue,
    Return,
    Jump(String),
    Goto(String),
    /// Another code (queue, stolen): its raw value.
    Other(i32),
}

impl TraceVerdict {
    fn from_code(code: i32, chain: Option<String>) -> TraceVerdict {
        match code {
            1 => TraceVerdict::Accept,
            0 => TraceVerdict::Drop,
            -1 => TraceVerdict::Continue,
            -5 => TraceVerdict::Return,
            -3 => TraceVerdict::Jump(chain.unwrap_or_default()),
            -4 => TraceVerdict::Goto(chain.unwrap_or_default()),
            c => TraceVerdict::Other(c),
        }
    }

    /// As `nft monitor trace` spells it.
    pub fn text(&self) -> String {
        match self {
            TraceVerdict::Accept => "accept".into(),
            TraceVerdict::Drop => "drop".into(),
            TraceVerdict::Continue => "continue".into(),
            TraceVerdict::Return => "return".into(),
            TraceVerdict::Jump(c) => format!("jump {c}"),
            TraceVerdict::Goto(c) => format!("goto {c}"),
            TraceVerdict::Other(c) => format!("verdict {c}"),
        }
    }
}

/// The packet as a trace event shows it: the headers the kernel copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TracedPacket {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    /// 0 when the event carried no transport header.
    pub sport: u16,
    pub dport: u16,
}

/// One trace event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEvent {
    /// Shared by the events of one packet's walk through one hook.
    pub id: u32,
    /// The protocol family of the table (`nfgen_family`): 1 inet, 2 ip,
    /// 10 ip6, 7 bridge, 5 netdev.
    pub family: u8,
    pub table: String,
    pub chain: String,
    /// The rule's handle, for [`TraceKind::Rule`].
    pub rule: Option<u64>,
    pub kind: TraceKind,
    pub verdict: Option<TraceVerdict>,
    /// For [`TraceKind::Policy`]: the chain's policy (accept or drop).
    pub policy: Option<TraceVerdict>,
    pub iif: Option<u32>,
    pub oif: Option<u32>,
    pub mark: u32,
    /// The packet's layer-3 family at this hook (2 or 10).
    pub nfproto: u8,
    /// Decoded from the copied headers (the first event of each walk
    /// carries them; later ones may not).
    pub packet: Option<TracedPacket>,
}

/// Decodes one `NFT_MSG_TRACE` body (nfgenmsg, then attributes). `None`
/// for a body too short to be one.
pub fn decode(body: &[u8]) -> Option<TraceEvent> {
    if body.len() < 4 {
        return None;
    }
    let mut e = TraceEvent {
        id: 0,
        family: body[0],
        table: String::new(),
        chain: String::new(),
        rule: None,
        kind: TraceKind::Unknown(0),
        verdict: None,
        policy: None,
        iif: None,
        oif: None,
        mark: 0,
        nfproto: 0,
        packet: None,
    };
    let be32 = |v: &[u8]| {
        v.get(..4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut network: Option<&[u8]> = None;
    let mut transport: Option<&[u8]> = None;
    for (ty, v) in Attrs::new(&body[4..]) {
        match ty {
            NFTA_TRACE_TABLE => e.table = crate::nl::get_str(v),
            NFTA_TRACE_CHAIN => e.chain = crate::nl::get_str(v),
            NFTA_TRACE_RULE_HANDLE if v.len() >= 8 => {
                e.rule = Some(u64::from_be_bytes(v[..8].try_into().ok()?))
            }
            NFTA_TRACE_TYPE => {
                e.kind = match be32(v)? {
                    1 => TraceKind::Policy,
                    2 => TraceKind::Return,
                    3 => TraceKind::Rule,
                    k => TraceKind::Unknown(k),
                }
            }
            NFTA_TRACE_VERDICT => e.verdict = verdict(v),
            NFTA_TRACE_ID => e.id = be32(v)?,
            NFTA_TRACE_NETWORK_HEADER => network = Some(v),
            NFTA_TRACE_TRANSPORT_HEADER => transport = Some(v),
            NFTA_TRACE_IIF => e.iif = be32(v),
            NFTA_TRACE_OIF => e.oif = be32(v),
            NFTA_TRACE_MARK => e.mark = be32(v).unwrap_or(0),
            NFTA_TRACE_NFPROTO => e.nfproto = be32(v).unwrap_or(0) as u8,
            NFTA_TRACE_POLICY => {
                e.policy = be32(v).map(|c| TraceVerdict::from_code(c as i32, None))
            }
            _ => {}
        }
    }
    e.packet = network.and_then(|n| packet(n, transport));
    Some(e)
}

fn verdict(nested: &[u8]) -> Option<TraceVerdict> {
    let mut code = None;
    let mut chain = None;
    for (ty, v) in Attrs::new(nested) {
        match ty {
            NFTA_VERDICT_CODE if v.len() >= 4 => {
                code = Some(i32::from_be_bytes([v[0], v[1], v[2], v[3]]))
            }
            NFTA_VERDICT_CHAIN => chain = Some(crate::nl::get_str(v)),
            _ => {}
        }
    }
    code.map(|c| TraceVerdict::from_code(c, chain))
}

/// Addresses from the network header, ports from the transport header
/// (TCP, UDP and SCTP all start with the two ports).
fn packet(net: &[u8], transport: Option<&[u8]>) -> Option<TracedPacket> {
    let (src, dst, proto) = match net.first()? >> 4 {
        4 if net.len() >= 20 => (
            IpAddr::V4(Ipv4Addr::new(net[12], net[13], net[14], net[15])),
            IpAddr::V4(Ipv4Addr::new(net[16], net[17], net[18], net[19])),
            net[9],
        ),
        6 if net.len() >= 40 => {
            let a: [u8; 16] = net[8..24].try_into().ok()?;
            let b: [u8; 16] = net[24..40].try_into().ok()?;
            (
                IpAddr::V6(Ipv6Addr::from(a)),
                IpAddr::V6(Ipv6Addr::from(b)),
                net[6],
            )
        }
        _ => return None,
    };
    let ports = transport
        .filter(|t| t.len() >= 4 && matches!(proto, 6 | 17 | 132))
        .map(|t| {
            (
                u16::from_be_bytes([t[0], t[1]]),
                u16::from_be_bytes([t[2], t[3]]),
            )
        })
        .unwrap_or((0, 0));
    Some(TracedPacket {
        src,
        dst,
        proto,
        sport: ports.0,
        dport: ports.1,
    })
}

/// A socket that hears the trace events of the namespace it was opened in.
pub struct TraceListener {
    sock: Socket,
    lost: u64,
}

impl TraceListener {
    /// Joins the trace group in the calling thread's network namespace.
    pub fn open() -> Result<TraceListener, KernelError> {
        let op = || "joining the nftables trace group".to_string();
        let sock = Socket::open(NETLINK_NETFILTER).map_err(|e| KernelError::io(op(), e))?;
        crate::nl::set_int_opt(
            sock.as_raw_fd(),
            libc::SOL_NETLINK,
            NETLINK_ADD_MEMBERSHIP,
            NFNLGRP_NFTRACE,
        )
        .map_err(|e| KernelError::io(op(), e))?;
        Ok(TraceListener { sock, lost: 0 })
    }

    /// Joins the trace group of `ns` (the socket stays in it).
    pub fn in_netns(ns: &crate::Netns) -> Result<TraceListener, KernelError> {
        ns.run(TraceListener::open)?
    }

    /// Makes [`TraceListener::recv`] return `Ok(vec![])` when nothing
    /// arrived within `timeout`; `None` waits forever.
    pub fn set_timeout(&mut self, timeout: Option<Duration>) -> Result<(), KernelError> {
        self.sock
            .set_recv_timeout(timeout)
            .map_err(|e| KernelError::io("setting the trace socket's timeout", e))
    }

    /// The events of the next datagram; empty after a timeout. An overrun
    /// is counted in [`TraceListener::lost`] and the wait goes on.
    pub fn recv(&mut self) -> Result<Vec<TraceEvent>, KernelError> {
        let Some(msgs) = self
            .sock
            .recv_counting(&mut self.lost, &|| "trace events".into())?
        else {
            return Ok(Vec::new());
        };
        let want = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_TRACE;
        Ok(msgs
            .filter(|m| m.msg_type == want)
            .filter_map(|m| decode(m.body))
            .collect())
    }

    /// Receive-buffer overruns so far (each may have dropped events).
    pub fn lost(&self) -> u64 {
        self.lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nl::Msg;

    #[test]
    fn decodes_a_rule_event() {
        // What the kernel sends for a rule that jumped, with headers.
        let mut m = Msg::new((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_TRACE, 0);
        m.raw(&[1, 0, 0, 0]); // inet
        m.str(NFTA_TRACE_TABLE, "podnet")
            .str(NFTA_TRACE_CHAIN, "services")
            .attr(NFTA_TRACE_RULE_HANDLE, &7u64.to_be_bytes())
            .u32_be(NFTA_TRACE_TYPE, 3)
            .u32_be(NFTA_TRACE_ID, 0xabcd)
            .u32_be(NFTA_TRACE_IIF, 4)
            .u32_be(NFTA_TRACE_NFPROTO, 2);
        m.begin(NFTA_TRACE_VERDICT)
            .u32_be(NFTA_VERDICT_CODE, (-3i32) as u32)
            .str(NFTA_VERDICT_CHAIN, "svc-web")
            .end();
        let mut ip = [0u8; 20];
        ip[0] = 0x45;
        ip[9] = 6;
        ip[12..16].copy_from_slice(&[10, 244, 1, 2]);
        ip[16..20].copy_from_slice(&[10, 96, 0, 10]);
        m.attr(NFTA_TRACE_NETWORK_HEADER, &ip);
        m.attr(
            NFTA_TRACE_TRANSPORT_HEADER,
            &[0xc3, 0x50, 0, 80, 0, 0, 0, 0],
        );
        let wire = m.finish(1);
        let e = decode(&wire[16..]).unwrap();
        assert_eq!(e.table, "podnet");
        assert_eq!(e.chain, "services");
        assert_eq!(e.rule, Some(7));
        assert_eq!(e.kind, TraceKind::Rule);
        assert_eq!(e.verdict, Some(TraceVerdict::Jump("svc-web".into())));
        assert_eq!(e.id, 0xabcd);
        assert_eq!(e.iif, Some(4));
        assert_eq!(e.oif, None);
        assert_eq!(e.nfproto, 2);
        let p = e.packet.unwrap();
        assert_eq!(p.src, "10.244.1.2".parse::<IpAddr>().unwrap());
        assert_eq!(p.dst, "10.96.0.10".parse::<IpAddr>().unwrap());
        assert_eq!((p.proto, p.sport, p.dport), (6, 50000, 80));
    }

    #[test]
    fn decodes_a_policy_event_without_headers() {
        let mut m = Msg::new((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_TRACE, 0);
        m.raw(&[2, 0, 0, 0]);
        m.str(NFTA_TRACE_TABLE, "filter")
            .str(NFTA_TRACE_CHAIN, "forward")
            .u32_be(NFTA_TRACE_TYPE, 1)
            .u32_be(NFTA_TRACE_POLICY, 0);
        let wire = m.finish(1);
        let e = decode(&wire[16..]).unwrap();
        assert_eq!(e.kind, TraceKind::Policy);
        assert_eq!(e.policy, Some(TraceVerdict::Drop));
        assert_eq!(e.packet, None);
        assert_eq!(e.rule, None);
        assert!(decode(&[1, 0]).is_none());
    }
}
