//! The status manager (kubelet's pkg/kubelet/status): where each pod's latest status goes. The
//! pod table gets it at once (the HTTP API and the CLI read it there); a changed status is also
//! written to the pod's directory (`status.json`), so an agent restart keeps start times,
//! transition times and what the containers last did.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use ferrolet_fsutil::{read_json_opt, write_json_atomic};
use k8s_openapi::api::core::v1::PodStatus;
use serde::{Deserialize, Serialize};

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
}

impl StatusManager {
    pub fn new(pods: Arc<PodManager>) -> StatusManager {
        StatusManager { pods }
    }

    /// The status a pod had when the agent last ran, if its directory holds one.
    pub fn load(pod_dir: &Path) -> Option<PersistedStatus> {
        read_json_opt(&record_path(pod_dir)).ok().flatten()
    }

    /// Record the status of pod `uid`. `changed`: it differs from the last one recorded, so it
    /// is persisted too (when the pod still has a directory).
    pub async fn set(&self, uid: &str, pod_dir: &Path, rec: PersistedStatus, changed: bool) -> anyhow::Result<()> {
        self.pods.set_status(uid, rec.status.clone());
        if !changed {
            return Ok(());
        }
        let path = record_path(pod_dir);
        blocking(move || {
            if path.parent().is_some_and(Path::exists) {
                write_json_atomic(&path, &rec)?;
            }
            Ok(())
        })
        .await
    }
}
