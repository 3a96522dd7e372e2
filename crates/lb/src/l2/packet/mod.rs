//! The wire format of L2 announcement: Ethernet frames carrying ARP
//! (RFC 826, RFC 5227 announcements) and IPv6 Neighbor Discovery (RFC 4861
//! solicitations and advertisements). Pure: bytes in, typed values out, and
//! back; nothing here touches a socket.
//!
//! Parsing never panics and never trusts a length field: every read is
//! bounds-checked, and a frame that is short, of the wrong kind or invalid
//! under its RFC's validation rules is an [`PacketError`] that says which
//! field was wrong. The responder drops such frames.
//!
//! - [`arp`]: ARP requests and replies, gratuitous ARP;
//! - [`ndp`]: Neighbor Solicitation / Advertisement, the ICMPv6 checksum,
//!   solicited-node and all-nodes multicast.

pub mod arp;
pub mod ndp;

/// An Ethernet (EUI-48) address, as the kernel's `Link::mac` holds it.
pub type Mac = [u8; 6];

/// The Ethernet broadcast address: where ARP requests and announcements go.
pub const BROADCAST: Mac = [0xff; 6];

/// Bytes of an Ethernet header without a VLAN tag: destination, source,
/// EtherType. Packet sockets on the tagged subinterface see untagged frames.
pub const ETH_HLEN: usize = 14;

/// The shortest Ethernet frame without its FCS. Frames we build are padded
/// to it, as a NIC would pad them; a veth would not.
pub const ETH_MIN_FRAME: usize = 60;

pub const ETHERTYPE_ARP: u16 = 0x0806;
pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_IPV6: u16 = 0x86dd;

/// Why a frame was not the packet we looked for, or not a valid one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    #[error("{what} truncated: need {need} bytes, got {got}")]
    Truncated {
        what: &'static str,
        need: usize,
        got: usize,
    },
    #[error("{field} is {value:#x}, expected {expected:#x}")]
    Unexpected {
        field: &'static str,
        value: u32,
        expected: u32,
    },
    #[error("hop limit is {0}, RFC 4861 requires 255 (the packet may come from off-link)")]
    HopLimit(u8),
    #[error("ICMPv6 checksum is {got:#06x}, computed {want:#06x}")]
    Checksum { got: u16, want: u16 },
    #[error("{0}")]
    Invalid(&'static str),
}

/// The Ethernet header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ethernet {
    pub dst: Mac,
    pub src: Mac,
    pub ethertype: u16,
}

impl Ethernet {
    /// The header and the payload after it.
    pub fn parse(frame: &[u8]) -> Result<(Ethernet, &[u8]), PacketError> {
        need("Ethernet header", frame, ETH_HLEN)?;
        let eth = Ethernet {
            dst: mac_at(frame, 0),
            src: mac_at(frame, 6),
            ethertype: u16::from_be_bytes([frame[12], frame[13]]),
        };
        Ok((eth, &frame[ETH_HLEN..]))
    }

    /// Appends the header's 14 bytes to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.dst);
        out.extend_from_slice(&self.src);
        out.extend_from_slice(&self.ethertype.to_be_bytes());
    }

    /// The header and the payload after it, when the frame carries
    /// `ethertype`; an error naming the type it does carry otherwise.
    pub(crate) fn parse_typed(
        frame: &[u8],
        ethertype: u16,
    ) -> Result<(Ethernet, &[u8]), PacketError> {
        let (eth, payload) = Ethernet::parse(frame)?;
        expect("EtherType", eth.ethertype.into(), ethertype.into())?;
        Ok((eth, payload))
    }
}

/// `Mac` as `aa:bb:cc:dd:ee:ff`, the way `ip neigh` prints it.
pub fn format_mac(mac: &Mac) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

pub(crate) fn need(what: &'static str, b: &[u8], len: usize) -> Result<(), PacketError> {
    if b.len() < len {
        return Err(PacketError::Truncated {
            what,
            need: len,
            got: b.len(),
        });
    }
    Ok(())
}

pub(crate) fn expect(field: &'static str, value: u32, expected: u32) -> Result<(), PacketError> {
    if value != expected {
        return Err(PacketError::Unexpected {
            field,
            value,
            expected,
        });
    }
    Ok(())
}

/// Six bytes at `at`; the caller has checked the length.
pub(crate) fn mac_at(b: &[u8], at: usize) -> Mac {
    let mut m = [0u8; 6];
    m.copy_from_slice(&b[at..at + 6]);
    m
}

/// Pads a built frame to the Ethernet minimum.
pub(crate) fn pad(mut frame: Vec<u8>) -> Vec<u8> {
    if frame.len() < ETH_MIN_FRAME {
        frame.resize(ETH_MIN_FRAME, 0);
    }
    frame
}

#[cfg(test)]
pub(crate) mod fuzz {
    //! Mutated frames for the fuzz-style loops of the codec's tests (from
    //! the test kit's seeded generator, so a failure reproduces).

    use podnet_testkit::Rng;

    /// Every prefix of `frame`, and `rounds` copies of it with a few random
    /// bytes flipped: what the fuzz loops feed the parsers.
    pub fn mutations(frame: &[u8], rounds: usize, seed: u64) -> Vec<Vec<u8>> {
        let mut rng = Rng::new(seed);
        let mut out: Vec<Vec<u8>> = (0..=frame.len()).map(|n| frame[..n].to_vec()).collect();
        for _ in 0..rounds {
            let mut f = frame.to_vec();
            for _ in 0..1 + rng.below(4) {
                if f.is_empty() {
                    break;
                }
                let i = rng.below(f.len());
                f[i] = rng.byte();
            }
            if rng.below(4) == 0 {
                let cut = rng.below(f.len() + 1);
                f.truncate(cut);
            }
            out.push(f);
        }
        for _ in 0..rounds {
            let len = rng.below(128);
            out.push(rng.bytes(len));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ethernet_round_trip_and_short_frames() {
        let eth = Ethernet {
            dst: BROADCAST,
            src: [2, 0, 0, 0, 0, 1],
            ethertype: ETHERTYPE_ARP,
        };
        let mut b = Vec::new();
        eth.write(&mut b);
        b.push(0xaa);
        let (got, payload) = Ethernet::parse(&b).unwrap();
        assert_eq!((got, payload), (eth, &[0xaa][..]));
        assert_eq!(
            Ethernet::parse(&b[..13]).unwrap_err().to_string(),
            "Ethernet header truncated: need 14 bytes, got 13"
        );
        assert_eq!(
            Ethernet::parse_typed(&b, ETHERTYPE_IPV6)
                .unwrap_err()
                .to_string(),
            "EtherType is 0x806, expected 0x86dd"
        );
        assert_eq!(format_mac(&[2, 0, 0, 0xab, 0, 1]), "02:00:00:ab:00:01");
    }
}
