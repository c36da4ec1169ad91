//! Device plugins registered through the plugin watcher (`plugins_registry/`, kubelet's
//! devicemanager plugin handler for the `DevicePlugin` type) rather than through
//! `kubelet.sock`: the plugin's name is its extended resource, its endpoint its DevicePlugin
//! socket. Validated as `kubelet.sock` registrations are (v1beta1 among its versions, an
//! extended resource name), dialled with the deadline, asked its options, and read from then
//! on exactly like a plugin registered through `kubelet.sock`; its registration socket gone,
//! its devices count as unhealthy (the grace period of a plugin whose stream ended).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use anyhow::{bail, Context};

use super::endpoint::{connect, list_and_watch, options};
use super::{is_extended_resource_name, DeviceManager};
use crate::apis::deviceplugin::v1beta1::VERSION;
use crate::pluginmanager::PluginHandler;

/// The `DevicePlugin` handler of the plugin watcher.
pub struct DevicePluginHandler {
    m: DeviceManager,
    /// Resource -> (endpoint, generation) of the plugins it registered.
    registered: Mutex<BTreeMap<String, (String, u64)>>,
}

impl DevicePluginHandler {
    pub fn new(m: DeviceManager) -> DevicePluginHandler {
        DevicePluginHandler {
            m,
            registered: Mutex::new(BTreeMap::new()),
        }
    }
}

#[tonic::async_trait]
impl PluginHandler for DevicePluginHandler {
    async fn validate(&self, name: &str, _endpoint: &str, versions: &[String]) -> anyhow::Result<()> {
        if !versions.iter().any(|v| v == VERSION) {
            bail!("supported_versions: the device plugin versions {versions:?} do not include {VERSION}");
        }
        if !is_extended_resource_name(name) {
            bail!("name: {name:?} is not an extended resource name (vendor-domain/resource)");
        }
        Ok(())
    }

    async fn register(&self, name: &str, endpoint: &str, _versions: &[String]) -> anyhow::Result<()> {
        let mut client = connect(Path::new(endpoint))
            .await
            .with_context(|| format!("endpoint: connecting to the device plugin at {endpoint}"))?;
        // As through kubelet.sock: a plugin that cannot say its options is not used.
        let opts = options(&mut client)
            .await
            .map_err(|why| anyhow::anyhow!("GetDevicePluginOptions {why}"))?;
        let generation = self.m.registered(name, endpoint, Some(client.clone()), opts);
        self.registered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), (endpoint.to_string(), generation));
        tracing::info!(
            resource = name,
            endpoint,
            "device plugin registered through the plugin watcher"
        );
        tokio::spawn(list_and_watch(self.m.clone(), name.to_string(), generation, client));
        Ok(())
    }

    async fn deregister(&self, name: &str, endpoint: &str) {
        let mut reg = self.registered.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((e, generation)) = reg.get(name).cloned() {
            if e == endpoint {
                reg.remove(name);
                drop(reg);
                self.m.stopped(name, generation);
            }
        }
    }
}
