//! The table as a whole: which Services and slices get rules, what a
//! repeated or small sync costs, fragments against the full plan, both
//! families, and the rendered text.

use super::*;

#[test]
fn external_name_and_headless_get_no_rules() {
    let en = svc(
        "ext",
        json!({"type": "ExternalName", "externalName": "example.com"}),
    );
    let hl = svc("hl", json!({"clusterIP": "None", "ports": [{"port": 80}]}));
    let t = plan_for(&[en, hl], &[]);
    assert!(t.sets.iter().all(|(_, s)| s.elements.is_empty()));
    assert!(!t.chains.keys().any(|c| c.starts_with("svc-")));
}

#[test]
fn opt_out_labels_take_a_service_away_and_back() {
    let label = |k: &str, v: &str| {
        let mut s = web(json!({}));
        s.metadata.labels = Some([(k.to_string(), v.to_string())].into());
        s
    };
    let p = Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80);
    let empty = plan_on(&node1(), &[], &[]);
    for s in [
        label(HEADLESS_LABEL, ""),
        label(PROXY_NAME_LABEL, "other-proxy"),
    ] {
        let t = plan_on(&node1(), std::slice::from_ref(&s), &[two_eps()]);
        assert_eq!(t, empty, "{:?}: no rules at all", s.metadata.labels);
        // The ClusterIP is not ours now: dropped as an unheld address.
        assert_eq!(one(&t, &[NODE_IP], &p).0, Fate::Drop);
    }
    let ours = plan_on(
        &node1(),
        &[label(PROXY_NAME_LABEL, PROXY_NAME)],
        &[two_eps()],
    );
    assert_eq!(ours, plan_on(&node1(), &[web(json!({}))], &[two_eps()]));
    assert!(one(&ours, &[NODE_IP], &p).1.is_some());
}

#[test]
fn a_slice_labelled_headless_or_for_another_proxy_gives_no_endpoints() {
    let p = Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80);
    let svc = web(json!({}));
    let with = plan_on(&node1(), std::slice::from_ref(&svc), &[two_eps()]);
    assert!(one(&with, &[NODE_IP], &p).1.is_some());
    let no_eps = plan_on(&node1(), std::slice::from_ref(&svc), &[]);
    for (k, v) in [(HEADLESS_LABEL, ""), (PROXY_NAME_LABEL, "other-proxy")] {
        let mut s = two_eps();
        s.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(k.into(), v.into());
        let t = plan_on(&node1(), std::slice::from_ref(&svc), &[s]);
        assert_eq!(t, no_eps, "slice labelled {k}={v:?}");
    }
}

#[test]
fn repeated_sync_is_zero_ops_and_one_endpoint_change_is_small() {
    let mut svcs = Vec::new();
    let mut slices = Vec::new();
    for i in 0..200 {
        svcs.push(svc(
            &format!("s{i}"),
            json!({"clusterIP": format!("10.96.{}.{}", i / 250, i % 250 + 1),
            "ports": [{"name": "http", "port": 80}], "selector": {"a": "b"}}),
        ));
        slices.push(slice(
            &format!("s{i}"),
            &[
                (
                    &format!("10.244.{}.{}", i / 250 + 1, i % 250 + 1),
                    true,
                    false,
                    "node2",
                ),
                ("10.244.9.9", true, false, "node3"),
            ],
            8080,
        ));
    }
    let t1 = plan_for(&svcs, &slices);
    assert_eq!(ops(&diff(Some(&t1), &plan_for(&svcs, &slices))), 0);
    slices[7] = slice(
        "s7",
        &[
            ("10.244.1.8", true, false, "node2"),
            ("10.244.9.10", true, false, "node3"),
        ],
        8080,
    );
    let t2 = plan_for(&svcs, &slices);
    let d = diff(Some(&t1), &t2);
    assert!(
        ops(&d) <= 10,
        "one endpoint change cost {} ops: {d:?}",
        ops(&d)
    );
    // A Service added: its element plus its chains.
    svcs.push(svc(
        "new",
        json!({"clusterIP": "10.96.5.5", "ports": [{"name": "http", "port": 80}]}),
    ));
    slices.push(slice("new", &[("10.244.5.5", true, false, "node2")], 80));
    let d = diff(Some(&t2), &plan_for(&svcs, &slices));
    assert_eq!(
        ops(&d),
        5,
        "a fast-path Service is five elements (cluster-ips, fast, fast-1, endpoint, hairpin): {d:?}"
    );
    assert!(
        d.iter().all(|c| matches!(c, Change::AddElems { .. })),
        "no chains or rules, so the kernel has nothing to re-validate: {d:?}"
    );
    // The same Service with a NodePort takes the chain path.
    let last = svcs.len() - 1;
    svcs[last] = svc(
        "new",
        json!({"type": "NodePort", "clusterIP": "10.96.5.5",
               "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}),
    );
    let d = diff(Some(&t2), &plan_for(&svcs, &slices));
    assert!(
        d.iter().any(|c| matches!(c, Change::AddChain { .. })),
        "{d:?}"
    );
}

#[test]
fn fragments_merge_into_the_full_plan() {
    let services = [
        web(json!({"sessionAffinity": "ClientIP"})),
        svc(
            "other",
            json!({"clusterIP": "10.96.0.60", "ports": [{"name": "http", "port": 81}]}),
        ),
    ];
    let slices = [two_eps()];
    let full = plan_for(&services, &slices);
    let mut merged = base_table(&v4(), &node1());
    for s in &services {
        merge(&mut merged, &fragment(Some(s), &slices, &node1(), &v4()));
    }
    assert_eq!(merged, full);
    // Removing a Service is the diff from its fragment to an empty one.
    let f = fragment(Some(&services[0]), &slices, &node1(), &v4());
    let gone = fragment(None, &[], &node1(), &v4());
    let d = diff(Some(&f), &gone);
    assert!(
        d.iter()
            .any(|c| matches!(c, podnet_nft::diff::Change::DelSet { .. })),
        "affinity sets go too"
    );
    assert!(!d
        .iter()
        .any(|c| matches!(c, podnet_nft::diff::Change::DelSet { name } if name == "service-ips")));
}

#[test]
fn ipv6_and_dual_stack() {
    let s = svc(
        "web",
        json!({"clusterIP": "10.96.0.50", "clusterIPs": ["10.96.0.50", "fd00:96::50"],
            "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "PreferDualStack",
            "type": "NodePort", "externalIPs": ["2001:db8::7"],
            "ports": [{"name": "http", "port": 80, "nodePort": 30090, "protocol": "TCP"}]}),
    );
    let v6_slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "web-v6", "namespace": "default",
            "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv6",
        "endpoints": [{"addresses": ["fd00:244:0:1::5"], "nodeName": "node1",
            "conditions": {"ready": true}}],
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]}))
    .unwrap();
    let slices = [two_eps(), v6_slice];
    let v6 = Stack::v6(Some("fd00:244::/48".parse().unwrap()));
    let t6 = plan(&ProxyInput {
        node: &node1(),
        stack: v6,
        services: std::slice::from_ref(&s),
        slices: &slices,
    });
    assert_eq!(t6.family, Family::Ip6);
    let from_pod = Packet::new("fd00:244:0:2::9", "fd00:96::50", Proto::Tcp, 80);
    let o = Tracer::new(&t6).incoming(&from_pod, &mut |_| 0);
    assert_eq!(
        o.dnat,
        Some(("fd00:244:0:1::5".parse().unwrap(), Some(8080)))
    );
    assert!(!o.masquerade, "pod source kept over IPv6 too");
    let o = Tracer::new(&t6).incoming(
        &Packet::new("2001:db8:1::1", "2001:db8::7", Proto::Tcp, 80),
        &mut |_| 0,
    );
    assert!(o.dnat.is_some() && o.masquerade, "IPv6 externalIP: {o:?}");
    let o = Tracer::new(&t6).with_local(&["fd00:200::11"]).incoming(
        &Packet::new("2001:db8:1::1", "fd00:200::11", Proto::Tcp, 30090),
        &mut |_| 0,
    );
    assert!(o.dnat.is_some(), "NodePort on the node's IPv6 address");
    // The IPv4 table carries only the IPv4 half, and vice versa.
    let t4 = plan_for(std::slice::from_ref(&s), &slices);
    let targets4 = targets(
        &t4,
        &Packet::new("10.244.3.9", "10.96.0.50", Proto::Tcp, 80),
    );
    assert_eq!(
        targets4,
        BTreeSet::from(["10.244.1.5:8080".to_string(), "10.244.2.5:8080".to_string()])
    );
    assert!(!t4.render().contains("fd00"), "{}", t4.render());
    let r6 = t6.render();
    assert!(!r6.contains("10.96.0.50"), "{r6}");
    for want in [
        "table ip6 podnet",
        "type ipv6_addr . inet_proto . inet_service : verdict;",
        "ip6 daddr . meta l4proto . th dport vmap @service-ips",
        "ip6 saddr != fd00:244::/48 jump mark-for-masquerade",
        "dnat ip6 to [fd00:244:0:1::5]:8080",
    ] {
        assert!(r6.contains(want), "missing {want:?} in\n{r6}");
    }
    // A family without a pod network treats every client as external.
    let bare = plan(&ProxyInput {
        node: &node1(),
        stack: Stack::v6(None),
        services: std::slice::from_ref(&s),
        slices: &slices,
    });
    let o = Tracer::new(&bare).incoming(&from_pod, &mut |_| 0);
    assert!(o.dnat.is_some() && o.masquerade);
}

#[test]
fn golden_render_of_a_small_service_set() {
    // web takes the fast path; api (affinity) the chain path.
    let api = svc(
        "api",
        json!({"clusterIP": "10.96.0.60", "sessionAffinity": "ClientIP",
               "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}),
    );
    let t = plan_for(
        &[web(json!({})), api],
        &[
            slice("web", &[("10.244.1.5", true, false, "node1")], 8080),
            slice("api", &[("10.244.1.6", true, false, "node1")], 8080),
        ],
    );
    let r = t.render();
    for want in [
        "set fast-services {\n\t\ttype ipv4_addr . inet_proto . inet_service;",
        "set fast-1 {\n\t\ttype ipv4_addr . inet_proto . inet_service;\n\t\telements = { 10.96.0.50 . tcp . 80 }",
        "type ipv4_addr . inet_proto . inet_service . mark : ipv4_addr . inet_service;",
        "10.96.0.50 . tcp . 80 . 0x00000000 : 10.244.1.5 . 8080",
        "10.244.1.5 . 10.244.1.5 . 10.96.0.50 . 80",
        "\t\tip daddr . meta l4proto . th dport @fast-services jump fast-dispatch\n",
        "\t\tip daddr . meta l4proto . th dport @fast-2 goto pick-2\n",
        "\t\tdnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @fast-endpoints\n",
        "\t\tct status dnat ip saddr . ip daddr . ct original ip daddr . ct original proto-dst @fast-hairpin masquerade fully-random\n",
        "map service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict;",
        "10.96.0.60 . tcp . 80 : goto svc-",
        "\t\tip daddr . meta l4proto . th dport vmap @service-ips\n",
        "\t\tmeta l4proto . th dport @service-nodeports fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports\n",
        "\t\tip saddr != 10.244.0.0/16 jump mark-for-masquerade\n",
        " meta l4proto tcp dnat ip to 10.244.1.6:8080\n",
        "\t\tmeta mark & 0x00004000 != 0 masquerade fully-random\n",
        "type nat hook prerouting priority -100; policy accept;",
    ] {
        assert!(r.contains(want), "missing {want:?} in\n{r}");
    }
}
