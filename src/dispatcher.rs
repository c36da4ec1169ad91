//! Pod config and admission (kubelet's PodConfig + HandlePodAdditions): merges the sources'
//! snapshots into the set of desired pods, admits new ones (maxPods, cpu and memory requests
//! against allocatable, features ferrolet refuses), and drives one pod worker per pod UID with
//! ADD / UPDATE / DELETE. At start it adopts the containers the runtime still runs and cleans
//! up pods that are no longer wanted once every source has reported.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::pod::{self, qos, validation};
use crate::sources::Snapshot;
use crate::sync::views::LABEL_POD_UID;
use crate::sync::{Ctx, Msg, Worker};

pub enum Event {
    Snapshot(Snapshot),
    /// A worker finished terminating its pod.
    Terminated(String),
    /// Periodic housekeeping.
    Housekeeping,
}

struct Entry {
    tx: mpsc::UnboundedSender<Msg>,
    pod: Arc<Pod>,
    rejected: bool,
    terminating: bool,
}

pub struct Dispatcher {
    ctx: Arc<Ctx>,
    events: mpsc::UnboundedSender<Event>,
    workers: HashMap<String, Entry>,
    snapshots: BTreeMap<&'static str, Snapshot>,
    expected_sources: HashSet<&'static str>,
    /// Containers found in the runtime at start, by pod uid, until their pod claims them.
    adoptable: HashMap<String, Vec<String>>,
    orphans_cleaned: bool,
}

impl Dispatcher {
    pub fn new(
        ctx: Arc<Ctx>,
        events: mpsc::UnboundedSender<Event>,
        expected_sources: HashSet<&'static str>,
    ) -> Dispatcher {
        let mut adoptable: HashMap<String, Vec<String>> = HashMap::new();
        match ctx.rt.list() {
            Ok(list) => {
                for c in list {
                    if let Some(uid) = c.record.labels.get(LABEL_POD_UID) {
                        adoptable.entry(uid.clone()).or_default().push(c.id().to_string());
                    }
                }
            }
            Err(e) => warn!(error = %ferrolet_fsutil::chain(&e), "listing containers at start"),
        }
        let n: usize = adoptable.values().map(Vec::len).sum();
        if n > 0 {
            info!(
                containers = n,
                pods = adoptable.len(),
                "found containers from an earlier run"
            );
        }
        Dispatcher {
            ctx,
            events,
            workers: HashMap::new(),
            snapshots: BTreeMap::new(),
            expected_sources,
            adoptable,
            orphans_cleaned: false,
        }
    }

    pub async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Event>) {
        // With no sources at all there is nothing to wait for.
        self.maybe_clean_orphans();
        while let Some(ev) = rx.recv().await {
            match ev {
                Event::Snapshot(s) => {
                    self.ctx
                        .pods
                        .set_source_errors(&source_prefix(s.source), prefixed(s.source, &s.errors));
                    self.snapshots.insert(s.source, s);
                    self.reconcile();
                    self.maybe_clean_orphans();
                }
                Event::Terminated(uid) => {
                    self.workers.remove(&uid);
                    // Wanted again meanwhile (a manifest re-added with the same content).
                    self.reconcile();
                }
                Event::Housekeeping => self.housekeeping(),
            }
        }
    }

    fn desired(&self) -> BTreeMap<String, Arc<Pod>> {
        let mut out = BTreeMap::new();
        let mut names = HashSet::new();
        for s in self.snapshots.values() {
            for p in &s.pods {
                let key = (pod::namespace(p).to_string(), pod::name(p).to_string());
                if names.insert(key) {
                    out.insert(pod::uid(p).to_string(), p.clone());
                }
            }
        }
        out
    }

    fn reconcile(&mut self) {
        let desired = self.desired();
        // DELETE
        for (uid, e) in self.workers.iter_mut() {
            if !desired.contains_key(uid) && !e.terminating {
                info!(pod = %pod::full_name(&e.pod), "DELETE: the pod's manifest is gone");
                e.terminating = true;
                if e.rejected {
                    self.ctx.pods.remove(uid);
                }
                let _ = e.tx.send(Msg::Delete);
            }
        }
        self.workers.retain(|_, e| !(e.rejected && e.terminating));
        // ADD / UPDATE
        for (uid, p) in desired {
            match self.workers.get_mut(&uid) {
                Some(e) if e.terminating => {} // re-added while terminating: after it finishes
                Some(e) => {
                    if e.pod != p {
                        info!(pod = %pod::full_name(&p), "UPDATE");
                        e.pod = p.clone();
                        let _ = e.tx.send(Msg::Update(p));
                    }
                }
                None => {
                    // Like kubelet, never run two static pods of one name at once: a changed
                    // manifest's new pod waits for the old one to finish terminating.
                    let busy = self.workers.values().any(|e| {
                        e.terminating
                            && pod::name(&e.pod) == pod::name(&p)
                            && pod::namespace(&e.pod) == pod::namespace(&p)
                    });
                    if busy {
                        info!(pod = %pod::full_name(&p), "waiting for the previous pod of this name to terminate");
                        continue;
                    }
                    self.add(uid, p)
                }
            }
        }
    }

    fn add(&mut self, uid: String, p: Arc<Pod>) {
        let rejected = self.admit(&p);
        match &rejected {
            None => info!(pod = %pod::full_name(&p), "ADD"),
            Some((r, m)) => warn!(pod = %pod::full_name(&p), reason = %r, "pod rejected: {m}"),
        }
        let known = self.adoptable.remove(&uid).unwrap_or_default();
        let tx = Worker::spawn(self.ctx.clone(), p.clone(), known, rejected.clone(), false);
        let events = self.events.clone();
        let ctx = self.ctx.clone();
        let u = uid.clone();
        let watch_tx = tx.clone();
        // Learn when the worker is done (its channel closes).
        tokio::spawn(async move {
            watch_tx.closed().await;
            let _ = ctx;
            let _ = events.send(Event::Terminated(u));
        });
        self.workers.insert(
            uid,
            Entry {
                tx,
                pod: p,
                rejected: rejected.is_some(),
                terminating: false,
            },
        );
    }

    /// kubelet's admission: can the node take this pod?
    fn admit(&self, p: &Pod) -> Option<(String, String)> {
        if let Some(why) = validation::unsupported(p) {
            return Some(("UnsupportedPodSpec".into(), why));
        }
        let active: Vec<&Entry> = self
            .workers
            .values()
            .filter(|e| !e.rejected && !e.terminating)
            .filter(|e| {
                let phase = self.ctx.pods.get(pod::uid(&e.pod)).and_then(|x| x.status.phase);
                !matches!(phase.as_deref(), Some("Succeeded") | Some("Failed"))
            })
            .collect();
        let node = &self.ctx.node;
        if active.len() as u32 >= node.max_pods {
            return Some((
                "OutOfpods".into(),
                format!(
                    "Node didn't have enough resource: pods, requested: 1, used: {}, capacity: {}",
                    active.len(),
                    node.max_pods
                ),
            ));
        }
        for (res, cap) in [("cpu", node.allocatable_cpu_milli), ("memory", node.allocatable_memory)] {
            let want = qos::pod_requests(p, res);
            if want == 0 {
                continue;
            }
            let used: i64 = active.iter().map(|e| qos::pod_requests(&e.pod, res)).sum();
            if used + want > cap {
                return Some((
                    format!("OutOf{res}"),
                    format!(
                        "Node didn't have enough resource: {res}, requested: {want}, used: {used}, capacity: {cap}"
                    ),
                ));
            }
        }
        None
    }

    /// Once every source has reported, terminate pods that exist on the node but are wanted by
    /// none: containers from an earlier run and pod directories left behind.
    fn maybe_clean_orphans(&mut self) {
        if self.orphans_cleaned || !self.expected_sources.iter().all(|s| self.snapshots.contains_key(s)) {
            return;
        }
        self.orphans_cleaned = true;
        let mut uids: HashSet<String> = self.adoptable.keys().cloned().collect();
        if let Ok(rd) = std::fs::read_dir(self.ctx.cfg.pods_dir()) {
            for e in rd.flatten() {
                uids.insert(e.file_name().to_string_lossy().into_owned());
            }
        }
        for uid in self.ctx.cgroups.existing_pod_uids() {
            uids.insert(uid);
        }
        for uid in uids {
            if self.workers.contains_key(&uid) {
                continue;
            }
            self.terminate_orphan(uid);
        }
    }

    fn terminate_orphan(&mut self, uid: String) {
        let dir = self.ctx.pod_dir(&uid);
        let stored: Option<Pod> = ferrolet_fsutil::read_json_opt(&dir.join("pod.json")).ok().flatten();
        let p = stored.unwrap_or_else(|| {
            let mut p = Pod::default();
            p.metadata.uid = Some(uid.clone());
            p.metadata.name = Some(format!("orphan-{uid}"));
            p.metadata.namespace = Some("default".into());
            p.spec = Some(Default::default());
            p
        });
        info!(pod = %pod::full_name(&p), "cleaning up a pod that is no longer wanted");
        let known = self.adoptable.remove(&uid).unwrap_or_default();
        let p = Arc::new(p);
        let tx = Worker::spawn(self.ctx.clone(), p.clone(), known, None, true);
        let events = self.events.clone();
        let watch_tx = tx.clone();
        let u = uid.clone();
        tokio::spawn(async move {
            watch_tx.closed().await;
            let _ = events.send(Event::Terminated(u));
        });
        self.workers.insert(
            uid,
            Entry {
                tx,
                pod: p,
                rejected: false,
                terminating: true,
            },
        );
    }

    /// Containers carrying a pod label for a pod nobody owns (left by a crash during
    /// termination) are cleaned up.
    fn housekeeping(&mut self) {
        if !self.orphans_cleaned {
            return;
        }
        let Ok(list) = self.ctx.rt.list() else { return };
        let mut strays: HashMap<String, Vec<String>> = HashMap::new();
        for c in list {
            if let Some(uid) = c.record.labels.get(LABEL_POD_UID) {
                if !self.workers.contains_key(uid) {
                    strays.entry(uid.clone()).or_default().push(c.id().to_string());
                }
            }
        }
        for (uid, ids) in strays {
            self.adoptable.insert(uid.clone(), ids);
            self.terminate_orphan(uid);
        }
    }
}

fn source_prefix(source: &str) -> String {
    format!("{source}:")
}

fn prefixed(source: &str, errors: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    errors
        .iter()
        .map(|(k, v)| (format!("{source}:{k}"), v.clone()))
        .collect()
}
