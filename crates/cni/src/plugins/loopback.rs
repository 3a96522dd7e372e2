//! The `loopback` plugin: brings `lo` up inside the pod (and down on DEL).

use ipnet::IpNet;
use podnet_kernel::{Handle, Netns};

use crate::error::CniError;
use crate::skel::{CmdArgs, Plugin};
use crate::types::{CniResult, Interface, IpConfig};

pub struct Loopback;

impl Plugin for Loopback {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, CniError> {
        let ns = Netns::open(&args.netns).map_err(|e| {
            CniError::internal(format!("failed to open netns {:?}: {e}", args.netns))
        })?;
        let mut h = Handle::in_netns(&ns)?;
        let lo = h.require_link("lo")?;
        h.set_up(lo.index)?;
        let addrs = h.addrs(lo.index)?;
        let mut r = CniResult {
            interfaces: vec![Interface {
                name: "lo".into(),
                mac: "00:00:00:00:00:00".into(),
                sandbox: args.netns.clone(),
                ..Default::default()
            }],
            ..Default::default()
        };
        for want in ["127.0.0.1/8", "::1/128"] {
            let n: IpNet = want.parse().expect("static");
            if addrs.iter().any(|a| a.net == n) {
                r.ips.push(IpConfig {
                    version: None,
                    interface: Some(0),
                    address: n,
                    gateway: None,
                });
            }
        }
        Ok(r)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), CniError> {
        if args.netns.is_empty() {
            return Ok(());
        }
        let ns = match Netns::open(&args.netns) {
            Ok(ns) => ns,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let mut h = Handle::in_netns(&ns)?;
        if let Some(lo) = h.link("lo")? {
            h.set_down(lo.index)?;
        }
        Ok(())
    }

    fn check(&self, args: &CmdArgs) -> Result<(), CniError> {
        let ns = Netns::open(&args.netns).map_err(|e| {
            CniError::internal(format!("failed to open netns {:?}: {e}", args.netns))
        })?;
        let mut h = Handle::in_netns(&ns)?;
        let lo = h.require_link("lo")?;
        if !lo.is_up() {
            return Err(CniError::internal("loopback: lo is down"));
        }
        Ok(())
    }
}
