//! The data plane end to end on loopback: real backends (an echo server
//! like the conformance suite's echo-basic, an h2c one, a WebSocket
//! one), the table compiled from objects as users write them, and real
//! HTTP/1.1, HTTP/2 and TLS clients.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use podnet_api::Object;
use podnet_gateway::model::build::{self, endpoints, Config, World};
use podnet_gateway::proxy::listen::Ports;
use podnet_gateway::proxy::workers::Workers;
use podnet_gateway::proxy::Shared;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Answers every request with what it saw, as JSON (echo-basic's shape).
async fn echo(name: &'static str) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| answer(name, req));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

async fn answer(
    name: &'static str,
    mut req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    if req
        .headers()
        .get("upgrade")
        .is_some_and(|v| v == "websocket")
    {
        let up = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            let mut io = TokioIo::new(up.await.unwrap());
            let mut buf = [0u8; 64];
            let n = io.read(&mut buf).await.unwrap();
            io.write_all(&[b"echo:".as_slice(), &buf[..n]].concat())
                .await
                .unwrap();
        });
        let r = Response::builder()
            .status(101)
            .header("upgrade", "websocket")
            .header("connection", "upgrade")
            .body(Full::new(Bytes::new()))
            .unwrap();
        return Ok(r);
    }
    let headers: serde_json::Map<String, Value> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or(""))))
        .collect();
    let body = json!({"backend": name, "path": req.uri().path_and_query().map(|p| p.as_str()), "host": req.headers().get("host").map(|h| h.to_str().unwrap()),
                      "method": req.method().as_str(), "version": format!("{:?}", req.version()), "headers": headers});
    Ok(Response::builder()
        .header("content-type", "application/json")
        .header("x-backend", name)
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap())
}

fn objects(backends: &[(&str, SocketAddr, Option<&str>)], extra: Vec<Value>) -> World {
    let mut w = World::default();
    let mut all = extra;
    for (name, addr, app) in backends {
        all.push(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "app"},
            "spec": {"ports": [{"name": "http", "port": 8080, "appProtocol": app}]}}));
        all.push(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-1"), "namespace": "app", "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": addr.port()}],
            "endpoints": [{"addresses": [addr.ip().to_string()], "conditions": {"ready": true}}]}));
    }
    for v in all {
        w.put(Object::from_value(v).unwrap());
    }
    w
}

/// The data plane serving `w`, each table port on an ephemeral loopback
/// port.
struct Gw {
    shared: Arc<Shared>,
    ports: Ports,
}

impl Gw {
    async fn start(w: &World) -> Gw {
        Gw::start_with(w, Shared::new(false)).await
    }

    async fn start_with(w: &World, shared: Arc<Shared>) -> Gw {
        let ports = Ports::with_binder(
            shared.clone(),
            Workers::start(2).unwrap(),
            Arc::new(|_| "127.0.0.1:0".parse().unwrap()),
        );
        let mut g = Gw { shared, ports };
        g.serve(w).await;
        g
    }

    async fn serve(&mut self, w: &World) {
        let b = build::build(w, &Config::default());
        let want: BTreeSet<podnet_gateway::model::Bind> = b.table.ports.keys().copied().collect();
        self.shared.set_table(b.table);
        self.shared
            .endpoints
            .store(Arc::new(endpoints::resolve(w, &b.backends)));
        assert!(self.ports.reconcile(&want).await.is_empty());
    }

    fn at(&self, port: u16) -> SocketAddr {
        self.ports
            .local(port)
            .unwrap_or_else(|| panic!("port {port} is not served"))
    }
}

/// One HTTP/1.1 request; the status, the response headers and the body
/// as JSON (Null when it is not JSON).
async fn get(
    addr: SocketAddr,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, http::HeaderMap, Value) {
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut b = Request::builder().uri(path).header("host", host);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let r = tx
        .send_request(b.body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    let (parts, body) = r.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn gateway_objects(listeners: Value, routes: Vec<Value>) -> Vec<Value> {
    let mut v = vec![
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "podnet"}, "spec": {"controllerName": "podnet.io/gateway"}}),
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "gw", "namespace": "app"},
               "spec": {"gatewayClassName": "podnet", "listeners": listeners}}),
    ];
    for (i, spec) in routes.into_iter().enumerate() {
        let mut spec = spec;
        spec["parentRefs"] = json!([{"name": "gw"}]);
        v.push(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": format!("r{i}"), "namespace": "app"}, "spec": spec}));
    }
    v
}

#[tokio::test]
async fn routes_filters_and_errors() {
    let (a, b) = (echo("a").await, echo("b").await);
    let objs = gateway_objects(
        json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
        vec![json!({"rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/a"}}],
             "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "x-set", "value": "1"}], "remove": ["x-drop"]}},
                         {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"add": [{"name": "x-resp", "value": "yes"}]}}],
             "backendRefs": [{"name": "a", "port": 8080}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/old"}}],
             "filters": [{"type": "RequestRedirect", "requestRedirect": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"}, "statusCode": 301}}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/rw"}}],
             "filters": [{"type": "URLRewrite", "urlRewrite": {"hostname": "inside.example", "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"}}}],
             "backendRefs": [{"name": "b", "port": 8080}]},
            {"matches": [{"path": {"type": "Exact", "value": "/missing"}}], "backendRefs": [{"name": "nope", "port": 8080}]},
            {"matches": [{"path": {"type": "Exact", "value": "/empty"}}], "backendRefs": [{"name": "empty", "port": 8080}]},
            {"matches": [{"headers": [{"name": "version", "value": "b"}]}], "backendRefs": [{"name": "b", "port": 8080}]},
        ]})],
    );
    let mut objs = objs;
    objs.push(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "empty", "namespace": "app"}, "spec": {"ports": [{"port": 8080}]}}));
    let g = Gw::start(&objects(&[("a", a, None), ("b", b, None)], objs)).await;
    let at = g.at(80);

    let (st, h, body) = get(at, "shop.example", "/a/x?q=1", &[("x-drop", "1")]).await;
    assert_eq!(
        (st, body["backend"].as_str(), body["path"].as_str()),
        (StatusCode::OK, Some("a"), Some("/a/x?q=1"))
    );
    assert_eq!(
        body["host"], "shop.example",
        "the client's Host reaches the backend"
    );
    assert_eq!(body["headers"]["x-set"], "1");
    assert!(body["headers"].get("x-drop").is_none());
    assert_eq!(body["headers"]["x-forwarded-for"], "127.0.0.1");
    assert_eq!(h["x-resp"], "yes");

    let (st, h, _) = get(at, "shop.example", "/old/page?x=1", &[]).await;
    assert_eq!(
        (st, h["location"].to_str().unwrap()),
        (
            StatusCode::MOVED_PERMANENTLY,
            "http://shop.example/new/page?x=1"
        )
    );

    let (_, _, body) = get(at, "shop.example", "/rw/deep", &[]).await;
    assert_eq!(
        (
            body["backend"].as_str(),
            body["path"].as_str(),
            body["host"].as_str()
        ),
        (Some("b"), Some("/deep"), Some("inside.example"))
    );

    let (_, _, body) = get(at, "shop.example", "/other", &[("version", "b")]).await;
    assert_eq!(body["backend"], "b");
    assert_eq!(
        get(at, "shop.example", "/other", &[]).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(at, "shop.example", "/missing", &[]).await.0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        get(at, "shop.example", "/empty", &[]).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn weights_split_requests() {
    let (a, b) = (echo("a").await, echo("b").await);
    let objs = gateway_objects(
        json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
        vec![
            json!({"rules": [{"backendRefs": [{"name": "a", "port": 8080, "weight": 3}, {"name": "b", "port": 8080, "weight": 1}, {"name": "a", "port": 8080, "weight": 0}]}]}),
        ],
    );
    let g = Gw::start(&objects(&[("a", a, None), ("b", b, None)], objs)).await;
    let mut to_a = 0;
    for _ in 0..400 {
        let (_, _, body) = get(g.at(80), "x", "/", &[]).await;
        to_a += usize::from(body["backend"] == "a");
    }
    assert!(
        (250..=350).contains(&to_a),
        "3:1 split, got {to_a}/400 to a"
    );
}

fn tls_secret(name: &str, host: &str) -> (Value, rustls::pki_types::CertificateDer<'static>) {
    let c = rcgen::generate_simple_self_signed(vec![host.to_string()]).unwrap();
    let v = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "metadata": {"name": name, "namespace": "app"},
                   "stringData": {"tls.crt": c.cert.pem(), "tls.key": c.signing_key.serialize_pem()}});
    (v, c.cert.der().clone())
}

/// A TLS client trusting `roots`, offering h2 and http/1.1.
async fn tls_connect(
    addr: SocketAddr,
    sni: &str,
    roots: &[rustls::pki_types::CertificateDer<'static>],
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, std::io::Error> {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r.clone()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let s = TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from(sni.to_string()).unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, s)
        .await
}

#[tokio::test]
async fn tls_by_sni_http2_h2c_and_websocket() {
    let (a, h2) = (echo("a").await, echo("h2").await);
    let (s1, root1) = tls_secret("one", "one.example");
    let (s2, root2) = tls_secret("two", "two.example");
    let mut objs = gateway_objects(
        json!([{"name": "one", "port": 443, "protocol": "HTTPS", "hostname": "one.example", "tls": {"certificateRefs": [{"name": "one"}]}},
               {"name": "two", "port": 443, "protocol": "HTTPS", "hostname": "two.example", "tls": {"certificateRefs": [{"name": "two"}]}},
               {"name": "plain", "port": 80, "protocol": "HTTP"}]),
        vec![json!({"rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/h2c"}}], "backendRefs": [{"name": "h2", "port": 8080}]},
            {"backendRefs": [{"name": "a", "port": 8080}]}]})],
    );
    objs.extend([s1, s2]);
    let g = Gw::start(&objects(
        &[("a", a, None), ("h2", h2, Some("kubernetes.io/h2c"))],
        objs,
    ))
    .await;

    // Each name gets its own certificate; a client that trusts only one
    // fails on the other.
    let t = tls_connect(g.at(443), "two.example", std::slice::from_ref(&root2))
        .await
        .unwrap();
    assert_eq!(t.get_ref().1.alpn_protocol(), Some(b"h2".as_slice()));
    let err = tls_connect(g.at(443), "two.example", std::slice::from_ref(&root1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("certificate"), "{err}");

    // HTTP/2 over TLS to an HTTP/1.1 backend.
    let (mut tx, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(t))
            .await
            .unwrap();
    tokio::spawn(conn);
    let r = tx
        .send_request(
            Request::builder()
                .uri("https://two.example/x")
                .body(Empty::<Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let body: Value =
        serde_json::from_slice(&r.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(
        (
            body["backend"].as_str(),
            body["version"].as_str(),
            body["host"].as_str()
        ),
        (Some("a"), Some("HTTP/1.1"), Some("two.example"))
    );
    assert_eq!(body["headers"]["x-forwarded-proto"], "https");

    // h2c to a backend whose port says so.
    let (_, _, body) = get(g.at(80), "x", "/h2c", &[]).await;
    assert_eq!(
        (body["backend"].as_str(), body["version"].as_str()),
        (Some("h2"), Some("HTTP/2.0"))
    );

    // A WebSocket upgrade is spliced through.
    let mut s = TcpStream::connect(g.at(80)).await.unwrap();
    s.write_all(
        b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        assert_eq!(
            s.read(&mut b).await.unwrap(),
            1,
            "closed after {:?}",
            String::from_utf8_lossy(&head)
        );
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s.write_all(b"hello").await.unwrap();
    let mut out = [0u8; 10];
    s.read_exact(&mut out).await.unwrap();
    assert_eq!(&out, b"echo:hello");
}

/// Answers only when told to, and says when a request has arrived.
async fn held_backend() -> (
    SocketAddr,
    tokio::sync::mpsc::Receiver<()>,
    Arc<tokio::sync::Notify>,
) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let go = Arc::new(tokio::sync::Notify::new());
    let go2 = go.clone();
    tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let svc = service_fn(move |_req: Request<Incoming>| {
            let (tx, go) = (tx.clone(), go2.clone());
            async move {
                tx.send(()).await.unwrap();
                go.notified().await;
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(
                    b"done",
                ))))
            }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(s), svc)
            .await;
    });
    (addr, rx, go)
}

#[tokio::test]
async fn a_table_swap_keeps_requests_in_flight() {
    let (slow, mut arrived, go) = held_backend().await;
    let objs = gateway_objects(
        json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
        vec![json!({"rules": [{"backendRefs": [{"name": "slow", "port": 8080}]}]})],
    );
    let w = objects(&[("slow", slow, None)], objs);
    let mut g = Gw::start(&w).await;
    let at = g.at(80);
    let pending = tokio::spawn(async move { get(at, "x", "/", &[]).await });
    arrived.recv().await.unwrap();
    // The route goes away while its request waits at the backend.
    let mut w2 = w.clone();
    w2.remove(podnet_api::Kind::HTTPRoute, Some("app"), "r0");
    g.serve(&w2).await;
    go.notify_one();
    let (st, _, _) = pending.await.unwrap();
    assert_eq!(st, StatusCode::OK, "the request in flight finished");
    assert_eq!(
        get(at, "x", "/", &[]).await.0,
        StatusCode::NOT_FOUND,
        "new requests see the new table"
    );
    // Both answers are counted: the 200 on the route, the 404 on none.
    let m = podnet_daemon::Metrics::new();
    g.shared.stats.flush(&m);
    let text = m.render();
    for want in [
        "podnet_gateway_requests_total{route=\"HTTPRoute/app/r0/0\",code=\"2xx\"} 1",
        "podnet_gateway_requests_total{route=\"none///0\",code=\"4xx\"} 1",
        "podnet_gateway_backend_requests_total{backend=\"app/slow:8080\",code=\"2xx\"} 1",
    ] {
        assert!(text.contains(want), "{want} in\n{text}");
    }
}

#[tokio::test]
async fn ingress_tls_and_its_default_backend() {
    let (a, b) = (echo("a").await, echo("b").await);
    let (secret, root) = tls_secret("secure", "secure.example");
    let ingress = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "i", "namespace": "app"},
        "spec": {"ingressClassName": "podnet", "tls": [{"hosts": ["secure.example"], "secretName": "secure"}],
                 "defaultBackend": {"service": {"name": "b", "port": {"number": 8080}}},
                 "rules": [{"host": "secure.example", "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "a", "port": {"number": 8080}}}}]}}]}});
    let g = Gw::start(&objects(
        &[("a", a, None), ("b", b, None)],
        vec![ingress, secret],
    ))
    .await;
    // HTTPS with the Secret's certificate, and plain HTTP, for the TLS host.
    let t = tls_connect(g.at(443), "secure.example", std::slice::from_ref(&root))
        .await
        .unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(t))
        .await
        .unwrap();
    tokio::spawn(conn);
    let r = tx
        .send_request(
            Request::builder()
                .uri("/x")
                .header("host", "secure.example")
                .body(Empty::<Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let body: Value =
        serde_json::from_slice(&r.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(
        (
            body["backend"].as_str(),
            body["headers"]["x-forwarded-proto"].as_str()
        ),
        (Some("a"), Some("https"))
    );
    assert_eq!(
        get(g.at(80), "secure.example", "/x", &[]).await.2["backend"],
        "a"
    );
    // Any other host: the default backend.
    assert_eq!(
        get(g.at(80), "other.example", "/", &[]).await.2["backend"],
        "b"
    );
}

/// Counts requests; answers 503 to the first `fail_first`, then 200.
async fn counting(fail_first: usize) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let n2 = n.clone();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let n = n2.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req: Request<Incoming>| {
                    let seen = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let code = if seen < fail_first { 503 } else { 200 };
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            Response::builder()
                                .status(code)
                                .body(Full::new(Bytes::new()))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (addr, n)
}

#[tokio::test]
async fn retries_where_the_route_allows_and_mirrors() {
    let (flaky, tries) = counting(1).await;
    let (strict, strict_tries) = counting(1).await;
    let (mirror, mirrored) = counting(0).await;
    let (a, _) = counting(0).await;
    let objs = gateway_objects(
        json!([{"name": "http", "port": 80, "protocol": "HTTP"}]),
        vec![json!({"rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/retry"}}], "retry": {"codes": [503], "attempts": 2},
             "backendRefs": [{"name": "flaky", "port": 8080}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/noretry"}}], "backendRefs": [{"name": "strict", "port": 8080}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/mirror"}}],
             "filters": [{"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "mirror", "port": 8080}}}],
             "backendRefs": [{"name": "a", "port": 8080}]},
        ]})],
    );
    let g = Gw::start(&objects(
        &[
            ("flaky", flaky, None),
            ("strict", strict, None),
            ("mirror", mirror, None),
            ("a", a, None),
        ],
        objs,
    ))
    .await;
    assert_eq!(
        get(g.at(80), "x", "/retry", &[]).await.0,
        StatusCode::OK,
        "the 503 was retried"
    );
    assert_eq!(tries.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(
        get(g.at(80), "x", "/noretry", &[]).await.0,
        StatusCode::SERVICE_UNAVAILABLE,
        "no retry without the route's"
    );
    assert_eq!(strict_tries.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(get(g.at(80), "x", "/mirror", &[]).await.0, StatusCode::OK);
    podnet_testkit::eventually(
        "the mirrored copy",
        std::time::Duration::from_secs(10),
        || mirrored.load(std::sync::atomic::Ordering::SeqCst) == 1,
    );
}

/// A client that sends half a request head, or sits idle after a
/// request, is cut off after the header timeout: a pod cannot hold the
/// gateway's connections (and file descriptors) for ever.
#[tokio::test]
async fn slow_and_idle_clients_are_cut_off() {
    let a = echo("a").await;
    let objs = gateway_objects(
        json!([{"name": "http", "port": 8080, "protocol": "HTTP"}]),
        vec![json!({"rules": [{"backendRefs": [{"name": "a", "port": 8080}]}]})],
    );
    let w = objects(&[("a", a, None)], objs);
    let timeout = std::time::Duration::from_millis(300);
    let g = Gw::start_with(&w, Shared::with_header_timeout(false, timeout)).await;
    let addr = g.at(8080);
    // Closed: a read ends (EOF or reset) rather than waiting for ever;
    // the bound only turns a hang into a failure.
    async fn closed(s: &mut TcpStream) -> Result<Vec<u8>, String> {
        let mut got = Vec::new();
        match tokio::time::timeout(std::time::Duration::from_secs(20), s.read_to_end(&mut got))
            .await
        {
            Ok(_) => Ok(got),
            Err(_) => Err(format!(
                "still open; read {:?}",
                String::from_utf8_lossy(&got)
            )),
        }
    }
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: a.example\r\nX-Slow: 1")
        .await
        .unwrap();
    let got = closed(&mut slow)
        .await
        .expect("a half-sent head is cut off");
    assert!(
        !String::from_utf8_lossy(&got).contains("200"),
        "no answer to half a head"
    );
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n")
        .await
        .unwrap();
    let got = closed(&mut idle)
        .await
        .expect("an idle keep-alive connection is closed");
    let got = String::from_utf8_lossy(&got);
    assert!(
        got.starts_with("HTTP/1.1 200"),
        "the request was answered first: {got}"
    );
}
