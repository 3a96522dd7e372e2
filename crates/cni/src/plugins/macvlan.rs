//! The `macvlan` plugin, a drop-in for the reference one: the pod's
//! interface is a macvlan of a host interface (`master`, by default the
//! one the default route leaves by), so the pod sits on that interface's
//! layer 2 segment with its own MAC, beside the host rather than behind
//! it. This is how Multus users give a pod a second, underlay network.
//! Keys are the reference plugin's: `master`, `mode` (bridge, private,
//! vepa, passthru), `mtu` (0: the master's), `mac` (also from CNI_ARGS
//! `MAC=` and the `mac` capability), `linkInContainer` (the master is in
//! the pod's namespace), `bcqueuelen` and `ipam` (none: layer 2 only).
//!
//! ADD creates the link already inside the pod's namespace under its
//! final name (no temporary name: the kernel checks names in the
//! namespace a link is born in), then IPAM, then addresses and routes;
//! a failure takes back what was done. DEL removes the pod's interface
//! only if it is a macvlan, so it never deletes what it did not make.

use podnet_kernel::{Handle, Link, LinkKind, MacvlanMode, MacvlanSpec, Netns};
use serde::Deserialize;
use serde_json::Value;

use crate::error::CniError;
use crate::invoke::{delegate, ipam_add, ipam_type_of, IpamLease};
use crate::plugins::podside::{configure_pod_iface, open_netns, parse_mac};
use crate::skel::{CmdArgs, Command, Plugin};
use crate::types::{self, runtime_key, CniResult, Dns, Interface};

pub struct Macvlan;

#[derive(Debug, Deserialize)]
struct RawConf {
    #[serde(default)]
    master: String,
    #[serde(default)]
    mode: String,
    #[serde(default)]
    mtu: i64,
    #[serde(default)]
    mac: Option<String>,
    #[serde(rename = "linkInContainer", default)]
    link_in_container: bool,
    #[serde(default)]
    bcqueuelen: Option<u32>,
    #[serde(default)]
    ipam: Option<Value>,
    #[serde(default)]
    dns: Option<Dns>,
    #[serde(rename = "runtimeConfig", default)]
    runtime_config: Option<Value>,
    #[serde(rename = "prevResult", default)]
    prev_result: Option<Value>,
}

/// A checked configuration: the mode parsed, the MAC chosen from its three
/// sources (the capability over CNI_ARGS over the config) and parsed.
#[derive(Debug)]
struct Conf {
    master: String,
    mode: MacvlanMode,
    mtu: i64,
    mac: Option<[u8; 6]>,
    in_container: bool,
    bc_queue_len: Option<u32>,
    ipam: Option<String>,
    dns: Option<Dns>,
    prev_result: Option<Value>,
}

fn parse(stdin: &[u8], cni_args: &str) -> Result<Conf, CniError> {
    let r: RawConf = types::parse_conf(stdin)?;
    let mode = if r.mode.is_empty() {
        MacvlanMode::Bridge
    } else {
        MacvlanMode::parse(&r.mode)
            .ok_or_else(|| CniError::internal(format!("unknown macvlan mode: {:?}", r.mode)))?
    };
    let ipam = ipam_type_of("macvlan", r.ipam.as_ref())?;
    let from_args = types::cni_args(cni_args, &["MAC"])?.remove("MAC");
    let from_runtime = runtime_key(&r.runtime_config, "mac")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(String::from);
    let mac = from_runtime
        .or(from_args.filter(|s| !s.is_empty()))
        .or(r.mac.filter(|s| !s.is_empty()))
        .map(|s| {
            parse_mac(&s).ok_or_else(|| {
                CniError::internal(format!(
                    "invalid args {s} for MAC addr: address {s}: invalid MAC address"
                ))
            })
        })
        .transpose()?;
    Ok(Conf {
        master: r.master,
        mode,
        mtu: r.mtu,
        mac,
        in_container: r.link_in_container,
        bc_queue_len: r.bcqueuelen.filter(|q| *q > 0),
        ipam,
        dns: r.dns,
        prev_result: r.prev_result,
    })
}

/// The link the default route leaves by (IPv4 first, then IPv6).
fn default_route_link(h: &mut Handle) -> Result<Link, CniError> {
    for v6 in [false, true] {
        let found = h
            .routes(v6, None)?
            .into_iter()
            .find(|r| r.dst.is_none_or(|d| d.prefix_len() == 0) && r.oif.is_some());
        if let Some(l) = found.and_then(|r| r.oif) {
            return h
                .link_by_index(l)?
                .ok_or_else(|| CniError::internal(format!("default route's link #{l} vanished")));
        }
    }
    Err(CniError::internal("no default route interface found"))
}

/// The master link, looked up with `h` (the host's or, with
/// `linkInContainer`, the pod's namespace), and the MTU checked against it.
fn find_master(c: &Conf, h: &mut Handle) -> Result<Link, CniError> {
    let m = if c.master.is_empty() {
        default_route_link(h)?
    } else {
        h.link(&c.master)?.ok_or_else(|| {
            CniError::internal(format!(
                "failed to lookup master {:?}: Link not found",
                c.master
            ))
        })?
    };
    if c.mtu < 0 || c.mtu > i64::from(m.mtu) {
        return Err(CniError::internal(format!(
            "invalid MTU {}, must be [0, master MTU({})]",
            c.mtu, m.mtu
        )));
    }
    Ok(m)
}

/// Takes back a failed ADD: the pod's link, then the IPAM lease.
struct Undo<'a> {
    args: &'a CmdArgs,
    ns: &'a Netns,
    link: Option<u32>,
    ipam: Option<IpamLease>,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if let Some(i) = self.link {
            if let Ok(mut h) = Handle::in_netns(self.ns) {
                let _ = h.delete_link(i);
            }
        }
        if let Some(lease) = self.ipam.take() {
            if let Err(e) = lease.rollback(self.args, &self.args.stdin) {
                tracing::warn!("macvlan: rolling back IPAM after a failed ADD: {e}");
            }
        }
    }
}

/// Creates the macvlan as `ifname` inside the pod's namespace.
fn create(
    c: &Conf,
    args: &CmdArgs,
    ns: &Netns,
    host: &mut Handle,
    pod: &mut Handle,
) -> Result<Link, CniError> {
    let master = if c.in_container {
        find_master(c, pod)?
    } else {
        find_master(c, host)?
    };
    let spec = MacvlanSpec {
        name: &args.ifname,
        master: master.index,
        mode: c.mode,
        mtu: u32::try_from(c.mtu).ok().filter(|m| *m > 0),
        mac: c.mac,
        bc_queue_len: c.bc_queue_len,
    };
    let made = if c.in_container {
        pod.create_macvlan(&spec, None)
    } else {
        host.create_macvlan(&spec, Some(ns.fd()))
    };
    match made {
        Ok(()) => Ok(pod.require_link(&args.ifname)?),
        Err(e) if e.is_exists() && pod.link(&args.ifname)?.is_some() => {
            Err(CniError::internal(format!(
                "macvlan: container interface name {:?} already exists",
                args.ifname
            )))
        }
        Err(e) => Err(CniError::internal(format!("failed to create macvlan: {e}"))),
    }
}

/// Announces the pod's addresses when its link comes up (gratuitous ARP
/// and unsolicited NA), so the segment's caches learn the new MAC at once.
fn notify_neighbours(ns: &Netns, ifname: &str) {
    let _ = ns.run(|| {
        for key in [
            format!("/proc/sys/net/ipv4/conf/{ifname}/arp_notify"),
            format!("/proc/sys/net/ipv6/conf/{ifname}/ndisc_notify"),
        ] {
            let _ = std::fs::write(key, "1");
        }
    });
}

impl Plugin for Macvlan {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, CniError> {
        let c = parse(&args.stdin, &args.args)?;
        let ns = open_netns(&args.netns)?;
        let mut host = Handle::new()?;
        let mut pod = Handle::in_netns(&ns)?;
        let link = create(&c, args, &ns, &mut host, &mut pod)?;
        let mut undo = Undo {
            args,
            ns: &ns,
            link: Some(link.index),
            ipam: None,
        };
        let mut result = CniResult::default();
        if let Some(t) = &c.ipam {
            let (r, lease) = ipam_add(t, args, &args.stdin)?;
            undo.ipam = Some(lease);
            if r.ips.is_empty() {
                return Err(CniError::internal("IPAM plugin returned missing IP config"));
            }
            result = r;
            for ip in &mut result.ips {
                ip.interface = Some(0);
            }
            notify_neighbours(&ns, &args.ifname);
            configure_pod_iface(&mut pod, link.index, &result, false)?;
        } else {
            pod.set_up(link.index)?;
        }
        result.interfaces = vec![Interface {
            name: args.ifname.clone(),
            mac: link.mac_string(),
            sandbox: args.netns.clone(),
            ..Default::default()
        }];
        if result.dns.is_empty() {
            result.dns = c.dns.clone().unwrap_or_default();
        }
        undo.link = None;
        undo.ipam = None;
        Ok(result)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), CniError> {
        let r: RawConf = types::parse_conf(&args.stdin)?;
        if let Some(t) = ipam_type_of("macvlan", r.ipam.as_ref())? {
            delegate(&t, Command::Del, args, &args.stdin)?;
        }
        if args.netns.is_empty() {
            return Ok(());
        }
        let ns = match Netns::open(&args.netns) {
            Ok(ns) => ns,
            // The namespace is gone, and the macvlan with it.
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let mut pod = Handle::in_netns(&ns)?;
        match pod.link(&args.ifname)? {
            Some(l) if l.kind == LinkKind::Macvlan => match pod.delete_link(l.index) {
                Err(e) if !e.is_not_found() => Err(e.into()),
                _ => Ok(()),
            },
            Some(l) => {
                tracing::warn!(
                    "macvlan DEL: {} in {} is a {:?}, not a macvlan; left alone",
                    args.ifname,
                    args.netns,
                    l.kind
                );
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn check(&self, args: &CmdArgs) -> Result<(), CniError> {
        let c = parse(&args.stdin, &args.args)?;
        let ns = open_netns(&args.netns)?;
        if let Some(t) = &c.ipam {
            delegate(t, Command::Check, args, &args.stdin)?;
        }
        let prev = c
            .prev_result
            .as_ref()
            .ok_or_else(|| CniError::config("required prevResult missing"))
            .and_then(CniResult::from_value)?;
        let want = prev
            .interfaces
            .iter()
            .find(|i| i.name == args.ifname && i.sandbox == args.netns)
            .ok_or_else(|| {
                CniError::internal(format!(
                    "sandbox in prevResult  doesn't match configured netns: {}",
                    args.netns
                ))
            })?;
        let mut pod = Handle::in_netns(&ns)?;
        if c.in_container {
            find_master(&c, &mut pod)?;
        } else {
            find_master(&c, &mut Handle::new()?)?;
        }
        check_link(&c, &mut pod, &args.ifname, want)?;
        check_config(&mut pod, &args.ifname, &prev)
    }

    fn status(&self, args: &CmdArgs) -> Result<(), CniError> {
        let c = parse(&args.stdin, &args.args)?;
        if let Some(t) = &c.ipam {
            delegate(t, Command::Status, args, &args.stdin)?;
        }
        Ok(())
    }
}

/// The pod's link is still the macvlan ADD made: its kind, mode and MAC.
fn check_link(c: &Conf, pod: &mut Handle, ifname: &str, want: &Interface) -> Result<(), CniError> {
    let l = pod
        .link(ifname)?
        .ok_or_else(|| CniError::internal(format!("Cannot find container link {ifname}")))?;
    if l.kind != LinkKind::Macvlan {
        return Err(CniError::internal(format!(
            "Error: Container interface {ifname} not of type macvlan"
        )));
    }
    if l.macvlan_mode != Some(c.mode) {
        return Err(CniError::internal(format!(
            "Error: Container interface {ifname} macvlan mode {:?} does not match expected value {:?}",
            l.macvlan_mode, c.mode
        )));
    }
    if !want.mac.is_empty() && !want.mac.eq_ignore_ascii_case(&l.mac_string()) {
        return Err(CniError::internal(format!(
            "Error: Interface MAC {} does not match expected value {}",
            l.mac_string(),
            want.mac
        )));
    }
    Ok(())
}

/// Every address and route of the previous result is still in place.
fn check_config(pod: &mut Handle, ifname: &str, prev: &CniResult) -> Result<(), CniError> {
    let l = pod.require_link(ifname)?;
    let have = pod.addrs(l.index)?;
    for ip in &prev.ips {
        if !have.iter().any(|a| a.net == ip.address) {
            return Err(CniError::internal(format!(
                "Interface {ifname} does not have IP {}",
                ip.address
            )));
        }
    }
    for rt in &prev.routes {
        let v6 = rt.dst.addr().is_ipv6();
        let dst = Some(rt.dst).filter(|d| d.prefix_len() > 0);
        let found = pod.routes(v6, None)?.into_iter().any(|r| {
            r.dst == dst && (rt.gw.is_none() || r.gateway == rt.gw) && r.oif == Some(l.index)
        });
        if !found {
            return Err(CniError::internal(format!(
                "Expected Route {} via {:?} not found in container",
                rt.dst, rt.gw
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_as_the_reference_reads_them() {
        let c = parse(br#"{"cniVersion":"1.0.0","name":"n","type":"macvlan"}"#, "").unwrap();
        assert_eq!(
            (c.mode, c.mtu, c.mac, c.ipam),
            (MacvlanMode::Bridge, 0, None, None)
        );
        for (m, want) in [
            ("private", MacvlanMode::Private),
            ("vepa", MacvlanMode::Vepa),
            ("passthru", MacvlanMode::Passthru),
        ] {
            let conf = format!(r#"{{"mode":"{m}"}}"#);
            assert_eq!(parse(conf.as_bytes(), "").unwrap().mode, want);
        }
        let e = parse(br#"{"mode":"source"}"#, "").unwrap_err();
        assert_eq!(
            (e.code, e.msg.as_str()),
            (999, "unknown macvlan mode: \"source\"")
        );
        let e = parse(br#"{"ipam":{"type":"bridge"}}"#, "").unwrap_err();
        assert_eq!(e.msg, "macvlan: ipam type \"bridge\" is not an IPAM plugin");
    }

    #[test]
    fn the_mac_comes_from_the_capability_then_cni_args_then_the_config() {
        let conf = br#"{"mac":"02:00:00:00:00:01","runtimeConfig":{"mac":"02:00:00:00:00:03"}}"#;
        let one = [2, 0, 0, 0, 0, 1];
        assert_eq!(
            parse(br#"{"mac":"02:00:00:00:00:01"}"#, "").unwrap().mac,
            Some(one)
        );
        let args = "IgnoreUnknown=1;MAC=02:00:00:00:00:02;K8S_POD_NAME=x";
        let from_args = parse(br#"{"mac":"02:00:00:00:00:01"}"#, args).unwrap();
        assert_eq!(from_args.mac, Some([2, 0, 0, 0, 0, 2]));
        assert_eq!(parse(conf, args).unwrap().mac, Some([2, 0, 0, 0, 0, 3]));
        let e = parse(br#"{"mac":"02:00:00:00:00"}"#, "").unwrap_err();
        assert!(
            e.msg.contains("invalid args 02:00:00:00:00 for MAC addr"),
            "{e:?}"
        );
        let e = parse(b"{}", "K8S_POD_NAME=x").unwrap_err();
        assert_eq!(e.msg, "ARGS: unknown args [\"K8S_POD_NAME=x\"]");
    }
}
