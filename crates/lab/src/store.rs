//! Standalone mode's writes to the lab's store, where Kubernetes mode has
//! the API server and a kubelet ([`crate::kubelet`]): namespaces through
//! admission, a running Pod's status, and an upsert that retries when
//! another writer got there first.

use std::net::Ipv4Addr;

use podnet_api::k8s_openapi::api::core::v1::{Namespace, PodCondition, PodIP, PodStatus};
use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use podnet_api::{Kind, Object};
use podnet_store::{Objects, StoreError};

use crate::error::{msg, LabError};
use crate::state::{Lab, LabState};

impl Lab {
    pub(crate) async fn objects(&self, st: &LabState) -> Result<Objects, LabError> {
        Ok(Objects::new(podnet_store::open(&st.store).await?))
    }
}

/// Standalone: creates namespace `ns` unless it exists, through admission
/// (which labels it `kubernetes.io/metadata.name`, as the API server does).
pub(crate) async fn ensure_store_namespace(objs: &Objects, ns: &str) -> Result<(), LabError> {
    if objs.get(Kind::Namespace, None, ns).await?.is_some() {
        return Ok(());
    }
    let nso = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let ctx = podnet_apiserver::admission::context(objs).await?;
    podnet_apiserver::admission::apply_one(objs, &ctx, Object::Namespace(Box::new(nso)))
        .await
        .map_err(|e| msg(format!("creating namespace {ns}: {e}")))?;
    Ok(())
}

/// Standalone: the status a kubelet writes once the pod runs (IP, its
/// node's IP, Running, Ready), onto the Pod object made before the sandbox.
pub(crate) async fn set_store_pod_running(
    objs: &Objects,
    ns: &str,
    pod: &str,
    (ip, ip6): (&str, Option<&str>),
    host_ip: Ipv4Addr,
) -> Result<(), LabError> {
    let cond = |t: &str| PodCondition {
        type_: t.into(),
        status: "True".into(),
        ..Default::default()
    };
    let status = PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some(ip.into()),
        pod_ips: Some(
            std::iter::once(ip)
                .chain(ip6)
                .map(|ip| PodIP { ip: ip.into() })
                .collect(),
        ),
        host_ip: Some(host_ip.to_string()),
        conditions: Some(vec![
            cond("PodScheduled"),
            cond("Initialized"),
            cond("ContainersReady"),
            cond("Ready"),
        ]),
        ..Default::default()
    };
    for _ in 0..5 {
        let Some(Object::Pod(mut p)) = objs.get(Kind::Pod, Some(ns), pod).await? else {
            return Err(msg(format!("Pod {ns}/{pod} vanished before it ran")));
        };
        p.status = Some(status.clone());
        match objs.update(Object::Pod(p), vec![]).await {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(msg(format!("Pod {ns}/{pod} keeps changing")))
}

pub(crate) async fn upsert(objs: &Objects, o: Object) -> Result<(), LabError> {
    for _ in 0..5 {
        let r = match objs.get(o.kind(), o.namespace(), o.name()).await? {
            Some(old) => {
                let mut n = o.clone();
                n.meta_mut().resource_version = old.meta().resource_version.clone();
                n.meta_mut().uid = old.meta().uid.clone();
                n.meta_mut().creation_timestamp = old.meta().creation_timestamp.clone();
                objs.update(n, vec![]).await
            }
            None => objs.create(o.clone(), vec![]).await,
        };
        match r {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { .. }) | Err(StoreError::AlreadyExists(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(msg(format!("{} keeps changing", o.describe())))
}
