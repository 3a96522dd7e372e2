//! The web view (`podnet ui`) in a real headless browser: Debian's
//! Chromium, driven over its DevTools protocol (JSON over a WebSocket).
//! In a running lab the page must show the nodes and their pods, the
//! Services with their endpoints and the live flows; a trace started from
//! the page must come back and be drawn as a path from the source pod
//! through both nodes to the endpoint. Then the same page as a real node
//! serves it (`podnet ui` inside node1 with no `--lab`): its API over
//! HTTP, and in the browser the nodes, pods and a trace whose path shows
//! node2 as not observed. Screenshots are kept as artifacts in
//! `$CARGO_TARGET_TMPDIR/ui-artifacts/`.

use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use podnet_testkit::{eventually, free_port, require_root};
use serde_json::{json, Value};
use tungstenite::{stream::MaybeTlsStream, Message, WebSocket};

const WAIT: Duration = Duration::from_secs(60);

/// Run in the page before its own script: records the flow table's rows
/// at the moment the status first reads `live` (`window.liveFlows`).
const LIVE_FLOWS: &str = r##"
document.addEventListener("DOMContentLoaded", () => {
  const st = document.getElementById("status");
  if (!st) return;
  new MutationObserver(() => {
    if (window.liveFlows === undefined && st.textContent === "live")
      window.liveFlows = [...document.querySelectorAll("#flows tbody tr")].map((r) => r.textContent);
  }).observe(st, {childList: true, characterData: true, subtree: true});
});
"##;

/// Whether a flow record is a trace's connection from pod a to the
/// Service web.
fn is_trace_flow(f: &Value) -> bool {
    f["src_name"] == "default/a" && f["dst_name"] == "Service default/web"
}

#[path = "common/kubelab.rs"]
mod kubelab;
use kubelab::podnet;

/// A child whose whole process group is killed when dropped (Chromium
/// starts helpers of its own).
struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group this test created.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

fn spawn_group(mut cmd: Command, log: &Path) -> Group {
    let f = std::fs::File::create(log).unwrap();
    cmd.stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .process_group(0);
    Group(
        cmd.spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}")),
    )
}

/// Headless Chromium and a DevTools session on its one page.
struct Browser {
    ws: WebSocket<MaybeTlsStream<TcpStream>>,
    next: u64,
    _proc: Group,
    _dir: tempfile::TempDir,
}

impl Browser {
    fn start(artifacts: &Path) -> Browser {
        let exe = ["chromium", "chromium-browser"]
            .into_iter()
            .find(|c| {
                Command::new("sh")
                    .args(["-c", &format!("command -v {c}")])
                    .output()
                    .is_ok_and(|o| o.status.success())
            })
            .expect("chromium is not installed: scripts/setup.sh installs it");
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(exe);
        cmd.args([
            "--headless=new",
            // Root has no user namespace sandbox here.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "--window-size=1400,1000",
            // A name an attacker owns, resolving to this machine: what
            // DNS rebinding makes of a foreign page.
            "--host-resolver-rules=MAP evil.example 127.0.0.1",
        ])
        .arg(format!("--user-data-dir={}", dir.path().display()))
        .arg("about:blank");
        let proc = spawn_group(cmd, &artifacts.join("chromium.log"));
        // Chromium writes the port it chose once it listens.
        let port_file = dir.path().join("DevToolsActivePort");
        let port: u16 = eventually("Chromium's DevTools port", WAIT, || {
            std::fs::read_to_string(&port_file)
                .ok()?
                .lines()
                .next()?
                .trim()
                .parse()
                .ok()
        });
        let list: Value = eventually("Chromium's page target", WAIT, || {
            // Chromium's DevTools server wants HTTP/1.1.
            use std::io::{Read, Write};
            let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            // Its WebSocket URLs name the host this request names.
            let req = format!("GET /json/list HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
            s.write_all(req.as_bytes()).ok()?;
            // It keeps the connection open: read by Content-Length.
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                let n = s.read(&mut chunk).ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).to_string();
                let Some((head, body)) = text.split_once("\r\n\r\n") else {
                    continue;
                };
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_string())
                    })?
                    .parse()
                    .ok()?;
                if body.len() < len {
                    continue;
                }
                return (head.split_whitespace().nth(1)? == "200")
                    .then(|| serde_json::from_str::<Value>(&body[..len]).ok())
                    .flatten();
            }
        });
        let url = list
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .expect("a page target")
            .to_string();
        let (ws, _) = tungstenite::connect(url).expect("DevTools WebSocket");
        Browser {
            ws,
            next: 1,
            _proc: proc,
            _dir: dir,
        }
    }

    /// One DevTools command; its result (events in between are skipped).
    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let msg = json!({"id": id, "method": method, "params": params});
        self.ws.send(Message::text(msg.to_string())).unwrap();
        loop {
            let m = self.ws.read().expect("DevTools message");
            let Message::Text(t) = m else { continue };
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// Evaluates `expr` in the page (awaiting a promise); its value.
    fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(r.get("exceptionDetails").is_none(), "{expr}: {r}");
        r["result"]["value"].clone()
    }

    /// Whether the page shows node1 with pod default/a, node2 with
    /// default/web1, the live event stream, and `more` (a JavaScript
    /// condition).
    fn shows_both_nodes(&mut self, more: &str) -> bool {
        self.eval(&format!(
            r#"(() => {{
                const n1 = document.querySelector('[data-node="node1"]');
                const n2 = document.querySelector('[data-node="node2"]');
                return !!(n1 && n2
                    && n1.querySelector('[data-pod="default/a"]')
                    && n2.querySelector('[data-pod="default/web1"]')
                    && document.getElementById('status').textContent === 'live'
                    && ({more}));
            }})()"#
        )) == json!(true)
    }

    /// Fills the trace form with `src` and `dst`, clicks, and waits until
    /// the hops end in a delivery.
    fn trace_from_form(&mut self, src: &str, dst: &str) {
        self.eval(&format!(
            r#"(() => {{
                document.getElementById('trace-src').value = '{src}';
                document.getElementById('trace-dst').value = '{dst}';
                document.getElementById('trace-go').click();
                return true;
            }})()"#
        ));
        eventually(&format!("{src} -> {dst}'s hops on the page"), WAIT, || {
            self.eval("document.querySelectorAll('#hops li[data-kind=deliver]').length") == json!(1)
        });
    }

    /// The trace's path as drawn: `from>to` per segment.
    fn drawn_path(&mut self) -> Value {
        self.eval("[...document.querySelectorAll('#overlay .trace-seg')].map(s => s.dataset.from + '>' + s.dataset.to)")
    }

    /// Checks the flow table as it was when the page first went live
    /// (recorded by [`LIVE_FLOWS`]): the trace's flow from before the page
    /// opened is already there.
    fn check_flows_at_live(&mut self) {
        let at_live = self.eval("window.liveFlows");
        assert!(
            at_live.as_array().is_some_and(|rows| rows.iter().any(|r| r
                .as_str()
                .is_some_and(|r| r.contains("default/a") && r.contains("Service default/web")))),
            "when the page went live its flow table held {at_live}"
        );
    }

    fn screenshot(&mut self, path: &Path) {
        use base64_png::decode;
        let r = self.call("Page.captureScreenshot", json!({"format": "png"}));
        let png = decode(r["data"].as_str().unwrap());
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(path, png).unwrap();
    }
}

/// Base64, just enough to store the screenshots.
mod base64_png {
    pub fn decode(s: &str) -> Vec<u8> {
        let val = |c: u8| match c {
            b'A'..=b'Z' => Some(c - b'A'),
            b'a'..=b'z' => Some(c - b'a' + 26),
            b'0'..=b'9' => Some(c - b'0' + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        };
        let mut out = Vec::with_capacity(s.len() * 3 / 4);
        let (mut acc, mut bits) = (0u32, 0);
        for v in s.bytes().filter_map(val) {
            acc = (acc << 6) | v as u32;
            bits += 6;
            if bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
            }
        }
        out
    }
}

struct Lab(String);

impl Lab {
    fn ok(&self, args: &[&str]) -> String {
        let mut a = vec!["lab", "--name", &self.0];
        a.extend_from_slice(args);
        let o = podnet(&a);
        assert!(
            o.status.success(),
            "lab {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).to_string()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = podnet(&["lab", "--name", &self.0, "down"]);
    }
}

fn artifacts() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui-artifacts");
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn the_web_view_shows_the_lab_and_draws_a_trace_in_a_real_browser() {
    require_root();
    let lab = Lab(format!("ui{}", std::process::id() % 100_000));
    lab.ok(&["up", "--nodes", "2", "--backend", "vxlan", "--resync", "1"]);
    lab.ok(&["run", "default/a", "--node", "node1"]);
    lab.ok(&[
        "run",
        "default/web1",
        "--node",
        "node2",
        "--labels",
        "app=web",
    ]);
    let store = format!("sqlite:///run/podnet-lab/{}/state.db", lab.0);
    let manifest = std::env::temp_dir().join(format!("pn-ui-{}.yaml", lab.0));
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  selector: {app: web}\n  ports: [{name: http, port: 80, targetPort: 80, protocol: TCP}]\n",
    )
    .unwrap();
    let o = podnet(&["--store", &store, "apply", "-f", manifest.to_str().unwrap()]);
    let _ = std::fs::remove_file(&manifest);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    flow_history(&lab);
    // The Service works before the page is asked to trace it.
    eventually("default/a reaches the Service", WAIT, || {
        let o = podnet(&[
            "trace",
            "--lab",
            &lab.0,
            "default/a",
            "default/web:80",
            "-o",
            "json",
        ]);
        let t: Value = serde_json::from_slice(&o.stdout).ok()?;
        (t["outcome"]["outcome"] == "connected").then_some(())
    });

    let out = artifacts();
    let port = free_port(None);
    let listen = format!("127.0.0.1:{port}");
    let mut ui_cmd = Command::new(env!("CARGO_BIN_EXE_podnet"));
    ui_cmd.args(["ui", "--lab", &lab.0, "--listen", &listen]);
    let ui_log = out.join("podnet-ui.log");
    let _ui = spawn_group(ui_cmd, &ui_log);
    let view = View::started(None, ([127, 0, 0, 1], port).into(), &ui_log);
    let topo = view.topology();
    assert_eq!(topo["lab"], format!("lab {}", lab.0));
    check_refusals(&view);
    check_recent_flows(&view);
    let web_ip = topo["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "default/web1")
        .and_then(|p| p["ip"].as_str())
        .unwrap()
        .to_string();

    let mut b = Browser::start(&out);
    b.call("Page.enable", json!({}));
    // What the flow table holds at the moment the page goes live: what
    // happened before it opened must already be there.
    b.call(
        "Page.addScriptToEvaluateOnNewDocument",
        json!({"source": LIVE_FLOWS}),
    );
    // The page, opened with the URL the web view printed.
    b.call("Page.navigate", json!({"url": view.url}));
    // The picture: both nodes, each pod on its node, the Service with its
    // endpoint, and the live event stream connected.
    eventually("the page shows the lab", WAIT, || {
        b.shows_both_nodes(r#"document.querySelector('[data-service="default/web"]')"#)
    });
    let svc_row = b.eval(r#"document.querySelector('[data-service="default/web"]').textContent"#);
    assert!(
        svc_row.as_str().unwrap().contains(&format!("{web_ip}:80")),
        "{svc_row}"
    );
    let subnets = b.eval(r#"[...document.querySelectorAll('[data-node] .meta')].map(e => e.textContent).join(' | ')"#);
    assert!(
        subnets.as_str().unwrap().contains("subnet 10.244."),
        "{subnets}"
    );
    let tunnels = b.eval("document.querySelectorAll('#overlay .tunnel').length");
    assert_eq!(tunnels, json!(1), "one tunnel between two nodes");
    b.screenshot(&out.join("topology.png"));
    b.check_flows_at_live();
    // The token left the address bar (and so any Referer and history).
    assert_eq!(b.eval("location.href"), json!(format!("http://{listen}/")));

    // A trace started from the page: the form, the button, the hops.
    b.trace_from_form("default/a", "default/web:80");
    let kinds = b.eval("[...document.querySelectorAll('#hops li')].map(l => l.dataset.kind)");
    let kinds: Vec<&str> = kinds
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    for k in [
        "pod-route",
        "veth",
        "rule",
        "service",
        "route",
        "policy",
        "masquerade",
        "deliver",
    ] {
        assert!(kinds.contains(&k), "no {k} hop drawn: {kinds:?}");
    }
    assert!(b
        .eval("document.getElementById('trace-summary').textContent")
        .as_str()
        .unwrap()
        .ends_with("connected"));
    // The path across the picture: pod a, node1, node2, then web1.
    assert_eq!(
        b.drawn_path(),
        json!(["default/a>node1", "node1>node2", "node2>default/web1"]),
        "the drawn path"
    );
    let hot = b.eval(
        "[...document.querySelectorAll('.hot')].map(e => e.dataset.pod || e.dataset.node).sort()",
    );
    assert_eq!(hot, json!(["default/a", "default/web1", "node1", "node2"]));
    b.screenshot(&out.join("trace.png"));

    // The live flows: the trace's own connection, named.
    eventually("the flow on the page", WAIT, || {
        b.eval("[...document.querySelectorAll('#flows tbody tr')].some(r => r.textContent.includes('default/a') && r.textContent.includes('Service default/web'))")
            == json!(true)
    });
    b.screenshot(&out.join("flows.png"));

    check_foreign_page(&mut b, &view, &ui_log);

    // On a real node: `podnet ui` inside node1 with no --lab, the cluster
    // read from the store, served in node1's namespace. The same API, as
    // this node sees the cluster.
    let ns_name = format!("pn-{}-node1", lab.0);
    let ns = podnet_kernel::Netns::named(&ns_name).unwrap();
    // The browser reaches it through a forwarder on the same port here
    // (its Host must name the web view's own address).
    let at: std::net::SocketAddr = ([127, 0, 0, 1], free_port(None)).into();
    let subnet = format!("/run/podnet-lab/{}/nodes/node1/subnet.env", lab.0);
    let mut node_ui = Command::new("ip");
    node_ui.args(["netns", "exec", &ns_name, env!("CARGO_BIN_EXE_podnet")]);
    node_ui.args([
        "ui",
        "--node",
        "node1",
        "--store",
        &store,
        "--subnet-file",
        &subnet,
        "--listen",
        &at.to_string(),
    ]);
    let node_log = out.join("podnet-ui-node.log");
    let _node_ui = spawn_group(node_ui, &node_log);
    let node_view = View::started(Some(ns), at, &node_log);
    check_node_api(&node_view);
    // The live stream carries this node's flows.
    let stream = read_events(&node_view, "default/a", WAIT);
    assert!(stream.contains("event: topology"), "{stream}");

    // The node's page in the browser (which runs here, so a forwarder
    // carries its connections into node1): both nodes and their pods, and
    // a trace from the page drawn from pod a through node1 towards node2.
    forward_into(&ns_name, at);
    b.call("Page.navigate", json!({"url": node_view.url}));
    eventually("the node's page", WAIT, || b.shows_both_nodes("true"));
    b.trace_from_form("default/a", "default/web:80");
    assert_eq!(
        b.drawn_path(),
        json!(["default/a>node1", "node1>node2", "node2>default/web1"]),
        "the drawn path"
    );
    // node2 is on the path, drawn as not observed from node1.
    let unobserved =
        b.eval("[...document.querySelectorAll('.unobserved')].map(e => e.dataset.node)");
    assert_eq!(unobserved, json!(["node2"]));
    b.screenshot(&out.join("node-trace.png"));
    eprintln!("screenshots in {}", out.display());
}

/// A node's web view over HTTP: the cluster as node1 sees it, the page,
/// a trace from node1's pod (node2 not observed), and a refusal to trace
/// from a pod of node2.
fn check_node_api(node_view: &View) {
    let topo = node_view.topology();
    assert_eq!(topo["lab"], "node node1", "{topo:#}");
    let nodes: Vec<(&str, bool)> = topo["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["name"].as_str().unwrap(), n["subnet"].is_string()))
        .collect();
    assert!(
        nodes.contains(&("node1", true)) && nodes.contains(&("node2", true)),
        "{topo:#}"
    );
    let (code, page) = node_view.get("/").unwrap();
    assert_eq!(code, 200);
    assert!(page.contains("/api/events"), "the page is served");
    let (code, body) = node_view
        .call(
            "POST",
            "/api/trace",
            "src=default%2Fa&dst=default%2Fweb%3A80",
        )
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let t: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(t["outcome"]["outcome"], "connected", "{t:#}");
    assert_eq!(t["unobserved"], json!(["node2"]), "{t:#}");
    // A pod of node2 is traced on node2.
    let (code, body) = node_view
        .call(
            "POST",
            "/api/trace",
            "src=default%2Fweb1&dst=default%2Fa%3A80",
        )
        .unwrap();
    assert_eq!(code, 400);
    assert!(body.contains("runs on node node2"), "{body}");
}

/// History for the flow log: more flows than one page of an agent's log
/// (1,000) from pod a to web1 (one UDP datagram from each of 1,200
/// sockets); traces after it are the newest flows.
fn flow_history(lab: &Lab) {
    let web1: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("/run/podnet-lab/{}/pods/default_web1.json", lab.0))
            .unwrap(),
    )
    .unwrap();
    let burst = format!(
        "import socket\nfor _ in range(1200):\n    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    s.sendto(b'x', ('{}', 9))\n    s.close()\n",
        web1["ip"].as_str().unwrap()
    );
    lab.ok(&["exec", "default/a", "--", "python3", "-c", &burst]);
}

/// The flows that happened before the web view started: the newest ones
/// (the traces', after the burst), on its first answer.
fn check_recent_flows(view: &View) {
    let (code, body) = view.get("/api/flows").unwrap();
    assert_eq!(code, 200, "{body}");
    let recent: Value = serde_json::from_str(&body).unwrap();
    let flows = recent["flows"].as_array().unwrap();
    assert!(flows.len() <= 200, "{} flows", flows.len());
    assert!(flows.iter().any(is_trace_flow), "{recent:#}");
    // node1 logged more than one page (a reused source port is one flow).
    assert!(
        recent["after"]["node1"].as_u64().unwrap() > 1000,
        "{}",
        recent["after"]
    );
}

/// A page of another origin. evil.example resolves to this machine (as
/// DNS rebinding makes it), so that page's own origin is the web view's
/// port: it is refused, reading the cluster from it is refused even with
/// the token, and a trace it sends to the real name is refused by its
/// Origin (nothing is run).
fn check_foreign_page(b: &mut Browser, view: &View, ui_log: &Path) {
    let port = view.at.port();
    let listen = view.at;
    b.call(
        "Page.navigate",
        json!({"url": format!("http://evil.example:{port}/")}),
    );
    eventually("the refusal as the foreign page", WAIT, || {
        b.eval("document.body ? document.body.innerText : ''")
            .as_str()
            .is_some_and(|t| t.contains("is not this server"))
    });
    let read = b.eval(&format!(
        "fetch('/api/topology', {{headers: {{Authorization: 'Bearer {}'}}}}).then(async r => r.status + ' ' + await r.text())",
        view.token
    ));
    let read = read.as_str().unwrap();
    assert!(
        read.starts_with("421 ") && !read.contains("default/a"),
        "{read}"
    );
    // From there, a trace on the web view's real name: sent (no-cors, as
    // a form would be) and refused by its Origin; nothing is run.
    let sent = b.eval(&format!(
        "fetch('http://{listen}/api/trace', {{method: 'POST', mode: 'no-cors', credentials: 'include', body: new URLSearchParams({{src: 'default/a', dst: 'default/web:80'}})}}).then(() => 'sent', e => String(e))"
    ));
    assert_eq!(sent, json!("sent"));
    let refusal = format!(
        "refused POST /api/trace: podnet ui: Origin \"http://evil.example:{port}\" is not this server"
    );
    eventually("the foreign page's trace refused", WAIT, || {
        std::fs::read_to_string(ui_log)
            .ok()?
            .contains(&refusal)
            .then_some(())
    });
}

/// One request to a web view at `at` (from inside `ns` when given), with
/// the given extra header lines: the status, the headers and the body.
fn ui_http(
    ns: Option<&podnet_kernel::Netns>,
    at: std::net::SocketAddr,
    head: &str,
    body: &str,
) -> Option<(u16, String, String)> {
    use std::io::{Read, Write};
    let connect = || TcpStream::connect_timeout(&at, Duration::from_secs(5));
    let mut s = match ns {
        Some(ns) => ns.run(connect).unwrap(),
        None => connect(),
    }
    .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    let req = format!(
        "{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (h, b) = out.split_once("\r\n\r\n")?;
    Some((
        h.split_whitespace().nth(1)?.parse().ok()?,
        h.into(),
        b.into(),
    ))
}

/// A web view as its user reaches it: its address and the token from the
/// URL it printed at start (`http://127.0.0.1:PORT/?token=…` in its log).
struct View {
    ns: Option<podnet_kernel::Netns>,
    at: std::net::SocketAddr,
    url: String,
    token: String,
}

impl View {
    fn started(ns: Option<podnet_kernel::Netns>, at: std::net::SocketAddr, log: &Path) -> View {
        let url = eventually("the web view's URL with its token", WAIT, || {
            let text = std::fs::read_to_string(log).ok()?;
            let url = text
                .lines()
                .filter(|l| l.starts_with("podnet ui: ") && l.contains("?token="))
                .find_map(|l| l.rsplit_once(" on "))?
                .1;
            Some(url.trim().to_string())
        });
        assert!(url.starts_with(&format!("http://{at}/?token=")), "{url}");
        let token = url.rsplit_once("?token=").unwrap().1.to_string();
        assert_eq!(token.len(), 64, "{url}");
        View { ns, at, url, token }
    }

    /// `METHOD PATH` named as its user names it, with the token.
    fn call(&self, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/x-www-form-urlencoded",
            self.at, self.token
        );
        ui_http(self.ns.as_ref(), self.at, &head, body).map(|(c, _, b)| (c, b))
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        self.call("GET", path, "")
    }

    /// A request line and headers as given, no token unless they carry it.
    fn raw(&self, head: &str) -> (u16, String, String) {
        ui_http(self.ns.as_ref(), self.at, head, "").expect("an answer")
    }

    /// The picture, once it holds at least 3 pods.
    fn topology(&self) -> Value {
        eventually("the web view's topology", WAIT, || {
            let (code, body) = self.get("/api/topology")?;
            let t: Value = serde_json::from_str(&body).ok()?;
            (code == 200 && t["pods"].as_array()?.len() >= 3).then_some(t)
        })
    }
}

/// Every way in that is not the operator's own page is refused, over
/// plain HTTP, each for its own reason, and nothing of the cluster is
/// told: a rebound name (even with the token), a foreign Origin, a GET
/// that would act, a request without the token or with a wrong one.
fn check_refusals(v: &View) {
    let at = v.at;
    let tok = &v.token;
    let trace = "src=default%2Fa&dst=default%2Fweb%3A80";
    // DNS rebinding: the attacker's name, the attacker's Origin.
    for head in [
        format!("GET /api/topology HTTP/1.1\r\nHost: evil.example:{}\r\nOrigin: http://evil.example:{}\r\nAuthorization: Bearer {tok}", at.port(), at.port()),
        format!("GET / HTTP/1.1\r\nHost: evil.example:{}", at.port()),
        format!("GET /api/events HTTP/1.1\r\nHost: evil.example:{}\r\nAuthorization: Bearer {tok}", at.port()),
        "GET /api/topology HTTP/1.0".to_string(),
    ] {
        let (code, _, body) = v.raw(&head);
        assert_eq!(code, 421, "{head}: {body}");
        assert!(body.contains("is not this server") && !body.contains("node1"), "{body}");
    }
    // A page of another origin, a foreign site or another port of
    // 127.0.0.1, even one that holds the token.
    for origin in ["http://evil.example", "http://127.0.0.1:1", "null"] {
        let (code, _, body) = v.raw(&format!(
            "POST /api/trace?{trace} HTTP/1.1\r\nHost: {at}\r\nOrigin: {origin}\r\nAuthorization: Bearer {tok}"
        ));
        assert_eq!(code, 403, "{origin}: {body}");
        assert!(
            body.contains(&format!("Origin \"{origin}\" is not this server")),
            "{body}"
        );
    }
    // A GET never acts.
    let (code, head, body) = v.raw(&format!(
        "GET /api/trace?{trace} HTTP/1.1\r\nHost: {at}\r\nAuthorization: Bearer {tok}"
    ));
    assert_eq!(code, 405, "{body}");
    assert!(
        head.contains("Allow: POST") && body.contains("takes POST only"),
        "{head}\n{body}"
    );
    // No token, or a wrong one: nothing read, nothing run.
    // (Its last digit changed: appending a fixed one would be the token
    // itself once in 16 starts.)
    let last = if tok.ends_with('0') { '1' } else { '0' };
    let wrong = format!("{}{last}", &tok[..63]);
    assert_ne!(&wrong, tok);
    for (method, path) in [
        ("GET", "/api/topology"),
        ("GET", "/api/events"),
        ("POST", "/api/trace"),
    ] {
        for auth in ["".to_string(), format!("\r\nAuthorization: Bearer {wrong}")] {
            let (code, _, body) = v.raw(&format!("{method} {path} HTTP/1.1\r\nHost: {at}{auth}"));
            assert_eq!(code, 403, "{method} {path} {auth}: {body}");
            assert!(body.contains("needs the token podnet ui printed"), "{body}");
        }
    }
    // The operator's own requests still work, by every name of loopback.
    for host in [
        format!("127.0.0.1:{}", at.port()),
        format!("localhost:{}", at.port()),
    ] {
        let (code, _, body) = v.raw(&format!(
            "GET /api/topology HTTP/1.1\r\nHost: {host}\r\nOrigin: http://{host}\r\nAuthorization: Bearer {tok}"
        ));
        assert_eq!(code, 200, "{host}: {body}");
    }
}

/// Carries connections to `to` on this namespace's loopback to `to`
/// inside namespace `ns` (the browser runs here; a node's web view listens
/// in the node, and answers only to its own address). The forwarder
/// lives as long as the test process.
fn forward_into(ns: &str, to: std::net::SocketAddr) {
    let l = std::net::TcpListener::bind(to).unwrap();
    let ns = podnet_kernel::Netns::named(ns).unwrap();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let Ok(Ok(out)) = ns.run(|| TcpStream::connect(to)) else {
                continue;
            };
            let (Ok(c2), Ok(o2)) = (c.try_clone(), out.try_clone()) else {
                continue;
            };
            let pipe = |mut from: TcpStream, mut to: TcpStream| {
                move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(std::net::Shutdown::Write);
                }
            };
            std::thread::spawn(pipe(c, out));
            std::thread::spawn(pipe(o2, c2));
        }
    });
}

/// Reads `/api/events` from inside `ns` until a flow event mentions
/// `needle` (bounded by `wait`); what was read.
fn read_events(v: &View, needle: &str, wait: Duration) -> String {
    use std::io::{Read, Write};
    let ns = v.ns.as_ref().expect("a node's web view");
    let mut s = ns.run(|| TcpStream::connect(v.at)).unwrap().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    write!(
        s,
        "GET /api/events HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\r\n",
        v.at, v.token
    )
    .unwrap();
    let deadline = std::time::Instant::now() + wait;
    let mut got = String::new();
    let mut buf = [0u8; 8192];
    while std::time::Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => panic!("reading the event stream: {e}"),
        }
        if got
            .split("\n\n")
            .any(|ev| ev.starts_with("event: flow") && ev.contains(needle))
        {
            return got;
        }
    }
    panic!("no flow event of {needle} in {wait:?}:\n{got}");
}
