//! Pods: a namespace wired through the real CNI plugins of its node, in a
//! kubelet's order (the object, the sandbox, then the status), with
//! `podnet serve` answering inside and cluster DNS in its resolv.conf; its
//! record on disk; and removing it again.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use podnet_api::netconfig;
use podnet_api::{Kind, Object};
use podnet_cni::runtime::{Attach, Runtime};
use podnet_kernel::Netns;
use podnet_store::Objects;

use crate::error::{io, msg, LabError};
use crate::state::{Lab, LabState, NodeInfo, PodInfo};
use crate::store::{ensure_store_namespace, set_store_pod_running, upsert};
use crate::{kubelet, serve};

impl Lab {
    fn pod_file(&self, ns: &str, pod: &str) -> PathBuf {
        self.dir.join("pods").join(format!("{ns}_{pod}.json"))
    }

    pub fn pod(&self, ns: &str, pod: &str) -> Result<PodInfo, LabError> {
        let b = std::fs::read(self.pod_file(ns, pod))
            .map_err(|_| msg(format!("no pod {ns}/{pod} in lab {}", self.name)))?;
        serde_json::from_slice(&b).map_err(|e| msg(format!("corrupt pod record: {e}")))
    }

    /// Creates a pod on a node through the real CNI plugins, in a kubelet's
    /// order, in both modes: the Pod object first (namespace created if
    /// absent; bound to its node, labels, named container ports, no
    /// status), so whatever runs at CNI ADD (a policy agent) finds it; then
    /// the sandbox; then the status (IP, Running, Ready). Through the API in
    /// Kubernetes mode, in the store otherwise. On failure the sandbox and
    /// the object are removed again.
    pub async fn run_pod(
        &self,
        ns: &str,
        pod: &str,
        node: Option<&str>,
        meta: kubelet::PodMeta,
        ports: &[serve::PortSpec],
    ) -> Result<PodInfo, LabError> {
        let st = self.state()?;
        if self.pod_file(ns, pod).exists() {
            return Err(msg(format!("pod {ns}/{pod} already exists")));
        }
        let n = match node {
            Some(want) => st
                .nodes
                .iter()
                .find(|n| n.name == want)
                .cloned()
                .ok_or_else(|| msg(format!("no node {want:?}")))?,
            None => {
                let count = std::fs::read_dir(self.dir.join("pods"))
                    .map(|r| r.count())
                    .unwrap_or(0);
                st.nodes
                    .get(count % st.nodes.len().max(1))
                    .cloned()
                    .ok_or_else(|| msg("the lab has no nodes"))?
            }
        };
        let api = match st.kube {
            true => PodApi::Kube(self.kube_client().await?),
            false => PodApi::Store(self.objects(&st).await?),
        };
        let obj = kubelet::pod_object(ns, pod, &n.name, meta, ports);
        match &api {
            PodApi::Kube(c) => {
                kubelet::ensure_namespace(c, ns).await?;
                kubelet::create_pod(c, &obj).await?;
            }
            PodApi::Store(objs) => {
                ensure_store_namespace(objs, ns).await?;
                upsert(objs, Object::Pod(Box::new(obj))).await?;
            }
        }
        let r = self.start_pod(ns, pod, &n, ports, &api).await;
        if r.is_err() {
            if self.pod_file(ns, pod).exists() {
                let _ = self.remove_sandbox(&st, ns, pod);
            }
            let _ = api.delete_pod(ns, pod).await;
        }
        r
    }

    /// The sandbox of a pod on node `n`: namespace, CNI, DNS config,
    /// server; then the status of its object, which exists already.
    async fn start_pod(
        &self,
        ns: &str,
        pod: &str,
        n: &NodeInfo,
        ports: &[serve::PortSpec],
        api: &PodApi,
    ) -> Result<PodInfo, LabError> {
        let netns = format!("pn-{}-p{}", self.name, short_hash(&format!("{ns}/{pod}")));
        let pns = Netns::create_named(&netns)?;
        let container_id = format!("lab-{}-{ns}-{pod}", self.name);
        let (ip, ip6) = match self.cni_add(ns, pod, n, &pns, &container_id) {
            Ok(ips) => ips,
            Err(e) => {
                let _ = Netns::delete_named(&netns);
                return Err(e);
            }
        };
        let info = PodInfo {
            namespace: ns.into(),
            name: pod.into(),
            netns: netns.clone(),
            node: n.name.clone(),
            ip: ip.clone(),
            ip6: ip6.clone(),
            container_id,
        };
        std::fs::write(
            self.pod_file(ns, pod),
            serde_json::to_vec_pretty(&info).expect("json"),
        )
        .map_err(|e| io("writing pod record", e))?;

        // Cluster DNS for `lab exec` (ip netns exec bind-mounts this file).
        write_resolv_conf(api, ns, &netns).await?;

        if !ports.is_empty() {
            self.start_server(ns, pod, &netns, &pns, ports)?;
        }

        // The kubelet's part: the sandbox runs, so the status says so.
        match api {
            PodApi::Kube(c) => {
                kubelet::set_pod_running(c, ns, pod, (&ip, ip6.as_deref()), n.ip).await?
            }
            PodApi::Store(objs) => {
                set_store_pod_running(objs, ns, pod, (&ip, ip6.as_deref()), n.ip).await?
            }
        }
        Ok(info)
    }

    /// The conflist the agent on `node` writes, which pods there are
    /// wired with.
    fn conflist_path(&self, node: &str) -> PathBuf {
        self.node_dir(node).join("net.d").join("10-podnet.conflist")
    }

    /// CNI ADD of the sandbox `pns` through node `n`'s conflist, run with
    /// the node as host, as its kubelet would; returns the pod's IPv4
    /// address and, dual-stack, its IPv6 one.
    fn cni_add(
        &self,
        ns: &str,
        pod: &str,
        n: &NodeInfo,
        pns: &Netns,
        container_id: &str,
    ) -> Result<(String, Option<String>), LabError> {
        let list_path = self.conflist_path(&n.name);
        let list: serde_json::Value = std::fs::read(&list_path)
            .map_err(|e| io(format!("reading {}", list_path.display()), e))
            .and_then(|b| {
                serde_json::from_slice(&b).map_err(|e| msg(format!("{}: {e}", list_path.display())))
            })?;
        let rt = Runtime::new(self.bin_dir()).in_netns(Path::new("/run/netns").join(&n.netns));
        let attach = Attach {
            container_id: container_id.to_string(),
            netns: pns.path().display().to_string(),
            ifname: "eth0".into(),
            args: format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={pod}"),
            ..Default::default()
        };
        let res = rt.add_list(&list, &attach)?;
        let ips: Vec<std::net::IpAddr> = res["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["address"].as_str()?.split('/').next()?.parse().ok())
            .collect();
        let v4 = ips.iter().find(|i| i.is_ipv4()).map(|i| i.to_string());
        let v6 = ips.iter().find(|i| i.is_ipv6()).map(|i| i.to_string());
        Ok((v4.unwrap_or_default(), v6))
    }

    /// `podnet serve` on `ports` in the pod's namespace `netns` (open as
    /// `pns`; role `pod-<ns>_<pod>`), so probes have something that says
    /// who answered.
    fn start_server(
        &self,
        ns: &str,
        pod: &str,
        netns: &str,
        pns: &Netns,
        ports: &[serve::PortSpec],
    ) -> Result<(), LabError> {
        let spec = ports
            .iter()
            .map(serve::PortSpec::number_and_protocol)
            .collect::<Vec<_>>()
            .join(",");
        self.spawn(
            &format!("pod-{ns}_{pod}"),
            Some(netns),
            &[
                "serve".into(),
                "--namespace".into(),
                ns.into(),
                "--name".into(),
                pod.into(),
                "--ports".into(),
                spec,
            ],
            &[],
        )?;
        // Ready when the first TCP port answers (bounded).
        if let Some(p) = ports.iter().find(|p| !p.udp) {
            let deadline = Instant::now() + Duration::from_secs(10);
            let addr: SocketAddr = format!("127.0.0.1:{}", p.port).parse().expect("addr");
            while pns
                .run(|| serve::ask(addr, false, "hostname", Duration::from_millis(200)))?
                .is_err()
            {
                if Instant::now() > deadline {
                    return Err(msg(format!("pod {ns}/{pod}: server did not start")));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// Removes one pod (CNI DEL, namespace, record, Pod object).
    pub async fn delete_pod(&self, ns: &str, pod: &str) -> Result<(), LabError> {
        let st = self.state()?;
        self.pod(ns, pod)?;
        self.remove_sandbox(&st, ns, pod)?;
        let api = match st.kube {
            true => PodApi::Kube(self.kube_client().await?),
            false => PodApi::Store(self.objects(&st).await?),
        };
        api.delete_pod(ns, pod).await
    }

    /// A pod's sandbox: its server, CNI DEL, its namespace, its record.
    fn remove_sandbox(&self, st: &LabState, ns: &str, pod: &str) -> Result<(), LabError> {
        let p = self.pod(ns, pod)?;
        self.kill_role(&format!("pod-{ns}_{pod}"));
        let list_path = self.conflist_path(&p.node);
        if let Ok(b) = std::fs::read(&list_path) {
            if let Ok(list) = serde_json::from_slice::<serde_json::Value>(&b) {
                if let Some(n) = st.nodes.iter().find(|n| n.name == p.node) {
                    let rt = Runtime::new(self.bin_dir())
                        .in_netns(Path::new("/run/netns").join(&n.netns));
                    let a = Attach {
                        container_id: p.container_id.clone(),
                        netns: format!("/run/netns/{}", p.netns),
                        ifname: "eth0".into(),
                        ..Default::default()
                    };
                    rt.del_list(&list, &a, None)?;
                }
            }
        }
        Netns::delete_named(&p.netns)?;
        let _ = std::fs::remove_dir_all(Path::new("/etc/netns").join(&p.netns));
        let _ = std::fs::remove_file(self.pod_file(ns, pod));
        Ok(())
    }
}

/// Where a pod's object lives: the API (Kubernetes mode) or the store.
enum PodApi {
    Kube(::kube::Client),
    Store(Objects),
}

impl PodApi {
    /// Deletes the Pod object; a missing one is fine.
    async fn delete_pod(&self, ns: &str, pod: &str) -> Result<(), LabError> {
        match self {
            PodApi::Kube(c) => Ok(kubelet::delete_pod(c, ns, pod).await?),
            PodApi::Store(objs) => {
                podnet_apiserver::admission::delete_one(objs, Kind::Pod, Some(ns), pod)
                    .await
                    .map_err(msg)?;
                Ok(())
            }
        }
    }
}

/// The pod's resolv.conf, as a kubelet writes it (cluster DNS, the search
/// path of namespace `ns`, ndots 5), where `ip netns exec` bind-mounts it:
/// `/etc/netns/<netns>/resolv.conf`.
async fn write_resolv_conf(api: &PodApi, ns: &str, netns: &str) -> Result<(), LabError> {
    let config = match api {
        PodApi::Store(objs) => {
            objs.get(Kind::NetworkConfig, None, netconfig::DEFAULT_NAME)
                .await?
        }
        PodApi::Kube(_) => None,
    };
    let (dns_ip, zone) = match config {
        Some(Object::NetworkConfig(c)) => c
            .resolve()
            .map(|r| (r.dns_service_ip.to_string(), r.cluster_domain))
            .unwrap_or_default(),
        _ => (
            netconfig::DEFAULT_DNS_IP.into(),
            netconfig::DEFAULT_ZONE.into(),
        ),
    };
    let etc = Path::new("/etc/netns").join(netns);
    std::fs::create_dir_all(&etc).map_err(|e| io("creating /etc/netns", e))?;
    std::fs::write(
        etc.join("resolv.conf"),
        format!("nameserver {dns_ip}\nsearch {ns}.svc.{zone} svc.{zone} {zone}\noptions ndots:5\n"),
    )
    .map_err(|e| io("writing resolv.conf", e))?;
    Ok(())
}

fn short_hash(s: &str) -> String {
    let mut h: u32 = 0x811c9dc5;
    for b in s.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x01000193);
    }
    format!("{h:08x}")
}
