//! The anti-spoofing guard ([`crate::guard`]) on the reconcile loop: its
//! view is the node's pod ports as the CNI ADDs recorded them, and every
//! sync plans the whole (small: four elements a pod) table, reads the
//! kernel's, and applies the difference as one batch, so a deleted table
//! or element is put back at the next resync.
//!
//! The facts reach it two ways. The `podnet` CNI plugin writes one record
//! per attachment under [`records_dir`] (beside the subnet file, on the
//! node's tmpfs, so a reboot, which takes the veths with it, takes the
//! records too) before it tells the agent, and removes it at DEL; the
//! agent reads them all when it starts. While the agent runs, the ADD's
//! request on the agent socket ([`crate::hint`]) carries the same facts
//! and is answered once the port's elements are in the kernel.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use podnet_nft::diff::{self, Change};
use podnet_nft::model::{Family, Table};
use podnet_nft::sync::TableSync;
use podnet_reconcile::{Scope, Subsystem, SyncError};
use serde::{Deserialize, Serialize};

use crate::dataplane::Ack;
use crate::guard::{self, Port};

/// An attachment's id: its container ID, with `@<ifname>` when the
/// interface is not `eth0` (the record's file name). Keyed by attachment,
/// not by pod, so a pod's new sandbox and its old one's DEL, in either
/// order, leave the new one's port.
pub type Attachment = String;

/// The records' directory beside `file`: the node's subnet file, or the
/// agent socket beside it.
pub fn records_dir(file: &Path) -> PathBuf {
    file.parent()
        .unwrap_or(Path::new("/run/podnet"))
        .join("guard")
}

/// One attachment's record, as the CNI plugin writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub namespace: String,
    pub name: String,
    #[serde(flatten)]
    pub port: Port,
}

/// Every record under `dir` (unreadable ones are logged and skipped).
pub fn read_records(dir: &Path) -> BTreeMap<Attachment, Port> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for ent in rd.flatten() {
        let path = ent.path();
        match std::fs::read(&path).map(|b| serde_json::from_slice::<Record>(&b)) {
            Ok(Ok(r)) => {
                let id = ent.file_name().to_string_lossy().into_owned();
                out.insert(id, r.port);
            }
            Ok(Err(e)) => tracing::warn!(record = %path.display(), "guard record: {e}"),
            Err(e) => tracing::warn!(record = %path.display(), "guard record: {e}"),
        }
    }
    out
}

/// What the guard loop is fed: a pod's port (none: the pod is gone), and
/// the ADD waiting for it.
pub struct GuardInput {
    pub key: Attachment,
    pub port: Option<Port>,
    pub ack: Option<Ack>,
}

/// The guard's loop state.
pub struct GuardPlane {
    ipv6: bool,
    ports: BTreeMap<Attachment, Port>,
    table: TableSync,
    waiters: Vec<(Attachment, Ack)>,
}

impl GuardPlane {
    /// A plane with a kernel connection, starting from `ports` (the
    /// records).
    pub fn new(ipv6: bool, ports: BTreeMap<Attachment, Port>) -> Result<GuardPlane, SyncError> {
        let mut g = GuardPlane::detached(ipv6, ports);
        g.table = TableSync::open(Family::Bridge, guard::TABLE)?;
        Ok(g)
    }

    /// Plan and diff only (tests).
    pub fn detached(ipv6: bool, ports: BTreeMap<Attachment, Port>) -> GuardPlane {
        GuardPlane {
            ipv6,
            ports,
            table: TableSync::detached(Family::Bridge, guard::TABLE),
            waiters: Vec::new(),
        }
    }
}

impl Subsystem for GuardPlane {
    type Input = GuardInput;
    type Key = Attachment;
    type Plan = Table;
    type Observed = Option<Table>;
    type Changes = (Table, Vec<Change>);

    fn name(&self) -> &'static str {
        "guard"
    }

    fn watch(&mut self, input: GuardInput, dirty: &mut BTreeSet<Attachment>) {
        let GuardInput { key, port, ack } = input;
        match port {
            Some(p) => self.ports.insert(key.clone(), p),
            None => self.ports.remove(&key),
        };
        if let Some(a) = ack {
            self.waiters.push((key.clone(), a));
        }
        dirty.insert(key);
    }

    fn plan(&self, _scope: &Scope<Attachment>) -> Table {
        guard::table(self.ipv6, self.ports.values())
    }

    fn observe(&mut self, _scope: &Scope<Attachment>) -> Result<Option<Table>, SyncError> {
        Ok(self.table.observe(&guard::skeleton(self.ipv6))?)
    }

    fn diff(&self, plan: Table, observed: Option<Table>) -> (Table, Vec<Change>) {
        let ch = diff::diff(observed.as_ref(), &plan);
        (plan, ch)
    }

    fn apply(&mut self, (t, ch): (Table, Vec<Change>)) -> Result<usize, SyncError> {
        self.table.apply(&t, &ch)?;
        Ok(diff::ops(&ch))
    }

    fn synced(&mut self, _scope: &Scope<Attachment>, ok: bool) {
        if !ok {
            return;
        }
        for (k, ack) in self.waiters.drain(..) {
            tracing::debug!(attachment = %k, "port guarded; answering the CNI plugin");
            let _ = ack.send(Ok(()));
        }
    }
}

/// Removes the guard's table (for `--cleanup`); the one removed.
pub fn cleanup() -> Result<Vec<String>, SyncError> {
    Ok(podnet_nft::sync::remove(&[Family::Bridge], guard::TABLE)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use podnet_reconcile::sync;

    fn port(n: u8) -> Port {
        Port {
            port: format!("veth{n}"),
            mac: [2, 0, 0, 0, 0, n],
            ips: vec![format!("10.244.1.{n}").parse().unwrap()],
        }
    }

    #[test]
    fn records_read_back_and_a_bad_one_is_skipped() {
        let d = tempfile::tempdir().unwrap();
        let r = Record {
            namespace: "x".into(),
            name: "a".into(),
            port: port(2),
        };
        std::fs::write(d.path().join("c1"), serde_json::to_vec(&r).unwrap()).unwrap();
        std::fs::write(d.path().join("c2"), b"{").unwrap();
        let got = read_records(d.path());
        assert_eq!(got, [("c1".to_string(), port(2))].into_iter().collect());
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("\"port\":\"veth2\""), "{text}");
    }

    #[test]
    fn a_port_comes_and_goes_as_elements() {
        let mut g = GuardPlane::detached(false, BTreeMap::new());
        let mut dirty = BTreeSet::new();
        g.watch(
            GuardInput {
                key: "c1".into(),
                port: Some(port(2)),
                ack: None,
            },
            &mut dirty,
        );
        let t = g.plan(&Scope::Full);
        assert_eq!(t.sets["port-mac"].elements.len(), 1);
        assert_eq!(t.sets["port-arp"].elements.len(), 1);
        // Against the same table: nothing to do.
        let (_, ch) = g.diff(t.clone(), Some(t));
        assert_eq!(diff::ops(&ch), 0);
        g.watch(
            GuardInput {
                key: "c1".into(),
                port: None,
                ack: None,
            },
            &mut dirty,
        );
        assert!(sync(&mut g, &Scope::Full).unwrap() > 0);
        assert!(g.plan(&Scope::Full).sets["port-mac"].elements.is_empty());
    }

    /// The kernel takes the table, and reads it back as planned: a second
    /// sync is 0 operations; a deleted table is put back.
    #[test]
    fn the_kernel_holds_the_table_as_planned() {
        podnet_testkit::require_root();
        let ns = podnet_testkit::TestNs::new("guard");
        ns.run(|| {
            let ports = [("c1".to_string(), port(2)), ("c2".to_string(), port(4))];
            for ipv6 in [false, true] {
                let mut g = GuardPlane::new(ipv6, ports.clone().into_iter().collect()).unwrap();
                assert!(sync(&mut g, &Scope::Full).unwrap() > 0);
                assert_eq!(sync(&mut g, &Scope::Full).unwrap(), 0, "ipv6 {ipv6}");
                assert_eq!(cleanup().unwrap().len(), 1);
                assert!(sync(&mut g, &Scope::Full).unwrap() > 0);
                assert_eq!(cleanup().unwrap().len(), 1);
            }
        });
    }
}
