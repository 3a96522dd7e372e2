//! How observe recognises what it planned without decoding expressions:
//! a rule by its shape (the names of the kernel expressions it is made of,
//! and its comment), a set by its declaration (flags, key and data types).
//! Both are compared with what the encoder would send for the plan, so a
//! rule or set changed behind our back shows up as a difference.

use podnet_kernel::nl::{get_str, Attrs};

use super::encode::set_msg;
use super::expr::rule_msg;
use super::layout::be32;
use crate::model::{Family, Rule, Set, Table};

/// What a rule looks like in a dump: its expressions' names and its user
/// data (the comment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Shape {
    pub(super) exprs: Vec<String>,
    udata: Option<Vec<u8>>,
}

/// Reads a rule's shape from its attributes (after the nfgenmsg header).
pub(super) fn shape_of(attrs: &[u8]) -> (Option<String>, Shape) {
    let mut chain = None;
    let mut shape = Shape {
        exprs: Vec::new(),
        udata: None,
    };
    for (ty, v) in Attrs::new(attrs) {
        match ty {
            2 => chain = Some(get_str(v)),
            4 => {
                for (_, e) in Attrs::new(v) {
                    if let Some((_, n)) = Attrs::new(e).find(|(t, _)| *t == 1) {
                        shape.exprs.push(get_str(n));
                    }
                }
            }
            7 => shape.udata = Some(v.to_vec()),
            _ => {}
        }
    }
    (chain, shape)
}

/// The shape the kernel will report for one of our rules.
pub(super) fn rule_shape(t: &Table, chain: &str, r: &Rule) -> Shape {
    let bytes = rule_msg(t, chain, r).finish(0);
    shape_of(&bytes[20..]).1
}

/// The chain's rules as observe reports them: `want`'s own when the kernel
/// holds rules of their shapes (`got`, in order), else one unplanned rule
/// per rule held, so the diff to `want` replaces them.
pub(super) fn observed_rules(want: &Table, chain: &str, got: &[Shape]) -> Vec<Rule> {
    match want.chains.get(chain) {
        Some(w)
            if w.rules.len() == got.len()
                && w.rules
                    .iter()
                    .zip(got)
                    .all(|(r, s)| rule_shape(want, chain, r) == *s) =>
        {
            w.rules.clone()
        }
        _ => got
            .iter()
            .map(|_| Rule {
                exprs: vec![],
                comment: Some("not planned".into()),
            })
            .collect(),
    }
}

/// What the kernel reports of a set's declaration: its flags, key type,
/// key length and data type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SetDecl {
    flags: u32,
    key_type: u32,
    key_len: u32,
    data_type: Option<u32>,
}

/// Reads a set's name and declaration from its attributes (after the
/// nfgenmsg header).
pub(super) fn set_decl_of(attrs: &[u8]) -> (Option<String>, SetDecl) {
    let mut name = None;
    let mut d = SetDecl {
        flags: 0,
        key_type: 0,
        key_len: 0,
        data_type: None,
    };
    for (ty, v) in Attrs::new(attrs) {
        match ty {
            2 => name = Some(get_str(v)),
            3 => d.flags = be32(v),
            4 => d.key_type = be32(v),
            5 => d.key_len = be32(v),
            6 => d.data_type = Some(be32(v)),
            _ => {}
        }
    }
    (name, d)
}

/// The declaration the kernel will report for a set we declare as `s`.
pub(super) fn set_decl(s: &Set) -> SetDecl {
    let bytes = set_msg(&Table::new(Family::Ip, "x"), "x", s).finish(0);
    set_decl_of(&bytes[20..]).1
}
