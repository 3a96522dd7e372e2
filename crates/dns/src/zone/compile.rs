//! Encoding a name's records into the answer bodies a snapshot copies
//! out: one body per record type, compressed for a response whose
//! question is that name, SRV answers with their targets' addresses in
//! the additional section, every body capped to fit a TCP message.
//! Compiling happens at publish time, once per changed name, so answering
//! never encodes anything.

use std::collections::HashMap;

use super::build::Node;
use super::records::Rec;
use super::table::Entry;
use crate::wire::{self, Header, RData, Record, Writer};

/// Bodies are capped so a huge headless Service still fits a TCP message.
const MAX_BODY: usize = 60_000;

/// Encodes every answer a name gives. `nodes` is the whole zone, for the
/// addresses of SRV targets.
pub(super) fn compile(name: &[u8], node: &Node, nodes: &HashMap<Vec<u8>, Node>, ttl: u32) -> Entry {
    let mut recs: Vec<&Rec> = node.recs.iter().map(|(_, r)| r).collect();
    recs.sort();
    recs.dedup();
    let mut entry = Entry::default();
    let mut types: Vec<u16> = recs.iter().map(|r| r.rtype).collect();
    types.dedup();
    // ANY has no body of its own: the lookup answers it with the name's
    // first RRset (RFC 8482's minimal ANY answer; saves memory).
    for &t in types.iter() {
        let of_type: Vec<&Rec> = recs.iter().copied().filter(|r| r.rtype == t).collect();
        if of_type.is_empty() {
            continue;
        }
        let (an, ar, body) = encode_rrset(name, t, &of_type, nodes, ttl);
        if t == wire::TYPE_CNAME {
            if let Some(RData::Name(target)) = of_type.first().map(|r| &r.rdata) {
                entry.cname = Some(target.clone());
            }
        }
        entry.rrsets.push((t, an, ar, body));
    }
    entry
}

/// The answer body for one type at `name`: the answer records, then for
/// SRV the targets' addresses; with the answer and additional counts.
fn encode_rrset(
    name: &[u8],
    t: u16,
    of_type: &[&Rec],
    nodes: &HashMap<Vec<u8>, Node>,
    ttl: u32,
) -> (u16, u16, Vec<u8>) {
    let mut w = Writer::with_question(Header::default(), name, t, wire::CLASS_IN);
    let start = w.buf.len();
    let n = of_type.iter().filter(|r| r.rtype == wire::TYPE_SRV).count() as u16;
    let mut an = 0u16;
    let mut targets = Vec::new();
    for r in of_type {
        let mut rec = record(r, name, ttl);
        if let RData::Srv { weight, target, .. } = &mut rec.rdata {
            *weight = (100 / n.max(1)).max(1);
            if t == wire::TYPE_SRV && !targets.contains(target) {
                targets.push(target.clone());
            }
        }
        if !push_capped(&mut w, start, &rec) {
            break;
        }
        an += 1;
    }
    let ar = srv_additional(&mut w, start, &targets, nodes, ttl);
    (an, ar, w.buf[start..].to_vec())
}

/// SRV answers carry the targets' addresses (spec 2.3.2, 2.4.2). Returns
/// how many were written.
fn srv_additional(
    w: &mut Writer,
    start: usize,
    targets: &[Vec<u8>],
    nodes: &HashMap<Vec<u8>, Node>,
    ttl: u32,
) -> u16 {
    let mut ar = 0u16;
    for target in targets {
        let Some(tn) = nodes.get(target) else {
            continue;
        };
        let mut addrs: Vec<&Rec> = tn
            .recs
            .iter()
            .map(|(_, r)| r)
            .filter(|r| r.rtype == wire::TYPE_A || r.rtype == wire::TYPE_AAAA)
            .collect();
        addrs.sort();
        addrs.dedup();
        for r in addrs {
            if !push_capped(w, start, &record(r, target, ttl)) {
                break;
            }
            ar += 1;
        }
    }
    ar
}

/// Appends `rec` unless the body (from `start`) would pass [`MAX_BODY`];
/// false when it did not fit.
fn push_capped(w: &mut Writer, start: usize, rec: &Record) -> bool {
    let before = w.buf.len();
    w.record(rec);
    if w.buf.len() - start > MAX_BODY {
        w.buf.truncate(before);
        return false;
    }
    true
}

fn record(r: &Rec, owner: &[u8], ttl: u32) -> Record {
    Record {
        name: owner.to_vec(),
        rtype: r.rtype,
        class: wire::CLASS_IN,
        ttl,
        rdata: r.rdata.clone(),
    }
}

/// The SOA's RDATA uncompressed: it is copied into responses of any
/// layout.
pub(super) fn soa_rdata(soa: RData) -> Vec<u8> {
    match soa {
        RData::Soa {
            mname,
            rname,
            serial,
            refresh,
            retry,
            expire,
            minimum,
        } => {
            let mut v = mname;
            v.extend_from_slice(&rname);
            for x in [serial, refresh, retry, expire, minimum] {
                v.extend_from_slice(&x.to_be_bytes());
            }
            v
        }
        _ => unreachable!("soa() returns an SOA"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use crate::wire::*;
    use crate::zone::{Builder, ZoneConfig};

    #[test]
    fn big_headless_is_capped() {
        let mut b = Builder::new(ZoneConfig::default());
        b.upsert_service(&svc("big", "h", "None", &[("p", 1, "TCP")]));
        let eps: Vec<(String, bool)> = (0..3000)
            .map(|i| (format!("10.244.{}.{}", i / 250, i % 250 + 1), true))
            .collect();
        let refs: Vec<(&str, Option<&str>, bool)> =
            eps.iter().map(|(ip, r)| (ip.as_str(), None, *r)).collect();
        b.upsert_slice(&slice("big", "h-1", "h", &refs, &[("p", 1)]));
        let s = b.publish(true);
        let m = ask(&s, "h.big.svc.cluster.local", TYPE_A);
        assert_eq!(m.answers.len(), 3000);
        let m = ask(&s, "_p._tcp.h.big.svc.cluster.local", TYPE_SRV);
        assert!(!m.answers.is_empty() && m.answers.len() <= 3000);
    }
}
