//! Pod workers (kubelet's pod_workers.go and its SyncPod family): one task per pod UID, to which
//! every change of that pod goes in order. [`PodWorkers`] takes the operations of the pod
//! config, admits new pods, starts, updates and terminates workers, holds back a pod while
//! another of the same name (or the same UID) is still terminating, and cleans up pods the
//! node still has but no source wants ([`cleanup`]). Each worker ([`lifecycle`], over the
//! node's syncer [`pod_worker`]) walks its pod through kubelet's lifecycle: syncing
//! ([`sync`]), terminating, terminated ([`terminate`]); [`plan`] decides what a sync does, [`crate::backoff`] when a crashed
//! container may run again.

pub mod cleanup;
mod killed;
mod lifecycle;
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
pub use lifecycle::{Lifecycle, Msg};
use pod_worker::PodWorker;

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
    /// Whether the node is shutting down, for the node shutdown admit handler.
    pub shutdown: crate::lifecycle::admit::NodeShutdown,
    /// The device plugins: their devices are what pods asking for extended resources are
    /// admitted against.
    pub devices: crate::cm::devicemanager::DeviceManager,
    /// Told when a pod started, changed, stopped or went: the agent gives back the memory a
    /// burst of them used once they settle.
    pub pods_settled: crate::tasks::AfterQuiet,
    /// The sysctls pods may set (the safe set and allowedUnsafeSysctls), for the sysctl admit
    /// handler.
    pub sysctls: crate::pod::sysctl::Allowlist,
}

impl Managers {
    /// The Node pods are admitted against: as the API server has it, or as last seen while
    /// the server has been away since the start, or as it would be registered (its labels and
    /// taints from the configuration) on a standalone node or before the first registration.
    pub fn node_object(&self) -> k8s_openapi::api::core::v1::Node {
        self.node_api
            .as_ref()
            .and_then(|n| n.node_or_last_seen())
            .unwrap_or_else(|| crate::node::register::initial_node(&self.cfg))
    }

    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.cfg.pods_dir().join(uid)
    }
}

/// What the pod workers need of the node (kubelet's podWorkers is given its sync functions,
/// and the Kubelet's managers answer admission): the pod table, the admit handlers, a refused
/// pod's event and status, events, and the start of one pod's worker. [`Managers`] is the
/// node's; the tests below put a recording one in, so the routing of pod operations is tested
/// without a kernel.
pub trait WorkerHost: Send + Sync + 'static {
    fn pods(&self) -> &PodManager;
    /// kubelet's admit handlers in order (eviction, sysctls, resources and predicates, node
    /// shutdown), with the pods admitted and still active.
    fn admit(&self, p: &Pod, active: &[Arc<Pod>]) -> Result<(), Rejection>;
    /// A refused pod: its Warning event and its Failed status.
    fn refused(&self, p: &Arc<Pod>, r: &Rejection);
    /// A Normal event about `p`.
    fn event(&self, p: &Pod, reason: &str, message: &str);
    /// Start the worker of `p` in `lifecycle`, adopting `known` containers; the worker ends
    /// when it drops its receiver.
    fn start_worker(
        self: &Arc<Self>,
        p: Arc<Pod>,
        known: Vec<String>,
        lifecycle: Lifecycle,
    ) -> mpsc::UnboundedSender<Msg>;
}

impl WorkerHost for Managers {
    fn pods(&self) -> &PodManager {
        &self.pods
    }

    fn admit(&self, p: &Pod, active: &[Arc<Pod>]) -> Result<(), Rejection> {
        // kubelet's eviction admit handler comes first.
        self.eviction
            .admit(p)
            .and_then(|()| admission::sysctls(p, &self.sysctls))
            .and_then(|()| {
                let devices = admission::Devices {
                    extended: self.devices.extended(),
                    held: self.devices.held_by(p),
                };
                admission::admit(p, active, &self.node, &self.node_object(), &devices)
            })
            .and_then(|()| self.shutdown.admit())
    }

    fn refused(&self, p: &Arc<Pod>, r: &Rejection) {
        self.events
            .pod(p, None, crate::events::Kind::Warning, &r.reason, &r.message);
        let st = crate::status::rejected(p, &r.reason, &r.status_message(), &self.node.ip_strings());
        self.status.set_refused(p, st);
    }

    fn event(&self, p: &Pod, reason: &str, message: &str) {
        self.events.pod(p, None, crate::events::Kind::Normal, reason, message);
    }

    fn start_worker(
        self: &Arc<Self>,
        p: Arc<Pod>,
        known: Vec<String>,
        lifecycle: Lifecycle,
    ) -> mpsc::UnboundedSender<Msg> {
        PodWorker::spawn(self.clone(), p, known, lifecycle)
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

pub struct PodWorkers<H: WorkerHost = Managers> {
    m: Arc<H>,
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

impl<H: WorkerHost> PodWorkers<H> {
    /// `adoptable`: the runtime's containers from an earlier run, by pod UID. Finished workers'
    /// UIDs go to `done`; pass them back to [`finished`](Self::finished).
    pub fn new(
        m: Arc<H>,
        adoptable: HashMap<String, Vec<String>>,
        done: mpsc::UnboundedSender<String>,
    ) -> PodWorkers<H> {
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
            self.m.pods().upsert(&uid, p.clone(), p.status.clone());
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
        let admitted = self.m.admit(&p, &self.active_pods());
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
        self.m.refused(&p, &r);
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
                self.m.pods().remove(uid);
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
            .pods()
            .get(uid)
            .is_some_and(|e| crate::eviction::evicted_for_pressure(&e.status));
        if !pod::is_static(pod) || !evicted {
            return;
        }
        *terminating = true;
        let _ = tx.send(Msg::Terminate);
        let p = pod.clone();
        self.m.event(
            &p,
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
            self.m.pods().set_pod(&uid, p.clone());
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
            .filter(|(uid, _)| !self.m.pods().phase(uid).is_some_and(Phase::is_terminal))
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// Start a worker for `p` in `lifecycle`, adopting the runtime containers `known`.
    fn spawn(&mut self, p: Arc<Pod>, known: Vec<String>, lifecycle: Lifecycle) {
        let uid = pod::uid(&p).to_string();
        let terminating = lifecycle != Lifecycle::Syncing;
        let tx = self.m.start_worker(p.clone(), known, lifecycle);
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

#[cfg(test)]
mod tests {
    //! The routing of pod operations (kubelet's pod_workers_test, with fake sync functions):
    //! a recording host stands in for the node, each "worker" is the receiving end of its
    //! channel, and a worker ends when the test drops that end.
    use std::collections::HashSet;
    use std::sync::Mutex;

    use super::*;

    struct Started {
        uid: String,
        lifecycle: Lifecycle,
        known: Vec<String>,
        pod: Arc<Pod>,
        rx: mpsc::UnboundedReceiver<Msg>,
    }

    #[derive(Default)]
    struct Fake {
        pods: PodManager,
        /// Pod names admission refuses.
        refuse: Mutex<HashSet<String>>,
        refused: Mutex<Vec<(String, String)>>,
        events: Mutex<Vec<String>>,
        /// The active pods' names each admission saw.
        admitted_against: Mutex<Vec<Vec<String>>>,
        started: Mutex<Vec<Started>>,
    }

    impl WorkerHost for Fake {
        fn pods(&self) -> &PodManager {
            &self.pods
        }

        fn admit(&self, p: &Pod, active: &[Arc<Pod>]) -> Result<(), Rejection> {
            let mut names: Vec<String> = active.iter().map(|a| pod::name(a).to_string()).collect();
            names.sort();
            self.admitted_against.lock().unwrap().push(names);
            if self.refuse.lock().unwrap().contains(pod::name(p)) {
                return Err(Rejection {
                    reason: "OutOfcpu".into(),
                    message: "Node didn't have enough resource: cpu".into(),
                });
            }
            Ok(())
        }

        fn refused(&self, p: &Arc<Pod>, r: &Rejection) {
            self.refused
                .lock()
                .unwrap()
                .push((pod::name(p).to_string(), r.reason.clone()));
            self.pods.upsert(pod::uid(p), p.clone(), None);
        }

        fn event(&self, _p: &Pod, reason: &str, _message: &str) {
            self.events.lock().unwrap().push(reason.to_string());
        }

        fn start_worker(
            self: &Arc<Self>,
            p: Arc<Pod>,
            known: Vec<String>,
            lifecycle: Lifecycle,
        ) -> mpsc::UnboundedSender<Msg> {
            let (tx, rx) = mpsc::unbounded_channel();
            self.pods.upsert(pod::uid(&p), p.clone(), None);
            self.started.lock().unwrap().push(Started {
                uid: pod::uid(&p).to_string(),
                lifecycle,
                known,
                pod: p,
                rx,
            });
            tx
        }
    }

    fn pod_of(v: serde_json::Value) -> Arc<Pod> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn pod(name: &str, uid: &str) -> Arc<Pod> {
        pod_of(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}))
    }

    fn workers(adoptable: HashMap<String, Vec<String>>) -> (Arc<Fake>, PodWorkers<Fake>) {
        let fake = Arc::new(Fake::default());
        let (done, _) = mpsc::unbounded_channel();
        (fake.clone(), PodWorkers::new(fake, adoptable, done))
    }

    /// The worker started for `uid` (the latest), taken out of the fake.
    fn take(fake: &Fake, uid: &str) -> Started {
        let mut started = fake.started.lock().unwrap();
        let i = started
            .iter()
            .rposition(|s| s.uid == uid)
            .expect("a worker was started");
        started.remove(i)
    }

    fn started_uids(fake: &Fake) -> Vec<String> {
        fake.started.lock().unwrap().iter().map(|s| s.uid.clone()).collect()
    }

    /// What a worker was sent so far, in order.
    fn sent(w: &mut Started) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(m) = w.rx.try_recv() {
            out.push(match m {
                Msg::Update(p) => format!("update:{}", p.metadata.resource_version.clone().unwrap_or_default()),
                Msg::Terminate => "terminate".into(),
                Msg::Wake => "wake".into(),
                Msg::Probe(_) => "probe".into(),
                Msg::Kill(k) => format!("kill:{}", k.reason),
            });
        }
        out
    }

    fn versioned(p: &Arc<Pod>, rv: &str) -> Arc<Pod> {
        let mut q = (**p).clone();
        q.metadata.resource_version = Some(rv.into());
        Arc::new(q)
    }

    fn deleted(p: &Arc<Pod>, rv: &str) -> Arc<Pod> {
        let mut q = (*versioned(p, rv)).clone();
        q.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        Arc::new(q)
    }

    fn kill(reason: &str) -> KillPod {
        KillPod {
            reason: reason.into(),
            message: "m".into(),
            grace: None,
            disruption: false,
            done: None,
        }
    }

    #[tokio::test]
    async fn an_admitted_pod_gets_a_syncing_worker_and_a_refused_one_a_status_only() {
        let (fake, mut w) = workers(HashMap::new());
        fake.refuse.lock().unwrap().insert("big".into());
        w.handle(PodOp::Add(pod("a", "u1")));
        w.handle(PodOp::Add(pod("big", "u2")));
        assert_eq!(started_uids(&fake), ["u1"]);
        assert_eq!(take(&fake, "u1").lifecycle, Lifecycle::Syncing);
        assert_eq!(
            *fake.refused.lock().unwrap(),
            [("big".to_string(), "OutOfcpu".to_string())]
        );
        // a refused pod stays refused: an update starts nothing, its removal forgets it
        w.handle(PodOp::Update(versioned(&pod("big", "u2"), "2")));
        w.handle(PodOp::Add(pod("big", "u2")));
        assert!(started_uids(&fake).is_empty());
        assert!(fake.pods.get("u2").is_some());
        w.handle(PodOp::Remove(pod("big", "u2")));
        assert!(fake.pods.get("u2").is_none());
    }

    #[tokio::test]
    async fn updates_go_to_the_worker_and_a_requested_deletion_terminates_it() {
        let (fake, mut w) = workers(HashMap::new());
        let a = pod("a", "u1");
        w.handle(PodOp::Add(a.clone()));
        let mut worker = take(&fake, "u1");
        w.handle(PodOp::Update(versioned(&a, "2")));
        // an ADD of a pod that runs already is an update
        w.handle(PodOp::Add(versioned(&a, "3")));
        w.handle(PodOp::Update(deleted(&a, "4")));
        assert_eq!(sent(&mut worker), ["update:2", "update:3", "update:4", "terminate"]);
        // terminating: neither updates nor a removal reach it again
        w.handle(PodOp::Update(versioned(&a, "5")));
        w.handle(PodOp::Remove(a.clone()));
        assert!(sent(&mut worker).is_empty());
    }

    #[tokio::test]
    async fn a_pod_of_the_same_name_waits_until_the_terminating_one_has_finished() {
        let (fake, mut w) = workers(HashMap::new());
        w.handle(PodOp::Add(pod("web", "old")));
        let mut old = take(&fake, "old");
        w.handle(PodOp::Remove(pod("web", "old")));
        assert_eq!(sent(&mut old), ["terminate"]);
        // the new pod of that name waits, taking its updates while it does
        w.handle(PodOp::Add(pod("web", "new")));
        w.handle(PodOp::Update(versioned(&pod("web", "new"), "7")));
        // another name does not wait
        w.handle(PodOp::Add(pod("other", "o1")));
        assert_eq!(started_uids(&fake), ["o1"]);
        // the old worker is done: the waiting pod starts, as last updated
        drop(old);
        w.finished("old");
        let new = take(&fake, "new");
        assert_eq!(new.lifecycle, Lifecycle::Syncing);
        assert_eq!(new.pod.metadata.resource_version.as_deref(), Some("7"));
        // a pending pod removed before it started never starts
        w.handle(PodOp::Remove(pod("web", "new")));
        w.handle(PodOp::Add(pod("web", "newer")));
        w.handle(PodOp::Remove(pod("web", "newer")));
        w.finished("new");
        assert!(!started_uids(&fake).contains(&"newer".to_string()));
    }

    #[tokio::test]
    async fn finished_and_deleted_pods_never_sync_again() {
        let (fake, mut w) = workers(HashMap::from([("u2".to_string(), vec!["c1".to_string()])]));
        // an API pod that finished before this agent saw it: nothing runs
        let done = pod_of(serde_json::json!({
            "metadata": {"name": "done", "namespace": "default", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Succeeded"}}));
        w.handle(PodOp::Add(done));
        assert!(started_uids(&fake).is_empty());
        assert_eq!(
            fake.pods.get("u1").and_then(|e| e.status.phase.clone()),
            Some("Succeeded".to_string())
        );
        // one being deleted already is terminated, adopting what an earlier run left of it
        w.handle(PodOp::Add(deleted(&pod("going", "u2"), "1")));
        let going = take(&fake, "u2");
        assert_eq!(going.lifecycle, Lifecycle::Terminating);
        assert_eq!(going.known, ["c1"]);
        assert!(fake.admitted_against.lock().unwrap().is_empty(), "neither was admitted");
    }

    #[tokio::test]
    async fn admission_counts_the_active_pods_only() {
        let (fake, mut w) = workers(HashMap::new());
        w.handle(PodOp::Add(pod("a", "u1")));
        w.handle(PodOp::Add(pod("b", "u2")));
        w.handle(PodOp::Remove(pod("a", "u1")));
        // b has finished (its phase is terminal): it holds no resources any more
        fake.pods.upsert(
            "u2",
            pod("b", "u2"),
            Some(k8s_openapi::api::core::v1::PodStatus {
                phase: Some("Failed".into()),
                ..Default::default()
            }),
        );
        w.handle(PodOp::Add(pod("c", "u3")));
        assert_eq!(
            *fake.admitted_against.lock().unwrap(),
            [vec![], vec!["a".to_string()], vec![]]
        );
    }

    #[tokio::test]
    async fn kills_reach_running_workers_and_reruns_only_evicted_static_pods() {
        let (fake, mut w) = workers(HashMap::new());
        w.handle(PodOp::Add(pod("a", "u1")));
        let mut a = take(&fake, "u1");
        w.kill("u1", kill("Evicted"));
        w.kill("nobody", kill("Evicted"));
        assert_eq!(sent(&mut a), ["kill:Evicted"]);
        // a pod that is not a static pod evicted here is not run again
        w.rerun("u1");
        assert!(sent(&mut a).is_empty());
        w.handle(PodOp::Remove(pod("a", "u1")));
        w.kill("u1", kill("Evicted"));
        assert_eq!(sent(&mut a), ["terminate"]);

        // an evicted static pod: terminated, then ADDed again once gone
        let s = pod_of(serde_json::json!({
            "metadata": {"name": "s", "namespace": "default", "uid": "s1",
                         "annotations": {"kubernetes.io/config.source": "file"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}));
        w.handle(PodOp::Add(s.clone()));
        let mut first = take(&fake, "s1");
        let evicted: k8s_openapi::api::core::v1::PodStatus = serde_json::from_value(serde_json::json!({
            "phase": "Failed", "reason": "Evicted",
            "conditions": [{"type": crate::status::DISRUPTION_TARGET, "status": "True"}]}))
        .unwrap();
        assert!(crate::eviction::evicted_for_pressure(&evicted));
        fake.pods.upsert("s1", s.clone(), Some(evicted));
        w.rerun("s1");
        assert_eq!(sent(&mut first), ["terminate"]);
        assert_eq!(
            *fake.events.lock().unwrap(),
            [crate::pod::reasons::EVENT_RERUN_AFTER_EVICTION]
        );
        drop(first);
        fake.pods.remove("s1");
        w.finished("s1");
        assert_eq!(take(&fake, "s1").lifecycle, Lifecycle::Syncing);
    }
}
