//! Bounded fuzzing of the request path with proptest: random bytes and
//! mutations of real queries go through the same handler the UDP and TCP
//! servers use. Nothing may panic; every reply must parse and echo the ID.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use podnet_dns::forward::Forwarder;
use podnet_dns::server::{Fast, Handler};
use podnet_dns::stats::Stats;
use podnet_dns::wire;
use podnet_dns::zone::{Builder, ZoneConfig};
use proptest::prelude::*;

fn shared() -> &'static (Handler, tokio::runtime::Runtime) {
    static H: std::sync::OnceLock<(Handler, tokio::runtime::Runtime)> = std::sync::OnceLock::new();
    H.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        (handler(), rt)
    })
}

fn handler() -> Handler {
    let mut b = Builder::new(ZoneConfig {
        pods: true,
        ..Default::default()
    });
    let svc: podnet_api::k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5"], "ports": [{"name": "http", "port": 80}]}
    }))
    .unwrap();
    b.upsert_service(&svc);
    let ext: podnet_api::k8s_openapi::api::core::v1::Service =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "ext", "namespace": "default"},
            "spec": {"type": "ExternalName", "externalName": "web.default.svc.cluster.local"}
        }))
        .unwrap();
    b.upsert_service(&ext);
    Handler::new(
        Arc::new(ArcSwap::new(b.publish(true))),
        // No upstreams: the slow path answers SERVFAIL at once.
        Arc::new(Forwarder::new(vec![], Duration::from_millis(10), 100)),
        Arc::new(Stats::default()),
    )
}

fn check(h: &Handler, rt: &tokio::runtime::Runtime, msg: &[u8]) {
    let st = Stats::default();
    let mut out = Vec::new();
    for udp in [true, false] {
        let reply = match h.fast(msg, &mut out, udp, &st, Instant::now()) {
            Fast::Reply => Some(out.clone()),
            Fast::Drop => None,
            Fast::Slow => rt.block_on(h.slow(msg, udp, Instant::now())),
        };
        if let Some(r) = reply {
            let m = wire::Message::parse(&r).expect("our replies parse");
            assert_eq!(&r[0..2], &msg[0..2], "ID echoed");
            assert!(m.header.flags & wire::QR != 0);
            if udp {
                assert!(r.len() <= 4096);
            }
        }
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let names = [
        "web.default.svc.cluster.local",
        "_http._tcp.web.default.svc.cluster.local",
        "ext.default.svc.cluster.local",
        "10-1-2-3.default.pod.cluster.local",
        "5.0.96.10.in-addr.arpa",
        "dns-version.cluster.local",
        "example.com",
    ];
    let mut v = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let qn = wire::name_from_str(n).unwrap();
        for t in [1u16, 28, 33, 12, 16, 255, 252] {
            v.push(wire::build_query(i as u16, &qn, t, Some(1232)));
            v.push(wire::build_query(i as u16, &qn, t, None));
        }
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(msg in proptest::collection::vec(any::<u8>(), 12..600)) {
        let (h, rt) = shared();
        check(h, rt, &msg);
        let _ = wire::Message::parse(&msg);
    }

    #[test]
    fn mutated_queries(seed in 0usize..98, edits in proptest::collection::vec((any::<u16>(), any::<u8>()), 1..8), cut in any::<u16>()) {
        let (h, rt) = shared();
        let seeds = seeds();
        let mut m = seeds[seed % seeds.len()].clone();
        for (at, b) in edits {
            let i = at as usize % m.len();
            m[i] = b;
        }
        if (cut as usize).is_multiple_of(4) {
            let n = 12 + cut as usize % (m.len() - 11);
            m.truncate(n);
        }
        check(h, rt, &m);
        let _ = wire::Message::parse(&m);
    }
}
