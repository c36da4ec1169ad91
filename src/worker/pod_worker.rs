//! One pod's worker: a task that owns everything the agent knows about the pod on this node and
//! walks it through kubelet's lifecycle ([`Lifecycle`]). Updates, container exits, probe results
//! and back-off expiries wake it; between wakes it resyncs every syncFrequency. A panic in one
//! round is logged and the round retried: the worker, and what it knows, survive it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::FutureExt;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use super::Managers;
use crate::backoff::Backoff;
use crate::kuberuntime::kill::{kill_container, MIN_GRACE};
use crate::kuberuntime::labels;
use crate::kuberuntime::views::{ContainerView, PodContainers};
use crate::pod::fieldpath::PodFacts;
use crate::pod::reasons::{self, Waiting};
use crate::pod::{self, Phase, RestartPolicy};
use crate::podsetup::sandbox::Sandbox;
use crate::probe::netns::PodTarget;
use crate::prober::{self, ProbeEvent, Probes};
use crate::status::{self, Killed, PersistedStatus, StatusManager};
use crate::tasks::{panic_message, POD_WORKER};
use crate::volumemanager::volumes::VolumeHost;

/// Where a pod is in its life on the node (kubelet's pod worker states, each with its sync
/// function: SyncPod, SyncTerminatingPod, SyncTerminatedPod).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// Wanted: converge what runs to the spec, again and again.
    Syncing,
    /// No longer wanted: stop the containers (preStop, grace period, sidecars last).
    Terminating,
    /// Nothing runs: remove containers, sandbox, network, volumes, cgroup and directories.
    Terminated,
}

#[derive(Debug)]
pub enum Msg {
    /// A new version of the pod (same UID).
    Update(Arc<Pod>),
    /// The pod is no longer wanted: terminate it and clean up.
    Terminate,
    /// Something changed (a container exited): sync now.
    Wake,
    /// A probe's result changed.
    Probe(ProbeEvent),
    /// Stop the pod for good and leave it Failed.
    Kill(super::KillPod),
}

/// The pod's runtime containers as this worker tracks them.
#[derive(Default)]
pub(super) struct Containers {
    /// Runtime ids of the pod's containers, every attempt still kept.
    pub known: BTreeSet<String>,
    /// Ids with a task waiting for their exit.
    pub watched: HashSet<String>,
    /// Termination messages by container id, read once when the container ended.
    pub messages: BTreeMap<String, String>,
    /// Ids whose unreadable records have been reported (once each).
    pub record_errors_reported: HashSet<String>,
}

/// What the pod has on the node besides its containers.
#[derive(Default)]
pub(super) struct Resources {
    pub sandbox: Option<Sandbox>,
    /// The pod has a sandbox record that cannot be read: its namespaces and network are unknown.
    pub sandbox_unreadable: bool,
    pub volumes: BTreeMap<String, VolumeHost>,
}

/// What the pod's status is made from besides the runtime's containers.
#[derive(Default)]
pub(super) struct Report {
    pub start_time: Option<DateTime<Utc>>,
    /// The status last published.
    pub last: Option<PodStatus>,
    /// Every init container is done (or every sidecar started).
    pub initialized: bool,
    /// Why a container waits, when the worker knows better than the default.
    pub waiting: BTreeMap<String, Waiting>,
    /// The pod was stopped for good ([`Msg::Kill`], the active deadline).
    pub killed: Option<Killed>,
    /// Kill requests waiting for the containers to have stopped.
    pub kill_done: Vec<tokio::sync::oneshot::Sender<()>>,
    /// The kill's own grace period, if it has one.
    pub kill_grace: Option<Duration>,
    /// The pod's network and volumes were released after the kill.
    pub released: bool,
}

pub(super) struct PodWorker {
    pub m: Arc<Managers>,
    pub uid: String,
    pub pod: Arc<Pod>,
    pub pod_dir: PathBuf,
    pub rx: mpsc::UnboundedReceiver<Msg>,
    pub tx: mpsc::UnboundedSender<Msg>,
    pub lifecycle: Lifecycle,
    pub containers: Containers,
    /// Crash-loop back-off by container name and spec hash.
    pub restarts: Backoff,
    pub resources: Resources,
    pub report: Report,
    pub probes: Probes,
    /// Delays between attempts to remove a terminated pod that did not fully go.
    pub teardown_retry: RetryDelay,
    /// What the next round is, for kubelet_pod_worker_duration_seconds: create (the first),
    /// update (the pod changed) or sync (a resync, a probe, a container's exit).
    pub round: &'static str,
    /// Containers of this round are still to be created: cgroup migrations kept warm.
    pub warm: Option<ferrolet_runtime::migration_warmer::WarmHold>,
}

/// Doubling delays from 1 s up to a minute.
#[derive(Default)]
pub(super) struct RetryDelay(u32);

impl RetryDelay {
    pub fn next_delay(&mut self) -> Duration {
        let d = Duration::from_secs(1 << self.0.min(6)).min(Duration::from_secs(60));
        self.0 += 1;
        d
    }
}

/// The first resync after a failure that needs a retry.
pub(super) const RETRY: Duration = Duration::from_secs(5);

impl PodWorker {
    /// Start the worker of `pod` in `lifecycle`, adopting `known` containers (found in the
    /// runtime at start) and the sandbox and status recorded in the pod's directory.
    pub fn spawn(
        m: Arc<Managers>,
        pod: Arc<Pod>,
        known: Vec<String>,
        lifecycle: Lifecycle,
    ) -> mpsc::UnboundedSender<Msg> {
        let (tx, rx) = mpsc::unbounded_channel();
        let uid = pod::uid(&pod).to_string();
        let pod_dir = m.pod_dir(&uid);
        let previous = StatusManager::load(&pod_dir);
        let (sandbox, sandbox_unreadable) = match crate::podsetup::sandbox::load(&pod_dir) {
            Ok(sb) => (sb, false),
            Err(e) => {
                warn!(pod = %pod::full_name(&pod), error = %ferrolet_fsutil::chain(&e), "the pod's sandbox record cannot be read");
                (None, true)
            }
        };
        let w = PodWorker {
            restarts: Backoff::new(
                m.cfg.initial_container_restart_period,
                m.cfg.max_container_restart_period,
            ),
            resources: Resources {
                sandbox,
                sandbox_unreadable,
                volumes: BTreeMap::new(),
            },
            report: Report {
                start_time: previous.as_ref().and_then(|p| p.start_time),
                killed: previous.as_ref().and_then(|p| Killed::from_status(&p.status)),
                last: previous.map(|p| p.status),
                ..Default::default()
            },
            containers: Containers {
                known: known.into_iter().collect(),
                ..Default::default()
            },
            m,
            uid,
            pod,
            pod_dir,
            rx,
            tx: tx.clone(),
            lifecycle,
            probes: Probes::default(),
            teardown_retry: RetryDelay::default(),
            round: "create",
            warm: None,
        };
        if let Some(seen) = pod::seen_at(&w.pod) {
            crate::metrics::global().pod_worker_started((Utc::now() - seen).to_std().unwrap_or_default());
        }
        tokio::spawn(w.run());
        tx
    }

    /// The worker's loop. It lives as long as the pod, mostly waiting: the rounds are boxed, so
    /// their (large) state exists only while one runs, not in every idle pod's task.
    async fn run(mut self) {
        // The status recorded before a reboot describes containers that are gone: the pod
        // table waits for this boot's first status instead.
        let shown = match &self.resources.sandbox {
            Some(sb) if sb.boot_id != ferrolet_fsutil::boot_id() => None,
            _ => self.report.last.clone(),
        };
        self.m.pods.upsert(&self.uid, self.pod.clone(), shown);
        if self.lifecycle != Lifecycle::Syncing {
            self.m.pods.set_terminating(&self.uid);
        }
        let duty = format!("{POD_WORKER}{}", pod::full_name(&self.pod));
        loop {
            self.m.liveness.busy(&duty, self.round_limit());
            match self.lifecycle {
                Lifecycle::Syncing => {
                    let started = std::time::Instant::now();
                    let wake = match std::panic::AssertUnwindSafe(Box::pin(self.sync_pod()))
                        .catch_unwind()
                        .await
                    {
                        Ok(wake) => wake,
                        Err(p) => {
                            error!(pod = %pod::full_name(&self.pod), "pod sync panicked: {}; retrying", panic_message(p));
                            Some(Utc::now() + chrono::Duration::from_std(RETRY).unwrap_or_default())
                        }
                    };
                    // Whatever the round created is created, a panicked round's included.
                    self.warm = None;
                    crate::metrics::global().pod_worker_round(self.round, started.elapsed());
                    if self.round != "sync" {
                        self.m.pods_settled.changed();
                    }
                    self.round = "sync";
                    self.m.liveness.done(&duty);
                    if !self.wait_for_work(wake).await {
                        return;
                    }
                }
                Lifecycle::Terminating => {
                    let started = std::time::Instant::now();
                    if let Err(p) = std::panic::AssertUnwindSafe(Box::pin(self.sync_terminating_pod()))
                        .catch_unwind()
                        .await
                    {
                        error!(pod = %pod::full_name(&self.pod), "stopping the pod panicked: {}; removing it", panic_message(p));
                    }
                    // Its last status: every container stopped.
                    let views = self.views().await;
                    Box::pin(self.publish_status(&views)).await;
                    crate::metrics::global().pod_worker_round("kill", started.elapsed());
                    self.m.pods_settled.changed();
                    self.lifecycle = Lifecycle::Terminated;
                }
                Lifecycle::Terminated => {
                    let removed = match std::panic::AssertUnwindSafe(Box::pin(self.sync_terminated_pod()))
                        .catch_unwind()
                        .await
                    {
                        Ok(removed) => removed,
                        Err(p) => {
                            error!(pod = %pod::full_name(&self.pod), "removing the pod panicked: {}", panic_message(p));
                            false
                        }
                    };
                    if removed {
                        self.m.status.pod_removed(&self.pod);
                        if let Some(mirrors) = &self.m.mirrors {
                            if pod::is_static(&self.pod) {
                                mirrors.forget(self.pod.clone());
                            }
                        }
                        self.m.liveness.done(&duty);
                        self.m.pods_settled.changed();
                        return;
                    }
                    // Not gone yet: the pod stays (terminating) and the removal is retried.
                    self.m.liveness.done(&duty);
                    let delay = self.teardown_retry.next_delay();
                    warn!(pod = %pod::full_name(&self.pod), retry_in = ?delay, "the pod is not fully removed; retrying");
                    if !self.sleep_ignoring_updates(delay).await {
                        return;
                    }
                }
            }
        }
    }

    /// How long one round may take before /healthz calls the worker stuck: every runtime call
    /// of the round within the runtime request timeout, and a termination within the grace
    /// period on top.
    pub(super) fn round_limit(&self) -> Duration {
        let timeout = self.m.cfg.runtime_request_timeout;
        let calls = pod::all_containers(&self.pod).count() as u32 + 2;
        let grace = match self.lifecycle {
            Lifecycle::Syncing => Duration::ZERO,
            _ => Duration::from_secs(pod::grace_period(&self.pod) as u64),
        };
        timeout.saturating_mul(calls).saturating_add(grace)
    }

    /// Sleep `d` while the pod is being removed: updates no longer matter, probe results are
    /// dropped. False when the channel is gone.
    async fn sleep_ignoring_updates(&mut self, d: Duration) -> bool {
        let until = crate::tasks::after(tokio::time::Instant::now(), d);
        loop {
            tokio::select! {
                m = self.rx.recv() => if m.is_none() { return false },
                _ = tokio::time::sleep_until(until) => return true,
            }
        }
    }

    /// Sleep until a message comes, `wake` passes, or the resync period is over. Applies every
    /// message queued meanwhile (they coalesce into one sync). False when the channel is gone.
    async fn wait_for_work(&mut self, wake: Option<DateTime<Utc>>) -> bool {
        let mut delay = self.m.cfg.sync_frequency;
        if let Some(w) = wake {
            let d = (w - Utc::now()).to_std().unwrap_or(Duration::ZERO) + Duration::from_millis(50);
            delay = delay.min(d);
        }
        tokio::select! {
            m = self.rx.recv() => match m {
                None => return false,
                Some(m) => self.handle(m),
            },
            _ = tokio::time::sleep(delay) => {}
        }
        while let Ok(m) = self.rx.try_recv() {
            self.handle(m);
        }
        true
    }

    pub(super) fn handle(&mut self, m: Msg) {
        match m {
            Msg::Update(p) => {
                self.pod = p;
                if self.round == "sync" {
                    self.round = "update";
                }
                self.m.pods.upsert(&self.uid, self.pod.clone(), None);
            }
            Msg::Terminate => {
                self.lifecycle = Lifecycle::Terminating;
                self.m.pods.set_terminating(&self.uid);
            }
            Msg::Wake => {}
            Msg::Kill(k) => {
                if self.report.killed.is_none() {
                    self.report.killed = Some(Killed {
                        reason: k.reason,
                        message: k.message,
                        disruption: k.disruption,
                    });
                    self.report.kill_grace = k.grace;
                }
                self.report.kill_done.extend(k.done);
            }
            Msg::Probe(ev) => {
                let reason = self.probe_kill_message(&ev);
                if !ev.success && ev.kind != prober::Kind::Readiness {
                    self.event(Some(&ev.container), reasons::EVENT_KILLING, &reason);
                }
                self.probes.apply(&ev, reason);
            }
        }
    }

    /// kubelet's words for a kill a liveness or startup probe causes.
    pub fn probe_kill_message(&self, ev: &ProbeEvent) -> String {
        let kind = ev.kind.name().to_ascii_lowercase();
        if pod::is_sidecar_name(&self.pod, &ev.container) {
            format!("Init container {} failed {kind} probe", ev.container)
        } else if pod::restart_policy(&self.pod) == RestartPolicy::Never {
            format!("Container {} failed {kind} probe", ev.container)
        } else {
            format!("Container {} failed {kind} probe, will be restarted", ev.container)
        }
    }

    /// An event about this pod (`container`: the one it concerns, if any), with kubelet's
    /// reason; its type follows from the reason.
    pub fn event(&self, container: Option<&str>, reason: &str, message: &str) {
        self.m.events.pod(
            &self.pod,
            container,
            crate::events::Kind::of_reason(reason),
            reason,
            message,
        );
    }

    /// Where the pod's ports are reached (probes, hooks).
    pub fn target(&self) -> PodTarget {
        PodTarget {
            ip: self.pod_ips().first().and_then(|ip| ip.parse().ok()),
            netns: self.resources.sandbox.as_ref().and_then(|s| s.net.clone()),
        }
    }

    /// The pod's IPs: the node's for hostNetwork pods.
    pub fn pod_ips(&self) -> Vec<String> {
        if pod::host_network(&self.pod) {
            return self.m.node.ip_strings();
        }
        self.sandbox_ips()
    }

    fn sandbox_ips(&self) -> Vec<String> {
        self.resources
            .sandbox
            .as_ref()
            .map(|s| s.pod_ips.clone())
            .unwrap_or_default()
    }

    /// What the downward API knows beyond the pod object.
    pub fn facts(&self) -> PodFacts {
        PodFacts {
            pod_ips: self.sandbox_ips(),
            host_ips: self.m.node.ip_strings(),
            node_cpu_milli: self.m.node.allocatable.cpu_milli,
            node_memory: self.m.node.allocatable.memory,
            node_ephemeral_storage: self.m.node.allocatable.ephemeral_storage,
        }
    }

    /// The runtime's containers of this pod, their records read on the blocking pool; ids the
    /// runtime no longer has are forgotten. A sync round reads them once, and again only after
    /// it started, stopped or removed one.
    pub async fn views(&mut self) -> PodContainers {
        let (rt, ids) = (
            self.m.rt.clone(),
            self.containers.known.iter().cloned().collect::<Vec<_>>(),
        );
        let read = tokio::task::spawn_blocking(move || {
            ids.into_iter()
                .map(|id| {
                    let r = rt.inspect(&id);
                    (id, r)
                })
                .collect::<Vec<_>>()
        })
        .await;
        // An empty list would read as "no containers" and start them again: a panic in the
        // read goes on to the round, which is retried.
        let read = match read {
            Ok(r) => r,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        let mut out = Vec::new();
        for (id, r) in read {
            match r {
                Ok(info) => {
                    if !info.record_errors.is_empty() && self.containers.record_errors_reported.insert(id.clone()) {
                        warn!(pod = %pod::full_name(&self.pod), container = %id, state = ?info.state, errors = ?info.record_errors, "container records unreadable; state taken from the kernel");
                    }
                    out.extend(ContainerView::from_info(&info));
                }
                Err(e) if e.is_not_found() => {
                    self.containers.known.remove(&id);
                }
                Err(e) => {
                    warn!(pod = %pod::full_name(&self.pod), container = %id, error = %ferrolet_fsutil::chain(&e), "reading container state")
                }
            }
        }
        PodContainers::new(out)
    }

    /// Wake the worker when container `id` exits.
    pub fn watch(&mut self, id: &str) {
        if !self.containers.watched.insert(id.to_string()) {
            return;
        }
        let (rt, tx, id) = (self.m.rt.clone(), self.tx.clone(), id.to_string());
        tokio::spawn(async move {
            let _ = rt.wait(&id).await;
            let _ = tx.send(Msg::Wake);
        });
    }

    /// Spec hash of every container, by name.
    pub fn hashes(&self) -> BTreeMap<String, String> {
        pod::all_containers(&self.pod)
            .map(|c| (c.name.clone(), labels::hash(c)))
            .collect()
    }

    /// Start and stop probe tasks to match the running containers; returns them.
    pub fn sync_probes(&mut self, views: &PodContainers) -> Vec<prober::Target> {
        let targets = self.probe_targets(views);
        let tx = self.tx.clone();
        let target = self.target();
        self.probes.sync(&self.m.rt, &self.pod, &target, &targets, move |ev| {
            let _ = tx.send(Msg::Probe(ev));
        });
        targets
    }

    /// Running app containers and sidecars, for the probes.
    pub fn probe_targets(&self, views: &PodContainers) -> Vec<prober::Target> {
        pod::containers(&self.pod)
            .iter()
            .chain(pod::init_containers(&self.pod).iter().filter(|c| pod::is_sidecar(c)))
            .filter_map(|c| {
                let v = views.latest(&c.name).filter(|v| v.is_running())?;
                Some(prober::Target {
                    name: c.name.clone(),
                    id: v.id.clone(),
                    started_at: v.started_at.unwrap_or(v.created_at),
                    spec: c.clone(),
                })
            })
            .collect()
    }

    /// Stop one container (preStop, signal, grace period of at least `floor`); runs beside the
    /// worker's loop.
    pub fn kill_one(
        &self,
        v: ContainerView,
        grace: Duration,
        floor: Duration,
    ) -> impl std::future::Future<Output = ()> + 'static {
        kill_container(
            self.m.rt.clone(),
            pod::container_spec(&self.pod, &v.name),
            self.target(),
            pod::full_name(&self.pod),
            v,
            grace,
            floor,
        )
    }

    /// Stop every container of the pod (its sandbox changed).
    pub async fn kill_all(&mut self, why: &str) {
        let views = self.views().await;
        let grace = Duration::from_secs(pod::grace_period(&self.pod) as u64);
        let stops = views
            .all()
            .filter(|v| v.is_active())
            .map(|v| {
                info!(pod = %pod::full_name(&self.pod), container = %v.name, "stopping: {why}");
                self.kill_one(v.clone(), grace, MIN_GRACE)
            })
            .collect::<Vec<_>>();
        futures::future::join_all(stops).await;
    }

    /// Read the termination message of each container that exited, once (the file may go with
    /// the container).
    pub fn record_termination_messages(&mut self, views: &PodContainers) {
        for v in views.all() {
            if v.exit().is_some() && !self.containers.messages.contains_key(&v.id) {
                let m = crate::kuberuntime::termination::termination_message(v);
                self.containers.messages.insert(v.id.clone(), m);
            }
        }
    }

    /// Compute the pod's status from what runs and publish it.
    pub async fn publish_status(&mut self, views: &PodContainers) {
        // A container may have exited since the sync began: its message goes out with its
        // terminated state, never in a later update.
        self.record_termination_messages(views);
        let targets = self.probe_targets(views);
        let readiness = self.probes.readiness(&targets);
        let startup_pending = self.probes.startup_pending(&targets);
        let pod_ips = self.pod_ips();
        let host_ips = self.m.node.ip_strings();
        let st = status::compute(&status::StatusInput {
            pod: &self.pod,
            containers: views,
            waiting: &self.report.waiting,
            readiness: &readiness,
            startup_pending: &startup_pending,
            messages: &self.containers.messages,
            sandbox_ready: self.resources.sandbox.is_some(),
            initialized: self.report.initialized,
            pod_ips: &pod_ips,
            host_ips: &host_ips,
            start_time: self.report.start_time,
            previous: self.report.last.as_ref(),
        });
        let st = match &self.report.killed {
            Some(k) => k.apply(st, self.report.last.as_ref()),
            None => st,
        };
        self.publish(st).await;
    }

    async fn publish(&mut self, st: PodStatus) {
        let changed = self.report.last.as_ref() != Some(&st);
        if changed {
            let phase_before = self.report.last.as_ref().and_then(|s| s.phase.clone());
            if phase_before != st.phase {
                info!(pod = %pod::full_name(&self.pod), phase = st.phase.as_deref().unwrap_or(""), "pod phase");
                // The first time the pod runs (kubelet observes it in SyncPod): a pod adopted
                // after a restart, already Running before, is not counted again.
                let running = Some(Phase::Running.as_str());
                if st.phase.as_deref() == running
                    && phase_before.as_deref().is_none_or(|p| p == Phase::Pending.as_str())
                {
                    if let Some(seen) = pod::seen_at(&self.pod) {
                        crate::metrics::global().pod_started((Utc::now() - seen).to_std().unwrap_or_default());
                    }
                }
            }
        }
        let rec = PersistedStatus {
            start_time: self.report.start_time,
            status: st.clone(),
        };
        if let Err(e) = self.m.status.set(&self.pod, &self.pod_dir, rec, changed).await {
            warn!(pod = %pod::full_name(&self.pod), error = %format!("{e:#}"), "saving status");
        }
        self.report.last = Some(st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removal_retries_double_from_a_second_to_a_minute() {
        let mut d = RetryDelay::default();
        let secs: Vec<u64> = (0..9).map(|_| d.next_delay().as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }
}
