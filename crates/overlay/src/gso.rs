//! Segmentation and coalescing of IPv4 TCP super-packets in userspace, for
//! the UDP backend. Pure code: no sockets, no devices.
//!
//! The TUN device hands the agent whole TCP super-packets (a virtio-net
//! header saying "segment me at `gso_size`" followed by up to 64 KiB of one
//! TCP stream). The wire format between agents stays one complete IP packet
//! per UDP datagram, as flannel's `udp` mode has it, so the sending agent
//! cuts a super-packet into MSS-sized packets with their own headers and
//! checksums ([`segment`]), laid end to end so that one UDP GSO `sendmsg`
//! carries them all. The receiving agent gets them back as a UDP GRO batch
//! and glues consecutive packets of one TCP stream back into a super-packet
//! ([`Coalescer`]) that the kernel takes in one TUN write, with the same
//! virtio-net header. Anything else (other protocols, IP options,
//! fragments, SYN/FIN/RST/URG, ECN signals, out-of-order data) passes
//! through one packet at a time, unchanged.

pub use podnet_kernel::tun::VNET_HDR_LEN;
/// `flags`: the checksum at `csum_start + csum_offset` is still to be done.
pub const NEEDS_CSUM: u8 = 1;
/// `gso_type` values.
pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
pub const GSO_ECN: u8 = 0x80;

const TCP: u8 = 6;
const UDP: u8 = 17;
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_ACK: u8 = 0x10;
const TCP_CWR: u8 = 0x80;
/// The largest IPv4 packet; a coalesced packet stays below it.
const MAX_IP_LEN: usize = 65535;

/// The virtio-net header in front of every TUN read and write (little
/// endian, as the device uses on this architecture's hosts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    pub fn parse(b: &[u8]) -> Option<VnetHdr> {
        let b = b.get(..VNET_HDR_LEN)?;
        let u = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        })
    }

    pub fn encode(&self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b
    }
}

/// Why a packet from the TUN device cannot be sent.
#[derive(Debug, PartialEq, Eq)]
pub enum Unsendable {
    /// Not IPv4 TCP with sane headers, or the header's fields disagree with
    /// the packet.
    Malformed,
    /// A segmentation type this backend never enables (TCPv6, UDP).
    GsoType(u8),
}

/// Ones' complement sum (RFC 1071) of `data` added to `acc`, unfolded.
fn sum(data: &[u8], mut acc: u64) -> u64 {
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let (s, carry) = acc.overflowing_add(u64::from_be_bytes(w.try_into().unwrap()));
        acc = s + carry as u64;
    }
    let rest = words.remainder();
    let mut tail = [0u8; 8];
    tail[..rest.len()].copy_from_slice(rest);
    let (s, carry) = acc.overflowing_add(u64::from_be_bytes(tail));
    s + carry as u64
}

fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The IPv4 pseudo-header's share of a TCP/UDP checksum.
fn pseudo(ip: &[u8], proto: u8, l4_len: usize) -> u64 {
    sum(&ip[12..20], proto as u64 + l4_len as u64)
}

fn set_ip_checksum(ip: &mut [u8], ihl: usize) {
    ip[10..12].fill(0);
    let c = !fold(sum(&ip[..ihl], 0));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
}

/// IPv4 header length, protocol and TCP header length of a well-formed
/// IPv4 TCP packet whose total length field matches `p`.
fn tcp_v4(p: &[u8]) -> Option<(usize, usize)> {
    if p.len() < 40 || p[0] >> 4 != 4 || p[9] != TCP {
        return None;
    }
    let ihl = (p[0] & 0xf) as usize * 4;
    if ihl < 20 || u16::from_be_bytes([p[2], p[3]]) as usize != p.len() {
        return None;
    }
    let thl = (*p.get(ihl + 12)? >> 4) as usize * 4;
    if thl < 20 || ihl + thl > p.len() {
        return None;
    }
    Some((ihl, thl))
}

/// Completes a checksum the kernel left to the device (`NEEDS_CSUM`): the
/// field already holds the pseudo-header sum, so the rest is the sum of
/// everything from `csum_start` on.
pub fn finish_checksum(h: &VnetHdr, p: &mut [u8]) -> Result<(), Unsendable> {
    if h.flags & NEEDS_CSUM == 0 {
        return Ok(());
    }
    let start = h.csum_start as usize;
    let at = start + h.csum_offset as usize;
    if at + 2 > p.len() {
        return Err(Unsendable::Malformed);
    }
    let mut c = !fold(sum(&p[start..], 0));
    // The transport protocol: IPv4's protocol field, IPv6's next header.
    let proto = match p.first().map(|b| b >> 4) {
        Some(6) => p.get(6),
        _ => p.get(9),
    };
    if c == 0 && proto == Some(&UDP) {
        c = 0xffff; // zero means "no checksum" in UDP
    }
    p[at..at + 2].copy_from_slice(&c.to_be_bytes());
    Ok(())
}

/// Cuts an IPv4 TCP super-packet into packets of at most `gso_size` bytes
/// of payload, each with its own IP id, sequence number, flags and
/// checksums, appended to `out` end to end. All of them but the last have
/// the same length, which is returned (the UDP GSO segment size).
pub fn segment(h: &VnetHdr, p: &[u8], out: &mut Vec<u8>) -> Result<usize, Unsendable> {
    if h.gso_type & !GSO_ECN != GSO_TCPV4 {
        return Err(Unsendable::GsoType(h.gso_type));
    }
    let (ihl, thl) = tcp_v4(p).ok_or(Unsendable::Malformed)?;
    let mss = h.gso_size as usize;
    let hlen = ihl + thl;
    if mss == 0 || p.len() <= hlen {
        return Err(Unsendable::Malformed);
    }
    let payload = &p[hlen..];
    let id = u16::from_be_bytes([p[4], p[5]]);
    let seq = u32::from_be_bytes(p[ihl + 4..ihl + 8].try_into().unwrap());
    let flags = p[ihl + 13];
    let n = payload.len().div_ceil(mss);
    out.reserve(n * hlen + payload.len());
    for (i, chunk) in payload.chunks(mss).enumerate() {
        let start = out.len();
        out.extend_from_slice(&p[..hlen]);
        out.extend_from_slice(chunk);
        let s = &mut out[start..];
        s[2..4].copy_from_slice(&((hlen + chunk.len()) as u16).to_be_bytes());
        s[4..6].copy_from_slice(&id.wrapping_add(i as u16).to_be_bytes());
        set_ip_checksum(s, ihl);
        let t = ihl;
        s[t + 4..t + 8].copy_from_slice(&seq.wrapping_add((i * mss) as u32).to_be_bytes());
        let mut f = flags;
        if i + 1 < n {
            f &= !(TCP_FIN | TCP_PSH);
        }
        if i > 0 {
            f &= !TCP_CWR;
        }
        s[t + 13] = f;
        s[t + 16..t + 18].fill(0);
        let c = !fold(sum(&s[t..], pseudo(s, TCP, s.len() - t)));
        s[t + 16..t + 18].copy_from_slice(&c.to_be_bytes());
    }
    Ok(hlen + mss.min(payload.len()))
}

/// Glues consecutive in-order packets of one TCP stream back into one
/// super-packet for the TUN device. Feed it packets with [`push`]; when it
/// refuses one, [`take`] the pending packet and push again.
///
/// [`push`]: Coalescer::push
/// [`take`]: Coalescer::take
#[derive(Default)]
pub struct Coalescer {
    /// Virtio-net header room, then the packet being built.
    buf: Vec<u8>,
    segs: usize,
    mss: usize,
    last: usize,
    thl: usize,
    next_seq: u32,
}

/// A packet that may start or join a super-packet: IPv4 without options,
/// not a fragment, TCP carrying data with only ACK (and maybe PSH) set.
/// Returns the TCP header length and payload length.
fn joinable(p: &[u8]) -> Option<(usize, usize)> {
    let (ihl, thl) = tcp_v4(p)?;
    let frag = u16::from_be_bytes([p[6], p[7]]) & 0x3fff;
    let flags = p[ihl + 13];
    if ihl != 20 || frag != 0 || flags & !TCP_PSH != TCP_ACK || p[1] & 3 == 3 {
        return None;
    }
    let payload = p.len() - 20 - thl;
    (payload > 0).then_some((thl, payload))
}

impl Coalescer {
    fn pending(&self) -> &[u8] {
        &self.buf[VNET_HDR_LEN..]
    }

    /// Takes `p` into the pending super-packet, or starts one. False when
    /// it cannot: the caller takes what is pending, then pushes again; a
    /// packet refused with nothing pending passes through on its own.
    pub fn push(&mut self, p: &[u8]) -> bool {
        let Some((thl, len)) = joinable(p) else {
            return false;
        };
        let seq = u32::from_be_bytes(p[24..28].try_into().unwrap());
        if self.segs == 0 {
            self.buf.clear();
            self.buf.resize(VNET_HDR_LEN, 0);
            self.buf.extend_from_slice(p);
            (self.segs, self.mss, self.last, self.thl) = (1, len, len, thl);
            self.next_seq = seq.wrapping_add(len as u32);
            return true;
        }
        let q = self.pending();
        let hlen = 20 + thl;
        let fits = q.len() + len <= MAX_IP_LEN;
        let same_flow = thl == self.thl
            && q[1] == p[1] // TOS and ECN
            && q[6] & 0x40 == p[6] & 0x40 // DF
            && q[8] == p[8] // TTL
            && q[12..24] == p[12..24] // addresses and ports
            && q[28..33] == p[28..33] // ack, data offset
            && q[34..36] == p[34..36] // window
            && q[40..hlen] == p[40..hlen]; // options
        let in_order = seq == self.next_seq
            && self.last == self.mss
            && len <= self.mss
            && q[33] & TCP_PSH == 0;
        if !(fits && same_flow && in_order) {
            return false;
        }
        let flags = p[33];
        self.buf.extend_from_slice(&p[hlen..]);
        self.buf[VNET_HDR_LEN + 33] = flags;
        self.segs += 1;
        self.last = len;
        self.next_seq = seq.wrapping_add(len as u32);
        true
    }

    /// The pending packet, virtio-net header first, ready for one TUN
    /// write; nothing pending gives `None`. A single packet goes out as it
    /// came; a glued one with fresh IP length and checksum and its TCP
    /// checksum left to the kernel.
    pub fn take(&mut self) -> Option<&[u8]> {
        if self.segs == 0 {
            return None;
        }
        let segs = std::mem::take(&mut self.segs);
        let h = if segs == 1 {
            VnetHdr::default()
        } else {
            let ip = &mut self.buf[VNET_HDR_LEN..];
            let total = ip.len();
            ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            set_ip_checksum(ip, 20);
            let partial = fold(pseudo(ip, TCP, total - 20));
            ip[36..38].copy_from_slice(&partial.to_be_bytes());
            VnetHdr {
                flags: NEEDS_CSUM,
                gso_type: GSO_TCPV4,
                hdr_len: (20 + self.thl) as u16,
                gso_size: self.mss as u16,
                csum_start: 20,
                csum_offset: 16,
            }
        };
        self.buf[..VNET_HDR_LEN].copy_from_slice(&h.encode());
        Some(&self.buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP_SYN: u8 = 0x02;
    const TCP_RST: u8 = 0x04;

    /// Checksum the slow, obvious way: 16-bit words, folded at the end.
    fn reference_sum(data: &[u8]) -> u32 {
        let mut s: u32 = 0;
        for c in data.chunks(2) {
            let w = if c.len() == 2 {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from_be_bytes([c[0], 0])
            };
            s += w as u32;
        }
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        s
    }

    fn ip_ok(p: &[u8]) -> bool {
        reference_sum(&p[..20]) == 0xffff
    }

    fn tcp_ok(p: &[u8]) -> bool {
        let l4 = &p[20..];
        let mut ph = Vec::new();
        ph.extend_from_slice(&p[12..20]);
        ph.extend_from_slice(&[0, TCP]);
        ph.extend_from_slice(&(l4.len() as u16).to_be_bytes());
        ph.extend_from_slice(l4);
        reference_sum(&ph) == 0xffff
    }

    /// A TCP super-packet with timestamps, as the kernel hands it over
    /// (checksum field holding the pseudo-header sum).
    fn super_packet(payload: usize, flags: u8) -> (VnetHdr, Vec<u8>) {
        let total = 20 + 32 + payload;
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[4..6].copy_from_slice(&0xfff0u16.to_be_bytes());
        p[6] = 0x40;
        p[8] = 64;
        p[9] = TCP;
        p[12..16].copy_from_slice(&[10, 244, 1, 2]);
        p[16..20].copy_from_slice(&[10, 244, 2, 3]);
        p[20..22].copy_from_slice(&40000u16.to_be_bytes());
        p[22..24].copy_from_slice(&5201u16.to_be_bytes());
        p[24..28].copy_from_slice(&0xffff_f000u32.to_be_bytes()); // wraps
        p[28..32].copy_from_slice(&77u32.to_be_bytes());
        p[32] = 8 << 4;
        p[33] = flags;
        p[34..36].copy_from_slice(&500u16.to_be_bytes());
        p[40..52].copy_from_slice(&[1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 7]);
        for (i, b) in p[52..].iter_mut().enumerate() {
            *b = (i * 7 + i / 251) as u8;
        }
        set_ip_checksum(&mut p, 20);
        let partial = fold(pseudo(&p, TCP, total - 20));
        p[36..38].copy_from_slice(&partial.to_be_bytes());
        let h = VnetHdr {
            flags: NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: 52,
            gso_size: 1398,
            csum_start: 20,
            csum_offset: 16,
        };
        (h, p)
    }

    #[test]
    fn fast_sum_matches_the_reference() {
        for len in [0, 1, 2, 7, 8, 9, 63, 1500, 1501] {
            let d: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
            assert_eq!(fold(sum(&d, 0)) as u32, reference_sum(&d), "len {len}");
        }
        let ff = vec![0xffu8; 4096];
        assert_eq!(fold(sum(&ff, 0)) as u32, reference_sum(&ff));
    }

    #[test]
    fn segments_carry_valid_headers_and_the_whole_stream() {
        let (h, p) = super_packet(64000, TCP_ACK | TCP_PSH | TCP_CWR);
        let mut out = Vec::new();
        let seg = segment(&h, &p, &mut out).unwrap();
        assert_eq!(seg, 52 + 1398);
        let pkts: Vec<&[u8]> = out.chunks(seg).collect();
        assert_eq!(pkts.len(), 64000usize.div_ceil(1398));
        let mut data = Vec::new();
        for (i, s) in pkts.iter().enumerate() {
            assert!(ip_ok(s) && tcp_ok(s), "segment {i} checksums");
            assert_eq!(u16::from_be_bytes([s[2], s[3]]) as usize, s.len());
            assert_eq!(
                u16::from_be_bytes([s[4], s[5]]),
                0xfff0u16.wrapping_add(i as u16)
            );
            let seq = u32::from_be_bytes(s[24..28].try_into().unwrap());
            assert_eq!(seq, 0xffff_f000u32.wrapping_add((i * 1398) as u32));
            let last = i + 1 == pkts.len();
            assert_eq!(s[33] & TCP_PSH != 0, last, "PSH only on the last");
            assert_eq!(s[33] & TCP_CWR != 0, i == 0, "CWR only on the first");
            assert_eq!(s[40..52], p[40..52], "options copied");
            data.extend_from_slice(&s[52..]);
        }
        assert_eq!(data, p[52..]);
    }

    #[test]
    fn coalescing_undoes_segmentation() {
        let (h, p) = super_packet(64000, TCP_ACK | TCP_PSH);
        let mut out = Vec::new();
        let seg = segment(&h, &p, &mut out).unwrap();
        let mut c = Coalescer::default();
        for s in out.chunks(seg) {
            assert!(c.push(s));
        }
        let glued = c.take().unwrap().to_vec();
        let gh = VnetHdr::parse(&glued).unwrap();
        assert_eq!(
            gh,
            VnetHdr {
                flags: NEEDS_CSUM,
                gso_type: GSO_TCPV4,
                hdr_len: 52,
                gso_size: 1398,
                csum_start: 20,
                csum_offset: 16
            }
        );
        let ip = &glued[VNET_HDR_LEN..];
        assert!(ip_ok(ip));
        // The same packet the kernel handed over, id and all.
        assert_eq!(ip, &p[..]);
        assert!(c.take().is_none());
    }

    #[test]
    fn coalescer_refuses_what_it_must_not_glue() {
        let (h, p) = super_packet(1398 * 3, TCP_ACK);
        let mut out = Vec::new();
        let seg = segment(&h, &p, &mut out).unwrap();
        let s: Vec<Vec<u8>> = out.chunks(seg).map(<[u8]>::to_vec).collect();
        let mut c = Coalescer::default();
        // Out of order: the third before the second.
        assert!(c.push(&s[0]));
        assert!(!c.push(&s[2]));
        let one = c.take().unwrap().to_vec();
        assert_eq!(VnetHdr::parse(&one).unwrap(), VnetHdr::default());
        assert_eq!(&one[VNET_HDR_LEN..], &s[0][..]);
        // Another flow (port) does not join.
        let mut other = s[1].clone();
        other[21] ^= 1;
        assert!(c.push(&s[0]) && !c.push(&other));
        c.take();
        // SYN, FIN, RST and pure ACKs pass through alone.
        for f in [TCP_SYN, TCP_ACK | TCP_FIN, TCP_RST | TCP_ACK] {
            let mut x = s[0].clone();
            x[33] = f;
            assert!(!c.push(&x), "flags {f:#x}");
        }
        let (_, ack) = super_packet(0, TCP_ACK);
        assert!(!c.push(&ack));
        // Nothing joins after a short (last) segment or a PSH.
        let (_, short) = super_packet(100, TCP_ACK);
        assert!(c.push(&short));
        assert!(!c.push(&s[1]));
        c.take();
        // Non-TCP passes through.
        let mut udp = s[0].clone();
        udp[9] = UDP;
        assert!(!c.push(&udp));
    }

    #[test]
    fn finishing_a_checksum() {
        let (mut h, mut p) = super_packet(700, TCP_ACK);
        h.gso_type = GSO_NONE;
        finish_checksum(&h, &mut p).unwrap();
        assert!(tcp_ok(&p));
        h.csum_offset = 2000;
        assert_eq!(finish_checksum(&h, &mut p), Err(Unsendable::Malformed));
        h.gso_type = 4; // TCPv6
        assert_eq!(
            segment(&h, &p, &mut Vec::new()),
            Err(Unsendable::GsoType(4))
        );
    }

    #[test]
    fn header_round_trip() {
        let h = VnetHdr {
            flags: 1,
            gso_type: GSO_TCPV4 | GSO_ECN,
            hdr_len: 66,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
        };
        assert_eq!(VnetHdr::parse(&h.encode()), Some(h));
        assert_eq!(VnetHdr::parse(&[0; 9]), None);
    }
}
