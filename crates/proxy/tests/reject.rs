//! What a client of the node sees, for real: a pod namespace behind a node
//! namespace that runs the proxier and has a default route, as every real
//! node does, via a gateway namespace that does not forward. So "refused"
//! can only come from the proxy's reject rule, not from a missing route,
//! and "dropped on the node" is told from "left the node" by a counter on
//! the gateway.
//!
//! ```text
//!  pod (client)            node (proxier)              gateway (no forwarding)
//!  eth0 10.244.1.2 ─────── n0 10.244.1.1
//!                          n1 192.168.77.10 ────────── eth0 192.168.77.1
//!                          default via 192.168.77.1
//! ```

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

mod common;

use common::{kv, put};
use podnet_proxy::proxier::Proxier;
use podnet_proxy::rules::Stack;
use podnet_testkit::TestNs;

fn service(name: &str, cips: &[&str]) -> podnet_api::Object {
    kv(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"clusterIP": cips[0], "clusterIPs": cips, "ipFamilies": ["IPv4", "IPv6"],
                 "ports": [{"name": "tcp", "port": 80, "protocol": "TCP"},
                           {"name": "udp", "port": 53, "protocol": "UDP"}]}
    }))
}

fn slice(name: &str, family: &str, addr: &str) -> podnet_api::Object {
    kv(serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-{family}"), "namespace": "default",
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": family,
        "endpoints": [{"addresses": [addr]}],
        "ports": [{"name": "tcp", "port": 8080, "protocol": "TCP"},
                  {"name": "udp", "port": 5353, "protocol": "UDP"}]
    }))
}

struct Lab {
    pod: TestNs,
    node: TestNs,
    gw: TestNs,
}

fn lab(tag: &str) -> Lab {
    let (pod, node, gw) = (
        TestNs::new(&format!("rj-{tag}-p")),
        TestNs::new(&format!("rj-{tag}-n")),
        TestNs::new(&format!("rj-{tag}-g")),
    );
    let (p, g) = (pod.name(), gw.name());
    node.sh(&format!(
        "ip link add n0 type veth peer name eth0 netns {p} && \
         ip link add n1 type veth peer name eth0 netns {g} && \
         ip addr add 10.244.1.1/24 dev n0 && \
         ip addr add fd00:244:0:1::1/64 dev n0 nodad && \
         ip addr add 192.168.77.10/24 dev n1 && \
         ip addr add fd00:77::10/64 dev n1 nodad && \
         ip link set n0 up && ip link set n1 up && \
         ip route add default via 192.168.77.1 && \
         ip -6 route add default via fd00:77::1 && \
         sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1"
    ));
    pod.sh("ip addr add 10.244.1.2/24 dev eth0 && \
         ip addr add fd00:244:0:1::2/64 dev eth0 nodad && \
         ip link set eth0 up && \
         ip route add default via 10.244.1.1 && \
         ip -6 route add default via fd00:244:0:1::1");
    gw.sh("ip addr add 192.168.77.1/24 dev eth0 && \
         ip addr add fd00:77::1/64 dev eth0 nodad && \
         ip link set eth0 up && \
         sysctl -qw net.ipv4.ip_forward=0 net.ipv6.conf.all.forwarding=0");
    // What reaches the gateway for a Service address has left the node.
    gw.nft("add table inet count");
    gw.nft("add chain inet count in '{ type filter hook prerouting priority 0; }'");
    gw.nft("add rule inet count in ip daddr 10.96.0.0/11 counter");
    gw.nft("add rule inet count in ip6 daddr fd00:96::/64 counter");
    Lab { pod, node, gw }
}

impl Lab {
    /// Packets to the Service ranges that reached the gateway.
    fn leaked(&self) -> u64 {
        let out = self.gw.nft("list table inet count");
        out.split("packets ")
            .skip(1)
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }

    fn in_pod<T>(&self, f: impl FnOnce() -> T) -> T {
        self.pod.run(f)
    }

    fn in_node<T>(&self, f: impl FnOnce() -> T) -> T {
        self.node.run(f)
    }
}

fn tcp(addr: &str) -> ErrorKind {
    let a: SocketAddr = addr.parse().unwrap();
    match TcpStream::connect_timeout(&a, Duration::from_secs(3)) {
        Ok(_) => panic!("{addr}: connected"),
        Err(e) => e.kind(),
    }
}

fn udp(addr: &str) -> ErrorKind {
    let a: SocketAddr = addr.parse().unwrap();
    let bind = if a.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" };
    let s = UdpSocket::bind(bind).unwrap();
    s.connect(a).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut buf = [0u8; 64];
    if let Err(e) = s.send(b"hello") {
        // Sent from the node itself, the datagram meets the verdict in the
        // output hook and send() fails at once (EPERM, as for any packet
        // its own netfilter refuses). A reject also sends the ICMP error,
        // which the socket then reports: that, not EPERM, tells a reject
        // from a drop.
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{addr}: send");
    }
    match s.recv(&mut buf) {
        Ok(_) => panic!("{addr}: answered"),
        Err(e) => e.kind(),
    }
}

fn timed_out(k: ErrorKind) -> bool {
    matches!(k, ErrorKind::TimedOut | ErrorKind::WouldBlock)
}

/// A Service without endpoints is refused at once, for TCP and UDP, from a
/// pod (forward hook) and from the node itself (output hook), over IPv4
/// (ICMP port unreachable) and IPv6 (ICMPv6 port unreachable); an unserved
/// port of a ClusterIP is refused, an unheld Service address is dropped on
/// the node, and nothing for the Service ranges leaves the node.
#[test]
fn endpointless_services_are_refused_and_unheld_addresses_dropped_on_the_node() {
    let l = lab("a");
    l.in_node(|| {
        let stacks = [
            Stack::v4("10.244.0.0/16".parse().unwrap())
                .with_service_cidr(Some("10.96.0.0/12".parse().unwrap())),
            Stack::v6(Some("fd00:244::/48".parse().unwrap()))
                .with_service_cidr(Some("fd00:96::/108".parse().unwrap())),
        ];
        for stack in stacks {
            let mut p = Proxier::new("n1", vec![stack], podnet_daemon::Metrics::new()).unwrap();
            p.watch(&put(service("empty", &["10.96.0.50", "fd00:96::50"])));
            p.watch(&put(service("full", &["10.96.0.51", "fd00:96::51"])));
            p.watch(&put(slice("full", "IPv4", "10.244.1.2")));
            p.watch(&put(slice("full", "IPv6", "fd00:244:0:1::2")));
            assert!(p.sync().unwrap() > 0);
        }
    });
    // Positive control: an address outside the Service CIDR that nothing
    // handles follows the default route and reaches the gateway, which
    // drops it. This is what every case below must NOT do.
    assert_eq!(l.leaked(), 0);
    assert!(timed_out(l.in_pod(|| tcp("10.112.0.1:80"))));
    assert!(l.leaked() > 0, "the control packet must reach the gateway");
    let before = l.leaked();

    for who in ["pod", "node"] {
        let run = |f: &dyn Fn() -> ErrorKind| {
            if who == "pod" {
                l.in_pod(f)
            } else {
                l.in_node(f)
            }
        };
        for (what, addr) in [
            ("no endpoints, TCP", "10.96.0.50:80"),
            ("no endpoints, TCP, IPv6", "[fd00:96::50]:80"),
            ("unserved port of a ClusterIP", "10.96.0.51:81"),
            ("unserved port of a ClusterIP, IPv6", "[fd00:96::51]:81"),
        ] {
            assert_eq!(
                run(&|| tcp(addr)),
                ErrorKind::ConnectionRefused,
                "{who}: {what} ({addr})"
            );
        }
        for (what, addr) in [
            ("no endpoints, UDP", "10.96.0.50:53"),
            ("no endpoints, UDP, IPv6", "[fd00:96::50]:53"),
        ] {
            assert_eq!(
                run(&|| udp(addr)),
                ErrorKind::ConnectionRefused,
                "{who}: {what} ({addr})"
            );
        }
        // An address of the Service CIDR no Service holds: no answer, and
        // nothing left the node.
        for addr in ["10.96.0.99:80", "[fd00:96::99]:80"] {
            let k = run(&|| tcp(addr));
            assert!(
                timed_out(k),
                "{who}: {addr} gave {k:?}, expected a silent drop"
            );
        }
    }
    assert_eq!(
        l.leaked(),
        before,
        "a packet for the Service ranges left the node"
    );
}
