//! wireguard: the encrypted overlay (`"Encrypt": true` in the network
//! config, over any backend type but bgp). A TUN device `podnet.wg` holds
//! the whole cluster network, and the agent's WireGuard tunnel
//! ([`crate::wg`]) carries its packets to each node, encrypted, over UDP
//! 51820. The kernel here has no WireGuard, so the protocol runs in the
//! agent (boringtun's state machine, podnet's batched I/O).
//!
//! Each node has its own X25519 key, kept in `wireguard.key` beside the
//! subnet file (created on first start, 0600), and publishes its public
//! key as flannel's wireguard backend does: `{"PublicKey": "<base64>"}`
//! in its lease or Node annotation. A node that publishes none (one not
//! yet running with `Encrypt`, mid-rollout) is not reached: the tunnel
//! fails closed, and the plan says so.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use base64::Engine;
use boringtun::x25519::{PublicKey, StaticSecret};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use podnet_kernel::{Handle, KernelError};

use crate::kernel::Device;
use crate::plan::{Desired, NodeView};
use crate::wg::WgTunnel;

pub const DEV: &str = "podnet.wg";
pub const KEY_FILE: &str = "wireguard.key";

pub struct Wireguard {
    pub port: u16,
    secret: StaticSecret,
    tun: Option<std::fs::File>,
    tunnel: Option<WgTunnel>,
}

/// A key as WireGuard's tools write it: 32 bytes, base64.
pub fn encode_key(k: &[u8; 32]) -> String {
    base64::engine::general_purpose::STANDARD.encode(k)
}

pub fn decode_key(s: &str) -> Option<[u8; 32]> {
    base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .ok()?
        .try_into()
        .ok()
}

/// The node's private key from `path`, made there (0600) when absent. A
/// file that holds no key is an error, never silently replaced: the key
/// is the node's identity to its peers.
pub fn load_or_create_key(path: &Path) -> Result<StaticSecret, String> {
    match std::fs::read_to_string(path) {
        Ok(s) => decode_key(&s)
            .map(StaticSecret::from)
            .ok_or_else(|| format!("{}: not a WireGuard key (32 bytes, base64)", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut b = [0u8; 32];
            // SAFETY: valid buffer; getrandom fills it.
            let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 32, 0) };
            if n != 32 {
                return Err("getrandom failed".into());
            }
            write_private(path, &encode_key(&b))
                .map_err(|e| format!("writing {}: {e}", path.display()))?;
            tracing::info!(path = %path.display(), "made this node's WireGuard key");
            Ok(StaticSecret::from(b))
        }
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())
}

/// A node's published public key.
pub fn public_key_of(backend_data: &serde_json::Value) -> Option<[u8; 32]> {
    decode_key(backend_data.get("PublicKey")?.as_str()?)
}

impl Wireguard {
    /// With the node's key from `key_path` (see [`load_or_create_key`]).
    pub fn new(port: u16, key_path: &Path) -> Result<Wireguard, String> {
        Ok(Wireguard {
            port,
            secret: load_or_create_key(key_path)?,
            tun: None,
            tunnel: None,
        })
    }

    pub fn key_path(state_dir: &Path) -> PathBuf {
        state_dir.join(KEY_FILE)
    }

    pub fn public_key(&self) -> [u8; 32] {
        PublicKey::from(&self.secret).to_bytes()
    }

    /// Opens the TUN device (first call) and sets its MTU and state.
    pub fn ensure_device(&mut self, h: &mut Handle, mtu: u32) -> Result<Device, KernelError> {
        crate::kernel::ensure_tun(h, DEV, &mut self.tun, self.tunnel.is_some(), mtu)
    }

    pub fn data(&self) -> serde_json::Value {
        serde_json::json!({"PublicKey": encode_key(&self.public_key())})
    }

    /// Starts the tunnel's threads on the opened device.
    pub fn start(&mut self, underlay_ip: Ipv4Addr) -> Result<(), String> {
        let tun = self.tun.take().ok_or("the TUN device is not open")?;
        self.tunnel = Some(
            WgTunnel::start(tun, underlay_ip, self.port, self.secret.clone())
                .map_err(|e| format!("starting the WireGuard tunnel on port {}: {e}", self.port))?,
        );
        Ok(())
    }

    pub fn set_peers(&self, peers: Vec<(Vec<IpNet>, Ipv4Addr, [u8; 32])>) {
        if let Some(t) = &self.tunnel {
            t.set_peers(peers);
        }
    }

    pub fn tunnel(&self) -> Option<&WgTunnel> {
        self.tunnel.as_ref()
    }
}

/// The pod MTU: the underlay's minus the headers, and a multiple of 16
/// (WireGuard pads each packet to one), so a full packet is never padded
/// past the underlay's MTU.
pub fn mtu(underlay_mtu: u32) -> u32 {
    (underlay_mtu - crate::wg::OVERHEAD) & !15
}

/// One route per family (the whole network into the TUN device); nodes
/// that publish no key are reported: nothing reaches them until they do.
pub fn plan(
    network: Ipv4Net,
    network6: Option<Ipv6Net>,
    others: &[&NodeView],
) -> (Desired, Vec<String>) {
    let (want, _) = super::udp::plan(network, network6);
    let problems = others
        .iter()
        .filter(|n| n.wg_key.is_none())
        .map(|n| {
            format!(
                "node {} ({}) publishes no WireGuard key: its pods ({}) are unreachable until it runs with Encrypt",
                n.name, n.public_ip, n.subnet
            )
        })
        .collect();
    (want, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_made_once_and_kept_private() {
        let d = tempfile_dir();
        let p = d.join(KEY_FILE);
        let a = load_or_create_key(&p).unwrap();
        let b = load_or_create_key(&p).unwrap();
        assert_eq!(
            a.to_bytes(),
            b.to_bytes(),
            "the second start reads the first key"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::write(&p, "not a key").unwrap();
        let e = load_or_create_key(&p).err().unwrap();
        assert!(e.contains("not a WireGuard key"), "{e}");
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn keys_read_as_wg_writes_them() {
        // `wg pubkey` of this private key (RFC 7748's Alice).
        let private = "dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo=";
        let secret = StaticSecret::from(decode_key(private).unwrap());
        assert_eq!(
            encode_key(&PublicKey::from(&secret).to_bytes()),
            "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo="
        );
        let data = serde_json::json!({"PublicKey": "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo="});
        assert!(public_key_of(&data).is_some());
        assert_eq!(public_key_of(&serde_json::json!({"VtepMAC": "x"})), None);
        assert_eq!(mtu(1500), 1440);
        assert_eq!(mtu(1450), 1376);
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("pn-wgkey-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }
}
