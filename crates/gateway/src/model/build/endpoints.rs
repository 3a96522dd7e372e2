//! A backend's endpoints: the ready addresses the Service's
//! EndpointSlices list for its port (serving-terminating ones when none
//! is ready, as kube-proxy does), read straight from the slices so a
//! request goes to a pod with no ClusterIP hop.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use super::World;
use crate::model::{BackendEndpoints, BackendKey, Endpoints};

/// Below this many keys, slices are read per namespace rather than all.
const FEW: usize = 64;

/// The endpoints of each of `keys`.
pub fn resolve(w: &World, keys: &BTreeSet<BackendKey>) -> Endpoints {
    let mut by_service: BTreeMap<(&str, &str), Vec<&_>> = BTreeMap::new();
    let slices: Box<dyn Iterator<Item = (&(String, String), &_)>> = match keys.len() < FEW {
        true => Box::new(namespaces(keys).into_iter().flat_map(|ns| {
            w.slices
                .range((ns.to_string(), String::new())..)
                .take_while(move |((n, _), _)| n == ns)
        })),
        false => Box::new(w.slices.iter()),
    };
    for ((ns, _), s) in slices {
        if let Some(svc) = podnet_api::endpoints::service_name(s) {
            by_service.entry((ns.as_str(), svc)).or_default().push(s);
        }
    }
    let mut out = Endpoints::new();
    for k in keys {
        let slices = by_service
            .get(&(k.namespace.as_str(), k.service.as_str()))
            .cloned()
            .unwrap_or_default();
        out.insert(k.clone(), Arc::new(one(w, k, &slices)));
    }
    out
}

fn namespaces(keys: &BTreeSet<BackendKey>) -> BTreeSet<&str> {
    keys.iter().map(|k| k.namespace.as_str()).collect()
}

fn one(
    w: &World,
    k: &BackendKey,
    slices: &[&podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice],
) -> BackendEndpoints {
    let Some(port) = w
        .services
        .get(&(k.namespace.clone(), k.service.clone()))
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.ports.as_ref())
        .and_then(|ps| ps.iter().find(|p| p.port == i32::from(k.port)))
    else {
        return BackendEndpoints::default();
    };
    let name = port.name.as_deref().unwrap_or("");
    let proto = port.protocol.as_deref().unwrap_or("TCP");
    let listed = podnet_api::endpoints::listed(slices, name, proto, &|_| true);
    let ready: Vec<SocketAddr> = listed
        .iter()
        .filter(|l| l.cond.ready)
        .map(|l| SocketAddr::new(l.ip, l.port))
        .collect();
    let addrs = match ready.is_empty() {
        true => listed
            .iter()
            .filter(|l| l.cond.serving_terminating())
            .map(|l| SocketAddr::new(l.ip, l.port))
            .collect(),
        false => ready,
    };
    let app = port.app_protocol.as_deref().unwrap_or("");
    let authorities = addrs
        .iter()
        .filter_map(|a| a.to_string().parse().ok())
        .collect();
    BackendEndpoints {
        addrs,
        authorities,
        h2c: app == "kubernetes.io/h2c",
        websocket: matches!(app, "kubernetes.io/ws" | "kubernetes.io/wss"),
    }
}
