//! kubelet's device manager (pkg/kubelet/cm/devicemanager): device plugins register on
//! `<root>/device-plugins/kubelet.sock` ([`registration`]), each serves one extended resource
//! (`vendor.example/gpu`), and its ListAndWatch stream ([`endpoint`]) tells which devices it has
//! and whether each is healthy. The node's capacity of the resource is its devices, its
//! allocatable the healthy ones ([`DeviceManager::extended`], into the Node's status and the
//! admission of pods that ask for it). A plugin whose stream ends has its devices counted
//! unhealthy; if it has not registered again within [`STOPPED_GRACE`] (kubelet's
//! endpointStopGracePeriod) its resource is removed. docs/device-plugins.md.

mod endpoint;
mod registration;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::node::allocatable::Extended;
pub use crate::pod::validation::is_extended_resource_name;

pub use registration::serve;

/// How long the resource of a plugin that went away stays (its devices unhealthy) before it is
/// removed from the node (kubelet's endpointStopGracePeriod).
pub const STOPPED_GRACE: Duration = Duration::from_secs(5 * 60);

/// The device plugin directory under the agent's root (kubelet's
/// `/var/lib/kubelet/device-plugins`).
pub fn plugin_dir(root: &Path) -> PathBuf {
    root.join("device-plugins")
}

/// One device as its plugin last listed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub healthy: bool,
}

/// One extended resource and the plugin serving it.
#[derive(Debug, Default)]
struct Resource {
    devices: BTreeMap<String, Device>,
    /// Which registration of the resource is current: a stream of an older one that ends
    /// changes nothing.
    generation: u64,
    /// The plugin's stream ended at this time and it has not registered since.
    stopped: Option<Instant>,
}

#[derive(Default)]
struct State {
    resources: BTreeMap<String, Resource>,
    generations: u64,
}

/// The node's device plugins and their devices. Cheap to clone.
#[derive(Clone)]
pub struct DeviceManager {
    dir: PathBuf,
    state: Arc<Mutex<State>>,
    /// Told when a resource's devices change (the node status posts the new counts).
    changed: Arc<dyn Fn() + Send + Sync>,
}

impl DeviceManager {
    /// A manager of the plugins in `dir`; `changed` runs whenever the counts change.
    pub fn new(dir: PathBuf, changed: Arc<dyn Fn() + Send + Sync>) -> DeviceManager {
        DeviceManager {
            dir,
            state: Arc::default(),
            changed,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A plugin registered `resource`: a new generation, which replaces any earlier plugin of
    /// the resource. Its devices are unknown until its first list.
    fn registered(&self, resource: &str) -> u64 {
        let mut st = self.state();
        st.generations += 1;
        let generation = st.generations;
        let r = st.resources.entry(resource.to_string()).or_default();
        r.generation = generation;
        r.stopped = None;
        generation
    }

    /// The plugin of `generation` listed `devices`.
    fn listed(&self, resource: &str, generation: u64, devices: BTreeMap<String, Device>) {
        let changed = {
            let mut st = self.state();
            match st.resources.get_mut(resource) {
                Some(r) if r.generation == generation => {
                    let changed = r.devices != devices;
                    if changed {
                        let healthy = devices.values().filter(|d| d.healthy).count();
                        info!(
                            resource,
                            devices = devices.len(),
                            healthy,
                            "device plugin: devices listed"
                        );
                    }
                    r.devices = devices;
                    changed
                }
                _ => false,
            }
        };
        if changed {
            (self.changed)();
        }
    }

    /// The stream of the plugin of `generation` ended: its devices count as unhealthy until it
    /// registers again, for at most [`STOPPED_GRACE`].
    fn stopped(&self, resource: &str, generation: u64) {
        let changed = {
            let mut st = self.state();
            match st.resources.get_mut(resource) {
                Some(r) if r.generation == generation && r.stopped.is_none() => {
                    warn!(
                        resource,
                        "device plugin: its stream ended; its devices are unhealthy until it registers again"
                    );
                    r.stopped = Some(Instant::now());
                    for d in r.devices.values_mut() {
                        d.healthy = false;
                    }
                    true
                }
                _ => false,
            }
        };
        if changed {
            (self.changed)();
            let (m, resource) = (self.clone(), resource.to_string());
            tokio::spawn(async move {
                tokio::time::sleep(STOPPED_GRACE).await;
                m.expire(&resource, generation);
            });
        }
    }

    /// The plugin of `generation` did not come back within the grace period: its resource goes.
    fn expire(&self, resource: &str, generation: u64) {
        let removed = {
            let mut st = self.state();
            let gone = st
                .resources
                .get(resource)
                .is_some_and(|r| r.generation == generation && r.stopped.is_some());
            if gone {
                st.resources.remove(resource);
                info!(
                    resource,
                    "device plugin: gone for longer than the grace period; resource removed"
                );
            }
            gone
        };
        if removed {
            (self.changed)();
        }
    }

    /// Each resource's devices (capacity) and healthy devices (allocatable).
    pub fn extended(&self) -> Extended {
        let st = self.state();
        let mut out = Extended::default();
        for (name, r) in &st.resources {
            out.capacity.insert(name.clone(), r.devices.len() as i64);
            out.allocatable
                .insert(name.clone(), r.devices.values().filter(|d| d.healthy).count() as i64);
        }
        out
    }

    /// The devices of `resource` as last listed.
    pub fn devices(&self, resource: &str) -> BTreeMap<String, Device> {
        self.state()
            .resources
            .get(resource)
            .map(|r| r.devices.clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devs(list: &[(&str, bool)]) -> BTreeMap<String, Device> {
        list.iter()
            .map(|(id, h)| (id.to_string(), Device { healthy: *h }))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn capacity_counts_devices_and_allocatable_the_healthy_ones() {
        let told = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let t = told.clone();
        let m = DeviceManager::new(
            "/nowhere".into(),
            Arc::new(move || {
                t.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }),
        );
        let g = m.registered("example.com/dev");
        m.listed("example.com/dev", g, devs(&[("a", true), ("b", false), ("c", true)]));
        let e = m.extended();
        assert_eq!(
            (e.capacity["example.com/dev"], e.allocatable["example.com/dev"]),
            (3, 2)
        );
        // the same list again changes nothing
        m.listed("example.com/dev", g, devs(&[("a", true), ("b", false), ("c", true)]));
        assert_eq!(told.load(std::sync::atomic::Ordering::SeqCst), 1);
        // a new registration replaces the old one: the old stream's end changes nothing
        let g2 = m.registered("example.com/dev");
        m.stopped("example.com/dev", g);
        assert_eq!(m.extended().allocatable["example.com/dev"], 2);
        // the current stream ends: unhealthy, then gone after the grace period
        m.stopped("example.com/dev", g2);
        let e = m.extended();
        assert_eq!(
            (e.capacity["example.com/dev"], e.allocatable["example.com/dev"]),
            (3, 0)
        );
        tokio::time::sleep(STOPPED_GRACE + Duration::from_secs(1)).await;
        assert!(m.extended().capacity.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_plugin_back_within_the_grace_period_keeps_its_resource() {
        let m = DeviceManager::new("/nowhere".into(), Arc::new(|| {}));
        let g = m.registered("example.com/dev");
        m.listed("example.com/dev", g, devs(&[("a", true)]));
        m.stopped("example.com/dev", g);
        let g2 = m.registered("example.com/dev");
        m.listed("example.com/dev", g2, devs(&[("a", true)]));
        tokio::time::sleep(STOPPED_GRACE + Duration::from_secs(1)).await;
        assert_eq!(m.extended().allocatable["example.com/dev"], 1);
    }
}
