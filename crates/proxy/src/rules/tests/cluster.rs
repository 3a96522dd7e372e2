//! ClusterIP traffic: distribution over endpoints, hairpin, affinity,
//! the internal policy, topology hints, and what a ClusterIP does not serve.

use super::*;

/// The packet tracer table: (flow) -> (verdict, DNAT targets, masquerade).
#[test]
fn cluster_ip_distributes_over_ready_endpoints_without_masquerade_from_pods() {
    let t = plan_for(&[web(json!({}))], &[two_eps()]);
    let from_pod = Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80);
    assert_eq!(
        targets(&t, &from_pod),
        BTreeSet::from(["10.244.1.5:8080".to_string(), "10.244.2.5:8080".to_string()])
    );
    let o = Tracer::new(&t).incoming(&from_pod, &mut |_| 0);
    assert_eq!(o.fate, Fate::Accept);
    assert!(!o.masquerade, "pod-to-Service keeps the pod's source");
    // From outside the cluster CIDR: masqueraded.
    let o = Tracer::new(&t).incoming(
        &Packet::new("192.168.200.50", "10.96.0.50", Proto::Tcp, 80),
        &mut |_| 1,
    );
    assert_eq!(o.dnat, Some(("10.244.2.5".parse().unwrap(), Some(8080))));
    assert!(o.masquerade);
    // Wrong port or protocol: not DNATed, and rejected on the node
    // (kube-proxy's cluster-ips-check) instead of leaving it.
    let o = Tracer::new(&t).incoming(
        &Packet::new("10.244.3.9", "10.96.0.50", Proto::Udp, 80),
        &mut |_| 0,
    );
    assert_eq!((o.fate, o.dnat), (Fate::Reject, None));
}

#[test]
fn hairpin_is_masqueraded() {
    let t = plan_for(&[web(json!({}))], &[two_eps()]);
    let o = Tracer::new(&t).incoming(
        &Packet::new("10.244.1.5", "10.96.0.50", Proto::Tcp, 80),
        &mut |_| 0,
    );
    assert_eq!(o.dnat, Some(("10.244.1.5".parse().unwrap(), Some(8080))));
    assert!(
        o.masquerade,
        "an endpoint reaching itself must be masqueraded"
    );
}

#[test]
fn no_usable_endpoints_rejects_and_terminating_are_a_fallback() {
    let t = plan_for(&[web(json!({}))], &[]);
    let o = Tracer::new(&t).incoming(
        &Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80),
        &mut |_| 0,
    );
    assert_eq!(o.fate, Fate::Reject);
    let only_term = slice(
        "web",
        &[
            ("10.244.1.5", false, true, "node1"),
            ("10.244.1.6", false, false, "node1"),
        ],
        8080,
    );
    let t = plan_for(&[web(json!({}))], &[only_term]);
    assert_eq!(
        targets(&t, &Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80)),
        BTreeSet::from(["10.244.1.5:8080".to_string()])
    );
    let mixed = slice(
        "web",
        &[
            ("10.244.1.5", false, true, "node1"),
            ("10.244.1.7", true, false, "node1"),
        ],
        8080,
    );
    let t = plan_for(&[web(json!({}))], &[mixed]);
    assert_eq!(
        targets(&t, &Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80)),
        BTreeSet::from(["10.244.1.7:8080".to_string()])
    );
}

#[test]
fn internal_traffic_policy_local() {
    let t = plan_for(
        &[web(json!({"internalTrafficPolicy": "Local"}))],
        &[two_eps()],
    );
    let p = Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80);
    assert_eq!(
        targets(&t, &p),
        BTreeSet::from(["10.244.1.5:8080".to_string()])
    );
}

#[test]
fn session_affinity_sticks() {
    let t = plan_for(&[web(json!({"sessionAffinity": "ClientIP"}))], &[two_eps()]);
    assert!(t
        .sets
        .values()
        .any(|s| s.timeout == Some(DEFAULT_AFFINITY_TIMEOUT)));
    let mut tr = Tracer::new(&t);
    let p = Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80);
    let first = tr.incoming(&p, &mut |_| 1).dnat;
    for draw in [0, 0, 1, 0] {
        assert_eq!(
            tr.incoming(&p, &mut |_| draw).dnat,
            first,
            "affinity must stick"
        );
    }
    let other = tr
        .incoming(
            &Packet::new("10.244.3.10", "10.96.0.50", Proto::Tcp, 80),
            &mut |_| 0,
        )
        .dnat;
    assert_ne!(other, first);
}

#[test]
fn unserved_ports_of_cluster_ips_reject_and_unallocated_service_addresses_drop() {
    let (services, slices) = fast_and_chain();
    let t = plan_on(&node1(), &services, &slices);
    assert!(
        t.sets["fast-services"].elements.len() == 1,
        "web is on the fast path"
    );
    for cip in ["10.96.0.50", "10.96.0.51"] {
        // The served port is DNATed on both paths ...
        let (fate, dnat, _) = one(
            &t,
            &[NODE_IP],
            &Packet::new("10.244.3.9", cip, Proto::Tcp, 80),
        );
        assert_eq!(fate, Fate::Accept);
        assert!(dnat.is_some(), "{cip}:80");
        // ... another port or protocol of the ClusterIP is rejected,
        for p in [
            Packet::new("10.244.3.9", cip, Proto::Tcp, 81),
            Packet::new("10.244.3.9", cip, Proto::Udp, 80),
        ] {
            assert_eq!(
                one(&t, &[NODE_IP], &p),
                (Fate::Reject, None, false),
                "{p:?}"
            );
            // from the node itself too (checked after nat output).
            let o = Tracer::new(&t).with_local(&[NODE_IP]).local(
                &Packet {
                    src: NODE_IP.parse().unwrap(),
                    ..p.clone()
                },
                &mut |_| 0,
            );
            assert_eq!(o.fate, Fate::Reject, "{p:?} from the node");
            assert!(o.path.contains(&"filter-output-post-dnat".to_string()));
        }
    }
    // An address of the Service CIDR that no Service holds is dropped.
    let p = Packet::new("10.244.3.9", "10.96.0.77", Proto::Tcp, 80);
    assert_eq!(one(&t, &[NODE_IP], &p), (Fate::Drop, None, false));
    // Outside the Service CIDR nothing is ours: routed as usual.
    let p = Packet::new("10.244.3.9", "10.200.0.1", Proto::Tcp, 80);
    assert_eq!(one(&t, &[NODE_IP], &p), (Fate::Accept, None, false));
}

#[test]
fn local_policy_falls_back_to_local_serving_terminating_endpoints() {
    // node1's only endpoint is terminating but serving; node2's is ready.
    let s = web(json!({"type": "NodePort", "externalTrafficPolicy": "Local",
        "ports": [{"name": "http", "port": 80, "nodePort": 30081, "protocol": "TCP"}]}));
    let eps = slice(
        "web",
        &[
            ("10.244.1.5", false, true, "node1"),
            ("10.244.2.5", true, false, "node2"),
        ],
        8080,
    );
    let t = plan_on(
        &node1(),
        std::slice::from_ref(&s),
        std::slice::from_ref(&eps),
    );
    let np = Packet::new("198.51.100.20", NODE_IP, Proto::Tcp, 30081);
    assert_eq!(
        one(&t, &[NODE_IP], &np),
        (Fate::Accept, Some("10.244.1.5:8080".into()), false),
        "external traffic uses the local serving-terminating endpoint"
    );
    // ClusterIP traffic (Cluster policy) still uses the ready one.
    assert_eq!(
        targets(&t, &Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80)),
        set(&["10.244.2.5:8080"])
    );
    // The same with internalTrafficPolicy Local, for ClusterIP traffic.
    let t = plan_on(
        &node1(),
        &[web(json!({"internalTrafficPolicy": "Local"}))],
        std::slice::from_ref(&eps),
    );
    assert_eq!(
        targets(&t, &Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80)),
        set(&["10.244.1.5:8080"])
    );
}

#[test]
fn topology_hints_and_prefer_same_node() {
    let zoned = NodeInfo {
        zone: Some("a".into()),
        ..node1()
    };
    let unzoned = NodeInfo {
        zone: None,
        ..zoned.clone()
    };
    let p = Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80);
    let a = "10.244.1.5:8080";
    let both = set(&[a, "10.244.2.5:8080"]);
    let cases: Vec<(&str, &NodeInfo, EndpointSlice, BTreeSet<String>)> = vec![
        (
            "zone hints for this zone",
            &zoned,
            hinted(&[
                ("10.244.1.5", "node1", Some("a"), None),
                ("10.244.2.5", "node2", Some("b"), None),
            ]),
            set(&[a]),
        ),
        (
            "node without a zone label",
            &unzoned,
            hinted(&[
                ("10.244.1.5", "node1", Some("a"), None),
                ("10.244.2.5", "node2", Some("b"), None),
            ]),
            both.clone(),
        ),
        (
            "an endpoint without hints",
            &zoned,
            hinted(&[
                ("10.244.1.5", "node1", Some("a"), None),
                ("10.244.2.5", "node2", None, None),
            ]),
            both.clone(),
        ),
        (
            "no endpoint for this zone",
            &zoned,
            hinted(&[
                ("10.244.1.5", "node1", Some("b"), None),
                ("10.244.2.5", "node2", Some("c"), None),
            ]),
            both.clone(),
        ),
        (
            "PreferSameNode",
            &zoned,
            hinted(&[
                ("10.244.1.5", "node1", Some("b"), Some("node1")),
                ("10.244.2.5", "node2", Some("a"), Some("node2")),
            ]),
            set(&[a]),
        ),
    ];
    for (why, node, eps, want) in cases {
        for (services, name) in [
            (vec![web(json!({}))], "fast"),
            (fast_and_chain().0[1..].to_vec(), "chain"),
        ] {
            let mut eps = eps.clone();
            let svc_name = services[0].metadata.name.clone().unwrap();
            eps.metadata
                .labels
                .as_mut()
                .unwrap()
                .insert("kubernetes.io/service-name".into(), svc_name);
            let t = plan_on(node, &services, &[eps]);
            let cip = cluster_ip_of(services[0].spec.as_ref().unwrap(), &v4())
                .unwrap()
                .to_string();
            let p = Packet {
                dst: cip.parse().unwrap(),
                ..p.clone()
            };
            assert_eq!(targets(&t, &p), want, "{why} ({name} path)");
        }
    }
    // A Local policy ignores hints: node1's endpoint is hinted for zone b.
    let t = plan_on(
        &zoned,
        &[web(json!({"internalTrafficPolicy": "Local"}))],
        &[hinted(&[
            ("10.244.1.5", "node1", Some("b"), None),
            ("10.244.2.5", "node2", Some("a"), None),
        ])],
    );
    assert_eq!(targets(&t, &p), set(&[a]));
}
