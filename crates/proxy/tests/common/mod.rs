//! What the proxy's kernel tests share: object-source deltas (namespaces
//! and nft dumps come from the testkit).

use podnet_api::Object;
use podnet_source::Delta;

/// An object from its JSON.
#[allow(dead_code)] // not every test binary uses it
pub fn kv(o: serde_json::Value) -> Object {
    Object::from_value(o).unwrap()
}

/// The object source's delta for a created or changed object.
#[allow(dead_code)]
pub fn put(o: Object) -> Delta {
    Delta::Updated(std::sync::Arc::new(o))
}

/// The object source's delta for a deleted object.
#[allow(dead_code)]
pub fn del(o: Object) -> Delta {
    Delta::Deleted(podnet_source::ObjectKey::of(&o))
}
