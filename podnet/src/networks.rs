//! The agent's writers of a pod's `k8s.v1.cni.cncf.io/network-status`
//! annotation (`podnet_agent::networks`), one per mode: a merge patch of
//! the Pod's annotations through the API, or the Pod in the store,
//! compare-and-swapped. Only that annotation is written; in Kubernetes
//! mode the admission policy `podnet-agent-pod-status` holds an agent to
//! it, and to the pods of its own node.

use std::sync::Arc;

use podnet_agent::networks::{Setup, WriteStatus};
use podnet_api::k8s_openapi::api::core::v1::Pod;
use podnet_api::nad::{NetworkAttachmentDefinition, NETWORK_STATUS};
use podnet_api::{Kind, Object};

/// Kubernetes mode: served when the NetworkAttachmentDefinition CRD is
/// (else None, with a warning: the agent would wait for a kind that is
/// never listed).
pub async fn kube(client: &kube::Client) -> Option<Setup> {
    let api: kube::Api<NetworkAttachmentDefinition> = kube::Api::all(client.clone());
    match api.list(&kube::api::ListParams::default().limit(1)).await {
        Err(kube::Error::Api(s)) if s.code == 404 => {
            tracing::warn!(
                "the NetworkAttachmentDefinition CRD (k8s.cni.cncf.io/v1) is not installed: pods get the default network only; install it and restart the agent"
            );
            return None;
        }
        // Anything else (forbidden, unreachable) shows up in the watch.
        _ => {}
    }
    let client = client.clone();
    let write: WriteStatus = Arc::new(move |ns: String, name: String, text: String| {
        let client = client.clone();
        Box::pin(async move {
            let pods: kube::Api<Pod> = kube::Api::namespaced(client, &ns);
            let patch = serde_json::json!({"metadata": {"annotations": {NETWORK_STATUS: text}}});
            pods.patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .map(drop)
            .map_err(|e| format!("writing {NETWORK_STATUS} of pod {ns}/{name}: {e}"))
        })
    });
    Some(Setup { write: Some(write) })
}

/// Standalone mode: the Pod as stored now with the annotation set,
/// compare-and-swapped (re-read on a conflict).
pub fn store(objs: podnet_store::objects::Objects) -> Setup {
    let objs = Arc::new(objs);
    let write: WriteStatus = Arc::new(move |ns: String, name: String, text: String| {
        let objs = objs.clone();
        Box::pin(async move {
            let mut last = String::new();
            for _ in 0..3 {
                let cur = objs
                    .get(Kind::Pod, Some(&ns), &name)
                    .await
                    .map_err(|e| e.to_string())?;
                let Some(Object::Pod(mut p)) = cur else {
                    return Err(format!("pod {ns}/{name} is gone"));
                };
                p.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(NETWORK_STATUS.to_string(), text.clone());
                match objs.update(Object::Pod(p), Vec::new()).await {
                    Ok(_) => return Ok(()),
                    Err(e) => last = e.to_string(),
                }
            }
            Err(format!(
                "writing {NETWORK_STATUS} of pod {ns}/{name}: {last}"
            ))
        })
    });
    Setup { write: Some(write) }
}
