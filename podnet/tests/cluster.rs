//! Cluster state end to end: the real `podnet` binary's apply/get/delete
//! against a private store, and a real `podnet controller` process.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

struct Cluster {
    dir: tempfile::TempDir,
    url: String,
    controllers: Vec<Child>,
    _etcd: Option<podnet_store::testing::EtcdServer>,
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
        let e = podnet_store::testing::EtcdServer::start();
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
        let c = Command::new(env!("CARGO_BIN_EXE_podnet"))
            .args([
                "controller",
                "--metrics-addr",
                "127.0.0.1:0",
                "--resync",
                "2",
            ])
            .env("PODNET_STORE", &self.url)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.controllers.push(c);
    }

    /// Polls `f` until it holds (bounded), for asynchronous controller work.
    fn eventually(&self, what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
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

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.controllers {
            let _ = c.kill();
            let _ = c.wait();
        }
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
"#;

fn check_round_trips(c: &Cluster) {
    let f = c.file("all.yaml", EVERY_KIND);
    let out = c.ok(&["apply", "-f", f.to_str().unwrap()]);
    assert_eq!(
        out.lines().filter(|l| l.ends_with(" created")).count(),
        7,
        "{out}"
    );
    let again = c.ok(&["apply", "-f", f.to_str().unwrap()]);
    assert_eq!(
        again.lines().filter(|l| l.ends_with(" unchanged")).count(),
        7,
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_podnet"))
        .args(["controller", "--metrics-addr", &format!("127.0.0.1:{port}")])
        .env("PODNET_STORE", &c.url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let get = |path: &str| -> String {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return String::new();
        };
        s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
            .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    c.eventually("ready", || get("/readyz").starts_with("HTTP/1.1 200"));
    assert!(get("/healthz").starts_with("HTTP/1.1 200"));
    assert!(get("/metrics").contains("# TYPE podnet_controller_snapshots_total counter"));
    // SIGTERM stops it cleanly.
    unsafe { libc_kill(child.id() as i32, 15) };
    let st = child.wait().unwrap();
    assert!(st.success(), "{st:?}");
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
