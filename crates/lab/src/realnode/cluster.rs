//! `lab up --kubelet` after the underlay: the control plane for real
//! kubelets, the apiserver's ways in and out of the lab network, then each
//! node's containerd (with the images imported) and kubelet. The nodes
//! register themselves; they turn Ready once a network add-on (podnet's
//! DaemonSet) has written their CNI config.

use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use podnet_kernel::rtnl::Route;
use podnet_kernel::{Handle, Netns};

use super::{host, NodePeers, RealNode};
use crate::error::{msg, LabError};
use crate::kube::{self, KubeletPlan};
use crate::{gateway, kubelet, Lab, LabState, UpOptions};

impl Lab {
    pub(crate) async fn up_kubelets(
        &self,
        mut st: LabState,
        o: &UpOptions,
        peers: &kube::Peers,
        np: &NodePeers,
    ) -> Result<LabState, LabError> {
        host::ensure_bind_targets()?;
        let names: Vec<String> = (1..=o.nodes).map(|i| format!("node{i}")).collect();
        let plan = KubeletPlan {
            nodes: names.clone(),
            egress_socket: self.dir.join("egress.sock"),
            kube_scheduler: np.kube_scheduler.clone(),
        };
        let cp =
            kube::ControlPlane::start_with(&self.dir, peers, Some(&plan), o.dual_stack).await?;
        for i in 1..=o.nodes {
            self.add_node_ns(&mut st, i)?;
        }
        self.save(&st)?;
        self.forward_apiserver_at_gateway(&cp)?;
        self.start_egress(&plan.egress_socket)?;

        let nodes: Vec<RealNode<'_>> = st
            .nodes
            .iter()
            .map(|n| RealNode {
                lab: &self.name,
                lab_dir: &self.dir,
                node: n,
                dual_stack: o.dual_stack,
            })
            .collect();
        for n in &nodes {
            n.prepare()?;
        }
        // containerd and the imports, one thread per node (the imports
        // unpack hundreds of MiB each).
        std::thread::scope(|s| {
            let hs: Vec<_> = nodes
                .iter()
                .map(|n| {
                    s.spawn(|| {
                        n.start_containerd(np)?;
                        n.import(np, &o.images)
                    })
                })
                .collect();
            hs.into_iter().try_for_each(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(msg("import thread panicked")))
            })
        })?;
        let server = format!("https://{}", cp.advertised_addr());
        let pki = self.dir.join("kube").join("pki");
        let dns = podnet_api::netconfig::DEFAULT_DNS_IP;
        for n in &nodes {
            n.start_kubelet(np, &server, &pki, dns)?;
        }
        let c = cp.client().await?;
        let cidrs =
            kubelet::wait_pod_cidrs(&c, &names, Instant::now() + Duration::from_secs(120)).await?;
        // The apiserver's proxy (through the egress proxy in the gateway)
        // reaches pods as a machine on the underlay would: via their node.
        let mut gh = Handle::in_netns(&Netns::named(&self.gateway_ns())?)?;
        for n in &st.nodes {
            let cidr = cidrs[&n.name];
            gh.add_route(&Route {
                dst: Some(IpNet::V4(cidr)),
                gateway: Some(IpAddr::V4(n.ip)),
                ..Default::default()
            })?;
        }
        Ok(st)
    }

    /// The egress proxy ([`crate::egress`]) in the gateway namespace, for
    /// the apiserver: to the underlay (kubelets) and the cluster network.
    fn start_egress(&self, socket: &Path) -> Result<(), LabError> {
        let args = [
            "lab".to_string(),
            "--name".into(),
            self.name.clone(),
            "egress".into(),
            self.gateway_ns(),
            socket.display().to_string(),
            gateway::underlay().to_string(),
            kube::CLUSTER_CIDR.to_string(),
        ];
        let pid = self.spawn("egress", None, &args, &[])?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !socket.exists() {
            if !crate::process::alive(pid as i32) || Instant::now() > deadline {
                return Err(msg(format!(
                    "the egress proxy did not start; see {}",
                    self.log_path("egress").display()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }
}
