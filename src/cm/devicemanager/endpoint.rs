//! One device plugin's endpoint (kubelet's devicemanager endpoint): a gRPC client over the
//! plugin's unix socket, and its ListAndWatch stream read into the device manager for as long
//! as it lasts. Every unary call has a deadline, so a plugin that hangs stalls nothing.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use tonic::transport::Channel;
use tracing::warn;

use super::{Device, DeviceManager};
use crate::apis::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use crate::apis::deviceplugin::v1beta1::{DevicePluginOptions, Empty, ListAndWatchResponse, HEALTHY};

/// The deadline of a connection and of every call to a plugin but its stream (kubelet's 10 s).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The deadline of PreStartContainer (kubelet's KubeletPreStartContainerRPCTimeoutInSecs).
pub const PRE_START_TIMEOUT: Duration = Duration::from_secs(30);

/// What the plugin says of itself (GetDevicePluginOptions, as kubelet asks when a plugin
/// connects), or why it did not say it within the deadline.
pub async fn options(client: &mut DevicePluginClient<Channel>) -> Result<DevicePluginOptions, String> {
    let called = tokio::time::timeout(CALL_TIMEOUT, client.get_device_plugin_options(Empty {})).await;
    super::answered(called, CALL_TIMEOUT)
}

/// A client of the plugin listening on `socket`.
pub async fn connect(socket: &Path) -> Result<DevicePluginClient<Channel>, tonic::transport::Error> {
    Ok(DevicePluginClient::new(crate::apis::dial(socket, CALL_TIMEOUT).await?))
}

/// The devices of one list, by ID. An empty ID cannot be allocated and is left out; a health
/// other than Healthy counts as unhealthy; of two devices with one ID the last counts.
pub fn devices_of(resource: &str, list: &ListAndWatchResponse) -> BTreeMap<String, Device> {
    let mut out = BTreeMap::new();
    for d in &list.devices {
        if d.id.is_empty() {
            warn!(resource, "device plugin: a device without an ID is ignored");
            continue;
        }
        out.insert(
            d.id.clone(),
            Device {
                healthy: d.health == HEALTHY,
            },
        );
    }
    out
}

/// Read the plugin's ListAndWatch stream into `m` until it ends, then mark its devices
/// unhealthy.
pub async fn list_and_watch(
    m: DeviceManager,
    resource: String,
    generation: u64,
    mut client: DevicePluginClient<Channel>,
) {
    match tokio::time::timeout(CALL_TIMEOUT, client.list_and_watch(Empty {})).await {
        Ok(Ok(response)) => {
            let mut stream = response.into_inner();
            loop {
                match stream.message().await {
                    Ok(Some(list)) => m.listed(&resource, generation, devices_of(&resource, &list)),
                    Ok(None) => break,
                    Err(status) => {
                        warn!(resource = %resource, error = %status.message(), code = ?status.code(), "device plugin: ListAndWatch failed");
                        break;
                    }
                }
            }
        }
        Ok(Err(status)) => {
            warn!(resource = %resource, error = %status.message(), code = ?status.code(), "device plugin: ListAndWatch refused")
        }
        Err(_) => warn!(resource = %resource, timeout = ?CALL_TIMEOUT, "device plugin: ListAndWatch did not answer"),
    }
    m.stopped(&resource, generation);
}
