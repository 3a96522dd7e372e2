//! The real CoreDNS as a peer: where `scripts/coredns.sh` cached it, and the
//! kubeadm default Corefile moved to loopback ports. Shared by
//! `coredns-bench` and the differential test (`podnet/tests/coredns_diff.rs`),
//! which must run CoreDNS the same way for their answers to mean the same.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::kube::KubeError;

/// The script that builds and caches CoreDNS.
pub const SCRIPT: &str = "scripts/coredns.sh";

/// The CoreDNS binary: `$COREDNS` if set, else what [`SCRIPT`] has cached
/// (run with `GOPROXY=off`, so a cold cache is an error naming the script,
/// never a build behind the caller's back).
pub fn find() -> Result<PathBuf, KubeError> {
    if let Some(p) = std::env::var_os("COREDNS") {
        return Ok(PathBuf::from(p));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(SCRIPT);
    let out = Command::new("bash")
        .arg(&script)
        .env("GOPROXY", "off")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| KubeError::Io(format!("running {}", script.display()), e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.lines().find_map(|l| l.strip_prefix("COREDNS=")) {
        Some(p) if out.status.success() => Ok(PathBuf::from(p)),
        _ => Err(KubeError::Peers(format!(
            "CoreDNS is not built; run `bash {}` (it builds and caches it): {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// Where a CoreDNS instance listens and what it reads.
pub struct Corefile<'a> {
    /// DNS, UDP and TCP, on 127.0.0.1.
    pub port: u16,
    pub health: u16,
    pub ready: u16,
    pub prometheus: u16,
    /// The cluster domain, e.g. `cluster.local`.
    pub zone: &'a str,
    /// A kubeconfig whose context `context` reaches the API server.
    pub kubeconfig: &'a Path,
    pub context: &'a str,
    /// Where `forward` sends everything else.
    pub upstream: SocketAddr,
}

impl Corefile<'_> {
    /// The default kubeadm Corefile (errors, health with lameduck, ready,
    /// kubernetes with `pods insecure`, `fallthrough in-addr.arpa
    /// ip6.arpa` and `ttl 30`, prometheus, forward with `max_concurrent
    /// 1000`, cache 30, loop, reload, loadbalance); only its ports are moved
    /// to loopback ones, `bind 127.0.0.1` added, the kubeconfig named and
    /// `forward` pointed at `upstream`.
    pub fn text(&self) -> String {
        format!(
            ".:{port} {{
    bind 127.0.0.1
    errors
    health 127.0.0.1:{health} {{
       lameduck 5s
    }}
    ready 127.0.0.1:{ready}
    kubernetes {zone} in-addr.arpa ip6.arpa {{
       kubeconfig {kc} {ctx}
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }}
    prometheus 127.0.0.1:{prom}
    forward . {up} {{
       max_concurrent 1000
    }}
    cache 30
    loop
    reload
    loadbalance
}}
",
            port = self.port,
            health = self.health,
            ready = self.ready,
            zone = self.zone,
            kc = self.kubeconfig.display(),
            ctx = self.context,
            prom = self.prometheus,
            up = self.upstream,
        )
    }
}
