//! Subnets from `Node.spec.podCIDRs` (Kubernetes mode), flannel's
//! kube-subnet-mgr conventions with a `podnet.io/` prefix:
//!
//! - kube-controller-manager (`--allocate-node-cidrs`) allocates each
//!   node's podCIDR; the agent never picks one;
//! - the agent publishes how to reach its node as annotations:
//!   `podnet.io/backend-type`, `podnet.io/backend-data` (JSON, e.g. the VTEP
//!   MAC), `podnet.io/public-ip`, and `podnet.io/kube-subnet-manager: true`;
//! - a node is part of the mesh once it has both a podCIDR and those
//!   annotations (a node whose agent has not started yet is skipped);
//! - once the node's network is up the agent sets the `NetworkUnavailable`
//!   condition to False (reason `PodnetIsUp`);
//! - the agent keeps its own Node's annotations as it keeps any state: a
//!   Node whose `podnet.io/` annotations differ from what this agent
//!   publishes (another writer changed them, which would send the other
//!   nodes' traffic for this node elsewhere) gets them put back, retried
//!   as [`crate::retry`] says while the API fails.
//!
//! Nodes come from the object source (one subscription to Nodes); writes
//! go to the API with the same client.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::{IpNet, Ipv4Net};
use kube::api::{Api, Patch, PatchParams};
use podnet_api::k8s_openapi::api::core::v1::Node;
use podnet_api::netconfig::Resolved;
use podnet_api::Object;

use super::{Attrs, Change, SubnetLease, SubnetMap};
use crate::retry::{Failure, Retry};
use crate::{Delta, SourceError, Subscription};

pub const PREFIX: &str = "podnet.io/";
pub const BACKEND_TYPE: &str = "podnet.io/backend-type";
pub const BACKEND_DATA: &str = "podnet.io/backend-data";
pub const PUBLIC_IP: &str = "podnet.io/public-ip";
/// The node's IPv6 underlay address (dual-stack; flannel's `public-ipv6`).
pub const PUBLIC_IPV6: &str = "podnet.io/public-ipv6";
pub const SUBNET_MANAGER: &str = "podnet.io/kube-subnet-manager";
/// The field manager of the agent's writes.
const MANAGER: &str = "podnet-agent";

/// The IPv4 pod subnet the controller manager gave `n`.
pub fn node_subnet(n: &Node) -> Option<Ipv4Net> {
    let spec = n.spec.as_ref()?;
    spec.pod_cidrs
        .iter()
        .flatten()
        .chain(spec.pod_cidr.iter())
        .filter_map(|c| c.parse::<IpNet>().ok())
        .find_map(|c| match c {
            IpNet::V4(v) => Some(v.trunc()),
            IpNet::V6(_) => None,
        })
}

/// The IPv6 pod subnet the controller manager gave `n` (dual-stack).
pub fn node_subnet6(n: &Node) -> Option<ipnet::Ipv6Net> {
    let spec = n.spec.as_ref()?;
    spec.pod_cidrs
        .iter()
        .flatten()
        .filter_map(|c| c.parse::<IpNet>().ok())
        .find_map(|c| match c {
            IpNet::V6(v) => Some(v.trunc()),
            IpNet::V4(_) => None,
        })
}

/// The subnet and published attributes of `n`, if it has both.
pub fn node_lease(n: &Node) -> Option<SubnetLease> {
    let subnet = node_subnet(n)?;
    let ann = n.metadata.annotations.as_ref()?;
    let public_ip: Ipv4Addr = ann.get(PUBLIC_IP)?.parse().ok()?;
    let backend_type = ann.get(BACKEND_TYPE)?.clone();
    let backend_data = ann
        .get(BACKEND_DATA)
        .and_then(|d| serde_json::from_str(d).ok())
        .unwrap_or(serde_json::Value::Null);
    Some(SubnetLease {
        subnet,
        attrs: Attrs {
            public_ip,
            backend_type,
            backend_data,
            node: n.metadata.name.clone().unwrap_or_default(),
            ipv6_subnet: node_subnet6(n),
            public_ipv6: ann.get(PUBLIC_IPV6).and_then(|a| a.parse().ok()),
        },
        mod_rev: 0,
        lease_id: 0,
    })
}

/// The annotations that publish `attrs`.
pub fn annotations(attrs: &Attrs) -> BTreeMap<String, String> {
    [
        (BACKEND_TYPE, attrs.backend_type.clone()),
        (BACKEND_DATA, attrs.backend_data.to_string()),
        (PUBLIC_IP, attrs.public_ip.to_string()),
        (SUBNET_MANAGER, "true".to_string()),
    ]
    .into_iter()
    .chain(attrs.public_ipv6.map(|a| (PUBLIC_IPV6, a.to_string())))
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Takes node `node` out of the mesh (for `podnet agent --cleanup`):
/// removes its `podnet.io/` annotations, so the other nodes drop their
/// routes to it. The podCIDR stays: kube-controller-manager owns it.
pub async fn release(client: &kube::Client, node: &str) -> Result<(), SourceError> {
    let api: Api<Node> = Api::all(client.clone());
    let gone: BTreeMap<&str, Option<String>> =
        [BACKEND_TYPE, BACKEND_DATA, PUBLIC_IP, SUBNET_MANAGER]
            .into_iter()
            .map(|k| (k, None))
            .collect();
    let patch = serde_json::json!({"metadata": {"annotations": gone}});
    api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

pub struct PodCidr {
    client: kube::Client,
    cfg: Resolved,
    node: String,
    nodes: Subscription,
    ready: bool,
    /// Every node with a podCIDR, by name (published or not yet).
    all: BTreeMap<String, Node>,
    mine: Option<Ipv4Net>,
    /// Whether [`PodCidr::next`] gave the map since the last acquire. The
    /// first call gives it at once: a restarted agent whose annotations
    /// are already right makes no Node change to wait for.
    told: bool,
    /// The annotations this agent publishes on its Node (from the last
    /// acquire until a release), kept there.
    published: Option<BTreeMap<String, String>>,
    /// A failed repair's retry state, and when to try again.
    repair: Retry,
    repair_at: Option<tokio::time::Instant>,
}

impl PodCidr {
    /// `nodes` must be a subscription to Nodes from the Kubernetes source.
    pub fn new(client: kube::Client, cfg: Resolved, node: &str, nodes: Subscription) -> Self {
        PodCidr {
            client,
            cfg,
            node: node.to_string(),
            nodes,
            ready: false,
            all: BTreeMap::new(),
            told: false,
            mine: None,
            published: None,
            repair: Retry::default(),
            repair_at: None,
        }
    }

    /// Takes the next batch of Node deltas; false once the source stopped.
    async fn take(&mut self) -> bool {
        let Some(b) = self.nodes.next_batch().await else {
            return false;
        };
        for d in b.deltas {
            match d {
                Delta::Added(o) | Delta::Updated(o) => {
                    if let Object::Node(n) = &*o {
                        self.all.insert(o.name().to_string(), (**n).clone());
                    }
                }
                Delta::Deleted(k) => {
                    self.all.remove(&k.name);
                }
            }
        }
        self.ready |= b.ready;
        true
    }

    fn stopped() -> SourceError {
        SourceError::Other("the object source stopped".into())
    }

    pub(crate) async fn acquire(&mut self, attrs: &Attrs) -> Result<SubnetLease, SourceError> {
        let mut waited = false;
        let subnet = loop {
            if self.ready {
                if let Some(s) = self.all.get(&self.node).and_then(node_subnet) {
                    break s;
                }
                if !waited {
                    tracing::info!(
                        node = %self.node,
                        "waiting for kube-controller-manager to allocate this node's podCIDR \
                         (Node.spec.podCIDRs; run it with --allocate-node-cidrs)"
                    );
                    waited = true;
                }
            }
            if !self.take().await {
                return Err(Self::stopped());
            }
        };
        if !self.cfg.network.contains(&subnet) {
            return Err(SourceError::Other(format!(
                "node {}'s podCIDR {subnet} is outside the network config's Network {} \
                 (kube-controller-manager's --cluster-cidr must match it)",
                self.node, self.cfg.network
            )));
        }
        let want = annotations(attrs);
        self.publish(&want).await?;
        self.published = Some(want);
        self.mine = Some(subnet);
        self.told = false;
        let mut attrs = attrs.clone();
        attrs.ipv6_subnet = self.all.get(&self.node).and_then(node_subnet6);
        Ok(SubnetLease {
            subnet,
            attrs,
            mod_rev: 0,
            lease_id: 0,
        })
    }

    fn map(&self) -> SubnetMap {
        self.all
            .values()
            .filter_map(node_lease)
            .map(|l| (l.subnet, l))
            .collect()
    }

    pub(crate) async fn next(&mut self) -> Result<Change, SourceError> {
        if !self.told && self.mine.is_some() {
            self.told = true;
            return Ok(Change::Nodes(self.map()));
        }
        loop {
            let due = self.repair_at;
            let sleep = async move {
                match due {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                more = self.take() => {
                    if !more {
                        return Err(Self::stopped());
                    }
                    break;
                }
                _ = sleep => self.keep_published().await,
            }
        }
        self.keep_published().await;
        let now = self.all.get(&self.node).and_then(node_subnet);
        if now != self.mine {
            tracing::warn!(node = %self.node, was = ?self.mine, now = ?now, "this node's podCIDR changed");
            self.mine = None;
            return Ok(Change::LostMine);
        }
        Ok(Change::Nodes(self.map()))
    }

    /// Merges `want` into this node's annotations.
    async fn publish(&self, want: &BTreeMap<String, String>) -> Result<(), kube::Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        let patch = serde_json::json!({"metadata": {"annotations": want}});
        api.patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
    }

    /// Puts this node's published annotations back if the Node, as last
    /// seen, has others; a failure is retried at [`PodCidr::repair_at`].
    async fn keep_published(&mut self) {
        let Some(want) = &self.published else {
            return;
        };
        let Some(node) = self.all.get(&self.node) else {
            return;
        };
        let have = node.metadata.annotations.clone().unwrap_or_default();
        let drift = drift(want, &have);
        if drift.is_empty() {
            self.repair.reset();
            self.repair_at = None;
            return;
        }
        tracing::warn!(
            node = %self.node,
            changed = ?drift,
            "this node's podnet.io/ annotations were changed by another writer; putting them back"
        );
        let want = want.clone();
        match self.publish(&want).await {
            Ok(()) => {
                self.repair.reset();
                self.repair_at = None;
            }
            Err(e) => {
                let d = self
                    .repair
                    .delay(Failure::of(&e), std::time::Instant::now());
                tracing::warn!(node = %self.node, "putting this node's annotations back: {e}; again in {d:?}");
                self.repair_at = Some(tokio::time::Instant::now() + d);
            }
        }
    }

    pub(crate) async fn network_up(&self) -> Result<(), SourceError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let now = podnet_api::k8s_openapi::jiff::Timestamp::now();
        let patch = serde_json::json!({"status": {"conditions": [{
            "type": "NetworkUnavailable",
            "status": "False",
            "reason": "PodnetIsUp",
            "message": "podnet is running on this node",
            "lastTransitionTime": now.to_string(),
            "lastHeartbeatTime": now.to_string(),
        }]}});
        api.patch_status(
            &self.node,
            &PatchParams::apply(MANAGER),
            &Patch::Strategic(&patch),
        )
        .await?;
        Ok(())
    }

    pub(crate) async fn release(&mut self) -> Result<(), SourceError> {
        release(&self.client, &self.node).await?;
        self.mine = None;
        self.published = None;
        self.repair_at = None;
        Ok(())
    }
}

/// The keys of `want` whose value in `have` differs (or is missing): what
/// another writer changed of what this agent publishes.
pub fn drift(want: &BTreeMap<String, String>, have: &BTreeMap<String, String>) -> Vec<String> {
    want.iter()
        .filter(|(k, v)| have.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use podnet_api::k8s_openapi::api::core::v1::NodeSpec;
    use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str, cidrs: &[&str], ann: Option<&Attrs>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: ann.map(annotations),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidrs: Some(cidrs.iter().map(|s| s.to_string()).collect()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_node_joins_the_mesh_with_a_pod_cidr_and_published_annotations() {
        let a = Attrs {
            public_ip: "192.168.200.11".parse().unwrap(),
            backend_type: "vxlan".into(),
            backend_data: serde_json::json!({"VNI": 1, "VtepMAC": "02:00:00:00:00:01"}),
            node: "n1".into(),
            ipv6_subnet: None,
            public_ipv6: None,
        };
        // Dual-stack: the IPv4 CIDR is the overlay's, whatever the order,
        // and the IPv6 one rides along.
        let n = node("n1", &["fd00:10:244:1::/64", "10.244.1.0/24"], Some(&a));
        let l = node_lease(&n).unwrap();
        assert_eq!(l.subnet.to_string(), "10.244.1.0/24");
        let six = "fd00:10:244:1::/64".parse().ok();
        assert_eq!(
            l.attrs,
            Attrs {
                ipv6_subnet: six,
                public_ipv6: None,
                ..a.clone()
            }
        );
        assert_eq!(l.attrs.vtep_mac(), Some([2, 0, 0, 0, 0, 1]));
        assert!(
            node_lease(&node("n2", &["10.244.2.0/24"], None)).is_none(),
            "no annotations yet"
        );
        assert!(
            node_lease(&node("n3", &[], Some(&a))).is_none(),
            "no podCIDR yet"
        );
        assert!(annotations(&a).keys().all(|k| k.starts_with(PREFIX)));
    }

    #[test]
    fn drift_names_what_another_writer_changed_and_ignores_the_rest() {
        let a = Attrs {
            public_ip: "192.168.200.12".parse().unwrap(),
            backend_type: "vxlan".into(),
            backend_data: serde_json::json!({"VNI": 1}),
            node: "n2".into(),
            ipv6_subnet: None,
            public_ipv6: None,
        };
        let want = annotations(&a);
        let mut have = want.clone();
        have.insert("kubernetes.io/other".into(), "x".into());
        assert!(
            drift(&want, &have).is_empty(),
            "others' annotations are theirs"
        );
        have.insert(PUBLIC_IP.into(), "192.168.200.99".into());
        have.remove(BACKEND_TYPE);
        assert_eq!(drift(&want, &have), [BACKEND_TYPE, PUBLIC_IP]);
    }
}
