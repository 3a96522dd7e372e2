//! The `static` IPAM plugin against Debian's reference one
//! (/usr/lib/cni/static, the oracle): the same configuration and CNI_ARGS
//! give the same result (addresses, gateways, routes, DNS) or the same
//! error (code and message), for ADD, CHECK and DEL. The reference
//! prints `"dns": {}` when there is none, which ours leaves out (the spec
//! makes it optional), and ours puts `cniVersion` in errors as the spec's
//! error format has it: those two differences are normalized.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

const REFERENCE: &str = "/usr/lib/cni/static";

/// stdout as JSON (Null when empty) and the exit status.
fn call(ours: bool, cmd: &str, conf: &str, args: &str) -> (Value, bool) {
    let mut c = match ours {
        true => {
            let mut c = Command::new(env!("CARGO_BIN_EXE_podnet"));
            c.args(["cni", "run", "static"]);
            c
        }
        false => Command::new(REFERENCE),
    };
    let mut child = c
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", "c1")
        .env("CNI_NETNS", "/proc/self/ns/net")
        .env("CNI_IFNAME", "net1")
        .env("CNI_PATH", "/usr/lib/cni")
        .env("CNI_ARGS", args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", if ours { "podnet" } else { REFERENCE }));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let mut v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    if v.get("dns") == Some(&json!({})) {
        v.as_object_mut().unwrap().remove("dns");
    }
    // An error: its code and message (ours also names the cniVersion, as
    // the spec's error format has it).
    if let Some(code) = v.get("code").cloned() {
        v = json!({"code": code, "msg": v["msg"]});
    }
    (v, o.status.success())
}

fn conf(ipam: Value, extra: Value) -> String {
    let mut c = json!({"cniVersion": "1.0.0", "name": "net1", "type": "macvlan", "ipam": ipam});
    if let (Some(c), Some(e)) = (c.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    c.to_string()
}

/// One address, as most cases configure.
fn one() -> Value {
    json!({"type": "static", "addresses": [{"address": "10.10.0.1/24"}]})
}

/// The ADD cases: (what, configuration, CNI_ARGS). One line each.
#[rustfmt::skip]
fn add_cases() -> Vec<(&'static str, String, &'static str)> {
    let basic = json!({"type": "static",
        "addresses": [{"address": "10.10.0.1/24", "gateway": "10.10.0.254"}, {"address": "3ffe:ffff:0:01ff::1/64"}],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.10.5.1"}],
        "dns": {"nameservers": ["8.8.8.8"], "domain": "example.com", "search": ["example.com"], "options": ["ndots:2"]}});
    let none = json!({"type": "static"});
    let addr = |a: Value| json!({"type": "static", "addresses": [a]});
    let bad_route = |r: Value| json!({"type": "static", "addresses": [{"address": "10.10.0.1/24"}], "routes": [r]});
    vec![
        ("basic", conf(basic.clone(), json!({})), ""),
        ("0.4.0 output", conf(basic, json!({"cniVersion": "0.4.0"})), ""),
        ("no addresses", conf(none.clone(), json!({})), ""),
        ("CNI_ARGS", conf(none.clone(), json!({})), "IP=10.1.0.5/16;GATEWAY=10.1.0.1"),
        ("CNI_ARGS added", conf(one(), json!({})), "IP=10.9.0.1/24,10.8.0.1/24;GATEWAY=10.8.0.254,10.9.0.254"),
        ("GATEWAY only for CNI_ARGS IPs", conf(one(), json!({})), "GATEWAY=10.10.0.9"),
        ("last IP wins", conf(one(), json!({})), "IP=10.9.0.1/24;IP=10.8.0.1/24"),
        ("IgnoreUnknown", conf(one(), json!({})), "IgnoreUnknown=1;K8S_POD_NAME=x;IP=10.9.0.1/24"),
        ("IgnoreUnknown true", conf(one(), json!({})), "IgnoreUnknown=true;K8S_POD_NAME=x"),
        ("unknown args", conf(one(), json!({})), "K8S_POD_NAME=x;FOO=1"),
        ("keys are case sensitive", conf(one(), json!({})), "ip=10.9.0.1/24"),
        ("invalid pair", conf(one(), json!({})), "IP"),
        ("bad IP", conf(one(), json!({})), "IP=bad"),
        ("bad GATEWAY", conf(one(), json!({})), "IP=10.9.0.1/24;GATEWAY=10.9.0.254,bad"),
        ("ips capability", conf(one(), json!({"runtimeConfig": {"ips": ["10.2.0.5/24"]}, "args": {"cni": {"ips": ["10.3.0.5/24"]}}})), "IP=10.9.0.1/24"),
        ("args.cni.ips", conf(none.clone(), json!({"args": {"cni": {"ips": ["10.3.0.5/24", "fd00::5/64"]}}})), ""),
        ("empty ips capability", conf(one(), json!({"runtimeConfig": {"ips": []}})), ""),
        ("bad ips entry", conf(none, json!({"runtimeConfig": {"ips": ["10.2.0.5"]}})), ""),
        ("address not CIDR", conf(addr(json!({"address": "10.10.0.1"})), json!({})), ""),
        ("address out of range", conf(addr(json!({"address": "10.10.0.300/24"})), json!({})), ""),
        ("bad gateway", conf(addr(json!({"address": "10.10.0.1/24", "gateway": "bad"})), json!({})), ""),
        ("gateway outside", conf(addr(json!({"address": "10.10.0.1/24", "gateway": "10.11.0.1"})), json!({})), ""),
        ("bad route dst", conf(bad_route(json!({"dst": "bad"})), json!({})), ""),
        ("bad route gw", conf(bad_route(json!({"dst": "10.0.0.0/8", "gw": "bad"})), json!({})), ""),
        ("no ipam", json!({"cniVersion": "1.0.0", "name": "net1", "type": "macvlan"}).to_string(), ""),
    ]
}

#[test]
fn the_same_answers_as_the_reference_plugin() {
    assert!(
        std::path::Path::new(REFERENCE).exists(),
        "{REFERENCE} is missing: scripts/test-setup.sh installs containernetworking-plugins"
    );
    let cases = add_cases();
    let one = one();
    let mut checked = 0;
    for (what, conf, args) in &cases {
        let want = call(false, "ADD", conf, args);
        let got = call(true, "ADD", conf, args);
        assert_eq!(
            got, want,
            "ADD {what}: ours (left) vs the reference (right)\n{conf}\nCNI_ARGS={args}"
        );
        checked += 1;
    }
    // CHECK needs the result ADD gave; DEL frees nothing but reads the
    // configuration.
    let prev = json!({"prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.10.0.1/24"}]}});
    for (what, conf, args) in [
        ("CHECK without prevResult", conf(one.clone(), json!({})), ""),
        ("CHECK", conf(one.clone(), prev.clone()), ""),
    ] {
        assert_eq!(
            call(true, "CHECK", &conf, args),
            call(false, "CHECK", &conf, args),
            "{what}"
        );
        checked += 1;
    }
    let del = conf(one.clone(), json!({}));
    assert_eq!(
        call(true, "DEL", &del, ""),
        call(false, "DEL", &del, ""),
        "DEL"
    );
    // Not JSON: the same code (decoding); the message is each JSON
    // parser's own.
    let (ours, theirs) = (
        call(true, "DEL", "not json", ""),
        call(false, "DEL", "not json", ""),
    );
    assert_eq!(
        (&ours.0["code"], ours.1),
        (&theirs.0["code"], theirs.1),
        "DEL not json"
    );
    assert_eq!(ours.0["code"], 6);
    checked += 2;
    assert_eq!(checked, cases.len() + 4);
}
