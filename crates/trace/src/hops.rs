//! The pure half of a trace: the kernel's evidence in, hops out.
//!
//! Evidence is what the collector read: per node, the trace events of the
//! probe's first packet (one walk: the events that share the first ID),
//! the conntrack entry of the probe's connection, and what the pure
//! evaluators said. Hops are what a person reads, in the packet's order,
//! each with the facts behind it in `data` (so `-o json` gives the same
//! hops as data). Where a pure evaluator and the kernel disagree, the hop
//! says so in `disagreement`: the kernel's answer stands, the evaluator's
//! is shown.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use podnet_kernel::conntrack::{Entry, IPS_DST_NAT, IPS_SRC_NAT};
use podnet_kernel::nftrace::{TraceEvent, TraceKind, TraceVerdict};
use serde::Serialize;

use crate::probe::Outcome;

/// What a hop is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HopKind {
    /// The source pod's routing decision.
    PodRoute,
    /// The pod's veth and the bridge it is a port of.
    Veth,
    /// One nftables rule (or chain policy) that decided something.
    Rule,
    /// The Service DNAT: which Service port, which endpoint, why.
    Service,
    /// Whether the source address was rewritten.
    Masquerade,
    /// The NetworkPolicy verdict.
    Policy,
    /// A node's routing decision and the backend that carries the packet.
    Route,
    /// The probe got there.
    Deliver,
    /// The probe did not, and why.
    Drop,
}

/// One step of the packet's path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hop {
    /// Where: a pod (`ns/pod`) or a node.
    pub at: String,
    pub kind: HopKind,
    pub summary: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, String>,
    /// A pure evaluator's different answer, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disagreement: Option<String>,
}

impl Hop {
    pub fn new(at: &str, kind: HopKind, summary: impl Into<String>) -> Hop {
        Hop {
            at: at.to_string(),
            kind,
            summary: summary.into(),
            data: BTreeMap::new(),
            disagreement: None,
        }
    }

    pub fn with(mut self, k: &str, v: impl ToString) -> Hop {
        self.data.insert(k.to_string(), v.to_string());
        self
    }
}

/// Addresses by what they are: `default/web (pod)`, `node2`, and so on.
pub type Names = BTreeMap<IpAddr, String>;

/// `10.244.1.5 (default/a)`, or the bare address.
pub fn named(names: &Names, ip: IpAddr) -> String {
    match names.get(&ip) {
        Some(n) => format!("{ip} ({n})"),
        None => ip.to_string(),
    }
}

/// The events of the first packet in one namespace. Every packet of the
/// probe is marked again by the trace table's rule where it enters the
/// namespace, so a walk runs from one marking to the next. (The kernel's
/// trace IDs cannot group them: an ID is derived from the packet buffer's
/// address, which changes between hooks when the buffer is copied and is
/// reused by later packets.)
pub fn first_walk(events: &[TraceEvent], own_table: &str) -> Vec<TraceEvent> {
    let marks =
        |e: &TraceEvent| e.table == own_table && e.kind == TraceKind::Rule && e.rule.is_some();
    let mut out = Vec::new();
    let mut left_mark = false;
    for e in events {
        if marks(e) && left_mark {
            break;
        }
        left_mark |= e.table != own_table;
        out.push(e.clone());
    }
    out
}

/// A Service port, for naming a DNAT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// `ns/name`, and the port's name when it has one: `ns/name:http`.
    pub name: String,
    pub ip: IpAddr,
    pub port: u16,
    /// `tcp`, `udp` or `sctp`.
    pub proto: String,
}

/// The rules of one walk that decided something, in order: a verdict
/// other than "continue", or a base chain's policy that dropped. Chains
/// the packet only passed through (policy accept) are listed in one last
/// hop, in order. The trace table's own events and the kernel's
/// end-of-rules markers are left out. `describe` gives a rule's text by
/// (table, chain, handle) when it is known.
pub fn rule_hops(
    at: &str,
    walk: &[TraceEvent],
    own_table: &str,
    describe: &dyn Fn(&TraceEvent) -> Option<String>,
) -> Vec<Hop> {
    let mut out = Vec::new();
    let mut passed: Vec<String> = Vec::new();
    for e in walk {
        if e.table == own_table {
            continue;
        }
        let where_ = format!("{} {}/{}", family_name(e.family), e.table, e.chain);
        let (verdict, what) = match e.kind {
            TraceKind::Rule => match (&e.verdict, e.rule) {
                (Some(TraceVerdict::Continue), _) | (_, None) | (None, _) => continue,
                (Some(v), Some(_)) => (v.text(), describe(e).unwrap_or_else(|| "rule".into())),
            },
            TraceKind::Policy => {
                let p = e.policy.as_ref().map(|p| p.text()).unwrap_or_default();
                if p == "accept" {
                    if passed.last() != Some(&where_) {
                        passed.push(where_);
                    }
                    continue;
                }
                (p, "chain policy".to_string())
            }
            TraceKind::Return | TraceKind::Unknown(_) => continue,
        };
        // `nft` spells the verdict at the end of the rule; say it once.
        let summary = if what.ends_with(&verdict) {
            format!("{where_}: {what}")
        } else {
            format!("{where_}: {what} -> {verdict}")
        };
        let mut h = Hop::new(at, HopKind::Rule, summary)
            .with("table", &e.table)
            .with("family", family_name(e.family))
            .with("chain", &e.chain)
            .with("verdict", &verdict);
        if let Some(r) = e.rule {
            h = h.with("handle", r);
        }
        out.push(h);
    }
    if !passed.is_empty() {
        out.push(
            Hop::new(
                at,
                HopKind::Rule,
                format!("passed (policy accept): {}", passed.join(" > ")),
            )
            .with("passed", passed.join(",")),
        );
    }
    out
}

pub fn family_name(f: u8) -> &'static str {
    match f {
        1 => "inet",
        2 => "ip",
        10 => "ip6",
        7 => "bridge",
        5 => "netdev",
        3 => "arp",
        _ => "?",
    }
}

/// The Service DNAT, from the probe's conntrack entry: the original
/// destination is the Service port, the reply's source the endpoint the
/// kernel chose. `candidates` are the endpoints the proxy's pure tracer
/// says this packet may get; a choice outside them is a disagreement.
pub fn service_hop(
    at: &str,
    ct: &Entry,
    services: &[ServicePort],
    candidates: Option<&[SocketAddr]>,
    names: &Names,
) -> Option<Hop> {
    if ct.status & IPS_DST_NAT == 0 {
        return None;
    }
    let front = SocketAddr::new(ct.orig.dst, ct.orig.dport);
    let chosen = SocketAddr::new(ct.reply.src, ct.reply.sport);
    let svc = services
        .iter()
        .find(|s| s.ip == ct.orig.dst && s.port == ct.orig.dport)
        .map(|s| s.name.clone())
        .unwrap_or_else(|| format!("{front}"));
    let why = match candidates {
        Some([]) => "the proxy's tracer expected no endpoint".to_string(),
        Some([one]) if *one == chosen => "the only endpoint".to_string(),
        Some(c) => format!("picked at random (numgen) among {} endpoints", c.len()),
        None => "chosen by the kernel".to_string(),
    };
    let mut h = Hop::new(
        at,
        HopKind::Service,
        format!(
            "Service {svc} ({front}) -> endpoint {}:{}: {why}",
            named(names, chosen.ip()),
            chosen.port()
        ),
    )
    .with("service", &svc)
    .with("frontend", front)
    .with("endpoint", chosen)
    .with("why", &why);
    if let Some(c) = candidates {
        let list: Vec<String> = c.iter().map(|a| a.to_string()).collect();
        h = h.with("candidates", list.join(","));
        if !c.contains(&chosen) {
            h.disagreement = Some(format!(
                "the proxy's tracer expected one of [{}], the kernel chose {chosen}",
                list.join(", ")
            ));
        }
    }
    Some(h)
}

/// Whether the probe's source address was rewritten, from its conntrack
/// entry: a source NAT makes replies come back to another address.
pub fn masquerade_hop(at: &str, ct: &Entry, names: &Names) -> Hop {
    if ct.status & IPS_SRC_NAT != 0 {
        Hop::new(
            at,
            HopKind::Masquerade,
            format!(
                "masquerade: yes, source {} -> {}",
                ct.orig.src,
                named(names, ct.reply.dst)
            ),
        )
        .with("masquerade", true)
        .with("to", ct.reply.dst)
    } else {
        Hop::new(
            at,
            HopKind::Masquerade,
            format!("masquerade: no, source {} kept", ct.orig.src),
        )
        .with("masquerade", false)
    }
}

/// The NetworkPolicy verdict on one node, from its walk: a drop in the
/// policy table denies; a walk through it without one allows. The pure
/// evaluator's verdict and reasons go beside it.
pub fn policy_hop(
    at: &str,
    judges: &str,
    walk: &[TraceEvent],
    policy_table: &str,
    evaluator: Option<(bool, &str)>,
) -> Option<Hop> {
    let mine: Vec<&TraceEvent> = walk.iter().filter(|e| e.table == policy_table).collect();
    if mine.is_empty() {
        return None;
    }
    let drop = mine.iter().find(|e| {
        e.verdict == Some(TraceVerdict::Drop)
            || (e.kind == TraceKind::Policy && e.policy == Some(TraceVerdict::Drop))
    });
    let allowed = drop.is_none();
    let chains: Vec<&str> = {
        let mut c: Vec<&str> = mine.iter().map(|e| e.chain.as_str()).collect();
        c.dedup();
        c
    };
    let mut h = Hop::new(
        at,
        HopKind::Policy,
        match drop {
            None => format!(
                "NetworkPolicy ({judges}): allowed (through {})",
                chains.join(" > ")
            ),
            Some(d) => format!("NetworkPolicy ({judges}): DENIED in chain {}", d.chain),
        },
    )
    .with("allowed", allowed)
    .with("judges", judges)
    .with("chains", chains.join(","));
    if let Some(d) = drop {
        h = h.with("denied_in", &d.chain);
    }
    if let Some((ok, why)) = evaluator {
        h.summary = format!("{}; evaluator: {why}", h.summary);
        h = h.with("evaluator", why);
        if ok != allowed {
            h.disagreement = Some(format!(
                "the policy evaluator says {}: {why}",
                if ok { "allowed" } else { "denied" }
            ));
        }
    }
    Some(h)
}

/// The last hop: delivered (who answered), or dropped with the reason
/// the evidence gives. `drops` are the walks' dropping rules, in order,
/// as (node, hop); `no_route` a routing failure.
pub fn end_hop(
    outcome: &Outcome,
    dst: &str,
    drops: &[(String, Hop)],
    no_route: Option<(String, String)>,
    kernel: &[podnet_kernel::dropwatch::Dropped],
) -> Hop {
    if let Outcome::Connected { answer } = outcome {
        let mut h = Hop::new(
            dst,
            HopKind::Deliver,
            format!("delivered: {}", outcome.text()),
        );
        if !answer.is_empty() {
            h = h.with("answered_by", answer);
        }
        return h.with("outcome", outcome.text());
    }
    let (at, reason) = if let Some((node, hop)) = drops.first() {
        let table = hop.data.get("table").cloned().unwrap_or_default();
        let chain = hop.data.get("chain").cloned().unwrap_or_default();
        let why = if table == "podnet-policy" {
            format!("denied by NetworkPolicy (table {table}, chain {chain})")
        } else if hop.summary.contains("reject") && chain == "reject-chain" {
            "rejected: the Service has no endpoints".to_string()
        } else if hop.summary.contains("reject") {
            format!("rejected by {}", hop.summary)
        } else {
            format!("dropped by {}", hop.summary)
        };
        (node.clone(), why)
    } else if let Some((node, err)) = no_route {
        (node, format!("no route: {err}"))
    } else if let Some(k) = kernel
        .iter()
        .find(|k| k.reason != "NOT_SPECIFIED")
        .or(kernel.first())
        .filter(|_| !matches!(outcome, Outcome::Refused))
    {
        let h = Hop::new(
            dst,
            HopKind::Drop,
            format!(
                "{}: dropped by the kernel: {} in {}",
                outcome.text(),
                k.reason,
                k.location
            ),
        );
        return h
            .with("outcome", outcome.text())
            .with(
                "reason",
                format!("dropped by the kernel: {} in {}", k.reason, k.location),
            )
            .with("kernel_reason", &k.reason)
            .with("kernel_location", &k.location);
    } else {
        (
            dst.to_string(),
            match outcome {
                Outcome::Refused => "refused by the destination (no server on the port)".into(),
                o => format!("{}: no rule dropped it; nothing answered", o.text()),
            },
        )
    };
    Hop::new(&at, HopKind::Drop, format!("{}: {reason}", outcome.text()))
        .with("outcome", outcome.text())
        .with("reason", reason)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{entry, ip};

    fn ev(
        id: u32,
        table: &str,
        chain: &str,
        rule: Option<u64>,
        kind: TraceKind,
        v: Option<TraceVerdict>,
    ) -> TraceEvent {
        TraceEvent {
            id,
            family: 2,
            table: table.into(),
            chain: chain.into(),
            rule,
            kind,
            verdict: v,
            policy: (kind == TraceKind::Policy).then_some(TraceVerdict::Accept),
            iif: None,
            oif: None,
            mark: 0,
            nfproto: 2,
            packet: None,
        }
    }

    #[test]
    fn a_walk_keeps_only_what_decided() {
        use TraceKind::*;
        let walk = vec![
            ev(
                1,
                "podnet-trace",
                "pre",
                Some(2),
                Rule,
                Some(TraceVerdict::Continue),
            ),
            ev(
                1,
                "podnet",
                "nat-prerouting",
                Some(5),
                Rule,
                Some(TraceVerdict::Goto("svc-x".into())),
            ),
            ev(
                1,
                "podnet",
                "svc-x",
                Some(9),
                Rule,
                Some(TraceVerdict::Accept),
            ),
            ev(
                1,
                "podnet",
                "filter-forward",
                Some(11),
                Rule,
                Some(TraceVerdict::Continue),
            ),
            ev(
                1,
                "podnet",
                "filter-forward",
                None,
                Rule,
                Some(TraceVerdict::Continue),
            ),
            ev(1, "podnet", "filter-forward", None, Policy, None),
            ev(
                2,
                "podnet",
                "nat-prerouting",
                Some(5),
                Rule,
                Some(TraceVerdict::Accept),
            ),
        ];
        // The next marking starts the next packet's walk.
        let mut two = walk.clone();
        two.push(ev(
            3,
            "podnet-trace",
            "pre",
            Some(2),
            Rule,
            Some(TraceVerdict::Continue),
        ));
        two.push(ev(
            3,
            "podnet",
            "nat-prerouting",
            Some(5),
            Rule,
            Some(TraceVerdict::Accept),
        ));
        assert_eq!(first_walk(&two, "podnet-trace").len(), 7);
        let hops = rule_hops("node1", &walk[..6], "podnet-trace", &|e| {
            (e.rule == Some(9)).then(|| "dnat to 10.244.2.7:8080 accept".to_string())
        });
        let s: Vec<&str> = hops.iter().map(|h| h.summary.as_str()).collect();
        assert_eq!(
            s,
            [
                "ip podnet/nat-prerouting: rule -> goto svc-x",
                "ip podnet/svc-x: dnat to 10.244.2.7:8080 accept",
                "passed (policy accept): ip podnet/filter-forward",
            ]
        );
        assert_eq!(hops[1].data["handle"], "9");
    }

    #[test]
    fn the_service_hop_names_the_choice_and_checks_the_tracer() {
        let svc = [ServicePort {
            name: "default/web:http".into(),
            ip: ip("10.96.0.20"),
            port: 80,
            proto: "tcp".into(),
        }];
        let names: Names = [(ip("10.244.2.7"), "default/web-1".to_string())].into();
        let ep: SocketAddr = "10.244.2.7:8080".parse().unwrap();
        let other: SocketAddr = "10.244.3.9:8080".parse().unwrap();
        let h = service_hop(
            "node1",
            &entry(IPS_DST_NAT),
            &svc,
            Some(&[ep, other]),
            &names,
        )
        .unwrap();
        assert_eq!(
            h.summary,
            "Service default/web:http (10.96.0.20:80) -> endpoint 10.244.2.7 (default/web-1):8080: picked at random (numgen) among 2 endpoints"
        );
        assert_eq!(h.disagreement, None);
        let h = service_hop("node1", &entry(IPS_DST_NAT), &svc, Some(&[ep]), &names).unwrap();
        assert_eq!(h.data["why"], "the only endpoint");
        // The tracer expected another endpoint: flagged, the kernel's stands.
        let h = service_hop("node1", &entry(IPS_DST_NAT), &svc, Some(&[other]), &names).unwrap();
        assert!(h
            .disagreement
            .unwrap()
            .contains("the kernel chose 10.244.2.7:8080"));
        assert_eq!(h.data["endpoint"], "10.244.2.7:8080");
        // No DNAT: no Service hop.
        assert!(service_hop("node1", &entry(0), &svc, None, &names).is_none());
        // Masquerade from the same entry.
        assert_eq!(
            masquerade_hop("node1", &entry(IPS_DST_NAT), &names).data["masquerade"],
            "false"
        );
        let mut m = entry(IPS_DST_NAT | IPS_SRC_NAT);
        m.reply.dst = ip("192.168.100.11");
        let h = masquerade_hop("node1", &m, &names);
        assert_eq!(
            (h.data["masquerade"].as_str(), h.data["to"].as_str()),
            ("true", "192.168.100.11")
        );
    }

    #[test]
    fn policy_and_end_hops_say_why() {
        use TraceKind::*;
        let denied = vec![
            ev(
                1,
                "podnet-policy",
                "forward",
                Some(3),
                Rule,
                Some(TraceVerdict::Jump("judge".into())),
            ),
            ev(
                1,
                "podnet-policy",
                "judge",
                Some(8),
                Rule,
                Some(TraceVerdict::Goto("deny-ingress".into())),
            ),
            ev(
                1,
                "podnet-policy",
                "deny-ingress",
                Some(12),
                Rule,
                Some(TraceVerdict::Drop),
            ),
        ];
        let h = policy_hop(
            "node2",
            "ingress",
            &denied,
            "podnet-policy",
            Some((false, "isolated by default/deny-all")),
        )
        .unwrap();
        assert_eq!(
            h.summary,
            "NetworkPolicy (ingress): DENIED in chain deny-ingress; evaluator: isolated by default/deny-all"
        );
        assert_eq!(h.disagreement, None);
        // The evaluator disagreeing is flagged.
        let h = policy_hop(
            "node2",
            "ingress",
            &denied,
            "podnet-policy",
            Some((true, "not isolated")),
        )
        .unwrap();
        assert!(h
            .disagreement
            .unwrap()
            .starts_with("the policy evaluator says allowed"));
        assert!(policy_hop("node2", "ingress", &denied, "other", None).is_none());
        let drops: Vec<(String, Hop)> = rule_hops("node2", &denied, "podnet-trace", &|_| None)
            .into_iter()
            .filter(|h| h.data["verdict"] == "drop")
            .map(|h| ("node2".to_string(), h))
            .collect();
        let kernel = [podnet_kernel::dropwatch::Dropped {
            reason: "NO_SOCKET".into(),
            location: "__udp4_lib_rcv".into(),
            protocol: 0x0800,
        }];
        // A rule's drop outranks the kernel's word.
        let end = end_hop(&Outcome::TimedOut, "default/b", &drops, None, &kernel);
        assert_eq!(end.at, "node2");
        assert_eq!(
            end.data["reason"],
            "denied by NetworkPolicy (table podnet-policy, chain deny-ingress)"
        );
        let end = end_hop(
            &Outcome::Connected {
                answer: "default/b".into(),
            },
            "default/b",
            &[],
            None,
            &[],
        );
        assert_eq!(
            (end.kind, end.data["answered_by"].as_str()),
            (HopKind::Deliver, "default/b")
        );
        let end = end_hop(
            &Outcome::TimedOut,
            "10.9.9.9",
            &[],
            Some(("node1".into(), "Network is unreachable".into())),
            &[],
        );
        assert_eq!(end.data["reason"], "no route: Network is unreachable");
        // No rule dropped it: the kernel's reason, the specific one first.
        let noise = podnet_kernel::dropwatch::Dropped {
            reason: "NOT_SPECIFIED".into(),
            location: "ip6_mc_input".into(),
            protocol: 0x86dd,
        };
        let end = end_hop(
            &Outcome::TimedOut,
            "default/b",
            &[],
            None,
            &[noise.clone(), kernel[0].clone()],
        );
        assert_eq!(end.kind, HopKind::Drop);
        assert_eq!(end.data["kernel_reason"], "NO_SOCKET");
        assert_eq!(
            end.data["reason"],
            "dropped by the kernel: NO_SOCKET in __udp4_lib_rcv"
        );
        // A refusal is the destination's answer, not a drop.
        let end = end_hop(&Outcome::Refused, "default/b", &[], None, &kernel);
        assert!(!end.data.contains_key("kernel_reason"));
    }
}
