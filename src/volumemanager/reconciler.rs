//! kubelet's reconciler: brings the actual state of the world to the desired one. Volumes a pod
//! wants that are not set up are set up (MountVolume.SetUp); volumes of files are rewritten
//! through the atomic writer on every pass (kubelet's remount of configMap, secret, downwardAPI
//! and projected volumes at each pod sync), which writes nothing when their content is the same;
//! volumes set up that no pod wants any more are torn down. What the actual state already has
//! (also what was reconstructed from the disk after a restart) is not done again.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, Result};

use super::actual_state_of_world::{ActualStateOfWorld, MountedVolume};
use super::csi::client::CsiClient;
use super::desired_state_of_world::{PodToMount, VolumeToMount};
use super::payloads;
use super::plugins::Plugin;
use super::volumes::{self, is_mountpoint, pod_volumes_dir, FsGroup, SetUpFailed, VolumeHost};
use crate::cm::pod_container_manager::PodCgroups;
use crate::objects::claims::BoundClaim;
use crate::objects::VolumeObjects;
use crate::pod;
use crate::pod::fieldpath::PodFacts;

/// What setting up a pod's volumes reads besides the pod.
pub struct SetUpInputs<'a> {
    pub facts: &'a PodFacts,
    pub objects: &'a VolumeObjects,
    /// The pod's user namespace (its pin and range), for a pod with `hostUsers: false`.
    pub userns: Option<&'a PodUserNamespace>,
    /// The node's CSI drivers, for csi volumes (none: such a volume fails, saying so).
    pub csi: Option<&'a CsiClient>,
    /// The Node, for the node affinity of PersistentVolumes.
    pub node: Option<&'a k8s_openapi::api::core::v1::Node>,
}

/// A pod's user namespace as its volumes are set up for it.
#[derive(Debug, Clone)]
pub struct PodUserNamespace {
    pub pin: std::path::PathBuf,
    pub range: ferrolet_runtime::namespaces::IdRange,
}

/// Set up every volume of `want` not set up yet, refresh the volumes of files, and tear down
/// what the pod no longer has; returns where each volume lives on the node. The first volume
/// that fails stops the pass with a [`SetUpFailed`] (the pod's FailedMount).
pub fn reconcile_pod(
    asw: &std::sync::Mutex<ActualStateOfWorld>,
    want: &PodToMount,
    inputs: &SetUpInputs<'_>,
) -> Result<BTreeMap<String, VolumeHost>> {
    let uid = pod::uid(&want.pod).to_string();
    let lock = || asw.lock().unwrap_or_else(|e| e.into_inner());
    // Volumes the pod no longer has (its spec changed in place).
    let stale: Vec<(String, MountedVolume)> = lock()
        .pod_volumes(&uid)
        .into_iter()
        .filter(|(name, _)| !want.volumes.iter().any(|v| v.name() == name))
        .collect();
    for (name, m) in stale {
        tear_down(&m, &want.pod_dir, inputs.csi)?;
        tracing::info!(pod = %pod::full_name(&want.pod), volume = %name, "UnmountVolume.TearDown succeeded");
        lock().mark_unmounted(&uid, &name);
    }
    let mut out = BTreeMap::new();
    for v in &want.volumes {
        let existing = lock().get(&uid, v.name()).cloned();
        let (host, mounted) = mount_volume(want, v, existing.as_ref(), inputs).map_err(|e| SetUpFailed {
            volume: v.name().to_string(),
            message: format!("{e:#}"),
        })?;
        if existing.as_ref() != Some(&mounted) {
            if existing.is_none() {
                tracing::info!(
                    pod = %pod::full_name(&want.pod),
                    volume = v.name(),
                    plugin = mounted.plugin.name(),
                    "MountVolume.SetUp succeeded"
                );
            }
            lock().mark_mounted(&uid, v.name(), mounted);
        }
        out.insert(v.name().to_string(), host);
    }
    Ok(out)
}

/// Bring one volume to what the pod wants.
fn mount_volume(
    want: &PodToMount,
    v: &VolumeToMount,
    existing: Option<&MountedVolume>,
    inputs: &SetUpInputs<'_>,
) -> Result<(VolumeHost, MountedVolume)> {
    let plugin = v.plugin.clone().map_err(|e| anyhow!(e))?;
    let p = &want.pod;
    let dir = pod_volumes_dir(&want.pod_dir).join(plugin.dir_name()).join(v.name());
    let fs_group = FsGroup::of(p);
    let memory_size = |size_limit: Option<i64>| {
        let pod_limit = PodCgroups::limits_for(p, &Default::default()).memory_limit;
        volumes::empty_dir_memory_size(inputs.facts.node_memory, pod_limit, size_limit)
    };
    let mut mounted = MountedVolume {
        plugin,
        path: dir.clone(),
        tmpfs: false,
        reconstructed: existing.is_some_and(|e| e.reconstructed),
        claim: v.claim.as_ref().map(|c| c.claim_ref()),
    };
    let host = match plugin {
        Plugin::Csi => {
            let csi = inputs
                .csi
                .ok_or_else(|| anyhow!("this node has no CSI drivers (the plugin watcher is not running)"))?;
            let mut vol = match &v.claim {
                // A claim's CSI PersistentVolume: attached, staged and published.
                Some(c) => {
                    if existing.is_none() {
                        check_persistent_volume(c, inputs.node)?;
                    }
                    super::csi::volume::CsiVolume::from_pv(&c.volume, claim_read_only(v))?
                }
                // An inline (ephemeral) CSI volume: published only.
                None => super::csi::volume::CsiVolume::inline(p, &v.spec)?,
            };
            // Secrets are needed only to set the volume up: one published already (every later
            // sync, and while the API server is away) never waits on them.
            if !super::csi::volume::is_mounted(&super::csi::target_path(&want.pod_dir, v.name())) {
                csi_secrets(&mut vol, v, pod::namespace(p), inputs.objects)?;
            }
            let path = super::csi::volume::set_up(csi, p, &want.pod_dir, v.name(), &vol, fs_group)?;
            VolumeHost {
                path,
                readonly: vol.read_only,
                writable_by_us: false,
                idmap: false,
            }
        }
        Plugin::EmptyDir => {
            let e = v.spec.empty_dir.clone().unwrap_or_default();
            let memory = e.medium.as_deref() == Some("Memory");
            mounted.tmpfs = memory;
            // Set up once; a restart finds it set up (a memory one still mounted).
            let done = existing.is_some_and(|m| m.plugin == plugin && dir.is_dir() && (!memory || is_mountpoint(&dir)));
            if !done {
                let size = match (&e.size_limit, memory) {
                    (Some(q), true) => Some(memory_size(Some(
                        crate::pod::units::bytes(&q.0).map_err(|e| anyhow!("sizeLimit: {e}"))?,
                    ))),
                    (None, true) => Some(memory_size(None)),
                    (_, false) => None,
                };
                volumes::set_up_empty_dir(&dir, size, fs_group)?;
            }
            VolumeHost {
                path: dir,
                readonly: false,
                writable_by_us: true,
                idmap: false,
            }
        }
        Plugin::HostPath => {
            let pv_spec = v.claim.as_ref().and_then(|c| c.volume.spec.as_ref());
            let h = match pv_spec {
                Some(s) => s.host_path.clone().unwrap_or_default(),
                None => v.spec.host_path.clone().unwrap_or_default(),
            };
            let path = std::path::PathBuf::from(&h.path);
            if existing.is_none() {
                if let Some(c) = &v.claim {
                    check_persistent_volume(c, inputs.node)?;
                }
                volumes::check_host_path(&path, h.type_.as_deref().unwrap_or(""))?;
            }
            mounted.path = path.clone();
            VolumeHost {
                path,
                readonly: claim_read_only(v),
                writable_by_us: false,
                idmap: false,
            }
        }
        Plugin::LocalVolume => {
            let c = v
                .claim
                .as_ref()
                .ok_or_else(|| anyhow!("a local volume is a PersistentVolume's, through a claim"))?;
            let local = c.volume.spec.as_ref().and_then(|s| s.local.clone()).unwrap_or_default();
            let path = std::path::PathBuf::from(&local.path);
            let readonly = claim_read_only(v);
            if existing.is_none() {
                check_persistent_volume(c, inputs.node)?;
                volumes::check_local_volume(c.volume_name(), &path)?;
                // kubelet's local volume: the pod's fsGroup on a writable one.
                if let (Some(g), false) = (fs_group, readonly) {
                    volumes::set_volume_ownership(&path, g, false)?;
                }
            }
            mounted.path = path.clone();
            VolumeHost {
                path,
                readonly,
                writable_by_us: false,
                idmap: false,
            }
        }
        Plugin::ConfigMap | Plugin::Secret | Plugin::DownwardApi | Plugin::Projected => {
            let payload = match plugin {
                Plugin::DownwardApi => {
                    let d = v.spec.downward_api.clone().unwrap_or_default();
                    let mode = d.default_mode.unwrap_or(payloads::DEFAULT_MODE);
                    payloads::downward_api(p, d.items.as_deref().unwrap_or(&[]), mode, inputs.facts)
                }
                Plugin::ConfigMap => {
                    payloads::config_map(&v.spec.config_map.clone().unwrap_or_default(), inputs.objects)
                }
                Plugin::Secret => payloads::secret(&v.spec.secret.clone().unwrap_or_default(), inputs.objects),
                _ => payloads::projected(
                    p,
                    v.name(),
                    &v.spec.projected.clone().unwrap_or_default(),
                    inputs.objects,
                    inputs.facts,
                    fs_group.is_some(),
                ),
            }
            .map_err(anyhow::Error::msg)?;
            let tmpfs = plugin.in_memory_only().then(|| memory_size(None));
            mounted.tmpfs = tmpfs.is_some();
            let fs_gid = fs_group.map(|g| g.gid as i64);
            volumes::write_files_volume(&dir, tmpfs, &payload, fs_gid)?;
            VolumeHost {
                path: dir,
                readonly: true,
                writable_by_us: false,
                idmap: false,
            }
        }
    };
    let host = match inputs.userns {
        // A CSI volume's files are the driver's: never re-owned.
        Some(u) if !plugin.is_nodes() && plugin != Plugin::Csi => {
            owned_for_user_namespace(p, plugin, host, u, fs_group)?
        }
        _ => host,
    };
    Ok((host, mounted))
}

/// The Secrets a CSI volume hands its driver: a claim's PersistentVolume's
/// `nodeStageSecretRef` and `nodePublishSecretRef` (any namespace, fetched with the claim), an
/// inline volume's `nodePublishSecretRef` (the pod's namespace `ns`).
fn csi_secrets(
    vol: &mut super::csi::volume::CsiVolume,
    v: &VolumeToMount,
    ns: &str,
    objects: &VolumeObjects,
) -> Result<()> {
    match &v.claim {
        Some(c) => {
            if let Some(s) = c.volume.spec.as_ref().and_then(|s| s.csi.as_ref()) {
                if let Some(r) = &s.node_stage_secret_ref {
                    vol.stage_secrets = pv_secret(objects, "NodeStageSecretRef", r)?;
                }
                if let Some(r) = &s.node_publish_secret_ref {
                    vol.publish_secrets = pv_secret(objects, "NodePublishSecretRef", r)?;
                }
            }
        }
        None => {
            if let Some(r) = v.spec.csi.as_ref().and_then(|c| c.node_publish_secret_ref.as_ref()) {
                let found = objects.secrets.get(&r.name);
                vol.publish_secrets = csi_secret(found, "NodePublishSecretRef", ns, &r.name)?;
            }
        }
    }
    Ok(())
}

/// The data of a PersistentVolume's Secret (`ref_`, in its own namespace), as fetched with the
/// claim.
fn pv_secret(
    objects: &VolumeObjects,
    field: &str,
    r: &k8s_openapi::api::core::v1::SecretReference,
) -> Result<BTreeMap<String, String>> {
    let (ns, name) = (
        r.namespace.clone().unwrap_or_default(),
        r.name.clone().unwrap_or_default(),
    );
    let found = objects.pv_secrets.get(&(ns.clone(), name.clone()));
    csi_secret(found, field, &ns, &name)
}

/// The data of the Secret a CSI volume names (`field`: which reference), as the driver gets it
/// (kubelet's getCredentialsFromSecret: each key, its bytes as a string).
fn csi_secret(
    found: Option<&crate::objects::Lookup<k8s_openapi::api::core::v1::Secret>>,
    field: &str,
    ns: &str,
    name: &str,
) -> Result<BTreeMap<String, String>> {
    let secret = match found {
        Some(Ok(Some(s))) => s.clone(),
        Some(Ok(None)) => return Err(anyhow!("fetching {field} {ns}/{name} failed: secret not found")),
        Some(Err(e)) => return Err(anyhow!("fetching {field} {ns}/{name} failed: {e}")),
        None => return Err(anyhow!("fetching {field} {ns}/{name} failed: not fetched")),
    };
    Ok(secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
        .collect())
}

/// A claim's volume is read-only in the pod's containers when the pod's volume says so
/// (`persistentVolumeClaim.readOnly`), as kubelet's mounter is.
fn claim_read_only(v: &VolumeToMount) -> bool {
    v.spec
        .persistent_volume_claim
        .as_ref()
        .and_then(|c| c.read_only)
        .unwrap_or(false)
}

/// What kubelet checks of a PersistentVolume before it mounts it: the node is one its
/// `nodeAffinity` allows, and its `volumeMode` is a filesystem (a raw block volume goes into a
/// container as a device, through `volumeDevices`, which ferrolet does not serve).
fn check_persistent_volume(c: &BoundClaim, node: Option<&k8s_openapi::api::core::v1::Node>) -> Result<()> {
    let name = c.volume_name();
    let spec = c.volume.spec.as_ref();
    if spec.and_then(|s| s.volume_mode.as_deref()) == Some("Block") {
        return Err(anyhow!(
            "PersistentVolume {name:?} has volumeMode Block: raw block volumes (volumeDevices) are not supported"
        ));
    }
    let required = spec
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref());
    if let Some(sel) = required {
        let fits = node.is_some_and(|n| crate::podconfig::predicates::node_selector_matches(sel, n));
        if !fits {
            return Err(anyhow!(
                "PersistentVolume {name:?} node affinity: no matching NodeSelectorTerms for this node"
            ));
        }
    }
    Ok(())
}

/// A volume of a pod in a user namespace: bound idmapped where its filesystem takes idmapped
/// mounts (its files are then the container root's as they are host root's). Where it does not
/// (tmpfs before Linux 6.3), kubelet 1.26's ownership instead: the volume group-owned by the
/// pod's host gid for its fsGroup (or for gid 0) with the group's bits, and the files of a
/// projected volume owned by the host uid of the pod's runAsUser (or of 0).
fn owned_for_user_namespace(
    p: &k8s_openapi::api::core::v1::Pod,
    plugin: Plugin,
    mut host: VolumeHost,
    u: &PodUserNamespace,
    fs_group: Option<FsGroup>,
) -> Result<VolumeHost> {
    if ferrolet_runtime::idmap::supported(&host.path, &u.pin) {
        host.idmap = true;
        return Ok(host);
    }
    let group = FsGroup {
        gid: u.range.host + fs_group.map(|g| g.gid).unwrap_or(0),
        // a volume of files is written anew: walk it each time; an emptyDir once
        on_root_mismatch: plugin == Plugin::EmptyDir,
    };
    volumes::set_volume_ownership(&host.path, group, host.readonly)?;
    if plugin == Plugin::Projected {
        let run_as = pod::spec(p)
            .security_context
            .as_ref()
            .and_then(|s| s.run_as_user)
            .unwrap_or(0) as u32;
        volumes::chown_files(&host.path, u.range.host + run_as)?;
    }
    Ok(host)
}

/// Unmount what is mounted on a volume's directory (its tmpfs) and remove it; a CSI volume is
/// unpublished (and unstaged) by its driver. A hostPath or local volume is never touched: only
/// directories under the pod's volumes dir are.
pub fn tear_down(m: &MountedVolume, pod_dir: &Path, csi: Option<&CsiClient>) -> Result<()> {
    let dir = &m.path;
    if m.plugin.is_nodes() || !dir.starts_with(pod_volumes_dir(pod_dir)) {
        return Ok(());
    }
    if m.plugin == Plugin::Csi {
        let csi = csi.ok_or_else(|| anyhow!("tearing down {}: this node has no CSI drivers", dir.display()))?;
        let pods_dir = pod_dir.parent().unwrap_or(pod_dir);
        return super::csi::volume::tear_down(csi, pods_dir, dir);
    }
    if is_mountpoint(dir) {
        ferrolet_runtime::rootfs::unmount(dir).map_err(|e| anyhow!("unmounting {}: {e}", dir.display()))?;
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(anyhow!("removing {}: {e}", dir.display())),
        _ => Ok(()),
    }
}
