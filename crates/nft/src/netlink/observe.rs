//! Reading the kernel's copy of a table back into the model: [`Conn::observe`]
//! (chains, rule shapes, sets with their elements, counters), so a sync
//! is observe → diff → apply and a table changed behind our back is
//! repaired by the same diff; and the narrower reads: one set's elements
//! with their comments, one element, one counter.

use std::collections::BTreeMap;

use podnet_kernel::nl::{get_str, Attrs, Msg};
use podnet_kernel::KernelError;

use super::conn::Conn;
use super::decode::{chain_of, counter_of, decode_key, elems_of, pair_bounds};
use super::layout::{elem_key_bytes, ranges, Ranges};
use super::shape::{observed_rules, set_decl, set_decl_of, shape_of, Shape};
use super::{
    msg, NFTA_DATA_VALUE, NFTA_LIST_ELEM, NFTA_SET_ELEM_KEY, NFT_MSG_GETCHAIN, NFT_MSG_GETOBJ,
    NFT_MSG_GETRULE, NFT_MSG_GETSET, NFT_MSG_GETSETELEM, NFT_OBJECT_COUNTER,
};
use crate::model::{ElemData, Family, Set, Table, Value};

impl Conn {
    /// The kernel's copy of table `want.family`/`want.name` in the model's
    /// terms, or None when it does not exist. Chains, sets, counters and
    /// elements are read as they are; a chain whose rules have the shapes of
    /// `want`'s rules is taken to hold them, any other rule shows up as an
    /// unplanned one, and a set declared otherwise than in `want` as an
    /// undeclared one, so [`crate::diff::diff`] from this to `want` is the
    /// repair. The elements of sets the kernel fills itself are not read.
    pub fn observe(&mut self, want: &Table) -> Result<Option<Table>, KernelError> {
        let (fam, name) = (want.family, want.name.as_str());
        let what = || format!("reading table {} {name}", fam.name());
        let by_table = |m: &mut Msg| {
            m.str(1, name);
        };
        let Some(used) = self.table_use(fam, name)? else {
            return Ok(None);
        };
        let mut t = Table::new(fam, name);
        // Chains one at a time by name: a chain dump lists every chain of
        // the family (the service proxy's thousands too). Only when the
        // table holds more than that (its use count covers chains, sets
        // and objects) is the whole family dumped, to find the strays.
        let mut chains = self.chains_by_name(want, &what)?;
        let sets = self
            .dump(fam, Some(name), NFT_MSG_GETSET, &by_table, &what)?
            .unwrap_or_default();
        let objs = self
            .dump(
                fam,
                Some(name),
                NFT_MSG_GETOBJ,
                &|m: &mut Msg| {
                    m.str(1, name).u32_be(3, NFT_OBJECT_COUNTER);
                },
                &what,
            )?
            .unwrap_or_default();
        if used as usize > chains.len() + sets.len() + objs.len() {
            chains = self
                .dump(fam, Some(name), NFT_MSG_GETCHAIN, &by_table, &what)?
                .unwrap_or_default();
        }
        for (cname, c) in chains.iter().filter_map(|a| chain_of(a)) {
            t.chains.insert(cname, c);
        }
        let mut shapes = self.rule_shapes(want, &what)?;
        for (cname, c) in t.chains.iter_mut() {
            let got = shapes.remove(cname).unwrap_or_default();
            c.rules = observed_rules(want, cname, &got);
        }
        for a in sets {
            if let Some((sname, set)) = self.observed_set(want, &a)? {
                t.sets.insert(sname, set);
            }
        }
        for a in objs {
            if let Some((_, v)) = Attrs::new(&a).find(|(t, _)| *t == 2) {
                t.counters.insert(get_str(v));
            }
        }
        Ok(Some(t))
    }

    /// The attributes of `want`'s chains the kernel holds, asked for one
    /// at a time by name (missing ones are skipped).
    fn chains_by_name(
        &mut self,
        want: &Table,
        what: &dyn Fn() -> String,
    ) -> Result<Vec<Vec<u8>>, KernelError> {
        let mut chains = Vec::new();
        for cname in want.chains.keys() {
            let mut m = msg(want, NFT_MSG_GETCHAIN, 0);
            m.str(1, &want.name).str(3, cname);
            match self.sock.request(m, what) {
                Ok(r) => chains.extend(
                    r.into_iter()
                        .map(|r| r.body.get(4..).unwrap_or_default().to_vec()),
                ),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(chains)
    }

    /// The shapes of the rules in table `want.name`, by chain, in order.
    fn rule_shapes(
        &mut self,
        want: &Table,
        what: &dyn Fn() -> String,
    ) -> Result<BTreeMap<String, Vec<Shape>>, KernelError> {
        let by_table = |m: &mut Msg| {
            m.str(1, &want.name);
        };
        let mut shapes: BTreeMap<String, Vec<Shape>> = BTreeMap::new();
        for a in self
            .dump(
                want.family,
                Some(&want.name),
                NFT_MSG_GETRULE,
                &by_table,
                what,
            )?
            .unwrap_or_default()
        {
            if let (Some(c), shape) = shape_of(&a) {
                shapes.entry(c).or_default().push(shape);
            }
        }
        Ok(shapes)
    }

    /// A dumped set (its attributes `a`) as observe reports it: declared as
    /// in `want`, with the kernel's elements (or `want`'s, for a set the
    /// kernel fills itself); declared otherwise, an empty undeclared set.
    /// None when it has no name or is gone by the time its elements are
    /// read.
    fn observed_set(
        &mut self,
        want: &Table,
        a: &[u8],
    ) -> Result<Option<(String, Set)>, KernelError> {
        let (Some(sname), decl) = set_decl_of(a) else {
            return Ok(None);
        };
        let set = match want.sets.get(&sname) {
            Some(w) if set_decl(w) == decl => {
                if w.kernel_filled() {
                    w.clone()
                } else {
                    match self.elements(want.family, &want.name, &sname, w)? {
                        Some(s) => s,
                        None => return Ok(None),
                    }
                }
            }
            _ => Set::new(vec![]),
        };
        Ok(Some((sname, set)))
    }

    /// Set `set` of the table as the kernel holds it: `decl`'s declaration
    /// with the kernel's elements and their comments (None when the table
    /// or the set does not exist). Keys are decoded with `decl`'s key types.
    pub fn elements(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        decl: &Set,
    ) -> Result<Option<Set>, KernelError> {
        let Some(replies) = self.dump(
            family,
            None, // element lists name their table, but the request is exact
            NFT_MSG_GETSETELEM,
            &|m: &mut Msg| {
                m.str(1, table).str(2, set);
            },
            &|| format!("reading set {set} of table {} {table}", family.name()),
        )?
        else {
            return Ok(None);
        };
        let mut out = Set {
            elements: BTreeMap::new(),
            comments: BTreeMap::new(),
            ..decl.clone()
        };
        let respell = respellings(decl);
        let mut insert = |k: Vec<Value>, data: Option<ElemData>, comment: Option<String>| {
            let k = match respell.get(&k) {
                Some(planned) => (*planned).clone(),
                None => k,
            };
            if let Some(c) = comment {
                out.comments.insert(k.clone(), c);
            }
            out.elements.insert(k, data);
        };
        // One-field ranges: each element's key, whether it closes a range,
        // its data and comment, paired once all are read.
        let one_field = ranges(decl) == Ranges::EndElement;
        let mut bounds = Vec::new();
        for e in replies.iter().flat_map(|a| elems_of(a, &decl.data)) {
            if one_field {
                bounds.push((e.key, e.interval_end, e.data, e.comment));
                continue;
            }
            if e.interval_end {
                continue;
            }
            if let Some(k) = decode_key(&decl.key, &e.key, e.end.as_deref()) {
                insert(k, e.data, e.comment);
            }
        }
        if one_field {
            for (k, data, comment) in pair_bounds(&decl.key, bounds) {
                insert(k, data, comment);
            }
        }
        Ok(Some(out))
    }

    /// Whether set `set` of table `family`/`table` holds `key` now: one
    /// exact lookup (no dump), cheap enough to poll while a set holds tens
    /// of thousands of elements (the benchmarks watch rules land this way).
    pub fn has_element(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        key: &[Value],
    ) -> Result<bool, KernelError> {
        let t = Table::new(family, table);
        let mut m = msg(&t, NFT_MSG_GETSETELEM, 0);
        m.str(1, table).str(2, set);
        m.begin(3);
        m.begin(NFTA_LIST_ELEM);
        m.begin(NFTA_SET_ELEM_KEY)
            .attr(NFTA_DATA_VALUE, &elem_key_bytes(key))
            .end();
        m.end();
        m.end();
        match self.sock.request(m, &|| {
            format!(
                "looking up an element of set {set} in {} {table}",
                family.name()
            )
        }) {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Named counter `name`'s (packets, bytes), or None when it (or its
    /// table) does not exist.
    pub fn counter(
        &mut self,
        family: Family,
        table: &str,
        name: &str,
    ) -> Result<Option<(u64, u64)>, KernelError> {
        let t = Table::new(family, table);
        let mut m = msg(&t, NFT_MSG_GETOBJ, 0);
        m.str(1, table).str(2, name).u32_be(3, NFT_OBJECT_COUNTER);
        let replies = match self.sock.request(m, &|| {
            format!("reading counter {name} of table {} {table}", family.name())
        }) {
            Ok(r) => r,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(replies
            .iter()
            .find_map(|r| counter_of(r.body.get(4..).unwrap_or_default())))
    }
}

/// The keys of interval set `decl` spelled otherwise than canonically, by
/// their canonical spelling. Ranges read back in the canonical spelling
/// (see `Value`); a key `decl` spells otherwise (a /32 `Net`, a one-port
/// range) is given back as spelled there, so observe equals the plan
/// either way.
fn respellings(decl: &Set) -> BTreeMap<Vec<Value>, &Vec<Value>> {
    if !decl.interval {
        return BTreeMap::new();
    }
    decl.elements
        .keys()
        .filter(|k| !k.iter().all(Value::is_canonical))
        .map(|k| (k.iter().map(Value::canonical).collect(), k))
        .collect()
}
