//! NetworkPolicy end to end, in both modes: the scenarios of the Kubernetes
//! e2e suite (test/e2e/network/netpol) on the lab, with real TCP and UDP
//! traffic between pods. The harness (model x/y/z × a/b/c, truth tables,
//! probes by cause) is in `common/netpol.rs`.
//!
//! Each expected table is written by hand, as in the e2e suite, never
//! computed from an implementation. Scenarios are grouped so that one lab
//! per mode runs a group in turn, with every policy removed and every label
//! restored between scenarios. `PODNET_NETPOL_SCENARIO=name[,name]` runs
//! only the scenarios whose names contain one of the given strings.

#[path = "common/netpol.rs"]
mod harness;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use harness::{policy, Harness, Mode, Reachability, Scenario, Target, DNS_IP};
use podnet_lab::Reach;

const TCP80: Target = Target::tcp(80);
const TCP81: Target = Target::tcp(81);
const UDP80: Target = Target::udp(80);
const UDP81: Target = Target::udp(81);

/// Every pair allowed, to start a table from.
fn all() -> Reachability {
    Reachability::new(true)
}

// ---- The harness itself (passes without any enforcement).

/// What the harness rests on, in both modes, with no policy at all: every
/// pod reaches every pod and every Service on every port (checked while
/// the model is made), the objects carry what policies select on, a
/// refusal is told from a drop, a wrong expectation fails with readable
/// tables, and the tools that change policies and labels work.
fn harness_self_check(h: &Harness) {
    let c = &h.cluster;
    // The Pods declare the named ports; namespaces carry both labels.
    let pod = c.get_json("pod", Some("x"), "a");
    let names: Vec<&str> = pod["spec"]["containers"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "serve-80-tcp",
            "serve-80-udp",
            "serve-81-tcp",
            "serve-81-udp"
        ]
    );
    for ns in ["x", "y", "z", "kube-system"] {
        let l = c.labels("namespace", None, ns);
        assert_eq!(
            l.get("kubernetes.io/metadata.name").map(String::as_str),
            Some(ns),
            "{ns}: {l:?}"
        );
    }
    assert_eq!(
        c.labels("namespace", None, "y")
            .get("ns")
            .map(String::as_str),
        Some("y")
    );
    // Whoever answers says who it is, also through a Service.
    let b = h.model.pod("y/b");
    assert_eq!(
        h.reach("x/a", SocketAddr::new(b.ip, 80), false),
        Reach::Connected("y/b".into())
    );
    assert_eq!(
        h.reach("x/a", SocketAddr::new(b.service_ip, 81), true),
        Reach::Connected("y/b".into())
    );
    // Nobody listens on 82: refused over TCP and over UDP (ICMP heard).
    assert_eq!(
        h.reach("x/a", SocketAddr::new(b.ip, 82), false),
        Reach::Refused
    );
    assert_eq!(
        h.reach("x/a", SocketAddr::new(b.ip, 82), true),
        Reach::Refused
    );
    // A wrong expectation fails, with the tables and the pair in words.
    let mut wrong = all();
    wrong.expect("x/b", "y/c", false);
    let e = h
        .try_check(
            &[(TCP80, &wrong)],
            Duration::from_secs(5),
            Some(Duration::from_secs(2)),
        )
        .expect_err("a wrong table must not pass");
    eprintln!("the harness reports a wrong expectation like this:\n{e}");
    for want in [
        "TCP/80 to pod IPs: 1 of 81 pairs wrong",
        "expected",
        "observed",
        "comparison",
        "x/b -> y/c: expected a drop (timeout), connected, answered by y/c",
    ] {
        assert!(e.contains(want), "{want:?} missing from:\n{e}");
    }
    // A deny is a drop, never a refusal: a port with no server fails it.
    let mut none = all();
    none.expect("x/a", "y/b", false);
    let e = h
        .try_check(
            &[(Target::tcp(82), &none)],
            Duration::from_secs(3),
            Some(Duration::from_secs(1)),
        )
        .expect_err("refusals are not drops");
    assert!(
        e.contains("x/a -> y/b: expected a drop (timeout), refused"),
        "{e}"
    );
    // The tools: a policy that changes nothing goes in and out; labels
    // change and are put back.
    h.apply(&policy(
        "x",
        "allow-all",
        "
        podSelector: {}
        ingress: [{}]
        ",
    ));
    assert_eq!(c.list_json("networkpolicies").len(), 1);
    h.check_all(&[TCP80, UDP81.service()], &all());
    h.label_pod("x/b", &[("pod2", Some("updated"))]);
    h.label_namespace("y", &[("ns2", Some("updated")), ("ns", None)]);
    assert_eq!(
        c.labels("pod", Some("x"), "b")
            .get("pod2")
            .map(String::as_str),
        Some("updated")
    );
    let y = c.labels("namespace", None, "y");
    assert!(!y.contains_key("ns") && y.contains_key("ns2"), "{y:?}");
    assert_eq!(
        y.get("kubernetes.io/metadata.name").map(String::as_str),
        Some("y"),
        "a relabelled namespace keeps its name label"
    );
    h.reset();
    assert!(c.list_json("networkpolicies").is_empty());
    assert!(!c.labels("pod", Some("x"), "b").contains_key("pod2"));
    assert_eq!(
        c.labels("namespace", None, "y")
            .get("ns")
            .map(String::as_str),
        Some("y")
    );
    // Cluster DNS answers a model Service's name from a pod.
    assert_eq!(
        lookup(h, "x/a", "s-b.y.svc.cluster.local", false),
        Ok(service_ip(h, "y/b"))
    );
    assert_eq!(
        lookup(h, "x/a", "s-b.y.svc.cluster.local", true),
        Ok(service_ip(h, "y/b"))
    );
}

const HARNESS: &[Scenario] = &[("harness_self_check", harness_self_check)];

#[test]
fn netpol_harness() {
    Harness::run(Mode::Standalone, "nh", HARNESS);
}

#[test]
fn netpol_harness_kube() {
    Harness::run(Mode::Kube, "nh", HARNESS);
}

// ---- DNS from a pod.

/// Pod `id`'s Service's ClusterIP in the model's family (what its name
/// resolves to in [`lookup`]).
fn service_ip(h: &Harness, id: &str) -> IpAddr {
    h.model.pod(id).service_ip
}

/// A lookup through the cluster DNS Service from pod `from`, over UDP
/// or TCP: A, or AAAA in a dual-stack model; the address, or why not
/// ("timed out" for a drop).
fn lookup(h: &Harness, from: &str, name: &str, tcp: bool) -> Result<IpAddr, String> {
    use podnet_dns::client::{Client, ClientError};
    use podnet_dns::wire::{RData, TYPE_A, TYPE_AAAA};
    let (ns, pod) = from.split_once('/').unwrap();
    let netns = h.cluster.lab.pod(ns, pod).unwrap().netns;
    let client = Client {
        timeout: Duration::from_secs(1),
        ..Client::new(SocketAddr::new(DNS_IP.parse().unwrap(), 53))
    };
    let qtype = if h.model.dual { TYPE_AAAA } else { TYPE_A };
    let r = podnet_kernel::Netns::named(&netns)
        .unwrap()
        .run(|| match tcp {
            true => client.tcp(name, qtype),
            false => client.udp(name, qtype),
        })
        .unwrap();
    match r {
        Ok(m) => m
            .answers
            .iter()
            .find_map(|a| match a.rdata {
                RData::A(ip) => Some(IpAddr::V4(ip)),
                RData::Aaaa(ip) => Some(IpAddr::V6(ip)),
                _ => None,
            })
            .ok_or_else(|| format!("no address record (rcode {})", m.rcode())),
        Err(ClientError::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ) =>
        {
            Err("timed out".into())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// A lookup from `from` must eventually give `want` (`Err("timed out")`
/// for a drop), over UDP and over TCP.
fn lookup_eventually(h: &Harness, from: &str, name: &str, want: Result<IpAddr, String>) {
    for tcp in [false, true] {
        let mut got = Err(String::new());
        let ok = (0..20).any(|_| {
            got = lookup(h, from, name, tcp);
            got == want
        });
        assert!(
            ok,
            "{from}: {name} over {}: want {want:?}, got {got:?}",
            if tcp { "TCP" } else { "UDP" }
        );
    }
}

// ---- Group 1: default deny, allow all, selectors.

/// e2e: should support a 'default-deny-ingress' policy (TCP and UDP).
fn default_deny_ingress(h: &Harness) {
    h.apply(&policy(
        "x",
        "deny-ingress",
        "
        podSelector: {}
        policyTypes: [Ingress]
        ",
    ));
    let mut r = all();
    r.expect_peer("*", "x", false);
    h.check_all(&[TCP80, UDP80, TCP81.service()], &r);
}

/// e2e: should deny egress from all pods in a namespace; and with no DNS
/// allowed, a lookup through the cluster DNS Service is dropped too.
fn default_deny_egress(h: &Harness) {
    h.apply(&policy(
        "x",
        "deny-egress",
        "
        podSelector: {}
        policyTypes: [Egress]
        ",
    ));
    let mut r = all();
    r.expect_peer("x", "*", false);
    h.check_all(&[TCP80, UDP81, TCP80.service()], &r);
    lookup_eventually(h, "x/a", "s-a.y.svc.cluster.local", Err("timed out".into()));
}

/// e2e: should support a 'default-deny-all' policy.
fn default_deny_all(h: &Harness) {
    h.apply(&policy(
        "x",
        "deny-all",
        "
        podSelector: {}
        policyTypes: [Ingress, Egress]
        ",
    ));
    let mut r = all();
    r.expect_peer("*", "x", false);
    r.expect_peer("x", "*", false);
    h.check_all(&[TCP80, UDP80], &r);
}

/// e2e: should support allow-all policy; an allow-all ingress beside a
/// default deny opens the namespace again on every port.
fn allow_all_ingress(h: &Harness) {
    h.apply(&policy(
        "x",
        "deny-ingress",
        "
        podSelector: {}
        policyTypes: [Ingress]
        ",
    ));
    let mut denied = all();
    denied.expect_peer("*", "x", false);
    h.check_all(&[TCP80], &denied);
    h.apply(&policy(
        "x",
        "allow-all",
        "
        podSelector: {}
        ingress: [{}]
        ",
    ));
    h.check_all(&[TCP80, TCP81, UDP80], &all());
}

/// e2e: should deny ingress from pods on other namespaces.
fn deny_ingress_from_other_namespaces(h: &Harness) {
    h.apply(&policy(
        "x",
        "deny-other-namespaces",
        "
        podSelector: {}
        ingress:
        - from:
          - podSelector: {}
        ",
    ));
    let mut r = all();
    r.expect_peer("y", "x", false);
    r.expect_peer("z", "x", false);
    h.check_all(&[TCP80, UDP81], &r);
}

/// e2e: should enforce policy to allow traffic only from a different
/// namespace, based on NamespaceSelector (a label of our own).
fn allow_from_namespace_by_label(h: &Harness) {
    h.apply(&policy(
        "x",
        "allow-from-ns-y",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - from:
          - namespaceSelector: {matchLabels: {ns: \"y\"}}
        ",
    ));
    let mut r = all();
    r.expect_peer("x", "x/a", false);
    r.expect_peer("z", "x/a", false);
    h.check_all(&[TCP80], &r);
}

/// e2e: ... NamespaceSelector with MatchLabels using default ns label
/// (`kubernetes.io/metadata.name`, which the API server adds).
fn allow_from_namespace_by_name_label(h: &Harness) {
    h.apply(&policy(
        "x",
        "allow-from-ns-y-by-name",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - from:
          - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: \"y\"}}
        ",
    ));
    let mut r = all();
    r.expect_peer("x", "x/a", false);
    r.expect_peer("z", "x/a", false);
    h.check_all(&[TCP80, UDP80], &r);
}

/// e2e: should enforce policy based on NamespaceSelector with
/// MatchExpressions (In).
fn namespace_selector_match_expressions(h: &Harness) {
    h.apply(&policy(
        "x",
        "allow-ns-in-y",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - from:
          - namespaceSelector:
              matchExpressions:
              - {key: kubernetes.io/metadata.name, operator: In, values: [\"y\"]}
        ",
    ));
    let mut r = all();
    r.expect_peer("x", "x/a", false);
    r.expect_peer("z", "x/a", false);
    h.check_all(&[TCP80], &r);
}

/// e2e: ... NamespaceSelector with MatchExpressions using default ns label
/// (NotIn, on egress).
fn egress_namespace_not_in(h: &Harness) {
    h.apply(&policy(
        "x",
        "egress-ns-not-in-y",
        "
        podSelector: {matchLabels: {pod: a}}
        policyTypes: [Egress]
        egress:
        - to:
          - namespaceSelector:
              matchExpressions:
              - {key: kubernetes.io/metadata.name, operator: NotIn, values: [\"y\"]}
        ",
    ));
    let mut r = all();
    r.expect_peer("x/a", "y", false);
    h.check_all(&[TCP80, UDP81], &r);
}

/// e2e: should enforce policy to allow traffic from pods within server
/// namespace based on PodSelector.
fn allow_from_pod_by_label(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-allows-x-b",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - from:
          - podSelector: {matchLabels: {pod: b}}
        ",
    ));
    let mut r = all();
    r.expect_all_ingress("x/a", false);
    r.expect("x/b", "x/a", true);
    h.check_all(&[TCP80, UDP80], &r);
}

/// e2e: should enforce policy based on PodSelector with MatchExpressions.
fn pod_selector_match_expressions(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-allows-pod-in-b",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - from:
          - podSelector:
              matchExpressions:
              - {key: pod, operator: In, values: [b]}
        ",
    ));
    let mut r = all();
    r.expect_all_ingress("x/a", false);
    r.expect("x/b", "x/a", true);
    h.check_all(&[TCP81], &r);
}

/// e2e: should enforce policy based on any PodSelectors (two peers, OR).
fn any_of_two_pod_selectors(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-allows-b-or-c",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - from:
          - podSelector: {matchLabels: {pod: b}}
          - podSelector: {matchLabels: {pod: c}}
        ",
    ));
    let mut r = all();
    r.expect_all_ingress("x/a", false);
    r.expect("x/b", "x/a", true);
    r.expect("x/c", "x/a", true);
    h.check_all(&[TCP80], &r);
}

/// e2e: should enforce policy based on PodSelector and NamespaceSelector
/// (one peer with both: AND).
fn pod_and_namespace_selector(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-allows-b-elsewhere",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - from:
          - namespaceSelector:
              matchExpressions:
              - {key: kubernetes.io/metadata.name, operator: NotIn, values: [x]}
            podSelector: {matchLabels: {pod: b}}
        ",
    ));
    let mut r = all();
    r.expect_all_ingress("x/a", false);
    r.expect("y/b", "x/a", true);
    r.expect("z/b", "x/a", true);
    h.check_all(&[TCP80, UDP81], &r);
}

/// e2e: should enforce policy based on PodSelector or NamespaceSelector
/// (two peers: OR).
fn pod_or_namespace_selector(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-allows-elsewhere-or-b",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - from:
          - namespaceSelector:
              matchExpressions:
              - {key: kubernetes.io/metadata.name, operator: NotIn, values: [x]}
          - podSelector: {matchLabels: {pod: b}}
        ",
    ));
    let mut r = all();
    r.expect("x/c", "x/a", false);
    h.check_all(&[TCP80], &r);
}

/// e2e: should enforce policy based on Multiple PodSelectors and
/// NamespaceSelectors (In over two pods, AND a NotIn namespace).
fn several_pods_in_other_namespaces(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-allows-b-c-elsewhere",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - from:
          - namespaceSelector:
              matchExpressions:
              - {key: kubernetes.io/metadata.name, operator: NotIn, values: [x]}
            podSelector:
              matchExpressions:
              - {key: pod, operator: In, values: [b, c]}
        ",
    ));
    let mut r = all();
    r.expect_peer("x", "x/a", false);
    r.expect("y/a", "x/a", false);
    r.expect("z/a", "x/a", false);
    h.check_all(&[TCP80], &r);
}

/// e2e: should enforce policy to allow traffic only from a pod in a
/// different namespace based on PodSelector and NamespaceSelector (TCP
/// and UDP).
fn one_pod_in_another_namespace(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-allows-y-a",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - from:
          - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: \"y\"}}
            podSelector: {matchLabels: {pod: a}}
        ",
    ));
    let mut r = all();
    r.expect_all_ingress("x/a", false);
    r.expect("y/a", "x/a", true);
    h.check_all(&[TCP80, UDP80], &r);
}

/// e2e: should deny egress from pods based on PodSelector.
fn deny_egress_from_one_pod(h: &Harness) {
    h.apply(&policy(
        "x",
        "deny-egress-pod-a",
        "
        podSelector: {matchLabels: {pod: a}}
        policyTypes: [Egress]
        ",
    ));
    let mut r = all();
    r.expect_all_egress("x/a", false);
    h.check_all(&[TCP80, UDP80], &r);
}

/// e2e: should enforce egress policy allowing traffic to a server in a
/// different namespace based on PodSelector and NamespaceSelector.
fn egress_to_one_pod_in_another_namespace(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-to-y-a",
        "
        podSelector: {matchLabels: {pod: a}}
        policyTypes: [Egress]
        egress:
        - to:
          - namespaceSelector: {matchLabels: {ns: \"y\"}}
            podSelector: {matchLabels: {pod: a}}
        ",
    ));
    let mut r = all();
    r.expect_all_egress("x/a", false);
    r.expect("x/a", "y/a", true);
    h.check_all(&[TCP80, UDP81], &r);
}

/// e2e: should support denying of egress traffic on the client side (even
/// if the server explicitly allows this traffic).
fn egress_denied_on_the_client_side(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-to-y-a",
        "
        podSelector: {matchLabels: {pod: a}}
        policyTypes: [Egress]
        egress:
        - to:
          - namespaceSelector: {matchLabels: {ns: \"y\"}}
            podSelector: {matchLabels: {pod: a}}
        ",
    ));
    // Both y/a and y/b take x/a.
    for pod in ["a", "b"] {
        h.apply(&policy(
            "y",
            &format!("y-{pod}-from-x-a"),
            &format!(
                "
                podSelector: {{matchLabels: {{pod: {pod}}}}}
                ingress:
                - from:
                  - namespaceSelector: {{matchLabels: {{ns: x}}}}
                    podSelector: {{matchLabels: {{pod: a}}}}
                "
            ),
        ));
    }
    let mut r = all();
    r.expect_peer("x/a", "*", false);
    r.expect_peer("*", "y/a", false);
    r.expect_peer("x/a", "y/a", true);
    r.expect_peer("*", "y/b", false);
    h.check_all(&[TCP80], &r);
}

/// e2e: should enforce policies to check ingress and egress policies can
/// be controlled independently based on PodSelector.
fn ingress_and_egress_independently(h: &Harness) {
    h.apply(&policy(
        "x",
        "allow-egress-for-a",
        "
        podSelector: {matchLabels: {pod: a}}
        policyTypes: [Egress]
        egress: [{}]
        ",
    ));
    h.check_all(&[TCP80], &all());
    h.apply(&policy(
        "x",
        "deny-ingress-for-a",
        "
        podSelector: {matchLabels: {pod: a}}
        policyTypes: [Ingress]
        ",
    ));
    let mut r = all();
    r.expect_all_ingress("x/a", false);
    h.check_all(&[TCP80, UDP80], &r);
}

const SELECTORS: &[Scenario] = &[
    ("default_deny_ingress", default_deny_ingress),
    ("default_deny_egress", default_deny_egress),
    ("default_deny_all", default_deny_all),
    ("allow_all_ingress", allow_all_ingress),
    (
        "deny_ingress_from_other_namespaces",
        deny_ingress_from_other_namespaces,
    ),
    (
        "allow_from_namespace_by_label",
        allow_from_namespace_by_label,
    ),
    (
        "allow_from_namespace_by_name_label",
        allow_from_namespace_by_name_label,
    ),
    (
        "namespace_selector_match_expressions",
        namespace_selector_match_expressions,
    ),
    ("egress_namespace_not_in", egress_namespace_not_in),
    ("allow_from_pod_by_label", allow_from_pod_by_label),
    (
        "pod_selector_match_expressions",
        pod_selector_match_expressions,
    ),
    ("any_of_two_pod_selectors", any_of_two_pod_selectors),
    ("pod_and_namespace_selector", pod_and_namespace_selector),
    ("pod_or_namespace_selector", pod_or_namespace_selector),
    (
        "several_pods_in_other_namespaces",
        several_pods_in_other_namespaces,
    ),
    ("one_pod_in_another_namespace", one_pod_in_another_namespace),
    ("deny_egress_from_one_pod", deny_egress_from_one_pod),
    (
        "egress_to_one_pod_in_another_namespace",
        egress_to_one_pod_in_another_namespace,
    ),
    (
        "egress_denied_on_the_client_side",
        egress_denied_on_the_client_side,
    ),
    (
        "ingress_and_egress_independently",
        ingress_and_egress_independently,
    ),
];

#[test]
fn netpol_selectors() {
    Harness::run(Mode::Standalone, "ns", SELECTORS);
}

#[test]
fn netpol_selectors_kube() {
    Harness::run(Mode::Kube, "ns", SELECTORS);
}

/// The same on the pods' IPv6 addresses, in a dual-stack lab.
#[test]
fn netpol_selectors_dual_stack() {
    Harness::run_dual_stack(Mode::Standalone, "ns", SELECTORS);
}

#[test]
fn netpol_selectors_dual_stack_kube() {
    Harness::run_dual_stack(Mode::Kube, "ns", SELECTORS);
}

// ---- Group 2: ports and protocols.

/// e2e: should enforce policy based on Ports (TCP): namespace y may reach
/// x/a on 81 only.
fn ingress_to_a_port_number(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-from-y-on-81",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - from:
          - namespaceSelector: {matchLabels: {ns: \"y\"}}
          ports:
          - {port: 81, protocol: TCP}
        ",
    ));
    let mut on81 = all();
    on81.expect_peer("x", "x/a", false);
    on81.expect_peer("z", "x/a", false);
    let mut on80 = all();
    on80.expect_all_ingress("x/a", false);
    h.check(&[(TCP81, &on81), (TCP80, &on80)]);
}

/// e2e (UDP): should enforce policy based on Ports; the UDP port opens
/// neither the other UDP port nor TCP on the same number.
fn ingress_to_a_udp_port_number(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-from-y-on-udp-81",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - from:
          - namespaceSelector: {matchLabels: {ns: \"y\"}}
          ports:
          - {port: 81, protocol: UDP}
        ",
    ));
    let mut on81 = all();
    on81.expect_peer("x", "x/a", false);
    on81.expect_peer("z", "x/a", false);
    let mut closed = all();
    closed.expect_all_ingress("x/a", false);
    h.check(&[(UDP81, &on81), (UDP80, &closed), (TCP81, &closed)]);
}

/// e2e: should allow ingress access on one named port (a TCP name: the
/// UDP port of the same number stays closed).
fn ingress_to_a_named_port(h: &Harness) {
    h.apply(&policy(
        "x",
        "allow-serve-81-tcp",
        "
        podSelector: {}
        ingress:
        - ports:
          - port: serve-81-tcp
        ",
    ));
    let mut closed = all();
    closed.expect_peer("*", "x", false);
    h.check(&[(TCP81, &all()), (TCP80, &closed), (UDP81, &closed)]);
}

/// e2e: should allow ingress access from namespace on one named port.
fn ingress_from_a_namespace_to_a_named_port(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-from-y-on-serve-80-tcp",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - from:
          - namespaceSelector: {matchLabels: {ns: \"y\"}}
          ports:
          - {port: serve-80-tcp, protocol: TCP}
        ",
    ));
    let mut on80 = all();
    on80.expect_peer("x", "x/a", false);
    on80.expect_peer("z", "x/a", false);
    let mut on81 = all();
    on81.expect_all_ingress("x/a", false);
    h.check(&[(TCP80, &on80), (TCP81, &on81)]);
}

/// A named UDP port opens that UDP port only.
fn ingress_to_a_named_udp_port(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-on-serve-81-udp",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - ports:
          - {port: serve-81-udp, protocol: UDP}
        ",
    ));
    let mut closed = all();
    closed.expect_all_ingress("x/a", false);
    h.check(&[(UDP81, &all()), (UDP80, &closed), (TCP81, &closed)]);
}

/// e2e: should allow egress access on one named port.
fn egress_to_a_named_port(h: &Harness) {
    h.apply(&policy(
        "x",
        "egress-serve-80-tcp",
        "
        podSelector: {}
        policyTypes: [Egress]
        egress:
        - ports:
          - port: serve-80-tcp
        ",
    ));
    let mut closed = all();
    closed.expect_peer("x", "*", false);
    h.check(&[(TCP80, &all()), (TCP81, &closed), (UDP80, &closed)]);
}

/// Egress to a port number, then e2e: should enforce multiple egress
/// policies with egress allow-all policy taking precedence.
fn egress_to_a_port_then_allow_all(h: &Harness) {
    h.apply(&policy(
        "x",
        "egress-port-80",
        "
        podSelector: {}
        policyTypes: [Egress]
        egress:
        - ports:
          - port: 80
        ",
    ));
    let mut closed = all();
    closed.expect_peer("x", "*", false);
    h.check(&[(TCP80, &all()), (TCP81, &closed)]);
    h.apply(&policy(
        "x",
        "egress-all",
        "
        podSelector: {}
        policyTypes: [Egress]
        egress: [{}]
        ",
    ));
    h.check_all(&[TCP81, UDP81], &all());
}

/// Port ranges (endPort) on ingress: 80-81 opens both, then 81-82 only 81.
fn ingress_to_a_port_range(h: &Harness) {
    let spec = |from: u16, to: u16| {
        format!(
            "
            podSelector: {{matchLabels: {{pod: a}}}}
            ingress:
            - from:
              - namespaceSelector: {{matchLabels: {{ns: \"y\"}}}}
              ports:
              - {{port: {from}, endPort: {to}, protocol: TCP}}
            "
        )
    };
    h.apply(&policy("x", "x-a-from-y-range", &spec(80, 81)));
    let mut from_y = all();
    from_y.expect_peer("x", "x/a", false);
    from_y.expect_peer("z", "x/a", false);
    let mut closed = all();
    closed.expect_all_ingress("x/a", false);
    h.check(&[(TCP80, &from_y), (TCP81, &from_y), (UDP80, &closed)]);
    h.apply(&policy("x", "x-a-from-y-range", &spec(81, 82)));
    h.check(&[(TCP80, &closed), (TCP81, &from_y)]);
}

/// Port ranges (endPort) on egress, per protocol: TCP 79-80 and UDP 81-90.
fn egress_to_port_ranges(h: &Harness) {
    h.apply(&policy(
        "x",
        "egress-ranges",
        "
        podSelector: {}
        policyTypes: [Egress]
        egress:
        - ports:
          - {port: 79, endPort: 80, protocol: TCP}
          - {port: 81, endPort: 90, protocol: UDP}
        ",
    ));
    let mut closed = all();
    closed.expect_peer("x", "*", false);
    h.check(&[
        (TCP80, &all()),
        (UDP81, &all()),
        (TCP81, &closed),
        (UDP80, &closed),
    ]);
}

/// e2e: should enforce ingress policy allowing any port traffic to a
/// server on a specific protocol.
fn ingress_by_protocol_only(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-tcp-only",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - ports:
          - protocol: TCP
        ",
    ));
    let mut closed = all();
    closed.expect_all_ingress("x/a", false);
    h.check(&[(TCP80, &all()), (TCP81, &all()), (UDP80, &closed)]);
}

/// e2e: should not allow access by TCP when a policy specifies only UDP.
fn udp_allowed_does_not_open_tcp(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-udp-81-only",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - ports:
          - {port: 81, protocol: UDP}
        ",
    ));
    let mut closed = all();
    closed.expect_all_ingress("x/a", false);
    h.check(&[
        (UDP81, &all()),
        (TCP81, &closed),
        (TCP81.service(), &closed),
    ]);
}

/// e2e: should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP',
/// and should isolate pods selected by a policy allowing SCTP only.
fn sctp_allowed_does_not_open_tcp_or_udp(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-sctp-81-only",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - ports:
          - {port: 81, protocol: SCTP}
        ",
    ));
    let mut closed = all();
    closed.expect_all_ingress("x/a", false);
    h.check_all(&[TCP81, UDP81, TCP80], &closed);
}

/// e2e: should work with Ingress, Egress specified together.
fn ingress_and_egress_together(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-both",
        "
        podSelector: {matchLabels: {pod: a}}
        policyTypes: [Ingress, Egress]
        ingress:
        - from:
          - podSelector: {matchLabels: {pod: b}}
        egress:
        - ports:
          - port: 80
        ",
    ));
    let mut on80 = all();
    on80.expect_all_ingress("x/a", false);
    on80.expect("x/b", "x/a", true);
    let mut on81 = all();
    on81.expect_all_ingress("x/a", false);
    on81.expect_all_egress("x/a", false);
    on81.expect("x/b", "x/a", true);
    h.check(&[(TCP80, &on80), (TCP81, &on81)]);
}

const PORTS: &[Scenario] = &[
    ("ingress_to_a_port_number", ingress_to_a_port_number),
    ("ingress_to_a_udp_port_number", ingress_to_a_udp_port_number),
    ("ingress_to_a_named_port", ingress_to_a_named_port),
    (
        "ingress_from_a_namespace_to_a_named_port",
        ingress_from_a_namespace_to_a_named_port,
    ),
    ("ingress_to_a_named_udp_port", ingress_to_a_named_udp_port),
    ("egress_to_a_named_port", egress_to_a_named_port),
    (
        "egress_to_a_port_then_allow_all",
        egress_to_a_port_then_allow_all,
    ),
    ("ingress_to_a_port_range", ingress_to_a_port_range),
    ("egress_to_port_ranges", egress_to_port_ranges),
    ("ingress_by_protocol_only", ingress_by_protocol_only),
    (
        "udp_allowed_does_not_open_tcp",
        udp_allowed_does_not_open_tcp,
    ),
    (
        "sctp_allowed_does_not_open_tcp_or_udp",
        sctp_allowed_does_not_open_tcp_or_udp,
    ),
    ("ingress_and_egress_together", ingress_and_egress_together),
];

#[test]
fn netpol_ports() {
    Harness::run(Mode::Standalone, "np", PORTS);
}

#[test]
fn netpol_ports_kube() {
    Harness::run(Mode::Kube, "np", PORTS);
}

/// The same on the pods' IPv6 addresses and IPv6 ClusterIPs.
#[test]
fn netpol_ports_dual_stack() {
    Harness::run_dual_stack(Mode::Standalone, "np", PORTS);
}

#[test]
fn netpol_ports_dual_stack_kube() {
    Harness::run_dual_stack(Mode::Kube, "np", PORTS);
}

// ---- Group 3: policies and labels that change.

/// e2e: should enforce multiple, stacked policies with overlapping
/// podSelectors: allows add up.
fn stacked_policies_add_up(h: &Harness) {
    let spec = |port: u16| {
        format!(
            "
            podSelector: {{matchLabels: {{pod: a}}}}
            ingress:
            - from:
              - namespaceSelector: {{matchLabels: {{ns: \"y\"}}}}
              ports:
              - {{port: {port}, protocol: TCP}}
            "
        )
    };
    h.apply(&policy("x", "from-y-on-81", &spec(81)));
    let mut from_y = all();
    from_y.expect_peer("x", "x/a", false);
    from_y.expect_peer("z", "x/a", false);
    let mut closed = all();
    closed.expect_all_ingress("x/a", false);
    h.check(&[(TCP81, &from_y), (TCP80, &closed)]);
    h.apply(&policy("x", "from-y-on-80", &spec(80)));
    h.check(&[(TCP81, &from_y), (TCP80, &from_y)]);
}

/// e2e: should enforce multiple ingress policies with ingress allow-all
/// policy taking precedence.
fn allow_all_ingress_takes_precedence(h: &Harness) {
    h.apply(&policy(
        "x",
        "ingress-port-80",
        "
        podSelector: {}
        ingress:
        - ports:
          - port: 80
        ",
    ));
    let mut closed = all();
    closed.expect_peer("*", "x", false);
    h.check(&[(TCP81, &closed), (TCP80, &all())]);
    h.apply(&policy(
        "x",
        "ingress-all",
        "
        podSelector: {}
        ingress: [{}]
        ",
    ));
    h.check_all(&[TCP81, UDP81], &all());
}

/// e2e: should enforce updated policy (allow all becomes deny all), then
/// should stop enforcing policies after they are deleted.
fn policy_update_then_delete(h: &Harness) {
    h.apply(&policy(
        "x",
        "mutating",
        "
        podSelector: {}
        ingress: [{}]
        ",
    ));
    h.check_all(&[TCP81], &all());
    h.apply(&policy(
        "x",
        "mutating",
        "
        podSelector: {}
        policyTypes: [Ingress]
        ingress: []
        ",
    ));
    let mut denied = all();
    denied.expect_peer("*", "x", false);
    h.check_all(&[TCP81, UDP80], &denied);
    h.delete_policy("x", "mutating");
    h.check_all(&[TCP81, UDP80], &all());
}

/// A rule changed in place: from namespace y to namespace z.
fn rule_changed_in_place(h: &Harness) {
    let spec = |ns: &str| {
        format!(
            "
            podSelector: {{matchLabels: {{pod: a}}}}
            ingress:
            - from:
              - namespaceSelector: {{matchLabels: {{ns: \"{ns}\"}}}}
            "
        )
    };
    h.apply(&policy("x", "from-one-namespace", &spec("y")));
    let mut from_y = all();
    from_y.expect_peer("x", "x/a", false);
    from_y.expect_peer("z", "x/a", false);
    h.check_all(&[TCP80], &from_y);
    h.apply(&policy("x", "from-one-namespace", &spec("z")));
    let mut from_z = all();
    from_z.expect_peer("x", "x/a", false);
    from_z.expect_peer("y", "x/a", false);
    h.check_all(&[TCP80, UDP81], &from_z);
}

/// e2e: should stop enforcing policies after they are deleted (deny all
/// in and out of x).
fn deny_all_then_delete(h: &Harness) {
    h.apply(&policy(
        "x",
        "deny-all",
        "
        podSelector: {}
        policyTypes: [Ingress, Egress]
        ",
    ));
    let mut r = all();
    r.expect_peer("x", "*", false);
    r.expect_peer("*", "x", false);
    h.check_all(&[TCP80], &r);
    h.delete_policy("x", "deny-all");
    h.check_all(&[TCP80, UDP80], &all());
}

/// e2e: should allow ingress access from updated pod (and the access goes
/// when the label does).
fn pod_label_update_grants_access(h: &Harness) {
    h.apply(&policy(
        "x",
        "from-updated-b",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - from:
          - podSelector: {matchLabels: {pod: b, pod2: updated}}
        ",
    ));
    let mut closed = all();
    closed.expect_all_ingress("x/a", false);
    h.check_all(&[TCP80], &closed);
    h.label_pod("x/b", &[("pod2", Some("updated"))]);
    let mut from_b = closed.clone();
    from_b.expect("x/b", "x/a", true);
    h.check_all(&[TCP80, UDP80], &from_b);
    h.label_pod("x/b", &[("pod2", None)]);
    h.check_all(&[TCP80], &closed);
}

/// e2e: should deny ingress access to updated pod (and allow again when
/// the label goes).
fn pod_label_update_isolates(h: &Harness) {
    h.apply(&policy(
        "x",
        "deny-isolated",
        "
        podSelector: {matchLabels: {target: isolated}}
        policyTypes: [Ingress]
        ",
    ));
    h.check_all(&[TCP80], &all());
    h.label_pod("x/a", &[("target", Some("isolated"))]);
    let mut closed = all();
    closed.expect_all_ingress("x/a", false);
    h.check_all(&[TCP80, UDP81], &closed);
    h.label_pod("x/a", &[("target", None)]);
    h.check_all(&[TCP80], &all());
}

/// e2e: should allow ingress access from updated namespace (and the access
/// goes when the namespace's label does).
fn namespace_label_update_grants_access(h: &Harness) {
    h.apply(&policy(
        "x",
        "from-updated-namespace",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - from:
          - namespaceSelector: {matchLabels: {ns2: updated}}
        ",
    ));
    let mut closed = all();
    closed.expect_all_ingress("x/a", false);
    h.check_all(&[TCP80], &closed);
    h.label_namespace("y", &[("ns2", Some("updated"))]);
    let mut from_y = closed.clone();
    from_y.expect_peer("y", "*", true);
    h.check_all(&[TCP80, UDP81], &from_y);
    h.label_namespace("y", &[("ns2", None)]);
    h.check_all(&[TCP80], &closed);
}

/// A namespace relabelled away from an egress rule's selector loses the
/// access: x/a may talk only to namespaces labelled ns=y.
fn namespace_label_update_revokes_egress(h: &Harness) {
    h.apply(&policy(
        "x",
        "to-ns-y",
        "
        podSelector: {matchLabels: {pod: a}}
        policyTypes: [Egress]
        egress:
        - to:
          - namespaceSelector: {matchLabels: {ns: \"y\"}}
        ",
    ));
    let mut to_y = all();
    to_y.expect_all_egress("x/a", false);
    to_y.expect_peer("x/a", "y", true);
    h.check_all(&[TCP80], &to_y);
    h.label_namespace("y", &[("ns", Some("moved"))]);
    let mut none = all();
    none.expect_all_egress("x/a", false);
    h.check_all(&[TCP80], &none);
}

const CHANGES: &[Scenario] = &[
    ("stacked_policies_add_up", stacked_policies_add_up),
    (
        "allow_all_ingress_takes_precedence",
        allow_all_ingress_takes_precedence,
    ),
    ("policy_update_then_delete", policy_update_then_delete),
    ("rule_changed_in_place", rule_changed_in_place),
    ("deny_all_then_delete", deny_all_then_delete),
    (
        "pod_label_update_grants_access",
        pod_label_update_grants_access,
    ),
    ("pod_label_update_isolates", pod_label_update_isolates),
    (
        "namespace_label_update_grants_access",
        namespace_label_update_grants_access,
    ),
    (
        "namespace_label_update_revokes_egress",
        namespace_label_update_revokes_egress,
    ),
];

#[test]
fn netpol_changes() {
    Harness::run(Mode::Standalone, "nc", CHANGES);
}

#[test]
fn netpol_changes_kube() {
    Harness::run(Mode::Kube, "nc", CHANGES);
}

/// The same on the pods' IPv6 addresses and IPv6 ClusterIPs.
#[test]
fn netpol_changes_dual_stack() {
    Harness::run_dual_stack(Mode::Standalone, "nc", CHANGES);
}

#[test]
fn netpol_changes_dual_stack_kube() {
    Harness::run_dual_stack(Mode::Kube, "nc", CHANGES);
}

// ---- Group 4: ipBlock, DNS, Services.

/// e2e: should allow egress access to server in CIDR block.
fn egress_to_an_ip_block(h: &Harness) {
    let yb = h.model.host_cidr("y/b");
    h.apply(&policy(
        "x",
        "x-a-to-y-b-ip",
        &format!(
            "
            podSelector: {{matchLabels: {{pod: a}}}}
            policyTypes: [Egress]
            egress:
            - to:
              - ipBlock: {{cidr: {yb}}}
            "
        ),
    ));
    let mut r = all();
    r.expect_all_egress("x/a", false);
    r.expect("x/a", "y/b", true);
    h.check_all(&[TCP80, UDP80], &r);
}

/// e2e: should enforce except clause while egress access to server in
/// CIDR block; then should ensure an IP overlapping both IPBlock.CIDR and
/// IPBlock.Except is allowed (by another rule).
fn egress_ip_block_except(h: &Harness) {
    let xb = h.model.host_cidr("x/b");
    let net = h.model.pod_network();
    h.apply(&policy(
        "x",
        "x-a-to-all-but-x-b",
        &format!(
            "
            podSelector: {{matchLabels: {{pod: a}}}}
            policyTypes: [Egress]
            egress:
            - to:
              - ipBlock: {{cidr: {net}, except: [{xb}]}}
            "
        ),
    ));
    let mut r = all();
    r.expect("x/a", "x/b", false);
    h.check_all(&[TCP80, UDP81], &r);
    h.apply(&policy(
        "x",
        "x-a-to-x-b",
        &format!(
            "
            podSelector: {{matchLabels: {{pod: a}}}}
            policyTypes: [Egress]
            egress:
            - to:
              - ipBlock: {{cidr: {xb}}}
            "
        ),
    ));
    h.check_all(&[TCP80, UDP81], &all());
    // The first policy goes: x/a may reach only x/b.
    h.delete_policy("x", "x-a-to-all-but-x-b");
    let mut only_b = all();
    only_b.expect_all_egress("x/a", false);
    only_b.expect("x/a", "x/b", true);
    h.check_all(&[TCP80], &only_b);
}

/// ipBlock with except on ingress, to pod IPs and through Services (the
/// client's address survives the ClusterIP, so the same pair is denied).
fn ingress_ip_block_except(h: &Harness) {
    let yb = h.model.host_cidr("y/b");
    let net = h.model.pod_network();
    h.apply(&policy(
        "x",
        "x-a-from-all-but-y-b",
        &format!(
            "
            podSelector: {{matchLabels: {{pod: a}}}}
            ingress:
            - from:
              - ipBlock: {{cidr: {net}, except: [{yb}]}}
            "
        ),
    ));
    let mut r = all();
    r.expect("y/b", "x/a", false);
    h.check_all(&[TCP80, UDP80, TCP80.service(), UDP81.service()], &r);
}

/// Egress to DNS only: port 53 over UDP and TCP to anywhere. Pod to pod
/// fails on every port, and names resolve through the cluster DNS Service.
fn egress_to_dns_only(h: &Harness) {
    h.apply(&policy(
        "x",
        "dns-only",
        "
        podSelector: {}
        policyTypes: [Egress]
        egress:
        - ports:
          - {port: 53, protocol: UDP}
          - {port: 53, protocol: TCP}
        ",
    ));
    let mut r = all();
    r.expect_peer("x", "*", false);
    h.check_all(&[TCP80, UDP80, TCP81.service()], &r);
    lookup_eventually(
        h,
        "x/a",
        "s-b.y.svc.cluster.local",
        Ok(service_ip(h, "y/b")),
    );
    lookup_eventually(
        h,
        "x/c",
        "s-a.z.svc.cluster.local",
        Ok(service_ip(h, "z/a")),
    );
}

/// Egress to the cluster DNS pods by namespace name and pod label (what
/// real clusters write), plus namespace y; names resolve, y is reachable,
/// the rest is not.
fn egress_to_kube_dns_and_one_namespace(h: &Harness) {
    h.apply(&policy(
        "x",
        "kube-dns-and-y",
        "
        podSelector: {}
        policyTypes: [Egress]
        egress:
        - to:
          - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}
            podSelector: {matchLabels: {k8s-app: kube-dns}}
          ports:
          - {port: 53, protocol: UDP}
          - {port: 53, protocol: TCP}
        - to:
          - namespaceSelector: {matchLabels: {ns: \"y\"}}
        ",
    ));
    let mut r = all();
    r.expect_peer("x", "*", false);
    r.expect_peer("x", "y", true);
    h.check_all(&[TCP80, UDP81, TCP80.service()], &r);
    lookup_eventually(
        h,
        "x/b",
        "s-c.z.svc.cluster.local",
        Ok(service_ip(h, "z/c")),
    );
}

/// Probes to ClusterIPs are judged by the endpoint pod's ingress policy,
/// after DNAT: x takes traffic from y only, whichever address it came to.
fn services_judged_by_endpoint_ingress(h: &Harness) {
    h.apply(&policy(
        "x",
        "from-y-only",
        "
        podSelector: {}
        ingress:
        - from:
          - namespaceSelector: {matchLabels: {ns: \"y\"}}
        ",
    ));
    let mut r = all();
    r.expect_peer("*", "x", false);
    r.expect_peer("y", "x", true);
    h.check_all(
        &[TCP80.service(), UDP80.service(), TCP81.service(), TCP81],
        &r,
    );
}

/// An egress rule naming pods allows their Services' ClusterIPs: the
/// client's egress is judged after DNAT, on the endpoint.
fn services_judged_by_client_egress_after_dnat(h: &Harness) {
    h.apply(&policy(
        "x",
        "x-a-to-pods-a",
        "
        podSelector: {matchLabels: {pod: a}}
        policyTypes: [Egress]
        egress:
        - to:
          - namespaceSelector: {}
            podSelector: {matchLabels: {pod: a}}
        ",
    ));
    let mut r = all();
    r.expect_all_egress("x/a", false);
    r.expect_peer("x/a", "y/a", true);
    r.expect_peer("x/a", "z/a", true);
    h.check_all(&[TCP80.service(), UDP81.service(), TCP80], &r);
}

/// A Service whose named targetPorts swap the pod's ports cannot carry
/// traffic past a policy: x/a takes serve-81-tcp only, so the Service's
/// port 81 (to container port 80) is dropped and its port 80 (to 81)
/// answers.
fn named_target_port_cannot_bypass_policy(h: &Harness) {
    h.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: swapped, namespace: x}\nspec:\n  \
         selector: {pod: a}\n  ports:\n  \
         - {name: to-81, port: 80, protocol: TCP, targetPort: serve-81-tcp}\n  \
         - {name: to-80, port: 81, protocol: TCP, targetPort: serve-80-tcp}\n",
    );
    let ip: IpAddr = harness_eventually_cluster_ip(h, "x", "swapped");
    let to = |port| SocketAddr::new(ip, port);
    // Both ports answer before any policy.
    for port in [80, 81] {
        h.eventually_reach(
            "the swapped Service, no policy",
            "y/a",
            to(port),
            false,
            |r| *r == Reach::Connected("x/a".into()),
        );
    }
    h.apply(&policy(
        "x",
        "x-a-serve-81-tcp-only",
        "
        podSelector: {matchLabels: {pod: a}}
        ingress:
        - ports:
          - port: serve-81-tcp
        ",
    ));
    let mut closed = all();
    closed.expect_all_ingress("x/a", false);
    h.check(&[(TCP80, &closed), (TCP81, &all())]);
    h.eventually_reach("port 81 to container port 80", "y/a", to(81), false, |r| {
        *r == Reach::TimedOut
    });
    h.eventually_reach("port 80 to container port 81", "y/a", to(80), false, |r| {
        *r == Reach::Connected("x/a".into())
    });
    h.cluster.delete("svc", Some("x"), "swapped");
}

/// The ClusterIP of a Service once allocated.
fn harness_eventually_cluster_ip(h: &Harness, ns: &str, name: &str) -> IpAddr {
    podnet_testkit::eventually(
        &format!("a ClusterIP for {ns}/{name}"),
        Duration::from_secs(20),
        || {
            h.cluster.get_json("svc", Some(ns), name)["spec"]["clusterIP"]
                .as_str()
                .and_then(|s| s.parse().ok())
        },
    )
}

const ADDRESSES: &[Scenario] = &[
    ("egress_to_an_ip_block", egress_to_an_ip_block),
    ("egress_ip_block_except", egress_ip_block_except),
    ("ingress_ip_block_except", ingress_ip_block_except),
    ("egress_to_dns_only", egress_to_dns_only),
    (
        "egress_to_kube_dns_and_one_namespace",
        egress_to_kube_dns_and_one_namespace,
    ),
    (
        "services_judged_by_endpoint_ingress",
        services_judged_by_endpoint_ingress,
    ),
    (
        "services_judged_by_client_egress_after_dnat",
        services_judged_by_client_egress_after_dnat,
    ),
    (
        "named_target_port_cannot_bypass_policy",
        named_target_port_cannot_bypass_policy,
    ),
];

#[test]
fn netpol_addresses() {
    Harness::run(Mode::Standalone, "na", ADDRESSES);
}

#[test]
fn netpol_addresses_kube() {
    Harness::run(Mode::Kube, "na", ADDRESSES);
}

/// The same in a dual-stack lab: ipBlocks of IPv6 CIDRs, probes to the
/// pods' IPv6 addresses and through the Services' IPv6 ClusterIPs.
#[test]
fn netpol_addresses_dual_stack() {
    Harness::run_dual_stack(Mode::Standalone, "nd", ADDRESSES);
}

#[test]
fn netpol_addresses_dual_stack_kube() {
    Harness::run_dual_stack(Mode::Kube, "nd", ADDRESSES);
}

// ---- Group 5: no open window, --policy-strict, every drop explained.

/// A new pod's first packet already meets its policies: the probes start
/// the moment `lab run` returns, once each, and are judged right: the
/// allowed one connects at once, the denied one is dropped. On both nodes.
fn a_new_pod_is_judged_from_its_first_packet(h: &Harness) {
    h.apply(&policy(
        "x",
        "fresh-from-b",
        "
        podSelector: {matchExpressions: [{key: pod, operator: In, values: [fresh, a, b]}]}
        ingress:
        - from: [{podSelector: {matchLabels: {pod: b}}}]
          ports: [{port: 80}]
        ",
    ));
    // The policy is in force on both nodes before the new pods exist: it
    // isolates x/a and x/b, one on each node.
    let mut r = all();
    r.expect_all_ingress("x/a", false)
        .expect_all_ingress("x/b", false)
        .expect("x/b", "x/a", true);
    h.check_all(&[TCP80], &r);
    for node in ["node1", "node2"] {
        let name = format!("fresh{}", &node[4..]);
        let id = format!("x/{name}");
        h.cluster.lab_ok(&[
            "run",
            &id,
            "--node",
            node,
            "--labels",
            "pod=fresh",
            "--ports",
            "serve-80-tcp=80/tcp",
        ]);
        let ip: IpAddr = h.cluster.lab.pod("x", &name).unwrap().ip.parse().unwrap();
        let addr = SocketAddr::new(ip, 80);
        // At once, no retry: allowed from x/b, dropped from x/c and y/b.
        assert_eq!(
            h.reach("x/b", addr, false),
            Reach::Connected(id.clone()),
            "x/b -> {id} right after lab run"
        );
        assert_eq!(h.reach("x/c", addr, false), Reach::TimedOut, "x/c -> {id}");
        assert_eq!(h.reach("y/b", addr, false), Reach::TimedOut, "y/b -> {id}");
        h.cluster.lab_ok(&["rm", &id]);
    }
}

/// The agent's log line and metrics for one denied connection, and
/// `podnet policy explain --lab`, name the policy that isolated it, and
/// what the kernel did.
fn a_denied_connection_is_explained(h: &Harness) {
    h.apply(&policy(
        "y",
        "only-from-y",
        "
        podSelector: {matchLabels: {pod: b}}
        ingress:
        - from: [{podSelector: {}}]
        ",
    ));
    let mut r = all();
    r.expect_peer("x", "y/b", false)
        .expect_peer("z", "y/b", false);
    h.check_all(&[TCP80], &r);
    let yb = h.model.pod("y/b").clone();
    assert_eq!(
        h.reach("x/a", SocketAddr::new(yb.ip, 81), false),
        Reach::TimedOut
    );
    let log = h.cluster.lab.log_path(&format!("agent-{}", yb.node));
    let want = "src=x/a dst=y/b port=81 proto=\"tcp\" policies=y/only-from-y";
    podnet_testkit::eventually(
        "the agent explains the drop",
        Duration::from_secs(10),
        || {
            std::fs::read_to_string(&log).is_ok_and(|l| {
                l.lines().any(|line| {
                    line.contains(
                        "denied: ingress of y/b: isolated by [y/only-from-y], no rule allowed it",
                    ) && line.contains(want)
                })
            })
        },
    );
    // Counted per policy on the node's agent.
    let ns = podnet_kernel::Netns::named(&format!("pn-{}-{}", h.cluster.name, yb.node)).unwrap();
    let (code, body) =
        podnet_testkit::http_get(Some(&ns), ([127, 0, 0, 1], 10249).into(), "/metrics").unwrap();
    assert_eq!(code, 200);
    let line = body
        .lines()
        .find(|l| {
            l.starts_with("podnet_policy_denied_by_policy_total")
                && l.contains("policy=\"y/only-from-y\"")
        })
        .unwrap_or_else(|| panic!("no per-policy count in:\n{body}"));
    let n: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 1.0, "{line}");
    // explain: the evaluator's reasons and the kernel's verdict.
    let out = h.cluster.podnet(
        &[
            "policy",
            "explain",
            "--lab",
            &h.cluster.name,
            "x/a",
            "y/b:81/tcp",
        ],
        None,
    );
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(": DENIED"), "{text}");
    assert!(
        text.contains("ingress of y/b: isolated by y/only-from-y"),
        "{text}"
    );
    assert!(text.contains("no peer selects x/a"), "{text}");
    assert!(
        text.contains(&format!("kernel on {}", yb.node))
            && text.contains("drop (podnet-policy ingress)"),
        "{text}"
    );
    // And an allowed flow says which rule allowed it.
    let out = h.cluster.podnet(
        &[
            "policy",
            "explain",
            "--lab",
            &h.cluster.name,
            "y/a",
            "y/b:81/tcp",
        ],
        None,
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains(": ALLOWED"), "{text}");
    assert!(
        text.contains("allowed by y/only-from-y ingress[0]"),
        "{text}"
    );
}

/// An established connection that a new policy no longer allows survives
/// by default (new connections are judged), and is cut with
/// `--policy-strict` in the sync that applies the change.
fn policy_strict_cuts_established_connections(h: &Harness) {
    use std::io::{Read, Write};
    let c = &h.cluster;
    let xa = h.model.pod("x/a").clone();
    let pod_ns = |id: &str| {
        let (ns, p) = id.split_once('/').unwrap();
        podnet_kernel::Netns::named(&c.lab.pod(ns, p).unwrap().netns).unwrap()
    };
    // The listener's family is the model's (IPv6 in a dual-stack lab).
    let any: IpAddr = match xa.ip {
        IpAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    let open = |port: u16| {
        let l = pod_ns("x/a")
            .run(|| std::net::TcpListener::bind((any, port)))
            .unwrap()
            .unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 64];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 || s.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        });
        let conn = pod_ns("y/b")
            .run(|| std::net::TcpStream::connect((xa.ip, port)))
            .unwrap()
            .unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        (conn, server)
    };
    let round_trip = |conn: &mut std::net::TcpStream| -> bool {
        let mut buf = [0u8; 64];
        conn.write_all(b"ping").is_ok() && matches!(conn.read(&mut buf), Ok(4))
    };
    let deny = policy(
        "x",
        "deny-all-in",
        "
        podSelector: {}
        policyTypes: [Ingress]
        ",
    );
    let mut denied = all();
    denied.expect_peer("*", "x", false);

    // Default: the connection outlives the policy that denies new ones.
    let (mut conn, _srv) = open(9100);
    assert!(round_trip(&mut conn));
    h.apply(&deny);
    h.check_all(&[TCP80], &denied);
    assert!(round_trip(&mut conn), "established traffic is not judged");
    drop(conn);
    h.delete_policy("x", "deny-all-in");
    h.check_all(&[TCP80], &all());

    // Strict: restart x/a's agent with PODNET_POLICY_STRICT, then the same.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_podnet"))
        .args(["lab", "--name", &c.name, "restart-agent", &xa.node])
        .env("PODNET_POLICY_STRICT", "true")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ns = podnet_kernel::Netns::named(&format!("pn-{}-{}", c.name, xa.node)).unwrap();
    agent_ready(h, &xa.node);
    let (mut conn, _srv) = open(9101);
    assert!(round_trip(&mut conn));
    h.apply(&deny);
    h.check_all(&[TCP80], &denied);
    assert!(
        !round_trip(&mut conn),
        "--policy-strict cut the established connection"
    );
    // Cut by the agent, which counted it.
    let (_, body) =
        podnet_testkit::http_get(Some(&ns), ([127, 0, 0, 1], 10249).into(), "/metrics").unwrap();
    assert!(
        body.lines()
            .any(|l| l.starts_with("podnet_policy_connections_cut_total") && !l.ends_with(" 0")),
        "{body}"
    );
    // Back to the lab's default agent for the next scenario.
    c.lab_ok(&["restart-agent", &xa.node]);
    agent_ready(h, &xa.node);
}

/// Waits for a (restarted) agent's `/readyz`; on timeout, shows its log.
fn agent_ready(h: &Harness, node: &str) {
    let c = &h.cluster;
    let ns = podnet_kernel::Netns::named(&format!("pn-{}-{node}", c.name)).unwrap();
    let r = podnet_testkit::try_eventually(Duration::from_secs(30), || {
        podnet_testkit::http_get(Some(&ns), ([127, 0, 0, 1], 10249).into(), "/readyz")
            .is_some_and(|(code, _)| code == 200)
    });
    if let Err(e) = r {
        let log =
            std::fs::read_to_string(c.lab.log_path(&format!("agent-{node}"))).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        let ready = podnet_testkit::http_get(Some(&ns), ([127, 0, 0, 1], 10249).into(), "/readyz");
        panic!(
            "the agent on {node} not ready in 30 s ({e:?}); /readyz {ready:?}; agent log:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
}

const ENFORCEMENT: &[Scenario] = &[
    (
        "a_new_pod_is_judged_from_its_first_packet",
        a_new_pod_is_judged_from_its_first_packet,
    ),
    (
        "a_denied_connection_is_explained",
        a_denied_connection_is_explained,
    ),
    (
        "policy_strict_cuts_established_connections",
        policy_strict_cuts_established_connections,
    ),
];

#[test]
fn netpol_enforcement() {
    Harness::run(Mode::Standalone, "ne", ENFORCEMENT);
}

#[test]
fn netpol_enforcement_kube() {
    Harness::run(Mode::Kube, "ne", ENFORCEMENT);
}

/// The same on the pods' IPv6 addresses and IPv6 ClusterIPs.
#[test]
fn netpol_enforcement_dual_stack() {
    Harness::run_dual_stack(Mode::Standalone, "ne", ENFORCEMENT);
}

#[test]
fn netpol_enforcement_dual_stack_kube() {
    Harness::run_dual_stack(Mode::Kube, "ne", ENFORCEMENT);
}
