//! L2 announcement in real namespaces: a client and two nodes on one
//! Ethernet segment (a bridge in a "switch" namespace), the LoadBalancer
//! IP on no interface at all. The client's own kernel resolves the IP
//! (ARP, NDP) and pings it; the nodes accept its traffic through a
//! `local` route, as a node accepts traffic it DNATs, and are set up as
//! LoadBalancer nodes are (`arp_ignore=1`, `arp_announce=2`) so their
//! kernels never answer for the IP themselves: every answer the client
//! gets is our responder's.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use podnet_lb::l2::packet::format_mac;
use podnet_lb::l2::{Announce, L2Error, Responder};
use podnet_testkit::{eventually, TestNs};

const LB4: &str = "198.51.100.200";
const LB6: &str = "2001:db8:1::200";
/// Bounds every wait; generous for a shared 2-core machine.
const DEADLINE: Duration = Duration::from_secs(15);

/// The client (.1), node A (.10) and node B (.11) on one bridge, in
/// 198.51.100.0/24 and 2001:db8:1::/64.
struct Segment {
    client: TestNs,
    a: TestNs,
    b: TestNs,
    _switch: TestNs,
}

impl Segment {
    fn new() -> Segment {
        let switch = TestNs::new("l2s");
        let client = TestNs::new("l2c");
        let a = TestNs::new("l2a");
        let b = TestNs::new("l2b");
        switch.sh("ip link add br0 type bridge && ip link set br0 up");
        for (ns, port, host) in [(&client, "pc", 1), (&a, "pa", 10), (&b, "pb", 11)] {
            // No duplicate address detection: the addresses are usable at once.
            ns.sh("sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0");
            switch.sh(&format!(
                "ip link add {port} type veth peer name eth0 netns {} && ip link set {port} master br0 up",
                ns.name()
            ));
            ns.sh(&format!(
                "ip addr add 198.51.100.{host}/24 dev eth0 && \
                 ip -6 addr add 2001:db8:1::{host}/64 dev eth0 nodad && ip link set eth0 up"
            ));
        }
        for node in [&a, &b] {
            node.sh(&format!(
                "sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 && \
                 ip route add local {LB4}/32 dev lo && ip -6 route add local {LB6}/128 dev lo"
            ));
        }
        // A failed resolution fails in 3 x 0.2 s instead of 3 x 1 s.
        client.sh(
            "sysctl -qw net.ipv4.neigh.eth0.retrans_time_ms=200 net.ipv6.neigh.eth0.retrans_time_ms=200",
        );
        Segment {
            client,
            a,
            b,
            _switch: switch,
        }
    }

    /// The client's neighbour entry for `ip`, as `ip neigh` prints it.
    fn neigh(&self, ip: &str) -> String {
        let family = if ip.contains(':') { "-6" } else { "-4" };
        self.client
            .sh(&format!("ip {family} neigh show {ip} dev eth0"))
            .trim()
            .to_string()
    }

    /// The MAC the client has for `ip`, if it has one.
    fn neigh_mac(&self, ip: &str) -> Option<String> {
        let line = self.neigh(ip);
        let mut words = line.split_whitespace();
        words.find(|w| *w == "lladdr")?;
        words.next().map(str::to_string)
    }

    /// One ping from the client: whether a reply came, and what ping said.
    fn ping(&self, ip: &str) -> (bool, String) {
        self.client.try_sh(&format!("ping -n -c1 -W0.3 {ip}"))
    }

    /// One ping that waits long enough (2 s) for the client's resolution
    /// to fail (3 probes 0.2 s apart), so ping reports the failure.
    fn ping_until_resolution_fails(&self, ip: &str) -> (bool, String) {
        self.client.try_sh(&format!("ping -n -c1 -W2 {ip}"))
    }
}

fn start(ns: &TestNs) -> Responder {
    Responder::start_in(ns.netns(), "eth0", Announce::default())
        .unwrap_or_else(|e| panic!("starting the responder in {}: {e}", ns.name()))
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("a test address")
}

/// The owner answers the client's resolution; when it dies, the next
/// owner's announcements move the client over without the client
/// flushing anything, and pings flow again.
fn resolve_then_take_over(lb: &str) {
    let seg = Segment::new();
    let a = start(&seg.a);
    let b = start(&seg.b);
    a.set_owned([ip(lb)]);
    eventually("node A to announce its new IP", DEADLINE, || {
        a.stats().announcements >= 1
    });

    eventually(&format!("a ping of {lb} through node A"), DEADLINE, || {
        seg.ping(lb).0
    });
    assert_eq!(
        seg.neigh_mac(lb),
        Some(format_mac(&a.mac())),
        "{}",
        seg.neigh(lb)
    );
    assert!(
        a.stats().replies >= 1,
        "A answered the client's resolution: {:?}",
        a.stats()
    );
    assert_eq!(b.stats().replies, 0, "B owns nothing and answered nothing");

    // Node A dies: its link goes, and its responder with it.
    seg.a.sh("ip link set eth0 down");
    drop(a);
    let (ok, out) = seg.ping(lb);
    assert!(
        !ok,
        "with A gone and no new owner, {lb} must not answer: {out}"
    );

    let gained = Instant::now();
    b.set_owned([ip(lb)]);
    let b_mac = format_mac(&b.mac());
    eventually(
        &format!("the client's entry for {lb} to move to B"),
        DEADLINE,
        || seg.neigh_mac(lb).as_deref() == Some(b_mac.as_str()),
    );
    eventually(&format!("a ping of {lb} through node B"), DEADLINE, || {
        seg.ping(lb).0
    });
    println!(
        "takeover of {lb}: {:?} from B's gain to the client's first reply",
        gained.elapsed()
    );
    let stats = b.stats();
    assert!(stats.announcements >= 1, "{stats:?}");
    assert_eq!(stats.conflicts, 0, "nobody else claims {lb}");
    // The pings (ICMPv6 echo for IPv6) reached B, but the socket filter
    // let only Neighbor Discovery through to the responder.
    assert_eq!(stats.malformed, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv4_owner_answers_arp_and_another_node_takes_over() {
    resolve_then_take_over(LB4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_owner_answers_ndp_and_another_node_takes_over() {
    resolve_then_take_over(LB6);
}

/// A node answers only for what it owns: with the IP routed locally on
/// both nodes but owned by neither (or no longer owned), the client's
/// resolution fails, and ping says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ip_nobody_owns_is_not_answered() {
    let seg = Segment::new();
    let a = start(&seg.a);
    let b = start(&seg.b);
    a.set_owned([ip("198.51.100.201"), ip("2001:db8:1::201")]);

    let (ok, out) = seg.ping_until_resolution_fails(LB4);
    assert!(!ok && out.contains("Destination Host Unreachable"), "{out}");
    let entry = seg.neigh(LB4);
    assert!(
        entry.contains("FAILED") || entry.contains("INCOMPLETE"),
        "{entry}"
    );

    let (ok, out) = seg.ping_until_resolution_fails(LB6);
    assert!(!ok && out.contains("Address unreachable"), "{out}");
    let entry = seg.neigh(LB6);
    assert!(
        entry.contains("FAILED") || entry.contains("INCOMPLETE"),
        "{entry}"
    );
    assert_eq!((a.stats().replies, b.stats().replies), (0, 0));

    // Owned, it answers; no longer owned, it stops answering.
    a.set_owned([ip(LB4)]);
    eventually("a ping through node A", DEADLINE, || seg.ping(LB4).0);
    a.set_owned([]);
    eventually(
        "the IP to be unreachable once A no longer owns it",
        DEADLINE,
        || {
            seg.client.sh(&format!("ip neigh flush {LB4} dev eth0"));
            let (ok, out) = seg.ping_until_resolution_fails(LB4);
            !ok && out.contains("Destination Host Unreachable")
        },
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_announcement_from_another_mac_is_a_conflict() {
    // Split brain (both nodes believe they own the IP): each sees the
    // other's announcement and reports it.
    let seg = Segment::new();
    let a = start(&seg.a);
    let b = start(&seg.b);
    a.set_owned([ip(LB4), ip(LB6)]);
    b.set_owned([ip(LB4), ip(LB6)]);
    eventually("both nodes to report the conflict", DEADLINE, || {
        a.stats().conflicts >= 2 && b.stats().conflicts >= 2
    });
}

#[test]
fn start_names_the_interface_and_the_cause() {
    let ns = TestNs::new("l2e");
    ns.sh("ip link add eth0 type veth peer name eth1");
    let err = Responder::start_in(ns.netns(), "nope0", Announce::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "L2 announcement on nope0: no such interface"
    );
    let err = Responder::start_in(ns.netns(), "lo", Announce::default()).unwrap_err();
    assert!(matches!(err, L2Error::NotEthernet { .. }), "{err}");
    // No tokio runtime here: the sockets open, the task cannot start.
    let err = Responder::start_in(ns.netns(), "eth0", Announce::default()).unwrap_err();
    assert!(matches!(err, L2Error::NoRuntime { .. }), "{err}");

    // Without CAP_NET_RAW (dropped on one thread only) the socket cannot
    // be opened, and the error says so.
    let err = std::thread::scope(|s| {
        s.spawn(|| {
            drop_cap_net_raw();
            Responder::start_in(ns.netns(), "eth0", Announce::default()).unwrap_err()
        })
        .join()
        .expect("the thread without CAP_NET_RAW")
    });
    assert_eq!(
        err.to_string(),
        "L2 announcement on eth0: opening an AF_PACKET socket (needs CAP_NET_RAW): \
         Operation not permitted (os error 1)"
    );
}

/// Removes CAP_NET_RAW from the calling thread's effective set (Linux
/// capabilities are per thread; the raw syscall touches only this one).
fn drop_cap_net_raw() {
    const VERSION_3: u32 = 0x2008_0522;
    const CAP_NET_RAW: u32 = 13;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut hdr = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: header and two data structs, as capget(2) v3 takes them.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget: {}", std::io::Error::last_os_error());
    data[0].effective &= !(1 << CAP_NET_RAW);
    // SAFETY: as above.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", std::io::Error::last_os_error());
}

/// A node that was cut off comes back: the other node had taken its
/// address meanwhile (the client now points there) and gives it back as
/// the election says; the returning owner never lost it in its own view,
/// so only announcing again moves the client back to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_announces_again_and_the_client_comes_back() {
    let seg = Segment::new();
    let a = start(&seg.a);
    let b = start(&seg.b);
    let count = u64::from(Announce::default().count);
    a.set_owned([ip(LB4)]);
    eventually("a ping through node A", DEADLINE, || seg.ping(LB4).0);
    // A's announcements are over: nothing of A's is still on its way.
    eventually("node A's announcements sent", DEADLINE, || {
        a.stats().announcements >= count
    });
    let (mac_a, mac_b) = (format_mac(&a.mac()), format_mac(&b.mac()));
    b.set_owned([ip(LB4)]);
    eventually("the client moved to node B", DEADLINE, || {
        seg.neigh_mac(LB4).as_deref() == Some(mac_b.as_str())
    });
    eventually("node B's announcements sent", DEADLINE, || {
        b.stats().announcements >= count
    });
    b.set_owned([]);
    assert_eq!(seg.neigh_mac(LB4).as_deref(), Some(mac_b.as_str()));
    let before = a.stats().announcements;
    a.announce_again();
    eventually("the client back on node A", DEADLINE, || {
        seg.neigh_mac(LB4).as_deref() == Some(mac_a.as_str())
    });
    assert!(a.stats().announcements > before, "{:?}", a.stats());
}
