//! Owner-name arithmetic on lowercased wire names: building a child name
//! from a label, walking to the parent, testing zone membership. The
//! builder, the record derivation and the object parsing all name things
//! the same way, so the rules (label length, lowercasing, the name limit)
//! live here once.

use std::net::IpAddr;

use crate::wire;

/// Whether `s` can be one DNS label of an owner name.
pub(super) fn valid_label(s: &str) -> bool {
    !s.is_empty() && s.len() <= 63 && !s.contains('.')
}

/// An address as one label: `10-1-2-3`, or `fd00--1` for IPv6.
pub(super) fn dashed(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => v6.to_string().replace(':', "-"),
    }
}

/// `label.name`, lowercased; None if the label or the result is invalid.
pub(super) fn prepend(label: &str, name: &[u8]) -> Option<Vec<u8>> {
    if !valid_label(label) || label.len() + 1 + name.len() > wire::MAX_NAME {
        return None;
    }
    let mut v = Vec::with_capacity(label.len() + 1 + name.len());
    v.push(label.len() as u8);
    v.extend(label.bytes().map(|c| c.to_ascii_lowercase()));
    v.extend_from_slice(name);
    Some(v)
}

/// The parent of a wire name (without its first label).
pub(super) fn parent(name: &[u8]) -> Option<&[u8]> {
    let l = *name.first()? as usize;
    if l == 0 {
        return None;
    }
    name.get(1 + l..)
}

/// Whether `name` is `zone` or below it, on a label boundary.
pub(super) fn is_under(name: &[u8], zone: &[u8]) -> bool {
    name.len() >= zone.len() && name.ends_with(zone) && {
        // On a label boundary: walk labels until the suffix starts.
        let mut i = 0;
        let off = name.len() - zone.len();
        while i < off {
            i += 1 + name[i] as usize;
        }
        i == off
    }
}
