//! TUN devices: a file descriptor that reads and writes raw IP packets, for
//! the userspace UDP backend.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;

use crate::KernelError;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Opens (creating if needed) TUN device `name` without packet info headers.
pub fn open_tun(name: &str) -> Result<File, KernelError> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(KernelError::Other(format!("invalid TUN name {name:?}")));
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(|e| KernelError::io("opening /dev/net/tun (is the tun module available?)", e))?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: IFF_TUN | IFF_NO_PI,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: f is a valid fd and req a properly laid-out ifreq.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), TUNSETIFF, &mut req as *mut IfReq) };
    if rc < 0 {
        return Err(KernelError::io(
            format!("creating TUN {name}"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(f)
}
