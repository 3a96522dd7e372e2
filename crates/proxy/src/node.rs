//! The service proxy as a node agent runs it: what it subscribes to, and
//! everything it sets up around its loop from the node and the cluster's
//! network config (the node's NodePort addresses, kube-proxy's conntrack
//! timeouts, the `/healthz` listener, one [`Stack`] per family), so the
//! agent only wires it to the object source.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use podnet_api::ipfamily;
use podnet_api::netconfig::Resolved;
use podnet_api::Kind;
use podnet_daemon::Metrics;
use podnet_source::Subscription;

use crate::{ct_timeouts, healthz, NodeInfo, ProxyError, Stack};

/// The kinds the proxy subscribes to.
pub const KINDS: &[Kind] = &[Kind::Service, Kind::EndpointSlice, Kind::Node];

/// How long a queued proxy change may wait for its sync before the
/// proxy's `/healthz` fails: kube-proxy's, twice its default sync period.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(60);

/// The proxy's part of a node agent's options.
#[derive(Debug, Clone)]
pub struct NodeProxy {
    pub node: String,
    /// The node's primary address per family (its underlay IP, and its
    /// IPv6 one on a dual-stack node): NodePorts are accepted on these
    /// by default, as kube-proxy's `--nodeport-addresses=primary`.
    pub ips: Vec<IpAddr>,
    /// The node's addresses now, for `nodeport_addresses`.
    pub local_ips: Vec<IpAddr>,
    /// Where NodePorts are accepted (kube-proxy's `--nodeport-addresses`).
    pub nodeport_addresses: Vec<ipnet::IpNet>,
    /// Where the proxy serves its own `/healthz` and `/livez` (kube-proxy's
    /// `--healthz-bind-address`); None: nowhere.
    pub healthz_addr: Option<SocketAddr>,
    /// The conntrack timeouts the proxy keeps on this node.
    pub ct_timeouts: ct_timeouts::Timeouts,
    pub resync: Duration,
}

/// Runs the node's proxy until the subscription ends (or the future is
/// dropped); its rules stay in the kernel.
pub async fn run(
    sub: Subscription,
    opts: NodeProxy,
    cfg: &Resolved,
    metrics: Arc<Metrics>,
) -> Result<(), ProxyError> {
    let node = NodeInfo {
        name: opts.node.clone(),
        zone: None,
        ips: opts.ips.clone(),
        nodeport_ips: nodeport_ips(&opts.nodeport_addresses, &opts.ips, &opts.local_ips),
    };
    tracing::info!(nodeport_addresses = ?node.nodeport_ips, "service proxy");
    match ct_timeouts::apply(&opts.ct_timeouts) {
        Ok(set) if !set.is_empty() => tracing::info!(?set, "conntrack timeouts"),
        Ok(_) => {}
        Err(e) => tracing::warn!("conntrack timeouts not set: {e}"),
    }
    let cidrs = cfg.service_cidrs();
    let stacks = vec![
        Stack::v4(cfg.network).with_service_cidr(cidrs.of_family(ipfamily::IPV4)),
        Stack::v6(cfg.ipv6_network).with_service_cidr(cidrs.of_family(ipfamily::IPV6)),
    ];
    let health = match opts.healthz_addr {
        Some(addr) => serve_healthz(addr, &stacks).await,
        None => None,
    };
    crate::run(
        sub,
        node,
        stacks,
        opts.resync,
        health,
        metrics,
        std::future::pending(),
    )
    .await
}

/// Serves the proxy's `/healthz` on `addr`, if it can be bound (a node
/// that runs kube-proxy too keeps kube-proxy's; the proxy runs without).
async fn serve_healthz(addr: SocketAddr, stacks: &[Stack]) -> Option<Arc<healthz::Health>> {
    let l = match podnet_daemon::bind(&addr.to_string()).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("proxy healthz address {addr}: {e}; serving no proxy /healthz");
            return None;
        }
    };
    let families = stacks
        .iter()
        .map(|s| match s.family {
            podnet_nft::model::Family::Ip6 => "IPv6",
            _ => "IPv4",
        })
        .collect();
    let h = healthz::Health::new(HEALTH_TIMEOUT, families);
    let pages = h.clone();
    tokio::spawn(podnet_daemon::serve_pages(
        l,
        Arc::new(move |p: &str| pages.page(p)),
    ));
    tracing::info!(%addr, "proxy healthz");
    Some(h)
}

/// The addresses NodePorts are accepted on, from `--nodeport-addresses`
/// and the addresses this node has. Loopback never is (kube-proxy refuses
/// localhost NodePorts too). None: every local address but loopback.
pub fn nodeport_ips(
    ranges: &[ipnet::IpNet],
    primaries: &[IpAddr],
    have: &[IpAddr],
) -> Option<Vec<IpAddr>> {
    if ranges.is_empty() {
        return Some(primaries.to_vec());
    }
    if ranges.iter().any(|r| r.prefix_len() == 0) {
        return None;
    }
    let mut v: Vec<IpAddr> = have
        .iter()
        .filter(|ip| !ip.is_loopback() && ranges.iter().any(|r| r.contains(*ip)))
        .copied()
        .collect();
    v.sort();
    v.dedup();
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodeport_addresses_pick_the_nodes_own_addresses_in_range() {
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let have = [ip("127.0.0.1"), ip("192.168.1.5"), ip("10.0.0.5")];
        let primary = [ip("192.168.1.5")];
        assert_eq!(nodeport_ips(&[], &primary, &have), Some(primary.to_vec()));
        // A dual-stack node: its primary address of each family.
        let dual = [ip("192.168.1.5"), ip("fd00::5")];
        assert_eq!(nodeport_ips(&[], &dual, &have), Some(dual.to_vec()));
        let all: ipnet::IpNet = "0.0.0.0/0".parse().unwrap();
        assert_eq!(nodeport_ips(&[all], &primary, &have), None);
        let r: ipnet::IpNet = "10.0.0.0/8".parse().unwrap();
        assert_eq!(
            nodeport_ips(&[r], &primary, &have),
            Some(vec![ip("10.0.0.5")])
        );
        let lo: ipnet::IpNet = "127.0.0.0/8".parse().unwrap();
        assert_eq!(nodeport_ips(&[lo], &primary, &have), Some(vec![]));
    }
}
