//! NOTIFICATION (RFC 4271 §4.5), its error codes and their names, and the
//! ROUTE-REFRESH message (RFC 2918, with RFC 7313's subtypes), which is
//! four bytes and shares the error code space.
//!
//! The codes are named here once so that the codec's errors and the
//! session's own NOTIFICATIONs (hold timer, FSM errors, cease) use the same
//! numbers, and a received NOTIFICATION can be logged by name.

use super::bytes::Reader;
use super::{Afi, DecodeError, Safi, HEADER_LEN};

/// Error codes (RFC 4271 §4.5, RFC 7313).
pub const HEADER_ERROR: u8 = 1;
pub const OPEN_ERROR: u8 = 2;
pub const UPDATE_ERROR: u8 = 3;
pub const HOLD_TIMER_EXPIRED: u8 = 4;
pub const FSM_ERROR: u8 = 5;
pub const CEASE: u8 = 6;
pub const ROUTE_REFRESH_ERROR: u8 = 7;

/// Subcodes of [`HEADER_ERROR`].
pub mod header_error {
    pub const CONNECTION_NOT_SYNCHRONIZED: u8 = 1;
    pub const BAD_MESSAGE_LENGTH: u8 = 2;
    pub const BAD_MESSAGE_TYPE: u8 = 3;
}

/// Subcodes of [`OPEN_ERROR`]; 0 is "unspecific",
/// used for malformed optional parameters and capabilities, which RFC
/// 4271 and RFC 5492 give no subcode of their own.
pub mod open_error {
    pub const UNSPECIFIC: u8 = 0;
    pub const UNSUPPORTED_VERSION: u8 = 1;
    pub const BAD_PEER_AS: u8 = 2;
    pub const BAD_BGP_IDENTIFIER: u8 = 3;
    pub const UNSUPPORTED_OPTIONAL_PARAMETER: u8 = 4;
    pub const UNACCEPTABLE_HOLD_TIME: u8 = 6;
    pub const UNSUPPORTED_CAPABILITY: u8 = 7;
}

/// Subcodes of [`UPDATE_ERROR`].
pub mod update_error {
    pub const MALFORMED_ATTRIBUTE_LIST: u8 = 1;
    pub const UNRECOGNIZED_WELL_KNOWN: u8 = 2;
    pub const MISSING_WELL_KNOWN: u8 = 3;
    pub const ATTRIBUTE_FLAGS: u8 = 4;
    pub const ATTRIBUTE_LENGTH: u8 = 5;
    pub const INVALID_ORIGIN: u8 = 6;
    pub const INVALID_NEXT_HOP: u8 = 8;
    pub const OPTIONAL_ATTRIBUTE: u8 = 9;
    pub const INVALID_NETWORK_FIELD: u8 = 10;
    pub const MALFORMED_AS_PATH: u8 = 11;
}

/// Subcodes of [`FSM_ERROR`] (RFC 6608).
pub mod fsm_error {
    pub const UNSPECIFIED: u8 = 0;
    pub const UNEXPECTED_IN_OPEN_SENT: u8 = 1;
    pub const UNEXPECTED_IN_OPEN_CONFIRM: u8 = 2;
    pub const UNEXPECTED_IN_ESTABLISHED: u8 = 3;
}

/// Subcodes of [`CEASE`] (RFC 4486, RFC 8538, RFC 9384).
pub mod cease {
    pub const MAX_PREFIXES: u8 = 1;
    pub const ADMINISTRATIVE_SHUTDOWN: u8 = 2;
    pub const PEER_DECONFIGURED: u8 = 3;
    pub const ADMINISTRATIVE_RESET: u8 = 4;
    pub const CONNECTION_REJECTED: u8 = 5;
    pub const OTHER_CONFIGURATION_CHANGE: u8 = 6;
    pub const CONNECTION_COLLISION: u8 = 7;
    pub const OUT_OF_RESOURCES: u8 = 8;
    pub const HARD_RESET: u8 = 9;
    pub const BFD_DOWN: u8 = 10;
}

/// The last message of a session: why it ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    pub code: u8,
    pub subcode: u8,
    pub data: Vec<u8>,
}

/// Names by code, then subcode names from 1 on ("" for deprecated ones).
fn names(code: u8) -> Option<(&'static str, &'static [&'static str])> {
    Some(match code {
        HEADER_ERROR => (
            "Message Header Error",
            &[
                "Connection Not Synchronized",
                "Bad Message Length",
                "Bad Message Type",
            ],
        ),
        OPEN_ERROR => (
            "OPEN Message Error",
            &[
                "Unsupported Version Number",
                "Bad Peer AS",
                "Bad BGP Identifier",
                "Unsupported Optional Parameter",
                "",
                "Unacceptable Hold Time",
                "Unsupported Capability",
                "",
                "",
                "",
                "Role Mismatch",
            ],
        ),
        UPDATE_ERROR => (
            "UPDATE Message Error",
            &[
                "Malformed Attribute List",
                "Unrecognized Well-known Attribute",
                "Missing Well-known Attribute",
                "Attribute Flags Error",
                "Attribute Length Error",
                "Invalid ORIGIN Attribute",
                "",
                "Invalid NEXT_HOP Attribute",
                "Optional Attribute Error",
                "Invalid Network Field",
                "Malformed AS_PATH",
            ],
        ),
        HOLD_TIMER_EXPIRED => ("Hold Timer Expired", &[]),
        FSM_ERROR => (
            "Finite State Machine Error",
            &[
                "Receive Unexpected Message in OpenSent State",
                "Receive Unexpected Message in OpenConfirm State",
                "Receive Unexpected Message in Established State",
            ],
        ),
        CEASE => (
            "Cease",
            &[
                "Maximum Number of Prefixes Reached",
                "Administrative Shutdown",
                "Peer De-configured",
                "Administrative Reset",
                "Connection Rejected",
                "Other Configuration Change",
                "Connection Collision Resolution",
                "Out of Resources",
                "Hard Reset",
                "BFD Down",
            ],
        ),
        ROUTE_REFRESH_ERROR => ("ROUTE-REFRESH Message Error", &["Invalid Message Length"]),
        _ => return None,
    })
}

impl Notification {
    /// The way a session ends on purpose (RFC 4486 subcodes, [`cease`]).
    pub fn cease(subcode: u8) -> Notification {
        Notification {
            code: CEASE,
            subcode,
            data: Vec::new(),
        }
    }

    /// The error's name for logs, "Code/Subcode" ("Hold Timer Expired",
    /// "Cease/Administrative Shutdown"), with the operator's shutdown
    /// message (RFC 9003) when a Cease carries one. Numbers stand in for
    /// names this codec does not know.
    pub fn describe(&self) -> String {
        let Some((name, subs)) = names(self.code) else {
            return format!("error code {}/subcode {}", self.code, self.subcode);
        };
        let mut s = match usize::from(self.subcode)
            .checked_sub(1)
            .map(|i| subs.get(i))
        {
            None => name.to_string(),
            Some(Some(sub)) if !sub.is_empty() => format!("{name}/{sub}"),
            Some(_) => format!("{name}/subcode {}", self.subcode),
        };
        if let Some(msg) = self.shutdown_message() {
            s.push_str(&format!(": {msg:?}"));
        }
        s
    }

    /// RFC 9003: a Cease for shutdown or reset may carry a length byte
    /// and that many bytes of UTF-8 from the operator.
    fn shutdown_message(&self) -> Option<&str> {
        let shutdown = [cease::ADMINISTRATIVE_SHUTDOWN, cease::ADMINISTRATIVE_RESET];
        if self.code != CEASE || !shutdown.contains(&self.subcode) {
            return None;
        }
        let (len, text) = self.data.split_first()?;
        let text = text.get(..usize::from(*len))?;
        std::str::from_utf8(text).ok().filter(|t| !t.is_empty())
    }

    pub(crate) fn encode_body(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[self.code, self.subcode]);
        out.extend_from_slice(&self.data);
    }

    /// Any code is taken: RFC 4271 asks nothing of a received one.
    pub(crate) fn decode_body(body: &[u8]) -> Notification {
        let (code, subcode, data) = match body {
            [code, subcode, data @ ..] => (*code, *subcode, data.to_vec()),
            _ => (0, 0, Vec::new()),
        };
        Notification {
            code,
            subcode,
            data,
        }
    }
}

/// A request to send a family's routes again (subtype 0), or the brackets
/// around such a resend (RFC 7313).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RouteRefresh {
    pub afi: Afi,
    pub safi: Safi,
    /// 0: request; 1: Beginning of Route Refresh; 2: End of Route Refresh.
    pub subtype: u8,
}

impl RouteRefresh {
    pub(crate) fn encode_body(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.afi.code().to_be_bytes());
        out.extend_from_slice(&[self.subtype, self.safi.code()]);
    }

    /// None for a message to ignore: a family not carried here, or a
    /// subtype other than 0, 1, 2. `msg` is the whole message (header
    /// included), which RFC 7313's length error sends back.
    pub(crate) fn decode_body(msg: &[u8]) -> Result<Option<RouteRefresh>, DecodeError> {
        let mut r = Reader::new(msg.get(HEADER_LEN..).unwrap_or_default());
        let (Some(afi), Some(subtype), Some(safi)) = (r.u16(), r.u8(), r.u8()) else {
            return Err(bad_length(msg, 0));
        };
        if !r.is_empty() {
            return Err(bad_length(msg, subtype));
        }
        Ok(
            match (Afi::from_code(afi), Safi::from_code(safi), subtype) {
                (Some(afi), Some(safi), 0..=2) => Some(RouteRefresh { afi, safi, subtype }),
                _ => None,
            },
        )
    }
}

/// A ROUTE-REFRESH of the wrong length: RFC 7313 §5's own error for the
/// bracketing subtypes, else a header length error (RFC 4271 §6.1; no
/// Outbound Route Filter is negotiated, so a request is 4 bytes).
fn bad_length(msg: &[u8], subtype: u8) -> DecodeError {
    let reason = format!("ROUTE-REFRESH of {} bytes", msg.len());
    if matches!(subtype, 1 | 2) {
        return DecodeError::new(ROUTE_REFRESH_ERROR, 1, msg.to_vec(), reason);
    }
    let len = (msg.len() as u16).to_be_bytes().to_vec();
    DecodeError::new(HEADER_ERROR, header_error::BAD_MESSAGE_LENGTH, len, reason)
}
