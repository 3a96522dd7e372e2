//! CNI errors: the spec's well-known codes and the JSON shape a runtime reads
//! from stdout when a plugin fails.

use serde::{Deserialize, Serialize};

/// Error codes from the CNI spec (1-99 are reserved by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    IncompatibleVersion = 1,
    UnsupportedField = 2,
    UnknownContainer = 3,
    InvalidEnv = 4,
    Io = 5,
    Decode = 6,
    InvalidConfig = 7,
    TryAgain = 11,
    /// STATUS: the plugin is not available (e.g. address pool exhausted).
    NotAvailable = 50,
    /// A plugin-specific failure (codes 100+ are the plugin's own).
    Internal = 999,
}

/// A failure that a plugin reports to its runtime.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}{}", if details.is_empty() { String::new() } else { format!(": {details}") })]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: Code, msg: impl Into<String>) -> Self {
        CniError {
            code: code as u32,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, d: impl Into<String>) -> Self {
        self.details = d.into();
        self
    }

    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(Code::Internal, msg)
    }

    pub fn config(msg: impl Into<String>) -> Self {
        Self::new(Code::InvalidConfig, msg)
    }

    pub fn env(msg: impl Into<String>) -> Self {
        Self::new(Code::InvalidEnv, msg)
    }

    /// The JSON object written to stdout, in the version the caller asked for.
    pub fn to_json(&self, cni_version: &str) -> String {
        let w = Wire {
            cni_version: cni_version.to_string(),
            code: self.code,
            msg: self.msg.clone(),
            details: if self.details.is_empty() {
                None
            } else {
                Some(self.details.clone())
            },
        };
        serde_json::to_string(&w).expect("error serializes")
    }

    /// Parses an error a delegated plugin printed.
    pub fn from_json(b: &[u8]) -> Option<Self> {
        let w: Wire = serde_json::from_slice(b).ok()?;
        Some(CniError {
            code: w.code,
            msg: w.msg,
            details: w.details.unwrap_or_default(),
        })
    }
}

#[derive(Serialize, Deserialize)]
struct Wire {
    #[serde(rename = "cniVersion", default)]
    cni_version: String,
    code: u32,
    msg: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    details: Option<String>,
}

impl From<podnet_kernel::KernelError> for CniError {
    fn from(e: podnet_kernel::KernelError) -> Self {
        CniError::internal(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_json_has_spec_fields() {
        let e = CniError::new(
            Code::InvalidEnv,
            "required env variables [CNI_NETNS] missing",
        );
        let v: serde_json::Value = serde_json::from_str(&e.to_json("1.1.0")).unwrap();
        assert_eq!(v["cniVersion"], "1.1.0");
        assert_eq!(v["code"], 4);
        assert_eq!(v["msg"], "required env variables [CNI_NETNS] missing");
        assert!(v.get("details").is_none());
        let back = CniError::from_json(e.to_json("1.0.0").as_bytes()).unwrap();
        assert_eq!(back, e);
    }
}
