//! Kubernetes mode's side of a lab: bringing it up around a real control
//! plane ([`crate::kube`]), the kubeconfigs and net-conf.json its daemons
//! read, an admin client, and restarting the API server.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use podnet_api::netconfig;
use podnet_kernel::Netns;

use crate::clusterdns::{dns_labels, dns_service, DNS_NAMESPACE};
use crate::error::{io, msg, LabError};
use crate::lifecycle::UpOptions;
use crate::state::{Lab, LabState};
use crate::{kube, kubelet, Daemon, LB_IPAM_CAPS};

impl Lab {
    /// The kubeconfig of node `node`'s daemons in Kubernetes mode:
    /// `<lab dir>/nodes/<node>/kubeconfig`. It names the apiserver at
    /// `127.0.0.1:<port>`, which a forwarder serves inside the node's (and
    /// the DNS pod's) namespace.
    pub fn node_kubeconfig(&self, node: &str) -> PathBuf {
        self.node_dir(node).join("kubeconfig")
    }

    /// The kubeconfig of cluster DNS in Kubernetes mode, as ServiceAccount
    /// `kube-system/podnet-dns`: `<lab dir>/dns-kubeconfig`.
    pub fn dns_kubeconfig(&self) -> PathBuf {
        self.dir.join("dns-kubeconfig")
    }

    /// LB IPAM's kubeconfig in Kubernetes mode, as ServiceAccount
    /// `kube-system/podnet-lb-ipam`: `<lab dir>/lb-ipam-kubeconfig`. Its
    /// replicas run in node namespaces, whose forwarder serves the
    /// apiserver's address on their loopback.
    pub fn lb_ipam_kubeconfig(&self) -> PathBuf {
        self.dir.join("lb-ipam-kubeconfig")
    }

    /// The network config of a Kubernetes-mode lab's daemons (flannel's
    /// net-conf.json fields): `<lab dir>/net-conf.json`.
    pub fn net_conf_path(&self) -> PathBuf {
        self.dir.join("net-conf.json")
    }

    /// The admin kubeconfig of a Kubernetes-mode lab, for kubectl:
    /// `<lab dir>/kubeconfig`.
    pub fn kubeconfig(&self) -> Result<PathBuf, LabError> {
        if !self.state()?.kube {
            return Err(msg(format!(
                "lab {:?} runs no Kubernetes control plane (podnet lab up --kube)",
                self.name
            )));
        }
        Ok(kube::ControlPlane::open(&self.dir)?.admin_kubeconfig())
    }

    /// An admin client of a Kubernetes-mode lab's apiserver.
    pub async fn kube_client(&self) -> Result<::kube::Client, LabError> {
        Ok(kube::ControlPlane::open(&self.dir)?.client().await?)
    }

    /// `lab up --kube` after the underlay: the control plane, the Node
    /// objects and their podCIDRs, the kube-dns Service, then agents (or,
    /// without them, each node's CNI files from its podCIDR) and DNS.
    pub(crate) async fn up_kube(
        &self,
        mut st: LabState,
        o: &UpOptions,
        peers: &kube::Peers,
    ) -> Result<LabState, LabError> {
        let cp = kube::ControlPlane::start_with(&self.dir, peers, None, st.dual_stack).await?;
        // The agents' and DNS's network config, as flannel's net-conf.json
        // (kube-controller-manager's --cluster-cidr is the Network).
        let mut conf = serde_json::json!({
            "Network": kube::CLUSTER_CIDR,
            "SubnetLen": 24,
            "Backend": {"Type": st.backend, "DirectRouting": st.racks > 1},
            "ServiceCIDR": kube::service_cidrs(st.dual_stack),
            "Encrypt": st.encrypt,
        });
        if st.dual_stack {
            conf["EnableIPv6"] = true.into();
            conf["IPv6Network"] = kube::CLUSTER_CIDR6.into();
        }
        std::fs::write(self.net_conf_path(), conf.to_string())
            .map_err(|e| io("writing the lab's net-conf.json", e))?;
        let c = cp.client().await?;
        // The daemons' identities and rights, exactly as deploy/ ships them.
        kube::apply_crds(&c, kube::CRDS).await?;
        kube::apply_crds(&c, kube::NAD_CRD).await?;
        kube::apply_rbac(&c, kube::AGENT_RBAC).await?;
        kube::apply_rbac(&c, kube::AGENT_ADMISSION).await?;
        kube::apply_rbac(&c, kube::DNS_RBAC).await?;
        kube::apply_rbac(&c, kube::LB_IPAM_RBAC).await?;
        cp.write_service_account_kubeconfig(&c, kube::DNS_ACCOUNT, None, &self.dns_kubeconfig())
            .await?;
        let gateway_api = self.prepare_gateway_kube(&c, &cp).await?;
        tracing::info!(gateway_api, "Gateway API CRDs installed");
        let lb = self.lb_ipam_kubeconfig();
        cp.write_service_account_kubeconfig(&c, kube::LB_IPAM_ACCOUNT, None, &lb)
            .await?;
        // kube-dns first, so no other Service can take its address.
        kubelet::ensure_namespace(&c, DNS_NAMESPACE).await?;
        let dns_ip: IpAddr = netconfig::DEFAULT_DNS_IP.parse().expect("default IP");
        kubelet::ensure_service(&c, &dns_service(dns_ip, dns_labels())).await?;
        for i in 1..=o.nodes {
            self.add_node_ns(&mut st, i)?;
        }
        self.save(&st)?;
        for n in &st.nodes {
            self.join_kube_node(&c, &cp, &st, n).await?;
        }
        self.forward_apiserver_at_gateway(&cp)?;
        let names: Vec<String> = st.nodes.iter().map(|n| n.name.clone()).collect();
        let cidrs =
            kubelet::wait_pod_cidrs(&c, &names, Instant::now() + Duration::from_secs(60)).await?;
        if o.kube_agents {
            for n in &st.nodes {
                self.start_agent(&st, n)?;
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            for n in &st.nodes {
                self.wait_node_ready(&st, n, deadline)?;
            }
        } else {
            for n in &st.nodes {
                self.write_cni_files(n, cidrs[&n.name])?;
            }
        }
        self.start_dns(&st, o.kube_agents).await?;
        if o.kube_agents {
            self.start_dns_replicas(&st, o.dns_replicas).await?;
            self.start_lb_ipam(&st)?;
            self.start_l7_gateway(&st)?;
        }
        Ok(st)
    }

    /// LB IPAM as the Deployment in deploy/ runs it: two replicas (on the
    /// first two nodes; roles `lb-ipam-1`, `lb-ipam-2`, also their names
    /// in the Lease), one of which leads.
    pub(crate) fn start_lb_ipam(&self, st: &LabState) -> Result<(), LabError> {
        for (i, n) in st.nodes.iter().take(2).enumerate() {
            let id = format!("lb-ipam-{}", i + 1);
            let args = self.daemon_args(st, Daemon::LbIpam { id: &id });
            self.spawn_daemon(&id, Some(&n.netns), &args, LB_IPAM_CAPS)?;
        }
        Ok(())
    }

    /// The `kubernetes` Service's endpoint, and where real kubelets find
    /// the API: the gateway, forwarding to the apiserver here.
    pub(crate) fn forward_apiserver_at_gateway(
        &self,
        cp: &kube::ControlPlane,
    ) -> Result<(), LabError> {
        let api = cp.advertised_addr();
        let args = [
            "lab".to_string(),
            "--name".into(),
            self.name.clone(),
            "forward".into(),
            self.gateway_ns(),
            format!("{api}={}", cp.apiserver_addr()),
        ];
        self.spawn("forward-gw", None, &args, &[])?;
        let gw = Netns::named(&self.gateway_ns())?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while gw
            .run(|| std::net::TcpStream::connect(api.as_str()))?
            .is_err()
        {
            if Instant::now() > deadline {
                return Err(msg(
                    "the apiserver's forwarder in the gateway did not start",
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Kubernetes mode: kills the API server (SIGKILL) and starts it again,
    /// returning once it is ready (`/readyz`); the daemons must find it
    /// again by themselves.
    pub async fn restart_apiserver(&self) -> Result<(), LabError> {
        if !self.state()?.kube {
            return Err(msg("restart-apiserver: a --kube lab only"));
        }
        kube::ControlPlane::open(&self.dir)?
            .restart_apiserver()
            .await?;
        Ok(())
    }
}
