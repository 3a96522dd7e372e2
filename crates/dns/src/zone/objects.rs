//! What DNS keeps of each Kubernetes object, and how it is read from the
//! API types: a Service becomes its kind, ports and publishing policy; an
//! EndpointSlice becomes its Service's name, endpoint addresses and ports.
//! Everything else in the objects is dropped here, so the builder stores
//! (and compares) only what changes records.
//!
//! Endpoint readiness is decided by `podnet_api::endpoints::Conditions`
//! (what an endpoint's conditions say, with the API's defaults, as the
//! proxy reads them) and [`SvcInfo::publishes`] (whether the Service
//! publishes an endpoint in that state).

use std::net::IpAddr;

use podnet_api::k8s_openapi::api::core::v1::{Service, ServiceSpec};
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;

use super::names::valid_label;
use crate::wire;

const TOLERATE_UNREADY: &str = "service.alpha.kubernetes.io/tolerate-unready-endpoints";

/// (namespace, name) of a Service or an EndpointSlice.
pub(super) type SvcKey = (String, String);

/// A port: (name, empty when unnamed; lowercase protocol; port), for SRV
/// records.
pub(super) type NamedPort = (Box<str>, Box<str>, u16);

#[derive(Debug, Clone, PartialEq)]
pub(super) enum SvcKind {
    /// ClusterIP not allocated yet: no records until it is.
    Pending,
    ClusterIp(Box<[IpAddr]>),
    Headless,
    ExternalName(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct SvcInfo {
    pub(super) kind: SvcKind,
    /// Named ports: (name, protocol, port).
    pub(super) ports: Box<[NamedPort]>,
    pub(super) publish_not_ready: bool,
}

/// One endpoint address (an endpoint with two addresses is two of these).
/// Kept small: a cluster holds tens of thousands.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Ep {
    pub(super) addr: IpAddr,
    pub(super) hostname: Option<Box<str>>,
    pub(super) ready: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct SliceInfo {
    pub(super) service: Option<Box<str>>,
    pub(super) endpoints: Box<[Ep]>,
    pub(super) ports: Box<[NamedPort]>,
}

/// The namespace an object lives in (`default` when it names none).
fn namespace_of(ns: &Option<String>) -> String {
    ns.clone().unwrap_or_else(|| "default".into())
}

impl SvcInfo {
    /// What DNS keeps of a Service, under its key; None for a Service
    /// without a name.
    pub(super) fn from_service(svc: &Service) -> Option<(SvcKey, SvcInfo)> {
        let ns = namespace_of(&svc.metadata.namespace);
        let name = svc.metadata.name.clone()?;
        let spec = svc.spec.clone().unwrap_or_default();
        let ports = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|p| named_port(p.name.as_deref(), p.protocol.as_deref(), Some(p.port)))
            .collect();
        let info = SvcInfo {
            kind: service_kind(&spec),
            ports,
            publish_not_ready: publishes_not_ready(svc, &spec),
        };
        Some(((ns, name), info))
    }

    /// Whether this Service publishes `ep`: a ready endpoint always, any
    /// other when the Service asks for not-ready addresses.
    pub(super) fn publishes(&self, ep: &Ep) -> bool {
        ep.ready || self.publish_not_ready
    }
}

/// ExternalName, headless, or ClusterIP (pending until one is allocated).
fn service_kind(spec: &ServiceSpec) -> SvcKind {
    if spec.type_.as_deref() == Some("ExternalName") {
        match spec
            .external_name
            .as_deref()
            .and_then(|n| wire::name_from_str(n).ok())
        {
            Some(w) if w.len() > 1 => SvcKind::ExternalName(w),
            _ => SvcKind::Pending,
        }
    } else if spec.cluster_ip.as_deref() == Some("None") {
        SvcKind::Headless
    } else {
        let mut ips: Vec<IpAddr> = spec
            .cluster_ips
            .iter()
            .flatten()
            .chain(spec.cluster_ip.iter())
            .filter_map(|s| s.parse().ok())
            .collect();
        ips.sort();
        ips.dedup();
        if ips.is_empty() {
            SvcKind::Pending
        } else {
            SvcKind::ClusterIp(ips.into())
        }
    }
}

/// Whether a Service publishes endpoints that are not ready: the spec's
/// `publishNotReadyAddresses`, or the older annotation.
fn publishes_not_ready(svc: &Service, spec: &ServiceSpec) -> bool {
    let tolerate = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TOLERATE_UNREADY))
        .map(|v| v == "true")
        .unwrap_or(false);
    spec.publish_not_ready_addresses.unwrap_or(false) || tolerate
}

impl SliceInfo {
    /// What DNS keeps of an EndpointSlice, under the slice's own key; None
    /// for a slice without a name. FQDN slices keep no endpoints.
    pub(super) fn from_slice(s: &EndpointSlice) -> Option<(SvcKey, SliceInfo)> {
        let ns = namespace_of(&s.metadata.namespace);
        let name = s.metadata.name.clone()?;
        let service: Option<Box<str>> = podnet_api::endpoints::service_name(s).map(Into::into);
        let fqdn = s.address_type.eq_ignore_ascii_case("FQDN");
        let endpoints = s
            .endpoints
            .iter()
            .flatten()
            .filter(|_| !fqdn)
            .flat_map(|e| {
                let hostname: Option<Box<str>> = e
                    .hostname
                    .as_deref()
                    .filter(|h| valid_label(h))
                    .map(Into::into);
                let ready = podnet_api::endpoints::Conditions::of(e).ready;
                e.addresses
                    .iter()
                    .filter_map(|a| a.parse().ok())
                    .map(move |addr| Ep {
                        addr,
                        hostname: hostname.clone(),
                        ready,
                    })
            })
            .collect();
        let ports = s
            .ports
            .iter()
            .flatten()
            .filter_map(|p| named_port(p.name.as_deref(), p.protocol.as_deref(), p.port))
            .collect();
        let info = SliceInfo {
            service,
            endpoints,
            ports,
        };
        Some(((ns, name), info))
    }
}

/// A port as SRV records use it: (name, protocol, port), both lowercased.
/// An unnamed port has an empty name: it has no `_<port>._<proto>` record
/// (spec 2.3.2), but the SRV records on the Service name itself (an
/// extension CoreDNS has, and clients use) list every port, as CoreDNS's
/// do. Out-of-range ports have none.
fn named_port(name: Option<&str>, protocol: Option<&str>, port: Option<i32>) -> Option<NamedPort> {
    let n = name.unwrap_or_default();
    let port = u16::try_from(port?).ok()?;
    Some((
        n.to_ascii_lowercase().into_boxed_str(),
        protocol
            .unwrap_or("TCP")
            .to_ascii_lowercase()
            .into_boxed_str(),
        port,
    ))
}
