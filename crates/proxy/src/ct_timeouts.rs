//! The conntrack timeouts a Service proxy sets on its node, as kube-proxy
//! does (its `conntrack` settings, the same defaults): TCP connections in
//! CLOSE_WAIT keep their entry for an hour instead of the kernel's 60 s,
//! established ones for a day instead of five.
//!
//! A Service connection lives on its conntrack entry: the entry holds the
//! NAT. When a server closes its side and the client keeps the connection
//! half open (it still sends, or lingers before closing), the kernel's
//! 60 s CLOSE_WAIT timeout drops the entry, and the client's next packet
//! to the ClusterIP leaves un-NATed and is dropped or reset. Upstream's
//! e2e checks the hour ("KubeProxy should set TCP CLOSE_WAIT timeout").
//!
//! The settings are per network namespace (`/proc/sys/net/netfilter`
//! follows the writer's namespace), so a lab node changes its own, never
//! the machine's. Where `/proc/sys` is read-only (the agent's container),
//! the DaemonSet's privileged init container (`podnet node-setup`) sets
//! them and the agent finds nothing to do.
//!
//! [`plan`] is pure; [`apply`] reads and writes the calling thread's
//! namespace.

use podnet_kernel::netns::{read_sysctl, write_sysctl};

pub const CLOSE_WAIT: &str = "net.netfilter.nf_conntrack_tcp_timeout_close_wait";
pub const ESTABLISHED: &str = "net.netfilter.nf_conntrack_tcp_timeout_established";

/// Seconds per setting; None leaves the kernel's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub close_wait: Option<u32>,
    pub established: Option<u32>,
}

impl Default for Timeouts {
    /// kube-proxy's defaults: 1h and 24h.
    fn default() -> Self {
        Timeouts {
            close_wait: Some(3600),
            established: Some(86400),
        }
    }
}

/// The writes that bring the settings to `want`, given what `current`
/// reads (None: the setting is absent, conntrack not loaded).
pub fn plan(
    want: &Timeouts,
    current: impl Fn(&str) -> Option<u32>,
) -> Result<Vec<(&'static str, u32)>, String> {
    let mut writes = Vec::new();
    for (key, v) in [
        (CLOSE_WAIT, want.close_wait),
        (ESTABLISHED, want.established),
    ] {
        let Some(v) = v else { continue };
        match current(key) {
            Some(now) if now == v => {}
            Some(_) => writes.push((key, v)),
            None => {
                return Err(format!(
                    "{key} is missing: nf_conntrack is not loaded on this node"
                ))
            }
        }
    }
    Ok(writes)
}

/// Brings the settings of this network namespace to `want`; returns the
/// `key=value` lines written. An error names the setting and why (absent,
/// or `/proc/sys` read-only here).
pub fn apply(want: &Timeouts) -> Result<Vec<String>, String> {
    let writes = plan(want, |k| read_sysctl(k).ok()?.trim().parse().ok())?;
    writes
        .into_iter()
        .map(|(key, v)| {
            write_sysctl(key, &v.to_string())
                .map(|()| format!("{key}={v}"))
                .map_err(|e| e.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_differs_is_written() {
        let kernel = |k: &str| Some(if k == CLOSE_WAIT { 60 } else { 86400 });
        assert_eq!(
            plan(&Timeouts::default(), kernel),
            Ok(vec![(CLOSE_WAIT, 3600)])
        );
        let done = |k: &str| Some(if k == CLOSE_WAIT { 3600 } else { 86400 });
        assert_eq!(plan(&Timeouts::default(), done), Ok(vec![]));
    }

    #[test]
    fn none_leaves_the_kernels_value() {
        let t = Timeouts {
            close_wait: None,
            established: None,
        };
        assert_eq!(plan(&t, |_| None), Ok(vec![]));
    }

    #[test]
    fn a_missing_setting_is_named() {
        let e = plan(&Timeouts::default(), |_| None).unwrap_err();
        assert!(e.contains(CLOSE_WAIT) && e.contains("nf_conntrack"), "{e}");
    }
}
