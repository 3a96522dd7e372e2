//! podnet's cluster network configuration: a cluster-scoped object with
//! flannel's net-conf.json fields (`Network`, `SubnetLen`, `SubnetMin`,
//! `SubnetMax`, `Backend`), so a flannel configuration pastes in as the spec.

use ipnet::{IpNet, Ipv4Net};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

pub const API_VERSION: &str = "podnet.io/v1";
pub const DEFAULT_NETWORK: &str = "10.244.0.0/16";
pub const DEFAULT_SUBNET_LEN: u8 = 24;
pub const DEFAULT_SERVICE_CIDR: &str = "10.96.0.0/12";
pub const DEFAULT_NODE_PORT_RANGE: (u16, u16) = (30000, 32767);
pub const DEFAULT_ZONE: &str = "cluster.local";
pub const DEFAULT_DNS_IP: &str = "10.96.0.10";
/// The name of the one NetworkConfig object the agents read.
pub const DEFAULT_NAME: &str = "default";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct NetworkConfig {
    #[serde(rename = "apiVersion", default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: NetworkSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct NetworkSpec {
    #[serde(rename = "Network", default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// flannel's `IPv6Network`: the pods' IPv6 range. With `EnableIPv6`
    /// every pod gets an address from it too (dual-stack); without, it
    /// only tells the IPv6 service proxy which sources are pods.
    #[serde(
        rename = "IPv6Network",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ipv6_network: Option<String>,
    /// flannel's `EnableIPv6`: dual-stack pods.
    #[serde(
        rename = "EnableIPv6",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub enable_ipv6: Option<bool>,
    /// flannel's `IPv6SubnetLen`: each node's IPv6 pod subnet (/64 by
    /// default).
    #[serde(
        rename = "IPv6SubnetLen",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ipv6_subnet_len: Option<u8>,
    #[serde(rename = "SubnetLen", default, skip_serializing_if = "Option::is_none")]
    pub subnet_len: Option<u8>,
    #[serde(rename = "SubnetMin", default, skip_serializing_if = "Option::is_none")]
    pub subnet_min: Option<String>,
    #[serde(rename = "SubnetMax", default, skip_serializing_if = "Option::is_none")]
    pub subnet_max: Option<String>,
    #[serde(rename = "Backend", default)]
    pub backend: Backend,
    /// Pod traffic between nodes carried in WireGuard's protocol (the
    /// agent's userspace tunnel, UDP 51820), whatever the backend type
    /// but bgp, which has no tunnel.
    #[serde(rename = "Encrypt", default, skip_serializing_if = "Option::is_none")]
    pub encrypt: Option<bool>,
    /// podnet extensions: cluster-wide settings the controller, the CLI's
    /// validation, the proxy and DNS share (Kubernetes defaults).
    #[serde(
        rename = "ServiceCIDR",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub service_cidr: Option<String>,
    #[serde(
        rename = "NodePortRange",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub node_port_range: Option<String>,
    #[serde(
        rename = "ClusterDomain",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cluster_domain: Option<String>,
    #[serde(
        rename = "DNSServiceIP",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub dns_service_ip: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Backend {
    #[serde(rename = "Type", default, skip_serializing_if = "Option::is_none")]
    pub backend_type: Option<String>,
    #[serde(rename = "VNI", default, skip_serializing_if = "Option::is_none")]
    pub vni: Option<u32>,
    #[serde(rename = "Port", default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(
        rename = "DirectRouting",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub direct_routing: Option<bool>,
}

/// The backends a node can use to reach other nodes' pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendType {
    Vxlan,
    HostGw,
    Udp,
    /// No tunnel: each node's pod CIDR spread by BGP (Calico's way).
    Bgp,
}

impl BackendType {
    pub fn parse(s: &str) -> Option<BackendType> {
        match s.to_ascii_lowercase().as_str() {
            "vxlan" => Some(BackendType::Vxlan),
            "host-gw" | "hostgw" => Some(BackendType::HostGw),
            "udp" => Some(BackendType::Udp),
            "bgp" => Some(BackendType::Bgp),
            _ => None,
        }
    }

    /// The name flannel's configs and node annotations use.
    pub fn name(self) -> &'static str {
        match self {
            BackendType::Vxlan => "vxlan",
            BackendType::HostGw => "host-gw",
            BackendType::Udp => "udp",
            BackendType::Bgp => "bgp",
        }
    }
}

/// The configuration with every default applied and every field parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The primary Service CIDR (single-stack Services' family).
    pub service_cidr: IpNet,
    /// The other family's, on a cluster with dual-stack Services.
    pub service_cidr_secondary: Option<IpNet>,
    pub node_port_range: (u16, u16),
    pub cluster_domain: String,
    pub dns_service_ip: std::net::IpAddr,
    pub network: Ipv4Net,
    pub ipv6_network: Option<ipnet::Ipv6Net>,
    pub subnet_len: u8,
    pub subnet_min: Ipv4Net,
    pub subnet_max: Ipv4Net,
    pub backend: BackendType,
    pub vni: u32,
    pub port: u16,
    pub direct_routing: bool,
    pub encrypt: bool,
    /// Dual-stack pods: each node's IPv6 subnet length (None: IPv4 pods).
    pub ipv6_subnet_len: Option<u8>,
}

impl Resolved {
    pub fn service_cidrs(&self) -> crate::ipfamily::ServiceCidrs {
        crate::ipfamily::ServiceCidrs {
            primary: self.service_cidr,
            secondary: self.service_cidr_secondary,
        }
    }

    /// The IPv6 pod subnet that goes with IPv4 node subnet `v4` when the
    /// cluster is dual-stack (standalone mode: the same index in
    /// `IPv6Network`, so every node computes every other node's; in
    /// Kubernetes mode the Node's podCIDRs say it).
    pub fn ipv6_subnet_of(&self, v4: Ipv4Net) -> Option<ipnet::Ipv6Net> {
        let (net6, len6) = (self.ipv6_network?, self.ipv6_subnet_len?);
        let k = (u32::from(v4.network()) - u32::from(self.network.network()))
            >> (32 - u32::from(self.subnet_len));
        let base = u128::from(net6.network()) + (u128::from(k) << (128 - u32::from(len6)));
        ipnet::Ipv6Net::new(std::net::Ipv6Addr::from(base), len6).ok()
    }
}

/// A resolution error: the field's path and what is wrong with it.
type FieldErr = (String, String);

impl NetworkConfig {
    /// Applies defaults (flannel's) and checks every field; errors name it.
    pub fn resolve(&self) -> Result<Resolved, (String, String)> {
        let s = &self.spec;
        let network = network(s)?;
        let subnet_len = subnet_len(s, network)?;
        let (subnet_min, subnet_max) = subnet_range(s, network, subnet_len)?;
        let (backend, vni, port) = backend(&s.backend)?;
        let (service_cidr, service_cidr_secondary) = service_cidr(s)?;
        let node_port_range = node_port_range(s)?;
        let dns_service_ip = dns_service_ip(s, service_cidr)?;
        let ipv6_network = ipv6_network(s)?;
        let encrypt = s.encrypt.unwrap_or(false);
        let ipv6_subnet_len = dual_stack(s, ipv6_network, network, subnet_len)?;
        if encrypt && backend == BackendType::Bgp {
            return Err((
                "spec.Encrypt".into(),
                "not with the bgp backend: it routes pod traffic unencapsulated; use vxlan, host-gw or udp".into(),
            ));
        }
        Ok(Resolved {
            service_cidr,
            service_cidr_secondary,
            node_port_range,
            cluster_domain: s
                .cluster_domain
                .clone()
                .unwrap_or_else(|| DEFAULT_ZONE.to_string()),
            dns_service_ip,
            network,
            ipv6_network,
            subnet_len,
            subnet_min,
            subnet_max,
            backend,
            vni,
            port,
            direct_routing: s.backend.direct_routing.unwrap_or(false),
            encrypt,
            ipv6_subnet_len,
        })
    }
}

/// `Network`: the IPv4 cluster network, truncated to its prefix.
fn network(s: &NetworkSpec) -> Result<Ipv4Net, FieldErr> {
    let net_s = s
        .network
        .clone()
        .unwrap_or_else(|| DEFAULT_NETWORK.to_string());
    let network: IpNet = net_s.parse().map_err(|_| {
        (
            "spec.Network".to_string(),
            format!("{net_s:?} is not a CIDR"),
        )
    })?;
    let IpNet::V4(network) = network.trunc() else {
        return Err((
            "spec.Network".into(),
            "only IPv4 cluster networks are supported".into(),
        ));
    };
    Ok(network)
}

/// `SubnetLen`: each node's subnet, /24 by default (or 4 bits longer than
/// a network already that small).
fn subnet_len(s: &NetworkSpec, network: Ipv4Net) -> Result<u8, FieldErr> {
    let subnet_len = s.subnet_len.unwrap_or(if network.prefix_len() < 24 {
        DEFAULT_SUBNET_LEN
    } else {
        network.prefix_len() + 4
    });
    if subnet_len <= network.prefix_len() || subnet_len > 30 {
        return Err((
            "spec.SubnetLen".into(),
            format!(
                "{subnet_len} must be longer than the network's /{} and at most 30",
                network.prefix_len()
            ),
        ));
    }
    Ok(subnet_len)
}

/// `SubnetMin` and `SubnetMax`: the node subnets leases come from, by
/// default all but the network's first (as flannel skips it).
fn subnet_range(
    s: &NetworkSpec,
    network: Ipv4Net,
    subnet_len: u8,
) -> Result<(Ipv4Net, Ipv4Net), FieldErr> {
    let all: Vec<Ipv4Net> = network
        .subnets(subnet_len)
        .map(|i| i.collect())
        .unwrap_or_default();
    // flannel skips the network's first subnet by default.
    let first = *all.get(1).or(all.first()).expect("at least one subnet");
    let last = *all.last().expect("at least one subnet");
    let subnet_min = subnet_bound("spec.SubnetMin", &s.subnet_min, first, network, subnet_len)?;
    let subnet_max = subnet_bound("spec.SubnetMax", &s.subnet_max, last, network, subnet_len)?;
    if subnet_min.network() > subnet_max.network() {
        return Err((
            "spec.SubnetMin".into(),
            format!("{subnet_min} is after SubnetMax {subnet_max}"),
        ));
    }
    Ok((subnet_min, subnet_max))
}

/// One end of the subnet range: the subnet holding the given address,
/// which must lie in the network.
fn subnet_bound(
    field: &str,
    v: &Option<String>,
    dflt: Ipv4Net,
    network: Ipv4Net,
    subnet_len: u8,
) -> Result<Ipv4Net, FieldErr> {
    match v {
        None => Ok(dflt),
        Some(t) => {
            let ip: std::net::Ipv4Addr = t
                .split('/')
                .next()
                .unwrap_or_default()
                .parse()
                .map_err(|_| (field.to_string(), format!("{t:?} is not an IPv4 address")))?;
            let n = Ipv4Net::new(ip, subnet_len).expect("valid prefix").trunc();
            if !network.contains(&n) {
                return Err((
                    field.to_string(),
                    format!("{t} is outside Network {network}"),
                ));
            }
            Ok(n)
        }
    }
}

/// `Backend`: its type (vxlan by default), VNI and port (the type's
/// default: 8472 for VXLAN, 8285 for the UDP tunnel).
fn backend(b: &Backend) -> Result<(BackendType, u32, u16), FieldErr> {
    let bt = b.backend_type.clone().unwrap_or_else(|| "vxlan".into());
    let backend = BackendType::parse(&bt).ok_or_else(|| {
        (
            "spec.Backend.Type".to_string(),
            format!("unknown backend {bt:?} (vxlan, host-gw, udp, bgp)"),
        )
    })?;
    let vni = b.vni.unwrap_or(1);
    if vni == 0 || vni > 0xff_ffff {
        return Err((
            "spec.Backend.VNI".into(),
            format!("{vni} out of range 1-16777215"),
        ));
    }
    let port = b.port.unwrap_or(match backend {
        BackendType::Udp => 8285,
        _ => 8472,
    });
    if port == 0 {
        return Err(("spec.Backend.Port".into(), "0 is not a port".into()));
    }
    Ok((backend, vni, port))
}

/// `ServiceCIDR`: one CIDR, or two of different families separated by a
/// comma (kube-apiserver's `--service-cluster-ip-range`; the first is
/// the primary), each truncated to its prefix.
fn service_cidr(s: &NetworkSpec) -> Result<(IpNet, Option<IpNet>), FieldErr> {
    let sc = s
        .service_cidr
        .clone()
        .unwrap_or_else(|| DEFAULT_SERVICE_CIDR.to_string());
    let bad = |why: String| ("spec.ServiceCIDR".to_string(), why);
    let nets = sc
        .split(',')
        .map(|c| {
            c.trim()
                .parse::<IpNet>()
                .map(|n| n.trunc())
                .map_err(|_| bad(format!("{:?} is not a CIDR", c.trim())))
        })
        .collect::<Result<Vec<_>, _>>()?;
    match nets[..] {
        [one] => Ok((one, None)),
        [a, b] if a.addr().is_ipv4() != b.addr().is_ipv4() => Ok((a, Some(b))),
        [_, _] => Err(bad(format!(
            "{sc:?}: two CIDRs must be one IPv4 and one IPv6"
        ))),
        _ => Err(bad(format!("{sc:?}: at most two CIDRs, one per family"))),
    }
}

/// `NodePortRange`: `FIRST-LAST`, not starting at 0.
fn node_port_range(s: &NetworkSpec) -> Result<(u16, u16), FieldErr> {
    let Some(r) = &s.node_port_range else {
        return Ok(DEFAULT_NODE_PORT_RANGE);
    };
    let bad = || {
        (
            "spec.NodePortRange".to_string(),
            format!("{r:?} is not a range like 30000-32767"),
        )
    };
    let (a, b) = r.split_once('-').ok_or_else(bad)?;
    let (a, b): (u16, u16) = (
        a.trim().parse().map_err(|_| bad())?,
        b.trim().parse().map_err(|_| bad())?,
    );
    if a == 0 || a > b {
        return Err(bad());
    }
    Ok((a, b))
}

/// `DNSServiceIP`: the cluster DNS Service's address, in the service CIDR.
fn dns_service_ip(s: &NetworkSpec, service_cidr: IpNet) -> Result<std::net::IpAddr, FieldErr> {
    let dns_s = s
        .dns_service_ip
        .clone()
        .unwrap_or_else(|| DEFAULT_DNS_IP.to_string());
    let dns_service_ip: std::net::IpAddr = dns_s.parse().map_err(|_| {
        (
            "spec.DNSServiceIP".to_string(),
            format!("{dns_s:?} is not an IP address"),
        )
    })?;
    if !service_cidr.contains(&dns_service_ip) {
        return Err((
            "spec.DNSServiceIP".into(),
            format!("{dns_service_ip} is outside ServiceCIDR {service_cidr}"),
        ));
    }
    Ok(dns_service_ip)
}

/// `EnableIPv6` with `IPv6Network` and `IPv6SubnetLen` (64 by default):
/// the IPv6 network must hold as many node subnets as `Network` does.
fn dual_stack(
    s: &NetworkSpec,
    net6: Option<ipnet::Ipv6Net>,
    network: Ipv4Net,
    subnet_len: u8,
) -> Result<Option<u8>, FieldErr> {
    if !s.enable_ipv6.unwrap_or(false) {
        return Ok(None);
    }
    let Some(net6) = net6 else {
        return Err((
            "spec.IPv6Network".into(),
            "required with EnableIPv6 (the pods' IPv6 range)".into(),
        ));
    };
    let len6 = s.ipv6_subnet_len.unwrap_or(64);
    let need = subnet_len - network.prefix_len();
    if len6 > 124 || len6 <= net6.prefix_len() || len6 - net6.prefix_len() < need {
        return Err((
            "spec.IPv6SubnetLen".into(),
            format!(
                "/{len6} subnets of IPv6Network {net6}: it must hold the {} node subnets of Network {network} (at most /{} and at most /124)",
                1u64 << need,
                u32::from(net6.prefix_len()) + u32::from(need)
            ),
        ));
    }
    Ok(Some(len6))
}

/// `IPv6Network`, for dual-stack pods (none by default).
fn ipv6_network(s: &NetworkSpec) -> Result<Option<ipnet::Ipv6Net>, FieldErr> {
    match &s.ipv6_network {
        None => Ok(None),
        Some(t) => match t.parse::<IpNet>() {
            Ok(IpNet::V6(n)) => Ok(Some(n.trunc())),
            _ => Err((
                "spec.IPv6Network".into(),
                format!("{t:?} is not an IPv6 CIDR"),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(spec: serde_json::Value) -> NetworkConfig {
        serde_json::from_value(
            serde_json::json!({"apiVersion": API_VERSION, "kind": "NetworkConfig",
            "metadata": {"name": "default"}, "spec": spec}),
        )
        .unwrap()
    }

    #[test]
    fn flannel_defaults() {
        let r = cfg(serde_json::json!({})).resolve().unwrap();
        assert_eq!(r.network.to_string(), "10.244.0.0/16");
        assert_eq!(r.subnet_len, 24);
        assert_eq!(r.subnet_min.to_string(), "10.244.1.0/24");
        assert_eq!(r.subnet_max.to_string(), "10.244.255.0/24");
        assert_eq!((r.backend, r.vni, r.port), (BackendType::Vxlan, 1, 8472));
        let r = cfg(serde_json::json!({"Backend": {"Type": "udp"}}))
            .resolve()
            .unwrap();
        assert_eq!(r.port, 8285);
    }

    #[test]
    fn dual_stack_gives_each_node_subnet_its_ipv6_twin() {
        let r = cfg(serde_json::json!({"EnableIPv6": true, "IPv6Network": "fd00:10:244::/56"}))
            .resolve()
            .unwrap();
        assert_eq!(r.ipv6_subnet_len, Some(64));
        let six = |v4: &str| r.ipv6_subnet_of(v4.parse().unwrap()).unwrap().to_string();
        assert_eq!(six("10.244.1.0/24"), "fd00:10:244:1::/64");
        assert_eq!(six("10.244.202.0/24"), "fd00:10:244:ca::/64");
        // IPv6Network alone (the service proxy's pod range): IPv4 pods.
        let r = cfg(serde_json::json!({"IPv6Network": "fd00:10:244::/56"}))
            .resolve()
            .unwrap();
        assert_eq!(
            (
                r.ipv6_subnet_len,
                r.ipv6_subnet_of("10.244.1.0/24".parse().unwrap())
            ),
            (None, None)
        );
        for (spec, field, why) in [
            (
                serde_json::json!({"EnableIPv6": true}),
                "spec.IPv6Network",
                "required with EnableIPv6",
            ),
            (
                serde_json::json!({"EnableIPv6": true, "IPv6Network": "fd00::/60"}),
                "spec.IPv6SubnetLen",
                "must hold the 256 node subnets",
            ),
            (
                serde_json::json!({"EnableIPv6": true, "IPv6Network": "fd00::/56", "IPv6SubnetLen": 126}),
                "spec.IPv6SubnetLen",
                "at most /124",
            ),
        ] {
            let e = cfg(spec.clone()).resolve().unwrap_err();
            assert_eq!(e.0, field, "{spec}");
            assert!(e.1.contains(why), "{spec}: {}", e.1);
        }
    }

    #[test]
    fn bad_fields_are_named() {
        let e = cfg(serde_json::json!({"Network": "10.0.0.0/33"}))
            .resolve()
            .unwrap_err();
        assert_eq!(e.0, "spec.Network");
        let e = cfg(serde_json::json!({"SubnetLen": 8}))
            .resolve()
            .unwrap_err();
        assert_eq!(e.0, "spec.SubnetLen");
        let e = cfg(serde_json::json!({"Backend": {"Type": "gre"}}))
            .resolve()
            .unwrap_err();
        assert_eq!(e.0, "spec.Backend.Type");
        let e = cfg(serde_json::json!({"SubnetMin": "192.168.0.0"}))
            .resolve()
            .unwrap_err();
        assert_eq!(e.0, "spec.SubnetMin");
    }
}
