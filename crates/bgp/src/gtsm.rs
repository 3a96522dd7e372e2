//! The Generalized TTL Security Mechanism (RFC 5082) on a socket: send
//! with TTL (IPv6: hop limit) 255, and have the kernel drop whatever
//! arrives with less (`IP_MINTTL`, `IPV6_MINHOPCOUNT`). A router
//! decrements the TTL, so a packet that arrives with 255 was sent by
//! something on the link: a pod, or any host behind a router, that forges
//! a node's address never reaches the session, however it sets its TTL.
//! The kernel counts each drop (TcpExt TCPMinTTLDrop).
//!
//! BGP over TCP and BFD over UDP (RFC 5881 asks the same) both use it.

use std::os::fd::AsRawFd;

/// The TTL sent, and the least taken.
pub const TTL: u8 = 255;

fn set(fd: &impl AsRawFd, level: libc::c_int, name: libc::c_int, v: u8) -> std::io::Result<()> {
    let v = libc::c_int::from(v);
    // SAFETY: a socket the caller owns, an int option of the right size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    match r {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Sends with TTL (hop limit) 255: needed on a listener too, for the
/// SYN-ACK a GTSM peer checks.
pub fn send_255(fd: &impl AsRawFd, v6: bool) -> std::io::Result<()> {
    match v6 {
        false => set(fd, libc::IPPROTO_IP, libc::IP_TTL, TTL),
        true => set(fd, libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS, TTL),
    }
}

/// Takes only packets that arrive with TTL (hop limit) 255 when `on`;
/// anything when not (a socket may have inherited the check from its
/// listener).
pub fn min_ttl(fd: &impl AsRawFd, v6: bool, on: bool) -> std::io::Result<()> {
    let v = if on { TTL } else { 0 };
    match v6 {
        false => set(fd, libc::IPPROTO_IP, libc::IP_MINTTL, v),
        true => set(fd, libc::IPPROTO_IPV6, libc::IPV6_MINHOPCOUNT, v),
    }
}

/// Both: a session with a neighbour on the link.
pub fn secure(fd: &impl AsRawFd, v6: bool) -> std::io::Result<()> {
    send_255(fd, v6)?;
    min_ttl(fd, v6, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel holds what was set (read back with getsockopt).
    #[test]
    fn the_options_are_set_on_both_families() {
        fn get(fd: &impl AsRawFd, level: libc::c_int, name: libc::c_int) -> libc::c_int {
            let mut v: libc::c_int = -1;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: as in `set`, reading back.
            let r = unsafe {
                libc::getsockopt(
                    fd.as_raw_fd(),
                    level,
                    name,
                    &mut v as *mut libc::c_int as *mut libc::c_void,
                    &mut len,
                )
            };
            assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
            v
        }
        let v4 = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        secure(&v4, false).unwrap();
        assert_eq!(get(&v4, libc::IPPROTO_IP, libc::IP_TTL), 255);
        assert_eq!(get(&v4, libc::IPPROTO_IP, libc::IP_MINTTL), 255);
        min_ttl(&v4, false, false).unwrap();
        assert_eq!(get(&v4, libc::IPPROTO_IP, libc::IP_MINTTL), 0);
        let v6 = std::net::UdpSocket::bind("[::1]:0").unwrap();
        secure(&v6, true).unwrap();
        assert_eq!(get(&v6, libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS), 255);
        assert_eq!(get(&v6, libc::IPPROTO_IPV6, libc::IPV6_MINHOPCOUNT), 255);
    }
}
