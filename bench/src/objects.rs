//! The API objects the Kubernetes-mode benchmarks fill a cluster with
//! (`kube-bench`, `kubeproxy-bench`, `coredns-bench`): one shape, so their
//! figures describe the same Services.

use std::net::IpAddr;

use anyhow::{Context, Result};
use podnet_api::k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use podnet_api::k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointPort, EndpointSlice,
};
use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A ClusterIP Service `ns/name` with one TCP port 80 named `http`.
pub fn http_service(ns: &str, name: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The EndpointSlice of Service `ns/s<i>`: one ready endpoint on port
/// 8080, at an address of the cluster network derived from `i`.
pub fn one_endpoint_slice(ns: &str, i: usize) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(format!("s{i}-1")),
            namespace: Some(ns.into()),
            labels: Some([("kubernetes.io/service-name".to_string(), format!("s{i}"))].into()),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: Some(vec![Endpoint {
            addresses: vec![format!(
                "10.244.{}.{}",
                200 + i / 60_000,
                2 + (i / 250) % 240
            )],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
    }
}

/// The ClusterIP the API server gave a created Service.
pub fn cluster_ip(s: &Service) -> Result<IpAddr> {
    s.spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .context("the apiserver gave no clusterIP")?
        .parse()
        .context("clusterIP")
}
