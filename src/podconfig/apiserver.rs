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

use futures::{FutureExt, StreamExt};
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
        let events = watcher::watcher(api, config).default_backoff().boxed();
        self.follow(events, tx).await
    }

    /// Take the watch's events in, and send a snapshot for each batch of them that changed the
    /// node's pods, until the receiver is gone or the events end.
    async fn follow<S>(&self, mut events: S, tx: mpsc::UnboundedSender<Snapshot>)
    where
        S: futures::Stream<Item = Result<Event<Pod>, watcher::Error>> + Unpin,
    {
        let mut w = Watched {
            // The checkpoint is offered once, before the first list, when it holds pods.
            may_restore: !self.checkpoint.is_empty(),
            ..Watched::default()
        };
        let restore_deadline = tokio::time::sleep(RESTORE_AFTER);
        tokio::pin!(restore_deadline);
        loop {
            let ev = if w.may_restore {
                tokio::select! {
                    ev = events.next() => ev,
                    _ = &mut restore_deadline => {
                        w.may_restore = false;
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
            let restore = |why: &str| self.restore(why, &tx);
            let Some(mut changed) = w.apply(ev, self.mirrors.as_ref(), &self.checkpoint, restore) else {
                return;
            };
            // The events the watch already holds join this one: a burst of pods (and the
            // status writes that come back for them) is checkpointed and handed on once, not
            // once an event, each waiting for the disk while the next pods wait behind it.
            let mut ended = false;
            for _ in 0..MAX_BATCH {
                match events.next().now_or_never() {
                    Some(Some(ev)) => match w.apply(ev, self.mirrors.as_ref(), &self.checkpoint, restore) {
                        Some(c) => changed |= c,
                        None => return,
                    },
                    Some(None) => {
                        ended = true;
                        break;
                    }
                    None => break,
                }
            }
            if changed && w.listed_once && w.relist.is_none() {
                self.checkpoint(&w.pods).await;
                for name in w.arrived.drain(..) {
                    crate::metrics::start_phase(&name, "checkpointed");
                }
                let snap = Snapshot {
                    source: pod::SOURCE_API,
                    pods: w.pods.values().cloned().collect(),
                    errors: Default::default(),
                };
                if tx.send(snap).is_err() {
                    return;
                }
            }
            if ended {
                break;
            }
        }
        warn!("the watch of this node's pods ended");
    }
}

/// At most this many events already delivered are taken into one snapshot.
const MAX_BATCH: usize = 256;

/// What the watch has told so far.
#[derive(Default)]
struct Watched {
    pods: BTreeMap<String, Arc<Pod>>,
    /// A re-list in progress: the pods it has listed so far.
    relist: Option<BTreeMap<String, Arc<Pod>>>,
    /// The mirror pods the re-list found so far (for the mirror pods' orphan cleanup).
    relisted_mirrors: Vec<Pod>,
    listed_once: bool,
    /// New pods' names since the last snapshot, for their start phases (docs/start-path.md).
    arrived: Vec<String>,
    failing: bool,
    /// The checkpoint may still be run instead of the API server's list.
    may_restore: bool,
}

impl Watched {
    /// Take one event in: whether the node's pods changed, or None when the pod config is gone
    /// (`restore` sends the checkpoint's pods, false when nobody receives them).
    fn apply(
        &mut self,
        ev: Result<Event<Pod>, watcher::Error>,
        mirrors: Option<&MirrorQueue>,
        checkpoint: &Checkpoint,
        restore: impl FnOnce(&str) -> bool,
    ) -> Option<bool> {
        let changed = match ev {
            Ok(Event::Init) => {
                self.relist = Some(BTreeMap::new());
                self.relisted_mirrors.clear();
                false
            }
            Ok(Event::InitApply(p)) if pod::is_mirror(&p) => {
                self.relisted_mirrors.push(p);
                false
            }
            Ok(Event::InitApply(p)) => {
                if let Some(l) = self.relist.as_mut() {
                    if let Some(p) = accept(p) {
                        l.insert(pod::uid(&p).to_string(), p);
                    }
                }
                false
            }
            Ok(Event::InitDone) => {
                self.pods = self.relist.take().unwrap_or_default();
                let relisted = std::mem::take(&mut self.relisted_mirrors);
                if let Some(m) = mirrors {
                    m.listed(relisted);
                }
                if !self.listed_once {
                    info!(
                        pods = self.pods.len(),
                        "pods bound to this node listed from the API server"
                    );
                }
                if let Some(stale) = checkpoint.view().fresh() {
                    info!(
                        stale_for = ?stale.since.elapsed().unwrap_or_default(),
                        pods = self.pods.len(),
                        "the API server is back: this node's pods are reconciled with its list"
                    );
                }
                self.listed_once = true;
                self.may_restore = false;
                true
            }
            Ok(Event::Apply(p)) if pod::is_mirror(&p) => {
                if let Some(m) = mirrors {
                    m.changed(&p, false);
                }
                false
            }
            Ok(Event::Delete(p)) if pod::is_mirror(&p) => {
                if let Some(m) = mirrors {
                    m.changed(&p, true);
                }
                false
            }
            Ok(Event::Apply(p)) => {
                let uid = pod::uid(&p).to_string();
                if !self.pods.contains_key(&uid) && crate::metrics::start_phases_enabled() {
                    crate::metrics::start_phase(pod::name(&p), "watched");
                    self.arrived.push(pod::name(&p).to_string());
                }
                match accept(p) {
                    Some(p) => self.pods.insert(uid, p),
                    None => self.pods.remove(&uid),
                };
                true
            }
            Ok(Event::Delete(p)) => self.pods.remove(pod::uid(&p)).is_some(),
            Err(e) => {
                if !self.failing {
                    warn!(error = %e, "watching this node's pods; retrying");
                }
                self.failing = true;
                let why = e.to_string();
                checkpoint.view().unreachable(&why);
                if self.may_restore {
                    self.may_restore = false;
                    if !restore(&why) {
                        return None;
                    }
                }
                return Some(false);
            }
        };
        if self.failing {
            info!("watching this node's pods again");
            self.failing = false;
        }
        Some(changed)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: &str, mirror: bool) -> Pod {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "c", "image": "busybox:1.35"}]}
        }))
        .unwrap();
        if mirror {
            p.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(pod::CONFIG_MIRROR.into(), "x".into());
        }
        p
    }

    fn uids(w: &Watched) -> Vec<&str> {
        w.pods.keys().map(String::as_str).collect()
    }

    fn snapshot_uids(s: &Snapshot) -> Vec<&str> {
        let mut u: Vec<&str> = s.pods.iter().map(|p| pod::uid(p)).collect();
        u.sort();
        u
    }

    /// A source whose client is never called: these tests hand it their own events.
    fn source(checkpoint: Arc<Checkpoint>) -> ApiSource {
        let service = tower::service_fn(|_req: axum::http::Request<kube::client::Body>| async {
            Err::<axum::http::Response<http_body_util::Full<bytes::Bytes>>, _>(std::io::Error::other("no server"))
        });
        let kube = Kube::from_client(kube::Client::new(service, "default"));
        ApiSource::new(kube, "n".into(), None, checkpoint)
    }

    type Watch = futures::channel::mpsc::UnboundedReceiver<Result<Event<Pod>, watcher::Error>>;

    /// A watch that has delivered a list of pod "a" (uid 1) and then `after`; the sender sends
    /// more, or ends the watch when dropped.
    fn delivered(
        after: impl IntoIterator<Item = Event<Pod>>,
    ) -> (
        futures::channel::mpsc::UnboundedSender<Result<Event<Pod>, watcher::Error>>,
        Watch,
    ) {
        let (events, watch) = futures::channel::mpsc::unbounded();
        let list = [Event::Init, Event::InitApply(pod("a", "1", false)), Event::InitDone];
        for ev in list.into_iter().chain(after) {
            events.unbounded_send(Ok(ev)).unwrap();
        }
        (events, watch)
    }

    #[tokio::test]
    async fn events_already_delivered_make_one_snapshot_and_a_later_one_another() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        // A list and two new pods, all delivered before the source looks.
        let (events, watch) = delivered([Event::Apply(pod("b", "2", false)), Event::Apply(pod("c", "3", false))]);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let src = source(cp.clone());
        let task = tokio::spawn(async move { src.follow(watch, tx).await });
        let first = rx.recv().await.expect("a snapshot");
        assert_eq!(snapshot_uids(&first), ["1", "2", "3"]);
        assert_eq!(cp.pods().len(), 3, "checkpointed before it was sent");
        // A pod that comes later is a snapshot of its own; nothing came between.
        assert!(rx.try_recv().is_err(), "one batch, one snapshot");
        events.unbounded_send(Ok(Event::Apply(pod("d", "4", false)))).unwrap();
        let second = rx.recv().await.expect("a second snapshot");
        assert_eq!(snapshot_uids(&second), ["1", "2", "3", "4"]);
        assert_eq!(cp.pods().len(), 4);
        // The events end: so does the source.
        drop(events);
        task.await.unwrap();
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn a_batch_the_watch_ends_in_is_still_sent() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        let (events, watch) = delivered([Event::Apply(pod("b", "2", false))]);
        drop(events);
        let (tx, mut rx) = mpsc::unbounded_channel();
        source(cp.clone()).follow(watch, tx).await;
        let only = rx.recv().await.expect("the batch's snapshot");
        assert_eq!(snapshot_uids(&only), ["1", "2"]);
        assert_eq!(cp.pods().len(), 2);
        assert!(rx.recv().await.is_none(), "one snapshot, then the end");
    }

    #[test]
    fn the_watch_keeps_the_nodes_pods_and_leaves_mirror_pods_out() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        let mut w = Watched::default();
        let never = |_: &str| -> bool { panic!("the checkpoint was offered") };
        let apply = |w: &mut Watched, ev| w.apply(Ok(ev), None, &cp, never);
        // A list tells nothing until it is done; a mirror pod is not one to run.
        assert_eq!(apply(&mut w, Event::Init), Some(false));
        assert_eq!(apply(&mut w, Event::InitApply(pod("a", "1", false))), Some(false));
        assert_eq!(apply(&mut w, Event::InitApply(pod("m", "2", true))), Some(false));
        assert!(w.pods.is_empty());
        assert_eq!(apply(&mut w, Event::InitDone), Some(true));
        assert!(w.listed_once && w.relist.is_none());
        assert_eq!(uids(&w), ["1"]);
        assert_eq!(pod::annotation(&w.pods["1"], pod::CONFIG_SOURCE), Some(pod::SOURCE_API));
        // A new pod, a mirror pod's change, a deletion, and a deletion of a pod not there.
        assert_eq!(apply(&mut w, Event::Apply(pod("b", "3", false))), Some(true));
        assert_eq!(apply(&mut w, Event::Apply(pod("m", "2", true))), Some(false));
        assert_eq!(apply(&mut w, Event::Delete(pod("a", "1", false))), Some(true));
        assert_eq!(apply(&mut w, Event::Delete(pod("a", "1", false))), Some(false));
        assert_eq!(uids(&w), ["3"]);
    }

    #[test]
    fn a_failing_watch_changes_nothing_and_offers_the_checkpoint_once() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        let mut w = Watched {
            may_restore: true,
            ..Watched::default()
        };
        let mut offered = Vec::new();
        let ev = Err(watcher::Error::NoResourceVersion);
        let r = w.apply(ev, None, &cp, |why: &str| {
            offered.push(why.to_string());
            true
        });
        assert_eq!(r, Some(false));
        assert_eq!(offered.len(), 1, "{offered:?}");
        assert!(w.failing && !w.may_restore);
        // Not offered again; the next event ends the failure.
        let never = |_: &str| -> bool { panic!("offered twice") };
        assert_eq!(
            w.apply(Err(watcher::Error::NoResourceVersion), None, &cp, never),
            Some(false)
        );
        assert_eq!(
            w.apply(Ok(Event::Apply(pod("b", "3", false))), None, &cp, never),
            Some(true)
        );
        assert!(!w.failing);
        // Nobody left to take the checkpoint's pods: the source ends.
        w.may_restore = true;
        let gone = w.apply(Err(watcher::Error::NoResourceVersion), None, &cp, |_: &str| false);
        assert_eq!(gone, None);
    }
}
