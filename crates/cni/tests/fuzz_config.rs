//! Bounded fuzzing of the CNI configuration parsers with proptest (a few
//! seconds in all, part of `cargo test`): the network configuration common to
//! every plugin, a conflist as the runtime splits it into per-plugin
//! configurations, bridge's, host-local's, portmap's (runtimeConfig
//! portMappings included), bandwidth's and podnet's keys, podnet's
//! subnet.env, and prevResult.
//!
//! Inputs are random bytes, valid configurations cut or with bytes changed,
//! and valid configurations with JSON values replaced, removed or added.
//! Nothing may panic, and every refusal must be a CNI error a runtime can
//! read: a configuration code (1, 2, 6 or 7), a message, and JSON that
//! round-trips.

use podnet_cni::plugins::{bandwidth, bridge::BridgeConf, meta, portmap};
use podnet_cni::runtime::{Attach, Runtime};
use podnet_cni::types::{negotiate, parse_conf, NetConf};
use podnet_cni::{ipam, CniError, CniResult};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// Valid configurations the mutations start from.
fn seeds() -> Vec<Value> {
    vec![
        json!({"cniVersion": "1.1.0", "name": "t", "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
             "ipam": {"type": "host-local", "dataDir": "/tmp/x",
                      "ranges": [[{"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.10", "rangeEnd": "10.1.0.20", "gateway": "10.1.0.1"}],
                                 [{"subnet": "fd00::/64"}]],
                      "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.0.2.0/24", "gw": "10.1.0.254"}]}},
            {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true},
            {"type": "bandwidth", "capabilities": {"bandwidth": true}, "ingressRate": 1000, "ingressBurst": 800}
        ]}),
        json!({"cniVersion": "1.0.0", "name": "n", "type": "bridge", "bridge": "br0", "isDefaultGateway": true,
               "mtu": 1450, "vlan": 0, "macspoofchk": true,
               "ipam": {"type": "host-local", "subnet": "10.2.0.0/16", "rangeStart": "10.2.0.5", "gateway": "10.2.0.1",
                        "resolvConf": "/etc/resolv.conf"},
               "runtimeConfig": {"mac": "0a:58:0a:f4:01:02", "ips": ["10.2.0.9/16"]}}),
        json!({"cniVersion": "1.1.0", "name": "pm", "type": "portmap",
               "prevResult": {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "sandbox": "/run/netns/x"}],
                              "ips": [{"address": "10.1.0.5/24", "interface": 0, "gateway": "10.1.0.1"}]},
               "runtimeConfig": {"portMappings": [
                   {"HostPort": 8080, "ContainerPort": 80, "Protocol": "TCP", "HostIP": ""},
                   {"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "127.0.0.1"}]}}),
        json!({"cniVersion": "1.0.0", "name": "bw", "type": "bandwidth", "egressRate": 1000000, "egressBurst": 80000,
               "runtimeConfig": {"bandwidth": {"ingressRate": 2000000, "ingressBurst": 160000}}}),
        json!({"cniVersion": "1.0.0", "name": "podnet", "type": "podnet", "subnetFile": "/run/podnet/subnet.env",
               "dataDir": "/var/lib/cni/podnet", "delegate": {"bridge": "podnet0", "hairpinMode": false},
               "cni.dev/valid-attachments": [{"containerID": "c1", "ifname": "eth0"}]}),
    ]
}

/// Every refusal is a readable CNI error with a configuration code.
fn check_err(what: &str, e: &CniError) {
    assert!(
        matches!(e.code, 1 | 2 | 6 | 7),
        "{what}: parse error with code {}: {e}",
        e.code
    );
    assert!(!e.msg.is_empty(), "{what}: error without a message");
    let back = CniError::from_json(e.to_json("1.1.0").as_bytes())
        .unwrap_or_else(|| panic!("{what}: error JSON does not parse: {e}"));
    assert_eq!(&back, e, "{what}: error JSON does not round-trip");
}

fn check<T>(what: &str, r: Result<T, CniError>) {
    if let Err(e) = r {
        check_err(what, &e);
    }
}

/// Runs one plugin configuration through every parser.
fn parse_plugin_conf(b: &[u8]) {
    match parse_conf::<NetConf>(b) {
        Ok(c) if !c.cni_version.is_empty() => check("cniVersion", negotiate(&c.cni_version)),
        Ok(_) => {}
        Err(e) => check_err("network config", &e),
    }
    check("bridge", BridgeConf::parse(b));
    check("host-local", ipam::parse_config(b));
    check("portmap", portmap::parse_config(b));
    check("bandwidth", bandwidth::parse_config(b));
    check("podnet", meta::parse_config(b));
    if let Ok(v) = serde_json::from_slice::<Value>(b) {
        if let Some(p) = v.get("prevResult") {
            check("prevResult", CniResult::from_value(p));
        }
    }
    let text = String::from_utf8_lossy(b);
    check(
        "subnet.env",
        meta::SubnetEnv::parse(&text, "/run/podnet/subnet.env"),
    );
}

/// Runs a document through the parsers as a plugin configuration and, when
/// it has a `plugins` list, as a conflist split the way the runtime does.
fn parse_all(b: &[u8]) {
    parse_plugin_conf(b);
    let Ok(list) = serde_json::from_slice::<Value>(b) else {
        return;
    };
    let Some(plugins) = list.get("plugins").and_then(|p| p.as_array()) else {
        return;
    };
    let mut a = Attach {
        container_id: "c1".into(),
        netns: "/run/netns/x".into(),
        ifname: "eth0".into(),
        ..Default::default()
    };
    a.capability_args.insert(
        "portMappings".into(),
        json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]),
    );
    a.capability_args.insert(
        "bandwidth".into(),
        json!({"ingressRate": 1000, "ingressBurst": 800}),
    );
    let prev = json!({"cniVersion": "1.1.0", "ips": [{"address": "10.1.0.5/24"}]});
    for p in plugins {
        let conf = Runtime::plugin_conf(&list, p, &a, Some(&prev));
        parse_plugin_conf(&serde_json::to_vec(&conf).expect("json"));
    }
}

/// Values likely to reach the parsers' corners, plus arbitrary ones.
fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::from),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => any::<f64>().prop_map(|f| json!(f)),
        3 => prop::sample::select(vec![0i64, 1, -1, 65535, 65536, u32::MAX as i64 * 8])
            .prop_map(Value::from),
        4 => prop::sample::select(vec![
            "",
            "0.0.0.0/0",
            "::/0",
            "169.254.0.0/16",
            "fe80::/10",
            "10.0.0.0/31",
            "10.0.0.1/32",
            "10.0.0.0/8",
            "10.0.0.0/33",
            "fd00::/127",
            "10.0.0.1",
            "fd00::1",
            "::",
            "255.255.255.255",
            "host-local",
            "bridge",
            "portmap",
            "podnet",
            "bandwidth",
            "loopback",
            "tcp",
            "UDP",
            "sctp",
            "icmp",
            "0.3.1",
            "1.1.0",
            "9.9.9",
            "aa:bb:cc:dd:ee:ff",
            "zz",
            "a-name-that-is-far-too-long",
        ])
        .prop_map(Value::from),
        1 => "\\PC{0,16}".prop_map(Value::from),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "type",
            "name",
            "cniVersion",
            "ipam",
            "subnet",
            "ranges",
            "rangeStart",
            "rangeEnd",
            "gateway",
            "routes",
            "dst",
            "gw",
            "dataDir",
            "runtimeConfig",
            "portMappings",
            "PortMappings",
            "hostPort",
            "HostPort",
            "containerPort",
            "protocol",
            "hostIP",
            "HostIP",
            "prevResult",
            "ips",
            "address",
            "interfaces",
            "interface",
            "bandwidth",
            "ingressRate",
            "ingressBurst",
            "egressRate",
            "delegate",
            "vlan",
            "mac",
            "plugins",
            "capabilities",
            "cni.dev/valid-attachments",
        ])
        .prop_map(String::from),
        "[a-zA-Z]{1,8}",
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// JSON pointers of every node of `v`.
fn paths(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                paths(
                    c,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                paths(c, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

#[derive(Debug, Clone)]
enum Mutation {
    Replace(usize, Value),
    Remove(usize),
    Insert(usize, String, Value),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), leaf()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        2 => (any::<usize>(), value()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        2 => any::<usize>().prop_map(Mutation::Remove),
        2 => (any::<usize>(), key(), value()).prop_map(|(i, k, v)| Mutation::Insert(i, k, v)),
    ]
}

fn mutate(mut doc: Value, muts: &[Mutation]) -> Value {
    for m in muts {
        let mut ps = Vec::new();
        paths(&doc, String::new(), &mut ps);
        let pick = |i: usize| ps[i % ps.len()].clone();
        match m {
            Mutation::Replace(i, v) => {
                if let Some(n) = doc.pointer_mut(&pick(*i)) {
                    *n = v.clone();
                }
            }
            Mutation::Remove(i) => {
                let p = pick(*i);
                if let Some((parent, last)) = p.rsplit_once('/') {
                    match doc.pointer_mut(parent) {
                        Some(Value::Object(o)) => {
                            o.remove(&last.replace("~1", "/").replace("~0", "~"));
                        }
                        Some(Value::Array(a)) => {
                            if let Ok(j) = last.parse::<usize>() {
                                if j < a.len() {
                                    a.remove(j);
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            Mutation::Insert(i, k, v) => match doc.pointer_mut(&pick(*i)) {
                Some(Value::Object(o)) => {
                    o.insert(k.clone(), v.clone());
                }
                Some(Value::Array(a)) => a.push(v.clone()),
                _ => {}
            },
        }
    }
    doc
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn random_bytes(b in prop::collection::vec(any::<u8>(), 0..300)) {
        parse_all(&b);
    }
}

proptest! {
    #![proptest_config(config(600))]

    #[test]
    fn cut_and_flipped_configs(
        seed in 0..5usize,
        cut in any::<prop::sample::Index>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
    ) {
        let mut b = serde_json::to_vec(&seeds()[seed]).unwrap();
        let whole = b.clone();
        for (at, byte) in flips {
            let i = at.index(b.len());
            b[i] = byte;
        }
        parse_all(&b);
        parse_all(&whole[..cut.index(whole.len() + 1)]);
    }

}

proptest! {
    // Each case mutates all five seeds alike: 1,500 documents.
    #![proptest_config(config(300))]

    #[test]
    fn mutated_configs(muts in prop::collection::vec(mutation(), 1..5)) {
        for seed in seeds() {
            let doc = mutate(seed, &muts);
            parse_all(&serde_json::to_vec(&doc).unwrap());
            // Each plugin of a list also stands alone as a configuration.
            if let Some(ps) = doc.get("plugins").and_then(|p| p.as_array()) {
                for p in ps {
                    parse_all(&serde_json::to_vec(p).unwrap());
                }
            }
        }
    }
}

/// The seeds themselves parse: the mutations start from valid ground.
#[test]
fn seeds_are_valid() {
    let s = seeds();
    let a = Attach::default();
    let list = &s[0];
    for p in list["plugins"].as_array().unwrap() {
        let conf = serde_json::to_vec(&Runtime::plugin_conf(list, p, &a, None)).unwrap();
        match p["type"].as_str().unwrap() {
            "bridge" => {
                BridgeConf::parse(&conf).unwrap();
                ipam::parse_config(&conf).unwrap();
            }
            "portmap" => {
                portmap::parse_config(&conf).unwrap();
            }
            "bandwidth" => {
                bandwidth::parse_config(&conf).unwrap();
            }
            t => panic!("unexpected type {t}"),
        }
    }
    let b = |v: &Value| serde_json::to_vec(v).unwrap();
    BridgeConf::parse(&b(&s[1])).unwrap();
    ipam::parse_config(&b(&s[1])).unwrap();
    assert_eq!(portmap::parse_config(&b(&s[2])).unwrap().len(), 2);
    bandwidth::parse_config(&b(&s[3])).unwrap();
    meta::parse_config(&b(&s[4])).unwrap();
}
