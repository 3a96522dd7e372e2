//! The `podnet` binary. It is also every CNI plugin: called as `bridge`,
//! `host-local`, `static`, `loopback`, `portmap`, `bandwidth` or `podnet` (through the
//! links `podnet cni install` makes), it speaks the CNI protocol; called as
//! `podnet`, it parses subcommands. This file only parses arguments and calls
//! one function per command.

mod bgp;
mod cmd;
mod dns;
mod gateway;
mod kubectl;
mod networks;
mod plugin_log;
mod policy;
mod trace;
mod trace_http;
mod ui;

use clap::{Parser, Subcommand};

/// Where `podnet trace` and `podnet ui` look: a lab on this machine, or
/// (without --lab) the node they run on, whose cluster state comes from
/// the store or, with --kubeconfig or in a pod, the Kubernetes API.
#[derive(clap::Args)]
struct TraceAt {
    /// A lab on this machine.
    #[arg(long)]
    lab: Option<String>,
    /// Without --lab: this node's name (default: the host name, as the
    /// kubelet's).
    #[arg(long, conflicts_with = "lab")]
    node: Option<String>,
    #[command(flatten)]
    kube: cmd::KubeArgs,
    /// Without --lab: the agent's metrics address (its flow log).
    #[arg(long, default_value = "127.0.0.1:10249")]
    agent: String,
    /// Without --lab: the agent's subnet.env.
    #[arg(long, default_value = "/run/podnet/subnet.env")]
    subnet_file: std::path::PathBuf,
}

impl TraceAt {
    fn target(self, store: &str) -> trace::Target {
        trace::Target {
            lab: self.lab,
            node: self.node,
            store: store.to_string(),
            kube: self.kube,
            agent: self.agent,
            subnet_file: self.subnet_file,
        }
    }
}

#[derive(Parser)]
#[command(
    name = "podnet",
    version,
    about = "Kubernetes cluster networking: CNI plugins, node agent, service proxy, DNS"
)]
struct Cli {
    /// Cluster state store: sqlite:///abs/path.db or etcd://host:port[,host:port].
    #[arg(long, global = true, env = "PODNET_STORE", default_value = podnet_store::DEFAULT_URL)]
    store: String,
    /// How long a daemon's store watch may miss the store before /readyz
    /// fails and the loss is logged (e.g. 10s, 500ms).
    #[arg(long, global = true, env = "PODNET_WATCH_TIMEOUT", default_value = "10s",
          value_parser = podnet_daemon::parse_duration)]
    watch_timeout: std::time::Duration,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// CNI plugin management.
    Cni {
        #[command(subcommand)]
        command: CniCmd,
    },
    /// Build two pods on a bridge with our plugins, show them talking, tear down.
    Demo {
        /// Keep the namespaces for inspection (remove with `podnet demo --down`).
        #[arg(long)]
        keep: bool,
        /// Remove what a kept demo left.
        #[arg(long)]
        down: bool,
    },
    #[command(flatten)]
    Kubectl(KubectlCmd),
    /// The node agent: subnet lease, backend, masquerade, CNI files.
    Agent(AgentArgs),
    /// Prepare a node for the agent, once per start (the DaemonSet's
    /// privileged init container): copy this binary and the CNI plugin
    /// links into the runtime's plugin dir, write the conflist, turn on IP
    /// forwarding, bridge netfilter and the proxy's conntrack timeouts.
    NodeSetup {
        /// The container runtime's CNI plugin dir on the host.
        #[arg(long, default_value = "/opt/cni/bin")]
        cni_bin_dir: std::path::PathBuf,
        /// The container runtime's CNI config dir on the host.
        #[arg(long, default_value = "/etc/cni/net.d")]
        cni_conf_dir: std::path::PathBuf,
        /// The agent's --subnet-file (the conflist names it).
        #[arg(long, default_value = "/run/podnet/subnet.env")]
        subnet_file: std::path::PathBuf,
        /// The agent's --cni-data-dir (the conflist names it).
        #[arg(long)]
        cni_data_dir: Option<std::path::PathBuf>,
        #[command(flatten)]
        ct: CtTimeouts,
    },
    /// Answer the pod name (or `clientip`) on TCP/UDP ports (runs in lab pods).
    Serve {
        #[arg(long)]
        name: String,
        /// The pod's namespace, for the `whoami` answer (NAMESPACE/NAME).
        #[arg(long, default_value = "default")]
        namespace: String,
        /// Ports, e.g. 80/tcp,81/udp (names allowed: serve-80=80/tcp).
        #[arg(long)]
        ports: String,
    },
    /// Send one real probe from a pod and show every hop the kernel took:
    /// the pod's route, veth and bridge, each node's nftables rules (Service
    /// DNAT, NetworkPolicy), masquerade, the routing decision and backend
    /// (vxlan VTEP, host-gw next hop, udp tunnel), and delivery or the drop
    /// with its reason. Built from nftables trace events, route and FDB
    /// lookups and conntrack; the pure evaluators' answers are shown beside
    /// them and a disagreement is flagged.
    Trace {
        /// The source pod, NAMESPACE/POD (on a real node: a pod of that
        /// node), or `outside` in a lab.
        src: String,
        /// DST:PORT[/tcp|/udp]: DST a pod (NS/POD), a Service (NS/NAME), a
        /// node name (for a NodePort) or an address. Or an http(s):// URL:
        /// the route the L7 gateway would take for a GET of it (listener,
        /// host, rule, filters, backends and their endpoints).
        dst: String,
        #[command(flatten)]
        at: TraceAt,
        /// Output: text or json (the same hops as data).
        #[arg(short = 'o', long, default_value = "text")]
        output: String,
        #[command(flatten)]
        gateway: gateway::TraceArgs,
    },
    /// The flow log, like `hubble observe`: new connections each node
    /// forwarded and the ones its NetworkPolicy dropped (with the policy),
    /// every address named. Reads each agent's `/flows`.
    Flows(trace::FlowArgs),
    /// A web view of a lab or of this node's cluster: nodes with their
    /// subnets and tunnels, pods, Services with their endpoints, live
    /// flows, and traces drawn as a path (one page, served by podnet
    /// itself).
    Ui {
        #[command(flatten)]
        at: TraceAt,
        /// Where to serve the page (loopback by default). It prints the URL
        /// to open, with the token every API request needs.
        #[arg(long, default_value = "127.0.0.1:10280")]
        listen: String,
    },
    /// BGP on this node (the bgp backend).
    Bgp {
        #[command(subcommand)]
        command: BgpCmd,
    },
    /// NetworkPolicy tools.
    Policy {
        #[command(subcommand)]
        command: PolicyCmd,
    },
    /// A multi-node cluster on this machine, out of network namespaces.
    Lab {
        /// Lab name (1-8 lowercase letters or digits), for several labs at once.
        #[arg(long, global = true, default_value = "lab")]
        name: String,
        #[command(subcommand)]
        command: LabCmd,
    },
    /// Allocate ClusterIPs/NodePorts, maintain EndpointSlices and give
    /// LoadBalancer Services their addresses (LB IPAM). In Kubernetes mode
    /// (a kubeconfig, or in a pod) only LB IPAM: the replicas elect one
    /// through a Lease, and it alone writes.
    Controller {
        /// Address for /metrics, /healthz and /readyz.
        #[arg(long, default_value = "127.0.0.1:10257")]
        metrics_addr: String,
        /// Full resync period, in seconds (standalone).
        #[arg(long, default_value_t = 60)]
        resync: u64,
        #[command(flatten)]
        kube: cmd::KubeArgs,
        /// Kubernetes mode: the namespace of the Lease the replicas elect
        /// a leader with.
        #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
        lease_namespace: String,
        /// Kubernetes mode: this replica's name in the Lease (default: the
        /// pod's name, else the host name and process ID).
        #[arg(long, env = "POD_NAME")]
        id: Option<String>,
    },
    /// Cluster DNS: Services and endpoints from the store, other names forwarded.
    Dns(dns::DnsArgs),
    /// The L7 gateway: Gateway API (GatewayClass controller
    /// `podnet.io/gateway`, Gateways, HTTPRoutes, ReferenceGrants) and
    /// Ingress (class `podnet`), proxied over HTTP/1.1 and HTTP/2 with TLS
    /// termination straight to the pods EndpointSlices list; statuses
    /// written as the specs ask.
    Gateway(gateway::GatewayArgs),
}

/// kubectl's verbs against the store (they show among the top-level
/// commands, kept together here because they share one dispatch).
#[derive(Subcommand)]
enum KubectlCmd {
    /// Create or update objects from YAML/JSON manifests (like kubectl apply).
    #[command(after_long_help = kubectl::APPLY_HELP)]
    Apply {
        /// FILE, DIR (every .yaml/.yml/.json in it) or - for stdin; repeatable.
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<std::path::PathBuf>,
    },
    /// Show objects (like kubectl get).
    Get {
        /// Kind: ns, no, po, svc, ep (EndpointSlices), netpol, networkconfig, or full names.
        kind: String,
        /// One object's name.
        name: Option<String>,
        #[arg(short = 'n', long)]
        namespace: Option<String>,
        /// Every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// Output: yaml, json, wide or name.
        #[arg(short = 'o', long)]
        output: Option<String>,
        /// Label selector, e.g. app=web,tier!=db.
        #[arg(short = 'l', long)]
        selector: Option<String>,
    },
    /// Delete objects by manifest or by kind and name (like kubectl delete).
    Delete {
        #[arg(short = 'f', long = "filename")]
        files: Vec<std::path::PathBuf>,
        kind: Option<String>,
        names: Vec<String>,
        #[arg(short = 'n', long)]
        namespace: Option<String>,
        /// Treat "not found" as success.
        #[arg(long)]
        ignore_not_found: bool,
    },
}

/// Flags of `podnet agent`.
#[derive(clap::Args)]
struct AgentArgs {
    /// This node's name.
    #[arg(long)]
    node: String,
    /// Underlay interface (default: the default route's).
    #[arg(long)]
    iface: Option<String>,
    #[arg(long, default_value = "/run/podnet/subnet.env")]
    subnet_file: std::path::PathBuf,
    #[arg(long, default_value = "/etc/cni/net.d")]
    cni_conf_dir: std::path::PathBuf,
    /// Where the node's CNI state lives (default: the plugins' defaults).
    #[arg(long)]
    cni_data_dir: Option<std::path::PathBuf>,
    /// Subnet lease TTL in seconds (renewed at a third of it).
    #[arg(long, default_value_t = 86400)]
    lease_ttl: i64,
    /// Resync period in seconds: how fast a deleted route is repaired.
    #[arg(long, default_value_t = 10)]
    resync: u64,
    /// Pod MTU (default: underlay MTU minus the backend's overhead).
    #[arg(long)]
    mtu: Option<u32>,
    #[arg(long, default_value = "127.0.0.1:10249")]
    metrics_addr: String,
    /// Remove everything the agent installed on this node, then exit.
    #[arg(long)]
    cleanup: bool,
    /// Do not run the service proxy.
    #[arg(long)]
    no_proxy: bool,
    /// Where the service proxy serves its `/healthz` and `/livez`, as
    /// kube-proxy's `--healthz-bind-address` (load balancers probe it);
    /// `off` for nowhere.
    #[arg(long, default_value = podnet_proxy::healthz::DEFAULT_ADDR, value_parser = healthz_addr)]
    healthz_addr: HealthzAddr,
    #[command(flatten)]
    ct: CtTimeouts,
    /// Where NodePorts are accepted, as kube-proxy's flag: `primary`
    /// (the default: the node's underlay address), or comma-separated
    /// CIDRs selecting this node's addresses (`0.0.0.0/0` means all
    /// local addresses). Never on loopback.
    #[arg(long, value_delimiter = ',', default_value = "primary", value_parser = nodeport_cidr)]
    nodeport_addresses: Vec<Option<ipnet::IpNet>>,
    /// Do not enforce NetworkPolicy.
    #[arg(long)]
    no_policy: bool,
    /// Also cut established connections that a NetworkPolicy change no
    /// longer allows (conntrack entries removed in the same sync).
    #[arg(long, env = "PODNET_POLICY_STRICT")]
    policy_strict: bool,
    /// Answer ARP and Neighbor Discovery on the underlay for this node's
    /// share of the LoadBalancer IPs (MetalLB's L2 mode); nodes watch
    /// each other with BFD, so a dead node's share moves within a second.
    #[arg(long, env = "PODNET_L2_ANNOUNCE")]
    l2_announce: bool,
    /// Keep no flow log (`podnet flows`, `/flows`).
    #[arg(long)]
    no_flows: bool,
    /// Records the flow log holds (the newest; a reader is told how
    /// many it missed).
    #[arg(long, default_value_t = 4096)]
    flow_buffer: usize,
    #[command(flatten)]
    kube: cmd::KubeArgs,
}

#[derive(Subcommand)]
enum BgpCmd {
    /// Each BGP neighbour: its AS, session state, uptime, prefixes
    /// received and sent, BFD state and last error (`calicoctl node
    /// status`, `birdc show protocols`).
    Status {
        /// The agent's metrics address.
        #[arg(long, default_value = "127.0.0.1:10249")]
        agent: String,
        /// Every node of this lab instead.
        #[arg(long)]
        lab: Option<String>,
        /// table or json.
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
    },
}

#[derive(Subcommand)]
enum PolicyCmd {
    /// Whether a new connection SRC -> DST:PORT[/proto] is allowed, which
    /// policies isolate each end and which rules allowed it (from the
    /// objects, by the API's semantics); with --lab, also what each node's
    /// kernel table does with it.
    Explain {
        /// A pod (NAMESPACE/POD) or an address.
        src: String,
        /// A pod or an address, with the port: NS/POD:80/tcp, 10.244.1.5:53/udp.
        dst: String,
        /// Read the objects of this lab and trace its nodes' tables.
        #[arg(long)]
        lab: Option<String>,
        #[command(flatten)]
        kube: cmd::KubeArgs,
    },
}

/// `podnet lab up`'s flags.
#[derive(clap::Args)]
pub struct LabUpArgs {
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    #[arg(long, default_value = "vxlan")]
    pub backend: String,
    /// Agents' resync period in seconds.
    #[arg(long, default_value_t = 5)]
    pub resync: u64,
    /// Run a real etcd, kube-apiserver and kube-controller-manager (from
    /// scripts/k8s-peers.sh) instead of the store's controller.
    #[arg(long)]
    pub kube: bool,
    /// With --kube: start no agents and no DNS server (the control plane,
    /// Nodes and Pods only; the lab writes each node's CNI files).
    #[arg(long, requires = "kube")]
    pub no_agents: bool,
    /// Real nodes: each node runs its own containerd and kubelet
    /// (scripts/node-peers.sh, scripts/k8s-peers.sh kubelet
    /// kube-scheduler) and a kube-scheduler runs. The lab starts
    /// nothing of podnet: install it with `kubectl apply -f
    /// deploy/podnet.yaml` (scripts/e2e.sh does). Implies --kube.
    #[arg(long, conflicts_with = "no_agents")]
    pub kubelet: bool,
    /// With --kubelet: an image archive (OCI or docker) every node's
    /// containerd imports before its kubelet starts; repeatable.
    #[arg(long = "image", requires = "kubelet")]
    pub images: Vec<std::path::PathBuf>,
    /// A top-of-rack router on the underlay (bird, frr or gobgp),
    /// peering over eBGP (AS 64513) with every node; its namespace
    /// pn-<lab>-tor is a client outside the cluster.
    #[arg(long)]
    pub router: Option<String>,
    /// Underlay subnets (1 or 2): with 2, nodes alternate between
    /// 192.168.200.0/24 and 192.168.201.0/24, joined by the router
    /// (pn-<lab>-tor), and vxlan runs cross-subnet (DirectRouting).
    #[arg(long, default_value_t = 1)]
    pub racks: usize,
    /// Agents announce LoadBalancer IPs on the underlay (ARP/NDP,
    /// `podnet agent --l2-announce`).
    #[arg(long)]
    l2_announce: bool,
    /// Encrypt pod traffic between nodes (WireGuard's protocol over
    /// UDP 51820; `"Encrypt": true` in the network config).
    #[arg(long)]
    pub encrypt: bool,
    /// Dual-stack pods: an IPv6 address from fd00:10:244::/56 beside
    /// the IPv4 one (`EnableIPv6` in the network config).
    #[arg(long)]
    pub dual_stack: bool,
}

#[derive(Subcommand)]
pub enum LabCmd {
    /// Start the controller and N nodes, each running a real agent.
    Up(LabUpArgs),
    /// Create a pod NS/POD through the real CNI plugins and register it.
    Run {
        pod: String,
        #[arg(long)]
        node: Option<String>,
        /// Labels, e.g. app=web,tier=front.
        #[arg(long)]
        labels: Option<String>,
        /// An annotation KEY=VALUE (repeatable), e.g.
        /// k8s.v1.cni.cncf.io/networks=macvlan-lan to attach an extra
        /// network (a NetworkAttachmentDefinition of the pod's namespace).
        #[arg(long = "annotation")]
        annotations: Vec<String>,
        /// Ports `podnet serve` answers on, e.g. 80/tcp,81/udp; a port may
        /// be named as a container port: serve-80-tcp=80/tcp,serve-81-udp=81/udp.
        /// Unnamed ports are named tcp-80, udp-81 in the Pod.
        #[arg(long, default_value = "80/tcp")]
        ports: String,
    },
    /// Run a command inside a pod's network namespace.
    Exec {
        pod: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        cmd: Vec<String>,
    },
    /// Connect from a pod to HOST:PORT[/tcp|/udp]; print who answered.
    Probe {
        pod: String,
        target: String,
        /// What to ask: hostname (default) or clientip.
        #[arg(long, default_value = "hostname")]
        ask: String,
    },
    /// Delete a pod.
    Rm { pod: String },
    /// Add a node to the running lab.
    AddNode,
    /// Remove a node (its agent cleans up and gives its subnet back).
    RemoveNode { node: String },
    /// Kill a node's agent (SIGKILL) and start it again.
    RestartAgent { node: String },
    /// Kill the API server of a --kube lab (SIGKILL) and start it again;
    /// returns once it is ready.
    RestartApiserver,
    /// Stop a node's agent (its data plane stays); `--cleanup` then removes
    /// everything it installed. `restart-agent` starts it again.
    StopAgent {
        node: String,
        #[arg(long)]
        cleanup: bool,
    },
    /// Print the admin kubeconfig path of a --kube lab (for kubectl).
    Kubeconfig,
    /// Remove every namespace, link, file and process the lab made.
    Down,
    /// (internal) Forward ADDR (or LISTEN=TARGET) connections from inside
    /// NETNS to this namespace.
    #[command(hide = true)]
    Forward { netns: String, addrs: Vec<String> },
    /// (internal) The apiserver's egress proxy: HTTP CONNECT on SOCKET,
    /// dialing from NETNS to addresses in NETS only.
    #[command(hide = true)]
    Egress {
        netns: String,
        socket: std::path::PathBuf,
        nets: Vec<ipnet::IpNet>,
    },
}

#[derive(Subcommand)]
enum CniCmd {
    /// Fill DIR with the plugin executables (links to this binary).
    Install {
        /// Target directory, e.g. /opt/cni/bin.
        dir: std::path::PathBuf,
    },
    /// Run plugin NAME as if called by a runtime (reads CNI_* env and stdin).
    Run {
        /// Plugin type: podnet, bridge, host-local, static, loopback, portmap
        /// or bandwidth.
        name: String,
    },
}

fn block_on<F: std::future::Future<Output = anyhow::Result<()>>>(f: F) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(f)
}

fn init_logs(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PODNET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colour only on a terminal: a container's log (the kubelet's file,
    // `kubectl logs`) is plain text.
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .try_init();
}

/// One `--nodeport-addresses` item: a CIDR, or `primary` (None).
fn nodeport_cidr(s: &str) -> Result<Option<ipnet::IpNet>, String> {
    match s.trim() {
        "primary" => Ok(None),
        c => c
            .parse()
            .map(Some)
            .map_err(|_| format!("{c:?} is neither `primary` nor a CIDR")),
    }
}

/// kube-proxy's conntrack flags, for `agent` and `node-setup`.
#[derive(clap::Args, Debug, Clone)]
struct CtTimeouts {
    /// How long conntrack keeps a TCP connection in CLOSE_WAIT (its NAT
    /// with it), as kube-proxy's flag: a duration such as `1h0m0s`; `0`
    /// leaves the kernel's (60 s).
    #[arg(long, default_value = "1h", value_parser = ct_seconds)]
    conntrack_tcp_timeout_close_wait: CtSecs,
    /// How long conntrack keeps an idle established TCP connection, as
    /// kube-proxy's flag; `0` leaves the kernel's (5 days).
    #[arg(long, default_value = "24h", value_parser = ct_seconds)]
    conntrack_tcp_timeout_established: CtSecs,
}

impl CtTimeouts {
    fn timeouts(&self) -> podnet_proxy::ct_timeouts::Timeouts {
        podnet_proxy::ct_timeouts::Timeouts {
            close_wait: self.conntrack_tcp_timeout_close_wait.0,
            established: self.conntrack_tcp_timeout_established.0,
        }
    }
}

/// A conntrack timeout in whole seconds; None: leave the kernel's.
#[derive(Clone, Copy, Debug)]
struct CtSecs(Option<u32>);

/// A Go-style duration (`1h0m0s`, `90m`, `3600s`); `0` leaves the kernel's.
fn ct_seconds(s: &str) -> Result<CtSecs, String> {
    let d: podnet_api::k8s_openapi::jiff::SignedDuration = match s.trim() {
        "0" => return Ok(CtSecs(None)),
        t => t
            .parse()
            .map_err(|e| format!("{t:?} is not a duration such as 1h0m0s: {e}"))?,
    };
    match d.as_secs() {
        0 => Ok(CtSecs(None)),
        n if n > 0 && n <= i64::from(u32::MAX) => Ok(CtSecs(Some(n as u32))),
        _ => Err(format!("{s:?}: want a positive duration up to 136 years")),
    }
}

/// `--healthz-addr`: an address (`:10256` for all interfaces), or `off`.
#[derive(Clone, Debug)]
struct HealthzAddr(Option<std::net::SocketAddr>);

fn healthz_addr(s: &str) -> Result<HealthzAddr, String> {
    match s.trim() {
        "off" => Ok(HealthzAddr(None)),
        a => podnet_daemon::listen_addr(a).map(|a| HealthzAddr(Some(a))),
    }
}

fn main() {
    run_as_plugin_if_called();
    let cli = Cli::parse();
    podnet_daemon::set_watch_timeout(cli.watch_timeout);
    let daemon = matches!(
        cli.command,
        Cmd::Controller { .. } | Cmd::Agent { .. } | Cmd::Dns(_) | Cmd::Gateway(_)
    );
    init_logs(if daemon { "info" } else { "warn" });
    if let Err(e) = run(cli.command, &cli.store) {
        eprintln!("podnet: {e:#}");
        std::process::exit(1);
    }
}

/// Multi-call: called by a plugin's name (or as the meta-plugin), run that
/// plugin and exit; otherwise return, to parse subcommands.
fn run_as_plugin_if_called() {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let called_as = std::path::Path::new(&argv0)
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Multi-call: as a plugin, stdout belongs to the CNI protocol alone.
    // (`podnet` itself is also the meta-plugin: a runtime calls it with
    // CNI_COMMAND set and no arguments.)
    let as_plugin = called_as != "podnet"
        || (std::env::var_os("CNI_COMMAND").is_some() && std::env::args().len() == 1);
    if as_plugin && podnet_cni::plugins::by_name(&called_as).is_some() {
        // A plugin lives for milliseconds: skip the filter parser unless asked.
        if std::env::var_os("PODNET_LOG").is_some() {
            init_logs("warn");
        } else {
            let _ = tracing::subscriber::set_global_default(plugin_log::Stderr);
        }
        std::process::exit(podnet_cni::run_plugin(&called_as).unwrap_or(1));
    }
}

/// One function per command; `store` is the global --store.
fn run(command: Cmd, store: &str) -> anyhow::Result<()> {
    match command {
        Cmd::Cni { command } => cni(command),
        Cmd::NodeSetup {
            cni_bin_dir,
            cni_conf_dir,
            subnet_file,
            cni_data_dir,
            ct,
        } => cmd::node_setup(
            &cni_bin_dir,
            &cni_conf_dir,
            &subnet_file,
            cni_data_dir.as_deref(),
            &ct.timeouts(),
        ),
        Cmd::Demo { keep, down } => cmd::demo(keep, down),
        Cmd::Kubectl(verb) => block_on(kubectl(verb, store)),
        Cmd::Agent(args) => agent(args, store),
        Cmd::Serve {
            name,
            namespace,
            ports,
        } => cmd::serve(&namespace, &name, &ports),
        Cmd::Trace {
            src,
            dst,
            at,
            output,
            gateway,
        } => block_on(trace::run(
            &at.target(store),
            (&src, &dst),
            &output,
            &gateway.config()?,
        )),
        Cmd::Flows(a) => trace::flows(a),
        Cmd::Ui { at, listen } => block_on(ui::run(&at.target(store), &listen)),
        Cmd::Bgp {
            command: BgpCmd::Status { agent, lab, output },
        } => bgp::status(&agent, lab.as_deref(), &output),
        Cmd::Policy {
            command:
                PolicyCmd::Explain {
                    src,
                    dst,
                    lab,
                    kube,
                },
        } => block_on(policy::explain(store, &kube, lab.as_deref(), &src, &dst)),
        Cmd::Lab { name, command } => block_on(cmd::lab(&name, command, store)),
        Cmd::Controller {
            metrics_addr,
            resync,
            kube,
            lease_namespace,
            id,
        } => match kube.enabled() {
            true => block_on(cmd::lb_controller(
                &kube,
                &metrics_addr,
                &lease_namespace,
                id,
            )),
            false => block_on(cmd::controller(store, &metrics_addr, resync)),
        },
        Cmd::Dns(args) => block_on(dns::run(store, args)),
        Cmd::Gateway(args) => block_on(gateway::run(store, args)),
    }
}

fn cni(command: CniCmd) -> anyhow::Result<()> {
    match command {
        CniCmd::Install { dir } => cmd::cni_install(&dir),
        CniCmd::Run { name } => match podnet_cni::run_plugin(&name) {
            Some(code) => std::process::exit(code),
            None => Err(anyhow::anyhow!(
                "unknown plugin {name:?}; known: {:?}",
                podnet_cni::plugins::NAMES
            )),
        },
    }
}

async fn kubectl(verb: KubectlCmd, store: &str) -> anyhow::Result<()> {
    let objs = cmd::objects(store).await?;
    match verb {
        KubectlCmd::Apply { files } => kubectl::apply(&objs, &files).await,
        KubectlCmd::Get {
            kind,
            name,
            namespace,
            all_namespaces,
            output,
            selector,
        } => {
            kubectl::get(
                &objs,
                &kind,
                name,
                namespace,
                all_namespaces,
                output,
                selector,
            )
            .await
        }
        KubectlCmd::Delete {
            files,
            kind,
            names,
            namespace,
            ignore_not_found,
        } => kubectl::delete(&objs, &files, kind, names, namespace, ignore_not_found).await,
    }
}

fn agent(args: AgentArgs, store: &str) -> anyhow::Result<()> {
    let AgentArgs {
        node,
        iface,
        subnet_file,
        cni_conf_dir,
        cni_data_dir,
        lease_ttl,
        resync,
        mtu,
        metrics_addr,
        cleanup,
        no_proxy,
        healthz_addr,
        ct,
        nodeport_addresses,
        no_policy,
        policy_strict,
        l2_announce,
        no_flows,
        flow_buffer,
        kube,
    } = args;
    let opts = podnet_agent::Options {
        node,
        iface,
        subnet_file,
        cni_conf_dir,
        cni_data_dir,
        lease_ttl,
        resync: std::time::Duration::from_secs(resync.max(1)),
        mtu,
        proxy: !no_proxy,
        nodeport_addresses: nodeport_addresses.into_iter().flatten().collect(),
        healthz_addr: healthz_addr.0,
        ct_timeouts: ct.timeouts(),
        policy: !no_policy,
        policy_strict,
        l2_announce,
        bgp_status: Default::default(),
        flows: (!no_flows).then(|| {
            std::sync::Arc::new(std::sync::Mutex::new(podnet_trace::flows::FlowLog::new(
                flow_buffer,
            )))
        }),
        // Set by the mode (cmd::agent): it writes the pods' status.
        networks: None,
    };
    block_on(cmd::agent(store, &kube, opts, &metrics_addr, cleanup))
}
