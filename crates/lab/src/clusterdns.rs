//! Bootstrapping cluster DNS the way clusters run CoreDNS: a `podnet dns`
//! pod on the first node, the `kube-dns` Service selecting it, and waiting
//! until it answers, on the pod and through the Service. Rolling replicas
//! are [`crate::upgrade`]'s; the CoreDNS peer is [`crate::coredns`].

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use podnet_api::k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use podnet_api::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use podnet_api::netconfig;
use podnet_api::{Kind, Object};
use podnet_kernel::Netns;

use crate::daemon::{Daemon, DNS_CAPS};
use crate::error::{msg, LabError};
use crate::state::{Lab, LabState};
use crate::upgrade;

/// Where the lab's cluster DNS lives, as in kubeadm clusters.
pub const DNS_NAMESPACE: &str = "kube-system";

pub const DNS_POD: &str = "podnet-dns";

pub const DNS_SERVICE: &str = "kube-dns";

impl Lab {
    /// Cluster DNS the way clusters run CoreDNS: a `podnet dns` process in
    /// a pod (`kube-system/podnet-dns`, labelled `k8s-app=kube-dns`) on the
    /// first node, and the Service `kube-system/kube-dns` at the DNS service
    /// IP selecting it, so pods reach it through the agents' service proxy.
    /// Without `run_server` only the pod is made (Kubernetes mode without
    /// agents, where the Service's endpoints are what is tested).
    pub(crate) async fn start_dns(&self, st: &LabState, run_server: bool) -> Result<(), LabError> {
        let Some(node) = st.nodes.first() else {
            return Ok(());
        };
        let labels = dns_labels();
        let pod = self
            .run_pod(
                DNS_NAMESPACE,
                DNS_POD,
                Some(&node.name),
                labels.clone().into(),
                &[],
            )
            .await?;
        if !run_server {
            return Ok(());
        }
        self.ensure_forwarder(st, "forward-dns", &pod.netns)?;
        let upstreams = upgrade::dns_upstreams();
        self.spawn_daemon(
            "dns",
            Some(&pod.netns),
            &self.daemon_args(
                st,
                Daemon::Dns {
                    node: &node.name,
                    upstreams: &upstreams,
                },
            ),
            DNS_CAPS,
        )?;
        let (dns_ip, zone) = if st.kube {
            // The Service was made with the control plane (`up_kube`).
            (
                netconfig::DEFAULT_DNS_IP.parse().expect("default IP"),
                netconfig::DEFAULT_ZONE.to_string(),
            )
        } else {
            self.standalone_dns_service(st, labels).await?
        };
        // Ready when it answers on the pod IP, then through the Service.
        let probe = format!("dns-version.{zone}");
        let node_ns = Netns::named(&node.netns)?;
        let pod_ip: IpAddr = pod
            .ip
            .parse()
            .map_err(|_| msg(format!("DNS pod has no IP ({:?})", pod.ip)))?;
        let deadline = Instant::now() + Duration::from_secs(15);
        while !node_ns.run(|| dns_answers(SocketAddr::new(pod_ip, 53), &probe))? {
            if Instant::now() > deadline {
                return Err(msg(format!(
                    "cluster DNS did not answer on {pod_ip}; see {}",
                    self.log_path("dns").display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Through the Service from a pod (the DNS pod itself, hairpinned:
        // a node namespace has no route to the service CIDR).
        let pod_ns = Netns::named(&pod.netns)?;
        let deadline = Instant::now() + Duration::from_secs(15);
        while !pod_ns.run(|| dns_answers(SocketAddr::new(dns_ip, 53), &probe))? {
            if Instant::now() > deadline {
                tracing::warn!(
                    "cluster DNS answers on {pod_ip} but not yet through the Service {dns_ip}"
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Standalone: the cluster DNS address and zone from the store's
    /// NetworkConfig, and the kube-dns Service there.
    async fn standalone_dns_service(
        &self,
        st: &LabState,
        labels: BTreeMap<String, String>,
    ) -> Result<(IpAddr, String), LabError> {
        let objs = self.objects(st).await?;
        let (dns_ip, zone) = match objs
            .get(Kind::NetworkConfig, None, netconfig::DEFAULT_NAME)
            .await?
        {
            Some(Object::NetworkConfig(c)) => c
                .resolve()
                .map(|r| (r.dns_service_ip, r.cluster_domain))
                .map_err(|(f, m)| msg(format!("NetworkConfig {f}: {m}")))?,
            _ => (
                netconfig::DEFAULT_DNS_IP.parse().expect("default IP"),
                netconfig::DEFAULT_ZONE.to_string(),
            ),
        };
        let svc = dns_service(dns_ip, labels);
        if objs
            .get(Kind::Service, Some(DNS_NAMESPACE), DNS_SERVICE)
            .await?
            .is_none()
        {
            let ops = podnet_apiserver::alloc::transition(None, Some(&svc));
            objs.create(Object::Service(Box::new(svc)), ops).await?;
        }
        Ok((dns_ip, zone))
    }
}

/// The labels of the cluster DNS pod, which kube-dns selects.
pub(crate) fn dns_labels() -> BTreeMap<String, String> {
    BTreeMap::from([("k8s-app".to_string(), "kube-dns".to_string())])
}

/// The `kube-dns` Service: the DNS service IP, port 53 over UDP and TCP.
pub(crate) fn dns_service(ip: IpAddr, selector: BTreeMap<String, String>) -> Service {
    let port = |name: &str, proto: &str| ServicePort {
        name: Some(name.into()),
        port: 53,
        protocol: Some(proto.into()),
        target_port: Some(IntOrString::Int(53)),
        ..Default::default()
    };
    Service {
        metadata: ObjectMeta {
            name: Some(DNS_SERVICE.into()),
            namespace: Some(DNS_NAMESPACE.into()),
            labels: Some(selector.clone()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some(ip.to_string()),
            cluster_ips: Some(vec![ip.to_string()]),
            selector: Some(selector),
            ports: Some(vec![port("dns", "UDP"), port("dns-tcp", "TCP")]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Whether a DNS server at `addr` answers `name` TXT with NOERROR.
pub(crate) fn dns_answers(addr: SocketAddr, name: &str) -> bool {
    let c = podnet_dns::client::Client {
        timeout: Duration::from_millis(300),
        ..podnet_dns::client::Client::new(addr)
    };
    c.udp(name, podnet_dns::wire::TYPE_TXT)
        .map(|m| m.rcode() == podnet_dns::wire::NOERROR)
        .unwrap_or(false)
}
