//! The `portmap` plugin: host ports forwarded to pod ports, on nftables.
//!
//! Mappings are data, not rules: table `inet podnet-portmap` holds maps keyed
//! by `[hostIP .] proto . port` whose values are `podIP . podPort`, so a
//! packet costs one lookup however many pods publish ports. `snat` (default
//! on) masquerades connections from localhost and hairpin connections (a pod
//! reaching a host port that leads back into its own subnet), without which
//! replies would bypass the reverse translation.
//!
//! What one attachment added is recorded in a small state file, so DEL and GC
//! remove exactly that even when the runtime sends no portMappings.

use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;
use podnet_kernel::Handle;
use podnet_nft::{apply, NftError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{CniError, Code};
use crate::skel::{CmdArgs, Plugin};
use crate::types::{self, get_ci, json_kind, runtime_key, Attachment, CniResult};

pub const TABLE: &str = "podnet-portmap";
const DEFAULT_STATE_DIR: &str = "/var/lib/cni/podnet-portmap";

#[derive(Debug, Deserialize)]
struct Conf {
    #[serde(default)]
    snat: Option<bool>,
    #[serde(rename = "runtimeConfig", default)]
    runtime_config: Option<Value>,
    #[serde(rename = "prevResult", default)]
    prev_result: Option<Value>,
    /// podnet extension: where per-attachment state lives.
    #[serde(rename = "stateDir", default)]
    state_dir: Option<String>,
    #[serde(rename = "cni.dev/valid-attachments", default)]
    valid_attachments: Option<Vec<Attachment>>,
}

/// One requested mapping, keys matched case-insensitively.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapping {
    pub host_port: u16,
    pub container_port: u16,
    pub protocol: String,
    pub host_ip: Option<IpAddr>,
}

pub fn parse_mappings(rc: &Option<Value>) -> Result<Vec<PortMapping>, CniError> {
    let Some(list) = runtime_key(rc, "portMappings") else {
        return Ok(Vec::new());
    };
    let list = list
        .as_array()
        .ok_or_else(|| CniError::config("portmap: runtimeConfig.portMappings must be a list"))?;
    let mut out = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let port = |k: &str| -> Result<u16, CniError> {
            let v = get_ci(m, k).and_then(|v| v.as_u64()).ok_or_else(|| {
                CniError::config(format!("portmap: mapping {i}: missing or invalid {k}"))
            })?;
            if v == 0 || v > 65535 {
                return Err(CniError::config(format!(
                    "portmap: mapping {i}: {k} {v} out of range 1-65535"
                )));
            }
            Ok(v as u16)
        };
        // A string field, or absent (missing or null). Anything else is an
        // error: a hostIP ignored would map the port on every address.
        let string = |k: &str| -> Result<Option<&str>, CniError> {
            match get_ci(m, k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.as_str())),
                Some(v) => Err(CniError::config(format!(
                    "portmap: mapping {i}: {k} must be a string, not {}",
                    json_kind(v)
                ))),
            }
        };
        let protocol = string("protocol")?.unwrap_or("tcp").to_ascii_lowercase();
        if !matches!(protocol.as_str(), "tcp" | "udp" | "sctp") {
            return Err(CniError::config(format!(
                "portmap: mapping {i}: unknown protocol {protocol:?}"
            )));
        }
        let host_ip = match string("hostIP")?.filter(|s| !s.is_empty()) {
            None => None,
            Some(s) => Some(s.parse::<IpAddr>().map_err(|_| {
                CniError::config(format!("portmap: mapping {i}: invalid hostIP {s:?}"))
            })?),
        };
        out.push(PortMapping {
            host_port: port("hostPort")?,
            container_port: port("containerPort")?,
            protocol,
            host_ip: host_ip.filter(|ip| !ip.is_unspecified()),
        });
    }
    Ok(out)
}

/// One nft element this plugin owns: the set it lives in and its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Element {
    pub set: String,
    pub key: String,
    pub value: Option<String>,
}

impl Element {
    fn full(&self) -> String {
        match &self.value {
            Some(v) => format!("{} : {}", self.key, v),
            None => self.key.clone(),
        }
    }
}

/// The pure plan: which elements realise these mappings for these pod IPs.
pub fn plan(maps: &[PortMapping], pod_ips: &[IpNet], snat: bool) -> Vec<Element> {
    let mut out = Vec::new();
    for ip in pod_ips {
        let v4 = ip.addr().is_ipv4();
        let fam = if v4 { "4" } else { "6" };
        let mut used = false;
        for m in maps {
            if let Some(h) = m.host_ip {
                if h.is_ipv4() != v4 {
                    continue;
                }
            }
            used = true;
            let value = Some(format!("{} . {}", ip.addr(), m.container_port));
            out.push(match m.host_ip {
                Some(h) => Element {
                    set: format!("hp{fam}"),
                    key: format!("{h} . {} . {}", m.protocol, m.host_port),
                    value,
                },
                None => Element {
                    set: format!("hp{fam}any"),
                    key: format!("{} . {}", m.protocol, m.host_port),
                    value,
                },
            });
        }
        if used && snat {
            out.push(Element {
                set: format!("snat{fam}"),
                key: ip.addr().to_string(),
                value: None,
            });
            out.push(Element {
                set: format!("hairpin{fam}"),
                key: format!("{} . {}", ip.trunc(), ip.addr()),
                value: None,
            });
        }
    }
    out
}

fn header() -> String {
    let t = TABLE;
    let mut s = format!(
        "add table inet {t}\n\
         add chain inet {t} prerouting {{ type nat hook prerouting priority dstnat; policy accept; }}\n\
         add chain inet {t} output {{ type nat hook output priority -100; policy accept; }}\n\
         add chain inet {t} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}\n\
         add chain inet {t} hostports\n"
    );
    for (f, a) in [("4", "ipv4_addr"), ("6", "ipv6_addr")] {
        s.push_str(&format!(
            "add map inet {t} hp{f} {{ type {a} . inet_proto . inet_service : {a} . inet_service; }}\n\
             add map inet {t} hp{f}any {{ type inet_proto . inet_service : {a} . inet_service; }}\n\
             add set inet {t} snat{f} {{ type {a}; }}\n\
             add set inet {t} hairpin{f} {{ type {a} . {a}; flags interval; }}\n"
        ));
    }
    s
}

fn rules() -> String {
    let t = TABLE;
    format!(
        "flush chain inet {t} prerouting\n\
         flush chain inet {t} output\n\
         flush chain inet {t} postrouting\n\
         flush chain inet {t} hostports\n\
         add rule inet {t} prerouting fib daddr type local jump hostports\n\
         add rule inet {t} output fib daddr type local jump hostports\n\
         add rule inet {t} hostports meta l4proto {{ tcp, udp, sctp }} dnat ip to ip daddr . meta l4proto . th dport map @hp4\n\
         add rule inet {t} hostports meta nfproto ipv4 meta l4proto {{ tcp, udp, sctp }} dnat ip to meta l4proto . th dport map @hp4any\n\
         add rule inet {t} hostports meta l4proto {{ tcp, udp, sctp }} dnat ip6 to ip6 daddr . meta l4proto . th dport map @hp6\n\
         add rule inet {t} hostports meta nfproto ipv6 meta l4proto {{ tcp, udp, sctp }} dnat ip6 to meta l4proto . th dport map @hp6any\n\
         add rule inet {t} postrouting ct status dnat ip saddr 127.0.0.0/8 ip daddr @snat4 masquerade\n\
         add rule inet {t} postrouting ct status dnat ip saddr . ip daddr @hairpin4 masquerade\n\
         add rule inet {t} postrouting ct status dnat ip6 saddr ::1 ip6 daddr @snat6 masquerade\n\
         add rule inet {t} postrouting ct status dnat ip6 saddr . ip6 daddr @hairpin6 masquerade\n"
    )
}

fn add_elements(els: &[Element]) -> Result<(), NftError> {
    let mut s = header();
    s.push_str(&rules());
    for e in els {
        s.push_str(&format!(
            "add element inet {TABLE} {} {{ {} }}\n",
            e.set,
            e.full()
        ));
    }
    apply("adding port mappings", &s)
}

fn del_elements(els: &[Element]) -> Result<(), NftError> {
    if els.is_empty() {
        return Ok(());
    }
    let mut s = header();
    for e in els {
        // add-then-delete makes removal idempotent; for map keys held by
        // another pod the add fails, so delete by key alone there.
        if e.value.is_none() {
            s.push_str(&format!(
                "add element inet {TABLE} {} {{ {} }}\n",
                e.set, e.key
            ));
        }
        s.push_str(&format!(
            "delete element inet {TABLE} {} {{ {} }}\n",
            e.set, e.key
        ));
    }
    match apply("removing port mappings", &s) {
        Ok(()) => Ok(()),
        // A map key someone already removed: fall back to one element at a time.
        Err(NftError::Failed { .. }) => {
            for e in els {
                let mut s = header();
                s.push_str(&format!(
                    "delete element inet {TABLE} {} {{ {} }}\n",
                    e.set, e.key
                ));
                let _ = apply("removing a port mapping", &s);
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

fn state_path(dir: &str, id: &str, ifname: &str) -> PathBuf {
    PathBuf::from(dir).join(format!("{id}-{ifname}.json"))
}

fn pod_ips(prev: &CniResult) -> Vec<IpNet> {
    prev.ips
        .iter()
        .filter(|ip| {
            ip.interface
                .and_then(|i| prev.interfaces.get(i))
                .map(|i| !i.sandbox.is_empty())
                .unwrap_or(true)
        })
        .map(|ip| ip.address)
        .collect()
}

/// Lets 127.0.0.1 be DNATed to a pod: route_localnet on the host interface
/// that faces the pod's subnet.
fn enable_localnet(ips: &[IpNet]) -> Result<(), CniError> {
    let mut h = Handle::new()?;
    let addrs = h.addrs(0)?;
    for ip in ips.iter().filter(|i| i.addr().is_ipv4()) {
        if let Some(a) = addrs
            .iter()
            .find(|a| a.net.contains(&ip.addr()) && a.net.addr() != ip.addr())
        {
            if let Some(l) = h.link_by_index(a.index)? {
                podnet_kernel::netns::write_sysctl(
                    &format!("net.ipv4.conf.{}.route_localnet", l.name),
                    "1",
                )?;
            }
        }
    }
    Ok(())
}

pub struct Portmap;

fn load(args: &CmdArgs) -> Result<(Conf, String), CniError> {
    let c: Conf = types::parse_conf(&args.stdin)?;
    let dir = c
        .state_dir
        .clone()
        .unwrap_or_else(|| DEFAULT_STATE_DIR.to_string());
    Ok((c, dir))
}

/// Parses a portmap configuration and its requested mappings without
/// touching any state.
pub fn parse_config(stdin: &[u8]) -> Result<Vec<PortMapping>, CniError> {
    let c: Conf = types::parse_conf(stdin)?;
    parse_mappings(&c.runtime_config)
}

fn read_state(path: &PathBuf) -> Option<Vec<Element>> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

impl Plugin for Portmap {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, CniError> {
        let (c, dir) = load(args)?;
        let prev = c
            .prev_result
            .as_ref()
            .ok_or_else(|| {
                CniError::config("portmap: must be called as a chained plugin (prevResult missing)")
            })
            .and_then(CniResult::from_value)?;
        let maps = parse_mappings(&c.runtime_config)?;
        if maps.is_empty() {
            return Ok(prev);
        }
        let ips = pod_ips(&prev);
        if ips.is_empty() {
            return Err(CniError::config(
                "portmap: prevResult has no pod IP addresses",
            ));
        }
        let snat = c.snat.unwrap_or(true);
        let els = plan(&maps, &ips, snat);
        let path = state_path(&dir, &args.container_id, &args.ifname);
        std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::write(&path, serde_json::to_vec(&els).expect("json")))
            .map_err(|e| {
                CniError::new(Code::Io, format!("portmap: writing {}", path.display()))
                    .with_details(e.to_string())
            })?;
        if let Err(e) = add_elements(&els) {
            let _ = std::fs::remove_file(&path);
            let msg = e.to_string();
            if msg.contains("File exists") || msg.contains("busy") {
                return Err(CniError::internal(format!(
                    "portmap: a host port in {} is already mapped to another pod",
                    maps.iter()
                        .map(|m| format!("{}/{}", m.host_port, m.protocol))
                        .collect::<Vec<_>>()
                        .join(",")
                ))
                .with_details(msg));
            }
            return Err(e.into());
        }
        if snat {
            enable_localnet(&ips)?;
        }
        Ok(prev)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), CniError> {
        let (c, dir) = load(args)?;
        let path = state_path(&dir, &args.container_id, &args.ifname);
        let els = match read_state(&path) {
            Some(els) => els,
            None => {
                // No record (never added, or removed already): fall back to
                // what the runtime tells us, if anything.
                let maps = parse_mappings(&c.runtime_config)?;
                let prev = c
                    .prev_result
                    .as_ref()
                    .and_then(|v| CniResult::from_value(v).ok());
                match prev {
                    Some(p) if !maps.is_empty() => {
                        plan(&maps, &pod_ips(&p), c.snat.unwrap_or(true))
                    }
                    _ => Vec::new(),
                }
            }
        };
        del_elements(&els)?;
        let _ = std::fs::remove_file(&path);
        Ok(())
    }

    fn check(&self, args: &CmdArgs) -> Result<(), CniError> {
        let (c, _) = load(args)?;
        let prev = c
            .prev_result
            .as_ref()
            .ok_or_else(|| CniError::config("portmap: required prevResult missing"))
            .and_then(CniResult::from_value)?;
        let maps = parse_mappings(&c.runtime_config)?;
        for e in plan(&maps, &pod_ips(&prev), c.snat.unwrap_or(true)) {
            let out = podnet_nft::query(&[
                "get",
                "element",
                "inet",
                TABLE,
                &e.set,
                &format!("{{ {} }}", e.key),
            ])
            .map_err(|_| {
                CniError::internal(format!("portmap: mapping {} missing from {}", e.key, e.set))
            })?;
            if let Some(v) = &e.value {
                if !out.contains(v.as_str()) {
                    return Err(CniError::internal(format!(
                        "portmap: mapping {} points elsewhere (want {v})",
                        e.key
                    )));
                }
            }
        }
        Ok(())
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), CniError> {
        let (c, dir) = load(args)?;
        let valid: Vec<String> = c
            .valid_attachments
            .unwrap_or_default()
            .into_iter()
            .map(|a| format!("{}-{}.json", a.container_id, a.ifname))
            .collect();
        let Ok(rd) = std::fs::read_dir(&dir) else {
            return Ok(());
        };
        for ent in rd.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".json") || valid.contains(&name) {
                continue;
            }
            if let Some(els) = read_state(&ent.path()) {
                del_elements(&els)?;
            }
            let _ = std::fs::remove_file(ent.path());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn mappings_accept_containerd_capitalised_keys() {
        let rc = Some(json!({"portMappings": [
            {"HostPort": 8080, "ContainerPort": 80, "Protocol": "TCP", "HostIP": ""},
            {"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "127.0.0.1"}
        ]}));
        let m = parse_mappings(&rc).unwrap();
        assert_eq!(
            m[0],
            PortMapping {
                host_port: 8080,
                container_port: 80,
                protocol: "tcp".into(),
                host_ip: None
            }
        );
        assert_eq!(m[1].host_ip.unwrap().to_string(), "127.0.0.1");
    }

    #[test]
    fn bad_mappings_are_named() {
        let rc = Some(json!({"portMappings": [{"hostPort": 0, "containerPort": 80}]}));
        assert!(parse_mappings(&rc)
            .unwrap_err()
            .msg
            .contains("hostPort 0 out of range"));
        let rc = Some(
            json!({"portMappings": [{"hostPort": 1, "containerPort": 80, "protocol": "icmp"}]}),
        );
        assert!(parse_mappings(&rc)
            .unwrap_err()
            .msg
            .contains("unknown protocol"));
    }

    #[test]
    fn non_string_host_ip_and_protocol_are_refused() {
        for (k, v, kind) in [
            ("hostIP", json!(5), "a number"),
            ("HostIP", json!(["10.0.0.1"]), "a list"),
            ("hostip", json!({"ip": "10.0.0.1"}), "an object"),
            ("HostIP", json!(true), "a boolean"),
            ("protocol", json!(6), "a number"),
            ("Protocol", json!(["udp"]), "a list"),
        ] {
            let mut m = json!({"HostPort": 8080, "ContainerPort": 80});
            m[k] = v;
            let e = parse_mappings(&Some(json!({"portMappings": [m]}))).unwrap_err();
            let field = if k.eq_ignore_ascii_case("hostIP") {
                "hostIP"
            } else {
                "protocol"
            };
            assert_eq!(e.code, 7);
            assert_eq!(
                e.msg,
                format!("portmap: mapping 0: {field} must be a string, not {kind}")
            );
        }
        // null is "not given", as with containerd's and CRI-O's omitted fields.
        let m = parse_mappings(&Some(json!({"portMappings": [
            {"hostPort": 1, "containerPort": 2, "hostIP": null, "protocol": null}
        ]})))
        .unwrap();
        assert_eq!((m[0].protocol.as_str(), m[0].host_ip), ("tcp", None));
        // The same through the whole configuration.
        let e = parse_config(
            br#"{"cniVersion":"1.0.0","name":"n","type":"portmap","runtimeConfig":
                {"PortMappings":[{"HostPort":80,"ContainerPort":80,"HostIP":7}]}}"#,
        )
        .unwrap_err();
        assert_eq!(
            (e.code, e.msg.as_str()),
            (
                7,
                "portmap: mapping 0: hostIP must be a string, not a number"
            )
        );
    }

    #[test]
    fn plan_covers_families_and_snat() {
        let maps = vec![PortMapping {
            host_port: 8080,
            container_port: 80,
            protocol: "tcp".into(),
            host_ip: None,
        }];
        let ips: Vec<IpNet> = vec![
            "10.1.0.5/24".parse().unwrap(),
            "fd00::5/64".parse().unwrap(),
        ];
        let els = plan(&maps, &ips, true);
        let keys: Vec<String> = els
            .iter()
            .map(|e| format!("{} {}", e.set, e.full()))
            .collect();
        assert_eq!(
            keys,
            vec![
                "hp4any tcp . 8080 : 10.1.0.5 . 80",
                "snat4 10.1.0.5",
                "hairpin4 10.1.0.0/24 . 10.1.0.5",
                "hp6any tcp . 8080 : fd00::5 . 80",
                "snat6 fd00::5",
                "hairpin6 fd00::/64 . fd00::5",
            ]
        );
        assert_eq!(plan(&maps, &ips, false).len(), 2);
        let v4only = vec![PortMapping {
            host_ip: Some("192.0.2.1".parse().unwrap()),
            ..maps[0].clone()
        }];
        let els = plan(&v4only, &ips, false);
        assert_eq!(els.len(), 1);
        assert_eq!(els[0].key, "192.0.2.1 . tcp . 8080");
    }
}
