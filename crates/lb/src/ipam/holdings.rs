//! Who holds which load-balancer address: the allocations already made
//! (from Services' status, and reservations whose Service the caller does
//! not know yet), and whether a Service may take an address given its
//! other holders.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::request::Sharing;
use super::ServiceKey;

/// One holder of an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub service: ServiceKey,
    /// How it shares the address; `None`: it does not (also for a holder
    /// known only by a reservation, whose ports are unknown).
    pub sharing: Option<Sharing>,
}

#[derive(Debug, Clone, Default)]
pub struct Holdings {
    by_ip: BTreeMap<IpAddr, Vec<Holder>>,
    by_service: BTreeMap<ServiceKey, BTreeSet<IpAddr>>,
}

impl Holdings {
    /// Records that `h` holds `ip` (again: its sharing is updated).
    pub fn hold(&mut self, ip: IpAddr, h: Holder) {
        self.by_service
            .entry(h.service.clone())
            .or_default()
            .insert(ip);
        let hs = self.by_ip.entry(ip).or_default();
        match hs.iter_mut().find(|o| o.service == h.service) {
            Some(o) => *o = h,
            None => hs.push(h),
        }
    }

    /// Forgets everything `svc` holds; returns what it held.
    pub fn release(&mut self, svc: &ServiceKey) -> BTreeSet<IpAddr> {
        let ips = self.by_service.remove(svc).unwrap_or_default();
        for ip in &ips {
            if let Some(hs) = self.by_ip.get_mut(ip) {
                hs.retain(|h| &h.service != svc);
                if hs.is_empty() {
                    self.by_ip.remove(ip);
                }
            }
        }
        ips
    }

    /// The addresses `svc` holds.
    pub fn of(&self, svc: &ServiceKey) -> impl Iterator<Item = IpAddr> + '_ {
        self.by_service.get(svc).into_iter().flatten().copied()
    }

    /// The holders of `ip` other than `me`.
    pub fn others<'a>(
        &'a self,
        ip: IpAddr,
        me: &'a ServiceKey,
    ) -> impl Iterator<Item = &'a Holder> + 'a {
        self.by_ip
            .get(&ip)
            .into_iter()
            .flatten()
            .filter(move |h| &h.service != me)
    }

    /// Whether `me` may hold `ip` beside its other holders: there are none,
    /// or `me` shares and every one of them shares compatibly. The error
    /// names a holder in the way ("Service shop/web") if it is in `me`'s
    /// namespace.
    pub fn usable_by(
        &self,
        ip: IpAddr,
        me: &ServiceKey,
        sharing: Option<&Sharing>,
    ) -> Result<(), String> {
        for h in self.others(ip, me) {
            let ok = matches!((sharing, &h.sharing), (Some(a), Some(b)) if a.compatible(b));
            // The reason reaches the Service's status, which its own
            // namespace reads: another namespace's Service is not named.
            if !ok && h.service.0 == me.0 {
                return Err(format!("Service {}/{}", h.service.0, h.service.1));
            }
            if !ok {
                return Err("a Service in another namespace".into());
            }
        }
        Ok(())
    }

    /// Whether nobody but `me` holds `ip`.
    pub fn free_for(&self, ip: IpAddr, me: &ServiceKey) -> bool {
        self.others(ip, me).next().is_none()
    }

    /// Addresses held under sharing key `key`, lowest first.
    pub fn shared_under<'a>(&'a self, key: &'a str) -> impl Iterator<Item = IpAddr> + 'a {
        self.by_ip
            .iter()
            .filter(move |(_, hs)| {
                hs.iter()
                    .any(|h| h.sharing.as_ref().is_some_and(|s| s.key == key))
            })
            .map(|(ip, _)| *ip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: &str) -> ServiceKey {
        ("shop".into(), n.into())
    }

    fn sharing(k: &str, port: i32) -> Option<Sharing> {
        Some(Sharing {
            key: k.into(),
            ports: [(port, "TCP".to_string())].into(),
            local: false,
            selector: Default::default(),
        })
    }

    #[test]
    fn holding_releasing_and_sharing() {
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let mut h = Holdings::default();
        h.hold(
            ip,
            Holder {
                service: key("a"),
                sharing: sharing("k", 80),
            },
        );
        assert!(h.free_for(ip, &key("a")));
        assert!(!h.free_for(ip, &key("b")));
        assert_eq!(
            h.usable_by(ip, &key("b"), None),
            Err("Service shop/a".into())
        );
        assert_eq!(
            h.usable_by(ip, &key("b"), sharing("k", 80).as_ref()),
            Err("Service shop/a".into())
        );
        assert_eq!(
            h.usable_by(ip, &key("b"), sharing("k", 81).as_ref()),
            Ok(())
        );
        // A Service of another namespace learns no name from the refusal.
        let elsewhere: ServiceKey = ("dev".into(), "b".into());
        assert_eq!(
            h.usable_by(ip, &elsewhere, None),
            Err("a Service in another namespace".into())
        );
        h.hold(
            ip,
            Holder {
                service: key("b"),
                sharing: sharing("k", 81),
            },
        );
        assert_eq!(h.shared_under("k").collect::<Vec<_>>(), [ip]);
        assert_eq!(h.release(&key("a")), BTreeSet::from([ip]));
        assert_eq!(h.others(ip, &key("x")).count(), 1);
        h.release(&key("b"));
        assert!(h.free_for(ip, &key("x")));
        assert_eq!(h.of(&key("b")).count(), 0);
        // A holder known by its reservation only never shares.
        h.hold(
            ip,
            Holder {
                service: key("c"),
                sharing: None,
            },
        );
        assert!(h
            .usable_by(ip, &key("d"), sharing("k", 1).as_ref())
            .is_err());
    }
}
