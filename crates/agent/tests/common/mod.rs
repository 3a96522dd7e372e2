//! What the agent's kernel tests share: namespace guards and store records.

use podnet_api::Object;
use podnet_kernel::Netns;
use podnet_store::KeyValue;

/// Removes the named namespaces even when the test panics.
pub struct NsGuard(pub Vec<String>);

impl Drop for NsGuard {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Netns::delete_named(n);
        }
    }
}

/// An object as the store would hand it to the proxier.
#[allow(dead_code)] // not every test binary uses it
pub fn kv(o: serde_json::Value) -> KeyValue {
    let o = Object::from_value(o).unwrap();
    KeyValue {
        key: o.key(),
        value: podnet_store::objects::encode(&o),
        create_rev: 1,
        mod_rev: 1,
        lease: 0,
    }
}
