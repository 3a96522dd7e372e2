//! Neighbour (ARP/NDP) and bridge FDB entries, the other two kinds of kernel
//! state a VXLAN overlay needs besides routes: "this overlay address has
//! this MAC" and "this MAC lives behind this remote VTEP".

use std::net::IpAddr;

use crate::nl::{self, Attrs, Msg};
use crate::rtnl::{format_mac, Handle};
use crate::KernelError;

const RTM_NEWNEIGH: u16 = 28;
const RTM_DELNEIGH: u16 = 29;
const RTM_GETNEIGH: u16 = 30;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
pub const NUD_PERMANENT: u16 = 0x80;
pub const NUD_NOARP: u16 = 0x40;
const NTF_SELF: u8 = 0x02;
const AF_BRIDGE: u8 = 7;

/// A neighbour entry (family inet/inet6) or an FDB entry (`fdb == true`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Neigh {
    pub ifindex: u32,
    /// Neighbour: the L3 address. FDB: the remote VTEP address.
    pub dst: Option<IpAddr>,
    pub mac: [u8; 6],
    pub state: u16,
    pub fdb: bool,
}

impl Neigh {
    pub fn describe(&self) -> String {
        let dst = self.dst.map(|d| d.to_string()).unwrap_or_default();
        if self.fdb {
            format!(
                "fdb {} dst {dst} dev #{}",
                format_mac(&self.mac),
                self.ifindex
            )
        } else {
            format!(
                "neigh {dst} lladdr {} dev #{}",
                format_mac(&self.mac),
                self.ifindex
            )
        }
    }
}

fn ndmsg(family: u8, ifindex: u32, state: u16, flags: u8) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[0] = family;
    b[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
    b[8..10].copy_from_slice(&state.to_ne_bytes());
    b[10] = flags;
    b
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn parse(body: &[u8], fdb: bool) -> Option<Neigh> {
    if body.len() < 12 {
        return None;
    }
    let ifindex = i32::from_ne_bytes(body[4..8].try_into().ok()?) as u32;
    let state = u16::from_ne_bytes([body[8], body[9]]);
    let mut n = Neigh {
        ifindex,
        dst: None,
        mac: [0; 6],
        state,
        fdb,
    };
    let mut has_mac = false;
    for (t, v) in Attrs::new(&body[12..]) {
        match t {
            NDA_DST => {
                n.dst = match v.len() {
                    4 => Some(IpAddr::from(<[u8; 4]>::try_from(v).ok()?)),
                    16 => Some(IpAddr::from(<[u8; 16]>::try_from(v).ok()?)),
                    _ => None,
                }
            }
            NDA_LLADDR if v.len() == 6 => {
                n.mac = v.try_into().ok()?;
                has_mac = true;
            }
            _ => {}
        }
    }
    has_mac.then_some(n)
}

impl Handle {
    /// Neighbour entries (or, with `fdb`, FDB entries) on one link.
    pub fn neighbours(&mut self, ifindex: u32, fdb: bool) -> Result<Vec<Neigh>, KernelError> {
        let mut out = Vec::new();
        let fams: &[u8] = if fdb {
            &[AF_BRIDGE]
        } else {
            &[libc::AF_INET as u8, libc::AF_INET6 as u8]
        };
        for fam in fams {
            let mut m = Msg::new(RTM_GETNEIGH, nl::NLM_F_DUMP);
            m.raw(&ndmsg(*fam, 0, 0, 0));
            let replies = self.request(m, &|| "listing neighbours".into())?;
            out.extend(
                replies
                    .iter()
                    .filter(|r| r.msg_type == RTM_NEWNEIGH)
                    .filter_map(|r| parse(&r.body, fdb))
                    .filter(|n| n.ifindex == ifindex),
            );
        }
        Ok(out)
    }

    /// Adds or replaces a permanent entry.
    pub fn set_neighbour(&mut self, n: &Neigh) -> Result<(), KernelError> {
        let (fam, flags) = family_and_flags(n);
        let mut m = Msg::new(
            RTM_NEWNEIGH,
            nl::NLM_F_CREATE | nl::NLM_F_REPLACE | nl::NLM_F_ACK,
        );
        m.raw(&ndmsg(fam, n.ifindex, n.state, flags));
        m.attr(NDA_LLADDR, &n.mac);
        if let Some(d) = &n.dst {
            m.attr(NDA_DST, &ip_bytes(d));
        }
        let d = n.describe();
        self.request(m, &|| format!("adding {d}"))?;
        Ok(())
    }

    pub fn del_neighbour(&mut self, n: &Neigh) -> Result<(), KernelError> {
        let (fam, flags) = family_and_flags(n);
        let mut m = Msg::new(RTM_DELNEIGH, nl::NLM_F_ACK);
        m.raw(&ndmsg(fam, n.ifindex, 0, flags));
        m.attr(NDA_LLADDR, &n.mac);
        if let Some(d) = &n.dst {
            m.attr(NDA_DST, &ip_bytes(d));
        }
        let d = n.describe();
        self.request(m, &|| format!("deleting {d}"))?;
        Ok(())
    }
}

/// An entry's `ndmsg` family and flags: an FDB entry is the bridge's own
/// (`NTF_SELF`), a neighbour is its address's family.
fn family_and_flags(n: &Neigh) -> (u8, u8) {
    match (n.fdb, n.dst) {
        (true, _) => (AF_BRIDGE, NTF_SELF),
        (false, Some(d)) if d.is_ipv6() => (libc::AF_INET6 as u8, 0),
        (false, _) => (libc::AF_INET as u8, 0),
    }
}
