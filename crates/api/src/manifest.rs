//! Reading kubectl-style manifests: multi-document YAML or JSON (a single
//! object, or a `List` with `items`). Each document is decoded on its own so
//! one bad document is reported with its position and does not hide others.

use serde::Deserialize;
use serde_json::Value;

use crate::object::Object;
use crate::ApiError;

/// One document's outcome: where it came from and what it decoded to.
#[derive(Debug)]
pub struct Doc {
    /// 1-based document index in its source.
    pub index: usize,
    pub result: Result<Object, ApiError>,
    /// kind/namespace/name as far as they could be read, for error messages.
    pub label: String,
}

fn label_of(v: &Value) -> String {
    let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or("?");
    let name = v
        .pointer("/metadata/name")
        .and_then(|k| k.as_str())
        .unwrap_or("?");
    match v.pointer("/metadata/namespace").and_then(|k| k.as_str()) {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// Parses a whole manifest text.
pub fn parse(text: &str) -> Vec<Doc> {
    let mut values: Vec<Result<Value, ApiError>> = Vec::new();
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        // JSON: one value, or several concatenated.
        let stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
        for v in stream {
            let bad = v.is_err();
            values.push(v.map_err(|e| ApiError::Decode(format!("invalid JSON: {e}"))));
            if bad {
                break;
            }
        }
    } else {
        for d in serde_yaml::Deserializer::from_str(text) {
            match Value::deserialize(d) {
                Ok(Value::Null) => {}
                Ok(v) => values.push(Ok(v)),
                Err(e) => {
                    // After a syntax error the YAML stream cannot resync.
                    values.push(Err(ApiError::Decode(format!("invalid YAML: {e}"))));
                    break;
                }
            }
        }
    }
    let mut out = Vec::new();
    let mut index = 0;
    for v in values {
        let items = match v {
            Ok(Value::Array(a)) => a.into_iter().map(Ok).collect(),
            Ok(v)
                if v.get("kind")
                    .and_then(|k| k.as_str())
                    .map(|k| k.ends_with("List"))
                    .unwrap_or(false) =>
            {
                v.get("items")
                    .and_then(|i| i.as_array())
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(Ok)
                    .collect()
            }
            other => vec![other],
        };
        for item in items {
            index += 1;
            match item {
                Ok(v) => {
                    let label = label_of(&v);
                    out.push(Doc {
                        index,
                        result: Object::from_value(v),
                        label,
                    });
                }
                Err(e) => out.push(Doc {
                    index,
                    result: Err(e),
                    label: "?".into(),
                }),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_document_yaml_with_a_bad_one() {
        let docs = parse(
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n\
             apiVersion: v1\nkind: Deployment\nmetadata: {name: x}\n---\n\
             apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {ports: [{port: 80}]}\n",
        );
        assert_eq!(docs.len(), 3);
        assert!(docs[0].result.is_ok());
        assert!(docs[1].result.is_err());
        assert_eq!(docs[1].index, 2);
        assert_eq!(docs[2].label, "Service shop/web");
    }

    #[test]
    fn json_and_lists() {
        let docs = parse(
            r#"{"kind": "List", "items": [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
                                                      {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "b"}}]}"#,
        );
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].result.as_ref().unwrap().name(), "b");
        let docs = parse("key: [unclosed");
        assert!(docs[0]
            .result
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("invalid YAML"));
    }
}
