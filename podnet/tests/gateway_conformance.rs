//! Upstream's Gateway API conformance suite v1.6.3, profile GATEWAY-HTTP,
//! against `podnet gateway` on a fresh real-kubelet lab (issue 27), run by
//! `scripts/gateway-conformance-run.sh` with the binary under test (packed
//! by scripts/dev-image.sh): every core test must pass, and every test of
//! the extended features podnet claims.
//!
//! Needs root and the peers of scripts/test-setup.sh (which builds the
//! suite, echo-basic and its images with scripts/gateway-conformance.sh);
//! without them the script fails and the test shows why.

use std::path::Path;
use std::process::Command;

#[test]
fn the_gateway_api_conformance_profile_passes() {
    let out = tempfile::tempdir().unwrap();
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gateway-conformance-run.sh");
    // (Not GWC_OUT/report.yaml: the suite writes that one itself.)
    let report = out.path().join("gateway-api-report.yaml");
    let o = Command::new("bash")
        .arg(&script)
        .arg("--podnet")
        .arg(env!("CARGO_BIN_EXE_podnet"))
        .env("GWC_OUT", out.path())
        .env("GWC_REPORT", &report)
        .output()
        .expect("run scripts/gateway-conformance-run.sh");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let last = stdout.lines().last().unwrap_or("").to_string();
    if last != "62 passed, 0 failed, 91 skipped" {
        let kept = out.keep();
        let stderr = String::from_utf8_lossy(&o.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
        panic!(
            "scripts/gateway-conformance-run.sh (exit {:?}) said {last:?}, not 62 passed; its logs \
             are kept in {} (the suite's in /tmp/gateway-conformance.log); the end of its stderr:\n{}",
            o.status.code(),
            kept.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    assert!(o.status.success(), "exit {:?}", o.status.code());
    // The report says the profile passed: every core test, and every
    // test of the extended features claimed.
    let r = std::fs::read_to_string(&report).expect("the report");
    for want in [
        "name: GATEWAY-HTTP",
        "Passed: 36",
        "Passed: 26",
        "Core tests succeeded. Extended tests succeeded.",
    ] {
        assert!(r.contains(want), "{want:?} not in the report:\n{r}");
    }
}
