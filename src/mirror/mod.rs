//! Mirror pods (kubelet's pod/mirror_client.go and its use in syncPod and HandlePodCleanups):
//! for each static pod, a pod object in the API server that shows it to the cluster. A mirror
//! carries the static pod's config hash in `kubernetes.io/config.mirror` and is owned by the
//! Node; one whose hash is out of date, or that is being deleted, is deleted (UID precondition,
//! grace 0) and made again; one deleted by a user comes back at the next [`MirrorPods::ensure`];
//! one whose static pod is gone is deleted by [`MirrorPods::delete_orphans`], which finds them
//! among the mirror pods the watch of the node's pods shows (no list per housekeeping).
//!
//! NodeRestriction lets a node create only mirror pods bound to itself, owned by its own Node,
//! that reference no Secrets, ConfigMaps, ServiceAccount or PersistentVolumeClaims: a static pod
//! that does is refused, logged once, and runs without a mirror, as under kubelet.

mod object;
mod queue;

pub use object::{build, full_name, is_mirror_of};
pub use queue::MirrorQueue;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use tracing::{debug, error, info, warn};

use crate::kubeclient::Kube;
use crate::pod;
use crate::pod::{is_mirror, CONFIG_MIRROR};

/// The node's mirror pods; cheap to clone.
#[derive(Clone)]
pub struct MirrorPods {
    kube: Kube,
    node: Arc<str>,
    /// The Node object's UID, for the owner reference; fetched when first needed and again
    /// after a refusal (the Node may have been registered anew).
    node_uid: Arc<Mutex<Option<String>>>,
    /// Config hashes of static pods whose mirror the API server refused (logged once each).
    refused: Arc<Mutex<HashSet<String>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl MirrorPods {
    pub fn new(kube: Kube, node: &str) -> MirrorPods {
        MirrorPods {
            kube,
            node: node.into(),
            node_uid: Arc::new(Mutex::new(None)),
            refused: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.kube.client(), namespace)
    }

    /// The pod the API server has under `static_pod`'s name, if any (a mirror or not).
    pub async fn get(&self, static_pod: &Pod) -> Result<Option<Pod>> {
        self.pods(pod::namespace(static_pod))
            .get_opt(pod::name(static_pod))
            .await
            .with_context(|| format!("getting the mirror pod of {}", pod::full_name(static_pod)))
    }

    /// Make sure `static_pod` has an up-to-date mirror pod (kubelet's syncPod). Returns the
    /// mirror's UID, or none when there is none for now: the Node is gone or being deleted,
    /// NodeRestriction refused it, or an outdated one is still going away.
    pub async fn ensure(&self, static_pod: &Pod) -> Result<Option<String>> {
        let existing = self.get(static_pod).await?;
        self.reconcile(static_pod, existing.as_ref()).await
    }

    /// [`ensure`](Self::ensure) with the pod the API server has under the static pod's name
    /// already known (from a watch of the node's pods).
    pub async fn reconcile(&self, static_pod: &Pod, existing: Option<&Pod>) -> Result<Option<String>> {
        let full = pod::full_name(static_pod);
        if let Some(m) = existing {
            if !is_mirror(m) {
                bail!(
                    "static pod {full}: the API server has a pod of the same name that is not its mirror (uid {}); no mirror pod can be created",
                    pod::uid(m)
                );
            }
            if m.metadata.deletion_timestamp.is_none() && is_mirror_of(m, static_pod) {
                return Ok(Some(pod::uid(m).to_string()));
            }
            info!(pod = %full, mirror_uid = pod::uid(m), "deleting the mirror pod: it is outdated or being deleted");
            if !self.delete(pod::namespace(m), pod::name(m), Some(pod::uid(m))).await? {
                // Someone else deleted or replaced it; the next sync sees what is there now.
                return Ok(None);
            }
        }
        let Some(node_uid) = self.node_uid().await? else {
            debug!(pod = %full, "no mirror pod: the Node is gone or being deleted");
            return Ok(None);
        };
        let mirror = build(static_pod, &self.node, &node_uid);
        let hash = mirror
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CONFIG_MIRROR))
            .cloned()
            .unwrap_or_default();
        match self
            .pods(pod::namespace(static_pod))
            .create(&PostParams::default(), &mirror)
            .await
        {
            Ok(created) => {
                lock(&self.refused).remove(&hash);
                info!(pod = %full, mirror_uid = pod::uid(&created), "created the mirror pod");
                Ok(Some(pod::uid(&created).to_string()))
            }
            Err(kube::Error::Api(s)) if s.is_forbidden() || s.is_invalid() => {
                // Possibly the Node was registered anew: its UID is fetched again next time.
                *lock(&self.node_uid) = None;
                if lock(&self.refused).insert(hash) {
                    let why = if s.is_forbidden() {
                        "NodeRestriction allows a node only mirror pods bound to itself, owned by its Node, \
                         that reference no Secrets, ConfigMaps, ServiceAccount or PersistentVolumeClaims"
                    } else {
                        "the API server finds the pod invalid"
                    };
                    error!(
                        pod = %full,
                        "the API server refused the mirror pod: {}; the static pod runs without one ({why})",
                        s.message
                    );
                } else {
                    debug!(pod = %full, "mirror pod still refused: {}", s.message);
                }
                Ok(None)
            }
            Err(kube::Error::Api(s)) if s.is_already_exists() => Err(anyhow!(
                "creating the mirror pod of {full}: a pod of that name exists (an outdated one still terminating?)"
            )),
            Err(e) => Err(anyhow::Error::new(e).context(format!("creating the mirror pod of {full}"))),
        }
    }

    /// Delete the mirror pods of this node whose static pod is gone (kubelet's
    /// HandlePodCleanups): `known` are the node's mirror pods as the watch of its pods shows
    /// them; `static_full_names` holds the [`full_name`] of every static pod the node has,
    /// terminating ones included. Returns how many went; one that cannot be deleted is logged
    /// and tried again next time. No request is made when none is orphaned.
    pub async fn delete_orphans(&self, static_full_names: &HashSet<String>, known: &[Arc<Pod>]) -> Result<usize> {
        let mut deleted = 0;
        for m in known.iter().filter(|m| is_mirror(m)) {
            if static_full_names.contains(&full_name(m)) {
                continue;
            }
            info!(pod = %pod::full_name(m), "deleting an orphaned mirror pod: its static pod is gone");
            match self.delete(pod::namespace(m), pod::name(m), Some(pod::uid(m))).await {
                Ok(true) => deleted += 1,
                Ok(false) => {}
                Err(e) => warn!(pod = %pod::full_name(m), "{e:#}"),
            }
        }
        Ok(deleted)
    }

    /// Delete the mirror pod of a static pod the node no longer has (kubelet deletes it in its
    /// next cleanup); a pod of that name that is not a mirror is left alone. False when there
    /// was none.
    pub async fn delete_mirror_of(&self, static_pod: &Pod) -> Result<bool> {
        match self.get(static_pod).await? {
            Some(m) if is_mirror(&m) => {
                info!(pod = %pod::full_name(&m), "deleting the mirror pod: its static pod is gone");
                self.delete(pod::namespace(&m), pod::name(&m), Some(pod::uid(&m))).await
            }
            _ => Ok(false),
        }
    }

    /// Delete a mirror pod at once (grace 0), only if it is still the one with `uid`. False
    /// when it is already gone or has been replaced.
    async fn delete(&self, namespace: &str, name: &str, uid: Option<&str>) -> Result<bool> {
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: uid.map(|u| Preconditions {
                uid: Some(u.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.pods(namespace).delete(name, &dp).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => Ok(false),
            Err(e) => Err(anyhow::Error::new(e).context(format!("deleting mirror pod {namespace}/{name}"))),
        }
    }

    /// The Node's UID; none when the Node does not exist or is being deleted.
    async fn node_uid(&self) -> Result<Option<String>> {
        if let Some(u) = lock(&self.node_uid).clone() {
            return Ok(Some(u));
        }
        let node = Api::<Node>::all(self.kube.client())
            .get_opt(&self.node)
            .await
            .with_context(|| format!("getting Node {}", self.node))?;
        let Some(node) = node.filter(|n| n.metadata.deletion_timestamp.is_none()) else {
            return Ok(None);
        };
        let uid = node
            .metadata
            .uid
            .filter(|u| !u.is_empty())
            .ok_or_else(|| anyhow!("Node {} has no UID", self.node))?;
        *lock(&self.node_uid) = Some(uid.clone());
        Ok(Some(uid))
    }
}
