//! The plugin skeleton: reads the CNI environment, checks it the way the spec
//! asks, negotiates the version, calls the plugin and renders its answer.
//!
//! Plugins never read the environment themselves; they get a [`CmdArgs`].
//! That lets a plugin call another one in-process (the bridge calling
//! host-local when both are this binary) with exactly the arguments an exec
//! would have passed.

use std::collections::HashMap;
use std::path::PathBuf;

use serde_json::{json, Value};

use crate::error::{CniError, Code};
use crate::types::{
    self, negotiate, CniResult, NetConf, Version, CURRENT_VERSION, SUPPORTED_VERSIONS,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Gc,
    Status,
}

impl Command {
    pub fn parse(s: &str) -> Option<Command> {
        Some(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Gc => "GC",
            Command::Status => "STATUS",
        }
    }
}

/// Everything the runtime handed a plugin invocation.
#[derive(Debug, Clone)]
pub struct CmdArgs {
    pub command: Command,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: String,
    pub path: Vec<PathBuf>,
    pub stdin: Vec<u8>,
}

impl CmdArgs {
    /// Reads and validates the CNI_* environment for the command it names.
    pub fn from_env(env: &HashMap<String, String>, stdin: Vec<u8>) -> Result<CmdArgs, CniError> {
        let get = |k: &str| env.get(k).cloned().unwrap_or_default();
        let cmd_s = get("CNI_COMMAND");
        if cmd_s.is_empty() {
            return Err(CniError::env(
                "required env variables [CNI_COMMAND] missing",
            ));
        }
        let command = Command::parse(&cmd_s)
            .ok_or_else(|| CniError::env(format!("unknown CNI_COMMAND: {cmd_s}")))?;
        let required: &[&str] = match command {
            Command::Add | Command::Check => {
                &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"]
            }
            Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"],
            Command::Gc | Command::Status => &["CNI_PATH"],
            Command::Version => &[],
        };
        let missing: Vec<&str> = required
            .iter()
            .copied()
            .filter(|k| env.get(*k).map(|v| v.is_empty()).unwrap_or(true))
            .collect();
        if !missing.is_empty() {
            return Err(CniError::env(format!(
                "required env variables [{}] missing",
                missing.join(",")
            )));
        }
        let a = CmdArgs {
            command,
            container_id: get("CNI_CONTAINERID"),
            netns: get("CNI_NETNS"),
            ifname: get("CNI_IFNAME"),
            args: get("CNI_ARGS"),
            path: std::env::split_paths(&get("CNI_PATH")).collect(),
            stdin,
        };
        if matches!(command, Command::Add | Command::Del | Command::Check) {
            validate_container_id(&a.container_id)?;
            validate_ifname(&a.ifname)?;
        }
        Ok(a)
    }

    /// CNI_ARGS as key/value pairs ("IgnoreUnknown=1;K8S_POD_NAME=x").
    pub fn cni_args(&self) -> HashMap<String, String> {
        self.args
            .split(';')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect()
    }

    /// The same invocation with another command (a rollback DEL, say).
    pub fn with_command(&self, command: Command) -> CmdArgs {
        CmdArgs {
            command,
            ..self.clone()
        }
    }

    pub fn with_stdin(&self, stdin: Vec<u8>) -> CmdArgs {
        CmdArgs {
            stdin,
            ..self.clone()
        }
    }
}

/// Rejects container IDs the spec forbids (they become file names).
pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    let ok = !id.is_empty()
        && id
            .chars()
            .next()
            .map(|c| c.is_ascii_alphanumeric())
            .unwrap_or(false)
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !ok {
        return Err(CniError::env(format!(
            "invalid characters in CNI_CONTAINERID: {id:?}"
        )));
    }
    Ok(())
}

/// Rejects interface names the kernel would refuse, before touching it.
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    let bad = name.is_empty()
        || name.len() > 15
        || name == "."
        || name == ".."
        || name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace());
    if bad {
        return Err(CniError::env(format!("invalid CNI_IFNAME: {name:?}")));
    }
    Ok(())
}

/// What every plugin implements. Commands take the parsed arguments; the
/// configuration is in `args.stdin`.
pub trait Plugin {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, CniError>;
    fn del(&self, args: &CmdArgs) -> Result<(), CniError>;
    fn check(&self, args: &CmdArgs) -> Result<(), CniError>;
    fn gc(&self, _args: &CmdArgs) -> Result<(), CniError> {
        Ok(())
    }
    fn status(&self, _args: &CmdArgs) -> Result<(), CniError> {
        Ok(())
    }
}

/// Runs one command; `Ok(Some(json))` is what goes to stdout on success.
pub fn execute(plugin: &dyn Plugin, args: &CmdArgs) -> Result<Option<Value>, (String, CniError)> {
    if args.command == Command::Version {
        let asked = serde_json::from_slice::<Value>(&args.stdin)
            .ok()
            .and_then(|v| {
                v.get("cniVersion")
                    .and_then(|s| s.as_str())
                    .map(String::from)
            })
            .unwrap_or_else(|| CURRENT_VERSION.to_string());
        return Ok(Some(
            json!({"cniVersion": asked, "supportedVersions": SUPPORTED_VERSIONS}),
        ));
    }
    let conf: NetConf =
        types::parse_conf(&args.stdin).map_err(|e| (CURRENT_VERSION.to_string(), e))?;
    let ver_s = if conf.cni_version.is_empty() {
        "0.1.0".to_string()
    } else {
        conf.cni_version.clone()
    };
    let fail = |e: CniError| (ver_s.clone(), e);
    let ver = negotiate(&ver_s).map_err(|e| (CURRENT_VERSION.to_string(), e))?;
    match args.command {
        Command::Add => {
            let r = plugin.add(args).map_err(fail)?;
            Ok(Some(r.render(&ver_s)))
        }
        Command::Del => plugin.del(args).map(|_| None).map_err(fail),
        Command::Check => {
            if ver < Version::V0_4_0 {
                return Err(fail(CniError::new(
                    Code::IncompatibleVersion,
                    format!("config version {ver_s} does not allow CHECK"),
                )));
            }
            plugin.check(args).map(|_| None).map_err(fail)
        }
        Command::Gc | Command::Status => {
            if ver < Version::V1_1_0 {
                return Err(fail(CniError::new(
                    Code::IncompatibleVersion,
                    format!(
                        "config version {ver_s} does not allow {}",
                        args.command.as_str()
                    ),
                )));
            }
            if args.command == Command::Gc {
                plugin.gc(args).map(|_| None).map_err(fail)
            } else {
                plugin.status(args).map(|_| None).map_err(fail)
            }
        }
        Command::Version => unreachable!("handled above"),
    }
}

/// Process entry for a plugin: env and stdin in, JSON and exit code out.
pub fn main_with(plugin: &dyn Plugin) -> i32 {
    use std::io::{Read, Write};
    let env: HashMap<String, String> = std::env::vars().collect();
    let mut stdin = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut stdin);
    crate::chain::inherit_chain(env.get(crate::chain::CHAIN_ENV).map(String::as_str));
    let out = CmdArgs::from_env(&env, stdin)
        .map_err(|e| (CURRENT_VERSION.to_string(), e))
        .and_then(|a| {
            tracing::debug!(command = a.command.as_str(), container = %a.container_id, "cni call");
            execute(plugin, &a)
        });
    let mut so = std::io::stdout().lock();
    match out {
        Ok(Some(v)) => {
            let _ = writeln!(so, "{}", serde_json::to_string(&v).expect("json"));
            0
        }
        Ok(None) => 0,
        Err((ver, e)) => {
            tracing::warn!(code = e.code, "{e}");
            let _ = writeln!(so, "{}", e.to_json(&ver));
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn missing_env_names_the_variable() {
        let e = CmdArgs::from_env(&env(&[("CNI_COMMAND", "ADD"), ("CNI_PATH", "/x")]), vec![])
            .unwrap_err();
        assert_eq!(e.code, 4);
        assert!(e.msg.contains("CNI_CONTAINERID"), "{}", e.msg);
        assert!(e.msg.contains("CNI_NETNS"));
        let e = CmdArgs::from_env(&env(&[]), vec![]).unwrap_err();
        assert!(e.msg.contains("CNI_COMMAND"));
        let e = CmdArgs::from_env(&env(&[("CNI_COMMAND", "FOO")]), vec![]).unwrap_err();
        assert_eq!(e.code, 4);
    }

    #[test]
    fn del_does_not_need_netns() {
        let a = CmdArgs::from_env(
            &env(&[
                ("CNI_COMMAND", "DEL"),
                ("CNI_CONTAINERID", "abc"),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", "/x"),
            ]),
            vec![],
        )
        .unwrap();
        assert_eq!(a.command, Command::Del);
    }

    #[test]
    fn bad_container_id_and_ifname() {
        assert!(validate_container_id("../etc").is_err());
        assert!(validate_container_id("abc-1.2_x").is_ok());
        assert!(validate_ifname("a-very-long-interface-name").is_err());
        assert!(validate_ifname("eth0").is_ok());
        assert!(validate_ifname("e/0").is_err());
    }

    #[test]
    fn cni_args_parse() {
        let a = CmdArgs {
            command: Command::Add,
            container_id: "c".into(),
            netns: String::new(),
            ifname: "eth0".into(),
            args: "IgnoreUnknown=1;K8S_POD_NAME=web;IP=10.0.0.5".into(),
            path: vec![],
            stdin: vec![],
        };
        let m = a.cni_args();
        assert_eq!(m["K8S_POD_NAME"], "web");
        assert_eq!(m["IP"], "10.0.0.5");
    }
}
