//! The packets of an nftables `log group N` rule, read over nfnetlink_log
//! (NETLINK_NETFILTER, subsystem ULOG): the kernel half of a verdict log.
//!
//! It owns one group's socket ([`Listener`]), the wire format of the
//! kernel's packet messages and the accounting of what was lost on the way,
//! and a pure parser ([`parse_flow`]) that turns the copied bytes into the
//! (source, destination, protocol, ports) a log line names.
//!
//! How the kernel delivers: a `log group N` rule hands each packet to the
//! group's instance, which is the socket that bound N in that network
//! namespace (groups are per namespace, one socket each; the instance goes
//! when the socket closes). The instance copies up to [`COPY_RANGE`] bytes
//! from the network header on, batches messages into one datagram until
//! [`QUEUE_THRESHOLD`] packets, the batch buffer is full or
//! [`FLUSH_TIMEOUT_CS`] hundredths of a second pass, and sends it without
//! waiting. A full receive buffer therefore drops a whole batch: the next
//! receive fails with `ENOBUFS`, and the per-group sequence numbers
//! ([`LogPacket::seq`]) show how many packets went. [`Listener::lost`] counts
//! both; a reader that falls behind learns it, it does not block the data
//! path.
//!
//! No `PF_BIND`: that command makes nfnetlink_log the namespace's default
//! logger (what `net.netfilter.nf_log.N` selects), used only by callers
//! that log without naming a logger, such as conntrack's invalid-packet log.
//! `log group` names its logger (type ULOG), so binding the group suffices,
//! and a listener leaves the namespace's default alone.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use crate::nl::{Attrs, Msg, Socket};
use crate::KernelError;

pub(crate) const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_ULOG: u16 = 4;
const NFULNL_MSG_PACKET: u16 = 0;
const NFULNL_MSG_CONFIG: u16 = 1;

const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULA_CFG_NLBUFSIZ: u16 = 3;
const NFULA_CFG_TIMEOUT: u16 = 4;
const NFULA_CFG_QTHRESH: u16 = 5;
const NFULA_CFG_FLAGS: u16 = 6;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_COPY_PACKET: u8 = 2;
const NFULNL_CFG_F_SEQ: u16 = 0x0001;

const NFULA_PAYLOAD: u16 = 9;
const NFULA_PREFIX: u16 = 10;
const NFULA_SEQ: u16 = 12;

/// Bytes copied from each packet, from the network header on: enough for
/// an IPv4 header with options or an IPv6 header with a few extension
/// headers, plus the ports.
pub const COPY_RANGE: u32 = 128;
/// Packets the kernel gathers into one datagram before sending it.
pub const QUEUE_THRESHOLD: u32 = 128;
/// The longest a logged packet waits in the kernel for its batch to fill,
/// in hundredths of a second.
pub const FLUSH_TIMEOUT_CS: u32 = 10;
/// The kernel's batch buffer (its ceiling is 128 KiB).
const BATCH_BYTES: u32 = 64 << 10;
/// Room for many batches while the reader is busy (the kernel doubles the
/// figure passed to it, so this makes 8 MiB).
const RECV_BUFFER: i32 = 4 << 20;

/// One logged packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogPacket {
    /// The rule's `log prefix`, empty when it has none.
    pub prefix: String,
    /// The packet's family as the hook saw it (`nfgen_family`):
    /// `AF_INET` (2), `AF_INET6` (10) or `AF_BRIDGE` (7); an `inet` table
    /// logs each packet under its own family.
    pub family: u8,
    /// Up to [`COPY_RANGE`] bytes from the network header on.
    pub payload: Vec<u8>,
    /// The group's sequence number for this packet.
    pub seq: Option<u32>,
}

/// The socket bound to one log group in the namespace it was made in.
pub struct Listener {
    sock: Socket,
    group: u16,
    /// The sequence number the next packet should carry.
    next_seq: Option<u32>,
    lost: u64,
}

impl Listener {
    /// Binds log group `group` in the calling thread's network namespace,
    /// copying [`COPY_RANGE`] bytes of each packet with sequence numbers.
    /// `EPERM` means another socket holds the group.
    pub fn bind(group: u16) -> Result<Listener, KernelError> {
        let op = || format!("binding nflog group {group}");
        let mut sock = Socket::open(NETLINK_NETFILTER).map_err(|e| KernelError::io(op(), e))?;
        sock.set_recv_buffer(RECV_BUFFER)
            .map_err(|e| KernelError::io(op(), e))?;
        // One message: the kernel creates the instance for the command,
        // then applies the settings to it.
        let mut mode = [0u8; 6]; // nfulnl_msg_config_mode, packed
        mode[..4].copy_from_slice(&COPY_RANGE.to_be_bytes());
        mode[4] = NFULNL_COPY_PACKET;
        let mut m = config(group);
        m.attr(NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND])
            .attr(NFULA_CFG_MODE, &mode)
            .u32_be(NFULA_CFG_NLBUFSIZ, BATCH_BYTES)
            .u32_be(NFULA_CFG_QTHRESH, QUEUE_THRESHOLD)
            .u32_be(NFULA_CFG_TIMEOUT, FLUSH_TIMEOUT_CS)
            .u16_be(NFULA_CFG_FLAGS, NFULNL_CFG_F_SEQ);
        sock.request(m, &op)?;
        Ok(Listener {
            sock,
            group,
            next_seq: None,
            lost: 0,
        })
    }

    pub fn group(&self) -> u16 {
        self.group
    }

    /// Sets how much the kernel may queue for this listener while it is
    /// busy (8 MiB by default); past it, batches are dropped and counted
    /// in [`Listener::lost`]. The kernel doubles the figure for its
    /// bookkeeping and never goes below about 2 KiB.
    pub fn set_buffer(&mut self, bytes: usize) -> Result<(), KernelError> {
        let v = i32::try_from(bytes / 2).unwrap_or(i32::MAX / 2);
        self.sock.set_recv_buffer(v).map_err(|e| {
            KernelError::io(
                format!("setting the receive buffer of nflog group {}", self.group),
                e,
            )
        })
    }

    /// Makes [`Listener::recv`] return `Ok(vec![])` when nothing arrived
    /// within `timeout`, so a reading thread can check a stop flag;
    /// `None` (the default) waits forever.
    pub fn set_timeout(&mut self, timeout: Option<Duration>) -> Result<(), KernelError> {
        self.sock.set_recv_timeout(timeout).map_err(|e| {
            KernelError::io(
                format!("setting the receive timeout of nflog group {}", self.group),
                e,
            )
        })
    }

    /// Waits for the next datagram and returns the packets it holds (the
    /// kernel batches several into one); empty after a timeout. An overrun
    /// (`ENOBUFS`) is counted in [`Listener::lost`] and the wait goes on.
    pub fn recv(&mut self) -> Result<Vec<LogPacket>, KernelError> {
        let group = self.group;
        let Some(msgs) = self
            .sock
            .recv_counting(&mut self.lost, &|| format!("nflog group {group}"))?
        else {
            return Ok(Vec::new());
        };
        let packet_type = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET;
        let packets: Vec<LogPacket> = msgs
            .filter(|m| m.msg_type == packet_type)
            .filter_map(|m| parse_packet(m.body))
            .collect();
        for seq in packets.iter().filter_map(|p| p.seq) {
            self.lost += gap(&mut self.next_seq, seq);
        }
        Ok(packets)
    }

    /// Losses so far: receive-buffer overruns (each may have dropped a
    /// batch) plus packets missing from the sequence.
    pub fn lost(&self) -> u64 {
        self.lost
    }
}

/// An `NFULNL_MSG_CONFIG` request for `group`, acknowledged.
fn config(group: u16) -> Msg {
    let mut m = Msg::new(
        (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG,
        crate::nl::NLM_F_ACK,
    );
    m.raw(&nfgenmsg(libc::AF_UNSPEC as u8, group));
    m
}

pub(crate) fn nfgenmsg(family: u8, res_id: u16) -> [u8; 4] {
    let id = res_id.to_be_bytes();
    [family, 0, id[0], id[1]] // version NFNETLINK_V0
}

/// One `NFULNL_MSG_PACKET` body: nfgenmsg, then attributes.
fn parse_packet(body: &[u8]) -> Option<LogPacket> {
    if body.len() < 4 {
        return None;
    }
    let mut p = LogPacket {
        prefix: String::new(),
        family: body[0],
        payload: Vec::new(),
        seq: None,
    };
    for (ty, v) in Attrs::new(&body[4..]) {
        match ty {
            NFULA_PREFIX => p.prefix = crate::nl::get_str(v),
            NFULA_PAYLOAD => p.payload = v.to_vec(),
            NFULA_SEQ if v.len() >= 4 => p.seq = Some(u32::from_be_bytes([v[0], v[1], v[2], v[3]])),
            _ => {}
        }
    }
    Some(p)
}

/// Moves the expected sequence number past `seq`; how many numbers were
/// skipped to get there. A number from the past (which a single instance
/// never sends) counts nothing.
fn gap(next: &mut Option<u32>, seq: u32) -> u64 {
    let skipped = match *next {
        Some(want) => seq.wrapping_sub(want),
        None => 0,
    };
    *next = Some(seq.wrapping_add(1));
    if skipped < 1 << 31 {
        skipped as u64
    } else {
        0
    }
}

/// What a log line names about a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flow {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// The transport protocol (after IPv6 extension headers).
    pub proto: u8,
    /// 0 for protocols without ports, for fragments after the first, and
    /// when the copy ends before the ports.
    pub sport: u16,
    pub dport: u16,
}

pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_DCCP: u8 = 33;
pub const IPPROTO_SCTP: u8 = 132;
pub const IPPROTO_UDPLITE: u8 = 136;

/// Whether `proto`'s header opens with 16-bit source and destination ports.
pub fn has_ports(proto: u8) -> bool {
    matches!(
        proto,
        IPPROTO_TCP | IPPROTO_UDP | IPPROTO_DCCP | IPPROTO_SCTP | IPPROTO_UDPLITE
    )
}

/// The flow of an IPv4 or IPv6 packet, from its first bytes (the network
/// header on, as [`LogPacket::payload`] holds them). `None` when the bytes
/// are not a whole IP header.
pub fn parse_flow(payload: &[u8]) -> Option<Flow> {
    match payload.first()? >> 4 {
        4 => parse_v4(payload),
        6 => parse_v6(payload),
        _ => None,
    }
}

fn parse_v4(p: &[u8]) -> Option<Flow> {
    let ihl = usize::from(p[0] & 0x0f) * 4;
    if ihl < 20 || p.len() < ihl {
        return None;
    }
    let proto = p[9];
    let src = Ipv4Addr::from(<[u8; 4]>::try_from(&p[12..16]).ok()?);
    let dst = Ipv4Addr::from(<[u8; 4]>::try_from(&p[16..20]).ok()?);
    // Only the first fragment (offset 0) carries the transport header.
    let first = u16::from_be_bytes([p[6], p[7]]) & 0x1fff == 0;
    Some(flow(
        src.into(),
        dst.into(),
        proto,
        first.then(|| &p[ihl..]),
    ))
}

/// A flow whose transport header is `l4` (None: unknown, ports 0).
fn flow(src: IpAddr, dst: IpAddr, proto: u8, l4: Option<&[u8]>) -> Flow {
    let (sport, dport) = l4.map_or((0, 0), |l4| ports(proto, l4));
    Flow {
        src,
        dst,
        proto,
        sport,
        dport,
    }
}

const NEXTHDR_HOP: u8 = 0;
const NEXTHDR_ROUTING: u8 = 43;
const NEXTHDR_FRAGMENT: u8 = 44;
const NEXTHDR_AUTH: u8 = 51;
const NEXTHDR_DEST: u8 = 60;

fn parse_v6(p: &[u8]) -> Option<Flow> {
    if p.len() < 40 {
        return None;
    }
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(&p[8..24]).ok()?);
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&p[24..40]).ok()?);
    let mut proto = p[6];
    let mut off = 40;
    let mut first = true;
    // Walk the extension headers; when the copy ends inside one, the
    // protocol is the last header named and the ports are unknown.
    loop {
        let len = match proto {
            NEXTHDR_HOP | NEXTHDR_ROUTING | NEXTHDR_DEST => {
                p.get(off + 1).map(|&l| (usize::from(l) + 1) * 8)
            }
            NEXTHDR_AUTH => p.get(off + 1).map(|&l| (usize::from(l) + 2) * 4),
            NEXTHDR_FRAGMENT => {
                if let Some(f) = p.get(off + 2..off + 4) {
                    first = u16::from_be_bytes([f[0], f[1]]) & 0xfff8 == 0;
                }
                p.get(off + 1).map(|_| 8)
            }
            _ => break,
        };
        match (len, p.get(off)) {
            (Some(len), Some(&next)) if off + len <= p.len() => {
                proto = next;
                off += len;
            }
            _ => return Some(flow(src.into(), dst.into(), proto, None)),
        }
    }
    Some(flow(
        src.into(),
        dst.into(),
        proto,
        first.then(|| &p[off..]),
    ))
}

fn ports(proto: u8, l4: &[u8]) -> (u16, u16) {
    if !has_ports(proto) || l4.len() < 4 {
        return (0, 0);
    }
    (
        u16::from_be_bytes([l4[0], l4[1]]),
        u16::from_be_bytes([l4[2], l4[3]]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(proto: u8, frag: u16, options: usize, l4: &[u8]) -> Vec<u8> {
        let ihl = 20 + options;
        let mut p = vec![0u8; ihl];
        p[0] = 0x40 | (ihl / 4) as u8;
        p[2..4].copy_from_slice(&((ihl + l4.len()) as u16).to_be_bytes());
        p[6..8].copy_from_slice(&frag.to_be_bytes());
        p[8] = 64;
        p[9] = proto;
        p[12..16].copy_from_slice(&[10, 244, 1, 5]);
        p[16..20].copy_from_slice(&[10, 96, 0, 10]);
        p.extend_from_slice(l4);
        p
    }

    fn v6(next: u8, ext: &[u8], l4: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; 40];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&((ext.len() + l4.len()) as u16).to_be_bytes());
        p[6] = next;
        p[7] = 64;
        p[8..24].copy_from_slice(&"fd00::1".parse::<Ipv6Addr>().unwrap().octets());
        p[24..40].copy_from_slice(&"fd00::2".parse::<Ipv6Addr>().unwrap().octets());
        p.extend_from_slice(ext);
        p.extend_from_slice(l4);
        p
    }

    fn flow(src: &str, dst: &str, proto: u8, sport: u16, dport: u16) -> Flow {
        Flow {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            proto,
            sport,
            dport,
        }
    }

    /// Source port 40000, destination port 53, then the rest of a header.
    const PORTS: [u8; 8] = [0x9c, 0x40, 0x00, 0x35, 0, 8, 0, 0];

    #[test]
    fn ipv4_transport_ports() {
        for proto in [IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP] {
            assert_eq!(
                parse_flow(&v4(proto, 0, 0, &PORTS)),
                Some(flow("10.244.1.5", "10.96.0.10", proto, 40000, 53))
            );
        }
        // Options move the transport header.
        assert_eq!(
            parse_flow(&v4(IPPROTO_UDP, 0, 8, &PORTS)),
            Some(flow("10.244.1.5", "10.96.0.10", 17, 40000, 53))
        );
        // The "don't fragment" bit is not a fragment offset.
        assert_eq!(parse_flow(&v4(6, 0x4000, 0, &PORTS)).unwrap().dport, 53);
    }

    #[test]
    fn ipv4_without_ports() {
        // ICMP echo: no ports.
        assert_eq!(
            parse_flow(&v4(1, 0, 0, &[8, 0, 0, 0, 0, 1, 0, 1])),
            Some(flow("10.244.1.5", "10.96.0.10", 1, 0, 0))
        );
        // A later fragment carries no transport header.
        assert_eq!(
            parse_flow(&v4(IPPROTO_UDP, 185, 0, &PORTS)),
            Some(flow("10.244.1.5", "10.96.0.10", 17, 0, 0))
        );
        // The copy ends before the ports.
        assert_eq!(
            parse_flow(&v4(IPPROTO_TCP, 0, 0, &PORTS[..3])),
            Some(flow("10.244.1.5", "10.96.0.10", 6, 0, 0))
        );
    }

    #[test]
    fn ipv6_fixed_header_and_extensions() {
        assert_eq!(
            parse_flow(&v6(IPPROTO_TCP, &[], &PORTS)),
            Some(flow("fd00::1", "fd00::2", 6, 40000, 53))
        );
        // Hop-by-hop (8 bytes) then destination options (16 bytes) then UDP.
        let mut ext = vec![NEXTHDR_DEST, 0, 1, 4, 0, 0, 0, 0];
        ext.extend_from_slice(&[IPPROTO_UDP, 1]);
        ext.resize(24, 0);
        assert_eq!(
            parse_flow(&v6(NEXTHDR_HOP, &ext, &PORTS)),
            Some(flow("fd00::1", "fd00::2", 17, 40000, 53))
        );
        // First fragment: ports; a later one: none.
        let first = [IPPROTO_UDP, 0, 0, 0x01, 0, 0, 0, 7];
        assert_eq!(
            parse_flow(&v6(NEXTHDR_FRAGMENT, &first, &PORTS))
                .unwrap()
                .sport,
            40000
        );
        let later = [IPPROTO_UDP, 0, 0x05, 0x00, 0, 0, 0, 7];
        assert_eq!(
            parse_flow(&v6(NEXTHDR_FRAGMENT, &later, &PORTS)),
            Some(flow("fd00::1", "fd00::2", 17, 0, 0))
        );
        // AH counts its length in 4-byte units, minus two.
        let ah = [
            IPPROTO_TCP,
            4,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ];
        assert_eq!(
            parse_flow(&v6(NEXTHDR_AUTH, &ah, &PORTS)),
            Some(flow("fd00::1", "fd00::2", 6, 40000, 53))
        );
        // ICMPv6 has no ports.
        assert_eq!(
            parse_flow(&v6(58, &[], &[128, 0, 0, 0])),
            Some(flow("fd00::1", "fd00::2", 58, 0, 0))
        );
        // The copy ends inside an extension header: its protocol, no ports.
        assert_eq!(
            parse_flow(&v6(NEXTHDR_HOP, &ext[..12], &[])),
            Some(flow("fd00::1", "fd00::2", NEXTHDR_DEST, 0, 0))
        );
    }

    #[test]
    fn not_an_ip_header() {
        assert_eq!(parse_flow(&[]), None);
        assert_eq!(parse_flow(&v4(6, 0, 0, &[])[..19]), None);
        assert_eq!(parse_flow(&[0x45; 10]), None);
        assert_eq!(parse_flow(&[0x42; 40]), None); // IHL below 5
        assert_eq!(parse_flow(&v6(6, &[], &[])[..39]), None);
        assert_eq!(parse_flow(&[0x20; 60]), None);
    }

    #[test]
    fn packet_message_attributes() {
        let mut m = Msg::new((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET, 0);
        m.raw(&nfgenmsg(libc::AF_INET6 as u8, 7))
            .attr(1, &[0x86, 0xdd, 3, 0]) // NFULA_PACKET_HDR
            .attr(NFULA_PAYLOAD, &[0x60, 1, 2])
            .str(NFULA_PREFIX, "pn-drop")
            .u32_be(NFULA_SEQ, 41);
        let bytes = m.finish(0);
        assert_eq!(
            parse_packet(&bytes[16..]),
            Some(LogPacket {
                prefix: "pn-drop".into(),
                family: libc::AF_INET6 as u8,
                payload: vec![0x60, 1, 2],
                seq: Some(41),
            })
        );
    }

    #[test]
    fn sequence_gaps_count_missing_packets() {
        let mut next = None;
        assert_eq!(gap(&mut next, 5), 0); // the first number seen sets the pace
        assert_eq!(gap(&mut next, 6), 0);
        assert_eq!(gap(&mut next, 9), 2);
        assert_eq!(gap(&mut next, 10), 0);
        assert_eq!(gap(&mut next, 3), 0); // from the past: not a loss
        let mut next = Some(u32::MAX);
        assert_eq!(gap(&mut next, u32::MAX), 0);
        assert_eq!(gap(&mut next, 1), 1); // wraps past 0
    }
}
