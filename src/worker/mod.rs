//! Pod workers (kubelet's pod_workers.go and its SyncPod family): one task per pod UID, to which
//! every change of that pod goes in order. [`PodWorkers`] takes the operations of the pod
//! config, admits new pods, starts, updates and terminates workers, holds back a pod while
//! another of the same name (or the same UID) is still terminating, and cleans up pods the
//! node still has but no source wants ([`cleanup`]). Each worker ([`pod_worker`]) walks its
//! pod through kubelet's lifecycle: syncing ([`sync`]), terminating, terminated
//! ([`terminate`]); [`plan`] decides what a sync does, [`crate::backoff`] when a crashed
//! container may run again.

pub mod cleanup;
mod killed;
pub mod plan;
mod pod_worker;
mod sync;
mod terminate;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use ferrolet_runtime::Runtime;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::config::Config;
use crate::images::ImageManager;
use crate::node::NodeInfo;
use crate::pod::manager::PodManager;
use crate::pod::{self, Phase};
use crate::podconfig::admission::{self, Rejection};
use crate::podconfig::PodOp;
use crate::podsetup::PodSetup;
use crate::status::StatusManager;
use crate::tasks::Liveness;
use pod_worker::{Lifecycle, Msg, PodWorker};

/// The node-wide managers every pod worker uses (kubelet keeps them on its Kubelet struct).
pub struct Managers {
    pub cfg: Arc<Config>,
    pub rt: Arc<Runtime>,
    pub node: NodeInfo,
    pub pods: Arc<PodManager>,
    pub status: StatusManager,
    pub setup: PodSetup,
    pub images: ImageManager,
    /// Each worker's rounds, for /healthz.
    pub liveness: Arc<Liveness>,
    pub events: crate::events::Recorder,
    /// In a cluster: the static pods' mirror pods.
    pub mirrors: Option<crate::mirror::MirrorQueue>,
    /// In a cluster: the Node as registered.
    pub node_api: Option<crate::node::cluster::NodeHandle>,
    /// The eviction manager's conditions, for its admit handler.
    pub eviction: crate::eviction::Eviction,
    /// Told when a pod started, changed, stopped or went: the agent gives back the memory a
    /// burst of them used once they settle.
    pub pods_settled: crate::tasks::AfterQuiet,
    /// The sysctls pods may set (the safe set and allowedUnsafeSysctls), for the sysctl admit
    /// handler.
    pub sysctls: crate::pod::sysctl::Allowlist,
}

impl Managers {
    /// The Node pods are admitted against: as registered, or as it would be registered (its
    /// labels and taints from the configuration) on a standalone node or before registration.
    pub fn node_object(&self) -> k8s_openapi::api::core::v1::Node {
        self.node_api
            .as_ref()
            .and_then(|n| n.node())
            .unwrap_or_else(|| crate::node::register::initial_node(&self.cfg))
    }

    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.cfg.pods_dir().join(uid)
    }
}

/// Stop a pod for good and leave it Failed on the node (kubelet's killPodNow with a status
/// function, as the eviction manager and the active deadline use it): its containers stop
/// within `grace` (the pod's own grace period when `None`), nothing restarts, its network and
/// volumes are released, and its status reports phase Failed with `reason` and `message` until
/// its source removes it. The containers stay, so their logs can still be read.
#[derive(Debug)]
pub struct KillPod {
    pub reason: String,
    pub message: String,
    pub grace: Option<std::time::Duration>,
    /// Add the DisruptionTarget condition (reason TerminationByKubelet), as kubelet does for
    /// evictions.
    pub disruption: bool,
    /// Fired once the containers have stopped (dropped unfired when the pod has no worker).
    pub done: Option<tokio::sync::oneshot::Sender<()>>,
}

/// What the node has for one pod UID.
enum Slot {
    /// A worker runs the pod (or tears it down).
    Worker {
        tx: mpsc::UnboundedSender<Msg>,
        pod: Arc<Pod>,
        terminating: bool,
    },
    /// Nothing runs for the pod: admission refused it (it has a Failed status), or the API
    /// server had it finished (Succeeded or Failed) before this agent saw it. Containers an
    /// earlier run left for it stay until the pod is removed.
    Inert { pod: Arc<Pod> },
}

impl Slot {
    fn pod(&self) -> &Arc<Pod> {
        match self {
            Slot::Worker { pod, .. } | Slot::Inert { pod } => pod,
        }
    }

    fn terminating(&self) -> bool {
        matches!(self, Slot::Worker { terminating: true, .. })
    }
}

pub struct PodWorkers {
    m: Arc<Managers>,
    slots: HashMap<String, Slot>,
    /// Pods to start once the pod before them (same UID or same namespace/name) has finished
    /// terminating, in arrival order: kubelet never runs two static pods of one name at once.
    pending: Vec<Arc<Pod>>,
    /// A worker's UID is sent here when it has finished (its pod is gone from the node).
    done: mpsc::UnboundedSender<String>,
    /// Containers found in the runtime at start, by pod UID, until their pod claims them.
    adoptable: HashMap<String, Vec<String>>,
    /// Orphans are collected only once every source has reported.
    orphans_cleaned: bool,
}

impl PodWorkers {
    /// `adoptable`: the runtime's containers from an earlier run, by pod UID. Finished workers'
    /// UIDs go to `done`; pass them back to [`finished`](Self::finished).
    pub fn new(
        m: Arc<Managers>,
        adoptable: HashMap<String, Vec<String>>,
        done: mpsc::UnboundedSender<String>,
    ) -> PodWorkers {
        PodWorkers {
            m,
            slots: HashMap::new(),
            pending: Vec::new(),
            done,
            adoptable,
            orphans_cleaned: false,
        }
    }

    /// Apply one operation of the pod config.
    pub fn handle(&mut self, op: PodOp) {
        match op {
            PodOp::Add(p) => self.add(p),
            PodOp::Update(p) => self.update(p),
            PodOp::Remove(p) => self.remove(pod::uid(&p)),
            PodOp::Reconcile(p) => self.reconcile(p),
        }
    }

    /// kubelet's HandlePodAdditions: admit and start, unless an earlier pod of this UID or name
    /// is still terminating.
    fn add(&mut self, p: Arc<Pod>) {
        match self.slots.get(pod::uid(&p)) {
            Some(Slot::Worker { terminating: false, .. }) => return self.update(p),
            Some(Slot::Inert { .. }) => return,
            _ => {}
        }
        if self.blocked(&p) {
            info!(pod = %pod::full_name(&p), "waiting for the previous pod of this name to terminate");
            self.pending.push(p);
            return;
        }
        let uid = pod::uid(&p).to_string();
        let api_phase = p.status.as_ref().and_then(Phase::of).filter(|_| !pod::is_static(&p));
        if api_phase.is_some_and(Phase::is_terminal) {
            // kubelet never runs a pod again that has finished: an agent restarted after the
            // node lost the pod's containers (a reboot) must not run it a second time.
            info!(pod = %pod::full_name(&p), "ADD of a pod that has finished: nothing runs");
            self.m.pods.upsert(&uid, p.clone(), p.status.clone());
            self.slots.insert(uid, Slot::Inert { pod: p });
            return;
        }
        if pod::deletion_requested(&p) {
            // Being deleted already (the agent restarted meanwhile): nothing starts, whatever
            // runs of it stops within its grace period.
            info!(pod = %pod::full_name(&p), "ADD of a pod being deleted: terminating it");
            let known = self.adoptable.remove(&uid).unwrap_or_default();
            self.spawn(p, known, Lifecycle::Terminating);
            return;
        }
        // kubelet's eviction admit handler comes first.
        let admitted = self
            .m
            .eviction
            .admit(&p)
            .and_then(|()| admission::sysctls(&p, &self.m.sysctls))
            .and_then(|()| admission::admit(&p, &self.active_pods(), &self.m.node, &self.m.node_object()));
        match admitted {
            Ok(()) => {
                info!(pod = %pod::full_name(&p), "ADD");
                crate::metrics::start_phase(pod::name(&p), "admitted");
                let known = self.adoptable.remove(&uid).unwrap_or_default();
                self.spawn(p, known, Lifecycle::Syncing);
            }
            Err(r) => self.reject(uid, p, r),
        }
    }

    fn reject(&mut self, uid: String, p: Arc<Pod>, r: Rejection) {
        warn!(pod = %pod::full_name(&p), reason = %r.reason, "pod rejected: {}", r.message);
        self.m
            .events
            .pod(&p, None, crate::events::Kind::Warning, &r.reason, &r.message);
        let st = crate::status::rejected(&p, &r.reason, &r.status_message(), &self.m.node.ip_strings());
        self.m.status.set_refused(&p, st);
        self.slots.insert(uid, Slot::Inert { pod: p });
    }

    /// Whether `p` must wait: its UID, or another pod of its namespace/name, is terminating.
    fn blocked(&self, p: &Pod) -> bool {
        self.slots.get(pod::uid(p)).is_some_and(Slot::terminating)
            || self.slots.values().any(|s| {
                s.terminating() && pod::name(s.pod()) == pod::name(p) && pod::namespace(s.pod()) == pod::namespace(p)
            })
    }

    fn update(&mut self, p: Arc<Pod>) {
        let uid = pod::uid(&p).to_string();
        if let Some(q) = self.pending.iter_mut().find(|q| pod::uid(q) == uid) {
            *q = p;
            return;
        }
        // A refused pod stays refused; a terminating one is replaced by its pending ADD.
        if let Some(Slot::Worker {
            tx,
            pod,
            terminating: false,
        }) = self.slots.get_mut(&uid)
        {
            info!(pod = %pod::full_name(&p), "UPDATE");
            *pod = p.clone();
            let deleted = pod::deletion_requested(&p);
            let _ = tx.send(Msg::Update(p));
            if deleted {
                // kubelet's graceful deletion: stop within the deletion's grace period; the
                // status manager deletes the object once the node is done with it.
                if let Some(Slot::Worker { tx, terminating, pod }) = self.slots.get_mut(&uid) {
                    info!(pod = %pod::full_name(pod), "DELETE requested: terminating the pod");
                    *terminating = true;
                    let _ = tx.send(Msg::Terminate);
                }
            }
        }
    }

    /// kubelet's HandlePodRemoves: the pod's worker terminates it and cleans up.
    fn remove(&mut self, uid: &str) {
        self.pending.retain(|q| pod::uid(q) != uid);
        match self.slots.get_mut(uid) {
            Some(Slot::Worker { tx, pod, terminating }) if !*terminating => {
                info!(pod = %pod::full_name(pod), "REMOVE: no source wants the pod any more");
                *terminating = true;
                let _ = tx.send(Msg::Terminate);
            }
            Some(Slot::Inert { pod }) => {
                info!(pod = %pod::full_name(pod), "REMOVE: the refused pod is gone");
                let p = (**pod).clone();
                self.m.pods.remove(uid);
                self.slots.remove(uid);
                // Containers an earlier run left for it are still to be stopped.
                if self.adoptable.contains_key(uid) {
                    self.terminate_orphan(uid.to_string(), Some(p));
                }
            }
            _ => {}
        }
    }

    /// Kill the pod `uid` and leave it Failed ([`KillPod`]). A pod that is terminating
    /// already, or has no worker, is left as it is.
    pub fn kill(&mut self, uid: &str, k: KillPod) {
        match self.slots.get(uid) {
            Some(Slot::Worker {
                tx,
                pod,
                terminating: false,
            }) => {
                info!(pod = %pod::full_name(pod), reason = %k.reason, "KILL: {}", k.message);
                let _ = tx.send(Msg::Kill(k));
            }
            _ => info!(uid, reason = %k.reason, "KILL of a pod that is not running here; nothing to do"),
        }
    }

    /// Run the static pod `uid`, evicted for the node's pressure, again from the start: its worker ends it as a REMOVE
    /// would (containers, sandbox, volumes and its recorded status go), and the same pod is
    /// ADDed again, admitted anew, once it is gone. A pod that is not a static pod evicted
    /// here, or is terminating already, is left as it is.
    pub fn rerun(&mut self, uid: &str) {
        let Some(Slot::Worker { tx, pod, terminating }) = self.slots.get_mut(uid) else {
            return;
        };
        if *terminating {
            return;
        }
        let evicted = self
            .m
            .pods
            .get(uid)
            .is_some_and(|e| crate::eviction::evicted_for_pressure(&e.status));
        if !pod::is_static(pod) || !evicted {
            return;
        }
        *terminating = true;
        let _ = tx.send(Msg::Terminate);
        let p = pod.clone();
        self.m.events.pod(
            &p,
            None,
            crate::events::Kind::Normal,
            crate::pod::reasons::EVENT_RERUN_AFTER_EVICTION,
            "The node is no longer under pressure: the evicted static pod runs again",
        );
        self.pending.push(p);
    }

    /// kubelet's HandlePodReconcile: the stored object is refreshed; nothing runs differently.
    fn reconcile(&mut self, p: Arc<Pod>) {
        let uid = pod::uid(&p).to_string();
        if let Some(Slot::Worker { pod, .. } | Slot::Inert { pod }) = self.slots.get_mut(&uid) {
            // kubelet's NeedToReconcilePodReadiness: a readiness gate's condition changed, so
            // the worker computes the Ready condition anew.
            let gates_changed = crate::status::gate_conditions(pod) != crate::status::gate_conditions(&p);
            *pod = p.clone();
            self.m.pods.set_pod(&uid, p.clone());
            if let (
                true,
                Some(Slot::Worker {
                    tx, terminating: false, ..
                }),
            ) = (gates_changed, self.slots.get(&uid))
            {
                let _ = tx.send(Msg::Update(p));
            }
        }
    }

    /// A worker has finished: its pod is gone from the node. Pods waiting for it start.
    pub fn finished(&mut self, uid: &str) {
        if matches!(self.slots.get(uid), Some(Slot::Worker { .. })) {
            self.slots.remove(uid);
        }
        for p in std::mem::take(&mut self.pending) {
            self.add(p);
        }
    }

    /// Admitted pods that are not terminating and have not finished (what admission counts).
    fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.slots
            .iter()
            .filter_map(|(uid, s)| match s {
                Slot::Worker {
                    pod,
                    terminating: false,
                    ..
                } => Some((uid, pod)),
                _ => None,
            })
            .filter(|(uid, _)| !self.m.pods.phase(uid).is_some_and(Phase::is_terminal))
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// Start a worker for `p` in `lifecycle`, adopting the runtime containers `known`.
    fn spawn(&mut self, p: Arc<Pod>, known: Vec<String>, lifecycle: Lifecycle) {
        let uid = pod::uid(&p).to_string();
        let terminating = lifecycle != Lifecycle::Syncing;
        let tx = PodWorker::spawn(self.m.clone(), p.clone(), known, lifecycle);
        // The worker is done when its end of the channel is gone.
        let (watch, done, u) = (tx.clone(), self.done.clone(), uid.clone());
        tokio::spawn(async move {
            watch.closed().await;
            let _ = done.send(u);
        });
        self.slots.insert(
            uid,
            Slot::Worker {
                tx,
                pod: p,
                terminating,
            },
        );
    }
}
