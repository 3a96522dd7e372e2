//! The L7 gateway (`podnet gateway`) in a lab, as `deploy/`'s Deployment
//! runs it: one process with node 1's network (the host-port mode),
//! serving every Gateway listener and the Ingress ports at node 1's
//! address, which the statuses show. In Kubernetes mode it runs as the
//! ServiceAccount `kube-system/podnet-gateway` with exactly
//! `deploy/parts/14-gateway-rbac.yaml`'s rights, after the Gateway API
//! CRDs (v1.6 standard channel, cached by
//! `scripts/gateway-conformance.sh`) are applied where present; without
//! them it serves Ingresses only.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::daemon::Daemon;
use crate::error::{msg, LabError};
use crate::kube;
use crate::state::{Lab, LabState};
use crate::upgrade::http_get;

/// CAP_NET_BIND_SERVICE: listeners on ports below 1024.
pub const GATEWAY_CAPS: &[u32] = &[10];
/// The gateway's process role (and log name).
pub const GATEWAY_ROLE: &str = "l7-gateway";
/// Its /metrics, /healthz and /readyz, inside node 1's namespace.
pub const GATEWAY_METRICS: &str = "127.0.0.1:10290";
/// The gateway's RBAC, as shipped.
pub const GATEWAY_RBAC: &str = include_str!("../../../deploy/parts/14-gateway-rbac.yaml");
pub const GATEWAY_ACCOUNT: &str = "podnet-gateway";

/// Where `scripts/gateway-conformance.sh` caches the Gateway API's
/// standard-channel CRDs (`PODNET_GATEWAY_API_CRDS` overrides).
pub fn gateway_api_crds() -> Option<PathBuf> {
    let p = std::env::var_os("PODNET_GATEWAY_API_CRDS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from("/var/cache/podnet-peers/gateway-api-v1.6.3/standard-crds.yaml")
        });
    p.exists().then_some(p)
}

impl Lab {
    /// The gateway's kubeconfig in Kubernetes mode:
    /// `<lab dir>/gateway-kubeconfig`.
    pub fn gateway_kubeconfig(&self) -> PathBuf {
        self.dir.join("gateway-kubeconfig")
    }

    /// Where the lab's gateway serves (node 1's address).
    pub fn gateway_address(st: &LabState) -> Option<Ipv4Addr> {
        st.nodes.first().map(|n| n.ip)
    }

    /// Kubernetes mode: the gateway's identity, and the Gateway API CRDs
    /// when they are cached. Returns whether the CRDs are installed.
    pub(crate) async fn prepare_gateway_kube(
        &self,
        c: &::kube::Client,
        cp: &kube::ControlPlane,
    ) -> Result<bool, LabError> {
        kube::apply_rbac(c, GATEWAY_RBAC).await?;
        cp.write_service_account_kubeconfig(c, GATEWAY_ACCOUNT, None, &self.gateway_kubeconfig())
            .await?;
        let Some(crds) = gateway_api_crds() else {
            return Ok(false);
        };
        let text = std::fs::read_to_string(&crds)
            .map_err(|e| crate::error::io(format!("reading {}", crds.display()), e))?;
        kube::apply_crds(c, &text).await?;
        Ok(true)
    }

    /// Starts the gateway on node 1 and waits until it has its first
    /// complete view (`/readyz`).
    pub(crate) fn start_l7_gateway(&self, st: &LabState) -> Result<(), LabError> {
        let Some(node) = st.nodes.first() else {
            return Ok(());
        };
        let args = self.daemon_args(st, Daemon::Gateway { address: node.ip });
        self.spawn_daemon(GATEWAY_ROLE, Some(&node.netns), &args, GATEWAY_CAPS)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some((200, _)) = http_get(&node.netns, GATEWAY_METRICS, "/readyz") {
                return Ok(());
            }
            if !self.role_alive(GATEWAY_ROLE) || Instant::now() > deadline {
                return Err(msg(format!(
                    "the L7 gateway did not become ready; see {}",
                    self.log_path(GATEWAY_ROLE).display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
