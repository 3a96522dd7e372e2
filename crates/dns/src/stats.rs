//! Query statistics without locks on the hot path.
//!
//! Every UDP worker owns one [`Stats`] block of relaxed atomics (no
//! contention, no allocation per query); the TCP and forwarding paths share
//! another. Once a second [`Exporter::export`] sums the blocks and hands the
//! differences to the daemon's [`Metrics`] registry, which takes a lock, so
//! `/metrics` costs the query path nothing.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use podnet_daemon::{Counter, Metrics, BUCKETS};

use crate::wire;

const DNS_MALFORMED_TOTAL: Counter = Counter::new(
    "podnet_dns_malformed_total",
    "Packets dropped or refused because they did not parse.",
);
const DNS_TRUNCATED_TOTAL: Counter = Counter::new(
    "podnet_dns_truncated_total",
    "UDP answers sent truncated (TC) for the client to retry over TCP.",
);
const DNS_CACHE_HITS_TOTAL: Counter = Counter::new(
    "podnet_dns_cache_hits_total",
    "Forwarded names answered from the cache.",
);
const DNS_CACHE_MISSES_TOTAL: Counter = Counter::new(
    "podnet_dns_cache_misses_total",
    "Forwarded names not in the cache.",
);
const DNS_SHED_TOTAL: Counter = Counter::new(
    "podnet_dns_shed_total",
    "Forwarded UDP queries answered SERVFAIL because too many were waiting.",
);
const DNS_RECURSION_REFUSED_TOTAL: Counter = Counter::new(
    "podnet_dns_recursion_refused_total",
    "Queries for names outside the cluster zone answered REFUSED: the client is not allowed recursion.",
);
const DNS_REQUEST_DURATION_SECONDS: podnet_daemon::Histogram = podnet_daemon::Histogram::new(
    "podnet_dns_request_duration_seconds",
    "Time from receiving a query to sending its answer.",
);
const DNS_RESPONSES_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_dns_responses_total",
    "DNS responses sent, by query type and rcode.",
);
const DNS_UPSTREAM_ERRORS_TOTAL: podnet_daemon::Counter = podnet_daemon::Counter::new(
    "podnet_dns_upstream_errors_total",
    "Upstream attempts that failed (timeout, refused, SERVFAIL, garbage).",
);

/// Query types we label separately; everything else is "other".
const TYPES: [(u16, &str); 10] = [
    (wire::TYPE_A, "A"),
    (wire::TYPE_AAAA, "AAAA"),
    (wire::TYPE_SRV, "SRV"),
    (wire::TYPE_PTR, "PTR"),
    (wire::TYPE_TXT, "TXT"),
    (wire::TYPE_CNAME, "CNAME"),
    (wire::TYPE_SOA, "SOA"),
    (wire::TYPE_ANY, "ANY"),
    (wire::TYPE_NS, "NS"),
    (wire::TYPE_MX, "MX"),
];
const NT: usize = TYPES.len() + 1;
const RCODES: [&str; 7] = [
    "NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED", "other",
];
const NR: usize = RCODES.len();
const NB: usize = BUCKETS.len() + 1;

/// Counters of one worker (or of the shared slow path).
pub struct Stats {
    answers: [AtomicU64; NT * NR],
    latency: [AtomicU64; NB],
    latency_ns: AtomicU64,
    pub malformed: AtomicU64,
    pub truncated: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    /// Forwarded UDP queries answered SERVFAIL because too many waited.
    pub shed: AtomicU64,
    /// Queries for other names refused: the client may not recurse.
    pub refused: AtomicU64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            answers: std::array::from_fn(|_| AtomicU64::new(0)),
            latency: std::array::from_fn(|_| AtomicU64::new(0)),
            latency_ns: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            truncated: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            cache_misses: AtomicU64::new(0),
            shed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }
}

fn type_index(t: u16) -> usize {
    TYPES
        .iter()
        .position(|(v, _)| *v == t)
        .unwrap_or(TYPES.len())
}

impl Stats {
    /// Counts one response: its query type, its rcode (from the bytes we
    /// send) and how long it took since `start`.
    pub fn answered(&self, qtype: u16, response: &[u8], start: Instant) {
        let rcode = response.get(3).map(|b| (b & 0xf) as usize).unwrap_or(NR);
        let r = rcode.min(NR - 1);
        self.answers[type_index(qtype) * NR + r].fetch_add(1, Relaxed);
        let d = start.elapsed();
        let secs = d.as_secs_f64();
        let b = BUCKETS.iter().position(|b| secs <= *b).unwrap_or(NB - 1);
        self.latency[b].fetch_add(1, Relaxed);
        self.latency_ns.fetch_add(d.as_nanos() as u64, Relaxed);
    }

    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Relaxed);
    }
}

/// Running totals, to turn the atomics' absolute values into increments.
#[derive(Clone)]
struct Totals {
    answers: Vec<u64>,
    latency: Vec<u64>,
    latency_ns: u64,
    malformed: u64,
    truncated: u64,
    hits: u64,
    misses: u64,
    shed: u64,
    refused: u64,
    upstream: Vec<u64>,
}

/// Publishes every [`Stats`] block into the metrics registry.
pub struct Exporter {
    blocks: Vec<Arc<Stats>>,
    upstreams: Vec<String>,
    last: Totals,
}

impl Exporter {
    pub fn new(blocks: Vec<Arc<Stats>>, upstreams: Vec<String>) -> Exporter {
        let n = upstreams.len();
        Exporter {
            blocks,
            upstreams,
            last: Totals {
                answers: vec![0; NT * NR],
                latency: vec![0; NB],
                latency_ns: 0,
                malformed: 0,
                truncated: 0,
                hits: 0,
                misses: 0,
                shed: 0,
                refused: 0,
                upstream: vec![0; n],
            },
        }
    }

    fn sum(&self, upstream_errors: &[u64]) -> Totals {
        let mut t = Totals {
            answers: vec![0; NT * NR],
            latency: vec![0; NB],
            latency_ns: 0,
            malformed: 0,
            truncated: 0,
            hits: 0,
            misses: 0,
            shed: 0,
            refused: 0,
            upstream: upstream_errors.to_vec(),
        };
        for b in &self.blocks {
            for (i, a) in b.answers.iter().enumerate() {
                t.answers[i] += a.load(Relaxed);
            }
            for (i, a) in b.latency.iter().enumerate() {
                t.latency[i] += a.load(Relaxed);
            }
            t.latency_ns += b.latency_ns.load(Relaxed);
            t.malformed += b.malformed.load(Relaxed);
            t.truncated += b.truncated.load(Relaxed);
            t.hits += b.cache_hits.load(Relaxed);
            t.misses += b.cache_misses.load(Relaxed);
            t.shed += b.shed.load(Relaxed);
            t.refused += b.refused.load(Relaxed);
        }
        t
    }

    /// Adds what happened since the last call to `m`.
    pub fn export(&mut self, m: &Metrics, upstream_errors: &[u64]) {
        let now = self.sum(upstream_errors);
        let last = &self.last;
        for ti in 0..NT {
            for (ri, rcode) in RCODES.iter().enumerate() {
                let i = ti * NR + ri;
                let d = now.answers[i] - last.answers[i];
                if d > 0 {
                    let t = TYPES.get(ti).map(|(_, n)| *n).unwrap_or("other");
                    m.count(
                        &DNS_RESPONSES_TOTAL,
                        &format!("qtype=\"{t}\",rcode=\"{rcode}\""),
                        d as f64,
                    );
                }
            }
        }
        let counts: Vec<u64> = now
            .latency
            .iter()
            .zip(&last.latency)
            .map(|(a, b)| a - b)
            .collect();
        if counts.iter().any(|c| *c > 0) {
            m.sample_buckets(
                &DNS_REQUEST_DURATION_SECONDS,
                "",
                &counts,
                (now.latency_ns - last.latency_ns) as f64 / 1e9,
            );
        }
        let counter = |c: &Counter, d: u64| m.count(c, "", d as f64);
        counter(&DNS_MALFORMED_TOTAL, now.malformed - last.malformed);
        counter(&DNS_TRUNCATED_TOTAL, now.truncated - last.truncated);
        counter(&DNS_CACHE_HITS_TOTAL, now.hits - last.hits);
        counter(&DNS_CACHE_MISSES_TOTAL, now.misses - last.misses);
        counter(&DNS_SHED_TOTAL, now.shed - last.shed);
        counter(&DNS_RECURSION_REFUSED_TOTAL, now.refused - last.refused);
        for (i, u) in self.upstreams.iter().enumerate() {
            let d = now.upstream.get(i).copied().unwrap_or(0)
                - last.upstream.get(i).copied().unwrap_or(0);
            m.count(
                &DNS_UPSTREAM_ERRORS_TOTAL,
                &format!("upstream=\"{u}\""),
                d as f64,
            );
        }
        self.last = now;
    }
}
