//! What LB IPAM decides from besides the Services: the IPAddressPools as
//! stored (and the usable [`Pools`] built from them) and each namespace's
//! labels (pools select namespaces by them). Kept by both controllers,
//! the standalone one and Kubernetes mode's, fed by their object source;
//! each change says whether it changed anything, so a repeated delivery
//! moves no Service.

use std::collections::BTreeMap;

use podnet_api::pool::IPAddressPool;
use podnet_api::Object;

use super::Pools;

/// The label the API server gives every namespace: its name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

#[derive(Default)]
pub struct Inputs {
    /// Every IPAddressPool, as stored.
    stored: BTreeMap<String, IPAddressPool>,
    pools: Pools,
    /// Namespace name -> its labels (only namespaces that have some).
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
}

impl Inputs {
    /// The usable pools (a bad one is left out, with a warning).
    pub fn pools(&self) -> &Pools {
        &self.pools
    }

    /// Takes a pool's change (None or another kind: gone); true if the
    /// pools changed.
    pub fn pool(&mut self, name: &str, o: Option<&Object>) -> bool {
        let before = self.stored.get(name).cloned();
        match o {
            Some(Object::IPAddressPool(p)) => {
                self.stored.insert(name.to_string(), (**p).clone());
            }
            _ => {
                self.stored.remove(name);
            }
        }
        if self.stored.get(name) == before.as_ref() {
            return false;
        }
        let (pools, bad) = Pools::new(self.stored.values());
        for (name, why) in bad {
            tracing::warn!(pool = %name, "IPAddressPool {name} is ignored: {why}");
        }
        self.pools = pools;
        true
    }

    /// Takes a namespace's change; true if its labels changed.
    pub fn namespace(&mut self, name: &str, o: Option<&Object>) -> bool {
        let labels = match o {
            Some(Object::Namespace(n)) => n.metadata.labels.clone().unwrap_or_default(),
            _ => BTreeMap::new(),
        };
        if labels.is_empty() {
            self.namespaces.remove(name).is_some()
        } else {
            self.namespaces.insert(name.to_string(), labels.clone()) != Some(labels)
        }
    }

    /// A namespace's labels; one not known has the name label the API
    /// server gives every namespace.
    pub fn labels_of(&self, ns: &str) -> BTreeMap<String, String> {
        self.namespaces
            .get(ns)
            .cloned()
            .unwrap_or_else(|| BTreeMap::from([(NAMESPACE_NAME_LABEL.into(), ns.into())]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pools_and_namespaces_report_changes() {
        let mut st = Inputs::default();
        let p: IPAddressPool = serde_json::from_value(
            json!({"metadata": {"name": "lan"}, "spec": {"addresses": ["192.0.2.0/28"]}}),
        )
        .unwrap();
        let o = Object::IPAddressPool(Box::new(p));
        assert!(st.pool("lan", Some(&o)));
        assert!(!st.pool("lan", Some(&o)), "the same pool again");
        assert!(st.pools().hold("192.0.2.3".parse().unwrap()));
        assert!(st.pool("lan", None));
        assert!(st.pools().is_empty());
        assert_eq!(
            st.labels_of("shop"),
            BTreeMap::from([(NAMESPACE_NAME_LABEL.to_string(), "shop".to_string())])
        );
        let ns: podnet_api::k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(json!({"metadata": {"name": "shop", "labels": {"team": "a"}}}))
                .unwrap();
        let o = Object::Namespace(Box::new(ns));
        assert!(st.namespace("shop", Some(&o)));
        assert!(!st.namespace("shop", Some(&o)));
        assert_eq!(st.labels_of("shop")["team"], "a");
        assert!(st.namespace("shop", None));
    }
}
