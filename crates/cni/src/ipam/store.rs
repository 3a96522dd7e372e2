//! host-local's on-disk state, in the reference plugin's layout so state
//! survives a switch between implementations either way:
//! - `<dataDir>/<network>/<ip>`: one file per reserved address holding
//!   `<containerID>\r\n<ifname>`;
//! - `<dataDir>/<network>/last_reserved_ip.<set>`: the round-robin cursor;
//! - `<dataDir>/<network>/lock`: an exclusive flock held while allocating, so
//!   concurrent ADDs never hand out one address twice.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{CniError, Code};

const LINE_BREAK: &str = "\r\n";
const LAST_PREFIX: &str = "last_reserved_ip.";

/// One reservation made by an ADD, with the cursor content it replaced
/// (`None`: there was no cursor file), so a failed ADD can be undone exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    pub ip: IpAddr,
    pub set: usize,
    prev_last: Option<Vec<u8>>,
}

/// The store with its lock held; the lock is released on drop.
pub struct Store {
    dir: PathBuf,
    _lock: File,
}

fn io_err(what: String, e: io::Error) -> CniError {
    CniError::new(Code::Io, what).with_details(e.to_string())
}

/// Replaces a small file's content in place. Truncating to zero first (as
/// `fs::write` does) makes ext4 free the block and, on close, start writeback
/// (its `auto_da_alloc` heuristic): a third of a millisecond on every ADD.
/// Overwriting and then trimming the tail keeps the block. Readers hold the
/// store lock, so nobody sees the file half written.
fn overwrite(path: &Path, data: &[u8]) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    f.write_all(data)?;
    if f.metadata()?.len() > data.len() as u64 {
        f.set_len(data.len() as u64)?;
    }
    Ok(())
}

impl Store {
    pub fn open(dir: &str) -> Result<Store, CniError> {
        let dir = PathBuf::from(dir);
        fs::create_dir_all(&dir).map_err(|e| io_err(format!("creating {}", dir.display()), e))?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))
            .map_err(|e| io_err(format!("opening {}/lock", dir.display()), e))?;
        // SAFETY: valid fd; flock blocks until the lock is ours.
        loop {
            let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                break;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(io_err(format!("locking {}/lock", dir.display()), e));
            }
        }
        Ok(Store { dir, _lock: lock })
    }

    fn ip_path(&self, ip: IpAddr) -> PathBuf {
        self.dir.join(ip.to_string())
    }

    pub fn is_reserved(&self, ip: IpAddr) -> bool {
        self.ip_path(ip).exists()
    }

    fn last_path(&self, set: usize) -> PathBuf {
        self.dir.join(format!("{LAST_PREFIX}{set}"))
    }

    /// Reserves `ip` for (id, ifname) and moves range set `set`'s cursor to
    /// it; `None` when the address was already taken. A failure leaves
    /// nothing behind.
    pub fn reserve(
        &self,
        id: &str,
        ifname: &str,
        ip: IpAddr,
        set: usize,
    ) -> Result<Option<Reserved>, CniError> {
        let p = self.ip_path(ip);
        let mut f = match OpenOptions::new().write(true).create_new(true).open(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(None),
            Err(e) => return Err(io_err(format!("reserving {}", p.display()), e)),
        };
        let last = self.last_path(set);
        let done = f
            .write_all(format!("{}{LINE_BREAK}{ifname}", id.trim()).as_bytes())
            .map_err(|e| io_err(format!("writing {}", p.display()), e))
            .and_then(|_| match fs::read(&last) {
                Ok(b) => Ok(Some(b)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(io_err(format!("reading {}", last.display()), e)),
            })
            .and_then(|prev_last| {
                overwrite(&last, ip.to_string().as_bytes())
                    .map_err(|e| io_err(format!("writing {}", last.display()), e))?;
                Ok(prev_last)
            });
        match done {
            Ok(prev_last) => Ok(Some(Reserved { ip, set, prev_last })),
            Err(e) => {
                let _ = fs::remove_file(&p);
                Err(e)
            }
        }
    }

    /// Takes back a reservation this process made for (id, ifname): the
    /// address file goes if it still names that attachment, and the cursor
    /// returns to its old content (or absence) if it still points at the
    /// address. A concurrent ADD that moved the cursor since keeps its move.
    pub fn unreserve(&self, r: &Reserved, id: &str, ifname: &str) -> Result<(), CniError> {
        let p = self.ip_path(r.ip);
        match fs::read_to_string(&p) {
            Ok(d) if d.trim() == format!("{}{LINE_BREAK}{ifname}", id.trim()) => {
                self.release(r.ip)?
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(format!("reading {}", p.display()), e)),
        }
        let last = self.last_path(r.set);
        let points_here = fs::read_to_string(&last)
            .ok()
            .and_then(|s| s.trim().parse::<IpAddr>().ok())
            == Some(r.ip);
        if points_here {
            match &r.prev_last {
                Some(b) => overwrite(&last, b),
                None => fs::remove_file(&last),
            }
            .map_err(|e| io_err(format!("restoring {}", last.display()), e))?;
        }
        Ok(())
    }

    pub fn last_reserved(&self, set: usize) -> Option<IpAddr> {
        fs::read_to_string(self.last_path(set))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    pub fn release(&self, ip: IpAddr) -> Result<(), CniError> {
        match fs::remove_file(self.ip_path(ip)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(format!("releasing {ip}"), e)),
        }
    }

    /// Every reservation: (ip, containerID, ifname). Files written by the
    /// old reference layout hold only the container ID.
    pub fn entries(&self) -> Result<Vec<(IpAddr, String, String)>, CniError> {
        let mut out = Vec::new();
        let rd = match fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io_err(format!("reading {}", self.dir.display()), e)),
        };
        for ent in rd.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            let Ok(ip) = name.parse::<IpAddr>() else {
                continue;
            };
            let Ok(data) = fs::read_to_string(ent.path()) else {
                continue;
            };
            let data = data.trim();
            let (id, ifname) = match data.split_once(LINE_BREAK) {
                Some((a, b)) => (a.trim().to_string(), b.trim().to_string()),
                None => (data.to_string(), String::new()),
            };
            out.push((ip, id, ifname));
        }
        out.sort();
        Ok(out)
    }

    /// The addresses held by one attachment.
    pub fn by_id(&self, id: &str, ifname: &str) -> Result<Vec<IpAddr>, CniError> {
        Ok(self
            .entries()?
            .into_iter()
            .filter(|(_, i, f)| i == id && (f == ifname || f.is_empty()))
            .map(|(ip, _, _)| ip)
            .collect())
    }

    /// Releases everything one attachment holds.
    pub fn release_by_id(&self, id: &str, ifname: &str) -> Result<Vec<IpAddr>, CniError> {
        let ips = self.by_id(id, ifname)?;
        for ip in &ips {
            self.release(*ip)?;
        }
        Ok(ips)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overwrite_replaces_longer_and_shorter_content() {
        let dir = std::env::temp_dir().join(format!("pn-store-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("last_reserved_ip.0");
        overwrite(&p, b"10.0.0.9").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "10.0.0.9");
        overwrite(&p, b"10.0.0.10").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "10.0.0.10");
        overwrite(&p, b"10.0.0.2").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "10.0.0.2");
        fs::remove_dir_all(&dir).unwrap();
    }

    fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<(String, Vec<u8>)> = fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn unreserve_restores_the_cursor_exactly() {
        let dir = std::env::temp_dir().join(format!("pn-store-undo-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let s = Store::open(dir.to_str().unwrap()).unwrap();
        let ip = |x: &str| x.parse::<IpAddr>().unwrap();

        // No cursor before: the undo removes the one the reservation wrote.
        let before = snapshot(&dir);
        let r = s.reserve("c1", "eth0", ip("10.0.0.2"), 0).unwrap().unwrap();
        assert_eq!(s.last_reserved(0), Some(ip("10.0.0.2")));
        s.unreserve(&r, "c1", "eth0").unwrap();
        assert_eq!(snapshot(&dir), before);

        // A cursor before (with the reference's exact bytes): put back as it was.
        s.reserve("c1", "eth0", ip("10.0.0.2"), 0).unwrap().unwrap();
        fs::write(dir.join("last_reserved_ip.0"), b"10.0.0.2").unwrap();
        let before = snapshot(&dir);
        let r = s.reserve("c2", "eth0", ip("10.0.0.3"), 0).unwrap().unwrap();
        s.unreserve(&r, "c2", "eth0").unwrap();
        assert_eq!(snapshot(&dir), before);

        // Taken addresses are refused; a cursor someone moved since stays.
        assert_eq!(s.reserve("c3", "eth0", ip("10.0.0.2"), 0).unwrap(), None);
        let r = s.reserve("c3", "eth0", ip("10.0.0.3"), 0).unwrap().unwrap();
        s.reserve("c4", "eth0", ip("10.0.0.4"), 0).unwrap().unwrap();
        s.unreserve(&r, "c3", "eth0").unwrap();
        assert_eq!(s.last_reserved(0), Some(ip("10.0.0.4")));
        assert!(!s.is_reserved(ip("10.0.0.3")));
        drop(s);
        fs::remove_dir_all(&dir).unwrap();
    }
}
