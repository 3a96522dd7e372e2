//! Upgrade on real kubelets (issue 24): the kubelets roll podnet's
//! DaemonSet and DNS Deployment from the previous release's image to this
//! build's and back, while the load of podnet/tests/upgrade.rs runs
//! (`common/load.rs`): two long-lived TCP streams from a client pod on
//! node1 to a pod on node2 (to its IP and through a ClusterIP), new
//! connections to a ClusterIP with endpoints on both nodes, and DNS
//! queries to the cluster DNS Service.
//!
//! The rolling is the kubelet's and the controllers': `kubectl set image`
//! on the DaemonSet (maxUnavailable 1: one node at a time; the kubelet
//! stops the agent with SIGTERM and starts the other image's init
//! container and agent) and on the Deployment (maxUnavailable 1, maxSurge
//! 0: a replica is terminated, drained from the proxies as its endpoint
//! turns terminating, and replaced). Expected: 0 broken streams, 0 failed
//! connections, 0 failed queries; the counts are printed per roll.
//!
//! "The previous release" is the last commit that passed CI before this
//! work ([`PREV_REV`]), built by scripts/old-podnet.sh and packed as an
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

/// The last commit that passed CI before real kubelets (stop 31).
const PREV_REV: &str = "2d4a986";
const OLD_IMAGE: &str = "localhost/podnet:prev";
/// This build again, under another name: a roll of a version to itself.
const NEW_AGAIN: &str = "localhost/podnet:again";
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
            .last()
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

#[test]
fn the_kubelets_roll_podnet_both_ways_under_load_without_a_failure() {
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
        podnet_image(
            Path::new(env!("CARGO_BIN_EXE_podnet")),
            NEW_AGAIN,
            tmp.path(),
        ),
    ];
    let (lab, host, port) = RealLab::up("ru", 2, &images);
    let release = release_manifest();
    let this = std::fs::read_to_string(reallab::repo().join("deploy/podnet.yaml")).unwrap();
    lab.apply_podnet(&release, &host, &port, OLD_IMAGE);
    assert!(
        lab.podnet_images().iter().all(|(_, i)| i == OLD_IMAGE),
        "{:?}",
        lab.podnet_images()
    );
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
        &lab,
        &["get", "pod", "-n", "load", "srv2"],
        &["status", "podIP"],
    );
    let stream = ip_of(
        &lab,
        &["get", "svc", "-n", "load", "stream"],
        &["spec", "clusterIP"],
    );
    let echo = ip_of(
        &lab,
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

    // Upgrade (the release's manifest and image to this one's), a roll of
    // this version to itself (what the next upgrade will be), and back.
    let steps = [
        ("old -> new", this.as_str(), DEPLOY_IMAGE),
        ("new -> new", this.as_str(), NEW_AGAIN),
        ("new -> old", release.as_str(), OLD_IMAGE),
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
        lab.apply_podnet(manifest, &host, &port, image);
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
    let failed: Vec<String> = report
        .iter()
        .filter(|(_, _, f)| !f.is_empty())
        .map(|(s, row, f)| format!("{s}: {row}\n  {f}"))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert_eq!(end.broken(), 0);
}
