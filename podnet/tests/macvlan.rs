//! The `macvlan` plugin against Debian's reference one
//! (/usr/lib/cni/macvlan, the oracle): each case runs through both, each
//! in a host namespace of its own whose underlay is a veth (`pnup0`, its
//! peer in a namespace playing another machine on the segment), and must
//! give the same result or error and leave the same link in the pod
//! (kind, mode, MTU, MAC, addresses, routes). Then, ours alone: two pods
//! on one underlay reach each other and the machine beside them, and
//! what the reference's version here (1.1.1) predates (`linkInContainer`)
//! or does differently on purpose (DEL of an interface it did not make).
//! Two messages differ on purpose: ours names a missing master, and
//! says an interface name is taken.
//! A failed ADD leaves no link in ours (the reference's can).

mod common;

use std::path::Path;

use common::*;
use podnet_kernel::{Handle, LinkKind};
use serde_json::{json, Value};

const REFERENCE: &str = "/usr/lib/cni/macvlan";

/// A host namespace with its underlay: `pnup0` (MTU 1500, 10.88.0.1/24,
/// default route through 10.88.0.254) and the machine beside it, `peer`,
/// at 10.88.0.254.
struct Host {
    host: TestNs,
    peer: TestNs,
}

fn host(tag: &str, default_route: bool) -> Host {
    let (host, peer) = (TestNs::new(tag), TestNs::new("peer"));
    host.sh(&format!(
        "ip link add pnup0 type veth peer name pnup1 netns {} && ip link set pnup0 up",
        peer.name()
    ));
    if default_route {
        host.sh("ip addr add 10.88.0.1/24 dev pnup0 && ip route add default via 10.88.0.254");
    }
    peer.sh("ip link set pnup1 up && ip addr add 10.88.0.254/24 dev pnup1");
    Host { host, peer }
}

fn call(exe: &Path, h: &Host, cmd: &str, pod: &TestNs, conf: &Value, args: &str) -> Value {
    let netns = pod.path().display().to_string();
    let cni_path = exe.parent().unwrap().display().to_string();
    let env = [
        ("CNI_COMMAND", cmd),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", netns.as_str()),
        ("CNI_IFNAME", "net1"),
        ("CNI_PATH", cni_path.as_str()),
        ("CNI_ARGS", args),
    ];
    let (code, out, _) = raw_call(exe, &env, &conf.to_string(), Some(&h.host));
    match out.get("code") {
        // An error: its code and message (ours also names the cniVersion).
        Some(c) => json!({"exit": code, "code": c, "msg": out["msg"]}),
        None => json!({"exit": code, "out": out}),
    }
}

/// The pod's `net1` as the kernel shows it; MACs named by where they came
/// from (asked for, the master's, or the kernel's random one).
fn observe(pod: &TestNs, master_mac: &str, asked: Option<&str>) -> Value {
    let mut h = Handle::in_netns(pod.netns()).unwrap();
    let Some(l) = h.link("net1").unwrap() else {
        return Value::Null;
    };
    let mut addrs: Vec<String> = h
        .addrs(l.index)
        .unwrap()
        .iter()
        .filter(|a| a.scope == 0)
        .map(|a| a.net.to_string())
        .collect();
    addrs.sort();
    let mut routes: Vec<String> = pod
        .sh("ip -4 route show dev net1")
        .lines()
        .map(|l| l.split(" proto ").next().unwrap_or(l).trim().to_string())
        .collect();
    routes.sort();
    json!({
        "kind": format!("{:?}", l.kind), "mode": format!("{:?}", l.macvlan_mode),
        "mtu": l.mtu, "up": l.is_up(), "mac": mac_origin(&l.mac_string(), master_mac, asked),
        "addrs": addrs, "routes": routes,
    })
}

fn mac_origin(mac: &str, master: &str, asked: Option<&str>) -> String {
    if Some(mac) == asked {
        "asked".into()
    } else if mac == master {
        "master".into()
    } else {
        "random".into()
    }
}

/// A result with its MACs named as [`observe`] names them and the
/// sandbox path (different in each run) as a mark.
fn normalized(mut r: Value, pod: &TestNs, master_mac: &str, asked: Option<&str>) -> Value {
    if let Some(ifs) = r
        .pointer_mut("/out/interfaces")
        .and_then(Value::as_array_mut)
    {
        for i in ifs {
            let mac = i["mac"].as_str().unwrap_or_default().to_string();
            i["mac"] = mac_origin(&mac, master_mac, asked).into();
            if i["sandbox"] == pod.path().display().to_string() {
                i["sandbox"] = "<pod>".into();
            }
        }
    }
    if r.pointer("/out/dns") == Some(&json!({})) {
        r["out"].as_object_mut().unwrap().remove("dns");
    }
    r
}

fn conf(extra: Value) -> Value {
    let mut c = json!({"cniVersion": "1.0.0", "name": "mv", "type": "macvlan", "master": "pnup0"});
    c.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    c
}

fn fixed(addr: &str) -> Value {
    json!({"type": "static", "addresses": [{"address": addr}],
           "routes": [{"dst": "192.0.2.0/24", "gw": "10.88.0.254"}]})
}

/// (what, configuration, CNI_ARGS, the MAC asked for, default route on
/// the host, a link already named net1 in the pod). One line each.
#[rustfmt::skip]
type Case = (&'static str, Value, &'static str, Option<&'static str>, bool, bool);

#[rustfmt::skip]
fn cases(state: &Path) -> Vec<Case> {
    let hl = json!({"type": "host-local", "dataDir": state, "ranges": [[{"subnet": "10.88.0.0/24", "rangeStart": "10.88.0.20"}]]});
    vec![
        ("bridge, static, mtu", conf(json!({"mode": "bridge", "mtu": 1400, "ipam": fixed("10.88.0.11/24")})), "", None, true, false),
        ("default mode, host-local", conf(json!({"ipam": hl})), "", None, true, false),
        ("private, layer 2 only", conf(json!({"mode": "private"})), "", None, true, false),
        ("vepa, the config's MAC", conf(json!({"mode": "vepa", "mac": "02:aa:00:00:00:01"})), "", Some("02:aa:00:00:00:01"), true, false),
        ("passthru", conf(json!({"mode": "passthru", "ipam": fixed("10.88.0.12/24")})), "", None, true, false),
        ("CNI_ARGS MAC", conf(json!({"mac": "02:aa:00:00:00:01"})), "IgnoreUnknown=1;K8S_POD_NAME=p;MAC=02:aa:00:00:00:02", Some("02:aa:00:00:00:02"), true, false),
        ("mac capability", conf(json!({"runtimeConfig": {"mac": "02:aa:00:00:00:03"}})), "MAC=02:aa:00:00:00:02", Some("02:aa:00:00:00:03"), true, false),
        ("the default route's link", json!({"cniVersion": "1.0.0", "name": "mv", "type": "macvlan", "ipam": fixed("10.88.0.13/24")}), "", None, true, false),
        ("0.4.0 result", conf(json!({"cniVersion": "0.4.0", "ipam": fixed("10.88.0.14/24")})), "", None, true, false),
        ("DNS from the config", conf(json!({"dns": {"nameservers": ["10.88.0.254"]}, "ipam": fixed("10.88.0.15/24")})), "", None, true, false),
        // Errors, and nothing left in the pod after them.
        ("no default route", json!({"cniVersion": "1.0.0", "name": "mv", "type": "macvlan"}), "", None, false, false),
        ("unknown mode", conf(json!({"mode": "source"})), "", None, true, false),
        ("missing master", conf(json!({"master": "pnnope"})), "", None, true, false),
        ("MTU above the master's", conf(json!({"mtu": 9000})), "", None, true, false),
        ("negative MTU", conf(json!({"mtu": -1})), "", None, true, false),
        ("bad MAC", conf(json!({"mac": "02:aa:00:00:00"})), "", None, true, false),
        ("unknown CNI_ARGS", conf(json!({})), "K8S_POD_NAME=p", None, true, false),
        ("IPAM gives no address", conf(json!({"ipam": {"type": "static"}})), "", None, true, false),
        ("bad IPAM address", conf(json!({"ipam": fixed("10.88.0.300/24")})), "", None, true, false),
        ("name taken in the pod", conf(json!({})), "", None, true, true),
    ]
}

/// One ADD (and, when it worked, CHECK and DEL) through `exe`.
fn run_case(exe: &Path, c: &Case, tag: &str) -> (Value, Value, Value) {
    let (_, conf, args, asked, default_route, taken) = c;
    let h = host(tag, *default_route);
    let pod = TestNs::new("pod");
    if *taken {
        pod.sh("ip link add net1 type veth peer name net1p");
    }
    let master_mac = h
        .host
        .sh("cat /sys/class/net/pnup0/address")
        .trim()
        .to_string();
    let add = call(exe, &h, "ADD", &pod, conf, args);
    let seen = if *taken {
        Value::Null
    } else {
        observe(&pod, &master_mac, *asked)
    };
    let mut rest = json!({});
    if add["exit"] == 0 {
        let mut with_prev = conf.clone();
        with_prev["prevResult"] = add["out"].clone();
        rest["check"] = call(exe, &h, "CHECK", &pod, &with_prev, args)["exit"].clone();
        rest["del"] = call(exe, &h, "DEL", &pod, conf, args)["exit"].clone();
        rest["after_del"] = observe(&pod, &master_mac, *asked);
        rest["del_again"] = call(exe, &h, "DEL", &pod, conf, args)["exit"].clone();
    }
    (normalized(add, &pod, &master_mac, *asked), seen, rest)
}

#[test]
fn the_same_outcomes_as_the_reference_plugin() {
    require_reference_plugins();
    let ours = Plugins::install();
    let ours_exe = ours.bin().join("macvlan");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (cases_ours, cases_ref) = (cases(a.path()), cases(b.path()));
    let mut succeeded = 0;
    for (o, r) in cases_ours.iter().zip(&cases_ref) {
        let mut got = run_case(&ours_exe, o, "mvo");
        let mut want = run_case(Path::new(REFERENCE), r, "mvr");
        if got.0["exit"] != 0 {
            // A failed ADD leaves nothing in the pod. The reference leaves
            // its link behind when IPAM gives no address (its undo reads a
            // shadowed error): not compared.
            assert_eq!(got.1, Value::Null, "{}: ours left a link", o.0);
            want.1 = Value::Null;
        }
        // On purpose: ours names the master it could not find, and says
        // the name is taken rather than that a rename failed.
        let mine = [
            (
                "Link not found",
                "failed to lookup master \"pnnope\": Link not found",
            ),
            (
                "failed to rename macvlan to \"net1\": file exists",
                "macvlan: container interface name \"net1\" already exists",
            ),
        ];
        for (theirs, ours) in mine {
            if want.0["msg"] == theirs {
                assert_eq!(got.0["msg"], ours, "{}", o.0);
                got.0["msg"] = want.0["msg"].clone();
            }
        }
        assert_eq!(got, want, "{}: ours (left) vs the reference (right)", o.0);
        succeeded += usize::from(got.0["exit"] == 0);
    }
    assert_eq!(succeeded, 10, "the success cases succeeded");
}

/// CHECK fails, in ours as in the reference, once the pod's interface no
/// longer matches what ADD gave: an address gone, or another mode asked.
#[test]
fn check_finds_what_changed_as_the_reference_does() {
    require_reference_plugins();
    let ours = Plugins::install();
    let conf = conf(json!({"ipam": fixed("10.88.0.11/24")}));
    let mut outcomes = Vec::new();
    for exe in [ours.bin().join("macvlan"), REFERENCE.into()] {
        let h = host("mvc", true);
        let pod = TestNs::new("pod");
        let add = call(&exe, &h, "ADD", &pod, &conf, "");
        assert_eq!(add["exit"], 0, "{}: {add}", exe.display());
        let mut with_prev = conf.clone();
        with_prev["prevResult"] = add["out"].clone();
        let mut other_mode = with_prev.clone();
        other_mode["mode"] = "private".into();
        let intact = call(&exe, &h, "CHECK", &pod, &with_prev, "")["exit"].clone();
        let mode = call(&exe, &h, "CHECK", &pod, &other_mode, "")["exit"].clone();
        pod.sh("ip route del 192.0.2.0/24");
        let route = call(&exe, &h, "CHECK", &pod, &with_prev, "")["exit"].clone();
        pod.sh("ip addr flush dev net1");
        let addr = call(&exe, &h, "CHECK", &pod, &with_prev, "")["exit"].clone();
        outcomes.push(json!([intact, mode, route, addr]));
    }
    assert_eq!(outcomes[0], json!([0, 1, 1, 1]), "ours");
    assert_eq!(outcomes[0], outcomes[1], "ours (left) vs the reference");
}

/// Ours alone, end to end: two pods on one underlay reach each other and
/// the machine beside them, over TCP; `linkInContainer` finds its master
/// in the pod; DEL leaves an interface that is not a macvlan alone.
#[test]
fn pods_on_one_underlay_reach_each_other_and_the_segment() {
    let ours = Plugins::install();
    let exe = ours.bin().join("macvlan");
    let h = host("mve", true);
    let (a, b) = (TestNs::new("a"), TestNs::new("b"));
    for (pod, ip) in [(&a, "10.88.0.21/24"), (&b, "10.88.0.22/24")] {
        let r = call(&exe, &h, "ADD", pod, &conf(json!({"ipam": fixed(ip)})), "");
        assert_eq!(r["exit"], 0, "{r}");
    }
    let srv = serve_once(&b, 80, "b");
    assert_eq!(connect_from(&a, "10.88.0.22:80").unwrap(), "b");
    assert_eq!(srv.join().unwrap(), "10.88.0.21", "pod to pod, no NAT");
    let srv = serve_once(&h.peer, 81, "peer");
    assert_eq!(connect_from(&a, "10.88.0.254:81").unwrap(), "peer");
    assert_eq!(
        srv.join().unwrap(),
        "10.88.0.21",
        "the segment sees the pod's own address"
    );

    // linkInContainer: the master is the pod's own interface (its own
    // veth here); without the flag the same name is not found on the host.
    let c = TestNs::new("c");
    c.sh("ip link add podup type veth peer name podup1 && ip link set podup up && ip link set podup1 up");
    let inside = conf(json!({"master": "podup", "linkInContainer": true}));
    let r = call(&exe, &h, "ADD", &c, &inside, "");
    assert_eq!(r["exit"], 0, "{r}");
    let mut ch = Handle::in_netns(c.netns()).unwrap();
    let net1 = ch.require_link("net1").unwrap();
    let podup = ch.require_link("podup").unwrap();
    assert_eq!(
        (net1.kind, net1.master.or(net1.peer)),
        (LinkKind::Macvlan, Some(podup.index))
    );
    let r = call(
        &exe,
        &h,
        "ADD",
        &TestNs::new("d"),
        &conf(json!({"master": "podup"})),
        "",
    );
    assert_eq!(
        r["msg"],
        "failed to lookup master \"podup\": Link not found"
    );

    // DEL of a net1 that is not a macvlan: left alone (the reference
    // deletes any link of that name).
    let e = TestNs::new("e");
    e.sh("ip link add net1 type veth peer name net1p");
    let r = call(&exe, &h, "DEL", &e, &conf(json!({})), "");
    assert_eq!(r["exit"], 0, "{r}");
    assert!(
        links(&e).contains(&"net1".to_string()),
        "a veth is not ours to delete"
    );
}
