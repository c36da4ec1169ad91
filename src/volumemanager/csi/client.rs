//! The calls a CSI volume's set-up and tear-down make of its driver (kubelet's csi_client,
//! csi_attacher's MountDevice / UnmountDevice and csi_mounter's SetUp / TearDown), each with a
//! deadline ([`super::CALL_TIMEOUT`]) and an error naming the driver and the call:
//!
//! - [`CsiClient::wait_for_attachment`]: for a driver whose CSIDriver says `attachRequired`
//!   (or that has no CSIDriver: attach required, as kubelet), the VolumeAttachment
//!   `csi-<sha256(volumeHandle + driver + node)>` must be `status.attached`; its
//!   `attachmentMetadata` is the publish context. Standalone: no attachment.
//! - [`CsiClient::stage`]: NodeStageVolume to the staging path, when the driver has
//!   STAGE_UNSTAGE_VOLUME; [`CsiClient::publish`]: NodePublishVolume to the pod's target path,
//!   with vol_data.json beside it; [`CsiClient::unpublish`], [`CsiClient::unstage`]: their
//!   undoing, the directories removed after; [`CsiClient::volume_stats`]: NodeGetVolumeStats
//!   when the driver has GET_VOLUME_STATS.
//!
//! The functions are async; the volume manager runs on blocking threads (`mount_pod` is off the
//! async threads), and calls them through [`CsiClient::block_on`], which runs a call on the
//! agent's runtime from the handle the client keeps. Never call `block_on` from an async task.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::api::Api;
use tonic::transport::Channel;
use tracing::{debug, info};

use super::{CsiDrivers, VolData, CALL_TIMEOUT};
use crate::apis::csi::v1 as api;
use crate::apis::csi::v1::node_client::NodeClient;
use crate::apis::csi::v1::node_service_capability::rpc::Type as Cap;
use crate::apis::csi::v1::volume_capability::access_mode::Mode;
use crate::kubeclient::Kube;

/// How long a volume waits for its VolumeAttachment (kubelet waits in WaitForAttach with a
/// timeout of its own; the pod worker's sync retries after it).
pub const ATTACH_TIMEOUT: Duration = Duration::from_secs(60);
const ATTACH_POLL: Duration = Duration::from_millis(500);

/// A failed CSI call, naming the driver and the call.
#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    /// kubelet's text.
    #[error("driver name {0} not found in the list of registered CSI drivers")]
    NotRegistered(String),
    #[error("{call} of CSI driver {driver:?} failed: {detail}")]
    Call {
        driver: String,
        call: &'static str,
        detail: String,
    },
    #[error("volume attachment {name} of CSI driver {driver:?} is not attached: {detail}")]
    NotAttached {
        driver: String,
        name: String,
        detail: String,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0:#}")]
    Other(anyhow::Error),
}

/// How a volume is to be used (the CSI VolumeCapability of a mounted volume).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capability {
    /// Empty: the driver's default.
    pub fs_type: String,
    pub access_mode: AccessMode,
    pub mount_flags: Vec<String>,
}

/// A PersistentVolume's access mode as CSI has it (kubelet's asCSIAccessModeV1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AccessMode {
    #[default]
    ReadWriteOnce,
    ReadOnlyMany,
    ReadWriteMany,
    ReadWriteOncePod,
}

impl AccessMode {
    /// From the API's name (`ReadWriteOnce`...); `None` for an unknown one.
    pub fn from_api(s: &str) -> Option<AccessMode> {
        Some(match s {
            "ReadWriteOnce" => AccessMode::ReadWriteOnce,
            "ReadOnlyMany" => AccessMode::ReadOnlyMany,
            "ReadWriteMany" => AccessMode::ReadWriteMany,
            "ReadWriteOncePod" => AccessMode::ReadWriteOncePod,
            _ => return None,
        })
    }

    fn csi(self) -> Mode {
        match self {
            AccessMode::ReadWriteOnce => Mode::SingleNodeWriter,
            AccessMode::ReadOnlyMany => Mode::MultiNodeReaderOnly,
            AccessMode::ReadWriteMany => Mode::MultiNodeMultiWriter,
            AccessMode::ReadWriteOncePod => Mode::SingleNodeSingleWriter,
        }
    }
}

impl Capability {
    fn csi(&self) -> api::VolumeCapability {
        api::VolumeCapability {
            access_type: Some(api::volume_capability::AccessType::Mount(
                api::volume_capability::MountVolume {
                    fs_type: self.fs_type.clone(),
                    mount_flags: self.mount_flags.clone(),
                    volume_mount_group: String::new(),
                },
            )),
            access_mode: Some(api::volume_capability::AccessMode {
                mode: self.access_mode.csi() as i32,
            }),
        }
    }
}

/// What a volume's stage and publish carry besides the paths.
#[derive(Debug, Clone, Default)]
pub struct VolumeRequest {
    pub driver: String,
    pub volume_handle: String,
    pub capability: Capability,
    /// From the VolumeAttachment's attachmentMetadata.
    pub publish_context: BTreeMap<String, String>,
    pub volume_context: BTreeMap<String, String>,
    /// nodeStageSecretRef's data for stage, nodePublishSecretRef's for publish.
    pub secrets: BTreeMap<String, String>,
}

/// A volume's usage as NodeGetVolumeStats gives it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeStats {
    pub bytes: Option<Usage>,
    pub inodes: Option<Usage>,
    /// VolumeCondition (alpha): abnormal, and why.
    pub abnormal: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub available: i64,
    pub total: i64,
    pub used: i64,
}

/// The node's CSI client: the registered drivers, the API server (cluster mode, for the
/// attachment wait) and the runtime the blocking callers run calls on.
#[derive(Clone)]
pub struct CsiClient {
    drivers: CsiDrivers,
    kube: Option<Kube>,
    node_name: String,
    /// The agent's root dir (the staging paths are under it).
    root: PathBuf,
    handle: tokio::runtime::Handle,
}

fn map(m: &BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

impl CsiClient {
    /// A client of `drivers` for the agent whose root dir is `root`; must be made on the
    /// agent's runtime (it keeps its handle).
    pub fn new(drivers: CsiDrivers, kube: Option<Kube>, node_name: &str, root: &Path) -> CsiClient {
        CsiClient {
            drivers,
            kube,
            node_name: node_name.to_string(),
            root: root.to_path_buf(),
            handle: tokio::runtime::Handle::current(),
        }
    }

    /// Where this node stages a volume of `driver`.
    pub fn staging_path(&self, driver: &str, volume_handle: &str) -> PathBuf {
        super::staging_path(&self.root, driver, volume_handle)
    }

    /// The CSIDriver object of `driver` (cluster mode), or `None` (none, or standalone).
    pub async fn driver_object(&self, driver: &str) -> Result<Option<CSIDriver>, CsiError> {
        let Some(kube) = &self.kube else { return Ok(None) };
        Api::<CSIDriver>::all(kube.client())
            .get_opt(driver)
            .await
            .map_err(|e| CsiError::Other(anyhow::Error::new(e).context(format!("reading CSIDriver {driver}"))))
    }

    pub fn drivers(&self) -> &CsiDrivers {
        &self.drivers
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Run `f` (one of this client's calls) on the agent's runtime from a blocking thread.
    /// Panics when called from an async task, as `Handle::block_on` does.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.handle.block_on(f)
    }

    /// A Node service client of `driver`, connected within the deadline.
    async fn node(&self, driver: &str, call: &'static str) -> Result<NodeClient<Channel>, CsiError> {
        let d = self
            .drivers
            .get(driver)
            .ok_or_else(|| CsiError::NotRegistered(driver.to_string()))?;
        let channel = crate::apis::dial(&d.endpoint, CALL_TIMEOUT)
            .await
            .map_err(|e| CsiError::Call {
                driver: driver.to_string(),
                call,
                detail: format!("connecting to {}: {}", d.endpoint.display(), ferrolet_fsutil::chain(&e)),
            })?;
        Ok(NodeClient::new(channel))
    }

    /// Run one call with the deadline, its error named.
    async fn call<T, F>(driver: &str, call: &'static str, f: F) -> Result<T, CsiError>
    where
        F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match tokio::time::timeout(CALL_TIMEOUT, f).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => Err(CsiError::Call {
                driver: driver.to_string(),
                call,
                detail: format!("rpc error: code = {:?} desc = {}", s.code(), s.message()),
            }),
            Err(_) => Err(CsiError::Call {
                driver: driver.to_string(),
                call,
                detail: format!("no answer within {CALL_TIMEOUT:?}"),
            }),
        }
    }

    /// The driver's node capabilities (NodeGetCapabilities).
    pub async fn capabilities(&self, driver: &str) -> Result<Vec<Cap>, CsiError> {
        let mut c = self.node(driver, "NodeGetCapabilities").await?;
        let r = Self::call(
            driver,
            "NodeGetCapabilities",
            c.node_get_capabilities(api::NodeGetCapabilitiesRequest {}),
        )
        .await?;
        Ok(r.capabilities
            .into_iter()
            .filter_map(|c| match c.r#type {
                Some(api::node_service_capability::Type::Rpc(rpc)) => Cap::try_from(rpc.r#type).ok(),
                None => None,
            })
            .collect())
    }

    async fn has(&self, driver: &str, cap: Cap) -> Result<bool, CsiError> {
        Ok(self.capabilities(driver).await?.contains(&cap))
    }

    /// In a cluster, for a driver that attaches: wait (at most `timeout`) for the volume's
    /// VolumeAttachment to be attached, and give its attachmentMetadata (the publish context).
    /// A driver whose CSIDriver says `attachRequired: false`, or a standalone node: nothing.
    pub async fn wait_for_attachment(
        &self,
        driver: &str,
        volume_handle: &str,
        timeout: Duration,
    ) -> Result<Option<(String, BTreeMap<String, String>)>, CsiError> {
        let Some(kube) = &self.kube else { return Ok(None) };
        let client = kube.client();
        let csidriver = self.driver_object(driver).await?;
        // kubelet's isAttachmentRequired: no CSIDriver object means attach.
        let required = csidriver.is_none_or(|d| d.spec.attach_required != Some(false));
        if !required {
            return Ok(None);
        }
        let name = super::attachment_name(volume_handle, driver, &self.node_name);
        let attachments: Api<VolumeAttachment> = Api::all(client);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let last = match attachments.get_opt(&name).await {
                Ok(Some(va)) => {
                    let status = va.status.unwrap_or_default();
                    if status.attached {
                        debug!(driver, attachment = %name, "volume attached");
                        return Ok(Some((name, status.attachment_metadata.unwrap_or_default())));
                    }
                    match status.attach_error.and_then(|e| e.message) {
                        Some(m) => format!("attach error: {m}"),
                        None => "status.attached is false".into(),
                    }
                }
                Ok(None) => "the VolumeAttachment does not exist".into(),
                Err(e) => format!("reading it: {e}"),
            };
            if tokio::time::Instant::now() + ATTACH_POLL > deadline {
                return Err(CsiError::NotAttached {
                    driver: driver.to_string(),
                    name,
                    detail: format!("{last} (waited {timeout:?})"),
                });
            }
            tokio::time::sleep(ATTACH_POLL).await;
        }
    }

    /// Stage the volume at `staging` (NodeStageVolume, kubelet's MountDevice) when the driver
    /// has STAGE_UNSTAGE_VOLUME; whether it did. The staging directory is made (0750) and
    /// vol_data.json written beside it first.
    pub async fn stage(&self, req: &VolumeRequest, staging: &Path) -> Result<bool, CsiError> {
        let driver = &req.driver;
        if !self.has(driver, Cap::StageUnstageVolume).await? {
            debug!(driver = %driver, volume = %req.volume_handle, "the driver does not stage volumes");
            return Ok(false);
        }
        let data = VolData {
            driver_name: driver.clone(),
            volume_handle: req.volume_handle.clone(),
            ..Default::default()
        };
        let parent = staging.parent().unwrap_or(staging).to_path_buf();
        let staging_dir = staging.to_path_buf();
        blocking(move || {
            data.save(&parent).map_err(CsiError::Other)?;
            mkdir(&staging_dir)
        })
        .await?;
        let mut c = self.node(driver, "NodeStageVolume").await?;
        Self::call(
            driver,
            "NodeStageVolume",
            c.node_stage_volume(api::NodeStageVolumeRequest {
                volume_id: req.volume_handle.clone(),
                publish_context: map(&req.publish_context),
                staging_target_path: staging.to_string_lossy().into_owned(),
                volume_capability: Some(req.capability.csi()),
                secrets: map(&req.secrets),
                volume_context: map(&req.volume_context),
            }),
        )
        .await?;
        info!(driver = %driver, volume = %req.volume_handle, staging = %staging.display(), "MountVolume.MountDevice succeeded");
        Ok(true)
    }

    /// Publish the volume at `target` (NodePublishVolume, kubelet's SetUp), from `staging` when
    /// it was staged. The target's parent is made (0750) and `vol_data` written there first;
    /// the driver makes the target itself, as the CSI spec has it.
    pub async fn publish(
        &self,
        req: &VolumeRequest,
        staging: Option<&Path>,
        target: &Path,
        readonly: bool,
        vol_data: &VolData,
    ) -> Result<(), CsiError> {
        let driver = &req.driver;
        let parent = target.parent().unwrap_or(target).to_path_buf();
        let data = vol_data.clone();
        blocking(move || data.save(&parent).map_err(CsiError::Other)).await?;
        let mut c = self.node(driver, "NodePublishVolume").await?;
        Self::call(
            driver,
            "NodePublishVolume",
            c.node_publish_volume(api::NodePublishVolumeRequest {
                volume_id: req.volume_handle.clone(),
                publish_context: map(&req.publish_context),
                staging_target_path: staging.map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
                target_path: target.to_string_lossy().into_owned(),
                volume_capability: Some(req.capability.csi()),
                readonly,
                secrets: map(&req.secrets),
                volume_context: map(&req.volume_context),
            }),
        )
        .await?;
        info!(driver = %driver, volume = %req.volume_handle, target = %target.display(), readonly, "MountVolume.SetUp succeeded");
        Ok(())
    }

    /// Unpublish the volume from `target` (NodeUnpublishVolume, kubelet's TearDown), then
    /// remove the target (if the driver left it) and its directory with vol_data.json.
    pub async fn unpublish(&self, driver: &str, volume_handle: &str, target: &Path) -> Result<(), CsiError> {
        let mut c = self.node(driver, "NodeUnpublishVolume").await?;
        Self::call(
            driver,
            "NodeUnpublishVolume",
            c.node_unpublish_volume(api::NodeUnpublishVolumeRequest {
                volume_id: volume_handle.to_string(),
                target_path: target.to_string_lossy().into_owned(),
            }),
        )
        .await?;
        let target = target.to_path_buf();
        blocking(move || remove_dir_and_data(&target)).await?;
        info!(driver, volume = volume_handle, "UnmountVolume.TearDown succeeded");
        Ok(())
    }

    /// Unstage the volume from `staging` (NodeUnstageVolume, kubelet's UnmountDevice) when the
    /// driver stages volumes, then remove the staging directory and its vol_data.json.
    pub async fn unstage(&self, driver: &str, volume_handle: &str, staging: &Path) -> Result<(), CsiError> {
        if self.has(driver, Cap::StageUnstageVolume).await? {
            let mut c = self.node(driver, "NodeUnstageVolume").await?;
            Self::call(
                driver,
                "NodeUnstageVolume",
                c.node_unstage_volume(api::NodeUnstageVolumeRequest {
                    volume_id: volume_handle.to_string(),
                    staging_target_path: staging.to_string_lossy().into_owned(),
                }),
            )
            .await?;
        }
        let staging = staging.to_path_buf();
        blocking(move || remove_dir_and_data(&staging)).await?;
        info!(driver, volume = volume_handle, "UnmountDevice succeeded");
        Ok(())
    }

    /// The volume's usage (NodeGetVolumeStats), when the driver has GET_VOLUME_STATS.
    pub async fn volume_stats(
        &self,
        driver: &str,
        volume_handle: &str,
        volume_path: &Path,
        staging: Option<&Path>,
    ) -> Result<Option<VolumeStats>, CsiError> {
        if !self.has(driver, Cap::GetVolumeStats).await? {
            return Ok(None);
        }
        let mut c = self.node(driver, "NodeGetVolumeStats").await?;
        let r = Self::call(
            driver,
            "NodeGetVolumeStats",
            c.node_get_volume_stats(api::NodeGetVolumeStatsRequest {
                volume_id: volume_handle.to_string(),
                volume_path: volume_path.to_string_lossy().into_owned(),
                staging_target_path: staging.map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
            }),
        )
        .await?;
        let mut out = VolumeStats::default();
        for u in r.usage {
            let usage = Some(Usage {
                available: u.available,
                total: u.total,
                used: u.used,
            });
            match api::volume_usage::Unit::try_from(u.unit) {
                Ok(api::volume_usage::Unit::Bytes) => out.bytes = usage,
                Ok(api::volume_usage::Unit::Inodes) => out.inodes = usage,
                _ => {}
            }
        }
        out.abnormal = r.volume_condition.filter(|c| c.abnormal).map(|c| c.message);
        Ok(Some(out))
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, CsiError> + Send + 'static) -> Result<T, CsiError> {
    ferrolet_fsutil::spawn_blocking(f)
        .await
        .map_err(|e| CsiError::Other(anyhow::anyhow!("a blocking task failed: {e}")))?
}

fn mkdir(dir: &Path) -> Result<(), CsiError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)
        .map_err(|source| CsiError::Io {
            what: format!("creating {}", dir.display()),
            source,
        })
}

/// Remove `dir` (an empty directory the driver unmounted; a non-empty one is an error, never
/// removed with what is in it) and its parent's vol_data.json and the parent itself.
fn remove_dir_and_data(dir: &Path) -> Result<(), CsiError> {
    let io = |what: String| move |source| CsiError::Io { what, source };
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io(format!("removing {}", dir.display()))(e));
        }
        _ => {}
    }
    let Some(parent) = dir.parent().map(PathBuf::from) else {
        return Ok(());
    };
    match std::fs::remove_file(parent.join(super::VOL_DATA_FILE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io(format!("removing {}", parent.join(super::VOL_DATA_FILE).display()))(
                e,
            ));
        }
        _ => {}
    }
    match std::fs::remove_dir(&parent) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(format!("removing {}", parent.display()))(e)),
        _ => Ok(()),
    }
}
