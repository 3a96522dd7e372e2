//! podnet's CNI plugins: bridge, host-local, static, loopback, portmap,
//! bandwidth and the `podnet` meta-plugin, all served by one multi-call binary that
//! dispatches on the name it was called as.
//!
//! Layout:
//! - [`types`]: spec types, version negotiation and result conversion;
//! - [`error`]: the spec's error codes and JSON;
//! - [`skel`]: environment parsing and command dispatch;
//! - [`invoke`]: calling another plugin (in-process when it is us);
//! - [`chain`]: the delegation chain and its depth limit;
//! - [`ipam`]: host-local (config, pure allocator, on-disk store) and static;
//! - [`plugins`]: the plugins themselves.
//!
//! The plugins never write logs to stdout: stdout carries the result or the
//! error JSON and nothing else.

pub mod chain;
pub mod error;
pub mod invoke;
pub mod ipam;
pub mod plugins;
pub mod runtime;
pub mod skel;
pub mod types;

pub use error::{CniError, Code};
pub use skel::{CmdArgs, Command, Plugin};
pub use types::CniResult;

/// Runs the plugin `name` as a CNI process would; returns the exit code.
pub fn run_plugin(name: &str) -> Option<i32> {
    let p = plugins::by_name(name)?;
    Some(skel::main_with(p.as_ref()))
}
