//! Pods the node has but no source wants (kubelet's HandlePodCleanups): containers an earlier
//! run left, pod directories and pod cgroups without a pod, and containers a crash during
//! termination left behind. Each gets a worker that starts out terminating, so it is torn down
//! exactly as a removed pod would be.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use super::pod_worker::Lifecycle;
use super::PodWorkers;
use crate::kuberuntime::labels::LABEL_POD_UID;
use crate::pod;

impl PodWorkers {
    /// Once every source has reported (`all_sources_seen`), terminate what exists on the node
    /// for pods no source wants. Runs once.
    pub fn clean_orphans(&mut self, all_sources_seen: bool) {
        if self.orphans_cleaned || !all_sources_seen {
            return;
        }
        self.orphans_cleaned = true;
        let mut uids: HashSet<String> = self.adoptable.keys().cloned().collect();
        for e in std::fs::read_dir(self.m.cfg.pods_dir()).into_iter().flatten().flatten() {
            uids.insert(e.file_name().to_string_lossy().into_owned());
        }
        uids.extend(self.m.setup.cgroups().existing_pod_uids());
        for uid in uids {
            if !self.slots.contains_key(&uid) && !self.pending.iter().any(|p| pod::uid(p) == uid) {
                self.terminate_orphan(uid);
            }
        }
    }

    /// Periodic: containers that carry a pod UID nobody owns (left by a crash during
    /// termination) are cleaned up.
    pub fn housekeeping(&mut self) {
        if !self.orphans_cleaned {
            return;
        }
        let list = match self.m.rt.list() {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %ferrolet_fsutil::chain(&e), "listing containers for housekeeping");
                return;
            }
        };
        let mut strays: HashMap<String, Vec<String>> = HashMap::new();
        for c in list {
            if let Some(uid) = c.record.labels.get(LABEL_POD_UID) {
                if !self.slots.contains_key(uid) {
                    strays.entry(uid.clone()).or_default().push(c.id().to_string());
                }
            }
        }
        for (uid, ids) in strays {
            self.adoptable.insert(uid.clone(), ids);
            self.terminate_orphan(uid);
        }
    }

    /// Tear down everything the node has for `uid`: the pod as last recorded in its directory,
    /// or a stand-in when there is none.
    pub(super) fn terminate_orphan(&mut self, uid: String) {
        let dir = self.m.pod_dir(&uid);
        let stored: Option<Pod> = ferrolet_fsutil::read_json_opt(&dir.join("pod.json")).ok().flatten();
        let p = stored.unwrap_or_else(|| {
            let mut p = Pod::default();
            p.metadata.uid = Some(uid.clone());
            p.metadata.name = Some(format!("orphan-{uid}"));
            p.metadata.namespace = Some("default".into());
            p.spec = Some(Default::default());
            p
        });
        info!(pod = %pod::full_name(&p), "cleaning up a pod that is no longer wanted");
        let known = self.adoptable.remove(&uid).unwrap_or_default();
        self.spawn(Arc::new(p), known, Lifecycle::Terminating);
    }
}
