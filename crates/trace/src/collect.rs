//! The kernel half of a trace: the trace table and listeners on every
//! node, the probe from the source pod, and the lookups that explain each
//! node's decision (routes, neighbours and FDB entries, conntrack).
//!
//! A [`Session`] installs [`crate::plan::marker`] and opens a trace
//! listener in each node's namespace before the probe is sent, and
//! removes the tables when dropped, whatever happened. The events are
//! queued on the listeners while the kernel handles the packets, so once
//! the probe has its outcome they are all there to be read.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use podnet_kernel::conntrack::{self, Entry, IpFamily};
use podnet_kernel::nftrace::{TraceEvent, TraceListener};
use podnet_kernel::{Handle, LinkKind, Netns};
use podnet_nft::diff::diff;
use podnet_nft::model::{Family, Proto};
use podnet_nft::netlink::Conn;

use crate::hops::{self, named, Hop, HopKind, Names, ServicePort};
use crate::probe;
use crate::{Trace, TraceError};

/// A node: its name, network namespace and pod subnets (which name the
/// node a tunnel carries a packet to when the route does not).
#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    /// Its namespace: a name under /run/netns (a lab node), a path (a real
    /// node: `/proc/self/ns/net`), or empty for a node this trace cannot
    /// observe (another machine); see [`open_netns`].
    pub netns: String,
    pub subnets: Vec<ipnet::IpNet>,
}

impl Node {
    /// Whether this trace sees the node's kernel.
    pub fn observed(&self) -> bool {
        !self.netns.is_empty()
    }
}

/// A namespace by name under /run/netns, or by path when it has a `/`.
pub fn open_netns(name_or_path: &str) -> Result<Netns, TraceError> {
    if name_or_path.is_empty() {
        return Err(TraceError::Msg("no namespace given".into()));
    }
    Ok(if name_or_path.contains('/') {
        Netns::open(name_or_path)?
    } else {
        Netns::named(name_or_path)?
    })
}

/// The probe's source: a pod, or a host outside the cluster.
#[derive(Debug, Clone)]
pub struct Pod {
    /// `ns/name`, or what the outside host is.
    pub name: String,
    pub ip: IpAddr,
    pub netns: String,
    /// The pod's node; None for a host outside the cluster, whose packets
    /// enter the node the destination (or its route's next hop) names.
    pub node: Option<String>,
}

/// What the pure evaluators say, asked by the trace as it learns the
/// packet's real destination.
pub trait Oracles {
    /// The policy evaluator's verdict on a new connection, per end, and why.
    fn policy(&self, src: IpAddr, dst: IpAddr, port: u16, proto: Proto) -> Option<PolicyAnswer>;
    /// The endpoints the proxy's pure tracer says a packet to `frontend`
    /// from `src` on `node` may be sent to (None: not a Service).
    fn endpoints(
        &self,
        node: &str,
        src: IpAddr,
        frontend: SocketAddr,
        proto: Proto,
    ) -> Option<Vec<SocketAddr>>;
}

/// The policy evaluator's answer: the source's egress and the
/// destination's ingress are judged on their own nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyAnswer {
    pub egress: bool,
    pub ingress: bool,
    pub why: String,
}

/// What to trace.
pub struct Request<'a> {
    pub src: Pod,
    pub dst: SocketAddr,
    /// How the user named the destination (`default/web`, an address).
    pub dst_name: String,
    pub proto: Proto,
    pub nodes: Vec<Node>,
    pub names: Names,
    pub services: Vec<ServicePort>,
    /// Sent once connected (UDP: the datagram), e.g. the lab server's
    /// "who are you".
    pub request: Option<String>,
    pub timeout: Duration,
    pub oracles: &'a dyn Oracles,
}

struct Part {
    node: Node,
    ns: Netns,
    listener: TraceListener,
}

/// One trace at a time per node: an exclusive `flock` on a file named by
/// the node's namespace (its nsfs inode), held for the whole session. The
/// kernel releases it when the holder dies, so a killed trace blocks no
/// one; the next holder removes the table it left. The holder removes the
/// file when done, so none pile up; a waiter that locked a file already
/// removed (its inode no longer at the path) opens the path again.
struct NodeLock {
    _file: std::fs::File,
    path: String,
}

/// Where the per-node lock files live.
const LOCK_DIR: &str = "/run/podnet/trace";
/// How long a trace waits for another one on the same node.
const LOCK_WAIT: Duration = Duration::from_secs(30);

impl NodeLock {
    /// The namespace's identity: its nsfs inode.
    fn ino(ns: &Netns, node: &str) -> Result<u64, TraceError> {
        use std::os::unix::fs::MetadataExt;
        Ok(std::fs::metadata(ns.path())
            .map_err(|e| TraceError::Msg(format!("node {node}: {}: {e}", ns.path().display())))?
            .ino())
    }

    /// Locks the node whose namespace has inode `ino`.
    fn acquire(ino: u64, node: &str) -> Result<NodeLock, TraceError> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        std::fs::create_dir_all(LOCK_DIR)
            .map_err(|e| TraceError::Msg(format!("creating {LOCK_DIR}: {e}")))?;
        let path = format!("{LOCK_DIR}/netns-{ino}.lock");
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        loop {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(|e| TraceError::Msg(format!("opening {path}: {e}")))?;
            // SAFETY: flock(2) on a descriptor this function owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                let same = match (file.metadata(), std::fs::metadata(&path)) {
                    (Ok(a), Ok(b)) => a.ino() == b.ino(),
                    _ => false,
                };
                if same {
                    return Ok(NodeLock { _file: file, path });
                }
                continue;
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(TraceError::Msg(format!("locking {path}: {e}")));
            }
            if std::time::Instant::now() >= deadline {
                return Err(TraceError::Msg(format!(
                    "node {node}: another trace has held it for {}s ({path})",
                    LOCK_WAIT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NodeLock {
    fn drop(&mut self) {
        // Removed while still locked; the file, closed after this, unlocks.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The trace tables and listeners of one probe; dropping it removes the
/// tables, then releases the nodes.
pub struct Session {
    parts: Vec<Part>,
    // Declared after `parts`: released only once the tables are gone.
    _locks: Vec<NodeLock>,
}

impl Session {
    pub fn start(nodes: &[Node], proto: Proto, sport: u16) -> Result<Session, TraceError> {
        let table = crate::plan::marker(proto, sport);
        // Locks in one global order (the namespaces' inodes), so two
        // traces over the same nodes cannot wait on each other.
        let mut observed: Vec<(u64, &Node, Netns)> = Vec::new();
        for n in nodes.iter().filter(|n| n.observed()) {
            let ns = open_netns(&n.netns)?;
            observed.push((NodeLock::ino(&ns, &n.name)?, n, ns));
        }
        observed.sort_by_key(|(ino, ..)| *ino);
        observed.dedup_by_key(|(ino, ..)| *ino);
        let mut locks = Vec::new();
        for (ino, n, _) in &observed {
            locks.push(NodeLock::acquire(*ino, &n.name)?);
        }
        let mut s = Session {
            parts: Vec::new(),
            _locks: locks,
        };
        for (_, n, ns) in observed {
            ns.run(|| -> Result<(), TraceError> {
                let mut c = Conn::open()?;
                // A table left by a trace that was killed: nobody else
                // holds this node.
                c.delete_table(Family::Inet, crate::plan::TABLE)?;
                c.apply(&table, &diff(None, &table))?;
                Ok(())
            })??;
            let listener = TraceListener::in_netns(&ns)?;
            s.parts.push(Part {
                node: n.clone(),
                ns,
                listener,
            });
        }
        Ok(s)
    }

    /// Every event queued so far, per node, in arrival order.
    pub fn drain(&mut self) -> Result<BTreeMap<String, Vec<TraceEvent>>, TraceError> {
        let mut out = BTreeMap::new();
        for p in &mut self.parts {
            p.listener.set_timeout(Some(Duration::from_millis(1)))?;
            let mut all = Vec::new();
            loop {
                let got = p.listener.recv()?;
                if got.is_empty() {
                    break;
                }
                all.extend(got);
            }
            out.insert(p.node.name.clone(), all);
        }
        Ok(out)
    }

    /// Events the kernel could not queue (receive buffer overruns).
    pub fn lost(&self) -> u64 {
        self.parts.iter().map(|p| p.listener.lost()).sum()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for p in &self.parts {
            let r = p.ns.run(|| {
                Conn::open().and_then(|mut c| c.delete_table(Family::Inet, crate::plan::TABLE))
            });
            if let Err(e) | Ok(Err(e)) = r.map(|r| r.map(|_| ())) {
                tracing::warn!(node = %p.node.name, "removing the trace table: {e}");
            }
        }
    }
}

/// Removes a trace table left in this namespace by a trace that was
/// killed (for the agent's `--cleanup`); whether there was one. A trace
/// running now is not disturbed: the node's lock is taken first.
pub fn cleanup() -> Result<bool, TraceError> {
    let ns = Netns::current()?;
    let _lock = NodeLock::acquire(NodeLock::ino(&ns, "this node")?, "this node")?;
    Ok(Conn::open()?.delete_table(Family::Inet, crate::plan::TABLE)?)
}

/// A source port for the probe: from a range Linux does not hand out as
/// ephemeral ports by default (32768-60999), varied per call.
pub fn pick_sport() -> u16 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    20000 + ((t.subsec_nanos() ^ std::process::id()) % 10000) as u16
}

/// Rule texts of the chains a walk passed, by (table, chain, handle), as
/// `nft -a` lists them (when the tool is there; the hop says "rule" if not).
fn rule_texts(netns: &str, walk: &[TraceEvent]) -> BTreeMap<(String, String, u64), String> {
    let mut out = BTreeMap::new();
    let Ok(ns) = open_netns(netns) else {
        return out;
    };
    let mut seen = std::collections::BTreeSet::new();
    for e in walk.iter().filter(|e| e.rule.is_some()) {
        let key = (e.family, e.table.clone(), e.chain.clone());
        if !seen.insert(key) {
            continue;
        }
        let fam = hops::family_name(e.family);
        // A child started from inside the namespace stays in it.
        let Ok(Ok(o)) = ns.run(|| {
            Command::new("nft")
                .args(["-a", "list", "chain", fam, &e.table, &e.chain])
                .output()
        }) else {
            continue;
        };
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            if let Some((text, h)) = line.trim().rsplit_once(" # handle ") {
                if let Ok(h) = h.trim().parse::<u64>() {
                    out.insert(
                        (e.table.clone(), e.chain.clone(), h),
                        text.trim().to_string(),
                    );
                }
            }
        }
    }
    out
}

/// The probe's connection as the source node's conntrack holds it.
fn conntrack_entry(ns: &Netns, src: IpAddr, sport: u16, proto: Proto) -> Option<Entry> {
    let fam = if src.is_ipv4() {
        IpFamily::V4
    } else {
        IpFamily::V6
    };
    let list = ns
        .run(|| conntrack::Table::new().and_then(|mut t| t.list(Some(fam))))
        .ok()?
        .ok()?;
    list.into_iter()
        .find(|e| e.proto == proto.number() && e.orig.src == src && e.orig.sport == sport)
}

/// The probe's connection among the confirmations `events` queued.
fn confirmed_entry(
    events: &mut conntrack::Events,
    src: IpAddr,
    sport: u16,
    proto: Proto,
) -> Option<Entry> {
    events.set_timeout(Some(Duration::from_millis(1))).ok()?;
    loop {
        let got = events.recv().ok()?;
        if got.is_empty() {
            return None;
        }
        if let Some((_, e)) = got
            .into_iter()
            .find(|(_, e)| e.proto == proto.number() && e.orig.src == src && e.orig.sport == sport)
        {
            return Some(e);
        }
    }
}

/// The source pod's own routing decision.
fn pod_route_hop(pod: &Pod, dst: IpAddr, names: &Names) -> Result<Hop, TraceError> {
    let ns = open_netns(&pod.netns)?;
    let (r, dev) = ns.run(|| -> Result<_, TraceError> {
        let mut h = Handle::new()?;
        let r = h.route_get(dst, None, None)?;
        let dev = match r.route.oif {
            Some(i) => h.link_by_index(i)?.map(|l| l.name).unwrap_or_default(),
            None => String::new(),
        };
        Ok((r, dev))
    })??;
    let prefix = r
        .route
        .dst
        .map(|d| d.to_string())
        .unwrap_or_else(|| "default".into());
    let via = r
        .route
        .gateway
        .map(|g| format!(" via {g}"))
        .unwrap_or_default();
    Ok(Hop::new(
        &pod.name,
        HopKind::PodRoute,
        format!(
            "{} -> {}: route {prefix}{via} dev {dev}",
            named(names, pod.ip),
            named(names, dst)
        ),
    )
    .with("route", prefix)
    .with(
        "via",
        r.route.gateway.map(|g| g.to_string()).unwrap_or_default(),
    )
    .with("dev", dev))
}

/// The pod's veth on the node and its bridge: the pod's interface names
/// its peer's index (IFLA_LINK), which the node resolves.
fn veth_hop(pod: &Pod, node_ns: &Netns) -> Result<(Hop, Option<u32>), TraceError> {
    let pns = open_netns(&pod.netns)?;
    let (ifname, peer) = pns.run(|| -> Result<_, TraceError> {
        let mut h = Handle::new()?;
        let l = h
            .links()?
            .into_iter()
            .find(|l| l.kind == LinkKind::Veth)
            .ok_or_else(|| TraceError::Msg(format!("pod {} has no veth", pod.name)))?;
        Ok((l.name, l.peer))
    })??;
    let peer =
        peer.ok_or_else(|| TraceError::Msg(format!("{}'s {ifname} names no peer", pod.name)))?;
    let node = pod.node.clone().unwrap_or_default();
    let (host_if, bridge, bridge_index) = node_ns.run(|| -> Result<_, TraceError> {
        let mut h = Handle::new()?;
        let l = h
            .link_by_index(peer)?
            .ok_or_else(|| TraceError::Msg(format!("no link #{peer} on node {}", node)))?;
        let b = match l.master {
            Some(m) => h.link_by_index(m)?,
            None => None,
        };
        Ok((
            l.name,
            b.as_ref().map(|b| b.name.clone()),
            b.map(|b| b.index),
        ))
    })??;
    let summary = match &bridge {
        Some(b) => format!(
            "{ifname} -> veth {host_if} on {}, a port of bridge {b}",
            node
        ),
        None => format!("{ifname} -> veth {host_if} on {} (no bridge)", node),
    };
    Ok((
        Hop::new(&node, HopKind::Veth, summary)
            .with("pod_if", ifname)
            .with("host_if", host_if)
            .with("bridge", bridge.unwrap_or_default()),
        bridge_index,
    ))
}

/// A node's routing decision for a packet from `src` to `dst` that came
/// in on `iif`, and the backend that carries it: a VXLAN VTEP and the
/// remote node behind it (neighbour, then FDB entry), a host-gw next hop,
/// the UDP tunnel's TUN device, or local delivery.
fn route_hop(
    node: &Node,
    ns: &Netns,
    src: IpAddr,
    dst: IpAddr,
    iif: Option<u32>,
    names: &Names,
    nodes: &[Node],
) -> Result<Hop, (String, String)> {
    let r = ns
        .run(|| -> Result<Hop, TraceError> {
            let mut h = Handle::new()?;
            let r = h.route_get(dst, Some(src), iif)?;
            let dev = match r.route.oif {
                Some(i) => h.link_by_index(i)?,
                None => None,
            };
            let prefix = r
                .route
                .dst
                .map(|d| d.to_string())
                .unwrap_or_else(|| "default".into());
            let via = r.route.gateway;
            let mut hop = Hop::new(&node.name, HopKind::Route, "")
                .with("route", &prefix)
                .with("type", r.kind_name())
                .with(
                    "dev",
                    dev.as_ref().map(|d| d.name.clone()).unwrap_or_default(),
                );
            if let Some(g) = via {
                hop = hop.with("via", g);
            }
            let devname = dev.as_ref().map(|d| d.name.clone()).unwrap_or_default();
            let backend = match dev.as_ref().map(|d| &d.kind) {
                _ if r.kind == 2 => "local delivery".to_string(),
                Some(LinkKind::Vxlan) => {
                    let d = dev.as_ref().expect("matched");
                    let mac = via.and_then(|g| {
                        h.neighbours(d.index, false)
                            .ok()?
                            .into_iter()
                            .find(|n| n.dst == Some(g))
                            .map(|n| n.mac)
                    });
                    let vtep = mac.and_then(|m| {
                        h.neighbours(d.index, true)
                            .ok()?
                            .into_iter()
                            .find(|n| n.mac == m)
                            .and_then(|n| n.dst)
                    });
                    if let Some(v) = vtep {
                        hop = hop.with("backend", "vxlan").with("vtep", v);
                        if let Some(n) = names.get(&v) {
                            hop = hop.with("remote_node", n);
                        }
                    }
                    format!(
                        "vxlan: {devname}, VTEP MAC {} -> remote {}",
                        mac.map(|m| podnet_kernel::rtnl::format_mac(&m))
                            .unwrap_or_else(|| "(no neighbour)".into()),
                        vtep.map(|v| named(names, v))
                            .unwrap_or_else(|| "(no FDB entry)".into())
                    )
                }
                Some(LinkKind::Tun) => {
                    hop = hop.with("backend", "udp");
                    // The agent encapsulates to the node whose subnet holds
                    // the destination.
                    let to = nodes
                        .iter()
                        .find(|n| n.name != node.name && n.subnets.iter().any(|s| s.contains(&dst)));
                    match to {
                        Some(n) => {
                            hop = hop.with("remote_node", &n.name);
                            format!("udp tunnel: {devname}, the agent encapsulates to {} (its subnet holds {dst})", n.name)
                        }
                        None => format!("udp tunnel: {devname} (the agent encapsulates)"),
                    }
                }
                Some(LinkKind::Bridge) => {
                    hop = hop.with("backend", "bridge");
                    format!("this node's bridge {devname}")
                }
                _ => match via {
                    Some(g) if names.get(&g).is_some_and(|n| !n.contains('/')) => {
                        hop = hop.with("backend", "host-gw").with("next_hop", g);
                        if let Some(n) = names.get(&g) {
                            hop = hop.with("remote_node", n);
                        }
                        format!("host-gw: next hop {} on {devname}", named(names, g))
                    }
                    Some(g) => {
                        hop = hop.with("backend", "out").with("next_hop", g);
                        format!("out of the cluster network: next hop {g} on {devname}")
                    }
                    None => format!("out {devname}"),
                },
            };
            let via_s = via.map(|g| format!(" via {g}")).unwrap_or_default();
            hop.summary = format!(
                "route to {}: {prefix}{via_s} dev {devname} ({}); {backend}",
                named(names, dst),
                r.kind_name()
            );
            Ok(hop)
        })
        .map_err(|e| (node.name.clone(), e.to_string()))?;
    r.map_err(|e| (node.name.clone(), e.to_string()))
}

/// Runs the probe and gathers everything: the hops in the packet's order.
pub fn run(req: &Request<'_>) -> Result<Trace, TraceError> {
    let sport = pick_sport();
    let udp = req.proto == Proto::Udp;
    let first = pod_route_hop(&req.src, req.dst.ip(), &req.names)?;
    // The node the packet enters first: the pod's, or for an outside
    // host the node it sends to (the destination, or its next hop).
    let entry = match &req.src.node {
        Some(n) => Some(n.clone()),
        None => [
            Some(req.dst.ip()),
            first.data.get("via").and_then(|v| v.parse().ok()),
        ]
        .into_iter()
        .flatten()
        .find_map(|ip| {
            req.names
                .get(&ip)
                .filter(|n| req.nodes.iter().any(|x| &x.name == *n))
        })
        .cloned(),
    };
    let src_node = entry
        .and_then(|e| req.nodes.iter().find(|n| n.name == e))
        .cloned()
        .ok_or_else(|| {
            TraceError::Msg(format!(
                "{}: no node of the cluster is on the way to {}",
                req.src.name, req.dst
            ))
        })?;
    if !src_node.observed() {
        return Err(TraceError::Msg(format!(
            "{} enters the cluster at node {}, which is not this machine: run the trace there",
            req.src.name, src_node.name
        )));
    }
    let src_ns = open_netns(&src_node.netns)?;
    let mut hops = vec![first];
    let bridge = if req.src.node.is_some() {
        let (veth, bridge) = veth_hop(&req.src, &src_ns)?;
        hops.push(veth);
        bridge
    } else {
        // The link the outside host's packets come in on.
        src_ns
            .run(|| Handle::new().and_then(|mut h| h.route_get(req.src.ip, None, None)))?
            .ok()
            .and_then(|r| r.route.oif)
    };

    let mut session = Session::start(&req.nodes, req.proto, sport)?;
    // The source node's new connections as the kernel confirms them: the
    // probe's entry with its NAT, even when the kernel deletes it at once
    // (a reset kills an unassured TCP entry, so a refused probe leaves none
    // in the table to read afterwards).
    let mut ct_events = src_ns.run(|| conntrack::Events::open(&[conntrack::EventKind::New]))??;
    let pod_ns = open_netns(&req.src.netns)?;
    // The kernel's drop reasons for what this thread sends; a trace
    // without them is still a trace.
    let watch = match podnet_kernel::dropwatch::DropWatch::start(podnet_kernel::dropwatch::gettid())
    {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::info!("no kernel drop reasons: {e}");
            None
        }
    };
    let outcome =
        pod_ns.run(|| probe::probe(req.dst, udp, sport, req.request.as_deref(), req.timeout))?;
    let kernel_drops = watch
        .map(|w| w.stop())
        .transpose()
        .unwrap_or_else(|e| {
            tracing::info!("no kernel drop reasons: {e}");
            None
        })
        .unwrap_or_default();
    let events = session.drain()?;
    for (n, evs) in &events {
        for e in evs {
            tracing::debug!(node = %n, "trace event {e:?}");
        }
    }
    let lost = session.lost();
    drop(session);

    // The source node: rules, Service, policy, masquerade, route.
    let ct = conntrack_entry(&src_ns, req.src.ip, sport, req.proto)
        .or_else(|| confirmed_entry(&mut ct_events, req.src.ip, sport, req.proto));
    let mut real_dst = req.dst;
    let mut drops: Vec<(String, Hop)> = Vec::new();
    let add_node_rules =
        |node: &Node, hops: &mut Vec<Hop>, drops: &mut Vec<(String, Hop)>| -> Vec<TraceEvent> {
            let walk = hops::first_walk(
                events.get(&node.name).map(|v| v.as_slice()).unwrap_or(&[]),
                crate::plan::TABLE,
            );
            let texts = rule_texts(&node.netns, &walk);
            let rules = hops::rule_hops(&node.name, &walk, crate::plan::TABLE, &|e| {
                texts
                    .get(&(e.table.clone(), e.chain.clone(), e.rule?))
                    .cloned()
            });
            for r in &rules {
                if r.data.get("verdict").map(|v| v == "drop").unwrap_or(false) {
                    drops.push((node.name.clone(), r.clone()));
                }
            }
            hops.extend(rules);
            walk
        };
    let src_walk = add_node_rules(&src_node, &mut hops, &mut drops);
    if let Some(ct) = &ct {
        let cands = req
            .oracles
            .endpoints(&src_node.name, req.src.ip, req.dst, req.proto);
        if let Some(h) = hops::service_hop(
            &src_node.name,
            ct,
            &req.services,
            cands.as_deref(),
            &req.names,
        ) {
            real_dst = SocketAddr::new(ct.reply.src, ct.reply.sport);
            hops.push(h);
        }
    }
    let verdict = req
        .oracles
        .policy(req.src.ip, real_dst.ip(), real_dst.port(), req.proto);
    // What the source node's table should say: its pod's egress, and the
    // destination's ingress too when that is local.
    let expect = |egress: bool, ingress: bool| {
        verdict.as_ref().map(|v| {
            (
                (!egress || v.egress) && (!ingress || v.ingress),
                v.why.as_str(),
            )
        })
    };
    // The forward hook (policy) and postrouting (masquerade) come after
    // the routing decision.
    let policy_and_masquerade = |hops: &mut Vec<Hop>, dst_local: bool| {
        let ev = expect(true, dst_local);
        let judges = if dst_local {
            "egress and ingress"
        } else {
            "egress"
        };
        if let Some(h) =
            hops::policy_hop(&src_node.name, judges, &src_walk, podnet_policy_table(), ev)
        {
            hops.push(h);
        }
        if let Some(ct) = &ct {
            hops.push(hops::masquerade_hop(&src_node.name, ct, &req.names));
        }
    };
    let mut no_route = None;
    let mut unobserved = Vec::new();
    match route_hop(
        &src_node,
        &src_ns,
        req.src.ip,
        real_dst.ip(),
        bridge,
        &req.names,
        &req.nodes,
    ) {
        Ok(h) => {
            let remote = h.data.get("remote_node").cloned();
            // The destination is this node's when its bridge or the node
            // itself takes the packet; then both ends are judged here.
            let dst_local = h.data.get("backend").map(String::as_str) == Some("bridge")
                || h.data.get("type").map(String::as_str) == Some("local");
            hops.push(h);
            policy_and_masquerade(&mut hops, dst_local);
            // The destination node, when the packet went to another one.
            if let Some(remote) = remote {
                if let Some(n) = req.nodes.iter().find(|n| n.name == remote && !n.observed()) {
                    unobserved.push(n.name.clone());
                } else if let Some(n) = req.nodes.iter().find(|n| n.name == remote) {
                    let walk = add_node_rules(n, &mut hops, &mut drops);
                    let ev = expect(false, true);
                    if let Some(h) =
                        hops::policy_hop(&n.name, "ingress", &walk, podnet_policy_table(), ev)
                    {
                        hops.push(h);
                    }
                }
            }
        }
        Err(e) => {
            policy_and_masquerade(&mut hops, false);
            no_route = Some(e)
        }
    }
    let dst_label = req
        .names
        .get(&real_dst.ip())
        .cloned()
        .unwrap_or_else(|| real_dst.ip().to_string());
    hops.push(hops::end_hop(
        &outcome,
        &dst_label,
        &drops,
        no_route,
        &kernel_drops,
    ));
    Ok(Trace {
        src: format!("{} ({})", req.src.name, req.src.ip),
        dst: format!("{} ({})", req.dst_name, req.dst),
        proto: req.proto.name().to_string(),
        sport,
        outcome,
        hops,
        lost_events: lost,
        unobserved,
    })
}

fn podnet_policy_table() -> &'static str {
    "podnet-policy"
}
