//! `podnet get`'s columns for the L7 kinds (Secret, Ingress,
//! IngressClass and the Gateway API's), as kubectl prints them with the
//! Gateway API CRDs' printer columns.

use podnet_api::gateway::{Gateway, GatewayClass, HTTPRoute};
use podnet_api::k8s_openapi::api::core::v1::Secret;
use podnet_api::k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::table::Row;

fn status_of(conds: &[Condition], ty: &str) -> String {
    conds
        .iter()
        .find(|c| c.type_ == ty)
        .map(|c| c.status.clone())
        .unwrap_or_else(|| "Unknown".into())
}

fn or_star(v: Vec<String>) -> String {
    match v.is_empty() {
        true => "*".into(),
        false => v.join(","),
    }
}

pub(super) fn secret_row(s: &Secret, name: String, age: String) -> Row {
    let n = s.data.as_ref().map_or(0, |d| d.len()) + s.string_data.as_ref().map_or(0, |d| d.len());
    (
        vec!["NAME", "TYPE", "DATA", "AGE"],
        vec![
            name,
            s.type_.clone().unwrap_or_else(|| "Opaque".into()),
            n.to_string(),
            age,
        ],
    )
}

pub(super) fn ingress_row(i: &Ingress, name: String, age: String) -> Row {
    let spec = i.spec.clone().unwrap_or_default();
    let hosts = spec
        .rules
        .iter()
        .flatten()
        .filter_map(|r| r.host.clone())
        .collect();
    let addrs: Vec<String> = i
        .status
        .iter()
        .flat_map(|s| s.load_balancer.iter())
        .flat_map(|lb| lb.ingress.iter().flatten())
        .filter_map(|a| a.ip.clone().or_else(|| a.hostname.clone()))
        .collect();
    let ports = match spec.tls.as_ref().is_some_and(|t| !t.is_empty()) {
        true => "80, 443",
        false => "80",
    };
    (
        vec!["NAME", "CLASS", "HOSTS", "ADDRESS", "PORTS", "AGE"],
        vec![
            name,
            spec.ingress_class_name.unwrap_or_else(|| "<none>".into()),
            or_star(hosts),
            addrs.join(","),
            ports.into(),
            age,
        ],
    )
}

pub(super) fn ingress_class_row(c: &IngressClass, name: String, age: String) -> Row {
    let spec = c.spec.clone().unwrap_or_default();
    (
        vec!["NAME", "CONTROLLER", "PARAMETERS", "AGE"],
        vec![
            name,
            spec.controller.unwrap_or_default(),
            "<none>".into(),
            age,
        ],
    )
}

pub(super) fn gateway_class_row(c: &GatewayClass, name: String, age: String) -> Row {
    let conds = c
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or(&[]);
    (
        vec!["NAME", "CONTROLLER", "ACCEPTED", "AGE"],
        vec![
            name,
            c.spec.controller_name.clone(),
            status_of(conds, "Accepted"),
            age,
        ],
    )
}

pub(super) fn gateway_row(g: &Gateway, name: String, age: String) -> Row {
    let st = g.status.clone().unwrap_or_default();
    let addr = st
        .addresses
        .first()
        .map(|a| a.value.clone())
        .unwrap_or_default();
    (
        vec!["NAME", "CLASS", "ADDRESS", "PROGRAMMED", "AGE"],
        vec![
            name,
            g.spec.gateway_class_name.clone(),
            addr,
            status_of(&st.conditions, "Programmed"),
            age,
        ],
    )
}

pub(super) fn http_route_row(r: &HTTPRoute, name: String, age: String) -> Row {
    (
        vec!["NAME", "HOSTNAMES", "AGE"],
        vec![name, or_star(r.spec.hostnames.clone()), age],
    )
}

pub(super) fn plain_row(name: String, age: String) -> Row {
    (vec!["NAME", "AGE"], vec![name, age])
}
