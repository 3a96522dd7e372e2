//! `podnet policy explain SRC DST:PORT[/proto]`: the evaluator's verdict on
//! one new connection, with which policies isolate each end and which rules
//! allowed it, from the cluster's objects (the store, or the Kubernetes
//! API). With `--lab`, it also traces the flow through the `podnet-policy`
//! tables the kernel holds on the source's and the destination's nodes,
//! and shows their deny counters: what the kernel did, beside what the API
//! says.

use std::net::IpAddr;

use anyhow::{anyhow, bail, Context, Result};
use podnet_nft::model::{Family, Proto};
use podnet_policy::{evaluate, Flow, World};

use crate::cmd::KubeArgs;

/// A pod name (`ns/pod`) or an address, resolved against the view.
fn endpoint(w: &World, s: &str) -> Result<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(ip);
    }
    let (ns, name) = s.split_once('/').unwrap_or(("default", s));
    let v = w
        .pods
        .get(&podnet_policy::Key::new(ns, name))
        .ok_or_else(|| anyhow!("no pod {ns}/{name}"))?;
    v.ips
        .first()
        .copied()
        .ok_or_else(|| anyhow!("pod {ns}/{name} has no address yet"))
}

/// Parses `DST:PORT[/proto]`.
pub(crate) fn target(s: &str) -> Result<(String, u16, Proto)> {
    let (hp, proto) = match s.rsplit_once('/') {
        Some((h, p)) if ["tcp", "udp", "sctp"].contains(&p.to_ascii_lowercase().as_str()) => {
            (h, p.to_ascii_lowercase())
        }
        _ => (s, "tcp".to_string()),
    };
    let (host, port) = hp
        .rsplit_once(':')
        .ok_or_else(|| anyhow!("{s:?}: want DST:PORT[/tcp|/udp|/sctp]"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| anyhow!("{s:?}: {port:?} is not a port number"))?;
    let proto = match proto.as_str() {
        "udp" => Proto::Udp,
        "sctp" => Proto::Sctp,
        _ => Proto::Tcp,
    };
    Ok((host.trim_matches(['[', ']']).to_string(), port, proto))
}

/// The cluster's view: one complete list through the object source.
async fn load(source: podnet_source::Source) -> Result<World> {
    let mut source = source;
    let mut sub = source.subscribe(podnet_policy::KINDS);
    let _running = source.start();
    let mut w = World::new();
    let deadline = std::time::Duration::from_secs(15);
    loop {
        let b = tokio::time::timeout(deadline, sub.next_batch())
            .await
            .map_err(|_| anyhow!("the cluster's objects did not arrive within 15s"))?
            .ok_or_else(|| anyhow!("the object source ended"))?;
        for d in &b.deltas {
            w.apply(d);
        }
        if b.ready {
            return Ok(w);
        }
    }
}

/// `podnet policy explain`.
pub async fn explain(
    store: &str,
    kube: &KubeArgs,
    lab: Option<&str>,
    src: &str,
    dst: &str,
) -> Result<()> {
    let metrics = podnet_daemon::Metrics::new();
    let watch = metrics.store_watch("explain");
    let lab = match lab {
        Some(name) => Some(open_lab(name)?),
        None => None,
    };
    let w = load(source(store, kube, lab.as_ref(), watch).await?).await?;
    let (host, port, proto) = target(dst)?;
    let flow = Flow {
        src: endpoint(&w, src)?,
        dst: endpoint(&w, &host)?,
        proto,
        port,
    };
    print_verdict(&w, &flow, &evaluate(&w, &flow));
    if let Some((l, st)) = &lab {
        print_kernel_traces(&w, &flow, l, st)?;
    }
    Ok(())
}

/// The lab named by `--lab`, with its recorded state.
fn open_lab(name: &str) -> Result<(podnet_lab::Lab, podnet_lab::LabState)> {
    let exe = std::fs::canonicalize("/proc/self/exe")?;
    let l = podnet_lab::Lab::new(name, exe)?;
    let st = l.state()?;
    Ok((l, st))
}

/// Where the objects come from: the lab's store or API server, else the
/// Kubernetes API when asked for, else the store.
async fn source(
    store: &str,
    kube: &KubeArgs,
    lab: Option<&(podnet_lab::Lab, podnet_lab::LabState)>,
    watch: podnet_daemon::StoreWatch,
) -> Result<podnet_source::Source> {
    Ok(match lab {
        Some((l, st)) if st.kube => podnet_source::Source::kube(
            podnet_source::kube_client(Some(&l.kubeconfig()?)).await?,
            watch,
        ),
        Some((_, st)) => podnet_source::Source::store(
            podnet_store::open(&st.store)
                .await
                .with_context(|| format!("opening store {}", st.store))?,
            watch,
        ),
        None if kube.enabled() => podnet_source::Source::kube(kube.client().await?, watch),
        None => podnet_source::Source::store(
            podnet_store::open(store)
                .await
                .with_context(|| format!("opening store {store}"))?,
            watch,
        ),
    })
}

/// The API's answer: the verdict, then for each direction who isolates
/// the pod and which rules allowed the flow or why they did not.
fn print_verdict(w: &World, flow: &Flow, v: &podnet_policy::Verdict) {
    let name = |ip: IpAddr| match w.pod_at(ip) {
        Some((k, _)) => format!("{k} ({ip})"),
        None => ip.to_string(),
    };
    println!(
        "{} -> {} {}/{}: {}",
        name(flow.src),
        name(flow.dst),
        flow.proto.name(),
        flow.port,
        if v.allowed() { "ALLOWED" } else { "DENIED" }
    );
    for (dir, s) in [("egress", &v.egress), ("ingress", &v.ingress)] {
        let who = s
            .pod
            .as_ref()
            .map(|k| k.to_string())
            .unwrap_or_else(|| "(not a pod)".into());
        if s.isolated_by.is_empty() {
            println!("  {dir} of {who}: not isolated");
            continue;
        }
        let by: Vec<String> = s.isolated_by.iter().map(|k| k.to_string()).collect();
        println!("  {dir} of {who}: isolated by {}", by.join(", "));
        if s.allowed_by.is_empty() {
            println!("    no rule allowed it");
        }
        for r in &s.allowed_by {
            println!("    allowed by {r}");
        }
        for (r, why) in &s.misses {
            println!("    {r}: {why}");
        }
    }
}

/// What the kernel does: the flow traced through the policy table of the
/// source's and the destination's lab nodes (each node once).
fn print_kernel_traces(
    w: &World,
    flow: &Flow,
    l: &podnet_lab::Lab,
    st: &podnet_lab::LabState,
) -> Result<()> {
    let node_of = |ip: IpAddr| {
        w.pod_at(ip)
            .and_then(|(_, v)| v.node.clone())
            .and_then(|n| st.nodes.iter().find(|x| x.name == n).cloned())
    };
    let mut seen = Vec::new();
    for n in [node_of(flow.src), node_of(flow.dst)].into_iter().flatten() {
        if seen.contains(&n.name) {
            continue;
        }
        seen.push(n.name.clone());
        let subnets = node_subnets(l, &n.name);
        let ns = podnet_kernel::Netns::named(&n.netns)?;
        let (fate, counters) = ns.run(|| kernel_trace(flow, &subnets))??;
        println!(
            "  kernel on {} (table {} {}): {fate}; {counters}",
            n.name,
            if flow.src.is_ipv6() { "ip6" } else { "ip" },
            podnet_policy::plan::TABLE
        );
    }
    Ok(())
}

/// The node's subnet, as its table fails closed on it (none if the node
/// has not written its subnet.env).
fn node_subnets(l: &podnet_lab::Lab, node: &str) -> Vec<ipnet::IpNet> {
    let env_path = l.dir.join("nodes").join(node).join("subnet.env");
    std::fs::read_to_string(&env_path)
        .ok()
        .and_then(|t| {
            podnet_cni::plugins::meta::SubnetEnv::parse(&t, &env_path.display().to_string()).ok()
        })
        .map(|e| vec![e.subnet.trunc()])
        .unwrap_or_default()
}

/// The evaluator's reasons in one line: who isolates each end and which
/// rule admitted the flow, or what each rule lacked.
pub(crate) fn verdict_text(v: &podnet_policy::Verdict) -> String {
    let mut parts = Vec::new();
    for (dir, s) in [("egress", &v.egress), ("ingress", &v.ingress)] {
        if s.isolated_by.is_empty() {
            parts.push(format!("{dir} not isolated"));
            continue;
        }
        let by: Vec<String> = s.isolated_by.iter().map(|k| k.to_string()).collect();
        if s.allowed_by.is_empty() {
            parts.push(format!(
                "{dir} isolated by {} and no rule allowed it",
                by.join(", ")
            ));
        } else {
            let rules: Vec<String> = s.allowed_by.iter().map(|r| r.to_string()).collect();
            parts.push(format!(
                "{dir} isolated by {}, allowed by {}",
                by.join(", "),
                rules.join(", ")
            ));
        }
    }
    parts.join("; ")
}

/// Traces `flow` through the policy table this namespace's kernel holds.
fn kernel_trace(flow: &Flow, subnets: &[ipnet::IpNet]) -> Result<(String, String)> {
    let mut conn = podnet_nft::netlink::Conn::open()?;
    let v6 = flow.src.is_ipv6();
    let want = podnet_policy::plan::skeleton(v6, subnets, Default::default());
    let Some(t) = conn.observe(&want)? else {
        return Ok(("no policy table".into(), String::new()));
    };
    let pkt = podnet_nft::trace::Packet::between(flow.src, flow.dst, flow.proto, flow.port);
    let out = podnet_nft::trace::Tracer::new(&t).incoming(&pkt, &mut |_| 0);
    let fate = match out.fate {
        podnet_nft::trace::Fate::Accept => "accept".to_string(),
        podnet_nft::trace::Fate::Drop => format!("drop ({})", out.logs.join(", ")),
        podnet_nft::trace::Fate::Reject => "reject".to_string(),
    };
    let fam = if v6 { Family::Ip6 } else { Family::Ip };
    let mut counters = Vec::new();
    for c in [
        podnet_policy::plan::COUNTER_EGRESS,
        podnet_policy::plan::COUNTER_INGRESS,
        podnet_policy::plan::COUNTER_UNKNOWN,
        podnet_policy::plan::COUNTER_INVALID,
        podnet_policy::plan::COUNTER_SUPPRESSED,
    ] {
        if let Some((pk, _)) = conn.counter(fam, podnet_policy::plan::TABLE, c)? {
            counters.push(format!("{c} {pk}"));
        }
    }
    if counters.is_empty() {
        bail!("the policy table has no counters");
    }
    Ok((fate, format!("counters: {}", counters.join(", "))))
}
