//! The kit's own promises, against the real kernel: a namespace guard
//! cleans up after a panic, a dead process fails `check` with its log, an
//! absent nft table reads as `None`, and etcd comes back on its data.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use podnet_testkit::{eventually, http_get, nft_list, Etcd, Proc, TestNs};

#[test]
fn a_namespace_goes_with_its_guard_even_after_a_panic() {
    let mut name = String::new();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let ns = TestNs::new("kit");
        name = ns.name().to_string();
        assert!(Path::new("/run/netns").join(&name).exists());
        assert_eq!(ns.sh("echo inside").trim(), "inside");
        panic!("the test fails here");
    }));
    assert!(r.is_err());
    assert!(name.starts_with("pn-kit-"), "{name}");
    assert!(!Path::new("/run/netns").join(&name).exists(), "{name} left");
}

#[test]
fn an_absent_table_is_none_and_a_present_one_is_listed() {
    let ns = TestNs::new("kitnft");
    assert_eq!(ns.nft_list("table inet kit"), None);
    ns.nft("add table inet kit");
    let t = nft_list(Some(ns.name()), "table inet kit").expect("the table");
    assert!(t.contains("table inet kit"), "{t}");
}

#[test]
fn a_process_that_died_fails_check_with_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let ns = TestNs::new("kitproc");
    let mut cmd = ns.command("sh");
    cmd.args(["-c", "echo last words; exit 3"]);
    let p = Proc::spawn("quitter", cmd, dir.path());
    eventually("the process to exit", Duration::from_secs(10), || {
        !p.alive()
    });
    let e = std::panic::catch_unwind(|| p.check()).unwrap_err();
    let msg = e.downcast_ref::<String>().unwrap();
    assert!(
        msg.contains("quitter exited") && msg.contains("last words"),
        "{msg}"
    );
    let mut cmd = Command::new("sleep");
    cmd.arg("60");
    let mut p = Proc::spawn("sleeper", cmd, dir.path());
    p.check();
    let st = p.terminate(Duration::from_secs(10));
    assert!(!st.success(), "killed by SIGTERM: {st:?}");
}

#[test]
fn etcd_in_a_namespace_comes_back_on_its_data_and_ports() {
    let ns = TestNs::new("kitetcd");
    let mut etcd = Etcd::start_in(&ns);
    let health = |etcd: &Etcd| {
        let port: u16 = etcd.url().rsplit(':').next().unwrap().parse().unwrap();
        http_get(Some(ns.netns()), ([127, 0, 0, 1], port).into(), "/health")
    };
    assert!(health(&etcd).is_some_and(|(code, _)| code == 200));
    let data = etcd.data_dir();
    assert!(data.join("member").exists(), "{}", data.display());
    etcd.kill();
    assert_eq!(health(&etcd), None, "nothing answers while it is down");
    etcd.restart();
    assert!(health(&etcd).is_some_and(|(code, _)| code == 200));
    assert_eq!(etcd.data_dir(), data);
    etcd.check();
}
