//! How model values are laid out as bytes in nf_tables messages, in
//! both directions: field lengths and padding, keys and range ends,
//! verdict data, comments, and how a set's elements hold ranges. The
//! encoder writes these layouts and the decoder reads them back, so they
//! live in one place.

use std::net::IpAddr;

use podnet_kernel::nl::Msg;

use super::{
    NFTA_DATA_VERDICT, NFTA_VERDICT_CHAIN, NFTA_VERDICT_CODE, NFT_GOTO, NFT_JUMP, NFT_RETURN,
    NF_ACCEPT, NF_DROP,
};
use crate::model::{KeyType, Set, Value, Verdict};

/// A field's length in bytes, unpadded.
pub(super) fn field_len(k: KeyType) -> usize {
    match k {
        KeyType::Ipv4Addr => 4,
        KeyType::Ipv6Addr => 16,
        KeyType::InetProto => 1,
        KeyType::InetService => 2,
        KeyType::Mark => 4,
        KeyType::IfName => 16,
        KeyType::EtherAddr => 6,
        KeyType::NfProto | KeyType::PktType | KeyType::Icmp6Type => 1,
        KeyType::EtherType => 2,
        KeyType::DevGroup => 4,
    }
}

/// `n` rounded up to the 4-byte register boundary.
pub(super) fn padded(n: usize) -> usize {
    (n + 3) & !3
}

/// One value as the kernel compares it (a prefix as its network address,
/// a port range as its first port).
pub(super) fn value_bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::Addr(IpAddr::V4(a)) => a.octets().to_vec(),
        Value::Addr(IpAddr::V6(a)) => a.octets().to_vec(),
        Value::Net(n) => match n.network() {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        },
        Value::Proto(p) => vec![p.number()],
        Value::Port(p) | Value::PortRange(p, _) => p.to_be_bytes().to_vec(),
        Value::U32(x) => x.to_ne_bytes().to_vec(),
        Value::U8(x) => vec![*x],
        Value::U16(x) => x.to_be_bytes().to_vec(),
        Value::Name(n) => {
            // IFNAMSIZ, NUL padded (what `meta iifname` loads).
            let mut b = n.as_bytes()[..n.len().min(15)].to_vec();
            b.resize(16, 0);
            b
        }
        Value::Mac(m) => m.to_vec(),
    }
}

/// The last value of a range element: a prefix's last address, a port
/// range's last port, else the value itself (a single address or port is
/// the range [x, x]).
pub(super) fn value_end_bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::Net(n) => match n.broadcast() {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        },
        Value::PortRange(_, hi) => hi.to_be_bytes().to_vec(),
        v => value_bytes(v),
    }
}

/// A concatenated range end, laid out like [`key_bytes`].
pub(super) fn key_end_bytes(vals: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in vals {
        let b = value_end_bytes(v);
        let l = padded(b.len());
        out.extend_from_slice(&b);
        out.resize(out.len() + (l - b.len()), 0);
    }
    out
}

/// libnftnl's user data for a comment (rules: type 0, element: type 0):
/// type, length, NUL-terminated text.
pub(super) fn comment_udata(c: &str) -> Vec<u8> {
    let text = &c.as_bytes()[..c.len().min(254)];
    let mut ud = vec![0u8, (text.len() + 1) as u8];
    ud.extend_from_slice(text);
    ud.push(0);
    ud
}

/// The comment in libnftnl user data, if any (see [`comment_udata`]).
pub(super) fn comment_from_udata(ud: &[u8]) -> Option<String> {
    let mut i = 0;
    while i + 2 <= ud.len() {
        let (ty, len) = (ud[i], ud[i + 1] as usize);
        let v = ud.get(i + 2..i + 2 + len)?;
        if ty == 0 {
            let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
            return Some(String::from_utf8_lossy(&v[..end]).into_owned());
        }
        i += 2 + len;
    }
    None
}

/// A concatenated key, each field padded to a 4-byte boundary.
pub(super) fn key_bytes(vals: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in vals {
        let b = value_bytes(v);
        let l = padded(b.len());
        out.extend_from_slice(&b);
        out.resize(out.len() + (l - b.len()), 0);
    }
    out
}

/// A set element's key: a concatenation padded per field, a single field
/// as it is (as `nft` declares such a set, so `nft list` reads a port as a
/// port).
pub(super) fn elem_key_bytes(vals: &[Value]) -> Vec<u8> {
    match vals {
        [v] => value_bytes(v),
        vals => key_bytes(vals),
    }
}

/// A set's key length: see [`elem_key_bytes`].
pub(super) fn set_key_len(key: &[KeyType]) -> usize {
    match key {
        [k] => field_len(*k),
        key => key.iter().map(|k| padded(field_len(*k))).sum(),
    }
}

/// Writes a verdict as `NFTA_DATA_VERDICT` data (an immediate's or a map
/// element's).
pub(super) fn verdict(m: &mut Msg, v: &Verdict) {
    let (code, chain) = match v {
        Verdict::Accept => (NF_ACCEPT, None),
        Verdict::Drop => (NF_DROP, None),
        Verdict::Return => (NFT_RETURN, None),
        Verdict::Jump(c) => (NFT_JUMP, Some(c)),
        Verdict::Goto(c) => (NFT_GOTO, Some(c)),
    };
    m.begin(NFTA_DATA_VERDICT);
    m.u32_be(NFTA_VERDICT_CODE, code as u32);
    if let Some(c) = chain {
        m.str(NFTA_VERDICT_CHAIN, c);
    }
    m.end();
}

/// A big-endian u32 attribute (0 when short).
pub(super) fn be32(v: &[u8]) -> u32 {
    v.get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .unwrap_or(0)
}

/// A big-endian u64 attribute (0 when short).
pub(super) fn be64(v: &[u8]) -> u64 {
    v.get(..8)
        .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
        .unwrap_or(0)
}

/// How a set's elements hold ranges in the kernel.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Ranges {
    /// Exact keys only.
    None,
    /// A concatenation (the pipapo set): one element, its range end in
    /// `KEY_END`.
    KeyEnd,
    /// One field (the rbtree set): an element opens the range at its first
    /// value, and a second one flagged `INTERVAL_END` closes it at the value
    /// after its last (none when the range runs to the field's end), as
    /// `nft` writes them; both are added and deleted together.
    EndElement,
}

/// How set `s` holds ranges.
pub(super) fn ranges(s: &Set) -> Ranges {
    match (s.interval, s.key.len()) {
        (false, _) => Ranges::None,
        (true, 1) => Ranges::EndElement,
        (true, _) => Ranges::KeyEnd,
    }
}

/// Big-endian `b + 1`, or None when `b` is all ones.
fn after(b: &[u8]) -> Option<Vec<u8>> {
    let mut out = b.to_vec();
    for x in out.iter_mut().rev() {
        let (v, carry) = x.overflowing_add(1);
        *x = v;
        if !carry {
            return Some(out);
        }
    }
    None
}

/// Big-endian `b - 1`, or None when `b` is zero.
pub(super) fn before(b: &[u8]) -> Option<Vec<u8>> {
    let mut out = b.to_vec();
    for x in out.iter_mut().rev() {
        let (v, borrow) = x.overflowing_sub(1);
        *x = v;
        if !borrow {
            return Some(out);
        }
    }
    None
}

/// The key of the element that closes a one-field range: the value after
/// its last; None when the range runs to the end.
pub(super) fn interval_end_key(k: &[Value]) -> Option<Vec<u8>> {
    after(&value_end_bytes(k.first()?))
}
