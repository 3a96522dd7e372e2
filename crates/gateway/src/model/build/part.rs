//! What one HTTPRoute or one Ingress adds to the compiled state, kept
//! apart per object so a change to one object recompiles that object
//! alone: its entries per (port, host pattern), the certificates and TLS
//! ports it brings (Ingress), the listeners it attached to, the
//! backends it sends to, and its own status.

use std::collections::{BTreeMap, BTreeSet};

use super::{Key, ParentState};
use crate::model::hosts::Host;
use crate::model::{BackendKey, Bind, Certificate, Entry};

/// The object a [`Part`] came from. Routes order before Ingresses, then
/// by key: the order their entries and certificates are merged in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    Route(Key),
    Ingress(Key),
}

/// Where entries go: a port, the listener's hostname on it (the most
/// specific listener that matches a request's host takes it, and only
/// its routes are searched: listener isolation; Ingresses are under
/// `*`), and the host pattern the entries serve.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot {
    pub bind: Bind,
    pub listener: Host,
    pub host: Host,
}

/// One object's contribution.
#[derive(Debug, Clone, Default)]
pub struct Part {
    /// Entries per slot, in the order the object lists them (sorted by
    /// precedence when merged).
    pub entries: BTreeMap<Slot, Vec<Entry>>,
    /// Ports the object opens (those its entries are on, and TLS ports).
    pub ports: BTreeSet<Bind>,
    /// Ports it terminates TLS on.
    pub tls: BTreeSet<Bind>,
    pub certs: Vec<(Bind, Certificate)>,
    /// (Gateway, listener index) pairs it attached to, once per parent.
    pub attached: Vec<(Key, usize)>,
    pub backends: BTreeSet<BackendKey>,
    /// An HTTPRoute's generation and verdicts per parent of ours.
    pub route_status: Option<(Option<i64>, Vec<ParentState>)>,
}

impl Part {
    /// Appends entries for `host` under `listener` on `bind` (opening
    /// the port).
    pub fn push(
        &mut self,
        (bind, listener): (Bind, &Host),
        host: &Host,
        entries: impl IntoIterator<Item = Entry>,
    ) {
        self.ports.insert(bind);
        let slot = Slot {
            bind,
            listener: listener.clone(),
            host: host.clone(),
        };
        self.entries.entry(slot).or_default().extend(entries);
    }
}
