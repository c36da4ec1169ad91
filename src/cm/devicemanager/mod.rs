//! kubelet's device manager (pkg/kubelet/cm/devicemanager): device plugins register on
//! `<root>/device-plugins/kubelet.sock` ([`registration`]), each serves one extended resource
//! (`vendor.example/gpu`), and its ListAndWatch stream ([`endpoint`]) tells which devices it has
//! and whether each is healthy. The node's capacity of the resource is its devices, its
//! allocatable the healthy ones ([`DeviceManager::extended`], into the Node's status and the
//! admission of pods that ask for it). A plugin whose stream ends has its devices counted
//! unhealthy; if it has not registered again within [`STOPPED_GRACE`] (kubelet's
//! endpointStopGracePeriod) its resource is removed. A container asking for devices gets
//! healthy free ones at its first start ([`select`]: its pod's init containers' first, then
//! those the plugin prefers when it offers GetPreferredAllocation), through the plugin's
//! Allocate, kept in a checkpoint ([`allocation`]); a plugin that asks for PreStartContainer is
//! called before every start. A pod's devices are freed when it finishes or goes. Every call
//! to a plugin has a deadline, and a failure is an [`Error`] naming the resource and the
//! plugin. docs/device-plugins.md.

pub mod allocation;
mod endpoint;
mod registration;
pub mod select;
pub mod watcher;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};
use tonic::transport::Channel;
use tracing::{info, warn};

use crate::apis::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use crate::apis::deviceplugin::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse, ContainerPreferredAllocationRequest,
    DevicePluginOptions, PreStartContainerRequest, PreferredAllocationRequest,
};
use crate::node::allocatable::Extended;
use crate::pod;
pub use crate::pod::validation::is_extended_resource_name;
use allocation::{Allocated, Entry};
use select::Candidates;

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
    /// Its socket's name in the device plugin directory (named in errors).
    endpoint: String,
    /// What it said of itself (GetDevicePluginOptions): which calls it wants.
    options: DevicePluginOptions,
}

/// The plugin of one resource as a container's start needs it.
#[derive(Clone, Debug)]
struct Plugin {
    client: DevicePluginClient<Channel>,
    endpoint: String,
    options: DevicePluginOptions,
}

/// Why a container cannot have its devices: the resource (and its plugin) and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("{resource}: no device plugin serves it")]
    Unserved { resource: String },
    #[error("{resource}: its device plugin {endpoint:?} is not running")]
    NotRunning { resource: String, endpoint: String },
    #[error("{resource}: {requested} requested, {free} healthy and free")]
    Unavailable {
        resource: String,
        requested: usize,
        free: usize,
    },
    /// A call to the plugin failed, timed out or was answered with something unusable.
    #[error("{resource}: device plugin {endpoint:?}: {call} {why}")]
    Plugin {
        resource: String,
        endpoint: String,
        call: &'static str,
        why: String,
    },
    #[error("{resource}: the devices chosen were taken back meanwhile")]
    TakenBack { resource: String },
}

impl Error {
    /// The resource whose devices could not be had.
    pub fn resource(&self) -> &str {
        match self {
            Error::Unserved { resource }
            | Error::NotRunning { resource, .. }
            | Error::Unavailable { resource, .. }
            | Error::Plugin { resource, .. }
            | Error::TakenBack { resource } => resource,
        }
    }
}

/// What a call to a plugin came to: its answer, a refusal, or no answer within the deadline.
type Called<T> = Result<Result<tonic::Response<T>, tonic::Status>, tokio::time::error::Elapsed>;

/// A plugin's answer, or why there was none, for [`Error::Plugin`].
fn answered<T>(called: Called<T>, timeout: Duration) -> Result<T, String> {
    match called {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(status)) => Err(format!("failed: {} ({:?})", status.message(), status.code())),
        Err(_) => Err(format!("did not answer within {timeout:?}")),
    }
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
    /// Held while the checkpoint is written.
    persisting: Arc<Mutex<()>>,
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
            persisting: Arc::default(),
            changed,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A plugin on socket `endpoint` registered `resource` with `options`: a new generation,
    /// which replaces any earlier plugin of the resource. Its devices are unknown until its
    /// first list.
    fn registered(
        &self,
        resource: &str,
        endpoint: &str,
        client: Option<DevicePluginClient<Channel>>,
        options: DevicePluginOptions,
    ) -> u64 {
        let mut st = self.state();
        st.generations += 1;
        let generation = st.generations;
        let r = st.resources.entry(resource.to_string()).or_default();
        r.generation = generation;
        r.stopped = None;
        r.client = client;
        r.endpoint = endpoint.to_string();
        r.options = options;
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

    /// The extended resources pod `p` holds devices of (the checkpoint keeps them across agent
    /// restarts). Admission lets such a pod keep them whatever the plugin now lists, as kubelet
    /// does (its Allocate finds them pre-allocated, and sanitizeNodeAllocatable counts held
    /// devices as allocatable): a restarted agent admits its pods again before their plugins
    /// have registered again.
    pub fn held_by(&self, p: &Pod) -> std::collections::BTreeSet<String> {
        let uid = pod::uid(p);
        self.state()
            .allocations
            .iter()
            .filter(|e| e.pod_uid == uid && !e.pending)
            .map(|e| e.resource.clone())
            .collect()
    }

    /// The devices container `c` of `p` is to have at this start: the ones it holds already (a
    /// restart keeps them), else healthy free ones of each extended resource it asks for,
    /// chosen with the plugin's GetPreferredAllocation where it offers it and handed to its
    /// Allocate (kubelet's allocateContainerResources); then, for a plugin that asks for it,
    /// its PreStartContainer with the container's devices (kubelet's
    /// GetDeviceRunContainerOptions, at every start). `None` for a container that asks for
    /// none. The error names the resource, its plugin and why; nothing new is held after one.
    pub async fn allocate(&self, p: &Pod, c: &Container) -> Result<Option<Allocated>, Error> {
        let wants = extended_requests(c);
        if wants.is_empty() {
            return Ok(None);
        }
        let uid = pod::uid(p).to_string();
        let init = pod::init_containers(p)
            .iter()
            .any(|i| i.name == c.name && !pod::is_sidecar(i));
        let mut out = Allocated::default();
        let mut held_ids = Vec::new();
        for (resource, n) in wants {
            let held = self
                .state()
                .allocations
                .iter()
                .find(|e| e.pod_uid == uid && e.container == c.name && e.resource == resource && !e.pending)
                .cloned();
            if let Some(e) = held {
                out.add(&e.response);
                held_ids.push((resource, e.ids));
                continue;
            }
            let (ids, plugin) = self.choose(&uid, &c.name, init, &resource, n).await?;
            let request = AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids.clone(),
                }],
            };
            let mut client = plugin.client.clone();
            let called = tokio::time::timeout(endpoint::CALL_TIMEOUT, client.allocate(request)).await;
            let answer = Self::answer(called).map_err(|why| Error::Plugin {
                resource: resource.clone(),
                endpoint: plugin.endpoint.clone(),
                call: "Allocate",
                why,
            });
            let mut st = self.state();
            let Some(held) = st
                .allocations
                .iter_mut()
                .find(|e| e.pod_uid == uid && e.container == c.name && e.resource == resource && e.pending)
            else {
                return Err(Error::TakenBack { resource });
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
            held_ids.push((resource, ids));
        }
        for (resource, ids) in held_ids {
            self.pre_start(&resource, ids).await?;
        }
        Ok(Some(out))
    }

    /// The plugin's answer to Allocate for one container, checked (kubelet requires one
    /// answer per container asked for).
    fn answer(
        called: Called<crate::apis::deviceplugin::v1beta1::AllocateResponse>,
    ) -> Result<ContainerAllocateResponse, String> {
        let response = answered(called, endpoint::CALL_TIMEOUT)?;
        let [answer] = <[_; 1]>::try_from(response.container_responses)
            .map_err(|r| format!("answered for {} containers, not 1", r.len()))?;
        allocation::check_response(&answer).map_err(|e| format!("answer: {e}"))?;
        Ok(answer)
    }

    /// PreStartContainer with the container's `ids` of `resource`, when its plugin asks for
    /// it (kubelet's callPreStartContainerIfNeeded, with kubelet's 30 s deadline).
    async fn pre_start(&self, resource: &str, ids: Vec<String>) -> Result<(), Error> {
        let plugin = {
            let st = self.state();
            // A resource no plugin serves now (after an agent restart, until its plugin
            // registers again) has no plugin that asked for the call, as kubelet's stopped
            // endpoint without options.
            let Some(r) = st.resources.get(resource).filter(|r| r.options.pre_start_required) else {
                return Ok(());
            };
            match r.client.clone().filter(|_| r.stopped.is_none()) {
                Some(client) => (client, r.endpoint.clone()),
                None => {
                    return Err(Error::NotRunning {
                        resource: resource.to_string(),
                        endpoint: r.endpoint.clone(),
                    })
                }
            }
        };
        let (mut client, endpoint) = plugin;
        let request = PreStartContainerRequest {
            devices_ids: ids.clone(),
        };
        let called = tokio::time::timeout(endpoint::PRE_START_TIMEOUT, client.pre_start_container(request)).await;
        answered(called, endpoint::PRE_START_TIMEOUT).map_err(|why| Error::Plugin {
            resource: resource.to_string(),
            endpoint,
            call: "PreStartContainer",
            why,
        })?;
        tracing::debug!(resource, devices = ?ids, "device plugin: PreStartContainer done");
        Ok(())
    }

    /// `n` healthy devices of `resource` no other container holds (its pod's regular init
    /// containers' first), with the plugin's preferred ones where it offers to say
    /// (kubelet's devicesToAllocate), and the plugin. They are held (pending) from here on:
    /// a container starting meanwhile gets others.
    async fn choose(
        &self,
        uid: &str,
        container: &str,
        init: bool,
        resource: &str,
        n: usize,
    ) -> Result<(Vec<String>, Plugin), Error> {
        let (candidates, plugin) = self.candidates(uid, container, resource, n)?;
        let mut preferred = None;
        if plugin.options.get_preferred_allocation_available && candidates.ask_plugin(n) {
            let (available, must_include) = candidates.preferred_request();
            let request = PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_i_ds: available,
                    must_include_device_i_ds: must_include,
                    allocation_size: n as i32,
                }],
            };
            let mut client = plugin.client.clone();
            let called = tokio::time::timeout(endpoint::CALL_TIMEOUT, client.get_preferred_allocation(request)).await;
            // kubelet fails the allocation when the call fails.
            let answer = answered(called, endpoint::CALL_TIMEOUT).map_err(|why| Error::Plugin {
                resource: resource.to_string(),
                endpoint: plugin.endpoint.clone(),
                call: "GetPreferredAllocation",
                why,
            })?;
            let ids = answer
                .container_responses
                .into_iter()
                .next()
                .map(|r| r.device_i_ds)
                .unwrap_or_default();
            // An answer that cannot be taken as it is: kubelet keeps what of it is free and
            // fills up with its own choice.
            if let Err(why) = candidates.check_preferred(n, &ids) {
                warn!(resource, endpoint = %plugin.endpoint, answer = ?ids, "device plugin: GetPreferredAllocation's answer cannot be taken as it is ({why}); its free devices are kept and the rest chosen here");
            }
            preferred = Some(ids);
        }
        self.reserve(uid, container, init, resource, n, preferred.as_deref())
    }

    /// The devices container `container` of pod `uid` may be given, and the plugin, or why
    /// there are not `n`.
    fn candidates(&self, uid: &str, container: &str, resource: &str, n: usize) -> Result<(Candidates, Plugin), Error> {
        Self::candidates_in(&self.state(), uid, container, resource, n)
    }

    fn candidates_in(
        st: &State,
        uid: &str,
        container: &str,
        resource: &str,
        n: usize,
    ) -> Result<(Candidates, Plugin), Error> {
        let Some(r) = st.resources.get(resource) else {
            return Err(Error::Unserved {
                resource: resource.to_string(),
            });
        };
        let Some(client) = r.client.clone().filter(|_| r.stopped.is_none()) else {
            return Err(Error::NotRunning {
                resource: resource.to_string(),
                endpoint: r.endpoint.clone(),
            });
        };
        let candidates = Candidates::of(&r.devices, &st.allocations, uid, container, resource);
        if !candidates.enough(n) {
            return Err(Error::Unavailable {
                resource: resource.to_string(),
                requested: n,
                free: candidates.reusable.len() + candidates.free.len(),
            });
        }
        let plugin = Plugin {
            client,
            endpoint: r.endpoint.clone(),
            options: r.options,
        };
        Ok((candidates, plugin))
    }

    /// Hold `n` devices of `resource` for the container (pending its plugin's Allocate),
    /// picked from what is free now with the plugin's `preferred` ones first.
    fn reserve(
        &self,
        uid: &str,
        container: &str,
        init: bool,
        resource: &str,
        n: usize,
        preferred: Option<&[String]>,
    ) -> Result<(Vec<String>, Plugin), Error> {
        let mut st = self.state();
        // A choice whose answer never came (its round gave up) is chosen again.
        st.allocations
            .retain(|e| !(e.pod_uid == uid && e.container == container && e.resource == resource && e.pending));
        let (candidates, plugin) = Self::candidates_in(&st, uid, container, resource, n)?;
        let Some(ids) = candidates.pick(n, preferred) else {
            return Err(Error::Unavailable {
                resource: resource.to_string(),
                requested: n,
                free: candidates.reusable.len() + candidates.free.len(),
            });
        };
        st.allocations.push(Entry {
            pod_uid: uid.to_string(),
            container: container.to_string(),
            init,
            resource: resource.to_string(),
            ids: ids.clone(),
            response: Default::default(),
            pending: true,
        });
        Ok((ids, plugin))
    }

    /// The pod is gone from the node, or has finished (kubelet's UpdateAllocatedDevices frees
    /// the devices of pods that are not active): its devices are the next pods', and the
    /// checkpoint says so. `why` is logged.
    pub fn free_pod(&self, uid: &str, why: &str) {
        let freed: Vec<(String, Vec<String>)> = {
            let mut st = self.state();
            let (gone, kept) = std::mem::take(&mut st.allocations)
                .into_iter()
                .partition(|e| e.pod_uid == uid);
            st.allocations = kept;
            gone.into_iter().map(|e: Entry| (e.resource, e.ids)).collect()
        };
        if !freed.is_empty() {
            info!(pod_uid = uid, devices = ?freed, "devices freed: {why}");
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
        // One writer at a time, each with the state as it is when it writes: two changes
        // persisted at once never leave the older one in the file.
        let _writing = self.persisting.lock().unwrap_or_else(|e| e.into_inner());
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
        let g = m.registered("example.com/dev", "dev.sock", None, Default::default());
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
        let g2 = m.registered("example.com/dev", "dev.sock", None, Default::default());
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
        let g = m.registered(
            "example.com/dev",
            "dev.sock",
            Some(DevicePluginClient::new(lazy)),
            Default::default(),
        );
        m.listed("example.com/dev", g, devs(&[("a", true), ("b", true), ("c", false)]));
        let (first, _) = m.reserve("u1", "app", false, "example.com/dev", 1, None).unwrap();
        let (second, _) = m.reserve("u2", "app", false, "example.com/dev", 1, None).unwrap();
        assert_eq!((first, second), (vec!["a".to_string()], vec!["b".to_string()]));
        // the unhealthy one is never chosen
        let e = m.reserve("u3", "app", false, "example.com/dev", 1, None).unwrap_err();
        assert!(e.to_string().contains("0 healthy and free"), "{e}");
        assert_eq!(e.resource(), "example.com/dev");
        // the first pod goes: its device is free again
        m.free_pod("u1", "removed");
        let (third, _) = m.reserve("u3", "app", false, "example.com/dev", 1, None).unwrap();
        assert_eq!(third, ["a"]);
    }

    #[tokio::test]
    async fn a_finished_pods_devices_are_free_and_gone_from_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let m = DeviceManager::new(dir.path().into(), Arc::new(|| {}));
        let lazy = tonic::transport::Endpoint::from_static("http://unix.invalid").connect_lazy();
        let g = m.registered(
            "example.com/dev",
            "dev.sock",
            Some(DevicePluginClient::new(lazy)),
            Default::default(),
        );
        m.listed("example.com/dev", g, devs(&[("a", true), ("b", true)]));
        for uid in ["u1", "u2"] {
            m.reserve(uid, "app", false, "example.com/dev", 1, None).unwrap();
        }
        // Allocate answered for both
        m.state().allocations.iter_mut().for_each(|e| e.pending = false);
        m.persist();
        assert_eq!(allocation::load(dir.path()).unwrap().len(), 2);
        let e = m.reserve("u3", "app", false, "example.com/dev", 1, None).unwrap_err();
        assert_eq!(
            e,
            Error::Unavailable {
                resource: "example.com/dev".into(),
                requested: 1,
                free: 0
            }
        );
        m.free_pod("u1", "the pod finished");
        let kept = allocation::load(dir.path()).unwrap();
        assert_eq!(
            kept.iter().map(|e| e.pod_uid.as_str()).collect::<Vec<_>>(),
            ["u2"],
            "the checkpoint follows"
        );
        let (ids, _) = m.reserve("u3", "app", false, "example.com/dev", 1, None).unwrap();
        assert_eq!(ids, ["a"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_plugin_back_within_the_grace_period_keeps_its_resource() {
        let m = DeviceManager::new("/nowhere".into(), Arc::new(|| {}));
        let g = m.registered("example.com/dev", "dev.sock", None, Default::default());
        m.listed("example.com/dev", g, devs(&[("a", true)]));
        m.stopped("example.com/dev", g);
        let g2 = m.registered("example.com/dev", "dev.sock", None, Default::default());
        m.listed("example.com/dev", g2, devs(&[("a", true)]));
        tokio::time::sleep(STOPPED_GRACE + Duration::from_secs(1)).await;
        assert_eq!(m.extended().allocatable["example.com/dev"], 1);
    }
}
