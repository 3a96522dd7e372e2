//! Label selectors: matching (pure, used by the controller and policy) and
//! parsing kubectl's `-l` syntax (`a=b,c!=d,e,!f,g in (x,y),h notin (z)`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use crate::ApiError;

/// Whether `labels` satisfy `sel`. An empty selector matches everything.
pub fn matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let ml = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    ml && sel.match_expressions.iter().flatten().all(|r| {
        let have = labels.get(&r.key);
        let vals = r.values.as_deref().unwrap_or_default();
        match r.operator.as_str() {
            "In" => have.map(|h| vals.contains(h)).unwrap_or(false),
            "NotIn" => have.map(|h| !vals.contains(h)).unwrap_or(true),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => false,
        }
    })
}

/// A Service-style selector (a plain map); `None` or empty selects nothing.
pub fn matches_map(
    sel: &Option<BTreeMap<String, String>>,
    labels: &BTreeMap<String, String>,
) -> bool {
    match sel {
        Some(s) if !s.is_empty() => s.iter().all(|(k, v)| labels.get(k) == Some(v)),
        _ => false,
    }
}

fn req(key: &str, op: &str, values: Vec<String>) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.trim().to_string(),
        operator: op.to_string(),
        values: if values.is_empty() {
            None
        } else {
            Some(values)
        },
    }
}

/// Parses kubectl's selector syntax.
pub fn parse(s: &str) -> Result<LabelSelector, ApiError> {
    let mut exprs = Vec::new();
    // Split on commas that are not inside parentheses.
    let mut parts = Vec::new();
    let (mut depth, mut cur) = (0, String::new());
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    parts.push(cur);
    let bad = || ApiError::Invalid {
        field: "selector".into(),
        msg: format!("cannot parse {s:?}"),
    };
    for p in parts.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
        let list = |rest: &str| -> Result<Vec<String>, ApiError> {
            let r = rest.trim();
            let inner = r
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(bad)?;
            Ok(inner
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect())
        };
        if let Some((k, v)) = p.split_once("!=") {
            exprs.push(req(k, "NotIn", vec![v.trim().to_string()]));
        } else if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
            exprs.push(req(k, "In", vec![v.trim().to_string()]));
        } else if let Some((k, rest)) = p.split_once(" notin ") {
            exprs.push(req(k, "NotIn", list(rest)?));
        } else if let Some((k, rest)) = p.split_once(" in ") {
            exprs.push(req(k, "In", list(rest)?));
        } else if let Some(k) = p.strip_prefix('!') {
            exprs.push(req(k, "DoesNotExist", vec![]));
        } else if p
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        {
            exprs.push(req(p, "Exists", vec![]));
        } else {
            return Err(bad());
        }
    }
    Ok(LabelSelector {
        match_expressions: Some(exprs),
        match_labels: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn kubectl_syntax() {
        let s = parse("app=web,tier!=db,env in (prod, staging),!legacy,team").unwrap();
        assert!(matches(
            &s,
            &l(&[("app", "web"), ("env", "prod"), ("team", "x")])
        ));
        assert!(!matches(
            &s,
            &l(&[("app", "web"), ("env", "dev"), ("team", "x")])
        ));
        assert!(!matches(
            &s,
            &l(&[
                ("app", "web"),
                ("env", "prod"),
                ("team", "x"),
                ("legacy", "1")
            ])
        ));
        assert!(!matches(&s, &l(&[("app", "web"), ("env", "prod")])));
        assert!(parse("a in b").is_err());
    }

    #[test]
    fn empty_selectors() {
        assert!(matches(&LabelSelector::default(), &l(&[])));
        assert!(!matches_map(&None, &l(&[("a", "b")])));
        assert!(!matches_map(&Some(BTreeMap::new()), &l(&[("a", "b")])));
        assert!(matches_map(
            &Some(l(&[("a", "b")])),
            &l(&[("a", "b"), ("c", "d")])
        ));
    }
}
