//! Events (client-go's record.EventRecorder as kubelet uses it): what happened to a pod or to the
//! node, with kubelet's reasons. Standalone, an event is a log line; in a cluster it is also
//! posted to the API server.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use crate::pod;

/// An event's type, as the API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Normal,
    Warning,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Normal => "Normal",
            Kind::Warning => "Warning",
        }
    }
}

/// Where events go; cheap to clone, never blocks the caller.
#[derive(Clone)]
pub struct Recorder {
    node: Arc<str>,
}

impl Recorder {
    /// A recorder that only logs (no API server).
    pub fn standalone(node: &str) -> Recorder {
        Recorder { node: node.into() }
    }

    /// An event about a pod (`container`: the container it concerns, if any).
    pub fn pod(&self, p: &Pod, container: Option<&str>, kind: Kind, reason: &str, message: &str) {
        let full = pod::full_name(p);
        match kind {
            Kind::Normal => info!(pod = %full, container, reason, "{message}"),
            Kind::Warning => warn!(pod = %full, container, reason, "{message}"),
        }
    }

    /// An event about the node.
    pub fn node(&self, kind: Kind, reason: &str, message: &str) {
        match kind {
            Kind::Normal => info!(node = %self.node, reason, "{message}"),
            Kind::Warning => warn!(node = %self.node, reason, "{message}"),
        }
    }
}
