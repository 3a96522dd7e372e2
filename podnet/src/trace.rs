//! `podnet trace SRC DST:PORT[/tcp|/udp] --lab NAME [-o json]`: the glue
//! between a lab's objects and the trace crate. It resolves SRC (a pod)
//! and DST (a pod, a Service, a node for a NodePort, or an address), names
//! every address it can, and answers the trace's questions to the pure
//! evaluators: the policy evaluator over the cluster's objects, and the
//! proxy's tracer over the table the proxy would plan for the node.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::{Kind, Object};
use podnet_daemon::HttpGet;
use podnet_nft::model::Proto;
use podnet_policy::{evaluate, Flow, World};
use podnet_trace::collect::{Node, Oracles, Pod, PolicyAnswer, Request};
use podnet_trace::hops::{Names, ServicePort};

/// The cluster's objects a trace (and the web view) needs, kept by
/// applying the object source's deltas.
#[derive(Default)]
pub struct View {
    pub world: World,
    pub services: BTreeMap<String, Service>,
    pub slices: BTreeMap<String, EndpointSlice>,
    pub nodes: BTreeMap<String, podnet_api::k8s_openapi::api::core::v1::Node>,
    /// The first complete list has been applied.
    pub ready: bool,
}

/// What a [`View`] subscribes to.
const VIEW_KINDS: &[Kind] = &[
    Kind::Pod,
    Kind::Namespace,
    Kind::NetworkPolicy,
    Kind::Service,
    Kind::EndpointSlice,
    Kind::Node,
];

impl View {
    fn apply(&mut self, d: &podnet_source::Delta) {
        self.world.apply(d);
        let k = d.key();
        let id = format!("{}/{}", k.namespace.clone().unwrap_or_default(), k.name);
        match d {
            podnet_source::Delta::Added(o) | podnet_source::Delta::Updated(o) => match o.as_ref() {
                Object::Service(s) => {
                    self.services.insert(id, (**s).clone());
                }
                Object::EndpointSlice(s) => {
                    self.slices.insert(id, (**s).clone());
                }
                Object::Node(n) => {
                    self.nodes.insert(k.name.clone(), (**n).clone());
                }
                _ => {}
            },
            podnet_source::Delta::Deleted(_) => match k.kind {
                Kind::Service => {
                    self.services.remove(&id);
                }
                Kind::EndpointSlice => {
                    self.slices.remove(&id);
                }
                Kind::Node => {
                    self.nodes.remove(&k.name);
                }
                _ => {}
            },
        }
    }
}

/// Where a trace (and the web view) runs.
pub enum Scope {
    /// A lab on this machine: every node's namespace is here to observe.
    Lab {
        lab: podnet_lab::Lab,
        st: podnet_lab::LabState,
    },
    /// One node of a real cluster, the machine this runs on: its own
    /// kernel is observed; other nodes are named, not observed.
    Node {
        name: String,
        /// The agent's metrics address (its `/flows`).
        agent: SocketAddr,
        /// The agent's subnet.env, for this node's subnet in standalone mode.
        subnet_file: std::path::PathBuf,
        /// Standalone mode: the store, whose subnet leases list the nodes.
        store: Option<podnet_store::AnyStore>,
        /// The nodes last read from the leases (standalone mode).
        leases: std::sync::RwLock<Vec<ClusterNode>>,
    },
}

/// A node as a trace and the web view need it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterNode {
    pub name: String,
    pub ip: IpAddr,
    pub subnet: Option<ipnet::IpNet>,
    /// Its IPv6 pod subnet, in a dual-stack cluster.
    pub subnet6: Option<ipnet::IpNet>,
    /// Its namespace when this machine can observe it (see
    /// [`podnet_trace::collect::Node::netns`]), else empty.
    pub netns: String,
}

/// A trace's surroundings: where it runs and the cluster's network config.
pub struct TraceContext {
    pub scope: Scope,
    pub net: podnet_api::netconfig::Resolved,
}

/// What `podnet trace` and `podnet ui` are pointed at.
pub struct Target {
    /// A lab on this machine.
    pub lab: Option<String>,
    /// Otherwise this node of a real cluster, read from the store or the
    /// Kubernetes API.
    pub node: Option<String>,
    pub store: String,
    pub kube: crate::cmd::KubeArgs,
    pub agent: String,
    pub subnet_file: std::path::PathBuf,
}

/// This machine's host name, the kubelet's default node name.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_ascii_lowercase())
        .unwrap_or_default()
}

impl TraceContext {
    pub async fn open(t: &Target) -> Result<(TraceContext, podnet_source::Source)> {
        let watch = podnet_daemon::Metrics::new().store_watch("trace");
        if let Some(name) = &t.lab {
            return Self::open_lab(name, watch).await;
        }
        let name = t.node.clone().unwrap_or_else(hostname);
        if name.is_empty() {
            bail!("no --node given and no host name to default to");
        }
        let agent = podnet_daemon::listen_addr(&t.agent).map_err(anyhow::Error::msg)?;
        let (source, net, store) = if t.kube.enabled() {
            let source = podnet_source::Source::kube(t.kube.client().await?, watch);
            (source, t.kube.network_config()?, None)
        } else {
            let store = podnet_store::open(&t.store)
                .await
                .with_context(|| format!("opening store {}", t.store))?;
            let net = crate::dns::network_config(&store).await;
            (
                podnet_source::Source::store(store.clone(), watch),
                net,
                Some(store),
            )
        };
        let ctx = TraceContext {
            scope: Scope::Node {
                name,
                agent,
                subnet_file: t.subnet_file.clone(),
                store,
                leases: Default::default(),
            },
            net,
        };
        ctx.refresh().await?;
        Ok((ctx, source))
    }

    async fn open_lab(
        name: &str,
        watch: podnet_daemon::StoreWatch,
    ) -> Result<(TraceContext, podnet_source::Source)> {
        let exe = std::fs::canonicalize("/proc/self/exe")?;
        let lab = podnet_lab::Lab::new(name, exe)?;
        let st = lab.state()?;
        let (source, net) = if st.kube {
            let spec: serde_json::Value = std::fs::read_to_string(lab.net_conf_path())
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_else(|| serde_json::json!({}));
            let cfg: podnet_api::netconfig::NetworkConfig =
                serde_json::from_value(serde_json::json!({ "spec": spec }))?;
            let net = cfg
                .resolve()
                .map_err(|(f, m)| anyhow!("the lab's net-conf field {f}: {m}"))?;
            (
                podnet_source::Source::kube(
                    podnet_source::kube_client(Some(&lab.kubeconfig()?)).await?,
                    watch,
                ),
                net,
            )
        } else {
            let store = podnet_store::open(&st.store)
                .await
                .with_context(|| format!("opening store {}", st.store))?;
            let net = crate::dns::network_config(&store).await;
            (podnet_source::Source::store(store, watch), net)
        };
        Ok((
            TraceContext {
                scope: Scope::Lab { lab, st },
                net,
            },
            source,
        ))
    }

    /// Rereads what the object source does not carry: the subnet leases
    /// that list a standalone cluster's nodes.
    pub async fn refresh(&self) -> Result<()> {
        let Scope::Node {
            store: Some(store),
            leases,
            ..
        } = &self.scope
        else {
            return Ok(());
        };
        use podnet_store::Store;
        let (kvs, _) = store
            .list(podnet_source::subnets::leases::PREFIX)
            .await
            .context("reading the subnet leases")?;
        let got = kvs
            .iter()
            .filter_map(podnet_source::subnets::leases::decode)
            .map(|l| ClusterNode {
                name: l.attrs.node.clone(),
                ip: IpAddr::V4(l.attrs.public_ip),
                subnet: Some(ipnet::IpNet::V4(l.subnet)),
                subnet6: l
                    .attrs
                    .ipv6_subnet
                    .or_else(|| self.net.ipv6_subnet_of(l.subnet))
                    .map(ipnet::IpNet::V6),
                netns: String::new(),
            })
            .collect();
        *leases.write().expect("leases") = got;
        Ok(())
    }

    /// What the page and the text call this cluster.
    pub fn label(&self) -> String {
        match &self.scope {
            Scope::Lab { lab, .. } => format!("lab {}", lab.name),
            Scope::Node { name, .. } => format!("node {name}"),
        }
    }

    pub fn backend(&self) -> String {
        match &self.scope {
            Scope::Lab { st, .. } => st.backend.clone(),
            Scope::Node { .. } => self.net.backend.name().into(),
        }
    }

    /// The cluster's nodes, the ones this machine observes with their
    /// namespace.
    pub fn nodes(&self, view: &View) -> Vec<ClusterNode> {
        match &self.scope {
            Scope::Lab { lab, st } => st
                .nodes
                .iter()
                .map(|n| ClusterNode {
                    name: n.name.clone(),
                    ip: IpAddr::V4(n.ip),
                    subnet: lab_node_subnet(lab, view, &n.name, false),
                    subnet6: lab_node_subnet(lab, view, &n.name, true),
                    netns: n.netns.clone(),
                })
                .collect(),
            Scope::Node {
                name,
                subnet_file,
                leases,
                store,
                ..
            } => {
                // Standalone: the subnet leases; Kubernetes: the Nodes.
                let mut out: Vec<ClusterNode> = if store.is_some() {
                    leases.read().expect("leases").clone()
                } else {
                    view.nodes
                        .iter()
                        .filter_map(|(n, o)| {
                            let addrs = o.status.as_ref()?.addresses.clone().unwrap_or_default();
                            let ip = addrs
                                .iter()
                                .find(|a| a.type_ == "InternalIP")
                                .or(addrs.first())?
                                .address
                                .parse()
                                .ok()?;
                            Some(ClusterNode {
                                name: n.clone(),
                                ip,
                                subnet: o
                                    .spec
                                    .as_ref()
                                    .and_then(|s| s.pod_cidr.as_ref())
                                    .and_then(|c| c.parse().ok()),
                                subnet6: pod_cidr_of(o, true),
                                netns: String::new(),
                            })
                        })
                        .collect()
                };
                if !out.iter().any(|n| &n.name == name) {
                    // Not listed (yet): this node still is one, at the
                    // address its default route leaves from.
                    let ip = podnet_kernel::Handle::new()
                        .and_then(|mut h| h.route_get(IpAddr::from([192, 0, 2, 1]), None, None))
                        .ok()
                        .and_then(|r| r.route.prefsrc);
                    if let Some(ip) = ip {
                        out.push(ClusterNode {
                            name: name.clone(),
                            ip,
                            subnet: None,
                            subnet6: None,
                            netns: String::new(),
                        });
                    }
                }
                for n in out.iter_mut().filter(|n| &n.name == name) {
                    n.netns = "/proc/self/ns/net".into();
                    if n.subnet.is_none() {
                        n.subnet = subnet_env(subnet_file, false);
                    }
                    if n.subnet6.is_none() {
                        n.subnet6 = subnet_env(subnet_file, true);
                    }
                }
                out
            }
        }
    }

    /// Where each observed node's agent serves `/flows`: a label, the
    /// namespace to ask from (None: this one) and the address.
    pub fn flow_sources(&self) -> Result<Vec<(String, Option<podnet_kernel::Netns>, SocketAddr)>> {
        Ok(match &self.scope {
            Scope::Lab { st, .. } => st
                .nodes
                .iter()
                .map(|n| {
                    Ok((
                        n.name.clone(),
                        Some(podnet_kernel::Netns::named(&n.netns)?),
                        SocketAddr::from(([127, 0, 0, 1], 10249)),
                    ))
                })
                .collect::<Result<_>>()?,
            Scope::Node { name, agent, .. } => vec![(name.clone(), None, *agent)],
        })
    }

    /// SRC as the trace's source: a pod (on this machine), or `outside`
    /// (in a lab: its gateway, a router outside every node).
    fn source(&self, view: &View, src: &str, dst_ip: IpAddr) -> Result<Pod> {
        let (sns, sname) = src.split_once('/').unwrap_or(("default", src));
        match &self.scope {
            Scope::Lab { lab, .. } if src == "outside" => {
                let netns = lab.gateway_ns();
                let ip = podnet_kernel::Netns::named(&netns)?
                    .run(|| {
                        podnet_kernel::Handle::new()
                            .and_then(|mut h| h.route_get(dst_ip, None, None))
                    })??
                    .route
                    .prefsrc
                    .ok_or_else(|| anyhow!("the lab's gateway has no address toward {dst_ip}"))?;
                Ok(Pod {
                    name: "outside (the lab's gateway)".into(),
                    ip,
                    netns,
                    node: None,
                })
            }
            Scope::Lab { lab, .. } => {
                let p = lab.pod(sns, sname).with_context(|| {
                    format!(
                        "SRC {src:?}: not a pod of lab {}, nor \"outside\"",
                        lab.name
                    )
                })?;
                // The pod's address of the destination's family.
                let ip = match dst_ip.is_ipv6() {
                    true => p.ip6.as_deref().ok_or_else(|| {
                        anyhow!("pod {src} has no IPv6 address (is the lab dual-stack?)")
                    })?,
                    false => p.ip.as_str(),
                };
                Ok(Pod {
                    name: format!("{sns}/{sname}"),
                    ip: ip
                        .parse()
                        .map_err(|_| anyhow!("pod {src} has no address yet"))?,
                    netns: p.netns.clone(),
                    node: Some(p.node.clone()),
                })
            }
            Scope::Node { name, .. } => {
                if src == "outside" {
                    bail!("SRC \"outside\" is a lab's gateway; on a real node SRC is a pod of this node");
                }
                let p = view
                    .world
                    .pods
                    .get(&podnet_policy::Key::new(sns, sname))
                    .ok_or_else(|| anyhow!("SRC {src:?}: no pod {sns}/{sname} in the cluster"))?;
                if p.node.as_deref() != Some(name.as_str()) {
                    bail!(
                        "SRC {sns}/{sname} runs on node {}, not on this node ({name}): run podnet trace there",
                        p.node.as_deref().unwrap_or("(none yet)")
                    );
                }
                let ip = *p
                    .ips
                    .iter()
                    .find(|ip| ip.is_ipv6() == dst_ip.is_ipv6())
                    .ok_or_else(|| {
                        anyhow!("pod {sns}/{sname} has no address of {dst_ip}'s family yet")
                    })?;
                Ok(Pod {
                    name: format!("{sns}/{sname}"),
                    ip,
                    netns: pod_netns(ip)
                        .with_context(|| format!("finding pod {sns}/{sname}'s namespace"))?,
                    node: Some(name.clone()),
                })
            }
        }
    }
}

/// The namespace of this node's pod with address `ip`: a namespace under
/// /run/netns (where containerd, CRI-O and podman keep their sandboxes')
/// that holds the address and is the far end of one of this node's veths.
/// The veth check matters: addresses repeat across clusters and labs on
/// one machine, namespace ids do not.
fn pod_netns(ip: IpAddr) -> Result<String> {
    let mut h = podnet_kernel::Handle::new()?;
    let peers: std::collections::BTreeSet<i32> = h
        .links()?
        .into_iter()
        .filter(|l| l.kind == podnet_kernel::LinkKind::Veth)
        .filter_map(|l| l.link_netnsid)
        .collect();
    let dir = std::path::Path::new("/run/netns");
    let entries = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    for e in entries.flatten() {
        let Ok(ns) = podnet_kernel::Netns::open(e.path()) else {
            continue;
        };
        let holds = ns
            .run(|| -> Result<bool, podnet_kernel::KernelError> {
                let mut h = podnet_kernel::Handle::new()?;
                Ok(h.addrs(0)?.iter().any(|a| a.net.addr() == ip))
            })
            .ok()
            .and_then(|r| r.ok())
            .unwrap_or(false);
        if !holds {
            continue;
        }
        if let Some(id) = h.nsid_of(&ns)? {
            if peers.contains(&id) {
                return Ok(e.path().display().to_string());
            }
        }
    }
    bail!("no namespace under /run/netns holds {ip} behind a veth of this node")
}

/// The subnet a subnet.env names.
/// The node's pod subnet from its subnet.env (`v6`: its IPv6 one).
fn subnet_env(p: &std::path::Path, v6: bool) -> Option<ipnet::IpNet> {
    let t = std::fs::read_to_string(p).ok()?;
    let e = podnet_cni::plugins::meta::SubnetEnv::parse(&t, &p.display().to_string()).ok()?;
    match v6 {
        false => Some(e.subnet.trunc()),
        true => e.ipv6.map(|(_, s)| s.trunc()),
    }
}

/// A Node's podCIDR of one family (`v6`), from `podCIDRs`.
fn pod_cidr_of(n: &podnet_api::k8s_openapi::api::core::v1::Node, v6: bool) -> Option<ipnet::IpNet> {
    n.spec
        .as_ref()?
        .pod_cidrs
        .iter()
        .flatten()
        .filter_map(|c| c.parse::<ipnet::IpNet>().ok())
        .find(|c| c.addr().is_ipv6() == v6)
}

/// A lab node's pod subnet of one family: its Node's podCIDR (Kubernetes
/// mode), or what its agent wrote to subnet.env (standalone).
fn lab_node_subnet(
    lab: &podnet_lab::Lab,
    view: &View,
    node: &str,
    v6: bool,
) -> Option<ipnet::IpNet> {
    if let Some(c) = view.nodes.get(node).and_then(|n| pod_cidr_of(n, v6)) {
        return Some(c);
    }
    subnet_env(&lab.dir.join("nodes").join(node).join("subnet.env"), v6)
}

/// Keeps `view` current from `source` until the source ends; `ready` is
/// told once the first complete list is in.
pub async fn keep(
    mut source: podnet_source::Source,
    view: std::sync::Arc<std::sync::RwLock<View>>,
    ready: Option<tokio::sync::oneshot::Sender<()>>,
) {
    let mut sub = source.subscribe(VIEW_KINDS);
    let _running = source.start();
    let mut ready = ready;
    while let Some(b) = sub.next_batch().await {
        let mut v = view.write().expect("view");
        for d in &b.deltas {
            v.apply(d);
        }
        if b.ready && !v.ready {
            v.ready = true;
            if let Some(r) = ready.take() {
                let _ = r.send(());
            }
        }
    }
}

/// One complete list through the source.
async fn load(source: podnet_source::Source) -> Result<View> {
    let view = std::sync::Arc::new(std::sync::RwLock::new(View::default()));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(keep(source, view.clone(), Some(tx)));
    tokio::time::timeout(Duration::from_secs(15), rx)
        .await
        .map_err(|_| anyhow!("the cluster's objects did not arrive within 15s"))?
        .map_err(|_| anyhow!("the object source ended"))?;
    task.abort();
    let _ = task.await;
    let v = std::mem::take(&mut *view.write().expect("view"));
    Ok(v)
}

struct ClusterOracles<'a> {
    view: &'a View,
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
    stack: podnet_proxy::Stack,
    nodes: &'a [ClusterNode],
}

impl Oracles for ClusterOracles<'_> {
    fn policy(&self, src: IpAddr, dst: IpAddr, port: u16, proto: Proto) -> Option<PolicyAnswer> {
        let v = evaluate(
            &self.view.world,
            &Flow {
                src,
                dst,
                proto,
                port,
            },
        );
        Some(PolicyAnswer {
            egress: v.egress.allows(),
            ingress: v.ingress.allows(),
            why: crate::policy::verdict_text(&v),
        })
    }

    fn endpoints(
        &self,
        node: &str,
        src: IpAddr,
        frontend: SocketAddr,
        proto: Proto,
    ) -> Option<Vec<SocketAddr>> {
        let n = self.nodes.iter().find(|n| n.name == node)?;
        let info = podnet_proxy::NodeInfo {
            name: node.to_string(),
            zone: None,
            ips: vec![n.ip],
            nodeport_ips: None,
        };
        let t = podnet_proxy::rules::plan(&podnet_proxy::rules::ProxyInput {
            node: &info,
            stack: self.stack,
            services: &self.services,
            slices: &self.slices,
        });
        let mut pkt = podnet_nft::trace::Packet::new(
            &src.to_string(),
            &frontend.ip().to_string(),
            proto,
            frontend.port(),
        );
        // From a pod over the bridge, or from outside over the underlay.
        let from_pod = match (self.stack.cluster_cidr, src) {
            (Some(c), s) => c.contains(&s),
            _ => false,
        };
        pkt.iif = Some(if from_pod { "podnet0" } else { "eth0" }.into());
        let local = n.ip.to_string();
        let targets = podnet_nft::trace::Tracer::new(&t)
            .with_local(&[local.as_str()])
            .incoming_targets(&pkt, 256);
        if targets.iter().all(|t| t.is_none()) {
            return None;
        }
        Some(
            targets
                .into_iter()
                .flatten()
                .map(|(ip, port)| SocketAddr::new(ip, port.unwrap_or(frontend.port())))
                .collect(),
        )
    }
}

/// The labs up on this machine: those whose state is under
/// `/run/podnet-lab/<name>/`.
fn labs_up() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(podnet_lab::RUN_DIR) else {
        return Vec::new();
    };
    let mut up: Vec<String> = dir
        .flatten()
        .filter(|e| e.path().join("lab.json").is_file())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    up.sort();
    up
}

/// `err` of a command run without `--lab`, with a hint when labs are up:
/// right after `lab up` that is the likelier meaning.
fn hint_lab(err: anyhow::Error, labs: &[String]) -> anyhow::Error {
    match labs {
        [] => err,
        [one] => anyhow!("{err:#}\nlab {one} is up on this machine: did you mean --lab {one}?"),
        many => anyhow!(
            "{err:#}\nlabs {} are up on this machine: did you mean --lab {}?",
            many.join(", "),
            many.join(" or --lab ")
        ),
    }
}

/// `podnet trace`; a URL is compiled with `gateway` (the gateway's
/// settings).
pub async fn run(
    target: &Target,
    (src, dst): (&str, &str),
    output: &str,
    gateway: &podnet_gateway::model::build::Config,
) -> Result<()> {
    if !["text", "json"].contains(&output) {
        bail!("-o {output:?}: want text or json");
    }
    if dst.starts_with("http://") || dst.starts_with("https://") {
        return crate::trace_http::run(target, dst, output, gateway).await;
    }
    let r = trace_and_print(target, src, dst, output).await;
    match &target.lab {
        None => r.map_err(|e| hint_lab(e, &labs_up())),
        Some(_) => r,
    }
}

async fn trace_and_print(target: &Target, src: &str, dst: &str, output: &str) -> Result<()> {
    let (ctx, source) = TraceContext::open(target).await?;
    let view = load(source).await?;
    let trace = tokio::task::block_in_place(|| trace_in(&ctx, &view, src, dst))?;
    if output == "json" {
        println!("{}", serde_json::to_string_pretty(&trace)?);
    } else {
        print!("{}", trace.text());
    }
    Ok(())
}

/// Traces SRC -> DST from `ctx`, naming things from `view` (blocking: it
/// sends the probe and reads the kernel).
pub fn trace_in(
    ctx: &TraceContext,
    view: &View,
    src: &str,
    dst: &str,
) -> Result<podnet_trace::Trace> {
    let net = &ctx.net;
    let nodes = ctx.nodes(view);
    let (host, port, proto) = crate::policy::target(dst)?;
    let names = address_names(view, &nodes);
    let services = service_ports(view, &nodes);
    let dst_ip = resolve_dst(view, &nodes, &host)?;
    let cidrs = net.service_cidrs();
    let stack = match dst_ip {
        IpAddr::V4(_) => podnet_proxy::Stack::v4(net.network)
            .with_service_cidr(cidrs.of_family(podnet_api::ipfamily::IPV4)),
        IpAddr::V6(_) => podnet_proxy::Stack::v6(net.ipv6_network)
            .with_service_cidr(cidrs.of_family(podnet_api::ipfamily::IPV6)),
    };
    let oracles = ClusterOracles {
        view,
        services: view.services.values().cloned().collect(),
        slices: view.slices.values().cloned().collect(),
        stack,
        nodes: &nodes,
    };
    let src_pod = ctx.source(view, src, dst_ip)?;
    let req = Request {
        src: src_pod,
        dst: SocketAddr::new(dst_ip, port),
        dst_name: host.clone(),
        proto,
        nodes: nodes
            .iter()
            .map(|n| Node {
                name: n.name.clone(),
                netns: n.netns.clone(),
                subnets: n.subnet.into_iter().chain(n.subnet6).collect(),
            })
            .collect(),
        names,
        services,
        request: Some(podnet_lab::serve::WHOAMI.to_string()),
        timeout: Duration::from_secs(2),
        oracles: &oracles,
    };
    Ok(podnet_trace::collect::run(&req)?)
}

/// A name for every address the view knows: pods, nodes and Services'
/// ClusterIPs.
fn address_names(view: &View, nodes: &[ClusterNode]) -> Names {
    let mut names: Names = BTreeMap::new();
    for (k, v) in &view.world.pods {
        for ip in &v.ips {
            names.insert(*ip, k.to_string());
        }
    }
    for n in nodes {
        names.insert(n.ip, n.name.clone());
    }
    for s in view.services.values() {
        let (ns, name) = service_name(s);
        for ip in cluster_ips(s) {
            names.insert(ip, format!("Service {ns}/{name}"));
        }
    }
    names
}

fn service_name(s: &Service) -> (String, String) {
    (
        s.metadata.namespace.clone().unwrap_or_default(),
        s.metadata.name.clone().unwrap_or_default(),
    )
}

/// A Service's ClusterIPs that parse as addresses.
fn cluster_ips(s: &Service) -> Vec<IpAddr> {
    s.spec
        .iter()
        .flat_map(|spec| spec.cluster_ips.iter().flatten())
        .filter_map(|ip| ip.parse::<IpAddr>().ok())
        .collect()
}

/// Every Service port the trace may meet: each port on each ClusterIP,
/// and its NodePort on every node.
fn service_ports(view: &View, nodes: &[ClusterNode]) -> Vec<ServicePort> {
    let mut services = Vec::new();
    for s in view.services.values() {
        let (ns, name) = service_name(s);
        let spec = s.spec.clone().unwrap_or_default();
        for ip in cluster_ips(s) {
            for sp in spec.ports.clone().unwrap_or_default() {
                let pname = sp.name.clone().map(|n| format!(":{n}")).unwrap_or_default();
                let proto = sp
                    .protocol
                    .clone()
                    .unwrap_or("TCP".into())
                    .to_ascii_lowercase();
                services.push(ServicePort {
                    name: format!("{ns}/{name}{pname}"),
                    ip,
                    port: sp.port as u16,
                    proto: proto.clone(),
                });
                // Its NodePort, on every node.
                if let Some(np) = sp.node_port {
                    for n in nodes {
                        services.push(ServicePort {
                            name: format!("{ns}/{name}{pname} (NodePort)"),
                            ip: n.ip,
                            port: np as u16,
                            proto: proto.clone(),
                        });
                    }
                }
            }
        }
    }
    services
}

/// DST: an address, a node (for a NodePort), a pod, or a Service.
fn resolve_dst(view: &View, nodes: &[ClusterNode], host: &str) -> Result<IpAddr> {
    if let Ok(ip) = host.parse() {
        return Ok(ip);
    }
    if let Some(n) = nodes.iter().find(|n| n.name == host) {
        return Ok(n.ip);
    }
    let (ns, name) = host.split_once('/').unwrap_or(("default", host));
    let key = podnet_policy::Key::new(ns, name);
    if let Some(v) = view.world.pods.get(&key) {
        return v
            .ips
            .first()
            .copied()
            .ok_or_else(|| anyhow!("pod {ns}/{name} has no address yet"));
    }
    let Some(s) = view.services.values().find(|s| {
        s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(name)
    }) else {
        bail!("DST {host:?}: no pod, Service or node of that name, and not an address");
    };
    s.spec
        .as_ref()
        .and_then(|sp| sp.cluster_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(|| anyhow!("Service {ns}/{name} has no ClusterIP"))
}

/// `podnet flows`' arguments.
#[derive(clap::Args)]
pub struct FlowArgs {
    /// Read every node of this lab (default: the agent at --agent).
    #[arg(long)]
    pub lab: Option<String>,
    /// The agent's metrics address, on a real node.
    #[arg(long, default_value = "127.0.0.1:10249")]
    pub agent: String,
    /// Keep printing new flows.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Only flows of this pod (NAMESPACE/POD), either end.
    #[arg(long)]
    pub pod: Option<String>,
    /// Only this verdict: forwarded or dropped.
    #[arg(long)]
    pub verdict: Option<String>,
    /// Output: text or json (one record per line).
    #[arg(short = 'o', long, default_value = "text")]
    pub output: String,
}

/// One agent's flow log: where to ask, and from which namespace.
struct FlowSource {
    label: String,
    netns: Option<podnet_kernel::Netns>,
    addr: SocketAddr,
    after: u64,
    lost: u64,
}

/// How `podnet flows` and the UI read an agent's flow log, from inside
/// `ns` when the agent runs in a lab node: 2 s to connect, 5 s per read.
pub(crate) fn agent_get(ns: Option<&podnet_kernel::Netns>) -> HttpGet<'_> {
    HttpGet::new(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(2))
        .netns(ns)
}

/// `podnet flows`.
pub fn flows(a: FlowArgs) -> Result<()> {
    if !["text", "json"].contains(&a.output.as_str()) {
        bail!("-o {:?}: want text or json", a.output);
    }
    if let Some(v) = &a.verdict {
        if !["forwarded", "dropped"].contains(&v.as_str()) {
            bail!("--verdict {v:?}: want forwarded or dropped");
        }
    }
    let pod = a.pod.as_ref().map(|p| {
        if p.contains('/') {
            p.clone()
        } else {
            format!("default/{p}")
        }
    });
    let mut sources = Vec::new();
    match &a.lab {
        Some(name) => {
            let exe = std::fs::canonicalize("/proc/self/exe")?;
            let st = podnet_lab::Lab::new(name, exe)?.state()?;
            for n in &st.nodes {
                sources.push(FlowSource {
                    label: n.name.clone(),
                    netns: Some(podnet_kernel::Netns::named(&n.netns)?),
                    addr: ([127, 0, 0, 1], 10249).into(),
                    after: 0,
                    lost: 0,
                });
            }
        }
        None => sources.push(FlowSource {
            label: a.agent.clone(),
            netns: None,
            addr: podnet_daemon::listen_addr(&a.agent).map_err(anyhow::Error::msg)?,
            after: 0,
            lost: 0,
        }),
    }
    loop {
        let mut batch: Vec<podnet_trace::flows::FlowRecord> = Vec::new();
        for s in &mut sources {
            let path = format!("/flows?after={}", s.after);
            let got = agent_get(s.netns.as_ref())
                .get(s.addr, &path)
                .with_context(|| {
                    format!("{}: reading the agent's flow log at {}", s.label, s.addr)
                })?;
            if got.status != 200 {
                bail!(
                    "{}: the agent answered {} for /flows: {} (is it running without --no-flows?)",
                    s.label,
                    got.status,
                    got.body.trim()
                );
            }
            let page: podnet_trace::flows::Page = serde_json::from_str(&got.body)
                .with_context(|| format!("{}: not a flow page", s.label))?;
            if page.missed > 0 {
                eprintln!(
                    "{}: {} flows missed (the log holds the newest only)",
                    s.label, page.missed
                );
            }
            if page.lost > s.lost {
                eprintln!(
                    "{}: the kernel dropped {} batches of connection events",
                    s.label,
                    page.lost - s.lost
                );
                s.lost = page.lost;
            }
            s.after = page.last;
            batch.extend(page.flows);
        }
        batch.sort_by_key(|f| (f.time_ms, f.node.clone(), f.seq));
        for f in batch.iter().filter(|f| {
            a.verdict.as_ref().is_none_or(|v| &f.verdict == v)
                && pod.as_ref().is_none_or(|p| f.involves(p))
        }) {
            if a.output == "json" {
                println!("{}", serde_json::to_string(f)?);
            } else {
                println!("{}", f.text());
            }
        }
        if !a.follow {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_without_lab_names_the_labs_that_are_up() {
        let e = || anyhow!("SRC default/pod1 runs on node node1, not on this node (vm)");
        assert_eq!(hint_lab(e(), &[]).to_string(), e().to_string());
        assert!(hint_lab(e(), &["lab".into()])
            .to_string()
            .ends_with("(vm)\nlab lab is up on this machine: did you mean --lab lab?"));
        assert!(hint_lab(e(), &["a".into(), "b".into()])
            .to_string()
            .ends_with("labs a, b are up on this machine: did you mean --lab a or --lab b?"));
    }
}
