//! Netlink wire format: message building, attribute parsing and a blocking
//! request/ack socket.
//!
//! This is the only place that knows byte layouts. It is deliberately small
//! and synchronous: a CNI plugin lives for a few milliseconds, so an async
//! runtime or a large typed crate would cost more than it saves. The same
//! framing serves rtnetlink and nfnetlink (nftables batches, conntrack dumps
//! and the packets of an nflog group, which arrive unprompted: see
//! [`Socket::recv_messages`]).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use crate::KernelError;

pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_MULTI: u16 = 0x2;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_DUMP: u16 = 0x300;
pub const NLM_F_REPLACE: u16 = 0x100;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_APPEND: u16 = 0x800;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;
const NETLINK_CAP_ACK: i32 = 10;
const NETLINK_EXT_ACK: i32 = 11;
const NETLINK_GET_STRICT_CHK: i32 = 12;
const NLMSGERR_ATTR_MSG: u16 = 1;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// A netlink message under construction: header, fixed family header, then
/// attributes (possibly nested).
pub struct Msg {
    buf: Vec<u8>,
    nests: Vec<usize>,
}

impl Msg {
    pub fn new(msg_type: u16, flags: u16) -> Self {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // len, patched in finish
        buf.extend_from_slice(&msg_type.to_ne_bytes());
        buf.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // seq
        buf.extend_from_slice(&0u32.to_ne_bytes()); // pid
        Msg {
            buf,
            nests: Vec::new(),
        }
    }

    /// Appends raw bytes (a family header such as ifinfomsg), padded to 4.
    pub fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(bytes);
        self.buf.resize(align4(self.buf.len()), 0);
        self
    }

    pub fn attr(&mut self, ty: u16, payload: &[u8]) -> &mut Self {
        let len = 4 + payload.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.buf.resize(align4(self.buf.len()), 0);
        self
    }

    pub fn u8(&mut self, ty: u16, v: u8) -> &mut Self {
        self.attr(ty, &[v])
    }
    pub fn u16(&mut self, ty: u16, v: u16) -> &mut Self {
        self.attr(ty, &v.to_ne_bytes())
    }
    pub fn u16_be(&mut self, ty: u16, v: u16) -> &mut Self {
        self.attr(ty, &v.to_be_bytes())
    }
    pub fn u32(&mut self, ty: u16, v: u32) -> &mut Self {
        self.attr(ty, &v.to_ne_bytes())
    }
    pub fn u32_be(&mut self, ty: u16, v: u32) -> &mut Self {
        self.attr(ty, &v.to_be_bytes())
    }
    pub fn u64_be(&mut self, ty: u16, v: u64) -> &mut Self {
        self.attr(ty, &v.to_be_bytes())
    }
    /// A NUL-terminated string attribute.
    pub fn str(&mut self, ty: u16, s: &str) -> &mut Self {
        let mut b = Vec::with_capacity(s.len() + 1);
        b.extend_from_slice(s.as_bytes());
        b.push(0);
        self.attr(ty, &b)
    }

    /// Opens a nested attribute; close it with [`Msg::end`].
    pub fn begin(&mut self, ty: u16) -> &mut Self {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        self
    }

    /// Opens a container whose type must not carry the nested flag
    /// (veth's peer, for example, which older parsers reject with it).
    pub fn begin_plain(&mut self, ty: u16) -> &mut Self {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self
    }

    pub fn end(&mut self) -> &mut Self {
        let start = self.nests.pop().expect("unbalanced netlink nest");
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }

    pub fn finish(mut self, seq: u32) -> Vec<u8> {
        assert!(self.nests.is_empty(), "unclosed netlink nest");
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.buf
    }
}

/// Iterates over attributes in a byte slice.
pub struct Attrs<'a> {
    data: &'a [u8],
}

impl<'a> Attrs<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Attrs { data }
    }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = (u16, &'a [u8]);
    fn next(&mut self) -> Option<Self::Item> {
        if self.data.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([self.data[0], self.data[1]]) as usize;
        let ty = u16::from_ne_bytes([self.data[2], self.data[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > self.data.len() {
            return None;
        }
        let payload = &self.data[4..len];
        let adv = align4(len).min(self.data.len());
        self.data = &self.data[adv..];
        Some((ty, payload))
    }
}

/// A NETLINK_ROUTE socket in the calling thread's namespace joined to
/// the multicast `groups` (RTMGRP_*), its receive buffer `rcvbuf` bytes:
/// what a caller that follows link, route or neighbour notifications
/// reads from. `nonblocking` for a caller that polls it.
pub fn rtnl_listener(
    groups: u32,
    rcvbuf: i32,
    nonblocking: bool,
) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let flags =
        libc::SOCK_RAW | libc::SOCK_CLOEXEC | if nonblocking { libc::SOCK_NONBLOCK } else { 0 };
    // SAFETY: plain socket(2); the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, flags, libc::NETLINK_ROUTE) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is fresh and ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let _ = set_int_opt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, rcvbuf);
    // SAFETY: a zeroed sockaddr_nl is valid; family and groups set below.
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as u16;
    sa.nl_groups = groups;
    // SAFETY: sa is a valid sockaddr_nl of the size given.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &sa as *const libc::sockaddr_nl as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// `setsockopt` with an `int` value, the shape of nearly every socket
/// option: one place for the unsafe call and its error.
pub fn set_int_opt(
    fd: std::os::fd::RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: setsockopt reads size_of::<c_int>() bytes from a live c_int.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub fn get_u32(b: &[u8]) -> u32 {
    if b.len() >= 4 {
        u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
    } else {
        0
    }
}

pub fn get_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// One message of a received datagram, borrowed from the socket's buffer.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    pub msg_type: u16,
    pub flags: u16,
    pub seq: u32,
    /// Everything after the 16-byte header.
    pub body: &'a [u8],
}

/// Iterates over the messages of one datagram; stops at the first
/// malformed header (a length shorter than a header or past the end).
pub struct Messages<'a> {
    data: &'a [u8],
}

impl<'a> Messages<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Messages { data }
    }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Message<'a>;
    fn next(&mut self) -> Option<Message<'a>> {
        let b = self.data;
        if b.len() < 16 {
            return None;
        }
        let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if len < 16 || len > b.len() {
            self.data = &[];
            return None;
        }
        self.data = &b[align4(len).min(b.len())..];
        Some(Message {
            msg_type: u16::from_ne_bytes([b[4], b[5]]),
            flags: u16::from_ne_bytes([b[6], b[7]]),
            seq: u32::from_ne_bytes([b[8], b[9], b[10], b[11]]),
            body: &b[16..len],
        })
    }
}

/// One received message: its type, flags and body (after the 16-byte header).
pub struct Reply {
    pub msg_type: u16,
    pub body: Vec<u8>,
}

/// Hands one message of a batch to [`Socket::batch_with`].
pub type Push<'a> = &'a mut dyn FnMut(Msg);

/// A blocking netlink socket bound to the network namespace it was opened in.
pub struct Socket {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

impl Socket {
    pub fn open(protocol: i32) -> io::Result<Self> {
        // SAFETY: plain socket(2) call; the fd is owned immediately.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                protocol,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh, valid descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        for opt in [NETLINK_CAP_ACK, NETLINK_EXT_ACK] {
            let _ = set_int_opt(fd.as_raw_fd(), libc::SOL_NETLINK, opt, 1);
        }
        let _ = set_int_opt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 4 << 20);
        // SAFETY: zeroed sockaddr_nl is a valid "any pid" address.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: addr is a valid sockaddr_nl for the size given.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &addr as *const libc::sockaddr_nl as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Socket {
            fd,
            seq: 1,
            // Grown to each datagram's size on receipt: a short-lived CNI
            // plugin should not fault in and zero 64 KiB per socket.
            buf: Vec::new(),
        })
    }

    /// Strict checking makes the kernel honour filters in dump requests
    /// (an address dump for one interface index, say) instead of returning
    /// everything; it also rejects headers with fields it does not filter
    /// on, so it is switched on only around requests built for it.
    pub fn set_strict(&mut self, on: bool) -> io::Result<()> {
        set_int_opt(
            self.fd.as_raw_fd(),
            libc::SOL_NETLINK,
            NETLINK_GET_STRICT_CHK,
            on.into(),
        )
    }

    /// Makes every receive give up after `timeout` with
    /// [`io::ErrorKind::WouldBlock`] (`SO_RCVTIMEO`); `None` waits forever.
    pub fn set_recv_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        // A zero timeval means "no timeout", so a zero duration is rounded
        // up to the smallest one that is not.
        let d = timeout.map_or(Duration::ZERO, |d| d.max(Duration::from_micros(1)));
        // (Field types by inference: musl's libc deprecates the aliases.)
        let tv = libc::timeval {
            tv_sec: d
                .as_secs()
                .min(i32::MAX as u64)
                .try_into()
                .unwrap_or_default(),
            tv_usec: d.subsec_micros().into(),
        };
        // SAFETY: setsockopt reads size_of::<timeval>() bytes from a live timeval.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sets the receive buffer to `bytes`, past `net.core.rmem_max` when
    /// the caller may (`SO_RCVBUFFORCE` needs `CAP_NET_ADMIN`), else as far
    /// as `SO_RCVBUF` goes. For sockets the kernel writes to unprompted: a
    /// full buffer drops what the kernel sends next.
    pub fn set_recv_buffer(&mut self, bytes: i32) -> io::Result<()> {
        let fd = self.fd.as_raw_fd();
        set_int_opt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, bytes)
            .or_else(|_| set_int_opt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, bytes))
    }

    /// Waits for the next datagram and returns its messages, for sockets
    /// that are written to without a request (an nflog group). Errors are
    /// the receive's own: `WouldBlock` after a [`Socket::set_recv_timeout`]
    /// timeout, `ENOBUFS` when the kernel dropped messages because the
    /// receive buffer was full (the socket stays usable).
    pub fn recv_messages(&mut self) -> io::Result<Messages<'_>> {
        let n = self.recv()?;
        Ok(Messages::new(&self.buf[..n]))
    }

    /// [`Socket::recv_messages`] for a listener the kernel writes to
    /// without waiting (a multicast group, a log group): an overrun
    /// (`ENOBUFS`: messages dropped on a full buffer) is added to `lost`
    /// and the wait goes on; a timeout gives `None`. `what` names the
    /// socket in an error.
    pub fn recv_counting(
        &mut self,
        lost: &mut u64,
        what: &dyn Fn() -> String,
    ) -> Result<Option<Messages<'_>>, crate::KernelError> {
        loop {
            match self.recv() {
                Ok(n) => return Ok(Some(Messages::new(&self.buf[..n]))),
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => *lost += 1,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(crate::KernelError::io(format!("reading {}", what()), e)),
            }
        }
    }

    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        // SAFETY: bytes is a valid buffer of the given length.
        let rc = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                bytes.as_ptr() as *const libc::c_void,
                bytes.len(),
                0,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn recv(&mut self) -> io::Result<usize> {
        loop {
            // MSG_PEEK|MSG_TRUNC tells us the datagram size so the buffer can grow.
            // SAFETY: buffer pointer/length are valid.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr() as *mut libc::c_void,
                    0,
                    libc::MSG_PEEK | libc::MSG_TRUNC,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            // Room for the whole datagram (at least 4 KiB, so a socket
            // settles on one allocation), without zeroing it: recv writes
            // the bytes and only those are exposed (set_len below).
            self.buf.clear();
            self.buf.reserve((n as usize).max(4096));
            // SAFETY: the pointer and capacity describe the vector's
            // allocation; recv writes at most that many bytes.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr() as *mut libc::c_void,
                    self.buf.capacity(),
                    0,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            // SAFETY: recv initialised the first n bytes (n <= capacity).
            unsafe { self.buf.set_len(n as usize) };
            return Ok(n as usize);
        }
    }

    /// Sends several messages as one write and waits for an ack for each
    /// message that asked for one (nfnetlink batches). The first error wins;
    /// `describe(i)` names message `i` for the error text.
    pub fn batch(
        &mut self,
        msgs: Vec<Msg>,
        describe: &dyn Fn(usize) -> String,
    ) -> Result<(), KernelError> {
        let mut msgs = Some(msgs);
        self.batch_with(
            &mut |push| {
                for m in msgs.take().into_iter().flatten() {
                    push(m)
                }
            },
            describe,
        )
    }

    /// Like [`Socket::batch`], with the messages produced by `fill` one at a
    /// time and appended to the outgoing buffer as they come: a batch of a
    /// million messages costs its wire size once, not three times over.
    pub fn batch_with(
        &mut self,
        fill: &mut dyn FnMut(Push<'_>),
        describe: &dyn Fn(usize) -> String,
    ) -> Result<(), KernelError> {
        let first = self.seq.wrapping_add(1);
        let mut seq = self.seq;
        let mut bytes: Vec<u8> = Vec::new();
        // Only the last message that wants an ack keeps the flag: errors
        // are reported for any message anyway, and one ack per message would
        // overflow the receive buffer on large batches.
        let mut last_ack: Option<(usize, u32)> = None;
        fill(&mut |m: Msg| {
            seq = seq.wrapping_add(1);
            let mut b = m.finish(seq);
            let f = u16::from_ne_bytes([b[6], b[7]]);
            if f & NLM_F_ACK != 0 {
                last_ack = Some((bytes.len(), seq));
                b[6..8].copy_from_slice(&(f & !NLM_F_ACK).to_ne_bytes());
            }
            bytes.extend_from_slice(&b);
        });
        self.seq = seq;
        let mut pending = None;
        if let Some((off, s)) = last_ack {
            let f = u16::from_ne_bytes([bytes[off + 6], bytes[off + 7]]) | NLM_F_ACK;
            bytes[off + 6..off + 8].copy_from_slice(&f.to_ne_bytes());
            pending = Some(s);
        }
        let index = |s: u32| s.wrapping_sub(first) as usize;
        let bufsize: i32 = (bytes.len().min(i32::MAX as usize / 2) as i32)
            .saturating_mul(2)
            .max(1 << 20);
        // SO_SNDBUFFORCE needs root; without it the send just takes longer.
        let _ = set_int_opt(
            self.fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            bufsize,
        );
        self.send(&bytes)
            .map_err(|e| KernelError::io(describe(0), e))?;
        drop(bytes);
        while let Some(want) = pending {
            let n = self.recv().map_err(|e| KernelError::io(describe(0), e))?;
            for m in Messages::new(&self.buf[..n]) {
                if m.msg_type != NLMSG_ERROR || index(m.seq) > index(seq) {
                    continue;
                }
                let errno = -(get_u32(m.body) as i32);
                if m.seq == want {
                    pending = None;
                }
                if errno != 0 {
                    return Err(KernelError::Netlink {
                        op: describe(index(m.seq)),
                        source: io::Error::from_raw_os_error(errno),
                        detail: extack_msg(m.body, m.flags),
                    });
                }
            }
        }
        Ok(())
    }

    /// Sends a request and collects replies until the ack (or DONE for dumps).
    /// `op` names the operation for error messages.
    pub fn request(
        &mut self,
        msg: Msg,
        op: &dyn Fn() -> String,
    ) -> Result<Vec<Reply>, KernelError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let bytes = msg.finish(seq);
        let flags = u16::from_ne_bytes([bytes[6], bytes[7]]);
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        self.send(&bytes).map_err(|e| KernelError::io(op(), e))?;
        let mut out = Vec::new();
        loop {
            let n = self.recv().map_err(|e| KernelError::io(op(), e))?;
            for m in Messages::new(&self.buf[..n]) {
                if m.seq != seq {
                    continue;
                }
                match m.msg_type {
                    NLMSG_ERROR => {
                        let errno = -(get_u32(m.body) as i32);
                        if errno == 0 {
                            return Ok(out);
                        }
                        return Err(KernelError::Netlink {
                            op: op(),
                            source: io::Error::from_raw_os_error(errno),
                            detail: extack_msg(m.body, m.flags),
                        });
                    }
                    NLMSG_DONE => return Ok(out),
                    ty => {
                        out.push(Reply {
                            msg_type: ty,
                            body: m.body.to_vec(),
                        });
                        if !dump && m.flags & NLM_F_MULTI == 0 && flags & NLM_F_ACK == 0 {
                            return Ok(out);
                        }
                    }
                }
            }
        }
    }
}

/// Extracts the extended-ack text the kernel attaches to an error, if any.
fn extack_msg(body: &[u8], flags: u16) -> Option<String> {
    const NLM_F_CAPPED: u16 = 0x100;
    const NLM_F_ACK_TLVS: u16 = 0x200;
    if flags & NLM_F_ACK_TLVS == 0 || body.len() < 20 {
        return None;
    }
    // error(4) + original header(16) [+ original payload unless capped]
    let mut off = 4 + 16;
    if flags & NLM_F_CAPPED == 0 {
        let orig_len = get_u32(&body[4..8]) as usize;
        off = 4 + align4(orig_len);
    }
    if off > body.len() {
        return None;
    }
    Attrs::new(&body[off..])
        .find(|(t, _)| *t == NLMSGERR_ATTR_MSG)
        .map(|(_, v)| get_str(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_attributes_round_trip() {
        let mut m = Msg::new(16, 0);
        m.raw(&[0u8; 16]);
        m.str(3, "eth0");
        m.begin(18).str(1, "veth").end();
        let bytes = m.finish(7);
        assert_eq!(
            u32::from_ne_bytes(bytes[0..4].try_into().unwrap()) as usize,
            bytes.len()
        );
        let attrs: Vec<_> = Attrs::new(&bytes[32..]).collect();
        assert_eq!(attrs.len(), 2);
        assert_eq!(get_str(attrs[0].1), "eth0");
        assert_eq!(attrs[1].0, 18);
        let inner: Vec<_> = Attrs::new(attrs[1].1).collect();
        assert_eq!(get_str(inner[0].1), "veth");
    }

    #[test]
    fn a_datagram_splits_into_messages_up_to_a_malformed_one() {
        let mut one = Msg::new(0x400, NLM_F_MULTI);
        one.raw(&[2, 0, 0, 7]).str(10, "a");
        let mut two = Msg::new(NLMSG_DONE, 0);
        two.raw(&[0; 3]); // padded to 4
        let mut d = one.finish(5);
        d.extend_from_slice(&two.finish(6));
        let whole: Vec<_> = Messages::new(&d)
            .map(|m| (m.msg_type, m.flags, m.seq, m.body.len()))
            .collect();
        assert_eq!(
            whole,
            vec![
                (0x400, NLM_F_MULTI | NLM_F_REQUEST, 5, 12),
                (NLMSG_DONE, NLM_F_REQUEST, 6, 4)
            ]
        );
        // A length past the end stops the walk rather than reading on.
        d.truncate(d.len() - 1);
        assert_eq!(Messages::new(&d).count(), 1);
        assert_eq!(Messages::new(&d[..15]).count(), 0);
    }
}
