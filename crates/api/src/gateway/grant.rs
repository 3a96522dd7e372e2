//! ReferenceGrant: a namespace's consent to be referenced from another
//! (a route's backend in another namespace, a listener's certificate).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ReferenceGrant {
    #[serde(rename = "apiVersion", default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ReferenceGrantSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ReferenceGrantSpec {
    #[serde(default)]
    pub from: Vec<ReferenceGrantFrom>,
    #[serde(default)]
    pub to: Vec<ReferenceGrantTo>,
}

/// Who may refer: a kind in a namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ReferenceGrantFrom {
    #[serde(default)]
    pub group: String,
    pub kind: String,
    pub namespace: String,
}

/// What may be referred to in the grant's namespace: a kind, or one
/// object of it by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ReferenceGrantTo {
    #[serde(default)]
    pub group: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ReferenceGrant {
    /// Whether this grant (in the target's namespace) lets a `from_kind`
    /// of `from_group` in `from_ns` refer to the `to_kind` named `to_name`.
    pub fn allows(
        &self,
        (from_group, from_kind, from_ns): (&str, &str, &str),
        (to_group, to_kind, to_name): (&str, &str, &str),
    ) -> bool {
        let from = self
            .spec
            .from
            .iter()
            .any(|f| f.group == from_group && f.kind == from_kind && f.namespace == from_ns);
        let to = self.spec.to.iter().any(|t| {
            t.group == to_group
                && t.kind == to_kind
                && t.name.as_deref().is_none_or(|n| n == to_name)
        });
        from && to
    }
}
