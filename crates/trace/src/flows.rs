//! The node's flow log, like `hubble observe`: every new connection the
//! node's conntrack confirms ("forwarded"), and every one its
//! NetworkPolicy denied ("dropped", with the policies and why), each
//! address named as a pod, a Service or a node.
//!
//! [`FlowLog`] is the bounded buffer: the newest [`FlowLog::capacity`]
//! records, numbered. A reader asks for the records after the last number
//! it saw and learns how many it missed because the buffer moved on; the
//! kernel's own losses (events dropped on a full socket) are counted too.
//! Nothing is lost silently. [`forwarded`] and [`dropped`] build records
//! (pure); the agent feeds them from conntrack events and the policy
//! verdict log, and serves [`FlowLog::page`] at `/flows`.

use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;

use podnet_kernel::conntrack::{Entry, IPS_DST_NAT, IPS_SRC_NAT};
use serde::{Deserialize, Serialize};

use crate::hops::Names;

/// One flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowRecord {
    /// Its number in the node's log (from 1).
    #[serde(default)]
    pub seq: u64,
    /// Milliseconds since the Unix epoch, when the node saw it.
    pub time_ms: u64,
    pub node: String,
    /// `forwarded` or `dropped`.
    pub verdict: String,
    /// `tcp`, `udp`, `sctp`, `icmp` or the protocol number.
    pub proto: String,
    pub src: IpAddr,
    pub sport: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_name: Option<String>,
    /// Where the client sent it (a Service's address, before DNAT).
    pub dst: IpAddr,
    pub dport: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst_name: Option<String>,
    /// After DNAT: the endpoint that got it, and its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_name: Option<String>,
    #[serde(default)]
    pub masqueraded: bool,
    /// For a drop: the policies isolating the denying end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl FlowRecord {
    /// Whether the record concerns pod `ns/name` (either end, or the
    /// endpoint).
    pub fn involves(&self, pod: &str) -> bool {
        [&self.src_name, &self.dst_name, &self.endpoint_name]
            .iter()
            .any(|n| n.as_deref() == Some(pod))
    }

    /// One line, as `podnet flows` prints it (the time of day in UTC).
    pub fn text(&self) -> String {
        let end = |ip: &IpAddr, port: u16, name: &Option<String>| match name {
            Some(n) => format!("{n} ({ip}:{port})"),
            None => format!("{ip}:{port}"),
        };
        let day = self.time_ms % 86_400_000;
        let mut s = format!(
            "{:02}:{:02}:{:02}.{:03} {} {:<9} {} {} -> {}",
            day / 3_600_000,
            day / 60_000 % 60,
            day / 1000 % 60,
            day % 1000,
            self.node,
            self.verdict.to_uppercase(),
            self.proto,
            end(&self.src, self.sport, &self.src_name),
            end(&self.dst, self.dport, &self.dst_name),
        );
        if let Some(e) = &self.endpoint {
            s.push_str(&format!(
                " => {}{}",
                self.endpoint_name
                    .as_ref()
                    .map(|n| format!("{n} "))
                    .unwrap_or_default(),
                e
            ));
        }
        if self.masqueraded {
            s.push_str(" (masqueraded)");
        }
        if !self.policies.is_empty() {
            s.push_str(&format!(" policy {}", self.policies.join(",")));
        }
        if let Some(r) = &self.reason {
            s.push_str(&format!(": {r}"));
        }
        s
    }
}

fn proto_name(p: u8) -> String {
    match p {
        6 => "tcp".into(),
        17 => "udp".into(),
        132 => "sctp".into(),
        1 => "icmp".into(),
        2 => "igmp".into(),
        58 => "icmpv6".into(),
        n => n.to_string(),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A new connection the node's conntrack confirmed.
pub fn forwarded(node: &str, e: &Entry, names: &Names) -> FlowRecord {
    let dnat = e.status & IPS_DST_NAT != 0;
    let endpoint = dnat.then(|| format!("{}:{}", e.reply.src, e.reply.sport));
    FlowRecord {
        seq: 0,
        time_ms: now_ms(),
        node: node.to_string(),
        verdict: "forwarded".into(),
        proto: proto_name(e.proto),
        src: e.orig.src,
        sport: e.orig.sport,
        src_name: names.get(&e.orig.src).cloned(),
        dst: e.orig.dst,
        dport: e.orig.dport,
        dst_name: names.get(&e.orig.dst).cloned(),
        endpoint,
        endpoint_name: dnat.then(|| names.get(&e.reply.src).cloned()).flatten(),
        masqueraded: e.status & IPS_SRC_NAT != 0,
        policies: Vec::new(),
        reason: None,
    }
}

/// A new connection the node's NetworkPolicy denied.
#[allow(clippy::too_many_arguments)]
pub fn dropped(
    node: &str,
    src: IpAddr,
    dst: IpAddr,
    proto: &str,
    dport: u16,
    policies: Vec<String>,
    reason: String,
    names: &Names,
) -> FlowRecord {
    FlowRecord {
        seq: 0,
        time_ms: now_ms(),
        node: node.to_string(),
        verdict: "dropped".into(),
        proto: proto.to_string(),
        src,
        sport: 0,
        src_name: names.get(&src).cloned(),
        dst,
        dport,
        dst_name: names.get(&dst).cloned(),
        endpoint: None,
        endpoint_name: None,
        masqueraded: false,
        policies,
        reason: Some(reason),
    }
}

/// What a reader gets: the records after the number it gave, and how many
/// between that number and the first record it gets the buffer no longer
/// holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Page {
    pub flows: Vec<FlowRecord>,
    /// Records the reader will never see (overwritten before it asked).
    pub missed: u64,
    /// Events the kernel dropped before they reached the log.
    pub lost: u64,
    /// The number to ask after next time.
    pub last: u64,
}

/// The bounded flow buffer.
#[derive(Debug)]
pub struct FlowLog {
    cap: usize,
    buf: VecDeque<FlowRecord>,
    last: u64,
    lost: u64,
    per_verdict: BTreeMap<String, u64>,
}

impl FlowLog {
    pub fn new(cap: usize) -> FlowLog {
        FlowLog {
            cap: cap.max(1),
            buf: VecDeque::with_capacity(cap.max(1)),
            last: 0,
            lost: 0,
            per_verdict: BTreeMap::new(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Adds a record, numbering it; the oldest goes when full.
    pub fn push(&mut self, mut r: FlowRecord) -> u64 {
        self.last += 1;
        r.seq = self.last;
        *self.per_verdict.entry(r.verdict.clone()).or_default() += 1;
        if self.buf.len() == self.cap {
            self.buf.pop_front();
        }
        self.buf.push_back(r);
        self.last
    }

    /// Counts events the kernel dropped before they could be logged.
    pub fn add_lost(&mut self, n: u64) {
        self.lost += n;
    }

    /// Records seen so far, per verdict (for the metrics).
    pub fn per_verdict(&self) -> &BTreeMap<String, u64> {
        &self.per_verdict
    }

    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// The records numbered after `after`, at most `limit`, oldest first.
    pub fn page(&self, after: u64, limit: usize) -> Page {
        let first = self.buf.front().map(|r| r.seq).unwrap_or(self.last + 1);
        let missed = first
            .saturating_sub(after + 1)
            .min(self.last.saturating_sub(after));
        let flows: Vec<FlowRecord> = self
            .buf
            .iter()
            .filter(|r| r.seq > after)
            .take(limit)
            .cloned()
            .collect();
        let last = flows
            .last()
            .map(|r| r.seq)
            .unwrap_or(after.max(first.saturating_sub(1)));
        Page {
            flows,
            missed,
            lost: self.lost,
            last,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{entry, ip};

    fn names() -> Names {
        [
            (ip("10.244.1.2"), "default/a".to_string()),
            (ip("10.96.0.20"), "Service default/web".to_string()),
            (ip("10.244.2.7"), "default/web-1".to_string()),
        ]
        .into()
    }

    #[test]
    fn records_name_every_address() {
        let r = forwarded("node1", &entry(IPS_DST_NAT), &names());
        assert_eq!(r.src_name.as_deref(), Some("default/a"));
        assert_eq!(r.dst_name.as_deref(), Some("Service default/web"));
        assert_eq!(r.endpoint.as_deref(), Some("10.244.2.7:8080"));
        assert_eq!(r.endpoint_name.as_deref(), Some("default/web-1"));
        assert!(!r.masqueraded);
        assert!(r.involves("default/web-1") && r.involves("default/a") && !r.involves("default/b"));
        assert!(r.text().contains("FORWARDED tcp default/a (10.244.1.2:40000) -> Service default/web (10.96.0.20:80) => default/web-1 10.244.2.7:8080"), "{}", r.text());
        // Without DNAT there is no endpoint.
        let mut plain = entry(0);
        plain.orig.dst = ip("10.244.2.7");
        let r = forwarded("node1", &plain, &names());
        assert_eq!((r.endpoint, r.endpoint_name), (None, None));
        let d = dropped(
            "node2",
            ip("10.244.1.2"),
            ip("10.244.2.7"),
            "tcp",
            80,
            vec!["default/deny".into()],
            "isolated".into(),
            &names(),
        );
        assert!(
            d.text().contains("DROPPED") && d.text().ends_with("policy default/deny: isolated"),
            "{}",
            d.text()
        );
    }

    #[test]
    fn the_buffer_is_bounded_and_says_what_a_reader_missed() {
        let mut l = FlowLog::new(3);
        let r = forwarded("n", &entry(0), &names());
        for _ in 0..5 {
            l.push(r.clone());
        }
        assert_eq!(l.per_verdict()["forwarded"], 5);
        // From the start: 1 and 2 are gone.
        let p = l.page(0, 100);
        assert_eq!(p.flows.iter().map(|f| f.seq).collect::<Vec<_>>(), [3, 4, 5]);
        assert_eq!((p.missed, p.last), (2, 5));
        // Caught up: nothing new, nothing missed.
        let p = l.page(5, 100);
        assert_eq!((p.flows.len(), p.missed, p.last), (0, 0, 5));
        // A limit: the next page goes on from its last.
        let p = l.page(3, 1);
        assert_eq!((p.flows[0].seq, p.missed, p.last), (4, 0, 4));
        l.add_lost(2);
        assert_eq!(l.page(4, 10).lost, 2);
        // An empty log.
        let e = FlowLog::new(2).page(0, 10);
        assert_eq!((e.flows.len(), e.missed, e.last), (0, 0, 0));
    }
}
