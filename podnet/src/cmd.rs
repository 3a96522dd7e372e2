//! One function per subcommand.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use podnet_cni::runtime::{Attach, Runtime};
use podnet_kernel::{Handle, Netns};
use serde_json::json;

/// `podnet cni install DIR`: one link per plugin name, replaced atomically.
pub fn cni_install(dir: &Path) -> Result<()> {
    let exe = std::fs::canonicalize("/proc/self/exe").context("finding this executable")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for name in podnet_cni::plugins::NAMES {
        let dst = dir.join(name);
        let tmp = dir.join(format!(".{name}.podnet-tmp"));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&exe, &tmp)
            .with_context(|| format!("linking {}", tmp.display()))?;
        std::fs::rename(&tmp, &dst).with_context(|| format!("installing {}", dst.display()))?;
    }
    println!(
        "installed {} plugins in {} -> {}",
        podnet_cni::plugins::NAMES.len(),
        dir.display(),
        exe.display()
    );
    Ok(())
}

/// `podnet node-setup`: what a node needs before its agent starts, done
/// from inside a container whose image the host cannot see. So the binary
/// is copied (not linked) into `bin_dir`, atomically, since a runtime may
/// be running the old one; the plugin names link to the copy. The conflist
/// is the one the agent writes, so the runtime sees the network from now
/// on and the agent's rewrite changes nothing.
pub fn node_setup(
    bin_dir: &Path,
    conf_dir: &Path,
    subnet_file: &Path,
    data_dir: Option<&Path>,
    ct: &podnet_proxy::ct_timeouts::Timeouts,
) -> Result<()> {
    use podnet_overlay::files;
    std::fs::create_dir_all(bin_dir).with_context(|| format!("creating {}", bin_dir.display()))?;
    let me = bin_dir.join("podnet");
    let tmp = bin_dir.join(".podnet.podnet-tmp");
    std::fs::copy("/proc/self/exe", &tmp)
        .with_context(|| format!("copying this binary to {}", tmp.display()))?;
    std::fs::rename(&tmp, &me).with_context(|| format!("installing {}", me.display()))?;
    // The copy is itself the `podnet` plugin; the others link to it.
    for name in podnet_cni::plugins::NAMES
        .iter()
        .filter(|n| **n != "podnet")
    {
        let dst = bin_dir.join(name);
        let tmp = bin_dir.join(format!(".{name}.podnet-tmp"));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink("podnet", &tmp)
            .with_context(|| format!("linking {}", tmp.display()))?;
        std::fs::rename(&tmp, &dst).with_context(|| format!("installing {}", dst.display()))?;
    }
    let list = files::conflist(subnet_file, data_dir);
    let path = conf_dir.join(files::CONFLIST_NAME);
    files::write_if_changed(&path, &serde_json::to_string_pretty(&list)?)
        .with_context(|| format!("writing {}", path.display()))?;
    podnet_kernel::netns::write_sysctl("net.ipv4.ip_forward", "1")
        .context("turning on IP forwarding")?;
    podnet_overlay::ensure_bridge_netfilter(true);
    // The agent's container cannot write /proc/sys: its proxy's conntrack
    // timeouts are set here.
    match podnet_proxy::ct_timeouts::apply(ct) {
        Ok(set) if !set.is_empty() => println!("set {}", set.join(", ")),
        Ok(_) => {}
        Err(e) => eprintln!("warning: conntrack timeouts not set: {e}"),
    }
    println!(
        "installed the {} CNI plugins in {} (podnet, and links to it), {}; IP forwarding on",
        podnet_cni::plugins::NAMES.len(),
        bin_dir.display(),
        path.display()
    );
    Ok(())
}

const DEMO_HOST: &str = "pn-demo-host";
const DEMO_PODS: [&str; 2] = ["pn-demo-a", "pn-demo-b"];
const DEMO_DIR: &str = "/run/podnet-demo";

fn demo_down() -> Result<()> {
    for ns in DEMO_PODS.iter().chain([&DEMO_HOST]) {
        Netns::delete_named(ns)?;
    }
    let _ = std::fs::remove_dir_all(DEMO_DIR);
    Ok(())
}

/// `podnet demo`: a host namespace with our bridge, two pods attached through
/// the real plugin binaries, a TCP exchange between them, then teardown.
pub fn demo(keep: bool, down: bool) -> Result<()> {
    demo_down()?;
    if down {
        println!("demo removed");
        return Ok(());
    }
    let r = demo_run(keep);
    if r.is_err() {
        let _ = demo_down();
    }
    r
}

fn demo_run(keep: bool) -> Result<()> {
    let bin = PathBuf::from(DEMO_DIR).join("bin");
    cni_install(&bin)?;
    let host = Netns::create_named(DEMO_HOST)?;
    let rt = Runtime::new(&bin).in_netns(host.path());
    let list = json!({
        "cniVersion": "1.1.0",
        "name": "demo",
        "plugins": [
            {"type": "bridge", "bridge": "demo0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/24"}]],
                      "routes": [{"dst": "0.0.0.0/0"}], "dataDir": format!("{DEMO_DIR}/ipam")}},
            {"type": "portmap", "capabilities": {"portMappings": true}, "stateDir": format!("{DEMO_DIR}/portmap")}
        ]
    });
    let mut ips = Vec::new();
    for (i, pod) in DEMO_PODS.iter().enumerate() {
        let ns = Netns::create_named(pod)?;
        let mut a = Attach {
            container_id: format!("demo-{i}"),
            netns: ns.path().display().to_string(),
            ifname: "eth0".into(),
            ..Default::default()
        };
        a.capability_args.insert(
            "portMappings".into(),
            json!([{"hostPort": 8080 + i, "containerPort": 80, "protocol": "tcp"}]),
        );
        let r = rt
            .add_list(&list, &a)
            .map_err(|e| anyhow::anyhow!("ADD {pod}: {e}"))?;
        let ip = r["ips"][0]["address"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        println!("pod {pod}: eth0 {ip} (host port {} -> 80)", 8080 + i);
        ips.push(ip.split('/').next().unwrap_or_default().to_string());
    }
    let b = Netns::named(DEMO_PODS[1])?;
    let listener = b.run(|| TcpListener::bind("0.0.0.0:80"))??;
    let server = std::thread::spawn(move || -> std::io::Result<String> {
        let (mut s, peer) = listener.accept()?;
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf)?;
        s.write_all(b"hello from pn-demo-b")?;
        Ok(format!(
            "{} said {:?}",
            peer.ip(),
            String::from_utf8_lossy(&buf[..n])
        ))
    });
    let a = Netns::named(DEMO_PODS[0])?;
    let reply = a.run(|| -> std::io::Result<String> {
        let mut s = TcpStream::connect((ips[1].as_str(), 80))?;
        s.write_all(b"hello from pn-demo-a")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })??;
    let heard = server
        .join()
        .map_err(|_| anyhow::anyhow!("server thread panicked"))??;
    println!("pn-demo-b heard: {heard}");
    println!("pn-demo-a heard: {reply:?}");
    if !heard.starts_with(&ips[0]) {
        bail!(
            "pod b saw source {heard}, expected pod a's own IP {} (no NAT)",
            ips[0]
        );
    }
    let mut h = Handle::in_netns(&host)?;
    let br = h.require_link("demo0")?;
    let ports: Vec<String> = h
        .links()?
        .into_iter()
        .filter(|l| l.master == Some(br.index))
        .map(|l| l.name)
        .collect();
    println!("host bridge demo0 ports: {}", ports.join(", "));
    if keep {
        println!("kept: try `ip netns exec {DEMO_HOST} nft list ruleset`; remove with `podnet demo --down`");
        return Ok(());
    }
    for (i, pod) in DEMO_PODS.iter().enumerate() {
        let a = Attach {
            container_id: format!("demo-{i}"),
            netns: format!("/run/netns/{pod}"),
            ifname: "eth0".into(),
            ..Default::default()
        };
        rt.del_list(&list, &a, None)
            .map_err(|e| anyhow::anyhow!("DEL {pod}: {e}"))?;
    }
    demo_down()?;
    println!("demo torn down");
    Ok(())
}

/// Opens the store and wraps it for object access.
pub async fn objects(url: &str) -> Result<podnet_store::Objects> {
    let s = podnet_store::open(url)
        .await
        .with_context(|| format!("opening store {url}"))?;
    Ok(podnet_store::Objects::new(s))
}

/// `podnet controller`: runs until SIGTERM, serving metrics and health.
pub async fn controller(url: &str, metrics_addr: &str, resync: u64) -> Result<()> {
    let objs = objects(url).await?;
    let metrics = podnet_daemon::Metrics::new();
    let addr = podnet_daemon::listen_addr(metrics_addr).map_err(anyhow::Error::msg)?;
    let listener = podnet_daemon::bind(&addr.to_string())
        .await
        .with_context(|| format!("binding metrics address {addr}"))?;
    tracing::info!(store = url, metrics = %listener.local_addr()?, "controller starting");
    tokio::spawn(podnet_daemon::serve(listener, metrics.clone()));
    let mut source =
        podnet_source::Source::store(objs.store.clone(), metrics.store_watch("controller"));
    let sub = source.subscribe(&podnet_apiserver::KINDS);
    let _source = source.start();
    podnet_apiserver::Controller::new(objs, metrics)
        .run(
            sub,
            std::time::Duration::from_secs(resync.max(1)),
            podnet_daemon::shutdown_signal(),
        )
        .await?;
    tracing::info!("controller stopped");
    Ok(())
}

/// `podnet controller` in Kubernetes mode: LB IPAM alone (the cluster's
/// own controllers allocate ClusterIPs and keep EndpointSlices), by the
/// replica that holds the Lease `podnet-lb-ipam`.
pub async fn lb_controller(
    kube: &KubeArgs,
    metrics_addr: &str,
    lease_namespace: &str,
    id: Option<String>,
) -> Result<()> {
    let client = kube.client().await?;
    let metrics = podnet_daemon::Metrics::new();
    let addr = podnet_daemon::listen_addr(metrics_addr).map_err(anyhow::Error::msg)?;
    let listener = podnet_daemon::bind(&addr.to_string())
        .await
        .with_context(|| format!("binding metrics address {addr}"))?;
    tokio::spawn(podnet_daemon::serve(listener, metrics.clone()));
    let id = id.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    tracing::info!(%id, lease_namespace, "LB IPAM controller starting (Kubernetes mode)");
    let mut source = podnet_source::Source::kube(client.clone(), metrics.store_watch("controller"));
    let sub = source.subscribe(podnet_lb::kube::KINDS);
    let _source = source.start();
    let lease = podnet_lease::LeaseConfig::new(lease_namespace, LB_LEASE, &id);
    let ready = move || metrics.set_ready(true);
    podnet_lb::kube::run(client, sub, lease, ready, podnet_daemon::shutdown_signal()).await;
    tracing::info!("controller stopped");
    Ok(())
}

/// The Lease LB IPAM's replicas elect their leader with.
pub const LB_LEASE: &str = "podnet-lb-ipam";

/// Where `podnet agent` and `podnet dns` read cluster state in Kubernetes
/// mode.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct KubeArgs {
    /// Read cluster state from the Kubernetes API with this kubeconfig
    /// (Kubernetes mode) instead of the podnet store. Inside a pod the
    /// in-cluster service-account config is used without this flag.
    #[arg(long, env = "KUBECONFIG_PODNET")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Kubernetes mode: the network config, flannel's net-conf.json fields
    /// (Network, SubnetLen, Backend {Type, VNI, Port, DirectRouting}, plus
    /// podnet's ServiceCIDR, ClusterDomain...). Default: podnet's defaults.
    #[arg(long)]
    pub net_conf: Option<std::path::PathBuf>,
}

/// The in-cluster service account's token, present inside a pod.
const IN_CLUSTER_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

impl KubeArgs {
    /// Kubernetes mode: a kubeconfig was given, or this runs in a pod with
    /// a service account.
    pub fn enabled(&self) -> bool {
        self.kubeconfig.is_some()
            || (std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
                && std::path::Path::new(IN_CLUSTER_TOKEN).exists())
    }

    pub async fn client(&self) -> Result<kube::Client> {
        podnet_source::kube_client(self.kubeconfig.as_deref())
            .await
            .context("connecting to the Kubernetes API")
    }

    /// The network config in Kubernetes mode.
    pub fn network_config(&self) -> Result<podnet_api::netconfig::Resolved> {
        let spec: serde_json::Value = match &self.net_conf {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("reading --net-conf {}", p.display()))?;
                serde_json::from_str(&text)
                    .with_context(|| format!("--net-conf {}: not JSON", p.display()))?
            }
            None => serde_json::json!({}),
        };
        let cfg: podnet_api::netconfig::NetworkConfig =
            serde_json::from_value(serde_json::json!({ "spec": spec }))
                .with_context(|| "--net-conf: not a network config".to_string())?;
        cfg.resolve()
            .map_err(|(f, m)| anyhow::anyhow!("--net-conf field {f}: {m}"))
    }
}

/// `podnet agent`: runs until SIGTERM (leaving the data plane), or with
/// `--cleanup` removes what it installed.
pub async fn agent(
    url: &str,
    kube: &KubeArgs,
    mut opts: podnet_agent::Options,
    metrics_addr: &str,
    cleanup: bool,
) -> Result<()> {
    use podnet_source::node::{Claim, NodeView};
    if cleanup {
        let claim = if kube.enabled() {
            Some(Claim::Kube(kube.client().await?))
        } else {
            podnet_store::open(url).await.ok().map(Claim::Store)
        };
        for line in podnet_agent::cleanup(claim, &opts).await? {
            println!("{line}");
        }
        return Ok(());
    }
    let metrics = podnet_daemon::Metrics::new();
    let view = if kube.enabled() {
        let client = kube.client().await?;
        opts.networks = crate::networks::kube(&client).await;
        NodeView::kube(client, kube.network_config()?, &opts.node, &metrics)
    } else {
        let store = podnet_store::open(url)
            .await
            .with_context(|| format!("opening store {url}"))?;
        opts.networks = Some(crate::networks::store(podnet_store::objects::Objects::new(
            store.clone(),
        )));
        NodeView::store(store, &opts.node, opts.lease_ttl, &metrics).await?
    };
    let addr = podnet_daemon::listen_addr(metrics_addr).map_err(anyhow::Error::msg)?;
    // Beside the standard pages: the flow log, and kube-proxy's
    // `/proxyMode` (which tools and upstream's e2e read on :10249).
    let (flows, proxy, bgp) = (opts.flows.clone(), opts.proxy, opts.bgp_status.clone());
    let pages: Option<podnet_daemon::Pages> = Some(std::sync::Arc::new(move |p: &str| match p {
        "/proxyMode" if proxy => Some((200, "text/plain", "nftables".to_string())),
        "/bgp" => Some((200, "application/json", bgp.json())),
        _ => flows
            .as_ref()
            .and_then(|log| podnet_agent::flows::page(log, p)),
    }));
    match podnet_daemon::bind(&addr.to_string()).await {
        Ok(l) => {
            tokio::spawn(podnet_daemon::serve_with(l, metrics.clone(), pages));
        }
        Err(e) => tracing::warn!("metrics address {addr}: {e}; serving no metrics"),
    }
    podnet_agent::run(view, opts, metrics, podnet_daemon::shutdown_signal()).await?;
    Ok(())
}

/// `podnet serve`.
pub fn serve(namespace: &str, name: &str, ports: &str) -> Result<()> {
    let ports = podnet_lab::serve::parse_ports(ports).map_err(anyhow::Error::msg)?;
    podnet_lab::serve::serve(namespace, name, &ports)?;
    Ok(())
}

fn split_pod(s: &str) -> Result<(String, String)> {
    match s.split_once('/') {
        Some((ns, p)) if !ns.is_empty() && !p.is_empty() => Ok((ns.to_string(), p.to_string())),
        None if !s.is_empty() => Ok(("default".to_string(), s.to_string())),
        _ => bail!("{s:?}: want NAMESPACE/POD"),
    }
}

/// `podnet lab ...`.
pub async fn lab(name: &str, command: crate::LabCmd, store_flag: &str) -> Result<()> {
    use crate::LabCmd;
    let exe = std::fs::canonicalize("/proc/self/exe")?;
    let lab = podnet_lab::Lab::new(name, exe)?;
    match command {
        LabCmd::Up(up) => lab_up(&lab, up, store_flag).await?,
        LabCmd::Run {
            pod,
            node,
            labels,
            annotations,
            ports,
        } => {
            let meta = (labels.as_deref(), annotations.as_slice());
            lab_run(&lab, &pod, node.as_deref(), meta, &ports).await?
        }
        LabCmd::Exec { pod, cmd } => exec_in_pod(&lab, &pod, &cmd)?,
        LabCmd::Probe { pod, target, ask } => {
            let (ns, p) = split_pod(&pod)?;
            let who = lab.probe(&ns, &p, &target, &ask)?;
            println!("{who}");
        }
        LabCmd::Rm { pod } => {
            let (ns, p) = split_pod(&pod)?;
            lab.delete_pod(&ns, &p).await?;
            println!("pod {ns}/{p} deleted");
        }
        LabCmd::AddNode => {
            let n = lab.add_node()?;
            println!("node {} added ({})", n.name, n.ip);
        }
        LabCmd::RemoveNode { node } => {
            lab.remove_node(&node)?;
            println!("node {node} removed");
        }
        LabCmd::StopAgent { node, cleanup } => {
            for line in lab.stop_agent(&node, cleanup)? {
                println!("{line}");
            }
            println!("agent on {node} stopped");
        }
        LabCmd::RestartAgent { node } => {
            lab.restart_agent(&node)?;
            println!("agent on {node} restarted");
        }
        LabCmd::RestartApiserver => {
            lab.restart_apiserver().await?;
            println!("kube-apiserver restarted and ready");
        }
        LabCmd::Egress {
            netns,
            socket,
            nets,
        } => {
            podnet_lab::egress::run(&netns, &socket, nets)?;
        }
        LabCmd::Forward { netns, addrs } => {
            podnet_lab::forward::forward(&netns, &addrs)?;
        }
        LabCmd::Kubeconfig => {
            println!("{}", lab.kubeconfig()?.display());
        }
        LabCmd::Down => {
            for line in lab.down()? {
                println!("{line}");
            }
            println!("lab {name:?} is down");
        }
    }
    Ok(())
}

/// What `podnet lab up` prints: the nodes, and how to go on.
fn print_lab_up(lab: &podnet_lab::Lab, st: &podnet_lab::LabState) -> Result<()> {
    let objects = if st.kube {
        "a real kube-apiserver".to_string()
    } else {
        format!("store {}", st.store)
    };
    println!(
        "lab {:?} is up: {} nodes, backend {}, {objects}",
        st.name,
        st.nodes.len(),
        st.backend,
    );
    for n in &st.nodes {
        println!("  {}  netns {}  underlay {}", n.name, n.netns, n.ip);
    }
    if st.kube {
        println!(
            "kubectl: --kubeconfig {} (podnet lab kubeconfig --name {})",
            lab.kubeconfig()?.display(),
            st.name
        );
    }
    if st.kubelet {
        let api = podnet_lab::kube::ControlPlane::open(&lab.dir)?.advertised_addr();
        let (host, port) = api.rsplit_once(':').unwrap_or((&api, "443"));
        println!(
            "real kubelets: install podnet with kubectl apply -f deploy/podnet.yaml, its \
             ConfigMap set to kubernetesServiceHost: {host} kubernetesServicePort: {port} \
             (no kube-proxy runs); scripts/e2e.sh does it all"
        );
        return Ok(());
    }
    println!("try: podnet lab run default/web --node node1 --ports 80/tcp; podnet lab probe default/web2 IP:80");
    Ok(())
}

/// `lab run --labels`: `k=v,k=v`, with `app` defaulting to the pod's name.
fn pod_labels(
    labels: Option<&str>,
    pod: &str,
) -> Result<std::collections::BTreeMap<String, String>> {
    let mut l = std::collections::BTreeMap::new();
    for kv in labels
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
    {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("label {kv:?}: want key=value"))?;
        l.insert(k.to_string(), v.to_string());
    }
    l.entry("app".to_string())
        .or_insert_with(|| pod.to_string());
    Ok(l)
}

/// `podnet lab up`.
async fn lab_up(lab: &podnet_lab::Lab, a: crate::LabUpArgs, store_flag: &str) -> Result<()> {
    // The global --store default points at the machine's store; the lab
    // keeps its own unless one is given explicitly.
    let store = (store_flag != podnet_store::DEFAULT_URL).then(|| store_flag.to_string());
    let st = lab
        .up(&podnet_lab::UpOptions {
            nodes: a.nodes,
            backend: a.backend,
            store,
            resync_secs: a.resync,
            kube: a.kube || a.kubelet,
            kube_agents: !a.no_agents && !a.kubelet,
            kubelet: a.kubelet,
            images: a.images,
            dns_replicas: 1,
            daemon_exe: None,
            router: a.router,
            racks: a.racks,
            l2_announce: a.l2_announce,
            encrypt: a.encrypt,
            dual_stack: a.dual_stack,
        })
        .await?;
    print_lab_up(lab, &st)
}

/// `podnet lab run`: a pod through the real CNI plugins, registered.
async fn lab_run(
    lab: &podnet_lab::Lab,
    pod: &str,
    node: Option<&str>,
    (labels, annotations): (Option<&str>, &[String]),
    ports: &str,
) -> Result<()> {
    let (ns, p) = split_pod(pod)?;
    let mut meta = podnet_lab::kubelet::PodMeta::from(pod_labels(labels, &p)?);
    for a in annotations {
        let (k, v) = a
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--annotation {a:?}: want KEY=VALUE"))?;
        meta.annotations.insert(k.to_string(), v.to_string());
    }
    let ports = podnet_lab::serve::parse_ports(ports).map_err(anyhow::Error::msg)?;
    let info = lab.run_pod(&ns, &p, node, meta, &ports).await?;
    println!(
        "pod {}/{} on {}: {} (netns {})",
        info.namespace, info.name, info.node, info.ip, info.netns
    );
    Ok(())
}

/// `podnet lab exec`: replaces this process with the command in the pod's
/// network namespace, so it returns only on failure.
fn exec_in_pod(lab: &podnet_lab::Lab, pod: &str, cmd: &[String]) -> Result<()> {
    let (ns, p) = split_pod(pod)?;
    let info = lab.pod(&ns, &p)?;
    let err = std::os::unix::process::CommandExt::exec(
        std::process::Command::new("ip")
            .args(["netns", "exec", &info.netns])
            .args(cmd),
    );
    bail!("exec ip netns exec: {err}");
}
