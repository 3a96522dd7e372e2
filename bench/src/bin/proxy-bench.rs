//! Service proxy benchmark, in private namespaces, in one run:
//! - podnet (netlink batches): full sync, one-Service change, one-endpoint
//!   change, at 1k / 10k / 50k Services with 2 endpoints each, and the
//!   process's peak memory;
//! - the same Service sets as kube-proxy-style nftables via `nft -f` (full
//!   load and a one-element change) and as kube-proxy-style iptables via
//!   `iptables-legacy-restore` (full load).
//!
//! - the new-connection rate from a pod through a ClusterIP, with 10k
//!   Services programmed, against the rate to the pod IP directly.
//!
//! Targets (issue 5): one-Service change <= 5 ms at 10k and 50k; full sync
//! of 10k <= 0.5 s; memory at 50k <= 150 MB; connection rate through the
//! ClusterIP >= 0.9x direct.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Parser;
use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::Object;
use podnet_bench::conn_rate;
use podnet_kernel::Netns;
use podnet_proxy::proxier::Proxier;
use podnet_source::Delta;
use podnet_testkit::{try_sh_in, TestNs};

#[derive(Parser)]
struct Args {
    /// Service counts to measure.
    #[arg(long, default_value = "1000,10000,50000")]
    sizes: String,
    /// Largest size for the `nft -f` comparison (it is very slow).
    #[arg(long, default_value_t = 10000)]
    nft_max: usize,
    #[arg(long, default_value_t = 20)]
    repeats: usize,
    /// Services programmed for the connection-rate run (0 skips it).
    #[arg(long, default_value_t = 10000)]
    conn_services: usize,
    /// Seconds per connection-rate sample (3 samples per path).
    #[arg(long, default_value_t = 2.0)]
    conn_seconds: f64,
}

fn svc(i: usize) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("s{i}"), "namespace": "bench"},
        "spec": {"clusterIP": ip(10, i), "selector": {"app": format!("a{i}")},
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    }))
    .unwrap()
}

fn ip(first: u8, i: usize) -> String {
    format!(
        "{first}.{}.{}.{}",
        96 + (i >> 16) as u8 % 16,
        (i >> 8) & 255,
        i & 255
    )
}

fn slice(i: usize, gen: usize) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("s{i}-x"), "namespace": "bench", "labels": {"kubernetes.io/service-name": format!("s{i}")}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [format!("10.244.{}.{}", (i >> 8) & 255, i & 255)], "conditions": {"ready": true}, "nodeName": "n2"},
                      {"addresses": [format!("10.245.{}.{}", (gen + i) >> 8 & 255, (gen + i) & 255)], "conditions": {"ready": true}, "nodeName": "n3"}],
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]
    }))
    .unwrap()
}

/// The object source's delta for a created or changed object.
fn put(o: Object, _rev: i64) -> Delta {
    Delta::Updated(std::sync::Arc::new(o))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn peak_rss_mb() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// podnet: (full sync s, one-Service change ms, one-endpoint change ms).
fn podnet(n: usize, repeats: usize) -> Result<(f64, f64, f64)> {
    let g = TestNs::create(format!("pn-pb-{}-{n}", std::process::id()))?;
    g.netns().run(|| -> Result<(f64, f64, f64)> {
        let metrics = podnet_daemon::Metrics::new();
        let mut p = Proxier::new(
            "n1",
            vec![podnet_proxy::rules::Stack::v4(
                "10.244.0.0/16".parse().unwrap(),
            )],
            metrics,
        )?;
        for i in 0..n {
            p.watch(&put(Object::Service(Box::new(svc(i))), 1));
            p.watch(&put(Object::EndpointSlice(Box::new(slice(i, 0))), 1));
        }
        let t0 = Instant::now();
        p.sync()?;
        let full = t0.elapsed().as_secs_f64();
        let mut one_svc = Vec::new();
        let mut one_ep = Vec::new();
        for r in 0..repeats {
            let extra = n + 1 + r;
            let t0 = Instant::now();
            p.watch(&put(Object::Service(Box::new(svc(extra))), 2));
            p.watch(&put(Object::EndpointSlice(Box::new(slice(extra, 0))), 2));
            let ops = p.sync()?;
            one_svc.push(t0.elapsed().as_secs_f64() * 1000.0);
            if ops == 0 {
                bail!("adding a Service sent no operations");
            }
            let t0 = Instant::now();
            p.watch(&put(
                Object::EndpointSlice(Box::new(slice(r * 7 % n, r + 1))),
                3,
            ));
            p.sync()?;
            one_ep.push(t0.elapsed().as_secs_f64() * 1000.0);
        }
        // An identical sync sends nothing.
        if p.sync()? != 0 {
            bail!("a repeated sync was not a no-op");
        }
        Ok((full, median(one_svc), median(one_ep)))
    })?
}

fn run_in(ns: &str, cmd: &[&str], stdin: &str) -> Result<f64> {
    let t0 = Instant::now();
    let mut c = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(cmd)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    c.stdin.take().unwrap().write_all(stdin.as_bytes())?;
    let out = c.wait_with_output()?;
    if !out.status.success() {
        bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// kube-proxy-style nftables (per-Service anonymous numgen vmap), via nft.
fn kube_proxy_nft(n: usize) -> Result<(f64, f64)> {
    let g = TestNs::create(format!("pn-pbn-{}-{n}", std::process::id()))?;
    let name = g.name();
    let mut s = String::from("table ip kube-proxy {\n map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }\n chain services { ip daddr . meta l4proto . th dport vmap @service-ips; }\n chain nat-prerouting { type nat hook prerouting priority dstnat; jump services; }\n");
    let mut elems = Vec::new();
    for i in 0..n {
        let (a, b) = (
            format!("10.244.{}.{}", (i >> 8) & 255, i & 255),
            format!("10.245.{}.{}", (i >> 8) & 255, i & 255),
        );
        s.push_str(&format!(" chain ep-{i}-a {{ ip saddr {a} meta mark set 0x4000; meta l4proto tcp dnat to {a}:8080; }}\n chain ep-{i}-b {{ ip saddr {b} meta mark set 0x4000; meta l4proto tcp dnat to {b}:8080; }}\n"));
        s.push_str(&format!(" chain svc-{i} {{ ip saddr != 10.244.0.0/16 meta mark set 0x4000; numgen random mod 2 vmap {{ 0 : goto ep-{i}-a, 1 : goto ep-{i}-b }}; }}\n"));
        elems.push(format!("{} . tcp . 80 : goto svc-{i}", ip(10, i)));
    }
    s.push_str("}\n");
    for chunk in elems.chunks(1000) {
        s.push_str(&format!(
            "add element ip kube-proxy service-ips {{ {} }}\n",
            chunk.join(", ")
        ));
    }
    let full = run_in(name, &["nft", "-f", "-"], &s)?;
    let one = run_in(
        name,
        &["nft", "-f", "-"],
        "add element ip kube-proxy service-ips { 10.111.0.1 . tcp . 81 : goto svc-0 }
",
    )?;
    Ok((full, one * 1000.0))
}

/// kube-proxy-style iptables rules, loaded with iptables-legacy-restore.
fn kube_proxy_iptables(n: usize) -> Result<f64> {
    let g = TestNs::create(format!("pn-pbi-{}-{n}", std::process::id()))?;
    let name = g.name();
    let mut s = String::from("*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n");
    let mut rules = String::from("-A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -j KUBE-SERVICES\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n");
    for i in 0..n {
        s.push_str(&format!(
            ":KUBE-SVC-{i} - [0:0]\n:KUBE-SEP-{i}A - [0:0]\n:KUBE-SEP-{i}B - [0:0]\n"
        ));
        let (a, b) = (
            format!("10.244.{}.{}", (i >> 8) & 255, i & 255),
            format!("10.245.{}.{}", (i >> 8) & 255, i & 255),
        );
        rules.push_str(&format!(
            "-A KUBE-SERVICES -d {}/32 -p tcp --dport 80 -j KUBE-SVC-{i}\n\
             -A KUBE-SVC-{i} ! -s 10.244.0.0/16 -d {}/32 -p tcp --dport 80 -j KUBE-MARK-MASQ\n\
             -A KUBE-SVC-{i} -m statistic --mode random --probability 0.5 -j KUBE-SEP-{i}A\n\
             -A KUBE-SVC-{i} -j KUBE-SEP-{i}B\n\
             -A KUBE-SEP-{i}A -s {a}/32 -j KUBE-MARK-MASQ\n-A KUBE-SEP-{i}A -p tcp -j DNAT --to-destination {a}:8080\n\
             -A KUBE-SEP-{i}B -s {b}/32 -j KUBE-MARK-MASQ\n-A KUBE-SEP-{i}B -p tcp -j DNAT --to-destination {b}:8080\n",
            ip(10, i),
            ip(10, i)
        ));
    }
    s.push_str(&rules);
    s.push_str("COMMIT\n");
    run_in(name, &["iptables-legacy-restore"], &s)
}

fn sh(ns: &str, cmd: &str) -> Result<()> {
    let (ok, out) = try_sh_in(ns, cmd);
    if !ok {
        bail!("{ns}: {cmd}: {out}");
    }
    Ok(())
}

/// A client pod, a node running the proxy with `n` Services, a server pod:
/// connections/s (direct with no rules, direct with only conntrack on,
/// direct with the rules, via ClusterIP).
fn connection_rate(n: usize, secs: f64) -> Result<(f64, f64, f64, f64)> {
    let id = std::process::id();
    let (cli, node, srv) = (
        format!("pn-pbc-{id}-cli"),
        format!("pn-pbc-{id}-node"),
        format!("pn-pbc-{id}-srv"),
    );
    let mut guards = Vec::new();
    for ns in [&cli, &node, &srv] {
        guards.push(TestNs::create(ns.as_str())?);
    }
    sh(&node, &format!(
        "ip link add c0 type veth peer name eth0 netns {cli} && ip link add s0 type veth peer name eth0 netns {srv} && \
         ip addr add 10.244.200.1/24 dev c0 && ip addr add 10.244.201.1/24 dev s0 && \
         ip link set c0 up && ip link set s0 up && ip link set lo up && sysctl -qw net.ipv4.ip_forward=1"
    ))?;
    for (ns, a) in [(&cli, "10.244.200"), (&srv, "10.244.201")] {
        sh(ns, &format!(
            "ip addr add {a}.2/24 dev eth0 && ip link set eth0 up && ip link set lo up && ip route add default via {a}.1"
        ))?;
    }
    // The server: accept and let go, on two threads.
    let listener = Netns::named(&srv)?.run(|| std::net::TcpListener::bind("0.0.0.0:8080"))??;
    {
        use std::os::fd::AsRawFd;
        // SAFETY: listen(2) again on our socket only raises its backlog.
        unsafe { libc::listen(listener.as_raw_fd(), 4096) };
    }
    for _ in 0..2 {
        let l = listener.try_clone()?;
        std::thread::spawn(move || {
            while let Ok((s, _)) = l.accept() {
                drop(s);
            }
        });
    }
    let direct: std::net::SocketAddr = "10.244.201.2:8080".parse()?;
    let vip: std::net::SocketAddr = "10.96.250.1:80".parse()?;
    let (mut bare, mut ct_only) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        bare.push(conn_rate(&cli, direct, secs)?);
        // An empty nat chain: what connection tracking alone costs.
        sh(&node, "nft 'add table ip ctonly; add chain ip ctonly pre { type nat hook prerouting priority -100; }'")?;
        ct_only.push(conn_rate(&cli, direct, secs)?);
        sh(&node, "nft delete table ip ctonly")?;
    }
    // The proxy's table: n Services plus the one in front of the server.
    Netns::named(&node)?.run(|| -> Result<()> {
        let mut p = Proxier::new(
            "n1",
            vec![podnet_proxy::rules::Stack::v4("10.244.0.0/16".parse().unwrap())],
            podnet_daemon::Metrics::new(),
        )?;
        for i in 0..n {
            p.watch(&put(Object::Service(Box::new(svc(i))), 1));
            p.watch(&put(Object::EndpointSlice(Box::new(slice(i, 0))), 1));
        }
        let target: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "target", "namespace": "bench"},
            "spec": {"clusterIP": "10.96.250.1", "selector": {"app": "t"},
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}))?;
        let eps: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "target-x", "namespace": "bench",
                "labels": {"kubernetes.io/service-name": "target"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.201.2"], "conditions": {"ready": true}, "nodeName": "n1"}],
            "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]}))?;
        p.watch(&put(Object::Service(Box::new(target)), 1));
        p.watch(&put(Object::EndpointSlice(Box::new(eps)), 1));
        p.sync()?;
        Ok(())
    })??;
    // Alternate the two paths so noise falls on both.
    let (mut with_rules, mut via) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        with_rules.push(conn_rate(&cli, direct, secs)?);
        via.push(conn_rate(&cli, vip, secs)?);
    }
    drop(listener);
    Ok((
        median(bare),
        median(ct_only),
        median(with_rules),
        median(via),
    ))
}

fn main() -> Result<()> {
    let a = Args::parse();
    let sizes: Vec<usize> = a
        .sizes
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    println!(
        "{:>8} | {:>12} {:>14} {:>14} | {:>12} {:>12} | {:>12}",
        "services",
        "podnet full",
        "podnet 1 svc",
        "podnet 1 ep",
        "nft -f full",
        "nft 1 elem",
        "iptables full"
    );
    // podnet first, every size, so the peak memory is podnet's own and not
    // the comparison scripts' (the nft and iptables inputs are big strings).
    let mut ours = Vec::new();
    for &n in &sizes {
        ours.push(podnet(n, a.repeats)?);
    }
    let peak = peak_rss_mb();
    for (&n, (full, one, ep)) in sizes.iter().zip(ours) {
        let (nf, n1) = if n <= a.nft_max {
            kube_proxy_nft(n)?
        } else {
            (f64::NAN, f64::NAN)
        };
        let ipt = kube_proxy_iptables(n).unwrap_or(f64::NAN);
        println!(
            "{n:>8} | {:>10.3} s {:>11.2} ms {:>11.2} ms | {:>10.2} s {:>9.1} ms | {:>10.2} s",
            full, one, ep, nf, n1, ipt
        );
    }
    println!(
        "podnet peak RSS (bench process after the podnet runs, before the comparisons): {peak:.0} MB (target <= 150 MB at 50k)"
    );
    if a.conn_services > 0 {
        let (bare, ct, direct, via) = connection_rate(a.conn_services, a.conn_seconds)?;
        println!(
            "new connections/s with {} Services (median of 3): direct, no rules {bare:.0}; \
             direct, conntrack only {ct:.0}; direct, rules loaded {direct:.0}; via ClusterIP {via:.0}",
            a.conn_services
        );
        println!("ClusterIP / direct (conntrack only) = {:.2}x", via / ct);
        println!(
            "ClusterIP / direct (rules loaded) = {:.2}x, ClusterIP / direct (no rules) = {:.2}x (target >= 0.9x)",
            via / direct,
            via / bare
        );
    }
    Ok(())
}
