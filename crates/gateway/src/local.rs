//! The Gateways' own addresses on this node: each address the pool gave
//! a Gateway is put on the loopback link (a /32 or /128), so the node
//! answers ARP and NDP for it on its links and the Gateway's listeners
//! can bind it; a pool address no Gateway holds any more is taken off.
//! Only addresses inside the pool are ever touched, so anything else on
//! `lo` is left alone, and one that someone removed comes back on the
//! next sync. Needs CAP_NET_ADMIN.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use podnet_kernel::{Handle, KernelError};

use crate::model::addresses::Pool;

/// What a sync changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changed {
    pub added: Vec<IpAddr>,
    pub removed: Vec<IpAddr>,
}

/// Makes the pool's addresses on `lo` exactly `want`.
pub fn sync(pool: &Pool, want: &BTreeSet<IpAddr>) -> Result<Changed, KernelError> {
    let mut h = Handle::new()?;
    let lo = h
        .link("lo")?
        .ok_or_else(|| KernelError::Other("no loopback link".into()))?
        .index;
    let have: BTreeSet<IpAddr> = h
        .addrs(lo)?
        .into_iter()
        .filter(|a| a.net.prefix_len() == a.net.max_prefix_len() && pool.contains(a.net.addr()))
        .map(|a| a.net.addr())
        .collect();
    let mut out = Changed::default();
    for ip in want.difference(&have) {
        h.add_addr(lo, IpNet::from(*ip), true)?;
        out.added.push(*ip);
    }
    for ip in have.difference(want) {
        h.del_addr(lo, IpNet::from(*ip))?;
        out.removed.push(*ip);
    }
    Ok(out)
}
