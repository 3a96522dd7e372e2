//! Status writes: which objects' statuses differ from what the builder
//! decided (pure), and the writer that sends them — injected, so the
//! Kubernetes API (a merge patch of the `status` subresource) and the
//! standalone store (the binary's compare-and-swap update) share the
//! loop.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use podnet_api::k8s_openapi::api::networking::v1::{
    IngressLoadBalancerIngress, IngressLoadBalancerStatus, IngressStatus,
};
use podnet_api::k8s_openapi::jiff::Timestamp;
use podnet_api::{Kind, Object};

use crate::model::build::{Statuses, World};
use crate::status;

/// Writes the status of the object given (its other fields identify it).
pub type WriteStatus =
    Arc<dyn Fn(Object) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Statuses waiting to be written, the latest per object: a later
/// change to an object's status replaces the one not yet written.
#[derive(Default)]
pub struct Queue {
    pending: std::sync::Mutex<std::collections::BTreeMap<(Kind, String, String), Object>>,
    more: tokio::sync::Notify,
}

impl Queue {
    pub fn push(&self, objs: Vec<Object>) {
        if objs.is_empty() {
            return;
        }
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for o in objs {
            let k = (
                o.kind(),
                o.namespace().unwrap_or_default().to_string(),
                o.name().to_string(),
            );
            p.insert(k, o);
        }
        self.more.notify_one();
    }

    fn take(&self) -> Vec<Object> {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *p).into_values().collect()
    }
}

/// Writes what is queued, one object at a time, while `may_write` (a
/// replica that lost its leadership drops what it queued); a failed
/// write is logged (the next full comparison queues it again).
pub async fn drain(q: Arc<Queue>, w: WriteStatus, may_write: impl Fn() -> bool) {
    loop {
        q.more.notified().await;
        for o in q.take() {
            if !may_write() {
                continue;
            }
            if let Err(e) = w(o).await {
                tracing::warn!("{e}");
            }
        }
    }
}

/// The objects whose status must change, with the new status in place.
pub fn changed(
    w: &World,
    s: &Statuses,
    addresses: &[String],
    controller: &str,
    now: Timestamp,
) -> Vec<Object> {
    let mut out = Vec::new();
    for (name, (gen, v)) in &s.classes {
        let Some(c) = w.classes.get(name) else {
            continue;
        };
        let new = status::gateway_class(c.status.as_ref(), *gen, v, now);
        if !status::unchanged(c.status.as_ref(), &new) {
            let mut c = c.clone();
            c.status = Some(new);
            out.push(Object::GatewayClass(Box::new(c)));
        }
    }
    for (k, g) in &s.gateways {
        let Some(o) = w.gateways.get(k) else { continue };
        // A Gateway with an address of its own shows that one.
        let own = g.address.map(|ip| vec![ip.to_string()]);
        let new = status::gateway(
            o.status.as_ref(),
            g,
            own.as_deref().unwrap_or(addresses),
            now,
        );
        if !status::unchanged(o.status.as_ref(), &new) {
            let mut o = o.clone();
            o.status = Some(new);
            out.push(Object::Gateway(Box::new(o)));
        }
    }
    for (k, (gen, parents)) in &s.routes {
        let Some(o) = w.routes.get(k) else { continue };
        let new = status::route(o.status.as_ref(), *gen, parents, controller, now);
        if !status::unchanged(o.status.as_ref(), &new) {
            let mut o = o.clone();
            o.status = Some(new);
            out.push(Object::HTTPRoute(Box::new(o)));
        }
    }
    for k in &s.ingresses {
        let Some(o) = w.ingresses.get(k) else {
            continue;
        };
        let new = ingress_status(addresses);
        if !status::unchanged(o.status.as_ref(), &new) {
            let mut o = o.clone();
            o.status = Some(new);
            out.push(Object::Ingress(Box::new(o)));
        }
    }
    out
}

fn ingress_status(addresses: &[String]) -> IngressStatus {
    let ingress = addresses
        .iter()
        .map(|a| match a.parse::<std::net::IpAddr>() {
            Ok(_) => IngressLoadBalancerIngress {
                ip: Some(a.clone()),
                ..Default::default()
            },
            Err(_) => IngressLoadBalancerIngress {
                hostname: Some(a.clone()),
                ..Default::default()
            },
        })
        .collect();
    IngressStatus {
        load_balancer: Some(IngressLoadBalancerStatus {
            ingress: Some(ingress),
        }),
    }
}

/// The Kubernetes API writer: a merge patch of the `status` subresource
/// (no resourceVersion: the status is wholly ours to set; other
/// controllers' route parent entries are carried in it from our view).
pub fn kube(client: kube::Client) -> WriteStatus {
    Arc::new(move |o: Object| {
        let client = client.clone();
        Box::pin(async move {
            let v = o.to_value();
            let patch = kube::api::Patch::Merge(serde_json::json!({"status": v["status"]}));
            let pp = kube::api::PatchParams::default();
            let ns = o.namespace().unwrap_or_default().to_string();
            let name = o.name().to_string();
            let r = match o.kind() {
                Kind::GatewayClass => api_all::<podnet_api::gateway::GatewayClass>(&client)
                    .patch_status(&name, &pp, &patch)
                    .await
                    .map(drop),
                Kind::Gateway => api_ns::<podnet_api::gateway::Gateway>(&client, &ns)
                    .patch_status(&name, &pp, &patch)
                    .await
                    .map(drop),
                Kind::HTTPRoute => api_ns::<podnet_api::gateway::HTTPRoute>(&client, &ns)
                    .patch_status(&name, &pp, &patch)
                    .await
                    .map(drop),
                Kind::Ingress => {
                    api_ns::<podnet_api::k8s_openapi::api::networking::v1::Ingress>(&client, &ns)
                        .patch_status(&name, &pp, &patch)
                        .await
                        .map(drop)
                }
                k => return Err(format!("no status to write for {k}")),
            };
            match r {
                // Deleted since: nothing to write.
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                r => r.map_err(|e| format!("writing the status of {}: {e}", o.describe())),
            }
        })
    })
}

fn api_all<
    K: kube::Resource<DynamicType = (), Scope = podnet_api::k8s_openapi::ClusterResourceScope>,
>(
    c: &kube::Client,
) -> kube::Api<K> {
    kube::Api::all(c.clone())
}

fn api_ns<
    K: kube::Resource<DynamicType = (), Scope = podnet_api::k8s_openapi::NamespaceResourceScope>,
>(
    c: &kube::Client,
    ns: &str,
) -> kube::Api<K> {
    kube::Api::namespaced(c.clone(), ns)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;

    use super::*;

    fn route(name: &str) -> Object {
        Object::from_value(
            serde_json::json!({"apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute", "metadata": {"name": name, "namespace": "default"}, "spec": {}}),
        )
        .unwrap()
    }

    /// A replica that does not lead writes nothing it queued; one that
    /// leads writes the latest status per object.
    #[tokio::test]
    async fn only_the_leader_writes_the_latest() {
        let written = Arc::new(Mutex::new(Vec::new()));
        let w: WriteStatus = {
            let written = written.clone();
            Arc::new(move |o: Object| {
                written.lock().unwrap().push(o.name().to_string());
                Box::pin(async { Ok(()) })
            })
        };
        let leading = Arc::new(AtomicBool::new(false));
        let q = Arc::new(Queue::default());
        let asked = Arc::new(AtomicUsize::new(0));
        let (l, a) = (leading.clone(), asked.clone());
        let may = move || {
            a.fetch_add(1, Ordering::SeqCst);
            l.load(Ordering::SeqCst)
        };
        let task = tokio::spawn(drain(q.clone(), w, may));
        q.push(vec![route("a")]);
        // Wait until the drain judged it (and dropped it, not leading).
        while asked.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        leading.store(true, Ordering::SeqCst);
        q.push(vec![route("b"), route("b"), route("c")]);
        while written.lock().unwrap().len() < 2 {
            tokio::task::yield_now().await;
        }
        task.abort();
        assert_eq!(*written.lock().unwrap(), ["b", "c"]);
    }
}
