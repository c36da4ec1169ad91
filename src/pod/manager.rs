//! The agent's table of pods (kubelet's pod manager): each admitted (or rejected) pod with its
//! latest status, shared by the pod workers and the status manager (writers) and the HTTP API
//! and CLI (readers); plus what the sources could not read, so `ferrolet pods` can say why a
//! manifest is not running.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{Pod, PodStatus};

#[derive(Debug, Clone)]
pub struct PodEntry {
    pub pod: Arc<Pod>,
    /// Shared: the readers that copy every entry each round (the stats sampler, eviction,
    /// container GC) copy a pointer, not the containers' statuses.
    pub status: Arc<PodStatus>,
    pub terminating: bool,
}

impl PodEntry {
    /// Neither stopping nor finished: a pod the node may still stop (kubelet's active pods).
    pub fn is_active(&self) -> bool {
        !self.terminating && !super::Phase::of(&self.status).is_some_and(super::Phase::is_terminal)
    }
}

#[derive(Default)]
pub struct PodManager {
    pods: RwLock<BTreeMap<String, PodEntry>>,
    /// Manifest location -> error.
    source_errors: RwLock<BTreeMap<String, String>>,
}

impl PodManager {
    pub fn upsert(&self, uid: &str, pod: Arc<Pod>, status: Option<PodStatus>) {
        let mut m = self.pods.write().unwrap_or_else(|e| e.into_inner());
        match m.get_mut(uid) {
            Some(e) => {
                e.pod = pod;
                if let Some(s) = status {
                    e.status = Arc::new(s);
                }
            }
            None => {
                m.insert(
                    uid.to_string(),
                    PodEntry {
                        pod,
                        status: Arc::new(status.unwrap_or_default()),
                        terminating: false,
                    },
                );
            }
        }
    }

    pub fn set_status(&self, uid: &str, status: PodStatus) {
        if let Some(e) = self.pods.write().unwrap_or_else(|e| e.into_inner()).get_mut(uid) {
            e.status = Arc::new(status);
        }
    }

    /// Replace the stored object of a pod (its status stays).
    pub fn set_pod(&self, uid: &str, pod: Arc<Pod>) {
        if let Some(e) = self.pods.write().unwrap_or_else(|e| e.into_inner()).get_mut(uid) {
            e.pod = pod;
        }
    }

    pub fn set_terminating(&self, uid: &str) {
        if let Some(e) = self.pods.write().unwrap_or_else(|e| e.into_inner()).get_mut(uid) {
            e.terminating = true;
        }
    }

    pub fn remove(&self, uid: &str) {
        self.pods.write().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }

    pub fn get(&self, uid: &str) -> Option<PodEntry> {
        self.pods.read().unwrap_or_else(|e| e.into_inner()).get(uid).cloned()
    }

    /// The phase of a pod's latest status, read in place (no copy of the status).
    pub fn phase(&self, uid: &str) -> Option<super::Phase> {
        let pods = self.pods.read().unwrap_or_else(|e| e.into_inner());
        super::Phase::of(&pods.get(uid)?.status)
    }

    pub fn entries(&self) -> Vec<PodEntry> {
        self.pods
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Pods with their status, as the API returns them.
    pub fn pods(&self) -> Vec<Pod> {
        self.entries()
            .into_iter()
            .map(|e| {
                let mut p = (*e.pod).clone();
                p.status = Some(Arc::unwrap_or_clone(e.status));
                p
            })
            .collect()
    }

    /// Find a pod by namespace and name; a bare manifest name also matches its node-suffixed
    /// static pod name.
    pub fn find(&self, namespace: &str, name: &str, node: &str) -> Option<PodEntry> {
        let entries = self.entries();
        let exact = entries
            .iter()
            .find(|e| super::namespace(&e.pod) == namespace && super::name(&e.pod) == name);
        exact
            .or_else(|| {
                let suffixed = format!("{name}-{node}");
                entries
                    .iter()
                    .find(|e| super::namespace(&e.pod) == namespace && super::name(&e.pod) == suffixed)
            })
            .cloned()
    }

    /// What `source` could not read now (manifest location -> error), replacing what it
    /// reported before.
    pub fn set_source_errors(&self, source: &str, errors: &BTreeMap<String, String>) {
        let prefix = format!("{source}:");
        let mut m = self.source_errors.write().unwrap_or_else(|e| e.into_inner());
        m.retain(|k, _| !k.starts_with(&prefix));
        m.extend(errors.iter().map(|(k, v)| (format!("{prefix}{k}"), v.clone())));
    }

    /// Every source's errors, keyed `<source>:<manifest location>`.
    pub fn source_errors(&self) -> BTreeMap<String, String> {
        self.source_errors.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
