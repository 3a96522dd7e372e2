//! NetworkPolicy on nftables: Calico's job in podnet.
//!
//! Layout, one concept per module:
//! - [`world`]: the policy view of the cluster (pods, namespace labels,
//!   compiled policies with the API's defaults resolved) and its indexes;
//! - [`eval`]: the evaluator, a pure function from the view and a flow to
//!   a verdict with reasons: the oracle the data plane is tested against,
//!   and what `podnet policy explain` and the verdict log answer from;
//! - [`plan`]: the fixed table and each local pod's set elements (pure);
//! - [`dataplane`]: the subsystem on the reconcile loop (watch, plan,
//!   observe, diff, apply), element changes only after the first sync;
//! - [`hint`]: the unix socket the CNI plugin's ADD waits on, so no new pod
//!   is reachable before its policies are in the kernel;
//! - [`log`]: the NFLOG reader that explains every denied connection;
//! - [`strict`]: `--policy-strict`, cutting established connections a
//!   change no longer allows;
//! - [`guard`] and [`guardplane`]: the per-port anti-spoofing guard
//!   (`bridge podnet-guard`), so the source addresses policies judge are
//!   the pods' own.
//!
//! Enforcement is node-local: each agent judges the egress of its own pods
//! and the ingress to them, in the forward hook after the service proxy's
//! DNAT, on new connections only (replies and established traffic pass
//! untouched). Traffic the node itself sends never crosses the forward
//! hook, so the node always reaches its pods (health checks).

pub mod dataplane;
pub mod eval;
pub mod guard;
pub mod guardplane;
pub mod hint;
pub mod log;
pub mod plan;
pub mod strict;
pub mod world;

#[cfg(test)]
mod tests;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use podnet_api::Kind;
use podnet_daemon::Metrics;
use podnet_reconcile::Input;
use podnet_source::Subscription;
use tokio::sync::mpsc;

pub use dataplane::{Options, PolicyInput, PolicyPlane};
pub use eval::{evaluate, Flow, Verdict};
pub use world::{Key, World};

/// The kinds the policy loop subscribes to.
pub const KINDS: &[Kind] = &[Kind::Pod, Kind::Namespace, Kind::NetworkPolicy];

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{0}")]
    Sync(String),
    #[error("policy socket {0}: {1}")]
    Socket(String, std::io::Error),
}

/// A handle to feed the running loop (the node's subnets).
#[derive(Clone)]
pub struct Feed(mpsc::Sender<Input<PolicyInput>>);

impl Feed {
    pub async fn subnets(&self, s: Vec<ipnet::IpNet>) {
        let _ = self.0.send(Input::Changes(PolicyInput::Subnets(s))).await;
    }
}

/// Starts the policy loop: the subsystem fed by `sub` (subscribed to
/// [`KINDS`]), the CNI socket at `socket`, the verdict log reader. Returns
/// the feed for the node's subnets and a future that runs until dropped.
pub fn start(
    sub: Subscription,
    opts: Options,
    socket: hint::Socket,
    resync: Duration,
    metrics: Arc<Metrics>,
) -> Result<(Feed, impl std::future::Future<Output = ()>), PolicyError> {
    start_with(sub, opts, socket, resync, metrics, None)
}

/// [`start`], also handing every explained denial to `sink` (the node's
/// flow log).
pub fn start_with(
    sub: Subscription,
    opts: Options,
    socket: hint::Socket,
    resync: Duration,
    metrics: Arc<Metrics>,
    sink: Option<log::DenialSink>,
) -> Result<(Feed, impl std::future::Future<Output = ()>), PolicyError> {
    let world = Arc::new(RwLock::new(World::new()));
    let records = guardplane::read_records(&guardplane::records_dir(&socket.path));
    let guard = guardplane::GuardPlane::new(opts.ipv6, records)
        .map_err(|e| PolicyError::Sync(e.to_string()))?;
    let plane = PolicyPlane::new(opts, world.clone(), metrics.clone())
        .map_err(|e| PolicyError::Sync(e.to_string()))?;
    let (tx, rx) = podnet_reconcile::channel();
    let (guard_tx, guard_rx) = podnet_reconcile::channel();
    // The subscription, forwarded as deltas; it is always read.
    let forward = podnet_reconcile::forward(sub, tx.clone(), |f| match f {
        podnet_reconcile::Feed::Deltas(d) => Some(PolicyInput::Deltas(d)),
        podnet_reconcile::Feed::Snapshot(_) => None,
    });
    let hint_tx = hint::Loops {
        policy: tx.clone(),
        guard: guard_tx.clone(),
    };
    let m = metrics.clone();
    let fut = async move {
        let _stop = podnet_daemon::StopOnDrop::new();
        let stop = _stop.flag();
        let (w, lm) = (world.clone(), m.clone());
        std::thread::Builder::new()
            .name("policy-log".into())
            .spawn(move || log::read(w, lm, stop, sink))
            .expect("thread");
        let hints = async {
            let path = socket.path.clone();
            if let Err(e) = hint::serve(socket, hint_tx).await {
                tracing::error!("policy socket {}: {e}", path.display());
                m.set_unhealthy_for("policy", Some(format!("policy socket: {e}")));
            }
            std::future::pending::<()>().await
        };
        let run = podnet_reconcile::run(
            plane,
            rx,
            podnet_reconcile::Options::new(resync),
            m.clone(),
            std::future::pending(),
        );
        // The guard's view (the records) is complete from the start.
        let _ = guard_tx.send(Input::Ready).await;
        let run_guard = podnet_reconcile::run(
            guard,
            guard_rx,
            podnet_reconcile::Options::new(resync),
            m.clone(),
            std::future::pending(),
        );
        tokio::select! {
            _ = forward => {}
            _ = hints => {}
            _ = run => {}
            _ = run_guard => {}
        }
    };
    Ok((Feed(tx), fut))
}

/// NetworkPolicy off (`--no-policy`): removes the tables an enforcing
/// agent left (they would go on judging with nobody updating them, and
/// fail closed on every new pod; this is also the way down to a version
/// without NetworkPolicy: roll out `--no-policy` first), then answers the
/// CNI plugin's ADD, which still waits for an agent on `socket`, until
/// dropped.
pub async fn run_disabled(socket: hint::Socket, metrics: Arc<Metrics>) {
    match cleanup() {
        Ok(gone) => {
            for t in gone {
                tracing::info!(
                    "NetworkPolicy is off (--no-policy): removed the nft table {t} an earlier agent left"
                );
            }
        }
        Err(e) => tracing::warn!(
            "NetworkPolicy is off (--no-policy), but the policy tables could not be checked: {e}"
        ),
    }
    let path = socket.path.clone();
    if let Err(e) = hint::serve_without_policy(socket).await {
        tracing::error!("CNI socket {}: {e}", path.display());
        metrics.set_unhealthy_for("policy", Some(format!("CNI socket: {e}")));
    }
}

/// Removes the policy tables and the port guard's (for --cleanup);
/// returns the ones removed.
pub fn cleanup() -> Result<Vec<String>, PolicyError> {
    use podnet_nft::model::Family;
    let mut gone = podnet_nft::sync::remove(&[Family::Ip, Family::Ip6], plan::TABLE)
        .map_err(|e| PolicyError::Sync(e.to_string()))?;
    gone.extend(guardplane::cleanup().map_err(|e| PolicyError::Sync(e.to_string()))?);
    Ok(gone)
}
