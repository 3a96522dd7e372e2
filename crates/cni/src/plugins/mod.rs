//! The plugins, chosen by the name the binary was called as.

mod attachments;
pub mod bandwidth;
pub mod bridge;
pub mod loopback;
pub mod macvlan;
pub mod meta;
pub mod netfilter;
mod podside;
pub mod portmap;

use crate::skel::Plugin;

/// Every plugin type this binary serves.
pub const NAMES: &[&str] = &[
    "podnet",
    "bridge",
    "macvlan",
    "host-local",
    "static",
    "loopback",
    "portmap",
    "bandwidth",
];

pub fn by_name(name: &str) -> Option<Box<dyn Plugin>> {
    Some(match name {
        "bridge" => Box::new(bridge::Bridge),
        "macvlan" => Box::new(macvlan::Macvlan),
        "host-local" => Box::new(crate::ipam::HostLocal),
        "static" => Box::new(crate::ipam::fixed::Static),
        "loopback" => Box::new(loopback::Loopback),
        "portmap" => Box::new(portmap::Portmap),
        "bandwidth" => Box::new(bandwidth::Bandwidth),
        "podnet" => Box::new(meta::Meta),
        _ => return None,
    })
}
