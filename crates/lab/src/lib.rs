//! The lab: a multi-node cluster on one machine, built from network
//! namespaces, running the real binaries.
//!
//! - an underlay namespace `pn-<lab>-net` holds a bridge; every node is a
//!   namespace `pn-<lab>-<node>` whose `eth0` is plugged into it, with a
//!   default route to the gateway `pn-<lab>-gw`, plugged in the same way,
//!   which forwards nothing and counts what reaches it ([`gateway`]);
//! - each node runs a real `podnet agent`; the controller runs beside them;
//! - `lab run` makes a pod: a namespace wired through the real CNI plugins
//!   (the node's conflist, run with the node as host), registered as a Pod
//!   object, with `podnet serve` answering inside it;
//! - everything the lab makes is recorded under `/run/podnet-lab/<lab>/`, so
//!   `lab down` removes it all, also after a crash.
//!
//! Two modes. Standalone (the default): objects live in the lab's store and
//! `podnet controller` does the API server's duties. Kubernetes (`--kube`):
//! a real etcd, kube-apiserver and kube-controller-manager run for the lab
//! ([`kube`]), nodes and pods are registered through the API and the lab
//! writes pod status as their kubelet ([`kubelet`]); daemons get a
//! kubeconfig instead of a store ([`Lab::daemon_args`]).
//!
//! Rolling replacements of the daemons' binaries (an upgrade or a
//! downgrade, one agent or DNS replica at a time) are [`upgrade`]'s.
//!
//! # Layout
//!
//! [`Lab`] is one type whose `impl` is split by concept, one block per
//! module. At the bottom, depending on nothing else here:
//! - `error`: [`LabError`] and the shorthands that make one;
//! - `process`: detached, logged processes with recorded pids, and
//!   stopping and finding processes (also used by [`kube`] and
//!   [`realnode`]).
//!
//! The lab itself:
//! - `state`: [`Lab`], its directory and files, the recorded [`LabState`];
//! - `daemon`: the daemons as roles ([`Daemon`], [`Lab::daemon_args`]),
//!   starting and stopping them, forwarders into namespaces;
//! - `lifecycle`: `lab up` ([`UpOptions`]) and `lab down`;
//! - `kubemode`: Kubernetes mode's bring-up, kubeconfigs and client;
//! - `nodes`: adding, readying and removing nodes and their agents;
//! - `clusterdns`: the cluster DNS pod and the `kube-dns` Service;
//! - `pods`: pods through the real CNI plugins ([`Lab::run_pod`]);
//! - `probe`: asking from inside pods ([`Lab::reach`]), gateway leaks;
//! - `store`: standalone mode's object writes (admission, Pod status).
//!
//! Around it, public: the peers and parts the lab runs ([`kube`],
//! [`kubelet`], [`realnode`], [`kubeproxy`], [`coredns`], [`egress`],
//! [`forward`], [`gateway`], [`serve`]) and rolling upgrades ([`upgrade`]).

mod clusterdns;
mod daemon;
mod error;
mod kubemode;
mod lifecycle;
mod nodes;
mod pods;
mod probe;
mod process;
mod state;
mod store;

pub mod coredns;
pub mod egress;
pub mod forward;
pub mod gateway;
pub mod kube;
pub mod kubelet;
pub mod kubeproxy;
pub mod l7;
pub mod realnode;
pub mod router;
pub mod serve;
pub mod upgrade;

pub use clusterdns::{DNS_NAMESPACE, DNS_POD, DNS_SERVICE};
pub use daemon::{Daemon, AGENT_CAPS, DNS_CAPS, LB_IPAM_CAPS};
pub use error::LabError;
pub use lifecycle::UpOptions;
pub use process::SPAWN_MARK;
pub use serve::Reach;
pub use state::{Lab, LabState, NodeInfo, PodInfo, RUN_DIR};
