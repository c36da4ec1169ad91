//! kubelet's volume manager: the volumes pods want ([`desired_state_of_world`], from their
//! specs), the volumes set up on the node ([`actual_state_of_world`], rebuilt from the disk
//! when the agent starts), and the [`reconciler`] that brings the one to the other. Which
//! plugin serves a volume, and which volume types are refused and why, is [`plugins`]; the
//! mechanics of each plugin (tmpfs, hostPath checks, fsGroup ownership, subPath binds) are in
//! [`volumes`], the files of object-backed volumes in [`payloads`], written by the
//! [`atomic_writer`].
//!
//! kubelet runs its reconciler in a loop of its own and has pod workers wait for it
//! (WaitForAttachAndMount); here the pod worker's sync runs the reconciler's pass for its pod
//! directly (the same order: desired state updated, then reconciled), so the result is the
//! volumes' locations or the FailedMount error at once. Pod syncs are at least every
//! syncFrequency, which is when configMap, secret, downwardAPI and projected volumes follow
//! their sources, as kubelet's.

pub mod actual_state_of_world;
mod atomic_writer;
pub mod csi;
pub mod desired_state_of_world;
mod payloads;
pub mod plugins;
pub mod reconciler;
pub mod volumes;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::objects::VolumeObjects;
use crate::pod::fieldpath::PodFacts;
use actual_state_of_world::ActualStateOfWorld;
use desired_state_of_world::DesiredStateOfWorld;
use volumes::VolumeHost;

pub struct VolumeManager {
    dsw: Mutex<DesiredStateOfWorld>,
    asw: Mutex<ActualStateOfWorld>,
    /// The node's CSI drivers, once the agent has them.
    csi: std::sync::OnceLock<csi::client::CsiClient>,
}

impl VolumeManager {
    /// The manager of the pods under `pods_dir`, with what is set up there already.
    pub fn new(pods_dir: &Path) -> VolumeManager {
        VolumeManager {
            dsw: Mutex::new(DesiredStateOfWorld::default()),
            asw: Mutex::new(ActualStateOfWorld::reconstruct(pods_dir)),
            csi: std::sync::OnceLock::new(),
        }
    }

    /// Serve csi volumes through `client` (set once; later calls change nothing).
    pub fn set_csi(&self, client: csi::client::CsiClient) {
        let _ = self.csi.set(client);
    }

    /// The pod's volumes, set up (blocking: mounts and fsync'd writes). `node` is the Node a
    /// PersistentVolume's node affinity is checked against. An error from a volume is a
    /// [`volumes::SetUpFailed`].
    pub fn mount_pod(
        &self,
        p: &Arc<Pod>,
        pod_dir: &Path,
        facts: &PodFacts,
        objects: &VolumeObjects,
        userns: Option<&reconciler::PodUserNamespace>,
        node: Option<&Node>,
    ) -> Result<BTreeMap<String, VolumeHost>> {
        let want = self
            .dsw
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add_pod(p, pod_dir, &objects.claims);
        let inputs = reconciler::SetUpInputs {
            facts,
            objects,
            userns,
            csi: self.csi.get(),
            node,
        };
        reconciler::reconcile_pod(&self.asw, &want, &inputs)
    }

    /// [`mount_pod`](Self::mount_pod) for a pod that has no volumes and none still set up:
    /// its pass has nothing to do on the disk, so it runs in place, with no hand-off to a
    /// blocking thread at every resync. None when the pod has volumes, or some are set up.
    pub fn mount_pod_without_volumes(&self, p: &Arc<Pod>, pod_dir: &Path) -> Option<BTreeMap<String, VolumeHost>> {
        if crate::pod::spec(p).volumes.as_ref().is_some_and(|v| !v.is_empty()) {
            return None;
        }
        if self
            .asw
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .has_volumes(crate::pod::uid(p))
        {
            return None;
        }
        self.dsw
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add_pod(p, pod_dir, &BTreeMap::new());
        Some(BTreeMap::new())
    }

    /// The pod is going: tear down every volume set up for it (blocking), its subPath binds,
    /// and whatever else is under its volumes dir (a volume of an earlier agent that was never
    /// reconstructed). Its containers must be gone.
    pub fn unmount_pod(&self, uid: &str, pod_dir: &Path) -> Result<()> {
        self.dsw.lock().unwrap_or_else(|e| e.into_inner()).delete_pod(uid);
        let mounted = self.asw.lock().unwrap_or_else(|e| e.into_inner()).pod_volumes(uid);
        let mut first_err = None;
        for (name, m) in mounted {
            match reconciler::tear_down(&m, pod_dir, self.csi.get()) {
                Ok(()) => {
                    tracing::debug!(pod_uid = uid, volume = %name, "UnmountVolume.TearDown succeeded");
                    self.asw
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .mark_unmounted(uid, &name);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        // CSI volumes whose set-up failed part way never reached the actual state: their
        // drivers undo them too, from their vol_data.json.
        if let Some(c) = self.csi.get() {
            csi::volume::sweep(c, pod_dir)?;
        }
        volumes::teardown(pod_dir)?;
        // hostPaths stay in the actual state until here: nothing to undo for them.
        let left: Vec<String> = self
            .asw
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pod_volumes(uid)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let mut asw = self.asw.lock().unwrap_or_else(|e| e.into_inner());
        for n in left {
            asw.mark_unmounted(uid, &n);
        }
        Ok(())
    }

    /// Pods that have volumes set up on the node (the actual state).
    pub fn pods_with_volumes(&self) -> Vec<String> {
        self.asw.lock().unwrap_or_else(|e| e.into_inner()).pod_uids()
    }

    /// The pod's volumes that are claims' PersistentVolumes, as set up: the volume's name,
    /// where it is on the node, and `(namespace, name)` of its claim (for `/stats/summary`).
    pub fn claimed_volumes(&self, uid: &str) -> Vec<(String, std::path::PathBuf, (String, String))> {
        self.asw
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pod_volumes(uid)
            .into_iter()
            .filter_map(|(name, m)| {
                // A CSI volume is its driver's mount inside the volume's directory.
                let path = match m.plugin {
                    plugins::Plugin::Csi => m.path.join("mount"),
                    _ => m.path,
                };
                Some((name, path, m.claim?))
            })
            .collect()
    }

    /// kubelet's GetVolumesInUse, for the Node's `status.volumesInUse`: the unique names
    /// (`kubernetes.io/csi/<driver>^<volume handle>`) of the claims' CSI volumes pods want or
    /// still have set up (the attach-detach controller does not detach a volume a node reports
    /// in use). Inline CSI volumes are neither attached nor staged: not reported, as in kubelet.
    pub fn volumes_in_use(&self) -> Vec<String> {
        let unique = |driver: &str, handle: &str| format!("kubernetes.io/csi/{driver}^{handle}");
        let mut out = std::collections::BTreeSet::new();
        for p in self.dsw.lock().unwrap_or_else(|e| e.into_inner()).pods() {
            for v in &p.volumes {
                let source = v
                    .claim
                    .as_ref()
                    .and_then(|c| c.volume.spec.as_ref())
                    .and_then(|s| s.csi.as_ref());
                if let Some(s) = source {
                    out.insert(unique(&s.driver, &s.volume_handle));
                }
            }
        }
        let set_up: Vec<std::path::PathBuf> = {
            let asw = self.asw.lock().unwrap_or_else(|e| e.into_inner());
            asw.pod_uids()
                .iter()
                .flat_map(|u| asw.pod_volumes(u))
                .filter(|(_, m)| m.plugin == plugins::Plugin::Csi)
                .map(|(_, m)| m.path)
                .collect()
        };
        for dir in set_up {
            if let Ok(d) = csi::VolData::load(&dir) {
                if d.volume_lifecycle_mode != "Ephemeral" {
                    out.insert(unique(&d.driver_name, &d.volume_handle));
                }
            }
        }
        out.into_iter().collect()
    }

    /// Whether the pod is among those whose volumes are wanted.
    pub fn is_desired(&self, uid: &str) -> bool {
        self.dsw.lock().unwrap_or_else(|e| e.into_inner()).has_pod(uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects;
    use std::os::unix::fs::MetadataExt;

    fn facts() -> PodFacts {
        PodFacts {
            node_memory: 1 << 30,
            ..Default::default()
        }
    }

    #[test]
    fn a_pod_without_volumes_is_answered_in_place_unless_some_are_set_up() {
        let t = tempfile::tempdir().unwrap();
        let vm = VolumeManager::new(t.path());
        let pod = |uid: &str, volumes: serde_json::Value| -> Arc<Pod> {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "p", "namespace": "ns", "uid": uid},
                    "spec": {"containers": [{"name": "c"}], "volumes": volumes}
                }))
                .unwrap(),
            )
        };
        let bare = pod("u1", serde_json::json!([]));
        let got = vm.mount_pod_without_volumes(&bare, &t.path().join("u1"));
        assert!(got.is_some_and(|m| m.is_empty()));
        assert!(vm.dsw.lock().unwrap().has_pod("u1"), "the pod is in the desired state");
        // A pod with a volume takes the full pass.
        let with = pod("u2", serde_json::json!([{"name": "scratch", "emptyDir": {}}]));
        assert!(vm.mount_pod_without_volumes(&with, &t.path().join("u2")).is_none());
        assert!(!vm.dsw.lock().unwrap().has_pod("u2"));
        // So does a pod without volumes in its spec that still has one set up (found on the
        // disk at start): the full pass tears it down.
        vm.asw.lock().unwrap().mark_mounted(
            "u3",
            "old",
            actual_state_of_world::MountedVolume {
                plugin: plugins::Plugin::EmptyDir,
                path: t.path().join("u3/volumes/kubernetes.io~empty-dir/old"),
                tmpfs: false,
                reconstructed: true,
                claim: None,
            },
        );
        let left = pod("u3", serde_json::json!(null));
        assert!(vm.mount_pod_without_volumes(&left, &t.path().join("u3")).is_none());
    }

    #[test]
    fn config_map_and_downward_api_volumes_update_in_place() {
        let t = tempfile::tempdir().unwrap();
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c"}], "volumes": [
                {"name": "cfg", "configMap": {"name": "cfg", "items": [{"key": "k", "path": "conf/k.txt"}]}},
                {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}
            ]}
        }))
        .unwrap();
        let objects = |v: &str| {
            let cm: k8s_openapi::api::core::v1::ConfigMap =
                serde_json::from_value(serde_json::json!({"metadata": {"name": "cfg"}, "data": {"k": v}})).unwrap();
            let mut o = VolumeObjects::default();
            o.config_maps.insert("cfg".into(), Ok(Some(std::sync::Arc::new(cm))));
            o
        };
        let p = Arc::new(p);
        let vm = VolumeManager::new(t.path());
        let dir = t.path().join("u");
        let hosts = vm.mount_pod(&p, &dir, &facts(), &objects("one"), None, None).unwrap();
        let cfg = &hosts["cfg"];
        assert!(cfg.readonly && cfg.path.ends_with("volumes/kubernetes.io~configmap/cfg"));
        assert_eq!(std::fs::read_to_string(cfg.path.join("conf/k.txt")).unwrap(), "one");
        assert_eq!(
            std::fs::read_link(cfg.path.join("conf")).unwrap(),
            Path::new("..data/conf")
        );
        let info = &hosts["info"];
        assert_eq!(
            std::fs::read_to_string(info.path.join("labels")).unwrap(),
            "app=\"web\""
        );
        let before = std::fs::read_link(cfg.path.join(atomic_writer::DATA_DIR)).unwrap();
        vm.mount_pod(&p, &dir, &facts(), &objects("two"), None, None).unwrap();
        assert_eq!(std::fs::read_to_string(cfg.path.join("conf/k.txt")).unwrap(), "two");
        assert_ne!(
            std::fs::read_link(cfg.path.join(atomic_writer::DATA_DIR)).unwrap(),
            before
        );
        // A missing configMap names itself as kubelet does.
        let mut none = VolumeObjects::default();
        none.config_maps.insert("cfg".into(), Ok(None));
        let e = vm.mount_pod(&p, &dir, &facts(), &none, None, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "MountVolume.SetUp failed for volume \"cfg\" : configmap \"cfg\" not found"
        );
        vm.unmount_pod("u", &dir).unwrap();
        assert!(!dir.join("volumes").exists());
    }

    #[test]
    fn a_restarted_manager_converges_instead_of_redoing() {
        let t = tempfile::tempdir().unwrap();
        let p: Arc<Pod> = Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
                "spec": {"securityContext": {"fsGroup": 3456}, "containers": [{"name": "c"}], "volumes": [
                    {"name": "scratch", "emptyDir": {}},
                    {"name": "pvc", "persistentVolumeClaim": {"claimName": "data"}}
                ]}
            }))
            .unwrap(),
        );
        let dir = t.path().join("u");
        let vm = VolumeManager::new(t.path());
        // The refused volume names itself and its type.
        let e = vm
            .mount_pod(&p, &dir, &facts(), &VolumeObjects::default(), None, None)
            .unwrap_err();
        assert!(
            e.to_string().starts_with(
                "MountVolume.SetUp failed for volume \"pvc\" : claim \"data\": a claim is resolved through the API server"
            ),
            "{e}"
        );
        let mut p2 = (*p).clone();
        p2.spec.as_mut().unwrap().volumes.as_mut().unwrap().pop();
        let p = Arc::new(p2);
        let hosts = vm
            .mount_pod(&p, &dir, &facts(), &VolumeObjects::default(), None, None)
            .unwrap();
        let scratch = hosts["scratch"].path.clone();
        assert_eq!(std::fs::metadata(&scratch).unwrap().gid(), 3456);
        // What a container wrote, owned by another group.
        std::fs::write(scratch.join("kept"), "x").unwrap();
        std::os::unix::fs::lchown(scratch.join("kept"), None, Some(0)).unwrap();
        drop(vm);
        // A new agent finds the volume set up: its files stay and fsGroup is not walked again.
        let vm = VolumeManager::new(t.path());
        assert_eq!(vm.pods_with_volumes(), ["u"]);
        vm.mount_pod(&p, &dir, &facts(), &VolumeObjects::default(), None, None)
            .unwrap();
        assert_eq!(std::fs::metadata(scratch.join("kept")).unwrap().gid(), 0);
        vm.unmount_pod("u", &dir).unwrap();
        assert!(vm.pods_with_volumes().is_empty());
        assert!(!scratch.exists());
    }

    #[test]
    fn a_claims_csi_volume_is_in_use_while_its_pod_wants_it() {
        let t = tempfile::tempdir().unwrap();
        let p: Arc<Pod> = Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "db-0", "namespace": "ns", "uid": "u"},
                "spec": {"containers": [{"name": "c"}], "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}}
                ]}
            }))
            .unwrap(),
        );
        let mut o = VolumeObjects::default();
        o.claims.insert(
            "data".into(),
            Ok(Arc::new(objects::claims::BoundClaim {
                claim: serde_json::from_value(
                    serde_json::json!({"metadata": {"name": "data-db-0", "namespace": "ns"}}),
                )
                .unwrap(),
                volume: serde_json::from_value(serde_json::json!({"metadata": {"name": "pv-1"}, "spec": {
                    "csi": {"driver": "drv.example.com", "volumeHandle": "h1"}}}))
                .unwrap(),
            })),
        );
        let vm = VolumeManager::new(&t.path().join("pods"));
        assert!(vm.volumes_in_use().is_empty());
        // No CSI driver here: the set-up fails, and the volume is in use all the same (the
        // pod wants it, and a controller must not detach it meanwhile).
        let dir = t.path().join("pods/u");
        let e = vm.mount_pod(&p, &dir, &facts(), &o, None, None).unwrap_err();
        assert!(e.to_string().contains("no CSI drivers"), "{e}");
        assert_eq!(vm.volumes_in_use(), ["kubernetes.io/csi/drv.example.com^h1"]);
        vm.unmount_pod("u", &dir).unwrap();
        assert!(vm.volumes_in_use().is_empty());
    }

    #[test]
    fn claims_of_local_and_host_path_volumes_are_used_in_place() {
        let t = tempfile::tempdir().unwrap();
        let data = t.path().join("disk");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("old"), "kept").unwrap();
        let p: Arc<Pod> = Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web-0", "namespace": "ns", "uid": "u"},
                "spec": {"securityContext": {"fsGroup": 2345}, "containers": [{"name": "c"}], "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}},
                    {"name": "logs", "persistentVolumeClaim": {"claimName": "logs", "readOnly": true}}
                ]}
            }))
            .unwrap(),
        );
        let bound = |claim: &str, pv: serde_json::Value| -> objects::claims::ClaimLookup {
            Ok(Arc::new(objects::claims::BoundClaim {
                claim: serde_json::from_value(serde_json::json!({"metadata": {"name": claim, "namespace": "ns"}}))
                    .unwrap(),
                volume: serde_json::from_value(pv).unwrap(),
            }))
        };
        let affinity = |host: &str| {
            serde_json::json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [host]}]}]}})
        };
        let objects_for = |host: &str| {
            let mut o = VolumeObjects::default();
            o.claims.insert(
                "data".into(),
                bound(
                    "data-web-0",
                    serde_json::json!({"metadata": {"name": "pv-local"}, "spec": {
                        "local": {"path": data}, "nodeAffinity": affinity(host)}}),
                ),
            );
            o.claims.insert(
                "logs".into(),
                bound(
                    "logs",
                    serde_json::json!({"metadata": {"name": "pv-host"}, "spec": {
                        "hostPath": {"path": t.path(), "type": "Directory"}}}),
                ),
            );
            o
        };
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}}
        }))
        .unwrap();
        let dir = t.path().join("pods/u");
        let vm = VolumeManager::new(&t.path().join("pods"));
        // A volume whose node affinity leaves this node out is refused, naming it.
        let e = vm
            .mount_pod(&p, &dir, &facts(), &objects_for("n2"), None, Some(&node))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "MountVolume.SetUp failed for volume \"data\" : PersistentVolume \"pv-local\" node affinity: no matching NodeSelectorTerms for this node"
        );
        let hosts = vm
            .mount_pod(&p, &dir, &facts(), &objects_for("n1"), None, Some(&node))
            .unwrap();
        assert_eq!(hosts["data"].path, data);
        assert!(!hosts["data"].readonly);
        assert_eq!(hosts["logs"].path, t.path());
        assert!(hosts["logs"].readonly, "persistentVolumeClaim.readOnly");
        // The pod's fsGroup owns the writable local volume, as kubelet's local plugin does.
        assert_eq!(std::fs::metadata(&data).unwrap().gid(), 2345);
        assert_eq!(std::fs::metadata(data.join("old")).unwrap().gid(), 2345);
        // A claim that could not be resolved names its reason.
        let mut o = objects_for("n1");
        o.claims
            .insert("data".into(), Err("PVC ns/data-web-0 is pending".into()));
        let e = vm.mount_pod(&p, &dir, &facts(), &o, None, Some(&node)).unwrap_err();
        assert!(e.to_string().ends_with(": PVC ns/data-web-0 is pending"), "{e}");
        // The pod's removal leaves the node's directories and their data alone.
        vm.unmount_pod("u", &dir).unwrap();
        assert_eq!(std::fs::read_to_string(data.join("old")).unwrap(), "kept");
        assert!(t.path().is_dir());
    }
}
