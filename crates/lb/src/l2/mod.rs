//! L2 announcement (placeholder docs; completed with the responder).

pub mod election;
pub mod packet;
