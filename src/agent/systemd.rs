//! The agent as a systemd service (`Type=notify`, examples/ferrolet.service): `READY=1` once
//! every pod source has handed its first pods to the pod workers (or, when a source has not
//! answered within [`READY_WITHOUT`], without it: a node whose API server is away and that has
//! no checkpoint still starts); `WATCHDOG=1` at half the unit's `WatchdogSec` while the sync
//! loop and the pod workers are live (a hung agent is restarted by systemd; its pods keep
//! running, `KillMode=process`, and the next start adopts them); `STOPPING=1` on the way out.
//! Without `NOTIFY_SOCKET` (not started by systemd) nothing is sent. docs/systemd.md.

use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::tasks::{Liveness, POD_WORKER, SYNC_LOOP};

/// How long READY=1 waits for a source that has not answered (the API server's first list).
pub const READY_WITHOUT: Duration = Duration::from_secs(10);

fn send(state: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(false, state) {
        warn!(error = %e, "telling systemd the service's state");
    }
}

/// Say READY=1 when `sources_seen` fires (or after [`READY_WITHOUT`]), then keep the watchdog
/// fed while the agent is live.
pub fn start(sources_seen: oneshot::Receiver<()>, liveness: Arc<Liveness>) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    tokio::spawn(async move {
        let status = match tokio::time::timeout(READY_WITHOUT, sources_seen).await {
            Ok(_) => "pods of every source handed to the pod workers".to_string(),
            Err(_) => format!("a pod source has not answered within {READY_WITHOUT:?}; ready without it"),
        };
        send(&[NotifyState::Ready, NotifyState::Status(&status)]);
        info!(status, "told systemd the agent is ready");
        let Some(usec) = watchdog_usec() else { return };
        let every = Duration::from_micros(usec) / 2;
        info!(every = ?every, "feeding systemd's watchdog");
        let mut starving = false;
        loop {
            let failures: Vec<String> = liveness
                .failures_of(SYNC_LOOP)
                .into_iter()
                .chain(liveness.failures_of(POD_WORKER))
                .collect();
            if failures.is_empty() {
                send(&[NotifyState::Watchdog]);
                starving = false;
            } else if !starving {
                warn!(failures = ?failures, "not feeding systemd's watchdog: the agent is not live");
                starving = true;
            }
            tokio::time::sleep(every).await;
        }
    });
}

/// The unit's watchdog period (`WATCHDOG_USEC`), when it is meant for this process: as
/// libsystemd's sd_watchdog_enabled, a `WATCHDOG_PID` that is set must be ours (sd-notify's
/// own check also refuses an unset one, which systemd's manual allows).
fn watchdog_usec() -> Option<u64> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok().filter(|u| *u > 0)?;
    match std::env::var("WATCHDOG_PID") {
        Ok(pid) if pid.parse::<u32>().ok() != Some(std::process::id()) => None,
        _ => Some(usec),
    }
}

/// The agent is stopping.
pub fn stopping() {
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        send(&[NotifyState::Stopping]);
    }
}
