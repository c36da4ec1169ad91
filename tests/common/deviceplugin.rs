#![allow(dead_code)]
//! A real device plugin for the tests: it serves deviceplugin.v1beta1's DevicePlugin service
//! over gRPC on a unix socket in the agent's device plugin directory and registers with the
//! agent's `kubelet.sock`, as smarter-device-manager or NVIDIA's plugin do. Its devices are
//! named by the test, each with a health the test can change (ListAndWatch sends the new list);
//! Allocate hands back what a plugin gives a container: a device node (`/dev/null` under the
//! container path the test names), an env var and an annotation per device. [`Switches`] make
//! it ask for GetPreferredAllocation (answered from a preference list) and PreStartContainer
//! (recorded, and written to a file the container can read), or answer Allocate badly: never,
//! with a relative device path, or with two answers for one container.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api::device_plugin_server::{DevicePlugin, DevicePluginServer};
use api::registration_client::RegistrationClient;
use ferrolet::apis::deviceplugin::v1beta1 as api;
use futures::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// What the plugin lists: device ID -> healthy.
pub type Devices = BTreeMap<String, bool>;

/// How the plugin answers Allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocateMode {
    /// As a good plugin: a device node, an env var and an annotation per device.
    Good,
    /// Never answers.
    Hang,
    /// A device whose host path is not absolute.
    BadPath,
    /// Two answers for the one container asked for.
    TwoAnswers,
}

/// What the test can change of the plugin's behaviour while it runs, and what it recorded.
#[derive(Debug)]
pub struct Switches {
    /// What GetDevicePluginOptions says.
    pub options: api::DevicePluginOptions,
    /// GetPreferredAllocation answers with these devices that are available (in this order),
    /// after the must-include ones, up to the size asked for; or, when `preferred_exact`,
    /// with exactly this list.
    pub preferred: Vec<String>,
    pub preferred_exact: bool,
    pub allocate: AllocateMode,
    /// Each GetPreferredAllocation asked: (available, must include, size).
    pub preferred_asked: Vec<(Vec<String>, Vec<String>, i32)>,
    /// Each PreStartContainer's device IDs, in order.
    pub pre_starts: Vec<Vec<String>>,
    /// PreStartContainer writes `<n> <ids>` (n: how many times it was called with these IDs)
    /// to the file named by the IDs (`p3,p4`) in this directory, for the container to read.
    pub pre_start_marks: Option<PathBuf>,
}

impl Default for Switches {
    fn default() -> Switches {
        Switches {
            options: api::DevicePluginOptions::default(),
            preferred: Vec::new(),
            preferred_exact: false,
            allocate: AllocateMode::Good,
            preferred_asked: Vec::new(),
            pre_starts: Vec::new(),
            pre_start_marks: None,
        }
    }
}

struct Service {
    devices: watch::Receiver<Devices>,
    /// Every Allocate's device IDs, per container, in order.
    allocations: Arc<Mutex<Vec<Vec<String>>>>,
    switches: Arc<Mutex<Switches>>,
}

fn listing(d: &Devices) -> api::ListAndWatchResponse {
    api::ListAndWatchResponse {
        devices: d
            .iter()
            .map(|(id, healthy)| api::Device {
                id: id.clone(),
                health: if *healthy { api::HEALTHY } else { api::UNHEALTHY }.into(),
                topology: None,
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(self.switches.lock().unwrap().options))
    }

    type ListAndWatchStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

    async fn list_and_watch(&self, _: Request<api::Empty>) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let rx = self.devices.clone();
        // The current list at once, then each change.
        let stream = futures::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first && rx.changed().await.is_err() {
                return None;
            }
            let list = listing(&rx.borrow_and_update());
            Some((Ok(list), (rx, false)))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        r: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let mut sw = self.switches.lock().unwrap();
        let mut out = api::PreferredAllocationResponse::default();
        for c in r.into_inner().container_requests {
            let mut available = c.available_device_i_ds.clone();
            available.sort();
            let mut must = c.must_include_device_i_ds.clone();
            must.sort();
            sw.preferred_asked.push((available, must, c.allocation_size));
            let ids = if sw.preferred_exact {
                sw.preferred.clone()
            } else {
                let mut ids = c.must_include_device_i_ds.clone();
                for id in &sw.preferred {
                    if ids.len() < c.allocation_size as usize
                        && c.available_device_i_ds.contains(id)
                        && !ids.contains(id)
                    {
                        ids.push(id.clone());
                    }
                }
                ids
            };
            out.container_responses
                .push(api::ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(out))
    }

    async fn allocate(&self, r: Request<api::AllocateRequest>) -> Result<Response<api::AllocateResponse>, Status> {
        let mode = self.switches.lock().unwrap().allocate;
        let mut out = api::AllocateResponse::default();
        for c in r.into_inner().container_requests {
            self.allocations.lock().unwrap().push(c.devices_ids.clone());
            let mut resp = api::ContainerAllocateResponse::default();
            for id in &c.devices_ids {
                resp.devices.push(api::DeviceSpec {
                    container_path: format!("/dev/test-{id}"),
                    host_path: if mode == AllocateMode::BadPath {
                        "null"
                    } else {
                        "/dev/null"
                    }
                    .into(),
                    permissions: "rw".into(),
                });
            }
            resp.envs.insert("TEST_DEVICES".into(), c.devices_ids.join(","));
            resp.annotations
                .insert("test.example.com/devices".into(), c.devices_ids.join(","));
            if mode == AllocateMode::TwoAnswers {
                out.container_responses.push(resp.clone());
            }
            out.container_responses.push(resp);
        }
        if mode == AllocateMode::Hang {
            futures::future::pending::<()>().await;
        }
        Ok(Response::new(out))
    }

    async fn pre_start_container(
        &self,
        r: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        let mut ids = r.into_inner().devices_ids;
        ids.sort();
        let mut sw = self.switches.lock().unwrap();
        sw.pre_starts.push(ids.clone());
        if let Some(marks) = &sw.pre_start_marks {
            let n = sw.pre_starts.iter().filter(|i| **i == ids).count();
            let line = format!("{n} {}\n", ids.join(","));
            std::fs::write(marks.join(ids.join(",")), line).map_err(|e| Status::internal(e.to_string()))?;
        }
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

/// A running plugin; stopped (its socket removed) when dropped.
pub struct TestDevicePlugin {
    rt: tokio::runtime::Runtime,
    dir: PathBuf,
    pub resource: String,
    pub endpoint: String,
    devices: watch::Sender<Devices>,
    pub allocations: Arc<Mutex<Vec<Vec<String>>>>,
    /// Its behaviour (set before it registers, for the options) and what it recorded.
    pub switches: Arc<Mutex<Switches>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl TestDevicePlugin {
    /// Serve `resource` with `devices` on `<dir>/<endpoint>`; not registered yet.
    pub fn serve(dir: &Path, resource: &str, endpoint: &str, devices: &[(&str, bool)]) -> TestDevicePlugin {
        TestDevicePlugin::serve_with(dir, resource, endpoint, devices, Switches::default())
    }

    /// As [`TestDevicePlugin::serve`], behaving as `switches` say.
    pub fn serve_with(
        dir: &Path,
        resource: &str,
        endpoint: &str,
        devices: &[(&str, bool)],
        switches: Switches,
    ) -> TestDevicePlugin {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let list: Devices = devices.iter().map(|(id, h)| (id.to_string(), *h)).collect();
        let (tx, rx) = watch::channel(list);
        let allocations = Arc::new(Mutex::new(Vec::new()));
        let socket = dir.join(endpoint);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let switches = Arc::new(Mutex::new(switches));
        let service = Service {
            devices: rx,
            allocations: allocations.clone(),
            switches: switches.clone(),
        };
        let incoming = {
            let _g = rt.enter();
            ferrolet::apis::listen(&socket).unwrap()
        };
        rt.spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(service))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
        });
        TestDevicePlugin {
            rt,
            dir: dir.to_path_buf(),
            resource: resource.into(),
            endpoint: endpoint.into(),
            devices: tx,
            allocations,
            switches,
            stop: Some(stop),
        }
    }

    /// Register with the agent's `kubelet.sock` in the directory, as `version`.
    pub fn register_as(&self, version: &str, resource: &str) -> Result<(), Status> {
        let socket = self.dir.join("kubelet.sock");
        let req = api::RegisterRequest {
            version: version.into(),
            endpoint: self.endpoint.clone(),
            resource_name: resource.into(),
            options: Some(self.switches.lock().unwrap().options),
        };
        self.rt.block_on(async move {
            let ch = ferrolet::apis::dial(&socket, Duration::from_secs(5))
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            RegistrationClient::new(ch).register(req).await.map(|_| ())
        })
    }

    /// Register with the agent, retrying while its socket is not there yet.
    pub fn register(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match self.register_as(api::VERSION, &self.resource.clone()) {
                Ok(()) => return,
                Err(e) if std::time::Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("registering {}: {e}", self.resource),
            }
        }
    }

    /// Change how it answers Allocate from now on.
    pub fn set_allocate(&self, mode: AllocateMode) {
        self.switches.lock().unwrap().allocate = mode;
    }

    /// Change a device's health (or add one): ListAndWatch sends the new list.
    pub fn set(&self, id: &str, healthy: bool) {
        self.devices.send_modify(|d| {
            d.insert(id.to_string(), healthy);
        });
    }
}

impl Drop for TestDevicePlugin {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = std::fs::remove_file(self.dir.join(&self.endpoint));
    }
}
