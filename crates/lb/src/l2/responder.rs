//! The responder: on one interface, answer ARP requests and Neighbor
//! Solicitations for the addresses this node owns now, and announce each
//! address the moment it is gained.
//!
//! It runs as a tokio task over two non-blocking `AF_PACKET` sockets (ARP,
//! and IPv6 filtered in the kernel down to Neighbor Discovery), registered
//! with the runtime through `AsyncFd`. [`Responder::set_owned`] hands the
//! task a new set over a watch channel; the task diffs it against the old
//! one: a gained address is announced at once and then repeated (see
//! [`super::announce`]), and for IPv6 the interface joins the address's
//! solicited-node group (so a NIC that filters multicast, or a switch
//! snooping MLD, still delivers the solicitations); a lost address is simply no longer answered (the
//! new owner's announcements move the clients).
//!
//! The interface's MAC is read once, at start: a responder on an
//! interface whose address changes must be restarted. A link going down
//! is not an error (the kernel reports it once on the socket; the
//! responder goes on when the link comes back); any other socket failure
//! ends the task, logged, and [`Responder::stop`] returns it.

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use podnet_kernel::Netns;
use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};
use tokio::io::Interest;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::announce::{Announce, Schedule};
use super::answer::{self, Verdict};
use super::packet::ndp::{solicited_node, Advertisement};
use super::packet::{arp, format_mac, Mac, ETHERTYPE_ARP, ETHERTYPE_IPV6};
use super::socket::{GroupSocket, PacketSocket, NDP_FILTER};
use super::L2Error;

/// A running responder. Dropping it stops the task; the sockets close
/// with it.
#[derive(Debug)]
pub struct Responder {
    iface: String,
    mac: Mac,
    owned: watch::Sender<BTreeSet<IpAddr>>,
    /// Asks the task to announce every owned address again.
    again: Arc<tokio::sync::Notify>,
    counters: Arc<Counters>,
    task: Option<JoinHandle<Result<(), L2Error>>>,
}

/// What a responder has done so far: for metrics, and for tests that
/// check who answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// ARP replies and Neighbor Advertisements sent in answer.
    pub replies: u64,
    /// Gratuitous ARPs and unsolicited Neighbor Advertisements sent.
    pub announcements: u64,
    /// Frames in which another host claimed an address we own.
    pub conflicts: u64,
    /// Frames that were not valid ARP or Neighbor Discovery.
    pub malformed: u64,
}

#[derive(Debug, Default)]
struct Counters {
    replies: AtomicU64,
    announcements: AtomicU64,
    conflicts: AtomicU64,
    malformed: AtomicU64,
}

/// The two sockets of one interface, opened in some namespace.
struct Sockets {
    iface: String,
    mac: Mac,
    arp: PacketSocket,
    ndp: PacketSocket,
    /// `None` when the host has no IPv6 (the error was logged).
    groups: Option<GroupSocket>,
}

impl Responder {
    /// Starts answering on `iface` in the calling thread's network
    /// namespace, as a task on the current tokio runtime (which must have
    /// I/O enabled). It owns nothing until [`Responder::set_owned`].
    pub fn start(iface: &str, announce: Announce) -> Result<Responder, L2Error> {
        Responder::spawn(open(iface)?, announce)
    }

    /// [`Responder::start`] on `iface` in namespace `ns`: the sockets are
    /// opened there (and stay there), the task runs on the current
    /// runtime.
    pub fn start_in(ns: &Netns, iface: &str, announce: Announce) -> Result<Responder, L2Error> {
        let sockets = ns.run(|| open(iface)).map_err(|source| L2Error::Lookup {
            iface: iface.to_string(),
            source,
        })??;
        Responder::spawn(sockets, announce)
    }

    fn spawn(s: Sockets, announce: Announce) -> Result<Responder, L2Error> {
        let iface = s.iface.clone();
        let rt = tokio::runtime::Handle::try_current().map_err(|_| L2Error::NoRuntime {
            iface: iface.clone(),
        })?;
        let _entered = rt.enter();
        let register = |sock: PacketSocket| {
            // SAFETY: a PacketSocket owns its descriptor for its whole life
            // and always returns that one from as_raw_fd.
            unsafe { AsyncFd::register_with_interest(sock, Interest::READABLE) }.map_err(|e| {
                L2Error::Socket {
                    iface: iface.clone(),
                    op: "registering the socket with the tokio runtime",
                    source: e.into_parts().1,
                }
            })
        };
        let counters = Arc::new(Counters::default());
        let again = Arc::new(tokio::sync::Notify::new());
        let (owned, rx) = watch::channel(BTreeSet::new());
        let task = Task {
            arp: register(s.arp)?,
            ndp: register(s.ndp)?,
            iface: s.iface,
            mac: s.mac,
            groups: s.groups,
            owned: BTreeSet::new(),
            schedule: Schedule::new(announce),
            counters: counters.clone(),
            again: again.clone(),
        };
        let task = rt.spawn(async move {
            let iface = task.iface.clone();
            let ended = task.run(rx).await;
            if let Err(e) = &ended {
                tracing::error!(%iface, "L2 responder stopped: {e}");
            }
            ended
        });
        Ok(Responder {
            iface,
            mac: s.mac,
            owned,
            again,
            counters,
            task: Some(task),
        })
    }

    /// Replaces the set of addresses this node answers for, as the
    /// election decided (see [`super::election::owned_by`]). Gained ones
    /// are announced at once; lost ones are no longer answered.
    pub fn set_owned(&self, ips: impl IntoIterator<Item = IpAddr>) {
        self.owned.send_replace(ips.into_iter().collect());
    }

    /// Announces every owned address again (the same schedule as a gain):
    /// a node that comes back may have taken some of them over while this
    /// one could not hear it, and its clients still point at it.
    pub fn announce_again(&self) {
        self.again.notify_one();
    }

    /// The addresses last given to [`Responder::set_owned`].
    pub fn owned(&self) -> BTreeSet<IpAddr> {
        self.owned.borrow().clone()
    }

    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// The MAC it answers with: the interface's, read at start.
    pub fn mac(&self) -> Mac {
        self.mac
    }

    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        Stats {
            replies: c.replies.load(Relaxed),
            announcements: c.announcements.load(Relaxed),
            conflicts: c.conflicts.load(Relaxed),
            malformed: c.malformed.load(Relaxed),
        }
    }

    /// Whether the task still runs (it ends only on a socket failure,
    /// which [`Responder::stop`] returns).
    pub fn is_running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops answering and closes the sockets; the failure that had
    /// already ended the task, if one did.
    pub async fn stop(mut self) -> Result<(), L2Error> {
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        task.abort();
        match task.await {
            Ok(ended) => ended,
            Err(e) if e.is_cancelled() => Ok(()),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Finds `iface` and opens its sockets, in the calling thread's namespace.
fn open(iface: &str) -> Result<Sockets, L2Error> {
    let link = podnet_kernel::Handle::new()
        .and_then(|mut h| h.link(iface))
        .map_err(|source| L2Error::Lookup {
            iface: iface.to_string(),
            source,
        })?
        .ok_or_else(|| L2Error::NoSuchInterface {
            iface: iface.to_string(),
        })?;
    let mac = link
        .mac
        .filter(|m| *m != [0; 6])
        .ok_or_else(|| L2Error::NotEthernet {
            iface: iface.to_string(),
        })?;
    let groups = GroupSocket::open(link.index)
        .inspect_err(|e| tracing::warn!(%iface, "no IPv6 socket for solicited-node groups: {e}"))
        .ok();
    Ok(Sockets {
        iface: iface.to_string(),
        mac,
        groups,
        arp: PacketSocket::open(iface, link.index, ETHERTYPE_ARP, None)?,
        ndp: PacketSocket::open(iface, link.index, ETHERTYPE_IPV6, Some(&NDP_FILTER))?,
    })
}

/// The solicited-node groups of the IPv6 addresses in `ips` (two
/// addresses may share one).
fn groups_of(ips: &BTreeSet<IpAddr>) -> BTreeSet<Ipv6Addr> {
    ips.iter()
        .filter_map(|ip| match ip {
            IpAddr::V6(a) => Some(solicited_node(*a)),
            IpAddr::V4(_) => None,
        })
        .collect()
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Arp,
    Ndp,
}

/// The task's state.
struct Task {
    arp: AsyncFd<PacketSocket>,
    ndp: AsyncFd<PacketSocket>,
    iface: String,
    mac: Mac,
    groups: Option<GroupSocket>,
    owned: BTreeSet<IpAddr>,
    schedule: Schedule,
    counters: Arc<Counters>,
    again: Arc<tokio::sync::Notify>,
}

impl Task {
    async fn run(mut self, mut rx: watch::Receiver<BTreeSet<IpAddr>>) -> Result<(), L2Error> {
        // Room for any ARP or ND frame; a longer one is cut and rejected.
        let mut buf = vec![0u8; 2048];
        loop {
            let next = self.schedule.next_at();
            let wake = tokio::time::Instant::from_std(next.unwrap_or_else(Instant::now));
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        return Ok(()); // the Responder is gone
                    }
                    let new = rx.borrow_and_update().clone();
                    self.apply(new);
                }
                guard = self.arp.readable() => {
                    let guard = guard.map_err(|e| self.fail("waiting for ARP frames", e))?;
                    self.drain(guard, Kind::Arp, &mut buf)?;
                }
                guard = self.ndp.readable() => {
                    let guard = guard.map_err(|e| self.fail("waiting for ND frames", e))?;
                    self.drain(guard, Kind::Ndp, &mut buf)?;
                }
                _ = tokio::time::sleep_until(wake), if next.is_some() => self.announce_due(),
                _ = self.again.notified() => {
                    let now = Instant::now();
                    for ip in &self.owned {
                        self.schedule.gained(*ip, now);
                    }
                }
            }
        }
    }

    fn fail(&self, op: &'static str, source: io::Error) -> L2Error {
        L2Error::Socket {
            iface: self.iface.clone(),
            op,
            source,
        }
    }

    /// Moves to a new owned set.
    fn apply(&mut self, new: BTreeSet<IpAddr>) {
        let now = Instant::now();
        for ip in new.difference(&self.owned) {
            tracing::info!(iface = %self.iface, %ip, mac = %format_mac(&self.mac), "gained: announcing");
            self.schedule.gained(*ip, now);
        }
        for ip in self.owned.difference(&new) {
            tracing::info!(iface = %self.iface, %ip, "lost: no longer answering");
            self.schedule.lost(*ip);
        }
        let (old_groups, new_groups) = (groups_of(&self.owned), groups_of(&new));
        self.owned = new;
        let Some(sock) = &self.groups else {
            return;
        };
        for g in new_groups.difference(&old_groups) {
            if let Err(e) = sock.join(*g) {
                tracing::warn!(iface = %self.iface, group = %g, "joining a solicited-node group: {e}");
            }
        }
        for g in old_groups.difference(&new_groups) {
            if let Err(e) = sock.leave(*g) {
                tracing::warn!(iface = %self.iface, group = %g, "leaving a solicited-node group: {e}");
            }
        }
    }

    /// Sends the announcements that are due.
    fn announce_due(&mut self) {
        for ip in self.schedule.due(Instant::now()) {
            let (sock, frame) = match ip {
                IpAddr::V4(a) => (&self.arp, arp::gratuitous(self.mac, a)),
                IpAddr::V6(a) => (&self.ndp, Advertisement::unsolicited(self.mac, a).frame()),
            };
            match sock.get_ref().send(&frame) {
                Ok(()) => {
                    self.counters.announcements.fetch_add(1, Relaxed);
                }
                Err(e) => tracing::warn!(iface = %self.iface, %ip, "sending an announcement: {e}"),
            }
        }
    }

    /// Reads and answers every frame waiting on one socket.
    fn drain(
        &self,
        mut guard: AsyncFdReadyGuard<'_, PacketSocket>,
        kind: Kind,
        buf: &mut [u8],
    ) -> Result<(), L2Error> {
        loop {
            let n = match guard.try_io(|s| s.get_ref().recv(buf)) {
                Err(_would_block) => return Ok(()),
                Ok(Ok(Some(n))) => n,
                Ok(Ok(None)) => continue, // ours, or not sent to us
                Ok(Err(e)) if e.raw_os_error() == Some(libc::ENETDOWN) => {
                    tracing::warn!(iface = %self.iface, "link went down; answering again once it is up");
                    continue;
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Err(self.fail("receiving", e)),
            };
            self.answer(kind, &buf[..n], guard.get_inner());
        }
    }

    fn answer(&self, kind: Kind, frame: &[u8], sock: &PacketSocket) {
        let verdict = match kind {
            Kind::Arp => answer::arp(frame, self.mac, &self.owned),
            Kind::Ndp => answer::ndp(frame, self.mac, &self.owned),
        };
        match verdict {
            Ok(Verdict::Ignore) => {}
            Ok(Verdict::Reply { ip, frame }) => match sock.send(&frame) {
                Ok(()) => {
                    self.counters.replies.fetch_add(1, Relaxed);
                    tracing::debug!(iface = %self.iface, %ip, "answered");
                }
                Err(e) => tracing::warn!(iface = %self.iface, %ip, "sending a reply: {e}"),
            },
            Ok(Verdict::Conflict { ip, mac }) => {
                self.counters.conflicts.fetch_add(1, Relaxed);
                tracing::warn!(
                    iface = %self.iface, %ip, other = %format_mac(&mac),
                    "another host claims an address this node announces"
                );
            }
            Err(e) => {
                self.counters.malformed.fetch_add(1, Relaxed);
                tracing::trace!(iface = %self.iface, "dropped a frame: {e}");
            }
        }
    }
}
