//! `podnet get`'s table output: kubectl's columns for each kind, and the
//! aligned printing of rows.
//!
//! Kept apart from apply/get/delete because it is pure formatting: one
//! function per kind builds that kind's header and row the way kubectl
//! shows them (`-o wide` adds kubectl's extra columns), so a kind's output
//! can be read and changed without reading the others.

use podnet_api::bgp::{BGPConfiguration, BGPPeer};
use podnet_api::k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_api::k8s_openapi::api::networking::v1::NetworkPolicy;
use podnet_api::netconfig::NetworkConfig;
use podnet_api::pool::IPAddressPool;
use podnet_api::Object;

use super::table_l7 as l7;

/// A table's header and one object's cells, in the same order.
pub(super) type Row = (Vec<&'static str>, Vec<String>);

fn age(o: &Object) -> String {
    let Some(t) = &o.meta().creation_timestamp else {
        return "<unknown>".into();
    };
    let secs = (podnet_store::objects::now().as_second() - t.0.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// `k=v,k=v` as kubectl prints a label map.
fn labels(m: &std::collections::BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn or_none(s: Option<String>) -> String {
    s.unwrap_or_else(|| "<none>".into())
}

fn table_row(o: &Object, wide: bool) -> Row {
    let name = o.name().to_string();
    let age = age(o);
    match o {
        Object::Service(s) => service_row(s, name, age, wide),
        Object::Pod(p) => pod_row(p, name, age, wide),
        Object::Node(n) => node_row(n, name, age, wide),
        Object::Namespace(n) => namespace_row(n, name, age),
        Object::EndpointSlice(s) => endpoint_slice_row(s, name, age, wide),
        Object::NetworkPolicy(p) => network_policy_row(p, name, age),
        Object::NetworkConfig(c) => network_config_row(c, name, age),
        Object::IPAddressPool(p) => ip_address_pool_row(p, name, age),
        Object::BGPConfiguration(c) => bgp_configuration_row(c, name, age),
        Object::BGPPeer(p) => bgp_peer_row(p, name, age),
        Object::Secret(s) => l7::secret_row(s, name, age),
        Object::Ingress(i) => l7::ingress_row(i, name, age),
        Object::IngressClass(c) => l7::ingress_class_row(c, name, age),
        Object::GatewayClass(c) => l7::gateway_class_row(c, name, age),
        Object::Gateway(g) => l7::gateway_row(g, name, age),
        Object::HTTPRoute(r) => l7::http_route_row(r, name, age),
        Object::ReferenceGrant(_) | Object::NetworkAttachmentDefinition(_) => {
            l7::plain_row(name, age)
        }
    }
}

fn service_row(s: &Service, name: String, age: String, wide: bool) -> Row {
    let spec = s.spec.clone().unwrap_or_default();
    let ty = spec.type_.clone().unwrap_or_else(|| "ClusterIP".into());
    let cip = match ty.as_str() {
        "ExternalName" => "<none>".to_string(),
        _ => spec
            .cluster_ip
            .clone()
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| "<pending>".into()),
    };
    let ext = service_external(s, &ty);
    let ports = service_ports(s);
    let mut cols = vec![
        "NAME",
        "TYPE",
        "CLUSTER-IP",
        "EXTERNAL-IP",
        "PORT(S)",
        "AGE",
    ];
    let mut row = vec![
        name,
        ty,
        cip,
        ext,
        if ports.is_empty() {
            "<none>".into()
        } else {
            ports
        },
        age,
    ];
    if wide {
        cols.push("SELECTOR");
        row.push(or_none(spec.selector.as_ref().map(labels)));
    }
    (cols, row)
}

/// EXTERNAL-IP: the external name, or the external and load-balancer IPs.
fn service_external(s: &Service, ty: &str) -> String {
    let spec = s.spec.clone().unwrap_or_default();
    if ty == "ExternalName" {
        return spec.external_name.clone().unwrap_or_default();
    }
    let mut ext: Vec<String> = spec.external_ips.clone().unwrap_or_default();
    for i in s
        .status
        .iter()
        .flat_map(|st| st.load_balancer.iter())
        .flat_map(|lb| lb.ingress.iter().flatten())
    {
        ext.extend(i.ip.clone());
    }
    if !ext.is_empty() {
        ext.join(",")
    } else if ty == "LoadBalancer" {
        "<pending>".into()
    } else {
        "<none>".into()
    }
}

/// PORT(S): `port[:nodePort]/proto`, comma-separated.
fn service_ports(s: &Service) -> String {
    s.spec
        .iter()
        .flat_map(|spec| spec.ports.iter().flatten())
        .map(|p| {
            let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
            match p.node_port {
                Some(np) => format!("{}:{np}/{proto}", p.port),
                None => format!("{}/{proto}", p.port),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn pod_row(p: &Pod, name: String, age: String, wide: bool) -> Row {
    let st = p.status.clone().unwrap_or_default();
    let ready = st
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let n = p
        .spec
        .as_ref()
        .map(|s| s.containers.len())
        .unwrap_or(0)
        .max(1);
    let mut cols = vec!["NAME", "READY", "STATUS", "RESTARTS", "AGE"];
    let mut row = vec![
        name,
        format!("{}/{n}", if ready { n } else { 0 }),
        if p.metadata.deletion_timestamp.is_some() {
            "Terminating".into()
        } else {
            st.phase.clone().unwrap_or_else(|| "Pending".into())
        },
        "0".into(),
        age,
    ];
    if wide {
        cols.extend(["IP", "NODE"]);
        row.push(or_none(st.pod_ip.clone()));
        row.push(or_none(p.spec.as_ref().and_then(|s| s.node_name.clone())));
    }
    (cols, row)
}

fn node_row(nd: &Node, name: String, age: String, wide: bool) -> Row {
    let ready = nd
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let mut cols = vec!["NAME", "STATUS", "ROLES", "AGE", "VERSION"];
    let mut row = vec![
        name,
        if ready { "Ready" } else { "NotReady" }.into(),
        "<none>".into(),
        age,
        "podnet".into(),
    ];
    if wide {
        cols.extend(["INTERNAL-IP", "POD-CIDR"]);
        row.push(or_none(
            nd.status
                .iter()
                .flat_map(|s| s.addresses.iter().flatten())
                .find(|a| a.type_ == "InternalIP")
                .map(|a| a.address.clone()),
        ));
        row.push(or_none(nd.spec.as_ref().and_then(|s| s.pod_cidr.clone())));
    }
    (cols, row)
}

fn namespace_row(n: &Namespace, name: String, age: String) -> Row {
    (
        vec!["NAME", "STATUS", "AGE"],
        vec![
            name,
            n.status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "Active".into()),
            age,
        ],
    )
}

fn endpoint_slice_row(s: &EndpointSlice, name: String, age: String, wide: bool) -> Row {
    let ports = s
        .ports
        .iter()
        .flatten()
        .filter_map(|p| p.port.map(|x| x.to_string()))
        .collect::<Vec<_>>()
        .join(",");
    let eps: Vec<String> = s
        .endpoints
        .iter()
        .flatten()
        .flat_map(|e| e.addresses.iter().cloned())
        .collect();
    let eps = if eps.is_empty() {
        "<unset>".into()
    } else if eps.len() > 3 && !wide {
        format!("{} + {} more...", eps[..3].join(","), eps.len() - 3)
    } else {
        eps.join(",")
    };
    (
        vec!["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"],
        vec![
            name,
            s.address_type.clone(),
            if ports.is_empty() {
                "<unset>".into()
            } else {
                ports
            },
            eps,
            age,
        ],
    )
}

fn network_policy_row(p: &NetworkPolicy, name: String, age: String) -> Row {
    let sel = p
        .spec
        .as_ref()
        .and_then(|s| s.pod_selector.as_ref())
        .and_then(|s| s.match_labels.as_ref())
        .map(labels)
        .filter(|s| !s.is_empty());
    (
        vec!["NAME", "POD-SELECTOR", "AGE"],
        vec![name, or_none(sel), age],
    )
}

fn network_config_row(c: &NetworkConfig, name: String, age: String) -> Row {
    let (net, len, be) = match &c.resolve() {
        Ok(r) => (
            r.network.to_string(),
            r.subnet_len.to_string(),
            format!("{:?}", r.backend).to_ascii_lowercase(),
        ),
        Err((f, m)) => (format!("invalid: {f}: {m}"), String::new(), String::new()),
    };
    (
        vec!["NAME", "NETWORK", "SUBNETLEN", "BACKEND", "AGE"],
        vec![name, net, len, be, age],
    )
}

/// The columns the CRD's `additionalPrinterColumns` give kubectl
/// (deploy/parts/05-crds.yaml), addresses comma-separated.
fn ip_address_pool_row(p: &IPAddressPool, name: String, age: String) -> Row {
    (
        vec!["NAME", "AUTO ASSIGN", "AVOID BUGGY IPS", "ADDRESSES", "AGE"],
        vec![
            name,
            p.spec.auto_assign().to_string(),
            p.spec.avoid_buggy_ips().to_string(),
            p.spec.addresses.join(","),
            age,
        ],
    )
}

fn bgp_configuration_row(c: &BGPConfiguration, name: String, age: String) -> Row {
    (
        vec!["NAME", "AS", "MESH", "AGE"],
        vec![
            name,
            c.spec.as_number().to_string(),
            c.spec.node_to_node_mesh_enabled().to_string(),
            age,
        ],
    )
}

fn bgp_peer_row(p: &BGPPeer, name: String, age: String) -> Row {
    let s = &p.spec;
    (
        vec!["NAME", "PEER IP", "AS", "NODE", "AGE"],
        vec![
            name,
            s.peer_ip.clone(),
            or_none(s.as_number.map(|a| a.to_string())),
            s.node.clone().unwrap_or_else(|| "<all>".into()),
            age,
        ],
    )
}

pub(super) fn print_table(objs: &[Object], wide: bool, with_ns: bool) {
    if objs.is_empty() {
        return;
    }
    let mut header: Vec<String> = Vec::new();
    let mut rows: Vec<Vec<String>> = Vec::new();
    for o in objs {
        let (cols, mut row) = table_row(o, wide);
        if with_ns {
            row.insert(0, o.namespace().unwrap_or_default().to_string());
        }
        if header.is_empty() {
            header = cols.iter().map(|s| s.to_string()).collect();
            if with_ns {
                header.insert(0, "NAMESPACE".into());
            }
        }
        rows.push(row);
    }
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}   ", w = widths[i]));
            }
        }
        println!("{}", s.trim_end());
    };
    line(&header);
    for r in &rows {
        line(r);
    }
}
