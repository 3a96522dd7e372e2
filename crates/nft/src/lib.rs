//! podnet's nftables edge.
//!
//! - [`model`]: a typed model of one table (sets, maps, chains, rules);
//! - [`diff`]: the ordered change list from the applied table to the wanted
//!   one (empty when nothing changed), renderable as one `nft -f` transaction;
//! - [`trace`]: a packet tracer over the model, for tests without root;
//! - [`apply`]/[`query`]: atomic `nft -f -` transactions and reads.
//!
//! The CNI plugins change a handful of set elements per call, where the
//! `nft` tool is cheap enough. The service proxy needs nf_tables netlink
//! batches (the `nft` tool re-reads the whole table on every call); that
//! encoder is the next piece to land here.

pub mod diff;
pub mod model;
pub mod netlink;
pub mod trace;

use std::io::Write;
use std::process::{Command, Stdio};

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("nft is not installed (apt-get install nftables): {0}")]
    Missing(std::io::Error),
    #[error("nft {what} failed: {stderr}")]
    Failed { what: String, stderr: String },
    #[error("running nft: {0}")]
    Io(#[from] std::io::Error),
}

fn nft() -> Command {
    Command::new(std::env::var("PODNET_NFT").unwrap_or_else(|_| "nft".to_string()))
}

/// Applies a ruleset script as one atomic transaction. `what` names the
/// change for the error message.
pub fn apply(what: &str, script: &str) -> Result<(), NftError> {
    tracing::debug!(what, script, "nft apply");
    let mut child = nft()
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => NftError::Missing(e),
            _ => NftError::Io(e),
        })?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(NftError::Failed {
            what: what.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Runs `nft ARGS` and returns its stdout.
pub fn query(args: &[&str]) -> Result<String, NftError> {
    let out = nft().args(args).output().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => NftError::Missing(e),
        _ => NftError::Io(e),
    })?;
    if !out.status.success() {
        return Err(NftError::Failed {
            what: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether a table exists in the current namespace.
pub fn table_exists(family: &str, name: &str) -> Result<bool, NftError> {
    match query(&["list", "table", family, name]) {
        Ok(_) => Ok(true),
        Err(NftError::Failed { stderr, .. }) if stderr.contains("No such file") => Ok(false),
        Err(e) => Err(e),
    }
}

/// Quotes a string for use inside an nft script (comments, names).
pub fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace(['"', '\\', '\n'], "_"))
}
