//! A LoadBalancer Service's status as LB IPAM writes it, pure: the
//! ingress addresses, and (in Kubernetes mode) the condition that says
//! podnet gave them, or why it gave none.
//!
//! In Kubernetes mode no reservation records who handed out an address
//! (the elected controller is the only writer), so the Service carries
//! it: the condition [`CONDITION`] in `status.conditions`, True with the
//! addresses, False with the reason a Service waits (what a user reads in
//! `kubectl get svc -o yaml`). An address in a Service's status that is
//! in no pool and not listed by a True condition is another load
//! balancer's or an operator's, and left alone; one listed is podnet's,
//! taken back when its pool goes.

use std::net::IpAddr;

use podnet_api::k8s_openapi::api::core::v1::{LoadBalancerIngress, Service, ServiceStatus};
use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use podnet_api::k8s_openapi::jiff::Timestamp;

use super::{request, status_ips, Decision, Scope};

/// The condition podnet's LB IPAM keeps on the Services it serves.
pub const CONDITION: &str = "podnet.io/LoadBalancerAddress";

/// Whether LB IPAM has anything to do with a Service: a LoadBalancer
/// podnet may serve, or any Service still showing addresses.
pub fn concerns(s: &Service) -> bool {
    request::scope(s) != Scope::NotLoadBalancer || !status_ips(s).is_empty()
}

/// `svc` with exactly `ips` as its load-balancer ingress.
pub fn with_ingress(svc: &Service, ips: &[IpAddr]) -> Service {
    let mut new = svc.clone();
    let lb = new
        .status
        .get_or_insert_with(Default::default)
        .load_balancer
        .get_or_insert_with(Default::default);
    lb.ingress = (!ips.is_empty()).then(|| {
        ips.iter()
            .map(|ip| LoadBalancerIngress {
                ip: Some(ip.to_string()),
                ..Default::default()
            })
            .collect()
    });
    new
}

/// podnet's condition on `svc`, if it has one.
pub fn condition(svc: &Service) -> Option<&Condition> {
    let conds = svc.status.as_ref()?.conditions.as_ref()?;
    conds.iter().find(|c| c.type_ == CONDITION)
}

/// The status `svc` should have after decision `d` (`pooled`: whether an
/// address is in some pool); None when it already has it or is not
/// podnet's to touch. `now` stamps a condition whose status changes.
pub fn desired(
    svc: &Service,
    d: &Decision,
    pooled: impl Fn(IpAddr) -> bool,
    now: Timestamp,
) -> Option<ServiceStatus> {
    let shown = status_ips(svc);
    let given = given_by_podnet(svc);
    let marked = condition(svc).is_some();
    let ours = shown.iter().any(|ip| pooled(*ip) || given.contains(ip));
    let (ips, cond): (Vec<IpAddr>, Option<(&str, &str, String)>) = match d {
        _ if !shown.is_empty() && !ours => return None,
        Decision::Assigned(ips) => (ips.clone(), Some(("True", "Assigned", list(ips)))),
        Decision::Pending(why) => (Vec::new(), Some(("False", "NoAddress", why.clone()))),
        Decision::NotLoadBalancer | Decision::OtherClass(_) if ours || marked => (Vec::new(), None),
        Decision::NotLoadBalancer | Decision::OtherClass(_) => return None,
    };
    let mut new = with_ingress(svc, &ips).status.unwrap_or_default();
    set_condition(&mut new, cond, svc.metadata.generation, now);
    (svc.status.as_ref() != Some(&new)).then_some(new)
}

/// The addresses podnet's condition says it gave (True, its message the
/// list); none when it is False or absent. Only these and pooled ones are
/// podnet's to take back: a False condition left on a Service whose
/// status someone else then filled (a merge patch keeps conditions)
/// claims nothing.
fn given_by_podnet(svc: &Service) -> Vec<IpAddr> {
    match condition(svc) {
        Some(c) if c.status == "True" => c
            .message
            .split(',')
            .filter_map(|s| s.parse().ok())
            .collect(),
        _ => Vec::new(),
    }
}

fn list(ips: &[IpAddr]) -> String {
    let v: Vec<String> = ips.iter().map(|ip| ip.to_string()).collect();
    v.join(",")
}

/// Puts podnet's condition as `c` (status, reason, message), or removes
/// it; the transition time moves only when the status does.
fn set_condition(
    st: &mut ServiceStatus,
    c: Option<(&str, &str, String)>,
    generation: Option<i64>,
    now: Timestamp,
) {
    let mut conds = st.conditions.take().unwrap_or_default();
    let old = conds.iter().position(|x| x.type_ == CONDITION);
    let old = old.map(|i| conds.remove(i));
    if let Some((status, reason, message)) = c {
        let since = match &old {
            Some(o) if o.status == status => o.last_transition_time.clone(),
            _ => Time(now),
        };
        conds.push(Condition {
            type_: CONDITION.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            last_transition_time: since,
            observed_generation: generation,
        });
    }
    st.conditions = (!conds.is_empty()).then_some(conds);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn in_pool(ip: IpAddr) -> bool {
        ip.to_string().starts_with("198.51.100.")
    }

    #[test]
    fn ingress_is_written_and_cleared() {
        let s = svc(json!({"metadata": {"name": "w"},
            "spec": {"type": "LoadBalancer"},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.9", "hostname": "x"}]}}}));
        let ips = vec![ip("192.0.2.1"), ip("2001:db8::1")];
        let n = with_ingress(&s, &ips);
        assert_eq!(status_ips(&n), ips);
        assert_eq!(
            serde_json::to_value(&n.status).unwrap(),
            json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}, {"ip": "2001:db8::1"}]}})
        );
        let cleared = with_ingress(&n, &[]);
        assert_eq!(
            serde_json::to_value(&cleared.status).unwrap(),
            json!({"loadBalancer": {}})
        );
        assert!(concerns(&cleared), "a LoadBalancer concerns the duty");
        let mut plain = cleared.clone();
        plain.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        assert!(!concerns(&plain));
        assert!(
            concerns(&with_ingress(&plain, &ips)),
            "its stale ingress does"
        );
    }

    /// Assigned, then pending, then not a LoadBalancer: the condition says
    /// each, its time moves only with its status, and a second pass with
    /// the status written wants nothing.
    #[test]
    fn the_condition_follows_the_decision() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: Timestamp = "2026-01-02T00:00:00Z".parse().unwrap();
        let mut s = svc(
            json!({"metadata": {"name": "w", "namespace": "default", "generation": 3},
            "spec": {"type": "LoadBalancer"}}),
        );
        let d = Decision::Assigned(vec![ip("198.51.100.1")]);
        s.status = desired(&s, &d, in_pool, t0);
        let c = condition(&s).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Assigned"));
        assert_eq!(c.message, "198.51.100.1");
        assert_eq!(c.observed_generation, Some(3));
        assert_eq!(status_ips(&s), vec![ip("198.51.100.1")]);
        assert_eq!(desired(&s, &d, in_pool, t1), None, "written once");
        let moved = Decision::Assigned(vec![ip("198.51.100.2")]);
        s.status = desired(&s, &moved, in_pool, t1);
        assert_eq!(
            condition(&s).unwrap().last_transition_time,
            Time(t0),
            "still True"
        );
        let why = Decision::Pending("no pool serves it".into());
        s.status = desired(&s, &why, in_pool, t1);
        let c = condition(&s).unwrap();
        assert_eq!(
            (c.status.as_str(), c.message.as_str()),
            ("False", "no pool serves it")
        );
        assert_eq!(c.last_transition_time, Time(t1));
        assert!(status_ips(&s).is_empty());
        s.status = desired(&s, &Decision::NotLoadBalancer, in_pool, t1);
        assert!(condition(&s).is_none(), "{:?}", s.status);
        assert_eq!(desired(&s, &Decision::NotLoadBalancer, in_pool, t1), None);
    }

    /// An address outside every pool on a Service without podnet's
    /// condition is someone else's; with the condition it is podnet's and
    /// goes when the decision says so (its pool was deleted).
    #[test]
    fn only_podnets_addresses_are_taken_back() {
        let t: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let foreign = svc(
            json!({"metadata": {"name": "w"}, "spec": {"type": "LoadBalancer"},
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}}),
        );
        let why = Decision::Pending("no pool".into());
        assert_eq!(desired(&foreign, &why, in_pool, t), None);
        let other = Decision::OtherClass("x".into());
        assert_eq!(desired(&foreign, &other, in_pool, t), None);
        let mut ours = foreign.clone();
        let st = ours.status.as_mut().unwrap();
        st.conditions = Some(vec![Condition {
            type_: CONDITION.into(),
            status: "True".into(),
            reason: "Assigned".into(),
            message: "203.0.113.7".into(),
            last_transition_time: Time(t),
            observed_generation: None,
        }]);
        let st = desired(&ours, &why, in_pool, t).expect("taken back");
        assert!(st.load_balancer.unwrap().ingress.is_none());
        // podnet said it had none to give (False), then an operator
        // merge-patched an address in: the condition stays, the address is
        // not podnet's.
        let mut patched = svc(json!({"metadata": {"name": "w"}, "spec": {"type": "LoadBalancer"}}));
        patched.status = desired(&patched, &why, in_pool, t);
        assert_eq!(condition(&patched).unwrap().status, "False");
        patched.status.as_mut().unwrap().load_balancer =
            foreign.status.clone().unwrap().load_balancer;
        assert_eq!(
            desired(&patched, &why, in_pool, t),
            None,
            "the operator's address stays"
        );
    }
}
