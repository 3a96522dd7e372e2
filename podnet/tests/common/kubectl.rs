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
    let dir = PathBuf::from(format!("/run/podnet-lab/{lab}"));
    run_as(kubectl, &dir.join("kubeconfig"), &dir, args, stdin)
}

/// `kubectl ARGS` with `kubeconfig`, its cache under `dir`, and `stdin` on
/// its standard input (for a control plane without a lab around it).
pub fn run_as(
    kubectl: &std::path::Path,
    kubeconfig: &std::path::Path,
    dir: &std::path::Path,
    args: &[&str],
    stdin: Option<&str>,
) -> Output {
    let mut p = Command::new(kubectl)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!(
            "--cache-dir={}",
            dir.join("kubectl-cache").display()
        ))
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
