//! Admission: the API server's write path in standalone mode. A document
//! gets what the server sets on every write ([`defaults`]: a Namespace's
//! `kubernetes.io/metadata.name` label), is validated
//! (`podnet_api::validate`, the API server's rules for what networking
//! uses), merged with what the server owns (uid, creation time, an
//! allocated ClusterIP, NodePorts), and written together with its
//! reservations ([`crate::alloc`]) in one transaction, so concurrent
//! writers never share an address and nothing is half-applied. Rules that
//! span objects are checked against the store here too ([`against_others`]:
//! an IPAddressPool may not overlap another pool). The Kubernetes mode does
//! not use this: the real API server admits there (and a pool's overlap
//! with others is not checked there: it needs a webhook).

use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::validate::{self, Context as VCtx};
use podnet_api::{ipfamily, netconfig};
use podnet_api::{Kind, Object};
use podnet_store::{AnyStore, Objects, Op, StoreError};

use crate::alloc;

/// The validation context from the cluster's NetworkConfig.
pub async fn context(objs: &Objects) -> Result<VCtx, StoreError> {
    let cfg = objs
        .get(Kind::NetworkConfig, None, netconfig::DEFAULT_NAME)
        .await?;
    Ok(match cfg {
        Some(Object::NetworkConfig(c)) => VCtx::from_config(Some(&c)),
        _ => VCtx::default(),
    })
}

/// The label the API server puts on every Namespace, with the
/// namespace's name as its value (immutable: policies select namespaces
/// by name through it; LB IPAM's pools too).
pub use podnet_lb::ipam::NAMESPACE_NAME_LABEL;

/// What the API server sets on every create and update, whatever the
/// document says: a Namespace's [`NAMESPACE_NAME_LABEL`] (a missing or
/// wrong value is overwritten, as kube-apiserver's namespace strategy does).
pub fn defaults(o: &mut Object) {
    if let Object::Namespace(n) = o {
        if let Some(name) = n.metadata.name.clone().filter(|n| !n.is_empty()) {
            n.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(NAMESPACE_NAME_LABEL.to_string(), name);
        }
    }
}

/// The rules an object can only break together with others in the store:
/// an IPAddressPool's addresses may not overlap another pool's ("spec.
/// addresses[1]: 192.0.2.0/28 overlaps pool other-pool"). Two pools
/// applied at the same moment can still overlap (as with MetalLB's
/// webhook); the allocator copes, since it reserves addresses, not pools.
pub async fn against_others(
    objs: &Objects,
    o: &Object,
) -> Result<Vec<podnet_api::FieldError>, StoreError> {
    let Object::IPAddressPool(pool) = o else {
        return Ok(Vec::new());
    };
    let (others, _) = objs.list(Kind::IPAddressPool, None).await?;
    Ok(others
        .iter()
        .filter_map(|other| match other {
            Object::IPAddressPool(p) if p.name() != pool.name() => Some(pool.overlaps_with(p)),
            _ => None,
        })
        .flatten()
        .collect())
}

/// Carries over what the server owns when an object is re-applied.
fn merge_for_update(new: &mut Object, old: &Object) -> Result<(), String> {
    let (om, nm) = (old.meta().clone(), new.meta_mut());
    nm.uid = om.uid;
    nm.creation_timestamp = om.creation_timestamp;
    nm.resource_version = om.resource_version;
    if nm.namespace.is_none() {
        nm.namespace = om.namespace;
    }
    match (new, old) {
        (Object::Service(n), Object::Service(o)) => {
            let (Some(ns), Some(os)) = (n.spec.as_mut(), o.spec.as_ref()) else {
                return Ok(());
            };
            let same_type = ns.type_ == os.type_;
            match (ns.cluster_ip.as_deref(), os.cluster_ip.as_deref()) {
                (Some(a), Some(b)) if a != b && !a.is_empty() && !b.is_empty() && same_type => {
                    return Err(format!("spec.clusterIP: field is immutable ({b} -> {a})"));
                }
                _ => ipfamily::carry_over(ns, os),
            }
            // Keep allocated node ports for ports that still exist.
            if same_type {
                for p in ns.ports.iter_mut().flatten() {
                    if p.node_port.is_none() {
                        p.node_port = os
                            .ports
                            .iter()
                            .flatten()
                            .find(|q| q.port == p.port && q.protocol == p.protocol)
                            .and_then(|q| q.node_port);
                    }
                }
                if ns.health_check_node_port.is_none() {
                    ns.health_check_node_port = os.health_check_node_port;
                }
            }
            if n.status.is_none() {
                n.status = o.status.clone();
            }
        }
        (Object::Pod(n), Object::Pod(o)) if n.status.is_none() => n.status = o.status.clone(),
        (Object::Node(n), Object::Node(o)) if n.status.is_none() => n.status = o.status.clone(),
        (Object::Namespace(n), Object::Namespace(o)) if n.status.is_none() => {
            n.status = o.status.clone()
        }
        _ => {}
    }
    Ok(())
}

/// A Service's families, given out and checked against the cluster's
/// Service CIDRs and the stored Service, as the API server does on write
/// ([`ipfamily`]); the controller then allocates what they lack.
fn service_families(o: &mut Object, old: Option<&Object>, ctx: &VCtx) -> Result<(), String> {
    let Object::Service(s) = o else { return Ok(()) };
    let Some(spec) = s.spec.as_mut() else {
        return Ok(());
    };
    let old = old.and_then(svc).and_then(|s| s.spec.as_ref());
    if old.is_none() && spec.type_.as_deref() != Some("ExternalName") {
        ipfamily::normalize_create(spec);
    }
    let errs = ipfamily::init(spec, old, &ctx.service_cidrs);
    match errs.is_empty() {
        true => Ok(()),
        false => Err(errs
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; ")),
    }
}

fn svc(o: &Object) -> Option<&Service> {
    alloc::as_service(o)
}

/// Explains a store error about an object in user terms.
async fn explain(store: &AnyStore, o: &Object, e: StoreError) -> String {
    match e {
        StoreError::AlreadyExists(k) if k.starts_with("/registry/allocations/") => {
            alloc::describe_taken(&k, alloc::holder(store, &k).await.as_deref())
        }
        StoreError::AlreadyExists(_) => format!("{} already exists", o.describe()),
        StoreError::Conflict { .. } => {
            format!("{} was modified concurrently; try again", o.describe())
        }
        e => e.to_string(),
    }
}

pub enum Outcome {
    Created,
    Configured,
    Unchanged,
}

/// A document's write, planned from one read of its object (so `podnet
/// apply` can read ahead while earlier documents are written).
pub enum Plan {
    /// Nothing to write: the outcome is known (invalid, unchanged, or the
    /// read failed).
    Done(Result<Outcome, String>),
    Create(Object, Vec<Op>),
    Update(Object, Vec<Op>),
}

/// Validates a document and reads its object to decide what to write.
pub async fn plan(objs: &Objects, ctx: &VCtx, mut o: Object) -> Plan {
    defaults(&mut o);
    let errs = validate::validate(&o, ctx);
    if !errs.is_empty() {
        return Plan::Done(Err(errs
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; ")));
    }
    match against_others(objs, &o).await {
        Ok(errs) if errs.is_empty() => {}
        Ok(errs) => {
            return Plan::Done(Err(errs
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; ")))
        }
        Err(e) => return Plan::Done(Err(e.to_string())),
    }
    let existing = match objs.get(o.kind(), o.namespace(), o.name()).await {
        Ok(e) => e,
        Err(e) => return Plan::Done(Err(e.to_string())),
    };
    match existing {
        None => {
            let mut o = o;
            if let Err(e) = service_families(&mut o, None, ctx) {
                return Plan::Done(Err(e));
            }
            let ops = alloc::transition(None, svc(&o));
            Plan::Create(o, ops)
        }
        Some(old) => {
            let mut new = o;
            if let Err(e) = merge_for_update(&mut new, &old) {
                return Plan::Done(Err(e));
            }
            if let Err(e) = service_families(&mut new, Some(&old), ctx) {
                return Plan::Done(Err(e));
            }
            if podnet_store::objects::encode(&new) == podnet_store::objects::encode(&old) {
                return Plan::Done(Ok(Outcome::Unchanged));
            }
            let ops = alloc::transition(svc(&old), svc(&new));
            Plan::Update(new, ops)
        }
    }
}

/// Writes a plan for `o`; `None` when the object changed between the read
/// and the write, so the plan must be made again.
pub async fn commit(objs: &Objects, o: &Object, plan: Plan) -> Option<Result<Outcome, String>> {
    let res = match plan {
        Plan::Done(r) => return Some(r),
        Plan::Create(new, ops) => objs.create(new, ops).await.map(|_| Outcome::Created),
        Plan::Update(new, ops) => objs.update(new, ops).await.map(|_| Outcome::Configured),
    };
    match res {
        Ok(out) => Some(Ok(out)),
        // Someone else wrote it between our read and write: read again.
        Err(
            StoreError::Conflict { key, .. }
            | StoreError::AlreadyExists(key)
            | StoreError::NotFound(key),
        ) if key == o.key() => None,
        Err(e) => Some(Err(explain(&objs.store, o, e).await)),
    }
}

/// Creates or updates one object, with its reservations, atomically.
pub async fn apply_one(objs: &Objects, ctx: &VCtx, o: Object) -> Result<Outcome, String> {
    for _ in 0..5 {
        let p = plan(objs, ctx, o.clone()).await;
        if let Some(r) = commit(objs, &o, p).await {
            return r;
        }
    }
    Err(format!(
        "{} keeps changing under us; giving up",
        o.describe()
    ))
}

/// Deletes one object and releases what it held.
pub async fn delete_one(
    objs: &Objects,
    kind: Kind,
    ns: Option<&str>,
    name: &str,
) -> Result<bool, String> {
    for _ in 0..5 {
        let Some(old) = objs.get(kind, ns, name).await.map_err(|e| e.to_string())? else {
            return Ok(false);
        };
        let ops = alloc::transition(svc(&old), None);
        match objs
            .delete(kind, ns, name, old.resource_version(), ops)
            .await
        {
            Ok(_) => return Ok(true),
            Err(StoreError::Conflict { .. }) | Err(StoreError::NotFound(_)) => continue,
            Err(e) => return Err(e.to_string()),
        }
    }
    Err(format!("{kind} {name} keeps changing under us; giving up"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use podnet_api::k8s_openapi::api::core::v1::Namespace;

    fn ns(name: &str, labels: serde_json::Value) -> Object {
        let v = serde_json::json!({"metadata": {"name": name, "labels": labels}});
        Object::Namespace(Box::new(serde_json::from_value::<Namespace>(v).unwrap()))
    }

    fn labels(o: &Object) -> serde_json::Value {
        serde_json::to_value(&o.meta().labels).unwrap()
    }

    #[test]
    fn namespaces_get_their_name_label_and_a_wrong_one_is_overwritten() {
        for given in [
            serde_json::json!(null),
            serde_json::json!({"team": "blue"}),
            serde_json::json!({"team": "blue", NAMESPACE_NAME_LABEL: "other"}),
        ] {
            let mut o = ns("x", given.clone());
            defaults(&mut o);
            let mut want = if given.is_null() {
                serde_json::json!({})
            } else {
                given
            };
            want[NAMESPACE_NAME_LABEL] = "x".into();
            assert_eq!(labels(&o), want);
        }
    }

    fn pool(name: &str, addresses: serde_json::Value) -> Object {
        Object::from_value(
            serde_json::json!({"apiVersion": "podnet.io/v1", "kind": "IPAddressPool",
            "metadata": {"name": name}, "spec": {"addresses": addresses}}),
        )
        .unwrap()
    }

    /// A pool overlapping another is refused by field and pool; its own
    /// re-apply (same addresses) is not an overlap; BGP kinds are
    /// validated on the way in.
    #[tokio::test]
    async fn pools_may_not_overlap_other_pools() {
        let dir = tempfile_dir("pools");
        let url = format!("sqlite://{}", dir.join("state.db").display());
        let objs = Objects::new(podnet_store::open(&url).await.unwrap());
        let ctx = VCtx::default();
        let other = pool("other-pool", serde_json::json!(["192.0.2.0/28"]));
        assert!(matches!(
            apply_one(&objs, &ctx, other.clone()).await,
            Ok(Outcome::Created)
        ));
        assert!(matches!(
            apply_one(&objs, &ctx, other).await,
            Ok(Outcome::Unchanged)
        ));
        let e = apply_one(
            &objs,
            &ctx,
            pool(
                "mine",
                serde_json::json!(["198.51.100.0/24", "192.0.2.0/28"]),
            ),
        )
        .await
        .err()
        .unwrap();
        assert_eq!(
            e,
            "spec.addresses[1]: 192.0.2.0/28 overlaps pool other-pool"
        );
        let e = apply_one(
            &objs,
            &ctx,
            pool("mine", serde_json::json!(["192.0.2.16-192.0.2.9"])),
        )
        .await
        .err()
        .unwrap();
        assert!(
            e.contains("the start 192.0.2.16 is after the end 192.0.2.9"),
            "{e}"
        );
        assert!(matches!(
            apply_one(
                &objs,
                &ctx,
                pool("mine", serde_json::json!(["192.0.2.16/28"]))
            )
            .await,
            Ok(Outcome::Created)
        ));
        let peer = Object::from_value(
            serde_json::json!({"apiVersion": "podnet.io/v1", "kind": "BGPPeer",
            "metadata": {"name": "lo"}, "spec": {"peerIP": "127.0.0.1", "asNumber": 65001}}),
        )
        .unwrap();
        let e = apply_one(&objs, &ctx, peer).await.err().unwrap();
        assert_eq!(
            e,
            "spec.peerIP: 127.0.0.1 is a loopback address: it cannot be a BGP peer"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir(what: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("podnet-admission-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Through the write path: create, then an update that drops the label
    /// or changes it, then an unchanged re-apply.
    #[tokio::test]
    async fn the_write_path_keeps_the_name_label_on_create_and_update() {
        let dir = std::env::temp_dir().join(format!("podnet-admission-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}", dir.join("state.db").display());
        let objs = Objects::new(podnet_store::open(&url).await.unwrap());
        let ctx = VCtx::default();
        let stored = |objs: Objects| async move {
            labels(&objs.get(Kind::Namespace, None, "y").await.unwrap().unwrap())
        };
        assert!(matches!(
            apply_one(&objs, &ctx, ns("y", serde_json::json!({"ns": "y"}))).await,
            Ok(Outcome::Created)
        ));
        let want = serde_json::json!({"ns": "y", NAMESPACE_NAME_LABEL: "y"});
        assert_eq!(stored(objs.clone()).await, want);
        let wrong = serde_json::json!({"ns": "y", NAMESPACE_NAME_LABEL: "z"});
        assert!(matches!(
            apply_one(&objs, &ctx, ns("y", wrong)).await,
            Ok(Outcome::Unchanged)
        ));
        assert!(matches!(
            apply_one(&objs, &ctx, ns("y", serde_json::json!({"ns": "y2"}))).await,
            Ok(Outcome::Configured)
        ));
        let want = serde_json::json!({"ns": "y2", NAMESPACE_NAME_LABEL: "y"});
        assert_eq!(stored(objs.clone()).await, want);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
