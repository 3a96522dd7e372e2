//! `veth-cost`: where the time of creating and deleting a pod's veth pair
//! goes, measured on raw netlink calls (no plugin, no exec).
//!
//! Creation, into a fresh pod namespace (peer born there), host end on a
//! bridge and up:
//!
//! - `create-default`: RTM_NEWLINK as the bridge plugins send it, then
//!   master and up as separate calls (the queue counts left to the kernel:
//!   one per possible CPU, then cut to one real queue, which waits for an
//!   expedited RCU grace period per device);
//! - `create-1q`: the same with IFLA_NUM_TX_QUEUES/IFLA_NUM_RX_QUEUES = 1;
//! - `create-oneshot`: one queue, and IFLA_MASTER plus IFF_UP of the host
//!   end in the creating message itself (the pod end cannot be opened in it:
//!   `veth_open` fails with ENOTCONN until the pair is linked).
//!
//! Deletion: every repetition builds the state a bridge ADD leaves (host end
//! on a bridge and up, pod end born in a fresh pod namespace, up, with an
//! address), waits `--settle-ms`, then removes it one way:
//!
//! - `del-pod`: RTM_DELLINK of the pod end, from a socket in the pod namespace;
//! - `del-host`: RTM_DELLINK of the host end, from the host namespace;
//! - `down-del`: the pod end set down first, then deleted (two calls);
//! - `bare-del`: a veth pair never enslaved, up or addressed;
//! - `unlisted`: RTM_DELLINK of the pod end from a second thread, while the
//!   first listens on RTNLGRP_LINK in the host namespace: the time until
//!   the host end's RTM_DELLINK notification (both ends unlisted, bridge
//!   port gone) against the time until the ack;
//! - `move`: the pod end moved into another, new namespace (IFLA_NET_NS_FD);
//! - `netns-del`: the pod namespace removed instead (its last reference
//!   dropped): the call, then how long the host end lingers.
//!
//! ```text
//! cargo run --release -p podnet-bench --bin veth-cost -- --reps 30
//! ```

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use ipnet::IpNet;
use podnet_bench::{check_interrupted, ms, ns_name, Stats};
use podnet_kernel::nl::{self, Msg, Socket};
use podnet_kernel::{Handle, Netns};
use podnet_testkit::TestNs;

const BRIDGE: &str = "pnxbr0";
const VARIANTS: &[&str] = &[
    "create-default",
    "create-1q",
    "create-oneshot",
    "del-pod",
    "del-host",
    "down-del",
    "bare-del",
    "unlisted",
    "move",
    "netns-del",
];

#[derive(Parser)]
#[command(
    name = "veth-cost",
    about = "What deleting a veth costs the caller, variant by variant"
)]
struct Args {
    /// Repetitions per variant.
    #[arg(long, default_value_t = 30)]
    reps: usize,
    /// Pause between building the pair and removing it.
    #[arg(long, default_value_t = 20)]
    settle_ms: u64,
    /// Variants to run (default: all).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

struct Pair {
    pod: TestNs,
    host_name: String,
    host_index: u32,
    pod_index: u32,
}

fn build(host: &TestNs, tag: &str, rep: usize, wired: bool) -> Result<Pair> {
    let pod = TestNs::create(ns_name(&format!("xpod-{tag}-{rep}")))?;
    let host_name = format!("pnx{tag}-{rep}");
    let mut h = Handle::in_netns(host.netns())?;
    h.create_veth(&host_name, "eth0", Some(pod.netns().fd()), None, None)?;
    let hl = h.require_link(&host_name)?;
    let mut p = Handle::in_netns(pod.netns())?;
    let pl = p.require_link("eth0")?;
    if wired {
        let br = h.require_link(BRIDGE)?;
        h.set_master(hl.index, br.index)?;
        h.set_up(hl.index)?;
        let ip = Ipv4Addr::new(10, 251, (rep / 250) as u8, (rep % 250 + 2) as u8);
        p.add_addr(pl.index, IpNet::new(ip.into(), 16)?, true)?;
        p.set_up(pl.index)?;
    }
    Ok(Pair {
        pod,
        host_name,
        host_index: hl.index,
        pod_index: pl.index,
    })
}

fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(Duration, T)> {
    let t = Instant::now();
    let v = f()?;
    Ok((t.elapsed(), v))
}

/// A raw rtnetlink socket in `ns` subscribed to link notifications.
fn link_listener(ns: &Netns) -> Result<OwnedFd> {
    ns.run(|| -> std::io::Result<OwnedFd> {
        // SAFETY: plain socket(2); the fd is owned at once.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is fresh and ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: zeroed sockaddr_nl is valid; groups set below.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as u16;
        sa.nl_groups = 1; // RTMGRP_LINK
                          // SAFETY: valid address of the given size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sa as *const libc::sockaddr_nl as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(fd)
    })?
    .context("opening link listener")
}

/// Waits for RTM_DELLINK (family AF_UNSPEC) of `index` on a listener.
fn wait_dellink(fd: &OwnedFd, index: u32, timeout: Duration) -> Result<Instant> {
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("no RTM_DELLINK for #{index} within {timeout:?}");
        }
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, left.as_millis().max(1) as i32) };
        if rc <= 0 {
            continue;
        }
        // SAFETY: valid buffer.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                0,
            )
        };
        let now = Instant::now();
        if n < 0 {
            bail!("recv on listener: {}", std::io::Error::last_os_error());
        }
        let mut off = 0usize;
        let n = n as usize;
        while off + 32 <= n {
            let len = u32::from_ne_bytes(buf[off..off + 4].try_into()?) as usize;
            let ty = u16::from_ne_bytes(buf[off + 4..off + 6].try_into()?);
            let family = buf[off + 16];
            let idx = i32::from_ne_bytes(buf[off + 20..off + 24].try_into()?) as u32;
            if ty == 17 && family == 0 && idx == index {
                return Ok(now);
            }
            if len < 16 {
                break;
            }
            off += (len + 3) & !3;
        }
    }
}

/// Moves link `index` (in the handle's namespace) into the namespace `fd`.
fn move_link(sock: &mut Socket, index: u32, fd: i32) -> Result<()> {
    let mut m = Msg::new(16 /* RTM_NEWLINK */, nl::NLM_F_ACK);
    let mut ifi = [0u8; 16];
    ifi[4..8].copy_from_slice(&(index as i32).to_ne_bytes());
    m.raw(&ifi);
    m.u32(28 /* IFLA_NET_NS_FD */, fd as u32);
    sock.request(m, &|| format!("moving link #{index}"))?;
    Ok(())
}

fn gone_by_name(ns: &Netns, name: &str) -> Result<bool> {
    Ok(Handle::in_netns(ns)?.link(name)?.is_none())
}

fn wait_gone(ns: &Netns, name: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gone_by_name(ns, name)? {
        if Instant::now() > deadline {
            bail!("{name} still there after 5 s");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

const IFLA_IFNAME: u16 = 3;
const IFLA_MASTER: u16 = 10;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_NUM_TX_QUEUES: u16 = 31;
const IFLA_NUM_RX_QUEUES: u16 = 32;
const IFF_UP: u32 = 1;

fn ifinfo(flags: u32, change: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[8..12].copy_from_slice(&flags.to_ne_bytes());
    b[12..16].copy_from_slice(&change.to_ne_bytes());
    b
}

/// RTM_NEWLINK for a veth pair, peer born in namespace `peer_fd`.
fn veth_msg(name: &str, peer_fd: i32, one_queue: bool, master: Option<u32>, up: bool) -> Msg {
    let (flags, change) = if up { (IFF_UP, IFF_UP) } else { (0, 0) };
    let mut m = Msg::new(16, nl::NLM_F_CREATE | nl::NLM_F_EXCL | nl::NLM_F_ACK);
    m.raw(&ifinfo(flags, change));
    m.str(IFLA_IFNAME, name);
    if one_queue {
        m.u32(IFLA_NUM_TX_QUEUES, 1).u32(IFLA_NUM_RX_QUEUES, 1);
    }
    if let Some(br) = master {
        m.u32(IFLA_MASTER, br);
    }
    m.begin(IFLA_LINKINFO).str(1, "veth");
    m.begin(2).begin_plain(1);
    // The peer cannot be opened before the pair is linked (veth_open: ENOTCONN).
    m.raw(&ifinfo(0, 0));
    m.str(IFLA_IFNAME, "eth0");
    if one_queue {
        m.u32(IFLA_NUM_TX_QUEUES, 1).u32(IFLA_NUM_RX_QUEUES, 1);
    }
    m.u32(IFLA_NET_NS_FD, peer_fd as u32);
    m.end().end().end();
    m
}

/// One creation variant: the timed calls, then untimed teardown.
fn create(
    vi: usize,
    variant: &str,
    host: &TestNs,
    rep: usize,
) -> Result<Vec<(&'static str, Duration)>> {
    let pod = TestNs::create(ns_name(&format!("xpod-{vi}-{rep}")))?;
    let name = format!("pnx{vi}-{rep}");
    let mut h = Handle::in_netns(host.netns())?;
    let br = h.require_link(BRIDGE)?.index;
    let mut s = host.netns().run(|| Socket::open(libc::NETLINK_ROUTE))??;
    std::thread::sleep(SETTLE.with(|s| s.get()));
    let fd = pod.netns().fd().as_raw_fd();
    let mut out = Vec::new();
    let t0 = Instant::now();
    match variant {
        "create-default" | "create-1q" => {
            let m = veth_msg(&name, fd, variant == "create-1q", None, false);
            s.request(m, &|| "creating veth".into())?;
            out.push(("RTM_NEWLINK", t0.elapsed()));
            let hl = h.require_link(&name)?;
            h.set_master(hl.index, br)?;
            h.set_up(hl.index)?;
            let mut p = Handle::in_netns(pod.netns())?;
            p.set_up_by_name("eth0")?;
            out.push(("with lookups, master, up x2", t0.elapsed()));
        }
        "create-oneshot" => {
            s.request(veth_msg(&name, fd, true, Some(br), true), &|| {
                "creating veth".into()
            })?;
            out.push(("RTM_NEWLINK", t0.elapsed()));
            let mut p = Handle::in_netns(pod.netns())?;
            p.set_up_by_name("eth0")?;
            out.push(("with pod end up", t0.elapsed()));
        }
        v => bail!("unknown variant {v}"),
    }
    let hl = h.require_link(&name)?;
    if hl.master != Some(br) || !hl.is_up() {
        bail!("{variant}: {name} not up on the bridge");
    }
    let pl = Handle::in_netns(pod.netns())?.require_link("eth0")?;
    if !pl.is_up() {
        bail!("{variant}: pod end not up: {pl:?}");
    }
    pod.delete()?;
    wait_gone(host.netns(), &name)?;
    Ok(out)
}

/// One repetition of one variant; returns named timings.
fn one(
    vi: usize,
    variant: &str,
    host: &TestNs,
    rep: usize,
) -> Result<Vec<(&'static str, Duration)>> {
    if variant.starts_with("create-") {
        return create(vi, variant, host, rep);
    }
    let pair = build(host, &vi.to_string(), rep, variant != "bare-del")?;
    std::thread::sleep(SETTLE.with(|s| s.get()));
    let mut out = Vec::new();
    match variant {
        "del-pod" | "bare-del" => {
            let mut p = Handle::in_netns(pair.pod.netns())?;
            out.push((
                "DELLINK call",
                timed(|| Ok(p.delete_link(pair.pod_index)?))?.0,
            ));
        }
        "del-host" => {
            let mut h = Handle::in_netns(host.netns())?;
            out.push((
                "DELLINK call",
                timed(|| Ok(h.delete_link(pair.host_index)?))?.0,
            ));
        }
        "down-del" => {
            let mut p = Handle::in_netns(pair.pod.netns())?;
            out.push(("set down", timed(|| Ok(p.set_down(pair.pod_index)?))?.0));
            out.push((
                "DELLINK call",
                timed(|| Ok(p.delete_link(pair.pod_index)?))?.0,
            ));
        }
        "unlisted" => {
            let listener = link_listener(host.netns())?;
            let mut p = Handle::in_netns(pair.pod.netns())?;
            let idx = pair.pod_index;
            let t0 = Instant::now();
            let th = std::thread::spawn(move || -> Result<Instant> {
                p.delete_link(idx)?;
                Ok(Instant::now())
            });
            let seen = wait_dellink(&listener, pair.host_index, Duration::from_secs(5));
            let acked = th.join().map_err(|_| anyhow!("delete thread panicked"))??;
            out.push(("until host end unlisted", seen? - t0));
            out.push(("until ack", acked - t0));
        }
        "move" => {
            let dest = TestNs::create(ns_name(&format!("xdst-{rep}")))?;
            let mut s = pair
                .pod
                .netns()
                .run(|| Socket::open(libc::NETLINK_ROUTE))??;
            let fd = dest.netns().fd().as_raw_fd();
            out.push((
                "move call",
                timed(|| move_link(&mut s, pair.pod_index, fd))?.0,
            ));
            let t0 = Instant::now();
            dest.delete()?;
            wait_gone(host.netns(), &pair.host_name)?;
            out.push(("then netns del: host end gone", t0.elapsed()));
            return Ok(out);
        }
        "netns-del" => {
            // `delete` closes our fd first: only the bind mount keeps it alive.
            let Pair { pod, host_name, .. } = pair;
            let t0 = Instant::now();
            pod.delete()?;
            out.push(("unmount+unlink call", t0.elapsed()));
            wait_gone(host.netns(), &host_name)?;
            out.push(("until host end gone", t0.elapsed()));
            return Ok(out);
        }
        v => bail!("unknown variant {v}"),
    }
    if !gone_by_name(host.netns(), &pair.host_name)? {
        bail!("{variant}: host end {} survived", pair.host_name);
    }
    Ok(out)
}

thread_local! {
    static SETTLE: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

fn main() {
    if let Err(e) = run() {
        eprintln!("veth-cost: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args = Args::parse();
    podnet_bench::require_root()?;
    podnet_bench::catch_interrupts();
    podnet_bench::remove_stale_namespaces();
    SETTLE.with(|s| s.set(Duration::from_millis(args.settle_ms)));
    let variants: Vec<&str> = if args.only.is_empty() {
        VARIANTS.to_vec()
    } else {
        for v in &args.only {
            if !VARIANTS.contains(&v.as_str()) {
                bail!("unknown variant {v}; known: {}", VARIANTS.join(", "));
            }
        }
        VARIANTS
            .iter()
            .copied()
            .filter(|v| args.only.iter().any(|o| o == v))
            .collect()
    };
    let host = TestNs::create(ns_name("xhost"))?;
    {
        let mut h = Handle::in_netns(host.netns())?;
        h.create_bridge(BRIDGE, None, None)?;
        h.set_up_by_name(BRIDGE)?;
    }
    println!(
        "veth-cost: {} reps per variant, {} ms settle; times in ms (median / p90 / min / max)",
        args.reps, args.settle_ms
    );
    // Interleave variants rep by rep so drift in background load hits all alike.
    let mut samples: Vec<Vec<(&'static str, Vec<Duration>)>> = vec![Vec::new(); variants.len()];
    for rep in 0..args.reps {
        for (vi, v) in variants.iter().enumerate() {
            check_interrupted()?;
            let r = one(vi, v, &host, rep).with_context(|| format!("variant {v}, rep {rep}"))?;
            for (k, (name, d)) in r.into_iter().enumerate() {
                if samples[vi].len() <= k {
                    samples[vi].push((name, Vec::new()));
                }
                samples[vi][k].1.push(d);
            }
        }
    }
    for (v, rows) in variants.iter().zip(&samples) {
        println!("{v}");
        for (name, ds) in rows {
            let s = Stats::of(ds).expect("reps >= 1");
            println!(
                "  {name:<26} {:>7.2} / {:>7.2} / {:>7.2} / {:>7.2}",
                ms(s.median),
                ms(s.p90),
                ms(s.min),
                ms(s.max)
            );
        }
    }
    Ok(())
}
