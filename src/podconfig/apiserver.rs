//! The API server as a pod source (kubelet's config/apiserver.go): the pods bound to this node
//! (a watch with the field selector `spec.nodeName=<node>`), sent as complete snapshots like the
//! other sources. The watch re-lists after a 410 Gone or a broken connection, backing off while
//! the API server is away; until its first list the source has not reported, so nothing the
//! node runs is taken for an orphan while the API server is unreachable.
//!
//! Mirror pods (the API server's copies of this node's static pods) are not pods to run; they
//! are left out, and a change to one is passed to the mirror pods' task.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::Snapshot;
use crate::kubeclient::Kube;
use crate::mirror::MirrorQueue;
use crate::pod;

pub struct ApiSource {
    kube: Kube,
    node: String,
    /// Told when a mirror pod changes, so one deleted by a user comes back.
    mirrors: Option<MirrorQueue>,
}

impl ApiSource {
    pub fn new(kube: Kube, node: String, mirrors: Option<MirrorQueue>) -> ApiSource {
        ApiSource { kube, node, mirrors }
    }

    /// Watch until the receiver is gone (a broken watch is resumed, never the end).
    pub async fn run(self, tx: mpsc::UnboundedSender<Snapshot>) {
        let api: Api<Pod> = Api::all(self.kube.client());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={}", self.node));
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        let mut pods: BTreeMap<String, Arc<Pod>> = BTreeMap::new();
        // A re-list in progress: the pods it has listed so far.
        let mut relist: Option<BTreeMap<String, Arc<Pod>>> = None;
        let mut listed_once = false;
        let mut failing = false;
        while let Some(ev) = events.next().await {
            let changed = match ev {
                Ok(Event::Init) => {
                    relist = Some(BTreeMap::new());
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
                    if !listed_once {
                        info!(pods = pods.len(), "pods bound to this node listed from the API server");
                    }
                    listed_once = true;
                    true
                }
                Ok(Event::Apply(p)) | Ok(Event::Delete(p)) if pod::is_mirror(&p) => {
                    if let Some(m) = &self.mirrors {
                        m.recheck(&p);
                    }
                    false
                }
                Ok(Event::Apply(p)) => {
                    let uid = pod::uid(&p).to_string();
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
                    continue;
                }
            };
            if failing {
                info!("watching this node's pods again");
                failing = false;
            }
            if changed && listed_once && relist.is_none() {
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
