//! Pods the node has but no source wants (kubelet's HandlePodCleanups): containers an earlier
//! run left, pod directories and pod cgroups without a pod, and containers a crash during
//! termination left behind. Each gets a worker that starts out terminating, so it is torn down
//! exactly as a removed pod would be.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use ferrolet_runtime::Runtime;
use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use super::lifecycle::Lifecycle;
use super::{Managers, PodWorkers};
use crate::kuberuntime::labels::LABEL_POD_UID;
use crate::pod;
use crate::tasks::blocking;

impl PodWorkers<Managers> {
    /// Once every source has reported (`all_sources_seen`), terminate what exists on the node
    /// for pods no source wants. Runs once.
    pub async fn clean_orphans(&mut self, all_sources_seen: bool) {
        if self.orphans_cleaned || !all_sources_seen {
            return;
        }
        self.orphans_cleaned = true;
        let m = self.m.clone();
        let mut uids: HashSet<String> = self.adoptable.keys().cloned().collect();
        match blocking(move || Ok(uids_on_disk(&m))).await {
            Ok(found) => uids.extend(found),
            Err(e) => warn!(error = %format!("{e:#}"), "listing pod directories and cgroups"),
        }
        let orphans: Vec<String> = uids
            .into_iter()
            .filter(|uid| !self.slots.contains_key(uid) && !self.pending.iter().any(|p| pod::uid(p) == uid))
            .collect();
        for (uid, stored) in self.stored_pods(orphans).await {
            self.terminate_orphan(uid, stored);
        }
    }

    /// Periodic: containers that carry a pod UID nobody owns (left by a crash during
    /// termination) are cleaned up.
    pub async fn housekeeping(&mut self) {
        if !self.orphans_cleaned {
            return;
        }
        // Mirror pods whose static pod the node no longer has (terminating ones keep theirs).
        if let Some(mirrors) = &self.m.mirrors {
            let statics = self
                .slots
                .values()
                .map(|s| s.pod())
                .filter(|p| pod::is_static(p))
                .map(|p| crate::mirror::full_name(p))
                .collect();
            mirrors.cleanup(statics);
        }
        let rt = self.m.rt.clone();
        let by_pod = match blocking(move || Ok(containers_by_pod(&rt)?)).await {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %format!("{e:#}"), "listing containers for housekeeping");
                return;
            }
        };
        let strays: Vec<(String, Vec<String>)> = by_pod
            .into_iter()
            .filter(|(uid, _)| !self.slots.contains_key(uid))
            .collect();
        let uids: Vec<String> = strays.iter().map(|(uid, _)| uid.clone()).collect();
        let stored = self.stored_pods(uids).await;
        for ((uid, ids), (_, pod)) in strays.into_iter().zip(stored) {
            self.adoptable.insert(uid.clone(), ids);
            self.terminate_orphan(uid, pod);
        }
    }

    /// The pods as last recorded in their directories (`pod.json`), read off the async threads.
    async fn stored_pods(&self, uids: Vec<String>) -> Vec<(String, Option<Pod>)> {
        let m = self.m.clone();
        let fallback = uids.iter().map(|u| (u.clone(), None)).collect();
        blocking(move || {
            Ok(uids
                .into_iter()
                .map(|uid| {
                    let stored = ferrolet_fsutil::read_json_opt(&m.pod_dir(&uid).join("pod.json"))
                        .ok()
                        .flatten();
                    (uid, stored)
                })
                .collect())
        })
        .await
        .unwrap_or(fallback)
    }
}

impl<H: super::WorkerHost> PodWorkers<H> {
    /// Tear down everything the node has for `uid`: the pod `stored` (as last recorded), or a
    /// stand-in when there is none.
    pub(super) fn terminate_orphan(&mut self, uid: String, stored: Option<Pod>) {
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

/// The runtime's containers by pod UID: from their labels, or when those could not be read
/// back, from their cgroup path (`.../pod<uid>/<id>`). Containers of neither are not pods' and
/// are left alone.
pub fn containers_by_pod(rt: &Runtime) -> ferrolet_runtime::Result<HashMap<String, Vec<String>>> {
    let mut by_pod: HashMap<String, Vec<String>> = HashMap::new();
    for c in rt.list()? {
        let uid = c
            .record
            .labels
            .get(LABEL_POD_UID)
            .cloned()
            .or_else(|| pod_uid_of_cgroup(&c.record.cgroup_path));
        if let Some(uid) = uid {
            by_pod.entry(uid).or_default().push(c.id().to_string());
        }
    }
    Ok(by_pod)
}

/// The pod UID in a container's cgroup path, as the pod cgroups name it (`pod<uid>`).
fn pod_uid_of_cgroup(path: &str) -> Option<String> {
    let parent = std::path::Path::new(path).parent()?.file_name()?.to_str()?;
    parent.strip_prefix("pod").filter(|u| !u.is_empty()).map(str::to_string)
}

/// Pod UIDs with a directory under the root dir or a pod cgroup.
fn uids_on_disk(m: &Managers) -> HashSet<String> {
    let mut uids: HashSet<String> = std::fs::read_dir(m.cfg.pods_dir())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    uids.extend(m.setup.cgroups().existing_pod_uids());
    uids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_uid_from_a_container_cgroup() {
        assert_eq!(
            pod_uid_of_cgroup("/a/kubepods/burstable/pod1234-ab/c0ffee").as_deref(),
            Some("1234-ab")
        );
        assert_eq!(pod_uid_of_cgroup("/a/kubepods/pod9/c").as_deref(), Some("9"));
        assert_eq!(pod_uid_of_cgroup("/a/other/c"), None);
    }
}
