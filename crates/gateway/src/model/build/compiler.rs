//! The compiled state kept between changes, so a change to one HTTPRoute
//! or Ingress costs that object, not the cluster: each object's
//! [`Part`] is kept, and a change replaces one part and re-merges only
//! the (port, host) lists and ports it touched. A change to what every
//! route depends on (classes, Gateways, Services, Secrets, grants,
//! namespaces) starts a new compiler: those are rare, and one path for
//! both keeps the two from drifting (the tests compare them).
//!
//! Pure: objects in, table and statuses out.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::listeners::{self, Gw};
use super::part::{Part, Slot, Source};
use super::{ingress, routes, Built, Config, Key, Statuses, World};
use crate::model::{host_rank, matcher, BackendKey, Bind, Table};

/// The table and statuses, kept up to date one object at a time.
#[derive(Debug, Clone)]
pub struct Compiler {
    cfg: Config,
    /// Judged Gateways (their listeners' attachment counts at zero).
    gws: BTreeMap<Key, Gw>,
    /// The classes' verdicts, and the ports, TLS and certificates the
    /// Gateways' listeners open.
    base: Built,
    parts: BTreeMap<Source, Part>,
    /// Which parts have entries in each slot.
    by_host: HashMap<Slot, BTreeSet<Source>>,
    /// Per port: how many parts open it, and how many make it TLS.
    port_users: BTreeMap<Bind, (usize, usize)>,
    /// Per port: the parts that bring certificates to it.
    cert_users: BTreeMap<Bind, BTreeSet<Source>>,
    /// Routes attached per (Gateway, listener index).
    attached: HashMap<(Key, usize), i32>,
    /// Parts sending to each backend.
    backends: BTreeMap<BackendKey, usize>,
    table: Table,
}

/// What a change touched, to be re-merged.
#[derive(Default)]
struct Touched {
    hosts: BTreeSet<Slot>,
    ports: BTreeSet<Bind>,
}

impl Compiler {
    /// Compiles everything in `w`.
    pub fn new(w: &World, cfg: &Config) -> Compiler {
        Compiler::with_given(w, cfg, &BTreeMap::new())
    }

    /// Compiles everything in `w` again, each Gateway keeping the address
    /// this compiler gave it.
    pub fn renew(&self, w: &World) -> Compiler {
        let given = self
            .gws
            .iter()
            .filter_map(|(k, g)| Some((k.clone(), g.address?)))
            .collect();
        Compiler::with_given(w, &self.cfg, &given)
    }

    fn with_given(w: &World, cfg: &Config, given: &BTreeMap<Key, std::net::IpAddr>) -> Compiler {
        let mut base = Built::default();
        let gws = listeners::judge(w, cfg, given, &mut base);
        let mut c = Compiler {
            cfg: cfg.clone(),
            gws,
            parts: BTreeMap::new(),
            by_host: HashMap::new(),
            port_users: BTreeMap::new(),
            cert_users: BTreeMap::new(),
            attached: HashMap::new(),
            backends: BTreeMap::new(),
            table: Table::default(),
            base,
        };
        let mut t = Touched {
            ports: c.base.table.ports.keys().copied().collect(),
            ..Touched::default()
        };
        for k in w.routes.keys() {
            c.add(Source::Route(k.clone()), w, &mut t);
        }
        for k in w.ingresses.keys() {
            c.add(Source::Ingress(k.clone()), w, &mut t);
        }
        c.merge(t);
        c
    }

    /// Recompiles the HTTPRoutes and Ingresses in `changed` (added,
    /// modified or removed in `w`) and nothing else; returns the backends
    /// the old and new versions send to (whose endpoints may be wanted
    /// now, or no longer).
    pub fn update(&mut self, w: &World, changed: &BTreeSet<Source>) -> BTreeSet<BackendKey> {
        let mut t = Touched::default();
        let mut backends = BTreeSet::new();
        for s in changed {
            backends.extend(
                self.parts
                    .get(s)
                    .into_iter()
                    .flat_map(|p| p.backends.iter().cloned()),
            );
            self.remove(s, &mut t);
            self.add(s.clone(), w, &mut t);
            backends.extend(
                self.parts
                    .get(s)
                    .into_iter()
                    .flat_map(|p| p.backends.iter().cloned()),
            );
        }
        self.merge(t);
        backends
    }

    pub fn table(&self) -> &Table {
        &self.table
    }

    /// Every backend some rule sends to.
    pub fn backends(&self) -> impl Iterator<Item = &BackendKey> {
        self.backends.keys()
    }

    pub fn sends_to(&self, k: &BackendKey) -> bool {
        self.backends.contains_key(k)
    }

    /// The backends (ports) of Service `ns`/`name` some rule sends to.
    pub fn backends_of<'a>(&'a self, ns: &str, name: &str) -> impl Iterator<Item = &'a BackendKey> {
        let key = |port| BackendKey {
            namespace: ns.to_string(),
            service: name.to_string(),
            port,
        };
        self.backends.range(key(0)..=key(u16::MAX)).map(|(k, _)| k)
    }

    /// HTTPRoutes and Ingresses of ours.
    pub fn served(&self) -> usize {
        self.parts.len()
    }

    /// The statuses of the classes, the Gateways, and the routes and
    /// Ingresses in `only` (all of them: None).
    pub fn statuses(&self, only: Option<&BTreeSet<Source>>) -> Statuses {
        let mut s = Statuses {
            classes: self.base.statuses.classes.clone(),
            ..Statuses::default()
        };
        for (k, g) in &self.gws {
            let mut g = g.clone();
            for (i, l) in g.listeners.iter_mut().enumerate() {
                l.state.attached_routes = self.attached.get(&(k.clone(), i)).copied().unwrap_or(0);
            }
            s.gateways.insert(k.clone(), g.into_state());
        }
        let mut one = |src: &Source, part: &Part| match src {
            Source::Route(k) => {
                if let Some(rs) = &part.route_status {
                    s.routes.insert(k.clone(), rs.clone());
                }
            }
            Source::Ingress(k) => drop(s.ingresses.insert(k.clone())),
        };
        match only {
            None => self.parts.iter().for_each(|(src, p)| one(src, p)),
            Some(only) => only
                .iter()
                .filter_map(|src| Some((src, self.parts.get(src)?)))
                .for_each(|(src, p)| one(src, p)),
        }
        s
    }

    /// Everything, as one [`Built`].
    pub fn built(&self) -> Built {
        Built {
            table: self.table.clone(),
            statuses: self.statuses(None),
            backends: self.backends.keys().cloned().collect(),
        }
    }

    fn remove(&mut self, src: &Source, t: &mut Touched) {
        let Some(part) = self.parts.remove(src) else {
            return;
        };
        for bh in part.entries.keys() {
            if let Some(users) = self.by_host.get_mut(bh) {
                users.remove(src);
                if users.is_empty() {
                    self.by_host.remove(bh);
                }
            }
            t.hosts.insert(bh.clone());
        }
        for p in &part.ports {
            count(&mut self.port_users, p, |u| u.0 -= 1);
        }
        for p in &part.tls {
            count(&mut self.port_users, p, |u| u.1 -= 1);
        }
        t.ports.extend(part.ports.iter().chain(&part.tls).copied());
        for (p, _) in &part.certs {
            if let Some(users) = self.cert_users.get_mut(p) {
                users.remove(src);
                if users.is_empty() {
                    self.cert_users.remove(p);
                }
            }
            t.ports.insert(*p);
        }
        for a in &part.attached {
            if let Some(n) = self.attached.get_mut(a) {
                *n -= 1;
            }
        }
        for b in &part.backends {
            if let Some(n) = self.backends.get_mut(b) {
                *n -= 1;
                if *n == 0 {
                    self.backends.remove(b);
                }
            }
        }
    }

    fn add(&mut self, src: Source, w: &World, t: &mut Touched) {
        let part = match &src {
            Source::Route(k) => w
                .routes
                .get(k)
                .and_then(|r| routes::part(w, &self.gws, k, r)),
            Source::Ingress(k) => w
                .ingresses
                .get(k)
                .and_then(|i| ingress::part(w, &self.cfg, k, i)),
        };
        let Some(part) = part else { return };
        for bh in part.entries.keys() {
            self.by_host
                .entry(bh.clone())
                .or_default()
                .insert(src.clone());
            t.hosts.insert(bh.clone());
        }
        for p in &part.ports {
            self.port_users.entry(*p).or_default().0 += 1;
        }
        for p in &part.tls {
            self.port_users.entry(*p).or_default().1 += 1;
        }
        t.ports.extend(part.ports.iter().chain(&part.tls).copied());
        for (p, _) in &part.certs {
            self.cert_users.entry(*p).or_default().insert(src.clone());
            t.ports.insert(*p);
        }
        for a in &part.attached {
            *self.attached.entry(a.clone()).or_default() += 1;
        }
        for b in &part.backends {
            *self.backends.entry(b.clone()).or_default() += 1;
        }
        self.parts.insert(src, part);
    }

    /// Re-merges the ports and (port, host) lists a change touched.
    fn merge(&mut self, t: Touched) {
        for p in t.ports {
            self.merge_port(p);
        }
        for slot in t.hosts {
            let Some(pt) = self.table.ports.get_mut(&slot.bind) else {
                continue;
            };
            let mut list = Vec::new();
            for src in self.by_host.get(&slot).into_iter().flatten() {
                if let Some(es) = self.parts.get(src).and_then(|p| p.entries.get(&slot)) {
                    list.extend(es.iter().cloned());
                }
            }
            list.sort_by(|a, b| matcher::by_precedence((&a.m, &a.order), (&b.m, &b.order)));
            let v = (!list.is_empty()).then(|| Arc::new(list));
            let patterns = pt.hosts.entry(&slot.listener);
            patterns.set(&slot.host, v);
            if patterns.is_empty() {
                pt.hosts.set(&slot.listener, None);
            }
        }
    }

    /// A port's presence, TLS and certificates, from the Gateways'
    /// listeners and the parts.
    fn merge_port(&mut self, p: Bind) {
        let base = self.base.table.ports.get(&p);
        let (users, tls_users) = self.port_users.get(&p).copied().unwrap_or_default();
        if base.is_none() && users == 0 && tls_users == 0 {
            self.table.ports.remove(&p);
            return;
        }
        let mut certs = base.map(|b| b.certs.clone()).unwrap_or_default();
        for src in self.cert_users.get(&p).into_iter().flatten() {
            if let Some(part) = self.parts.get(src) {
                certs.extend(part.certs.iter().filter(|c| c.0 == p).map(|c| c.1.clone()));
            }
        }
        certs.sort_by_key(|c| std::cmp::Reverse(host_rank(&c.host)));
        let pt = self.table.ports.entry(p).or_default();
        pt.tls = base.is_some_and(|b| b.tls) || tls_users > 0;
        pt.certs = certs;
    }
}

fn count(m: &mut BTreeMap<Bind, (usize, usize)>, p: &Bind, f: impl FnOnce(&mut (usize, usize))) {
    if let Some(u) = m.get_mut(p) {
        f(u);
        if *u == (0, 0) {
            m.remove(p);
        }
    }
}
