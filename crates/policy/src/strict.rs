//! `--policy-strict`: established connections a change no longer allows
//! are cut, in the same sync. Conntrack's entries are read over ctnetlink;
//! each one from or to a pod of this node is judged by the evaluator (the
//! destination as the endpoint after DNAT: the reply's source) for the
//! side this node enforces, and a denied one is deleted, so its next packet
//! is a new connection and meets the table.

use podnet_kernel::conntrack;
use podnet_kernel::KernelError;
use podnet_nft::model::Proto;

use crate::eval::{evaluate, Flow};
use crate::plan::is_local;
use crate::world::World;

/// Deletes the entries of this node's pods that the objects deny; returns
/// how many.
pub fn cut(w: &World, node: &str) -> Result<usize, KernelError> {
    let mut n = 0;
    for e in conntrack::list(None)? {
        let proto = match e.proto {
            6 => Proto::Tcp,
            17 => Proto::Udp,
            132 => Proto::Sctp,
            _ => continue,
        };
        // After DNAT: the endpoint answers from reply.src:reply.sport.
        let f = Flow {
            src: e.orig.src,
            dst: e.reply.src,
            proto,
            port: e.reply.sport,
        };
        let local = |ip| w.pod_at(ip).is_some_and(|(_, v)| is_local(v, node));
        let (src_local, dst_local) = (local(f.src), local(f.dst));
        if !src_local && !dst_local {
            continue;
        }
        let v = evaluate(w, &f);
        let denied = (src_local && !v.egress.allows()) || (dst_local && !v.ingress.allows());
        if denied && conntrack::delete(&e)? {
            tracing::debug!(flow = %f, "policy-strict: cut");
            n += 1;
        }
    }
    Ok(n)
}
