//! The eviction manager's loop (kubelet's managerImpl.synchronize).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::rank::{self, Candidate};
use super::signals::{self, Condition, Observations, Resource, Signal, Threshold};
use super::{Eviction, Kill, Request, RequestFn, REASON};
use crate::config::Config;
use crate::events::{Kind, Recorder};
use crate::images::gc::ImageGc;
use crate::kuberuntime::gc::ContainerGc;
use crate::pod::{self, manager::PodManager};
use crate::stats::summary::Summary;
use crate::stats::{Snapshot, Stats};
use crate::tasks::blocking;

/// How long the manager waits for an evicted pod's containers to stop (kubelet's
/// podCleanupTimeout).
const POD_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
/// The grace period of a pod evicted for a hard threshold (kubelet's
/// immediateEvictionGracePeriodSeconds).
const IMMEDIATE_GRACE: Duration = Duration::from_secs(1);

/// What can be reclaimed on the node before pods are evicted for disk.
pub struct Reclaim {
    pub containers: Arc<ContainerGc>,
    pub images: Arc<ImageGc>,
}

pub struct Manager {
    cfg: Arc<Config>,
    thresholds: Vec<Threshold>,
    stats: Arc<Stats>,
    pods: Arc<PodManager>,
    to_workers: RequestFn,
    events: Recorder,
    reclaim: Reclaim,
    shared: Eviction,
    /// The image filesystem is not the node's (kubelet's dedicated imagefs).
    has_imagefs: bool,
    first_observed: BTreeMap<(Signal, bool), Instant>,
    last_seen: BTreeMap<Condition, Instant>,
    /// The thresholds acted on last round (held until their minimum reclaim is recovered).
    met: Vec<Threshold>,
    /// Pods evicted already, until the node is rid of them.
    evicted: HashSet<String>,
}

impl Manager {
    pub fn new(
        cfg: Arc<Config>,
        stats: Arc<Stats>,
        pods: Arc<PodManager>,
        to_workers: RequestFn,
        events: Recorder,
        reclaim: Reclaim,
        shared: Eviction,
    ) -> Manager {
        let e = &cfg.eviction;
        let enforce_pods = cfg.cgroups_per_qos && cfg.cm.enforces("pods");
        let thresholds = signals::thresholds(
            &cfg.eviction_hard,
            &e.soft,
            &e.soft_grace_period,
            &e.minimum_reclaim,
            enforce_pods,
        );
        let dev = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.dev()).ok();
        let has_imagefs =
            matches!((dev(&cfg.root_dir), dev(reclaim.images.images_dir())), (Some(a), Some(b)) if a != b);
        info!(
            thresholds = %thresholds.iter().map(|t| format!("{}<{:?}{}", t.signal.name(), t.value, if t.is_hard() { String::new() } else { format!(" for {:?}", t.grace_period) })).collect::<Vec<_>>().join(", "),
            has_imagefs,
            "eviction manager"
        );
        Manager {
            cfg,
            thresholds,
            stats,
            pods,
            to_workers,
            events,
            reclaim,
            shared,
            has_imagefs,
            first_observed: BTreeMap::new(),
            last_seen: BTreeMap::new(),
            met: Vec::new(),
            evicted: HashSet::new(),
        }
    }

    /// Run the loop on the current tokio runtime.
    pub fn start(mut self) {
        tokio::spawn(async move {
            loop {
                let waited = self.round().await;
                if !waited {
                    tokio::time::sleep(self.cfg.eviction.monitoring_period).await;
                }
            }
        });
    }

    /// The node's signals read now; the pods' stats from the sampler's latest round when it is
    /// at most two of its intervals old (kubelet reads them from cAdvisor's cache).
    async fn sample(&self) -> Option<Summary> {
        let stats = self.stats.clone();
        let pods_max_age = 2 * self.cfg.housekeeping_interval;
        match blocking(move || Ok(stats.node_now_pods_within(pods_max_age))).await {
            Ok(s) => Some(s),
            Err(e) => {
                warn!(error = %format!("{e:#}"), "eviction manager: sampling stats");
                None
            }
        }
    }

    /// One round; true when it evicted (and waited for the pods to stop).
    async fn round(&mut self) -> bool {
        let Some(snap) = self.sample().await else { return false };
        let obs = signals::observe(&snap);
        let now = Instant::now();
        let mut met = signals::thresholds_met(&self.thresholds, &obs, false);
        if !self.met.is_empty() {
            met = signals::merge(met, signals::thresholds_met(&self.met, &obs, true));
        }
        self.first_observed = signals::first_observed(&met, &self.first_observed, now);
        let seen = signals::conditions(&met);
        let reported = signals::conditions_observed_since(
            &mut self.last_seen,
            &seen,
            self.cfg.eviction.pressure_transition_period,
            now,
        );
        if reported != self.shared.conditions() {
            info!(
                conditions = ?reported.iter().map(|c| c.name()).collect::<Vec<_>>(),
                "eviction manager: node conditions changed"
            );
            self.shared.set(reported.clone());
        }
        let acting = signals::met_grace_period(&met, &self.first_observed, now);
        self.met = acting.clone();
        if reported.is_empty() {
            self.rerun_evicted_static_pods();
        }

        let mut candidates = self.candidates(snap.pods);

        // Local storage limits, whatever the pressure (every offender goes).
        let mut waits = Vec::new();
        for c in &candidates {
            let Some(s) = &c.stats else { continue };
            if let Some(message) = super::local_storage::violation(&c.pod, s) {
                waits.extend(self.evict(c, message, Duration::ZERO, false));
            }
        }
        if !waits.is_empty() {
            self.wait(waits).await;
            return true;
        }

        if acting.is_empty() {
            return false;
        }
        let acting = signals::by_eviction_priority(acting);
        let first = acting[0];
        let resource = first.signal.resource();
        info!(
            signal = first.signal.name(),
            resource = resource.name(),
            "eviction manager: attempting to reclaim"
        );
        if self.reclaim_node_level(first.signal).await {
            return false;
        }
        // The round's pod stats came from the sampler's last round: rank on the pods' numbers
        // of now. Disk usage comes from the periodic walks, and a pod whose volumes were not
        // walked yet would rank as using only its logs: for disk, walk every pod afresh first.
        let disk = matches!(resource, Resource::EphemeralStorage | Resource::Inodes);
        if let Some(fresh) = self.sample_all_afresh(disk).await {
            candidates = self.candidates(fresh.summary.pods.clone());
        }
        rank::rank(&mut candidates, resource);
        let max = self.cfg.eviction.max_pod_grace_period;
        let grace = |p: &k8s_openapi::api::core::v1::Pod| {
            if first.is_hard() {
                return IMMEDIATE_GRACE;
            }
            let own = pod::spec(p).termination_grace_period_seconds.unwrap_or(30);
            Duration::from_secs(max.min(own).max(0) as u64)
        };
        for c in &candidates {
            if rank::is_critical(&c.pod, self.cfg.in_cluster()) {
                continue;
            }
            let mut message = signals::node_low_message(resource, &acting, &obs);
            message.push_str(&rank::container_messages(&c.pod, c.stats.as_ref(), resource));
            if let Some(w) = self.evict(c, message, grace(&c.pod), true) {
                self.wait(vec![w]).await;
                return true;
            }
        }
        warn!(
            resource = resource.name(),
            "eviction manager: unable to evict any pod from the node"
        );
        false
    }

    /// Pods that may be evicted, with their stats (taken out of a round's `pods`).
    fn candidates(&mut self, pods: Vec<crate::stats::summary::PodStats>) -> Vec<Candidate> {
        let mut by_uid: HashMap<String, crate::stats::summary::PodStats> =
            pods.into_iter().map(|p| (p.pod_ref.uid.clone(), p)).collect();
        let entries = self.pods.entries();
        let present: HashSet<String> = entries.iter().map(|e| pod::uid(&e.pod).to_string()).collect();
        self.evicted.retain(|u| present.contains(u));
        entries
            .into_iter()
            .filter(|e| e.is_active())
            .filter(|e| !self.evicted.contains(pod::uid(&e.pod)))
            .map(|e| Candidate {
                stats: by_uid.remove(pod::uid(&e.pod)),
                pod: e.pod,
            })
            .collect()
    }

    /// A whole round of the sampler now, after walking every pod's directories when `walk`
    /// (the disk usage a ranking for disk needs).
    async fn sample_all_afresh(&self, walk: bool) -> Option<Arc<Snapshot>> {
        let stats = self.stats.clone();
        match blocking(move || {
            if walk {
                stats.walk_now();
            }
            Ok(stats.sample_now())
        })
        .await
        {
            Ok(s) => Some(s),
            Err(e) => {
                warn!(error = %format!("{e:#}"), "eviction manager: sampling every pod");
                None
            }
        }
    }

    /// Static pods this node evicted for its pressure (not for their own local storage limits,
    /// which would only be hit again) run again once no pressure is reported (the condition
    /// held for evictionPressureTransitionPeriod after it was last seen): a standalone node has
    /// no controller to recreate them. Decided from the pods' statuses, so it holds across
    /// agent restarts too.
    fn rerun_evicted_static_pods(&self) {
        for e in self.pods.entries() {
            if e.terminating || !pod::is_static(&e.pod) || !super::evicted_for_pressure(&e.status) {
                continue;
            }
            (self.to_workers)(Request::Rerun(pod::uid(&e.pod).to_string()));
        }
    }

    /// kubelet's reclaimNodeLevelResources: for disk, dead containers then unused images go;
    /// true when that was enough (every threshold, its minimum reclaim included, is resolved).
    async fn reclaim_node_level(&mut self, signal: Signal) -> bool {
        let disk = matches!(signal.resource(), Resource::EphemeralStorage | Resource::Inodes);
        let nodefs = matches!(signal, Signal::NodeFsAvailable | Signal::NodeFsInodesFree);
        if !disk || (self.has_imagefs && nodefs) {
            return false;
        }
        let containers = self.reclaim.containers.collect(true, true).await;
        let images = self.reclaim.images.clone();
        let freed = blocking(move || Ok(images.delete_unused())).await;
        match freed {
            Ok(Ok(r)) => info!(
                containers,
                images = r.removed.len(),
                bytes = r.freed,
                "eviction manager: reclaimed node-level resources"
            ),
            Ok(Err(e)) => warn!(containers, error = %e, "eviction manager: deleting unused images"),
            Err(e) => warn!(error = %format!("{e:#}"), "eviction manager: deleting unused images"),
        }
        let Some(snap) = self.sample().await else { return false };
        let obs: Observations = signals::observe(&snap);
        if signals::thresholds_met(&self.thresholds, &obs, true).is_empty() {
            info!(
                signal = signal.name(),
                "eviction manager: able to reduce resource pressure without evicting pods"
            );
            return true;
        }
        false
    }

    /// kubelet's evictPod: the Evicted event, then the kill. Returns what to wait on.
    fn evict(
        &mut self,
        c: &Candidate,
        message: String,
        grace: Duration,
        disruption_target: bool,
    ) -> Option<tokio::sync::oneshot::Receiver<()>> {
        if rank::is_critical(&c.pod, self.cfg.in_cluster()) {
            warn!(pod = %pod::full_name(&c.pod), "eviction manager: cannot evict a critical pod");
            return None;
        }
        self.events.pod(&c.pod, None, Kind::Warning, REASON, &message);
        let uid = pod::uid(&c.pod).to_string();
        let (tx, rx) = tokio::sync::oneshot::channel();
        (self.to_workers)(Request::Kill(Kill {
            uid: uid.clone(),
            reason: REASON.into(),
            message,
            grace,
            disruption_target,
            done: Some(tx),
        }));
        info!(pod = %pod::full_name(&c.pod), "eviction manager: pod is evicted successfully");
        self.evicted.insert(uid);
        Some(rx)
    }

    /// Wait for evicted pods' containers to stop (at most kubelet's podCleanupTimeout).
    async fn wait(&self, waits: Vec<tokio::sync::oneshot::Receiver<()>>) {
        let all = futures::future::join_all(waits);
        if tokio::time::timeout(POD_CLEANUP_TIMEOUT, all).await.is_err() {
            warn!("eviction manager: timed out waiting for evicted pods to stop");
        }
    }
}
