//! The lab gateway's leak table against the kernel: a client namespace
//! whose default route is a gateway namespace holding the table. What the
//! client sends past the gateway is counted and noted, a second sync changes
//! nothing (the count and the flows stay), what is deleted behind the lab's
//! back comes back, and deleting the table removes it.
//!
//! ```text
//!  client                        gateway (leak table)
//!  eth0 192.168.77.2 ─────────── eth0 192.168.77.1
//!  default via 192.168.77.1
//! ```

use std::net::{IpAddr, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use podnet_kernel::rtnl::Route;
use podnet_kernel::{Handle, Netns};
use podnet_lab::gateway::{self, Leaks};
use podnet_nft::model::Family;
use podnet_nft::netlink::Conn;

/// Namespaces removed when dropped (even on panic).
struct Guard(Vec<String>);

impl Drop for Guard {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Netns::delete_named(n);
        }
    }
}

fn nft(ns: &str, args: &str) -> String {
    let out = std::process::Command::new("sh")
        .args(["-c", &format!("ip netns exec {ns} nft {args}")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nft {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until the leak count reaches `n` (the packet crossed the veth).
fn wait_for(gw: &Netns, n: u64) -> Leaks {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let l = gateway::leaks(gw).unwrap();
        if l.packets >= n {
            return l;
        }
        assert!(
            Instant::now() < deadline,
            "leak count stuck at {} (want {n})",
            l.packets
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn send(client: &Netns, to: &str) {
    client
        .run(|| {
            UdpSocket::bind("0.0.0.0:0")
                .unwrap()
                .send_to(b"leak", to)
                .unwrap();
        })
        .unwrap();
}

#[test]
fn leak_table_counts_resyncs_repairs_and_goes() {
    static N: AtomicUsize = AtomicUsize::new(0);
    let id = format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let (cname, gname) = (format!("pn-gwc-{id}"), format!("pn-gwg-{id}"));
    let _guard = Guard(vec![cname.clone(), gname.clone()]);
    let client = Netns::create_named(&cname).unwrap();
    let gw = Netns::create_named(&gname).unwrap();

    let mut ch = Handle::in_netns(&client).unwrap();
    ch.create_veth("eth0", "eth0", Some(gw.fd()), None, None)
        .unwrap();
    let e = ch.require_link("eth0").unwrap();
    ch.add_addr(e.index, "192.168.77.2/24".parse().unwrap(), true)
        .unwrap();
    ch.set_up(e.index).unwrap();
    ch.set_up_by_name("lo").unwrap();
    ch.add_route(&Route {
        dst: None,
        gateway: Some("192.168.77.1".parse().unwrap()),
        oif: Some(e.index),
        ..Default::default()
    })
    .unwrap();
    let mut gh = Handle::in_netns(&gw).unwrap();
    let p = gh.require_link("eth0").unwrap();
    gh.add_addr(p.index, "192.168.77.1/24".parse().unwrap(), true)
        .unwrap();
    gh.set_up(p.index).unwrap();

    let first = gw.run(gateway::sync_table).unwrap().unwrap();
    assert!(!first.is_empty());
    assert_eq!(gw.run(gateway::sync_table).unwrap().unwrap(), vec![]);
    assert_eq!(gateway::leaks(&gw).unwrap(), Leaks::default());

    // Past the gateway: counted, noted, dropped. To it: neither.
    send(&client, "192.168.77.1:9");
    send(&client, "198.51.100.7:9");
    let l = wait_for(&gw, 1);
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(l.packets, 1, "only the packet not for the gateway");
    assert_eq!(
        l.flows.into_iter().collect::<Vec<_>>(),
        vec![(ip("192.168.77.2"), ip("198.51.100.7"))]
    );
    let listed = nft(&gname, "list table inet podnet-lab-gateway");
    assert!(
        listed.contains("iifname \"eth0\" meta pkttype host fib daddr type != local goto leaked"),
        "{listed}"
    );

    // The kernel filled the flow set and counted: still no change to make.
    assert_eq!(gw.run(gateway::sync_table).unwrap().unwrap(), vec![]);

    // Behind the lab's back: a rule goes, then the whole table.
    nft(&gname, "flush chain inet podnet-lab-gateway leaked");
    assert!(!gw.run(gateway::sync_table).unwrap().unwrap().is_empty());
    assert_eq!(gw.run(gateway::sync_table).unwrap().unwrap(), vec![]);
    assert_eq!(
        gateway::leaks(&gw).unwrap().packets,
        1,
        "the count survives"
    );
    send(&client, "198.51.100.8:9");
    assert_eq!(wait_for(&gw, 2).flows.len(), 2);
    nft(&gname, "delete table inet podnet-lab-gateway");
    assert!(gateway::leaks(&gw).is_err(), "no table, no count");
    assert!(!gw.run(gateway::sync_table).unwrap().unwrap().is_empty());
    assert_eq!(gateway::leaks(&gw).unwrap(), Leaks::default());
    send(&client, "198.51.100.9:9");
    assert_eq!(wait_for(&gw, 1).packets, 1);

    assert!(gw
        .run(|| Conn::open()
            .unwrap()
            .delete_table(Family::Inet, gateway::TABLE))
        .unwrap()
        .unwrap());
    assert_eq!(nft(&gname, "list tables"), "");
}
