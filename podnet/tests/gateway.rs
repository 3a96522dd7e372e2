//! The L7 gateway in the lab, in both modes: Ingresses (class `podnet`)
//! and Gateway API routes reach pods through `podnet gateway` on node 1,
//! asked from outside the cluster (an address on the underlay) with the
//! Host header choosing the route; statuses name node 1's address.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use podnet_kernel::Netns;
use podnet_testkit::{eventually, require_root, try_sh_in};
use serde_json::Value;

#[path = "common/kubectl.rs"]
mod kubectl;

const NODE1: &str = "192.168.200.11";
/// An address on the underlay bridge: a client outside the cluster.
const OUTSIDE: &str = "192.168.200.250/24";

struct Lab {
    name: String,
    kube: bool,
}

fn podnet(args: &[&str], stdin: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_podnet"));
    c.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut p = c.spawn().expect("run podnet");
    if let Some(s) = stdin {
        use std::io::Write;
        p.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    p.wait_with_output().unwrap()
}

impl Lab {
    fn up(tag: &str, kube: bool) -> Lab {
        require_root();
        let lab = Lab {
            name: format!("{tag}{}", std::process::id() % 100_000),
            kube,
        };
        let mut args = vec!["up", "--nodes", "2"];
        if kube {
            args.push("--kube");
        }
        lab.ok(&args);
        let (ok, msg) = try_sh_in(
            &format!("pn-{}-net", lab.name),
            &format!("ip addr add {OUTSIDE} dev br0"),
        );
        assert!(ok, "{msg}");
        lab
    }

    fn ok(&self, args: &[&str]) -> String {
        let mut a = vec!["lab", "--name", &self.name];
        a.extend_from_slice(args);
        let o = podnet(&a, None);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "lab {args:?}: {out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        out
    }

    fn store(&self) -> String {
        format!("sqlite:///run/podnet-lab/{}/state.db", self.name)
    }

    fn apply(&self, manifest: &str) {
        let o = match self.kube {
            true => kubectl::run(
                &kubectl::path(),
                &self.name,
                &["apply", "-f", "-"],
                Some(manifest),
            ),
            false => podnet(
                &["--store", &self.store(), "apply", "-f", "-"],
                Some(manifest),
            ),
        };
        assert!(
            o.status.success(),
            "apply: {}\n{manifest}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// An object as JSON (Null when absent).
    fn get(&self, kind: &str, name: &str) -> Value {
        let args = ["get", kind, name, "-o", "json"];
        let o = match self.kube {
            true => kubectl::run(&kubectl::path(), &self.name, &args, None),
            false => podnet(&[&["--store", &self.store()][..], &args[..]].concat(), None),
        };
        serde_json::from_slice(&o.stdout).unwrap_or_default()
    }

    fn pod(&self, name: &str, node: &str) {
        self.ok(&[
            "run",
            &format!("default/{name}"),
            "--node",
            node,
            "--labels",
            "app=web",
            "--ports",
            "8080/tcp",
        ]);
    }

    /// `GET path` with `Host: host` from outside the cluster to `port` on
    /// node 1: the status and body, None when nothing answers.
    fn http(&self, port: u16, host: &str, path: &str) -> Option<(u16, String)> {
        let ns = Netns::named(&format!("pn-{}-net", self.name)).unwrap();
        let r = podnet_daemon::HttpGet::new(Duration::from_secs(5))
            .netns(Some(&ns))
            .host(host)
            .get(format!("{NODE1}:{port}").parse().unwrap(), path);
        r.ok().map(|r| (r.status, r.body.trim().to_string()))
    }

    fn eventually(&self, what: &str, mut f: impl FnMut() -> Result<(), String>) {
        eventually(what, Duration::from_secs(30), &mut f);
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = podnet(&["lab", "--name", &self.name, "down"], None);
    }
}

const BACKEND: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\n\
    spec: {selector: {app: web}, ports: [{name: http, port: 80, targetPort: 8080}]}\n";

const INGRESS: &str = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: web}\n\
    spec:\n  ingressClassName: podnet\n  rules:\n  - host: web.example\n    http:\n      paths:\n      \
    - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}\n";

const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: podnet}\n\
    spec: {controllerName: podnet.io/gateway}\n---\n\
    apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw}\n\
    spec: {gatewayClassName: podnet, listeners: [{name: http, port: 8000, protocol: HTTP}]}\n---\n\
    apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: api}\n\
    spec:\n  parentRefs: [{name: gw}]\n  hostnames: [api.example]\n  rules:\n  \
    - matches: [{path: {type: PathPrefix, value: /v1}}]\n    \
    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /}}}]\n    \
    backendRefs: [{name: web, port: 80}]\n";

fn condition(conds: &Value, ty: &str) -> String {
    conds
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == ty)
        .map(|c| {
            format!(
                "{}/{}",
                c["status"].as_str().unwrap_or(""),
                c["reason"].as_str().unwrap_or("")
            )
        })
        .unwrap_or_default()
}

fn ingress_and_gateway_in(kube: bool, tag: &str) {
    let lab = Lab::up(tag, kube);
    lab.pod("w1", "node1");
    lab.pod("w2", "node2");
    lab.apply(BACKEND);
    lab.apply(INGRESS);
    // Both pods answer through the Ingress, by its host; another host is
    // no route.
    let mut seen = std::collections::BTreeSet::new();
    lab.eventually("both pods through the Ingress", || {
        match lab.http(80, "web.example", "/") {
            Some((200, body)) => drop(seen.insert(body)),
            other => return Err(format!("{other:?}")),
        }
        match seen.len() {
            2 => Ok(()),
            _ => Err(format!("answered so far: {seen:?}")),
        }
    });
    assert_eq!(lab.http(80, "other.example", "/").map(|r| r.0), Some(404));
    // The client's address reaches the pod in X-Forwarded-For.
    let (_, head) = lab.http(80, "web.example", "/request").unwrap();
    assert!(head.contains("x-forwarded-for: 192.168.200.250"), "{head}");
    lab.eventually("the Ingress status names node 1", || {
        let ip = lab.get("ingress", "web")["status"]["loadBalancer"]["ingress"][0]["ip"].clone();
        (ip == NODE1).then_some(()).ok_or(format!("{ip}"))
    });

    lab.apply(GATEWAY);
    lab.eventually("the HTTPRoute through the Gateway", || {
        match lab.http(8000, "api.example", "/v1/clientip") {
            Some((200, body))
                if body == NODE1
                    || body.starts_with("10.244.")
                    || body.starts_with("192.168.200.") =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!(lab.http(8000, "api.example", "/v2").map(|r| r.0), Some(404));
    // `podnet trace` of a URL names the route, the filter and both pods.
    let o = podnet(
        &[
            "trace",
            "outside",
            "http://api.example:8000/v1/x",
            "--lab",
            &lab.name,
        ],
        None,
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for want in [
        "listener  Gateway default/gw listener http",
        "route     HTTPRoute default/api rule 0, match: path PathPrefix /v1",
        "filter    URLRewrite: matched prefix to /",
    ] {
        assert!(out.contains(want), "{want:?} in\n{out}");
    }
    let backend = out
        .lines()
        .find(|l| l.starts_with("backend"))
        .unwrap_or_default();
    assert_eq!(backend.matches(":8080").count(), 2, "both pods: {backend}");
    lab.eventually("the statuses", || {
        let gw = lab.get("gateway", "gw");
        let route = lab.get("httproute", "api");
        let got = (
            condition(&gw["status"]["conditions"], "Programmed"),
            gw["status"]["addresses"][0]["value"].clone(),
            gw["status"]["listeners"][0]["attachedRoutes"].clone(),
            condition(&route["status"]["parents"][0]["conditions"], "Accepted"),
            condition(&route["status"]["parents"][0]["conditions"], "ResolvedRefs"),
        );
        let want = (
            "True/Programmed".to_string(),
            Value::from(NODE1),
            Value::from(1),
            "True/Accepted".to_string(),
            "True/ResolvedRefs".to_string(),
        );
        (got == want).then_some(()).ok_or(format!("{got:?}"))
    });
    if kube {
        lease_is_held(&lab);
    }
}

/// The statuses came from the replica holding the gateway's Lease (its
/// RBAC: create, then get/update by name).
fn lease_is_held(lab: &Lab) {
    let o = kubectl::run(
        &kubectl::path(),
        &lab.name,
        &[
            "get",
            "lease",
            "-n",
            "kube-system",
            "podnet-gateway",
            "-o",
            "json",
        ],
        None,
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let holder = v["spec"]["holderIdentity"].as_str().unwrap_or_default();
    assert!(!holder.is_empty(), "the gateway holds its Lease: {v}");
}

#[test]
fn ingress_and_gateway_in_the_lab() {
    ingress_and_gateway_in(false, "l7");
}

#[test]
fn ingress_and_gateway_in_the_kube_lab() {
    assert!(
        podnet_lab::l7::gateway_api_crds().is_some(),
        "the Gateway API CRDs are not cached: bash scripts/gateway-conformance.sh --crds"
    );
    ingress_and_gateway_in(true, "l7k");
}
