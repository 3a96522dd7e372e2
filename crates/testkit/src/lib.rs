//! podnet's test kit: what the tests of every crate share, each written once.
//!
//! - [`unique`] names and [`TestNs`], a network namespace that is removed on
//!   drop even when the test panics, with helpers that run shell commands
//!   inside it ([`sh_in`], [`try_sh_in`], [`command_in`] for namespaces the
//!   test does not own, such as a lab node's);
//! - [`eventually`], [`eventually_async`] and [`try_eventually`] (which
//!   reports instead of failing, for cleanup): the one place that polls, so
//!   no test sleeps in the hope that something is ready. A deadline fails
//!   the wait; nothing here measures how long anything took;
//! - [`Proc`]: a child process (in a namespace or not) with its output in a
//!   log file, killed on drop; [`Proc::check`] fails the test with the log's
//!   tail when the process died;
//! - [`Etcd`]: a real etcd on the host's loopback or inside a namespace,
//!   killed like a crash and restarted on the same data and ports;
//! - [`nft`], [`nft_list`] and [`nft_list_json`]: what the kernel's
//!   nftables hold, read through the `nft` CLI, a witness independent of
//!   podnet's own netlink code;
//! - [`http_get`]: one plain GET, for `/health`, `/readyz` and `/metrics`,
//!   and [`free_port`] for the servers a test starts;
//! - [`Rng`]: a seeded pseudo-random source for randomized test loops.
//!
//! Nothing here skips. A test that needs root says so through
//! [`require_root`] (which [`TestNs::new`] calls), and a missing peer
//! (`etcd`, `nft`, `ip`) fails the test with what to install.
//!
//! Dev only: crates list it under `[dev-dependencies]`; the benchmarks use
//! its namespace guard as a normal dependency.

mod etcd;
mod http;
mod nft;
mod ns;
mod process;
mod rng;
mod wait;

pub use etcd::Etcd;
pub use http::{free_port, http_get};
pub use nft::{nft, nft_list, nft_list_json};
pub use ns::{command_in, require_root, sh_in, try_sh_in, unique, TestNs};
pub use process::{Frozen, Proc};
pub use rng::Rng;
pub use wait::{eventually, eventually_async, try_eventually, Outcome};
