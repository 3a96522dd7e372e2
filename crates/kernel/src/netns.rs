//! Network namespaces: open by path, run code inside one, create and remove
//! named ones under `/run/netns` (the `ip netns` layout, so `ip netns exec`
//! and podman see ours and we see theirs).
//!
//! `setns(2)` on a network namespace affects only the calling thread, so
//! [`Netns::run`] switches the current thread and always switches back, even
//! when the closure panics.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};

use crate::KernelError;

pub const NETNS_RUN_DIR: &str = "/run/netns";

/// An open handle on a network namespace.
#[derive(Debug)]
pub struct Netns {
    file: File,
    path: PathBuf,
}

impl Netns {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, KernelError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path)
            .map_err(|e| KernelError::io(format!("opening netns {}", path.display()), e))?;
        Ok(Netns { file, path })
    }

    /// The namespace the calling thread is in now.
    pub fn current() -> Result<Self, KernelError> {
        Self::open("/proc/thread-self/ns/net")
    }

    /// A named namespace under /run/netns.
    pub fn named(name: &str) -> Result<Self, KernelError> {
        Self::open(Path::new(NETNS_RUN_DIR).join(name))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` with the calling thread inside this namespace.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> Result<T, KernelError> {
        let orig = Netns::current()?;
        setns(self.file.as_fd())
            .map_err(|e| KernelError::io(format!("entering netns {}", self.path.display()), e))?;
        struct Back(Netns);
        impl Drop for Back {
            fn drop(&mut self) {
                if let Err(e) = setns(self.0.file.as_fd()) {
                    // Staying in the wrong namespace would corrupt every later
                    // operation on this thread; there is no safe way on.
                    eprintln!("podnet: cannot return to original netns: {e}");
                    std::process::abort();
                }
            }
        }
        let _back = Back(orig);
        Ok(f())
    }

    /// Creates a named namespace (like `ip netns add NAME`).
    pub fn create_named(name: &str) -> Result<Self, KernelError> {
        let op = || format!("creating netns {name}");
        std::fs::create_dir_all(NETNS_RUN_DIR).map_err(|e| KernelError::io(op(), e))?;
        shared_run_dir()
            .map_err(|e| KernelError::io(format!("making {NETNS_RUN_DIR} a shared mount"), e))?;
        let path = Path::new(NETNS_RUN_DIR).join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| KernelError::io(op(), e))?;
        let target = path.clone();
        // A fresh thread unshares so the caller's thread is never moved.
        let res = std::thread::spawn(move || -> io::Result<()> {
            // SAFETY: unshare affects only this short-lived thread.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            bind_mount("/proc/thread-self/ns/net", &target)
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("netns thread panicked")));
        if let Err(e) = res {
            let _ = std::fs::remove_file(&path);
            return Err(KernelError::io(op(), e));
        }
        let ns = Netns::open(&path)?;
        // Bring loopback up: every namespace we make is meant to be used.
        ns.run(|| -> Result<(), KernelError> {
            let mut h = crate::Handle::new()?;
            h.set_up_by_name("lo")
        })??;
        Ok(ns)
    }

    /// Removes a named namespace (like `ip netns del NAME`). Missing is fine.
    pub fn delete_named(name: &str) -> Result<(), KernelError> {
        let path = Path::new(NETNS_RUN_DIR).join(name);
        let c = cstr(&path);
        // SAFETY: c is a valid C string.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(KernelError::io(format!("deleting netns {name}"), e)),
        }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

fn cstr(p: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

fn mount(src: &Path, dst: &Path, flags: libc::c_ulong) -> io::Result<()> {
    let (s, d, none) = (cstr(src), cstr(dst), c"none");
    // SAFETY: valid C strings; no data.
    match unsafe {
        libc::mount(
            s.as_ptr(),
            d.as_ptr(),
            none.as_ptr(),
            flags,
            std::ptr::null(),
        )
    } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Makes [`NETNS_RUN_DIR`] a shared mount point before the first
/// namespace is mounted in it, as `ip netns add` does (bound onto itself
/// when it is not a mount point yet). Otherwise a later `ip netns add`
/// (anyone's) binds it onto itself then, copying our namespaces' mounts
/// on top and leaving the originals underneath, where `delete_named`
/// cannot reach them ("Device or resource busy"). A lock file keeps two
/// processes from binding it twice.
fn shared_run_dir() -> io::Result<()> {
    let dir = Path::new(NETNS_RUN_DIR);
    let shared = || mount(Path::new(""), dir, libc::MS_SHARED | libc::MS_REC);
    if shared().is_ok() {
        return Ok(());
    }
    let lock = File::create("/run/podnet-netns.lock")?;
    // SAFETY: flock on an fd we own; released when `lock` is dropped.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io::Error::last_os_error());
    }
    match shared() {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            mount(dir, dir, libc::MS_BIND | libc::MS_REC)?;
            shared()
        }
        r => r,
    }
}

fn bind_mount(src: &str, dst: &Path) -> io::Result<()> {
    let s = std::ffi::CString::new(src).expect("static path");
    let d = cstr(dst);
    // SAFETY: valid C strings, null fs type and data are allowed for MS_BIND.
    let rc = unsafe {
        libc::mount(
            s.as_ptr(),
            d.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn setns(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: fd is a valid namespace descriptor.
    if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes a sysctl in the calling thread's network namespace
/// (`/proc/sys/net` follows the opener's namespace).
pub fn write_sysctl(key: &str, value: &str) -> Result<(), KernelError> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    std::fs::write(&path, value)
        .map_err(|e| KernelError::io(format!("setting sysctl {key}={value}"), e))
}

pub fn read_sysctl(key: &str) -> Result<String, KernelError> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_string())
        .map_err(|e| KernelError::io(format!("reading sysctl {key}"), e))
}

/// How `link`, a link of the calling thread's network namespace, got its
/// MAC address: its `addr_assign_type` ([`crate::rtnl::NET_ADDR_PERM`],
/// `NET_ADDR_RANDOM` = 1, `NET_ADDR_STOLEN` = 2 or
/// [`crate::rtnl::NET_ADDR_SET`]). rtnetlink does not carry it; sysfs does,
/// but a sysfs mount shows the devices of the namespace that mounted it.
/// So this reads the process's `/sys` when the device there is this one
/// (same index and MAC: a plugin run in the node's own namespace), and
/// otherwise a sysfs of the calling thread's namespace, mounted in a
/// private mount namespace of a short-lived thread (as `ip netns exec`
/// does), which goes away with the thread.
pub fn addr_assign_type(link: &crate::Link) -> Result<u8, KernelError> {
    let dir = format!("/sys/class/net/{}", link.name);
    let read =
        |attr: &str| std::fs::read_to_string(format!("{dir}/{attr}")).map(|s| s.trim().to_string());
    let same = read("ifindex").ok() == Some(link.index.to_string())
        && read("address").ok() == Some(link.mac_string());
    let path = format!("{dir}/addr_assign_type");
    let text = if same {
        read("addr_assign_type")
    } else {
        read_own_sysfs(&Netns::current()?, &path)
    }
    .map_err(|e| KernelError::io(format!("reading {path}"), e))?;
    text.parse()
        .map_err(|_| KernelError::Other(format!("{path}: {text:?} is not a number")))
}

/// Reads `path` (under `/sys`) from a sysfs mounted fresh inside `ns`, on a
/// thread with its own mount namespace, so nothing is mounted anywhere
/// else and nothing outlives the thread.
fn read_own_sysfs(ns: &Netns, path: &str) -> io::Result<String> {
    let fd = ns.file.try_clone()?;
    let path = path.to_string();
    std::thread::spawn(move || -> io::Result<String> {
        setns(fd.as_fd())?;
        // SAFETY: unshare affects only this thread (a new mount namespace,
        // which implies its own fs_struct).
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let root = cstr(Path::new("/"));
        let sys = cstr(Path::new("/sys"));
        let kind = std::ffi::CString::new("sysfs").expect("static");
        // SAFETY: valid C strings; the first call only changes propagation
        // (so the mount below stays in this namespace), the second mounts
        // a sysfs, which shows the calling thread's network namespace.
        unsafe {
            if libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            if libc::mount(
                kind.as_ptr(),
                sys.as_ptr(),
                kind.as_ptr(),
                0,
                std::ptr::null(),
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        std::fs::read_to_string(&path).map(|s| s.trim().to_string())
    })
    .join()
    .unwrap_or_else(|_| Err(io::Error::other("sysfs thread panicked")))
}
