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
