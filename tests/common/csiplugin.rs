#![allow(dead_code)]
//! A real CSI node plugin for the tests, as a driver's node-driver-registrar and node plugin
//! are on a kubelet node: tonic servers on unix sockets in the test process. The
//! pluginregistration `Registration` service listens on `<plugins_registry>/<name>-reg.sock`
//! (GetInfo answers `CSIPlugin`, or what the test set; NotifyRegistrationStatus is recorded),
//! and the CSI Identity and Node services on the endpoint it names. Volumes are directories:
//! the volume handle `v` is `<base>/v`; NodeStageVolume bind-mounts it on the staging path,
//! NodePublishVolume bind-mounts the staging path (or the directory, for a driver that does
//! not stage) on the target, read-only when asked; unpublish and unstage unmount (the target
//! is removed, as the spec has the plugin do). Every call is recorded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrolet::apis::csi::v1 as csi;
use ferrolet::apis::pluginregistration::v1 as reg;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use tonic::{Request, Response, Status};

/// What the plugin says of itself.
#[derive(Debug, Clone)]
pub struct Options {
    /// GetInfo's type.
    pub kind: String,
    pub versions: Vec<String>,
    /// Whether it has STAGE_UNSTAGE_VOLUME.
    pub stage: bool,
    pub node_id: String,
    pub max_volumes: i64,
    pub topology: BTreeMap<String, String>,
    /// Make a volume's directory when it is published and missing (an ephemeral volume,
    /// whose handle the CO makes up).
    pub create_on_publish: bool,
    /// The endpoint GetInfo names instead of the CSI socket (another plugin's, e.g. a device
    /// plugin's, when this one registers as a `DevicePlugin`).
    pub endpoint: Option<PathBuf>,
    /// NodePublishVolume fails (Internal), after doing nothing.
    pub fail_publish: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            kind: reg::CSI_PLUGIN.into(),
            versions: vec!["1.7.0".into()],
            stage: true,
            node_id: "test-node-id".into(),
            max_volumes: 0,
            topology: BTreeMap::new(),
            create_on_publish: false,
            endpoint: None,
            fail_publish: false,
        }
    }
}

/// The record of the plugin's calls, each `Method volume_id path [ro]`.
pub type Calls = Arc<Mutex<Vec<String>>>;

struct Registration {
    name: String,
    endpoint: PathBuf,
    opts: Options,
    notified: Arc<Mutex<Vec<(bool, String)>>>,
}

#[tonic::async_trait]
impl reg::registration_server::Registration for Registration {
    async fn get_info(&self, _: Request<reg::InfoRequest>) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo {
            r#type: self.opts.kind.clone(),
            name: self.name.clone(),
            endpoint: self.endpoint.to_string_lossy().into_owned(),
            supported_versions: self.opts.versions.clone(),
        }))
    }

    async fn notify_registration_status(
        &self,
        r: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let r = r.into_inner();
        self.notified.lock().unwrap().push((r.plugin_registered, r.error));
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

struct Identity {
    name: String,
}

#[tonic::async_trait]
impl csi::identity_server::Identity for Identity {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: "0.1.0".into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::GetPluginCapabilitiesResponse::default()))
    }

    async fn probe(&self, _: Request<csi::ProbeRequest>) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

struct Node {
    base: PathBuf,
    opts: Options,
    calls: Calls,
}

/// Whether `path` is a mount point (in this process's mount table).
pub fn is_mount_point(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let p = path.to_string_lossy();
    info.lines().any(|l| l.split(' ').nth(4) == Some(&*p))
}

fn internal(what: &str, e: impl std::fmt::Display) -> Status {
    Status::internal(format!("{what}: {e}"))
}

fn bind(src: &Path, dst: &Path, readonly: bool) -> Result<(), Status> {
    if is_mount_point(dst) {
        return Ok(());
    }
    mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| internal(&format!("bind {} on {}", src.display(), dst.display()), e))?;
    if readonly {
        mount(
            None::<&str>,
            dst,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(|e| internal(&format!("read-only remount of {}", dst.display()), e))?;
    }
    Ok(())
}

fn unmount(path: &Path) -> Result<(), Status> {
    while is_mount_point(path) {
        umount2(path, MntFlags::empty()).map_err(|e| internal(&format!("unmount {}", path.display()), e))?;
    }
    Ok(())
}

impl Node {
    fn record(&self, s: String) {
        self.calls.lock().unwrap().push(s);
    }

    fn volume(&self, id: &str) -> Result<PathBuf, Status> {
        if id.is_empty() || id.contains('/') {
            return Err(Status::invalid_argument(format!("volume_id {id:?}")));
        }
        let dir = self.base.join(id);
        if !dir.is_dir() {
            return Err(Status::not_found(format!("volume {id} not found")));
        }
        Ok(dir)
    }
}

#[tonic::async_trait]
impl csi::node_server::Node for Node {
    async fn node_stage_volume(
        &self,
        r: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let r = r.into_inner();
        let mut context: Vec<String> = r.publish_context.iter().map(|(k, v)| format!("{k}={v}")).collect();
        context.sort();
        self.record(format!(
            "NodeStageVolume {} {} [{}]",
            r.volume_id,
            r.staging_target_path,
            context.join(",")
        ));
        if !self.opts.stage {
            return Err(Status::unimplemented("no staging"));
        }
        let src = self.volume(&r.volume_id)?;
        let staging = Path::new(&r.staging_target_path);
        if !staging.is_dir() {
            return Err(Status::failed_precondition("the staging path does not exist"));
        }
        if r.volume_capability.and_then(|c| c.access_mode).is_none() {
            return Err(Status::invalid_argument("volume_capability.access_mode missing"));
        }
        bind(&src, staging, false)?;
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        r: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let r = r.into_inner();
        self.record(format!("NodeUnstageVolume {} {}", r.volume_id, r.staging_target_path));
        unmount(Path::new(&r.staging_target_path))?;
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        r: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let r = r.into_inner();
        let mut secrets: Vec<String> = r.secrets.iter().map(|(k, v)| format!("{k}={v}")).collect();
        secrets.sort();
        self.record(format!(
            "NodePublishVolume {} {}{}{}",
            r.volume_id,
            r.target_path,
            if secrets.is_empty() {
                String::new()
            } else {
                format!(" secrets={}", secrets.join(","))
            },
            if r.readonly { " ro" } else { "" }
        ));
        if self.opts.fail_publish {
            return Err(Status::internal("publishing fails (the test asked)"));
        }
        if self.opts.create_on_publish && !r.volume_id.contains('/') {
            std::fs::create_dir_all(self.base.join(&r.volume_id)).map_err(|e| internal("creating the volume", e))?;
        }
        // An ephemeral volume is published without staging.
        let src = match self.opts.stage && !r.staging_target_path.is_empty() {
            true => {
                let s = PathBuf::from(&r.staging_target_path);
                if !is_mount_point(&s) {
                    return Err(Status::failed_precondition("the volume is not staged"));
                }
                s
            }
            false => self.volume(&r.volume_id)?,
        };
        let target = Path::new(&r.target_path);
        std::fs::create_dir_all(target).map_err(|e| internal("creating the target", e))?;
        bind(&src, target, r.readonly)?;
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        r: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let r = r.into_inner();
        self.record(format!("NodeUnpublishVolume {} {}", r.volume_id, r.target_path));
        let target = Path::new(&r.target_path);
        unmount(target)?;
        match std::fs::remove_dir(target) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(internal("removing the target", e)),
            _ => {}
        }
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        r: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let r = r.into_inner();
        self.record(format!("NodeGetVolumeStats {} {}", r.volume_id, r.volume_path));
        let st = nix::sys::statvfs::statvfs(Path::new(&r.volume_path)).map_err(|e| Status::not_found(e.to_string()))?;
        let f = st.fragment_size() as i64;
        let usage = |unit: csi::volume_usage::Unit, total: i64, free: i64| csi::VolumeUsage {
            available: free,
            total,
            used: total - free,
            unit: unit as i32,
        };
        Ok(Response::new(csi::NodeGetVolumeStatsResponse {
            usage: vec![
                usage(
                    csi::volume_usage::Unit::Bytes,
                    st.blocks() as i64 * f,
                    st.blocks_available() as i64 * f,
                ),
                usage(
                    csi::volume_usage::Unit::Inodes,
                    st.files() as i64,
                    st.files_available() as i64,
                ),
            ],
            volume_condition: None,
        }))
    }

    async fn node_expand_volume(
        &self,
        _: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented("no expansion"))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use csi::node_service_capability::rpc::Type;
        let mut caps = vec![Type::GetVolumeStats];
        if self.opts.stage {
            caps.push(Type::StageUnstageVolume);
        }
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: caps
                .into_iter()
                .map(|t| csi::NodeServiceCapability {
                    r#type: Some(csi::node_service_capability::Type::Rpc(
                        csi::node_service_capability::Rpc { r#type: t as i32 },
                    )),
                })
                .collect(),
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        self.record("NodeGetInfo".into());
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.opts.node_id.clone(),
            max_volumes_per_node: self.opts.max_volumes,
            accessible_topology: (!self.opts.topology.is_empty()).then(|| csi::Topology {
                segments: self.opts.topology.clone().into_iter().collect(),
            }),
        }))
    }
}

/// A running plugin; its servers stop and its sockets go when it is dropped.
pub struct TestCsiPlugin {
    rt: tokio::runtime::Runtime,
    pub name: String,
    /// Its registration socket in the plugin registry.
    pub registration: PathBuf,
    /// Its CSI endpoint.
    pub endpoint: PathBuf,
    /// The volumes' directories.
    pub base: PathBuf,
    pub calls: Calls,
    notified: Arc<Mutex<Vec<(bool, String)>>>,
    stop_registration: Option<tokio::sync::oneshot::Sender<()>>,
    stop_csi: Option<tokio::sync::oneshot::Sender<()>>,
}

impl TestCsiPlugin {
    /// Serve driver `name`: CSI on `<plugin_dir>/csi.sock`, volumes under `<plugin_dir>/volumes`,
    /// and its registration on `<registry>/<name>-reg.sock`, which the watcher sees at once.
    pub fn start(registry: &Path, plugin_dir: &Path, name: &str, opts: Options) -> TestCsiPlugin {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let base = plugin_dir.join("volumes");
        std::fs::create_dir_all(&base).unwrap();
        let endpoint = plugin_dir.join("csi.sock");
        let file = name.replace('/', "_");
        let registration = registry.join(format!("{file}-reg.sock"));
        let calls = Calls::default();
        let notified = Arc::new(Mutex::new(Vec::new()));
        let (stop_csi, csi_stopped) = tokio::sync::oneshot::channel::<()>();
        let (stop_registration, registration_stopped) = tokio::sync::oneshot::channel::<()>();
        let _g = rt.enter();
        // The CSI services first: a registration seen at once must find them.
        let incoming = ferrolet::apis::listen(&endpoint).unwrap();
        let (identity, node) = (
            Identity { name: name.into() },
            Node {
                base: base.clone(),
                opts: opts.clone(),
                calls: calls.clone(),
            },
        );
        rt.spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(csi::identity_server::IdentityServer::new(identity))
                .add_service(csi::node_server::NodeServer::new(node))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = csi_stopped.await;
                })
                .await;
        });
        // Made aside and renamed in, as node-driver-registrar's socket appears whole.
        let aside = registry.join(format!(".{file}-reg.sock"));
        let incoming = ferrolet::apis::listen(&aside).unwrap();
        std::fs::rename(&aside, &registration).unwrap();
        let service = Registration {
            name: name.into(),
            endpoint: opts.endpoint.clone().unwrap_or_else(|| endpoint.clone()),
            opts,
            notified: notified.clone(),
        };
        rt.spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(reg::registration_server::RegistrationServer::new(service))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = registration_stopped.await;
                })
                .await;
        });
        drop(_g);
        TestCsiPlugin {
            rt,
            name: name.into(),
            registration,
            endpoint,
            base,
            calls,
            notified,
            stop_registration: Some(stop_registration),
            stop_csi: Some(stop_csi),
        }
    }

    /// A volume: the directory `<base>/<handle>`, made.
    pub fn volume(&self, handle: &str) -> PathBuf {
        let d = self.base.join(handle);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// What NotifyRegistrationStatus said, in order.
    pub fn notifications(&self) -> Vec<(bool, String)> {
        self.notified.lock().unwrap().clone()
    }

    /// The first NotifyRegistrationStatus, waited for.
    pub fn first_notification(&self, timeout: Duration) -> (bool, String) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(n) = self.notifications().into_iter().next() {
                return n;
            }
            assert!(
                Instant::now() < deadline,
                "{}: no NotifyRegistrationStatus within {timeout:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    /// Stop registering: the registration socket goes (node-driver-registrar exiting).
    pub fn unregister(&mut self) {
        if let Some(s) = self.stop_registration.take() {
            let _ = s.send(());
        }
        let _ = std::fs::remove_file(&self.registration);
    }
}

impl Drop for TestCsiPlugin {
    fn drop(&mut self) {
        self.unregister();
        if let Some(s) = self.stop_csi.take() {
            let _ = s.send(());
        }
        let _ = std::fs::remove_file(&self.endpoint);
    }
}

/// Unmounts every mount under a directory when dropped (deepest first), so a failed test
/// leaves no mount behind.
pub struct MountGuard(pub PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        let prefix = format!("{}/", self.0.display());
        for _ in 0..8 {
            let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            let mut points: Vec<String> = info
                .lines()
                .filter_map(|l| l.split(' ').nth(4))
                .filter(|p| p.starts_with(&prefix))
                .map(String::from)
                .collect();
            if points.is_empty() {
                return;
            }
            points.sort_by_key(|p| std::cmp::Reverse(p.len()));
            for p in points {
                let _ = umount2(Path::new(&p), MntFlags::MNT_DETACH);
            }
        }
    }
}
