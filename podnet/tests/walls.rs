//! Walls the build keeps (issue 25), checked from `cargo metadata` and the
//! sources, so a change that breaks one fails CI instead of waiting for a
//! review:
//! - only the object source, the standalone API server and the tools (the
//!   lab, the binary, the benchmarks, the test kit) list `podnet-store`:
//!   every consumer learns cluster state from the source it is handed;
//! - every declared dependency is used (what `cargo machete` checks, with
//!   no tool to install on a fresh machine): an unused one costs build
//!   time and hides which crate really needs what.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Crates that may read or write the store directly.
const STORE_USERS: &[&str] = &[
    "podnet-source",
    "podnet-apiserver",
    "podnet-lab",
    "podnet",
    "podnet-bench",
    "podnet-testkit",
];

/// Dependencies used without being named in code, with the reason.
const USED_UNNAMED: &[(&str, &str, &str)] = &[];

fn metadata() -> serde_json::Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let o = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .expect("cargo metadata");
    assert!(
        o.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn packages(m: &serde_json::Value) -> Vec<serde_json::Value> {
    m["packages"].as_array().unwrap().clone()
}

#[test]
fn only_the_source_the_api_server_and_the_tools_list_the_store() {
    let m = metadata();
    let mut listing = BTreeSet::new();
    for p in packages(&m) {
        let name = p["name"].as_str().unwrap().to_string();
        let deps = p["dependencies"].as_array().unwrap();
        if deps.iter().any(|d| d["name"] == "podnet-store") {
            listing.insert(name);
        }
    }
    assert!(listing.contains("podnet-source"), "{listing:?}");
    let strays: Vec<&String> = listing
        .iter()
        .filter(|n| !STORE_USERS.contains(&n.as_str()))
        .collect();
    assert!(
        strays.is_empty(),
        "{strays:?} list podnet-store: only the object source reads the store \
         (hand the crate a built Source or Subscription instead)"
    );
}

/// The Rust files of a package: its sources, tests, benchmarks, examples
/// and build script.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let name = e.file_name();
            if p.is_dir() && name != "target" && !name.to_string_lossy().starts_with('.') {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out
}

/// The code of a file with `//` comments cut off (doc comments name crates
/// they do not use).
fn code(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `ident` appears in `text` as a path root (`ident::`), an import
/// (`use ident`, `extern crate ident`) or a macro (`ident!`).
fn names(text: &str, ident: &str) -> bool {
    let ok_before = |c: Option<char>| c.is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
    text.match_indices(ident).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = &text[i + ident.len()..];
        ok_before(before)
            && ok_before(after.chars().next())
            && (after.starts_with("::")
                || after.starts_with('!')
                || after.starts_with(';')
                || after.starts_with(" as ")
                || text[..i].ends_with("use ")
                || text[..i].ends_with("crate "))
    })
}

#[test]
fn every_declared_dependency_is_used() {
    let m = metadata();
    let mut unused = Vec::new();
    for p in packages(&m) {
        let name = p["name"].as_str().unwrap();
        let dir = Path::new(p["manifest_path"].as_str().unwrap())
            .parent()
            .unwrap()
            .to_path_buf();
        let text: String = rust_files(&dir).iter().map(|f| code(f)).collect();
        for d in p["dependencies"].as_array().unwrap() {
            let dep = d["rename"].as_str().unwrap_or(d["name"].as_str().unwrap());
            let ident = dep.replace('-', "_");
            let excused = USED_UNNAMED
                .iter()
                .any(|(pk, dp, _)| *pk == name && *dp == dep);
            if !excused && !names(&text, &ident) {
                let kind = d["kind"].as_str().unwrap_or("normal");
                unused.push(format!("{name}: {dep} ({kind})"));
            }
        }
    }
    assert!(
        unused.is_empty(),
        "declared but never used (remove them from Cargo.toml, or name the \
         reason in USED_UNNAMED):\n{}",
        unused.join("\n")
    );
}

#[test]
fn the_name_check_tells_use_from_mention() {
    assert!(names("use serde::Deserialize;", "serde"));
    assert!(names("x = tokio::spawn(f);", "tokio"));
    assert!(names("let v = serde_json::json!({});", "serde_json"));
    assert!(names("#[derive(serde::Serialize)]", "serde"));
    assert!(!names("let serde_ish = 1;", "serde"));
    assert!(!names("podnet_store_like::x()", "podnet_store"));
    assert!(!names("my_libc::x()", "libc"));
    assert!(!names("use serde_json::Value;", "serde"));
}
