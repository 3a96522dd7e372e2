//! Traffic from outside and through the node: NodePorts, externalIPs,
//! LoadBalancer IPs and their source ranges, the external policy, and
//! Services without endpoints on every path.

use super::*;

#[test]
fn node_ports_external_ips_and_lb_ips() {
    let s = web(
        json!({"type": "LoadBalancer", "externalIPs": ["203.0.113.7"],
        "ports": [{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}],
        "loadBalancerSourceRanges": ["198.51.100.0/24"]}),
    );
    let mut s = s;
    s.status = serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "198.18.0.9"}]}}))
        .unwrap();
    let t = plan_for(&[s], &[two_eps()]);
    let np = Packet::new("198.51.100.20", NODE_IP, Proto::Tcp, 30080);
    let o = Tracer::new(&t)
        .with_local(&[NODE_IP])
        .incoming(&np, &mut |_| 0);
    assert!(
        o.dnat.is_some() && o.masquerade,
        "NodePort with Cluster policy: DNAT + masquerade ({o:?})"
    );
    let o = Tracer::new(&t).incoming(
        &Packet::new("198.51.100.20", "203.0.113.7", Proto::Tcp, 80),
        &mut |_| 0,
    );
    assert!(o.dnat.is_some(), "externalIP");
    let o = Tracer::new(&t).incoming(
        &Packet::new("198.51.100.20", "198.18.0.9", Proto::Tcp, 80),
        &mut |_| 0,
    );
    assert!(o.dnat.is_some(), "LB IP from an allowed range");
    let o = Tracer::new(&t).incoming(
        &Packet::new("192.0.2.1", "198.18.0.9", Proto::Tcp, 80),
        &mut |_| 0,
    );
    assert_eq!(
        o.fate,
        Fate::Drop,
        "LB IP from outside loadBalancerSourceRanges"
    );
    // A NodePort on a non-local address is not ours.
    let o = Tracer::new(&t).with_local(&[NODE_IP]).incoming(
        &Packet::new("198.51.100.20", "192.168.200.99", Proto::Tcp, 30080),
        &mut |_| 0,
    );
    assert_eq!(o.dnat, None);
}

#[test]
fn external_traffic_policy_local_keeps_source_and_uses_local_endpoints() {
    let s = web(json!({"type": "NodePort", "externalTrafficPolicy": "Local",
        "ports": [{"name": "http", "port": 80, "nodePort": 30081, "protocol": "TCP"}]}));
    let t = plan_for(std::slice::from_ref(&s), &[two_eps()]);
    let np = Packet::new("198.51.100.20", NODE_IP, Proto::Tcp, 30081);
    let mut tr = Tracer::new(&t).with_local(&[NODE_IP]);
    assert_eq!(
        tr.incoming_targets(&np, 6).len(),
        1,
        "only node1's endpoint"
    );
    let o = tr.incoming(&np, &mut |_| 0);
    assert_eq!(o.dnat, Some(("10.244.1.5".parse().unwrap(), Some(8080))));
    assert!(!o.masquerade, "client source preserved");
    // No local endpoint: dropped ("has no local endpoints"), not
    // rejected: the Service has endpoints, just not here.
    let remote_only = slice("web", &[("10.244.2.5", true, false, "node2")], 8080);
    let t = plan_for(&[s], &[remote_only]);
    let o = Tracer::new(&t)
        .with_local(&[NODE_IP])
        .incoming(&np, &mut |_| 0);
    assert_eq!((o.fate, o.dnat), (Fate::Drop, None));
}

#[test]
fn services_without_endpoints_reject_on_every_path_and_family() {
    let (services, _) = fast_and_chain();
    let mut lb = web(json!({"clusterIP": "10.96.0.52", "type": "LoadBalancer",
        "externalIPs": ["203.0.113.7"],
        "ports": [{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}]}));
    lb.metadata.name = Some("lb".into());
    lb.status =
        serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "198.18.0.9"}]}}))
            .unwrap();
    let mut all = services;
    all.push(lb);
    let t = plan_on(&node1(), &all, &[]);
    for (src, dst, port) in [
        ("10.244.3.9", "10.96.0.50", 80),
        ("10.244.3.9", "10.96.0.51", 80),
        ("10.244.3.9", "10.96.0.52", 80),
        ("198.51.100.20", "203.0.113.7", 80),
        ("198.51.100.20", "198.18.0.9", 80),
        ("198.51.100.20", NODE_IP, 30080),
        ("10.244.3.9", NODE_IP, 30080),
    ] {
        let p = Packet::new(src, dst, Proto::Tcp, port);
        assert_eq!(
            one(&t, &[NODE_IP], &p),
            (Fate::Reject, None, false),
            "{p:?}"
        );
    }
    // The reject rule is the family's own ICMP type (see the nft
    // netlink encoder); `reject` in the model text.
    assert_eq!(t.chains["reject-chain"].rules[0].text(), "reject");
}

#[test]
fn the_nodes_own_traffic_is_judged_after_nat_output() {
    // As upstream: the node's own traffic meets nat output first (a
    // Local policy short-circuits it to every endpoint), then the
    // endpoint checks; NodePorts nothing DNATed reach input, where
    // they are checked.
    let t = plan_on(&node1(), &[], &[]);
    let chain = |name: &str| {
        t.chains[name]
            .rules
            .iter()
            .flat_map(|r| r.exprs.iter())
            .filter_map(|e| match e {
                Expr::Verdict(Verdict::Jump(c)) => Some(c.clone()),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        chain("filter-input"),
        ["nodeport-endpoints-check", "service-endpoints-check"]
    );
    assert!(!t.chains.contains_key("filter-output"));
    assert_eq!(
        chain("filter-output-post-dnat"),
        ["service-endpoints-check", "cluster-ips-check"]
    );
    assert_eq!(
        chain("filter-forward"),
        ["service-endpoints-check", "cluster-ips-check"]
    );
}

#[test]
fn external_local_short_circuits_pods_and_the_node_to_every_endpoint() {
    let mut s = web(
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
        "externalIPs": ["203.0.113.7"],
        "ports": [{"name": "http", "port": 80, "nodePort": 30082, "protocol": "TCP"}]}),
    );
    s.status = serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "198.18.0.9"}]}}))
        .unwrap();
    let both = set(&["10.244.1.5:8080", "10.244.2.5:8080"]);
    for eps in [
        two_eps(),
        slice("web", &[("10.244.2.5", true, false, "node2")], 8080),
    ] {
        let t = plan_on(
            &node1(),
            std::slice::from_ref(&s),
            std::slice::from_ref(&eps),
        );
        let all: BTreeSet<String> = eps
            .endpoints
            .iter()
            .flatten()
            .map(|e| format!("{}:8080", e.addresses[0]))
            .collect();
        for (dst, port) in [("203.0.113.7", 80), ("198.18.0.9", 80), (NODE_IP, 30082)] {
            // From a pod: every endpoint, source kept.
            let p = Packet::new("10.244.3.9", dst, Proto::Tcp, port);
            let mut tr = Tracer::new(&t).with_local(&[NODE_IP]);
            let got: BTreeSet<String> = tr
                .incoming_targets(&p, 12)
                .into_iter()
                .map(|d| {
                    d.map(|(a, p)| format!("{a}:{}", p.unwrap_or(0)))
                        .unwrap_or_default()
                })
                .collect();
            assert_eq!(got, all, "pod to {dst}:{port}");
            assert!(!tr.incoming(&p, &mut |_| 0).masquerade);
            // From the node: every endpoint, masqueraded.
            let o = Tracer::new(&t)
                .with_local(&[NODE_IP])
                .local(&Packet::new(NODE_IP, dst, Proto::Tcp, port), &mut |_| 0);
            // With or without a local endpoint: upstream checks the
            // node's own traffic after nat output short-circuited it
            // (kube-proxy nftables does, podnet/tests/kubeproxy_diff.rs).
            assert!(
                o.dnat.is_some() && o.masquerade,
                "node to {dst}:{port}: {o:?}"
            );
            assert_eq!(o.fate, Fate::Accept, "node to {dst}:{port}: {o:?}");
        }
        // From outside: local endpoints only, or dropped without one.
        let ext = Packet::new("198.51.100.20", "203.0.113.7", Proto::Tcp, 80);
        if all == both {
            assert_eq!(
                one(&t, &[NODE_IP], &ext),
                (Fate::Accept, Some("10.244.1.5:8080".into()), false)
            );
        } else {
            assert_eq!(one(&t, &[NODE_IP], &ext), (Fate::Drop, None, false));
        }
    }
}

#[test]
fn local_policies_without_local_endpoints_drop_and_without_any_reject() {
    let remote = slice("web", &[("10.244.2.5", true, false, "node2")], 8080);
    let int = web(json!({"internalTrafficPolicy": "Local"}));
    let p = Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80);
    let t = plan_on(
        &node1(),
        std::slice::from_ref(&int),
        std::slice::from_ref(&remote),
    );
    assert_eq!(
        one(&t, &[NODE_IP], &p),
        (Fate::Drop, None, false),
        "iTP Local, none here"
    );
    let t = plan_on(&node1(), std::slice::from_ref(&int), &[]);
    assert_eq!(
        one(&t, &[NODE_IP], &p),
        (Fate::Reject, None, false),
        "no endpoints at all"
    );
    let ext = web(json!({"type": "NodePort", "externalTrafficPolicy": "Local",
        "ports": [{"name": "http", "port": 80, "nodePort": 30083, "protocol": "TCP"}]}));
    let np = Packet::new("198.51.100.20", NODE_IP, Proto::Tcp, 30083);
    let t = plan_on(
        &node1(),
        std::slice::from_ref(&ext),
        std::slice::from_ref(&remote),
    );
    assert_eq!(
        one(&t, &[NODE_IP], &np),
        (Fate::Drop, None, false),
        "eTP Local, none here"
    );
    let t = plan_on(&node1(), std::slice::from_ref(&ext), &[]);
    assert_eq!(
        one(&t, &[NODE_IP], &np),
        (Fate::Reject, None, false),
        "no endpoints at all"
    );
}

#[test]
fn lb_source_ranges_admit_the_lb_ips_when_a_range_holds_the_node() {
    let lb = |ranges: &[&str]| {
        let mut s = web(
            json!({"type": "LoadBalancer", "loadBalancerSourceRanges": ranges,
            "ports": [{"name": "http", "port": 80, "nodePort": 30084, "protocol": "TCP"}]}),
        );
        s.status =
            serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "198.18.0.9"}]}}))
                .unwrap();
        s
    };
    let from_vip = Packet::new("198.18.0.9", "198.18.0.9", Proto::Tcp, 80);
    let t = plan_on(&node1(), &[lb(&["192.168.200.0/24"])], &[two_eps()]);
    assert!(
        one(&t, &[NODE_IP], &from_vip).1.is_some(),
        "range holds the node IP"
    );
    let ok = Packet::new("192.168.200.50", "198.18.0.9", Proto::Tcp, 80);
    assert!(one(&t, &[NODE_IP], &ok).1.is_some());
    let t = plan_on(&node1(), &[lb(&["198.51.100.0/24"])], &[two_eps()]);
    assert_eq!(one(&t, &[NODE_IP], &from_vip), (Fate::Drop, None, false));
}

#[test]
fn node_ports_only_on_the_nodeport_addresses_never_loopback() {
    let s = web(json!({"type": "NodePort", "sessionAffinity": "None",
        "ports": [{"name": "http", "port": 80, "nodePort": 30085, "protocol": "TCP"}]}));
    let node = NodeInfo {
        nodeport_ips: Some(vec![NODE_IP.parse().unwrap(), "127.0.0.1".parse().unwrap()]),
        ..node1()
    };
    let t = plan_on(&node, std::slice::from_ref(&s), &[two_eps()]);
    assert_eq!(
        t.sets["nodeport-ips"].elements.keys().collect::<Vec<_>>(),
        vec![&vec![Value::Addr(NODE_IP.parse().unwrap())]],
        "loopback is never a NodePort address"
    );
    let local = [NODE_IP, "10.99.0.1", "127.0.0.1"];
    let at = |dst: &str| {
        let o = Tracer::new(&t)
            .with_local(&local)
            .local(&Packet::new(NODE_IP, dst, Proto::Tcp, 30085), &mut |_| 0);
        o.dnat
    };
    assert!(at(NODE_IP).is_some());
    assert_eq!(at("10.99.0.1"), None, "another local address");
    assert_eq!(at("127.0.0.1"), None, "loopback");
    // Without a list (`0.0.0.0/0`): every local address but loopback.
    let t = plan_on(&node1(), std::slice::from_ref(&s), &[two_eps()]);
    let at = |dst: &str| {
        Tracer::new(&t)
            .with_local(&local)
            .local(&Packet::new(NODE_IP, dst, Proto::Tcp, 30085), &mut |_| 0)
            .dnat
    };
    assert!(at("10.99.0.1").is_some());
    assert_eq!(at("127.0.0.1"), None);
}
