//! Pods the node stops for good while their source still wants them (kubelet's killPodNow with
//! a status function, and its active deadline handler): past `activeDeadlineSeconds`, or a
//! [`KillPod`](super::KillPod) from the eviction manager. The containers stop (kept, so their
//! logs can be read), probes stop, the network and volumes are released, nothing restarts, and
//! the status stays phase Failed with the reason until the pod is removed — also across agent
//! restarts, since the reason is read back from the recorded status.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::info;

use super::pod_worker::PodWorker;
use crate::pod::reasons;
use crate::pod::{self, Phase};
use crate::status::Killed;

/// When a pod started at `start` runs out of its `activeDeadlineSeconds` (kubelet's
/// pastActiveDeadline counts from status.startTime).
pub fn active_deadline(p: &k8s_openapi::api::core::v1::Pod, start: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let secs = pod::spec(p).active_deadline_seconds?;
    // (validation keeps it to 1..=2^31-1; never panic on what slipped through)
    crate::tasks::wall_after(start, secs.max(0))
}

impl PodWorker {
    /// kubelet's active deadline handler: a pod past its deadline is killed with reason
    /// DeadlineExceeded. Returns when the deadline comes, while it is still ahead. A pod that
    /// has finished on its own (Succeeded or Failed) is left as it is.
    pub(super) fn check_active_deadline(&mut self) -> Option<DateTime<Utc>> {
        if self.report.killed.is_some() {
            return None;
        }
        let finished = self
            .report
            .last
            .as_ref()
            .and_then(Phase::of)
            .is_some_and(Phase::is_terminal);
        let deadline = active_deadline(&self.pod, self.report.start_time?)?;
        if finished {
            return None;
        }
        if Utc::now() < deadline {
            return Some(deadline);
        }
        info!(pod = %pod::full_name(&self.pod), "the pod is past its active deadline; stopping it");
        self.event(None, reasons::DEADLINE_EXCEEDED, reasons::DEADLINE_EXCEEDED_MESSAGE);
        self.report.killed = Some(Killed {
            reason: reasons::DEADLINE_EXCEEDED.into(),
            message: reasons::DEADLINE_EXCEEDED_MESSAGE.into(),
            disruption: false,
        });
        None
    }

    /// One round of a killed pod: stop what still runs, release the network and volumes once,
    /// publish the Failed status, tell whoever asked for the kill.
    pub(super) async fn sync_killed_pod(&mut self) {
        self.probes.stop_all();
        let grace = self
            .report
            .kill_grace
            .unwrap_or_else(|| Duration::from_secs(pod::grace_period(&self.pod) as u64));
        let views = self.views().await;
        if views.all().any(|v| v.is_active()) {
            // The Failed status goes out first, as kubelet sets it before the kill.
            self.publish_status(&views).await;
            self.stop_containers(grace).await;
        }
        if !self.report.released {
            let sb = self.resources.sandbox.clone();
            if self.m.setup.release(&self.pod, &self.pod_dir, sb.as_ref()).await {
                self.report.released = true;
                self.resources.volumes.clear();
            }
        }
        let views = self.views().await;
        self.publish_status(&views).await;
        for done in self.report.kill_done.drain(..) {
            let _ = done.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_counts_from_the_start_time() {
        let p: k8s_openapi::api::core::v1::Pod =
            serde_json::from_value(serde_json::json!({"spec": {"activeDeadlineSeconds": 30, "containers": []}}))
                .unwrap();
        let start = Utc::now();
        assert_eq!(active_deadline(&p, start), Some(start + chrono::Duration::seconds(30)));
        let none: k8s_openapi::api::core::v1::Pod =
            serde_json::from_value(serde_json::json!({"spec": {"containers": []}})).unwrap();
        assert_eq!(active_deadline(&none, start), None);
    }
}
