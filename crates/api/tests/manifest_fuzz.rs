//! Bounded fuzzing of the manifest parser with proptest: random bytes, and
//! valid multi-document manifests (YAML, JSON streams, JSON Lists) that are
//! then mutated. Nothing may panic, and the answer is always either every
//! object or a non-empty list of errors that each name a document and a
//! line inside the source. A document broken on purpose is the one named,
//! and the documents around it are not silently dropped.

use podnet_api::manifest::{parse, Doc};
use proptest::prelude::*;
use serde_json::{json, Value};

/// One valid object of each kind podnet stores.
fn pool() -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop", "labels": {"team": "a"}}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
               "spec": {"clusterIP": "10.96.0.20", "selector": {"app": "web"},
                        "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-1", "namespace": "shop", "labels": {"app": "web"}},
               "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 8080}]}]},
               "status": {"phase": "Running", "podIP": "10.244.1.5", "conditions": [{"type": "Ready", "status": "True"}]}}),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, "spec": {"podCIDR": "10.244.1.0/24"}}),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "web-x", "namespace": "shop"},
               "addressType": "IPv4", "endpoints": [{"addresses": ["10.244.1.5"]}], "ports": [{"port": 8080}]}),
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "deny", "namespace": "shop"},
               "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}),
        json!({"apiVersion": "podnet.io/v1", "kind": "NetworkConfig", "metadata": {"name": "default"},
               "spec": {"Network": "10.244.0.0/16", "SubnetLen": 24, "Backend": {"Type": "vxlan", "VNI": 1}}}),
        json!({"apiVersion": "podnet.io/v1", "kind": "IPAddressPool", "metadata": {"name": "lan"},
               "spec": {"addresses": ["192.0.2.0/28", "2001:db8::10-2001:db8::20"], "autoAssign": false}}),
        json!({"apiVersion": "podnet.io/v1", "kind": "BGPPeer", "metadata": {"name": "tor"},
               "spec": {"peerIP": "192.0.2.1", "asNumber": 65001, "bfd": true}}),
        json!({"apiVersion": "podnet.io/v1", "kind": "BGPConfiguration", "metadata": {"name": "default"},
               "spec": {"asNumber": 64512, "serviceLoadBalancerIPs": [{"cidr": "192.0.2.0/24"}]}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "np"},
               "spec": {"type": "NodePort", "ports": [{"port": 53, "protocol": "UDP", "nodePort": 30053}]}}),
    ]
}

/// How a generated manifest is written.
#[derive(Debug, Clone, Copy)]
enum Form {
    Yaml,
    JsonStream,
    JsonList,
}

/// A valid manifest: its text, and per document its byte range and the
/// line its content starts on.
struct Manifest {
    text: String,
    docs: Vec<(std::ops::Range<usize>, usize)>,
    objects: Vec<Value>,
}

fn lines_before(s: &str) -> usize {
    s.matches('\n').count() + 1
}

fn manifest(picks: &[usize], form: Form, decor: u8) -> Manifest {
    let pool = pool();
    let objects: Vec<Value> = picks.iter().map(|i| pool[i % pool.len()].clone()).collect();
    let mut text = String::new();
    let mut docs = Vec::new();
    match form {
        Form::Yaml => {
            if decor & 1 != 0 {
                text.push_str("# generated\n");
            }
            for (i, o) in objects.iter().enumerate() {
                if i > 0 || decor & 2 != 0 {
                    text.push_str(if decor & 4 != 0 {
                        "--- # next\n"
                    } else {
                        "---\n"
                    });
                }
                if decor & 8 != 0 {
                    text.push_str("\n# about this one\n");
                }
                let start = text.len();
                text.push_str(&serde_yaml::to_string(o).unwrap());
                docs.push((start..text.len(), lines_before(&text[..start])));
            }
        }
        Form::JsonStream => {
            for o in &objects {
                if decor & 1 != 0 {
                    text.push_str("\n\n");
                }
                let start = text.len();
                let body = if decor & 2 != 0 {
                    serde_json::to_string_pretty(o).unwrap()
                } else {
                    serde_json::to_string(o).unwrap()
                };
                text.push_str(&body);
                docs.push((start..text.len(), lines_before(&text[..start])));
                text.push('\n');
            }
        }
        Form::JsonList => {
            let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
            text = serde_json::to_string_pretty(&list).unwrap();
            docs.push((0..text.len(), 1));
        }
    }
    Manifest {
        text,
        docs,
        objects,
    }
}

fn form(n: u8) -> Form {
    match n % 3 {
        0 => Form::Yaml,
        1 => Form::JsonStream,
        _ => Form::JsonList,
    }
}

/// The invariants every answer keeps, whatever the input.
fn check(src: &[u8]) -> Result<Vec<Doc>, Vec<podnet_api::manifest::DocError>> {
    // Every decoding keeps each newline byte, so this bounds the lines.
    let max_line = src.iter().filter(|b| **b == b'\n').count() + 1;
    let res = parse(src);
    match &res {
        Ok(docs) => {
            let mut last = (0, 0);
            for d in docs {
                assert!(d.pos.index >= 1 && d.pos.line >= 1 && d.pos.line <= max_line);
                assert!((d.pos.index, d.pos.line) >= last, "out of order: {docs:?}");
                last = (d.pos.index, d.pos.line);
                assert!(!d.object.describe().is_empty());
            }
        }
        Err(errs) => {
            assert!(!errs.is_empty(), "an error names no document");
            for e in errs {
                assert!(e.pos.index >= 1, "{e}");
                assert!(
                    e.pos.line >= 1 && e.pos.line <= max_line,
                    "{e} (lines: {max_line})"
                );
                assert!(
                    e.to_string()
                        .starts_with(&format!("document {}", e.pos.index)),
                    "{e}"
                );
            }
        }
    }
    res
}

const TOKENS: &[&str] = &[
    "---\n",
    "--- x\n",
    "...\n",
    "{",
    "}",
    "[",
    "]",
    ":",
    ": ",
    "\"",
    "'",
    "\t",
    "\n",
    "- ",
    "? ",
    "&a ",
    "*a",
    "*b ",
    "!!binary ",
    "!tag ",
    "%YAML 1.2\n",
    "\\u",
    "\0",
    "\u{feff}",
    "#",
    "|\n",
    ">-\n",
    "null",
    "~",
    "1e999",
    "-",
    "  ",
    "\r\n",
    "\u{2028}",
    "items: 3\n",
    "kind: List\n",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(src in proptest::collection::vec(any::<u8>(), 0..800)) {
        let _ = check(&src);
    }

    #[test]
    fn valid_manifests_parse_whole(
        picks in proptest::collection::vec(0usize..8, 1..7),
        f in any::<u8>(),
        decor in any::<u8>(),
        bom in any::<bool>(),
    ) {
        let m = manifest(&picks, form(f), decor);
        let mut src = if bom { vec![0xEF, 0xBB, 0xBF] } else { Vec::new() };
        src.extend_from_slice(m.text.as_bytes());
        let docs = check(&src).unwrap_or_else(|e| panic!("{e:?}\n{}", m.text));
        let got: Vec<Value> = docs.iter().map(|d| d.object.to_value()).collect();
        prop_assert_eq!(got.len(), m.objects.len());
        for (d, want) in docs.iter().zip(&m.objects) {
            prop_assert_eq!(d.object.describe(), podnet_api::Object::from_value(want.clone()).unwrap().describe());
        }
        if !matches!(form(f), Form::JsonList) {
            let lines: Vec<usize> = docs.iter().map(|d| d.pos.line).collect();
            let want: Vec<usize> = m.docs.iter().map(|(_, l)| *l).collect();
            prop_assert_eq!(lines, want);
        }
    }

    #[test]
    fn mutated_manifests_never_panic(
        picks in proptest::collection::vec(0usize..8, 1..6),
        f in any::<u8>(),
        decor in any::<u8>(),
        edits in proptest::collection::vec((any::<u16>(), any::<u8>(), 0usize..TOKENS.len(), 0u8..5), 1..6),
        cut in any::<u16>(),
    ) {
        let m = manifest(&picks, form(f), decor);
        let mut src = m.text.into_bytes();
        for (at, byte, token, op) in edits {
            let i = at as usize % (src.len() + 1);
            match op {
                0 if i < src.len() => src[i] = byte,
                1 => { src.splice(i..i, TOKENS[token].bytes()); }
                2 => { let end = (i + byte as usize % 16).min(src.len()); src.drain(i..end); }
                3 => { let end = (i + byte as usize % 64).min(src.len()); let dup = src[i..end].to_vec(); src.splice(i..i, dup); }
                _ => src.insert(i.min(src.len()), byte),
            }
        }
        if cut % 3 == 0 {
            src.truncate(cut as usize % (src.len() + 1));
        }
        let _ = check(&src);
    }

    #[test]
    fn a_broken_document_is_named_and_hides_nothing(
        picks in proptest::collection::vec(0usize..8, 2..7),
        json in any::<bool>(),
        which in any::<usize>(),
        cut in any::<usize>(),
        decor in any::<u8>(),
    ) {
        let m = manifest(&picks, if json { Form::JsonStream } else { Form::Yaml }, decor);
        let k = which % m.docs.len();
        let (range, line) = m.docs[k].clone();
        let src = if json {
            // Truncated JSON: cut strictly inside document k's object.
            let at = range.start + 1 + cut % (range.len() - 1);
            m.text[..at].to_string()
        } else {
            // A YAML syntax error in place of document k's body.
            format!("{}kind: Namespace\nmetadata: {{name: [unclosed\n{}", &m.text[..range.start], &m.text[range.end..])
        };
        let errs = check(src.as_bytes()).expect_err("a broken document was accepted");
        prop_assert_eq!(errs.len(), 1, "{:?}", errs);
        prop_assert_eq!(errs[0].pos.index, k + 1);
        prop_assert_eq!(errs[0].pos.line, line);
        let msg = errs[0].to_string();
        prop_assert!(msg.contains(if json { "invalid JSON" } else { "invalid YAML" }), "{}", msg);
        if !json {
            // Every other document still parses: fixing k gives them all back.
            let fixed = format!("{}{}", &m.text[..range.start], &m.text[range.end..]);
            prop_assert_eq!(check(fixed.as_bytes()).unwrap().len(), m.objects.len() - 1);
        }
    }
}
