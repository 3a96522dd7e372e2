//! The Gateway API's standard-channel kinds (`gateway.networking.k8s.io`,
//! v1.6): [`GatewayClass`], [`Gateway`], [`HTTPRoute`] and
//! [`ReferenceGrant`], with the field names the CRDs use, so manifests
//! written for any implementation apply unchanged.
//!
//! Only what podnet reads or writes is modelled (as `k8s-openapi` drops
//! fields it does not know); validation lives in [`validate`]. The route
//! semantics (matching, precedence, filters) are `podnet_gateway`'s.
//!
//! Layout: [`listener`] holds GatewayClass and Gateway, [`route`]
//! HTTPRoute, [`grant`] ReferenceGrant; this file the shared references
//! and the Kubernetes resource glue.

pub mod grant;
pub mod listener;
pub mod route;
pub mod validate;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

pub use grant::ReferenceGrant;
pub use listener::{Gateway, GatewayClass};
pub use route::HTTPRoute;

/// The API group of every kind here.
pub const GROUP: &str = "gateway.networking.k8s.io";
/// The version podnet serves and writes.
pub const API_VERSION: &str = "gateway.networking.k8s.io/v1";
/// The controller name a GatewayClass names to be podnet's.
pub const CONTROLLER_NAME: &str = "podnet.io/gateway";

/// A reference to a parent (a Gateway, or a listener of one by
/// `sectionName`/`port`) from a route.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ParentReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

impl ParentReference {
    /// Whether it names a Gateway (the default group and kind).
    pub fn is_gateway(&self) -> bool {
        self.group.as_deref().unwrap_or(GROUP) == GROUP
            && self.kind.as_deref().unwrap_or("Gateway") == "Gateway"
    }
}

/// A reference to a Secret (a listener's certificate), possibly in
/// another namespace (which a ReferenceGrant must allow).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct SecretObjectReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

impl SecretObjectReference {
    /// Whether it names a core Secret (the default).
    pub fn is_secret(&self) -> bool {
        self.group.as_deref().unwrap_or("").is_empty()
            && self.kind.as_deref().unwrap_or("Secret") == "Secret"
    }
}

/// A route's parent status entry: one per parent podnet handles.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    pub parent_ref: ParentReference,
    pub controller_name: String,
    #[serde(default)]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}

/// A route's status: one entry per parent, each written by the
/// controller that handles that parent (others' entries are kept).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    #[serde(default)]
    pub parents: Vec<RouteParentStatus>,
}

/// Makes a Gateway API kind a Kubernetes resource, so the API client and
/// watcher read it as a typed object.
macro_rules! gateway_resource {
    ($t:ty, $kind:literal, $plural:literal, $scope:ty) => {
        impl k8s_openapi::Resource for $t {
            const API_VERSION: &'static str = API_VERSION;
            const GROUP: &'static str = GROUP;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = "v1";
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $scope;
        }
        impl k8s_openapi::ListableResource for $t {
            const LIST_KIND: &'static str = concat!($kind, "List");
        }
        impl k8s_openapi::Metadata for $t {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

gateway_resource!(
    GatewayClass,
    "GatewayClass",
    "gatewayclasses",
    k8s_openapi::ClusterResourceScope
);
gateway_resource!(
    Gateway,
    "Gateway",
    "gateways",
    k8s_openapi::NamespaceResourceScope
);
gateway_resource!(
    HTTPRoute,
    "HTTPRoute",
    "httproutes",
    k8s_openapi::NamespaceResourceScope
);
gateway_resource!(
    ReferenceGrant,
    "ReferenceGrant",
    "referencegrants",
    k8s_openapi::NamespaceResourceScope
);
