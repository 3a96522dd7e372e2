//! What the overlay's kernel tests share: namespace guards.

use podnet_kernel::Netns;

/// Removes the named namespaces even when the test panics.
pub struct NsGuard(pub Vec<String>);

impl Drop for NsGuard {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Netns::delete_named(n);
        }
    }
}
