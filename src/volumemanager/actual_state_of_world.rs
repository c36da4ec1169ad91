//! kubelet's ActualStateOfWorld: the volumes set up on the node, per pod. It is rebuilt from the
//! disk when the agent starts (kubelet's reconstruction): every `<pods dir>/<uid>/volumes/
//! <plugin>/<name>` directory is a volume that was set up, a tmpfs still mounted over it is
//! kept with its content, so a restarted agent carries on with what is there instead of
//! setting everything up again (an emptyDir's files stay, fsGroup is not walked again).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::plugins::Plugin;
use super::volumes::{is_mountpoint, pod_volumes_dir};

/// A volume set up for a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedVolume {
    pub plugin: Plugin,
    pub path: PathBuf,
    /// A tmpfs is mounted over `path`.
    pub tmpfs: bool,
    /// Found on disk when the agent started, not set up by this agent.
    pub reconstructed: bool,
    /// `(namespace, name)` of the claim it is the volume of.
    pub claim: Option<(String, String)>,
}

#[derive(Debug, Default)]
pub struct ActualStateOfWorld {
    /// Pod UID -> volume name -> what is set up.
    pods: BTreeMap<String, BTreeMap<String, MountedVolume>>,
}

impl ActualStateOfWorld {
    /// What is set up under `pods_dir` (the agent's `<root>/pods`).
    pub fn reconstruct(pods_dir: &Path) -> ActualStateOfWorld {
        let mut out = ActualStateOfWorld::default();
        for pod in std::fs::read_dir(pods_dir).into_iter().flatten().flatten() {
            let uid = pod.file_name().to_string_lossy().into_owned();
            let base = pod_volumes_dir(&pod.path());
            for plugin_dir in std::fs::read_dir(&base).into_iter().flatten().flatten() {
                let Some(plugin) = Plugin::from_dir_name(&plugin_dir.file_name().to_string_lossy()) else {
                    continue;
                };
                for v in std::fs::read_dir(plugin_dir.path()).into_iter().flatten().flatten() {
                    let path = v.path();
                    if !path.is_dir() {
                        continue;
                    }
                    let name = v.file_name().to_string_lossy().into_owned();
                    let tmpfs = is_mountpoint(&path);
                    out.pods.entry(uid.clone()).or_default().insert(
                        name,
                        MountedVolume {
                            plugin,
                            path,
                            tmpfs,
                            reconstructed: true,
                            claim: None,
                        },
                    );
                }
            }
        }
        let n: usize = out.pods.values().map(BTreeMap::len).sum();
        if n > 0 {
            tracing::info!(volumes = n, pods = out.pods.len(), "volumes reconstructed from disk");
        }
        out
    }

    pub fn get(&self, uid: &str, volume: &str) -> Option<&MountedVolume> {
        self.pods.get(uid).and_then(|m| m.get(volume))
    }

    pub fn mark_mounted(&mut self, uid: &str, volume: &str, m: MountedVolume) {
        self.pods
            .entry(uid.to_string())
            .or_default()
            .insert(volume.to_string(), m);
    }

    pub fn mark_unmounted(&mut self, uid: &str, volume: &str) {
        if let Some(m) = self.pods.get_mut(uid) {
            m.remove(volume);
            if m.is_empty() {
                self.pods.remove(uid);
            }
        }
    }

    /// Whether any volume of the pod is set up.
    pub fn has_volumes(&self, uid: &str) -> bool {
        self.pods.get(uid).is_some_and(|m| !m.is_empty())
    }

    /// The pod's volumes as set up.
    pub fn pod_volumes(&self, uid: &str) -> Vec<(String, MountedVolume)> {
        self.pods
            .get(uid)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    pub fn pod_uids(&self) -> Vec<String> {
        self.pods.keys().cloned().collect()
    }
}
