//! `podnet apply`, `get` and `delete`: kubectl's verbs against podnet's store.
//!
//! apply is all-or-nothing per document: a document is decoded, validated,
//! and written in one transaction together with its ClusterIP/NodePort
//! reservations; a failure names the file, the document and the field, and
//! leaves that object untouched.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::netconfig;
use podnet_api::validate::{self, Context as VCtx};
use podnet_api::{manifest, selector, Kind, Object};
use podnet_store::{alloc, AnyStore, Objects, StoreError};

/// Reads FILE, every *.yaml/*.yml/*.json in DIR (sorted), or stdin for "-".
fn sources(paths: &[PathBuf]) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for p in paths {
        if p.as_os_str() == "-" {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading stdin")?;
            out.push(("<stdin>".to_string(), s));
        } else if p.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading {}", p.display()))?
                .flatten()
                .map(|e| e.path())
                .filter(|f| {
                    matches!(
                        f.extension().and_then(|e| e.to_str()),
                        Some("yaml" | "yml" | "json")
                    )
                })
                .collect();
            files.sort();
            for f in files {
                let s = std::fs::read_to_string(&f)
                    .with_context(|| format!("reading {}", f.display()))?;
                out.push((f.display().to_string(), s));
            }
        } else {
            let s =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            out.push((p.display().to_string(), s));
        }
    }
    Ok(out)
}

/// The validation context from the cluster's NetworkConfig.
pub async fn context(objs: &Objects) -> Result<VCtx> {
    let cfg = objs
        .get(Kind::NetworkConfig, None, netconfig::DEFAULT_NAME)
        .await?;
    Ok(match cfg {
        Some(Object::NetworkConfig(c)) => VCtx::from_config(Some(&c)),
        _ => VCtx::default(),
    })
}

fn short(kind: Kind) -> String {
    kind.name().to_ascii_lowercase()
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
                (None | Some(""), Some(ip))
                    if !ip.is_empty() && ns.type_.as_deref() != Some("ExternalName") =>
                {
                    ns.cluster_ip = os.cluster_ip.clone();
                    ns.cluster_ips = os.cluster_ips.clone();
                }
                (Some(a), Some(b)) if a != b && !b.is_empty() && same_type => {
                    return Err(format!("spec.clusterIP: field is immutable ({b} -> {a})"));
                }
                _ => {}
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

/// Creates or updates one object, with its reservations, atomically.
pub async fn apply_one(objs: &Objects, ctx: &VCtx, mut o: Object) -> Result<Outcome, String> {
    let errs = validate::validate(&o, ctx);
    if !errs.is_empty() {
        return Err(errs
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; "));
    }
    for _ in 0..5 {
        let existing = objs
            .get(o.kind(), o.namespace(), o.name())
            .await
            .map_err(|e| e.to_string())?;
        let res = match &existing {
            None => {
                let ops = alloc::transition(None, svc(&o));
                objs.create(o.clone(), ops).await.map(|_| Outcome::Created)
            }
            Some(old) => {
                let mut new = o.clone();
                merge_for_update(&mut new, old)?;
                if podnet_store::objects::encode(&new) == podnet_store::objects::encode(old) {
                    return Ok(Outcome::Unchanged);
                }
                let ops = alloc::transition(svc(old), svc(&new));
                objs.update(new, ops).await.map(|_| Outcome::Configured)
            }
        };
        match res {
            Ok(out) => return Ok(out),
            // Someone else wrote it between our read and write: read again.
            Err(StoreError::Conflict { key, .. }) | Err(StoreError::AlreadyExists(key))
                if key == o.key() =>
            {
                continue
            }
            Err(StoreError::NotFound(key)) if key == o.key() => continue,
            Err(e) => return Err(explain(&objs.store, &o, e).await),
        }
    }
    o.meta_mut().resource_version = None;
    Err(format!(
        "{} keeps changing under us; giving up",
        o.describe()
    ))
}

/// How many documents are written at once. Documents are independent, so
/// overlapping their round trips (etcd) changes nothing but the time; output
/// stays in document order.
const APPLY_WINDOW: usize = 64;

pub async fn apply(objs: &Objects, files: &[PathBuf]) -> Result<()> {
    let ctx = context(objs).await?;
    let mut failed = 0;
    for (src, text) in sources(files)? {
        let docs = manifest::parse(&text);
        let mut it = docs.into_iter().peekable();
        while it.peek().is_some() {
            let window: Vec<manifest::Doc> = it.by_ref().take(APPLY_WINDOW).collect();
            // The same object twice in one window must be applied in order.
            let mut keys = std::collections::HashSet::new();
            let distinct = window.iter().all(|d| {
                d.result
                    .as_ref()
                    .map(|o| keys.insert(o.key()))
                    .unwrap_or(true)
            });
            let mut results = Vec::with_capacity(window.len());
            let mut tasks = tokio::task::JoinSet::new();
            for (i, doc) in window.iter().enumerate() {
                let Ok(o) = &doc.result else { continue };
                let (objs, ctx, o) = (objs.clone(), ctx.clone(), o.clone());
                let what = format!("{}/{}", short(o.kind()), o.name());
                if distinct {
                    tasks.spawn(async move {
                        (i, apply_one(&objs, &ctx, o).await.map(|out| (what, out)))
                    });
                } else {
                    results.push((i, apply_one(&objs, &ctx, o).await.map(|out| (what, out))));
                }
            }
            while let Some(r) = tasks.join_next().await {
                results.push(r.map_err(|e| anyhow::anyhow!("apply task: {e}"))?);
            }
            results.sort_by_key(|(i, _)| *i);
            let mut res_iter = results.into_iter().peekable();
            for (i, doc) in window.iter().enumerate() {
                let res = match &doc.result {
                    Err(e) => Err(e.to_string()),
                    Ok(_) => match res_iter.next() {
                        Some((j, r)) if j == i => r,
                        _ => Err("internal: result missing".to_string()),
                    },
                };
                match res {
                    Ok((what, Outcome::Created)) => println!("{what} created"),
                    Ok((what, Outcome::Configured)) => println!("{what} configured"),
                    Ok((what, Outcome::Unchanged)) => println!("{what} unchanged"),
                    Err(e) => {
                        failed += 1;
                        eprintln!("error: {src}: document {} ({}): {e}", doc.index, doc.label);
                    }
                }
            }
        }
    }
    if failed > 0 {
        bail!("{failed} document(s) failed; the others were applied");
    }
    Ok(())
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

pub async fn delete(
    objs: &Objects,
    files: &[PathBuf],
    kind: Option<String>,
    names: Vec<String>,
    ns: Option<String>,
    ignore_not_found: bool,
) -> Result<()> {
    let mut targets: Vec<(Kind, Option<String>, String)> = Vec::new();
    let mut failed = 0;
    for (src, text) in sources(files)? {
        for doc in manifest::parse(&text) {
            match doc.result {
                Ok(o) => targets.push((
                    o.kind(),
                    o.namespace().map(String::from),
                    o.name().to_string(),
                )),
                Err(e) => {
                    failed += 1;
                    eprintln!("error: {src}: document {} ({}): {e}", doc.index, doc.label);
                }
            }
        }
    }
    if let Some(k) = kind {
        let k = Kind::parse(&k)?;
        if names.is_empty() {
            bail!(
                "delete {k}: name a resource (podnet delete {} NAME)",
                short(k)
            );
        }
        for n in names {
            targets.push((k, ns.clone(), n));
        }
    }
    for (k, ns, name) in targets {
        let ns_eff = if k.namespaced() {
            Some(ns.as_deref().unwrap_or("default"))
        } else {
            None
        };
        match delete_one(objs, k, ns_eff, &name).await {
            Ok(true) => println!("{} \"{name}\" deleted", short(k)),
            Ok(false) if ignore_not_found => {}
            Ok(false) => {
                failed += 1;
                eprintln!(
                    "Error from server (NotFound): {} \"{name}\" not found",
                    k.plural()
                );
            }
            Err(e) => {
                failed += 1;
                eprintln!("error: deleting {} {name}: {e}", short(k));
            }
        }
    }
    if failed > 0 {
        bail!("{failed} deletion(s) failed");
    }
    Ok(())
}

fn age(o: &Object) -> String {
    let Some(t) = &o.meta().creation_timestamp else {
        return "<unknown>".into();
    };
    let secs = (podnet_store::objects::now().as_second() - t.0.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn table_row(o: &Object, wide: bool) -> (Vec<&'static str>, Vec<String>) {
    let name = o.name().to_string();
    match o {
        Object::Service(s) => {
            let spec = s.spec.clone().unwrap_or_default();
            let ty = spec.type_.clone().unwrap_or_else(|| "ClusterIP".into());
            let cip = match ty.as_str() {
                "ExternalName" => "<none>".to_string(),
                _ => spec
                    .cluster_ip
                    .clone()
                    .filter(|c| !c.is_empty())
                    .unwrap_or_else(|| "<pending>".into()),
            };
            let mut ext: Vec<String> = spec.external_ips.clone().unwrap_or_default();
            for i in s
                .status
                .iter()
                .flat_map(|st| st.load_balancer.iter())
                .flat_map(|lb| lb.ingress.iter().flatten())
            {
                ext.extend(i.ip.clone());
            }
            let ext = if ty == "ExternalName" {
                spec.external_name.clone().unwrap_or_default()
            } else if ext.is_empty() {
                if ty == "LoadBalancer" {
                    "<pending>".into()
                } else {
                    "<none>".into()
                }
            } else {
                ext.join(",")
            };
            let ports = spec
                .ports
                .iter()
                .flatten()
                .map(|p| {
                    let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
                    match p.node_port {
                        Some(np) => format!("{}:{np}/{proto}", p.port),
                        None => format!("{}/{proto}", p.port),
                    }
                })
                .collect::<Vec<_>>()
                .join(",");
            let mut cols = vec![
                "NAME",
                "TYPE",
                "CLUSTER-IP",
                "EXTERNAL-IP",
                "PORT(S)",
                "AGE",
            ];
            let mut row = vec![
                name,
                ty,
                cip,
                ext,
                if ports.is_empty() {
                    "<none>".into()
                } else {
                    ports
                },
                age(o),
            ];
            if wide {
                cols.push("SELECTOR");
                row.push(
                    spec.selector
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| format!("{k}={v}"))
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .unwrap_or_else(|| "<none>".into()),
                );
            }
            (cols, row)
        }
        Object::Pod(p) => {
            let st = p.status.clone().unwrap_or_default();
            let ready = st
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let n = p
                .spec
                .as_ref()
                .map(|s| s.containers.len())
                .unwrap_or(0)
                .max(1);
            let mut cols = vec!["NAME", "READY", "STATUS", "RESTARTS", "AGE"];
            let mut row = vec![
                name,
                format!("{}/{n}", if ready { n } else { 0 }),
                if p.metadata.deletion_timestamp.is_some() {
                    "Terminating".into()
                } else {
                    st.phase.clone().unwrap_or_else(|| "Pending".into())
                },
                "0".into(),
                age(o),
            ];
            if wide {
                cols.extend(["IP", "NODE"]);
                row.push(st.pod_ip.clone().unwrap_or_else(|| "<none>".into()));
                row.push(
                    p.spec
                        .as_ref()
                        .and_then(|s| s.node_name.clone())
                        .unwrap_or_else(|| "<none>".into()),
                );
            }
            (cols, row)
        }
        Object::Node(nd) => {
            let ready = nd
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let mut cols = vec!["NAME", "STATUS", "ROLES", "AGE", "VERSION"];
            let mut row = vec![
                name,
                if ready { "Ready" } else { "NotReady" }.into(),
                "<none>".into(),
                age(o),
                "podnet".into(),
            ];
            if wide {
                cols.extend(["INTERNAL-IP", "POD-CIDR"]);
                row.push(
                    nd.status
                        .iter()
                        .flat_map(|s| s.addresses.iter().flatten())
                        .find(|a| a.type_ == "InternalIP")
                        .map(|a| a.address.clone())
                        .unwrap_or_else(|| "<none>".into()),
                );
                row.push(
                    nd.spec
                        .as_ref()
                        .and_then(|s| s.pod_cidr.clone())
                        .unwrap_or_else(|| "<none>".into()),
                );
            }
            (cols, row)
        }
        Object::Namespace(n) => (
            vec!["NAME", "STATUS", "AGE"],
            vec![
                name,
                n.status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_else(|| "Active".into()),
                age(o),
            ],
        ),
        Object::EndpointSlice(s) => {
            let ports = s
                .ports
                .iter()
                .flatten()
                .filter_map(|p| p.port.map(|x| x.to_string()))
                .collect::<Vec<_>>()
                .join(",");
            let eps: Vec<String> = s
                .endpoints
                .iter()
                .flat_map(|e| e.addresses.iter().cloned())
                .collect();
            let eps = if eps.is_empty() {
                "<unset>".into()
            } else if eps.len() > 3 && !wide {
                format!("{} + {} more...", eps[..3].join(","), eps.len() - 3)
            } else {
                eps.join(",")
            };
            (
                vec!["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"],
                vec![
                    name,
                    s.address_type.clone(),
                    if ports.is_empty() {
                        "<unset>".into()
                    } else {
                        ports
                    },
                    eps,
                    age(o),
                ],
            )
        }
        Object::NetworkPolicy(p) => {
            let sel = p
                .spec
                .as_ref()
                .and_then(|s| s.pod_selector.as_ref())
                .and_then(|s| s.match_labels.clone())
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "<none>".into());
            (vec!["NAME", "POD-SELECTOR", "AGE"], vec![name, sel, age(o)])
        }
        Object::NetworkConfig(c) => {
            let r = c.resolve();
            let (net, len, be) = match &r {
                Ok(r) => (
                    r.network.to_string(),
                    r.subnet_len.to_string(),
                    format!("{:?}", r.backend).to_ascii_lowercase(),
                ),
                Err((f, m)) => (format!("invalid: {f}: {m}"), String::new(), String::new()),
            };
            (
                vec!["NAME", "NETWORK", "SUBNETLEN", "BACKEND", "AGE"],
                vec![name, net, len, be, age(o)],
            )
        }
    }
}

fn print_table(objs: &[Object], wide: bool, with_ns: bool) {
    if objs.is_empty() {
        return;
    }
    let mut header: Vec<String> = Vec::new();
    let mut rows: Vec<Vec<String>> = Vec::new();
    for o in objs {
        let (cols, mut row) = table_row(o, wide);
        if with_ns {
            row.insert(0, o.namespace().unwrap_or_default().to_string());
        }
        if header.is_empty() {
            header = cols.iter().map(|s| s.to_string()).collect();
            if with_ns {
                header.insert(0, "NAMESPACE".into());
            }
        }
        rows.push(row);
    }
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}   ", w = widths[i]));
            }
        }
        println!("{}", s.trim_end());
    };
    line(&header);
    for r in &rows {
        line(r);
    }
}

#[allow(clippy::too_many_arguments)]
pub async fn get(
    objs: &Objects,
    kind: &str,
    name: Option<String>,
    ns: Option<String>,
    all_ns: bool,
    output: Option<String>,
    labels: Option<String>,
) -> Result<()> {
    let kind = Kind::parse(kind)?;
    let ns_eff: Option<String> = if !kind.namespaced() || all_ns {
        None
    } else {
        Some(ns.unwrap_or_else(|| "default".into()))
    };
    let sel = labels.as_deref().map(selector::parse).transpose()?;
    let items: Vec<Object> = match &name {
        Some(n) => match objs
            .get(kind, ns_eff.as_deref().or(Some("default")), n)
            .await?
        {
            Some(o) => vec![o],
            None => bail!(
                "Error from server (NotFound): {} \"{n}\" not found",
                kind.plural()
            ),
        },
        None => match &sel {
            Some(s) => objs.list_selected(kind, ns_eff.as_deref(), s).await?.0,
            None => objs.list(kind, ns_eff.as_deref()).await?.0,
        },
    };
    match output.as_deref() {
        Some("json") | Some("yaml") => {
            let v = if name.is_some() {
                items[0].to_value()
            } else {
                serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items.iter().map(|o| o.to_value()).collect::<Vec<_>>()})
            };
            if output.as_deref() == Some("json") {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", serde_yaml::to_string(&v)?);
            }
        }
        Some("name") => {
            for o in &items {
                println!("{}/{}", short(o.kind()), o.name());
            }
        }
        None | Some("wide") => {
            if items.is_empty() {
                match &ns_eff {
                    Some(n) => eprintln!("No resources found in {n} namespace."),
                    None => eprintln!("No resources found"),
                }
            }
            print_table(
                &items,
                output.as_deref() == Some("wide"),
                all_ns && kind.namespaced(),
            );
        }
        Some(o) => bail!("unknown output format {o:?} (yaml, json, wide, name)"),
    }
    Ok(())
}
