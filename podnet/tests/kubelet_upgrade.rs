//! Upgrade on real kubelets (issue 24): the kubelets roll podnet's
//! DaemonSet and DNS Deployment while the load of podnet/tests/upgrade.rs
//! runs (`common/load.rs`): two long-lived TCP streams from a client pod on
//! node1 to a pod on node2 (to its IP and through a ClusterIP), new
//! connections to a ClusterIP with endpoints on both nodes, and DNS
//! queries to the cluster DNS Service.
//!
//! The rolling is the kubelets' and the controllers': the DaemonSet
//! (maxUnavailable 1: one node at a time; SIGTERM to the agent, then the
//! other image's init container and agent) and the Deployment
//! (maxUnavailable 1, maxSurge 0: a replica is deleted, its endpoint turns
//! terminating and the proxies drop it, it answers through its preStop
//! sleep, then it is replaced). Steps, each with its counts printed:
//! 1. no roll (the control: what the machine and data path do alone);
//! 2. DNS restarted (`kubectl rollout restart`), then the agents, then
//!    both at once (a DNS replica replaced while another node's agent
//!    restarts: the case that needs the conntrack reconcile);
//! 3. down to the previous release (its manifest and image) and up again
//!    (this manifest and image), each one `kubectl apply`, so agents and
//!    DNS roll at the same time.
//!
//! Nothing may fail, in any step: no DNS query, no new connection, no
//! stream.
//!
//! "The previous release" is the last commit that passed CI
//! ([`PREV_REV`]), built by scripts/old-podnet.sh and packed as an
//! image by scripts/dev-image.sh, like this build. `PODNET_OLD` names
//! another old binary.

#[path = "common/load.rs"]
mod load;
#[path = "common/reallab.rs"]
mod reallab;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use load::{Load, Targets};
use reallab::{e2e_image, eventually, podnet_image, RealLab, DEPLOY_IMAGE};

/// The last release: the last commit that passed CI (stop 34, with the
/// full sync's conntrack reconcile, so rolling down to it loses nothing
/// either).
const PREV_REV: &str = "0a7c7bb";
const OLD_IMAGE: &str = "localhost/podnet:prev";
const STREAM_PORT: u16 = 9100;

const APP: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: load}
---
apiVersion: v1
kind: Pod
metadata: {name: srv1, namespace: load, labels: {app: echo}}
spec:
  nodeSelector: {kubernetes.io/hostname: node1}
  containers:
  - {name: serve, image: localhost/podnet:0.1.0, args: [serve, --name, srv1, --namespace, load, --ports, 8080/tcp]}
---
apiVersion: v1
kind: Pod
metadata: {name: srv2, namespace: load, labels: {app: echo, role: stream}}
spec:
  nodeSelector: {kubernetes.io/hostname: node2}
  containers:
  - {name: serve, image: localhost/podnet:0.1.0, args: [serve, --name, srv2, --namespace, load, --ports, 8080/tcp]}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: load}
spec:
  nodeSelector: {kubernetes.io/hostname: node1}
  containers:
  - {name: serve, image: localhost/podnet:0.1.0, args: [serve, --name, client, --namespace, load, --ports, 8080/tcp]}
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: load}
spec:
  selector: {app: echo}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: stream, namespace: load}
spec:
  selector: {role: stream}
  ports: [{port: 9100, targetPort: 9100}]
"#;

/// The old binary: `PODNET_OLD`, or scripts/old-podnet.sh's build of
/// [`PREV_REV`] (cached after the first time).
fn old_podnet() -> PathBuf {
    if let Ok(p) = std::env::var("PODNET_OLD") {
        return PathBuf::from(p);
    }
    let o = Command::new("bash")
        .arg(reallab::repo().join("scripts/old-podnet.sh"))
        .arg(PREV_REV)
        .output()
        .expect("bash");
    assert!(o.status.success(), "old-podnet.sh: {}", reallab::text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    PathBuf::from(
        out.lines()
            .filter_map(|l| l.strip_prefix("PODNET_OLD="))
            .next_back()
            .unwrap_or_else(|| panic!("old-podnet.sh named no binary: {out}")),
    )
}

fn ip_of(lab: &RealLab, args: &[&str], path: &[&str]) -> IpAddr {
    let mut v = lab.json(args);
    for p in path {
        v = v[*p].clone();
    }
    v.as_str()
        .unwrap_or_else(|| panic!("{args:?} {path:?}: {v}"))
        .parse()
        .unwrap()
}

/// The previous release's deploy/podnet.yaml, from this repository's history.
fn release_manifest() -> String {
    let o = Command::new("git")
        .arg("-C")
        .arg(reallab::repo())
        .args(["show", &format!("{PREV_REV}:deploy/podnet.yaml")])
        .output()
        .expect("git");
    assert!(o.status.success(), "git show: {}", reallab::text(&o));
    String::from_utf8(o.stdout).unwrap()
}

/// What failed between `before` and `c`: broken streams, failed new
/// connections and DNS queries, with the errors recorded meanwhile.
fn new_failures(c: &load::Counts, before: &load::Counts) -> String {
    let mut out = String::new();
    if c.broken() > before.broken() {
        out += &format!("{} streams broke; ", c.broken() - before.broken());
    }
    if c.conn_failures > before.conn_failures {
        out += &format!(
            "{} connections failed: {:?}; ",
            c.conn_failures - before.conn_failures,
            &c.conn_errors[before.conn_errors.len().min(c.conn_errors.len())..]
        );
    }
    if c.dns_failures > before.dns_failures {
        out += &format!(
            "{} DNS queries failed: {:?}",
            c.dns_failures - before.dns_failures,
            &c.dns_errors[before.dns_errors.len().min(c.dns_errors.len())..]
        );
    }
    out
}

/// The workload pods and Services, and `upgrade.rs`'s load on them,
/// flowing without a failure.
fn start_load(lab: &RealLab) -> Load {
    lab.ok(&["apply", "-f", "-"], Some(APP));
    lab.ok(
        &[
            "wait",
            "-n",
            "load",
            "--for=condition=Ready",
            "pod",
            "--all",
            "--timeout=120s",
        ],
        None,
    );
    let srv2 = ip_of(
        lab,
        &["get", "pod", "-n", "load", "srv2"],
        &["status", "podIP"],
    );
    let stream = ip_of(
        lab,
        &["get", "svc", "-n", "load", "stream"],
        &["spec", "clusterIP"],
    );
    let echo = ip_of(
        lab,
        &["get", "svc", "-n", "load", "echo"],
        &["spec", "clusterIP"],
    );
    let targets = Targets {
        client_ns: lab.attach_pod_netns("load", "client"),
        server_ns: lab.attach_pod_netns("load", "srv2"),
        server_port: STREAM_PORT,
        streams: vec![
            ("pod-ip".into(), SocketAddr::new(srv2, STREAM_PORT)),
            ("cluster-ip".into(), SocketAddr::new(stream, STREAM_PORT)),
        ],
        service: SocketAddr::new(echo, 80),
        answerers: vec!["load/srv1".into(), "load/srv2".into()],
        dns_server: SocketAddr::new(podnet_api::netconfig::DEFAULT_DNS_IP.parse().unwrap(), 53),
        dns_name: "kubernetes.default.svc.cluster.local".into(),
        dns_want: Ipv4Addr::new(10, 96, 0, 1),
    };
    let load = Load::start(&targets);
    let start = load.counts();
    eventually("the load to flow", 60, || {
        match load.counts().advanced_by(&start, 3) {
            true => Ok(()),
            false => Err(format!("{}", load.counts())),
        }
    });
    assert_eq!(load.counts().failures(), "", "load failed before any roll");

    load
}

#[test]
fn the_kubelets_roll_podnet_under_load_and_its_own_rolls_fail_nothing() {
    let old = old_podnet();
    let tmp = tempfile::tempdir().unwrap();
    let images = vec![
        PathBuf::from(e2e_image("pause")),
        podnet_image(
            Path::new(env!("CARGO_BIN_EXE_podnet")),
            DEPLOY_IMAGE,
            tmp.path(),
        ),
        podnet_image(&old, OLD_IMAGE, tmp.path()),
    ];
    let (lab, host, port) = RealLab::up("ru", 2, &images);
    let release = release_manifest();
    let this = std::fs::read_to_string(reallab::repo().join("deploy/podnet.yaml")).unwrap();
    lab.apply_podnet(&this, &host, &port, DEPLOY_IMAGE);
    assert!(
        lab.podnet_images()
            .iter()
            .all(|(_, i, _)| i == DEPLOY_IMAGE),
        "{:?}",
        lab.podnet_images()
    );
    let load = start_load(&lab);

    // One piece at a time (DNS, then the agents, restarted by the
    // kubelets), both at once, then a downgrade to the release and the
    // upgrade back.
    let steps = [
        ("DNS restart", "deploy/podnet-dns", ""),
        ("agents restart", "ds/podnet-agent", ""),
        ("both restart", "ds/podnet-agent deploy/podnet-dns", ""),
        ("new -> old", release.as_str(), OLD_IMAGE),
        ("old -> new", this.as_str(), DEPLOY_IMAGE),
    ];
    let mut report = Vec::new();
    // The control: the same load with nothing rolling, for as long as a
    // roll takes. A failure here is the machine's or the data path's, not
    // the roll's.
    let before = load.counts();
    let quiet = load.counts().dns_attempts + 600;
    eventually("a quiet period's load", 120, || {
        match load.counts().dns_attempts >= quiet {
            true => Ok(()),
            false => Err(format!("{}", load.counts())),
        }
    });
    let c = load.counts();
    let row = format!("no roll: {}", c.row(&before));
    println!("{row}");
    report.push(("no roll", row, new_failures(&c, &before)));
    for (step, manifest, image) in steps {
        let before = load.counts();
        let t0 = Instant::now();
        match image {
            "" => {
                let mut args = vec!["-n", "kube-system", "rollout", "restart"];
                args.extend(manifest.split(' '));
                lab.ok(&args, None);
                lab.rolled_out();
            }
            _ => lab.apply_podnet(manifest, &host, &port, image),
        }
        // The load ran on after the roll, too.
        let after_roll = load.counts();
        eventually("the load to go on after the roll", 60, || {
            match load.counts().advanced_by(&after_roll, 3) {
                true => Ok(()),
                false => Err(format!("{}", load.counts())),
            }
        });
        let c = load.counts();
        let row = format!(
            "{step} ({:.0} s): {}",
            t0.elapsed().as_secs_f64(),
            c.row(&before)
        );
        println!("{row}");
        report.push((step, row, new_failures(&c, &before)));
        assert!(c.advanced_by(&before, 3), "{step}: the load stalled:\n{c}");
    }
    let end = load.stop();
    println!("in all: {end}");
    // Nothing may fail, in any step and in either direction.
    let failed: Vec<String> = report
        .iter()
        .filter(|(_, _, f)| !f.is_empty())
        .map(|(s, row, f)| format!("{s}: {row}\n  {f}"))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert_eq!(end.broken(), 0);
    assert_eq!(end.conn_failures, 0);
}
