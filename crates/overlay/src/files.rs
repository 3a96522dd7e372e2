//! The files a node agent leaves for the CNI side: `subnet.env` (flannel's
//! variable names plus PODNET_ ones) and the conflist the runtime reads.
//! Both are written atomically (temp file + rename) and only when changed.

use std::path::{Path, PathBuf};

use ipnet::{Ipv4Net, Ipv6Net};

/// The subnet.env text for a lease; `six` is the IPv6 network and this
/// node's IPv6 subnet in a dual-stack cluster (flannel's `*_IPV6_*`).
pub fn subnet_env(
    network: Ipv4Net,
    subnet: Ipv4Net,
    mtu: u32,
    ipmasq: bool,
    six: Option<(Ipv6Net, Ipv6Net)>,
) -> String {
    // flannel writes the subnet's first address with the subnet's length.
    let first = Ipv4Net::new(
        std::net::Ipv4Addr::from(u32::from(subnet.network()) + 1),
        subnet.prefix_len(),
    )
    .expect("valid prefix");
    let mut s = String::new();
    for p in ["FLANNEL", "PODNET"] {
        s.push_str(&format!(
            "{p}_NETWORK={network}\n{p}_SUBNET={first}\n{p}_MTU={mtu}\n{p}_IPMASQ={ipmasq}\n"
        ));
        if let Some((net6, sub6)) = six {
            let first6 = Ipv6Net::new(
                std::net::Ipv6Addr::from(u128::from(sub6.network()) + 1),
                sub6.prefix_len(),
            )
            .expect("valid prefix");
            s.push_str(&format!(
                "{p}_IPV6_NETWORK={net6}\n{p}_IPV6_SUBNET={first6}\n"
            ));
        }
    }
    s
}

/// The subnet a previous run wrote, if any (to get it back after restart).
pub fn previous_subnet(path: &Path) -> Option<Ipv4Net> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))
        .and_then(|v| v.trim().parse::<Ipv4Net>().ok())
        .map(|n| n.trunc())
}

/// The node's conflist: the podnet meta-plugin, then portmap and bandwidth.
/// It requires the agent (`requireAgent`): an ADD while the agent is down
/// fails instead of wiring a pod whose traffic would be dropped. (A
/// conflist without the key, as older agents wrote, only tells an agent
/// that listens, so a node mid-upgrade keeps taking pods.)
pub fn conflist(subnet_file: &Path, data_dir: Option<&Path>) -> serde_json::Value {
    let mut meta =
        serde_json::json!({"type": "podnet", "subnetFile": subnet_file, "requireAgent": true});
    let mut pm = serde_json::json!({"type": "portmap", "capabilities": {"portMappings": true}});
    if let Some(d) = data_dir {
        meta["dataDir"] = serde_json::json!(d.join("podnet"));
        meta["ipamDataDir"] = serde_json::json!(d.join("networks"));
        pm["stateDir"] = serde_json::json!(d.join("portmap"));
    }
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "podnet",
        "plugins": [meta, pm, {"type": "bandwidth", "capabilities": {"bandwidth": true}}]
    })
}

pub const CONFLIST_NAME: &str = "10-podnet.conflist";

/// Writes `text` to `path` atomically, only if it differs.
pub fn write_if_changed(path: &Path, text: &str) -> std::io::Result<bool> {
    if std::fs::read_to_string(path).ok().as_deref() == Some(text) {
        return Ok(false);
    }
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let tmp: PathBuf = path.with_extension("podnet-tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_has_flannel_names() {
        let t = subnet_env(
            "10.244.0.0/16".parse().unwrap(),
            "10.244.3.0/24".parse().unwrap(),
            1450,
            true,
            None,
        );
        assert!(!t.contains("IPV6"));
        let six = (
            "fd00:10:244::/56".parse().unwrap(),
            "fd00:10:244:3::/64".parse().unwrap(),
        );
        let d = subnet_env(
            "10.244.0.0/16".parse().unwrap(),
            "10.244.3.0/24".parse().unwrap(),
            1450,
            true,
            Some(six),
        );
        assert!(d.contains("FLANNEL_IPV6_NETWORK=fd00:10:244::/56\n"), "{d}");
        assert!(
            d.contains("FLANNEL_IPV6_SUBNET=fd00:10:244:3::1/64\n"),
            "{d}"
        );
        assert!(
            d.contains("PODNET_IPV6_SUBNET=fd00:10:244:3::1/64\n"),
            "{d}"
        );
        assert!(t.contains("FLANNEL_NETWORK=10.244.0.0/16\n"));
        assert!(t.contains("FLANNEL_SUBNET=10.244.3.1/24\n"));
        assert!(t.contains("FLANNEL_MTU=1450\n"));
        assert!(t.contains("FLANNEL_IPMASQ=true\n"));
        assert!(t.contains("PODNET_SUBNET=10.244.3.1/24\n"));
        let dir = std::env::temp_dir().join(format!("pn-files-{}", std::process::id()));
        let p = dir.join("subnet.env");
        assert!(write_if_changed(&p, &t).unwrap());
        assert!(!write_if_changed(&p, &t).unwrap());
        assert_eq!(previous_subnet(&p), Some("10.244.3.0/24".parse().unwrap()));
        let _ = std::fs::remove_dir_all(dir);
    }
}
