//! nf_tables over netlink: a change list ([`crate::diff::Change`]) encoded as
//! one nfnetlink batch, applied as one kernel transaction (all or nothing),
//! without the `nft` tool re-reading the table on every call.
//!
//! Reading back ([`Conn::observe`], [`Conn::elements`], [`Conn::counter`])
//! is netlink too: chains, rules, sets, their elements (with comments) and
//! named counters are dumped and decoded into the same model, so a sync is
//! observe → diff → apply, and a table changed behind our back is repaired
//! by the same diff. Rules are compared by shape (the kernel expressions
//! each rule is made of, and its comment) rather than decoded: enough to
//! notice a rule deleted, added or replaced.
//!
//! In `inet` tables a match on an IPv4 or IPv6 header field first checks
//! `meta nfproto`, as `nft` does, so an IPv6 packet is never read as IPv4.
//!
//! Registers: single values go in the 16-byte `NFT_REG_1`/`NFT_REG_2`;
//! concatenated keys are laid out in consecutive 32-bit registers from
//! `NFT_REG32_00`, each field padded to four bytes, which is also how set
//! keys are laid out in elements. A one-field key is as long as its field
//! (a port is two bytes), as `nft` declares it, so `nft list` shows it.
//!
//! Interval sets hold ranges the way `nft` writes them, so the kernel picks
//! the same set type and `nft list` shows the same elements: a
//! concatenation (the pipapo set) sends each element's last values in
//! `KEY_END`, a single address or port being the range [x, x]; a one-field
//! set (the rbtree set) sends an element at the range's first value and one
//! flagged `INTERVAL_END` at the value after its last. Either reads back in
//! the canonical spelling of [`crate::model::Value`].
//!
//! One concept per file:
//!
//! - `layout`: how model values are laid out as bytes (keys, range ends,
//!   verdicts, comments), shared by both directions;
//! - `expr`: a rule's expressions as kernel expressions and registers;
//! - `encode`: a change list as the messages of one batch;
//! - `decode`: dumped chains, elements and data back into the model;
//! - `shape`: how observe recognises our rules and set declarations
//!   without decoding expressions;
//! - `conn`: the socket ([`Conn`]): applying batches, deleting tables;
//! - `observe`: reading a table, a set's elements or a counter back.

mod conn;
mod decode;
mod encode;
mod expr;
mod layout;
mod observe;
mod shape;
#[cfg(test)]
mod tests;

pub use conn::{Conn, RuleRef};
pub use encode::encode;

use podnet_kernel::nl::{Msg, NLM_F_ACK};

use crate::model::{Family, Table};

// The protocol numbers every direction shares (linux/netfilter/nf_tables.h).

const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;

const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_DELSET: u16 = 11;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_GETSET: u16 = 10;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_GETSETELEM: u16 = 13;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFT_MSG_NEWOBJ: u16 = 18;
const NFT_MSG_GETOBJ: u16 = 19;
const NFT_MSG_DELOBJ: u16 = 20;
const NFT_OBJECT_COUNTER: u32 = 1;

const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_SET_ELEM_FLAGS: u16 = 3;
const NFTA_SET_ELEM_KEY_END: u16 = 10;
const NFT_SET_ELEM_INTERVAL_END: u32 = 1;

const NFTA_LIST_ELEM: u16 = 1;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_REG_2: u32 = 2;
const NFT_REG32_00: u32 = 8;

const NF_DROP: i32 = 0;
const NF_ACCEPT: i32 = 1;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
const NFT_RETURN: i32 = -5;

/// The `nfgen_family` of a table's family.
fn family_num(f: Family) -> u8 {
    match f {
        Family::Ip => 2,
        Family::Ip6 => 10,
        Family::Inet => 1,
        Family::Bridge => 7,
    }
}

/// A request about table `t` (its family in the nfgenmsg header), acked.
fn msg(t: &Table, cmd: u16, flags: u16) -> Msg {
    let mut m = Msg::new((NFNL_SUBSYS_NFTABLES << 8) | cmd, flags | NLM_F_ACK);
    m.raw(&[family_num(t.family), 0, 0, 0]);
    m
}
