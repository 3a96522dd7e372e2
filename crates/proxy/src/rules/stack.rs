//! [`Stack`]: one address family's table and the cluster's pod and Service
//! networks in it, with the family-specific fields and key types every
//! other part of the planner writes rules with, so no rule builder has to
//! branch on the family itself.

use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use podnet_nft::model::{Family, Field, KeyType};

/// One address family's table and the cluster's pod network in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stack {
    /// `Family::Ip` or `Family::Ip6`.
    pub family: Family,
    /// Pod traffic (from inside this range) keeps its source address; with
    /// no pod network in this family every client is external.
    pub cluster_cidr: Option<IpNet>,
    /// The Service CIDR of this family: traffic to an address in it that no
    /// Service holds is dropped on the node instead of following the
    /// default route out (kube-proxy's "Drop traffic to unallocated
    /// ClusterIPs").
    pub service_cidr: Option<IpNet>,
}

impl Stack {
    pub fn v4(cluster_cidr: Ipv4Net) -> Stack {
        Stack {
            family: Family::Ip,
            cluster_cidr: Some(IpNet::V4(cluster_cidr)),
            service_cidr: None,
        }
    }

    pub fn v6(cluster_cidr: Option<Ipv6Net>) -> Stack {
        Stack {
            family: Family::Ip6,
            cluster_cidr: cluster_cidr.map(IpNet::V6),
            service_cidr: None,
        }
    }

    /// The same stack with its Service CIDR (ignored when it is of the
    /// other family).
    pub fn with_service_cidr(mut self, cidr: Option<IpNet>) -> Stack {
        self.service_cidr = cidr.filter(|c| self.holds(&c.addr()));
        self
    }

    pub(super) fn is_v6(&self) -> bool {
        self.family == Family::Ip6
    }

    pub(super) fn saddr(&self) -> Field {
        if self.is_v6() {
            Field::Ip6Saddr
        } else {
            Field::IpSaddr
        }
    }

    pub(super) fn daddr(&self) -> Field {
        if self.is_v6() {
            Field::Ip6Daddr
        } else {
            Field::IpDaddr
        }
    }

    pub(super) fn addr_key(&self) -> KeyType {
        if self.is_v6() {
            KeyType::Ipv6Addr
        } else {
            KeyType::Ipv4Addr
        }
    }

    /// Whether an address belongs to this family.
    pub fn holds(&self, ip: &IpAddr) -> bool {
        ip.is_ipv6() == self.is_v6()
    }

    /// The EndpointSlice `addressType` this family reads.
    pub(super) fn address_type(&self) -> &'static str {
        if self.is_v6() {
            "IPv6"
        } else {
            "IPv4"
        }
    }

    pub(super) fn loopback(&self) -> IpNet {
        if self.is_v6() {
            "::1/128".parse().expect("static")
        } else {
            "127.0.0.0/8".parse().expect("static")
        }
    }

    /// The key types of a Service address map: address . protocol . port.
    pub(super) fn svc_key_types(&self) -> Vec<KeyType> {
        vec![self.addr_key(), KeyType::InetProto, KeyType::InetService]
    }

    pub(super) fn ct_orig_daddr(&self) -> Field {
        if self.is_v6() {
            Field::CtOrigIp6Daddr
        } else {
            Field::CtOrigIpDaddr
        }
    }

    /// Short name for metrics and logs.
    pub fn label(&self) -> &'static str {
        if self.is_v6() {
            "ipv6"
        } else {
            "ipv4"
        }
    }
}
