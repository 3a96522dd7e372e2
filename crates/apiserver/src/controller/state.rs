//! What the controller knows of the cluster: Services, Pods, its own
//! EndpointSlices, node zones, and the addresses and ports reserved; the
//! index from a node to its Pods, so a node's zone change costs its Pods.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;

use podnet_api::k8s_openapi::api::core::v1::{Pod, Service};
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::{alloc, endpoints};

/// A Service or object: (namespace, name).
pub type Key = (String, String);

#[derive(Default)]
pub struct State {
    pub services: BTreeMap<Key, Service>,
    pub pods: BTreeMap<Key, Pod>,
    pub slices: BTreeMap<Key, EndpointSlice>,
    /// Node name -> zone label, for endpoints' zones and topology hints.
    pub zones: endpoints::Zones,
    /// Node name -> the Pods (namespace, name) bound to it, so a Node's
    /// zone change finds the Services whose endpoints it moves.
    pods_on_node: BTreeMap<String, BTreeSet<Key>>,
    pub ips: HashSet<IpAddr>,
    pub ports: HashSet<u16>,
}

fn node_of(p: &Pod) -> Option<&str> {
    p.spec
        .as_ref()?
        .node_name
        .as_deref()
        .filter(|n| !n.is_empty())
}

impl State {
    /// The slices the Service `k` should have from the Pods in its
    /// namespace; none once the Service is gone.
    pub fn desired_slices(&self, k: &Key) -> Vec<EndpointSlice> {
        let Some(svc) = self.services.get(k) else {
            return vec![];
        };
        let pods: Vec<&Pod> = self
            .pods
            .range((k.0.clone(), String::new())..)
            .take_while(|((ns, _), _)| *ns == k.0)
            .map(|(_, p)| p)
            .collect();
        endpoints::desired(svc, &pods, &self.zones)
    }

    /// The cached slices we manage for the Service `k`.
    pub fn existing_slices(&self, k: &Key) -> Vec<EndpointSlice> {
        self.slices
            .range((k.0.clone(), String::new())..)
            .take_while(|((ns, _), _)| *ns == k.0)
            .filter(|(_, s)| endpoints::managed_service(s) == Some(k.1.as_str()))
            .map(|(_, s)| s.clone())
            .collect()
    }

    pub fn index_pod(&mut self, p: &Pod, k: &Key) {
        if let Some(n) = node_of(p) {
            self.pods_on_node
                .entry(n.to_string())
                .or_default()
                .insert(k.clone());
        }
    }

    pub fn unindex_pod(&mut self, p: Option<&Pod>, k: &Key) {
        let Some(n) = p.and_then(node_of) else { return };
        if let Some(keys) = self.pods_on_node.get_mut(n) {
            keys.remove(k);
            if keys.is_empty() {
                self.pods_on_node.remove(n);
            }
        }
    }

    /// The Services whose selector matches a Pod on `node`: those whose
    /// endpoints carry the node's zone. Each distinct (namespace, labels)
    /// among the node's Pods is matched once.
    pub fn services_on_node(&self, node: &str) -> BTreeSet<Key> {
        let empty = BTreeMap::new();
        let mut seen = BTreeSet::new();
        let mut out = BTreeSet::new();
        for k in self.pods_on_node.get(node).into_iter().flatten() {
            let Some(p) = self.pods.get(k) else { continue };
            let labels = p.metadata.labels.as_ref().unwrap_or(&empty);
            if !seen.insert((k.0.as_str(), labels)) {
                continue;
            }
            out.extend(
                endpoints::services_selecting(self.services_in(&k.0), &k.0, labels)
                    .into_iter()
                    .map(|n| (k.0.clone(), n)),
            );
        }
        out
    }

    /// The Services of one namespace.
    pub fn services_in<'a>(&'a self, ns: &'a str) -> impl Iterator<Item = &'a Service> + 'a {
        self.services
            .range((ns.to_string(), String::new())..)
            .take_while(move |((n, _), _)| n == ns)
            .map(|(_, s)| s)
    }

    /// Every Service known, by its object or by a slice it manages.
    pub fn all_service_keys(&self) -> BTreeSet<Key> {
        let mut k: BTreeSet<Key> = self.services.keys().cloned().collect();
        for ((ns, _), s) in &self.slices {
            if let Some(svc) = endpoints::managed_service(s) {
                k.insert((ns.clone(), svc.to_string()));
            }
        }
        k
    }

    /// Takes a reservation key as taken.
    pub fn remember_alloc(&mut self, key: &str) {
        if let Some(ip) = key
            .strip_prefix(alloc::IP_PREFIX)
            .and_then(|s| s.parse().ok())
        {
            self.ips.insert(ip);
        }
        if let Some(p) = key
            .strip_prefix(alloc::PORT_PREFIX)
            .and_then(|s| s.parse().ok())
        {
            self.ports.insert(p);
        }
    }

    pub fn forget_alloc(&mut self, key: &str) {
        if let Some(ip) = key
            .strip_prefix(alloc::IP_PREFIX)
            .and_then(|s| s.parse().ok())
        {
            self.ips.remove(&ip);
        }
        if let Some(p) = key
            .strip_prefix(alloc::PORT_PREFIX)
            .and_then(|s| s.parse().ok())
        {
            self.ports.remove(&p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, name: &str, app: &str, node: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
            "spec": {"nodeName": node, "containers": []}}))
        .unwrap()
    }

    fn put_pod(st: &mut State, p: Pod) {
        let k = (
            p.metadata.namespace.clone().unwrap(),
            p.metadata.name.clone().unwrap(),
        );
        let old = st.pods.insert(k.clone(), p.clone());
        st.unindex_pod(old.as_ref(), &k);
        st.index_pod(&p, &k);
    }

    fn del_pod(st: &mut State, ns: &str, name: &str) {
        let k = (ns.to_string(), name.to_string());
        let old = st.pods.remove(&k);
        st.unindex_pod(old.as_ref(), &k);
    }

    fn key(ns: &str, name: &str) -> Key {
        (ns.to_string(), name.to_string())
    }

    /// A Node's zone change reaches exactly the Services selecting a Pod
    /// on it, hints or not, and the index follows Pods that move or go.
    #[test]
    fn services_on_node_follow_the_pods_there() {
        let mut st = State::default();
        for (ns, name, app) in [
            ("a", "web", "web"),
            ("a", "close", "web"),
            ("a", "db", "db"),
            ("b", "web", "web"),
        ] {
            let mut spec = json!({"selector": {"app": app}, "ports": [{"port": 80}]});
            if name == "close" {
                spec["trafficDistribution"] = json!("PreferClose");
            }
            let s: Service = serde_json::from_value(
                json!({"metadata": {"name": name, "namespace": ns}, "spec": spec}),
            )
            .unwrap();
            st.services.insert(key(ns, name), s);
        }
        put_pod(&mut st, pod("a", "w1", "web", Some("n1")));
        put_pod(&mut st, pod("a", "w2", "web", Some("n1")));
        put_pod(&mut st, pod("b", "d1", "db", Some("n1")));
        put_pod(&mut st, pod("a", "d2", "db", Some("n2")));
        put_pod(&mut st, pod("a", "loose", "db", None));

        let web_a = BTreeSet::from([key("a", "web"), key("a", "close")]);
        assert_eq!(
            st.services_on_node("n1"),
            web_a,
            "b/db selects nothing in b"
        );
        assert_eq!(st.services_on_node("n2"), BTreeSet::from([key("a", "db")]));
        assert!(st.services_on_node("n3").is_empty());

        // d2 moves to n1 (and so leaves n2); w1 and w2 go.
        put_pod(&mut st, pod("a", "d2", "db", Some("n1")));
        assert!(st.services_on_node("n2").is_empty());
        assert!(!st.pods_on_node.contains_key("n2"), "empty entries go");
        del_pod(&mut st, "a", "w1");
        del_pod(&mut st, "a", "w2");
        assert_eq!(st.services_on_node("n1"), BTreeSet::from([key("a", "db")]));
        del_pod(&mut st, "a", "d2");
        del_pod(&mut st, "b", "d1");
        del_pod(&mut st, "a", "loose");
        assert!(st.pods_on_node.is_empty());
    }
}
