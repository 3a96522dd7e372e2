//! The `host-local` IPAM plugin: addresses from configured ranges, state in
//! files under `dataDir`, compatible with the reference plugin's layout.
//!
//! - [`config`]: parsing and canonicalising ranges;
//! - [`alloc`]: the pure round-robin allocator;
//! - [`store`]: the on-disk reservations and their lock;
//! - [`fixed`]: the `static` IPAM plugin (no allocation, so no state).

pub mod alloc;
pub mod config;
pub mod fixed;
pub mod store;

use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;

use crate::error::{CniError, Code};
use crate::skel::{CmdArgs, Plugin};
use crate::types::{self, runtime_key, Attachment, CniResult, Dns, IpConfig};
use config::{IpamConf, RangeSet, RawIpam};
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

/// One ADD's reservations while they are made: what the attachment held
/// before this ADD, and what this ADD newly reserved (taken back if a later
/// range set fails, so a failed ADD leaves the store as it found it).
struct Reserving<'a> {
    store: &'a Store,
    id: &'a str,
    ifname: &'a str,
    held: HashSet<IpAddr>,
    fresh: Vec<Reserved>,
}

impl Reserving<'_> {
    /// One address from each range set, in order; then any requested
    /// address no range set claimed is an error.
    fn all(
        &mut self,
        sets: &[RangeSet],
        mut requested: Vec<IpAddr>,
    ) -> Result<Vec<IpConfig>, CniError> {
        let mut ips = Vec::new();
        for (si, set) in sets.iter().enumerate() {
            ips.push(self.one(si, set, &mut requested)?);
        }
        if let Some(ip) = requested.first() {
            return Err(CniError::config(format!(
                "host-local: requested IP address {ip} is not in any configured range"
            )));
        }
        Ok(ips)
    }

    /// The address for range set `si`: the one requested in it, else the
    /// one the attachment already holds there (ADD again hands it back),
    /// else the next free one.
    fn one(
        &mut self,
        si: usize,
        set: &RangeSet,
        requested: &mut Vec<IpAddr>,
    ) -> Result<IpConfig, CniError> {
        let (ip, ri) = if let Some(pos) = requested
            .iter()
            .position(|ip| set.iter().any(|r| r.contains(*ip)))
        {
            let ip = requested.remove(pos);
            self.requested(si, set, ip)?
        } else if let Some(ip) = self
            .held
            .iter()
            .copied()
            .find(|ip| set.iter().any(|r| r.contains(*ip)))
        {
            let ri = set
                .iter()
                .position(|r| r.contains(ip))
                .expect("held ip in set");
            (ip, ri)
        } else {
            self.next_free(si, set)?
        };
        let r = &set[ri];
        Ok(IpConfig {
            version: None,
            interface: None,
            address: IpNet::new(ip, r.subnet.prefix_len()).expect("prefix from subnet"),
            gateway: r.gateway,
        })
    }

    /// Reserves the requested `ip` (unless the attachment holds it already);
    /// a range's gateway is never handed out.
    fn requested(
        &mut self,
        si: usize,
        set: &RangeSet,
        ip: IpAddr,
    ) -> Result<(IpAddr, usize), CniError> {
        let ri = set
            .iter()
            .position(|r| r.contains(ip))
            .expect("checked above");
        if !self.held.contains(&ip) {
            let r = if set[ri].gateway == Some(ip) {
                None
            } else {
                self.store.reserve(self.id, self.ifname, ip, si)?
            };
            let Some(r) = r else {
                return Err(CniError::internal(format!(
                    "host-local: requested IP address {ip} is not available in range set {}",
                    describe(set)
                )));
            };
            self.fresh.push(r);
        }
        Ok((ip, ri))
    }

    /// Reserves the next free address after the set's round-robin cursor,
    /// drawing again when another ADD took it first.
    fn next_free(&mut self, si: usize, set: &RangeSet) -> Result<(IpAddr, usize), CniError> {
        let store = self.store;
        let mut last = store.last_reserved(si);
        loop {
            let Some((ip, ri)) = alloc::next_free(set, last, |ip| store.is_reserved(ip)) else {
                return Err(CniError::internal(format!(
                    "host-local: no IP addresses available in range set: {}",
                    describe(set)
                )));
            };
            if let Some(r) = store.reserve(self.id, self.ifname, ip, si)? {
                self.fresh.push(r);
                return Ok((ip, ri));
            }
            last = Some(ip);
        }
    }

    /// Releases what this ADD reserved, newest first.
    fn undo(&self) {
        for r in self.fresh.iter().rev() {
            let _ = self.store.unreserve(r, self.id, self.ifname);
        }
    }
}

pub struct HostLocal;

impl HostLocal {
    /// ADD, and what it reserved so that an in-process caller failing later
    /// can [`rollback`] it exactly.
    pub fn add_undoable(&self, args: &CmdArgs) -> Result<(CniResult, Rollback), CniError> {
        let (c, ipam) = load(args)?;
        let requested = requested_ips(args, &c)?;
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
        let mut reserving = Reserving {
            store: &store,
            id: &args.container_id,
            ifname: &args.ifname,
            held,
            fresh: Vec::new(),
        };
        let ips = match reserving.all(&ipam.range_sets, requested) {
            Ok(ips) => ips,
            Err(e) => {
                reserving.undo();
                return Err(e);
            }
        };
        let mut result = CniResult {
            ips,
            routes: ipam.routes.clone(),
            ..Default::default()
        };
        if let Some(d) = dns {
            result.dns = d;
        }
        let undo = Rollback {
            data_dir: ipam.data_dir,
            container_id: args.container_id.clone(),
            ifname: args.ifname.clone(),
            reserved: reserving.fresh,
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
