//! The evaluator: NetworkPolicy's API semantics as a pure function from the
//! cluster view and one flow to a verdict with its reasons. It is the oracle
//! the data plane is checked against (the nft plan, traced, must agree with
//! it), and what `podnet policy explain` and the verdict log answer from.
//!
//! The semantics, in one place:
//! - a pod is isolated in a direction when a policy of its namespace selects
//!   it and has that direction in its (defaulted) policyTypes;
//! - an isolated end admits a flow when any rule of any policy isolating it
//!   admits it (allows add up; there is no deny rule);
//! - a new connection needs the source's egress and the destination's
//!   ingress; a hostNetwork pod, or an address that is no pod, has no side
//!   to judge;
//! - named ports resolve on the destination pod; a flow to a Service is
//!   judged after DNAT, so the flow here is always to the endpoint.

use std::net::IpAddr;

use podnet_nft::model::Proto;

use crate::world::{in_block, Dir, Key, Peer, PodView, PortMatch, Rule, World};

/// A new connection: after DNAT, as the destination pod sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flow {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: Proto,
    pub port: u16,
}

impl std::fmt::Display for Flow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} -> {} {}/{}",
            self.src,
            self.dst,
            self.proto.name(),
            self.port
        )
    }
}

/// One rule, named: policy, direction, index.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuleRef {
    pub policy: Key,
    pub dir: Dir,
    pub index: usize,
}

impl std::fmt::Display for RuleRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}[{}]", self.policy, self.dir.name(), self.index)
    }
}

/// One end's judgement.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Side {
    /// The pod at this end (None: not a pod, or a hostNetwork pod).
    pub pod: Option<Key>,
    /// The policies isolating it in this direction (empty: not isolated).
    pub isolated_by: Vec<Key>,
    /// The rules that admitted the flow.
    pub allowed_by: Vec<RuleRef>,
    /// For an isolated end that admitted nothing: why each rule did not
    /// match.
    pub misses: Vec<(RuleRef, String)>,
}

impl Side {
    pub fn allows(&self) -> bool {
        self.isolated_by.is_empty() || !self.allowed_by.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub flow: Flow,
    /// The source's egress.
    pub egress: Side,
    /// The destination's ingress.
    pub ingress: Side,
}

impl Verdict {
    pub fn allowed(&self) -> bool {
        self.egress.allows() && self.ingress.allows()
    }

    /// One line: why a denied flow was denied (the first side that denied
    /// it), or which rules allowed it.
    pub fn reason(&self) -> String {
        let side = |dir: Dir, s: &Side| -> String {
            let who = s
                .pod
                .as_ref()
                .map(|k| k.to_string())
                .unwrap_or_else(|| "-".into());
            if s.isolated_by.is_empty() {
                return format!("{} of {who}: not isolated", dir.name());
            }
            let by = join(&s.isolated_by);
            if s.allows() {
                return format!(
                    "{} of {who}: isolated by [{by}], allowed by {}",
                    dir.name(),
                    join(&s.allowed_by)
                );
            }
            let mut m = format!(
                "{} of {who}: isolated by [{by}], no rule allowed it",
                dir.name()
            );
            for (r, why) in &s.misses {
                m.push_str(&format!("; {r}: {why}"));
            }
            m
        };
        if !self.egress.allows() {
            side(Dir::Egress, &self.egress)
        } else if !self.ingress.allows() {
            side(Dir::Ingress, &self.ingress)
        } else {
            format!(
                "{}, {}",
                side(Dir::Egress, &self.egress),
                side(Dir::Ingress, &self.ingress)
            )
        }
    }
}

fn join<T: std::fmt::Display>(v: &[T]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The pod at `ip` that policies can select.
fn selectable(w: &World, ip: IpAddr) -> Option<(&Key, &PodView)> {
    w.pod_at(ip).filter(|(_, v)| !v.host_network)
}

/// Whether `port` matches for `proto`/`port` on destination `dst`.
fn port_matches(m: &PortMatch, proto: Proto, port: u16, dst: Option<&PodView>) -> bool {
    match m {
        PortMatch::Proto(p) => *p == proto,
        PortMatch::Range(p, a, b) => *p == proto && (*a..=*b).contains(&port),
        PortMatch::Named(p, name) => {
            *p == proto && dst.and_then(|d| d.named(name, proto)) == Some(port)
        }
    }
}

/// Whether peer `p` of a policy in `policy_ns` matches the remote end at `ip`.
fn peer_matches(w: &World, p: &Peer, policy_ns: &str, ip: IpAddr) -> bool {
    match p {
        Peer::Block { cidr, except } => in_block(ip, cidr, except),
        Peer::Pods { .. } => match selectable(w, ip) {
            Some((k, v)) => w.peer_matches_pod(p, policy_ns, k, v),
            None => false,
        },
    }
}

/// Why rule `r` does not admit the flow (None: it does).
fn rule_miss(
    w: &World,
    r: &Rule,
    policy_ns: &str,
    remote: IpAddr,
    f: &Flow,
    dst: Option<&PodView>,
) -> Option<String> {
    let peer_ok = match &r.peers {
        None => true,
        Some(ps) => ps.iter().any(|p| peer_matches(w, p, policy_ns, remote)),
    };
    let port_ok = match &r.ports {
        None => true,
        Some(ms) => ms.iter().any(|m| port_matches(m, f.proto, f.port, dst)),
    };
    if peer_ok && port_ok {
        return None;
    }
    let mut why = Vec::new();
    if !peer_ok {
        let peers = r.peers.as_deref().unwrap_or_default();
        let blocks: Vec<String> = peers
            .iter()
            .filter_map(|p| match p {
                Peer::Block { cidr, except } if except.is_empty() => Some(format!("{cidr}")),
                Peer::Block { cidr, except } => Some(format!("{cidr} except {}", join(except))),
                _ => None,
            })
            .collect();
        let remote_name = match w.pod_at(remote) {
            Some((k, _)) => format!("{k} ({remote})"),
            None => remote.to_string(),
        };
        if blocks.is_empty() {
            why.push(format!("no peer selects {remote_name}"));
        } else {
            why.push(format!(
                "no peer selects {remote_name} (ipBlock {})",
                blocks.join(", ")
            ));
        }
    }
    if !port_ok {
        why.push(format!(
            "{}/{} is not in [{}]",
            f.proto.name(),
            f.port,
            join(r.ports.as_deref().unwrap_or_default())
        ));
    }
    Some(why.join(" and "))
}

/// Judges one end (`dir`): the pod at `local`, the remote end at `remote`.
fn side(w: &World, dir: Dir, local: IpAddr, remote: IpAddr, f: &Flow) -> Side {
    let mut s = Side::default();
    let Some((k, v)) = selectable(w, local) else {
        return s;
    };
    s.pod = Some(k.clone());
    let dst_view = match dir {
        Dir::Ingress => Some(v),
        Dir::Egress => selectable(w, f.dst).map(|(_, v)| v),
    };
    for p in w.selecting(k, v) {
        let rules = match dir {
            Dir::Ingress => &p.ingress,
            Dir::Egress => &p.egress,
        };
        let Some(rules) = rules else { continue };
        s.isolated_by.push(p.key.clone());
        for (i, r) in rules.iter().enumerate() {
            let rr = RuleRef {
                policy: p.key.clone(),
                dir,
                index: i,
            };
            match rule_miss(w, r, &p.key.ns, remote, f, dst_view) {
                None => s.allowed_by.push(rr),
                Some(why) => s.misses.push((rr, why)),
            }
        }
    }
    if s.allows() {
        s.misses.clear();
    }
    s
}

/// The verdict on a new connection.
pub fn evaluate(w: &World, f: &Flow) -> Verdict {
    Verdict {
        flow: *f,
        egress: side(w, Dir::Egress, f.src, f.dst, f),
        ingress: side(w, Dir::Ingress, f.dst, f.src, f),
    }
}
