//! The lab's one error type, and the two shorthands every module makes one
//! with. A module of its own, like [`crate::process`], so the modules that
//! build the lab depend on it and not on `lib.rs`.

use podnet_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("{0}")]
    Msg(String),
    #[error("kernel: {0}")]
    Kernel(#[from] podnet_kernel::KernelError),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("CNI: {0}")]
    Cni(#[from] podnet_cni::CniError),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error(transparent)]
    Kube(#[from] crate::kube::KubeError),
}

pub(crate) fn msg(s: impl Into<String>) -> LabError {
    LabError::Msg(s.into())
}

pub(crate) fn io(what: impl Into<String>, e: std::io::Error) -> LabError {
    LabError::Io(what.into(), e)
}
