//! runOnce (`--runonce`, `runOnce: true`), after kubelet's runonce.go: take the first update of
//! the static pod sources (within a second, else fail), run its pods, wait for each until all
//! its containers run or it has finished (a pod the node refuses counts as done, as kubelet's
//! rejected pods do), report each pod and exit: 0 when every pod ran, non-zero when one could
//! not be synced (a container that cannot be created or started, an image that cannot be had)
//! or did not run within kubelet's ten retries (1 s doubling: 1023 s). The containers are left
//! as they are, as kubelet leaves them; the next `ferrolet run` adopts them.
//! docs/agent.md#runonce

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::sync::oneshot;
use tracing::info;

use crate::pod::manager::PodManager;
use crate::pod::{self, reasons};

/// kubelet's runOnceManifestDelay.
pub const MANIFEST_DELAY: Duration = Duration::from_secs(1);
/// kubelet's runOnceMaxRetries, runOnceRetryDelay and runOnceRetryDelayBackoff: a pod has
/// 1 + 2 + ... + 512 seconds to run.
const MAX_RETRIES: u32 = 10;
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// How long a pod may take to run: the sum of kubelet's retry delays.
pub fn pod_deadline() -> Duration {
    RETRY_DELAY * ((1u32 << MAX_RETRIES) - 1)
}

/// Where a pod stands, as runPod sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assessment {
    /// Not synced yet, or containers still starting.
    Pending,
    /// Every container of the pod is running (kubelet's isPodRunning).
    Running,
    /// Succeeded or Failed (kubelet's isTerminal).
    Finished(String),
    /// Refused by admission: a result, not an error, in kubelet's runOnce.
    Rejected { reason: String, message: String },
    /// What kubelet's syncPod would have returned as an error (back-offs are not errors).
    SyncError(String),
}

/// The waiting reasons that are sync errors in kubelet (its SyncPod result errors other than
/// ErrCrashLoopBackOff and ErrImagePullBackOff).
const SYNC_ERRORS: &[&str] = &[
    reasons::ERR_IMAGE_PULL,
    reasons::ERR_IMAGE_NEVER_PULL,
    reasons::INVALID_IMAGE_NAME,
    reasons::CREATE_CONTAINER_CONFIG_ERROR,
    reasons::CREATE_CONTAINER_ERROR,
    reasons::RUN_CONTAINER_ERROR,
    reasons::POST_START_HOOK_ERROR,
];

pub fn assess(p: &Pod, st: &PodStatus) -> Assessment {
    let phase = st.phase.as_deref().unwrap_or("Pending");
    if phase == "Failed" && st.container_statuses.is_none() && st.reason.is_some() {
        return Assessment::Rejected {
            reason: st.reason.clone().unwrap_or_default(),
            message: st.message.clone().unwrap_or_default(),
        };
    }
    if matches!(phase, "Succeeded" | "Failed") {
        return Assessment::Finished(phase.to_string());
    }
    let statuses: Vec<_> = st
        .init_container_statuses
        .iter()
        .flatten()
        .chain(st.container_statuses.iter().flatten())
        .collect();
    for s in &statuses {
        if let Some(w) = s.state.as_ref().and_then(|x| x.waiting.as_ref()) {
            let reason = w.reason.as_deref().unwrap_or("");
            if SYNC_ERRORS.contains(&reason) {
                let message = w.message.as_deref().unwrap_or("");
                return Assessment::SyncError(format!("container {:?}: {reason}: {message}", s.name));
            }
        }
    }
    let running = pod::containers(p).iter().all(|c| {
        st.container_statuses
            .iter()
            .flatten()
            .find(|s| s.name == c.name)
            .is_some_and(|s| s.state.as_ref().is_some_and(|x| x.running.is_some()))
    });
    if running {
        Assessment::Running
    } else {
        Assessment::Pending
    }
}

/// One pod's outcome: the line printed for it, and whether it counts as a failure.
#[derive(Debug, Clone)]
pub struct PodResult {
    pub pod: String,
    pub line: String,
    pub failed: bool,
}

async fn run_pod(pods: Arc<PodManager>, p: Arc<Pod>, deadline: Duration) -> PodResult {
    let name = format!("{}/{}", pod::namespace(&p), pod::name(&p));
    let uid = pod::uid(&p).to_string();
    let until = crate::tasks::after(tokio::time::Instant::now(), deadline);
    let mut last = Assessment::Pending;
    loop {
        if let Some(e) = pods.get(&uid) {
            last = assess(&e.pod, &e.status);
        }
        let done = |line: String, failed: bool| PodResult {
            pod: pod::full_name(&p),
            line: format!("{name}: {line}"),
            failed,
        };
        match &last {
            Assessment::Pending => {}
            Assessment::Running => {
                info!(pod = %name, "Pod's containers running");
                return done("Running".into(), false);
            }
            Assessment::Finished(phase) => {
                info!(pod = %name, phase = %phase, "Pod finished");
                return done(phase.clone(), false);
            }
            Assessment::Rejected { reason, message } => {
                info!(pod = %name, reason = %reason, "Pod rejected: {message}");
                return done(format!("Rejected: {reason}: {message}"), false);
            }
            Assessment::SyncError(e) => {
                info!(pod = %name, "Unable to start pod because container failed: {e}");
                return done(format!("error syncing pod: {e}"), true);
            }
        }
        if tokio::time::Instant::now() >= until {
            return done(
                format!("timeout error: pod containers not running after {MAX_RETRIES} retries"),
                true,
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wait for the first update, run its pods, print a line per pod (in manifest order) and fail
/// when any pod failed.
pub async fn run(first: oneshot::Receiver<Vec<Arc<Pod>>>, pods: Arc<PodManager>) -> Result<Vec<PodResult>> {
    let update = match tokio::time::timeout(MANIFEST_DELAY, first).await {
        Ok(Ok(u)) => u,
        _ => bail!("no pod manifest update after {MANIFEST_DELAY:?}"),
    };
    info!(num_pods = update.len(), "Processing manifest with pods");
    let waits: Vec<_> = update
        .iter()
        .map(|p| tokio::spawn(run_pod(pods.clone(), p.clone(), pod_deadline())))
        .collect();
    let mut results = Vec::new();
    for w in waits {
        results.push(w.await?);
    }
    info!(num_pods = update.len(), "Finished processing pods");
    for r in &results {
        println!("{}", r.line);
    }
    let failed: Vec<&str> = results.iter().filter(|r| r.failed).map(|r| r.pod.as_str()).collect();
    if !failed.is_empty() {
        bail!("runonce failed: error running pods: [{}]", failed.join(" "));
    }
    info!(num_pods = results.len(), "Pods started");
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {"containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]}}),
        )
        .unwrap()
    }

    fn status(v: serde_json::Value) -> PodStatus {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn running_means_every_container_running() {
        let p = pod();
        let one = status(serde_json::json!({"phase": "Pending", "containerStatuses": [
            {"name": "a", "image": "i", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}},
            {"name": "b", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"waiting": {"reason": "ContainerCreating"}}}]}));
        assert_eq!(assess(&p, &one), Assessment::Pending);
        let both = status(serde_json::json!({"phase": "Running", "containerStatuses": [
            {"name": "a", "image": "i", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}},
            {"name": "b", "image": "i", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}]}));
        assert_eq!(assess(&p, &both), Assessment::Running);
    }

    #[test]
    fn finished_rejected_and_sync_errors() {
        let p = pod();
        let done = status(serde_json::json!({"phase": "Succeeded", "containerStatuses": []}));
        assert_eq!(assess(&p, &done), Assessment::Finished("Succeeded".into()));
        let rejected = status(serde_json::json!({"phase": "Failed", "reason": "AppArmor",
            "message": "Cannot enforce AppArmor: AppArmor is not enabled on the host"}));
        assert!(matches!(assess(&p, &rejected), Assessment::Rejected { reason, .. } if reason == "AppArmor"));
        let never = status(serde_json::json!({"phase": "Pending", "containerStatuses": [
            {"name": "a", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"waiting": {"reason": "ErrImageNeverPull", "message": "not present"}}}]}));
        assert_eq!(
            assess(&p, &never),
            Assessment::SyncError("container \"a\": ErrImageNeverPull: not present".into())
        );
        // Back-offs are not errors: kubelet keeps waiting.
        let backoff = status(serde_json::json!({"phase": "Running", "containerStatuses": [
            {"name": "a", "image": "i", "imageID": "", "ready": false, "restartCount": 3,
             "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}));
        assert_eq!(assess(&p, &backoff), Assessment::Pending);
    }

    #[test]
    fn the_deadline_is_kubelets_ten_doubling_retries() {
        assert_eq!(pod_deadline(), Duration::from_secs(1023));
    }
}
