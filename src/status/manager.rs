//! The status manager (kubelet's pkg/kubelet/status): where each pod's latest status goes. The
//! pod table gets it at once (the HTTP API and the CLI read it there); a changed status is also
//! written to the pod's directory (`status.json`), so an agent restart keeps start times,
//! transition times and what the containers last did. In a cluster, the API server is told too
//! ([`super::sync`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use ferrolet_fsutil::{read_json_opt, write_json_atomic};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde::{Deserialize, Serialize};

use super::sync::{ApiPod, ApiStatusWriter};
use crate::mirror::MirrorQueue;
use crate::pod;
use crate::pod::manager::PodManager;
use crate::tasks::blocking;

/// What is kept of a pod's status across agent restarts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PersistedStatus {
    pub start_time: Option<DateTime<Utc>>,
    pub status: PodStatus,
}

fn record_path(pod_dir: &Path) -> PathBuf {
    pod_dir.join("status.json")
}

pub struct StatusManager {
    pods: Arc<PodManager>,
    /// The API server's side, in a cluster.
    api: Option<ApiStatusWriter>,
    mirrors: Option<MirrorQueue>,
}

impl StatusManager {
    pub fn new(pods: Arc<PodManager>, api: Option<ApiStatusWriter>, mirrors: Option<MirrorQueue>) -> StatusManager {
        StatusManager { pods, api, mirrors }
    }

    /// Where a pod's status goes on the API server: an API pod's own object, a static pod's
    /// mirror pod (once it has one).
    fn api_pod(&self, p: &Pod) -> Option<(&ApiStatusWriter, ApiPod)> {
        let api = self.api.as_ref()?;
        if pod::is_static(p) {
            let uid = self.mirrors.as_ref()?.mirror_uid(p)?;
            return Some((api, ApiPod { uid, ..ApiPod::of(p) }));
        }
        Some((api, ApiPod::of(p)))
    }

    /// The node is done with `p` (it terminated and everything it had is removed): a pod whose
    /// deletion was requested through the API server is deleted there now.
    pub fn pod_removed(&self, p: &Pod) {
        if pod::deletion_requested(p) {
            if let Some((api, to)) = self.api_pod(p) {
                api.delete(to);
            }
        }
    }

    /// The status a pod had when the agent last ran, if its directory holds one.
    pub fn load(pod_dir: &Path) -> Option<PersistedStatus> {
        read_json_opt(&record_path(pod_dir)).ok().flatten()
    }

    /// The status of a pod admission refused (it has no directory): the pod table and the API
    /// server get it.
    pub fn set_refused(&self, p: &Pod, status: PodStatus) {
        if let Some((api, to)) = self.api_pod(p) {
            api.status(to, status.clone());
        }
        self.pods.upsert(pod::uid(p), Arc::new(p.clone()), Some(status));
    }

    /// Record the status of pod `p`. `changed`: it differs from the last one recorded, so it
    /// is persisted too (when the pod still has a directory), before the pod table and the API
    /// server see it: a status anyone saw is never lost to an agent stopped right after it.
    pub async fn set(&self, p: &Pod, pod_dir: &Path, rec: PersistedStatus, changed: bool) -> anyhow::Result<()> {
        let status = rec.status.clone();
        let persisted = if changed {
            let path = record_path(pod_dir);
            blocking(move || {
                if path.parent().is_some_and(Path::exists) {
                    write_json_atomic(&path, &rec)?;
                }
                Ok(())
            })
            .await
        } else {
            Ok(())
        };
        if let Some((api, to)) = self.api_pod(p) {
            // The writer skips what the API server already has.
            api.status(to, status.clone());
        }
        self.pods.set_status(pod::uid(p), status);
        persisted
    }
}
