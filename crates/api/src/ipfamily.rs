//! A Service's address families: `clusterIPs`, `ipFamilies` and
//! `ipFamilyPolicy`, normalized, defaulted and checked as kube-apiserver
//! does it on create and update (its `normalizeClusterIPs`,
//! `patchAllocatedValues`, `ValidateServiceClusterIPsRelatedFields`,
//! `initIPFamilyFields` and the upgrade/downgrade checks), so a manifest
//! means the same in standalone mode as in a real cluster. Checked against
//! the real apiserver by `podnet/tests/differential_kcm.rs`.
//!
//! What is decided here is which families a Service gets, not which
//! addresses: the controller allocates a ClusterIP for every family in
//! `ipFamilies` that `clusterIPs` does not cover yet ([`missing`]). The
//! cluster's side comes in as [`ServiceCidrs`] (kube-apiserver's
//! `--service-cluster-ip-range`, one CIDR per family, the first primary).
//! Pure.

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::ServiceSpec;

use crate::FieldError;

pub const IPV4: &str = "IPv4";
pub const IPV6: &str = "IPv6";
pub const SINGLE_STACK: &str = "SingleStack";
pub const PREFER_DUAL_STACK: &str = "PreferDualStack";
pub const REQUIRE_DUAL_STACK: &str = "RequireDualStack";

/// The cluster's Service CIDRs: the primary (whose family a single-stack
/// Service gets by default) and, on a dual-stack cluster, one of the
/// other family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceCidrs {
    pub primary: IpNet,
    pub secondary: Option<IpNet>,
}

impl ServiceCidrs {
    pub fn single(primary: IpNet) -> ServiceCidrs {
        ServiceCidrs {
            primary,
            secondary: None,
        }
    }

    /// The CIDR of `family` ("IPv4" or "IPv6"), if the cluster has one.
    pub fn of_family(&self, family: &str) -> Option<IpNet> {
        self.all().find(|c| net_family(c) == family)
    }

    /// The CIDR an address's family allocates from, if configured.
    pub fn for_ip(&self, ip: &IpAddr) -> Option<IpNet> {
        self.of_family(ip_family(ip))
    }

    pub fn primary_family(&self) -> &'static str {
        net_family(&self.primary)
    }

    pub fn is_dual(&self) -> bool {
        self.secondary.is_some()
    }

    pub fn all(&self) -> impl Iterator<Item = IpNet> {
        std::iter::once(self.primary).chain(self.secondary)
    }
}

pub fn ip_family(ip: &IpAddr) -> &'static str {
    match ip {
        IpAddr::V4(_) => IPV4,
        IpAddr::V6(_) => IPV6,
    }
}

fn net_family(n: &IpNet) -> &'static str {
    ip_family(&n.addr())
}

fn other(family: &str) -> &'static str {
    if family == IPV4 {
        IPV6
    } else {
        IPV4
    }
}

fn err(field: impl Into<String>, msg: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        msg: msg.into(),
    }
}

fn is_external_name(spec: &ServiceSpec) -> bool {
    spec.type_.as_deref() == Some("ExternalName")
}

fn is_headless(spec: &ServiceSpec) -> bool {
    spec.cluster_ip.as_deref() == Some("None")
}

fn selectorless(spec: &ServiceSpec) -> bool {
    spec.selector.as_ref().is_none_or(|s| s.is_empty())
}

fn ips(spec: &ServiceSpec) -> &[String] {
    spec.cluster_ips.as_deref().unwrap_or_default()
}

fn families(spec: &ServiceSpec) -> &[String] {
    spec.ip_families.as_deref().unwrap_or_default()
}

fn policy(spec: &ServiceSpec) -> &str {
    spec.ip_family_policy.as_deref().unwrap_or(SINGLE_STACK)
}

/// On create, a client that sets only `clusterIP` (an old one) gets
/// `clusterIPs` from it; one that sets `clusterIPs` must set both.
pub fn normalize_create(spec: &mut ServiceSpec) {
    let cip = spec.cluster_ip.clone().unwrap_or_default();
    if !cip.is_empty() && ips(spec).is_empty() {
        spec.cluster_ips = Some(vec![cip]);
    }
}

/// On update, what the server allocated and the new document leaves out
/// is kept (a re-applied manifest without addresses keeps its addresses),
/// as are the policy the Service had (a document without one does not
/// turn a dual-stack Service single-stack) and, for a Service that keeps
/// its ClusterIP, its secondary one.
pub fn carry_over(new: &mut ServiceSpec, old: &ServiceSpec) {
    let needs_ip = |s: &ServiceSpec| !is_external_name(s);
    if needs_ip(old) && needs_ip(new) {
        if new.cluster_ip.as_deref().unwrap_or_default().is_empty() {
            new.cluster_ip = old.cluster_ip.clone();
        }
        if ips(new).is_empty() && !ips(old).is_empty() && new.cluster_ip == old.cluster_ip {
            new.cluster_ips = old.cluster_ips.clone();
        }
        if new.ip_family_policy.is_none() {
            new.ip_family_policy = old.ip_family_policy.clone();
        }
    }
}

/// The rules the fields obey on their own (after [`normalize_create`] or
/// [`carry_over`]): `clusterIPs[0]` is `clusterIP`; at most two, one per
/// family; `None` only alone; families known and not repeated, each
/// matching its address; the policy one of the three; nothing of it on an
/// ExternalName Service.
pub fn check_fields(spec: &ServiceSpec) -> Vec<FieldError> {
    let mut e = Vec::new();
    if is_external_name(spec) {
        if !ips(spec).is_empty() {
            e.push(err(
                "spec.clusterIPs",
                "may not be set for ExternalName services",
            ));
        }
        if !families(spec).is_empty() {
            e.push(err(
                "spec.ipFamilies",
                "may not be set for ExternalName services",
            ));
        }
        if spec.ip_family_policy.is_some() {
            e.push(err(
                "spec.ipFamilyPolicy",
                "may not be set for ExternalName services",
            ));
        }
        return e;
    }
    let cip = spec.cluster_ip.as_deref().unwrap_or_default();
    let list = ips(spec);
    if !cip.is_empty() && list.first().is_some_and(|f| f != cip) {
        e.push(err("spec.clusterIPs", "first value must match `clusterIP`"));
    } else if cip.is_empty() && !list.is_empty() {
        e.push(err(
            "spec.clusterIPs",
            "must be empty when `clusterIP` is not specified",
        ));
    }
    for (i, f) in families(spec).iter().enumerate() {
        if f != IPV4 && f != IPV6 {
            e.push(err(
                format!("spec.ipFamilies[{i}]"),
                format!("unsupported value {f:?}: supported values: \"IPv4\", \"IPv6\""),
            ));
        } else if families(spec)[..i].contains(f) {
            e.push(err(
                format!("spec.ipFamilies[{i}]"),
                format!("duplicate value {f:?}"),
            ));
        }
    }
    if let Some(p) = &spec.ip_family_policy {
        if ![SINGLE_STACK, PREFER_DUAL_STACK, REQUIRE_DUAL_STACK].contains(&p.as_str()) {
            e.push(err(
                "spec.ipFamilyPolicy",
                format!("unsupported value {p:?}: supported values: \"PreferDualStack\", \"RequireDualStack\", \"SingleStack\""),
            ));
        }
    }
    check_ip_list(&mut e, spec);
    e
}

/// `clusterIPs` itself: valid addresses, `None` only alone, at most two,
/// of different families, each of its `ipFamilies` entry's family.
fn check_ip_list(e: &mut Vec<FieldError>, spec: &ServiceSpec) {
    let list = ips(spec);
    let mut parsed = Vec::new();
    let mut bad = false;
    for (i, c) in list.iter().enumerate() {
        if i == 0 && c == "None" {
            if list.len() > 1 {
                bad = true;
                e.push(err(
                    "spec.clusterIPs",
                    "'None' must be the first and only value",
                ));
            }
            continue;
        }
        match c.parse::<IpAddr>() {
            Ok(ip) => parsed.push((i, ip)),
            Err(_) => {
                bad = true;
                e.push(err(
                    format!("spec.clusterIPs[{i}]"),
                    format!("{c:?} is not a valid IP address"),
                ));
            }
        }
    }
    if list.len() > 2 {
        e.push(err("spec.clusterIPs", "may only hold up to 2 values"));
    }
    if bad {
        return;
    }
    if list.len() == 2 && ip_family(&parsed[0].1) == ip_family(&parsed[1].1) {
        e.push(err(
            "spec.clusterIPs",
            "may specify no more than one IP for each IP family",
        ));
    }
    if is_headless(spec) {
        return;
    }
    for (i, ip) in parsed {
        if let Some(f) = families(spec).get(i) {
            if f != ip_family(&ip) {
                e.push(err(
                    format!("spec.clusterIPs[{i}]"),
                    format!("expected an {f} value as indicated by `ipFamilies[{i}]`"),
                ));
            }
        }
    }
}

/// Gives the Service its policy and families as kube-apiserver does, then
/// checks what needs the cluster's CIDRs or the stored Service (`old`, on
/// update). Without a policy a Service is `SingleStack`, except a
/// headless one without a selector (`RequireDualStack`: its endpoints are
/// someone else's, of any family). Families come from the given
/// addresses, then the primary; a policy other than `SingleStack` adds
/// the other family where the cluster has it (`RequireDualStack` demands
/// it). An empty list means `spec` is ready for allocation ([`missing`]).
pub fn init(
    spec: &mut ServiceSpec,
    old: Option<&ServiceSpec>,
    cidrs: &ServiceCidrs,
) -> Vec<FieldError> {
    if is_external_name(spec) || unchanged_prefer_dual(spec, old) {
        return Vec::new();
    }
    if spec.ip_family_policy.is_none() {
        let p = match is_headless(spec) && selectorless(spec) {
            true => REQUIRE_DUAL_STACK,
            false => SINGLE_STACK,
        };
        spec.ip_family_policy = Some(p.into());
    }
    let mut e = check_fields(spec);
    if !e.is_empty() {
        return e;
    }
    if let Some(old) = old {
        release_secondary(&mut e, spec, old);
    }
    if policy(spec) == SINGLE_STACK {
        for (len, what) in [
            (ips(spec).len(), "cluster IPs are"),
            (families(spec).len(), "IP families are"),
        ] {
            if len == 2 {
                e.push(err(
                    "spec.ipFamilyPolicy",
                    format!("must be 'RequireDualStack' or 'PreferDualStack' when multiple {what} specified"),
                ));
            }
        }
    }
    infer_families(&mut e, spec, cidrs);
    if !e.is_empty() {
        return e;
    }
    if is_headless(spec) && selectorless(spec) {
        // Its endpoints are someone else's: any family, on any cluster.
        complete_families(spec, cidrs.primary_family(), true);
        return e;
    }
    if policy(spec) == REQUIRE_DUAL_STACK && !cidrs.is_dual() {
        e.push(err(
            "spec.ipFamilyPolicy",
            "RequireDualStack: this cluster is not configured for dual-stack services",
        ));
    }
    for (i, f) in families(spec).iter().enumerate() {
        if cidrs.of_family(f).is_none() {
            e.push(err(
                format!("spec.ipFamilies[{i}]"),
                format!("{f} is not configured on this cluster"),
            ));
        }
    }
    if !e.is_empty() {
        return e;
    }
    complete_families(spec, cidrs.primary_family(), cidrs.is_dual());
    if let Some(old) = old {
        check_update(&mut e, spec, old);
    }
    e
}

/// No families given: the primary. A policy other than `SingleStack`
/// adds the other family when `add_other` (the cluster has it).
fn complete_families(spec: &mut ServiceSpec, primary: &str, add_other: bool) {
    let dual = add_other && policy(spec) != SINGLE_STACK;
    let fams = spec.ip_families.get_or_insert_with(Vec::new);
    if fams.is_empty() {
        fams.push(primary.into());
    }
    if dual && fams.len() == 1 {
        fams.push(other(&fams[0]).into());
    }
}

/// A `PreferDualStack` Service updated without touching its addresses or
/// families keeps them, whatever the cluster became since: the server
/// never adds or drops a family on its own.
fn unchanged_prefer_dual(spec: &ServiceSpec, old: Option<&ServiceSpec>) -> bool {
    let Some(old) = old else { return false };
    let ip_type = |s: &ServiceSpec| {
        matches!(
            s.type_.as_deref().unwrap_or("ClusterIP"),
            "ClusterIP" | "NodePort" | "LoadBalancer"
        )
    };
    spec.ip_family_policy.as_deref() == Some(PREFER_DUAL_STACK)
        && old.ip_family_policy.as_deref().unwrap_or(PREFER_DUAL_STACK) == PREFER_DUAL_STACK
        && spec.type_ == old.type_
        && ip_type(spec)
        && ips(spec) == ips(old)
        && families(spec) == families(old)
}

/// Releasing the secondary address or family takes `SingleStack`; with it,
/// an unchanged pair is cut to its primary.
fn release_secondary(e: &mut Vec<FieldError>, spec: &mut ServiceSpec, old: &ServiceSpec) {
    if policy(spec) == SINGLE_STACK {
        if ips(spec) == ips(old) && ips(spec).len() > 1 {
            spec.cluster_ips.as_mut().expect("two").truncate(1);
        }
        if families(spec) == families(old) && families(spec).len() > 1 {
            spec.ip_families.as_mut().expect("two").truncate(1);
        }
        return;
    }
    let reduced = |new: &[String], old: &[String]| !new.is_empty() && new.len() < old.len();
    for (r, what) in [
        (reduced(ips(spec), ips(old)), "cluster IP"),
        (reduced(families(spec), families(old)), "IP family"),
    ] {
        if r {
            e.push(err(
                "spec.ipFamilyPolicy",
                format!("must be 'SingleStack' to release the secondary {what}"),
            ));
        }
    }
}

/// A given address without its `ipFamilies` entry gives it, if the
/// cluster has that family.
fn infer_families(e: &mut Vec<FieldError>, spec: &mut ServiceSpec, cidrs: &ServiceCidrs) {
    let list = ips(spec).to_vec();
    for (i, c) in list.iter().enumerate() {
        let Ok(ip) = c.parse::<IpAddr>() else { break };
        let fam = ip_family(&ip);
        if i >= families(spec).len() {
            if cidrs.of_family(fam).is_none() {
                e.push(err(
                    format!("spec.clusterIPs[{i}]"),
                    format!("{fam} is not configured on this cluster"),
                ));
            } else {
                spec.ip_families
                    .get_or_insert_with(Vec::new)
                    .push(fam.into());
            }
        }
    }
}

/// What an update may change: the primary address and family never; the
/// secondary ones may be added, or dropped with `SingleStack`.
fn check_update(e: &mut Vec<FieldError>, spec: &ServiceSpec, old: &ServiceSpec) {
    if is_external_name(old) {
        return;
    }
    let (new_headless, old_headless) = (is_headless(spec), is_headless(old));
    if !(new_headless && old_headless) {
        changes(e, "clusterIPs", ips(spec), ips(old), policy(spec));
    }
    if new_headless == old_headless && !new_headless {
        changes(e, "ipFamilies", families(spec), families(old), policy(spec));
    }
}

fn changes(e: &mut Vec<FieldError>, what: &str, new: &[String], old: &[String], policy: &str) {
    let primary_changed = !new.is_empty() && !old.is_empty() && new[0] != old[0];
    if new.len() == old.len() {
        for (i, (n, o)) in new.iter().zip(old).enumerate() {
            if n != o {
                e.push(err(format!("spec.{what}[{i}]"), "may not change once set"));
            }
        }
        return;
    }
    if primary_changed {
        e.push(err(format!("spec.{what}[0]"), "may not change once set"));
    }
    if new.is_empty() {
        e.push(err(
            format!("spec.{what}[0]"),
            "the primary can not be unset",
        ));
    } else if new.len() < old.len() && new.len() == 1 && policy != SINGLE_STACK {
        e.push(err(
            "spec.ipFamilyPolicy",
            format!("must be set to 'SingleStack' when releasing the secondary of {what}"),
        ));
    }
}

/// The families of `spec.ipFamilies` still without a ClusterIP, in order
/// (what the controller allocates); none for ExternalName and headless
/// Services. A Service written without families (before admission gave
/// them) gets the primary family's address when it has none.
pub fn missing(spec: &ServiceSpec, cidrs: &ServiceCidrs) -> Vec<&'static str> {
    if is_external_name(spec) || is_headless(spec) {
        return Vec::new();
    }
    let have = ips(spec).len().max(usize::from(
        !spec.cluster_ip.as_deref().unwrap_or_default().is_empty(),
    ));
    let fams = families(spec);
    if fams.is_empty() {
        return match have {
            0 => vec![cidrs.primary_family()],
            _ => Vec::new(),
        };
    }
    fams.iter()
        .skip(have)
        .map(|f| if f == IPV6 { IPV6 } else { IPV4 })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn dual() -> ServiceCidrs {
        ServiceCidrs {
            primary: "10.96.0.0/12".parse().unwrap(),
            secondary: Some("fd00:10:96::/112".parse().unwrap()),
        }
    }

    fn single() -> ServiceCidrs {
        ServiceCidrs::single("10.96.0.0/12".parse().unwrap())
    }

    fn spec(v: Value) -> ServiceSpec {
        serde_json::from_value(v).unwrap()
    }

    /// A create through normalize + init: Ok((policy, families)) or the
    /// fields in error.
    fn create(v: Value, cidrs: &ServiceCidrs) -> Result<(String, Vec<String>), Vec<String>> {
        let mut s = spec(v);
        normalize_create(&mut s);
        let e = init(&mut s, None, cidrs);
        match e.is_empty() {
            true => Ok((
                s.ip_family_policy.unwrap_or_default(),
                s.ip_families.unwrap_or_default(),
            )),
            false => Err(e.into_iter().map(|e| e.field).collect()),
        }
    }

    fn ok(policy: &str, fams: &[&str]) -> Result<(String, Vec<String>), Vec<String>> {
        Ok((policy.into(), fams.iter().map(|f| f.to_string()).collect()))
    }

    /// kube-apiserver's defaults, on both kinds of cluster.
    #[test]
    fn creates_get_the_servers_families() {
        let p = json!([{"port": 80}]);
        let sel = json!({"a": "b"});
        for (cidrs, v, want) in [
            (
                dual(),
                json!({"ports": p, "selector": sel}),
                ok(SINGLE_STACK, &[IPV4]),
            ),
            (
                dual(),
                json!({"ports": p, "ipFamilyPolicy": "PreferDualStack"}),
                ok(PREFER_DUAL_STACK, &[IPV4, IPV6]),
            ),
            (
                single(),
                json!({"ports": p, "ipFamilyPolicy": "PreferDualStack"}),
                ok(PREFER_DUAL_STACK, &[IPV4]),
            ),
            (
                single(),
                json!({"ports": p, "ipFamilyPolicy": "RequireDualStack"}),
                Err(vec!["spec.ipFamilyPolicy".into()]),
            ),
            (
                dual(),
                json!({"ports": p, "ipFamilies": ["IPv6"], "ipFamilyPolicy": "PreferDualStack"}),
                ok(PREFER_DUAL_STACK, &[IPV6, IPV4]),
            ),
            (
                single(),
                json!({"ports": p, "ipFamilies": ["IPv6"]}),
                Err(vec!["spec.ipFamilies[0]".into()]),
            ),
            (
                dual(),
                json!({"ports": p, "clusterIP": "fd00:10:96::5"}),
                ok(SINGLE_STACK, &[IPV6]),
            ),
            (
                single(),
                json!({"ports": p, "clusterIP": "fd00:10:96::5"}),
                Err(vec!["spec.clusterIPs[0]".into()]),
            ),
            (
                dual(),
                json!({"ports": p, "ipFamilies": ["IPv4", "IPv6"]}),
                Err(vec!["spec.ipFamilyPolicy".into()]),
            ),
            (
                dual(),
                json!({"ports": p, "clusterIP": "10.96.0.5", "ipFamilies": ["IPv6"]}),
                Err(vec!["spec.clusterIPs[0]".into()]),
            ),
            (
                single(),
                json!({"ports": p, "clusterIP": "None"}),
                ok(REQUIRE_DUAL_STACK, &[IPV4, IPV6]),
            ),
            (
                dual(),
                json!({"ports": p, "clusterIP": "None", "selector": sel}),
                ok(SINGLE_STACK, &[IPV4]),
            ),
            (
                dual(),
                json!({"ports": p, "ipFamilies": ["IPv4", "IPv4"], "ipFamilyPolicy": "RequireDualStack"}),
                Err(vec!["spec.ipFamilies[1]".into()]),
            ),
            (
                dual(),
                json!({"ports": p, "clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5", "10.96.0.6"], "ipFamilyPolicy": "RequireDualStack"}),
                Err(vec!["spec.clusterIPs".into()]),
            ),
            (
                dual(),
                json!({"ports": p, "clusterIPs": ["10.96.0.5"]}),
                Err(vec!["spec.clusterIPs".into()]),
            ),
        ] {
            assert_eq!(create(v.clone(), &cidrs), want, "{v} on {cidrs:?}");
        }
        // ExternalName: nothing given out, nothing of it allowed.
        let mut ext = spec(json!({"type": "ExternalName", "externalName": "x.com"}));
        assert!(init(&mut ext, None, &dual()).is_empty());
        assert_eq!(ext.ip_families, None);
        let ext = spec(json!({"type": "ExternalName", "ipFamilyPolicy": "SingleStack"}));
        assert_eq!(check_fields(&ext)[0].field, "spec.ipFamilyPolicy");
    }

    /// Re-applying keeps what was given out; a policy change adds or
    /// releases the secondary family; the primary never moves.
    #[test]
    fn updates_upgrade_and_downgrade_as_the_server_does() {
        let stored = spec(json!({"ports": [{"port": 80}], "clusterIP": "10.96.0.5",
            "clusterIPs": ["10.96.0.5", "fd00:10:96::5"], "ipFamilies": ["IPv4", "IPv6"],
            "ipFamilyPolicy": "PreferDualStack"}));
        let update = |v: Value| {
            let mut s = spec(v);
            carry_over(&mut s, &stored);
            let e = init(&mut s, Some(&stored), &dual());
            (s, e.into_iter().map(|e| e.field).collect::<Vec<_>>())
        };
        // The same manifest again, without what the server set.
        let (s, e) = update(json!({"ports": [{"port": 80}], "ipFamilyPolicy": "PreferDualStack"}));
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(s, stored);
        let (s, e) = update(json!({"ports": [{"port": 80}]}));
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(s, stored, "no policy: the stored one");
        // Downgrade.
        let (s, e) = update(json!({"ports": [{"port": 80}], "ipFamilyPolicy": "SingleStack"}));
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(s.cluster_ips.unwrap(), ["10.96.0.5"]);
        assert_eq!(s.ip_families.unwrap(), ["IPv4"]);
        // Releasing without SingleStack.
        let (_, e) = update(
            json!({"ports": [{"port": 80}], "ipFamilyPolicy": "RequireDualStack",
            "ipFamilies": ["IPv4"]}),
        );
        assert_eq!(e, ["spec.ipFamilyPolicy"]);
        // The primary family may not change.
        let (_, e) = update(
            json!({"ports": [{"port": 80}], "ipFamilyPolicy": "RequireDualStack",
            "ipFamilies": ["IPv6", "IPv4"]}),
        );
        assert!(!e.is_empty());
        // Upgrade: the second family comes, its address is missing.
        let one = spec(json!({"ports": [{"port": 80}], "clusterIP": "10.96.0.5",
            "clusterIPs": ["10.96.0.5"], "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack"}));
        let mut s = spec(json!({"ports": [{"port": 80}], "ipFamilyPolicy": "RequireDualStack"}));
        carry_over(&mut s, &one);
        assert!(init(&mut s, Some(&one), &dual()).is_empty());
        assert_eq!(s.ip_families.as_deref().unwrap(), ["IPv4", "IPv6"]);
        assert_eq!(missing(&s, &dual()), [IPV6]);
    }

    #[test]
    fn missing_families() {
        let s = spec(json!({"ports": [{"port": 80}]}));
        assert_eq!(missing(&s, &dual()), [IPV4], "no families: the primary");
        let s = spec(json!({"clusterIP": "10.96.0.5"}));
        assert!(missing(&s, &dual()).is_empty(), "written before families");
        let s = spec(json!({"ipFamilies": ["IPv6", "IPv4"]}));
        assert_eq!(missing(&s, &dual()), [IPV6, IPV4]);
        let s = spec(json!({"clusterIP": "None", "ipFamilies": ["IPv4", "IPv6"]}));
        assert!(missing(&s, &dual()).is_empty());
    }
}
