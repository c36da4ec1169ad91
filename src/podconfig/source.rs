//! What a pod source sends (kubelet's SET semantics): a full snapshot of its pods and the
//! errors it met; and how a source turns a manifest's text into pods.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::pod::{defaults, manifest, validation};

/// One source's complete view.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// "file" or "http".
    pub source: &'static str,
    pub pods: Vec<Arc<Pod>>,
    /// Manifest location -> why it (or part of it) is not running.
    pub errors: BTreeMap<String, String>,
}

/// Decode, default, identify and validate the pods of one manifest. Returns the valid pods and
/// one error message for the invalid ones (if any).
pub fn pods_from_manifest(data: &str, source: &manifest::Source, node: &str) -> (Vec<Arc<Pod>>, Option<String>) {
    let decoded = match manifest::decode(data) {
        Ok(p) => p,
        Err(e) => return (Vec::new(), Some(e)),
    };
    let mut pods = Vec::new();
    let mut errors = Vec::new();
    for mut p in decoded {
        let base_name = p.metadata.name.clone().unwrap_or_default();
        manifest::apply_static_identity(&mut p, source, node);
        defaults::apply(&mut p);
        let errs = validation::validate(&p);
        if errs.is_empty() {
            pods.push(Arc::new(p));
        } else {
            errors.push(format!("pod {base_name:?} is invalid: {}", errs.join("; ")));
        }
    }
    (pods, (!errors.is_empty()).then(|| errors.join("\n")))
}
