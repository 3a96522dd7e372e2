//! Network programming latency in Kubernetes mode (issue 13's benchmark).
//!
//! A 3-node `podnet lab up --kube`: a real etcd, kube-apiserver and
//! kube-controller-manager (v1.37, from `scripts/k8s-peers.sh`), a
//! `podnet agent` per node and `podnet dns`, all reading the API. It
//! creates `--services` Services (each with one EndpointSlice, as the
//! EndpointSlice controller would write for a one-pod Service), waits until
//! every node has them, then creates `--creates` more, one at a time, and
//! for each measures, from just before the create request is sent (and
//! again from its response, when the object is in etcd):
//! - **programming latency**: until the Service's ClusterIP is in the
//!   `cluster-ips` set of table `ip podnet` on *every* node (the upstream
//!   network programming SLI; read with one exact netlink lookup per node;
//!   the Service's EndpointSlice is written after, outside the timing);
//! - **name latency** (every `--dns-every`th create): until cluster DNS,
//!   asked through the kube-dns Service from node1, answers the Service's
//!   name with its ClusterIP.
//!
//! It prints p50, p90, p99 and max of each, and the agents' and DNS's
//! resident memory (VmRSS now, VmHWM peak) with all the Services present.
//! The lab is removed at the end, also on error.

use podnet_bench::LabGuard;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use futures::stream::{self, StreamExt, TryStreamExt};
use kube::api::{Api, PostParams};
use podnet_api::k8s_openapi::api::core::v1::{Namespace, Service};
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use podnet_bench::objects::{cluster_ip, http_service, one_endpoint_slice};
use podnet_dns::client::Client as DnsClient;
use podnet_kernel::Netns;
use podnet_nft::model::{Family, Value};
use podnet_nft::netlink::Conn;

#[derive(Parser)]
#[command(about = "Network programming latency and memory in Kubernetes mode")]
struct Args {
    /// Services present before the measured creates.
    #[arg(long, default_value_t = 10_000)]
    services: usize,
    /// Services created one at a time and measured.
    #[arg(long, default_value_t = 1_000)]
    creates: usize,
    /// Measure name resolution for every Nth measured create.
    #[arg(long, default_value_t = 10)]
    dns_every: usize,
    /// API requests in flight while filling.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// The podnet binary the lab runs.
    #[arg(long, default_value = "target/release/podnet")]
    podnet: PathBuf,
    /// Give up on one Service after this long.
    #[arg(long, default_value = "30s", value_parser = podnet_daemon::parse_duration)]
    timeout: Duration,
}

const NS: &str = "bench";

/// One netlink connection per node, opened inside its namespace.
struct Nodes(Vec<(String, Conn)>);

impl Nodes {
    fn open(lab: &podnet_lab::Lab) -> Result<Nodes> {
        let st = lab.state()?;
        let mut v = Vec::new();
        for n in &st.nodes {
            let ns = Netns::named(&n.netns)?;
            let c = ns.run(Conn::open)??;
            v.push((n.name.clone(), c));
        }
        Ok(Nodes(v))
    }

    /// How many nodes hold `ip` in `cluster-ips`.
    fn holding(&mut self, ip: IpAddr) -> Result<usize> {
        let key = [Value::Addr(ip)];
        let mut n = 0;
        for (name, c) in &mut self.0 {
            if c.has_element(Family::Ip, "podnet", "cluster-ips", &key)
                .with_context(|| format!("reading node {name}'s table"))?
            {
                n += 1;
            }
        }
        Ok(n)
    }
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn report(what: &str, v: &[f64]) {
    if v.is_empty() {
        println!("{what}: no samples");
        return;
    }
    println!(
        "{what}: n={} p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
        v.len(),
        pct(v, 0.5),
        pct(v, 0.9),
        pct(v, 0.99),
        pct(v, 1.0)
    );
}

/// (VmRSS, VmHWM) in MiB of the process recorded for `role`.
fn memory(lab: &podnet_lab::Lab, role: &str) -> Option<(f64, f64)> {
    let pid: u32 = std::fs::read_to_string(lab.dir.join("pids").join(role))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |k: &str| -> Option<f64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse::<f64>()
            .ok()
    };
    Some((kb("VmRSS:")? / 1024.0, kb("VmHWM:")? / 1024.0))
}

/// The measured creates' latencies, in ms.
struct Samples {
    /// POST sent -> every node holds the ClusterIP.
    prog: Vec<f64>,
    /// POST answered -> every node holds the ClusterIP.
    prog_after_api: Vec<f64>,
    /// The create request itself.
    apis: Vec<f64>,
    /// Create -> DNS answers (every `--dns-every`th create only).
    names: Vec<f64>,
}

/// Brings the lab up in Kubernetes mode, with agents reading the API and
/// one DNS replica, on the runtime the bench's API calls use.
fn lab_up(a: &Args, lab: &podnet_lab::Lab, rt: &tokio::runtime::Runtime) -> Result<()> {
    eprintln!(
        "kube-bench: lab {} up (--kube, {} nodes)",
        lab.name, a.nodes
    );
    rt.block_on(lab.up(&podnet_lab::UpOptions {
        kube: true,
        ..podnet_lab::UpOptions::new(a.nodes, "vxlan")
    }))?;
    Ok(())
}

/// Creates the bench's namespace and returns the Service and
/// EndpointSlice APIs in it.
fn bench_namespace(
    lab: &podnet_lab::Lab,
    rt: &tokio::runtime::Runtime,
) -> Result<(Api<Service>, Api<EndpointSlice>)> {
    let client = rt.block_on(lab.kube_client())?;
    let svcs: Api<Service> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let nss: Api<Namespace> = Api::all(client.clone());
    rt.block_on(nss.create(
        &PostParams::default(),
        &Namespace {
            metadata: ObjectMeta {
                name: Some(NS.into()),
                ..Default::default()
            },
            ..Default::default()
        },
    ))?;
    Ok((svcs, slices))
}

/// Creates the `--services` Services and their slices concurrently, then
/// waits until every node holds them all, so the measured creates start
/// from a settled cluster. Returns the time through the API and the time
/// until every node had them.
fn fill(
    a: &Args,
    rt: &tokio::runtime::Runtime,
    svcs: &Api<Service>,
    slices: &Api<EndpointSlice>,
    nodes: &mut Nodes,
) -> Result<(Duration, Duration)> {
    let t0 = Instant::now();
    let last: Vec<IpAddr> = rt.block_on(async {
        stream::iter(0..a.services)
            .map(|i| {
                let (svcs, slices) = (svcs.clone(), slices.clone());
                async move {
                    let s = svcs
                        .create(&PostParams::default(), &http_service(NS, &format!("s{i}")))
                        .await?;
                    slices
                        .create(&PostParams::default(), &one_endpoint_slice(NS, i))
                        .await?;
                    anyhow::Ok(cluster_ip(&s)?)
                }
            })
            .buffer_unordered(a.concurrency)
            .try_collect()
            .await
    })?;
    let fill_api = t0.elapsed();
    eprintln!(
        "kube-bench: {} Services and slices created in {:.1} s; waiting for every node",
        a.services,
        fill_api.as_secs_f64()
    );
    let deadline = Instant::now() + Duration::from_secs(600);
    for ip in &last {
        while nodes.holding(*ip)? < a.nodes {
            if Instant::now() > deadline {
                bail!("{ip} not programmed on every node after 10 minutes");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    Ok((fill_api, t0.elapsed()))
}

/// The measurement proper: `--creates` Services one at a time, each timed
/// until every node programs it (and, every `--dns-every`th, until DNS
/// answers for it), its slice written only after.
fn measure_creates(
    a: &Args,
    lab: &podnet_lab::Lab,
    rt: &tokio::runtime::Runtime,
    svcs: &Api<Service>,
    slices: &Api<EndpointSlice>,
    nodes: &mut Nodes,
) -> Result<Samples> {
    let node1 = Netns::named(&lab.state()?.nodes[0].netns)?;
    let dns = DnsClient::new(SocketAddr::new(
        podnet_api::netconfig::DEFAULT_DNS_IP.parse()?,
        53,
    ));
    let mut prog = Vec::with_capacity(a.creates);
    let mut prog_after_api = Vec::with_capacity(a.creates);
    let mut apis = Vec::with_capacity(a.creates);
    let mut names = Vec::new();
    for k in 0..a.creates {
        let i = a.services + k;
        let ask_dns = a.dns_every > 0 && k % a.dns_every == 0;
        let fqdn = format!("s{i}.{NS}.svc.cluster.local");
        let t = Instant::now();
        let s =
            rt.block_on(svcs.create(&PostParams::default(), &http_service(NS, &format!("s{i}"))))?;
        let api = t.elapsed();
        let ip = cluster_ip(&s)?;
        let (mut p, mut d) = (None, None);
        while p.is_none() || (ask_dns && d.is_none()) {
            if t.elapsed() > a.timeout {
                bail!(
                    "Service s{i} ({ip}): not programmed or resolved within {:?}",
                    a.timeout
                );
            }
            if p.is_none() && nodes.holding(ip)? == a.nodes {
                p = Some(t.elapsed());
            }
            if ask_dns && d.is_none() {
                let answered = node1
                    .run(|| dns.query(&fqdn, podnet_dns::wire::TYPE_A))?
                    .ok()
                    .is_some_and(|m| {
                        m.answers
                            .iter()
                            .any(|r| matches!(r.rdata, podnet_dns::wire::RData::A(a) if IpAddr::V4(a) == ip))
                    });
                if answered {
                    d = Some(t.elapsed());
                }
            }
            if p.is_none() || (ask_dns && d.is_none()) {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let p = p.expect("loop ends with it");
        prog.push(p.as_secs_f64() * 1000.0);
        prog_after_api.push(p.saturating_sub(api).as_secs_f64() * 1000.0);
        apis.push(api.as_secs_f64() * 1000.0);
        if let Some(d) = d {
            names.push(d.as_secs_f64() * 1000.0);
        }
        // Its endpoints, outside the measurement (the next create starts
        // from a quiet cluster).
        rt.block_on(slices.create(&PostParams::default(), &one_endpoint_slice(NS, i)))?;
    }
    Ok(Samples {
        prog,
        prog_after_api,
        apis,
        names,
    })
}

/// Prints the fill times, each latency's percentiles, the verdict on the
/// p99 target and the agents' and DNS's memory with every Service present.
fn print_results(
    a: &Args,
    lab: &podnet_lab::Lab,
    fill_api: Duration,
    fill_all: Duration,
    m: &Samples,
) {
    println!(
        "kube-bench: {} nodes, {} Services present, {} measured creates (one at a time), podnet {}",
        a.nodes,
        a.services,
        a.creates,
        env!("CARGO_PKG_VERSION")
    );
    println!(
        "fill: {} Services + slices through the API in {:.1} s; on every node after {:.1} s",
        a.services,
        fill_api.as_secs_f64(),
        fill_all.as_secs_f64()
    );
    report("API create request (POST Service -> response)", &m.apis);
    report(
        "network programming latency (POST sent -> every node)",
        &m.prog,
    );
    report(
        "network programming latency (POST answered -> every node)",
        &m.prog_after_api,
    );
    report("name resolution latency (create -> DNS answers)", &m.names);
    let target = 100.0;
    println!(
        "target p99 <= {target} ms: {}",
        if pct(&m.prog, 0.99) <= target {
            "met"
        } else {
            "MISSED"
        }
    );
    let mut mem = BTreeMap::new();
    for n in 1..=a.nodes {
        let role = format!("agent-node{n}");
        if let Some(m) = memory(lab, &role) {
            mem.insert(role, m);
        }
    }
    if let Some(m) = memory(lab, "dns") {
        mem.insert("dns".into(), m);
    }
    for (role, (rss, hwm)) in &mem {
        println!(
            "memory {role}: VmRSS {rss:.1} MiB, VmHWM {hwm:.1} MiB ({} Services)",
            a.services + a.creates
        );
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    if !a.podnet.exists() {
        bail!(
            "{} not found: build it first (cargo build --release)",
            a.podnet.display()
        );
    }
    let exe = std::fs::canonicalize(&a.podnet)?;
    let name = format!("kb{}", std::process::id() % 100_000);
    let lab = LabGuard(podnet_lab::Lab::new(&name, exe)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    lab_up(&a, &lab.0, &rt)?;
    let (svcs, slices) = bench_namespace(&lab.0, &rt)?;
    let mut nodes = Nodes::open(&lab.0)?;
    let (fill_api, fill_all) = fill(&a, &rt, &svcs, &slices, &mut nodes)?;
    let m = measure_creates(&a, &lab.0, &rt, &svcs, &slices, &mut nodes)?;
    print_results(&a, &lab.0, fill_api, fill_all, &m);
    Ok(())
}
