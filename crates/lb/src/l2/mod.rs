//! L2 announcement (placeholder docs; completed with the tests).

pub mod announce;
pub mod answer;
pub mod election;
mod error;
pub mod packet;
mod responder;
mod socket;

pub use announce::Announce;
pub use error::L2Error;
pub use responder::{Responder, Stats};
