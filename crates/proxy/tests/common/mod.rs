//! What the proxy's kernel tests share: namespace guards and object-source deltas.

use podnet_api::Object;
use podnet_kernel::Netns;
use podnet_source::Delta;

/// Removes the named namespaces even when the test panics.
pub struct NsGuard(pub Vec<String>);

impl Drop for NsGuard {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Netns::delete_named(n);
        }
    }
}

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
