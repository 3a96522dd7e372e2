//! Cluster DNS end to end: the real server on 127.0.0.1 fed by a real
//! sqlite store, queried with `dig` (dnsutils) and with our Rust client;
//! a stub upstream started here for forwarding and failover; the real
//! `podnet dns` binary; and a lab whose pods resolve Services through
//! their resolv.conf. The recursion allow-list is checked with clients on
//! loopback aliases and, for the binary, from another network namespace.

use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use podnet_api::Object;
use podnet_dns::client::Client;
use podnet_dns::wire::{self, RData};
use podnet_store::{AnyStore, Op, Store};
use podnet_testkit::{eventually, free_port, http_get, Proc, TestNs};
use serde_json::{json, Value};

/// The bound on every wait.
const WAIT: Duration = Duration::from_secs(20);

/// A DNS server in this process on its own runtime, with a private store.
struct Server {
    addr: SocketAddr,
    metrics: SocketAddr,
    store: AnyStore,
    rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<std::sync::mpsc::Receiver<()>>,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(upstreams: Vec<SocketAddr>) -> Server {
        Self::start_with(upstreams, |_| {})
    }

    fn start_with(
        upstreams: Vec<SocketAddr>,
        tweak: impl FnOnce(&mut podnet_dns::Config),
    ) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("state.db").display());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let store = rt.block_on(podnet_store::open(&url)).unwrap();
        let mut cfg = podnet_dns::Config {
            upstreams,
            upstream_timeout: Duration::from_millis(300),
            threads: 2,
            ..Default::default()
        };
        tweak(&mut cfg);
        let sockets = podnet_dns::Sockets::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = sockets.local_addr();
        let metrics = podnet_daemon::Metrics::new();
        let ml = rt.block_on(podnet_daemon::bind("127.0.0.1:0")).unwrap();
        let maddr = ml.local_addr().unwrap();
        rt.spawn(podnet_daemon::serve(ml, metrics.clone()));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let s2 = store.clone();
        rt.spawn(async move {
            let source = podnet_source::Source::store(s2, metrics.store_watch("dns"));
            podnet_dns::run(cfg, sockets, source, metrics, async move {
                let _ = rx.await;
            })
            .await
            .unwrap();
            let _ = done_tx.send(());
        });
        Server {
            addr,
            metrics: maddr,
            store,
            rt,
            stop: Some(tx),
            done: Some(done_rx),
            _dir: dir,
        }
    }

    fn put(&self, v: Value) {
        let o = Object::from_value(v).unwrap();
        let value = podnet_store::objects::encode(&o);
        self.rt
            .block_on(self.store.txn(vec![Op::Put {
                key: o.key(),
                value,
                lease: 0,
            }]))
            .unwrap();
    }

    fn delete(&self, kind: podnet_api::Kind, ns: &str, name: &str) {
        self.rt
            .block_on(self.store.txn(vec![Op::Delete {
                key: kind.key(Some(ns), name),
                rev: None,
            }]))
            .unwrap();
    }

    fn client(&self) -> Client {
        Client::new(self.addr)
    }

    fn http(&self, path: &str) -> (u16, String) {
        http_get(None, self.metrics, path)
            .unwrap_or_else(|| panic!("no answer from {} for {path}", self.metrics))
    }

    /// Waits for the first full load (readyz).
    fn ready(self) -> Server {
        eventually("readyz", WAIT, || self.http("/readyz").0 == 200);
        self
    }

    fn dig(&self, args: &[&str]) -> String {
        let port = self.addr.port().to_string();
        let mut a = vec![
            "@127.0.0.1",
            "-p",
            &port,
            "+time=2",
            "+tries=1",
            "+nocookie",
        ];
        a.extend_from_slice(args);
        let o = Command::new("dig")
            .args(&a)
            .output()
            .expect("dig (dnsutils)");
        assert!(o.status.success(), "dig {a:?}: {o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn dig_short(&self, args: &[&str]) -> Vec<String> {
        let mut a = args.to_vec();
        a.push("+short");
        let mut v: Vec<String> = self.dig(&a).lines().map(String::from).collect();
        v.sort();
        v
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(rx) = self.done.take() {
            let _ = rx.recv_timeout(Duration::from_secs(5));
        }
    }
}

fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

fn service(ns: &str, name: &str, ip: &str, ports: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterIP": ip, "clusterIPs": if ip == "None" { json!(null) } else { json!([ip]) }, "ports": ports}})
}

fn slice(ns: &str, name: &str, svc: &str, eps: Value, ports: Value) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4", "endpoints": eps, "ports": ports})
}

fn status(dig_out: &str) -> String {
    dig_out
        .split("status: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or("?")
        .to_string()
}

fn fixture(s: &Server) {
    s.put(namespace("pn-shop"));
    s.put(service(
        "pn-shop",
        "web",
        "10.96.44.4",
        json!([{"name": "http", "port": 80, "protocol": "TCP"}, {"port": 81}]),
    ));
    s.put(service(
        "pn-shop",
        "db",
        "None",
        json!([{"name": "pg", "port": 5432}]),
    ));
    s.put(slice(
        "pn-shop",
        "db-1",
        "db",
        json!([
            {"addresses": ["10.244.1.5"], "hostname": "db-0", "conditions": {"ready": true}},
            {"addresses": ["10.244.2.6"], "conditions": {"ready": true}},
            {"addresses": ["10.244.3.7"], "hostname": "db-2", "conditions": {"ready": false}}
        ]),
        json!([{"name": "pg", "port": 5432, "protocol": "TCP"}]),
    ));
    s.put(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "alias", "namespace": "pn-shop"},
        "spec": {"type": "ExternalName", "externalName": "web.pn-shop.svc.cluster.local"}}));
}

#[test]
fn every_record_kind_with_dig() {
    let s = Server::start(vec![]).ready();
    fixture(&s);
    eventually("fixture", WAIT, || {
        s.dig_short(&["alias.pn-shop.svc.cluster.local", "A"]).len() == 2
    });
    // ClusterIP: A, case-insensitive, over UDP and TCP.
    assert_eq!(
        s.dig_short(&["web.pn-shop.svc.cluster.local"]),
        ["10.96.44.4"]
    );
    assert_eq!(
        s.dig_short(&["WEB.Pn-Shop.SVC.Cluster.Local"]),
        ["10.96.44.4"]
    );
    assert_eq!(
        s.dig_short(&["+tcp", "web.pn-shop.svc.cluster.local"]),
        ["10.96.44.4"]
    );
    // SRV for the named port only.
    assert_eq!(
        s.dig_short(&["_http._tcp.web.pn-shop.svc.cluster.local", "SRV"]),
        ["0 100 80 web.pn-shop.svc.cluster.local."]
    );
    // PTR.
    assert_eq!(
        s.dig_short(&["-x", "10.96.44.4"]),
        ["web.pn-shop.svc.cluster.local."]
    );
    // Headless: ready endpoints only; hostnames; SRV per endpoint; PTR.
    assert_eq!(
        s.dig_short(&["db.pn-shop.svc.cluster.local"]),
        ["10.244.1.5", "10.244.2.6"]
    );
    assert_eq!(
        s.dig_short(&["db-0.db.pn-shop.svc.cluster.local"]),
        ["10.244.1.5"]
    );
    assert_eq!(
        s.dig_short(&["_pg._tcp.db.pn-shop.svc.cluster.local", "SRV"]),
        [
            "0 50 5432 10-244-2-6.db.pn-shop.svc.cluster.local.",
            "0 50 5432 db-0.db.pn-shop.svc.cluster.local."
        ]
    );
    assert_eq!(
        s.dig_short(&["-x", "10.244.1.5"]),
        ["db-0.db.pn-shop.svc.cluster.local."]
    );
    // ExternalName: CNAME, chased when the target is ours.
    assert_eq!(
        s.dig_short(&["alias.pn-shop.svc.cluster.local"]),
        ["10.96.44.4", "web.pn-shop.svc.cluster.local."]
    );
    // dns-version.
    assert_eq!(
        s.dig_short(&["dns-version.cluster.local", "TXT"]),
        ["\"1.1.0\""]
    );
    // NXDOMAIN vs NODATA, both with the SOA.
    let nx = s.dig(&["db-2.db.pn-shop.svc.cluster.local"]);
    assert_eq!(status(&nx), "NXDOMAIN", "{nx}");
    assert!(nx.contains("IN\tSOA"), "{nx}");
    let nodata = s.dig(&["web.pn-shop.svc.cluster.local", "AAAA"]);
    assert_eq!(status(&nodata), "NOERROR", "{nodata}");
    assert!(
        nodata.contains("ANSWER: 0") && nodata.contains("IN\tSOA"),
        "{nodata}"
    );
    let ns = s.dig(&["pn-shop.svc.cluster.local"]);
    assert_eq!(status(&ns), "NOERROR", "{ns}");
    // Search-path misses answered from the zone (no upstream configured,
    // which would give SERVFAIL).
    let miss = s.dig(&["web.pn-shop.svc.cluster.local.pn-shop.svc.cluster.local"]);
    assert_eq!(status(&miss), "NXDOMAIN", "{miss}");
    // A reverse miss in the service CIDR is ours too.
    assert_eq!(status(&s.dig(&["-x", "10.96.99.99"])), "NXDOMAIN");
    // Outside the zone with no upstream: SERVFAIL, not a hang.
    assert_eq!(status(&s.dig(&["example.org"])), "SERVFAIL");
}

#[test]
fn rust_client_udp_tcp_and_truncation() {
    let s = Server::start(vec![]).ready();
    s.put(service("pn-big", "h", "None", json!([])));
    let eps: Vec<Value> = (0..120)
        .map(|i| json!({"addresses": [format!("10.244.{}.{}", i / 100, i % 100 + 1)]}))
        .collect();
    s.put(slice("pn-big", "h-1", "h", json!(eps), json!([])));
    let c = s.client();
    eventually("120 endpoints", WAIT, || {
        c.tcp("h.pn-big.svc.cluster.local", wire::TYPE_A)
            .map(|m| m.answers.len() == 120)
            .unwrap_or(false)
    });
    // Without EDNS the UDP answer is cut at 512 bytes: TC, no records.
    let small = Client { edns: None, ..c };
    let m = small
        .udp("h.pn-big.svc.cluster.local", wire::TYPE_A)
        .unwrap();
    assert!(m.header.flags & wire::TC != 0);
    assert!(m.answers.is_empty());
    // With EDNS 4096 it fits (120 × 16 bytes).
    let big = Client {
        edns: Some(4096),
        ..c
    };
    let m = big.udp("h.pn-big.svc.cluster.local", wire::TYPE_A).unwrap();
    assert_eq!(m.header.flags & wire::TC, 0);
    assert_eq!(m.answers.len(), 120);
    // The stub-resolver dance: truncated over UDP, retried over TCP.
    let m = small
        .query("h.pn-big.svc.cluster.local", wire::TYPE_A)
        .unwrap();
    assert_eq!(m.answers.len(), 120);
    // dig does the same by itself.
    let out = s.dig(&["+noedns", "h.pn-big.svc.cluster.local"]);
    assert!(out.contains("ANSWER: 120"), "{out}");
    let out = s.dig(&["+noedns", "+ignore", "h.pn-big.svc.cluster.local"]);
    assert!(out.contains(" tc"), "{out}");
    // Malformed packets are counted and the server keeps answering.
    let raw = Client::new(s.addr);
    let mut bad = wire::build_query(9, &wire::name_from_str("a.b").unwrap(), 1, None);
    bad.truncate(bad.len() - 2);
    let r = raw.udp_raw(&bad).unwrap();
    assert_eq!(r[3] & 0xf, wire::FORMERR);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.send_to(&[1, 2, 3], s.addr).unwrap();
    assert!(c.udp("h.pn-big.svc.cluster.local", wire::TYPE_A).is_ok());
    eventually("malformed counted", WAIT, || {
        let (_, m) = s.http("/metrics");
        m.contains("podnet_dns_malformed_total 2")
    });
    let (_, m) = s.http("/metrics");
    assert!(m.contains("podnet_dns_truncated_total"), "{m}");
    assert!(m.contains("qtype=\"A\",rcode=\"NOERROR\""), "{m}");
    assert!(
        m.contains("podnet_dns_request_duration_seconds_bucket"),
        "{m}"
    );
    assert_eq!(s.http("/healthz").0, 200);
}

/// The server has no periodic reload: a change can only reach it through
/// the store watch, so seeing it at all is what this checks.
#[test]
fn services_appear_and_vanish_through_the_watch() {
    let s = Server::start(vec![]).ready();
    let c = s.client();
    let name = "quick.pn-live.svc.cluster.local";
    assert_eq!(c.query(name, wire::TYPE_A).unwrap().rcode(), wire::NXDOMAIN);
    s.put(service("pn-live", "quick", "10.96.55.5", json!([])));
    eventually("created", WAIT, || {
        c.query(name, wire::TYPE_A)
            .map(|m| m.answers.len() == 1)
            .unwrap_or(false)
    });
    s.delete(podnet_api::Kind::Service, "pn-live", "quick");
    eventually("deleted", WAIT, || {
        c.query(name, wire::TYPE_A)
            .map(|m| m.rcode() == wire::NXDOMAIN)
            .unwrap_or(false)
    });
    // So does an endpoint turning ready.
    s.put(service("pn-live", "hl", "None", json!([])));
    s.put(slice(
        "pn-live",
        "hl-1",
        "hl",
        json!([{"addresses": ["10.244.9.9"], "conditions": {"ready": false}}]),
        json!([]),
    ));
    s.put(slice(
        "pn-live",
        "hl-1",
        "hl",
        json!([{"addresses": ["10.244.9.9"], "conditions": {"ready": true}}]),
        json!([]),
    ));
    eventually("endpoint ready", WAIT, || {
        c.query("hl.pn-live.svc.cluster.local", wire::TYPE_A)
            .map(|m| m.answers.len() == 1)
            .unwrap_or(false)
    });
}

/// A tiny upstream: A 192.0.2.N for every name (N = its index), NXDOMAIN
/// with an SOA for names starting with "missing", and it counts queries.
struct Stub {
    addr: SocketAddr,
    queries: Arc<AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    t: Option<std::thread::JoinHandle<()>>,
}

/// The stub's answer to one query; names starting with "big" get 100 A
/// records over TCP and an empty truncated answer over UDP.
fn stub_answer(msg: &[u8], n: u8, tcp: bool) -> Option<Vec<u8>> {
    let m = wire::Message::parse(msg).ok()?;
    let (name, qtype, _) = m.questions.first()?.clone();
    let text = wire::name_to_string(&name);
    let missing = text.starts_with("missing");
    let big = text.starts_with("big");
    let h = wire::Header {
        id: m.header.id,
        flags: wire::QR
            | wire::RA
            | if missing { 3 } else { 0 }
            | if big && !tcp { wire::TC } else { 0 },
        ..Default::default()
    };
    let mut w = wire::Writer::with_question(h, &name, qtype, 1);
    if missing {
        w.record(&wire::Record {
            name: wire::name_from_str("test").unwrap(),
            rtype: wire::TYPE_SOA,
            class: 1,
            ttl: 60,
            rdata: RData::Soa {
                mname: wire::name_from_str("ns.test").unwrap(),
                rname: wire::name_from_str("h.test").unwrap(),
                serial: 1,
                refresh: 1,
                retry: 1,
                expire: 1,
                minimum: 30,
            },
        });
        w.set_counts(0, 1, 0);
    } else if qtype == wire::TYPE_A && (tcp || !big) {
        let count = if big { 100 } else { 1 };
        for i in 0..count {
            w.record(&wire::Record {
                name: name.clone(),
                rtype: wire::TYPE_A,
                class: 1,
                ttl: 60,
                rdata: RData::A(std::net::Ipv4Addr::new(192, 0, 2 + i, n)),
            });
        }
        w.set_counts(count as u16, 0, 0);
    }
    Some(w.buf)
}

impl Stub {
    fn start(n: u8) -> Stub {
        Self::start_on(n, || {
            // UDP and TCP on one port number: a free UDP port's TCP twin
            // may be taken by a parallel test; try another.
            for _ in 0..50 {
                let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
                if let Ok(tcp) = std::net::TcpListener::bind(sock.local_addr().unwrap()) {
                    return (sock, tcp);
                }
            }
            panic!("no port free for both UDP and TCP on 127.0.0.1 in 50 tries");
        })
    }

    /// A stub on 127.0.0.1 of network namespace `ns` (its sockets are
    /// made there; the thread serving them runs here).
    fn start_in(n: u8, ns: &podnet_kernel::Netns) -> Stub {
        Self::start_on(n, || {
            ns.run(|| {
                let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
                let tcp = std::net::TcpListener::bind(sock.local_addr().unwrap()).unwrap();
                (sock, tcp)
            })
            .unwrap()
        })
    }

    fn start_on(n: u8, bind: impl FnOnce() -> (UdpSocket, std::net::TcpListener)) -> Stub {
        let (sock, tcp) = bind();
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let addr = sock.local_addr().unwrap();
        tcp.set_nonblocking(true).unwrap();
        let queries = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (q, st) = (queries.clone(), stop.clone());
        let t = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let mut buf = [0u8; 1500];
            while !st.load(Ordering::Relaxed) {
                if let Ok((mut c, _)) = tcp.accept() {
                    c.set_nonblocking(false).unwrap();
                    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                    let mut len = [0u8; 2];
                    if c.read_exact(&mut len).is_ok() {
                        let mut m = vec![0u8; u16::from_be_bytes(len) as usize];
                        if c.read_exact(&mut m).is_ok() {
                            q.fetch_add(1, Ordering::Relaxed);
                            if let Some(r) = stub_answer(&m, n, true) {
                                let mut framed = (r.len() as u16).to_be_bytes().to_vec();
                                framed.extend_from_slice(&r);
                                let _ = c.write_all(&framed);
                            }
                        }
                    }
                }
                let Ok((len, peer)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                q.fetch_add(1, Ordering::Relaxed);
                if let Some(r) = stub_answer(&buf[..len], n, false) {
                    let _ = sock.send_to(&r, peer);
                }
            }
        });
        Stub {
            addr,
            queries,
            stop,
            t: Some(t),
        }
    }

    fn count(&self) -> usize {
        self.queries.load(Ordering::Relaxed)
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.t.take() {
            let _ = t.join();
        }
    }
}

/// The names a bound socket that never answers has been asked since the
/// last call (the queries are in its buffer by the time the server has
/// given up on it).
fn heard(silent: &UdpSocket) -> Vec<String> {
    silent.set_nonblocking(true).unwrap();
    let mut names = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = silent.recv(&mut buf) {
        let m = wire::Message::parse(&buf[..n]).expect("a DNS query");
        names.extend(m.questions.iter().map(|q| wire::name_to_string(&q.0)));
    }
    names
}

fn a_of(m: &wire::Message) -> Vec<String> {
    m.answers
        .iter()
        .filter_map(|r| match r.rdata {
            RData::A(ip) => Some(ip.to_string()),
            _ => None,
        })
        .collect()
}

#[test]
fn forwarding_cache_and_failover() {
    // A silent upstream (bound, never answers) before a working one.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let stub = Stub::start(7);
    let s = Server::start(vec![silent.local_addr().unwrap(), stub.addr]).ready();
    let c = s.client();
    let m = c.query("www.example.test", wire::TYPE_A).unwrap();
    assert_eq!(a_of(&m), ["192.0.2.7"]);
    // Cached: the stub is not asked again; the TTL ages from 60.
    let before = stub.count();
    let m = c.query("WWW.example.test", wire::TYPE_A).unwrap();
    assert_eq!(a_of(&m), ["192.0.2.7"]);
    assert!(m.answers[0].ttl <= 60);
    assert_eq!(stub.count(), before);
    // The first name was asked of the silent one first...
    assert_eq!(heard(&silent), ["www.example.test."]);
    // ... and failover stuck: the next new name goes straight to the
    // working one, the silent one never hears it.
    c.query("other.example.test", wire::TYPE_A).unwrap();
    assert_eq!(heard(&silent), Vec::<String>::new());
    // Negative answers are cached too.
    let m = c.query("missing.example.test", wire::TYPE_A).unwrap();
    assert_eq!(m.rcode(), wire::NXDOMAIN);
    let before = stub.count();
    let m = c.query("missing.example.test", wire::TYPE_A).unwrap();
    assert_eq!(m.rcode(), wire::NXDOMAIN);
    assert_eq!(stub.count(), before);
    // dig agrees.
    assert_eq!(s.dig_short(&["www.example.test"]), ["192.0.2.7"]);
    // Truncated upstream answer: fetched again over TCP; too big for our
    // client's UDP limit, so it is truncated to the client in turn, which
    // retries over TCP and gets all 100 records (from the cache).
    let m = c.udp("big.example.test", wire::TYPE_A).unwrap();
    assert!(m.header.flags & wire::TC != 0);
    let m = c.query("big.example.test", wire::TYPE_A).unwrap();
    assert_eq!(m.answers.len(), 100);
    assert_eq!(s.dig(&["big.example.test"]).matches("IN\tA\t").count(), 100);
    // ExternalName to an outside name: CNAME plus the upstream's A.
    s.put(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "ext", "namespace": "pn-fwd"},
        "spec": {"type": "ExternalName", "externalName": "api.example.test"}}));
    eventually("externalname", WAIT, || {
        s.dig_short(&["ext.pn-fwd.svc.cluster.local"]) == ["192.0.2.7", "api.example.test."]
    });
    // Cluster names never reach upstream, hits or misses.
    let before = stub.count();
    for n in [
        "nope.pn-fwd.svc.cluster.local",
        "x.cluster.local",
        "ext.pn-fwd.svc.cluster.local.cluster.local",
    ] {
        assert_eq!(c.query(n, wire::TYPE_A).unwrap().rcode(), wire::NXDOMAIN);
    }
    assert_eq!(stub.count(), before);
    eventually("cache hits in metrics", WAIT, || {
        let (_, m) = s.http("/metrics");
        m.lines()
            .any(|l| l.starts_with("podnet_dns_cache_hits_total ") && !l.ends_with(" 0"))
            && m.lines()
                .any(|l| l.starts_with("podnet_dns_upstream_errors_total") && l.ends_with(" 1"))
    });
}

#[test]
fn servfail_when_every_upstream_is_down() {
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let closed = {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    };
    let s = Server::start(vec![silent.local_addr().unwrap(), closed]).ready();
    let m = s.client().query("www.example.test", wire::TYPE_A).unwrap();
    assert_eq!(m.rcode(), wire::SERVFAIL);
    // Cluster names still answer.
    assert_eq!(
        s.dig_short(&["dns-version.cluster.local", "TXT"]),
        ["\"1.1.0\""]
    );
}

#[test]
fn servfail_for_the_zone_until_the_first_load() {
    // A store that never answers: an "etcd" that accepts connections and
    // says nothing.
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = mute.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        while let Ok((c, _)) = mute.accept() {
            held.push(c);
        }
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let opened = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(5),
            podnet_store::open(&format!("etcd://127.0.0.1:{port}")),
        )
        .await
    });
    // The etcd client connects lazily, so this must work; if it ever
    // does not, the test fails instead of passing without asserting.
    let store = opened
        .expect("the etcd client hung against a mute server")
        .expect("the etcd client refused a mute server");
    let sockets = podnet_dns::Sockets::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = sockets.local_addr();
    let metrics = podnet_daemon::Metrics::new();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let h = rt.spawn(podnet_dns::run(
        podnet_dns::Config::default(),
        sockets,
        podnet_source::Source::store(store, metrics.store_watch("dns")),
        metrics.clone(),
        async move {
            let _ = rx.await;
        },
    ));
    let m = Client::new(addr)
        .query("kubernetes.default.svc.cluster.local", wire::TYPE_A)
        .unwrap();
    assert_eq!(m.rcode(), wire::SERVFAIL);
    assert!(!metrics.is_ready());
    let _ = tx.send(());
    let _ = rt.block_on(h);
}

#[test]
fn the_binary_serves_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("state.db").display());
    let o = Command::new(env!("CARGO_BIN_EXE_podnet"))
        .args(["dns", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(help.contains("--upstream"), "{help}");
    assert!(help.contains("--allow-recursion"), "{help}");
    // Pick free ports (tiny race with other tests; retried).
    for attempt in 0..5 {
        let port = {
            let u = UdpSocket::bind("127.0.0.1:0").unwrap();
            u.local_addr().unwrap().port()
        };
        let mport = free_port(None);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_podnet"));
        cmd.args([
            "dns",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--metrics-addr",
            &format!("127.0.0.1:{mport}"),
            "--upstream",
            "127.0.0.1:9",
            "--threads",
            "1",
        ])
        .env("PODNET_STORE", &url);
        let mut dns = Proc::spawn(&format!("dns-{attempt}"), cmd, dir.path());
        let c = Client {
            timeout: Duration::from_millis(200),
            ..Client::new(format!("127.0.0.1:{port}").parse().unwrap())
        };
        // A daemon that lost the race for its ports exits: try again.
        let answered = eventually("podnet dns answering or exiting", WAIT, || {
            if !dns.alive() {
                return Some(false);
            }
            let m = c.query("dns-version.cluster.local", wire::TYPE_TXT).ok()?;
            (m.rcode() == wire::NOERROR).then_some(true)
        });
        if !answered {
            continue;
        }
        let st = dns.terminate(Duration::from_secs(5));
        assert!(st.success(), "{st:?}");
        return;
    }
    panic!("podnet dns never answered");
}

/// Asks `server` from `sock` (bound to the source address the test wants)
/// over UDP with EDNS; returns the raw answer and the query's size.
fn ask_from(sock: &UdpSocket, server: SocketAddr, name: &str, qtype: u16) -> (Vec<u8>, usize) {
    static ID: AtomicUsize = AtomicUsize::new(1);
    let id = ID.fetch_add(1, Ordering::Relaxed) as u16;
    let q = wire::build_query(id, &wire::name_from_str(name).unwrap(), qtype, Some(1232));
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    sock.send_to(&q, server).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        let (n, from) = sock
            .recv_from(&mut buf)
            .unwrap_or_else(|e| panic!("no answer to {name} from {server}: {e}"));
        if from == server && buf[..2] == q[..2] {
            return (buf[..n].to_vec(), q.len());
        }
    }
}

fn parsed(r: &[u8]) -> wire::Message {
    wire::Message::parse(r).expect("answer parses")
}

/// Asserts a recursion refusal: REFUSED, RA clear, nothing but the
/// question (and OPT), and no bigger than the query.
fn assert_refused(r: &[u8], query_len: usize, what: &str) {
    let m = parsed(r);
    assert_eq!(m.rcode(), wire::REFUSED, "{what}: {m:?}");
    assert_eq!(m.header.flags & wire::RA, 0, "{what}: RA set");
    assert!(
        m.answers.is_empty() && m.authority.is_empty() && m.additional.is_empty(),
        "{what}: {m:?}"
    );
    assert!(r.len() <= query_len, "{what}: {} > {query_len}", r.len());
}

#[test]
fn recursion_only_for_allowed_clients_cache_and_externalname_included() {
    let stub = Stub::start(7);
    // Only 127.0.0.1 may recurse; 127.0.0.2 (also on lo) may not.
    let s = Server::start_with(vec![stub.addr], |c| {
        c.recursion = podnet_dns::AllowList::new(["127.0.0.1/32".parse().unwrap()]);
    })
    .ready();
    s.put(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "ext", "namespace": "pn-acl"},
        "spec": {"type": "ExternalName", "externalName": "api.example.test"}}));
    s.put(service("pn-acl", "web", "10.96.44.9", json!([])));
    s.put(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "alias", "namespace": "pn-acl"},
        "spec": {"type": "ExternalName", "externalName": "web.pn-acl.svc.cluster.local"}}));
    let inside = UdpSocket::bind("127.0.0.1:0").unwrap();
    let outside = UdpSocket::bind("127.0.0.2:0").unwrap();
    eventually("fixture", WAIT, || {
        parsed(&ask_from(&inside, s.addr, "alias.pn-acl.svc.cluster.local", 1).0)
            .answers
            .len()
            == 2
    });
    // Allowed: forwarded, answered, and now cached.
    let (r, _) = ask_from(&inside, s.addr, "www.example.test", wire::TYPE_A);
    assert_eq!(a_of(&parsed(&r)), ["192.0.2.7"]);
    let before = stub.count();
    assert_eq!(before, 1);
    // Not allowed: REFUSED, whether the name is cached or not, over UDP
    // and TCP; the upstream hears nothing.
    for name in ["www.example.test", "fresh.example.test"] {
        let (r, qlen) = ask_from(&outside, s.addr, name, wire::TYPE_A);
        assert_refused(&r, qlen, name);
    }
    let tcp = s.dig(&["-b", "127.0.0.2", "+tcp", "fresh.example.test"]);
    assert_eq!(status(&tcp), "REFUSED", "{tcp}");
    // An ExternalName in the zone answers with its CNAME, but the outside
    // target is not chased for it (no upstream query)...
    let (r, _) = ask_from(&outside, s.addr, "ext.pn-acl.svc.cluster.local", 1);
    let m = parsed(&r);
    assert_eq!(m.rcode(), wire::NOERROR);
    assert_eq!(m.answers.len(), 1);
    assert_eq!(
        m.answers[0].rdata,
        RData::Name(wire::name_from_str("api.example.test").unwrap())
    );
    // ...while one inside the zone is chased in full.
    let (r, _) = ask_from(&outside, s.addr, "alias.pn-acl.svc.cluster.local", 1);
    assert_eq!(a_of(&parsed(&r)), ["10.96.44.9"]);
    assert_eq!(stub.count(), before, "the upstream saw no query");
    // The allowed client gets the chase upstream.
    let (r, _) = ask_from(&inside, s.addr, "ext.pn-acl.svc.cluster.local", 1);
    assert_eq!(a_of(&parsed(&r)), ["192.0.2.7"]);
    assert_eq!(stub.count(), before + 1);
    eventually("refusals counted", WAIT, || {
        s.http("/metrics")
            .1
            .lines()
            .any(|l| l == "podnet_dns_recursion_refused_total 3")
    });
}

/// `/metrics` from `addr` inside namespace `ns` (empty while nothing
/// answers).
fn metrics_in(ns: &TestNs, addr: &str) -> String {
    http_get(Some(ns.netns()), addr.parse().unwrap(), "/metrics")
        .map(|(_, body)| body)
        .unwrap_or_default()
}

/// The real binary with its default allow-list, in a namespace of its own
/// (a "node" with the network 172.31.77.0/24), asked from a second
/// namespace over a veth from several source addresses. Only the source
/// address differs between an answer and a refusal.
#[test]
fn the_binary_refuses_recursion_to_outside_clients() {
    let node = TestNs::new("dnsacl");
    let client = TestNs::new("dnscli");
    node.sh(&format!(
        "ip link add v0 type veth peer name v1 netns {c} && \
         ip addr add 172.31.77.1/24 dev v0 && ip link set v0 up && \
         ip route add 198.51.100.0/24 dev v0 && ip route add 203.0.113.0/24 dev v0 && \
         ip route add 10.50.0.0/16 dev v0 && ip route add 10.244.0.0/16 dev v0",
        c = client.name()
    ));
    client.sh(
        "for a in 172.31.77.2/24 10.50.3.4/32 10.244.7.2/32 203.0.113.9/32 198.51.100.2/32; do \
           ip addr add $a dev v1 || exit 1; done && ip link set v1 up && \
         ip route add 172.31.77.1/32 dev v1 src 172.31.77.2",
    );
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("state.db").display());
    // The cluster's Network is the store's (10.50.0.0/16), not the built-in
    // 10.244.0.0/16; one Service to look up.
    let mut apply = Command::new(env!("CARGO_BIN_EXE_podnet"))
        .args(["apply", "-f", "-"])
        .env("PODNET_STORE", &store)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        apply
            .stdin
            .take()
            .unwrap()
            .write_all(
                b"apiVersion: podnet.io/v1\nkind: NetworkConfig\nmetadata: {name: default}\n\
                  spec: {Network: 10.50.0.0/16}\n---\n\
                  apiVersion: v1\nkind: Namespace\nmetadata: {name: pn-acl}\n---\n\
                  apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: pn-acl}\n\
                  spec: {clusterIP: 10.96.0.50, ports: [{port: 80}]}\n",
            )
            .unwrap();
    }
    let out = apply.wait_with_output().unwrap();
    assert!(out.status.success(), "apply: {out:?}");
    let stub = Stub::start_in(7, node.netns());
    let upstream = stub.addr.to_string();
    // Default listen (0.0.0.0:53) and metrics address, in the node's
    // namespace; the flag adds one address to the default list.
    let mut cmd = node.command(env!("CARGO_BIN_EXE_podnet"));
    cmd.args([
        "dns",
        "--upstream",
        &upstream,
        "--allow-recursion",
        "default,203.0.113.9",
        "--threads",
        "1",
    ])
    .env("PODNET_STORE", &store)
    .env("NO_COLOR", "1");
    let mut dns = Proc::spawn("dns", cmd, dir.path());
    // The daemon's own signal that it serves.
    eventually("podnet dns: zone loaded; serving", WAIT, || {
        dns.check();
        dns.log().contains("zone loaded; serving")
    });
    let server: SocketAddr = "172.31.77.1:53".parse().unwrap();
    let from = |src: &str| {
        client
            .run(|| UdpSocket::bind((src.parse::<std::net::IpAddr>().unwrap(), 0)))
            .unwrap()
    };
    // Allowed: the node network (an interface subnet of the server's
    // host), the store's cluster Network, and the flag's address. Each new
    // name is one upstream query.
    for (i, src) in ["172.31.77.2", "10.50.3.4", "203.0.113.9"]
        .iter()
        .enumerate()
    {
        let (r, _) = ask_from(&from(src), server, &format!("n{i}.example.test"), 1);
        assert_eq!(a_of(&parsed(&r)), ["192.0.2.7"], "from {src}");
        assert_eq!(stub.count(), i + 1, "from {src}");
    }
    // Not allowed: an outside address, and the built-in pod network the
    // store's NetworkConfig replaced. REFUSED over UDP, cached name or
    // not, and over TCP; not one more upstream query.
    let before = stub.count();
    let mut refused = 0;
    for src in ["198.51.100.2", "10.244.7.2"] {
        let sock = from(src);
        for name in ["n0.example.test", "other.example.test"] {
            let (r, qlen) = ask_from(&sock, server, name, wire::TYPE_A);
            assert_refused(&r, qlen, &format!("{name} from {src}"));
            refused += 1;
        }
    }
    let tcp = client
        .sh("dig @172.31.77.1 -b 198.51.100.2 +tcp +time=3 +tries=1 +nocookie tcp.example.test");
    assert_eq!(status(&tcp), "REFUSED", "{tcp}");
    refused += 1;
    assert_eq!(stub.count(), before, "the upstream saw no query");
    // The cluster zone answers the outside client all the same.
    let out = from("198.51.100.2");
    let (r, _) = ask_from(&out, server, "web.pn-acl.svc.cluster.local", wire::TYPE_A);
    assert_eq!(a_of(&parsed(&r)), ["10.96.0.50"]);
    let (r, _) = ask_from(&out, server, "50.0.96.10.in-addr.arpa", wire::TYPE_PTR);
    assert_eq!(
        parsed(&r).answers[0].rdata,
        RData::Name(wire::name_from_str("web.pn-acl.svc.cluster.local").unwrap())
    );
    let (r, _) = ask_from(&out, server, "nope.pn-acl.svc.cluster.local", 1);
    assert_eq!(parsed(&r).rcode(), wire::NXDOMAIN);
    assert_eq!(stub.count(), before);
    // Counted.
    let want = format!("podnet_dns_recursion_refused_total {refused}");
    eventually("refusals in /metrics", WAIT, || {
        metrics_in(&node, "127.0.0.1:9153")
            .lines()
            .any(|l| l == want)
    });
    let st = dns.terminate(Duration::from_secs(10));
    assert!(st.success(), "{st:?}");
}
