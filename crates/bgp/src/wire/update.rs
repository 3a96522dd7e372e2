//! UPDATE (RFC 4271 §4.3): routes withdrawn and announced. IPv4 unicast
//! travels in the message's own fields, IPv6 in the MP_REACH_NLRI and
//! MP_UNREACH_NLRI attributes of RFC 4760, whose values are coded here
//! along with the prefix encoding both share; and the End-of-RIB marker
//! of RFC 4724 that closes a family's initial table.
//!
//! A prefix is its length in bits and as many bytes as that needs; bits
//! past the length are cleared on the way in and out, so a route is
//! always its network.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::attrs::{err, PathAttrs};
use super::bytes::{patch_u16, reserve_u16, Reader};
use super::notification::update_error;
use super::{Afi, Codec, DecodeError, EncodeError, Safi};

/// Routes a peer gives up and routes it offers, the latter with the
/// attributes they share.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Update {
    pub withdrawn: Vec<Ipv4Net>,
    pub attrs: PathAttrs,
    /// IPv4 unicast routes, reached through `attrs.next_hop`.
    pub nlri: Vec<Ipv4Net>,
}

/// Routes of a family announced through MP_REACH_NLRI (RFC 4760 §3).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MpReach {
    pub afi: Afi,
    pub safi: Safi,
    /// One address of the family; for IPv6 a global address and, when
    /// the peer shares the link, its link-local one second (RFC 2545 §3).
    pub next_hops: Vec<IpAddr>,
    pub nlri: Vec<IpNet>,
}

/// Routes of a family withdrawn through MP_UNREACH_NLRI (RFC 4760 §4).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MpUnreach {
    pub afi: Afi,
    pub safi: Safi,
    pub withdrawn: Vec<IpNet>,
}

impl Update {
    /// The marker that says the family's initial routes are all sent
    /// (RFC 4724 §2): for IPv4 unicast an UPDATE with nothing in it, for
    /// IPv6 one whose only attribute is an empty MP_UNREACH_NLRI.
    pub fn end_of_rib(afi: Afi) -> Update {
        let mut u = Update::default();
        if afi != Afi::Ipv4 {
            u.attrs.mp_unreach = Some(MpUnreach {
                afi,
                safi: Safi::Unicast,
                withdrawn: Vec::new(),
            });
        }
        u
    }

    /// The family whose End-of-RIB this is, if it is one.
    pub fn is_end_of_rib(&self) -> Option<Afi> {
        if !self.withdrawn.is_empty() || !self.nlri.is_empty() {
            return None;
        }
        let mut rest = self.attrs.clone();
        match rest.mp_unreach.take() {
            None if rest == PathAttrs::default() => Some(Afi::Ipv4),
            Some(m) if m.withdrawn.is_empty() && rest == PathAttrs::default() => Some(m.afi),
            _ => None,
        }
    }

    /// Refuses an UPDATE a peer would refuse for missing attributes:
    /// routes need ORIGIN (and with it AS_PATH), IPv4 ones NEXT_HOP.
    pub(crate) fn encode_body(&self, codec: &Codec, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let announces = !self.nlri.is_empty() || self.attrs.mp_reach.is_some();
        if announces && self.attrs.origin.is_none() {
            return Err(EncodeError::Invalid("routes without ORIGIN".into()));
        }
        if !self.nlri.is_empty() && self.attrs.next_hop.is_none() {
            return Err(EncodeError::Invalid("IPv4 routes without NEXT_HOP".into()));
        }
        let at = reserve_u16(out);
        for p in &self.withdrawn {
            put_net(out, &IpNet::V4(*p));
        }
        patch_u16(out, at)?;
        let at = reserve_u16(out);
        self.attrs.encode(codec, out)?;
        patch_u16(out, at)?;
        for p in &self.nlri {
            put_net(out, &IpNet::V4(*p));
        }
        Ok(())
    }

    /// RFC 4271 §6.3: the field lengths, then the attributes, then the
    /// prefixes, then whether the well-known attributes routes need are
    /// there (RFC 4760 §3 for MP_REACH_NLRI: ORIGIN and AS_PATH).
    /// LOCAL_PREF, mandatory on IBGP only, is the session's to check.
    pub(crate) fn decode_body(codec: &Codec, body: &[u8]) -> Result<Update, DecodeError> {
        let mut r = Reader::new(body);
        let withdrawn = r.u16().and_then(|n| r.take(usize::from(n)));
        let attrs = r.u16().and_then(|n| r.take(usize::from(n)));
        let (Some(withdrawn), Some(attrs)) = (withdrawn, attrs) else {
            return Err(err(
                update_error::MALFORMED_ATTRIBUTE_LIST,
                &[],
                "withdrawn routes or attributes length runs past the UPDATE",
            ));
        };
        let (attrs, seen) = PathAttrs::decode(codec, attrs)?;
        let u = Update {
            withdrawn: v4_prefixes(withdrawn)?,
            attrs,
            nlri: v4_prefixes(r.rest())?,
        };
        let mut needed = Vec::new();
        if !u.nlri.is_empty() || u.attrs.mp_reach.is_some() {
            needed.extend([1, 2]);
        }
        if !u.nlri.is_empty() {
            needed.push(3);
        }
        if let Some(code) = needed.into_iter().find(|c| !seen.has(*c)) {
            return Err(err(
                update_error::MISSING_WELL_KNOWN,
                &[code],
                format!("routes without well-known attribute {code}"),
            ));
        }
        Ok(u)
    }
}

/// Appends a prefix: its length, then the bytes that length covers.
fn put_net(out: &mut Vec<u8>, p: &IpNet) {
    let (addr, len) = match p.trunc() {
        IpNet::V4(n) => (n.addr().octets().to_vec(), n.prefix_len()),
        IpNet::V6(n) => (n.addr().octets().to_vec(), n.prefix_len()),
    };
    out.push(len);
    out.extend_from_slice(&addr[..usize::from(len).div_ceil(8)]);
}

/// The encoded size of a prefix, for packing.
pub(crate) fn prefix_size(p: &IpNet) -> usize {
    1 + usize::from(p.prefix_len()).div_ceil(8)
}

/// Prefixes of `N`-byte addresses filling `buf`; a length over `N * 8`
/// bits or bytes past the field are an invalid network field.
fn prefixes<const N: usize>(buf: &[u8]) -> Result<Vec<([u8; N], u8)>, DecodeError> {
    let mut r = Reader::new(buf);
    let mut out = Vec::new();
    while let Some(len) = r.u8() {
        if usize::from(len) > N * 8 {
            return Err(bad_network(format!("prefix length {len} over {}", N * 8)));
        }
        let n = usize::from(len).div_ceil(8);
        let Some(bytes) = r.take(n) else {
            return Err(bad_network(format!("/{len} prefix cut short")));
        };
        let mut addr = [0; N];
        addr[..n].copy_from_slice(bytes);
        out.push((addr, len));
    }
    Ok(out)
}

fn bad_network(reason: String) -> DecodeError {
    err(update_error::INVALID_NETWORK_FIELD, &[], reason)
}

fn v4_prefixes(buf: &[u8]) -> Result<Vec<Ipv4Net>, DecodeError> {
    prefixes::<4>(buf)?
        .into_iter()
        .map(|(a, len)| {
            Ipv4Net::new(Ipv4Addr::from(a), len)
                .map(|n| n.trunc())
                .map_err(|e| bad_network(e.to_string()))
        })
        .collect()
}

fn v6_prefixes(buf: &[u8]) -> Result<Vec<Ipv6Net>, DecodeError> {
    prefixes::<16>(buf)?
        .into_iter()
        .map(|(a, len)| {
            Ipv6Net::new(Ipv6Addr::from(a), len)
                .map(|n| n.trunc())
                .map_err(|e| bad_network(e.to_string()))
        })
        .collect()
}

fn family_prefixes(afi: Afi, buf: &[u8]) -> Result<Vec<IpNet>, DecodeError> {
    Ok(match afi {
        Afi::Ipv4 => v4_prefixes(buf)?.into_iter().map(IpNet::V4).collect(),
        Afi::Ipv6 => v6_prefixes(buf)?.into_iter().map(IpNet::V6).collect(),
    })
}

/// The family a prefix belongs to.
pub(crate) fn afi_of(p: &IpNet) -> Afi {
    Afi::of(p)
}

/// Appends prefixes that must all be of `afi`.
fn put_family(out: &mut Vec<u8>, afi: Afi, nets: &[IpNet]) -> Result<(), EncodeError> {
    for p in nets {
        if afi_of(p) != afi {
            return Err(EncodeError::Invalid(format!("{p} in a {afi:?} attribute")));
        }
        put_net(out, p);
    }
    Ok(())
}

/// AFI and SAFI at the head of both multiprotocol attributes; a family
/// not carried here is an optional attribute error (RFC 4760 §7: the
/// attribute is incorrect for this session).
fn read_family(r: &mut Reader, whole: &[u8]) -> Result<(Afi, Safi), DecodeError> {
    let (afi, safi) = (r.u16(), r.u8());
    let (Some(afi), Some(safi)) = (afi, safi) else {
        return Err(optional_error(whole, "multiprotocol attribute cut short"));
    };
    match (Afi::from_code(afi), Safi::from_code(safi)) {
        (Some(a), Some(s)) => Ok((a, s)),
        _ => Err(optional_error(
            whole,
            &format!("AFI {afi} SAFI {safi} is not carried"),
        )),
    }
}

fn optional_error(whole: &[u8], reason: &str) -> DecodeError {
    err(update_error::OPTIONAL_ATTRIBUTE, whole, reason)
}

impl MpReach {
    pub(crate) fn encode_value(&self) -> Result<Vec<u8>, EncodeError> {
        let mut v = self.afi.code().to_be_bytes().to_vec();
        v.push(self.safi.code());
        match (self.afi, self.next_hops.as_slice()) {
            (Afi::Ipv4, [IpAddr::V4(a)]) => {
                v.push(4);
                v.extend_from_slice(&a.octets());
            }
            (Afi::Ipv6, [IpAddr::V6(a)]) => {
                v.push(16);
                v.extend_from_slice(&a.octets());
            }
            (Afi::Ipv6, [IpAddr::V6(a), IpAddr::V6(b)]) => {
                v.push(32);
                v.extend_from_slice(&a.octets());
                v.extend_from_slice(&b.octets());
            }
            (afi, hops) => {
                return Err(EncodeError::Invalid(format!(
                    "next hops {hops:?} for {afi:?} routes"
                )))
            }
        }
        v.push(0);
        put_family(&mut v, self.afi, &self.nlri)?;
        Ok(v)
    }

    /// `whole` is the attribute with its header, the data of its errors.
    /// The reserved byte after the next hop is ignored (RFC 4760 §3).
    pub(crate) fn decode(value: &[u8], whole: &[u8]) -> Result<MpReach, DecodeError> {
        let mut r = Reader::new(value);
        let (afi, safi) = read_family(&mut r, whole)?;
        let hops = r.u8().and_then(|n| r.take(usize::from(n)));
        let reserved = r.u8();
        let (Some(hops), Some(_)) = (hops, reserved) else {
            return Err(optional_error(whole, "MP_REACH_NLRI cut short"));
        };
        let mut h = Reader::new(hops);
        let next_hops = match (afi, hops.len()) {
            (Afi::Ipv4, 4) => h.ipv4().map(IpAddr::V4).into_iter().collect(),
            (Afi::Ipv6, 16 | 32) => std::iter::from_fn(|| h.ipv6().map(IpAddr::V6)).collect(),
            _ => {
                return Err(optional_error(
                    whole,
                    &format!("{afi:?} next hop of {} bytes", hops.len()),
                ))
            }
        };
        Ok(MpReach {
            afi,
            safi,
            next_hops,
            nlri: family_prefixes(afi, r.rest())?,
        })
    }
}

impl MpUnreach {
    pub(crate) fn encode_value(&self) -> Result<Vec<u8>, EncodeError> {
        let mut v = self.afi.code().to_be_bytes().to_vec();
        v.push(self.safi.code());
        put_family(&mut v, self.afi, &self.withdrawn)?;
        Ok(v)
    }

    pub(crate) fn decode(value: &[u8], whole: &[u8]) -> Result<MpUnreach, DecodeError> {
        let mut r = Reader::new(value);
        let (afi, safi) = read_family(&mut r, whole)?;
        Ok(MpUnreach {
            afi,
            safi,
            withdrawn: family_prefixes(afi, r.rest())?,
        })
    }
}
