//! The records a Service contributes (spec sections 2.3 and 2.4): A/AAAA,
//! PTR and SRV for a ClusterIP Service, per-endpoint names for a headless
//! one, a CNAME for an ExternalName one. Pure derivation from what
//! [`super::objects`] keeps; the builder decides when to re-derive.

use std::collections::HashSet;
use std::net::IpAddr;

use super::names::{dashed, prepend};
use super::objects::{NamedPort, SliceInfo, SvcInfo, SvcKind};
use crate::wire::{self, RData};

/// One record a Service (or the zone itself) contributes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Rec {
    pub(super) rtype: u16,
    pub(super) rdata: RData,
}

/// Records at owner names, as a Service contributes them.
pub(super) type Named = Vec<(Vec<u8>, Rec)>;

/// The A or AAAA record for `ip`.
pub(super) fn a_rec(ip: IpAddr) -> Rec {
    match ip {
        IpAddr::V4(v4) => Rec {
            rtype: wire::TYPE_A,
            rdata: RData::A(v4),
        },
        IpAddr::V6(v6) => Rec {
            rtype: wire::TYPE_AAAA,
            rdata: RData::Aaaa(v6),
        },
    }
}

fn ptr_rec(target: &[u8]) -> Rec {
    Rec {
        rtype: wire::TYPE_PTR,
        rdata: RData::Name(target.to_vec()),
    }
}

/// The records a Service contributes, by name, sorted and deduplicated.
/// `base` is the Service's name (`<svc>.<ns>.svc.<zone>`); `slices` are
/// its EndpointSlices, read only when it is headless.
pub(super) fn service_records<'a>(
    svc: &SvcInfo,
    base: &[u8],
    slices: impl Iterator<Item = &'a SliceInfo>,
) -> Named {
    let mut out = Vec::new();
    match &svc.kind {
        SvcKind::Pending => {}
        SvcKind::ExternalName(target) => out.push((
            base.to_vec(),
            Rec {
                rtype: wire::TYPE_CNAME,
                rdata: RData::Name(target.clone()),
            },
        )),
        SvcKind::ClusterIp(ips) => cluster_ip_records(ips, &svc.ports, base, &mut out),
        SvcKind::Headless => headless_records(svc, base, slices, &mut out),
    }
    out.sort();
    out.dedup();
    out
}

/// A ClusterIP Service: its addresses at its name, a PTR back from each,
/// and an SRV record per port pointing at the name.
fn cluster_ip_records(ips: &[IpAddr], ports: &[NamedPort], base: &[u8], out: &mut Named) {
    for ip in ips {
        out.push((base.to_vec(), a_rec(*ip)));
        out.push((wire::reverse_name(*ip), ptr_rec(base)));
    }
    for p in ports {
        srv_records(p, base, base, out);
    }
}

/// A headless Service: every published endpoint's address at the Service
/// name and at its own name (its hostname, else its dashed address), a
/// PTR back to its own name, and an SRV record per port pointing at it.
fn headless_records<'a>(
    svc: &SvcInfo,
    base: &[u8],
    slices: impl Iterator<Item = &'a SliceInfo>,
    out: &mut Named,
) {
    let mut seen = HashSet::new();
    for slice in slices {
        for ep in slice.endpoints.iter() {
            if !svc.publishes(ep) {
                continue;
            }
            let ip = ep.addr;
            let host = ep
                .hostname
                .as_deref()
                .map(String::from)
                .unwrap_or_else(|| dashed(ip));
            if !seen.insert((host.clone(), ip)) {
                continue;
            }
            let Some(hname) = prepend(&host, base) else {
                continue;
            };
            out.push((base.to_vec(), a_rec(ip)));
            out.push((hname.clone(), a_rec(ip)));
            out.push((wire::reverse_name(ip), ptr_rec(&hname)));
            for p in slice.ports.iter() {
                srv_records(p, base, &hname, out);
            }
        }
    }
}

/// A port's SRV record pointing at `target`: at `_<port>._<proto>.<base>`
/// when the port is named, and at the Service name `base` in any case.
fn srv_records((pname, proto, port): &NamedPort, base: &[u8], target: &[u8], out: &mut Named) {
    let srv = Rec {
        rtype: wire::TYPE_SRV,
        rdata: RData::Srv {
            priority: 0,
            weight: 100,
            port: *port,
            target: target.to_vec(),
        },
    };
    if let Some(name) = srv_name(pname, proto, base) {
        out.push((name, srv.clone()));
    }
    out.push((base.to_vec(), srv));
}

/// `_<port>._<proto>.<base>`. An unnamed port has no such name (spec
/// 2.3.2), only its SRV record at the Service name.
fn srv_name(port: &str, proto: &str, base: &[u8]) -> Option<Vec<u8>> {
    if port.is_empty() {
        return None;
    }
    prepend(&format!("_{port}"), &prepend(&format!("_{proto}"), base)?)
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::super::{Builder, ZoneConfig};
    use crate::wire::*;

    /// A dual-stack Service: A and AAAA at its name, a PTR back from
    /// each address (`ip6.arpa` for the IPv6 one), NXDOMAIN for a free
    /// address of the IPv6 Service CIDR.
    #[test]
    fn dual_stack_service_has_both_families() {
        let mut cfg = ZoneConfig::default();
        cfg.reverse.push("fd00:10:96::/112".parse().unwrap());
        let mut b = Builder::new(cfg);
        b.upsert_namespace("shop");
        let mut web = svc("shop", "web", "10.96.5.5", &[("http", 80, "TCP")]);
        let spec = web.spec.as_mut().unwrap();
        spec.cluster_ips = Some(vec!["10.96.5.5".into(), "fd00:10:96::5".into()]);
        spec.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
        b.upsert_service(&web);
        let s = b.publish(true);
        let m = ask(&s, "web.shop.svc.cluster.local", TYPE_A);
        assert_eq!(m.answers.len(), 1);
        assert_eq!(m.answers[0].rdata, RData::A("10.96.5.5".parse().unwrap()));
        let m = ask(&s, "web.shop.svc.cluster.local", TYPE_AAAA);
        assert_eq!(m.answers.len(), 1);
        assert_eq!(
            m.answers[0].rdata,
            RData::Aaaa("fd00:10:96::5".parse().unwrap())
        );
        let v6 = name_to_string(&reverse_name("fd00:10:96::5".parse().unwrap()));
        assert!(v6.ends_with(".ip6.arpa."), "{v6}");
        let m = ask(&s, &v6, TYPE_PTR);
        assert_eq!(
            m.answers[0].rdata,
            RData::Name(name_from_str("web.shop.svc.cluster.local").unwrap())
        );
        let free = name_to_string(&reverse_name("fd00:10:96::6".parse().unwrap()));
        assert_eq!(ask(&s, &free, TYPE_PTR).rcode(), NXDOMAIN);
    }

    #[test]
    fn cluster_ip_a_srv_ptr() {
        let s = fixture().publish(true);
        let m = ask(&s, "web.shop.svc.cluster.local", TYPE_A);
        assert_eq!(m.rcode(), NOERROR);
        assert_eq!(m.answers.len(), 1);
        assert_eq!(m.answers[0].rdata, RData::A("10.96.5.5".parse().unwrap()));
        // Case-insensitive; the question's case is echoed.
        let m = ask(&s, "WEB.Shop.SVC.cluster.LOCAL", TYPE_A);
        assert_eq!(m.answers.len(), 1);
        // AAAA on a v4 Service: NODATA with SOA whose TTL is the negative TTL.
        let m = ask(&s, "web.shop.svc.cluster.local", TYPE_AAAA);
        assert_eq!(m.rcode(), NOERROR);
        assert!(m.answers.is_empty());
        assert_eq!(name_to_string(&m.authority[0].name), "cluster.local.");
        match &m.authority[0].rdata {
            RData::Soa { minimum, .. } => assert_eq!(*minimum, 5),
            r => panic!("{r:?}"),
        }
        // SRV for named ports, with the A in additional.
        let m = ask(&s, "_http._tcp.web.shop.svc.cluster.local", TYPE_SRV);
        assert_eq!(m.rcode(), NOERROR);
        assert_eq!(
            m.answers[0].rdata,
            RData::Srv {
                priority: 0,
                weight: 100,
                port: 80,
                target: name_from_str("web.shop.svc.cluster.local").unwrap()
            }
        );
        assert_eq!(
            m.additional[0].rdata,
            RData::A("10.96.5.5".parse().unwrap())
        );
        let m = ask(&s, "_dns._udp.web.shop.svc.cluster.local", TYPE_SRV);
        assert_eq!(m.answers.len(), 1);
        // SRV on the Service name itself: every port, named or not (an
        // extension of the spec, as CoreDNS answers it), the A in
        // additional. The unnamed port has no `_<port>._<proto>` name.
        let m = ask(&s, "web.shop.svc.cluster.local", TYPE_SRV);
        assert_eq!(m.rcode(), NOERROR);
        let mut ports: Vec<u16> = m
            .answers
            .iter()
            .map(|r| match &r.rdata {
                RData::Srv {
                    port,
                    weight,
                    target,
                    ..
                } => {
                    assert_eq!(*weight, 33);
                    assert_eq!(name_to_string(target), "web.shop.svc.cluster.local.");
                    *port
                }
                r => panic!("{r:?}"),
            })
            .collect();
        ports.sort();
        assert_eq!(ports, vec![53, 80, 81]);
        assert_eq!(
            m.additional[0].rdata,
            RData::A("10.96.5.5".parse().unwrap())
        );
        let m = ask(&s, "_._tcp.web.shop.svc.cluster.local", TYPE_SRV);
        assert_eq!(m.rcode(), NXDOMAIN);
        // Wrong protocol: NXDOMAIN; the protocol label alone: NODATA.
        let m = ask(&s, "_dns._tcp.web.shop.svc.cluster.local", TYPE_SRV);
        assert_eq!(m.rcode(), NXDOMAIN);
        let m = ask(&s, "_tcp.web.shop.svc.cluster.local", TYPE_SRV);
        assert_eq!(m.rcode(), NOERROR);
        assert!(m.answers.is_empty());
        // PTR.
        let m = ask(&s, "5.5.96.10.in-addr.arpa", TYPE_PTR);
        assert_eq!(m.rcode(), NOERROR);
        assert_eq!(
            m.answers[0].rdata,
            RData::Name(name_from_str("web.shop.svc.cluster.local").unwrap())
        );
        // A missing address in the service CIDR: NXDOMAIN from us, with the
        // reverse zone's SOA.
        let m = ask(&s, "9.9.96.10.in-addr.arpa", TYPE_PTR);
        assert_eq!(m.rcode(), NXDOMAIN);
        assert_eq!(name_to_string(&m.authority[0].name), "10.in-addr.arpa.");
        // Outside our networks: forwarded.
        assert!(s.answer("1.1.168.192.in-addr.arpa", TYPE_PTR).is_none());
        // A pending Service (no ClusterIP yet) does not exist.
        let m = ask(&s, "pending.shop.svc.cluster.local", TYPE_A);
        assert_eq!(m.rcode(), NXDOMAIN);
    }

    #[test]
    fn headless() {
        let s = fixture().publish(true);
        let m = ask(&s, "db.shop.svc.cluster.local", TYPE_A);
        let mut ips: Vec<_> = m.answers.iter().map(|r| r.rdata.clone()).collect();
        ips.sort();
        assert_eq!(
            ips,
            vec![
                RData::A("10.244.1.5".parse().unwrap()),
                RData::A("10.244.2.6".parse().unwrap())
            ],
            "only ready endpoints"
        );
        let m = ask(&s, "db-0.db.shop.svc.cluster.local", TYPE_A);
        assert_eq!(m.answers[0].rdata, RData::A("10.244.1.5".parse().unwrap()));
        // No hostname: the dashed IP stands in.
        let m = ask(&s, "10-244-2-6.db.shop.svc.cluster.local", TYPE_A);
        assert_eq!(m.answers.len(), 1);
        // Not ready: absent.
        let m = ask(&s, "db-2.db.shop.svc.cluster.local", TYPE_A);
        assert_eq!(m.rcode(), NXDOMAIN);
        let m = ask(&s, "_pg._tcp.db.shop.svc.cluster.local", TYPE_SRV);
        assert_eq!(m.answers.len(), 2);
        let mut targets = names(&m.additional);
        targets.sort();
        assert_eq!(
            targets,
            vec![
                "10-244-2-6.db.shop.svc.cluster.local.",
                "db-0.db.shop.svc.cluster.local."
            ]
        );
        for a in &m.answers {
            let RData::Srv { port, weight, .. } = a.rdata else {
                panic!()
            };
            assert_eq!((port, weight), (5432, 50));
        }
        // SRV on the headless Service name: one per ready endpoint and port.
        let m = ask(&s, "db.shop.svc.cluster.local", TYPE_SRV);
        assert_eq!(m.answers.len(), 2);
        assert_eq!(m.additional.len(), 2);
        let m = ask(&s, "5.1.244.10.in-addr.arpa", TYPE_PTR);
        assert_eq!(
            m.answers[0].rdata,
            RData::Name(name_from_str("db-0.db.shop.svc.cluster.local").unwrap())
        );
        // Headless without ready endpoints: NXDOMAIN (spec 2.4.1).
        let m = ask(&s, "nobody.shop.svc.cluster.local", TYPE_A);
        assert_eq!(m.rcode(), NXDOMAIN);
        // A missing pod IP in the cluster CIDR: NXDOMAIN.
        let m = ask(&s, "9.9.244.10.in-addr.arpa", TYPE_PTR);
        assert_eq!(m.rcode(), NXDOMAIN);
    }
}
