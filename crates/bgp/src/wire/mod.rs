//! BGP messages as bytes and back: the framing every message shares (RFC
//! 4271 §4.1: a marker of sixteen 0xff bytes, a length, a type), the
//! entry points that turn a [`Message`] into bytes and bytes into one, and
//! the decoding error, which carries the NOTIFICATION RFC 4271 §6 says a
//! speaker sends for it, so the session can send it as it is.
//!
//! The codec is pure: bytes in, values out, no socket and no clock. It
//! knows one thing about the session, whether both sides speak 4-octet AS
//! numbers ([`Codec`]), since that changes the UPDATE's layout.
//!
//! Decoding trusts no length in the input: every read is checked against
//! what is left, and nothing is allocated beyond the message's own size
//! (at most [`MAX_LEN`] bytes), so any byte string yields a message, a
//! request for more bytes, or an error, never a panic.
//!
//! Every error is the session-resetting kind of RFC 4271 §6; the "treat
//! as withdraw" handling of RFC 7606 is not done here.

mod as4;
mod attrs;
mod bytes;
mod notification;
mod open;
mod pack;
mod update;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;

use ipnet::IpNet;

pub use attrs::{AsSegment, Origin, PathAttrs, RawAttr};
pub use notification::{
    cease, fsm_error, header_error, open_error, update_error, Notification, RouteRefresh, CEASE,
    FSM_ERROR, HEADER_ERROR, HOLD_TIMER_EXPIRED, OPEN_ERROR, ROUTE_REFRESH_ERROR, UPDATE_ERROR,
};
pub use open::{Capability, GracefulRestart, Open};
pub use pack::{pack, pack_withdrawals};
pub use update::{MpReach, MpUnreach, Update};

/// The largest message RFC 4271 allows (extended messages, RFC 8654, are
/// not negotiated), so the largest buffer a reader ever needs.
pub const MAX_LEN: usize = 4096;

/// The 2-octet AS a speaker with a larger AS number puts where only two
/// octets fit (RFC 6793): the OPEN's My AS, and paths sent to a peer
/// without 4-octet AS support.
pub const AS_TRANS: u16 = 23456;

/// The fixed header: marker, length, type.
const HEADER_LEN: usize = 19;
const MARKER: [u8; 16] = [0xff; 16];

const OPEN: u8 = 1;
const UPDATE: u8 = 2;
const NOTIFICATION: u8 = 3;
const KEEPALIVE: u8 = 4;
const ROUTE_REFRESH: u8 = 5;

/// One BGP message, as the session sends and receives it. An UPDATE is
/// held inline although it is the large variant: a session handles one
/// message at a time, and boxing would only cost every caller a `Box`.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Open(Open),
    Update(Update),
    Notification(Notification),
    Keepalive,
    RouteRefresh(RouteRefresh),
}

impl Message {
    fn kind(&self) -> u8 {
        match self {
            Message::Open(_) => OPEN,
            Message::Update(_) => UPDATE,
            Message::Notification(_) => NOTIFICATION,
            Message::Keepalive => KEEPALIVE,
            Message::RouteRefresh(_) => ROUTE_REFRESH,
        }
    }
}

/// The address families a node speaker carries; others a peer offers are
/// kept as unknown capabilities and never reach routes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum Afi {
    Ipv4,
    Ipv6,
}

impl Afi {
    /// The IANA number on the wire.
    pub fn code(self) -> u16 {
        match self {
            Afi::Ipv4 => 1,
            Afi::Ipv6 => 2,
        }
    }

    /// The family of a prefix.
    pub fn of(p: &IpNet) -> Afi {
        match p {
            IpNet::V4(_) => Afi::Ipv4,
            IpNet::V6(_) => Afi::Ipv6,
        }
    }

    /// None for a family this codec does not carry.
    pub fn from_code(code: u16) -> Option<Afi> {
        match code {
            1 => Some(Afi::Ipv4),
            2 => Some(Afi::Ipv6),
            _ => None,
        }
    }
}

/// Unicast only: pod CIDRs and Service addresses are unicast routes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum Safi {
    Unicast,
}

impl Safi {
    /// The IANA number on the wire.
    pub fn code(self) -> u8 {
        match self {
            Safi::Unicast => 1,
        }
    }

    /// None for a sub-family this codec does not carry.
    pub fn from_code(code: u8) -> Option<Safi> {
        match code {
            1 => Some(Safi::Unicast),
            _ => None,
        }
    }
}

/// What the session negotiated and the codec must know.
#[derive(Clone, Copy, Debug, Default)]
pub struct Codec {
    /// Both sides sent the 4-octet AS capability (RFC 6793): AS_PATH and
    /// AGGREGATOR carry 4-octet AS numbers. Until the OPENs are exchanged
    /// it does not matter (OPEN, KEEPALIVE and NOTIFICATION do not
    /// depend on it).
    pub four_octet_as: bool,
}

/// A message that cannot be sent as asked; the output is left as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// Over [`MAX_LEN`] (or a field over its own length field's range):
    /// split the routes ([`pack()`]) or shorten the data.
    #[error("message longer than {} bytes", MAX_LEN)]
    TooLong,
    /// A value the wire format cannot carry, or an UPDATE a peer would
    /// refuse (routes without ORIGIN, say); the reason says which.
    #[error("cannot encode: {0}")]
    Invalid(String),
}

/// A malformed message: the NOTIFICATION to answer it with (RFC 4271 §6)
/// and, for logs, why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct DecodeError {
    pub code: u8,
    pub subcode: u8,
    /// The NOTIFICATION's data, as §6 prescribes for the error (the bad
    /// length, the offending attribute, ...).
    pub data: Vec<u8>,
    pub reason: String,
}

impl DecodeError {
    pub(crate) fn new(code: u8, subcode: u8, data: Vec<u8>, reason: impl Into<String>) -> Self {
        DecodeError {
            code,
            subcode,
            data,
            reason: reason.into(),
        }
    }

    /// The message to send the peer before closing the session.
    pub fn notification(&self) -> Notification {
        Notification {
            code: self.code,
            subcode: self.subcode,
            data: self.data.clone(),
        }
    }
}

/// What one framing step found at the start of the buffer (the message
/// inline, as in [`Message`]).
#[allow(clippy::large_enum_variant)]
enum Frame {
    /// Not a whole message yet.
    Partial,
    /// A whole message the RFCs say to ignore, of this many bytes.
    Skipped(usize),
    Whole(Message, usize),
}

impl Codec {
    /// Appends one whole message (marker, length, type and body) to `out`.
    /// On error `out` is as it was.
    pub fn encode(&self, m: &Message, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let start = out.len();
        out.extend_from_slice(&MARKER);
        out.extend_from_slice(&[0, 0, m.kind()]);
        let body = match m {
            Message::Open(o) => o.encode_body(out),
            Message::Update(u) => u.encode_body(self, out),
            Message::Notification(n) => {
                n.encode_body(out);
                Ok(())
            }
            Message::Keepalive => Ok(()),
            Message::RouteRefresh(r) => {
                r.encode_body(out);
                Ok(())
            }
        };
        let len = out.len() - start;
        match body {
            Ok(()) if len <= MAX_LEN => {
                out[start + 16..start + 18].copy_from_slice(&(len as u16).to_be_bytes());
                Ok(())
            }
            Ok(()) => {
                out.truncate(start);
                Err(EncodeError::TooLong)
            }
            Err(e) => {
                out.truncate(start);
                Err(e)
            }
        }
    }

    /// Reads the message at the start of `buf`: `Ok(None)` until the
    /// buffer holds a whole one, then the message and the bytes it used
    /// (drop them from the buffer). The header is checked as soon as its
    /// 19 bytes are there, so a broken stream fails without waiting for
    /// a length that will never come.
    ///
    /// A ROUTE-REFRESH for a family this codec does not carry, or of a
    /// subtype RFC 7313 does not define, is skipped as RFC 2918 §4 and
    /// RFC 7313 §5 say: decoding goes on with the next message, and the
    /// byte count returned covers both.
    pub fn decode(&self, buf: &[u8]) -> Result<Option<(Message, usize)>, DecodeError> {
        let mut used = 0;
        loop {
            match self.frame(&buf[used..])? {
                Frame::Partial => return Ok(None),
                Frame::Skipped(n) => used += n,
                Frame::Whole(m, n) => return Ok(Some((m, used + n))),
            }
        }
    }

    fn frame(&self, buf: &[u8]) -> Result<Frame, DecodeError> {
        let Some(header) = buf.first_chunk::<HEADER_LEN>() else {
            return Ok(Frame::Partial);
        };
        let len = check_header(header)?;
        let Some(msg) = buf.get(..len) else {
            return Ok(Frame::Partial);
        };
        let body = &msg[HEADER_LEN..];
        let m = match header[18] {
            OPEN => Message::Open(Open::decode_body(body)?),
            UPDATE => Message::Update(Update::decode_body(self, body)?),
            NOTIFICATION => Message::Notification(Notification::decode_body(body)),
            KEEPALIVE => Message::Keepalive,
            _ => match RouteRefresh::decode_body(msg)? {
                Some(r) => Message::RouteRefresh(r),
                None => return Ok(Frame::Skipped(len)),
            },
        };
        Ok(Frame::Whole(m, len))
    }
}

/// The message length the header announces, once marker, length and
/// type are found sound (RFC 4271 §6.1).
fn check_header(header: &[u8; HEADER_LEN]) -> Result<usize, DecodeError> {
    let [marker @ .., hi, lo, kind] = *header;
    let len_bytes = [hi, lo];
    if marker != MARKER {
        return Err(DecodeError::new(
            HEADER_ERROR,
            header_error::CONNECTION_NOT_SYNCHRONIZED,
            Vec::new(),
            "the message marker is not all ones",
        ));
    }
    let len = usize::from(u16::from_be_bytes(len_bytes));
    let bad_len = |reason: String| {
        DecodeError::new(
            HEADER_ERROR,
            header_error::BAD_MESSAGE_LENGTH,
            len_bytes.to_vec(),
            reason,
        )
    };
    if !(HEADER_LEN..=MAX_LEN).contains(&len) {
        return Err(bad_len(format!(
            "message length {len} is outside {HEADER_LEN}..={MAX_LEN}"
        )));
    }
    let fits = match kind {
        OPEN => len >= HEADER_LEN + 10,
        UPDATE => len >= HEADER_LEN + 4,
        NOTIFICATION => len >= HEADER_LEN + 2,
        KEEPALIVE => len == HEADER_LEN,
        ROUTE_REFRESH => len >= HEADER_LEN + 4,
        _ => {
            return Err(DecodeError::new(
                HEADER_ERROR,
                header_error::BAD_MESSAGE_TYPE,
                vec![kind],
                format!("message type {kind} is unknown"),
            ))
        }
    };
    if !fits {
        return Err(bad_len(format!(
            "message length {len} does not fit message type {kind}"
        )));
    }
    Ok(len)
}
