//! One table kept in the kernel by one owner across many syncs, the layer
//! every reconciling table owner shares (Felix's `Table` is the model): the
//! service proxy's `ip podnet`/`ip6 podnet` and the policy's
//! `ip podnet-policy`/`ip6 podnet-policy`, and next the gateway's and BGP's.
//!
//! The owner plans, and keeps what it applied in its own terms (Services,
//! pods); this layer does the rest, the same way for everyone:
//! - **drift**: the table's use count (its chains, sets and objects, not
//!   elements) read after every apply that can move it is what the next
//!   check expects; a count that moved
//!   means someone else changed the table, and the owner replaces it whole
//!   ([`TableSync::drifted`]);
//! - **partial sync**: the owner's changes as one batch ([`TableSync::apply`]);
//! - **full sync**: the table replaced in one transaction whose changes are
//!   produced a chunk at a time as they are encoded ([`TableSync::load`],
//!   [`TableSync::load_fresh`]), so a table of half a million elements never
//!   exists twice in memory, and established connections keep their
//!   conntrack state;
//! - **failure**: the expected use count is forgotten and the socket
//!   reopened, so the owner's next sync is full;
//! - **cleanup**: the table removed from every family ([`remove`]).
//!
//! [`Owners`] counts the owners of each element of tables whose elements
//! several owners may want (a policy's peer set holds a pod's address for
//! every local pod it allows): an element is added with its first owner and
//! removed with its last.

use std::collections::HashMap;
use std::hash::Hash;

use podnet_kernel::KernelError;

use crate::diff::{ops, Change};
use crate::model::{ElemData, Family, Table, Value};
use crate::netlink::Conn;

/// Elements per chunk of a fresh load: encoded and dropped before the next
/// is made.
pub const CHUNK: usize = 8192;

/// One table of one owner, in one family.
pub struct TableSync {
    family: Family,
    name: String,
    /// Whether the table reaches the kernel; false: planning only (tests
    /// of the pure part).
    attached: bool,
    /// The socket; None after a failure until it is reopened.
    conn: Option<Conn>,
    /// The table's use count after our last successful apply; None until
    /// the first load, and again after a failure.
    expect_use: Option<Option<u32>>,
}

impl TableSync {
    /// A table kept over a fresh nfnetlink socket.
    pub fn open(family: Family, name: &str) -> Result<TableSync, KernelError> {
        let mut t = TableSync::detached(family, name);
        t.attached = true;
        t.conn = Some(Conn::open()?);
        Ok(t)
    }

    /// A table that is planned and diffed but never reaches the kernel:
    /// every apply succeeds and nothing ever drifts.
    pub fn detached(family: Family, name: &str) -> TableSync {
        TableSync {
            family,
            name: name.to_string(),
            attached: false,
            conn: None,
            expect_use: None,
        }
    }

    /// Whether it reaches the kernel (not [`TableSync::detached`]).
    pub fn attached(&self) -> bool {
        self.attached
    }

    /// The socket, reopened if a failure closed it; None when detached.
    fn conn(&mut self) -> Result<Option<&mut Conn>, KernelError> {
        if self.attached && self.conn.is_none() {
            self.conn = Some(Conn::open()?);
        }
        Ok(self.conn.as_mut())
    }

    pub fn family(&self) -> Family {
        self.family
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The table with no content: what changes to it are encoded against
    /// when no set needs describing.
    pub fn shell(&self) -> Table {
        Table::new(self.family, &self.name)
    }

    /// Whether a load has succeeded since the last failure: until then the
    /// owner's syncs must be full.
    pub fn loaded(&self) -> bool {
        self.expect_use.is_some()
    }

    /// The table's use count now (None: the table is missing), read without
    /// its contents. A detached table reads as what is expected.
    pub fn observe_use(&mut self) -> Result<Option<u32>, KernelError> {
        let (family, name) = (self.family, self.name.clone());
        match self.conn()? {
            Some(c) => c.table_use(family, &name),
            None => Ok(self.expect_use.flatten()),
        }
    }

    /// Whether `seen` (an [`TableSync::observe_use`]) says someone else
    /// changed the table since our last apply. Before the first load
    /// nothing is expected, so nothing has drifted (the owner's sync is
    /// full anyway).
    pub fn drifted(&self, seen: Option<u32>) -> bool {
        match self.expect_use {
            Some(want) if self.attached => seen != want,
            _ => false,
        }
    }

    /// The use count the next check expects (for the warning that names
    /// a drift).
    pub fn expected_use(&self) -> Option<u32> {
        self.expect_use.flatten()
    }

    /// Reads the kernel's table back into the model, shaped by `want` (the
    /// first step of a full sync that diffs rather than replaces).
    pub fn observe(&mut self, want: &Table) -> Result<Option<Table>, KernelError> {
        match self.conn()? {
            Some(c) => c.observe(want),
            None => Ok(None),
        }
    }

    /// `changes` (encoded against `t`, which must declare the sets whose
    /// encoding depends on their flags) as one transaction: a partial
    /// sync, or a full one that diffed against the table it read back.
    /// No change sends nothing; but the first time, it still takes the
    /// table's use count as the expected one (a restarted owner that found
    /// its table as planned must notice later drift too).
    pub fn apply(&mut self, t: &Table, changes: &[Change]) -> Result<(), KernelError> {
        if ops(changes) == 0 {
            return match self.loaded() {
                true => Ok(()),
                false => self.settle(Ok(())),
            };
        }
        let r = match self.conn() {
            Ok(Some(c)) => c.apply(t, changes),
            Ok(None) => return Ok(()),
            Err(e) => Err(e),
        };
        // Elements are not counted in the table's use count: a batch of
        // element changes only leaves it as it was, unread.
        match r {
            Ok(()) if self.loaded() && changes.iter().all(is_element_change) => Ok(()),
            r => self.settle(r),
        }
    }

    /// A full sync as one transaction whose changes come in chunks:
    /// `chunk(k)` gives chunk k (None after the last), encoded and dropped
    /// at once; `redo(k)` gives it again, only to name the change the
    /// kernel refused. The first chunk of a replace is
    /// [`crate::diff::replace`] of the table's skeleton.
    pub fn load(
        &mut self,
        t: &Table,
        chunk: &mut dyn FnMut(usize) -> Option<Vec<Change>>,
        redo: &dyn Fn(usize) -> Vec<Change>,
    ) -> Result<(), KernelError> {
        let r = match self.conn() {
            Err(e) => Err(e),
            Ok(Some(c)) => c.apply_chunks(t, chunk, redo),
            Ok(None) => {
                let mut k = 0;
                while chunk(k).is_some() {
                    k += 1;
                }
                Ok(())
            }
        };
        self.settle(r)
    }

    /// A full sync of a table made anew: `head` (the skeleton's changes,
    /// usually [`crate::diff::replace`]), then `elems` (sorted by set) added
    /// [`CHUNK`] at a time.
    pub fn load_fresh<E: Element>(
        &mut self,
        t: &Table,
        head: Vec<Change>,
        elems: &[E],
    ) -> Result<(), KernelError> {
        let mut head = Some(head);
        let chunks = |k: usize| elems.chunks(CHUNK).nth(k - 1).map(additions);
        self.load(
            t,
            &mut |k| match k {
                0 => head.take(),
                k => chunks(k),
            },
            &|k| chunks(k.max(1)).unwrap_or_default(),
        )
    }

    /// Takes an apply's outcome: on success the use count it left is what
    /// the next check expects; on failure nothing is expected (the owner's
    /// next sync is full) and the socket is reopened, since a failed
    /// batch may leave unread replies on it.
    fn settle(&mut self, r: Result<(), KernelError>) -> Result<(), KernelError> {
        let r = r.and_then(|()| self.observe_use());
        match r {
            Ok(u) => {
                self.expect_use = Some(u);
                Ok(())
            }
            Err(e) => {
                self.forget();
                Err(e)
            }
        }
    }

    /// Forgets what the kernel holds (after a failure, or when the owner
    /// replans from scratch): the next sync must be full, on a new socket.
    pub fn forget(&mut self) {
        self.expect_use = None;
        self.conn = None;
    }
}

fn is_element_change(c: &Change) -> bool {
    matches!(
        c,
        Change::AddElems { .. } | Change::AddCommented { .. } | Change::DelElems { .. }
    )
}

/// Removes table `name` from each of `families` (missing is fine); returns
/// the ones removed, as "family name".
pub fn remove(families: &[Family], name: &str) -> Result<Vec<String>, KernelError> {
    let mut c = Conn::open()?;
    let mut gone = Vec::new();
    for &fam in families {
        if c.delete_table(fam, name)? {
            gone.push(format!("{} {name}", fam.name()));
        }
    }
    Ok(gone)
}

/// A set element as an owner keeps it, turned into the model's terms only
/// when it is sent.
pub trait Element {
    fn set_name(&self) -> String;
    fn key(&self) -> Vec<Value>;
    fn data(&self) -> Option<ElemData>;
}

/// The changes adding `elems` (sorted by set): one message per set.
pub fn additions<E: Element>(elems: &[E]) -> Vec<Change> {
    let mut out: Vec<Change> = Vec::new();
    for e in elems {
        let name = e.set_name();
        match out.last_mut() {
            Some(Change::AddElems { set, elems }) if *set == name => {
                elems.push((e.key(), e.data()))
            }
            _ => out.push(Change::AddElems {
                set: name,
                elems: vec![(e.key(), e.data())],
            }),
        }
    }
    out
}

/// The same additions with every element addition moved behind the rest
/// and merged per set (first-seen order), so a chunk of many owners' parts
/// sends one message per set instead of one per owner. Valid for changes
/// that only add: the sets and chains an element refers to are then
/// created first.
pub fn elements_last(changes: Vec<Change>) -> Vec<Change> {
    type Elems = Vec<(Vec<Value>, Option<ElemData>)>;
    let mut rest = Vec::with_capacity(changes.len());
    let mut elems: Vec<(String, Elems)> = Vec::new();
    for c in changes {
        match c {
            Change::AddElems { set, elems: e } => match elems.iter_mut().find(|(s, _)| *s == set) {
                Some((_, v)) => v.extend(e),
                None => elems.push((set, e)),
            },
            c => rest.push(c),
        }
    }
    rest.extend(
        elems
            .into_iter()
            .map(|(set, elems)| Change::AddElems { set, elems }),
    );
    rest
}

/// Which owners hold each element, as applied.
pub struct Owners<K, E> {
    applied: HashMap<K, Vec<E>>,
    refs: HashMap<E, u32>,
}

impl<K, E> Default for Owners<K, E> {
    fn default() -> Self {
        Owners {
            applied: HashMap::new(),
            refs: HashMap::new(),
        }
    }
}

/// What recording an owner's new elements did to one element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Its first owner: it is in the table now.
    Gained,
    /// Its last owner let go: it left the table.
    Lost,
}

impl<K: Hash + Eq, E: Hash + Eq + Copy> Owners<K, E> {
    pub fn clear(&mut self) {
        self.applied.clear();
        self.refs.clear();
    }

    /// Every element held (by at least one owner).
    pub fn elements(&self) -> impl Iterator<Item = &E> {
        self.refs.keys()
    }

    /// Takes each owner's new elements as applied (an empty list lets go
    /// of all of them); `seen` hears of every element that entered or
    /// left the table.
    pub fn record(&mut self, owned: Vec<(K, Vec<E>)>, mut seen: impl FnMut(&E, Held)) {
        for (k, new) in owned {
            for e in self.applied.remove(&k).into_iter().flatten() {
                if let Some(n) = self.refs.get_mut(&e) {
                    *n -= 1;
                    if *n == 0 {
                        self.refs.remove(&e);
                        seen(&e, Held::Lost);
                    }
                }
            }
            for e in &new {
                let n = self.refs.entry(*e).or_insert(0);
                if *n == 0 {
                    seen(e, Held::Gained);
                }
                *n += 1;
            }
            if !new.is_empty() {
                self.applied.insert(k, new);
            }
        }
    }

    /// What recording `new` would add to the table (elements gaining their
    /// first owner) and remove from it (elements losing their last): the
    /// element changes of a partial sync. Pure; unordered.
    pub fn changes<'a>(&'a self, new: &'a [(K, Vec<E>)]) -> (Vec<&'a E>, Vec<&'a E>) {
        let mut delta: HashMap<&E, i64> = HashMap::new();
        for (k, n) in new {
            for e in self.applied.get(k).into_iter().flatten() {
                *delta.entry(e).or_insert(0) -= 1;
            }
            for e in n {
                *delta.entry(e).or_insert(0) += 1;
            }
        }
        let (mut adds, mut dels) = (Vec::new(), Vec::new());
        for (e, d) in delta {
            let before = self.refs.get(e).copied().unwrap_or(0) as i64;
            let after = before + d;
            if before == 0 && after > 0 {
                adds.push(e);
            } else if before > 0 && after <= 0 {
                dels.push(e);
            }
        }
        (adds, dels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
    struct E(&'static str, u32);

    impl Element for E {
        fn set_name(&self) -> String {
            self.0.to_string()
        }
        fn key(&self) -> Vec<Value> {
            vec![Value::U32(self.1)]
        }
        fn data(&self) -> Option<ElemData> {
            None
        }
    }

    fn sorted(v: Vec<&E>) -> Vec<E> {
        let mut v: Vec<E> = v.into_iter().copied().collect();
        v.sort();
        v
    }

    #[test]
    fn an_element_enters_with_its_first_owner_and_leaves_with_its_last() {
        let mut o: Owners<&str, E> = Owners::default();
        let mut log = Vec::new();
        let new = vec![("a", vec![E("s", 1), E("s", 2)]), ("b", vec![E("s", 2)])];
        let (adds, dels) = o.changes(&new);
        assert_eq!(sorted(adds), vec![E("s", 1), E("s", 2)]);
        assert!(dels.is_empty());
        o.record(new, |e, h| log.push((*e, h)));
        assert_eq!(log.len(), 2);
        assert!(log.iter().all(|(_, h)| *h == Held::Gained));
        // "a" lets go of both: 2 is still b's.
        let next = vec![("a", vec![])];
        assert_eq!(o.changes(&next), (vec![], vec![&E("s", 1)]));
        log.clear();
        o.record(next, |e, h| log.push((*e, h)));
        assert_eq!(log, vec![(E("s", 1), Held::Lost)]);
        assert_eq!(o.elements().copied().collect::<Vec<_>>(), vec![E("s", 2)]);
        // An owner moving its element to another is no change for 2.
        let moved = vec![("b", vec![E("s", 3)]), ("a", vec![E("s", 2)])];
        assert_eq!(o.changes(&moved), (vec![&E("s", 3)], vec![]));
    }

    #[test]
    fn additions_send_one_message_per_set() {
        let c = additions(&[E("a", 1), E("a", 2), E("b", 3)]);
        assert_eq!(c.len(), 2);
        assert_eq!(ops(&c), 3);
    }

    #[test]
    fn a_full_sync_chunk_creates_before_it_fills_and_merges_elements_per_set() {
        let e = |s: &str, v: u32| Change::AddElems {
            set: s.into(),
            elems: vec![(vec![Value::U32(v)], None)],
        };
        let chain = |n: &str| Change::AddChain {
            name: n.into(),
            base: None,
        };
        let got = elements_last(vec![
            e("a", 1),
            chain("x"),
            e("b", 2),
            e("a", 3),
            chain("y"),
        ]);
        let want = vec![
            chain("x"),
            chain("y"),
            Change::AddElems {
                set: "a".into(),
                elems: vec![(vec![Value::U32(1)], None), (vec![Value::U32(3)], None)],
            },
            e("b", 2),
        ];
        assert_eq!(got, want);
        assert_eq!(ops(&got), 5);
    }

    #[test]
    fn a_detached_table_loads_every_chunk_and_never_drifts() {
        let mut t = TableSync::detached(Family::Ip, "pn-test");
        assert!(!t.loaded());
        let elems: Vec<E> = (0..(CHUNK as u32 * 2 + 1)).map(|i| E("s", i)).collect();
        t.load_fresh(&t.shell(), crate::diff::replace(&t.shell()), &elems)
            .unwrap();
        assert!(t.loaded());
        assert!(!t.drifted(Some(99)));
        t.forget();
        assert!(!t.loaded());
    }
}
