//! The policy view of the cluster: pods (labels, addresses, node, named
//! ports), namespace labels and compiled NetworkPolicies, with the indexes
//! that keep selector lookups off a scan of every pod.
//!
//! Both the evaluator ([`crate::eval`]) and the planner ([`crate::plan`])
//! read this one view, so the oracle and the data plane can't disagree on
//! what a selector, a named port or a default means: the API's defaults are
//! resolved once, in [`Policy::compile`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use podnet_api::selector;
use podnet_nft::model::Proto;

pub type Labels = BTreeMap<String, String>;

/// "namespace/name".
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub ns: String,
    pub name: String,
}

impl Key {
    pub fn new(ns: &str, name: &str) -> Key {
        Key {
            ns: ns.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.ns, self.name)
    }
}

/// A container port with a name, as a policy's named port resolves.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamedPort {
    pub name: String,
    pub proto: Proto,
    pub port: u16,
}

/// What policy evaluation can see of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub labels: Labels,
    pub ips: Vec<IpAddr>,
    pub node: Option<String>,
    /// hostNetwork pods are never selected and never peers by selector.
    pub host_network: bool,
    pub ports: Vec<NamedPort>,
}

impl PodView {
    /// The view of a Pod object. A terminal pod (Succeeded, Failed) has
    /// given its address back, so it has none here.
    pub fn of(p: &Pod) -> PodView {
        let spec = p.spec.as_ref();
        let status = p.status.as_ref();
        let done = matches!(
            status.and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        let mut ips: Vec<IpAddr> = Vec::new();
        if !done {
            if let Some(s) = status {
                for a in s.pod_ips.iter().flatten() {
                    if let Ok(ip) = a.ip.parse() {
                        ips.push(ip);
                    }
                }
                if ips.is_empty() {
                    if let Some(ip) = s.pod_ip.as_deref().and_then(|i| i.parse().ok()) {
                        ips.push(ip);
                    }
                }
            }
        }
        let mut ports = Vec::new();
        for c in spec.iter().flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        }) {
            for cp in c.ports.iter().flatten() {
                let (Some(name), Some(proto)) = (cp.name.as_ref(), proto_of(&cp.protocol)) else {
                    continue;
                };
                if let Ok(port) = u16::try_from(cp.container_port) {
                    ports.push(NamedPort {
                        name: name.clone(),
                        proto,
                        port,
                    });
                }
            }
        }
        PodView {
            labels: p.metadata.labels.clone().unwrap_or_default(),
            ips,
            node: spec.and_then(|s| s.node_name.clone()),
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            ports,
        }
    }

    /// The port a named port resolves to on this pod, for `proto`.
    pub fn named(&self, name: &str, proto: Proto) -> Option<u16> {
        self.ports
            .iter()
            .find(|p| p.name == name && p.proto == proto)
            .map(|p| p.port)
    }
}

/// A protocol name as the API spells it; `None` (omitted) is TCP.
pub fn proto_of(p: &Option<String>) -> Option<Proto> {
    match p.as_deref() {
        None | Some("TCP") => Some(Proto::Tcp),
        Some("UDP") => Some(Proto::Udp),
        Some("SCTP") => Some(Proto::Sctp),
        Some(_) => None,
    }
}

/// One `ports` entry, defaults resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortMatch {
    /// Every port of one protocol (a `ports` entry without `port`).
    Proto(Proto),
    /// `port` (to `endPort` when given).
    Range(Proto, u16, u16),
    /// A named port, resolved on each destination pod.
    Named(Proto, String),
}

impl std::fmt::Display for PortMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortMatch::Proto(p) => write!(f, "{}/*", p.name()),
            PortMatch::Range(p, a, b) if a == b => write!(f, "{}/{a}", p.name()),
            PortMatch::Range(p, a, b) => write!(f, "{}/{a}-{b}", p.name()),
            PortMatch::Named(p, n) => write!(f, "{}/{n}", p.name()),
        }
    }
}

/// One peer, defaults resolved.
#[derive(Debug, Clone, PartialEq)]
pub enum Peer {
    /// Pods matching `pods` in the policy's own namespace (`namespaces`
    /// None) or in namespaces matching `namespaces`.
    Pods {
        namespaces: Option<LabelSelector>,
        pods: LabelSelector,
    },
    /// Addresses in `cidr` but in none of `except`.
    Block { cidr: IpNet, except: Vec<IpNet> },
}

/// One ingress or egress rule. `None` peers or ports: all of them (an
/// omitted or empty list).
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub peers: Option<Vec<Peer>>,
    pub ports: Option<Vec<PortMatch>>,
}

/// A NetworkPolicy with the API's defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub key: Key,
    pub selector: LabelSelector,
    /// `Some` when the policy isolates its pods for ingress (the rules may
    /// be none: deny all).
    pub ingress: Option<Vec<Rule>>,
    pub egress: Option<Vec<Rule>>,
}

fn peer(p: &NetworkPolicyPeer) -> Option<Peer> {
    if let Some(b) = &p.ip_block {
        return Some(Peer::Block {
            cidr: b.cidr.parse().ok()?,
            except: b
                .except
                .iter()
                .flatten()
                .filter_map(|e| e.parse().ok())
                .collect(),
        });
    }
    if p.pod_selector.is_none() && p.namespace_selector.is_none() {
        return None;
    }
    Some(Peer::Pods {
        namespaces: p.namespace_selector.clone(),
        pods: p.pod_selector.clone().unwrap_or_default(),
    })
}

fn port(p: &NetworkPolicyPort) -> Option<PortMatch> {
    let proto = proto_of(&p.protocol)?;
    Some(match &p.port {
        None => PortMatch::Proto(proto),
        Some(IntOrString::Int(n)) => {
            let a = u16::try_from(*n).ok()?;
            let b = match p.end_port {
                Some(e) => u16::try_from(e).ok()?.max(a),
                None => a,
            };
            PortMatch::Range(proto, a, b)
        }
        Some(IntOrString::String(s)) => match s.parse::<u16>() {
            // A number given as a string is a number.
            Ok(n) => PortMatch::Range(proto, n, n),
            Err(_) => PortMatch::Named(proto, s.clone()),
        },
    })
}

fn rule(peers: Option<&Vec<NetworkPolicyPeer>>, ports: Option<&Vec<NetworkPolicyPort>>) -> Rule {
    Rule {
        peers: match peers {
            Some(v) if !v.is_empty() => Some(v.iter().filter_map(peer).collect()),
            _ => None,
        },
        ports: match ports {
            Some(v) if !v.is_empty() => Some(v.iter().filter_map(port).collect()),
            _ => None,
        },
    }
}

impl Policy {
    /// The policy with defaults resolved: policyTypes omitted means
    /// Ingress, plus Egress when there are egress rules.
    pub fn compile(p: &NetworkPolicy) -> Option<Policy> {
        let ns = p.metadata.namespace.as_deref().unwrap_or("default");
        let name = p.metadata.name.as_deref()?;
        let spec = p.spec.as_ref()?;
        let (ing, eg) = match &spec.policy_types {
            Some(t) if !t.is_empty() => (
                t.iter().any(|x| x == "Ingress"),
                t.iter().any(|x| x == "Egress"),
            ),
            _ => (true, spec.egress.as_ref().is_some_and(|e| !e.is_empty())),
        };
        Some(Policy {
            key: Key::new(ns, name),
            selector: spec.pod_selector.clone().unwrap_or_default(),
            ingress: ing.then(|| {
                spec.ingress
                    .iter()
                    .flatten()
                    .map(|r| rule(r.from.as_ref(), r.ports.as_ref()))
                    .collect()
            }),
            egress: eg.then(|| {
                spec.egress
                    .iter()
                    .flatten()
                    .map(|r| rule(r.to.as_ref(), r.ports.as_ref()))
                    .collect()
            }),
        })
    }

    /// Whether it has egress to a named port of any pod (no peers, or an
    /// ipBlock), resolved on every pod carrying the name.
    pub fn named_wide(&self) -> bool {
        self.egress.iter().flatten().any(|r| {
            let open = r
                .peers
                .as_ref()
                .is_none_or(|ps| ps.iter().any(|x| matches!(x, Peer::Block { .. })));
            open && r
                .ports
                .iter()
                .flatten()
                .any(|m| matches!(m, PortMatch::Named(..)))
        })
    }

    /// Whether the policy has any peer that selects by namespace labels.
    pub fn uses_namespace_labels(&self) -> bool {
        self.ingress
            .iter()
            .chain(self.egress.iter())
            .flatten()
            .flat_map(|r| r.peers.iter().flatten())
            .any(|p| {
                matches!(
                    p,
                    Peer::Pods {
                        namespaces: Some(_),
                        ..
                    }
                )
            })
    }
}

/// Direction of a rule list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dir {
    Ingress,
    Egress,
}

impl Dir {
    pub fn name(self) -> &'static str {
        match self {
            Dir::Ingress => "ingress",
            Dir::Egress => "egress",
        }
    }
}

/// The whole view, with its indexes.
#[derive(Debug, Default, Clone)]
pub struct World {
    pub pods: BTreeMap<Key, PodView>,
    pub namespaces: BTreeMap<String, Labels>,
    pub policies: BTreeMap<Key, Policy>,
    by_ip: HashMap<IpAddr, Key>,
    by_ns: HashMap<String, BTreeSet<Key>>,
    /// Namespace → label key → value → pods carrying it, for matchLabels
    /// lookups: a selector's pods are found in its own namespace without
    /// visiting the pods of every other namespace that share the label.
    by_label: HashMap<String, HashMap<String, HashMap<String, BTreeSet<Key>>>>,
    /// Container port name → pods declaring it.
    by_port_name: HashMap<String, BTreeSet<Key>>,
    policies_by_ns: HashMap<String, BTreeSet<Key>>,
    /// Policies a pod of another namespace can matter to (peers chosen by
    /// namespace labels), by the namespaceSelectors they use (keyed by the
    /// selector's JSON), so a namespace's wide policies cost a match per
    /// distinct selector, not per policy.
    wide_by_selector: HashMap<String, (LabelSelector, BTreeSet<Key>)>,
    /// Wide policies with egress to named ports of any pod: they reach
    /// every namespace.
    named_wide: BTreeSet<Key>,
}

/// A selector as an index key: its JSON (label maps are ordered, so equal
/// selectors give equal keys).
fn selector_key(sel: &LabelSelector) -> String {
    serde_json::to_string(sel).unwrap_or_default()
}

/// The distinct namespaceSelectors of `p`'s peers.
fn ns_selectors(p: &Policy) -> Vec<&LabelSelector> {
    let mut out: Vec<&LabelSelector> = Vec::new();
    let peers = p.ingress.iter().chain(p.egress.iter()).flatten();
    for peer in peers.flat_map(|r| r.peers.iter().flatten()) {
        if let Peer::Pods {
            namespaces: Some(sel),
            ..
        } = peer
        {
            if !out.contains(&sel) {
                out.push(sel);
            }
        }
    }
    out
}

impl World {
    pub fn new() -> World {
        World::default()
    }

    /// Sets (or with `None` removes) a pod; returns the old view.
    pub fn set_pod(&mut self, k: Key, v: Option<PodView>) -> Option<PodView> {
        let old = match v {
            Some(v) => self.pods.insert(k.clone(), v),
            None => self.pods.remove(&k),
        };
        if let Some(o) = &old {
            for ip in &o.ips {
                if self.by_ip.get(ip) == Some(&k) {
                    self.by_ip.remove(ip);
                }
            }
            if let Some(in_ns) = self.by_label.get_mut(&k.ns) {
                for (lk, lv) in &o.labels {
                    let Some(values) = in_ns.get_mut(lk) else {
                        continue;
                    };
                    if let Some(s) = values.get_mut(lv) {
                        s.remove(&k);
                        if s.is_empty() {
                            values.remove(lv);
                        }
                    }
                    if values.is_empty() {
                        in_ns.remove(lk);
                    }
                }
                if in_ns.is_empty() {
                    self.by_label.remove(&k.ns);
                }
            }
            for p in &o.ports {
                if let Some(s) = self.by_port_name.get_mut(&p.name) {
                    s.remove(&k);
                    if s.is_empty() {
                        self.by_port_name.remove(&p.name);
                    }
                }
            }
        }
        match self.pods.get(&k) {
            Some(n) => {
                for ip in &n.ips {
                    self.by_ip.insert(*ip, k.clone());
                }
                let in_ns = self.by_label.entry(k.ns.clone()).or_default();
                for (lk, lv) in &n.labels {
                    in_ns
                        .entry(lk.clone())
                        .or_default()
                        .entry(lv.clone())
                        .or_default()
                        .insert(k.clone());
                }
                for p in &n.ports {
                    self.by_port_name
                        .entry(p.name.clone())
                        .or_default()
                        .insert(k.clone());
                }
                self.by_ns
                    .entry(k.ns.clone())
                    .or_default()
                    .insert(k.clone());
            }
            None => {
                if let Some(s) = self.by_ns.get_mut(&k.ns) {
                    s.remove(&k);
                }
            }
        }
        old
    }

    pub fn set_namespace(&mut self, name: &str, labels: Option<Labels>) -> Option<Labels> {
        match labels {
            Some(l) => self.namespaces.insert(name.into(), l),
            None => self.namespaces.remove(name),
        }
    }

    pub fn set_policy(&mut self, k: Key, p: Option<Policy>) -> Option<Policy> {
        let old = match p {
            Some(p) => {
                self.policies_by_ns
                    .entry(k.ns.clone())
                    .or_default()
                    .insert(k.clone());
                self.policies.insert(k.clone(), p)
            }
            None => {
                if let Some(s) = self.policies_by_ns.get_mut(&k.ns) {
                    s.remove(&k);
                }
                self.policies.remove(&k)
            }
        };
        if let Some(o) = &old {
            for sel in ns_selectors(o) {
                let key = selector_key(sel);
                if let Some((_, keys)) = self.wide_by_selector.get_mut(&key) {
                    keys.remove(&k);
                    if keys.is_empty() {
                        self.wide_by_selector.remove(&key);
                    }
                }
            }
            self.named_wide.remove(&k);
        }
        if let Some(n) = self.policies.get(&k) {
            for sel in ns_selectors(n) {
                self.wide_by_selector
                    .entry(selector_key(sel))
                    .or_insert_with(|| (sel.clone(), BTreeSet::new()))
                    .1
                    .insert(k.clone());
            }
            if n.named_wide() {
                self.named_wide.insert(k.clone());
            }
        }
        old
    }

    /// The pod holding `ip`, if any.
    pub fn pod_at(&self, ip: IpAddr) -> Option<(&Key, &PodView)> {
        let k = self.by_ip.get(&ip)?;
        Some((k, self.pods.get(k)?))
    }

    /// The policies of one namespace.
    pub fn policies_in<'a>(&'a self, ns: &str) -> impl Iterator<Item = &'a Policy> + 'a {
        self.policies_by_ns
            .get(ns)
            .into_iter()
            .flatten()
            .filter_map(|k| self.policies.get(k))
    }

    /// The wide policies a pod of namespace `ns` can matter to: a peer's
    /// namespaceSelector matches `ns`, or egress to named ports of any pod.
    /// Each once, in key order.
    pub fn wide_for(&self, ns: &str) -> impl Iterator<Item = &Policy> + '_ {
        let labels = self.ns_labels(ns);
        let keys: BTreeSet<&Key> = self
            .wide_by_selector
            .values()
            .filter(|(sel, _)| selector::matches(sel, labels))
            .flat_map(|(_, ks)| ks)
            .chain(&self.named_wide)
            .collect();
        keys.into_iter().filter_map(|k| self.policies.get(k))
    }

    /// The policies that select pod `k` (in its namespace), whatever their
    /// directions. hostNetwork pods are never selected.
    pub fn selecting<'a>(
        &'a self,
        k: &Key,
        v: &'a PodView,
    ) -> impl Iterator<Item = &'a Policy> + 'a {
        let host = v.host_network;
        self.policies_in(&k.ns)
            .filter(move |p| !host && selector::matches(&p.selector, &v.labels))
    }

    fn ns_labels(&self, ns: &str) -> &Labels {
        static EMPTY: Labels = BTreeMap::new();
        self.namespaces.get(ns).unwrap_or(&EMPTY)
    }

    /// Whether a pod-selecting peer of policy `policy_ns` matches pod
    /// (`k`, `v`).
    pub fn peer_matches_pod(&self, peer: &Peer, policy_ns: &str, k: &Key, v: &PodView) -> bool {
        match peer {
            Peer::Block { .. } => false,
            Peer::Pods { namespaces, pods } => {
                if v.host_network {
                    return false;
                }
                let ns_ok = match namespaces {
                    None => k.ns == policy_ns,
                    Some(s) => selector::matches(s, self.ns_labels(&k.ns)),
                };
                ns_ok && selector::matches(pods, &v.labels)
            }
        }
    }

    /// Pods in `ns` matching `sel`, through the label index when the
    /// selector has matchLabels.
    pub fn pods_in_matching<'a>(
        &'a self,
        ns: &'a str,
        sel: &'a LabelSelector,
    ) -> Box<dyn Iterator<Item = (&'a Key, &'a PodView)> + 'a> {
        let labelled = |k: &str, v: &str| {
            self.by_label
                .get(ns)
                .and_then(|m| m.get(k))
                .and_then(|m| m.get(v))
        };
        let smallest = sel
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| labelled(k, v))
            .min_by_key(|s| s.map_or(0, |s| s.len()));
        let it: Box<dyn Iterator<Item = &'a Key> + 'a> = match smallest {
            Some(None) => Box::new(std::iter::empty()),
            Some(Some(s)) => Box::new(s.iter()),
            None => Box::new(self.by_ns.get(ns).into_iter().flatten()),
        };
        Box::new(it.filter_map(move |k| {
            let v = self.pods.get(k)?;
            (!v.host_network && selector::matches(sel, &v.labels)).then_some((k, v))
        }))
    }

    /// Every pod a pod-selecting peer of a policy in `policy_ns` matches.
    pub fn peer_pods<'a>(
        &'a self,
        peer: &'a Peer,
        policy_ns: &'a str,
    ) -> Vec<(&'a Key, &'a PodView)> {
        match peer {
            Peer::Block { .. } => Vec::new(),
            Peer::Pods {
                namespaces: None,
                pods,
            } => self.pods_in_matching(policy_ns, pods).collect(),
            Peer::Pods {
                namespaces: Some(nsel),
                pods,
            } => self
                .by_ns
                .keys()
                .filter(|n| selector::matches(nsel, self.ns_labels(n)))
                .flat_map(|n| self.pods_in_matching(n, pods))
                .collect(),
        }
    }

    /// Pods that declare a container port named `name` for `proto`
    /// (through the port-name index: egress to a named port of any pod is
    /// planned for every local pod a policy selects).
    pub fn pods_with_port<'a>(
        &'a self,
        name: &'a str,
        proto: Proto,
    ) -> impl Iterator<Item = (&'a Key, &'a PodView)> + 'a {
        self.by_port_name
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|k| Some((k, self.pods.get(k)?)))
            .filter(move |(_, v)| !v.host_network && v.named(name, proto).is_some())
    }
}

/// Whether `ip` is in `cidr` and in none of `except`.
pub fn in_block(ip: IpAddr, cidr: &IpNet, except: &[IpNet]) -> bool {
    cidr.contains(&ip) && !except.iter().any(|e| e.contains(&ip))
}

impl World {
    /// Takes one object-source delta (Pods, Namespaces, NetworkPolicies;
    /// other kinds are ignored). For consumers that need the view only,
    /// such as `podnet policy explain`.
    pub fn apply(&mut self, d: &podnet_source::Delta) {
        use podnet_api::{Kind, Object};
        let key = d.key();
        let ns = key.namespace.clone().unwrap_or_default();
        let obj = match d {
            podnet_source::Delta::Added(o) | podnet_source::Delta::Updated(o) => Some(o.as_ref()),
            podnet_source::Delta::Deleted(_) => None,
        };
        match (key.kind, obj) {
            (Kind::Pod, Some(Object::Pod(p))) => {
                self.set_pod(Key::new(&ns, &key.name), Some(PodView::of(p)));
            }
            (Kind::Pod, _) => {
                self.set_pod(Key::new(&ns, &key.name), None);
            }
            (Kind::Namespace, Some(Object::Namespace(n))) => {
                self.set_namespace(
                    &key.name,
                    Some(n.metadata.labels.clone().unwrap_or_default()),
                );
            }
            (Kind::Namespace, _) => {
                self.set_namespace(&key.name, None);
            }
            (Kind::NetworkPolicy, Some(Object::NetworkPolicy(p))) => {
                self.set_policy(Key::new(&ns, &key.name), Policy::compile(p));
            }
            (Kind::NetworkPolicy, _) => {
                self.set_policy(Key::new(&ns, &key.name), None);
            }
            _ => {}
        }
    }
}
