//! The node's subnet claim, as a node agent runs it: claim the subnet
//! (the one the node had before when it is still free), bring the overlay
//! up on it, say the network is up, then keep the claim (lease renewals;
//! a lost subnet is claimed again) while the overlay's reconcile loop gets
//! every change of the subnet map. Whoever else must know the node's
//! subnet (the policy loop fails closed on it) is told each time it is
//! claimed.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ipnet::Ipv4Net;
use podnet_daemon::Metrics;
use podnet_reconcile::Input;
use podnet_source::subnets::{self, Subnets};
use podnet_source::SourceError;

use crate::{files, Overlay, OverlayError, OverlayInput};

/// Runs the claim and the overlay's loop until an error (a claim that
/// cannot be made or kept); dropping the future stops both and leaves the
/// data plane in place.
pub async fn run<F: Future<Output = ()>>(
    mut overlay: Overlay,
    mut subnets: Subnets,
    subnet_file: &Path,
    resync: Duration,
    metrics: Arc<Metrics>,
    mut claimed: impl FnMut(Ipv4Net) -> F,
) -> Result<(), OverlayError> {
    let attrs = overlay.attrs();
    let previous = files::previous_subnet(subnet_file);
    let mine = subnets.acquire(&attrs, previous).await.map_err(source)?;
    tracing::info!(node = %attrs.node, subnet = %mine.subnet, public_ip = %attrs.public_ip,
        backend = overlay.backend().name(), mtu = overlay.mtu(), "subnet acquired");
    let underlay_ip = overlay.underlay().ip;
    overlay.start(mine.clone())?;
    subnets.network_up(underlay_ip).await.map_err(source)?;
    claimed(mine.subnet).await;

    // The overlay's loop is a task of its own (a send below may wait for
    // it to drain its input), in a set that aborts it when this future is
    // dropped.
    let (tx, rx) = podnet_reconcile::channel();
    let mut overlay_loop = tokio::task::JoinSet::new();
    if let Some(learned) = overlay.backend_mut().take_learned() {
        overlay_loop.spawn(forward_learned(learned, tx.clone()));
    }
    overlay_loop.spawn(podnet_reconcile::run(
        overlay,
        rx,
        podnet_reconcile::Options::new(resync),
        metrics,
        std::future::pending(),
    ));
    let mut mine = mine.subnet;
    let mut ready = false;
    let renew_every = subnets.renew_every();
    let mut renew = tokio::time::interval(renew_every.unwrap_or(Duration::from_secs(3600)));
    renew.tick().await;
    loop {
        tokio::select! {
            _ = overlay_loop.join_next() => {
                return Err(OverlayError::Other("the overlay's loop ended".into()));
            }
            _ = renew.tick(), if renew_every.is_some() => {
                if let Err(e) = subnets.renew().await {
                    tracing::warn!("lease renewal: {e}");
                }
            }
            c = subnets.next() => match c.map_err(source)? {
                subnets::Change::Nodes(map) => {
                    let _ = tx.send(Input::Changes(OverlayInput::Nodes(map))).await;
                    if !ready {
                        ready = true;
                        let _ = tx.send(Input::Ready).await;
                    }
                }
                subnets::Change::LostMine => {
                    let l = subnets.acquire(&attrs, Some(mine)).await.map_err(source)?;
                    tracing::info!(subnet = %l.subnet, "subnet re-acquired");
                    mine = l.subnet;
                    claimed(mine).await;
                    let _ = tx.send(Input::Changes(OverlayInput::Mine(l))).await;
                }
            }
        }
    }
}

/// Routes learned by the backend's routing protocol, into the loop.
async fn forward_learned(
    mut learned: tokio::sync::mpsc::Receiver<Vec<podnet_bgp::rib::Change>>,
    tx: tokio::sync::mpsc::Sender<Input<OverlayInput>>,
) {
    while let Some(c) = learned.recv().await {
        if tx
            .send(Input::Changes(OverlayInput::Learned(c)))
            .await
            .is_err()
        {
            return;
        }
    }
}

fn source(e: SourceError) -> OverlayError {
    OverlayError::Other(e.to_string())
}
