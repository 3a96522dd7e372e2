//! A pod's extra networks, the Multus way (`podnet_api::nad`): the CNI
//! plugin asks the node's agent, over its socket, which networks a pod
//! wants (`{"op":"networks"}`), runs them itself, and hands back what it
//! got (`{"op":"network-status"}`), which the agent writes to the pod's
//! `k8s.v1.cni.cncf.io/network-status` annotation through an injected
//! writer (the API or the store).
//!
//! The agent answers from its view of Pods and NetworkAttachmentDefinitions
//! (one subscription of the object source), never from a request of its
//! own to the API. A pod the view does not hold yet is waited for
//! briefly ([`GRACE`]); one that never appears is a sandbox with no pod
//! object (a bare CRI sandbox): it has no extra networks.
//!
//! A pod may attach only the definitions of its own namespace: a
//! definition is how an administrator hands a namespace a way onto a
//! segment, and Multus's default of letting any pod name any namespace's
//! definition would let every tenant onto every segment.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use podnet_api::nad::{self, NetworkAttachmentDefinition};
use podnet_api::{Kind, Object};
use podnet_policy::hint::{Other, Reply, Request};
use podnet_source::{Delta, Subscription};
use serde_json::{json, Value};
use tokio::sync::watch;

/// What the networks view reads.
pub const KINDS: &[Kind] = &[Kind::Pod, Kind::NetworkAttachmentDefinition];

/// How long a request waits for a pod its view does not hold yet.
pub const GRACE: Duration = Duration::from_secs(1);

/// How long a request waits for the view's first complete list.
pub const FIRST_LIST: Duration = Duration::from_secs(10);

/// Writes a pod's network-status annotation: (namespace, name, text).
pub type WriteStatus = Arc<
    dyn Fn(String, String, String) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>>
        + Send
        + Sync,
>;

/// The agent's option: serve pods' extra networks, writing their status
/// with `write` (None: not written).
#[derive(Clone)]
pub struct Setup {
    pub write: Option<WriteStatus>,
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setup")
            .field("write", &self.write.is_some())
            .finish()
    }
}

type Name = (String, String);

#[derive(Default)]
struct View {
    ready: bool,
    /// Every pod, with its networks annotation if it has one.
    pods: HashMap<Name, Option<String>>,
    nads: HashMap<Name, Arc<NetworkAttachmentDefinition>>,
}

impl View {
    fn apply(&mut self, d: &Delta) {
        match d {
            Delta::Added(o) | Delta::Updated(o) => match o.as_ref() {
                Object::Pod(p) => {
                    let asked = p
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(nad::NETWORKS))
                        .cloned();
                    self.pods.insert(name_of(o), asked);
                }
                Object::NetworkAttachmentDefinition(n) => {
                    self.nads.insert(name_of(o), Arc::new(n.as_ref().clone()));
                }
                _ => {}
            },
            Delta::Deleted(k) => {
                let n = (k.namespace.clone().unwrap_or_default(), k.name.clone());
                match k.kind {
                    Kind::Pod => self.pods.remove(&n),
                    Kind::NetworkAttachmentDefinition => self.nads.remove(&n).map(|_| None),
                    _ => None,
                };
            }
        }
    }
}

fn name_of(o: &Object) -> Name {
    (
        o.namespace().unwrap_or_default().to_string(),
        o.name().to_string(),
    )
}

/// The view, its change signal and the status writer.
pub struct Networks {
    view: RwLock<View>,
    changed: watch::Sender<u64>,
    write: Option<WriteStatus>,
}

impl Networks {
    pub fn new(write: Option<WriteStatus>) -> Arc<Networks> {
        Arc::new(Networks {
            view: RwLock::new(View::default()),
            changed: watch::channel(0).0,
            write,
        })
    }

    /// Keeps the view from `sub` (subscribed to [`KINDS`]) until it ends.
    pub async fn follow(self: Arc<Self>, mut sub: Subscription) {
        while let Some(b) = sub.next_batch().await {
            {
                let mut v = self.view.write().unwrap_or_else(|e| e.into_inner());
                if let Some(all) = &b.snapshot {
                    v.pods.clear();
                    v.nads.clear();
                    for o in all {
                        v.apply(&Delta::Added(o.clone()));
                    }
                }
                for d in &b.deltas {
                    v.apply(d);
                }
                v.ready |= b.ready;
            }
            self.changed.send_modify(|n| *n += 1);
        }
    }

    /// The socket's handler for this module's ops.
    pub fn other(self: &Arc<Self>) -> Other {
        let me = self.clone();
        Arc::new(move |req: Request| {
            let me = me.clone();
            Box::pin(async move {
                match req.op.as_str() {
                    "networks" => me.networks(&req.namespace, &req.name).await,
                    "network-status" => me.write_status(req).await,
                    op => Reply::err(format!(
                        "unknown op {op:?} (add, del, networks, network-status)"
                    )),
                }
            })
        })
    }

    /// Waits (bounded) for a complete view holding the pod; returns its
    /// networks annotation, or None for a pod the cluster does not know.
    async fn annotation(&self, ns: &str, name: &str) -> Result<Option<String>, String> {
        let mut rx = self.changed.subscribe();
        let key = (ns.to_string(), name.to_string());
        let start = tokio::time::Instant::now();
        loop {
            let (ready, found) = {
                let v = self.view.read().unwrap_or_else(|e| e.into_inner());
                (v.ready, v.pods.get(&key).cloned())
            };
            if let Some(a) = found {
                return Ok(a);
            }
            let limit = if ready { GRACE } else { FIRST_LIST };
            let left = limit.saturating_sub(start.elapsed());
            if left.is_zero() {
                if ready {
                    return Ok(None);
                }
                return Err("the agent has not listed the cluster's pods yet".into());
            }
            let _ = tokio::time::timeout(left, rx.changed()).await;
        }
    }

    async fn networks(&self, ns: &str, name: &str) -> Reply {
        let asked = match self.annotation(ns, name).await {
            Ok(Some(a)) => a,
            Ok(None) => return with_networks(Vec::new()),
            Err(e) => return Reply::err(e),
        };
        let r = {
            let v = self.view.read().unwrap_or_else(|e| e.into_inner());
            attachments(ns, name, &asked, |n| v.nads.get(n).cloned())
        };
        match r {
            Ok(list) => with_networks(list),
            Err(e) => Reply::err(e),
        }
    }

    async fn write_status(&self, req: Request) -> Reply {
        let Some(status) = req.extra.get("networkStatus") else {
            return Reply::err("network-status: no \"networkStatus\"");
        };
        let entries: Vec<nad::NetworkStatus> = match serde_json::from_value(status.clone()) {
            Ok(e) => e,
            Err(e) => return Reply::err(format!("network-status: {e}")),
        };
        let Some(w) = &self.write else {
            return Reply::ok();
        };
        match w(req.namespace, req.name, nad::status_text(&entries)).await {
            Ok(()) => Reply::ok(),
            Err(e) => Reply::err(e),
        }
    }
}

fn with_networks(list: Vec<Value>) -> Reply {
    let mut r = Reply::ok();
    r.extra.insert("networks".into(), Value::Array(list));
    r
}

/// The attachments pod `ns/name` asks for with `annotation`, each a
/// definition's CNI configuration with the interface, and what the
/// selection asks of the plugins (`ips`, `mac`, `cni-args`). Pure.
pub fn attachments(
    ns: &str,
    name: &str,
    annotation: &str,
    nads: impl Fn(&Name) -> Option<Arc<NetworkAttachmentDefinition>>,
) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for r in nad::parse_networks(annotation, ns)? {
        if r.namespace != ns {
            return Err(format!(
                "pod {ns}/{name} may attach only networks of its own namespace, not {}",
                r.full_name()
            ));
        }
        let def = nads(&(r.namespace.clone(), r.selection.name.clone())).ok_or_else(|| {
            format!(
                "pod {ns}/{name}: NetworkAttachmentDefinition {} not found",
                r.full_name()
            )
        })?;
        let config = def.cni_config().map_err(|e| {
            format!(
                "NetworkAttachmentDefinition {}: spec.config: {e}",
                r.full_name()
            )
        })?;
        out.push(json!({
            "name": r.full_name(),
            "interface": r.interface,
            "config": config,
            "ips": r.selection.ips,
            "mac": r.selection.mac,
            "cniArgs": r.selection.cni_args,
        }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use podnet_api::nad::NetworkAttachmentDefinitionSpec;

    fn defs() -> HashMap<Name, Arc<NetworkAttachmentDefinition>> {
        let mk = |c: &str| {
            Arc::new(NetworkAttachmentDefinition {
                spec: NetworkAttachmentDefinitionSpec { config: c.into() },
                ..Default::default()
            })
        };
        HashMap::from([
            (
                ("shop".into(), "lan".into()),
                mk(r#"{"cniVersion":"1.0.0","type":"macvlan","master":"eth0"}"#),
            ),
            (("shop".into(), "empty".into()), mk("")),
            (
                ("infra".into(), "storage".into()),
                mk(r#"{"cniVersion":"1.0.0","type":"macvlan"}"#),
            ),
        ])
    }

    #[test]
    fn a_pod_gets_its_namespaces_definitions() {
        let d = defs();
        let a = r#"[{"name":"lan","interface":"data0","ips":["10.1.0.5/24"],"mac":"02:00:00:00:00:05"}]"#;
        let got = attachments("shop", "web", a, |n| d.get(n).cloned()).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(
            (
                &got[0]["name"],
                &got[0]["interface"],
                &got[0]["config"]["type"]
            ),
            (&json!("shop/lan"), &json!("data0"), &json!("macvlan"))
        );
        assert_eq!(
            (&got[0]["ips"][0], &got[0]["mac"]),
            (&json!("10.1.0.5/24"), &json!("02:00:00:00:00:05"))
        );
        let got = attachments("shop", "web", "lan,lan@net5", |n| d.get(n).cloned()).unwrap();
        let ifs: Vec<&Value> = got.iter().map(|a| &a["interface"]).collect();
        assert_eq!(ifs, [&json!("net1"), &json!("net5")]);
    }

    #[test]
    fn what_a_pod_may_not_have_is_refused_by_name() {
        let d = defs();
        for (a, why) in [
            (
                "infra/storage",
                "may attach only networks of its own namespace, not infra/storage",
            ),
            ("nope", "NetworkAttachmentDefinition shop/nope not found"),
            (
                "empty",
                "NetworkAttachmentDefinition shop/empty: spec.config: required",
            ),
            ("a/b/c", "is not [namespace/]name[@interface]"),
        ] {
            let e = attachments("shop", "web", a, |n| d.get(n).cloned()).unwrap_err();
            assert!(e.contains(why), "{a}: {e}");
        }
    }
}
