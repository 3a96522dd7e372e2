//! The `podnet` plugin's extra networks, the Multus way: the node's agent
//! says which NetworkAttachmentDefinitions a pod asks for (its socket's
//! `networks` op, answered from the pod's `k8s.v1.cni.cncf.io/networks`
//! annotation); each is run here as libcni runs a configuration list,
//! with the pod's interface (`net1`, ...), the `ips`/`mac` it asked for
//! (as capabilities, and as CNI_ARGS `IP=`/`MAC=` as Multus passes them)
//! and its `cni-args` (as `args.cni`); what they gave goes back to the
//! agent (`network-status`), which writes it on the pod.
//!
//! What was run is recorded under `<dataDir>/networks/` before it runs
//! (configuration, arguments) and after (its result), so DEL and CHECK
//! use exactly what ADD used even when the definition has changed or
//! gone since, and a failed ADD is taken back in full. An agent that does
//! not know the op (an older one, mid-upgrade) means no extra networks.

use std::io::{BufRead, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::chain::{Depth, CHAIN_ENV};
use crate::error::{CniError, Code};
use crate::runtime::{Attach, Runtime};
use crate::skel::CmdArgs;
use crate::types::CniResult;

/// How long the agent may take to answer (it waits for a pod it has not
/// seen yet, and for its first list).
const ASK_WAIT: Duration = Duration::from_secs(15);

/// One extra network: what ran (or will), and what it gave.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Network {
    /// `namespace/name` of the definition.
    pub name: String,
    pub interface: String,
    /// The configuration list run.
    pub list: Value,
    #[serde(rename = "capabilityArgs", default)]
    pub capability_args: Map<String, Value>,
    /// CNI_ARGS the plugins got.
    pub args: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

/// The pod's namespace and name from CNI_ARGS, if it is a Kubernetes pod.
fn pod_of(args: &CmdArgs) -> Option<(String, String)> {
    let kv = args.cni_args();
    Some((
        kv.get("K8S_POD_NAMESPACE")?.clone(),
        kv.get("K8S_POD_NAME")?.clone(),
    ))
}

/// One request on the agent's socket, one reply back.
fn ask(socket: &Path, req: &Value) -> Result<Value, String> {
    let mut s = UnixStream::connect(socket).map_err(|e| format!("connecting: {e}"))?;
    let _ = s.set_read_timeout(Some(ASK_WAIT));
    let mut line = serde_json::to_vec(req).expect("json");
    line.push(b'\n');
    s.write_all(&line).map_err(|e| format!("sending: {e}"))?;
    let mut back = String::new();
    std::io::BufReader::new(&s)
        .read_line(&mut back)
        .map_err(|e| format!("waiting: {e}"))?;
    serde_json::from_str(&back).map_err(|e| format!("reading: {e}"))
}

/// The extra networks the agent says this pod asks for, planned (none for
/// a sandbox that is no Kubernetes pod, or with no agent listening).
pub fn plan(socket: &Path, args: &CmdArgs, agent: bool) -> Result<Vec<Network>, CniError> {
    let Some((ns, name)) = pod_of(args) else {
        return Ok(Vec::new());
    };
    if !agent {
        return Ok(Vec::new());
    }
    let fail = |e: String| {
        CniError::new(
            Code::TryAgain,
            format!("podnet: the agent did not say which networks pod {ns}/{name} asks for: {e}"),
        )
    };
    let reply = ask(
        socket,
        &json!({"op": "networks", "namespace": ns, "name": name}),
    )
    .map_err(fail)?;
    if let Some(e) = reply["error"].as_str() {
        if e.starts_with("unknown op") {
            return Ok(Vec::new());
        }
        // The pod asks for what it cannot have: the runtime retries, and
        // the message says what to fix.
        return Err(CniError::internal(format!("podnet: {e}")));
    }
    reply["networks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| network(n, args))
        .collect()
}

/// A configuration list from the agent's entry: a single plugin's
/// configuration becomes a list of one; `name` defaults to the
/// definition's, `cniVersion` to 1.0.0. A list that would run the
/// `podnet` plugin again is refused (it would attach the pod's networks
/// inside its own networks).
fn network(n: &Value, args: &CmdArgs) -> Result<Network, CniError> {
    let name = n["name"].as_str().unwrap_or_default().to_string();
    let c = &n["config"];
    let mut list = match c.get("plugins") {
        Some(Value::Array(_)) => c.clone(),
        Some(_) => {
            return Err(CniError::config(format!(
                "podnet: NetworkAttachmentDefinition {name}: \"plugins\" must be a list"
            )))
        }
        None => json!({"cniVersion": c["cniVersion"], "name": c["name"], "plugins": [c]}),
    };
    if list["name"].as_str().is_none_or(str::is_empty) {
        list["name"] = json!(name.rsplit('/').next().unwrap_or_default());
    }
    if list["cniVersion"].as_str().is_none_or(str::is_empty) {
        list["cniVersion"] = json!("1.0.0");
    }
    let plugins = list["plugins"].as_array_mut().into_iter().flatten();
    for p in plugins {
        if p["type"] == "podnet" {
            return Err(CniError::config(format!(
                "podnet: NetworkAttachmentDefinition {name} runs the podnet plugin, which attaches the pod's default network"
            )));
        }
        if let Some(a) = n["cniArgs"].as_object() {
            p["args"]["cni"] = Value::Object(a.clone());
        }
    }
    let mut caps = Map::new();
    let mut extra = String::new();
    if let Some(ips) = n["ips"].as_array().filter(|i| !i.is_empty()) {
        caps.insert("ips".into(), Value::Array(ips.clone()));
        let joined: Vec<&str> = ips.iter().filter_map(Value::as_str).collect();
        extra.push_str(&format!(";IP={}", joined.join(",")));
    }
    if let Some(mac) = n["mac"].as_str().filter(|m| !m.is_empty()) {
        caps.insert("mac".into(), json!(mac));
        extra.push_str(&format!(";MAC={mac}"));
    }
    let base = if args.args.is_empty() {
        "IgnoreUnknown=1".to_string()
    } else {
        args.args.clone()
    };
    Ok(Network {
        name,
        interface: n["interface"].as_str().unwrap_or_default().to_string(),
        list,
        capability_args: caps,
        args: format!("{base}{extra}"),
        result: None,
    })
}

/// Where an attachment's extra networks are recorded.
pub fn record_path(data_dir: &Path, saved_name: &Path) -> PathBuf {
    let file = saved_name.file_name().unwrap_or_default();
    data_dir.join("networks").join(file)
}

fn save(path: &Path, nets: &[Network]) -> Result<(), CniError> {
    let io = |e: std::io::Error| {
        CniError::new(Code::Io, format!("podnet: writing {}", path.display()))
            .with_details(e.to_string())
    };
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(io)?;
    }
    std::fs::write(path, serde_json::to_vec(nets).expect("json")).map_err(io)
}

/// The recorded extra networks (none when there is no record).
pub fn load(path: &Path) -> Result<Vec<Network>, CniError> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| {
            CniError::new(Code::Decode, format!("podnet: corrupt {}", path.display()))
                .with_details(e.to_string())
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(
            CniError::new(Code::Io, format!("podnet: reading {}", path.display()))
                .with_details(e.to_string()),
        ),
    }
}

fn runtime(args: &CmdArgs) -> Runtime {
    let mut rt = Runtime::new(PathBuf::new());
    rt.bin_dirs = args.path.clone();
    rt.extra_env.push((CHAIN_ENV.into(), Depth::chain()));
    rt
}

fn attach(args: &CmdArgs, n: &Network) -> Attach {
    Attach {
        container_id: args.container_id.clone(),
        netns: args.netns.clone(),
        ifname: n.interface.clone(),
        args: n.args.clone(),
        capability_args: n.capability_args.clone(),
    }
}

/// Runs every network's ADD, recording each before and after; on a
/// failure every one is deleted again (in reverse) and the record
/// removed. Returns the networks with their results.
pub fn add_all(
    path: &Path,
    args: &CmdArgs,
    mut nets: Vec<Network>,
) -> Result<Vec<Network>, CniError> {
    if nets.is_empty() {
        return Ok(nets);
    }
    let _depth = Depth::enter("podnet networks")?;
    save(path, &nets)?;
    let rt = runtime(args);
    for i in 0..nets.len() {
        match rt.add_list(&nets[i].list, &attach(args, &nets[i])) {
            Ok(r) => nets[i].result = Some(r),
            Err(mut e) => {
                let _ = del_all(path, args);
                e.msg = format!(
                    "podnet: network {} ({}): {}",
                    nets[i].name, nets[i].interface, e.msg
                );
                return Err(e);
            }
        }
        save(path, &nets)?;
    }
    Ok(nets)
}

/// DEL of every recorded network, in reverse; all run even if one fails;
/// the record goes once all succeeded.
pub fn del_all(path: &Path, args: &CmdArgs) -> Result<(), CniError> {
    let nets = load(path)?;
    let _depth = Depth::enter("podnet networks")?;
    let rt = runtime(args);
    let mut errors = Vec::new();
    for n in nets.iter().rev() {
        if let Err(e) = rt.del_list(&n.list, &attach(args, n), n.result.as_ref()) {
            errors.push(format!("network {} ({}): {}", n.name, n.interface, e.msg));
        }
    }
    if !errors.is_empty() {
        return Err(CniError::internal(format!(
            "podnet DEL: {}",
            errors.join("; ")
        )));
    }
    let _ = std::fs::remove_file(path);
    Ok(())
}

/// CHECK of every recorded network against the result it gave.
pub fn check_all(path: &Path, args: &CmdArgs) -> Result<(), CniError> {
    let nets = load(path)?;
    let _depth = Depth::enter("podnet networks")?;
    let rt = runtime(args);
    for n in &nets {
        let prev = n.result.clone().unwrap_or(Value::Null);
        rt.check_list(&n.list, &attach(args, n), &prev)
            .map_err(|e| CniError::internal(format!("podnet: network {}: {}", n.name, e.msg)))?;
    }
    Ok(())
}

/// The network-status entries: the default network's first.
pub fn status(default_name: &str, args: &CmdArgs, primary: &CniResult, nets: &[Network]) -> Value {
    let mut out = vec![entry(default_name, &args.ifname, primary, true)];
    for n in nets {
        let r = n
            .result
            .as_ref()
            .and_then(|r| CniResult::from_value(r).ok())
            .unwrap_or_default();
        out.push(entry(&n.name, &n.interface, &r, false));
    }
    Value::Array(out)
}

fn entry(name: &str, ifname: &str, r: &CniResult, default: bool) -> Value {
    let mac = r
        .interfaces
        .iter()
        .find(|i| i.name == ifname && !i.sandbox.is_empty())
        .map(|i| i.mac.clone())
        .unwrap_or_default();
    let ips: Vec<String> = r.ips.iter().map(|i| i.address.addr().to_string()).collect();
    let mut e =
        json!({"name": name, "interface": ifname, "ips": ips, "mac": mac, "default": default});
    if !r.dns.is_empty() {
        e["dns"] = serde_json::to_value(&r.dns).expect("json");
    }
    e
}

/// Hands the status to the agent, which writes it on the pod. A failure
/// is the caller's to report: the pod's networks work without it.
pub fn send_status(socket: &Path, args: &CmdArgs, status: Value) -> Result<(), String> {
    let (ns, name) = pod_of(args).ok_or("not a Kubernetes pod")?;
    let reply = ask(
        socket,
        &json!({"op": "network-status", "namespace": ns, "name": name, "networkStatus": status}),
    )?;
    match reply["error"].as_str() {
        Some(e) => Err(e.to_string()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::skel::Command;

    fn args() -> CmdArgs {
        CmdArgs {
            command: Command::Add,
            container_id: "c1".into(),
            netns: "/run/netns/p".into(),
            ifname: "eth0".into(),
            args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web".into(),
            path: vec![],
            stdin: vec![],
        }
    }

    #[test]
    fn a_definition_becomes_a_list_with_what_the_pod_asked() {
        let n = json!({"name": "shop/lan", "interface": "net1",
            "config": {"type": "macvlan", "master": "eth1", "capabilities": {"ips": true}},
            "ips": ["10.1.0.5/24"], "mac": "02:00:00:00:00:05", "cniArgs": {"foo": "bar"}});
        let got = network(&n, &args()).unwrap();
        assert_eq!(got.list["name"], "lan");
        assert_eq!(got.list["cniVersion"], "1.0.0");
        assert_eq!(got.list["plugins"][0]["type"], "macvlan");
        assert_eq!(got.list["plugins"][0]["args"]["cni"]["foo"], "bar");
        assert_eq!(got.capability_args["ips"], json!(["10.1.0.5/24"]));
        assert_eq!(got.capability_args["mac"], "02:00:00:00:00:05");
        assert_eq!(
            got.args,
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web;IP=10.1.0.5/24;MAC=02:00:00:00:00:05"
        );
        let list = json!({"name": "x", "config": {"cniVersion": "0.4.0", "name": "mine", "plugins": [{"type": "macvlan"}]}});
        let got = network(&list, &args()).unwrap();
        assert_eq!(
            (got.list["name"].as_str(), got.list["cniVersion"].as_str()),
            (Some("mine"), Some("0.4.0"))
        );
    }

    #[test]
    fn a_definition_whose_plugins_are_no_list_is_refused() {
        let n = json!({"name": "shop/odd", "interface": "net1", "config": {"type": "macvlan", "plugins": 5}});
        let e = network(&n, &args()).unwrap_err();
        assert!(
            e.msg.contains("shop/odd: \"plugins\" must be a list"),
            "{e:?}"
        );
    }

    #[test]
    fn the_podnet_plugin_is_no_extra_network() {
        let n = json!({"name": "shop/loop", "interface": "net1", "config": {"type": "podnet"}});
        let e = network(&n, &args()).unwrap_err();
        assert!(e.msg.contains("shop/loop runs the podnet plugin"), "{e:?}");
    }

    #[test]
    fn no_pod_no_question() {
        let mut a = args();
        a.args = String::new();
        assert!(plan(Path::new("/nonexistent"), &a, true)
            .unwrap()
            .is_empty());
        assert!(plan(Path::new("/nonexistent"), &args(), false)
            .unwrap()
            .is_empty());
        let e = plan(Path::new("/nonexistent"), &args(), true).unwrap_err();
        assert_eq!(e.code, 11, "{e:?}");
    }
}
