//! What a real node takes from the machine, and gives back at `lab down`:
//! a mount namespace of its own, a cgroup in every v1 hierarchy, and the
//! sysctl files the kubelet reads.
//!
//! - **Mount namespace.** All nodes share this machine's filesystem, but a
//!   DaemonSet's hostPath mounts (`/run/podnet`, `/etc/cni/net.d`, ...)
//!   must be per node. Each node's containerd and kubelet run in a mount
//!   namespace where those paths are bind mounts of per-node directories
//!   ([`PER_NODE`]). The namespace is pinned by a bind mount of its nsfs
//!   file under `<lab dir>/mnt/` (a private mount, as persistent mount
//!   namespaces require), made with util-linux `unshare --mount=FILE`.
//! - **cgroups.** `/pn-<lab>-<node>` in every hierarchy (the kubelet's
//!   cgroupRoot must exist in all of them), with cpuset's cpus and mems
//!   copied from the root (a new v1 cpuset has none).
//! - **sysctls.** The kubelet sets six host-wide sysctls when they differ
//!   from what it wants (`vm.overcommit_memory=1`, `kernel.panic=10`,
//!   `kernel.panic_on_oops=1`, ...). The lab does not let it change the
//!   machine: in the node's mount namespace each of those `/proc/sys` files
//!   is covered by a read-only bind mount of a file that holds the
//!   kubelet's value, so it reads what it wants and writes nothing. The
//!   machine's values never change ([`sysctls`] reads them for tests).
//!
//! [`cleanup`] undoes all of it from what is on disk, so it also works
//! after a crash: processes in the cgroups, the pins, the cgroups, the
//! per-node data and (with the last such lab) the host directories the lab
//! had to create as bind targets.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::{io, msg, LabError};

/// Host paths a node's pods (DaemonSet hostPath volumes), containerd and
/// kubelet use, and the per-node directory (under the node's data dir)
/// bound over each in the node's mount namespace.
pub const PER_NODE: [(&str, &str); 9] = [
    ("/run/podnet", "run-podnet"),
    ("/etc/cni/net.d", "cni-net.d"),
    ("/opt/cni/bin", "cni-bin"),
    ("/var/lib/cni", "cni-data"),
    ("/run/netns", "netns"),
    ("/run/containerd", "run-containerd"),
    ("/var/lib/kubelet", "kubelet"),
    ("/var/log/pods", "log-pods"),
    ("/var/log/containers", "log-containers"),
];

/// The sysctls the kubelet insists on (its `setupKernelTunables`), with
/// the values it wants.
pub const KUBELET_SYSCTLS: [(&str, &str); 6] = [
    ("vm.overcommit_memory", "1"),
    ("vm.panic_on_oom", "0"),
    ("kernel.panic", "10"),
    ("kernel.panic_on_oops", "1"),
    ("kernel.keys.root_maxkeys", "1000000"),
    ("kernel.keys.root_maxbytes", "25000000"),
];

const CGROUP_FS: &str = "/sys/fs/cgroup";
/// Where the lab records host directories it created as bind targets.
const CREATED: &str = "created-host-dirs";

fn proc_sys(key: &str) -> PathBuf {
    Path::new("/proc/sys").join(key.replace('.', "/"))
}

/// The machine's current values of [`KUBELET_SYSCTLS`].
pub fn sysctls() -> Vec<(String, String)> {
    KUBELET_SYSCTLS
        .iter()
        .map(|(k, _)| {
            let v = std::fs::read_to_string(proc_sys(k)).unwrap_or_default();
            (k.to_string(), v.trim().to_string())
        })
        .collect()
}

fn run(what: &str, cmd: &mut Command) -> Result<(), LabError> {
    let out = cmd.output().map_err(|e| io(what.to_string(), e))?;
    if !out.status.success() {
        return Err(msg(format!(
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Bind targets missing on this machine are created, and recorded (one
/// record for all labs), so the last real-node lab's `lab down` removes
/// them again.
pub fn ensure_bind_targets() -> Result<(), LabError> {
    let mut made = Vec::new();
    for (target, _) in PER_NODE {
        let mut missing = Vec::new();
        let mut p = Path::new(target);
        while !p.exists() {
            missing.push(p.to_path_buf());
            p = p.parent().unwrap_or(Path::new("/"));
        }
        if missing.is_empty() {
            continue;
        }
        std::fs::create_dir_all(target).map_err(|e| io(format!("creating {target}"), e))?;
        made.extend(missing);
    }
    if !made.is_empty() {
        let text: String = made.iter().map(|p| format!("{}\n", p.display())).collect();
        let path = Path::new(crate::RUN_DIR).join(CREATED);
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        std::fs::write(&path, old + &text).map_err(|e| io("recording created dirs", e))?;
    }
    Ok(())
}

/// The directory holding the lab's mount-namespace pins: a private bind
/// mount of itself (persistent mount namespaces cannot be pinned on a
/// shared mount).
fn pin_dir(lab_dir: &Path) -> PathBuf {
    lab_dir.join("mnt")
}

/// Makes node `node`'s mount namespace, pinned at the returned path, with
/// [`PER_NODE`] bound to directories under `data` and the kubelet's sysctl
/// files covered by `sysctl_dir`'s.
pub fn mount_namespace(
    lab_dir: &Path,
    node: &str,
    data: &Path,
    sysctl_dir: &Path,
) -> Result<PathBuf, LabError> {
    let dir = pin_dir(lab_dir);
    if !dir.exists() {
        std::fs::create_dir_all(&dir).map_err(|e| io("creating the pin dir", e))?;
        let d = dir.display().to_string();
        run(
            "binding the pin dir",
            Command::new("mount").args(["--bind", &d, &d]),
        )?;
        run(
            "making the pin dir private",
            Command::new("mount").args(["--make-private", &d]),
        )?;
    }
    let pin = dir.join(node);
    std::fs::write(&pin, b"").map_err(|e| io("creating the pin file", e))?;
    let mut script = String::from("set -e\n");
    // The other nodes' pins are not this namespace's business: holding
    // them would keep those namespaces alive.
    script += &format!("umount -l {}\n", sh(&dir));
    for (target, sub) in PER_NODE {
        let src = data.join(sub);
        std::fs::create_dir_all(&src).map_err(|e| io(format!("creating {}", src.display()), e))?;
        script += &format!("mount --bind {} {}\n", sh(&src), target);
    }
    std::fs::create_dir_all(sysctl_dir).map_err(|e| io("creating the sysctl dir", e))?;
    for (key, value) in KUBELET_SYSCTLS {
        let f = sysctl_dir.join(key);
        std::fs::write(&f, format!("{value}\n")).map_err(|e| io("writing a sysctl file", e))?;
        let target = proc_sys(key);
        script += &format!(
            "mount --bind {f} {t}\nmount -o remount,bind,ro {t}\n",
            f = sh(&f),
            t = sh(&target)
        );
    }
    run(
        &format!("making {node}'s mount namespace"),
        Command::new("unshare")
            .arg(format!("--mount={}", pin.display()))
            .args(["--propagation", "private", "sh", "-c", &script]),
    )?;
    Ok(pin)
}

fn sh(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// The v1 hierarchies (and the v2 one beside them) under /sys/fs/cgroup.
fn hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir(CGROUP_FS)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists())
        .collect()
}

/// Creates `/<name>` in every hierarchy.
pub fn create_cgroup(name: &str) -> Result<(), LabError> {
    let name = name.trim_start_matches('/');
    if name.is_empty() || name.contains("..") {
        return Err(msg(format!("cgroup {name:?}: not a cgroup name")));
    }
    for h in hierarchies() {
        let d = h.join(name);
        std::fs::create_dir_all(&d).map_err(|e| io(format!("creating {}", d.display()), e))?;
        if h.ends_with("cpuset") {
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let v = std::fs::read_to_string(h.join(f)).unwrap_or_default();
                std::fs::write(d.join(f), v.trim())
                    .map_err(|e| io(format!("writing {}", d.join(f).display()), e))?;
            }
        }
    }
    Ok(())
}

/// Cgroup directories named `prefix*` at the top of any hierarchy, and all
/// below them, deepest first.
fn cgroup_dirs(prefix: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&e.path(), out);
            }
        }
        out.push(d.to_path_buf());
    }
    for h in hierarchies() {
        for e in std::fs::read_dir(&h).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(prefix)
                && e.file_type().is_ok_and(|t| t.is_dir())
            {
                walk(&e.path(), &mut out);
            }
        }
    }
    out
}

fn cgroup_pids(dirs: &[PathBuf]) -> Vec<i32> {
    let mut pids: Vec<i32> = dirs
        .iter()
        .flat_map(|d| {
            std::fs::read_to_string(d.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Undoes everything [`mount_namespace`], [`create_cgroup`] and
/// [`ensure_bind_targets`] did for lab `lab` (cgroups `/pn-<lab>-*`), and
/// removes `data_dir`; returns what it did. Processes that mention the lab
/// dir (containerd, kubelets, shims) must be gone already.
pub fn cleanup(lab: &str, lab_dir: &Path, data_dir: &Path) -> Vec<String> {
    let mut done = Vec::new();
    let prefix = format!("pn-{lab}-");
    // The pods' processes live only in the nodes' cgroups.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = cgroup_pids(&cgroup_dirs(&prefix));
        if pids.is_empty() || Instant::now() > deadline {
            break;
        }
        for pid in pids {
            // SAFETY: kill(2) only.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            done.push(format!("killed pod process {pid}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let pins = pin_dir(lab_dir);
    for e in std::fs::read_dir(&pins).into_iter().flatten().flatten() {
        if umount(&e.path()) {
            done.push(format!("unmounted {}", e.path().display()));
        }
    }
    if umount(&pins) {
        done.push(format!("unmounted {}", pins.display()));
    }
    for d in cgroup_dirs(&prefix) {
        // A cgroup empties a moment after its last process exits.
        let deadline = Instant::now() + Duration::from_secs(5);
        while d.exists() && std::fs::remove_dir(&d).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if d.exists() {
            done.push(format!("could not remove cgroup {}", d.display()));
        }
    }
    if data_dir.exists() {
        match std::fs::remove_dir_all(data_dir) {
            Ok(()) => done.push(format!("removed {}", data_dir.display())),
            Err(e) => done.push(format!("could not remove {}: {e}", data_dir.display())),
        }
        // The root of every lab's data, once no lab has any.
        if let Some(root) = data_dir.parent() {
            let _ = std::fs::remove_dir(root);
        }
    }
    let created = Path::new(crate::RUN_DIR).join(CREATED);
    // Another lab's nodes may have them as bind targets: removing one
    // would detach their mounts. The last lab down removes them.
    let others = std::fs::read_dir(crate::RUN_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.path() != lab_dir && pin_dir(&e.path()).exists());
    if let Some(text) = (!others)
        .then(|| std::fs::read_to_string(&created).ok())
        .flatten()
    {
        // Deepest first; only if empty (another lab may still use it).
        let mut dirs: Vec<&str> = text.lines().collect();
        dirs.sort_by_key(|d| std::cmp::Reverse(d.len()));
        for d in dirs {
            if std::fs::remove_dir(d).is_ok() {
                done.push(format!("removed {d}"));
            }
        }
        let _ = std::fs::remove_file(created);
    }
    done
}

fn umount(p: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: a valid C string; a lazy unmount touches no memory of ours.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) == 0 }
}
