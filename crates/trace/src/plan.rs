//! The trace table: the one rule that switches tracing on for the probe's
//! packets, in every node it may cross.
//!
//! It matches the probe's protocol and source port, which podnet picks and
//! binds, so only the probe is traced: a random port from a range no
//! ephemeral port comes from by default. It hooks prerouting (packets that
//! arrive: from a pod over the bridge, or out of a tunnel) and output
//! (packets the node sends itself) at priority -350, before conntrack
//! (-200) and every raw table (-300), so every table's rules are reported.

use podnet_nft::model::{Chain, ChainType, Expr, Family, Field, Hook, Proto, Rule, Table, Value};

/// The table's name, in family `inet` in each node's namespace.
pub const TABLE: &str = "podnet-trace";
/// Below every other base chain podnet or kube-proxy installs.
pub const PRIORITY: i32 = -350;

/// The trace table for probes of `proto` from source port `sport`.
pub fn marker(proto: Proto, sport: u16) -> Table {
    let mut t = Table::new(Family::Inet, TABLE);
    for (name, hook) in [("pre", Hook::Prerouting), ("out", Hook::Output)] {
        t.chains.insert(
            name.into(),
            Chain::base(ChainType::Filter, hook, PRIORITY).with_rules(vec![Rule::new(vec![
                Expr::Cmp {
                    field: Field::L4Proto,
                    neg: false,
                    value: Value::Proto(proto),
                },
                Expr::Cmp {
                    field: Field::Sport,
                    neg: false,
                    value: Value::Port(sport),
                },
                Expr::SetNftrace,
            ])]),
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use podnet_nft::trace::{Packet, Tracer};

    #[test]
    fn marks_only_the_probe() {
        let t = marker(Proto::Tcp, 23456);
        assert_eq!(
            t.chains["pre"].rules[0].text(),
            "meta l4proto tcp th sport 23456 meta nftrace set 1"
        );
        // The table never decides: every packet goes on.
        let mut p = Packet::new("10.244.1.2", "10.96.0.10", Proto::Tcp, 80);
        p.sport = 23456;
        let o = Tracer::new(&t).incoming(&p, &mut |_| 0);
        assert_eq!(o.fate, podnet_nft::trace::Fate::Accept);
    }
}
