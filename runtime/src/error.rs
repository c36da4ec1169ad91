//! The runtime's error type. Every variant says what was being done and to what, so a message
//! read in a pod's status or the agent's log is enough to act on.

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{context}: {source}")]
    Json {
        context: String,
        #[source]
        source: serde_json::Error,
    },
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
    #[error("{context}: {source}")]
    Sys {
        context: String,
        #[source]
        source: nix::Error,
    },
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

    pub fn invalid_image(origin: &str, reason: impl Into<String>) -> Self {
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
            Error::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            Error::ContainerNotFound(_) | Error::ImageNotFound(_) => true,
            _ => false,
        }
    }
}

/// Attach "what were we doing" to io, json and nix errors.
pub trait Context<T> {
    fn context<C: Into<String>>(self, context: C) -> Result<T>;
    fn with_context<C: Into<String>, F: FnOnce() -> C>(self, f: F) -> Result<T>;
}

impl<T> Context<T> for std::result::Result<T, std::io::Error> {
    fn context<C: Into<String>>(self, context: C) -> Result<T> {
        self.map_err(|source| Error::Io {
            context: context.into(),
            source,
        })
    }
    fn with_context<C: Into<String>, F: FnOnce() -> C>(self, f: F) -> Result<T> {
        self.map_err(|source| Error::Io {
            context: f().into(),
            source,
        })
    }
}

impl<T> Context<T> for std::result::Result<T, serde_json::Error> {
    fn context<C: Into<String>>(self, context: C) -> Result<T> {
        self.map_err(|source| Error::Json {
            context: context.into(),
            source,
        })
    }
    fn with_context<C: Into<String>, F: FnOnce() -> C>(self, f: F) -> Result<T> {
        self.map_err(|source| Error::Json {
            context: f().into(),
            source,
        })
    }
}

impl<T> Context<T> for std::result::Result<T, nix::Error> {
    fn context<C: Into<String>>(self, context: C) -> Result<T> {
        self.map_err(|source| Error::Sys {
            context: context.into(),
            source,
        })
    }
    fn with_context<C: Into<String>, F: FnOnce() -> C>(self, f: F) -> Result<T> {
        self.map_err(|source| Error::Sys {
            context: f().into(),
            source,
        })
    }
}

/// `path.display()` for messages, shortened to a closure-friendly helper.
pub(crate) fn p(path: &Path) -> String {
    path.display().to_string()
}
