//! containerd 1.6 as a test's kubelet-side runtime: a private containerd
//! driven through its CRI gRPC API (`runtime.v1`, the `k8s-cri` crate),
//! after shared/realclients.md ("containerd 1.6 (CRI)").
//!
//! - [`pause_image`]: the sandbox image, built offline by
//!   `scripts/pause-image.sh` and imported with `ctr -n k8s.io images
//!   import`.
//! - [`Containerd`]: one containerd process per test, run inside a lab
//!   node's network namespace (entered with `setns` only, as the lab starts
//!   its agents: `ip netns exec` would also remount `/sys`, and the cgroupfs
//!   driver then finds no `/sys/fs/cgroup`). Its root, state, sockets, runc
//!   root, pod cgroups and the sandboxes' network namespaces
//!   (`netns_mounts_under_state_dir`) are the test's own, so it never meets
//!   another containerd or another test. It is also the drop guard: it
//!   kills containerd and every shim and sandbox process it started, undoes
//!   their mounts, cgroups and shim sockets, and removes its directory,
//!   even when the test panics.
//! - [`Cri`]: the runtime and image service clients on its socket.
//!
//! CNI plugins inherit containerd's environment, and libcni copies their
//! stderr to containerd's: with `PODNET_LOG` set, the containerd log holds
//! one `cni call` line per plugin process containerd ran ([`Containerd::cni_calls`]).

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use podnet_kernel::Netns;
use podnet_testkit::{try_eventually, unique};
use tonic::transport::{Channel, Endpoint, Uri};

/// What CI must install for this harness (`scripts/setup.sh` does).
pub const SETUP: &str = "bash scripts/setup.sh (apt-get install -y --no-install-recommends containerd runc busybox-static)";
/// The CRI plugin's containerd namespace.
pub const K8S_NS: &str = "k8s.io";
/// Where containerd 1.6 puts shim sockets whatever its config says.
const SHIM_SOCKET_DIR: &str = "/run/containerd/s";
/// libcni's cache, which containerd's CRI plugin cannot move.
const CNI_CACHE: &str = "/var/lib/cni";
/// How long containerd may take to answer, and to stop.
const START: Duration = Duration::from_secs(30);
const STOP: Duration = Duration::from_secs(15);
/// The filter the plugins log with: every plugin call, and every warning.
pub const PLUGIN_LOG: &str = "warn,podnet_cni::skel=debug";

/// Fails (never skips) when containerd or its helpers are missing.
pub fn require_containerd() {
    for tool in ["containerd", "ctr", "containerd-shim-runc-v2", "runc"] {
        let found = std::env::var("PATH")
            .unwrap_or_default()
            .split(':')
            .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"])
            .any(|d| Path::new(d).join(tool).is_file());
        assert!(found, "{tool} not found: {SETUP}");
    }
    let o = Command::new("containerd").arg("--version").output();
    match o {
        Ok(o) if o.status.success() => {
            let v = String::from_utf8_lossy(&o.stdout);
            assert!(
                v.contains(" 1.6.") || v.contains(" v1.6."),
                "this harness is written for containerd 1.6 (Debian 12), found {v}"
            );
        }
        _ => panic!("containerd does not run: {SETUP}"),
    }
}

/// The sandbox image: its name and its OCI archive.
pub struct PauseImage {
    pub reference: String,
    pub archive: PathBuf,
}

/// Builds (or finds in its cache) the pause image with
/// `scripts/pause-image.sh`.
pub fn pause_image() -> PauseImage {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/pause-image.sh");
    let o = Command::new("bash")
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{} failed: {out}{}\n{SETUP}",
        script.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    let field = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or_else(|| panic!("{} printed no {k}: {out}", script.display()))
            .to_string()
    };
    PauseImage {
        reference: field("image="),
        archive: PathBuf::from(field("archive=")),
    }
}

/// The CRI clients on one containerd socket.
pub struct Cri {
    pub runtime: RuntimeServiceClient<Channel>,
    pub images: ImageServiceClient<Channel>,
}

/// A gRPC channel over a unix socket (tonic speaks HTTP/2 on any stream).
async fn channel(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = socket.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
}

/// A private containerd in a node's network namespace, and its guard.
pub struct Containerd {
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// The cgroup all of this containerd's pods go under (`/<name>`).
    cgroup_root: String,
    /// Whether `/run/containerd` and libcni's cache existed before: they
    /// are removed at the end only when this harness made them and they
    /// are empty.
    run_dir_existed: bool,
    cni_cache_existed: bool,
    cni_results_existed: bool,
    /// Sandboxes this test made, for leftovers in libcni's cache.
    sandboxes: Vec<String>,
    stopped: bool,
}

impl Containerd {
    /// Writes the config and starts containerd inside `node_netns`, with the
    /// CNI plugins in `cni_bin` and the network config in `cni_conf`.
    /// Returns at once; [`Containerd::connect`] waits until it answers.
    pub fn start(node_netns: &str, cni_bin: &Path, cni_conf: &Path, sandbox_image: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("pn-cri-")
            .tempdir()
            .expect("temp dir");
        let mut c = Containerd {
            cgroup_root: unique("cri"),
            run_dir_existed: Path::new("/run/containerd").exists(),
            cni_cache_existed: Path::new(CNI_CACHE).exists(),
            cni_results_existed: Path::new(CNI_CACHE).join("results").exists(),
            dir,
            child: None,
            sandboxes: Vec::new(),
            stopped: false,
        };
        let d = c.dir().to_path_buf();
        fs::create_dir_all(d.join("tmp")).unwrap();
        let q = |p: &Path| format!("{:?}", p.display().to_string());
        // Only the plugins a CRI node needs: the other snapshotters probe
        // for filesystems and kernel modules this machine does not have.
        let config = format!(
            r#"version = 2
root = {root}
state = {state}
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = {sock}
[ttrpc]
  address = {ttrpc}
[debug]
  level = "info"
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {image:?}
  # Without it runc fails: "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # The sandboxes' network namespaces under the state dir, not /run/netns.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = {runc}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {bin}
    conf_dir = {conf}
    max_conf_num = 1
"#,
            root = q(&d.join("root")),
            state = q(&d.join("state")),
            sock = q(&c.socket()),
            ttrpc = q(&d.join("containerd.sock.ttrpc")),
            opt = q(&d.join("opt")),
            image = sandbox_image,
            runc = q(&d.join("runc")),
            bin = q(cni_bin),
            conf = q(cni_conf),
        );
        fs::write(c.config_path(), config).unwrap();
        let log = fs::File::create(c.log_path()).unwrap();
        let mut cmd = Command::new("containerd");
        cmd.arg("--config")
            .arg(c.config_path())
            .env("TMPDIR", d.join("tmp"))
            .env("PODNET_LOG", PLUGIN_LOG)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let ns = Netns::named(node_netns).unwrap_or_else(|e| panic!("{node_netns}: {e}"));
        let child = ns
            .run(|| cmd.spawn())
            .expect("entering the node's namespace")
            .unwrap_or_else(|e| panic!("starting containerd: {e}\n{SETUP}"));
        c.child = Some(child);
        c
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn socket(&self) -> PathBuf {
        self.dir().join("containerd.sock")
    }

    fn config_path(&self) -> PathBuf {
        self.dir().join("config.toml")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir().join("containerd.log")
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The cgroup parent for pod `uid`, as a kubelet with the cgroupfs
    /// driver names it, under this containerd's own root.
    pub fn cgroup_parent(&self, uid: &str) -> String {
        format!("/{}/pod{uid}", self.cgroup_root)
    }

    /// Remembers a sandbox, so its libcni cache entries go at the end.
    pub fn note_sandbox(&mut self, id: &str) {
        self.sandboxes.push(id.to_string());
    }

    /// Waits until the CRI answers `Version`; fails with containerd's log
    /// when it exits or does not answer in time.
    pub async fn connect(&mut self) -> Cri {
        let deadline = Instant::now() + START;
        let mut pause = Duration::from_millis(10);
        loop {
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("containerd exited ({st}) before answering:\n{}", self.log());
            }
            let last = match channel(&self.socket()).await {
                Ok(ch) => {
                    let mut runtime = RuntimeServiceClient::new(ch.clone());
                    match runtime
                        .version(k8s_cri::v1::VersionRequest::default())
                        .await
                    {
                        Ok(_) => {
                            return Cri {
                                runtime,
                                images: ImageServiceClient::new(ch),
                            }
                        }
                        Err(e) => format!("Version: {e}"),
                    }
                }
                Err(e) => format!("connecting to {}: {e}", self.socket().display()),
            };
            if Instant::now() > deadline {
                panic!(
                    "containerd did not answer CRI Version within {START:?} ({last}):\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// `ctr -n k8s.io images import ARCHIVE`, as realclients.md loads the
    /// sandbox image.
    pub fn import(&self, archive: &Path) {
        let o = Command::new("ctr")
            .arg("--address")
            .arg(self.socket())
            .args(["-n", K8S_NS, "images", "import"])
            .arg(archive)
            .output()
            .expect("running ctr");
        assert!(
            o.status.success(),
            "ctr images import {}: {}{}",
            archive.display(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// The `cni call` lines of the plugin processes containerd ran for
    /// container `id` with `command` (ADD, DEL...): one per process.
    pub fn cni_calls(&self, command: &str, id: &str) -> usize {
        let cmd = format!("command=\"{command}\"");
        let container = format!("container={id}");
        self.log()
            .lines()
            .filter(|l| l.contains("cni call") && l.contains(&cmd) && l.contains(&container))
            .count()
    }

    /// Warnings and errors our plugins printed (through containerd's log).
    pub fn plugin_complaints(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains(" podnet"))
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .map(String::from)
            .collect()
    }

    /// Processes of this containerd: itself, its shims and runc (their
    /// command lines name this directory), and its pods' processes (in its
    /// cgroup), as `pid command-line`. Exited ones (zombies) do not count.
    pub fn processes(&self) -> Vec<(u32, String)> {
        let marker = format!("{}/", self.dir().display());
        let cgroup = format!("/{}/", self.cgroup_root);
        let mut out = Vec::new();
        for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if pid == std::process::id() || is_zombie(pid) {
                continue;
            }
            let cmdline = fs::read(e.path().join("cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_default();
            let cg = fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
            if cmdline.contains(&marker) || cg.contains(&cgroup) {
                out.push((pid, cmdline.trim().to_string()));
            }
        }
        out
    }

    /// Mount points under this containerd's directory (rootfs, shm, the
    /// sandboxes' network namespaces), deepest first.
    pub fn mounts(&self) -> Vec<String> {
        let root = format!("{}/", self.dir().display());
        let mut m: Vec<String> = fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(String::from))
            .filter(|m| m.starts_with(&root))
            .collect();
        m.sort_by_key(|m| std::cmp::Reverse(m.len()));
        m
    }

    /// Cgroup directories of this containerd's pods still present.
    pub fn cgroups(&self) -> Vec<PathBuf> {
        cgroup_dirs(&self.cgroup_root)
    }

    /// What this containerd would leave behind if it were stopped now:
    /// processes of its pods and shims (not containerd itself), mounts,
    /// cgroups below the pods' parent.
    pub fn sandbox_leftovers(&self) -> Vec<String> {
        let me = self.pid();
        let mut out: Vec<String> = self
            .processes()
            .into_iter()
            .filter(|(pid, _)| Some(*pid) != me)
            .map(|(pid, c)| format!("process {pid}: {c}"))
            .collect();
        out.extend(self.mounts().into_iter().map(|m| format!("mount {m}")));
        out
    }

    /// Stops containerd (SIGTERM, then SIGKILL) and removes everything it
    /// and its shims made; returns what went wrong, or what had to be
    /// cleaned up by force. Runs once.
    pub fn stop(&mut self) -> Vec<String> {
        if self.stopped {
            return Vec::new();
        }
        self.stopped = true;
        let mut errs = Vec::new();
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let gone = try_eventually(STOP, || child.try_wait().ok().flatten().is_some());
            if gone.is_err() {
                errs.push("containerd ignored SIGTERM; killing it".to_string());
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Shims and sandbox processes outlive containerd by design: only a
        // test that failed half-way leaves any.
        let procs = self.processes();
        let sockets: Vec<PathBuf> = procs
            .iter()
            .flat_map(|(pid, _)| shim_sockets(*pid))
            .collect();
        for (pid, c) in &procs {
            errs.push(format!("killing leftover process {pid}: {c}"));
            // SAFETY: as above.
            unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
        }
        if !procs.is_empty() {
            let left = try_eventually(STOP, || {
                let p = self.processes();
                p.is_empty().then_some(()).ok_or(format!("{p:?}"))
            });
            if let Err(e) = left {
                errs.push(format!(
                    "processes still running: {}",
                    e.unwrap_or_default()
                ));
            }
        }
        for m in self.mounts() {
            let c = std::ffi::CString::new(m.clone()).unwrap();
            // SAFETY: a valid C string; a lazy unmount touches no memory of ours.
            let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            errs.push(format!(
                "unmounting leftover {m}: {}",
                if rc == 0 {
                    "done".to_string()
                } else {
                    std::io::Error::last_os_error().to_string()
                }
            ));
        }
        for s in sockets {
            if fs::remove_file(&s).is_ok() {
                errs.push(format!("removed leftover shim socket {}", s.display()));
            }
        }
        errs.extend(remove_cgroups(&self.cgroup_root));
        // libcni's cache entries of our sandboxes (a DEL that never ran).
        let results = Path::new(CNI_CACHE).join("results");
        for e in fs::read_dir(&results).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if self.sandboxes.iter().any(|id| n.contains(id.as_str())) {
                let _ = fs::remove_file(e.path());
                errs.push(format!("removed leftover libcni cache {n}"));
            }
        }
        if !self.cni_results_existed {
            let _ = fs::remove_dir(&results);
        }
        if !self.cni_cache_existed {
            let _ = fs::remove_dir(CNI_CACHE);
        }
        if !self.run_dir_existed {
            let _ = fs::remove_dir(SHIM_SOCKET_DIR);
            let _ = fs::remove_dir("/run/containerd");
        }
        errs
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        for e in self.stop() {
            eprintln!("containerd cleanup: {e}");
        }
        // The TempDir removes the directory itself.
    }
}

fn is_zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// The shim sockets process `pid` listens on: its socket inodes, looked
/// up in its network namespace's unix socket table.
fn shim_sockets(pid: u32) -> Vec<PathBuf> {
    let inodes: Vec<String> = fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")
                .and_then(|r| r.strip_suffix(']'))
                .map(String::from)
        })
        .collect();
    fs::read_to_string(format!("/proc/{pid}/net/unix"))
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match (f.get(6), f.get(7)) {
                (Some(ino), Some(path))
                    if inodes.iter().any(|i| i == ino) && path.starts_with(SHIM_SOCKET_DIR) =>
                {
                    Some(PathBuf::from(path))
                }
                _ => None,
            }
        })
        .collect()
}

/// `/sys/fs/cgroup/<controller>/<root>` and everything below, deepest first.
fn cgroup_dirs(root: &str) -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    let mut tops = vec![base.join(root)];
    for e in fs::read_dir(base).into_iter().flatten().flatten() {
        tops.push(e.path().join(root));
    }
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
    let mut out = Vec::new();
    for t in &tops {
        walk(t, &mut out);
    }
    out
}

/// Removes the pods' cgroups (runc removes each pod's own on delete; the
/// parents it created stay).
fn remove_cgroups(root: &str) -> Vec<String> {
    let mut errs = Vec::new();
    for d in cgroup_dirs(root) {
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
