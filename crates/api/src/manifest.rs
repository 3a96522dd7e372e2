//! Reading kubectl-style manifests: multi-document YAML or JSON (a single
//! object, a `List` with `items`, or a JSON array).
//!
//! [`parse`] reads a whole source before anything is applied and returns
//! either every object in it or every document it could not read, each named
//! by its index and starting line. It reads the way kubectl does
//! (k8s.io/cli-runtime's `FileVisitor` and `StreamVisitor`,
//! k8s.io/apimachinery's `YAMLOrJSONDecoder` and `YAMLReader`):
//! - a leading byte order mark picks the encoding: a UTF-8 one is dropped,
//!   UTF-16 (LE or BE) is transcoded; without one the text is UTF-8, and
//!   ill-formed bytes become U+FFFD, as Go's UTF-8 decoder makes them;
//! - a source whose first non-blank character is `{` (or `[`, podnet's
//!   extension) is a stream of JSON values; anything else is YAML, split into
//!   documents at lines that start with `---` (only a comment may follow);
//! - empty, comment-only and `null` documents are skipped, so a source may
//!   hold no object at all (the caller decides whether that is an error).
//!
//! A YAML document that fails does not hide the ones after it: each is
//! parsed on its own. A JSON stream cannot resynchronise after a syntax
//! error, so it reports the first one.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde_json::Value;

use crate::object::Object;
use crate::ApiError;

/// Where a document sits in its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// 1-based index among the source's non-empty documents.
    pub index: usize,
    /// 1-based index in the document's `List` (or JSON array), if it is one.
    pub item: Option<usize>,
    /// 1-based line where the document's content starts.
    pub line: usize,
}

impl Position {
    /// "document 2 (Service shop/web) at line 7", the label when known.
    pub fn describe(&self, label: Option<&str>) -> String {
        let mut s = format!("document {}", self.index);
        if let Some(i) = self.item {
            s.push_str(&format!(" item {i}"));
        }
        if let Some(l) = label {
            s.push_str(&format!(" ({l})"));
        }
        s.push_str(&format!(" at line {}", self.line));
        s
    }
}

/// One decoded object and where it came from.
#[derive(Debug, Clone)]
pub struct Doc {
    pub pos: Position,
    pub object: Object,
}

impl Doc {
    /// "document 2 (Service shop/web) at line 7".
    pub fn describe(&self) -> String {
        self.pos.describe(Some(&self.object.describe()))
    }
}

/// A document that could not be read, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocError {
    pub pos: Position,
    /// kind and name as far as they could be read ("Service web").
    pub label: Option<String>,
    pub error: ApiError,
}

impl fmt::Display for DocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}",
            self.pos.describe(self.label.as_deref()),
            self.error
        )
    }
}

impl std::error::Error for DocError {}

/// Parses a whole source: every object, or every document that failed.
pub fn parse(src: &[u8]) -> Result<Vec<Doc>, Vec<DocError>> {
    let text = decode_text(src);
    let trimmed = text.trim_start();
    let values = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        json_values(&text)
    } else {
        yaml_values(&text)
    };
    let mut docs = Vec::new();
    let mut errors = Vec::new();
    for (i, (line, value)) in values.into_iter().enumerate() {
        let pos = Position {
            index: i + 1,
            item: None,
            line,
        };
        let value = match value {
            Ok(v) => v,
            Err(e) => {
                errors.push(DocError {
                    pos,
                    label: None,
                    error: ApiError::Decode(e),
                });
                continue;
            }
        };
        let items = match list_items(value) {
            Ok(items) => items,
            Err((label, e)) => {
                errors.push(DocError {
                    pos,
                    label,
                    error: e,
                });
                continue;
            }
        };
        for (item, v) in items {
            let pos = Position { item, ..pos };
            let label = label_of(&v);
            match Object::from_value(v) {
                Ok(object) => docs.push(Doc { pos, object }),
                Err(error) => errors.push(DocError { pos, label, error }),
            }
        }
    }
    if errors.is_empty() {
        Ok(docs)
    } else {
        Err(errors)
    }
}

/// The source as text, honouring a leading byte order mark like Go's
/// `unicode.BOMOverride(unicode.UTF8.NewDecoder())`, which kubectl reads
/// every file and stdin through.
fn decode_text(src: &[u8]) -> Cow<'_, str> {
    fn utf16(body: &[u8], unit: fn([u8; 2]) -> u16) -> Cow<'static, str> {
        let units = body.chunks(2).map(|c| match c {
            [a, b] => unit([*a, *b]),
            // A dangling odd byte is ill-formed.
            _ => 0xD800,
        });
        Cow::Owned(
            char::decode_utf16(units)
                .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
                .collect(),
        )
    }
    match src {
        [0xEF, 0xBB, 0xBF, rest @ ..] => String::from_utf8_lossy(rest),
        [0xFE, 0xFF, rest @ ..] => utf16(rest, u16::from_be_bytes),
        [0xFF, 0xFE, rest @ ..] => utf16(rest, u16::from_le_bytes),
        _ => String::from_utf8_lossy(src),
    }
}

/// One read document: its starting line and its value or a syntax error.
type Read = (usize, Result<Value, String>);

/// A stream of concatenated JSON values; `null`s are skipped.
fn json_values(text: &str) -> Vec<Read> {
    let mut out = Vec::new();
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    // Line counting resumes where the previous value ended.
    let (mut at, mut line) = (0, 1);
    loop {
        let start = at + (text.len() - at - text[at..].trim_start().len());
        line += text[at..start].matches('\n').count();
        at = start;
        match stream.next() {
            None => break,
            Some(Ok(Value::Null)) => {}
            Some(Ok(v)) => out.push((line, Ok(v))),
            Some(Err(e)) => {
                out.push((line, Err(format!("invalid JSON: {e}"))));
                break;
            }
        }
        let end = stream.byte_offset();
        line += text[at..end].matches('\n').count();
        at = end;
    }
    out
}

/// YAML documents, split at `---` lines the way apimachinery's `YAMLReader`
/// does, each parsed on its own so one bad document does not hide the next.
fn yaml_values(text: &str) -> Vec<Read> {
    let mut out = Vec::new();
    // (first line, text) of each document; a bad separator line is an error
    // of the document it starts.
    let mut start_line = 1;
    let mut start = 0;
    let mut sep_error: Option<(usize, String)> = None;
    let mut offset = 0;
    let mut finish = |first: usize, body: &str, sep_error: Option<(usize, String)>| {
        if let Some((line, e)) = sep_error {
            out.push((line, Err(e)));
        } else {
            out.extend(yaml_document(first, body));
        }
    };
    for (n, line) in text.split_inclusive('\n').enumerate() {
        if let Some(rest) = line.strip_prefix("---") {
            let rest = rest.trim();
            finish(start_line, &text[start..offset], sep_error.take());
            if !rest.is_empty() && !rest.starts_with('#') {
                sep_error = Some((
                    n + 1,
                    format!("invalid YAML document separator: {:?}", line.trim_end()),
                ));
            }
            start = offset + line.len();
            start_line = n + 2;
        }
        offset += line.len();
    }
    finish(start_line, &text[start..], sep_error);
    out
}

/// One document between separators: nothing if it is empty, comments or
/// `null`; its value; or the syntax error with its absolute line.
fn yaml_document(first_line: usize, body: &str) -> Option<Read> {
    // The content starts after leading blank and comment lines (if there is
    // content at all: a failing comment-only document starts at its top).
    let lead = body
        .lines()
        .take_while(|l| {
            let t = l.trim();
            t.is_empty() || t.starts_with('#')
        })
        .count();
    let line = if lead < body.lines().count() {
        first_line + lead
    } else {
        first_line
    };
    let mut found = None;
    for d in serde_yaml::Deserializer::from_str(body) {
        match Value::deserialize(d) {
            Ok(Value::Null) => {}
            Ok(v) if found.is_none() => found = Some(v),
            Ok(_) => {
                return Some((
                    line,
                    Err("more than one YAML document between `---` separators \
                         (after a `...` end marker); start each with `---`"
                        .to_string()),
                ))
            }
            Err(e) => return Some((line, Err(yaml_error(&e, first_line)))),
        }
    }
    found.map(|v| (line, Ok(v)))
}

/// serde_yaml's message with its location moved from the document's lines
/// to the source's.
fn yaml_error(e: &serde_yaml::Error, first_line: usize) -> String {
    let msg = e.to_string();
    match e.location() {
        Some(loc) => {
            let cut = [" at line ", " at position "]
                .iter()
                .filter_map(|p| msg.find(p))
                .min()
                .unwrap_or(msg.len());
            format!(
                "invalid YAML at line {} column {}: {}",
                first_line + loc.line() - 1,
                loc.column(),
                &msg[..cut]
            )
        }
        None => format!("invalid YAML: {msg}"),
    }
}

type Items = Vec<(Option<usize>, Value)>;

/// A document's objects: itself, or the items of a `*List` or JSON array.
fn list_items(v: Value) -> Result<Items, (Option<String>, ApiError)> {
    let numbered = |a: Vec<Value>| a.into_iter().enumerate().map(|(i, v)| (Some(i + 1), v));
    match v {
        Value::Array(a) => Ok(numbered(a).collect()),
        Value::Object(mut m)
            if m.get("kind")
                .and_then(|k| k.as_str())
                .is_some_and(|k| k.ends_with("List")) =>
        {
            match m.remove("items") {
                Some(Value::Array(a)) => Ok(numbered(a).collect()),
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(_) => Err((
                    label_of(&Value::Object(m)),
                    ApiError::Invalid {
                        field: "items".into(),
                        msg: "must be a list of objects".into(),
                    },
                )),
            }
        }
        v => Ok(vec![(None, v)]),
    }
}

/// kind and name as far as they can be read, for error messages.
fn label_of(v: &Value) -> Option<String> {
    let kind = v.get("kind").and_then(|k| k.as_str());
    let name = v.pointer("/metadata/name").and_then(|k| k.as_str());
    let ns = v.pointer("/metadata/namespace").and_then(|k| k.as_str());
    match (kind, name) {
        (None, None) => None,
        (k, n) => {
            let n = match ns {
                Some(ns) => format!("{ns}/{}", n.unwrap_or("?")),
                None => n.unwrap_or("?").to_string(),
            };
            Some(format!("{} {n}", k.unwrap_or("?")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(docs: &[Doc]) -> Vec<String> {
        docs.iter().map(|d| d.object.describe()).collect()
    }

    fn errors(src: &str) -> Vec<String> {
        parse(src.as_bytes())
            .unwrap_err()
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    const NS_A: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n";

    #[test]
    fn multi_document_yaml_with_positions() {
        let docs = parse(
            b"# header\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n\n\
              # the service\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\n\
              spec: {ports: [{port: 80}]}\n--- # trailing\n",
        )
        .unwrap();
        assert_eq!(names(&docs), ["Namespace shop", "Service shop/web"]);
        assert_eq!(
            docs[1].pos,
            Position {
                index: 2,
                item: None,
                line: 9
            }
        );
        assert_eq!(
            docs[1].describe(),
            "document 2 (Service shop/web) at line 9"
        );
    }

    #[test]
    fn a_bad_document_does_not_hide_later_ones() {
        // A YAML syntax error in document 2 and an unknown kind in 4: both
        // are named, with absolute lines; 1 and 3 are fine but not returned.
        let src = format!(
            "{NS_A}---\nkind: Namespace\nmetadata: {{name: [unclosed\n---\n{NS_A}---\n\
             apiVersion: v1\nkind: Deployment\nmetadata: {{name: x}}\n"
        );
        let e = errors(&src);
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(
            e[0].starts_with("document 2 at line 5: decoding: invalid YAML at line 7 column 1:"),
            "{}",
            e[0]
        );
        assert!(
            e[1].starts_with("document 4 (Deployment x) at line 12: unknown kind \"Deployment\""),
            "{}",
            e[1]
        );
    }

    #[test]
    fn json_streams_lists_and_arrays() {
        let docs = parse(
            br#"{"kind": "List", "items": [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
                                          {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "b"}}]}
               null
               [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "c"}}]"#,
        )
        .unwrap();
        assert_eq!(names(&docs), ["Namespace a", "Namespace b", "Namespace c"]);
        assert_eq!(docs[1].pos.item, Some(2));
        assert_eq!((docs[2].pos.index, docs[2].pos.line), (2, 4));
        // Truncated JSON: the document is named, nothing is returned.
        let e = errors(
            "{\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"metadata\": {\"name\": \"a\"}}\n\n\
             {\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"metadata\": {\"na",
        );
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with("document 2 at line 3: decoding: invalid JSON: EOF"),
            "{}",
            e[0]
        );
    }

    #[test]
    fn empty_sources_hold_no_objects() {
        for src in [
            "",
            "\n\n",
            "# only a comment\n",
            "---",
            "---\n---\n# c\n---\n",
            "null\n",
            "\u{feff}",
        ] {
            assert!(parse(src.as_bytes()).unwrap().is_empty(), "{src:?}");
        }
        let list = parse(b"apiVersion: v1\nkind: List\nitems: []\n").unwrap();
        assert!(list.is_empty());
    }

    #[test]
    fn byte_order_marks_like_kubectl() {
        let mut utf8 = vec![0xEF, 0xBB, 0xBF];
        utf8.extend_from_slice(NS_A.as_bytes());
        assert_eq!(names(&parse(&utf8).unwrap()), ["Namespace a"]);
        let json = "\u{feff}{\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"metadata\": {\"name\": \"j\"}}";
        assert_eq!(names(&parse(json.as_bytes()).unwrap()), ["Namespace j"]);
        let mut le = vec![0xFF, 0xFE];
        le.extend(NS_A.encode_utf16().flat_map(|u| u.to_le_bytes()));
        assert_eq!(names(&parse(&le).unwrap()), ["Namespace a"]);
        let mut be = vec![0xFE, 0xFF];
        be.extend(NS_A.encode_utf16().flat_map(|u| u.to_be_bytes()));
        assert_eq!(names(&parse(&be).unwrap()), ["Namespace a"]);
    }

    #[test]
    fn separators_follow_kubectl() {
        // Only a comment may follow `---`; the document it starts is named.
        let e = errors(&format!("{NS_A}--- {{kind: Namespace}}\n{NS_A}"));
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with("document 2 at line 4: decoding: invalid YAML document separator"),
            "{}",
            e[0]
        );
        // CRLF line ends and `...` end markers.
        let crlf = NS_A.replace('\n', "\r\n");
        let docs = parse(format!("{crlf}---\r\n{crlf}...\r\n").as_bytes()).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].pos.line, 5);
        // A second document after `...` needs its own `---`, as in kubectl.
        let e = errors(&format!("{NS_A}...\n{NS_A}"));
        assert!(e[0].starts_with("document 1 at line 1: "), "{}", e[0]);
    }

    #[test]
    fn invalid_bytes_are_replaced_like_go() {
        let src = b"apiVersion: v1\nkind: Namespace\nmetadata: {name: a, annotations: {x: \"caf\xe9\"}}\n";
        let docs = parse(src).unwrap();
        assert_eq!(
            docs[0].object.meta().annotations.as_ref().unwrap()["x"],
            "caf\u{fffd}"
        );
    }

    #[test]
    fn bad_lists_are_named() {
        let e = errors("apiVersion: v1\nkind: List\nitems: 5\n");
        assert_eq!(
            e,
            ["document 1 (List ?) at line 1: items: must be a list of objects"]
        );
        let e = errors(
            "apiVersion: v1\nkind: List\nitems:\n- {kind: Namespace, apiVersion: v1, metadata: {name: a}}\n- {kind: Pod2}\n",
        );
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with("document 1 item 2 (Pod2 ?) at line 1: unknown kind"),
            "{}",
            e[0]
        );
    }
}
