//! Deleting a link without making the caller wait for the kernel to free it.
//!
//! An RTM_DELLINK does its visible work under RTNL in well under a
//! millisecond: every device of the batch (both ends of a veth) is unlisted,
//! bridge ports are dropped, addresses and routes flushed, and RTM_DELLINK is
//! notified. Then `rtnl_unlock()` runs `netdev_run_todo()`, which calls
//! `rcu_barrier()` and waits for the last references before freeing the
//! devices, still inside the sender's `sendmsg()`. That wait is one full RCU
//! grace period plus callback processing: 10-30 ms on a 2-CPU, HZ=250 kernel,
//! and nothing a caller can observe depends on it.
//!
//! [`delete_link_detached`] forks a helper that sends the request and sits
//! out that wait, while the caller waits only for the RTM_DELLINK
//! notifications of the links it names (subscribed before the request, so
//! none can be missed) and then returns: both veth ends are gone from every
//! view, the bridge port with them. The helper is double-forked, so it
//! belongs to init (or the nearest subreaper) from the start and never
//! becomes a zombie of the caller; it closes every descriptor it inherited,
//! stdio included, so a runtime reading a plugin's output sees EOF as soon
//! as the plugin exits; it exits by itself once the kernel is done.
//!
//! Fallbacks keep the result exact: if the helper cannot be forked, the
//! deletion is done synchronously; if notifications may have been lost
//! (listener overrun) or do not come, the caller waits for the helper's own
//! result; if the helper dies without one, the link's presence decides.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use crate::nl::{Msg, Socket, NLM_F_ACK};
use crate::{Handle, KernelError, Netns};

const RTM_DELLINK: u16 = 17;
const NLMSG_ERROR: u16 = 2;
const RTMGRP_LINK: u32 = 1;
/// How long to wait for a notification before relying on the helper alone.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(10);

/// A link by namespace (`None`: the caller's current one) and index.
#[derive(Debug, Clone, Copy)]
pub struct LinkRef<'a> {
    pub ns: Option<&'a Netns>,
    pub index: u32,
}

fn in_ns<T>(ns: Option<&Netns>, f: impl FnOnce() -> io::Result<T>) -> Result<T, KernelError> {
    let r = match ns {
        Some(n) => n.run(f)?,
        None => f(),
    };
    r.map_err(|e| KernelError::io("opening rtnetlink socket", e))
}

/// A raw rtnetlink socket subscribed to link notifications.
fn link_listener() -> io::Result<OwnedFd> {
    crate::nl::rtnl_listener(RTMGRP_LINK, 1 << 20, true)
}

/// The ifindexes announced by RTM_DELLINK (family AF_UNSPEC) in one datagram.
/// Bridge-port RTM_DELLINKs (AF_BRIDGE) come earlier in the same batch and
/// are not the device's own removal, so they are skipped.
pub fn parse_dellinks(buf: &[u8]) -> Vec<u32> {
    crate::nl::Messages::new(buf)
        .filter(|m| {
            m.msg_type == RTM_DELLINK && m.body.len() >= 16 && m.body[0] == libc::AF_UNSPEC as u8
        })
        .map(|m| i32::from_ne_bytes(m.body[4..8].try_into().expect("4 bytes")) as u32)
        .collect()
}

/// Closes every descriptor except `a` and `b` (in the forked helper).
///
/// # Safety
/// Only async-signal-safe calls; meant for a freshly forked child.
unsafe fn close_all_but(a: RawFd, b: RawFd) {
    let (a, b) = (a.min(b) as u32, a.max(b) as u32);
    let mut ranges = [(1u32, 0u32); 3];
    if a > 0 {
        ranges[0] = (0, a - 1);
    }
    if b > a + 1 {
        ranges[1] = (a + 1, b - 1);
    }
    ranges[2] = (b + 1, u32::MAX);
    for (lo, hi) in ranges {
        if lo > hi {
            continue;
        }
        if libc::syscall(libc::SYS_close_range, lo, hi, 0) != 0 {
            // Kernels before 5.9: close what a process normally has.
            let mut fd = lo;
            while fd <= hi.min(4095) {
                libc::close(fd as i32);
                fd += 1;
            }
        }
    }
}

/// The helper: send the request, read the ack, report its errno, exit.
///
/// # Safety
/// Runs in a forked child; uses only async-signal-safe calls and memory
/// prepared before the fork.
unsafe fn helper(sock: RawFd, report: RawFd, req: &[u8], buf: &mut [u8]) -> ! {
    close_all_but(sock, report);
    let errno = || *libc::__errno_location();
    let err = if libc::send(sock, req.as_ptr() as *const libc::c_void, req.len(), 0) < 0 {
        errno()
    } else {
        loop {
            let n = libc::recv(sock, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0);
            if n < 0 {
                if errno() == libc::EINTR {
                    continue;
                }
                break errno();
            }
            if n >= 20 && u16::from_ne_bytes([buf[4], buf[5]]) == NLMSG_ERROR {
                break -i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
            }
        }
    };
    let bytes = err.to_ne_bytes();
    libc::write(report, bytes.as_ptr() as *const libc::c_void, 4);
    libc::_exit(0)
}

/// Deletes link `target` and returns once the kernel has removed it and
/// every link in `also` (a veth's peer, say) from view, as announced by
/// their RTM_DELLINK notifications. The kernel's reclamation that follows
/// is waited out by a short-lived helper process instead of the caller.
pub fn delete_link_detached(target: LinkRef<'_>, also: &[LinkRef<'_>]) -> Result<(), KernelError> {
    let op = || format!("deleting link #{}", target.index);
    // Subscribe first: a notification sent before we listen would be lost.
    let mut watches = Vec::new();
    for w in std::iter::once(&target).chain(also) {
        watches.push((in_ns(w.ns, link_listener)?, w.index, false));
    }
    let mut sock = in_ns(target.ns, || Socket::open(libc::NETLINK_ROUTE))?;
    let mut m = Msg::new(RTM_DELLINK, NLM_F_ACK);
    let mut ifi = [0u8; 16];
    ifi[4..8].copy_from_slice(&(target.index as i32).to_ne_bytes());
    m.raw(&ifi);
    let req = m.finish(1);
    let mut ackbuf = vec![0u8; 8192];

    let mut p = [0 as RawFd; 2];
    // SAFETY: p is a valid two-element array.
    if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return delete_sync(&mut sock, target.index);
    }
    // SAFETY: both descriptors were just created and are ours.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
    // Fork twice: the middle process exits at once, so the helper is
    // init's (or the nearest subreaper's) child from the start and never
    // lingers as a zombie of a long-lived caller.
    // SAFETY: the children only run async-signal-safe code (`fork`,
    // `_exit`, `helper`) on memory prepared above.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return delete_sync(&mut sock, target.index);
    }
    if pid == 0 {
        // SAFETY: in the middle child, see above.
        unsafe {
            match libc::fork() {
                0 => helper(sock.as_raw_fd(), wr.as_raw_fd(), &req, &mut ackbuf),
                g => libc::_exit(if g < 0 { 1 } else { 0 }),
            }
        }
    }
    drop(wr);
    let mut status = 0;
    // SAFETY: waiting for our own child, which exits right away.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
        && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
    {}
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        // The helper was never born: nothing was sent, do it here.
        return delete_sync(&mut sock, target.index);
    }
    match wait(&mut watches, &rd, &op)? {
        Outcome::Gone => Ok(()),
        // The helper died without reporting (killed, say): judge by the link.
        Outcome::HelperLost => {
            let mut h = match target.ns {
                Some(ns) => Handle::in_netns(ns)?,
                None => Handle::new()?,
            };
            match h.link_by_index(target.index)? {
                None => Ok(()),
                Some(_) => Err(KernelError::Other(format!(
                    "{}: helper exited without a result and the link is still there",
                    op()
                ))),
            }
        }
    }
}

enum Outcome {
    Gone,
    HelperLost,
}

fn delete_sync(sock: &mut Socket, index: u32) -> Result<(), KernelError> {
    let mut m = Msg::new(RTM_DELLINK, NLM_F_ACK);
    let mut ifi = [0u8; 16];
    ifi[4..8].copy_from_slice(&(index as i32).to_ne_bytes());
    m.raw(&ifi);
    sock.request(m, &|| format!("deleting link #{index}"))?;
    Ok(())
}

/// Waits until every watched link is announced gone, or the helper reports.
fn wait(
    watches: &mut [(OwnedFd, u32, bool)],
    report: &OwnedFd,
    op: &dyn Fn() -> String,
) -> Result<Outcome, KernelError> {
    let mut buf = vec![0u8; 1 << 16];
    let mut trust_notifications = true;
    let deadline = Instant::now() + NOTIFY_TIMEOUT;
    loop {
        let mut fds = poll_set(watches, report, trust_notifications);
        let timeout = if trust_notifications {
            deadline
                .saturating_duration_since(Instant::now())
                .as_millis()
                .clamp(1, i32::MAX as u128) as i32
        } else {
            -1
        };
        // SAFETY: fds is a valid array of pollfd for its length.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(KernelError::io(op(), e));
        }
        if rc == 0 {
            // No notification in time: let the helper's result decide.
            trust_notifications = false;
            continue;
        }
        let report_ready = fds.last().map(|f| f.revents != 0).unwrap_or(false);
        if report_ready {
            return read_report(report, op);
        }
        if trust_notifications {
            for w in watches.iter_mut().filter(|w| !w.2) {
                if !drain_watch(w, &mut buf) {
                    trust_notifications = false;
                }
            }
            if trust_notifications && watches.iter().all(|w| w.2) {
                return Ok(Outcome::Gone);
            }
        }
    }
}

/// What to poll: the listeners of links not yet seen gone (none once
/// notifications are no longer trusted), and the helper's report pipe,
/// always last.
fn poll_set(
    watches: &[(OwnedFd, u32, bool)],
    report: &OwnedFd,
    trust_notifications: bool,
) -> Vec<libc::pollfd> {
    let mut fds: Vec<libc::pollfd> = watches
        .iter()
        .filter(|w| !w.2 && trust_notifications)
        .map(|w| libc::pollfd {
            fd: w.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    fds.push(libc::pollfd {
        fd: report.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    fds
}

/// Reads the helper's result: the errno of its request (0: deleted), or
/// nothing if it died before writing one.
fn read_report(report: &OwnedFd, op: &dyn Fn() -> String) -> Result<Outcome, KernelError> {
    let mut b = [0u8; 4];
    // SAFETY: reading into a 4-byte buffer from our pipe.
    let n = unsafe { libc::read(report.as_raw_fd(), b.as_mut_ptr() as *mut libc::c_void, 4) };
    if n != 4 {
        return Ok(Outcome::HelperLost);
    }
    let errno = i32::from_ne_bytes(b);
    if errno == 0 {
        return Ok(Outcome::Gone);
    }
    Err(KernelError::Netlink {
        op: op(),
        source: io::Error::from_raw_os_error(errno),
        detail: None,
    })
}

/// Reads the notifications queued on one watch's listener, marking the
/// watch done when its link's RTM_DELLINK is among them. `false`:
/// notifications were dropped (ENOBUFS or another error), so ours may be
/// lost and they can no longer be trusted.
fn drain_watch(w: &mut (OwnedFd, u32, bool), buf: &mut [u8]) -> bool {
    loop {
        // SAFETY: valid buffer; the socket is non-blocking.
        let n = unsafe {
            libc::recv(
                w.0.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) => return true,
                Some(libc::EINTR) => continue,
                // ENOBUFS: notifications were dropped; ours may be among them.
                _ => return false,
            }
        }
        if parse_dellinks(&buf[..n as usize]).contains(&w.1) {
            w.2 = true;
            return true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(ty: u16, family: u8, index: i32) -> Vec<u8> {
        let mut b = vec![0u8; 32];
        b[0..4].copy_from_slice(&32u32.to_ne_bytes());
        b[4..6].copy_from_slice(&ty.to_ne_bytes());
        b[16] = family;
        b[20..24].copy_from_slice(&index.to_ne_bytes());
        b
    }

    #[test]
    fn only_device_dellinks_count() {
        let mut d = msg(RTM_DELLINK, libc::AF_BRIDGE as u8, 7);
        d.extend(msg(16, 0, 7));
        d.extend(msg(RTM_DELLINK, 0, 7));
        d.extend(msg(RTM_DELLINK, 0, 9));
        assert_eq!(parse_dellinks(&d), vec![7, 9]);
        assert!(parse_dellinks(&d[..20]).is_empty());
    }
}
