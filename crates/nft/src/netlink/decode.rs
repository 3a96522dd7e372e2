//! Dumped nf_tables objects back into the model: chains, element keys
//! and range ends (in the canonical spelling of [`Value`]), one-field
//! ranges paired from their two elements, map data and verdicts, and
//! counter values. Rules are not decoded (see `shape`).

use std::net::IpAddr;

use podnet_kernel::nl::{get_str, Attrs};

use super::layout::{be32, be64, before, comment_from_udata, field_len, padded};
use super::{
    NFTA_DATA_VALUE, NFTA_DATA_VERDICT, NFTA_SET_ELEM_DATA, NFTA_SET_ELEM_FLAGS, NFTA_SET_ELEM_KEY,
    NFTA_SET_ELEM_KEY_END, NFTA_SET_ELEM_USERDATA, NFTA_VERDICT_CHAIN, NFTA_VERDICT_CODE, NFT_GOTO,
    NFT_JUMP, NFT_RETURN, NFT_SET_ELEM_INTERVAL_END, NF_ACCEPT, NF_DROP,
};
use crate::model::{
    BaseChain, Chain, ChainType, ElemData, Hook, KeyType, MapData, Proto, Value, Verdict,
};

/// The hook of a base chain's hook number.
fn hook_from_num(n: u32) -> Option<Hook> {
    Some(match n {
        0 => Hook::Prerouting,
        1 => Hook::Input,
        2 => Hook::Forward,
        3 => Hook::Output,
        4 => Hook::Postrouting,
        _ => return None,
    })
}

/// One field's value from its bytes and its range end, in the canonical
/// spelling of [`Value`]: a range [x, x] is `Addr`/`Port`, a wider one the
/// `Net` it spans or a `PortRange`.
pub(super) fn decode_value(k: KeyType, b: &[u8], end: Option<&[u8]>) -> Option<Value> {
    let addr = |b: &[u8]| -> Option<IpAddr> {
        Some(match b.len() {
            4 => IpAddr::from(<[u8; 4]>::try_from(b).ok()?),
            _ => IpAddr::from(<[u8; 16]>::try_from(b).ok()?),
        })
    };
    Some(match k {
        KeyType::Ipv4Addr | KeyType::Ipv6Addr => {
            let start = addr(b)?;
            match end.filter(|e| *e != b) {
                Some(e) => {
                    let bits = b.len() * 8;
                    let (s, e) = (be_uint(b), be_uint(e));
                    let prefix = (s ^ e).leading_zeros() as usize - (128 - bits);
                    Value::Net(ipnet::IpNet::new(start, prefix as u8).ok()?)
                }
                None => Value::Addr(start),
            }
        }
        KeyType::InetProto => match b.first()? {
            6 => Value::Proto(Proto::Tcp),
            17 => Value::Proto(Proto::Udp),
            132 => Value::Proto(Proto::Sctp),
            n => Value::U8(*n),
        },
        KeyType::InetService => {
            let port = |b: &[u8]| Some(u16::from_be_bytes([*b.first()?, *b.get(1)?]));
            let lo = port(b)?;
            match end.and_then(port).filter(|hi| *hi != lo) {
                Some(hi) => Value::PortRange(lo, hi),
                None => Value::Port(lo),
            }
        }
        KeyType::Mark => Value::U32(u32::from_ne_bytes(b.get(..4)?.try_into().ok()?)),
        KeyType::IfName => Value::Name(get_str(b)),
        KeyType::EtherAddr => Value::Mac(b.get(..6)?.try_into().ok()?),
        KeyType::NfProto | KeyType::PktType | KeyType::Icmp6Type => Value::U8(*b.first()?),
        KeyType::EtherType => Value::U16(u16::from_be_bytes(b.get(..2)?.try_into().ok()?)),
        KeyType::DevGroup => Value::U32(u32::from_ne_bytes(b.get(..4)?.try_into().ok()?)),
    })
}

/// A big-endian unsigned number of up to 16 bytes.
fn be_uint(b: &[u8]) -> u128 {
    b.iter().fold(0u128, |acc, x| (acc << 8) | *x as u128)
}

/// A concatenated key (and range end) split by the key types.
pub(super) fn decode_key(types: &[KeyType], b: &[u8], end: Option<&[u8]>) -> Option<Vec<Value>> {
    let mut off = 0;
    let mut out = Vec::with_capacity(types.len());
    for k in types {
        let len = field_len(*k);
        let field = b.get(off..off + len)?;
        let fend = end.and_then(|e| e.get(off..off + len));
        out.push(decode_value(*k, field, fend)?);
        off += padded(len);
    }
    Some(out)
}

/// One element of a one-field interval set as dumped: its key, whether it
/// closes a range, its data and comment.
pub(super) type Bound = (Vec<u8>, bool, Option<ElemData>, Option<String>);

/// The ranges of a one-field interval set from its elements (in any
/// order): each opening element runs to the value before the next
/// element's (the closing one, normally), or to the field's end when none
/// follows. A closing element with nothing open (`nft` writes one at zero)
/// is no range.
pub(super) fn pair_bounds(
    types: &[KeyType],
    mut bounds: Vec<Bound>,
) -> Vec<(Vec<Value>, Option<ElemData>, Option<String>)> {
    let Some(&k) = types.first() else {
        return Vec::new();
    };
    let len = field_len(k);
    // By key; at one key, the range that closes there before the one that opens.
    bounds.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let mut out = Vec::new();
    for (i, (key, closes, data, comment)) in bounds.iter().enumerate() {
        if *closes {
            continue;
        }
        let Some(first) = key.get(..len) else {
            continue;
        };
        let last = match bounds.get(i + 1) {
            Some((next, ..)) => next.get(..len).and_then(before),
            None => Some(vec![0xff; len]),
        };
        let Some(last) = last else { continue };
        if let Some(v) = decode_value(k, first, Some(&last)) {
            out.push((vec![v], data.clone(), comment.clone()));
        }
    }
    out
}

/// A map element's data: values of `data`'s types, or a verdict.
pub(super) fn decode_data(attr: &[u8], data: &Option<MapData>) -> Option<ElemData> {
    for (ty, v) in Attrs::new(attr) {
        match (ty, data) {
            (NFTA_DATA_VALUE, Some(MapData::Data(types))) => {
                return decode_key(types, v, None).map(ElemData::Data)
            }
            (NFTA_DATA_VERDICT, _) => {
                let (mut code, mut chain) = (None, None);
                for (vt, vv) in Attrs::new(v) {
                    match vt {
                        NFTA_VERDICT_CODE => code = Some(be32(vv) as i32),
                        NFTA_VERDICT_CHAIN => chain = Some(get_str(vv)),
                        _ => {}
                    }
                }
                return Some(ElemData::Verdict(match (code?, chain) {
                    (NF_ACCEPT, _) => Verdict::Accept,
                    (NF_DROP, _) => Verdict::Drop,
                    (NFT_RETURN, _) => Verdict::Return,
                    (NFT_JUMP, Some(c)) => Verdict::Jump(c),
                    (NFT_GOTO, Some(c)) => Verdict::Goto(c),
                    _ => return None,
                }));
            }
            _ => {}
        }
    }
    None
}

/// A chain's name and hook, from its attributes (after the nfgenmsg
/// header); its rules are left empty.
pub(super) fn chain_of(attrs: &[u8]) -> Option<(String, Chain)> {
    let (mut name, mut hook, mut prio, mut kind) = (None, None, 0i32, ChainType::Filter);
    for (ty, v) in Attrs::new(attrs) {
        match ty {
            3 => name = Some(get_str(v)),
            4 => {
                for (hty, hv) in Attrs::new(v) {
                    match hty {
                        1 => hook = Some(be32(hv)),
                        2 => prio = be32(hv) as i32,
                        _ => {}
                    }
                }
            }
            7 if get_str(v) == "nat" => kind = ChainType::Nat,
            _ => {}
        }
    }
    let base = hook.and_then(hook_from_num).map(|hook| BaseChain {
        kind,
        hook,
        priority: prio,
    });
    Some((
        name?,
        Chain {
            base,
            rules: vec![],
        },
    ))
}

/// One set element as dumped, before its key is decoded.
pub(super) struct DumpedElem {
    pub(super) key: Vec<u8>,
    /// The range end of a concatenation's element (`KEY_END`).
    pub(super) end: Option<Vec<u8>>,
    pub(super) data: Option<ElemData>,
    pub(super) comment: Option<String>,
    /// Whether it closes a one-field range.
    pub(super) interval_end: bool,
}

/// The elements in one element dump reply's attributes (those without a
/// key are skipped); map data is decoded as `data` declares it.
pub(super) fn elems_of(attrs: &[u8], data: &Option<MapData>) -> Vec<DumpedElem> {
    let mut out = Vec::new();
    for (ty, list) in Attrs::new(attrs) {
        if ty != 3 {
            continue;
        }
        out.extend(Attrs::new(list).filter_map(|(_, el)| elem_of(el, data)));
    }
    out
}

/// One element from its attributes; None without a key.
fn elem_of(el: &[u8], data: &Option<MapData>) -> Option<DumpedElem> {
    let (mut key, mut end, mut elem_data, mut comment) = (None, None, None, None);
    let mut interval_end = false;
    for (ety, ev) in Attrs::new(el) {
        let value = || {
            Attrs::new(ev)
                .find(|(t, _)| *t == NFTA_DATA_VALUE)
                .map(|(_, v)| v.to_vec())
        };
        match ety {
            NFTA_SET_ELEM_KEY => key = value(),
            NFTA_SET_ELEM_KEY_END => end = value(),
            NFTA_SET_ELEM_DATA => elem_data = decode_data(ev, data),
            NFTA_SET_ELEM_FLAGS => interval_end = be32(ev) & NFT_SET_ELEM_INTERVAL_END != 0,
            NFTA_SET_ELEM_USERDATA => comment = comment_from_udata(ev),
            _ => {}
        }
    }
    Some(DumpedElem {
        key: key?,
        end,
        data: elem_data,
        comment,
        interval_end,
    })
}

/// A named counter's (packets, bytes) from its attributes (after the
/// nfgenmsg header); None when they hold no counter data.
pub(super) fn counter_of(attrs: &[u8]) -> Option<(u64, u64)> {
    let (_, v) = Attrs::new(attrs).find(|(ty, _)| *ty == 4)?;
    let (mut packets, mut bytes) = (0, 0);
    for (cty, cv) in Attrs::new(v) {
        match cty {
            1 => bytes = be64(cv),
            2 => packets = be64(cv),
            _ => {}
        }
    }
    Some((packets, bytes))
}
