//! Pod config (kubelet's pkg/kubelet/config): the sources that say which pods this node should
//! run (a manifest directory, [`file`]; a manifest URL, [`http`]; the API server comes next),
//! merged into one desired set and handed on as operations (ADD / UPDATE / REMOVE /
//! RECONCILE), plus the node's admission rules for new pods ([`admission`]).
//!
//! Each source sends complete snapshots; [`PodConfig`] keeps the latest of each, merges them
//! (the first source to name a pod wins the name) and diffs the merged set against the previous
//! one. Like kubelet, it compares pods semantically: the annotations kubelet sets itself
//! (`config.seen`, `config.source`) never make a pod "changed".

pub mod admission;
pub mod apiserver;
pub mod file;
pub mod http;
pub mod lsm;
pub mod predicates;
pub mod source;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::pod;
pub use source::Snapshot;

/// One change of the desired pods (kubelet's PodUpdate operations).
#[derive(Debug, Clone, PartialEq)]
pub enum PodOp {
    /// A pod no source named before.
    Add(Arc<Pod>),
    /// A known pod (same UID) whose spec, labels or annotations changed.
    Update(Arc<Pod>),
    /// A pod no source names any more.
    Remove(Arc<Pod>),
    /// A known pod whose object changed in nothing that affects how it runs (its status as the
    /// source sees it, metadata kubelet does not act on): the stored object is refreshed.
    Reconcile(Arc<Pod>),
}

/// Annotations kubelet writes itself, ignored when comparing pods (kubelet's local annotations).
const LOCAL_ANNOTATIONS: [&str; 3] = [pod::CONFIG_SOURCE, pod::CONFIG_SEEN, pod::CONFIG_MIRROR];

/// kubelet's podsDifferSemantically: spec, labels, deletion and annotations (but its own).
pub fn differ_semantically(a: &Pod, b: &Pod) -> bool {
    // A source hands on the very object it parsed while its manifest is unchanged.
    if std::ptr::eq(a, b) {
        return false;
    }
    a.spec != b.spec
        || a.metadata.labels.as_ref().filter(|l| !l.is_empty()) != b.metadata.labels.as_ref().filter(|l| !l.is_empty())
        || a.metadata.deletion_timestamp != b.metadata.deletion_timestamp
        || a.metadata.deletion_grace_period_seconds != b.metadata.deletion_grace_period_seconds
        || !own_annotations(a).eq(own_annotations(b))
}

/// A pod's annotations but kubelet's local ones, in key order.
fn own_annotations(p: &Pod) -> impl Iterator<Item = (&String, &String)> {
    p.metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| !LOCAL_ANNOTATIONS.contains(&k.as_str()))
}

/// The merged desired pods of every source.
pub struct PodConfig {
    /// The latest snapshot of each source that has reported.
    snapshots: BTreeMap<&'static str, Snapshot>,
    /// The sources configured; orphans are cleaned up only once all have reported.
    expected: BTreeSet<&'static str>,
    /// Desired pods by UID, as last handed on.
    desired: BTreeMap<String, Arc<Pod>>,
}

impl PodConfig {
    pub fn new(expected: impl IntoIterator<Item = &'static str>) -> PodConfig {
        PodConfig {
            snapshots: BTreeMap::new(),
            expected: expected.into_iter().collect(),
            desired: BTreeMap::new(),
        }
    }

    /// Take a source's new snapshot; returns the operations that turn the previous desired set
    /// into the new one: removals first, then additions and updates, each in UID order.
    pub fn apply(&mut self, snap: Snapshot) -> Vec<PodOp> {
        self.snapshots.insert(snap.source, snap);
        let merged = self.merge();
        let mut ops = Vec::new();
        for (uid, old) in &self.desired {
            if !merged.contains_key(uid) {
                ops.push(PodOp::Remove(old.clone()));
            }
        }
        let mut next = BTreeMap::new();
        for (uid, new) in merged {
            let kept = match self.desired.get(&uid) {
                // The same object as last time: nothing to compare.
                Some(old) if Arc::ptr_eq(old, &new) => new,
                None => {
                    ops.push(PodOp::Add(new.clone()));
                    new
                }
                Some(old) if differ_semantically(old, &new) => {
                    ops.push(PodOp::Update(new.clone()));
                    new
                }
                Some(old)
                    if old.status != new.status || old.metadata.owner_references != new.metadata.owner_references =>
                {
                    ops.push(PodOp::Reconcile(new.clone()));
                    new
                }
                // Unchanged: keep the object first seen (its config.seen stays).
                Some(old) => old.clone(),
            };
            next.insert(uid, kept);
        }
        self.desired = next;
        ops
    }

    /// Every configured source has reported at least once (kubelet's SeenAllSources).
    pub fn all_sources_seen(&self) -> bool {
        self.expected.iter().all(|s| self.snapshots.contains_key(s))
    }

    #[cfg(test)]
    fn desired(&self) -> &BTreeMap<String, Arc<Pod>> {
        &self.desired
    }

    /// All sources' pods by UID; of two pods with one namespace/name, the first source's wins.
    fn merge(&self) -> BTreeMap<String, Arc<Pod>> {
        let mut out = BTreeMap::new();
        let mut names = HashSet::new();
        for s in self.snapshots.values() {
            for p in &s.pods {
                if names.insert((pod::namespace(p), pod::name(p))) {
                    out.insert(pod::uid(p).to_string(), p.clone());
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: &str, image: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default", "uid": uid,
                    "annotations": {(pod::CONFIG_SEEN): chrono::Utc::now().to_rfc3339()}},
                "spec": {"containers": [{"name": "c", "image": image}]}
            }))
            .unwrap(),
        )
    }

    fn snap(source: &'static str, pods: Vec<Arc<Pod>>) -> Snapshot {
        Snapshot {
            source,
            pods,
            errors: Default::default(),
        }
    }

    fn kinds(ops: &[PodOp]) -> Vec<String> {
        ops.iter()
            .map(|o| match o {
                PodOp::Add(p) => format!("add {}", pod::uid(p)),
                PodOp::Update(p) => format!("update {}", pod::uid(p)),
                PodOp::Remove(p) => format!("remove {}", pod::uid(p)),
                PodOp::Reconcile(p) => format!("reconcile {}", pod::uid(p)),
            })
            .collect()
    }

    #[test]
    fn snapshots_become_add_update_remove() {
        let mut c = PodConfig::new(["file"]);
        assert!(!c.all_sources_seen());
        let ops = c.apply(snap("file", vec![pod("a", "1", "x"), pod("b", "2", "x")]));
        assert_eq!(kinds(&ops), ["add 1", "add 2"]);
        assert!(c.all_sources_seen());
        // The same pods parsed again (a new config.seen) are no change.
        assert!(c
            .apply(snap("file", vec![pod("a", "1", "x"), pod("b", "2", "x")]))
            .is_empty());
        let ops = c.apply(snap("file", vec![pod("a", "1", "y")]));
        assert_eq!(kinds(&ops), ["remove 2", "update 1"]);
    }

    #[test]
    fn unchanged_pods_keep_their_first_seen_object() {
        let mut c = PodConfig::new(["file"]);
        let first = pod("a", "1", "x");
        c.apply(snap("file", vec![first.clone()]));
        c.apply(snap("file", vec![pod("a", "1", "x")]));
        assert!(Arc::ptr_eq(&c.desired()["1"], &first));
    }

    #[test]
    fn annotations_differ_but_for_kubelets_own() {
        let a = pod("a", "1", "x");
        assert!(!differ_semantically(&a, &a));
        let mut b = (*a).clone();
        let ann = b.metadata.annotations.get_or_insert_with(Default::default);
        ann.insert(pod::CONFIG_SEEN.into(), "later".into());
        ann.insert(pod::CONFIG_SOURCE.into(), "http".into());
        assert!(!differ_semantically(&a, &b));
        b.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("team".into(), "x".into());
        assert!(differ_semantically(&a, &b));
        // No annotations and none but kubelet's own are the same.
        let mut c = (*a).clone();
        c.metadata.annotations = None;
        assert!(!differ_semantically(&a, &c));
    }

    #[test]
    fn status_only_changes_reconcile() {
        let mut c = PodConfig::new(["http"]);
        c.apply(snap("http", vec![pod("a", "1", "x")]));
        let mut p = (*pod("a", "1", "x")).clone();
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        let ops = c.apply(snap("http", vec![Arc::new(p)]));
        assert_eq!(kinds(&ops), ["reconcile 1"]);
    }

    #[test]
    fn first_source_wins_a_name() {
        let mut c = PodConfig::new(["file", "http"]);
        c.apply(snap("http", vec![pod("a", "2", "x")]));
        let ops = c.apply(snap("file", vec![pod("a", "1", "x")]));
        assert_eq!(kinds(&ops), ["remove 2", "add 1"]);
        assert!(c.all_sources_seen());
    }
}
