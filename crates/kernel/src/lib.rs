//! podnet's kernel edge: links, addresses, routes, neighbours, FDB entries and
//! network namespaces, spoken over rtnetlink directly; the conntrack table
//! and nflog groups over nfnetlink.
//!
//! Layout:
//! - [`nl`]: the netlink wire format and a blocking socket;
//! - [`rtnl`]: typed operations ([`Handle`]) on links, addresses and routes;
//! - [`neigh`]: neighbour (ARP/NDP) and bridge FDB entries;
//! - [`tun`]: TUN devices, for the userspace UDP backend;
//! - [`conntrack`]: listing and deleting connection-tracking entries;
//! - [`nflog`]: reading the packets of an nftables `log group`, and the
//!   flow (addresses, protocol, ports) they carry;
//! - [`nftrace`]: nftables trace events, every rule a marked packet met;
//! - [`netns`]: entering, creating and removing network namespaces;
//! - [`dropwatch`]: the kernel's drop reasons (`skb:kfree_skb`) of the
//!   packets one thread sends, through a private tracefs instance;
//! - [`detach`]: link deletion that leaves the kernel's reclamation wait
//!   (an RCU barrier, 10-30 ms) to a helper process.
//!
//! Every error names the operation and the object it was applied to, so a
//! failure deep in a CNI ADD reads as "creating veth vethab12 (peer eth0): File
//! exists" rather than "EEXIST".

pub mod conntrack;
pub mod detach;
pub mod dropwatch;
pub mod neigh;
pub mod netns;
pub mod nflog;
pub mod nftrace;
pub mod nl;
pub mod rtnl;
pub mod tun;

pub use neigh::Neigh;
pub use netns::Netns;
pub use rtnl::{
    Addr, Handle, Link, LinkKind, MacvlanMode, MacvlanSpec, Route, RouteLookup, VxlanOpts,
};

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("{op}: {source}{}", detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Netlink {
        op: String,
        #[source]
        source: io::Error,
        detail: Option<String>,
    },
    #[error("{op}: {source}")]
    Io {
        op: String,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Other(String),
}

impl KernelError {
    pub fn io(op: impl Into<String>, source: io::Error) -> Self {
        KernelError::Io {
            op: op.into(),
            source,
        }
    }

    /// The errno behind the failure, when there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            KernelError::Netlink { source, .. } | KernelError::Io { source, .. } => {
                source.raw_os_error()
            }
            KernelError::Other(_) => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(
            self.errno(),
            Some(libc::ENODEV) | Some(libc::ENOENT) | Some(libc::ESRCH) | Some(libc::EADDRNOTAVAIL)
        )
    }

    pub fn is_exists(&self) -> bool {
        self.errno() == Some(libc::EEXIST)
    }
}
