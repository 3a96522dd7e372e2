//! The nfnetlink socket ([`Conn`]) and what it does as transactions:
//! applying a change list as one batch (all or nothing), deleting a
//! table, and the cheap reads the others build on (a table's use count,
//! dumps, every rule's place for trace events). Reading a table back into
//! the model is `observe`.

use std::collections::BTreeMap;

use podnet_kernel::nl::{get_str, Attrs, Msg, Socket, NLM_F_DUMP};
use podnet_kernel::KernelError;

use super::encode::{describe, encode_each};
use super::layout::comment_from_udata;
use super::{
    family_num, msg, NETLINK_NETFILTER, NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END,
    NFNL_SUBSYS_NFTABLES, NFT_MSG_DELTABLE, NFT_MSG_GETRULE, NFT_MSG_GETTABLE,
};
use crate::diff::Change;
use crate::model::{Family, Table};

/// Where a rule sits, as [`Conn::rule_refs`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRef {
    /// `nfgen_family`: 1 inet, 2 ip, 10 ip6, 7 bridge, 5 netdev.
    pub family: u8,
    pub table: String,
    pub chain: String,
    pub handle: u64,
    /// Its position in its chain, from 0.
    pub index: usize,
    pub comment: Option<String>,
}

/// An nfnetlink socket for applying batches (reuse it: opening costs).
pub struct Conn {
    pub(super) sock: Socket,
}

impl Conn {
    /// Opens an nfnetlink socket.
    pub fn open() -> Result<Conn, KernelError> {
        Ok(Conn {
            sock: Socket::open(NETLINK_NETFILTER)
                .map_err(|e| KernelError::io("opening nfnetlink socket", e))?,
        })
    }

    /// Applies the changes as one transaction.
    pub fn apply(&mut self, t: &Table, changes: &[Change]) -> Result<(), KernelError> {
        if changes.is_empty() {
            return Ok(());
        }
        // One chunk (a copy: partial syncs are small).
        self.apply_chunks(t, &mut |k| (k == 0).then(|| changes.to_vec()), &|_| {
            changes.to_vec()
        })
    }

    /// Applies one transaction whose changes come in chunks: `chunk(k)`
    /// gives chunk k (None after the last), which is encoded onto the wire
    /// buffer and dropped at once, so a full replace of a large table never
    /// holds its change list. `redo(k)` must give chunk k again; it is
    /// called only to name the change that failed.
    pub fn apply_chunks(
        &mut self,
        t: &Table,
        chunk: &mut dyn FnMut(usize) -> Option<Vec<Change>>,
        redo: &dyn Fn(usize) -> Vec<Change>,
    ) -> Result<(), KernelError> {
        // Message i of the batch came from index[i - 1] (0 is BEGIN).
        let index = std::cell::RefCell::new(Vec::<(u32, u32, u32)>::new());
        self.sock.batch_with(
            &mut |push| {
                push(batch_mark(NFNL_MSG_BATCH_BEGIN));
                let mut k = 0;
                while let Some(changes) = chunk(k) {
                    encode_each(t, &changes, &mut |m, ci, sub| {
                        index.borrow_mut().push((k as u32, ci as u32, sub as u32));
                        push(m);
                    });
                    k += 1;
                }
                push(batch_mark(NFNL_MSG_BATCH_END));
            },
            &|i| {
                i.checked_sub(1)
                    .and_then(|i| index.borrow().get(i).copied())
                    .and_then(|(k, ci, sub)| {
                        let changes = redo(k as usize);
                        changes
                            .get(ci as usize)
                            .map(|c| describe(t, c, sub as usize))
                    })
                    .unwrap_or_else(|| "nf_tables batch".into())
            },
        )
    }

    /// The table's use count (its chains, sets and objects), or None when
    /// it does not exist: a cheap way to notice that someone else deleted
    /// the table or part of it, without reading its contents.
    pub fn table_use(&mut self, family: Family, name: &str) -> Result<Option<u32>, KernelError> {
        const NFTA_TABLE_USE: u16 = 3;
        let t = Table::new(family, name);
        let mut m = msg(&t, NFT_MSG_GETTABLE, 0);
        m.str(1, name);
        let replies = match self
            .sock
            .request(m, &|| format!("reading table {} {name}", family.name()))
        {
            Ok(r) => r,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        for r in replies {
            let attrs = r.body.get(4..).unwrap_or_default();
            for (ty, v) in Attrs::new(attrs) {
                if ty == NFTA_TABLE_USE && v.len() >= 4 {
                    return Ok(Some(u32::from_be_bytes([v[0], v[1], v[2], v[3]])));
                }
            }
        }
        Ok(Some(0))
    }

    /// Sends a dump request and returns each reply's attributes (after the
    /// nfgenmsg header); `Ok(None)` when the table (or set) is missing.
    pub(super) fn dump(
        &mut self,
        family: Family,
        table: Option<&str>,
        cmd: u16,
        attrs: &dyn Fn(&mut Msg),
        what: &dyn Fn() -> String,
    ) -> Result<Option<Vec<Vec<u8>>>, KernelError> {
        let mut m = Msg::new((NFNL_SUBSYS_NFTABLES << 8) | cmd, NLM_F_DUMP);
        m.raw(&[family_num(family), 0, 0, 0]);
        attrs(&mut m);
        match self.sock.request(m, what) {
            // Some dumps (chains) list every table of the family whatever
            // the filter says: keep the table asked for (attribute 1 is
            // the table name in chain, rule, set and object messages).
            Ok(r) => Ok(Some(
                r.into_iter()
                    .map(|r| r.body.get(4..).unwrap_or_default().to_vec())
                    .filter(|a| {
                        table
                            .is_none_or(|t| Attrs::new(a).any(|(ty, v)| ty == 1 && get_str(v) == t))
                    })
                    .collect(),
            )),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every rule of every table in the namespace, in chain order: what a
    /// trace event's (table, chain, handle) refers to. For a table of ours
    /// the rule's place in its chain is its place in the plan.
    pub fn rule_refs(&mut self) -> Result<Vec<RuleRef>, KernelError> {
        let mut m = Msg::new((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETRULE, NLM_F_DUMP);
        m.raw(&[0, 0, 0, 0]); // every family
        let replies = self.sock.request(m, &|| "listing nftables rules".into())?;
        let mut out: Vec<RuleRef> = Vec::new();
        let mut seen: BTreeMap<(u8, String, String), usize> = BTreeMap::new();
        for r in replies {
            let Some(&family) = r.body.first() else {
                continue;
            };
            let mut rr = RuleRef {
                family,
                table: String::new(),
                chain: String::new(),
                handle: 0,
                index: 0,
                comment: None,
            };
            for (ty, v) in Attrs::new(r.body.get(4..).unwrap_or_default()) {
                match ty {
                    1 => rr.table = get_str(v),
                    2 => rr.chain = get_str(v),
                    3 if v.len() >= 8 => {
                        rr.handle = u64::from_be_bytes(v[..8].try_into().unwrap_or_default())
                    }
                    7 => rr.comment = comment_from_udata(v),
                    _ => {}
                }
            }
            let next = seen
                .entry((family, rr.table.clone(), rr.chain.clone()))
                .or_insert(0);
            rr.index = *next;
            *next += 1;
            out.push(rr);
        }
        Ok(out)
    }

    /// Brings the kernel's table to `want` (observe, diff, apply in one
    /// transaction) and returns the changes it took: none when the kernel
    /// already held `want`.
    pub fn sync(&mut self, want: &Table) -> Result<Vec<Change>, KernelError> {
        let have = self.observe(want)?;
        let changes = crate::diff::diff(have.as_ref(), want);
        self.apply(want, &changes)?;
        Ok(changes)
    }

    /// Deletes a whole table (missing is fine).
    pub fn delete_table(&mut self, family: Family, name: &str) -> Result<bool, KernelError> {
        let t = Table::new(family, name);
        let mut m = msg(&t, NFT_MSG_DELTABLE, 0);
        m.str(1, name);
        let batch = vec![
            batch_mark(NFNL_MSG_BATCH_BEGIN),
            m,
            batch_mark(NFNL_MSG_BATCH_END),
        ];
        match self
            .sock
            .batch(batch, &|_| format!("deleting table {name}"))
        {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// A batch's BEGIN or END message (`ty`), for the nf_tables subsystem.
fn batch_mark(ty: u16) -> Msg {
    let mut m = Msg::new(ty, 0);
    m.raw(&[0, 0, 0, NFNL_SUBSYS_NFTABLES as u8]);
    m
}
