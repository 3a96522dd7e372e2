//! podman 4.3 (runc, CNI network backend) as a real runtime calling our
//! plugins, following shared/realclients.md.
//!
//! Two containers from a busybox rootfs join a network served by our bridge +
//! host-local + portmap. They ping each other and fetch each other's page; a
//! `-p HOSTPORT:80` mapping reaches one of them from the machine's namespace
//! (127.0.0.1 and the bridge gateway) and from the other container (hairpin).
//! A stop/start cycle (DEL then ADD again) must move the mapping to the new
//! address, and removing the containers must leave no lease, no map element
//! and no port on the bridge.
//!
//! podman runs in the machine's own namespace, so everything is named after
//! the pid, all podman state lives in a temp dir, and a drop guard removes
//! the containers, their namespaces, the bridge, the nft tables our plugins
//! created (only when they were absent before and hold nothing foreign), the
//! cgroups, and restores `net.ipv4.ip_forward`, even when the test panics.

mod common;

use std::fs;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::Plugins;
use podnet_daemon::HttpGet;
use podnet_testkit::{eventually, nft, nft_list_json, require_root, try_eventually, unique};
use serde_json::Value;

/// What CI must install for this test.
const APT: &str = "apt-get install -y --no-install-recommends podman runc busybox-static";
const BUSYBOX: &str = "/bin/busybox";
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
/// libcni's result cache: podman's CNI backend always uses this directory
/// (removed at the end only when it is new and empty).
const CNI_CACHE: &str = "/var/lib/cni";
/// runc's default state root, which it creates on first use.
const RUNC_ROOT: &str = "/run/runc";
/// nft tables our plugins may create in the machine's namespace.
const TABLES: [(&str, &str); 3] = [
    ("inet", "podnet-portmap"),
    ("inet", "podnet-cni"),
    ("bridge", "podnet-cni"),
];
const PODMAN_TIMEOUT_S: &str = "30";
/// How long a fetch through the new network may keep failing.
const FETCH: Duration = Duration::from_secs(10);

/// Fails (never skips) when a peer is missing: CI installs them.
fn require_tools() {
    let podman = Command::new("podman").arg("--version").output();
    match podman {
        Ok(o) if o.status.success() => {}
        _ => panic!("podman not found or not working: {APT}"),
    }
    assert!(
        ["/usr/sbin/runc", "/usr/bin/runc", "/sbin/runc", "/bin/runc"]
            .iter()
            .any(|p| Path::new(p).exists()),
        "runc not found: {APT}"
    );
    let bb = fs::read(BUSYBOX).unwrap_or_else(|e| panic!("{BUSYBOX}: {e}: {APT}"));
    assert!(
        is_static_elf(&bb),
        "{BUSYBOX} is dynamically linked; the rootfs needs busybox-static: {APT}"
    );
}

/// An ELF64 file without a PT_INTERP program header runs without a loader.
fn is_static_elf(b: &[u8]) -> bool {
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 {
        return false;
    }
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(b[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    (0..phnum).all(|i| {
        let o = phoff + i * phentsize;
        o + 4 <= b.len() && u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) != 3
    })
}

/// The root filesystem: busybox plus the applet links the test uses, and a
/// page per container under /www/<name>/id that names it.
fn build_rootfs(root: &Path, names: &[&str]) {
    let bin = root.join("bin");
    fs::create_dir_all(&bin).unwrap();
    fs::copy(BUSYBOX, bin.join("busybox")).unwrap();
    for l in [
        "sh", "ip", "ping", "nc", "wget", "sleep", "cat", "httpd", "timeout",
    ] {
        std::os::unix::fs::symlink("busybox", bin.join(l)).unwrap();
    }
    for d in ["etc", "proc", "sys", "dev", "tmp", "run"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    for n in names {
        let www = root.join("www").join(n);
        fs::create_dir_all(&www).unwrap();
        fs::write(www.join("id"), n).unwrap();
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn out_err(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn run(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {cmd}: {e}"))
}

/// An HTTP/1.0 GET of /id from the machine's namespace; returns the body.
fn http_get(addr: SocketAddr) -> Result<String, String> {
    let r = HttpGet::new(Duration::from_secs(3))
        .connect_timeout(Duration::from_secs(2))
        .get(addr, "/id")
        .map_err(|e| e.to_string())?;
    match r.status {
        200 => Ok(r.body),
        code => Err(format!("{addr}: unexpected response {code} {:?}", r.body)),
    }
}

/// The JSON listing of one nft table in the machine's namespace, if present.
fn nft_table(family: &str, name: &str) -> Option<Value> {
    nft_list_json(None, &format!("table {family} {name}"))
}

/// Every set and map element of a listed table, as JSON text.
fn nft_elements(table: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for obj in table["nftables"].as_array().into_iter().flatten() {
        for kind in ["set", "map"] {
            for e in obj[kind]["elem"].as_array().into_iter().flatten() {
                out.push(e.to_string());
            }
        }
    }
    out
}

/// The private podman world of this test, and its drop guard.
struct World {
    dir: tempfile::TempDir,
    _plugins: Plugins,
    net: String,
    bridge: String,
    /// First three octets of the /24, e.g. "10.213.37".
    prefix: String,
    host_port: u16,
    cgroup_parent: String,
    rootfs: PathBuf,
    /// The network namespaces podman made, removed if podman did not.
    sandboxes: Vec<String>,
    tables_before: Vec<bool>,
    ip_forward_before: String,
    cni_cache_existed: bool,
    cni_results_existed: bool,
    runc_root_existed: bool,
    cleaned: bool,
}

impl World {
    fn new(names: &[&str]) -> World {
        let plugins = Plugins::install();
        let dir = tempfile::Builder::new()
            .prefix("pn-podman-")
            .tempdir()
            .unwrap();
        let pid = std::process::id();
        let net = unique("pmnet");
        let bridge = unique("pm");
        assert!(bridge.len() <= 15, "bridge name {bridge} too long");

        // A /24 and a host port nobody on this machine uses yet.
        let routes = stdout(&run("ip", &["-4", "route", "show", "table", "all"]));
        let addrs = stdout(&run("ip", &["-4", "-o", "addr"]));
        let third = (0..200)
            .map(|i| 20 + (pid + i) % 200)
            .find(|x| {
                let p = format!("10.213.{x}.");
                !routes.contains(&p) && !addrs.contains(&p)
            })
            .expect("a free 10.213.X.0/24");
        let prefix = format!("10.213.{third}");
        let host_port = (0..1000)
            .map(|i| 20000 + ((pid + i) % 20000) as u16)
            .find(|p| TcpListener::bind(("0.0.0.0", *p)).is_ok())
            .expect("a free host port");

        let p = dir.path();
        let rootfs = p.join("rootfs");
        build_rootfs(&rootfs, names);
        for d in ["net.d", "ipam", "portmap", "tmp", "graph", "run"] {
            fs::create_dir_all(p.join(d)).unwrap();
        }
        let conflist = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": net,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": bridge,
                    "isGateway": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": format!("{prefix}.0/24")}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": p.join("ipam"),
                    }
                },
                {
                    "type": "portmap",
                    "capabilities": {"portMappings": true},
                    "stateDir": p.join("portmap"),
                }
            ]
        });
        fs::write(
            p.join("net.d").join(format!("{net}.conflist")),
            serde_json::to_vec_pretty(&conflist).unwrap(),
        )
        .unwrap();
        fs::write(
            p.join("containers.conf"),
            format!(
                "[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n\
                 lock_type = \"file\"\ntmp_dir = \"{tmp}\"\n\
                 [containers]\ndefault_ulimits = [\"nofile=1024:1024\", \"nproc=1024:1024\"]\n\
                 [network]\nnetwork_backend = \"cni\"\ncni_plugin_dirs = [\"{bin}\"]\nnetwork_config_dir = \"{netd}\"\n",
                tmp = p.join("tmp").display(),
                bin = plugins.bin().display(),
                netd = p.join("net.d").display(),
            ),
        )
        .unwrap();
        fs::write(
            p.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                p.join("graph").display(),
                p.join("run").display()
            ),
        )
        .unwrap();

        World {
            tables_before: TABLES
                .iter()
                .map(|(f, t)| nft_table(f, t).is_some())
                .collect(),
            ip_forward_before: fs::read_to_string(IP_FORWARD).unwrap().trim().to_string(),
            cni_cache_existed: Path::new(CNI_CACHE).exists(),
            cni_results_existed: Path::new(CNI_CACHE).join("results").exists(),
            runc_root_existed: Path::new(RUNC_ROOT).exists(),
            cgroup_parent: format!("/{}", unique("pmcg")),
            dir,
            _plugins: plugins,
            net,
            bridge,
            prefix,
            host_port,
            rootfs,
            sandboxes: Vec::new(),
            cleaned: false,
        }
    }

    /// Runs podman with this world's configuration, bounded in time.
    fn podman(&self, args: &[&str]) -> Output {
        let p = self.dir.path();
        Command::new("timeout")
            .args(["-k", "5", PODMAN_TIMEOUT_S, "podman"])
            .args(args)
            .env("CONTAINERS_CONF", p.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", p.join("storage.conf"))
            .output()
            .expect("spawning podman")
    }

    fn podman_ok(&self, args: &[&str]) -> String {
        let o = self.podman(args);
        assert!(
            o.status.success(),
            "podman {}: {}",
            args.join(" "),
            out_err(&o)
        );
        stdout(&o)
    }

    /// Starts a detached container on our network; records its namespace.
    fn run_container(&mut self, name: &str, extra: &[&str], cmd: &[&str]) {
        let rootfs = self.rootfs.display().to_string();
        let mut args = vec![
            "run",
            "-d",
            "--name",
            name,
            "--network",
            &self.net,
            "--cgroup-parent",
            &self.cgroup_parent,
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--rootfs", &rootfs]);
        args.extend_from_slice(cmd);
        self.podman_ok(&args);
        self.record_sandbox(name);
    }

    fn record_sandbox(&mut self, name: &str) {
        let key = self.podman_ok(&[
            "inspect",
            name,
            "--format",
            "{{.NetworkSettings.SandboxKey}}",
        ]);
        if !key.is_empty() && !self.sandboxes.contains(&key) {
            self.sandboxes.push(key);
        }
    }

    /// This container's attachment as podman saw it: (IP, gateway, MAC).
    fn attachment(&self, name: &str) -> (String, String, String) {
        let js = self.podman_ok(&[
            "inspect",
            name,
            "--format",
            "{{json .NetworkSettings.Networks}}",
        ]);
        let v: Value = serde_json::from_str(&js).unwrap();
        let n = &v[&self.net];
        let s = |k: &str| n[k].as_str().unwrap_or_default().to_string();
        (s("IPAddress"), s("Gateway"), s("MacAddress"))
    }

    fn exec(&self, name: &str, cmd: &[&str]) -> Result<String, String> {
        let mut args = vec!["exec", name];
        args.extend_from_slice(cmd);
        let o = self.podman(&args);
        if o.status.success() {
            Ok(stdout(&o))
        } else {
            Err(format!(
                "podman exec {name} {}: {}",
                cmd.join(" "),
                out_err(&o)
            ))
        }
    }

    /// GET `url` from inside container `name`. busybox 1.35's `wget -T`
    /// segfaults, so the applet `timeout` bounds it instead.
    fn fetch(&self, name: &str, url: &str) -> Result<String, String> {
        self.exec(name, &["timeout", "3", "wget", "-q", "-O", "-", url])
    }

    fn gateway(&self) -> String {
        format!("{}.1", self.prefix)
    }

    /// Map and set elements in the machine's namespace that mention our subnet.
    fn our_elements(&self) -> Vec<String> {
        let p = format!("\"{}.", self.prefix);
        TABLES
            .iter()
            .filter_map(|(f, t)| nft_table(f, t))
            .flat_map(|t| nft_elements(&t))
            .filter(|e| e.contains(&p))
            .collect()
    }

    /// Addresses host-local holds for our network.
    fn leases(&self) -> Vec<String> {
        let dir = self.dir.path().join("ipam").join(&self.net);
        let Ok(rd) = fs::read_dir(dir) else {
            return Vec::new();
        };
        rd.flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect()
    }

    fn bridge_ports(&self) -> Vec<String> {
        stdout(&run("ip", &["-o", "link", "show", "master", &self.bridge]))
            .lines()
            .map(String::from)
            .collect()
    }

    /// Removes everything this test made in the machine's namespace and
    /// returns every failure rather than stopping at the first.
    fn cleanup(&mut self) -> Vec<String> {
        self.cleaned = true;
        let mut errs = Vec::new();
        let o = self.podman(&["rm", "-a", "-f", "-t", "0"]);
        if !o.status.success() {
            errs.push(format!("podman rm: {}", out_err(&o)));
        }

        // Namespaces podman left (only after a failed rm).
        for key in &self.sandboxes {
            let path = Path::new(key);
            if path.exists() {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                let o = run("ip", &["netns", "delete", &name]);
                errs.push(format!(
                    "podman left netns {key}; removing it: {}",
                    out_err(&o)
                ));
            }
        }

        // Mounts under our temp dir (container shm, after a failed rm).
        let root = self.dir.path().display().to_string();
        let mut mounts: Vec<String> = fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(String::from))
            .filter(|m| m.starts_with(&root))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let o = run("umount", &["-l", &m]);
            errs.push(format!(
                "mount {m} left behind; unmounting: {}",
                out_err(&o)
            ));
        }

        if Path::new("/sys/class/net").join(&self.bridge).exists() {
            let o = run("ip", &["link", "delete", &self.bridge]);
            if !o.status.success() {
                errs.push(format!("deleting bridge {}: {}", self.bridge, out_err(&o)));
            }
        }

        // nft tables: only those we brought into being, and only when
        // nothing but our own leftovers is in them.
        let ours = format!("\"{}.", self.prefix);
        for ((family, name), existed) in TABLES.iter().zip(&self.tables_before) {
            let Some(t) = nft_table(family, name) else {
                continue;
            };
            let els = nft_elements(&t);
            let leftovers: Vec<&String> = els.iter().filter(|e| e.contains(&ours)).collect();
            if !leftovers.is_empty() {
                errs.push(format!(
                    "{family} {name} still holds our elements {leftovers:?}"
                ));
            }
            if !existed && leftovers.len() == els.len() {
                if let Err(e) = nft(None, &format!("delete table {family} {name}")) {
                    errs.push(format!("deleting nft table {family} {name}: {e}"));
                }
            }
        }

        // The bridge plugin turns forwarding on; put it back.
        if fs::read_to_string(IP_FORWARD)
            .map(|s| s.trim() != self.ip_forward_before)
            .unwrap_or(false)
        {
            if let Err(e) = fs::write(IP_FORWARD, &self.ip_forward_before) {
                errs.push(format!("restoring {IP_FORWARD}: {e}"));
            }
        }

        // libcni's cache dir: podman creates it; remove it when empty and new.
        if !self.cni_results_existed {
            let _ = fs::remove_dir(Path::new(CNI_CACHE).join("results"));
        }
        if !self.cni_cache_existed {
            let _ = fs::remove_dir(CNI_CACHE);
        }
        if !self.runc_root_existed {
            let _ = fs::remove_dir(RUNC_ROOT);
        }

        errs.extend(remove_cgroups(&self.cgroup_parent));
        errs
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if !self.cleaned {
            for e in self.cleanup() {
                eprintln!("podman test cleanup: {e}");
            }
        }
    }
}

/// Removes `/sys/fs/cgroup[/<controller>]<parent>` and everything below it,
/// deepest first. Exiting conmons may hold a cgroup for a moment.
fn remove_cgroups(parent: &str) -> Vec<String> {
    let base = Path::new("/sys/fs/cgroup");
    let rel = parent.trim_start_matches('/');
    let mut roots = vec![base.join(rel)];
    for e in fs::read_dir(base).into_iter().flatten().flatten() {
        roots.push(e.path().join(rel));
    }
    let mut dirs = Vec::new();
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        if d.is_dir() {
            for e in fs::read_dir(d).into_iter().flatten().flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    walk(&e.path(), out);
                }
            }
            out.push(d.to_path_buf());
        }
    }
    for r in roots
        .iter()
        .filter(|r| r.starts_with(base) && r.as_path() != base)
    {
        walk(r, &mut dirs);
    }
    let mut errs = Vec::new();
    for d in dirs {
        let gone = try_eventually(Duration::from_secs(5), || match fs::remove_dir(&d) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        });
        if let Err(e) = gone {
            errs.push(format!(
                "removing cgroup {}: {}",
                d.display(),
                e.unwrap_or_default()
            ));
        }
    }
    errs
}

#[test]
fn podman_runs_containers_on_our_plugins() {
    require_root();
    require_tools();
    let t0 = Instant::now();
    let c1 = unique("pmc1");
    let c2 = unique("pmc2");
    let mut w = World::new(&[c1.as_str(), c2.as_str()]);
    eprintln!(
        "podman test: network {} bridge {} subnet {}.0/24 host port {}",
        w.net, w.bridge, w.prefix, w.host_port
    );

    // c1 serves /www/<c1>/id on port 80 and publishes it; c2 serves its own.
    let publish = format!("{}:80", w.host_port);
    let www1 = format!("/www/{c1}");
    let www2 = format!("/www/{c2}");
    w.run_container(
        &c1,
        &["-p", &publish],
        &["/bin/httpd", "-f", "-p", "80", "-h", &www1],
    );
    w.run_container(&c2, &[], &["/bin/httpd", "-f", "-p", "80", "-h", &www2]);

    // What podman got back from our plugins matches what is in the container.
    let (ip1, gw1, mac1) = w.attachment(&c1);
    let (ip2, gw2, mac2) = w.attachment(&c2);
    eprintln!("podman test: {c1} = {ip1} ({mac1}), {c2} = {ip2} ({mac2})");
    for (c, ip, gw, mac) in [(&c1, &ip1, &gw1, &mac1), (&c2, &ip2, &gw2, &mac2)] {
        assert!(
            ip.starts_with(&format!("{}.", w.prefix)),
            "{c}: IP {ip:?} outside {}.0/24",
            w.prefix
        );
        assert_eq!(*gw, w.gateway(), "{c}: gateway");
        let addr = w
            .exec(c, &["ip", "-4", "-o", "addr", "show", "dev", "eth0"])
            .unwrap();
        assert!(
            addr.contains(&format!("inet {ip}/24")),
            "{c}: eth0 is {addr:?}, want {ip}/24"
        );
        let have_mac = w.exec(c, &["cat", "/sys/class/net/eth0/address"]).unwrap();
        assert!(
            have_mac.eq_ignore_ascii_case(mac),
            "{c}: MAC {have_mac} but podman reports {mac}"
        );
        let routes = w.exec(c, &["ip", "-4", "route"]).unwrap();
        assert!(
            routes.contains(&format!("default via {gw}")),
            "{c}: routes {routes:?}"
        );
    }
    assert_ne!(ip1, ip2);
    assert_eq!(w.bridge_ports().len(), 2, "two veths on {}", w.bridge);
    let mut leases = w.leases();
    leases.sort();
    let mut want = vec![ip1.clone(), ip2.clone()];
    want.sort();
    assert_eq!(leases, want, "host-local leases in dataDir");

    // Pod to pod: ICMP both ways, then TCP both ways.
    w.exec(&c2, &["ping", "-c", "1", "-W", "2", &ip1]).unwrap();
    w.exec(&c1, &["ping", "-c", "1", "-W", "2", &ip2]).unwrap();
    let url = |ip: &str, port: u16| format!("http://{ip}:{port}/id");
    let got = eventually("c2 fetching c1", FETCH, || w.fetch(&c2, &url(&ip1, 80)));
    assert_eq!(got, c1);
    let got = eventually("c1 fetching c2", FETCH, || w.fetch(&c1, &url(&ip2, 80)));
    assert_eq!(got, c2);

    // The host port, from the machine's namespace and hairpinned from c2.
    let check_hostport = |w: &World| {
        let lo: SocketAddr = ([127, 0, 0, 1], w.host_port).into();
        assert_eq!(eventually("127.0.0.1:HOSTPORT", FETCH, || http_get(lo)), c1);
        let gw: SocketAddr = format!("{}:{}", w.gateway(), w.host_port).parse().unwrap();
        assert_eq!(eventually("gateway:HOSTPORT", FETCH, || http_get(gw)), c1);
        let hairpin = url(&w.gateway(), w.host_port);
        let got = eventually("c2 via gateway:HOSTPORT", FETCH, || w.fetch(&c2, &hairpin));
        assert_eq!(got, c1);
    };
    check_hostport(&w);
    assert!(
        !w.our_elements().is_empty(),
        "portmap put no elements in the machine's namespace"
    );

    // stop = DEL: the mapping and the lease go; start = ADD: they come back.
    w.podman_ok(&["stop", "-t", "0", &c1]);
    assert_eq!(
        w.our_elements(),
        Vec::<String>::new(),
        "mapping left after DEL of {c1}"
    );
    assert_eq!(
        w.leases(),
        vec![ip2.clone()],
        "lease of {c1} left after DEL"
    );
    assert_eq!(w.bridge_ports().len(), 1, "veth of {c1} left after DEL");
    w.podman_ok(&["start", &c1]);
    w.record_sandbox(&c1);
    let (ip1b, _, _) = w.attachment(&c1);
    eprintln!("podman test: {c1} restarted as {ip1b}");
    check_hostport(&w);
    let els = w.our_elements();
    assert!(
        els.iter().any(|e| e.contains(&format!("\"{ip1b}\""))),
        "mapping does not point at {ip1b}: {els:?}"
    );
    if ip1b != ip1 {
        assert!(
            !els.iter().any(|e| e.contains(&format!("\"{ip1}\""))),
            "stale mapping to {ip1}: {els:?}"
        );
    }

    // Removing the containers removes all per-container state.
    w.podman_ok(&["rm", "-f", "-t", "0", &c1, &c2]);
    assert_eq!(w.podman_ok(&["ps", "-a", "-q"]), "", "containers left");
    assert_eq!(
        w.our_elements(),
        Vec::<String>::new(),
        "nft elements left after rm"
    );
    assert_eq!(w.leases(), Vec::<String>::new(), "leases left after rm");
    assert_eq!(
        w.bridge_ports(),
        Vec::<String>::new(),
        "veths left on {}",
        w.bridge
    );
    let portmap_state: Vec<_> = fs::read_dir(w.dir.path().join("portmap"))
        .unwrap()
        .flatten()
        .collect();
    assert!(
        portmap_state.is_empty(),
        "portmap state left: {portmap_state:?}"
    );
    for key in &w.sandboxes {
        assert!(!Path::new(key).exists(), "netns {key} left");
    }

    // And the guard leaves the machine as it found it.
    let errs = w.cleanup();
    assert!(errs.is_empty(), "cleanup: {errs:#?}");
    assert!(
        !Path::new("/sys/class/net").join(&w.bridge).exists(),
        "bridge {} left",
        w.bridge
    );
    for ((family, name), existed) in TABLES.iter().zip(&w.tables_before) {
        assert_eq!(
            nft_table(family, name).is_some(),
            *existed,
            "nft table {family} {name}"
        );
    }
    eprintln!("podman test: done in {:.1}s", t0.elapsed().as_secs_f64());
}
