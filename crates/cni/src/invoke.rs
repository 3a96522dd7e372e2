//! Calling another plugin (IPAM, or the meta-plugin's delegate) by its type
//! name over the CNI protocol.
//!
//! The plugin is looked up in CNI_PATH as the spec says. When the file found
//! is this very binary (our multi-call links), the call is made in-process:
//! the same arguments, no fork and exec. Any other binary, such as the
//! reference host-local, is executed for real.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command as Proc, Stdio};

use crate::error::CniError;
use crate::skel::{CmdArgs, Command};
use crate::types::CniResult;

/// Finds a plugin executable in the CNI_PATH directories.
pub fn find_plugin(name: &str, path: &[PathBuf]) -> Result<PathBuf, CniError> {
    if name.is_empty() || name.contains('/') {
        return Err(CniError::config(format!("invalid plugin type {name:?}")));
    }
    path.iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            CniError::internal(format!(
                "failed to find plugin {name:?} in path {:?}",
                path.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
            ))
        })
}

fn is_self(p: &Path) -> bool {
    let (Ok(a), Ok(b)) = (std::fs::metadata(p), std::fs::metadata("/proc/self/exe")) else {
        return false;
    };
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// Runs plugin `name` with command `cmd` and configuration `conf`.
/// Returns the parsed result for ADD, `None` otherwise.
pub fn delegate(
    name: &str,
    cmd: Command,
    args: &CmdArgs,
    conf: &[u8],
) -> Result<Option<CniResult>, CniError> {
    let exe = find_plugin(name, &args.path)?;
    let sub = CmdArgs {
        command: cmd,
        stdin: conf.to_vec(),
        ..args.clone()
    };
    if is_self(&exe) {
        if let Some(p) = crate::plugins::by_name(name) {
            return match crate::skel::execute(p.as_ref(), &sub) {
                Ok(Some(v)) => CniResult::from_value(&v).map(Some),
                Ok(None) => Ok(None),
                Err((_, e)) => Err(e),
            };
        }
    }
    exec_plugin(&exe, &sub)
}

fn exec_plugin(exe: &Path, a: &CmdArgs) -> Result<Option<CniResult>, CniError> {
    let path = std::env::join_paths(&a.path).unwrap_or_default();
    let mut child = Proc::new(exe)
        .env("CNI_COMMAND", a.command.as_str())
        .env("CNI_CONTAINERID", &a.container_id)
        .env("CNI_NETNS", &a.netns)
        .env("CNI_IFNAME", &a.ifname)
        .env("CNI_ARGS", &a.args)
        .env("CNI_PATH", path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| CniError::internal(format!("executing plugin {}: {e}", exe.display())))?;
    if let Some(mut si) = child.stdin.take() {
        let _ = si.write_all(&a.stdin);
    }
    let out = child
        .wait_with_output()
        .map_err(|e| CniError::internal(format!("waiting for plugin {}: {e}", exe.display())))?;
    if !out.status.success() {
        if let Some(e) = CniError::from_json(&out.stdout) {
            return Err(e);
        }
        return Err(CniError::internal(format!(
            "plugin {} failed: {}",
            exe.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    if a.command == Command::Add {
        return CniResult::from_slice(&out.stdout).map(Some);
    }
    Ok(None)
}
