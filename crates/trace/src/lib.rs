//! `podnet trace SRC DST:PORT`: one real probe, and every hop the kernel
//! took for it, from the kernel's own evidence.
//!
//! The layout follows the rest of podnet: [`plan`] is the trace table
//! (pure), [`hops`] turns evidence into hops (pure, unit-tested), and
//! [`collect`] and [`probe`] are the thin edges that install the table,
//! listen for nftables trace events in every node, send the probe and do
//! the route, neighbour, FDB and conntrack lookups. The pure evaluators
//! (the proxy's tracer, the policy evaluator) come in through
//! [`collect::Oracles`], so this crate depends on neither, and a hop shows
//! where they disagree with the kernel.

pub mod collect;
pub mod flows;
pub mod hops;
pub mod plan;
pub mod probe;
#[cfg(test)]
mod testdata;

use serde::Serialize;

pub use hops::{Hop, HopKind};
pub use probe::Outcome;

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(transparent)]
    Kernel(#[from] podnet_kernel::KernelError),
    #[error("{0}")]
    Msg(String),
}

/// A finished trace.
#[derive(Debug, Clone, Serialize)]
pub struct Trace {
    pub src: String,
    pub dst: String,
    pub proto: String,
    /// The probe's source port (what the trace table matched).
    pub sport: u16,
    pub outcome: Outcome,
    pub hops: Vec<Hop>,
    /// Trace events the kernel could not queue; the hops may miss some.
    pub lost_events: u64,
    /// Nodes the packet went through that this trace could not see (on a
    /// real node, every other machine): their rules and policy are not in
    /// the hops, though delivery or its failure is.
    pub unobserved: Vec<String>,
}

impl Trace {
    /// The human-readable form: one line per hop, in order.
    pub fn text(&self) -> String {
        let mut s = format!(
            "trace {} -> {} {}, source port {}: {}\n",
            self.src,
            self.dst,
            self.proto,
            self.sport,
            self.outcome.text()
        );
        for (i, h) in self.hops.iter().enumerate() {
            s.push_str(&format!("{:>3}. [{}] {}\n", i + 1, h.at, h.summary));
            if let Some(d) = &h.disagreement {
                s.push_str(&format!("     !! DISAGREES: {d}\n"));
            }
        }
        for n in &self.unobserved {
            s.push_str(&format!(
                "note: node {n} is another machine; its rules are not traced from here\n"
            ));
        }
        if self.lost_events > 0 {
            s.push_str(&format!(
                "warning: {} trace event batches were lost; hops may be missing\n",
                self.lost_events
            ));
        }
        s
    }
}
