//! The API server as a pod source (kubelet's config/apiserver.go): the pods bound to this node
//! (a watch with the field selector `spec.nodeName=<node>`), sent as complete snapshots like the
//! other sources. The watch re-lists after a 410 Gone or a broken connection, backing off while
//! the API server is away; until its first list the source has not reported, so nothing the
//! node runs is taken for an orphan while the API server is unreachable.
//!
//! Mirror pods (the API server's copies of this node's static pods) are not pods to run; they
//! are left out, and a change to one is passed to the mirror pods' task.
//!
//! Every snapshot is written to the node's checkpoint ([`crate::checkpoint`]) before it is
//! handed on. When the API server cannot be reached at start (its first list fails, or has not
//! come within [`RESTORE_AFTER`]), the checkpointed pods are sent as this source's snapshot,
//! with the same UIDs, and the node's view is stale until the server's list replaces them:
//! the pod config's diff then changes only what changed meanwhile (docs/offline.md).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::Snapshot;
use crate::checkpoint::Checkpoint;
use crate::kubeclient::Kube;
use crate::mirror::MirrorQueue;
use crate::pod;

/// How long the first list may take before the node runs its checkpointed pods (a server
/// that refuses the connection is known unreachable at once).
pub const RESTORE_AFTER: Duration = Duration::from_secs(1);

pub struct ApiSource {
    kube: Kube,
    node: String,
    /// Told when a mirror pod changes, so one deleted by a user comes back.
    mirrors: Option<MirrorQueue>,
    checkpoint: Arc<Checkpoint>,
    /// When the agent started (the restore's time is logged from it).
    started: Instant,
}

impl ApiSource {
    pub fn new(kube: Kube, node: String, mirrors: Option<MirrorQueue>, checkpoint: Arc<Checkpoint>) -> ApiSource {
        ApiSource {
            kube,
            node,
            mirrors,
            checkpoint,
            started: Instant::now(),
        }
    }

    /// Write the pods to the checkpoint (a failure is logged: the pods still run).
    async fn checkpoint(&self, pods: &BTreeMap<String, Arc<Pod>>) {
        let (cp, list): (_, Vec<Arc<Pod>>) = (self.checkpoint.clone(), pods.values().cloned().collect());
        if let Err(e) = crate::tasks::blocking(move || cp.set_pods(&list)).await {
            warn!(error = %format!("{e:#}"), "writing the pods' checkpoint");
        }
    }

    /// The API server is not there at start: send the checkpointed pods as this source's.
    fn restore(&self, why: &str, tx: &mpsc::UnboundedSender<Snapshot>) -> bool {
        let pods: Vec<Arc<Pod>> = self.checkpoint.pods().into_iter().filter_map(accept).collect();
        self.checkpoint.view().restored(pods.len(), why);
        warn!(
            pods = pods.len(),
            after = ?self.started.elapsed(),
            error = why,
            "the API server is unreachable: running this node's pods from the local checkpoint until it is back"
        );
        tx.send(Snapshot {
            source: pod::SOURCE_API,
            pods,
            errors: Default::default(),
        })
        .is_ok()
    }

    /// Watch until the receiver is gone (a broken watch is resumed, never the end).
    pub async fn run(self, tx: mpsc::UnboundedSender<Snapshot>) {
        let api: Api<Pod> = Api::all(self.kube.client());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={}", self.node));
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        let mut pods: BTreeMap<String, Arc<Pod>> = BTreeMap::new();
        // A re-list in progress: the pods it has listed so far.
        let mut relist: Option<BTreeMap<String, Arc<Pod>>> = None;
        // The mirror pods the re-list found so far (for the mirror pods' orphan cleanup).
        let mut relisted_mirrors: Vec<Pod> = Vec::new();
        let mut listed_once = false;
        // New pods' names since the last snapshot, for their start phases (docs/start-path.md).
        let mut arrived: Vec<String> = Vec::new();
        let mut failing = false;
        // The checkpoint is offered once, before the first list, when it holds pods.
        let mut may_restore = !self.checkpoint.is_empty();
        let restore_deadline = tokio::time::sleep(RESTORE_AFTER);
        tokio::pin!(restore_deadline);
        loop {
            let ev = if may_restore {
                tokio::select! {
                    ev = events.next() => ev,
                    _ = &mut restore_deadline => {
                        may_restore = false;
                        if !self.restore("no answer to the first list", &tx) {
                            return;
                        }
                        continue;
                    }
                }
            } else {
                events.next().await
            };
            let Some(ev) = ev else { break };
            let changed = match ev {
                Ok(Event::Init) => {
                    relist = Some(BTreeMap::new());
                    relisted_mirrors.clear();
                    false
                }
                Ok(Event::InitApply(p)) if pod::is_mirror(&p) => {
                    relisted_mirrors.push(p);
                    false
                }
                Ok(Event::InitApply(p)) => {
                    if let Some(l) = relist.as_mut() {
                        if let Some(p) = accept(p) {
                            l.insert(pod::uid(&p).to_string(), p);
                        }
                    }
                    false
                }
                Ok(Event::InitDone) => {
                    pods = relist.take().unwrap_or_default();
                    let mirrors = std::mem::take(&mut relisted_mirrors);
                    if let Some(m) = &self.mirrors {
                        m.listed(mirrors);
                    }
                    if !listed_once {
                        info!(pods = pods.len(), "pods bound to this node listed from the API server");
                    }
                    if let Some(stale) = self.checkpoint.view().fresh() {
                        info!(
                            stale_for = ?stale.since.elapsed().unwrap_or_default(),
                            pods = pods.len(),
                            "the API server is back: this node's pods are reconciled with its list"
                        );
                    }
                    listed_once = true;
                    may_restore = false;
                    true
                }
                Ok(Event::Apply(p)) if pod::is_mirror(&p) => {
                    if let Some(m) = &self.mirrors {
                        m.changed(&p, false);
                    }
                    false
                }
                Ok(Event::Delete(p)) if pod::is_mirror(&p) => {
                    if let Some(m) = &self.mirrors {
                        m.changed(&p, true);
                    }
                    false
                }
                Ok(Event::Apply(p)) => {
                    let uid = pod::uid(&p).to_string();
                    if !pods.contains_key(&uid) && crate::metrics::start_phases_enabled() {
                        crate::metrics::start_phase(pod::name(&p), "watched");
                        arrived.push(pod::name(&p).to_string());
                    }
                    match accept(p) {
                        Some(p) => pods.insert(uid, p),
                        None => pods.remove(&uid),
                    };
                    true
                }
                Ok(Event::Delete(p)) => pods.remove(pod::uid(&p)).is_some(),
                Err(e) => {
                    if !failing {
                        warn!(error = %e, "watching this node's pods; retrying");
                    }
                    failing = true;
                    let why = e.to_string();
                    self.checkpoint.view().unreachable(&why);
                    if may_restore {
                        may_restore = false;
                        if !self.restore(&why, &tx) {
                            return;
                        }
                    }
                    continue;
                }
            };
            if failing {
                info!("watching this node's pods again");
                failing = false;
            }
            if changed && listed_once && relist.is_none() {
                self.checkpoint(&pods).await;
                for name in arrived.drain(..) {
                    crate::metrics::start_phase(&name, "checkpointed");
                }
                let snap = Snapshot {
                    source: pod::SOURCE_API,
                    pods: pods.values().cloned().collect(),
                    errors: Default::default(),
                };
                if tx.send(snap).is_err() {
                    return;
                }
            }
        }
        warn!("the watch of this node's pods ended");
    }
}

/// The pod as the node runs it, or None for a mirror pod: marked as coming from the API
/// server (kubelet's config.source annotation), with the time it was seen.
fn accept(mut p: Pod) -> Option<Arc<Pod>> {
    if pod::is_mirror(&p) {
        return None;
    }
    let ann = p.metadata.annotations.get_or_insert_with(Default::default);
    ann.insert(pod::CONFIG_SOURCE.into(), pod::SOURCE_API.into());
    ann.insert(pod::CONFIG_SEEN.into(), chrono::Utc::now().to_rfc3339());
    Some(Arc::new(p))
}
