//! One pod's worker: a task that owns everything the agent knows about the pod on this node. It
//! is the node's [`PodSyncer`]: its sync functions run the pod on the runtime, and
//! [`lifecycle::run`] walks it through kubelet's lifecycle ([`Lifecycle`]). Updates, container
//! exits, probe results and back-off expiries wake it; between wakes it resyncs every
//! syncFrequency.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::lifecycle::{self, Inbox, Lifecycle, Msg, PodSyncer, Round};
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
use crate::tasks::POD_WORKER;
use crate::volumemanager::volumes::VolumeHost;

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
    /// What the last successful setup steps were done for, so an idle resync skips what has
    /// nothing to do (docs/start-path.md, "A quiet agent").
    pub done: SetupDone,
}

/// The pod object (the very one: `Arc::ptr_eq`) each setup step last finished for.
#[derive(Default)]
pub(super) struct SetupDone {
    /// `pod.json` was written (or found equal) for this object.
    pub pod_json: Option<Arc<Pod>>,
    /// /etc/hosts, resolv.conf and hostname were written for this object and these pod IPs.
    pub managed_files: Option<(Arc<Pod>, Vec<String>)>,
}

impl SetupDone {
    pub fn pod_json_for(&self, pod: &Arc<Pod>) -> bool {
        self.pod_json.as_ref().is_some_and(|p| Arc::ptr_eq(p, pod))
    }

    pub fn managed_files_for(&self, pod: &Arc<Pod>, ips: &[String]) -> bool {
        self.managed_files
            .as_ref()
            .is_some_and(|(p, i)| Arc::ptr_eq(p, pod) && i == ips)
    }
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
    /// Its messages and where it is in its life.
    pub inbox: Inbox,
    pub containers: Containers,
    /// Crash-loop back-off by container name and spec hash.
    pub restarts: Backoff,
    pub resources: Resources,
    pub report: Report,
    pub probes: Probes,
    /// Containers of this round are still to be created: cgroup migrations kept warm.
    pub warm: Option<ferrolet_runtime::migration_warmer::WarmHold>,
}

impl PodWorker {
    /// Start the worker of `pod` in `lifecycle`, adopting `known` containers (found in the
    /// runtime at start) and the sandbox and status recorded in the pod's directory.
    pub fn spawn(
        m: Arc<Managers>,
        pod: Arc<Pod>,
        known: Vec<String>,
        lifecycle: Lifecycle,
    ) -> mpsc::UnboundedSender<Msg> {
        let (inbox, tx) = Inbox::new(lifecycle);
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
                done: SetupDone::default(),
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
            inbox,
            probes: Probes::default(),
            warm: None,
        };
        if let Some(seen) = pod::seen_at(&w.pod) {
            crate::metrics::global().pod_worker_started((Utc::now() - seen).to_std().unwrap_or_default());
        }
        tokio::spawn(lifecycle::run(w));
        tx
    }

    /// The worker's name among /healthz's duties.
    pub(super) fn duty(&self) -> String {
        format!("{POD_WORKER}{}", pod::full_name(&self.pod))
    }

    /// How long one round may take before /healthz calls the worker stuck: every runtime call
    /// of the round within the runtime request timeout, and a termination within the grace
    /// period on top.
    pub(super) fn round_limit(&self) -> Duration {
        let timeout = self.m.cfg.runtime_request_timeout;
        let calls = pod::all_containers(&self.pod).count() as u32 + 2;
        let grace = match self.inbox.lifecycle {
            Lifecycle::Syncing => Duration::ZERO,
            _ => Duration::from_secs(pod::grace_period(&self.pod) as u64),
        };
        timeout.saturating_mul(calls).saturating_add(grace)
    }

    /// Take a message that came while a round waits on something long.
    pub(super) fn take(&mut self, m: Msg) {
        self.inbox.note(&m);
        self.apply(m);
    }

    /// Apply one message; its part in the lifecycle is [`Inbox::note`]'s.
    fn apply(&mut self, m: Msg) {
        match m {
            Msg::Update(p) => {
                self.pod = p;
                self.m.pods.upsert(&self.uid, self.pod.clone(), None);
            }
            Msg::Terminate => {
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

    /// The runtime's containers of this pod, their records read on the blocking pool unless
    /// every state is known and unchanged; ids the runtime no longer has are forgotten. A sync round reads them once, and again only after
    /// it started, stopped or removed one.
    pub async fn views(&mut self) -> PodContainers {
        let (rt, ids) = (
            self.m.rt.clone(),
            self.containers.known.iter().cloned().collect::<Vec<_>>(),
        );
        // Containers whose state is known and unchanged (an idle resync's) are answered in
        // place; any other is read on the blocking pool, with the rest.
        let cached: Option<Vec<_>> = ids
            .iter()
            .map(|id| rt.inspect_cached(id).map(|i| (id.clone(), Ok(i))))
            .collect();
        let read = match cached {
            Some(read) => Ok(read),
            None => {
                ferrolet_fsutil::spawn_blocking(move || {
                    ids.into_iter()
                        .map(|id| {
                            let r = rt.inspect(&id);
                            (id, r)
                        })
                        .collect::<Vec<_>>()
                })
                .await
            }
        };
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
        let (rt, tx, id) = (self.m.rt.clone(), self.inbox.tx.clone(), id.to_string());
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
        let tx = self.inbox.tx.clone();
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
        // A pod that finished (Succeeded or Failed: nothing of it starts again) holds no
        // devices, as kubelet's UpdateAllocatedDevices counts only active pods. Freed before
        // the phase is recorded, where admission reads it: a pod admitted because this one
        // finished finds its devices free.
        if Phase::of(&st).is_some_and(Phase::is_terminal) {
            self.m.devices.free_pod(&self.uid, "the pod finished");
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

impl PodSyncer for PodWorker {
    fn inbox(&mut self) -> &mut Inbox {
        &mut self.inbox
    }

    fn name(&self) -> String {
        pod::full_name(&self.pod)
    }

    fn sync_frequency(&self) -> Duration {
        self.m.cfg.sync_frequency
    }

    fn handle(&mut self, m: Msg) {
        self.apply(m);
    }

    fn begin(&mut self) {
        // The status recorded before a reboot describes containers that are gone: the pod
        // table waits for this boot's first status instead.
        let shown = match &self.resources.sandbox {
            Some(sb) if sb.boot_id != ferrolet_fsutil::boot_id() => None,
            _ => self.report.last.clone(),
        };
        self.m.pods.upsert(&self.uid, self.pod.clone(), shown);
        if self.inbox.lifecycle != Lifecycle::Syncing {
            self.m.pods.set_terminating(&self.uid);
        }
    }

    fn sync_pod(&mut self) -> impl std::future::Future<Output = Option<DateTime<Utc>>> + Send {
        PodWorker::sync_pod(self)
    }

    fn sync_terminating_pod(&mut self) -> impl std::future::Future<Output = ()> + Send {
        PodWorker::sync_terminating_pod(self)
    }

    async fn publish_stopped(&mut self) {
        // Its last status: every container stopped.
        let views = self.views().await;
        self.publish_status(&views).await;
    }

    fn sync_terminated_pod(&mut self) -> impl std::future::Future<Output = bool> + Send {
        PodWorker::sync_terminated_pod(self)
    }

    fn round_begins(&mut self) {
        self.m.liveness.busy(&self.duty(), self.round_limit());
    }

    fn round_ended(&mut self, round: Round, took: Duration) {
        // Whatever the round created is created, a panicked round's included.
        self.warm = None;
        if round != Round::Remove {
            crate::metrics::global().pod_worker_round(round.as_str(), took);
        }
        if round != Round::Sync {
            self.m.pods_settled.changed();
        }
        self.m.liveness.done(&self.duty());
    }

    fn removed(&mut self) {
        self.m.status.pod_removed(&self.pod);
        if let Some(mirrors) = &self.m.mirrors {
            if pod::is_static(&self.pod) {
                mirrors.forget(self.pod.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memo holds for the very pod object it was made for and, for the managed files, the
    /// same IPs: an equal but new object (an update from the source) or new IPs redo the step.
    #[test]
    fn setup_done_holds_for_the_same_object_and_ips_only() {
        let pod = Arc::new(Pod::default());
        let mut done = SetupDone::default();
        assert!(!done.pod_json_for(&pod) && !done.managed_files_for(&pod, &[]));
        done.pod_json = Some(pod.clone());
        done.managed_files = Some((pod.clone(), vec!["10.0.0.2".into()]));
        assert!(done.pod_json_for(&pod));
        assert!(done.managed_files_for(&pod, &["10.0.0.2".into()]));
        assert!(!done.managed_files_for(&pod, &["10.0.0.3".into()]), "new IPs");
        let equal = Arc::new((*pod).clone());
        assert!(!done.pod_json_for(&equal), "a new object, even an equal one");
        assert!(!done.managed_files_for(&equal, &["10.0.0.2".into()]));
    }
}
