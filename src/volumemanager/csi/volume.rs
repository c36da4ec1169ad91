//! A pod's CSI volume set up and torn down (kubelet's csi_attacher WaitForAttach and
//! MountDevice, csi_mounter SetUp and TearDown, run in that order by its operation
//! executor), from the volume manager's blocking threads:
//!
//! - set-up: a volume already published (its target a mount point) is left as it is;
//!   otherwise, for a persistent volume, the VolumeAttachment wait (drivers that attach),
//!   NodeStageVolume to the staging path (drivers that stage), then NodePublishVolume to
//!   `<pod dir>/volumes/kubernetes.io~csi/<name>/mount` with vol_data.json beside it. An inline
//!   (ephemeral) volume is published only, as kubelet does, with the handle kubelet makes for
//!   it (`csi-<sha256(pod UID + volume name)>`).
//! - tear-down: NodeUnpublishVolume from what vol_data.json says (so a volume reconstructed
//!   after an agent restart is torn down the same), then NodeUnstageVolume once no other pod's
//!   vol_data.json on the node names the same driver and handle.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use k8s_openapi::api::core::v1::{PersistentVolume, Pod, Volume};

use super::client::{AccessMode, Capability, CsiClient, VolumeRequest, ATTACH_TIMEOUT};
use super::{sha256_hex, target_path, VolData, POD_DIR_NAME};
use crate::pod;
use crate::volumemanager::volumes::{set_volume_ownership, FsGroup};

/// kubelet's volumeLifecycleMode values.
pub const PERSISTENT: &str = "Persistent";
pub const EPHEMERAL: &str = "Ephemeral";

/// A CSI volume as a pod has it: from a PersistentVolume's `spec.csi` or an inline `csi`
/// volume of the pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CsiVolume {
    /// kubelet's specVolID: the PV's name, or the pod's name of an inline volume.
    pub spec_name: String,
    pub driver: String,
    pub volume_handle: String,
    pub read_only: bool,
    pub capability: Capability,
    pub volume_context: BTreeMap<String, String>,
    pub stage_secrets: BTreeMap<String, String>,
    pub publish_secrets: BTreeMap<String, String>,
    pub ephemeral: bool,
}

impl CsiVolume {
    /// The volume of a PersistentVolume with a `csi` source; `claim_read_only` is the pod's
    /// `persistentVolumeClaim.readOnly`. Secrets are the caller's to fill in.
    pub fn from_pv(pv: &PersistentVolume, claim_read_only: bool) -> Result<CsiVolume> {
        let name = pv.metadata.name.clone().unwrap_or_default();
        let spec = pv.spec.as_ref().context("the PersistentVolume has no spec")?;
        let c = spec
            .csi
            .as_ref()
            .with_context(|| format!("PersistentVolume {name} has no csi source"))?;
        let mode = spec
            .access_modes
            .iter()
            .flatten()
            .next()
            .map(|m| {
                AccessMode::from_api(m)
                    .with_context(|| format!("PersistentVolume {name}: accessModes: unknown mode {m:?}"))
            })
            .transpose()?
            .unwrap_or_default();
        Ok(CsiVolume {
            spec_name: name,
            driver: c.driver.clone(),
            volume_handle: c.volume_handle.clone(),
            read_only: claim_read_only || c.read_only == Some(true),
            capability: Capability {
                fs_type: c.fs_type.clone().unwrap_or_default(),
                access_mode: mode,
                mount_flags: spec.mount_options.clone().unwrap_or_default(),
            },
            volume_context: c.volume_attributes.clone().unwrap_or_default(),
            ..Default::default()
        })
    }

    /// The pod's inline `csi` volume `v` (CSI ephemeral volume). Its publish secret is the
    /// caller's to fill in.
    pub fn inline(p: &Pod, v: &Volume) -> Result<CsiVolume> {
        let c = v.csi.as_ref().context("not a csi volume")?;
        Ok(CsiVolume {
            spec_name: v.name.clone(),
            driver: c.driver.clone(),
            volume_handle: inline_volume_handle(pod::uid(p), &v.name),
            read_only: c.read_only == Some(true),
            capability: Capability {
                fs_type: c.fs_type.clone().unwrap_or_default(),
                access_mode: AccessMode::ReadWriteOnce,
                mount_flags: Vec::new(),
            },
            volume_context: c.volume_attributes.clone().unwrap_or_default(),
            ephemeral: true,
            ..Default::default()
        })
    }
}

/// kubelet's makeVolumeHandle for an inline volume: `csi-<sha256(pod UID + volume name)>`.
pub fn inline_volume_handle(pod_uid: &str, volume: &str) -> String {
    format!("csi-{}", sha256_hex(&format!("{pod_uid}{volume}")))
}

/// Whether `path` is a mount point in the agent's mount table (a bind mount from the same
/// filesystem has the same device, so device numbers cannot tell).
pub fn is_mounted(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.to_string_lossy();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| unescape(m) == want)
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// kubelet's supportsFSGroup: whether the pod's fsGroup is applied to a CSI volume, by the
/// CSIDriver's `fsGroupPolicy` (`ReadWriteOnceWithFSType` when it says none, or there is no
/// CSIDriver): `File` always, `None` never, `ReadWriteOnceWithFSType` when the volume has an
/// fsType and is ReadWriteOnce (an inline volume: when it has an fsType).
pub fn fs_group_applies(policy: Option<&str>, v: &CsiVolume) -> bool {
    match policy.unwrap_or("ReadWriteOnceWithFSType") {
        "None" => false,
        "File" => true,
        _ => !v.capability.fs_type.is_empty() && (v.ephemeral || v.capability.access_mode == AccessMode::ReadWriteOnce),
    }
}

/// Where the pod's volume `name` is published; set up if it is not yet (blocking: run on a
/// blocking thread).
pub fn set_up(
    c: &CsiClient,
    p: &Pod,
    pod_dir: &Path,
    name: &str,
    v: &CsiVolume,
    fs_group: Option<FsGroup>,
) -> Result<PathBuf> {
    let target = target_path(pod_dir, name);
    if is_mounted(&target) {
        return Ok(target);
    }
    let mut fs_group_policy = None;
    c.block_on(async {
        let mut req = VolumeRequest {
            driver: v.driver.clone(),
            volume_handle: v.volume_handle.clone(),
            capability: v.capability.clone(),
            volume_context: v.volume_context.clone(),
            ..Default::default()
        };
        // kubelet's podInfoOnMount: the pod's identity in the volume context when the
        // driver's CSIDriver asks for it.
        let object = c.driver_object(&v.driver).await?;
        fs_group_policy = object.as_ref().and_then(|d| d.spec.fs_group_policy.clone());
        if object.as_ref().and_then(|d| d.spec.pod_info_on_mount) == Some(true) {
            let sa = pod::spec(p).service_account_name.clone().unwrap_or_default();
            for (k, val) in [
                (
                    "csi.storage.k8s.io/pod.name",
                    p.metadata.name.clone().unwrap_or_default(),
                ),
                ("csi.storage.k8s.io/pod.namespace", pod::namespace(p).to_string()),
                ("csi.storage.k8s.io/pod.uid", pod::uid(p).to_string()),
                ("csi.storage.k8s.io/serviceAccount.name", sa),
                ("csi.storage.k8s.io/ephemeral", v.ephemeral.to_string()),
            ] {
                req.volume_context.insert(k.to_string(), val);
            }
        }
        let mut attachment_id = String::new();
        let mut staging = None;
        if !v.ephemeral {
            if let Some((name, context)) = c
                .wait_for_attachment(&v.driver, &v.volume_handle, ATTACH_TIMEOUT)
                .await?
            {
                attachment_id = name;
                req.publish_context = context;
            }
            let path = c.staging_path(&v.driver, &v.volume_handle);
            req.secrets = v.stage_secrets.clone();
            if c.stage(&req, &path).await? {
                staging = Some(path);
            }
        }
        req.secrets = v.publish_secrets.clone();
        let data = VolData {
            spec_vol_id: v.spec_name.clone(),
            volume_handle: v.volume_handle.clone(),
            driver_name: v.driver.clone(),
            node_name: c.node_name().to_string(),
            attachment_id,
            volume_lifecycle_mode: if v.ephemeral { EPHEMERAL } else { PERSISTENT }.into(),
            pod_volume_name: name.to_string(),
        };
        c.publish(&req, staging.as_deref(), &target, v.read_only, &data).await
    })
    .map_err(anyhow::Error::new)?;
    // kubelet's csiMountMgr.SetUpAt: the pod's fsGroup on a writable volume the driver's
    // policy gives it to.
    if let Some(g) = fs_group.filter(|_| !v.read_only && fs_group_applies(fs_group_policy.as_deref(), v)) {
        set_volume_ownership(&target, g, false)
            .with_context(|| format!("applying fsGroup {} to CSI volume {name:?}", g.gid))?;
    }
    Ok(target)
}

/// Tear down the CSI volume whose directory is `dir` (`<pod dir>/volumes/kubernetes.io~csi/
/// <name>`), by its vol_data.json: unpublish, then unstage when no other pod under `pods_dir`
/// has the same volume (blocking). A directory without vol_data.json and nothing mounted is
/// removed (a set-up that failed before publishing).
pub fn tear_down(c: &CsiClient, pods_dir: &Path, dir: &Path) -> Result<()> {
    let target = dir.join("mount");
    let data = match VolData::load(dir) {
        Ok(d) => d,
        Err(_) if !is_mounted(&target) => {
            return match std::fs::remove_dir_all(dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(anyhow!("removing {}: {e}", dir.display())),
                _ => Ok(()),
            };
        }
        Err(e) => return Err(e.context(format!("{} is mounted", target.display()))),
    };
    c.block_on(c.unpublish(&data.driver_name, &data.volume_handle, &target))
        .map_err(anyhow::Error::new)?;
    if data.volume_lifecycle_mode == EPHEMERAL {
        return Ok(());
    }
    let others = users(pods_dir, &data.driver_name, &data.volume_handle);
    if !others.is_empty() {
        tracing::debug!(driver = %data.driver_name, volume = %data.volume_handle, users = others.len(), "the staged volume is still in use");
        return Ok(());
    }
    let staging = c.staging_path(&data.driver_name, &data.volume_handle);
    c.block_on(c.unstage(&data.driver_name, &data.volume_handle, &staging))
        .map_err(anyhow::Error::new)?;
    Ok(())
}

/// Tear down every CSI volume directory left in the pod's volumes dir (a set-up that failed
/// part way, after vol_data.json was written: the volume may be staged, or published), by its
/// vol_data.json, as [`tear_down`] does (blocking).
pub fn sweep(c: &CsiClient, pod_dir: &Path) -> Result<()> {
    let pods_dir = pod_dir.parent().unwrap_or(pod_dir);
    let base = pod_dir.join("volumes").join(POD_DIR_NAME);
    for v in std::fs::read_dir(&base).into_iter().flatten().flatten() {
        tear_down(c, pods_dir, &v.path())?;
    }
    match std::fs::remove_dir(&base) {
        Err(e)
            if !matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::DirectoryNotEmpty
            ) =>
        {
            Err(anyhow!("removing {}: {e}", base.display()))
        }
        _ => Ok(()),
    }
}

/// The CSI volume directories under `pods_dir` whose vol_data.json names `driver` and
/// `handle`.
pub fn users(pods_dir: &Path, driver: &str, handle: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for pod in std::fs::read_dir(pods_dir).into_iter().flatten().flatten() {
        let base = pod.path().join("volumes").join(POD_DIR_NAME);
        for v in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            if let Ok(d) = VolData::load(&v.path()) {
                if d.driver_name == driver && d.volume_handle == handle {
                    out.push(v.path());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_from_pvs_and_pods() {
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-1"},
            "spec": {"accessModes": ["ReadOnlyMany"], "mountOptions": ["noatime"],
                "csi": {"driver": "d.example.com", "volumeHandle": "h-1", "fsType": "xfs",
                    "volumeAttributes": {"a": "b"}}}
        }))
        .unwrap();
        let v = CsiVolume::from_pv(&pv, true).unwrap();
        assert_eq!(
            (v.spec_name.as_str(), v.driver.as_str(), v.volume_handle.as_str()),
            ("pv-1", "d.example.com", "h-1")
        );
        assert!(v.read_only && !v.ephemeral);
        assert_eq!(v.capability.access_mode, AccessMode::ReadOnlyMany);
        assert_eq!(v.capability.mount_flags, ["noatime"]);
        assert_eq!(v.volume_context["a"], "b");
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u-1"},
            "spec": {"containers": [], "volumes": [{"name": "scratch", "csi": {"driver": "d.example.com"}}]}
        }))
        .unwrap();
        let vol = &p.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0];
        let v = CsiVolume::inline(&p, vol).unwrap();
        assert!(v.ephemeral);
        assert_eq!(v.volume_handle, format!("csi-{}", sha256_hex("u-1scratch")));
        assert_eq!(unescape(r"/a\040b"), "/a b");
    }

    #[test]
    fn fs_group_by_the_drivers_policy() {
        let pv = |modes: serde_json::Value, fs: &str| -> CsiVolume {
            let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "pv"},
                "spec": {"accessModes": modes, "csi": {"driver": "d", "volumeHandle": "h", "fsType": fs}}
            }))
            .unwrap();
            CsiVolume::from_pv(&pv, false).unwrap()
        };
        let rwo = pv(serde_json::json!(["ReadWriteOnce"]), "ext4");
        // No CSIDriver, or no policy: ReadWriteOnceWithFSType.
        assert!(fs_group_applies(None, &rwo));
        assert!(!fs_group_applies(None, &pv(serde_json::json!(["ReadWriteOnce"]), "")));
        assert!(!fs_group_applies(
            None,
            &pv(serde_json::json!(["ReadWriteMany"]), "ext4")
        ));
        assert!(fs_group_applies(
            Some("File"),
            &pv(serde_json::json!(["ReadWriteMany"]), "")
        ));
        assert!(!fs_group_applies(Some("None"), &rwo));
    }
}
