//! CI's slice of upstream's own suites on real kubelets (issue 24): one
//! `[Conformance]` Services spec and one NetworkPolicy spec of upstream's
//! `e2e.test` v1.37.2, run by `scripts/e2e.sh custom` on a fresh
//! real-kubelet lab with podnet installed from deploy/podnet.yaml (the
//! binary under test, packed by scripts/dev-image.sh). The whole suites
//! run from the script (README's table), not in CI.
//!
//! Needs root and the peers of scripts/test-setup.sh (which builds
//! `e2e.test` too); without them the script fails and the test shows why.

use std::path::Path;
use std::process::Command;

/// Exactly two specs: a Service's ClusterIP to its endpoints, and a
/// default-deny ingress policy cutting TCP between pods.
const FOCUS: &str = "Services should serve a basic endpoint from pods|\
     Netpol NetworkPolicy between server and client should support a 'default-deny-ingress' policy";

#[test]
fn upstreams_conformance_and_networkpolicy_slice_passes_on_real_kubelets() {
    let out = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/e2e.sh");
    let o = Command::new("bash")
        .arg(&script)
        .args(["custom", "--focus", FOCUS, "--podnet"])
        .arg(env!("CARGO_BIN_EXE_podnet"))
        .env("E2E_OUT", out.path())
        .output()
        .expect("run scripts/e2e.sh");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let last = stdout.lines().last().unwrap_or("").to_string();
    if last != "2 passed, 0 failed, 0 skipped" {
        let kept = out.keep();
        let stderr = String::from_utf8_lossy(&o.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
        panic!(
            "scripts/e2e.sh (exit {:?}) said {last:?}, not 2 passed; its output, the \
             JUnit file and e2e.log are kept in {}; the end of its stderr:\n{}",
            o.status.code(),
            kept.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    assert!(o.status.success(), "exit {:?}", o.status.code());
    // The JUnit file names both specs as run and passed.
    let junit = std::fs::read_dir(out.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().starts_with("junit"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .expect("a JUnit file");
    for spec in [
        "Services should serve a basic endpoint from pods [Conformance]",
        "should support a &#39;default-deny-ingress&#39; policy [Feature:NetworkPolicy]",
    ] {
        assert!(junit.contains(spec), "{spec} not in the JUnit file");
    }
}
