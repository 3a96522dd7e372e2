//! The encrypted overlay's tunnel between two namespaces playing nodes
//! (a veth as their underlay, a `podnet.wg` TUN device and a tunnel
//! each): TCP between their pod addresses goes through, in WireGuard's
//! messages; what does not authenticate gets nothing through, and each
//! refusal is counted as one.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::Ordering;
use std::time::Duration;

use boringtun::x25519::{PublicKey, StaticSecret};
use podnet_kernel::{Handle, Route};
use podnet_overlay::wg::{WgTunnel, PORT};
use podnet_testkit::{eventually, TestNs};

struct Node {
    ns: TestNs,
    tunnel: WgTunnel,
    public: [u8; 32],
}

fn secret(seed: u8) -> StaticSecret {
    StaticSecret::from([seed; 32])
}

/// A node at `192.168.77.<i>` on the veth `dev`, pods 10.99.<i>.0/24, the
/// TUN device holding 10.99.<i>.1.
fn node(ns: TestNs, dev: &str, i: u8) -> Node {
    ns.sh(&format!(
        "ip addr add 192.168.77.{i}/24 dev {dev} && ip link set {dev} up"
    ));
    let s = secret(i);
    let public = PublicKey::from(&s).to_bytes();
    let tunnel = ns.run(|| {
        let tun = podnet_kernel::tun::open_tun("podnet.wg").unwrap();
        let mut h = Handle::new().unwrap();
        let l = h.require_link("podnet.wg").unwrap();
        h.set_mtu(l.index, 1440).unwrap();
        h.add_addr(l.index, format!("10.99.{i}.1/32").parse().unwrap(), true)
            .unwrap();
        h.set_up(l.index).unwrap();
        h.add_route(&Route {
            dst: Some("10.99.0.0/16".parse().unwrap()),
            oif: Some(l.index),
            ..Default::default()
        })
        .unwrap();
        WgTunnel::start(tun, format!("192.168.77.{i}").parse().unwrap(), PORT, s).unwrap()
    });
    Node { ns, tunnel, public }
}

fn pair(tag: &str) -> (Node, Node) {
    let (a, b) = (
        TestNs::new(&format!("{tag}a")),
        TestNs::new(&format!("{tag}b")),
    );
    a.sh(&format!(
        "ip link add wg0 type veth peer name wg0 netns {}",
        b.name()
    ));
    (node(a, "wg0", 1), node(b, "wg0", 2))
}

fn peer(n: &Node, i: u8) -> (Vec<ipnet::IpNet>, std::net::Ipv4Addr, [u8; 32]) {
    (
        vec![format!("10.99.{i}.0/24").parse().unwrap()],
        format!("192.168.77.{i}").parse().unwrap(),
        n.public,
    )
}

/// A TCP round trip from `from` (its pod address) to 10.99.2.1:`port`.
fn round_trip(from: &Node, to: &Node, port: u16, payload: &[u8]) -> std::io::Result<Vec<u8>> {
    let l = to
        .ns
        .run(|| TcpListener::bind(("10.99.2.1", port)))
        .unwrap();
    let srv = std::thread::spawn(move || {
        let (mut s, _) = l.accept()?;
        let mut got = Vec::new();
        s.read_to_end(&mut got)?;
        Ok::<_, std::io::Error>(got)
    });
    let sent = from.ns.run(|| {
        let to: SocketAddr = format!("10.99.2.1:{port}").parse().unwrap();
        let mut c = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
        c.write_all(payload)
    });
    match sent {
        Ok(()) => srv.join().unwrap(),
        Err(e) => Err(e),
    }
}

#[test]
fn pods_talk_through_the_tunnel_and_the_wrong_key_gets_nothing() {
    let (a, b) = pair("wg");
    a.tunnel.set_peers(vec![peer(&b, 2)]);
    b.tunnel.set_peers(vec![peer(&a, 1)]);
    // 1 MiB each way through: segmented, encrypted, batched, glued back.
    let payload: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    let got = round_trip(&a, &b, 7001, &payload).expect("through the tunnel");
    assert_eq!(got.len(), payload.len());
    assert!(got == payload, "the bytes arrived as sent");
    let (sent, received) = (
        a.tunnel.counters.sent.load(Ordering::Relaxed),
        b.tunnel.counters.received.load(Ordering::Relaxed),
    );
    assert!(
        sent > 100 && received > 100,
        "sent {sent}, received {received}"
    );
    assert_eq!(b.tunnel.counters.rejected.load(Ordering::Relaxed), 0);

    // A plain datagram in the udp backend's format (an IPv4 packet for a
    // pod), from a known peer's address: not WireGuard, refused.
    let before = b.tunnel.counters.rejected.load(Ordering::Relaxed);
    let victim = b.ns.run(|| UdpSocket::bind("10.99.2.1:7002")).unwrap();
    victim.set_nonblocking(true).unwrap();
    a.ns.run(|| {
        let s = UdpSocket::bind("192.168.77.1:0").unwrap();
        s.send_to(&forged_udp(*b"let me in"), "192.168.77.2:51820")
            .unwrap();
    });
    eventually(
        "the forged datagram is counted",
        Duration::from_secs(5),
        || b.tunnel.counters.rejected.load(Ordering::Relaxed) > before,
    );
    let mut buf = [0u8; 64];
    assert!(victim.recv(&mut buf).is_err(), "nothing reached the pod");

    // Through a's real session, a packet whose source is a third node's
    // pod (10.99.3.5): authentic, but not a's to send; refused.
    let before = b.tunnel.counters.rejected.load(Ordering::Relaxed);
    let mut spoofed = forged_udp(*b"spoofed");
    spoofed[14] = 3;
    spoofed[15] = 5;
    spoofed[10..12].copy_from_slice(&[0, 0]);
    let sum = ipv4_checksum(&spoofed[..20]);
    spoofed[10..12].copy_from_slice(&sum.to_be_bytes());
    a.ns.run(|| send_raw(&spoofed, [10, 99, 2, 1]));
    eventually(
        "the spoofed packet is counted",
        Duration::from_secs(5),
        || b.tunnel.counters.rejected.load(Ordering::Relaxed) > before,
    );
    assert!(
        victim.recv(&mut buf).is_err(),
        "the spoofed packet reached the pod"
    );
}

/// Sends a whole IPv4 packet (header included) from this namespace.
fn send_raw(pkt: &[u8], dst: [u8; 4]) {
    // SAFETY: plain socket calls on a descriptor owned here.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW);
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        let to = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(dst),
            },
            sin_zero: [0; 8],
        };
        let n = libc::sendto(
            fd,
            pkt.as_ptr() as *const libc::c_void,
            pkt.len(),
            0,
            &to as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(n, pkt.len() as isize, "{}", std::io::Error::last_os_error());
        libc::close(fd);
    }
}

#[test]
fn a_node_with_the_wrong_key_is_refused() {
    let (a, b) = pair("wk");
    // a believes b's key is another one: its handshake does not open at b.
    let mut wrong = peer(&b, 2);
    wrong.2 = PublicKey::from(&secret(9)).to_bytes();
    a.tunnel.set_peers(vec![wrong]);
    b.tunnel.set_peers(vec![peer(&a, 1)]);
    let r = round_trip(&a, &b, 7003, b"hello");
    assert!(r.is_err(), "the connection went through: {r:?}");
    assert!(
        b.tunnel.counters.rejected.load(Ordering::Relaxed) > 0,
        "refused by b's tunnel (a handshake that does not authenticate)"
    );
    assert_eq!(b.tunnel.counters.received.load(Ordering::Relaxed), 0);
    // With the right key, the same pair talks.
    a.tunnel.set_peers(vec![peer(&b, 2)]);
    assert_eq!(round_trip(&a, &b, 7004, b"hello").unwrap(), b"hello");
}

/// An IPv4/UDP packet from 10.99.1.1 to 10.99.2.1:7002 carrying `body`
/// (checksum left 0, which UDP over IPv4 allows).
fn forged_udp<const N: usize>(body: [u8; N]) -> Vec<u8> {
    let len = 28 + N;
    let mut p = vec![
        0x45,
        0,
        (len >> 8) as u8,
        len as u8,
        0,
        0,
        0x40,
        0,
        64,
        17,
        0,
        0,
    ];
    p.extend_from_slice(&[10, 99, 1, 1, 10, 99, 2, 1]);
    let sum = ipv4_checksum(&p);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    p.extend_from_slice(&[0x1b, 0x5a, 0x1b, 0x5a, 0, (8 + N) as u8, 0, 0]);
    p.extend_from_slice(&body);
    p
}

fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut s: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}
