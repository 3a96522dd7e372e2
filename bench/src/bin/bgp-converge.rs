//! How soon a joining node's pod CIDR is routed by every other node, over
//! BGP (a full iBGP mesh, and node1 as route reflector) and, as the
//! baseline, over vxlan (the lease itself carries the route), in one run.
//!
//! Three standalone labs of 3 nodes stand side by side. In each round every
//! lab, in an order that rotates from round to round, takes a turn
//! ([`run_turn`]): a node the cluster has never seen joins (`Lab::add_node`,
//! as `podnet lab add-node`); it is removed (`Lab::remove_node`) with its
//! Node object kept, as a rebooting node, and joins again as itself; then
//! it is decommissioned (removed, and its Node object deleted with `podnet
//! delete node`), so the next turn's node is new again.
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
//! --cleanup` deletes the lease) until the route is gone everywhere; a
//! bgp peer keeps a stopped agent's routes (graceful restart), which the
//! report counts as kept, and a rejoin whose route never left is not
//! timed.
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

/// Whether every monitored node has a route to `subnet` now.
fn routed_everywhere(c: &Contender, subnet: Ipv4Net) -> Result<bool> {
    for ns in &c.netns {
        let has = Netns::named(ns)?.run(|| -> Result<bool> {
            let mut h = Handle::new()?;
            Ok(h.routes(false, None)?
                .iter()
                .any(|r| r.dst == Some(ipnet::IpNet::V4(subnet))))
        })??;
        if !has {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A join's outcome.
#[derive(Debug, Clone, Copy)]
enum Join {
    /// Lease grant -> route on every other node.
    Timed(Duration),
    /// The route never left (kept from before the node went): nothing to
    /// time.
    Kept,
}

/// Adds a node and times its join. `kept` is the subnet the node had
/// before, if the other nodes still route it.
fn join(
    c: &Contender,
    leases: &Receiver<LeaseEvent>,
    kind: &str,
    kept: Option<Ipv4Net>,
) -> Result<(String, Ipv4Net, Join)> {
    while c.routes.try_recv().is_ok() {}
    let node = c.lab.0.add_node()?;
    let (seen_at, lease) = wait_lease(
        leases,
        &node.name,
        EventType::Put,
        Instant::now() + PATIENCE,
    )?;
    let subnet = lease.subnet;
    if kept == Some(subnet) {
        eprintln!(
            "bgp-converge:   {} {kind} {} {subnet}: the route never left",
            c.label, node.name
        );
        return Ok((node.name, subnet, Join::Kept));
    }
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
    Ok((node.name, subnet, Join::Timed(join)))
}

/// Removes a node (`remove_node`: its agent stopped, then `agent
/// --cleanup`, which deletes the lease) and, with `decommission`, its
/// Node object (`podnet delete node`); the time from the start until the
/// route is gone everywhere, None if it is still there after `patience`.
fn leave(
    c: &Contender,
    leases: &Receiver<LeaseEvent>,
    node: &str,
    subnet: Ipv4Net,
    decommission: bool,
    patience: Duration,
) -> Result<Option<Duration>> {
    while c.routes.try_recv().is_ok() {}
    let t1 = SystemTime::now();
    c.lab.0.remove_node(node)?;
    wait_lease(leases, node, EventType::Delete, Instant::now() + PATIENCE)?;
    if decommission {
        delete_node(c, node)?;
    }
    let seen = wait_routes(c, subnet, false, Instant::now() + patience);
    let (gone, each) = spread(t1, &seen);
    let what = if decommission {
        "decommission"
    } else {
        "remove-node"
    };
    match gone {
        Some(l) => eprintln!(
            "bgp-converge:   {} {what} {node}: {:.1} ms ({each})",
            c.label,
            ms(l)
        ),
        None => eprintln!(
            "bgp-converge:   {} {what} {node}: route kept ({each}, after {patience:?})",
            c.label
        ),
    }
    Ok(gone)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How long a remove-node's route may take to go before it counts as kept
/// (a bgp peer keeps a stopped agent's routes for its graceful restart).
const KEPT_AFTER: Duration = Duration::from_secs(2);

/// One contender's turn: a new node joins; it is removed (`remove-node`,
/// its Node object kept, as a rebooting node) and joins again as itself
/// (rejoin); then it is decommissioned (removed, and its Node object
/// deleted), so the next turn's node is new again.
#[derive(Debug, Clone, Copy)]
struct Turn {
    new_node: Duration,
    removed: Option<Duration>,
    rejoin: Join,
    decommissioned: Duration,
}

fn run_turn(rt: &tokio::runtime::Runtime, c: &Contender) -> Result<Turn> {
    wait_settled(c)?;
    let (leases, task) = watch_leases(rt, &c.store)?;
    let _abort = AbortOnDrop(task);
    let (node, subnet, new_node) = join(c, &leases, "new node", None)?;
    let Join::Timed(new_node) = new_node else {
        bail!(
            "{}: a new node's subnet {subnet} was routed before it joined",
            c.label
        );
    };
    let removed = leave(c, &leases, &node, subnet, false, KEPT_AFTER)?;
    let kept = routed_everywhere(c, subnet)?.then_some(subnet);
    let (node, subnet, rejoin) = join(c, &leases, "rejoin", kept)?;
    let Some(decommissioned) = leave(c, &leases, &node, subnet, true, LEAVE_PATIENCE)? else {
        bail!("{}: {node}'s subnet {subnet} still routed {LEAVE_PATIENCE:?} after its Node was deleted; see {}/logs", c.label, c.lab.0.dir.display());
    };
    Ok(Turn {
        new_node,
        removed,
        rejoin,
        decommissioned,
    })
}

/// Rounds of turns, the contenders taking turns (the first one rotates).
fn run_rounds(a: &Args, rt: &tokio::runtime::Runtime, cs: &[Contender]) -> Result<Vec<Vec<Turn>>> {
    let mut out: Vec<Vec<Turn>> = cs.iter().map(|_| Vec::new()).collect();
    for r in 0..a.rounds {
        eprintln!("bgp-converge: round {}/{}", r + 1, a.rounds);
        for k in 0..cs.len() {
            podnet_bench::check_interrupted()?;
            let i = (r + k) % cs.len();
            out[i].push(run_turn(rt, &cs[i])?);
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

/// "p50 X  p99 Y" of the timed ones, and how many were not timed.
fn line(v: &[Option<Duration>], untimed: &str) -> String {
    let timed: Vec<Duration> = v.iter().flatten().copied().collect();
    let mut out = match Stats::of(&timed) {
        Some(s) => format!(
            "p50 {:>7.1}  p99 {:>7.1}  (n={})",
            ms(s.median),
            ms(s.p99),
            s.n
        ),
        None => String::new(),
    };
    if timed.len() < v.len() {
        out += &format!("  {untimed}: {} of {}", v.len() - timed.len(), v.len());
    }
    out
}

fn report(a: &Args, cs: &[Contender], res: &[Vec<Turn>]) {
    println!(
        "\n{} rounds, contenders alternating; ms; with fewer than 100 samples p99 is the maximum",
        a.rounds
    );
    println!("join: lease granted -> route on each of the {} other nodes; remove-node / decommission (remove-node, then podnet delete node): start -> route gone everywhere\n", a.nodes);
    let mut p99 = BTreeMap::new();
    for (c, v) in cs.iter().zip(res) {
        let new: Vec<Option<Duration>> = v.iter().map(|t| Some(t.new_node)).collect();
        let rejoin: Vec<Option<Duration>> = v
            .iter()
            .map(|t| match t.rejoin {
                Join::Timed(d) => Some(d),
                Join::Kept => None,
            })
            .collect();
        let removed: Vec<Option<Duration>> = v.iter().map(|t| t.removed).collect();
        let gone: Vec<Option<Duration>> = v.iter().map(|t| Some(t.decommissioned)).collect();
        println!("{:<14} {:<13} {}", c.label, "new node", line(&new, ""));
        println!(
            "{:<14} {:<13} {}",
            "",
            "remove-node",
            line(&removed, &format!("route kept after {KEPT_AFTER:?}"))
        );
        println!(
            "{:<14} {:<13} {}",
            "",
            "rejoin",
            line(&rejoin, "route never left")
        );
        println!("{:<14} {:<13} {}", "", "decommission", line(&gone, ""));
        let joins: Vec<Duration> = v.iter().map(|t| t.new_node).collect();
        if let Some(s) = Stats::of(&joins) {
            p99.insert(c.label, s);
        }
    }
    println!();
    let Some(v) = p99.get("vxlan") else { return };
    for (label, s) in p99.iter().filter(|(l, _)| **l != "vxlan") {
        println!(
            "{:<22} new node p50 {:>6.1}x  p99 {:>6.1}x   target p99 <= 100 ms: {}",
            format!("{label}/vxlan"),
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
    if a.rounds == 0 || a.nodes < 2 {
        bail!("--rounds must be at least 1 and --nodes at least 2");
    }
    let (exe, rt) = podnet_bench::lab_bench_start(a.podnet.as_deref())?;
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
