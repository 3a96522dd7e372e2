//! Path attributes (RFC 4271 §4.3 and §5): the TLV list of an UPDATE, the
//! flags each known attribute must carry, and the attributes a node
//! speaker and a route reflector deal in, as fields of [`PathAttrs`]:
//! ORIGIN, AS_PATH, NEXT_HOP, MED, LOCAL_PREF, ATOMIC_AGGREGATE,
//! AGGREGATOR, COMMUNITIES (RFC 1997), ORIGINATOR_ID and CLUSTER_LIST
//! (RFC 4456), LARGE_COMMUNITY (RFC 8092), and the multiprotocol ones of
//! RFC 4760, whose values [`super::update`] codes.
//!
//! 4-octet AS (RFC 6793): AS_PATH and AGGREGATOR hold 4-octet numbers
//! when the session negotiated them, else 2-octet ones, in which case
//! larger numbers are sent as [`AS_TRANS`] with the real path in AS4_PATH
//! (and AS4_AGGREGATOR). On decode from such a peer, AS_PATH and
//! AGGREGATOR are rebuilt with what AS4_PATH and AS4_AGGREGATOR carry
//! ([`super::as4`], RFC 6793 §4.2.3); from a 4-octet peer those two are
//! checked and ignored.
//! Confederation segments (RFC 5065) are refused as a malformed AS_PATH:
//! a node speaker is never in a confederation.
//!
//! Attributes are written in ascending type order, as RFC 4271 §5 asks;
//! a value over 255 bytes gets the Extended Length flag.

use std::net::Ipv4Addr;

use super::as4::As4;
use super::bytes::Reader;
use super::notification::update_error;
use super::{Codec, DecodeError, EncodeError, MpReach, MpUnreach, AS_TRANS, UPDATE_ERROR};

const OPTIONAL: u8 = 0x80;
const TRANSITIVE: u8 = 0x40;
const PARTIAL: u8 = 0x20;
const EXTENDED: u8 = 0x10;

const ORIGIN: u8 = 1;
const AS_PATH: u8 = 2;
const NEXT_HOP: u8 = 3;
const MED: u8 = 4;
const LOCAL_PREF: u8 = 5;
const ATOMIC_AGGREGATE: u8 = 6;
const AGGREGATOR: u8 = 7;
const COMMUNITIES: u8 = 8;
const ORIGINATOR_ID: u8 = 9;
const CLUSTER_LIST: u8 = 10;
const MP_REACH: u8 = 14;
const MP_UNREACH: u8 = 15;
const AS4_PATH: u8 = 17;
const AS4_AGGREGATOR: u8 = 18;
const LARGE_COMMUNITY: u8 = 32;

const AS_SET: u8 = 1;
const AS_SEQUENCE: u8 = 2;

/// Where a route came from, as its originator said (RFC 4271 §5.1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Origin {
    Igp,
    Egp,
    Incomplete,
}

/// A piece of AS_PATH: the ASes in order, or a set from aggregation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AsSegment {
    Sequence(Vec<u32>),
    Set(Vec<u32>),
}

/// An attribute this codec does not know. Decoding keeps the optional
/// transitive ones, with the Partial bit already set so they can be
/// passed on as they are (RFC 4271 §5), and drops the others; encoding
/// writes the flags as given (Extended Length is the codec's to set).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RawAttr {
    pub flags: u8,
    pub code: u8,
    pub value: Vec<u8>,
}

/// The attributes of an UPDATE. An absent attribute is None, empty or
/// false; AS_PATH is sent (empty if need be) whenever ORIGIN is. Hashed
/// to group the prefixes that share attributes into one UPDATE.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PathAttrs {
    pub origin: Option<Origin>,
    pub as_path: Vec<AsSegment>,
    pub next_hop: Option<Ipv4Addr>,
    pub med: Option<u32>,
    pub local_pref: Option<u32>,
    pub atomic_aggregate: bool,
    /// The aggregating speaker's AS and BGP identifier.
    pub aggregator: Option<(u32, Ipv4Addr)>,
    pub communities: Vec<u32>,
    /// (global administrator, local data 1, local data 2).
    pub large_communities: Vec<(u32, u32, u32)>,
    pub originator_id: Option<Ipv4Addr>,
    pub cluster_list: Vec<Ipv4Addr>,
    pub mp_reach: Option<MpReach>,
    pub mp_unreach: Option<MpUnreach>,
    /// Unknown attributes, see [`RawAttr`]; decoded in code order.
    pub other: Vec<RawAttr>,
}

/// The attribute type codes an UPDATE carried, for the missing
/// well-known attribute check.
pub(crate) struct Seen([bool; 256]);

impl Seen {
    pub(crate) fn has(&self, code: u8) -> bool {
        self.0[usize::from(code)]
    }
}

/// One attribute as it came: its flags, code, value and the whole of it
/// (header included), which most UPDATE errors send back as data.
struct Tlv<'a> {
    flags: u8,
    code: u8,
    value: &'a [u8],
    whole: &'a [u8],
}

/// The three categories of RFC 4271 §5, as the flags they must carry.
#[derive(Clone, Copy)]
enum Category {
    WellKnown,
    OptionalTransitive,
    OptionalNonTransitive,
}

impl Category {
    fn of(code: u8) -> Option<Category> {
        Some(match code {
            ORIGIN | AS_PATH | NEXT_HOP | LOCAL_PREF | ATOMIC_AGGREGATE => Category::WellKnown,
            AGGREGATOR | COMMUNITIES | AS4_PATH | AS4_AGGREGATOR | LARGE_COMMUNITY => {
                Category::OptionalTransitive
            }
            MED | ORIGINATOR_ID | CLUSTER_LIST | MP_REACH | MP_UNREACH => {
                Category::OptionalNonTransitive
            }
            _ => return None,
        })
    }

    fn flags(self) -> u8 {
        match self {
            Category::WellKnown => TRANSITIVE,
            Category::OptionalTransitive => OPTIONAL | TRANSITIVE,
            Category::OptionalNonTransitive => OPTIONAL,
        }
    }

    /// Optional and Transitive as the category says; Partial only on an
    /// optional transitive attribute.
    fn allows(self, flags: u8) -> bool {
        match self {
            Category::OptionalTransitive => flags & (OPTIONAL | TRANSITIVE) == self.flags(),
            _ => flags & (OPTIONAL | TRANSITIVE | PARTIAL) == self.flags(),
        }
    }
}

pub(crate) fn err(subcode: u8, data: &[u8], reason: impl Into<String>) -> DecodeError {
    DecodeError::new(UPDATE_ERROR, subcode, data.to_vec(), reason)
}

impl Tlv<'_> {
    fn length_error(&self) -> DecodeError {
        err(
            update_error::ATTRIBUTE_LENGTH,
            self.whole,
            format!(
                "attribute {} of {} bytes has the wrong length",
                self.code,
                self.value.len()
            ),
        )
    }

    fn fixed<const N: usize>(&self) -> Result<[u8; N], DecodeError> {
        self.value.try_into().map_err(|_| self.length_error())
    }

    /// The value as 4-byte words, for the attributes that are lists.
    fn words(&self) -> Result<Vec<u32>, DecodeError> {
        if !self.value.len().is_multiple_of(4) {
            return Err(self.length_error());
        }
        let mut r = Reader::new(self.value);
        Ok(std::iter::from_fn(|| r.u32()).collect())
    }
}

/// Reads one attribute's header and value.
fn next_tlv<'a>(r: &mut Reader<'a>) -> Result<Tlv<'a>, DecodeError> {
    let start = r.rest();
    let (Some(flags), Some(code)) = (r.u8(), r.u8()) else {
        return Err(err(
            update_error::MALFORMED_ATTRIBUTE_LIST,
            &[],
            "attribute header cut short",
        ));
    };
    let len = if flags & EXTENDED != 0 {
        r.u16().map(usize::from)
    } else {
        r.u8().map(usize::from)
    };
    let Some(len) = len else {
        return Err(err(
            update_error::MALFORMED_ATTRIBUTE_LIST,
            &[],
            "attribute header cut short",
        ));
    };
    let Some(value) = r.take(len) else {
        return Err(err(
            update_error::ATTRIBUTE_LENGTH,
            start,
            format!(
                "attribute {code} of {len} bytes runs past the attributes ({} left)",
                r.len()
            ),
        ));
    };
    let whole = &start[..start.len() - r.len()];
    Ok(Tlv {
        flags,
        code,
        value,
        whole,
    })
}

impl PathAttrs {
    /// The Path Attributes field of an UPDATE, checked per RFC 4271 §6.3
    /// (the missing-attribute check needs the NLRI too, so the caller does
    /// it with the codes returned).
    pub(crate) fn decode(codec: &Codec, buf: &[u8]) -> Result<(PathAttrs, Seen), DecodeError> {
        let mut r = Reader::new(buf);
        let mut seen = Seen([false; 256]);
        let mut attrs = PathAttrs::default();
        let mut as4 = As4::default();
        while !r.is_empty() {
            let t = next_tlv(&mut r)?;
            if std::mem::replace(&mut seen.0[usize::from(t.code)], true) {
                return Err(err(
                    update_error::MALFORMED_ATTRIBUTE_LIST,
                    &[],
                    format!("attribute {} appears twice", t.code),
                ));
            }
            match Category::of(t.code) {
                Some(c) if !c.allows(t.flags) => {
                    return Err(err(
                        update_error::ATTRIBUTE_FLAGS,
                        t.whole,
                        format!("attribute {} has flags {:#04x}", t.code, t.flags),
                    ))
                }
                Some(_) => match t.code {
                    AS4_PATH => {
                        let p = decode_as_path(t.value, 4).map_err(|e| {
                            err(update_error::OPTIONAL_ATTRIBUTE, t.whole, e.reason)
                        })?;
                        as4.path = Some(p);
                    }
                    AS4_AGGREGATOR => as4.aggregator = Some(decode_aggregator(&t, 4)?),
                    _ => attrs.decode_known(codec, &t)?,
                },
                None => attrs.decode_unknown(&t)?,
            }
        }
        if !codec.four_octet_as {
            as4.merge_into(&mut attrs);
        }
        // In the order encoding writes them, whatever order they came in.
        attrs.other.sort_by_key(|a| a.code);
        Ok((attrs, seen))
    }

    fn decode_known(&mut self, codec: &Codec, t: &Tlv) -> Result<(), DecodeError> {
        match t.code {
            ORIGIN => self.origin = Some(decode_origin(t)?),
            AS_PATH => self.as_path = decode_as_path(t.value, as_size(codec))?,
            NEXT_HOP => self.next_hop = Some(decode_next_hop(t)?),
            MED => self.med = Some(u32::from_be_bytes(t.fixed()?)),
            LOCAL_PREF => self.local_pref = Some(u32::from_be_bytes(t.fixed()?)),
            ATOMIC_AGGREGATE => {
                t.fixed::<0>()?;
                self.atomic_aggregate = true;
            }
            AGGREGATOR => self.aggregator = Some(decode_aggregator(t, as_size(codec))?),
            COMMUNITIES => self.communities = t.words()?,
            ORIGINATOR_ID => self.originator_id = Some(Ipv4Addr::from(t.fixed::<4>()?)),
            CLUSTER_LIST => {
                self.cluster_list = t.words()?.into_iter().map(Ipv4Addr::from).collect()
            }
            MP_REACH => self.mp_reach = Some(MpReach::decode(t.value, t.whole)?),
            MP_UNREACH => self.mp_unreach = Some(MpUnreach::decode(t.value, t.whole)?),
            LARGE_COMMUNITY => self.large_communities = decode_large(t)?,
            // Category::of names exactly the codes above, and AS4_PATH and
            // AS4_AGGREGATOR, which `decode` takes.
            _ => {}
        }
        Ok(())
    }

    fn decode_unknown(&mut self, t: &Tlv) -> Result<(), DecodeError> {
        if t.flags & OPTIONAL == 0 {
            return Err(err(
                update_error::UNRECOGNIZED_WELL_KNOWN,
                t.whole,
                format!("unrecognized well-known attribute {}", t.code),
            ));
        }
        if t.flags & TRANSITIVE != 0 {
            self.other.push(RawAttr {
                flags: (t.flags & (OPTIONAL | TRANSITIVE)) | PARTIAL,
                code: t.code,
                value: t.value.to_vec(),
            });
        }
        Ok(())
    }
}

fn as_size(codec: &Codec) -> usize {
    if codec.four_octet_as {
        4
    } else {
        2
    }
}

fn decode_origin(t: &Tlv) -> Result<Origin, DecodeError> {
    match t.fixed::<1>()? {
        [0] => Ok(Origin::Igp),
        [1] => Ok(Origin::Egp),
        [2] => Ok(Origin::Incomplete),
        [v] => Err(err(
            update_error::INVALID_ORIGIN,
            t.whole,
            format!("ORIGIN {v} is undefined"),
        )),
    }
}

/// Syntax only (RFC 4271 §6.3): an address no router can have, 0.0.0.0 or
/// anything from 224.0.0.0 on (multicast, reserved, broadcast), as FRR
/// and BIRD judge it. Whether it is this node's own address is the
/// caller's to check (a semantic error, which RFC 4271 says to log only).
fn decode_next_hop(t: &Tlv) -> Result<Ipv4Addr, DecodeError> {
    let nh = Ipv4Addr::from(t.fixed::<4>()?);
    if nh.is_unspecified() || nh.octets()[0] >= 224 {
        return Err(err(
            update_error::INVALID_NEXT_HOP,
            t.whole,
            format!("NEXT_HOP {nh} is not a unicast address"),
        ));
    }
    Ok(nh)
}

fn decode_aggregator(t: &Tlv, as_size: usize) -> Result<(u32, Ipv4Addr), DecodeError> {
    if t.value.len() != as_size + 4 {
        return Err(t.length_error());
    }
    let mut r = Reader::new(t.value);
    let asn = if as_size == 4 {
        r.u32()
    } else {
        r.u16().map(u32::from)
    };
    match (asn, r.ipv4()) {
        (Some(asn), Some(id)) => Ok((asn, id)),
        _ => Err(t.length_error()),
    }
}

fn decode_large(t: &Tlv) -> Result<Vec<(u32, u32, u32)>, DecodeError> {
    if !t.value.len().is_multiple_of(12) {
        return Err(t.length_error());
    }
    let mut r = Reader::new(t.value);
    Ok(std::iter::from_fn(|| Some((r.u32()?, r.u32()?, r.u32()?))).collect())
}

/// Segments of `as_size`-byte AS numbers; a segment of an unknown (or
/// confederation) type, an empty one, or one cut short is malformed.
fn decode_as_path(buf: &[u8], as_size: usize) -> Result<Vec<AsSegment>, DecodeError> {
    let malformed = |reason: String| err(update_error::MALFORMED_AS_PATH, &[], reason);
    let mut r = Reader::new(buf);
    let mut path = Vec::new();
    while let Some(kind) = r.u8() {
        let count = usize::from(r.u8().unwrap_or_default());
        if count == 0 {
            return Err(malformed("empty or cut short AS_PATH segment".into()));
        }
        let Some(body) = r.take(count * as_size) else {
            return Err(malformed(format!(
                "AS_PATH segment of {count} ASes runs past the attribute"
            )));
        };
        let asns = body
            .chunks_exact(as_size)
            .map(|c| c.iter().fold(0u32, |a, b| (a << 8) | u32::from(*b)))
            .collect();
        path.push(match kind {
            AS_SET => AsSegment::Set(asns),
            AS_SEQUENCE => AsSegment::Sequence(asns),
            _ => return Err(malformed(format!("AS_PATH segment type {kind}"))),
        });
    }
    Ok(path)
}

/// A value over 255 bytes flags itself as extended; one over 65535 cannot
/// be sent at all.
fn put_tlv(out: &mut Vec<u8>, flags: u8, code: u8, value: &[u8]) -> Result<(), EncodeError> {
    let flags = flags & (OPTIONAL | TRANSITIVE | PARTIAL);
    match u8::try_from(value.len()) {
        Ok(len) => out.extend_from_slice(&[flags, code, len]),
        Err(_) => {
            let len = u16::try_from(value.len()).map_err(|_| EncodeError::TooLong)?;
            out.extend_from_slice(&[flags | EXTENDED, code]);
            out.extend_from_slice(&len.to_be_bytes());
        }
    }
    out.extend_from_slice(value);
    Ok(())
}

fn encode_as_path(path: &[AsSegment], four: bool) -> Result<Vec<u8>, EncodeError> {
    let mut v = Vec::new();
    for seg in path {
        let (kind, asns) = match seg {
            AsSegment::Sequence(a) => (AS_SEQUENCE, a),
            AsSegment::Set(a) => (AS_SET, a),
        };
        if asns.is_empty() || (kind == AS_SET && asns.len() > 255) {
            return Err(EncodeError::Invalid(format!(
                "AS_PATH segment of {} ASes",
                asns.len()
            )));
        }
        // A long sequence becomes consecutive sequences, which mean the same.
        for chunk in asns.chunks(255) {
            v.extend_from_slice(&[kind, chunk.len() as u8]);
            for asn in chunk {
                put_asn(&mut v, *asn, four);
            }
        }
    }
    Ok(v)
}

fn put_asn(v: &mut Vec<u8>, asn: u32, four: bool) {
    if four {
        v.extend_from_slice(&asn.to_be_bytes());
    } else {
        v.extend_from_slice(&u16::try_from(asn).unwrap_or(AS_TRANS).to_be_bytes());
    }
}

fn has_wide_asn(path: &[AsSegment]) -> bool {
    path.iter().any(|s| match s {
        AsSegment::Sequence(a) | AsSegment::Set(a) => a.iter().any(|n| *n > 0xffff),
    })
}

fn words(w: impl IntoIterator<Item = u32>) -> Vec<u8> {
    w.into_iter().flat_map(u32::to_be_bytes).collect()
}

impl PathAttrs {
    /// Appends the Path Attributes field (without its length).
    pub(crate) fn encode(&self, codec: &Codec, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let mut list = self.known_values(codec.four_octet_as)?;
        for o in &self.other {
            if Category::of(o.code).is_some() {
                return Err(EncodeError::Invalid(format!(
                    "attribute {} is known and has its own field",
                    o.code
                )));
            }
            list.push((o.flags, o.code, o.value.clone()));
        }
        list.sort_by_key(|a| a.1);
        if let Some(w) = list.windows(2).find(|w| w[0].1 == w[1].1) {
            return Err(EncodeError::Invalid(format!(
                "attribute {} given twice",
                w[0].1
            )));
        }
        for (flags, code, value) in &list {
            put_tlv(out, *flags, *code, value)?;
        }
        Ok(())
    }

    /// The known attributes present, as (flags, code, value).
    fn known_values(&self, four: bool) -> Result<Vec<(u8, u8, Vec<u8>)>, EncodeError> {
        let mut list = Vec::new();
        let mut add = |code: u8, value: Vec<u8>| {
            let flags = Category::of(code).map_or(0, Category::flags);
            list.push((flags, code, value));
        };
        if let Some(o) = self.origin {
            add(ORIGIN, vec![o as u8]);
        }
        if self.origin.is_some() || !self.as_path.is_empty() {
            add(AS_PATH, encode_as_path(&self.as_path, four)?);
        }
        if !four && has_wide_asn(&self.as_path) {
            add(AS4_PATH, encode_as_path(&self.as_path, true)?);
        }
        if let Some(nh) = self.next_hop {
            add(NEXT_HOP, nh.octets().to_vec());
        }
        if let Some(med) = self.med {
            add(MED, med.to_be_bytes().to_vec());
        }
        if let Some(lp) = self.local_pref {
            add(LOCAL_PREF, lp.to_be_bytes().to_vec());
        }
        if self.atomic_aggregate {
            add(ATOMIC_AGGREGATE, Vec::new());
        }
        if let Some((asn, id)) = self.aggregator {
            let mut v = Vec::new();
            put_asn(&mut v, asn, four);
            v.extend_from_slice(&id.octets());
            add(AGGREGATOR, v);
            if !four && asn > 0xffff {
                add(AS4_AGGREGATOR, words([asn, u32::from(id)]));
            }
        }
        if !self.communities.is_empty() {
            add(COMMUNITIES, words(self.communities.iter().copied()));
        }
        if let Some(id) = self.originator_id {
            add(ORIGINATOR_ID, id.octets().to_vec());
        }
        if !self.cluster_list.is_empty() {
            add(
                CLUSTER_LIST,
                words(self.cluster_list.iter().map(|a| u32::from(*a))),
            );
        }
        if let Some(m) = &self.mp_reach {
            add(MP_REACH, m.encode_value()?);
        }
        if let Some(m) = &self.mp_unreach {
            add(MP_UNREACH, m.encode_value()?);
        }
        if !self.large_communities.is_empty() {
            let flat = self.large_communities.iter().flat_map(|c| [c.0, c.1, c.2]);
            add(LARGE_COMMUNITY, words(flat));
        }
        Ok(list)
    }
}
