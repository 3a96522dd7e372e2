//! Integration tests for the CNI plugins, run for real in fresh namespaces:
//! each test has its own "host" namespace where the plugins run, and pod
//! namespaces they attach.

mod common;

use std::collections::HashSet;
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
    assert_eq!(ifs[2]["sandbox"], a.path());
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
        .sh("nft list set inet podnet-cni masq4")
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
    let masq = host.sh("nft list set inet podnet-cni masq4");
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
    pod.delete();
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
    let maps = host.sh("nft list map inet podnet-portmap hp4any");
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
    let np = pod.path();
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
        netns: pod.path(),
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
    pod.delete();
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
    let m = host.sh("nft list map inet podnet-portmap hp4any");
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
        "delegate": {"bridge": "pnbr11"}
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
