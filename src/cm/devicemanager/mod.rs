//! kubelet's device manager (pkg/kubelet/cm/devicemanager): device plugins register on
//! `<root>/device-plugins/kubelet.sock` ([`registration`]), each serves one extended resource
//! (`vendor.example/gpu`), and its ListAndWatch stream ([`endpoint`]) tells which devices it has
//! and whether each is healthy. The node's capacity of the resource is its devices, its
//! allocatable the healthy ones ([`DeviceManager::extended`], into the Node's status and the
//! admission of pods that ask for it). A plugin whose stream ends has its devices counted
//! unhealthy; if it has not registered again within [`STOPPED_GRACE`] (kubelet's
//! endpointStopGracePeriod) its resource is removed. A container asking for devices gets
//! healthy free ones through the plugin's Allocate at its first start, kept in a checkpoint
//! ([`allocation`]). docs/device-plugins.md.

pub mod allocation;
mod endpoint;
mod registration;
pub mod watcher;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};
use tonic::transport::Channel;
use tracing::{info, warn};

use crate::apis::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use crate::apis::deviceplugin::v1beta1::{AllocateRequest, ContainerAllocateRequest};
use crate::node::allocatable::Extended;
use crate::pod;
pub use crate::pod::validation::is_extended_resource_name;
use allocation::{Allocated, Entry};

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
    /// The current plugin, for Allocate.
    client: Option<DevicePluginClient<Channel>>,
}

#[derive(Default)]
struct State {
    resources: BTreeMap<String, Resource>,
    generations: u64,
    /// The devices each container holds (kept in the checkpoint).
    allocations: Vec<Entry>,
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
    /// A manager of the plugins in `dir`, with the allocations its checkpoint kept; `changed`
    /// runs whenever the counts change.
    pub fn new(dir: PathBuf, changed: Arc<dyn Fn() + Send + Sync>) -> DeviceManager {
        let allocations = allocation::load(&dir).unwrap_or_else(|e| {
            warn!(error = %e, "device manager: the allocation checkpoint cannot be read; starting without it");
            Vec::new()
        });
        DeviceManager {
            dir,
            state: Arc::new(Mutex::new(State {
                allocations,
                ..Default::default()
            })),
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
    fn registered(&self, resource: &str, client: Option<DevicePluginClient<Channel>>) -> u64 {
        let mut st = self.state();
        st.generations += 1;
        let generation = st.generations;
        let r = st.resources.entry(resource.to_string()).or_default();
        r.generation = generation;
        r.stopped = None;
        r.client = client;
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

    /// The devices container `c` of `p` is to have: the ones it holds already (a restart keeps
    /// them), else free healthy ones of each extended resource it asks for, handed to their
    /// plugin's Allocate (kubelet's allocateContainerResources). `None` for a container that
    /// asks for none. The error says which resource and why; nothing is held after one.
    pub async fn allocate(&self, p: &Pod, c: &Container) -> Result<Option<Allocated>, String> {
        let wants = extended_requests(c);
        if wants.is_empty() {
            return Ok(None);
        }
        let uid = pod::uid(p).to_string();
        let init = pod::init_containers(p)
            .iter()
            .any(|i| i.name == c.name && !pod::is_sidecar(i));
        let mut out = Allocated::default();
        for (resource, n) in wants {
            let held = self
                .state()
                .allocations
                .iter()
                .find(|e| e.pod_uid == uid && e.container == c.name && e.resource == resource && !e.pending)
                .cloned();
            if let Some(e) = held {
                out.add(&e.response);
                continue;
            }
            let (ids, client) = self.choose(&uid, &c.name, init, &resource, n)?;
            let request = AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids.clone(),
                }],
            };
            let mut client = client;
            let answer = tokio::time::timeout(endpoint::CALL_TIMEOUT, client.allocate(request)).await;
            let answer = Self::answer(&resource, answer);
            let mut st = self.state();
            let Some(held) = st
                .allocations
                .iter_mut()
                .find(|e| e.pod_uid == uid && e.container == c.name && e.resource == resource && e.pending)
            else {
                return Err(format!("{resource}: the devices chosen were taken back meanwhile"));
            };
            match answer {
                Ok(answer) => {
                    info!(pod = %pod::full_name(p), container = %c.name, resource = %resource, devices = ?ids, "devices allocated");
                    out.add(&answer);
                    held.response = answer;
                    held.pending = false;
                }
                Err(e) => {
                    st.allocations.retain(|e| {
                        !(e.pod_uid == uid && e.container == c.name && e.resource == resource && e.pending)
                    });
                    return Err(e);
                }
            }
            drop(st);
            self.persist();
        }
        Ok(Some(out))
    }

    /// The plugin's answer to Allocate for one container, checked.
    fn answer(
        resource: &str,
        answer: Result<
            Result<tonic::Response<crate::apis::deviceplugin::v1beta1::AllocateResponse>, tonic::Status>,
            tokio::time::error::Elapsed,
        >,
    ) -> Result<crate::apis::deviceplugin::v1beta1::ContainerAllocateResponse, String> {
        let response = match answer {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(status)) => {
                return Err(format!(
                    "{resource}: the device plugin's Allocate failed: {}",
                    status.message()
                ))
            }
            Err(_) => {
                return Err(format!(
                    "{resource}: the device plugin did not answer Allocate within {:?}",
                    endpoint::CALL_TIMEOUT
                ))
            }
        };
        let [answer] = <[_; 1]>::try_from(response.container_responses).map_err(|r| {
            format!(
                "{resource}: the device plugin answered Allocate for {} containers, not 1",
                r.len()
            )
        })?;
        allocation::check_response(&answer)
            .map_err(|e| format!("{resource}: the device plugin's Allocate answer: {e}"))?;
        Ok(answer)
    }

    /// `n` healthy devices of `resource` no other container holds (a regular init container's
    /// of the same pod are free for the next ones), and the plugin to ask.
    /// They are held (pending) from here on: a container starting meanwhile gets others.
    fn choose(
        &self,
        uid: &str,
        container: &str,
        init: bool,
        resource: &str,
        n: usize,
    ) -> Result<(Vec<String>, DevicePluginClient<Channel>), String> {
        let mut st = self.state();
        // A choice whose answer never came (its round gave up) is chosen again.
        st.allocations
            .retain(|e| !(e.pod_uid == uid && e.container == container && e.resource == resource && e.pending));
        let st = &mut *st;
        let Some(r) = st.resources.get(resource) else {
            return Err(format!("{resource}: no device plugin serves it"));
        };
        let Some(client) = r.client.clone().filter(|_| r.stopped.is_none()) else {
            return Err(format!("{resource}: its device plugin is not running"));
        };
        let held: std::collections::BTreeSet<&str> = st
            .allocations
            .iter()
            .filter(|e| e.resource == resource)
            .filter(|e| !(e.pod_uid == uid && (e.init || e.container == container)))
            .flat_map(|e| e.ids.iter().map(String::as_str))
            .collect();
        let free: Vec<String> = r
            .devices
            .iter()
            .filter(|(id, d)| d.healthy && !held.contains(id.as_str()))
            .map(|(id, _)| id.clone())
            .take(n)
            .collect();
        if free.len() < n {
            return Err(format!("{resource}: {n} requested, {} healthy and free", free.len()));
        }
        st.allocations.push(Entry {
            pod_uid: uid.to_string(),
            container: container.to_string(),
            init,
            resource: resource.to_string(),
            ids: free.clone(),
            response: Default::default(),
            pending: true,
        });
        Ok((free, client))
    }

    /// The pod is gone from the node: its devices are free.
    pub fn free_pod(&self, uid: &str) {
        let freed = {
            let mut st = self.state();
            let before = st.allocations.len();
            st.allocations.retain(|e| e.pod_uid != uid);
            before != st.allocations.len()
        };
        if freed {
            self.persist();
        }
    }

    /// The devices each container holds, as (pod UID, container, resource, device IDs).
    pub fn allocations(&self) -> Vec<(String, String, String, Vec<String>)> {
        self.state()
            .allocations
            .iter()
            .map(|e| {
                (
                    e.pod_uid.clone(),
                    e.container.clone(),
                    e.resource.clone(),
                    e.ids.clone(),
                )
            })
            .collect()
    }

    /// Write the allocations to the checkpoint (a failure is logged: the devices stay held in
    /// memory).
    fn persist(&self) {
        let entries = self.state().allocations.clone();
        let registered = self.device_ids();
        if let Err(e) = allocation::store(&self.dir, &entries, registered) {
            warn!(error = %e, "device manager: writing the allocation checkpoint");
        }
    }

    /// Every device's ID, by resource (healthy or not), in one read.
    pub fn device_ids(&self) -> BTreeMap<String, Vec<String>> {
        self.state()
            .resources
            .iter()
            .map(|(name, r)| (name.clone(), r.devices.keys().cloned().collect()))
            .collect()
    }
}

/// The extended resources container `c` asks for, with how many of each.
fn extended_requests(c: &Container) -> Vec<(String, usize)> {
    let Some(r) = &c.resources else { return Vec::new() };
    let mut out = BTreeMap::new();
    for (k, q) in r.limits.iter().chain(r.requests.iter()).flatten() {
        if is_extended_resource_name(k) {
            let n = q.0.parse::<usize>().unwrap_or(0);
            if n > 0 {
                out.insert(k.clone(), n);
            }
        }
    }
    out.into_iter().collect()
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
        let g = m.registered("example.com/dev", None);
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
        let g2 = m.registered("example.com/dev", None);
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

    #[tokio::test]
    async fn devices_chosen_for_one_container_are_held_while_its_plugin_answers() {
        let m = DeviceManager::new("/nowhere".into(), Arc::new(|| {}));
        let lazy = tonic::transport::Endpoint::from_static("http://unix.invalid").connect_lazy();
        let g = m.registered("example.com/dev", Some(DevicePluginClient::new(lazy)));
        m.listed("example.com/dev", g, devs(&[("a", true), ("b", true), ("c", false)]));
        let (first, _) = m.choose("u1", "app", false, "example.com/dev", 1).unwrap();
        let (second, _) = m.choose("u2", "app", false, "example.com/dev", 1).unwrap();
        assert_eq!((first, second), (vec!["a".to_string()], vec!["b".to_string()]));
        // the unhealthy one is never chosen
        let e = m.choose("u3", "app", false, "example.com/dev", 1).unwrap_err();
        assert!(e.contains("0 healthy and free"), "{e}");
        // the first pod goes: its device is free again
        m.free_pod("u1");
        let (third, _) = m.choose("u3", "app", false, "example.com/dev", 1).unwrap();
        assert_eq!(third, ["a"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_plugin_back_within_the_grace_period_keeps_its_resource() {
        let m = DeviceManager::new("/nowhere".into(), Arc::new(|| {}));
        let g = m.registered("example.com/dev", None);
        m.listed("example.com/dev", g, devs(&[("a", true)]));
        m.stopped("example.com/dev", g);
        let g2 = m.registered("example.com/dev", None);
        m.listed("example.com/dev", g2, devs(&[("a", true)]));
        tokio::time::sleep(STOPPED_GRACE + Duration::from_secs(1)).await;
        assert_eq!(m.extended().allocatable["example.com/dev"], 1);
    }
}
