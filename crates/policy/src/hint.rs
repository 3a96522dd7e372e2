//! No open window: the CNI plugin's ADD waits here until the new pod is
//! programmed.
//!
//! The agent listens on a unix socket beside the node's subnet file
//! (`/run/podnet/agent.sock` by default; the `podnet` CNI plugin finds it
//! from its `subnetFile`). The plugin sends one JSON line once the pod has
//! its address, `{"op":"add","namespace":..,"name":..,"ips":[..]}`, and
//! reads one back: `{"ok":true}` once the batch holding the pod's
//! isolation, its allows and its `pods` entry is in the kernel, or
//! `{"error":".."}`. A DEL sends `"op":"del"`.
//!
//! An ADD through podnet's bridge also names the pod's bridge port and MAC
//! (`"port":"veth…","mac":"0a:58:…","attachment":"<container id>"`): the anti-spoofing guard
//! ([`crate::guardplane`]) lets the port speak with those and the pod's
//! addresses only, and the answer waits for the guard's batch too.
//!
//! Together with failing closed (an address of the node's subnet the table
//! does not know is dropped, see [`crate::plan`]), no packet reaches a new
//! pod unjudged, and an allowed one does not depend on timing: when the
//! runtime starts the pod's process, its rules are there.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use podnet_reconcile::Input;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};

use crate::dataplane::PolicyInput;
use crate::guard::{parse_mac, Port};
use crate::guardplane::GuardInput;
use crate::world::Key;

/// The loops a request feeds.
#[derive(Clone)]
pub struct Loops {
    pub policy: mpsc::Sender<Input<PolicyInput>>,
    pub guard: mpsc::Sender<Input<GuardInput>>,
}

/// The socket's file name, in the subnet file's directory.
pub const SOCKET_NAME: &str = "agent.sock";

/// How long an ADD may wait for its sync.
pub const WAIT: Duration = Duration::from_secs(10);

/// The plugin's line: which pod, and its addresses.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Request {
    pub op: String,
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub ips: Vec<IpAddr>,
    /// The host side of the pod's veth (its bridge port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
    /// The pod's MAC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// The attachment (container ID, `@ifname` unless `eth0`) the port
    /// belongs to: what the guard keys it by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachment: Option<String>,
    /// Fields of the ops other subsystems answer (see [`Other`]).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Request {
    /// The guard's key for this request (the pod's name from a plugin
    /// that does not send the attachment).
    fn attachment(&self, key: &Key) -> String {
        self.attachment.clone().unwrap_or_else(|| key.to_string())
    }
}

/// The agent's line: programmed, or why not.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct Reply {
    #[serde(default)]
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the ops other subsystems answer carry back.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Reply {
    pub fn ok() -> Reply {
        Reply {
            ok: true,
            ..Default::default()
        }
    }

    pub fn err(why: impl Into<String>) -> Reply {
        Reply {
            ok: false,
            error: Some(why.into()),
            ..Default::default()
        }
    }
}

/// Answers the ops this module does not own, for the agent's other
/// subsystems (the pod's extra networks: `networks`, `network-status`):
/// one socket, so the plugin finds one agent.
pub type Other = std::sync::Arc<
    dyn Fn(Request) -> std::pin::Pin<Box<dyn std::future::Future<Output = Reply> + Send>>
        + Send
        + Sync,
>;

/// The socket and what answers the ops this module does not own.
#[derive(Clone)]
pub struct Socket {
    pub path: PathBuf,
    pub other: Option<Other>,
}

impl Socket {
    pub fn at(path: PathBuf) -> Socket {
        Socket { path, other: None }
    }
}

/// The socket path for a subnet file.
pub fn socket_for(subnet_file: &Path) -> PathBuf {
    subnet_file
        .parent()
        .unwrap_or(Path::new("/run/podnet"))
        .join(SOCKET_NAME)
}

/// Waits for one loop's answer.
async fn wait(key: &Key, what: &str, done: oneshot::Receiver<Result<(), String>>) -> Reply {
    match tokio::time::timeout(WAIT, done).await {
        Ok(Ok(Ok(()))) => Reply::ok(),
        Ok(Ok(Err(e))) => Reply::err(e),
        Ok(Err(_)) => Reply::err(format!("the {what} loop dropped the request")),
        Err(_) => Reply::err(format!(
            "pod {key}: {what} not programmed within {}s",
            WAIT.as_secs()
        )),
    }
}

/// The guard's facts of an ADD: its port and MAC, if it names them.
fn port_of(req: &Request) -> Result<Option<Port>, Reply> {
    let (Some(port), Some(mac)) = (&req.port, &req.mac) else {
        return Ok(None);
    };
    let mac = parse_mac(mac).ok_or_else(|| Reply::err(format!("bad mac {mac:?}")))?;
    Ok(Some(Port {
        port: port.clone(),
        mac,
        ips: req.ips.clone(),
    }))
}

async fn add(req: Request, key: Key, tx: &Loops) -> Reply {
    let port = match port_of(&req) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let attachment = req.attachment(&key);
    let (ack, policy_done) = oneshot::channel();
    let msg = PolicyInput::Added {
        key: key.clone(),
        ips: req.ips,
        ack: Some(ack),
    };
    if tx.policy.send(Input::Changes(msg)).await.is_err() {
        return Reply::err("the policy loop is gone");
    }
    let guard_done = match port {
        None => None,
        Some(p) => {
            let (ack, done) = oneshot::channel();
            let msg = GuardInput {
                key: attachment,
                port: Some(p),
                ack: Some(ack),
            };
            if tx.guard.send(Input::Changes(msg)).await.is_err() {
                return Reply::err("the guard loop is gone");
            }
            Some(done)
        }
    };
    let r = wait(&key, "policy", policy_done).await;
    match guard_done {
        Some(done) if r.ok => wait(&key, "port guard", done).await,
        _ => r,
    }
}

async fn handle(
    stream: tokio::net::UnixStream,
    tx: Loops,
    other: Option<Other>,
) -> std::io::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut line = String::new();
    BufReader::new(r).read_line(&mut line).await?;
    let reply = match serde_json::from_str::<Request>(&line) {
        Err(e) => Reply::err(format!("bad request: {e}")),
        Ok(req) => {
            let key = Key::new(&req.namespace, &req.name);
            match req.op.as_str() {
                "add" => add(req, key, &tx).await,
                "del" => {
                    let gone = GuardInput {
                        key: req.attachment(&key),
                        port: None,
                        ack: None,
                    };
                    let _ = tx.guard.send(Input::Changes(gone)).await;
                    let _ = tx
                        .policy
                        .send(Input::Changes(PolicyInput::Removed { key }))
                        .await;
                    Reply::ok()
                }
                _ if other.is_some() => (other.as_ref().expect("checked"))(req).await,
                op => Reply::err(format!("unknown op {op:?} (add, del)")),
            }
        }
    };
    let mut out = serde_json::to_vec(&reply).expect("json");
    out.push(b'\n');
    w.write_all(&out).await
}

/// Serves the socket until the task is dropped.
pub async fn serve(socket: Socket, tx: Loops) -> std::io::Result<()> {
    let Socket { path, other } = socket;
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let _ = std::fs::remove_file(&path);
    let l = UnixListener::bind(&path)?;
    // What connects here programs the port guard (which MAC and addresses
    // a pod port may use): root's only, whatever the umask.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    }
    tracing::info!(socket = %path.display(), "answering the CNI plugin's ADD once a pod is programmed");
    loop {
        let (s, _) = l.accept().await?;
        let (tx, other) = (tx.clone(), other.clone());
        tokio::spawn(async move {
            if let Err(e) = handle(s, tx, other).await {
                tracing::debug!("CNI request: {e}");
            }
        });
    }
}

/// Serves the socket at `path` for an agent that runs without
/// NetworkPolicy (`--no-policy`): there is nothing to program, so every
/// ADD is answered at once. The socket is still served because the CNI
/// plugin's ADD fails while no agent answers on it: it is how a pod's
/// sandbox learns that the node's agent runs.
pub async fn serve_without_policy(socket: Socket) -> std::io::Result<()> {
    let (policy, mut policy_rx) = mpsc::channel::<Input<PolicyInput>>(64);
    let (guard, mut guard_rx) = mpsc::channel::<Input<GuardInput>>(64);
    tokio::spawn(async move {
        while let Some(m) = policy_rx.recv().await {
            if let Input::Changes(PolicyInput::Added { ack: Some(ack), .. }) = m {
                let _ = ack.send(Ok(()));
            }
        }
    });
    // No guard either (it goes with NetworkPolicy): a port is not judged.
    tokio::spawn(async move {
        while let Some(m) = guard_rx.recv().await {
            if let Input::Changes(GuardInput { ack: Some(ack), .. }) = m {
                let _ = ack.send(Ok(()));
            }
        }
    });
    serve(socket, Loops { policy, guard }).await
}
