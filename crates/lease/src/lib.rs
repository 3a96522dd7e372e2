//! Leader election over a `coordination.k8s.io/v1` Lease, the way
//! client-go's leaderelection does it, so that of several replicas
//! exactly one acts: one LB IPAM controller hands out addresses (two
//! deciding at once could each give one address to a different Service),
//! one L7 gateway writes statuses (replicas on different nodes could
//! disagree, and would rewrite each other's).
//!
//! Each candidate reads the Lease every retry period. The holder renews
//! it; another takes it only once the record has not changed for the
//! lease's duration *as timed on the candidate's own clock* from when it
//! saw the record last change ([`judge`], pure), so no two machines'
//! clocks are ever compared. Every write carries the resourceVersion
//! read, so two candidates racing for a free Lease cannot both win. The
//! holder counts itself leader only until its last successful renewal
//! plus the renew deadline, which is shorter than the duration the others
//! wait: a holder cut off from the API stops acting before anyone else
//! starts. A holder that stops cleanly hands the Lease back at once.

use std::time::Duration;

use kube::api::{Api, PostParams};
use podnet_api::k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use podnet_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use podnet_api::k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tokio::time::Instant;

/// Which Lease, who this candidate is, and the timing (client-go's
/// defaults: 15 s, 10 s, 2 s).
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub duration: Duration,
    pub renew_deadline: Duration,
    pub retry: Duration,
}

impl LeaseConfig {
    pub fn new(namespace: &str, name: &str, identity: &str) -> LeaseConfig {
        LeaseConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry: Duration::from_secs(2),
        }
    }
}

/// What a candidate does after reading the Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No holder, or the holder let it lapse: take it.
    Take,
    /// It is ours: renew it.
    Renew,
    /// Someone else holds it.
    Wait,
}

/// The record as last seen changing, and when, on this clock.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    record: (Option<String>, Option<MicroTime>, Option<i32>),
    at: Instant,
}

/// Judges the Lease's `spec` (None: no Lease yet) for candidate `me`.
pub fn judge(spec: Option<&LeaseSpec>, seen: &mut Option<Seen>, me: &str, now: Instant) -> Verdict {
    let Some(spec) = spec else {
        return Verdict::Take;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if holder == me {
        return Verdict::Renew;
    }
    if holder.is_empty() {
        return Verdict::Take;
    }
    let record = (
        spec.holder_identity.clone(),
        spec.renew_time.clone(),
        spec.lease_transitions,
    );
    let at = match seen {
        Some(s) if s.record == record => s.at,
        _ => {
            *seen = Some(Seen { record, at: now });
            now
        }
    };
    let secs = spec.lease_duration_seconds.unwrap_or(15).max(1) as u64;
    match now >= at + Duration::from_secs(secs) {
        true => Verdict::Take,
        false => Verdict::Wait,
    }
}

/// Whether the leadership `rx` reports is still good now.
pub fn leading(rx: &watch::Receiver<Option<Instant>>) -> bool {
    rx.borrow().is_some_and(|until| Instant::now() < until)
}

/// Campaigns for the Lease and keeps it for as long as this runs; `tx`
/// holds until when this candidate may act (None: it may not). Only a
/// change of leadership wakes `tx`'s receivers.
pub async fn campaign(api: Api<Lease>, cfg: LeaseConfig, tx: watch::Sender<Option<Instant>>) {
    let mut seen = None;
    loop {
        let started = Instant::now();
        match try_once(&api, &cfg, &mut seen).await {
            Ok(true) => set(&tx, Some(started + cfg.renew_deadline)),
            Ok(false) => set(&tx, None),
            // Leadership stands until its deadline; a failed read says
            // nothing about whether someone else took over.
            Err(e) => tracing::warn!(lease = %cfg.name, "leader election: {e}"),
        }
        // The retry period is the protocol's own schedule.
        tokio::time::sleep(cfg.retry).await;
    }
}

fn set(tx: &watch::Sender<Option<Instant>>, v: Option<Instant>) {
    tx.send_if_modified(|cur| {
        // Leading is a deadline not yet passed: one that passed (renewals
        // failed) and is renewed again is a new leadership too.
        let now = Instant::now();
        let flipped = cur.is_some_and(|t| now < t) != v.is_some_and(|t| now < t);
        if flipped {
            let who = if v.is_some() { "acquired" } else { "lost" };
            tracing::info!("leader election: {who} the lease");
        }
        *cur = v;
        flipped
    });
}

/// One read and, if the verdict says so, one write; whether this
/// candidate holds the Lease now.
async fn try_once(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    seen: &mut Option<Seen>,
) -> Result<bool, kube::Error> {
    let got = api.get_opt(&cfg.name).await?;
    let spec = got.as_ref().and_then(|l| l.spec.as_ref());
    let verdict = judge(spec, seen, &cfg.identity, Instant::now());
    let now = MicroTime(Timestamp::now());
    let secs = cfg.duration.as_secs() as i32;
    let write = match (verdict, got) {
        (Verdict::Wait, _) => return Ok(false),
        (_, None) => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.name.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(cfg.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            api.create(&PostParams::default(), &lease).await.map(|_| ())
        }
        (v, Some(mut lease)) => {
            let spec = lease.spec.get_or_insert_with(Default::default);
            if v == Verdict::Take {
                spec.holder_identity = Some(cfg.identity.clone());
                spec.acquire_time = Some(now.clone());
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.renew_time = Some(now);
            spec.lease_duration_seconds = Some(secs);
            api.replace(&cfg.name, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        }
    };
    match write {
        Ok(()) => Ok(true),
        // Another candidate wrote first (a create that found one, or a
        // resourceVersion that moved on).
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Hands the Lease back if this candidate holds it (a clean stop), so
/// the next one takes over at once instead of after the duration.
pub async fn release(api: &Api<Lease>, cfg: &LeaseConfig) -> Result<(), kube::Error> {
    let Some(mut lease) = api.get_opt(&cfg.name).await? else {
        return Ok(());
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    api.replace(&cfg.name, &PostParams::default(), &lease)
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed: &str, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: (!holder.is_empty()).then(|| holder.to_string()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(renewed.parse().unwrap())),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// A missing or released Lease is taken; ours is renewed; another's
    /// is taken only after it stood unchanged for its duration on our
    /// clock (its renewal times are never compared with our clock: a
    /// holder far in the past by our clock but still renewing keeps it).
    #[test]
    fn a_lease_is_taken_only_after_it_stood_still_for_its_duration() {
        let t0 = Instant::now();
        let mut seen = None;
        assert_eq!(judge(None, &mut seen, "b", t0), Verdict::Take);
        let released = spec("", "2020-01-01T00:00:00Z", 1);
        assert_eq!(judge(Some(&released), &mut seen, "b", t0), Verdict::Take);
        let mine = spec("b", "2020-01-01T00:00:00Z", 1);
        assert_eq!(judge(Some(&mine), &mut seen, "b", t0), Verdict::Renew);

        let a1 = spec("a", "2020-01-01T00:00:00Z", 1);
        assert_eq!(judge(Some(&a1), &mut seen, "b", t0), Verdict::Wait);
        let t14 = t0 + Duration::from_secs(14);
        assert_eq!(judge(Some(&a1), &mut seen, "b", t14), Verdict::Wait);
        // Renewed at t14: the wait starts again from there.
        let a2 = spec("a", "2020-01-01T00:00:02Z", 1);
        assert_eq!(judge(Some(&a2), &mut seen, "b", t14), Verdict::Wait);
        let t20 = t0 + Duration::from_secs(20);
        assert_eq!(judge(Some(&a2), &mut seen, "b", t20), Verdict::Wait);
        let t29 = t14 + Duration::from_secs(15);
        assert_eq!(judge(Some(&a2), &mut seen, "b", t29), Verdict::Take);
    }
}
