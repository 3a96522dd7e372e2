//! How tests see the lab's network: asking a target from inside a pod
//! (`lab probe`, [`Lab::reach`]), and what reached the underlay gateway
//! because nothing on a node handled it.

use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use podnet_kernel::Netns;

use crate::error::{io, msg, LabError};
use crate::gateway;
use crate::serve::{self, Reach};
use crate::state::Lab;

impl Lab {
    /// Asks `target` from inside a pod; returns who answered.
    pub fn probe(
        &self,
        ns: &str,
        pod: &str,
        target: &str,
        request: &str,
    ) -> Result<String, LabError> {
        let p = self.pod(ns, pod)?;
        let (hostport, proto) = match target.rsplit_once('/') {
            Some((h, pr)) if pr.eq_ignore_ascii_case("tcp") || pr.eq_ignore_ascii_case("udp") => {
                (h, pr.to_ascii_lowercase())
            }
            _ => (target, "tcp".to_string()),
        };
        let (host, port) = hostport
            .rsplit_once(':')
            .ok_or_else(|| msg(format!("{target:?}: want HOST:PORT[/tcp|/udp]")))?;
        let port: u16 = port
            .parse()
            .map_err(|_| msg(format!("{target:?}: bad port")))?;
        let ns_handle = Netns::named(&p.netns)?;
        let ip: IpAddr = match host.trim_matches(['[', ']']).parse() {
            Ok(ip) => ip,
            // A name: the pod's own resolver (its resolv.conf, which
            // `ip netns exec` bind-mounts: cluster DNS, search path, ndots).
            Err(_) => resolve_in_pod(&p.netns, host)?,
        };
        let addr = SocketAddr::new(ip, port);
        ns_handle
            .run(|| serve::ask(addr, proto == "udp", request, Duration::from_secs(3)))?
            .map_err(|e| io(format!("{proto} {addr} from {ns}/{pod}"), e))
    }

    /// Asks `target` from inside pod `ns/pod` who answers ([`serve::WHOAMI`]),
    /// and says what happened by cause ([`Reach`]): a UDP probe uses a
    /// connected socket, so a reject (ICMP port-unreachable) shows as
    /// [`Reach::Refused`] and a drop as [`Reach::TimedOut`]. It enters the
    /// pod's namespace on the calling thread only (and leaves it again), so
    /// many probes can run at once, one per thread.
    pub fn reach(
        &self,
        ns: &str,
        pod: &str,
        target: SocketAddr,
        udp: bool,
        timeout: Duration,
    ) -> Reach {
        let p = match self.pod(ns, pod) {
            Ok(p) => p,
            Err(e) => return Reach::Other(e.to_string()),
        };
        Netns::named(&p.netns)
            .and_then(|n| n.run(|| serve::reach(target, udp, timeout)))
            .unwrap_or_else(|e| Reach::Other(format!("entering {}: {e}", p.netns)))
    }

    /// What reached the underlay gateway since the lab came up: packets
    /// that left a node because nothing on the node handled them (see
    /// [`gateway`]). An unchanged count after some traffic means it was
    /// handled, or dropped, on the node.
    pub fn gateway_leaks(&self) -> Result<gateway::Leaks, LabError> {
        self.state()?;
        gateway::leaks(&Netns::named(&self.gateway_ns())?)
    }
}

/// Resolves `host` as a process in the pod would (glibc through the pod's
/// resolv.conf), via `ip netns exec NETNS getent ahosts HOST`.
fn resolve_in_pod(netns: &str, host: &str) -> Result<IpAddr, LabError> {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, "getent", "ahosts", host])
        .output()
        .map_err(|e| io(format!("resolving {host} in {netns}"), e))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| msg(format!("{host}: no address from the pod's resolver")))
}
