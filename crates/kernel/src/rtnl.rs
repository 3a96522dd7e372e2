//! Typed rtnetlink operations.
//!
//! A [`Handle`] is one netlink socket, bound to the namespace it was opened
//! in. Operations take explicit names or indexes and return errors that say
//! which object failed. Observing (`links`, `addrs`, `routes`) returns plain
//! structs so callers can diff them against a plan.

use std::net::IpAddr;
use std::os::fd::{AsRawFd, BorrowedFd};

use ipnet::IpNet;

use crate::nl::{self, Attrs, Msg, Socket};
use crate::{KernelError, Netns};

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const RTM_GETROUTE: u16 = 26;

const IFLA_ADDRESS: u16 = 1;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_LINK: u16 = 5;
const IFLA_MASTER: u16 = 10;
const IFLA_GROUP: u16 = 27;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_EXT_MASK: u16 = 29;
const IFLA_LINK_NETNSID: u16 = 37;
/// Asks the kernel to leave the per-device counters out of link replies:
/// nothing here reads them, and gathering them is most of a GETLINK's cost.
const RTEXT_FILTER_SKIP_STATS: u32 = 1 << 3;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const IFLA_INFO_SLAVE_KIND: u16 = 4;
const IFLA_INFO_SLAVE_DATA: u16 = 5;
const VETH_INFO_PEER: u16 = 1;
const IFLA_BRPORT_MODE: u16 = 4;

const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_FLAGS: u16 = 8;
const IFA_F_NODAD: u32 = 0x02;
const IFA_F_PERMANENT: u32 = 0x80;

const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_VIA: u16 = 18;
const RTA_GATEWAY: u16 = 5;
const RTA_PRIORITY: u16 = 6;
const RTA_PREFSRC: u16 = 7;
const RTA_METRICS: u16 = 8;
const RTA_TABLE: u16 = 15;
const RTAX_MTU: u16 = 2;
const RTAX_ADVMSS: u16 = 8;

pub const RT_TABLE_MAIN: u32 = 254;
pub const RTPROT_BOOT: u8 = 3;
pub const RTPROT_STATIC: u8 = 4;
pub const RT_SCOPE_UNIVERSE: u8 = 0;
pub const RT_SCOPE_LINK: u8 = 253;
pub const RT_SCOPE_HOST: u8 = 254;
const RTN_UNICAST: u8 = 1;
pub const RTNH_F_ONLINK: u32 = 4;

/// `addr_assign_type`: the device's permanent address.
pub const NET_ADDR_PERM: u8 = 0;
/// `addr_assign_type`: set by userspace; a bridge keeps such an address.
pub const NET_ADDR_SET: u8 = 3;

const IFF_UP: u32 = 0x1;
const IFF_PROMISC: u32 = 0x100;

/// How to build a VXLAN device.
#[derive(Debug, Clone)]
pub struct VxlanOpts {
    pub name: String,
    pub vni: u32,
    pub port: u16,
    pub local: Option<IpAddr>,
    /// The underlay device's index.
    pub link: Option<u32>,
    pub mtu: Option<u32>,
    pub mac: Option<[u8; 6]>,
}

/// What kind of link a [`Link`] is, as far as podnet cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkKind {
    Bridge,
    Veth,
    Vxlan,
    Ifb,
    Tun,
    Macvlan,
    Other(String),
    /// No IFLA_INFO_KIND: loopback or a physical device.
    Device,
}

impl LinkKind {
    fn parse(s: &str) -> Self {
        match s {
            "bridge" => LinkKind::Bridge,
            "veth" => LinkKind::Veth,
            "vxlan" => LinkKind::Vxlan,
            "ifb" => LinkKind::Ifb,
            "tun" => LinkKind::Tun,
            "macvlan" => LinkKind::Macvlan,
            o => LinkKind::Other(o.to_string()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub kind: LinkKind,
    pub mtu: u32,
    pub mac: Option<[u8; 6]>,
    pub master: Option<u32>,
    pub flags: u32,
    /// Bridge-port hairpin mode, when the link is enslaved to a bridge.
    pub hairpin: Option<bool>,
    /// IFLA_LINK: a veth's peer index (in the peer's namespace).
    pub peer: Option<u32>,
    /// IFLA_LINK_NETNSID: the namespace the peer is in, as this
    /// namespace numbers it (see [`Handle::nsid_of`]); None when the peer
    /// is in this namespace.
    pub link_netnsid: Option<i32>,
    /// A macvlan's mode.
    pub macvlan_mode: Option<MacvlanMode>,
}

/// How a macvlan's frames reach its siblings on the same parent
/// (`IFLA_MACVLAN_MODE`), by the reference plugin's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacvlanMode {
    /// No frame between siblings.
    Private = 1,
    /// Siblings reach each other through the external switch (hairpin).
    Vepa = 2,
    /// Siblings reach each other directly.
    Bridge = 4,
    /// The one macvlan takes over the parent.
    Passthru = 8,
}

impl MacvlanMode {
    pub fn parse(s: &str) -> Option<MacvlanMode> {
        Some(match s {
            "private" => MacvlanMode::Private,
            "vepa" => MacvlanMode::Vepa,
            "bridge" => MacvlanMode::Bridge,
            "passthru" => MacvlanMode::Passthru,
            _ => return None,
        })
    }

    fn from_u32(v: u32) -> Option<MacvlanMode> {
        [
            MacvlanMode::Private,
            MacvlanMode::Vepa,
            MacvlanMode::Bridge,
            MacvlanMode::Passthru,
        ]
        .into_iter()
        .find(|m| *m as u32 == v)
    }
}

const IFLA_MACVLAN_MODE: u16 = 1;
const IFLA_MACVLAN_BC_QUEUE_LEN: u16 = 7;

/// A macvlan to create: the reference plugin's knobs, nothing more.
#[derive(Debug, Clone)]
pub struct MacvlanSpec<'a> {
    pub name: &'a str,
    /// The parent's index, in the namespace of the handle that creates it.
    pub master: u32,
    pub mode: MacvlanMode,
    /// None: the parent's MTU.
    pub mtu: Option<u32>,
    /// None: a random one from the kernel.
    pub mac: Option<[u8; 6]>,
    /// How many broadcast frames may wait for the siblings (the kernel's
    /// default when None).
    pub bc_queue_len: Option<u32>,
}

impl Link {
    pub fn is_up(&self) -> bool {
        self.flags & IFF_UP != 0
    }
    pub fn is_promisc(&self) -> bool {
        self.flags & IFF_PROMISC != 0
    }
    pub fn mac_string(&self) -> String {
        self.mac.map(|m| format_mac(&m)).unwrap_or_default()
    }
}

pub fn format_mac(m: &[u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addr {
    pub index: u32,
    pub net: IpNet,
    pub scope: u8,
}

/// A route in some table. `dst` of `None` is the default route.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Route {
    pub dst: Option<IpNet>,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
    pub table: Option<u32>,
    pub priority: Option<u32>,
    pub scope: Option<u8>,
    pub protocol: Option<u8>,
    pub prefsrc: Option<IpAddr>,
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    pub onlink: bool,
    /// Address family, derived from dst/gateway when building; set on dumps.
    pub v6: bool,
}

/// A route lookup's answer ([`Handle::route_get`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteLookup {
    pub route: Route,
    /// The route's type: 1 unicast, 2 local, 3 broadcast, 6 blackhole,
    /// 7 unreachable, 8 prohibit.
    pub kind: u8,
}

impl RouteLookup {
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            1 => "unicast",
            2 => "local",
            3 => "broadcast",
            6 => "blackhole",
            7 => "unreachable",
            8 => "prohibit",
            _ => "other",
        }
    }
}

impl Route {
    fn family_v6(&self) -> bool {
        match (self.dst, self.gateway) {
            (Some(d), _) => matches!(d, IpNet::V6(_)),
            (None, Some(g)) => g.is_ipv6(),
            _ => self.v6,
        }
    }
}

/// The start of a request creating link `name` (no other of that name
/// may exist), with its MTU if given; the caller adds the kind.
fn new_link_msg(name: &str, mtu: Option<u32>) -> Msg {
    let mut m = Msg::new(
        RTM_NEWLINK,
        nl::NLM_F_CREATE | nl::NLM_F_EXCL | nl::NLM_F_ACK,
    );
    m.raw(&ifinfomsg(0, 0, 0, 0));
    m.str(IFLA_IFNAME, name);
    if let Some(mtu) = mtu {
        m.u32(IFLA_MTU, mtu);
    }
    m
}

fn ifinfomsg(family: u8, index: u32, flags: u32, change: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0] = family;
    b[4..8].copy_from_slice(&(index as i32).to_ne_bytes());
    b[8..12].copy_from_slice(&flags.to_ne_bytes());
    b[12..16].copy_from_slice(&change.to_ne_bytes());
    b
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn parse_ip(b: &[u8]) -> Option<IpAddr> {
    match b.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(b).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(b).ok()?)),
        _ => None,
    }
}

fn family(v6: bool) -> u8 {
    if v6 {
        libc::AF_INET6 as u8
    } else {
        libc::AF_INET as u8
    }
}

/// One rtnetlink socket in one namespace.
pub struct Handle {
    sock: Socket,
}

impl Handle {
    /// A handle on the calling thread's current namespace.
    pub fn new() -> Result<Self, KernelError> {
        let sock = Socket::open(libc::NETLINK_ROUTE)
            .map_err(|e| KernelError::io("opening rtnetlink socket", e))?;
        Ok(Handle { sock })
    }

    /// A handle on another namespace; the socket stays bound there.
    pub fn in_netns(ns: &Netns) -> Result<Self, KernelError> {
        ns.run(Handle::new)?
    }

    fn req(&mut self, m: Msg, op: &dyn Fn() -> String) -> Result<Vec<nl::Reply>, KernelError> {
        self.sock.request(m, op)
    }

    /// Sends a raw request on this handle's socket (for sibling modules).
    pub(crate) fn request(
        &mut self,
        m: Msg,
        op: &dyn Fn() -> String,
    ) -> Result<Vec<nl::Reply>, KernelError> {
        self.sock.request(m, op)
    }

    // ---------------------------------------------------------------- links

    pub fn links(&mut self) -> Result<Vec<Link>, KernelError> {
        let mut m = Msg::new(RTM_GETLINK, nl::NLM_F_DUMP);
        m.raw(&ifinfomsg(0, 0, 0, 0));
        m.u32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS);
        let replies = self.req(m, &|| "listing links".into())?;
        Ok(replies
            .iter()
            .filter(|r| r.msg_type == RTM_NEWLINK)
            .filter_map(|r| parse_link(&r.body))
            .collect())
    }

    pub fn link(&mut self, name: &str) -> Result<Option<Link>, KernelError> {
        let mut m = Msg::new(RTM_GETLINK, 0);
        m.raw(&ifinfomsg(0, 0, 0, 0));
        m.str(IFLA_IFNAME, name);
        m.u32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS);
        match self.req(m, &|| format!("looking up link {name}")) {
            Ok(r) => Ok(r.first().and_then(|r| parse_link(&r.body))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The number this handle's namespace gives namespace `ns`
    /// (RTM_GETNSID), as a veth's [`Link::link_netnsid`] names its peer's
    /// namespace; None if it has given it none. It tells which namespace
    /// is a veth's other end, where interface indexes and addresses are
    /// only unique per namespace.
    pub fn nsid_of(&mut self, ns: &Netns) -> Result<Option<i32>, KernelError> {
        const RTM_NEWNSID: u16 = 88;
        const RTM_GETNSID: u16 = 90;
        const NETNSA_NSID: u16 = 1;
        const NETNSA_FD: u16 = 3;
        let mut m = Msg::new(RTM_GETNSID, 0);
        m.raw(&[0u8; 4]);
        m.u32(NETNSA_FD, ns.fd().as_raw_fd() as u32);
        let replies = self.req(m, &|| {
            format!("asking the id of netns {}", ns.path().display())
        })?;
        Ok(replies
            .iter()
            .filter(|r| r.msg_type == RTM_NEWNSID && r.body.len() >= 4)
            .flat_map(|r| Attrs::new(&r.body[4..]).collect::<Vec<_>>())
            .find(|(t, v)| *t == NETNSA_NSID && v.len() >= 4)
            .map(|(_, v)| nl::get_u32(v) as i32)
            .filter(|id| *id >= 0))
    }

    pub fn link_by_index(&mut self, index: u32) -> Result<Option<Link>, KernelError> {
        let mut m = Msg::new(RTM_GETLINK, 0);
        m.raw(&ifinfomsg(0, index, 0, 0));
        m.u32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS);
        match self.req(m, &|| format!("looking up link #{index}")) {
            Ok(r) => Ok(r.first().and_then(|r| parse_link(&r.body))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Looks a link up and fails with a clear error when it is missing.
    pub fn require_link(&mut self, name: &str) -> Result<Link, KernelError> {
        self.link(name)?
            .ok_or_else(|| KernelError::Other(format!("link {name} not found")))
    }

    /// Creates a bridge. With `mac`, the bridge is born with that address
    /// set by us (`addr_assign_type` [`NET_ADDR_SET`]), which it then
    /// keeps; without, the kernel gives it a random one and replaces it
    /// with the lowest MAC among its ports whenever a port comes or goes.
    pub fn create_bridge(
        &mut self,
        name: &str,
        mtu: Option<u32>,
        mac: Option<[u8; 6]>,
    ) -> Result<(), KernelError> {
        let mut m = new_link_msg(name, mtu);
        if let Some(mac) = mac {
            m.attr(IFLA_ADDRESS, &mac);
        }
        m.begin(IFLA_LINKINFO).str(IFLA_INFO_KIND, "bridge").end();
        self.req(m, &|| format!("creating bridge {name}"))?;
        Ok(())
    }

    /// Creates a link of a data-less kind (ifb, for example).
    pub fn create_simple(
        &mut self,
        name: &str,
        kind: &str,
        mtu: Option<u32>,
    ) -> Result<(), KernelError> {
        let mut m = new_link_msg(name, mtu);
        m.begin(IFLA_LINKINFO).str(IFLA_INFO_KIND, kind).end();
        self.req(m, &|| format!("creating {kind} link {name}"))
            .map_err(|e| unsupported_kind(e, kind))?;
        Ok(())
    }

    /// Creates a VXLAN device (a VTEP) with learning off: podnet programs
    /// every neighbour and FDB entry itself.
    pub fn create_vxlan(&mut self, v: &VxlanOpts) -> Result<(), KernelError> {
        const IFLA_VXLAN_ID: u16 = 1;
        const IFLA_VXLAN_LINK: u16 = 3;
        const IFLA_VXLAN_LOCAL: u16 = 4;
        const IFLA_VXLAN_LEARNING: u16 = 7;
        const IFLA_VXLAN_PORT: u16 = 15;
        const IFLA_VXLAN_UDP_CSUM: u16 = 18;
        let mut m = new_link_msg(&v.name, v.mtu);
        if let Some(mac) = v.mac {
            m.attr(IFLA_ADDRESS, &mac);
        }
        m.begin(IFLA_LINKINFO).str(IFLA_INFO_KIND, "vxlan");
        m.begin(IFLA_INFO_DATA);
        m.u32(IFLA_VXLAN_ID, v.vni);
        if let Some(l) = v.link {
            m.u32(IFLA_VXLAN_LINK, l);
        }
        if let Some(IpAddr::V4(a)) = v.local {
            m.attr(IFLA_VXLAN_LOCAL, &a.octets());
        }
        m.u8(IFLA_VXLAN_LEARNING, 0);
        m.u16_be(IFLA_VXLAN_PORT, v.port);
        // No outer UDP checksum over IPv4, as RFC 7348 recommends: the inner
        // frame carries its own, and computing and checking a second one per
        // packet costs throughput for nothing.
        m.u8(IFLA_VXLAN_UDP_CSUM, 0);
        m.end().end();
        let name = v.name.clone();
        self.req(m, &|| format!("creating vxlan {name}"))
            .map_err(|e| unsupported_kind(e, "vxlan"))?;
        Ok(())
    }

    /// Creates a macvlan on its parent, born in `ns` when given (so it
    /// never appears here).
    pub fn create_macvlan(
        &mut self,
        spec: &MacvlanSpec<'_>,
        ns: Option<BorrowedFd<'_>>,
    ) -> Result<(), KernelError> {
        let mut m = new_link_msg(spec.name, spec.mtu);
        m.u32(IFLA_LINK, spec.master);
        if let Some(mac) = spec.mac {
            m.attr(IFLA_ADDRESS, &mac);
        }
        if let Some(fd) = ns {
            m.u32(IFLA_NET_NS_FD, fd.as_raw_fd() as u32);
        }
        m.begin(IFLA_LINKINFO).str(IFLA_INFO_KIND, "macvlan");
        m.begin(IFLA_INFO_DATA)
            .u32(IFLA_MACVLAN_MODE, spec.mode as u32);
        if let Some(q) = spec.bc_queue_len {
            m.u32(IFLA_MACVLAN_BC_QUEUE_LEN, q);
        }
        m.end().end();
        let (name, master) = (spec.name, spec.master);
        self.req(m, &|| format!("creating macvlan {name} on link #{master}"))
            .map_err(|e| unsupported_kind(e, "macvlan"))?;
        Ok(())
    }

    /// Creates a veth pair whose peer is born directly in `peer_ns`, which
    /// saves the costly move of a link between namespaces.
    ///
    /// Both ends get one TX and one RX queue. Left to itself the kernel
    /// allocates one per possible CPU and at once trims the real count to
    /// one, which waits for an expedited RCU grace period per device
    /// (0.7 ms for the call instead of 0.43 ms here). The real count is one
    /// either way; only raising it later with `ethtool -L` is given up.
    pub fn create_veth(
        &mut self,
        name: &str,
        peer: &str,
        peer_ns: Option<BorrowedFd<'_>>,
        mtu: Option<u32>,
        peer_mac: Option<[u8; 6]>,
    ) -> Result<(), KernelError> {
        self.create_veth_port(name, peer, peer_ns, mtu, peer_mac, None)
    }

    /// Like [`Handle::create_veth`], with the host end born enslaved to
    /// `master` and up: one netlink round trip instead of three.
    pub fn create_veth_port(
        &mut self,
        name: &str,
        peer: &str,
        peer_ns: Option<BorrowedFd<'_>>,
        mtu: Option<u32>,
        peer_mac: Option<[u8; 6]>,
        master: Option<u32>,
    ) -> Result<(), KernelError> {
        let mut m = Msg::new(
            RTM_NEWLINK,
            nl::NLM_F_CREATE | nl::NLM_F_EXCL | nl::NLM_F_ACK,
        );
        match master {
            Some(mi) => {
                m.raw(&ifinfomsg(0, 0, IFF_UP, IFF_UP));
                m.u32(IFLA_MASTER, mi);
            }
            None => {
                m.raw(&ifinfomsg(0, 0, 0, 0));
            }
        }
        const IFLA_NUM_TX_QUEUES: u16 = 31;
        const IFLA_NUM_RX_QUEUES: u16 = 32;
        m.str(IFLA_IFNAME, name);
        if let Some(mtu) = mtu {
            m.u32(IFLA_MTU, mtu);
        }
        m.u32(IFLA_NUM_TX_QUEUES, 1).u32(IFLA_NUM_RX_QUEUES, 1);
        m.begin(IFLA_LINKINFO).str(IFLA_INFO_KIND, "veth");
        m.begin(IFLA_INFO_DATA).begin_plain(VETH_INFO_PEER);
        m.raw(&ifinfomsg(0, 0, 0, 0));
        m.str(IFLA_IFNAME, peer);
        if let Some(mtu) = mtu {
            m.u32(IFLA_MTU, mtu);
        }
        m.u32(IFLA_NUM_TX_QUEUES, 1).u32(IFLA_NUM_RX_QUEUES, 1);
        if let Some(mac) = peer_mac {
            m.attr(IFLA_ADDRESS, &mac);
        }
        if let Some(fd) = peer_ns {
            m.u32(IFLA_NET_NS_FD, fd.as_raw_fd() as u32);
        }
        m.end().end().end();
        self.req(m, &|| format!("creating veth {name} (peer {peer})"))?;
        Ok(())
    }

    pub fn delete_link(&mut self, index: u32) -> Result<(), KernelError> {
        let mut m = Msg::new(RTM_DELLINK, nl::NLM_F_ACK);
        m.raw(&ifinfomsg(0, index, 0, 0));
        self.req(m, &|| format!("deleting link #{index}"))?;
        Ok(())
    }

    /// Deletes a link by name; a missing link is not an error.
    pub fn delete_link_by_name(&mut self, name: &str) -> Result<bool, KernelError> {
        let mut m = Msg::new(RTM_DELLINK, nl::NLM_F_ACK);
        m.raw(&ifinfomsg(0, 0, 0, 0));
        m.str(IFLA_IFNAME, name);
        match self.req(m, &|| format!("deleting link {name}")) {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn set_flags(
        &mut self,
        index: u32,
        flags: u32,
        mask: u32,
        what: &str,
    ) -> Result<(), KernelError> {
        let mut m = Msg::new(RTM_NEWLINK, nl::NLM_F_ACK);
        m.raw(&ifinfomsg(0, index, flags, mask));
        self.req(m, &|| format!("{what} link #{index}"))?;
        Ok(())
    }

    pub fn set_up(&mut self, index: u32) -> Result<(), KernelError> {
        self.set_flags(index, IFF_UP, IFF_UP, "bringing up")
    }

    pub fn set_down(&mut self, index: u32) -> Result<(), KernelError> {
        self.set_flags(index, 0, IFF_UP, "bringing down")
    }

    pub fn set_up_by_name(&mut self, name: &str) -> Result<(), KernelError> {
        let l = self.require_link(name)?;
        self.set_up(l.index)
    }

    pub fn set_promisc(&mut self, index: u32, on: bool) -> Result<(), KernelError> {
        self.set_flags(
            index,
            if on { IFF_PROMISC } else { 0 },
            IFF_PROMISC,
            "setting promisc on",
        )
    }

    pub fn set_master(&mut self, index: u32, master: u32) -> Result<(), KernelError> {
        let mut m = Msg::new(RTM_NEWLINK, nl::NLM_F_ACK);
        m.raw(&ifinfomsg(0, index, 0, 0));
        m.u32(IFLA_MASTER, master);
        self.req(m, &|| {
            format!("attaching link #{index} to master #{master}")
        })?;
        Ok(())
    }

    /// Sets a link's MAC address. The kernel records it as set by the
    /// user (`addr_assign_type` [`NET_ADDR_SET`]) even when it is the
    /// address the link has already, so a bridge keeps it from then on.
    pub fn set_mac(&mut self, index: u32, mac: [u8; 6]) -> Result<(), KernelError> {
        let mut m = Msg::new(RTM_NEWLINK, nl::NLM_F_ACK);
        m.raw(&ifinfomsg(0, index, 0, 0));
        m.attr(IFLA_ADDRESS, &mac);
        self.req(m, &|| {
            format!("setting MAC {} on link #{index}", format_mac(&mac))
        })?;
        Ok(())
    }

    /// Puts a link in netdev group `group` (what nftables' `meta iifgroup`
    /// reads).
    pub fn set_group(&mut self, index: u32, group: u32) -> Result<(), KernelError> {
        self.set_link_u32(index, IFLA_GROUP, group, &|| {
            format!("putting link #{index} in group {group}")
        })
    }

    pub fn set_mtu(&mut self, index: u32, mtu: u32) -> Result<(), KernelError> {
        self.set_link_u32(index, IFLA_MTU, mtu, &|| {
            format!("setting mtu {mtu} on link #{index}")
        })
    }

    /// Sets one 32-bit attribute of a link.
    fn set_link_u32(
        &mut self,
        index: u32,
        attr: u16,
        value: u32,
        what: &dyn Fn() -> String,
    ) -> Result<(), KernelError> {
        let mut m = Msg::new(RTM_NEWLINK, nl::NLM_F_ACK);
        m.raw(&ifinfomsg(0, index, 0, 0));
        m.u32(attr, value);
        self.req(m, what)?;
        Ok(())
    }

    pub fn set_hairpin(&mut self, index: u32, on: bool) -> Result<(), KernelError> {
        let mut m = Msg::new(RTM_NEWLINK, nl::NLM_F_ACK);
        m.raw(&ifinfomsg(0, index, 0, 0));
        m.begin(IFLA_LINKINFO).str(IFLA_INFO_SLAVE_KIND, "bridge");
        m.begin(IFLA_INFO_SLAVE_DATA)
            .u8(IFLA_BRPORT_MODE, on as u8)
            .end();
        m.end();
        self.req(m, &|| format!("setting hairpin on bridge port #{index}"))?;
        Ok(())
    }

    // ------------------------------------------------------------ addresses

    /// All addresses (index 0) or those of one link.
    /// The addresses of link `index` (every link's for 0). For one link the
    /// kernel filters the dump, so the cost does not grow with the number of
    /// pods on the node.
    pub fn addrs(&mut self, index: u32) -> Result<Vec<Addr>, KernelError> {
        let mut m = Msg::new(RTM_GETADDR, nl::NLM_F_DUMP);
        let mut hdr = [0u8; 8];
        hdr[4..8].copy_from_slice(&index.to_ne_bytes());
        m.raw(&hdr);
        let op = || "listing addresses".to_string();
        let strict = index != 0;
        if strict {
            self.sock
                .set_strict(true)
                .map_err(|e| KernelError::io(op(), e))?;
        }
        let replies = self.req(m, &op);
        if strict {
            self.sock
                .set_strict(false)
                .map_err(|e| KernelError::io(op(), e))?;
        }
        let replies = replies?;
        Ok(replies
            .iter()
            .filter(|r| r.msg_type == RTM_NEWADDR)
            .filter_map(|r| parse_addr(&r.body))
            .filter(|a| index == 0 || a.index == index)
            .collect())
    }

    /// Adds an address. `nodad` skips IPv6 duplicate address detection, which
    /// is safe for addresses handed out by IPAM and saves a second of waiting.
    pub fn add_addr(&mut self, index: u32, net: IpNet, nodad: bool) -> Result<(), KernelError> {
        self.addr_op(
            RTM_NEWADDR,
            nl::NLM_F_CREATE | nl::NLM_F_EXCL,
            index,
            net,
            nodad,
        )
    }

    pub fn del_addr(&mut self, index: u32, net: IpNet) -> Result<(), KernelError> {
        self.addr_op(RTM_DELADDR, 0, index, net, false)
    }

    fn addr_op(
        &mut self,
        ty: u16,
        flags: u16,
        index: u32,
        net: IpNet,
        nodad: bool,
    ) -> Result<(), KernelError> {
        let v6 = matches!(net, IpNet::V6(_));
        let mut m = Msg::new(ty, flags | nl::NLM_F_ACK);
        let mut h = [0u8; 8];
        h[0] = family(v6);
        h[1] = net.prefix_len();
        h[4..8].copy_from_slice(&index.to_ne_bytes());
        m.raw(&h);
        let ip = ip_bytes(&net.addr());
        m.attr(IFA_LOCAL, &ip);
        m.attr(IFA_ADDRESS, &ip);
        if !v6 && ty == RTM_NEWADDR && net.prefix_len() < 31 {
            if let IpNet::V4(n) = net {
                m.attr(4 /* IFA_BROADCAST */, &n.broadcast().octets());
            }
        }
        if nodad && v6 {
            m.u32(IFA_FLAGS, IFA_F_NODAD | IFA_F_PERMANENT);
        }
        let verb = if ty == RTM_NEWADDR {
            "adding"
        } else {
            "removing"
        };
        self.req(m, &|| format!("{verb} address {net} on link #{index}"))?;
        Ok(())
    }

    // --------------------------------------------------------------- routes

    /// Routes of one family in one table (main when `None`).
    pub fn routes(&mut self, v6: bool, table: Option<u32>) -> Result<Vec<Route>, KernelError> {
        let mut m = Msg::new(RTM_GETROUTE, nl::NLM_F_DUMP);
        let mut h = [0u8; 12];
        h[0] = family(v6);
        m.raw(&h);
        let replies = self.req(m, &|| "listing routes".into())?;
        let want = table.unwrap_or(RT_TABLE_MAIN);
        Ok(replies
            .iter()
            .filter(|r| r.msg_type == RTM_NEWROUTE)
            .filter_map(|r| parse_route(&r.body))
            .filter(|r| r.table == Some(want))
            .collect())
    }

    /// The route the kernel picks for a packet to `dst` (from `src`, as if
    /// it came in on link `iif` when given, else as if sent from here): the
    /// matching entry of the FIB with its own prefix (`RTM_F_FIB_MATCH`),
    /// and its type. `podnet trace` shows each node's routing decision
    /// with it. An unroutable destination is an error from the kernel
    /// (`ENETUNREACH`, `EHOSTUNREACH`), which [`KernelError`] carries.
    pub fn route_get(
        &mut self,
        dst: IpAddr,
        src: Option<IpAddr>,
        iif: Option<u32>,
    ) -> Result<RouteLookup, KernelError> {
        const RTA_SRC: u16 = 2;
        const RTA_IIF: u16 = 3;
        const RTM_F_FIB_MATCH: u32 = 0x2000;
        let v6 = dst.is_ipv6();
        let mut m = Msg::new(RTM_GETROUTE, 0);
        let mut h = [0u8; 12];
        h[0] = family(v6);
        h[1] = if v6 { 128 } else { 32 };
        if src.is_some() {
            h[2] = h[1];
        }
        h[8..12].copy_from_slice(&RTM_F_FIB_MATCH.to_ne_bytes());
        m.raw(&h);
        m.attr(RTA_DST, &ip_bytes(&dst));
        if let Some(s) = src {
            m.attr(RTA_SRC, &ip_bytes(&s));
        }
        if let Some(i) = iif {
            m.u32(RTA_IIF, i);
        }
        let replies = self.req(m, &|| format!("looking up the route to {dst}"))?;
        let body = replies
            .iter()
            .find(|r| r.msg_type == RTM_NEWROUTE)
            .map(|r| r.body.clone())
            .ok_or_else(|| KernelError::Other(format!("no route in the reply for {dst}")))?;
        let kind = *body.get(7).unwrap_or(&0);
        let mut unicast = body;
        unicast[7] = RTN_UNICAST;
        let route = parse_route(&unicast)
            .ok_or_else(|| KernelError::Other(format!("an unreadable route for {dst}")))?;
        Ok(RouteLookup { route, kind })
    }

    pub fn add_route(&mut self, r: &Route) -> Result<(), KernelError> {
        self.route_op(RTM_NEWROUTE, nl::NLM_F_CREATE | nl::NLM_F_EXCL, r)
    }

    /// Adds or replaces a route (idempotent).
    pub fn replace_route(&mut self, r: &Route) -> Result<(), KernelError> {
        self.route_op(RTM_NEWROUTE, nl::NLM_F_CREATE | nl::NLM_F_REPLACE, r)
    }

    pub fn del_route(&mut self, r: &Route) -> Result<(), KernelError> {
        self.route_op(RTM_DELROUTE, 0, r)
    }

    fn route_op(&mut self, ty: u16, flags: u16, r: &Route) -> Result<(), KernelError> {
        let v6 = r.family_v6();
        let table = r.table.unwrap_or(RT_TABLE_MAIN);
        let mut m = Msg::new(ty, flags | nl::NLM_F_ACK);
        let mut h = [0u8; 12];
        h[0] = family(v6);
        h[1] = r.dst.map(|d| d.prefix_len()).unwrap_or(0);
        h[4] = if table < 256 { table as u8 } else { 252 };
        h[5] = if ty == RTM_DELROUTE {
            0
        } else {
            r.protocol.unwrap_or(RTPROT_BOOT)
        };
        h[6] = match (ty, r.scope) {
            (_, Some(s)) => s,
            // RT_SCOPE_NOWHERE matches any scope on delete.
            (RTM_DELROUTE, None) => 255,
            _ if r.gateway.is_some() || r.onlink => RT_SCOPE_UNIVERSE,
            _ => RT_SCOPE_LINK,
        };
        h[7] = RTN_UNICAST;
        let rflags = if r.onlink { RTNH_F_ONLINK } else { 0 };
        h[8..12].copy_from_slice(&rflags.to_ne_bytes());
        m.raw(&h);
        if let Some(d) = r.dst {
            m.attr(RTA_DST, &ip_bytes(&d.network()));
        }
        if let Some(g) = r.gateway {
            m.attr(RTA_GATEWAY, &ip_bytes(&g));
        }
        if let Some(o) = r.oif {
            m.u32(RTA_OIF, o);
        }
        if let Some(p) = r.priority {
            m.u32(RTA_PRIORITY, p);
        }
        if let Some(s) = r.prefsrc {
            m.attr(RTA_PREFSRC, &ip_bytes(&s));
        }
        if table >= 256 {
            m.u32(RTA_TABLE, table);
        }
        if ty != RTM_DELROUTE && (r.mtu.is_some() || r.advmss.is_some()) {
            m.begin_plain(RTA_METRICS);
            if let Some(mtu) = r.mtu {
                m.u32(RTAX_MTU, mtu);
            }
            if let Some(a) = r.advmss {
                m.u32(RTAX_ADVMSS, a);
            }
            m.end();
        }
        let verb = match ty {
            RTM_DELROUTE => "deleting",
            _ if flags & nl::NLM_F_REPLACE != 0 => "replacing",
            _ => "adding",
        };
        let dst = r
            .dst
            .map(|d| d.to_string())
            .unwrap_or_else(|| "default".into());
        let via = r.gateway.map(|g| format!(" via {g}")).unwrap_or_default();
        self.req(m, &|| format!("{verb} route {dst}{via}"))?;
        Ok(())
    }
}

fn unsupported_kind(e: KernelError, kind: &str) -> KernelError {
    if e.errno() == Some(libc::EOPNOTSUPP) {
        KernelError::Other(format!(
            "link kind {kind} is unsupported by this kernel (module missing)"
        ))
    } else {
        e
    }
}

fn parse_link(body: &[u8]) -> Option<Link> {
    if body.len() < 16 {
        return None;
    }
    let index = i32::from_ne_bytes(body[4..8].try_into().ok()?) as u32;
    let flags = nl::get_u32(&body[8..12]);
    let mut link = Link {
        index,
        name: String::new(),
        kind: LinkKind::Device,
        mtu: 0,
        mac: None,
        master: None,
        flags,
        hairpin: None,
        peer: None,
        link_netnsid: None,
        macvlan_mode: None,
    };
    for (ty, v) in Attrs::new(&body[16..]) {
        match ty {
            IFLA_IFNAME => link.name = nl::get_str(v),
            IFLA_MTU => link.mtu = nl::get_u32(v),
            IFLA_ADDRESS if v.len() == 6 => link.mac = Some(v.try_into().ok()?),
            IFLA_MASTER => link.master = Some(nl::get_u32(v)),
            IFLA_LINK => link.peer = Some(nl::get_u32(v)),
            IFLA_LINK_NETNSID if v.len() >= 4 => link.link_netnsid = Some(nl::get_u32(v) as i32),
            IFLA_LINKINFO => {
                for (t, iv) in Attrs::new(v) {
                    match t {
                        IFLA_INFO_KIND => link.kind = LinkKind::parse(&nl::get_str(iv)),
                        // (The kind comes first: the kernel puts it first.)
                        IFLA_INFO_DATA if link.kind == LinkKind::Macvlan => {
                            for (dt, dv) in Attrs::new(iv) {
                                if dt == IFLA_MACVLAN_MODE && dv.len() >= 4 {
                                    link.macvlan_mode = MacvlanMode::from_u32(nl::get_u32(dv));
                                }
                            }
                        }
                        IFLA_INFO_SLAVE_DATA => {
                            for (st, sv) in Attrs::new(iv) {
                                if st == IFLA_BRPORT_MODE && !sv.is_empty() {
                                    link.hairpin = Some(sv[0] != 0);
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(link)
}

fn parse_addr(body: &[u8]) -> Option<Addr> {
    if body.len() < 8 {
        return None;
    }
    let prefix = body[1];
    let scope = body[3];
    let index = nl::get_u32(&body[4..8]);
    let mut local = None;
    let mut address = None;
    for (ty, v) in Attrs::new(&body[8..]) {
        match ty {
            IFA_LOCAL => local = parse_ip(v),
            IFA_ADDRESS => address = parse_ip(v),
            _ => {}
        }
    }
    let ip = local.or(address)?;
    Some(Addr {
        index,
        net: IpNet::new(ip, prefix).ok()?,
        scope,
    })
}

fn parse_route(body: &[u8]) -> Option<Route> {
    if body.len() < 12 {
        return None;
    }
    let fam = body[0];
    let dst_len = body[1];
    let mut r = Route {
        table: Some(body[4] as u32),
        protocol: Some(body[5]),
        scope: Some(body[6]),
        onlink: nl::get_u32(&body[8..12]) & RTNH_F_ONLINK != 0,
        v6: fam == libc::AF_INET6 as u8,
        ..Default::default()
    };
    if body[7] != RTN_UNICAST {
        return None;
    }
    for (ty, v) in Attrs::new(&body[12..]) {
        match ty {
            RTA_DST => r.dst = parse_ip(v).and_then(|ip| IpNet::new(ip, dst_len).ok()),
            RTA_GATEWAY => r.gateway = parse_ip(v),
            // An IPv4 route via an IPv6 next hop (RFC 5549), as read.
            RTA_VIA if v.len() >= 2 => r.gateway = parse_ip(&v[2..]),
            RTA_OIF => r.oif = Some(nl::get_u32(v)),
            RTA_PRIORITY => r.priority = Some(nl::get_u32(v)),
            RTA_PREFSRC => r.prefsrc = parse_ip(v),
            RTA_TABLE => r.table = Some(nl::get_u32(v)),
            RTA_METRICS => {
                for (mt, mv) in Attrs::new(v) {
                    match mt {
                        RTAX_MTU => r.mtu = Some(nl::get_u32(mv)),
                        RTAX_ADVMSS => r.advmss = Some(nl::get_u32(mv)),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    if r.dst.is_none() && dst_len == 0 {
        // default route: leave dst None
    }
    Some(r)
}
