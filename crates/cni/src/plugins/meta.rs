//! The `podnet` meta-plugin, the counterpart of flannel's CNI plugin: it reads
//! the node's lease from `subnet.env` and delegates to bridge + host-local
//! with the node's subnet, the cluster network route, the MTU and masquerade
//! setting filled in.
//!
//! The delegate configuration used for ADD is saved under `dataDir`, so DEL
//! undoes exactly what ADD did even after the node's subnet changes.
//!
//! No open window for NetworkPolicy: ADD tells the node's agent the pod's
//! addresses over its socket beside the subnet file (`agent.sock`, or the
//! `agentSocket` key) and returns only once the agent has put the pod's
//! policies in the kernel; an agent that answers with an error fails the
//! ADD (the runtime retries).
//!
//! With `"requireAgent": true` (the conflist every agent writes), an
//! agent that is not running fails the ADD too. Its tables fail closed
//! on addresses they do not know, so a pod wired without it would report
//! Ready and have its traffic dropped; failing instead tells the runtime
//! (the kubelet retries the sandbox, and the pod is not Ready while it
//! could not talk). ADD connects to the socket first, before anything is
//! made, retrying for `agentWaitSeconds` (default
//! [`DEFAULT_AGENT_WAIT_SECS`], so an agent that is restarting is waited
//! for), then fails with code 11 (try again later) and a message naming
//! the socket. A socket file with nobody listening (the agent stopped or
//! crashed) and no socket file at all (no agent ever ran here, or
//! `--cleanup` removed it) are the same failure with a different message:
//! a node where the podnet plugin is called but the podnet agent never
//! ran has no policy and no pod network, so it must not take pods either.
//! Every agent answers on the socket, with or without NetworkPolicy.
//! Without the key (a conflist an older agent wrote: a node in the middle
//! of an upgrade, whose old agent has no socket, keeps taking pods) or
//! with `false` (a node that runs no agent by design, such as the lab's
//! `--no-agents`), ADD tells an agent only when one is listening. A failure after the attachment exists (the agent went away
//! mid-ADD, or said no) undoes it: veth, addresses and IPAM allocation.
//! DEL tells the agent when it listens and never waits for it.
//!
//! The anti-spoofing guard: when the delegate attached the pod to a bridge
//! (its result names the host veth and the pod's MAC), ADD records the
//! port, the MAC and the addresses in `guard/` beside the subnet file
//! (one JSON file per attachment, removed at DEL) and sends the same facts
//! with its request, so the agent lets that port speak with the pod's own
//! addresses only, from the moment the pod exists and again after the
//! agent restarts. They are taken from the ADD, never read back from the
//! pod, which could change its own. The delegate puts the host veth in
//! netdev group [`PORT_GROUP`] (`podnetPortGroup`): the ports the guard
//! judges.

use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::{CniError, Code};
use crate::invoke::delegate;
use crate::plugins::attachments;
use crate::skel::{CmdArgs, Command, Plugin};
use crate::types::{self, Attachment, CniResult};

pub const DEFAULT_SUBNET_FILE: &str = "/run/podnet/subnet.env";
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/podnet";
pub const DEFAULT_BRIDGE: &str = "podnet0";
/// The netdev group the host sides of the pods' veths go in: the ports
/// the agent's anti-spoofing guard judges (`podnet_policy::guard::PORT_GROUP`,
/// the same number: "pn").
pub const PORT_GROUP: u32 = 0x706e;

#[derive(Debug, Deserialize)]
struct Conf {
    #[serde(rename = "cniVersion", default)]
    cni_version: String,
    #[serde(default)]
    name: String,
    #[serde(rename = "subnetFile", default)]
    subnet_file: Option<String>,
    #[serde(rename = "dataDir", default)]
    data_dir: Option<String>,
    /// podnet extension: host-local's dataDir for the delegate.
    #[serde(rename = "ipamDataDir", default)]
    ipam_data_dir: Option<String>,
    #[serde(default)]
    delegate: Option<Map<String, Value>>,
    /// podnet extension: the agent's socket (default: `agent.sock` beside
    /// the subnet file).
    #[serde(rename = "agentSocket", default)]
    agent_socket: Option<String>,
    /// podnet extension: how long ADD waits for the agent's socket to
    /// accept, in seconds (default [`DEFAULT_AGENT_WAIT_SECS`]).
    #[serde(rename = "agentWaitSeconds", default)]
    agent_wait_seconds: Option<f64>,
    /// podnet extension: `true` (what agents write) makes ADD fail while
    /// no agent answers; absent or `false`, ADD tells an agent only if one
    /// is listening (older agents' conflists, nodes without an agent).
    #[serde(rename = "requireAgent", default)]
    require_agent: Option<bool>,
    #[serde(rename = "runtimeConfig", default)]
    runtime_config: Option<Value>,
    #[serde(rename = "prevResult", default)]
    prev_result: Option<Value>,
    #[serde(rename = "cni.dev/valid-attachments", default)]
    valid_attachments: Option<Vec<Attachment>>,
}

/// The node's lease as the agent wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetEnv {
    pub network: IpNet,
    pub subnet: IpNet,
    pub mtu: Option<u32>,
    pub ipmasq: bool,
    /// The IPv6 network and this node's IPv6 subnet (dual-stack:
    /// `FLANNEL_IPV6_NETWORK`, `FLANNEL_IPV6_SUBNET`).
    pub ipv6: Option<(IpNet, IpNet)>,
}

impl SubnetEnv {
    /// Parses `KEY=VALUE` lines; `PODNET_*` names win over `FLANNEL_*` ones.
    pub fn parse(text: &str, path: &str) -> Result<SubnetEnv, CniError> {
        let kv: BTreeMap<&str, &str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim(), v.trim().trim_matches('"')))
            .collect();
        let get = |k: &str| {
            kv.get(format!("PODNET_{k}").as_str())
                .or(kv.get(format!("FLANNEL_{k}").as_str()))
                .copied()
        };
        let net = |k: &str| -> Result<IpNet, CniError> {
            let v = get(k).ok_or_else(|| {
                CniError::config(format!("podnet: {path} is missing FLANNEL_{k}"))
            })?;
            v.parse().map_err(|_| {
                CniError::config(format!("podnet: {path}: FLANNEL_{k}={v:?} is not a CIDR"))
            })
        };
        let mtu = match get("MTU") {
            Some(v) => Some(v.parse::<u32>().map_err(|_| {
                CniError::config(format!("podnet: {path}: FLANNEL_MTU={v:?} is not a number"))
            })?),
            None => None,
        };
        let ipv6 = match (get("IPV6_NETWORK"), get("IPV6_SUBNET")) {
            (None, None) => None,
            _ => Some((net("IPV6_NETWORK")?, net("IPV6_SUBNET")?)),
        };
        Ok(SubnetEnv {
            network: net("NETWORK")?,
            subnet: net("SUBNET")?,
            mtu,
            ipmasq: get("IPMASQ").map(|v| v == "true").unwrap_or(false),
            ipv6,
        })
    }
}

impl Conf {
    fn subnet_file(&self) -> String {
        self.subnet_file
            .clone()
            .unwrap_or_else(|| DEFAULT_SUBNET_FILE.to_string())
    }
    fn data_dir(&self) -> PathBuf {
        PathBuf::from(
            self.data_dir
                .clone()
                .unwrap_or_else(|| DEFAULT_DATA_DIR.to_string()),
        )
    }
    fn read_env(&self) -> Result<SubnetEnv, CniError> {
        let p = self.subnet_file();
        let text = std::fs::read_to_string(&p).map_err(|e| {
            CniError::new(
                Code::TryAgain,
                format!("podnet: cannot read {p} (is the podnet agent running?)"),
            )
            .with_details(e.to_string())
        })?;
        SubnetEnv::parse(&text, &p)
    }

    /// The delegate configuration, flannel's defaults under the user's keys.
    fn delegate_conf(&self, env: &SubnetEnv) -> Value {
        let mut d = self.delegate.clone().unwrap_or_default();
        let mut set = |k: &str, v: Value| {
            d.entry(k.to_string()).or_insert(v);
        };
        set("type", json!("bridge"));
        set("bridge", json!(DEFAULT_BRIDGE));
        set("isGateway", json!(true));
        set("isDefaultGateway", json!(true));
        set("hairpinMode", json!(true));
        set("podnetPortGroup", json!(PORT_GROUP));
        set("ipMasq", json!(!env.ipmasq));
        if let Some(m) = env.mtu {
            set("mtu", json!(m));
        }
        d.insert("name".into(), json!(self.name));
        d.insert("cniVersion".into(), json!(self.cni_version));
        let mut ranges = vec![json!([{"subnet": env.subnet.trunc().to_string()}])];
        let mut routes = vec![json!({"dst": env.network.trunc().to_string()})];
        if let Some((net6, sub6)) = env.ipv6 {
            ranges.push(json!([{"subnet": sub6.trunc().to_string()}]));
            routes.push(json!({"dst": net6.trunc().to_string()}));
        }
        d.insert(
            "ipam".into(),
            json!({"type": "host-local", "ranges": ranges, "routes": routes}),
        );
        if let Some(dir) = &self.ipam_data_dir {
            d["ipam"]["dataDir"] = json!(dir);
        }
        if let Some(rc) = &self.runtime_config {
            d.insert("runtimeConfig".into(), rc.clone());
        }
        Value::Object(d)
    }
}

impl Conf {
    fn agent_socket(&self) -> PathBuf {
        match &self.agent_socket {
            Some(p) => PathBuf::from(p),
            None => std::path::Path::new(&self.subnet_file())
                .parent()
                .unwrap_or(std::path::Path::new("/run/podnet"))
                .join("agent.sock"),
        }
    }
}

/// How long ADD waits for the agent to program a pod.
const AGENT_WAIT: Duration = Duration::from_secs(15);

/// How long ADD waits, by default, for the agent's socket to accept.
pub const DEFAULT_AGENT_WAIT_SECS: f64 = 5.0;

impl Conf {
    fn agent_wait(&self) -> Result<Duration, CniError> {
        let s = self.agent_wait_seconds.unwrap_or(DEFAULT_AGENT_WAIT_SECS);
        Duration::try_from_secs_f64(s).map_err(|_| {
            CniError::config(format!(
                "podnet: agentWaitSeconds must be a number of seconds, not {s}"
            ))
        })
    }
}

/// The agent is not there: which socket, and why it says so.
fn agent_down(path: &Path, wait: Duration, e: &std::io::Error) -> CniError {
    let why = match e.kind() {
        std::io::ErrorKind::NotFound => format!("its socket {} does not exist", path.display()),
        std::io::ErrorKind::ConnectionRefused => {
            format!("nothing listens on its socket {}", path.display())
        }
        _ => format!("its socket {} cannot be reached", path.display()),
    };
    CniError::new(
        Code::TryAgain,
        format!(
            "podnet: the podnet agent is not running on this node: {why} (waited {:.1}s); \
             a pod wired now would have its traffic dropped, so try again once the agent runs",
            wait.as_secs_f64()
        ),
    )
    .with_details(e.to_string())
}

/// Connects to the agent's socket at `path`, trying again until `wait` has
/// passed (an agent that is restarting binds it again within moments).
fn connect_agent(path: &Path, wait: Duration) -> Result<UnixStream, CniError> {
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(5);
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return Ok(s),
            Err(e) => {
                let now = Instant::now();
                if now >= deadline {
                    return Err(agent_down(path, wait, &e));
                }
                std::thread::sleep(pause.min(deadline - now));
                pause = (pause * 2).min(Duration::from_millis(100));
            }
        }
    }
}

/// The connection ADD tells the agent on, made before anything else (see
/// the module docs): `None` only when the agent is not required and not
/// listening.
fn agent_for_add(c: &Conf) -> Result<Option<UnixStream>, CniError> {
    let path = c.agent_socket();
    if c.require_agent.unwrap_or(false) {
        return connect_agent(&path, c.agent_wait()?).map(Some);
    }
    match UnixStream::connect(&path) {
        Ok(s) => Ok(Some(s)),
        Err(e) => {
            tracing::debug!(
                "podnet: agent socket {}: {e}; requireAgent is false, not waiting",
                path.display()
            );
            Ok(None)
        }
    }
}

/// The pod's namespace and name as the agent knows it (a bare container:
/// its ID).
fn pod_key(args: &CmdArgs) -> (String, String) {
    let kv = args.cni_args();
    let ns = kv.get("K8S_POD_NAMESPACE").cloned().unwrap_or_default();
    let name = kv
        .get("K8S_POD_NAME")
        .cloned()
        .unwrap_or_else(|| args.container_id.clone());
    (ns, name)
}

/// The guard's facts from a bridge result: the host veth (the interface
/// outside any sandbox that is not the bridge) and the pod's MAC.
fn port_of(r: &CniResult, args: &CmdArgs, bridge: &str) -> Option<(String, String)> {
    let pod = r
        .interfaces
        .iter()
        .find(|i| !i.sandbox.is_empty() && i.name == args.ifname)?;
    let host = r
        .interfaces
        .iter()
        .find(|i| i.sandbox.is_empty() && i.name != bridge)?;
    (!pod.mac.is_empty()).then(|| (host.name.clone(), pod.mac.to_ascii_lowercase()))
}

impl Conf {
    fn guard_record(&self, args: &CmdArgs) -> PathBuf {
        let dir = std::path::Path::new(&self.subnet_file())
            .parent()
            .unwrap_or(std::path::Path::new("/run/podnet"))
            .join("guard");
        saved_path(&dir, &args.container_id, &args.ifname)
    }
}

/// Writes the guard's record of an attachment (see the module docs).
fn write_record(
    c: &Conf,
    args: &CmdArgs,
    port: &(String, String),
    ips: &[String],
) -> Result<(), CniError> {
    let (ns, name) = pod_key(args);
    let path = c.guard_record(args);
    let mac: Vec<u8> = port
        .1
        .split(':')
        .filter_map(|b| u8::from_str_radix(b, 16).ok())
        .collect();
    let rec = json!({"namespace": ns, "name": name, "port": port.0, "mac": mac, "ips": ips});
    path.parent()
        .map(std::fs::create_dir_all)
        .unwrap_or(Ok(()))
        .and_then(|_| std::fs::write(&path, serde_json::to_vec(&rec).expect("json")))
        .map_err(|e| io(format!("podnet: writing {}", path.display()), e))
}

/// Tells the node's agent about a pod on `s` and, for an ADD, waits until
/// it says the pod is programmed (see the module docs).
fn tell_agent(
    mut s: UnixStream,
    args: &CmdArgs,
    op: &str,
    ips: &[String],
    port: Option<&(String, String)>,
) -> Result<(), CniError> {
    use std::io::{BufRead, Write};
    let (ns, name) = pod_key(args);
    let fail = |what: &str, e: String| {
        CniError::new(
            Code::TryAgain,
            format!("podnet: the agent did not confirm pod {ns}/{name}: {what}"),
        )
        .with_details(e)
    };
    let _ = s.set_read_timeout(Some(AGENT_WAIT));
    let mut req = json!({
        "op": op, "namespace": ns, "name": name, "ips": ips,
    });
    if let Some((p, mac)) = port {
        req["port"] = json!(p);
        req["mac"] = json!(mac);
    }
    // The guard keys ports by attachment, as its records are named.
    let id = saved_path(std::path::Path::new(""), &args.container_id, &args.ifname);
    req["attachment"] = json!(id.to_string_lossy());
    let mut req = serde_json::to_vec(&req).expect("json");
    req.push(b'\n');
    s.write_all(&req)
        .map_err(|e| fail("sending", e.to_string()))?;
    let mut line = String::new();
    std::io::BufReader::new(&s)
        .read_line(&mut line)
        .map_err(|e| fail("waiting", e.to_string()))?;
    let reply: Value = serde_json::from_str(&line).map_err(|e| fail("reading", e.to_string()))?;
    if reply["ok"] == json!(true) || op == "del" {
        return Ok(());
    }
    Err(fail(
        "its answer",
        reply["error"].as_str().unwrap_or("no answer").to_string(),
    ))
}

fn saved_path(dir: &std::path::Path, id: &str, ifname: &str) -> PathBuf {
    if ifname == "eth0" {
        dir.join(id)
    } else {
        // '@' cannot occur in a container ID, so the name splits back cleanly.
        dir.join(format!("{id}@{ifname}"))
    }
}

fn io(what: String, e: std::io::Error) -> CniError {
    CniError::new(Code::Io, what).with_details(e.to_string())
}

fn delegate_type(v: &Value) -> String {
    v.get("type")
        .and_then(|t| t.as_str())
        .unwrap_or("bridge")
        .to_string()
}

/// The delegate must be another plugin: podnet delegating to podnet would
/// only go round (the depth limit in [`crate::invoke`] stops it anyway).
fn check_delegate(c: &Conf) -> Result<(), CniError> {
    match c.delegate.as_ref().and_then(|d| d.get("type")) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(t)) if t == "podnet" => Err(CniError::config(
            "podnet: delegate type \"podnet\" would delegate to itself",
        )),
        Some(Value::String(_)) => Ok(()),
        Some(v) => Err(CniError::config(format!(
            "podnet: delegate.type must be a string, not {}",
            types::json_kind(v)
        ))),
    }
}

/// Parses a podnet configuration without touching any state.
pub fn parse_config(stdin: &[u8]) -> Result<(), CniError> {
    let c: Conf = types::parse_conf(stdin)?;
    c.agent_wait()?;
    check_delegate(&c)
}

pub struct Meta;

/// Takes back the default network's attachment after a later step of ADD
/// failed: the runtime retries the whole ADD.
fn undo_default(c: &Conf, args: &CmdArgs, d: &Value, bytes: &[u8], path: &Path) {
    let _ = std::fs::remove_file(c.guard_record(args));
    let _ = delegate(
        &delegate_type(d),
        Command::Del,
        &args.with_command(Command::Del),
        bytes,
    );
    let _ = std::fs::remove_file(path);
}

impl Plugin for Meta {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, CniError> {
        let c: Conf = types::parse_conf(&args.stdin)?;
        check_delegate(&c)?;
        c.agent_wait()?;
        let env = c.read_env()?;
        // First, before anything exists to undo: is the agent there, and
        // which extra networks does the pod ask for?
        let agent = agent_for_add(&c)?;
        let nets = attachments::plan(&c.agent_socket(), args, agent.is_some())?;
        let d = c.delegate_conf(&env);
        let bytes = serde_json::to_vec(&d).expect("json");
        let dir = c.data_dir();
        let path = saved_path(&dir, &args.container_id, &args.ifname);
        std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::write(&path, &bytes))
            .map_err(|e| {
                io(
                    format!("podnet: saving delegate config {}", path.display()),
                    e,
                )
            })?;
        let r = match delegate(&delegate_type(&d), Command::Add, args, &bytes) {
            Ok(r) => r.unwrap_or_default(),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        let ips: Vec<String> = r.ips.iter().map(|i| i.address.addr().to_string()).collect();
        let bridge = d["bridge"].as_str().unwrap_or(DEFAULT_BRIDGE);
        let port = port_of(&r, args, bridge);
        let told = match &port {
            Some(p) => write_record(&c, args, p, &ips),
            None => Ok(()),
        }
        .and_then(|_| match agent {
            Some(s) => tell_agent(s, args, "add", &ips, port.as_ref()),
            None => Ok(()),
        });
        // The extra networks, after the default one (as Multus orders
        // them); a failure takes them all back, then the default one.
        let record = attachments::record_path(&dir, &path);
        let added = told
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|_| attachments::add_all(&record, args, nets));
        let nets = match added {
            Ok(n) => n,
            Err(e) => {
                if told.is_ok() {
                    if let Ok(s) = UnixStream::connect(c.agent_socket()) {
                        let _ = tell_agent(s, args, "del", &[], None);
                    }
                }
                undo_default(&c, args, &d, &bytes, &path);
                return Err(e);
            }
        };
        if !nets.is_empty() {
            let st = attachments::status(&c.name, args, &r, &nets);
            if let Err(e) = attachments::send_status(&c.agent_socket(), args, st) {
                // The networks work without it; the pod's status says less.
                tracing::warn!("podnet: network-status not written: {e}");
            }
        }
        Ok(r)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), CniError> {
        let c: Conf = types::parse_conf(&args.stdin)?;
        let path = saved_path(&c.data_dir(), &args.container_id, &args.ifname);
        // The extra networks first (they went on last); the default one
        // goes even if one of them fails (the runtime retries DEL, and
        // every step is idempotent).
        let extra = attachments::del_all(&attachments::record_path(&c.data_dir(), &path), args);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            // Never added, or deleted already: DEL is idempotent.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return extra,
            Err(e) => return Err(io(format!("podnet: reading {}", path.display()), e)),
        };
        let d: Value = serde_json::from_slice(&bytes).map_err(|e| {
            CniError::new(Code::Decode, format!("podnet: corrupt {}", path.display()))
                .with_details(e.to_string())
        })?;
        delegate(&delegate_type(&d), Command::Del, args, &bytes)?;
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(c.guard_record(args));
        // A notice only: an agent that is down reads the pod's removal
        // from its object source.
        if let Ok(s) = UnixStream::connect(c.agent_socket()) {
            let _ = tell_agent(s, args, "del", &[], None);
        }
        extra
    }

    fn check(&self, args: &CmdArgs) -> Result<(), CniError> {
        let c: Conf = types::parse_conf(&args.stdin)?;
        let path = saved_path(&c.data_dir(), &args.container_id, &args.ifname);
        let bytes = std::fs::read(&path)
            .map_err(|e| io(format!("podnet: reading {}", path.display()), e))?;
        let mut d: Value = serde_json::from_slice(&bytes).map_err(|e| {
            CniError::new(Code::Decode, format!("podnet: corrupt {}", path.display()))
                .with_details(e.to_string())
        })?;
        if let Some(p) = &c.prev_result {
            d["prevResult"] = p.clone();
        }
        let bytes = serde_json::to_vec(&d).expect("json");
        delegate(&delegate_type(&d), Command::Check, args, &bytes)?;
        attachments::check_all(&attachments::record_path(&c.data_dir(), &path), args)
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), CniError> {
        let c: Conf = types::parse_conf(&args.stdin)?;
        check_delegate(&c)?;
        let valid = c.valid_attachments.clone().unwrap_or_default();
        let dir = c.data_dir();
        let mut errors = Vec::new();
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for ent in rd.flatten() {
                let name = ent.file_name().to_string_lossy().into_owned();
                let live = valid
                    .iter()
                    .any(|a| saved_path(&dir, &a.container_id, &a.ifname) == ent.path());
                if live {
                    continue;
                }
                let (id, ifname) = match name.split_once('@') {
                    Some((i, f)) => (i.to_string(), f.to_string()),
                    None => (name.clone(), "eth0".to_string()),
                };
                let Ok(bytes) = std::fs::read(ent.path()) else {
                    continue;
                };
                let Ok(d) = serde_json::from_slice::<Value>(&bytes) else {
                    continue;
                };
                let sub = CmdArgs {
                    container_id: id,
                    ifname,
                    netns: String::new(),
                    ..args.clone()
                };
                let record = attachments::record_path(&dir, &ent.path());
                if let Err(e) = attachments::del_all(&record, &sub) {
                    errors.push(e.to_string());
                }
                match delegate(&delegate_type(&d), Command::Del, &sub, &bytes) {
                    Ok(_) => {
                        let _ = std::fs::remove_file(c.guard_record(&sub));
                        let _ = std::fs::remove_file(ent.path());
                    }
                    Err(e) => errors.push(e.to_string()),
                }
            }
        }
        if let Ok(env) = c.read_env() {
            let mut d = c.delegate_conf(&env);
            d["cniVersion"] = json!(c.cni_version);
            d["cni.dev/valid-attachments"] = serde_json::to_value(&valid).expect("json");
            let bytes = serde_json::to_vec(&d).expect("json");
            if let Err(e) = delegate(&delegate_type(&d), Command::Gc, args, &bytes) {
                errors.push(e.to_string());
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(CniError::internal(format!(
                "podnet GC: {}",
                errors.join("; ")
            )))
        }
    }

    fn status(&self, args: &CmdArgs) -> Result<(), CniError> {
        let c: Conf = types::parse_conf(&args.stdin)?;
        c.read_env()
            .map_err(|e| CniError::new(Code::NotAvailable, e.msg).with_details(e.details))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnet_env_flannel_and_podnet_names() {
        let e = SubnetEnv::parse(
            "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
            "f",
        )
        .unwrap();
        assert_eq!(e.subnet.to_string(), "10.244.1.1/24");
        assert_eq!(e.mtu, Some(1450));
        assert!(e.ipmasq);
        let e = SubnetEnv::parse("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nPODNET_SUBNET=10.244.9.1/24", "f").unwrap();
        assert_eq!(e.subnet.to_string(), "10.244.9.1/24");
        let err = SubnetEnv::parse("FLANNEL_NETWORK=10.244.0.0/16", "/run/x").unwrap_err();
        assert!(err.msg.contains("FLANNEL_SUBNET"), "{}", err.msg);
        assert_eq!(e.ipv6, None);
    }

    /// Dual-stack: flannel's IPv6 names give the delegate a second range
    /// and a route to the IPv6 network.
    #[test]
    fn a_dual_stack_lease_gives_both_families() {
        let text = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\n\
                    FLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:1::1/64\n";
        let e = SubnetEnv::parse(text, "f").unwrap();
        let c: Conf =
            types::parse_conf(br#"{"cniVersion":"1.0.0","name":"p","type":"podnet"}"#).unwrap();
        let d = c.delegate_conf(&e);
        assert_eq!(
            d["ipam"]["ranges"],
            json!([[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:10:244:1::/64"}]])
        );
        assert_eq!(
            d["ipam"]["routes"],
            json!([{"dst": "10.244.0.0/16"}, {"dst": "fd00:10:244::/56"}])
        );
        let half = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_IPV6_SUBNET=fd00::1/64\n";
        let err = SubnetEnv::parse(half, "/run/x").unwrap_err();
        assert!(err.msg.contains("FLANNEL_IPV6_NETWORK"), "{}", err.msg);
    }

    #[test]
    fn delegate_to_itself_is_refused() {
        let e = parse_config(
            br#"{"cniVersion":"1.0.0","name":"p","type":"podnet","delegate":{"type":"podnet"}}"#,
        )
        .unwrap_err();
        assert_eq!(e.code, 7);
        assert_eq!(
            e.msg,
            "podnet: delegate type \"podnet\" would delegate to itself"
        );
        let e = parse_config(br#"{"name":"p","type":"podnet","delegate":{"type":1}}"#).unwrap_err();
        assert_eq!(
            (e.code, e.msg.as_str()),
            (7, "podnet: delegate.type must be a string, not a number")
        );
        parse_config(br#"{"name":"p","type":"podnet","delegate":{"type":"bridge"}}"#).unwrap();
    }

    /// No agent: a socket path with no file, and a socket file nobody
    /// listens on (what a stopped agent leaves), each fail after the wait
    /// with code 11 and a message naming the socket.
    #[test]
    fn an_absent_agent_fails_after_the_wait_naming_its_socket() {
        struct Dir(PathBuf);
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let dir = Dir(std::env::temp_dir().join(format!("pn-agent-sock-{}", std::process::id())));
        std::fs::create_dir_all(&dir.0).unwrap();
        let path = dir.0.join("agent.sock");
        let wait = Duration::from_millis(50);
        let e = connect_agent(&path, wait).unwrap_err();
        assert_eq!(e.code, 11);
        assert!(
            e.msg
                .starts_with("podnet: the podnet agent is not running on this node: ")
                && e.msg
                    .contains(&format!("its socket {} does not exist", path.display())),
            "{e}"
        );
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists(), "a closed listener leaves its socket file");
        let e = connect_agent(&path, wait).unwrap_err();
        assert_eq!(e.code, 11);
        assert!(
            e.msg
                .contains(&format!("nothing listens on its socket {}", path.display())),
            "{e}"
        );
        let _l = std::os::unix::net::UnixListener::bind(dir.0.join("b.sock")).unwrap();
        connect_agent(&dir.0.join("b.sock"), wait).unwrap();
    }

    #[test]
    fn agent_keys() {
        let conf = |extra: Value| -> Conf {
            let mut v = json!({"cniVersion": "1.0.0", "name": "p", "type": "podnet"});
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            serde_json::from_value(v).unwrap()
        };
        let c = conf(json!({}));
        assert_eq!(c.agent_wait().unwrap(), Duration::from_secs(5));
        assert_eq!(c.require_agent, None, "not required unless said so");
        let c = conf(json!({"agentWaitSeconds": 0.5, "requireAgent": false}));
        assert_eq!(c.agent_wait().unwrap(), Duration::from_millis(500));
        assert_eq!(c.require_agent, Some(false));
        let e = parse_config(br#"{"name":"p","type":"podnet","agentWaitSeconds":-1}"#).unwrap_err();
        assert_eq!(
            (e.code, e.msg.as_str()),
            (
                7,
                "podnet: agentWaitSeconds must be a number of seconds, not -1"
            )
        );
    }

    #[test]
    fn delegate_defaults_like_flannel() {
        let c: Conf = serde_json::from_value(json!({
            "cniVersion": "1.0.0", "name": "podnet", "type": "podnet",
            "delegate": {"hairpinMode": false}
        }))
        .unwrap();
        let env = SubnetEnv::parse("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true", "f").unwrap();
        let d = c.delegate_conf(&env);
        assert_eq!(d["type"], "bridge");
        assert_eq!(d["bridge"], DEFAULT_BRIDGE);
        assert_eq!(d["ipMasq"], false);
        assert_eq!(d["hairpinMode"], false);
        assert_eq!(d["mtu"], 1450);
        assert_eq!(d["ipam"]["ranges"][0][0]["subnet"], "10.244.1.0/24");
        assert_eq!(d["ipam"]["routes"][0]["dst"], "10.244.0.0/16");
        assert_eq!(d["cniVersion"], "1.0.0");
    }
}
