//! `podnet apply`, `get` and `delete`: kubectl's verbs against podnet's store.
//!
//! apply reads and decodes every source first and writes nothing if any
//! document cannot be read. Then it applies the documents in order, each
//! decoded, validated and written in one transaction together with its
//! ClusterIP/NodePort reservations, so an earlier document wins a conflict
//! with a later one. A rejected document is named (file, document, line,
//! field) and leaves its object untouched; the others are still applied.

use std::collections::{HashSet, VecDeque};
use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use podnet_api::{manifest, selector, Kind, Object};
use podnet_apiserver::admission::{apply_one, commit, context, delete_one, plan, Outcome};
use podnet_store::Objects;

mod table;
mod table_l7;
use table::print_table;

/// What `podnet apply --help` says about reading and ordering.
pub const APPLY_HELP: &str = "\
Every source is read and decoded before anything is written: FILE, each \
.json/.yaml/.yml file of DIR in name order (as kubectl walks it), or - for \
stdin. If any document cannot be parsed or is not a known kind, nothing is \
applied, and each such document is named by file, index and starting line.

Then the documents are applied one at a time, in order: each is validated \
and written in its own transaction with its ClusterIP/NodePort \
reservations, so when two documents conflict (one clusterIP asked for \
twice), the earlier one wins. A document that is rejected (validation, a \
taken address, an immutable field) changes nothing and is named; the \
others are still applied, and the command fails with the count of each.

As in kubectl, empty, comment-only and null documents are skipped, input \
with no object at all fails with \"no objects passed to apply\", and a \
leading byte order mark is honoured (UTF-8 dropped, UTF-16 transcoded).";

/// The bytes of each source: FILE, each *.json/*.yaml/*.yml in DIR in name
/// order (kubectl's walk: no recursion, an explicit FILE needs no
/// extension), or stdin for "-".
fn sources(paths: &[PathBuf]) -> Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    for p in paths {
        if p.as_os_str() == "-" {
            let mut s = Vec::new();
            std::io::stdin()
                .read_to_end(&mut s)
                .context("reading stdin")?;
            out.push(("<stdin>".to_string(), s));
        } else if p.is_dir() {
            let mut files = Vec::new();
            for e in std::fs::read_dir(p).with_context(|| format!("reading {}", p.display()))? {
                let f = e
                    .with_context(|| format!("reading {}", p.display()))?
                    .path();
                let ext = f.extension().and_then(|e| e.to_str());
                if matches!(ext, Some("yaml" | "yml" | "json")) && !f.is_dir() {
                    files.push(f);
                }
            }
            if files.is_empty() {
                // kubectl's words for a directory with nothing to read.
                bail!(
                    "error reading [{}]: recognized file extensions are [.json .yaml .yml]",
                    p.display()
                );
            }
            files.sort();
            for f in files {
                let s = std::fs::read(&f).with_context(|| format!("reading {}", f.display()))?;
                out.push((f.display().to_string(), s));
            }
        } else if !p.exists() {
            bail!("the path {:?} does not exist", p.display().to_string());
        } else {
            let s = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
            out.push((p.display().to_string(), s));
        }
    }
    Ok(out)
}

/// A decoded document and the source it came from.
struct Item {
    src: Arc<str>,
    doc: manifest::Doc,
}

impl Item {
    /// "a.yaml document 2 at line 7", for summaries.
    fn short(&self) -> String {
        format!("{} {}", self.src, self.doc.pos.describe(None))
    }
}

/// Reads and decodes every source, or fails naming each document that
/// could not be read; `verb` says what did not happen because of it.
fn read_all(paths: &[PathBuf], verb: &str) -> Result<Vec<Item>> {
    let mut items = Vec::new();
    let mut bad = Vec::new();
    for (src, bytes) in sources(paths)? {
        let src: Arc<str> = src.into();
        match manifest::parse(&bytes) {
            Ok(docs) => items.extend(docs.into_iter().map(|doc| Item {
                src: src.clone(),
                doc,
            })),
            Err(errs) => {
                for e in errs {
                    eprintln!("error: {src}: {e}");
                    bad.push(format!("{src} {}", e.pos.describe(None)));
                }
            }
        }
    }
    if !bad.is_empty() {
        bail!(
            "{} document(s) could not be read ({}); nothing was {verb}",
            bad.len(),
            bad.join(", ")
        );
    }
    Ok(items)
}

fn short(kind: Kind) -> String {
    kind.name().to_ascii_lowercase()
}

/// How many documents are validated and read ahead of the one being
/// written. Only the reads overlap: writes go one at a time in document
/// order, each committed before the next is sent.
const APPLY_WINDOW: usize = 64;

pub async fn apply(objs: &Objects, files: &[PathBuf]) -> Result<()> {
    let items = read_all(files, "applied")?;
    if items.is_empty() {
        bail!("no objects passed to apply");
    }
    let ctx = context(objs).await?;
    let mut failed = Vec::new();
    // Objects written by earlier documents: a plan read before that write
    // is stale, so such a document is planned again.
    let mut written = HashSet::new();
    let mut ahead = VecDeque::with_capacity(APPLY_WINDOW);
    let mut next = 0;
    for item in &items {
        while next < items.len() && ahead.len() < APPLY_WINDOW {
            let (objs, ctx) = (objs.clone(), ctx.clone());
            let o = items[next].doc.object.clone();
            ahead.push_back(tokio::spawn(async move { plan(&objs, &ctx, o).await }));
            next += 1;
        }
        let planned = match ahead.pop_front() {
            Some(task) => task.await.context("apply task")?,
            None => bail!("internal: no plan for {}", item.short()),
        };
        let o = &item.doc.object;
        let key = o.key();
        let fresh = if written.contains(&key) {
            None
        } else {
            commit(objs, o, planned).await
        };
        let res = match fresh {
            Some(r) => r,
            None => apply_one(objs, &ctx, o.clone()).await,
        };
        let what = format!("{}/{}", short(o.kind()), o.name());
        match res {
            Ok(Outcome::Created) => println!("{what} created"),
            Ok(Outcome::Configured) => println!("{what} configured"),
            Ok(Outcome::Unchanged) => println!("{what} unchanged"),
            Err(e) => {
                eprintln!("error: {}: {}: {e}", item.src, item.doc.describe());
                failed.push(item.short());
                continue;
            }
        }
        written.insert(key);
    }
    if !failed.is_empty() {
        bail!(
            "{} of {} document(s) failed ({}); the other {} were applied",
            failed.len(),
            items.len(),
            failed.join(", "),
            items.len() - failed.len()
        );
    }
    Ok(())
}

pub async fn delete(
    objs: &Objects,
    files: &[PathBuf],
    kind: Option<String>,
    names: Vec<String>,
    ns: Option<String>,
    ignore_not_found: bool,
) -> Result<()> {
    let mut targets: Vec<(Kind, Option<String>, String)> = read_all(files, "deleted")?
        .into_iter()
        .map(|i| {
            let o = i.doc.object;
            (
                o.kind(),
                o.namespace().map(String::from),
                o.name().to_string(),
            )
        })
        .collect();
    let mut failed = 0;
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
