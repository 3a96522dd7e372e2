//! Several networks per pod, the way Multus users already write them: a
//! `NetworkAttachmentDefinition` (`k8s.cni.cncf.io/v1`, namespaced; its
//! annotations carry the `k8s.v1.cni.cncf.io/` prefix)
//! holds a CNI configuration; a pod asks for attachments with the
//! annotation [`NETWORKS`] and reads what it got in [`NETWORK_STATUS`].
//! This module is the pure part: the kind, the annotation's two forms
//! (a comma list of `[namespace/]name[@interface]`, or a JSON list of
//! selection elements) and the status's shape. The default network stays
//! podnet's; these are the extra ones (`net1`, `net2`, ...).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const GROUP: &str = "k8s.cni.cncf.io";
pub const API_VERSION: &str = "k8s.cni.cncf.io/v1";
/// The pod annotation that asks for attachments.
pub const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
/// The pod annotation the attachments' results are written to.
pub const NETWORK_STATUS: &str = "k8s.v1.cni.cncf.io/network-status";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct NetworkAttachmentDefinition {
    #[serde(rename = "apiVersion", default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: NetworkAttachmentDefinitionSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct NetworkAttachmentDefinitionSpec {
    /// A CNI configuration (one plugin, or a list with `plugins`), as JSON
    /// text.
    #[serde(default)]
    pub config: String,
}

impl k8s_openapi::Resource for NetworkAttachmentDefinition {
    const API_VERSION: &'static str = API_VERSION;
    const GROUP: &'static str = GROUP;
    const KIND: &'static str = "NetworkAttachmentDefinition";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "network-attachment-definitions";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::ListableResource for NetworkAttachmentDefinition {
    const LIST_KIND: &'static str = "NetworkAttachmentDefinitionList";
}

impl k8s_openapi::Metadata for NetworkAttachmentDefinition {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl NetworkAttachmentDefinition {
    /// The CNI configuration, checked: a JSON object naming a plugin
    /// (`type`) or a list of them (`plugins`). An empty one (Multus would
    /// then read a file on the node) is refused: podnet reads only what
    /// the object holds.
    pub fn cni_config(&self) -> Result<Value, String> {
        let c = self.spec.config.trim();
        if c.is_empty() {
            return Err("required: a CNI configuration (podnet reads no files on the node)".into());
        }
        let v: Value =
            serde_json::from_str(c).map_err(|e| format!("not a JSON CNI configuration: {e}"))?;
        let plugin = v
            .get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| !t.is_empty());
        let list = match v.get("plugins") {
            None => false,
            Some(Value::Array(p)) if !p.is_empty() => true,
            Some(_) => return Err("\"plugins\" must be a non-empty list".into()),
        };
        if !plugin && !list {
            return Err("a CNI configuration needs \"type\" or \"plugins\"".into());
        }
        Ok(v)
    }
}

/// One network a pod asks for (Multus's network selection element).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Selection {
    pub name: String,
    /// Defaults to the pod's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The interface name in the pod; defaults to `net<position>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// Addresses asked for (the `ips` capability).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    /// A MAC asked for (the `mac` capability).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Extra `args.cni` keys for the plugins.
    #[serde(rename = "cni-args", default, skip_serializing_if = "Option::is_none")]
    pub cni_args: Option<serde_json::Map<String, Value>>,
}

/// A selection resolved for one pod: its namespace and interface filled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub namespace: String,
    pub interface: String,
    pub selection: Selection,
}

impl Resolved {
    /// `namespace/name`, as network-status names it.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.selection.name)
    }
}

/// Parses the [`NETWORKS`] annotation of a pod in `pod_ns`. Interfaces
/// not named are `net1`, `net2`, ... by position; a name used twice, or
/// one that is no valid interface name (or `eth0`, the default
/// network's), is refused, as is a malformed entry.
pub fn parse_networks(annotation: &str, pod_ns: &str) -> Result<Vec<Resolved>, String> {
    let text = annotation.trim();
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let selections: Vec<Selection> = if text.starts_with('[') {
        serde_json::from_str(text)
            .map_err(|e| format!("{NETWORKS}: not a list of networks: {e}"))?
    } else {
        text.split(',')
            .map(|item| parse_short(item.trim()))
            .collect::<Result<_, _>>()?
    };
    let mut out: Vec<Resolved> = Vec::new();
    for (i, s) in selections.into_iter().enumerate() {
        check_name(&s.name, "network name")?;
        let namespace = s
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| pod_ns.to_string());
        check_name(&namespace, "namespace")?;
        let interface = s
            .interface
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| format!("net{}", i + 1));
        check_interface(&interface)?;
        if out.iter().any(|r| r.interface == interface) {
            return Err(format!(
                "{NETWORKS}: interface {interface:?} is asked for twice"
            ));
        }
        out.push(Resolved {
            namespace,
            interface,
            selection: s,
        });
    }
    Ok(out)
}

/// `[namespace/]name[@interface]`.
fn parse_short(item: &str) -> Result<Selection, String> {
    let bad = || format!("{NETWORKS}: {item:?} is not [namespace/]name[@interface]");
    let (rest, interface) = match item.split_once('@') {
        Some((r, i)) if !i.contains('@') => (r, Some(i.to_string())),
        Some(_) => return Err(bad()),
        None => (item, None),
    };
    let (namespace, name) = match rest.split_once('/') {
        Some((n, m)) if !m.contains('/') => (Some(n.to_string()), m),
        Some(_) => return Err(bad()),
        None => (None, rest),
    };
    if name.is_empty() || namespace.as_deref() == Some("") || interface.as_deref() == Some("") {
        return Err(bad());
    }
    Ok(Selection {
        name: name.to_string(),
        namespace,
        interface,
        ..Default::default()
    })
}

/// A DNS-1123 subdomain, as object names and namespaces are.
fn check_name(s: &str, what: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!("{NETWORKS}: invalid {what} {s:?}"))
    }
}

/// What the kernel takes as a link name, and not the default network's.
fn check_interface(s: &str) -> Result<(), String> {
    let ok = s.len() <= 15
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':');
    if !ok {
        return Err(format!("{NETWORKS}: invalid interface name {s:?}"));
    }
    if s == "eth0" || s == "lo" {
        return Err(format!(
            "{NETWORKS}: interface {s:?} is the pod's own; name another"
        ));
    }
    Ok(())
}

/// One entry of [`NETWORK_STATUS`], as Multus writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct NetworkStatus {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub interface: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Value>,
}

/// The annotation's text (indented JSON, as Multus writes it).
pub fn status_text(entries: &[NetworkStatus]) -> String {
    serde_json::to_string_pretty(entries).expect("json")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(r: &[Resolved]) -> Vec<(String, String)> {
        r.iter()
            .map(|r| (r.full_name(), r.interface.clone()))
            .collect()
    }

    #[test]
    fn the_short_form() {
        let r = parse_networks("macvlan-a, other/b@fast0,c", "shop").unwrap();
        let want = [
            ("shop/macvlan-a", "net1"),
            ("other/b", "fast0"),
            ("shop/c", "net3"),
        ];
        let want: Vec<_> = want
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(names(&r), want);
        assert!(parse_networks("  ", "shop").unwrap().is_empty());
    }

    #[test]
    fn the_json_form() {
        let a = r#"[{"name":"a","interface":"data0","ips":["10.1.0.5/24"],"mac":"02:00:00:00:00:05"},
                    {"name":"b","namespace":"infra","cni-args":{"x":"y"}}]"#;
        let r = parse_networks(a, "shop").unwrap();
        assert_eq!(
            names(&r),
            vec![
                ("shop/a".into(), "data0".into()),
                ("infra/b".into(), "net2".into())
            ]
        );
        assert_eq!(r[0].selection.ips, vec!["10.1.0.5/24".to_string()]);
        assert_eq!(r[0].selection.mac.as_deref(), Some("02:00:00:00:00:05"));
        assert_eq!(r[1].selection.cni_args.as_ref().unwrap()["x"], "y");
    }

    #[test]
    fn what_is_refused_says_why() {
        for (a, why) in [
            ("a/b/c", "is not [namespace/]name[@interface]"),
            ("a@b@c", "is not [namespace/]name[@interface]"),
            ("/a", "is not [namespace/]name[@interface]"),
            ("a@", "is not [namespace/]name[@interface]"),
            ("a,", "is not [namespace/]name[@interface]"),
            ("A_B", "invalid network name \"A_B\""),
            ("a@eth0", "interface \"eth0\" is the pod's own"),
            ("a@x/y", "invalid interface name \"x/y\""),
            ("a@averyveryverylongname", "invalid interface name"),
            ("a@d0,b@d0", "interface \"d0\" is asked for twice"),
            ("[{\"name\": 5}]", "not a list of networks"),
            (
                "[{\"name\":\"a\",\"namespace\":\"Bad\"}]",
                "invalid namespace \"Bad\"",
            ),
        ] {
            let e = parse_networks(a, "shop").unwrap_err();
            assert!(e.contains(why), "{a}: {e}");
            assert!(e.starts_with(NETWORKS), "{e}");
        }
    }

    #[test]
    fn a_definition_holds_a_cni_configuration() {
        let nad = |c: &str| NetworkAttachmentDefinition {
            spec: NetworkAttachmentDefinitionSpec { config: c.into() },
            ..Default::default()
        };
        nad(r#"{"cniVersion":"1.0.0","type":"macvlan","master":"eth0"}"#)
            .cni_config()
            .unwrap();
        nad(r#"{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"macvlan"}]}"#)
            .cni_config()
            .unwrap();
        for (c, why) in [
            ("", "required"),
            ("{", "not a JSON CNI configuration"),
            (r#"{"name":"x"}"#, "needs \"type\" or \"plugins\""),
            (r#"{"plugins":[]}"#, "\"plugins\" must be a non-empty list"),
            (
                r#"{"type":"macvlan","plugins":5}"#,
                "\"plugins\" must be a non-empty list",
            ),
        ] {
            let e = nad(c).cni_config().unwrap_err();
            assert!(e.contains(why), "{c}: {e}");
        }
    }

    #[test]
    fn the_status_reads_as_multus_writes_it() {
        let s = [
            NetworkStatus {
                name: "podnet".into(),
                interface: "eth0".into(),
                ips: vec!["10.244.1.5".into()],
                mac: "0a:58:0a:f4:01:05".into(),
                default: true,
                dns: None,
            },
            NetworkStatus {
                name: "shop/a".into(),
                interface: "net1".into(),
                ips: vec!["192.168.1.10".into()],
                mac: "02:00:00:00:00:05".into(),
                ..Default::default()
            },
        ];
        let v: Value = serde_json::from_str(&status_text(&s)).unwrap();
        assert_eq!(v[0]["default"], true);
        assert_eq!(v[1].get("default"), None);
        assert_eq!(v[1]["ips"][0], "192.168.1.10");
        let back: Vec<NetworkStatus> = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
    }
}
