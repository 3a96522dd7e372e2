//! The DNS wire format (RFC 1035, EDNS0 from RFC 6891), written by hand.
//!
//! This module owns every byte that crosses the network: parsing a query
//! into a stack-allocated [`Query`] (the hot path allocates nothing),
//! parsing whole messages (upstream answers, test clients) into [`Message`],
//! and encoding records with name compression ([`Writer`]).
//!
//! Input comes from anyone on the network, so nothing here may panic:
//! every read is bounds-checked, compression pointers may only point
//! backwards (so they cannot loop), and names are capped at 255 bytes.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};

pub const TYPE_A: u16 = 1;
pub const TYPE_NS: u16 = 2;
pub const TYPE_CNAME: u16 = 5;
pub const TYPE_SOA: u16 = 6;
pub const TYPE_PTR: u16 = 12;
pub const TYPE_MX: u16 = 15;
pub const TYPE_TXT: u16 = 16;
pub const TYPE_AAAA: u16 = 28;
pub const TYPE_SRV: u16 = 33;
pub const TYPE_OPT: u16 = 41;
pub const TYPE_IXFR: u16 = 251;
pub const TYPE_AXFR: u16 = 252;
pub const TYPE_ANY: u16 = 255;

pub const CLASS_IN: u16 = 1;
pub const CLASS_ANY: u16 = 255;

pub const NOERROR: u8 = 0;
pub const FORMERR: u8 = 1;
pub const SERVFAIL: u8 = 2;
pub const NXDOMAIN: u8 = 3;
pub const NOTIMP: u8 = 4;
pub const REFUSED: u8 = 5;
/// Extended rcode (16) for an EDNS version we do not speak.
pub const BADVERS: u16 = 16;

/// Header flag bits.
pub const QR: u16 = 0x8000;
pub const AA: u16 = 0x0400;
pub const TC: u16 = 0x0200;
pub const RD: u16 = 0x0100;
pub const RA: u16 = 0x0080;
pub const AD: u16 = 0x0020;
pub const CD: u16 = 0x0010;

pub const HEADER_LEN: usize = 12;
/// Longest name in wire form, terminating zero included (RFC 1035 2.3.4).
pub const MAX_NAME: usize = 255;
/// Replies to a query without EDNS must fit in this (RFC 1035 4.2.1).
pub const MIN_UDP: usize = 512;
/// The UDP payload size we advertise and the most we send over UDP.
pub const MAX_UDP: usize = 4096;
/// EDNS payload size we advertise in our own OPT records (DNS flag day 2020).
pub const OUR_EDNS_SIZE: u16 = 1232;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("message truncated")]
    Short,
    #[error("bad label")]
    BadLabel,
    #[error("name longer than 255 bytes")]
    NameTooLong,
    #[error("bad compression pointer")]
    BadPointer,
    #[error("invalid name {0:?}")]
    BadText(String),
    #[error("malformed record data")]
    BadRdata,
}

pub type Result<T> = std::result::Result<T, WireError>;

fn u16_at(b: &[u8], i: usize) -> Result<u16> {
    match b.get(i..i + 2) {
        Some(s) => Ok(u16::from_be_bytes([s[0], s[1]])),
        None => Err(WireError::Short),
    }
}

fn u32_at(b: &[u8], i: usize) -> Result<u32> {
    match b.get(i..i + 4) {
        Some(s) => Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]])),
        None => Err(WireError::Short),
    }
}

/// The fixed 12-byte message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    pub id: u16,
    pub flags: u16,
    pub qd: u16,
    pub an: u16,
    pub ns: u16,
    pub ar: u16,
}

impl Header {
    pub fn parse(b: &[u8]) -> Result<Header> {
        Ok(Header {
            id: u16_at(b, 0)?,
            flags: u16_at(b, 2)?,
            qd: u16_at(b, 4)?,
            an: u16_at(b, 6)?,
            ns: u16_at(b, 8)?,
            ar: u16_at(b, 10)?,
        })
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        for v in [self.id, self.flags, self.qd, self.an, self.ns, self.ar] {
            out.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub fn opcode(&self) -> u8 {
        ((self.flags >> 11) & 0xf) as u8
    }

    pub fn rcode(&self) -> u8 {
        (self.flags & 0xf) as u8
    }
}

/// A name in wire form, lowercased, on the stack: the hot path's key.
#[derive(Clone)]
pub struct NameBuf {
    bytes: [u8; MAX_NAME],
    len: usize,
    /// Offset of each label's length byte (at most 127 labels fit in 255).
    starts: [u8; 128],
    labels: usize,
}

impl Default for NameBuf {
    fn default() -> Self {
        NameBuf {
            bytes: [0; MAX_NAME],
            len: 0,
            starts: [0; 128],
            labels: 0,
        }
    }
}

impl std::fmt::Debug for NameBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", name_to_string(self.wire()))
    }
}

impl NameBuf {
    /// The whole name in wire form, terminating zero included.
    pub fn wire(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// Number of labels, the root not counted.
    pub fn label_count(&self) -> usize {
        self.labels
    }

    /// The `i`-th label (0 is the leftmost).
    pub fn label(&self, i: usize) -> &[u8] {
        if i >= self.labels {
            return &[];
        }
        let s = self.starts[i] as usize;
        let l = self.bytes[s] as usize;
        &self.bytes[s + 1..s + 1 + l]
    }

    /// The suffix starting at label `i`, in wire form.
    pub fn suffix(&self, i: usize) -> &[u8] {
        if i >= self.labels {
            return &self.bytes[self.len.saturating_sub(1)..self.len];
        }
        &self.bytes[self.starts[i] as usize..self.len]
    }

    /// Byte offset of label `i` within the name.
    pub fn label_offset(&self, i: usize) -> usize {
        if i >= self.labels {
            return self.len.saturating_sub(1);
        }
        self.starts[i] as usize
    }

    /// If `zone` (wire form, lowercase) is a suffix on a label boundary,
    /// the index of the label where it starts.
    pub fn zone_start(&self, zone: &[u8]) -> Option<usize> {
        if zone.len() > self.len {
            return None;
        }
        let off = self.len - zone.len();
        if &self.bytes[off..self.len] != zone {
            return None;
        }
        if off == 0 {
            return Some(0);
        }
        // The suffix must begin at a label start, not inside a label.
        (0..self.labels).find(|&i| self.starts[i] as usize == off)
    }

    fn push_label(&mut self, label: &[u8], lower: bool) -> Result<()> {
        if label.is_empty() || label.len() > 63 {
            return Err(WireError::BadLabel);
        }
        // Room for the length byte, the label and the final zero.
        if self.len + 1 + label.len() + 1 > MAX_NAME || self.labels >= 127 {
            return Err(WireError::NameTooLong);
        }
        self.starts[self.labels] = self.len as u8;
        self.labels += 1;
        self.bytes[self.len] = label.len() as u8;
        self.len += 1;
        for &c in label {
            self.bytes[self.len] = if lower { c.to_ascii_lowercase() } else { c };
            self.len += 1;
        }
        Ok(())
    }

    fn finish(&mut self) {
        self.bytes[self.len] = 0;
        self.len += 1;
    }

    /// Builds a name from wire form (no pointers), lowercasing it.
    pub fn from_wire_lower(w: &[u8]) -> Result<NameBuf> {
        let mut n = NameBuf::default();
        let mut i = 0;
        loop {
            let l = *w.get(i).ok_or(WireError::Short)? as usize;
            if l == 0 {
                break;
            }
            if l > 63 {
                return Err(WireError::BadLabel);
            }
            let label = w.get(i + 1..i + 1 + l).ok_or(WireError::Short)?;
            n.push_label(label, true)?;
            i += 1 + l;
        }
        n.finish();
        Ok(n)
    }
}

/// Reads a possibly compressed name at `pos`; returns the position after it
/// in the original message. Pointers must point strictly backwards, which
/// bounds the walk.
pub fn read_name(msg: &[u8], pos: usize, out: &mut NameBuf, lower: bool) -> Result<usize> {
    read_name_seeing(msg, pos, out, lower, |_| {})
}

/// [`read_name`], telling `seen` every pointer target it follows.
fn read_name_seeing(
    msg: &[u8],
    pos: usize,
    out: &mut NameBuf,
    lower: bool,
    mut seen: impl FnMut(usize),
) -> Result<usize> {
    *out = NameBuf::default();
    let mut i = pos;
    let mut end = None;
    let mut limit = pos;
    loop {
        let l = *msg.get(i).ok_or(WireError::Short)?;
        match l & 0xc0 {
            0x00 => {
                if l == 0 {
                    out.finish();
                    return Ok(end.unwrap_or(i + 1));
                }
                let label = msg.get(i + 1..i + 1 + l as usize).ok_or(WireError::Short)?;
                out.push_label(label, lower)?;
                i += 1 + l as usize;
            }
            0xc0 => {
                let p = (u16_at(msg, i)? & 0x3fff) as usize;
                if end.is_none() {
                    end = Some(i + 2);
                }
                if p >= limit {
                    return Err(WireError::BadPointer);
                }
                seen(p);
                limit = p;
                i = p;
            }
            _ => return Err(WireError::BadLabel),
        }
    }
}

/// Skips a name (compressed or not) without decoding it.
fn skip_name(msg: &[u8], mut i: usize) -> Result<usize> {
    let mut n = 0;
    loop {
        let l = *msg.get(i).ok_or(WireError::Short)?;
        match l & 0xc0 {
            0x00 if l == 0 => return Ok(i + 1),
            0x00 => {
                i += 1 + l as usize;
                n += 1 + l as usize;
                if n > MAX_NAME {
                    return Err(WireError::NameTooLong);
                }
            }
            0xc0 => {
                if i + 2 > msg.len() {
                    return Err(WireError::Short);
                }
                return Ok(i + 2);
            }
            _ => return Err(WireError::BadLabel),
        }
    }
}

/// The EDNS0 OPT record of a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edns {
    pub udp_size: u16,
    pub version: u8,
    pub dnssec_ok: bool,
}

/// A parsed query: what the server needs to answer it, without allocating.
#[derive(Debug, Clone)]
pub struct Query<'a> {
    pub header: Header,
    /// The question name, lowercased.
    pub qname: NameBuf,
    pub qtype: u16,
    pub qclass: u16,
    /// The raw question (name as the client wrote it, type, class), echoed
    /// back verbatim so the client's letter case survives.
    pub question: &'a [u8],
    pub edns: Option<Edns>,
}

impl Query<'_> {
    /// The largest response the client accepts over UDP.
    pub fn udp_limit(&self) -> usize {
        match self.edns {
            Some(e) => (e.udp_size as usize).clamp(MIN_UDP, MAX_UDP),
            None => MIN_UDP,
        }
    }

    pub fn rd(&self) -> bool {
        self.header.flags & RD != 0
    }
}

/// Why a query could not be parsed, and how to react.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadQuery {
    /// Not even a query header (or a response): drop silently.
    Drop,
    /// Answer with this rcode (FORMERR, NOTIMP, or BADVERS with EDNS).
    Reply { header: Header, rcode: u16 },
}

/// Parses a query. Only standard queries with one question are accepted.
pub fn parse_query(msg: &[u8]) -> std::result::Result<Query<'_>, BadQuery> {
    let header = Header::parse(msg).map_err(|_| BadQuery::Drop)?;
    if header.flags & QR != 0 {
        return Err(BadQuery::Drop);
    }
    let formerr = BadQuery::Reply {
        header,
        rcode: FORMERR as u16,
    };
    if header.opcode() != 0 {
        return Err(BadQuery::Reply {
            header,
            rcode: NOTIMP as u16,
        });
    }
    if header.qd != 1 {
        return Err(formerr);
    }
    // The question: an uncompressed name (nothing to point back at yet).
    let mut qname = NameBuf::default();
    let mut i = HEADER_LEN;
    loop {
        let Some(&l) = msg.get(i) else {
            return Err(formerr);
        };
        if l == 0 {
            qname.finish();
            i += 1;
            break;
        }
        if l > 63 {
            return Err(formerr);
        }
        let Some(label) = msg.get(i + 1..i + 1 + l as usize) else {
            return Err(formerr);
        };
        if qname.push_label(label, true).is_err() {
            return Err(formerr);
        }
        i += 1 + l as usize;
    }
    let (Ok(qtype), Ok(qclass)) = (u16_at(msg, i), u16_at(msg, i + 2)) else {
        return Err(formerr);
    };
    let question = &msg[HEADER_LEN..i + 4];
    i += 4;
    // Skip answer and authority records; find the OPT in additional.
    let mut edns = None;
    let total = header.an as usize + header.ns as usize + header.ar as usize;
    for n in 0..total {
        let Ok(after_name) = skip_name(msg, i) else {
            return Err(formerr);
        };
        let (Ok(t), Ok(class), Ok(ttl), Ok(rdlen)) = (
            u16_at(msg, after_name),
            u16_at(msg, after_name + 2),
            u32_at(msg, after_name + 4),
            u16_at(msg, after_name + 8),
        ) else {
            return Err(formerr);
        };
        let next = after_name + 10 + rdlen as usize;
        if next > msg.len() {
            return Err(formerr);
        }
        if t == TYPE_OPT && n >= header.an as usize + header.ns as usize {
            if edns.is_some() || after_name != i + 1 {
                // Two OPTs, or an OPT not owned by the root.
                return Err(formerr);
            }
            edns = Some(Edns {
                udp_size: class,
                version: (ttl >> 16) as u8,
                dnssec_ok: ttl & 0x8000 != 0,
            });
        }
        i = next;
    }
    let q = Query {
        header,
        qname,
        qtype,
        qclass,
        question,
        edns,
    };
    if let Some(e) = q.edns {
        if e.version != 0 {
            return Err(BadQuery::Reply {
                header,
                rcode: BADVERS,
            });
        }
    }
    Ok(q)
}

/// Appends our OPT record (root owner, our payload size, DO echoed).
pub fn write_opt(out: &mut Vec<u8>, dnssec_ok: bool, ext_rcode: u8) {
    out.push(0);
    out.extend_from_slice(&TYPE_OPT.to_be_bytes());
    out.extend_from_slice(&OUR_EDNS_SIZE.to_be_bytes());
    out.push(ext_rcode);
    out.push(0); // version
    out.extend_from_slice(&(if dnssec_ok { 0x8000u16 } else { 0 }).to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
}

/// Response flags for a query: QR, the client's RD and CD, RA, and `extra`.
pub fn response_flags(query_flags: u16, rcode: u8, extra: u16) -> u16 {
    QR | (query_flags & (RD | CD)) | RA | extra | (rcode as u16 & 0xf)
}

/// Writes an error reply (header + question when known, OPT when asked).
pub fn error_reply(msg: &[u8], bad: &BadQuery, out: &mut Vec<u8>) -> bool {
    let BadQuery::Reply { header, rcode } = bad else {
        return false;
    };
    out.clear();
    // Echo the question only when it parses cleanly.
    let q = parse_question_span(msg);
    let h = Header {
        id: header.id,
        flags: response_flags(header.flags & RD, (*rcode & 0xf) as u8, 0),
        qd: q.is_some() as u16,
        an: 0,
        ns: 0,
        ar: (*rcode > 15) as u16,
    };
    h.write(out);
    if let Some(q) = q {
        out.extend_from_slice(q);
    }
    if *rcode > 15 {
        write_opt(out, false, (*rcode >> 4) as u8);
    }
    true
}

fn parse_question_span(msg: &[u8]) -> Option<&[u8]> {
    let h = Header::parse(msg).ok()?;
    if h.qd != 1 {
        return None;
    }
    let mut i = HEADER_LEN;
    let mut n = 0;
    loop {
        let l = *msg.get(i)? as usize;
        if l == 0 {
            break;
        }
        if l > 63 {
            return None;
        }
        n += l + 1;
        if n > MAX_NAME {
            return None;
        }
        i += 1 + l;
    }
    msg.get(HEADER_LEN..i + 5)
}

/// Record data, with embedded names expanded (wire form, no pointers).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RData {
    A(Ipv4Addr),
    Aaaa(Ipv6Addr),
    /// CNAME, PTR and NS: one name.
    Name(Vec<u8>),
    Srv {
        priority: u16,
        weight: u16,
        port: u16,
        target: Vec<u8>,
    },
    Mx {
        preference: u16,
        exchange: Vec<u8>,
    },
    Txt(Vec<Vec<u8>>),
    Soa {
        mname: Vec<u8>,
        rname: Vec<u8>,
        serial: u32,
        refresh: u32,
        retry: u32,
        expire: u32,
        minimum: u32,
    },
    /// Anything else, copied as is (RFC 3597: no compression inside).
    Raw(Vec<u8>),
}

/// One resource record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Owner name in wire form (case as received).
    pub name: Vec<u8>,
    pub rtype: u16,
    pub class: u16,
    pub ttl: u32,
    pub rdata: RData,
}

/// A whole parsed message.
#[derive(Debug, Clone, Default)]
pub struct Message {
    pub header: Header,
    pub questions: Vec<(Vec<u8>, u16, u16)>,
    pub answers: Vec<Record>,
    pub authority: Vec<Record>,
    pub additional: Vec<Record>,
    /// Where each record's TTL sits in the message (OPT excluded), so a
    /// cached copy can be aged in place.
    pub ttl_offsets: Vec<usize>,
    /// The byte range of the OPT record, if any.
    pub opt_span: Option<(usize, usize)>,
    /// Every offset a compression pointer in a decoded name points at. A
    /// forwarder that edits bytes in place (ID, flags, counts, TTLs) needs
    /// them: a name that points into an edited byte would read differently.
    pub pointer_targets: Vec<usize>,
}

fn name_vec(msg: &[u8], pos: usize, targets: &mut Vec<usize>) -> Result<(Vec<u8>, usize)> {
    let mut n = NameBuf::default();
    let next = read_name_seeing(msg, pos, &mut n, false, |p| targets.push(p))?;
    Ok((n.wire().to_vec(), next))
}

fn parse_rdata(
    msg: &[u8],
    rtype: u16,
    start: usize,
    len: usize,
    targets: &mut Vec<usize>,
) -> Result<RData> {
    let end = start + len;
    let rd = msg.get(start..end).ok_or(WireError::Short)?;
    let mut name_exact = |pos: usize| -> Result<(Vec<u8>, usize)> {
        let (n, next) = name_vec(msg, pos, targets)?;
        if next > end {
            return Err(WireError::BadRdata);
        }
        Ok((n, next))
    };
    Ok(match rtype {
        TYPE_A if len == 4 => RData::A(Ipv4Addr::new(rd[0], rd[1], rd[2], rd[3])),
        TYPE_AAAA if len == 16 => {
            let mut b = [0u8; 16];
            b.copy_from_slice(rd);
            RData::Aaaa(Ipv6Addr::from(b))
        }
        TYPE_A | TYPE_AAAA => return Err(WireError::BadRdata),
        TYPE_CNAME | TYPE_PTR | TYPE_NS => {
            let (n, next) = name_exact(start)?;
            if next != end {
                return Err(WireError::BadRdata);
            }
            RData::Name(n)
        }
        TYPE_SRV => {
            let (target, next) = name_exact(start + 6)?;
            if next != end {
                return Err(WireError::BadRdata);
            }
            RData::Srv {
                priority: u16_at(rd, 0)?,
                weight: u16_at(rd, 2)?,
                port: u16_at(rd, 4)?,
                target,
            }
        }
        TYPE_MX => {
            let (exchange, next) = name_exact(start + 2)?;
            if next != end {
                return Err(WireError::BadRdata);
            }
            RData::Mx {
                preference: u16_at(rd, 0)?,
                exchange,
            }
        }
        TYPE_SOA => {
            let (mname, next) = name_exact(start)?;
            let (rname, next) = name_exact(next)?;
            if next + 20 != end {
                return Err(WireError::BadRdata);
            }
            RData::Soa {
                mname,
                rname,
                serial: u32_at(msg, next)?,
                refresh: u32_at(msg, next + 4)?,
                retry: u32_at(msg, next + 8)?,
                expire: u32_at(msg, next + 12)?,
                minimum: u32_at(msg, next + 16)?,
            }
        }
        TYPE_TXT => {
            let mut v = Vec::new();
            let mut i = 0;
            while i < rd.len() {
                let l = rd[i] as usize;
                v.push(
                    rd.get(i + 1..i + 1 + l)
                        .ok_or(WireError::BadRdata)?
                        .to_vec(),
                );
                i += 1 + l;
            }
            RData::Txt(v)
        }
        _ => RData::Raw(rd.to_vec()),
    })
}

impl Message {
    /// Parses a complete message; fails on any inconsistency.
    pub fn parse(msg: &[u8]) -> Result<Message> {
        let header = Header::parse(msg)?;
        let mut m = Message {
            header,
            ..Default::default()
        };
        let mut i = HEADER_LEN;
        for _ in 0..header.qd {
            let (n, next) = name_vec(msg, i, &mut m.pointer_targets)?;
            m.questions
                .push((n, u16_at(msg, next)?, u16_at(msg, next + 2)?));
            i = next + 4;
        }
        for sec in 0..3 {
            let count = [header.an, header.ns, header.ar][sec];
            for _ in 0..count {
                let start = i;
                let (name, next) = name_vec(msg, i, &mut m.pointer_targets)?;
                let rtype = u16_at(msg, next)?;
                let class = u16_at(msg, next + 2)?;
                let ttl = u32_at(msg, next + 4)?;
                let rdlen = u16_at(msg, next + 8)? as usize;
                let rstart = next + 10;
                if rstart + rdlen > msg.len() {
                    return Err(WireError::Short);
                }
                i = rstart + rdlen;
                if rtype == TYPE_OPT {
                    if sec != 2 || m.opt_span.is_some() {
                        return Err(WireError::BadRdata);
                    }
                    m.opt_span = Some((start, i));
                    continue;
                }
                let rdata = parse_rdata(msg, rtype, rstart, rdlen, &mut m.pointer_targets)?;
                m.ttl_offsets.push(next + 4);
                let r = Record {
                    name,
                    rtype,
                    class,
                    ttl,
                    rdata,
                };
                match sec {
                    0 => m.answers.push(r),
                    1 => m.authority.push(r),
                    _ => m.additional.push(r),
                }
            }
        }
        Ok(m)
    }

    pub fn rcode(&self) -> u8 {
        self.header.rcode()
    }
}

/// Wire form of a dotted name ("web.default.svc.cluster.local", trailing
/// dot optional), lowercased.
pub fn name_from_str(s: &str) -> Result<Vec<u8>> {
    let s = s.strip_suffix('.').unwrap_or(s);
    let mut out = Vec::with_capacity(s.len() + 2);
    if !s.is_empty() {
        for l in s.split('.') {
            if l.is_empty() || l.len() > 63 {
                return Err(WireError::BadText(s.to_string()));
            }
            out.push(l.len() as u8);
            out.extend(l.bytes().map(|c| c.to_ascii_lowercase()));
        }
    }
    out.push(0);
    if out.len() > MAX_NAME {
        return Err(WireError::BadText(s.to_string()));
    }
    Ok(out)
}

/// Dotted text of a wire-form name, with a trailing dot ("." for the root).
pub fn name_to_string(w: &[u8]) -> String {
    let mut s = String::new();
    let mut i = 0;
    while let Some(&l) = w.get(i) {
        if l == 0 || l > 63 {
            break;
        }
        let label = w.get(i + 1..i + 1 + l as usize).unwrap_or_default();
        for &c in label {
            if c.is_ascii_graphic() && c != b'.' && c != b'\\' {
                s.push(c as char);
            } else {
                s.push_str(&format!("\\{c:03}"));
            }
        }
        s.push('.');
        i += 1 + l as usize;
    }
    if s.is_empty() {
        s.push('.');
    }
    s
}

/// The wire-form suffixes of a name: the name itself, then without its
/// first label, and so on (the root not included).
fn suffixes(w: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let mut i = 0;
    std::iter::from_fn(move || {
        let l = *w.get(i)? as usize;
        if l == 0 || l > 63 {
            return None;
        }
        let at = i;
        i += 1 + l;
        Some((at, w.get(at..)?))
    })
}

/// Encodes messages with name compression. Used to precompute answer
/// bodies and for the dynamic answers (chased CNAMEs, synthesized pod
/// records).
pub struct Writer {
    pub buf: Vec<u8>,
    names: HashMap<Vec<u8>, u16>,
}

impl Default for Writer {
    fn default() -> Self {
        Self::new()
    }
}

impl Writer {
    pub fn new() -> Writer {
        Writer {
            buf: Vec::with_capacity(512),
            names: HashMap::new(),
        }
    }

    /// Starts a message: the header (counts patched later by the caller)
    /// and a question whose name becomes a compression target.
    pub fn with_question(header: Header, qname: &[u8], qtype: u16, qclass: u16) -> Writer {
        let mut w = Writer::new();
        Header { qd: 1, ..header }.write(&mut w.buf);
        w.name(qname, true);
        w.buf.extend_from_slice(&qtype.to_be_bytes());
        w.buf.extend_from_slice(&qclass.to_be_bytes());
        w
    }

    /// Continues a message already in `buf` (header and question written).
    pub fn resume(buf: Vec<u8>) -> Writer {
        Writer {
            buf,
            names: HashMap::new(),
        }
    }

    /// Makes the names of a question already in `buf` (at offset 12)
    /// compression targets.
    pub fn learn_question(&mut self, qname_lower: &[u8]) {
        for (at, suf) in suffixes(qname_lower) {
            let off = HEADER_LEN + at;
            if off < 0x3fff {
                self.names
                    .entry(suf.to_ascii_lowercase())
                    .or_insert(off as u16);
            }
        }
    }

    /// Writes a name, pointing at an earlier copy of its longest known suffix.
    pub fn name(&mut self, w: &[u8], compress: bool) {
        for (at, suf) in suffixes(w) {
            let key = suf.to_ascii_lowercase();
            if compress {
                if let Some(&off) = self.names.get(&key) {
                    self.buf.extend_from_slice(&(0xc000 | off).to_be_bytes());
                    return;
                }
            }
            let here = self.buf.len();
            if here < 0x3fff {
                self.names.entry(key).or_insert(here as u16);
            }
            let l = w[at] as usize;
            self.buf.extend_from_slice(&w[at..at + 1 + l]);
        }
        self.buf.push(0);
    }

    /// Appends one record.
    pub fn record(&mut self, r: &Record) {
        self.name(&r.name, true);
        self.buf.extend_from_slice(&r.rtype.to_be_bytes());
        self.buf.extend_from_slice(&r.class.to_be_bytes());
        self.buf.extend_from_slice(&r.ttl.to_be_bytes());
        let len_at = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        match &r.rdata {
            RData::A(ip) => self.buf.extend_from_slice(&ip.octets()),
            RData::Aaaa(ip) => self.buf.extend_from_slice(&ip.octets()),
            RData::Name(n) => self.name(n, true),
            RData::Srv {
                priority,
                weight,
                port,
                target,
            } => {
                for v in [priority, weight, port] {
                    self.buf.extend_from_slice(&v.to_be_bytes());
                }
                // RFC 2782: no compression of the target.
                self.name(target, false);
            }
            RData::Mx {
                preference,
                exchange,
            } => {
                self.buf.extend_from_slice(&preference.to_be_bytes());
                self.name(exchange, true);
            }
            RData::Txt(parts) => {
                for p in parts {
                    let p = &p[..p.len().min(255)];
                    self.buf.push(p.len() as u8);
                    self.buf.extend_from_slice(p);
                }
            }
            RData::Soa {
                mname,
                rname,
                serial,
                refresh,
                retry,
                expire,
                minimum,
            } => {
                self.name(mname, true);
                self.name(rname, true);
                for v in [serial, refresh, retry, expire, minimum] {
                    self.buf.extend_from_slice(&v.to_be_bytes());
                }
            }
            RData::Raw(b) => self.buf.extend_from_slice(b),
        }
        let rdlen = (self.buf.len() - len_at - 2) as u16;
        self.buf[len_at..len_at + 2].copy_from_slice(&rdlen.to_be_bytes());
    }

    /// Patches the section counts in the header.
    pub fn set_counts(&mut self, an: u16, ns: u16, ar: u16) {
        if self.buf.len() >= HEADER_LEN {
            self.buf[6..8].copy_from_slice(&an.to_be_bytes());
            self.buf[8..10].copy_from_slice(&ns.to_be_bytes());
            self.buf[10..12].copy_from_slice(&ar.to_be_bytes());
        }
    }
}

/// Builds a query message (for the forwarder and test clients).
pub fn build_query(id: u16, name: &[u8], qtype: u16, edns: Option<u16>) -> Vec<u8> {
    let h = Header {
        id,
        flags: RD,
        qd: 1,
        an: 0,
        ns: 0,
        ar: edns.is_some() as u16,
    };
    let mut w = Writer::with_question(h, name, qtype, CLASS_IN);
    if let Some(size) = edns {
        w.buf.push(0);
        w.buf.extend_from_slice(&TYPE_OPT.to_be_bytes());
        w.buf.extend_from_slice(&size.to_be_bytes());
        w.buf.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    }
    w.buf
}

/// Sets the TC bit and drops every record: a client that sees it retries
/// over TCP (RFC 2181 9). The question and an OPT (when asked) stay.
pub fn truncate(out: &mut Vec<u8>, question_end: usize, edns: Option<Edns>) {
    out.truncate(question_end);
    if out.len() < HEADER_LEN {
        return;
    }
    out[2] |= (TC >> 8) as u8;
    let ar = edns.is_some() as u16;
    out[6..12].copy_from_slice(&[0, 0, 0, 0, 0, ar as u8]);
    if let Some(e) = edns {
        write_opt(out, e.dnssec_ok, 0);
    }
}

/// The reverse-lookup name of an address (`4.3.2.1.in-addr.arpa`, or the
/// nibble form under `ip6.arpa`), in wire form.
pub fn reverse_name(ip: std::net::IpAddr) -> Vec<u8> {
    let mut out = Vec::with_capacity(74);
    match ip {
        std::net::IpAddr::V4(v4) => {
            for o in v4.octets().iter().rev() {
                let s = o.to_string();
                out.push(s.len() as u8);
                out.extend_from_slice(s.as_bytes());
            }
            out.extend_from_slice(b"\x07in-addr\x04arpa\x00");
        }
        std::net::IpAddr::V6(v6) => {
            for o in v6.octets().iter().rev() {
                for nib in [o & 0xf, o >> 4] {
                    out.push(1);
                    out.push(b"0123456789abcdef"[nib as usize]);
                }
            }
            out.extend_from_slice(b"\x03ip6\x04arpa\x00");
        }
    }
    out
}

/// The address a reverse-lookup name stands for, when it names one whole
/// address.
pub fn parse_reverse(n: &NameBuf) -> Option<std::net::IpAddr> {
    let c = n.label_count();
    if c == 6 && n.label(4) == b"in-addr" && n.label(5) == b"arpa" {
        let mut o = [0u8; 4];
        for (i, slot) in o.iter_mut().rev().enumerate() {
            let l = n.label(i);
            if l.is_empty() || l.len() > 3 || (l.len() > 1 && l[0] == b'0') {
                return None;
            }
            let v: u16 = std::str::from_utf8(l).ok()?.parse().ok()?;
            *slot = u8::try_from(v).ok()?;
        }
        return Some(Ipv4Addr::from(o).into());
    }
    if c == 34 && n.label(32) == b"ip6" && n.label(33) == b"arpa" {
        let mut b = [0u8; 16];
        for i in 0..32 {
            let l = n.label(i);
            if l.len() != 1 {
                return None;
            }
            let v = (l[0] as char).to_digit(16)? as u8;
            let byte = 15 - i / 2;
            if i % 2 == 0 {
                b[byte] |= v;
            } else {
                b[byte] |= v << 4;
            }
        }
        return Some(Ipv6Addr::from(b).into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(name: &str, qtype: u16, edns: Option<u16>) -> Vec<u8> {
        build_query(0x1234, &name_from_str(name).unwrap(), qtype, edns)
    }

    #[test]
    fn query_round_trip() {
        let mut m = q("Web.Default.svc.cluster.local", TYPE_A, Some(1232));
        m[13] = b'W';
        let p = parse_query(&m).unwrap();
        assert_eq!(p.header.id, 0x1234);
        assert_eq!(
            name_to_string(p.qname.wire()),
            "web.default.svc.cluster.local."
        );
        assert_eq!(p.qtype, TYPE_A);
        assert_eq!(p.edns.unwrap().udp_size, 1232);
        assert_eq!(p.udp_limit(), 1232);
        assert_eq!(p.qname.label_count(), 5);
        assert_eq!(p.qname.label(0), b"web");
        // Case preserved in the echoed question.
        assert_eq!(&p.question[1..4], b"Web");
        let z = name_from_str("cluster.local").unwrap();
        assert_eq!(p.qname.zone_start(&z), Some(3));
        // "ter.local" is not on a label boundary.
        assert_eq!(
            p.qname
                .zone_start(&name_from_str("svc.cluster.local").unwrap()),
            Some(2)
        );
        let not = name_from_str("r.local").unwrap();
        assert_eq!(p.qname.zone_start(&not), None);
        let m2 = q("x", TYPE_A, None);
        let p2 = parse_query(&m2).unwrap();
        assert_eq!(p2.udp_limit(), 512);
        assert!(p2.edns.is_none());
    }

    #[test]
    fn bad_queries() {
        assert_eq!(parse_query(&[1, 2, 3]).unwrap_err(), BadQuery::Drop);
        let mut m = q("a.b", TYPE_A, None);
        m[2] |= 0x80; // a response
        assert_eq!(parse_query(&m).unwrap_err(), BadQuery::Drop);
        let mut m = q("a.b", TYPE_A, None);
        m[2] |= 0x10; // opcode 2
        assert!(matches!(
            parse_query(&m).unwrap_err(),
            BadQuery::Reply { rcode: 4, .. }
        ));
        let mut m = q("a.b", TYPE_A, None);
        m.truncate(m.len() - 1);
        assert!(matches!(
            parse_query(&m).unwrap_err(),
            BadQuery::Reply { rcode: 1, .. }
        ));
        let mut m = q("a.b", TYPE_A, None);
        m[5] = 2; // two questions
        assert!(matches!(
            parse_query(&m).unwrap_err(),
            BadQuery::Reply { rcode: 1, .. }
        ));
        // A pointer in the question.
        let mut m = q("a.b", TYPE_A, None);
        m[12] = 0xc0;
        assert!(matches!(
            parse_query(&m).unwrap_err(),
            BadQuery::Reply { rcode: 1, .. }
        ));
        // EDNS version 1 gets BADVERS with an OPT.
        let mut m = q("a.b", TYPE_A, Some(1232));
        let n = m.len();
        m[n - 5] = 1;
        let bad = parse_query(&m).unwrap_err();
        assert!(matches!(bad, BadQuery::Reply { rcode: 16, .. }));
        let mut out = Vec::new();
        assert!(error_reply(&m, &bad, &mut out));
        let r = Message::parse(&out).unwrap();
        assert!(r.opt_span.is_some());
        assert_eq!(r.questions.len(), 1);
        // A label of 64 bytes.
        let mut m = vec![0u8; 12];
        m[5] = 1;
        m.push(64);
        m.extend([b'a'; 64]);
        m.extend([0, 0, 1, 0, 1]);
        assert!(matches!(
            parse_query(&m).unwrap_err(),
            BadQuery::Reply { rcode: 1, .. }
        ));
        // A 256-byte name.
        let long = vec!["a".repeat(63); 4].join(".");
        assert!(name_from_str(&long).is_err());
    }

    #[test]
    fn compression_and_parse() {
        let qn = name_from_str("_http._tcp.web.ns.svc.cluster.local").unwrap();
        let mut w = Writer::with_question(Header::default(), &qn, TYPE_SRV, CLASS_IN);
        let target = name_from_str("web.ns.svc.cluster.local").unwrap();
        w.record(&Record {
            name: qn.clone(),
            rtype: TYPE_SRV,
            class: CLASS_IN,
            ttl: 5,
            rdata: RData::Srv {
                priority: 0,
                weight: 100,
                port: 80,
                target: target.clone(),
            },
        });
        w.record(&Record {
            name: target.clone(),
            rtype: TYPE_A,
            class: CLASS_IN,
            ttl: 5,
            rdata: RData::A(Ipv4Addr::new(10, 96, 0, 1)),
        });
        w.set_counts(1, 0, 1);
        let m = Message::parse(&w.buf).unwrap();
        assert_eq!(m.answers.len(), 1);
        assert_eq!(m.answers[0].name, qn);
        assert_eq!(m.additional[0].name, target);
        assert_eq!(m.additional[0].rdata, RData::A(Ipv4Addr::new(10, 96, 0, 1)));
        // The A owner is a pointer: 2 bytes + 10 + 4.
        assert!(w.buf.len() < 12 + qn.len() + 4 + 16 + 6 + target.len() + 16 + 1);
        assert_eq!(m.ttl_offsets.len(), 2);
    }

    #[test]
    fn pointer_loops_are_rejected() {
        // A name that points at itself.
        let mut m = vec![0u8; 12];
        m.extend([0xc0, 12]);
        let mut n = NameBuf::default();
        assert_eq!(read_name(&m, 12, &mut n, true), Err(WireError::BadPointer));
        // Forward pointer.
        let mut m = vec![0u8; 12];
        m.extend([0xc0, 20, 0]);
        assert!(read_name(&m, 12, &mut n, true).is_err());
    }

    #[test]
    fn reverse_names() {
        let ip: std::net::IpAddr = "10.96.0.10".parse().unwrap();
        let r = reverse_name(ip);
        assert_eq!(name_to_string(&r), "10.0.96.10.in-addr.arpa.");
        let n = NameBuf::from_wire_lower(&r).unwrap();
        assert_eq!(parse_reverse(&n), Some(ip));
        let ip6: std::net::IpAddr = "fd00::1".parse().unwrap();
        let n = NameBuf::from_wire_lower(&reverse_name(ip6)).unwrap();
        assert_eq!(parse_reverse(&n), Some(ip6));
        let bad =
            NameBuf::from_wire_lower(&name_from_str("300.0.96.10.in-addr.arpa").unwrap()).unwrap();
        assert_eq!(parse_reverse(&bad), None);
    }

    #[test]
    fn truncation_keeps_question_and_opt() {
        let m = q("a.b", TYPE_A, Some(1232));
        let p = parse_query(&m).unwrap();
        let mut out = m.clone();
        let qend = HEADER_LEN + p.question.len();
        out.extend([1, 2, 3]);
        truncate(&mut out, qend, p.edns);
        let r = Message::parse(&out).unwrap();
        assert!(r.header.flags & TC != 0);
        assert!(r.opt_span.is_some());
        assert_eq!(r.header.an, 0);
    }
}
