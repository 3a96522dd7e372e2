//! The kernel's records of the probe besides its trace events: the text
//! of the rules a walk passed (`nft -a`), and the probe's conntrack entry
//! with its NAT.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::Command;
use std::time::Duration;

use podnet_kernel::conntrack::{self, Entry, IpFamily};
use podnet_kernel::nftrace::TraceEvent;
use podnet_kernel::Netns;
use podnet_nft::model::Proto;

use super::open_netns;
use crate::hops;

/// Rule texts of the chains a walk passed, by (table, chain, handle), as
/// `nft -a` lists them (when the tool is there; the hop says "rule" if not).
pub(super) fn rule_texts(
    netns: &str,
    walk: &[TraceEvent],
) -> BTreeMap<(String, String, u64), String> {
    let mut out = BTreeMap::new();
    let Ok(ns) = open_netns(netns) else {
        return out;
    };
    let mut seen = std::collections::BTreeSet::new();
    for e in walk.iter().filter(|e| e.rule.is_some()) {
        let key = (e.family, e.table.clone(), e.chain.clone());
        if !seen.insert(key) {
            continue;
        }
        let fam = hops::family_name(e.family);
        // A child started from inside the namespace stays in it.
        let Ok(Ok(o)) = ns.run(|| {
            Command::new("nft")
                .args(["-a", "list", "chain", fam, &e.table, &e.chain])
                .output()
        }) else {
            continue;
        };
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            if let Some((text, h)) = line.trim().rsplit_once(" # handle ") {
                if let Ok(h) = h.trim().parse::<u64>() {
                    out.insert(
                        (e.table.clone(), e.chain.clone(), h),
                        text.trim().to_string(),
                    );
                }
            }
        }
    }
    out
}

/// The probe's connection as the source node's conntrack holds it.
pub(super) fn conntrack_entry(ns: &Netns, src: IpAddr, sport: u16, proto: Proto) -> Option<Entry> {
    let fam = if src.is_ipv4() {
        IpFamily::V4
    } else {
        IpFamily::V6
    };
    let list = ns
        .run(|| conntrack::Table::new().and_then(|mut t| t.list(Some(fam))))
        .ok()?
        .ok()?;
    list.into_iter()
        .find(|e| e.proto == proto.number() && e.orig.src == src && e.orig.sport == sport)
}

/// The probe's connection among the confirmations `events` queued.
pub(super) fn confirmed_entry(
    events: &mut conntrack::Events,
    src: IpAddr,
    sport: u16,
    proto: Proto,
) -> Option<Entry> {
    events.set_timeout(Some(Duration::from_millis(1))).ok()?;
    loop {
        let got = events.recv().ok()?;
        if got.is_empty() {
            return None;
        }
        if let Some((_, e)) = got
            .into_iter()
            .find(|(_, e)| e.proto == proto.number() && e.orig.src == src && e.orig.sport == sport)
        {
            return Some(e);
        }
    }
}
