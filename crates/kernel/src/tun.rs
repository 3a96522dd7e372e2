//! TUN devices: a file descriptor that reads and writes IP packets, for the
//! userspace UDP backend.
//!
//! The device is opened with a virtio-net header in front of every packet
//! and with TCP segmentation offload switched on, so the kernel hands over
//! whole TCP super-packets (up to 64 KiB) in one read instead of segmenting
//! them first, and takes super-packets back in one write. That is what lets
//! a userspace tunnel move a TCP stream with one system call per 64 KiB
//! instead of one per 1.4 KiB.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;

use crate::KernelError;

const TUNSETIFF: libc::Ioctl = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const TUNSETOFFLOAD: libc::Ioctl = 0x4004_54d0;
const TUN_F_CSUM: libc::c_uint = 0x01;
const TUN_F_TSO4: libc::c_uint = 0x02;

/// Bytes of `struct virtio_net_hdr` in front of every packet read or written.
pub const VNET_HDR_LEN: usize = 10;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Opens (creating if needed) TUN device `name`. Every read and write
/// carries a [`VNET_HDR_LEN`]-byte virtio-net header before the IP packet;
/// IPv4 TCP may arrive as a super-packet to be segmented (`gso_type` 1) and
/// packets may arrive with their checksum left to finish (`flags` 1).
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
        flags: IFF_TUN | IFF_NO_PI | IFF_VNET_HDR,
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
    // SAFETY: f is a TUN fd; TUNSETOFFLOAD takes the flags by value.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4) };
    if rc < 0 {
        return Err(KernelError::io(
            format!("enabling offloads on TUN {name}"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(f)
}
