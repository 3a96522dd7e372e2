//! A node agent's view of the cluster, built by the binary for its mode
//! and handed to the agent whole: the object source, the node's subnet
//! claim and the network config. The agent never opens the store or the
//! API itself, so only this crate reads the store (a wall the build
//! checks: podnet/tests/walls.rs).

use std::sync::Arc;

use podnet_api::netconfig::Resolved;
use podnet_api::Kind;
use podnet_daemon::Metrics;
use podnet_store::AnyStore;

use crate::subnets::{leases, leases::Leases, podcidr, podcidr::PodCidr, Subnets};
use crate::{Source, SourceError};

/// What a node agent learns cluster state from.
pub struct NodeView {
    /// The one object source; the agent subscribes its subsystems to it
    /// and starts it.
    pub source: Source,
    /// The node's subnet claim and every node's subnet.
    pub subnets: Subnets,
    /// The cluster's network (pod CIDR, subnet size, backend, Service CIDR).
    pub config: Resolved,
}

impl NodeView {
    /// Standalone: objects, subnet leases and the network config from the
    /// podnet store.
    pub async fn store(
        store: AnyStore,
        node: &str,
        lease_ttl: i64,
        metrics: &Arc<Metrics>,
    ) -> Result<NodeView, SourceError> {
        let config = crate::store::network_config(&store)
            .await?
            .unwrap_or_default()
            .resolve()
            .map_err(|(f, m)| SourceError::Other(format!("network config {f}: {m}")))?;
        Ok(NodeView {
            source: Source::store(store.clone(), metrics.store_watch("agent")),
            subnets: Subnets::Leases(Leases::new(
                store,
                config.clone(),
                node,
                lease_ttl,
                metrics.store_watch("overlay"),
            )),
            config,
        })
    }

    /// Kubernetes: objects from the API, the subnet from
    /// `Node.spec.podCIDRs`, the network config as given (flannel's
    /// net-conf.json).
    pub fn kube(
        client: ::kube::Client,
        config: Resolved,
        node: &str,
        metrics: &Arc<Metrics>,
    ) -> NodeView {
        let mut source = Source::kube(client.clone(), metrics.store_watch("agent"));
        let nodes = source.subscribe(&[Kind::Node]);
        NodeView {
            source,
            subnets: Subnets::PodCidr(PodCidr::new(client, config.clone(), node, nodes)),
            config,
        }
    }
}

/// Where a node's subnet claim lives, for `agent --cleanup` to give it
/// back.
pub enum Claim {
    /// A lease in the podnet store.
    Store(AnyStore),
    /// Node annotations (the podCIDR stays with kube-controller-manager).
    Kube(::kube::Client),
}

impl Claim {
    /// Gives the node's claim back; what was done, a line each.
    pub async fn release(&self, node: &str) -> Result<Vec<String>, SourceError> {
        match self {
            Claim::Store(store) => Ok(leases::release(store, node)
                .await?
                .into_iter()
                .map(|s| format!("released subnet {s}"))
                .collect()),
            Claim::Kube(client) => {
                podcidr::release(client, node).await?;
                Ok(vec![format!(
                    "removed node {node}'s podnet.io/ annotations (its podCIDR stays with kube-controller-manager)"
                )])
            }
        }
    }
}
