//! The `podnet` binary. It is also every CNI plugin: called as `bridge`,
//! `host-local`, `loopback`, `portmap`, `bandwidth` or `podnet` (through the
//! links `podnet cni install` makes), it speaks the CNI protocol; called as
//! `podnet`, it parses subcommands. This file only parses arguments and calls
//! one function per command.

mod cmd;
mod kubectl;

use clap::{Parser, Subcommand};

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
    /// Create or update objects from YAML/JSON manifests (like kubectl apply).
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
    /// Allocate ClusterIPs/NodePorts and maintain EndpointSlices.
    Controller {
        /// Address for /metrics, /healthz and /readyz.
        #[arg(long, default_value = "127.0.0.1:10257")]
        metrics_addr: String,
        /// Full resync period, in seconds.
        #[arg(long, default_value_t = 60)]
        resync: u64,
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
        /// Plugin type: podnet, bridge, host-local, loopback, portmap or bandwidth.
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
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn main() {
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
        init_logs("warn");
        std::process::exit(podnet_cni::run_plugin(&called_as).unwrap_or(1));
    }
    let cli = Cli::parse();
    init_logs(if matches!(cli.command, Cmd::Controller { .. }) {
        "info"
    } else {
        "warn"
    });
    let res = match cli.command {
        Cmd::Cni {
            command: CniCmd::Install { dir },
        } => cmd::cni_install(&dir),
        Cmd::Cni {
            command: CniCmd::Run { name },
        } => match podnet_cni::run_plugin(&name) {
            Some(code) => std::process::exit(code),
            None => Err(anyhow::anyhow!(
                "unknown plugin {name:?}; known: {:?}",
                podnet_cni::plugins::NAMES
            )),
        },
        Cmd::Demo { keep, down } => cmd::demo(keep, down),
        Cmd::Apply { files } => block_on(async {
            let objs = cmd::objects(&cli.store).await?;
            kubectl::apply(&objs, &files).await
        }),
        Cmd::Get {
            kind,
            name,
            namespace,
            all_namespaces,
            output,
            selector,
        } => block_on(async {
            let objs = cmd::objects(&cli.store).await?;
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
        }),
        Cmd::Delete {
            files,
            kind,
            names,
            namespace,
            ignore_not_found,
        } => block_on(async {
            let objs = cmd::objects(&cli.store).await?;
            kubectl::delete(&objs, &files, kind, names, namespace, ignore_not_found).await
        }),
        Cmd::Controller {
            metrics_addr,
            resync,
        } => block_on(cmd::controller(&cli.store, &metrics_addr, resync)),
    };
    if let Err(e) = res {
        eprintln!("podnet: {e:#}");
        std::process::exit(1);
    }
}
