//! The node in a cluster (kubelet's Run for the node object: registerWithAPIServer,
//! syncNodeStatus on its period and the lease controller): register the Node, then keep its
//! status and Lease current for the agent's whole life, and watch the Node (kubelet's node
//! informer) so admission judges pods against its labels and taints as they are now, not as
//! registered. An API server that is down ends nothing: every loop retries and catches up when
//! it returns.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use ferrolet_runtime::image::ImageRecord;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::{watch, Mutex};
use tracing::{info, warn};

use super::conditions::Pressure;
use super::lease::{self, LeaseController};
use super::status::{self, Observed};
use super::{allocatable, machine, pod_cidr, register, NodeInfo};
use crate::checkpoint::Checkpoint;
use crate::config::Config;
use crate::events::{Kind, Recorder};
use crate::kubeclient::Kube;
use crate::tasks::{blocking, spawn_loop};

/// Why the node is not ready now: the runtime's and the pod network's errors, in kubelet's
/// words (`container runtime network not ready: NetworkReady=false reason:... message:...`);
/// empty when both are ready. Called off the async threads.
pub type Readiness = Arc<dyn Fn() -> Vec<String> + Send + Sync>;
/// The images in the node's store (`rt.images().list()`). Called off the async threads.
pub type ImageList = Arc<dyn Fn() -> Result<Vec<ImageRecord>> + Send + Sync>;
/// The node's pressures now, for its conditions: the eviction manager's (src/eviction/).
pub type PressureFn = Arc<dyn Fn() -> Pressure + Send + Sync>;
/// The device plugins' resources now (the device manager's counts).
pub type ExtendedFn = Arc<dyn Fn() -> crate::node::allocatable::Extended + Send + Sync>;
/// The volumes in use on the node (the volume manager's, made after the status loop starts).
pub type VolumesInUseFn = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

/// What the node's managers report into its status through the loop: the device plugins'
/// resources and the volumes in use.
pub struct Reported {
    pub extended: ExtendedFn,
    pub volumes_in_use: VolumesInUseFn,
}

/// kubelet's event at start, and the one for the pods' cgroup limit.
pub const STARTING: &str = "Starting";
pub const NODE_ALLOCATABLE_ENFORCED: &str = "NodeAllocatableEnforced";

/// The node the loops keep: its name, and the Node as last seen.
pub struct NodeHandle {
    kube: Kube,
    pub name: String,
    /// The Node as registered, then as its watch delivers it.
    registered: watch::Receiver<Option<Node>>,
    /// Where each version the watch delivers is kept, for a start without the API server.
    checkpoint: Arc<Checkpoint>,
    /// Wakes the status loop for a round now.
    sync_now: Arc<tokio::sync::Notify>,
}

impl NodeHandle {
    /// Have the status loop look at the node now rather than at its next period (kubelet's
    /// syncNodeStatus from the node shutdown manager): a change of readiness reaches the API
    /// server at once.
    pub fn sync_now(&self) -> Arc<dyn Fn() + Send + Sync> {
        let n = self.sync_now.clone();
        Arc::new(move || n.notify_one())
    }

    /// The Node as the API server last had it (registered by this agent, or found and watched:
    /// labels and taints added later are here), if it exists yet.
    pub fn node(&self) -> Option<Node> {
        self.registered.borrow().clone()
    }

    /// The Node's versions as registered, then as its watch delivers them.
    pub fn watched(&self) -> watch::Receiver<Option<Node>> {
        self.registered.clone()
    }

    /// The Node as the API server has it, or else as this node last saw it (its checkpoint,
    /// while the server has been away since the agent started).
    pub fn node_or_last_seen(&self) -> Option<Node> {
        self.node().or_else(|| self.checkpoint.node())
    }

    /// Wait until the Node exists (forever with registerNode off and no Node made by others).
    pub async fn registered(&self) -> Node {
        let mut rx = self.registered.clone();
        loop {
            if let Some(n) = rx.borrow_and_update().clone() {
                return n;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Wait up to `timeout` for the Node's spec.podCIDR ([`pod_cidr::wait`]; it asks the API
    /// server, so it also works before registration has finished or with registerNode off).
    pub async fn pod_cidr(&self, timeout: Duration) -> Option<String> {
        if let Some(c) = self.node().as_ref().and_then(pod_cidr::of) {
            return Some(c);
        }
        pod_cidr::wait(&self.kube, &self.name, timeout).await
    }
}

/// How long the status loop runs every second while the node has not been posted Ready
/// (kubelet's fastStatusUpdateOnce), before it settles at nodeStatusUpdateFrequency.
const FAST_UPDATES_FOR: Duration = Duration::from_secs(120);

/// Record Starting (and NodeAllocatableEnforced with pod cgroups), then start, without waiting
/// for the API server: the status loop, which first registers the Node when
/// `cfg.cluster.register_node` (retrying until it is registered) and then computes the status
/// every nodeStatusUpdateFrequency (every second until Ready is first posted, for at most
/// [`FAST_UPDATES_FOR`]) and posts it when it changed or every nodeStatusReportFrequency; and the
/// Lease loop, every nodeLeaseDurationSeconds/4.
#[allow(clippy::too_many_arguments)]
pub async fn start(
    kube: Kube,
    cfg: Arc<Config>,
    info: NodeInfo,
    images: ImageList,
    readiness: Readiness,
    events: Recorder,
    pressure: PressureFn,
    reported: Reported,
    checkpoint: Arc<Checkpoint>,
) -> Result<NodeHandle> {
    events.node(Kind::Normal, STARTING, "Starting kubelet.");
    // The container manager's event, before registration as in kubelet.
    if cfg.cgroups_per_qos {
        events.node(
            Kind::Normal,
            NODE_ALLOCATABLE_ENFORCED,
            "Updated Node Allocatable limit across pods",
        );
    }
    let identity = blocking(|| Ok(machine::identity())).await?;
    let (registered_tx, registered) = watch::channel(None);
    let registered_tx = Arc::new(registered_tx);
    tokio::spawn(watch_node(
        kube.clone(),
        info.name.clone(),
        registered_tx.clone(),
        checkpoint.clone(),
    ));
    let status_loop = Arc::new(Mutex::new(StatusLoop {
        kube: kube.clone(),
        cfg: cfg.clone(),
        info: info.clone(),
        identity,
        images,
        readiness,
        events,
        pressure,
        extended: reported.extended,
        volumes_in_use: reported.volumes_in_use,
        extended_seen: Default::default(),
        registered: registered_tx,
        is_registered: false,
        started: Instant::now(),
        last_report: None,
        ready_posted: false,
        failing: None,
    }));
    let sync_now = Arc::new(tokio::sync::Notify::new());
    let wake = sync_now.clone();
    spawn_loop("node status", Duration::from_secs(1), move || {
        let (s, wake) = (status_loop.clone(), wake.clone());
        async move {
            let mut s = s.lock().await;
            s.round().await;
            let every = s.cfg.cluster.node_status_update_frequency;
            let pause = if s.ready_posted || s.started.elapsed() > FAST_UPDATES_FOR {
                every
            } else {
                Duration::from_secs(1).min(every)
            };
            drop(s);
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = wake.notified() => {}
            }
            true
        }
    });

    let every = lease::renew_interval(cfg.cluster.node_lease_duration_seconds);
    let lease = Arc::new(Mutex::new(LeaseController::new(
        kube.clone(),
        &info.name,
        cfg.cluster.node_lease_duration_seconds,
    )));
    spawn_loop("node lease", every, move || {
        let lease = lease.clone();
        async move {
            lease.lock().await.heartbeat().await;
            tokio::time::sleep(every).await;
            true
        }
    });
    Ok(NodeHandle {
        kube,
        name: info.name,
        registered,
        checkpoint,
        sync_now,
    })
}

/// kubelet's node informer: the node's own Node (field selector `metadata.name`), listed then
/// watched, each version sent to `to`; a broken watch re-lists with back-off. A deleted Node
/// is kept as last seen (the status loop registers it again). Each version is also written to
/// the checkpoint.
async fn watch_node(kube: Kube, name: String, to: Arc<watch::Sender<Option<Node>>>, checkpoint: Arc<Checkpoint>) {
    use futures::StreamExt;
    use kube::runtime::watcher::{self, Event};
    use kube::runtime::WatchStreamExt;
    let api: Api<Node> = Api::all(kube.client());
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut failing = false;
    while let Some(ev) = events.next().await {
        match ev {
            Ok(Event::Apply(n) | Event::InitApply(n)) => {
                if failing {
                    info!(node = %name, "watching the Node again");
                    failing = false;
                }
                let (cp, copy) = (checkpoint.clone(), n.clone());
                if let Err(e) = blocking(move || cp.set_node(&copy)).await {
                    warn!(error = %format!("{e:#}"), "writing the Node's checkpoint");
                }
                to.send_replace(Some(n));
            }
            Ok(_) => {}
            Err(e) => {
                if !failing {
                    warn!(node = %name, error = %e, "watching the Node; retrying");
                    failing = true;
                }
            }
        }
        if to.is_closed() {
            return;
        }
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn record(events: &Recorder, node: &str, reasons: &[&'static str]) {
    for r in reasons {
        events.node(Kind::Normal, r, &format!("Node {node} status is now: {r}"));
    }
}

/// Gather what the setters need, off the async threads.
async fn observe(
    cfg: &Arc<Config>,
    info: &NodeInfo,
    identity: &machine::Identity,
    images: &ImageList,
    readiness: &Readiness,
    pressure: &PressureFn,
) -> Result<Observed> {
    let (cfg2, images, readiness) = (cfg.clone(), images.clone(), readiness.clone());
    let (capacity, records, not_ready) = blocking(move || {
        let capacity = machine::capacity(&cfg2.root_dir, cfg2.max_pods);
        Ok((capacity, images(), readiness()))
    })
    .await?;
    let images = match records {
        Ok(r) => status::node_images(r, cfg.images.node_status_max_images),
        Err(e) => {
            warn!(error = %format!("{e:#}"), "listing the node's images");
            Vec::new()
        }
    };
    let allocatable = allocatable::allocatable(&capacity, cfg.system_reserved, cfg.kube_reserved, &cfg.eviction_hard);
    Ok(Observed {
        addresses: status::addresses(&info.name, &info.ips),
        capacity,
        allocatable,
        identity: identity.clone(),
        images,
        pressure: pressure(),
        not_ready,
        kubelet_port: cfg.serving.port.into(),
        extended: Default::default(),
        extended_gone: Vec::new(),
        volumes_in_use: Vec::new(),
    })
}

struct StatusLoop {
    kube: Kube,
    cfg: Arc<Config>,
    info: NodeInfo,
    identity: machine::Identity,
    images: ImageList,
    readiness: Readiness,
    events: Recorder,
    pressure: PressureFn,
    extended: ExtendedFn,
    volumes_in_use: VolumesInUseFn,
    /// Every resource a device plugin served since the start: one it no longer serves leaves
    /// the Node's status.
    extended_seen: std::collections::BTreeSet<String>,
    /// The Node as last seen (registration and the Node's watch both send).
    registered: Arc<watch::Sender<Option<Node>>>,
    /// This agent has registered the Node (registerNode).
    is_registered: bool,
    started: Instant,
    /// When the status was last posted.
    last_report: Option<Instant>,
    /// Whether a Ready=True status has been posted (until then the loop runs every second, as
    /// kubelet's fastStatusUpdateOnce).
    ready_posted: bool,
    /// The error of the last round, if it failed (logged once per change).
    failing: Option<String>,
}

impl StatusLoop {
    /// What the machine and the agent show now.
    async fn observe(&mut self) -> Result<Observed> {
        let mut o = observe(
            &self.cfg,
            &self.info,
            &self.identity,
            &self.images,
            &self.readiness,
            &self.pressure,
        )
        .await?;
        o.extended = (self.extended)();
        o.volumes_in_use = (self.volumes_in_use)();
        self.extended_seen.extend(o.extended.capacity.keys().cloned());
        o.extended_gone = self
            .extended_seen
            .iter()
            .filter(|r| !o.extended.capacity.contains_key(*r))
            .cloned()
            .collect();
        Ok(o)
    }

    /// kubelet's registerWithAPIServer: the Node created (or taken over) with its status;
    /// returns once it is, retrying meanwhile.
    async fn register(&mut self) -> Result<()> {
        let o = self.observe().await?;
        let mut initial = register::initial_node(&self.cfg);
        let recorded = status::set_node_status(&mut initial, &o, &now());
        let node = register::register(&self.kube, &initial).await;
        record(&self.events, &self.info.name, &recorded);
        self.registered.send_replace(Some(node));
        self.is_registered = true;
        Ok(())
    }

    /// One round: registration first (until it is done), then kubelet's updateNodeStatus: read
    /// the Node, run the setters, post the status when it changed or the report period passed.
    async fn round(&mut self) {
        if self.cfg.cluster.register_node && !self.is_registered {
            if let Err(e) = self.register().await {
                warn!(node = %self.info.name, error = %format!("{e:#}"), "registering the node");
                return;
            }
        }
        match self.try_round().await {
            Ok(()) => {
                if self.failing.take().is_some() {
                    info!(node = %self.info.name, "updating the node status again");
                }
            }
            Err(e) => {
                let e = format!("{e:#}");
                if self.failing.as_ref() != Some(&e) {
                    warn!(node = %self.info.name, error = %e, "updating the node status failed; retrying");
                    self.failing = Some(e);
                }
            }
        }
    }

    async fn try_round(&mut self) -> Result<()> {
        use anyhow::Context;
        let o = self.observe().await?;
        let nodes: Api<Node> = Api::all(self.kube.client());
        let name = &self.info.name;
        let node = nodes
            .get(name)
            .await
            .with_context(|| format!("getting the Node {name}"))?;
        let old = node.status.clone().unwrap_or_default();
        let mut updated = node.clone();
        let recorded = status::set_node_status(&mut updated, &o, &now());
        let new = updated.status.clone().unwrap_or_default();
        let due = self
            .last_report
            .is_none_or(|t| t.elapsed() >= self.cfg.cluster.node_status_report_frequency);
        if !due && !status::changed(&old, &new) {
            return Ok(());
        }
        let uid = node.metadata.uid.clone().unwrap_or_default();
        let patch = status::status_patch(&uid, &old, &new);
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .with_context(|| format!("patching the status of Node {name}"))?;
        self.last_report = Some(Instant::now());
        record(&self.events, name, &recorded);
        let ready = status::condition(&new, "Ready").is_some_and(|c| c.status == "True");
        if ready && !self.ready_posted {
            info!(node = %name, "the node is Ready");
        }
        self.ready_posted |= ready;
        Ok(())
    }
}
