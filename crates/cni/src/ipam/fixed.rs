//! The `static` IPAM plugin, a drop-in for the reference one (Multus
//! users attach macvlan networks with it): the addresses, routes and DNS
//! the configuration lists, the addresses the runtime asks for instead
//! (the `ips` capability, else `args.cni.ips`), or CNI_ARGS `IP=`
//! (comma-separated CIDRs, added to the configured ones) with `GATEWAY=`
//! for those that contain it. Nothing is allocated, so DEL has nothing
//! to free. Errors carry the reference plugin's messages, which users
//! search for.

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;

use crate::error::{CniError, Code};
use crate::skel::{CmdArgs, Plugin};
use crate::types::{self, runtime_key, CniResult, Dns, IpConfig, RouteConf};

pub struct Static;

#[derive(Deserialize)]
struct Conf {
    #[serde(default)]
    ipam: Option<Ipam>,
    #[serde(rename = "runtimeConfig", default)]
    runtime_config: Option<Value>,
    #[serde(default)]
    args: Option<Value>,
    #[serde(rename = "prevResult", default)]
    prev_result: Option<Value>,
}

#[derive(Deserialize)]
struct Ipam {
    #[serde(default)]
    addresses: Vec<RawAddress>,
    #[serde(default)]
    routes: Vec<RawRoute>,
    #[serde(default)]
    dns: Dns,
}

#[derive(Deserialize)]
struct RawAddress {
    #[serde(default)]
    address: String,
    #[serde(default)]
    gateway: Option<String>,
}

#[derive(Deserialize)]
struct RawRoute {
    #[serde(default)]
    dst: String,
    #[serde(default)]
    gw: Option<String>,
}

fn err(msg: String) -> CniError {
    CniError::new(Code::Internal, msg)
}

fn cidr(s: &str, what: impl Fn(&str) -> String) -> Result<IpNet, CniError> {
    s.parse::<IpNet>().map_err(|_| err(what(s)))
}

fn ip(s: &str) -> Result<std::net::IpAddr, CniError> {
    s.parse()
        .map_err(|_| err(format!("invalid IP address: {s}")))
}

/// CNI_ARGS `IP=` and `GATEWAY=` (see [`types::cni_args`]).
fn env_args(raw: &str) -> Result<(String, String), CniError> {
    let mut kv = types::cni_args(raw, &["IP", "GATEWAY"])?;
    Ok((
        kv.remove("IP").unwrap_or_default(),
        kv.remove("GATEWAY").unwrap_or_default(),
    ))
}

/// The addresses the runtime asks for in place of the configured ones.
fn asked(c: &Conf) -> Result<Option<Vec<IpConfig>>, CniError> {
    let from_args = c
        .args
        .as_ref()
        .and_then(|a| a.get("cni"))
        .and_then(|c| c.get("ips"));
    let list = [runtime_key(&c.runtime_config, "ips"), from_args]
        .into_iter()
        .flatten()
        .filter_map(Value::as_array)
        .find(|l| !l.is_empty());
    let Some(list) = list else { return Ok(None) };
    let not_cidr =
        |s: &str| format!("an entry in the 'ips' field is NOT in CIDR notation, got: '{s}'");
    list.iter()
        .map(|v| {
            let s = v.as_str().unwrap_or_default();
            Ok(IpConfig {
                version: None,
                interface: None,
                address: cidr(s, not_cidr)?,
                gateway: None,
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The configured addresses, then CNI_ARGS `IP=` ones with the `GATEWAY=`
/// addresses they contain.
fn configured(ipam: &Ipam, args: &str) -> Result<Vec<IpConfig>, CniError> {
    let mut out = Vec::new();
    for a in &ipam.addresses {
        let s = a.address.as_str();
        let address = cidr(s, |s| {
            format!("the 'address' field is expected to be in CIDR notation, got: '{s}'")
        })?;
        let gateway = a.gateway.as_deref().map(ip).transpose()?;
        out.push(IpConfig {
            version: None,
            interface: None,
            address,
            gateway,
        });
    }
    let (ips, gws) = env_args(args)?;
    let mut extra = Vec::new();
    for item in ips.split(',').filter(|_| !ips.is_empty()) {
        let s = item.trim();
        let address = cidr(s, |s| {
            format!("the 'ip' field is expected to be in CIDR notation, got: '{s}'")
        })?;
        extra.push(IpConfig {
            version: None,
            interface: None,
            address,
            gateway: None,
        });
    }
    for item in gws.split(',').filter(|_| !gws.is_empty()) {
        let gw: std::net::IpAddr = item
            .trim()
            .parse()
            .map_err(|_| err(format!("invalid gateway address: {item}")))?;
        for a in extra.iter_mut().filter(|a| a.address.contains(&gw)) {
            a.gateway = Some(gw);
        }
    }
    out.extend(extra);
    Ok(out)
}

fn load(args: &CmdArgs) -> Result<(Conf, Ipam), CniError> {
    let mut c: Conf = types::parse_conf(&args.stdin)?;
    let ipam = c
        .ipam
        .take()
        .ok_or_else(|| err("IPAM config missing 'ipam' key".into()))?;
    Ok((c, ipam))
}

fn result(c: &Conf, ipam: Ipam, args: &str) -> Result<CniResult, CniError> {
    let routes = ipam
        .routes
        .iter()
        .map(|r| {
            let dst = cidr(&r.dst, |s| format!("invalid CIDR address: {s}"))?;
            let gw = r.gw.as_deref().map(ip).transpose()?;
            Ok(RouteConf::new(dst, gw))
        })
        .collect::<Result<Vec<_>, CniError>>()?;
    let ips = match asked(c)? {
        Some(ips) => {
            // CNI_ARGS is still read (and refused when malformed).
            env_args(args)?;
            ips
        }
        None => configured(&ipam, args)?,
    };
    Ok(CniResult {
        ips,
        routes,
        dns: ipam.dns,
        ..CniResult::default()
    })
}

impl Plugin for Static {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, CniError> {
        let (c, ipam) = load(args)?;
        result(&c, ipam, &args.args)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), CniError> {
        types::parse_conf::<Value>(&args.stdin).map(drop)
    }

    /// The configuration still yields a result, and the runtime passed the
    /// one it got (as the reference asks).
    fn check(&self, args: &CmdArgs) -> Result<(), CniError> {
        let (c, ipam) = load(args)?;
        if c.prev_result.is_none() {
            return Err(err("Required prevResult missing".into()));
        }
        result(&c, ipam, &args.args).map(drop)
    }
}
