//! Integration tests for the CNI plugins, run for real in fresh namespaces:
//! each test has its own "host" namespace where the plugins run, and pod
//! namespaces they attach.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use common::*;
use podnet_cni::runtime::Attach;
use podnet_cni::Command;
use serde_json::{json, Value};

/// A bridge + host-local (+ extras) conflist with private state dirs.
fn conflist(name: &str, bridge: &str, subnet: &str, state: &Path, extra: Vec<Value>) -> Value {
    let mut plugins = vec![json!({
        "type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": true, "hairpinMode": true,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                 "routes": [{"dst": "0.0.0.0/0"}], "dataDir": state.join("ipam")}
    })];
    plugins.extend(extra);
    json!({"cniVersion": "1.1.0", "name": name, "plugins": plugins})
}

fn ipam_files(state: &Path, net: &str) -> Vec<String> {
    std::fs::read_dir(state.join("ipam").join(net))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                .collect()
        })
        .unwrap_or_default()
}

fn ping(from: &TestNs, ip: &str) -> bool {
    from.try_sh(&format!("busybox ping -c 1 -W 2 {ip}")).0
}

#[test]
fn bridge_add_check_del_with_traffic() {
    let p = Plugins::install();
    let host = TestNs::new("h");
    let (a, b) = (TestNs::new("a"), TestNs::new("b"));
    let state = tempfile::tempdir().unwrap();
    let list = conflist("t1", "pnbr0", "10.201.0.0/24", state.path(), vec![]);
    let rt = runtime(&p.bin(), &host);
    let (aa, ab) = (attach("ctr-a", &a), attach("ctr-b", &b));
    let ra = rt.add_list(&list, &aa).unwrap();
    let rb = rt.add_list(&list, &ab).unwrap();

    // The result has the reference plugin's shape.
    assert_eq!(ra["cniVersion"], "1.1.0");
    let ifs = ra["interfaces"].as_array().unwrap();
    assert_eq!(ifs.len(), 3);
    assert_eq!(ifs[0]["name"], "pnbr0");
    assert!(ifs[1]["name"].as_str().unwrap().starts_with("veth"));
    assert_eq!(ifs[2]["name"], "eth0");
    assert_eq!(ifs[2]["sandbox"], a.path().to_str().unwrap());
    assert_eq!(ra["ips"][0]["address"], "10.201.0.2/24");
    assert_eq!(ra["ips"][0]["gateway"], "10.201.0.1");
    assert_eq!(ra["ips"][0]["interface"], 2);
    assert_eq!(first_ip(&rb), "10.201.0.3");

    // Kernel state matches: bridge has the gateway, pod has its address and default route.
    assert!(host
        .sh("ip -o addr show dev pnbr0")
        .contains("10.201.0.1/24"));
    assert!(a.sh("ip -o addr show dev eth0").contains("10.201.0.2/24"));
    assert!(a
        .sh("ip route show default")
        .contains("via 10.201.0.1 dev eth0"));
    assert_eq!(host.sh("cat /proc/sys/net/ipv4/ip_forward").trim(), "1");
    assert!(host
        .nft("list set inet podnet-cni masq4")
        .contains("10.201.0.2"));

    // Traffic: ping across the bridge, and TCP with the real source address.
    assert!(ping(&a, "10.201.0.3"), "pod a cannot ping pod b");
    assert!(ping(&b, "10.201.0.1"), "pod b cannot ping the gateway");
    let srv = serve_once(&b, 7001, "b");
    assert_eq!(connect_from(&a, "10.201.0.3:7001").unwrap(), "b");
    assert_eq!(
        srv.join().unwrap(),
        "10.201.0.2",
        "pod-to-pod must not be NATed"
    );

    // CHECK passes with the result as prevResult.
    rt.check_list(&list, &aa, &ra).unwrap();

    // CHECK notices a removed address.
    a.sh("ip addr del 10.201.0.2/24 dev eth0");
    let e = rt.check_list(&list, &aa, &ra).unwrap_err();
    assert!(e.msg.contains("10.201.0.2/24"), "{e}");

    // DEL twice: both succeed and everything is gone.
    rt.del_list(&list, &aa, Some(&ra)).unwrap();
    rt.del_list(&list, &aa, Some(&ra)).unwrap();
    rt.del_list(&list, &ab, Some(&rb)).unwrap();
    rt.del_list(&list, &ab, None).unwrap();
    assert!(ipam_files(state.path(), "t1").is_empty());
    assert!(!links(&a).contains(&"eth0".to_string()));
    assert!(
        links(&host).iter().all(|l| !l.starts_with("veth")),
        "{:?}",
        links(&host)
    );
    let masq = host.nft("list set inet podnet-cni masq4");
    assert!(!masq.contains("10.201.0."), "{masq}");
}

#[test]
fn del_with_vanished_netns_and_after_failed_add() {
    let p = Plugins::install();
    let host = TestNs::new("h");
    let pod = TestNs::new("p");
    let state = tempfile::tempdir().unwrap();
    let list = conflist("t2", "pnbr0", "10.202.0.0/24", state.path(), vec![]);
    let rt = runtime(&p.bin(), &host);
    let at = attach("ctr-gone", &pod);
    let r = rt.add_list(&list, &at).unwrap();
    pod.delete().unwrap();
    rt.del_list(&list, &at, Some(&r)).unwrap();
    assert!(ipam_files(state.path(), "t2").is_empty());
    assert!(links(&host).iter().all(|l| !l.starts_with("veth")));

    // A failed ADD (the interface name is taken) rolls back its IP reservation.
    let pod2 = TestNs::new("p");
    pod2.sh("ip link add eth0 type veth peer name eth0p");
    let at2 = attach("ctr-fail", &pod2);
    let e = rt.add_list(&list, &at2).unwrap_err();
    assert!(e.msg.contains("already exists"), "{e}");
    assert!(ipam_files(state.path(), "t2").is_empty());
    assert!(links(&host).iter().all(|l| !l.starts_with("veth")));
    rt.del_list(&list, &at2, None).unwrap();
    assert!(
        links(&pod2).contains(&"eth0".to_string()),
        "DEL must not remove a link it did not create... it did"
    );
}

#[test]
fn failed_add_after_ipam_rolls_back_links() {
    let p = Plugins::install();
    let host = TestNs::new("h");
    let pod = TestNs::new("p");
    let state = tempfile::tempdir().unwrap();
    // The bridge already holds a different address in the subnet and
    // forceAddress is off: ADD fails after the veth exists.
    host.sh("ip link add pnbr1 type bridge && ip addr add 10.203.0.99/24 dev pnbr1");
    let list = conflist("t3", "pnbr1", "10.203.0.0/24", state.path(), vec![]);
    let rt = runtime(&p.bin(), &host);
    let e = rt.add_list(&list, &attach("ctr", &pod)).unwrap_err();
    assert!(e.msg.contains("already has an IP address"), "{e}");
    assert!(ipam_files(state.path(), "t3").is_empty());
    assert_eq!(
        links(&host)
            .iter()
            .filter(|l| l.starts_with("veth"))
            .count(),
        0
    );
    assert!(!links(&pod).contains(&"eth0".to_string()));
}

#[test]
fn hundred_parallel_adds_get_distinct_addresses() {
    let p = Plugins::install();
    let state = tempfile::tempdir().unwrap();
    let conf = json!({
        "cniVersion": "1.1.0", "name": "par", "type": "host-local",
        "ipam": {"type": "host-local", "subnet": "10.204.0.0/24", "dataDir": state.path()}
    });
    let rt = podnet_cni::runtime::Runtime::new(p.bin());
    let ips: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..100)
            .map(|i| {
                let (rt, conf) = (&rt, &conf);
                s.spawn(move || {
                    let a = Attach {
                        container_id: format!("par-{i}"),
                        netns: "/proc/self/ns/net".into(),
                        ifname: "eth0".into(),
                        ..Default::default()
                    };
                    let r = rt.exec(Command::Add, &a, conf).unwrap().unwrap();
                    first_ip(&r)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let set: HashSet<_> = ips.iter().collect();
    assert_eq!(set.len(), 100, "duplicate addresses handed out: {ips:?}");
    // Exhaustion: a /24 has 253 usable; fill it and ask once more.
    for i in 100..253 {
        let a = Attach {
            container_id: format!("fill-{i}"),
            netns: "x".into(),
            ifname: "eth0".into(),
            ..Default::default()
        };
        rt.exec(Command::Add, &a, &conf).unwrap();
    }
    let a = Attach {
        container_id: "one-too-many".into(),
        netns: "x".into(),
        ifname: "eth0".into(),
        ..Default::default()
    };
    let e = rt.exec(Command::Add, &a, &conf).unwrap_err();
    assert!(
        e.msg
            .contains("no IP addresses available in range set: 10.204.0.1-10.204.0.254"),
        "{e}"
    );
}

#[test]
fn gc_removes_attachments_not_in_the_valid_list() {
    let p = Plugins::install();
    let host = TestNs::new("h");
    let state = tempfile::tempdir().unwrap();
    let pm = json!({"type": "portmap", "capabilities": {"portMappings": true}, "stateDir": state.path().join("pm")});
    let list = conflist("t5", "pnbr0", "10.205.0.0/24", state.path(), vec![pm]);
    let rt = runtime(&p.bin(), &host);
    let pods: Vec<TestNs> = (0..3).map(|_| TestNs::new("p")).collect();
    for (i, pod) in pods.iter().enumerate() {
        let mut a = attach(&format!("gc-{i}"), pod);
        a.capability_args.insert(
            "portMappings".into(),
            json!([{"hostPort": 9000 + i, "containerPort": 80}]),
        );
        rt.add_list(&list, &a).unwrap();
    }
    assert_eq!(ipam_files(state.path(), "t5").len(), 3);
    let valid = vec![podnet_cni::types::Attachment {
        container_id: "gc-1".into(),
        ifname: "eth0".into(),
    }];
    rt.gc_list(&list, &valid).unwrap();
    assert_eq!(
        ipam_files(state.path(), "t5"),
        vec!["10.205.0.3".to_string()]
    );
    let maps = host.nft("list map inet podnet-portmap hp4any");
    assert!(
        maps.contains("9001") && !maps.contains("9000") && !maps.contains("9002"),
        "{maps}"
    );
    let left: Vec<_> = std::fs::read_dir(state.path().join("pm"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left.len(), 1);
}

#[test]
fn errors_have_spec_codes_and_leave_nothing() {
    let p = Plugins::install();
    let host = TestNs::new("h");
    let pod = TestNs::new("p");
    let state = tempfile::tempdir().unwrap();
    let bridge = p.bin().join("bridge");
    let np = pod.path().display().to_string();
    let bin = p.bin().display().to_string();
    let env = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "err1"),
        ("CNI_NETNS", np.as_str()),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", bin.as_str()),
    ];
    let good = json!({"cniVersion": "1.0.0", "name": "t6", "type": "bridge", "bridge": "pnbr6",
        "ipam": {"type": "host-local", "subnet": "10.206.0.0/24", "dataDir": state.path()}});

    let (code, v, _) = raw_call(&bridge, &env, "{not json", Some(&host));
    assert_eq!((code, v["code"].as_u64()), (1, Some(6)), "{v}");

    let mut bad = good.clone();
    bad["cniVersion"] = json!("0.2.0");
    let (_, v, _) = raw_call(&bridge, &env, &bad.to_string(), Some(&host));
    assert_eq!(v["code"], 1, "{v}");

    let (_, v, _) = raw_call(&bridge, &env[..3], &good.to_string(), Some(&host));
    assert_eq!(v["code"], 4, "{v}");
    assert!(
        v["msg"].as_str().unwrap().contains("CNI_IFNAME")
            && v["msg"].as_str().unwrap().contains("CNI_PATH"),
        "{v}"
    );

    let mut bad = good.clone();
    bad["ipam"]["subnet"] = json!("10.206.0.0/40");
    let (_, v, _) = raw_call(&bridge, &env, &bad.to_string(), Some(&host));
    assert_eq!(v["code"], 7, "{v}");
    assert!(v["msg"].as_str().unwrap().contains("10.206.0.0/40"), "{v}");

    let mut bad_env = env;
    bad_env[1] = ("CNI_CONTAINERID", "../../etc");
    let (_, v, _) = raw_call(&bridge, &bad_env, &good.to_string(), Some(&host));
    assert_eq!(v["code"], 4, "{v}");

    // CHECK is not allowed before 0.4.0; GC needs 1.1.0.
    let mut old = good.clone();
    old["cniVersion"] = json!("0.3.1");
    let mut chk = env;
    chk[0] = ("CNI_COMMAND", "CHECK");
    let (_, v, _) = raw_call(&bridge, &chk, &old.to_string(), Some(&host));
    assert_eq!(v["code"], 1, "{v}");

    // Nothing was created by any of the failures.
    assert!(
        !links(&host)
            .iter()
            .any(|l| l == "pnbr6" || l.starts_with("veth")),
        "{:?}",
        links(&host)
    );
    assert!(!links(&pod).contains(&"eth0".to_string()));

    // VERSION answers without any other variable.
    let (code, v, _) = raw_call(
        &bridge,
        &[("CNI_COMMAND", "VERSION")],
        r#"{"cniVersion":"1.0.0"}"#,
        None,
    );
    assert_eq!(code, 0);
    assert_eq!(v["cniVersion"], "1.0.0");
    assert_eq!(
        v["supportedVersions"],
        json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
    );

    // STATUS on host-local passes; plugins print nothing but JSON on stdout.
    let hl = p.bin().join("host-local");
    let mut st = good.clone();
    st["cniVersion"] = json!("1.1.0");
    let (code, _, _) = raw_call(
        &hl,
        &[("CNI_COMMAND", "STATUS"), ("CNI_PATH", bin.as_str())],
        &st.to_string(),
        None,
    );
    assert_eq!(code, 0);
}

#[test]
fn old_versions_get_old_results() {
    let p = Plugins::install();
    let host = TestNs::new("h");
    let pod = TestNs::new("p");
    let state = tempfile::tempdir().unwrap();
    let rt = runtime(&p.bin(), &host);
    for (i, ver) in ["0.3.0", "0.3.1", "0.4.0", "1.0.0"].iter().enumerate() {
        let conf = json!({"cniVersion": ver, "name": "t7", "type": "bridge", "bridge": "pnbr7", "isGateway": true,
            "ipam": {"type": "host-local", "subnet": "10.207.0.0/24", "dataDir": state.path()}});
        let mut a = attach(&format!("v{i}"), &pod);
        a.ifname = format!("eth{i}");
        let r = rt.exec(Command::Add, &a, &conf).unwrap().unwrap();
        assert_eq!(r["cniVersion"], *ver);
        if ver.starts_with('0') {
            assert_eq!(r["ips"][0]["version"], "4", "{r}");
        } else {
            assert!(r["ips"][0].get("version").is_none(), "{r}");
        }
        rt.exec(Command::Del, &a, &conf).unwrap();
    }
}

#[test]
fn dual_stack_bridge() {
    let p = Plugins::install();
    let host = TestNs::new("h");
    let (a, b) = (TestNs::new("a"), TestNs::new("b"));
    let state = tempfile::tempdir().unwrap();
    let list = json!({"cniVersion": "1.0.0", "name": "t8", "plugins": [{
        "type": "bridge", "bridge": "pnbr8", "isDefaultGateway": true,
        "ipam": {"type": "host-local", "dataDir": state.path(),
                 "ranges": [[{"subnet": "10.208.0.0/24"}], [{"subnet": "fd00:208::/64"}]]}}]});
    let rt = runtime(&p.bin(), &host);
    let ra = rt.add_list(&list, &attach("ds-a", &a)).unwrap();
    let rb = rt.add_list(&list, &attach("ds-b", &b)).unwrap();
    assert_eq!(ra["ips"][1]["address"], "fd00:208::2/64");
    assert!(a.sh("ip -6 route show default").contains("via fd00:208::1"));
    let b6 = rb["ips"][1]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    assert!(
        a.try_sh(&format!("busybox ping -6 -c 1 -W 2 {b6}")).0,
        "v6 ping failed"
    );
    rt.del_list(&list, &attach("ds-a", &a), Some(&ra)).unwrap();
    rt.del_list(&list, &attach("ds-b", &b), Some(&rb)).unwrap();
}

#[test]
fn loopback_plugin() {
    let p = Plugins::install();
    let pod = TestNs::new("p");
    pod.sh("ip link set lo down");
    let rt = podnet_cni::runtime::Runtime::new(p.bin());
    let conf = json!({"cniVersion": "1.1.0", "name": "lo", "type": "loopback"});
    let a = Attach {
        container_id: "lo1".into(),
        netns: pod.path().display().to_string(),
        ifname: "lo".into(),
        ..Default::default()
    };
    let r = rt.exec(Command::Add, &a, &conf).unwrap().unwrap();
    assert_eq!(r["interfaces"][0]["name"], "lo");
    assert!(pod.sh("ip -o link show lo").contains("UP"));
    let mut chk = conf.clone();
    chk["prevResult"] = r;
    rt.exec(Command::Check, &a, &chk).unwrap();
    rt.exec(Command::Del, &a, &conf).unwrap();
    assert!(!pod.sh("ip -o link show lo").contains(",UP"));
    pod.delete().unwrap();
    rt.exec(Command::Del, &a, &conf).unwrap();
}

#[test]
fn portmap_forwards_host_ports_and_checks() {
    let p = Plugins::install();
    let host = TestNs::new("h");
    let (a, b) = (TestNs::new("a"), TestNs::new("b"));
    let state = tempfile::tempdir().unwrap();
    let pm = json!({"type": "portmap", "capabilities": {"portMappings": true}, "stateDir": state.path().join("pm")});
    let list = conflist("t9", "pnbr9", "10.209.0.0/24", state.path(), vec![pm]);
    let rt = runtime(&p.bin(), &host);
    let mut aa = attach("pm-a", &a);
    // containerd's capitalised keys
    aa.capability_args.insert(
        "portMappings".into(),
        json!([{"HostPort": 8080, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}]),
    );
    let ra = rt.add_list(&list, &aa).unwrap();
    let rb = rt.add_list(&list, &attach("pm-b", &b)).unwrap();

    // From the host itself, to the host's address and to localhost.
    let srv = serve_once(&a, 80, "pod-a");
    assert_eq!(connect_from(&host, "10.209.0.1:8080").unwrap(), "pod-a");
    srv.join().unwrap();
    let srv = serve_once(&a, 80, "pod-a");
    assert_eq!(connect_from(&host, "127.0.0.1:8080").unwrap(), "pod-a");
    srv.join().unwrap();
    // Hairpin: pod a reaches itself through the host port.
    let srv = serve_once(&a, 80, "pod-a");
    assert_eq!(connect_from(&a, "10.209.0.1:8080").unwrap(), "pod-a");
    srv.join().unwrap();
    // From another pod.
    let srv = serve_once(&a, 80, "pod-a");
    assert_eq!(connect_from(&b, "10.209.0.1:8080").unwrap(), "pod-a");
    srv.join().unwrap();

    // CHECK works (the reference 1.1.1 fails it).
    rt.check_list(&list, &aa, &ra).unwrap();

    // A second pod asking for the same host port gets a clear error and no leftovers.
    let c = TestNs::new("c");
    let mut ac = attach("pm-c", &c);
    ac.capability_args.insert(
        "portMappings".into(),
        json!([{"hostPort": 8080, "containerPort": 80}]),
    );
    let e = rt.add_list(&list, &ac).unwrap_err();
    assert!(e.msg.contains("already mapped"), "{e}");
    assert!(!ipam_files(state.path(), "t9").contains(&"10.209.0.4".to_string()));

    rt.del_list(&list, &aa, Some(&ra)).unwrap();
    rt.del_list(&list, &aa, Some(&ra)).unwrap();
    rt.del_list(&list, &attach("pm-b", &b), Some(&rb)).unwrap();
    let m = host.nft("list map inet podnet-portmap hp4any");
    assert!(!m.contains("8080"), "{m}");
    assert!(connect_from(&host, "10.209.0.1:8080").is_err());
}

#[test]
fn bandwidth_shapes_both_directions() {
    let p = Plugins::install();
    let host = TestNs::new("h");
    let pod = TestNs::new("p");
    let state = tempfile::tempdir().unwrap();
    let bw = json!({"type": "bandwidth", "capabilities": {"bandwidth": true},
                    "ingressRate": 1000000, "ingressBurst": 80000});
    let list = conflist("t10", "pnbr10", "10.210.0.0/24", state.path(), vec![bw]);
    let rt = runtime(&p.bin(), &host);
    let mut a = attach("bw-1", &pod);
    a.capability_args.insert(
        "bandwidth".into(),
        json!({"ingressRate": 2000000, "ingressBurst": 160000, "egressRate": 3000000, "egressBurst": 240000}),
    );
    let r = rt.add_list(&list, &a).unwrap();
    let hv = r["interfaces"][1]["name"].as_str().unwrap().to_string();
    let q = host.sh(&format!("tc qdisc show dev {hv}"));
    assert!(q.contains("tbf") && q.contains("rate 2Mbit"), "{q}");
    let ifb = podnet_cni::plugins::bandwidth::ifb_name("bw-1", "eth0");
    let q = host.sh(&format!("tc qdisc show dev {ifb}"));
    assert!(q.contains("tbf") && q.contains("rate 3Mbit"), "{q}");
    assert!(host
        .sh(&format!("tc filter show dev {hv} parent ffff:"))
        .contains(&ifb));
    rt.check_list(&list, &a, &r).unwrap();
    rt.del_list(&list, &a, Some(&r)).unwrap();
    rt.del_list(&list, &a, Some(&r)).unwrap();
    assert!(!links(&host).contains(&ifb));
}

#[test]
fn podnet_meta_plugin_reads_subnet_env() {
    let p = Plugins::install();
    let host = TestNs::new("h");
    let (a, b) = (TestNs::new("a"), TestNs::new("b"));
    let state = tempfile::tempdir().unwrap();
    let env = state.path().join("subnet.env");
    std::fs::write(
        &env,
        "FLANNEL_NETWORK=10.211.0.0/16\nFLANNEL_SUBNET=10.211.3.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n",
    )
    .unwrap();
    let list = json!({"cniVersion": "1.0.0", "name": "podnet", "plugins": [{
        "type": "podnet", "subnetFile": env, "dataDir": state.path().join("meta"),
        "delegate": {"bridge": "pnbr11"}, "requireAgent": false
    }]});
    // host-local state goes to the default dataDir; keep it private with a
    // unique network name instead.
    let mut list = list;
    list["name"] = json!(format!("pn-meta-{}", std::process::id()));
    let rt = runtime(&p.bin(), &host);
    let ra = rt.add_list(&list, &attach("meta-a", &a)).unwrap();
    let rb = rt.add_list(&list, &attach("meta-b", &b)).unwrap();
    assert!(first_ip(&ra).starts_with("10.211.3."), "{ra}");
    assert!(a.sh("ip route").contains("10.211.0.0/16 via 10.211.3.1"));
    assert!(a.sh("ip -o link show eth0").contains("mtu 1450"));
    assert!(ping(&a, &first_ip(&rb)));
    rt.check_list(&list, &attach("meta-a", &a), &ra).unwrap();
    // The agent moving the node to another subnet must not break DEL.
    std::fs::write(
        &env,
        "FLANNEL_NETWORK=10.211.0.0/16\nFLANNEL_SUBNET=10.211.9.1/24\n",
    )
    .unwrap();
    rt.del_list(&list, &attach("meta-a", &a), Some(&ra))
        .unwrap();
    rt.del_list(&list, &attach("meta-b", &b), Some(&rb))
        .unwrap();
    rt.del_list(&list, &attach("meta-b", &b), Some(&rb))
        .unwrap();
    let net_dir = Path::new("/var/lib/cni/networks").join(list["name"].as_str().unwrap());
    let left: Vec<_> = std::fs::read_dir(&net_dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("10."))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(net_dir);
    // Missing subnet.env: a clear, retryable error.
    std::fs::remove_file(&env).unwrap();
    let e = rt.add_list(&list, &attach("meta-c", &a)).unwrap_err();
    assert_eq!(e.code, 11);
    assert!(e.msg.contains("subnet.env"), "{e}");
}

/// The CNI environment of one call, for `raw_call`.
fn cni_env<'a>(
    cmd: &'a str,
    id: &'a str,
    netns: &'a str,
    path: &'a str,
) -> Vec<(&'a str, &'a str)> {
    vec![
        ("CNI_COMMAND", cmd),
        ("CNI_CONTAINERID", id),
        ("CNI_NETNS", netns),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", path),
    ]
}

/// Every file of a directory with its content (empty when it is missing).
fn dir_files(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        String::from_utf8_lossy(&std::fs::read(e.path()).unwrap()).into_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn ipam_type_that_is_no_ipam_plugin_is_refused_not_recursed() {
    let p = Plugins::install();
    let host = TestNs::new("h");
    let pod = TestNs::new("p");
    let state = tempfile::tempdir().unwrap();
    let bridge = p.bin().join("bridge");
    let (np, bin) = (
        pod.path().display().to_string(),
        p.bin().display().to_string(),
    );
    // `bridge` as its own IPAM recursed in-process until the stack overflowed
    // (exit 134, nothing on stdout), on ADD and on DEL alike.
    for cmd in ["ADD", "DEL"] {
        for t in ["bridge", "portmap", "podnet", "loopback", "bandwidth"] {
            let conf = json!({"cniVersion": "1.1.0", "name": "rec", "type": "bridge",
                "bridge": "pnbrrec", "ipam": {"type": t}});
            let env = cni_env(cmd, "rec-1", &np, &bin);
            let (code, v, stderr) = raw_call(&bridge, &env, &conf.to_string(), Some(&host));
            assert_eq!(code, 1, "{cmd} ipam {t}: {v} {stderr}");
            assert_eq!(v["code"], 7, "{cmd} ipam {t}: {v}");
            assert_eq!(
                v["msg"],
                format!("bridge: ipam type \"{t}\" is not an IPAM plugin"),
                "{cmd}"
            );
        }
    }

    // The meta-plugin delegating to itself.
    let env_file = state.path().join("subnet.env");
    std::fs::write(
        &env_file,
        "FLANNEL_NETWORK=10.216.0.0/16\nFLANNEL_SUBNET=10.216.1.1/24\n",
    )
    .unwrap();
    let conf = json!({"cniVersion": "1.0.0", "name": "rec", "type": "podnet",
        "subnetFile": env_file, "dataDir": state.path().join("meta"),
        "ipamDataDir": state.path().join("ipam"), "delegate": {"type": "podnet"}});
    let (code, v, stderr) = raw_call(
        &p.bin().join("podnet"),
        &cni_env("ADD", "rec-2", &np, &bin),
        &conf.to_string(),
        Some(&host),
    );
    assert_eq!(code, 1, "{v} {stderr}");
    assert_eq!(v["code"], 7, "{v}");
    assert_eq!(
        v["msg"], "podnet: delegate type \"podnet\" would delegate to itself",
        "{v}"
    );

    // The depth limit holds across exec too: a bridge started 4 levels deep
    // may not delegate once more, and undoes what it built before IPAM.
    let conf = json!({"cniVersion": "1.1.0", "name": "rec", "type": "bridge", "bridge": "pnbrrec",
        "ipam": {"type": "host-local", "subnet": "10.216.2.0/24", "dataDir": state.path().join("ipam")}});
    let mut env = cni_env("ADD", "rec-3", &np, &bin);
    env.push(("PODNET_CNI_DELEGATION", "podnet,podnet,podnet,podnet"));
    let (code, v, stderr) = raw_call(&bridge, &env, &conf.to_string(), Some(&host));
    assert_eq!(code, 1, "{v} {stderr}");
    assert_eq!(v["code"], 7, "{v}");
    assert_eq!(
        v["msg"],
        "plugin delegation nested more than 4 deep (podnet -> podnet -> podnet -> podnet \
         -> host-local): does a configuration delegate to itself?"
    );
    assert!(
        !links(&host)
            .iter()
            .any(|l| l == "pnbrrec" || l.starts_with("veth")),
        "{:?}",
        links(&host)
    );
    assert!(!links(&pod).contains(&"eth0".to_string()));
    assert!(dir_files(&state.path().join("ipam").join("rec")).is_empty());
    assert!(!state.path().join("meta").join("rec-2").exists());
}

#[test]
fn host_local_refuses_default_and_link_local_subnets() {
    let p = Plugins::install();
    let state = tempfile::tempdir().unwrap();
    let hl = p.bin().join("host-local");
    let bin = p.bin().display().to_string();
    for (subnet, msg) in [
        (
            "0.0.0.0/0",
            "host-local: subnet 0.0.0.0/0 is the whole address family, not a pod network",
        ),
        (
            "::/0",
            "host-local: subnet ::/0 is the whole address family, not a pod network",
        ),
        (
            "169.254.0.0/16",
            "host-local: subnet 169.254.0.0/16 overlaps the link-local range 169.254.0.0/16",
        ),
        (
            "169.254.10.0/24",
            "host-local: subnet 169.254.10.0/24 overlaps the link-local range 169.254.0.0/16",
        ),
        (
            "fe80::/10",
            "host-local: subnet fe80::/10 overlaps the link-local range fe80::/10",
        ),
        (
            "fe80::/64",
            "host-local: subnet fe80::/64 overlaps the link-local range fe80::/10",
        ),
        // Like the reference (its code is 999, ours 7 as for every range error).
        (
            "10.217.0.0/31",
            "host-local: network 10.217.0.0/31 too small to allocate from",
        ),
        (
            "10.217.0.1/32",
            "host-local: network 10.217.0.1/32 too small to allocate from",
        ),
    ] {
        for ipam in [
            json!({"type": "host-local", "subnet": subnet, "dataDir": state.path()}),
            json!({"type": "host-local", "ranges": [[{"subnet": subnet}]], "dataDir": state.path()}),
        ] {
            let conf =
                json!({"cniVersion": "1.1.0", "name": "ll", "type": "host-local", "ipam": ipam});
            let (code, v, stderr) = raw_call(
                &hl,
                &cni_env("ADD", "ll-1", "/proc/self/ns/net", &bin),
                &conf.to_string(),
                None,
            );
            assert_eq!(code, 1, "{subnet}: {v} {stderr}");
            assert_eq!(v["code"], 7, "{subnet}: {v}");
            assert_eq!(v["msg"], msg, "{subnet}");
        }
    }
    assert!(
        !state.path().join("ll").exists(),
        "nothing may be allocated"
    );
}

#[test]
fn portmap_refuses_non_string_host_ip_and_protocol() {
    let p = Plugins::install();
    let host = TestNs::new("h");
    let state = tempfile::tempdir().unwrap();
    let pm = p.bin().join("portmap");
    let bin = p.bin().display().to_string();
    let prev = json!({"cniVersion": "1.1.0",
        "interfaces": [{"name": "eth0", "sandbox": "/run/netns/x"}],
        "ips": [{"address": "10.218.0.5/24", "interface": 0}]});
    for (key, val, msg) in [
        (
            "HostIP",
            json!(5),
            "portmap: mapping 0: hostIP must be a string, not a number",
        ),
        (
            "hostIP",
            json!(["10.218.0.1"]),
            "portmap: mapping 0: hostIP must be a string, not a list",
        ),
        (
            "hostIp",
            json!({"ip": "10.218.0.1"}),
            "portmap: mapping 0: hostIP must be a string, not an object",
        ),
        (
            "Protocol",
            json!(17),
            "portmap: mapping 0: protocol must be a string, not a number",
        ),
        (
            "protocol",
            json!(true),
            "portmap: mapping 0: protocol must be a string, not a boolean",
        ),
    ] {
        // containerd's capitalised keys and the CNI spellings alike.
        let mut mapping = json!({"HostPort": 8080, "ContainerPort": 80});
        mapping[key] = val;
        let conf = json!({"cniVersion": "1.1.0", "name": "pmv", "type": "portmap",
            "stateDir": state.path().join("pm"), "prevResult": prev,
            "runtimeConfig": {"portMappings": [mapping]}});
        let (code, v, stderr) = raw_call(
            &pm,
            &cni_env("ADD", "pmv-1", "/proc/self/ns/net", &bin),
            &conf.to_string(),
            Some(&host),
        );
        assert_eq!(code, 1, "{key}: {v} {stderr}");
        assert_eq!(v["code"], 7, "{key}: {v}");
        assert_eq!(v["msg"], msg, "{key}");
    }
    // Nothing was mapped and nothing recorded.
    let table = host.nft_list("table inet podnet-portmap");
    assert!(table.is_none(), "{table:?}");
    assert!(dir_files(&state.path().join("pm")).is_empty());
}

/// ADD ok, ADD failing on an interface name already taken in the pod, ADD
/// ok: returns the two addresses handed out, host-local's files after the
/// sequence, and the failure's message.
fn add_fail_add(bin: &Path, tag: &str) -> (Vec<String>, BTreeMap<String, String>, String) {
    let host = TestNs::new(tag);
    let (a, b, c) = (TestNs::new("a"), TestNs::new("b"), TestNs::new("c"));
    b.sh("ip link add eth0 type veth peer name eth0p");
    let state = tempfile::tempdir().unwrap();
    let conf = json!({"cniVersion": "1.0.0", "name": "curs", "type": "bridge", "bridge": "pncurs0",
        "isGateway": true, "ipam": {"type": "host-local", "subnet": "10.219.0.0/24", "dataDir": state.path()}});
    let rt = runtime(bin, &host);
    let ra = rt
        .exec(Command::Add, &attach("curs-a", &a), &conf)
        .unwrap_or_else(|e| panic!("{tag} ADD a: {e}"))
        .unwrap();
    let e = rt
        .exec(Command::Add, &attach("curs-b", &b), &conf)
        .expect_err("ADD with a taken ifname must fail");
    let rc = rt
        .exec(Command::Add, &attach("curs-c", &c), &conf)
        .unwrap_or_else(|e| panic!("{tag} ADD c: {e}"))
        .unwrap();
    let files = dir_files(&state.path().join("curs"));
    (vec![first_ip(&ra), first_ip(&rc)], files, e.msg)
}

#[test]
fn failed_add_moves_no_host_local_cursor_like_the_reference() {
    require_reference_plugins();
    let ours = Plugins::install();
    let theirs = add_fail_add(Path::new(REFERENCE_DIR), "ref");
    let mine = add_fail_add(&ours.bin(), "our");
    assert_eq!(theirs.0, ["10.219.0.2", "10.219.0.3"]);
    assert!(theirs.2.contains("already exists"), "{}", theirs.2);
    assert_eq!(
        mine.2,
        "bridge: container veth name \"eth0\" already exists"
    );
    assert_eq!(mine.0, theirs.0, "addresses handed out");
    assert_eq!(mine.1, theirs.1, "host-local dataDir after the sequence");
    assert_eq!(mine.1["last_reserved_ip.0"], "10.219.0.3");
}

#[test]
fn failures_after_allocation_restore_host_local_state_exactly() {
    let p = Plugins::install();
    let host = TestNs::new("h");
    let (a, b, c) = (TestNs::new("a"), TestNs::new("b"), TestNs::new("c"));
    let state = tempfile::tempdir().unwrap();
    let ipam = json!({"type": "host-local", "dataDir": state.path(),
        "ranges": [[{"subnet": "10.222.0.0/24"}], [{"subnet": "fd00:222::/64"}]]});
    let conf = |br: &str| {
        json!({"cniVersion": "1.1.0", "name": "undo", "type": "bridge", "bridge": br,
            "isGateway": true, "ipam": ipam})
    };
    let dir = state.path().join("undo");
    let rt = runtime(&p.bin(), &host);
    let ra = rt
        .exec(Command::Add, &attach("undo-a", &a), &conf("pnbrok"))
        .unwrap()
        .unwrap();
    assert_eq!(first_ip(&ra), "10.222.0.2");
    let before = dir_files(&dir);
    assert_eq!(before["last_reserved_ip.0"], "10.222.0.2");
    assert_eq!(before["last_reserved_ip.1"], "fd00:222::2");

    // The bridge fails after IPAM allocated (its address clashes): both
    // addresses go and both cursors return to where they were.
    host.sh("ip link add pnbrbad type bridge && ip addr add 10.222.0.99/24 dev pnbrbad");
    let e = rt
        .exec(Command::Add, &attach("undo-b", &b), &conf("pnbrbad"))
        .unwrap_err();
    assert!(e.msg.contains("already has an IP address"), "{e}");
    assert_eq!(dir_files(&dir), before);
    assert!(
        links(&host)
            .iter()
            .filter(|l| l.starts_with("veth"))
            .count()
            == 1,
        "{:?}",
        links(&host)
    );

    // host-local alone: a second range set that is exhausted fails the ADD
    // after the first set allocated; a missing resolvConf fails it before.
    let hl = |ipam: Value| json!({"cniVersion": "1.1.0", "name": "undo", "type": "host-local", "ipam": ipam});
    let mut full = ipam.clone();
    full["ranges"][1] = json!([{"subnet": "fd00:222::/64", "rangeStart": "fd00:222::2", "rangeEnd": "fd00:222::2"}]);
    let e = rt
        .exec(Command::Add, &attach("undo-c", &c), &hl(full))
        .unwrap_err();
    assert!(e.msg.contains("no IP addresses available"), "{e}");
    assert_eq!(dir_files(&dir), before);
    let mut bad = ipam.clone();
    bad["resolvConf"] = json!(state.path().join("missing-resolv.conf"));
    let e = rt
        .exec(Command::Add, &attach("undo-c", &c), &hl(bad))
        .unwrap_err();
    assert_eq!(e.code, 5, "{e}");
    assert!(e.msg.starts_with("host-local: reading resolvConf"), "{e}");
    assert_eq!(dir_files(&dir), before);

    // The next pod gets the address right after the last one really given.
    let rc = rt
        .exec(Command::Add, &attach("undo-c", &c), &conf("pnbrok"))
        .unwrap()
        .unwrap();
    assert_eq!(first_ip(&rc), "10.222.0.3");
}

#[test]
fn del_without_netns_or_prev_result_removes_masquerade_by_owner() {
    let p = Plugins::install();
    let host = TestNs::new("h");
    let pod = TestNs::new("p");
    let state = tempfile::tempdir().unwrap();
    let list = json!({"cniVersion": "1.1.0", "name": "masq", "plugins": [{
        "type": "bridge", "bridge": "pnbrmq", "isGateway": true, "ipMasq": true,
        "ipam": {"type": "host-local", "dataDir": state.path().join("ipam"),
                 "ranges": [[{"subnet": "10.223.0.0/24"}], [{"subnet": "fd00:223::/64"}]]}}]});
    let rt = runtime(&p.bin(), &host);
    let at = attach("masq-1", &pod);
    let r = rt.add_list(&list, &at).unwrap();
    let ips: Vec<std::net::IpAddr> = r["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            i["address"]
                .as_str()
                .unwrap()
                .split('/')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(ips.len(), 2);
    let listing = || {
        podnet_cni::plugins::netfilter::parse_masq_listing(
            &host.nft("-j list table inet podnet-cni"),
        )
    };
    let mine = |els: &[podnet_cni::plugins::netfilter::MasqElement]| {
        els.iter()
            .filter(|e| e.comment.as_deref() == Some("masq/masq-1") || ips.contains(&e.ip))
            .map(|e| format!("{} {}", e.set, e.key))
            .collect::<Vec<_>>()
    };
    let added = listing();
    let mut got = mine(&added);
    got.sort();
    assert_eq!(
        got,
        [
            "masq4 10.223.0.2",
            "masq6 fd00:223::2",
            "nomasq4 10.223.0.2 . 10.223.0.0/24",
            "nomasq6 fd00:223::2 . fd00:223::/64",
        ]
    );
    assert!(
        added
            .iter()
            .all(|e| !ips.contains(&e.ip) || e.comment.as_deref() == Some("masq/masq-1")),
        "every element carries its owner: {added:?}"
    );
    // State written before elements carried owners had uncommented nomasq
    // elements: make this pod's look like that; DEL must still find them.
    host.nft(
        "'delete element inet podnet-cni nomasq4 { 10.223.0.2 . 10.223.0.0/24 }; \
         add element inet podnet-cni nomasq4 { 10.223.0.2 . 10.223.0.0/24 }'",
    );

    pod.delete().unwrap();
    rt.del_list(&list, &at, None).unwrap();
    let left = listing();
    assert!(
        mine(&left).is_empty(),
        "left for the container: {:?}",
        mine(&left)
    );
    assert!(ipam_files(state.path(), "masq").is_empty());
}

/// The meta plugin's ADD waits for the node agent (NetworkPolicy's "no
/// open window"): it sends the pod's name and addresses to the agent's
/// socket beside the subnet file and returns once the agent confirms; an
/// agent's error fails the ADD (retryable) and undoes the attachment; DEL
/// tells the agent too. The agent side is the agent's real socket server
/// (`podnet_policy::hint`); the test plays the policy loop behind it.
#[test]
fn podnet_meta_plugin_waits_for_the_agent() {
    use podnet_policy::dataplane::PolicyInput;
    use podnet_reconcile::Input;
    let p = Plugins::install();
    let host = TestNs::new("h");
    let pod = TestNs::new("a");
    let state = tempfile::tempdir().unwrap();
    let env = state.path().join("subnet.env");
    std::fs::write(
        &env,
        "FLANNEL_NETWORK=10.212.0.0/16\nFLANNEL_SUBNET=10.212.3.1/24\nFLANNEL_IPMASQ=false\n",
    )
    .unwrap();
    let socket = podnet_policy::hint::socket_for(&env);
    assert_eq!(socket, state.path().join("agent.sock"));
    // The loop's side: record what arrives, answer per `fail`.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let fail = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (tx, mut rx) = podnet_reconcile::channel::<PolicyInput>();
    let (gtx, mut grx) = podnet_reconcile::channel();
    let loops = podnet_policy::hint::Loops {
        policy: tx,
        guard: gtx,
    };
    rt.spawn(podnet_policy::hint::serve(
        podnet_policy::hint::Socket::at(socket.clone()),
        loops,
    ));
    // The port guard's side: record the port's facts, answer at once.
    let seen_g = seen.clone();
    rt.spawn(async move {
        while let Some(m) = grx.recv().await {
            if let Input::Changes(podnet_policy::guardplane::GuardInput { key, port, ack }) = m {
                let facts = port.map(|p| (p.port.starts_with("veth"), p.ips));
                seen_g
                    .lock()
                    .unwrap()
                    .push(format!("guard {key} {facts:?}"));
                if let Some(a) = ack {
                    let _ = a.send(Ok(()));
                }
            }
        }
    });
    let (seen2, fail2) = (seen.clone(), fail.clone());
    rt.spawn(async move {
        while let Some(m) = rx.recv().await {
            match m {
                Input::Changes(PolicyInput::Added { key, ips, ack }) => {
                    seen2.lock().unwrap().push(format!("add {key} {ips:?}"));
                    let r = if fail2.load(std::sync::atomic::Ordering::SeqCst) {
                        Err("the table is full".to_string())
                    } else {
                        Ok(())
                    };
                    let _ = ack.unwrap().send(r);
                }
                Input::Changes(PolicyInput::Removed { key }) => {
                    seen2.lock().unwrap().push(format!("del {key}"));
                }
                _ => {}
            }
        }
    });
    podnet_testkit::eventually("the socket", std::time::Duration::from_secs(5), || {
        socket.exists()
    });
    let mut list = json!({"cniVersion": "1.0.0", "name": "podnet", "plugins": [{
        "type": "podnet", "subnetFile": env, "dataDir": state.path().join("meta"),
        "delegate": {"bridge": "pnbr12"}, "requireAgent": true
    }]});
    list["name"] = json!(format!("pn-wait-{}", std::process::id()));
    let cni = runtime(&p.bin(), &host);
    {
        // Only root may tell the agent which MAC and addresses a port uses.
        use std::os::unix::fs::PermissionsExt;
        // (Polled: the listener binds, then narrows the mode.)
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let mode = std::fs::metadata(&socket)
                .map(|m| m.permissions().mode() & 0o777)
                .ok();
            if mode == Some(0o600) {
                break;
            }
            assert!(
                std::time::Instant::now() < until,
                "agent socket mode {:?}, want Some(0o600 = 384)",
                mode
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    let mut at = attach("wait-a", &pod);
    at.args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=web".into();
    let r = cni.add_list(&list, &at).unwrap();
    let ip = first_ip(&r);
    let mut got = seen.lock().unwrap().clone();
    got.sort();
    assert_eq!(
        got,
        [
            format!("add ns1/web [{ip}]"),
            format!("guard wait-a Some((true, [{ip}]))")
        ]
    );
    // The port guard's record, for an agent that starts later.
    let record = state.path().join("guard").join("wait-a");
    let rec: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    assert_eq!(rec["namespace"], "ns1", "{rec}");
    assert_eq!(rec["ips"], json!([ip.to_string()]), "{rec}");
    seen.lock().unwrap().clear();
    cni.del_list(&list, &at, Some(&r)).unwrap();
    assert!(!record.exists(), "DEL removes the guard record");
    // DEL is a notice: the server answers once it has queued it, and the
    // loop's side records it on its own task.
    podnet_testkit::eventually("the DEL notice", std::time::Duration::from_secs(5), || {
        let s = seen.lock().unwrap();
        s.iter().any(|l| l == "del ns1/web") && s.iter().any(|l| l == "guard wait-a None")
    });
    // The agent says no: ADD fails, retryable, and leaves nothing.
    fail.store(true, std::sync::atomic::Ordering::SeqCst);
    let e = cni.add_list(&list, &at).unwrap_err();
    assert_eq!(e.code, 11, "{e}");
    assert!(
        e.to_string()
            .contains("the agent did not confirm pod ns1/web")
            && e.to_string().contains("the table is full"),
        "{e}"
    );
    assert!(
        !pod.try_sh("ip link show eth0").0,
        "the attachment was undone"
    );
    // No agent (issue 23): ADD waits `agentWaitSeconds` for one, then
    // fails, retryable, naming the socket, and has made nothing: no
    // interface, no IPAM allocation, no saved delegate config. A stopped
    // agent leaves its socket file with nobody listening; no agent ever
    // leaves none: both fail.
    fail.store(false, std::sync::atomic::Ordering::SeqCst);
    drop(rt);
    assert!(socket.exists(), "a stopped agent leaves its socket file");
    list["plugins"][0]["agentWaitSeconds"] = json!(0.2);
    let net_dir = Path::new("/var/lib/cni/networks").join(list["name"].as_str().unwrap());
    let allocated = || -> Vec<String> {
        std::fs::read_dir(&net_dir)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("10."))
                    .collect()
            })
            .unwrap_or_default()
    };
    for why in ["nothing listens on its socket", "does not exist"] {
        let e = cni.add_list(&list, &at).unwrap_err();
        assert_eq!(e.code, 11, "{e}");
        assert!(
            e.msg
                .starts_with("podnet: the podnet agent is not running on this node: ")
                && e.msg.contains(why)
                && e.msg.contains(&socket.display().to_string())
                && e.msg.contains("(waited 0.2s)"),
            "{e}"
        );
        assert!(!pod.try_sh("ip link show eth0").0, "an interface was made");
        assert!(allocated().is_empty(), "{:?}", allocated());
        assert!(dir_files(&state.path().join("meta")).is_empty());
        let _ = std::fs::remove_file(&socket);
    }
    // With `requireAgent: false` (a node without an agent by design) ADD
    // does not wait.
    list["plugins"][0]["requireAgent"] = json!(false);
    let r = cni.add_list(&list, &at).unwrap();
    cni.del_list(&list, &at, Some(&r)).unwrap();
    let _ = std::fs::remove_dir_all(net_dir);
}

/// The bridge's MAC and how it was assigned (`addr_assign_type`; 3 is set
/// by userspace, which a bridge keeps), read through `ip netns exec`,
/// which mounts a sysfs of the namespace.
fn bridge_mac(host: &TestNs, bridge: &str) -> String {
    host.sh(&format!(
        "echo $(cat /sys/class/net/{bridge}/address /sys/class/net/{bridge}/addr_assign_type)"
    ))
    .trim()
    .to_string()
}

/// The bridge keeps one MAC (issue 23): a Linux bridge whose MAC the kernel
/// chose takes the lowest MAC among its ports, so it changed with every
/// pod that came or went (all zeros after the last DEL) and pods sent to a
/// gateway MAC that was no longer the bridge's. ADD creates the bridge with
/// a MAC of its own; each ADD and DEL, the last one included, leaves it as
/// it was.
#[test]
fn bridge_mac_is_pinned_from_creation_across_adds_and_dels() {
    let p = Plugins::install();
    let host = TestNs::new("h");
    let pods: Vec<TestNs> = (0..4).map(|i| TestNs::new(&format!("m{i}"))).collect();
    let state = tempfile::tempdir().unwrap();
    let list = conflist("mac1", "pnbr20", "10.220.0.0/24", state.path(), vec![]);
    let rt = runtime(&p.bin(), &host);
    let mut seen = Vec::new();
    let mut results = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let r = rt
            .add_list(&list, &attach(&format!("mac-{i}"), pod))
            .unwrap();
        seen.push((format!("after ADD {i}"), bridge_mac(&host, "pnbr20")));
        results.push(r);
    }
    for (i, pod) in pods.iter().enumerate() {
        rt.del_list(&list, &attach(&format!("mac-{i}"), pod), Some(&results[i]))
            .unwrap();
        seen.push((format!("after DEL {i}"), bridge_mac(&host, "pnbr20")));
    }
    let first = seen[0].1.clone();
    assert!(
        first.ends_with(" 3"),
        "created with a MAC of our own: {seen:?}"
    );
    assert!(
        seen.iter().all(|(_, m)| *m == first),
        "the bridge's MAC changed: {seen:?}"
    );
    assert_eq!(
        results[0]["interfaces"][0]["mac"].as_str().unwrap(),
        first.split(' ').next().unwrap(),
        "the result names the bridge's MAC"
    );
}

/// A bridge without a pinned MAC that already carries pods (made by an
/// older podnet, or by someone else) is repaired by the next ADD: it keeps
/// the MAC it has now, the one its pods know, from then on.
#[test]
fn an_unpinned_bridge_with_pods_gets_its_current_mac_pinned() {
    let p = Plugins::install();
    let host = TestNs::new("h");
    let (old, a) = (TestNs::new("o"), TestNs::new("a"));
    // An "older" pod: a bridge the kernel gives its port's MAC.
    host.sh("ip link add pnbr21 type bridge && ip link set pnbr21 up");
    host.sh(&format!(
        "ip link add vetho type veth peer name eth0 netns {} && ip link set vetho master pnbr21 up",
        old.path().display()
    ));
    let before = bridge_mac(&host, "pnbr21");
    assert!(!before.ends_with(" 3"), "not pinned yet: {before}");
    let port = host.sh("cat /sys/class/net/vetho/address");
    assert_eq!(before.split(' ').next(), Some(port.trim()), "{before}");
    let state = tempfile::tempdir().unwrap();
    let list = conflist("mac2", "pnbr21", "10.221.0.0/24", state.path(), vec![]);
    let rt = runtime(&p.bin(), &host);
    let r = rt.add_list(&list, &attach("mac-a", &a)).unwrap();
    let (mac, _) = before.split_once(' ').unwrap();
    assert_eq!(bridge_mac(&host, "pnbr21"), format!("{mac} 3"));
    // The older pod leaves: its port's MAC stays the bridge's.
    host.sh("ip link del vetho");
    assert_eq!(bridge_mac(&host, "pnbr21"), format!("{mac} 3"));
    rt.del_list(&list, &attach("mac-a", &a), Some(&r)).unwrap();
    assert_eq!(bridge_mac(&host, "pnbr21"), format!("{mac} 3"));
}
