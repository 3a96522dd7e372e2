//! One trace at a time per node: the lock a [`super::Session`] holds on
//! each node it installs its table in, so two traces never share (or
//! remove) one another's table.

use std::time::Duration;

use podnet_kernel::Netns;

use crate::TraceError;

/// One trace at a time per node: an exclusive `flock` on a file named by
/// the node's namespace (its nsfs inode), held for the whole session. The
/// kernel releases it when the holder dies, so a killed trace blocks no
/// one; the next holder removes the table it left. The holder removes the
/// file when done, so none pile up; a waiter that locked a file already
/// removed (its inode no longer at the path) opens the path again.
pub(super) struct NodeLock {
    _file: std::fs::File,
    path: String,
}

/// Where the per-node lock files live.
const LOCK_DIR: &str = "/run/podnet/trace";
/// How long a trace waits for another one on the same node.
const LOCK_WAIT: Duration = Duration::from_secs(30);

impl NodeLock {
    /// The namespace's identity: its nsfs inode.
    pub(super) fn ino(ns: &Netns, node: &str) -> Result<u64, TraceError> {
        use std::os::unix::fs::MetadataExt;
        Ok(std::fs::metadata(ns.path())
            .map_err(|e| TraceError::Msg(format!("node {node}: {}: {e}", ns.path().display())))?
            .ino())
    }

    /// Locks the node whose namespace has inode `ino`.
    pub(super) fn acquire(ino: u64, node: &str) -> Result<NodeLock, TraceError> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        std::fs::create_dir_all(LOCK_DIR)
            .map_err(|e| TraceError::Msg(format!("creating {LOCK_DIR}: {e}")))?;
        let path = format!("{LOCK_DIR}/netns-{ino}.lock");
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        loop {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(|e| TraceError::Msg(format!("opening {path}: {e}")))?;
            // SAFETY: flock(2) on a descriptor this function owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                let same = match (file.metadata(), std::fs::metadata(&path)) {
                    (Ok(a), Ok(b)) => a.ino() == b.ino(),
                    _ => false,
                };
                if same {
                    return Ok(NodeLock { _file: file, path });
                }
                continue;
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(TraceError::Msg(format!("locking {path}: {e}")));
            }
            if std::time::Instant::now() >= deadline {
                return Err(TraceError::Msg(format!(
                    "node {node}: another trace has held it for {}s ({path})",
                    LOCK_WAIT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NodeLock {
    fn drop(&mut self) {
        // Removed while still locked; the file, closed after this, unlocks.
        let _ = std::fs::remove_file(&self.path);
    }
}
