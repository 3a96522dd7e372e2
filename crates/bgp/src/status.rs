//! What `podnet bgp status` shows and the metrics count: each neighbour's
//! session state, since when, prefixes sent and received, and its BFD
//! state. The speaker keeps a [`Board`] current as sessions change; the
//! agent serves it as JSON (`/bgp` on its metrics address) and the CLI
//! prints it as a table. Pure apart from the lock.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One neighbour's line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerStatus {
    pub addr: Option<IpAddr>,
    pub asn: u32,
    /// The session's state: Idle, Connect, Active, OpenSent,
    /// OpenConfirm, Established.
    pub state: String,
    /// Unix seconds of the last change into or out of Established.
    pub since: u64,
    pub received: usize,
    pub sent: usize,
    /// Up, Down, Init, AdminDown; empty without BFD.
    pub bfd: String,
    /// Why the session last went down.
    pub last_error: String,
}

/// Every neighbour's status, shared between the speaker (writer) and
/// whoever shows it.
#[derive(Debug, Clone, Default)]
pub struct Board(Arc<RwLock<BTreeMap<IpAddr, PeerStatus>>>);

impl Board {
    /// Changes neighbour `addr`'s line (created on first use).
    pub fn update(&self, addr: IpAddr, f: impl FnOnce(&mut PeerStatus)) {
        let mut m = self.0.write().expect("bgp status");
        let p = m.entry(addr).or_insert_with(|| PeerStatus {
            addr: Some(addr),
            state: "Idle".into(),
            since: now(),
            ..Default::default()
        });
        f(p);
    }

    /// Marks a state change (and its time when the session comes up or
    /// goes down).
    pub fn state(&self, addr: IpAddr, state: &str) {
        self.update(addr, |p| {
            let established = |s: &str| s == "Established";
            if established(&p.state) != established(state) {
                p.since = now();
            }
            p.state = state.to_string();
        });
    }

    pub fn remove(&self, addr: IpAddr) {
        self.0.write().expect("bgp status").remove(&addr);
    }

    pub fn snapshot(&self) -> Vec<PeerStatus> {
        self.0
            .read()
            .expect("bgp status")
            .values()
            .cloned()
            .collect()
    }

    /// The `/bgp` page's body.
    pub fn json(&self) -> String {
        let peers: Vec<serde_json::Value> = self
            .snapshot()
            .into_iter()
            .map(|p| {
                serde_json::json!({
                    "peer": p.addr.map(|a| a.to_string()),
                    "as": p.asn,
                    "state": p.state,
                    "since": p.since,
                    "received": p.received,
                    "sent": p.sent,
                    "bfd": p.bfd,
                    "lastError": p.last_error,
                })
            })
            .collect();
        serde_json::json!({ "peers": peers }).to_string()
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// The lines of a `/bgp` body, for the CLI; an error names what is wrong.
pub fn parse(body: &str) -> Result<Vec<PeerStatus>, String> {
    let v: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("not the agent's /bgp answer: {e}"))?;
    let peers = v["peers"]
        .as_array()
        .ok_or("not the agent's /bgp answer: no \"peers\"")?;
    Ok(peers
        .iter()
        .map(|p| PeerStatus {
            addr: p["peer"].as_str().and_then(|s| s.parse().ok()),
            asn: p["as"].as_u64().unwrap_or(0) as u32,
            state: p["state"].as_str().unwrap_or_default().to_string(),
            since: p["since"].as_u64().unwrap_or(0),
            received: p["received"].as_u64().unwrap_or(0) as usize,
            sent: p["sent"].as_u64().unwrap_or(0) as usize,
            bfd: p["bfd"].as_str().unwrap_or_default().to_string(),
            last_error: p["lastError"].as_str().unwrap_or_default().to_string(),
        })
        .collect())
}

/// A table as `birdc show protocols` or `calicoctl node status` print it;
/// `now` is unix seconds.
pub fn table(peers: &[PeerStatus], now: u64) -> String {
    let mut out = format!(
        "{:<40} {:>10} {:<12} {:>9} {:>9} {:>9} {:<6} {}\n",
        "PEER", "AS", "STATE", "UPTIME", "RECEIVED", "SENT", "BFD", "LAST ERROR"
    );
    for p in peers {
        let up = match p.state.as_str() {
            "Established" => human(Duration::from_secs(now.saturating_sub(p.since))),
            _ => "-".to_string(),
        };
        let addr = p.addr.map(|a| a.to_string()).unwrap_or_default();
        let bfd = if p.bfd.is_empty() {
            "-"
        } else {
            p.bfd.as_str()
        };
        out.push_str(&format!(
            "{:<40} {:>10} {:<12} {:>9} {:>9} {:>9} {:<6} {}\n",
            addr, p.asn, p.state, up, p.received, p.sent, bfd, p.last_error
        ));
    }
    out
}

fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_board_round_trips_through_json_into_a_table() {
        let b = Board::default();
        let a: IpAddr = "192.168.200.12".parse().unwrap();
        b.state(a, "Established");
        b.update(a, |p| {
            p.asn = 64512;
            p.received = 1;
            p.sent = 3;
            p.bfd = "Up".into();
        });
        let peers = parse(&b.json()).unwrap();
        assert_eq!(peers, b.snapshot());
        let since = peers[0].since;
        let t = table(&peers, since + 75);
        assert!(t.starts_with("PEER"), "{t}");
        let line = t.lines().nth(1).unwrap();
        for want in ["192.168.200.12", "64512", "Established", "1m15s", "Up"] {
            assert!(line.contains(want), "{want} in {line:?}");
        }
        b.state(a, "Active");
        assert!(table(&b.snapshot(), since + 80)
            .lines()
            .nth(1)
            .unwrap()
            .contains(" - "));
        assert!(parse("{}").unwrap_err().contains("no \"peers\""));
    }
}
