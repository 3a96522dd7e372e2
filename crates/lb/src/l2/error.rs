//! What can stop L2 announcement on an interface. Every error names the
//! interface and the step that failed, so "needs CAP_NET_RAW" or "no such
//! interface eth1" reaches the agent's log as such.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum L2Error {
    #[error("L2 announcement on {iface}: {op}: {source}")]
    Socket {
        iface: String,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("L2 announcement on {iface}: looking up the interface: {source}")]
    Lookup {
        iface: String,
        #[source]
        source: podnet_kernel::KernelError,
    },
    #[error("L2 announcement on {iface}: no such interface")]
    NoSuchInterface { iface: String },
    #[error(
        "L2 announcement on {iface}: the interface has no Ethernet address (not an Ethernet link?)"
    )]
    NotEthernet { iface: String },
    #[error("L2 announcement on {iface}: no tokio runtime with I/O enabled: start the responder from inside one")]
    NoRuntime { iface: String },
}
