//! The `bridge` plugin: a Linux bridge on the host, a veth pair per
//! attachment with one end in the pod, addresses from the IPAM plugin named
//! in `ipam.type`, and optionally the gateway address on the bridge,
//! masquerade and a MAC spoof check. Config keys are the reference plugin's.
//!
//! ADD builds in the reference plugin's order, each step undoable: the
//! bridge, then the veth (born directly in the pod namespace, so a taken
//! interface name fails here, before any address is allocated), then IPAM,
//! then addresses and routes. Any failure runs the undo list, so a failed
//! ADD leaves nothing behind; host-local run in-process is put back exactly,
//! round-robin cursor included.

use std::net::IpAddr;

use ipnet::IpNet;
use podnet_kernel::detach::LinkRef;
use podnet_kernel::{Handle, KernelError, Link, LinkKind, Netns};
use serde::Deserialize;
use serde_json::Value;

use crate::error::{CniError, Code};
use crate::invoke::{delegate, ipam_add, ipam_type_of, IpamLease};
use crate::plugins::netfilter;
use crate::plugins::podside::{configure_pod_iface, open_netns, parse_mac};
use crate::skel::{CmdArgs, Command, Plugin};
use crate::types::{self, runtime_key, CniResult, Dns, Interface, RouteConf};

#[derive(Debug, Deserialize)]
pub struct BridgeConf {
    #[serde(default)]
    pub name: String,
    #[serde(default = "default_bridge")]
    pub bridge: String,
    #[serde(rename = "isGateway", default)]
    pub is_gateway: bool,
    #[serde(rename = "isDefaultGateway", default)]
    pub is_default_gateway: bool,
    #[serde(rename = "forceAddress", default)]
    pub force_address: bool,
    #[serde(rename = "ipMasq", default)]
    pub ip_masq: bool,
    #[serde(default)]
    pub mtu: Option<u32>,
    #[serde(rename = "hairpinMode", default)]
    pub hairpin_mode: bool,
    #[serde(rename = "promiscMode", default)]
    pub promisc_mode: bool,
    #[serde(default)]
    pub vlan: Option<u32>,
    #[serde(default)]
    pub macspoofchk: bool,
    #[serde(rename = "enabledad", default)]
    pub enable_dad: bool,
    #[serde(default)]
    pub ipam: Option<Value>,
    #[serde(default)]
    pub dns: Option<Dns>,
    #[serde(rename = "runtimeConfig", default)]
    pub runtime_config: Option<Value>,
    #[serde(rename = "prevResult", default)]
    pub prev_result: Option<Value>,
    /// podnet extension: put the host side of the veth in this netdev
    /// group. The `podnet` meta-plugin asks for the agent's anti-spoofing
    /// guard, which judges the ports of that group (and only them).
    #[serde(rename = "podnetPortGroup", default)]
    pub port_group: Option<u32>,
}

fn default_bridge() -> String {
    "cni0".to_string()
}

impl BridgeConf {
    pub fn parse(stdin: &[u8]) -> Result<BridgeConf, CniError> {
        let mut c: BridgeConf = types::parse_conf(stdin)?;
        if c.is_default_gateway {
            c.is_gateway = true;
        }
        if c.hairpin_mode && c.promisc_mode {
            return Err(CniError::config(
                "bridge: cannot set hairpinMode and promiscMode at the same time",
            ));
        }
        if c.vlan.unwrap_or(0) != 0 {
            return Err(CniError::new(
                Code::UnsupportedField,
                "bridge: \"vlan\" is unsupported by podnet (VLAN filtering is not available here)",
            ));
        }
        if c.bridge.is_empty() || c.bridge.len() > 15 {
            return Err(CniError::config(format!(
                "bridge: invalid bridge name {:?}",
                c.bridge
            )));
        }
        ipam_type_of("bridge", c.ipam.as_ref())?;
        Ok(c)
    }

    /// The owner recorded on this attachment's masquerade elements.
    fn masq_owner(&self, container_id: &str) -> String {
        format!("{}/{}", self.name, container_id)
    }

    /// Checked when parsed, so it cannot fail here.
    fn ipam_type(&self) -> Option<String> {
        ipam_type_of("bridge", self.ipam.as_ref()).ok().flatten()
    }
}

/// Deletes link `index` (in `ns`, or the plugin's own namespace) and, with
/// it, a veth's peer `host_peer` in the plugin's namespace. DEL returns as
/// soon as the kernel has removed both from view (their RTM_DELLINK): the
/// kernel's reclamation after that, an RCU barrier of 10-30 ms that would
/// otherwise block the netlink call, is waited out by a helper process (see
/// `podnet_kernel::detach`). `PODNET_CNI_SYNC_DEL=1` makes DEL wait for it.
fn remove_link(ns: Option<&Netns>, index: u32, host_peer: Option<u32>) -> Result<(), KernelError> {
    if std::env::var_os("PODNET_CNI_SYNC_DEL").is_some_and(|v| v == "1") {
        let mut h = match ns {
            Some(ns) => Handle::in_netns(ns)?,
            None => Handle::new()?,
        };
        return h.delete_link(index);
    }
    let also: Vec<LinkRef<'_>> = host_peer
        .map(|i| LinkRef { ns: None, index: i })
        .into_iter()
        .collect();
    podnet_kernel::detach::delete_link_detached(LinkRef { ns, index }, &also)
}

/// A random host-side veth name, as the reference plugin makes them.
pub fn random_veth_name() -> String {
    let mut b = [0u8; 4];
    // SAFETY: valid buffer; getrandom fills it.
    unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 4, 0) };
    format!("veth{:02x}{:02x}{:02x}{:02x}", b[0], b[1], b[2], b[3])
}

/// Creates the bridge if needed, or checks that the existing link is one.
/// Either way the bridge ends up with a pinned MAC (see [`pin_bridge_mac`]).
fn ensure_bridge(h: &mut Handle, c: &BridgeConf) -> Result<(Link, bool), CniError> {
    let mut created = false;
    let mut link = match h.link(&c.bridge)? {
        Some(l) if l.kind != LinkKind::Bridge => {
            return Err(CniError::internal(format!(
                "bridge: {:?} already exists but is not a bridge",
                c.bridge
            )))
        }
        Some(l) => l,
        None => {
            match h.create_bridge(&c.bridge, c.mtu, Some(random_mac())) {
                Ok(()) => created = true,
                // Another ADD created it at the same moment.
                Err(e) if e.is_exists() => {}
                Err(e) => return Err(e.into()),
            }
            h.require_link(&c.bridge)?
        }
    };
    if !created {
        if let Some(mac) = pin_bridge_mac(h, &link)? {
            link.mac = Some(mac);
        }
    }
    if c.promisc_mode && !link.is_promisc() {
        h.set_promisc(link.index, true)?;
    }
    if !link.is_up() {
        h.set_up(link.index)?;
    }
    Ok((link, created))
}

/// A bridge whose MAC the kernel chose takes the lowest MAC among its
/// ports, so its MAC changes as pods come and go (and is all zeros once the
/// last one left), and pods keep sending to the gateway MAC they cached,
/// which may no longer be the bridge's: traffic off the node fails until
/// their neighbour entry is renewed. A MAC set by userspace
/// (`addr_assign_type` 3) is kept. We create bridges with one; this
/// repairs a bridge that has none (made by an older podnet, or by someone
/// else): it pins the MAC the bridge has now, which its pods know, or a
/// new random one when it has none. Returns the MAC it pinned, if any.
fn pin_bridge_mac(h: &mut Handle, br: &Link) -> Result<Option<[u8; 6]>, CniError> {
    let how = podnet_kernel::netns::addr_assign_type(br)?;
    if how == podnet_kernel::rtnl::NET_ADDR_SET {
        return Ok(None);
    }
    let mac = br.mac.filter(is_unicast_mac).unwrap_or_else(random_mac);
    h.set_mac(br.index, mac)?;
    tracing::info!(
        bridge = %br.name,
        mac = %podnet_kernel::rtnl::format_mac(&mac),
        addr_assign_type = how,
        "pinned the bridge's MAC (it followed its ports' MACs)"
    );
    Ok(Some(mac))
}

/// A usable unicast address: not all zeros, not multicast.
fn is_unicast_mac(m: &[u8; 6]) -> bool {
    m.iter().any(|b| *b != 0) && m[0] & 1 == 0
}

/// A random locally administered unicast MAC, as the kernel makes them.
fn random_mac() -> [u8; 6] {
    let mut b = [0u8; 6];
    // SAFETY: valid buffer; getrandom fills it.
    unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 6, 0) };
    b[0] = (b[0] & 0xfe) | 0x02;
    b
}

/// The first address of a subnet, used as gateway when IPAM gives none.
fn calc_gateway(n: &IpNet) -> IpAddr {
    crate::ipam::alloc::add(n.network(), 1)
}

fn enable_forwarding(v6: bool) -> Result<(), KernelError> {
    let key = if v6 {
        "net.ipv6.conf.all.forwarding"
    } else {
        "net.ipv4.ip_forward"
    };
    if podnet_kernel::netns::read_sysctl(key).ok().as_deref() != Some("1") {
        podnet_kernel::netns::write_sysctl(key, "1")?;
    }
    Ok(())
}

/// Puts the gateway address on the bridge, honouring forceAddress.
fn ensure_bridge_addr(h: &mut Handle, br: &Link, gw: IpNet, force: bool) -> Result<(), CniError> {
    let existing = h.addrs(br.index)?;
    for a in existing
        .iter()
        .filter(|a| a.net.addr().is_ipv4() == gw.addr().is_ipv4())
    {
        if a.net == gw {
            return Ok(());
        }
        if a.net.trunc() == gw.trunc() || (a.net.addr().is_ipv4() && a.net.contains(&gw.addr())) {
            if !force {
                return Err(CniError::internal(format!(
                    "bridge: {:?} already has an IP address different from {gw} ({})",
                    br.name, a.net
                )));
            }
            h.del_addr(br.index, a.net)?;
        }
    }
    match h.add_addr(br.index, gw, true) {
        Ok(()) => Ok(()),
        Err(e) if e.is_exists() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

pub struct Bridge;

struct Undo<'a> {
    args: &'a CmdArgs,
    ipam: Option<IpamLease>,
    /// The bridge, when this ADD created it.
    bridge: Option<u32>,
    host_veth: Option<String>,
    /// The masquerade elements' owner and addresses, once added.
    masq: Option<(String, Vec<IpNet>)>,
    spoof: Option<(String, String)>,
    armed: bool,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(mut h) = Handle::new() {
            if let Some(v) = &self.host_veth {
                let _ = h.delete_link_by_name(v);
            }
            // Remove a bridge this ADD created, unless another pod joined it meanwhile.
            if let Some(b) = self.bridge {
                let ports = h
                    .links()
                    .map(|ls| ls.iter().any(|l| l.master == Some(b)))
                    .unwrap_or(true);
                if !ports {
                    let _ = h.delete_link(b);
                }
            }
        }
        if let Some((owner, addrs)) = &self.masq {
            let _ = netfilter::masq_del(owner, addrs);
        }
        if let Some((p, m)) = &self.spoof {
            let _ = netfilter::macspoof_del(p, Some(m));
        }
        if let Some(lease) = self.ipam.take() {
            if let Err(e) = lease.rollback(self.args, &self.args.stdin) {
                tracing::warn!("bridge: rolling back IPAM after a failed ADD: {e}");
            }
        }
    }
}

impl<'a> Undo<'a> {
    /// Armed and empty: each ADD step records what it made as it goes.
    fn new(args: &'a CmdArgs) -> Undo<'a> {
        Undo {
            args,
            ipam: None,
            bridge: None,
            host_veth: None,
            masq: None,
            spoof: None,
            armed: true,
        }
    }
}

/// The MAC asked for through the `mac` capability, if any.
fn requested_mac(c: &BridgeConf) -> Result<Option<[u8; 6]>, CniError> {
    runtime_key(&c.runtime_config, "mac")
        .and_then(|m| m.as_str())
        .map(|s| parse_mac(s).ok_or_else(|| CniError::config(format!("bridge: invalid mac {s:?}"))))
        .transpose()
}

/// Creates the veth pair, its pod end born as `ifname` inside `ns` and its
/// host end on the bridge; returns the host end's name. A random host name
/// that is taken is drawn again (a few times); a pod name that is taken is
/// the caller's error.
fn create_veth_pair(
    host: &mut Handle,
    pod: &mut Handle,
    ns: &Netns,
    ifname: &str,
    br: &Link,
    mtu: Option<u32>,
    mac: Option<[u8; 6]>,
) -> Result<String, CniError> {
    let mut host_name = random_veth_name();
    let mut attempts = 0;
    loop {
        match host.create_veth_port(&host_name, ifname, Some(ns.fd()), mtu, mac, Some(br.index)) {
            Ok(()) => return Ok(host_name),
            Err(e) if e.is_exists() && host.link(&host_name)?.is_some() && attempts < 4 => {
                attempts += 1;
                host_name = random_veth_name()
            }
            Err(e) if e.is_exists() && pod.link(ifname)?.is_some() => {
                return Err(CniError::internal(format!(
                    "bridge: container veth name {ifname:?} already exists"
                )))
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Makes sure the host end is enslaved to the bridge, up, and has the
/// hairpin and port-group settings asked for. It is born enslaved and up
/// (one round trip); that is checked, not assumed.
fn attach_host_veth(
    host: &mut Handle,
    c: &BridgeConf,
    host_name: &str,
    br: &Link,
) -> Result<Link, CniError> {
    let hv = host.require_link(host_name)?;
    if hv.master != Some(br.index) {
        host.set_master(hv.index, br.index)?;
    }
    if c.hairpin_mode {
        host.set_hairpin(hv.index, true)?;
    }
    if let Some(g) = c.port_group {
        host.set_group(hv.index, g)?;
    }
    if !hv.is_up() {
        host.set_up(hv.index)?;
    }
    Ok(hv)
}

/// ADD through the configured IPAM plugin (none: an empty result, layer 2
/// only). The lease goes on the undo list before the result is judged, so
/// an unusable answer is rolled back too.
fn run_ipam(c: &BridgeConf, args: &CmdArgs, undo: &mut Undo<'_>) -> Result<CniResult, CniError> {
    let Some(t) = c.ipam_type() else {
        return Ok(CniResult::default());
    };
    let (r, lease) = ipam_add(&t, args, &args.stdin)?;
    undo.ipam = Some(lease);
    if r.ips.is_empty() {
        return Err(CniError::internal(
            "bridge: IPAM plugin returned missing IP config",
        ));
    }
    Ok(r)
}

/// For `isGateway`: every address gets a gateway (the subnet's first
/// address unless IPAM named one), and with `isDefaultGateway` each family
/// gets a default route through it unless IPAM gave one.
fn fill_gateways(result: &mut CniResult, default_route: bool) {
    for ip in &mut result.ips {
        if ip.gateway.is_none() {
            ip.gateway = Some(calc_gateway(&ip.address));
        }
    }
    if !default_route {
        return;
    }
    for ip in &result.ips {
        let v4 = ip.address.addr().is_ipv4();
        let dflt: IpNet = if v4 {
            "0.0.0.0/0".parse().unwrap()
        } else {
            "::/0".parse().unwrap()
        };
        if !result.routes.iter().any(|r| r.dst == dflt) {
            result.routes.push(RouteConf::new(dflt, ip.gateway));
        }
    }
}

/// Puts each gateway on the bridge (with its address's prefix) and turns
/// on forwarding for its family.
fn ensure_gateway_addrs(
    host: &mut Handle,
    br: &Link,
    result: &CniResult,
    force: bool,
) -> Result<(), CniError> {
    for ip in &result.ips {
        if let Some(gw) = ip.gateway {
            let gnet = IpNet::new(gw, ip.address.prefix_len()).expect("same family prefix");
            ensure_bridge_addr(host, br, gnet, force)?;
            enable_forwarding(gw.is_ipv6())?;
        }
    }
    Ok(())
}

/// What DEL knows of the attachment it takes down: from prevResult first,
/// then from the pod's interface while it still exists.
#[derive(Default)]
struct KnownAttachment {
    /// The pod's addresses, which name the masquerade elements.
    addrs: Vec<IpNet>,
    host_veth: Option<String>,
    pod_mac: Option<String>,
}

/// The addresses and host veth that prevResult recorded, if it is usable.
fn prev_attachment(c: &BridgeConf) -> KnownAttachment {
    let prev = c
        .prev_result
        .as_ref()
        .and_then(|v| CniResult::from_value(v).ok());
    let addrs = prev
        .as_ref()
        .map(|r| r.ips.iter().map(|i| i.address).collect())
        .unwrap_or_default();
    let host_veth = prev
        .as_ref()
        .and_then(|r| {
            r.interfaces
                .iter()
                .find(|i| i.sandbox.is_empty() && i.name != c.bridge)
        })
        .map(|i| i.name.clone());
    KnownAttachment {
        addrs,
        host_veth,
        pod_mac: None,
    }
}

/// Removes the pod's `ifname` with its host end, if it is a veth whose
/// host end sits on `bridge`: DEL must never take away an interface it did
/// not make. What the interface shows (addresses, MAC, host end) is added
/// to `found` first.
fn remove_pod_veth(
    ns: &Netns,
    ifname: &str,
    bridge: &str,
    found: &mut KnownAttachment,
) -> Result<(), KernelError> {
    let mut pod = Handle::in_netns(ns)?;
    let Some(l) = pod.link(ifname)? else {
        return Ok(());
    };
    let mut host = Handle::new()?;
    let br = host.link(bridge)?.map(|b| b.index);
    let ours = match (&l.kind, l.peer) {
        (LinkKind::Veth, Some(p)) => host
            .link_by_index(p)?
            .filter(|h| h.kind == LinkKind::Veth && h.master.is_some() && h.master == br),
        _ => None,
    };
    let Some(hv) = ours else {
        return Ok(());
    };
    for a in pod.addrs(l.index)? {
        if a.scope == 0 && !found.addrs.contains(&a.net) {
            found.addrs.push(a.net);
        }
    }
    found.pod_mac = Some(l.mac_string());
    found.host_veth.get_or_insert(hv.name);
    // Returns once both ends are gone from view.
    remove_link(Some(ns), l.index, Some(hv.index))
}

/// Removes the host veth `name` if it is still there and on `bridge`.
/// Failing to look is not an error (there is nothing DEL could do);
/// failing to remove it is, unless it vanished meanwhile.
fn remove_host_veth(name: &str, bridge: &str) -> Result<(), KernelError> {
    let Ok(mut host) = Handle::new() else {
        return Ok(());
    };
    let Ok(Some(l)) = host.link(name) else {
        return Ok(());
    };
    let br = host.link(bridge).ok().flatten().map(|b| b.index);
    if l.kind == LinkKind::Veth && l.master.is_some() && l.master == br {
        if let Err(e) = remove_link(None, l.index, None) {
            if !e.is_not_found() {
                return Err(e);
            }
        }
    }
    Ok(())
}

impl Plugin for Bridge {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, CniError> {
        let c = BridgeConf::parse(&args.stdin)?;
        let mac = requested_mac(&c)?;
        let ns = open_netns(&args.netns)?;
        let mut host = Handle::new()?;
        let mut pod = Handle::in_netns(&ns)?;
        let mut undo = Undo::new(args);

        let (br, created) = ensure_bridge(&mut host, &c)?;
        if created {
            undo.bridge = Some(br.index);
        }

        // The veth pair, peer born inside the pod's namespace. A name taken
        // inside the pod fails here (EEXIST), before IPAM has allocated.
        let mtu = c.mtu.or(Some(br.mtu)).filter(|m| *m > 0);
        let host_name = create_veth_pair(&mut host, &mut pod, &ns, &args.ifname, &br, mtu, mac)?;
        undo.host_veth = Some(host_name.clone());
        let hv = attach_host_veth(&mut host, &c, &host_name, &br)?;
        let cv = pod.require_link(&args.ifname)?;

        let mut result = run_ipam(&c, args, &mut undo)?;
        if c.is_gateway {
            fill_gateways(&mut result, c.is_default_gateway);
        }
        for ip in &mut result.ips {
            ip.interface = Some(2);
        }
        configure_pod_iface(&mut pod, cv.index, &result, !c.enable_dad)?;

        if c.is_gateway {
            ensure_gateway_addrs(&mut host, &br, &result, c.force_address)?;
        }
        if c.ip_masq && !result.ips.is_empty() {
            let nets: Vec<IpNet> = result.ips.iter().map(|i| i.address).collect();
            let owner = c.masq_owner(&args.container_id);
            undo.masq = Some((owner.clone(), nets.clone()));
            netfilter::masq_add(&nets, &owner)?;
        }
        if c.macspoofchk {
            undo.spoof = Some((host_name.clone(), cv.mac_string()));
            netfilter::macspoof_add(&host_name, &cv.mac_string())?;
        }

        let br_now = host.require_link(&c.bridge)?;
        result.interfaces = vec![
            Interface {
                name: c.bridge.clone(),
                mac: br_now.mac_string(),
                ..Default::default()
            },
            Interface {
                name: host_name,
                mac: hv.mac_string(),
                ..Default::default()
            },
            Interface {
                name: args.ifname.clone(),
                mac: cv.mac_string(),
                sandbox: args.netns.clone(),
                ..Default::default()
            },
        ];
        if result.dns.is_empty() {
            result.dns = c.dns.clone().unwrap_or_default();
        }
        undo.armed = false;
        Ok(result)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), CniError> {
        let c = BridgeConf::parse(&args.stdin)?;
        let mut errors = Vec::new();
        if let Some(t) = c.ipam_type() {
            if let Err(e) = delegate(&t, Command::Del, args, &args.stdin) {
                errors.push(e.to_string());
            }
        }
        let mut found = prev_attachment(&c);
        if !args.netns.is_empty() {
            match Netns::open(&args.netns) {
                Ok(ns) => {
                    if let Err(e) = remove_pod_veth(&ns, &args.ifname, &c.bridge, &mut found) {
                        if !e.is_not_found() {
                            errors.push(e.to_string());
                        }
                    }
                }
                // The namespace is already gone: nothing to remove inside it.
                Err(e) if e.is_not_found() => {}
                Err(e) => errors.push(e.to_string()),
            }
        }
        // With the pod namespace gone, the kernel reaps the pair lazily;
        // remove our end now so DEL leaves nothing behind when it returns.
        if let Some(v) = &found.host_veth {
            if let Err(e) = remove_host_veth(v, &c.bridge) {
                errors.push(e.to_string());
            }
        }
        if c.ip_masq {
            // Found by owner: with the namespace gone and no prevResult,
            // `addrs` is empty and only the owner names the elements.
            if let Err(e) = netfilter::masq_del(&c.masq_owner(&args.container_id), &found.addrs) {
                errors.push(e.to_string());
            }
        }
        if c.macspoofchk {
            if let Some(v) = &found.host_veth {
                if let Err(e) = netfilter::macspoof_del(v, found.pod_mac.as_deref()) {
                    errors.push(e.to_string());
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(CniError::internal(format!(
                "bridge DEL: {}",
                errors.join("; ")
            )))
        }
    }

    fn check(&self, args: &CmdArgs) -> Result<(), CniError> {
        let c = BridgeConf::parse(&args.stdin)?;
        let prev = c
            .prev_result
            .as_ref()
            .ok_or_else(|| CniError::config("bridge: required prevResult missing"))
            .and_then(CniResult::from_value)?;
        if let Some(t) = c.ipam_type() {
            delegate(&t, Command::Check, args, &args.stdin)?;
        }
        let mut host = Handle::new()?;
        match host.link(&c.bridge)? {
            Some(l) if l.kind == LinkKind::Bridge => {}
            _ => {
                return Err(CniError::internal(format!(
                    "bridge: bridge {:?} not found",
                    c.bridge
                )))
            }
        }
        let ns = open_netns(&args.netns)?;
        let mut pod = Handle::in_netns(&ns)?;
        let cv = pod.link(&args.ifname)?.ok_or_else(|| {
            CniError::internal(format!(
                "bridge: interface {:?} not found in {}",
                args.ifname, args.netns
            ))
        })?;
        if let Some(want) = prev
            .interfaces
            .iter()
            .find(|i| i.name == args.ifname && !i.sandbox.is_empty())
        {
            if !want.mac.is_empty() && !want.mac.eq_ignore_ascii_case(&cv.mac_string()) {
                return Err(CniError::internal(format!(
                    "bridge: interface {} has MAC {}, expected {}",
                    args.ifname,
                    cv.mac_string(),
                    want.mac
                )));
            }
        }
        let have = pod.addrs(cv.index)?;
        for ip in &prev.ips {
            if !have.iter().any(|a| a.net == ip.address) {
                return Err(CniError::internal(format!(
                    "bridge: address {} missing from {}",
                    ip.address, args.ifname
                )));
            }
        }
        if let Some(peer) = cv.peer {
            match host.link_by_index(peer)? {
                Some(hv) if hv.master == Some(host.require_link(&c.bridge)?.index) => {}
                _ => {
                    return Err(CniError::internal(format!(
                        "bridge: host side of {} is not attached to {}",
                        args.ifname, c.bridge
                    )))
                }
            }
        }
        if c.ip_masq {
            for ip in &prev.ips {
                if !netfilter::masq_present(&ip.address)? {
                    return Err(CniError::internal(format!(
                        "bridge: masquerade for {} missing",
                        ip.address
                    )));
                }
            }
        }
        Ok(())
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), CniError> {
        let c = BridgeConf::parse(&args.stdin)?;
        if let Some(t) = c.ipam_type() {
            delegate(&t, Command::Gc, args, &args.stdin)?;
        }
        Ok(())
    }

    fn status(&self, args: &CmdArgs) -> Result<(), CniError> {
        let c = BridgeConf::parse(&args.stdin)?;
        if let Some(t) = c.ipam_type() {
            delegate(&t, Command::Status, args, &args.stdin)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_implications() {
        let c = BridgeConf::parse(
            br#"{"cniVersion":"1.0.0","name":"n","type":"bridge","isDefaultGateway":true}"#,
        )
        .unwrap();
        assert_eq!(c.bridge, "cni0");
        assert!(c.is_gateway, "isDefaultGateway implies isGateway");
        assert!(!c.ip_masq && !c.hairpin_mode && !c.promisc_mode);
        assert_eq!(c.ipam_type(), None);
    }

    #[test]
    fn conflicting_and_unsupported_keys() {
        let e = BridgeConf::parse(br#"{"hairpinMode":true,"promiscMode":true}"#).unwrap_err();
        assert_eq!(e.code, 7);
        let e = BridgeConf::parse(br#"{"vlan":100}"#).unwrap_err();
        assert_eq!(e.code, 2);
        assert!(e.msg.contains("unsupported"));
        let e = BridgeConf::parse(br#"{"bridge":"a-name-that-is-far-too-long"}"#).unwrap_err();
        assert!(e.msg.contains("invalid bridge name"));
    }

    #[test]
    fn ipam_type_must_be_an_ipam_plugin() {
        for t in ["bridge", "portmap", "podnet", "loopback", "bandwidth"] {
            let conf = format!(r#"{{"name":"n","type":"bridge","ipam":{{"type":"{t}"}}}}"#);
            let e = BridgeConf::parse(conf.as_bytes()).unwrap_err();
            assert_eq!(e.code, 7, "{t}");
            assert_eq!(
                e.msg,
                format!("bridge: ipam type \"{t}\" is not an IPAM plugin")
            );
        }
        let e = BridgeConf::parse(br#"{"ipam":{"type":5}}"#).unwrap_err();
        assert_eq!(
            (e.code, e.msg.as_str()),
            (7, "bridge: ipam.type must be a string, not a number")
        );
        let e = BridgeConf::parse(br#"{"ipam":"host-local"}"#).unwrap_err();
        assert_eq!(
            (e.code, e.msg.as_str()),
            (7, "bridge: \"ipam\" must be an object, not a string")
        );
        // No IPAM, an empty type (layer 2 only), or a real IPAM plugin.
        for ok in [
            r#"{"ipam":{}}"#,
            r#"{"ipam":null}"#,
            r#"{"ipam":{"type":""}}"#,
            r#"{"ipam":{"type":"host-local"}}"#,
            r#"{"ipam":{"type":"dhcp"}}"#,
        ] {
            BridgeConf::parse(ok.as_bytes()).unwrap();
        }
    }

    #[test]
    fn veth_names_and_gateways() {
        let n = random_veth_name();
        assert!(n.starts_with("veth") && n.len() == 12);
        assert_ne!(n, random_veth_name());
        assert_eq!(
            calc_gateway(&"10.1.2.7/24".parse().unwrap()).to_string(),
            "10.1.2.1"
        );
        for _ in 0..64 {
            let m = random_mac();
            assert!(is_unicast_mac(&m) && m[0] & 2 == 2, "{m:x?}");
        }
        assert!(!is_unicast_mac(&[0; 6]));
        assert!(!is_unicast_mac(&[1, 0, 0x5e, 0, 0, 1]));
    }
}
