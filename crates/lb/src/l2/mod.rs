//! L2 announcement of LoadBalancer IPs, as MetalLB's L2 mode does it: on a
//! network without BGP, one node answers ARP (IPv4) and Neighbor
//! Discovery (IPv6) for each LoadBalancer IP on its underlay interface, so
//! the segment's hosts and router send that IP's traffic to it; when the
//! node dies, another node takes the IP over and says so at once with a
//! gratuitous ARP / unsolicited Neighbor Advertisement, which moves the
//! clients' neighbour entries in one frame (measured in the tests: about
//! 10-20 ms from the new owner's gain to the client's first reply).
//!
//! The IP is on no interface of any node: nodes answer for an address
//! they do not hold, and the service proxy's nftables rules take the
//! traffic (DNAT to the Service's endpoints) when it arrives.
//!
//! Layout:
//! - [`packet`]: the wire format (ARP, NS/NA, the ICMPv6 checksum), pure;
//! - [`election`]: which node owns which IP (rendezvous hashing), pure;
//! - [`answer`]: what to say to one received frame, pure;
//! - [`announce`]: when to announce a gained IP (at once, then repeated);
//! - `socket`: the `AF_PACKET` sockets and the solicited-node groups;
//! - [`Responder`]: the tokio task that ties them to one interface.
//!
//! # How the agent uses it
//!
//! (`podnet_agent::l2`, `podnet agent --l2-announce`, does exactly this,
//! with BFD between the nodes for liveness.)
//!
//! 1. At start, one [`Responder`] per underlay interface (the agent's
//!    `--iface`), from inside its tokio runtime:
//!    `Responder::start(iface, Announce::default())`. It needs
//!    `CAP_NET_RAW`; a failure names the interface and the cause.
//! 2. Whenever an input changes, it computes this node's share and hands
//!    it over: `responder.set_owned(election::owned_by(node, ips))`, where
//!    `ips` pairs each LoadBalancer IP (from the Services'
//!    `status.loadBalancer.ingress`, allocated by `ipam`) with the IP's
//!    eligible nodes. Every node computes the same owners from the same
//!    inputs; nodes never negotiate.
//! 3. The eligible set is the nodes the agent believes alive. Detecting a
//!    dead node fast is the agent's concern, not this module's: the Node
//!    object's `Ready` condition is far too slow (tens of seconds), so
//!    the agent should feed liveness from something quick such as BFD
//!    sessions between nodes (`podnet-bgp` has BFD) or a gossip protocol;
//!    the failover time is that detection time plus a few milliseconds.
//! 4. For a Service with `externalTrafficPolicy: Local`, an IP's eligible
//!    set is further cut to the alive nodes with a ready endpoint of that
//!    Service (from its EndpointSlices: `nodeName` and the `ready`
//!    condition), so the IP is announced only where traffic can be served
//!    without leaving the node, and the client's source address is kept.
//!    An IP with no eligible node is announced by nobody.
//!
//! A node must not hold the IP as a local address answered by its own
//! kernel: with an IPVS-style dummy interface carrying the IP, set
//! `net.ipv4.conf.all.arp_ignore=1` and `arp_announce=2` (as the tests
//! do), or every node's kernel would answer ARP for it too. The kernel
//! never answers Neighbor Solicitations for an address that is only
//! routed `local`.
//!
//! # Limits
//!
//! - Untagged Ethernet on the bound interface: for a VLAN, bind the VLAN
//!   subinterface. Neighbor Solicitations behind IPv6 extension headers
//!   are not answered (Neighbor Discovery does not use them).
//! - Only frames sent to this host are answered, never frames seen in
//!   promiscuous mode, and never our own.
//! - The interface's MAC is read at start; restart the responder if it
//!   changes. There is no periodic re-announcement (MetalLB has none
//!   either): the owner answers every resolution, and a new owner
//!   announces three times over a second.
//! - Another host announcing an owned IP is logged and counted
//!   ([`Stats::conflicts`]), not fought over.

pub mod announce;
pub mod answer;
pub mod election;
mod error;
pub mod packet;
mod responder;
mod socket;

pub use announce::Announce;
pub use error::L2Error;
pub use responder::{Responder, Stats};
