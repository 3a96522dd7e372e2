//! OPEN (RFC 4271 §4.2) and the capabilities it advertises (RFC 5492):
//! what two speakers agree on before any route moves, so the session can
//! compare both sides' lists.
//!
//! The version is always 4. Capabilities travel in one optional parameter
//! of type 2; a peer may split them over several, and may use RFC 9072's
//! extended parameter length, which is read and, only when the list is
//! over 255 bytes, written. A capability this codec does not parse, or a
//! multiprotocol one for a family it does not carry, is kept as
//! [`Capability::Unknown`], so an OPEN from a router offering every
//! family still opens a session for the families both carry.

use std::net::Ipv4Addr;

use super::bytes::{patch_u16, reserve_u16, Reader};
use super::notification::open_error;
use super::{Afi, DecodeError, EncodeError, Safi, AS_TRANS, OPEN_ERROR};

const VERSION: u8 = 4;
const PARAM_CAPABILITIES: u8 = 2;
/// RFC 9072: the parameter length and type bytes that announce the
/// extended form.
const PARAM_EXTENDED: u8 = 255;

const CAP_MULTIPROTOCOL: u8 = 1;
const CAP_ROUTE_REFRESH: u8 = 2;
const CAP_GRACEFUL_RESTART: u8 = 64;
const CAP_FOUR_OCTET_AS: u8 = 65;
const CAP_ENHANCED_ROUTE_REFRESH: u8 = 70;

/// The first message of a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Open {
    /// The speaker's real AS. On the wire, My AS is [`AS_TRANS`] when
    /// this is over 65535, and the [`Capability::FourOctetAs`] (which the
    /// sender must list) carries it; on decode it is taken from that
    /// capability when there is one.
    pub asn: u32,
    /// Seconds; 0 means no keepalives, 1 and 2 are refused on decode.
    pub hold_time: u16,
    /// Never 0.0.0.0 (RFC 6286); decoding refuses it.
    pub router_id: Ipv4Addr,
    pub capabilities: Vec<Capability>,
}

/// What a speaker says it supports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Capability {
    /// RFC 4760: the speaker carries this family.
    Multiprotocol(Afi, Safi),
    /// RFC 2918.
    RouteRefresh,
    /// RFC 7313: refreshes bracketed by BoRR and EoRR.
    EnhancedRouteRefresh,
    /// RFC 6793: the speaker's 4-octet AS.
    FourOctetAs(u32),
    /// RFC 4724.
    GracefulRestart(GracefulRestart),
    /// Anything else, as it came, so it can be logged or compared.
    Unknown { code: u8, value: Vec<u8> },
}

/// The graceful restart capability (RFC 4724 §3): whether the peer is
/// restarting now and which families' forwarding survived it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GracefulRestart {
    /// R bit: the sender has restarted and its peer should not wait for
    /// its own End-of-RIB before sending.
    pub restarting: bool,
    /// N bit (RFC 8538): NOTIFICATIONs keep routes too, except Hard Reset.
    pub notification: bool,
    /// Restart time in seconds; 12 bits (at most 4095).
    pub time: u16,
    /// The families kept across a restart, each with whether their
    /// forwarding state was preserved. Families this codec does not carry
    /// are left out on decode.
    pub families: Vec<(Afi, Safi, bool)>,
}

impl Open {
    /// The peer's real AS: the 4-octet capability's value, else the
    /// 2-octet field.
    pub fn peer_asn(&self) -> u32 {
        self.capabilities
            .iter()
            .find_map(|c| match c {
                Capability::FourOctetAs(asn) => Some(*asn),
                _ => None,
            })
            .unwrap_or(self.asn)
    }

    pub(crate) fn encode_body(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let my_as = u16::try_from(self.asn).unwrap_or(AS_TRANS);
        out.push(VERSION);
        out.extend_from_slice(&my_as.to_be_bytes());
        out.extend_from_slice(&self.hold_time.to_be_bytes());
        out.extend_from_slice(&self.router_id.octets());
        let mut caps = Vec::new();
        for c in &self.capabilities {
            c.encode(&mut caps)?;
        }
        if caps.is_empty() {
            out.push(0);
        } else if caps.len() <= 253 {
            out.extend_from_slice(&[caps.len() as u8 + 2, PARAM_CAPABILITIES, caps.len() as u8]);
            out.extend_from_slice(&caps);
        } else {
            out.extend_from_slice(&[PARAM_EXTENDED, PARAM_EXTENDED]);
            let all = reserve_u16(out);
            out.push(PARAM_CAPABILITIES);
            let param = reserve_u16(out);
            out.extend_from_slice(&caps);
            patch_u16(out, param)?;
            patch_u16(out, all)?;
        }
        Ok(())
    }

    /// The checks of RFC 4271 §6.2, with RFC 6286 for the identifier and
    /// RFC 7607 for AS 0. Whether the AS is the one configured for the
    /// peer is the session's to check (Bad Peer AS, [`open_error`]).
    pub(crate) fn decode_body(body: &[u8]) -> Result<Open, DecodeError> {
        let mut r = Reader::new(body);
        let (Some(version), Some(my_as), Some(hold_time), Some(router_id)) =
            (r.u8(), r.u16(), r.u16(), r.ipv4())
        else {
            return Err(malformed("OPEN shorter than its fixed fields"));
        };
        if version != VERSION {
            return Err(DecodeError::new(
                OPEN_ERROR,
                open_error::UNSUPPORTED_VERSION,
                u16::from(VERSION).to_be_bytes().to_vec(),
                format!("BGP version {version} (only 4 is spoken)"),
            ));
        }
        if matches!(hold_time, 1 | 2) {
            return Err(open_err(
                open_error::UNACCEPTABLE_HOLD_TIME,
                format!("hold time {hold_time}s (must be 0 or at least 3)"),
            ));
        }
        if router_id.is_unspecified() {
            return Err(open_err(
                open_error::BAD_BGP_IDENTIFIER,
                "BGP identifier 0.0.0.0",
            ));
        }
        let capabilities = decode_params(&mut r)?;
        let mut open = Open {
            asn: u32::from(my_as),
            hold_time,
            router_id,
            capabilities,
        };
        open.asn = open.peer_asn();
        if my_as == 0 || open.asn == 0 {
            return Err(open_err(open_error::BAD_PEER_AS, "peer AS 0 (RFC 7607)"));
        }
        Ok(open)
    }
}

fn open_err(subcode: u8, reason: impl Into<String>) -> DecodeError {
    DecodeError::new(OPEN_ERROR, subcode, Vec::new(), reason)
}

fn malformed(reason: impl Into<String>) -> DecodeError {
    open_err(open_error::UNSPECIFIC, reason)
}

/// The optional parameters, which must fill the rest of the OPEN exactly.
fn decode_params(r: &mut Reader) -> Result<Vec<Capability>, DecodeError> {
    let len = r.u8().unwrap_or_default();
    let extended = len == PARAM_EXTENDED && r.peek() == Some(PARAM_EXTENDED);
    let params = if extended {
        r.u8();
        r.u16().and_then(|len| r.take(usize::from(len)))
    } else {
        r.take(usize::from(len))
    };
    let Some(params) = params.filter(|_| r.is_empty()) else {
        return Err(malformed(
            "optional parameters length does not match the OPEN's length",
        ));
    };
    let mut r = Reader::new(params);
    let mut caps = Vec::new();
    while let Some(kind) = r.u8() {
        let len = if extended {
            r.u16().map(usize::from)
        } else {
            r.u8().map(usize::from)
        };
        let Some(value) = len.and_then(|len| r.take(len)) else {
            return Err(malformed("optional parameter runs past the parameters"));
        };
        if kind != PARAM_CAPABILITIES {
            return Err(open_err(
                open_error::UNSUPPORTED_OPTIONAL_PARAMETER,
                format!("optional parameter type {kind}"),
            ));
        }
        decode_capabilities(value, &mut caps)?;
    }
    Ok(caps)
}

fn decode_capabilities(buf: &[u8], caps: &mut Vec<Capability>) -> Result<(), DecodeError> {
    let mut r = Reader::new(buf);
    while let Some(code) = r.u8() {
        let value = r.u8().and_then(|len| r.take(usize::from(len)));
        let Some(value) = value else {
            return Err(malformed(format!(
                "capability {code} runs past its parameter"
            )));
        };
        caps.push(Capability::decode(code, value)?);
    }
    Ok(())
}

impl Capability {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let (code, value) = match self {
            Capability::Multiprotocol(afi, safi) => {
                let [a, b] = afi.code().to_be_bytes();
                (CAP_MULTIPROTOCOL, vec![a, b, 0, safi.code()])
            }
            Capability::RouteRefresh => (CAP_ROUTE_REFRESH, Vec::new()),
            Capability::EnhancedRouteRefresh => (CAP_ENHANCED_ROUTE_REFRESH, Vec::new()),
            Capability::FourOctetAs(asn) => (CAP_FOUR_OCTET_AS, asn.to_be_bytes().to_vec()),
            Capability::GracefulRestart(gr) => (CAP_GRACEFUL_RESTART, gr.encode()?),
            Capability::Unknown { code, value } => (*code, value.clone()),
        };
        let len = u8::try_from(value.len()).map_err(|_| {
            EncodeError::Invalid(format!("capability {code} of {} bytes", value.len()))
        })?;
        out.extend_from_slice(&[code, len]);
        out.extend_from_slice(&value);
        Ok(())
    }

    /// A known capability of the wrong length is an OPEN error (unspecific;
    /// RFC 5492 names none).
    fn decode(code: u8, value: &[u8]) -> Result<Capability, DecodeError> {
        let bad = || {
            malformed(format!(
                "capability {code} has a malformed value of {} bytes",
                value.len()
            ))
        };
        let mut r = Reader::new(value);
        Ok(match code {
            CAP_MULTIPROTOCOL => {
                let [a, b, _, safi] = r.array().filter(|_| r.is_empty()).ok_or_else(bad)?;
                let afi = Afi::from_code(u16::from_be_bytes([a, b]));
                match (afi, Safi::from_code(safi)) {
                    (Some(afi), Some(safi)) => Capability::Multiprotocol(afi, safi),
                    _ => Capability::Unknown {
                        code,
                        value: value.to_vec(),
                    },
                }
            }
            CAP_ROUTE_REFRESH if value.is_empty() => Capability::RouteRefresh,
            CAP_ENHANCED_ROUTE_REFRESH if value.is_empty() => Capability::EnhancedRouteRefresh,
            CAP_ROUTE_REFRESH | CAP_ENHANCED_ROUTE_REFRESH => return Err(bad()),
            CAP_FOUR_OCTET_AS => {
                Capability::FourOctetAs(r.u32().filter(|_| r.is_empty()).ok_or_else(bad)?)
            }
            CAP_GRACEFUL_RESTART => {
                Capability::GracefulRestart(GracefulRestart::decode(value).ok_or_else(bad)?)
            }
            _ => Capability::Unknown {
                code,
                value: value.to_vec(),
            },
        })
    }
}

const GR_RESTARTING: u8 = 0x80;
const GR_NOTIFICATION: u8 = 0x40;
const GR_FORWARDING: u8 = 0x80;

impl GracefulRestart {
    fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        if self.time > 0x0fff {
            return Err(EncodeError::Invalid(format!(
                "graceful restart time {} over 4095",
                self.time
            )));
        }
        let [hi, lo] = self.time.to_be_bytes();
        let mut flags = hi;
        if self.restarting {
            flags |= GR_RESTARTING;
        }
        if self.notification {
            flags |= GR_NOTIFICATION;
        }
        let mut v = vec![flags, lo];
        for (afi, safi, forwarding) in &self.families {
            v.extend_from_slice(&afi.code().to_be_bytes());
            let f = if *forwarding { GR_FORWARDING } else { 0 };
            v.extend_from_slice(&[safi.code(), f]);
        }
        Ok(v)
    }

    /// None if the value is not 2 bytes plus 4 per family.
    fn decode(value: &[u8]) -> Option<GracefulRestart> {
        let mut r = Reader::new(value);
        let head = r.u16()?;
        if !r.len().is_multiple_of(4) {
            return None;
        }
        let mut gr = GracefulRestart {
            restarting: head & (u16::from(GR_RESTARTING) << 8) != 0,
            notification: head & (u16::from(GR_NOTIFICATION) << 8) != 0,
            time: head & 0x0fff,
            families: Vec::new(),
        };
        while let (Some(afi), Some(safi), Some(flags)) = (r.u16(), r.u8(), r.u8()) {
            if let (Some(afi), Some(safi)) = (Afi::from_code(afi), Safi::from_code(safi)) {
                gr.families.push((afi, safi, flags & GR_FORWARDING != 0));
            }
        }
        Some(gr)
    }
}
