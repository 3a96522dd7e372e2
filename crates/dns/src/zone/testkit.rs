//! Objects and a fixture zone the zone's unit tests share: Services,
//! EndpointSlices and a small cluster covering every kind of Service.

use podnet_api::k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use podnet_api::k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointPort, EndpointSlice,
};
use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{Builder, Snapshot, ZoneConfig, SERVICE_NAME_LABEL};
use crate::wire::{name_to_string, Message, Record};

pub(super) fn svc(ns: &str, name: &str, ip: &str, ports: &[(&str, i32, &str)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some(ip.into()),
            cluster_ips: if ip == "None" || ip.is_empty() {
                None
            } else {
                Some(vec![ip.into()])
            },
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p, proto)| ServicePort {
                        name: (!n.is_empty()).then(|| n.to_string()),
                        port: *p,
                        protocol: Some(proto.to_string()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(super) fn external(ns: &str, name: &str, target: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ExternalName".into()),
            external_name: Some(target.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(super) fn slice(
    ns: &str,
    name: &str,
    svc: &str,
    eps: &[(&str, Option<&str>, bool)],
    ports: &[(&str, i32)],
) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some([(SERVICE_NAME_LABEL.to_string(), svc.to_string())].into()),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: Some(
            eps.iter()
                .map(|(ip, host, ready)| Endpoint {
                    addresses: vec![ip.to_string()],
                    hostname: host.map(String::from),
                    conditions: Some(EndpointConditions {
                        ready: Some(*ready),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
        ),
        ports: Some(
            ports
                .iter()
                .map(|(n, p)| EndpointPort {
                    name: Some(n.to_string()),
                    port: Some(*p),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

pub(super) fn fixture() -> Builder {
    let mut b = Builder::new(ZoneConfig::default());
    b.upsert_namespace("default");
    b.upsert_namespace("empty");
    b.upsert_service(&svc(
        "default",
        "kubernetes",
        "10.96.0.1",
        &[("https", 443, "TCP")],
    ));
    b.upsert_service(&svc(
        "shop",
        "web",
        "10.96.5.5",
        &[("http", 80, "TCP"), ("", 81, "TCP"), ("dns", 53, "UDP")],
    ));
    b.upsert_service(&svc("shop", "db", "None", &[("pg", 5432, "TCP")]));
    b.upsert_slice(&slice(
        "shop",
        "db-abc",
        "db",
        &[
            ("10.244.1.5", Some("db-0"), true),
            ("10.244.2.6", None, true),
            ("10.244.3.7", Some("db-2"), false),
        ],
        &[("pg", 5432)],
    ));
    b.upsert_service(&svc("shop", "nobody", "None", &[]));
    b.upsert_service(&external("shop", "ext", "www.Example.com"));
    b.upsert_service(&external("shop", "inner", "web.shop.svc.cluster.local"));
    b.upsert_service(&svc("shop", "pending", "", &[]));
    b
}

pub(super) fn ask(s: &Snapshot, name: &str, t: u16) -> Message {
    s.answer(name, t)
        .unwrap_or_else(|| panic!("{name} was forwarded"))
}

pub(super) fn names(rs: &[Record]) -> Vec<String> {
    rs.iter().map(|r| name_to_string(&r.name)).collect()
}
