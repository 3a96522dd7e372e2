//! The BGP configuration kinds, with Calico's names so a Calico
//! configuration reads the same: `podnet.io/v1 BGPConfiguration` (the
//! cluster's AS, the node-to-node mesh, which Service ranges are
//! advertised, BFD timers, L2 announcement of LoadBalancer addresses) and
//! `podnet.io/v1 BGPPeer` (an outside router, for every node or some).
//!
//! Route reflectors: a Node labelled [`ROUTE_REFLECTOR_LABEL`]`=true` is
//! one; the other nodes peer with the reflectors instead of with every
//! node (Calico's `routeReflectorClusterID` and per-peer reflector
//! settings are not modelled). Peer passwords are out of scope.
//!
//! Only the shape and the rules a single object can break live here; what
//! needs a node's view (a peer that is the node itself) is the agent's.

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

use crate::FieldError;

/// The name of the cluster-wide BGPConfiguration.
pub const DEFAULT_NAME: &str = "default";
/// The cluster's AS when the configuration names none (Calico's default,
/// the first private 16-bit AS).
pub const DEFAULT_AS: u32 = 64512;
/// A Node with this label set to `true` is a route reflector.
pub const ROUTE_REFLECTOR_LABEL: &str = "podnet.io/route-reflector";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct BGPConfiguration {
    #[serde(rename = "apiVersion", default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: BGPConfigurationSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct BGPConfigurationSpec {
    /// The nodes' AS ([`DEFAULT_AS`] when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_number: Option<u32>,
    /// Whether every node peers with every other (default true); turned
    /// off when route reflectors or outside peers carry the routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_to_node_mesh_enabled: Option<bool>,
    /// Service ClusterIP ranges the nodes advertise.
    #[serde(
        rename = "serviceClusterIPs",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub service_cluster_ips: Vec<CidrEntry>,
    /// Service externalIP ranges the nodes advertise.
    #[serde(
        rename = "serviceExternalIPs",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub service_external_ips: Vec<CidrEntry>,
    /// LoadBalancer address ranges the nodes advertise.
    #[serde(
        rename = "serviceLoadBalancerIPs",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub service_load_balancer_ips: Vec<CidrEntry>,
    /// BFD timers for peers that ask for BFD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bfd: Option<BfdSettings>,
    /// Answering ARP/NDP for LoadBalancer addresses on the nodes' links,
    /// for networks without BGP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2_announcement: Option<L2Announcement>,
}

impl BGPConfigurationSpec {
    pub fn as_number(&self) -> u32 {
        self.as_number.unwrap_or(DEFAULT_AS)
    }

    pub fn node_to_node_mesh_enabled(&self) -> bool {
        self.node_to_node_mesh_enabled.unwrap_or(true)
    }
}

/// One advertised range: `{cidr: 10.96.0.0/12}`, as Calico writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CidrEntry {
    pub cidr: String,
}

/// BFD timers (RFC 5880): how often we want to receive and send control
/// packets, and how many may be missed before the session is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct BfdSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_rx_ms: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tx_ms: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiplier: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct L2Announcement {
    #[serde(default)]
    pub enabled: bool,
    /// The links to announce on (every link with a route to the address
    /// when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct BGPPeer {
    #[serde(rename = "apiVersion", default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: BGPPeerSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct BGPPeerSpec {
    /// The peer's address, IPv4 or IPv6.
    #[serde(rename = "peerIP", default)]
    pub peer_ip: String,
    /// The peer's AS (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_number: Option<u32>,
    /// Only this node peers; absent: every node (or those
    /// `nodeSelector` picks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The nodes (by their labels) that peer; absent: every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Run BFD on the session, with the BGPConfiguration's timers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bfd: Option<bool>,
}

/// Why an AS number may not be used, if it is reserved.
pub fn reserved_as(asn: u32) -> Option<String> {
    let why = match asn {
        0 => "",
        23456 => " (AS_TRANS, RFC 6793)",
        65535 | 4294967295 => " (RFC 7300)",
        _ => return None,
    };
    Some(format!("AS {asn} is reserved{why}"))
}

fn as_number(errs: &mut Vec<FieldError>, field: &str, asn: u32) {
    if let Some(msg) = reserved_as(asn) {
        errs.push(FieldError {
            field: field.into(),
            msg,
        });
    }
}

fn cidrs(errs: &mut Vec<FieldError>, field: &str, list: &[CidrEntry]) {
    for (i, c) in list.iter().enumerate() {
        if c.cidr.parse::<IpNet>().is_err() {
            errs.push(FieldError {
                field: format!("{field}[{i}].cidr"),
                msg: format!("{:?} is not a valid CIDR", c.cidr),
            });
        }
    }
}

/// A Linux interface name: 1 to 15 bytes, no '/', ':' or whitespace.
fn is_ifname(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s != "."
        && s != ".."
        && !s
            .bytes()
            .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace())
}

impl BGPConfiguration {
    pub fn validate(&self) -> Vec<FieldError> {
        let s = &self.spec;
        let mut e = Vec::new();
        if let Some(a) = s.as_number {
            as_number(&mut e, "spec.asNumber", a);
        }
        cidrs(&mut e, "spec.serviceClusterIPs", &s.service_cluster_ips);
        cidrs(&mut e, "spec.serviceExternalIPs", &s.service_external_ips);
        cidrs(
            &mut e,
            "spec.serviceLoadBalancerIPs",
            &s.service_load_balancer_ips,
        );
        if let Some(b) = &s.bfd {
            for (f, v) in [("minRxMs", b.min_rx_ms), ("minTxMs", b.min_tx_ms)] {
                if v == Some(0) {
                    e.push(FieldError {
                        field: format!("spec.bfd.{f}"),
                        msg: "must be at least 1".into(),
                    });
                }
            }
            if let Some(m) = b.multiplier.filter(|m| !(1..=255).contains(m)) {
                e.push(FieldError {
                    field: "spec.bfd.multiplier".into(),
                    msg: format!("{m} must be between 1 and 255"),
                });
            }
        }
        for (i, name) in s
            .l2_announcement
            .iter()
            .flat_map(|l| l.interfaces.iter())
            .enumerate()
        {
            if !is_ifname(name) {
                e.push(FieldError {
                    field: format!("spec.l2Announcement.interfaces[{i}]"),
                    msg: format!("{name:?} is not a valid interface name"),
                });
            }
        }
        e
    }
}

/// Why an address cannot be a BGP peer, if it cannot.
fn unusable_peer(ip: IpAddr) -> Option<&'static str> {
    if ip.is_unspecified() {
        Some("is the unspecified address")
    } else if ip.is_loopback() {
        Some("is a loopback address")
    } else if ip.is_multicast() {
        Some("is a multicast address")
    } else if ip == IpAddr::V4(std::net::Ipv4Addr::BROADCAST) {
        Some("is the broadcast address")
    } else {
        None
    }
}

impl BGPPeer {
    pub fn validate(&self) -> Vec<FieldError> {
        let s = &self.spec;
        let mut e = Vec::new();
        let mut add = |field: &str, msg: String| {
            e.push(FieldError {
                field: field.into(),
                msg,
            })
        };
        match s.peer_ip.parse::<IpAddr>() {
            _ if s.peer_ip.is_empty() => add("spec.peerIP", "required".into()),
            Ok(ip) => {
                if let Some(why) = unusable_peer(ip) {
                    add(
                        "spec.peerIP",
                        format!("{ip} {why}: it cannot be a BGP peer"),
                    );
                }
            }
            Err(_) => add(
                "spec.peerIP",
                format!("{:?} is not a valid IP address", s.peer_ip),
            ),
        }
        if let Some(n) = &s.node {
            if !crate::validate::is_dns1123_subdomain(n) {
                add("spec.node", format!("{n:?} is not a valid node name"));
            }
            if s.node_selector.is_some() {
                add(
                    "spec.nodeSelector",
                    "may not be combined with spec.node".into(),
                );
            }
        }
        match s.as_number {
            None => e.push(FieldError {
                field: "spec.asNumber".into(),
                msg: "required".into(),
            }),
            Some(a) => as_number(&mut e, "spec.asNumber", a),
        }
        if let Some(sel) = &s.node_selector {
            crate::validate::selector(&mut e, "spec.nodeSelector", sel);
        }
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn peer(spec: serde_json::Value) -> Vec<String> {
        let p: BGPPeer =
            serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap();
        p.validate().iter().map(|e| e.to_string()).collect()
    }

    fn config(spec: serde_json::Value) -> Vec<String> {
        let c: BGPConfiguration =
            serde_json::from_value(json!({"metadata": {"name": "default"}, "spec": spec})).unwrap();
        c.validate().iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn configuration_defaults_and_names() {
        let c: BGPConfiguration = serde_json::from_value(json!({"metadata": {"name": "default"},
            "spec": {"serviceLoadBalancerIPs": [{"cidr": "192.0.2.0/24"}],
                     "bfd": {"minRxMs": 300, "minTxMs": 300, "multiplier": 3},
                     "l2Announcement": {"enabled": true, "interfaces": ["eth0"]}}}))
        .unwrap();
        assert_eq!(c.spec.as_number(), 64512);
        assert!(c.spec.node_to_node_mesh_enabled());
        assert_eq!(c.spec.service_load_balancer_ips[0].cidr, "192.0.2.0/24");
        assert_eq!(c.spec.bfd.unwrap().multiplier, Some(3));
        assert!(c.validate().is_empty());
        let v = serde_json::to_value(&c.spec).unwrap();
        assert_eq!(v["serviceLoadBalancerIPs"][0]["cidr"], "192.0.2.0/24");
        assert_eq!(v["l2Announcement"]["interfaces"][0], "eth0");
        assert!(v.get("serviceClusterIPs").is_none());
    }

    #[test]
    fn configuration_errors_name_the_field() {
        assert_eq!(
            config(json!({"asNumber": 0})),
            ["spec.asNumber: AS 0 is reserved"]
        );
        assert_eq!(
            config(json!({"asNumber": 23456})),
            ["spec.asNumber: AS 23456 is reserved (AS_TRANS, RFC 6793)"]
        );
        assert_eq!(
            config(json!({"asNumber": 65535})),
            ["spec.asNumber: AS 65535 is reserved (RFC 7300)"]
        );
        assert_eq!(
            config(json!({"serviceExternalIPs": [{"cidr": "10.0.0.0/8"}, {"cidr": "x"}]})),
            ["spec.serviceExternalIPs[1].cidr: \"x\" is not a valid CIDR"]
        );
        assert_eq!(
            config(json!({"bfd": {"minRxMs": 0, "multiplier": 300}})),
            [
                "spec.bfd.minRxMs: must be at least 1",
                "spec.bfd.multiplier: 300 must be between 1 and 255"
            ]
        );
        assert_eq!(
            config(json!({"l2Announcement": {"enabled": true, "interfaces": ["eth0", "a/b"]}})),
            ["spec.l2Announcement.interfaces[1]: \"a/b\" is not a valid interface name"]
        );
    }

    #[test]
    fn peers() {
        assert!(peer(json!({"peerIP": "192.0.2.1", "asNumber": 65001})).is_empty());
        assert!(peer(json!({"peerIP": "2001:db8::1", "asNumber": 4200000000u32, "node": "node-1", "bfd": true})).is_empty());
        assert!(peer(json!({"peerIP": "192.0.2.1", "asNumber": 65001,
            "nodeSelector": {"matchLabels": {"rack": "a"}}}))
        .is_empty());
        for (ip, why) in [
            ("0.0.0.0", "0.0.0.0 is the unspecified address"),
            ("::", ":: is the unspecified address"),
            ("127.0.0.1", "127.0.0.1 is a loopback address"),
            ("::1", "::1 is a loopback address"),
            ("224.0.0.5", "224.0.0.5 is a multicast address"),
            ("ff02::5", "ff02::5 is a multicast address"),
        ] {
            assert_eq!(
                peer(json!({"peerIP": ip, "asNumber": 65001})),
                [format!("spec.peerIP: {why}: it cannot be a BGP peer")]
            );
        }
        assert_eq!(
            peer(json!({"peerIP": "router", "asNumber": 0})),
            [
                "spec.peerIP: \"router\" is not a valid IP address",
                "spec.asNumber: AS 0 is reserved"
            ]
        );
        assert_eq!(
            peer(json!({})),
            ["spec.peerIP: required", "spec.asNumber: required"]
        );
        assert_eq!(
            peer(json!({"peerIP": "192.0.2.1", "asNumber": 1, "node": "n",
                "nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}})),
            [
                "spec.nodeSelector: may not be combined with spec.node",
                "spec.nodeSelector.matchExpressions[0].operator: \"Is\" is not a valid selector operator"
            ]
        );
    }
}
