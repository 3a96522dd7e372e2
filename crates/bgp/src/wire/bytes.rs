//! Reading bytes with every length checked, and writing a length field
//! after the contents it counts. Decoding goes through [`Reader`] only, so
//! no slice is ever indexed past its end whatever the peer sends: a short
//! read is a `None` the caller turns into the NOTIFICATION that fits.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::EncodeError;

/// A cursor over a byte slice that hands out only what is there.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// What is left, without consuming it.
    pub(crate) fn rest(&self) -> &'a [u8] {
        self.buf
    }

    pub(crate) fn peek(&self) -> Option<u8> {
        self.buf.first().copied()
    }

    /// The next `n` bytes, or None (and nothing consumed) if fewer are left.
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.buf.len() {
            return None;
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Some(head)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|[b]| b)
    }

    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_be_bytes)
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_be_bytes)
    }

    pub(crate) fn ipv4(&mut self) -> Option<Ipv4Addr> {
        self.array::<4>().map(Ipv4Addr::from)
    }

    pub(crate) fn ipv6(&mut self) -> Option<Ipv6Addr> {
        self.array::<16>().map(Ipv6Addr::from)
    }
}

/// Reserves a 2-byte length field at the end of `out`; [`patch_u16`]
/// fills it once the contents follow it.
pub(crate) fn reserve_u16(out: &mut Vec<u8>) -> usize {
    out.extend_from_slice(&[0, 0]);
    out.len()
}

/// Writes the number of bytes after `at` into the field reserved just
/// before it.
pub(crate) fn patch_u16(out: &mut [u8], at: usize) -> Result<(), EncodeError> {
    let len = u16::try_from(out.len() - at).map_err(|_| EncodeError::TooLong)?;
    out[at - 2..at].copy_from_slice(&len.to_be_bytes());
    Ok(())
}
