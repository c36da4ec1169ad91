//! The mirror pods' own task: pod workers and housekeeping ask for mirrors here without waiting
//! for the API server (a sync of a static pod must not stall while it is away). Requests for one
//! static pod coalesce to its latest version; failures are retried with a capped back-off. The
//! UID of each static pod's current mirror is kept for the status manager, which writes a
//! static pod's status to its mirror.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{full_name, MirrorPods};
use crate::pod;

enum Request {
    /// The static pod (as it is now) should have a mirror.
    Ensure(Arc<Pod>),
    /// The static pod is gone from the node: its mirror goes too.
    Forget(Arc<Pod>),
    /// A mirror pod changed on the API server (deleted by someone?): check it again.
    Recheck(String),
    /// Delete the mirrors of static pods the node does not have (their full names).
    Cleanup(HashSet<String>),
}

/// Mirror pods by UID.
type SeenMirrors = BTreeMap<String, Arc<Pod>>;

/// The queue towards the mirror task; cheap to clone.
#[derive(Clone)]
pub struct MirrorQueue {
    tx: mpsc::UnboundedSender<Request>,
    /// Static pod full name -> its mirror's UID.
    uids: Arc<Mutex<HashMap<String, String>>>,
    /// The node's mirror pods by UID, as the watch of its pods shows them (kubelet's pod
    /// manager keeps them so); none until its first list. The orphan cleanup reads them here
    /// instead of listing the node's pods at every housekeeping.
    seen: Arc<Mutex<Option<SeenMirrors>>>,
}

impl MirrorQueue {
    pub fn start(mirrors: MirrorPods) -> MirrorQueue {
        let (tx, rx) = mpsc::unbounded_channel();
        let uids = Arc::new(Mutex::new(HashMap::new()));
        let seen = Arc::new(Mutex::new(None));
        tokio::spawn(run(mirrors, rx, uids.clone(), seen.clone()));
        MirrorQueue { tx, uids, seen }
    }

    pub fn ensure(&self, static_pod: Arc<Pod>) {
        let _ = self.tx.send(Request::Ensure(static_pod));
    }

    pub fn forget(&self, static_pod: Arc<Pod>) {
        let _ = self.tx.send(Request::Forget(static_pod));
    }

    /// The node's mirror pods, as a (re)list of its pods found them.
    pub fn listed(&self, mirrors: Vec<Pod>) {
        let by_uid = mirrors
            .into_iter()
            .map(|m| (pod::uid(&m).to_string(), Arc::new(m)))
            .collect();
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(by_uid);
    }

    /// A mirror pod was seen changing (or going, `deleted`) on the API server: kept as it is
    /// now, and its static pod's mirror checked again (one deleted by a user comes back).
    pub fn changed(&self, mirror: &Pod, deleted: bool) {
        if let Some(seen) = self.seen.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            let uid = pod::uid(mirror).to_string();
            if deleted {
                seen.remove(&uid);
            } else {
                seen.insert(uid, Arc::new(mirror.clone()));
            }
        }
        let _ = self.tx.send(Request::Recheck(full_name(mirror)));
    }

    pub fn cleanup(&self, static_full_names: HashSet<String>) {
        let _ = self.tx.send(Request::Cleanup(static_full_names));
    }

    /// The UID of the static pod's mirror, once there is one.
    pub fn mirror_uid(&self, static_pod: &Pod) -> Option<String> {
        self.uids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&full_name(static_pod))
            .cloned()
    }
}

const MAX_RETRY: Duration = Duration::from_secs(10);

async fn run(
    mirrors: MirrorPods,
    mut rx: mpsc::UnboundedReceiver<Request>,
    uids: Arc<Mutex<HashMap<String, String>>>,
    seen: Arc<Mutex<Option<SeenMirrors>>>,
) {
    // Static pods by full name, and which of them still need work.
    let mut statics: BTreeMap<String, Arc<Pod>> = BTreeMap::new();
    let mut todo: HashSet<String> = HashSet::new();
    let mut cleanup: Option<HashSet<String>> = None;
    // Static pods gone from the node whose mirror is still to be deleted.
    let mut gone: BTreeMap<String, Arc<Pod>> = BTreeMap::new();
    let mut retry = Duration::from_millis(500);
    let mut failing = false;
    loop {
        let busy = !todo.is_empty() || cleanup.is_some() || !gone.is_empty();
        let req = if busy && failing {
            tokio::select! {
                r = rx.recv() => match r { Some(r) => Some(r), None => return },
                _ = tokio::time::sleep(retry) => None,
            }
        } else if busy {
            rx.try_recv().ok()
        } else {
            match rx.recv().await {
                Some(r) => Some(r),
                None => return,
            }
        };
        let mut next = req;
        while let Some(r) = next.take() {
            match r {
                Request::Ensure(p) => {
                    let name = full_name(&p);
                    gone.remove(&name);
                    let changed = statics.get(&name).is_none_or(|old| {
                        pod::annotation(old, pod::CONFIG_HASH) != pod::annotation(&p, pod::CONFIG_HASH)
                    });
                    if changed || !uids.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&name) {
                        todo.insert(name.clone());
                    }
                    statics.insert(name, p);
                }
                Request::Forget(p) => {
                    let name = full_name(&p);
                    statics.remove(&name);
                    todo.remove(&name);
                    uids.lock().unwrap_or_else(|e| e.into_inner()).remove(&name);
                    gone.insert(name, p);
                }
                Request::Recheck(name) => {
                    if statics.contains_key(&name) {
                        todo.insert(name);
                    }
                }
                Request::Cleanup(names) => cleanup = Some(names),
            }
            next = rx.try_recv().ok();
        }
        let mut ok = true;
        for name in todo.clone() {
            let Some(p) = statics.get(&name).cloned() else {
                todo.remove(&name);
                continue;
            };
            match mirrors.ensure(&p).await {
                Ok(uid) => {
                    todo.remove(&name);
                    let mut u = uids.lock().unwrap_or_else(|e| e.into_inner());
                    match uid {
                        Some(uid) => u.insert(name, uid),
                        None => u.remove(&name),
                    };
                }
                Err(e) => {
                    if !failing {
                        warn!(pod = %name, error = %format!("{e:#}"), "mirror pod; will retry");
                    }
                    ok = false;
                    break;
                }
            }
        }
        for (name, p) in gone.clone() {
            if !ok {
                break;
            }
            match mirrors.delete_mirror_of(&p).await {
                Ok(_) => {
                    gone.remove(&name);
                }
                Err(e) => {
                    if !failing {
                        warn!(pod = %name, error = %format!("{e:#}"), "deleting the mirror pod; will retry");
                    }
                    ok = false;
                }
            }
        }
        if ok {
            // Before the first list of the node's pods nothing is known to be orphaned: the
            // next housekeeping asks again.
            let known: Option<Vec<Arc<Pod>>> = seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map(|s| s.values().cloned().collect());
            if let (Some(names), Some(known)) = (cleanup.take(), known) {
                match mirrors.delete_orphans(&names, &known).await {
                    Ok(n) if n > 0 => info!(count = n, "deleted orphaned mirror pods"),
                    Ok(_) => {}
                    Err(e) => {
                        if !failing {
                            warn!(error = %format!("{e:#}"), "cleaning up mirror pods; will retry");
                        }
                        cleanup = Some(names);
                        ok = false;
                    }
                }
            }
        }
        if ok {
            failing = false;
            retry = Duration::from_millis(500);
        } else {
            failing = true;
            retry = (retry * 2).min(MAX_RETRY);
        }
    }
}
