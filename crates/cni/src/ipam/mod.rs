//! The `host-local` IPAM plugin: addresses from configured ranges, state in
//! files under `dataDir`, compatible with the reference plugin's layout.
//!
//! - [`config`]: parsing and canonicalising ranges;
//! - [`alloc`]: the pure round-robin allocator;
//! - [`store`]: the on-disk reservations and their lock.

pub mod alloc;
pub mod config;
pub mod store;

use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;

use crate::error::{CniError, Code};
use crate::skel::{CmdArgs, Plugin};
use crate::types::{self, runtime_key, Attachment, CniResult, Dns, IpConfig};
use config::{IpamConf, RawIpam};
use store::{Reserved, Store};

#[derive(Deserialize)]
struct Conf {
    #[serde(default)]
    name: String,
    #[serde(default)]
    ipam: Option<RawIpam>,
    #[serde(rename = "runtimeConfig", default)]
    runtime_config: Option<Value>,
    #[serde(default)]
    args: Option<Value>,
    #[serde(rename = "cni.dev/valid-attachments", default)]
    valid_attachments: Option<Vec<Attachment>>,
}

fn load(args: &CmdArgs) -> Result<(Conf, IpamConf), CniError> {
    load_stdin(&args.stdin)
}

fn load_stdin(stdin: &[u8]) -> Result<(Conf, IpamConf), CniError> {
    let mut c: Conf = types::parse_conf(stdin)?;
    let raw = c
        .ipam
        .take()
        .ok_or_else(|| CniError::config("host-local: missing \"ipam\" section"))?;
    let ipam = IpamConf::from_raw(raw, &c.name)?;
    Ok((c, ipam))
}

/// Addresses asked for explicitly: CNI_ARGS `IP=`, the `ips` capability, or
/// `args.cni.ips`.
fn requested_ips(args: &CmdArgs, c: &Conf) -> Result<Vec<IpAddr>, CniError> {
    let mut out = Vec::new();
    let mut push = |s: &str| -> Result<(), CniError> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(());
        }
        let ip = s
            .split('/')
            .next()
            .unwrap_or(s)
            .parse::<IpAddr>()
            .map_err(|_| CniError::config(format!("host-local: invalid requested IP {s:?}")))?;
        out.push(ip);
        Ok(())
    };
    if let Some(v) = args.cni_args().get("IP") {
        for s in v.split(',') {
            push(s)?;
        }
    }
    let lists = [
        runtime_key(&c.runtime_config, "ips").cloned(),
        c.args.as_ref().and_then(|a| a.pointer("/cni/ips")).cloned(),
    ];
    for l in lists.into_iter().flatten() {
        for s in l.as_array().into_iter().flatten() {
            if let Some(s) = s.as_str() {
                push(s)?;
            }
        }
    }
    Ok(out)
}

fn parse_resolv_conf(path: &str) -> Result<Dns, CniError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CniError::new(Code::Io, format!("host-local: reading resolvConf {path}"))
            .with_details(e.to_string())
    })?;
    let mut d = Dns::default();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        match f.next() {
            Some("nameserver") => d.nameservers.extend(f.next().map(String::from)),
            Some("domain") => d.domain = f.next().map(String::from),
            Some("search") => d.search = f.map(String::from).collect(),
            Some("options") => d.options.extend(f.map(String::from)),
            _ => {}
        }
    }
    Ok(d)
}

/// Parses a host-local configuration (the whole network config on stdin)
/// without touching any state.
pub fn parse_config(stdin: &[u8]) -> Result<IpamConf, CniError> {
    load_stdin(stdin).map(|(_, ipam)| ipam)
}

/// What one in-process ADD reserved, for [`rollback`].
#[derive(Debug)]
pub struct Rollback {
    data_dir: String,
    container_id: String,
    ifname: String,
    reserved: Vec<Reserved>,
}

/// Takes back an ADD whose caller failed afterwards: the addresses it
/// reserved are released and the round-robin cursors it moved are put back,
/// so host-local's state is exactly what it was before that ADD (a DEL
/// releases the addresses but leaves the cursor where it is).
pub fn rollback(r: Rollback) -> Result<(), CniError> {
    if r.reserved.is_empty() {
        return Ok(());
    }
    let store = Store::open(&r.data_dir)?;
    let mut errors = Vec::new();
    for res in r.reserved.iter().rev() {
        if let Err(e) = store.unreserve(res, &r.container_id, &r.ifname) {
            errors.push(e.to_string());
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(CniError::new(
            Code::Io,
            format!("host-local: rolling back ADD: {}", errors.join("; ")),
        ))
    }
}

pub struct HostLocal;

impl HostLocal {
    /// ADD, and what it reserved so that an in-process caller failing later
    /// can [`rollback`] it exactly.
    pub fn add_undoable(&self, args: &CmdArgs) -> Result<(CniResult, Rollback), CniError> {
        let (c, ipam) = load(args)?;
        let mut requested = requested_ips(args, &c)?;
        // Read before anything is reserved, as the reference does: a bad
        // resolvConf must fail the ADD with nothing allocated.
        let dns = match &ipam.resolv_conf {
            Some(p) => Some(parse_resolv_conf(p)?),
            None => None,
        };
        let store = Store::open(&ipam.data_dir)?;
        let held: HashSet<IpAddr> = store
            .by_id(&args.container_id, &args.ifname)?
            .into_iter()
            .collect();
        let mut result = CniResult::default();
        let mut fresh = Vec::new();
        let outcome = (|| -> Result<(), CniError> {
            for (si, set) in ipam.range_sets.iter().enumerate() {
                let pick = if let Some(pos) = requested
                    .iter()
                    .position(|ip| set.iter().any(|r| r.contains(*ip)))
                {
                    let ip = requested.remove(pos);
                    let ri = set
                        .iter()
                        .position(|r| r.contains(ip))
                        .expect("checked above");
                    if !held.contains(&ip) {
                        let r = if set[ri].gateway == Some(ip) {
                            None
                        } else {
                            store.reserve(&args.container_id, &args.ifname, ip, si)?
                        };
                        let Some(r) = r else {
                            return Err(CniError::internal(format!(
                                "host-local: requested IP address {ip} is not available in range set {}",
                                describe(set)
                            )));
                        };
                        fresh.push(r);
                    }
                    (ip, ri)
                } else if let Some(ip) = held
                    .iter()
                    .copied()
                    .find(|ip| set.iter().any(|r| r.contains(*ip)))
                {
                    // ADD again for the same attachment: hand back what it holds.
                    (
                        ip,
                        set.iter()
                            .position(|r| r.contains(ip))
                            .expect("held ip in set"),
                    )
                } else {
                    let mut last = store.last_reserved(si);
                    loop {
                        let Some((ip, ri)) =
                            alloc::next_free(set, last, |ip| store.is_reserved(ip))
                        else {
                            return Err(CniError::internal(format!(
                                "host-local: no IP addresses available in range set: {}",
                                describe(set)
                            )));
                        };
                        if let Some(r) = store.reserve(&args.container_id, &args.ifname, ip, si)? {
                            fresh.push(r);
                            break (ip, ri);
                        }
                        last = Some(ip);
                    }
                };
                let r = &set[pick.1];
                result.ips.push(IpConfig {
                    version: None,
                    interface: None,
                    address: IpNet::new(pick.0, r.subnet.prefix_len()).expect("prefix from subnet"),
                    gateway: r.gateway,
                });
            }
            if let Some(ip) = requested.first() {
                return Err(CniError::config(format!(
                    "host-local: requested IP address {ip} is not in any configured range"
                )));
            }
            Ok(())
        })();
        if let Err(e) = outcome {
            for r in fresh.iter().rev() {
                let _ = store.unreserve(r, &args.container_id, &args.ifname);
            }
            return Err(e);
        }
        result.routes = ipam.routes.clone();
        if let Some(d) = dns {
            result.dns = d;
        }
        let undo = Rollback {
            data_dir: ipam.data_dir,
            container_id: args.container_id.clone(),
            ifname: args.ifname.clone(),
            reserved: fresh,
        };
        Ok((result, undo))
    }
}

impl Plugin for HostLocal {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, CniError> {
        self.add_undoable(args).map(|(r, _)| r)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), CniError> {
        let (_, ipam) = load(args)?;
        if !std::path::Path::new(&ipam.data_dir).exists() {
            return Ok(());
        }
        let store = Store::open(&ipam.data_dir)?;
        store.release_by_id(&args.container_id, &args.ifname)?;
        Ok(())
    }

    fn check(&self, args: &CmdArgs) -> Result<(), CniError> {
        let (_, ipam) = load(args)?;
        let store = Store::open(&ipam.data_dir)?;
        let held = store.by_id(&args.container_id, &args.ifname)?;
        for (si, set) in ipam.range_sets.iter().enumerate() {
            if !held.iter().any(|ip| set.iter().any(|r| r.contains(*ip))) {
                return Err(CniError::internal(format!(
                    "host-local: failed to find address added by container {} in range set {si}",
                    args.container_id
                )));
            }
        }
        Ok(())
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), CniError> {
        let (c, ipam) = load(args)?;
        let valid: HashSet<(String, String)> = c
            .valid_attachments
            .unwrap_or_default()
            .into_iter()
            .map(|a| (a.container_id, a.ifname))
            .collect();
        if !std::path::Path::new(&ipam.data_dir).exists() {
            return Ok(());
        }
        let store = Store::open(&ipam.data_dir)?;
        for (ip, id, ifname) in store.entries()? {
            let keep = valid.contains(&(id.clone(), ifname.clone()))
                || (ifname.is_empty() && valid.iter().any(|(i, _)| *i == id));
            if !keep {
                tracing::info!(%ip, container = %id, "host-local GC releases address");
                store.release(ip)?;
            }
        }
        Ok(())
    }

    fn status(&self, args: &CmdArgs) -> Result<(), CniError> {
        let (_, ipam) = load(args)?;
        if !std::path::Path::new(&ipam.data_dir).exists() {
            return Ok(());
        }
        let store = Store::open(&ipam.data_dir)?;
        for set in &ipam.range_sets {
            if alloc::next_free(set, store.last_reserved(0), |ip| store.is_reserved(ip)).is_none() {
                return Err(CniError::new(
                    Code::NotAvailable,
                    format!("host-local: range set {} is exhausted", describe(set)),
                ));
            }
        }
        Ok(())
    }
}

fn describe(set: &config::RangeSet) -> String {
    set.iter()
        .map(|r| format!("{}-{}", r.start, r.end))
        .collect::<Vec<_>>()
        .join(",")
}
