//! BGP-4 in the agent (issue 26): pod CIDRs and Service addresses spread
//! by BGP, as Calico does, peering with real routers (BIRD, FRR, GoBGP).
//!
//! Layout, one concept per module, the pure ones first:
//! - [`wire`]: the messages as bytes and back (RFC 4271 with multiprotocol
//!   IPv4/IPv6 unicast, 4-octet AS numbers (a 2-octet peer's path rebuilt
//!   from AS4_PATH), route refresh, communities and
//!   large communities, graceful restart and route reflection attributes);
//!   a malformed message becomes the NOTIFICATION RFC 4271 §6 names;
//! - [`fsm`]: one session's finite state machine (RFC 4271 §8), a pure
//!   function from (state, event) to (state, actions), with timers as
//!   deadlines the caller keeps;
//! - [`rib`]: each peer's routes and the best per prefix (the decision
//!   process of RFC 4271 §9.1, route reflection's loop checks), pure;
//! - [`export`]: what each neighbour is sent and with which attributes
//!   (iBGP and eBGP rules, route reflection), pure;
//! - [`bfd`]: BFD control packets and one asynchronous session's state
//!   machine (RFC 5880), pure; [`bfd_link`] runs every neighbour's over
//!   UDP for one local address, IPv4 or IPv6 (RFC 5881: port 3784, TTL
//!   or hop limit 255 both ways),
//!   and a speaker drops a BGP session the moment its BFD goes down
//!   (RFC 5882);
//! - [`gtsm`]: RFC 5082's TTL check on a socket (send 255, take only
//!   255), so that only a neighbour on the link reaches a session;
//! - [`adj_out`]: what one peer is to hold from this speaker, changed a
//!   prefix at a time, and the UPDATEs that carry just what changed, pure;
//! - [`peer`]: one peer over TCP, the edge that carries out the state
//!   machine's actions, sends the peer the changes of what it is to hold
//!   (all of it when the session comes up) and hands the peer's UPDATEs
//!   to its owner;
//! - [`adverts`]: what a node advertises for Services (the configured
//!   blocks, and a Local Service's addresses where it has an endpoint),
//!   pure;
//! - [`speaker`]: a node's speaker: its listener, a peer per neighbour (the
//!   set replaced at run time as nodes come and go), the RIB and the export
//!   rules, with the best routes' changes for the owner;
//! - [`topology`]: who a node peers with (the mesh, route reflectors,
//!   configured routers), pure;
//! - [`status`]: each neighbour's session as `podnet bgp status` shows it;
//! - [`node`]: a node's one speaker shared by its owners in the agent (the
//!   overlay's pod CIDR, the mesh and configured peers, Service addresses).
//!
//! Tested against BIRD 2, FRR's bgpd and GoBGP (`tests/`): a session,
//! routes both ways in both families, a withdrawal, the daemon's Cease,
//! BIRD's `ttl security` (`tests/gtsm.rs`, where a host beyond a router
//! never gets a connection);
//! and BFD against BIRD's (`tests/bfd_bird.rs`, `tests/bfd_bgp.rs`): a
//! frozen BIRD is noticed within the detection time, and its routes are
//! withdrawn then (268 ms with 100 ms × 3), not after the 90 s hold time.
//!
//! Why our own codec: the two crates that exist were judged and left. The
//! one of them that is small (zettabgp) has no ROUTE-REFRESH message and no
//! large communities; the complete one (netgauze-bgp-pkt) is built for
//! monitoring every address family, on nom and serde with a tree of its
//! own crates, most of which a node's speaker never needs. A speaker that
//! carries unicast routes needs a few hundred lines, tested here against
//! hand-made vectors and, in the lab, against the real daemons.

pub mod adj_out;
pub mod adverts;
pub mod bfd;
pub mod bfd_link;
pub mod export;
pub mod fsm;
pub mod gtsm;
pub mod node;
pub mod peer;
pub mod rib;
pub mod speaker;
pub mod status;
pub mod topology;
pub mod wire;
