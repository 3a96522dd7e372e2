//! The trace session: the marker table and a trace listener in every
//! observed node, installed before the probe and removed when dropped
//! (whatever happened), and the events they queued.

use std::collections::BTreeMap;
use std::time::Duration;

use podnet_kernel::nftrace::{TraceEvent, TraceListener};
use podnet_kernel::Netns;
use podnet_nft::diff::diff;
use podnet_nft::model::{Family, Proto};
use podnet_nft::netlink::Conn;

use super::lock::NodeLock;
use super::{open_netns, Node};
use crate::TraceError;

struct Part {
    node: Node,
    ns: Netns,
    listener: TraceListener,
}

/// The trace tables and listeners of one probe; dropping it removes the
/// tables, then releases the nodes.
pub struct Session {
    parts: Vec<Part>,
    // Declared after `parts`: released only once the tables are gone.
    _locks: Vec<NodeLock>,
}

impl Session {
    pub fn start(nodes: &[Node], proto: Proto, sport: u16) -> Result<Session, TraceError> {
        let table = crate::plan::marker(proto, sport);
        // Locks in one global order (the namespaces' inodes), so two
        // traces over the same nodes cannot wait on each other.
        let mut observed: Vec<(u64, &Node, Netns)> = Vec::new();
        for n in nodes.iter().filter(|n| n.observed()) {
            let ns = open_netns(&n.netns)?;
            observed.push((NodeLock::ino(&ns, &n.name)?, n, ns));
        }
        observed.sort_by_key(|(ino, ..)| *ino);
        observed.dedup_by_key(|(ino, ..)| *ino);
        let mut locks = Vec::new();
        for (ino, n, _) in &observed {
            locks.push(NodeLock::acquire(*ino, &n.name)?);
        }
        let mut s = Session {
            parts: Vec::new(),
            _locks: locks,
        };
        for (_, n, ns) in observed {
            ns.run(|| -> Result<(), TraceError> {
                let mut c = Conn::open()?;
                // A table left by a trace that was killed: nobody else
                // holds this node.
                c.delete_table(Family::Inet, crate::plan::TABLE)?;
                c.apply(&table, &diff(None, &table))?;
                Ok(())
            })??;
            let listener = TraceListener::in_netns(&ns)?;
            s.parts.push(Part {
                node: n.clone(),
                ns,
                listener,
            });
        }
        Ok(s)
    }

    /// Every event queued so far, per node, in arrival order.
    pub fn drain(&mut self) -> Result<BTreeMap<String, Vec<TraceEvent>>, TraceError> {
        let mut out = BTreeMap::new();
        for p in &mut self.parts {
            p.listener.set_timeout(Some(Duration::from_millis(1)))?;
            let mut all = Vec::new();
            loop {
                let got = p.listener.recv()?;
                if got.is_empty() {
                    break;
                }
                all.extend(got);
            }
            out.insert(p.node.name.clone(), all);
        }
        Ok(out)
    }

    /// Events the kernel could not queue (receive buffer overruns).
    pub fn lost(&self) -> u64 {
        self.parts.iter().map(|p| p.listener.lost()).sum()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for p in &self.parts {
            let r = p.ns.run(|| {
                Conn::open().and_then(|mut c| c.delete_table(Family::Inet, crate::plan::TABLE))
            });
            if let Err(e) | Ok(Err(e)) = r.map(|r| r.map(|_| ())) {
                tracing::warn!(node = %p.node.name, "removing the trace table: {e}");
            }
        }
    }
}

/// Removes a trace table left in this namespace by a trace that was
/// killed (for the agent's `--cleanup`); whether there was one. A trace
/// running now is not disturbed: the node's lock is taken first.
pub fn cleanup() -> Result<bool, TraceError> {
    let ns = Netns::current()?;
    let _lock = NodeLock::acquire(NodeLock::ino(&ns, "this node")?, "this node")?;
    Ok(Conn::open()?.delete_table(Family::Inet, crate::plan::TABLE)?)
}
