//! The real kubectl for tests against a lab's apiserver: found as the lab
//! finds its Kubernetes binaries (`scripts/k8s-peers.sh`'s cache, or
//! `KUBECTL`), run with the lab's admin kubeconfig and a private cache dir,
//! fed `stdin`. One runner for every test file that talks to a kube lab.

#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// The kubectl binary; panics naming the script that builds it.
pub fn path() -> PathBuf {
    podnet_lab::kube::Peers::find()
        .unwrap_or_else(|e| panic!("{e}\n(the binaries come from scripts/k8s-peers.sh)"))
        .kubectl
}

/// `kubectl ARGS` against lab `lab` as its admin, with `stdin` on its
/// standard input.
pub fn run(kubectl: &std::path::Path, lab: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut p = Command::new(kubectl)
        .arg(format!("--kubeconfig=/run/podnet-lab/{lab}/kubeconfig"))
        .arg(format!("--cache-dir=/run/podnet-lab/{lab}/kubectl-cache"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", kubectl.display()));
    let mut i = p.stdin.take().expect("stdin");
    if let Some(t) = stdin {
        i.write_all(t.as_bytes()).expect("writing kubectl's stdin");
    }
    drop(i);
    p.wait_with_output().expect("kubectl")
}
