//! The verdict log: every denied new connection, explained.
//!
//! The table's deny chains send each denied first packet to NFLOG group
//! [`crate::plan::LOG_GROUP`] (rate-limited in the kernel; what the limit
//! holds back is counted in the table's `log-suppressed` counter). This
//! reader decodes the packet's flow and asks the evaluator why: the line
//! names the source and destination pods, the port and protocol, the
//! policies that isolate the denying end and what each rule lacked. Counts
//! go to `podnet_policy_denied_total` per direction and per isolating
//! policy; lines lost on the socket to `podnet_policy_log_lost_total`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use podnet_daemon::Metrics;
use podnet_kernel::nflog::{parse_flow, Listener};
use podnet_nft::model::Proto;

use crate::eval::{evaluate, Flow};
use crate::plan::{LOG_GROUP, PREFIX_EGRESS, PREFIX_INGRESS};
use crate::world::World;

const GUARD_DROPPED_TOTAL: podnet_daemon::Gauge = podnet_daemon::Gauge::new(
    "podnet_guard_dropped_total",
    "Frames from pods' ports the anti-spoofing guard dropped (not their own MAC or addresses).",
);
const POLICY_DENIED_BY_POLICY_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_policy_denied_by_policy_total",
    "Logged denials per isolating policy.",
);
const POLICY_DENIED_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_policy_denied_total",
    "New connections denied (logged ones), per cause.",
);
const POLICY_KERNEL_DENIED_TOTAL: podnet_daemon::Gauge = podnet_daemon::Gauge::new(
    "podnet_policy_kernel_denied_total",
    "New connections the policy table dropped, logged or not, per cause.",
);
const POLICY_KERNEL_INVALID_TOTAL: podnet_daemon::Gauge = podnet_daemon::Gauge::new(
    "podnet_policy_kernel_invalid_total",
    "Packets conntrack found invalid, to or from isolated pods, dropped (not logged).",
);
const POLICY_LOG_LOST_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_policy_log_lost_total",
    "Denial log lines lost on the NFLOG socket.",
);
const POLICY_LOG_SUPPRESSED_TOTAL: podnet_daemon::Gauge = podnet_daemon::Gauge::new(
    "podnet_policy_log_suppressed_total",
    "Denials the kernel's log rate limit kept out of the log (counted, not explained).",
);

/// One explained denial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// "ingress", "egress" or "unknown" (an address not programmed yet).
    pub cause: &'static str,
    pub flow: Flow,
    pub src: String,
    pub dst: String,
    pub reason: String,
    /// The policies isolating the denying end.
    pub policies: Vec<String>,
}

fn name(w: &World, ip: std::net::IpAddr) -> String {
    match w.pod_at(ip) {
        Some((k, _)) => format!("{k}"),
        None => ip.to_string(),
    }
}

/// Explains one logged packet.
pub fn explain(w: &World, prefix: &str, flow: Flow) -> Denial {
    let v = evaluate(w, &flow);
    let cause = if prefix.starts_with(PREFIX_EGRESS) {
        "egress"
    } else if prefix.starts_with(PREFIX_INGRESS) {
        "ingress"
    } else {
        "unknown"
    };
    let (reason, policies) = match cause {
        "unknown" => (
            "the address is in this node's pod subnet but no pod the agent has programmed holds it (failing closed)".to_string(),
            Vec::new(),
        ),
        _ => {
            let side = if cause == "egress" { &v.egress } else { &v.ingress };
            let mut r = v.reason();
            if v.allowed() {
                r = format!("the kernel denied it but the objects now allow it (a change in flight): {r}");
            }
            (r, side.isolated_by.iter().map(|k| k.to_string()).collect())
        }
    };
    Denial {
        cause,
        flow,
        src: name(w, flow.src),
        dst: name(w, flow.dst),
        reason,
        policies,
    }
}

fn proto(n: u8) -> Option<Proto> {
    match n {
        6 => Some(Proto::Tcp),
        17 => Some(Proto::Udp),
        132 => Some(Proto::Sctp),
        _ => None,
    }
}

/// The table's own counts: every denial (logged or not) per cause, and
/// the log lines the rate limit held back.
fn kernel_counters(c: &mut podnet_nft::netlink::Conn, metrics: &Metrics) {
    use crate::plan::{
        COUNTER_EGRESS, COUNTER_INGRESS, COUNTER_INVALID, COUNTER_SUPPRESSED, COUNTER_UNKNOWN,
        TABLE,
    };
    use podnet_nft::model::Family;
    let mut sums = [0u64; 5];
    for fam in [Family::Ip, Family::Ip6] {
        for (i, name) in [
            COUNTER_INGRESS,
            COUNTER_EGRESS,
            COUNTER_UNKNOWN,
            COUNTER_SUPPRESSED,
            COUNTER_INVALID,
        ]
        .iter()
        .enumerate()
        {
            if let Ok(Some((pk, _))) = c.counter(fam, TABLE, name) {
                sums[i] += pk;
            }
        }
    }
    for (i, cause) in ["ingress", "egress", "unknown"].iter().enumerate() {
        metrics.gauge(
            &POLICY_KERNEL_DENIED_TOTAL,
            &format!("cause=\"{cause}\""),
            sums[i] as f64,
        );
    }
    if let Ok(Some((pk, _))) = c.counter(Family::Bridge, crate::guard::TABLE, crate::guard::COUNTER)
    {
        metrics.gauge(&GUARD_DROPPED_TOTAL, "", pk as f64);
    }
    metrics.gauge(&POLICY_KERNEL_INVALID_TOTAL, "", sums[4] as f64);
    metrics.gauge(&POLICY_LOG_SUPPRESSED_TOTAL, "", sums[3] as f64);
}

/// Who else hears of each denial (the node's flow log).
pub type DenialSink = Arc<dyn Fn(&Denial) + Send + Sync>;

/// Reads the log group until `stop` is set; runs on its own thread.
pub fn read(
    world: Arc<RwLock<World>>,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
    sink: Option<DenialSink>,
) {
    let mut l = match Listener::bind(LOG_GROUP) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("policy verdict log: binding NFLOG group {LOG_GROUP}: {e}");
            return;
        }
    };
    let _ = l.set_timeout(Some(Duration::from_millis(500)));
    let mut conn = podnet_nft::netlink::Conn::open().ok();
    let mut last_read = std::time::Instant::now();
    let mut lost = 0;
    while !stop.load(Ordering::Relaxed) {
        if last_read.elapsed() >= Duration::from_secs(1) {
            last_read = std::time::Instant::now();
            if let Some(c) = conn.as_mut() {
                kernel_counters(c, &metrics);
            }
        }
        let pkts = match l.recv() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("policy verdict log: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let now_lost = l.lost();
        if now_lost > lost {
            metrics.count(&POLICY_LOG_LOST_TOTAL, "", (now_lost - lost) as f64);
            lost = now_lost;
        }
        for p in pkts {
            let Some(f) = parse_flow(&p.payload) else {
                continue;
            };
            let flow = Flow {
                src: f.src,
                dst: f.dst,
                proto: proto(f.proto).unwrap_or(Proto::Tcp),
                port: f.dport,
            };
            let d = {
                let w = world.read().expect("world lock");
                explain(&w, &p.prefix, flow)
            };
            tracing::info!(
                target: "podnet::policy::deny",
                cause = d.cause,
                src = %d.src,
                dst = %d.dst,
                port = flow.port,
                proto = if proto(f.proto).is_some() { flow.proto.name() } else { "other" },
                policies = %d.policies.join(","),
                "denied: {}",
                d.reason
            );
            metrics.count(&POLICY_DENIED_TOTAL, &format!("cause=\"{}\"", d.cause), 1.0);
            if let Some(s) = &sink {
                s(&d);
            }
            for pol in &d.policies {
                metrics.count(
                    &POLICY_DENIED_BY_POLICY_TOTAL,
                    &format!("direction=\"{}\",policy=\"{pol}\"", d.cause),
                    1.0,
                );
            }
        }
    }
}
