//! How soon a joining node's pod CIDR is routed by every other node, over
//! BGP (a full iBGP mesh, and node1 as route reflector) and, as the
//! baseline, over vxlan (the lease itself carries the route), in one run.
//!
//! Three standalone labs of 3 nodes stand side by side. In each round every
//! lab, in an order that rotates from round to round, gets one node added
//! (`Lab::add_node`, as `podnet lab add-node`) and removed again
//! (`Lab::remove_node`) twice: first as a node the cluster has never seen
//! (no Node object), then as the same node coming back (its Node object
//! kept, as after a reboot); then its Node object is deleted (`podnet
//! delete node`), so the next round's node is new again.
//!
//! A join is timed from the grant of the new node's subnet lease (the
//! store records each lease's deadline, grant time plus TTL, by the
//! granting agent's clock; the agent creates the `/podnet/subnets/` key
//! right after) until the route to that subnet is in the main table of
//! each of the other nodes, by the wall clock of a netlink route monitor
//! in each node's namespace ([`podnet_bench::rtmon`]). A watch on the
//! store finds the lease; its own delay (SQLite is polled every 2 ms) is
//! printed beside each join and is not part of the figure. A leave is
//! timed from `remove_node`'s start (the agent is stopped, then `agent
//! --cleanup` deletes the lease) until the route is gone everywhere.
//!
//! The reflector is node1, labelled `podnet.io/route-reflector=true` the
//! way a user would (`podnet get node -o json`, the label added, `podnet
//! apply`; there is no `podnet label`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Parser;
use ipnet::Ipv4Net;
use podnet_bench::rtmon::{self, Change, Monitor, Stamped};
use podnet_bench::{lab_options, ms, podnet_apply, podnet_get, up_lab, LabGuard, Stats};
use podnet_kernel::{Handle, Netns};
use podnet_source::subnets::leases;
use podnet_store::{AnyStore, EventType, Store, WatchMsg};

#[derive(Parser)]
struct Args {
    /// The podnet binary (default: next to this one).
    #[arg(long)]
    podnet: Option<PathBuf>,
    /// Rounds; each joins and removes one node per contender.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Nodes each lab starts with (the ones that must learn the route).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
}

const REFLECTOR_LABEL: &str = "podnet.io/route-reflector";
/// How long a join or a leave may take before it counts as failed.
const PATIENCE: Duration = Duration::from_secs(30);
/// How long a leave may take before it is reported as not withdrawn.
const LEAVE_PATIENCE: Duration = Duration::from_secs(10);

/// One lab under test, with a route monitor on each of its first nodes.
struct Contender {
    label: &'static str,
    // Fields drop in order: the monitors stop before the lab goes.
    _monitors: Vec<Monitor>,
    routes: Receiver<Stamped>,
    netns: Vec<String>,
    store: AnyStore,
    /// The store's SQLite file, for the leases' grant times.
    db: PathBuf,
    lab: LabGuard,
}

/// A lease change: when (wall clock) the watch saw it, which kind, which lease.
type LeaseEvent = (SystemTime, EventType, leases::SubnetLease);

fn up_contender(
    rt: &tokio::runtime::Runtime,
    exe: &Path,
    name: &str,
    label: &'static str,
    backend: &str,
    nodes: usize,
) -> Result<Contender> {
    eprintln!("bgp-converge: {label}: lab {name} up ...");
    let lab = up_lab(rt, exe, name, &lab_options(nodes, backend, false))?;
    let st = lab.0.state()?;
    let store = rt.block_on(podnet_store::open(&st.store))?;
    let Some(db) = st.store.strip_prefix("sqlite://") else {
        bail!("{label}: the lab's store {} is not SQLite", st.store);
    };
    let db = PathBuf::from(db);
    let (tx, routes) = channel();
    let mut monitors = Vec::new();
    let mut netns = Vec::new();
    for (i, n) in st.nodes.iter().enumerate() {
        monitors.push(rtmon::spawn(&n.netns, rtmon::ROUTES, i, tx.clone())?);
        netns.push(n.netns.clone());
    }
    Ok(Contender {
        label,
        lab,
        store,
        netns,
        routes,
        db,
        _monitors: monitors,
    })
}

/// Labels Node `node` as a route reflector the way a user would (there
/// is no `podnet label`): the object from `podnet get`, the label added,
/// back through `podnet apply`.
fn label_reflector(exe: &Path, store: &str, node: &str) -> Result<()> {
    let mut v = podnet_get(exe, store, "node", node)?;
    if !v["metadata"]["labels"].is_object() {
        v["metadata"]["labels"] = serde_json::json!({});
    }
    v["metadata"]["labels"][REFLECTOR_LABEL] = "true".into();
    podnet_apply(exe, store, &v.to_string())
}

/// How many routes podnet installed (protocol 112) in namespace `ns`.
fn podnet_routes(ns: &str) -> Result<usize> {
    Netns::named(ns)?.run(|| -> Result<usize> {
        let mut h = Handle::new()?;
        Ok(h.routes(false, None)?
            .into_iter()
            .filter(|r| r.protocol == Some(112))
            .count())
    })?
}

/// Waits until every node routes to every other one and no route has
/// changed for a second (after a topology change, sessions settle).
fn wait_settled(c: &Contender) -> Result<()> {
    let deadline = Instant::now() + PATIENCE;
    let mut last_change = Instant::now();
    loop {
        while c.routes.try_recv().is_ok() {
            last_change = Instant::now();
        }
        let want = c.netns.len() - 1;
        let mut complete = true;
        for ns in &c.netns {
            complete &= podnet_routes(ns)? >= want;
        }
        if complete && last_change.elapsed() > Duration::from_secs(1) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{}: routes not settled after waiting; see {}/logs",
                c.label,
                c.lab.0.dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Watches the lab's leases from now on; the task ends when aborted.
fn watch_leases(
    rt: &tokio::runtime::Runtime,
    store: &AnyStore,
) -> Result<(Receiver<LeaseEvent>, tokio::task::JoinHandle<()>)> {
    let rev = rt.block_on(store.revision())?;
    let mut watch = rt.block_on(store.watch(leases::PREFIX, rev + 1))?;
    let (tx, rx) = channel();
    let task = rt.spawn(async move {
        while let Some(Ok(WatchMsg::Events(_, events))) = watch.next().await {
            let at = SystemTime::now();
            for e in events {
                if let Some(l) = leases::decode(&e.kv) {
                    if tx.send((at, e.typ, l)).is_err() {
                        return;
                    }
                }
            }
        }
    });
    Ok((rx, task))
}

/// When lease `id` was granted, by the wall clock of the agent that asked
/// for it: the store keeps its deadline (`expires`, the grant time plus the
/// TTL, until the first renewal a third of the TTL later). The agent
/// creates the subnet key right after the grant, so this is the lease's
/// start, before the key is visible to anyone. `seen` (when the watch
/// delivered the key) bounds it.
fn granted(db: &Path, id: i64, seen: SystemTime) -> Result<SystemTime> {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .with_context(|| format!("opening {}", db.display()))?;
    let (ttl, expires): (i64, f64) = c
        .query_row("SELECT ttl, expires FROM leases WHERE id = ?1", [id], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .with_context(|| format!("lease {id:x} in {}", db.display()))?;
    let t = UNIX_EPOCH + Duration::from_secs_f64((expires - ttl as f64).max(0.0));
    if t > seen {
        bail!("lease {id:x}: granted after the watch saw it (renewed already?)");
    }
    Ok(t)
}

/// The first lease event of kind `typ` for node `node`: when, which subnet.
fn wait_lease(
    rx: &Receiver<LeaseEvent>,
    node: &str,
    typ: EventType,
    deadline: Instant,
) -> Result<(SystemTime, leases::SubnetLease)> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((at, t, l)) if t == typ && l.attrs.node == node => return Ok((at, l)),
            Ok(_) => {}
            Err(_) => bail!("no {typ:?} of {node}'s lease seen in the store"),
        }
    }
}

/// When (wall clock) each monitored node saw the route to `subnet` appear
/// (`added`) or go; None for a node that did not before the deadline.
fn wait_routes(
    c: &Contender,
    subnet: Ipv4Net,
    added: bool,
    deadline: Instant,
) -> Vec<Option<SystemTime>> {
    let mut seen: Vec<Option<SystemTime>> = vec![None; c.netns.len()];
    while seen.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        match c.routes.recv_timeout(left) {
            Ok(Stamped {
                wall,
                tag,
                change: Change::Route { dst, added: a, .. },
                ..
            }) if dst == subnet && a == added && seen[tag].is_none() => seen[tag] = Some(wall),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    seen
}

fn since(t: SystemTime, t0: SystemTime) -> Duration {
    t.duration_since(t0).unwrap_or_default()
}

/// Time from `t0` to the last of `seen`, and each node's own, in ms.
fn spread(t0: SystemTime, seen: &[Option<SystemTime>]) -> (Option<Duration>, String) {
    let each: Vec<String> = seen
        .iter()
        .enumerate()
        .map(|(i, s)| match s {
            Some(t) => format!("node{} {:.1}", i + 1, ms(since(*t, t0))),
            None => format!("node{} never", i + 1),
        })
        .collect();
    let last = seen
        .iter()
        .copied()
        .collect::<Option<Vec<_>>>()
        .and_then(|v| v.into_iter().max())
        .map(|t| since(t, t0));
    (last, each.join(", "))
}

/// One join and one leave; (join, leave) with None for a leave whose
/// route was not withdrawn everywhere within [`LEAVE_PATIENCE`]. Returns
/// the node's name too.
fn join_and_leave(
    rt: &tokio::runtime::Runtime,
    c: &Contender,
    kind: &str,
) -> Result<(String, Duration, Option<Duration>)> {
    while c.routes.try_recv().is_ok() {}
    let (leases_rx, task) = watch_leases(rt, &c.store)?;
    let _abort = AbortOnDrop(task);
    let node = c.lab.0.add_node()?;
    let (seen_at, lease) = wait_lease(
        &leases_rx,
        &node.name,
        EventType::Put,
        Instant::now() + PATIENCE,
    )?;
    let subnet = lease.subnet;
    let t0 = granted(&c.db, lease.lease_id, seen_at)?;
    let seen = wait_routes(c, subnet, true, Instant::now() + PATIENCE);
    let (join, each) = spread(t0, &seen);
    let Some(join) = join else {
        bail!(
            "{}: {} ({subnet}) not routed everywhere: {each}; see {}/logs",
            c.label,
            node.name,
            c.lab.0.dir.display()
        );
    };
    eprintln!(
        "bgp-converge:   {} {kind} {} {subnet}: {:.1} ms ({each}; the watch saw the lease {:.1} ms after its grant)",
        c.label, node.name, ms(join), ms(since(seen_at, t0))
    );
    // A leave starts when the node's agent is stopped (a BGP speaker's
    // sessions close then, before `--cleanup` deletes the lease).
    let t1 = SystemTime::now();
    c.lab.0.remove_node(&node.name)?;
    wait_lease(
        &leases_rx,
        &node.name,
        EventType::Delete,
        Instant::now() + PATIENCE,
    )?;
    let seen = wait_routes(c, subnet, false, Instant::now() + LEAVE_PATIENCE);
    let (leave, each) = spread(t1, &seen);
    match leave {
        Some(l) => eprintln!(
            "bgp-converge:   {} leave {}: {:.1} ms ({each})",
            c.label,
            node.name,
            ms(l)
        ),
        None => eprintln!(
            "bgp-converge:   {} leave {}: route NOT withdrawn everywhere within {:?} ({each})",
            c.label, node.name, LEAVE_PATIENCE
        ),
    }
    Ok((node.name, join, leave))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The joins of one contender and one kind, and the leaves after them.
#[derive(Default)]
struct Series {
    joins: Vec<Duration>,
    leaves: Vec<Option<Duration>>,
}

/// The two kinds of join: a node the cluster has not seen (no Node object
/// yet), and the same node coming back (its Node object kept, as after a
/// reboot).
const KINDS: [&str; 2] = ["new node", "rejoin"];

/// Rounds of joins, the contenders taking turns (the first one rotates).
/// Each turn: a new node joins and leaves, joins again as itself and
/// leaves, and its Node object is deleted (`podnet delete node`).
fn run_rounds(
    a: &Args,
    rt: &tokio::runtime::Runtime,
    cs: &[Contender],
) -> Result<Vec<[Series; 2]>> {
    let mut out: Vec<[Series; 2]> = cs.iter().map(|_| Default::default()).collect();
    for r in 0..a.rounds {
        eprintln!("bgp-converge: round {}/{}", r + 1, a.rounds);
        for k in 0..cs.len() {
            podnet_bench::check_interrupted()?;
            let i = (r + k) % cs.len();
            let mut name = String::new();
            for (kind, series) in KINDS.iter().zip(out[i].iter_mut()) {
                wait_settled(&cs[i])?;
                let (n, j, l) = join_and_leave(rt, &cs[i], kind)?;
                series.joins.push(j);
                series.leaves.push(l);
                name = n;
            }
            delete_node(&cs[i], &name)?;
        }
    }
    Ok(out)
}

/// `podnet delete node NAME`, as an admin does for a node that is gone.
fn delete_node(c: &Contender, name: &str) -> Result<()> {
    let store = c.lab.0.state()?.store;
    let out = std::process::Command::new(&c.lab.0.exe)
        .args(["--store", &store, "delete", "node", name])
        .output()?;
    if !out.status.success() {
        bail!(
            "podnet delete node {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn report(a: &Args, cs: &[Contender], res: &[[Series; 2]]) {
    println!(
        "\nnode join: lease in the store -> route on each of the {} other nodes; leave: remove-node (agent stopped, then --cleanup) -> route gone everywhere",
        a.nodes
    );
    println!("{} rounds, contenders alternating; ms\n", a.rounds);
    println!(
        "{:<26} {:>5} {:>8} {:>8} {:>8}   {:>9} {:>9} {:>6}",
        "", "joins", "p50", "p99", "max", "leave p50", "leave p99", "missed"
    );
    let f = |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.1}", ms(d)));
    let mut p = BTreeMap::new();
    for (c, kinds) in cs.iter().zip(res) {
        for (kind, x) in KINDS.iter().zip(kinds) {
            let Some(s) = Stats::of(&x.joins) else {
                continue;
            };
            let done: Vec<Duration> = x.leaves.iter().flatten().copied().collect();
            let l = Stats::of(&done);
            println!(
                "{:<26} {:>5} {:>8.1} {:>8.1} {:>8.1}   {:>9} {:>9} {:>6}",
                format!("{} ({kind})", c.label),
                s.n,
                ms(s.median),
                ms(s.p99),
                ms(s.max),
                f(l.map(|l| l.median)),
                f(l.map(|l| l.p99)),
                x.leaves.len() - done.len()
            );
            p.insert((c.label, *kind), s);
        }
    }
    println!();
    for ((label, kind), s) in p.iter().filter(|((l, _), _)| *l != "vxlan") {
        let Some(v) = p.get(&("vxlan", *kind)) else {
            continue;
        };
        println!(
            "{:<26} p50 {:>7.1}x  p99 {:>7.1}x   target p99 <= 100 ms: {}",
            format!("{label}/vxlan ({kind})"),
            ms(s.median) / ms(v.median),
            ms(s.p99) / ms(v.p99),
            if s.p99 <= Duration::from_millis(100) {
                "met"
            } else {
                "NOT met"
            }
        );
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    podnet_bench::require_root()?;
    podnet_bench::catch_interrupts();
    if a.rounds == 0 || a.nodes < 2 {
        bail!("--rounds must be at least 1 and --nodes at least 2");
    }
    let exe = podnet_bench::locate_podnet(a.podnet.as_deref())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let id = std::process::id() % 10000;
    let mut cs = Vec::new();
    for (tag, label, backend) in [
        ("m", "bgp mesh", "bgp"),
        ("r", "bgp reflector", "bgp"),
        ("v", "vxlan", "vxlan"),
    ] {
        cs.push(up_contender(
            &rt,
            &exe,
            &format!("bc{tag}{id}"),
            label,
            backend,
            a.nodes,
        )?);
    }
    let st = cs[1].lab.0.state()?;
    label_reflector(&exe, &st.store, &st.nodes[0].name)?;
    let res = run_rounds(&a, &rt, &cs)?;
    println!("podnet {}", exe.display());
    report(&a, &cs, &res);
    Ok(())
}
