//! The [`Builder`]: owns the objects DNS cares about and the records each
//! Service contributes, and turns changes into snapshots. A change
//! re-derives only the changed Service's records and recompiles only the
//! names whose records (or existence) changed, so an update costs work
//! proportional to the change. Each name is a node holding its records
//! and a reference count (records at or below it, plus fixed names): a
//! name exists while that count is positive.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use ipnet::IpNet;
use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;

use super::compile::{compile, soa_rdata};
use super::names::{is_under, parent, prepend, valid_label};
use super::objects::{SliceInfo, SvcInfo, SvcKey, SvcKind};
use super::records::{self, Named, Rec};
use super::table::{hash_name, shard_of, Packed, Table, SHARDS};
use super::{Snapshot, ZoneConfig, SCHEMA_VERSION};
use crate::wire::{self, RData};

/// One name: the records at it, by owner (a Service's id, or
/// [`FIXED_OWNER`]), and whether it exists.
#[derive(Debug, Default)]
pub(super) struct Node {
    pub(super) recs: Vec<(u32, Rec)>,
    /// Records at or below this name, plus fixed references: the name
    /// exists while this is positive.
    pub(super) refs: u32,
}

/// What one Service put into the nodes.
struct Owned {
    id: u32,
    hash: u64,
    names: Box<[Box<[u8]>]>,
}

/// Owns the cluster objects DNS cares about and maintains the snapshot.
pub struct Builder {
    cfg: ZoneConfig,
    zone: Vec<u8>,
    serial: u32,
    services: HashMap<SvcKey, SvcInfo>,
    slices: HashMap<SvcKey, SliceInfo>,
    by_service: HashMap<SvcKey, Vec<Box<str>>>,
    namespaces: HashSet<String>,
    next_owner: u32,
    /// Services deleted while not headless since the last relist: their
    /// slices were not kept, so one recreated headless needs a relist.
    gone_non_headless: HashSet<SvcKey>,
    /// A Service turned headless whose slices were stored without their
    /// endpoints: the caller must relist.
    needs_relist: bool,
    /// What each Service contributed: its owner id in `nodes`, a hash of
    /// its records (to skip unchanged Services) and the names they sit at,
    /// one per record. The records themselves live only in `nodes`.
    owned: HashMap<SvcKey, Owned>,
    nodes: HashMap<Vec<u8>, Node>,
    shards: Vec<Arc<Table>>,
    names: usize,
    pending: BTreeSet<SvcKey>,
    dirty: HashSet<Vec<u8>>,
}

/// The owner of the zone's own records (the apex SOA, `dns-version`).
const FIXED_OWNER: u32 = 0;

impl Builder {
    pub fn new(cfg: ZoneConfig) -> Builder {
        let zone = wire::name_from_str(&cfg.zone)
            .unwrap_or_else(|_| wire::name_from_str("cluster.local").expect("valid"));
        let mut b = Builder {
            cfg,
            zone,
            serial: 1,
            services: HashMap::new(),
            slices: HashMap::new(),
            by_service: HashMap::new(),
            namespaces: HashSet::new(),
            next_owner: 1,
            gone_non_headless: HashSet::new(),
            needs_relist: false,
            owned: HashMap::new(),
            nodes: HashMap::new(),
            shards: (0..SHARDS).map(|_| Arc::new(Table::new())).collect(),
            names: 0,
            pending: BTreeSet::new(),
            dirty: HashSet::new(),
        };
        b.add_fixed();
        b
    }

    pub fn config(&self) -> &ZoneConfig {
        &self.cfg
    }

    fn add_fixed(&mut self) {
        let z = self.zone.clone();
        let txt = prepend("dns-version", &z).expect("short");
        self.add_rec(
            FIXED_OWNER,
            txt,
            Rec {
                rtype: wire::TYPE_TXT,
                rdata: RData::Txt(vec![SCHEMA_VERSION.as_bytes().to_vec()]),
            },
        );
        let svc = prepend("svc", &z).expect("short");
        self.adjust(&svc, 1);
        if self.cfg.pods {
            let pod = prepend("pod", &z).expect("short");
            self.adjust(&pod, 1);
        }
        // The apex SOA is added at publish time (its serial changes).
        self.adjust(&z, 1);
    }

    fn soa(&self) -> RData {
        let mname = prepend("ns", &prepend("dns", &self.zone).expect("short")).expect("short");
        RData::Soa {
            mname,
            rname: prepend("hostmaster", &self.zone).expect("short"),
            serial: self.serial,
            refresh: 7200,
            retry: 1800,
            expire: 86400,
            minimum: self.cfg.ttl,
        }
    }

    /// Adds `delta` references to a name and, inside the zone, to every
    /// ancestor up to the apex; names that appear or vanish become dirty.
    fn adjust(&mut self, name: &[u8], delta: i64) {
        let inside = is_under(name, &self.zone);
        let mut cur: &[u8] = name;
        loop {
            let node = self.nodes.entry(cur.to_vec()).or_default();
            let before = node.refs;
            node.refs = (node.refs as i64 + delta).max(0) as u32;
            if (before == 0) != (node.refs == 0) {
                self.dirty.insert(cur.to_vec());
            }
            if !inside || cur == &self.zone[..] {
                break;
            }
            match parent(cur) {
                Some(p) => cur = p,
                None => break,
            }
        }
    }

    fn add_rec(&mut self, owner: u32, name: Vec<u8>, rec: Rec) {
        self.adjust(&name, 1);
        let node = self.nodes.entry(name.clone()).or_default();
        node.recs.push((owner, rec));
        self.dirty.insert(name);
    }

    /// Takes back every record `owner` put at `names` (one entry per
    /// record, so reference counts drop by as many).
    fn remove_owner_recs(&mut self, owner: u32, names: &[Box<[u8]>]) {
        for name in names {
            if let Some(node) = self.nodes.get_mut(&name[..]) {
                node.recs.retain(|(o, _)| *o != owner);
            }
            self.dirty.insert(name.to_vec());
            self.adjust(name, -1);
        }
    }

    /// Whether the store must be listed again (and clears the flag):
    /// endpoints of non-headless Services are not kept (a ClusterIP
    /// Service's DNS records do not depend on them), so a Service that
    /// becomes headless needs them read again.
    pub fn take_relist(&mut self) -> bool {
        std::mem::take(&mut self.needs_relist)
    }

    /// Records or replaces a Service.
    pub fn upsert_service(&mut self, svc: &Service) {
        let Some((key, info)) = SvcInfo::from_service(svc) else {
            return;
        };
        if self.services.get(&key) != Some(&info) {
            if info.kind == SvcKind::Headless {
                // Its slices may have been dropped while it was not headless.
                let was_other = self
                    .services
                    .get(&key)
                    .is_some_and(|i| i.kind != SvcKind::Headless);
                self.needs_relist |= was_other || self.gone_non_headless.remove(&key);
            }
            self.services.insert(key.clone(), info);
            self.pending.insert(key);
        }
    }

    pub fn delete_service(&mut self, ns: &str, name: &str) {
        let key = (ns.to_string(), name.to_string());
        if let Some(old) = self.services.remove(&key) {
            if old.kind != SvcKind::Headless {
                self.gone_non_headless.insert(key.clone());
                // Bounded: past this, a relist forgets them all.
                self.needs_relist |= self.gone_non_headless.len() > 4096;
            }
            self.pending.insert(key);
        }
    }

    /// Records or replaces an EndpointSlice.
    pub fn upsert_slice(&mut self, s: &EndpointSlice) {
        let Some(((ns, name), info)) = SliceInfo::from_slice(s) else {
            return;
        };
        // Only headless Services publish endpoints: slices of a known
        // ClusterIP or ExternalName Service are not kept at all.
        let keep = match &info.service {
            Some(svc) => self
                .services
                .get(&(ns.clone(), svc.to_string()))
                .is_none_or(|i| i.kind == SvcKind::Headless),
            None => false,
        };
        if !keep {
            self.delete_slice(&ns, &name);
            return;
        }
        let key = (ns.clone(), name.clone());
        if self.slices.get(&key) == Some(&info) {
            return;
        }
        self.delete_slice(&ns, &name);
        if let Some(svc) = &info.service {
            let sk = (ns.clone(), svc.to_string());
            let set = self.by_service.entry(sk.clone()).or_default();
            if !set.iter().any(|n| **n == *name) {
                set.push(name.as_str().into());
            }
            self.pending.insert(sk);
        }
        self.slices.insert(key, info);
    }

    pub fn delete_slice(&mut self, ns: &str, name: &str) {
        let key = (ns.to_string(), name.to_string());
        if let Some(old) = self.slices.remove(&key) {
            if let Some(svc) = old.service {
                let sk = (ns.to_string(), svc.to_string());
                if let Some(set) = self.by_service.get_mut(&sk) {
                    set.retain(|n| **n != *name);
                    if set.is_empty() {
                        self.by_service.remove(&sk);
                    }
                }
                self.pending.insert(sk);
            }
        }
    }

    /// A Namespace makes `<ns>.svc.<zone>` exist (NODATA, not NXDOMAIN).
    pub fn upsert_namespace(&mut self, name: &str) {
        if valid_label(name) && self.namespaces.insert(name.to_string()) {
            if let Some(n) = self.ns_name(name) {
                self.adjust(&n, 1);
            }
        }
    }

    pub fn delete_namespace(&mut self, name: &str) {
        if self.namespaces.remove(name) {
            if let Some(n) = self.ns_name(name) {
                self.adjust(&n, -1);
            }
        }
    }

    fn ns_name(&self, ns: &str) -> Option<Vec<u8>> {
        prepend(ns, &prepend("svc", &self.zone)?)
    }

    /// Forgets everything (before a relist), keeping the published shards
    /// so the change is computed against what is served.
    pub fn clear_objects(&mut self) {
        let svcs: Vec<SvcKey> = self.services.keys().cloned().collect();
        for (ns, n) in svcs {
            self.delete_service(&ns, &n);
        }
        let slices: Vec<SvcKey> = self.slices.keys().cloned().collect();
        for (ns, n) in slices {
            self.delete_slice(&ns, &n);
        }
        let nss: Vec<String> = self.namespaces.iter().cloned().collect();
        for n in nss {
            self.delete_namespace(&n);
        }
        self.gone_non_headless.clear();
    }

    /// The records a Service contributes, by name.
    fn service_records(&self, key: &SvcKey) -> Named {
        let Some(svc) = self.services.get(key) else {
            return Vec::new();
        };
        let (ns, name) = key;
        let Some(base) = self.ns_name(ns).and_then(|n| prepend(name, &n)) else {
            return Vec::new();
        };
        let slices = self
            .by_service
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|s| self.slices.get(&(ns.clone(), s.to_string())));
        records::service_records(svc, &base, slices)
    }

    /// Re-derives the pending Services' records.
    fn refresh_pending(&mut self) {
        use std::hash::{Hash, Hasher};
        for key in std::mem::take(&mut self.pending) {
            let new = self.service_records(&key);
            let mut h = std::collections::hash_map::DefaultHasher::new();
            new.hash(&mut h);
            let hash = h.finish();
            let old = self.owned.remove(&key);
            let id = match old {
                Some(o) if o.hash == hash => {
                    self.owned.insert(key, o);
                    continue;
                }
                Some(o) => {
                    self.remove_owner_recs(o.id, &o.names);
                    o.id
                }
                None => {
                    let id = self.next_owner;
                    self.next_owner = self.next_owner.wrapping_add(1).max(1);
                    id
                }
            };
            if new.is_empty() {
                continue;
            }
            let names: Box<[Box<[u8]>]> = new.iter().map(|(n, _)| n[..].into()).collect();
            for (name, rec) in new {
                self.add_rec(id, name, rec);
            }
            self.owned.insert(key, Owned { id, hash, names });
        }
    }

    /// Applies pending changes and returns the snapshot to serve.
    pub fn publish(&mut self, ready: bool) -> Arc<Snapshot> {
        Arc::new(self.publish_inner(ready))
    }

    /// Whether anything changed since the last publish.
    pub fn has_changes(&self) -> bool {
        !self.pending.is_empty() || !self.dirty.is_empty()
    }

    /// Applies pending changes; the snapshot of the result.
    pub(super) fn publish_inner(&mut self, ready: bool) -> Snapshot {
        self.refresh_pending();
        if !self.dirty.is_empty() || self.serial == 1 {
            self.bump_serial();
        }
        for name in std::mem::take(&mut self.dirty) {
            self.recompile(name);
        }
        self.snapshot(ready)
    }

    /// The apex SOA carries a serial that moves with every change.
    fn bump_serial(&mut self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(0);
        self.serial = now.max(self.serial.wrapping_add(1));
        let soa = Rec {
            rtype: wire::TYPE_SOA,
            rdata: self.soa(),
        };
        let z = self.zone.clone();
        if let Some(node) = self.nodes.get_mut(&z) {
            node.recs
                .retain(|(o, r)| !(*o == FIXED_OWNER && r.rtype == wire::TYPE_SOA));
            node.recs.push((FIXED_OWNER, soa));
        }
        self.dirty.insert(z);
    }

    /// Brings one dirty name's packed entry in the shards up to date: new
    /// answers while it exists, gone when it no longer does.
    fn recompile(&mut self, name: Vec<u8>) {
        let h = hash_name(&name);
        let live = self.nodes.get(&name).filter(|n| n.refs > 0);
        let compiled = live.map(|n| compile(&name, n, &self.nodes, self.cfg.ttl).pack(&name));
        let shard = Arc::make_mut(&mut self.shards[shard_of(h)]);
        match shard.find_entry(h, |e| Packed(e).key() == &name[..]) {
            Ok(occ) => {
                if let Some(e) = compiled {
                    *occ.into_mut() = e;
                } else {
                    occ.remove();
                    self.names -= 1;
                }
            }
            Err(_) => {
                if let Some(e) = compiled {
                    shard.insert_unique(h, e, |e| hash_name(Packed(e).key()));
                    self.names += 1;
                }
            }
        }
        if let Some(n) = self.nodes.get_mut(&name) {
            if n.refs == 0 && n.recs.is_empty() {
                self.nodes.remove(&name);
            } else {
                // Most names hold one record; a Vec grown by push keeps
                // room for four. At 10,000 Services that slack is
                // megabytes.
                n.recs.shrink_to_fit();
            }
        }
    }

    /// The published state as a snapshot, sharing the shards.
    fn snapshot(&self, ready: bool) -> Snapshot {
        let reverse = self
            .cfg
            .reverse
            .iter()
            .map(|net| {
                let labels = match net {
                    IpNet::V4(n) => (n.prefix_len() / 8) as usize + 2,
                    IpNet::V6(n) => (n.prefix_len() / 4) as usize + 2,
                };
                (*net, labels)
            })
            .collect();
        Snapshot {
            ready,
            zone: self.zone.clone(),
            pod_zone: prepend("pod", &self.zone).unwrap_or_default(),
            ttl: self.cfg.ttl,
            pods: self.cfg.pods,
            reverse,
            soa_rdata: soa_rdata(self.soa()),
            shards: self.shards.clone(),
            names: self.names,
        }
    }

    /// Services known (for metrics).
    pub fn service_count(&self) -> usize {
        self.services.len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::*;
    use wire::*;

    #[test]
    fn dns_version() {
        let s = fixture().publish(true);
        let m = ask(&s, "dns-version.cluster.local", TYPE_TXT);
        assert_eq!(m.rcode(), NOERROR);
        assert_eq!(m.answers[0].rdata, RData::Txt(vec![b"1.1.0".to_vec()]));
        assert!(m.header.flags & AA != 0);
        assert_eq!(m.answers[0].ttl, 5);
        // A for the TXT name: NODATA.
        let m = ask(&s, "dns-version.cluster.local", TYPE_A);
        assert_eq!(m.rcode(), NOERROR);
        assert!(m.answers.is_empty());
        assert_eq!(m.authority[0].rtype, TYPE_SOA);
    }

    #[test]
    fn updates_touch_only_what_changed() {
        let mut b = fixture();
        let s1 = b.publish(true);
        let names_before = s1.name_count();
        // Endpoint becomes ready: it appears; the old snapshot is unchanged.
        b.upsert_slice(&slice(
            "shop",
            "db-abc",
            "db",
            &[
                ("10.244.1.5", Some("db-0"), true),
                ("10.244.2.6", None, true),
                ("10.244.3.7", Some("db-2"), true),
            ],
            &[("pg", 5432)],
        ));
        let s2 = b.publish(true);
        assert_eq!(
            ask(&s2, "db.shop.svc.cluster.local", TYPE_A).answers.len(),
            3
        );
        assert_eq!(
            ask(&s1, "db.shop.svc.cluster.local", TYPE_A).answers.len(),
            2
        );
        let shared = s1
            .shards
            .iter()
            .zip(&s2.shards)
            .filter(|(a, b)| Arc::ptr_eq(a, b))
            .count();
        assert!(shared > SHARDS - 10, "only touched shards copied: {shared}");
        // Delete a Service: its names go, its namespace stays (Services remain).
        b.delete_service("shop", "web");
        let s3 = b.publish(true);
        assert_eq!(
            ask(&s3, "web.shop.svc.cluster.local", TYPE_A).rcode(),
            NXDOMAIN
        );
        assert_eq!(
            ask(&s3, "5.5.96.10.in-addr.arpa", TYPE_PTR).rcode(),
            NXDOMAIN
        );
        assert_eq!(
            ask(&s3, "_http._tcp.web.shop.svc.cluster.local", TYPE_SRV).rcode(),
            NXDOMAIN
        );
        assert_eq!(ask(&s3, "shop.svc.cluster.local", TYPE_A).rcode(), NOERROR);
        // Remove everything in shop: the namespace name goes too.
        for n in ["db", "nobody", "ext", "inner", "pending"] {
            b.delete_service("shop", n);
        }
        b.delete_slice("shop", "db-abc");
        let s4 = b.publish(true);
        assert_eq!(ask(&s4, "shop.svc.cluster.local", TYPE_A).rcode(), NXDOMAIN);
        assert_eq!(
            ask(&s4, "db-0.db.shop.svc.cluster.local", TYPE_A).rcode(),
            NXDOMAIN
        );
        // Back to the start: same names as the fixture had minus shop's.
        assert!(s4.name_count() < names_before);
        // Clearing everything and re-adding is idempotent.
        b.clear_objects();
        let s5 = b.publish(true);
        assert_eq!(
            ask(&s5, "kubernetes.default.svc.cluster.local", TYPE_A).rcode(),
            NXDOMAIN
        );
        assert_eq!(ask(&s5, "svc.cluster.local", TYPE_A).rcode(), NOERROR);
        assert_eq!(
            ask(&s5, "default.svc.cluster.local", TYPE_A).rcode(),
            NXDOMAIN
        );
        // A Service changes IP: the old PTR goes.
        b.upsert_service(&svc("a", "b", "10.96.0.20", &[]));
        b.publish(true);
        b.upsert_service(&svc("a", "b", "10.96.0.21", &[]));
        let s6 = b.publish(true);
        assert_eq!(
            ask(&s6, "20.0.96.10.in-addr.arpa", TYPE_PTR).rcode(),
            NXDOMAIN
        );
        assert_eq!(
            ask(&s6, "21.0.96.10.in-addr.arpa", TYPE_PTR).answers.len(),
            1
        );
        assert!(!b.has_changes());
    }

    #[test]
    fn endpoints_of_cluster_ip_services_are_not_kept() {
        let mut b = Builder::new(ZoneConfig::default());
        b.upsert_service(&svc("x", "s", "10.96.0.30", &[]));
        b.upsert_slice(&slice("x", "s-1", "s", &[("10.244.0.9", None, true)], &[]));
        let s1 = b.publish(true);
        assert_eq!(ask(&s1, "s.x.svc.cluster.local", TYPE_A).answers.len(), 1);
        assert!(!b.take_relist());
        // Now headless: the endpoints were not kept, so the caller relists.
        b.upsert_service(&svc("x", "s", "None", &[]));
        assert!(b.take_relist());
        assert!(!b.take_relist());
        // The relist: clear, Services first, then slices.
        b.clear_objects();
        b.upsert_service(&svc("x", "s", "None", &[]));
        b.upsert_slice(&slice("x", "s-1", "s", &[("10.244.0.9", None, true)], &[]));
        let s2 = b.publish(true);
        let m = ask(&s2, "s.x.svc.cluster.local", TYPE_A);
        assert_eq!(m.answers[0].rdata, RData::A("10.244.0.9".parse().unwrap()));
        // Deleted as ClusterIP and recreated headless: relist too.
        b.upsert_service(&svc("x", "t", "10.96.0.31", &[]));
        b.delete_service("x", "t");
        b.upsert_service(&svc("x", "t", "None", &[]));
        assert!(b.take_relist());
        // A slice seen before its Service keeps its endpoints.
        b.upsert_slice(&slice("x", "h-1", "h", &[("10.244.0.8", None, true)], &[]));
        b.upsert_service(&svc("x", "h", "None", &[]));
        assert!(!b.take_relist());
        let s3 = b.publish(true);
        assert_eq!(ask(&s3, "h.x.svc.cluster.local", TYPE_A).answers.len(), 1);
    }

    #[test]
    fn custom_zone_and_ttl() {
        let mut b = Builder::new(ZoneConfig {
            zone: "Corp.Example".into(),
            ttl: 30,
            ..Default::default()
        });
        b.upsert_service(&svc("x", "y", "10.96.0.9", &[]));
        let s = b.publish(true);
        let m = ask(&s, "y.x.svc.corp.example", TYPE_A);
        assert_eq!(m.answers[0].ttl, 30);
        assert!(s.answer("y.x.svc.cluster.local", TYPE_A).is_none());
    }
}
