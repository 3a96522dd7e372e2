//! Cluster state end to end: the real `podnet` binary's apply/get/delete
//! against a private store, and a real `podnet controller` process.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use podnet_testkit::{eventually, free_port, http_get, Etcd, Proc};
use serde_json::Value;

struct Cluster {
    controllers: Vec<Proc>,
    _etcd: Option<Etcd>,
    url: String,
    dir: tempfile::TempDir,
}

impl Cluster {
    fn sqlite() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("state.db").display());
        Cluster {
            dir,
            url,
            controllers: vec![],
            _etcd: None,
        }
    }

    fn etcd() -> Cluster {
        let e = Etcd::start();
        Cluster {
            dir: tempfile::tempdir().unwrap(),
            url: e.url(),
            controllers: vec![],
            _etcd: Some(e),
        }
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut c = Command::new(env!("CARGO_BIN_EXE_podnet"));
        c.args(args)
            .env("PODNET_STORE", &self.url)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if stdin.is_some() {
            c.stdin(Stdio::piped());
        }
        let mut child = c.spawn().unwrap();
        if let Some(s) = stdin {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        }
        child.wait_with_output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args, None);
        assert!(
            o.status.success(),
            "podnet {args:?} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn apply(&self, yaml: &str) -> Output {
        self.run(&["apply", "-f", "-"], Some(yaml))
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&a)).unwrap()
    }

    fn start_controller(&mut self) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_podnet"));
        cmd.args([
            "controller",
            "--metrics-addr",
            "127.0.0.1:0",
            "--resync",
            "2",
        ])
        .env("PODNET_STORE", &self.url);
        let name = format!("controller-{}", self.controllers.len());
        self.controllers
            .push(Proc::spawn(&name, cmd, self.dir.path()));
    }

    /// Polls `f` until it holds (bounded), for asynchronous controller
    /// work; the controllers must stay up meanwhile.
    fn eventually(&self, what: &str, mut f: impl FnMut() -> bool) {
        eventually(what, Duration::from_secs(20), || {
            self.controllers.iter().for_each(Proc::check);
            f()
        })
    }

    /// Every key and value in the store, to prove a failure changed nothing.
    fn dump(&self) -> Vec<(String, Vec<u8>)> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use podnet_store::Store;
            let s = podnet_store::open(&self.url).await.unwrap();
            s.list("/")
                .await
                .unwrap()
                .0
                .into_iter()
                .map(|k| (k.key, k.value))
                .collect()
        })
    }
}

const EVERY_KIND: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Node
metadata: {name: node-1, labels: {zone: a}}
spec: {podCIDR: 10.244.1.0/24}
status:
  addresses: [{type: InternalIP, address: 192.168.50.2}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: podnet.io/v1
kind: NetworkConfig
metadata: {name: default}
spec: {Network: 10.244.0.0/16, SubnetLen: 24, Backend: {Type: vxlan, VNI: 1}}
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: shop, labels: {app: web}}
spec: {nodeName: node-1, containers: [{name: c, image: none}]}
status: {phase: Running, podIP: 10.244.1.5}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {clusterIP: 10.96.0.20, selector: {app: web}, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: manual, namespace: shop}
addressType: IPv4
endpoints: [{addresses: [10.1.2.3]}]
ports: [{port: 443}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: shop}
spec: {podSelector: {}, policyTypes: [Ingress]}
---
apiVersion: podnet.io/v1
kind: IPAddressPool
metadata: {name: lan}
spec: {addresses: [192.0.2.0/28, "2001:db8::10-2001:db8::20"], autoAssign: false}
---
apiVersion: podnet.io/v1
kind: BGPConfiguration
metadata: {name: default}
spec: {asNumber: 65000, serviceLoadBalancerIPs: [{cidr: 192.0.2.0/24}], l2Announcement: {enabled: true}}
---
apiVersion: podnet.io/v1
kind: BGPPeer
metadata: {name: tor}
spec: {peerIP: 192.0.2.254, asNumber: 65001, bfd: true}
"#;

/// podnet's own kinds print the columns their CRDs give kubectl.
fn own_kinds_print_their_crds_columns(c: &Cluster) {
    let pools = c.ok(&["get", "ipaddresspools"]);
    let rows: Vec<&str> = pools.lines().collect();
    assert_eq!(rows.len(), 2, "{pools}");
    assert!(
        rows[0].starts_with("NAME")
            && rows[0].contains("AUTO ASSIGN   AVOID BUGGY IPS   ADDRESSES"),
        "{pools}"
    );
    let cells: Vec<&str> = rows[1].split_whitespace().collect();
    assert_eq!(
        cells[..4],
        [
            "lan",
            "false",
            "false",
            "192.0.2.0/28,2001:db8::10-2001:db8::20"
        ],
        "{pools}"
    );
    let peers = c.ok(&["get", "bgppeer"]);
    assert!(
        peers.contains("192.0.2.254") && peers.contains("65001") && peers.contains("<all>"),
        "{peers}"
    );
}

fn check_round_trips(c: &Cluster) {
    let f = c.file("all.yaml", EVERY_KIND);
    let out = c.ok(&["apply", "-f", f.to_str().unwrap()]);
    assert_eq!(
        out.lines().filter(|l| l.ends_with(" created")).count(),
        10,
        "{out}"
    );
    let again = c.ok(&["apply", "-f", f.to_str().unwrap()]);
    assert_eq!(
        again.lines().filter(|l| l.ends_with(" unchanged")).count(),
        10,
        "{again}"
    );
    for (kind, name, ns) in [
        ("ns", "shop", None),
        ("no", "node-1", None),
        ("networkconfig", "default", None),
        ("po", "web-1", Some("shop")),
        ("svc", "web", Some("shop")),
        ("ep", "manual", Some("shop")),
        ("netpol", "deny-all", Some("shop")),
        ("ippool", "lan", None),
        ("bgpconfig", "default", None),
        ("bgppeers", "tor", None),
    ] {
        let mut args = vec!["get", kind, name];
        if let Some(n) = ns {
            args.extend(["-n", n]);
        }
        let v = c.json(&args);
        assert_eq!(v["metadata"]["name"], name, "{v}");
        assert!(v["metadata"]["uid"].as_str().unwrap().len() == 36);
        assert!(v["metadata"]["resourceVersion"].as_str().is_some());
        // YAML output parses back into the same object.
        args.extend(["-o", "yaml"]);
        let y: Value = serde_yaml::from_str(&c.ok(&args)).unwrap();
        assert_eq!(y, v);
    }
    let table = c.ok(&["get", "svc", "-n", "shop"]);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(
        table.contains("10.96.0.20") && table.contains("80/TCP"),
        "{table}"
    );
    assert!(c
        .ok(&["get", "po", "-A", "-o", "wide"])
        .contains("10.244.1.5"));
    own_kinds_print_their_crds_columns(c);
    assert!(c
        .ok(&["get", "no", "-l", "zone=a", "-o", "name"])
        .contains("node/node-1"));
    assert!(c
        .ok(&["get", "no", "-l", "zone=b", "-o", "name"])
        .is_empty());
    // Changing a field is a configure; a stale resourceVersion is not needed by apply.
    let out = c.apply("apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {selector: {app: web2}, ports: [{port: 80}]}\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        c.json(&["get", "svc", "web", "-n", "shop"])["spec"]["clusterIP"],
        "10.96.0.20",
        "clusterIP kept"
    );
    // delete by file and by name
    c.ok(&["delete", "netpol", "deny-all", "-n", "shop"]);
    assert!(
        !c.run(&["delete", "-f", f.to_str().unwrap()], None)
            .status
            .success(),
        "netpol already gone: NotFound"
    );
    c.ok(&["delete", "-f", f.to_str().unwrap(), "--ignore-not-found"]);
    assert!(c
        .dump()
        .iter()
        .all(|(k, _)| !k.starts_with("/registry/services/")));
    assert!(
        c.dump()
            .iter()
            .all(|(k, _)| !k.starts_with("/registry/allocations/")),
        "allocations released"
    );
}

#[test]
fn cli_round_trips_every_kind_sqlite() {
    check_round_trips(&Cluster::sqlite());
}

#[test]
fn cli_round_trips_every_kind_etcd() {
    check_round_trips(&Cluster::etcd());
}

#[test]
fn bad_manifests_change_nothing() {
    let c = Cluster::sqlite();
    assert!(c.apply("apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.30, ports: [{port: 80}]}\n").status.success());
    let before = c.dump();
    for (bad, want) in [
        ("key: [unclosed", "invalid YAML"),
        ("apiVersion: v1\nkind: Deployment\nmetadata: {name: x}\n", "unknown kind \"Deployment\""),
        ("apiVersion: v1\nkind: Node\nmetadata: {name: n}\nspec: {podCIDR: 10.0.0.0/99}\n", "spec.podCIDR"),
        ("apiVersion: v1\nkind: Service\nmetadata: {name: b}\nspec: {clusterIP: 10.96.0.30, ports: [{port: 80}]}\n", "10.96.0.30 is already allocated to Service default/a"),
        ("apiVersion: v1\nkind: Service\nmetadata: {name: c}\nspec: {ports: [{port: 99999}]}\n", "spec.ports[0].port"),
        ("apiVersion: v1\nkind: Service\nmetadata: {name: d}\nspec: {type: ExternalName, externalName: x.com, clusterIP: 10.96.0.31}\n", "must be empty for type ExternalName"),
        ("apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.99, ports: [{port: 80}]}\n", "immutable"),
        ("apiVersion: podnet.io/v1\nkind: BGPConfiguration\nmetadata: {name: default}\nspec: {asNumber: 0}\n", "spec.asNumber: AS 0 is reserved"),
        ("apiVersion: podnet.io/v1\nkind: IPAddressPool\nmetadata: {name: p}\nspec: {addresses: [192.0.2.9-192.0.2.1]}\n", "spec.addresses[0]: \"192.0.2.9-192.0.2.1\": the start 192.0.2.9 is after the end 192.0.2.1"),
    ] {
        let o = c.apply(bad);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "accepted: {bad}");
        assert!(err.contains("<stdin>: document 1"), "{err}");
        assert!(err.contains(want), "want {want:?} in {err}");
        assert_eq!(c.dump(), before, "a rejected document changed the store: {bad}");
    }
    // A multi-document apply is all-or-nothing per document.
    let o = c.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: good}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: Bad_Name}\n");
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("document 2 (Namespace Bad_Name)"));
    assert!(c.ok(&["get", "ns"]).contains("good"));
}

fn pod_yaml(name: &str, app: &str, ip: &str, ready: bool) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop, labels: {{app: {app}}}}}\n\
         spec: {{nodeName: n1, containers: [{{name: c, image: x, ports: [{{name: http, containerPort: 8080}}]}}]}}\n\
         status: {{phase: Running, podIP: {ip}, conditions: [{{type: Ready, status: \"{}\"}}]}}\n",
        if ready { "True" } else { "False" }
    )
}

/// The endpoints of Service shop/web: (address, ready) sorted.
fn endpoints(c: &Cluster) -> Vec<(String, bool)> {
    let v = c.json(&[
        "get",
        "ep",
        "-n",
        "shop",
        "-l",
        "kubernetes.io/service-name=web",
    ]);
    let mut out: Vec<(String, bool)> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
        .map(|e| {
            (
                e["addresses"][0].as_str().unwrap().to_string(),
                e["conditions"]["ready"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn controller_endpoints_follow_pods() {
    let mut c = Cluster::sqlite();
    c.start_controller();
    assert!(c.apply("apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {selector: {app: web}, ports: [{name: http, port: 80, targetPort: http}]}\n").status.success());
    c.eventually("a ClusterIP", || {
        c.json(&["get", "svc", "web", "-n", "shop"])["spec"]["clusterIP"]
            .as_str()
            .is_some()
    });
    let ip = c.json(&["get", "svc", "web", "-n", "shop"])["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        ip.starts_with("10.9") || ip.starts_with("10.10") || ip.starts_with("10.11"),
        "{ip}"
    );

    // create (not ready yet), then ready
    c.apply(&pod_yaml("web-1", "web", "10.244.1.5", false));
    c.eventually("not-ready endpoint", || {
        endpoints(&c) == vec![("10.244.1.5".into(), false)]
    });
    c.apply(&pod_yaml("web-1", "web", "10.244.1.5", true));
    c.apply(&pod_yaml("web-2", "web", "10.244.2.5", true));
    c.eventually("two ready endpoints", || {
        endpoints(&c) == vec![("10.244.1.5".into(), true), ("10.244.2.5".into(), true)]
    });
    // the named target port resolved per pod
    let v = c.json(&[
        "get",
        "ep",
        "-n",
        "shop",
        "-l",
        "kubernetes.io/service-name=web",
    ]);
    assert_eq!(v["items"][0]["ports"][0]["port"], 8080);
    assert_eq!(v["items"][0]["endpoints"][0]["nodeName"], "n1");
    // not ready again
    c.apply(&pod_yaml("web-2", "web", "10.244.2.5", false));
    c.eventually("web-2 not ready", || {
        endpoints(&c) == vec![("10.244.1.5".into(), true), ("10.244.2.5".into(), false)]
    });
    // relabel away, delete
    c.apply(&pod_yaml("web-1", "other", "10.244.1.5", true));
    c.eventually("relabelled pod gone", || {
        endpoints(&c) == vec![("10.244.2.5".into(), false)]
    });
    c.ok(&["delete", "pod", "web-2", "-n", "shop"]);
    c.eventually("deleted pod gone", || endpoints(&c).is_empty());
    // A slice deleted by hand is restored.
    let name = c.json(&["get", "ep", "-n", "shop"])["items"][0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    c.ok(&["delete", "ep", &name, "-n", "shop"]);
    c.eventually("slice restored", || {
        c.ok(&["get", "ep", "-n", "shop", "-o", "name"])
            .contains(&name)
    });
    // Services without selectors are left alone; deleting the Service removes its slices.
    c.apply("apiVersion: v1\nkind: Service\nmetadata: {name: manual, namespace: shop}\nspec: {ports: [{port: 80}]}\n");
    c.ok(&["delete", "svc", "web", "-n", "shop"]);
    c.eventually("slices of a deleted service removed", || {
        c.ok(&["get", "ep", "-n", "shop", "-o", "name"]).is_empty()
    });
    // Metrics and health are served.
}

/// Reservations nobody holds are released: one left by a Service deleted
/// while no controller ran (found by the first full sync, which reads the
/// store) and one of a Service deleted while the controller runs (released
/// as the deletion is applied); a Service's own stay.
#[test]
fn controller_releases_reservations_no_service_holds() {
    let mut c = Cluster::sqlite();
    let orphan = "/registry/allocations/clusterips/10.96.200.200";
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use podnet_store::Store;
        let s = podnet_store::open(&c.url).await.unwrap();
        s.txn(vec![podnet_store::Op::Create {
            key: orphan.into(),
            value: b"default/gone".to_vec(),
            lease: 0,
        }])
        .await
        .unwrap();
    });
    let keys = |c: &Cluster| -> Vec<String> {
        c.dump()
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| k.starts_with("/registry/allocations/"))
            .collect()
    };
    assert_eq!(keys(&c), [orphan]);
    let svc = |name: &str| {
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{type: NodePort, ports: [{{port: 80}}]}}\n")
    };
    assert!(c.apply(&svc("kept")).status.success());
    assert!(c.apply(&svc("dropped")).status.success());
    c.start_controller();
    c.eventually("the orphan released, the Services allocated", || {
        let k = keys(&c);
        !k.contains(&orphan.to_string()) && k.len() == 4
    });
    c.ok(&["delete", "svc", "dropped"]);
    c.eventually("the deleted Service's reservations released", || {
        keys(&c).len() == 2
    });
    let ip = c.json(&["get", "svc", "kept"])["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(keys(&c).iter().any(|k| k.ends_with(&ip)), "{:?}", keys(&c));
}

#[test]
fn fifty_concurrent_service_creates_get_distinct_ips() {
    let mut c = Cluster::sqlite();
    // Two controllers race for the same pool.
    c.start_controller();
    c.start_controller();
    let url = c.url.clone();
    let handles: Vec<_> = (0..50)
        .map(|i| {
            let url = url.clone();
            std::thread::spawn(move || {
                let yaml = format!(
                    "apiVersion: v1\nkind: Service\nmetadata: {{name: s{i}}}\nspec: {{type: NodePort, ports: [{{port: 80}}]}}\n"
                );
                let mut p = Command::new(env!("CARGO_BIN_EXE_podnet"))
                    .args(["apply", "-f", "-"])
                    .env("PODNET_STORE", &url)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                use std::io::Write;
                p.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
                let o = p.wait_with_output().unwrap();
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let all = || c.json(&["get", "svc"]);
    c.eventually("all 50 allocated", || {
        all()["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| {
                s["spec"]["clusterIP"].is_string() && s["spec"]["ports"][0]["nodePort"].is_number()
            })
            .count()
            == 50
    });
    let v = all();
    let ips: std::collections::HashSet<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["spec"]["clusterIP"].as_str().unwrap())
        .collect();
    let ports: std::collections::HashSet<i64> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["spec"]["ports"][0]["nodePort"].as_i64().unwrap())
        .collect();
    assert_eq!(ips.len(), 50, "duplicate ClusterIPs");
    assert_eq!(ports.len(), 50, "duplicate NodePorts");
    let allocs = c
        .dump()
        .into_iter()
        .filter(|(k, _)| k.starts_with("/registry/allocations/"))
        .count();
    assert_eq!(allocs, 100, "one reservation per IP and port, none leaked");
    // Deleting releases them.
    let names: Vec<String> = (0..50).map(|i| format!("s{i}")).collect();
    let mut args = vec!["delete", "svc"];
    args.extend(names.iter().map(String::as_str));
    c.ok(&args);
    assert_eq!(
        c.dump()
            .into_iter()
            .filter(|(k, _)| k.starts_with("/registry/allocations/"))
            .count(),
        0
    );
}

#[test]
fn controller_serves_metrics_and_health() {
    let c = Cluster::sqlite();
    let port = free_port(None);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_podnet"));
    cmd.args(["controller", "--metrics-addr", &format!("127.0.0.1:{port}")])
        .env("PODNET_STORE", &c.url);
    let mut controller = Proc::spawn("controller", cmd, c.dir.path());
    let addr = ([127, 0, 0, 1], port).into();
    let get = |path: &str| http_get(None, addr, path).unwrap_or_default();
    c.eventually("ready", || {
        controller.check();
        get("/readyz").0 == 200
    });
    assert_eq!(get("/healthz").0, 200);
    assert!(get("/metrics")
        .1
        .contains("# TYPE podnet_controller_snapshots_total counter"));
    // SIGTERM stops it cleanly.
    let st = controller.terminate(Duration::from_secs(20));
    assert!(st.success(), "{st:?}");
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Names of the objects of a kind (namespace `default` when namespaced).
fn names(c: &Cluster, kind: &str) -> Vec<String> {
    let v = c.json(&["get", kind]);
    let mut out: Vec<String> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    out.sort();
    out
}

fn ns_doc(name: &str) -> String {
    format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {name}}}\n")
}

fn ns_json(name: &str) -> String {
    format!(r#"{{"apiVersion": "v1", "kind": "Namespace", "metadata": {{"name": "{name}"}}}}"#)
}

/// The fault run's finding: a bad document in the middle of a source used
/// to drop every later one while the earlier ones were applied. Now every
/// source is read first, and nothing is written unless all of it decodes;
/// each bad document is named by file, index and starting line.
#[test]
fn apply_reads_every_source_before_writing() {
    let c = Cluster::sqlite();
    c.ok(&[
        "apply",
        "-f",
        c.file("seed.yaml", &ns_doc("seed")).to_str().unwrap(),
    ]);
    let before = c.dump();
    let yaml_error = format!(
        "{}---\nkind: Namespace\nmetadata: {{name: [unclosed\n---\n{}",
        ns_doc("a"),
        ns_doc("b")
    );
    let truncated_json = format!(
        "{}\n\n{}\n{{\"apiVersion\": \"v1\", \"kind\": \"Names",
        ns_json("a"),
        ns_json("b")
    );
    let unknown_kind = format!(
        "{}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web}}\n---\n{}",
        ns_doc("a"),
        ns_doc("b")
    );
    let bad_separator = format!("{}--- {{kind: Namespace}}\n{}", ns_doc("a"), ns_doc("b"));
    for (name, text, want) in [
        (
            "yaml.yaml",
            &yaml_error,
            "yaml.yaml: document 2 at line 5: decoding: invalid YAML at line 7 column 1: ",
        ),
        (
            "json.json",
            &truncated_json,
            "json.json: document 3 at line 4: decoding: invalid JSON: EOF while parsing",
        ),
        (
            "kind.yaml",
            &unknown_kind,
            "kind.yaml: document 2 (Deployment web) at line 5: unknown kind \"Deployment\"",
        ),
        (
            "sep.yaml",
            &bad_separator,
            "sep.yaml: document 2 at line 4: decoding: invalid YAML document separator",
        ),
    ] {
        let f = c.file(name, text);
        let o = c.run(&["apply", "-f", f.to_str().unwrap()], None);
        let err = stderr(&o);
        assert!(!o.status.success(), "{name} accepted");
        assert!(
            o.stdout.is_empty(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
        let line = err
            .lines()
            .find(|l| l.starts_with("error: "))
            .unwrap_or_default();
        assert!(line.contains(want), "{name}: want {want:?} in {err}");
        assert!(
            err.contains("1 document(s) could not be read") && err.contains("nothing was applied"),
            "{err}"
        );
        assert_eq!(
            c.dump(),
            before,
            "{name}: a source that failed to read changed the store"
        );
    }

    // Several sources are one input: a bad second file keeps the good first
    // one (and a good directory) from being applied too, and every bad
    // document of every source is named.
    let good = c.file("good.yaml", &ns_doc("good"));
    let two_bad = c.file(
        "two-bad.yaml",
        &format!(
            "{}---\nkind: Namespace\nmetadata: [\n---\n{}---\nkind: Pod2\n",
            ns_doc("x"),
            ns_doc("y")
        ),
    );
    let dir = c.dir.path().join("manifests");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("1-ns.yaml"), ns_doc("from-dir")).unwrap();
    std::fs::write(dir.join("2-broken.json"), "{\"apiVersion\": \"v1\",").unwrap();
    std::fs::write(dir.join("notes.txt"), "not a manifest: [").unwrap();
    let o = c.run(
        &[
            "apply",
            "-f",
            good.to_str().unwrap(),
            "-f",
            two_bad.to_str().unwrap(),
            "-f",
            dir.to_str().unwrap(),
        ],
        None,
    );
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("two-bad.yaml: document 2 at line 5: decoding: invalid YAML"),
        "{err}"
    );
    assert!(
        err.contains("two-bad.yaml: document 4 (Pod2 ?) at line 12: unknown kind \"Pod2\""),
        "{err}"
    );
    assert!(
        err.contains("2-broken.json: document 1 at line 1: decoding: invalid JSON"),
        "{err}"
    );
    assert!(
        !err.contains("notes.txt"),
        "only .json/.yaml/.yml files of a directory are read: {err}"
    );
    assert!(err.contains("3 document(s) could not be read"), "{err}");
    assert_eq!(c.dump(), before);
    assert_eq!(names(&c, "ns"), ["seed"]);

    // The same input with the bad sources fixed applies every document.
    std::fs::write(&two_bad, format!("{}---\n{}", ns_doc("x"), ns_doc("y"))).unwrap();
    std::fs::remove_file(dir.join("2-broken.json")).unwrap();
    c.ok(&[
        "apply",
        "-f",
        good.to_str().unwrap(),
        "-f",
        two_bad.to_str().unwrap(),
        "-f",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(names(&c, "ns"), ["from-dir", "good", "seed", "x", "y"]);
}

/// Documents that decode but are rejected when applied are each named, the
/// others are applied, and the counts are right.
#[test]
fn apply_names_every_rejected_document() {
    let c = Cluster::sqlite();
    let text = format!(
        "{}---\n{}---\n{}---\n{}---\n{}",
        ns_doc("one"),
        ns_doc("Bad_Name"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: 10.96.0.40, ports: [{port: 80}]}\n",
        "apiVersion: v1\nkind: Service\nmetadata: {name: port}\nspec: {ports: [{port: 99999}]}\n",
        ns_doc("two"),
    );
    let f = c.file("mixed.yaml", &text);
    let o = c.run(&["apply", "-f", f.to_str().unwrap()], None);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(!o.status.success());
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "namespace/one created",
            "service/web created",
            "namespace/two created"
        ],
        "{err}"
    );
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 2, "{err}");
    assert!(
        errors[0].starts_with(&format!(
            "error: {}: document 2 (Namespace Bad_Name) at line 5: metadata.name",
            f.display()
        )),
        "{err}"
    );
    assert!(
        errors[1].starts_with(&format!(
            "error: {}: document 4 (Service default/port) at line 14: spec.ports[0].port",
            f.display()
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "2 of 5 document(s) failed ({0} document 2 at line 5, {0} document 4 at line 14); the other 3 were applied",
            f.display()
        )),
        "{err}"
    );
    assert_eq!(names(&c, "ns"), ["one", "two"]);
    assert_eq!(names(&c, "svc"), ["web"]);
}

/// kubectl's behaviour for sources with no object: `kubectl apply` fails
/// with "no objects passed to apply" when the whole input holds none (an
/// empty file, comments, `---` only), skips such a source among others, and
/// reads through a leading byte order mark (UTF-8 dropped, UTF-16
/// transcoded, as cli-runtime's FileVisitor does).
#[test]
fn apply_empty_sources_and_byte_order_marks_like_kubectl() {
    let c = Cluster::sqlite();
    let before = c.dump();
    for (name, text) in [
        ("empty.yaml", ""),
        ("blank.yaml", "\n\n  \n"),
        ("comments.yaml", "# nothing here\n# at all\n"),
        ("dashes.yaml", "---\n---\n"),
        (
            "mixed.yaml",
            "---\n# only a comment\n---\nnull\n--- # trailing\n",
        ),
        ("bom-only.yaml", "\u{feff}"),
    ] {
        let f = c.file(name, text);
        let o = c.run(&["apply", "-f", f.to_str().unwrap()], None);
        assert!(!o.status.success(), "{name} succeeded");
        assert_eq!(
            stderr(&o).trim(),
            "podnet: no objects passed to apply",
            "{name}"
        );
    }
    let o = c.apply("");
    assert_eq!(stderr(&o).trim(), "podnet: no objects passed to apply");
    // An empty directory is kubectl's "recognized file extensions" error.
    let dir = c.dir.path().join("empty-dir");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("README.md"), "# not a manifest\n").unwrap();
    let o = c.run(&["apply", "-f", dir.to_str().unwrap()], None);
    assert_eq!(
        stderr(&o).trim(),
        format!(
            "podnet: error reading [{}]: recognized file extensions are [.json .yaml .yml]",
            dir.display()
        )
    );
    let o = c.run(
        &[
            "apply",
            "-f",
            c.dir.path().join("missing.yaml").to_str().unwrap(),
        ],
        None,
    );
    assert!(
        stderr(&o).contains("missing.yaml\" does not exist"),
        "{}",
        stderr(&o)
    );
    assert_eq!(c.dump(), before);

    // An empty source beside others is skipped.
    let empty = c.file("empty.yaml", "");
    let one = c.file(
        "one.yaml",
        &format!("# header\n---\n{}---\n", ns_doc("one")),
    );
    c.ok(&[
        "apply",
        "-f",
        empty.to_str().unwrap(),
        "-f",
        one.to_str().unwrap(),
    ]);

    // Byte order marks: UTF-8 on YAML and JSON, UTF-16 LE and BE.
    let bom_yaml = c.file("bom.yaml", &format!("\u{feff}{}", ns_doc("bom-yaml")));
    let bom_json = c.file("bom.json", &format!("\u{feff}{}", ns_json("bom-json")));
    let utf16 = |name: &str, le: bool| {
        let p = c.dir.path().join(name);
        let mut b: Vec<u8> = if le {
            vec![0xFF, 0xFE]
        } else {
            vec![0xFE, 0xFF]
        };
        for u in ns_doc(name.trim_end_matches(".yaml")).encode_utf16() {
            b.extend(if le { u.to_le_bytes() } else { u.to_be_bytes() });
        }
        std::fs::write(&p, b).unwrap();
        p
    };
    let le = utf16("utf16le.yaml", true);
    let be = utf16("utf16be.yaml", false);
    let out = c.ok(&[
        "apply",
        "-f",
        bom_yaml.to_str().unwrap(),
        "-f",
        bom_json.to_str().unwrap(),
        "-f",
        le.to_str().unwrap(),
        "-f",
        be.to_str().unwrap(),
    ]);
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "namespace/bom-yaml created",
            "namespace/bom-json created",
            "namespace/utf16le created",
            "namespace/utf16be created"
        ]
    );
    assert_eq!(
        names(&c, "ns"),
        ["bom-json", "bom-yaml", "one", "utf16be", "utf16le"]
    );
}

/// Two Services asking for one clusterIP: the earlier document wins, every
/// time. Documents used to be written concurrently, so the winner depended
/// on scheduling; the earlier Service of each pair here is made slower to
/// write (a large annotation), which let the later one win under the old
/// code in most rounds. 20 fresh stores, 6 pairs each.
#[test]
fn earlier_document_wins_a_cluster_ip_conflict() {
    const PAIRS: usize = 6;
    let big = "x".repeat(256 * 1024);
    let mut text = String::new();
    for i in 0..PAIRS {
        text.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: first-{i}, annotations: {{note: {big}}}}}\n\
             spec: {{clusterIP: 10.96.0.{ip}, ports: [{{port: 80}}]}}\n\
             ---\napiVersion: v1\nkind: Service\nmetadata: {{name: second-{i}}}\n\
             spec: {{clusterIP: 10.96.0.{ip}, ports: [{{port: 80}}]}}\n",
            ip = 50 + i
        ));
    }
    for round in 0..20 {
        let c = Cluster::sqlite();
        let f = c.file("pairs.yaml", &text);
        let o = c.run(&["apply", "-f", f.to_str().unwrap()], None);
        let err = stderr(&o);
        assert!(!o.status.success(), "round {round}: both of a pair applied");
        let v = c.json(&["get", "svc"]);
        let mut got: Vec<(String, String)> = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["metadata"]["name"].as_str().unwrap().to_string(),
                    s["spec"]["clusterIP"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        got.sort();
        let want: Vec<(String, String)> = (0..PAIRS)
            .map(|i| (format!("first-{i}"), format!("10.96.0.{}", 50 + i)))
            .collect();
        assert_eq!(got, want, "round {round}: {err}");
        for i in 0..PAIRS {
            let want = format!(
                "document {} (Service default/second-{i}) at line {}: spec.clusterIP: 10.96.0.{} is already allocated to Service default/first-{i}",
                2 * i + 2,
                10 * i + 7,
                50 + i
            );
            assert!(err.contains(&want), "round {round}: want {want:?} in {err}");
        }
        assert!(
            err.contains(&format!("{PAIRS} of {} document(s) failed", 2 * PAIRS))
                && err.contains(&format!("the other {PAIRS} were applied")),
            "{err}"
        );
    }

    // Across files, a directory is applied in name order: a.yaml's Service
    // wins over b.yaml's although b.yaml was written first.
    let c = Cluster::sqlite();
    let dir = c.dir.path().join("svcs");
    std::fs::create_dir(&dir).unwrap();
    let svc = |name: &str| {
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{clusterIP: 10.96.0.90, ports: [{{port: 80}}]}}\n")
    };
    std::fs::write(dir.join("b.yaml"), svc("from-b")).unwrap();
    std::fs::write(dir.join("a.yaml"), svc("from-a")).unwrap();
    let o = c.run(&["apply", "-f", dir.to_str().unwrap()], None);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("b.yaml: document 1 (Service default/from-b) at line 1: spec.clusterIP: 10.96.0.90 is already allocated to Service default/from-a"),
        "{}",
        stderr(&o)
    );
    assert_eq!(names(&c, "svc"), ["from-a"]);
}

/// The same object twice in one input: the later document is applied on
/// top of the earlier one (read again after its write), as kubectl would.
#[test]
fn apply_same_object_twice_in_order() {
    let c = Cluster::sqlite();
    let text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: n, labels: {v: one}}\n---\n\
                apiVersion: v1\nkind: Namespace\nmetadata: {name: n, labels: {v: two}}\n---\n\
                apiVersion: v1\nkind: Namespace\nmetadata: {name: n, labels: {v: one}}\n";
    let out = c.ok(&["apply", "-f", c.file("n.yaml", text).to_str().unwrap()]);
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "namespace/n created",
            "namespace/n configured",
            "namespace/n configured"
        ]
    );
    assert_eq!(
        c.json(&["get", "ns", "n"])["metadata"]["labels"]["v"],
        "one"
    );
}

/// `delete -f` reads its input the same way: a document that cannot be
/// read means nothing is deleted.
#[test]
fn delete_reads_every_source_before_deleting() {
    let c = Cluster::sqlite();
    c.ok(&[
        "apply",
        "-f",
        c.file("ns.yaml", &format!("{}---\n{}", ns_doc("a"), ns_doc("b")))
            .to_str()
            .unwrap(),
    ]);
    let f = c.file(
        "del.yaml",
        &format!(
            "{}---\nkind: Namespace\nmetadata: {{name: [b\n",
            ns_doc("a")
        ),
    );
    let o = c.run(&["delete", "-f", f.to_str().unwrap()], None);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("del.yaml: document 2 at line 5: decoding: invalid YAML"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("nothing was deleted"), "{}", stderr(&o));
    assert_eq!(names(&c, "ns"), ["a", "b"]);
}

// LoadBalancer addresses from IPAddressPools (LB IPAM, issue 26).

fn pool_yaml(name: &str, addresses: &str) -> String {
    format!("apiVersion: podnet.io/v1\nkind: IPAddressPool\nmetadata: {{name: {name}}}\nspec: {{addresses: [{addresses}]}}\n")
}

/// A LoadBalancer Service `default/<name>`, with `spec` fields added and
/// `annotations` (a YAML flow map).
fn lb_yaml(name: &str, spec: &str, annotations: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, annotations: {annotations}}}\n\
         spec: {{type: LoadBalancer, selector: {{app: {name}}}, ports: [{{port: 80}}]{spec}}}\n"
    )
}

/// The load-balancer addresses Service default/`name` shows.
fn lb_ips(c: &Cluster, name: &str) -> Vec<String> {
    let v = c.json(&["get", "svc", name]);
    v["status"]["loadBalancer"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| i["ip"].as_str().unwrap().to_string())
        .collect()
}

/// Every load-balancer reservation: address -> value.
fn lb_reservations(c: &Cluster) -> std::collections::BTreeMap<String, String> {
    c.dump()
        .into_iter()
        .filter_map(|(k, v)| {
            let ip = k.strip_prefix("/registry/allocations/lbips/")?.to_string();
            Some((ip, String::from_utf8(v).unwrap()))
        })
        .collect()
}

fn applied(c: &Cluster, yaml: &str) {
    let o = c.apply(yaml);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A Service gets the lowest address of the pool, reserved under its
/// name; it loses it (status cleared, reservation released) when it stops
/// being a LoadBalancer and when its pool goes; another class is left
/// alone.
#[test]
fn lb_service_gets_an_address_from_a_pool() {
    let mut c = Cluster::sqlite();
    c.start_controller();
    applied(&c, &pool_yaml("lan", "192.0.2.0/30"));
    applied(&c, &lb_yaml("web", "", "{}"));
    c.eventually("web's address", || lb_ips(&c, "web") == ["192.0.2.0"]);
    assert_eq!(
        lb_reservations(&c),
        [("192.0.2.0".to_string(), "default/web".to_string())].into()
    );
    assert!(c.ok(&["get", "svc", "web"]).contains("192.0.2.0"));
    // Not a LoadBalancer any more: cleared and released.
    applied(&c, "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {type: ClusterIP, selector: {app: web}, ports: [{port: 80}]}\n");
    c.eventually("web's address cleared", || {
        lb_ips(&c, "web").is_empty() && lb_reservations(&c).is_empty()
    });
    applied(&c, &lb_yaml("web", "", "{}"));
    c.eventually("web's address again", || lb_ips(&c, "web") == ["192.0.2.0"]);
    // Another implementation's Service gets nothing from podnet.
    applied(
        &c,
        &lb_yaml("cloud", ", loadBalancerClass: example.com/cloud", "{}"),
    );
    // The pool goes: taken back.
    c.ok(&["delete", "ipaddresspool", "lan"]);
    c.eventually("the address taken back", || {
        lb_ips(&c, "web").is_empty() && lb_reservations(&c).is_empty()
    });
    assert!(lb_ips(&c, "cloud").is_empty());
    let log = c.controllers[0].log();
    assert!(
        log.contains("no load-balancer address: there are no IPAddressPools"),
        "{log}"
    );
    assert!(
        !log.contains("default/cloud"),
        "another class is not ours: {log}"
    );
}

/// An address asked for is given; the same address asked for by another
/// Service is refused and the controller logs why; deleting the first
/// frees it for the second.
#[test]
fn lb_requested_addresses_honoured_refused_and_freed() {
    let mut c = Cluster::sqlite();
    c.start_controller();
    applied(&c, &pool_yaml("lan", "192.0.2.0/28"));
    applied(&c, &lb_yaml("a", ", loadBalancerIP: 192.0.2.9", "{}"));
    c.eventually("a's requested address", || lb_ips(&c, "a") == ["192.0.2.9"]);
    applied(
        &c,
        &lb_yaml("b", "", "{podnet.io/loadBalancerIPs: 192.0.2.9}"),
    );
    c.eventually("b refused, with the reason logged", || {
        c.controllers[0]
            .log()
            .contains("no load-balancer address: 192.0.2.9 is already in use by Service default/a")
    });
    assert!(lb_ips(&c, "b").is_empty());
    applied(&c, &lb_yaml("out", ", loadBalancerIP: 198.51.100.1", "{}"));
    c.eventually("an address outside every pool refused", || {
        c.controllers[0]
            .log()
            .contains("198.51.100.1 is in no IPAddressPool")
    });
    c.ok(&["delete", "svc", "a"]);
    c.eventually("b gets the freed address", || {
        lb_ips(&c, "b") == ["192.0.2.9"]
    });
    assert_eq!(
        lb_reservations(&c),
        [("192.0.2.9".to_string(), "default/b".to_string())].into()
    );
    // Two Services sharing under one key, ports apart: one address, one
    // reservation naming both.
    let share = "{podnet.io/allow-shared-ip: dns}";
    applied(
        &c,
        &lb_yaml("dns-tcp", ", ports: [{port: 53, protocol: TCP}]", share),
    );
    applied(
        &c,
        &lb_yaml("dns-udp", ", ports: [{port: 53, protocol: UDP}]", share),
    );
    c.eventually("dns shares one address", || {
        let t = lb_ips(&c, "dns-tcp");
        !t.is_empty() && t == lb_ips(&c, "dns-udp")
    });
    let ip = lb_ips(&c, "dns-tcp")[0].clone();
    assert_eq!(
        lb_reservations(&c)[&ip],
        "default/dns-tcp,default/dns-udp;shared=dns"
    );
    c.ok(&["delete", "svc", "dns-tcp"]);
    c.eventually("dns-udp keeps it alone", || {
        lb_reservations(&c).get(&ip).map(String::as_str) == Some("default/dns-udp;shared=dns")
    });
    assert_eq!(lb_ips(&c, "dns-udp"), [ip]);
}

/// Two controllers on one store, 50 LoadBalancer Services applied at once
/// for 40 addresses: 40 Services get one address each, never one twice,
/// 10 get none, and each address has one reservation naming its Service.
#[test]
fn two_controllers_never_hand_out_an_lb_address_twice() {
    let mut c = Cluster::sqlite();
    applied(&c, &pool_yaml("lan", "192.0.2.1-192.0.2.40"));
    c.start_controller();
    c.start_controller();
    let all: String = (0..50)
        .map(|i| format!("---\n{}", lb_yaml(&format!("s{i}"), "", "{}")))
        .collect();
    applied(&c, &all);
    let statuses = || -> Vec<(String, Vec<String>)> {
        let v = c.json(&["get", "svc"]);
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let ips = s["status"]["loadBalancer"]["ingress"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|i| i["ip"].as_str().unwrap().to_string())
                    .collect();
                (s["metadata"]["name"].as_str().unwrap().to_string(), ips)
            })
            .collect()
    };
    c.eventually("40 Services with an address", || {
        statuses().iter().filter(|(_, ips)| !ips.is_empty()).count() == 40
    });
    let check = |st: &[(String, Vec<String>)]| {
        let mut seen = std::collections::BTreeMap::new();
        for (name, ips) in st {
            assert!(ips.len() <= 1, "{name}: {ips:?}");
            for ip in ips {
                let last: u8 = ip.strip_prefix("192.0.2.").unwrap().parse().unwrap();
                assert!((1..=40).contains(&last), "{name}: {ip} outside the pool");
                if let Some(other) = seen.insert(ip.clone(), name.clone()) {
                    panic!("{ip} given to {other} and {name}");
                }
            }
        }
        let want: std::collections::BTreeMap<String, String> = seen
            .iter()
            .map(|(ip, n)| (ip.clone(), format!("default/{n}")))
            .collect();
        assert_eq!(
            lb_reservations(&c),
            want,
            "one reservation per address, naming its Service"
        );
        seen
    };
    let seen = check(&statuses());
    assert_eq!(seen.len(), 40);
    // Five holders go: five waiting Services take their addresses, still
    // never one twice.
    let gone: Vec<String> = seen.values().take(5).cloned().collect();
    let mut args = vec!["delete", "svc"];
    args.extend(gone.iter().map(String::as_str));
    c.ok(&args);
    c.eventually("the freed addresses given again", || {
        let st = statuses();
        st.len() == 45 && st.iter().filter(|(_, ips)| !ips.is_empty()).count() == 40
    });
    let again = check(&statuses());
    assert!(gone.iter().all(|g| !again.values().any(|n| n == g)));
    assert_eq!(
        again.keys().collect::<Vec<_>>(),
        seen.keys().collect::<Vec<_>>(),
        "the same 40 addresses in use"
    );
}

/// A restarted controller keeps every address (rebuilt from the store's
/// statuses and reservations, even with a new pool sorting first), and
/// places a new Service without disturbing them.
#[test]
fn a_restarted_controller_keeps_every_lb_address() {
    let mut c = Cluster::sqlite();
    applied(&c, &pool_yaml("lan", "192.0.2.0/28"));
    c.start_controller();
    let names: Vec<String> = (0..6).map(|i| format!("s{i}")).collect();
    for n in &names {
        applied(&c, &lb_yaml(n, "", "{}"));
    }
    c.eventually("six addresses", || {
        names.iter().all(|n| lb_ips(&c, n).len() == 1)
    });
    let before: Vec<Vec<String>> = names.iter().map(|n| lb_ips(&c, n)).collect();
    let res = lb_reservations(&c);
    assert_eq!(res.len(), 6);
    let st = c.controllers[0].terminate(Duration::from_secs(20));
    assert!(st.success(), "{st:?}");
    c.controllers.clear();
    // While it is down: a pool that sorts first, and a new Service.
    applied(&c, &pool_yaml("a-first", "198.51.100.0/30"));
    applied(&c, &lb_yaml("new", "", "{}"));
    c.start_controller();
    c.eventually("the new Service placed", || {
        lb_ips(&c, "new") == ["198.51.100.0"]
    });
    let after: Vec<Vec<String>> = names.iter().map(|n| lb_ips(&c, n)).collect();
    assert_eq!(after, before, "every address kept");
    let mut want = res;
    want.insert("198.51.100.0".into(), "default/new".into());
    assert_eq!(lb_reservations(&c), want);
}
