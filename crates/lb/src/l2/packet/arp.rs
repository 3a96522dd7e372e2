//! ARP over Ethernet for IPv4 (RFC 826): the requests a responder answers,
//! its replies, and the gratuitous ARP it sends when it gains an address
//! (an RFC 5227 "ARP Announcement": a broadcast request whose sender and
//! target protocol addresses are both the announced address).
//!
//! Linux treats such a request as authoritative: it replaces the
//! neighbour entry's link-layer address even inside the entry's
//! `locktime` (1 s by default), which an ordinary reply would not.

use std::net::Ipv4Addr;

use super::{expect, mac_at, need, pad, Ethernet, Mac, PacketError, BROADCAST, ETHERTYPE_ARP};

/// `ar_hrd` for Ethernet.
const HTYPE_ETHERNET: u16 = 1;
/// Bytes of an Ethernet/IPv4 ARP packet.
pub const ARP_LEN: usize = 28;

pub const OP_REQUEST: u16 = 1;
pub const OP_REPLY: u16 = 2;

/// An Ethernet/IPv4 ARP packet. Other hardware or protocol types are
/// rejected when parsing: nothing else can ask for an IPv4 address on an
/// Ethernet segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arp {
    pub op: u16,
    /// Sender hardware address.
    pub sha: Mac,
    /// Sender protocol address; 0.0.0.0 in an RFC 5227 probe.
    pub spa: Ipv4Addr,
    /// Target hardware address; ignored in requests.
    pub tha: Mac,
    /// Target protocol address: the address asked about.
    pub tpa: Ipv4Addr,
}

impl Arp {
    /// Parses the ARP packet at the start of `b` (trailing Ethernet
    /// padding is allowed).
    pub fn parse(b: &[u8]) -> Result<Arp, PacketError> {
        need("ARP packet", b, ARP_LEN)?;
        expect(
            "ARP hardware type",
            be16(b, 0).into(),
            HTYPE_ETHERNET.into(),
        )?;
        expect("ARP protocol type", be16(b, 2).into(), 0x0800)?;
        expect("ARP hardware length", b[4].into(), 6)?;
        expect("ARP protocol length", b[5].into(), 4)?;
        let op = be16(b, 6);
        if op != OP_REQUEST && op != OP_REPLY {
            return Err(PacketError::Invalid(
                "ARP operation is neither request nor reply",
            ));
        }
        Ok(Arp {
            op,
            sha: mac_at(b, 8),
            spa: ip_at(b, 14),
            tha: mac_at(b, 18),
            tpa: ip_at(b, 24),
        })
    }

    /// Appends the 28 bytes of the packet to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&HTYPE_ETHERNET.to_be_bytes());
        out.extend_from_slice(&0x0800u16.to_be_bytes());
        out.extend_from_slice(&[6, 4]);
        out.extend_from_slice(&self.op.to_be_bytes());
        out.extend_from_slice(&self.sha);
        out.extend_from_slice(&self.spa.octets());
        out.extend_from_slice(&self.tha);
        out.extend_from_slice(&self.tpa.octets());
    }

    /// A sender announcing (or defending) its own address rather than
    /// asking for one: sender and target protocol addresses are equal.
    pub fn is_gratuitous(&self) -> bool {
        self.spa == self.tpa
    }

    /// The reply to this request from the host at `mac` that owns
    /// `self.tpa`, as an Ethernet frame addressed to the requester. It
    /// also answers an RFC 5227 probe (sender 0.0.0.0), telling the prober
    /// the address is taken.
    pub fn reply(&self, mac: Mac) -> Vec<u8> {
        let reply = Arp {
            op: OP_REPLY,
            sha: mac,
            spa: self.tpa,
            tha: self.sha,
            tpa: self.spa,
        };
        frame(self.sha, mac, &reply)
    }
}

/// An Ethernet frame carrying `arp`, padded to the Ethernet minimum.
pub fn frame(dst: Mac, src: Mac, arp: &Arp) -> Vec<u8> {
    let mut out = Vec::with_capacity(super::ETH_MIN_FRAME);
    Ethernet {
        dst,
        src,
        ethertype: ETHERTYPE_ARP,
    }
    .write(&mut out);
    arp.write(&mut out);
    pad(out)
}

/// The Ethernet header and ARP packet of a frame.
pub fn parse_frame(f: &[u8]) -> Result<(Ethernet, Arp), PacketError> {
    let (eth, payload) = Ethernet::parse_typed(f, ETHERTYPE_ARP)?;
    Ok((eth, Arp::parse(payload)?))
}

/// The gratuitous ARP announcing that `ip` is now at `mac`: a broadcast
/// request with sender = target = `ip` and a zero target hardware address
/// (RFC 5227 section 2.3).
pub fn gratuitous(mac: Mac, ip: Ipv4Addr) -> Vec<u8> {
    let arp = Arp {
        op: OP_REQUEST,
        sha: mac,
        spa: ip,
        tha: [0; 6],
        tpa: ip,
    };
    frame(BROADCAST, mac, &arp)
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn ip_at(b: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3])
}

#[cfg(test)]
mod tests {
    use super::super::fuzz::mutations;
    use super::*;

    const CLIENT: Mac = [0x02, 0x00, 0x00, 0x00, 0x00, 0x01];
    const NODE: Mac = [0x02, 0x00, 0x00, 0x00, 0x00, 0x0a];

    /// "Who has 198.51.100.200? Tell 198.51.100.1", written out by hand
    /// from RFC 826's layout, with 18 bytes of Ethernet padding.
    fn request_bytes() -> Vec<u8> {
        let mut f = vec![
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // dst: broadcast
            0x02, 0x00, 0x00, 0x00, 0x00, 0x01, // src: client
            0x08, 0x06, // EtherType ARP
            0x00, 0x01, 0x08, 0x00, 0x06, 0x04, // Ethernet, IPv4, 6, 4
            0x00, 0x01, // request
            0x02, 0x00, 0x00, 0x00, 0x00, 0x01, // sha
            198, 51, 100, 1, // spa
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // tha
            198, 51, 100, 200, // tpa
        ];
        f.resize(60, 0);
        f
    }

    #[test]
    fn parses_a_hand_made_request() {
        let (eth, arp) = parse_frame(&request_bytes()).unwrap();
        assert_eq!((eth.dst, eth.src), (BROADCAST, CLIENT));
        assert_eq!(
            arp,
            Arp {
                op: OP_REQUEST,
                sha: CLIENT,
                spa: Ipv4Addr::new(198, 51, 100, 1),
                tha: [0; 6],
                tpa: Ipv4Addr::new(198, 51, 100, 200),
            }
        );
        assert!(!arp.is_gratuitous());
    }

    #[test]
    fn the_reply_goes_to_the_requester_and_swaps_the_addresses() {
        let (_, req) = parse_frame(&request_bytes()).unwrap();
        let reply = req.reply(NODE);
        let want: Vec<u8> = [
            &[0x02, 0x00, 0x00, 0x00, 0x00, 0x01][..], // dst: client
            &[0x02, 0x00, 0x00, 0x00, 0x00, 0x0a],     // src: node
            &[0x08, 0x06, 0x00, 0x01, 0x08, 0x00, 0x06, 0x04],
            &[0x00, 0x02],                         // reply
            &[0x02, 0x00, 0x00, 0x00, 0x00, 0x0a], // sha: node
            &[198, 51, 100, 200],                  // spa: the LB IP
            &[0x02, 0x00, 0x00, 0x00, 0x00, 0x01], // tha: client
            &[198, 51, 100, 1],                    // tpa: client
            &[0; 18],                              // padding
        ]
        .concat();
        assert_eq!(reply, want);
    }

    #[test]
    fn gratuitous_arp_is_a_broadcast_request_for_its_own_address() {
        let ip = Ipv4Addr::new(198, 51, 100, 200);
        let f = gratuitous(NODE, ip);
        assert_eq!(f.len(), 60);
        let (eth, arp) = parse_frame(&f).unwrap();
        assert_eq!((eth.dst, eth.src), (BROADCAST, NODE));
        assert_eq!(
            (arp.op, arp.sha, arp.spa, arp.tpa),
            (OP_REQUEST, NODE, ip, ip)
        );
        assert_eq!(arp.tha, [0; 6]);
        assert!(arp.is_gratuitous());
    }

    #[test]
    fn rejects_what_is_not_an_ethernet_ipv4_arp_packet() {
        let good = request_bytes();
        let mut f = good.clone();
        f[15] = 6; // hardware type 6 (IEEE 802)
        assert_eq!(
            parse_frame(&f).unwrap_err().to_string(),
            "ARP hardware type is 0x6, expected 0x1"
        );
        let mut f = good.clone();
        f[16] = 0x86; // protocol type 0x86dd
        f[17] = 0xdd;
        assert!(parse_frame(&f)
            .unwrap_err()
            .to_string()
            .starts_with("ARP protocol type"));
        let mut f = good.clone();
        f[21] = 3; // RARP request
        assert_eq!(
            parse_frame(&f).unwrap_err(),
            PacketError::Invalid("ARP operation is neither request nor reply")
        );
        assert_eq!(
            parse_frame(&good[..41]).unwrap_err().to_string(),
            "ARP packet truncated: need 28 bytes, got 27"
        );
    }

    #[test]
    fn fuzz_never_panics_and_whatever_parses_round_trips() {
        for f in mutations(&request_bytes(), 20_000, 0x005e_eda1) {
            if let Ok((eth, arp)) = parse_frame(&f) {
                let rebuilt = frame(eth.dst, eth.src, &arp);
                assert_eq!(&rebuilt[..42], &f[..42]);
                let _ = arp.reply(NODE);
            }
        }
    }
}
