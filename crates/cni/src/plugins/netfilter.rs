//! The nftables state the CNI plugins own, as data in sets rather than one
//! rule per container.
//!
//! Table `inet podnet-cni` masquerades pod traffic (bridge `ipMasq`):
//! - `masq4`/`masq6` hold pod addresses to masquerade;
//! - `nomasq4`/`nomasq6` hold `pod . own-subnet` pairs that are left alone,
//!   so pods on one bridge talk without NAT, as with the reference plugin.
//!
//! Table `bridge podnet-cni` enforces `macspoofchk`: frames entering from a
//! listed port must carry that port's container MAC.
//!
//! Adding is idempotent (base chains are flushed and rewritten in the same
//! transaction; elements are added, which never fails on duplicates).
//! Removal adds then deletes each element, so removing twice is fine too.

use ipnet::IpNet;
use podnet_nft::{apply, quote, NftError};

pub const MASQ_TABLE: &str = "podnet-cni";

fn masq_header(s: &mut String) {
    s.push_str(&format!(
        "add table inet {t}\n\
         add chain inet {t} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}\n\
         add set inet {t} masq4 {{ type ipv4_addr; }}\n\
         add set inet {t} masq6 {{ type ipv6_addr; }}\n\
         add set inet {t} nomasq4 {{ type ipv4_addr . ipv4_addr; flags interval; }}\n\
         add set inet {t} nomasq6 {{ type ipv6_addr . ipv6_addr; flags interval; }}\n",
        t = MASQ_TABLE
    ));
}

fn masq_elements(n: &IpNet, comment: &str) -> [(String, String); 2] {
    let (m, nm) = if n.addr().is_ipv4() {
        ("masq4", "nomasq4")
    } else {
        ("masq6", "nomasq6")
    };
    [
        (
            m.to_string(),
            format!("{} comment {}", n.addr(), quote(comment)),
        ),
        (nm.to_string(), format!("{} . {}", n.addr(), n.trunc())),
    ]
}

/// Masquerades traffic from each pod address leaving its own subnet.
pub fn masq_add(addrs: &[IpNet], comment: &str) -> Result<(), NftError> {
    let mut s = String::new();
    masq_header(&mut s);
    let t = MASQ_TABLE;
    s.push_str(&format!(
        "flush chain inet {t} postrouting\n\
         add rule inet {t} postrouting ip saddr . ip daddr @nomasq4 return\n\
         add rule inet {t} postrouting ip saddr @masq4 ip daddr != 224.0.0.0/4 masquerade\n\
         add rule inet {t} postrouting ip6 saddr . ip6 daddr @nomasq6 return\n\
         add rule inet {t} postrouting ip6 saddr @masq6 ip6 daddr != ff00::/8 masquerade\n"
    ));
    for n in addrs {
        for (set, el) in masq_elements(n, comment) {
            s.push_str(&format!("add element inet {t} {set} {{ {el} }}\n"));
        }
    }
    apply("adding masquerade for pod addresses", &s)
}

pub fn masq_del(addrs: &[IpNet]) -> Result<(), NftError> {
    if addrs.is_empty() {
        return Ok(());
    }
    let mut s = String::new();
    masq_header(&mut s);
    let t = MASQ_TABLE;
    for n in addrs {
        for (set, el) in masq_elements(n, "") {
            let el = el.split(" comment").next().unwrap_or(&el).to_string();
            s.push_str(&format!("add element inet {t} {set} {{ {el} }}\n"));
            s.push_str(&format!("delete element inet {t} {set} {{ {el} }}\n"));
        }
    }
    apply("removing masquerade for pod addresses", &s)
}

/// Whether a pod address is currently masqueraded (for CHECK).
pub fn masq_present(n: &IpNet) -> Result<bool, NftError> {
    let set = if n.addr().is_ipv4() { "masq4" } else { "masq6" };
    match podnet_nft::query(&[
        "get",
        "element",
        "inet",
        MASQ_TABLE,
        set,
        &format!("{{ {} }}", n.addr()),
    ]) {
        Ok(_) => Ok(true),
        Err(NftError::Failed { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

fn spoof_header(s: &mut String) {
    s.push_str(&format!(
        "add table bridge {t}\n\
         add chain bridge {t} prerouting {{ type filter hook prerouting priority -300; policy accept; }}\n\
         add set bridge {t} spoofports {{ type ifname; }}\n\
         add set bridge {t} spoofok {{ type ifname . ether_addr; }}\n",
        t = MASQ_TABLE
    ));
}

/// Drops frames from `port` whose source MAC is not `mac`.
pub fn macspoof_add(port: &str, mac: &str) -> Result<(), NftError> {
    let mut s = String::new();
    spoof_header(&mut s);
    let t = MASQ_TABLE;
    s.push_str(&format!(
        "flush chain bridge {t} prerouting\n\
         add rule bridge {t} prerouting iifname @spoofports iifname . ether saddr != @spoofok drop\n\
         add element bridge {t} spoofports {{ {p} }}\n\
         add element bridge {t} spoofok {{ {p} . {mac} }}\n",
        p = quote(port)
    ));
    apply("adding MAC spoof check", &s)
}

pub fn macspoof_del(port: &str, mac: Option<&str>) -> Result<(), NftError> {
    let mut s = String::new();
    spoof_header(&mut s);
    let t = MASQ_TABLE;
    let p = quote(port);
    s.push_str(&format!(
        "add element bridge {t} spoofports {{ {p} }}\ndelete element bridge {t} spoofports {{ {p} }}\n"
    ));
    if let Some(mac) = mac {
        s.push_str(&format!(
            "add element bridge {t} spoofok {{ {p} . {mac} }}\ndelete element bridge {t} spoofok {{ {p} . {mac} }}\n"
        ));
    }
    apply("removing MAC spoof check", &s)
}
