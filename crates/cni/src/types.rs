//! CNI spec types: the common network configuration, the result, and version
//! negotiation with conversion between result versions.
//!
//! Internally every result is held in the newest shape (1.1.0). It is parsed
//! from any supported version (a `prevResult` or a delegate's output) and
//! rendered in whatever version the runtime's configuration asked for.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{CniError, Code};

pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
pub const CURRENT_VERSION: &str = "1.1.0";

/// A parsed "major.minor.patch" version, comparable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

impl Version {
    pub fn parse(s: &str) -> Option<Version> {
        let mut it = s.split('.').map(|p| p.parse::<u32>().ok());
        let v = Version(
            it.next()??,
            it.next().unwrap_or(Some(0))?,
            it.next().unwrap_or(Some(0))?,
        );
        Some(v)
    }

    pub const V0_4_0: Version = Version(0, 4, 0);
    pub const V1_0_0: Version = Version(1, 0, 0);
    pub const V1_1_0: Version = Version(1, 1, 0);
}

/// Checks that a configuration's cniVersion is one we speak.
pub fn negotiate(v: &str) -> Result<Version, CniError> {
    if !SUPPORTED_VERSIONS.contains(&v) {
        return Err(CniError::new(
            Code::IncompatibleVersion,
            format!("incompatible CNI versions; config is \"{v}\", plugin supports {SUPPORTED_VERSIONS:?}"),
        ));
    }
    Ok(Version::parse(v).expect("supported versions parse"))
}

/// Fields every plugin configuration has.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct NetConf {
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    #[serde(default)]
    pub name: String,
    #[serde(rename = "type", default)]
    pub plugin_type: String,
    #[serde(rename = "prevResult", default)]
    pub prev_result: Option<Value>,
    #[serde(rename = "runtimeConfig", default)]
    pub runtime_config: Option<Value>,
    #[serde(default)]
    pub ipam: Option<Value>,
    #[serde(default)]
    pub dns: Option<Dns>,
    #[serde(rename = "cni.dev/valid-attachments", default)]
    pub valid_attachments: Option<Vec<Attachment>>,
}

/// One live attachment, as named in GC's `cni.dev/valid-attachments`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq, Hash)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    #[serde(default)]
    pub ifname: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_none()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox: String,
    #[serde(
        rename = "socketPath",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub socket_path: String,
    #[serde(rename = "pciID", default, skip_serializing_if = "String::is_empty")]
    pub pci_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// Present only in 0.3.x/0.4.0 output; ignored on input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
    pub address: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteConf {
    pub dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(rename = "advmss", default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

impl RouteConf {
    pub fn new(dst: IpNet, gw: Option<IpAddr>) -> Self {
        RouteConf {
            dst,
            gw,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

/// A CNI result, held in the 1.1.0 shape.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniResult {
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteConf>,
    #[serde(default, skip_serializing_if = "Dns::is_empty")]
    pub dns: Dns,
}

impl CniResult {
    /// Parses a result of any supported version (prevResult or a delegate's).
    pub fn from_value(v: &Value) -> Result<Self, CniError> {
        let mut r: CniResult = serde_json::from_value(v.clone()).map_err(|e| {
            CniError::new(Code::Decode, "failed to parse prevResult").with_details(e.to_string())
        })?;
        for ip in &mut r.ips {
            ip.version = None;
        }
        Ok(r)
    }

    pub fn from_slice(b: &[u8]) -> Result<Self, CniError> {
        let v: Value = serde_json::from_slice(b).map_err(|e| {
            CniError::new(Code::Decode, "failed to parse plugin result").with_details(e.to_string())
        })?;
        Self::from_value(&v)
    }

    /// Renders the result in version `ver`, dropping fields that version
    /// lacks and adding the ones it requires.
    pub fn render(&self, ver: &str) -> Value {
        let v = Version::parse(ver).unwrap_or(Version::V1_1_0);
        let mut r = self.clone();
        r.cni_version = ver.to_string();
        for ip in &mut r.ips {
            ip.version = if v < Version::V1_0_0 {
                Some(
                    if ip.address.addr().is_ipv4() {
                        "4"
                    } else {
                        "6"
                    }
                    .to_string(),
                )
            } else {
                None
            };
        }
        if v < Version::V1_1_0 {
            for route in &mut r.routes {
                route.mtu = None;
                route.advmss = None;
                route.priority = None;
                route.table = None;
                route.scope = None;
            }
            for i in &mut r.interfaces {
                i.mtu = None;
                i.socket_path.clear();
                i.pci_id.clear();
            }
        }
        serde_json::to_value(&r).expect("result serializes")
    }
}

/// Parses the common configuration, mapping JSON problems to the decode code.
pub fn parse_conf<T: serde::de::DeserializeOwned>(stdin: &[u8]) -> Result<T, CniError> {
    serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(Code::Decode, "error parsing network configuration")
            .with_details(e.to_string())
    })
}

/// Reads a key of `runtimeConfig` case-insensitively.
pub fn runtime_key<'a>(rc: &'a Option<Value>, key: &str) -> Option<&'a Value> {
    rc.as_ref()?
        .as_object()?
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v)
}

/// What kind of JSON value `v` is, for error messages.
pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Looks a key up in a JSON object ignoring case (containerd capitalises).
pub fn get_ci<'a>(obj: &'a Value, key: &str) -> Option<&'a Value> {
    obj.as_object()?
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v)
}

/// CNI_ARGS as the reference plugins read them: `K=V` pairs split by `;`,
/// keys matched exactly; a key outside `known` (and `IgnoreUnknown`) is
/// refused unless `IgnoreUnknown` is true; a repeated key's last value
/// wins. Messages are the reference's (`ARGS: unknown args [...]`).
pub fn cni_args(
    raw: &str,
    known: &[&str],
) -> Result<std::collections::HashMap<String, String>, CniError> {
    let mut out = std::collections::HashMap::new();
    if raw.is_empty() {
        return Ok(out);
    }
    let (mut unknown, mut ignore) = (Vec::new(), false);
    for pair in raw.split(';') {
        let kv: Vec<&str> = pair.split('=').collect();
        let [k, v] = kv[..] else {
            return Err(CniError::internal(format!("ARGS: invalid pair {pair:?}")));
        };
        if k == "IgnoreUnknown" {
            ignore = match v.to_ascii_lowercase().as_str() {
                "1" | "true" => true,
                "0" | "false" => false,
                _ => {
                    return Err(CniError::internal(format!(
                        "ARGS: error parsing value of pair {pair:?}: boolean unmarshal error: invalid input {v}"
                    )))
                }
            };
        } else if known.contains(&k) {
            out.insert(k.to_string(), v.to_string());
        } else {
            unknown.push(format!("{pair:?}"));
        }
    }
    if !unknown.is_empty() && !ignore {
        return Err(CniError::internal(format!(
            "ARGS: unknown args [{}]",
            unknown.join(" ")
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> CniResult {
        CniResult::from_value(&json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff", "mtu": 1450, "sandbox": "/run/netns/x"}],
            "ips": [{"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 0},
                    {"address": "fd00::5/64", "interface": 0}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1", "mtu": 1400}],
            "dns": {"nameservers": ["10.96.0.10"]}
        }))
        .unwrap()
    }

    #[test]
    fn renders_old_versions_with_ip_version_and_without_new_fields() {
        let v = sample().render("0.3.1");
        assert_eq!(v["cniVersion"], "0.3.1");
        assert_eq!(v["ips"][0]["version"], "4");
        assert_eq!(v["ips"][1]["version"], "6");
        assert!(v["routes"][0].get("mtu").is_none());
        assert!(v["interfaces"][0].get("mtu").is_none());
    }

    #[test]
    fn renders_1_0_without_ip_version_and_1_1_with_route_mtu() {
        let v = sample().render("1.0.0");
        assert!(v["ips"][0].get("version").is_none());
        assert!(v["routes"][0].get("mtu").is_none());
        let v = sample().render("1.1.0");
        assert_eq!(v["routes"][0]["mtu"], 1400);
        assert_eq!(v["interfaces"][0]["mtu"], 1450);
    }

    #[test]
    fn parses_old_results_and_round_trips() {
        let old = sample().render("0.4.0");
        let back = CniResult::from_value(&old).unwrap();
        assert_eq!(back.ips, sample().ips);
    }

    #[test]
    fn version_negotiation() {
        for v in SUPPORTED_VERSIONS {
            negotiate(v).unwrap();
        }
        let e = negotiate("0.2.0").unwrap_err();
        assert_eq!(e.code, 1);
        assert_eq!(negotiate("9.9.9").unwrap_err().code, 1);
        assert!(Version::parse("0.4.0").unwrap() < Version::V1_0_0);
    }

    #[test]
    fn case_insensitive_keys() {
        let v = json!({"HostPort": 80});
        assert_eq!(get_ci(&v, "hostPort").unwrap(), 80);
    }
}
