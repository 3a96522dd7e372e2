//! What a responder says to one received frame, given the addresses it
//! owns and its link-layer address. Pure, so every case is a unit test;
//! the responder only moves bytes between this and its sockets.
//!
//! - An ARP request or a Neighbor Solicitation for an owned address gets
//!   a reply from our MAC, including RFC 5227 probes and duplicate address
//!   detection (which learn that the address is taken).
//! - Another host claiming an owned address (a gratuitous ARP, an ARP
//!   reply or a Neighbor Advertisement for it from another MAC) is a
//!   conflict: two nodes announcing one IP, or a host misconfigured with
//!   it. It is reported, not fought: the election decides, not a race.
//! - Everything else, including frames from our own MAC, is ignored.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::packet::arp::{self, OP_REQUEST};
use super::packet::ndp::{self, Message};
use super::packet::{Mac, PacketError};

/// The outcome for one frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Send `frame` back on the interface: the answer for owned `ip`.
    Reply {
        ip: IpAddr,
        frame: Vec<u8>,
    },
    /// Host `mac` claims owned `ip`.
    Conflict {
        ip: IpAddr,
        mac: Mac,
    },
    Ignore,
}

/// The verdict on an ARP frame.
pub fn arp(frame: &[u8], mac: Mac, owned: &BTreeSet<IpAddr>) -> Result<Verdict, PacketError> {
    let (_, a) = arp::parse_frame(frame)?;
    if a.sha == mac {
        return Ok(Verdict::Ignore);
    }
    let (spa, tpa) = (IpAddr::V4(a.spa), IpAddr::V4(a.tpa));
    if owned.contains(&spa) {
        return Ok(Verdict::Conflict {
            ip: spa,
            mac: a.sha,
        });
    }
    if a.op == OP_REQUEST && owned.contains(&tpa) {
        return Ok(Verdict::Reply {
            ip: tpa,
            frame: a.reply(mac),
        });
    }
    Ok(Verdict::Ignore)
}

/// The verdict on a Neighbor Discovery frame.
pub fn ndp(frame: &[u8], mac: Mac, owned: &BTreeSet<IpAddr>) -> Result<Verdict, PacketError> {
    match ndp::parse_frame(frame)? {
        Message::Solicitation(ns) => {
            let ip = IpAddr::V6(ns.target);
            if ns.eth_src == mac || !owned.contains(&ip) {
                return Ok(Verdict::Ignore);
            }
            Ok(Verdict::Reply {
                ip,
                frame: ns.reply(mac).frame(),
            })
        }
        Message::Advertisement(na) => {
            let ip = IpAddr::V6(na.target);
            let theirs = na.target_lladdr.unwrap_or(na.eth_src);
            if na.eth_src == mac || theirs == mac || !owned.contains(&ip) {
                return Ok(Verdict::Ignore);
            }
            Ok(Verdict::Conflict { ip, mac: theirs })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::l2::packet::arp::{Arp, OP_REPLY};
    use crate::l2::packet::ndp::{Advertisement, Solicitation};
    use crate::l2::packet::BROADCAST;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const ME: Mac = [2, 0, 0, 0, 0, 0x0a];
    const CLIENT: Mac = [2, 0, 0, 0, 0, 1];
    const RIVAL: Mac = [2, 0, 0, 0, 0, 0x0b];
    const LB4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 200);
    const LB6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x200);
    const CLIENT4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
    const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1);

    fn owned() -> BTreeSet<IpAddr> {
        BTreeSet::from([IpAddr::V4(LB4), IpAddr::V6(LB6)])
    }

    fn request(sha: Mac, spa: Ipv4Addr, tpa: Ipv4Addr) -> Vec<u8> {
        let a = Arp {
            op: OP_REQUEST,
            sha,
            spa,
            tha: [0; 6],
            tpa,
        };
        arp::frame(BROADCAST, sha, &a)
    }

    fn solicitation(from: Mac, src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
        let group = ndp::solicited_node(target);
        let ns = Solicitation {
            eth_src: from,
            src,
            dst: group,
            target,
            source_lladdr: Some(from),
        };
        ns.frame(ndp::multicast_mac(group))
    }

    #[test]
    fn answers_arp_requests_for_owned_addresses_only() {
        let v = arp(&request(CLIENT, CLIENT4, LB4), ME, &owned()).unwrap();
        let Verdict::Reply { ip, frame } = v else {
            panic!("{v:?}")
        };
        assert_eq!(ip, IpAddr::V4(LB4));
        let (eth, reply) = arp::parse_frame(&frame).unwrap();
        assert_eq!(
            (eth.dst, reply.op, reply.sha, reply.spa),
            (CLIENT, OP_REPLY, ME, LB4)
        );

        let other = Ipv4Addr::new(198, 51, 100, 201);
        assert_eq!(
            arp(&request(CLIENT, CLIENT4, other), ME, &owned()),
            Ok(Verdict::Ignore)
        );
        assert_eq!(
            arp(&request(CLIENT, CLIENT4, LB4), ME, &BTreeSet::new()),
            Ok(Verdict::Ignore)
        );
        // Our own gratuitous ARP, seen again (a hairpin): not a conflict.
        assert_eq!(
            arp(&arp::gratuitous(ME, LB4), ME, &owned()),
            Ok(Verdict::Ignore)
        );
        // An RFC 5227 probe (sender 0.0.0.0) is answered.
        let probe = request(CLIENT, Ipv4Addr::UNSPECIFIED, LB4);
        assert!(matches!(
            arp(&probe, ME, &owned()),
            Ok(Verdict::Reply { .. })
        ));
    }

    #[test]
    fn another_host_claiming_an_owned_address_is_a_conflict() {
        assert_eq!(
            arp(&arp::gratuitous(RIVAL, LB4), ME, &owned()),
            Ok(Verdict::Conflict {
                ip: IpAddr::V4(LB4),
                mac: RIVAL
            })
        );
        let rival_na = Advertisement::unsolicited(RIVAL, LB6).frame();
        assert_eq!(
            ndp(&rival_na, ME, &owned()),
            Ok(Verdict::Conflict {
                ip: IpAddr::V6(LB6),
                mac: RIVAL
            })
        );
        assert_eq!(
            ndp(&Advertisement::unsolicited(ME, LB6).frame(), ME, &owned()),
            Ok(Verdict::Ignore)
        );
        assert_eq!(ndp(&rival_na, ME, &BTreeSet::new()), Ok(Verdict::Ignore));
    }

    #[test]
    fn answers_solicitations_for_owned_addresses_only() {
        let v = ndp(&solicitation(CLIENT, CLIENT6, LB6), ME, &owned()).unwrap();
        let Verdict::Reply { ip, frame } = v else {
            panic!("{v:?}")
        };
        assert_eq!(ip, IpAddr::V6(LB6));
        let Message::Advertisement(na) = ndp::parse_frame(&frame).unwrap() else {
            panic!("not an advertisement")
        };
        assert_eq!((na.eth_dst, na.dst, na.target), (CLIENT, CLIENT6, LB6));
        assert_eq!(na.target_lladdr, Some(ME));
        assert!(na.solicited && na.override_);

        let other = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x201);
        assert_eq!(
            ndp(&solicitation(CLIENT, CLIENT6, other), ME, &owned()),
            Ok(Verdict::Ignore)
        );
        assert_eq!(
            ndp(&solicitation(ME, CLIENT6, LB6), ME, &owned()),
            Ok(Verdict::Ignore)
        );
    }

    #[test]
    fn malformed_frames_are_errors_not_answers() {
        let mut f = solicitation(CLIENT, CLIENT6, LB6);
        f[21] = 1; // hop limit 1
        assert_eq!(ndp(&f, ME, &owned()), Err(PacketError::HopLimit(1)));
        assert!(arp(&[0u8; 20], ME, &owned()).is_err());
    }
}
