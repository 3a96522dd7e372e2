//! The top-of-rack router (`lab up --router bird|frr|gobgp`): a namespace
//! `pn-<lab>-tor` on the underlay, running a real routing daemon that
//! peers over eBGP (AS [`TOR_ASN`]) with every node's speaker (AS 64512),
//! learns the pod CIDRs and Service addresses they advertise and installs
//! them in its kernel, so a client in its namespace is "outside the
//! cluster" and reaches LoadBalancer IPs the way a real fabric would.
//!
//! The router takes any node of the underlay as a neighbour (BIRD's
//! `neighbor range`, FRR's `bgp listen range`, GoBGP's dynamic
//! neighbours): nodes that join later need no reconfiguration. Its address
//! is the underlay's highest, so the nodes (lower addresses) dial it, as
//! the speakers' rule says the lower address does, and it only listens.
//! It forwards, unlike the lab's dead-end gateway; it has no uplink, so
//! nothing leaves the machine.
//!
//! The configs are pure ([`bird_conf`], [`frr_conf`], [`gobgp_conf`]);
//! starting the daemon is [`Lab::start_router`]. GoBGP (built by
//! `scripts/gobgp.sh`) keeps its routes in its own RIB (it has no kernel
//! FIB without zebra); BIRD and FRR (zebra) install theirs.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;

use ipnet::{IpNet, Ipv4Net};
use podnet_kernel::rtnl::Route;
use podnet_kernel::{Handle, Netns};

use crate::error::{io, msg, LabError};
use crate::gateway;
use crate::process::spawn_logged;
use crate::state::Lab;

/// The router's AS: eBGP to the cluster's 64512.
pub const TOR_ASN: u32 = 64513;
/// The cluster's AS, as the router expects the nodes to speak.
pub const CLUSTER_ASN: u32 = 64512;
/// The router's port on the underlay bridge; its end inside is `eth0`.
const PORT: &str = "to-tor";

/// Which daemon runs the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterKind {
    Bird,
    Frr,
    Gobgp,
}

impl RouterKind {
    pub fn parse(s: &str) -> Result<RouterKind, LabError> {
        match s {
            "bird" => Ok(RouterKind::Bird),
            "frr" => Ok(RouterKind::Frr),
            "gobgp" => Ok(RouterKind::Gobgp),
            _ => Err(msg(format!("--router {s:?}: one of bird, frr, gobgp"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            RouterKind::Bird => "bird",
            RouterKind::Frr => "frr",
            RouterKind::Gobgp => "gobgp",
        }
    }
}

/// The router's address in rack 1 (the underlay): its highest host.
pub fn tor_ip() -> Ipv4Addr {
    tor_ip_in(1)
}

/// The router's address in rack `rack`: the rack's highest host address.
pub fn tor_ip_in(rack: usize) -> Ipv4Addr {
    let b = gateway::rack_net(rack).broadcast().octets();
    Ipv4Addr::new(b[0], b[1], b[2], b[3] - 1)
}

/// Each rack's router address and node range.
pub fn racks(n: usize) -> Vec<(Ipv4Addr, Ipv4Net)> {
    (1..=n)
        .map(|r| (tor_ip_in(r), gateway::rack_net(r)))
        .collect()
}

/// Rack 1's route to rack `rack`, through the router.
pub fn route_to_rack(rack: usize, oif: u32) -> Route {
    Route {
        dst: Some(IpNet::V4(gateway::rack_net(rack))),
        gateway: Some(IpAddr::V4(tor_ip_in(1))),
        oif: Some(oif),
        ..Default::default()
    }
}

/// A rack-2 node's default route: the router.
pub fn default_route(rack: usize, oif: u32) -> Route {
    Route {
        dst: None,
        gateway: Some(IpAddr::V4(tor_ip_in(rack))),
        oif: Some(oif),
        ..Default::default()
    }
}

/// BIRD 2: every node of each rack a dynamic eBGP neighbour, what they
/// advertise into the kernel (equal paths merged: ECMP over the nodes
/// that advertise a Service block), nothing sent back.
pub fn bird_conf(racks: &[(Ipv4Addr, Ipv4Net)], log: &Path) -> String {
    let mut out = format!(
        "router id {};\nlog \"{}\" all;\nprotocol device {{}}\n\
         protocol kernel {{\n  merge paths on;\n  ipv4 {{ import none; export all; }};\n}}\n\
         protocol bfd {{\n  interface \"*\" {{ min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }};\n}}\n",
        racks[0].0,
        log.display()
    );
    for (i, (me, nodes)) in racks.iter().enumerate() {
        let rack = i + 1;
        out.push_str(&format!(
            "protocol bgp rack{rack} {{\n  local {me} as {TOR_ASN};\n  \
             neighbor range {nodes} as {CLUSTER_ASN};\n  dynamic name \"rack{rack}node\";\n  \
             hold time 9;\n  error wait time 1, 5;\n  graceful restart on;\n  bfd on;\n  \
             ipv4 {{ import all; export none; }};\n}}\n"
        ));
    }
    out
}

/// FRR (zebra and bgpd): the same, as `bgp listen range`; session
/// changes logged with their reasons (`tor-bgpd.log`).
pub fn frr_conf(racks: &[(Ipv4Addr, Ipv4Net)]) -> String {
    let ranges: String = racks
        .iter()
        .map(|(_, n)| format!(" bgp listen range {n} peer-group nodes\n"))
        .collect();
    format!(
        "frr defaults traditional\nhostname tor\nlog stdout informational\n\
         router bgp {TOR_ASN}\n bgp router-id {}\n no bgp ebgp-requires-policy\n \
         bgp log-neighbor-changes\n \
         bgp graceful-restart\n bgp bestpath as-path multipath-relax\n \
         neighbor nodes peer-group\n neighbor nodes remote-as {CLUSTER_ASN}\n \
         neighbor nodes timers 3 9\n neighbor nodes bfd\n{ranges} address-family ipv4 unicast\n  \
         maximum-paths 16\n exit-address-family\n",
        racks[0].0
    )
}

/// GoBGP: the same, as dynamic neighbours of a peer group (BFD at
/// 100 ms × 3 on the group).
pub fn gobgp_conf(racks: &[(Ipv4Addr, Ipv4Net)]) -> String {
    let locals: Vec<String> = racks.iter().map(|(a, _)| format!("\"{a}\"")).collect();
    let mut out = format!(
        "[global.config]\n  as = {TOR_ASN}\n  router-id = \"{}\"\n  local-address-list = [{}]\n\n\
         [[peer-groups]]\n  [peer-groups.config]\n    peer-group-name = \"nodes\"\n    \
         peer-as = {CLUSTER_ASN}\n  [peer-groups.bfd.config]\n    enabled = true\n    \
         desired-minimum-tx-interval = 100000\n    required-minimum-receive = 100000\n    \
         detection-multiplier = 3\n  [[peer-groups.afi-safis]]\n    \
         [peer-groups.afi-safis.config]\n      afi-safi-name = \"ipv4-unicast\"\n",
        racks[0].0,
        locals.join(", ")
    );
    for (_, nodes) in racks {
        out.push_str(&format!(
            "\n[[dynamic-neighbors]]\n  [dynamic-neighbors.config]\n    \
             prefix = \"{nodes}\"\n    peer-group = \"nodes\"\n"
        ));
    }
    out
}

impl Lab {
    pub fn router_ns(&self) -> String {
        self.ns_name("tor")
    }

    fn router_dir(&self) -> PathBuf {
        self.dir.join("tor")
    }

    /// The router's namespace on every rack's bridge (`eth0` in rack 1,
    /// `eth1` in rack 2), forwarding between them.
    pub(crate) fn add_router_ns(&self, underlay_ns: &str, racks: usize) -> Result<(), LabError> {
        let ns = Netns::create_named(&self.router_ns())?;
        let under = Netns::named(underlay_ns)?;
        let mut uh = Handle::in_netns(&under)?;
        let mut h = Handle::in_netns(&ns)?;
        for rack in 1..=racks {
            let (port, inside) = (format!("{PORT}{rack}"), format!("eth{}", rack - 1));
            uh.create_veth(&port, &inside, Some(ns.fd()), None, None)?;
            let br = uh.require_link(&gateway::bridge(rack))?;
            let p = uh.require_link(&port)?;
            uh.set_master(p.index, br.index)?;
            uh.set_up(p.index)?;
            let e = h.require_link(&inside)?;
            let net = Ipv4Net::new(tor_ip_in(rack), 24).expect("prefix");
            h.add_addr(e.index, IpNet::V4(net), true)?;
            h.set_up(e.index)?;
        }
        h.set_up_by_name("lo")?;
        ns.run(|| podnet_kernel::netns::write_sysctl("net.ipv4.ip_forward", "1"))??;
        Ok(())
    }

    /// Writes the router's config and starts its daemon(s) in its
    /// namespace, logged like every lab process.
    pub(crate) fn start_router(&self, kind: RouterKind, n: usize) -> Result<(), LabError> {
        let dir = self.router_dir();
        std::fs::create_dir_all(&dir).map_err(|e| io("creating the router's dir", e))?;
        let racks = racks(n);
        let ns = self.router_ns();
        let write = |name: &str, text: String| -> Result<PathBuf, LabError> {
            let p = dir.join(name);
            std::fs::write(&p, text).map_err(|e| io(format!("writing {}", p.display()), e))?;
            Ok(p)
        };
        match kind {
            RouterKind::Bird => {
                let conf = write("bird.conf", bird_conf(&racks, &dir.join("bird.log")))?;
                let mut cmd = Command::new("bird");
                cmd.arg("-f")
                    .arg("-c")
                    .arg(conf)
                    .arg("-s")
                    .arg(dir.join("bird.ctl"));
                spawn_logged(&self.dir, "tor-bird", &mut cmd, Some(&ns))?;
            }
            RouterKind::Frr => {
                self.start_frr(&dir, &write("frr.conf", frr_conf(&racks))?, &racks)?
            }
            RouterKind::Gobgp => {
                let conf = write("gobgpd.toml", gobgp_conf(&racks))?;
                let mut cmd = Command::new(gobgpd()?);
                cmd.arg("-f")
                    .arg(conf)
                    .args(["-t", "toml", "--pprof-disable"]);
                spawn_logged(&self.dir, "tor-gobgpd", &mut cmd, Some(&ns))?;
            }
        }
        Ok(())
    }

    /// zebra (the FIB), bfdd and bgpd, sharing one zserv socket in the
    /// router's directory, so several labs' routers never meet.
    fn start_frr(
        &self,
        dir: &Path,
        conf: &Path,
        racks: &[(Ipv4Addr, Ipv4Net)],
    ) -> Result<(), LabError> {
        let zserv = dir.join("zserv.api");
        // The daemons run as FRR's user, and keep their sockets and pid
        // files here.
        let st = Command::new("chown")
            .arg("-R")
            .arg("frr:frr")
            .arg(dir)
            .status()
            .map_err(|e| io("chown frr:frr on the router's dir", e))?;
        if !st.success() {
            return Err(msg(format!("chown frr:frr {}: {st}", dir.display())));
        }
        for daemon in ["zebra", "bfdd", "bgpd"] {
            let mut cmd = Command::new(format!("/usr/lib/frr/{daemon}"));
            cmd.arg("-f")
                .arg(if daemon == "bgpd" {
                    conf
                } else {
                    Path::new("/dev/null")
                })
                .arg("-i")
                .arg(dir.join(format!("{daemon}.pid")))
                .arg("--vty_socket")
                .arg(dir)
                .arg("-z")
                .arg(&zserv)
                // No vty port (labs would collide); FRR's own user.
                .args(["-P", "0", "-u", "frr", "-g", "frr"]);
            if daemon == "bgpd" {
                for (me, _) in racks {
                    cmd.arg("-l").arg(me.to_string());
                }
            }
            if daemon == "bfdd" {
                cmd.arg("--bfdctl").arg(dir.join("bfdd.sock"));
            }
            spawn_logged(
                &self.dir,
                &format!("tor-{daemon}"),
                &mut cmd,
                Some(&self.router_ns()),
            )?;
            if daemon == "zebra" {
                wait_for_file(&zserv)?;
            }
        }
        Ok(())
    }
}

/// gobgpd from `scripts/gobgp.sh`'s cache.
fn gobgpd() -> Result<PathBuf, LabError> {
    let cache = std::env::var("PODNET_PEERS_CACHE").unwrap_or("/var/cache/podnet-peers".into());
    let p = Path::new(&cache).join("gobgp-v4.8.0").join("gobgpd");
    if p.exists() {
        Ok(p)
    } else {
        Err(msg(format!(
            "--router gobgp: {} is missing; run scripts/gobgp.sh",
            p.display()
        )))
    }
}

/// Waits (bounded) until a daemon has made its socket.
fn wait_for_file(p: &Path) -> Result<(), LabError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !p.exists() {
        if std::time::Instant::now() > deadline {
            return Err(msg(format!("{} never appeared", p.display())));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_router_sits_at_the_top_of_the_underlay() {
        assert_eq!(tor_ip(), Ipv4Addr::new(192, 168, 200, 254));
        assert!(RouterKind::parse("quagga")
            .unwrap_err()
            .to_string()
            .contains("bird, frr, gobgp"));
    }

    #[test]
    fn every_config_takes_every_rack_as_neighbours() {
        let r = racks(2);
        assert_eq!(
            r[1],
            (
                Ipv4Addr::new(192, 168, 201, 254),
                "192.168.201.0/24".parse().unwrap()
            )
        );
        let b = bird_conf(&r, Path::new("/x/bird.log"));
        assert!(
            b.contains("neighbor range 192.168.200.0/24 as 64512;"),
            "{b}"
        );
        assert!(b.contains("local 192.168.201.254 as 64513;"), "{b}");
        let f = frr_conf(&r);
        assert!(
            f.contains(" bgp listen range 192.168.201.0/24 peer-group nodes\n"),
            "{f}"
        );
        let g = gobgp_conf(&r);
        assert!(
            g.contains("prefix = \"192.168.201.0/24\"") && g.contains("as = 64513"),
            "{g}"
        );
        assert!(
            g.contains(r#"local-address-list = ["192.168.200.254", "192.168.201.254"]"#),
            "{g}"
        );
    }
}
