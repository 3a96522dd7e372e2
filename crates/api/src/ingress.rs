//! `networking.k8s.io/v1` Ingress: what the API server refuses at
//! admission (for the standalone mode), and which Ingresses are podnet's.

use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};

use crate::FieldError;

/// The IngressClass name (and controller) podnet serves.
pub const CLASS: &str = "podnet";
/// `spec.controller` of podnet's IngressClass.
pub const CONTROLLER: &str = "podnet.io/ingress";

fn err(field: String, msg: impl Into<String>) -> FieldError {
    FieldError {
        field,
        msg: msg.into(),
    }
}

fn backend(at: &str, b: &IngressBackend, out: &mut Vec<FieldError>) {
    match (&b.service, &b.resource) {
        (Some(s), None) => {
            let p = s.port.as_ref();
            let has_port = p.is_some_and(|p| p.number.is_some() != p.name.is_some());
            if !has_port {
                out.push(err(
                    format!("{at}.service.port"),
                    "exactly one of name or number",
                ));
            }
        }
        (None, Some(_)) => {}
        _ => out.push(err(at.to_string(), "exactly one of service or resource")),
    }
}

pub fn validate(i: &Ingress) -> Vec<FieldError> {
    let mut out = Vec::new();
    let Some(spec) = &i.spec else {
        return out;
    };
    if let Some(b) = &spec.default_backend {
        backend("spec.defaultBackend", b, &mut out);
    }
    for (r, rule) in spec.rules.iter().flatten().enumerate() {
        if let Some(h) = &rule.host {
            crate::gateway::validate::hostname(&format!("spec.rules[{r}].host"), h, &mut out);
        }
        let paths = rule.http.iter().flat_map(|h| h.paths.iter()).enumerate();
        for (p, path) in paths {
            let at = format!("spec.rules[{r}].http.paths[{p}]");
            let v = path.path.as_deref().unwrap_or("");
            match path.path_type.as_str() {
                "Exact" | "Prefix" if !v.starts_with('/') => {
                    out.push(err(format!("{at}.path"), "must be an absolute path"))
                }
                "Exact" | "Prefix" | "ImplementationSpecific" => {}
                t => out.push(err(
                    format!("{at}.pathType"),
                    format!("{t:?} is not Exact, Prefix or ImplementationSpecific"),
                )),
            }
            backend(&format!("{at}.backend"), &path.backend, &mut out);
        }
    }
    if spec.rules.as_ref().is_none_or(|r| r.is_empty()) && spec.default_backend.is_none() {
        out.push(err("spec".into(), "either defaultBackend or rules"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ingress_is_checked_as_the_api_server_does() {
        let i: Ingress = serde_json::from_value(json!({"metadata": {"name": "i"}, "spec": {"rules": [
            {"host": "Foo.example", "http": {"paths": [
                {"path": "x", "pathType": "Prefix", "backend": {"service": {"name": "a", "port": {"number": 80}}}},
                {"path": "/y", "pathType": "Regex", "backend": {"service": {"name": "a", "port": {}}}}]}}]}}))
        .unwrap();
        let got: Vec<String> = validate(&i).into_iter().map(|e| e.field).collect();
        assert_eq!(
            got,
            [
                "spec.rules[0].host",
                "spec.rules[0].http.paths[0].path",
                "spec.rules[0].http.paths[1].pathType",
                "spec.rules[0].http.paths[1].backend.service.port",
            ]
        );
    }
}
