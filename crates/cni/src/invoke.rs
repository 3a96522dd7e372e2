//! Calling another plugin (IPAM, or the meta-plugin's delegate) by its type
//! name over the CNI protocol.
//!
//! The plugin is looked up in CNI_PATH as the spec says. When the file found
//! is this very binary (our multi-call links), the call is made in-process:
//! the same arguments, no fork and exec. Any other binary, such as the
//! reference host-local, is executed for real.
//!
//! Two guards keep a configuration from calling itself forever (a `bridge`
//! whose `ipam.type` is `bridge` would otherwise recurse until the stack
//! overflows): [`check_ipam_type`] refuses types that are no IPAM plugin,
//! and every delegation counts its depth (see [`crate::chain`]), up to
//! [`MAX_DEPTH`].

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command as Proc, Stdio};

use crate::chain::Depth;
use crate::error::CniError;
use crate::skel::{CmdArgs, Command};
use crate::types::{json_kind, CniResult};
use serde_json::Value;

/// The chain-depth guard lives in [`crate::chain`]; these stay reachable
/// here, where callers have always found them.
pub use crate::chain::{inherit_chain, CHAIN_ENV, MAX_DEPTH};

/// Plugin types that attach interfaces or act on a chain's result: none of
/// them answers as IPAM. Our own non-IPAM plugins are refused as well (see
/// [`check_ipam_type`]), so a plugin added to this binary is covered.
const NOT_IPAM: &[&str] = &[
    "bridge",
    "ptp",
    "macvlan",
    "ipvlan",
    "vlan",
    "host-device",
    "dummy",
    "tap",
    "loopback",
    "portmap",
    "bandwidth",
    "firewall",
    "tuning",
    "sbr",
    "vrf",
    "flannel",
    "podnet",
];

/// The IPAM plugins this binary serves.
const OUR_IPAM: &[&str] = &["host-local", "static"];

/// Refuses an `ipam.type` that names a plugin which is not an IPAM plugin
/// (code 7). Unknown types pass: they may be third-party IPAM plugins.
pub fn check_ipam_type(t: &str) -> Result<(), CniError> {
    let ours = crate::plugins::NAMES.contains(&t) && !OUR_IPAM.contains(&t);
    if ours || NOT_IPAM.contains(&t) {
        return Err(CniError::config(format!(
            "ipam type {t:?} is not an IPAM plugin"
        )));
    }
    Ok(())
}

/// The IPAM plugin a main plugin's `ipam` section names, checked: None
/// for no section, `null`, no type or an empty type (layer 2 only); a
/// type that is not a string or names a non-IPAM plugin is a config error
/// (code 7) prefixed with `plugin`.
pub fn ipam_type_of(plugin: &str, ipam: Option<&Value>) -> Result<Option<String>, CniError> {
    let t = match ipam {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) => m.get("type"),
        Some(v) => {
            return Err(CniError::config(format!(
                "{plugin}: \"ipam\" must be an object, not {}",
                json_kind(v)
            )))
        }
    };
    match t {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(t)) if t.is_empty() => Ok(None),
        Some(Value::String(t)) => check_ipam_type(t)
            .map(|()| Some(t.clone()))
            .map_err(|e| CniError::config(format!("{plugin}: {}", e.msg))),
        Some(v) => Err(CniError::config(format!(
            "{plugin}: ipam.type must be a string, not {}",
            json_kind(v)
        ))),
    }
}

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
    let _depth = Depth::enter(name)?;
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
        .env(CHAIN_ENV, Depth::chain())
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

/// An IPAM ADD that a later failure of the caller can take back.
#[derive(Debug)]
pub struct IpamLease {
    name: String,
    /// host-local ran in-process: exactly what it changed on disk.
    local: Option<crate::ipam::Rollback>,
}

impl IpamLease {
    /// Undoes the ADD: exactly (addresses and cursors) when host-local ran
    /// in-process, with a DEL of the same configuration otherwise.
    pub fn rollback(self, args: &CmdArgs, conf: &[u8]) -> Result<(), CniError> {
        match self.local {
            Some(r) => crate::ipam::rollback(r),
            None => delegate(&self.name, Command::Del, args, conf).map(|_| ()),
        }
    }
}

/// ADD through the IPAM plugin `name` (checked with [`check_ipam_type`]).
pub fn ipam_add(
    name: &str,
    args: &CmdArgs,
    conf: &[u8],
) -> Result<(CniResult, IpamLease), CniError> {
    check_ipam_type(name)?;
    if name == "host-local" {
        let _depth = Depth::enter(name)?;
        let exe = find_plugin(name, &args.path)?;
        if is_self(&exe) {
            let sub = CmdArgs {
                command: Command::Add,
                stdin: conf.to_vec(),
                ..args.clone()
            };
            let (r, undo) = crate::ipam::HostLocal.add_undoable(&sub)?;
            let lease = IpamLease {
                name: name.to_string(),
                local: Some(undo),
            };
            return Ok((r, lease));
        }
    }
    let r = delegate(name, Command::Add, args, conf)?.unwrap_or_default();
    let lease = IpamLease {
        name: name.to_string(),
        local: None,
    };
    Ok((r, lease))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> CmdArgs {
        CmdArgs {
            command: Command::Add,
            container_id: "c".into(),
            netns: "/proc/self/ns/net".into(),
            ifname: "eth0".into(),
            args: String::new(),
            path: vec![],
            stdin: vec![],
        }
    }

    #[test]
    fn non_ipam_types_are_refused_with_code_7() {
        for t in [
            "bridge",
            "portmap",
            "podnet",
            "loopback",
            "bandwidth",
            "macvlan",
        ] {
            let e = check_ipam_type(t).unwrap_err();
            assert_eq!(e.code, 7, "{t}");
            assert_eq!(e.msg, format!("ipam type \"{t}\" is not an IPAM plugin"));
            let e = ipam_add(t, &args(), b"{}").unwrap_err();
            assert_eq!((e.code, e.msg.contains(t)), (7, true), "{e}");
        }
        for t in ["host-local", "dhcp", "static", "whereabouts"] {
            check_ipam_type(t).unwrap();
        }
    }

    #[test]
    fn delegation_depth_is_bounded() {
        // Four nested levels (as four plugins delegating to each other in
        // one process would leave them), then one more is refused before
        // any lookup or call.
        let guards: Vec<Depth> = ["podnet", "podnet", "podnet", "podnet"]
            .iter()
            .map(|n| Depth::enter(n).unwrap())
            .collect();
        let e = delegate("podnet", Command::Add, &args(), b"{}").unwrap_err();
        assert_eq!(e.code, 7);
        assert_eq!(
            e.msg,
            "plugin delegation nested more than 4 deep (podnet -> podnet -> podnet -> podnet \
             -> podnet): does a configuration delegate to itself?"
        );
        drop(guards);
        // Leaving the levels frees them again: the next failure is the lookup.
        let e = delegate("podnet", Command::Add, &args(), b"{}").unwrap_err();
        assert!(e.msg.starts_with("failed to find plugin"), "{e}");
        // An executed child inherits the chain.
        inherit_chain(Some("podnet,bridge,host-local,x"));
        assert_eq!(
            delegate("y", Command::Add, &args(), b"{}")
                .unwrap_err()
                .code,
            7
        );
        inherit_chain(None);
        assert_eq!(Depth::chain(), "");
    }
}
