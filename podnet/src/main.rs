//! The `podnet` binary. It is also every CNI plugin: called as `bridge`,
//! `host-local`, `loopback`, `portmap`, `bandwidth` or `podnet` (through the
//! links `podnet cni install` makes), it speaks the CNI protocol; called as
//! `podnet`, it parses subcommands. This file only parses arguments and calls
//! one function per command.

mod cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "podnet",
    version,
    about = "Kubernetes cluster networking: CNI plugins, node agent, service proxy, DNS"
)]
struct Cli {
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
    init_logs("info");
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
    };
    if let Err(e) = res {
        eprintln!("podnet: {e:#}");
        std::process::exit(1);
    }
}
