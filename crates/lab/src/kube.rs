//! A real Kubernetes control plane for the lab: Debian's etcd, and the
//! kube-apiserver and kube-controller-manager that `scripts/k8s-peers.sh`
//! builds, on free loopback ports, with a PKI made here.
//!
//! This module owns everything that is the control plane's: finding the
//! binaries, the certificates and keys (`<dir>/kube/pki/`), the kubeconfigs
//! (the admin's at `<dir>/kubeconfig`, the controller manager's under
//! `<dir>/kube/`), the three processes (pids under `<dir>/pids/`, logs under
//! `<dir>/logs/`, data under `<dir>/kube/etcd/`) and the readiness signal
//! (`/readyz`). It needs no network namespace: `lab up --kube` runs it in the
//! lab's directory, and tests run it in a directory of their own, so the
//! same cluster serves the lab and the differential tests. Everything it
//! starts is recorded before it is waited on, so [`ControlPlane::stop`] (or
//! `lab down`, which kills whatever `<dir>/pids` names) cleans up also
//! after a crash.

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use podnet_daemon::HttpGet;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// The script that builds and caches the Kubernetes binaries; its last
/// lines are `NAME=/path` for each.
pub const PEERS_SCRIPT: &str = "scripts/k8s-peers.sh";
/// Services get ClusterIPs from here (Kubernetes' default).
pub const SERVICE_CIDR: &str = "10.96.0.0/12";
/// A dual-stack lab's IPv6 Service CIDR (kind's default family range, cut
/// to the 16 bits kube-apiserver's bitmap allocator takes comfortably).
pub const SERVICE_CIDR6: &str = "fd00:10:96::/112";

/// The `--service-cluster-ip-range` (and `ServiceCIDR`) of a lab: IPv4
/// first, so single-stack Services stay IPv4 as before.
pub fn service_cidrs(dual_stack: bool) -> String {
    match dual_stack {
        true => format!("{SERVICE_CIDR},{SERVICE_CIDR6}"),
        false => SERVICE_CIDR.to_string(),
    }
}
/// kube-controller-manager hands nodes /24s from here (flannel's default).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The pods' IPv6 network in a dual-stack lab: a /64 per node, as many as
/// the IPv4 network's /24s.
pub const CLUSTER_CIDR6: &str = "fd00:10:244::/56";
/// The `default/kubernetes` Service: the first address of the service CIDR.
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// The process roles this module starts (pid and log file names).
pub const ROLES: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// What real kubelets need of the control plane (`lab up --kubelet`): a
/// client certificate per node, the apiserver's way to them, and a
/// scheduler. Without it the lab plays the kubelet and nothing schedules.
#[derive(Debug, Clone)]
pub struct KubeletPlan {
    /// The nodes whose kubelets will join (each gets `node-<name>.crt`).
    pub nodes: Vec<String>,
    /// The Unix socket of the egress proxy ([`crate::egress`]), through
    /// which the apiserver reaches kubelets and pods.
    pub egress_socket: PathBuf,
    pub kube_scheduler: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("Kubernetes binaries: {0}")]
    Peers(String),
    #[error("certificates: {0}")]
    Pki(String),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0}")]
    Start(String),
    #[error("kubeconfig {0}: {1}")]
    Kubeconfig(String, String),
    #[error("{0}: {1}")]
    Api(String, kube::Error),
    #[error("RBAC manifest: {0}")]
    Manifest(String),
}

fn io(what: impl Into<String>, e: std::io::Error) -> KubeError {
    KubeError::Io(what.into(), e)
}

fn pki(e: rcgen::Error) -> KubeError {
    KubeError::Pki(e.to_string())
}

/// Where the Kubernetes binaries are. `KUBE_APISERVER`,
/// `KUBE_CONTROLLER_MANAGER`, `KUBECTL` and `ETCD` in the environment win;
/// the rest come from [`PEERS_SCRIPT`] (run so that it never downloads or
/// builds: a missing binary is an error that names the script).
#[derive(Debug, Clone)]
pub struct Peers {
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kubectl: PathBuf,
    pub etcd: PathBuf,
}

impl Peers {
    pub fn find() -> Result<Peers, KubeError> {
        let from_env = |k: &str| std::env::var_os(k).map(PathBuf::from);
        let (mut api, mut kcm, mut ctl) = (
            from_env("KUBE_APISERVER"),
            from_env("KUBE_CONTROLLER_MANAGER"),
            from_env("KUBECTL"),
        );
        if api.is_none() || kcm.is_none() || ctl.is_none() {
            let script = peers_script();
            if !script.exists() {
                return Err(KubeError::Peers(format!(
                    "{} not found (looked at {}); set PODNET_K8S_PEERS to the script, or \
                     KUBE_APISERVER, KUBE_CONTROLLER_MANAGER and KUBECTL to the binaries",
                    PEERS_SCRIPT,
                    script.display()
                )));
            }
            // GOPROXY=off: a cold cache fails fast instead of building for
            // minutes behind `lab up`'s back.
            let out = Command::new("bash")
                .arg(&script)
                .env("GOPROXY", "off")
                .stdin(Stdio::null())
                .output()
                .map_err(|e| io(format!("running {}", script.display()), e))?;
            if !out.status.success() {
                return Err(KubeError::Peers(format!(
                    "kube-apiserver, kube-controller-manager and kubectl are not built; run \
                     `bash {}` (it builds and caches them): {}",
                    script.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let Some((k, v)) = line.split_once('=') else {
                    continue;
                };
                let slot = match k {
                    "KUBE_APISERVER" => &mut api,
                    "KUBE_CONTROLLER_MANAGER" => &mut kcm,
                    "KUBECTL" => &mut ctl,
                    _ => continue,
                };
                slot.get_or_insert_with(|| PathBuf::from(v));
            }
        }
        let need = |p: Option<PathBuf>, name: &str| {
            p.filter(|p| p.exists()).ok_or_else(|| {
                KubeError::Peers(format!(
                    "{name} is missing; run `bash {PEERS_SCRIPT}` to build it"
                ))
            })
        };
        let etcd = match from_env("ETCD") {
            Some(p) => p,
            None => which("etcd").ok_or_else(|| {
                KubeError::Peers(
                    "etcd is not installed (apt-get install etcd-server, or set ETCD)".into(),
                )
            })?,
        };
        Ok(Peers {
            kube_apiserver: need(api, "kube-apiserver")?,
            kube_controller_manager: need(kcm, "kube-controller-manager")?,
            kubectl: need(ctl, "kubectl")?,
            etcd,
        })
    }
}

/// The peers script: `PODNET_K8S_PEERS`, else the one in this source tree.
pub(crate) fn peers_script() -> PathBuf {
    match std::env::var_os("PODNET_K8S_PEERS") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(PEERS_SCRIPT),
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

/// A running control plane. Cheap to rebuild from its directory
/// ([`ControlPlane::open`]), so short-lived commands (`lab run`) reach it.
#[derive(Debug, Clone)]
pub struct ControlPlane {
    pub dir: PathBuf,
    /// The apiserver's secure port on 127.0.0.1.
    pub apiserver_port: u16,
}

/// The files of the PKI, by role.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Makes the CA, the apiserver's serving cert, the admin's and the
    /// controller manager's client certs, and the service-account key; for
    /// real kubelets also the scheduler's, the apiserver's kubelet client
    /// cert and one client cert per node (`system:node:<name>`, what the
    /// Node authorizer and NodeRestriction know a kubelet by).
    fn create(dir: &Path, kubelets: Option<&KubeletPlan>) -> Result<Pki, KubeError> {
        std::fs::create_dir_all(dir).map_err(|e| io(format!("creating {}", dir.display()), e))?;
        let p = Pki {
            dir: dir.to_path_buf(),
        };
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(pki)?;
        ca.distinguished_name
            .push(DnType::CommonName, "podnet-lab-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().map_err(pki)?;
        let ca = CertifiedIssuer::self_signed(ca, ca_key).map_err(pki)?;
        p.write("ca.crt", &ca.pem())?;

        let leaf = |name: &str,
                    sans: Vec<String>,
                    cn: &str,
                    org: Option<&str>,
                    usage: ExtendedKeyUsagePurpose|
         -> Result<(), KubeError> {
            let mut params = CertificateParams::new(sans).map_err(pki)?;
            params.distinguished_name.push(DnType::CommonName, cn);
            if let Some(o) = org {
                params.distinguished_name.push(DnType::OrganizationName, o);
            }
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate().map_err(pki)?;
            let cert = params.signed_by(&key, &ca).map_err(pki)?;
            p.write(&format!("{name}.crt"), &cert.pem())?;
            p.write(&format!("{name}.key"), &key.serialize_pem())
        };
        let sans = [
            "127.0.0.1",
            &crate::gateway::gateway().to_string(),
            &KUBERNETES_SERVICE_IP.to_string(),
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        leaf(
            "apiserver",
            sans,
            "kube-apiserver",
            None,
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        // system:masters: the lab's tools and (for now) its agents act as
        // cluster admins; least-privilege ServiceAccounts are issue 15.
        leaf(
            "admin",
            vec![],
            "podnet-lab-admin",
            Some("system:masters"),
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        leaf(
            "controller-manager",
            vec![],
            "system:kube-controller-manager",
            Some("system:masters"),
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        if let Some(plan) = kubelets {
            kubelet_certs(&leaf, plan)?;
        }
        let sa = KeyPair::generate().map_err(pki)?;
        p.write("sa.key", &sa.serialize_pem())?;
        p.write("sa.pub", &sa.public_key_pem())?;
        Ok(p)
    }

    /// Private keys are secrets ([`write_secret`]); certificates are not.
    fn write(&self, name: &str, text: &str) -> Result<(), KubeError> {
        let path = self.path(name);
        if name.ends_with(".key") {
            return write_secret(&path, text);
        }
        std::fs::write(&path, text).map_err(|e| io(format!("writing {}", path.display()), e))
    }
}

/// A certificate signer: file name, SANs, CN, O, extended key usage.
type Leaf<'a> = dyn Fn(&str, Vec<String>, &str, Option<&str>, ExtendedKeyUsagePurpose) -> Result<(), KubeError>
    + 'a;

/// The certificates real kubelets need: the scheduler's, the apiserver's
/// kubelet client cert, and one per node.
fn kubelet_certs(leaf: &Leaf<'_>, plan: &KubeletPlan) -> Result<(), KubeError> {
    let client = ExtendedKeyUsagePurpose::ClientAuth;
    leaf(
        "kube-scheduler",
        vec![],
        "system:kube-scheduler",
        None,
        client.clone(),
    )?;
    leaf(
        "apiserver-kubelet-client",
        vec![],
        "kube-apiserver-kubelet-client",
        Some("system:masters"),
        client.clone(),
    )?;
    for n in &plan.nodes {
        leaf(
            &format!("node-{n}"),
            vec![],
            &format!("system:node:{n}"),
            Some("system:nodes"),
            client.clone(),
        )?;
    }
    Ok(())
}

/// A kubeconfig for `server` with the client cert `user` of the PKI in
/// `pki` (file references, so the files stay the one source of truth).
pub fn kubeconfig_text(server: &str, pki_dir: &Path, user: &str) -> String {
    let f = |n: &str| pki_dir.join(n).display().to_string();
    format!(
        "apiVersion: v1\nkind: Config\n\
         clusters:\n- name: podnet-lab\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
         users:\n- name: {user}\n  user:\n    client-certificate: {crt}\n    client-key: {key}\n\
         contexts:\n- name: podnet-lab\n  context:\n    cluster: podnet-lab\n    user: {user}\n\
         current-context: podnet-lab\n",
        ca = f("ca.crt"),
        crt = f(&format!("{user}.crt")),
        key = f(&format!("{user}.key")),
    )
}

/// A kubeconfig for `server` that authenticates with a bearer token.
fn token_kubeconfig_text(server: &str, pki_dir: &Path, user: &str, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\n\
         clusters:\n- name: podnet-lab\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
         users:\n- name: {user}\n  user:\n    token: {token}\n\
         contexts:\n- name: podnet-lab\n  context:\n    cluster: podnet-lab\n    user: {user}\n\
         current-context: podnet-lab\n",
        ca = pki_dir.join("ca.crt").display(),
    )
}

/// Audit podnet's ServiceAccounts' requests, once each (at
/// ResponseComplete; a watch also at its start), and nothing else.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: [\"system:serviceaccounts:kube-system\"]
- level: None
";

/// Where deploy/'s ServiceAccounts live.
pub const RBAC_NAMESPACE: &str = "kube-system";
/// The agent's ServiceAccount, ClusterRole and binding, as shipped.
pub const AGENT_RBAC: &str = include_str!("../../../deploy/parts/10-agent-rbac.yaml");
/// The policy that the agent writes only its own Node, and its binding.
pub const AGENT_ADMISSION: &str = include_str!("../../../deploy/parts/12-agent-admission.yaml");
/// Cluster DNS's ServiceAccount, ClusterRole and binding, as shipped.
pub const DNS_RBAC: &str = include_str!("../../../deploy/parts/11-dns-rbac.yaml");
/// LB IPAM's ServiceAccount, ClusterRole, Lease Role and bindings.
pub const LB_IPAM_RBAC: &str = include_str!("../../../deploy/parts/13-lb-ipam-rbac.yaml");
/// The ServiceAccounts those files make.
pub const AGENT_ACCOUNT: &str = "podnet-agent";
pub const DNS_ACCOUNT: &str = "podnet-dns";
pub const LB_IPAM_ACCOUNT: &str = "podnet-lb-ipam";

/// Creates or updates the ServiceAccounts, (Cluster)Roles,
/// (Cluster)RoleBindings, ValidatingAdmissionPolicies and their bindings of
/// a multi-document YAML text (server-side apply, so a rerun converges).
/// Any other kind is refused by name.
pub async fn apply_rbac(c: &kube::Client, text: &str) -> Result<(), KubeError> {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    use serde::Deserialize;
    for doc in serde_yaml::Deserializer::from_str(text) {
        let v =
            serde_json::Value::deserialize(doc).map_err(|e| KubeError::Manifest(e.to_string()))?;
        if v.is_null() {
            continue;
        }
        let kind = v["kind"].as_str().unwrap_or_default().to_string();
        let name = v["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let pp = kube::api::PatchParams::apply("podnet-lab").force();
        let patch = kube::api::Patch::Apply(&v);
        let what = format!("applying {kind} {name}");
        let r = match kind.as_str() {
            "ServiceAccount" => kube::Api::<ServiceAccount>::namespaced(
                c.clone(),
                v["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or(RBAC_NAMESPACE),
            )
            .patch(&name, &pp, &patch)
            .await
            .map(drop),
            "Role" => kube::Api::<Role>::namespaced(c.clone(), RBAC_NAMESPACE)
                .patch(&name, &pp, &patch)
                .await
                .map(drop),
            "RoleBinding" => kube::Api::<RoleBinding>::namespaced(c.clone(), RBAC_NAMESPACE)
                .patch(&name, &pp, &patch)
                .await
                .map(drop),
            "ClusterRole" => kube::Api::<ClusterRole>::all(c.clone())
                .patch(&name, &pp, &patch)
                .await
                .map(drop),
            "ClusterRoleBinding" => kube::Api::<ClusterRoleBinding>::all(c.clone())
                .patch(&name, &pp, &patch)
                .await
                .map(drop),
            "ValidatingAdmissionPolicy" => kube::Api::<ValidatingAdmissionPolicy>::all(c.clone())
                .patch(&name, &pp, &patch)
                .await
                .map(drop),
            "ValidatingAdmissionPolicyBinding" => {
                kube::Api::<ValidatingAdmissionPolicyBinding>::all(c.clone())
                    .patch(&name, &pp, &patch)
                    .await
                    .map(drop)
            }
            other => {
                return Err(KubeError::Manifest(format!(
                "{name}: kind {other:?} is not a ServiceAccount, ClusterRole, ClusterRoleBinding \
                 or ValidatingAdmissionPolicy(Binding)"
            )))
            }
        };
        r.map_err(|e| KubeError::Api(what, e))?;
    }
    Ok(())
}

/// podnet's CustomResourceDefinitions, as shipped.
pub const CRDS: &str = include_str!("../../../deploy/parts/05-crds.yaml");

/// The NetworkAttachmentDefinition CRD (Multus's), as shipped.
pub const NAD_CRD: &str = include_str!("../../../deploy/parts/06-network-attachment-crd.yaml");

/// Creates or updates the CustomResourceDefinitions of a multi-document
/// YAML text (server-side apply) and waits until the API server serves
/// each (its `Established` condition), so a watch started next finds it.
pub async fn apply_crds(c: &kube::Client, text: &str) -> Result<(), KubeError> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use serde::Deserialize;
    let api = kube::Api::<CustomResourceDefinition>::all(c.clone());
    let pp = kube::api::PatchParams::apply("podnet-lab").force();
    let mut names = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let v =
            serde_json::Value::deserialize(doc).map_err(|e| KubeError::Manifest(e.to_string()))?;
        let name = v["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if v["kind"] != "CustomResourceDefinition" {
            continue;
        }
        api.patch(&name, &pp, &kube::api::Patch::Apply(&v))
            .await
            .map_err(|e| KubeError::Api(format!("applying CRD {name}"), e))?;
        names.push(name);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    for name in names {
        loop {
            let crd = api
                .get(&name)
                .await
                .map_err(|e| KubeError::Api(format!("reading CRD {name}"), e))?;
            let established = crd
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if std::time::Instant::now() > deadline {
                return Err(KubeError::Manifest(format!(
                    "CRD {name} never became Established"
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// A loopback port nobody listens on right now. Another lab can take it
/// before our process binds it; [`ControlPlane::start`] retries then.
fn free_port() -> Result<u16, KubeError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| io("finding a free loopback port", e))
}

/// A Kubernetes client from a kubeconfig file.
pub async fn client(kubeconfig: &Path) -> Result<kube::Client, KubeError> {
    let bad = |e: String| KubeError::Kubeconfig(kubeconfig.display().to_string(), e);
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| bad(e.to_string()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| bad(e.to_string()))?;
    kube::Client::try_from(cfg).map_err(|e| KubeError::Api("building a client".into(), e))
}

/// Why a start attempt failed: a lost port race is worth another try.
enum Attempt {
    PortTaken(String),
    Failed(KubeError),
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and kube-controller-manager for `dir`
    /// (which must exist, with `logs/` and `pids/` in it) and returns when
    /// the apiserver's `/readyz` says ok. On failure whatever was started
    /// is stopped.
    pub async fn start(dir: &Path, peers: &Peers) -> Result<ControlPlane, KubeError> {
        Self::start_with(dir, peers, None, false).await
    }

    /// [`ControlPlane::start`] for a cluster of real kubelets (`plan`):
    /// the scheduler runs, the node lifecycle controller too, and the
    /// apiserver reaches the nodes through the egress proxy. With
    /// `dual_stack`, kube-controller-manager gives each node an IPv6
    /// podCIDR from [`CLUSTER_CIDR6`] too.
    pub async fn start_with(
        dir: &Path,
        peers: &Peers,
        plan: Option<&KubeletPlan>,
        dual_stack: bool,
    ) -> Result<ControlPlane, KubeError> {
        for d in ["logs", "pids", "kube"] {
            std::fs::create_dir_all(dir.join(d))
                .map_err(|e| io(format!("creating {}", dir.join(d).display()), e))?;
        }
        Pki::create(&dir.join("kube").join("pki"), plan)?;
        let mut last = String::new();
        for _ in 0..3 {
            match Self::attempt(dir, peers, plan, dual_stack).await {
                Ok(cp) => return Ok(cp),
                Err(Attempt::PortTaken(why)) => {
                    Self::kill(dir);
                    last = why;
                }
                Err(Attempt::Failed(e)) => {
                    Self::kill(dir);
                    return Err(e);
                }
            }
        }
        Err(KubeError::Start(format!(
            "control plane: lost the race for free ports three times ({last})"
        )))
    }

    async fn attempt(
        dir: &Path,
        peers: &Peers,
        plan: Option<&KubeletPlan>,
        dual_stack: bool,
    ) -> Result<ControlPlane, Attempt> {
        let f = Attempt::Failed;
        let kube_dir = dir.join("kube");
        let pki = kube_dir.join("pki");
        let etcd_url = Self::start_etcd(dir, peers).await?;
        let api_port = free_port().map_err(f)?;
        let audit_policy = kube_dir.join("audit-policy.yaml");
        write_file(&audit_policy, AUDIT_POLICY).map_err(f)?;
        let mut args = Self::apiserver_args(dir, &etcd_url, api_port, dual_stack);
        if let Some(plan) = plan {
            args.extend(kubelet_apiserver_args(&kube_dir, plan).map_err(f)?);
        }
        let api_pid = spawn(dir, "kube-apiserver", &peers.kube_apiserver, &args).map_err(f)?;
        let cp = ControlPlane {
            dir: dir.to_path_buf(),
            apiserver_port: api_port,
        };
        let server = cp.server();
        write_file(
            &cp.admin_kubeconfig(),
            &kubeconfig_text(&server, &pki, "admin"),
        )
        .map_err(f)?;
        let kcm_config = kube_dir.join("controller-manager.kubeconfig");
        write_file(
            &kcm_config,
            &kubeconfig_text(&server, &pki, "controller-manager"),
        )
        .map_err(f)?;
        cp.wait_ready(api_pid, Instant::now() + Duration::from_secs(120))
            .await?;

        let kcm_pid = spawn(
            dir,
            "kube-controller-manager",
            &peers.kube_controller_manager,
            &Self::controller_manager_args(&kube_dir, plan.is_some(), dual_stack),
        )
        .map_err(f)?;
        // It must at least survive its start (flags, kubeconfig).
        check_alive(dir, "kube-controller-manager", kcm_pid)?;
        if let Some(plan) = plan {
            start_scheduler(dir, &server, plan)?;
        }
        Ok(cp)
    }

    /// A fresh etcd on free loopback ports, healthy; its client URL.
    async fn start_etcd(dir: &Path, peers: &Peers) -> Result<String, Attempt> {
        let f = Attempt::Failed;
        let (etcd_port, peer_port) = (free_port().map_err(f)?, free_port().map_err(f)?);
        let etcd_data = dir.join("kube/etcd");
        let _ = std::fs::remove_dir_all(&etcd_data);
        let client_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_pid = spawn(
            dir,
            "etcd",
            &peers.etcd,
            &[
                "--name=lab".into(),
                format!("--data-dir={}", etcd_data.display()),
                format!("--listen-client-urls={client_url}"),
                format!("--advertise-client-urls={client_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=lab={peer_url}"),
                "--initial-cluster-state=new".into(),
            ],
        )
        .map_err(f)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !etcd_healthy(etcd_port) {
            check_alive(dir, "etcd", etcd_pid)?;
            if Instant::now() > deadline {
                return Err(f(KubeError::Start(format!(
                    "etcd did not become healthy; see {}",
                    dir.join("logs/etcd.log").display()
                ))));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(client_url)
    }

    /// kube-apiserver's flags (without the real-kubelet ones).
    fn apiserver_args(dir: &Path, etcd_url: &str, api_port: u16, dual_stack: bool) -> Vec<String> {
        let kube_dir = dir.join("kube");
        let pki = kube_dir.join("pki");
        let p = |s: &Path| s.display().to_string();
        vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            // What the `kubernetes` Service's endpoint says: the gateway,
            // where the lab forwards to this loopback port, so pods reach
            // the API through 10.96.0.1 as in a cluster.
            format!("--advertise-address={}", crate::gateway::gateway()),
            format!("--secure-port={api_port}"),
            format!("--cert-dir={}", p(&kube_dir.join("apiserver"))),
            format!("--tls-cert-file={}", p(&pki.join("apiserver.crt"))),
            format!("--tls-private-key-file={}", p(&pki.join("apiserver.key"))),
            format!("--client-ca-file={}", p(&pki.join("ca.crt"))),
            format!("--service-account-key-file={}", p(&pki.join("sa.pub"))),
            format!(
                "--service-account-signing-key-file={}",
                p(&pki.join("sa.key"))
            ),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-cluster-ip-range={}", service_cidrs(dual_stack)),
            "--service-node-port-range=30000-32767".into(),
            "--authorization-mode=Node,RBAC".into(),
            // As kubeadm clusters: network add-ons need privileged (init)
            // containers.
            "--allow-privileged=true".into(),
            // The lease reconciler (the default) publishes the advertised
            // address as the kubernetes Service's endpoint.
            "--endpoint-reconciler-type=lease".into(),
            "--profiling=false".into(),
            // Every request of podnet's ServiceAccounts, with its answer's
            // code: the oracle for "the RBAC is enough".
            format!(
                "--audit-policy-file={}",
                p(&kube_dir.join("audit-policy.yaml"))
            ),
            format!("--audit-log-path={}", p(&Self::audit_log_of(dir))),
            "--audit-log-format=json".into(),
            "--audit-log-mode=blocking".into(),
        ]
    }

    /// kube-controller-manager's flags; `kubelets`: real kubelets post
    /// node status, so the node lifecycle controller may run.
    fn controller_manager_args(kube_dir: &Path, kubelets: bool, dual_stack: bool) -> Vec<String> {
        let pki = kube_dir.join("pki");
        let p = |s: &Path| s.display().to_string();
        let cidrs: Vec<String> = match dual_stack {
            false => vec![
                format!("--cluster-cidr={CLUSTER_CIDR}"),
                "--node-cidr-mask-size=24".into(),
            ],
            true => vec![
                format!("--cluster-cidr={CLUSTER_CIDR},{CLUSTER_CIDR6}"),
                "--node-cidr-mask-size-ipv4=24".into(),
                "--node-cidr-mask-size-ipv6=64".into(),
            ],
        };
        let mut args = vec![
            format!(
                "--kubeconfig={}",
                p(&kube_dir.join("controller-manager.kubeconfig"))
            ),
            // No serving: nothing scrapes it, and a fixed port would
            // collide between parallel labs.
            "--secure-port=0".into(),
            "--leader-elect=false".into(),
            "--allocate-node-cidrs=true".into(),
            format!("--service-cluster-ip-range={}", service_cidrs(dual_stack)),
            // Without real kubelets no one posts node status: the
            // lifecycle controller would mark every node, and so every
            // pod, not ready after the grace period.
            match kubelets {
                true => "--controllers=*".into(),
                false => "--controllers=*,-node-lifecycle-controller".into(),
            },
            format!("--root-ca-file={}", p(&pki.join("ca.crt"))),
            format!(
                "--service-account-private-key-file={}",
                p(&pki.join("sa.key"))
            ),
            format!(
                "--flex-volume-plugin-dir={}",
                p(&kube_dir.join("flexvolume"))
            ),
            "--profiling=false".into(),
        ];
        args.extend(cidrs);
        args
    }

    /// The control plane recorded in `dir` (after [`ControlPlane::start`],
    /// possibly by another process).
    pub fn open(dir: &Path) -> Result<ControlPlane, KubeError> {
        let kc = dir.join("kubeconfig");
        let text =
            std::fs::read_to_string(&kc).map_err(|e| io(format!("reading {}", kc.display()), e))?;
        let port = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("server: https://127.0.0.1:"))
            .and_then(|p| p.trim().parse().ok())
            .ok_or_else(|| KubeError::Kubeconfig(kc.display().to_string(), "no server".into()))?;
        Ok(ControlPlane {
            dir: dir.to_path_buf(),
            apiserver_port: port,
        })
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server(&self) -> String {
        format!("https://{}", self.apiserver_addr())
    }

    /// `127.0.0.1:<port>`: also what a forwarder listens on inside a node
    /// namespace, so a kubeconfig works the same in both places.
    pub fn apiserver_addr(&self) -> String {
        format!("127.0.0.1:{}", self.apiserver_port)
    }

    /// The address the `kubernetes` Service's endpoint names: the lab's
    /// gateway at the apiserver's port, forwarded to [`Self::apiserver_addr`].
    pub fn advertised_addr(&self) -> String {
        format!("{}:{}", crate::gateway::gateway(), self.apiserver_port)
    }

    /// The API server's audit log: one JSON line per request that a
    /// podnet ServiceAccount made (`<dir>/logs/audit.log`).
    pub fn audit_log(&self) -> PathBuf {
        Self::audit_log_of(&self.dir)
    }

    fn audit_log_of(dir: &Path) -> PathBuf {
        dir.join("logs").join("audit.log")
    }

    /// The admin kubeconfig (`<dir>/kubeconfig`), for kubectl on this machine.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// Writes a kubeconfig for processes inside a namespace that has a
    /// forwarder to the apiserver (same address), acting as ServiceAccount
    /// `kube-system/<account>` with a token the API server issued (a
    /// TokenRequest, as a kubelet gets for a pod): the daemons run with
    /// exactly the rights `deploy/` grants them. With `node`, the token is
    /// bound to that Node (which must exist), so it carries the node's name
    /// (`authentication.kubernetes.io/node-name`) as a DaemonSet pod's
    /// token does, which the agent's admission policy checks.
    pub async fn write_service_account_kubeconfig(
        &self,
        c: &kube::Client,
        account: &str,
        node: Option<&str>,
        path: &Path,
    ) -> Result<(), KubeError> {
        use k8s_openapi::api::authentication::v1::{
            BoundObjectReference, TokenRequest, TokenRequestSpec,
        };
        use k8s_openapi::api::core::v1::{Node, ServiceAccount};
        let api: kube::Api<ServiceAccount> = kube::Api::namespaced(c.clone(), RBAC_NAMESPACE);
        let bound = match node {
            Some(name) => {
                let n = kube::Api::<Node>::all(c.clone())
                    .get(name)
                    .await
                    .map_err(|e| KubeError::Api(format!("reading Node {name}"), e))?;
                Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Node".into()),
                    name: Some(name.into()),
                    uid: n.metadata.uid,
                })
            }
            None => None,
        };
        let req = TokenRequest {
            spec: Some(TokenRequestSpec {
                // A lab may stay up for long; it is torn down, not renewed.
                expiration_seconds: Some(365 * 24 * 3600),
                bound_object_ref: bound,
                ..Default::default()
            }),
            ..Default::default()
        };
        let t = api
            .create_token_request(account, &Default::default(), &req)
            .await
            .map_err(|e| KubeError::Api(format!("a token for ServiceAccount {account}"), e))?;
        let token = t
            .status
            .and_then(|s| s.token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                KubeError::Kubeconfig(account.into(), "the TokenRequest gave no token".into())
            })?;
        write_secret(
            path,
            &token_kubeconfig_text(
                &self.server(),
                &self.dir.join("kube").join("pki"),
                account,
                &token,
            ),
        )
    }

    /// An admin client.
    pub async fn client(&self) -> Result<kube::Client, KubeError> {
        client(&self.admin_kubeconfig()).await
    }

    async fn wait_ready(&self, api_pid: u32, deadline: Instant) -> Result<(), Attempt> {
        let c = self.client().await.map_err(Attempt::Failed)?;
        loop {
            // Ask only once it listens: the client logs every refused connection.
            let listening = std::net::TcpStream::connect(self.apiserver_addr()).is_ok();
            let last = if listening {
                let req = http::Request::get("/readyz")
                    .body(Vec::new())
                    .expect("request");
                // The client logs every 500 as an error; while starting,
                // a 500 is the expected answer.
                use tracing::instrument::WithSubscriber;
                match c
                    .request_text(req)
                    .with_subscriber(tracing::subscriber::NoSubscriber::default())
                    .await
                {
                    Ok(body) if body.trim() == "ok" => return Ok(()),
                    Ok(body) => body,
                    Err(e) => e.to_string(),
                }
            } else {
                "not listening yet".to_string()
            };
            check_alive(&self.dir, "kube-apiserver", api_pid)?;
            if Instant::now() > deadline {
                return Err(Attempt::Failed(KubeError::Start(format!(
                    "kube-apiserver not ready ({last}); see {}",
                    self.dir.join("logs/kube-apiserver.log").display()
                ))));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills the API server (SIGKILL, as a crash or an OOM kill would),
    /// starts it again with the same command line and returns once its
    /// `/readyz` says ok: etcd, the controller manager and the data stay,
    /// and so do the clients, which must find it again by themselves.
    pub async fn restart_apiserver(&self) -> Result<(), KubeError> {
        let pid_file = self.dir.join("pids").join("kube-apiserver");
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| KubeError::Start(format!("no pid in {}", pid_file.display())))?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).map_err(|e| {
            io(
                format!("reading the command line of kube-apiserver (pid {pid})"),
                e,
            )
        })?;
        let mut argv = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned());
        let program = PathBuf::from(argv.next().unwrap_or_default());
        let args: Vec<String> = argv.collect();
        // SAFETY: plain kill(2) of the pid our pid file names.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while crate::process::alive(pid)
            || std::net::TcpStream::connect(self.apiserver_addr()).is_ok()
        {
            if Instant::now() > deadline {
                return Err(KubeError::Start(format!(
                    "kube-apiserver (pid {pid}) did not go away"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let pid = spawn(&self.dir, "kube-apiserver", &program, &args)?;
        self.wait_ready(pid, Instant::now() + Duration::from_secs(120))
            .await
            .map_err(|a| match a {
                Attempt::Failed(e) => e,
                Attempt::PortTaken(why) => KubeError::Start(why),
            })
    }

    fn kill(dir: &Path) {
        for role in ROLES.iter().rev() {
            let p = dir.join("pids").join(role);
            if let Some(pid) = std::fs::read_to_string(&p)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
            {
                crate::process::kill_wait(pid);
            }
            let _ = std::fs::remove_file(p);
        }
    }

    /// Stops the processes and removes the control plane's files (PKI,
    /// etcd data, kubeconfigs, logs); returns what it did.
    pub fn stop(&self) -> Vec<String> {
        let mut done = Vec::new();
        for role in ROLES.iter().rev() {
            let p = self.dir.join("pids").join(role);
            if let Some(pid) = std::fs::read_to_string(&p)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
            {
                if crate::process::kill_wait(pid) {
                    done.push(format!("stopped {role} (pid {pid})"));
                }
            }
            let _ = std::fs::remove_file(p);
            let _ = std::fs::remove_file(self.dir.join("logs").join(format!("{role}.log")));
        }
        // Whatever else still runs on our files (a pid file lost to a
        // crash mid-start): every process names a file under <dir>/kube.
        let marker = self.dir.join("kube").display().to_string();
        for pid in crate::process::processes_mentioning(&marker) {
            if crate::process::kill_wait(pid) {
                done.push(format!("stopped stray pid {pid}"));
            }
        }
        let _ = std::fs::remove_dir_all(self.dir.join("kube"));
        let _ = std::fs::remove_file(self.admin_kubeconfig());
        done
    }
}

/// kube-scheduler, for real kubelets (the lab places nothing itself then).
fn start_scheduler(dir: &Path, server: &str, plan: &KubeletPlan) -> Result<(), Attempt> {
    let f = Attempt::Failed;
    let kube_dir = dir.join("kube");
    let kc = kube_dir.join("scheduler.kubeconfig");
    let pki = kube_dir.join("pki");
    write_file(&kc, &kubeconfig_text(server, &pki, "kube-scheduler")).map_err(f)?;
    let kc = kc.display();
    let pid = spawn(
        dir,
        "kube-scheduler",
        &plan.kube_scheduler,
        &[
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={kc}"),
            // No serving port: nothing scrapes it, and labs would collide.
            "--bind-address=127.0.0.1".into(),
            "--secure-port=0".into(),
            "--leader-elect=false".into(),
        ],
    )
    .map_err(f)?;
    check_alive(dir, "kube-scheduler", pid)
}

/// The apiserver's flags for real kubelets: its client cert towards them,
/// NodeRestriction (a kubelet writes only its own Node and its pods), their
/// InternalIP first (the hostname `nodeN` resolves nowhere), and the egress
/// selector that sends cluster traffic through the lab's proxy.
fn kubelet_apiserver_args(kube_dir: &Path, plan: &KubeletPlan) -> Result<Vec<String>, KubeError> {
    let pki = kube_dir.join("pki");
    let egress = kube_dir.join("egress-selector.yaml");
    write_file(
        &egress,
        &format!(
            "apiVersion: apiserver.k8s.io/v1beta1\n\
             kind: EgressSelectorConfiguration\n\
             egressSelections:\n\
             - name: cluster\n  connection:\n    proxyProtocol: HTTPConnect\n    \
             transport:\n      uds:\n        udsName: {}\n",
            plan.egress_socket.display()
        ),
    )?;
    let p = |n: &str| pki.join(n).display().to_string();
    Ok(vec![
        format!(
            "--kubelet-client-certificate={}",
            p("apiserver-kubelet-client.crt")
        ),
        format!("--kubelet-client-key={}", p("apiserver-kubelet-client.key")),
        "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
        "--enable-admission-plugins=NodeRestriction".into(),
        format!("--egress-selector-config-file={}", egress.display()),
    ])
}

/// Writes a file that holds a secret (a bearer token, a private key):
/// readable by root only from its first byte. The file is created 0600
/// under a temporary name and renamed over `path`, so an older file's
/// looser mode never carries over and no reader sees it half written.
pub(crate) fn write_secret(path: &Path, text: &str) -> Result<(), KubeError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| io(format!("creating {}", d.display()), e))?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".podnet-tmp");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(format!("writing {}", path.display()), e)
        })
}

fn write_file(path: &Path, text: &str) -> Result<(), KubeError> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| io(format!("creating {}", d.display()), e))?;
    }
    std::fs::write(path, text).map_err(|e| io(format!("writing {}", path.display()), e))
}

fn spawn(dir: &Path, role: &str, program: &Path, args: &[String]) -> Result<u32, KubeError> {
    crate::process::spawn_logged(dir, role, Command::new(program).args(args), None)
        .map_err(|e| KubeError::Start(format!("starting {role}: {e}")))
}

/// Fails the attempt when `role` has exited; a lost port race (its log says
/// the address is in use) is worth another attempt.
fn check_alive(dir: &Path, role: &str, pid: u32) -> Result<(), Attempt> {
    if crate::process::alive(pid as i32) {
        return Ok(());
    }
    let log = dir.join("logs").join(format!("{role}.log"));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(15).collect();
    let tail = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
    if text.contains("address already in use") {
        return Err(Attempt::PortTaken(format!(
            "{role}: address already in use"
        )));
    }
    Err(Attempt::Failed(KubeError::Start(format!(
        "{role} exited; the end of {}:\n{tail}",
        log.display()
    ))))
}

/// etcd's `/health` over plain HTTP/1.0.
fn etcd_healthy(port: u16) -> bool {
    let addr = (IpAddr::V4(Ipv4Addr::LOCALHOST), port).into();
    HttpGet::new(Duration::from_secs(2))
        .connect_timeout(Duration::from_millis(200))
        .get(addr, "/health")
        .is_ok_and(|r| r.body.contains("\"health\":\"true\""))
}

#[cfg(test)]
mod tests {
    #[test]
    fn kubeconfig_points_at_the_pki() {
        let t = super::kubeconfig_text(
            "https://127.0.0.1:6443",
            std::path::Path::new("/x/pki"),
            "admin",
        );
        assert!(t.contains("server: https://127.0.0.1:6443\n"));
        assert!(t.contains("certificate-authority: /x/pki/ca.crt\n"));
        assert!(t.contains("client-key: /x/pki/admin.key\n"));
        assert!(t.contains("current-context: podnet-lab\n"));
    }

    #[test]
    fn pki_has_every_file() {
        let d = std::env::temp_dir().join(format!("pn-pki-{}", std::process::id()));
        super::Pki::create(&d, None).unwrap();
        for f in [
            "ca.crt",
            "apiserver.crt",
            "apiserver.key",
            "admin.crt",
            "admin.key",
            "controller-manager.crt",
            "sa.key",
            "sa.pub",
        ] {
            let t = std::fs::read_to_string(d.join(f)).unwrap();
            assert!(t.starts_with("-----BEGIN "), "{f}: {t}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
