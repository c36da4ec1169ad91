//! The runtime's error type. Every variant says what was being done and to what, so a message
//! read in a pod's status or the agent's log is enough to act on. `Display` shows one level;
//! where there is a cause it is `source()`: render errors for people with
//! [`ferrolet_fsutil::chain`], which prints each cause once.

use std::path::Path;

pub(crate) use ferrolet_fsutil::Context;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file, JSON or system-call operation failed: `Display` says what was being done, the
    /// cause is `source()` (print both with [`ferrolet_fsutil::chain`]).
    #[error(transparent)]
    Fs(#[from] ferrolet_fsutil::Error),
    #[error("blob {blob}{origin}: content hashes to {actual}")]
    DigestMismatch {
        blob: String,
        origin: String,
        actual: String,
    },
    #[error("layer {layer}: entry {path:?} {reason}")]
    LayerEntry {
        layer: String,
        path: String,
        reason: String,
    },
    #[error("invalid image{origin}: {reason}")]
    InvalidImage { origin: String, reason: String },
    #[error("image {0:?} not found")]
    ImageNotFound(String),
    #[error("invalid image reference {reference:?}: {reason}")]
    InvalidReference { reference: String, reason: String },
    #[error("image {image} is in use by container(s) {containers}")]
    ImageInUse { image: String, containers: String },
    #[error("container {0} not found")]
    ContainerNotFound(String),
    #[error("container {id}: {reason}")]
    Container { id: String, reason: String },
    #[error("invalid container config: {field}: {reason}")]
    InvalidConfig { field: String, reason: String },
    #[error("zygote: {0}")]
    Zygote(String),
    #[error("cgroup {path}: {reason}")]
    Cgroup { path: String, reason: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn invalid_config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidConfig {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub fn container(id: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Container {
            id: id.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn invalid_image(origin: &str, reason: impl Into<String>) -> Self {
        Error::InvalidImage {
            origin: if origin.is_empty() {
                String::new()
            } else {
                format!(" {origin}")
            },
            reason: reason.into(),
        }
    }

    /// True when the error is "the file or process is not there" rather than a real failure.
    pub fn is_not_found(&self) -> bool {
        match self {
            Error::Fs(e) => e.is_not_found(),
            Error::ContainerNotFound(_) | Error::ImageNotFound(_) => true,
            _ => false,
        }
    }
}

/// `path.display()` for messages, shortened to a closure-friendly helper.
pub(crate) fn p(path: &Path) -> String {
    path.display().to_string()
}
