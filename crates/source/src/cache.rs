//! What a source has delivered, per object: its key and a fingerprint of
//! its resourceVersion, nothing else. That is enough to turn a watch event
//! into the right delta (Added or Updated, or nothing for a repeat) and,
//! after a gap, to turn a fresh list into the difference against what
//! consumers already have (flannel's lesson, kube-runtime's reflector):
//! the objects themselves stay with the consumers that need them.
//!
//! Memory layout matters here. The cache lives as long as the process and
//! is filled while a list's objects are decoded and dropped around it; a
//! small allocation per entry would sit between those freed objects and
//! pin their pages (measured: 15 MB of a DNS server's RSS at 10,000
//! Services). So every key is written back to back into one byte buffer
//! and the table holds fixed-size entries: two allocations in all,
//! whatever the number of objects.

use std::collections::BTreeSet;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;
use podnet_api::{Kind, Object};

use crate::{Delta, ObjectKey};

/// One delivered object.
struct Entry {
    hash: u64,
    /// Its key's bytes in [`Cache::text`].
    off: u32,
    len: u32,
    kind: Kind,
    /// A fingerprint of the resourceVersion last delivered (0: none).
    version: u64,
    /// The relist generation that last saw it.
    seen: u32,
}

#[derive(Default)]
pub struct Cache {
    table: HashTable<Entry>,
    /// Every key as `Kind/namespace/name`, back to back.
    text: Vec<u8>,
    /// Bytes of `text` no entry uses any more.
    dead: usize,
    state: std::collections::hash_map::RandomState,
    /// The relist in progress: its generation, per kind.
    relisting: Vec<(Kind, u32)>,
    generation: u32,
}

fn key_bytes(k: &ObjectKey) -> Vec<u8> {
    format!(
        "{}/{}/{}",
        k.kind.name(),
        k.namespace.as_deref().unwrap_or_default(),
        k.name
    )
    .into_bytes()
}

fn parse_key(kind: Kind, b: &[u8]) -> ObjectKey {
    let s = String::from_utf8_lossy(b);
    let mut parts = s.splitn(3, '/');
    let _kind = parts.next();
    let ns = parts.next().unwrap_or_default();
    let name = parts.next().unwrap_or_default();
    ObjectKey {
        kind,
        namespace: (!ns.is_empty()).then(|| ns.to_string()),
        name: name.to_string(),
    }
}

impl Cache {
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    fn hash_of(&self, b: &[u8]) -> u64 {
        self.state.hash_one(b)
    }

    fn version_of(&self, o: &Object) -> u64 {
        match o.meta().resource_version.as_deref() {
            None | Some("") => 0,
            Some(v) => self.hash_of(v.as_bytes()) | 1,
        }
    }

    /// Records `o` as delivered (seen by `generation`); returns whether it
    /// is new, and the version it had before.
    fn record(&mut self, o: &Object, generation: u32) -> (bool, u64) {
        let key = key_bytes(&ObjectKey::of(o));
        let hash = self.hash_of(&key);
        let version = self.version_of(o);
        let text = &self.text;
        let same =
            |e: &Entry| e.hash == hash && text[e.off as usize..][..e.len as usize] == key[..];
        if let Some(e) = self.table.find_mut(hash, same) {
            let before = e.version;
            e.version = version;
            e.seen = generation;
            return (false, before);
        }
        let off = self.text.len() as u32;
        self.text.extend_from_slice(&key);
        self.table.insert_unique(
            hash,
            Entry {
                hash,
                off,
                len: key.len() as u32,
                kind: o.kind(),
                version,
                seen: generation,
            },
            |e| e.hash,
        );
        (true, 0)
    }

    fn generation_of(&self, kind: Kind) -> u32 {
        self.relisting
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, g)| *g)
            .unwrap_or(0)
    }

    /// A watch saw `o` created or changed: Added or Updated, or nothing if
    /// this version was already delivered (a watch that restarted from an
    /// older revision repeats events).
    pub fn put(&mut self, o: Object) -> Option<Delta> {
        let g = self.generation_of(o.kind());
        let (new, before) = self.record(&o, g);
        let now = self.version_of(&o);
        if new {
            Some(Delta::Added(Arc::new(o)))
        } else if before == now && now != 0 {
            None
        } else {
            Some(Delta::Updated(Arc::new(o)))
        }
    }

    /// A watch saw the object deleted: Deleted, or nothing if it was never
    /// delivered.
    pub fn delete(&mut self, key: ObjectKey) -> Option<Delta> {
        let b = key_bytes(&key);
        let hash = self.hash_of(&b);
        let text = &self.text;
        let same = |e: &Entry| e.hash == hash && text[e.off as usize..][..e.len as usize] == b[..];
        let e = self.table.find_entry(hash, same).ok()?;
        let (gone, _) = e.remove();
        self.dead += gone.len as usize;
        self.compact();
        Some(Delta::Deleted(key))
    }

    /// Rewrites the key buffer once most of it is dead.
    fn compact(&mut self) {
        if self.dead < 64 << 10 || self.dead * 2 < self.text.len() {
            return;
        }
        let mut text = Vec::with_capacity(self.text.len() - self.dead);
        for e in self.table.iter_mut() {
            let (off, len) = (e.off as usize, e.len as usize);
            e.off = text.len() as u32;
            text.extend_from_slice(&self.text[off..off + len]);
        }
        self.text = text;
        self.dead = 0;
    }

    /// Starts relisting `kind`: objects come one by one through
    /// [`Cache::relisted`], then [`Cache::end_relist`] names what vanished.
    /// The list is never held whole, so a relist costs one chunk of
    /// decoded objects at a time.
    pub fn begin_relist(&mut self, kind: Kind) {
        self.generation = self.generation.wrapping_add(1).max(1);
        let g = self.generation;
        self.relisting.retain(|(k, _)| *k != kind);
        self.relisting.push((kind, g));
    }

    /// One object of a relist in progress: Added, Updated or nothing.
    pub fn relisted(&mut self, o: Object) -> Option<Delta> {
        self.put(o)
    }

    /// The end of `kind`'s relist: every object of the kind not listed is
    /// gone.
    pub fn end_relist(&mut self, kind: Kind) -> Vec<Delta> {
        let g = self.generation_of(kind);
        self.relisting.retain(|(k, _)| *k != kind);
        let mut gone = Vec::new();
        let mut dead = 0;
        let text = &self.text;
        self.table.retain(|e| {
            if e.kind != kind || e.seen == g {
                return true;
            }
            gone.push(parse_key(kind, &text[e.off as usize..][..e.len as usize]));
            dead += e.len as usize;
            false
        });
        self.dead += dead;
        self.compact();
        gone.into_iter().map(Delta::Deleted).collect()
    }

    /// Every key delivered, for tests.
    pub fn keys(&self) -> BTreeSet<ObjectKey> {
        self.table
            .iter()
            .map(|e| parse_key(e.kind, &self.text[e.off as usize..][..e.len as usize]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podnet_api::k8s_openapi::api::core::v1::{Node, Service};
    use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn svc(name: &str, rv: &str) -> Object {
        Object::Service(Box::new(Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        }))
    }

    fn node(name: &str, rv: &str) -> Object {
        Object::Node(Box::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        }))
    }

    fn names(ds: &[Delta]) -> Vec<String> {
        ds.iter()
            .map(|d| match d {
                Delta::Added(o) => format!("+{}", o.name()),
                Delta::Updated(o) => format!("~{}", o.name()),
                Delta::Deleted(k) => format!("-{}", k.name),
            })
            .collect()
    }

    #[test]
    fn watch_events_become_added_updated_or_nothing() {
        let mut c = Cache::default();
        assert!(matches!(c.put(svc("a", "1")), Some(Delta::Added(_))));
        assert!(
            c.put(svc("a", "1")).is_none(),
            "a repeated version is no change"
        );
        assert!(matches!(c.put(svc("a", "2")), Some(Delta::Updated(_))));
        assert!(matches!(
            c.delete(ObjectKey::of(&svc("a", "2"))),
            Some(Delta::Deleted(_))
        ));
        assert!(c.delete(ObjectKey::of(&svc("a", "2"))).is_none());
        assert!(c.is_empty());
    }

    #[test]
    fn a_relist_after_a_gap_yields_only_the_difference() {
        let mut c = Cache::default();
        for o in [
            svc("keep", "1"),
            svc("change", "1"),
            svc("vanish", "1"),
            node("n1", "1"),
        ] {
            c.put(o);
        }
        c.begin_relist(Kind::Service);
        let mut d: Vec<Delta> = [svc("keep", "1"), svc("change", "5"), svc("new", "6")]
            .into_iter()
            .filter_map(|o| c.relisted(o))
            .collect();
        d.extend(c.end_relist(Kind::Service));
        let mut got = names(&d);
        got.sort();
        assert_eq!(got, vec!["+new", "-vanish", "~change"]);
        assert_eq!(c.len(), 4);
        // The vanished key comes back whole, namespace and all.
        let gone = d.iter().find_map(|d| match d {
            Delta::Deleted(k) => Some(k.clone()),
            _ => None,
        });
        assert_eq!(gone, Some(ObjectKey::of(&svc("vanish", "1"))));
        // Relisting a kind leaves the other kinds alone; a cluster-scoped
        // key keeps no namespace.
        c.begin_relist(Kind::Pod);
        assert!(c.end_relist(Kind::Pod).is_empty());
        assert!(c.keys().contains(&ObjectKey::of(&node("n1", "1"))));
        c.begin_relist(Kind::Node);
        let d = c.end_relist(Kind::Node);
        assert_eq!(names(&d), vec!["-n1"]);
        assert!(matches!(&d[0], Delta::Deleted(k) if k.namespace.is_none()));
    }

    #[test]
    fn the_key_buffer_is_compacted_as_objects_go() {
        let mut c = Cache::default();
        for i in 0..20_000 {
            c.put(svc(&format!("service-number-{i}"), "1"));
        }
        let full = c.text.len();
        for i in 0..15_000 {
            c.delete(ObjectKey::of(&svc(&format!("service-number-{i}"), "1")));
        }
        assert!(c.text.len() < full / 2, "{} of {full}", c.text.len());
        assert_eq!(c.len(), 5_000);
        // Survivors are still found after the rewrite.
        assert!(c.put(svc("service-number-19999", "1")).is_none());
        assert!(matches!(
            c.put(svc("service-number-19999", "2")),
            Some(Delta::Updated(_))
        ));
    }
}
