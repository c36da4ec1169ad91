//! Stopping a container (kubelet's killContainer): preStop hook, stop signal, grace period,
//! SIGKILL.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use ferrolet_runtime::Runtime;
use k8s_openapi::api::core::v1::Container;
use tracing::warn;

use super::views::ContainerView;
use crate::lifecycle;
use crate::pod::reasons;
use crate::probe::netns::PodTarget;

/// The least time a container gets between its stop signal and SIGKILL when it is stopped
/// inside a pod that keeps running (a restart, a failed probe, a changed sandbox, a failed
/// postStart hook), and after a preStop hook (the documented one-off extension): kubelet's
/// minimumGracePeriodInSeconds.
pub const MIN_GRACE: Duration = Duration::from_secs(2);

/// The least time a container gets when its whole pod ends (deleted, evicted, past its active
/// deadline). kubelet's pod workers hand killContainer the pod's effective grace period as an
/// override there, never less than 1 s, and an override replaces the 2 s minimum.
pub const MIN_POD_GRACE: Duration = Duration::from_secs(1);

/// Stop one container (kubelet's killContainer): its preStop hook first (inside the grace
/// period), then the stop signal, then SIGKILL when the rest of the grace period is over. The
/// signal always gets at least `floor` ([`MIN_GRACE`] or [`MIN_POD_GRACE`]), and at least
/// [`MIN_GRACE`] after a preStop hook. Owns its arguments so a pod worker can run several at
/// once beside its own loop.
pub async fn kill_container(
    rt: Arc<Runtime>,
    spec: Option<Container>,
    target: PodTarget,
    pod_name: String,
    v: ContainerView,
    grace: Duration,
    mut floor: Duration,
) {
    let mut left = grace;
    // preStop only for a running container, and only with a grace period to run in.
    if let (true, Some(c)) = (v.is_running() && !grace.is_zero(), spec) {
        if let Some(h) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
            let t0 = tokio::time::Instant::now();
            match tokio::time::timeout(grace, lifecycle::run(&rt, h, &v.id, &c, &pod_name, &target, grace)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    warn!(pod = %pod_name, container = %v.name, reason = reasons::EVENT_FAILED_PRE_STOP_HOOK, "PreStopHook failed: {e}")
                }
                Err(_) => {
                    warn!(pod = %pod_name, container = %v.name, reason = reasons::EVENT_FAILED_PRE_STOP_HOOK, "PreStopHook did not finish within the grace period")
                }
            }
            left = grace.saturating_sub(t0.elapsed());
            floor = MIN_GRACE;
        }
    }
    stop_container(rt, v.id.clone(), v.stop_signal.clone(), left.max(floor)).await;
}

/// Signal a container (its image's StopSignal, else SIGTERM), wait up to `grace`, then SIGKILL.
pub async fn stop_container(rt: Arc<Runtime>, id: String, stop_signal: Option<String>, grace: Duration) {
    let sig = stop_signal
        .as_deref()
        .and_then(|s| nix::sys::signal::Signal::from_str(s).ok())
        .map(|s| s as i32)
        .unwrap_or(libc::SIGTERM);
    let stopped = crate::metrics::global().time_runtime("stop_container", rt.stop(&id, sig, grace));
    if let Err(e) = stopped.await {
        if !e.is_not_found() {
            warn!(container = %id, error = %ferrolet_fsutil::chain(&e), "stopping container");
        }
    }
}
