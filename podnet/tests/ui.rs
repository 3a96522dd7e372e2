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

use podnet_testkit::{eventually, free_port, http_get, require_root};
use serde_json::{json, Value};
use tungstenite::{stream::MaybeTlsStream, Message, WebSocket};

const WAIT: Duration = Duration::from_secs(60);

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
    let _ui = spawn_group(ui_cmd, &out.join("podnet-ui.log"));
    let topo: Value = eventually("the web view's topology", WAIT, || {
        let (code, body) = http_get(None, ([127, 0, 0, 1], port).into(), "/api/topology")?;
        let t: Value = serde_json::from_str(&body).ok()?;
        (code == 200 && t["pods"].as_array()?.len() >= 3).then_some(t)
    });
    assert_eq!(topo["lab"], format!("lab {}", lab.0));
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
    b.call("Page.navigate", json!({"url": format!("http://{listen}/")}));
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

    // On a real node: `podnet ui` inside node1 with no --lab, the cluster
    // read from the store, served on its default address in node1's
    // namespace. The same API, as this node sees the cluster.
    let ns_name = format!("pn-{}-node1", lab.0);
    let ns = podnet_kernel::Netns::named(&ns_name).unwrap();
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
    ]);
    let _node_ui = spawn_group(node_ui, &out.join("podnet-ui-node.log"));
    let at: std::net::SocketAddr = ([127, 0, 0, 1], 10280).into();
    let topo: Value = eventually("the node's web view", WAIT, || {
        let (code, body) = http_get(Some(&ns), at, "/api/topology")?;
        let t: Value = serde_json::from_str(&body).ok()?;
        (code == 200 && t["pods"].as_array()?.len() >= 3).then_some(t)
    });
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
    let (code, page) = http_get(Some(&ns), at, "/").unwrap();
    assert_eq!(code, 200);
    assert!(page.contains("/api/events"), "the page is served");
    let (code, body) = http_get(
        Some(&ns),
        at,
        "/api/trace?src=default%2Fa&dst=default%2Fweb%3A80",
    )
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let t: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(t["outcome"]["outcome"], "connected", "{t:#}");
    assert_eq!(t["unobserved"], json!(["node2"]), "{t:#}");
    // A pod of node2 is traced on node2.
    let (code, body) = http_get(
        Some(&ns),
        at,
        "/api/trace?src=default%2Fweb1&dst=default%2Fa%3A80",
    )
    .unwrap();
    assert_eq!(code, 400);
    assert!(body.contains("runs on node node2"), "{body}");
    // The live stream carries this node's flows.
    let stream = read_events(&ns, at, "default/a", WAIT);
    assert!(stream.contains("event: topology"), "{stream}");

    // The node's page in the browser (which runs here, so a forwarder
    // carries its connections into node1): both nodes and their pods, and
    // a trace from the page drawn from pod a through node1 towards node2.
    let fwd = forward_into(&ns_name, at);
    b.call("Page.navigate", json!({"url": format!("http://{fwd}/")}));
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

/// Carries connections from this namespace's loopback to `to` inside
/// namespace `ns` (the browser runs here; a node's web view listens in
/// the node); the local address. The forwarder lives as long as the test
/// process.
fn forward_into(ns: &str, to: std::net::SocketAddr) -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = l.local_addr().unwrap();
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
    at
}

/// Reads `/api/events` from inside `ns` until a flow event mentions
/// `needle` (bounded by `wait`); what was read.
fn read_events(
    ns: &podnet_kernel::Netns,
    at: std::net::SocketAddr,
    needle: &str,
    wait: Duration,
) -> String {
    use std::io::{Read, Write};
    let mut s = ns.run(|| TcpStream::connect(at)).unwrap().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    write!(s, "GET /api/events HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
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
