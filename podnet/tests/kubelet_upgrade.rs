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

/// Rolls every podnet container to `image` and waits for the rollouts.
fn roll(lab: &RealLab, image: &str) {
    let ks = ["-n", "kube-system", "set", "image"];
    let agent = [format!("install={image}"), format!("agent={image}")];
    let mut a: Vec<&str> = ks.to_vec();
    a.push("ds/podnet-agent");
    a.extend(agent.iter().map(String::as_str));
    lab.ok(&a, None);
    let dns = format!("dns={image}");
    let mut a: Vec<&str> = ks.to_vec();
    a.extend(["deploy/podnet-dns", dns.as_str()]);
    lab.ok(&a, None);
    lab.rolled_out();
    eventually("every podnet pod to run the new image", 120, || {
        let imgs = lab.podnet_images();
        match imgs.iter().all(|(_, i)| i == image) && imgs.len() == 4 {
            true => Ok(()),
            false => Err(format!("{imgs:?}")),
        }
    });
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
    ];
    let (lab, host, port) = RealLab::up("ru", 2, &images);
    lab.install(&host, &port, OLD_IMAGE);
    assert!(
        lab.podnet_images().iter().all(|(_, i)| i == OLD_IMAGE),
        "{:?}",
        lab.podnet_images()
    );
    lab.ok(&["apply", "-f", "-"], Some(APP));
    lab.ok(
        &["wait", "-n", "load", "--for=condition=Ready", "pod", "--all", "--timeout=120s"],
        None,
    );
    let srv2 = ip_of(&lab, &["get", "pod", "-n", "load", "srv2"], &["status", "podIP"]);
    let stream = ip_of(&lab, &["get", "svc", "-n", "load", "stream"], &["spec", "clusterIP"]);
    let echo = ip_of(&lab, &["get", "svc", "-n", "load", "echo"], &["spec", "clusterIP"]);
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
        dns_server: SocketAddr::new(
            podnet_api::netconfig::DEFAULT_DNS_IP.parse().unwrap(),
            53,
        ),
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

    for (step, image) in [("old -> new", DEPLOY_IMAGE), ("new -> old", OLD_IMAGE)] {
        let before = load.counts();
        let t0 = Instant::now();
        roll(&lab, image);
        // The load ran on after the roll, too.
        let after_roll = load.counts();
        eventually("the load to go on after the roll", 60, || {
            match load.counts().advanced_by(&after_roll, 3) {
                true => Ok(()),
                false => Err(format!("{}", load.counts())),
            }
        });
        let c = load.counts();
        println!(
            "{step} ({:.0} s): {}",
            t0.elapsed().as_secs_f64(),
            c.row(&before)
        );
        assert_eq!(c.failures(), "", "{step}: the load failed:\n{c}");
        assert!(c.advanced_by(&before, 3), "{step}: the load stalled:\n{c}");
    }
    let end = load.stop();
    println!("in all: {end}");
    assert_eq!(end.failures(), "");
    assert_eq!(end.broken(), 0);
}
