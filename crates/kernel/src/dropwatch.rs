//! The kernel's own drop reasons: the `skb:kfree_skb` tracepoint, read
//! through a private tracefs instance.
//!
//! A trace whose probe died without any nftables rule dropping it still
//! wants the kernel's word: `NO_SOCKET` in `__udp4_lib_rcv` (a VXLAN packet
//! to a node with no VXLAN device), `IP_RPFILTER`, `NEIGH_FAILED`... The
//! tracepoint carries no addresses, so a [`DropWatch`] keeps only the drops
//! made by one thread: the one sending the probe. Between namespaces of one
//! machine (a lab, or a pod and its node) the kernel handles a packet to
//! its end inside the sender's system call, so the drop of the probe's
//! first packet is the sender's. Retransmissions run from timers and are
//! not seen; nor is anything another machine drops.
//!
//! Each watch is its own tracefs instance (`instances/podnet-drops-PID-N`),
//! so watches never share a buffer or a filter with each other or with
//! whoever else traces; instances left by a killed process are removed by
//! the next watch.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::KernelError;

const TRACEFS: &str = "/sys/kernel/tracing";
const PREFIX: &str = "podnet-drops-";

/// One `kfree_skb` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// The `skb_drop_reason` name, e.g. `NO_SOCKET`.
    pub reason: String,
    /// The function that freed the packet, e.g. `__udp4_lib_rcv`.
    pub location: String,
    /// The packet's EtherType (0x0800 IPv4, 0x86dd IPv6).
    pub protocol: u16,
}

/// A running watch; stopping or dropping it removes the instance.
pub struct DropWatch {
    dir: PathBuf,
}

/// The calling thread's id, as tracefs's `common_pid` names it.
pub fn gettid() -> i32 {
    // SAFETY: gettid(2) has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

fn write(p: &Path, v: &str) -> Result<(), KernelError> {
    std::fs::write(p, v)
        .map_err(|e| KernelError::io(format!("writing {v:?} to {}", p.display()), e))
}

/// tracefs, mounted if it is not yet (a node's boot usually has it).
fn tracefs() -> Result<PathBuf, KernelError> {
    let root = Path::new(TRACEFS);
    if !root.join("instances").is_dir() {
        let src = std::ffi::CString::new("tracefs").expect("no NUL");
        let dst = std::ffi::CString::new(TRACEFS).expect("no NUL");
        // SAFETY: mount(2) with valid C strings and no data.
        let r = unsafe {
            libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
                src.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if r != 0 && !root.join("instances").is_dir() {
            return Err(KernelError::io(
                format!("mounting tracefs on {TRACEFS}"),
                std::io::Error::last_os_error(),
            ));
        }
    }
    if !root.join("events/skb/kfree_skb").is_dir() {
        return Err(KernelError::Other(
            "unsupported: this kernel has no skb:kfree_skb tracepoint".into(),
        ));
    }
    Ok(root.to_path_buf())
}

/// Removes instances whose process is gone.
fn sweep(instances: &Path) {
    let Ok(rd) = std::fs::read_dir(instances) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or("");
        if !pid.is_empty() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

impl DropWatch {
    /// Starts recording the drops made by thread `tid`.
    pub fn start(tid: i32) -> Result<DropWatch, KernelError> {
        static N: AtomicU32 = AtomicU32::new(0);
        let root = tracefs()?;
        let instances = root.join("instances");
        sweep(&instances);
        let dir = instances.join(format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir)
            .map_err(|e| KernelError::io(format!("creating {}", dir.display()), e))?;
        let w = DropWatch { dir };
        let ev = w.dir.join("events/skb/kfree_skb");
        write(
            &ev.join("filter"),
            &format!("common_pid == {tid} && (protocol == 2048 || protocol == 34525)"),
        )?;
        write(&ev.join("enable"), "1")?;
        Ok(w)
    }

    /// Stops and returns what was recorded, in order.
    pub fn stop(self) -> Result<Vec<Dropped>, KernelError> {
        write(&self.dir.join("events/skb/kfree_skb/enable"), "0")?;
        let p = self.dir.join("trace");
        let text = std::fs::read_to_string(&p)
            .map_err(|e| KernelError::io(format!("reading {}", p.display()), e))?;
        Ok(text.lines().filter_map(parse).collect())
    }
}

impl std::ops::Drop for DropWatch {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("events/skb/kfree_skb/enable"), "0");
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// One line of an instance's `trace` file; None for comments and other
/// events.
pub fn parse(line: &str) -> Option<Dropped> {
    let rest = line.split_once("kfree_skb: ")?.1;
    let field = |k: &str| {
        rest.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .map(str::to_string)
    };
    let protocol = field("protocol=")?.parse().ok()?;
    let location = field("location=")?;
    let location = location.split('+').next().unwrap_or(&location).to_string();
    let reason = rest.split_once("reason: ")?.1.trim().to_string();
    Some(Dropped {
        reason,
        location,
        protocol,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_lines_parse() {
        let l = "          podnet-1628    [001] ..s1. 40827.840017: kfree_skb: skbaddr=0000000012609cc2 rx_sk=0000000000000000 protocol=2048 location=__udp4_lib_rcv+0x4bc/0xd00 reason: NO_SOCKET";
        assert_eq!(
            parse(l),
            Some(Dropped {
                reason: "NO_SOCKET".into(),
                location: "__udp4_lib_rcv".into(),
                protocol: 2048
            })
        );
        // Older kernels print no rx_sk.
        let l = "x-1 [000] ..s1. 1.0: kfree_skb: skbaddr=00 protocol=34525 location=ip6_mc_input+0x15e/0x270 reason: NOT_SPECIFIED";
        assert_eq!(parse(l).unwrap().reason, "NOT_SPECIFIED");
        assert_eq!(parse("# tracer: nop"), None);
        assert_eq!(parse("x-1 [000] 1.0: consume_skb: skbaddr=00"), None);
    }
}
