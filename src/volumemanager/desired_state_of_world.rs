//! kubelet's DesiredStateOfWorld: the volumes the pods on the node should have, from their
//! specs. A pod is added when its worker syncs it and deleted when it is torn down; each of
//! its volumes is named with the plugin that serves it, or why none does. A volume backed by a
//! claim (`persistentVolumeClaim`, `ephemeral`) carries its claim and PersistentVolume, as
//! the object manager resolved them, and is served by the PersistentVolume's plugin.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Volume};

use super::plugins::{plugin_for, plugin_for_pv, Plugin};
use crate::objects::claims::{claim_name, BoundClaim, ClaimLookup};
use crate::pod;

/// One volume a pod wants.
#[derive(Debug, Clone)]
pub struct VolumeToMount {
    pub spec: Volume,
    pub plugin: Result<Plugin, String>,
    /// The claim and its PersistentVolume, for a volume backed by one.
    pub claim: Option<Arc<BoundClaim>>,
}

impl VolumeToMount {
    pub fn name(&self) -> &str {
        &self.spec.name
    }
}

/// A pod and its volumes.
#[derive(Debug, Clone)]
pub struct PodToMount {
    pub pod: Arc<Pod>,
    pub pod_dir: PathBuf,
    pub volumes: Vec<VolumeToMount>,
}

#[derive(Debug, Default)]
pub struct DesiredStateOfWorld {
    pods: BTreeMap<String, PodToMount>,
}

impl DesiredStateOfWorld {
    /// Add the pod, or take its latest version (labels and annotations of a downwardAPI volume
    /// follow it), with its volumes' claims as resolved; returns what it wants.
    pub fn add_pod(&mut self, p: &Arc<Pod>, pod_dir: &Path, claims: &BTreeMap<String, ClaimLookup>) -> PodToMount {
        let volumes = pod::spec(p)
            .volumes
            .iter()
            .flatten()
            .map(|v| {
                let Some((claim, _)) = claim_name(p, v) else {
                    return VolumeToMount {
                        spec: v.clone(),
                        plugin: plugin_for(v),
                        claim: None,
                    };
                };
                let found = match claims.get(&v.name) {
                    Some(Ok(b)) => Ok(b.clone()),
                    Some(Err(e)) => Err(e.clone()),
                    None => Err(format!(
                        "claim {claim:?}: a claim is resolved through the API server, and this pod did not come from one (a static pod cannot use claims; give it a hostPath or local volume)"
                    )),
                };
                VolumeToMount {
                    spec: v.clone(),
                    plugin: found.as_ref().map_err(Clone::clone).and_then(|b| plugin_for_pv(&b.volume)),
                    claim: found.ok(),
                }
            })
            .collect();
        let entry = PodToMount {
            pod: p.clone(),
            pod_dir: pod_dir.to_path_buf(),
            volumes,
        };
        self.pods.insert(pod::uid(p).to_string(), entry.clone());
        entry
    }

    pub fn delete_pod(&mut self, uid: &str) {
        self.pods.remove(uid);
    }

    pub fn has_pod(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }

    /// Whether the pod wants a volume of this name.
    pub fn wants(&self, uid: &str, volume: &str) -> bool {
        self.pods
            .get(uid)
            .is_some_and(|p| p.volumes.iter().any(|v| v.name() == volume))
    }

    pub fn pods(&self) -> impl Iterator<Item = &PodToMount> {
        self.pods.values()
    }
}
