//! The agent assembled (kubelet's NewMainKubelet and Run): the runtime and its images, the pod
//! cgroups and network, the managers the pod workers share, the sources feeding the pod config,
//! the main loop ([`sync_loop`]), the background duties, and the servers (HTTP API, CLI socket,
//! exec socket). Stopping the agent leaves the pods running; the next start adopts them.

mod cgroup_tree;
mod code_pages;
pub mod record;
pub mod run_once;
mod sync_loop;
mod systemd;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use ferrolet_runtime::{Runtime, ZygoteHandle};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::cm::pod_container_manager::PodCgroups;
use crate::config::Config;
use crate::events::Recorder;
use crate::images::local::{self, ImportDir};
use crate::images::ImageManager;
use crate::kubeclient::Kube;
use crate::mirror::{MirrorPods, MirrorQueue};
use crate::node::NodeInfo;
use crate::pod::manager::PodManager;
use crate::podconfig::{apiserver::ApiSource, file::FileSource, http::HttpSource, PodConfig};
use crate::podsetup::PodSetup;
use crate::status::sync::ApiStatusWriter;
use crate::status::StatusManager;
use crate::tasks::{blocking, spawn_loop, supervise, AfterQuiet, Liveness};
use crate::worker::cleanup::containers_by_pod;
use crate::worker::{Managers, PodWorkers};
use record::{load_record, save_record};
use sync_loop::Event;

/// Only one agent per root dir.
fn lock_root(root: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let path = root.join("ferrolet.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|_| anyhow!("another ferrolet is running with --root-dir {}", root.display()))
}

/// How often a pod network that is not ready is tried again (kubelet's runtime status period).
const NETWORK_STATUS_EVERY: Duration = Duration::from_secs(5);

/// The agent, in kubelet's order: the host prepared, the runtime opened, the cluster joined
/// (when there is one), the managers the pod workers share, the sources feeding the pod
/// config, the background duties, the servers; then it waits for a signal. Stopping leaves the
/// pods running.
pub async fn run(cfg: Config, zygote: ZygoteHandle, warnings: Vec<String>) -> Result<()> {
    for w in &warnings {
        warn!("config: {w}");
    }
    let (cfg, _lock) = prepare_host(cfg)?;
    let opened = open_runtime(&cfg, zygote).await?;
    let mut joined = join_cluster(cfg, &opened.rt).await?;
    let cfg = joined.cfg.clone();
    let managers = build_managers(&opened, &mut joined).await?;
    let sources = start_sources(&managers, &joined, opened.adoptable);
    if cfg.run_once {
        // As kubelet: no servers; the pods of the first update are run and reported, and the
        // agent exits, leaving them as they are.
        info!(node = %cfg.node_name, root = %cfg.root_dir.display(), "ferrolet started in runOnce mode");
        run_once::run(sources.first_update, managers.pods.clone()).await?;
        info!("Started kubelet as runonce");
        return Ok(());
    }
    let stats = start_duties(&managers, opened.import, &sources.events)?;
    serve(&managers, &joined, stats).await?;
    systemd::start(sources.all_seen, managers.liveness.clone());
    wait_for_signal().await?;
    systemd::stopping();
    info!("shutting down; pods keep running and are adopted by the next start");
    let _ = std::fs::remove_file(cfg.socket_path());
    let _ = std::fs::remove_file(cfg.exec_socket_path());
    Ok(())
}

/// The host made ready for the agent: open-files limit and OOM score, the root directory
/// locked (one agent per root), the directories it writes, dead log links removed.
fn prepare_host(cfg: Config) -> Result<(Arc<Config>, nix::fcntl::Flock<std::fs::File>)> {
    let cfg = Arc::new(cfg);
    raise_open_files_limit();
    // kubelet's oomScoreAdj: the agent is the last process the kernel picks.
    match crate::cm::apply_own_oom_score_adj(cfg.cm.oom_score_adj) {
        Ok(()) => info!(
            oom_score_adj = cfg.cm.oom_score_adj,
            "oom_score_adj applied to the agent"
        ),
        Err(e) => warn!(error = %format!("{e:#}"), "Failed to ApplyOOMScoreAdj"),
    }
    std::fs::create_dir_all(&cfg.root_dir).with_context(|| format!("creating {}", cfg.root_dir.display()))?;
    let lock = lock_root(&cfg.root_dir)?;
    for d in [cfg.pods_dir(), cfg.pod_logs_dir.clone(), cfg.image_import_dir.clone()] {
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    }
    // As kubelet: the log links' directory exists from the start; links whose log is gone
    // (an agent stopped between removing a container and its link) are removed.
    if let Err(e) = std::fs::create_dir_all(&cfg.container_log_link_dir) {
        warn!(dir = %cfg.container_log_link_dir.display(), error = %e, "creating the container log links' directory");
    }
    let dead = crate::kuberuntime::log_links::remove_dead_links(&cfg.container_log_link_dir, &cfg.pod_logs_dir);
    if dead > 0 {
        info!(count = dead, "removed container log links to logs that are gone");
    }
    if let Some(p) = &cfg.static_pod_path {
        if p == Path::new("/etc/ferrolet/manifests") && !p.exists() {
            let _ = std::fs::create_dir_all(p);
        }
    }
    Ok((cfg, lock))
}

/// What [`open_runtime`] found and made.
struct Opened {
    rt: Arc<Runtime>,
    /// The containers of an earlier run, by pod, for the pod workers to adopt.
    adoptable: std::collections::HashMap<String, Vec<String>>,
    import: ImportDir,
    cgroups: PodCgroups,
    kubepods_limits: ferrolet_runtime::cgroups::CgroupLimits,
    capacity: crate::node::allocatable::Resources,
}

/// The runtime opened on the root dir: its mounts isolated, what an interrupted run
/// half-made removed, the containers of an earlier run found, the demo and dropped images
/// loaded, the pod cgroup tree made.
async fn open_runtime(cfg: &Arc<Config>, zygote: ZygoteHandle) -> Result<Opened> {
    let rt = Arc::new(Runtime::new(&cfg.root_dir, zygote)?.with_request_timeout(cfg.runtime_request_timeout));
    // Before the first pod: containers are then built without the other pods' mounts in their
    // mount table, so a start does not grow with the pods running (docs/start-path.md).
    match rt.isolate_mounts().await {
        Ok(()) => {
            info!(root = %cfg.root_dir.display(), "containers are built in mount namespaces without the pods' mounts")
        }
        Err(e) => warn!(error = %ferrolet_fsutil::chain(&e), "containers are built in the host's mount namespace"),
    }
    let (n, adoptable) = {
        let rt = rt.clone();
        blocking(move || Ok((rt.remove_orphans()?, containers_by_pod(&rt)?))).await?
    };
    if n > 0 {
        info!(count = n, "removed half-created containers from an interrupted run");
    }
    let found: usize = adoptable.values().map(Vec::len).sum();
    if found > 0 {
        info!(
            containers = found,
            pods = adoptable.len(),
            "found containers from an earlier run"
        );
    }
    let mut import = ImportDir::new(cfg.image_import_dir.clone());
    import = {
        let (rt, load_demo) = (rt.clone(), cfg.load_demo_image);
        blocking(move || {
            if load_demo {
                local::load_demo(rt.images());
            }
            import.scan(rt.images());
            Ok(import)
        })
        .await?
    };
    let (cgroups, kubepods_limits, capacity) = {
        let (cfg, rt) = (cfg.clone(), rt.clone());
        blocking(move || cgroup_tree::setup_cgroups(&cfg, &rt)).await?
    };
    Ok(Opened {
        rt,
        adoptable,
        import,
        cgroups,
        kubepods_limits,
        capacity,
    })
}

/// What [`join_cluster`] gives: on a standalone node, no client and no Node object.
struct Joined {
    /// The configuration, with the Node's podCIDR in a cluster with the built-in bridge.
    cfg: Arc<Config>,
    kube: Option<Kube>,
    events: Recorder,
    mirrors: Option<MirrorQueue>,
    node: NodeInfo,
    /// The Node kept up in the background; the managers take it.
    node_handle: Option<crate::node::cluster::NodeHandle>,
    /// Whether the pod network is ready (the Node's Ready condition), filled once it is built.
    network_status: crate::podsetup::network::NetworkStatus,
    /// The eviction manager's conditions (the manager starts once the stats do).
    eviction: crate::eviction::Eviction,
    /// Whether the node is shutting down (the node shutdown manager starts with the duties).
    shutdown: crate::lifecycle::admit::NodeShutdown,
    /// In a cluster: what the node keeps of the API server's pods and objects for a start
    /// without it.
    checkpoint: Option<Arc<crate::checkpoint::Checkpoint>>,
    /// The device plugins (their registration is served with the managers).
    devices: crate::cm::devicemanager::DeviceManager,
    /// The CSI drivers registered through the plugin watcher.
    csi_drivers: crate::volumemanager::csi::CsiDrivers,
    /// The volume manager, once made, for the Node's volumesInUse.
    volumes: Arc<std::sync::OnceLock<Arc<crate::volumemanager::VolumeManager>>>,
}

/// In a cluster: the node's API client (a bad credential ends the start here), the event
/// recorder and mirror pods through it, the Node registered and kept up in the background,
/// and its podCIDR. Standalone (and runOnce): a recorder of its own.
async fn join_cluster(mut cfg: Arc<Config>, rt: &Arc<Runtime>) -> Result<Joined> {
    if cfg.run_once && cfg.in_cluster() {
        warn!("runOnce: only the static pod sources are run; the cluster's kubeconfig is not used");
    }
    let kube = match cfg.in_cluster() && !cfg.run_once {
        true => Some(Kube::connect(&cfg).await?),
        false => None,
    };
    let checkpoint = match &kube {
        Some(_) => {
            let root = cfg.root_dir.clone();
            Some(blocking(move || crate::checkpoint::Checkpoint::open(&root)).await?)
        }
        None => None,
    };
    let events = match &kube {
        Some(k) => Recorder::cluster(
            k.clone(),
            &cfg.node_name,
            cfg.cluster.event_record_qps,
            cfg.cluster.event_burst,
        ),
        None => Recorder::standalone(&cfg.node_name),
    };
    let mirrors = kube
        .clone()
        .map(|k| MirrorQueue::start(MirrorPods::new(k, &cfg.node_name)));
    let node = {
        let cfg = cfg.clone();
        blocking(move || Ok(NodeInfo::detect(&cfg))).await?
    };
    let network_status = crate::podsetup::network::NetworkStatus::default();
    let eviction = crate::eviction::Eviction::new(cfg.in_cluster());
    let shutdown = crate::lifecycle::admit::NodeShutdown::default();
    // Device plugins' counts go into the Node's status at once (its status loop is woken).
    let wake_node: Arc<std::sync::OnceLock<Arc<dyn Fn() + Send + Sync>>> = Arc::default();
    let devices = crate::cm::devicemanager::DeviceManager::new(crate::cm::devicemanager::plugin_dir(&cfg.root_dir), {
        let wake = wake_node.clone();
        Arc::new(move || {
            if let Some(wake) = wake.get() {
                wake()
            }
        })
    });
    let mut node_handle = None;
    let volumes: Arc<std::sync::OnceLock<Arc<crate::volumemanager::VolumeManager>>> = Arc::default();
    if let (Some(kube), Some(checkpoint)) = (&kube, &checkpoint) {
        let images: crate::node::cluster::ImageList = {
            let rt = rt.clone();
            Arc::new(move || Ok(rt.images().list()?))
        };
        let handle = crate::node::cluster::start(
            kube.clone(),
            cfg.clone(),
            node.clone(),
            images,
            readiness(rt.clone(), network_status.clone(), shutdown.clone()),
            events.clone(),
            {
                let eviction = eviction.clone();
                Arc::new(move || eviction.pressure())
            },
            crate::node::cluster::Reported {
                extended: {
                    let devices = devices.clone();
                    Arc::new(move || devices.extended())
                },
                // The volume manager is made with the managers, after the Node's loop starts.
                volumes_in_use: {
                    let slot = volumes.clone();
                    Arc::new(move || slot.get().map(|vm| vm.volumes_in_use()).unwrap_or_default())
                },
            },
            checkpoint.clone(),
        )
        .await?;
        let _ = wake_node.set(handle.sync_now());
        if cfg.network.mode == crate::config::NetworkMode::Bridge {
            if let Some(cidr) = pod_cidr(&cfg, &handle).await {
                let mut c = (*cfg).clone();
                c.pod_cidr = Some(cidr);
                cfg = Arc::new(c);
            }
        }
        node_handle = Some(handle);
    }
    Ok(Joined {
        cfg,
        kube,
        events,
        mirrors,
        node,
        node_handle,
        network_status,
        eviction,
        shutdown,
        checkpoint,
        devices,
        csi_drivers: crate::volumemanager::csi::CsiDrivers::default(),
        volumes,
    })
}

/// The managers the pod workers share: the container manager (node allocatable, QoS tiers,
/// OOM watcher), pod setup with its network and objects, the image manager and its puller,
/// the status manager; and the network status loop.
async fn build_managers(opened: &Opened, joined: &mut Joined) -> Result<Arc<Managers>> {
    let (cfg, rt, events) = (&joined.cfg, &opened.rt, &joined.events);
    {
        let (cfg, cgroups, events, limits) = (
            cfg.clone(),
            opened.cgroups.clone(),
            events.clone(),
            opened.kubepods_limits.clone(),
        );
        blocking(move || crate::cm::node_allocatable::enforce(&cfg, &cgroups, limits, &events)).await?;
    }
    let pods = Arc::new(PodManager::default());
    let qos = qos_manager(cfg, &opened.capacity, &opened.cgroups, &pods).await?;
    crate::cm::oom_watcher::start(events.clone());
    let setup = PodSetup::new(
        cfg.clone(),
        rt.clone(),
        opened.cgroups.clone(),
        joined.network_status.clone(),
    )?
    .with_qos(qos)
    .with_csi(crate::volumemanager::csi::client::CsiClient::new(
        joined.csi_drivers.clone(),
        joined.kube.clone(),
        &cfg.node_name,
        &cfg.root_dir,
    ));
    let _ = joined.volumes.set(setup.volumes().clone());
    {
        let (root, settings) = (cfg.root_dir.clone(), serde_json::to_value(setup.network().settings())?);
        blocking(move || {
            let mut record = load_record(&root);
            record.network = Some(settings);
            save_record(&root, &record)
        })
        .await?;
    }
    // Before any pod worker: the pool an earlier run left goes, then the network collects
    // what sandboxes that are gone held.
    setup.drain_pool().await;
    setup.network().init().await;
    // In a cluster, pods' ConfigMaps, Secrets, tokens and Services come from the API server.
    let setup = match (&joined.kube, &joined.checkpoint, &joined.node_handle) {
        (Some(k), Some(cp), Some(node)) => {
            let objects = crate::objects::ObjectManager::new(k.clone(), node.watched(), cp.clone());
            objects.watch_services();
            setup.with_objects(objects)
        }
        _ => setup,
    };
    let objects = setup.objects().cloned();
    // Pulls from registries, and the registries.yaml re-read when it changes.
    let puller = {
        let (cfg, rt) = (cfg.clone(), rt.clone());
        blocking(move || start_puller(&cfg, &rt)).await?
    };
    watch_registries(cfg, puller.clone());
    let managers = Arc::new(Managers {
        cfg: cfg.clone(),
        rt: rt.clone(),
        node: joined.node.clone(),
        pods: pods.clone(),
        status: StatusManager::new(
            pods,
            joined.kube.clone().map(ApiStatusWriter::start),
            joined.mirrors.clone(),
        ),
        setup,
        images: image_manager(cfg, rt, &puller, objects, events.clone())?,
        liveness: Arc::new(Liveness::default()),
        events: events.clone(),
        mirrors: joined.mirrors.clone(),
        node_api: joined.node_handle.take(),
        eviction: joined.eviction.clone(),
        shutdown: joined.shutdown.clone(),
        devices: joined.devices.clone(),
        pods_settled: AfterQuiet::spawn(code_pages::SETTLE, || release_unused_memory("pods settled")),
        sysctls: crate::pod::sysctl::Allowlist::new(&cfg.allowed_unsafe_sysctls)
            .map_err(|e| anyhow::anyhow!("allowedUnsafeSysctls: {e}"))?,
    });
    // Sandboxes built ahead of time, refilled while the node is quiet.
    {
        let m = managers.clone();
        supervise("sandbox pool", NETWORK_STATUS_EVERY, move || {
            let m = m.clone();
            async move { m.setup.refill_pool().await }
        });
    }
    // Device plugins may register once the pods can be admitted against their devices.
    crate::cm::devicemanager::serve(joined.devices.clone()).await?;
    start_plugin_watcher(cfg, joined)?;
    // kubelet's syncNetworkStatus (in its updateRuntimeUp loop, every 5 s): a network that was
    // not ready is tried again, and the Node's Ready condition follows.
    {
        let m = managers.clone();
        spawn_loop("network status", NETWORK_STATUS_EVERY, move || {
            let m = m.clone();
            async move {
                tokio::time::sleep(NETWORK_STATUS_EVERY).await;
                m.setup.network().recheck().await;
                true
            }
        });
    }
    Ok(managers)
}

/// kubelet's plugin watcher on `<root>/plugins_registry`, with the CSI handler (drivers
/// registered on the node, and in a cluster the Node's annotation and CSINode kept) and the
/// device plugin handler (the device manager's plugins, as through `kubelet.sock`).
fn start_plugin_watcher(cfg: &Arc<Config>, joined: &Joined) -> Result<()> {
    use crate::volumemanager::csi::{nodeinfo::NodeInfo, CsiHandler};
    let node_info = joined.kube.clone().map(|k| NodeInfo::start(k, &cfg.node_name));
    let mut handlers = crate::pluginmanager::Handlers::new();
    handlers.insert(
        crate::apis::pluginregistration::v1::CSI_PLUGIN.into(),
        Arc::new(CsiHandler::new(joined.csi_drivers.clone(), node_info)),
    );
    handlers.insert(
        crate::apis::pluginregistration::v1::DEVICE_PLUGIN.into(),
        Arc::new(crate::cm::devicemanager::watcher::DevicePluginHandler::new(
            joined.devices.clone(),
        )),
    );
    let dir = crate::pluginmanager::registry_dir(&cfg.root_dir);
    crate::pluginmanager::PluginManager::start(&dir, handlers)
        .with_context(|| format!("watching the plugin registry {}", dir.display()))?;
    Ok(())
}

/// The QoS tiers' manager, updated once right away (kubelet's first round runs at start),
/// then every qosUpdatePeriod.
async fn qos_manager(
    cfg: &Arc<Config>,
    capacity: &crate::node::allocatable::Resources,
    cgroups: &PodCgroups,
    pods: &Arc<PodManager>,
) -> Result<Arc<crate::cm::qos::QosManager>> {
    let allocatable_memory =
        crate::cm::node_allocatable::kubepods_limits(capacity, None, cfg.system_reserved, cfg.kube_reserved, true, &[])
            .memory_limit
            .unwrap_or(0);
    let table = pods.clone();
    let active: crate::cm::qos::ActivePods = Arc::new(move || {
        table
            .entries()
            .into_iter()
            .filter(|e| !matches!(e.status.phase.as_deref(), Some("Succeeded" | "Failed")))
            .map(|e| e.pod)
            .collect()
    });
    let qos = Arc::new(crate::cm::qos::QosManager::new(
        cgroups.clone(),
        allocatable_memory,
        cfg.cm.qos_reserved_memory,
        active,
    ));
    let q = qos.clone();
    blocking(move || {
        q.update(None, None);
        Ok(())
    })
    .await?;
    let (q, every) = (qos.clone(), cfg.cm.qos_update_period);
    spawn_loop("qos tiers", every, move || {
        let q = q.clone();
        async move {
            tokio::time::sleep(every).await;
            let _ = blocking(move || {
                q.update(None, None);
                Ok(())
            })
            .await;
            true
        }
    });
    Ok(qos)
}

/// What [`start_sources`] gives.
struct Sources {
    /// Into the main loop (housekeeping, eviction requests).
    events: mpsc::UnboundedSender<Event>,
    /// runOnce: the first update, once its pods ran.
    first_update: tokio::sync::oneshot::Receiver<Vec<Arc<k8s_openapi::api::core::v1::Pod>>>,
    /// Fires once every source's first pods went to the pod workers.
    all_seen: tokio::sync::oneshot::Receiver<()>,
}

/// Sources -> pod config -> pod workers: the manifest directory, the manifest URL and the API
/// server feeding the main loop, which the pod workers are started under.
fn start_sources(
    managers: &Arc<Managers>,
    joined: &Joined,
    adoptable: std::collections::HashMap<String, Vec<String>>,
) -> Sources {
    let cfg = &joined.cfg;
    let (ev_tx, ev_rx) = mpsc::unbounded_channel::<Event>();
    let mut sources = Vec::new();
    if let Some(path) = cfg.static_pod_path.clone() {
        sources.push("file");
        let (tx, node_name, every) = (ev_tx.clone(), cfg.node_name.clone(), cfg.file_check_frequency);
        supervise("file source", Duration::from_secs(1), move || {
            FileSource::new(path.clone(), node_name.clone()).run(snapshots_to(tx.clone()), every)
        });
    }
    if let Some(url) = cfg.static_pod_url.clone() {
        sources.push("http");
        let (tx, headers, node_name, every) = (
            ev_tx.clone(),
            cfg.static_pod_url_headers.clone(),
            cfg.node_name.clone(),
            cfg.http_check_frequency,
        );
        supervise("http source", Duration::from_secs(1), move || {
            HttpSource::new(url.clone(), headers.clone(), node_name.clone()).run(snapshots_to(tx.clone()), every)
        });
    }
    if let (Some(kube), Some(checkpoint)) = (joined.kube.clone(), joined.checkpoint.clone()) {
        sources.push(crate::pod::SOURCE_API);
        let (tx, node_name, mirrors) = (ev_tx.clone(), cfg.node_name.clone(), joined.mirrors.clone());
        supervise("api source", Duration::from_secs(1), move || {
            ApiSource::new(kube.clone(), node_name.clone(), mirrors.clone(), checkpoint.clone())
                .run(snapshots_to(tx.clone()))
        });
    }
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let workers = PodWorkers::new(managers.clone(), adoptable, done_tx);
    let (first_tx, first_rx) = tokio::sync::oneshot::channel();
    let (seen_tx, seen_rx) = tokio::sync::oneshot::channel();
    let main_loop = sync_loop::Loop {
        config: PodConfig::new(sources),
        workers,
        pods: managers.pods.clone(),
        liveness: managers.liveness.clone(),
        max_silence: (cfg.sync_frequency * 2).max(Duration::from_secs(300)),
        first_update: cfg.run_once.then_some(first_tx),
        all_seen: Some(seen_tx),
    };
    tokio::spawn(sync_loop::run(main_loop, ev_rx, done_rx));
    Sources {
        events: ev_tx,
        first_update: first_rx,
        all_seen: seen_rx,
    }
}

/// The background duties: images dropped in the import directory, image and container
/// garbage collection, housekeeping, log rotation, the stats sampler and the eviction manager
/// over it. Returns the stats, which the servers read.
fn start_duties(
    managers: &Arc<Managers>,
    import: ImportDir,
    ev_tx: &mpsc::UnboundedSender<Event>,
) -> Result<Arc<crate::stats::Stats>> {
    let (cfg, rt, pods, events) = (&managers.cfg, &managers.rt, &managers.pods, &managers.events);
    {
        let (import, rt) = (Arc::new(Mutex::new(import)), rt.clone());
        let every = cfg.file_check_frequency.min(cfg.sync_frequency);
        spawn_loop("image import", every, move || {
            let (import, rt) = (import.clone(), rt.clone());
            async move {
                tokio::time::sleep(every).await;
                let scanned = blocking(move || {
                    import.lock().unwrap_or_else(|e| e.into_inner()).scan(rt.images());
                    Ok(())
                })
                .await;
                if let Err(e) = scanned {
                    error!(error = %format!("{e:#}"), "image import");
                }
                true
            }
        });
    }
    let image_gc = Arc::new(crate::images::gc::ImageGc::new(
        rt.image_store(),
        cfg.root_dir.clone(),
        crate::images::gc::GcPolicy {
            high_threshold_percent: cfg.images.image_gc_high_threshold_percent,
            low_threshold_percent: cfg.images.image_gc_low_threshold_percent,
            min_age: cfg.images.image_minimum_gc_age,
            max_age: cfg.images.image_maximum_gc_age,
        },
        events.clone(),
    ));
    if cfg.images.image_gc_high_threshold_percent == 100 {
        // As kubelet: 100 turns image garbage collection off altogether.
        info!("imageGCHighThresholdPercent is 100: image garbage collection is off");
    } else {
        let gc = image_gc.clone();
        let every = cfg.images.image_gc_period;
        spawn_loop("image gc", every, move || {
            let gc = gc.clone();
            async move {
                tokio::time::sleep(every).await;
                let _ = blocking(move || {
                    gc.run_round();
                    Ok(())
                })
                .await;
                true
            }
        });
    }
    {
        let (ev_tx, every) = (ev_tx.clone(), cfg.sync_frequency);
        spawn_loop("housekeeping", every, move || {
            let ev_tx = ev_tx.clone();
            async move {
                tokio::time::sleep(every).await;
                ev_tx.send(Event::Housekeeping).is_ok()
            }
        });
    }
    // Stats: sampled once per housekeeping interval, walked once per volumeStatsAggPeriod.
    let stats = {
        let agent_cgroup = rt.cgroups().own_path().context("finding the agent's own cgroup")?;
        crate::stats::Stats::new(crate::stats::sampler::Sources {
            rt: rt.clone(),
            pods: pods.clone(),
            cgroups: managers.setup.cgroups().clone(),
            volumes: managers.setup.volumes().clone(),
            node_name: managers.node.name.clone(),
            root_dir: cfg.root_dir.clone(),
            pods_dir: cfg.pods_dir(),
            pod_logs_dir: cfg.pod_logs_dir.clone(),
            agent_cgroup,
            agent_start: crate::stats::summary::Time(chrono::Utc::now()),
        })
    };
    stats.start(cfg.housekeeping_interval, cfg.volume_stats_agg_period);
    let container_gc = Arc::new(crate::kuberuntime::gc::ContainerGc::new(
        rt.clone(),
        pods.clone(),
        cfg.eviction.container_gc.clone(),
        cfg.container_log_link_dir.clone(),
    ));
    start_container_gc(cfg, container_gc.clone());
    start_log_rotation(cfg, rt.clone());
    crate::eviction::Manager::new(
        cfg.clone(),
        stats.clone(),
        pods.clone(),
        kills_through(ev_tx.clone()),
        events.clone(),
        crate::eviction::Reclaim {
            containers: container_gc,
            images: image_gc,
        },
        managers.eviction.clone(),
    )
    .start();
    crate::nodeshutdown::Manager::new(
        cfg.clone(),
        pods.clone(),
        kills_through(ev_tx.clone()),
        events.clone(),
        managers.shutdown.clone(),
        managers.node_api.as_ref().map(|n| n.sync_now()),
    )
    .start();
    Ok(stats)
}

/// The servers (the kubelet API, healthz, the read-only port, the CLI and exec sockets); then
/// the memory the start-up used let go, and again every minute.
async fn serve(managers: &Arc<Managers>, joined: &Joined, stats: Arc<crate::stats::Stats>) -> Result<()> {
    let (cfg, rt) = (&managers.cfg, &managers.rt);
    let state = crate::server::State::new(
        rt.clone(),
        managers.pods.clone(),
        managers.node.name.clone(),
        managers.liveness.clone(),
        joined.mirrors.is_some(),
        cfg.clone(),
        stats,
        joined.eviction.clone(),
        readiness(rt.clone(), joined.network_status.clone(), joined.shutdown.clone()),
        joined.checkpoint.clone(),
        joined.events.clone(),
        managers.devices.clone(),
    );
    crate::server::serve_all(cfg, state, joined.kube.clone(), managers.node.ips.clone()).await?;
    crate::server::podresources::serve(&cfg.root_dir, managers.pods.clone(), managers.devices.clone()).await?;
    info!(
        node = %cfg.node_name,
        root = %cfg.root_dir.display(),
        manifests = %cfg.static_pod_path.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "-".into()),
        "ferrolet started"
    );
    // The code of starting up is run; what the agent runs from now on is mapped again as
    // it runs. What a burst of pod starts and stops mapped and allocated is let go once they
    // settle (`pods_settled`), and whatever else ran, every minute.
    release_unused_memory("started");
    spawn_loop("unused memory", code_pages::EVERY, || async {
        tokio::time::sleep(code_pages::EVERY).await;
        release_unused_memory("every minute");
        true
    });
    Ok(())
}

async fn wait_for_signal() -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// How the eviction and node shutdown managers' requests reach the pod workers: through the
/// main loop, as kubelet's killPodNow.
fn kills_through(events: mpsc::UnboundedSender<Event>) -> crate::eviction::RequestFn {
    Arc::new(move |r: crate::eviction::Request| {
        let k = match r {
            crate::eviction::Request::Kill(k) => k,
            crate::eviction::Request::Rerun(uid) => {
                if events.send(Event::Rerun(uid.clone())).is_err() {
                    warn!(pod = %uid, "the main loop is gone; the pod is not run again");
                }
                return;
            }
        };
        let kill = crate::worker::KillPod {
            reason: k.reason,
            message: k.message,
            grace: Some(k.grace),
            disruption: k.disruption_target,
            done: k.done,
        };
        if events.send(Event::Kill(k.uid.clone(), kill)).is_err() {
            warn!(pod = %k.uid, "the main loop is gone; the pod is not killed");
        }
    })
}

/// kubelet's container GC loop: every containerGCPeriod (1m). Dead containers of pods the
/// node no longer has are the housekeeping's (it tears those pods down whole).
fn start_container_gc(cfg: &Config, gc: Arc<crate::kuberuntime::gc::ContainerGc>) {
    let every = cfg.eviction.container_gc.period;
    spawn_loop("container gc", every, move || {
        let gc = gc.clone();
        async move {
            tokio::time::sleep(every).await;
            gc.collect(false, false).await;
            true
        }
    });
}

/// kubelet's container log manager: every containerLogMonitorInterval.
fn start_log_rotation(cfg: &Config, rt: Arc<Runtime>) {
    let manager = Arc::new(crate::kuberuntime::log_rotation::LogManager::new(
        rt,
        crate::kuberuntime::log_rotation::Policy {
            max_size: cfg.container_log_max_size,
            max_files: cfg.container_log_max_files,
        },
        cfg.eviction.container_log_max_workers,
    ));
    let every = cfg.eviction.container_log_monitor_interval;
    spawn_loop("container log rotation", every, move || {
        let manager = manager.clone();
        async move {
            tokio::time::sleep(every).await;
            manager.round().await;
            true
        }
    });
}

/// The registry client over the image store, with the registries.yaml in force (a bad file
/// stops the start: the agent would pull from the wrong places).
fn start_puller(cfg: &Config, rt: &Runtime) -> Result<Arc<ferrolet_runtime::registry::Puller>> {
    use ferrolet_runtime::registry::{Platform, Puller, PullerOptions, RegistryConfig};
    let path = cfg.registry_config_file();
    let registries = RegistryConfig::load(&path).map_err(|e| anyhow!("registry config: {e}"))?;
    let opts = PullerOptions {
        max_concurrent_downloads: cfg.images.max_concurrent_downloads as usize,
        progress_timeout: cfg.images.image_pull_progress_timeout,
        platform: Platform::host(),
        reserve: crate::images::pull_reserve(&cfg.eviction_hard),
    };
    info!(registry_config = %path.display(), exists = path.exists(), "image puller");
    Ok(Arc::new(Puller::new(rt.image_store(), registries, opts)))
}

/// Re-read the registries.yaml when it changes (checked every fileCheckFrequency); a file
/// that does not load keeps the configuration in force, and says why once per change.
fn watch_registries(cfg: &Config, puller: Arc<ferrolet_runtime::registry::Puller>) {
    let watch = Arc::new(Mutex::new(crate::images::registry_watch::RegistryWatch::new(
        cfg.registry_config_file(),
    )));
    let every = cfg.file_check_frequency;
    spawn_loop("registry config", every, move || {
        let (watch, puller) = (watch.clone(), puller.clone());
        async move {
            tokio::time::sleep(every).await;
            let _ = blocking(move || {
                let mut w = watch.lock().unwrap_or_else(|e| e.into_inner());
                match w.check() {
                    None => {}
                    Some(Ok(r)) => {
                        puller.set_registries(r);
                        info!(file = %w.path().display(), "registry config reloaded");
                    }
                    Some(Err(e)) => error!(
                        file = %w.path().display(),
                        "registry config not reloaded, the previous one stays in force: {e}"
                    ),
                }
                Ok(())
            })
            .await;
            true
        }
    });
}

/// The image manager: pulls through `puller` under the configured limits, with the node's
/// credentials (docker config.json, credential plugins) and the pods' pull secrets.
fn image_manager(
    cfg: &Config,
    rt: &Runtime,
    puller: &Arc<ferrolet_runtime::registry::Puller>,
    objects: Option<Arc<crate::objects::ObjectManager>>,
    events: Recorder,
) -> Result<ImageManager> {
    use crate::images::credentials::provider::{Providers, PLUGIN_TIMEOUT};
    let providers = match (
        &cfg.images.credential_provider_config,
        &cfg.images.credential_provider_bin_dir,
    ) {
        (Some(c), Some(bin)) => {
            Providers::load(c, bin, PLUGIN_TIMEOUT).map_err(|e| anyhow!("image-credential-provider-config: {e}"))?
        }
        _ => Providers::default(),
    };
    let pull: crate::images::puller::PullFn = {
        let puller = puller.clone();
        Arc::new(move |image, creds, progress| {
            let puller = puller.clone();
            Box::pin(async move { puller.pull(&image, &creds, progress).await })
        })
    };
    Ok(ImageManager::new(
        rt.image_store(),
        pull,
        crate::images::puller::PullLimits {
            serialize: cfg.images.serialize_image_pulls,
            max_parallel: cfg.images.max_parallel_image_pulls,
            qps: cfg.images.registry_pull_qps as f64,
            burst: cfg.images.registry_burst,
        },
        crate::images::CredentialSources {
            node_config_paths: crate::images::credentials::node_config_paths(&cfg.root_dir),
            providers,
            static_pod_path: cfg.static_pod_path.clone(),
            objects,
        },
        events,
    ))
}

/// The pod subnet in a cluster: the Node's podCIDR (kubelet's rule). A node that already has a
/// pod network keeps the subnet it was set up with, without waiting for the API server: pods
/// running on it must not find their subnet changed by an agent restarted during an outage.
async fn pod_cidr(cfg: &Config, node: &crate::node::cluster::NodeHandle) -> Option<String> {
    let recorded = {
        let root = cfg.root_dir.clone();
        blocking(move || Ok(load_record(&root).network))
            .await
            .ok()
            .flatten()
            .and_then(|n| n.get("subnet").and_then(|s| s.as_str()).map(str::to_string))
    };
    if let Some(c) = node.node().as_ref().and_then(|n| n.spec.as_ref()?.pod_cidr.clone()) {
        return Some(c);
    }
    if recorded.is_some() {
        return recorded;
    }
    info!("waiting for the controller-manager to give the Node a podCIDR");
    let cidr = node.pod_cidr(Duration::from_secs(60)).await;
    if cidr.is_none() {
        warn!(subnet = %cfg.network.subnet, "the Node has no podCIDR after 60 s; using the configured pod subnet");
    }
    cidr
}

/// What the Node's Ready condition says about the runtime (kubelet's runtime state: runtime and
/// network): its zygote (which creates every container) must be alive, and the pod network
/// built; and the node must not be shutting down.
fn readiness(
    rt: Arc<Runtime>,
    network: crate::podsetup::network::NetworkStatus,
    shutdown: crate::lifecycle::admit::NodeShutdown,
) -> crate::node::cluster::Readiness {
    Arc::new(move || {
        let pid = nix::unistd::Pid::from_raw(rt.zygote_pid());
        let mut errors = Vec::new();
        if nix::sys::signal::kill(pid, None).is_err() {
            errors.push("container runtime is down".to_string());
        }
        errors.extend(network.not_ready());
        errors.extend(shutdown.not_ready());
        errors
    })
}

/// A source's sender of snapshots, feeding the main loop.
fn snapshots_to(events: mpsc::UnboundedSender<Event>) -> mpsc::UnboundedSender<crate::podconfig::Snapshot> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(s) = rx.recv().await {
            if events.send(Event::Snapshot(s)).is_err() {
                return;
            }
        }
    });
    tx
}

/// Let the agent use every descriptor it may (kubelet's maxOpenFiles): its soft limit up to the
/// hard one. Containers are unaffected (their limits come from the zygote and their spec).
fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                warn!(error = %e, "raising the open files limit");
            }
        }
    }
}

pub fn require_root() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("ferrolet runs containers and needs root");
    }
    Ok(())
}

/// Give back what the agent holds and does not use, on a blocking thread: the code it ran
/// until now ([`code_pages`]) and the free pages inside its heap. Once started, every minute,
/// and [`code_pages::SETTLE`] after pods last started, changed, stopped or went (`why` says
/// which).
fn release_unused_memory(why: &'static str) {
    ferrolet_fsutil::spawn_blocking(move || {
        let code_kib = code_pages::release().unwrap_or_else(|e| {
            tracing::debug!(error = %e, "releasing code pages");
            0
        });
        // Pods come and go in bursts, and what a burst allocated and freed leaves whole free
        // pages between live allocations: 1.9 MiB of the agent's 11.6 MiB of heap with 100
        // pods running, measured.
        ferrolet_runtime::trim_heap();
        tracing::debug!(code_kib, "released unused memory: {why}");
    });
}
