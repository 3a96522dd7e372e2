//! The `bandwidth` plugin: token-bucket (tbf) shaping of a pod's traffic on
//! the host side of its veth, with the reference plugin's keys and units
//! (rates in bits per second, bursts in bits).
//!
//! - ingress (towards the pod) is the host veth's egress: a tbf root qdisc;
//! - egress (from the pod) arrives as the host veth's ingress, which cannot
//!   be shaped directly: it is redirected to an ifb device (`bwp<hash>`) whose
//!   egress carries the tbf.

use podnet_kernel::{Handle, Netns};
use serde::Deserialize;
use serde_json::Value;

use crate::error::CniError;
use crate::skel::{CmdArgs, Plugin};
use crate::types::{self, runtime_key, CniResult};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Limits {
    #[serde(rename = "ingressRate", default)]
    pub ingress_rate: u64,
    #[serde(rename = "ingressBurst", default)]
    pub ingress_burst: u64,
    #[serde(rename = "egressRate", default)]
    pub egress_rate: u64,
    #[serde(rename = "egressBurst", default)]
    pub egress_burst: u64,
}

#[derive(Debug, Deserialize)]
struct Conf {
    #[serde(flatten)]
    limits: Limits,
    #[serde(rename = "runtimeConfig", default)]
    runtime_config: Option<Value>,
    #[serde(rename = "prevResult", default)]
    prev_result: Option<Value>,
}

impl Conf {
    /// The runtime's `bandwidth` capability wins over static keys.
    fn limits(&self) -> Result<Limits, CniError> {
        let l = match runtime_key(&self.runtime_config, "bandwidth") {
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
                CniError::config(format!("bandwidth: invalid runtimeConfig.bandwidth: {e}"))
            })?,
            None => self.limits,
        };
        validate(l.ingress_rate, l.ingress_burst, "ingress")?;
        validate(l.egress_rate, l.egress_burst, "egress")?;
        Ok(l)
    }
}

/// Parses a bandwidth configuration (static keys and the runtime's
/// capability) without touching any state.
pub fn parse_config(stdin: &[u8]) -> Result<Limits, CniError> {
    let c: Conf = types::parse_conf(stdin)?;
    c.limits()
}

fn validate(rate: u64, burst: u64, dir: &str) -> Result<(), CniError> {
    if rate == 0 && burst != 0 {
        return Err(CniError::config(format!(
            "bandwidth: if {dir}Burst is set, {dir}Rate must also be set"
        )));
    }
    if rate != 0 && burst == 0 {
        return Err(CniError::config(format!(
            "bandwidth: if {dir}Rate is set, {dir}Burst must also be set"
        )));
    }
    if burst / 8 >= u32::MAX as u64 {
        return Err(CniError::config(format!(
            "bandwidth: {dir}Burst cannot be more than 4GB"
        )));
    }
    Ok(())
}

/// The ifb device name for one attachment (stable, at most 15 bytes).
pub fn ifb_name(container_id: &str, ifname: &str) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in container_id.bytes().chain([b':']).chain(ifname.bytes()) {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("bwp{:012x}", h & 0xffff_ffff_ffff)
}

/// The tc arguments for a tbf root qdisc (pure, so it is unit-tested).
pub fn tbf_args(dev: &str, rate: u64, burst_bits: u64) -> Vec<String> {
    let burst_bytes = (burst_bits / 8).max(1);
    [
        "qdisc",
        "replace",
        "dev",
        dev,
        "root",
        "handle",
        "1:",
        "tbf",
        "rate",
        &format!("{rate}bit"),
        "burst",
        &format!("{burst_bytes}b"),
        "latency",
        "25ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn tc(args: &[String]) -> Result<String, CniError> {
    let out = std::process::Command::new("tc")
        .args(args)
        .output()
        .map_err(|e| {
            CniError::internal(format!(
                "bandwidth: running tc (is iproute2 installed?): {e}"
            ))
        })?;
    if !out.status.success() {
        return Err(CniError::internal(format!(
            "bandwidth: tc {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Finds the host side of the pod's veth: the peer of the pod interface.
fn host_iface(args: &CmdArgs, prev: &CniResult) -> Result<String, CniError> {
    if let Ok(ns) = Netns::open(&args.netns) {
        let mut pod = Handle::in_netns(&ns)?;
        if let Some(peer) = pod.link(&args.ifname)?.and_then(|l| l.peer) {
            let mut host = Handle::new()?;
            if let Some(l) = host.link_by_index(peer)? {
                return Ok(l.name);
            }
        }
    }
    let mut host = Handle::new()?;
    for i in prev.interfaces.iter().filter(|i| i.sandbox.is_empty()) {
        if let Some(l) = host.link(&i.name)? {
            if l.kind == podnet_kernel::LinkKind::Veth {
                return Ok(l.name);
            }
        }
    }
    Err(CniError::internal(format!(
        "bandwidth: cannot find the host interface for {} (is this chained after bridge or ptp?)",
        args.ifname
    )))
}

pub struct Bandwidth;

impl Plugin for Bandwidth {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, CniError> {
        let c: Conf = types::parse_conf(&args.stdin)?;
        let limits = c.limits()?;
        let prev = c
            .prev_result
            .as_ref()
            .ok_or_else(|| {
                CniError::config(
                    "bandwidth: must be called as a chained plugin (prevResult missing)",
                )
            })
            .and_then(CniResult::from_value)?;
        if limits.ingress_rate == 0 && limits.egress_rate == 0 {
            return Ok(prev);
        }
        let dev = host_iface(args, &prev)?;
        let ifb = ifb_name(&args.container_id, &args.ifname);
        let mut prev = prev;
        let r = (|| -> Result<(), CniError> {
            if limits.ingress_rate > 0 {
                tc(&tbf_args(&dev, limits.ingress_rate, limits.ingress_burst))?;
            }
            if limits.egress_rate > 0 {
                let mut h = Handle::new()?;
                let mtu = h.require_link(&dev)?.mtu;
                if h.link(&ifb)?.is_none() {
                    h.create_simple(&ifb, "ifb", Some(mtu))?;
                }
                h.set_up_by_name(&ifb)?;
                tc(&s(&[
                    "qdisc", "replace", "dev", &dev, "handle", "ffff:", "ingress",
                ]))?;
                tc(&s(&[
                    "filter", "replace", "dev", &dev, "parent", "ffff:", "protocol", "all", "prio",
                    "1", "u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect",
                    "dev", &ifb,
                ]))?;
                tc(&tbf_args(&ifb, limits.egress_rate, limits.egress_burst))?;
                // Like the reference plugin, report the ifb in the result.
                let l = h.require_link(&ifb)?;
                if !prev.interfaces.iter().any(|i| i.name == ifb) {
                    prev.interfaces.push(crate::types::Interface {
                        name: ifb.clone(),
                        mac: l.mac_string(),
                        ..Default::default()
                    });
                }
            }
            Ok(())
        })();
        if let Err(e) = r {
            if let Ok(mut h) = Handle::new() {
                let _ = h.delete_link_by_name(&ifb);
            }
            let _ = tc(&s(&["qdisc", "del", "dev", &dev, "root"]));
            let _ = tc(&s(&["qdisc", "del", "dev", &dev, "ingress"]));
            return Err(e);
        }
        Ok(prev)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), CniError> {
        // The veth's qdiscs vanish with the veth; only the ifb is ours to remove.
        let mut h = Handle::new()?;
        h.delete_link_by_name(&ifb_name(&args.container_id, &args.ifname))?;
        Ok(())
    }

    fn check(&self, args: &CmdArgs) -> Result<(), CniError> {
        let c: Conf = types::parse_conf(&args.stdin)?;
        let limits = c.limits()?;
        let prev = c
            .prev_result
            .as_ref()
            .ok_or_else(|| CniError::config("bandwidth: required prevResult missing"))
            .and_then(CniResult::from_value)?;
        let dev = host_iface(args, &prev)?;
        let want = |d: &str, rate: u64| -> Result<(), CniError> {
            let out = tc(&s(&["-j", "qdisc", "show", "dev", d, "root"]))?;
            let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
            let ok = v.as_array().into_iter().flatten().any(|q| {
                q.get("kind").and_then(|k| k.as_str()) == Some("tbf")
                    && q.pointer("/options/rate")
                        .and_then(|r| r.as_u64())
                        .map(|r| r * 8 == rate || r == rate / 8)
                        .unwrap_or(true)
            });
            if ok {
                Ok(())
            } else {
                Err(CniError::internal(format!(
                    "bandwidth: tbf with rate {rate}bit missing on {d}"
                )))
            }
        };
        if limits.ingress_rate > 0 {
            want(&dev, limits.ingress_rate)?;
        }
        if limits.egress_rate > 0 {
            want(
                &ifb_name(&args.container_id, &args.ifname),
                limits.egress_rate,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn runtime_capability_overrides_static_keys() {
        let c: Conf = serde_json::from_value(json!({
            "ingressRate": 1000, "ingressBurst": 800,
            "runtimeConfig": {"bandwidth": {"ingressRate": 2000000, "ingressBurst": 16000}}
        }))
        .unwrap();
        let l = c.limits().unwrap();
        assert_eq!((l.ingress_rate, l.ingress_burst), (2000000, 16000));
    }

    #[test]
    fn rate_and_burst_go_together() {
        let c: Conf = serde_json::from_value(json!({"egressBurst": 100})).unwrap();
        assert!(c
            .limits()
            .unwrap_err()
            .msg
            .contains("egressRate must also be set"));
        let c: Conf = serde_json::from_value(json!({"ingressRate": 100})).unwrap();
        assert!(c
            .limits()
            .unwrap_err()
            .msg
            .contains("ingressBurst must also be set"));
    }

    #[test]
    fn names_and_tc_arguments() {
        let n = ifb_name("abcdef", "eth0");
        assert!(n.len() <= 15 && n.starts_with("bwp"));
        assert_eq!(n, ifb_name("abcdef", "eth0"));
        assert_ne!(n, ifb_name("abcdef", "eth1"));
        assert_eq!(
            tbf_args("veth1", 1_000_000, 80_000).join(" "),
            "qdisc replace dev veth1 root handle 1: tbf rate 1000000bit burst 10000b latency 25ms"
        );
    }
}
