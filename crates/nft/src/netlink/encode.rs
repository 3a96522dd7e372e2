//! A change list ([`crate::diff::Change`]) as the messages of one
//! nfnetlink batch: tables, set declarations, chains, rules (see
//! `expr`), elements and named counters, in the change list's order, each
//! message traceable to the change it came from for error texts.

use podnet_kernel::nl::{Msg, NLM_F_CREATE};

use super::expr::rule_msg;
use super::layout::{
    comment_udata, elem_key_bytes, field_len, interval_end_key, key_bytes, key_end_bytes, padded,
    ranges, set_key_len, verdict, Ranges,
};
use super::{
    msg, NFTA_DATA_VALUE, NFTA_LIST_ELEM, NFTA_SET_ELEM_DATA, NFTA_SET_ELEM_FLAGS,
    NFTA_SET_ELEM_KEY, NFTA_SET_ELEM_KEY_END, NFTA_SET_ELEM_USERDATA, NFT_MSG_DELCHAIN,
    NFT_MSG_DELOBJ, NFT_MSG_DELRULE, NFT_MSG_DELSET, NFT_MSG_DELSETELEM, NFT_MSG_DELTABLE,
    NFT_MSG_NEWCHAIN, NFT_MSG_NEWOBJ, NFT_MSG_NEWSET, NFT_MSG_NEWSETELEM, NFT_MSG_NEWTABLE,
    NFT_OBJECT_COUNTER, NFT_SET_ELEM_INTERVAL_END, NF_ACCEPT,
};
use crate::diff::Change;
use crate::model::{BaseChain, ChainType, ElemData, Hook, KeyType, MapData, Set, Table, Value};

/// A set (or map) declaration, without its elements.
pub(super) fn set_msg(t: &Table, name: &str, s: &Set) -> Msg {
    let mut m = msg(t, NFT_MSG_NEWSET, NLM_F_CREATE);
    let key_len = set_key_len(&s.key);
    let mut flags = 0u32;
    if s.interval {
        flags |= 0x4;
    }
    if s.data.is_some() {
        flags |= 0x8;
    }
    if s.timeout.is_some() {
        flags |= 0x10;
    }
    if s.dynamic {
        flags |= 0x20; // NFT_SET_EVAL
    }
    if s.key.len() > 1 {
        flags |= 0x80; // NFT_SET_CONCAT
    }
    let ty = s.key.iter().fold(0u32, |acc, k| (acc << 6) | type_id(*k));
    m.str(1, &t.name)
        .str(2, name)
        .u32_be(3, flags)
        .u32_be(4, ty)
        .u32_be(5, key_len as u32);
    match &s.data {
        Some(MapData::Verdict) => {
            m.u32_be(6, 0xffff_ff00).u32_be(7, 0);
        }
        Some(MapData::Data(d)) => {
            let ty = d.iter().fold(0u32, |acc, k| (acc << 6) | type_id(*k));
            let len: usize = d.iter().map(|k| padded(field_len(*k))).sum();
            m.u32_be(6, ty).u32_be(7, len as u32);
        }
        None => {}
    }
    if let Some(secs) = s.timeout {
        m.u64_be(11, secs as u64 * 1000);
    }
    m.u32_be(10, 1); // NFTA_SET_ID
    if s.key == [KeyType::IfName] {
        // libnftnl user data: the key is a host-endian string (without
        // it `nft list` shows the names as empty strings).
        let mut ud = vec![0u8, 4]; // NFTNL_UDATA_SET_KEYBYTEORDER
        ud.extend_from_slice(&1u32.to_ne_bytes()); // BYTEORDER_HOST_ENDIAN
        m.attr(13, &ud); // NFTA_SET_USERDATA
    }
    if s.key.len() > 1 || s.size.is_some() {
        m.begin(9); // NFTA_SET_DESC
        if let Some(n) = s.size {
            m.u32_be(1, n);
        }
        if s.key.len() > 1 {
            m.begin(2);
            for k in &s.key {
                m.begin(NFTA_LIST_ELEM)
                    .u32_be(1, field_len(*k) as u32)
                    .end();
            }
            m.end();
        }
        m.end();
    }
    m
}

/// One element as the encoder takes it: key, data, comment.
type Elem<'e> = (&'e [Value], Option<&'e ElemData>, Option<&'e str>);

/// Elements added to (or deleted from) `set`, in as many messages as
/// they need.
fn elems_msgs(t: &Table, set: &str, elems: &[Elem<'_>], add: bool) -> Vec<Msg> {
    let ranges = t.sets.get(set).map(ranges).unwrap_or(Ranges::None);
    let mut out = Vec::new();
    // Keep every message's nested element list under the 64 KiB attribute
    // limit (a one-field range is two elements).
    let per = if ranges == Ranges::EndElement {
        128
    } else {
        256
    };
    for chunk in elems.chunks(per) {
        let mut m = msg(
            t,
            if add {
                NFT_MSG_NEWSETELEM
            } else {
                NFT_MSG_DELSETELEM
            },
            if add { NLM_F_CREATE } else { 0 },
        );
        m.str(1, &t.name).str(2, set);
        m.begin(3);
        for (k, d, c) in chunk {
            m.begin(NFTA_LIST_ELEM);
            m.begin(NFTA_SET_ELEM_KEY)
                .attr(NFTA_DATA_VALUE, &elem_key_bytes(k))
                .end();
            if ranges == Ranges::KeyEnd {
                m.begin(NFTA_SET_ELEM_KEY_END)
                    .attr(NFTA_DATA_VALUE, &key_end_bytes(k))
                    .end();
            }
            if add {
                match d {
                    Some(ElemData::Verdict(v)) => {
                        m.begin(NFTA_SET_ELEM_DATA);
                        verdict(&mut m, v);
                        m.end();
                    }
                    Some(ElemData::Data(vals)) => {
                        m.begin(NFTA_SET_ELEM_DATA)
                            .attr(NFTA_DATA_VALUE, &key_bytes(vals))
                            .end();
                    }
                    None => {}
                }
                if let Some(c) = c {
                    m.attr(NFTA_SET_ELEM_USERDATA, &comment_udata(c));
                }
            }
            m.end();
            if ranges == Ranges::EndElement {
                if let Some(end) = interval_end_key(k) {
                    m.begin(NFTA_LIST_ELEM);
                    m.begin(NFTA_SET_ELEM_KEY).attr(NFTA_DATA_VALUE, &end).end();
                    m.u32_be(NFTA_SET_ELEM_FLAGS, NFT_SET_ELEM_INTERVAL_END);
                    m.end();
                }
            }
        }
        m.end();
        out.push(m);
    }
    out
}

fn hook_num(h: Hook) -> u32 {
    match h {
        Hook::Prerouting => 0,
        Hook::Input => 1,
        Hook::Forward => 2,
        Hook::Output => 3,
        Hook::Postrouting => 4,
    }
}

/// A chain, with its hook when it is a base chain.
fn chain_msg(t: &Table, name: &str, base: &Option<BaseChain>) -> Msg {
    let mut m = msg(t, NFT_MSG_NEWCHAIN, NLM_F_CREATE);
    m.str(1, &t.name).str(3, name);
    if let Some(b) = base {
        m.begin(4)
            .u32_be(1, hook_num(b.hook))
            .u32_be(2, b.priority as u32)
            .end();
        m.u32_be(5, NF_ACCEPT as u32);
        m.str(
            7,
            if b.kind == ChainType::Nat {
                "nat"
            } else {
                "filter"
            },
        );
    }
    m
}

/// Deletes table `t`.
fn name_msg_table(t: &Table) -> Msg {
    let mut m = msg(t, NFT_MSG_DELTABLE, 0);
    m.str(1, &t.name);
    m
}

/// Command `cmd` on the object named `name` (in attribute `attr`) of
/// table `t`.
fn name_msg(t: &Table, cmd: u16, attr: u16, name: &str) -> Msg {
    let mut m = msg(t, cmd, 0);
    m.str(1, &t.name).str(attr, name);
    m
}

/// Encodes a change list as the messages of one batch.
pub fn encode(t: &Table, changes: &[Change]) -> (Vec<Msg>, Vec<String>) {
    let mut msgs = Vec::new();
    let mut what = Vec::new();
    encode_each(t, changes, &mut |m, ci, sub| {
        msgs.push(m);
        what.push(describe(t, &changes[ci], sub));
    });
    (msgs, what)
}

/// What message `sub` of change `c` does, for error texts (computed only
/// when a message fails: rendering every rule up front would cost as much
/// as encoding it).
pub(super) fn describe(t: &Table, c: &Change, sub: usize) -> String {
    match c {
        Change::ResetTable if sub == 0 => format!("adding table {}", t.name),
        Change::ResetTable => format!("deleting table {}", t.name),
        Change::AddTable => format!("adding table {}", t.name),
        Change::AddSet { name, .. } => format!("adding set {name}"),
        Change::DelSet { name } => format!("deleting set {name}"),
        Change::AddChain { name, .. } => format!("adding chain {name}"),
        Change::DelChain { name } => format!("deleting chain {name}"),
        Change::FlushChain { name } => format!("flushing chain {name}"),
        Change::AddRules { chain, rules } => match rules.get(sub) {
            Some(r) => format!("adding rule to {chain}: {}", r.text()),
            None => format!("adding rule to {chain}"),
        },
        Change::AddElems { set, .. } | Change::AddCommented { set, .. } => {
            format!("adding elements to {set}")
        }
        Change::AddCounter { name } => format!("adding counter {name}"),
        Change::DelCounter { name } => format!("deleting counter {name}"),
        Change::DelElems { set, .. } => format!("deleting elements from {set}"),
    }
}

/// Encodes each change's messages in order, handing each to `emit` with
/// the index of its change and its number within that change.
pub(super) fn encode_each(t: &Table, changes: &[Change], emit: &mut dyn FnMut(Msg, usize, usize)) {
    for (ci, c) in changes.iter().enumerate() {
        match c {
            Change::ResetTable => {
                // add-then-delete: no error whether or not it existed.
                let mut m = msg(t, NFT_MSG_NEWTABLE, NLM_F_CREATE);
                m.str(1, &t.name);
                emit(m, ci, 0);
                emit(name_msg_table(t), ci, 1);
            }
            Change::AddTable => {
                let mut m = msg(t, NFT_MSG_NEWTABLE, NLM_F_CREATE);
                m.str(1, &t.name);
                emit(m, ci, 0);
            }
            Change::AddSet { name, set } => emit(set_msg(t, name, set), ci, 0),
            Change::DelSet { name } => emit(name_msg(t, NFT_MSG_DELSET, 2, name), ci, 0),
            Change::AddChain { name, base } => emit(chain_msg(t, name, base), ci, 0),
            Change::DelChain { name } => emit(name_msg(t, NFT_MSG_DELCHAIN, 3, name), ci, 0),
            Change::FlushChain { name } => emit(name_msg(t, NFT_MSG_DELRULE, 2, name), ci, 0),
            Change::AddRules { chain, rules } => {
                for (i, r) in rules.iter().enumerate() {
                    emit(rule_msg(t, chain, r), ci, i);
                }
            }
            Change::AddElems { set, elems } => {
                let e: Vec<Elem<'_>> = elems
                    .iter()
                    .map(|(k, d)| (k.as_slice(), d.as_ref(), None))
                    .collect();
                for (i, m) in elems_msgs(t, set, &e, true).into_iter().enumerate() {
                    emit(m, ci, i);
                }
            }
            Change::AddCommented { set, elems } => {
                let e: Vec<Elem<'_>> = elems
                    .iter()
                    .map(|(k, d, c)| (k.as_slice(), d.as_ref(), Some(c.as_str())))
                    .collect();
                for (i, m) in elems_msgs(t, set, &e, true).into_iter().enumerate() {
                    emit(m, ci, i);
                }
            }
            Change::DelElems { set, keys } => {
                let e: Vec<Elem<'_>> = keys.iter().map(|k| (k.as_slice(), None, None)).collect();
                for (i, m) in elems_msgs(t, set, &e, false).into_iter().enumerate() {
                    emit(m, ci, i);
                }
            }
            Change::AddCounter { name } => {
                let mut m = msg(t, NFT_MSG_NEWOBJ, NLM_F_CREATE);
                m.str(1, &t.name).str(2, name).u32_be(3, NFT_OBJECT_COUNTER);
                m.begin(4).u64_be(1, 0).u64_be(2, 0).end();
                emit(m, ci, 0);
            }
            Change::DelCounter { name } => {
                let mut m = msg(t, NFT_MSG_DELOBJ, 0);
                m.str(1, &t.name).str(2, name).u32_be(3, NFT_OBJECT_COUNTER);
                emit(m, ci, 0);
            }
        }
    }
}

/// nft's own datatype ids, so `nft list` shows our sets readably.
fn type_id(k: KeyType) -> u32 {
    match k {
        KeyType::Ipv4Addr => 7,
        KeyType::Ipv6Addr => 8,
        KeyType::InetProto => 12,
        KeyType::InetService => 13,
        KeyType::Mark => 19,
        KeyType::IfName => 41,
        KeyType::EtherAddr => 9,
        KeyType::NfProto => 2,
        KeyType::PktType => 31,
        KeyType::EtherType => 10,
        KeyType::Icmp6Type => 29,
        KeyType::DevGroup => 43,
    }
}
