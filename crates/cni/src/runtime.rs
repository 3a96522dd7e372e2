//! The runtime side of CNI, as libcni does it: run a network configuration
//! list plugin by plugin, inject `name`, `cniVersion`, `prevResult` and the
//! `runtimeConfig` each plugin's capabilities ask for, and undo in reverse.
//!
//! The lab, the demo, the tests and the benchmarks drive plugins through this,
//! always by executing the real binaries, ours or the reference ones, so what
//! they exercise is exactly what a container runtime would.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command as Proc, Stdio};

use podnet_kernel::Netns;
use serde_json::{json, Map, Value};

use crate::error::CniError;
use crate::skel::Command;
use crate::types::Attachment;

/// One pod attachment.
#[derive(Debug, Clone, Default)]
pub struct Attach {
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: String,
    /// Capability arguments offered to plugins: `{"portMappings": [...]}`.
    pub capability_args: Map<String, Value>,
}

/// Where plugins live and which namespace they run in.
#[derive(Debug, Clone)]
pub struct Runtime {
    pub bin_dirs: Vec<PathBuf>,
    /// Run plugins with this namespace as the "host" (tests keep the
    /// machine's own namespace untouched this way).
    pub host_netns: Option<PathBuf>,
    pub extra_env: Vec<(String, String)>,
}

impl Runtime {
    pub fn new(bin_dir: impl Into<PathBuf>) -> Self {
        Runtime {
            bin_dirs: vec![bin_dir.into()],
            host_netns: None,
            extra_env: Vec::new(),
        }
    }

    pub fn in_netns(mut self, ns: impl Into<PathBuf>) -> Self {
        self.host_netns = Some(ns.into());
        self
    }

    /// Executes one plugin with one configuration.
    pub fn exec(&self, cmd: Command, a: &Attach, conf: &Value) -> Result<Option<Value>, CniError> {
        let ty = conf
            .get("type")
            .and_then(|t| t.as_str())
            .unwrap_or_default();
        let exe = crate::invoke::find_plugin(ty, &self.bin_dirs)?;
        let path = std::env::join_paths(&self.bin_dirs).unwrap_or_default();
        let stdin = serde_json::to_vec(conf).expect("json");
        let spawn = || {
            let mut p = Proc::new(&exe);
            p.env("CNI_COMMAND", cmd.as_str())
                .env("CNI_CONTAINERID", &a.container_id)
                .env("CNI_NETNS", &a.netns)
                .env("CNI_IFNAME", &a.ifname)
                .env("CNI_ARGS", &a.args)
                .env("CNI_PATH", &path)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in &self.extra_env {
                p.env(k, v);
            }
            p.spawn()
        };
        let child = match &self.host_netns {
            // A child forked from a thread inside a namespace is born there.
            Some(ns) => Netns::open(ns)?.run(spawn)?,
            None => spawn(),
        }
        .map_err(|e| CniError::internal(format!("executing {}: {e}", exe.display())))?;
        let mut child = child;
        if let Some(mut si) = child.stdin.take() {
            let _ = si.write_all(&stdin);
        }
        let out = child
            .wait_with_output()
            .map_err(|e| CniError::internal(format!("waiting for {}: {e}", exe.display())))?;
        if !out.status.success() {
            return Err(CniError::from_json(&out.stdout).unwrap_or_else(|| {
                CniError::internal(format!(
                    "{} {} failed: {} {}",
                    ty,
                    cmd.as_str(),
                    String::from_utf8_lossy(&out.stdout).trim(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }));
        }
        if out.stdout.iter().all(|b| b.is_ascii_whitespace()) {
            return Ok(None);
        }
        serde_json::from_slice(&out.stdout)
            .map(Some)
            .map_err(|e| CniError::internal(format!("{ty} printed invalid JSON: {e}")))
    }

    /// The configuration one plugin of a list receives.
    pub fn plugin_conf(list: &Value, plugin: &Value, a: &Attach, prev: Option<&Value>) -> Value {
        let mut c = plugin.as_object().cloned().unwrap_or_default();
        c.insert("name".into(), list["name"].clone());
        c.insert("cniVersion".into(), list["cniVersion"].clone());
        if let Some(p) = prev {
            c.insert("prevResult".into(), p.clone());
        }
        if let Some(caps) = plugin.get("capabilities").and_then(|c| c.as_object()) {
            let mut rc = Map::new();
            for (k, on) in caps {
                if on.as_bool() == Some(true) {
                    if let Some(v) = a.capability_args.get(k) {
                        rc.insert(k.clone(), v.clone());
                    }
                }
            }
            if !rc.is_empty() {
                c.insert("runtimeConfig".into(), Value::Object(rc));
            }
        }
        Value::Object(c)
    }

    fn plugins(list: &Value) -> Vec<Value> {
        list.get("plugins")
            .and_then(|p| p.as_array())
            .cloned()
            .unwrap_or_default()
    }

    /// ADD through the whole list; on failure the plugins already run are
    /// deleted in reverse, as libcni does.
    pub fn add_list(&self, list: &Value, a: &Attach) -> Result<Value, CniError> {
        let mut prev: Option<Value> = None;
        for (i, p) in Self::plugins(list).iter().enumerate() {
            let conf = Self::plugin_conf(list, p, a, prev.as_ref());
            match self.exec(Command::Add, a, &conf) {
                Ok(r) => prev = r.or(prev),
                Err(e) => {
                    for q in Self::plugins(list)[..=i].iter().rev() {
                        let _ = self.exec(
                            Command::Del,
                            a,
                            &Self::plugin_conf(list, q, a, prev.as_ref()),
                        );
                    }
                    return Err(e);
                }
            }
        }
        Ok(prev.unwrap_or_else(|| json!({"cniVersion": list["cniVersion"]})))
    }

    /// DEL through the list in reverse; every plugin runs even if one fails.
    pub fn del_list(&self, list: &Value, a: &Attach, prev: Option<&Value>) -> Result<(), CniError> {
        let mut first_err = None;
        for p in Self::plugins(list).iter().rev() {
            if let Err(e) = self.exec(Command::Del, a, &Self::plugin_conf(list, p, a, prev)) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    pub fn check_list(&self, list: &Value, a: &Attach, prev: &Value) -> Result<(), CniError> {
        for p in Self::plugins(list) {
            self.exec(
                Command::Check,
                a,
                &Self::plugin_conf(list, &p, a, Some(prev)),
            )?;
        }
        Ok(())
    }

    pub fn gc_list(&self, list: &Value, valid: &[Attachment]) -> Result<(), CniError> {
        let a = Attach::default();
        for p in Self::plugins(list) {
            let mut c = Self::plugin_conf(list, &p, &a, None);
            c["cni.dev/valid-attachments"] = serde_json::to_value(valid).expect("json");
            self.exec(Command::Gc, &a, &c)?;
        }
        Ok(())
    }
}
