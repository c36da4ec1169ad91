//! kubelet's pod resources API (pkg/kubelet/apis/podresources, v1) on
//! `<root>/pod-resources/kubelet.sock`: what monitoring agents (dcgm-exporter, node feature
//! discovery) read to tie devices to pods. `List` gives each pod's containers with the device
//! IDs each holds, by resource; `GetAllocatableResources` every device the node's plugins
//! list. ferrolet has no CPU or memory manager, so CPU IDs and memory are empty, as on a kubelet
//! with the `none` policies.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::apis::podresources::v1::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
use crate::apis::podresources::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices, ContainerResources,
    ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};
use crate::cm::devicemanager::DeviceManager;
use crate::pod::{self, manager::PodManager};

/// The socket under the root dir (kubelet's `/var/lib/kubelet/pod-resources/kubelet.sock`).
pub fn socket(root: &Path) -> std::path::PathBuf {
    root.join("pod-resources").join("kubelet.sock")
}

struct Lister {
    pods: Arc<PodManager>,
    devices: DeviceManager,
}

/// `ids` grouped by resource, as the API lists them.
fn by_resource(held: impl Iterator<Item = (String, Vec<String>)>) -> Vec<ContainerDevices> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (resource, ids) in held {
        m.entry(resource).or_default().extend(ids);
    }
    m.into_iter()
        .map(|(resource_name, device_ids)| ContainerDevices {
            resource_name,
            device_ids,
            topology: None,
        })
        .collect()
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(&self, _: Request<ListPodResourcesRequest>) -> Result<Response<ListPodResourcesResponse>, Status> {
        let allocations = self.devices.allocations();
        let pod_resources = self
            .pods
            .entries()
            .into_iter()
            .map(|e| {
                let uid = pod::uid(&e.pod).to_string();
                let containers = pod::containers(&e.pod)
                    .iter()
                    .map(|c| ContainerResources {
                        name: c.name.clone(),
                        devices: by_resource(
                            allocations
                                .iter()
                                .filter(|(u, name, _, _)| *u == uid && *name == c.name)
                                .map(|(_, _, r, ids)| (r.clone(), ids.clone())),
                        ),
                        cpu_ids: Vec::new(),
                        memory: Vec::new(),
                    })
                    .collect();
                PodResources {
                    name: pod::name(&e.pod).to_string(),
                    namespace: pod::namespace(&e.pod).to_string(),
                    containers,
                }
            })
            .collect();
        Ok(Response::new(ListPodResourcesResponse { pod_resources }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        let devices = self
            .devices
            .device_ids()
            .into_iter()
            .flat_map(|(resource_name, ids)| {
                ids.into_iter().map(move |id| ContainerDevices {
                    resource_name: resource_name.clone(),
                    device_ids: vec![id],
                    topology: None,
                })
            })
            .collect();
        Ok(Response::new(AllocatableResourcesResponse {
            devices,
            cpu_ids: Vec::new(),
            memory: Vec::new(),
        }))
    }
}

/// Serve the API on its socket under `root` (made anew), in the background.
pub async fn serve(root: &Path, pods: Arc<PodManager>, devices: DeviceManager) -> Result<()> {
    let socket = socket(root);
    let incoming = crate::apis::listen(&socket).with_context(|| format!("listening on {}", socket.display()))?;
    info!(socket = %socket.display(), "pod resources API listening");
    tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(Lister { pods, devices }))
            .serve_with_incoming(incoming)
            .await;
        if let Err(e) = served {
            warn!(error = %ferrolet_fsutil::chain(&e), "pod resources API stopped");
        }
    });
    Ok(())
}
