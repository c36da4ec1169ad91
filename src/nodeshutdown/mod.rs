//! kubelet's node shutdown manager (pkg/kubelet/nodeshutdown, Linux): with
//! shutdownGracePeriod (or shutdownGracePeriodByPodPriority) set, the agent holds a delay
//! inhibitor lock of systemd-logind, so that a shutdown or reboot waits for it; when logind
//! says a shutdown begins (PrepareForShutdown true), the node refuses new pods and is not
//! Ready ([`NodeShutdown`]), its pods are stopped by priority group, lowest first, each group
//! with its period, each pod Failed with kubelet's reason and message and the DisruptionTarget
//! condition; then the lock is released and the shutdown goes on. A cancelled shutdown
//! (PrepareForShutdown false) takes the lock again. logind's InhibitDelayMaxSec, which bounds
//! any delay lock, is raised to the whole period through a drop-in when it is shorter. The
//! connection to logind is retried every second while it is lost. When a shutdown begins and
//! when its pods have stopped, the times are written to `graceful_node_shutdown_state` in the
//! root dir and set in the metrics, which the next start reads back ([`storage`]).
//! docs/shutdown.md.

pub mod groups;
mod logind;
pub mod storage;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use tracing::{error, info, warn};

use crate::config::shutdown::PriorityGrace;
use crate::config::Config;
use crate::events::{Kind, Recorder};
use crate::eviction::{Kill, Request, RequestFn};
use crate::lifecycle::admit::{NodeShutdown, REASON_NODE_SHUTDOWN};
use crate::pod;
use crate::pod::manager::PodManager;

/// kubelet's reason and message of a pod stopped for the node's shutdown.
pub const REASON: &str = "Terminated";
pub const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";

/// How long after losing logind the manager connects again (kubelet's dbusReconnectPeriod).
const RECONNECT: Duration = Duration::from_secs(1);

/// Has the Node's status written now (in a cluster), not at its next period.
pub type SyncNodeStatus = Arc<dyn Fn() + Send + Sync>;

pub struct Manager {
    cfg: Arc<Config>,
    pods: Arc<PodManager>,
    kill: RequestFn,
    events: Recorder,
    state: NodeShutdown,
    sync_node_status: Option<SyncNodeStatus>,
}

impl Manager {
    pub fn new(
        cfg: Arc<Config>,
        pods: Arc<PodManager>,
        kill: RequestFn,
        events: Recorder,
        state: NodeShutdown,
        sync_node_status: Option<SyncNodeStatus>,
    ) -> Manager {
        Manager {
            cfg,
            pods,
            kill,
            events,
            state,
            sync_node_status,
        }
    }

    /// The node's readiness changed: write its status now, as kubelet does.
    fn set_shutting_down(&self, shutting_down: bool) {
        self.state.set(shutting_down);
        if let Some(sync) = &self.sync_node_status {
            sync();
        }
    }

    /// Watch for shutdowns in the background, when graceful shutdown is on.
    pub fn start(self) {
        let groups = groups::groups(&self.cfg.shutdown);
        if groups.is_empty() {
            return;
        }
        tokio::spawn(async move {
            self.load_state().await;
            let mut last_error = String::new();
            loop {
                match self.watch(&groups).await {
                    Ok(()) => info!("node shutdown manager: logind's connection ended; watching again"),
                    Err(e) => {
                        let e = format!("{e:#}");
                        // Once per kind of failure: logind may be away for long.
                        if e != last_error {
                            error!(error = %e, "node shutdown manager: unable to watch the node for shutdown events");
                        }
                        last_error = e;
                    }
                }
                tokio::time::sleep(RECONNECT).await;
            }
        });
    }

    /// One connection to logind: make its delay long enough, take the lock, act on its
    /// events until the connection ends.
    async fn watch(&self, groups: &[PriorityGrace]) -> Result<()> {
        let logind = logind::Logind::connect().await?;
        let requested = groups::requested(groups);
        let current = logind.inhibit_delay_max().await?;
        if requested > current {
            logind
                .raise_inhibit_delay(&self.cfg.shutdown.logind_conf_dir, requested)
                .await?;
            // logind reads its configuration again on its own time.
            let mut updated = current;
            for _ in 0..30 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                updated = logind.inhibit_delay_max().await?;
                if updated >= requested {
                    break;
                }
            }
            if requested > updated {
                bail!(
                    "node shutdown manager was unable to update logind InhibitDelayMaxSec to {requested:?} (ShutdownGracePeriod), current value of InhibitDelayMaxSec ({updated:?}) is less than requested ShutdownGracePeriod"
                );
            }
        }
        // Subscribed before the lock is taken: no shutdown can begin unseen in between.
        let mut events = logind.shutdown_events().await?;
        let mut lock = Some(logind.inhibit_shutdown().await?);
        info!(
            shutdown_grace_period = ?requested,
            groups = %groups.iter().map(|g| format!("priority>={}: {}s", g.priority, g.shutdown_grace_period_seconds)).collect::<Vec<_>>().join(", "),
            "node shutdown manager: shutdowns wait for the pods"
        );
        while let Some(event) = events.next().await {
            if event? {
                self.events.node(
                    Kind::Normal,
                    REASON_NODE_SHUTDOWN,
                    "Shutdown manager detected shutdown event",
                );
                self.set_shutting_down(true);
                let start = Some(chrono::Utc::now());
                self.record(storage::State { start, end: None }).await;
                self.stop_pods(groups).await;
                self.record(storage::State {
                    start,
                    end: Some(chrono::Utc::now()),
                })
                .await;
                drop(lock.take());
                info!("node shutdown manager: the pods are stopped; the shutdown goes on");
            } else {
                self.events.node(
                    Kind::Normal,
                    REASON_NODE_SHUTDOWN,
                    "Shutdown manager detected shutdown cancellation",
                );
                self.set_shutting_down(false);
                if lock.is_none() {
                    lock = Some(logind.inhibit_shutdown().await?);
                }
            }
        }
        Ok(())
    }

    /// The last shutdown's times from the state file into the metrics (kubelet's setMetrics).
    /// A file that cannot be read is logged and the metrics stay 0: it says nothing the node
    /// needs to run.
    async fn load_state(&self) {
        let file = storage::path(&self.cfg.root_dir);
        let read = file.clone();
        match crate::tasks::blocking(move || Ok(storage::load(&read)?)).await {
            Ok(st) => {
                crate::metrics::global().graceful_shutdown(storage::seconds(st.start), storage::seconds(st.end));
                if st.start.is_some() {
                    info!(start = ?st.start, end = ?st.end, "node shutdown manager: the last graceful shutdown");
                }
            }
            Err(e) => error!(
                file = %file.display(),
                error = %format!("{e:#}"),
                "node shutdown manager: the graceful shutdown state cannot be read; its metrics stay 0"
            ),
        }
    }

    /// A shutdown began (no end yet) or its pods have stopped: the state file and the metrics
    /// say so. A failed write is logged; the shutdown goes on.
    async fn record(&self, st: storage::State) {
        crate::metrics::global().graceful_shutdown(storage::seconds(st.start), storage::seconds(st.end));
        let file = storage::path(&self.cfg.root_dir);
        let write = file.clone();
        if let Err(e) = crate::tasks::blocking(move || Ok(storage::store(&write, &st)?)).await {
            error!(file = %file.display(), error = %format!("{e:#}"), "node shutdown manager: writing the graceful shutdown state");
        }
    }

    /// kubelet's processShutdownEvent: each priority group in turn, lowest first: its pods
    /// killed at once, each with the shorter of its own grace period and the group's, and
    /// waited for at most the group's period.
    async fn stop_pods(&self, groups: &[PriorityGrace]) {
        let active: Vec<Arc<Pod>> = self
            .pods
            .entries()
            .into_iter()
            .filter(|e| e.is_active())
            .map(|e| e.pod)
            .collect();
        for group in groups::group_by_priority(groups, active) {
            if group.pods.is_empty() {
                continue;
            }
            let mut waits = Vec::new();
            for p in &group.pods {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let grace = groups::pod_grace(p, &group.grace);
                info!(pod = %pod::full_name(p), ?grace, priority = group.grace.priority, "node shutdown manager: stopping pod");
                (self.kill)(Request::Kill(Kill {
                    uid: pod::uid(p).to_string(),
                    reason: REASON.into(),
                    message: MESSAGE.into(),
                    grace,
                    disruption_target: true,
                    done: Some(tx),
                }));
                waits.push(rx);
            }
            let period = Duration::from_secs(group.grace.shutdown_grace_period_seconds.max(0) as u64);
            if tokio::time::timeout(period, futures::future::join_all(waits))
                .await
                .is_err()
            {
                warn!(
                    priority = group.grace.priority,
                    ?period,
                    "node shutdown manager: pods still stopping after their group's period"
                );
            }
        }
    }
}
