//! The agent's main loop (kubelet's syncLoop): the sources' snapshots go through the pod config
//! into pod operations for the pod workers; finished workers and the housekeeping tick come
//! back here. Every change of the set of pods on the node passes through this one task, in
//! order; the pod workers do the slow parts.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::mpsc;
use tracing::error;

use crate::pod::manager::PodManager;
use crate::podconfig::{PodConfig, Snapshot};
use crate::tasks::{panic_message, Liveness, SYNC_LOOP};
use crate::worker::{KillPod, PodWorkers};

pub enum Event {
    /// A source's complete view of its pods.
    Snapshot(Snapshot),
    /// Periodic housekeeping (containers nobody owns).
    Housekeeping,
    /// Kill a pod and leave it Failed (the eviction manager's evictions), by UID.
    Kill(String, KillPod),
    /// Run an evicted static pod again from the start, by UID (the eviction manager, once the
    /// node's pressure is gone).
    Rerun(String),
}

pub struct Loop {
    pub config: PodConfig,
    pub workers: PodWorkers,
    pub pods: Arc<PodManager>,
    pub liveness: Arc<Liveness>,
    /// How long the loop may go without an iteration before /healthz fails (kubelet: twice the
    /// sync frequency, at least 5 minutes).
    pub max_silence: Duration,
    /// runOnce: told the pods of the first update the sources send.
    pub first_update: Option<tokio::sync::oneshot::Sender<Vec<Arc<k8s_openapi::api::core::v1::Pod>>>>,
    /// Told once every source has reported and its pods went to the workers (READY=1).
    pub all_seen: Option<tokio::sync::oneshot::Sender<()>>,
}

pub async fn run(l: Loop, mut events: mpsc::UnboundedReceiver<Event>, mut finished: mpsc::UnboundedReceiver<String>) {
    let Loop {
        mut config,
        mut workers,
        pods,
        liveness,
        max_silence,
        mut first_update,
        mut all_seen,
    } = l;
    // With no sources at all there is nothing to wait for.
    workers.clean_orphans(config.all_sources_seen()).await;
    let mut tell_all_seen = |seen: bool| {
        if seen {
            if let Some(tx) = all_seen.take() {
                let _ = tx.send(());
            }
        }
    };
    tell_all_seen(config.all_sources_seen());
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        liveness.beat(SYNC_LOOP, max_silence);
        let step = tokio::select! {
            _ = tick.tick() => continue,
            ev = events.recv() => match ev {
                Some(ev) => Step::Event(ev),
                None => return,
            },
            uid = finished.recv() => match uid {
                Some(uid) => Step::Finished(uid),
                None => return,
            },
        };
        // One bad event must not end the loop that every pod change goes through.
        let handled = std::panic::AssertUnwindSafe(async {
            match step {
                Step::Event(Event::Snapshot(s)) => {
                    if let Some(tx) = first_update.take() {
                        let _ = tx.send(s.pods.clone());
                    }
                    pods.set_source_errors(s.source, &s.errors);
                    for op in config.apply(s) {
                        workers.handle(op);
                    }
                    workers.clean_orphans(config.all_sources_seen()).await;
                    tell_all_seen(config.all_sources_seen());
                }
                Step::Event(Event::Housekeeping) => workers.housekeeping().await,
                Step::Event(Event::Kill(uid, k)) => workers.kill(&uid, k),
                Step::Event(Event::Rerun(uid)) => workers.rerun(&uid),
                Step::Finished(uid) => workers.finished(&uid),
            }
        })
        .catch_unwind()
        .await;
        if let Err(p) = handled {
            error!("handling a pod change panicked: {}; carrying on", panic_message(p));
        }
    }
}

enum Step {
    Event(Event),
    Finished(String),
}
