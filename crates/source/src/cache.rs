//! What a source has delivered, per object: its resourceVersion and
//! nothing else. That is enough to turn a watch event into the right delta
//! (Added or Updated, or nothing for a repeat) and, after a gap, to turn a
//! fresh list into the difference against what consumers already have
//! (flannel's lesson, kube-runtime's reflector): the objects themselves
//! stay with the consumers that need them, so the source costs a key and a
//! version per object.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use podnet_api::{Kind, Object};

use crate::{Delta, ObjectKey};

#[derive(Default)]
pub struct Cache {
    known: HashMap<ObjectKey, String>,
}

fn version(o: &Object) -> String {
    o.meta().resource_version.clone().unwrap_or_default()
}

impl Cache {
    pub fn len(&self) -> usize {
        self.known.len()
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// A watch saw `o` created or changed: Added or Updated, or nothing if
    /// this version was already delivered (a watch that restarted from an
    /// older revision repeats events).
    pub fn put(&mut self, o: Object) -> Option<Delta> {
        let key = ObjectKey::of(&o);
        let v = version(&o);
        match self.known.insert(key, v.clone()) {
            None => Some(Delta::Added(Arc::new(o))),
            Some(old) if old == v && !v.is_empty() => None,
            Some(_) => Some(Delta::Updated(Arc::new(o))),
        }
    }

    /// A watch saw the object deleted: Deleted, or nothing if it was never
    /// delivered.
    pub fn delete(&mut self, key: ObjectKey) -> Option<Delta> {
        self.known.remove(&key).map(|_| Delta::Deleted(key))
    }

    /// A complete fresh list of `kinds`: the deltas that bring a consumer
    /// from what it has to the list (new, changed and vanished objects).
    pub fn relist(&mut self, kinds: &BTreeSet<Kind>, listed: Vec<Object>) -> Vec<Delta> {
        let mut out = Vec::new();
        let mut seen: BTreeSet<ObjectKey> = BTreeSet::new();
        for o in listed {
            seen.insert(ObjectKey::of(&o));
            if let Some(d) = self.put(o) {
                out.push(d);
            }
        }
        let gone: Vec<ObjectKey> = self
            .known
            .keys()
            .filter(|k| kinds.contains(&k.kind) && !seen.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            self.known.remove(&k);
            out.push(Delta::Deleted(k));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podnet_api::k8s_openapi::api::core::v1::Service;
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
        for o in [svc("keep", "1"), svc("change", "1"), svc("vanish", "1")] {
            c.put(o);
        }
        let kinds = [Kind::Service].into_iter().collect();
        let d = c.relist(
            &kinds,
            vec![svc("keep", "1"), svc("change", "5"), svc("new", "6")],
        );
        let mut got = names(&d);
        got.sort();
        assert_eq!(got, vec!["+new", "-vanish", "~change"]);
        assert_eq!(c.len(), 3);
        // Relisting kinds that were not listed leaves their objects alone.
        let d = c.relist(&[Kind::Pod].into_iter().collect(), vec![]);
        assert!(d.is_empty());
        assert_eq!(c.len(), 3);
    }
}
