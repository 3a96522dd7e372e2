//! Differential tests: the same conflist run through Debian's reference
//! plugins (/usr/lib/cni) and through ours must give equivalent results and
//! equivalent kernel state, and host-local state must carry across a switch.

mod common;

use std::path::Path;

use common::*;
use podnet_cni::runtime::Runtime;
use podnet_cni::Command;
use serde_json::{json, Value};

fn list(state: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "diff",
        "plugins": [
            {"type": "bridge", "bridge": "pndiff0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
             "ipam": {"type": "host-local", "dataDir": state.join("ipam"),
                      "ranges": [[{"subnet": "10.220.0.0/24", "gateway": "10.220.0.1"}]],
                      "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.0.2.0/24", "gw": "10.220.0.254"}]}},
            {"type": "portmap", "capabilities": {"portMappings": true}, "stateDir": state.join("pm")},
            {"type": "bandwidth", "capabilities": {"bandwidth": true}}
        ]
    })
}

/// What must be equal between the two implementations.
#[derive(Debug, PartialEq)]
struct Observed {
    result_ifnames: Vec<String>,
    result_sandboxes: Vec<bool>,
    ips: Value,
    routes: Value,
    pod_addrs: Vec<String>,
    pod_routes: Vec<String>,
    bridge_addrs: Vec<String>,
    host_port_ok: bool,
    pod_to_pod_source: String,
    tbf: bool,
}

fn addrs(ns: &TestNs, dev: &str) -> Vec<String> {
    let mut v: Vec<String> = ns
        .sh(&format!("ip -o -4 addr show dev {dev}"))
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3).map(String::from))
        .collect();
    v.sort();
    v
}

fn routes(ns: &TestNs) -> Vec<String> {
    let mut v: Vec<String> = ns
        .sh("ip -4 route show")
        .lines()
        .map(|l| {
            // "proto kernel"/"proto static" and metrics differ in wording only.
            l.split(" proto ").next().unwrap_or(l).trim().to_string()
        })
        .collect();
    v.sort();
    v
}

fn run(bin: &Path, tag: &str) -> Observed {
    let host = TestNs::new(tag);
    let (a, b) = (TestNs::new("a"), TestNs::new("b"));
    let state = tempfile::tempdir().unwrap();
    let l = list(state.path());
    let rt = Runtime::new(bin).in_netns(host.path());
    let mut aa = attach("diff-a", &a);
    aa.capability_args.insert(
        "portMappings".into(),
        json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]),
    );
    aa.capability_args.insert(
        "bandwidth".into(),
        json!({"ingressRate": 8000000, "ingressBurst": 800000, "egressRate": 8000000, "egressBurst": 800000}),
    );
    let ab = attach("diff-b", &b);
    let ra = rt
        .add_list(&l, &aa)
        .unwrap_or_else(|e| panic!("{tag} ADD a: {e}"));
    let rb = rt
        .add_list(&l, &ab)
        .unwrap_or_else(|e| panic!("{tag} ADD b: {e}"));

    let srv = serve_once(&a, 80, "a");
    let host_port_ok = connect_from(&b, "10.220.0.1:8080")
        .map(|s| s == "a")
        .unwrap_or(false);
    if host_port_ok {
        srv.join().unwrap();
    }
    let srv = serve_once(&a, 81, "a");
    connect_from(&b, &format!("{}:81", first_ip(&ra))).unwrap();
    let pod_to_pod_source = srv.join().unwrap();
    let hv = ra["interfaces"][1]["name"].as_str().unwrap().to_string();
    let tbf = host
        .sh(&format!("tc qdisc show dev {hv}"))
        .contains("rate 8Mbit");

    let o = Observed {
        result_ifnames: ra["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                let n = i["name"].as_str().unwrap();
                if n.starts_with("veth") {
                    "veth*".to_string()
                } else if n.starts_with("bwp") {
                    "bwp*".to_string()
                } else {
                    n.to_string()
                }
            })
            .collect(),
        result_sandboxes: ra["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.get("sandbox").is_some())
            .collect(),
        ips: ra["ips"].clone(),
        routes: ra["routes"].clone(),
        pod_addrs: addrs(&a, "eth0"),
        pod_routes: routes(&a),
        bridge_addrs: addrs(&host, "pndiff0"),
        host_port_ok,
        pod_to_pod_source,
        tbf,
    };
    rt.del_list(&l, &aa, Some(&ra))
        .unwrap_or_else(|e| panic!("{tag} DEL a: {e}"));
    rt.del_list(&l, &ab, Some(&rb))
        .unwrap_or_else(|e| panic!("{tag} DEL b: {e}"));
    assert!(
        links(&host)
            .iter()
            .all(|n| !n.starts_with("veth") && !n.starts_with("bwp")),
        "{tag} left links: {:?}",
        links(&host)
    );
    o
}

#[test]
fn same_conflist_same_outcome() {
    require_reference_plugins();
    let ours = Plugins::install();
    let theirs = run(Path::new(REFERENCE_DIR), "ref");
    let mine = run(&ours.bin(), "our");
    assert!(
        theirs.host_port_ok,
        "reference host port failed: test setup broken"
    );
    assert_eq!(mine, theirs);
    assert_eq!(mine.pod_to_pod_source, "10.220.0.3");
}

#[test]
fn host_local_state_carries_across_implementations() {
    require_reference_plugins();
    let ours = Plugins::install();
    let state = tempfile::tempdir().unwrap();
    let conf = json!({"cniVersion": "1.0.0", "name": "swap", "type": "host-local",
        "ipam": {"type": "host-local", "subnet": "10.221.0.0/24", "dataDir": state.path()}});
    let reference = Runtime::new(REFERENCE_DIR);
    let mine = Runtime::new(ours.bin());
    let at = |id: &str| podnet_cni::runtime::Attach {
        container_id: id.into(),
        netns: "/proc/self/ns/net".into(),
        ifname: "eth0".into(),
        ..Default::default()
    };
    let r1 = reference
        .exec(Command::Add, &at("c1"), &conf)
        .unwrap()
        .unwrap();
    let r2 = mine.exec(Command::Add, &at("c2"), &conf).unwrap().unwrap();
    let r3 = reference
        .exec(Command::Add, &at("c3"), &conf)
        .unwrap()
        .unwrap();
    assert_eq!(
        [first_ip(&r1), first_ip(&r2), first_ip(&r3)],
        ["10.221.0.2", "10.221.0.3", "10.221.0.4"]
    );
    // Each releases what the other reserved.
    mine.exec(Command::Del, &at("c1"), &conf).unwrap();
    reference.exec(Command::Del, &at("c2"), &conf).unwrap();
    let mut left: Vec<String> = std::fs::read_dir(state.path().join("swap"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("10."))
        .collect();
    left.sort();
    assert_eq!(left, vec!["10.221.0.4"]);
    // The round-robin cursor is shared: the next address follows .4.
    let r4 = mine.exec(Command::Add, &at("c4"), &conf).unwrap().unwrap();
    assert_eq!(first_ip(&r4), "10.221.0.5");
}
