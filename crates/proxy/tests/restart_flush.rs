//! A restarted proxy's first sync flushes the UDP conntrack entries its
//! predecessor left towards endpoints a Service no longer has (kube-proxy's
//! conntrack reconciler), against the kernel in a throwaway namespace.

mod common;

use std::net::UdpSocket;

use podnet_testkit::TestNs;

/// Which of the sockets receives the next datagram (within a bound).
fn first_to_receive(socks: &[&UdpSocket]) -> Option<usize> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    for s in socks {
        s.set_read_timeout(Some(std::time::Duration::from_millis(50)))
            .unwrap();
    }
    while std::time::Instant::now() < deadline {
        for (i, s) in socks.iter().enumerate() {
            let mut b = [0u8; 16];
            if let Ok((_, from)) = s.recv_from(&mut b) {
                s.send_to(b"answer", from).unwrap();
                return Some(i);
            }
        }
    }
    None
}

/// A Service's UDP endpoint changed while no agent ran (the old agent
/// stopped before it flushed; its successor never knew the old endpoint):
/// the new agent's first, full sync must still stop the client's entry
/// from steering it to the old endpoint. On real kubelets this lost DNS
/// queries whenever the agents and the DNS pods rolled together.
#[test]
fn a_restarted_proxy_flushes_entries_to_endpoints_it_no_longer_has() {
    use common::{kv, put};
    use podnet_proxy::{Proxier, Stack};
    let ns = TestNs::new("ctr");
    ns.sh("ip link set lo up && ip addr add 10.244.0.4/32 dev lo && \
         ip addr add 10.244.1.2/32 dev lo && ip addr add 10.244.1.3/32 dev lo && \
         ip route add 10.96.0.0/16 dev lo");
    let stack = Stack::v4("10.244.0.0/16".parse().unwrap())
        .with_service_cidr(Some("10.96.0.0/16".parse().unwrap()));
    let service = kv(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "dns", "namespace": "kube-system"},
        "spec": {"clusterIP": "10.96.0.10",
                 "ports": [{"port": 53, "protocol": "UDP", "targetPort": 5353}]}
    }));
    let slice = |ip: &str| {
        kv(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "dns-1", "namespace": "kube-system",
                         "labels": {"kubernetes.io/service-name": "dns"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
            "ports": [{"port": 5353, "protocol": "UDP"}]
        }))
    };
    let agent = |ep: &str| {
        let mut p = Proxier::new("n1", vec![stack], podnet_daemon::Metrics::new()).unwrap();
        p.watch(&put(service.clone()));
        p.watch(&put(slice(ep)));
        assert!(p.sync().unwrap() > 0);
    };
    ns.run(|| {
        let old = UdpSocket::bind("10.244.1.2:5353").unwrap();
        let new = UdpSocket::bind("10.244.1.3:5353").unwrap();
        let client = UdpSocket::bind("10.244.0.4:0").unwrap();
        client.connect("10.96.0.10:53").unwrap();
        // The first agent: the Service's endpoint is `old`.
        agent("10.244.1.2");
        client.send(b"q1").unwrap();
        assert_eq!(first_to_receive(&[&old, &new]), Some(0));
        // It stops (the table stays); the endpoint moves to `new`; the
        // next agent starts with a full sync.
        agent("10.244.1.3");
        client.send(b"q2").unwrap();
        match first_to_receive(&[&old, &new]) {
            Some(1) => {}
            Some(0) => panic!("the client's conntrack entry still leads to the old endpoint"),
            _ => panic!("neither endpoint received the query"),
        }
    });
}
