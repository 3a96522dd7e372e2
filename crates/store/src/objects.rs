//! Kubernetes objects on the key-value store, with the API server's
//! conventions: `/registry/<plural>/[<ns>/]<name>` keys, `resourceVersion`
//! taken from the key's mod revision (never stored), `uid` and
//! `creationTimestamp` set on create, and compare-and-swap updates.

use podnet_api::{Kind, Object};

use crate::{AnyStore, KeyValue, Op, Result, Rev, Store, StoreError, Watch};

/// Decodes a stored object, filling in its resourceVersion.
pub fn decode(kv: &KeyValue) -> Result<Object> {
    let v: serde_json::Value = serde_json::from_slice(&kv.value)
        .map_err(|e| StoreError::Backend(format!("corrupt object at {}: {e}", kv.key)))?;
    let mut o = Object::from_value(v)
        .map_err(|e| StoreError::Backend(format!("corrupt object at {}: {e}", kv.key)))?;
    o.meta_mut().resource_version = Some(kv.mod_rev.to_string());
    Ok(o)
}

/// Encodes an object for storage (without its resourceVersion).
pub fn encode(o: &Object) -> Vec<u8> {
    let mut o = o.clone();
    o.meta_mut().resource_version = None;
    serde_json::to_vec(&o.to_value()).expect("objects serialize")
}

fn new_uid() -> String {
    let mut b = [0u8; 16];
    // SAFETY: valid buffer.
    unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 16, 0) };
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The current time as the timestamp type k8s-openapi uses.
pub fn now() -> podnet_api::k8s_openapi::jiff::Timestamp {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    podnet_api::k8s_openapi::jiff::Timestamp::new(d.as_secs() as i64, 0).expect("time in range")
}

/// Typed access to objects in a store.
#[derive(Clone)]
pub struct Objects {
    pub store: AnyStore,
}

impl Objects {
    pub fn new(store: AnyStore) -> Self {
        Objects { store }
    }

    pub async fn get(&self, kind: Kind, ns: Option<&str>, name: &str) -> Result<Option<Object>> {
        match self.store.get(&kind.key(ns, name)).await? {
            Some(kv) => decode(&kv).map(Some),
            None => Ok(None),
        }
    }

    /// Objects of a kind, in one namespace or all; with the list revision.
    pub async fn list(&self, kind: Kind, ns: Option<&str>) -> Result<(Vec<Object>, Rev)> {
        let (kvs, rev) = self.store.list(&kind.prefix(ns)).await?;
        let objs = kvs.iter().map(decode).collect::<Result<Vec<_>>>()?;
        Ok((objs, rev))
    }

    /// Like [`Objects::list`], keeping only objects whose labels match.
    pub async fn list_selected(
        &self,
        kind: Kind,
        ns: Option<&str>,
        sel: &podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    ) -> Result<(Vec<Object>, Rev)> {
        let (mut v, rev) = self.list(kind, ns).await?;
        let empty = std::collections::BTreeMap::new();
        v.retain(|o| {
            podnet_api::selector::matches(sel, o.meta().labels.as_ref().unwrap_or(&empty))
        });
        Ok((v, rev))
    }

    /// Fills in what the server owns on create: namespace, uid, timestamp.
    pub fn prepare_create(o: &mut Object) {
        let ns = o.namespace().map(String::from);
        let m = o.meta_mut();
        if ns.is_some() {
            m.namespace = ns;
        }
        if m.uid.is_none() {
            m.uid = Some(new_uid());
        }
        if m.creation_timestamp.is_none() {
            m.creation_timestamp =
                Some(podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
        }
        m.resource_version = None;
    }

    /// Creates an object (failing if it exists), plus `extra` ops atomically.
    pub async fn create(&self, mut o: Object, extra: Vec<Op>) -> Result<Object> {
        Self::prepare_create(&mut o);
        let mut ops = vec![Op::Create {
            key: o.key(),
            value: encode(&o),
            lease: 0,
        }];
        ops.extend(extra);
        let rev = self.store.txn(ops).await?;
        o.meta_mut().resource_version = Some(rev.to_string());
        Ok(o)
    }

    /// Replaces an object if its resourceVersion is still current.
    pub async fn update(&self, mut o: Object, extra: Vec<Op>) -> Result<Object> {
        let rev = o.resource_version().ok_or_else(|| {
            StoreError::Backend(format!(
                "{}: update needs metadata.resourceVersion",
                o.describe()
            ))
        })?;
        let mut ops = vec![Op::Update {
            key: o.key(),
            value: encode(&o),
            rev,
            lease: 0,
        }];
        ops.extend(extra);
        let new = self.store.txn(ops).await?;
        o.meta_mut().resource_version = Some(new.to_string());
        Ok(o)
    }

    /// Deletes an object (at its current revision when `rev` is given).
    pub async fn delete(
        &self,
        kind: Kind,
        ns: Option<&str>,
        name: &str,
        rev: Option<Rev>,
        extra: Vec<Op>,
    ) -> Result<Rev> {
        let mut ops = vec![Op::Delete {
            key: kind.key(ns, name),
            rev,
        }];
        ops.extend(extra);
        self.store.txn(ops).await
    }

    /// Watches every object of a kind from a revision.
    pub async fn watch(&self, kind: Kind, from: Rev) -> Result<Watch> {
        self.store.watch(&kind.prefix(None), from).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_look_like_uuids() {
        let u = new_uid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert_ne!(u, new_uid());
    }
}
