//! IPv6 Neighbor Discovery over Ethernet (RFC 4861): the Neighbor
//! Solicitations a responder answers (ICMPv6 type 135) and the Neighbor
//! Advertisements (type 136) it answers with or announces unasked.
//!
//! Validation follows RFC 4861 sections 7.1.1 and 7.1.2: hop limit 255 (so
//! the packet cannot have crossed a router), a correct checksum over the
//! IPv6 pseudo-header, code 0, at least 24 bytes of ICMPv6, a target that
//! is not multicast, no option of length 0, and for a solicitation from
//! the unspecified address (duplicate address detection) a solicited-node
//! destination and no source link-layer option. Messages behind IPv6
//! extension headers are rejected: Neighbor Discovery does not use them,
//! and a responder that chased them would parse more for nothing.
//!
//! Advertisements we build carry the target link-layer address option and
//! the Override flag, and come from the target address itself (as Linux's
//! advertisements of its own addresses do), so they need no other address
//! on the interface.

use std::net::Ipv6Addr;

use super::{mac_at, need, Ethernet, Mac, PacketError, ETHERTYPE_IPV6, ETH_HLEN};

pub const ICMPV6_NEXT_HEADER: u8 = 58;
pub const TYPE_SOLICITATION: u8 = 135;
pub const TYPE_ADVERTISEMENT: u8 = 136;
/// The only hop limit Neighbor Discovery accepts.
pub const HOP_LIMIT: u8 = 255;

const IPV6_HLEN: usize = 40;
/// ICMPv6 type, code, checksum, 4 bytes of flags/reserved, the target.
const ND_LEN: usize = 24;
const OPT_SOURCE_LLADDR: u8 = 1;
const OPT_TARGET_LLADDR: u8 = 2;

const FLAG_ROUTER: u8 = 0x80;
const FLAG_SOLICITED: u8 = 0x40;
const FLAG_OVERRIDE: u8 = 0x20;

/// ff02::1, where unsolicited advertisements go.
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
/// 33:33:00:00:00:01, the Ethernet address of [`ALL_NODES`].
pub const ALL_NODES_MAC: Mac = [0x33, 0x33, 0, 0, 0, 1];

/// A Neighbor Solicitation: who has `target`?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Solicitation {
    /// The Ethernet source, where the answer goes when the solicitation
    /// carries no source link-layer address option.
    pub eth_src: Mac,
    /// `::` during duplicate address detection.
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub target: Ipv6Addr,
    pub source_lladdr: Option<Mac>,
}

/// A Neighbor Advertisement: `target` is at `target_lladdr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advertisement {
    pub eth_dst: Mac,
    pub eth_src: Mac,
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub target: Ipv6Addr,
    pub router: bool,
    /// An answer to a solicitation (never set when sent to multicast).
    pub solicited: bool,
    /// Replace the link-layer address the receiver has cached.
    pub override_: bool,
    pub target_lladdr: Option<Mac>,
}

/// One parsed Neighbor Discovery message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    Solicitation(Solicitation),
    Advertisement(Advertisement),
}

/// The IPv6 and ICMPv6 layers of a frame, checked up to the ND body.
struct Icmp<'a> {
    eth: Ethernet,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    /// The ICMPv6 message, exactly as long as the IPv6 payload length says.
    msg: &'a [u8],
}

/// Parses a Neighbor Solicitation or Advertisement frame, validated as
/// RFC 4861 requires.
pub fn parse_frame(f: &[u8]) -> Result<Message, PacketError> {
    let icmp = parse_icmp(f)?;
    let m = icmp.msg;
    let target = ip6_at(m, 8);
    if target.is_multicast() {
        return Err(PacketError::Invalid(
            "Neighbor Discovery target is multicast",
        ));
    }
    match m[0] {
        TYPE_SOLICITATION => {
            let source_lladdr = lladdr_option(&m[ND_LEN..], OPT_SOURCE_LLADDR)?;
            if icmp.src.is_unspecified() {
                if icmp.dst != solicited_node(target) {
                    return Err(PacketError::Invalid(
                        "solicitation from :: not sent to the target's solicited-node address",
                    ));
                }
                if source_lladdr.is_some() {
                    return Err(PacketError::Invalid(
                        "solicitation from :: carries a source link-layer address",
                    ));
                }
            }
            Ok(Message::Solicitation(Solicitation {
                eth_src: icmp.eth.src,
                src: icmp.src,
                dst: icmp.dst,
                target,
                source_lladdr,
            }))
        }
        TYPE_ADVERTISEMENT => {
            let flags = m[4];
            let solicited = flags & FLAG_SOLICITED != 0;
            if solicited && icmp.dst.is_multicast() {
                return Err(PacketError::Invalid(
                    "solicited advertisement sent to a multicast address",
                ));
            }
            Ok(Message::Advertisement(Advertisement {
                eth_dst: icmp.eth.dst,
                eth_src: icmp.eth.src,
                src: icmp.src,
                dst: icmp.dst,
                target,
                router: flags & FLAG_ROUTER != 0,
                solicited,
                override_: flags & FLAG_OVERRIDE != 0,
                target_lladdr: lladdr_option(&m[ND_LEN..], OPT_TARGET_LLADDR)?,
            }))
        }
        _ => Err(PacketError::Invalid(
            "ICMPv6 type is not Neighbor Discovery",
        )),
    }
}

/// Ethernet, IPv6 and the ICMPv6 checks common to both messages.
fn parse_icmp(f: &[u8]) -> Result<Icmp<'_>, PacketError> {
    let (eth, ip) = Ethernet::parse_typed(f, ETHERTYPE_IPV6)?;
    need("IPv6 header", ip, IPV6_HLEN)?;
    super::expect("IP version", (ip[0] >> 4).into(), 6)?;
    super::expect("IPv6 next header", ip[6].into(), ICMPV6_NEXT_HEADER.into())?;
    if ip[7] != HOP_LIMIT {
        return Err(PacketError::HopLimit(ip[7]));
    }
    let len = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    let payload = &ip[IPV6_HLEN..];
    need("IPv6 payload", payload, len)?;
    let msg = &payload[..len];
    need("Neighbor Discovery message", msg, ND_LEN)?;
    let (src, dst) = (ip6_at(ip, 8), ip6_at(ip, 24));
    let sum = fold(pseudo_sum(&src, &dst, msg.len()) + sum_words(msg));
    if sum != 0xffff {
        let mut zeroed = msg.to_vec();
        zeroed[2..4].fill(0);
        return Err(PacketError::Checksum {
            got: u16::from_be_bytes([msg[2], msg[3]]),
            want: checksum(&src, &dst, &zeroed),
        });
    }
    super::expect("ICMPv6 code", msg[1].into(), 0)?;
    Ok(Icmp { eth, src, dst, msg })
}

/// The link-layer address in the option of `kind`, after checking that
/// every option is well formed (length not 0, not past the end).
fn lladdr_option(mut opts: &[u8], kind: u8) -> Result<Option<Mac>, PacketError> {
    let mut found = None;
    while !opts.is_empty() {
        need("Neighbor Discovery option", opts, 2)?;
        let len = usize::from(opts[1]) * 8;
        if len == 0 {
            return Err(PacketError::Invalid(
                "Neighbor Discovery option of length 0",
            ));
        }
        need("Neighbor Discovery option", opts, len)?;
        // An Ethernet link-layer option is 8 bytes: type, length, address.
        if opts[0] == kind && found.is_none() {
            found = Some(mac_at(opts, 2));
        }
        opts = &opts[len..];
    }
    Ok(found)
}

impl Solicitation {
    /// Parses a frame that must be a valid Neighbor Solicitation.
    pub fn parse_frame(f: &[u8]) -> Result<Solicitation, PacketError> {
        match parse_frame(f)? {
            Message::Solicitation(s) => Ok(s),
            Message::Advertisement(_) => Err(PacketError::Unexpected {
                field: "ICMPv6 type",
                value: TYPE_ADVERTISEMENT.into(),
                expected: TYPE_SOLICITATION.into(),
            }),
        }
    }

    /// The frame of this solicitation, sent to `eth_dst` (the
    /// solicited-node group's MAC, or a cached MAC when re-checking a
    /// neighbour). Responders never solicit; tests and tools do.
    pub fn frame(&self, eth_dst: Mac) -> Vec<u8> {
        let mut icmp = Vec::with_capacity(ND_LEN + 8);
        icmp.extend_from_slice(&[TYPE_SOLICITATION, 0, 0, 0, 0, 0, 0, 0]);
        icmp.extend_from_slice(&self.target.octets());
        if let Some(mac) = self.source_lladdr {
            icmp.extend_from_slice(&[OPT_SOURCE_LLADDR, 1]);
            icmp.extend_from_slice(&mac);
        }
        icmp_frame(eth_dst, self.eth_src, self.src, self.dst, icmp)
    }

    /// The advertisement that answers this solicitation for the host at
    /// `mac` owning `self.target`: unicast back to the solicitor, or, for
    /// duplicate address detection (source `::`), to all nodes with the
    /// Solicited flag clear, so the prober learns the address is taken.
    pub fn reply(&self, mac: Mac) -> Advertisement {
        let (eth_dst, dst, solicited) = if self.src.is_unspecified() {
            (ALL_NODES_MAC, ALL_NODES, false)
        } else {
            (self.source_lladdr.unwrap_or(self.eth_src), self.src, true)
        };
        Advertisement {
            eth_dst,
            eth_src: mac,
            src: self.target,
            dst,
            target: self.target,
            router: false,
            solicited,
            override_: true,
            target_lladdr: Some(mac),
        }
    }
}

impl Advertisement {
    /// The unsolicited advertisement announcing that `ip` is now at `mac`,
    /// to all nodes, with Override set so caches switch at once (RFC 4861
    /// section 7.2.6).
    pub fn unsolicited(mac: Mac, ip: Ipv6Addr) -> Advertisement {
        Advertisement {
            eth_dst: ALL_NODES_MAC,
            eth_src: mac,
            src: ip,
            dst: ALL_NODES,
            target: ip,
            router: false,
            solicited: false,
            override_: true,
            target_lladdr: Some(mac),
        }
    }

    /// The Ethernet frame: IPv6 with hop limit 255, ICMPv6 with its
    /// checksum.
    pub fn frame(&self) -> Vec<u8> {
        let mut icmp = Vec::with_capacity(ND_LEN + 8);
        icmp.extend_from_slice(&[TYPE_ADVERTISEMENT, 0, 0, 0]);
        let flag = |on: bool, bit: u8| if on { bit } else { 0 };
        let flags = flag(self.router, FLAG_ROUTER)
            | flag(self.solicited, FLAG_SOLICITED)
            | flag(self.override_, FLAG_OVERRIDE);
        icmp.extend_from_slice(&[flags, 0, 0, 0]);
        icmp.extend_from_slice(&self.target.octets());
        if let Some(mac) = self.target_lladdr {
            icmp.extend_from_slice(&[OPT_TARGET_LLADDR, 1]);
            icmp.extend_from_slice(&mac);
        }
        icmp_frame(self.eth_dst, self.eth_src, self.src, self.dst, icmp)
    }
}

/// An Ethernet frame carrying ICMPv6 message `icmp` (checksum field zero,
/// filled in here) in IPv6 with hop limit 255.
fn icmp_frame(
    eth_dst: Mac,
    eth_src: Mac,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    mut icmp: Vec<u8>,
) -> Vec<u8> {
    let sum = checksum(&src, &dst, &icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    let mut f = Vec::with_capacity(ETH_HLEN + IPV6_HLEN + icmp.len());
    Ethernet {
        dst: eth_dst,
        src: eth_src,
        ethertype: ETHERTYPE_IPV6,
    }
    .write(&mut f);
    f.extend_from_slice(&[0x60, 0, 0, 0]); // version 6, class 0, flow 0
                                           // An ND message we build is at most 32 bytes: the cast cannot truncate.
    f.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
    f.extend_from_slice(&[ICMPV6_NEXT_HEADER, HOP_LIMIT]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&icmp);
    f
}

/// The ICMPv6 checksum of `icmp` (its checksum field zero) between `src`
/// and `dst`: the ones' complement of the ones' complement sum over the
/// pseudo-header (RFC 8200 section 8.1) and the message.
pub fn checksum(src: &Ipv6Addr, dst: &Ipv6Addr, icmp: &[u8]) -> u16 {
    !fold(pseudo_sum(src, dst, icmp.len()) + sum_words(icmp))
}

/// The solicited-node multicast address of `ip` (ff02::1:ffXX:XXXX),
/// where solicitations for it are sent.
pub fn solicited_node(ip: Ipv6Addr) -> Ipv6Addr {
    let o = ip.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    )
}

/// The Ethernet address of IPv6 multicast address `group`: 33:33 and its
/// last four bytes (RFC 2464 section 7).
pub fn multicast_mac(group: Ipv6Addr) -> Mac {
    let o = group.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

fn pseudo_sum(src: &Ipv6Addr, dst: &Ipv6Addr, len: usize) -> u64 {
    let mut sum = sum_words(&src.octets()) + sum_words(&dst.octets());
    sum += len as u64; // the 32-bit length; an ND message is far below 2^16
    sum + u64::from(ICMPV6_NEXT_HEADER)
}

fn sum_words(b: &[u8]) -> u64 {
    let mut chunks = b.chunks_exact(2);
    let mut sum: u64 = chunks
        .by_ref()
        .map(|w| u64::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    if let [last] = chunks.remainder() {
        sum += u64::from(*last) << 8;
    }
    sum
}

fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

fn ip6_at(b: &[u8], at: usize) -> Ipv6Addr {
    let mut o = [0u8; 16];
    o.copy_from_slice(&b[at..at + 16]);
    Ipv6Addr::from(o)
}

#[cfg(test)]
mod tests {
    use super::super::fuzz::mutations;
    use super::*;

    const CLIENT: Mac = [0x02, 0, 0, 0, 0, 0x01];
    const NODE: Mac = [0x02, 0, 0, 0, 0, 0x0a];
    const CLIENT_IP: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1);
    const LB_IP: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x200);

    /// "Who has 2001:db8:1::200?" from 2001:db8:1::1, written out by hand;
    /// the checksum (0x1829) was computed apart from this code (Python,
    /// RFC 8200's pseudo-header).
    fn ns_bytes() -> Vec<u8> {
        [
            &[0x33, 0x33, 0xff, 0x00, 0x02, 0x00][..], // dst: solicited-node MAC
            &CLIENT,
            &[0x86, 0xdd],
            &[0x60, 0, 0, 0, 0x00, 0x20, 58, 255], // v6, payload 32, ICMPv6, hop 255
            &CLIENT_IP.octets(),
            &[
                0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0xff, 0x00, 0x02, 0x00,
            ],
            &[135, 0, 0x18, 0x29, 0, 0, 0, 0], // NS, code 0, checksum, reserved
            &LB_IP.octets(),
            &[1, 1, 0x02, 0, 0, 0, 0, 0x01], // source link-layer address
        ]
        .concat()
    }

    /// Fixes the checksum of a frame built by [`ns_bytes`] after an edit.
    fn recheck(f: &mut [u8]) {
        let src = ip6_at(f, 22);
        let dst = ip6_at(f, 38);
        f[56..58].fill(0);
        let sum = checksum(&src, &dst, &f[54..]);
        f[56..58].copy_from_slice(&sum.to_be_bytes());
    }

    #[test]
    fn parses_a_hand_made_solicitation() {
        assert_eq!(
            Solicitation::parse_frame(&ns_bytes()).unwrap(),
            Solicitation {
                eth_src: CLIENT,
                src: CLIENT_IP,
                dst: "ff02::1:ff00:200".parse().unwrap(),
                target: LB_IP,
                source_lladdr: Some(CLIENT),
            }
        );
        assert_eq!(
            solicited_node(LB_IP),
            "ff02::1:ff00:200".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            multicast_mac(solicited_node(LB_IP)),
            [0x33, 0x33, 0xff, 0, 2, 0]
        );
    }

    #[test]
    fn the_solicitation_builder_reproduces_the_hand_made_bytes() {
        let ns = Solicitation::parse_frame(&ns_bytes()).unwrap();
        assert_eq!(ns.frame([0x33, 0x33, 0xff, 0x00, 0x02, 0x00]), ns_bytes());
    }

    #[test]
    fn the_reply_is_a_solicited_override_advertisement_with_a_known_checksum() {
        let ns = Solicitation::parse_frame(&ns_bytes()).unwrap();
        let f = ns.reply(NODE).frame();
        let want: Vec<u8> = [
            &CLIENT[..],
            &NODE,
            &[0x86, 0xdd],
            &[0x60, 0, 0, 0, 0x00, 0x20, 58, 255],
            &LB_IP.octets(),
            &CLIENT_IP.octets(),
            &[136, 0, 0x86, 0x6a, 0x60, 0, 0, 0], // NA, checksum, S|O
            &LB_IP.octets(),
            &[2, 1, 0x02, 0, 0, 0, 0, 0x0a], // target link-layer address
        ]
        .concat();
        assert_eq!(f, want);
        let Message::Advertisement(na) = parse_frame(&f).unwrap() else {
            panic!("not an advertisement");
        };
        assert!(na.solicited && na.override_ && !na.router);
        assert_eq!(na.target_lladdr, Some(NODE));
    }

    #[test]
    fn the_unsolicited_advertisement_goes_to_all_nodes_with_override() {
        let f = Advertisement::unsolicited(NODE, LB_IP).frame();
        assert_eq!(&f[..6], &ALL_NODES_MAC);
        assert_eq!(&f[38..54], &ALL_NODES.octets());
        assert_eq!(&f[54..58], &[136, 0, 0xf5, 0x21]); // checksum computed apart
        assert_eq!(f[58], FLAG_OVERRIDE);
        assert_eq!(f[21], 255);
    }

    #[test]
    fn duplicate_address_detection_is_answered_to_all_nodes() {
        let dad: Vec<u8> = [
            &[0x33, 0x33, 0xff, 0x00, 0x02, 0x00][..],
            &CLIENT,
            &[0x86, 0xdd, 0x60, 0, 0, 0, 0x00, 0x18, 58, 255],
            &Ipv6Addr::UNSPECIFIED.octets(),
            &solicited_node(LB_IP).octets(),
            &[135, 0, 0x48, 0xee, 0, 0, 0, 0],
            &LB_IP.octets(),
        ]
        .concat();
        let ns = Solicitation::parse_frame(&dad).unwrap();
        let na = ns.reply(NODE);
        assert_eq!(
            (na.dst, na.eth_dst, na.solicited),
            (ALL_NODES, ALL_NODES_MAC, false)
        );
        // From :: it must go to the solicited-node address ...
        let mut f = dad.clone();
        f[53] = 0x01;
        recheck(&mut f);
        assert_eq!(
            parse_frame(&f).unwrap_err(),
            PacketError::Invalid(
                "solicitation from :: not sent to the target's solicited-node address"
            )
        );
    }

    #[test]
    fn rejects_what_rfc_4861_says_to_drop() {
        let good = ns_bytes();
        let mut f = good.clone();
        f[21] = 64; // hop limit: routed here from elsewhere
        assert_eq!(parse_frame(&f).unwrap_err(), PacketError::HopLimit(64));
        let mut f = good.clone();
        f[57] ^= 1;
        assert_eq!(
            parse_frame(&f).unwrap_err(),
            PacketError::Checksum {
                got: 0x1828,
                want: 0x1829
            }
        );
        let mut f = good.clone();
        f[55] = 1; // code 1
        recheck(&mut f);
        assert_eq!(
            parse_frame(&f).unwrap_err().to_string(),
            "ICMPv6 code is 0x1, expected 0x0"
        );
        let mut f = good.clone();
        f[62] = 0xff; // target ff..: multicast
        recheck(&mut f);
        assert_eq!(
            parse_frame(&f).unwrap_err(),
            PacketError::Invalid("Neighbor Discovery target is multicast")
        );
        let mut f = good.clone();
        f[79] = 0; // option length 0
        recheck(&mut f);
        assert_eq!(
            parse_frame(&f).unwrap_err(),
            PacketError::Invalid("Neighbor Discovery option of length 0")
        );
        let mut f = good.clone();
        f[20] = 0; // next header: hop-by-hop options
        assert_eq!(
            parse_frame(&f).unwrap_err().to_string(),
            "IPv6 next header is 0x0, expected 0x3a"
        );
        assert_eq!(
            parse_frame(&good[..80]).unwrap_err().to_string(),
            "IPv6 payload truncated: need 32 bytes, got 26"
        );
        let mut f = good.clone();
        f[54] = 128; // echo request
        recheck(&mut f);
        assert_eq!(
            parse_frame(&f).unwrap_err(),
            PacketError::Invalid("ICMPv6 type is not Neighbor Discovery")
        );
    }

    #[test]
    fn a_solicited_advertisement_to_multicast_is_invalid() {
        let mut na = Advertisement::unsolicited(NODE, LB_IP);
        na.solicited = true;
        assert_eq!(
            parse_frame(&na.frame()).unwrap_err(),
            PacketError::Invalid("solicited advertisement sent to a multicast address")
        );
        assert_eq!(
            Solicitation::parse_frame(&Advertisement::unsolicited(NODE, LB_IP).frame())
                .unwrap_err()
                .to_string(),
            "ICMPv6 type is 0x88, expected 0x87"
        );
    }

    #[test]
    fn fuzz_never_panics() {
        let na = Advertisement::unsolicited(NODE, LB_IP).frame();
        for (seed, base) in [(1, ns_bytes()), (2, na)] {
            for f in mutations(&base, 20_000, seed) {
                if let Ok(Message::Solicitation(ns)) = parse_frame(&f) {
                    let reply = ns.reply(NODE).frame();
                    assert!(
                        parse_frame(&reply).is_ok(),
                        "our reply must itself be valid"
                    );
                }
            }
        }
    }
}
