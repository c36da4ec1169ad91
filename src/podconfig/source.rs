//! What a pod source sends (kubelet's SET semantics): a full snapshot of its pods and the
//! errors it met; and how a source turns a manifest's text into pods.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tracing::warn;

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

/// A source's way out: sends a snapshot only when its pods (by UID, and what a pod update
/// is made of: spec, labels, annotations) or its errors changed since the last one sent, and
/// logs each error once, when it appears or changes. (A static pod with a UID of its own whose
/// labels change is an update, which the downward API shows.)
type Sent = (Vec<Arc<Pod>>, BTreeMap<String, String>);

pub struct SnapshotSender {
    tx: mpsc::UnboundedSender<Snapshot>,
    /// The pods and errors last sent.
    last: Option<Sent>,
}

impl SnapshotSender {
    pub fn new(tx: mpsc::UnboundedSender<Snapshot>) -> SnapshotSender {
        SnapshotSender { tx, last: None }
    }

    /// Send `snap` unless it says what the last one said. False once nobody listens.
    pub fn send(&mut self, snap: Snapshot) -> bool {
        let same = self.last.as_ref().is_some_and(|(pods, errors)| {
            *errors == snap.errors
                && pods.len() == snap.pods.len()
                && pods
                    .iter()
                    .zip(&snap.pods)
                    .all(|(a, b)| crate::pod::uid(a) == crate::pod::uid(b) && !super::differ_semantically(a, b))
        });
        if same {
            return true;
        }
        for (loc, e) in &snap.errors {
            if self.last.as_ref().is_none_or(|l| l.1.get(loc) != Some(e)) {
                warn!(source = snap.source, manifest = %loc, "could not process manifest: {e}");
            }
        }
        self.last = Some((snap.pods.clone(), snap.errors.clone()));
        self.tx.send(snap).is_ok()
    }
}
