//! The answer store both halves share: a name's precomputed answers
//! packed into one allocation with the name, in a table sharded by the
//! name's hash. The builder writes this format ([`Entry::pack`]) and the
//! snapshot reads it in place ([`Packed`]); keeping both sides here keeps
//! the layout in one file.

use std::sync::Arc;

/// Shards per snapshot: publishing clones only the ones a change touched.
pub(super) const SHARDS: usize = 256;

/// A fast, well-mixed hash of a lowercased wire name. The top byte picks
/// the shard, the rest indexes the table.
pub fn hash_name(b: &[u8]) -> u64 {
    let mut h: u64 = b.len() as u64;
    for chunk in b.chunks(8) {
        let mut a = [0u8; 8];
        a[..chunk.len()].copy_from_slice(chunk);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(a)).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The shard a name hash falls in.
pub(super) fn shard_of(h: u64) -> usize {
    (h >> 56) as usize % SHARDS
}

/// One precomputed answer: counts and the bytes after the question.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rrset<'a> {
    pub(super) qtype: u16,
    pub(super) an: u16,
    pub(super) ar: u16,
    pub(super) body: &'a [u8],
}

/// Everything a name answers, while being compiled.
#[derive(Debug, Default)]
pub(super) struct Entry {
    pub(super) rrsets: Vec<(u16, u16, u16, Vec<u8>)>,
    /// An ExternalName Service: a CNAME to chase for other types.
    pub(super) cname: Option<Vec<u8>>,
}

impl Entry {
    /// Packs the entry and its name into one allocation (tens of
    /// thousands of names: one block each, not five):
    /// `[name len][name][cname len][cname][count]` then per rrset
    /// `[qtype][an][ar][body len]` (u16 each) and the body.
    pub(super) fn pack(&self, name: &[u8]) -> Arc<[u8]> {
        let cname = self.cname.as_deref().unwrap_or_default();
        let size =
            3 + name.len() + cname.len() + self.rrsets.iter().map(|r| 8 + r.3.len()).sum::<usize>();
        let mut b = Vec::with_capacity(size);
        b.push(name.len() as u8);
        b.extend_from_slice(name);
        b.push(cname.len() as u8);
        b.extend_from_slice(cname);
        b.push(self.rrsets.len().min(255) as u8);
        for (t, an, ar, body) in self.rrsets.iter().take(255) {
            for v in [*t, *an, *ar, body.len() as u16] {
                b.extend_from_slice(&v.to_be_bytes());
            }
            b.extend_from_slice(body);
        }
        b.into()
    }
}

/// A packed entry, read in place.
#[derive(Clone, Copy)]
pub(super) struct Packed<'a>(pub(super) &'a [u8]);

impl<'a> Packed<'a> {
    pub(super) fn key(self) -> &'a [u8] {
        let l = self.0[0] as usize;
        &self.0[1..1 + l]
    }

    fn cname_at(self) -> usize {
        1 + self.0[0] as usize
    }

    /// An ExternalName Service: the CNAME target to chase.
    pub(super) fn cname(self) -> Option<&'a [u8]> {
        let at = self.cname_at();
        let l = self.0[at] as usize;
        (l > 0).then(|| &self.0[at + 1..at + 1 + l])
    }

    pub(super) fn rrsets(self) -> impl Iterator<Item = Rrset<'a>> {
        let b = self.0;
        let at = self.cname_at();
        let mut i = at + 1 + b[at] as usize;
        let mut left = b[i];
        i += 1;
        std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            left -= 1;
            let u = |o: usize| u16::from_be_bytes([b[i + o], b[i + o + 1]]);
            let (qtype, an, ar, len) = (u(0), u(2), u(4), u(6) as usize);
            let body = &b[i + 8..i + 8 + len];
            i += 8 + len;
            Some(Rrset {
                qtype,
                an,
                ar,
                body,
            })
        })
    }
}

/// One shard: packed entries, found by the hash of their name.
pub(super) type Table = hashbrown::HashTable<Arc<[u8]>>;
