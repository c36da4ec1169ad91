//! The node's local checkpoint of what it got from the API server, so that a node that starts
//! while the server is away (a boot after a power cut, an agent restart during an outage) runs
//! the pods bound to it as if the server had sent them (docs/offline.md).
//!
//! Kept under `<root-dir>/checkpoint/` (0700):
//! - `pods/<uid>.json` (0600): one bound pod as last seen (spec, UID, resourceVersion), with the
//!   ConfigMaps and Secrets its volumes, env and image pulls use, its ServiceAccount tokens,
//!   its Service environment variables and its volumes' claims with their PersistentVolumes,
//!   as last fetched. One file a pod, so that a pod and
//!   what it uses are always written together, and a pod's removal removes everything of it.
//! - `node.json` (0600): this node's Node as last watched (its labels and taints judge
//!   admission while the server is away).
//!
//! Every write is atomic and durable (temp file, fsync, rename): a power cut leaves the old or
//! the new content. A file that cannot be read is reported by name and left out; the others
//! are restored. Secrets and tokens are in the pod files, which never exist with wider modes.
//!
//! What the checkpoint serves is stale by nature: [`View`] says since when the node has run
//! on it, for `/healthz?verbose` and the log.

mod view;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

pub use view::View;

/// Permission bits of the checkpoint's files: they hold Secrets and tokens.
const FILE_MODE: u32 = 0o600;

/// One pod's checkpoint: the pod and what it uses from the API server.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRecord {
    pub pod: Pod,
    /// ConfigMaps of the pod's namespace, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config_maps: BTreeMap<String, ConfigMap>,
    /// Secrets of the pod's namespace, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, Secret>,
    /// ServiceAccount tokens, by what they were asked for (see `objects::tokens`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tokens: BTreeMap<String, String>,
    /// The Service environment variables of the pod's containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_env: Option<Vec<(String, String)>>,
    /// The PersistentVolumeClaims of the pod's volumes and the PersistentVolumes bound to them,
    /// by volume name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub claims: BTreeMap<String, (PersistentVolumeClaim, PersistentVolume)>,
    /// This pod's record is not on disk yet (its write failed or is under way): the next
    /// [`Checkpoint::set_pods`] writes it even when the pod is unchanged (memory only).
    #[serde(skip)]
    unwritten: bool,
}

impl PodRecord {
    fn new(pod: Pod) -> PodRecord {
        PodRecord {
            pod,
            config_maps: BTreeMap::new(),
            secrets: BTreeMap::new(),
            tokens: BTreeMap::new(),
            service_env: None,
            claims: BTreeMap::new(),
            unwritten: false,
        }
    }

    fn namespace(&self) -> &str {
        crate::pod::namespace(&self.pod)
    }
}

/// The checkpoint: what is on disk, also held in memory (reads never touch the disk).
pub struct Checkpoint {
    dir: PathBuf,
    pods: Mutex<HashMap<String, PodRecord>>,
    node: Mutex<Option<Node>>,
    view: View,
}

/// A ConfigMap or a Secret, as the object manager hands them in.
pub enum Object<'a> {
    ConfigMap(&'a ConfigMap),
    Secret(&'a Secret),
}

impl Checkpoint {
    /// Open (creating) the checkpoint under `root_dir` and read what it holds.
    pub fn open(root_dir: &Path) -> Result<Arc<Checkpoint>> {
        let dir = root_dir.join("checkpoint");
        ferrolet_fsutil::ensure_private_dir(&dir)?;
        ferrolet_fsutil::ensure_private_dir(&dir.join("pods"))?;
        let mut pods = HashMap::new();
        let pods_dir = dir.join("pods");
        let listing = std::fs::read_dir(&pods_dir).with_context(|| format!("listing {}", pods_dir.display()))?;
        for e in listing.flatten() {
            let path = e.path();
            let Some(uid) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
                .filter(|n| !n.starts_with('.'))
            else {
                continue;
            };
            match ferrolet_fsutil::read_json::<PodRecord>(&path) {
                Ok(r) if r.pod.metadata.uid.as_deref() == Some(uid) => {
                    pods.insert(uid.to_string(), r);
                }
                Ok(_) => warn!(file = %path.display(), "a pod checkpoint whose pod has another UID; left out"),
                Err(e) => warn!(error = %ferrolet_fsutil::chain(&e), "a pod checkpoint cannot be read; left out"),
            }
        }
        let node = match ferrolet_fsutil::read_json_opt::<Node>(&dir.join("node.json")) {
            Ok(n) => n,
            Err(e) => {
                warn!(error = %ferrolet_fsutil::chain(&e), "the Node's checkpoint cannot be read; left out");
                None
            }
        };
        Ok(Arc::new(Checkpoint {
            dir,
            pods: Mutex::new(pods),
            node: Mutex::new(node),
            view: View::default(),
        }))
    }

    /// How current the node's view of the API server is.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// The pods as last seen, for a start without the API server.
    pub fn pods(&self) -> Vec<Pod> {
        let mut v: Vec<Pod> = self.lock_pods().values().map(|r| r.pod.clone()).collect();
        v.sort_by(|a, b| a.metadata.uid.cmp(&b.metadata.uid));
        v
    }

    /// Whether it holds no pod.
    pub fn is_empty(&self) -> bool {
        self.lock_pods().is_empty()
    }

    /// The Node as last watched.
    pub fn node(&self) -> Option<Node> {
        self.node.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn lock_pods(&self) -> std::sync::MutexGuard<'_, HashMap<String, PodRecord>> {
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pod_file(&self, uid: &str) -> PathBuf {
        self.dir.join("pods").join(format!("{uid}.json"))
    }

    fn write(&self, uid: &str, r: &PodRecord) -> Result<()> {
        let data = serde_json::to_vec(r).context("encoding a pod checkpoint")?;
        ferrolet_fsutil::write_atomic_mode(&self.pod_file(uid), &data, FILE_MODE)?;
        Ok(())
    }

    /// The API server's pods bound to this node, complete: each new or changed one (by its
    /// resourceVersion) is written, each one no longer there removed with what it used.
    /// The new and changed ones are written as one batch (a burst of new pods waits for the
    /// disk once, not once a pod). Blocks on the disk. Returns how many files it wrote and
    /// removed.
    pub fn set_pods(&self, pods: &[Arc<Pod>]) -> Result<(usize, usize)> {
        let mut held = self.lock_pods();
        let mut first_error = None;
        let (mut written, mut removed) = (0, 0);
        let mut seen = std::collections::HashSet::new();
        // (uid, encoded record) of each pod to write.
        let mut batch: Vec<(String, Vec<u8>)> = Vec::new();
        for p in pods {
            let Some(uid) = p.metadata.uid.as_deref().filter(|u| is_file_name(u)) else {
                continue;
            };
            seen.insert(uid.to_string());
            // A new resourceVersion that changed only the status (the node's own status
            // writes come back through the watch) or bookkeeping is not written: the pod runs
            // the same from either, and each write is an fsync.
            let same = held.get(uid).is_some_and(|r| {
                !r.unwritten
                    && (r.pod.metadata.resource_version == p.metadata.resource_version || as_run(&r.pod) == as_run(p))
            });
            if same {
                continue;
            }
            let mut r = held.remove(uid).unwrap_or_else(|| PodRecord::new(Pod::default()));
            r.pod = (**p).clone();
            // Not on disk until its batch is: a failure to encode or to write it has the next
            // snapshot write it again, changed or not.
            r.unwritten = true;
            match serde_json::to_vec(&r).context("encoding a pod checkpoint") {
                Ok(data) => batch.push((uid.to_string(), data)),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
            held.insert(uid.to_string(), r);
        }
        if !batch.is_empty() {
            let names: Vec<String> = batch.iter().map(|(uid, _)| format!("{uid}.json")).collect();
            let files: Vec<(&str, &[u8])> = names
                .iter()
                .zip(&batch)
                .map(|(n, (_, d))| (n.as_str(), d.as_slice()))
                .collect();
            match ferrolet_fsutil::write_atomic_in_mode(&self.dir.join("pods"), &files, FILE_MODE) {
                Ok(()) => {
                    written = files.len();
                    for (uid, _) in &batch {
                        if let Some(r) = held.get_mut(uid) {
                            r.unwritten = false;
                        }
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(anyhow::Error::new(e).context("writing the pods' checkpoints"));
                }
            }
        }
        let gone: Vec<String> = held.keys().filter(|u| !seen.contains(*u)).cloned().collect();
        for uid in gone {
            held.remove(&uid);
            match std::fs::remove_file(self.pod_file(&uid)) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    first_error
                        .get_or_insert(anyhow::Error::new(e).context(format!("removing the checkpoint of pod {uid}")));
                }
            }
        }
        if removed > 0 {
            ferrolet_fsutil::sync_dir(&self.dir.join("pods"));
        }
        debug!(written, removed, "pod checkpoints");
        match first_error {
            Some(e) => Err(e),
            None => Ok((written, removed)),
        }
    }

    /// A ConfigMap or Secret fetched for the pods `uids`: kept with each of them (written when
    /// it changed). Blocks on the disk.
    pub fn record_object(&self, uids: &[String], o: Object<'_>) -> Result<()> {
        let (ns, name, version) = match &o {
            Object::ConfigMap(c) => (&c.metadata.namespace, &c.metadata.name, &c.metadata.resource_version),
            Object::Secret(s) => (&s.metadata.namespace, &s.metadata.name, &s.metadata.resource_version),
        };
        let (Some(ns), Some(name)) = (ns.as_deref(), name.as_deref()) else {
            return Ok(());
        };
        self.update(uids, |r| {
            if r.namespace() != ns {
                return false;
            }
            match &o {
                Object::ConfigMap(c) => {
                    let old = r.config_maps.get(name);
                    if old.is_some_and(|old| old.metadata.resource_version == *version && old == *c) {
                        return false;
                    }
                    r.config_maps.insert(name.to_string(), (*c).clone());
                }
                Object::Secret(s) => {
                    let old = r.secrets.get(name);
                    if old.is_some_and(|old| old.metadata.resource_version == *version && old == *s) {
                        return false;
                    }
                    r.secrets.insert(name.to_string(), (*s).clone());
                }
            }
            true
        })
    }

    /// A ConfigMap or Secret the API server says does not exist (any more): forgotten by the
    /// pods `uids`, so the checkpoint never serves what was deleted.
    pub fn forget_object(&self, uids: &[String], ns: &str, name: &str, secret: bool) -> Result<()> {
        self.update(uids, |r| {
            r.namespace() == ns
                && if secret {
                    r.secrets.remove(name).is_some()
                } else {
                    r.config_maps.remove(name).is_some()
                }
        })
    }

    /// A token issued for pod `uid` (under `key`, what it was asked for).
    pub fn record_token(&self, uid: &str, key: &str, token: &str) -> Result<()> {
        self.update(&[uid.to_string()], |r| {
            if r.tokens.get(key).is_some_and(|t| t == token) {
                return false;
            }
            r.tokens.insert(key.to_string(), token.to_string());
            true
        })
    }

    /// The Service environment variables of pod `uid`'s containers.
    pub fn record_service_env(&self, uid: &str, env: &[(String, String)]) -> Result<()> {
        self.update(&[uid.to_string()], |r| {
            if r.service_env.as_deref() == Some(env) {
                return false;
            }
            r.service_env = Some(env.to_vec());
            true
        })
    }

    /// The claim of pod `uid`'s volume `volume` and the volume bound to it, as resolved.
    pub fn record_claim(
        &self,
        uid: &str,
        volume: &str,
        pvc: &PersistentVolumeClaim,
        pv: &PersistentVolume,
    ) -> Result<()> {
        self.update(&[uid.to_string()], |r| {
            if r.claims.get(volume).is_some_and(|(c, v)| c == pvc && v == pv) {
                return false;
            }
            r.claims.insert(volume.to_string(), (pvc.clone(), pv.clone()));
            true
        })
    }

    /// Change the records of `uids` (those the checkpoint holds); write those `f` changed.
    fn update(&self, uids: &[String], mut f: impl FnMut(&mut PodRecord) -> bool) -> Result<()> {
        let mut held = self.lock_pods();
        let mut first_error = None;
        for uid in uids {
            let Some(r) = held.get_mut(uid) else { continue };
            if f(r) {
                if let Err(e) = self.write(uid, r) {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// A ConfigMap of namespace `ns` as last fetched for any pod.
    pub fn config_map(&self, ns: &str, name: &str) -> Option<ConfigMap> {
        let held = self.lock_pods();
        newest(
            held.values()
                .filter(|r| r.namespace() == ns)
                .filter_map(|r| r.config_maps.get(name)),
            |c| &c.metadata.resource_version,
        )
        .cloned()
    }

    /// A Secret of namespace `ns` as last fetched for any pod.
    pub fn secret(&self, ns: &str, name: &str) -> Option<Secret> {
        let held = self.lock_pods();
        newest(
            held.values()
                .filter(|r| r.namespace() == ns)
                .filter_map(|r| r.secrets.get(name)),
            |s| &s.metadata.resource_version,
        )
        .cloned()
    }

    /// The token last issued for pod `uid` under `key`.
    pub fn token(&self, uid: &str, key: &str) -> Option<String> {
        self.lock_pods().get(uid)?.tokens.get(key).cloned()
    }

    /// The claim of pod `uid`'s volume `volume` and its volume, as last resolved.
    pub fn claim(&self, uid: &str, volume: &str) -> Option<(PersistentVolumeClaim, PersistentVolume)> {
        self.lock_pods().get(uid)?.claims.get(volume).cloned()
    }

    /// Pod `uid`'s Service environment variables as last computed.
    pub fn service_env(&self, uid: &str) -> Option<Vec<(String, String)>> {
        self.lock_pods().get(uid)?.service_env.clone()
    }

    /// The Node as watched: written when its resourceVersion changed. Blocks on the disk.
    pub fn set_node(&self, n: &Node) -> Result<()> {
        let mut held = self.node.lock().unwrap_or_else(|e| e.into_inner());
        if held
            .as_ref()
            .is_some_and(|h| h.metadata.resource_version == n.metadata.resource_version)
        {
            return Ok(());
        }
        let data = serde_json::to_vec(n).context("encoding the Node's checkpoint")?;
        ferrolet_fsutil::write_atomic_mode(&self.dir.join("node.json"), &data, FILE_MODE)?;
        *held = Some(n.clone());
        Ok(())
    }

    /// Bytes the checkpoint's files take (for the log and the closing numbers).
    pub fn disk_bytes(&self) -> u64 {
        let pods = std::fs::read_dir(self.dir.join("pods"))
            .map(|rd| rd.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0);
        pods + std::fs::metadata(self.dir.join("node.json")).map_or(0, |m| m.len())
    }
}

/// What of a pod decides how it runs: all but its status, resourceVersion, managedFields and
/// the annotation of when the node saw it.
fn as_run(p: &Pod) -> Pod {
    let mut p = p.clone();
    p.status = None;
    p.metadata.resource_version = None;
    p.metadata.managed_fields = None;
    if let Some(a) = p.metadata.annotations.as_mut() {
        a.remove(crate::pod::CONFIG_SEEN);
    }
    p
}

/// The one with the highest resourceVersion (resourceVersions are opaque strings, but etcd's
/// are numbers; equal lengths compare as numbers do).
fn newest<'a, T>(items: impl Iterator<Item = &'a T>, version: impl Fn(&T) -> &Option<String>) -> Option<&'a T> {
    items.max_by(|a, b| {
        let (a, b) = (version(a).as_deref().unwrap_or(""), version(b).as_deref().unwrap_or(""));
        a.len().cmp(&b.len()).then_with(|| a.cmp(b))
    })
}

/// A UID can name a file (no separators, not `.` or `..`).
fn is_file_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn pod(uid: &str, version: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("p-{uid}"), "namespace": "ns", "uid": uid, "resourceVersion": version},
                "spec": {"containers": [{"name": "c", "image": "busybox:1.35"}]}
            }))
            .unwrap(),
        )
    }

    fn config_map(name: &str, version: &str, value: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": version},
            "data": {"k": value}
        }))
        .unwrap()
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_pod_whose_write_failed_is_written_again_unchanged() {
        let root = tempfile::tempdir().unwrap();
        let c = Checkpoint::open(root.path()).unwrap();
        // The pods' directory is a file for a while: the batch cannot be written.
        let pods = c.dir.join("pods");
        std::fs::remove_dir_all(&pods).unwrap();
        std::fs::write(&pods, b"").unwrap();
        let e = c.set_pods(&[pod("a", "1"), pod("b", "1")]).unwrap_err();
        assert!(format!("{e:#}").contains("writing the pods' checkpoints"), "{e:#}");
        // Back: the same versions are written now, then no more.
        std::fs::remove_file(&pods).unwrap();
        std::fs::create_dir(&pods).unwrap();
        assert_eq!(c.set_pods(&[pod("a", "1"), pod("b", "1")]).unwrap(), (2, 0));
        assert_eq!(c.set_pods(&[pod("a", "1"), pod("b", "1")]).unwrap(), (0, 0));
        assert_eq!(Checkpoint::open(root.path()).unwrap().pods().len(), 2);
    }

    #[test]
    fn pods_and_objects_survive_a_reopen_and_go_with_their_pod() {
        let root = tempfile::tempdir().unwrap();
        let c = Checkpoint::open(root.path()).unwrap();
        assert_eq!(c.set_pods(&[pod("a", "1"), pod("b", "1")]).unwrap(), (2, 0));
        // The same versions again write nothing, nor does a new version that only changed
        // the status.
        assert_eq!(c.set_pods(&[pod("a", "1"), pod("b", "1")]).unwrap(), (0, 0));
        let mut status_only = (*pod("a", "7")).clone();
        status_only.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        assert_eq!(c.set_pods(&[Arc::new(status_only), pod("b", "1")]).unwrap(), (0, 0));
        c.record_object(&["a".into()], Object::ConfigMap(&config_map("cm", "5", "one")))
            .unwrap();
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s", "namespace": "ns", "resourceVersion": "6"},
            "data": {"k": "c2VjcmV0"}
        }))
        .unwrap();
        c.record_object(&["a".into(), "b".into()], Object::Secret(&secret))
            .unwrap();
        c.record_token("a", "default|api|3600", "tok").unwrap();
        c.record_service_env("b", &[("X_SERVICE_HOST".into(), "10.0.0.1".into())])
            .unwrap();

        let dir = root.path().join("checkpoint");
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("pods")), 0o700);
        assert_eq!(mode(&dir.join("pods/a.json")), 0o600);

        let again = Checkpoint::open(root.path()).unwrap();
        let uids: Vec<_> = again.pods().iter().map(|p| p.metadata.uid.clone().unwrap()).collect();
        assert_eq!(uids, ["a", "b"]);
        assert_eq!(again.config_map("ns", "cm").unwrap().data.unwrap()["k"], "one");
        assert!(again.config_map("other", "cm").is_none(), "namespaces are apart");
        assert!(again.secret("ns", "s").is_some());
        assert_eq!(again.token("a", "default|api|3600").as_deref(), Some("tok"));
        assert_eq!(again.service_env("b").unwrap()[0].0, "X_SERVICE_HOST");

        // A newer version of the ConfigMap replaces the old; a deleted one is forgotten.
        again
            .record_object(&["a".into()], Object::ConfigMap(&config_map("cm", "9", "two")))
            .unwrap();
        assert_eq!(again.config_map("ns", "cm").unwrap().data.unwrap()["k"], "two");
        again.forget_object(&["a".into()], "ns", "cm", false).unwrap();
        assert!(again.config_map("ns", "cm").is_none());

        // Pod a leaves the node: its file goes, with its token; b keeps the Secret.
        let mut relabeled = (*pod("b", "2")).clone();
        relabeled.metadata.labels = Some([("tier".to_string(), "edge".to_string())].into());
        assert_eq!(again.set_pods(&[Arc::new(relabeled)]).unwrap(), (1, 1));
        assert!(!dir.join("pods/a.json").exists());
        assert!(again.token("a", "default|api|3600").is_none());
        assert!(again.secret("ns", "s").is_some());
        let third = Checkpoint::open(root.path()).unwrap();
        assert_eq!(third.pods().len(), 1);
        assert_eq!(third.pods()[0].metadata.resource_version.as_deref(), Some("2"));
    }

    #[test]
    fn a_bad_file_is_left_out_and_the_others_restored() {
        let root = tempfile::tempdir().unwrap();
        let c = Checkpoint::open(root.path()).unwrap();
        c.set_pods(&[pod("a", "1")]).unwrap();
        let pods = root.path().join("checkpoint/pods");
        std::fs::write(pods.join("torn.json"), b"{\"pod\": {").unwrap();
        std::fs::write(
            pods.join("other.json"),
            serde_json::to_vec(&PodRecord::new((*pod("x", "1")).clone())).unwrap(),
        )
        .unwrap();
        let again = Checkpoint::open(root.path()).unwrap();
        let uids: Vec<_> = again.pods().iter().map(|p| p.metadata.uid.clone().unwrap()).collect();
        assert_eq!(
            uids,
            ["a"],
            "the torn file and the one under another pod's name are left out"
        );
    }

    #[test]
    fn the_node_is_written_when_its_version_changes() {
        let root = tempfile::tempdir().unwrap();
        let c = Checkpoint::open(root.path()).unwrap();
        assert!(c.node().is_none());
        let n: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "resourceVersion": "3", "labels": {"zone": "a"}}
        }))
        .unwrap();
        c.set_node(&n).unwrap();
        let file = root.path().join("checkpoint/node.json");
        assert_eq!(mode(&file), 0o600);
        let again = Checkpoint::open(root.path()).unwrap();
        assert_eq!(again.node().unwrap().metadata.labels.unwrap()["zone"], "a");
    }
}
