//! CSI, the node side (kubelet's `pkg/volume/csi`): the drivers registered through the plugin
//! watcher ([`CsiDrivers`], filled by [`CsiHandler`]), the node's account of them in the API
//! server ([`nodeinfo`]: the `csi.volume.kubernetes.io/nodeid` annotation and the CSINode
//! object), and the calls a volume's set-up and tear-down make ([`client`]: NodeStageVolume,
//! NodePublishVolume and their undoing, NodeGetVolumeStats, the VolumeAttachment wait).
//!
//! The paths are kubelet's, so a driver written for kubelet finds what it expects:
//! - staging: `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(volumeHandle)>/globalmount`,
//!   with `vol_data.json` (driverName, volumeHandle) beside `globalmount`;
//! - publishing: `<pod dir>/volumes/kubernetes.io~csi/<volume>/mount`, with `vol_data.json`
//!   beside `mount` (specVolID, volumeHandle, driverName, nodeName, attachmentID,
//!   volumeLifecycleMode, and ours: `podVolumeName`, the pod's name of the volume, which keys
//!   the volume when it is reconstructed after an agent restart).

pub mod client;
pub mod nodeinfo;
pub mod volume;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tracing::info;

use crate::apis::csi::v1::node_client::NodeClient;
use crate::apis::csi::v1::NodeGetInfoRequest;
use crate::pluginmanager::PluginHandler;

/// kubelet's name of the CSI volume plugin.
pub const PLUGIN_NAME: &str = "kubernetes.io/csi";
/// Its directory under `<pod dir>/volumes`.
pub const POD_DIR_NAME: &str = "kubernetes.io~csi";
/// The file of a volume's facts beside its mount directory.
pub const VOL_DATA_FILE: &str = "vol_data.json";
/// The Node annotation that maps each driver to the node's ID for it.
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// The deadline of each call to a driver (connection and answer). kubelet gives its CSI calls
/// 2 min (csiTimeout); a node plugin answers its node calls far sooner or is stuck, and a pod
/// worker waits on them.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The deadline of the calls made when a driver registers (NodeGetInfo).
pub const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// `<root>/plugins/kubernetes.io/csi`: the drivers' staging directories.
pub fn plugin_dir(root: &Path) -> PathBuf {
    root.join("plugins").join(PLUGIN_NAME)
}

/// The hex sha256 of `s`.
pub fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// Where a volume of `driver` is staged (kubelet's makeDeviceMountPath):
/// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(volume_handle)>/globalmount`.
pub fn staging_path(root: &Path, driver: &str, volume_handle: &str) -> PathBuf {
    plugin_dir(root)
        .join(driver)
        .join(sha256_hex(volume_handle))
        .join("globalmount")
}

/// The directory of a pod's CSI volume: `<pod dir>/volumes/kubernetes.io~csi/<volume>`.
pub fn volume_dir(pod_dir: &Path, volume: &str) -> PathBuf {
    pod_dir.join("volumes").join(POD_DIR_NAME).join(volume)
}

/// Where a pod's CSI volume is published: `<volume dir>/mount`.
pub fn target_path(pod_dir: &Path, volume: &str) -> PathBuf {
    volume_dir(pod_dir, volume).join("mount")
}

/// The VolumeAttachment of a volume on a node (kubelet's getAttachmentName):
/// `csi-<sha256(volumeHandle + driver + nodeName)>`.
pub fn attachment_name(volume_handle: &str, driver: &str, node: &str) -> String {
    format!("csi-{}", sha256_hex(&format!("{volume_handle}{driver}{node}")))
}

/// kubelet's vol_data.json, with ferrolet's `podVolumeName`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolData {
    #[serde(rename = "specVolID", default, skip_serializing_if = "String::is_empty")]
    pub spec_vol_id: String,
    #[serde(rename = "volumeHandle")]
    pub volume_handle: String,
    #[serde(rename = "driverName")]
    pub driver_name: String,
    #[serde(rename = "nodeName", default, skip_serializing_if = "String::is_empty")]
    pub node_name: String,
    #[serde(rename = "attachmentID", default, skip_serializing_if = "String::is_empty")]
    pub attachment_id: String,
    #[serde(rename = "volumeLifecycleMode", default, skip_serializing_if = "String::is_empty")]
    pub volume_lifecycle_mode: String,
    /// ferrolet's: the pod's name of the volume.
    #[serde(rename = "podVolumeName", default, skip_serializing_if = "String::is_empty")]
    pub pod_volume_name: String,
}

impl VolData {
    /// Write `dir/vol_data.json` (atomically; `dir` made 0750 if missing).
    pub fn save(&self, dir: &Path) -> anyhow::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        // Synced before and after its rename: a power cut leaves the old record or the new.
        Ok(ferrolet_fsutil::write_json_atomic(&dir.join(VOL_DATA_FILE), self)?)
    }

    /// Read `dir/vol_data.json`.
    pub fn load(dir: &Path) -> anyhow::Result<VolData> {
        Ok(ferrolet_fsutil::read_json(&dir.join(VOL_DATA_FILE))?)
    }
}

/// A registered driver: where its node plugin listens and what it said of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Driver {
    pub name: String,
    pub endpoint: PathBuf,
    /// The highest CSI version of the driver's (1.x).
    pub version: (u64, u64, u64),
    pub node_id: String,
    /// NodeGetInfo's max_volumes_per_node; `None` for 0 (no limit said).
    pub max_volumes: Option<i64>,
    /// NodeGetInfo's accessible_topology segments.
    pub topology: BTreeMap<String, String>,
}

/// The CSI drivers registered on the node, by name; cheap to clone.
#[derive(Clone, Default)]
pub struct CsiDrivers {
    inner: Arc<Mutex<BTreeMap<String, Driver>>>,
}

impl CsiDrivers {
    pub fn get(&self, name: &str) -> Option<Driver> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).get(name).cloned()
    }

    pub fn list(&self) -> Vec<Driver> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    fn insert(&self, d: Driver) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(d.name.clone(), d);
    }

    /// Remove `name` if it is still the driver at `endpoint`; whether it was.
    fn remove(&self, name: &str, endpoint: &Path) -> bool {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match m.get(name) {
            Some(d) if d.endpoint == endpoint => {
                m.remove(name);
                true
            }
            _ => false,
        }
    }
}

/// A CSI version as drivers write it: `1.7.0`, `v1.2`, `1`.
pub fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let v = v.trim();
    let v = v.strip_prefix('v').unwrap_or(v);
    // Anything after the numbers (`-rc1`, `+build`) is ignored, as kubelet's ParseGeneric.
    let end = v.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(v.len());
    let mut parts = v[..end].split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    let patch = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    Some((major, minor, patch))
}

/// The highest 1.x version of `versions` (kubelet's highestSupportedVersion), or why none.
pub fn highest_supported(versions: &[String]) -> Result<(u64, u64, u64), String> {
    versions
        .iter()
        .filter_map(|v| parse_version(v))
        .filter(|v| v.0 == crate::apis::csi::v1::SUPPORTED_MAJOR)
        .max()
        .ok_or_else(|| format!("supported_versions: none of {versions:?} is a CSI version this node speaks (1.x)"))
}

/// The plugin watcher's handler of `CSIPlugin`s (kubelet's csi RegistrationHandler): a driver
/// of a 1.x version is asked NodeGetInfo and registered; in a cluster the node's annotation and
/// CSINode follow ([`nodeinfo::NodeInfo`]).
pub struct CsiHandler {
    drivers: CsiDrivers,
    node_info: Option<nodeinfo::NodeInfo>,
}

impl CsiHandler {
    pub fn new(drivers: CsiDrivers, node_info: Option<nodeinfo::NodeInfo>) -> CsiHandler {
        CsiHandler { drivers, node_info }
    }
}

#[tonic::async_trait]
impl PluginHandler for CsiHandler {
    async fn validate(&self, name: &str, _endpoint: &str, versions: &[String]) -> anyhow::Result<()> {
        let version = highest_supported(versions).map_err(|e| anyhow!(e))?;
        if let Some(d) = self.drivers.get(name) {
            if d.version > version {
                bail!(
                    "supported_versions: the driver {name:?} is registered already with the higher version {}.{}.{}",
                    d.version.0,
                    d.version.1,
                    d.version.2
                );
            }
        }
        Ok(())
    }

    async fn register(&self, name: &str, endpoint: &str, versions: &[String]) -> anyhow::Result<()> {
        let version = highest_supported(versions).map_err(|e| anyhow!(e))?;
        let endpoint = PathBuf::from(endpoint);
        let info = async {
            let channel = crate::apis::dial(&endpoint, REGISTER_TIMEOUT).await?;
            let r = tokio::time::timeout(
                REGISTER_TIMEOUT,
                NodeClient::new(channel).node_get_info(NodeGetInfoRequest {}),
            )
            .await
            .map_err(|_| anyhow!("no answer within {REGISTER_TIMEOUT:?}"))?
            .map_err(|s| anyhow!("rpc error: code = {:?} desc = {}", s.code(), s.message()))?;
            anyhow::Ok(r.into_inner())
        }
        .await
        .with_context(|| format!("NodeGetInfo of CSI driver {name:?} at {}", endpoint.display()))?;
        if info.node_id.is_empty() {
            bail!("node_id: the NodeGetInfo of CSI driver {name:?} gave no node ID");
        }
        if info.max_volumes_per_node < 0 {
            bail!(
                "max_volumes_per_node: the NodeGetInfo of CSI driver {name:?} gave {} (negative)",
                info.max_volumes_per_node
            );
        }
        let topology: BTreeMap<String, String> = info
            .accessible_topology
            .map(|t| t.segments.into_iter().collect())
            .unwrap_or_default();
        let driver = Driver {
            name: name.to_string(),
            endpoint,
            version,
            node_id: info.node_id,
            max_volumes: (info.max_volumes_per_node > 0).then_some(info.max_volumes_per_node),
            topology,
        };
        info!(driver = name, node_id = %driver.node_id, max_volumes = ?driver.max_volumes, topology = ?driver.topology, "CSI driver registered");
        if let Some(n) = &self.node_info {
            n.install(&driver);
        }
        self.drivers.insert(driver);
        Ok(())
    }

    async fn deregister(&self, name: &str, endpoint: &str) {
        if self.drivers.remove(name, Path::new(endpoint)) {
            info!(driver = name, "CSI driver deregistered");
            if let Some(n) = &self.node_info {
                n.uninstall(name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_paths_and_names() {
        assert_eq!(parse_version("1.7.0"), Some((1, 7, 0)));
        assert_eq!(parse_version("v1.2"), Some((1, 2, 0)));
        assert_eq!(parse_version("1.0.0-rc2"), Some((1, 0, 0)));
        assert_eq!(parse_version("x"), None);
        assert_eq!(
            highest_supported(&["0.3.0".into(), "1.2.0".into(), "1.10.0".into()]),
            Ok((1, 10, 0))
        );
        assert!(highest_supported(&["0.3.0".into(), "2.0.0".into()])
            .unwrap_err()
            .starts_with("supported_versions: "));
        let root = Path::new("/var/lib/kubelet");
        assert_eq!(
            staging_path(root, "csi.example.com", "vol-1"),
            Path::new(&format!(
                "/var/lib/kubelet/plugins/kubernetes.io/csi/csi.example.com/{}/globalmount",
                sha256_hex("vol-1")
            ))
        );
        assert_eq!(
            target_path(Path::new("/p/u"), "data"),
            Path::new("/p/u/volumes/kubernetes.io~csi/data/mount")
        );
        // kubelet's name for the same volume, driver and node.
        assert_eq!(
            attachment_name("vol-1", "csi.example.com", "node-a"),
            format!("csi-{}", sha256_hex("vol-1csi.example.comnode-a"))
        );
        let d = VolData {
            spec_vol_id: "pv-1".into(),
            volume_handle: "vol-1".into(),
            driver_name: "csi.example.com".into(),
            node_name: "node-a".into(),
            volume_lifecycle_mode: "Persistent".into(),
            pod_volume_name: "data".into(),
            ..Default::default()
        };
        let j = serde_json::to_value(&d).unwrap();
        assert_eq!(j["specVolID"], "pv-1");
        assert_eq!(j["podVolumeName"], "data");
        assert!(j.get("attachmentID").is_none());
    }
}
