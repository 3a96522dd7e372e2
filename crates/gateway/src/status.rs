//! The statuses the specs ask for, from the builder's verdicts (pure):
//! GatewayClass `Accepted` (and the features podnet supports), Gateway
//! `Accepted`/`Programmed` with addresses and per-listener conditions
//! and `attachedRoutes`, a route's `Accepted`/`ResolvedRefs` per parent
//! of ours (other controllers' entries kept), an Ingress's
//! `loadBalancer` addresses. A condition keeps its `lastTransitionTime`
//! while its status stays, so rewriting an unchanged status is a no-op.

use podnet_api::gateway::listener::{
    GatewayAddress, GatewayClassStatus, GatewayStatus, ListenerStatus, RouteGroupKind,
    SupportedFeature,
};
use podnet_api::gateway::{RouteParentStatus, RouteStatus, GROUP};
use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use podnet_api::k8s_openapi::jiff::Timestamp;

use crate::model::build::{GatewayState, ParentState, Verdict};

/// The features `status.supportedFeatures` lists, sorted, and the
/// conformance run claims (`scripts/gateway-conformance-run.sh`, kept
/// equal by a test): the standard channel's core and the extended ones
/// the suite passes (the experimental Retry and DestinationPortMatching
/// need the experimental CRDs' fields).
pub const SUPPORTED_FEATURES: &[&str] = &[
    "Gateway",
    "GatewayHTTPListenerIsolation",
    "GatewayPort8080",
    "HTTPRoute",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteBackendTimeout",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteParentRefPort",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteRequestPercentageMirror",
    "HTTPRouteRequestTimeout",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteSchemeRedirect",
    "ReferenceGrant",
];

/// One condition, its transition time carried over from `old` when its
/// status did not change.
pub fn condition(
    old: &[Condition],
    ty: &str,
    v: &Verdict,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    condition_raw(
        old,
        ty,
        if v.ok { "True" } else { "False" },
        v.reason,
        &v.message,
        generation,
        now,
    )
}

fn condition_raw(
    old: &[Condition],
    ty: &str,
    status: &str,
    reason: &str,
    msg: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let since = old
        .iter()
        .find(|c| c.type_ == ty && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    Condition {
        type_: ty.into(),
        status: status.into(),
        reason: reason.into(),
        message: msg.into(),
        last_transition_time: since,
        observed_generation: generation,
    }
}

pub fn gateway_class(
    old: Option<&GatewayClassStatus>,
    generation: Option<i64>,
    v: &Verdict,
    now: Timestamp,
) -> GatewayClassStatus {
    let prev = old.map(|s| s.conditions.as_slice()).unwrap_or(&[]);
    GatewayClassStatus {
        conditions: vec![condition(prev, "Accepted", v, generation, now)],
        supported_features: SUPPORTED_FEATURES
            .iter()
            .map(|f| SupportedFeature {
                name: f.to_string(),
            })
            .collect(),
    }
}

pub fn gateway(
    old: Option<&GatewayStatus>,
    g: &GatewayState,
    addresses: &[String],
    now: Timestamp,
) -> GatewayStatus {
    let empty = GatewayStatus::default();
    let old = old.unwrap_or(&empty);
    let gen = g.generation;
    let listeners = g
        .listeners
        .iter()
        .map(|l| {
            let prev = old
                .listeners
                .iter()
                .find(|o| o.name == l.name)
                .map(|o| o.conditions.as_slice())
                .unwrap_or(&[]);
            let mut conditions = vec![
                condition(prev, "Accepted", &l.accepted, gen, now),
                condition(prev, "Programmed", &l.programmed, gen, now),
                condition(prev, "ResolvedRefs", &l.resolved_refs, gen, now),
            ];
            if let Some(c) = &l.conflicted {
                conditions.push(condition(prev, "Conflicted", c, gen, now));
            }
            ListenerStatus {
                name: l.name.clone(),
                supported_kinds: l
                    .supported_kinds
                    .iter()
                    .map(|k| RouteGroupKind {
                        group: Some(GROUP.into()),
                        kind: k.clone(),
                    })
                    .collect(),
                attached_routes: l.attached_routes,
                conditions,
            }
        })
        .collect();
    GatewayStatus {
        addresses: addresses
            .iter()
            .map(|a| GatewayAddress {
                type_: Some(address_type(a).into()),
                value: a.clone(),
            })
            .collect(),
        conditions: vec![
            condition(&old.conditions, "Accepted", &g.accepted, gen, now),
            condition(&old.conditions, "Programmed", &g.programmed, gen, now),
        ],
        listeners,
    }
}

fn address_type(a: &str) -> &'static str {
    match a.parse::<std::net::IpAddr>() {
        Ok(_) => "IPAddress",
        Err(_) => "Hostname",
    }
}

/// A route's status with our parents' entries replaced and others kept.
pub fn route(
    old: Option<&RouteStatus>,
    generation: Option<i64>,
    parents: &[ParentState],
    controller: &str,
    now: Timestamp,
) -> RouteStatus {
    let old_parents = old.map(|s| s.parents.as_slice()).unwrap_or(&[]);
    let mut out: Vec<RouteParentStatus> = old_parents
        .iter()
        .filter(|p| p.controller_name != controller)
        .cloned()
        .collect();
    for p in parents {
        let prev = old_parents
            .iter()
            .find(|o| o.controller_name == controller && o.parent_ref == p.parent)
            .map(|o| o.conditions.as_slice())
            .unwrap_or(&[]);
        out.push(RouteParentStatus {
            parent_ref: p.parent.clone(),
            controller_name: controller.into(),
            conditions: vec![
                condition(prev, "Accepted", &p.accepted, generation, now),
                condition(prev, "ResolvedRefs", &p.resolved_refs, generation, now),
            ],
        });
    }
    RouteStatus { parents: out }
}

/// Whether a status write is needed (conditions carry their transition
/// times over, so plain equality tells).
pub fn unchanged<T: PartialEq>(old: Option<&T>, new: &T) -> bool {
    old == Some(new)
}

#[cfg(test)]
mod tests {
    /// The conformance run claims exactly what GatewayClasses show.
    #[test]
    fn the_conformance_run_claims_what_the_status_lists() {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/gateway-conformance-run.sh"
        );
        let text = std::fs::read_to_string(script).unwrap();
        let line = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("FEATURES="))
            .expect("FEATURES= in the script");
        let claimed: Vec<&str> = line.split(',').collect();
        assert_eq!(claimed, super::SUPPORTED_FEATURES);
        let mut sorted = claimed.clone();
        sorted.sort();
        assert_eq!(claimed, sorted, "sorted, as the spec asks");
    }
}
