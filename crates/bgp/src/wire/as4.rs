//! The path a 2-octet-AS peer sent, rebuilt with 4-octet AS numbers (RFC
//! 6793 §4.2.3). Such a peer's AS_PATH and AGGREGATOR hold AS_TRANS
//! (23456) for every AS beyond 65535; the real numbers travel in AS4_PATH
//! and AS4_AGGREGATOR, which speakers that know 4-octet numbers add and
//! old ones pass on untouched. An old speaker on the way prepends to
//! AS_PATH only, so AS4_PATH is the tail of the path: the leading ASes of
//! AS_PATH that AS4_PATH lacks go in front of it. Without this, a route
//! through a 2-octet peer compares with a path of AS_TRANS, and a loop
//! through our own 4-octet AS goes unseen.
//!
//! On a session where both sides speak 4-octet numbers, AS4_PATH and
//! AS4_AGGREGATOR are ignored (§4.2.2); the caller does not call this.

use std::net::Ipv4Addr;

use super::{AsSegment, PathAttrs, AS_TRANS};

/// What a 2-octet peer's UPDATE carried in AS4_PATH and AS4_AGGREGATOR.
#[derive(Debug, Default)]
pub(crate) struct As4 {
    pub path: Option<Vec<AsSegment>>,
    pub aggregator: Option<(u32, Ipv4Addr)>,
}

impl As4 {
    /// Rebuilds `a`'s AS_PATH and AGGREGATOR from these (§4.2.3).
    pub fn merge_into(self, a: &mut PathAttrs) {
        if let (Some((asn, _)), Some(agg4)) = (a.aggregator, self.aggregator) {
            // Aggregated by an old speaker: AS4_PATH tells of a path
            // before the aggregation, and is ignored with AS4_AGGREGATOR.
            if asn != u32::from(AS_TRANS) {
                return;
            }
            a.aggregator = Some(agg4);
        }
        let Some(tail) = self.path else { return };
        let (n, n4) = (count(&a.as_path), count(&tail));
        // Fewer ASes than AS4_PATH names: AS4_PATH is not this path's.
        if n < n4 {
            return;
        }
        let mut path = leading(&a.as_path, n - n4);
        for seg in tail {
            push(&mut path, seg);
        }
        a.as_path = path;
    }
}

/// The number of ASes in a path as route selection counts them (RFC 4271
/// §9.1.2.2): a set counts one.
fn count(path: &[AsSegment]) -> usize {
    path.iter()
        .map(|s| match s {
            AsSegment::Sequence(v) => v.len(),
            AsSegment::Set(_) => 1,
        })
        .sum()
}

/// The leading segments of `path` that hold `k` ASes (a sequence cut
/// where needed, a set taken whole).
fn leading(path: &[AsSegment], mut k: usize) -> Vec<AsSegment> {
    let mut out = Vec::new();
    for seg in path {
        if k == 0 {
            break;
        }
        match seg {
            AsSegment::Sequence(v) => {
                let take = k.min(v.len());
                out.push(AsSegment::Sequence(v[..take].to_vec()));
                k -= take;
            }
            AsSegment::Set(v) => {
                out.push(AsSegment::Set(v.clone()));
                k -= 1;
            }
        }
    }
    out
}

/// Appends a segment, joining two sequences that meet (a segment holds at
/// most 255 ASes).
fn push(path: &mut Vec<AsSegment>, seg: AsSegment) {
    if let (Some(AsSegment::Sequence(last)), AsSegment::Sequence(v)) = (path.last_mut(), &seg) {
        if last.len() + v.len() <= 255 {
            last.extend_from_slice(v);
            return;
        }
    }
    path.push(seg);
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIG: u32 = 4_200_000_000;
    const TRANS: u32 = AS_TRANS as u32;

    fn seq(v: &[u32]) -> AsSegment {
        AsSegment::Sequence(v.to_vec())
    }

    fn merged(as_path: Vec<AsSegment>, as4_path: Vec<AsSegment>) -> Vec<AsSegment> {
        let mut a = PathAttrs {
            as_path,
            ..Default::default()
        };
        As4 {
            path: Some(as4_path),
            aggregator: None,
        }
        .merge_into(&mut a);
        a.as_path
    }

    #[test]
    fn the_ases_an_old_speaker_prepended_go_in_front_of_as4_path() {
        // 65010 and 65020 (old speakers) prepended after the 4-octet
        // speaker that wrote AS4_PATH.
        let got = merged(
            vec![seq(&[65020, 65010, 65001, TRANS])],
            vec![seq(&[65001, BIG])],
        );
        assert_eq!(got, vec![seq(&[65020, 65010, 65001, BIG])]);
        // The same length: AS4_PATH is the path.
        assert_eq!(
            merged(vec![seq(&[65001, TRANS])], vec![seq(&[65001, BIG])]),
            vec![seq(&[65001, BIG])]
        );
    }

    #[test]
    fn an_as4_path_longer_than_as_path_is_ignored() {
        let got = merged(vec![seq(&[65001])], vec![seq(&[65001, BIG])]);
        assert_eq!(got, vec![seq(&[65001])]);
    }

    #[test]
    fn a_leading_set_counts_one_and_is_taken_whole() {
        let set = AsSegment::Set(vec![1, 2, 3]);
        let got = merged(
            vec![seq(&[65010]), set.clone(), seq(&[TRANS])],
            vec![seq(&[BIG])],
        );
        assert_eq!(got, vec![seq(&[65010]), set, seq(&[BIG])]);
    }

    #[test]
    fn aggregator_as_trans_takes_as4_aggregator_and_an_old_aggregator_voids_both() {
        let id = Ipv4Addr::new(192, 0, 2, 1);
        let attrs = |agg: u32| PathAttrs {
            as_path: vec![seq(&[65001, TRANS])],
            aggregator: Some((agg, id)),
            ..Default::default()
        };
        let as4 = || As4 {
            path: Some(vec![seq(&[65001, BIG])]),
            aggregator: Some((BIG, id)),
        };
        let mut a = attrs(TRANS);
        as4().merge_into(&mut a);
        assert_eq!(a.aggregator, Some((BIG, id)));
        assert_eq!(a.as_path, vec![seq(&[65001, BIG])]);
        // Aggregated by an old speaker (its own 2-octet AS): nothing of
        // AS4_* is used.
        let mut a = attrs(65001);
        as4().merge_into(&mut a);
        assert_eq!(a, attrs(65001));
    }
}
