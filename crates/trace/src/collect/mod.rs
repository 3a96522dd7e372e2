//! The kernel half of a trace: the trace table and listeners on every
//! node, the probe from the source pod, and the lookups that explain each
//! node's decision (routes, neighbours and FDB entries, conntrack).
//!
//! A [`Session`] installs [`crate::plan::marker`] and opens a trace
//! listener in each node's namespace before the probe is sent, and
//! removes the tables when dropped, whatever happened. The events are
//! queued on the listeners while the kernel handles the packets, so once
//! the probe has its outcome they are all there to be read.

//!
//! The layout, one concept per file: this module holds the request (what
//! to trace, and the [`Oracles`] that answer for the pure evaluators) and
//! [`run`], which sends the probe and assembles the hops in the packet's
//! order; `session` owns the trace tables and listeners (with `lock`, one
//! trace per node at a time), `route` the routing hops and backends, and
//! `evidence` the rule texts and conntrack entries.

mod evidence;
mod lock;
mod route;
mod session;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use podnet_kernel::conntrack::{self, Entry};
use podnet_kernel::dropwatch::Dropped;
use podnet_kernel::nftrace::TraceEvent;
use podnet_kernel::{Handle, Netns};
use podnet_nft::model::Proto;

use crate::hops::{self, Hop, Names, ServicePort};
use crate::probe::{self, Outcome};
use crate::{Trace, TraceError};

pub use session::{cleanup, Session};

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

/// A source port for the probe: from a range Linux does not hand out as
/// ephemeral ports by default (32768-60999), varied per call.
pub fn pick_sport() -> u16 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    20000 + ((t.subsec_nanos() ^ std::process::id()) % 10000) as u16
}

/// Runs the probe and gathers everything: the hops in the packet's order.
pub fn run(req: &Request<'_>) -> Result<Trace, TraceError> {
    let sport = pick_sport();
    let first = route::pod_route_hop(&req.src, req.dst.ip(), &req.names)?;
    let src_node = entry_node(req, &first)?;
    let src_ns = open_netns(&src_node.netns)?;
    let mut hops = vec![first];
    let (veth, bridge) = entry_link(req, &src_ns)?;
    hops.extend(veth);
    let mut probed = send_probe(req, &src_ns, sport)?;

    // The source node: rules, Service, policy, masquerade, route.
    let ct = evidence::conntrack_entry(&src_ns, req.src.ip, sport, req.proto)
        .or_else(|| evidence::confirmed_entry(&mut probed.ct_events, req.src.ip, sport, req.proto));
    let mut a = Assembly {
        req,
        events: &probed.events,
        hops,
        drops: Vec::new(),
        unobserved: Vec::new(),
    };
    let src_walk = a.node_rules(&src_node);
    let real_dst = match &ct {
        Some(ct) => a.service(&src_node, ct),
        None => req.dst,
    };
    let verdict = req
        .oracles
        .policy(req.src.ip, real_dst.ip(), real_dst.port(), req.proto);
    let src = SourceNode {
        node: &src_node,
        ns: &src_ns,
        bridge,
        walk: &src_walk,
        ct: ct.as_ref(),
        verdict: verdict.as_ref(),
    };
    let no_route = a.route_on(&src, real_dst.ip());
    let dst_label = req
        .names
        .get(&real_dst.ip())
        .cloned()
        .unwrap_or_else(|| real_dst.ip().to_string());
    let mut hops = a.hops;
    hops.push(hops::end_hop(
        &probed.outcome,
        &dst_label,
        &a.drops,
        no_route,
        &probed.kernel_drops,
    ));
    Ok(Trace {
        src: format!("{} ({})", req.src.name, req.src.ip),
        dst: format!("{} ({})", req.dst_name, req.dst),
        proto: req.proto.name().to_string(),
        sport,
        outcome: probed.outcome,
        hops,
        lost_events: probed.lost,
        unobserved: a.unobserved,
    })
}

/// The node the packet enters first: the pod's, or for an outside host
/// the node it sends to (the destination, or its next hop, from the
/// source's `first` route hop). It must be one this trace observes.
fn entry_node(req: &Request<'_>, first: &Hop) -> Result<Node, TraceError> {
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
    Ok(src_node)
}

/// How the packet enters the source node: a pod's veth hop and its
/// bridge's index, or the link an outside host's packets come in on.
fn entry_link(req: &Request<'_>, src_ns: &Netns) -> Result<(Option<Hop>, Option<u32>), TraceError> {
    if req.src.node.is_some() {
        let (veth, bridge) = route::veth_hop(&req.src, src_ns)?;
        return Ok((Some(veth), bridge));
    }
    // The link the outside host's packets come in on.
    let link = src_ns
        .run(|| Handle::new().and_then(|mut h| h.route_get(req.src.ip, None, None)))?
        .ok()
        .and_then(|r| r.route.oif);
    Ok((None, link))
}

/// What the kernel recorded while the probe ran.
struct Probed {
    outcome: Outcome,
    /// The kernel's drop reasons for what the probe sent (empty when
    /// they could not be watched).
    kernel_drops: Vec<Dropped>,
    /// The trace events, per node, in arrival order.
    events: BTreeMap<String, Vec<TraceEvent>>,
    lost: u64,
    /// The source node's new connections as the kernel confirmed them.
    ct_events: conntrack::Events,
}

/// Installs the session, sends the probe from the source pod and collects
/// what the kernel queued; the trace tables are gone when it returns.
fn send_probe(req: &Request<'_>, src_ns: &Netns, sport: u16) -> Result<Probed, TraceError> {
    let udp = req.proto == Proto::Udp;
    let mut session = Session::start(&req.nodes, req.proto, sport)?;
    // The source node's new connections as the kernel confirms them: the
    // probe's entry with its NAT, even when the kernel deletes it at once
    // (a reset kills an unassured TCP entry, so a refused probe leaves none
    // in the table to read afterwards).
    let ct_events = src_ns.run(|| conntrack::Events::open(&[conntrack::EventKind::New]))??;
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
    Ok(Probed {
        outcome,
        kernel_drops,
        events,
        lost,
        ct_events,
    })
}

/// The source node as the hops after its routing decision need it.
struct SourceNode<'a> {
    node: &'a Node,
    ns: &'a Netns,
    /// The link the packet came in on (the pod's bridge).
    bridge: Option<u32>,
    /// Its walk through the node's tables.
    walk: &'a [TraceEvent],
    /// The probe's conntrack entry there.
    ct: Option<&'a Entry>,
    /// The policy evaluator's answer for the real destination.
    verdict: Option<&'a PolicyAnswer>,
}

impl SourceNode<'_> {
    /// What the source node's table should say: its pod's egress, and the
    /// destination's ingress too when that is local.
    fn expect(&self, egress: bool, ingress: bool) -> Option<(bool, &str)> {
        expectation(self.verdict, egress, ingress)
    }
}

/// The evaluator's expectation for the ends a node judges (`egress`, the
/// source's; `ingress`, the destination's), with its reasons.
fn expectation(v: Option<&PolicyAnswer>, egress: bool, ingress: bool) -> Option<(bool, &str)> {
    v.map(|v| {
        (
            (!egress || v.egress) && (!ingress || v.ingress),
            v.why.as_str(),
        )
    })
}

/// The hops built from the probe's evidence, node by node, with the drops
/// among them and the nodes the packet reached that this trace cannot see.
struct Assembly<'r, 'a> {
    req: &'r Request<'a>,
    events: &'r BTreeMap<String, Vec<TraceEvent>>,
    hops: Vec<Hop>,
    drops: Vec<(String, Hop)>,
    unobserved: Vec<String>,
}

impl Assembly<'_, '_> {
    /// The rules the probe passed on `node` (its first walk through the
    /// trace table's hooks), as hops; returns the walk.
    fn node_rules(&mut self, node: &Node) -> Vec<TraceEvent> {
        let walk = hops::first_walk(
            self.events
                .get(&node.name)
                .map(|v| v.as_slice())
                .unwrap_or(&[]),
            crate::plan::TABLE,
        );
        let texts = evidence::rule_texts(&node.netns, &walk);
        let rules = hops::rule_hops(&node.name, &walk, crate::plan::TABLE, &|e| {
            texts
                .get(&(e.table.clone(), e.chain.clone(), e.rule?))
                .cloned()
        });
        for r in &rules {
            if r.data.get("verdict").map(|v| v == "drop").unwrap_or(false) {
                self.drops.push((node.name.clone(), r.clone()));
            }
        }
        self.hops.extend(rules);
        walk
    }

    /// The Service hop when the source node DNATed the probe; returns where
    /// the packet really went.
    fn service(&mut self, src_node: &Node, ct: &Entry) -> SocketAddr {
        let req = self.req;
        let cands = req
            .oracles
            .endpoints(&src_node.name, req.src.ip, req.dst, req.proto);
        match hops::service_hop(
            &src_node.name,
            ct,
            &req.services,
            cands.as_deref(),
            &req.names,
        ) {
            Some(h) => {
                self.hops.push(h);
                SocketAddr::new(ct.reply.src, ct.reply.sport)
            }
            None => req.dst,
        }
    }

    /// The source node's routing decision, the hops after it (policy,
    /// masquerade) and the destination node's; the node and reason when
    /// there was no route.
    fn route_on(&mut self, src: &SourceNode<'_>, dst: IpAddr) -> Option<(String, String)> {
        let req = self.req;
        match route::route_hop(
            src.node, src.ns, req.src.ip, dst, src.bridge, &req.names, &req.nodes,
        ) {
            Ok(h) => {
                let remote = h.data.get("remote_node").cloned();
                // The destination is this node's when its bridge or the node
                // itself takes the packet; then both ends are judged here.
                let dst_local = h.data.get("backend").map(String::as_str) == Some("bridge")
                    || h.data.get("type").map(String::as_str) == Some("local");
                self.hops.push(h);
                self.policy_and_masquerade(src, dst_local);
                // The destination node, when the packet went to another one.
                if let Some(remote) = remote {
                    self.remote_node(&remote, src.verdict);
                }
                None
            }
            Err(e) => {
                self.policy_and_masquerade(src, false);
                Some(e)
            }
        }
    }

    /// The forward hook (policy) and postrouting (masquerade) on the source
    /// node, which come after the routing decision.
    fn policy_and_masquerade(&mut self, src: &SourceNode<'_>, dst_local: bool) {
        let ev = src.expect(true, dst_local);
        let judges = if dst_local {
            "egress and ingress"
        } else {
            "egress"
        };
        if let Some(h) =
            hops::policy_hop(&src.node.name, judges, src.walk, podnet_policy_table(), ev)
        {
            self.hops.push(h);
        }
        if let Some(ct) = src.ct {
            self.hops
                .push(hops::masquerade_hop(&src.node.name, ct, &self.req.names));
        }
    }

    /// The destination node's rules and ingress policy, or a note that this
    /// trace cannot see it.
    fn remote_node(&mut self, remote: &str, verdict: Option<&PolicyAnswer>) {
        let nodes = &self.req.nodes;
        if let Some(n) = nodes.iter().find(|n| n.name == remote && !n.observed()) {
            self.unobserved.push(n.name.clone());
        } else if let Some(n) = nodes.iter().find(|n| n.name == remote) {
            let walk = self.node_rules(n);
            let ev = expectation(verdict, false, true);
            if let Some(h) = hops::policy_hop(&n.name, "ingress", &walk, podnet_policy_table(), ev)
            {
                self.hops.push(h);
            }
        }
    }
}

fn podnet_policy_table() -> &'static str {
    "podnet-policy"
}
