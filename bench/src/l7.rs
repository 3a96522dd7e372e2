//! The L7 benchmark's three proxies, configured with the same routes:
//! `podnet gateway` (HTTPRoutes in a store of its own), nginx (one
//! `server` per host) and HAProxy (one ACL over the hosts), each in
//! front of the same two keep-alive backends, each serving plain HTTP/1.1,
//! plain HTTP/2 (h2c, prior knowledge) and TLS (ALPN h2 or http/1.1) on
//! ports of its own. Every route is host `h<i>.bench.example`, path
//! prefix `/api/`; anything else is a 404.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context, Result};

/// The ports a proxy serves: plain HTTP/1.1, h2c and TLS.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub h1: u16,
    pub h2c: u16,
    pub tls: u16,
}

/// Host name of route `i`.
pub fn host(i: usize) -> String {
    format!("h{i}.bench.example")
}

/// A free loopback TCP port.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A self-signed certificate for `*.bench.example`: (chain PEM, key PEM).
pub fn certificate() -> Result<(String, String)> {
    let c = rcgen::generate_simple_self_signed(vec!["*.bench.example".to_string()])?;
    Ok((c.cert.pem(), c.signing_key.serialize_pem()))
}

/// podnet's objects: the backends as one Service with an EndpointSlice,
/// the class, a Gateway with the three listeners, the TLS Secret, and
/// `routes` HTTPRoutes.
pub fn podnet_objects(
    routes: usize,
    backends: &[SocketAddr],
    p: Ports,
    cert: &(String, String),
) -> String {
    let mut s = String::new();
    let eps: Vec<String> = backends
        .iter()
        .map(|b| format!("{{addresses: [\"{}\"]}}", b.ip()))
        .collect();
    // One slice per backend port (a slice has one port list).
    let _ = write!(s, "apiVersion: v1\nkind: Service\nmetadata: {{name: be, namespace: default}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n");
    for (i, b) in backends.iter().enumerate() {
        let _ = write!(s, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: be-{i}, namespace: default, labels: {{kubernetes.io/service-name: be}}}}\naddressType: IPv4\nports: [{{name: http, port: {}}}]\nendpoints: [{}]\n", b.port(), eps[i]);
    }
    let indent = |t: &str| t.lines().map(|l| format!("    {l}\n")).collect::<String>();
    let _ = write!(s, "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: tls, namespace: default}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}", indent(&cert.0), indent(&cert.1));
    let _ = write!(s, "---\napiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: podnet}}\nspec: {{controllerName: podnet.io/gateway}}\n");
    let _ = write!(s, "---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: default}}\nspec:\n  gatewayClassName: podnet\n  listeners:\n  - {{name: http, port: {}, protocol: HTTP}}\n  - {{name: https, port: {}, protocol: HTTPS, tls: {{certificateRefs: [{{name: tls}}]}}}}\n", p.h1, p.tls);
    for i in 0..routes {
        s.push_str(&route(i));
    }
    s
}

/// HTTPRoute `r<i>`.
pub fn route(i: usize) -> String {
    format!("---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r{i}, namespace: default}}\nspec:\n  parentRefs: [{{name: gw}}]\n  hostnames: [{}]\n  rules: [{{matches: [{{path: {{type: PathPrefix, value: /api/}}}}], backendRefs: [{{name: be, port: 80}}]}}]\n", host(i))
}

/// nginx's configuration: a worker per CPU, keep-alive upstreams, one
/// server per host on each port.
pub fn nginx_conf(dir: &Path, routes: usize, backends: &[SocketAddr], p: Ports) -> String {
    let mut s = format!(
        "worker_processes 2;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log warn;\n\
         events {{ worker_connections 8192; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
         fastcgi_temp_path {d}/fcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
         server_names_hash_max_size 65536;\n  server_names_hash_bucket_size 128;\n  keepalive_requests 1000000;\n  upstream be {{\n",
        d = dir.display()
    );
    for b in backends {
        let _ = writeln!(s, "    server {b};");
    }
    s.push_str("    keepalive 128;\n  }\n");
    let _ = write!(
        s,
        "  server {{\n    listen 127.0.0.1:{h1} default_server;\n    listen 127.0.0.1:{h2} http2 default_server;\n    \
         listen 127.0.0.1:{tls} ssl http2 default_server;\n    ssl_certificate {d}/tls.crt;\n    ssl_certificate_key {d}/tls.key;\n    \
         return 404;\n  }}\n",
        h1 = p.h1, h2 = p.h2c, tls = p.tls, d = dir.display()
    );
    for i in 0..routes {
        let _ = write!(
            s,
            "  server {{\n    listen 127.0.0.1:{h1};\n    listen 127.0.0.1:{h2} http2;\n    listen 127.0.0.1:{tls} ssl http2;\n    \
             server_name {host};\n    ssl_certificate {d}/tls.crt;\n    ssl_certificate_key {d}/tls.key;\n    \
             location /api/ {{ proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection \"\"; }}\n    \
             location / {{ return 404; }}\n  }}\n",
            h1 = p.h1, h2 = p.h2c, tls = p.tls, host = host(i), d = dir.display()
        );
    }
    s.push_str("}\n");
    s
}

/// HAProxy's configuration: two threads, the hosts in one ACL file,
/// connection reuse to the backends.
pub fn haproxy_conf(dir: &Path, backends: &[SocketAddr], p: Ports) -> String {
    let mut s = format!(
        "global\n  nbthread 2\n  maxconn 8000\n  pidfile {d}/haproxy.pid\n\
         defaults\n  mode http\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n  http-reuse always\n\
         frontend fe\n  bind 127.0.0.1:{h1}\n  bind 127.0.0.1:{h2} proto h2\n  bind 127.0.0.1:{tls} ssl crt {d}/tls.pem alpn h2,http/1.1\n  \
         acl route hdr(host),field(1,:) -i -f {d}/hosts.lst\n  acl api path_beg /api/\n  \
         http-request return status 404 unless route api\n  use_backend be\n\
         backend be\n  balance roundrobin\n",
        h1 = p.h1, h2 = p.h2c, tls = p.tls, d = dir.display()
    );
    for (i, b) in backends.iter().enumerate() {
        let _ = writeln!(s, "  server s{i} {b}");
    }
    s
}

/// A proxy process, killed when dropped.
pub struct Proc {
    pub name: &'static str,
    pub child: Child,
    log: PathBuf,
}

impl Drop for Proc {
    /// Kills the whole process group (nginx's workers outlive a killed
    /// master otherwise).
    fn drop(&mut self) {
        // SAFETY: kill(2) on the group this process leads.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Proc {
    pub fn start(name: &'static str, cmd: &mut Command, log: &Path) -> Result<Proc> {
        let out = std::fs::File::create(log)?;
        use std::os::unix::process::CommandExt;
        let child = cmd
            .stdout(Stdio::null())
            .stderr(out)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Proc {
            name,
            child,
            log: log.to_path_buf(),
        })
    }

    /// The process and its children (nginx's workers).
    pub fn pids(&self) -> Vec<u32> {
        let mut out = vec![self.child.id()];
        let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.child.id()))
            .unwrap_or_default();
        out.extend(
            kids.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
        out
    }

    /// CPU time (user + system) of the process and its children, seconds.
    pub fn cpu_seconds(&self) -> f64 {
        let tick = 100.0;
        self.pids()
            .iter()
            .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
            .map(|s| {
                let f: Vec<&str> = s
                    .rsplit(')')
                    .next()
                    .unwrap_or("")
                    .split_whitespace()
                    .collect();
                let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
                (n(11) + n(12)) / tick
            })
            .sum()
    }

    /// Resident memory of the process and its children, MiB (nginx's
    /// workers share pages with the master: this counts them per process).
    pub fn rss_mib(&self) -> f64 {
        self.pids()
            .iter()
            .map(|p| crate::proc_status_mib(*p, "VmRSS:"))
            .sum()
    }

    pub fn alive(&mut self) -> Result<()> {
        if let Some(st) = self.child.try_wait()? {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            bail!("{} exited: {st}\n{log}", self.name);
        }
        Ok(())
    }
}

/// Writes `text` to `dir/name`.
pub fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let p = dir.join(name);
    std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    Ok(p)
}

/// `n` backends on loopback answering "ok" to every request, keeping
/// connections open (served on `rt`).
pub fn ok_backends(rt: &tokio::runtime::Runtime, n: usize) -> Result<Vec<SocketAddr>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let l = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
        out.push(l.local_addr()?);
        rt.spawn(async move {
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                let _ = s.set_nodelay(true);
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(|_req| async {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            http_body_util::Full::new(bytes::Bytes::from_static(b"ok\n")),
                        ))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                        .await;
                });
            }
        });
    }
    Ok(out)
}
