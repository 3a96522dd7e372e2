//! The delegation chain: which plugins this process is inside of, and how
//! deep that may go.
//!
//! A configuration can name itself (a `bridge` whose `ipam.type` is
//! `bridge`, a `podnet` delegating to `podnet`) and would otherwise recurse
//! until the stack overflows. Every delegation enters one level of the
//! chain, in-process in a thread-local and across exec in
//! [`CHAIN_ENV`], up to [`MAX_DEPTH`]. This module knows nothing of how a
//! plugin is called, so the skeleton can take over an inherited chain
//! without depending on [`crate::invoke`].

use std::cell::RefCell;

use crate::error::CniError;

/// How many delegations may nest (podnet → bridge → host-local is 2).
pub const MAX_DEPTH: usize = 4;

/// The environment variable that carries the delegation chain to a plugin
/// that is executed rather than called in-process.
pub const CHAIN_ENV: &str = "PODNET_CNI_DELEGATION";

thread_local! {
    /// The plugins delegated to and not yet returned, outermost first.
    static CHAIN: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Takes over the chain an executing parent passed in [`CHAIN_ENV`].
pub fn inherit_chain(v: Option<&str>) {
    let chain: Vec<String> = v
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    CHAIN.with(|c| *c.borrow_mut() = chain);
}

/// One level of delegation, left when dropped.
pub(crate) struct Depth;

impl Depth {
    pub(crate) fn enter(name: &str) -> Result<Depth, CniError> {
        CHAIN.with(|c| {
            let mut c = c.borrow_mut();
            if c.len() >= MAX_DEPTH {
                return Err(CniError::config(format!(
                    "plugin delegation nested more than {MAX_DEPTH} deep ({} -> {name}): \
                     does a configuration delegate to itself?",
                    c.join(" -> ")
                )));
            }
            c.push(name.to_string());
            Ok(Depth)
        })
    }

    /// The chain as [`CHAIN_ENV`] carries it to an executed child.
    pub(crate) fn chain() -> String {
        CHAIN.with(|c| c.borrow().join(","))
    }
}

impl Drop for Depth {
    fn drop(&mut self) {
        CHAIN.with(|c| {
            c.borrow_mut().pop();
        });
    }
}
