//! The pod side of an attachment, shared by the plugins that put an
//! interface in a pod (bridge, macvlan): opening the pod's namespace,
//! reading a MAC the runtime asked for, and putting the IPAM result's
//! addresses and routes on the interface.

use podnet_kernel::{Handle, Netns, Route};

use crate::error::CniError;
use crate::types::CniResult;

/// A MAC written as six pairs of hex digits split by `:` or `-`.
pub(crate) fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let sep = if s.contains('-') { '-' } else { ':' };
    let mut out = [0u8; 6];
    let mut parts = s.split(sep);
    for b in out.iter_mut() {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

pub(crate) fn open_netns(path: &str) -> Result<Netns, CniError> {
    Netns::open(path).map_err(|e| CniError::internal(format!("failed to open netns {path:?}: {e}")))
}

/// Addresses and routes inside the pod, on interface `idx`.
pub(crate) fn configure_pod_iface(
    h: &mut Handle,
    idx: u32,
    r: &CniResult,
    nodad: bool,
) -> Result<(), CniError> {
    for ip in &r.ips {
        h.add_addr(idx, ip.address, nodad)?;
    }
    h.set_up(idx)?;
    for rt in &r.routes {
        let v4 = rt.dst.addr().is_ipv4();
        let gw = rt.gw.or_else(|| {
            r.ips
                .iter()
                .find(|i| i.address.addr().is_ipv4() == v4)
                .and_then(|i| i.gateway)
        });
        let route = Route {
            dst: if rt.dst.prefix_len() == 0 {
                None
            } else {
                Some(rt.dst)
            },
            gateway: gw,
            oif: Some(idx),
            table: rt.table,
            priority: rt.priority,
            mtu: rt.mtu,
            advmss: rt.advmss,
            scope: rt.scope,
            v6: !v4,
            ..Default::default()
        };
        match h.add_route(&route) {
            Ok(()) => {}
            Err(e) if e.is_exists() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn macs_are_six_hex_pairs() {
        let m = Some([0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x02]);
        assert_eq!(super::parse_mac("0a:58:0a:f4:01:02"), m);
        assert_eq!(super::parse_mac("0A-58-0a-F4-01-02"), m);
        for bad in [
            "zz",
            "0a:58:0a:f4:01",
            "0a:58:0a:f4:01:02:03",
            "0a:58:0a:f4:1:02",
            "0a:58:0a:f4:01:zz",
            "0a:58-0a:f4:01:02",
            "",
        ] {
            assert_eq!(super::parse_mac(bad), None, "{bad}");
        }
    }
}
